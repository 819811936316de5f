//! A container's Linux resources as upstream v1.37's kubelet sends them through CRI
//! (`kuberuntime_container_linux.go`'s `generateLinuxContainerResources` and
//! `calculateLinuxResources`, `helpers_linux.go`'s `milliCPUToQuota`, `pkg/kubelet/cm`'s
//! `MilliCPUToShares`, `pkg/kubelet/qos/policy.go`'s `GetContainerOOMScoreAdjust`): CPU shares
//! from the request (the limit when only a limit is set, 2 at least), the CFS quota from the
//! limit over upstream's 100 ms period, the memory limit, and the OOM score adjustment of the
//! pod's QoS class. Pure.
//!
//! Deviations from upstream:
//!
//! * The pod-level cgroup that bounds a pod's containers together (upstream's pod container
//!   manager) is [`crate::cgroups`]'s, off unless configured; pod-level `resources` and the
//!   pod's `overhead` are not applied to the containers' own resources.
//! * No huge page limits (`GetHugepageLimitsFromResources`), no swap configuration
//!   (`configureContainerSwapResources`: containerd itself sets the cgroup v1 swap limit equal
//!   to the memory limit, which is upstream's `NoSwap`), no memory QoS (`memory.min`,
//!   `memory.high`), no pod-level memory requests in the OOM score adjustment.
//! * A static pod is not taken for a node-critical one: only a pod of the
//!   `system-node-critical` class with the system-critical priority is (upstream
//!   `IsNodeCriticalPod` also counts static and mirror pods of that class).

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use rustlet_core::qos::{pod_qos, qos_class};
use rustlet_core::quantity::{quantity_ceil, quantity_milli_ceil};

/// The fewest CPU shares a container gets (upstream `MinShares`).
pub const MIN_SHARES: i64 = 2;
/// The most CPU shares a container gets (upstream `MaxShares`).
pub const MAX_SHARES: i64 = 262_144;
/// The shares of one CPU (upstream `SharesPerCPU`).
pub const SHARES_PER_CPU: i64 = 1024;
/// The CFS period, in microseconds (upstream `QuotaPeriod`, the kubelet's default
/// `cpuCFSQuotaPeriod` of 100 ms).
pub const QUOTA_PERIOD: i64 = 100_000;
/// The smallest CFS quota, in microseconds (upstream `MinQuotaPeriod`).
pub const MIN_QUOTA_PERIOD: i64 = 1000;

/// The OOM score adjustment of a guaranteed (or node-critical) container (upstream
/// `guaranteedOOMScoreAdj`).
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// The OOM score adjustment of a best-effort container (upstream `besteffortOOMScoreAdj`).
pub const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;

/// The priority class of node-critical pods (upstream `scheduling.SystemNodeCritical`).
const SYSTEM_NODE_CRITICAL: &str = "system-node-critical";
/// The lowest priority of a critical pod (upstream `scheduling.SystemCriticalPriority`).
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// What of the node the resources depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeResources {
    /// The node's memory (`MemTotal`), in bytes: the base of a burstable container's OOM score
    /// adjustment (upstream `machineInfo.MemoryCapacity`). 0 when unknown: a burstable
    /// container then gets the highest burstable score (999).
    pub memory_capacity: i64,
    /// Whether the cgroup hierarchy is cgroup v2 alone (upstream `isCgroup2UnifiedMode`): the
    /// kernel is then asked to kill the whole container on an OOM (`memory.oom.group`, upstream
    /// `singleProcessOOMKill` false by default on v2).
    pub cgroup_v2_unified: bool,
}

