//! The summary provider (upstream: `pkg/kubelet/server/stats/summary.go` over the CRI stats
//! provider): `/stats/summary`'s document made of the node's cgroup figures
//! (`rustlet_server::stats::cgroup`), the agent root's filesystem and PID figures (the node
//! status's `HostMachine`), the runtime's pod and container figures (`Runtime::pod_usage`,
//! CRI), the image filesystem (`Runtime::image_fs_usage`) and the pods' volumes
//! (`rustlet_volume::usage`).
//!
//! As upstream's CRI stats provider overlays cAdvisor's figures, the containers' and pods'
//! CPU, memory, pressure and process figures are read from their cgroups where they are found
//! (a directory named after the container's ID or `pod<uid>`, as cAdvisor finds them), and the
//! pods' network from their sandbox's network namespace; the CRI's figures stay where no cgroup
//! is found. The system containers (`kubelet`, `runtime`, `misc`, `pods`) are read from their
//! cgroups as upstream's `GetSystemContainersStats`.
//!
//! Deviations: the `kubelet` container, without `kubeletCgroups`, is the agent's own cgroups
//! per hierarchy (upstream's `getContainer` refuses a process whose cpu and memory cgroups
//! differ); pressure is also read from a hybrid host's unified hierarchy (upstream: cgroup v2
//! only); the agent moves itself into `kubeletCgroups` once at start (upstream: periodically,
//! with its OOM score) and moves nothing into `systemCgroups` (upstream moves the root
//! cgroup's non-kernel processes there), which it only reads.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use rustlet_api::PodCache;
use rustlet_api::node::machine::{HostMachine, Machine as _};
use rustlet_core::{PodUid, UniquePodName};
use rustlet_pods::Runtime;
use rustlet_pods::runtime::{
    ContainerUsage, CpuUsage, FsUsage, MemoryUsage, PodUsage, RuntimeError,
};
use rustlet_server::metrics::cadvisor::{
    CadvisorContainer, Machine as CadvisorMachine, RootFigures, RootFs, cadvisor_metrics,
};
use rustlet_server::stats::cgroup::{
    CgroupPaths, CgroupSample, CpuRates, CpuReading, NodeReader, Pressures, StatsRoots,
};
use rustlet_server::stats::summary::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, IoStats, MemoryStats, NetworkStats,
    NodeStats, PodReference, PodStats, ProcessStats, PvcReference, RlimitStats, RuntimeStats,
    Summary, SwapStats, VolumeStats,
};
use rustlet_volume::manager::VolumeManager;
use rustlet_volume::usage::{UsageMethod, measure};

/// The cache key of the node's CPU reading.
const NODE_KEY: &str = "/";

/// The cgroups of the summary's system containers (upstream `NodeConfig`'s
/// `KubeletCgroupsName`, `RuntimeCgroupsName`, `SystemCgroupsName` and `GetPodCgroupRoot`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SystemCgroups {
    /// `kubeletCgroups`; `None`: the agent's own cgroups, read each time.
    pub kubelet: Option<String>,
    /// `runtimeCgroups`; `None`: no `runtime` container.
    pub runtime: Option<String>,
    /// `systemCgroups`; `None`: no `misc` container.
    pub misc: Option<String>,
    /// The pods' cgroup: `<cgroupRoot>/kubepods` with `cgroupsPerQOS`, else the root `/`.
    pub pods: String,
}

/// The default interface of a pod's or the node's network (upstream
/// `defaultNetworkInterfaceName`).
const DEFAULT_INTERFACE: &str = "eth0";

