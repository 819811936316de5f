//! The test API server driven by the real adapters over HTTP: the status client, the pod
//! watch, node registration and lease, tokens, faults and the request log.

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use rustlet_core::PodUid;
use rustlet_status::{PodManager, PodStatusClient};
use serde_json::{Value, json};

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
    assert!(
        err.is_uid_mismatch(),
        "422 on metadata.uid, as the API server: {err}"
    );
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
        tokio::spawn(async move { cache.run(&crate::Backend::Cluster(client), "node-a").await })
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
    use rustlet_volume::objects::{TokenRequestKey, VolumeObjects};

    use crate::backend::Backend;
    use crate::content::ObjectSourceConfig;
    use crate::objects::ApiObjects;

    let server = server().await;
    let objects = ApiObjects::new(
        Backend::Cluster(server.client().await.unwrap()),
        ObjectSourceConfig::default(),
    );
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

/// A step: the operation, the status code it must give, and a field a success must carry.
type Step = (Op, u16, Option<(&'static str, serde_json::Value)>);

/// One operation of the conformance table. Namespaced objects live in `ns`.
enum Op {
    /// POST (the kind and namespace come from the body).
    Create(serde_json::Value),
    /// PUT (the kind, namespace and name come from the body).
    Replace(serde_json::Value),
    Get(Kind, &'static str),
    /// PATCH of the status subresource: strategic merge for pods, JSON merge otherwise.
    PatchStatus(Kind, &'static str, serde_json::Value),
    /// DELETE of a pod: grace period and UID precondition.
    Delete(&'static str, Option<i64>, Option<&'static str>),
    /// LIST with a field selector; the result is `{"count": n}`.
    List(Kind, &'static str),
}

fn object(kind: &str, name: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut object =
        json!({"apiVersion":"v1","kind":kind,"metadata":{"name":name,"namespace":"ns"}});
    crate::local::store::json_merge(&mut object, &extra);
    object
}

/// Steps shared by both backends; `"$uid"` in a body or precondition is the UID that `create`
/// returned for the first pod. Expected: the code, and for successes a field that must hold.
fn conformance_table() -> Vec<Step> {
    use Kind::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
    use Op::*;
    let mut graceful = pod("p", "node-a");
    graceful["spec"]["terminationGracePeriodSeconds"] = json!(30);
    let settings = |value: &str, meta: serde_json::Value| {
        object(
            "ConfigMap",
            "settings",
            json!({"metadata": meta, "data": {"k": value}}),
        )
    };
    let node = |extra| {
        let mut node = object("Node", "node-a", extra);
        node["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("namespace");
        node
    };
    vec![
        // Pods: create, get, the status subresource with its preconditions, graceful deletion.
        (
            Create(graceful.clone()),
            201,
            Some(("/metadata/namespace", json!("ns"))),
        ),
        (Create(graceful), 409, None),
        (
            Get(Pod, "p"),
            200,
            Some(("/spec/nodeName", json!("node-a"))),
        ),
        (Get(Pod, "missing"), 404, None),
        (
            PatchStatus(
                Pod,
                "p",
                json!({"metadata":{"uid":"$uid"},"status":{"phase":"Running"}}),
            ),
            200,
            Some(("/status/phase", json!("Running"))),
        ),
        (
            PatchStatus(
                Pod,
                "p",
                json!({"metadata":{"uid":"wrong"},"status":{"phase":"Failed"}}),
            ),
            // A patch's UID is checked by validation, after the resourceVersion: 422.
            422,
            None,
        ),
        (
            PatchStatus(
                Pod,
                "p",
                json!({"metadata":{"resourceVersion":"1"},"status":{"phase":"Failed"}}),
            ),
            409,
            None,
        ),
        (
            PatchStatus(
                Pod,
                "p",
                json!({"status":{"conditions":[{"type":"Ready","status":"True"}]}}),
            ),
            200,
            Some(("/status/phase", json!("Running"))),
        ),
        (PatchStatus(Pod, "missing", json!({"status":{}})), 404, None),
        (Delete("p", None, Some("wrong")), 409, None),
        (
            Delete("p", None, None),
            200,
            Some(("/metadata/deletionGracePeriodSeconds", json!(30))),
        ),
        (
            Get(Pod, "p"),
            200,
            Some(("/status/phase", json!("Running"))),
        ),
        (Delete("p", Some(0), Some("$uid")), 200, None),
        (Get(Pod, "p"), 404, None),
        (Delete("p", Some(0), None), 404, None),
        (
            Create(json!({"apiVersion":"v1","kind":"Pod","metadata":{}})),
            422,
            None,
        ),
        // Field selectors on a list.
        (Create(pod("q", "node-a")), 201, None),
        (Create(pod("r", "node-b")), 201, None),
        (
            List(Pod, "spec.nodeName=node-a"),
            200,
            Some(("/count", json!(1))),
        ),
        (
            List(Pod, "spec.nodeName!=node-a"),
            200,
            Some(("/count", json!(1))),
        ),
        // ConfigMaps: replace with resourceVersion and UID preconditions.
        (
            Create(settings("1", json!({}))),
            201,
            Some(("/data/k", json!("1"))),
        ),
        (
            Replace(settings("2", json!({"resourceVersion": "1"}))),
            409,
            None,
        ),
        (Replace(settings("2", json!({"uid": "wrong"}))), 409, None),
        (
            Replace(settings("2", json!({}))),
            200,
            Some(("/data/k", json!("2"))),
        ),
        (
            Get(ConfigMap, "settings"),
            200,
            Some(("/data/k", json!("2"))),
        ),
        (Replace(object("ConfigMap", "absent", json!({}))), 404, None),
        (List(ConfigMap, ""), 200, Some(("/count", json!(1)))),
        // Admission: a hostile key is refused, stringData becomes data, defaults are applied.
        (
            Create(object(
                "ConfigMap",
                "hostile",
                json!({"data": {"../x": "v"}}),
            )),
            422,
            None,
        ),
        (
            Create(object("Secret", "plain", json!({"stringData": {"k": "v"}}))),
            201,
            Some(("/data/k", json!("dg=="))),
        ),
        (
            Create(
                json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"d","namespace":"ns"},
                "spec":{"containers":[{"name":"c","image":"busybox"}],
                    "volumes":[{"name":"v","configMap":{"name":"settings"}}]}}),
            ),
            201,
            Some(("/spec/volumes/0/configMap/defaultMode", json!(420))),
        ),
        // Secrets, claims and cluster-scoped volumes.
        (
            Create(object(
                "Secret",
                "token",
                json!({"data": {"t": "c2VjcmV0"}}),
            )),
            201,
            None,
        ),
        (
            Get(Secret, "token"),
            200,
            Some(("/data/t", json!("c2VjcmV0"))),
        ),
        (
            Create(object(
                "PersistentVolumeClaim",
                "data",
                json!({"spec": {"volumeName": "pv-1"}}),
            )),
            201,
            None,
        ),
        (
            Get(PersistentVolumeClaim, "data"),
            200,
            Some(("/spec/volumeName", json!("pv-1"))),
        ),
        (
            Create(
                json!({"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"pv-1"},
                "spec":{"local":{"path":"/mnt/a"}}}),
            ),
            201,
            None,
        ),
        (
            Get(PersistentVolume, "pv-1"),
            200,
            Some(("/spec/local/path", json!("/mnt/a"))),
        ),
        // Nodes: the status subresource is the only way to change status.
        (Create(node(json!({}))), 201, None),
        (
            PatchStatus(
                Node,
                "node-a",
                json!({"status": {"volumesInUse": ["kubernetes.io/csi/d^v"]}}),
            ),
            200,
            Some(("/status/volumesInUse/0", json!("kubernetes.io/csi/d^v"))),
        ),
        (
            Replace(node(
                json!({"metadata": {"labels": {"zone": "a"}}, "status": {}}),
            )),
            200,
            Some(("/status/volumesInUse/0", json!("kubernetes.io/csi/d^v"))),
        ),
        (
            Get(Node, "node-a"),
            200,
            Some(("/metadata/labels/zone", json!("a"))),
        ),
    ]
}

fn substitute(value: &serde_json::Value, uid: &str) -> serde_json::Value {
    let text = serde_json::to_string(value).unwrap().replace("$uid", uid);
    serde_json::from_str(&text).unwrap()
}

/// The namespace and name of a target (cluster-scoped kinds have no namespace).
fn reference(kind: Kind, name: &str) -> ObjectRef {
    ObjectRef::new(kind, if kind.is_namespaced() { "ns" } else { "" }, name)
}

fn run_on_store(store: &Store, op: &Op, uid: &str) -> Result<serde_json::Value, u16> {
    use crate::local::store::{DeleteOptions, Deleted, FieldSelector, Preconditions, Selection};
    let result = match op {
        Op::Create(body) => store.create(body.clone()),
        Op::Replace(body) => store.update(body.clone()),
        Op::Get(kind, name) => store.get(&reference(*kind, name)),
        Op::PatchStatus(kind, name, patch) => {
            store.patch_status(&reference(*kind, name), &substitute(patch, uid))
        }
        Op::Delete(name, grace, precondition) => store
            .delete(
                &reference(Kind::Pod, name),
                &DeleteOptions {
                    grace_period_seconds: *grace,
                    preconditions: Preconditions {
                        uid: precondition.map(|p| p.replace("$uid", uid)),
                        resource_version: None,
                    },
                },
            )
            .map(|d| match d {
                Deleted::Removed(o) | Deleted::Terminating(o) => o,
            }),
        Op::List(kind, fields) => {
            let selection = Selection {
                kind: *kind,
                namespace: Some("ns".into()),
                fields: FieldSelector::parse(fields).unwrap(),
            };
            Ok(json!({"count": store.list(&selection).0.len()}))
        }
    };
    result.map_err(|e| e.code())
}

/// The REST path of a kind's collection, or of one object.
fn path(kind: Kind, name: Option<&str>) -> String {
    let prefix = match kind.api_version() {
        "v1" => "/api/v1".to_owned(),
        group_version => format!("/apis/{group_version}"),
    };
    let namespace = if kind.is_namespaced() {
        "/namespaces/ns"
    } else {
        ""
    };
    let name = name.map(|n| format!("/{n}")).unwrap_or_default();
    format!("{prefix}{namespace}/{}{name}", kind.plural())
}

fn kind_of_body(body: &serde_json::Value) -> Kind {
    Kind::from_type(
        body["apiVersion"].as_str().unwrap(),
        body["kind"].as_str().unwrap(),
    )
    .unwrap()
}

async fn run_over_http(
    client: &kube::Client,
    op: &Op,
    uid: &str,
) -> Result<serde_json::Value, u16> {
    let (method, uri, content_type, body) = match op {
        Op::Create(body) => (
            Method::POST,
            path(kind_of_body(body), None),
            "application/json",
            body.clone(),
        ),
        Op::Replace(body) => (
            Method::PUT,
            path(kind_of_body(body), body["metadata"]["name"].as_str()),
            "application/json",
            body.clone(),
        ),
        Op::Get(kind, name) => (Method::GET, path(*kind, Some(name)), "", json!(null)),
        Op::PatchStatus(kind, name, patch) => (
            Method::PATCH,
            format!("{}/status", path(*kind, Some(name))),
            if *kind == Kind::Pod {
                "application/strategic-merge-patch+json"
            } else {
                "application/merge-patch+json"
            },
            substitute(patch, uid),
        ),
        Op::Delete(name, grace, precondition) => {
            let mut body = json!({});
            if let Some(grace) = grace {
                body["gracePeriodSeconds"] = json!(grace);
            }
            if let Some(p) = precondition {
                body["preconditions"] = json!({"uid": p.replace("$uid", uid)});
            }
            (
                Method::DELETE,
                path(Kind::Pod, Some(name)),
                "application/json",
                body,
            )
        }
        Op::List(kind, fields) => (
            Method::GET,
            format!("{}?fieldSelector={fields}", path(*kind, None)),
            "",
            json!(null),
        ),
    };
    let mut request = http::Request::builder().method(method).uri(uri);
    if !content_type.is_empty() {
        request = request.header("content-type", content_type);
    }
    let bytes = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(&body).unwrap()
    };
    match client
        .request::<serde_json::Value>(request.body(bytes).unwrap())
        .await
    {
        Ok(value) if matches!(op, Op::List(..)) => {
            Ok(json!({"count": value["items"].as_array().map_or(0, Vec::len)}))
        }
        Ok(value) => Ok(value),
        Err(kube::Error::Api(status)) => Err(status.code),
        Err(other) => panic!("transport: {other}"),
    }
}

fn check_step(
    step: usize,
    got: &Result<serde_json::Value, u16>,
    code: u16,
    field: &Option<(&str, serde_json::Value)>,
) {
    match got {
        Ok(object) => {
            assert!(
                (200..300).contains(&code),
                "step {step}: expected {code}, got success {object}"
            );
            if let Some((pointer, value)) = field {
                assert_eq!(
                    object.pointer(pointer),
                    Some(value),
                    "step {step}: {object}"
                );
            }
        }
        Err(got) => assert_eq!(*got, code, "step {step}"),
    }
}

#[tokio::test]
async fn conformance_store_and_server_agree() {
    // The store, directly.
    let store = Store::default();
    let mut uid = String::new();
    for (step, (op, code, field)) in conformance_table().iter().enumerate() {
        let got = run_on_store(&store, op, &uid);
        if step == 0 {
            uid = got.as_ref().unwrap()["metadata"]["uid"]
                .as_str()
                .unwrap()
                .to_owned();
        }
        check_step(step, &got, *code, field);
    }
    // The same table over HTTP.
    let server = server().await;
    let client = server.client().await.unwrap();
    let mut uid = String::new();
    for (step, (op, code, field)) in conformance_table().iter().enumerate() {
        let got = run_over_http(&client, op, &uid).await;
        if step == 0 {
            uid = got.as_ref().unwrap()["metadata"]["uid"]
                .as_str()
                .unwrap()
                .to_owned();
        }
        check_step(step, &got, *code, field);
    }
}

#[tokio::test(start_paused = true)]
async fn injected_latency_holds_the_answer() {
    let server = server().await;
    server.store().create(pod("web", "node-a")).unwrap();
    let client = KubePodStatusClient::new(server.client().await.unwrap());
    server.inject(Fault {
        method: None,
        path_contains: "/pods/web".into(),
        action: FaultAction::Delay(Duration::from_secs(10)),
        times: Some(1),
    });
    // Virtual time: the 1 s deadline comes before the 10 s the server holds the answer.
    let held = tokio::time::timeout(Duration::from_secs(1), client.get_pod("ns", "web")).await;
    assert!(held.is_err(), "answered before the injected latency");
    assert!(client.get_pod("ns", "web").await.is_ok());
}

#[tokio::test]
async fn the_shared_client_can_leave_retries_to_the_caller() {
    use crate::client::{ClientConfig, KubeRetries, build_client};

    let server = server().await;
    server.store().create(pod("web", "node-a")).unwrap();
    let once_429 = || Fault {
        method: Some(Method::GET),
        path_contains: "/pods/web".into(),
        action: FaultAction::Status(429),
        times: Some(1),
    };
    let options = |retries| ClientConfig {
        retries,
        ..ClientConfig::default()
    };
    // kube's retries on: the 429 is absorbed (two requests, no error).
    let kube = build_client(server.config().await.unwrap(), &options(KubeRetries::Kube)).unwrap();
    server.inject(once_429());
    assert!(
        KubePodStatusClient::new(kube)
            .get_pod("ns", "web")
            .await
            .is_ok()
    );
    assert_eq!(server.count(&Method::GET, "/pods/web"), 2);
    // Off: the caller sees the 429 as a retryable error, after exactly one request.
    let off = build_client(server.config().await.unwrap(), &options(KubeRetries::Off)).unwrap();
    server.inject(once_429());
    let err = KubePodStatusClient::new(off)
        .get_pod("ns", "web")
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert_eq!(server.count(&Method::GET, "/pods/web"), 3);
}

#[tokio::test(start_paused = true)]
async fn a_config_map_watch_resumed_too_late_gets_410_and_lists_again() {
    use rustlet_volume::objects::VolumeObjects;

    use crate::backend::Backend;
    use crate::content::ObjectSourceConfig;
    use crate::objects::ApiObjects;

    let server = server().await;
    let config_map = |value: &str| {
        json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"settings","namespace":"ns"},
            "data":{"k":value}})
    };
    server.store().create(config_map("one")).unwrap();
    // The first watch ends after one event.
    server.inject(Fault {
        method: Some(Method::GET),
        path_contains: "/configmaps".into(),
        action: FaultAction::CutWatchAfter(1),
        times: Some(2),
    });
    let objects = ApiObjects::new(
        Backend::Cluster(server.client().await.unwrap()),
        ObjectSourceConfig::default(),
    );
    let mut changes = objects.changes();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "p"},
        "spec": {"containers": [{"name":"c","image":"busybox"}], "volumes": [{"name": "v", "configMap": {"name": "settings"}}]}
    }))
    .unwrap();
    objects.register_pod(&pod);
    let value = |cm: &k8s_openapi::api::core::v1::ConfigMap| cm.data.as_ref().unwrap()["k"].clone();
    assert_eq!(
        value(&objects.config_map("ns", "settings").await.unwrap()),
        "one"
    );
    while server.count(&Method::GET, "/configmaps") < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The next watch request waits a second; meanwhile the store's history moves past the
    // resourceVersion it will resume from.
    server.clear_faults();
    server.inject(Fault {
        method: Some(Method::GET),
        path_contains: "/configmaps".into(),
        action: FaultAction::Delay(Duration::from_secs(1)),
        times: Some(1),
    });
    server.store().update(config_map("two")).unwrap();
    assert_eq!(changes.recv().await.unwrap().name, "settings");
    for i in 0..1100 {
        server
            .store()
            .create(json!({"apiVersion":"v1","kind":"ConfigMap",
                "metadata":{"name":format!("noise-{i}"),"namespace":"ns"}}))
            .unwrap();
    }
    server.store().update(config_map("three")).unwrap();
    // 410 on the resumed watch: kube's watcher lists again and sees the latest object.
    assert_eq!(changes.recv().await.unwrap().name, "settings");
    assert_eq!(
        value(&objects.config_map("ns", "settings").await.unwrap()),
        "three"
    );
    let lists = server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/configmaps") && !r.query.contains("watch=true"))
        .count();
    assert_eq!(lists, 2, "{:#?}", server.requests());
}

