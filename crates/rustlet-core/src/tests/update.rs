//! Accepting updates (R1-R12, R15-R18), ported from upstream `TestNewStatus` and friends; the
//! sync counts of those tests belong to the status crate, the cache effects are checked here.

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{Timestamp, ToSpan};

use crate::features::FeatureGates;
use crate::probe::{ProbeOutcome, with_container_readiness, with_container_startup};
use crate::terminate::terminate_status;
use crate::testutil::*;
use crate::transition::TransitionError;
use crate::update::{
    UpdateContext, UpdateOutcome, UpdateSource, VersionedPodStatus, prepare_update,
};

/// A one-pod cache driving `prepare_update` the way the status manager does.
pub(super) struct Cache {
    pub entry: Option<VersionedPodStatus>,
    pub mirror: Option<PodStatus>,
    pub gates: FeatureGates,
    pub now: Timestamp,
}

impl Default for Cache {
    fn default() -> Self {
        Self {
            entry: None,
            mirror: None,
            gates: FeatureGates::default(),
            now: ts("2026-03-04T05:06:07.5Z"),
        }
    }
}

impl Cache {
    pub fn apply(&mut self, pod: &Pod, status: PodStatus, source: UpdateSource) -> UpdateOutcome {
        let ctx = UpdateContext {
            cached: self.entry.as_ref(),
            mirror_status: self.mirror.as_ref(),
            now: self.now,
            gates: &self.gates,
        };
        let outcome = prepare_update(pod, status, source, ctx);
        if let Some(entry) = outcome.accepted() {
            self.entry = Some(entry.clone());
        }
        outcome
    }

    pub fn set(&mut self, pod: &Pod, status: PodStatus) -> UpdateOutcome {
        self.apply(pod, status, UpdateSource::SetPodStatus)
    }

    pub fn terminate_outcome(&mut self, pod: &Pod) -> UpdateOutcome {
        let status = terminate_status(pod, self.entry.as_ref().map(|e| &e.status));
        self.apply(pod, status, UpdateSource::TerminatePod)
    }

    pub fn terminate(&mut self, pod: &Pod) -> VersionedPodStatus {
        match self.terminate_outcome(pod) {
            UpdateOutcome::Accepted(a) => a.entry,
            other => panic!("TerminatePod must always store a version, got {other:?}"),
        }
    }

    fn status(&self) -> &PodStatus {
        &self.entry.as_ref().expect("cached").status
    }

    fn version(&self) -> u64 {
        self.entry.as_ref().map_or(0, |e| e.version)
    }

    fn tick(&mut self) {
        self.now = self.now.checked_add(1.minute()).unwrap();
    }
}

fn random_status(message: &str) -> PodStatus {
    PodStatus {
        message: Some(message.into()),
        ..Default::default()
    }
}

fn ready_status(status: &str) -> PodStatus {
    PodStatus {
        conditions: Some(vec![cond("Ready", status)]),
        ..Default::default()
    }
}

fn ready_time(status: &PodStatus) -> Option<Time> {
    crate::pod::condition(status, "Ready").and_then(|c| c.last_transition_time.clone())
}

#[test]
fn test_new_status() {
    let mut cache = Cache::default();
    assert!(
        cache
            .set(&test_pod(), random_status("1"))
            .accepted()
            .is_some()
    );
    assert_eq!(cache.version(), 1);
    assert_eq!(
        cache.status().start_time,
        Some(Time(ts("2026-03-04T05:06:07Z"))),
        "R8 + R10"
    );
}

#[test]
fn test_new_status_preserves_pod_start_time() {
    let mut pod = test_pod();
    let start = ts("2026-03-04T05:05:07.25Z");
    pod.status = Some(PodStatus {
        start_time: Some(Time(start)),
        ..Default::default()
    });
    let mut cache = Cache::default();
    cache.set(&pod, random_status("1"));
    assert_eq!(
        cache.status().start_time,
        Some(Time(ts("2026-03-04T05:05:07Z")))
    );
}

