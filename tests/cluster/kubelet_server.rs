//! Issue 26: the node's kubelet server through the real control plane. The cluster runs
//! inside the private containerd's network namespace, so that the API server reaches the
//! agent's port 10250 at the node IP (10.88.0.1, the pods' gateway) and verifies its serving
//! certificate (the node certificate, which names that IP) with the cluster CA; `kubectl
//! logs` and `kubectl exec` go API server → agent → containerd's stream server.

use std::path::Path;
use std::process::Command;

use rustlet_cri::testing::{BUSYBOX_IMAGE, PrivateContainerd};
use serde_json::Value;

use crate::harness::{Agent, start_in};
use crate::node::wait_ready;
use crate::support::{Cluster, POD_NETWORK_GATEWAY, TEST_EVICTION_HARD, cluster};

/// The control plane and the agent (kubelet server on, the node certificate serving it), all
/// in the private containerd's network namespace.
pub(crate) struct ServedNode {
    // Dropped first: the agent, then the cluster, then containerd and its namespace.
    #[allow(dead_code)] // read by the kubelet_server bench (its pid)
    pub(crate) agent: Agent,
    pub(crate) cluster: Cluster,
    pub(crate) containerd: PrivateContainerd,
}

impl ServedNode {
    pub(crate) fn start(test: &str, node: &str) -> Option<Self> {
        Self::start_with(test, node, "", |_| {})
    }

    /// [`Self::start`] with more lines in the agent's config file.
    pub(crate) fn start_with_config(test: &str, node: &str, extra_config: &str) -> Option<Self> {
        Self::start_with(test, node, extra_config, |_| {})
    }

    /// [`Self::start`] with `extra_config` in the agent's config file and the cluster's options
    /// also changed by `tune`.
    pub(crate) fn start_with(
        test: &str,
        node: &str,
        extra_config: &str,
        tune: impl FnOnce(&mut xtask::cluster::Options),
    ) -> Option<Self> {
        let containerd = PrivateContainerd::start_blocking(test)?;
        let cluster = cluster(test, &[node], |o| {
            o.netns = Some(containerd.netns());
            o.extra_node_ips.push(POD_NETWORK_GATEWAY);
            tune(o);
        })?;
        let kubeconfig = cluster.inner.node_kubeconfig(node);
        let root = containerd.dir().join("root");
        let gateway = std::net::Ipv4Addr::from(POD_NETWORK_GATEWAY);
        let config = containerd.dir().join("config.yaml");
        std::fs::write(
            &config,
            format!("nodeIP: {gateway}\n{TEST_EVICTION_HARD}{extra_config}"),
        )
        .unwrap();
        let pki = |f: &str| cluster.inner.pki(f).display().to_string();
        let (cert, key, ca) = (
            pki(&format!("node-{node}.crt")),
            pki(&format!("node-{node}.key")),
            pki("ca.crt"),
        );
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
                "--enable-server",
                "--tls-cert-file",
                &cert,
                "--tls-private-key-file",
                &key,
                "--client-ca-file",
                &ca,
            ],
            &containerd.dir().join("agent.log"),
        );
        Some(Self {
            agent,
            cluster,
            containerd,
        })
    }

    /// `curl` inside the namespace to the agent's port: the status code and the body.
    fn curl(&self, path: &str, client: Option<(&Path, &Path)>) -> (u16, String) {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.containerd.netns().display()))
            .args(["--", "curl", "-sS", "--cacert"])
            .arg(self.cluster.inner.pki("ca.crt"))
            .args(["-w", "\n%{http_code}"]);
        if let Some((cert, key)) = client {
            cmd.arg("--cert").arg(cert).arg("--key").arg(key);
        }
        let out = cmd
            .arg(format!("https://10.88.0.1:10250{path}"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let code = code.trim().parse().unwrap_or(0);
        assert!(
            code != 0,
            "curl {path}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (code, body.to_owned())
    }
}

/// A client certificate of `user` signed by the cluster CA (openssl), in `dir`.
fn user_certificate(
    cluster: &Cluster,
    dir: &Path,
    user: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    // A v3 certificate: rustls (webpki) refuses v1 ones, which `openssl x509 -req` makes
    // without extensions.
    let ext = dir.join("client.ext");
    std::fs::write(
        &ext,
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    let (key, csr, cert) = (
        dir.join("user.key"),
        dir.join("user.csr"),
        dir.join("user.crt"),
    );
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        key.to_str().unwrap(),
        "-out",
        csr.to_str().unwrap(),
        "-subj",
        &format!("/CN={user}/O=testers"),
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        csr.to_str().unwrap(),
        "-CA",
        cluster.inner.pki("ca.crt").to_str().unwrap(),
        "-CAkey",
        cluster.inner.pki("ca.key").to_str().unwrap(),
        "-extfile",
        ext.to_str().unwrap(),
        "-CAcreateserial",
        "-days",
        "1",
        "-out",
        cert.to_str().unwrap(),
    ]);
    (cert, key)
}

