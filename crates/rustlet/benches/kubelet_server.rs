//! The kubelet server's figures (issue 26): `kubectl` through upstream's control plane (xtask's
//! `TestCluster`, run inside a private containerd's network namespace) to the agent's :10250
//! and on to containerd, as `tests/cluster/kubelet_server.rs` runs them. Run as root in a
//! private mount namespace (without root it says so and measures nothing):
//!
//! ```sh
//! unshare -m --propagation private env RUSTLET_PRIVATE_MOUNT_NS=1 \
//!     cargo bench -p rustlet --bench kubelet_server [-- runs=3 execs=20 follow=30 window=30]
//! ```
//!
//! 1. `kubectl logs` of a 100 MB log (one container writes 100,000,000 bytes of 100-character
//!    lines): time to the first byte and to the last, beside the same file read raw from disk
//!    and beside `kubectl logs` of an empty log (kubectl's own cost), and the agent's peak RSS
//!    while serving it (`VmHWM` after resetting it through `/proc/<pid>/clear_refs`) beside its
//!    RSS before: the reader streams, so the peak must not grow with the file.
//! 2. `kubectl exec -- true` round trips (p50, p99) beside the same command through CRI
//!    `ExecSync` on the same containerd (no kubectl, no API server, no agent) and beside
//!    `kubectl get pod` (kubectl's start and one API round trip).
//! 3. The agent's CPU while 30 `kubectl logs -f` follow 30 containers that each write ten lines
//!    a second, beside its CPU over the same window with the same pods and no follower.

mod common;
#[allow(dead_code, unused_imports)]
#[path = "../../../tests/agent/harness.rs"]
mod harness;
#[allow(dead_code, unused_imports)]
#[path = "../../../tests/cluster/kubelet_server.rs"]
mod kubelet_server;
#[allow(dead_code, unused_imports)]
#[path = "../../../tests/cluster/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../../../tests/cluster/support.rs"]
mod support;

use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{cpu_seconds, percentile};
use rustlet_cri::client::CriClient;
use rustlet_cri::testing::BUSYBOX_IMAGE;

use kubelet_server::ServedNode;
use support::Cluster;

const NODE: &str = "node-a";
/// The big log's size in bytes of output (the CRI file is larger: each line gets a timestamp,
/// the stream and a tag).
const LOG_BYTES: u64 = 100_000_000;
/// The agent's config besides the node IP and the eviction thresholds: no rotation of the big
/// log while it is measured.
const EXTRA_CONFIG: &str = "containerLogMaxSize: 1Gi\n";

struct Settings {
    runs: usize,
    execs: usize,
    follow: usize,
    window: Duration,
}

fn settings() -> Settings {
    let mut s = Settings {
        runs: 3,
        execs: 20,
        follow: 30,
        window: Duration::from_secs(30),
    };
    for arg in std::env::args().skip(1) {
        let number = |v: &str| v.parse::<u64>().expect("a whole number");
        if let Some(v) = arg.strip_prefix("runs=") {
            s.runs = number(v) as usize;
        } else if let Some(v) = arg.strip_prefix("execs=") {
            s.execs = number(v) as usize;
        } else if let Some(v) = arg.strip_prefix("follow=") {
            s.follow = number(v) as usize;
        } else if let Some(v) = arg.strip_prefix("window=") {
            s.window = Duration::from_secs(number(v));
        }
    }
    s
}