/// What one blocking pass over the cgroup tree and procfs read.
#[derive(Default)]
struct CgroupFigures {
    /// The system containers by their summary names.
    system: Vec<(&'static str, CgroupSample)>,
    /// The containers' cgroups by their raw IDs, the pods' by `pod<uid>`.
    workloads: HashMap<String, CgroupSample>,
    /// The sandboxes' interfaces by sandbox ID.
    sandbox_networks: HashMap<String, Vec<InterfaceStats>>,
    /// The node's (the agent's namespace's) interfaces.
    node_network: Vec<InterfaceStats>,
    /// The node's pressures.
    node_pressure: Pressures,
}

/// A network's figures: the default interface inline (empty when absent), all listed.
fn network_stats(at: Timestamp, interfaces: Vec<InterfaceStats>) -> Option<NetworkStats> {
    if interfaces.is_empty() {
        return None;
    }
    Some(NetworkStats {
        time: Time(at),
        default_interface: interfaces
            .iter()
            .find(|i| i.name == DEFAULT_INTERFACE)
            .cloned()
            .unwrap_or_default(),
        interfaces,
    })
}

/// A cgroup's CPU (upstream `cadvisorInfoToCPUandMemoryStats`; no rate yet reads as 0).
fn cgroup_cpu(sample: &CgroupSample, at: Timestamp, nano_cores: Option<u64>) -> CpuStats {
    CpuStats {
        time: Time(at),
        usage_nano_cores: Some(nano_cores.unwrap_or(0)),
        usage_core_nano_seconds: Some(sample.cpu_usage_core_nanos),
        psi: sample.pressure.cpu,
    }
}

/// A cgroup's memory; `availableBytes` only under a limit.
fn cgroup_memory(sample: &CgroupSample, at: Timestamp) -> MemoryStats {
    let m = &sample.memory;
    MemoryStats {
        time: Time(at),
        available_bytes: m.available(),
        usage_bytes: Some(m.usage),
        working_set_bytes: Some(m.working_set),
        rss_bytes: Some(m.rss),
        page_faults: Some(m.page_faults),
        major_page_faults: Some(m.major_page_faults),
        psi: sample.pressure.memory,
    }
}

/// A cgroup's IO: its pressure, none without it.
fn cgroup_io(pressure: &Pressures, at: Timestamp) -> Option<IoStats> {
    pressure.io.map(|psi| IoStats {
        time: Time(at),
        psi: Some(psi),
    })
}

/// Upstream `addPodCPUMemoryStats` without the pod's cgroup: the containers' figures summed.
fn sum_containers(containers: &[ContainerStats], at: Timestamp) -> (CpuStats, MemoryStats) {
    let mut cpu = CpuStats {
        time: Time(at),
        usage_nano_cores: Some(0),
        usage_core_nano_seconds: Some(0),
        psi: None,
    };
    let mut memory = MemoryStats {
        time: Time(at),
        available_bytes: Some(0),
        usage_bytes: Some(0),
        working_set_bytes: Some(0),
        rss_bytes: Some(0),
        page_faults: Some(0),
        major_page_faults: Some(0),
        psi: None,
    };
    let add = |a: &mut Option<u64>, b: Option<u64>| *a = Some(a.unwrap_or(0) + b.unwrap_or(0));
    for c in containers {
        if let Some(c) = &c.cpu {
            add(&mut cpu.usage_nano_cores, c.usage_nano_cores);
            add(&mut cpu.usage_core_nano_seconds, c.usage_core_nano_seconds);
        }
        if let Some(m) = &c.memory {
            add(&mut memory.available_bytes, m.available_bytes);
            add(&mut memory.usage_bytes, m.usage_bytes);
            add(&mut memory.working_set_bytes, m.working_set_bytes);
            add(&mut memory.rss_bytes, m.rss_bytes);
            add(&mut memory.page_faults, m.page_faults);
            add(&mut memory.major_page_faults, m.major_page_faults);
        }
    }
    (cpu, memory)
}

/// The raw ID of a `<runtime>://<id>` container ID.
fn raw_id(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, raw)| raw)
}

/// What the summary is made of.
pub struct StatsProvider {
    node_name: String,
    system: SystemCgroups,
    started_at: Timestamp,
    node: NodeReader,
    rates: CpuRates,
    machine: HostMachine,
    /// The agent's root directory (the root container's filesystem in `/metrics/cadvisor`).
    root_dir: PathBuf,
    runtime: Arc<dyn Runtime>,
    pods: Arc<PodCache>,
    volumes: Arc<VolumeManager>,
}

