//! HTTP shapes of registration, lease renewal and `volumesInUse`.

use futures::pin_mut;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::pair;

use super::{NodeConfig, NodeRegistrar};

fn registrar() -> (
    NodeRegistrar,
    tower_test::mock::Handle<Request<Body>, Response<Body>>,
) {
    let (service, handle) = pair::<Request<Body>, Response<Body>>();
    let mut config = NodeConfig::for_host("node-a");
    config.cpus = 2;
    config.memory_bytes = 4 << 30;
    (
        NodeRegistrar::new(kube::Client::new(service, "default"), config),
        handle,
    )
}

fn not_found() -> Response<Body> {
    let body = json!({"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"not found"});
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

fn json_reply(v: &Value) -> Response<Body> {
    Response::new(Body::from(serde_json::to_vec(v).unwrap()))
}

async fn body(req: Request<Body>) -> Value {
    serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap()
}

#[tokio::test]
async fn an_absent_node_is_created_with_kubelet_capacity_and_a_ready_condition() {
    let (r, handle) = registrar();
    let server = tokio::spawn(async move {
        pin_mut!(handle);
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(
            (req.method().clone(), req.uri().path().to_owned()),
            (Method::GET, "/api/v1/nodes/node-a".to_owned())
        );
        send.send_response(not_found());
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(
            (req.method().clone(), req.uri().path().to_owned()),
            (Method::POST, "/api/v1/nodes".to_owned())
        );
        let node = body(req).await;
        assert_eq!(node["metadata"]["name"], "node-a");
        assert_eq!(
            node["status"]["capacity"],
            json!({"cpu":"2","memory":"4194304Ki","pods":"110"})
        );
        assert_eq!(node["status"]["conditions"][0]["type"], "Ready");
        assert_eq!(node["status"]["conditions"][0]["reason"], "KubeletReady");
        assert_eq!(
            node["status"]["addresses"],
            json!([{"type":"Hostname","address":"node-a"}])
        );
        assert_eq!(
            node["metadata"]["labels"]["kubernetes.io/hostname"],
            "node-a"
        );
        let mut created = node.clone();
        created["metadata"]["uid"] = json!("node-uid");
        send.send_response(json_reply(&created));
    });
    let node = r.register().await.unwrap();
    assert_eq!(node.metadata.uid.as_deref(), Some("node-uid"));
    server.await.unwrap();
}

#[tokio::test]
async fn a_present_node_is_left_alone() {
    let (r, handle) = registrar();
    let server = tokio::spawn(async move {
        pin_mut!(handle);
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), Method::GET);
        send.send_response(json_reply(
            &json!({"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a","uid":"u"}}),
        ));
    });
    r.register().await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn the_lease_is_created_owned_by_the_node_then_renewed_with_its_resource_version() {
    let (r, handle) = registrar();
    let server = tokio::spawn(async move {
        pin_mut!(handle);
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(
            req.uri().path(),
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-a"
        );
        send.send_response(not_found());
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(
            (req.method().clone(), req.uri().path().to_owned()),
            (
                Method::POST,
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases".to_owned()
            )
        );
        let lease = body(req).await;
        assert_eq!(lease["spec"]["holderIdentity"], "node-a");
        assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
        assert!(lease["spec"]["renewTime"].is_string());
        assert_eq!(lease["metadata"]["ownerReferences"][0]["uid"], "node-uid");
        let mut stored = lease.clone();
        stored["metadata"]["resourceVersion"] = json!("5");
        send.send_response(json_reply(&stored));
        // Renewal: GET, then PUT carrying the resourceVersion.
        let (_req, send) = handle.next_request().await.unwrap();
        send.send_response(json_reply(&stored));
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(
            (req.method().clone(), req.uri().path().to_owned()),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-a".to_owned()
            )
        );
        let renewed = body(req).await;
        assert_eq!(renewed["metadata"]["resourceVersion"], "5");
        send.send_response(json_reply(&renewed));
    });
    r.renew_lease("node-uid").await.unwrap();
    r.renew_lease("node-uid").await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn volumes_in_use_is_a_merge_patch_of_the_node_status() {
    let (r, handle) = registrar();
    let server = tokio::spawn(async move {
        pin_mut!(handle);
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(
            (req.method().clone(), req.uri().path().to_owned()),
            (Method::PATCH, "/api/v1/nodes/node-a/status".to_owned())
        );
        assert_eq!(
            req.headers()[http::header::CONTENT_TYPE],
            "application/merge-patch+json"
        );
        assert_eq!(
            body(req).await,
            json!({"status":{"volumesInUse":["kubernetes.io/csi/d^v1"]}})
        );
        send.send_response(json_reply(
            &json!({"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a"}}),
        ));
    });
    r.set_volumes_in_use(&["kubernetes.io/csi/d^v1".to_owned()])
        .await
        .unwrap();
    server.await.unwrap();
}
