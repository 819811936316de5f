//! The agent as a node of the real control plane (issue 25, section 3): upstream's etcd,
//! kube-apiserver (with its audit log), kube-controller-manager and kube-scheduler started by
//! xtask's `TestCluster`, and the agent with `--runtime cri` on a private containerd, holding
//! only its node certificate (the `CriNode` of `tests/cluster`). Run as root in a private mount
//! namespace (without root it says so and measures nothing):
//!
//! ```sh
//! cargo xtask bench
//! # or: unshare -m --propagation private env RUSTLET_PRIVATE_MOUNT_NS=1 \
//! #     cargo bench -p rustlet --bench cluster [-- settle=20 idle=360]
//! ```
//!
//! 1. Pod startup latency as upstream's SLO defines it (pod created → all its containers
//!    running, observed through a watch; stateless pods, images present): 30 pods, each with
//!    a configMap, a secret and an emptyDir volume (and the `kube-api-access-*` projected
//!    volume the ServiceAccount admission plugin adds), created at once through the API as
//!    the admin and placed by the scheduler; per pod from the moment its create request was
//!    sent to the moment a watch (kube-rs's watcher, as the admin) delivered it with every
//!    container running. p50 and p99. Beside it, the same with the pod's
//!    `metadata.creationTimestamp` as the start (upstream's own definition, but whole seconds:
//!    up to 1 s too long), and the raw CRI floor of the same run (the same 30 pods' sandboxes
//!    and containers made at once through `CriClient` on the same containerd).
//! 2. The agent's API requests per minute while idle with the 30 pods running, from the API
//!    server's audit log (every request at `Metadata` level), by user agent and by verb and
//!    resource, over `idle` seconds (360: past the 290 s after which kube-rs's watcher opens a
//!    watch again, and past upstream's 5 min node status report) from `settle` seconds (20)
//!    after all ran; beside upstream's cadence (the Lease updated every 10 s, the Node's status
//!    patched every 5 min or on change, the Node read from the informer's cache).
//! 3. The agent's memory (`VmHWM`, `VmRSS`) and CPU (utime + stime over the idle window) at
//!    30 pods on containerd.
//!
//! The bench fails when the API server refused a request of the agent (a 4xx other than 404
//! and 409, as the cluster tests check), but for the refusals of the moment after a pod's
//! binding, which upstream's kubelet meets too (`Cluster::refusals_beyond_binding_lag`): those
//! are counted, and each must have been answered when asked again.

mod common;
#[path = "common/cri_floor.rs"]
mod cri_floor;
// The cluster tests' harness, reused as it is: the agent's start (`tests/agent`), the control
// plane and its audit log (`support`), the Node helpers (`node`) and the agent on containerd
// (`cri`). Their tests are not compiled here, so some helpers are unused.
#[allow(dead_code, unused_imports)]
#[path = "../../../tests/cluster/cri.rs"]
mod cri;
#[allow(dead_code)]
#[path = "../../../tests/agent/harness.rs"]
mod harness;
#[allow(dead_code, unused_imports)]
#[path = "../../../tests/cluster/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../../../tests/cluster/support.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{cpu_seconds, percentile};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

use cri::CriNode;
use support::Cluster;

const NODE: &str = "node-a";
const NAMESPACE: &str = "bench";
const PODS: usize = 30;
/// Each pod's container, the agent's and the floor's alike: no process but `sleep`, and a
/// prompt exit on SIGTERM.
const COMMAND: [&str; 3] = ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"];
/// How long the 30 pods may take to run before the bench gives up.
const START_DEADLINE: Duration = Duration::from_secs(180);
/// Upstream's pod startup SLO (image present): p99 at most 5 s.
const SLO_P99: Duration = Duration::from_secs(5);

/// `settle=SECONDS idle=SECONDS` from the command line (cargo's own `--bench` is ignored).
struct Windows {
    settle: Duration,
    idle: Duration,
}

