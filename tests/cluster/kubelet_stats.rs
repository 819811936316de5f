//! Issue 26 item 5: `kubectl top node` and `kubectl top pod` through metrics-server (built
//! from its Go module by `cargo xtask metrics-server build`) against the real control plane.
//! metrics-server runs as upstream's manifests deploy it, but as a process in the private
//! containerd's network namespace (there is no pod network to the API server's aggregator):
//! its ServiceAccount with upstream's RBAC (`system:auth-delegator`, the
//! `extension-apiserver-authentication-reader` Role, `nodes/metrics`), its `APIService`
//! `v1beta1.metrics.k8s.io` behind a Service whose endpoints are the process's address, and
//! the API server's aggregation layer on (`Options::aggregation`). It scrapes the agent's
//! `/metrics/resource` over TLS verified with the cluster CA (the agent serves the node
//! certificate), at the node's InternalIP. `/stats/summary` is read through the API server's
//! node proxy too.

use std::process::{Child, Command, Stdio};

use rustlet_cri::testing::BUSYBOX_IMAGE;

use crate::kubelet_server::ServedNode;
use crate::node::wait_ready;

/// Where metrics-server listens in the namespace (the node IP: the API server reaches it).
const METRICS_SERVER_PORT: u16 = 4443;

/// upstream's `manifests/base/rbac.yaml`, `service.yaml` (without a selector: the endpoints
/// are the process's) and `apiservice.yaml` of v0.8.0.
const MANIFESTS: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:aggregated-metrics-reader
  labels:
    rbac.authorization.k8s.io/aggregate-to-view: "true"
    rbac.authorization.k8s.io/aggregate-to-edit: "true"
    rbac.authorization.k8s.io/aggregate-to-admin: "true"
rules:
- apiGroups: ["metrics.k8s.io"]
  resources: ["pods", "nodes"]
  verbs: ["get", "list", "watch"]
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: metrics-server
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: metrics-server-auth-reader
  namespace: kube-system
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: extension-apiserver-authentication-reader
subjects:
- kind: ServiceAccount
  name: metrics-server
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: metrics-server:system:auth-delegator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
- kind: ServiceAccount
  name: metrics-server
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:metrics-server
rules:
- apiGroups: [""]
  resources: ["nodes/metrics"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["pods", "nodes"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:metrics-server
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:metrics-server
subjects:
- kind: ServiceAccount
  name: metrics-server
  namespace: kube-system
---
apiVersion: v1
kind: Service
metadata:
  name: metrics-server
  namespace: kube-system
spec:
  ports:
  - name: https
    port: 443
    protocol: TCP
    targetPort: PORT
---
apiVersion: v1
kind: Endpoints
metadata:
  name: metrics-server
  namespace: kube-system
subsets:
- addresses:
  - ip: 10.88.0.1
  ports:
  - name: https
    port: PORT
    protocol: TCP
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: metrics-server-process
  namespace: kube-system
  labels:
    kubernetes.io/service-name: metrics-server
    endpointslice.kubernetes.io/managed-by: rustlet-test
addressType: IPv4
endpoints:
- addresses: ["10.88.0.1"]
  conditions: {ready: true}
ports:
- name: https
  port: PORT
  protocol: TCP
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1beta1.metrics.k8s.io
spec:
  service:
    name: metrics-server
    namespace: kube-system
  group: metrics.k8s.io
  version: v1beta1
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
"#;

const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: busy
  namespace: default
spec:
  containers:
  - name: work
    image: IMAGE
    command: [/bin/sh, -c, 'while true; do i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done; sleep 1; done']
";

/// The metrics-server process, stopped on drop.
struct MetricsServer(Child);

impl Drop for MetricsServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A row of `kubectl top` for `name`: its CPU (millicores) and memory (MiB) columns.
fn top_row(out: &str, name: &str) -> Option<(u64, u64)> {
    let row = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))?;
    let cols: Vec<&str> = row.split_whitespace().collect();
    let cpu = cols.get(1)?.strip_suffix('m')?.parse().ok()?;
    let memory_col = if cols.len() >= 5 {
        cols.get(3)?
    } else {
        cols.get(2)?
    };
    let memory = memory_col.strip_suffix("Mi")?.parse().ok()?;
    Some((cpu, memory))
}

