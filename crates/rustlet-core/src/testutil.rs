//! Fixture builders shared by this crate's tests and, behind the `test-util` feature, by the
//! tests of crates above it. Upstream: the helpers at the top of `status_manager_test.go`.

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// Parses an RFC 3339 timestamp; panics on a typo in a test.
pub fn ts(s: &str) -> Timestamp {
    s.parse().expect("valid RFC 3339 timestamp in a test")
}

/// Upstream `getTestPod()`: pod `new/foo`, UID `12345678`.
pub fn test_pod() -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("foo".into()),
            namespace: Some("new".into()),
            uid: Some("12345678".into()),
            ..Default::default()
        },
        spec: Some(PodSpec::default()),
        status: Some(PodStatus::default()),
    }
}

/// A spec with these init and regular containers.
pub fn spec_with(init: &[&str], containers: &[&str]) -> PodSpec {
    let mk = |n: &&str| Container {
        name: (*n).to_owned(),
        ..Default::default()
    };
    PodSpec {
        init_containers: (!init.is_empty()).then(|| init.iter().map(mk).collect()),
        containers: containers.iter().map(mk).collect(),
        ..Default::default()
    }
}

/// A container status with a name and nothing else.
pub fn status_named(name: &str) -> ContainerStatus {
    ContainerStatus {
        name: name.to_owned(),
        ..Default::default()
    }
}

/// A container status in the given state.
pub fn status_in(name: &str, state: ContainerState) -> ContainerStatus {
    ContainerStatus {
        name: name.to_owned(),
        state: Some(state),
        ..Default::default()
    }
}

/// `state.waiting`.
pub fn waiting() -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting::default()),
        ..Default::default()
    }
}

/// `state.running`.
pub fn running() -> ContainerState {
    ContainerState {
        running: Some(ContainerStateRunning::default()),
        ..Default::default()
    }
}

/// `state.terminated` with an exit code.
pub fn terminated(exit_code: i32) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Names of a status list, in order.
pub fn names(statuses: &Option<Vec<ContainerStatus>>) -> Vec<String> {
    statuses.iter().flatten().map(|s| s.name.clone()).collect()
}

/// A condition with a type and status.
pub fn cond(type_: &str, status: &str) -> PodCondition {
    PodCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        ..Default::default()
    }
}

/// A condition with a reason.
pub fn cond_reason(type_: &str, status: &str, reason: &str) -> PodCondition {
    PodCondition {
        reason: Some(reason.to_owned()),
        ..cond(type_, status)
    }
}

/// A condition with a transition time.
pub fn condition_at(type_: &str, status: &str, at: Timestamp) -> PodCondition {
    PodCondition {
        last_transition_time: Some(Time(at)),
        ..cond(type_, status)
    }
}
