//! The pod workers over the simulated runtime in paused time: init containers behind the
//! crash-loop back-off (C14, C15), a new sandbox re-running them (C8, C13), a container the
//! runtime lost (S11, C11), the back-off measured as upstream's (C15), a changed spec (C11),
//! readiness gates set by another client (G7).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition, PodStatus};
use rustlet_core::PodUid;
use rustlet_status::testing::{FakePodManager, FakePodStatusClient};
use rustlet_status::{StatusManager, StatusManagerConfig, StatusManagerDeps};
use rustlet_volume::events::EventKind;
use rustlet_volume::manager::{VolumeManager, VolumeManagerConfig, VolumeManagerDeps};
use rustlet_volume::populator::PodSource;
use rustlet_volume::testing::{FakeNodeStatus, FakePods, FakeRecorder, fake_plugins};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::runtime::{ContainerInstance, InstanceState, Runtime, RuntimePodStatus};
use crate::simulated::{SimulatedConfig, SimulatedRuntime};
use crate::workers::{PodLifecycles, PodWorkers, PodWorkersConfig, PodWorkersDeps};

/// The workers and what they drive, in one test's paused time.
struct Harness {
    pods: Arc<FakePods>,
    /// The workers' reads of the whole source (`PodSource::pods`): each is a pass over it.
    passes: Arc<AtomicUsize>,
    /// The workers' reads of one pod (`PodSource::pod`).
    lookups: Arc<AtomicUsize>,
    pod_manager: FakePodManager,
    changes: watch::Sender<u64>,
    runtime: Arc<SimulatedRuntime>,
    status: Arc<StatusManager>,
    events: Arc<FakeRecorder>,
    lifecycles: Arc<PodLifecycles>,
    cancel: CancellationToken,
    _root: tempfile::TempDir,
}

impl Harness {
    /// Workers with upstream's timings over a simulated runtime whose starts take
    /// `start_delay` (so that even a restart loop lets paused time advance).
    fn start(start_delay: Duration) -> Self {
        Self::start_with(SimulatedConfig {
            start_delay,
            ..SimulatedConfig::default()
        })
    }

    /// [`Self::start`] over a simulated runtime with this configuration.
    fn start_with(config: SimulatedConfig) -> Self {
        Self::start_allocating(config, None)
    }

    /// [`Self::start_with`] with this resource allocation admit handler.
    fn start_allocating(
        config: SimulatedConfig,
        allocator: Option<Arc<dyn crate::admission::ResourceAllocator>>,
    ) -> Self {
        let root = tempfile::tempdir().unwrap();
        let pods = Arc::new(FakePods::default());
        let pod_manager = FakePodManager::new();
        let lifecycles = Arc::new(PodLifecycles::new());
        let events = Arc::new(FakeRecorder::default());
        let runtime = Arc::new(SimulatedRuntime::new(config));
        let status = Arc::new(StatusManager::new(
            StatusManagerDeps::new(
                Some(Arc::new(FakePodStatusClient::new())),
                Arc::new(pod_manager.clone()),
                lifecycles.clone(),
            ),
            StatusManagerConfig::upstream(),
        ));
        let volumes = Arc::new(VolumeManager::new(
            VolumeManagerDeps {
                pods: pods.clone(),
                states: lifecycles.clone(),
                mounter: Arc::new(rustlet_mount::LinuxMounter::new()),
                plugins: fake_plugins(),
                events: events.clone(),
                node: Arc::new(FakeNodeStatus::default()),
                objects: None,
            },
            VolumeManagerConfig::new(root.path()),
        ));
        let (changes, changes_rx) = watch::channel(0);
        let passes = Arc::new(AtomicUsize::new(0));
        let lookups = Arc::new(AtomicUsize::new(0));
        let workers = PodWorkers::new(
            PodWorkersDeps {
                pods: Arc::new(CountingPods {
                    pods: pods.clone(),
                    reads: passes.clone(),
                    lookups: lookups.clone(),
                }),
                changes: changes_rx,
                lifecycles: lifecycles.clone(),
                status: status.clone(),
                volumes,
                runtime: runtime.clone(),
                grpc: None,
                events: events.clone(),
            },
            PodWorkersConfig::new(root.path()),
        );
        if let Some(allocator) = allocator {
            workers.set_resource_allocator(allocator);
        }
        let cancel = CancellationToken::new();
        tokio::spawn(workers.run(cancel.clone()));
        Self {
            pods,
            passes,
            lookups,
            pod_manager,
            changes,
            runtime,
            status,
            events,
            lifecycles,
            cancel,
            _root: root,
        }
    }

    /// Adds or replaces the pod in the source (as a watch delivers it).
    fn put(&self, pod: Pod) {
        self.pod_manager.add_pod(pod.clone());
        self.pods.add(Arc::new(pod));
        self.changes.send_modify(|n| *n += 1);
    }

    fn status(&self) -> PodStatus {
        self.status
            .get_pod_status(&PodUid::new(UID))
            .unwrap_or_default()
    }

    async fn runtime_status(&self) -> RuntimePodStatus {
        self.runtime.pod_status(&PodUid::new(UID)).await
    }

    /// Waits, in paused time, until `done` holds; panics naming `what` after `within`.
    async fn until<F>(&self, what: &str, within: Duration, mut done: F)
    where
        F: AsyncFnMut(&Self) -> bool,
    {
        let deadline = Instant::now() + within;
        while !done(self).await {
            assert!(
                Instant::now() < deadline,
                "{what}: not within {within:?}; status {:#?}; runtime {:#?}",
                self.status(),
                self.runtime_status().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn events(&self, reason: &str) -> Vec<String> {
        self.events
            .events()
            .into_iter()
            .filter(|(_, r, _)| r == reason)
            .map(|(_, _, m)| m)
            .collect()
    }
}

/// The workers' view of [`FakePods`], counting its reads of every pod.
struct CountingPods {
    pods: Arc<FakePods>,
    reads: Arc<AtomicUsize>,
    lookups: Arc<AtomicUsize>,
}

impl PodSource for CountingPods {
    fn pods(&self) -> Vec<Arc<Pod>> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.pods.pods()
    }

    fn all_sources_ready(&self) -> bool {
        self.pods.all_sources_ready()
    }

    fn changes_since(&self, cursor: u64) -> rustlet_core::PodChanges {
        self.pods.changes_since(cursor)
    }

    fn pod(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        self.pods.pod(uid)
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

const UID: &str = "uid-p";

/// A pod `p` in `ns` with these init and regular containers (busybox) and annotations.
fn pod(
    restart_policy: &str,
    init: &[&str],
    containers: &[&str],
    annotations: &[(&str, &str)],
) -> Pod {
    let list = |names: &[&str]| {
        names
            .iter()
            .map(|n| serde_json::json!({"name": n, "image": "busybox"}))
            .collect::<Vec<_>>()
    };
    let annotations: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": UID, "annotations": annotations},
        "spec": {"restartPolicy": restart_policy,
                 "initContainers": list(init),
                 "containers": list(containers)}
    }))
    .unwrap()
}

fn find<'a>(list: &'a Option<Vec<ContainerStatus>>, name: &str) -> Option<&'a ContainerStatus> {
    list.iter().flatten().find(|s| s.name == name)
}

