//! The terminate-pod transformation (R19-R23): the last status of a pod whose containers are
//! gone. Upstream: `TerminatePod`, `hasPodInitialized`, `initializedContainers`.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus,
};

use crate::pod::{PodPhase, is_restartable_init_container, is_static_pod};

/// Reason given to a container that could not be found when its pod terminated.
pub const CONTAINER_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";
/// Message given to such a container.
pub const CONTAINER_NOT_LOCATED: &str =
    "The container could not be located when the pod was terminated";
/// Exit code given to such a container (128 + SIGKILL).
pub const UNKNOWN_EXIT_CODE: i32 = 137;

fn unknown_terminated_state() -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            reason: Some(CONTAINER_STATUS_UNKNOWN.to_owned()),
            message: Some(CONTAINER_NOT_LOCATED.to_owned()),
            exit_code: UNKNOWN_EXIT_CODE,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn is_waiting(status: &ContainerStatus) -> bool {
    status.state.as_ref().is_some_and(|s| s.waiting.is_some())
}

fn is_terminated(status: &ContainerStatus) -> bool {
    status
        .state
        .as_ref()
        .is_some_and(|s| s.terminated.is_some())
}

fn last_terminated(status: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    status.last_state.as_ref()?.terminated.as_ref()
}

/// R22: upstream `hasPodInitialized`, evaluated on the pod argument's own status.
pub fn has_pod_initialized(pod: &Pod) -> bool {
    let init_specs = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    if init_specs.is_empty() {
        return true;
    }
    let empty = PodStatus::default();
    let status = pod.status.as_ref().unwrap_or(&empty);
    if status
        .container_statuses
        .iter()
        .flatten()
        .any(|s| last_terminated(s).is_some() || !is_waiting(s))
    {
        return true;
    }
    let init_statuses = status
        .init_container_statuses
        .as_deref()
        .unwrap_or_default();
    let Some(last) = init_statuses.last() else {
        return false;
    };
    let index = init_statuses.len() - 1;
    let Some(spec) = init_specs.get(index).filter(|c| c.name == last.name) else {
        return false;
    };
    if is_restartable_init_container(spec) {
        return last.state.as_ref().is_some_and(|s| s.running.is_some())
            && last.started == Some(true);
    }
    last_terminated(last).is_some_and(|t| t.exit_code == 0)
        || last
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)
}

/// R21: upstream `initializedContainers`: how many leading init statuses attempted to start
/// (all but a trailing run of Waiting ones; at least the first).
pub fn attempted_init_containers(statuses: &[ContainerStatus]) -> usize {
    match statuses
        .iter()
        .rposition(|s| !is_waiting(s) || last_terminated(s).is_some())
    {
        Some(i) => i + 1,
        None => statuses.len().min(1),
    }
}

/// R19-R23: the status `TerminatePod` stores (before R1-R12 run on it with the terminate source).
pub fn terminate_status(pod: &Pod, cached: Option<&PodStatus>) -> PodStatus {
    let mut status = cached.or(pod.status.as_ref()).cloned().unwrap_or_default();

    if has_pod_initialized(pod) {
        for container in status.container_statuses.iter_mut().flatten() {
            if !is_terminated(container) {
                container.state = Some(unknown_terminated_state());
            }
        }
    }

    if let Some(init) = &mut status.init_container_statuses {
        let attempted = attempted_init_containers(init);
        for container in &mut init[..attempted] {
            if !is_terminated(container) {
                container.state = Some(unknown_terminated_state());
            }
        }
    }

    if !is_static_pod(pod) && !PodPhase::of(&status).is_terminal() {
        status.phase = Some(PodPhase::Failed.as_str().to_owned());
    }
    status
}
