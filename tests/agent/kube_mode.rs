//! Kube mode against the test API server: the node registers and renews its Lease, a pod
//! bound to it runs and reports, its deletion ends in a DELETE with grace 0 and the pod's UID,
//! and another node's pods are never touched.

use std::sync::Arc;

use http::Method;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use rustlet_api::local::store::{Kind, ObjectRef, Store};
use rustlet_api::test_server::TestApiServer;
use rustlet_mount::testing::privileged_dir;

use crate::harness::start;

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "busybox",
                            "volumeMounts": [{"name": "scratch", "mountPath": "/s"}]}],
            "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}]
        }
    }))
    .unwrap()
}

#[test]
fn kube_mode_registers_runs_reports_and_deletes_with_the_uid() {
    let Some(dir) = privileged_dir("kube_mode_registers_runs_reports_and_deletes") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = Arc::new(Store::default());
    let server = rt.block_on(TestApiServer::start(store.clone())).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
    let root = dir.mkdir("root");
    let agent = start(
        &[
            "--node-name",
            "node-a",
            "--root-dir",
            root.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ],
        &dir.path().join("agent.log"),
    );
    agent.wait_for("the node registered with its lease", || {
        let node = store.get(&ObjectRef::new(Kind::Node, "", "node-a")).ok()?;
        store
            .get(&ObjectRef::new(Kind::Lease, "kube-node-lease", "node-a"))
            .ok()?;
        Some(node)
    });

    let client = rt.block_on(server.client()).unwrap();
    let api: Api<Pod> = Api::namespaced(client, "default");
    let created = rt
        .block_on(api.create(&PostParams::default(), &pod("web", "node-a")))
        .unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    rt.block_on(api.create(&PostParams::default(), &pod("elsewhere", "node-b")))
        .unwrap();
    let reference = ObjectRef::new(Kind::Pod, "default", "web");
    agent.wait_for("web Running in the API", || {
        let stored = store.get(&reference).ok()?;
        (stored["status"]["phase"] == "Running").then_some(stored)
    });
    assert!(
        root.join(format!(
            "pods/{uid}/volumes/kubernetes.io~empty-dir/scratch"
        ))
        .is_dir()
    );
    assert!(agent.pod("web").is_some() && agent.pod("elsewhere").is_none());

    rt.block_on(api.delete("web", &DeleteParams::default()))
        .unwrap();
    agent.wait_for("web deleted from the API", || {
        store.get(&reference).err().filter(|e| e.code() == 404)
    });
    let deletes: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::DELETE && r.path.ends_with("/pods/web"))
        .collect();
    assert_eq!(
        deletes.len(),
        2,
        "the user's, then the agent's: {deletes:?}"
    );
    let body: serde_json::Value = serde_json::from_str(&deletes[1].body).unwrap();
    assert_eq!(body["gracePeriodSeconds"], 0, "{body}");
    assert_eq!(body["preconditions"]["uid"], uid.as_str(), "{body}");
    assert!(!root.join("pods").join(&uid).exists());
    assert_eq!(
        server.count(&Method::PATCH, "/pods/elsewhere"),
        0,
        "another node's pod is never written"
    );
    assert!(
        server.count(&Method::PUT, "/leases/node-a") + server.count(&Method::POST, "/leases") >= 1
    );
    assert!(agent.terminate().success());
    drop(server);
}
