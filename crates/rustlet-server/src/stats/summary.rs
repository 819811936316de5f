//! The `/stats/summary` document (upstream: `k8s.io/kubelet/pkg/apis/stats/v1alpha1`,
//! `Summary` and what it holds), with upstream's JSON names. Times are `metav1.Time` (whole
//! seconds in JSON; the full precision stays for `/metrics/resource`'s timestamps).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

/// upstream: `Summary`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Overall node stats.
    pub node: NodeStats,
    /// Per-pod stats.
    pub pods: Vec<PodStats>,
}

/// upstream: `NodeStats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    /// The node's name.
    pub node_name: String,
    /// Stats of system daemons tracked as raw containers (`kubelet`, `runtime`, `pods`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    /// When data collection for the node-scoped stats (re)started.
    pub start_time: Time,
    /// CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// IO (its pressure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    /// Network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// The filesystem of the agent's root directory (`nodefs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    /// The container runtime's filesystems.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    /// The PID limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
    /// Swap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
}

impl Default for NodeStats {
    fn default() -> Self {
        Self {
            node_name: String::new(),
            system_containers: Vec::new(),
            start_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            cpu: None,
            memory: None,
            io: None,
            network: None,
            fs: None,
            runtime: None,
            rlimit: None,
            swap: None,
        }
    }
}

/// upstream: `RlimitStats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RlimitStats {
    /// When read.
    pub time: Time,
    /// `kernel.pid_max`.
    #[serde(rename = "maxpid", default, skip_serializing_if = "Option::is_none")]
    pub max_pid: Option<i64>,
    /// The processes running.
    #[serde(rename = "curproc", default, skip_serializing_if = "Option::is_none")]
    pub num_of_running_processes: Option<i64>,
}

/// upstream: `RuntimeStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    /// The filesystem of the images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
    /// The filesystem of the containers' writable layers, when apart from the images'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_fs: Option<FsStats>,
}

/// upstream: `PodReference`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodReference {
    /// The pod's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its UID.
    pub uid: String,
}

/// upstream: `PodStats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// The pod.
    pub pod_ref: PodReference,
    /// When the pod's sandbox was created.
    pub start_time: Time,
    /// Its containers (always present, possibly empty, as upstream).
    pub containers: Vec<ContainerStats>,
    /// The pod cgroup's CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// The pod cgroup's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The pod cgroup's IO (its pressure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    /// Network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// Its volumes.
    #[serde(rename = "volume", default, skip_serializing_if = "Vec::is_empty")]
    pub volume_stats: Vec<VolumeStats>,
    /// Its containers' writable layers and logs and its local volumes together.
    #[serde(
        rename = "ephemeral-storage",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ephemeral_storage: Option<FsStats>,
    /// Its processes.
    #[serde(
        rename = "process_stats",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub process_stats: Option<ProcessStats>,
    /// Swap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
}

/// upstream: `ProcessStats`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStats {
    /// How many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_count: Option<u64>,
}

/// upstream: `ContainerStats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// The container's name.
    pub name: String,
    /// When the container was created.
    pub start_time: Time,
    /// CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// IO (its pressure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    /// The writable layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    /// The log files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
    /// Swap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
}

/// upstream: `InterfaceStats`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    /// The interface.
    pub name: String,
    /// Bytes received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    /// Receive errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    /// Bytes sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// Send errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

/// upstream: `NetworkStats` (the default interface inline, the others in `interfaces`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NetworkStats {
    /// When read.
    pub time: Time,
    /// The default interface.
    #[serde(flatten)]
    pub default_interface: InterfaceStats,
    /// Every interface.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStats>,
}

/// upstream: `CPUStats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// When read.
    pub time: Time,
    /// CPU use over the last sample window, in core-nanoseconds per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// CPU time used since creation, in core-nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
    /// CPU pressure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// upstream: `MemoryStats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// When read.
    pub time: Time,
    /// The limit minus the working set (none without a limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// All memory in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Usage minus the inactive file pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Anonymous and swap cache memory.
    #[serde(rename = "rssBytes", default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Minor page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    /// Major page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
    /// Memory pressure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// upstream: `IOStats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IoStats {
    /// When read.
    pub time: Time,
    /// IO pressure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// upstream: `PSIStats` (a `*.pressure` file of the cgroup tree or `/proc/pressure`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PsiStats {
    /// All non-idle tasks stalled at once.
    pub full: PsiData,
    /// At least one task stalled.
    pub some: PsiData,
}

/// upstream: `PSIData`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PsiData {
    /// The stall time, in microseconds as the kernel counts it (upstream passes the kernel's
    /// `total` on unchanged).
    pub total: u64,
    /// The share of the last 10 s stalled, in percent.
    pub avg10: f64,
    /// Of the last 60 s.
    pub avg60: f64,
    /// Of the last 300 s.
    pub avg300: f64,
}

/// upstream: `SwapStats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapStats {
    /// When read.
    pub time: Time,
    /// The swap limit minus the swap in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_available_bytes: Option<u64>,
    /// Swap in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_usage_bytes: Option<u64>,
}

/// upstream: `FsStats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    /// When read.
    pub time: Time,
    /// Free space an unprivileged user may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// The filesystem's size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// What this use takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Free inodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    /// All inodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    /// Inodes this use takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

