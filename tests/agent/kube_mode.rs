//! Kube mode against the test API server: the node registers and renews its Lease, a pod
//! bound to it runs and reports, its deletion ends in a DELETE with grace 0 and the pod's UID,
//! and another node's pods are never touched.

use std::sync::Arc;

use http::Method;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use rustlet_api::local::store::{Kind, ObjectRef, Selection, Store};
use rustlet_api::test_server::TestApiServer;
use rustlet_mount::testing::{PrivilegedDir, privileged_dir};

use crate::harness::{Agent, start};

/// A test API server over a store, and a root directory for the agent, in a privileged temp
/// dir.
struct Cluster {
    dir: PrivilegedDir,
    rt: tokio::runtime::Runtime,
    store: Arc<Store>,
    server: TestApiServer,
    root: std::path::PathBuf,
}

impl Cluster {
    /// `None` (the test is skipped) without the privileges to mount.
    fn new(test: &str) -> Option<Self> {
        let dir = privileged_dir(test)?;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = Arc::new(Store::default());
        let server = rt.block_on(TestApiServer::start(store.clone())).unwrap();
        let root = dir.mkdir("root");
        Some(Self {
            dir,
            rt,
            store,
            server,
            root,
        })
    }

    /// Starts `rustlet --node-name node-a` against the server, with `config` as its config
    /// file (if any) and `extra` flags.
    fn start(&self, config: Option<&str>, extra: &[&str]) -> Agent {
        let kubeconfig = self.dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, self.server.kubeconfig()).unwrap();
        let config_file = self.dir.path().join("config.yaml");
        let mut args = vec![
            "--node-name",
            "node-a",
            "--root-dir",
            self.root.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ];
        if let Some(text) = config {
            std::fs::write(&config_file, text).unwrap();
            args.extend(["--config", config_file.to_str().unwrap()]);
        }
        args.extend(extra);
        start(&args, &self.dir.path().join("agent.log"))
    }

    /// The pods of a namespace, through a client of the server.
    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.rt.block_on(self.server.client()).unwrap(), namespace)
    }
}

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
    let Some(cluster) = Cluster::new("kube_mode_registers_runs_reports_and_deletes") else {
        return;
    };
    let (rt, store, server, root) = (&cluster.rt, &cluster.store, &cluster.server, &cluster.root);
    let agent = cluster.start(Some("nodeLeaseRenewIntervalSeconds: 0.2\n"), &[]);
    agent.wait_for("the node registered with its lease", || {
        let node = store.get(&ObjectRef::new(Kind::Node, "", "node-a")).ok()?;
        store
            .get(&ObjectRef::new(Kind::Lease, "kube-node-lease", "node-a"))
            .ok()?;
        Some(node)
    });

    agent.wait_for("the lease renewed", || {
        (server.count(&Method::PUT, "/leases/node-a") >= 2).then_some(())
    });

    let api = cluster.pods("default");
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
    // The kubelet's events about the pod, as events.k8s.io/v1 objects in the API.
    let reasons = || -> Vec<String> {
        store
            .list(&Selection::all(Kind::Event))
            .0
            .iter()
            .filter(|e| e["regarding"]["name"] == "web")
            .filter_map(|e| e["reason"].as_str().map(str::to_owned))
            .collect()
    };
    agent.wait_for("Created and Started events", || {
        let reasons = reasons();
        (reasons.contains(&"Created".to_owned()) && reasons.contains(&"Started".to_owned()))
            .then_some(())
    });
    // Events wait in a bounded queue of their own; what a full queue drops is counted
    // (issue 24, item 13).
    let (code, metrics) = agent.get("/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("rustlet_events_dropped_total 0"),
        "{metrics}"
    );

    rt.block_on(api.delete("web", &DeleteParams::default()))
        .unwrap();
    agent.wait_for("web deleted from the API", || {
        store.get(&reference).err().filter(|e| e.code() == 404)
    });
    assert!(reasons().contains(&"Killing".to_owned()), "{:?}", reasons());
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
}

const PROXY: &str = "apiVersion: v1
kind: Pod
metadata:
  name: proxy
  namespace: kube-system
spec:
  containers:
  - name: c
    image: busybox
    volumeMounts:
    - {name: scratch, mountPath: /s}
  volumes:
  - name: scratch
    emptyDir:
      medium: Memory
