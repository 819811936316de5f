//! `VolumeSpec`: what a pod asks to mount (upstream `volume.Spec`): an inline pod volume or a
//! PersistentVolume reached through a claim.

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};

/// Exactly one of an inline volume or a PersistentVolume.
#[derive(Clone, Debug, PartialEq)]
pub enum VolumeSpec {
    /// `pod.spec.volumes[i]`.
    Pod(Volume),
    /// A PersistentVolume bound to the pod's claim.
    Persistent {
        /// The PV.
        pv: PersistentVolume,
        /// `persistentVolumeClaim.readOnly` of the pod volume.
        read_only: bool,
    },
}

impl VolumeSpec {
    /// The inner spec name (upstream `Spec.Name()`): the PV name, else the pod volume name. It
    /// names the directory under `pods/<uid>/volumes/<plugin>/`.
    pub fn name(&self) -> &str {
        match self {
            Self::Pod(volume) => &volume.name,
            Self::Persistent { pv, .. } => pv.metadata.name.as_deref().unwrap_or_default(),
        }
    }

    /// The inline volume, if this is one.
    pub fn volume(&self) -> Option<&Volume> {
        match self {
            Self::Pod(volume) => Some(volume),
            Self::Persistent { .. } => None,
        }
    }

    /// The PersistentVolume, if this is one.
    pub fn persistent_volume(&self) -> Option<&PersistentVolume> {
        match self {
            Self::Persistent { pv, .. } => Some(pv),
            Self::Pod(_) => None,
        }
    }
}
