//! configMap and secret volumes (upstream `pkg/volume/configmap`, `pkg/volume/secret`; V92-V95):
//! the object is read through the [`VolumeObjects`] seam (a pod's references are registered by
//! the populator before any of its volumes is mounted), turned into a payload (every key, or
//! the listed `items`, with `defaultMode` or the item's mode), and written by the
//! [`AtomicWriter`] into a wrapped emptyDir: on disk for a configMap, on a tmpfs for a secret.
//! A secret is never written unless its directory is a tmpfs mount. `RequiresRemount` is true:
//! a change of the object is written again (atomically) on the next SetUp.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, KeyToPath, Pod, SecretVolumeSource, Volume,
};
use rustlet_core::PodUid;
use rustlet_mount::atomic_writer::{AtomicWriter, FileProjection};

use super::empty_dir::{EmptyDir, Medium, memory_size};
use crate::objects::{ObjectError, VolumeObjects};
use crate::plugin::{
    PluginError, VolumeError, VolumeHost, VolumeMounter, VolumePlugin, VolumeUnmounter,
};
use crate::spec::VolumeSpec;

/// The configMap plugin's name.
pub const CONFIG_MAP_PLUGIN: &str = "kubernetes.io/configmap";
/// The secret plugin's name.
pub const SECRET_PLUGIN: &str = "kubernetes.io/secret";

/// Which object a content volume projects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentKind {
    /// A ConfigMap, on disk.
    ConfigMap,
    /// A Secret, on tmpfs only.
    Secret,
}

/// The configMap or secret plugin.
pub struct ContentPlugin {
    kind: ContentKind,
    objects: Arc<dyn VolumeObjects>,
}

impl ContentPlugin {
    /// The plugin of `kind`, reading objects from `objects`.
    pub fn new(kind: ContentKind, objects: Arc<dyn VolumeObjects>) -> Self {
        Self { kind, objects }
    }

    fn plugin_name(&self) -> &'static str {
        match self.kind {
            ContentKind::ConfigMap => CONFIG_MAP_PLUGIN,
            ContentKind::Secret => SECRET_PLUGIN,
        }
    }

    fn medium(&self) -> Medium {
        match self.kind {
            ContentKind::ConfigMap => Medium::Default,
            ContentKind::Secret => Medium::Memory,
        }
    }

    fn wrapped(&self, pod_uid: &PodUid, inner_name: &str, host: &VolumeHost) -> EmptyDir {
        EmptyDir {
            dir: host.pod_volume_dir(pod_uid, self.plugin_name(), inner_name),
            meta_dir: host.pod_plugin_dir(pod_uid, self.plugin_name(), inner_name),
            medium: self.medium(),
            size: None,
            mounter: host.mounter.clone(),
        }
    }
}

/// What a content volume projects, from its spec.
#[derive(Clone, Debug)]
struct Source {
    name: String,
    items: Option<Vec<KeyToPath>>,
    default_mode: i32,
    optional: bool,
}

impl Source {
    fn of(kind: ContentKind, volume: &Volume) -> Option<Self> {
        match kind {
            ContentKind::ConfigMap => {
                volume
                    .config_map
                    .as_ref()
                    .map(|s: &ConfigMapVolumeSource| Self {
                        name: s.name.clone(),
                        items: s.items.clone(),
                        default_mode: s.default_mode.unwrap_or(0o644),
                        optional: s.optional.unwrap_or(false),
                    })
            }
            ContentKind::Secret => volume.secret.as_ref().map(|s: &SecretVolumeSource| Self {
                name: s.secret_name.clone().unwrap_or_default(),
                items: s.items.clone(),
                default_mode: s.default_mode.unwrap_or(0o644),
                optional: s.optional.unwrap_or(false),
            }),
        }
    }
}

impl VolumePlugin for ContentPlugin {
    fn name(&self) -> &str {
        self.plugin_name()
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        spec.volume()
            .is_some_and(|v| Source::of(self.kind, v).is_some())
    }

    fn requires_remount(&self, _spec: &VolumeSpec) -> bool {
        true
    }

