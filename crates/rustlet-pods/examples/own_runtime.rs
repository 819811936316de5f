//! rustlet-pods as a library: the pod workers over a `Runtime` of your own. This runtime runs
//! nothing: every container "runs" to completion at once with exit code 0, and each call is
//! printed. A pod with `restartPolicy: Never` comes in; the workers create its sandbox, start
//! its init container and then its container, and generate its status until it Succeeded.
//!
//! Run with `cargo run -p rustlet-pods --example own_runtime`. The status and volume managers
//! the workers feed run beside them; the status manager is standalone (no API client), and
//! the pod source and pod manager are the in-memory ones of the other crates' `test-util`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rustlet_core::PodUid;
use rustlet_core::deletion::FixedDeletionSafety;
use rustlet_pods::RuntimeError;
use rustlet_pods::runtime::{
    ContainerInstance, ContainerKind, InstanceState, RuntimePodStatus, Sandbox, container_hash,
    full_name,
};
use rustlet_pods::{PodLifecycles, PodWorkers, PodWorkersConfig, PodWorkersDeps, Runtime};
use rustlet_status::testing::FakePodManager;
use rustlet_status::{StatusManager, StatusManagerConfig, StatusManagerDeps};
use rustlet_volume::events::NoEvents;
use rustlet_volume::manager::{VolumeManager, VolumeManagerConfig, VolumeManagerDeps};
use rustlet_volume::node::NothingAttached;
use rustlet_volume::plugins::builtin_plugins;
use rustlet_volume::subpath::ContainerMount;
use rustlet_volume::testing::FakePods;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A runtime whose containers finish at once; it keeps what it "ran" per pod.
#[derive(Default)]
struct InstantJobs {
    pods: Mutex<HashMap<PodUid, RuntimePodStatus>>,
}

#[async_trait]
impl Runtime for InstantJobs {
    fn name(&self) -> &str {
        "instant"
    }

    async fn run_pod_sandbox(&self, pod: &Pod) -> Result<Sandbox, RuntimeError> {
        let mut pods = self.pods.lock().expect("not poisoned");
        let status = pods.entry(PodUid::of(pod)).or_default();
        let sandbox = status.sandbox.get_or_insert_with(|| {
            println!("runtime: sandbox for {}", full_name(pod));
            Sandbox {
                id: format!("sandbox-{}", PodUid::of(pod)),
                ready: true,
                host_network: false,
                ip: Some("10.88.0.2".to_owned()),
            }
        });
        Ok(sandbox.clone())
    }

    async fn start_container(
        &self,
        pod: &Pod,
        container: &Container,
        kind: ContainerKind,
        mounts: &[ContainerMount],
    ) -> Result<(), RuntimeError> {
        println!(
            "runtime: start {kind:?} container {} of {} ({} mounts): exits 0 at once",
            container.name,
            full_name(pod),
            mounts.len()
        );
        let now = self.now();
        let mut pods = self.pods.lock().expect("not poisoned");
        let status = pods.entry(PodUid::of(pod)).or_default();
        let attempt = status
            .containers
            .iter()
            .filter(|c| c.name == container.name)
            .count();
        let instance = ContainerInstance {
            id: format!("instant://{}-{}-{attempt}", PodUid::of(pod), container.name),
            name: container.name.clone(),
            kind,
            image: container.image.clone().unwrap_or_default(),
            image_id: String::new(),
            attempt: i32::try_from(attempt).unwrap_or(i32::MAX),
            state: InstanceState::Exited {
                started_at: now,
                finished_at: now,
                exit_code: 0,
                reason: "Completed".to_owned(),
                message: String::new(),
            },
            sandbox_id: status
                .sandbox
                .as_ref()
                .map(|s| s.id.clone())
                .unwrap_or_default(),
            hash: Some(container_hash(container)),
        };
        // Newest first.
        status.containers.insert(0, instance);
        Ok(())
    }

    async fn pod_status(&self, uid: &PodUid) -> RuntimePodStatus {
        let pods = self.pods.lock().expect("not poisoned");
        pods.get(uid).cloned().unwrap_or_default()
    }