#[tokio::test(start_paused = true)]
async fn a_repeated_event_is_created_once_then_patched_as_a_series() {
    use rustlet_volume::events::{EventKind, EventRecorder};

    use crate::events::KubeEventRecorder;

    let server = server().await;
    let created = server.store().create(pod("web", "node-a")).unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(created).unwrap();
    let recorder = KubeEventRecorder::new(server.client().await.unwrap(), "kubelet", "node-a");
    let events = || {
        server
            .store()
            .list(&crate::local::store::Selection::all(Kind::Event))
            .0
    };
    recorder.event(&pod, EventKind::Warning, "FailedMount", "boom");
    while events().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    recorder.event(&pod, EventKind::Warning, "FailedMount", "boom");
    while events()[0].pointer("/series/count").is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stored = events();
    assert_eq!(stored.len(), 1, "one event object for the series");
    assert_eq!(stored[0]["series"]["count"], 2);
    assert_eq!(stored[0]["regarding"]["uid"], pod.metadata.uid.unwrap());
    assert_eq!(
        server.count(&Method::POST, "/apis/events.k8s.io/v1/namespaces/ns/events"),
        1
    );
    assert_eq!(
        server.count(
            &Method::PATCH,
            "/apis/events.k8s.io/v1/namespaces/ns/events/"
        ),
        1
    );
}

