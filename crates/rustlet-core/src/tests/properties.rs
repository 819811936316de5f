//! Property tests for what upstream only spot-checks: normalisation is idempotent, equality is
//! symmetric and blind to container order, merge never drops a foreign condition, and a
//! terminal phase never goes back.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;

use crate::equality::is_pod_status_by_kubelet_equal;
use crate::features::FeatureGates;
use crate::merge::{MergeContext, merge_pod_status};
use crate::normalize::normalize_status;
use crate::pod::PodPhase;
use crate::testutil::*;
use crate::update::{UpdateContext, UpdateOutcome, UpdateSource, prepare_update};

fn phase() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        Just(Some("Pending".to_owned())),
        Just(Some("Running".to_owned())),
        Just(Some("Succeeded".to_owned())),
        Just(Some("Failed".to_owned())),
        Just(Some("Unknown".to_owned())),
    ]
}

fn time() -> impl Strategy<Value = Option<Time>> {
    prop_oneof![
        Just(None),
        (0i64..4_000_000_000, 0i32..1_000_000_000)
            .prop_map(|(s, n)| Some(Time(Timestamp::new(s, n).unwrap()))),
    ]
}

fn condition() -> impl Strategy<Value = PodCondition> {
    (
        prop_oneof![
            Just("Ready"),
            Just("ContainersReady"),
            Just("Initialized"),
            Just("PodScheduled"),
            Just("DisruptionTarget"),
            Just("example.com/gate"),
            Just("other.io/x"),
        ],
        prop_oneof![Just("True"), Just("False"), Just("Unknown")],
        time(),
    )
        .prop_map(|(t, s, at)| PodCondition {
            last_transition_time: at,
            ..cond(t, s)
        })
}

fn container_status(name: String) -> impl Strategy<Value = ContainerStatus> {
    (any::<bool>(), time(), ".{0,40}", prop::option::of(0i32..3)).prop_map(
        move |(ready, started, message, exit)| ContainerStatus {
            name: name.clone(),
            ready,
            state: Some(match exit {
                Some(exit_code) => ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code,
                        message: Some(message),
                        started_at: started,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                None => running(),
            }),
            ..Default::default()
        },
    )
}

fn statuses(prefix: &'static str) -> impl Strategy<Value = Vec<ContainerStatus>> {
    prop::collection::btree_set(0u8..20, 0..6).prop_flat_map(move |ids| {
        ids.into_iter()
            .map(|i| container_status(format!("{prefix}{i}")))
            .collect::<Vec<_>>()
    })
}

prop_compose! {
    fn pod_status()(
        phase in phase(),
        conditions in prop::collection::vec(condition(), 0..6),
        containers in statuses("c"),
        init in statuses("i"),
        start in time(),
        message in prop::option::of(".{0,10}"),
    ) -> PodStatus {
        PodStatus {
            phase,
            conditions: Some(conditions),
            container_statuses: Some(containers),
            init_container_statuses: Some(init),
            start_time: start,
            message,
            ..Default::default()
        }
    }
}

fn small_spec() -> k8s_openapi::api::core::v1::PodSpec {
    spec_with(&["i1", "i5", "i3"], &["c1", "c2"])
}

proptest! {
    #[test]
    fn normalisation_is_idempotent(mut status in pod_status()) {
        let spec = small_spec();
        normalize_status(Some(&spec), &mut status);
        let once = status.clone();
        normalize_status(Some(&spec), &mut status);
        prop_assert_eq!(once, status);
    }

    #[test]
    fn equality_is_symmetric(a in pod_status(), b in pod_status()) {
        let gates = FeatureGates::default();
        prop_assert_eq!(
            is_pod_status_by_kubelet_equal(&a, &b, &gates),
            is_pod_status_by_kubelet_equal(&b, &a, &gates)
        );
        prop_assert!(is_pod_status_by_kubelet_equal(&a, &a, &gates));
    }

    #[test]
    fn equality_ignores_container_order_after_normalisation(status in pod_status(), seed in any::<u64>()) {
        let spec = small_spec();
        let mut shuffled = status.clone();
        if let Some(list) = &mut shuffled.container_statuses {
            let len = list.len().max(1);
            list.rotate_left((seed as usize) % len);
            list.reverse();
        }
        let (mut a, mut b) = (status, shuffled);
        normalize_status(Some(&spec), &mut a);
        normalize_status(Some(&spec), &mut b);
        prop_assert!(is_pod_status_by_kubelet_equal(&a, &b, &FeatureGates::default()));
    }

    #[test]
    fn merge_never_drops_or_rewrites_a_foreign_condition(
        api in pod_status(),
        local in pod_status(),
        running in any::<bool>(),
    ) {
        let gates = FeatureGates::default();
        let pod = Pod::default();
        let ctx = MergeContext { pod: &pod, could_have_running_containers: running, now: ts("2026-01-01T00:00:00Z"), gates: &gates };
        let merged = merge_pod_status(&api, &local, ctx);
        let merged_conditions = merged.conditions.unwrap_or_default();
        for foreign in api.conditions.iter().flatten().filter(|c| c.type_.contains('/')) {
            prop_assert!(merged_conditions.contains(foreign), "lost {:?}", foreign);
        }
        for c in merged_conditions.iter().filter(|c| c.type_.contains('/')) {
            prop_assert!(api.conditions.iter().flatten().any(|a| a == c), "local foreign condition written: {:?}", c);
        }
    }

    #[test]
    fn merge_never_moves_a_terminal_api_phase(api in pod_status(), local in pod_status(), running in any::<bool>()) {
        let gates = FeatureGates::default();
        let pod = Pod::default();
        let ctx = MergeContext { pod: &pod, could_have_running_containers: running, now: ts("2026-01-01T00:00:00Z"), gates: &gates };
        let merged = merge_pod_status(&api, &local, ctx);
        if PodPhase::of(&api).is_terminal() {
            prop_assert_eq!(&merged.phase, &api.phase);
        }
        if PodPhase::of(&merged).is_terminal() {
            prop_assert!(!crate::pod::is_condition_true(&merged, "Ready"));
            prop_assert!(!crate::pod::is_condition_true(&merged, "ContainersReady"));
        }
    }

    #[test]
    fn a_terminal_phase_never_goes_back(updates in prop::collection::vec(pod_status(), 1..8)) {
        let gates = FeatureGates::default();
        let mut pod = test_pod();
        pod.spec = Some(small_spec());
        let mut cached = None;
        let mut terminal: Option<String> = None;
        for (i, status) in updates.into_iter().enumerate() {
            let ctx = UpdateContext { cached: cached.as_ref(), mirror_status: None, now: Timestamp::new(1_000_000 + i as i64, 0).unwrap(), gates: &gates };
            if let UpdateOutcome::Accepted(a) = prepare_update(&pod, status, UpdateSource::SetPodStatus, ctx) {
                cached = Some(a.entry);
            }
            let phase = cached.as_ref().map(|c| PodPhase::of(&c.status));
            if let (Some(t), Some(p)) = (&terminal, &phase) {
                prop_assert_eq!(t.as_str(), p.as_str());
            }
            if terminal.is_none() && phase.as_ref().is_some_and(PodPhase::is_terminal) {
                terminal = phase.map(|p| p.as_str().to_owned());
            }
        }
    }
}