/// The summary provider's dependencies.
pub struct StatsDeps {
    /// The node's name.
    pub node_name: String,
    /// The agent's root directory (`nodefs`).
    pub root_dir: PathBuf,
    /// Where the cgroup tree and procfs are.
    pub roots: StatsRoots,
    /// The runtime.
    pub runtime: Arc<dyn Runtime>,
    /// The pods (their volumes).
    pub pods: Arc<PodCache>,
    /// The volume manager (where the volumes are mounted).
    pub volumes: Arc<VolumeManager>,
    /// The system containers' cgroups.
    pub system_cgroups: SystemCgroups,
    /// When the agent started (the `kubelet` system container's start, upstream
    /// `kubeletCreationTime`).
    pub started_at: Timestamp,
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn cpu_stats(cpu: &CpuUsage, nano_cores: Option<u64>) -> CpuStats {
    CpuStats {
        time: Time(cpu.at),
        usage_nano_cores: cpu.usage_nano_cores.or(nano_cores),
        usage_core_nano_seconds: cpu.usage_core_nanos,
        psi: None,
    }
}

fn memory_stats(m: &MemoryUsage) -> MemoryStats {
    MemoryStats {
        time: Time(m.at),
        available_bytes: m.available,
        usage_bytes: m.usage,
        working_set_bytes: m.working_set,
        rss_bytes: m.rss,
        page_faults: m.page_faults,
        major_page_faults: m.major_page_faults,
        psi: None,
    }
}

/// statvfs of `path`: capacity, available, inodes, free inodes.
fn statfs(path: &std::path::Path) -> Option<(u64, u64, u64, u64)> {
    let fs = nix::sys::statvfs::statvfs(path).ok()?;
    let block = fs.fragment_size();
    Some((
        fs.blocks().saturating_mul(block),
        fs.blocks_available().saturating_mul(block),
        fs.files(),
        fs.files_free(),
    ))
}

/// A runtime filesystem use with its filesystem's capacity (upstream: the image fs's
/// `FsStats` from `ImageFsInfo` and cAdvisor's figures of its mount point).
fn runtime_fs(usage: &FsUsage) -> FsStats {
    let fs = statfs(std::path::Path::new(&usage.mountpoint));
    FsStats {
        time: Time(usage.at),
        available_bytes: fs.map(|f| f.1),
        capacity_bytes: fs.map(|f| f.0),
        used_bytes: usage.used_bytes,
        inodes_free: fs.map(|f| f.3),
        inodes: fs.map(|f| f.2),
        inodes_used: usage.inodes_used,
    }
}

/// upstream's CRI stats provider's `ImageFsStats`: the first image filesystem, which is also
/// the containers' ("we don't support separate disks yet").
fn runtime_stats(filesystems: &[FsUsage]) -> Option<RuntimeStats> {
    let image_fs = runtime_fs(filesystems.first()?);
    Some(RuntimeStats {
        container_fs: Some(image_fs.clone()),
        image_fs: Some(image_fs),
    })
}

impl StatsProvider {
    /// A provider over `deps`.
    pub fn new(deps: StatsDeps) -> Self {
        Self {
            machine: HostMachine::new(&deps.root_dir),
            root_dir: deps.root_dir,
            node_name: deps.node_name,
            system: deps.system_cgroups,
            started_at: deps.started_at,
            node: NodeReader::new(deps.roots),
            rates: CpuRates::default(),
            runtime: deps.runtime,
            pods: deps.pods,
            volumes: deps.volumes,
        }
    }

    /// `usageNanoCores` of `key`: a new rate from this reading (the full summary, which
    /// updates the cache) or the last one made (the CPU-and-memory summary). upstream:
    /// `getAndUpdateContainerUsageNanoCores` / `getContainerUsageNanoCores`.
    fn nano_cores(&self, key: &str, cpu: &CpuUsage, update: bool) -> Option<u64> {
        if !update {
            return self.rates.last(key);
        }
        let usage = cpu.usage_core_nanos?;
        self.rates.update(
            key,
            CpuReading {
                usage_core_nanos: usage,
                at: cpu.at,
            },
        )
    }

    /// `usageNanoCores` of a cgroup reading under `key` (see [`Self::nano_cores`]).
    fn cgroup_nano_cores(
        &self,
        key: &str,
        sample: &CgroupSample,
        at: Timestamp,
        update: bool,
    ) -> Option<u64> {
        let cpu = CpuUsage {
            at,
            usage_core_nanos: Some(sample.cpu_usage_core_nanos),
            usage_nano_cores: None,
        };
        self.nano_cores(key, &cpu, update)
    }