fn named<'a>(list: &'a Option<Vec<ContainerStatus>>, name: &str) -> &'a ContainerStatus {
    list.iter()
        .flatten()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no status for {name}: {list:#?}"))
}

fn newest<'a>(runtime: &'a RuntimePodStatus, name: &str) -> &'a ContainerInstance {
    runtime
        .instances(name)
        .0
        .unwrap_or_else(|| panic!("no instance of {name}: {runtime:#?}"))
}

fn waiting_reason(status: &ContainerStatus) -> Option<String> {
    status.state.as_ref()?.waiting.as_ref()?.reason.clone()
}

fn waiting_message(status: &ContainerStatus) -> Option<String> {
    status.state.as_ref()?.waiting.as_ref()?.message.clone()
}

fn running(status: &ContainerStatus) -> bool {
    status.state.as_ref().is_some_and(|s| s.running.is_some())
}

/// Item 6 (C14, C15): a failing init container under `Always` backs off as a regular one does
/// (10 s, 20 s, 40 s...), shows `CrashLoopBackOff` with its last termination, and holds the
/// regular containers back.
#[tokio::test(start_paused = true)]
async fn c14_c15_a_failing_init_container_backs_off_and_shows_crash_loop_back_off() {
    let h = Harness::start(Duration::from_millis(100));
    h.put(pod(
        "Always",
        &["i"],
        &["a"],
        &[("rustlet.io/simulate-init-exit-code", "1")],
    ));
    let began = Instant::now();
    h.until(
        "the init container backs off",
        Duration::from_secs(5),
        async |h| {
            find(&h.status().init_container_statuses, "i")
                .and_then(waiting_reason)
                .as_deref()
                == Some("CrashLoopBackOff")
        },
    )
    .await;
    // The first crash restarts at once (upstream's quirk), then 10 s, then 20 s from each
    // exit: a minute in, the fourth instance (attempt 3) has run and the next waits 40 s.
    tokio::time::sleep_until(began + Duration::from_secs(60)).await;
    let status = h.status();
    let i = named(&status.init_container_statuses, "i");
    assert_eq!(i.restart_count, 3, "{i:#?}");
    assert!(
        !running(i),
        "an exited init container never shows running: {i:#?}"
    );
    assert_eq!(waiting_reason(i).as_deref(), Some("CrashLoopBackOff"));
    assert_eq!(
        waiting_message(i).as_deref(),
        Some("back-off 40s restarting failed container=i pod=p_ns(uid-p)")
    );
    let last = i
        .last_state
        .as_ref()
        .and_then(|l| l.terminated.as_ref())
        .expect("the last termination");
    assert_eq!(last.exit_code, 1);
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert!(newest(&h.runtime_status().await, "i").attempt == 3);
    assert!(
        h.runtime_status().await.instances("a").0.is_none(),
        "the regular container waits for initialization"
    );
    let back_offs = h.events("BackOff");
    assert!(
        back_offs
            .iter()
            .all(|m| m == "Back-off restarting failed container i in pod p_ns(uid-p)"),
        "{back_offs:?}"
    );
    assert_eq!(h.events("Started").len(), 4, "one start per instance");
}

/// Item 7 (C8, C13): when the sandbox dies, a new one is made and the init containers that
/// had completed in the old one run again, in order, before the regular containers.
#[tokio::test(start_paused = true)]
async fn c8_c13_a_new_sandbox_runs_the_init_containers_again() {
    let h = Harness::start(Duration::ZERO);
    h.put(pod("Always", &["i1", "i2"], &["a"], &[]));
    h.until("a runs", Duration::from_secs(5), async |h| {
        h.runtime_status()
            .await
            .instances("a")
            .0
            .is_some_and(|a| matches!(a.state, InstanceState::Running { .. }))
    })
    .await;
    let old_sandbox = h.runtime_status().await.sandbox.unwrap().id;

    h.runtime.sandbox_died(&PodUid::new(UID));
    h.until("a runs again", Duration::from_secs(5), async |h| {
        let runtime = h.runtime_status().await;
        runtime
            .instances("a")
            .0
            .is_some_and(|a| a.attempt == 1 && matches!(a.state, InstanceState::Running { .. }))
    })
    .await;
    let runtime = h.runtime_status().await;
    let sandbox = runtime.sandbox.clone().unwrap();
    assert!(sandbox.ready);
    assert_ne!(sandbox.id, old_sandbox, "a new sandbox");
    for name in ["i1", "i2", "a"] {
        let instance = newest(&runtime, name);
        assert_eq!(instance.attempt, 1, "{name} ran again: {runtime:#?}");
        assert_eq!(instance.sandbox_id, sandbox.id, "{name} in the new sandbox");
    }
    // In order: each init container after the one before it, the container after both.
    let order: Vec<&str> = runtime
        .containers
        .iter()
        .rev()
        .filter(|c| c.sandbox_id == sandbox.id)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(order, ["i1", "i2", "a"]);
    assert_eq!(
        h.events("SandboxChanged"),
        ["Pod sandbox changed, it will be killed and re-created."]
    );
}

/// Item 7 (C8): a `Never` pod whose sandbox died is not given a new one: it is done, and
/// Failed (its container was killed).
#[tokio::test(start_paused = true)]
async fn c8_a_never_pod_whose_sandbox_died_gets_no_new_sandbox() {
    let h = Harness::start(Duration::ZERO);
    h.put(pod("Never", &[], &["a"], &[]));
    h.until("a runs", Duration::from_secs(5), async |h| {
        find(&h.status().container_statuses, "a").is_some_and(running)
    })
    .await;
    assert_eq!(h.status().pod_ip.as_deref(), Some("10.88.0.2"));
    h.runtime.sandbox_died(&PodUid::new(UID));
    h.until("the pod fails", Duration::from_secs(5), async |h| {
        h.status().phase.as_deref() == Some("Failed")
    })
    .await;
    let status = h.status();
    let a = named(&status.container_statuses, "a");
    assert_eq!(a.restart_count, 0, "{a:#?}");
    assert_eq!(
        a.state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        137
    );
    // A second sandbox would have taken the range's next address.
    assert_eq!(status.pod_ip.as_deref(), Some("10.88.0.2"), "{status:#?}");
    assert!(h.events("SandboxChanged").is_empty());
    assert!(h.events("Started").len() == 1, "{:?}", h.events("Started"));
}

/// upstream `SyncPod`, spec `Hostname of Pod a pod configured to set FQDN as hostname will
/// remain in Pending state generating FailedCreatePodSandBox events when the FQDN is longer
/// than 64 bytes`: a sandbox the runtime cannot make is a Warning `FailedCreatePodSandBox`
/// with its error, retried; the pod stays Pending, nothing starts; once the runtime makes it,
/// the pod runs.
#[tokio::test(start_paused = true)]
async fn a_sandbox_the_runtime_refuses_is_a_failed_create_pod_sandbox_event_and_the_pod_stays_pending()
 {
    let h = Harness::start(Duration::ZERO);
    let why = "failed to construct FQDN from pod hostname and cluster domain, FQDN x is too long";
    h.runtime.refuse_sandboxes(&PodUid::new(UID), why);
    h.put(pod("Always", &[], &["a"], &[]));
    h.until("two failed attempts", Duration::from_secs(60), async |h| {
        h.events("FailedCreatePodSandBox").len() >= 2
    })
    .await;
    assert_eq!(
        h.events("FailedCreatePodSandBox")[0],
        format!("Failed to create pod sandbox: {why}")
    );
    let status = h.status();
    assert_eq!(status.phase.as_deref(), Some("Pending"), "{status:#?}");
    assert!(h.events("Started").is_empty());
    h.runtime.allow_sandboxes(&PodUid::new(UID));
    h.until("a runs", Duration::from_secs(60), async |h| {
        find(&h.status().container_statuses, "a").is_some_and(running)
    })
    .await;
}