/// Upstream `MilliCPUToShares`: CPU shares from thousandths of a CPU, [`MIN_SHARES`] for none,
/// within [`MIN_SHARES`]..=[`MAX_SHARES`].
pub fn milli_cpu_to_shares(milli_cpu: i64) -> i64 {
    if milli_cpu == 0 {
        return MIN_SHARES;
    }
    (milli_cpu.saturating_mul(SHARES_PER_CPU) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// Upstream `milliCPUToQuota`: the CFS quota (microseconds per `period`) of thousandths of a
/// CPU; 0 (no quota) for none, [`MIN_QUOTA_PERIOD`] at least.
pub fn milli_cpu_to_quota(milli_cpu: i64, period: i64) -> i64 {
    if milli_cpu == 0 {
        return 0;
    }
    (milli_cpu.saturating_mul(period) / 1000).max(MIN_QUOTA_PERIOD)
}

fn to_i64(value: Option<i128>) -> i64 {
    value.map_or(0, |v| {
        i64::try_from(v).unwrap_or(if v < 0 { 0 } else { i64::MAX })
    })
}

/// The named request or limit of a container, if it has one.
fn resource<'a>(container: &'a Container, limits: bool, name: &str) -> Option<&'a Quantity> {
    let resources = container.resources.as_ref()?;
    let list = if limits {
        &resources.limits
    } else {
        &resources.requests
    };
    list.as_ref()?.get(name)
}

/// Upstream `Quantity.MilliValue` (rounded up), 0 for none or what does not parse (the API
/// server validated every quantity).
fn milli_value(q: Option<&Quantity>) -> i64 {
    to_i64(q.and_then(quantity_milli_ceil))
}

/// Upstream `Quantity.Value` (rounded up), 0 for none or what does not parse.
fn value(q: Option<&Quantity>) -> i64 {
    to_i64(q.and_then(quantity_ceil))
}

/// Upstream `generateLinuxContainerResources` with `calculateLinuxResources`: the CPU shares,
/// CFS quota and period, memory limit and OOM score adjustment of `container` of `pod`.
pub fn linux_container_resources(
    pod: &Pod,
    container: &Container,
    node: NodeResources,
) -> cri::LinuxContainerResources {
    let cpu_request = resource(container, false, "cpu");
    let cpu_limit = milli_value(resource(container, true, "cpu"));
    let memory_limit = value(resource(container, true, "memory"));
    // An absent request with a limit takes the limit (the API server defaults it so; upstream
    // repeats it for older pods).
    let cpu_shares = match cpu_request {
        None if cpu_limit != 0 => milli_cpu_to_shares(cpu_limit),
        request => milli_cpu_to_shares(milli_value(request)),
    };
    let mut resources = cri::LinuxContainerResources {
        cpu_shares,
        cpu_period: QUOTA_PERIOD,
        cpu_quota: milli_cpu_to_quota(cpu_limit, QUOTA_PERIOD),
        memory_limit_in_bytes: memory_limit,
        oom_score_adj: container_oom_score_adjust(pod, container, node.memory_capacity),
        ..Default::default()
    };
    if node.cgroup_v2_unified {
        resources
            .unified
            .insert("memory.oom.group".to_owned(), "1".to_owned());
    }
    resources
}

/// Upstream `IsNodeCriticalPod`, of the API's pods: the `system-node-critical` class at the
/// system-critical priority.
fn is_node_critical(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.priority_class_name.as_deref() == Some(SYSTEM_NODE_CRITICAL)
            && s.priority.is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
    })
}

/// Upstream `isSidecarContainer`: an init container that restarts always.
fn is_sidecar(pod: &Pod, container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
        && pod.spec.as_ref().is_some_and(|s| {
            s.init_containers
                .iter()
                .flatten()
                .any(|c| c.name == container.name)
        })
}