    fn next_change(&self, _uid: &PodUid) -> Option<tokio::time::Instant> {
        // Nothing changes by itself: every container has exited by the time it is started.
        None
    }

    async fn kill_pod(&self, pod: &Pod, _grace: Duration) -> Result<(), RuntimeError> {
        println!("runtime: kill {}", full_name(pod));
        let mut pods = self.pods.lock().expect("not poisoned");
        if let Some(sandbox) = pods
            .get_mut(&PodUid::of(pod))
            .and_then(|s| s.sandbox.as_mut())
        {
            sandbox.ready = false;
        }
        Ok(())
    }

    async fn remove_pod(&self, uid: &PodUid) {
        println!("runtime: remove {uid}");
        self.pods.lock().expect("not poisoned").remove(uid);
    }
}

fn job() -> Pod {
    let container = |name: &str| Container {
        name: name.to_owned(),
        image: Some("example.com/job:1".to_owned()),
        ..Container::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some("job".to_owned()),
            namespace: Some("default".to_owned()),
            uid: Some("6f0c1b7e-0000-4000-8000-000000000002".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".to_owned()),
            init_containers: Some(vec![container("prepare")]),
            containers: vec![container("work")],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let root = tempfile::tempdir().expect("a temp root dir");
    let pods = Arc::new(FakePods::default());
    let pod_manager = FakePodManager::new();
    let lifecycles = Arc::new(PodLifecycles::new());
    let status = Arc::new(StatusManager::new(
        StatusManagerDeps::new(
            None,
            Arc::new(pod_manager.clone()),
            Arc::new(FixedDeletionSafety::default()),
        ),
        StatusManagerConfig::default(),
    ));
    let volumes = Arc::new(VolumeManager::new(
        VolumeManagerDeps {
            pods: pods.clone(),
            states: lifecycles.clone(),
            mounter: Arc::new(rustlet_mount::LinuxMounter::new()),
            plugins: builtin_plugins(),
            events: Arc::new(NoEvents),
            node: Arc::new(NothingAttached),
            objects: None,
        },
        VolumeManagerConfig::new(root.path()),
    ));
    let (changes, changes_rx) = watch::channel(0);
    let workers = PodWorkers::new(
        PodWorkersDeps {
            pods: pods.clone(),
            changes: changes_rx,
            lifecycles,
            status: status.clone(),
            volumes: volumes.clone(),
            runtime: Arc::new(InstantJobs::default()),
            grpc: None,
            events: Arc::new(NoEvents),
        },
        PodWorkersConfig::new(root.path()),
    );
    let cancel = CancellationToken::new();
    let volume_task = tokio::spawn(volumes.run(cancel.clone()));
    let workers_task = tokio::spawn(workers.run(cancel.clone()));

    // The pod arrives, as a watch would deliver it.
    let pod = job();
    pod_manager.add_pod(pod.clone());
    pods.add(Arc::new(pod.clone()));
    changes.send_modify(|n| *n += 1);

    // Wait (at most 30 s) until the workers have reported it Succeeded.
    let uid = PodUid::of(&pod);
    let mut last_phase = String::new();
    for _ in 0..300 {
        let phase = status
            .get_pod_status(&uid)
            .and_then(|s| s.phase)
            .unwrap_or_default();
        if phase != last_phase {
            println!("status: phase {phase}");
            last_phase = phase;
        }
        if last_phase == "Succeeded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last_phase, "Succeeded");
    let final_status = status.get_pod_status(&uid).expect("a status");
    for c in final_status.container_statuses.iter().flatten() {
        let terminated = c.state.as_ref().and_then(|s| s.terminated.as_ref());
        println!(
            "status: container {} terminated with {:?}",
            c.name,
            terminated.map(|t| (t.exit_code, t.reason.clone()))
        );
    }

    cancel.cancel();
    workers_task.await.expect("the workers stop");
    volume_task.await.expect("the volume manager stops");
}