/// Item 8 (C11): a container whose state the runtime lost is killed before it is started
/// again (two instances must never run at once).
#[tokio::test(start_paused = true)]
async fn c11_an_unknown_container_is_killed_before_its_restart() {
    let h = Harness::start(Duration::ZERO);
    h.put(pod("Always", &[], &["a"], &[]));
    h.until("a runs", Duration::from_secs(5), async |h| {
        find(&h.status().container_statuses, "a").is_some_and(running)
    })
    .await;
    let lost = newest(&h.runtime_status().await, "a").id.clone();
    h.runtime.lose_track(&PodUid::new(UID), "a");
    h.until("a runs again", Duration::from_secs(5), async |h| {
        let runtime = h.runtime_status().await;
        runtime.instances("a").0.is_some_and(|a| a.attempt == 1)
    })
    .await;
    let runtime = h.runtime_status().await;
    let (new, old) = runtime.instances("a");
    assert!(matches!(new.unwrap().state, InstanceState::Running { .. }));
    let old = old.unwrap();
    assert_eq!(old.id, lost);
    assert!(
        matches!(old.state, InstanceState::Exited { exit_code: 137, .. }),
        "the lost instance was killed: {old:#?}"
    );
    assert_eq!(
        h.events("Killing"),
        ["Container is in \"Unknown\" state, try killing it before restart"]
    );
}

/// Item 8 (S11, W20): a run-once pod whose running container the runtime lost fails with
/// upstream's `ContainerStatusUnknown` (exit code 137), never Succeeded, and is not run twice.
#[tokio::test(start_paused = true)]
async fn s11_a_lost_container_of_a_never_pod_is_container_status_unknown_and_fails_the_pod() {
    let h = Harness::start(Duration::ZERO);
    h.put(pod("Never", &[], &["a"], &[]));
    h.until("a runs", Duration::from_secs(5), async |h| {
        find(&h.status().container_statuses, "a").is_some_and(running)
    })
    .await;
    h.runtime.lose_track(&PodUid::new(UID), "a");
    h.until("the pod fails", Duration::from_secs(5), async |h| {
        h.status().phase.as_deref() == Some("Failed")
    })
    .await;
    assert_eq!(h.events("Started").len(), 1, "not run twice");
    let status = h.status();
    let a = named(&status.container_statuses, "a");
    let terminated = a.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(terminated.exit_code, 137, "{a:#?}");
}

/// Item 9 (C15): the back-off is measured from the container's `finishedAt`, not from the
/// restart that let it run: a container that ran 100 s and crashed waits 10 s after its exit.
#[tokio::test(start_paused = true)]
async fn c15_the_back_off_is_measured_from_finished_at() {
    let h = Harness::start(Duration::ZERO);
    h.put(pod(
        "Always",
        &[],
        &["a"],
        &[
            ("rustlet.io/simulate-exit-after", "100"),
            ("rustlet.io/simulate-exit-code", "1"),
        ],
    ));
    let began = Instant::now();
    // Exits at 100 s (restarted at once: the first crash), at 200 s (back-off 10 s from then).
    tokio::time::sleep_until(began + Duration::from_secs(205)).await;
    let a = named(&h.status().container_statuses, "a").clone();
    assert_eq!(
        waiting_reason(&a).as_deref(),
        Some("CrashLoopBackOff"),
        "{a:#?}"
    );
    assert_eq!(
        waiting_message(&a).as_deref(),
        Some("back-off 10s restarting failed container=a pod=p_ns(uid-p)")
    );
    assert_eq!(newest(&h.runtime_status().await, "a").attempt, 1);
    tokio::time::sleep_until(began + Duration::from_secs(211)).await;
    let runtime = h.runtime_status().await;
    let a = newest(&runtime, "a");
    assert_eq!(a.attempt, 2, "restarted once the 10 s from its exit passed");
    let InstanceState::Running { started_at } = a.state else {
        panic!("{a:#?}")
    };
    let (_, previous) = runtime.instances("a");
    let Some(InstanceState::Exited { finished_at, .. }) = previous.map(|p| &p.state) else {
        panic!("{runtime:#?}")
    };
    assert_eq!(
        started_at.duration_since(*finished_at),
        k8s_openapi::jiff::SignedDuration::from_secs(10)
    );
}

/// Item 9 (C15, upstream `HasExpiredFunc`): after a run longer than 10 minutes the back-off
/// starts again from 10 s, however long it had grown.
#[tokio::test(start_paused = true)]
async fn c15_the_back_off_resets_after_ten_minutes_of_running() {
    let h = Harness::start(Duration::ZERO);
    let crashing = |after: &str| {
        pod(
            "Always",
            &[],
            &["a"],
            &[
                ("rustlet.io/simulate-exit-after", after),
                ("rustlet.io/simulate-exit-code", "1"),
            ],
        )
    };
    h.put(crashing("1"));
    h.until(
        "the back-off grows to 40 s",
        Duration::from_secs(120),
        async |h| {
            find(&h.status().container_statuses, "a")
                .and_then(waiting_message)
                .is_some_and(|m| m.starts_with("back-off 40s"))
        },
    )
    .await;
    // The next instance runs 700 s; the one after it crashes at once again.
    h.put(crashing("700"));
    h.until("the long run starts", Duration::from_secs(60), async |h| {
        h.runtime.next_change(&PodUid::new(UID)).is_some_and(|at| {
            at.saturating_duration_since(Instant::now()) > Duration::from_secs(600)
        })
    })
    .await;
    let long = newest(&h.runtime_status().await, "a").attempt;
    h.put(crashing("1"));
    h.until(
        "the short run after it crashed",
        Duration::from_secs(800),
        async |h| {
            let runtime = h.runtime_status().await;
            runtime
                .instances("a")
                .0
                .is_some_and(|a| a.attempt == long + 1)
                && find(&h.status().container_statuses, "a")
                    .and_then(waiting_reason)
                    .as_deref()
                    == Some("CrashLoopBackOff")
        },
    )
    .await;
    let a = named(&h.status().container_statuses, "a").clone();
    assert_eq!(
        waiting_message(&a).as_deref(),
        Some("back-off 10s restarting failed container=a pod=p_ns(uid-p)"),
        "{a:#?}"
    );
}

