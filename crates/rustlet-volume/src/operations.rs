//! Nested pending operations (upstream `nestedpendingoperations`, V48-V50): at most one
//! operation per key at a time, and exponential backoff per key after a failure.
//!
//! A key is (volume, pod, node); two keys conflict when the volumes are equal and set, and the
//! pods (and nodes) are equal or either is unset. A key without a volume never conflicts.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustlet_core::{UniquePodName, UniqueVolumeName};

use crate::cache::Touched;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::error;

/// Backoff after the first failure.
pub const INITIAL_DURATION_BEFORE_RETRY: Duration = Duration::from_millis(500);
/// Backoff cap: 2 min 2 s.
pub const MAX_DURATION_BEFORE_RETRY: Duration = Duration::from_secs(122);

/// The text of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// (volume, pod, node); `None` is upstream's empty name, the wildcard.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperationKey {
    /// The volume.
    pub volume: Option<UniqueVolumeName>,
    /// The pod (unset for operations on the whole volume).
    pub pod: Option<UniquePodName>,
    /// The node (set only for multi-attach volumes).
    pub node: Option<String>,
}

impl OperationKey {
    /// A key on a volume and, optionally, a pod.
    pub fn new(volume: UniqueVolumeName, pod: Option<UniquePodName>) -> Self {
        Self {
            volume: Some(volume),
            pod,
            node: None,
        }
    }

    fn matches(&self, other: &Self) -> bool {
        fn wild<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
            a.is_none() || b.is_none() || a == b
        }
        self.volume.is_some()
            && self.volume == other.volume
            && wild(&self.pod, &other.pod)
            && wild(&self.node, &other.node)
    }
}

impl fmt::Display for OperationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |o: Option<&str>| o.unwrap_or("").to_owned();
        write!(
            f,
            "{{volumeName:{} podName:{} nodeName:{}}}",
            s(self.volume.as_ref().map(|v| v.as_str())),
            s(self.pod.as_ref().map(|p| p.as_str())),
            s(self.node.as_deref())
        )
    }
}

/// Why an operation did not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// A conflicting operation is running (upstream `AlreadyExistsError`). Expected; not logged.
    #[error(
        "Failed to create operation with name {key}. An operation with that name is already executing."
    )]
    AlreadyExists {
        /// The key.
        key: Box<OperationKey>,
    },
    /// The same operation failed recently (upstream `ExponentialBackoff`). Expected; not logged.
    #[error(
        "operation for {key} failed. No retries permitted until {retry_in:?} from now (durationBeforeRetry {duration:?}). Error: {last_error}"
    )]
    Backoff {
        /// The key.
        key: Box<OperationKey>,
        /// Time left.
        retry_in: Duration,
        /// The current backoff.
        duration: Duration,
        /// The last error.
        last_error: String,
    },
}

#[derive(Clone, Debug)]
struct Backoff {
    last_error_time: Instant,
    duration: Duration,
    last_error: String,
}

#[derive(Clone, Debug)]
struct Entry {
    key: OperationKey,
    operation: String,
    pending: bool,
    backoff: Option<Backoff>,
}

/// The operation table, indexed by volume: two keys can only conflict when their volumes are
/// equal, so a lookup scans the entries of one volume, not every tracked operation (upstream
/// scans one slice of everything).
#[derive(Debug, Default)]
pub struct NestedPendingOperations {
    inner: Mutex<Table>,
    idle: Notify,
    /// Someone found no room ([`Self::has_room`]) and waits for [`Self::room_freed`].
    wants_room: AtomicBool,
    room: Notify,
    /// Bumped after a failure is recorded (see [`Self::with_failure_signal`]).
    failed: Option<watch::Sender<u64>>,
}

#[derive(Debug, Default)]
struct Table {
    by_volume: HashMap<Option<UniqueVolumeName>, Vec<Entry>>,
    pending: usize,
    /// The volumes whose operations ended since the last [`NestedPendingOperations::take_ended`]
    /// (a cache's [`Touched`], bounded the same way): the reconciler looks at those volumes
    /// again (a failure writes no state, and its volume must be retried once its back-off
    /// ends), so it need not look at every started one on every pass while it runs. An
    /// operation without a volume says "everything".
    ended: Touched,
}

