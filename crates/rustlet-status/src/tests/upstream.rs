//! `status_manager_test.go`, test by test (upstream names in snake case). The parity tests run
//! with `StatusManagerConfig::upstream()`: GET before PATCH, one pod at a time, no backoff.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Pod, PodCondition, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rustlet_core::pod::{CONFIG_MIRROR_ANNOTATION, CONFIG_SOURCE_ANNOTATION, condition};
use rustlet_core::testutil::{cond, running, status_in, terminated};

use super::harness::{Harness, random_status, test_pod, uid};
use crate::manager::UpdateResult;
use crate::seams::PodManager;
use crate::sync::BatchKind;
use crate::testing::{Reaction, Verb};

fn now() -> Time {
    Time(crate::seams::Clock::now(&crate::seams::SystemClock))
}

#[tokio::test(start_paused = true)]
async fn test_new_status() {
    let mut h = Harness::upstream();
    h.manager.set_pod_status(&test_pod(), random_status(1));
    h.verify_updates(1).await;
    let status = h.manager.get_pod_status(&uid("12345678")).expect("cached");
    assert!(status.start_time.is_some(), "StartTime set");
}

#[tokio::test(start_paused = true)]
async fn test_new_status_preserves_pod_start_time() {
    let mut h = Harness::upstream();
    let mut pod = test_pod();
    let start = rustlet_core::testutil::ts("2026-01-01T00:00:00.75Z");
    pod.status = Some(PodStatus {
        start_time: Some(Time(start)),
        ..Default::default()
    });
    h.manager.set_pod_status(&pod, random_status(1));
    h.verify_updates(1).await;
    let status = h.manager.get_pod_status(&uid("12345678")).unwrap();
    assert_eq!(
        status.start_time,
        Some(Time(rustlet_core::testutil::ts("2026-01-01T00:00:00Z")))
    );
}

