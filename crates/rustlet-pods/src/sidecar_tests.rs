//! Restartable init containers (sidecars): upstream's `computeInitContainerActions` cases of
//! `TestComputePodActionsWithRestartableInitContainers` and its phase and status rules
//! (`TestPodPhaseWithRestartAlwaysRestartableInitContainers`,
//! `TestPodPhaseWithRestartNeverRestartableInitContainers`, the prober's sidecar `started`).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodStatus,
};
use k8s_openapi::jiff::Timestamp;
use rustlet_core::FeatureGates;
use rustlet_core::pod::PodPhase;

use crate::actions::{KillReason, NoProbes, PodActions, ProbeFailures, compute_pod_actions};
use crate::prober::{ProbeKind, ProbeResult};
use crate::runtime::{ContainerInstance, ContainerKind, InstanceState, RuntimePodStatus, Sandbox};
use crate::status::{ContainerProbes, StatusInput, generate_api_status, get_phase};

/// A pod whose init containers named `side*` are sidecars.
fn pod(restart_policy: &str, init: &[&str], containers: &[&str]) -> Pod {
    let list = |names: &[&str]| {
        names
            .iter()
            .map(|n| {
                let mut c = serde_json::json!({"name": n, "image": "busybox"});
                if n.starts_with("side") {
                    c["restartPolicy"] = "Always".into();
                }
                c
            })
            .collect::<Vec<_>>()
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
        "spec": {"restartPolicy": restart_policy,
                 "initContainers": list(init),
                 "containers": list(containers)}
    }))
    .unwrap()
}

fn with_probe(mut pod: Pod, container: &str, kind: ProbeKind) -> Pod {
    let spec = pod.spec.as_mut().unwrap();
    let c = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(&mut spec.containers)
        .find(|c| c.name == container)
        .unwrap();
    let probe =
        Some(serde_json::from_value(serde_json::json!({"exec": {"command": ["true"]}})).unwrap());
    match kind {
        ProbeKind::Liveness => c.liveness_probe = probe,
        ProbeKind::Readiness => c.readiness_probe = probe,
        ProbeKind::Startup => c.startup_probe = probe,
    }
    pod
}

