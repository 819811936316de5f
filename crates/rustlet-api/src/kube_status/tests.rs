//! HTTP-shape tests: a `kube::Client` over a `tower-test` mock that checks method, path, query,
//! content type and body of every call (kube-rs's own `mock_tests.rs` pattern).

use futures::pin_mut;
use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::client::Body;
use rustlet_core::patch::status_patch;
use rustlet_status::{ClientError, PodStatusClient};
use serde_json::{Value, json};
use tower_test::mock::{Handle, pair};

use super::KubePodStatusClient;

type MockHandle = Handle<Request<Body>, Response<Body>>;

fn pod() -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("foo".into()),
            namespace: Some("new".into()),
            uid: Some("12345678".into()),
            resource_version: Some("7".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn ok(body: &Pod) -> Response<Body> {
    Response::new(Body::from(serde_json::to_vec(body).unwrap()))
}

fn status_error(code: u16, reason: &str) -> Response<Body> {
    let body = json!({"kind":"Status","apiVersion":"v1","status":"Failure","message":format!("{reason} (test)"),"reason":reason,"code":code});
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

/// One expected request: method, path and query, content type, and (parsed) body.
struct Expect {
    method: Method,
    uri: &'static str,
    content_type: Option<&'static str>,
    body: Option<Value>,
    reply: Response<Body>,
}

async fn serve(handle: MockHandle, expected: Vec<Expect>) {
    pin_mut!(handle);
    for e in expected {
        let (req, send) = handle
            .next_request()
            .await
            .expect("the client made the call");
        assert_eq!(req.method(), e.method);
        assert_eq!(req.uri().to_string(), e.uri);
        let content_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(content_type.as_deref(), e.content_type);
        let bytes = req.into_body().collect_bytes().await.unwrap();
        let body: Option<Value> =
            (!bytes.is_empty()).then(|| serde_json::from_slice(&bytes).unwrap());
        assert_eq!(body, e.body);
        send.send_response(e.reply);
    }
}

fn client() -> (KubePodStatusClient, MockHandle) {
    let (service, handle) = pair::<Request<Body>, Response<Body>>();
    (
        KubePodStatusClient::new(kube::Client::new(service, "default")),
        handle,
    )
}

#[tokio::test]
async fn get_pod_is_a_plain_get() {
    let (client, handle) = client();
    let server = tokio::spawn(serve(
        handle,
        vec![Expect {
            method: Method::GET,
            uri: "/api/v1/namespaces/new/pods/foo",
            content_type: None,
            body: None,
            reply: ok(&pod()),
        }],
    ));
    let got = client.get_pod("new", "foo").await.unwrap();
    assert_eq!(got.metadata.uid.as_deref(), Some("12345678"));
    server.await.unwrap();
}

#[tokio::test]
async fn patch_status_is_a_strategic_merge_patch_of_the_status_subresource() {
    let (client, handle) = client();
    let old = PodStatus {
        phase: Some("Pending".into()),
        ..Default::default()
    };
    let new = PodStatus {
        phase: Some("Running".into()),
        message: Some("m".into()),
        ..Default::default()
    };
    let patch = status_patch("12345678", Some("7"), &old, &new).unwrap();
    let server = tokio::spawn(serve(
        handle,
        vec![Expect {
            method: Method::PATCH,
            uri: "/api/v1/namespaces/new/pods/foo/status?",
            content_type: Some("application/strategic-merge-patch+json"),
            body: Some(
                json!({"metadata":{"uid":"12345678","resourceVersion":"7"},"status":{"phase":"Running","message":"m"}}),
            ),
            reply: ok(&pod()),
        }],
    ));
    client.patch_pod_status("new", "foo", &patch).await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn delete_carries_grace_zero_and_the_uid_precondition() {
    let (client, handle) = client();
    let server = tokio::spawn(serve(
        handle,
        vec![Expect {
            method: Method::DELETE,
            uri: "/api/v1/namespaces/new/pods/foo?",
            content_type: Some("application/json"),
            body: Some(json!({"gracePeriodSeconds":0,"preconditions":{"uid":"12345678"}})),
            reply: ok(&pod()),
        }],
    ));
    client.delete_pod("new", "foo", "12345678").await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn api_errors_are_classified() {
    let (client, handle) = client();
    let server = tokio::spawn(serve(
        handle,
        vec![
            Expect {
                method: Method::GET,
                uri: "/api/v1/namespaces/new/pods/gone",
                content_type: None,
                body: None,
                reply: status_error(404, "NotFound"),
            },
            Expect {
                method: Method::DELETE,
                uri: "/api/v1/namespaces/new/pods/foo?",
                content_type: Some("application/json"),
                body: Some(json!({"gracePeriodSeconds":0,"preconditions":{"uid":"other"}})),
                reply: status_error(409, "Conflict"),
            },
            Expect {
                method: Method::GET,
                uri: "/api/v1/namespaces/new/pods/foo",
                content_type: None,
                body: None,
                reply: status_error(500, "InternalError"),
            },
            Expect {
                method: Method::GET,
                uri: "/api/v1/namespaces/new/pods/foo",
                content_type: None,
                body: None,
                reply: status_error(429, "TooManyRequests"),
            },
        ],
    ));
    let e = client.get_pod("new", "gone").await.unwrap_err();
    assert!(e.is_not_found() && !e.is_retryable(), "{e:?}");
    let e = client.delete_pod("new", "foo", "other").await.unwrap_err();
    assert!(e.is_conflict(), "{e:?}");
    let e = client.get_pod("new", "foo").await.unwrap_err();
    assert!(
        matches!(e, ClientError::Api { code: 500, .. }) && e.is_retryable(),
        "{e:?}"
    );
    let e = client.get_pod("new", "foo").await.unwrap_err();
    assert!(
        matches!(e, ClientError::Api { code: 429, .. }) && e.is_retryable(),
        "{e:?}"
    );
    server.await.unwrap();
}

/// The status manager end to end over the adapter: one `set_pod_status` becomes upstream's
/// GET then strategic-merge PATCH of the status subresource, UID in the body.
#[tokio::test]
async fn status_manager_over_kube_sends_get_then_patch() {
    use rustlet_core::deletion::FixedDeletionSafety;
    use rustlet_status::testing::{FakePodManager, ManualSync};
    use rustlet_status::{StatusManager, StatusManagerConfig, StatusManagerDeps};
    use std::sync::Arc;

    let (client, handle) = client();
    let pods = FakePodManager::new();
    pods.add_pod(pod());
    let deps = StatusManagerDeps::new(
        Some(Arc::new(client)),
        Arc::new(pods),
        Arc::new(FixedDeletionSafety::default()),
    );
    let manager = StatusManager::new(deps, StatusManagerConfig::upstream());
    let mut sync = ManualSync::take(&manager);
    manager.set_pod_status(
        &pod(),
        PodStatus {
            message: Some("hello".into()),
            ..Default::default()
        },
    );

    let server = tokio::spawn(async move {
        pin_mut!(handle);
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(
            (req.method().clone(), req.uri().to_string()),
            (Method::GET, "/api/v1/namespaces/new/pods/foo".to_owned())
        );
        send.send_response(ok(&pod()));
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(
            (req.method().clone(), req.uri().to_string()),
            (
                Method::PATCH,
                "/api/v1/namespaces/new/pods/foo/status?".to_owned()
            )
        );
        let body: Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(
            body["metadata"],
            json!({"uid":"12345678"}),
            "UID precondition, no resourceVersion on the GET path"
        );
        assert_eq!(body["status"]["message"], "hello");
        send.send_response(ok(&pod()));
    });
    assert_eq!(sync.kick_batches().await, 1);
    server.await.unwrap();
}

/// Upstream `TestPatchPodStatus` "pod condition change", over HTTP: the exact strategic merge
/// body (with `$setElementOrder`) reaches the status subresource unchanged.
#[tokio::test]
async fn test_patch_pod_status_pod_condition_change_over_http() {
    use k8s_openapi::api::core::v1::PodCondition;

    let condition = |type_: &str, status: &str| PodCondition {
        type_: type_.into(),
        status: status.into(),
        ..Default::default()
    };
    let old = PodStatus {
        conditions: Some(vec![
            condition("Ready", "True"),
            condition("PodScheduled", "True"),
        ]),
        message: Some("Message".into()),
        ..Default::default()
    };
    let mut new = old.clone();
    new.conditions.as_mut().unwrap()[0].status = "False".into();
    let patch = status_patch("myuid", None, &old, &new).unwrap();
    let (client, handle) = client();
    let server = tokio::spawn(serve(
        handle,
        vec![Expect {
            method: Method::PATCH,
            uri: "/api/v1/namespaces/new/pods/foo/status?",
            content_type: Some("application/strategic-merge-patch+json"),
            body: Some(json!({"metadata":{"uid":"myuid"},"status":{
                "$setElementOrder/conditions":[{"type":"Ready"},{"type":"PodScheduled"}],
                "conditions":[{"status":"False","type":"Ready"}]}})),
            reply: ok(&pod()),
        }],
    ));
    client.patch_pod_status("new", "foo", &patch).await.unwrap();
    server.await.unwrap();
    // No change, no patch: nothing is sent (upstream's "unchanged").
    assert_eq!(status_patch("myuid", None, &old, &old), None);
}
