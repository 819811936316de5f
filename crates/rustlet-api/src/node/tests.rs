//! HTTP shapes of registration, lease renewal and `volumesInUse`; the registration, the node
//! status and its cadence over the test API server in paused time (upstream
//! `kubelet_node_status_test.go`).

use futures::pin_mut;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::pair;

use super::{NodeConfig, NodeRegistrar};

mod status;

fn registrar() -> (
    NodeRegistrar,
    tower_test::mock::Handle<Request<Body>, Response<Body>>,
) {
    let (service, handle) = pair::<Request<Body>, Response<Body>>();
    let config = NodeConfig::for_host("node-a");
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
async fn the_lease_is_created_owned_by_the_node_then_renewed_from_its_last_copy() {
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
        // Renewal (upstream's lease controller keeps `latestLease`): a PUT of the last copy,
        // carrying its resourceVersion, without reading it first.
        let lease_path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-a";
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(
            (req.method().clone(), req.uri().path().to_owned()),
            (Method::PUT, lease_path.to_owned())
        );
        let mut renewed = body(req).await;
        assert_eq!(renewed["metadata"]["resourceVersion"], "5");
        renewed["metadata"]["resourceVersion"] = json!("6");
        send.send_response(json_reply(&renewed));
        // Someone else wrote it: the update of the last copy conflicts; the Lease is read
        // again and the renewal carries the version read.
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), Method::PUT);
        assert_eq!(body(req).await["metadata"]["resourceVersion"], "6");
        send.send_response(
            http::Response::builder()
                .status(409)
                .body(kube::client::Body::from(
                    serde_json::to_vec(&json!({"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Conflict","code":409}))
                        .unwrap(),
                ))
                .unwrap(),
        );
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(
            (req.method().clone(), req.uri().path().to_owned()),
            (Method::GET, lease_path.to_owned())
        );
        let mut theirs = renewed.clone();
        theirs["metadata"]["resourceVersion"] = json!("9");
        send.send_response(json_reply(&theirs));
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), Method::PUT);
        let again = body(req).await;
        assert_eq!(again["metadata"]["resourceVersion"], "9");
        send.send_response(json_reply(&again));
    });
    r.renew_lease("node-uid").await.unwrap();
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

