//! The status manager's client over the local store.

use std::sync::Arc;

use rustlet_status::PodStatusClient;
use serde_json::json;

use super::LocalPodStatusClient;
use super::store::Store;

#[tokio::test]
async fn get_patch_and_delete_keep_api_semantics() {
    let store = Arc::new(Store::default());
    let created = store
        .create(
            json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns"},
            "spec":{"containers":[{"name":"c","image":"busybox"}]}}),
        )
        .unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
    let client = LocalPodStatusClient::new(store.clone());
    let pod = client.get_pod("ns", "p").await.unwrap();
    assert_eq!(pod.metadata.uid.as_deref(), Some(uid.as_str()));
    let patched = client
        .patch_pod_status(
            "ns",
            "p",
            &json!({"metadata":{"uid":uid},"status":{"phase":"Succeeded"}}),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().phase.as_deref(), Some("Succeeded"));
    let conflict = client
        .patch_pod_status(
            "ns",
            "p",
            &json!({"metadata":{"uid":"old"},"status":{"phase":"Failed"}}),
        )
        .await
        .unwrap_err();
    assert!(conflict.is_uid_mismatch(), "{conflict}");
    assert!(
        client
            .delete_pod("ns", "p", "old")
            .await
            .unwrap_err()
            .is_conflict()
    );
    client.delete_pod("ns", "p", &uid).await.unwrap();
    assert!(client.get_pod("ns", "p").await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn the_pod_cache_follows_the_local_store() {
    use rustlet_core::PodUid;
    use rustlet_status::PodManager;
    use rustlet_volume::populator::PodSource;

    use super::store::{DeleteOptions, Kind, ObjectRef};
    use crate::pod_cache::PodCache;

    let store = Arc::new(Store::default());
    let pod = |name: &str, node: &str| {
        json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":name,"namespace":"ns","uid":name},
            "spec":{"nodeName":node,"containers":[{"name":"c","image":"busybox"}]}})
    };
    store.create(pod("before", "node-a")).unwrap();
    store.create(pod("elsewhere", "node-b")).unwrap();
    let cache = Arc::new(PodCache::new());
    let mut changes = cache.subscribe();
    let feeder = {
        let (cache, backend) = (cache.clone(), crate::Backend::Local(store.clone()));
        tokio::spawn(async move { cache.run(&backend, "node-a").await })
    };
    changes
        .wait_for(|_| cache.all_sources_ready())
        .await
        .unwrap();
    assert!(cache.pod_by_uid(&PodUid::new("before")).is_some());
    assert!(cache.pod_by_uid(&PodUid::new("elsewhere")).is_none());
    store.create(pod("after", "node-a")).unwrap();
    changes
        .wait_for(|_| cache.pod_by_uid(&PodUid::new("after")).is_some())
        .await
        .unwrap();
    let zero = DeleteOptions {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    store
        .delete(&ObjectRef::new(Kind::Pod, "ns", "before"), &zero)
        .unwrap();
    changes
        .wait_for(|_| cache.pod_by_uid(&PodUid::new("before")).is_none())
        .await
        .unwrap();
    feeder.abort();
}

fn config_map(name: &str, value: &str) -> serde_json::Value {
    json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":"ns"},
        "data":{"k":value}})
}

fn pod_using(uid: &str, config_map: &str, secret: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name":"c","image":"busybox"}], "volumes": [
            {"name": "c", "configMap": {"name": config_map}},
            {"name": "s", "secret": {"secretName": secret}}
        ]}
    }))
    .unwrap()
}

fn local_objects(store: &Arc<Store>) -> crate::objects::ApiObjects {
    crate::objects::ApiObjects::new(
        crate::Backend::Local(store.clone()),
        crate::content::ObjectSourceConfig::default(),
    )
}

