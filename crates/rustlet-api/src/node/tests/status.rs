//! Registration, the node status and its cadence over the test API server (its in-process
//! router) in paused time, with a fake machine and a fake runtime (upstream
//! `kubelet_node_status_test.go`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rustlet_core::node_status::{NETWORK_READY, RUNTIME_READY, RuntimeCondition};
use rustlet_status::Clock;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::local::store::{Kind, ObjectRef, Store};
use crate::node::machine::FakeMachine;
use crate::node::{KUBELET_VERSION, NodeConfig, NodeRegistrar, NodeRuntime, StatusUpdate};
use crate::test_server::{Fault, FaultAction, TestApiServer};

/// Wall time that follows tokio's (paused) clock.
struct TokioClock {
    base: Timestamp,
    start: Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed = SignedDuration::try_from(Instant::now() - self.start).unwrap();
        self.base + elapsed
    }
}

/// A runtime whose conditions the test sets.
struct FakeRuntime {
    conditions: Mutex<Vec<RuntimeCondition>>,
}

impl FakeRuntime {
    fn ready() -> Arc<Self> {
        Arc::new(Self {
            conditions: Mutex::new(vec![
                RuntimeCondition::ready(RUNTIME_READY),
                RuntimeCondition::ready(NETWORK_READY),
            ]),
        })
    }

    fn set(&self, conditions: Vec<RuntimeCondition>) {
        *self.conditions.lock().unwrap() = conditions;
    }
}

#[async_trait::async_trait]
impl NodeRuntime for FakeRuntime {
    fn type_name(&self) -> String {
        "fake".into()
    }

    async fn version(&self) -> Result<String, String> {
        Ok("1.2.3".into())
    }

    async fn status(&self) -> Result<Vec<RuntimeCondition>, String> {
        Ok(self.conditions.lock().unwrap().clone())
    }
}

struct Setup {
    server: TestApiServer,
    registrar: Arc<NodeRegistrar>,
    machine: Arc<FakeMachine>,
    runtime: Arc<FakeRuntime>,
    start: Instant,
}

async fn setup(config: NodeConfig) -> Setup {
    let server = TestApiServer::start(Arc::new(Store::default()))
        .await
        .unwrap();
    let client = kube::Client::new(server.router(), "default");
    let machine = Arc::new(FakeMachine::plausible());
    let runtime = FakeRuntime::ready();
    let start = Instant::now();
    let registrar = NodeRegistrar::new(client, config)
        .with_machine(machine.clone())
        .with_runtime(runtime.clone())
        .with_clock(Arc::new(TokioClock {
            base: Timestamp::from_second(1_800_000_000).unwrap(),
            start,
        }));
    Setup {
        server,
        registrar: Arc::new(registrar),
        machine,
        runtime,
        start,
    }
}

fn config() -> NodeConfig {
    NodeConfig {
        node_ip: Some("10.0.0.7".into()),
        ..NodeConfig::for_host("node-a")
    }
}

fn stored(server: &TestApiServer) -> Value {
    server
        .store()
        .get(&ObjectRef::new(Kind::Node, "", "node-a"))
        .unwrap()
}

fn condition<'a>(node: &'a Value, type_: &str) -> &'a Value {
    node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
}

fn time_at(second: u64) -> String {
    (Timestamp::from_second(1_800_000_000).unwrap() + SignedDuration::from_secs(second as i64))
        .to_string()
}

/// Runs the registrar until `until` (after its start), then stops it.
async fn run_until(s: &Setup, until: Duration) {
    let cancel = CancellationToken::new();
    let task = {
        let (registrar, cancel) = (s.registrar.clone(), cancel.clone());
        tokio::spawn(async move { registrar.run(cancel).await })
    };
    tokio::time::sleep_until(s.start + until).await;
    cancel.cancel();
    task.await.unwrap();
}

