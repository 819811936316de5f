//! The agent as a process, end to end (real mounts, simulated runtime; run as root in a
//! private mount namespace):
//!
//! ```sh
//! cargo xtask bench
//! # or: unshare -m --propagation private env RUSTLET_PRIVATE_MOUNT_NS=1 \
//! #     cargo bench -p rustlet --bench agent
//! ```
//!
//! For 110 (a node's default `maxPods`) and 1,000 pods, each with a disk emptyDir and a Memory emptyDir mounted by its
//! container:
//!
//! 1. Local mode: the manifests appear at once; time until every pod is Running in `/pods`
//!    (the whole, and per pod from its manifest's write to the poll that first saw it
//!    Running: median and p99; the poll runs every 10 ms, every 100 ms above 200 pods, on a
//!    fixed grid, and bounds the resolution: each figure is also printed as measured from the
//!    poll before, which did not see it yet), the agent's CPU time to all Running and over
//!    the 10 s after (the start's tail: its last status writes go on after the poll saw every
//!    pod Running;
//!    `-- steady`: also the idle CPU over 60 s from 30 s after, settled), and its
//!    peak RSS (`VmHWM`). Each run gets a fresh ext4 file
//!    system on a loop device (`-- shared-fs`: the shared temporary directory instead, where
//!    the previous runs' removals slow inode allocation), and measures its floor on it first.
//! 2. Kube mode against the test API server: API requests the agent makes per pod lifecycle
//!    (create → Running → deleted), by verb, against upstream's shape for the same lifecycle
//!    (a GET before every status PATCH, spec `status-manager.md` R34-R39).
//! 3. A ConfigMap edit → its new content in a running pod's configMap volume (issue 12):
//!    in local mode (an edited manifest; the directory is watched with inotify) and in kube
//!    mode (a PATCH to the test API server), median and p99 over 20 edits. Upstream's shape,
//!    the periodic pod sync (60-90 s), is measured beside ours in the `content` bench of
//!    `rustlet-volume`. `-- content` runs this part alone.

mod common;

use common::{cpu_seconds, percentile};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustlet_api::local::store::Store;
use rustlet_api::test_server::TestApiServer;
use rustlet_mount::testing::privileged_dir;
use serde_json::Value;

fn manifest(i: usize) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: p{i}
  namespace: default
spec:
  containers:
  - name: c
    image: busybox
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
"
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response.split_once("\r\n\r\n")?.1.to_owned())
}

/// The names of the pods `/pods` shows Running. Only the two fields are decoded: the bench
/// shares the two cores with the agent, and a `Value` tree of a 1,000-pod list cost it ~15 ms
/// of CPU a poll (8 % of both cores' samples in a storm).
fn running(port: u16) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct List {
        items: Vec<Item>,
    }
    #[derive(serde::Deserialize)]
    struct Item {
        metadata: Meta,
        #[serde(default)]
        status: Option<Status>,
    }
    #[derive(serde::Deserialize)]
    struct Meta {
        name: String,
    }
    #[derive(serde::Deserialize)]
    struct Status {
        phase: Option<String>,
    }
    get(port, "/pods")
        .and_then(|body| serde_json::from_str::<List>(&body).ok())
        .map_or_else(Vec::new, |list| list.items)
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| p.metadata.name)
        .collect()
}

