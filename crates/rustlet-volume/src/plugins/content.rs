//! configMap, secret, downwardAPI and projected volumes (upstream `pkg/volume/configmap`,
//! `secret`, `downwardapi`, `projected`; V92-V95): every source is read first (objects through
//! the [`VolumeObjects`] seam, whose per-pod registrations the populator makes before any of
//! the pod's volumes is mounted; tokens through its TokenRequest cache; pod fields from the
//! pod), turned into a payload (every key or the listed `items`, with `defaultMode` or the
//! item's mode), and written by the [`AtomicWriter`] into a wrapped emptyDir: on disk for a
//! configMap, on a tmpfs for the others, which are never written unless their directory is a
//! tmpfs mount. `RequiresRemount` is true: a change is written again (atomically) on the next
//! SetUp.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, DownwardAPIVolumeFile, KeyToPath, Pod, SecretVolumeSource,
    ServiceAccountTokenProjection, Volume,
};
use rustlet_core::PodUid;
use rustlet_mount::atomic_writer::{AtomicWriter, FileProjection};

use super::downward::{NodeAllocatable, field_ref_value, resource_field_value};
use super::empty_dir::{EmptyDir, Medium, memory_size};
use crate::objects::{ObjectError, TokenRequestKey, VolumeObjects};
use crate::plugin::{
    PluginError, VolumeError, VolumeHost, VolumeMounter, VolumePlugin, VolumeUnmounter,
};
use crate::spec::VolumeSpec;

/// The configMap plugin's name.
pub const CONFIG_MAP_PLUGIN: &str = "kubernetes.io/configmap";
/// The secret plugin's name.
pub const SECRET_PLUGIN: &str = "kubernetes.io/secret";
/// The downwardAPI plugin's name.
pub const DOWNWARD_API_PLUGIN: &str = "kubernetes.io/downward-api";
/// The projected plugin's name.
pub const PROJECTED_PLUGIN: &str = "kubernetes.io/projected";

/// Which kind of content volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentKind {
    /// A ConfigMap, on disk.
    ConfigMap,
    /// A Secret, on tmpfs only.
    Secret,
    /// Fields of the pod, on tmpfs.
    DownwardApi,
    /// ConfigMaps, Secrets, pod fields and service account tokens in one volume, on tmpfs.
    Projected,
}

/// The configMap, secret, downwardAPI or projected plugin.
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
            ContentKind::DownwardApi => DOWNWARD_API_PLUGIN,
            ContentKind::Projected => PROJECTED_PLUGIN,
        }
    }

    /// V92: only a configMap lives on disk.
    fn medium(&self) -> Medium {
        match self.kind {
            ContentKind::ConfigMap => Medium::Default,
            ContentKind::Secret | ContentKind::DownwardApi | ContentKind::Projected => {
                Medium::Memory
            }
        }
    }

    fn wrapped(
        &self,
        pod_uid: &PodUid,
        inner_name: &str,
        host: &VolumeHost,
    ) -> Result<EmptyDir, PluginError> {
        Ok(EmptyDir {
            dir: host.pod_volume_dir(pod_uid, self.plugin_name(), inner_name)?,
            meta_dir: host.pod_plugin_dir(pod_uid, self.plugin_name(), inner_name)?,
            medium: self.medium(),
            size: None,
            mounter: host.mounter.clone(),
            ownership: None,
        })
    }
}

/// Which object an object projection reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ObjectType {
    ConfigMap,
    Secret,
}