fn ready_status(value: &str) -> PodStatus {
    PodStatus {
        conditions: Some(vec![cond("Ready", value)]),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn test_new_status_sets_ready_transition_time() {
    let mut h = Harness::upstream();
    h.manager.set_pod_status(&test_pod(), ready_status("True"));
    h.verify_updates(1).await;
    let status = h.manager.get_pod_status(&uid("12345678")).unwrap();
    assert!(
        condition(&status, "Ready")
            .unwrap()
            .last_transition_time
            .is_some()
    );
}

#[tokio::test(start_paused = true)]
async fn test_changed_status() {
    let mut h = Harness::upstream();
    h.manager.set_pod_status(&test_pod(), random_status(1));
    h.verify_updates(1).await;
    h.manager.set_pod_status(&test_pod(), random_status(2));
    h.verify_updates(1).await;
}

#[tokio::test(start_paused = true)]
async fn test_changed_status_keeps_start_time() {
    let mut h = Harness::upstream();
    let start = now();
    let first = PodStatus {
        start_time: Some(start.clone()),
        ..random_status(1)
    };
    h.manager.set_pod_status(&test_pod(), first);
    h.verify_updates(1).await;
    h.manager.set_pod_status(&test_pod(), random_status(2));
    h.verify_updates(1).await;
    let status = h.manager.get_pod_status(&uid("12345678")).unwrap();
    assert_eq!(
        status.start_time.unwrap().0,
        rustlet_core::normalize::truncate_to_second(start.0)
    );
}

#[tokio::test(start_paused = true)]
async fn test_changed_status_updates_last_transition_time() {
    let mut h = Harness::upstream();
    h.manager.set_pod_status(&test_pod(), ready_status("True"));
    h.verify_updates(1).await;
    let old = condition(
        &h.manager.get_pod_status(&uid("12345678")).unwrap(),
        "Ready",
    )
    .unwrap()
    .clone();
    h.manager.set_pod_status(&test_pod(), ready_status("False"));
    h.verify_updates(1).await;
    let new = condition(
        &h.manager.get_pod_status(&uid("12345678")).unwrap(),
        "Ready",
    )
    .unwrap()
    .clone();
    let (old, new) = (
        old.last_transition_time.unwrap(),
        new.last_transition_time.unwrap(),
    );
    assert!(new.0 >= old.0, "not before the old transition time");
}

#[tokio::test(start_paused = true)]
async fn test_unchanged_status() {
    let mut h = Harness::upstream();
    h.manager.set_pod_status(&test_pod(), random_status(1));
    assert_eq!(
        h.manager.set_pod_status(&test_pod(), random_status(1)),
        UpdateResult::Unchanged
    );
    h.verify_updates(1).await;
}

#[tokio::test(start_paused = true)]
async fn test_unchanged_status_preserves_last_transition_time() {
    let mut h = Harness::upstream();
    h.manager.set_pod_status(&test_pod(), ready_status("True"));
    h.verify_updates(1).await;
    let old = condition(
        &h.manager.get_pod_status(&uid("12345678")).unwrap(),
        "Ready",
    )
    .unwrap()
    .clone();
    h.manager.set_pod_status(&test_pod(), ready_status("True"));
    h.verify_updates(0).await;
    let new = condition(
        &h.manager.get_pod_status(&uid("12345678")).unwrap(),
        "Ready",
    )
    .unwrap()
    .clone();
    assert_eq!(old.last_transition_time, new.last_transition_time);
    assert!(new.last_transition_time.is_some());
}

#[tokio::test(start_paused = true)]
async fn test_sync_pod_ignores_not_found() {
    let mut h = Harness::upstream();
    h.client.react(Some(Verb::Get), Reaction::NotFound, None);
    h.manager.set_pod_status(&test_pod(), random_status(1));
    h.verify_actions(&["get"]).await;
    assert!(
        h.manager.get_pod_status(&uid("12345678")).is_some(),
        "R34: NotFound never deletes the cache"
    );
}

#[tokio::test(start_paused = true)]
async fn test_sync_pod() {
    let mut h = Harness::upstream();
    h.manager.set_pod_status(&test_pod(), random_status(1));
    h.verify_actions(&["get", "patch"]).await;
}

#[tokio::test(start_paused = true)]
async fn test_sync_pod_checks_mismatched_uid() {
    let mut h = Harness::upstream();
    let first = test_pod();
    let mut second = test_pod();
    second.metadata.uid = Some("second".into());
    h.pods.add_pod(first.clone());
    h.pods.add_pod(second.clone());
    h.client.put_pod(first);
    h.manager.set_pod_status(&second, random_status(1));
    h.verify_actions(&["get"]).await;
    assert!(
        h.manager.get_pod_status(&uid("second")).is_none(),
        "R35: stale entry dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn test_sync_pod_no_deadlock() {
    let mut h = Harness::upstream();
    let mut pod = test_pod();
    pod.status = Some(PodStatus {
        container_statuses: Some(vec![status_in("c", running())]),
        ..Default::default()
    });
    let mut n = 0;
    let mut next = || {
        n += 1;
        random_status(n)
    };

    // Pod not found.
    h.client.react(None, Reaction::NotFound, None);
    h.manager.set_pod_status(&pod, next());
    h.verify_actions(&["get"]).await;

    // Pod was recreated.
    h.client.clear_reactors();
    h.client.react(
        Some(Verb::Get),
        Reaction::RecreatedUid("other_pod".into()),
        None,
    );
    h.manager.set_pod_status(&pod, next());
    h.verify_actions(&["get"]).await;

    // Pod not deleted (success case).
    h.client.clear_reactors();
    h.manager.set_pod_status(&pod, next());
    h.verify_actions(&["get", "patch"]).await;

    // Pod is terminated, but still running.
    pod.metadata.deletion_timestamp = Some(now());
    h.manager.set_pod_status(&pod, next());
    h.verify_actions(&["get", "patch"]).await;

    // Pod is terminated successfully.
    pod.status.as_mut().unwrap().container_statuses = Some(vec![status_in("c", terminated(0))]);
    h.manager.set_pod_status(&pod, next());
    h.verify_actions(&["get", "patch"]).await;

    // Error case.
    h.client.react(None, Reaction::Error(500), None);
    h.manager.set_pod_status(&pod, next());
    h.verify_actions(&["get"]).await;
}

#[tokio::test(start_paused = true)]
async fn test_stale_updates() {
    let mut h = Harness::upstream();
    let pod = test_pod();
    let mut status = PodStatus {
        message: Some("initial".into()),
        ..Default::default()
    };
    h.manager.set_pod_status(&pod, status.clone());
    status.message = Some("first version bump".into());
    h.manager.set_pod_status(&pod, status.clone());
    status.message = Some("second version bump".into());
    h.manager.set_pod_status(&pod, status.clone());

    // The batch pushes the latest status; the pending kick then finds nothing.
    assert_eq!(h.sync_batch(BatchKind::Full).await, 1);
    h.verify_updates(0).await;
    assert_eq!(h.client.take_verbs(), ["get", "patch"]);
    h.verify_actions(&[]).await;

    // Setting the same status is a no-op.
    h.manager.set_pod_status(&pod, status.clone());
    h.verify_updates(0).await;

    // Pretend the last sync was one version behind: the batch GETs and finds nothing to patch.
    let key = uid("12345678");
    let version = *h.syncer.api_status_versions.get(&key).unwrap();
    h.syncer.api_status_versions.insert(key, version - 1);
    h.manager.set_pod_status(&pod, status);
    h.sync_batch(BatchKind::Full).await;
    assert_eq!(h.client.take_verbs(), ["get"]);
    h.verify_actions(&[]).await;
}

pub(super) fn static_and_mirror() -> (Pod, Pod) {
    let mut static_pod = test_pod();
    static_pod.metadata.annotations =
        Some([(CONFIG_SOURCE_ANNOTATION.to_owned(), "file".to_owned())].into());
    let mut mirror = test_pod();
    mirror.metadata.uid = Some("mirror-12345678".into());
    mirror.metadata.annotations = Some(
        [
            (CONFIG_SOURCE_ANNOTATION.to_owned(), "api".to_owned()),
            (CONFIG_MIRROR_ANNOTATION.to_owned(), "mirror".to_owned()),
        ]
        .into(),
    );
    (static_pod, mirror)
}

#[tokio::test(start_paused = true)]
async fn test_static_pod() {
    let mut h = Harness::upstream();
    let (static_pod, mut mirror) = static_and_mirror();
    h.client.put_pod(mirror.clone());
    h.pods.add_pod(static_pod.clone());

    let status = PodStatus {
        start_time: Some(now()),
        ..random_status(1)
    };
    h.manager.set_pod_status(&static_pod, status);
    let cached = h
        .manager
        .get_pod_status(&uid("12345678"))
        .expect("static pod status");

    // No mirror pod yet: never synced.
    h.sync_batch(BatchKind::Full).await;
    assert!(h.client.take_actions().is_empty());

    h.pods.add_pod(mirror.clone());
    assert_eq!(
        h.pods.translate_pod_uid(&uid("mirror-12345678")),
        uid("12345678")
    );
    assert_eq!(
        h.manager.get_pod_status(&uid("mirror-12345678")),
        Some(cached)
    );

    assert_eq!(h.sync_batch(BatchKind::Full).await, 1);
    h.verify_actions(&["get", "patch"]).await;

    h.test_sync_batch().await;
    h.verify_actions(&[]).await;

    // The mirror pod is recreated with another UID; the API still has the old one.
    h.pods.remove_pod(&uid("mirror-12345678"));
    mirror.metadata.uid = Some("new-mirror-pod".into());
    mirror.status = Some(PodStatus::default());
    h.pods.add_pod(mirror);
    assert_eq!(h.sync_batch(BatchKind::Full).await, 1);
    h.verify_actions(&["get"]).await;
}

fn probe_pod() -> Pod {
    let mut pod = test_pod();
    pod.spec = Some(PodSpec {
        containers: vec![
            Container {
                name: "c1".into(),
                ..Default::default()
            },
            Container {
                name: "c2".into(),
                ..Default::default()
            },
        ],
        ..Default::default()
    });
    pod
}

fn probe_status() -> PodStatus {
    let cs = |name: &str, id: &str| ContainerStatus {
        name: name.into(),
        container_id: Some(id.into()),
        ..Default::default()
    };
    PodStatus {
        container_statuses: Some(vec![cs("c1", "test://1"), cs("c2", "test://2")]),
        conditions: Some(vec![PodCondition {
            ..cond("Ready", "False")
        }]),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn test_set_container_readiness() {
    let mut h = Harness::upstream();
    let pod = probe_pod();
    h.pods.add_pod(pod.clone());
    let id = uid("12345678");
    let ready = |h: &Harness| {
        condition(&h.manager.get_pod_status(&id).unwrap(), "Ready")
            .unwrap()
            .status
            .clone()
    };

    assert_eq!(
        h.manager.set_container_readiness(&id, "test://1", true),
        UpdateResult::Ignored
    );
    h.verify_updates(0).await;
    assert!(h.manager.get_pod_status(&id).is_none());

    h.manager.set_pod_status(&pod, probe_status());
    h.verify_updates(1).await;

    h.manager.set_container_readiness(&id, "test://1", false);
    h.verify_updates(0).await;

    h.manager.set_container_readiness(&id, "test://1", true);
    h.verify_updates(1).await;
    assert_eq!(ready(&h), "False");

    h.manager.set_container_readiness(&id, "test://2", true);
    h.verify_updates(1).await;
    assert_eq!(ready(&h), "True");

    h.manager.set_container_readiness(&id, "test://foo", true);
    h.verify_updates(0).await;
}

#[tokio::test(start_paused = true)]
async fn test_set_container_startup() {
    let mut h = Harness::upstream();
    let pod = probe_pod();
    h.pods.add_pod(pod.clone());
    let id = uid("12345678");
    let started = |h: &Harness, i: usize| {
        h.manager
            .get_pod_status(&id)
            .unwrap()
            .container_statuses
            .unwrap()[i]
            .started
    };

    assert_eq!(
        h.manager.set_container_startup(&id, "test://1", true),
        UpdateResult::Ignored
    );
    h.verify_updates(0).await;

    h.manager.set_pod_status(&pod, probe_status());
    h.verify_updates(1).await;

    h.manager.set_container_startup(&id, "test://1", false);
    h.verify_updates(1).await; // nil -> false is a change
    assert_eq!(started(&h, 0), Some(false));

    h.manager.set_container_startup(&id, "test://1", true);
    h.verify_updates(1).await;
    h.manager.set_container_startup(&id, "test://2", true);
    h.verify_updates(1).await;
    assert_eq!((started(&h, 0), started(&h, 1)), (Some(true), Some(true)));

    h.manager.set_container_startup(&id, "test://foo", true);
    h.verify_updates(0).await;
}

#[tokio::test(start_paused = true)]
async fn test_sync_batch_cleanup_versions() {
    let mut h = Harness::upstream();
    let test_uid = uid("12345678");
    let mirror_uid = uid("mirror-uid");

    // Orphaned versions are removed.
    h.syncer.api_status_versions.insert(test_uid.clone(), 100);
    h.syncer.api_status_versions.insert(mirror_uid.clone(), 200);
    h.sync_batch(BatchKind::Full).await;
    assert!(!h.syncer.api_status_versions.contains_key(&test_uid));
    assert!(!h.syncer.api_status_versions.contains_key(&mirror_uid));

    // Non-orphaned versions are kept.
    h.manager.set_pod_status(&test_pod(), random_status(1));
    let (mut static_pod, mut mirror) = static_and_mirror();
    mirror.metadata.uid = Some("mirror-uid".into());
    mirror.metadata.name = Some("mirror_pod".into());
    static_pod.metadata.uid = Some("static-uid".into());
    static_pod.metadata.name = Some("mirror_pod".into());
    h.pods.add_pod(mirror);
    h.pods.add_pod(static_pod);
    h.syncer.api_status_versions.insert(test_uid.clone(), 100);
    h.syncer.api_status_versions.insert(mirror_uid.clone(), 200);
    h.test_sync_batch().await;
    assert!(h.syncer.api_status_versions.contains_key(&test_uid));
    assert!(h.syncer.api_status_versions.contains_key(&mirror_uid));
}

#[tokio::test(start_paused = true)]
async fn test_reconcile_pod_status() {
    let mut h = Harness::upstream();
    let mut pod = test_pod();
    let id = uid("12345678");
    h.manager.set_pod_status(&pod, random_status(1));
    h.sync_batch(BatchKind::Full).await;
    h.client.take_actions();

    // Same status in the pod manager: no reconciliation.
    let status = h.manager.get_pod_status(&id).unwrap();
    pod.status = Some(status.clone());
    h.pods.add_pod(pod.clone());
    h.sync_batch(BatchKind::Full).await;
    h.verify_actions(&[]).await;

    // Only the timestamp precision differs: still nothing.
    let start = status.start_time.clone().unwrap().0;
    pod.status.as_mut().unwrap().start_time = Some(Time(
        start
            .checked_add(k8s_openapi::jiff::SignedDuration::from_millis(250))
            .unwrap(),
    ));
    h.pods.add_pod(pod.clone());
    h.sync_batch(BatchKind::Full).await;
    h.verify_actions(&[]).await;

    // A different status: reconciled.
    h.manager.set_pod_status(&pod, random_status(2));
    h.sync_batch(BatchKind::Full).await;
    h.verify_actions(&["get", "patch"]).await;

    // Drift made by someone else in a kubelet-owned field is overwritten by the full batch.
    let drifted = h
        .client
        .update_status("new", "foo", |s| s.message = Some("someone else".into()))
        .unwrap();
    h.pods.add_pod(drifted);
    let _ = pod;
    assert_eq!(h.sync_batch(BatchKind::Full).await, 1);
    assert_eq!(h.client.take_verbs(), ["get", "patch"]);
}

fn deleted_pod() -> Pod {
    let mut pod = test_pod();
    pod.metadata.deletion_timestamp = Some(now());
    pod
}

#[tokio::test(start_paused = true)]
async fn test_delete_pod_before_finished() {
    let mut h = Harness::upstream();
    let pod = deleted_pod();
    h.client.put_pod(pod.clone());
    h.pods.add_pod(pod.clone());
    let status = PodStatus {
        phase: Some("Failed".into()),
        ..random_status(1)
    };
    h.manager.set_pod_status(&pod, status);
    h.verify_actions(&["get", "patch"]).await;
}

#[tokio::test(start_paused = true)]
async fn test_delete_pod_finished() {
    let mut h = Harness::upstream();
    let pod = deleted_pod();
    h.client.put_pod(pod.clone());
    h.pods.add_pod(pod.clone());
    h.manager.terminate_pod(&pod);
    h.verify_actions(&["get", "patch", "delete"]).await;
    assert!(h.client.pod("new", "foo").is_none());
    assert!(
        h.manager.get_pod_status(&uid("12345678")).is_none(),
        "R26: deleted from the cache"
    );
}

#[tokio::test(start_paused = true)]
async fn test_delete_sends_grace_zero_and_the_uid_precondition() {
    let mut h = Harness::upstream();
    let pod = deleted_pod();
    h.client.put_pod(pod.clone());
    h.pods.add_pod(pod.clone());
    h.manager.terminate_pod(&pod);
    h.consume_updates().await;
    let delete = h
        .client
        .take_actions()
        .into_iter()
        .find(|a| a.verb == Verb::Delete)
        .unwrap();
    assert_eq!(
        delete.body,
        Some(serde_json::json!({"gracePeriodSeconds": 0, "preconditions": {"uid": "12345678"}}))
    );
}

#[tokio::test(start_paused = true)]
async fn test_do_not_delete_mirror_pods() {
    let mut h = Harness::upstream();
    let (static_pod, mut mirror) = static_and_mirror();
    mirror.metadata.deletion_timestamp = Some(now());
    h.client.put_pod(mirror.clone());
    h.pods.add_pod(static_pod.clone());
    h.pods.add_pod(mirror);
    let status = PodStatus {
        start_time: Some(now()),
        ..random_status(1)
    };
    h.manager.set_pod_status(&static_pod, status);
    h.verify_actions(&["get", "patch"]).await;
}

#[tokio::test(start_paused = true)]
async fn test_container_termination_metric() {
    let h = Harness::upstream();
    let mut pod = test_pod();
    pod.spec = Some(PodSpec {
        containers: vec![Container {
            name: "container".into(),
            ..Default::default()
        }],
        ..Default::default()
    });
    let mut done = status_in("container", terminated(0));
    done.state
        .as_mut()
        .unwrap()
        .terminated
        .as_mut()
        .unwrap()
        .reason = Some("Completed".into());
    h.manager.set_pod_status(
        &pod,
        PodStatus {
            phase: Some("Running".into()),
            container_statuses: Some(vec![status_in("container", running())]),
            ..Default::default()
        },
    );
    h.manager.set_pod_status(
        &pod,
        PodStatus {
            phase: Some("Succeeded".into()),
            container_statuses: Some(vec![done]),
            ..Default::default()
        },
    );
    let mut other = pod.clone();
    other.metadata.uid = Some("other".into());
    let mut failed = status_in("container", terminated(1));
    failed
        .state
        .as_mut()
        .unwrap()
        .terminated
        .as_mut()
        .unwrap()
        .reason = Some("Error".into());
    h.manager.set_pod_status(
        &other,
        PodStatus {
            phase: Some("Failed".into()),
            container_statuses: Some(vec![failed]),
            ..Default::default()
        },
    );
    let count = |code: &str, reason: &str| {
        h.metrics
            .terminated_containers
            .get_or_create(&vec![
                ("container_type".into(), "container".into()),
                ("exit_code".into(), code.into()),
                ("reason".into(), reason.into()),
            ])
            .get()
    };
    assert_eq!(count("0", "Completed"), 1);
    assert_eq!(count("1", "Error"), 1);
}

#[tokio::test(start_paused = true)]
async fn r25_remove_orphaned_statuses_keeps_only_the_given_uids() {
    let h = Harness::upstream();
    let mut other = test_pod();
    other.metadata.uid = Some("other".into());
    h.manager.set_pod_status(&test_pod(), random_status(1));
    h.manager.set_pod_status(&other, random_status(1));
    h.manager
        .remove_orphaned_statuses(&HashSet::from([uid("other")]));
    assert!(h.manager.get_pod_status(&uid("12345678")).is_none());
    assert!(h.manager.get_pod_status(&uid("other")).is_some());
}

#[tokio::test(start_paused = true)]
async fn r63_pods_unknown_to_the_pod_manager_are_cached_and_synced() {
    let mut h = Harness::upstream();
    h.pods.remove_pod(&uid("12345678"));
    h.manager.set_pod_status(&test_pod(), random_status(1));
    h.verify_actions(&["get", "patch"]).await;
}

/// Upstream (≤1.26) `TestDeletePodWhileReclaiming`, in today's terms: containers could still
/// run, so the terminal phase is held back and nothing is deleted.
#[tokio::test(start_paused = true)]
async fn test_delete_pod_while_reclaiming() {
    let mut h = Harness::with(
        crate::config::StatusManagerConfig::upstream(),
        rustlet_core::deletion::FixedDeletionSafety {
            has_running_containers: true,
        },
    );
    let pod = deleted_pod();
    h.client.put_pod(pod.clone());
    h.pods.add_pod(pod.clone());
    h.manager.set_pod_status(
        &pod,
        PodStatus {
            phase: Some("Failed".into()),
            ..random_status(1)
        },
    );
    h.verify_actions(&["get", "patch"]).await;
    let api = h.client.pod("new", "foo").unwrap();
    assert_ne!(
        api.status.unwrap().phase.as_deref(),
        Some("Failed"),
        "R44: terminal phase delayed"
    );
}

/// Issue 29: `additions` moves when the cache gains an entry (a status for a new UID, a
/// resize condition), not when a cached pod's status changes: the pod workers' housekeeping
/// retains the cache (R25) only when it moved or the source changed.
#[tokio::test(start_paused = true)]
async fn r25_additions_move_with_new_entries_only() {
    let h = Harness::upstream();
    let start = h.manager.additions();
    h.manager.set_pod_status(&test_pod(), random_status(1));
    let first = h.manager.additions();
    assert_ne!(first, start, "a status for a new UID");
    h.manager.set_pod_status(&test_pod(), random_status(2));
    assert_eq!(
        h.manager.additions(),
        first,
        "a cached pod's new status adds nothing"
    );
    h.manager
        .set_pod_resize_pending_condition(&uid("other"), "Deferred", "", 1);
    assert_ne!(h.manager.additions(), first, "a resize condition");
}
