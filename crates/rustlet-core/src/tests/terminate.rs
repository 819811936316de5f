//! Upstream `TestTerminatePod*` and the rules R19-R24.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::update::Cache;
use crate::terminate::{CONTAINER_NOT_LOCATED, CONTAINER_STATUS_UNKNOWN, terminate_status};
use crate::testutil::*;

fn unknown() -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            reason: Some(CONTAINER_STATUS_UNKNOWN.into()),
            message: Some(CONTAINER_NOT_LOCATED.into()),
            exit_code: 137,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pod_with(init: &[&str], containers: &[&str], status: PodStatus) -> Pod {
    let mut pod = test_pod();
    pod.spec = Some(spec_with(init, containers));
    pod.status = Some(status);
    pod
}

fn states(statuses: &Option<Vec<ContainerStatus>>) -> Vec<Option<ContainerState>> {
    statuses.iter().flatten().map(|s| s.state.clone()).collect()
}

fn no_state(name: &str) -> ContainerStatus {
    status_named(name)
}

#[test]
fn test_terminate_pod() {
    let init = ["init-test-1", "init-test-2", "init-test-3"];
    let containers = ["test-1", "test-2", "test-3"];
    let first = PodStatus {
        phase: Some("Failed".into()),
        message: Some("first".into()),
        init_container_statuses: Some(vec![
            no_state("init-test-1"),
            status_in("init-test-2", terminated(0)),
            status_in("init-test-3", terminated(3)),
        ]),
        container_statuses: Some(vec![
            no_state("test-1"),
            status_in("test-2", terminated(2)),
            status_in("test-3", terminated(0)),
        ]),
        ..Default::default()
    };
    let mut cache = Cache::default();
    cache.set(&pod_with(&init, &containers, PodStatus::default()), first);

    // TerminatePod is handed a stale pod: Running, every container running.
    let stale = pod_with(
        &init,
        &containers,
        PodStatus {
            phase: Some("Running".into()),
            init_container_statuses: Some(init.iter().map(|n| status_in(n, running())).collect()),
            container_statuses: Some(containers.iter().map(|n| status_in(n, running())).collect()),
            ..Default::default()
        },
    );
    let entry = cache.terminate(&stale);
    let s = &entry.status;
    assert_eq!(
        states(&s.init_container_statuses),
        [Some(unknown()), Some(terminated(0)), Some(terminated(3))]
    );
    assert_eq!(
        states(&s.container_statuses),
        [Some(unknown()), Some(terminated(2)), Some(terminated(0))]
    );
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(s.message.as_deref(), Some("first"));
    assert!(entry.pod_is_finished);
}

#[test]
fn test_terminate_pod_waiting() {
    let init = ["init-test-1", "init-test-2", "init-test-3"];
    let containers = ["test-1", "test-2", "test-3"];
    let first = PodStatus {
        phase: Some("Failed".into()),
        message: Some("first".into()),
        init_container_statuses: Some(vec![
            no_state("init-test-1"),
            status_in("init-test-2", terminated(0)),
            status_in("init-test-3", waiting()),
        ]),
        container_statuses: Some(vec![
            no_state("test-1"),
            status_in("test-2", terminated(2)),
            status_in("test-3", waiting()),
        ]),
        ..Default::default()
    };
    let mut cache = Cache::default();
    cache.set(&pod_with(&init, &containers, PodStatus::default()), first);
    let stale = pod_with(
        &init,
        &containers,
        PodStatus {
            phase: Some("Running".into()),
            container_statuses: Some(containers.iter().map(|n| status_in(n, running())).collect()),
            ..Default::default()
        },
    );
    let entry = cache.terminate(&stale);
    let s = &entry.status;
    assert_eq!(
        states(&s.init_container_statuses),
        [Some(unknown()), Some(terminated(0)), Some(waiting())]
    );
    assert_eq!(
        states(&s.container_statuses),
        [Some(unknown()), Some(terminated(2)), Some(unknown())]
    );
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(s.message.as_deref(), Some("first"));
}

fn with_last_terminated(mut status: ContainerStatus, exit_code: i32) -> ContainerStatus {
    status.last_state = Some(terminated(exit_code));
    status
}