/// One source of a content volume.
#[derive(Clone, Debug)]
enum Projection {
    /// A ConfigMap's or Secret's keys (all, or the listed items).
    Object {
        type_: ObjectType,
        name: String,
        items: Option<Vec<KeyToPath>>,
        optional: bool,
    },
    /// Pod fields.
    Downward(Vec<DownwardAPIVolumeFile>),
    /// A service account token bound to the pod.
    Token(ServiceAccountTokenProjection),
    /// A source this agent does not serve (named in the error).
    Unsupported(&'static str),
}

/// What a content volume projects, from its spec.
#[derive(Clone, Debug)]
struct Source {
    projections: Vec<Projection>,
    default_mode: i32,
}

impl Source {
    fn of(kind: ContentKind, volume: &Volume) -> Option<Self> {
        let object = |type_, name: &str, items: &Option<Vec<KeyToPath>>, optional: Option<bool>| {
            Projection::Object {
                type_,
                name: name.to_owned(),
                items: items.clone(),
                optional: optional.unwrap_or(false),
            }
        };
        let (projections, default_mode) = match kind {
            ContentKind::ConfigMap => {
                let s: &ConfigMapVolumeSource = volume.config_map.as_ref()?;
                let p = object(ObjectType::ConfigMap, &s.name, &s.items, s.optional);
                (vec![p], s.default_mode)
            }
            ContentKind::Secret => {
                let s: &SecretVolumeSource = volume.secret.as_ref()?;
                let name = s.secret_name.clone().unwrap_or_default();
                let p = object(ObjectType::Secret, &name, &s.items, s.optional);
                (vec![p], s.default_mode)
            }
            ContentKind::DownwardApi => {
                let s = volume.downward_api.as_ref()?;
                let p = Projection::Downward(s.items.clone().unwrap_or_default());
                (vec![p], s.default_mode)
            }
            ContentKind::Projected => {
                let s = volume.projected.as_ref()?;
                let projections = s
                    .sources
                    .iter()
                    .flatten()
                    .map(|source| {
                        if let Some(c) = &source.config_map {
                            object(ObjectType::ConfigMap, &c.name, &c.items, c.optional)
                        } else if let Some(c) = &source.secret {
                            object(ObjectType::Secret, &c.name, &c.items, c.optional)
                        } else if let Some(d) = &source.downward_api {
                            Projection::Downward(d.items.clone().unwrap_or_default())
                        } else if let Some(t) = &source.service_account_token {
                            Projection::Token(t.clone())
                        } else if source.cluster_trust_bundle.is_some() {
                            Projection::Unsupported("clusterTrustBundle")
                        } else {
                            Projection::Unsupported("this projected source")
                        }
                    })
                    .collect();
                (projections, s.default_mode)
            }
        };
        Some(Self {
            projections,
            default_mode: default_mode.unwrap_or(0o644),
        })
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

    fn mounts_read_only(&self) -> bool {
        true
    }

    fn new_mounter(
        &self,
        spec: &VolumeSpec,
        pod: &Pod,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeMounter>, PluginError> {
        let invalid = |reason: &str| PluginError::invalid_spec(self.plugin_name(), reason);
        let volume = spec
            .volume()
            .ok_or_else(|| invalid("not an inline volume"))?;
        let source = Source::of(self.kind, volume).ok_or_else(|| invalid("no source"))?;
        let mut wrapped = self.wrapped(&PodUid::of(pod), &volume.name, host)?;
        if wrapped.medium == Medium::Memory {
            wrapped.size = memory_size(pod, volume, host.node_allocatable_memory);
        }
        Ok(Box::new(ContentVolume {
            kind: self.kind,
            pod: pod.clone(),
            volume_name: volume.name.clone(),
            source,
            wrapped,
            objects: self.objects.clone(),
            allocatable: NodeAllocatable::of_host(host.node_allocatable_memory),
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
            ContentKind::DownwardApi => volume.downward_api = Some(Default::default()),
            ContentKind::Projected => volume.projected = Some(Default::default()),
        }
        Ok(VolumeSpec::pod(volume))
    }

    fn new_unmounter(
        &self,
        inner_name: &str,
        pod_uid: &PodUid,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeUnmounter>, PluginError> {
        Ok(Box::new(self.wrapped(pod_uid, inner_name, host)?))
    }
}

struct ContentVolume {
    kind: ContentKind,
    pod: Pod,
    /// The volume's name in the pod.
    volume_name: String,
    source: Source,
    wrapped: EmptyDir,
    objects: Arc<dyn VolumeObjects>,
    allocatable: NodeAllocatable,
}

impl ContentVolume {
    fn file(&self, data: Vec<u8>, mode: Option<i32>) -> FileProjection {
        let mode = mode.unwrap_or(self.source.default_mode);
        FileProjection {
            data,
            mode: u32::try_from(mode).unwrap_or(0o644) & 0o777,
            fs_user: None,
        }
    }

    /// V93 step 1 for one object: its keys and bytes, `None` when absent and optional.
    async fn read_object(
        &self,
        type_: ObjectType,
        name: &str,
        optional: bool,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
        let namespace = self.pod.metadata.namespace.as_deref().unwrap_or_default();
        let read: Result<BTreeMap<String, Vec<u8>>, ObjectError> = match type_ {
            ObjectType::ConfigMap => self.objects.config_map(namespace, name).await.map(|cm| {
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
            ObjectType::Secret => self.objects.secret(namespace, name).await.map(|s| {
                s.data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect()
            }),
        };
        match read {
            Ok(data) => Ok(Some(data)),
            Err(e) if e.is_not_found() && optional => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    /// One projection's files (upstream `MakePayload` and its projected/downwardAPI forms).
    async fn project(
        &self,
        projection: &Projection,
        out: &mut BTreeMap<String, FileProjection>,
    ) -> Result<(), String> {
        match projection {
            Projection::Object {
                type_,
                name,
                items,
                optional,
            } => {
                let data = self
                    .read_object(*type_, name, *optional)
                    .await?
                    .unwrap_or_default();
                match items {
                    None => {
                        for (key, bytes) in data {
                            out.insert(key, self.file(bytes, None));
                        }
                    }
                    Some(items) => {
                        for item in items {
                            match data.get(&item.key) {
                                Some(bytes) => {
                                    out.insert(
                                        item.path.clone(),
                                        self.file(bytes.clone(), item.mode),
                                    );
                                }
                                None if *optional => {}
                                None => {
                                    return Err(match type_ {
                                        ObjectType::ConfigMap => format!(
                                            "configmap references non-existent config key: {}",
                                            item.key
                                        ),
                                        ObjectType::Secret => format!(
                                            "references non-existent secret key: {}",
                                            item.key
                                        ),
                                    });
                                }
                            }
                        }
                    }
                }
            }
            Projection::Downward(items) => {
                for item in items {
                    let value = if let Some(field) = &item.field_ref {
                        field_ref_value(&self.pod, field)?
                    } else if let Some(resource) = &item.resource_field_ref {
                        resource_field_value(&self.pod, resource, self.allocatable)?
                    } else {
                        return Err(format!("downwardAPI item {:?} has no source", item.path));
                    };
                    out.insert(item.path.clone(), self.file(value.into_bytes(), item.mode));
                }
            }
            Projection::Token(token) => {
                let spec = self.pod.spec.as_ref();
                let key = TokenRequestKey {
                    namespace: self.pod.metadata.namespace.clone().unwrap_or_default(),
                    service_account: spec
                        .and_then(|s| s.service_account_name.clone())
                        .filter(|n| !n.is_empty())
                        .unwrap_or_else(|| "default".to_owned()),
                    audiences: token
                        .audience
                        .clone()
                        .into_iter()
                        .filter(|a| !a.is_empty())
                        .collect(),
                    expiration_seconds: token.expiration_seconds.unwrap_or(3600),
                    pod_name: self.pod.metadata.name.clone().unwrap_or_default(),
                    pod_uid: self.pod.metadata.uid.clone().unwrap_or_default(),
                };
                let issued = self
                    .objects
                    .service_account_token(&key)
                    .await
                    .map_err(|e| e.to_string())?;
                // V94: 0600, owned by the pod's user, when the pod has an fsUser or an fsGroup
                // (the fsGroup walk then adds group read: 0640).
                let fs_group = spec
                    .and_then(|s| s.security_context.as_ref())
                    .is_some_and(|c| c.fs_group.is_some());
                let fs_user = fs_user_of(&self.pod);
                let mode = (fs_group || fs_user.is_some()).then_some(0o600);
                let mut file = self.file(issued.token.into_bytes(), mode);
                file.fs_user = fs_user;
                out.insert(token.path.clone(), file);
            }
            Projection::Unsupported(what) => {
                return Err(format!("{what} sources are not supported by this agent"));
            }
        }
        Ok(())
    }

    /// V93 steps 1-2: every source read before the disk is touched; a projected volume
    /// reports all its failing sources together.
    fn payload(&self) -> Result<BTreeMap<String, FileProjection>, VolumeError> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|e| VolumeError::Final(format!("no runtime to read objects: {e}")))?;
        handle.block_on(async {
            let mut out = BTreeMap::new();
            let mut errors = Vec::new();
            for projection in &self.source.projections {
                if let Err(e) = self.project(projection, &mut out).await {
                    errors.push(e);
                }
            }
            if errors.is_empty() {
                Ok(out)
            } else {
                Err(VolumeError::Final(errors.join("; ")))
            }
        })
    }
}

/// Upstream `FsUserFrom`: the user every container (init containers included) runs as, when
/// they all run as the same one (a container's `runAsUser`, else the pod's).
fn fs_user_of(pod: &Pod) -> Option<u32> {
    let spec = pod.spec.as_ref()?;
    let pod_user = spec.security_context.as_ref().and_then(|c| c.run_as_user);
    let mut users = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.run_as_user)
                .or(pod_user)
        });
    let first = users.next()??;
    if users.all(|u| u == Some(first)) {
        u32::try_from(first).ok()
    } else {
        None
    }
}

/// V93 step 4 (upstream `MakeNestedMountpoints`): for every other mount of a container that
/// uses this volume whose `mountPath` lies below this volume's, the directory is made inside the
/// volume (beneath it, never through a symlink), so the runtime can mount over it.
fn make_nested_mountpoints(pod: &Pod, volume: &str, dir: &Path) -> Result<(), VolumeError> {
    let spec = pod.spec.as_ref();
    let containers = spec.into_iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    });
    for container in containers {
        let mounts = container.volume_mounts.as_deref().unwrap_or_default();
        for own in mounts.iter().filter(|m| m.name == volume) {
            let base = own.mount_path.trim_end_matches('/');
            for other in mounts.iter().filter(|m| m.name != volume) {
                let Some(rest) = other.mount_path.strip_prefix(base) else {
                    continue;
                };
                let Some(rest) = rest.strip_prefix('/') else {
                    continue;
                };
                let rel = Path::new(rest.trim_end_matches('/'));
                if rel.as_os_str().is_empty() {
                    continue;
                }
                // The first element must not be the writer's own (`..data`, versions).
                if rest.starts_with("..")
                    || rustlet_mount::safe_path::plain_components(rel).is_err()
                {
                    return Err(VolumeError::Final(format!(
                        "invalid nested mount point {:?} of volume {volume:?}",
                        other.mount_path
                    )));
                }
                rustlet_mount::create_dir_all_beneath(dir, rel, 0o755).map_err(|e| {
                    VolumeError::Final(format!(
                        "making nested mount point {:?} of volume {volume:?}: {e}",
                        other.mount_path
                    ))
                })?;
            }
        }
    }
    Ok(())
}

impl VolumeMounter for ContentVolume {
    fn path(&self) -> PathBuf {
        self.wrapped.dir.clone()
    }

    fn set_up(&self) -> Result<(), VolumeError> {
        let payload = self.payload()?;
        self.wrapped.set_up()?;
        if self.wrapped.medium == Medium::Memory && !self.wrapped.is_tmpfs_mount()? {
            // Never on disk, not even briefly.
            return Err(VolumeError::Final(format!(
                "{:?} volume {} is not on a tmpfs: nothing written",
                self.kind,
                self.wrapped.dir.display()
            )));
        }
        make_nested_mountpoints(&self.pod, &self.volume_name, &self.wrapped.dir)?;
        let writer =
            AtomicWriter::new(&self.wrapped.dir).map_err(|e| VolumeError::Final(e.to_string()))?;
        writer.write(&payload).map_err(|e| {
            VolumeError::Final(format!("write {}: {e}", self.wrapped.dir.display()))
        })?;
        // V93.5: the whole volume, read-only for containers.
        crate::plugin::apply_ownership(
            &self.wrapped.dir,
            crate::plugin::pod_ownership(&self.pod, true),
        )
    }
}
