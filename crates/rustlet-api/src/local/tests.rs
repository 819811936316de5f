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
