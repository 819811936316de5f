//! The pod cgroups of upstream's pod container manager with the `cgroupfs` driver and
//! `cgroupsPerQOS` (`pkg/kubelet/cm`: `qos_container_manager_linux.go`,
//! `pod_container_manager_linux.go`, `helpers_linux.go`'s `ResourceConfigForPod`), on a
//! cgroup v1 (or hybrid) hierarchy: under the configured cgroup root, `kubepods` holds the guaranteed pods'
//! `pod<uid>` cgroups, `kubepods/burstable` and `kubepods/besteffort` the others'. A pod's
//! cgroup is made before its sandbox (whose `cgroup_parent` it is) with the pod's CPU shares,
//! quota and memory limit, and removed with the pod; the QoS cgroups stay, as upstream's.
//!
//! At start, `kubepods` gets the node's allocatable as its CPU shares and memory limit
//! (upstream `enforceNodeAllocatableCgroups`; allocatable is the capacity, there are no
//! reservations) and its QoS cgroups are made (upstream's QoS container manager's `Start`);
//! [`PodCgroupsConfig::move_process`] makes a named cgroup and moves a process into it (the
//! agent into `kubeletCgroups`, upstream `ensureProcessInContainerWithOOMScore`, once at start
//! and without the OOM score).
//!
//! Only what is under the configured root is touched, and of it only the QoS cgroups and the
//! `pod<uid>` cgroups of the pods this agent removes (and the cgroup named for
//! [`PodCgroupsConfig::move_process`]).
//!
//! Deviations from upstream: off unless configured ([`PodCgroupsConfig`]; upstream's
//! `cgroupsPerQOS` is on by default with the root `/`); cgroup v1 only; the QoS cgroups get no
//! CPU shares or memory reservations of their own (upstream `UpdateCgroups`); pod-level
//! `resources`, huge pages and pids limit are not applied (the pod's `overhead` is, as
//! upstream's `PodRequests`/`PodLimits` add it); a pod's
//! lingering processes are not killed before its cgroup is removed (the removal then fails with
//! a warning and the cgroup is left; upstream's housekeeping kills them and tries again).

use std::io;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use rustlet_core::qos::{pod_qos, qos_class};
use rustlet_core::quantity::{quantity_ceil, quantity_milli_ceil};

use crate::resources::{MIN_SHARES, QUOTA_PERIOD, milli_cpu_to_quota, milli_cpu_to_shares};

/// Where the pod cgroups go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCgroupsConfig {
    /// Where the cgroup v1 hierarchies are mounted (`/sys/fs/cgroup`).
    pub mount: PathBuf,
    /// The cgroup root, absolute in each hierarchy (upstream `cgroupRoot`, `/`).
    pub root: String,
}

/// The cgroup name of a pod of `uid` in QoS class `qos` under `root` (upstream's cgroupfs
/// `CgroupName.ToCgroupfs` of `GetPodContainerName`): `<root>/kubepods/pod<uid>` for a
/// guaranteed pod, `<root>/kubepods/burstable/pod<uid>`, `<root>/kubepods/besteffort/pod<uid>`.
pub fn pod_cgroup_name(root: &str, qos: &str, uid: &str) -> String {
    let mut name = root.trim_end_matches('/').to_owned();
    name.push_str("/kubepods");
    match qos {
        qos_class::BURSTABLE => name.push_str("/burstable"),
        qos_class::BEST_EFFORT => name.push_str("/besteffort"),
        _ => {}
    }
    name.push_str("/pod");
    name.push_str(uid);
    name
}

/// A pod cgroup's limits (upstream `ResourceConfig`), `None`: left as the kernel's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodResourceConfig {
    /// `cpu.shares`.
    pub cpu_shares: i64,
    /// `cpu.cfs_quota_us` and `cpu.cfs_period_us`.
    pub cpu_quota: Option<(i64, i64)>,
    /// `memory.limit_in_bytes`.
    pub memory_limit: Option<i64>,
}

fn container_quantity(container: &Container, limits: bool, name: &str, milli: bool) -> i64 {
    let q = container.resources.as_ref().and_then(|r| {
        if limits { &r.limits } else { &r.requests }
            .as_ref()?
            .get(name)
    });
    quantity_value(q, milli)
}

