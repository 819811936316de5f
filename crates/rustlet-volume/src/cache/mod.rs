//! The two caches: desired state (what should be mounted) and actual state (what is).

pub mod asw;
pub mod dsw;

#[cfg(test)]
mod tests;

pub use asw::{
    ActualStateOfWorld, Attachability, AttachedVolume, DeviceMountState, MarkVolumeOpts,
    MountedVolume, PodVolumeState, VolumeMountState,
};
pub use dsw::{DesiredStateOfWorld, VolumeToMount};