    fn new_mounter(
        &self,
        spec: &VolumeSpec,
        pod: &Pod,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeMounter>, PluginError> {
        let invalid = |reason: &str| PluginError::InvalidSpec {
            plugin: self.plugin_name().into(),
            reason: reason.into(),
        };
        let volume = spec
            .volume()
            .ok_or_else(|| invalid("not an inline volume"))?;
        let source = Source::of(self.kind, volume).ok_or_else(|| invalid("no source"))?;
        let mut wrapped = self.wrapped(&PodUid::of(pod), &volume.name, host);
        if self.kind == ContentKind::Secret {
            wrapped.size = memory_size(pod, volume, host.node_allocatable_memory);
        }
        Ok(Box::new(ContentVolume {
            kind: self.kind,
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            source,
            wrapped,
            objects: self.objects.clone(),
        }))
    }

    /// A minimal inline spec (the object's name is not on disk): enough to tear it down, or to
    /// adopt it when its pod comes back (the desired spec is then used to set it up).
    fn construct_volume_spec(
        &self,
        inner_name: &str,
        _mount_path: &Path,
        _host: &VolumeHost,
    ) -> Result<VolumeSpec, PluginError> {
        let mut volume = Volume {
            name: inner_name.to_owned(),
            ..Default::default()
        };
        match self.kind {
            ContentKind::ConfigMap => {
                volume.config_map = Some(ConfigMapVolumeSource {
                    name: inner_name.to_owned(),
                    ..Default::default()
                });
            }
            ContentKind::Secret => {
                volume.secret = Some(SecretVolumeSource {
                    secret_name: Some(inner_name.to_owned()),
                    ..Default::default()
                });
            }
        }
        Ok(VolumeSpec::Pod(volume))
    }

    fn new_unmounter(
        &self,
        inner_name: &str,
        pod_uid: &PodUid,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeUnmounter>, PluginError> {
        Ok(Box::new(self.wrapped(pod_uid, inner_name, host)))
    }
}

struct ContentVolume {
    kind: ContentKind,
    namespace: String,
    source: Source,
    wrapped: EmptyDir,
    objects: Arc<dyn VolumeObjects>,
}

/// The key → bytes of the object, or `None` when it is absent and optional.
type Content = Option<BTreeMap<String, Vec<u8>>>;

impl ContentVolume {
    /// V93 step 1: read the object (before the disk is touched).
    fn fetch(&self) -> Result<Content, VolumeError> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|e| VolumeError::Final(format!("no runtime to read objects: {e}")))?;
        let (namespace, name) = (self.namespace.as_str(), self.source.name.as_str());
        let read: Result<BTreeMap<String, Vec<u8>>, ObjectError> = match self.kind {
            ContentKind::ConfigMap => handle
                .block_on(self.objects.config_map(namespace, name))
                .map(|cm| {
                    let mut out: BTreeMap<String, Vec<u8>> = cm
                        .data
                        .iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
                        .collect();
                    for (k, v) in cm.binary_data.iter().flatten() {
                        out.insert(k.clone(), v.0.clone());
                    }
                    out
                }),
            ContentKind::Secret => handle
                .block_on(self.objects.secret(namespace, name))
                .map(|s| {
                    s.data
                        .iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.0.clone()))
                        .collect()
                }),
        };
        match read {
            Ok(data) => Ok(Some(data)),
            Err(e) if e.is_not_found() && self.source.optional => Ok(None),
            Err(e) => Err(VolumeError::Final(e.to_string())),
        }
    }

    /// V93 step 2 (upstream `MakePayload`).
    fn payload(&self, content: Content) -> Result<BTreeMap<String, FileProjection>, VolumeError> {
        let data = content.unwrap_or_default();
        let file = |bytes: &Vec<u8>, mode: i32| FileProjection {
            data: bytes.clone(),
            mode: u32::try_from(mode).unwrap_or(0o644) & 0o777,
            fs_user: None,
        };
        let mut out = BTreeMap::new();
        match &self.source.items {
            None => {
                for (key, bytes) in &data {
                    out.insert(key.clone(), file(bytes, self.source.default_mode));
                }
            }
            Some(items) => {
                for item in items {
                    match data.get(&item.key) {
                        Some(bytes) => {
                            let mode = item.mode.unwrap_or(self.source.default_mode);
                            out.insert(item.path.clone(), file(bytes, mode));
                        }
                        None if self.source.optional => {}
                        None => {
                            return Err(VolumeError::Final(match self.kind {
                                ContentKind::ConfigMap => format!(
                                    "configmap references non-existent config key: {}",
                                    item.key
                                ),
                                ContentKind::Secret => {
                                    format!("references non-existent secret key: {}", item.key)
                                }
                            }));
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

impl VolumeMounter for ContentVolume {
    fn path(&self) -> PathBuf {
        self.wrapped.dir.clone()
    }

    fn set_up(&self) -> Result<(), VolumeError> {
        let content = self.fetch()?;
        let payload = self.payload(content)?;
        self.wrapped.set_up()?;
        if self.kind == ContentKind::Secret && !self.wrapped.is_tmpfs_mount()? {
            // Never on disk, not even briefly.
            return Err(VolumeError::Final(format!(
                "secret volume {} is not on a tmpfs: nothing written",
                self.wrapped.dir.display()
            )));
        }
        let writer =
            AtomicWriter::new(&self.wrapped.dir).map_err(|e| VolumeError::Final(e.to_string()))?;
        writer
            .write(&payload)
            .map_err(|e| VolumeError::Final(format!("write {}: {e}", self.source.name)))?;
        Ok(())
    }
}
