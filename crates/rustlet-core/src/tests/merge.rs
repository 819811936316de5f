//! Upstream `TestMergePodStatus` and the rules R41-R46.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::features::FeatureGates;
use crate::merge::{MergeContext, merge_pod_status};
use crate::testutil::*;

fn base_status() -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        message: Some("Message".into()),
        conditions: Some(vec![cond("Ready", "True"), cond("PodScheduled", "True")]),
        ..Default::default()
    }
}

fn merge(api: &PodStatus, local: &PodStatus, running: bool) -> PodStatus {
    let gates = FeatureGates::default();
    let pod = Pod::default();
    let ctx = MergeContext {
        pod: &pod,
        could_have_running_containers: running,
        now: ts("2026-01-01T00:00:00Z"),
        gates: &gates,
    };
    merge_pod_status(api, local, ctx)
}

type CondKey = (String, String, String);

fn keys(conditions: &[PodCondition]) -> BTreeSet<CondKey> {
    conditions
        .iter()
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn expect(status: &PodStatus, phase: &str, conditions: &[(&str, &str, &str)]) {
    assert_eq!(status.phase.as_deref(), Some(phase));
    let want: BTreeSet<CondKey> = conditions
        .iter()
        .map(|(t, s, r)| ((*t).to_owned(), (*s).to_owned(), (*r).to_owned()))
        .collect();
    assert_eq!(keys(status.conditions.as_deref().unwrap_or_default()), want);
}

fn with(mut status: PodStatus, phase: Option<&str>, extra: &[PodCondition]) -> PodStatus {
    if let Some(phase) = phase {
        status.phase = Some(phase.into());
    }
    status
        .conditions
        .get_or_insert_with(Vec::new)
        .extend_from_slice(extra);
    status
}

fn disruption(reason: &str) -> PodCondition {
    cond_reason("DisruptionTarget", "True", reason)
}

#[test]
fn test_merge_pod_status_no_change() {
    let merged = merge(&base_status(), &base_status(), false);
    expect(
        &merged,
        "Running",
        &[("Ready", "True", ""), ("PodScheduled", "True", "")],
    );
}

#[test]
fn test_merge_pod_status_add_disruption_target_when_terminal_and_no_running_containers() {
    let local = with(
        base_status(),
        Some("Failed"),
        &[disruption("TerminationByKubelet")],
    );
    let merged = merge(&base_status(), &local, false);
    expect(
        &merged,
        "Failed",
        &[
            ("DisruptionTarget", "True", "TerminationByKubelet"),
            ("Ready", "False", "PodFailed"),
            ("ContainersReady", "False", "PodFailed"),
            ("PodScheduled", "True", ""),
        ],
    );
}

#[test]
fn test_merge_pod_status_delay_terminal_while_containers_run() {
    let local = with(
        base_status(),
        Some("Failed"),
        &[disruption("TerminationByKubelet")],
    );
    let merged = merge(&base_status(), &local, true);
    expect(
        &merged,
        "Running",
        &[("Ready", "True", ""), ("PodScheduled", "True", "")],
    );
}

#[test]
fn test_merge_pod_status_api_disruption_target_preserved() {
    let api = with(base_status(), None, &[disruption("TerminationByKubelet")]);
    let merged = merge(&api, &base_status(), false);
    expect(
        &merged,
        "Running",
        &[
            ("DisruptionTarget", "True", "TerminationByKubelet"),
            ("Ready", "True", ""),
            ("PodScheduled", "True", ""),
        ],
    );
}

#[test]
fn test_merge_pod_status_api_disruption_target_replaced_on_terminal() {
    let api = with(base_status(), None, &[disruption("EvictedByEvictionAPI")]);
    let local = with(
        base_status(),
        Some("Failed"),
        &[disruption("TerminationByKubelet")],
    );
    let merged = merge(&api, &local, false);
    expect(
        &merged,
        "Failed",
        &[
            ("DisruptionTarget", "True", "TerminationByKubelet"),
            ("Ready", "False", "PodFailed"),
            ("ContainersReady", "False", "PodFailed"),
            ("PodScheduled", "True", ""),
        ],
    );
}

#[test]
fn test_merge_pod_status_api_disruption_target_kept_when_local_not_terminal() {
    let api = with(base_status(), None, &[disruption("EvictedByEvictionAPI")]);
    let local = with(base_status(), None, &[disruption("TerminationByKubelet")]);
    let merged = merge(&api, &local, false);
    expect(
        &merged,
        "Running",
        &[
            ("DisruptionTarget", "True", "EvictedByEvictionAPI"),
            ("Ready", "True", ""),
            ("PodScheduled", "True", ""),
        ],
    );
}

#[test]
fn test_merge_pod_status_api_disruption_target_kept_while_containers_run() {
    let api = with(base_status(), None, &[disruption("EvictedByEvictionAPI")]);
    let local = with(
        base_status(),
        Some("Failed"),
        &[disruption("TerminationByKubelet")],
    );
    let merged = merge(&api, &local, true);
    expect(
        &merged,
        "Running",
        &[
            ("DisruptionTarget", "True", "EvictedByEvictionAPI"),
            ("Ready", "True", ""),
            ("PodScheduled", "True", ""),
        ],
    );
}

#[test]
fn test_merge_pod_status_readiness_changes() {
    let local = PodStatus {
        conditions: Some(vec![cond("Ready", "False"), cond("PodScheduled", "True")]),
        ..base_status()
    };
    let merged = merge(&base_status(), &local, false);
    expect(
        &merged,
        "Running",
        &[("Ready", "False", ""), ("PodScheduled", "True", "")],
    );
}

#[test]
fn test_merge_pod_status_additional_conditions_kept() {
    let api = with(base_status(), None, &[cond("example.com/feature", "True")]);
    let merged = merge(&api, &base_status(), false);
    expect(
        &merged,
        "Running",
        &[
            ("example.com/feature", "True", ""),
            ("Ready", "True", ""),
            ("PodScheduled", "True", ""),
        ],
    );
    let local = PodStatus {
        conditions: Some(vec![cond("Ready", "False"), cond("PodScheduled", "True")]),
        ..base_status()
    };
    let merged = merge(&api, &local, false);
    expect(
        &merged,
        "Running",
        &[
            ("example.com/feature", "True", ""),
            ("Ready", "False", ""),
            ("PodScheduled", "True", ""),
        ],
    );
}

#[test]
fn test_merge_pod_status_local_foreign_condition_ignored() {
    let api = with(base_status(), None, &[cond("example.com/feature", "True")]);
    let local = with(base_status(), None, &[cond("example.com/feature", "False")]);
    let merged = merge(&api, &local, false);
    expect(
        &merged,
        "Running",
        &[
            ("example.com/feature", "True", ""),
            ("Ready", "True", ""),
            ("PodScheduled", "True", ""),
        ],
    );
}

fn evicted_local() -> PodStatus {
    PodStatus {
        phase: Some("Failed".into()),
        reason: Some("Evicted".into()),
        message: Some("Was Evicted".into()),
        ..base_status()
    }
}

#[test]
fn test_merge_pod_status_phase_reason_message_on_terminal() {
    let api = PodStatus {
        reason: Some("Unknown".into()),
        ..base_status()
    };
    let merged = merge(&api, &evicted_local(), false);
    expect(
        &merged,
        "Failed",
        &[
            ("Ready", "False", "PodFailed"),
            ("ContainersReady", "False", "PodFailed"),
            ("PodScheduled", "True", ""),
        ],
    );
    assert_eq!(merged.reason.as_deref(), Some("Evicted"));
    assert_eq!(merged.message.as_deref(), Some("Was Evicted"));
}

#[test]
fn test_merge_pod_status_phase_reason_message_delayed_while_running() {
    let api = PodStatus {
        reason: Some("Unknown".into()),
        ..base_status()
    };
    let merged = merge(&api, &evicted_local(), true);
    expect(
        &merged,
        "Running",
        &[("Ready", "True", ""), ("PodScheduled", "True", "")],
    );
    assert_eq!(merged.reason.as_deref(), Some("Unknown"));
    assert_eq!(merged.message.as_deref(), Some("Message"));
}

#[test]
fn r41_order_api_foreign_first_then_local_owned() {
    let api = PodStatus {
        conditions: Some(vec![
            cond("Ready", "False"),
            cond("x/a", "True"),
            cond("x/b", "True"),
        ]),
        ..Default::default()
    };
    let local = PodStatus {
        conditions: Some(vec![cond("PodScheduled", "True"), cond("Ready", "True")]),
        ..Default::default()
    };
    let merged = merge(&api, &local, false);
    let order: Vec<&str> = merged
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(order, ["x/a", "x/b", "PodScheduled", "Ready"]);
}

#[test]
fn errata5_local_disruption_target_goes_where_the_loop_is() {
    let api = PodStatus {
        phase: Some("Running".into()),
        ..Default::default()
    };
    let local = PodStatus {
        phase: Some("Failed".into()),
        conditions: Some(vec![
            cond("PodScheduled", "True"),
            disruption("X"),
            cond("Initialized", "True"),
        ]),
        ..Default::default()
    };
    let merged = merge(&api, &local, false);
    let order: Vec<&str> = merged
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(order, ["PodScheduled", "DisruptionTarget", "Initialized"]);
}

#[test]
fn r42_disruption_target_transition_time_recomputed_against_the_api() {
    let old = ts("2025-01-01T00:00:00Z");
    let api = PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![condition_at("DisruptionTarget", "True", old)]),
        ..Default::default()
    };
    let local = PodStatus {
        phase: Some("Failed".into()),
        conditions: Some(vec![condition_at(
            "DisruptionTarget",
            "True",
            ts("2026-01-01T00:00:00Z"),
        )]),
        ..Default::default()
    };
    let merged = merge(&api, &local, false);
    assert_eq!(
        merged.conditions.unwrap()[0].last_transition_time,
        Some(Time(old))
    );
}

