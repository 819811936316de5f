//! `merge_pod_status` (R41-R46): what the kubelet sends, given what the API holds.
//!
//! Upstream: `mergePodStatus`, `ReplaceOrAppendPodCondition`, `podutil.UpdatePodCondition`.

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::features::FeatureGates;
use crate::generate::{
    GenerateContext, containers_ready_for_terminal_phase, pod_ready_for_terminal_phase,
};
use crate::pod::{
    PodPhase, condition_type, is_condition_true, pod_condition_by_kubelet,
    pod_condition_shared_by_kubelet,
};
use crate::transition::update_last_transition_time;

/// Inputs of [`merge_pod_status`] besides the two statuses.
#[derive(Clone, Copy, Debug)]
pub struct MergeContext<'a> {
    /// The API pod (its generation feeds generated conditions).
    pub pod: &'a Pod,
    /// `PodDeletionSafety::pod_could_have_running_containers` for that pod.
    pub could_have_running_containers: bool,
    /// The current time.
    pub now: Timestamp,
    /// Feature gates in force.
    pub gates: &'a FeatureGates,
}

/// Upstream `ReplaceOrAppendPodCondition`.
pub fn replace_or_append_condition(conditions: &mut Vec<PodCondition>, condition: PodCondition) {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(existing) => *existing = condition,
        None => conditions.push(condition),
    }
}

/// Upstream `podutil.UpdatePodCondition`: replaces the first condition of that type whole (or
/// appends), keeping the old transition time when the status did not change.
pub fn update_pod_condition(status: &mut PodStatus, mut condition: PodCondition, now: Timestamp) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    condition.last_transition_time = Some(Time(now));
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(existing) => {
            if existing.status == condition.status {
                condition.last_transition_time = existing.last_transition_time.clone();
            }
            *existing = condition;
        }
        None => conditions.push(condition),
    }
}

/// Merges the kubelet's `local` status onto the API's `api` status. Never mutates either.
///
/// * conditions: the API's non-kubelet-owned ones in API order, then the local owned ones in
///   local order; the local `DisruptionTarget` only with the move to a terminal phase (R41, R42);
/// * the DRA claim statuses and `volumeHealth` come from the API (R43);
/// * the move to a terminal phase waits while containers could run (R44);
/// * a terminal API phase is never replaced (defence in depth against #58711);
/// * a terminal result has Ready and ContainersReady False (R45);
/// * everything else is local (R46).
///
/// ```
/// use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
/// use rustlet_core::{FeatureGates, MergeContext, Timestamp, merge_pod_status};
///
/// let condition = |type_: &str| PodCondition {
///     type_: type_.into(),
///     status: "True".into(),
///     ..PodCondition::default()
/// };
/// // The API holds a condition a controller owns; the node sends its own.
/// let api = PodStatus { conditions: Some(vec![condition("example.com/Ready")]), ..PodStatus::default() };
/// let local = PodStatus { conditions: Some(vec![condition("Ready")]), ..PodStatus::default() };
/// let gates = FeatureGates::default();
/// let merged = merge_pod_status(&api, &local, MergeContext {
///     pod: &Pod::default(),
///     could_have_running_containers: true,
///     now: Timestamp::from_second(1_700_000_000).unwrap(),
///     gates: &gates,
/// });
/// let types: Vec<&str> = merged.conditions.iter().flatten().map(|c| c.type_.as_str()).collect();
/// assert_eq!(types, ["example.com/Ready", "Ready"]);
/// ```
pub fn merge_pod_status(api: &PodStatus, local: &PodStatus, ctx: MergeContext<'_>) -> PodStatus {
    let mut merged = local.clone();
    let api_phase = PodPhase::of(api);
    let local_phase = PodPhase::of(local);
    let transitioning_to_terminal = !api_phase.is_terminal() && local_phase.is_terminal();

    let api_conditions = api.conditions.as_deref().unwrap_or_default();
    let local_conditions = local.conditions.as_deref().unwrap_or_default();
    let mut conditions: Vec<PodCondition> =
        Vec::with_capacity(api_conditions.len() + local_conditions.len());
    conditions.extend(
        api_conditions
            .iter()
            .filter(|c| !pod_condition_by_kubelet(&c.type_, ctx.gates))
            .cloned(),
    );
    for condition in local_conditions {
        if pod_condition_by_kubelet(&condition.type_, ctx.gates) {
            conditions.push(condition.clone());
        } else if pod_condition_shared_by_kubelet(&condition.type_)
            && condition.type_ == condition_type::DISRUPTION_TARGET
            && transitioning_to_terminal
            && !ctx.could_have_running_containers
        {
            update_last_transition_time(&mut merged, api, &condition.type_, ctx.now);
            let refreshed = merged
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == condition.type_)
                .cloned();
            if let Some(refreshed) = refreshed {
                replace_or_append_condition(&mut conditions, refreshed);
            }
        }
    }
    merged.conditions = (!conditions.is_empty()).then_some(conditions);

    merged.resource_claim_statuses = api.resource_claim_statuses.clone();
    merged.extended_resource_claim_status = api.extended_resource_claim_status.clone();
    merged.node_allocatable_resource_claim_statuses =
        api.node_allocatable_resource_claim_statuses.clone();
    merged.volume_health = api.volume_health.clone();

    let keep_api_phase = (transitioning_to_terminal && ctx.could_have_running_containers)
        || (api_phase.is_terminal() && local_phase != api_phase);
    if keep_api_phase {
        merged.phase = api.phase.clone();
        merged.reason = api.reason.clone();
        merged.message = api.message.clone();
    }

    let phase = PodPhase::of(&merged);
    if phase.is_terminal()
        && (is_condition_true(&merged, condition_type::READY)
            || is_condition_true(&merged, condition_type::CONTAINERS_READY))
    {
        let gen_ctx = GenerateContext {
            pod: ctx.pod,
            old_status: api,
            gates: ctx.gates,
        };
        update_pod_condition(
            &mut merged,
            containers_ready_for_terminal_phase(&gen_ctx, &phase),
            ctx.now,
        );
        update_pod_condition(
            &mut merged,
            pod_ready_for_terminal_phase(&gen_ctx, &phase),
            ctx.now,
        );
    }
    merged
}
