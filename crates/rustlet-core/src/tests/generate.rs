//! Upstream `generate_test.go` (v1.35) and `NeedToReconcilePodReadiness` (G1-G7).

use k8s_openapi::api::core::v1::{
    ContainerStatus, Pod, PodCondition, PodReadinessGate, PodSpec, PodStatus,
};

use crate::features::FeatureGates;
use crate::generate::*;
use crate::pod::PodPhase;
use crate::testutil::*;

/// spec, conditions, statuses, (status, reason, message)
type GateCase = (
    PodSpec,
    Vec<PodCondition>,
    Vec<ContainerStatus>,
    (&'static str, &'static str, &'static str),
);
/// spec, statuses, phase, (status, reason)
type InitCase = (
    PodSpec,
    Option<Vec<ContainerStatus>>,
    PodPhase,
    (&'static str, &'static str),
);

fn pod(spec: PodSpec) -> Pod {
    Pod {
        spec: Some(spec),
        ..Default::default()
    }
}

fn sidecar_spec(sidecars: &[&str], containers: &[&str]) -> PodSpec {
    let mut spec = spec_with(sidecars, containers);
    for c in spec.init_containers.iter_mut().flatten() {
        c.restart_policy = Some("Always".into());
    }
    spec
}

fn ready(name: &str) -> ContainerStatus {
    ContainerStatus {
        ready: true,
        ..status_named(name)
    }
}

fn unready(name: &str) -> ContainerStatus {
    status_named(name)
}

fn check(c: &PodCondition, type_: &str, status: &str, reason: &str, message: &str) {
    assert_eq!(c.type_, type_);
    assert_eq!(
        (
            c.status.as_str(),
            c.reason.as_deref().unwrap_or(""),
            c.message.as_deref().unwrap_or("")
        ),
        (status, reason, message)
    );
}

struct ReadyCase {
    spec: PodSpec,
    statuses: Option<Vec<ContainerStatus>>,
    phase: PodPhase,
    want: (&'static str, &'static str, String),
}

fn container_cases() -> Vec<ReadyCase> {
    let r = PodPhase::Running;
    vec![
        ReadyCase {
            spec: PodSpec::default(),
            statuses: None,
            phase: r.clone(),
            want: ("False", UNKNOWN_CONTAINER_STATUSES, String::new()),
        },
        ReadyCase {
            spec: PodSpec::default(),
            statuses: Some(vec![]),
            phase: r.clone(),
            want: ("True", "", String::new()),
        },
        ReadyCase {
            spec: spec_with(&[], &["1234"]),
            statuses: Some(vec![]),
            phase: r.clone(),
            want: (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unknown status: [1234]".into(),
            ),
        },
        ReadyCase {
            spec: spec_with(&[], &["1234", "5678"]),
            statuses: Some(vec![ready("1234"), ready("5678")]),
            phase: r.clone(),
            want: ("True", "", String::new()),
        },
        ReadyCase {
            spec: spec_with(&[], &["1234", "5678"]),
            statuses: Some(vec![ready("1234")]),
            phase: r.clone(),
            want: (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unknown status: [5678]".into(),
            ),
        },
        ReadyCase {
            spec: spec_with(&[], &["1234", "5678"]),
            statuses: Some(vec![ready("1234"), unready("5678")]),
            phase: r.clone(),
            want: (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unready status: [5678]".into(),
            ),
        },
        ReadyCase {
            spec: spec_with(&[], &["1234"]),
            statuses: Some(vec![unready("1234")]),
            phase: PodPhase::Succeeded,
            want: ("False", POD_COMPLETED, String::new()),
        },
    ]
}

fn sidecar_cases() -> Vec<ReadyCase> {
    let r = PodPhase::Running;
    vec![
        ReadyCase {
            spec: sidecar_spec(&["restartable-init-1"], &["regular-1"]),
            statuses: Some(vec![ready("regular-1")]),
            phase: r.clone(),
            want: (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unknown status: [restartable-init-1]".into(),
            ),
        },
        ReadyCase {
            spec: sidecar_spec(
                &["restartable-init-1", "restartable-init-2"],
                &["regular-1"],
            ),
            statuses: Some(vec![
                ready("restartable-init-1"),
                ready("restartable-init-2"),
                ready("regular-1"),
            ]),
            phase: r.clone(),
            want: ("True", "", String::new()),
        },
        ReadyCase {
            spec: sidecar_spec(
                &["restartable-init-1", "restartable-init-2"],
                &["regular-1"],
            ),
            statuses: Some(vec![ready("restartable-init-1"), ready("regular-1")]),
            phase: r.clone(),
            want: (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unknown status: [restartable-init-2]".into(),
            ),
        },
        ReadyCase {
            spec: sidecar_spec(
                &["restartable-init-1", "restartable-init-2"],
                &["regular-1"],
            ),
            statuses: Some(vec![
                ready("restartable-init-1"),
                unready("restartable-init-2"),
                ready("regular-1"),
            ]),
            phase: r,
            want: (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unready status: [restartable-init-2]".into(),
            ),
        },
    ]
}

#[test]
fn test_generate_containers_ready_condition() {
    let gates = FeatureGates::default();
    for (i, case) in container_cases()
        .into_iter()
        .chain(sidecar_cases())
        .enumerate()
    {
        let p = pod(case.spec);
        let ctx = GenerateContext {
            pod: &p,
            old_status: &PodStatus::default(),
            gates: &gates,
        };
        let c = containers_ready_condition(&ctx, case.statuses.as_deref(), &case.phase);
        check(
            &c,
            "ContainersReady",
            case.want.0,
            case.want.1,
            &case.want.2,
        );
        let _ = i;
    }
}

#[test]
fn g1_failed_phase_is_pod_failed() {
    let gates = FeatureGates::default();
    let p = pod(spec_with(&[], &["a"]));
    let ctx = GenerateContext {
        pod: &p,
        old_status: &PodStatus::default(),
        gates: &gates,
    };
    let c = containers_ready_condition(&ctx, Some(&[ready("a")]), &PodPhase::Failed);
    check(&c, "ContainersReady", "False", POD_FAILED, "");
}

fn gated(gates: &[&str], containers: &[&str]) -> PodSpec {
    PodSpec {
        readiness_gates: Some(
            gates
                .iter()
                .map(|g| PodReadinessGate {
                    condition_type: (*g).into(),
                })
                .collect(),
        ),
        ..spec_with(&[], containers)
    }
}

#[test]
fn test_generate_pod_ready_condition() {
    let gates = FeatureGates::default();
    for case in container_cases() {
        let p = pod(case.spec);
        let ctx = GenerateContext {
            pod: &p,
            old_status: &PodStatus::default(),
            gates: &gates,
        };
        let c = pod_ready_condition(&ctx, &[], case.statuses.as_deref(), &case.phase);
        check(&c, "Ready", case.want.0, case.want.1, &case.want.2);
    }
    let gate_cases: Vec<GateCase> = vec![
        (
            gated(&["gate1"], &[]),
            vec![],
            vec![],
            (
                "False",
                READINESS_GATES_NOT_READY,
                "corresponding condition of pod readiness gate \"gate1\" does not exist.",
            ),
        ),
        (
            gated(&["gate1"], &[]),
            vec![cond("gate1", "False")],
            vec![],
            (
                "False",
                READINESS_GATES_NOT_READY,
                "the status of pod readiness gate \"gate1\" is not \"True\", but False",
            ),
        ),
        (
            gated(&["gate1"], &[]),
            vec![cond("gate1", "True")],
            vec![],
            ("True", "", ""),
        ),
        (
            gated(&["gate1", "gate2"], &[]),
            vec![cond("gate1", "True")],
            vec![],
            (
                "False",
                READINESS_GATES_NOT_READY,
                "corresponding condition of pod readiness gate \"gate2\" does not exist.",
            ),
        ),
        (
            gated(&["gate1", "gate2"], &[]),
            vec![cond("gate1", "True"), cond("gate2", "False")],
            vec![],
            (
                "False",
                READINESS_GATES_NOT_READY,
                "the status of pod readiness gate \"gate2\" is not \"True\", but False",
            ),
        ),
        (
            gated(&["gate1", "gate2"], &[]),
            vec![cond("gate1", "True"), cond("gate2", "True")],
            vec![],
            ("True", "", ""),
        ),
        (
            gated(&["gate1"], &["1234"]),
            vec![cond("gate1", "True")],
            vec![unready("1234")],
            (
                "False",
                CONTAINERS_NOT_READY,
                "containers with unready status: [1234]",
            ),
        ),
    ];
    for (spec, conditions, statuses, want) in gate_cases {
        let p = pod(spec);
        let ctx = GenerateContext {
            pod: &p,
            old_status: &PodStatus::default(),
            gates: &gates,
        };
        let c = pod_ready_condition(&ctx, &conditions, Some(&statuses), &PodPhase::Running);
        check(&c, "Ready", want.0, want.1, want.2);
    }
}

#[test]
fn test_generate_pod_initialized_condition() {
    let gates = FeatureGates {
        container_restart_rules: true,
        restart_all_containers_on_container_exits: true,
        ..FeatureGates::default()
    };
    let two = spec_with(&["1234", "5678"], &[]);
    let one = spec_with(&["1234"], &[]);
    let started = |n: &str, s: bool| ContainerStatus {
        started: Some(s),
        ..status_named(n)
    };
    let cases: Vec<InitCase> = vec![
        (
            two.clone(),
            None,
            PodPhase::Running,
            ("False", UNKNOWN_CONTAINER_STATUSES),
        ),
        (
            PodSpec::default(),
            Some(vec![]),
            PodPhase::Running,
            ("True", ""),
        ),
        (
            one.clone(),
            Some(vec![]),
            PodPhase::Running,
            ("False", CONTAINERS_NOT_INITIALIZED),
        ),
        (
            two.clone(),
            Some(vec![ready("1234"), ready("5678")]),
            PodPhase::Running,
            ("True", ""),
        ),
        (
            two.clone(),
            Some(vec![ready("1234")]),
            PodPhase::Running,
            ("False", CONTAINERS_NOT_INITIALIZED),
        ),
        (
            two.clone(),
            Some(vec![ready("1234"), unready("5678")]),
            PodPhase::Running,
            ("False", CONTAINERS_NOT_INITIALIZED),
        ),
        (
            one.clone(),
            Some(vec![ready("1234")]),
            PodPhase::Succeeded,
            ("True", POD_COMPLETED),
        ),
        (
            sidecar_spec(&["restartable-init-1"], &["regular-1"]),
            Some(vec![started("restartable-init-1", false)]),
            PodPhase::Pending,
            ("False", CONTAINERS_NOT_INITIALIZED),
        ),
        (
            sidecar_spec(&["restartable-init-1"], &["regular-1"]),
            Some(vec![started("restartable-init-1", true)]),
            PodPhase::Running,
            ("True", ""),
        ),
        (
            sidecar_spec(&["restartable-init-1"], &["regular-1"]),
            Some(vec![
                started("restartable-init-1", false),
                status_in("regular-1", running()),
            ]),
            PodPhase::Running,
            ("True", ""),
        ),
        (
            spec_with(&["init-1"], &["regular-1"]),
            Some(vec![
                status_in("init-1", waiting()),
                status_in("regular-1", terminated(0)),
            ]),
            PodPhase::Running,
            ("True", ""),
        ),
    ];
    for (i, (spec, statuses, phase, want)) in cases.into_iter().enumerate() {
        let p = pod(spec);
        let ctx = GenerateContext {
            pod: &p,
            old_status: &PodStatus::default(),
            gates: &gates,
        };
        let c = pod_initialized_condition(&ctx, statuses.as_deref(), &phase);
        assert_eq!(c.type_, "Initialized");
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref().unwrap_or("")),
            want,
            "case {i}"
        );
    }
}

