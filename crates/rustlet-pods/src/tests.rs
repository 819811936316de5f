//! Tests of API status generation (S4-S12) and the simulated runtime. The workers are tested
//! through the binary (`tests/agent`).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodStatus,
};
use rustlet_core::FeatureGates;
use rustlet_core::pod::PodPhase;

use crate::runtime::{ContainerKind, InstanceState, Runtime, RuntimePodStatus};
use crate::simulated::{SimulatedConfig, SimulatedRuntime, simulated_exit};
use crate::status::{ContainerProbes, StatusInput, WaitingReason, generate_api_status, get_phase};

fn pod(restart_policy: &str, init: &[&str], containers: &[&str]) -> Pod {
    let list = |names: &[&str]| {
        names
            .iter()
            .map(|n| serde_json::json!({"name": n, "image": "busybox"}))
            .collect::<Vec<_>>()
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p",
                     "annotations": {}},
        "spec": {"restartPolicy": restart_policy,
                 "initContainers": list(init),
                 "containers": list(containers)}
    }))
    .unwrap()
}

fn running(name: &str) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn exited(name: &str, code: i32) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn waiting(name: &str, last_exit: Option<i32>) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(ContainerState {
            waiting: Some(ContainerStateWaiting::default()),
            ..Default::default()
        }),
        last_state: last_exit.map(|code| ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn s4_get_phase_follows_upstreams_table() {
    let p = pod("Always", &[], &["a", "b"]);
    assert_eq!(
        get_phase(&p, &[], &[running("a"), running("b")], false, false),
        PodPhase::Running
    );
    assert_eq!(
        get_phase(&p, &[], &[running("a")], false, false),
        PodPhase::Pending,
        "b unknown"
    );
    assert_eq!(
        get_phase(&p, &[], &[running("a"), waiting("b", None)], false, false),
        PodPhase::Pending,
        "running can revert to pending"
    );
    assert_eq!(
        get_phase(
            &p,
            &[],
            &[exited("a", 1), waiting("b", Some(1))],
            false,
            false
        ),
        PodPhase::Running,
        "Always: stopped containers restart"
    );
    assert_eq!(
        get_phase(&p, &[], &[exited("a", 0), exited("b", 1)], true, false),
        PodPhase::Failed,
        "terminal: Failed unless every container succeeded"
    );
    let never = pod("Never", &[], &["a"]);
    assert_eq!(
        get_phase(&never, &[], &[exited("a", 0)], false, false),
        PodPhase::Succeeded
    );
    assert_eq!(
        get_phase(&never, &[], &[exited("a", 2)], false, false),
        PodPhase::Failed
    );
    let on_failure = pod("OnFailure", &[], &["a"]);
    assert_eq!(
        get_phase(&on_failure, &[], &[exited("a", 2)], false, false),
        PodPhase::Running
    );
    assert_eq!(
        get_phase(&on_failure, &[], &[exited("a", 0)], false, false),
        PodPhase::Succeeded
    );
}

#[test]
fn s4_init_containers_hold_the_pod_pending_and_a_failed_one_fails_a_never_pod() {
    let p = pod("Always", &["i"], &["a"]);
    assert_eq!(get_phase(&p, &[], &[], false, false), PodPhase::Pending);
    assert_eq!(
        get_phase(&p, &[running("i")], &[waiting("a", None)], false, false),
        PodPhase::Pending
    );
    assert_eq!(
        get_phase(&p, &[exited("i", 0)], &[running("a")], false, false),
        PodPhase::Running
    );
    let never = pod("Never", &["i"], &["a"]);
    assert_eq!(
        get_phase(
            &never,
            &[exited("i", 1)],
            &[waiting("a", None)],
            false,
            false
        ),
        PodPhase::Failed
    );
    assert_eq!(
        get_phase(&p, &[exited("i", 1)], &[waiting("a", None)], false, false),
        PodPhase::Pending,
        "Always: the init container is retried"
    );
}

static NO_PROBES: std::sync::LazyLock<HashMap<String, ContainerProbes>> =
    std::sync::LazyLock::new(HashMap::new);

fn input<'a>(
    pod: &'a Pod,
    runtime: &'a RuntimePodStatus,
    old: &'a PodStatus,
    waiting: &'a HashMap<String, WaitingReason>,
    gates: &'a FeatureGates,
) -> StatusInput<'a> {
    StatusInput {
        pod,
        runtime,
        old,
        pod_is_terminal: false,
        host_ips: &[],
        waiting,
        gates,
        probes: &NO_PROBES,
        evict: None,
        runtime_supports_rro: false,
    }
}