    /// One blocking pass: the system containers', the pods' and containers' cgroups, the
    /// sandboxes' and the node's networks, the node's pressures.
    fn read_cgroups(
        reader: &NodeReader,
        system: &SystemCgroups,
        pods: &[PodUsage],
    ) -> CgroupFigures {
        let mut out = CgroupFigures {
            node_pressure: reader.node_pressure(),
            node_network: reader
                .process_interfaces(std::process::id())
                .unwrap_or_default(),
            ..CgroupFigures::default()
        };
        let kubelet = match &system.kubelet {
            Some(name) => Some(CgroupPaths::uniform(name)),
            None => reader.process_cgroups(std::process::id()).ok(),
        };
        let named = [
            ("kubelet", kubelet),
            (
                "runtime",
                system.runtime.as_deref().map(CgroupPaths::uniform),
            ),
            ("misc", system.misc.as_deref().map(CgroupPaths::uniform)),
            ("pods", Some(CgroupPaths::uniform(&system.pods))),
        ];
        for (name, paths) in named {
            let Some(paths) = paths else { continue };
            match reader.read_cgroup(&paths) {
                Ok(sample) => out.system.push((name, sample)),
                // upstream: "Failed to get system container stats", and the container is left out.
                Err(error) => tracing::debug!(%error, container = name, "system container stats"),
            }
        }
        if pods.is_empty() {
            return out;
        }
        let found = reader.workload_cgroups();
        for pod in pods {
            let keys = pod
                .containers
                .iter()
                .map(|c| raw_id(&c.id).to_owned())
                .chain([format!("pod{}", pod.uid.as_str())]);
            for key in keys {
                let Some(path) = found.get(&key) else {
                    continue;
                };
                match reader.read_cgroup(&CgroupPaths::uniform(path)) {
                    Ok(sample) => {
                        out.workloads.insert(key, sample);
                    }
                    Err(error) => tracing::debug!(%error, cgroup = %path, "a workload's cgroup"),
                }
            }
            if let Some(pid) = found
                .get(&pod.sandbox_id)
                .and_then(|path| reader.first_process(path))
                && let Ok(interfaces) = reader.process_interfaces(pid)
            {
                out.sandbox_networks
                    .insert(pod.sandbox_id.clone(), interfaces);
            }
        }
        out
    }

    /// `/metrics/cadvisor` (upstream: the kubelet's cAdvisor registry): each running
    /// container's cgroup as cAdvisor reads it, its writable layer, and the machine's figures.
    pub async fn cadvisor(&self) -> Result<String, String> {
        let now = now();
        let usage = match self.runtime.pod_usage().await {
            Ok(pods) => pods,
            // The simulated runtime runs no processes: no container series.
            Err(RuntimeError::Unsupported { .. }) => Vec::new(),
            Err(e) => return Err(format!("failed to list pod stats: {e}")),
        };
        let images: HashMap<(PodUid, String), String> = usage
            .iter()
            .filter_map(|pod| {
                let spec = rustlet_volume::populator::PodSource::pod(&*self.pods, &pod.uid)?;
                Some(
                    spec.spec
                        .iter()
                        .flat_map(|s| s.containers.iter())
                        .map(|c| {
                            (
                                (pod.uid.clone(), c.name.clone()),
                                c.image.clone().unwrap_or_default(),
                            )
                        })
                        .collect::<Vec<_>>(),
                )
            })
            .flatten()
            .collect();
        let reader = self.node.clone();
        let machine = self.machine.figures();
        let root_dir = self.root_dir.display().to_string();
        let root_fs = machine.root_fs;
        let (containers, root) = tokio::task::spawn_blocking(move || {
            let root = RootFigures {
                network: reader.net_devices(std::process::id()),
                disks: reader.disk_stats(),
                fs: root_fs.map(|fs| RootFs {
                    device: root_dir,
                    capacity_bytes: fs.capacity_bytes,
                    used_bytes: fs.capacity_bytes.saturating_sub(fs.available_bytes),
                    inodes: fs.inodes,
                    inodes_free: fs.inodes_free,
                }),
            };
            let found = reader.workload_cgroups();
            let mut out = Vec::new();
            for pod in &usage {
                for c in &pod.containers {
                    let Some(cgroup) = found.get(raw_id(&c.id)) else {
                        continue;
                    };
                    match reader.read_cadvisor(cgroup) {
                        Ok(sample) => out.push(CadvisorContainer {
                            namespace: pod.namespace.clone(),
                            pod: pod.name.clone(),
                            container: c.name.clone(),
                            cgroup: cgroup.clone(),
                            name: raw_id(&c.id).to_owned(),
                            image: images
                                .get(&(pod.uid.clone(), c.name.clone()))
                                .cloned()
                                .unwrap_or_default(),
                            created: Some(c.created_at),
                            sample,
                            fs_usage_bytes: c.writable_layer.as_ref().and_then(|l| l.used_bytes),
                        }),
                        Err(error) => {
                            tracing::debug!(%error, %cgroup, "a container's cgroup for /metrics/cadvisor");
                        }
                    }
                }
            }
            (out, root)
        })
        .await
        .map_err(|e| format!("reading the containers' cgroups: {e}"))?;
        let machine = CadvisorMachine {
            cpu_cores: u64::from(machine.cpus),
            memory_bytes: machine.memory_bytes,
        };
        Ok(cadvisor_metrics(&containers, &root, Some(machine), now))
    }

