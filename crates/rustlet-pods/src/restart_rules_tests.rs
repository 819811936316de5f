//! Container restart rules (`ContainerRestartRules`) in the restart decision (C20, C8, C11) and
//! the phase (S4): upstream's `TestShouldContainerBeRestarted`,
//! `TestComputePodActionsWithContainerRestartRules`, `TestPodPhaseWithContainerRestartPolicy`
//! and `TestPodPhaseWithContainerRestartPolicyInitContainers`, ported by name.

use k8s_openapi::api::core::v1::{
    ContainerRestartRule, ContainerRestartRuleOnExitCodes, ContainerState,
    ContainerStateTerminated, ContainerStatus, Pod,
};
use k8s_openapi::jiff::Timestamp;
use rustlet_core::PodPhase;

use crate::actions::{NoProbes, compute_pod_actions, should_container_be_restarted};
use crate::runtime::{ContainerInstance, ContainerKind, InstanceState, RuntimePodStatus, Sandbox};
use crate::status::get_phase;

/// A pod with this policy (`None`: unset) and these init and regular containers, each with its
/// own policy (`None`: unset).
fn pod(
    policy: Option<&str>,
    init: &[(&str, Option<&str>)],
    containers: &[(&str, Option<&str>)],
) -> Pod {
    let list = |list: &[(&str, Option<&str>)]| {
        list.iter()
            .map(|(name, policy)| {
                serde_json::json!({"name": name, "image": "busybox", "restartPolicy": policy})
            })
            .collect::<Vec<_>>()
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "foo", "namespace": "new", "uid": "12345678"},
        "spec": {"restartPolicy": policy,
                 "initContainers": list(init),
                 "containers": list(containers)}
    }))
    .unwrap()
}

fn rule_in(values: &[i32]) -> ContainerRestartRule {
    ContainerRestartRule {
        action: "Restart".into(),
        exit_codes: Some(ContainerRestartRuleOnExitCodes {
            operator: "In".into(),
            values: Some(values.to_vec()),
        }),
    }
}

fn instance(name: &str, state: InstanceState) -> ContainerInstance {
    ContainerInstance {
        id: format!("simulated://{name}"),
        name: name.into(),
        kind: ContainerKind::Regular,
        image: "busybox".into(),
        image_id: "busybox".into(),
        attempt: 0,
        state,
        sandbox_id: "s1".into(),
        hash: None,
    }
}

fn exited(code: i32) -> InstanceState {
    InstanceState::Exited {
        started_at: Timestamp::UNIX_EPOCH,
        finished_at: Timestamp::UNIX_EPOCH,
        exit_code: code,
        reason: if code == 0 { "Completed" } else { "Error" }.into(),
        message: String::new(),
    }
}

fn running() -> InstanceState {
    InstanceState::Running {
        started_at: Timestamp::UNIX_EPOCH,
    }
}

fn runtime(ready: bool, containers: Vec<ContainerInstance>) -> RuntimePodStatus {
    RuntimePodStatus {
        sandbox: Some(Sandbox {
            id: "s1".into(),
            ready,
            host_network: false,
            ip: Some("10.88.0.2".into()),
        }),
        containers,
    }
}

fn status(name: &str, exit_code: i32) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// upstream `failedState`.
fn failed(name: &str) -> ContainerStatus {
    status(name, 42)
}

/// upstream `succeededState`.
fn succeeded(name: &str) -> ContainerStatus {
    status(name, 0)
}

