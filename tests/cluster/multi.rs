//! Issue 25, item 2 (the node's lifecycle as the node lifecycle controller sees it) and item 6
//! (several nodes, one cluster), on the simulated runtime: a live agent stays Ready past the
//! controller's grace period, a killed one turns Unknown within it, and three agents, each in a
//! network namespace of its own, share a Deployment that moves off the one that dies.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{Agent, start_in};
use crate::node::{node_condition, pods, start_simulated, wait_available, wait_ready};
use crate::support::{Cluster, DEADLINE, Forwarder, PrivateNetns, TEST_EVICTION_HARD, cluster};

/// kube-controller-manager's `--node-monitor-grace-period` in these tests (set explicitly; it
/// is also `TestCluster`'s default): how long the controller waits for a heartbeat.
const GRACE: Duration = Duration::from_secs(20);

/// kube-controller-manager's `--node-monitor-period`, its default (upstream
/// `SetDefaults_NodeLifecycleControllerConfiguration`; xtask does not set it): how often the
/// controller looks at every Node and Lease.
const MONITOR_PERIOD: Duration = Duration::from_secs(5);

/// What a loaded machine may add to the controller's own delays: its informers, its status
/// update, the watch's delivery to this test (2 cores shared by the whole test run).
const SLACK: Duration = Duration::from_secs(10);

/// The taints the node lifecycle controller puts on a node that is not Ready.
const NOT_READY_TAINTS: [&str; 2] = [
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/not-ready",
];

/// Sets the controller's grace period to [`GRACE`].
fn grace_option(o: &mut xtask::cluster::Options) {
    o.node_monitor_grace_period = format!("{}s", GRACE.as_secs());
}

/// The keys of the Node's taints that say it is not Ready.
fn not_ready_taints(node: &Value) -> Vec<String> {
    node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["key"].as_str())
        .filter(|k| NOT_READY_TAINTS.contains(k))
        .map(str::to_owned)
        .collect()
}