#[test]
fn s9_containers_wait_in_container_creating_or_pod_initializing_before_the_runtime_has_them() {
    let gates = FeatureGates::default();
    let (runtime, old, none) = (
        RuntimePodStatus::default(),
        PodStatus::default(),
        HashMap::new(),
    );
    let plain = pod("Always", &[], &["a"]);
    let status = generate_api_status(&input(&plain, &runtime, &old, &none, &gates));
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    let reason = |s: &PodStatus, list: fn(&PodStatus) -> &Option<Vec<ContainerStatus>>| {
        list(s).as_ref().unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .reason
            .clone()
    };
    assert_eq!(
        reason(&status, |s| &s.container_statuses).as_deref(),
        Some("ContainerCreating")
    );
    let with_init = pod("Always", &["i"], &["a"]);
    let status = generate_api_status(&input(&with_init, &runtime, &old, &none, &gates));
    assert_eq!(
        reason(&status, |s| &s.container_statuses).as_deref(),
        Some("PodInitializing")
    );
    assert_eq!(
        reason(&status, |s| &s.init_container_statuses).as_deref(),
        Some("PodInitializing")
    );
    let types: Vec<_> = status
        .conditions
        .unwrap()
        .iter()
        .map(|c| (c.type_.clone(), c.status.clone()))
        .collect();
    assert!(
        types.contains(&("PodScheduled".into(), "True".into())),
        "{types:?}"
    );
    assert!(
        types.contains(&("Ready".into(), "False".into())),
        "{types:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn s11_s12_a_crash_loop_shows_the_exit_as_last_state_under_crash_loop_back_off() {
    let runtime = SimulatedRuntime::new(SimulatedConfig::default());
    let mut p = pod("Always", &[], &["a"]);
    p.metadata.annotations = Some(
        [
            ("rustlet.io/simulate-exit-after".to_owned(), "1".to_owned()),
            ("rustlet.io/simulate-exit-code".to_owned(), "3".to_owned()),
        ]
        .into_iter()
        .collect(),
    );
    let container = p.spec.as_ref().unwrap().containers[0].clone();
    runtime.run_pod_sandbox(&p).await.unwrap();
    runtime
        .start_container(&p, &container, ContainerKind::Regular, &[])
        .await
        .unwrap();
    let uid = rustlet_core::PodUid::of(&p);
    let due = runtime.next_change(&uid).expect("an exit is scheduled");
    tokio::time::sleep_until(due).await;
    let status = runtime.pod_status(&uid).await;
    assert!(matches!(
        status.containers[0].state,
        InstanceState::Exited { exit_code: 3, .. }
    ));
    assert_eq!(runtime.next_change(&uid), None);

    let gates = FeatureGates::default();
    let old = PodStatus::default();
    let waiting: HashMap<String, WaitingReason> = [(
        "a".to_owned(),
        WaitingReason {
            reason: "CrashLoopBackOff".into(),
            message: "back-off 10s".into(),
        },
    )]
    .into_iter()
    .collect();
    let api = generate_api_status(&input(&p, &status, &old, &waiting, &gates));
    let a = &api.container_statuses.unwrap()[0];
    assert_eq!(
        a.state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("CrashLoopBackOff")
    );
    assert_eq!(
        a.last_state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        3
    );
    assert!(!a.ready);
    assert_eq!(
        api.phase.as_deref(),
        Some("Running"),
        "a restarting pod runs"
    );

    // The restart: a second instance, the first becomes lastState; two are kept per name.
    for _ in 0..3 {
        runtime
            .start_container(&p, &container, ContainerKind::Regular, &[])
            .await
            .unwrap();
    }
    let status = runtime.pod_status(&uid).await;
    assert_eq!(status.containers.len(), 2);
    assert_eq!(status.containers[0].attempt, 3);
}

#[test]
fn s5_a_terminal_phase_never_goes_back() {
    let gates = FeatureGates::default();
    let runtime = RuntimePodStatus::default();
    let old = PodStatus {
        phase: Some("Failed".into()),
        container_statuses: Some(vec![exited("a", 1)]),
        ..Default::default()
    };
    let none = HashMap::new();
    let p = pod("Always", &[], &["a"]);
    let status = generate_api_status(&input(&p, &runtime, &old, &none, &gates));
    assert_eq!(status.phase.as_deref(), Some("Failed"));
}

#[test]
fn simulated_exit_annotations_are_checked() {
    let mut p = pod("Never", &[], &["a"]);
    assert_eq!(simulated_exit(&p), Ok(None));
    let annotations = p.metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert("rustlet.io/simulate-exit-after".into(), "2.5".into());
    assert_eq!(
        simulated_exit(&p),
        Ok(Some((Duration::from_millis(2500), 0)))
    );
    for (key, value) in [
        ("rustlet.io/simulate-exit-after", "soon"),
        ("rustlet.io/simulate-exit-after", "-1"),
        ("rustlet.io/simulate-exit-code", "x"),
    ] {
        let mut bad = p.clone();
        bad.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(key.into(), value.into());
        let err = simulated_exit(&bad).unwrap_err();
        assert!(err.contains(key), "{err}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_kill_stops_every_container_and_the_sandbox() {
    let runtime = SimulatedRuntime::new(SimulatedConfig::default());
    let p = pod("Always", &["i"], &["a"]);
    let spec = p.spec.clone().unwrap();
    let sandbox = runtime.run_pod_sandbox(&p).await.unwrap();
    assert_eq!(sandbox.ip.as_deref(), Some("10.88.0.2"));
    runtime
        .start_container(
            &p,
            &spec.init_containers.unwrap()[0],
            ContainerKind::Init,
            &[],
        )
        .await
        .unwrap();
    runtime
        .start_container(&p, &spec.containers[0], ContainerKind::Regular, &[])
        .await
        .unwrap();
    let uid = rustlet_core::PodUid::of(&p);
    assert!(runtime.pod_status(&uid).await.any_running());
    runtime.kill_pod(&p, Duration::from_secs(30)).await.unwrap();
    let status = runtime.pod_status(&uid).await;
    assert!(!status.any_running());
    assert!(!status.sandbox.unwrap().ready);
    let err = runtime
        .start_container(&p, &spec.containers[0], ContainerKind::Regular, &[])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no ready sandbox"), "{err}");
}

/// The simulated runtime checks its mounts as a real CreateContainer would: a bind source that
/// does not exist fails the start, naming the mount.
#[tokio::test(start_paused = true)]
async fn a_container_whose_mount_source_is_missing_does_not_start() {
    use rustlet_volume::subpath::ContainerMount;
    let runtime = SimulatedRuntime::new(SimulatedConfig::default());
    let p = pod("Always", &[], &["a"]);
    let container = p.spec.as_ref().unwrap().containers[0].clone();
    runtime.run_pod_sandbox(&p).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let present = ContainerMount {
        name: "data".into(),
        container_path: "/data".into(),
        host_path: dir.path().to_owned(),
        read_only: false,
        recursive_read_only: false,
        propagation: Default::default(),
    };
    let missing = ContainerMount {
        host_path: dir.path().join("gone"),
        container_path: "/gone".into(),
        ..present.clone()
    };
    let err = runtime
        .start_container(
            &p,
            &container,
            ContainerKind::Regular,
            &[present.clone(), missing],
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("\"/gone\""), "{err}");
    assert!(
        runtime
            .pod_status(&rustlet_core::PodUid::of(&p))
            .await
            .containers
            .is_empty()
    );
    runtime
        .start_container(&p, &container, ContainerKind::Regular, &[present])
        .await
        .unwrap();
}

#[tokio::test]
async fn b10_started_and_ready_follow_the_startup_and_readiness_results() {
    let runtime = SimulatedRuntime::new(SimulatedConfig::default());
    let p = pod("Always", &[], &["a"]);
    let container = p.spec.as_ref().unwrap().containers[0].clone();
    runtime.run_pod_sandbox(&p).await.unwrap();
    runtime
        .start_container(&p, &container, ContainerKind::Regular, &[])
        .await
        .unwrap();
    let status = runtime.pod_status(&rustlet_core::PodUid::of(&p)).await;
    let (gates, old, none) = (
        FeatureGates::default(),
        PodStatus::default(),
        HashMap::new(),
    );
    let with = |probes: ContainerProbes| {
        let map = HashMap::from([("a".to_owned(), probes)]);
        let api = generate_api_status(&StatusInput {
            probes: &map,
            ..input(&p, &status, &old, &none, &gates)
        });
        let a = api.container_statuses.unwrap()[0].clone();
        (a.started, a.ready)
    };
    // No probe workers: running is started and ready.
    assert_eq!(with(ContainerProbes::default()), (Some(true), true));
    // A startup probe that has not passed: neither started nor ready, whatever readiness says.
    let not_started = ContainerProbes {
        startup: Some(false),
        readiness: Some(true),
    };
    assert_eq!(with(not_started), (Some(false), false));
    // Started; readiness decides `ready`.
    let unready = ContainerProbes {
        startup: Some(true),
        readiness: Some(false),
    };
    assert_eq!(with(unready), (Some(true), false));
    let ready = ContainerProbes {
        startup: None,
        readiness: Some(true),
    };
    assert_eq!(with(ready), (Some(true), true));
}

fn instance(name: &str, sandbox: &str, state: InstanceState) -> crate::runtime::ContainerInstance {
    crate::runtime::ContainerInstance {
        id: format!("simulated://{name}-{sandbox}"),
        name: name.into(),
        kind: ContainerKind::Regular,
        image: "busybox".into(),
        image_id: "busybox".into(),
        attempt: 0,
        state,
        sandbox_id: sandbox.into(),
        hash: None,
    }
}

fn exited_instance(code: i32) -> InstanceState {
    InstanceState::Exited {
        started_at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        finished_at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        exit_code: code,
        reason: if code == 0 { "Completed" } else { "Error" }.into(),
        message: String::new(),
    }
}

fn sandbox(id: &str, ready: bool) -> Option<crate::runtime::Sandbox> {
    Some(crate::runtime::Sandbox {
        id: id.into(),
        ready,
        host_network: false,
        ip: Some("10.88.0.2".into()),
    })
}

/// Item 8 (S11): an instance in an unknown state that the old status showed running is
/// terminated with upstream's `ContainerStatusUnknown`, exit code 137, one restart more; one
/// that never ran waits without a reason. A run-once pod with it fails.
#[test]
fn s11_an_unknown_instance_that_ran_is_container_status_unknown_with_exit_code_137() {
    let gates = FeatureGates::default();
    let p = pod("Never", &[], &["a"]);
    let runtime = RuntimePodStatus {
        sandbox: sandbox("s1", true),
        containers: vec![instance("a", "s1", InstanceState::Unknown)],
    };
    let old = PodStatus {
        container_statuses: Some(vec![ContainerStatus {
            restart_count: 2,
            ..running("a")
        }]),
        ..Default::default()
    };
    let none = HashMap::new();
    let api = generate_api_status(&input(&p, &runtime, &old, &none, &gates));
    let a = &api.container_statuses.as_ref().unwrap()[0];
    let terminated = a.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(terminated.exit_code, 137);
    assert_eq!(terminated.reason.as_deref(), Some("ContainerStatusUnknown"));
    assert_eq!(
        terminated.message.as_deref(),
        Some("The container could not be located when the pod was terminated")
    );
    assert_eq!(a.restart_count, 3);
    assert_eq!(api.phase.as_deref(), Some("Failed"), "never Succeeded");

    let never_ran = generate_api_status(&input(&p, &runtime, &PodStatus::default(), &none, &gates));
    let a = &never_ran.container_statuses.as_ref().unwrap()[0];
    let waiting = a.state.as_ref().unwrap().waiting.as_ref().unwrap();
    assert_eq!(waiting.reason, None);
    assert_eq!(never_ran.phase.as_deref(), Some("Pending"));
}

/// Issue 27 (node features), upstream `TestActiveDeadlineHandler` and `generateAPIPodStatus`'s
/// `ShouldEvict`: a pod is past its deadline once `activeDeadlineSeconds` passed since its start
/// time (never without either), and then fails with `DeadlineExceeded`.
#[test]
fn test_active_deadline_handler_fails_the_pod_past_its_deadline() {
    use crate::status::{DEADLINE_EXCEEDED, past_active_deadline};
    let ts = |s: &str| s.parse::<k8s_openapi::jiff::Timestamp>().unwrap();
    let mut p = pod("Always", &[], &["a"]);
    let started = PodStatus {
        start_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts(
            "2026-12-03T10:00:00Z",
        ))),
        ..Default::default()
    };
    let at = |s: &str, p: &Pod, status: &PodStatus| past_active_deadline(p, status, ts(s));
    assert_eq!(
        at("2026-12-03T11:00:00Z", &p, &started),
        None,
        "no deadline"
    );
    p.spec.as_mut().unwrap().active_deadline_seconds = Some(30);
    assert_eq!(at("2026-12-03T10:00:29Z", &p, &started), None);
    assert_eq!(
        at("2026-12-03T10:00:30Z", &p, &started),
        Some(DEADLINE_EXCEEDED)
    );
    assert_eq!(
        at("2026-12-03T11:00:00Z", &p, &PodStatus::default()),
        None,
        "no start time"
    );

    let gates = FeatureGates::default();
    let runtime = RuntimePodStatus {
        sandbox: sandbox("s1", true),
        containers: vec![instance(
            "a",
            "s1",
            InstanceState::Running {
                started_at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            },
        )],
    };
    let none = HashMap::new();
    let api = generate_api_status(&StatusInput {
        evict: Some(DEADLINE_EXCEEDED),
        ..input(&p, &runtime, &started, &none, &gates)
    });
    assert_eq!(api.phase.as_deref(), Some("Failed"));
    assert_eq!(api.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        api.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
}

/// Issue 27 (node features), upstream `convertToAPIContainerStatuses`: an exited instance's
/// termination message is its terminated state's `message`; none when empty.
#[test]
fn an_exited_instances_termination_message_is_its_terminated_message() {
    let gates = FeatureGates::default();
    let p = pod("Never", &[], &["a", "b"]);
    let with_message = InstanceState::Exited {
        started_at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        finished_at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        exit_code: 1,
        reason: "Error".into(),
        message: "DONE".into(),
    };
    let runtime = RuntimePodStatus {
        sandbox: sandbox("s1", true),
        containers: vec![
            instance("a", "s1", with_message),
            instance("b", "s1", exited_instance(0)),
        ],
    };
    let none = HashMap::new();
    let api = generate_api_status(&input(&p, &runtime, &PodStatus::default(), &none, &gates));
    let message = |i: usize| {
        let status = &api.container_statuses.as_ref().unwrap()[i];
        let state = status.state.as_ref().unwrap();
        state.terminated.as_ref().unwrap().message.clone()
    };
    assert_eq!(message(0).as_deref(), Some("DONE"));
    assert_eq!(message(1), None);
}

/// Upstream `TestComputePodActions` "Kill pod and do not restart ok-ed containers if
/// RestartPolicy == Never" (C8): a run-once pod whose sandbox died is killed, not given a new
/// sandbox.
#[test]
fn test_compute_pod_actions_a_never_pod_whose_sandbox_died_gets_no_new_one() {
    use crate::actions::{NoProbes, compute_pod_actions};
    let p = pod("Never", &["i"], &["a", "b"]);
    let runtime = RuntimePodStatus {
        sandbox: sandbox("s1", false),
        containers: vec![
            instance("a", "s1", exited_instance(0)),
            instance("i", "s1", exited_instance(0)),
        ],
    };
    let actions = compute_pod_actions(&p, &runtime, &NoProbes);
    assert!(actions.kill_pod);
    assert!(!actions.create_sandbox);
    assert!(actions.init_to_start.is_empty());
    assert!(actions.start.is_empty());
}

/// Upstream `TestComputePodActionsWithInitContainers` "Pod sandbox not ready, init container
/// failed, but RestartPolicy == Always; kill pod and restart the first init container" and
/// "Init containers succeeded; kill pod and restart the first init container if the sandbox is
/// not ready" (C8, C13); then, in the new sandbox, the old sandbox's init instances do not
/// count.
#[test]
fn test_compute_pod_actions_with_init_containers_a_new_sandbox_runs_them_again() {
    use crate::actions::{NoProbes, compute_pod_actions};
    let p = pod("Always", &["i1", "i2"], &["a"]);
    let mut runtime = RuntimePodStatus {
        sandbox: sandbox("s1", false),
        containers: vec![
            instance("a", "s1", exited_instance(137)),
            instance("i2", "s1", exited_instance(0)),
            instance("i1", "s1", exited_instance(0)),
        ],
    };
    let actions = compute_pod_actions(&p, &runtime, &NoProbes);
    assert!(actions.kill_pod && actions.create_sandbox && actions.sandbox_changed);
    assert_eq!(actions.init_to_start, [0]);
    assert!(actions.start.is_empty(), "the regular containers wait");

    runtime.sandbox = sandbox("s2", true);
    let actions = compute_pod_actions(&p, &runtime, &NoProbes);
    assert!(!actions.kill_pod && !actions.create_sandbox);
    assert_eq!(actions.init_to_start, [0], "i1 ran in s1, not in s2");

    runtime
        .containers
        .insert(0, instance("i1", "s2", exited_instance(0)));
    let actions = compute_pod_actions(&p, &runtime, &NoProbes);
    assert_eq!(actions.init_to_start, [1]);

    runtime
        .containers
        .insert(0, instance("i2", "s2", exited_instance(0)));
    let actions = compute_pod_actions(&p, &runtime, &NoProbes);
    assert!(actions.init_to_start.is_empty());
    assert_eq!(actions.start, [0], "initialized: the container restarts");
}

/// Upstream `TestComputePodActionsWithInitContainers` "an init container is in the unknown
/// state; kill and restart it" and `TestComputePodActions` "Kill and recreate the container if
/// the container is in unknown state" (C10, C11).
#[test]
fn test_compute_pod_actions_an_unknown_container_is_killed_and_restarted() {
    use crate::actions::{KillReason, NoProbes, compute_pod_actions};
    let p = pod("Never", &["i"], &["a"]);
    let runtime = RuntimePodStatus {
        sandbox: sandbox("s1", true),
        containers: vec![instance("i", "s1", InstanceState::Unknown)],
    };
    let actions = compute_pod_actions(&p, &runtime, &NoProbes);
    assert!(
        actions.kill_pod,
        "Never: a failed init container ends the pod"
    );
    let always = pod("Always", &["i"], &["a"]);
    let actions = compute_pod_actions(&always, &runtime, &NoProbes);
    assert_eq!(actions.init_to_start, [0]);
    assert_eq!(actions.kill.len(), 1);
    assert_eq!(actions.kill[0].reason, KillReason::Unknown);

    let plain = pod("Never", &[], &["a"]);
    let runtime = RuntimePodStatus {
        sandbox: sandbox("s1", true),
        containers: vec![instance("a", "s1", InstanceState::Unknown)],
    };
    let actions = compute_pod_actions(&plain, &runtime, &NoProbes);
    assert_eq!(
        actions.start,
        [0],
        "an unknown container restarts whatever the policy"
    );
    assert_eq!(actions.kill.len(), 1);
    assert_eq!(
        actions.kill[0].message,
        "Container is in \"Unknown\" state, try killing it before restart"
    );
}

/// Issue 25 item 2: the simulated runtime is ready, its network too, and it reports the
/// agent's version (the node's `containerRuntimeVersion` is `simulated://<version>`).
#[tokio::test]
async fn the_simulated_runtime_is_ready_and_names_its_version() {
    use rustlet_core::node_status::{RuntimeReadiness, runtime_readiness};

    let runtime = SimulatedRuntime::new(SimulatedConfig::default());
    assert_eq!(runtime.name(), "simulated");
    assert_eq!(runtime.version().await.unwrap(), env!("CARGO_PKG_VERSION"));
    let conditions = runtime.status().await.unwrap();
    assert_eq!(runtime_readiness(&conditions), RuntimeReadiness::default());
}

/// Issue 26 item 5: the simulated runtime's stats are its running pods and containers, named
/// as the pod, using nothing; an exited container and a killed pod have none.
#[tokio::test(start_paused = true)]
async fn the_simulated_runtime_reports_its_running_pods_using_nothing() {
    let runtime = SimulatedRuntime::new(SimulatedConfig::default());
    let mut p = pod("Never", &[], &["a", "b"]);
    p.metadata.annotations = Some(
        [("rustlet.io/simulate-exit-after".to_owned(), "5".to_owned())]
            .into_iter()
            .collect(),
    );
    runtime.run_pod_sandbox(&p).await.unwrap();
    let a = p.spec.as_ref().unwrap().containers[0].clone();
    runtime
        .start_container(&p, &a, ContainerKind::Regular, &[])
        .await
        .unwrap();
    let usage = runtime.pod_usage().await.unwrap();
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0].uid, rustlet_core::PodUid::of(&p));
    assert_eq!(usage[0].name, p.metadata.name.clone().unwrap());
    let names: Vec<&str> = usage[0]
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["a"]);
    assert_eq!(
        usage[0].containers[0].cpu.unwrap().usage_core_nanos,
        Some(0)
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(runtime.pod_usage().await.unwrap()[0].containers.is_empty());
    runtime.kill_pod(&p, Duration::ZERO).await.unwrap();
    assert!(runtime.pod_usage().await.unwrap().is_empty());
}

