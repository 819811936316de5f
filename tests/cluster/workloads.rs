//! Issue 25 items 3 and 5 on containerd with the real control plane: pods leave gracefully
//! (scale-down, namespace deletion) and leave nothing behind, and the statuses the agent
//! reports are the ones the real API server stores (every patch accepted by its validation);
//! and item 7 for that validation: the in-tree test API server refuses the pod status writes
//! the real one refuses.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustlet_cri::CriClient;
use serde_json::{Value, json};

use crate::cri::CriNode;
use crate::harness::mounts_under;
use crate::node::{pods, wait_available, wait_ready};
use crate::support::Cluster;

/// The agent's root directory in a [`CriNode`].
fn root_dir(node: &CriNode) -> PathBuf {
    node.containerd.dir().join("root")
}

/// The sandboxes and containers the node's containerd holds (IDs), listed through CRI.
fn runtime_objects(node: &CriNode) -> (Vec<String>, Vec<String>) {
    let endpoint = node.containerd.endpoint().to_owned();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let client = CriClient::connect(&endpoint, Duration::from_secs(30))
                .await
                .unwrap();
            let sandboxes = client.list_pod_sandboxes().await.unwrap();
            let containers = client.list_containers().await.unwrap();
            (
                sandboxes.into_iter().map(|s| s.id).collect(),
                containers.into_iter().map(|c| c.id).collect(),
            )
        })
}

/// The names of the entries of `dir` (none when it does not exist).
fn entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The names of the pods of namespace `ns`.
fn pod_names(cluster: &Cluster, ns: &str) -> BTreeSet<String> {
    pods(cluster, ns)
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// A Deployment whose container, on SIGTERM, waits two seconds (inside its grace period of
/// 30), then writes `graceful` into `<markers>/<pod name>` (a hostPath) and exits 0: a marker
/// proves the container got SIGTERM and the time to act on it, not a SIGKILL.
fn graceful_deployment(namespace: &str, name: &str, node: &str, markers: &Path) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {namespace}
spec:
  replicas: 3
  selector:
    matchLabels:
      app: {name}
  template:
    metadata:
      labels:
        app: {name}
    spec:
      nodeSelector:
        kubernetes.io/hostname: {node}
      terminationGracePeriodSeconds: 30
      containers:
      - name: main
        image: localhost/busybox:1
        command: ["/bin/sh", "-c", "trap 'sleep 2; echo graceful > /markers/$(hostname); exit 0' TERM; while true; do sleep 1 & wait $!; done"]
        volumeMounts:
        - {{name: markers, mountPath: /markers}}
      volumes:
      - name: markers
        hostPath: {{path: {markers}, type: Directory}}
"#,
        markers = markers.display()
    )
}

/// Waits until `<markers>` names exactly `expected`, each file saying `graceful`.
fn wait_markers(cluster: &Cluster, markers: &Path, expected: &BTreeSet<String>) {
    cluster.wait_for("the graceful-exit markers of the terminated pods", || {
        let seen = entries(markers);
        let complete = seen == *expected
            && seen.iter().all(|n| {
                std::fs::read_to_string(markers.join(n)).is_ok_and(|t| t.trim() == "graceful")
            });
        if complete {
            Ok(())
        } else {
            Err(format!("markers {seen:?}, expected {expected:?}"))
        }
    });
}

