//! Issue 25, items 1-3 on the simulated runtime: a node with only its certificate joins,
//! stays Ready, runs what the scheduler gives it, and goes NotReady when it dies.

use serde_json::Value;

use crate::harness::{Agent, start};
use crate::support::{Cluster, TEST_EVICTION_HARD, cluster};

/// `rustlet` as `node` of `cluster`, on the simulated runtime, with its node kubeconfig only.
pub fn start_simulated(cluster: &Cluster, node: &str) -> Agent {
    let root = cluster.scratch(&format!("root-{node}"));
    let kubeconfig = cluster.inner.node_kubeconfig(node);
    let config = cluster.scratch("config").join(format!("{node}.yaml"));
    std::fs::write(&config, TEST_EVICTION_HARD).unwrap();
    start(
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
    )
}

/// The status of the node's condition `type_`.
pub fn node_condition(node: &Value, type_: &str) -> Option<String> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str().map(str::to_owned))
}

/// Waits until the Node's Ready condition is `status`.
pub fn wait_ready(cluster: &Cluster, node: &str, status: &str) -> Value {
    cluster.wait_for(&format!("node {node} Ready={status}"), || {
        let n = cluster
            .try_get(&["node", node])
            .ok_or_else(|| "no Node".to_owned())?;
        match node_condition(&n, "Ready") {
            Some(s) if s == status => Ok(n),
            other => Err(format!("Ready={other:?}")),
        }
    })
}

/// A Deployment of `replicas` busybox pods in `namespace`, placed by the scheduler on nodes
/// labelled `kubernetes.io/hostname=<node>` when `node` is given.
pub fn deployment(namespace: &str, name: &str, replicas: u32, node: Option<&str>) -> String {
    let selector = node.map_or(String::new(), |n| {
        format!("      nodeSelector:\n        kubernetes.io/hostname: {n}\n")
    });
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
{selector}      terminationGracePeriodSeconds: 5
      containers:
      - name: main
        image: localhost/busybox:1
        command: [sleep, \"3600\"]
"
    )
}

/// Waits until the Deployment reports `replicas` available; returns it.
pub fn wait_available(cluster: &Cluster, namespace: &str, name: &str, replicas: u64) -> Value {
    cluster.wait_for(
        &format!("deployment {name} with {replicas} available"),
        || {
            let d = cluster.get(&["-n", namespace, "deployment", name]);
            let available = d["status"]["availableReplicas"].as_u64().unwrap_or(0);
            let total = d["status"]["replicas"].as_u64().unwrap_or(0);
            if available == replicas && total == replicas {
                Ok(d)
            } else {
                Err(format!("{available} available of {total}"))
            }
        },
    )
}

/// The pods of namespace `ns` (items of `kubectl get pods`).
pub fn pods(cluster: &Cluster, ns: &str) -> Vec<Value> {
    cluster.get(&["-n", ns, "pods"])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Item 2: the Node as the real API server stores it has what upstream's kubelet gives it:
/// the well-known labels, the conditions with upstream's reasons, capacity and allocatable,
/// `nodeInfo`, addresses and the kubelet endpoint.
pub fn assert_node_is_believable(node: &Value, name: &str) {
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], name, "{labels}");
    assert_eq!(labels["kubernetes.io/os"], "linux", "{labels}");
    assert!(labels["kubernetes.io/arch"].is_string(), "{labels}");
    let status = &node["status"];
    let reasons: Vec<(String, String, String)> = status["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            (s("type"), s("status"), s("reason"))
        })
        .collect();
    for want in [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ] {
        let want = (want.0.to_owned(), want.1.to_owned(), want.2.to_owned());
        assert!(reasons.contains(&want), "{want:?} in {reasons:?}");
    }
    for key in ["cpu", "memory", "pods", "ephemeral-storage"] {
        assert!(
            status["capacity"][key].is_string(),
            "capacity {key}: {status}"
        );
        assert!(
            status["allocatable"][key].is_string(),
            "allocatable {key}: {status}"
        );
    }
    let info = &status["nodeInfo"];
    for key in [
        "machineID",
        "bootID",
        "kernelVersion",
        "osImage",
        "containerRuntimeVersion",
        "kubeletVersion",
    ] {
        assert!(
            info[key].as_str().is_some_and(|v| !v.is_empty()),
            "nodeInfo.{key}: {info}"
        );
    }
    assert_eq!(info["operatingSystem"], "linux", "{info}");
    assert!(
        info["kubeletVersion"]
            .as_str()
            .unwrap()
            .starts_with("v1.37."),
        "{info}"
    );
    let types: Vec<&str> = status["addresses"]
        .as_array()
        .expect("addresses")
        .iter()
        .filter_map(|a| a["type"].as_str())
        .collect();
    assert!(
        types.contains(&"InternalIP") && types.contains(&"Hostname"),
        "{types:?}"
    );
    assert_eq!(
        status["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250,
        "{status}"
    );
}

/// Items 1 and 3 with the simulated runtime: the agent, holding only `system:node:node-a`,
/// registers, turns Ready, runs the three pods the scheduler places on it until the
/// Deployment is Available, scales down and loses its namespace gracefully, and not one of
/// its requests was refused (the audit log has no 4xx for it but 404/409).
#[test]
fn a_node_with_only_its_certificate_joins_and_runs_a_deployment() {
    let Some(cluster) = cluster("joins", &["node-a"], |_| {}) else {
        return;
    };
    let agent = start_simulated(&cluster, "node-a");
    let node = wait_ready(&cluster, "node-a", "True");
    assert_node_is_believable(&node, "node-a");
    cluster.kubectl(&["create", "namespace", "joins"]);
    cluster.apply(&deployment("joins", "web", 3, Some("node-a")));
    wait_available(&cluster, "joins", "web", 3);
    for pod in pods(&cluster, "joins") {
        assert_eq!(pod["spec"]["nodeName"], "node-a", "{pod}");
        assert_eq!(pod["status"]["phase"], "Running", "{}", pod["status"]);
    }

    cluster.kubectl(&["-n", "joins", "scale", "deployment", "web", "--replicas=1"]);
    cluster.wait_for("two pods gone after the scale-down", || {
        let left = pods(&cluster, "joins").len();
        if left == 1 {
            Ok(())
        } else {
            Err(format!("{left} pods"))
        }
    });

    cluster.kubectl(&["delete", "namespace", "joins", "--wait=false"]);
    cluster.wait_for("the namespace gone", || {
        match cluster.try_get(&["namespace", "joins"]) {
            None => Ok(()),
            Some(ns) => Err(format!("{}", ns["status"])),
        }
    });
    let root = cluster.scratch("root-node-a");
    cluster.wait_for("no pod directory left under the root dir", || {
        let left: Vec<_> = std::fs::read_dir(root.join("pods"))
            .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
    drop(agent);
}