/// `pod` with these ephemeral containers (added through the `ephemeralcontainers`
/// subresource, as `kubectl debug` does).
fn with_ephemeral(mut pod: Pod, names: &[&str]) -> Pod {
    pod.spec.as_mut().unwrap().ephemeral_containers = Some(
        names
            .iter()
            .map(|n| k8s_openapi::api::core::v1::EphemeralContainer {
                name: (*n).into(),
                image: Some("busybox".into()),
                tty: Some(true),
                stdin: Some(true),
                ..Default::default()
            })
            .collect(),
    );
    pod
}

/// Upstream `TestComputePodActionsWithInitAndEphemeralContainers` "Create a new ephemeral
/// container", "Ephemeral container is in unknown state; leave it alone", "Ephemeral container
/// exited; do not restart": an ephemeral container starts once, even while an init container
/// runs, and whatever becomes of its instance it is never started again; a new sandbox runs
/// the pod afresh without it.
#[test]
fn test_compute_pod_actions_with_ephemeral_containers_starts_each_once() {
    use crate::actions::{NoProbes, compute_pod_actions};
    let p = with_ephemeral(pod("Always", &["i"], &["a"]), &["debugger", "other"]);
    // Initialization goes on: the ephemeral containers start anyway.
    let mut runtime = RuntimePodStatus {
        sandbox: sandbox("s1", true),
        containers: vec![instance("i", "s1", InstanceState::Created)],
    };
    runtime.containers[0].state = InstanceState::Running {
        started_at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    };
    let actions = compute_pod_actions(&p, &runtime, &NoProbes);
    assert_eq!(actions.ephemeral, [0, 1]);
    assert!(actions.init_to_start.is_empty(), "the init container runs");

    // Initialized, `a` running: only what never had an instance starts.
    runtime.containers = vec![
        instance(
            "a",
            "s1",
            InstanceState::Running {
                started_at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            },
        ),
        instance("debugger", "s1", exited_instance(1)),
        instance("i", "s1", exited_instance(0)),
    ];
    let actions = compute_pod_actions(&p, &runtime, &NoProbes);
    assert_eq!(actions.ephemeral, [1], "debugger exited: never restarted");
    assert!(actions.start.is_empty() && actions.kill.is_empty() && !actions.kill_pod);

    runtime
        .containers
        .push(instance("other", "s1", InstanceState::Unknown));
    let actions = compute_pod_actions(&p, &runtime, &NoProbes);
    assert!(actions.ephemeral.is_empty(), "an unknown one is left alone");
    assert!(actions.kill.is_empty());

    // The sandbox died: a new one for the pod's own containers, none of the ephemeral ones.
    runtime.sandbox = sandbox("s1", false);
    let actions = compute_pod_actions(&p, &runtime, &NoProbes);
    assert!(actions.create_sandbox);
    assert!(actions.ephemeral.is_empty());
}

