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

const SETTINGS: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: ns
data:
  level: debug
";

const READER: &str = r#"{"apiVersion": "v1", "kind": "Pod",
 "metadata": {"name": "reader", "namespace": "ns"},
 "spec": {"containers": [{"name": "c", "image": "busybox"}],
          "volumes": [{"name": "conf", "configMap": {"name": "settings"}}]}}
"#;

#[tokio::test]
async fn a_config_map_manifest_reaches_the_volume_objects_and_its_edit_is_announced() {
    use rustlet_api::ApiObjects;
    use rustlet_api::content::ObjectSourceConfig;
    use rustlet_volume::objects::VolumeObjects;

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("settings.yaml"), SETTINGS).unwrap();
    std::fs::write(dir.path().join("reader.json"), READER).unwrap();
    let store = Arc::new(Store::default());
    let mut manifests = DirectorySync::new(dir.path(), "node-a", store.clone());
    assert!(manifests.sync().errors.is_empty());

    let objects = ApiObjects::new(Backend::Local(store.clone()), ObjectSourceConfig::default());
    let mut changes = objects.changes();
    let reader: k8s_openapi::api::core::v1::Pod = serde_json::from_value(
        store
            .get(&ObjectRef::new(Kind::Pod, "ns", "reader"))
            .unwrap(),
    )
    .unwrap();
    objects.register_pod(&reader);
    let level =
        |cm: &k8s_openapi::api::core::v1::ConfigMap| cm.data.as_ref().unwrap()["level"].clone();
    assert_eq!(
        level(&objects.config_map("ns", "settings").await.unwrap()),
        "debug"
    );

    std::fs::write(
        dir.path().join("settings.yaml"),
        SETTINGS.replace("debug", "info"),
    )
    .unwrap();
    assert!(manifests.sync().errors.is_empty());
    assert_eq!(changes.recv().await.unwrap().name, "settings");
    assert_eq!(
        level(&objects.config_map("ns", "settings").await.unwrap()),
        "info"
    );

    // A broken edit is reported and the last good content stays.
    std::fs::write(dir.path().join("settings.yaml"), "data: [unclosed").unwrap();
    assert_eq!(manifests.sync().errors.len(), 1);
    assert_eq!(
        level(&objects.config_map("ns", "settings").await.unwrap()),
        "info"
    );
}