/// A quantity in milli-units (CPU) or whole units (bytes), rounded up; 0 when absent or out of
/// range.
fn quantity_value(q: Option<&Quantity>, milli: bool) -> i64 {
    let v = q.and_then(|q| {
        if milli {
            quantity_milli_ceil(q)
        } else {
            quantity_ceil(q)
        }
    });
    v.and_then(|v| i64::try_from(v).ok()).unwrap_or(0)
}

/// Upstream `PodRequests`/`PodLimits` of one resource (without overhead or pod-level
/// resources, see [`pod_with_overhead`]): the regular containers and sidecars summed, or an init container's with the
/// sidecars started before it, whichever is larger.
fn pod_total(pod: &Pod, limits: bool, name: &str, milli: bool) -> i64 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    let mut sidecars = 0i64;
    let mut init_max = 0i64;
    for init in spec.init_containers.iter().flatten() {
        let own = container_quantity(init, limits, name, milli);
        if init.restart_policy.as_deref() == Some("Always") {
            sidecars = sidecars.saturating_add(own);
            init_max = init_max.max(sidecars);
        } else {
            init_max = init_max.max(sidecars.saturating_add(own));
        }
    }
    let regular = spec
        .containers
        .iter()
        .map(|c| container_quantity(c, limits, name, milli))
        .fold(sidecars, i64::saturating_add);
    regular.max(init_max)
}

/// The pod's `overhead` (set at admission from its RuntimeClass) of one resource.
fn overhead(pod: &Pod, name: &str, milli: bool) -> i64 {
    let q = pod
        .spec
        .as_ref()
        .and_then(|s| s.overhead.as_ref())
        .and_then(|o| o.get(name));
    quantity_value(q, milli)
}

/// Upstream `PodRequests` (the overhead added) or `PodLimits` (the overhead added to a
/// non-zero limit only) of one resource, without pod-level resources.
fn pod_with_overhead(pod: &Pod, limits: bool, name: &str, milli: bool) -> i64 {
    let total = pod_total(pod, limits, name, milli);
    if limits && total == 0 {
        return 0;
    }
    total.saturating_add(overhead(pod, name, milli))
}

/// Whether every container (init containers included) has a non-zero limit of `name`
/// (upstream `ResourceConfigForPod`'s `cpuLimitsDeclared`/`memoryLimitsDeclared`).
fn limits_declared(pod: &Pod, name: &str) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(&s.containers)
            .all(|c| container_quantity(c, true, name, true) != 0)
    })
}

/// Upstream `ResourceConfigForPod` (CFS quota enforced, the 100 ms period): a guaranteed pod
/// gets its requests' shares, its limits' quota and memory limit; a burstable one its shares,
/// and the quota or memory limit when every container has that limit; a best-effort one the
/// fewest shares.
pub fn pod_resource_config(pod: &Pod) -> PodResourceConfig {
    let cpu_shares = milli_cpu_to_shares(pod_with_overhead(pod, false, "cpu", true));
    let quota = (
        milli_cpu_to_quota(pod_with_overhead(pod, true, "cpu", true), QUOTA_PERIOD),
        QUOTA_PERIOD,
    );
    let memory = pod_with_overhead(pod, true, "memory", false);
    match pod_qos(pod) {
        qos_class::GUARANTEED => PodResourceConfig {
            cpu_shares,
            cpu_quota: Some(quota),
            memory_limit: Some(memory),
        },
        qos_class::BURSTABLE => PodResourceConfig {
            cpu_shares,
            cpu_quota: limits_declared(pod, "cpu").then_some(quota),
            memory_limit: limits_declared(pod, "memory").then_some(memory),
        },
        _ => PodResourceConfig {
            cpu_shares: MIN_SHARES,
            ..Default::default()
        },
    }
}