#[test]
fn test_new_status_sets_ready_transition_time() {
    let mut cache = Cache::default();
    cache.set(&test_pod(), ready_status("True"));
    assert_eq!(
        ready_time(cache.status()),
        Some(Time(ts("2026-03-04T05:06:07Z")))
    );
}

#[test]
fn test_changed_status() {
    let mut cache = Cache::default();
    cache.set(&test_pod(), random_status("1"));
    cache.set(&test_pod(), random_status("2"));
    assert_eq!(cache.version(), 2);
}

#[test]
fn test_changed_status_keeps_start_time() {
    let mut cache = Cache::default();
    let first = PodStatus {
        start_time: Some(Time(cache.now)),
        ..random_status("1")
    };
    cache.set(&test_pod(), first);
    cache.tick();
    cache.set(&test_pod(), random_status("2"));
    assert_eq!(cache.version(), 2);
    assert_eq!(
        cache.status().start_time,
        Some(Time(ts("2026-03-04T05:06:07Z")))
    );
}

#[test]
fn test_changed_status_updates_last_transition_time() {
    let mut cache = Cache::default();
    cache.set(&test_pod(), ready_status("True"));
    let old = ready_time(cache.status()).unwrap();
    cache.tick();
    cache.set(&test_pod(), ready_status("False"));
    let new = ready_time(cache.status()).unwrap();
    assert_eq!(cache.version(), 2);
    assert!(new.0 > old.0);
}

#[test]
fn test_unchanged_status() {
    let mut cache = Cache::default();
    cache.set(&test_pod(), random_status("1"));
    assert_eq!(
        cache.set(&test_pod(), random_status("1")),
        UpdateOutcome::Unchanged
    );
    assert_eq!(cache.version(), 1);
}

#[test]
fn test_unchanged_status_preserves_last_transition_time() {
    let mut cache = Cache::default();
    cache.set(&test_pod(), ready_status("True"));
    let old = ready_time(cache.status());
    cache.tick();
    assert_eq!(
        cache.set(&test_pod(), ready_status("True")),
        UpdateOutcome::Unchanged
    );
    assert_eq!(ready_time(cache.status()), old);
    assert!(old.is_some());
}

#[test]
fn r3_deletion_timestamp_forces_a_new_version() {
    let mut pod = test_pod();
    pod.metadata.deletion_timestamp = Some(Time(ts("2026-01-01T00:00:00Z")));
    let mut cache = Cache::default();
    cache.set(&pod, random_status("1"));
    assert!(cache.set(&pod, random_status("1")).accepted().is_some());
    assert_eq!(cache.version(), 2);
}

#[test]
fn r4_uncached_pod_takes_old_status_from_the_mirror_pod() {
    let then = ts("2025-05-05T05:05:05Z");
    let mut cache = Cache {
        mirror: Some(PodStatus {
            start_time: Some(Time(then)),
            ..Default::default()
        }),
        ..Default::default()
    };
    cache.set(&test_pod(), random_status("1"));
    assert_eq!(cache.status().start_time, Some(Time(then)));
}

#[test]
fn r5_pod_is_finished_is_sticky_except_for_static_pods() {
    let mut cache = Cache::default();
    cache.terminate(&test_pod());
    match cache.set(&test_pod(), random_status("later")) {
        UpdateOutcome::Accepted(a) => {
            assert!(a.entry.pod_is_finished);
            assert!(a.finished_was_sticky);
        }
        other => panic!("{other:?}"),
    }
    let mut static_pod = test_pod();
    static_pod.metadata.annotations = Some(
        [(
            crate::pod::CONFIG_SOURCE_ANNOTATION.to_owned(),
            "file".to_owned(),
        )]
        .into(),
    );
    let mut cache = Cache::default();
    cache.terminate(&static_pod);
    cache.set(&static_pod, random_status("later"));
    assert!(!cache.entry.unwrap().pod_is_finished);
}