fn start(args: &[&str], port: u16) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rustlet"));
    // `RUSTLET_BENCH_AGENT_PRELOAD`: an `LD_PRELOAD` for the agent alone, not the bench (a
    // heap profiler's: heaptrack's `libheaptrack_preload.so` with `DUMP_HEAPTRACK_OUTPUT`).
    if let Some(preload) = std::env::var_os("RUSTLET_BENCH_AGENT_PRELOAD") {
        command.env("LD_PRELOAD", preload);
    }
    // `RUSTLET_BENCH_AGENT_CONFIG`: a config file for the agent (`--config`), to measure a
    // setting against the defaults.
    if let Some(config) = std::env::var_os("RUSTLET_BENCH_AGENT_CONFIG") {
        command.arg("--config").arg(config);
    }
    let child = command
        .args(args)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting rustlet");
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(port, "/healthz").as_deref() != Some("ok") {
        assert!(
            Instant::now() < deadline,
            "the agent did not become healthy"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// `rustlet --node-name bench --root-dir ROOT FLAG VALUE` (`--local DIR` or
/// `--kubeconfig FILE`), once healthy.
fn start_agent(root: &Path, (flag, value): (&str, &Path), port: u16) -> Child {
    start(
        &[
            "--node-name",
            "bench",
            "--root-dir",
            root.to_str().unwrap(),
            flag,
            value.to_str().unwrap(),
        ],
        port,
    )
}

fn stop(mut child: Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let _ = child.wait();
}

fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The agent's memory now, from `/proc/<pid>/status`: resident (anonymous, file-backed) and
/// threads, where the peak is `VmHWM` alone.
fn memory_now(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .split_whitespace()
                    .next()?
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    format!(
        "VmRSS {:.1} MiB (anonymous {:.1}, file {:.1}), {} threads",
        field("VmRSS:") / 1024.0,
        field("RssAnon:") / 1024.0,
        field("RssFile:") / 1024.0,
        field("Threads:"),
    )
}

/// The directories and files the kubelet's layout gives one pod with a disk and a Memory
/// emptyDir (`pods/<uid>/volumes/...` and the plugin's `ready` markers), relative to its
/// directory.
const POD_LAYOUT_DIRS: [&str; 8] = [
    "volumes",
    "volumes/kubernetes.io~empty-dir",
    "volumes/kubernetes.io~empty-dir/disk",
    "volumes/kubernetes.io~empty-dir/mem",
    "plugins",
    "plugins/kubernetes.io~empty-dir",
    "plugins/kubernetes.io~empty-dir/disk",
    "plugins/kubernetes.io~empty-dir/mem",
];

/// The floor under the storm: the same directories and `ready` files for `pods` pods, made
/// with plain syscalls on the same file system just before the agent runs, by one thread and
/// by 32 (the agent's blocking threads). The trees stay until the bench ends, so that their
/// removal does not slow the agent's run (ext4 scans for recently freed inodes).
fn layout_floor(dir: &Path, pods: usize) -> (Duration, Duration) {
    fn one(pod_dir: &Path) {
        std::fs::create_dir(pod_dir).unwrap();
        for sub in POD_LAYOUT_DIRS {
            std::fs::create_dir(pod_dir.join(sub)).unwrap();
        }
        for volume in ["disk", "mem"] {
            std::fs::File::create(
                pod_dir.join(format!("plugins/kubernetes.io~empty-dir/{volume}/ready")),
            )
            .unwrap();
        }
    }
    let sequential = dir.join(format!("floor-{pods}-1"));
    std::fs::create_dir_all(&sequential).unwrap();
    let start = Instant::now();
    for i in 0..pods {
        one(&sequential.join(format!("pod-{i}")));
    }
    let alone = start.elapsed();
    let parallel = dir.join(format!("floor-{pods}-32"));
    std::fs::create_dir_all(&parallel).unwrap();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..32 {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= pods {
                        break;
                    }
                    one(&parallel.join(format!("pod-{i}")));
                }
            });
        }
    });
    (alone, start.elapsed())
}

/// A fresh ext4 file system for one run, on a loop device (`mkfs.ext4`, `mount -o loop`), as a
/// node's disk after boot. ext4 steps over inodes freed in the last minutes when it allocates
/// (`recently_deleted`), so on the shared temporary directory a run right after another one's
/// removals measured those removals: the floor moved 3-6x between runs. Unmounted (with
/// whatever the agent left mounted inside) when dropped.
struct FreshFs {
    mount: std::path::PathBuf,
}

impl FreshFs {
    fn new(dir: &Path, name: &str) -> Option<Self> {
        let image = dir.join(format!("{name}.img"));
        let mount = dir.join(name);
        std::fs::create_dir_all(&mount).ok()?;
        std::fs::File::create(&image).ok()?.set_len(4 << 30).ok()?;
        let ok = |cmd: &mut Command| {
            cmd.stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let made = ok(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))
            && ok(Command::new("mount")
                .args(["-o", "loop"])
                .arg(&image)
                .arg(&mount));
        let _ = std::fs::remove_file(&image);
        made.then_some(Self { mount })
    }
}

impl Drop for FreshFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-R").arg(&self.mount).status();
    }
}

