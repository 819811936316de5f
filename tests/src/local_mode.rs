//! Local mode end to end: a pod written as a manifest reaches the pod cache, its status reaches
//! the store through the status manager, and when its manifest goes the pod terminates and is
//! deleted with its UID once the status manager has terminated it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PodStatus;
use rustlet_api::local::LocalPodStatusClient;
use rustlet_api::local::manifests::DirectorySync;
use rustlet_api::local::store::{Kind, ObjectRef, Store};
use rustlet_api::{Backend, PodCache};
use rustlet_core::PodUid;
use rustlet_core::deletion::FixedDeletionSafety;
use rustlet_status::testing::ManualSync;
use rustlet_status::{PodManager, StatusManager, StatusManagerConfig, StatusManagerDeps};

const WEB: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: ns
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: nginx
";

#[tokio::test]
async fn a_manifest_pod_gets_its_status_and_is_deleted_with_its_uid_when_withdrawn() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
    let store = Arc::new(Store::default());
    let mut manifests = DirectorySync::new(dir.path(), "node-a", store.clone());
    assert!(manifests.sync().errors.is_empty());
    let web = ObjectRef::new(Kind::Pod, "ns", "web");
    let uid = PodUid::new(
        store.get(&web).unwrap()["metadata"]["uid"]
            .as_str()
            .unwrap(),
    );

    let cache = Arc::new(PodCache::new());
    let mut changes = cache.subscribe();
    let feeder = {
        let (cache, backend) = (cache.clone(), Backend::Local(store.clone()));
        tokio::spawn(async move { cache.run(&backend, "node-a").await })
    };
    changes
        .wait_for(|_| cache.pod_by_uid(&uid).is_some())
        .await
        .unwrap();

    let deps = StatusManagerDeps::new(
        Some(Arc::new(LocalPodStatusClient::new(store.clone()))),
        cache.clone(),
        Arc::new(FixedDeletionSafety::default()),
    );
    let manager = StatusManager::new(deps, StatusManagerConfig::upstream());
    let mut sync = ManualSync::take(&manager);
    let pod = cache.pod_by_uid(&uid).unwrap();
    manager.set_pod_status(
        &pod,
        PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        },
    );
    assert_eq!(sync.kick_batches().await, 1);
    assert_eq!(store.get(&web).unwrap()["status"]["phase"], "Running");

    // The manifest goes: the pod is terminating, not gone.
    std::fs::remove_file(dir.path().join("web.yaml")).unwrap();
    assert_eq!(manifests.sync().terminating, vec![web.clone()]);
    changes
        .wait_for(|_| {
            cache
                .pod_by_uid(&uid)
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
        })
        .await
        .unwrap();
    assert!(store.get(&web).is_ok(), "a withdrawn pod is not dropped");

    // The agent stops it; the status manager writes the terminal status, then deletes it.
    let pod = cache.pod_by_uid(&uid).unwrap();
    manager.terminate_pod(&pod);
    sync.kick_batches().await;
    changes
        .wait_for(|_| cache.pod_by_uid(&uid).is_none())
        .await
        .unwrap();
    let err = store.get(&web).unwrap_err();
    assert_eq!(err.code(), 404, "{err}");
    feeder.abort();
}