#[test]
fn r6_rejected_update_changes_nothing() {
    let mut pod = test_pod();
    pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        restart_policy: Some("Never".into()),
        ..spec_with(&[], &["c"])
    });
    let mut cache = Cache::default();
    let done = PodStatus {
        container_statuses: Some(vec![status_in("c", terminated(0))]),
        ..Default::default()
    };
    cache.set(&pod, done);
    let before = cache.entry.clone();
    let back = PodStatus {
        container_statuses: Some(vec![status_in("c", running())]),
        ..Default::default()
    };
    assert_eq!(
        cache.set(&pod, back),
        UpdateOutcome::Rejected(TransitionError::ContainerRestarted("c".into()))
    );
    assert_eq!(cache.entry, before);
}

#[test]
fn r9_observed_generation_never_goes_down() {
    let mut pod = test_pod();
    pod.metadata.generation = Some(5);
    let mut cache = Cache::default();
    cache.set(&pod, random_status("1"));
    assert_eq!(cache.status().observed_generation, Some(5), "R2");
    pod.metadata.generation = Some(3);
    cache.set(&pod, random_status("2"));
    assert_eq!(cache.status().observed_generation, Some(5));
}

#[test]
fn r12_versions_increase_by_one_and_first_seen_time_is_kept() {
    let mut cache = Cache::default();
    let first_accept = cache.now;
    for i in 1..=5 {
        cache.set(&test_pod(), random_status(&i.to_string()));
        assert_eq!(cache.version(), i);
        cache.tick();
    }
    let entry = cache.entry.clone().unwrap();
    assert_eq!(entry.at, Some(first_accept));
    assert_eq!(
        (entry.pod_name.as_str(), entry.pod_namespace.as_str()),
        ("foo", "new")
    );
}

#[test]
fn r61_the_first_update_after_a_sync_starts_the_clock_again() {
    let mut cache = Cache::default();
    cache.set(&test_pod(), random_status("1"));
    cache.tick();
    // The sync task recorded version 1 as written.
    cache.entry.as_mut().unwrap().at = None;
    let second = cache.now;
    cache.set(&test_pod(), random_status("2"));
    cache.tick();
    cache.set(&test_pod(), random_status("3"));
    assert_eq!(cache.entry.as_ref().unwrap().at, Some(second));
}

#[test]
fn r62_terminal_phase_is_kept_when_an_update_tries_to_leave_it() {
    let mut cache = Cache::default();
    cache.set(
        &test_pod(),
        PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        },
    );
    match cache.set(
        &test_pod(),
        PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        },
    ) {
        UpdateOutcome::Unchanged => {}
        other => panic!("a Running update over Failed only repeats Failed: {other:?}"),
    }
    assert_eq!(cache.status().phase.as_deref(), Some("Failed"));
    match cache.set(
        &test_pod(),
        PodStatus {
            phase: Some("Succeeded".into()),
            message: Some("x".into()),
            ..Default::default()
        },
    ) {
        UpdateOutcome::Accepted(a) => {
            assert_eq!(
                a.phase_regression_prevented,
                Some(("Failed".into(), "Succeeded".into()))
            );
            assert_eq!(a.entry.status.phase.as_deref(), Some("Failed"));
        }
        other => panic!("{other:?}"),
    }
}

fn probe_pod() -> Pod {
    let mut pod = test_pod();
    pod.spec = Some(spec_with(&[], &["c1", "c2"]));
    pod
}

fn probe_status() -> PodStatus {
    let mut c1 = status_named("c1");
    c1.container_id = Some("test://1".into());
    let mut c2 = status_named("c2");
    c2.container_id = Some("test://2".into());
    PodStatus {
        container_statuses: Some(vec![c1, c2]),
        conditions: Some(vec![PodCondition {
            ..cond("Ready", "False")
        }]),
        ..Default::default()
    }
}

fn changed(outcome: ProbeOutcome) -> PodStatus {
    match outcome {
        ProbeOutcome::Changed(s) => *s,
        other => panic!("expected a change, got {other:?}"),
    }
}