fn windows() -> Windows {
    let mut w = Windows {
        settle: Duration::from_secs(20),
        idle: Duration::from_secs(360),
    };
    for arg in std::env::args().skip(1) {
        let seconds = |v: &str| Duration::from_secs(v.parse().expect("a whole number of seconds"));
        if let Some(v) = arg.strip_prefix("settle=") {
            w.settle = seconds(v);
        } else if let Some(v) = arg.strip_prefix("idle=") {
            w.idle = seconds(v);
        }
    }
    w
}

fn main() {
    let windows = windows();
    let Some(node) = CriNode::start("cluster-bench", NODE) else {
        eprintln!("cluster bench: skipped (needs root, containerd and the built control plane)");
        return;
    };
    node::wait_ready(&node.cluster, NODE, "True");
    wait_untainted(&node.cluster);

    let floor = cri_floor::raw_cri_pods(&node.containerd, PODS, &COMMAND);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(admin_client(&node.cluster));
    node.cluster.kubectl(&["create", "namespace", NAMESPACE]);
    runtime.block_on(prepare(&client));
    let started = runtime.block_on(start_pods(&client));

    println!(
        "pod startup, {PODS} pods on one node created at once (configMap, secret, emptyDir and \
         kube-api-access volumes each; image present), watch as the admin:"
    );
    print_latencies(
        "agent, create sent -> all containers running",
        &started.from_send,
        Some(started.whole),
    );
    print_latencies(
        "agent, creationTimestamp (whole s) -> running",
        &started.from_creation_timestamp,
        None,
    );
    print_latencies(
        "raw CRI floor, batch start -> StartContainer",
        &floor.per_pod,
        Some(floor.whole),
    );
    let p99 = percentile(&started.from_send, 0.99);
    println!(
        "  upstream SLO: p99 <= {} s: {}",
        SLO_P99.as_secs(),
        if p99 <= SLO_P99 { "met" } else { "NOT met" }
    );

    std::thread::sleep(windows.settle);
    let idle = measure_idle(&node, windows.idle);
    print_idle(&node.cluster, &idle);

    let refusals = node
        .cluster
        .refusals_beyond_binding_lag(&format!("system:node:{NODE}"));
    assert!(
        refusals.refused.is_empty(),
        "refused requests of the agent: {:#?}",
        refusals.refused
    );
    println!(
        "refused requests of the agent over the whole run: none but {} in the moment after a \
         pod's binding (a ConfigMap or Secret read, a token), each answered when asked again, \
         at most {:.0} ms later",
        refusals.binding_lag,
        ms(refusals.longest_wait)
    );
}

/// Waits until the node lifecycle controller has lifted the `not-ready` taint it puts on a
/// new Node, so that the scheduler's placement is not what the latency measures.
fn wait_untainted(cluster: &Cluster) {
    cluster.wait_for("the node without taints", || {
        let n = cluster.get(&["node", NODE]);
        match n["spec"]["taints"].as_array() {
            Some(t) if !t.is_empty() => Err(format!("{t:?}")),
            _ => Ok(()),
        }
    });
}

/// A kube-rs client with the cluster's admin kubeconfig.
async fn admin_client(cluster: &Cluster) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(cluster.inner.admin_kubeconfig())
        .expect("reading the admin kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("the admin kubeconfig");
    kube::Client::try_from(config).expect("a client")
}

/// Each pod's ConfigMap and Secret, and the namespace's `default` ServiceAccount (the
/// ServiceAccount admission plugin refuses a pod until the controller has made it).
async fn prepare(client: &kube::Client) {
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    for i in 0..PODS {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("p{i}")},
            "data": {"greeting": format!("hello from p{i}")},
        }))
        .unwrap();
        configmaps
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("p{i}")},
            "stringData": {"password": format!("secret of p{i}")},
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + support::DEADLINE;
    while accounts.get_opt("default").await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "no default ServiceAccount");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pod(i: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("p{i}"), "namespace": NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": rustlet_cri::testing::BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": COMMAND,
                "volumeMounts": [
                    {"name": "config", "mountPath": "/config"},
                    {"name": "secret", "mountPath": "/secret"},
                    {"name": "scratch", "mountPath": "/scratch"},
                ],
            }],
            "volumes": [
                {"name": "config", "configMap": {"name": format!("p{i}")}},
                {"name": "secret", "secret": {"secretName": format!("p{i}")}},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    }))
    .unwrap()
}