impl FsStats {
    /// No figure yet, read at `time`.
    pub fn empty(time: Time) -> Self {
        Self {
            time,
            available_bytes: None,
            capacity_bytes: None,
            used_bytes: None,
            inodes_free: None,
            inodes: None,
            inodes_used: None,
        }
    }
}

/// upstream: `VolumeStats` (the `FsStats` inline).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    /// The figures.
    #[serde(flatten)]
    pub fs: FsStats,
    /// The pod's name of the volume.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The claim, for a `persistentVolumeClaim` volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_ref: Option<PvcReference>,
}

/// upstream: `PVCReference`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvcReference {
    /// The claim's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    /// The JSON names and omissions of upstream's `v1alpha1` types: `rssBytes`, `volume`,
    /// `ephemeral-storage`, `maxpid`/`curproc`, the volume's `FsStats` inline, `containers`
    /// always present, absent figures left out.
    #[test]
    fn summary_json_has_upstreams_names() {
        let t = Time(Timestamp::from_second(1_700_000_000).unwrap());
        let fs = FsStats {
            used_bytes: Some(4096),
            inodes_used: Some(2),
            ..FsStats::empty(t.clone())
        };
        let summary = Summary {
            node: NodeStats {
                node_name: "n1".into(),
                start_time: t.clone(),
                memory: Some(MemoryStats {
                    time: t.clone(),
                    available_bytes: Some(1),
                    usage_bytes: Some(3),
                    working_set_bytes: Some(2),
                    rss_bytes: Some(1),
                    page_faults: None,
                    major_page_faults: None,
                    psi: None,
                }),
                rlimit: Some(RlimitStats {
                    time: t.clone(),
                    max_pid: Some(4_194_304),
                    num_of_running_processes: Some(300),
                }),
                runtime: Some(RuntimeStats {
                    image_fs: Some(fs.clone()),
                    container_fs: None,
                }),
                ..NodeStats::default()
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "p".into(),
                    namespace: "ns".into(),
                    uid: "u".into(),
                },
                start_time: t.clone(),
                containers: Vec::new(),
                cpu: None,
                memory: None,
                io: None,
                network: None,
                volume_stats: vec![VolumeStats {
                    fs: fs.clone(),
                    name: "data".into(),
                    pvc_ref: None,
                }],
                ephemeral_storage: Some(fs),
                process_stats: None,
                swap: None,
            }],
        };
        let fs_json =
            serde_json::json!({"time": "2023-11-14T22:13:20Z", "usedBytes": 4096, "inodesUsed": 2});
        assert_eq!(
            serde_json::to_value(&summary).unwrap(),
            serde_json::json!({
                "node": {
                    "nodeName": "n1",
                    "startTime": "2023-11-14T22:13:20Z",
                    "memory": {"time": "2023-11-14T22:13:20Z", "availableBytes": 1, "usageBytes": 3, "workingSetBytes": 2, "rssBytes": 1},
                    "runtime": {"imageFs": fs_json},
                    "rlimit": {"time": "2023-11-14T22:13:20Z", "maxpid": 4_194_304, "curproc": 300},
                },
                "pods": [{
                    "podRef": {"name": "p", "namespace": "ns", "uid": "u"},
                    "startTime": "2023-11-14T22:13:20Z",
                    "containers": [],
                    "volume": [{"time": "2023-11-14T22:13:20Z", "usedBytes": 4096, "inodesUsed": 2, "name": "data"}],
                    "ephemeral-storage": fs_json,
                }],
            })
        );
    }

    /// upstream's `psi` (`full`, `some`, each `total`, `avg10`, `avg60`, `avg300`) on CPU and
    /// memory, and `io` with its `psi`, of a system container.
    #[test]
    fn pressure_json_has_upstreams_names() {
        let t = Time(Timestamp::from_second(1_700_000_000).unwrap());
        let psi = PsiStats {
            full: PsiData {
                total: 7,
                avg10: 0.5,
                avg60: 0.0,
                avg300: 0.0,
            },
            some: PsiData {
                total: 9,
                avg10: 1.25,
                avg60: 0.0,
                avg300: 0.0,
            },
        };
        let container = ContainerStats {
            name: "kubelet".into(),
            start_time: t.clone(),
            cpu: Some(CpuStats {
                time: t.clone(),
                usage_nano_cores: Some(0),
                usage_core_nano_seconds: Some(10),
                psi: Some(psi),
            }),
            memory: None,
            io: Some(IoStats {
                time: t.clone(),
                psi: Some(psi),
            }),
            rootfs: None,
            logs: None,
            swap: None,
        };
        let psi_json = serde_json::json!({
            "full": {"total": 7, "avg10": 0.5, "avg60": 0.0, "avg300": 0.0},
            "some": {"total": 9, "avg10": 1.25, "avg60": 0.0, "avg300": 0.0},
        });
        assert_eq!(
            serde_json::to_value(&container).unwrap(),
            serde_json::json!({
                "name": "kubelet",
                "startTime": "2023-11-14T22:13:20Z",
                "cpu": {"time": "2023-11-14T22:13:20Z", "usageNanoCores": 0, "usageCoreNanoSeconds": 10, "psi": psi_json},
                "io": {"time": "2023-11-14T22:13:20Z", "psi": psi_json},
            })
        );
    }
}