/// Upstream `generateAPIPodStatus`'s `EphemeralContainerStatuses`
/// (`convertToAPIContainerStatuses` over the ephemeral containers): each ephemeral container
/// has a status, waiting until its instance runs, never ready and without `started` (the probe
/// manager sets those of regular and init containers only), sorted by name; they count in no
/// phase or condition.
#[test]
fn ephemeral_container_statuses_follow_their_instances_and_count_in_no_condition() {
    let gates = FeatureGates::default();
    let p = with_ephemeral(pod("Always", &[], &["a"]), &["zz-debugger", "debugger"]);
    let mut debugger = instance(
        "debugger",
        "s1",
        InstanceState::Running {
            started_at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        },
    );
    debugger.kind = ContainerKind::Ephemeral;
    let runtime = RuntimePodStatus {
        sandbox: sandbox("s1", true),
        containers: vec![
            debugger,
            instance(
                "a",
                "s1",
                InstanceState::Running {
                    started_at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                },
            ),
        ],
    };
    let (old, none) = (PodStatus::default(), HashMap::new());
    let status = generate_api_status(&input(&p, &runtime, &old, &none, &gates));
    let ephemeral = status.ephemeral_container_statuses.clone().unwrap();
    let names: Vec<&str> = ephemeral.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["debugger", "zz-debugger"]);
    let running = &ephemeral[0];
    assert!(
        running.state.as_ref().unwrap().running.is_some(),
        "{running:?}"
    );
    assert_eq!(
        running.container_id.as_deref(),
        Some("simulated://debugger-s1")
    );
    assert!(!running.ready);
    assert_eq!(running.started, None);
    let waiting = &ephemeral[1];
    assert_eq!(
        waiting
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.as_deref()),
        Some("ContainerCreating")
    );
    // The pod is Running and Ready on its own container alone.
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let ready = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");
    assert_eq!(status.container_statuses.unwrap().len(), 1);

    // No ephemeral container: no list.
    let plain = pod("Always", &[], &["a"]);
    let status = generate_api_status(&input(&plain, &runtime, &old, &none, &gates));
    assert_eq!(status.ephemeral_container_statuses, None);
}