/// Item 3 on containerd, the rest: scaling the Deployment down terminates the pods it drops
/// gracefully (their containers get SIGTERM and act on it within the grace period), and
/// deleting the namespace terminates the last one as gracefully and removes it; then the agent
/// leaves no pod directory (volumes or logs) under its root dir, no mount under it and no sandbox or container
/// in containerd, and the API server refused none of its requests.
#[test]
fn cri_item_3_scale_down_terminates_gracefully_and_a_deleted_namespace_leaves_nothing_behind() {
    let Some(node) = CriNode::start("cri-graceful", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    let markers = cluster.scratch("markers");
    wait_ready(cluster, "node-a", "True");
    cluster.kubectl(&["create", "namespace", "graceful"]);
    cluster.apply(&graceful_deployment("graceful", "web", "node-a", &markers));
    wait_available(cluster, "graceful", "web", 3);
    let before = pod_names(cluster, "graceful");
    assert_eq!(before.len(), 3, "{before:?}");
    assert!(entries(&markers).is_empty(), "no pod was terminated yet");

    cluster.kubectl(&[
        "-n",
        "graceful",
        "scale",
        "deployment",
        "web",
        "--replicas=1",
    ]);
    let after = cluster.wait_for("two pods gone after the scale-down", || {
        let left = pod_names(cluster, "graceful");
        if left.len() == 1 {
            Ok(left)
        } else {
            Err(format!("{left:?}"))
        }
    });
    assert!(after.is_subset(&before), "{after:?} of {before:?}");
    let dropped: BTreeSet<String> = before.difference(&after).cloned().collect();
    wait_markers(cluster, &markers, &dropped);

    cluster.kubectl(&["delete", "namespace", "graceful", "--wait=false"]);
    cluster.wait_for("the namespace gone", || {
        match cluster.try_get(&["namespace", "graceful"]) {
            None => Ok(()),
            Some(ns) => Err(format!("{}", ns["status"])),
        }
    });
    wait_markers(cluster, &markers, &before);

    let root = root_dir(&node);
    cluster.wait_for(
        "no pod directory, mount, sandbox or container left",
        || {
            let dirs: BTreeSet<String> = ["pods", "pod-logs", "container-logs"]
                .iter()
                .flat_map(|d| entries(&root.join(d)).into_iter().map(move |e| format!("{d}/{e}")))
                .collect();
            // The root directory's own mount stays: the agent makes it a shared mount at start
            // (upstream's `setupDataDirs`), for as long as it runs.
            let mounts: Vec<String> = mounts_under(&root)
                .into_iter()
                .filter(|m| std::path::Path::new(m) != root.as_path())
                .collect();
            let (sandboxes, containers) = runtime_objects(&node);
            if dirs.is_empty() && mounts.is_empty() && sandboxes.is_empty() && containers.is_empty()
            {
                Ok(())
            } else {
                Err(format!(
                    "pod directories {dirs:?}, mounts {mounts:?}, sandboxes {sandboxes:?}, containers {containers:?}"
                ))
            }
        },
    );
    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}

/// Issue 27 (the conformance runs' audit log): a pod force-deleted (`--grace-period=0
/// --force`, as many upstream specs delete theirs) is gone from the API server before its
/// worker stops it and sets its last statuses; the agent then never reads it by name, which the
/// Node authorizer refuses with 403 `no relationship found between node ... and this object`
/// (upstream's status manager `syncPod` GETs it all the same). Its containers are stopped and
/// the API server refused none of the agent's requests.
#[test]
fn a_force_deleted_pod_is_stopped_without_reading_it_from_the_api() {
    let Some(node) = CriNode::start("cri-force-deleted", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    cluster.kubectl(&["create", "namespace", "forced"]);
    cluster.apply(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: doomed
  namespace: forced
spec:
  nodeName: node-a
  terminationGracePeriodSeconds: 30
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
"#,
    );
    cluster.wait_for("doomed Running", || {
        let pod = cluster.try_get(&["-n", "forced", "pod", "doomed"]);
        match pod {
            Some(p) if p["status"]["phase"] == "Running" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    cluster.kubectl(&[
        "-n",
        "forced",
        "delete",
        "pod",
        "doomed",
        "--grace-period=0",
        "--force",
    ]);
    cluster.wait_for("no container left running", || {
        let (_, containers) = runtime_objects(&node);
        let running: Vec<String> = containers
            .into_iter()
            .filter(|id| container_running(&node, id))
            .collect();
        if running.is_empty() {
            Ok(())
        } else {
            Err(format!("{running:?}"))
        }
    });
    // The statuses set while stopping it have had their sync.
    std::thread::sleep(Duration::from_secs(3));
    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}

/// Issue 27 (the conformance runs' audit log): pods deleted right after their creation, each
/// in a fresh namespace (as upstream's specs make theirs), gracefully or by force, while the
/// agent prepares them: the API server refused none of the agent's reads of a pod made after
/// its deletion (the Node authorizer refuses them once the pod left its graph). The reflector
/// of the pod's `kube-root-ca.crt` ConfigMap is upstream's too, and has upstream's race: a
/// watch that follows a list made before the deletion may come just after it (refused; seen
/// once in CI at 17 ms), until `UnregisterPod` after the unmount; those are not counted here.
/// Before the
/// deletion, only the moment after the binding may be refused (`no relationship found`: the
/// Node authorizer's graph follows the API server's watch a moment behind the agent's; the
/// first list of the ConfigMap meets it, as upstream's kubelet's reflector does, started by
/// `RegisterPod` in `SyncPod`), and the watch's retries of that list until the pod's volumes
/// are torn down (upstream: `UnregisterPod` in `SyncTerminatedPod`, after the unmount).
#[test]
fn pods_deleted_at_once_leave_no_refused_request() {
    let Some(node) = CriNode::start("cri-deleted-at-once", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    let names: Vec<String> = (0..8).map(|n| format!("brief-{n}")).collect();
    for (n, ns) in names.iter().enumerate() {
        cluster.kubectl(&["create", "namespace", ns]);
        cluster.wait_for("the namespace's default service account", || {
            cluster
                .try_get(&["-n", ns, "serviceaccount", "default"])
                .ok_or_else(|| "none yet".to_owned())
        });
        cluster.apply(&format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: brief
  namespace: {ns}
spec:
  nodeName: node-a
  terminationGracePeriodSeconds: 30
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
"#
        ));
        // Half of them as soon as the agent wrote their first status (it is preparing them),
        // the others at once.
        if n % 4 < 2 {
            cluster.wait_for("the agent's first status of the pod", || {
                match cluster.try_get(&["-n", ns, "pod", "brief"]) {
                    Some(p) if p["status"]["conditions"].is_array() => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            });
        }
        let mut delete = vec!["-n", ns.as_str(), "delete", "pod", "brief", "--wait=false"];
        if n % 2 == 0 {
            delete.extend(["--grace-period=0", "--force"]);
        }
        cluster.kubectl(&delete);
    }
    for ns in &names {
        cluster.wait_for("the pod gone", || {
            match cluster.try_get(&["-n", ns, "pod", "brief"]) {
                None => Ok(()),
                Some(p) => Err(format!("{}", p["status"])),
            }
        });
    }
    cluster.wait_for("no container or sandbox left", || {
        let (sandboxes, containers) = runtime_objects(&node);
        if sandboxes.is_empty() && containers.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "sandboxes {sandboxes:?}, containers {containers:?}"
            ))
        }
    });
    std::thread::sleep(Duration::from_secs(3));
    let events = cluster.audit_events();
    let at = |e: &Value| {
        e["requestReceivedTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let refused: Vec<String> = cluster
        .refused_requests_of("system:node:node-a")
        .into_iter()
        .filter(|r| !r.contains("no relationship found between node"))
        .collect();
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
    for ns in &names {
        let in_ns = |e: &&Value| {
            e["requestURI"]
                .as_str()
                .is_some_and(|u| u.starts_with(&format!("/api/v1/namespaces/{ns}/")))
        };
        let deleted = events
            .iter()
            .filter(in_ns)
            .filter(|e| e["user"]["username"] == "kubernetes-admin" && e["verb"] == "delete")
            .map(at)
            .min()
            .expect("the pod's deletion is audited");
        let refusals = || {
            events
                .iter()
                .filter(in_ns)
                .filter(|e| e["user"]["username"] == "system:node:node-a")
                .filter(|e| e["responseStatus"]["code"] == 403)
        };
        // A retry of a list refused before the deletion (the watch's back-off, until the pod's
        // volumes are torn down, as upstream's reflector until `UnregisterPod`) is that moment's.
        let refused_before: BTreeSet<&str> = refusals()
            .filter(|e| at(e) <= deleted)
            .filter_map(|e| e["requestURI"].as_str())
            .collect();
        let refused_after: Vec<String> = refusals()
            .filter(|e| at(e) > deleted)
            .filter(|e| e["objectRef"]["resource"] == "pods")
            .filter(|e| {
                !e["requestURI"]
                    .as_str()
                    .is_some_and(|u| refused_before.contains(u))
            })
            .map(|e| format!("{} {} {}", at(e), e["verb"], e["requestURI"]))
            .collect();
        assert!(
            refused_after.is_empty(),
            "refused after the pod's deletion at {deleted}: {refused_after:#?}"
        );
    }
}

/// Whether the container `id` runs (CRI `ContainerStatus`).
fn container_running(node: &CriNode, id: &str) -> bool {
    let endpoint = node.containerd.endpoint().to_owned();
    let id = id.to_owned();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let client = CriClient::connect(&endpoint, Duration::from_secs(30))
                .await
                .unwrap();
            client
                .container_status(&id)
                .await
                .is_ok_and(|s| s.state == k8s_cri::v1::ContainerState::ContainerRunning as i32)
        })
}

/// Three pods whose statuses differ in every part item 5 compares: an init container and two
/// exec readiness probes, one that passes and one that never does (Guaranteed; the pod is not
/// Ready, with upstream's reason), a container that exits 1 once and then runs (restart
/// policy Always, Burstable), and a container that exits 3 under restart policy Never
/// (BestEffort: the pod fails).
fn status_variety(namespace: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: initialised
  namespace: {namespace}
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: prepare
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "echo prepared > /work/prepared"]
    resources:
      limits: {{cpu: 50m, memory: 64Mi}}
    volumeMounts:
    - {{name: work, mountPath: /work}}
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    resources:
      limits: {{cpu: 50m, memory: 64Mi}}
    readinessProbe:
      exec:
        command: [cat, /work/prepared]
      periodSeconds: 1
    volumeMounts:
    - {{name: work, mountPath: /work}}
  - name: unready
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    resources:
      limits: {{cpu: 50m, memory: 64Mi}}
    readinessProbe:
      exec:
        command: ["false"]
      periodSeconds: 1
  volumes:
  - name: work
    emptyDir: {{}}
---
apiVersion: v1
kind: Pod
metadata:
  name: restarts-once
  namespace: {namespace}
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "[ -f /work/ran ] || {{ touch /work/ran; exit 1; }}; trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    resources:
      requests: {{cpu: 10m}}
    volumeMounts:
    - {{name: work, mountPath: /work}}
  volumes:
  - name: work
    emptyDir: {{}}
---
apiVersion: v1
kind: Pod
metadata:
  name: fails
  namespace: {namespace}
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  restartPolicy: Never
  containers:
  - name: main
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "exit 3"]
"#
    )
}

