//! Issue 10's status manager defects, each driven through the real task (`run()`: its select,
//! its timers, its per-pod tasks) in paused time, unless the defect lies in one batch.
//!
//! A spinning task never lets paused time advance (tokio only advances it when every task is
//! idle), so spin checks yield a fixed number of times and count the batches the task ran
//! meanwhile instead of sleeping.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rustlet_core::deletion::FixedDeletionSafety;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::harness::{Harness, random_status, test_pod, uid};
use crate::config::{ReadStrategy, StatusManagerConfig};
use crate::manager::{StatusManager, StatusManagerDeps};
use crate::metrics::StatusMetrics;
use crate::seams::Clock;
use crate::sync::BatchKind;
use crate::testing::{FakePodManager, FakePodStatusClient, Reaction, Verb};

pub(super) struct Running {
    pub(super) manager: Arc<StatusManager>,
    pub(super) client: FakePodStatusClient,
    pods: FakePodManager,
    pub(super) metrics: StatusMetrics,
    pub(super) cancel: CancellationToken,
    handle: JoinHandle<()>,
}

pub(super) fn start(config: StatusManagerConfig, pods_in_api: &[Pod]) -> Running {
    let client = FakePodStatusClient::new();
    let pods = FakePodManager::new();
    for pod in pods_in_api {
        client.put_pod(pod.clone());
        pods.add_pod(pod.clone());
    }
    let metrics = StatusMetrics::default();
    let mut deps = StatusManagerDeps::new(
        Some(Arc::new(client.clone())),
        Arc::new(pods.clone()),
        Arc::new(FixedDeletionSafety::default()),
    );
    deps.metrics = metrics.clone();
    let manager = Arc::new(StatusManager::new(deps, config));
    let cancel = CancellationToken::new();
    let handle = manager.start(cancel.clone()).expect("started");
    Running {
        manager,
        client,
        pods,
        metrics,
        cancel,
        handle,
    }
}

impl Running {
    pub(super) async fn stop(self) {
        self.cancel.cancel();
        self.handle.await.unwrap();
    }

    fn batches(&self) -> u64 {
        ["kick", "full", "retry"]
            .iter()
            .map(|k| self.metrics.batches(k))
            .sum()
    }

    /// Lets the task run without advancing time; returns the batches it ran meanwhile.
    async fn batches_while_yielding(&self) -> u64 {
        let before = self.batches();
        for _ in 0..2000 {
            tokio::task::yield_now().await;
        }
        self.batches() - before
    }

    pub(super) fn calls_for(&self, name: &str, verb: Verb) -> usize {
        self.client
            .actions()
            .iter()
            .filter(|a| a.name == name && a.verb == verb)
            .count()
    }
}

pub(super) fn named(name: &str) -> Pod {
    let mut pod = test_pod();
    pod.metadata.name = Some(name.into());
    pod.metadata.uid = Some(format!("uid-{name}"));
    pod
}

pub(super) fn always_get() -> StatusManagerConfig {
    StatusManagerConfig {
        read_strategy: ReadStrategy::AlwaysGet,
        ..StatusManagerConfig::default()
    }
}

/// Item 1: a retry entry whose pod left the cache (RemoveOrphanedStatuses after a force
/// delete) used to keep a deadline in the past, waking the task at once, forever.
#[tokio::test(start_paused = true)]
async fn retry_timer_does_not_spin_once_the_pod_left_the_cache() {
    let r = start(always_get(), &[test_pod()]);
    r.client.react(Some(Verb::Get), Reaction::Error(500), None);
    r.manager.set_pod_status(&test_pod(), random_status(1));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(r.calls_for("foo", Verb::Get), 1, "failed once, backing off");
    r.manager.remove_orphaned_statuses(&HashSet::new());
    tokio::time::sleep(Duration::from_secs(1)).await; // the retry time passes
    assert!(
        r.batches_while_yielding().await <= 1,
        "the task spins on a stale retry time"
    );
    let before = r.batches();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let ran = r.batches() - before;
    assert!(
        (6..=8).contains(&ran),
        "a minute idle is about six full batches, ran {ran}"
    );
    assert_eq!(r.calls_for("foo", Verb::Get), 1, "nothing left to sync");
    r.stop().await;
}

