//! The node's CPU and memory figures from the cgroup tree and `/proc/meminfo`, as cAdvisor
//! reads the root container for the summary's `node` (upstream: cAdvisor's `GetStats` of `/`
//! through runc's `fs`/`fs2` managers), both read under a configurable root so a test can run
//! them on a fake tree. cgroup v2 (`cgroup.controllers` at the root) and v1 (`cpuacct`,
//! `memory` hierarchies) are both read.
//!
//! The working set is usage minus the inactive file pages, as upstream
//! (`cadvisor/container/libcontainer: setMemoryStats`). [`CpuRates`] keeps the previous sample
//! per key and turns cumulative CPU time into `usageNanoCores`, as upstream's CRI stats
//! provider does (`getAndUpdateContainerUsageNanoCores`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Where the node's figures are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsRoots {
    /// The cgroup file system (`/sys/fs/cgroup`).
    pub cgroup: PathBuf,
    /// procfs (`/proc`).
    pub proc: PathBuf,
}

impl Default for StatsRoots {
    fn default() -> Self {
        Self {
            cgroup: PathBuf::from("/sys/fs/cgroup"),
            proc: PathBuf::from("/proc"),
        }
    }
}

/// Which cgroup hierarchy the node has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Separate hierarchies per controller (`cpuacct/`, `memory/`).
    V1,
    /// The unified hierarchy (`cgroup.controllers` at the root).
    V2,
}

/// Why a figure could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// A file of the cgroup tree or procfs could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file did not hold the figure expected.
    #[error("reading {path}: no {field} in it")]
    Missing {
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
    },
}

/// The node's memory figures, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemorySample {
    /// All memory in use.
    pub usage: u64,
    /// Usage minus the inactive file pages.
    pub working_set: u64,
    /// Anonymous memory.
    pub rss: u64,
    /// Minor page faults.
    pub page_faults: u64,
    /// Major page faults.
    pub major_page_faults: u64,
    /// `MemTotal` (the root container's limit).
    pub capacity: u64,
    /// Swap in use (`SwapTotal - SwapFree`); `None` without swap figures.
    pub swap_usage: Option<u64>,
    /// Free swap.
    pub swap_available: Option<u64>,
}

impl MemorySample {
    /// The capacity minus the working set (upstream: `AvailableBytes` of the node).
    pub fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.working_set)
    }
}

/// One reading of the node's root cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeSample {
    /// CPU time used since boot, in core-nanoseconds.
    pub cpu_usage_core_nanos: u64,
    /// Memory.
    pub memory: MemorySample,
}

/// Reads the node's figures under [`StatsRoots`].
#[derive(Clone, Debug, Default)]
pub struct NodeReader {
    roots: StatsRoots,
}

