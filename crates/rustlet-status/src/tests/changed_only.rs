//! Issue 15: batches look only at the pods that changed (the cache's dirty list, the pod
//! manager's change log), the unsynced and the finished ones, and every `full_scan_every`-th
//! full batch at every pod. Same outcomes as upstream's scan of every pod; bounded work.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rustlet_core::deletion::{FixedDeletionSafety, PodDeletionSafety};
use rustlet_core::{PodChanges, PodUid};

use super::harness::{random_status, test_pod};
use crate::config::StatusManagerConfig;
use crate::manager::{StatusManager, StatusManagerDeps};
use crate::seams::{PodManager, UidTranslations};
use crate::sync::{BatchKind, Syncer};
use crate::testing::{FakePodManager, FakePodStatusClient};

/// The fake pod manager, counting lookups; `log: false` hides its change log (a pod manager
/// that keeps none).
struct Counting {
    inner: FakePodManager,
    lookups: AtomicUsize,
    log: bool,
}

impl PodManager for Counting {
    fn pod_by_uid(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        self.inner.pod_by_uid(uid)
    }
    fn mirror_pod_of(&self, pod: &Pod) -> Option<Arc<Pod>> {
        self.inner.mirror_pod_of(pod)
    }
    fn translate_pod_uid(&self, uid: &PodUid) -> PodUid {
        self.inner.translate_pod_uid(uid)
    }
    fn uid_translations(&self) -> UidTranslations {
        self.inner.uid_translations()
    }
    fn changes_since(&self, cursor: u64) -> PodChanges {
        if self.log {
            self.inner.changes_since(cursor)
        } else {
            PodChanges::All { cursor: 0 }
        }
    }
}

/// Whether containers may still run, switchable during a test.
#[derive(Default)]
struct Switch(std::sync::atomic::AtomicBool);