struct Case {
    name: &'static str,
    phase: &'static str,
    restart_policy: Option<&'static str>,
    init: Vec<ContainerStatus>,
    containers: Vec<ContainerStatus>,
    want_init: Vec<Option<ContainerState>>,
    want_containers: Vec<Option<ContainerState>>,
}

fn run_default_unknown_case(case: Case) {
    let init_names: Vec<String> = (0..case.init.len()).map(|i| format!("init-{i}")).collect();
    let init_refs: Vec<&str> = init_names.iter().map(String::as_str).collect();
    let status = PodStatus {
        phase: Some(case.phase.into()),
        start_time: Some(Time(ts("1970-01-01T00:00:01Z"))),
        init_container_statuses: (!case.init.is_empty()).then(|| case.init.clone()),
        container_statuses: (!case.containers.is_empty()).then(|| case.containers.clone()),
        ..Default::default()
    };
    let mut pod = pod_with(&init_refs, &["c-0"], status.clone());
    pod.spec.as_mut().unwrap().restart_policy = case.restart_policy.map(str::to_owned);
    let mut cache = Cache::default();
    cache.set(&pod, status);
    let entry = cache.terminate(&pod);
    assert_eq!(
        states(&entry.status.init_container_statuses),
        case.want_init,
        "{}: init",
        case.name
    );
    assert_eq!(
        states(&entry.status.container_statuses),
        case.want_containers,
        "{}: containers",
        case.name
    );
    assert!(
        crate::PodPhase::of(&entry.status).is_terminal(),
        "{}: phase",
        case.name
    );
}

#[test]
fn test_terminate_pod_default_unknown_status() {
    let w = |n: &str| status_in(n, waiting());
    let cases = vec![
        Case {
            name: "running with no statuses",
            phase: "Running",
            restart_policy: None,
            init: vec![],
            containers: vec![],
            want_init: vec![],
            want_containers: vec![],
        },
        Case {
            name: "terminated container stays",
            phase: "Running",
            restart_policy: None,
            init: vec![],
            containers: vec![status_in("c-0", terminated(2))],
            want_init: vec![],
            want_containers: vec![Some(terminated(2))],
        },
        Case {
            name: "last termination state set",
            phase: "Running",
            restart_policy: Some("Never"),
            init: vec![],
            containers: vec![with_last_terminated(w("c-0"), 2)],
            want_init: vec![],
            want_containers: vec![Some(unknown())],
        },
        Case {
            name: "no previous state",
            phase: "Running",
            restart_policy: None,
            init: vec![],
            containers: vec![w("c-0")],
            want_init: vec![],
            want_containers: vec![Some(unknown())],
        },
        Case {
            name: "uninitialized pod defaults the first init container",
            phase: "Pending",
            restart_policy: None,
            init: vec![w("init-0")],
            containers: vec![w("c-0")],
            want_init: vec![Some(unknown())],
            want_containers: vec![Some(waiting())],
        },
        Case {
            name: "uninitialized pod defaults only the first init container",
            phase: "Pending",
            restart_policy: None,
            init: vec![w("init-0"), w("init-1")],
            containers: vec![w("c-0")],
            want_init: vec![Some(unknown()), Some(waiting())],
            want_containers: vec![Some(waiting())],
        },
        Case {
            name: "uninitialized pod defaults gaps",
            phase: "Pending",
            restart_policy: None,
            init: vec![
                w("init-0"),
                w("init-1"),
                status_in("init-2", terminated(1)),
                w("init-3"),
            ],
            containers: vec![w("c-0")],
            want_init: vec![
                Some(unknown()),
                Some(unknown()),
                Some(terminated(1)),
                Some(waiting()),
            ],
            want_containers: vec![Some(waiting())],
        },
        Case {
            name: "failed last container is uninitialized",
            phase: "Pending",
            restart_policy: None,
            init: vec![w("init-0"), w("init-1"), status_in("init-2", terminated(1))],
            containers: vec![w("c-0")],
            want_init: vec![Some(unknown()), Some(unknown()), Some(terminated(1))],
            want_containers: vec![Some(waiting())],
        },
        Case {
            name: "successful last container is initialized",
            phase: "Running",
            restart_policy: None,
            init: vec![w("init-0"), w("init-1"), status_in("init-2", terminated(0))],
            containers: vec![w("c-0")],
            want_init: vec![Some(unknown()), Some(unknown()), Some(terminated(0))],
            want_containers: vec![Some(unknown())],
        },
        Case {
            name: "successful last previous container is initialized",
            phase: "Running",
            restart_policy: None,
            init: vec![
                w("init-0"),
                w("init-1"),
                with_last_terminated(w("init-2"), 0),
            ],
            containers: vec![w("c-0")],
            want_init: vec![Some(unknown()), Some(unknown()), Some(unknown())],
            want_containers: vec![Some(unknown())],
        },
        Case {
            name: "running container proves initialization",
            phase: "Running",
            restart_policy: None,
            init: vec![w("init-0")],
            containers: vec![status_in("c-0", running())],
            want_init: vec![Some(unknown())],
            want_containers: vec![Some(unknown())],
        },
        Case {
            name: "evidence of terminated container proves initialization",
            phase: "Running",
            restart_policy: None,
            init: vec![w("init-0")],
            containers: vec![status_in("c-0", terminated(0))],
            want_init: vec![Some(unknown())],
            want_containers: vec![Some(terminated(0))],
        },
        Case {
            name: "evidence of previously terminated container proves initialization",
            phase: "Running",
            restart_policy: None,
            init: vec![w("init-0")],
            containers: vec![with_last_terminated(status_named("c-0"), 0)],
            want_init: vec![Some(unknown())],
            want_containers: vec![Some(unknown())],
        },
    ];
    for case in cases {
        run_default_unknown_case(case);
    }
}