impl PodCgroupsConfig {
    /// The mounted hierarchies: each directory of the mount with `cgroup.procs`, each once,
    /// and whether it is the v2 one of a hybrid setup (it has `cgroup.controllers`; runc
    /// makes a container's cgroup there too). A v2 mount alone is refused.
    fn hierarchies(&self) -> io::Result<Vec<(PathBuf, bool)>> {
        if self.mount.join("cgroup.controllers").exists() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{} is a cgroup v2 hierarchy", self.mount.display()),
            ));
        }
        let mut found: Vec<(PathBuf, bool)> = Vec::new();
        for entry in std::fs::read_dir(&self.mount)? {
            let path = entry?.path();
            if !path.join("cgroup.procs").is_file() {
                continue;
            }
            let v2 = path.join("cgroup.controllers").exists();
            let real = path.canonicalize()?;
            if !found.iter().any(|(p, _)| *p == real) {
                found.push((real, v2));
            }
        }
        found.sort();
        Ok(found)
    }

    fn dir(hierarchy: &Path, name: &str) -> PathBuf {
        hierarchy.join(name.trim_start_matches('/'))
    }

    /// Makes `name` (and its missing parents) in `hierarchy`; a new v1 cpuset cgroup takes its
    /// parent's CPUs and memory nodes, without which it cannot hold a process.
    fn make(hierarchy: &Path, v2: bool, name: &str) -> io::Result<()> {
        let mut dir = hierarchy.to_path_buf();
        for part in name.split('/').filter(|p| !p.is_empty()) {
            let parent = dir.clone();
            dir.push(part);
            match std::fs::create_dir(&dir) {
                Ok(()) if v2 => {}
                Ok(()) => {
                    for file in ["cpuset.cpus", "cpuset.mems"] {
                        if parent.join(file).is_file() {
                            std::fs::write(dir.join(file), std::fs::read(parent.join(file))?)?;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The pods' top cgroup, `<root>/kubepods` (upstream `GetPodCgroupRoot` with
    /// `cgroupsPerQOS`).
    pub fn pods_cgroup(&self) -> String {
        format!("{}/kubepods", self.root.trim_end_matches('/'))
    }

    /// Upstream `enforceNodeAllocatableCgroups` (no reservations: allocatable is capacity) and
    /// the QoS container manager's `Start`: `<root>/kubepods` in every hierarchy, with the
    /// shares of `cpus` and the memory limit `memory_bytes`, and its `burstable` and
    /// `besteffort` cgroups. Blocking.
    pub fn ensure_top_level_cgroups(&self, cpus: u32, memory_bytes: u64) -> io::Result<()> {
        let name = self.pods_cgroup();
        let shares = milli_cpu_to_shares(i64::from(cpus).saturating_mul(1000));
        for (hierarchy, v2) in self.hierarchies()? {
            Self::make(&hierarchy, v2, &name)?;
            let dir = Self::dir(&hierarchy, &name);
            if dir.join("cpu.shares").is_file() {
                std::fs::write(dir.join("cpu.shares"), shares.to_string())?;
            }
            if dir.join("memory.limit_in_bytes").is_file() {
                std::fs::write(dir.join("memory.limit_in_bytes"), memory_bytes.to_string())?;
            }
            for qos in ["burstable", "besteffort"] {
                Self::make(&hierarchy, v2, &format!("{name}/{qos}"))?;
            }
        }
        Ok(())
    }

    /// Cgroup `name` (absolute, not under the root) made in every hierarchy; its directories.
    /// Blocking.
    pub fn ensure_cgroup(&self, name: &str) -> io::Result<Vec<PathBuf>> {
        if name.split('/').any(|p| p == ".." || p == ".") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cgroup {name:?} is not a plain absolute name"),
            ));
        }
        let mut dirs = Vec::new();
        for (hierarchy, v2) in self.hierarchies()? {
            Self::make(&hierarchy, v2, name)?;
            dirs.push(Self::dir(&hierarchy, name));
        }
        Ok(dirs)
    }

    /// Cgroup `name` (absolute, not under the root) in every hierarchy, with process `pid`
    /// moved into it (upstream `ensureProcessInContainerWithOOMScore`'s `manager.Apply`, for
    /// `kubeletCgroups`). Blocking.
    pub fn move_process(&self, name: &str, pid: u32) -> io::Result<()> {
        for dir in self.ensure_cgroup(name)? {
            let procs = dir.join("cgroup.procs");
            std::fs::write(&procs, pid.to_string())
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", procs.display())))?;
        }
        Ok(())
    }

    /// Upstream `EnsureExists`: the pod's cgroup in every hierarchy, with its limits; its name,
    /// the sandbox's `cgroup_parent`. Blocking.
    pub fn ensure(&self, pod: &Pod) -> io::Result<String> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if uid.is_empty() || uid.contains(['/', '.']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("pod UID {uid:?} is not a cgroup name"),
            ));
        }
        let name = pod_cgroup_name(&self.root, pod_qos(pod), uid);
        let config = pod_resource_config(pod);
        for (hierarchy, v2) in self.hierarchies()? {
            Self::make(&hierarchy, v2, &name)?;
            let dir = Self::dir(&hierarchy, &name);
            if dir.join("cpu.shares").is_file() {
                std::fs::write(dir.join("cpu.shares"), config.cpu_shares.to_string())?;
                if let Some((quota, period)) = config.cpu_quota {
                    std::fs::write(dir.join("cpu.cfs_period_us"), period.to_string())?;
                    std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())?;
                }
            }
            if let Some(limit) = config.memory_limit
                && dir.join("memory.limit_in_bytes").is_file()
            {
                std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string())?;
            }
        }
        Ok(name)
    }

    /// Upstream `Destroy`: the `pod<uid>` cgroup, of whichever QoS class, in every hierarchy;
    /// nothing else. Blocking.
    pub fn remove(&self, uid: &str) -> io::Result<()> {
        if uid.is_empty() || uid.contains(['/', '.']) {
            return Ok(());
        }
        for (hierarchy, _) in self.hierarchies()? {
            for qos in [
                qos_class::GUARANTEED,
                qos_class::BURSTABLE,
                qos_class::BEST_EFFORT,
            ] {
                let dir = Self::dir(&hierarchy, &pod_cgroup_name(&self.root, qos, uid));
                match std::fs::remove_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("removing {}: {e}", dir.display()),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: serde_json::Value, init: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": containers, "initContainers": init},
        }))
        .unwrap()
    }

    /// Upstream `TestCgroupNameToCgroupfs`-like: each QoS class's place under the root.
    #[test]
    fn pod_cgroups_are_named_as_upstreams_cgroupfs_driver_names_them() {
        assert_eq!(
            pod_cgroup_name("/", "Guaranteed", "abc"),
            "/kubepods/podabc"
        );
        assert_eq!(
            pod_cgroup_name("/", "Burstable", "abc"),
            "/kubepods/burstable/podabc"
        );
        assert_eq!(
            pod_cgroup_name("/test-root/", "BestEffort", "abc"),
            "/test-root/kubepods/besteffort/podabc"
        );
    }

    /// Upstream `TestResourceConfigForPod`-like: guaranteed, burstable with and without every
    /// limit, best-effort; init containers and sidecars counted as upstream's `PodRequests`.
    #[test]
    fn test_resource_config_for_pod() {
        let guaranteed = pod(
            serde_json::json!([
                {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "10Mi"},
                                            "limits": {"cpu": "100m", "memory": "10Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "200m", "memory": "20Mi"},
                                            "limits": {"cpu": "200m", "memory": "20Mi"}}},
            ]),
            serde_json::json!([]),
        );
        assert_eq!(
            pod_resource_config(&guaranteed),
            PodResourceConfig {
                cpu_shares: 307,
                cpu_quota: Some((30_000, 100_000)),
                memory_limit: Some(30 << 20),
            }
        );
        let burstable = pod(
            serde_json::json!([
                {"name": "a", "resources": {"requests": {"cpu": "100m"},
                                            "limits": {"cpu": "1", "memory": "10Mi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "1"}}},
            ]),
            // A big init container: the pod's request is the larger of it and the sum.
            serde_json::json!([{"name": "i", "resources": {
                "requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}}}]),
        );
        assert_eq!(
            pod_resource_config(&burstable),
            PodResourceConfig {
                cpu_shares: 512,
                cpu_quota: Some((200_000, 100_000)),
                memory_limit: None,
            }
        );
        let with_sidecar = pod(
            serde_json::json!([{"name": "a", "resources": {"requests": {"cpu": "100m"}}}]),
            serde_json::json!([
                {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "300m"}}},
                {"name": "i", "resources": {"requests": {"cpu": "350m"}}},
            ]),
        );
        // The sidecar runs beside the init container after it (650m) and the regular one (400m).
        assert_eq!(pod_resource_config(&with_sidecar).cpu_shares, 665);
        let best_effort = pod(serde_json::json!([{"name": "a"}]), serde_json::json!([]));
        assert_eq!(
            pod_resource_config(&best_effort),
            PodResourceConfig {
                cpu_shares: 2,
                cpu_quota: None,
                memory_limit: None,
            }
        );
    }

    /// Upstream `PodRequests`/`PodLimits` with the pod's overhead, as e2e_node's "Pod cgroup
    /// should be sum of overhead and resource limits" checks it: the overhead is added to the
    /// requests and to each non-zero limit, never to a limit the pod does not have.
    #[test]
    fn test_resource_config_for_pod_with_overhead() {
        let mut guaranteed = pod(
            serde_json::json!([
                {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "100Mi"},
                                            "limits": {"cpu": "100m", "memory": "100Mi"}}},
            ]),
            serde_json::json!([]),
        );
        guaranteed.spec.as_mut().unwrap().overhead = Some(
            serde_json::from_value(serde_json::json!({"cpu": "200m", "memory": "140Mi"})).unwrap(),
        );
        assert_eq!(
            pod_resource_config(&guaranteed),
            PodResourceConfig {
                cpu_shares: 307,
                cpu_quota: Some((30_000, 100_000)),
                memory_limit: Some(240 << 20),
            }
        );
        // Burstable without a memory limit: none is made from the overhead alone.
        let mut burstable = pod(
            serde_json::json!([{"name": "a", "resources": {"requests": {"cpu": "100m"},
                                                           "limits": {"cpu": "100m"}}}]),
            serde_json::json!([]),
        );
        burstable.spec.as_mut().unwrap().overhead = Some(
            serde_json::from_value(serde_json::json!({"cpu": "50m", "memory": "10Mi"})).unwrap(),
        );
        assert_eq!(
            pod_resource_config(&burstable),
            PodResourceConfig {
                cpu_shares: 153,
                cpu_quota: Some((15_000, 100_000)),
                memory_limit: None,
            }
        );
    }

    /// A fake cgroup v1 mount (each hierarchy a directory with `cgroup.procs`) with a hybrid
    /// setup's `unified` one.
    fn fake_mount() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for h in ["cpu", "memory", "unified"] {
            std::fs::create_dir(dir.path().join(h)).unwrap();
            std::fs::write(dir.path().join(h).join("cgroup.procs"), "").unwrap();
        }
        std::fs::write(dir.path().join("unified/cgroup.controllers"), "").unwrap();
        dir
    }

    /// Upstream `enforceNodeAllocatableCgroups`: `<cgroupRoot>/kubepods` gets the shares of
    /// the node's CPUs and its memory as the limit (allocatable, no reservations); the QoS
    /// container manager's `Start` makes `burstable` and `besteffort` under it.
    #[test]
    fn node_allocatable_limits_the_kubepods_cgroup() {
        let mount = fake_mount();
        let m = mount.path();
        // The kernel makes a new cgroup's files; the fake's are made beforehand.
        for (file, h) in [("cpu.shares", "cpu"), ("memory.limit_in_bytes", "memory")] {
            let dir = m.join(h).join("r/kubepods");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(file), "0").unwrap();
        }
        let tree = PodCgroupsConfig {
            mount: m.to_owned(),
            root: "/r".into(),
        };
        assert_eq!(tree.pods_cgroup(), "/r/kubepods");
        tree.ensure_top_level_cgroups(2, 8 << 30).unwrap();
        let read = |p: &str| std::fs::read_to_string(m.join(p)).unwrap();
        assert_eq!(read("cpu/r/kubepods/cpu.shares"), "2048");
        assert_eq!(
            read("memory/r/kubepods/memory.limit_in_bytes"),
            (8u64 << 30).to_string()
        );
        for h in ["cpu", "memory", "unified"] {
            for qos in ["burstable", "besteffort"] {
                assert!(m.join(h).join("r/kubepods").join(qos).is_dir(), "{h} {qos}");
            }
        }
        let root = PodCgroupsConfig {
            mount: m.to_owned(),
            root: "/".into(),
        };
        assert_eq!(root.pods_cgroup(), "/kubepods");
    }

    /// Upstream `kubeletCgroups`: the cgroup made in every hierarchy (the unified one too)
    /// and the process written into each; a name climbing out is refused.
    #[test]
    fn move_process_puts_the_process_in_the_cgroup_of_every_hierarchy() {
        let mount = fake_mount();
        let m = mount.path();
        let tree = PodCgroupsConfig {
            mount: m.to_owned(),
            root: "/".into(),
        };
        tree.move_process("/node/kubelet", 4242).unwrap();
        for h in ["cpu", "memory", "unified"] {
            let procs = m.join(h).join("node/kubelet/cgroup.procs");
            assert_eq!(
                std::fs::read_to_string(&procs).unwrap(),
                "4242",
                "{}",
                procs.display()
            );
        }
        let err = tree.move_process("/node/../../etc", 1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