fn main() {
    let settings = settings();
    let Some(node) = ServedNode::start_with_config("kubelet-server-bench", NODE, EXTRA_CONFIG)
    else {
        eprintln!(
            "kubelet_server bench: skipped (needs root, containerd and the built control plane)"
        );
        return;
    };
    node::wait_ready(&node.cluster, NODE, "True");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cri = runtime
        .block_on(CriClient::connect(
            node.containerd.endpoint(),
            Duration::from_secs(10),
        ))
        .expect("connecting to containerd");
    let agent_pid = node.agent.child.id();

    node.cluster.apply(&pods_yaml());
    for pod in ["big", "shell"] {
        wait_running(&node.cluster, pod);
    }
    println!("kubelet server, kubectl through the API server to the agent on containerd:");
    big_log(&node, &runtime, &cri, agent_pid, settings.runs);
    exec_round_trips(&node, &runtime, &cri, settings.execs);
    follow_cpu(&node, agent_pid, settings.follow, settings.window);

    let refused = node
        .cluster
        .refused_requests_of(&format!("system:node:{NODE}"));
    assert!(
        refused.is_empty(),
        "refused requests of the agent: {refused:#?}"
    );
}

fn pods_yaml() -> String {
    let line = "x".repeat(100);
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: big, namespace: default}}
spec:
  nodeName: {NODE}
  terminationGracePeriodSeconds: 1
  containers:
  - name: big
    image: {BUSYBOX_IMAGE}
    command: [sh, -c, 'yes {line} | head -c {LOG_BYTES}; echo; echo END; sleep 3600']
---
apiVersion: v1
kind: Pod
metadata: {{name: shell, namespace: default}}
spec:
  nodeName: {NODE}
  terminationGracePeriodSeconds: 1
  containers:
  - name: shell
    image: {BUSYBOX_IMAGE}
    command: [sleep, '3600']
"
    )
}

fn chatty_yaml(i: usize) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: chatty-{i}, namespace: default}}
spec:
  nodeName: {NODE}
  terminationGracePeriodSeconds: 1
  containers:
  - name: chatty
    image: {BUSYBOX_IMAGE}
    command: [sh, -c, 'i=0; while true; do echo line $i; i=$((i+1)); sleep 0.1; done']
"
    )
}

