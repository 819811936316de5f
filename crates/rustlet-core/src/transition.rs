//! Container state transitions (R6) and condition transition times (R7).
//!
//! Upstream: `checkContainerStateTransition`, `updateLastTransitionTime`; the restart rules
//! are [`crate::restart`]'s.

use k8s_openapi::api::core::v1::{Container, ContainerStatus, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::equality::text_eq;
use crate::features::FeatureGates;
use crate::pod::{condition_type, is_restartable_init_container};
use crate::restart::container_should_restart;

/// Why an update was refused: a container that ended may not come back (R6).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// A terminated regular container was reported as not terminated.
    #[error("terminated container {0} attempted illegal transition to non-terminated state")]
    ContainerRestarted(String),
    /// A terminated init container was reported as not terminated.
    #[error("terminated init container {0} attempted illegal transition to non-terminated state")]
    InitContainerRestarted(String),
    /// The init statuses do not line up with the spec's init containers by index and name.
    #[error("found mismatch between pod spec and status, container: {0}")]
    SpecMismatch(String),
}

fn is_terminated(status: &ContainerStatus) -> bool {
    status
        .state
        .as_ref()
        .is_some_and(|s| s.terminated.is_some())
}

fn terminated_exit_code(status: &ContainerStatus) -> Option<i32> {
    status
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

fn may_leave_terminated(
    old: &ContainerStatus,
    spec_container: Option<&Container>,
    spec: &PodSpec,
    gates: &FeatureGates,
) -> bool {
    let Some(exit_code) = terminated_exit_code(old) else {
        return true;
    };
    if exit_code != 0 && spec.restart_policy.as_deref() == Some("OnFailure") {
        return true;
    }
    gates.container_restart_rules
        && spec_container.is_some_and(|c| container_should_restart(c, spec, exit_code))
}

fn came_back(old: &ContainerStatus, new: &[ContainerStatus]) -> bool {
    new.iter()
        .any(|n| text_eq(&n.name, &old.name) && !is_terminated(n))
}

/// R6: refuses an update in which a terminated container is reported as not terminated,
/// unless a restart policy allows it. A status that disappears is not a transition.
pub fn check_container_state_transition(
    old: &PodStatus,
    new: &PodStatus,
    spec: &PodSpec,
    gates: &FeatureGates,
) -> Result<(), TransitionError> {
    if text_eq(spec.restart_policy.as_deref().unwrap_or_default(), "Always") {
        return Ok(());
    }
    let new_regular = new.container_statuses.as_deref().unwrap_or_default();
    for old_status in old.container_statuses.iter().flatten() {
        let spec_container = spec
            .containers
            .iter()
            .find(|c| text_eq(&c.name, &old_status.name));
        if !may_leave_terminated(old_status, spec_container, spec, gates)
            && came_back(old_status, new_regular)
        {
            return Err(TransitionError::ContainerRestarted(old_status.name.clone()));
        }
    }

    let spec_init = spec.init_containers.as_deref().unwrap_or_default();
    let new_init = new.init_container_statuses.as_deref().unwrap_or_default();
    for (index, old_status) in old.init_container_statuses.iter().flatten().enumerate() {
        let Some(container) = spec_init
            .get(index)
            .filter(|c| text_eq(&c.name, &old_status.name))
        else {
            return Err(TransitionError::SpecMismatch(old_status.name.clone()));
        };
        if is_restartable_init_container(container) {
            continue;
        }
        if !may_leave_terminated(old_status, Some(container), spec, gates)
            && came_back(old_status, new_init)
        {
            return Err(TransitionError::InitContainerRestarted(
                old_status.name.clone(),
            ));
        }
    }
    Ok(())
}

/// The condition types whose transition time the manager maintains (R7).
pub const TRANSITION_TIME_CONDITIONS: [&str; 7] = [
    condition_type::CONTAINERS_READY,
    condition_type::READY,
    condition_type::INITIALIZED,
    condition_type::POD_READY_TO_START_CONTAINERS,
    condition_type::POD_SCHEDULED,
    condition_type::DISRUPTION_TARGET,
    condition_type::ALL_CONTAINERS_RESTARTING,
];

/// Upstream `updateLastTransitionTime` for one type: the first condition of that type in `new`
/// keeps the old transition time when the old status has the same type with the same status
/// (even an unset one, errata 3), else gets `now`.
pub fn update_last_transition_time(
    new: &mut PodStatus,
    old: &PodStatus,
    type_: &str,
    now: Timestamp,
) {
    let Some(condition) = new
        .conditions
        .iter_mut()
        .flatten()
        .find(|c| text_eq(&c.type_, type_))
    else {
        return;
    };
    let old_condition = old
        .conditions
        .iter()
        .flatten()
        .find(|c| text_eq(&c.type_, type_));
    condition.last_transition_time = match old_condition {
        Some(o) if text_eq(&o.status, &condition.status) => o.last_transition_time.clone(),
        _ => Some(Time(now)),
    };
}

/// R7 over every maintained condition type.
pub fn update_last_transition_times(new: &mut PodStatus, old: &PodStatus, now: Timestamp) {
    for type_ in TRANSITION_TIME_CONDITIONS {
        update_last_transition_time(new, old, type_, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use k8s_openapi::api::core::v1::{ContainerRestartRule, ContainerRestartRuleOnExitCodes};

    fn gates() -> FeatureGates {
        FeatureGates::default()
    }

    fn regular(states: &[(&str, k8s_openapi::api::core::v1::ContainerState)]) -> PodStatus {
        PodStatus {
            container_statuses: Some(
                states
                    .iter()
                    .map(|(n, s)| status_in(n, s.clone()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn with_policy(policy: &str) -> PodSpec {
        PodSpec {
            restart_policy: Some(policy.into()),
            ..spec_with(&[], &["c"])
        }
    }

    #[test]
    fn r6_terminated_to_running_rejected_under_never() {
        let old = regular(&[("c", terminated(0))]);
        let new = regular(&[("c", running())]);
        let err = check_container_state_transition(&old, &new, &with_policy("Never"), &gates());
        assert_eq!(
            err.unwrap_err().to_string(),
            "terminated container c attempted illegal transition to non-terminated state"
        );
    }

    #[test]
    fn r6_always_allows_everything() {
        let old = regular(&[("c", terminated(0))]);
        let new = regular(&[("c", running())]);
        assert!(
            check_container_state_transition(&old, &new, &with_policy("Always"), &gates()).is_ok()
        );
    }

    #[test]
    fn r6_on_failure_allows_restart_after_a_failure_only() {
        let spec = with_policy("OnFailure");
        let new = regular(&[("c", running())]);
        let failed = regular(&[("c", terminated(1))]);
        assert!(check_container_state_transition(&failed, &new, &spec, &gates()).is_ok());
        let succeeded = regular(&[("c", terminated(0))]);
        assert!(check_container_state_transition(&succeeded, &new, &spec, &gates()).is_err());
    }

    #[test]
    fn r6_missing_status_is_not_a_transition() {
        let old = regular(&[("c", terminated(0))]);
        let new = regular(&[]);
        assert!(
            check_container_state_transition(&old, &new, &with_policy("Never"), &gates()).is_ok()
        );
    }

    #[test]
    fn errata1_unset_pod_policy_depends_on_container_restart_rules_gate() {
        let spec = spec_with(&[], &["c"]);
        let old = regular(&[("c", terminated(0))]);
        let new = regular(&[("c", running())]);
        assert!(check_container_state_transition(&old, &new, &spec, &gates()).is_ok());
        let off = FeatureGates {
            container_restart_rules: false,
            ..gates()
        };
        assert!(check_container_state_transition(&old, &new, &spec, &off).is_err());
    }

    #[test]
    fn r6_container_restart_rules_allow_a_matching_exit_code() {
        let mut spec = with_policy("Never");
        spec.containers[0].restart_policy = Some("Never".into());
        spec.containers[0].restart_policy_rules = Some(vec![ContainerRestartRule {
            action: "Restart".into(),
            exit_codes: Some(ContainerRestartRuleOnExitCodes {
                operator: "In".into(),
                values: Some(vec![42]),
            }),
        }]);
        let new = regular(&[("c", running())]);
        assert!(
            check_container_state_transition(
                &regular(&[("c", terminated(42))]),
                &new,
                &spec,
                &gates()
            )
            .is_ok()
        );
        assert!(
            check_container_state_transition(
                &regular(&[("c", terminated(1))]),
                &new,
                &spec,
                &gates()
            )
            .is_err()
        );
    }

    #[test]
    fn r6_init_containers_by_index_and_name_sidecars_exempt() {
        let mut spec = PodSpec {
            restart_policy: Some("Never".into()),
            ..spec_with(&["i0", "side"], &["c"])
        };
        spec.init_containers.as_mut().unwrap()[1].restart_policy = Some("Always".into());
        let old = PodStatus {
            init_container_statuses: Some(vec![
                status_in("i0", terminated(0)),
                status_in("side", terminated(0)),
            ]),
            ..Default::default()
        };
        let sidecar_back = PodStatus {
            init_container_statuses: Some(vec![
                status_in("i0", terminated(0)),
                status_in("side", running()),
            ]),
            ..Default::default()
        };
        assert!(check_container_state_transition(&old, &sidecar_back, &spec, &gates()).is_ok());
        let init_back = PodStatus {
            init_container_statuses: Some(vec![
                status_in("i0", running()),
                status_in("side", running()),
            ]),
            ..Default::default()
        };
        assert_eq!(
            check_container_state_transition(&old, &init_back, &spec, &gates())
                .unwrap_err()
                .to_string(),
            "terminated init container i0 attempted illegal transition to non-terminated state"
        );
        let swapped = PodStatus {
            init_container_statuses: Some(vec![
                status_in("side", waiting()),
                status_in("i0", waiting()),
            ]),
            ..Default::default()
        };
        assert_eq!(
            check_container_state_transition(&swapped, &old, &spec, &gates()),
            Err(TransitionError::SpecMismatch("side".into()))
        );
    }

    #[test]
    fn test_update_last_transition_time() {
        let old_time = ts("2026-01-01T00:00:00Z");
        let now = ts("2026-01-01T00:01:00Z");
        // No condition: nothing happens.
        let mut status = PodStatus::default();
        update_last_transition_time(&mut status, &PodStatus::default(), "Ready", now);
        assert_eq!(status, PodStatus::default());
        // New condition without an old one: now.
        let mut status = PodStatus {
            conditions: Some(vec![cond("Ready", "True")]),
            ..Default::default()
        };
        update_last_transition_time(&mut status, &PodStatus::default(), "Ready", now);
        assert_eq!(
            status.conditions.as_ref().unwrap()[0].last_transition_time,
            Some(Time(now))
        );
        // Status changed False -> True: now.
        let old = PodStatus {
            conditions: Some(vec![condition_at("Ready", "False", old_time)]),
            ..Default::default()
        };
        let mut status = PodStatus {
            conditions: Some(vec![cond("Ready", "True")]),
            ..Default::default()
        };
        update_last_transition_time(&mut status, &old, "Ready", now);
        assert_eq!(
            status.conditions.as_ref().unwrap()[0].last_transition_time,
            Some(Time(now))
        );
        // Same status: the old time.
        let old = PodStatus {
            conditions: Some(vec![condition_at("Ready", "True", old_time)]),
            ..Default::default()
        };
        let mut status = PodStatus {
            conditions: Some(vec![cond("Ready", "True")]),
            ..Default::default()
        };
        update_last_transition_time(&mut status, &old, "Ready", now);
        assert_eq!(
            status.conditions.as_ref().unwrap()[0].last_transition_time,
            Some(Time(old_time))
        );
    }

    #[test]
    fn errata3_unset_old_time_is_copied_and_only_the_first_duplicate_is_updated() {
        let now = ts("2026-01-01T00:01:00Z");
        let old = PodStatus {
            conditions: Some(vec![cond("Ready", "True")]),
            ..Default::default()
        };
        let mut status = PodStatus {
            conditions: Some(vec![
                condition_at("Ready", "True", now),
                cond("Ready", "False"),
            ]),
            ..Default::default()
        };
        update_last_transition_time(&mut status, &old, "Ready", now);
        let c = status.conditions.unwrap();
        assert_eq!(c[0].last_transition_time, None);
        assert_eq!(c[1].last_transition_time, None);
    }

    #[test]
    fn r7_foreign_condition_times_are_left_alone() {
        let caller = ts("2020-01-01T00:00:00Z");
        let mut status = PodStatus {
            conditions: Some(vec![condition_at("example.com/gate", "True", caller)]),
            ..Default::default()
        };
        update_last_transition_times(
            &mut status,
            &PodStatus::default(),
            ts("2026-01-01T00:00:00Z"),
        );
        assert_eq!(
            status.conditions.unwrap()[0].last_transition_time,
            Some(Time(caller))
        );
    }
}