/// The Ready condition of a Node.
fn ready_condition(node: &Value) -> Value {
    node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Waits until `node` is Ready and the node lifecycle controller has lifted the `not-ready`
/// taint the API server gives every new Node (the TaintNodesByCondition admission plugin): the
/// controller has seen it Ready, and the scheduler places pods on it.
fn wait_ready_untainted(cluster: &Cluster, node: &str) -> Value {
    cluster.wait_for(&format!("node {node} Ready and untainted"), || {
        let n = cluster
            .try_get(&["node", node])
            .ok_or_else(|| "no Node".to_owned())?;
        let ready = node_condition(&n, "Ready");
        let taints = not_ready_taints(&n);
        if ready.as_deref() == Some("True") && taints.is_empty() {
            Ok(n)
        } else {
            Err(format!("Ready={ready:?}, taints {taints:?}"))
        }
    })
}

/// Fails when the API server refused any request of the agents of `nodes` (but for the
/// TokenRequests its lagging caches refused, see `support::refusals_of_lagging_caches`).
fn assert_nothing_refused(cluster: &Cluster, nodes: &[&str]) {
    for node in nodes {
        let refused = cluster.refused_requests_of_node(node);
        assert!(
            refused.is_empty(),
            "refused requests of {node}'s agent: {refused:#?}"
        );
    }
}

/// Item 2, the node lifecycle controller's side (upstream `tryUpdateNodeHealth`): a live agent
/// renews its Lease often enough that, once the controller has seen it Ready (and lifted the
/// `not-ready` taint every new Node gets), watched for longer than the controller's grace period
/// (and the two monitor periods by which it may notice a heartbeat and then act on its
/// absence), the Node stays Ready=True without a `not-ready` or `unreachable` taint; after
/// `kill -9` it turns Ready=Unknown ("Kubelet stopped posting node status.") within the grace
/// period's bound.
///
/// The bound: the agent's last Lease renewal comes before the kill; the controller notes a
/// renewal (its `probeTimestamp`) at its next pass, at most one monitor period later; it marks
/// the Node Unknown at its first pass after `probeTimestamp + grace`, at most one monitor period
/// after that. So Unknown comes at most `grace + 2 × monitor period` after the kill, plus
/// [`SLACK`] for a loaded machine (a last renewal longer before the kill only makes it sooner).
#[test]
fn node_lifecycle_controller_keeps_a_live_agent_ready_and_marks_a_killed_one_unknown() {
    let Some(cluster) = cluster("lifecycle", &["node-a"], grace_option) else {
        return;
    };
    let agent = start_simulated(&cluster, "node-a");
    wait_ready_untainted(&cluster, "node-a");
    let lease_before = cluster.get(&["-n", "kube-node-lease", "lease", "node-a"]);

    let mut watch = cluster.watch(&["node", "node-a"]);
    let observed_until = Instant::now() + GRACE + 2 * MONITOR_PERIOD + SLACK;
    let mut versions = 0;
    while let Some((_, node)) = watch.next_before(observed_until) {
        versions += 1;
        assert_eq!(
            node_condition(&node, "Ready").as_deref(),
            Some("True"),
            "a live agent's Node turned {}",
            ready_condition(&node)
        );
        let taints = not_ready_taints(&node);
        assert!(taints.is_empty(), "a live agent's Node got {taints:?}");
    }
    assert!(versions > 0, "the watch showed no version of the Node");
    let lease_after = cluster.get(&["-n", "kube-node-lease", "lease", "node-a"]);
    assert_ne!(
        lease_before["spec"]["renewTime"], lease_after["spec"]["renewTime"],
        "the agent did not renew its Lease while it was watched"
    );

    agent.kill9();
    let killed = Instant::now();
    let bound = GRACE + 2 * MONITOR_PERIOD + SLACK;
    let (unknown_at, node) = loop {
        let Some((at, node)) = watch.next_before(killed + bound + DEADLINE) else {
            panic!(
                "the Node was not marked Unknown within {:?} of the kill",
                bound + DEADLINE
            );
        };
        if node_condition(&node, "Ready").as_deref() == Some("Unknown") {
            break (at, node);
        }
    };
    let ready = ready_condition(&node);
    assert_eq!(ready["reason"], "NodeStatusUnknown", "{ready}");
    assert_eq!(
        ready["message"], "Kubelet stopped posting node status.",
        "{ready}"
    );
    let took = unknown_at.duration_since(killed);
    eprintln!("node-a: Ready=Unknown {took:?} after the kill (bound {bound:?})");
    assert!(
        took <= bound,
        "Ready=Unknown came {took:?} after the kill, more than grace {GRACE:?} + 2 × monitor \
         period {MONITOR_PERIOD:?} + slack {SLACK:?}"
    );
    assert_nothing_refused(&cluster, &["node-a"]);
}

/// Item 2, a node that comes back (upstream: the kubelet's `tryUpdateNodeStatus` every
/// `nodeStatusUpdateFrequency`, which patches the status whenever the Node in the API differs
/// from what the kubelet sees, as a Ready condition the controller turned Unknown does): an
/// agent stopped (SIGSTOP) until the controller marks its Node Unknown makes it Ready again
/// when it continues, and the controller lifts its `unreachable` taints.
#[test]
fn a_paused_agent_that_resumes_makes_its_node_ready_again() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let Some(cluster) = cluster("resumes", &["node-a"], grace_option) else {
        return;
    };
    let agent = start_simulated(&cluster, "node-a");
    wait_ready_untainted(&cluster, "node-a");
    let pid = Pid::from_raw(i32::try_from(agent.child.id()).unwrap());
    kill(pid, Signal::SIGSTOP).unwrap();
    let node = wait_ready(&cluster, "node-a", "Unknown");
    assert_eq!(ready_condition(&node)["reason"], "NodeStatusUnknown");
    kill(pid, Signal::SIGCONT).unwrap();
    let node = wait_ready_untainted(&cluster, "node-a");
    let ready = ready_condition(&node);
    assert_eq!(ready["reason"], "KubeletReady", "{ready}");
    assert_nothing_refused(&cluster, &["node-a"]);
    drop(agent);
}

/// An agent on the simulated runtime in a network namespace of its own, reaching the API
/// server through a [`Forwarder`] into it. Fields drop in order: the agent first.
struct IsolatedNode {
    agent: Option<Agent>,
    /// Held so that the agent keeps its way to the API server.
    #[allow(dead_code)]
    forwarder: Forwarder,
    /// Its root dir is inside, unmounted and removed last.
    #[allow(dead_code)]
    netns: PrivateNetns,
}

