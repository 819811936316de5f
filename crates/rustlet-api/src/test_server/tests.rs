//! The test API server driven by the real adapters over HTTP: the status client, the pod
//! watch, node registration and lease, tokens, faults and the request log.

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use k8s_openapi::api::core::v1::Pod;
use rustlet_core::PodUid;
use rustlet_status::{PodManager, PodStatusClient};
use serde_json::json;

use super::{Fault, FaultAction, TestApiServer};
use crate::local::store::{Kind, ObjectRef, Store};
use crate::{KubePodStatusClient, PodCache};

fn pod(name: &str, node: &str) -> serde_json::Value {
    json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":name,"namespace":"ns"},
        "spec":{"nodeName":node,"containers":[{"name":"c","image":"busybox"}]}})
}

async fn server() -> TestApiServer {
    TestApiServer::start(Arc::new(Store::default()))
        .await
        .unwrap()
}

#[tokio::test]
async fn the_status_client_gets_patches_and_deletes_with_preconditions() {
    let server = server().await;
    let created = server.store().create(pod("web", "node-a")).unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
    let client = KubePodStatusClient::new(server.client().await.unwrap());

    let got = client.get_pod("ns", "web").await.unwrap();
    assert_eq!(got.metadata.uid.as_deref(), Some(uid.as_str()));
    let patched = client
        .patch_pod_status(
            "ns",
            "web",
            &json!({"metadata":{"uid":uid},"status":{"phase":"Running"}}),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().phase.as_deref(), Some("Running"));
    let err = client
        .patch_pod_status(
            "ns",
            "web",
            &json!({"metadata":{"uid":"other"},"status":{"phase":"Failed"}}),
        )
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert!(
        client
            .delete_pod("ns", "web", "other")
            .await
            .unwrap_err()
            .is_conflict()
    );
    client.delete_pod("ns", "web", &uid).await.unwrap();
    assert!(
        client
            .get_pod("ns", "web")
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert_eq!(
        server.count(&Method::PATCH, "/api/v1/namespaces/ns/pods/web/status"),
        2
    );
}

#[tokio::test]
async fn the_pod_watch_follows_the_server_through_a_cut_stream() {
    let server = server().await;
    server.store().create(pod("a", "node-a")).unwrap();
    server.store().create(pod("elsewhere", "node-b")).unwrap();
    // The first watch stream ends after one event; the watcher must watch again.
    server.inject(Fault {
        method: Some(Method::GET),
        path_contains: "/api/v1/pods".into(),
        action: FaultAction::CutWatchAfter(1),
        times: Some(2),
    });
    let client = server.client().await.unwrap();
    let cache = Arc::new(PodCache::new());
    let mut changes = cache.subscribe();
    let runner = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.run(kube::Api::<Pod>::all(client), "node-a").await })
    };
    let uid_of = |name: &str| {
        PodUid::new(
            server
                .store()
                .get(&ObjectRef::new(Kind::Pod, "ns", name))
                .unwrap()["metadata"]["uid"]
                .as_str()
                .unwrap(),
        )
    };
    let a = uid_of("a");
    changes
        .wait_for(|_| cache.pod_by_uid(&a).is_some())
        .await
        .unwrap();
    assert!(cache.pod_by_uid(&uid_of("elsewhere")).is_none());
    for name in ["b", "c"] {
        server.store().create(pod(name, "node-a")).unwrap();
    }
    let (b, c) = (uid_of("b"), uid_of("c"));
    tokio::time::timeout(
        Duration::from_secs(30),
        changes.wait_for(|_| cache.pod_by_uid(&b).is_some() && cache.pod_by_uid(&c).is_some()),
    )
    .await
    .expect("the watcher resumed after the cut")
    .unwrap();
    let watches = server
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/v1/pods" && r.query.contains("watch=true"))
        .count();
    assert!(watches >= 2, "{:?}", server.requests());
    runner.abort();
}

#[tokio::test]
async fn injected_errors_reach_the_caller_and_requests_are_logged() {
    let server = server().await;
    server.store().create(pod("web", "node-a")).unwrap();
    let client = KubePodStatusClient::new(server.client().await.unwrap());
    let once = |code| Fault {
        method: Some(Method::GET),
        path_contains: "/pods/web".into(),
        action: FaultAction::Status(code),
        times: Some(1),
    };
    server.inject(once(500));
    let err = client.get_pod("ns", "web").await.unwrap_err();
    assert!(err.is_retryable() && !err.is_conflict(), "{err}");
    server.inject(once(409));
    assert!(client.get_pod("ns", "web").await.unwrap_err().is_conflict());
    // kube 5's default client retries 429/503/504 itself (RetryPolicy::server_retry): one 429
    // costs a second request, not an error.
    server.inject(once(429));
    assert!(client.get_pod("ns", "web").await.is_ok());
    assert_eq!(
        server.count(&Method::GET, "/api/v1/namespaces/ns/pods/web"),
        4
    );
    assert!(
        client.get_pod("ns", "web").await.is_ok(),
        "faults were used up"
    );
    assert_eq!(server.requests().len(), 5);
}

#[tokio::test]
async fn node_registration_and_lease_over_the_server() {
    use crate::node::{NODE_LEASE_NAMESPACE, NodeConfig, NodeRegistrar};

    let server = server().await;
    let registrar = NodeRegistrar::new(
        server.client().await.unwrap(),
        NodeConfig::for_host("node-a"),
    );
    let node = registrar.register().await.unwrap();
    let uid = node.metadata.uid.unwrap();
    let stored = server
        .store()
        .get(&ObjectRef::new(Kind::Node, "", "node-a"))
        .unwrap();
    assert_eq!(stored["status"]["capacity"]["pods"], "110");
    // The status subresource takes the merge patch of volumesInUse.
    registrar
        .set_volumes_in_use(&["kubernetes.io/csi/d^v".into()])
        .await
        .unwrap();
    let stored = server
        .store()
        .get(&ObjectRef::new(Kind::Node, "", "node-a"))
        .unwrap();
    assert_eq!(
        stored["status"]["volumesInUse"],
        json!(["kubernetes.io/csi/d^v"])
    );
    // Created, then renewed by a replace carrying its resourceVersion.
    registrar.renew_lease(&uid).await.unwrap();
    let renewed = registrar.renew_lease(&uid).await.unwrap();
    assert_eq!(server.count(&Method::PUT, "/leases/node-a"), 1);
    assert!(renewed.metadata.resource_version.is_some());
    let lease = server
        .store()
        .get(&ObjectRef::new(Kind::Lease, NODE_LEASE_NAMESPACE, "node-a"))
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "node-a");
}

#[tokio::test]
async fn token_requests_are_answered() {
    use crate::objects::{KubeObjects, TokenRequestKey};

    let server = server().await;
    let objects = KubeObjects::new(server.client().await.unwrap());
    let key = TokenRequestKey {
        namespace: "ns".into(),
        service_account: "default".into(),
        audiences: vec![],
        expiration_seconds: 3607,
        pod_name: "web".into(),
        pod_uid: "uid".into(),
    };
    let token = objects.service_account_token(&key).await.unwrap();
    assert!(
        token.token.starts_with("test-token-default-"),
        "{}",
        token.token
    );
    assert_eq!(
        server.count(&Method::POST, "/serviceaccounts/default/token"),
        1
    );
}