    /// upstream: `SummaryProvider.Get` (`only_cpu_and_memory`: `GetCPUAndMemoryStats`).
    pub async fn summary(&self, only_cpu_and_memory: bool) -> Result<Summary, String> {
        let full = !only_cpu_and_memory;
        let at = now();
        let usage = match self.runtime.pod_usage().await {
            Ok(pods) => pods,
            // The simulated runtime runs no processes: no pod figures.
            Err(RuntimeError::Unsupported { .. }) => Vec::new(),
            Err(e) => return Err(format!("failed to list pod stats: {e}")),
        };
        let reader = self.node.clone();
        let system = self.system.clone();
        let pods_read = usage.clone();
        let (sample, boot, figures) = tokio::task::spawn_blocking(move || {
            (
                reader.read(),
                reader.boot_time(),
                Self::read_cgroups(&reader, &system, &pods_read),
            )
        })
        .await
        .map_err(|e| format!("reading the node's cgroup: {e}"))?;
        let sample = sample.map_err(|e| format!("failed to get root cgroup stats: {e}"))?;
        let boot = boot.unwrap_or(Timestamp::UNIX_EPOCH);
        let node_cpu = CpuUsage {
            at,
            usage_core_nanos: Some(sample.cpu_usage_core_nanos),
            usage_nano_cores: None,
        };
        let memory = sample.memory;
        let system_containers = figures
            .system
            .iter()
            .map(|(name, s)| ContainerStats {
                name: (*name).to_owned(),
                start_time: Time(if *name == "kubelet" {
                    self.started_at
                } else {
                    s.created.unwrap_or(boot)
                }),
                cpu: Some(cgroup_cpu(
                    s,
                    at,
                    self.cgroup_nano_cores(&format!("system:{name}"), s, at, full),
                )),
                memory: Some(cgroup_memory(s, at)),
                io: full.then(|| cgroup_io(&s.pressure, at)).flatten(),
                rootfs: None,
                logs: None,
                swap: None,
            })
            .collect();
        let mut node = NodeStats {
            node_name: self.node_name.clone(),
            system_containers,
            start_time: Time(boot),
            cpu: Some(CpuStats {
                psi: figures.node_pressure.cpu,
                ..cpu_stats(&node_cpu, self.nano_cores(NODE_KEY, &node_cpu, full))
            }),
            memory: Some(MemoryStats {
                time: Time(at),
                available_bytes: Some(memory.available()),
                usage_bytes: Some(memory.usage),
                working_set_bytes: Some(memory.working_set),
                rss_bytes: Some(memory.rss),
                page_faults: Some(memory.page_faults),
                major_page_faults: Some(memory.major_page_faults),
                psi: figures.node_pressure.memory,
            }),
            swap: memory.swap_usage.map(|usage| SwapStats {
                time: Time(at),
                swap_available_bytes: memory.swap_available,
                swap_usage_bytes: Some(usage),
            }),
            ..NodeStats::default()
        };
        if full {
            node.io = cgroup_io(&figures.node_pressure, at);
            node.network = network_stats(at, figures.node_network.clone());
            let figures = self.machine.figures();
            // Deviation: used is capacity minus available (upstream: capacity minus free; the
            // difference is the root-reserved blocks).
            node.fs = figures.root_fs.map(|fs| FsStats {
                time: Time(at),
                available_bytes: Some(fs.available_bytes),
                capacity_bytes: Some(fs.capacity_bytes),
                used_bytes: Some(fs.capacity_bytes.saturating_sub(fs.available_bytes)),
                inodes_free: Some(fs.inodes_free),
                inodes: Some(fs.inodes),
                inodes_used: Some(fs.inodes.saturating_sub(fs.inodes_free)),
            });
            node.rlimit = figures.pids.map(|p| RlimitStats {
                time: Time(at),
                max_pid: i64::try_from(p.max).ok(),
                num_of_running_processes: i64::try_from(p.running).ok(),
            });
            node.runtime = match self.runtime.image_fs_usage().await {
                Ok(filesystems) => runtime_stats(&filesystems),
                Err(RuntimeError::Unsupported { .. }) => None,
                Err(e) => {
                    tracing::debug!(error = %e, "image filesystem stats");
                    None
                }
            };
        }
        if full {
            self.rates.forget_older_than_period(at);
        }
        let specs: HashMap<PodUid, Arc<Pod>> = self
            .pods
            .pods()
            .into_iter()
            .map(|p| (PodUid::of(&p), p))
            .collect();
        let mut pods = Vec::with_capacity(usage.len());
        for pod in usage {
            let spec = specs.get(&pod.uid).cloned();
            pods.push(self.pod_stats(pod, spec, &figures, at, full).await);
        }
        Ok(Summary { node, pods })
    }

