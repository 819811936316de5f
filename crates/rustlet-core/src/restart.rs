//! Container restart rules (upstream feature `ContainerRestartRules`, beta and on by default
//! since v1.35): whether a container that exited is started again, from its own
//! `restartPolicy` and `restartPolicyRules`, else the pod's `restartPolicy`.
//!
//! Upstream: `pkg/api/v1/pod/util.go` `ContainerShouldRestart`,
//! `FindMatchingContainerRestartRule`. The status manager's
//! transition check (R6, [`crate::transition`]), the phase and the restart decision of the pod
//! workers all ask [`container_should_restart`].
//!
//! Deviation: a matching rule with the action `RestartAllContainers` falls back to the
//! container's policy, as upstream does with `RestartAllContainersOnContainerExits` off
//! (upstream turns it on by default in v1.36; Rustlet does not restart a pod's containers in
//! place, [`crate::FeatureGates::restart_all_containers_on_container_exits`]).

use k8s_openapi::api::core::v1::{Container, ContainerRestartRule, PodSpec};

/// The rule action that restarts the container that exited.
pub const ACTION_RESTART: &str = "Restart";

/// Upstream `FindMatchingContainerRestartRule`: the first of the container's rules whose exit
/// codes match `exit_code` (`In`: listed; `NotIn`: not listed). A rule without exit codes or
/// with another operator matches nothing.
pub fn find_matching_container_restart_rule(
    container: &Container,
    exit_code: i32,
) -> Option<&ContainerRestartRule> {
    container
        .restart_policy_rules
        .iter()
        .flatten()
        .find(|rule| {
            let Some(codes) = &rule.exit_codes else {
                return false;
            };
            let listed = codes.values.iter().flatten().any(|c| *c == exit_code);
            match codes.operator.as_str() {
                "In" => listed,
                "NotIn" => !listed,
                _ => false,
            }
        })
}

/// Upstream `ContainerShouldRestart`: whether a container that exited with `exit_code` is
/// restarted. With a container-level `restartPolicy`, its first matching rule with the action
/// `Restart` says yes; else the container's policy decides (`Always`; `OnFailure` on a non-zero
/// code; `Never`). Without one, the pod's policy decides; an unset pod policy is `Always`.
pub fn container_should_restart(container: &Container, spec: &PodSpec, exit_code: i32) -> bool {
    if let Some(policy) = &container.restart_policy {
        if find_matching_container_restart_rule(container, exit_code)
            .is_some_and(|rule| rule.action == ACTION_RESTART)
        {
            return true;
        }
        match policy.as_str() {
            "Always" => return true,
            "OnFailure" => return exit_code != 0,
            "Never" => return false,
            _ => {}
        }
    }
    match spec.restart_policy.as_deref() {
        Some("OnFailure") => exit_code != 0,
        Some("Never") => false,
        _ => true,
    }
}