fn running() -> InstanceState {
    InstanceState::Running {
        started_at: Timestamp::UNIX_EPOCH,
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

fn id(name: &str) -> String {
    format!("simulated://{name}")
}

/// The runtime's report: a ready sandbox `s1` and these instances, newest first.
fn runtime(instances: &[(&str, InstanceState)]) -> RuntimePodStatus {
    RuntimePodStatus {
        sandbox: Some(Sandbox {
            id: "s1".into(),
            ready: true,
            host_network: false,
            ip: Some("10.88.0.2".into()),
        }),
        containers: instances
            .iter()
            .map(|(name, state)| ContainerInstance {
                id: id(name),
                name: (*name).into(),
                kind: if name.starts_with("side") || name.starts_with("init") {
                    ContainerKind::Init
                } else {
                    ContainerKind::Regular
                },
                image: "busybox".into(),
                image_id: "busybox".into(),
                attempt: 0,
                state: state.clone(),
                sandbox_id: "s1".into(),
                hash: None,
            })
            .collect(),
    }
}

/// Probe results by container name.
#[derive(Default)]
struct Results(HashMap<(String, ProbeKind), ProbeResult>);

impl Results {
    fn with(mut self, name: &str, kind: ProbeKind, result: ProbeResult) -> Self {
        self.0.insert((id(name), kind), result);
        self
    }
}

impl ProbeFailures for Results {
    fn result(&self, id: &str, kind: ProbeKind) -> Option<ProbeResult> {
        self.0.get(&(id.to_owned(), kind)).copied()
    }
}

fn actions(
    pod: &Pod,
    instances: &[(&str, InstanceState)],
    probes: &dyn ProbeFailures,
) -> PodActions {
    compute_pod_actions(pod, &runtime(instances), probes)
}

/// "an restartable init container is started; start the next init container" and "initialization
/// completed; start all containers": a running sidecar starts the next init container; the
/// regular containers start once the last one is done.
#[test]
fn test_compute_pod_actions_with_restartable_init_containers_a_running_sidecar_starts_the_next() {
    let p = pod("Always", &["side-1", "init-2"], &["a"]);
    let first = actions(&p, &[], &NoProbes);
    assert_eq!(first.init_to_start, [0]);
    assert!(first.start.is_empty());

    let next = actions(&p, &[("side-1", running())], &NoProbes);
    assert_eq!(next.init_to_start, [1], "the sidecar runs: init-2 starts");
    assert!(next.start.is_empty(), "the main container waits");

    let wait = actions(
        &p,
        &[("init-2", running()), ("side-1", running())],
        &NoProbes,
    );
    assert_eq!(wait, PodActions::default(), "init-2 runs: nothing to do");

    let done = actions(
        &p,
        &[("init-2", exited(0)), ("side-1", running())],
        &NoProbes,
    );
    assert!(done.init_to_start.is_empty());
    assert_eq!(done.start, [0], "initialized: the main container starts");
    assert!(!done.kill_pod);
}

/// "startupProbe has not been run; do nothing", "startupProbe has completed; start the next"
/// and "kill and recreate the restartable init container if the startup check has failed".
#[test]
fn test_compute_pod_actions_with_restartable_init_containers_the_startup_probe_gates_the_next() {
    let p = with_probe(
        pod("Always", &["side-1", "init-2"], &["a"]),
        "side-1",
        ProbeKind::Startup,
    );
    let state = [("side-1", running())];
    let waiting = actions(&p, &state, &Results::default());
    assert_eq!(
        waiting,
        PodActions::default(),
        "no startup result yet: wait"
    );

    let started = Results::default().with("side-1", ProbeKind::Startup, ProbeResult::Success);
    assert_eq!(actions(&p, &state, &started).init_to_start, [1]);

    let failed = Results::default().with("side-1", ProbeKind::Startup, ProbeResult::Failure);
    let restart = actions(&p, &state, &failed);
    assert_eq!(restart.init_to_start, [0], "restarted, init-2 still waits");
    assert_eq!(restart.kill.len(), 1);
    assert_eq!(restart.kill[0].reason, KillReason::Startup);
    assert_eq!(
        restart.kill[0].message,
        "Init container side-1 failed startup probe"
    );
}

/// "kill and recreate the restartable init container if the liveness check has failed" (after
/// initialization, the regular containers keep running) and "livenessProbe has not been run;
/// start the next" (its liveness does not hold back the next init container).
#[test]
fn test_compute_pod_actions_with_restartable_init_containers_a_liveness_failure_restarts_it() {
    let p = with_probe(
        pod("Always", &["side-1"], &["a"]),
        "side-1",
        ProbeKind::Liveness,
    );
    let state = [("a", running()), ("side-1", running())];
    let failed = Results::default().with("side-1", ProbeKind::Liveness, ProbeResult::Failure);
    let restart = actions(&p, &state, &failed);
    assert_eq!(restart.init_to_start, [0]);
    assert!(restart.start.is_empty(), "the main container keeps running");
    assert!(!restart.kill_pod);
    assert_eq!(restart.kill.len(), 1);
    assert_eq!(restart.kill[0].id, id("side-1"));
    assert_eq!(restart.kill[0].reason, KillReason::Liveness);
    assert_eq!(
        restart.kill[0].message,
        "Init container side-1 failed liveness probe"
    );

    let p = with_probe(
        pod("Always", &["side-1", "init-2"], &["a"]),
        "side-1",
        ProbeKind::Liveness,
    );
    let next = actions(&p, &[("side-1", running())], &Results::default());
    assert_eq!(next.init_to_start, [1]);
}

/// "initialization failed; restart the last restartable init container even if pod's
/// RestartPolicy == Never" and "restart restartable init container if regular containers are
/// running even if pod's RestartPolicy == Never": a sidecar that exits is restarted, during and
/// after the initialization, whatever the pod's policy.
#[test]
fn test_compute_pod_actions_with_restartable_init_containers_an_exited_sidecar_restarts_even_with_never()
 {
    let p = pod("Never", &["side-1", "init-2"], &["a"]);
    let during = actions(&p, &[("side-1", exited(1))], &NoProbes);
    assert_eq!(during.init_to_start, [0]);
    assert!(!during.kill_pod);

    let after = actions(
        &p,
        &[
            ("a", running()),
            ("init-2", exited(0)),
            ("side-1", exited(1)),
        ],
        &NoProbes,
    );
    assert_eq!(after.init_to_start, [0], "only the sidecar, not init-2");
    assert!(after.start.is_empty());
    assert!(!after.kill_pod);

    // Gone from the runtime after the initialization: started again.
    let gone = actions(&p, &[("a", running())], &NoProbes);
    assert_eq!(gone.init_to_start, [0]);
}

/// "restartable init container state unknown; kill and recreate the last restartable init
/// container even if pod's RestartPolicy == Never".
#[test]
fn test_compute_pod_actions_with_restartable_init_containers_an_unknown_sidecar_is_killed_and_restarted()
 {
    let p = pod("Never", &["side-1"], &["a"]);
    let unknown = actions(&p, &[("side-1", InstanceState::Unknown)], &NoProbes);
    assert!(!unknown.kill_pod);
    assert_eq!(unknown.init_to_start, [0]);
    assert_eq!(unknown.kill[0].reason, KillReason::Unknown);
}

/// "kill the pod if all main containers succeeded if pod's RestartPolicy == Never": the
/// sidecars do not keep a finished pod alive, and are not restarted.
#[test]
fn test_compute_pod_actions_with_restartable_init_containers_a_finished_never_pod_is_killed() {
    let p = pod("Never", &["side-1"], &["a"]);
    let running_sidecar = actions(&p, &[("a", exited(0)), ("side-1", running())], &NoProbes);
    assert!(running_sidecar.kill_pod);
    assert!(running_sidecar.init_to_start.is_empty());
    assert!(running_sidecar.start.is_empty());
}

/// "an init container is running; do nothing" with a sidecar before it, and an ordinary init
/// container that failed under `Never` still ends the pod.
#[test]
fn test_compute_pod_actions_with_restartable_init_containers_an_ordinary_failure_still_ends_a_never_pod()
 {
    let p = pod("Never", &["side-1", "init-2"], &["a"]);
    let failed = actions(
        &p,
        &[("init-2", exited(1)), ("side-1", running())],
        &NoProbes,
    );
    assert!(failed.kill_pod);
    assert!(failed.init_to_start.is_empty());
    let p = pod("OnFailure", &["side-1", "init-2"], &["a"]);
    let retried = actions(
        &p,
        &[("init-2", exited(1)), ("side-1", running())],
        &NoProbes,
    );
    assert!(!retried.kill_pod);
    assert_eq!(retried.init_to_start, [1]);
}

fn status(name: &str, state: ContainerState, started: bool) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(state),
        started: Some(started),
        ..Default::default()
    }
}

