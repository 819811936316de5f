//! `VolumeSpec`: what a pod asks to mount (upstream `volume.Spec`): an inline pod volume or a
//! PersistentVolume reached through a claim.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};

/// Exactly one of an inline volume or a PersistentVolume.
///
/// The objects are shared (`Arc`): k8s-openapi's `Volume` is several KiB inline (one field per
/// volume source), and every cache entry (desired, actual, per pod) holds a spec; a map node of
/// inline specs cost about 40 KiB per pod volume before they were shared.
#[derive(Clone, Debug, PartialEq)]
pub enum VolumeSpec {
    /// `pod.spec.volumes[i]`.
    Pod(Arc<Volume>),
    /// A PersistentVolume bound to the pod's claim.
    Persistent {
        /// The PV.
        pv: Arc<PersistentVolume>,
        /// `persistentVolumeClaim.readOnly` of the pod volume.
        read_only: bool,
    },
}

impl VolumeSpec {
    /// An inline pod volume.
    pub fn pod(volume: Volume) -> Self {
        Self::Pod(Arc::new(volume))
    }

    /// A PersistentVolume reached through a claim (`read_only`: the claim's `readOnly`).
    pub fn persistent(pv: PersistentVolume, read_only: bool) -> Self {
        Self::Persistent {
            pv: Arc::new(pv),
            read_only,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every cache entry holds a spec: it must stay a few words wide, not a `Volume` wide
    /// (one field per volume source; a B-tree node of them was ~40 KiB per pod volume).
    #[test]
    fn a_spec_is_a_few_words_not_a_whole_volume() {
        assert!(size_of::<Volume>() > 1024, "{}", size_of::<Volume>());
        assert!(size_of::<VolumeSpec>() <= 32, "{}", size_of::<VolumeSpec>());
    }
}