impl NestedPendingOperations {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bumps `signal` after each failure is recorded (its back-off set and its volume named by
    /// [`Self::take_ended`]): a failure leaves work, a retry once the back-off ends, and the
    /// one who runs passes must hear of it then, not when something else happens.
    pub fn with_failure_signal(mut self, signal: watch::Sender<u64>) -> Self {
        self.failed = Some(signal);
        self
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Upstream `isOperationExists` within one volume's entries: a pending conflicting entry
    /// first, else an exact match, else the first conflicting one.
    fn find(entries: &[Entry], key: &OperationKey) -> Option<usize> {
        let mut found = None;
        for (i, e) in entries.iter().enumerate() {
            if !e.key.matches(key) {
                continue;
            }
            if e.pending {
                return Some(i);
            }
            if found.is_none() || (e.key.pod == key.pod && e.key.node == key.node) {
                found = Some(i);
            }
        }
        found
    }

    /// Marks an operation as started, or says why it may not start (V48).
    pub fn start(&self, key: &OperationKey, operation: &str) -> Result<(), StartError> {
        let mut table = self.table();
        let table = &mut *table;
        let entries = table.by_volume.entry(key.volume.clone()).or_default();
        let Some(i) = Self::find(entries, key) else {
            entries.push(Entry {
                key: key.clone(),
                operation: operation.to_owned(),
                pending: true,
                backoff: None,
            });
            table.pending += 1;
            return Ok(());
        };
        let entry = &mut entries[i];
        if entry.pending {
            return Err(StartError::AlreadyExists {
                key: Box::new(key.clone()),
            });
        }
        if let Some(b) = &entry.backoff {
            let elapsed = Instant::now().saturating_duration_since(b.last_error_time);
            if elapsed <= b.duration {
                if entry.operation == operation {
                    return Err(StartError::Backoff {
                        key: Box::new(key.clone()),
                        retry_in: b.duration - elapsed,
                        duration: b.duration,
                        last_error: b.last_error.clone(),
                    });
                }
                // Another operation: it starts with a clean backoff.
                entry.backoff = None;
            }
        }
        entry.operation = operation.to_owned();
        entry.pending = true;
        entry.key = key.clone();
        table.pending += 1;
        Ok(())
    }

    /// Records the end of a started operation: success forgets the key, failure keeps it with
    /// a doubled backoff (500 ms first, 2 min 2 s at most).
    pub fn finish(&self, key: &OperationKey, result: Result<(), String>) {
        let mut table = self.table();
        let table = &mut *table;
        let Some(entries) = table.by_volume.get_mut(&key.volume) else {
            return;
        };
        let Some(i) = entries.iter().position(|e| e.key == *key) else {
            return;
        };
        if entries[i].pending {
            table.pending -= 1;
        }
        let failed = result.is_err();
        match result {
            Ok(()) => {
                entries.remove(i);
                if entries.is_empty() {
                    table.by_volume.remove(&key.volume);
                }
            }
            Err(err) => {
                let entry = &mut entries[i];
                entry.pending = false;
                let duration = match &entry.backoff {
                    None => INITIAL_DURATION_BEFORE_RETRY,
                    Some(b) => (b.duration * 2).min(MAX_DURATION_BEFORE_RETRY),
                };
                error!(
                    "Operation for {key} failed. No retries permitted until {duration:?} from now (durationBeforeRetry {duration:?}). Error: {err}"
                );
                entry.backoff = Some(Backoff {
                    last_error_time: Instant::now(),
                    duration,
                    last_error: err,
                });
            }
        }
        match &key.volume {
            Some(volume) => table.ended.add(volume),
            None => table.ended.everything(),
        }
        if table.pending == 0 {
            self.idle.notify_waiters();
        }
        if self.wants_room.swap(false, Ordering::AcqRel) {
            // A stored permit: a waiter that is not waiting yet still sees it.
            self.room.notify_one();
        }
        if failed && let Some(signal) = &self.failed {
            signal.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Whether fewer than `limit` operations are running. When not, the next one to end
    /// announces it through [`Self::room_freed`] (checked and asked under the table's lock, so
    /// an end between the two is not missed).
    pub fn has_room(&self, limit: usize) -> bool {
        let table = self.table();
        if table.pending < limit {
            return true;
        }
        self.wants_room.store(true, Ordering::Release);
        false
    }

    /// How many more operations may start under `limit` now.
    pub fn room(&self, limit: usize) -> usize {
        limit.saturating_sub(self.table().pending)
    }

    /// The volumes whose operations ended since the last call.
    pub fn take_ended(&self) -> Touched {
        std::mem::take(&mut self.table().ended)
    }

    /// Resolves after an operation ended while [`Self::has_room`] had said no.
    pub async fn room_freed(&self) {
        self.room.notified().await;
    }

    /// Starts `operation` and runs `work` on a task; its result (a panic counts as a failure)
    /// feeds the backoff.
    pub fn run<F>(
        self: &Arc<Self>,
        key: OperationKey,
        operation: &str,
        work: F,
    ) -> Result<JoinHandle<()>, StartError>
    where
        F: Future<Output = Result<(), String>> + Send + 'static,
    {
        use futures::FutureExt;
        self.start(&key, operation)?;
        let table = self.clone();
        // One task per operation (issue 29): the panic is caught in place instead of by a
        // second task awaiting the first.
        Ok(tokio::spawn(async move {
            let result = match std::panic::AssertUnwindSafe(work).catch_unwind().await {
                Ok(result) => result,
                Err(panic) => Err(format!("operation panicked: {}", panic_message(&*panic))),
            };
            table.finish(&key, result);
        }))
    }

    /// V49: a conflicting operation is running.
    pub fn is_operation_pending(&self, key: &OperationKey) -> bool {
        key.volume.is_some()
            && self
                .table()
                .by_volume
                .get(&key.volume)
                .is_some_and(|entries| entries.iter().any(|e| e.pending && e.key.matches(key)))
    }

    /// V49: no conflicting entry, or its backoff for the same operation has expired.
    pub fn is_operation_safe_to_retry(&self, key: &OperationKey, operation: &str) -> bool {
        let table = self.table();
        let Some(entries) = table.by_volume.get(&key.volume) else {
            return true;
        };
        let Some(i) = Self::find(entries, key) else {
            return true;
        };
        let e = &entries[i];
        if e.pending {
            return false;
        }
        match &e.backoff {
            Some(b) if e.operation == operation => {
                Instant::now().saturating_duration_since(b.last_error_time) > b.duration
            }
            _ => true,
        }
    }

    /// When the earliest backoff that has not ended yet ends (for the manager's retry timer;
    /// an expired one is not returned, so a key nobody retries cannot make the timer spin).
    pub fn next_retry_at(&self) -> Option<Instant> {
        let now = Instant::now();
        self.table()
            .by_volume
            .values()
            .flatten()
            .filter(|e| !e.pending)
            .filter_map(|e| e.backoff.as_ref().map(|b| b.last_error_time + b.duration))
            .filter(|at| *at > now)
            .min()
    }

    /// V50: waits until no operation is pending.
    pub async fn wait(&self) {
        loop {
            let notified = self.idle.notified();
            if self.table().pending == 0 {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(name: &str) -> UniqueVolumeName {
        UniqueVolumeName::new(name)
    }

    fn pod(name: &str) -> Option<UniquePodName> {
        Some(UniquePodName::new(name))
    }

    #[test]
    fn v48_conflicts_follow_the_wildcard_rules() {
        let table = NestedPendingOperations::new();
        let mount_shared = OperationKey::new(vol("v"), None);
        table.start(&mount_shared, "volume_mount").unwrap();
        // Same volume, any pod: conflicts with the pod-less key.
        assert!(matches!(
            table.start(&OperationKey::new(vol("v"), pod("p1")), "volume_unmount"),
            Err(StartError::AlreadyExists { .. })
        ));
        // Another volume: free.
        table
            .start(&OperationKey::new(vol("w"), pod("p1")), "volume_mount")
            .unwrap();
        // Two pods of a per-pod volume key do not conflict.
        table
            .start(&OperationKey::new(vol("x"), pod("p1")), "volume_mount")
            .unwrap();
        table
            .start(&OperationKey::new(vol("x"), pod("p2")), "volume_mount")
            .unwrap();
        // No volume: never conflicts.
        table
            .start(&OperationKey::default(), "verify_volumes_are_attached")
            .unwrap();
        table
            .start(&OperationKey::default(), "verify_volumes_are_attached")
            .unwrap();
        assert!(table.is_operation_pending(&OperationKey::new(vol("v"), pod("any"))));
    }

    #[tokio::test(start_paused = true)]
    async fn v48_backoff_doubles_to_the_cap_and_resets_for_another_operation() {
        let table = NestedPendingOperations::new();
        let key = OperationKey::new(vol("v"), pod("p"));
        let mut expected = INITIAL_DURATION_BEFORE_RETRY;
        for _ in 0..12 {
            table.start(&key, "volume_mount").unwrap();
            table.finish(&key, Err("boom".into()));
            match table.start(&key, "volume_mount") {
                Err(StartError::Backoff { duration, .. }) => assert_eq!(duration, expected),
                other => panic!("expected backoff, got {other:?}"),
            }
            assert!(!table.is_operation_safe_to_retry(&key, "volume_mount"));
            tokio::time::advance(expected + Duration::from_millis(1)).await;
            assert!(table.is_operation_safe_to_retry(&key, "volume_mount"));
            expected = (expected * 2).min(MAX_DURATION_BEFORE_RETRY);
        }
        assert_eq!(expected, MAX_DURATION_BEFORE_RETRY);
        table.start(&key, "volume_mount").unwrap();
        table.finish(&key, Err("boom".into()));
        // A different operation on the same key is not delayed.
        table.start(&key, "volume_unmount").unwrap();
        table.finish(&key, Ok(()));
        // Success forgets the key: the next failure starts at 500 ms again.
        table.start(&key, "volume_mount").unwrap();
        table.finish(&key, Err("boom".into()));
        assert!(
            matches!(table.start(&key, "volume_mount"), Err(StartError::Backoff { duration, .. }) if duration == INITIAL_DURATION_BEFORE_RETRY)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn run_spawns_records_results_and_counts_a_panic_as_a_failure() {
        let table = Arc::new(NestedPendingOperations::new());
        let key = OperationKey::new(vol("v"), pod("p"));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = table
            .run(key.clone(), "volume_mount", async move {
                rx.await.ok();
                Ok(())
            })
            .unwrap();
        assert!(matches!(
            table.run(key.clone(), "volume_mount", async { Ok(()) }),
            Err(StartError::AlreadyExists { .. })
        ));
        tx.send(()).unwrap();
        handle.await.unwrap();
        table.wait().await;
        assert!(!table.is_operation_pending(&key));

        let handle = table
            .run(key.clone(), "volume_mount", async { panic!("plugin bug") })
            .unwrap();
        handle.await.unwrap();
        assert!(
            matches!(table.start(&key, "volume_mount"), Err(StartError::Backoff { last_error, .. }) if last_error.contains("panicked"))
        );
    }

    /// The cap on operations in flight: no room at the limit, and the end of one announces
    /// room (even when nobody waits yet at that moment); with room, nothing is announced.
    #[tokio::test(start_paused = true)]
    async fn room_is_announced_when_an_operation_ends_at_the_limit() {
        let table = NestedPendingOperations::new();
        let (a, b) = (
            OperationKey::new(vol("a"), None),
            OperationKey::new(vol("b"), None),
        );
        table.start(&a, "volume_mount").unwrap();
        assert!(table.has_room(2));
        table.start(&b, "volume_mount").unwrap();
        assert!(!table.has_room(2));
        table.finish(&a, Ok(()));
        tokio::time::timeout(Duration::from_secs(1), table.room_freed())
            .await
            .expect("room announced");
        assert!(table.has_room(2));
        table.finish(&b, Ok(()));
        assert!(
            tokio::time::timeout(Duration::from_secs(1), table.room_freed())
                .await
                .is_err(),
            "nobody had asked: nothing announced"
        );
    }

    /// Issue 15: the volumes whose operations ended, success or failure, each once, until
    /// asked; past `Touched::LIMIT`, or for a key without a volume, "everything".
    #[test]
    fn ended_operations_name_their_volumes_until_asked() {
        let table = NestedPendingOperations::new();
        let (a, b) = (
            OperationKey::new(vol("a"), pod("p")),
            OperationKey::new(vol("b"), None),
        );
        table.start(&a, "volume_mount").unwrap();
        table.start(&b, "volume_unmount").unwrap();
        assert_eq!(table.take_ended(), Touched::default(), "still running");
        table.finish(&a, Err("boom".into()));
        table.finish(&b, Ok(()));
        assert_eq!(
            table.take_ended(),
            Touched {
                volumes: [vol("a"), vol("b")].into(),
                all: false
            }
        );
        assert_eq!(table.take_ended(), Touched::default(), "told once");
        // An end nobody started names nothing.
        table.finish(&OperationKey::new(vol("c"), None), Ok(()));
        assert_eq!(table.take_ended(), Touched::default());

        for i in 0..=Touched::LIMIT {
            let key = OperationKey::new(vol(&format!("v{i}")), None);
            table.start(&key, "volume_mount").unwrap();
            table.finish(&key, Ok(()));
        }
        let ended = table.take_ended();
        assert!(ended.all && ended.volumes.is_empty(), "bounded");
        let nameless = OperationKey::default();
        table.start(&nameless, "verify").unwrap();
        table.finish(&nameless, Ok(()));
        assert!(table.take_ended().all);
    }

    /// The failure signal is bumped after a failure is recorded, not after a success.
    #[test]
    fn a_failure_is_signalled_once_recorded() {
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let table = NestedPendingOperations::new().with_failure_signal(tx);
        let key = OperationKey::new(vol("v"), pod("p"));
        table.start(&key, "volume_mount").unwrap();
        table.finish(&key, Ok(()));
        assert!(!rx.has_changed().unwrap(), "a success leaves no work");
        table.start(&key, "volume_mount").unwrap();
        table.finish(&key, Err("boom".into()));
        assert!(rx.has_changed().unwrap());
        assert!(matches!(
            table.start(&key, "volume_mount"),
            Err(StartError::Backoff { .. })
        ));
        assert_eq!(table.take_ended().volumes.len(), 1, "named by then");
    }

    #[tokio::test(start_paused = true)]
    async fn next_retry_at_is_the_earliest_future_backoff_end() {
        let table = NestedPendingOperations::new();
        assert_eq!(table.next_retry_at(), None);
        let key = OperationKey::new(vol("v"), pod("p"));
        table.start(&key, "volume_mount").unwrap();
        table.finish(&key, Err("boom".into()));
        assert_eq!(
            table.next_retry_at(),
            Some(Instant::now() + INITIAL_DURATION_BEFORE_RETRY)
        );
        tokio::time::advance(INITIAL_DURATION_BEFORE_RETRY * 2).await;
        assert_eq!(
            table.next_retry_at(),
            None,
            "expired: no timer that would spin"
        );
    }

    #[test]
    fn key_display_is_upstreams() {
        let key = OperationKey::new(vol("kubernetes.io/empty-dir/u-v"), pod("u"));
        assert_eq!(
            key.to_string(),
            "{volumeName:kubernetes.io/empty-dir/u-v podName:u nodeName:}"
        );
    }
}