#[tokio::test]
async fn a_strategic_patch_of_a_whole_object_is_refused_not_misapplied() {
    use kube::api::{Api, Patch, PatchParams};

    let server = server().await;
    server.store().create(pod("web", "node-a")).unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(server.client().await.unwrap(), "ns");
    let patch = json!({"metadata": {"labels": {"a": "b"}}});
    let err = pods
        .patch("web", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 415);
            assert!(
                status.message.contains("merge-patch+json"),
                "{}",
                status.message
            );
        }
        other => panic!("expected a 415, got {other}"),
    }
    let patched = pods
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["a"], "b");
}

/// As the API server: a field selector on a field the kind cannot be selected by is a 400
/// (`field label not supported`), on a list and on a watch; a selectable one filters.
#[tokio::test]
async fn a_field_selector_the_kind_does_not_support_is_a_bad_request() {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use kube::api::{Api, ListParams};
    let server = server().await;
    server.store().create(pod("web", "node-a")).unwrap();
    server.store().create(pod("db", "node-b")).unwrap();
    let client = server.client().await.unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "ns");
    match config_maps
        .list(&ListParams::default().fields("data.owner=a"))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 400);
            assert_eq!(status.reason, "BadRequest");
            assert!(
                status
                    .message
                    .contains("field label not supported: data.owner")
            );
        }
        other => panic!("expected a 400, got {other:?}"),
    }
    let pods: Api<Pod> = Api::namespaced(client, "ns");
    let listed = pods
        .list(&ListParams::default().fields("spec.nodeName=node-b"))
        .await
        .unwrap();
    let names: Vec<_> = listed
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(names, ["db"]);
}

