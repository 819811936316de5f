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
            "spec":{"containers":[]}}),
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
    assert!(conflict.is_conflict(), "{conflict}");
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
            "spec":{"nodeName":node,"containers":[]}})
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