/// Item 9 (C11): a changed container spec (here its environment) restarts the running
/// container, whatever the restart policy, and not behind the back-off of the old spec.
#[tokio::test(start_paused = true)]
async fn c11_a_changed_container_spec_restarts_the_running_container() {
    let h = Harness::start(Duration::ZERO);
    let p = pod("Never", &[], &["a"], &[]);
    h.put(p.clone());
    h.until("a runs", Duration::from_secs(5), async |h| {
        find(&h.status().container_statuses, "a").is_some_and(running)
    })
    .await;
    let mut changed = p;
    changed.spec.as_mut().unwrap().containers[0].env =
        Some(vec![k8s_openapi::api::core::v1::EnvVar {
            name: "LEVEL".into(),
            value: Some("debug".into()),
            ..Default::default()
        }]);
    let hash = crate::runtime::container_hash(&changed.spec.as_ref().unwrap().containers[0]);
    h.put(changed);
    h.until(
        "a runs with its new spec",
        Duration::from_secs(5),
        async |h| {
            let runtime = h.runtime_status().await;
            runtime.instances("a").0.is_some_and(|a| {
                a.hash.as_ref() == Some(&hash) && matches!(a.state, InstanceState::Running { .. })
            })
        },
    )
    .await;
    assert_eq!(newest(&h.runtime_status().await, "a").attempt, 1);
    assert_eq!(
        h.events("Killing"),
        ["Container a definition changed, will be restarted"]
    );
    assert_eq!(h.status().phase.as_deref(), Some("Running"));
}

/// Item 10 (G7, upstream `NeedToReconcilePodReadiness`): a readiness gate's condition set by
/// another client makes the pod Ready as soon as the watch delivers it, without a container
/// change.
#[tokio::test(start_paused = true)]
async fn g7_a_readiness_gate_set_by_another_client_makes_the_pod_ready() {
    const GATE: &str = "example.com/load-balancer";
    let h = Harness::start(Duration::ZERO);
    let mut p = pod("Always", &[], &["a"], &[]);
    p.spec.as_mut().unwrap().readiness_gates =
        Some(vec![k8s_openapi::api::core::v1::PodReadinessGate {
            condition_type: GATE.into(),
        }]);
    h.put(p.clone());
    let ready = |status: &PodStatus| {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .cloned()
    };
    h.until(
        "the gate holds Ready back",
        Duration::from_secs(5),
        async |h| {
            ready(&h.status())
                .is_some_and(|c| c.reason.as_deref() == Some("ReadinessGatesNotReady"))
        },
    )
    .await;
    // The watch delivers the agent's status with the gate's condition another client set.
    let mut written = h.status();
    written
        .conditions
        .get_or_insert_default()
        .push(PodCondition {
            type_: GATE.into(),
            status: "True".into(),
            ..Default::default()
        });
    p.status = Some(written);
    h.put(p);
    h.until("the pod is Ready", Duration::from_secs(1), async |h| {
        ready(&h.status()).is_some_and(|c| c.status == "True")
    })
    .await;
    assert!(
        h.events
            .events()
            .iter()
            .all(|(kind, _, _)| *kind == EventKind::Normal),
        "{:?}",
        h.events.events()
    );
}

/// A static pod `etcd` in `kube-system` (from a manifest file) under `uid`.
fn static_pod(uid: &str, image: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "etcd-node-a", "namespace": "kube-system", "uid": uid,
                     "annotations": {"kubernetes.io/config.source": "file"}},
        "spec": {"terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "etcd", "image": image}]}
    }))
    .unwrap()
}

/// Item 11 (W9, upstream `allowPodStart`): an edited static manifest is a new pod (a new UID)
/// with the old one's full name; it starts only once the old incarnation has terminated, so
/// two copies of an etcd never run at once. The old one takes 20 s to stop here.
#[tokio::test(start_paused = true)]
async fn w9_an_edited_static_pod_starts_only_after_its_old_incarnation_terminated() {
    let h = Harness::start_with(SimulatedConfig {
        stop_delay: Duration::from_secs(20),
        ..SimulatedConfig::default()
    });
    let (old, new) = (PodUid::new("uid-old"), PodUid::new("uid-new"));
    let running = async |uid: &PodUid| {
        h.runtime
            .pod_status(uid)
            .await
            .instances("etcd")
            .0
            .is_some_and(|c| matches!(c.state, InstanceState::Running { .. }))
    };
    h.put(static_pod("uid-old", "etcd:1"));
    h.until(
        "the old incarnation runs",
        Duration::from_secs(5),
        async |_| running(&old).await,
    )
    .await;
    // The manifest is edited: the old pod leaves the source and the new one comes.
    h.pods.remove("uid-old");
    h.pod_manager.remove_pod(&old);
    h.put(static_pod("uid-new", "etcd:2"));
    let edited = Instant::now();
    h.until(
        "the new incarnation runs",
        Duration::from_secs(60),
        async |_| {
            let new_runs = running(&new).await;
            assert!(
                !(new_runs && running(&old).await),
                "both incarnations run at {:?}",
                Instant::now() - edited
            );
            new_runs
        },
    )
    .await;
    assert!(
        Instant::now() - edited >= Duration::from_secs(20),
        "started after the old one's 20 s stop, not before: {:?}",
        Instant::now() - edited
    );
}

/// A static pod under `uid` first seen by its source at `seen` (`kubernetes.io/config.seen`).
fn static_pod_seen(uid: &str, seen: &str) -> Pod {
    let mut pod = static_pod(uid, "etcd:1");
    pod.metadata
        .annotations
        .get_or_insert_default()
        .insert("kubernetes.io/config.seen".into(), seen.into());
    pod
}

/// The `etcd` container of `uid` runs its `attempt`th instance (0: the first), and the status
/// says it restarted that many times.
async fn runs_attempt(h: &Harness, uid: &PodUid, attempt: i32) -> bool {
    let runtime = h.runtime.pod_status(uid).await;
    let runs = runtime
        .instances("etcd")
        .0
        .is_some_and(|c| c.attempt == attempt && matches!(c.state, InstanceState::Running { .. }));
    let status = h.status.get_pod_status(uid).unwrap_or_default();
    runs && find(&status.container_statuses, "etcd")
        .is_some_and(|s| s.restart_count == attempt && running(s))
}

/// Issue 27, upstream "MirrorPod when recreating a static pod should successfully recreate
/// when file is removed and recreated" (pod workers' `restartRequested`): a static pod
/// removed from its source and added back under its UID while its worker terminates it (here
/// both at once: only its first-seen time tells) is stopped, then started again once it
/// terminated, its restart count going on from the old containers (1).
#[tokio::test(start_paused = true)]
async fn a_static_pod_removed_and_added_back_at_once_restarts_once_terminated() {
    let h = Harness::start_with(SimulatedConfig {
        stop_delay: Duration::from_secs(5),
        ..SimulatedConfig::default()
    });
    let uid = PodUid::new("uid-s");
    h.put(static_pod_seen("uid-s", "2026-12-04T22:00:00Z"));
    h.until("it runs", Duration::from_secs(5), async |h| {
        runs_attempt(h, &uid, 0).await
    })
    .await;
    h.put(static_pod_seen("uid-s", "2026-12-04T22:01:00Z"));
    h.until("it is being stopped", Duration::from_secs(5), async |h| {
        h.lifecycles.get(&uid) >= Some(crate::workers::Lifecycle::Terminating)
    })
    .await;
    h.until("it runs again", Duration::from_secs(60), async |h| {
        runs_attempt(h, &uid, 1).await
    })
    .await;
    assert_eq!(
        h.lifecycles.get(&uid),
        Some(crate::workers::Lifecycle::Syncing)
    );
    assert!(
        h.lifecycles.is_static_pod_syncing(&uid),
        "its mirror follows it"
    );
    // Once: nothing restarts it again.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(runs_attempt(&h, &uid, 1).await, "{:#?}", h.status());
}

