//! `kick_interval` (issue 29): kick batches start at most once per interval, through the real
//! task (`run()`) in paused time.

use std::time::Duration;

use super::hardening::{Running, always_get, named, start};
use super::harness::random_status;
use crate::config::StatusManagerConfig;
use crate::testing::Verb;

fn every(interval: Duration) -> StatusManagerConfig {
    StatusManagerConfig {
        kick_interval: interval,
        ..always_get()
    }
}

fn patches(r: &Running, name: &str) -> usize {
    r.calls_for(name, Verb::Patch)
}

/// The message of the status the API holds for `name`.
fn written(r: &Running, name: &str) -> Option<String> {
    let namespace = named(name).metadata.namespace?;
    r.client.pod(&namespace, name)?.status?.message
}

#[tokio::test(start_paused = true)]
async fn a_change_after_a_quiet_spell_syncs_at_once_and_a_burst_once_per_interval() {
    let pods = [named("a"), named("b"), named("c")];
    let r = start(every(Duration::from_secs(1)), &pods);
    r.manager.set_pod_status(&pods[0], random_status(1));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(patches(&r, "a"), 1, "the first change is synced at once");
    // A burst right after: held back until one interval after the first batch began.
    r.manager.set_pod_status(&pods[1], random_status(2));
    tokio::time::sleep(Duration::from_millis(10)).await;
    r.manager.set_pod_status(&pods[2], random_status(3));
    r.manager.set_pod_status(&pods[1], random_status(4));
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        (patches(&r, "b"), patches(&r, "c")),
        (0, 0),
        "synced before the interval ended"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        (patches(&r, "b"), patches(&r, "c")),
        (1, 1),
        "each pod of the burst is written once"
    );
    assert_eq!(
        written(&r, "b").as_deref(),
        Some("random-4"),
        "at its latest"
    );
    assert_eq!(written(&r, "c").as_deref(), Some("random-3"));
    assert_eq!(r.metrics.batches("kick"), 2);
    // Quiet for longer than the interval: the next change is synced at once again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    r.manager.set_pod_status(&pods[0], random_status(5));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(written(&r, "a").as_deref(), Some("random-5"));
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_a_kick_interval_every_signal_starts_a_batch() {
    let pods = [named("a"), named("b")];
    let r = start(every(Duration::ZERO), &pods);
    r.manager.set_pod_status(&pods[0], random_status(1));
    tokio::time::sleep(Duration::from_millis(1)).await;
    r.manager.set_pod_status(&pods[1], random_status(2));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!((patches(&r, "a"), patches(&r, "b")), (1, 1));
    assert_eq!(r.metrics.batches("kick"), 2);
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_change_held_back_by_the_kick_interval_is_flushed_on_stop() {
    let pods = [named("a"), named("b")];
    let r = start(every(Duration::from_secs(60)), &pods);
    r.manager.set_pod_status(&pods[0], random_status(1));
    tokio::time::sleep(Duration::from_millis(1)).await;
    r.manager.set_pod_status(&pods[1], random_status(2));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(patches(&r, "b"), 0, "held back");
    let cancel = r.cancel.clone();
    cancel.cancel();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(written(&r, "b").as_deref(), Some("random-2"));
    r.stop().await;
}

/// Spec lesson 4 (prioritize terminal transitions): a terminal phase, a finished pod and a pod
/// being deleted are written at once (a deletion waits on them), and their batch takes what
/// was held back.
#[tokio::test(start_paused = true)]
async fn a_terminal_finished_or_deleted_pod_is_not_held_back_by_the_kick_interval() {
    let mut deleted = named("d");
    deleted.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
    let pods = [named("a"), named("b"), named("c"), deleted, named("e")];
    let r = start(every(Duration::from_secs(60)), &pods);
    r.manager.set_pod_status(&pods[0], random_status(1));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(patches(&r, "a"), 1);
    r.manager.set_pod_status(&pods[2], random_status(2));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(patches(&r, "c"), 0, "held back");
    let succeeded = k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Succeeded".into()),
        ..random_status(3)
    };
    r.manager.set_pod_status(&pods[1], succeeded);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(patches(&r, "b"), 1, "a terminal phase is written at once");
    assert_eq!(patches(&r, "c"), 1, "with what was held back");
    r.manager.set_pod_status(&pods[3], random_status(4));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        patches(&r, "d"),
        1,
        "a pod being deleted is written at once"
    );
    r.manager.terminate_pod(&pods[4]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(patches(&r, "e"), 1, "a finished pod is written at once");
    r.manager.set_pod_status(&pods[0], random_status(5));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(patches(&r, "a"), 1, "and the interval still holds the rest");
    r.stop().await;
}