const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: talk
  namespace: default
spec:
  nodeName: node-a
  terminationGracePeriodSeconds: 1
  containers:
  - name: talk
    image: IMAGE
    command: [sh, -c, 'echo one; echo two; echo three; sleep 3']
  - name: shell
    image: IMAGE
    command: [sleep, '3600']
";

fn talk_status(pod: &Value) -> Option<&Value> {
    pod["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == "talk")
}

/// `kubectl logs` (plain, `--tail`, `--timestamps`, `--limit-bytes`, `-f` ending with the
/// container, `-p` after a restart), `kubectl exec` (output and exit code) and the node proxy's
/// `/pods` and `/runningpods/` through the real
/// API server and the agent's port; the agent's port refuses a request without credentials
/// (401) and one of a user RBAC does not let at `nodes/proxy` (403), with upstream's wording.
#[test]
fn kubectl_logs_and_exec_reach_the_container_through_the_kubelet_server() {
    let Some(node) = ServedNode::start("kubelet-server", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    cluster.apply(&POD.replace("IMAGE", BUSYBOX_IMAGE));
    cluster.wait_for("the shell container runs", || {
        let pod = cluster.get(&["pod", "talk"]);
        let running = pod["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["name"] == "shell" && c["state"]["running"].is_object())
            });
        running
            .then_some(())
            .ok_or_else(|| pod["status"].to_string())
    });

    // A whole log once the instance printed it (the first instance or a later one).
    let logs = |args: &[&str]| {
        let mut all = vec!["logs", "talk", "-c", "talk"];
        all.extend_from_slice(args);
        cluster.kubectl_output(&all, None)
    };
    cluster.wait_for("the talk container's log", || {
        let out = logs(&[]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (text == "one\ntwo\nthree\n")
            .then_some(())
            .ok_or_else(|| format!("{text:?} {}", String::from_utf8_lossy(&out.stderr)))
    });
    let text = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(text(logs(&["--tail=2"])), "two\nthree\n");
    assert_eq!(text(logs(&["--limit-bytes=5"])), "one\nt");
    let stamped = text(logs(&["--timestamps"]));
    let lines: Vec<&str> = stamped.lines().collect();
    assert_eq!(lines.len(), 3, "{stamped}");
    for (line, want) in lines.iter().zip(["one", "two", "three"]) {
        let (stamp, rest) = line.split_once(' ').unwrap();
        assert_eq!(rest, want, "{stamped}");
        assert!(
            stamp.len() == "2006-01-02T15:04:05.000000000Z".len() && stamp.ends_with('Z'),
            "{stamped}"
        );
    }
    // `-f` ends by itself when the instance stops (it sleeps 3 s after its lines).
    let followed = text(logs(&["-f"]));
    assert!(followed.starts_with("one\ntwo\nthree\n"), "{followed:?}");

    // The previous instance's log after a restart.
    cluster.wait_for("talk restarted", || {
        let pod = cluster.get(&["pod", "talk"]);
        let restarts = talk_status(&pod)
            .and_then(|c| c["restartCount"].as_u64())
            .unwrap_or(0);
        (restarts >= 1)
            .then_some(())
            .ok_or_else(|| pod["status"].to_string())
    });
    assert_eq!(text(logs(&["-p"])), "one\ntwo\nthree\n");

    // exec: output and exit code.
    let out = cluster.kubectl_output(
        &[
            "exec",
            "talk",
            "-c",
            "shell",
            "--",
            "sh",
            "-c",
            "echo hi; exit 3",
        ],
        None,
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hi\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Through the API server's node proxy: the API server's kubelet client certificate is let in.
    let pods: Value = serde_json::from_str(&cluster.kubectl(&[
        "get",
        "--raw",
        "/api/v1/nodes/node-a/proxy/pods",
    ]))
    .unwrap();
    assert_eq!(pods["kind"], "PodList");
    let running: Value = serde_json::from_str(&cluster.kubectl(&[
        "get",
        "--raw",
        "/api/v1/nodes/node-a/proxy/runningpods/",
    ]))
    .unwrap();
    let talk = running["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["metadata"]["name"] == "talk")
        .unwrap_or_else(|| panic!("{running}"));
    assert!(
        talk["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "shell" && c["image"].as_str().is_some_and(|i| !i.is_empty())),
        "{talk}"
    );

    // The agent's port directly: no credentials, then a user RBAC does not let in.
    assert_eq!(node.curl("/pods", None), (401, "Unauthorized".to_owned()));
    let (cert, key) = user_certificate(cluster, &cluster.scratch("user"), "someone");
    assert_eq!(
        node.curl("/containerLogs/default/talk/talk", Some((&cert, &key))),
        (
            403,
            "Forbidden (user=someone, verb=get, resource=nodes, subresource(s)=[proxy])\n"
                .to_owned()
        )
    );

    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}

const TARGET: &str = "apiVersion: v1
kind: Pod
metadata:
  name: ephemeral-containers-target-pod
  namespace: default
spec:
  nodeName: node-a
  terminationGracePeriodSeconds: 1
  containers:
  - name: test-container-1
    image: IMAGE
    command: [/bin/sleep]
    args: ['10000']
";

/// upstream "[sig-node] Ephemeral Containers [NodeConformance] will start an ephemeral
/// container in an existing pod" and "should update the ephemeral containers in an existing
/// pod" through the real API server: `kubectl debug` adds an ephemeral container through the
/// `ephemeralcontainers` subresource (the pod's generation goes to 2); the agent starts it and
/// reports it running in `ephemeralContainerStatuses`; `kubectl exec -c debugger` and
/// `kubectl logs -c debugger` reach it through the kubelet server; a second one starts too.
#[test]
fn kubectl_debug_starts_an_ephemeral_container_that_exec_and_logs_reach() {
    let Some(node) = ServedNode::start("ephemeral-containers", "node-a") else {
        return;
    };
    let cluster = &node.cluster;
    wait_ready(cluster, "node-a", "True");
    let pod = "ephemeral-containers-target-pod";
    cluster.apply(&TARGET.replace("IMAGE", BUSYBOX_IMAGE));
    let ephemeral_running = |name: &str| {
        let got = cluster.get(&["pod", pod]);
        let running = got["status"]["ephemeralContainerStatuses"]
            .as_array()
            .is_some_and(|l| {
                l.iter()
                    .any(|c| c["name"] == name && c["state"]["running"].is_object())
            });
        running
            .then_some(got.clone())
            .ok_or_else(|| got["status"].to_string())
    };
    cluster.wait_for("the target pod runs", || {
        let got = cluster.get(&["pod", pod]);
        (got["status"]["phase"] == "Running")
            .then_some(())
            .ok_or_else(|| got["status"].to_string())
    });
    assert_eq!(cluster.get(&["pod", pod])["metadata"]["generation"], 1);

    let out = cluster.kubectl_output(
        &[
            "debug",
            pod,
            &format!("--image={BUSYBOX_IMAGE}"),
            "--container=debugger",
            "--profile=legacy",
            "--",
            "/bin/sh",
            "-c",
            "while true; do echo polo; sleep 2; done",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = cluster.wait_for("the debugger runs", || ephemeral_running("debugger"));
    assert_eq!(got["metadata"]["generation"], 2);
    let status = got["status"]["ephemeralContainerStatuses"][0].clone();
    assert_eq!(status["ready"], false, "{status}");
    assert_eq!(
        got["status"]["containerStatuses"][0]["restartCount"], 0,
        "{got}"
    );

    let exec = cluster.kubectl_output(
        &["exec", pod, "-c", "debugger", "--", "/bin/echo", "marco"],
        None,
    );
    assert!(
        String::from_utf8_lossy(&exec.stdout).contains("marco"),
        "{}",
        String::from_utf8_lossy(&exec.stderr)
    );
    cluster.wait_for("the debugger's log", || {
        let out = cluster.kubectl_output(&["logs", pod, "-c", "debugger"], None);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("polo")
            .then_some(())
            .ok_or_else(|| format!("{text:?} {}", String::from_utf8_lossy(&out.stderr)))
    });

    // A second one, as the second spec adds it (by an update of the subresource there).
    let out = cluster.kubectl_output(
        &[
            "debug",
            pod,
            &format!("--image={BUSYBOX_IMAGE}"),
            "--container=debugger2",
            "--profile=legacy",
            "--",
            "/bin/sleep",
            "10000",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = cluster.wait_for("the second debugger runs", || {
        ephemeral_running("debugger2")
    });
    assert_eq!(
        got["spec"]["ephemeralContainers"].as_array().map(Vec::len),
        Some(2)
    );
    let refused = cluster.refused_requests_of_node("node-a");
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}