fn running_state() -> ContainerState {
    ContainerState {
        running: Some(ContainerStateRunning::default()),
        ..Default::default()
    }
}

fn terminated_state(code: i32) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: code,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn waiting_state() -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting::default()),
        ..Default::default()
    }
}

/// `TestPodPhaseWithRestartAlwaysRestartableInitContainers` and
/// `TestPodPhaseWithRestartNeverRestartableInitContainers`: a sidecar not started yet holds the
/// pod Pending (unless it has initialized), a running one counts as running, an exited one is
/// not counted.
#[test]
fn test_pod_phase_with_restartable_init_containers() {
    let always = pod("Always", &["side-1"], &["a"]);
    let never = pod("Never", &["side-1"], &["a"]);
    let main_waiting = [status("a", waiting_state(), false)];
    let main_running = [status("a", running_state(), true)];
    let main_done = [status("a", terminated_state(0), false)];
    let main_failed = [status("a", terminated_state(1), false)];
    let side = |state, started| [status("side-1", state, started)];

    // "restartable init container running": not started yet.
    assert_eq!(
        get_phase(
            &always,
            &side(running_state(), false),
            &main_waiting,
            false,
            false
        ),
        PodPhase::Pending
    );
    // "restartable init container started, main waiting".
    assert_eq!(
        get_phase(
            &always,
            &side(running_state(), true),
            &main_waiting,
            false,
            false
        ),
        PodPhase::Pending
    );
    assert_eq!(
        get_phase(
            &always,
            &side(running_state(), true),
            &main_running,
            false,
            true
        ),
        PodPhase::Running
    );
    // "backoff crashloop restartable init container, main running": once initialized.
    let crash_loop = [ContainerStatus {
        last_state: Some(terminated_state(1)),
        ..status("side-1", waiting_state(), false)
    }];
    assert_eq!(
        get_phase(&always, &crash_loop, &main_running, false, true),
        PodPhase::Running
    );
    // Restarting after the initialization: not pending any more.
    assert_eq!(
        get_phase(
            &always,
            &side(running_state(), false),
            &main_running,
            false,
            true
        ),
        PodPhase::Running
    );
    // "all regular containers succeeded and restartable init container still running".
    assert_eq!(
        get_phase(
            &never,
            &side(running_state(), true),
            &main_done,
            false,
            true
        ),
        PodPhase::Running
    );
    // "all regular containers succeeded and restartable init container killed/failed".
    assert_eq!(
        get_phase(
            &never,
            &side(terminated_state(137), false),
            &main_done,
            false,
            false
        ),
        PodPhase::Succeeded
    );
    assert_eq!(
        get_phase(
            &never,
            &side(terminated_state(0), false),
            &main_failed,
            false,
            false
        ),
        PodPhase::Failed
    );
    assert_eq!(
        get_phase(
            &always,
            &side(terminated_state(137), false),
            &main_done,
            true,
            false
        ),
        PodPhase::Succeeded,
        "terminal pod: the sidecar's exit code does not count"
    );
}