#[tokio::test(start_paused = true)]
async fn registered_config_maps_and_secrets_are_served_and_their_changes_announced() {
    use rustlet_core::refs::ObjectKind;
    use rustlet_volume::objects::{FetchFailure, ObjectChange, VolumeObjects};

    use super::store::{DeleteOptions, Kind, ObjectRef};

    let store = Arc::new(Store::default());
    store.create(config_map("settings", "one")).unwrap();
    store.create(config_map("unrelated", "x")).unwrap();
    let objects = local_objects(&store);
    let mut changes = objects.changes();
    // Not registered yet: upstream's "not registered" error, nothing watched.
    let early = objects.config_map("ns", "settings").await.unwrap_err();
    assert_eq!(*early.reason(), FetchFailure::NotRegistered);

    let pod = pod_using("p1", "settings", "token");
    objects.register_pod(&pod);
    let got = objects.config_map("ns", "settings").await.unwrap();
    assert_eq!(got.data.as_ref().unwrap()["k"], "one");
    let missing = objects.secret("ns", "token").await.unwrap_err();
    assert!(missing.is_not_found(), "{missing}");
    assert_eq!(missing.to_string(), "get secret ns/token: not found");
    // The unregistered ConfigMap stays unreadable.
    assert_eq!(
        *objects
            .config_map("ns", "unrelated")
            .await
            .unwrap_err()
            .reason(),
        FetchFailure::NotRegistered
    );

    // A write to an object nobody references is not announced; writes to registered ones are.
    store.update(config_map("unrelated", "y")).unwrap();
    store.update(config_map("settings", "two")).unwrap();
    assert_eq!(
        changes.recv().await.unwrap(),
        ObjectChange {
            kind: ObjectKind::ConfigMap,
            namespace: "ns".into(),
            name: "settings".into()
        }
    );
    let got = objects.config_map("ns", "settings").await.unwrap();
    assert_eq!(got.data.as_ref().unwrap()["k"], "two");
    store
        .create(json!({"apiVersion":"v1","kind":"Secret",
            "metadata":{"name":"token","namespace":"ns"},"data":{"t":"c2VjcmV0"}}))
        .unwrap();
    assert_eq!(changes.recv().await.unwrap().kind, ObjectKind::Secret);
    let secret = objects.secret("ns", "token").await.unwrap();
    assert_eq!(secret.data.as_ref().unwrap()["t"].0, b"secret");

    store
        .delete(
            &ObjectRef::new(Kind::ConfigMap, "ns", "settings"),
            &DeleteOptions::default(),
        )
        .unwrap();
    assert_eq!(changes.recv().await.unwrap().name, "settings");
    assert!(
        objects
            .config_map("ns", "settings")
            .await
            .unwrap_err()
            .is_not_found()
    );

    // The last pod gone, nothing is watched any more.
    objects.unregister_pod(&pod);
    assert!(objects.config_maps().watched().is_empty());
    assert!(objects.secrets().watched().is_empty());
    assert!(changes.try_recv().is_err(), "only the changes above");
}

#[tokio::test]
async fn claims_and_volumes_are_read_from_the_store_and_tokens_need_a_cluster() {
    use rustlet_core::PodUid;
    use rustlet_volume::objects::{FetchFailure, TokenRequestKey, VolumeObjects};

    let store = Arc::new(Store::default());
    store
        .create(json!({"apiVersion":"v1","kind":"PersistentVolumeClaim",
            "metadata":{"name":"data","namespace":"ns"},"spec":{"volumeName":"pv-1"}}))
        .unwrap();
    store
        .create(
            json!({"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"pv-1"},
            "spec":{"local":{"path":"/mnt/disks/a"}}}),
        )
        .unwrap();
    let objects = local_objects(&store);
    let claim = objects.persistent_volume_claim("ns", "data").await.unwrap();
    let name = claim.spec.unwrap().volume_name.unwrap();
    let volume = objects.persistent_volume(&name).await.unwrap();
    assert_eq!(volume.spec.unwrap().local.unwrap().path, "/mnt/disks/a");
    let absent = objects
        .persistent_volume_claim("other", "data")
        .await
        .unwrap_err();
    assert_eq!(
        absent.to_string(),
        "get persistentvolumeclaim other/data: not found"
    );
    assert!(
        objects
            .persistent_volume("pv-2")
            .await
            .unwrap_err()
            .is_not_found()
    );

    let key = TokenRequestKey {
        namespace: "ns".into(),
        service_account: "default".into(),
        audiences: vec![],
        expiration_seconds: 3607,
        pod_name: "p".into(),
        pod_uid: "u".into(),
    };
    let err = objects.service_account_token(&key).await.unwrap_err();
    assert!(
        matches!(err.reason(), FetchFailure::Unsupported(_)),
        "{err}"
    );
    assert!(!err.is_retryable());
    assert!(
        err.to_string().contains("local mode has no token issuer"),
        "{err}"
    );
    objects.forget_tokens_of(&PodUid::new("u"));
}