/// Upstream `restartRequested` when the source's removal and addition come one after the
/// other: the pod left the source (its worker terminates it) and is back under its UID before
/// it terminated: it is restarted once it terminated, not left finished.
#[tokio::test(start_paused = true)]
async fn a_pod_back_in_the_source_while_it_terminates_restarts_once_terminated() {
    let h = Harness::start_with(SimulatedConfig {
        stop_delay: Duration::from_secs(5),
        ..SimulatedConfig::default()
    });
    let uid = PodUid::new("uid-s");
    let pod = static_pod("uid-s", "etcd:1");
    h.put(pod.clone());
    h.until("it runs", Duration::from_secs(5), async |h| {
        runs_attempt(h, &uid, 0).await
    })
    .await;
    h.pods.remove("uid-s");
    h.changes.send_modify(|n| *n += 1);
    h.until("it is being stopped", Duration::from_secs(5), async |h| {
        h.lifecycles.get(&uid) >= Some(crate::workers::Lifecycle::Terminating)
    })
    .await;
    h.put(pod);
    h.until("it runs again", Duration::from_secs(60), async |h| {
        runs_attempt(h, &uid, 1).await
    })
    .await;
}

/// W9: a static pod whose earlier incarnation still runs and that is deleted while it waits
/// is never started.
#[tokio::test(start_paused = true)]
async fn w9_a_waiting_static_pod_that_goes_is_never_started() {
    let h = Harness::start_with(SimulatedConfig {
        stop_delay: Duration::from_secs(20),
        ..SimulatedConfig::default()
    });
    h.put(static_pod("uid-old", "etcd:1"));
    h.until(
        "the old incarnation runs",
        Duration::from_secs(5),
        async |h| {
            h.runtime
                .pod_status(&PodUid::new("uid-old"))
                .await
                .instances("etcd")
                .0
                .is_some()
        },
    )
    .await;
    h.put(static_pod("uid-new", "etcd:2"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        h.runtime
            .pod_status(&PodUid::new("uid-new"))
            .await
            .instances("etcd")
            .0
            .is_none(),
        "waits while the old one runs"
    );
    h.pods.remove("uid-new");
    h.pod_manager.remove_pod(&PodUid::new("uid-new"));
    h.changes.send_modify(|n| *n += 1);
    h.pods.remove("uid-old");
    h.pod_manager.remove_pod(&PodUid::new("uid-old"));
    h.changes.send_modify(|n| *n += 1);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let new = h.runtime.pod_status(&PodUid::new("uid-new")).await;
    assert!(new.instances("etcd").0.is_none(), "never started: {new:#?}");
}

/// Issue 27, upstream "MirrorPodWithGracePeriod when create a mirror pod mirror pod termination
/// should satisfy grace period when static pod is updated / deleted" (W9, W30): what the mirror
/// pods follow. A static pod may have its mirror only once its worker started it; while its
/// edited manifest's old incarnation takes its 20 s to stop, neither incarnation may (the old
/// mirror stays, `IsPodForMirrorPodTerminatingByFullName`); the new one may once the old
/// terminated. A deleted static pod may run until it terminated (its orphaned mirror stays).
/// Each change of those answers is signalled.
#[tokio::test(start_paused = true)]
async fn w30_a_static_pods_mirror_follows_the_incarnation_its_worker_started() {
    let h = Harness::start_with(SimulatedConfig {
        stop_delay: Duration::from_secs(20),
        ..SimulatedConfig::default()
    });
    let (old, new) = (PodUid::new("uid-old"), PodUid::new("uid-new"));
    let may_run = || {
        h.lifecycles
            .static_pod_may_run("kube-system", "etcd-node-a")
    };
    let mut signal = h.lifecycles.subscribe_static();
    h.put(static_pod("uid-old", "etcd:1"));
    h.until(
        "the old incarnation syncs",
        Duration::from_secs(5),
        async |h| h.lifecycles.is_static_pod_syncing(&old),
    )
    .await;
    assert!(signal.has_changed().unwrap(), "its start is signalled");
    signal.mark_unchanged();
    assert!(may_run());

    // The manifest is edited: the old pod leaves the source and the new one comes.
    h.pods.remove("uid-old");
    h.pod_manager.remove_pod(&old);
    h.put(static_pod("uid-new", "etcd:2"));
    tokio::time::sleep(Duration::from_secs(19)).await;
    assert!(!h.lifecycles.is_static_pod_syncing(&old));
    assert!(
        !h.lifecycles.is_static_pod_syncing(&new),
        "waits for the old one's turn to end"
    );
    assert!(may_run(), "the old incarnation still stops");
    assert!(!signal.has_changed().unwrap());
    tokio::time::timeout(Duration::from_secs(5), signal.changed())
        .await
        .expect("the old one's end is signalled")
        .unwrap();
    h.until(
        "the new incarnation syncs",
        Duration::from_secs(5),
        async |h| h.lifecycles.is_static_pod_syncing(&new),
    )
    .await;
    assert!(may_run(), "the new incarnation runs");
    signal.mark_unchanged();

    // The manifest is deleted: the mirror is an orphan, kept while the pod stops.
    h.pods.remove("uid-new");
    h.pod_manager.remove_pod(&new);
    h.changes.send_modify(|n| *n += 1);
    tokio::time::sleep(Duration::from_secs(19)).await;
    assert!(may_run(), "the deleted static pod still stops");
    tokio::time::timeout(Duration::from_secs(5), signal.changed())
        .await
        .expect("its end is signalled")
        .unwrap();
    assert!(!may_run());
    assert!(!h.lifecycles.is_static_pod_syncing(&new));
}

/// Issue 27 (node features), upstream "[sig-node] Pods should allow activeDeadlineSeconds to be
/// updated" (`activeDeadlineHandler`): a running pod whose `activeDeadlineSeconds` is set fails
/// with `DeadlineExceeded` once that long passed since its start, not before, and its
/// containers are stopped.
#[tokio::test(start_paused = true)]
async fn an_updated_active_deadline_fails_the_running_pod_with_deadline_exceeded() {
    let h = Harness::start(Duration::from_millis(100));
    let mut p = pod("Always", &[], &["a"], &[]);
    h.put(p.clone());
    h.until("the pod runs", Duration::from_secs(5), async |h| {
        h.status().phase.as_deref() == Some("Running")
    })
    .await;
    let started = h.status().start_time.expect("a start time").0;
    p.spec.as_mut().unwrap().active_deadline_seconds = Some(30);
    h.put(p);
    // Not before the deadline (the start time has whole seconds: at most one early).
    let before = h.runtime.now().duration_since(started);
    tokio::time::sleep(
        Duration::try_from(k8s_openapi::jiff::SignedDuration::from_secs(28) - before).unwrap(),
    )
    .await;
    assert_eq!(h.status().phase.as_deref(), Some("Running"));
    h.until("the pod fails", Duration::from_secs(10), async |h| {
        h.status().phase.as_deref() == Some("Failed")
    })
    .await;
    let status = h.status();
    assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    assert_eq!(
        h.events("DeadlineExceeded"),
        ["Pod was active on the node longer than the specified deadline"]
    );
    h.until("its containers stop", Duration::from_secs(40), async |h| {
        !h.runtime_status().await.any_running()
    })
    .await;
}

/// Issue 27 (sidecar containers), upstream `computePodActions` and `getPhase`: the sidecar runs
/// before the next init container and keeps running beside the main container; once the main
/// container of a `restartPolicy: Never` pod has exited, the sidecar is stopped (not restarted)
/// and the pod's phase is Succeeded, the sidecar's exit ignored.
#[tokio::test(start_paused = true)]
async fn a_never_pods_sidecar_is_stopped_when_its_main_container_is_done_and_the_pod_succeeds() {
    let h = Harness::start(Duration::from_millis(100));
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": UID,
                     "annotations": {"rustlet.io/simulate-exit-after": "5"}},
        "spec": {"restartPolicy": "Never",
                 "initContainers": [
                     {"name": "side", "image": "busybox", "restartPolicy": "Always"},
                     {"name": "i", "image": "busybox"}],
                 "containers": [{"name": "a", "image": "busybox"}]}
    }))
    .unwrap();
    h.put(p);
    h.until(
        "the main container runs",
        Duration::from_secs(3),
        async |h| find(&h.status().container_statuses, "a").is_some_and(running),
    )
    .await;
    let status = h.status();
    let side = named(&status.init_container_statuses, "side");
    assert!(running(side), "{side:#?}");
    assert_eq!(side.started, Some(true));
    assert!(side.ready);
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let runtime = h.runtime_status().await;
    let order: Vec<&str> = runtime
        .containers
        .iter()
        .rev()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(order, ["side", "i", "a"], "started in this order");

    h.until("the pod succeeds", Duration::from_secs(10), async |h| {
        h.status().phase.as_deref() == Some("Succeeded")
    })
    .await;
    let runtime = h.runtime_status().await;
    assert!(
        !runtime.any_running(),
        "the sidecar was stopped: {runtime:#?}"
    );
    assert_eq!(newest(&runtime, "side").attempt, 0, "never restarted");
    let status = h.status();
    let side = named(&status.init_container_statuses, "side");
    assert!(
        side.state.as_ref().is_some_and(|s| s.terminated.is_some()),
        "{side:#?}"
    );
}