impl PodDeletionSafety for Switch {
    fn pod_could_have_running_containers(&self, _pod: &Pod) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

struct Fixture {
    manager: StatusManager,
    syncer: Syncer,
    client: FakePodStatusClient,
    pods: Arc<Counting>,
    pod_list: Vec<Pod>,
}

const SCAN_EVERY: u32 = 5;

/// `n` pods, each with a synced status and the watch caught up (its copy holds our status).
async fn fixture(n: usize, log: bool, safety: Arc<dyn PodDeletionSafety>) -> Fixture {
    let client = FakePodStatusClient::new();
    let inner = FakePodManager::new();
    let pods = Arc::new(Counting {
        inner: inner.clone(),
        lookups: AtomicUsize::new(0),
        log,
    });
    let mut deps = StatusManagerDeps::new(
        Some(Arc::new(client.clone())),
        pods.clone(),
        Arc::new(FixedDeletionSafety::default()),
    );
    deps.safety = safety;
    let config = StatusManagerConfig {
        full_scan_every: SCAN_EVERY,
        ..StatusManagerConfig::default()
    };
    let manager = StatusManager::new(deps, config);
    let mut syncer = manager.take_syncer();
    let pod_list: Vec<Pod> = (0..n)
        .map(|i| {
            let mut pod = test_pod();
            pod.metadata.name = Some(format!("pod-{i}"));
            pod.metadata.uid = Some(format!("uid-{i}"));
            let stored = client.put_pod(pod);
            inner.add_pod(stored.clone());
            manager.set_pod_status(&stored, random_status(1));
            stored
        })
        .collect();
    syncer.sync_batch(BatchKind::Kick).await;
    for pod in &pod_list {
        let name = pod.metadata.name.as_deref().unwrap();
        inner.add_pod(client.pod("new", name).unwrap()); // the watch catches up
    }
    client.take_actions();
    Fixture {
        manager,
        syncer,
        client,
        pods,
        pod_list,
    }
}

impl Fixture {
    /// One full batch: (pods synced, pod manager lookups, API calls).
    async fn full(&mut self) -> (usize, usize, usize) {
        self.pods.lookups.store(0, Ordering::Relaxed);
        let synced = self.syncer.sync_batch(BatchKind::Full).await;
        (
            synced,
            self.pods.lookups.load(Ordering::Relaxed),
            self.client.take_actions().len(),
        )
    }
}

#[tokio::test(start_paused = true)]
async fn r33_a_full_batch_looks_only_at_the_pods_whose_copy_changed() {
    let mut f = fixture(100, true, Arc::new(FixedDeletionSafety::default())).await;
    // The first full batch is the consistency scan: every pod compared once.
    assert_eq!(f.full().await, (0, 100, 0));
    // Nothing changed: nothing looked up.
    assert_eq!(f.full().await, (0, 0, 0));
    // Someone else overwrites a kubelet-owned field of pod 7: only it is looked at (once to
    // compare, once by its sync), and the cached status is written back (R33).
    let drifted = f
        .client
        .update_status("new", "pod-7", |s| s.message = Some("not ours".into()))
        .unwrap();
    f.pods.inner.add_pod(drifted);
    assert_eq!(f.full().await, (1, 2, 1));
    let message = |f: &Fixture| {
        f.client
            .pod("new", "pod-7")
            .unwrap()
            .status
            .unwrap()
            .message
            .unwrap()
    };
    assert_eq!(message(&f), "random-1");
    // The watch delivers our write: one look, nothing to do.
    f.pods.inner.add_pod(f.client.pod("new", "pod-7").unwrap());
    assert_eq!(f.full().await, (0, 1, 0));
    // The fifth full batch scans every pod again, and finds nothing.
    assert_eq!(f.full().await, (0, 0, 0));
    assert_eq!(f.full().await, (0, 100, 0));
}

#[tokio::test(start_paused = true)]
async fn a_pod_manager_without_a_change_log_gets_upstreams_scan_every_batch() {
    let mut f = fixture(20, false, Arc::new(FixedDeletionSafety::default())).await;
    assert_eq!(f.full().await, (0, 20, 0));
    // The memo of equal pairs spares the comparison, not the visit.
    assert_eq!(f.full().await.1, 20);
    let drifted = f
        .client
        .update_status("new", "pod-3", |s| s.message = Some("not ours".into()))
        .unwrap();
    f.pods.inner.add_pod(drifted);
    assert_eq!(f.full().await, (1, 21, 1));
}

#[tokio::test(start_paused = true)]
async fn r32_a_finished_pod_is_deleted_once_safe_without_any_change_announced() {
    let safety = Arc::new(Switch::default());
    safety.0.store(true, Ordering::Relaxed);
    let mut f = fixture(10, true, safety.clone()).await;
    assert_eq!(f.full().await.1, 10);
    // Pod 4 is being deleted and finishes; its containers may still run.
    let mut pod = f.pod_list[4].clone();
    pod.metadata.deletion_timestamp =
        Some(Time(crate::seams::Clock::now(&crate::seams::SystemClock)));
    f.client.put_pod(pod.clone());
    f.pods.inner.add_pod(f.client.pod("new", "pod-4").unwrap());
    f.manager.terminate_pod(&pod);
    f.syncer.sync_batch(BatchKind::Kick).await;
    f.pods.inner.add_pod(f.client.pod("new", "pod-4").unwrap());
    f.client.take_verbs();
    for _ in 0..2 {
        assert_eq!(f.full().await.2, 0, "not deleted while containers may run");
    }
    // The runtime reclaims it; nothing tells the status manager: the next full batch, which
    // looks at finished pods every time, deletes it with its UID as precondition.
    safety.0.store(false, Ordering::Relaxed);
    let (_, lookups, _) = f.full().await;
    // The finished pod's check, its sync and its deletion: not the nine others.
    assert_eq!(lookups, 3, "only the finished pod is looked at");
    assert!(f.client.pod("new", "pod-4").is_none(), "deleted");
}

#[tokio::test(start_paused = true)]
async fn a_status_removed_as_orphan_and_back_under_its_uid_is_synced_at_once() {
    let mut f = fixture(3, true, Arc::new(FixedDeletionSafety::default())).await;
    for n in 2..5 {
        f.manager.set_pod_status(&f.pod_list[1], random_status(n));
        f.syncer.sync_batch(BatchKind::Kick).await;
    }
    f.client.take_actions();
    // R25: the pod leaves the pod manager's view and its status goes; then it comes back
    // under the same UID before the sync task looked (its version counts from 1 again, below
    // the synced 4).
    let keep = [0, 2].iter().map(|i| PodUid::of(&f.pod_list[*i])).collect();
    f.manager.remove_orphaned_statuses(&keep);
    f.manager.set_pod_status(&f.pod_list[1], random_status(9));
    assert_eq!(
        f.manager
            .get_versioned_status(&PodUid::of(&f.pod_list[1]))
            .unwrap()
            .version,
        1
    );
    assert_eq!(f.syncer.sync_batch(BatchKind::Kick).await, 1);
    let stored = f.client.pod("new", "pod-1").unwrap();
    assert_eq!(stored.status.unwrap().message.as_deref(), Some("random-9"));
}