/// The parts of a container status item 5 compares.
fn compared_container(c: &Value) -> Value {
    json!({
        "name": c["name"],
        "image": c["image"],
        "imageID": c["imageID"],
        "containerID": c["containerID"],
        "ready": c["ready"],
        "started": c["started"],
        "restartCount": c["restartCount"],
        "state": c["state"],
        // The API server stores an absent last state as `{}` (a struct, not a pointer, in
        // its internal types).
        "lastState": if c["lastState"].is_null() { json!({}) } else { c["lastState"].clone() },
    })
}

/// The parts of a pod status item 5 compares; conditions by type (their order carries no
/// meaning) with type, status and reason.
fn compared_status(status: &Value) -> Value {
    let mut conditions: Vec<Value> = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| json!({"type": c["type"], "status": c["status"], "reason": c["reason"]}))
        .collect();
    conditions.sort_by_key(|c| c["type"].as_str().unwrap_or_default().to_owned());
    let containers = |key: &str| -> Vec<Value> {
        status[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(compared_container)
            .collect()
    };
    json!({
        "phase": status["phase"],
        "conditions": conditions,
        "initContainerStatuses": containers("initContainerStatuses"),
        "containerStatuses": containers("containerStatuses"),
        "podIP": status["podIP"],
        "podIPs": status["podIPs"],
        "hostIP": status["hostIP"],
        "hostIPs": status["hostIPs"],
        "qosClass": status["qosClass"],
        "startTime": status["startTime"],
    })
}