#[test]
fn g3_initialized_message_lists_unknown_then_incomplete() {
    let gates = FeatureGates::default();
    let p = pod(spec_with(&["a", "b", "c"], &[]));
    let ctx = GenerateContext {
        pod: &p,
        old_status: &PodStatus::default(),
        gates: &gates,
    };
    let c = pod_initialized_condition(&ctx, Some(&[unready("b")]), &PodPhase::Pending);
    check(
        &c,
        "Initialized",
        "False",
        CONTAINERS_NOT_INITIALIZED,
        "containers with unknown status: [a c], containers with incomplete status: [b]",
    );
}

#[test]
fn g3_initialized_pod_stays_initialized_with_restart_all_gate() {
    let p = pod(spec_with(&["a"], &["c"]));
    let old = PodStatus {
        conditions: Some(vec![cond("Initialized", "True")]),
        ..Default::default()
    };
    let on = FeatureGates {
        restart_all_containers_on_container_exits: true,
        ..FeatureGates::default()
    };
    let ctx = GenerateContext {
        pod: &p,
        old_status: &old,
        gates: &on,
    };
    assert_eq!(
        pod_initialized_condition(&ctx, Some(&[unready("a")]), &PodPhase::Running).status,
        "True"
    );
    let off = FeatureGates::default();
    let ctx = GenerateContext {
        pod: &p,
        old_status: &old,
        gates: &off,
    };
    assert_eq!(
        pod_initialized_condition(&ctx, Some(&[unready("a")]), &PodPhase::Running).status,
        "False"
    );
}

