//! Pod start latency on real containers (issue 13): the agent with `--runtime cri` on a private
//! containerd (see `rustlet_cri::testing`; run as root in a private mount namespace), against
//! the same agent with the simulated runtime on the same machine, and upstream's pod startup
//! SLO (5 s p99, image present):
//!
//! ```sh
//! unshare -m --propagation private env RUSTLET_PRIVATE_MOUNT_NS=1 \
//!     cargo bench -p rustlet --bench cri
//! ```
//!
//! For 1, 10 and 50 pods (pod network through the CNI bridge, a disk and a Memory emptyDir
//! each, one busybox container; the image is present): the manifests are written at once, and
//! each pod's latency runs from its manifest's write to the 10 ms poll of `/pods` that first
//! saw it Running with its container running. Median, p99 and the whole; beside them the
//! floor: the same pods made by raw CRI calls from one client, all at once. With 50 pods
//! running, the CPU of the agent (its relist every second, the workers' passes) and of
//! containerd over 10 s.

mod common;
#[path = "common/cri_floor.rs"]
mod cri_floor;

use common::{cpu_seconds, percentile};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};
use rustlet_cri::testing::PrivateContainerd;
use serde_json::Value;

const PORT: u16 = 10255;

/// Each pod's container (the agent's and the floor's alike).
const COMMAND: [&str; 3] = [
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done",
];

fn manifest(i: usize) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: p{i}
  namespace: default
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: localhost/busybox:1
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done"]
    volumeMounts:
    - {{name: disk, mountPath: /disk}}
    - {{name: mem, mountPath: /mem}}
  volumes:
  - name: disk
    emptyDir: {{}}
  - name: mem
    emptyDir:
      medium: Memory
      sizeLimit: 1Mi
"#
    )
}

/// A connection to the agent, inside its network namespace.
fn connect(netns: &Path) -> Option<TcpStream> {
    let own = std::fs::File::open("/proc/thread-self/ns/net").ok()?;
    let target = std::fs::File::open(netns).ok()?;
    setns(&target, CloneFlags::CLONE_NEWNET).ok()?;
    let stream = TcpStream::connect(("127.0.0.1", PORT));
    setns(&own, CloneFlags::CLONE_NEWNET).expect("back to the bench's network namespace");
    stream.ok()
}

fn get(netns: &Path, path: &str) -> Option<String> {
    let mut stream = connect(netns)?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response.split_once("\r\n\r\n")?.1.to_owned())
}

fn pods(netns: &Path) -> Vec<Value> {
    get(netns, "/pods")
        .and_then(|body| serde_json::from_str::<Value>(&body).ok())
        .and_then(|v| v["items"].as_array().cloned())
        .unwrap_or_default()
}

fn running(netns: &Path) -> Vec<String> {
    pods(netns)
        .iter()
        .filter(|p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        })
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

fn containerd_pid(netns: &Path) -> Option<u32> {
    let want = std::fs::read_link(netns).ok();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_string_lossy().parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == "containerd"
            && (want.is_none() || std::fs::read_link(e.path().join("ns/net")).ok() == want))
            .then_some(pid)
    })
}

struct Run {
    name: &'static str,
    per_pod: Vec<Duration>,
    whole: Duration,
}