/// upstream `SyncPod` step 7 (`EphemeralContainersToStart`): an ephemeral container added to
/// a running pod starts in its sandbox, with `Created` and `Started` events, beside the pod's
/// container, which goes on untouched; its status is in `ephemeralContainerStatuses`; the
/// pod's termination stops it too.
#[tokio::test(start_paused = true)]
async fn an_ephemeral_container_added_to_a_running_pod_starts_once_and_stops_with_it() {
    let h = Harness::start(Duration::ZERO);
    let p = pod("Always", &[], &["a"], &[]);
    h.put(p.clone());
    h.until("a runs", Duration::from_secs(5), async |h| {
        find(&h.status().container_statuses, "a").is_some_and(running)
    })
    .await;
    let a = newest(&h.runtime_status().await, "a").id.clone();
    let mut debugged = p;
    debugged.spec.as_mut().unwrap().ephemeral_containers =
        Some(vec![k8s_openapi::api::core::v1::EphemeralContainer {
            name: "debugger".into(),
            image: Some("busybox".into()),
            ..Default::default()
        }]);
    h.put(debugged.clone());
    h.until("the debugger runs", Duration::from_secs(5), async |h| {
        find(&h.status().ephemeral_container_statuses, "debugger").is_some_and(running)
    })
    .await;
    let runtime = h.runtime_status().await;
    let debugger = newest(&runtime, "debugger");
    assert_eq!(debugger.kind, crate::runtime::ContainerKind::Ephemeral);
    assert_eq!(
        Some(debugger.sandbox_id.as_str()),
        runtime.sandbox.as_ref().map(|s| s.id.as_str())
    );
    assert_eq!(newest(&runtime, "a").id, a, "the pod's container untouched");
    assert_eq!(
        h.events("Started"),
        ["Started container a", "Started container debugger"]
    );
    // Later syncs start it no more.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(h.runtime_status().await.containers.len(), 2);

    // Deleted: both stop.
    debugged.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
    debugged.metadata.deletion_grace_period_seconds = Some(0);
    h.put(debugged);
    h.until("nothing runs", Duration::from_secs(10), async |h| {
        !h.runtime_status().await.any_running()
    })
    .await;
}

/// `pod` with its first container's own `restartPolicy` and `restartPolicyRules` (action
/// `Restart` on these exit codes, operator `In`), exiting with `exit_code` a second after each
/// start.
fn pod_with_container_policy(
    pod_policy: &str,
    container_policy: &str,
    restart_on: &[i32],
    exit_code: &str,
) -> Pod {
    let mut p = pod(
        pod_policy,
        &[],
        &["main-container"],
        &[
            ("rustlet.io/simulate-exit-after", "1"),
            ("rustlet.io/simulate-exit-code", exit_code),
        ],
    );
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    c.restart_policy = Some(container_policy.into());
    if !restart_on.is_empty() {
        c.restart_policy_rules = Some(vec![k8s_openapi::api::core::v1::ContainerRestartRule {
            action: "Restart".into(),
            exit_codes: Some(
                k8s_openapi::api::core::v1::ContainerRestartRuleOnExitCodes {
                    operator: "In".into(),
                    values: Some(restart_on.to_vec()),
                },
            ),
        }]);
    }
    p
}

/// Upstream e2e "Pod Extended (container restart policy) Container Restart Rules should restart
/// container on rule match" and "should restart container on container-level restart policy
/// Always" (C20, S4): the container restarts although the pod's policy is `Never`, and the pod
/// stays Running.
#[tokio::test(start_paused = true)]
async fn container_restart_rules_should_restart_container_on_rule_match() {
    for p in [
        pod_with_container_policy("Never", "Never", &[42], "42"),
        pod_with_container_policy("Never", "Always", &[], "1"),
    ] {
        let h = Harness::start(Duration::ZERO);
        h.put(p);
        h.until(
            "the container restarts",
            Duration::from_secs(5),
            async |h| {
                find(&h.status().container_statuses, "main-container")
                    .is_some_and(|c| c.restart_count > 0)
            },
        )
        .await;
        assert_eq!(h.status().phase.as_deref(), Some("Running"));
    }
}

/// Upstream e2e "... should not restart container on rule mismatch, container restart policy
/// Never" and "should restart container on container-level restart policy Never" (C20, C12,
/// S4): the container is not restarted, even under the pod's `Always`, and the pod fails.
#[tokio::test(start_paused = true)]
async fn container_restart_rules_should_not_restart_container_on_rule_mismatch() {
    for p in [
        pod_with_container_policy("Never", "Never", &[42], "1"),
        pod_with_container_policy("Always", "Never", &[], "1"),
    ] {
        let h = Harness::start(Duration::ZERO);
        h.put(p);
        h.until("the pod fails", Duration::from_secs(5), async |h| {
            h.status().phase.as_deref() == Some("Failed")
        })
        .await;
        tokio::time::sleep(Duration::from_secs(30)).await;
        let status = h.status();
        let c = named(&status.container_statuses, "main-container");
        assert_eq!(c.restart_count, 0, "{c:#?}");
        assert_eq!(h.events("Started").len(), 1, "not run twice");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
    }
}