#[test]
fn test_generate_pod_ready_to_start_containers_condition() {
    let gates = FeatureGates::default();
    let p = pod(PodSpec::default());
    let ctx = GenerateContext {
        pod: &p,
        old_status: &PodStatus::default(),
        gates: &gates,
    };
    let sandbox = |ready: bool, ip: Option<&str>| SandboxStatus {
        ready,
        network_namespace: NamespaceMode::Pod,
        ip: ip.map(str::to_owned),
    };
    for (sandboxes, want) in [
        (vec![], "False"),
        (vec![sandbox(false, Some("10.0.0.10"))], "False"),
        (vec![sandbox(true, None)], "False"),
        (vec![sandbox(true, Some("10.0.0.10"))], "True"),
        (
            vec![
                sandbox(true, Some("10.0.0.10")),
                sandbox(true, Some("10.0.0.11")),
            ],
            "False",
        ),
    ] {
        let c = pod_ready_to_start_containers_condition(&ctx, &sandboxes);
        assert_eq!(
            (c.type_.as_str(), c.status.as_str()),
            ("PodReadyToStartContainers", want),
            "{sandboxes:?}"
        );
    }
    let host = pod(PodSpec {
        host_network: Some(true),
        ..Default::default()
    });
    let ctx = GenerateContext {
        pod: &host,
        old_status: &PodStatus::default(),
        gates: &gates,
    };
    assert_eq!(
        pod_ready_to_start_containers_condition(&ctx, &[sandbox(true, None)]).status,
        "False",
        "host network pod in a pod netns"
    );
    let node = SandboxStatus {
        ready: true,
        network_namespace: NamespaceMode::Node,
        ip: None,
    };
    assert_eq!(
        pod_ready_to_start_containers_condition(&ctx, &[node]).status,
        "True"
    );
}