/// upstream: `TestRegisterWithApiServer` and `TestUpdateNewNodeStatus`: the Node is created
/// (one POST, no GET before it) with the kubelet's labels, `--node-labels`, the attach-detach
/// annotation, `--register-with-taints`, and a status with every field.
#[tokio::test(start_paused = true)]
async fn test_register_with_api_server() {
    let s = setup(NodeConfig {
        labels: [("example.com/pool".to_owned(), "a".to_owned())].into(),
        taints: vec![Taint {
            key: "dedicated".into(),
            value: Some("x".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }],
        ..config()
    })
    .await;
    let node = s.registrar.register().await.unwrap();
    assert!(node.metadata.uid.is_some());
    let requests = s.server.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(
        (&requests[0].method, requests[0].path.as_str()),
        (&Method::POST, "/api/v1/nodes")
    );
    let node = stored(&s.server);
    let arch = rustlet_core::node::go_arch();
    assert_eq!(
        node["metadata"]["labels"],
        json!({"kubernetes.io/hostname":"node-a","kubernetes.io/os":"linux",
               "kubernetes.io/arch":arch,"beta.kubernetes.io/os":"linux",
               "beta.kubernetes.io/arch":arch,"example.com/pool":"a"})
    );
    assert_eq!(
        node["metadata"]["annotations"],
        json!({"volumes.kubernetes.io/controller-managed-attach-detach":"true"})
    );
    assert_eq!(
        node["spec"]["taints"],
        json!([{"key":"dedicated","value":"x","effect":"NoSchedule"}])
    );
    let status = &node["status"];
    assert_eq!(
        status["capacity"],
        json!({"cpu":"2","memory":"4Gi","pods":"110","ephemeral-storage":"10Gi"})
    );
    // Capacity minus memory.available<100Mi and nodefs.available<10%.
    assert_eq!(
        status["allocatable"],
        json!({"cpu":"2","memory":"3996Mi","pods":"110","ephemeral-storage":"9Gi"})
    );
    assert_eq!(
        status["addresses"],
        json!([{"type":"InternalIP","address":"10.0.0.7"},{"type":"Hostname","address":"node-a"}])
    );
    assert_eq!(status["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
    assert_eq!(
        status["nodeInfo"],
        json!({"machineID":"fake-machine-id","systemUUID":"fake-system-uuid",
               "bootID":"fake-boot-id","kernelVersion":"6.1.0-fake","osImage":"Fake Linux 1",
               "containerRuntimeVersion":"fake://1.2.3","kubeletVersion":KUBELET_VERSION,
               "kubeProxyVersion":"","operatingSystem":"linux","architecture":arch})
    );
    let types: Vec<&str> = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    );
    let ready = condition(&node, "Ready");
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("True"), &json!("KubeletReady"))
    );
    assert_eq!(ready["lastHeartbeatTime"], time_at(0));
}

/// upstream: `TestTryRegisterWithApiServer`: a Node that exists is read and reconciled: the
/// default labels set again (other labels kept), the attach-detach annotation added, through
/// one strategic merge patch of the status subresource; nothing is patched when it matches.
#[tokio::test(start_paused = true)]
async fn registration_reconciles_an_existing_nodes_labels_and_annotation() {
    let s = setup(config()).await;
    s.server
        .store()
        .create(
            json!({"apiVersion":"v1","kind":"Node","metadata":{"name":"node-a",
            "labels":{"kubernetes.io/hostname":"old-name","team":"blue"}}}),
        )
        .unwrap();
    let node = s.registrar.register().await.unwrap();
    let methods: Vec<(Method, String)> = s
        .server
        .requests()
        .into_iter()
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(
        methods,
        [
            (Method::POST, "/api/v1/nodes".to_owned()),
            (Method::GET, "/api/v1/nodes/node-a".to_owned()),
            (Method::PATCH, "/api/v1/nodes/node-a/status".to_owned()),
        ]
    );
    let stored = stored(&s.server);
    let labels = &stored["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], "node-a");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(
        labels["beta.kubernetes.io/arch"],
        rustlet_core::node::go_arch()
    );
    assert_eq!(labels["team"], "blue");
    assert_eq!(
        stored["metadata"]["annotations"]["volumes.kubernetes.io/controller-managed-attach-detach"],
        "true"
    );
    assert_eq!(
        node.metadata.labels.unwrap()["kubernetes.io/hostname"],
        "node-a"
    );
    // Registered again (a restart): it matches, so POST and GET only.
    s.registrar.register().await.unwrap();
    assert_eq!(s.server.count(&Method::PATCH, "/nodes/node-a/status"), 1);
}

