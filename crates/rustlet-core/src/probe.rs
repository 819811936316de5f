//! The pure part of `SetContainerReadiness` and `SetContainerStartup` (R15-R18).

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};

use crate::features::FeatureGates;
use crate::generate::{GenerateContext, containers_ready_condition, pod_ready_condition};
use crate::merge::replace_or_append_condition;
use crate::pod::PodPhase;

/// What a probe result does to a cached status.
#[derive(Clone, Debug, PartialEq)]
pub enum ProbeOutcome {
    /// The new status to hand to `prepare_update` with the probe source.
    Changed(Box<PodStatus>),
    /// The container already reports this value.
    Unchanged,
    /// No regular or init status has this container ID (R16).
    ContainerNotFound,
}

/// R16: by exact `containerID` match, regular statuses first, then init; never ephemeral.
fn find_container<'a>(
    status: &'a mut PodStatus,
    container_id: &str,
) -> Option<&'a mut ContainerStatus> {
    if container_id.is_empty() {
        return None;
    }
    let matches = |s: &&mut ContainerStatus| s.container_id.as_deref() == Some(container_id);
    let PodStatus {
        container_statuses,
        init_container_statuses,
        ..
    } = status;
    container_statuses
        .iter_mut()
        .flatten()
        .find(matches)
        .or_else(|| init_container_statuses.iter_mut().flatten().find(matches))
}

/// R17: sets one container's `ready` and regenerates `Ready` and `ContainersReady` from the
/// init and regular statuses.
pub fn with_container_readiness(
    pod: &Pod,
    cached: &PodStatus,
    container_id: &str,
    ready: bool,
    gates: &FeatureGates,
) -> ProbeOutcome {
    let mut status = cached.clone();
    let Some(container) = find_container(&mut status, container_id) else {
        return ProbeOutcome::ContainerNotFound;
    };
    if container.ready == ready {
        return ProbeOutcome::Unchanged;
    }
    container.ready = ready;

    let all: Vec<ContainerStatus> = status
        .init_container_statuses
        .iter()
        .chain(&status.container_statuses)
        .flatten()
        .cloned()
        .collect();
    let phase = PodPhase::of(&status);
    let ctx = GenerateContext {
        pod,
        old_status: cached,
        gates,
    };
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let ready_condition = pod_ready_condition(&ctx, conditions, Some(&all), &phase);
    let containers_ready = containers_ready_condition(&ctx, Some(&all), &phase);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    replace_or_append_condition(conditions, ready_condition);
    replace_or_append_condition(conditions, containers_ready);
    ProbeOutcome::Changed(Box::new(status))
}

/// R18: sets one container's `started`; unset to false is a change.
pub fn with_container_startup(
    cached: &PodStatus,
    container_id: &str,
    started: bool,
) -> ProbeOutcome {
    let mut status = cached.clone();
    let Some(container) = find_container(&mut status, container_id) else {
        return ProbeOutcome::ContainerNotFound;
    };
    if container.started == Some(started) {
        return ProbeOutcome::Unchanged;
    }
    container.started = Some(started);
    ProbeOutcome::Changed(Box::new(status))
}