/// Issue 24 item 13 (upstream: the kubelet's separate heartbeat and event clients): 500 pods
/// whose mounts fail make a flood of events (one `FailedMount` per pod every second) and of
/// status writes (one per pod every 10 s), all against the test API server in paused time.
/// The Lease is still renewed on time, every 10 s, and the events wait in a bounded queue
/// (the oldest dropped and counted), not in 30,000 tasks.
#[tokio::test(start_paused = true)]
async fn item13_a_flood_of_events_and_status_writes_never_delays_the_lease() {
    use std::sync::Arc;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;
    use rustlet_status::PodStatusClient;
    use rustlet_volume::events::{EventKind, EventRecorder, FAILED_MOUNT};
    use tower::Layer;

    use crate::client::{ApiClients, ClientConfig};
    use crate::events::{EVENT_QUEUE_CAPACITY, KubeEventRecorder};
    use crate::kube_status::KubePodStatusClient;
    use crate::local::store::Store;
    use crate::test_server::TestApiServer;

    const PODS: usize = 500;
    let server = TestApiServer::start(Arc::new(Store::default()))
        .await
        .unwrap();
    let mut pods = Vec::new();
    for i in 0..PODS {
        let created = server
            .store()
            .create(json!({"apiVersion":"v1","kind":"Pod",
                "metadata":{"name":format!("p{i}"),"namespace":"ns"},
                "spec":{"nodeName":"node-a","containers":[{"name":"c","image":"busybox"}]}}))
            .unwrap();
        pods.push(serde_json::from_value::<Pod>(created).unwrap());
    }
    let router = server.router();
    let clients = ApiClients::make(&ClientConfig::default(), |_, limit| {
        Ok::<_, std::convert::Infallible>(kube::Client::new(limit.layer(router.clone()), "ns"))
    })
    .unwrap();
    let mut config = NodeConfig::for_host("node-a");
    config.renew_interval = Duration::from_secs(10);
    let registrar = NodeRegistrar::new(clients.heartbeat.clone(), config);
    let events = KubeEventRecorder::new(clients.events.clone(), "kubelet", "node-a");
    let statuses = Arc::new(KubePodStatusClient::new(clients.main.clone()));

    let start = tokio::time::Instant::now();
    let cancel = tokio_util::sync::CancellationToken::new();
    let lease = {
        let cancel = cancel.clone();
        tokio::spawn(async move { registrar.run(cancel).await })
    };
    let flood = {
        let (events, statuses) = (events.clone(), statuses.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            for second in 0..60 {
                tick.tick().await;
                for pod in &pods {
                    let message =
                        format!("MountVolume.SetUp failed for volume \"data\" : attempt {second}");
                    events.event(pod, EventKind::Warning, FAILED_MOUNT, &message);
                }
                if second % 10 == 0 {
                    for pod in &pods {
                        let (statuses, name) = (statuses.clone(), pod.metadata.name.clone());
                        let uid = pod.metadata.uid.clone();
                        tokio::spawn(async move {
                            let patch = json!({"metadata":{"uid":uid},
                                "status":{"phase":"Pending","message":format!("{second}")}});
                            let _ = statuses
                                .patch_pod_status("ns", &name.unwrap(), &patch)
                                .await;
                        });
                    }
                }
            }
        })
    };
    let renewals = || server.count(&Method::PUT, "/leases/node-a");
    for k in 1..=6 {
        // The renewal at k × 10 s has been served within a second of it.
        tokio::time::sleep_until(start + Duration::from_secs(10 * k + 1)).await;
        assert_eq!(renewals(), k as usize, "the Lease is late at {k}0 s");
        assert!(events.queued() <= EVENT_QUEUE_CAPACITY);
    }
    // The flood did reach the API server, and more events came than the event client's QPS
    // can send: the oldest were dropped, and counted.
    assert!(server.count(&Method::PATCH, "/status") > PODS);
    let sent = server.count(&Method::POST, "/events") + server.count(&Method::PATCH, "/events");
    assert!(sent > 1000, "{sent}");
    assert!(
        sent <= 100 + 50 * 61,
        "{sent}: more than the event client's burst and QPS"
    );
    assert!(events.dropped() > 0);
    cancel.cancel();
    flood.await.unwrap();
    lease.await.unwrap();
}