/// Issue 27 (node features), upstream `convertToAPIContainerStatuses` as "[sig-node] Mount
/// recursive read-only [LinuxOnly] ... should accept non-recursive read-only mounts" (and
/// "... should accept recursive read-only mounts") check it: each of the spec's mounts with
/// its name and path; a read-only one's `recursiveReadOnly` is `Enabled` only when it is
/// resolved to be, a writable one has none.
#[test]
fn container_statuses_report_volume_mounts_with_recursive_read_only() {
    use k8s_openapi::api::core::v1::VolumeMount;
    let mount = |path: &str, read_only: bool, rro: Option<&str>| VolumeMount {
        name: "mnt".into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        recursive_read_only: rro.map(str::to_owned),
        ..Default::default()
    };
    let mut p = pod("Never", &[], &["test"]);
    p.spec.as_mut().unwrap().containers[0].volume_mounts = Some(vec![
        mount("/mnt-rro", true, Some("Enabled")),
        mount("/mnt-rro-if-possible", true, Some("IfPossible")),
        mount("/mnt-rro-disabled", true, Some("Disabled")),
        mount("/mnt-ro", true, None),
        mount("/mnt-rw", false, None),
    ]);
    let (gates, runtime, old, none) = (
        FeatureGates::default(),
        RuntimePodStatus::default(),
        PodStatus::default(),
        HashMap::new(),
    );
    let mounts = |supported: bool| {
        let api = generate_api_status(&StatusInput {
            runtime_supports_rro: supported,
            ..input(&p, &runtime, &old, &none, &gates)
        });
        api.container_statuses.unwrap()[0]
            .volume_mounts
            .clone()
            .unwrap()
            .into_iter()
            .map(|m| {
                assert_eq!(m.name, "mnt");
                (m.mount_path, m.read_only, m.recursive_read_only)
            })
            .collect::<Vec<_>>()
    };
    let row = |path: &str, read_only: Option<bool>, rro: Option<&str>| {
        (path.to_owned(), read_only, rro.map(str::to_owned))
    };
    assert_eq!(
        mounts(false),
        [
            // `Enabled` cannot be resolved here: reported `Disabled` (the container waits).
            row("/mnt-rro", Some(true), Some("Disabled")),
            row("/mnt-rro-if-possible", Some(true), Some("Disabled")),
            row("/mnt-rro-disabled", Some(true), Some("Disabled")),
            row("/mnt-ro", Some(true), Some("Disabled")),
            row("/mnt-rw", None, None),
        ]
    );
    assert_eq!(
        mounts(true),
        [
            row("/mnt-rro", Some(true), Some("Enabled")),
            row("/mnt-rro-if-possible", Some(true), Some("Enabled")),
            row("/mnt-rro-disabled", Some(true), Some("Disabled")),
            row("/mnt-ro", Some(true), Some("Disabled")),
            row("/mnt-rw", None, None),
        ]
    );
}
