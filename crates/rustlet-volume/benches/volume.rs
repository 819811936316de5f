//! Volume manager benchmarks (real mounts; run as root in a private mount namespace):
//!
//! ```sh
//! cargo xtask bench
//! # or: unshare -m --propagation private env RUSTLET_PRIVATE_MOUNT_NS=1 \
//! #     cargo bench -p rustlet-volume --features test-util --bench volume
//! ```
//!
//! 1. Pod added → `wait_for_attach_and_mount` returns, for a pod with an emptyDir, a Memory
//!    emptyDir and a hostPath: event-driven (ours) against the polling shape of upstream
//!    (100 ms loops, 300 ms poll), in the same run.
//! 2. 100 and 1,000 such pods added at once: time until all are mounted, against the floors
//!    (the minimal syscalls sequentially, the agent's own syscalls replayed, raw tmpfs mounts)
//!    and (2b) the concurrency floor: the minimal syscalls issued as the agent issues them,
//!    every pod at once in one blocking-pool hop each, and those hops alone.
//! 3. A steady-state reconcile pass over 1,000 pods × 5 volumes with nothing to do, against
//!    the clone-everything shape of upstream's pass.
//! 4. Idle CPU with 1,000 pods mounted, over 60 s.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, HostPathVolumeSource, Volume};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use rustlet_core::UniquePodName;
use rustlet_mount::LinuxMounter;
use rustlet_mount::fake::FakeMounter;
use rustlet_mount::testing::privileged_dir;
use rustlet_volume::cache::{ActualStateOfWorld, DesiredStateOfWorld};
use rustlet_volume::executor::OperationExecutor;
use rustlet_volume::manager::{VolumeManager, VolumeManagerConfig, VolumeManagerDeps};
use rustlet_volume::plugin::VolumeHost;
use rustlet_volume::plugins::builtin_plugins;
use rustlet_volume::reconciler::Reconciler;
use rustlet_volume::testing::{FakePods, FakeRecorder, pod_with_volumes};
use tokio_util::sync::CancellationToken;