#[test]
fn test_generate_all_containers_restarting_condition() {
    use RestartAllState::*;
    let table = [
        (NotRequested, PodPhase::Pending, ("False", "", "")),
        (InProgress, PodPhase::Failed, ("False", POD_FAILED, "")),
        (
            InProgress,
            PodPhase::Succeeded,
            ("False", POD_COMPLETED, ""),
        ),
        (
            InProgress,
            PodPhase::Running,
            (
                "True",
                RESTART_ALL_CONTAINERS_STARTED,
                "container exited with restart policy rule",
            ),
        ),
        (CleanedUp, PodPhase::Pending, ("False", "", "")),
    ];
    for (state, phase, want) in table {
        let c = all_containers_restarting_condition(state, &phase);
        check(&c, "AllContainersRestarting", want.0, want.1, want.2);
        assert_eq!(c.observed_generation, None);
    }
}

#[test]
fn section33_generated_conditions_carry_observed_generation() {
    let mut p = pod(spec_with(&[], &["a"]));
    p.metadata.generation = Some(7);
    let on = FeatureGates::default();
    let ctx = GenerateContext {
        pod: &p,
        old_status: &PodStatus::default(),
        gates: &on,
    };
    assert_eq!(
        containers_ready_condition(&ctx, Some(&[ready("a")]), &PodPhase::Running)
            .observed_generation,
        Some(7)
    );
    assert_eq!(
        pod_ready_condition(&ctx, &[], Some(&[]), &PodPhase::Running).observed_generation,
        Some(7)
    );
    let off = FeatureGates {
        pod_observed_generation_tracking: false,
        ..on
    };
    let ctx = GenerateContext {
        pod: &p,
        old_status: &PodStatus::default(),
        gates: &off,
    };
    assert_eq!(
        containers_ready_condition(&ctx, Some(&[ready("a")]), &PodPhase::Running)
            .observed_generation,
        None
    );
    let old = PodStatus {
        conditions: Some(vec![PodCondition {
            observed_generation: Some(3),
            ..cond("ContainersReady", "True")
        }]),
        ..Default::default()
    };
    let ctx = GenerateContext {
        pod: &p,
        old_status: &old,
        gates: &off,
    };
    assert_eq!(
        containers_ready_condition(&ctx, Some(&[ready("a")]), &PodPhase::Running)
            .observed_generation,
        Some(7)
    );
}