/// Starts `node`'s agent in `netns`; its node IP is `10.0.0.<index + 1>` and its pods' IPs
/// start at `10.88.<index>.2`, so that no two nodes report the same address.
fn start_isolated(cluster: &Cluster, node: &str, index: u8, netns: PrivateNetns) -> IsolatedNode {
    let target = SocketAddr::from(([127, 0, 0, 1], cluster.inner.apiserver_port()));
    let forwarder = Forwarder::into_netns(&netns.path(), target);
    let kubeconfig = cluster.node_kubeconfig_at(node, forwarder.port);
    let root = netns.dir().join("root");
    let config = netns.dir().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "nodeIP: 10.0.0.{}\nsimulatedPodIPBase: 10.88.{index}.2\n{TEST_EVICTION_HARD}",
            index + 1
        ),
    )
    .unwrap();
    let agent = start_in(
        Some(&netns.path()),
        &[
            "--node-name",
            node,
            "--root-dir",
            root.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        &cluster.scratch("logs").join(format!("agent-{node}.log")),
    );
    IsolatedNode {
        agent: Some(agent),
        forwarder,
        netns,
    }
}

/// A Deployment of `replicas` pods spread with a skew of at most one over the nodes
/// (`kubernetes.io/hostname`; `nodeTaintsPolicy: Honor`, so that a node tainted unreachable
/// counts no more), tolerating an unreachable or not-ready node for 2 s only.
fn spread_deployment(namespace: &str, name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {namespace}
spec:
  replicas: {replicas}
  selector:
    matchLabels:
      app: {name}
  template:
    metadata:
      labels:
        app: {name}
    spec:
      terminationGracePeriodSeconds: 5
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: DoNotSchedule
        nodeTaintsPolicy: Honor
        labelSelector:
          matchLabels:
            app: {name}
      tolerations:
      - key: node.kubernetes.io/unreachable
        operator: Exists
        effect: NoExecute
        tolerationSeconds: 2
      - key: node.kubernetes.io/not-ready
        operator: Exists
        effect: NoExecute
        tolerationSeconds: 2
      containers:
      - name: main
        image: localhost/busybox:1
        command: [sleep, \"3600\"]
"
    )
}

/// The pods not being deleted, counted by node; fails on one not Running.
fn live_pods_by_node(pods: &[Value]) -> Result<BTreeMap<String, usize>, String> {
    let mut by_node = BTreeMap::new();
    for pod in pods
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
    {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        if pod["status"]["phase"] != "Running" {
            return Err(format!("{name} is {}", pod["status"]["phase"]));
        }
        let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
        *by_node.entry(node.to_owned()).or_default() += 1;
    }
    Ok(by_node)
}

/// Item 6 (as upstream's e2e "should recreate pods scheduled on the unreachable node"): three
/// agents, each in a network namespace of its own, join one control plane; a Deployment of 9
/// replicas spread with skew 1 gets 3 pods on each; `kill -9` of one agent makes its Node
/// Unknown, the taint-eviction controller deletes its pods after their 2 s toleration, and the
/// ReplicaSet's replacements run on the two live nodes until the Deployment is Available with
/// 9 there. The dead node's pods stay Terminating (nobody confirms their end), as upstream's.
#[test]
fn should_recreate_pods_scheduled_on_the_unreachable_node() {
    const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
    let mut namespaces = Vec::new();
    for node in NODES {
        let Some(netns) = PrivateNetns::new(&format!("multi-{node}")) else {
            return;
        };
        namespaces.push(netns);
    }
    let Some(cluster) = cluster("multi", &NODES, grace_option) else {
        return;
    };
    let mut nodes: Vec<IsolatedNode> = NODES
        .iter()
        .zip(namespaces)
        .zip(0u8..)
        .map(|((node, netns), index)| start_isolated(&cluster, node, index, netns))
        .collect();
    for node in NODES {
        wait_ready_untainted(&cluster, node);
    }
    let netns_of = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let mut seen = vec![netns_of(std::process::id())];
    for node in &nodes {
        let ns = netns_of(node.agent.as_ref().unwrap().child.id());
        assert!(
            !seen.contains(&ns),
            "two agents, or an agent and the test, share {ns:?}"
        );
        seen.push(ns);
    }

    cluster.kubectl(&["create", "namespace", "multi"]);
    cluster.apply(&spread_deployment("multi", "web", 9));
    wait_available(&cluster, "multi", "web", 9);
    let spread = live_pods_by_node(&pods(&cluster, "multi")).expect("all pods Running");
    let expected: BTreeMap<String, usize> = NODES.iter().map(|n| ((*n).to_owned(), 3)).collect();
    assert_eq!(spread, expected, "the scheduler's spread");

    let dead = "node-b";
    nodes[1].agent.take().expect("node-b's agent").kill9();
    let killed = Instant::now();
    let node = wait_ready(&cluster, dead, "Unknown");
    eprintln!(
        "{dead}: Ready=Unknown {:?} after the kill",
        killed.elapsed()
    );
    assert_eq!(ready_condition(&node)["reason"], "NodeStatusUnknown");

    let replaced = cluster.wait_for("9 Running pods on the two live nodes", || {
        let by_node = live_pods_by_node(&pods(&cluster, "multi"))?;
        let total: usize = by_node.values().sum();
        if total == 9 && !by_node.contains_key(dead) {
            Ok(by_node)
        } else {
            Err(format!("{by_node:?}"))
        }
    });
    eprintln!(
        "replaced {:?} after the kill: {replaced:?}",
        killed.elapsed()
    );
    let live = NODES.iter().filter(|n| **n != dead);
    let counts: Vec<usize> = live
        .map(|n| replaced.get(*n).copied().unwrap_or(0))
        .collect();
    let skew = counts.iter().max().unwrap() - counts.iter().min().unwrap();
    assert!(skew <= 1, "the replacements' spread: {replaced:?}");
    wait_available(&cluster, "multi", "web", 9);
    for node in NODES.iter().filter(|n| **n != dead) {
        let node = cluster.get(&["node", node]);
        assert_eq!(
            node_condition(&node, "Ready").as_deref(),
            Some("True"),
            "a live agent's Node: {}",
            ready_condition(&node)
        );
        let taints = not_ready_taints(&node);
        assert!(taints.is_empty(), "a live agent's Node got {taints:?}");
    }
    for pod in pods(&cluster, "multi") {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
        if node == dead {
            assert!(
                !pod["metadata"]["deletionTimestamp"].is_null(),
                "{name} of the dead node was not evicted: {}",
                pod["metadata"]
            );
            continue;
        }
        // Each replacement runs on a live agent: it is in that agent's own /pods.
        let index = NODES.iter().position(|n| *n == node).expect("a known node");
        let agent = nodes[index].agent.as_ref().expect("a live agent");
        let local = agent
            .pod(name)
            .unwrap_or_else(|| panic!("{node}'s /pods lacks {name}"));
        assert_eq!(local["status"]["phase"], "Running", "{local}");
    }
    assert_nothing_refused(&cluster, &NODES);
    drop(nodes);
}