/// Item 1: a static pod whose mirror is missing is skipped before its backoff is looked at.
#[tokio::test(start_paused = true)]
async fn retry_timer_does_not_spin_on_a_static_pod_without_mirror() {
    let r = start(always_get(), &[test_pod()]);
    r.client.react(Some(Verb::Get), Reaction::Error(500), None);
    r.manager.set_pod_status(&test_pod(), random_status(1));
    tokio::time::sleep(Duration::from_millis(1)).await;
    // The pod turns out to be static (a file source) and its mirror is not there.
    let mut static_pod = test_pod();
    static_pod.metadata.annotations = Some(
        [("kubernetes.io/config.source".to_owned(), "file".to_owned())]
            .into_iter()
            .collect(),
    );
    r.pods.add_pod(static_pod);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        r.batches_while_yielding().await <= 1,
        "the task spins on a stale retry time"
    );
    r.stop().await;
}

fn terminating_failed(name: &str) -> Pod {
    let mut pod = named(name);
    pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Timestamp::UNIX_EPOCH,
    ));
    pod.status = Some(PodStatus {
        phase: Some("Failed".into()),
        ..Default::default()
    });
    pod
}

/// Item 1: a DELETE answered 404 means the pod is gone: done, not a retry forever.
#[tokio::test(start_paused = true)]
async fn a_delete_answered_not_found_is_done() {
    let pod = terminating_failed("gone");
    let r = start(StatusManagerConfig::default(), std::slice::from_ref(&pod));
    r.pods.add_pod(r.client.pod("new", "gone").unwrap());
    r.client.react(Some(Verb::Delete), Reaction::NotFound, None);
    r.manager.terminate_pod(&pod);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(r.calls_for("gone", Verb::Delete), 1);
    assert!(
        r.manager.get_pod_status(&uid("uid-gone")).is_none(),
        "the status of a pod already gone is dropped"
    );
    assert!(r.batches_while_yielding().await <= 1);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(r.calls_for("gone", Verb::Delete), 1, "never deleted again");
    r.stop().await;
}

/// Item 2: a request that never answers used to stall the whole batch, and with it every other
/// pod's next status, and shutdown.
#[tokio::test(start_paused = true)]
async fn a_hung_request_times_out_and_never_holds_back_other_pods() {
    let r = start(always_get(), &[named("slow"), named("quick")]);
    r.client
        .react_for("slow", Some(Verb::Get), Reaction::Hang, Some(1));
    r.manager.set_pod_status(&named("slow"), random_status(1));
    r.manager.set_pod_status(&named("quick"), random_status(1));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(r.calls_for("quick", Verb::Patch), 1);
    // While the slow pod's GET hangs, the quick pod's next status goes out at once.
    r.manager.set_pod_status(&named("quick"), random_status(2));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let message = |name: &str| {
        r.client
            .pod("new", name)
            .and_then(|p| p.status)
            .and_then(|s| s.message)
    };
    assert_eq!(message("quick").as_deref(), Some("random-2"));
    assert_eq!(message("slow"), None, "still hanging");
    // The deadline (10 s) ends the hung call; a retry after the back-off syncs the pod.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(message("slow").as_deref(), Some("random-1"));
    assert_eq!(
        r.metrics.requests("get", 0),
        1,
        "the timeout counts as a failed call"
    );
    r.stop().await;
}

/// Item 2: the shutdown flush is bounded even when a request hangs.
#[tokio::test(start_paused = true)]
async fn shutdown_is_bounded_while_a_request_hangs() {
    let r = start(always_get(), &[test_pod()]);
    r.client.react(Some(Verb::Get), Reaction::Hang, None);
    r.manager.set_pod_status(&test_pod(), random_status(1));
    tokio::time::sleep(Duration::from_millis(1)).await;
    r.cancel.cancel();
    tokio::time::timeout(Duration::from_secs(6), r.handle)
        .await
        .expect("stopped within the 5 s flush deadline")
        .unwrap();
}