fn volumes(root: &Path, i: usize) -> Vec<Volume> {
    vec![
        Volume {
            name: "disk".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        Volume {
            name: "mem".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "host".into(),
            host_path: Some(HostPathVolumeSource {
                path: root
                    .join(format!("host/{i}"))
                    .to_string_lossy()
                    .into_owned(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Default::default()
        },
    ]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.4} ms", d.as_secs_f64() * 1e3)
}

struct Agent {
    manager: Arc<VolumeManager>,
    pods: Arc<FakePods>,
    cancel: CancellationToken,
}

fn agent(root: &Path, resync: Duration) -> Agent {
    let pods = Arc::new(FakePods::default());
    let deps = VolumeManagerDeps {
        pods: pods.clone(),
        states: pods.clone(),
        mounter: Arc::new(LinuxMounter::new()),
        plugins: builtin_plugins(),
        events: Arc::new(FakeRecorder::default()),
        node: Arc::new(rustlet_volume::node::NothingAttached),
        objects: None,
    };
    let config = VolumeManagerConfig {
        resync_period: resync,
        node_allocatable_memory: Some(64 << 20),
        ..VolumeManagerConfig::new(root)
    };
    let manager = Arc::new(VolumeManager::new(deps, config));
    let cancel = CancellationToken::new();
    tokio::spawn(manager.clone().run(cancel.clone()));
    Agent {
        manager,
        pods,
        cancel,
    }
}

async fn latency(root: &Path, disk: &str) {
    const PODS: usize = 200;
    let a = agent(&root.join("event"), Duration::from_secs(1));
    let mut samples = Vec::with_capacity(PODS);
    let floor_base = same_work_base(root, "latency-floor");
    let hopped_base = Arc::new(same_work_base(root, "latency-hopped"));
    let mut floor = Vec::with_capacity(PODS);
    let mut hopped = Vec::with_capacity(PODS);
    let mut hops = Vec::with_capacity(PODS);
    for i in 0..PODS {
        let pod = pod_with_volumes(&format!("lat-{i}"), volumes(root, i));
        let start = Instant::now();
        a.pods.add(pod.clone());
        a.manager.pod_updated();
        a.manager.wait_for_attach_and_mount(&pod).await.unwrap();
        samples.push(start.elapsed());
        // The same pod's syscall floor, right after, so both see the same disk state.
        let start = Instant::now();
        let mem = same_work_one(&floor_base, i);
        floor.push(start.elapsed());
        umount2(&mem, MntFlags::empty()).unwrap();
        // The same syscalls behind the agent's hand-offs and nothing else: the caller wakes a
        // runtime task, which hands them to a blocking thread, whose answer wakes the task,
        // whose end wakes the caller.
        let base = hopped_base.clone();
        let start = Instant::now();
        let mem = tokio::spawn(async move {
            tokio::task::spawn_blocking(move || same_work_one(&base, i))
                .await
                .unwrap()
        })
        .await
        .unwrap();
        hopped.push(start.elapsed());
        umount2(&mem, MntFlags::empty()).unwrap();
        // Those hand-offs alone.
        let start = Instant::now();
        tokio::spawn(async move {
            tokio::task::spawn_blocking(move || std::hint::black_box(i))
                .await
                .unwrap()
        })
        .await
        .unwrap();
        hops.push(start.elapsed());
    }
    samples.sort();
    floor.sort();
    hopped.sort();
    hops.sort();
    a.cancel.cancel();

    // Upstream's shape: nobody tells the manager about the pod (the populator finds it on its
    // 100 ms loop) and the waiter polls every 300 ms.
    const POLLED: usize = 20;
    let b = agent(&root.join("polled"), Duration::from_millis(100));
    let mut polled = Vec::with_capacity(POLLED);
    for i in 0..POLLED {
        let pod = pod_with_volumes(&format!("poll-{i}"), volumes(root, 1000 + i));
        let start = Instant::now();
        b.pods.add(pod.clone());
        let name = UniquePodName::new(format!("poll-{i}"));
        loop {
            if b.manager.get_mounted_volumes_for_pod(&name).len() == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        polled.push(start.elapsed());
    }
    polled.sort();
    b.cancel.cancel();
    println!(
        "\n1. pod added -> wait_for_attach_and_mount returns (emptyDir + Memory emptyDir + hostPath), root dir on {disk}"
    );
    println!("| shape | pods | median | p99 |");
    println!("|---|---|---|---|");
    println!(
        "| rustlet, event-driven | {PODS} | {} | {} |",
        ms(percentile(&samples, 0.5)),
        ms(percentile(&samples, 0.99))
    );
    println!(
        "| floor: the same syscalls, raw, right after each pod | {PODS} | {} | {} |",
        ms(percentile(&floor, 0.5)),
        ms(percentile(&floor, 0.99))
    );
    println!(
        "| the same syscalls behind the agent's 4 hand-offs (caller → task → blocking thread → task → caller) | {PODS} | {} | {} |",
        ms(percentile(&hopped, 0.5)),
        ms(percentile(&hopped, 0.99))
    );
    println!(
        "| those 4 hand-offs alone | {PODS} | {} | {} |",
        ms(percentile(&hops, 0.5)),
        ms(percentile(&hops, 0.99))
    );
    println!(
        "| polling shape (100 ms loop, 300 ms poll) | {POLLED} | {} | {} |",
        ms(percentile(&polled, 0.5)),
        ms(percentile(&polled, 0.99))
    );
}

async fn many_at_once(root: &Path, count: usize) -> (Duration, Agent) {
    let a = agent(&root.join(format!("many-{count}")), Duration::from_secs(1));
    let pods: Vec<_> = (0..count)
        .map(|i| pod_with_volumes(&format!("m{count}-{i}"), volumes(root, 10_000 + count + i)))
        .collect();
    let start = Instant::now();
    for pod in &pods {
        a.pods.add(pod.clone());
    }
    a.manager.pod_updated();
    for pod in &pods {
        a.manager.wait_for_attach_and_mount(pod).await.unwrap();
    }
    (start.elapsed(), a)
}

fn tmpfs_floor(root: &Path, count: usize) -> Duration {
    let dirs: Vec<_> = (0..count)
        .map(|i| root.join(format!("floor-{count}/{i}")))
        .collect();
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    let start = Instant::now();
    for d in &dirs {
        mount(
            Some("tmpfs"),
            d,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=777"),
        )
        .unwrap();
    }
    let elapsed = start.elapsed();
    for d in &dirs {
        umount2(d, MntFlags::empty()).unwrap();
    }
    elapsed
}

/// The syscall floor of one pod's three volumes: what they need at least, done sequentially
/// with raw calls and no bookkeeping: the 10 directories of the pod and its hostPath
/// (`pods/<uid>/{volumes,plugins}/kubernetes.io~empty-dir/{disk,mem}`), the tmpfs mount, the
/// two chmods to 0777 (V84) and the two emptyDir `ready` markers. Returns the tmpfs.
fn same_work_one(base: &Path, i: usize) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let pod = base.join(format!("pods/uid-{i}"));
    let volumes = pod.join("volumes/kubernetes.io~empty-dir");
    let plugins = pod.join("plugins/kubernetes.io~empty-dir");
    for d in [
        pod.clone(),
        pod.join("volumes"),
        volumes.clone(),
        volumes.join("disk"),
        volumes.join("mem"),
        pod.join("plugins"),
        plugins.clone(),
        plugins.join("disk"),
        plugins.join("mem"),
        base.join(format!("host/{i}")),
    ] {
        std::fs::create_dir(&d).unwrap();
    }
    let mem = volumes.join("mem");
    mount(
        Some("tmpfs"),
        &mem,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=777"),
    )
    .unwrap();
    for v in ["disk", "mem"] {
        std::fs::set_permissions(volumes.join(v), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::File::create(plugins.join(v).join("ready")).unwrap();
    }
    mem
}

/// The *minimal* floor of [`same_work_floor`]'s layout (issue 29): for each pod exactly the
/// syscalls the kubelet's directory layout needs, each directory made once with `mkdirat`
/// relative to held directory fds (`pods/` and `host/`, opened once), one `mount(2)` for the
/// tmpfs (with the size V85 gives it), one `fchmodat` to 0777 (V84: the disk emptyDir; the tmpfs root is the kernel's
/// 1777 already) and the two `ready` markers made with `mknodat` (one syscall each, no
/// open/close), sequentially. 14 syscalls a pod. Returns the wall and the CPU time.
fn minimal_floor(root: &Path, count: usize) -> (Duration, Duration) {
    let layout = MinimalLayout::new(root, &format!("minimal-{count}"));
    let mut mounts = Vec::with_capacity(count);
    let mut path = String::with_capacity(128);
    let cpu = cpu_time();
    let start = Instant::now();
    for i in 0..count {
        mounts.push(layout.pod(i, &mut path));
    }
    let elapsed = (start.elapsed(), cpu_time() - cpu);
    for d in &mounts {
        umount2(d, MntFlags::empty()).unwrap();
    }
    elapsed
}

/// The minimal floor's syscalls issued the way the agent issues them: every pod at once, each
/// pod's syscalls in one blocking-pool hop (the runtime's 32 blocking threads), awaited by the
/// async side. What a concurrent agent cannot go below on this machine: the kernel's
/// serialisation (the mount lock, the parent directories' locks) and the hand-offs between
/// threads, without any bookkeeping. Returns the wall and the CPU time.
async fn minimal_concurrent_floor(root: &Path, count: usize) -> (Duration, Duration) {
    let layout = Arc::new(MinimalLayout::new(
        root,
        &format!("minimal-concurrent-{count}"),
    ));
    let cpu = cpu_time();
    let start = Instant::now();
    let hops: Vec<_> = (0..count)
        .map(|i| {
            let layout = layout.clone();
            tokio::task::spawn_blocking(move || layout.pod(i, &mut String::with_capacity(128)))
        })
        .collect();
    let mut mounts = Vec::with_capacity(count);
    for hop in hops {
        mounts.push(hop.await.unwrap());
    }
    let elapsed = (start.elapsed(), cpu_time() - cpu);
    for d in &mounts {
        umount2(d, MntFlags::empty()).unwrap();
    }
    elapsed
}

/// The hand-offs of [`minimal_concurrent_floor`] alone: one empty blocking-pool hop per pod,
/// all at once.
async fn hops_alone(count: usize) -> Duration {
    let start = Instant::now();
    let hops: Vec<_> = (0..count)
        .map(|i| tokio::task::spawn_blocking(move || std::hint::black_box(i)))
        .collect();
    for hop in hops {
        hop.await.unwrap();
    }
    start.elapsed()
}

/// Directory fds held for the minimal floors (`pods/` and `host/` of a fresh base).
struct MinimalLayout {
    pods: std::os::fd::OwnedFd,
    host: std::os::fd::OwnedFd,
    pods_path: PathBuf,
}

impl MinimalLayout {
    fn new(root: &Path, name: &str) -> Self {
        use nix::fcntl::{OFlag, open};
        use nix::sys::stat::Mode;
        let base = same_work_base(root, name);
        let dir = |p: PathBuf| {
            open(
                &p,
                OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .unwrap()
        };
        Self {
            pods: dir(base.join("pods")),
            host: dir(base.join("host")),
            pods_path: base.join("pods"),
        }
    }

    /// Pod `i`'s 14 syscalls; returns its tmpfs.
    fn pod(&self, i: usize, path: &mut String) -> PathBuf {
        use nix::sys::stat::{FchmodatFlags, Mode, SFlag, fchmodat, mkdirat, mknodat};
        use std::os::unix::ffi::OsStrExt;
        let all = Mode::from_bits_truncate(0o777);
        let file = Mode::from_bits_truncate(0o644);
        let uid = format!("uid-{i}");
        let sub = |path: &mut String, rest: &str| {
            path.clear();
            path.push_str(&uid);
            path.push_str(rest);
        };
        for rest in [
            "",
            "/volumes",
            "/volumes/kubernetes.io~empty-dir",
            "/volumes/kubernetes.io~empty-dir/disk",
            "/volumes/kubernetes.io~empty-dir/mem",
            "/plugins",
            "/plugins/kubernetes.io~empty-dir",
            "/plugins/kubernetes.io~empty-dir/disk",
            "/plugins/kubernetes.io~empty-dir/mem",
        ] {
            sub(path, rest);
            mkdirat(&self.pods, path.as_str(), all).unwrap();
        }
        mkdirat(
            &self.host,
            i.to_string().as_str(),
            Mode::from_bits_truncate(0o755),
        )
        .unwrap();
        sub(path, "/volumes/kubernetes.io~empty-dir/disk");
        fchmodat(&self.pods, path.as_str(), all, FchmodatFlags::FollowSymlink).unwrap();
        let mem = self
            .pods_path
            .join(&uid)
            .join("volumes/kubernetes.io~empty-dir/mem");
        mount(
            Some("tmpfs"),
            mem.as_os_str().as_bytes(),
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            // V85: the size the agent gives it (the bench's node allocatable memory).
            Some("size=67108864"),
        )
        .unwrap();
        for v in ["disk", "mem"] {
            sub(path, "/plugins/kubernetes.io~empty-dir/");
            path.push_str(v);
            path.push_str("/ready");
            mknodat(&self.pods, path.as_str(), SFlag::S_IFREG, file, 0).unwrap();
        }
        mem
    }
}

/// A fresh base directory for [`same_work_one`].
fn same_work_base(root: &Path, name: &str) -> PathBuf {
    let base = root.join(name);
    std::fs::create_dir_all(base.join("pods")).unwrap();
    std::fs::create_dir_all(base.join("host")).unwrap();
    base
}

/// [`same_work_one`] for `count` pods in a row.
fn same_work_floor(root: &Path, count: usize) -> Duration {
    let base = same_work_base(root, &format!("same-{count}"));
    let start = Instant::now();
    let mounts: Vec<PathBuf> = (0..count).map(|i| same_work_one(&base, i)).collect();
    let elapsed = start.elapsed();
    for d in &mounts {
        umount2(d, MntFlags::empty()).unwrap();
    }
    elapsed
}

/// The process's CPU time (user + system, all threads), microsecond resolution.
fn cpu_time() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let d = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    d(u.user_time()) + d(u.system_time())
}

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

async fn steady_state_pass(root: &Path) {
    const PODS: usize = 1000;
    let plugins = builtin_plugins();
    let host = VolumeHost {
        root_dir: root.join("steady"),
        mounter: Arc::new(FakeMounter::new()),
        node_allocatable_memory: None,
    };
    let dsw = Arc::new(DesiredStateOfWorld::new(plugins.clone()));
    let asw = Arc::new(ActualStateOfWorld::new(plugins.clone()));
    let executor = Arc::new(OperationExecutor::new(
        asw.clone(),
        plugins.clone(),
        host,
        Arc::new(FakeRecorder::default()),
    ));
    let reconciler = Reconciler::new(
        dsw.clone(),
        asw.clone(),
        executor.clone(),
        Arc::new(AtomicBool::new(true)),
    );
    for i in 0..PODS {
        let vols: Vec<Volume> = (0..5)
            .map(|v| Volume {
                name: format!("v{v}"),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            })
            .collect();
        let pod = pod_with_volumes(&format!("s-{i}"), vols.clone());
        for v in vols {
            let name = v.name.clone();
            dsw.add_pod_to_volume(
                &UniquePodName::new(format!("s-{i}")),
                pod.clone(),
                rustlet_volume::VolumeSpec::pod(v),
                &name,
            )
            .unwrap();
        }
    }
    // At most `MAX_OPERATIONS_IN_FLIGHT` start per pass: pass until all are mounted.
    while reconciler.reconcile().mounts > 0 {
        executor.operations().wait().await;
    }
    assert_eq!(asw.mounted_volumes().len(), PODS * 5);
    let time = |f: &mut dyn FnMut()| {
        let mut samples: Vec<Duration> = (0..101)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed()
            })
            .collect();
        samples.sort();
        samples[50]
    };
    let ours = time(&mut || assert_eq!(reconciler.reconcile(), Default::default()));
    let full = time(&mut || assert_eq!(reconciler.full_pass(true), (Default::default(), true)));
    // A write to one volume (a no-op remount acknowledgement) since the last pass: the pass
    // looks at that volume only.
    let (pod0, vol0) = {
        let m = &asw.mounted_volumes()[0];
        (m.pod_name.clone(), m.volume_name.clone())
    };
    let changed = time(&mut || {
        asw.mark_remount_served(&pod0, &vol0, 0);
        assert_eq!(reconciler.reconcile(), Default::default());
        assert_eq!(
            reconciler.last_pass(),
            rustlet_volume::reconciler::PassScope::Volumes {
                looked: 1,
                again: 0
            }
        );
    });
    // Upstream's shape: copy every desired pair and every mounted volume, then compare.
    let upstream = time(&mut || {
        let mounted = asw.all_mounted_volumes();
        let stale = mounted
            .iter()
            .filter(|m| !dsw.pod_exists_in_volume(&m.pod_name, &m.volume_name))
            .count();
        let pending = dsw
            .volumes_to_mount()
            .iter()
            .filter(|v| {
                !asw.pod_exists_in_volume(&v.pod_name, &v.volume_name)
                    .is_mounted()
            })
            .count();
        assert_eq!((stale, pending), (0, 0));
    });
    println!(
        "\n3. steady-state reconcile pass, {PODS} pods x 5 volumes, nothing to do (median of 101)"
    );
    println!("| pass | median |");
    println!("|---|---|");
    println!(
        "| rustlet, nothing changed since the last pass (skipped scan) | {} |",
        ms(ours)
    );
    println!(
        "| rustlet, one volume written since the last pass (looks at it alone) | {} |",
        ms(changed)
    );
    println!(
        "| rustlet, full scan (after a change of sources-ready) | {} |",
        ms(full)
    );
    println!(
        "| clone-everything shape (upstream's pass) | {} |",
        ms(upstream)
    );
    populator_passes(PODS, &time);
}

/// The populator's passes over `count` pods of 5 emptyDirs each, every one processed already
/// and nothing changed: the full pass (the volume manager's every 10th resync, the safety
/// net under the change logs) and the pass over what changed (nothing).
fn populator_passes(count: usize, time: &dyn Fn(&mut dyn FnMut()) -> Duration) {
    use rustlet_volume::populator::Populator;
    let plugins = builtin_plugins();
    let dsw = Arc::new(DesiredStateOfWorld::new(plugins.clone()));
    let asw = Arc::new(ActualStateOfWorld::new(plugins));
    let pods = Arc::new(FakePods::default());
    for i in 0..count {
        let vols = (0..5)
            .map(|v| Volume {
                name: format!("v{v}"),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            })
            .collect();
        pods.add(pod_with_volumes(&format!("p-{i}"), vols));
    }
    let populator = Populator::new(dsw.clone(), asw, pods.clone(), pods);
    populator.populate();
    assert_eq!(dsw.pods().len(), count);
    let full = time(&mut || populator.populate());
    let changed = time(&mut || populator.populate_changed());
    assert_eq!(dsw.pods().len(), count);
    println!(
        "\n4. populator passes, {count} pods x 5 volumes, every pod processed, nothing changed (median of 101)"
    );
    println!("| pass | median | per pod |");
    println!("|---|---|---|");
    for (name, d) in [
        ("full (every pod)", full),
        ("what changed (nothing)", changed),
    ] {
        println!(
            "| {name} | {} | {:.2} us |",
            ms(d),
            d.as_secs_f64() * 1e6 / count as f64
        );
    }
}

/// Which sections run: all by default, or those named after `--` (`pass`, `latency`, `storm`;
/// `storm` includes the idle measurement).
fn wanted(section: &str) -> bool {
    let named: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| ["pass", "latency", "storm", "storm-tmpfs"].contains(&a.as_str()))
        .collect();
    named.is_empty() || named.iter().any(|a| a == section)
}

fn main() {
    let Some(dir) = privileged_dir("volume benchmarks") else {
        return;
    };
    let quick = !std::env::args().any(|a| a == "--bench");
    let root = dir.path().to_owned();
    // The agent's runtime (crates/rustlet/src/main.rs): 2 workers, 32 blocking threads.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(32)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if wanted("pass") {
            steady_state_pass(&root).await;
        }
        if quick {
            return;
        }
        // The root directory also on a tmpfs: directory creation costs ~100 times less than on
        // the disk (ext4), so the agent's own overhead shows beside the floor.
        let on_tmpfs = root.join("on-tmpfs");
        std::fs::create_dir(&on_tmpfs).unwrap();
        mount(
            Some("tmpfs"),
            &on_tmpfs,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=755"),
        )
        .unwrap();
        if wanted("latency") {
            latency(&root, "the disk").await;
            latency(&on_tmpfs, "a tmpfs").await;
        }
        if !wanted("storm") && !wanted("storm-tmpfs") {
            umount2(&on_tmpfs, MntFlags::MNT_DETACH).unwrap();
            return;
        }
        println!(
            "\n2. pods added at once, until all are mounted (each pod: 1 tmpfs, 2 directories)"
        );
        println!(
            "| root dir on | pods | rustlet | (floors: median of 3 rounds) minimal syscalls, sequential | today's floor: the same result, path-based std calls | raw tmpfs mounts alone | rustlet / minimal | rustlet / today's floor | rustlet / raw mounts | CPU time: rustlet / minimal |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        let mut keep = None;
        let mut concurrency_rows = Vec::new();
        for (disk, base) in [("a tmpfs", &on_tmpfs), ("the disk", &root)] {
            if disk == "the disk" && !wanted("storm") {
                continue;
            }
            for count in [100, 1000] {
                let cpu = cpu_time();
                let (elapsed, a) = many_at_once(base, count).await;
                let storm_cpu = cpu_time() - cpu;
                // Each floor three times, the order rotated round by round (a floor's
                // unmounts leave deferred work to whichever runs next): the medians.
                let mut rounds: [Vec<Duration>; 3] = Default::default();
                let mut minimal_cpu = Vec::new();
                for round in 0..3 {
                    for k in 0..3 {
                        let which = (round + k) % 3;
                        let name = format!("{round}");
                        let base = base.join(format!("floors-{count}-{which}-{name}"));
                        std::fs::create_dir(&base).unwrap();
                        let wall = match which {
                            0 => {
                                let (wall, cpu) = minimal_floor(&base, count);
                                minimal_cpu.push(cpu);
                                wall
                            }
                            1 => same_work_floor(&base, count),
                            _ => tmpfs_floor(&base, count),
                        };
                        rounds[which].push(wall);
                    }
                }
                let [minimal, same, floor] = rounds.map(|mut r| {
                    r.sort();
                    r[1]
                });
                let ratio = |d: Duration| elapsed.as_secs_f64() / d.as_secs_f64();
                minimal_cpu.sort();
                println!(
                    "| {disk} | {count} | {} | {} | {} | {} | {:.2}x | {:.2}x | {:.1}x | {} / {} = {:.2}x |",
                    ms(elapsed),
                    ms(minimal),
                    ms(same),
                    ms(floor),
                    ratio(minimal),
                    ratio(same),
                    ratio(floor),
                    ms(storm_cpu),
                    ms(minimal_cpu[1]),
                    storm_cpu.as_secs_f64() / minimal_cpu[1].as_secs_f64()
                );
                // The concurrency floor: the minimal syscalls as the agent issues them, and
                // the hand-offs alone; three rounds, medians.
                let mut concurrent = Vec::new();
                let mut concurrent_cpu = Vec::new();
                let mut hops = Vec::new();
                for round in 0..3 {
                    let base = base.join(format!("concurrent-{count}-{round}"));
                    std::fs::create_dir(&base).unwrap();
                    let (wall, cpu) = minimal_concurrent_floor(&base, count).await;
                    concurrent.push(wall);
                    concurrent_cpu.push(cpu);
                    hops.push(hops_alone(count).await);
                }
                for v in [&mut concurrent, &mut concurrent_cpu, &mut hops] {
                    v.sort();
                }
                concurrency_rows.push(format!(
                    "| {disk} | {count} | {} | {} | {} | {} | {:.2}x | {:.2}x | {:.2}x | {} / {} = {:.2}x |",
                    ms(elapsed),
                    ms(minimal),
                    ms(concurrent[1]),
                    ms(hops[1]),
                    concurrent[1].as_secs_f64() / minimal.as_secs_f64(),
                    ratio(concurrent[1]),
                    (concurrent[1].as_secs_f64() + hops[1].as_secs_f64()) / minimal.as_secs_f64(),
                    ms(storm_cpu),
                    ms(concurrent_cpu[1]),
                    storm_cpu.as_secs_f64() / concurrent_cpu[1].as_secs_f64()
                ));
                if count == 1000 && disk == "the disk" {
                    keep = Some(a);
                } else {
                    a.cancel.cancel();
                }
            }
        }
        println!(
            "\n2b. the concurrency floor: the minimal syscalls issued as the agent issues them (every pod at once, one blocking-pool hop each), beside the storm of table 2"
        );
        println!(
            "| root dir on | pods | rustlet | minimal, sequential | minimal, concurrent (median of 3) | empty hops alone | concurrent / sequential | rustlet / concurrent | (concurrent + hops) / sequential | CPU time: rustlet / concurrent |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for row in concurrency_rows {
            println!("{row}");
        }
        let Some(a) = keep else {
            umount2(&on_tmpfs, MntFlags::MNT_DETACH).unwrap();
            return;
        };
        let before = cpu_seconds();
        tokio::time::sleep(Duration::from_secs(60)).await;
        let used = cpu_seconds() - before;
        println!("\n4. idle with 1000 pods mounted: {used:.2} CPU seconds over 60 s");
        a.cancel.cancel();
        umount2(&on_tmpfs, MntFlags::MNT_DETACH).unwrap();
    });
}
