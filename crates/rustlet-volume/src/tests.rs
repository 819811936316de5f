//! Populator and facade tests (upstream `desired_state_of_world_populator_test.go` and
//! `volume_manager_test.go` cases for inline volumes), and real-mount integration tests.

mod content;
mod manager;
mod populator;
mod reconstruct;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::testing::FakePods;

/// The pod workers' view (a [`FakePods`]), counting how many pods the populator asks about.
struct CountingStates {
    inner: Arc<FakePods>,
    /// Questions whether a pod's runtime is removed.
    asked: AtomicUsize,
    /// Questions whether a pod's containers should be terminating.
    asked_terminating: AtomicUsize,
}

impl CountingStates {
    fn new(inner: Arc<FakePods>) -> Self {
        Self {
            inner,
            asked: AtomicUsize::new(0),
            asked_terminating: AtomicUsize::new(0),
        }
    }

    /// How many questions `f` made.
    fn asked_by(&self, f: impl FnOnce()) -> usize {
        self.asked.store(0, Ordering::SeqCst);
        f();
        self.asked.load(Ordering::SeqCst)
    }
}

impl crate::populator::PodStateProvider for CountingStates {
    fn should_pod_containers_be_terminating(&self, uid: &rustlet_core::PodUid) -> bool {
        self.asked_terminating.fetch_add(1, Ordering::SeqCst);
        self.inner.should_pod_containers_be_terminating(uid)
    }
    fn should_pod_runtime_be_removed(&self, uid: &rustlet_core::PodUid) -> bool {
        self.asked.fetch_add(1, Ordering::SeqCst);
        self.inner.should_pod_runtime_be_removed(uid)
    }
    fn changes_since(&self, cursor: u64) -> rustlet_core::PodChanges {
        crate::populator::PodStateProvider::changes_since(&*self.inner, cursor)
    }
}