/// One agent, `pods` manifests written at once, until every pod runs; then (for the CPU
/// figure) 10 s of steady state; then every pod deleted and the runtime emptied.
fn run(
    containerd: &PrivateContainerd,
    runtime: &'static str,
    pods: usize,
    measure_idle: bool,
) -> (Run, Option<(f64, f64)>) {
    let dir = containerd.dir().join(format!("{runtime}-{pods}"));
    let (root, manifests) = (dir.join("root"), dir.join("manifests"));
    std::fs::create_dir_all(&manifests).unwrap();
    let netns: PathBuf = containerd.netns();
    let child: Child = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .arg(env!("CARGO_BIN_EXE_rustlet"))
        .args(["--node-name", "bench", "--root-dir"])
        .arg(&root)
        .arg("--local")
        .arg(&manifests)
        .args(["--runtime", runtime, "--container-runtime-endpoint"])
        .arg(containerd.endpoint())
        .args(["--listen", &format!("127.0.0.1:{PORT}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting rustlet");
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&netns, "/healthz").as_deref() != Some("ok") {
        assert!(
            Instant::now() < deadline,
            "the agent did not become healthy"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let start = Instant::now();
    let mut written = Vec::with_capacity(pods);
    for i in 0..pods {
        std::fs::write(manifests.join(format!("p{i}.yaml")), manifest(i)).unwrap();
        written.push(start.elapsed());
    }
    let mut seen: Vec<Option<Duration>> = vec![None; pods];
    let mut left = pods;
    let deadline = Instant::now() + Duration::from_secs(120);
    while left > 0 {
        assert!(Instant::now() < deadline, "not every pod ran within 120 s");
        let now = start.elapsed();
        for name in running(&netns) {
            if let Some(i) = name.strip_prefix('p').and_then(|n| n.parse::<usize>().ok())
                && i < pods
                && seen[i].is_none()
            {
                seen[i] = Some(now - written[i]);
                left -= 1;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let whole = start.elapsed();
    let mut per_pod: Vec<Duration> = seen.into_iter().flatten().collect();
    per_pod.sort();
    let idle = measure_idle.then(|| {
        let agent = child.id();
        let containerd = containerd_pid(&netns).unwrap_or(0);
        let (a0, c0) = (cpu_seconds(agent), cpu_seconds(containerd));
        let over = Duration::from_secs(10);
        std::thread::sleep(over);
        (
            (cpu_seconds(agent) - a0) / over.as_secs_f64() * 100.0,
            (cpu_seconds(containerd) - c0) / over.as_secs_f64() * 100.0,
        )
    });
    // Every pod deleted; the agent stops them and removes them from the runtime.
    for i in 0..pods {
        let _ = std::fs::remove_file(manifests.join(format!("p{i}.yaml")));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pods_gone(&netns) {
        assert!(
            Instant::now() < deadline,
            "the pods were not deleted within 120 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let mut child = child;
    let _ = child.wait();
    (
        Run {
            name: runtime,
            per_pod,
            whole,
        },
        idle,
    )
}

fn pods_gone(netns: &Path) -> bool {
    pods(netns).is_empty()
}

fn print(run: &Run, pods: usize) {
    println!(
        "{:>9}, {pods:>2} pods: all Running in {:>7.1} ms; per pod median {:>7.1} ms, p99 {:>7.1} ms (upstream SLO: p99 < 5 s)",
        run.name,
        run.whole.as_secs_f64() * 1e3,
        percentile(&run.per_pod, 0.5).as_secs_f64() * 1e3,
        percentile(&run.per_pod, 0.99).as_secs_f64() * 1e3,
    );
}

/// The floor: the same pods by raw CRI calls from one client, all at once (see
/// [`cri_floor`]). Per pod from the start to its StartContainer's answer.
fn floor(containerd: &PrivateContainerd, pods: usize) -> Run {
    let floor = cri_floor::raw_cri_pods(containerd, pods, &COMMAND);
    Run {
        name: "raw CRI",
        per_pod: floor.per_pod,
        whole: floor.whole,
    }
}

fn main() {
    let Some(containerd) = PrivateContainerd::start_blocking("cri benchmark") else {
        return;
    };
    for pods in [1, 10, 50] {
        print(&floor(&containerd, pods), pods);
        for runtime in ["cri", "simulated"] {
            let measure_idle = pods == 50 && runtime == "cri";
            let (result, idle) = run(&containerd, runtime, pods, measure_idle);
            print(&result, pods);
            if let Some((agent, containerd)) = idle {
                println!(
                    "      50 pods running, over 10 s: agent CPU {agent:.2} % of a core (relist every 1 s), containerd {containerd:.2} %"
                );
            }
        }
    }
}