fn read(path: &Path) -> Result<String, StatsError> {
    std::fs::read_to_string(path).map_err(|source| StatsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// `key value` lines (cpu.stat, memory.stat).
fn flat_key(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `/proc/meminfo`'s `field`, in bytes.
fn meminfo(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(':').next() == Some(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn need(path: &Path, text: &str, key: &'static str) -> Result<u64, StatsError> {
    flat_key(text, key).ok_or_else(|| StatsError::Missing {
        path: path.to_owned(),
        field: key,
    })
}

impl NodeReader {
    /// A reader under `roots`.
    pub fn new(roots: StatsRoots) -> Self {
        Self { roots }
    }

    /// The hierarchy under the cgroup root.
    pub fn version(&self) -> CgroupVersion {
        if self.roots.cgroup.join("cgroup.controllers").is_file() {
            CgroupVersion::V2
        } else {
            CgroupVersion::V1
        }
    }

    /// When the machine booted (`btime` of `/proc/stat`): the node's stats start then, as
    /// cAdvisor's root container.
    pub fn boot_time(&self) -> Result<Timestamp, StatsError> {
        let path = self.roots.proc.join("stat");
        let text = read(&path)?;
        let secs = flat_key(&text, "btime").ok_or_else(|| StatsError::Missing {
            path: path.clone(),
            field: "btime",
        })?;
        Timestamp::from_second(i64::try_from(secs).unwrap_or(0)).map_err(|_| StatsError::Missing {
            path,
            field: "btime",
        })
    }

    /// The root cgroup's CPU and memory now.
    pub fn read(&self) -> Result<NodeSample, StatsError> {
        let meminfo_path = self.roots.proc.join("meminfo");
        let mem = read(&meminfo_path)?;
        let field = |name: &'static str| {
            meminfo(&mem, name).ok_or_else(|| StatsError::Missing {
                path: meminfo_path.clone(),
                field: name,
            })
        };
        let capacity = field("MemTotal")?;
        let swap = meminfo(&mem, "SwapTotal").zip(meminfo(&mem, "SwapFree"));
        let cgroup = &self.roots.cgroup;
        let (cpu, usage, stat_path, stat, prefix) = match self.version() {
            CgroupVersion::V2 => {
                let cpu_path = cgroup.join("cpu.stat");
                let cpu = need(&cpu_path, &read(&cpu_path)?, "usage_usec")? * 1_000;
                // The root has no memory.current: runc's fs2 reads usage from meminfo.
                let usage = capacity.saturating_sub(field("MemFree")?);
                let stat_path = cgroup.join("memory.stat");
                let stat = read(&stat_path)?;
                (cpu, usage, stat_path, stat, "")
            }
            CgroupVersion::V1 => {
                let cpu_path = cgroup.join("cpuacct/cpuacct.usage");
                let cpu_text = read(&cpu_path)?;
                let cpu = cpu_text.trim().parse().map_err(|_| StatsError::Missing {
                    path: cpu_path.clone(),
                    field: "usage",
                })?;
                let usage_path = cgroup.join("memory/memory.usage_in_bytes");
                let usage_text = read(&usage_path)?;
                let usage = usage_text.trim().parse().map_err(|_| StatsError::Missing {
                    path: usage_path.clone(),
                    field: "usage_in_bytes",
                })?;
                let stat_path = cgroup.join("memory/memory.stat");
                let stat = read(&stat_path)?;
                (cpu, usage, stat_path, stat, "total_")
            }
        };
        let key = |name: &str| format!("{prefix}{name}");
        let inactive_file = flat_key(&stat, &key("inactive_file")).unwrap_or(0);
        let rss_key = match self.version() {
            CgroupVersion::V2 => "anon".to_owned(),
            CgroupVersion::V1 => key("rss"),
        };
        let rss = flat_key(&stat, &rss_key).ok_or_else(|| StatsError::Missing {
            path: stat_path.clone(),
            field: "rss",
        })?;
        Ok(NodeSample {
            cpu_usage_core_nanos: cpu,
            memory: MemorySample {
                usage,
                // upstream: `workingSet = usage - inactive_file`, never below zero.
                working_set: usage.saturating_sub(inactive_file),
                rss,
                page_faults: flat_key(&stat, &key("pgfault")).unwrap_or(0),
                major_page_faults: flat_key(&stat, &key("pgmajfault")).unwrap_or(0),
                capacity,
                swap_usage: swap.map(|(total, free)| total.saturating_sub(free)),
                swap_available: swap.map(|(_, free)| free),
            },
        })
    }
}

/// A cumulative CPU reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuReading {
    /// CPU time used, in core-nanoseconds.
    pub usage_core_nanos: u64,
    /// When it was read.
    pub at: Timestamp,
}

/// How long an unused sample is kept (upstream: `defaultCachePeriod`, 10 minutes).
const CACHE_PERIOD: SignedDuration = SignedDuration::from_secs(600);

/// The previous CPU reading per key (a container ID, a pod UID, the node), to make a rate of
/// two readings (upstream: the CRI stats provider's `cpuUsageCache`).
#[derive(Debug, Default)]
pub struct CpuRates {
    previous: Mutex<HashMap<String, (CpuReading, Option<u64>)>>,
}

impl CpuRates {
    /// `usageNanoCores` between the previous reading of `key` and `now`, which replaces it;
    /// `None` for the first reading, a reading not newer, or a counter that went back (a
    /// restarted container). upstream: `getAndUpdateContainerUsageNanoCores`.
    pub fn update(&self, key: &str, now: CpuReading) -> Option<u64> {
        let mut previous = self.previous.lock().unwrap_or_else(|e| e.into_inner());
        let rate = previous.get(key).and_then(|(before, _)| {
            let nanos = now.at.duration_since(before.at).as_nanos();
            if nanos <= 0 || now.usage_core_nanos < before.usage_core_nanos {
                return None;
            }
            let used = (now.usage_core_nanos - before.usage_core_nanos) as f64;
            Some((used / nanos as f64 * 1e9) as u64)
        });
        previous.insert(key.to_owned(), (now, rate));
        rate
    }

    /// The rate the last [`Self::update`] of `key` made, without a new reading (upstream:
    /// `getContainerUsageNanoCores`, for the CPU-and-memory summary).
    pub fn last(&self, key: &str) -> Option<u64> {
        let previous = self.previous.lock().unwrap_or_else(|e| e.into_inner());
        previous.get(key).and_then(|(_, rate)| *rate)
    }

    /// Forgets readings older than the cache period before `now` (upstream:
    /// `cleanupOutdatedCaches`).
    pub fn forget_older_than_period(&self, now: Timestamp) {
        let mut previous = self.previous.lock().unwrap_or_else(|e| e.into_inner());
        previous.retain(|_, (r, _)| now.duration_since(r.at) <= CACHE_PERIOD);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:        8000000 kB\nMemFree:         3000000 kB\n\
        MemAvailable:    6000000 kB\nSwapTotal:       1000 kB\nSwapFree:        600 kB\n";

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// The summary's node stats from a fake cgroup v2 tree: CPU from `cpu.stat`, usage from
    /// meminfo (the root has no `memory.current`), working set = usage - inactive_file.
    #[test]
    fn node_stats_from_a_fake_cgroup_v2_tree() {
        let dir = tempfile::tempdir().unwrap();
        let (cgroup, proc) = (dir.path().join("cgroup"), dir.path().join("proc"));
        write(&cgroup, "cgroup.controllers", "cpu memory pids\n");
        write(
            &cgroup,
            "cpu.stat",
            "usage_usec 5000000\nuser_usec 4000000\n",
        );
        write(
            &cgroup,
            "memory.stat",
            "anon 1048576\nfile 4096000\ninactive_file 1024000\nactive_file 2000\n\
             pgfault 77\npgmajfault 3\n",
        );
        write(&proc, "meminfo", MEMINFO);
        write(&proc, "stat", "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n");
        let reader = NodeReader::new(StatsRoots { cgroup, proc });
        assert_eq!(reader.version(), CgroupVersion::V2);
        assert_eq!(reader.boot_time().unwrap().as_second(), 1_700_000_000);
        let sample = reader.read().unwrap();
        let usage = (8_000_000 - 3_000_000) * 1024;
        assert_eq!(
            sample,
            NodeSample {
                cpu_usage_core_nanos: 5_000_000_000,
                memory: MemorySample {
                    usage,
                    working_set: usage - 1_024_000,
                    rss: 1_048_576,
                    page_faults: 77,
                    major_page_faults: 3,
                    capacity: 8_000_000 * 1024,
                    swap_usage: Some(400 * 1024),
                    swap_available: Some(600 * 1024),
                },
            }
        );
        assert_eq!(
            sample.memory.available(),
            8_000_000 * 1024 - (usage - 1_024_000)
        );
    }

    /// The same from a fake cgroup v1 tree: `cpuacct.usage`, `memory.usage_in_bytes` and the
    /// hierarchy's `total_*` of `memory.stat`.
    #[test]
    fn node_stats_from_a_fake_cgroup_v1_tree() {
        let dir = tempfile::tempdir().unwrap();
        let (cgroup, proc) = (dir.path().join("cgroup"), dir.path().join("proc"));
        write(&cgroup, "cpuacct/cpuacct.usage", "123456789\n");
        write(&cgroup, "memory/memory.usage_in_bytes", "900000\n");
        write(
            &cgroup,
            "memory/memory.stat",
            "rss 1\ninactive_file 2\ntotal_rss 500000\ntotal_inactive_file 100000\n\
             total_pgfault 9\ntotal_pgmajfault 1\n",
        );
        write(&proc, "meminfo", MEMINFO);
        let reader = NodeReader::new(StatsRoots { cgroup, proc });
        assert_eq!(reader.version(), CgroupVersion::V1);
        let sample = reader.read().unwrap();
        assert_eq!(sample.cpu_usage_core_nanos, 123_456_789);
        assert_eq!(sample.memory.usage, 900_000);
        assert_eq!(sample.memory.working_set, 800_000);
        assert_eq!(sample.memory.rss, 500_000);
        assert_eq!(
            (sample.memory.page_faults, sample.memory.major_page_faults),
            (9, 1)
        );
    }

    /// A tree without the CPU file is an error naming the file.
    #[test]
    fn a_missing_cgroup_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let (cgroup, proc) = (dir.path().join("cgroup"), dir.path().join("proc"));
        write(&cgroup, "cgroup.controllers", "cpu\n");
        write(&proc, "meminfo", MEMINFO);
        let err = NodeReader::new(StatsRoots { cgroup, proc })
            .read()
            .unwrap_err();
        assert!(err.to_string().contains("cpu.stat"), "{err}");
    }

    /// upstream: `getAndUpdateContainerUsageNanoCores`: none from one reading, the rate from
    /// two, none when the counter went back.
    #[test]
    fn usage_nano_cores_needs_two_readings() {
        let rates = CpuRates::default();
        let t0 = Timestamp::from_second(1_000).unwrap();
        let at = |secs: i64| t0.checked_add(SignedDuration::from_secs(secs)).unwrap();
        let reading = |usage, secs| CpuReading {
            usage_core_nanos: usage,
            at: at(secs),
        };
        assert_eq!(rates.update("c", reading(1_000_000_000, 0)), None);
        // 0.5 s of CPU in 2 s: a quarter of a core.
        assert_eq!(rates.last("c"), None);
        assert_eq!(
            rates.update("c", reading(1_500_000_000, 2)),
            Some(250_000_000)
        );
        assert_eq!(rates.last("c"), Some(250_000_000));
        assert_eq!(rates.update("c", reading(10, 3)), None);
        assert_eq!(rates.update("c", reading(10, 3)), None, "not newer");
        rates.forget_older_than_period(at(3 + 601));
        assert_eq!(rates.update("c", reading(20, 605)), None, "forgotten");
    }
}