/// Upstream `TestShouldContainerBeRestarted` (C20): each container under each pod policy, then
/// none once the pod is deleted.
#[test]
fn test_should_container_be_restarted() {
    let names = ["no-history", "alive", "succeed", "failed", "unknown"];
    let newest = |name: &str| match name {
        "alive" => Some(instance(name, running())),
        "succeed" => Some(instance(name, exited(0))),
        "failed" => Some(instance(name, exited(1))),
        "unknown" => Some(instance(name, InstanceState::Unknown)),
        _ => None,
    };
    // Under Never, OnFailure, Always.
    let expected = |name: &str| match name {
        "no-history" | "unknown" => [true, true, true],
        "alive" => [false, false, false],
        "succeed" => [false, false, true],
        _ => [false, true, true],
    };
    for (i, policy) in ["Never", "OnFailure", "Always"].into_iter().enumerate() {
        let mut p = pod(Some(policy), &[], &names.map(|n| (n, None::<&str>)));
        for (c, name) in p.spec.as_ref().unwrap().containers.iter().zip(names) {
            assert_eq!(
                should_container_be_restarted(&p, c, newest(name).as_ref()),
                expected(name)[i],
                "{name} under {policy}"
            );
        }
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::UNIX_EPOCH,
        ));
        for (c, name) in p.spec.as_ref().unwrap().containers.iter().zip(names) {
            assert!(
                !should_container_be_restarted(&p, c, newest(name).as_ref()),
                "{name} of a deleted pod under {policy}"
            );
        }
    }
}

/// The e2e "Pod Extended (container restart policy)" cases on the restart decision: a rule's
/// exit code restarts a `Never` container; another code does not; the container's policy
/// overrides the pod's both ways.
#[test]
fn should_container_be_restarted_follows_the_containers_policy_and_rules() {
    let mut p = pod(Some("Never"), &[], &[("main-container", Some("Never"))]);
    p.spec.as_mut().unwrap().containers[0].restart_policy_rules = Some(vec![rule_in(&[42])]);
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    let restarts = |p: &Pod, c, code| {
        should_container_be_restarted(p, c, Some(&instance("main-container", exited(code))))
    };
    assert!(
        restarts(&p, &c, 42),
        "should restart container on rule match"
    );
    assert!(
        !restarts(&p, &c, 1),
        "should not restart container on rule mismatch"
    );

    let p = pod(Some("Always"), &[], &[("main-container", Some("Never"))]);
    let c = &p.spec.as_ref().unwrap().containers[0];
    assert!(
        !restarts(&p, c, 1),
        "container-level Never under a pod's Always"
    );
    let p = pod(Some("Never"), &[], &[("main-container", Some("Always"))]);
    let c = &p.spec.as_ref().unwrap().containers[0];
    assert!(
        restarts(&p, c, 1),
        "container-level Always under a pod's Never"
    );
    let p = pod(Some("Always"), &[], &[("main-container", None)]);
    let c = &p.spec.as_ref().unwrap().containers[0];
    assert!(
        restarts(&p, c, 1),
        "the pod's Always without a container-level policy"
    );
}

/// Upstream `TestComputePodActionsWithContainerRestartRules` (C8, C11), over upstream's base
/// pod (`foo1`, `foo2`, `foo3`; the third runs in every case).
#[test]
fn test_compute_pod_actions_with_container_restart_rules() {
    let base = |pod_policy, policies: [Option<&'static str>; 2]| {
        pod(
            Some(pod_policy),
            &[],
            &[("foo1", policies[0]), ("foo2", policies[1]), ("foo3", None)],
        )
    };
    let statuses = |ready, first: InstanceState, second: InstanceState| {
        runtime(
            ready,
            vec![
                instance("foo1", first),
                instance("foo2", second),
                instance("foo3", running()),
            ],
        )
    };
    let always = Some("Always");
    let on_failure = Some("OnFailure");
    let never = Some("Never");

    // "restart exited containers if RestartPolicy == Always"
    let actions = compute_pod_actions(
        &base("Never", [always, always]),
        &statuses(true, exited(0), exited(111)),
        &NoProbes,
    );
    assert_eq!(actions.start, [0, 1]);
    assert!(!actions.kill_pod && actions.kill.is_empty());

    // "restart failed containers if RestartPolicy == OnFailure"
    let actions = compute_pod_actions(
        &base("Never", [on_failure, on_failure]),
        &statuses(true, exited(0), exited(111)),
        &NoProbes,
    );
    assert_eq!(actions.start, [1]);
    assert!(!actions.kill_pod && actions.kill.is_empty());

    // "restart created but not started containers if RestartPolicy == OnFailure"
    let actions = compute_pod_actions(
        &base("Never", [on_failure, on_failure]),
        &statuses(true, exited(0), InstanceState::Created),
        &NoProbes,
    );
    assert_eq!(actions.start, [1]);

    // "don't restart containers if RestartPolicy == Never"
    let actions = compute_pod_actions(
        &base("Always", [never, never]),
        &statuses(true, exited(0), exited(111)),
        &NoProbes,
    );
    assert!(actions.start.is_empty(), "{actions:?}");
    assert!(!actions.kill_pod && actions.kill.is_empty());

    // "Kill pod and recreate all containers (except for the succeeded one) if the pod sandbox
    // is dead"
    let actions = compute_pod_actions(
        &base("Always", [None, on_failure]),
        &statuses(false, running(), exited(0)),
        &NoProbes,
    );
    assert!(actions.kill_pod && actions.create_sandbox);
    assert_eq!(actions.start, [0, 2]);
}