#[tokio::test(start_paused = true)]
async fn the_node_cache_follows_the_local_store() {
    use rustlet_volume::node::NodeStatus;

    let store = Arc::new(Store::default());
    let cache = Arc::new(crate::NodeCache::new());
    let mut changes = cache.subscribe();
    let runner = {
        let (cache, backend) = (cache.clone(), crate::Backend::Local(store.clone()));
        tokio::spawn(async move { cache.run(&backend, "node-a").await })
    };
    store
        .create(
            json!({"apiVersion":"v1","kind":"Node","metadata":{"name":"node-b"},
            "status":{"volumesAttached":[{"name":"elsewhere","devicePath":"/dev/b"}]}}),
        )
        .unwrap();
    store
        .create(json!({"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a"}}))
        .unwrap();
    store
        .patch_status(
            &super::store::ObjectRef::new(super::store::Kind::Node, "", "node-a"),
            &json!({"status":{"volumesAttached":[{"name":"kubernetes.io/csi/d^v","devicePath":"/dev/a"}]}}),
        )
        .unwrap();
    changes
        .wait_for(|_| !cache.volumes_attached().is_empty())
        .await
        .unwrap();
    let attached = cache.volumes_attached();
    assert_eq!(attached.len(), 1);
    assert_eq!(attached[0].name.as_str(), "kubernetes.io/csi/d^v");
    assert_eq!(attached[0].device_path, "/dev/a");
    runner.abort();
}

#[tokio::test(start_paused = true)]
async fn a_local_watch_that_falls_behind_lists_again() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher::Event;

    use super::store::{Kind, Selection};
    use crate::backend::WatchError;

    let store = Arc::new(Store::default());
    store.create(config_map("a", "0")).unwrap();
    let mut stream = Box::pin(super::watch::events::<ConfigMap>(
        store.clone(),
        Selection::all(Kind::ConfigMap),
    ));
    assert!(matches!(stream.next().await, Some(Ok(Event::Init))));
    assert!(matches!(stream.next().await, Some(Ok(Event::InitApply(_)))));
    assert!(matches!(stream.next().await, Some(Ok(Event::InitDone))));
    store.update(config_map("a", "1")).unwrap();
    match stream.next().await {
        Some(Ok(Event::Apply(cm))) => assert_eq!(cm.data.unwrap()["k"], "1"),
        other => panic!("expected the update, got {other:?}"),
    }
    // More writes than the store keeps while nobody reads: the watch is gone.
    for i in 0..2000 {
        store.update(config_map("a", &i.to_string())).unwrap();
    }
    store.create(config_map("b", "new")).unwrap();
    assert!(matches!(
        stream.next().await,
        Some(Err(WatchError::Local(
            super::store::StoreError::Gone { .. }
        )))
    ));
    // ...and lists again: the current state, nothing lost.
    assert!(matches!(stream.next().await, Some(Ok(Event::Init))));
    let mut listed = Vec::new();
    while let Some(Ok(Event::InitApply(cm))) = stream.next().await {
        listed.push((cm.metadata.name.unwrap(), cm.data.unwrap()["k"].clone()));
    }
    listed.sort();
    assert_eq!(
        listed,
        [
            ("a".to_owned(), "1999".to_owned()),
            ("b".to_owned(), "new".to_owned())
        ]
    );
}