/// The API server's copy of pod `name` once `settled` holds for its status.
fn wait_api_status(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    what: &str,
    settled: impl Fn(&Value) -> bool,
) -> Value {
    cluster.wait_for(&format!("{name}: {what}"), || {
        let pod = cluster.get(&["-n", ns, "pod", name]);
        if settled(&pod["status"]) {
            Ok(pod)
        } else {
            Err(format!("{}", pod["status"]))
        }
    })
}

/// The status of container `name` in the list `key` (`containerStatuses`,
/// `initContainerStatuses`) of a pod status.
fn container<'a>(status: &'a Value, key: &str, name: &str) -> &'a Value {
    status[key]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

/// The status patches of `user`'s requests in the audit log, each `(code, requestURI)`.
fn status_patches(cluster: &Cluster, user: &str) -> Vec<(u64, String)> {
    cluster
        .audit_events()
        .into_iter()
        .filter(|e| {
            e["user"]["username"] == user
                && e["verb"] == "patch"
                && e["objectRef"]["resource"] == "pods"
                && e["objectRef"]["subresource"] == "status"
                && e["stage"] == "ResponseComplete"
        })
        .map(|e| {
            (
                e["responseStatus"]["code"].as_u64().unwrap_or_default(),
                e["requestURI"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Item 5 on containerd: for a pod with an init container and an exec readiness probe, one
/// whose container restarted once and a failed one, the status `kubectl get pod -o json`
/// shows is the agent's (`/pods`): phase, conditions, container statuses (state, last state,
/// restart count, readiness, image and container IDs), pod and host IPs, QoS class and start
/// time; and the API server accepted every status patch of the agent.
#[test]
fn cri_item_5_every_status_patch_is_accepted_and_the_api_servers_status_is_the_agents() {
    let Some(node) = CriNode::start("cri-status", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    cluster.kubectl(&["create", "namespace", "status"]);
    cluster.apply(&status_variety("status", "node-a"));

    wait_api_status(cluster, "status", "initialised", "main ready", |s| {
        container(s, "containerStatuses", "main")["ready"] == true
            && container(s, "containerStatuses", "unready")["started"] == true
            && container(s, "initContainerStatuses", "prepare")["state"]["terminated"]["exitCode"]
                == 0
    });
    wait_api_status(
        cluster,
        "status",
        "restarts-once",
        "ready after one restart",
        |s| {
            let c = container(s, "containerStatuses", "main");
            c["restartCount"] == 1 && c["ready"] == true
        },
    );
    wait_api_status(cluster, "status", "fails", "Failed", |s| {
        s["phase"] == "Failed"
    });

    for name in ["initialised", "restarts-once", "fails"] {
        cluster.wait_for(&format!("{name}: the API's status is the agent's"), || {
            let api = compared_status(&cluster.get(&["-n", "status", "pod", name])["status"]);
            let agent = node
                .agent
                .pod(name)
                .map(|p| compared_status(&p["status"]))
                .ok_or_else(|| "not in /pods".to_owned())?;
            if api == agent {
                Ok(())
            } else {
                Err(format!("API server:\n{api:#}\nagent:\n{agent:#}",))
            }
        });
    }
    let initialised = cluster.get(&["-n", "status", "pod", "initialised"]);
    let ready = initialised["status"]["conditions"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("False"), &json!("ContainersNotReady")),
        "{}",
        initialised["status"]
    );
    let api = cluster.get(&["-n", "status", "pod", "restarts-once"]);
    let last = &container(&api["status"], "containerStatuses", "main")["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 1, "{}", api["status"]);
    let failed = cluster.get(&["-n", "status", "pod", "fails"]);
    let state = &container(&failed["status"], "containerStatuses", "main")["state"]["terminated"];
    assert_eq!(state["exitCode"], 3, "{}", failed["status"]);

    let patches = status_patches(cluster, "system:node:node-a");
    assert!(
        !patches.is_empty(),
        "the audit log has the agent's status patches"
    );
    let refused: Vec<_> = patches.iter().filter(|(code, _)| *code != 200).collect();
    assert!(
        refused.is_empty(),
        "status patches not accepted: {refused:#?}"
    );
    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}

/// One status write of [`status_writes`]: a strategic merge patch of a pod's status and
/// whether the real API server takes it (upstream `ValidatePodStatusUpdate`).
struct StatusWrite {
    status: Value,
    accepted: bool,
}

/// A pod (its spec) and the status writes sent to it in order.
struct StatusCase {
    name: &'static str,
    spec: Value,
    writes: Vec<StatusWrite>,
}

fn running_state() -> Value {
    json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}})
}

fn terminated_state(exit_code: i32) -> Value {
    json!({"terminated": {
        "exitCode": exit_code,
        "startedAt": "2026-01-01T00:00:00Z",
        "finishedAt": "2026-01-01T00:00:01Z",
    }})
}

fn container_status(name: &str, state: Value) -> Value {
    json!({
        "name": name,
        "image": "localhost/busybox:1",
        "imageID": "",
        "ready": false,
        "restartCount": 0,
        "state": state,
    })
}

fn spec(restart_policy: &str, init: bool) -> Value {
    let container = json!({"name": "main", "image": "localhost/busybox:1"});
    let mut spec = json!({
        // No node runs it: only the API servers see these pods.
        "nodeName": "ghost",
        "restartPolicy": restart_policy,
        "containers": [container],
    });
    if init {
        spec["initContainers"] = json!([{"name": "init", "image": "localhost/busybox:1"}]);
    }
    spec
}

/// The pod status writes item 7 compares between the real API server and the in-tree test
/// server: what the real one refuses (a container of a pod that does not restart it going
/// back from terminated; a host IP that is not the first of the host IPs; an invalid or a
/// second IPv4 pod IP; a changed QoS class; a condition type that is not a qualified name; a
/// negative observed generation) beside writes it takes.
fn status_writes() -> Vec<StatusCase> {
    let ok = |status: Value| StatusWrite {
        status,
        accepted: true,
    };
    let refused = |status: Value| StatusWrite {
        status,
        accepted: false,
    };
    let main = |state: Value| json!({"containerStatuses": [container_status("main", state)]});
    vec![
        StatusCase {
            name: "never",
            spec: spec("Never", false),
            writes: vec![
                ok(main(terminated_state(3))),
                refused(main(running_state())),
            ],
        },
        StatusCase {
            name: "on-failure-completed",
            spec: spec("OnFailure", false),
            writes: vec![
                ok(main(terminated_state(0))),
                refused(main(running_state())),
            ],
        },
        StatusCase {
            name: "on-failure-failed",
            spec: spec("OnFailure", false),
            writes: vec![ok(main(terminated_state(1))), ok(main(running_state()))],
        },
        StatusCase {
            name: "always",
            spec: spec("Always", false),
            writes: vec![ok(main(terminated_state(0))), ok(main(running_state()))],
        },
        StatusCase {
            name: "never-init",
            spec: spec("Never", true),
            writes: vec![
                ok(
                    json!({"initContainerStatuses": [container_status("init", terminated_state(0))]}),
                ),
                refused(
                    json!({"initContainerStatuses": [container_status("init", running_state())]}),
                ),
            ],
        },
        StatusCase {
            name: "host-ips",
            spec: spec("Always", false),
            writes: vec![
                refused(json!({"hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.2"}]})),
                refused(json!({"hostIP": "10.0.0.256", "hostIPs": [{"ip": "10.0.0.256"}]})),
                ok(json!({"hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}]})),
            ],
        },
        StatusCase {
            name: "pod-ips",
            spec: spec("Always", false),
            writes: vec![
                refused(json!({"podIP": "10.0.0.256", "podIPs": [{"ip": "10.0.0.256"}]})),
                refused(
                    json!({"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}]}),
                ),
                ok(json!({"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]})),
            ],
        },
        StatusCase {
            name: "qos-class",
            spec: spec("Always", false),
            writes: vec![refused(json!({"qosClass": "Guaranteed"}))],
        },
        StatusCase {
            name: "condition-type",
            spec: spec("Always", false),
            writes: vec![
                refused(json!({"conditions": [{"type": "not qualified!", "status": "True"}]})),
                ok(json!({"conditions": [{"type": "example.com/gate", "status": "True"}]})),
            ],
        },
        StatusCase {
            name: "observed-generation",
            spec: spec("Always", false),
            writes: vec![refused(json!({"observedGeneration": -1}))],
        },
    ]
}

/// Clients of the real API server (as the admin) and of an in-tree test API server.
struct BothServers {
    rt: tokio::runtime::Runtime,
    real: kube::Client,
    in_tree: kube::Client,
    /// Serves `in_tree` until dropped.
    #[allow(dead_code)]
    server: rustlet_api::test_server::TestApiServer,
}

impl BothServers {
    fn start(cluster: &Cluster) -> Self {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let real = rt.block_on(async {
            let kubeconfig =
                kube::config::Kubeconfig::read_from(cluster.inner.admin_kubeconfig()).unwrap();
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .unwrap();
            kube::Client::try_from(config).unwrap()
        });
        let store = std::sync::Arc::new(rustlet_api::local::store::Store::default());
        let server = rt
            .block_on(rustlet_api::test_server::TestApiServer::start(store))
            .unwrap();
        let in_tree = rt.block_on(server.client()).unwrap();
        Self {
            rt,
            real,
            in_tree,
            server,
        }
    }
}

/// What a server answered to each write of a case: `Ok(())` or the error's code and message.
async fn send_status_writes(
    client: kube::Client,
    case: &StatusCase,
) -> Vec<Result<(), (u16, String)>> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": case.name, "namespace": "default"},
        "spec": case.spec,
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating {}: {e}", case.name));
    let mut answers = Vec::new();
    for write in &case.writes {
        let patch = Patch::Strategic(json!({"status": write.status}));
        let answer = pods
            .patch_status(case.name, &PatchParams::default(), &patch)
            .await;
        answers.push(match answer {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) => Err((status.code, status.message)),
            Err(e) => panic!("{}: {e}", case.name),
        });
    }
    answers
}

/// Item 7 (with item 5's validation): the in-tree test API server refuses the pod status
/// writes the real API server refuses (422, upstream `ValidatePodStatusUpdate`), and takes
/// the ones it takes: the same writes go to both.
#[test]
fn item_7_the_test_server_refuses_the_pod_status_writes_the_real_api_server_refuses() {
    let Some(cluster) = crate::support::cluster("status-writes", &[], |_| {}) else {
        return;
    };
    let both = BothServers::start(&cluster);
    let mut disagreements = Vec::new();
    for case in status_writes() {
        let from_real = both
            .rt
            .block_on(send_status_writes(both.real.clone(), &case));
        let from_in_tree = both
            .rt
            .block_on(send_status_writes(both.in_tree.clone(), &case));
        for (i, write) in case.writes.iter().enumerate() {
            let (r, t) = (&from_real[i], &from_in_tree[i]);
            let code = |a: &Result<(), (u16, String)>| a.as_ref().err().map(|(c, _)| *c);
            let expected = if write.accepted { None } else { Some(422) };
            if code(r) != expected || code(t) != expected {
                disagreements.push(format!(
                    "{} write {i} {}: expected {expected:?}; real: {r:?}; test server: {t:?}",
                    case.name, write.status
                ));
            }
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}

/// Containers' resources of the pods [`item_7_a_created_pods_qos_class_and_requests_are_the_real_api_servers`]
/// creates: none, requests only, limits only (requests default to them), and limits in one
/// spelling with requests in another.
fn resource_variety() -> Vec<(&'static str, Value)> {
    vec![
        ("best-effort", json!({})),
        ("requests-only", json!({"requests": {"cpu": "10m"}})),
        (
            "limits-only",
            json!({"limits": {"cpu": "100m", "memory": "64Mi"}}),
        ),
        (
            "spelled-apart",
            // Not `0.1` for `100m`: the real server stores quantities in canonical form, the
            // in-tree one as they came (left alone: the agent compares them by value).
            json!({"requests": {"cpu": "100m", "memory": "67108864"},
                "limits": {"cpu": "100m", "memory": "64Mi"}}),
        ),
    ]
}

/// Item 7: a pod the in-tree test API server creates gets the QoS class and the defaulted
/// requests the real API server gives it (upstream `ComputePodQOS` in `PrepareForCreate`,
/// `SetDefaults_Pod`): the agent reports the class it finds.
#[test]
fn item_7_a_created_pods_qos_class_and_requests_are_the_real_api_servers() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};
    let Some(cluster) = crate::support::cluster("qos-class", &[], |_| {}) else {
        return;
    };
    let both = BothServers::start(&cluster);
    let create = |client: &kube::Client, name: &str, resources: &Value| -> Value {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "ghost", "containers": [
                {"name": "main", "image": "localhost/busybox:1", "resources": resources},
            ]},
        }))
        .unwrap();
        let created = both
            .rt
            .block_on(pods.create(&PostParams::default(), &pod))
            .unwrap_or_else(|e| panic!("creating {name}: {e}"));
        let created = serde_json::to_value(created).unwrap();
        json!({
            "qosClass": created["status"]["qosClass"],
            "resources": created["spec"]["containers"][0]["resources"],
        })
    };
    let mut disagreements = Vec::new();
    for (name, resources) in resource_variety() {
        let real = create(&both.real, name, &resources);
        let in_tree = create(&both.in_tree, name, &resources);
        if real != in_tree {
            disagreements.push(format!("{name}: real {real}, test server {in_tree}"));
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}