    /// The container's log directory (its instances' log files, rotated ones too) measured
    /// (upstream: `getContainerLogStats` of the directory of CRI `ContainerStatus.log_path`);
    /// `None` when the runtime names no log file.
    async fn log_stats(&self, id: &str) -> Option<FsStats> {
        let info = self.runtime.container_log(id).await.ok()?;
        let dir = info.path.parent()?.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let usage = match measure(&dir, UsageMethod::Du) {
                Ok(usage) => usage?,
                Err(error) => {
                    tracing::debug!(%error, dir = %dir.display(), "measuring a container's logs");
                    return None;
                }
            };
            Some(FsStats {
                time: Time(now()),
                available_bytes: Some(usage.available_bytes),
                capacity_bytes: Some(usage.capacity_bytes),
                used_bytes: Some(usage.used_bytes),
                inodes_free: Some(usage.inodes_free),
                inodes: Some(usage.inodes),
                inodes_used: Some(usage.inodes_used),
            })
        })
        .await
        .ok()
        .flatten()
    }

    async fn container_stats(
        &self,
        c: &ContainerUsage,
        cgroup: Option<&CgroupSample>,
        at: Timestamp,
        full: bool,
    ) -> ContainerStats {
        let logs = if full {
            self.log_stats(&c.id).await
        } else {
            None
        };
        let (cpu, memory, io) = match cgroup {
            // upstream `addCadvisorContainerStats`: the cgroup's figures replace the CRI's.
            Some(sample) => (
                Some(cgroup_cpu(
                    sample,
                    at,
                    self.cgroup_nano_cores(&c.id, sample, at, full),
                )),
                Some(cgroup_memory(sample, at)),
                full.then(|| cgroup_io(&sample.pressure, at)).flatten(),
            ),
            None => (
                c.cpu
                    .as_ref()
                    .map(|cpu| cpu_stats(cpu, self.nano_cores(&c.id, cpu, full))),
                c.memory.as_ref().map(memory_stats),
                None,
            ),
        };
        ContainerStats {
            name: c.name.clone(),
            start_time: Time(c.created_at),
            cpu,
            memory,
            io,
            rootfs: full
                .then(|| c.writable_layer.as_ref().map(runtime_fs))
                .flatten(),
            logs,
            swap: c.swap.as_ref().map(|s| SwapStats {
                time: Time(s.at),
                swap_available_bytes: s.available,
                swap_usage_bytes: s.usage,
            }),
        }
    }

    async fn pod_stats(
        &self,
        pod: PodUsage,
        spec: Option<Arc<Pod>>,
        figures: &CgroupFigures,
        at: Timestamp,
        full: bool,
    ) -> PodStats {
        let mut containers = Vec::with_capacity(pod.containers.len());
        // upstream `addProcessStats`: the containers' cgroups' processes summed.
        let mut processes: Option<u64> = None;
        for c in &pod.containers {
            let cgroup = figures.workloads.get(raw_id(&c.id));
            if let Some(sample) = cgroup {
                processes = Some(processes.unwrap_or(0) + sample.processes);
            }
            containers.push(self.container_stats(c, cgroup, at, full).await);
        }
        let pod_key = format!("pod:{}", pod.uid.as_str());
        let (cpu, memory, io) = match figures.workloads.get(&format!("pod{}", pod.uid.as_str())) {
            Some(sample) => (
                Some(cgroup_cpu(
                    sample,
                    at,
                    self.cgroup_nano_cores(&pod_key, sample, at, full),
                )),
                Some(cgroup_memory(sample, at)),
                full.then(|| cgroup_io(&sample.pressure, at)).flatten(),
            ),
            None if processes.is_some() => {
                let (cpu, memory) = sum_containers(&containers, at);
                (Some(cpu), Some(memory), None)
            }
            None => (
                pod.cpu
                    .as_ref()
                    .map(|cpu| cpu_stats(cpu, self.nano_cores(&pod_key, cpu, full))),
                pod.memory.as_ref().map(memory_stats),
                None,
            ),
        };
        let network = full
            .then(|| {
                figures
                    .sandbox_networks
                    .get(&pod.sandbox_id)
                    .and_then(|i| network_stats(at, i.clone()))
            })
            .flatten();
        let volume_stats = match (&spec, full) {
            (Some(spec), true) => self.volume_stats(spec).await,
            _ => Vec::new(),
        };
        // upstream `calcEphemeralStorage`: the containers' writable layers and logs and the
        // pod's local (emptyDir-backed) volumes.
        let ephemeral_storage = full.then(|| {
            let mut fs = FsStats::empty(Time(now()));
            let mut used = 0u64;
            let mut inodes_used = 0u64;
            for c in &containers {
                if let Some(logs) = &c.logs {
                    used += logs.used_bytes.unwrap_or(0);
                    inodes_used += logs.inodes_used.unwrap_or(0);
                }
                if let Some(root) = &c.rootfs {
                    used += root.used_bytes.unwrap_or(0);
                    inodes_used += root.inodes_used.unwrap_or(0);
                    fs.capacity_bytes = fs.capacity_bytes.or(root.capacity_bytes);
                    fs.available_bytes = fs.available_bytes.or(root.available_bytes);
                    fs.inodes = fs.inodes.or(root.inodes);
                    fs.inodes_free = fs.inodes_free.or(root.inodes_free);
                }
            }
            for (v, local) in &volume_stats {
                if *local {
                    used += v.fs.used_bytes.unwrap_or(0);
                    inodes_used += v.fs.inodes_used.unwrap_or(0);
                }
            }
            fs.used_bytes = Some(used);
            fs.inodes_used = Some(inodes_used);
            fs
        });
        PodStats {
            pod_ref: PodReference {
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                uid: pod.uid.as_str().to_owned(),
            },
            start_time: Time(pod.created_at),
            containers,
            cpu,
            memory,
            io,
            network,
            volume_stats: volume_stats.into_iter().map(|(v, _)| v).collect(),
            ephemeral_storage,
            process_stats: full
                .then(|| {
                    processes.map(|n| ProcessStats {
                        process_count: Some(n),
                    })
                })
                .flatten(),
            swap: pod.swap.as_ref().map(|s| SwapStats {
                time: Time(s.at),
                swap_available_bytes: s.available,
                swap_usage_bytes: s.usage,
            }),
        }
    }

    /// The pod's mounted volumes measured, each with whether it is local ephemeral storage
    /// (upstream: `volumeStatCalculator.calcAndStoreStats`, synchronous here).
    async fn volume_stats(&self, pod: &Pod) -> Vec<(VolumeStats, bool)> {
        let mounted = self
            .volumes
            .get_mounted_volumes_for_pod(&UniquePodName::from(PodUid::of(pod)));
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let mut jobs = Vec::new();
        for volume in pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
        {
            let Some(info) = mounted.get(&volume.name) else {
                continue;
            };
            let method = UsageMethod::of(volume);
            let pvc_ref = volume
                .persistent_volume_claim
                .as_ref()
                .map(|c| PvcReference {
                    name: c.claim_name.clone(),
                    namespace: namespace.clone(),
                });
            jobs.push((volume.name.clone(), info.path.clone(), method, pvc_ref));
        }
        tokio::task::spawn_blocking(move || {
            jobs.into_iter()
                .filter_map(|(name, path, method, pvc_ref)| {
                    let usage = match measure(&path, method) {
                        Ok(usage) => usage?,
                        Err(error) => {
                            tracing::debug!(%error, path = %path.display(), "measuring a volume");
                            return None;
                        }
                    };
                    let fs = FsStats {
                        time: Time(now()),
                        available_bytes: Some(usage.available_bytes),
                        capacity_bytes: Some(usage.capacity_bytes),
                        used_bytes: Some(usage.used_bytes),
                        inodes_free: Some(usage.inodes_free),
                        inodes: Some(usage.inodes),
                        inodes_used: Some(usage.inodes_used),
                    };
                    let local = method == UsageMethod::Du && pvc_ref.is_none();
                    Some((VolumeStats { fs, name, pvc_ref }, local))
                })
                .collect()
        })
        .await
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> Timestamp {
        Timestamp::from_second(1_700_000_000).unwrap()
    }

    fn container(name: &str, cpu: u64, available: Option<u64>, ws: u64) -> ContainerStats {
        ContainerStats {
            name: name.into(),
            start_time: Time(at()),
            cpu: Some(CpuStats {
                time: Time(at()),
                usage_nano_cores: Some(cpu / 10),
                usage_core_nano_seconds: Some(cpu),
                psi: None,
            }),
            memory: Some(MemoryStats {
                time: Time(at()),
                available_bytes: available,
                usage_bytes: Some(ws + 1),
                working_set_bytes: Some(ws),
                rss_bytes: Some(ws / 2),
                page_faults: Some(100),
                major_page_faults: Some(1),
                psi: None,
            }),
            io: None,
            rootfs: None,
            logs: None,
            swap: None,
        }
    }

    /// upstream `addPodCPUMemoryStats` without the pod's cgroup: the containers' CPU and
    /// memory summed, `availableBytes` too (a missing one counts as 0), no pressure.
    #[test]
    fn pod_cpu_and_memory_without_its_cgroup_are_its_containers_summed() {
        let (cpu, memory) = sum_containers(
            &[
                container("a", 1000, Some(50), 20),
                container("b", 3000, None, 40),
            ],
            at(),
        );
        assert_eq!(cpu.usage_core_nano_seconds, Some(4000));
        assert_eq!(cpu.usage_nano_cores, Some(400));
        assert_eq!(cpu.psi, None);
        assert_eq!(memory.available_bytes, Some(50));
        assert_eq!(memory.working_set_bytes, Some(60));
        assert_eq!(memory.usage_bytes, Some(62));
        assert_eq!(memory.rss_bytes, Some(30));
        assert_eq!(memory.page_faults, Some(200));
        assert_eq!(memory.major_page_faults, Some(2));
    }

    fn iface(name: &str) -> InterfaceStats {
        InterfaceStats {
            name: name.into(),
            rx_bytes: Some(1),
            rx_errors: Some(0),
            tx_bytes: Some(2),
            tx_errors: Some(0),
        }
    }

    /// upstream `cadvisorInfoToNetworkStats`: `eth0` inline when there is one (else an empty
    /// name and no figures), every interface listed; no interfaces, no network.
    #[test]
    fn network_stats_put_eth0_inline_and_list_every_interface() {
        let pod = network_stats(at(), vec![iface("eth1"), iface("eth0")]).unwrap();
        assert_eq!(pod.default_interface, iface("eth0"));
        assert_eq!(pod.interfaces.len(), 2);
        let node = network_stats(at(), vec![iface("rltest0")]).unwrap();
        assert_eq!(node.default_interface, InterfaceStats::default());
        assert_eq!(node.interfaces, vec![iface("rltest0")]);
        assert_eq!(network_stats(at(), Vec::new()), None);
    }

    /// A system container of a cgroup reading: `usageNanoCores` 0 before a second reading
    /// (upstream's CPU without `CpuInst`), `availableBytes` only under a limit, the
    /// pressures carried.
    #[test]
    fn a_cgroup_reading_makes_upstreams_cpu_and_memory_stats() {
        use rustlet_server::stats::cgroup::CgroupMemory;
        use rustlet_server::stats::summary::PsiStats;
        let psi = Some(PsiStats::default());
        let sample = CgroupSample {
            cpu_usage_core_nanos: 5,
            memory: CgroupMemory {
                usage: 10,
                working_set: 8,
                limit: Some(100),
                ..CgroupMemory::default()
            },
            pressure: Pressures {
                cpu: psi,
                memory: psi,
                io: None,
            },
            ..CgroupSample::default()
        };
        let cpu = cgroup_cpu(&sample, at(), None);
        assert_eq!(
            (cpu.usage_nano_cores, cpu.usage_core_nano_seconds),
            (Some(0), Some(5))
        );
        assert_eq!(cpu.psi, psi);
        let memory = cgroup_memory(&sample, at());
        assert_eq!(memory.available_bytes, Some(92));
        assert_eq!(memory.psi, psi);
        assert_eq!(cgroup_io(&sample.pressure, at()), None);
        assert_eq!(raw_id("containerd://abc"), "abc");
        assert_eq!(raw_id("abc"), "abc");
    }

    /// upstream `ImageFsStats` of the CRI stats provider: the first image filesystem is the
    /// node's `imageFs` and its `containerFs` both (the Summary API spec wants both).
    #[test]
    fn the_image_filesystem_is_the_containers_filesystem_too() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FsUsage {
            at: at(),
            mountpoint: dir.path().display().to_string(),
            used_bytes: Some(4096),
            inodes_used: Some(3),
        };
        let stats = runtime_stats(&[fs]).unwrap();
        let image_fs = stats.image_fs.unwrap();
        assert_eq!(image_fs.used_bytes, Some(4096));
        assert!(image_fs.capacity_bytes.unwrap() > 0);
        assert_eq!(stats.container_fs, Some(image_fs));
        assert_eq!(runtime_stats(&[]), None);
    }
}
