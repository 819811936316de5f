//! Fake plugins and fixtures (behind `test-util`), after upstream's `FakeVolumePlugin`.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, HostPathVolumeSource, PersistentVolume, PersistentVolumeSpec, Pod, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::plugin::{PluginManager, VolumePlugin};
use crate::spec::VolumeSpec;

/// What a fake plugin serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serves {
    /// Inline `emptyDir` volumes.
    EmptyDir,
    /// Inline `hostPath` volumes.
    HostPath,
    /// PersistentVolumes.
    PersistentVolumes,
}

/// A configurable fake plugin.
#[derive(Clone, Debug)]
pub struct FakePlugin {
    /// Plugin name.
    pub name: &'static str,
    /// What it serves.
    pub serves: Serves,
    /// Attachable.
    pub attachable: bool,
    /// Device-mountable.
    pub device_mountable: bool,
    /// Requires remount.
    pub requires_remount: bool,
}

impl VolumePlugin for FakePlugin {
    fn name(&self) -> &str {
        self.name
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        match (self.serves, spec) {
            (Serves::EmptyDir, VolumeSpec::Pod(v)) => v.empty_dir.is_some(),
            (Serves::HostPath, VolumeSpec::Pod(v)) => v.host_path.is_some(),
            (Serves::PersistentVolumes, VolumeSpec::Persistent { .. }) => true,
            _ => false,
        }
    }

    fn is_attachable(&self) -> bool {
        self.attachable
    }

    fn is_device_mountable(&self) -> bool {
        self.device_mountable
    }

    fn requires_remount(&self, _spec: &VolumeSpec) -> bool {
        self.requires_remount
    }
}

/// Plain per-pod plugins for emptyDir and hostPath, and an attachable fake for PVs.
pub fn fake_plugins() -> PluginManager {
    let plain = |name, serves| FakePlugin {
        name,
        serves,
        attachable: false,
        device_mountable: false,
        requires_remount: false,
    };
    PluginManager::new(vec![
        Arc::new(plain("kubernetes.io/empty-dir", Serves::EmptyDir)),
        Arc::new(plain("kubernetes.io/host-path", Serves::HostPath)),
        Arc::new(FakePlugin {
            name: "fake-plugin",
            serves: Serves::PersistentVolumes,
            attachable: true,
            device_mountable: true,
            requires_remount: false,
        }),
    ])
}

/// An emptyDir pod volume.
pub fn empty_dir(name: &str) -> VolumeSpec {
    VolumeSpec::Pod(Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    })
}

/// A hostPath pod volume.
pub fn host_path(name: &str, path: &str) -> VolumeSpec {
    VolumeSpec::Pod(Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: None,
        }),
        ..Default::default()
    })
}

/// A PersistentVolume spec.
pub fn persistent(name: &str) -> VolumeSpec {
    VolumeSpec::Persistent {
        pv: PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec::default()),
            ..Default::default()
        },
        read_only: false,
    }
}

/// A pod with a UID and name.
pub fn pod(uid: &str) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod-{uid}")),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        ..Default::default()
    })
}