/// Whether every container of the pod is running (upstream's "all containers running").
fn all_running(pod: &Pod) -> bool {
    let want = pod.spec.as_ref().map_or(0, |s| s.containers.len());
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    want > 0
        && statuses.len() == want
        && statuses
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

struct Started {
    /// Per pod from its create request's send; sorted.
    from_send: Vec<Duration>,
    /// Per pod from its `metadata.creationTimestamp`; sorted.
    from_creation_timestamp: Vec<Duration>,
    /// From the first send to the last pod seen running.
    whole: Duration,
}

/// Creates the pods at once while a watch of the namespace looks on; returns when the watch
/// has seen every pod with all its containers running.
async fn start_pods(client: &kube::Client) -> Started {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let mut watch = watcher(pods.clone(), watcher::Config::default()).boxed();
    // The watch is established (its initial list done) before the first create.
    loop {
        match watch.next().await {
            Some(Ok(watcher::Event::InitDone)) => break,
            Some(Ok(_)) => {}
            other => panic!("the pod watch ended before its initial list: {other:?}"),
        }
    }
    let start = Instant::now();
    let mut creates = tokio::task::JoinSet::new();
    let mut sent = vec![start; PODS];
    for (i, at) in sent.iter_mut().enumerate() {
        let pods = pods.clone();
        *at = Instant::now();
        creates.spawn(async move { pods.create(&PostParams::default(), &pod(i)).await });
    }
    let mut from_send: Vec<Option<Duration>> = vec![None; PODS];
    let mut from_creation: Vec<Option<Duration>> = vec![None; PODS];
    let mut left = PODS;
    let deadline = tokio::time::Instant::now() + START_DEADLINE;
    while left > 0 {
        let event = tokio::time::timeout_at(deadline, watch.next())
            .await
            .unwrap_or_else(|_| panic!("{left} pods not running after {START_DEADLINE:?}"));
        let (seen_at, seen_wall) = (Instant::now(), Timestamp::now());
        let pod = match event {
            Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => pod,
            Some(Ok(_)) => continue,
            // The watcher re-lists by itself after an error; say it and go on.
            Some(Err(e)) => {
                eprintln!("pod watch: {e}");
                continue;
            }
            None => panic!("the pod watch ended"),
        };
        let Some(i) = pod
            .metadata
            .name
            .as_deref()
            .and_then(|n| n.strip_prefix('p'))
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|i| *i < PODS)
        else {
            continue;
        };
        if from_send[i].is_some() || !all_running(&pod) {
            continue;
        }
        from_send[i] = Some(seen_at - sent[i]);
        let created = pod
            .metadata
            .creation_timestamp
            .as_ref()
            .expect("a created pod has a creationTimestamp")
            .0;
        from_creation[i] =
            Some(Duration::try_from(seen_wall.duration_since(created)).unwrap_or(Duration::ZERO));
        left -= 1;
    }
    let whole = start.elapsed();
    while let Some(created) = creates.join_next().await {
        created.unwrap().expect("creating a pod");
    }
    let sorted = |v: Vec<Option<Duration>>| {
        let mut v: Vec<Duration> = v.into_iter().flatten().collect();
        v.sort();
        v
    };
    Started {
        from_send: sorted(from_send),
        from_creation_timestamp: sorted(from_creation),
        whole,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn print_latencies(what: &str, sorted: &[Duration], whole: Option<Duration>) {
    let whole = whole.map_or(String::new(), |w| format!(", all in {:>6.0} ms", ms(w)));
    println!(
        "  {what:<46}: p50 {:>6.0} ms, p99 {:>6.0} ms{whole}",
        ms(percentile(sorted, 0.5)),
        ms(percentile(sorted, 0.99)),
    );
}

/// What the idle window saw.
struct Idle {
    from: Timestamp,
    to: Timestamp,
    window: Duration,
    cpu_seconds: f64,
    vm_hwm_kib: u64,
    vm_rss_kib: u64,
}

/// The agent's CPU over `window` of idleness, and its memory at the end.
fn measure_idle(node: &CriNode, window: Duration) -> Idle {
    let pid = node.agent.child.id();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    // `nsenter` without `--fork` executes the agent in its own place.
    assert_eq!(comm.trim(), "rustlet", "pid {pid} is the agent");
    let from = Timestamp::now();
    let cpu_before = cpu_seconds(pid);
    let started = Instant::now();
    std::thread::sleep(window);
    let cpu_seconds = cpu_seconds(pid) - cpu_before;
    let window = started.elapsed();
    let to = Timestamp::now();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
    };
    Idle {
        from,
        to,
        window,
        cpu_seconds,
        vm_hwm_kib: kib("VmHWM:"),
        vm_rss_kib: kib("VmRSS:"),
    }
}

/// One request of the audit log: `verb resource[/subresource]`, with `watch` for a watch.
fn request_kind(event: &Value) -> String {
    let object = &event["objectRef"];
    let resource = object["resource"].as_str().unwrap_or("-");
    let resource = match object["subresource"].as_str() {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_owned(),
    };
    let group = object["apiGroup"]
        .as_str()
        .map_or(String::new(), |g| format!(".{g}"));
    format!(
        "{} {resource}{group}",
        event["verb"].as_str().unwrap_or("-")
    )
}

fn print_idle(cluster: &Cluster, idle: &Idle) {
    let user = format!("system:node:{NODE}");
    let received = |e: &Value| {
        e["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok())
    };
    // One audit event per request: a watch has two (ResponseStarted, ResponseComplete).
    let mut seen = BTreeSet::new();
    let events: Vec<Value> = cluster
        .audit_events()
        .into_iter()
        .filter(|e| e["user"]["username"] == user.as_str())
        .filter(|e| received(e).is_some_and(|t| t >= idle.from && t < idle.to))
        .filter(|e| seen.insert(e["auditID"].as_str().unwrap_or_default().to_owned()))
        .collect();
    let minutes = idle.window.as_secs_f64() / 60.0;
    let mut by_agent: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_kind: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for e in &events {
        let agent = e["userAgent"].as_str().unwrap_or("(none)").to_owned();
        *by_agent.entry(agent).or_default() += 1;
        let entry = by_kind
            .entry(request_kind(e))
            .or_insert_with(|| (0, e["requestURI"].as_str().unwrap_or_default().to_owned()));
        entry.0 += 1;
    }
    println!(
        "API requests of {user} while idle with {PODS} pods running, {:.0} s from the audit log \
         ({} requests, {:.1}/min):",
        idle.window.as_secs_f64(),
        events.len(),
        events.len() as f64 / minutes
    );
    for (agent, n) in &by_agent {
        println!(
            "  user agent {agent:?}: {n} ({:.1}/min)",
            *n as f64 / minutes
        );
    }
    for (kind, (n, uri)) in &by_kind {
        println!(
            "  {kind:<40} {n:>4} ({:>5.1}/min), e.g. {uri}",
            *n as f64 / minutes
        );
    }
    println!(
        "  upstream's kubelet (v1.37 defaults): update leases.coordination.k8s.io 6/min (every \
         10 s); patch nodes/status 0.2/min (every 5 min, jittered, or on change); the Node read \
         from its informer's cache (no GET); its watches re-opened every 5-10 min"
    );
    println!(
        "the agent at {PODS} pods on containerd: VmHWM {:.1} MiB, VmRSS {:.1} MiB; CPU {:.2} s \
         over {:.0} s = {:.2} % of a core",
        idle.vm_hwm_kib as f64 / 1024.0,
        idle.vm_rss_kib as f64 / 1024.0,
        idle.cpu_seconds,
        idle.window.as_secs_f64(),
        idle.cpu_seconds / idle.window.as_secs_f64() * 100.0
    );
}