/// upstream `registerWithAPIServer`: each attempt after a wait of 100 ms, doubling up to 7 s.
#[tokio::test(start_paused = true)]
async fn registration_backs_off_from_100ms_doubling_to_7s() {
    let s = setup(config()).await;
    s.server.inject(Fault {
        method: Some(Method::POST),
        path_contains: "/api/v1/nodes".into(),
        action: FaultAction::Status(500),
        times: Some(7),
    });
    let task = {
        let registrar = s.registrar.clone();
        tokio::spawn(async move { registrar.register_with_backoff().await })
    };
    // Waits of 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, then 7 s (the cap).
    let attempts_ms = [100, 300, 700, 1500, 3100, 6300, 12_700, 19_700];
    for (n, at) in attempts_ms.into_iter().enumerate() {
        tokio::time::sleep_until(s.start + Duration::from_millis(at - 50)).await;
        assert_eq!(
            s.server.count(&Method::POST, "/api/v1/nodes"),
            n,
            "before {at} ms"
        );
        tokio::time::sleep_until(s.start + Duration::from_millis(at + 50)).await;
        assert_eq!(
            s.server.count(&Method::POST, "/api/v1/nodes"),
            n + 1,
            "after {at} ms"
        );
    }
    task.await.unwrap();
}

fn patches(s: &Setup) -> usize {
    s.server
        .count(&Method::PATCH, "/api/v1/nodes/node-a/status")
}