/// Upstream `GetContainerOOMScoreAdjust` (without pod-level requests): -997 for a guaranteed or
/// node-critical pod, 1000 for a best-effort one; a burstable container's falls with its
/// memory request's share of the node (a sidecar's is no higher than the regular container
/// with the least request's), within 3..=999.
pub fn container_oom_score_adjust(pod: &Pod, container: &Container, memory_capacity: i64) -> i64 {
    if is_node_critical(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match pod_qos(pod) {
        qos_class::GUARANTEED => return GUARANTEED_OOM_SCORE_ADJ,
        qos_class::BEST_EFFORT => return BEST_EFFORT_OOM_SCORE_ADJ,
        _ => {}
    }
    let score = |request: i64| -> i64 {
        if memory_capacity <= 0 {
            return 1000;
        }
        let share = i128::from(request) * 1000 / i128::from(memory_capacity);
        1000 - i64::try_from(share).unwrap_or(i64::MAX)
    };
    let mut adjust = score(value(resource(container, false, "memory")));
    if is_sidecar(pod, container) {
        let min_regular = pod
            .spec
            .as_ref()
            .and_then(|s| {
                s.containers
                    .iter()
                    .map(|c| value(resource(c, false, "memory")))
                    .min()
            })
            .unwrap_or(0);
        adjust = adjust.min(score(min_regular));
    }
    if adjust < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        1000 + GUARANTEED_OOM_SCORE_ADJ
    } else if adjust == BEST_EFFORT_OOM_SCORE_ADJ {
        adjust - 1
    } else {
        adjust
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: i64 = 1 << 30;
    const NODE: NodeResources = NodeResources {
        memory_capacity: 4 * GIB,
        cgroup_v2_unified: false,
    };

    fn pod(containers: serde_json::Value, init: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": containers, "initContainers": init},
        }))
        .unwrap()
    }

    fn resources_of(pod: &Pod, index: usize) -> cri::LinuxContainerResources {
        let container = &pod.spec.as_ref().unwrap().containers[index];
        linux_container_resources(pod, container, NODE)
    }

    /// Upstream `TestGenerateLinuxContainerResources`-like, a guaranteed pod: shares from the
    /// request, quota from the limit over 100 ms, the memory limit, -997.
    #[test]
    fn test_generate_linux_container_resources_guaranteed() {
        let pod = pod(
            serde_json::json!([{"name": "c", "resources": {
                "requests": {"cpu": "250m", "memory": "128Mi"},
                "limits": {"cpu": "250m", "memory": "128Mi"},
            }}]),
            serde_json::json!([]),
        );
        assert_eq!(
            resources_of(&pod, 0),
            cri::LinuxContainerResources {
                cpu_shares: 256,
                cpu_period: 100_000,
                cpu_quota: 25_000,
                memory_limit_in_bytes: 128 << 20,
                oom_score_adj: -997,
                ..Default::default()
            }
        );
    }

    /// A burstable container: its request's shares, its limit's quota and memory limit, and
    /// an OOM score adjustment of 1000 minus its request's thousandths of the node.
    #[test]
    fn test_generate_linux_container_resources_burstable() {
        let pod = pod(
            serde_json::json!([{"name": "c", "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"},
                "limits": {"cpu": "2", "memory": "2Gi"},
            }}]),
            serde_json::json!([]),
        );
        assert_eq!(
            resources_of(&pod, 0),
            cri::LinuxContainerResources {
                cpu_shares: 1024,
                cpu_period: 100_000,
                cpu_quota: 200_000,
                memory_limit_in_bytes: 2 * GIB,
                oom_score_adj: 750,
                ..Default::default()
            }
        );
    }

    /// A best-effort container: the fewest shares, no quota, no memory limit, 1000; on
    /// cgroup v2 the whole container is killed on an OOM.
    #[test]
    fn test_generate_linux_container_resources_best_effort() {
        let pod = pod(serde_json::json!([{"name": "c"}]), serde_json::json!([]));
        let container = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            linux_container_resources(&pod, container, NODE),
            cri::LinuxContainerResources {
                cpu_shares: 2,
                cpu_period: 100_000,
                cpu_quota: 0,
                memory_limit_in_bytes: 0,
                oom_score_adj: 1000,
                ..Default::default()
            }
        );
        let v2 = linux_container_resources(
            &pod,
            container,
            NodeResources {
                cgroup_v2_unified: true,
                ..NODE
            },
        );
        assert_eq!(
            v2.unified.get("memory.oom.group").map(String::as_str),
            Some("1")
        );
    }

    /// Upstream `TestMilliCPUToShares`-like: none and tiny requests get the 2 minimum, a huge
    /// one the maximum; a limit alone gives the shares (upstream `calculateLinuxResources`).
    #[test]
    fn test_cpu_shares_minimum_and_limit_only() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(2), 2);
        assert_eq!(milli_cpu_to_shares(3), 3);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(1_000_000), MAX_SHARES);
        let pod = pod(
            serde_json::json!([
                {"name": "tiny", "resources": {"requests": {"cpu": "1m"}}},
                {"name": "limit-only", "resources": {"limits": {"cpu": "500m"}}},
                {"name": "zero-request", "resources": {
                    "requests": {"cpu": "0"}, "limits": {"cpu": "500m"}}},
            ]),
            serde_json::json!([]),
        );
        assert_eq!(resources_of(&pod, 0).cpu_shares, 2);
        assert_eq!(resources_of(&pod, 1).cpu_shares, 512);
        // A request given as zero is a request: the minimum, not the limit's.
        assert_eq!(resources_of(&pod, 2).cpu_shares, 2);
    }

    /// Upstream `TestMilliCPUToQuota`: no limit no quota, 1 ms at least, the limit's share of
    /// the period otherwise.
    #[test]
    fn test_milli_cpu_to_quota() {
        assert_eq!(milli_cpu_to_quota(0, QUOTA_PERIOD), 0);
        assert_eq!(milli_cpu_to_quota(5, QUOTA_PERIOD), 1000);
        assert_eq!(milli_cpu_to_quota(9, QUOTA_PERIOD), 1000);
        assert_eq!(milli_cpu_to_quota(10, QUOTA_PERIOD), 1000);
        assert_eq!(milli_cpu_to_quota(200, QUOTA_PERIOD), 20_000);
        assert_eq!(milli_cpu_to_quota(500, QUOTA_PERIOD), 50_000);
        assert_eq!(milli_cpu_to_quota(1500, QUOTA_PERIOD), 150_000);
        let pod = pod(
            serde_json::json!([{"name": "c", "resources": {"limits": {"cpu": "1500m"}}}]),
            serde_json::json!([]),
        );
        assert_eq!(resources_of(&pod, 0).cpu_quota, 150_000);
    }

    /// Upstream `TestGetContainerOOMScoreAdjust`-like: the class's fixed scores, the status's
    /// class first, a burstable request of the whole node at 3, none at 999, node-critical
    /// pods at -997, and a sidecar no higher than the smallest regular container.
    #[test]
    fn test_get_container_oom_score_adjust() {
        let burstable = pod(
            serde_json::json!([
                {"name": "big", "resources": {"requests": {"memory": "4Gi"}}},
                {"name": "none", "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "500m"}}},
                {"name": "small", "resources": {"requests": {"memory": "1Gi"}}},
            ]),
            serde_json::json!([
                {"name": "sidecar", "restartPolicy": "Always"},
                {"name": "init"},
            ]),
        );
        let spec = burstable.spec.as_ref().unwrap();
        let score = |c: &Container| container_oom_score_adjust(&burstable, c, 4 * GIB);
        assert_eq!(score(&spec.containers[0]), 3);
        assert_eq!(score(&spec.containers[1]), 999);
        assert_eq!(score(&spec.containers[2]), 750);
        // The sidecar has no request; the smallest regular one (none: 0) gives 1000, then 999.
        assert_eq!(score(&spec.init_containers.as_ref().unwrap()[0]), 999);
        assert_eq!(score(&spec.init_containers.as_ref().unwrap()[1]), 999);

        let mut sidecar = burstable.clone();
        let s = sidecar.spec.as_mut().unwrap();
        s.containers.remove(1);
        let sidecar_container = s.init_containers.as_ref().unwrap()[0].clone();
        // The smallest regular request is 1Gi: the sidecar's score is at most its 750.
        assert_eq!(
            container_oom_score_adjust(&sidecar, &sidecar_container, 4 * GIB),
            750
        );

        // The status's class is taken over the spec's.
        let mut stored = burstable.clone();
        stored.status = Some(k8s_openapi::api::core::v1::PodStatus {
            qos_class: Some("Guaranteed".into()),
            ..Default::default()
        });
        assert_eq!(
            container_oom_score_adjust(&stored, &spec.containers[1], 4 * GIB),
            -997
        );

        let mut critical = burstable.clone();
        let s = critical.spec.as_mut().unwrap();
        s.priority_class_name = Some("system-node-critical".into());
        s.priority = Some(2_000_001_000);
        assert_eq!(
            container_oom_score_adjust(&critical, &spec.containers[1], 4 * GIB),
            -997
        );
        // An unknown node memory: the highest burstable score, no division by zero.
        assert_eq!(
            container_oom_score_adjust(&burstable, &spec.containers[0], 0),
            999
        );
    }
}