#[test]
fn kubectl_top_node_and_pod_through_metrics_server() {
    let root = xtask::workspace_root();
    let Some(metrics_server) =
        xtask::metrics_server::cached_binary(&root).expect("reading tools/metrics-server/go.mod")
    else {
        if std::env::var("RUSTLET_REQUIRE_CLUSTER").as_deref() == Ok("1") {
            panic!("metrics-server is not built and RUSTLET_REQUIRE_CLUSTER=1");
        }
        eprintln!("skipped: metrics-server is not built (cargo xtask metrics-server build)");
        return;
    };
    let Some(node) = ServedNode::start_with("kubelet-stats", "node-a", "", |o| {
        o.aggregation = xtask::cluster::Aggregation::FrontProxy;
    }) else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    cluster.apply(&POD.replace("IMAGE", BUSYBOX_IMAGE));
    cluster.apply(&MANIFESTS.replace("PORT", &METRICS_SERVER_PORT.to_string()));

    // metrics-server's identity: its ServiceAccount's token, as in its pod.
    let token = cluster.kubectl(&[
        "create",
        "token",
        "metrics-server",
        "-n",
        "kube-system",
        "--duration=1h",
    ]);
    let dir = cluster.scratch("metrics-server");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
            cluster.inner.apiserver_port(),
            cluster.inner.pki("ca.crt").display(),
            token.trim()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("metrics-server.log")).unwrap();
    let kc = kubeconfig.display().to_string();
    let mut server = MetricsServer(
        Command::new("nsenter")
            .arg(format!("--net={}", node.containerd.netns().display()))
            .arg("--")
            .arg(&metrics_server)
            .arg(format!("--kubeconfig={kc}"))
            .arg(format!("--authentication-kubeconfig={kc}"))
            .arg(format!("--authorization-kubeconfig={kc}"))
            .arg(format!("--cert-dir={}", dir.join("certs").display()))
            .arg("--bind-address=10.88.0.1")
            .arg(format!("--secure-port={METRICS_SERVER_PORT}"))
            .arg("--kubelet-preferred-address-types=InternalIP")
            .arg(format!(
                "--kubelet-certificate-authority={}",
                cluster.inner.pki("ca.crt").display()
            ))
            // upstream's manifest (it must exceed the 10 s kubelet request timeout).
            .arg("--metric-resolution=15s")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting metrics-server"),
    );
    let ms_log = || std::fs::read_to_string(dir.join("metrics-server.log")).unwrap_or_default();

    cluster.wait_for("the busy pod runs", || {
        let pod = cluster.get(&["pod", "busy"]);
        (pod["status"]["phase"] == "Running")
            .then_some(())
            .ok_or_else(|| pod["status"].to_string())
    });
    let (_, memory) = cluster.wait_for("kubectl top node shows node-a", || {
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!("metrics-server exited ({status}): {}", ms_log());
        }
        let out = cluster.kubectl_output(&["top", "node", "node-a"], None);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        top_row(&text, "node-a").ok_or_else(|| {
            format!(
                "{text}{}\nmetrics-server: {}",
                String::from_utf8_lossy(&out.stderr),
                ms_log()
            )
        })
    });
    assert!(memory > 0, "the node's working set: {memory}Mi");
    // The pod's row once metrics-server has two scrapes of its container (figures of a shell
    // loop: a few millicores, under a MiB).
    cluster.wait_for("kubectl top pod shows busy", || {
        let out = cluster.kubectl_output(&["top", "pod", "busy"], None);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        top_row(&text, "busy").ok_or_else(|| {
            format!(
                "{text}{}\nmetrics-server: {}",
                String::from_utf8_lossy(&out.stderr),
                ms_log()
            )
        })
    });
    // The container's figures behind the pod's.
    let out = cluster.kubectl(&["top", "pod", "busy", "--containers"]);
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().nth(1) == Some("work")),
        "{out}"
    );

    // `/stats/summary` through the API server's node proxy (`nodes/stats`): the node and the
    // pod's container with its CPU, memory, writable layer and log directory from CRI.
    let summary = || -> serde_json::Value {
        serde_json::from_str(&cluster.kubectl(&[
            "get",
            "--raw",
            "/api/v1/nodes/node-a/proxy/stats/summary",
        ]))
        .unwrap()
    };
    let _first = summary();
    let summary = summary();
    assert_eq!(summary["node"]["nodeName"], "node-a");
    assert!(
        summary["node"]["cpu"]["usageNanoCores"].is_u64(),
        "a rate of two readings: {}",
        summary["node"]
    );
    let busy = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["name"] == "busy")
        .unwrap_or_else(|| panic!("{summary}"));
    let work = &busy["containers"][0];
    assert_eq!(work["name"], "work", "{busy}");
    assert!(
        work["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0) > 0,
        "{work}"
    );
    assert!(
        work["memory"]["workingSetBytes"].as_u64().unwrap_or(0) > 0,
        "{work}"
    );
    assert!(work["rootfs"]["capacityBytes"].is_u64(), "{work}");
    assert!(
        work["logs"]["inodesUsed"].as_u64().unwrap_or(0) >= 2,
        "the log directory and its file: {work}"
    );
    assert!(busy["ephemeral-storage"]["usedBytes"].is_u64(), "{busy}");
    assert_eq!(
        cluster.refused_requests_of("system:node:node-a"),
        Vec::<String>::new()
    );
}
