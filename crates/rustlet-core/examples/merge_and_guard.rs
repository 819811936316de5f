//! rustlet-core as a library: merge a status update with conditions another component owns,
//! and watch the terminal-phase guard refuse a regression.
//!
//! Run with `cargo run -p rustlet-core --example merge_and_guard`. No cluster, no clock, no
//! I/O: every rule is a pure function and "now" is an argument.

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rustlet_core::{
    FeatureGates, MergeContext, Timestamp, UpdateContext, UpdateOutcome, UpdateSource,
    merge_pod_status, prepare_update,
};

fn condition(type_: &str, status: &str) -> PodCondition {
    PodCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        ..PodCondition::default()
    }
}

fn status(phase: &str, conditions: Vec<PodCondition>) -> PodStatus {
    PodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(conditions),
        ..PodStatus::default()
    }
}

fn main() {
    let gates = FeatureGates::default();
    let now = Timestamp::from_second(1_700_000_000).expect("a valid timestamp");
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("web".to_owned()),
            namespace: Some("default".to_owned()),
            uid: Some("6f0c1b7e-0000-4000-8000-000000000001".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec::default()),
        ..Pod::default()
    };

    // 1. The merge: the API holds a condition a controller owns ("example.com/Healthy"); the
    //    node's status has its own Ready condition. The merge keeps the foreign condition and
    //    takes the node's own ones from the local status.
    let api = status(
        "Pending",
        vec![
            condition("example.com/Healthy", "True"),
            condition("Ready", "False"),
        ],
    );
    let local = status("Running", vec![condition("Ready", "True")]);
    let merged = merge_pod_status(
        &api,
        &local,
        MergeContext {
            pod: &pod,
            could_have_running_containers: true,
            now,
            gates: &gates,
        },
    );
    println!("merged phase: {}", merged.phase.as_deref().unwrap_or("-"));
    for c in merged.conditions.iter().flatten() {
        println!("merged condition: {} = {}", c.type_, c.status);
    }
    let kept_foreign = merged
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "example.com/Healthy" && c.status == "True");
    assert!(kept_foreign, "the foreign condition is never dropped");

    // 2. The guard: a pod that Succeeded is cached; an update saying Running (with a message,
    //    so that it differs in more than its phase) is accepted as a new version, but its
    //    phase stays Succeeded and the attempt is reported. (Had it differed in its phase
    //    alone, the outcome would be `Unchanged`: nothing to store.)
    let first = prepare_update(
        &pod,
        status("Succeeded", vec![]),
        UpdateSource::SetPodStatus,
        UpdateContext {
            cached: None,
            mirror_status: None,
            now,
            gates: &gates,
        },
    );
    let cached = first
        .accepted()
        .expect("the first update is accepted")
        .clone();
    println!(
        "cached: version {} phase {}",
        cached.version,
        cached.status.phase.as_deref().unwrap_or("-")
    );

    let mut running = status("Running", vec![]);
    running.message = Some("restarted?".to_owned());
    let regression = prepare_update(
        &pod,
        running,
        UpdateSource::SetPodStatus,
        UpdateContext {
            cached: Some(&cached),
            mirror_status: None,
            now,
            gates: &gates,
        },
    );
    match regression {
        UpdateOutcome::Accepted(accepted) => {
            let (kept, attempted) = accepted
                .phase_regression_prevented
                .expect("the guard reports the attempt");
            println!("guard: kept {kept}, refused {attempted}");
            assert_eq!(accepted.entry.status.phase.as_deref(), Some("Succeeded"));
        }
        other => panic!("expected the update accepted with its phase kept, got {other:?}"),
    }
}