/// Item 3: under sustained churn (a kick every 100 ms, each sync taking 150 ms) the full batch
/// still runs every period, and so do retries.
#[tokio::test(start_paused = true)]
async fn kicks_never_starve_the_full_batch() {
    let r = start(
        StatusManagerConfig::default(),
        &[test_pod(), named("other")],
    );
    r.client.set_latency(Duration::from_millis(150));
    for n in 0..600 {
        r.manager.set_pod_status(&test_pod(), random_status(n));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let full = r.metrics.batches("full");
    assert!(
        (5..=7).contains(&full),
        "a minute of churn runs a full batch every 10 s, ran {full}"
    );
    r.stop().await;
}

/// Item 4: upstream's configuration retries a failing pod on the next batch, not at once.
#[tokio::test(start_paused = true)]
async fn upstream_config_retries_on_the_next_batch_not_in_a_hot_loop() {
    let r = start(StatusManagerConfig::upstream(), &[test_pod()]);
    r.client.react(Some(Verb::Get), Reaction::NotFound, None);
    r.manager.set_pod_status(&test_pod(), random_status(1));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(r.batches_while_yielding().await <= 1);
    assert_eq!(r.calls_for("foo", Verb::Get), 1);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        r.calls_for("foo", Verb::Get),
        4,
        "once, then once per full batch"
    );
    r.stop().await;
}

/// Item 5: the jitter is seeded per process (and per manager), so nodes do not retry in
/// lockstep after an outage.
#[tokio::test(start_paused = true)]
async fn jitter_seed_differs_between_managers() {
    let a = Harness::new(StatusManagerConfig::default());
    let b = Harness::new(StatusManagerConfig::default());
    assert_ne!(a.syncer.rng, b.syncer.rng);
}

#[derive(Clone)]
struct StepClock(Arc<Mutex<Timestamp>>);

impl StepClock {
    fn advance(&self, secs: i64) {
        let mut now = self.0.lock().unwrap();
        *now = now.checked_add(SignedDuration::from_secs(secs)).unwrap();
    }
}

impl Clock for StepClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap()
    }
}

/// Item 6 (R61): the sync duration runs from the first update not yet synced, not from the
/// pod's first status.
#[tokio::test(start_paused = true)]
async fn r61_sync_duration_is_measured_from_the_first_unsynced_update() {
    let clock = StepClock(Arc::new(Mutex::new(Timestamp::UNIX_EPOCH)));
    let mut h = Harness::with_clock(
        StatusManagerConfig::default(),
        FixedDeletionSafety::default(),
        Arc::new(clock.clone()),
    );
    h.manager.set_pod_status(&test_pod(), random_status(1));
    clock.advance(2);
    h.consume_updates().await;
    clock.advance(100);
    h.manager.set_pod_status(&test_pod(), random_status(2));
    clock.advance(3);
    h.consume_updates().await;
    let mut registry = prometheus_client::registry::Registry::default();
    h.metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("pod_status_sync_duration_seconds_sum 5.0"),
        "2 s + 3 s, not 2 s + 105 s:\n{text}"
    );
}

/// Item 7: a watch copy older than our last write is not trusted: a status that returns to
/// what the stale copy shows is still written.
#[tokio::test(start_paused = true)]
async fn a_watch_copy_older_than_our_last_write_is_not_trusted() {
    let mut h = Harness::new(StatusManagerConfig::default());
    let original = h.client.pod("new", "foo").unwrap();
    h.pods.add_pod(original.clone()); // the watch copy, with its resourceVersion
    h.manager.set_pod_status(&test_pod(), random_status(1));
    h.consume_updates().await;
    assert_eq!(h.client.take_verbs(), ["patch"]);
    // The watch has not caught up; the status goes back to what the stale copy shows.
    h.manager
        .set_pod_status(&test_pod(), original.status.clone().unwrap());
    h.consume_updates().await;
    assert_eq!(h.client.take_verbs(), ["get", "patch"]);
    assert_eq!(
        h.client.pod("new", "foo").unwrap().status.unwrap().message,
        None
    );
}