/// An audit event of `user`'s TokenRequest for the pod `uid`, received at second `at`.
fn token_request(user: &str, uid: &str, at: u32, code: u16) -> Value {
    serde_json::json!({
        "user": { "username": user },
        "verb": "create",
        "requestURI": "/api/v1/namespaces/multi/serviceaccounts/default/token",
        "objectRef": { "resource": "serviceaccounts", "subresource": "token" },
        "requestObject": { "spec": { "boundObjectRef": { "kind": "Pod", "uid": uid } } },
        "requestReceivedTimestamp": format!("2026-12-03T15:53:{at:02}.000000Z"),
        "responseStatus": { "code": code, "message": format!("refused {uid}") },
    })
}

/// An audit event of the scheduler's binding of the pod `uid` to `node`, done at second `at`.
fn binding(uid: &str, node: &str, at: u32) -> Value {
    serde_json::json!({
        "user": { "username": "system:kube-scheduler" },
        "objectRef": { "resource": "pods", "subresource": "binding" },
        "requestObject": { "metadata": { "uid": uid }, "target": { "kind": "Node", "name": node } },
        "stageTimestamp": format!("2026-12-03T15:53:{at:02}.000000Z"),
        "responseStatus": { "code": 201 },
    })
}

/// The refusals `refused_requests_of_node` forgives are only the API server's lagging caches:
/// a TokenRequest for a pod bound to the node before it came and granted on a retry. One for a
/// pod bound to another node, bound only after the request, or never granted is the agent's.
#[test]
fn a_token_refused_by_lagging_caches_is_told_from_the_agents_mistake() {
    let b = "system:node:node-b";
    let events = [
        // Bound before, refused, granted on the retry: the caches lagged.
        binding("lagged", "node-b", 5),
        token_request(b, "lagged", 10, 403),
        token_request(b, "lagged", 11, 201),
        // Another node's pod.
        binding("theirs", "node-a", 5),
        token_request(b, "theirs", 10, 403),
        token_request(b, "theirs", 11, 201),
        // Asked before the binding.
        token_request(b, "early", 10, 403),
        binding("early", "node-b", 12),
        token_request(b, "early", 13, 201),
        // Never granted.
        binding("never", "node-b", 5),
        token_request(b, "never", 10, 403),
        // Another node's own refusal.
        token_request("system:node:node-a", "lagged", 10, 403),
    ];
    let explained = crate::support::refusals_of_lagging_caches(&events, "node-b");
    assert_eq!(
        explained,
        ["403 create /api/v1/namespaces/multi/serviceaccounts/default/token: refused lagged"]
    );
}