/// The status a sync generates: a sidecar with a startup probe that has not passed is not
/// `started`, the pod is not Initialized and the main container waits in `PodInitializing`;
/// once it passed, the pod is Initialized; a sidecar's readiness counts in the pod's `Ready`.
#[test]
fn a_sidecars_startup_and_readiness_probes_gate_initialized_and_ready() {
    let gates = FeatureGates::default();
    let p = pod("Always", &["side-1"], &["a"]);
    let waiting = HashMap::new();
    let old = PodStatus::default();
    let generate = |runtime: &RuntimePodStatus, probes: &HashMap<String, ContainerProbes>| {
        generate_api_status(&StatusInput {
            pod: &p,
            runtime,
            old: &old,
            pod_is_terminal: false,
            host_ips: &[],
            waiting: &waiting,
            gates: &gates,
            probes,
            evict: None,
            runtime_supports_rro: false,
        })
    };
    let condition = |s: &PodStatus, type_: &str| {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_)
            .map(|c| c.status.clone())
            .unwrap()
    };
    let sidecar_only = runtime(&[("side-1", running())]);
    let not_started: HashMap<String, ContainerProbes> = [(
        "side-1".to_owned(),
        ContainerProbes {
            startup: Some(false),
            readiness: None,
        },
    )]
    .into();
    let s = generate(&sidecar_only, &not_started);
    let side = &s.init_container_statuses.as_ref().unwrap()[0];
    assert_eq!(side.started, Some(false));
    assert!(!side.ready);
    assert_eq!(condition(&s, "Initialized"), "False");
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let main = &s.container_statuses.as_ref().unwrap()[0];
    let reason = main
        .state
        .as_ref()
        .unwrap()
        .waiting
        .as_ref()
        .unwrap()
        .reason
        .clone();
    assert_eq!(reason.as_deref(), Some("PodInitializing"));

    let started: HashMap<String, ContainerProbes> = [(
        "side-1".to_owned(),
        ContainerProbes {
            startup: Some(true),
            readiness: Some(false),
        },
    )]
    .into();
    let s = generate(&sidecar_only, &started);
    let side = &s.init_container_statuses.as_ref().unwrap()[0];
    assert_eq!(side.started, Some(true));
    assert!(!side.ready, "its readiness probe has not passed");
    assert_eq!(condition(&s, "Initialized"), "True");

    let both = runtime(&[("a", running()), ("side-1", running())]);
    let s = generate(&both, &started);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(condition(&s, "Ready"), "False", "the sidecar is not ready");
    let ready: HashMap<String, ContainerProbes> = [(
        "side-1".to_owned(),
        ContainerProbes {
            startup: Some(true),
            readiness: Some(true),
        },
    )]
    .into();
    let s = generate(&both, &ready);
    assert_eq!(condition(&s, "Ready"), "True");
}
