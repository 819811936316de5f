//! Per-pod change signals (issue 29): a task that waits on one pod's volumes is woken by a
//! change to that pod, not by every change to every pod. With one node-wide signal, a storm
//! of 1,000 pods woke each of its ~1,000 waiting pod workers on every mount that completed
//! and on every reconciler pass, to look at its own pod and sleep again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rustlet_core::UniquePodName;
use tokio::sync::watch;

/// The pods someone waits on, each with the sender of its signal. An entry lives as long as
/// a [`PodSignal`] of the pod does: a change to a pod nobody waits on costs one lookup.
#[derive(Debug, Default)]
pub(crate) struct PodSignals {
    senders: Mutex<HashMap<UniquePodName, watch::Sender<()>>>,
}

impl PodSignals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<UniquePodName, watch::Sender<()>>> {
        self.senders.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A signal of `pod`'s changes from now on. Take it before looking at the state it is
    /// about: a change made after it was taken is never missed.
    pub(crate) fn subscribe(self: &Arc<Self>, pod: &UniquePodName) -> PodSignal {
        let receiver = self
            .lock()
            .entry(pod.clone())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        PodSignal {
            receiver,
            pod: pod.clone(),
            signals: self.clone(),
        }
    }

    /// `pod` changed. Call it once the change can be read (after the write lock is released,
    /// or while it is still held: a reader woken early waits for the lock).
    pub(crate) fn notify(&self, pod: &UniquePodName) {
        if let Some(sender) = self.lock().get(pod) {
            sender.send_replace(());
        }
    }

    /// Pods with a signal taken, for the tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A pod's change signal; its entry goes with the last one of the pod.
#[derive(Debug)]
pub(crate) struct PodSignal {
    receiver: watch::Receiver<()>,
    pod: UniquePodName,
    signals: Arc<PodSignals>,
}

impl PodSignal {
    /// Resolves at the first change since the signal was taken or last resolved.
    pub(crate) async fn changed(&mut self) {
        if self.receiver.changed().await.is_err() {
            // The sender lives while this receiver does: unreachable; never resolve rather
            // than spin.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for PodSignal {
    fn drop(&mut self) {
        let mut senders = self.signals.lock();
        // This signal's receiver is still alive here: the entry goes when it is the last.
        if senders
            .get(&self.pod)
            .is_some_and(|sender| sender.receiver_count() <= 1)
        {
            senders.remove(&self.pod);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> UniquePodName {
        UniquePodName::new(name)
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_resolves_on_its_own_pods_changes_only() {
        let signals = Arc::new(PodSignals::default());
        let mut a = signals.subscribe(&pod("a"));
        signals.notify(&pod("b"));
        let quiet = tokio::time::timeout(std::time::Duration::from_secs(1), a.changed()).await;
        assert!(quiet.is_err(), "another pod's change does not wake a");
        // A change made before the wait started is not lost.
        signals.notify(&pod("a"));
        tokio::time::timeout(std::time::Duration::ZERO, a.changed())
            .await
            .expect("a's change wakes a");
    }

    #[test]
    fn the_entry_goes_with_the_last_signal_of_its_pod() {
        let signals = Arc::new(PodSignals::default());
        let first = signals.subscribe(&pod("a"));
        let second = signals.subscribe(&pod("a"));
        assert_eq!(signals.len(), 1);
        drop(first);
        assert_eq!(signals.len(), 1, "the second still waits");
        drop(second);
        assert_eq!(signals.len(), 0);
        // Nobody waits: a change is a lookup, and makes no entry.
        signals.notify(&pod("a"));
        assert_eq!(signals.len(), 0);
    }
}