/// Upstream e2e sig-apps "Job containers restarted by container restart policy should not
/// trigger PodFailurePolicy" on the node (C20, S4): a container with its own `OnFailure` in a
/// `Never` pod restarts after a failure (the pod stays Running) and ends the pod Succeeded
/// after a success.
#[tokio::test(start_paused = true)]
async fn container_level_on_failure_restarts_a_failure_and_not_a_success() {
    let h = Harness::start(Duration::ZERO);
    h.put(pod_with_container_policy("Never", "OnFailure", &[], "1"));
    h.until(
        "the container restarts",
        Duration::from_secs(5),
        async |h| {
            find(&h.status().container_statuses, "main-container")
                .is_some_and(|c| c.restart_count > 0)
        },
    )
    .await;
    assert_eq!(h.status().phase.as_deref(), Some("Running"));

    let h = Harness::start(Duration::ZERO);
    h.put(pod_with_container_policy("Never", "OnFailure", &[], "0"));
    h.until("the pod succeeds", Duration::from_secs(5), async |h| {
        h.status().phase.as_deref() == Some("Succeeded")
    })
    .await;
    assert_eq!(h.events("Started").len(), 1, "not run twice");
}

/// Upstream e2e "PodOSRejection Kubelet [LinuxOnly] should reject pod when the node OS doesn't
/// match pod's OS" (`HandlePodAdditions`, `rejectPod`): a pod for another OS is Failed with
/// `PodOSNotSupported` and upstream's message, a Warning event says why, and nothing of it ever
/// runs.
#[tokio::test(start_paused = true)]
async fn pod_os_rejection_should_reject_pod_when_the_node_os_doesnt_match_pods_os() {
    let h = Harness::start(Duration::ZERO);
    let mut p = pod("Always", &[], &["wrong-pod-os"], &[]);
    p.spec.as_mut().unwrap().os = Some(k8s_openapi::api::core::v1::PodOS {
        name: "windows".into(),
    });
    h.put(p);
    h.until("the pod fails", Duration::from_secs(5), async |h| {
        h.status().phase.as_deref() == Some("Failed")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let status = h.status();
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("PodOSNotSupported"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was rejected: Failed to admit pod as the OS field doesn't match node OS")
    );
    let rejected: Vec<_> = h
        .events
        .events()
        .into_iter()
        .filter(|(_, reason, _)| reason == "PodOSNotSupported")
        .collect();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0].0, EventKind::Warning);
    assert_eq!(
        rejected[0].2,
        "Failed to admit pod as the OS field doesn't match node OS"
    );
    assert!(h.events("Started").is_empty());
    let runtime = h.runtime_status().await;
    assert!(
        runtime.sandbox.is_none() && runtime.containers.is_empty(),
        "{runtime:#?}"
    );
}

