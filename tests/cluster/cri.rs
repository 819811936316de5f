//! Issue 25 on containerd: the agent in a private containerd's network namespace (the node's
//! network: its pods' bridge is there), reaching the API server through a [`Forwarder`].

use std::net::SocketAddr;

use rustlet_cri::testing::PrivateContainerd;

use crate::harness::{Agent, start_in};
use crate::node::{deployment, pods, wait_available, wait_ready};
use crate::support::{Cluster, Forwarder, POD_NETWORK_GATEWAY, cluster};

/// A real control plane, a private containerd and the agent of `node` on it.
pub struct CriNode {
    pub agent: Agent,
    /// Held so that the agent keeps its way to the API server until the node is dropped.
    #[allow(dead_code)]
    pub forwarder: Forwarder,
    pub containerd: PrivateContainerd,
    pub cluster: Cluster,
}

impl CriNode {
    /// `None` when the control plane is not built or the test cannot run containers (each
    /// says why; under the REQUIRE variables they fail instead).
    pub fn start(test: &str, node: &str) -> Option<Self> {
        let containerd = PrivateContainerd::start_blocking(test)?;
        let cluster = cluster(test, &[node], |o| {
            o.extra_apiserver_ips.push(POD_NETWORK_GATEWAY);
        })?;
        let target = SocketAddr::from(([127, 0, 0, 1], cluster.inner.apiserver_port()));
        let forwarder = Forwarder::into_netns(&containerd.netns(), target);
        let kubeconfig = cluster.node_kubeconfig_at(node, forwarder.port);
        let root = containerd.dir().join("root");
        let gateway = std::net::Ipv4Addr::from(POD_NETWORK_GATEWAY);
        let config = containerd.dir().join("config.yaml");
        std::fs::write(&config, format!("nodeIP: {gateway}\n")).unwrap();
        let agent = start_in(
            Some(&containerd.netns()),
            &[
                "--node-name",
                node,
                "--root-dir",
                root.to_str().unwrap(),
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--config",
                config.to_str().unwrap(),
                "--runtime",
                "cri",
                "--container-runtime-endpoint",
                containerd.endpoint(),
            ],
            &containerd.dir().join("agent.log"),
        );
        Some(Self {
            agent,
            forwarder,
            containerd,
            cluster,
        })
    }
}

/// Item 3 on containerd: a Deployment of 3 replicas created with kubectl is placed by the real
/// scheduler on the node and becomes Available; each pod runs with an IP of the node's pod
/// network, as `kubectl get pods -o wide` shows it.
#[test]
fn cri_a_deployment_scheduled_on_the_node_becomes_available_with_pod_ips() {
    let Some(node) = CriNode::start("cri-deploy", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    cluster.kubectl(&["create", "namespace", "deploy"]);
    cluster.apply(&deployment("deploy", "web", 3, Some("node-a")));
    wait_available(cluster, "deploy", "web", 3);
    let wide = cluster.kubectl(&["-n", "deploy", "get", "pods", "-o", "wide"]);
    for pod in pods(cluster, "deploy") {
        let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
        assert!(
            ip.starts_with("10.88."),
            "pod IP {ip:?}: {}\ncontainerd: {}",
            pod["status"],
            node.containerd.log()
        );
        assert!(wide.contains(ip), "{wide}");
        assert_eq!(pod["status"]["phase"], "Running");
        let name = pod["metadata"]["name"].as_str().unwrap();
        let local = node.agent.pod(name).expect("the agent's /pods lists it");
        assert_eq!(local["status"]["podIP"], ip, "{local}");
    }
    let refused = cluster.refused_requests_of("system:node:node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}