#[test]
fn r43_dra_fields_and_volume_health_come_from_the_api() {
    use k8s_openapi::api::core::v1::{PodResourceClaimStatus, PodVolumeHealth};
    let api = PodStatus {
        resource_claim_statuses: Some(vec![PodResourceClaimStatus {
            name: "api".into(),
            ..Default::default()
        }]),
        volume_health: Some(vec![PodVolumeHealth::default()]),
        ..Default::default()
    };
    let local = PodStatus {
        resource_claim_statuses: Some(vec![PodResourceClaimStatus {
            name: "local".into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let merged = merge(&api, &local, false);
    assert_eq!(merged.resource_claim_statuses, api.resource_claim_statuses);
    assert_eq!(merged.volume_health, api.volume_health);
}

#[test]
fn errata4_terminal_rewrites_ready_whole_and_keeps_false_transition_time() {
    let old = ts("2025-01-01T00:00:00Z");
    let now = ts("2026-01-01T00:00:00Z");
    let local = PodStatus {
        phase: Some("Succeeded".into()),
        conditions: Some(vec![
            PodCondition {
                message: Some("m".into()),
                ..condition_at("Ready", "True", old)
            },
            condition_at("ContainersReady", "False", old),
        ]),
        ..Default::default()
    };
    let merged = merge(
        &PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        },
        &local,
        false,
    );
    let c = merged.conditions.unwrap();
    assert_eq!(
        (c[0].type_.as_str(), c[0].status.as_str()),
        ("Ready", "False")
    );
    assert_eq!(c[0].reason.as_deref(), Some("PodCompleted"));
    assert_eq!(c[0].message, None, "replaced whole");
    assert_eq!(c[0].last_transition_time, Some(Time(now)));
    assert_eq!(c[1].reason.as_deref(), Some("PodCompleted"));
    assert_eq!(
        c[1].last_transition_time,
        Some(Time(old)),
        "already False keeps its time"
    );
}

#[test]
fn lesson8_terminal_api_phase_is_never_replaced() {
    let api = PodStatus {
        phase: Some("Failed".into()),
        reason: Some("Evicted".into()),
        ..Default::default()
    };
    let local = PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    };
    let merged = merge(&api, &local, false);
    assert_eq!(merged.phase.as_deref(), Some("Failed"));
    assert_eq!(merged.reason.as_deref(), Some("Evicted"));
    let local = PodStatus {
        phase: Some("Running".into()),
        ..Default::default()
    };
    assert_eq!(merge(&api, &local, false).phase.as_deref(), Some("Failed"));
}