/// Upstream e2e "Sysctls [LinuxOnly] should not launch unsafe, but not explicitly enabled
/// sysctls on the node" (the sysctl admit handler): a pod setting `kernel.msgmax`, which is not
/// safe and not allowed, is Failed with `SysctlForbidden` at once (not left
/// `ContainerCreating`), a Warning event says why, and nothing of it runs.
#[tokio::test(start_paused = true)]
async fn sysctls_should_not_launch_unsafe_but_not_explicitly_enabled_sysctls_on_the_node() {
    let h = Harness::start(Duration::ZERO);
    let mut p = pod("Never", &[], &["test-container"], &[]);
    p.spec.as_mut().unwrap().security_context = Some(
        serde_json::from_value(serde_json::json!({
            "sysctls": [{"name": "kernel.msgmax", "value": "10000000000"}]
        }))
        .unwrap(),
    );
    h.put(p);
    h.until("the pod fails", Duration::from_secs(5), async |h| {
        h.status().phase.as_deref() == Some("Failed")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let status = h.status();
    assert_eq!(status.reason.as_deref(), Some("SysctlForbidden"));
    assert_eq!(
        status.message.as_deref(),
        Some(r#"Pod was rejected: forbidden sysctl: "kernel.msgmax" not allowlisted"#)
    );
    let rejected: Vec<_> = h
        .events
        .events()
        .into_iter()
        .filter(|(_, reason, _)| reason == "SysctlForbidden")
        .collect();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0].0, EventKind::Warning);
    assert_eq!(
        rejected[0].2,
        r#"forbidden sysctl: "kernel.msgmax" not allowlisted"#
    );
    assert!(h.events("Started").is_empty());
    let runtime = h.runtime_status().await;
    assert!(
        runtime.sandbox.is_none() && runtime.containers.is_empty(),
        "{runtime:#?}"
    );
}

/// An allocator that refuses the pods named `no-devices` and records every pod it is asked.
#[derive(Default)]
struct ScriptedAllocator {
    asked: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl crate::admission::ResourceAllocator for ScriptedAllocator {
    async fn allocate(&self, pod: &Pod) -> Result<(), String> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.asked.lock().unwrap().push(name.clone());
        // An Allocate call takes a while: admission waits for it.
        tokio::time::sleep(Duration::from_millis(500)).await;
        if name == "no-devices" {
            return Err(
                "no healthy devices present; cannot allocate unhealthy devices example.com/gpu"
                    .into(),
            );
        }
        Ok(())
    }
}

/// upstream's resource allocation admit handler (`GetAllocateResourcesPodAdmitHandler`,
/// `admission.GetPodAdmitResult`): a pod whose devices cannot be allocated is Failed with
/// `UnexpectedAdmissionError` and upstream's message, a Warning event says why, and nothing of
/// it runs; a pod whose allocation succeeds runs; each new pod is asked once.
#[tokio::test(start_paused = true)]
async fn a_pod_whose_devices_cannot_be_allocated_is_rejected_unexpected_admission_error() {
    let allocator = Arc::new(ScriptedAllocator::default());
    let h = Harness::start_allocating(SimulatedConfig::default(), Some(allocator.clone()));
    let mut p = pod("Always", &[], &["c"], &[]);
    p.metadata.name = Some("no-devices".into());
    h.put(p);
    h.until("the pod fails", Duration::from_secs(5), async |h| {
        h.status().phase.as_deref() == Some("Failed")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let status = h.status();
    assert_eq!(status.reason.as_deref(), Some("UnexpectedAdmissionError"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate \
             unhealthy devices example.com/gpu, which is unexpected"
        )
    );
    let rejected = h.events("UnexpectedAdmissionError");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(h.events("Started").is_empty());
    let runtime = h.runtime_status().await;
    assert!(
        runtime.sandbox.is_none() && runtime.containers.is_empty(),
        "{runtime:#?}"
    );
    assert_eq!(*allocator.asked.lock().unwrap(), ["no-devices"]);

    let allocator = Arc::new(ScriptedAllocator::default());
    let h = Harness::start_allocating(SimulatedConfig::default(), Some(allocator.clone()));
    h.put(pod("Always", &[], &["c"], &[]));
    h.until("the pod runs", Duration::from_secs(5), async |h| {
        h.status().phase.as_deref() == Some("Running")
    })
    .await;
    assert_eq!(allocator.asked.lock().unwrap().len(), 1);
}

/// Upstream `startContainer`'s step 4 (`FailedPostStartHook`) and `SyncPod`'s start failure: a
/// container whose `postStart` hook failed gets no `Failed` event from the worker (the runtime
/// records `FailedPostStartHook` with a fixed message; the waiting message, which holds the
/// hook's output, never goes into an event); an image pull back-off is `BackOff`, other start
/// failures are `Failed`.
#[test]
fn a_failed_poststart_hook_is_no_failed_event_with_the_hooks_output() {
    use crate::lifecycle::POST_START_HOOK_ERROR;
    use crate::workers::start_failure_event;
    assert_eq!(start_failure_event(POST_START_HOOK_ERROR), None);
    assert_eq!(start_failure_event("ImagePullBackOff"), Some("BackOff"));
    assert_eq!(start_failure_event("ErrImagePull"), Some("Failed"));
    assert_eq!(start_failure_event("CreateContainerError"), Some("Failed"));
    assert_eq!(start_failure_event("RunContainerError"), Some("Failed"));
}

/// Upstream's `FileKeyRef` case of `makeEnvironmentVariables` (EnvFiles, issue 27 "MirrorPod
/// with EnvFiles"): a variable from a file of a volume the pod has not mounted keeps the
/// container from being made: it waits with `CreateContainerConfigError` and upstream's
/// message, and a `Failed` event says so.
#[tokio::test(start_paused = true)]
async fn a_file_key_ref_to_a_volume_the_pod_lacks_is_a_create_container_config_error() {
    let h = Harness::start(Duration::from_millis(10));
    let mut p = pod("Always", &[], &["app"], &[]);
    p.spec.as_mut().unwrap().containers[0].env = Some(vec![
        serde_json::from_value(
            serde_json::json!({"name": "CONFIG_1", "valueFrom": {"fileKeyRef":
            {"volumeName": "config", "path": "config.env", "key": "CONFIG_1"}}}),
        )
        .unwrap(),
    ]);
    h.put(p);
    let message = "cannot find the volume \"config\" referenced by FileKeyRef";
    h.until("the container waits", Duration::from_secs(5), async |h| {
        find(&h.status().container_statuses, "app").is_some_and(|s| {
            waiting_reason(s).as_deref() == Some("CreateContainerConfigError")
                && waiting_message(s).as_deref() == Some(message)
        })
    })
    .await;
    assert!(
        h.runtime_status().await.instances("app").0.is_none(),
        "never made"
    );
    assert_eq!(h.events("Failed"), [format!("Error: {message}")]);
}

/// One pod running, then five seconds with nothing new (the workers settled).
async fn settled_with_one_running_pod() -> Harness {
    let h = Harness::start(Duration::from_millis(10));
    h.put(pod("Always", &[], &["c"], &[]));
    h.until("the pod runs", Duration::from_secs(5), async |h| {
        h.status().phase.as_deref() == Some("Running")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    h
}

/// The test pod under another name and UID.
fn another_pod(name: &str, uid: &str) -> Pod {
    let mut other = pod("Always", &[], &["c"], &[]);
    other.metadata.name = Some(name.into());
    other.metadata.uid = Some(uid.into());
    other
}

/// Issue 29: upstream's 2 s housekeeping is kept, but on a settled node a tick reads nothing of
/// the source (a pass over it is O(pods), and was a third of the settled agent's idle CPU at
/// 1,000 pods); a change of the source is looked at in the pods its change log names, without
/// a pass over the whole source (in a 1,000-pod storm those passes were 14 % of the agent's
/// CPU).
#[tokio::test(start_paused = true)]
async fn a_settled_nodes_housekeeping_makes_no_pass_over_the_source() {
    let h = settled_with_one_running_pod().await;
    let settled = h.passes.load(Ordering::Relaxed);
    let looked_up = h.lookups.load(Ordering::Relaxed);
    // Ten housekeeping periods.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        h.passes.load(Ordering::Relaxed),
        settled,
        "no pass when nothing changed"
    );
    assert_eq!(h.lookups.load(Ordering::Relaxed), looked_up);
    // A new pod in the source: it alone is looked at, and started.
    h.put(another_pod("q", "uid-q"));
    let uid = PodUid::new("uid-q");
    h.until("the new pod runs", Duration::from_secs(5), async |h| {
        h.status
            .get_pod_status(&uid)
            .is_some_and(|s| s.phase.as_deref() == Some("Running"))
    })
    .await;
    assert!(h.lookups.load(Ordering::Relaxed) > looked_up);
    assert_eq!(
        h.passes.load(Ordering::Relaxed),
        settled,
        "a change is not a pass over the whole source"
    );
    // The pod leaves the source: its worker terminates it, from the change alone; once it
    // finished, the next housekeeping's pass forgets it.
    h.pods.remove("uid-q");
    h.changes.send_modify(|n| *n += 1);
    h.until("the pod is finished", Duration::from_secs(60), async |h| {
        h.lifecycles.get(&uid) == Some(crate::workers::Lifecycle::Finished)
    })
    .await;
    let before_forgetting = h.passes.load(Ordering::Relaxed);
    h.until(
        "the finished pod is forgotten",
        Duration::from_secs(5),
        async |h| h.lifecycles.get(&uid).is_none(),
    )
    .await;
    assert!(h.passes.load(Ordering::Relaxed) > before_forgetting);
}

/// R25 through the workers' housekeeping: a status cached for a pod the source does not have
/// goes at the next housekeeping, although the source did not change since the last one (a
/// settled tick makes no pass over the source, but a status cached since the last retain
/// makes one).
#[tokio::test(start_paused = true)]
async fn r25_a_status_cached_for_a_pod_not_in_the_source_goes_at_the_next_housekeeping() {
    let h = settled_with_one_running_pod().await;
    let orphan = another_pod("orphan", "uid-orphan");
    let uid = PodUid::new("uid-orphan");
    h.status.set_pod_status(
        &orphan,
        PodStatus {
            phase: Some("Pending".into()),
            ..PodStatus::default()
        },
    );
    assert!(h.status.get_pod_status(&uid).is_some());
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert!(
        h.status.get_pod_status(&uid).is_none(),
        "removed at the next housekeeping"
    );
    assert!(
        h.status.get_pod_status(&PodUid::new(UID)).is_some(),
        "the source's pod keeps its status"
    );
}

/// Issue 29: a worker keeps no version of its pod but the source's newest. Once the source has a
/// newer one (the agent's own status write, back through the watch: nothing a worker acts on),
/// the version the worker started with is freed; each version is a whole typed copy of the pod.
#[tokio::test(start_paused = true)]
async fn a_running_pods_first_version_is_freed_once_the_source_has_a_newer_one() {
    let h = Harness::start(Duration::ZERO);
    h.put(pod("Always", &[], &["c"], &[]));
    h.until("c runs", Duration::from_secs(5), async |h| {
        find(&h.status().container_statuses, "c").is_some_and(running)
    })
    .await;
    let first = Arc::downgrade(&h.pods.pod(&PodUid::new(UID)).expect("in the source"));
    let mut newer = pod("Always", &[], &["c"], &[]);
    newer.status = Some(h.status());
    h.put(newer);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        first.upgrade().is_none(),
        "the version the worker started with is still kept"
    );
    assert_eq!(h.status().phase.as_deref(), Some("Running"));
}
