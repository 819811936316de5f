//! The two caches: desired state (what should be mounted) and actual state (what is).

pub mod asw;
pub mod dsw;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A cache's state behind a lock, with a generation that every write bumps: the reconciler
/// skips a pass when neither cache's generation moved.
#[derive(Debug, Default)]
struct Generational<T> {
    inner: RwLock<T>,
    generation: AtomicU64,
}

impl<T> Generational<T> {
    fn read(&self) -> RwLockReadGuard<'_, T> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests;

pub use asw::{
    ActualStateOfWorld, Attachability, AttachedVolume, DeviceMountState, MarkVolumeOpts,
    MountedVolume, PodVolumeState, VolumeMountState,
};
pub use dsw::{DesiredStateOfWorld, VolumeToMount};
