//! The two caches: desired state (what should be mounted) and actual state (what is).

pub mod asw;
pub mod dsw;
pub(crate) mod signals;
mod small_map;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use rustlet_core::UniqueVolumeName;

/// A cache's state behind a lock, with a generation that every write bumps (housekeeping
/// runs only when it moved) and the volumes each write touched (the reconciler's next pass
/// looks at those, not at every volume).
#[derive(Debug, Default)]
struct Generational<T> {
    inner: RwLock<T>,
    generation: AtomicU64,
    touched: Mutex<Touched>,
}

/// Which volumes a write changes, declared by each writer.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Touch<'a> {
    /// One volume (any of its pods).
    Volume(&'a UniqueVolumeName),
    /// These volumes.
    Volumes(&'a [UniqueVolumeName]),
    /// Nothing the reconciler decides on (errors, the pod object kept for a volume).
    Nothing,
}

/// The volumes written (by a cache write, or by an operation's end) since the reconciler last
/// took them. Bounded: past 65,536 volumes it only says that anything may have changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Touched {
    /// The volumes written.
    pub volumes: HashSet<UniqueVolumeName>,
    /// More were written than kept: every volume may have changed.
    pub all: bool,
}

impl Touched {
    /// Volumes kept between two passes (a pass follows every change, so this is only reached
    /// when no reconciler runs).
    pub(crate) const LIMIT: usize = 65_536;

    pub(crate) fn add(&mut self, volume: &UniqueVolumeName) {
        if self.all || self.volumes.contains(volume) {
            return;
        }
        if self.volumes.len() >= Self::LIMIT {
            self.everything();
            return;
        }
        self.volumes.insert(volume.clone());
    }

    /// Anything may have changed.
    pub(crate) fn everything(&mut self) {
        *self = Self {
            all: true,
            ..Self::default()
        };
    }

    /// Adds what `other` says.
    pub fn merge(&mut self, other: Touched) {
        self.all |= other.all;
        if self.all {
            self.volumes.clear();
        } else {
            self.volumes.extend(other.volumes);
        }
    }
}

/// Which volumes a query covers.
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// Every volume.
    All,
    /// These volumes (absent ones are skipped).
    Volumes(&'a HashSet<UniqueVolumeName>),
}

impl Scope<'_> {
    /// The entries of `map` in scope: a whole-map walk, or one lookup per named volume.
    fn entries<'m, V, S: std::hash::BuildHasher>(
        self,
        map: &'m std::collections::HashMap<UniqueVolumeName, V, S>,
    ) -> Box<dyn Iterator<Item = (&'m UniqueVolumeName, &'m V)> + 'm>
    where
        Self: 'm,
    {
        match self {
            Scope::All => Box::new(map.iter()),
            Scope::Volumes(names) => Box::new(names.iter().filter_map(|n| map.get_key_value(n))),
        }
    }
}

impl<T> Generational<T> {
    fn read(&self) -> RwLockReadGuard<'_, T> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The write lock; the touch is recorded while it is held, so a pass that takes the
    /// touched volumes after this write reads what it wrote.
    fn write(&self, touch: Touch<'_>) -> RwLockWriteGuard<'_, T> {
        self.generation.fetch_add(1, Ordering::AcqRel);
        let guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        self.touch(touch);
        guard
    }

    /// Records a touch (call it while holding the write lock).
    fn touch(&self, touch: Touch<'_>) {
        let mut touched = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        match touch {
            Touch::Volume(volume) => touched.add(volume),
            Touch::Volumes(volumes) => volumes.iter().for_each(|v| touched.add(v)),
            Touch::Nothing => {}
        }
    }

    /// The volumes touched since the last call.
    fn take_touched(&self) -> Touched {
        std::mem::take(&mut *self.touched.lock().unwrap_or_else(|e| e.into_inner()))
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