fn local_mode(dir: &Path, pods: usize) {
    let fresh = if std::env::args().any(|a| a == "shared-fs") {
        None
    } else {
        FreshFs::new(dir, &format!("fs-{pods}"))
    };
    let dir = fresh.as_ref().map_or(dir, |fs| fs.mount.as_path());
    println!(
        "file system: {}",
        if fresh.is_some() {
            "a fresh ext4 on a loop device"
        } else {
            "the shared temporary directory"
        }
    );
    let (floor_alone, floor_parallel) = layout_floor(dir, pods);
    let root = dir.join(format!("root-{pods}"));
    let manifests = dir.join(format!("manifests-{pods}"));
    std::fs::create_dir_all(&manifests).unwrap();
    let port = free_port();
    let child = start_agent(&root, ("--local", &manifests), port);
    let pid = child.id();
    let start = Instant::now();
    let mut written = Vec::with_capacity(pods);
    for i in 0..pods {
        std::fs::write(manifests.join(format!("p{i}.yaml")), manifest(i)).unwrap();
        written.push(start.elapsed());
    }
    // A `/pods` of 1,000 pods costs the agent ~15 ms: polled every 10 ms it would keep one of
    // the two cores busy and measure the poll. Above 200 pods it is polled every 100 ms (the
    // per-pod figures' resolution). The polls start on a fixed grid (every `poll` from the
    // first write; a poll that overran skips to the next), not `poll` after the last one
    // ended: a poll answers 15-80 ms late in a storm, and the gaps stretched to ~125 ms.
    let poll = Duration::from_millis(if pods > 200 { 100 } else { 10 });
    // Per pod: the start of the poll that first saw it Running (the upper bound of when it
    // became Running) and of the one before (the lower bound: it was not Running yet).
    let mut seen: Vec<Option<(Duration, Duration)>> = vec![None; pods];
    let mut left = pods;
    let mut last_poll = Duration::ZERO;
    let mut previous_poll = Duration::ZERO;
    let mut next_poll = Duration::ZERO;
    let deadline = Instant::now() + Duration::from_secs(120);
    while left > 0 {
        assert!(Instant::now() < deadline, "not every pod ran within 120 s");
        let now = start.elapsed();
        for name in running(port) {
            if let Some(i) = name.strip_prefix('p').and_then(|n| n.parse::<usize>().ok())
                && i < pods
                && seen[i].is_none()
            {
                seen[i] = Some((last_poll.saturating_sub(written[i]), now - written[i]));
                left -= 1;
            }
        }
        previous_poll = last_poll;
        last_poll = now;
        while next_poll <= start.elapsed() {
            next_poll += poll;
        }
        if left > 0 {
            std::thread::sleep(next_poll - start.elapsed().min(next_poll));
        }
    }
    // The start of the poll that saw the last pod Running, and of the one before.
    let (whole, whole_before) = (last_poll, previous_poll);
    // The agent's CPU for the whole start (both cores' worth: a storm bound by CPU takes at
    // least half of this on two cores).
    let cpu_to_running = cpu_seconds(pid);
    let (mut not_yet, mut per_pod): (Vec<Duration>, Vec<Duration>) =
        seen.into_iter().flatten().unzip();
    not_yet.sort();
    per_pod.sort();
    let tail = Duration::from_secs(10);
    std::thread::sleep(tail);
    let cpu = cpu_seconds(pid) - cpu_to_running;
    // `-- steady`: also the settled agent's idle CPU, over 60 s from 30 s after all Running.
    let steady = std::env::args().any(|a| a == "steady").then(|| {
        std::thread::sleep(Duration::from_secs(20));
        let before = cpu_seconds(pid);
        let (ns, threads) = cpu_ns_over(pid, Duration::from_secs(60));
        (
            (cpu_seconds(pid) - before) / 60.0 * 100.0,
            ns as f64 / 60e9 * 100.0,
            threads,
        )
    });
    let rss = peak_rss_mib(pid);
    let memory = memory_now(pid);
    stop(child);
    println!(
        "local mode, {pods:>5} pods: all Running in {:>7.1} ms; per pod median {:>6.1} ms, p99 {:>6.1} ms; CPU {:.2} % of a core over the {} s after (the tail); peak RSS {:.1} MiB",
        whole.as_secs_f64() * 1e3,
        percentile(&per_pod, 0.5).as_secs_f64() * 1e3,
        percentile(&per_pod, 0.99).as_secs_f64() * 1e3,
        cpu / tail.as_secs_f64() * 100.0,
        tail.as_secs(),
        rss,
    );
    println!(
        "  agent CPU: {:.0} ms from its start to all Running",
        cpu_to_running * 1e3
    );
    println!(
        "  the poll before saw not yet: all Running after {:.1} ms; per pod median after {:.1} ms, p99 after {:.1} ms (each figure above lies between its bound here and itself)",
        whole_before.as_secs_f64() * 1e3,
        percentile(&not_yet, 0.5).as_secs_f64() * 1e3,
        percentile(&not_yet, 0.99).as_secs_f64() * 1e3,
    );
    println!("  memory at the end: {memory}");
    if let Some((ticks, scheduler, threads)) = steady {
        println!(
            "  settled (30 s after all Running), idle CPU over 60 s: {scheduler:.4} % of a core by the scheduler's ns ({threads} threads), {ticks:.3} % in 10 ms ticks"
        );
    }
    println!(
        "  floor, same file system, just before: {pods} pods' directories and ready files by plain syscalls: {:.1} ms by one thread, {:.1} ms by 32",
        floor_alone.as_secs_f64() * 1e3,
        floor_parallel.as_secs_f64() * 1e3,
    );
    // Clean up this run's mounts before the next (the agent leaves them in place).
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<&str> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(root.to_str().unwrap()))
        .collect();
    points.reverse();
    for point in points {
        let _ = nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn kube_mode(dir: &Path, pods: usize) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, PostParams};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = Arc::new(Store::default());
    let server = rt.block_on(TestApiServer::start(store.clone())).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
    let root = dir.join("root-kube");
    let port = free_port();
    let child = start_agent(&root, ("--kubeconfig", &kubeconfig), port);
    let api: Api<Pod> = Api::namespaced(rt.block_on(server.client()).unwrap(), "default");
    let before = server.requests().len();
    for i in 0..pods {
        let mut pod: Value = serde_saphyr::from_str(&manifest(i)).unwrap();
        pod["spec"]["nodeName"] = "bench".into();
        rt.block_on(api.create(
            &PostParams::default(),
            &serde_json::from_value(pod).unwrap(),
        ))
        .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while running(port).len() < pods {
        assert!(Instant::now() < deadline, "not every pod ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    for i in 0..pods {
        rt.block_on(api.delete(&format!("p{i}"), &DeleteParams::default()))
            .unwrap();
    }
    let all = rustlet_api::local::store::Selection::all(rustlet_api::local::store::Kind::Pod);
    while !store.list(&all).0.is_empty() {
        assert!(Instant::now() < deadline, "not every pod was deleted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let requests: Vec<_> = server.requests()[before..]
        .iter()
        .filter(|r| r.path.contains("/pods/p"))
        .cloned()
        .collect();
    let count = |method: &str, status: bool| {
        requests
            .iter()
            .filter(|r| r.method.as_str() == method && r.path.ends_with("/status") == status)
            .count() as f64
            / pods as f64
    };
    let patches = count("PATCH", true);
    let gets = count("GET", false);
    // The user's own DELETE is in the log too: one per pod.
    let deletes = count("DELETE", false) - 1.0;
    stop(child);
    println!(
        "kube mode, {pods:>5} pods: agent requests per pod lifecycle: {:.2} (PATCH status {patches:.2}, GET {gets:.2}, DELETE {deletes:.2}); upstream's shape: {:.2} (a GET before each of the {patches:.2} PATCHes, and the DELETE)",
        patches + gets + deletes,
        2.0 * patches + deletes,
    );
    drop(server);
}

const CONTENT_POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: reader
  namespace: default
spec:
  containers:
  - name: c
    image: busybox
    volumeMounts:
    - {name: cfg, mountPath: /etc/cfg}
  volumes:
  - name: cfg
    configMap: {name: cfg}
";

fn config_map(value: &str) -> String {
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata:
  name: cfg
  namespace: default
data:
  app.conf: \"{value}\"
"
    )
}

/// The pod's `app.conf` under `root`, once it exists.
fn content_file(root: &Path) -> std::path::PathBuf {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = std::fs::read_dir(root.join("pods"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| {
                e.path()
                    .join("volumes/kubernetes.io~configmap/cfg/app.conf")
            })
            .find(|p| p.exists());
        if let Some(path) = found {
            return path;
        }
        assert!(
            Instant::now() < deadline,
            "the configMap volume never appeared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Median and p99 of edit → visible over `rounds` edits made by `edit`.
fn edit_latency(file: &Path, rounds: usize, mut edit: impl FnMut(&str)) -> (Duration, Duration) {
    let mut samples = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        let value = format!("v{round}");
        let started = Instant::now();
        edit(&value);
        let deadline = started + Duration::from_secs(30);
        while std::fs::read_to_string(file).ok().as_deref() != Some(value.as_str()) {
            assert!(
                Instant::now() < deadline,
                "the edit never reached the volume"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        samples.push(started.elapsed());
    }
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

fn content_latency(dir: &Path) {
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    println!("ConfigMap edit → new content in a running pod's volume (20 edits)");
    println!("| mode | median | p99 |");
    println!("|---|---|---|");
    // Local mode.
    let manifests = dir.join("content-manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(manifests.join("cfg.yaml"), config_map("v0")).unwrap();
    std::fs::write(manifests.join("pod.yaml"), CONTENT_POD).unwrap();
    let root = dir.join("root-content-local");
    let port = free_port();
    let child = start_agent(&root, ("--local", &manifests), port);
    let file = content_file(&root);
    let (median, p99) = edit_latency(&file, 20, |value| {
        std::fs::write(manifests.join("cfg.yaml"), config_map(value)).unwrap();
    });
    stop(child);
    println!(
        "| local mode (manifest edited; the directory is watched with inotify) | {} | {} |",
        ms(median),
        ms(p99)
    );

    // Kube mode.
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = Arc::new(Store::default());
    let server = rt.block_on(TestApiServer::start(store.clone())).unwrap();
    let kubeconfig = dir.join("kubeconfig-content");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
    let client = rt.block_on(server.client()).unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_saphyr::from_str(&config_map("v0")).unwrap();
    rt.block_on(maps.create(&PostParams::default(), &cm))
        .unwrap();
    let mut pod: Value = serde_saphyr::from_str(CONTENT_POD).unwrap();
    pod["spec"]["nodeName"] = "bench".into();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    rt.block_on(pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    ))
    .unwrap();
    let root = dir.join("root-content-kube");
    let port = free_port();
    let child = start_agent(&root, ("--kubeconfig", &kubeconfig), port);
    let file = content_file(&root);
    let (median, p99) = edit_latency(&file, 20, |value| {
        let patch = serde_json::json!({"data": {"app.conf": value}});
        rt.block_on(maps.patch("cfg", &PatchParams::default(), &Patch::Merge(&patch)))
            .unwrap();
    });
    stop(child);
    println!(
        "| kube mode (PATCH to the test API server) | {} | {} |",
        ms(median),
        ms(p99)
    );
    drop(server);
}

fn main() {
    let Some(dir) = privileged_dir("agent benchmark") else {
        return;
    };
    if std::env::args().any(|a| a == "content") {
        content_latency(dir.path());
        return;
    }
    // `-- pods=N`: local mode with N pods alone.
    if let Some(pods) = std::env::args().find_map(|a| a.strip_prefix("pods=")?.parse().ok()) {
        local_mode(dir.path(), pods);
        return;
    }
    for pods in [110, 1_000] {
        local_mode(dir.path(), pods);
    }
    kube_mode(dir.path(), 100);
    content_latency(dir.path());
}

/// The CPU time each live thread of `pid` has run, in ns (`/proc/<pid>/task/<tid>/schedstat`,
/// the scheduler's own count: no 10 ms ticks), by thread id.
fn thread_cpu_ns(pid: u32) -> std::collections::BTreeMap<u32, u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Default::default();
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| {
            let tid = task.file_name().to_str()?.parse().ok()?;
            let schedstat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            Some((tid, schedstat.split_whitespace().next()?.parse().ok()?))
        })
        .collect()
}

/// The CPU time `pid` uses over `window`, in ns, by the scheduler's per-thread counts read
/// every second: a thread first seen during the window was born in it (all its time counts),
/// and one that ends counts up to its last reading (the agent's blocking threads end after
/// 10 s without work, so nothing of theirs is lost). Also how many threads were seen.
fn cpu_ns_over(pid: u32, window: Duration) -> (u64, usize) {
    let first = thread_cpu_ns(pid);
    let mut last = first.clone();
    let end = std::time::Instant::now() + window;
    while let Some(left) = end.checked_duration_since(std::time::Instant::now()) {
        std::thread::sleep(left.min(Duration::from_secs(1)));
        last.extend(thread_cpu_ns(pid));
    }
    let used = last
        .iter()
        .map(|(tid, ns)| ns - first.get(tid).copied().unwrap_or(0).min(*ns))
        .sum();
    (used, last.len())
}