/// A sync that finds the watch copy older than our last write waits for the watch to deliver
/// it rather than read the pod by name: one PATCH, no GET.
#[tokio::test(start_paused = true)]
async fn a_watch_copy_behind_our_last_write_is_awaited_not_read() {
    let mut h = Harness::new(StatusManagerConfig::default());
    h.pods.add_pod(h.client.pod("new", "foo").unwrap());
    h.manager.set_pod_status(&test_pod(), random_status(1));
    h.consume_updates().await;
    assert_eq!(h.client.take_verbs(), ["patch"]);
    h.manager.set_pod_status(&test_pod(), random_status(2));
    let (client, pods) = (h.client.clone(), h.pods.clone());
    let started = tokio::time::Instant::now();
    let watch = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(35)).await;
        pods.add_pod(client.pod("new", "foo").unwrap());
    });
    h.consume_updates().await;
    watch.await.unwrap();
    assert_eq!(h.client.take_verbs(), ["patch"]);
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        h.client
            .pod("new", "foo")
            .unwrap()
            .status
            .unwrap()
            .message
            .as_deref(),
        Some("random-2")
    );
}

/// The race the Node authorizer refuses: the pod is deleted while the watch is behind our last
/// write. The watch then delivers the deletion and the pod is never read by name (a GET of it
/// would be answered 403 `no relationship found`).
#[tokio::test(start_paused = true)]
async fn a_pod_deleted_while_the_watch_is_behind_is_not_read_by_name() {
    let mut h = Harness::new(StatusManagerConfig::default());
    h.pods.add_pod(h.client.pod("new", "foo").unwrap());
    h.manager.set_pod_status(&test_pod(), random_status(1));
    h.consume_updates().await;
    assert_eq!(h.client.take_verbs(), ["patch"]);
    h.manager.set_pod_status(&test_pod(), random_status(2));
    let pods = h.pods.clone();
    let watch = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(35)).await;
        pods.remove_pod(&uid("12345678"));
    });
    h.consume_updates().await;
    watch.await.unwrap();
    assert_eq!(h.client.take_verbs(), Vec::<&str>::new());
}

/// A watch that never delivers our write (disconnected) delays a sync by the allowance, then
/// the pod is read by name.
#[tokio::test(start_paused = true)]
async fn a_watch_behind_past_the_allowance_falls_back_to_a_read() {
    let config = StatusManagerConfig {
        watch_lag_allowance: Duration::from_millis(300),
        ..StatusManagerConfig::default()
    };
    let mut h = Harness::new(config);
    h.pods.add_pod(h.client.pod("new", "foo").unwrap());
    h.manager.set_pod_status(&test_pod(), random_status(1));
    h.consume_updates().await;
    h.client.take_verbs();
    h.manager.set_pod_status(&test_pod(), random_status(2));
    let started = tokio::time::Instant::now();
    h.consume_updates().await;
    assert_eq!(h.client.take_verbs(), ["get", "patch"]);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(400),
        "{waited:?}"
    );
}

/// Item 9: a status PATCH answered 422 on `metadata.uid` means the pod was replaced between
/// our GET and our PATCH: read it again and drop the stale entry (R35), at once.
#[tokio::test(start_paused = true)]
async fn r35_patch_answered_422_for_the_uid_reads_again_and_drops_the_replaced_pod() {
    let mut h = Harness::new(always_get());
    let mut replaced = test_pod();
    replaced.metadata.uid = Some("new-incarnation".into());
    h.client.put_pod(replaced);
    // Our GET still saw the old incarnation.
    h.client.react(
        Some(Verb::Get),
        Reaction::RecreatedUid("12345678".into()),
        Some(1),
    );
    h.manager.set_pod_status(&test_pod(), random_status(1));
    h.consume_updates().await;
    assert_eq!(h.client.take_verbs(), ["get", "patch", "get"]);
    assert!(h.manager.get_pod_status(&uid("12345678")).is_none());
    assert!(h.syncer.backoff.is_empty(), "not a failure to retry");
    assert_eq!(h.sync_batch(BatchKind::Full).await, 0);
}