#[test]
fn test_terminate_pod_default_unknown_status_failed_without_statuses_is_unchanged() {
    let status = PodStatus {
        phase: Some("Failed".into()),
        start_time: Some(Time(ts("1970-01-01T00:00:01Z"))),
        ..Default::default()
    };
    let pod = pod_with(&[], &["c-0"], status.clone());
    let mut cache = Cache::default();
    cache.set(&pod, status.clone());
    assert_eq!(cache.terminate(&pod).status, status);
}

#[test]
fn test_terminate_pod_ensure_pod_phase_is_terminal() {
    for (from, to) in [
        ("Pending", "Failed"),
        ("Running", "Failed"),
        ("Succeeded", "Succeeded"),
        ("Failed", "Failed"),
        ("Unknown", "Failed"),
        ("SomeUnknownPhase", "Failed"),
    ] {
        let pod = pod_with(
            &[],
            &[],
            PodStatus {
                phase: Some(from.into()),
                ..Default::default()
            },
        );
        let mut cache = Cache::default();
        assert_eq!(
            cache.terminate(&pod).status.phase.as_deref(),
            Some(to),
            "{from}"
        );
    }
}

#[test]
fn r23_static_pods_keep_their_phase() {
    let mut pod = pod_with(
        &[],
        &[],
        PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        },
    );
    pod.metadata.annotations = Some(
        [(
            crate::pod::CONFIG_SOURCE_ANNOTATION.to_owned(),
            "file".to_owned(),
        )]
        .into(),
    );
    assert_eq!(
        terminate_status(&pod, None).phase.as_deref(),
        Some("Running")
    );
}

#[test]
fn r22_index_name_mismatch_means_not_initialized() {
    let pod = pod_with(
        &["a", "b"],
        &["c"],
        PodStatus {
            init_container_statuses: Some(vec![
                status_in("a", waiting()),
                status_in("x", terminated(0)),
            ]),
            container_statuses: Some(vec![status_in("c", waiting())]),
            ..Default::default()
        },
    );
    assert!(!crate::terminate::has_pod_initialized(&pod));
}

#[test]
fn r22_sidecar_last_initialized_when_running_and_started() {
    let mut pod = pod_with(&["side"], &["c"], PodStatus::default());
    pod.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy =
        Some("Always".into());
    let mut side = status_in("side", running());
    side.started = Some(true);
    pod.status = Some(PodStatus {
        init_container_statuses: Some(vec![side.clone()]),
        container_statuses: Some(vec![status_in("c", waiting())]),
        ..Default::default()
    });
    assert!(crate::terminate::has_pod_initialized(&pod));
    side.started = Some(false);
    pod.status.as_mut().unwrap().init_container_statuses = Some(vec![side]);
    assert!(!crate::terminate::has_pod_initialized(&pod));
}