fn wait_running(cluster: &Cluster, pod: &str) {
    cluster.wait_for(&format!("pod {pod} running"), || {
        let p = cluster.get(&["pod", pod]);
        match p["status"]["phase"].as_str() {
            Some("Running") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
}

/// `kubectl` as the admin inside the cluster's namespace, its stdout piped.
fn kubectl(cluster: &Cluster, args: &[&str]) -> Command {
    let bin = cluster.inner.bin().join("kubectl");
    let mut cmd = match cluster.inner.netns() {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={}", ns.display())).arg("--").arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.arg("--kubeconfig")
        .arg(cluster.inner.admin_kubeconfig())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `kubectl args`; the time to its first byte of output, to its end, and the bytes.
fn timed_kubectl(cluster: &Cluster, args: &[&str]) -> (Duration, Duration, u64) {
    let started = Instant::now();
    let mut child = kubectl(cluster, args).spawn().expect("running kubectl");
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut first = None;
    let mut bytes = 0u64;
    loop {
        let n = out.read(&mut buf).expect("reading kubectl's output");
        if n == 0 {
            break;
        }
        first.get_or_insert_with(|| started.elapsed());
        bytes += n as u64;
    }
    let status = child.wait().unwrap();
    let total = started.elapsed();
    assert!(status.success(), "kubectl {args:?}: {status}");
    (first.unwrap_or(total), total, bytes)
}

/// The CRI log file of the running container `name` (its `ContainerStatus.log_path`).
fn log_path(runtime: &tokio::runtime::Runtime, cri: &CriClient, name: &str) -> PathBuf {
    runtime.block_on(async {
        for c in cri.list_containers().await.expect("listing containers") {
            if c.metadata.as_ref().is_some_and(|m| m.name == name) && c.state == 1 {
                let status = cri.container_status(&c.id).await.expect("container status");
                return PathBuf::from(status.log_path);
            }
        }
        panic!("no running container {name}");
    })
}

/// `VmHWM` and `VmRSS` of `pid` in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn big_log(
    node: &ServedNode,
    runtime: &tokio::runtime::Runtime,
    cri: &CriClient,
    agent_pid: u32,
    runs: usize,
) {
    let cluster = &node.cluster;
    let written = Instant::now();
    cluster.wait_for_within("the big log written", Duration::from_secs(600), || {
        let out = cluster.kubectl_output(&["logs", "big", "--tail=1"], None);
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("END") {
            Ok(())
        } else {
            Err(text.chars().take(40).collect())
        }
    });
    let path = log_path(runtime, cri, "big");
    let file_bytes = std::fs::metadata(&path).expect("the big log").len();
    println!(
        "  kubectl logs of a {:.0} MB output ({:.0} MB CRI log file, written in {:.0} s):",
        LOG_BYTES as f64 / 1e6,
        file_bytes as f64 / 1e6,
        written.elapsed().as_secs_f64()
    );
    let (_, empty_total, _) = timed_kubectl(cluster, &["logs", "shell"]);
    for run in 1..=runs {
        let (_, rss_before) = memory_kib(agent_pid);
        // Resets VmHWM to the current RSS (Linux >= 4.0), so the next read is this run's peak.
        std::fs::write(format!("/proc/{agent_pid}/clear_refs"), "5").expect("clear_refs");
        let (first, total, bytes) = timed_kubectl(cluster, &["logs", "big"]);
        let (peak, _) = memory_kib(agent_pid);
        assert!(bytes >= LOG_BYTES, "kubectl logs gave {bytes} bytes");
        println!(
            "    run {run}: first byte {:.0} ms, all {:.2} s ({:.0} MB/s, {bytes} bytes); agent RSS \
             {:.1} MiB before, peak {:.1} MiB while serving",
            ms(first),
            total.as_secs_f64(),
            bytes as f64 / 1e6 / total.as_secs_f64(),
            mib(rss_before),
            mib(peak)
        );
    }
    let (direct_first, direct_total, direct_bytes) =
        curl_agent(node, "/containerLogs/default/big/big");
    assert!(
        direct_bytes >= LOG_BYTES,
        "the agent gave {direct_bytes} bytes"
    );
    let started = Instant::now();
    let mut file = std::fs::File::open(&path).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut raw = 0u64;
    loop {
        let n = file.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        raw += n as u64;
    }
    let raw_time = started.elapsed();
    println!(
        "    the agent alone (curl to :10250 with the API server's kubelet client certificate, no \
         API server, no kubectl): first byte {:.0} ms, all {:.2} s ({:.0} MB/s)",
        ms(direct_first),
        direct_total.as_secs_f64(),
        direct_bytes as f64 / 1e6 / direct_total.as_secs_f64()
    );
    println!(
        "    floor: the CRI file read raw {:.2} s ({:.0} MB/s, page cache warm); kubectl logs of an \
         empty log {:.0} ms",
        raw_time.as_secs_f64(),
        raw as f64 / 1e6 / raw_time.as_secs_f64(),
        ms(empty_total)
    );
}

/// `GET path` on the agent's port from inside its namespace, as the API server's kubelet
/// client: the time to the first byte, to the last, and the bytes (curl's own figures).
fn curl_agent(node: &ServedNode, path: &str) -> (Duration, Duration, u64) {
    let pki = |f: &str| node.cluster.inner.pki(f);
    let out = Command::new("nsenter")
        .arg(format!("--net={}", node.containerd.netns().display()))
        .args(["--", "curl", "-sS", "-o", "/dev/null", "--cacert"])
        .arg(pki("ca.crt"))
        .arg("--cert")
        .arg(pki("apiserver-kubelet-client.crt"))
        .arg("--key")
        .arg(pki("apiserver-kubelet-client.key"))
        .args([
            "-w",
            "%{http_code} %{time_starttransfer} %{time_total} %{size_download}",
        ])
        .arg(format!("https://10.88.0.1:10250{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let f: Vec<&str> = text.split_whitespace().collect();
    assert!(
        f.len() == 4 && f[0] == "200",
        "curl {path}: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secs = |v: &str| Duration::from_secs_f64(v.parse().expect("curl's seconds"));
    (secs(f[1]), secs(f[2]), f[3].parse().expect("curl's size"))
}

fn exec_round_trips(
    node: &ServedNode,
    runtime: &tokio::runtime::Runtime,
    cri: &CriClient,
    execs: usize,
) {
    let cluster = &node.cluster;
    let times = |args: &[&str]| {
        let mut v: Vec<Duration> = (0..execs)
            .map(|_| {
                let started = Instant::now();
                let out = kubectl(cluster, args).output().unwrap();
                assert!(
                    out.status.success(),
                    "kubectl {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                started.elapsed()
            })
            .collect();
        v.sort();
        v
    };
    let exec = times(&["exec", "shell", "--", "true"]);
    let get = times(&["get", "pod", "shell", "-o", "name"]);
    let id = runtime.block_on(async {
        cri.list_containers()
            .await
            .unwrap()
            .into_iter()
            .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == "shell") && c.state == 1)
            .expect("the shell container")
            .id
    });
    let mut direct: Vec<Duration> = (0..execs)
        .map(|_| {
            let started = Instant::now();
            let r = runtime
                .block_on(cri.exec_sync(&id, vec!["true".into()], Duration::from_secs(10)))
                .expect("ExecSync");
            assert_eq!(r.exit_code, 0);
            started.elapsed()
        })
        .collect();
    direct.sort();
    let line = |what: &str, v: &[Duration]| {
        println!(
            "    {what}: p50 {:.0} ms, p99 {:.0} ms",
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.99))
        );
    };
    println!("  exec round trips ({execs} each):");
    line("kubectl exec shell -- true", &exec);
    line("floor: CRI ExecSync true on the same containerd", &direct);
    line(
        "floor: kubectl get pod shell (kubectl and one API request)",
        &get,
    );
}

fn follow_cpu(node: &ServedNode, agent_pid: u32, follow: usize, window: Duration) {
    let cluster = &node.cluster;
    let yaml: Vec<String> = (0..follow).map(chatty_yaml).collect();
    cluster.apply(&yaml.join("---\n"));
    for i in 0..follow {
        wait_running(cluster, &format!("chatty-{i}"));
    }
    // Let the pods' start settle before either window.
    std::thread::sleep(Duration::from_secs(10));
    let cpu = |window: Duration| {
        let before = cpu_seconds(agent_pid);
        std::thread::sleep(window);
        (cpu_seconds(agent_pid) - before) / window.as_secs_f64() * 100.0
    };
    let idle = cpu(window);
    let received = Arc::new(AtomicU64::new(0));
    let mut followers: Vec<Child> = (0..follow)
        .map(|i| {
            let mut child = kubectl(cluster, &["logs", "-f", "--tail=0", &format!("chatty-{i}")])
                .spawn()
                .expect("kubectl logs -f");
            let mut out = child.stdout.take().unwrap();
            let received = received.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = out.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    received.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
            child
        })
        .collect();
    std::thread::sleep(Duration::from_secs(5));
    let at_start = received.load(Ordering::Relaxed);
    let following = cpu(window);
    let flowed = received.load(Ordering::Relaxed) - at_start;
    for f in &mut followers {
        let _ = f.kill();
        let _ = f.wait();
    }
    assert!(flowed > 0, "the followers received nothing over the window");
    println!(
        "  the agent's CPU with {follow} containers writing 10 lines/s each, over {} s:",
        window.as_secs()
    );
    println!(
        "    {follow} kubectl logs -f following them: {following:.2} % of a core ({:.0} KB/s \
         reached the followers)",
        flowed as f64 / 1e3 / window.as_secs_f64()
    );
    println!("    baseline, no follower: {idle:.2} % of a core");
}