/// upstream: `TestUpdateNodeStatusWithLease`: the status is computed every 10 s but patched
/// only when it changed or 5 min after the last report; the Lease is renewed every 10 s all
/// the while.
#[tokio::test(start_paused = true)]
async fn test_update_node_status_with_lease() {
    let s = setup(config()).await;
    // Registered at 0.1 s with the full status; the first status run (no report yet) finds
    // nothing to send within the same second, and counts as the report.
    run_until(&s, Duration::from_secs(1)).await;
    assert_eq!(patches(&s), 0);
    let cancel = CancellationToken::new();
    let task = {
        let (registrar, cancel) = (s.registrar.clone(), cancel.clone());
        tokio::spawn(async move {
            // The registrar is registered already: keep updating (as `run` does after it).
            let lease = async {
                loop {
                    registrar.renew_lease("uid").await.unwrap();
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
            };
            let status = async {
                loop {
                    registrar.update_node_status().await.unwrap();
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
            };
            tokio::select! {
                () = cancel.cancelled() => {}
                () = lease => {}
                () = status => {}
            }
        })
    };
    let leases = || s.server.count(&Method::PUT, "/leases/node-a");
    // Nothing changes for the next 4 min 50 s: no patch; a lease renewal every 10 s.
    tokio::time::sleep_until(s.start + Duration::from_secs(295)).await;
    assert_eq!(patches(&s), 0, "nothing changed within 5 min");
    assert!(leases() >= 28, "{}", leases());
    let heartbeat = condition(&stored(&s.server), "Ready")["lastHeartbeatTime"].clone();
    assert_eq!(heartbeat, time_at(0));
    // 5 min after the last report: patched with fresh heartbeats, nothing else.
    tokio::time::sleep_until(s.start + Duration::from_secs(306)).await;
    assert_eq!(patches(&s), 1, "reported after 5 min");
    let node = stored(&s.server);
    assert_eq!(condition(&node, "Ready")["lastHeartbeatTime"], time_at(301));
    assert_eq!(condition(&node, "Ready")["lastTransitionTime"], time_at(0));
    // And again 5 min later.
    tokio::time::sleep_until(s.start + Duration::from_secs(595)).await;
    assert_eq!(patches(&s), 1);
    tokio::time::sleep_until(s.start + Duration::from_secs(606)).await;
    assert_eq!(patches(&s), 2);
    cancel.cancel();
    task.await.unwrap();
}

/// upstream: `TestUpdateExistingNodeStatus`: a change is patched at the next run (10 s), not
/// 5 min later; the condition that changed moves its lastTransitionTime, the others keep
/// theirs; every heartbeat moves.
#[tokio::test(start_paused = true)]
async fn test_update_existing_node_status() {
    let s = setup(config()).await;
    run_until(&s, Duration::from_secs(1)).await;
    tokio::time::sleep_until(s.start + Duration::from_secs(20)).await;
    assert_eq!(
        s.registrar.update_node_status().await.unwrap(),
        StatusUpdate::Unchanged
    );
    s.machine
        .update(|m| m.memory_available_bytes = Some(50 << 20));
    tokio::time::sleep_until(s.start + Duration::from_secs(30)).await;
    assert_eq!(
        s.registrar.update_node_status().await.unwrap(),
        StatusUpdate::Patched
    );
    let node = stored(&s.server);
    let memory = condition(&node, "MemoryPressure");
    assert_eq!(
        (&memory["status"], &memory["reason"], &memory["message"]),
        (
            &json!("True"),
            &json!("KubeletHasInsufficientMemory"),
            &json!("kubelet has insufficient memory available")
        )
    );
    assert_eq!(memory["lastTransitionTime"], time_at(30));
    for type_ in ["DiskPressure", "PIDPressure", "Ready"] {
        let c = condition(&node, type_);
        assert_eq!(c["lastTransitionTime"], time_at(0), "{type_}");
        assert_eq!(c["lastHeartbeatTime"], time_at(30), "{type_}");
    }
    // The pressure ends, but the condition stays for the transition period (5 min).
    s.machine
        .update(|m| m.memory_available_bytes = Some(3 << 30));
    tokio::time::sleep_until(s.start + Duration::from_secs(40)).await;
    assert_eq!(
        s.registrar.update_node_status().await.unwrap(),
        StatusUpdate::Unchanged
    );
    tokio::time::sleep_until(s.start + Duration::from_secs(330)).await;
    assert_eq!(
        s.registrar.update_node_status().await.unwrap(),
        StatusUpdate::Patched
    );
    let memory = condition(&stored(&s.server), "MemoryPressure").clone();
    assert_eq!(memory["status"], "False");
    assert_eq!(memory["lastTransitionTime"], time_at(330));
}

/// upstream `TestReadyCondition` through `updateRuntimeUp`: a runtime that is not ready, or
/// whose network is not, makes Ready False with `KubeletNotReady` and the runtime's condition
/// in the message; ready again, Ready is True with a new transition time.
#[tokio::test(start_paused = true)]
async fn a_runtime_that_is_not_ready_makes_ready_false_with_the_reason() {
    let s = setup(config()).await;
    run_until(&s, Duration::from_secs(1)).await;
    s.runtime.set(vec![
        RuntimeCondition {
            type_: RUNTIME_READY.into(),
            status: false,
            reason: "RuntimeDown".into(),
            message: "the daemon went away".into(),
        },
        RuntimeCondition {
            type_: NETWORK_READY.into(),
            status: false,
            reason: "NetworkPluginNotReady".into(),
            message: "Network plugin returns error: cni plugin not initialized".into(),
        },
    ]);
    tokio::time::sleep_until(s.start + Duration::from_secs(10)).await;
    assert_eq!(
        s.registrar.update_node_status().await.unwrap(),
        StatusUpdate::Patched
    );
    let node = stored(&s.server);
    let ready = condition(&node, "Ready");
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("False"), &json!("KubeletNotReady"))
    );
    assert_eq!(
        ready["message"],
        "[container runtime not ready: RuntimeReady=false reason:RuntimeDown message:the daemon \
         went away, container runtime network not ready: NetworkReady=false \
         reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not \
         initialized]"
    );
    assert_eq!(ready["lastTransitionTime"], time_at(10));
    // 30 s without a successful runtime status: the runtime is also down.
    tokio::time::sleep_until(s.start + Duration::from_secs(40)).await;
    s.registrar.update_node_status().await.unwrap();
    let message = condition(&stored(&s.server), "Ready")["message"].clone();
    assert!(
        message
            .as_str()
            .unwrap()
            .starts_with("[container runtime is down, container runtime not ready"),
        "{message}"
    );
    s.runtime.set(vec![
        RuntimeCondition::ready(RUNTIME_READY),
        RuntimeCondition::ready(NETWORK_READY),
    ]);
    tokio::time::sleep_until(s.start + Duration::from_secs(50)).await;
    s.registrar.update_node_status().await.unwrap();
    let node = stored(&s.server);
    let ready = condition(&node, "Ready");
    assert_eq!(
        (&ready["status"], &ready["reason"], &ready["message"]),
        (
            &json!("True"),
            &json!("KubeletReady"),
            &json!("kubelet is posting ready status")
        )
    );
    assert_eq!(ready["lastTransitionTime"], time_at(50));
}