/// Issue 10 item 17: the server assigns the UID of a created object, whatever the request
/// carries, as the API server does.
#[tokio::test]
async fn a_create_gets_a_server_assigned_uid_whatever_the_request_carries() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};
    let server = server().await;
    let api: Api<Pod> = Api::namespaced(server.client().await.unwrap(), "ns");
    let mut body: Pod = serde_json::from_value(pod("web", "node-a")).unwrap();
    body.metadata.uid = Some("chosen-by-the-client".into());
    let created = api.create(&PostParams::default(), &body).await.unwrap();
    let uid = created.metadata.uid.unwrap();
    assert_ne!(uid, "chosen-by-the-client");
    assert!(!uid.is_empty());
}

/// Issue 10 item 21: `PATCH .../status` honours its content type (strategic merge, JSON
/// merge, JSON patch; others 415) and `PUT .../status` replaces the status under its
/// resourceVersion precondition, so an adapter that sends the wrong patch type fails here as it
/// would against a cluster.
#[tokio::test]
async fn the_status_subresource_honours_the_patch_type_and_put_replaces() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let server = server().await;
    let client = server.client().await.unwrap();
    let api: Api<Pod> = Api::namespaced(client.clone(), "ns");
    api.create(
        &PostParams::default(),
        &serde_json::from_value(pod("web", "node-a")).unwrap(),
    )
    .await
    .unwrap();
    let conditions = |pod: &Pod| -> Vec<String> {
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|c| c.iter().map(|c| c.type_.clone()).collect())
            .unwrap_or_default()
    };
    let with = |type_: &str| json!({"status": {"conditions": [{"type": type_, "status": "True"}]}});
    let params = PatchParams::default();
    api.patch_status("web", &params, &Patch::Strategic(with("A")))
        .await
        .unwrap();
    let strategic = api
        .patch_status("web", &params, &Patch::Strategic(with("B")))
        .await
        .unwrap();
    assert_eq!(conditions(&strategic), ["A", "B"], "merged by type");
    let merged = api
        .patch_status("web", &params, &Patch::Merge(with("C")))
        .await
        .unwrap();
    assert_eq!(
        conditions(&merged),
        ["C"],
        "a JSON merge patch replaces lists"
    );

    let raw = |method: &str, content_type: &str, body: Value| {
        http::Request::builder()
            .method(method)
            .uri("/api/v1/namespaces/ns/pods/web/status")
            .header("content-type", content_type)
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap()
    };
    let patched: Pod = client
        .request(raw(
            "PATCH",
            "application/json-patch+json",
            json!([
                {"op": "replace", "path": "/status/phase", "value": "Running"},
                {"op": "replace", "path": "/spec/nodeName", "value": "elsewhere"}
            ]),
        ))
        .await
        .unwrap();
    assert_eq!(
        patched.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    assert_eq!(
        patched.spec.as_ref().unwrap().node_name.as_deref(),
        Some("node-a"),
        "the status subresource changes nothing else"
    );
    let err = client
        .request::<Pod>(raw("PATCH", "application/apply-patch+yaml", json!({})))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("415") || err.to_string().contains("nsupported"),
        "{err}"
    );

    // PUT: a whole status under the resourceVersion precondition.
    let mut put = patched.clone();
    put.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    });
    let mut stale = put.clone();
    stale.metadata.resource_version = Some("1".into());
    let err = api
        .replace_status("web", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("409") || err.to_string().contains("onflict"),
        "{err}"
    );
    let replaced = api
        .replace_status("web", &PostParams::default(), &put)
        .await
        .unwrap();
    let status = replaced.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Succeeded"));
    assert!(status.conditions.is_none(), "replaced whole, not merged");
}