#[test]
fn test_set_container_readiness() {
    let gates = FeatureGates::default();
    let pod = probe_pod();
    let status = probe_status();
    assert_eq!(
        with_container_readiness(&pod, &status, "test://1", false, &gates),
        ProbeOutcome::Unchanged
    );
    let s1 = changed(with_container_readiness(
        &pod, &status, "test://1", true, &gates,
    ));
    let ready = crate::pod::condition(&s1, "Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert_eq!(
        ready.message.as_deref(),
        Some("containers with unready status: [c2]")
    );
    assert_eq!(
        crate::pod::condition(&s1, "ContainersReady")
            .unwrap()
            .status,
        "False",
        "appended"
    );
    let s2 = changed(with_container_readiness(
        &pod, &s1, "test://2", true, &gates,
    ));
    assert_eq!(crate::pod::condition(&s2, "Ready").unwrap().status, "True");
    assert_eq!(
        crate::pod::condition(&s2, "ContainersReady")
            .unwrap()
            .status,
        "True"
    );
    assert_eq!(
        with_container_readiness(&pod, &s2, "test://foo", true, &gates),
        ProbeOutcome::ContainerNotFound
    );
}

#[test]
fn test_set_container_startup() {
    let status = probe_status();
    let s1 = changed(with_container_startup(&status, "test://1", false));
    assert_eq!(
        s1.container_statuses.as_ref().unwrap()[0].started,
        Some(false),
        "nil -> false is a change"
    );
    assert_eq!(
        with_container_startup(&s1, "test://1", false),
        ProbeOutcome::Unchanged
    );
    let s2 = changed(with_container_startup(&s1, "test://1", true));
    let s3 = changed(with_container_startup(&s2, "test://2", true));
    assert_eq!(
        s3.container_statuses.as_ref().unwrap()[1].started,
        Some(true)
    );
    assert_eq!(
        with_container_startup(&s3, "test://foo", true),
        ProbeOutcome::ContainerNotFound
    );
}

#[test]
fn r16_init_statuses_are_searched_after_regular_and_empty_ids_never_match() {
    let mut status = probe_status();
    let mut init = status_named("i");
    init.container_id = Some("test://i".into());
    status.init_container_statuses = Some(vec![init]);
    let s = changed(with_container_startup(&status, "test://i", true));
    assert_eq!(s.init_container_statuses.unwrap()[0].started, Some(true));
    assert_eq!(
        with_container_startup(
            &PodStatus {
                container_statuses: Some(vec![status_named("x")]),
                ..Default::default()
            },
            "",
            true
        ),
        ProbeOutcome::ContainerNotFound
    );
}

#[test]
fn test_container_termination_metric() {
    use crate::update::{ContainerKind, NewlyTerminated};
    let mut cache = Cache::default();
    let pod = test_pod();
    cache.set(
        &pod,
        PodStatus {
            container_statuses: Some(vec![status_in("container", running())]),
            ..Default::default()
        },
    );
    let mut done = status_in("container", terminated(0));
    done.state
        .as_mut()
        .unwrap()
        .terminated
        .as_mut()
        .unwrap()
        .reason = Some("Completed".into());
    let outcome = cache.set(
        &pod,
        PodStatus {
            phase: Some("Succeeded".into()),
            container_statuses: Some(vec![done.clone()]),
            ..Default::default()
        },
    );
    let UpdateOutcome::Accepted(a) = outcome else {
        panic!("accepted")
    };
    assert_eq!(
        a.newly_terminated,
        [NewlyTerminated {
            kind: ContainerKind::Regular,
            name: "container".into(),
            exit_code: 0,
            reason: "Completed".into()
        }]
    );
    // Already terminated: not counted again.
    let UpdateOutcome::Accepted(a) = cache.terminate_outcome(&pod) else {
        panic!("accepted")
    };
    assert!(a.newly_terminated.is_empty());
}
