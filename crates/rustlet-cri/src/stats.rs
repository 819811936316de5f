//! The pods' and containers' figures from CRI (upstream: `pkg/kubelet/stats/cri_stats_provider.go`,
//! `ListPodStats`): the ready sandboxes and running containers of `ListPodSandbox` and
//! `ListContainers`, their figures from `ListPodSandboxStats` and `ListContainerStats`.
//!
//! Deviation: upstream reads the pod cgroup's CPU and memory through cAdvisor (or, with
//! `PodAndContainerStatsFromCRI`, `ListPodSandboxStats`); here `ListPodSandboxStats`, and
//! where the runtime does not answer it (or leaves the figures out) the sum of the pod's
//! containers, which leaves out the sandbox's own (pause) process. (The binary's summary
//! provider replaces these with the pod's and containers' cgroups' figures where it finds
//! those cgroups, as upstream overlays cAdvisor's.)

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use k8s_openapi::jiff::Timestamp;
use rustlet_core::PodUid;
use rustlet_pods::runtime::{ContainerUsage, CpuUsage, FsUsage, MemoryUsage, PodUsage, SwapUsage};

fn ts(ns: i64) -> Timestamp {
    Timestamp::from_nanosecond(i128::from(ns)).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn value(v: Option<&cri::UInt64Value>) -> Option<u64> {
    v.map(|v| v.value)
}

/// CRI `CpuUsage`.
pub fn cpu(u: &cri::CpuUsage) -> CpuUsage {
    CpuUsage {
        at: ts(u.timestamp),
        usage_core_nanos: value(u.usage_core_nano_seconds.as_ref()),
        usage_nano_cores: value(u.usage_nano_cores.as_ref()),
    }
}

/// CRI `MemoryUsage`.
pub fn memory(u: &cri::MemoryUsage) -> MemoryUsage {
    MemoryUsage {
        at: ts(u.timestamp),
        working_set: value(u.working_set_bytes.as_ref()),
        available: value(u.available_bytes.as_ref()),
        usage: value(u.usage_bytes.as_ref()),
        rss: value(u.rss_bytes.as_ref()),
        page_faults: value(u.page_faults.as_ref()),
        major_page_faults: value(u.major_page_faults.as_ref()),
    }
}

/// CRI `SwapUsage`.
pub fn swap(u: &cri::SwapUsage) -> SwapUsage {
    SwapUsage {
        at: ts(u.timestamp),
        usage: value(u.swap_usage_bytes.as_ref()),
        available: value(u.swap_available_bytes.as_ref()),
    }
}

/// CRI `FilesystemUsage`.
pub fn fs(u: &cri::FilesystemUsage) -> FsUsage {
    FsUsage {
        at: ts(u.timestamp),
        mountpoint: u
            .fs_id
            .as_ref()
            .map(|id| id.mountpoint.clone())
            .unwrap_or_default(),
        used_bytes: value(u.used_bytes.as_ref()),
        inodes_used: value(u.inodes_used.as_ref()),
    }
}

/// The sum of the containers' CPU, at the newest of their times.
fn sum_cpu(containers: &[ContainerUsage]) -> Option<CpuUsage> {
    let cpus: Vec<&CpuUsage> = containers.iter().filter_map(|c| c.cpu.as_ref()).collect();
    let at = cpus.iter().map(|c| c.at).max()?;
    let sum = |f: fn(&CpuUsage) -> Option<u64>| -> Option<u64> {
        cpus.iter().map(|c| f(c)).sum::<Option<u64>>()
    };
    Some(CpuUsage {
        at,
        usage_core_nanos: sum(|c| c.usage_core_nanos),
        usage_nano_cores: sum(|c| c.usage_nano_cores),
    })
}

/// The sum of the containers' memory, at the newest of their times (no `available`: a pod
/// limit is not the sum of the containers').
fn sum_memory(containers: &[ContainerUsage]) -> Option<MemoryUsage> {
    let mems: Vec<&MemoryUsage> = containers
        .iter()
        .filter_map(|c| c.memory.as_ref())
        .collect();
    let at = mems.iter().map(|m| m.at).max()?;
    let sum = |f: fn(&MemoryUsage) -> Option<u64>| -> Option<u64> {
        mems.iter().map(|m| f(m)).sum::<Option<u64>>()
    };
    Some(MemoryUsage {
        at,
        working_set: sum(|m| m.working_set),
        available: None,
        usage: sum(|m| m.usage),
        rss: sum(|m| m.rss),
        page_faults: sum(|m| m.page_faults),
        major_page_faults: sum(|m| m.major_page_faults),
    })
}

/// What the four CRI lists said.
pub struct CriLists {
    /// `ListPodSandbox`.
    pub sandboxes: Vec<cri::PodSandbox>,
    /// `ListContainers`.
    pub containers: Vec<cri::Container>,
    /// `ListContainerStats`.
    pub container_stats: Vec<cri::ContainerStats>,
    /// `ListPodSandboxStats` (empty when the runtime does not answer it).
    pub sandbox_stats: Vec<cri::PodSandboxStats>,
}

/// The pods with a ready sandbox (the newest per pod UID) and their running containers, with
/// their figures; `scheme` prefixes container IDs. upstream: `ListPodStats`
/// (`removeTerminatedPods`, `removeTerminatedContainers`).
pub fn pod_usage(lists: &CriLists, scheme: &str) -> Vec<PodUsage> {
    let mut newest: HashMap<&str, &cri::PodSandbox> = HashMap::new();
    for sandbox in &lists.sandboxes {
        if sandbox.state != cri::PodSandboxState::SandboxReady as i32 {
            continue;
        }
        let Some(meta) = &sandbox.metadata else {
            continue;
        };
        let entry = newest.entry(meta.uid.as_str()).or_insert(sandbox);
        if sandbox.created_at > entry.created_at {
            *entry = sandbox;
        }
    }
    let container_stats: HashMap<&str, &cri::ContainerStats> = lists
        .container_stats
        .iter()
        .filter_map(|s| Some((s.attributes.as_ref()?.id.as_str(), s)))
        .collect();
    let sandbox_stats: HashMap<&str, &cri::LinuxPodSandboxStats> = lists
        .sandbox_stats
        .iter()
        .filter_map(|s| Some((s.attributes.as_ref()?.id.as_str(), s.linux.as_ref()?)))
        .collect();
    let mut pods: Vec<PodUsage> = newest
        .into_values()
        .map(|sandbox| {
            let meta = sandbox.metadata.clone().unwrap_or_default();
            let containers: Vec<ContainerUsage> = lists
                .containers
                .iter()
                .filter(|c| {
                    c.pod_sandbox_id == sandbox.id
                        && c.state == cri::ContainerState::ContainerRunning as i32
                })
                .map(|c| {
                    let stats = container_stats.get(c.id.as_str());
                    ContainerUsage {
                        id: format!("{scheme}://{}", c.id),
                        name: c
                            .metadata
                            .as_ref()
                            .map(|m| m.name.clone())
                            .unwrap_or_default(),
                        created_at: ts(c.created_at),
                        cpu: stats.and_then(|s| s.cpu.as_ref()).map(cpu),
                        memory: stats.and_then(|s| s.memory.as_ref()).map(memory),
                        swap: stats.and_then(|s| s.swap.as_ref()).map(swap),
                        writable_layer: stats.and_then(|s| s.writable_layer.as_ref()).map(fs),
                    }
                })
                .collect();
            let linux = sandbox_stats.get(sandbox.id.as_str());
            PodUsage {
                uid: PodUid::new(meta.uid.clone()),
                sandbox_id: sandbox.id.clone(),
                name: meta.name,
                namespace: meta.namespace,
                created_at: ts(sandbox.created_at),
                cpu: linux
                    .and_then(|l| l.cpu.as_ref())
                    .map(cpu)
                    .or_else(|| sum_cpu(&containers)),
                memory: linux
                    .and_then(|l| l.memory.as_ref())
                    .map(memory)
                    .or_else(|| sum_memory(&containers)),
                swap: None,
                containers,
            }
        })
        .collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    pods
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str, uid: &str, ready: bool, created_at: i64) -> cri::PodSandbox {
        cri::PodSandbox {
            id: id.into(),
            metadata: Some(cri::PodSandboxMetadata {
                name: "web".into(),
                uid: uid.into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            state: if ready {
                cri::PodSandboxState::SandboxReady
            } else {
                cri::PodSandboxState::SandboxNotready
            } as i32,
            created_at,
            ..Default::default()
        }
    }

    fn container(id: &str, sandbox: &str, name: &str, running: bool) -> cri::Container {
        cri::Container {
            id: id.into(),
            pod_sandbox_id: sandbox.into(),
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            state: if running {
                cri::ContainerState::ContainerRunning
            } else {
                cri::ContainerState::ContainerExited
            } as i32,
            created_at: 7_000_000_000,
            ..Default::default()
        }
    }

    fn stats(id: &str, cpu_ns: u64, ws: u64) -> cri::ContainerStats {
        cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: id.into(),
                ..Default::default()
            }),
            cpu: Some(cri::CpuUsage {
                timestamp: 9_000_000_000,
                usage_core_nano_seconds: Some(cri::UInt64Value { value: cpu_ns }),
                usage_nano_cores: None,
            }),
            memory: Some(cri::MemoryUsage {
                timestamp: 9_000_000_000,
                working_set_bytes: Some(cri::UInt64Value { value: ws }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// upstream's `removeTerminatedPods`/`removeTerminatedContainers`: the newest ready
    /// sandbox of a pod and its running containers only; without `ListPodSandboxStats` the
    /// pod's CPU and memory are its containers' sum.
    #[test]
    fn pod_usage_keeps_ready_sandboxes_and_running_containers() {
        let lists = CriLists {
            sandboxes: vec![
                sandbox("old", "u1", false, 1),
                sandbox("s1", "u1", true, 5_000_000_000),
                sandbox("gone", "u2", false, 2),
            ],
            containers: vec![
                container("c1", "s1", "app", true),
                container("c2", "s1", "side", true),
                container("c0", "s1", "app", false),
                container("x", "old", "app", true),
            ],
            container_stats: vec![
                stats("c1", 1_000, 10),
                stats("c2", 2_000, 20),
                stats("c0", 5, 5),
            ],
            sandbox_stats: Vec::new(),
        };
        let pods = pod_usage(&lists, "containerd");
        assert_eq!(pods.len(), 1);
        let pod = &pods[0];
        assert_eq!(
            (pod.uid.as_str(), pod.name.as_str(), pod.namespace.as_str()),
            ("u1", "web", "default")
        );
        assert_eq!(pod.created_at.as_second(), 5);
        let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["app", "side"]);
        assert_eq!(pod.containers[0].id, "containerd://c1");
        assert_eq!(pod.containers[0].created_at.as_second(), 7);
        assert_eq!(pod.cpu.unwrap().usage_core_nanos, Some(3_000));
        assert_eq!(pod.memory.unwrap().working_set, Some(30));
    }
}