/// The policy a container runs under when the restart decision needs no exit code (a running
/// container killed by a probe, upstream `computePodActions`; a container in an unknown state,
/// `computeInitContainerActions`): its own `restartPolicy` if set, else the pod's (unset:
/// `Always`). Its rules are not read: there is no exit code to match.
pub fn effective_restart_policy<'a>(spec: &'a PodSpec, container: &'a Container) -> &'a str {
    container
        .restart_policy
        .as_deref()
        .or(spec.restart_policy.as_deref())
        .unwrap_or("Always")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerRestartRuleOnExitCodes;

    fn rule(action: &str, operator: &str, values: &[i32]) -> ContainerRestartRule {
        ContainerRestartRule {
            action: action.into(),
            exit_codes: Some(ContainerRestartRuleOnExitCodes {
                operator: operator.into(),
                values: Some(values.to_vec()),
            }),
        }
    }

    fn container(policy: Option<&str>, rules: &[ContainerRestartRule]) -> Container {
        Container {
            name: "c".into(),
            restart_policy: policy.map(str::to_owned),
            restart_policy_rules: (!rules.is_empty()).then(|| rules.to_vec()),
            ..Container::default()
        }
    }

    fn pod_spec(policy: Option<&str>) -> PodSpec {
        PodSpec {
            restart_policy: policy.map(str::to_owned),
            ..PodSpec::default()
        }
    }

    /// Upstream `TestFindMatchingContainerRestartRule`, case by case.
    #[test]
    fn test_find_matching_container_restart_rule() {
        let rule_in = rule("Restart", "In", &[42, 50, 60]);
        let rule_not_in = rule("Restart", "NotIn", &[0, 1, 2]);
        let rule_in_42 = rule("Restart", "In", &[42]);
        let cases: [(&str, Container, i32, Option<&ContainerRestartRule>); 5] = [
            (
                "a rule with op In matches",
                container(None, std::slice::from_ref(&rule_in)),
                42,
                Some(&rule_in),
            ),
            (
                "a rule with op NotIn matches",
                container(None, std::slice::from_ref(&rule_not_in)),
                99,
                Some(&rule_not_in),
            ),
            (
                "matches the first rule if two rules both matched",
                container(None, &[rule_in.clone(), rule_in_42.clone()]),
                42,
                Some(&rule_in),
            ),
            (
                "no rules matched",
                container(None, std::slice::from_ref(&rule_in)),
                100,
                None,
            ),
            ("no rules defined", container(None, &[]), 0, None),
        ];
        for (name, c, exit_code, expected) in cases {
            assert_eq!(
                find_matching_container_restart_rule(&c, exit_code),
                expected,
                "{name}"
            );
        }
    }

    /// Upstream `TestContainerHasRestartablePolicy` (of `ContainerShouldRestart`), but for the
    /// `RestartAllContainers` case, which falls back here (the module's deviation).
    #[test]
    fn test_container_has_restartable_policy() {
        let never = Some("Never");
        let cases: [(&str, Container, PodSpec, i32, bool); 13] = [
            (
                "Rule: 'In' operator matches with 'Restart' action",
                container(never, &[rule("Restart", "In", &[42, 50, 60])]),
                pod_spec(None),
                42,
                true,
            ),
            (
                "Rule: 'NotIn' operator matches with 'Restart' action",
                container(never, &[rule("Restart", "NotIn", &[0, 1, 2])]),
                pod_spec(None),
                99,
                true,
            ),
            (
                "Rule: 'In' operator matches with 'RestartAllContainers' action (not \
                 implemented: the container's policy decides)",
                container(never, &[rule("RestartAllContainers", "In", &[42])]),
                pod_spec(None),
                42,
                false,
            ),
            (
                "Rule: 'In' operator does not match, should fall back to container policy",
                container(never, &[rule("Restart", "In", &[10, 20])]),
                pod_spec(None),
                30,
                false,
            ),
            (
                "Rule: 'NotIn' operator does not match, should fall back to container policy",
                container(never, &[rule("Restart", "NotIn", &[10, 20])]),
                pod_spec(None),
                10,
                false,
            ),
            (
                "Container Policy: 'Always'",
                container(Some("Always"), &[]),
                pod_spec(never),
                0,
                true,
            ),
            (
                "Container Policy: 'OnFailure' with exit code 0",
                container(Some("OnFailure"), &[]),
                pod_spec(never),
                0,
                false,
            ),
            (
                "Container Policy: 'OnFailure' with non-zero exit code",
                container(Some("OnFailure"), &[]),
                pod_spec(never),
                1,
                true,
            ),
            (
                "Container Policy: 'Never' should return false",
                container(never, &[]),
                pod_spec(Some("Always")),
                1,
                false,
            ),
            (
                "Pod Policy: Fallback to pod 'Always'",
                container(None, &[]),
                pod_spec(Some("Always")),
                0,
                true,
            ),
            (
                "Pod Policy: Fallback to pod 'OnFailure' with non-zero exit code",
                container(None, &[]),
                pod_spec(Some("OnFailure")),
                1,
                true,
            ),
            (
                "Pod Policy: Fallback to pod 'Never'",
                container(None, &[]),
                pod_spec(never),
                1,
                false,
            ),
            (
                "Pod Policy: Fallback with no policies specified should return true",
                container(None, &[]),
                pod_spec(None),
                0,
                true,
            ),
        ];
        for (name, c, spec, exit_code, expected) in cases {
            assert_eq!(
                container_should_restart(&c, &spec, exit_code),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn effective_restart_policy_is_the_containers_then_the_pods() {
        assert_eq!(
            effective_restart_policy(&pod_spec(Some("Always")), &container(Some("Never"), &[])),
            "Never"
        );
        assert_eq!(
            effective_restart_policy(&pod_spec(Some("OnFailure")), &container(None, &[])),
            "OnFailure"
        );
        assert_eq!(
            effective_restart_policy(&pod_spec(None), &container(None, &[])),
            "Always"
        );
    }
}