/// Issue 25 item 2 (upstream: the kubelet's `tryUpdateNodeStatus`, every
/// `nodeStatusUpdateFrequency`): once the node lifecycle controller has marked the Node
/// Ready=Unknown (a gap in the heartbeats), the running registrar posts Ready=True again within
/// one renewal interval, keeping the controller's other conditions; while the Node is Ready it
/// writes no status at all.
#[tokio::test(start_paused = true)]
async fn a_node_marked_unknown_is_posted_ready_again_at_the_next_status_update() {
    use std::sync::Arc;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams};

    use crate::local::store::Store;
    use crate::test_server::TestApiServer;

    let server = TestApiServer::start(Arc::new(Store::default()))
        .await
        .unwrap();
    let client = kube::Client::new(server.router(), "default");
    let mut config = NodeConfig::for_host("node-a");
    config.renew_interval = Duration::from_secs(10);
    let registrar = NodeRegistrar::new(client.clone(), config);
    let cancel = tokio_util::sync::CancellationToken::new();
    let run = {
        let cancel = cancel.clone();
        tokio::spawn(async move { registrar.run(cancel).await })
    };
    let nodes: Api<Node> = Api::all(client);
    let conditions = |node: &Node| -> Vec<(String, String, Option<String>)> {
        let status = node.status.as_ref().and_then(|s| s.conditions.as_ref());
        status
            .into_iter()
            .flatten()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    };
    let status_writes = || server.count(&Method::PATCH, "/nodes/node-a/status");

    tokio::time::sleep(Duration::from_secs(31)).await;
    let node = nodes.get("node-a").await.unwrap();
    let ready = conditions(&node).into_iter().find(|c| c.0 == "Ready");
    assert_eq!(ready.map(|c| c.1).as_deref(), Some("True"));
    assert_eq!(status_writes(), 0, "a Ready node's status was written");

    // The controller's write (upstream `tryUpdateNodeHealth`): Ready and the pressures Unknown.
    let unknown = |type_: &str| {
        json!({"type": type_, "status": "Unknown", "reason": "NodeStatusUnknown",
               "message": "Kubelet stopped posting node status.",
               "lastHeartbeatTime": "2026-12-03T15:00:00Z",
               "lastTransitionTime": "2026-12-03T15:00:40Z"})
    };
    nodes
        .patch_status(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"conditions": [unknown("Ready"), unknown("MemoryPressure")]}}),
            ),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let node = nodes.get("node-a").await.unwrap();
    let found = conditions(&node);
    let of = |type_: &str| found.iter().find(|c| c.0 == type_).cloned();
    assert_eq!(
        of("Ready"),
        Some(("Ready".into(), "True".into(), Some("KubeletReady".into()))),
        "{found:?}"
    );
    // The kubelet's setters own the pressure conditions too (upstream `MemoryPressureCondition`).
    assert_eq!(
        of("MemoryPressure").map(|c| c.1),
        Some("False".into()),
        "{found:?}"
    );
    assert_eq!(
        status_writes(),
        2,
        "the controller's write and the registrar's"
    );
    cancel.cancel();
    run.await.unwrap();
}

/// upstream `tryUpdateNodeStatus`: the first try of each status update starts from the node
/// informer's copy (here the Node watch's [`crate::NodeCache`]), so an idle node reads nothing
/// every `nodeStatusUpdateFrequency`; a change another writer makes (the node lifecycle
/// controller's Unknown) reaches the cache through the watch and is answered as before.
#[tokio::test(start_paused = true)]
async fn node_status_updates_start_from_the_watched_node_without_a_get() {
    use std::sync::Arc;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams};

    use crate::local::store::Store;
    use crate::test_server::TestApiServer;
    use crate::{Backend, NodeCache};

    let server = TestApiServer::start(Arc::new(Store::default()))
        .await
        .unwrap();
    let client = kube::Client::new(server.router(), "default");
    let cache = Arc::new(NodeCache::new());
    let watch = {
        let (cache, backend) = (cache.clone(), Backend::Cluster(client.clone()));
        tokio::spawn(async move { cache.run(&backend, "node-a").await })
    };
    let mut config = NodeConfig::for_host("node-a");
    config.renew_interval = Duration::from_secs(10);
    let registrar = NodeRegistrar::new(client.clone(), config).with_node_cache(cache.clone());
    let cancel = tokio_util::sync::CancellationToken::new();
    let run = {
        let cancel = cancel.clone();
        tokio::spawn(async move { registrar.run(cancel).await })
    };
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(cache.node().is_some(), "the watch delivered the Node");
    let reads = || server.count(&Method::GET, "/nodes/node-a");
    let before = reads();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(reads(), before, "status updates read the Node from the API");

    let nodes: Api<Node> = Api::all(client);
    let unknown = json!({"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": "2026-12-03T15:00:00Z", "lastTransitionTime": "2026-12-03T15:00:40Z"});
    nodes
        .patch_status(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [unknown]}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let node = nodes.get("node-a").await.unwrap();
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status);
    assert_eq!(ready.as_deref(), Some("True"));
    cancel.cancel();
    run.await.unwrap();
    watch.abort();
}