fn reconcile_pod(ready_condition: PodCondition, gate_status: Option<&str>) -> Pod {
    let mut p = pod(gated(&["gate1"], &["c"]));
    let mut conditions = vec![ready_condition];
    if let Some(s) = gate_status {
        conditions.push(cond("gate1", s));
    }
    p.status = Some(PodStatus {
        phase: Some("Running".into()),
        conditions: Some(conditions),
        container_statuses: Some(vec![ready("c")]),
        ..Default::default()
    });
    p
}

#[test]
fn g7_need_to_reconcile_pod_readiness() {
    let gates = FeatureGates::default();
    assert!(
        !need_to_reconcile_pod_readiness(&pod(spec_with(&[], &["c"])), &gates),
        "no gates"
    );
    assert!(!need_to_reconcile_pod_readiness(
        &reconcile_pod(cond("Ready", "True"), Some("True")),
        &gates
    ));
    assert!(need_to_reconcile_pod_readiness(
        &reconcile_pod(cond("Ready", "True"), Some("False")),
        &gates
    ));
    let stale_message = PodCondition {
        message: Some(
            "corresponding condition of pod readiness gate \"gate1\" does not exist.".into(),
        ),
        ..cond("Ready", "False")
    };
    assert!(
        need_to_reconcile_pod_readiness(&reconcile_pod(stale_message, Some("False")), &gates),
        "message differs (#75523)"
    );
}

#[test]
fn g7_sidecars_do_not_cause_a_perpetual_reconcile() {
    let gates = FeatureGates::default();
    let mut p = pod(PodSpec {
        readiness_gates: Some(vec![PodReadinessGate {
            condition_type: "gate1".into(),
        }]),
        ..sidecar_spec(&["side"], &["c"])
    });
    p.status = Some(PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![cond("Ready", "True"), cond("gate1", "True")]),
        init_container_statuses: Some(vec![ready("side")]),
        container_statuses: Some(vec![ready("c")]),
        ..Default::default()
    });
    assert!(!need_to_reconcile_pod_readiness(&p, &gates));
}