/// C11: a running container killed by its liveness probe restarts by its own policy (its
/// rules need an exit code): a `Never` container in an `Always` pod is only killed.
#[test]
fn a_probe_kill_restarts_by_the_containers_own_policy() {
    struct Liveness;
    impl crate::actions::ProbeFailures for Liveness {
        fn result(
            &self,
            _id: &str,
            kind: crate::prober::ProbeKind,
        ) -> Option<crate::prober::ProbeResult> {
            Some(if kind == crate::prober::ProbeKind::Liveness {
                crate::prober::ProbeResult::Failure
            } else {
                crate::prober::ProbeResult::Success
            })
        }
    }
    let p = pod(Some("Always"), &[], &[("a", Some("Never"))]);
    let actions = compute_pod_actions(
        &p,
        &runtime(true, vec![instance("a", running())]),
        &Liveness,
    );
    assert_eq!(actions.kill.len(), 1);
    assert_eq!(actions.kill[0].message, "Container a failed liveness probe");
    assert!(actions.start.is_empty());
    let p = pod(Some("Never"), &[], &[("a", Some("OnFailure"))]);
    let actions = compute_pod_actions(
        &p,
        &runtime(true, vec![instance("a", running())]),
        &Liveness,
    );
    assert_eq!(
        actions.kill[0].message,
        "Container a failed liveness probe, will be restarted"
    );
    assert_eq!(actions.start, [0]);
}

/// Upstream `TestPodPhaseWithContainerRestartPolicy` (S4), case by case.
#[test]
fn test_pod_phase_with_container_restart_policy() {
    let (always, on_failure, never) = (Some("Always"), Some("OnFailure"), Some("Never"));
    let cases: [(&str, Pod, Vec<ContainerStatus>, PodPhase); 6] = [
        (
            "container with restart policy Never failed",
            pod(Some("Always"), &[], &[("failed-container", never)]),
            vec![failed("failed-container")],
            PodPhase::Failed,
        ),
        (
            "container with restart policy OnFailure failed",
            pod(Some("Always"), &[], &[("failed-container", on_failure)]),
            vec![failed("failed-container")],
            PodPhase::Running,
        ),
        (
            "container with restart policy Always failed",
            pod(Some("Always"), &[], &[("failed-container", always)]),
            vec![failed("failed-container")],
            PodPhase::Running,
        ),
        (
            "At least one container with restartable container-level restart policy failed",
            pod(
                Some("Never"),
                &[],
                &[("containerA", always), ("containerB", None)],
            ),
            vec![succeeded("containerA"), failed("containerB")],
            PodPhase::Running,
        ),
        (
            "All containers without restartable container-level restart policy failed",
            pod(
                Some("Always"),
                &[],
                &[("containerA", never), ("containerB", on_failure)],
            ),
            vec![failed("containerA"), succeeded("containerB")],
            PodPhase::Failed,
        ),
        (
            "All containers succeeded",
            pod(
                Some("Always"),
                &[],
                &[("containerA", never), ("containerB", on_failure)],
            ),
            vec![succeeded("containerA"), succeeded("containerB")],
            PodPhase::Succeeded,
        ),
    ];
    for (name, p, statuses, expected) in cases {
        assert_eq!(
            get_phase(&p, &[], &statuses, false, false),
            expected,
            "{name}"
        );
    }
}

