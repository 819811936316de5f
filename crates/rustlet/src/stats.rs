//! The summary provider (upstream: `pkg/kubelet/server/stats/summary.go` over the CRI stats
//! provider): `/stats/summary`'s document made of the node's cgroup figures
//! (`rustlet_server::stats::cgroup`), the agent root's filesystem and PID figures (the node
//! status's `HostMachine`), the runtime's pod and container figures (`Runtime::pod_usage`,
//! CRI), the image filesystem (`Runtime::image_fs_usage`) and the pods' volumes
//! (`rustlet_volume::usage`).

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
use rustlet_server::stats::cgroup::{CpuRates, CpuReading, NodeReader, StatsRoots};
use rustlet_server::stats::summary::{
    ContainerStats, CpuStats, FsStats, MemoryStats, NodeStats, PodReference, PodStats,
    PvcReference, RlimitStats, RuntimeStats, Summary, SwapStats, VolumeStats,
};
use rustlet_volume::manager::VolumeManager;
use rustlet_volume::usage::{UsageMethod, measure};

/// The cache key of the node's CPU reading.
const NODE_KEY: &str = "/";

/// What the summary is made of.
pub struct StatsProvider {
    node_name: String,
    node: NodeReader,
    rates: CpuRates,
    machine: HostMachine,
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
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn cpu_stats(cpu: &CpuUsage, nano_cores: Option<u64>) -> CpuStats {
    CpuStats {
        time: Time(cpu.at),
        usage_nano_cores: cpu.usage_nano_cores.or(nano_cores),
        usage_core_nano_seconds: cpu.usage_core_nanos,
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

impl StatsProvider {
    /// A provider over `deps`.
    pub fn new(deps: StatsDeps) -> Self {
        Self {
            machine: HostMachine::new(&deps.root_dir),
            node_name: deps.node_name,
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

    /// upstream: `SummaryProvider.Get` (`only_cpu_and_memory`: `GetCPUAndMemoryStats`).
    pub async fn summary(&self, only_cpu_and_memory: bool) -> Result<Summary, String> {
        let full = !only_cpu_and_memory;
        let at = now();
        let reader = self.node.clone();
        let (sample, boot) =
            tokio::task::spawn_blocking(move || (reader.read(), reader.boot_time()))
                .await
                .map_err(|e| format!("reading the node's cgroup: {e}"))?;
        let sample = sample.map_err(|e| format!("failed to get root cgroup stats: {e}"))?;
        let node_cpu = CpuUsage {
            at,
            usage_core_nanos: Some(sample.cpu_usage_core_nanos),
            usage_nano_cores: None,
        };
        let memory = sample.memory;
        let mut node = NodeStats {
            node_name: self.node_name.clone(),
            start_time: Time(boot.unwrap_or(Timestamp::UNIX_EPOCH)),
            cpu: Some(cpu_stats(
                &node_cpu,
                self.nano_cores(NODE_KEY, &node_cpu, full),
            )),
            memory: Some(MemoryStats {
                time: Time(at),
                available_bytes: Some(memory.available()),
                usage_bytes: Some(memory.usage),
                working_set_bytes: Some(memory.working_set),
                rss_bytes: Some(memory.rss),
                page_faults: Some(memory.page_faults),
                major_page_faults: Some(memory.major_page_faults),
            }),
            swap: memory.swap_usage.map(|usage| SwapStats {
                time: Time(at),
                swap_available_bytes: memory.swap_available,
                swap_usage_bytes: Some(usage),
            }),
            ..NodeStats::default()
        };
        if full {
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
                Ok(filesystems) => filesystems.first().map(|fs| RuntimeStats {
                    image_fs: Some(runtime_fs(fs)),
                    container_fs: None,
                }),
                Err(RuntimeError::Unsupported { .. }) => None,
                Err(e) => {
                    tracing::debug!(error = %e, "image filesystem stats");
                    None
                }
            };
        }
        let usage = match self.runtime.pod_usage().await {
            Ok(pods) => pods,
            // The simulated runtime runs no processes: no pod figures.
            Err(RuntimeError::Unsupported { .. }) => Vec::new(),
            Err(e) => return Err(format!("failed to list pod stats: {e}")),
        };
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
            pods.push(self.pod_stats(pod, spec, full).await);
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

    async fn container_stats(&self, c: &ContainerUsage, full: bool) -> ContainerStats {
        let logs = if full {
            self.log_stats(&c.id).await
        } else {
            None
        };
        ContainerStats {
            name: c.name.clone(),
            start_time: Time(c.created_at),
            cpu: c
                .cpu
                .as_ref()
                .map(|cpu| cpu_stats(cpu, self.nano_cores(&c.id, cpu, full))),
            memory: c.memory.as_ref().map(memory_stats),
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

    async fn pod_stats(&self, pod: PodUsage, spec: Option<Arc<Pod>>, full: bool) -> PodStats {
        let mut containers = Vec::with_capacity(pod.containers.len());
        for c in &pod.containers {
            containers.push(self.container_stats(c, full).await);
        }
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
            cpu: pod.cpu.as_ref().map(|cpu| {
                cpu_stats(
                    cpu,
                    self.nano_cores(&format!("pod:{}", pod.uid.as_str()), cpu, full),
                )
            }),
            memory: pod.memory.as_ref().map(memory_stats),
            network: None,
            volume_stats: volume_stats.into_iter().map(|(v, _)| v).collect(),
            ephemeral_storage,
            process_stats: None,
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
