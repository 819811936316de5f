//! Cluster mode end to end, over the test API server: a pod created through the API reaches the
//! pod cache; the volume manager (fed by that cache and the node watch) sets up its emptyDir and
//! hostPath; the status manager writes its status through the kube client; when the pod is
//! deleted, the status manager holds the terminal phase back (R44) and deletes nothing while
//! containers could run or volumes are mounted, then writes the terminal phase and deletes the
//! pod with its UID as precondition once the volume manager has reclaimed its volumes.

use std::sync::Arc;

use http::Method;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, DeleteParams, PostParams};
use rustlet_api::local::store::Store;
use rustlet_api::node::{NodeConfig, NodeRegistrar};
use rustlet_api::test_server::TestApiServer;
use rustlet_api::{Backend, KubePodStatusClient, NodeCache, PodCache};
use rustlet_core::deletion::PodDeletionSafety;
use rustlet_core::{PodUid, UniquePodName};
use rustlet_status::testing::ManualSync;
use rustlet_status::{PodManager, StatusManager, StatusManagerConfig, StatusManagerDeps};
use rustlet_volume::manager::{VolumeManager, VolumeManagerConfig, VolumeManagerDeps};
use rustlet_volume::plugins::builtin_plugins;
use rustlet_volume::testing::{FakePods, FakeRecorder};
use tokio_util::sync::CancellationToken;

/// Upstream's `PodCouldHaveRunningContainers` as far as this test's agent knows it: the pod
/// workers have not finished, or its volumes may still be mounted.
struct ReclaimedWhenUnmounted {
    workers: Arc<FakePods>,
    volumes: Arc<VolumeManager>,
}

impl PodDeletionSafety for ReclaimedWhenUnmounted {
    fn pod_could_have_running_containers(&self, pod: &Pod) -> bool {
        use rustlet_volume::populator::PodStateProvider;
        let uid = PodUid::of(pod);
        !self.workers.should_pod_runtime_be_removed(&uid)
            || self
                .volumes
                .has_possibly_mounted_volumes(&UniquePodName::from(uid))
    }
}

fn web(host_dir: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {
            "nodeName": "node-a",
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "volumeMounts": [
                {"name": "scratch", "mountPath": "/scratch"},
                {"name": "logs", "mountPath": "/logs"}
            ]}],
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "logs", "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"}}
            ]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn a_pod_is_mounted_reported_and_deleted_with_its_uid_after_its_volumes_are_reclaimed() {
    let root = tempfile::tempdir().unwrap();
    let host_dir = root.path().join("host-logs");
    let server = TestApiServer::start(Arc::new(Store::default()))
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    let backend = Backend::Cluster(client.clone());
    let cancel = CancellationToken::new();

    // The node registers itself; its watch feeds the volume manager's NodeStatus.
    let registrar = NodeRegistrar::new(client.clone(), NodeConfig::for_host("node-a"));
    registrar.register().await.unwrap();
    let node = Arc::new(NodeCache::new());
    let pods = Arc::new(PodCache::new());
    for task in [
        {
            let (node, backend) = (node.clone(), backend.clone());
            tokio::spawn(async move { node.run(&backend, "node-a").await })
        },
        {
            let (pods, backend) = (pods.clone(), backend.clone());
            tokio::spawn(async move { pods.run(&backend, "node-a").await })
        },
    ] {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            cancel.cancelled().await;
            task.abort();
        });
    }

    let workers = Arc::new(FakePods::default());
    let volumes = Arc::new(VolumeManager::new(
        VolumeManagerDeps {
            pods: pods.clone(),
            states: workers.clone(),
            mounter: Arc::new(rustlet_mount::LinuxMounter::new()),
            plugins: builtin_plugins(),
            events: Arc::new(FakeRecorder::default()),
            node: node.clone(),
            objects: None,
        },
        VolumeManagerConfig::new(root.path()),
    ));
    tokio::spawn(volumes.clone().run(cancel.clone()));

    let status = StatusManager::new(
        StatusManagerDeps::new(
            Some(Arc::new(KubePodStatusClient::new(client.clone()))),
            pods.clone(),
            Arc::new(ReclaimedWhenUnmounted {
                workers: workers.clone(),
                volumes: volumes.clone(),
            }),
        ),
        // Rustlet's own shape: the pod watch's copy is read instead of a GET before each PATCH.
        StatusManagerConfig::default(),
    );
    let mut sync = ManualSync::take(&status);

    // Created through the API; seen by the pod watch; its volumes set up.
    let api: Api<Pod> = Api::namespaced(client.clone(), "ns");
    let created = api
        .create(&PostParams::default(), &web(host_dir.to_str().unwrap()))
        .await
        .unwrap();
    let uid = PodUid::of(&created);
    let mut changes = pods.subscribe();
    changes
        .wait_for(|_| pods.pod_by_uid(&uid).is_some())
        .await
        .unwrap();
    volumes.pod_updated();
    let pod = pods.pod_by_uid(&uid).unwrap();
    volumes.wait_for_attach_and_mount(&pod).await.unwrap();
    let scratch = root.path().join(format!(
        "pods/{}/volumes/kubernetes.io~empty-dir/scratch",
        uid.as_str()
    ));
    assert!(scratch.is_dir(), "{scratch:?}");
    assert!(host_dir.is_dir(), "DirectoryOrCreate made {host_dir:?}");

    // Its status goes to the API server through the kube client.
    status.set_pod_status(
        &pod,
        PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        },
    );
    assert_eq!(sync.kick_batches().await, 1);
    let stored = api.get("web").await.unwrap();
    assert_eq!(stored.status.unwrap().phase.as_deref(), Some("Running"));

    // Deleted through the API: graceful, so it stays with a deletionTimestamp.
    api.delete("web", &DeleteParams::default()).await.unwrap();
    changes
        .wait_for(|_| {
            pods.pod_by_uid(&uid)
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
        })
        .await
        .unwrap();
    let pod = pods.pod_by_uid(&uid).unwrap();
    workers.set_terminating(uid.as_str());
    status.terminate_pod(&pod);
    sync.kick_batches().await;
    // R44: while containers could still run, the terminal phase is held back, and nothing is
    // deleted, whatever the batches say.
    sync.full_batch().await;
    let stored = api.get("web").await.unwrap();
    assert_eq!(stored.status.unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(
        server.count(&Method::DELETE, "/pods/web"),
        1,
        "only the user's delete"
    );

    // The containers are gone; the volume manager tears the volumes down; then it is deleted.
    workers.set_runtime_removed(uid.as_str());
    volumes.pod_updated();
    volumes.wait_for_unmount(&pod).await.unwrap();
    assert!(!scratch.exists(), "emptyDir removed at teardown");
    assert!(host_dir.is_dir(), "a hostPath is never removed");
    // The next full batch writes the terminal phase, then deletes with the UID precondition.
    let before = server.requests().len();
    sync.full_batch().await;
    let calls: Vec<(Method, String)> = server.requests()[before..]
        .iter()
        .filter(|r| r.path.contains("/pods/web"))
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect();
    assert_eq!(
        calls,
        [
            (
                Method::PATCH,
                "/api/v1/namespaces/ns/pods/web/status".into()
            ),
            (Method::DELETE, "/api/v1/namespaces/ns/pods/web".into()),
        ]
    );
    changes
        .wait_for(|_| pods.pod_by_uid(&uid).is_none())
        .await
        .unwrap();
    assert!(api.get_opt("web").await.unwrap().is_none());
    cancel.cancel();
}