/// Upstream `TestPodPhaseWithContainerRestartPolicyInitContainers` (S4), case by case (the
/// third one's init container is a sidecar, which fails nothing either way).
#[test]
fn test_pod_phase_with_container_restart_policy_init_containers() {
    let cases: [(&str, Pod, PodPhase); 3] = [
        (
            "init container with restart policy Never failed",
            pod(
                Some("Always"),
                &[("failed-container", Some("Never"))],
                &[("container", None)],
            ),
            PodPhase::Failed,
        ),
        (
            "init container with restart policy OnFailure failed",
            pod(
                Some("Never"),
                &[("failed-container", Some("OnFailure"))],
                &[("container", None)],
            ),
            PodPhase::Pending,
        ),
        (
            "container with restart policy Always failed",
            pod(
                Some("Never"),
                &[("failed-container", Some("Always"))],
                &[("container", None)],
            ),
            PodPhase::Pending,
        ),
    ];
    for (name, p, expected) in cases {
        assert_eq!(
            get_phase(&p, &[failed("failed-container")], &[], false, false),
            expected,
            "{name}"
        );
    }
}

/// S4: a container waiting to restart counts by its last exit: a rule's code keeps a `Never`
/// pod Running, another code fails it.
#[test]
fn a_waiting_container_counts_by_its_last_exit_code() {
    let mut p = pod(Some("Never"), &[], &[("main-container", Some("Never"))]);
    p.spec.as_mut().unwrap().containers[0].restart_policy_rules = Some(vec![rule_in(&[42])]);
    let waiting = |code| ContainerStatus {
        state: Some(ContainerState {
            waiting: Some(Default::default()),
            ..Default::default()
        }),
        last_state: status("main-container", code).state,
        ..status("main-container", code)
    };
    assert_eq!(
        get_phase(&p, &[], &[waiting(42)], false, false),
        PodPhase::Running
    );
    assert_eq!(
        get_phase(&p, &[], &[waiting(1)], false, false),
        PodPhase::Failed
    );
}

/// Upstream `computeInitContainerActions` with `ContainerRestartRules`: a failed ordinary init
/// container restarts by `ShouldContainerBeRestarted` (its own policy and rules, else the
/// pod's), so an `OnFailure` init container of a `Never` pod is started again, and a `Never` one
/// of an `Always` pod ends the pod.
#[test]
fn test_compute_init_container_actions_with_container_restart_policy() {
    let mut on_failure = pod(
        Some("Never"),
        &[("init", Some("OnFailure"))],
        &[("app", None)],
    );
    let failed = runtime(true, vec![instance("init", exited(1))]);
    let actions = compute_pod_actions(&on_failure, &failed, &NoProbes);
    assert!(!actions.kill_pod, "{actions:?}");
    assert_eq!(actions.init_to_start, [0]);

    // Its rules decide by the exit code.
    let spec = on_failure.spec.as_mut().unwrap();
    let init = &mut spec.init_containers.as_mut().unwrap()[0];
    init.restart_policy = Some("Never".into());
    init.restart_policy_rules = Some(vec![rule_in(&[42])]);
    let actions = compute_pod_actions(&on_failure, &failed, &NoProbes);
    assert!(actions.kill_pod, "exit 1 matches no rule: {actions:?}");
    let retried = runtime(true, vec![instance("init", exited(42))]);
    let actions = compute_pod_actions(&on_failure, &retried, &NoProbes);
    assert!(!actions.kill_pod, "exit 42 matches the rule: {actions:?}");
    assert_eq!(actions.init_to_start, [0]);

    let never = pod(Some("Always"), &[("init", Some("Never"))], &[("app", None)]);
    let actions = compute_pod_actions(&never, &failed, &NoProbes);
    assert!(actions.kill_pod, "{actions:?}");
    assert!(actions.init_to_start.is_empty());
}