";

/// `--pod-manifest-path` in kube mode: the static pod runs from its file, its mirror pod in
/// the API carries its status, a deleted mirror is re-created without stopping the pod, and a
/// removed manifest stops the pod and deletes its mirror.
#[test]
fn static_pods_run_from_their_files_and_report_through_mirror_pods() {
    let Some(cluster) = Cluster::new("static_pods_run_from_their_files") else {
        return;
    };
    let (store, root) = (&cluster.store, &cluster.root);
    let statics = cluster.dir.mkdir("static");
    std::fs::write(statics.join("proxy.yaml"), PROXY).unwrap();
    // A new mirror gets its status from the full batch: a short period keeps the test short.
    let agent = cluster.start(
        Some("statusSyncPeriodSeconds: 1\n"),
        &["--pod-manifest-path", statics.to_str().unwrap()],
    );
    let mirror_ref = ObjectRef::new(Kind::Pod, "kube-system", "proxy-node-a");
    let mirror = agent.wait_for("the mirror pod Running in the API", || {
        let stored = store.get(&mirror_ref).ok()?;
        (stored["status"]["phase"] == "Running").then_some(stored)
    });
    let static_uid = agent.pod("proxy-node-a").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"],
        static_uid.as_str()
    );
    assert_eq!(mirror["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_ne!(mirror["metadata"]["uid"], static_uid.as_str());
    let scratch = root.join(format!(
        "pods/{static_uid}/volumes/kubernetes.io~empty-dir/scratch"
    ));
    assert!(scratch.is_dir());

    // A user deletes the mirror: it comes back; the static pod never stopped.
    let (rt, api) = (&cluster.rt, cluster.pods("kube-system"));
    rt.block_on(api.delete("proxy-node-a", &DeleteParams::default()))
        .unwrap();
    let old_mirror_uid = mirror["metadata"]["uid"].clone();
    agent.wait_for("a new mirror", || {
        let stored = store.get(&mirror_ref).ok()?;
        (stored["metadata"]["uid"] != old_mirror_uid && stored["status"]["phase"] == "Running")
            .then_some(())
    });
    assert!(scratch.is_dir(), "the static pod kept its volume");

    // The manifest goes: the pod stops, its mirror is deleted, its directory removed.
    std::fs::remove_file(statics.join("proxy.yaml")).unwrap();
    agent.wait_for("the mirror deleted", || {
        store.get(&mirror_ref).err().filter(|e| e.code() == 404)
    });
    agent.wait_for("the static pod's directory removed", || {
        (!root.join("pods").join(&static_uid).exists()).then_some(())
    });
    assert!(agent.pod("proxy-node-a").is_none());
    assert!(agent.terminate().success());
}

/// Faults on every path the agent uses (500, 409, 429 on status writes and deletes, latency,
/// cut pod watches): the final statuses in the API are still right, and each pod is still
/// deleted with its UID once reclaimed.
#[test]
fn api_faults_delay_but_never_corrupt_the_final_statuses() {
    use std::time::Duration;

    use rustlet_api::test_server::{Fault, FaultAction};
    let Some(cluster) = Cluster::new("api_faults_delay_but_never_corrupt") else {
        return;
    };
    let (rt, store, server, root) = (&cluster.rt, &cluster.store, &cluster.server, &cluster.root);
    let fault = |method: Option<Method>, path: &str, action: FaultAction, times: usize| Fault {
        method,
        path_contains: path.to_owned(),
        action,
        times: Some(times),
    };
    server.inject(fault(
        Some(Method::PATCH),
        "/status",
        FaultAction::Status(500),
        3,
    ));
    server.inject(fault(
        Some(Method::PATCH),
        "/status",
        FaultAction::Status(409),
        2,
    ));
    server.inject(fault(
        Some(Method::PATCH),
        "/status",
        FaultAction::Status(429),
        2,
    ));
    server.inject(fault(
        Some(Method::PATCH),
        "/status",
        FaultAction::Delay(Duration::from_millis(700)),
        3,
    ));
    server.inject(fault(
        Some(Method::GET),
        "/api/v1/pods",
        FaultAction::CutWatchAfter(2),
        3,
    ));
    let agent = cluster.start(Some("statusSyncPeriodSeconds: 1\n"), &[]);
    let api = cluster.pods("default");
    let names = ["a", "b", "c", "d"];
    for name in names {
        rt.block_on(api.create(&PostParams::default(), &pod(name, "node-a")))
            .unwrap();
    }
    for name in names {
        let reference = ObjectRef::new(Kind::Pod, "default", name);
        agent.wait_for(&format!("{name} Running in the API"), || {
            let stored = store.get(&reference).ok()?;
            let ready = stored["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (stored["status"]["phase"] == "Running" && ready).then_some(())
        });
    }
    for name in names {
        rt.block_on(api.delete(name, &DeleteParams::default()))
            .unwrap();
    }
    // The agent's final DELETEs: the first one fails.
    server.inject(fault(
        Some(Method::DELETE),
        "/pods/",
        FaultAction::Status(500),
        1,
    ));
    for name in names {
        let reference = ObjectRef::new(Kind::Pod, "default", name);
        agent.wait_for(&format!("{name} deleted"), || {
            store.get(&reference).err().filter(|e| e.code() == 404)
        });
    }
    let agent_deletes = server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::DELETE && r.body.contains("\"uid\""))
        .count();
    assert!(agent_deletes >= names.len(), "every deletion carried a UID");
    assert!(
        server.count(&Method::PATCH, "/status") >= names.len() + 3,
        "the failed status writes were retried"
    );
    assert!(
        server.count(&Method::DELETE, "/pods/") > 2 * names.len(),
        "the failed final DELETE was retried"
    );
    assert!(mounts_under_root_are_gone(root));
    assert!(agent.terminate().success());
}

fn mounts_under_root_are_gone(root: &std::path::Path) -> bool {
    crate::harness::mounts_under(root).is_empty()
}

/// A restart in kube mode (issue 10 item 11, V74 and V13): the reconstructed volumes wait for
/// the Node read from the API server before anything is unmounted; then a pod force-deleted
/// while the agent was down loses its tmpfs and directory, and a pod still bound keeps its
/// data.
#[test]
fn a_restart_reads_the_node_status_then_adopts_or_tears_down() {
    let Some(cluster) = Cluster::new("kube_mode_restart_reads_the_node_status") else {
        return;
    };
    let (rt, store, root) = (&cluster.rt, &cluster.store, &cluster.root);
    let agent = cluster.start(None, &[]);
    let api = cluster.pods("default");
    let mut uids = Vec::new();
    for name in ["keep", "gone"] {
        let created = rt
            .block_on(api.create(&PostParams::default(), &pod(name, "node-a")))
            .unwrap();
        uids.push(created.metadata.uid.unwrap());
    }
    for name in ["keep", "gone"] {
        let reference = ObjectRef::new(Kind::Pod, "default", name);
        agent.wait_for("Running in the API", || {
            let stored = store.get(&reference).ok()?;
            (stored["status"]["phase"] == "Running").then_some(())
        });
    }
    let volume = |uid: &str| {
        root.join(format!(
            "pods/{uid}/volumes/kubernetes.io~empty-dir/scratch"
        ))
    };
    std::fs::write(volume(&uids[0]).join("data"), "survives").unwrap();
    assert_eq!(crate::harness::mounts_under(root).len(), 2);
    agent.kill9();

    // Force-deleted while no agent runs.
    rt.block_on(api.delete(
        "gone",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    ))
    .unwrap();
    let agent = cluster.start(None, &[]);
    agent.wait_for("the force-deleted pod's tmpfs and directory gone", || {
        (!root.join("pods").join(&uids[1]).exists()).then_some(())
    });
    let log = std::fs::read_to_string(&agent.log).unwrap();
    // Only a reconstruction with volumes (the second agent's) logs this.
    assert!(
        log.contains("reconstructed volumes updated from the node status"),
        "the node status was read after the restart"
    );
    assert_eq!(
        std::fs::read_to_string(volume(&uids[0]).join("data")).unwrap(),
        "survives"
    );
    assert_eq!(
        crate::harness::mounts_under(root),
        [volume(&uids[0]).to_string_lossy()],
        "the kept pod's tmpfs, once"
    );
    assert!(agent.terminate().success());
}

/// Issue 12: a pod's PersistentVolumeClaim, bound (as the PV controller would) to a local PV
/// whose node affinity names this node, is mounted from the PV's path; a claim whose PV is
/// for another node leaves its pod Pending with the reason in an event; the pod's deletion
/// unmounts the volume and leaves the disk's data.
#[test]
fn a_claim_bound_to_a_local_volume_is_mounted_from_its_path() {
    let Some(cluster) = Cluster::new("kube_mode_claim_bound_to_a_local_volume") else {
        return;
    };
    let (rt, store, root) = (&cluster.rt, &cluster.store, &cluster.root);
    let disk = cluster.dir.mkdir("disks/ssd1");
    std::fs::write(disk.join("existing"), "on the disk").unwrap();
    let agent = cluster.start(None, &[]);
    let bind = |claim: &str, pv: &str, host: &str| {
        let pvc = store
            .create(
                serde_json::json!({"apiVersion":"v1","kind":"PersistentVolumeClaim",
                "metadata":{"name":claim,"namespace":"default"},
                "spec":{"volumeName":pv,"accessModes":["ReadWriteOnce"],
                        "resources":{"requests":{"storage":"1Gi"}}}}),
            )
            .unwrap();
        store
            .patch_status(
                &ObjectRef::new(Kind::PersistentVolumeClaim, "default", claim),
                &serde_json::json!({"status":{"phase":"Bound"}}),
            )
            .unwrap();
        store
            .create(serde_json::json!({"apiVersion":"v1","kind":"PersistentVolume",
                "metadata":{"name":pv},
                "spec":{"capacity":{"storage":"1Gi"},"accessModes":["ReadWriteOnce"],
                        "local":{"path":disk.to_str().unwrap()},
                        "claimRef":{"namespace":"default","name":claim,
                                    "uid":pvc["metadata"]["uid"]},
                        "nodeAffinity":{"required":{"nodeSelectorTerms":[{"matchExpressions":[
                            {"key":"kubernetes.io/hostname","operator":"In","values":[host]}]}]}}}}))
            .unwrap();
    };
    bind("data", "pv-ssd1", "node-a");
    bind("far", "pv-far", "node-b");
    let claim_pod = |name: &str, claim: &str| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "node-a",
                "containers": [{"name": "c", "image": "busybox",
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}
        }))
        .unwrap()
    };
    let api = cluster.pods("default");
    let db = rt
        .block_on(api.create(&PostParams::default(), &claim_pod("db", "data")))
        .unwrap();
    rt.block_on(api.create(&PostParams::default(), &claim_pod("far-db", "far")))
        .unwrap();
    let reference = ObjectRef::new(Kind::Pod, "default", "db");
    agent.wait_for("db Running", || {
        let stored = store.get(&reference).ok()?;
        (stored["status"]["phase"] == "Running").then_some(())
    });
    let uid = db.metadata.uid.unwrap();
    let volume = root.join(format!(
        "pods/{uid}/volumes/kubernetes.io~local-volume/pv-ssd1"
    ));
    assert_eq!(
        std::fs::read_to_string(volume.join("existing")).unwrap(),
        "on the disk"
    );
    std::fs::write(volume.join("written"), "by the pod").unwrap();
    assert_eq!(
        std::fs::read_to_string(disk.join("written")).unwrap(),
        "by the pod"
    );
    agent.wait_for("the affinity conflict reported", || {
        store
            .list(&Selection::all(Kind::Event))
            .0
            .iter()
            .find(|e| {
                e["regarding"]["name"] == "far-db"
                    && e["note"]
                        .as_str()
                        .is_some_and(|n| n.contains("volume node affinity conflict"))
            })
            .cloned()
    });
    assert_eq!(
        store
            .get(&ObjectRef::new(Kind::Pod, "default", "far-db"))
            .unwrap()["status"]["phase"],
        "Pending"
    );

    rt.block_on(api.delete("db", &DeleteParams::default()))
        .unwrap();
    agent.wait_for("db deleted", || store.get(&reference).err());
    assert!(!volume.exists());
    assert!(crate::harness::mounts_under(root).is_empty());
    assert_eq!(
        std::fs::read_to_string(disk.join("written")).unwrap(),
        "by the pod"
    );
    assert!(agent.terminate().success());
}