/// `volumesInUse` is written by the volume manager and never touched by the status patch;
/// a condition another writer set (the node lifecycle controller's Ready Unknown is replaced,
/// a foreign condition type kept) survives too.
#[tokio::test(start_paused = true)]
async fn the_status_patch_keeps_volumes_in_use_and_foreign_conditions() {
    let s = setup(config()).await;
    run_until(&s, Duration::from_secs(1)).await;
    s.registrar
        .set_volumes_in_use(&["kubernetes.io/csi/d^v1".into()])
        .await
        .unwrap();
    let reference = ObjectRef::new(Kind::Node, "", "node-a");
    let mut node = stored(&s.server);
    node["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type":"NetworkUnavailable","status":"False","reason":"RouteCreated"}));
    s.server.store().update_status(node).unwrap();
    s.machine.update(|m| m.kernel_version = "6.2.0".into());
    tokio::time::sleep_until(s.start + Duration::from_secs(10)).await;
    assert_eq!(
        s.registrar.update_node_status().await.unwrap(),
        StatusUpdate::Patched
    );
    let node: Node = serde_json::from_value(s.server.store().get(&reference).unwrap()).unwrap();
    let status = node.status.unwrap();
    assert_eq!(status.node_info.unwrap().kernel_version, "6.2.0");
    assert_eq!(
        status.volumes_in_use,
        Some(vec!["kubernetes.io/csi/d^v1".to_owned()])
    );
    assert!(
        status
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "NetworkUnavailable")
    );
    let patch = s
        .server
        .requests()
        .into_iter()
        .rfind(|r| r.method == Method::PATCH)
        .unwrap();
    assert!(!patch.body.contains("volumesInUse"), "{}", patch.body);
}

/// Spec 3.6: every request is one `system:node:node-a` may make: its own Node by name (create,
/// get, status patch), its own Lease; never a list of nodes.
#[tokio::test(start_paused = true)]
async fn every_request_is_one_the_node_authorizer_allows() {
    let s = setup(config()).await;
    s.server.inject(Fault {
        method: Some(Method::PATCH),
        path_contains: "/nodes/node-a/status".into(),
        action: FaultAction::Status(500),
        times: Some(2),
    });
    run_until(&s, Duration::from_secs(700)).await;
    let lease = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    for r in s.server.requests() {
        let allowed = match (r.method.clone(), r.path.as_str()) {
            (Method::POST, "/api/v1/nodes") => true,
            (Method::GET, "/api/v1/nodes/node-a") => true,
            (Method::PATCH, "/api/v1/nodes/node-a/status") => true,
            (Method::POST, p) => p == lease,
            (Method::GET | Method::PUT, p) => p == format!("{lease}/node-a"),
            _ => false,
        };
        assert!(allowed, "{} {}?{}", r.method, r.path, r.query);
    }
    // The failed patches were tried again at once (upstream's 5 tries), from the API.
    let gets: Vec<String> = s
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::GET && r.path == "/api/v1/nodes/node-a")
        .map(|r| r.query)
        .collect();
    assert!(gets[0].contains("resourceVersion=0"), "{gets:?}");
    let retries = gets
        .iter()
        .filter(|q| !q.contains("resourceVersion"))
        .count();
    assert_eq!(retries, 2, "{gets:?}");
    assert_eq!(
        patches(&s),
        2 + 2,
        "two failures, then the reports at 5 and 10 min"
    );
}

/// `nodeInfo.kubeletVersion` is the release `tools/k8s` pins for the real control plane.
#[test]
fn kubelet_version_is_the_release_tools_k8s_pins() {
    let go_mod = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/k8s/go.mod"),
    )
    .unwrap();
    let pinned = go_mod
        .lines()
        .find_map(|l| l.trim().strip_prefix("k8s.io/kubernetes "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap();
    assert_eq!(pinned, KUBELET_VERSION);
}

/// `volumesInUse` is written only once the Node is registered (upstream writes it with the
/// node status), so the volume manager's first report never meets a 404.
#[tokio::test(start_paused = true)]
async fn volumes_in_use_waits_for_the_registration() {
    use rustlet_volume::node::VolumesInUseWriter;

    let s = setup(config()).await;
    let write = {
        let registrar = s.registrar.clone();
        tokio::spawn(async move {
            registrar
                .write_volumes_in_use(&["kubernetes.io/csi/d^v1".into()])
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!write.is_finished());
    assert_eq!(s.server.requests().len(), 0);
    s.registrar.register().await.unwrap();
    write.await.unwrap().unwrap();
    assert_eq!(
        stored(&s.server)["status"]["volumesInUse"],
        json!(["kubernetes.io/csi/d^v1"])
    );
}
