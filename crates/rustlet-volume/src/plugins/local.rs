//! The local volume plugin for filesystem PVs (upstream `pkg/volume/local`, V102-V104): the
//! PV's `local.path` on this node is bind-mounted onto the pod's volume directory (read-only
//! when the claim says so). Its node affinity was checked when the claim was resolved. A
//! block-device-backed local PV (formatted and mounted globally) is not served.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{LocalVolumeSource, PersistentVolume, PersistentVolumeSpec, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rustlet_core::PodUid;
use rustlet_mount::{BindAccess, MountPointCheck};

use crate::mounter::Mounter;
use crate::plugin::{
    PluginError, VolumeError, VolumeHost, VolumeMounter, VolumePlugin, VolumeUnmounter,
};
use crate::spec::VolumeSpec;

/// The plugin's name.
pub const PLUGIN_NAME: &str = "kubernetes.io/local-volume";

/// The local volume plugin.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalVolumePlugin;

impl VolumePlugin for LocalVolumePlugin {
    fn name(&self) -> &str {
        PLUGIN_NAME
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        spec.persistent_volume()
            .and_then(|pv| pv.spec.as_ref())
            .is_some_and(|s| s.local.is_some())
    }

    fn new_mounter(
        &self,
        spec: &VolumeSpec,
        pod: &Pod,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeMounter>, PluginError> {
        let invalid = |reason: &str| PluginError::invalid_spec(PLUGIN_NAME, reason);
        let VolumeSpec::Persistent { pv, read_only } = spec else {
            return Err(invalid("not a PersistentVolume"));
        };
        let source = pv
            .spec
            .as_ref()
            .and_then(|s| s.local.as_ref())
            .ok_or_else(|| invalid("no local source"))?;
        Ok(Box::new(LocalVolume {
            dir: host.pod_volume_dir(&PodUid::of(pod), PLUGIN_NAME, spec.name())?,
            path: PathBuf::from(&source.path),
            read_only: *read_only,
            mounter: host.mounter.clone(),
            ownership: crate::plugin::pod_ownership(pod, *read_only),
        }))
    }

    /// A PV named after the directory, with no path (enough to tear it down).
    fn construct_volume_spec(
        &self,
        inner_name: &str,
        _mount_path: &Path,
        _host: &VolumeHost,
    ) -> Result<VolumeSpec, PluginError> {
        Ok(VolumeSpec::persistent(
            PersistentVolume {
                metadata: ObjectMeta {
                    name: Some(inner_name.to_owned()),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeSpec {
                    local: Some(LocalVolumeSource::default()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            false,
        ))
    }

    fn new_unmounter(
        &self,
        inner_name: &str,
        pod_uid: &PodUid,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeUnmounter>, PluginError> {
        Ok(Box::new(LocalVolume {
            dir: host.pod_volume_dir(pod_uid, PLUGIN_NAME, inner_name)?,
            path: PathBuf::new(),
            read_only: false,
            mounter: host.mounter.clone(),
            ownership: None,
        }))
    }
}

struct LocalVolume {
    dir: PathBuf,
    path: PathBuf,
    read_only: bool,
    mounter: Arc<dyn Mounter>,
    ownership: Option<rustlet_mount::ownership::Ownership>,
}

fn fail(what: &str, path: &Path, err: impl std::fmt::Display) -> VolumeError {
    VolumeError::Final(format!("{what} {}: {err}", path.display()))
}

impl VolumeMounter for LocalVolume {
    fn path(&self) -> PathBuf {
        self.dir.clone()
    }

    /// V103: no backsteps; idempotent; a 0750 directory; the bind (read-only if asked); a
    /// failed bind leaves nothing behind.
    fn set_up(&self) -> Result<(), VolumeError> {
        if self
            .path
            .components()
            .any(|c| c == std::path::Component::ParentDir)
        {
            return Err(VolumeError::Final(format!(
                "local path {} must not contain '..'",
                self.path.display()
            )));
        }
        if self.mounter.is_mount_point(&self.dir).unwrap_or(false) {
            return Ok(());
        }
        if !self.path.is_dir() {
            return Err(VolumeError::Final(format!(
                "local path {} does not exist or is not a directory",
                self.path.display()
            )));
        }
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(&self.dir)
                .map_err(|e| fail("creating", &self.dir, e))?;
        }
        let access = if self.read_only {
            BindAccess::ReadOnly
        } else {
            BindAccess::ReadWrite
        };
        // V103.7: fsGroup only for the first mount of the path, and not when read-only.
        let first = self
            .mounter
            .mount_refs(&self.path)
            .map(|refs| refs.is_empty())
            .unwrap_or(true);
        if let Err(e) = self.mounter.bind(&self.path, &self.dir, access) {
            let _ = self
                .mounter
                .cleanup_mount_point(&self.dir, MountPointCheck::Exact);
            return Err(fail("binding the local path onto", &self.dir, e));
        }
        if first && !self.read_only {
            crate::plugin::apply_ownership(&self.dir, self.ownership)?;
        }
        Ok(())
    }
}

impl VolumeUnmounter for LocalVolume {
    fn path(&self) -> PathBuf {
        self.dir.clone()
    }

    /// V104: unmount and remove the directory, never recursively.
    fn tear_down(&self) -> Result<(), VolumeError> {
        if !crate::plugin::exists(&self.dir) {
            return Ok(());
        }
        self.mounter
            .cleanup_mount_point(&self.dir, MountPointCheck::Exact)
            .map_err(|e| VolumeError::Uncertain(e.to_string()))
    }
}
