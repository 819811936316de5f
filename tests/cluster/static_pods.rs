//! Issue 25, item 1's mirror pods: the Node authorizer and NodeRestriction let a node create
//! a pod only as the mirror of one of its static pods (the `kubernetes.io/config.mirror`
//! annotation, `spec.nodeName` = itself, its Node as the one controller owner) and delete only
//! its own pods; the agent's mirror pods pass both.

use crate::harness::start;
use crate::node::wait_ready;
use crate::support::{TEST_EVICTION_HARD, cluster};

const STATIC_POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: proxy
  namespace: kube-system
spec:
  containers:
  - name: c
    image: busybox
";

/// The static pod runs from its file and reports through a mirror pod the real API server
/// admits; a deleted mirror is made again; a removed manifest deletes the mirror. Nothing the
/// agent asked was refused.
#[test]
fn a_static_pods_mirror_is_admitted_by_node_restriction() {
    let Some(cluster) = cluster("static", &["node-a"], |_| {}) else {
        return;
    };
    let statics = cluster.scratch("static");
    std::fs::write(statics.join("proxy.yaml"), STATIC_POD).unwrap();
    let root = cluster.scratch("root-node-a");
    let config = cluster.scratch("config").join("node-a.yaml");
    std::fs::write(
        &config,
        format!("statusSyncPeriodSeconds: 1\n{TEST_EVICTION_HARD}"),
    )
    .unwrap();
    let kubeconfig = cluster.inner.node_kubeconfig("node-a");
    let _agent = start(
        &[
            "--node-name",
            "node-a",
            "--root-dir",
            root.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--pod-manifest-path",
            statics.to_str().unwrap(),
        ],
        &cluster.scratch("logs").join("agent-node-a.log"),
    );
    let node = wait_ready(&cluster, "node-a", "True");
    let mirror = cluster.wait_for("the mirror pod Running", || {
        let pod = cluster
            .try_get(&["-n", "kube-system", "pod", "proxy-node-a"])
            .ok_or("no mirror pod")?;
        if pod["status"]["phase"] == "Running" {
            Ok(pod)
        } else {
            Err(format!("{}", pod["status"]))
        }
    });
    let meta = &mirror["metadata"];
    assert!(
        meta["annotations"]["kubernetes.io/config.mirror"].is_string(),
        "{meta}"
    );
    assert_eq!(meta["ownerReferences"][0]["kind"], "Node", "{meta}");
    assert_eq!(
        meta["ownerReferences"][0]["uid"], node["metadata"]["uid"],
        "{meta}"
    );
    assert_eq!(mirror["spec"]["nodeName"], "node-a");

    cluster.kubectl(&[
        "-n",
        "kube-system",
        "delete",
        "pod",
        "proxy-node-a",
        "--wait=false",
    ]);
    let old = meta["uid"].clone();
    cluster.wait_for("a new mirror pod", || {
        match cluster.try_get(&["-n", "kube-system", "pod", "proxy-node-a"]) {
            Some(p) if p["metadata"]["uid"] != old && p["status"]["phase"] == "Running" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    std::fs::remove_file(statics.join("proxy.yaml")).unwrap();
    cluster.wait_for("the mirror pod deleted", || {
        match cluster.try_get(&["-n", "kube-system", "pod", "proxy-node-a"]) {
            None => Ok(()),
            Some(p) => Err(format!("{}", p["metadata"])),
        }
    });
    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}
