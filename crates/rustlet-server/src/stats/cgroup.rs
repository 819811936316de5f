//! The node's CPU and memory figures from the cgroup tree and `/proc/meminfo`, as cAdvisor
//! reads the root container for the summary's `node` (upstream: cAdvisor's `GetStats` of `/`
//! through runc's `fs`/`fs2` managers), and any cgroup's ([`NodeReader::read_cgroup`]: the
//! system containers, the pods, the containers), with their pressure files and processes,
//! the node's pressures (`/proc/pressure`) and a process's interfaces and cgroups, all read
//! under a configurable root so a test can run them on a fake tree. cgroup v2
//! (`cgroup.controllers` at the root) and v1 (`cpuacct`, `memory`, `pids` hierarchies, with a
//! hybrid host's `unified` v2 one for the pressures) are read.
//!
//! The working set is usage minus the inactive file pages, as upstream
//! (`cadvisor/container/libcontainer: setMemoryStats`). [`CpuRates`] keeps the previous sample
//! per key and turns cumulative CPU time into `usageNanoCores`, as upstream's CRI stats
//! provider does (`getAndUpdateContainerUsageNanoCores`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::summary::{InterfaceStats, PsiStats};

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
                // cAdvisor's `setMemoryStats`: `pgfault`/`pgmajfault` as the file has them, on
                // v1 the root cgroup's own (not `total_`: a long-running build machine's
                // hierarchical count passes the summary spec's bound of 1e9).
                page_faults: flat_key(&stat, "pgfault").unwrap_or(0),
                major_page_faults: flat_key(&stat, "pgmajfault").unwrap_or(0),
                capacity,
                swap_usage: swap.map(|(total, free)| total.saturating_sub(free)),
                swap_available: swap.map(|(_, free)| free),
            },
        })
    }
}

/// A cgroup's path in each hierarchy (upstream names a cgroup once for every hierarchy; a
/// process's own cgroups may differ per hierarchy on cgroup v1, as the agent's own do on a
/// host that puts sessions in a memory cgroup only). On cgroup v2 all are the one path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupPaths {
    /// In the CPU-accounting hierarchy (v1 `cpuacct`).
    pub cpu: String,
    /// In the memory hierarchy.
    pub memory: String,
    /// In the pids hierarchy (its processes are counted there).
    pub pids: String,
    /// In the v2 hierarchy (on a v1 host, the hybrid setup's `unified` one), where its
    /// pressure files are; `None` when there is none.
    pub unified: Option<String>,
}

impl CgroupPaths {
    /// One cgroup name in every hierarchy (upstream's cgroupfs names: `/kubepods`, a
    /// container's `<parent>/<id>`).
    pub fn uniform(name: &str) -> Self {
        Self {
            cpu: name.to_owned(),
            memory: name.to_owned(),
            pids: name.to_owned(),
            unified: Some(name.to_owned()),
        }
    }

    /// A process's cgroups from its `/proc/<pid>/cgroup` (`id:controllers:path` lines; `0::path`
    /// the v2 one), upstream `cgroups.ParseCgroupFile`. On a v2 host every path is the v2 one.
    pub fn of_process(text: &str) -> Option<Self> {
        let mut by_controller: HashMap<&str, &str> = HashMap::new();
        let mut unified = None;
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if controllers.is_empty() {
                unified = Some(path);
            }
            for controller in controllers.split(',') {
                by_controller.insert(controller, path);
            }
        }
        let v1 = |c: &str| by_controller.get(c).map(|p| (*p).to_owned());
        match (v1("cpuacct"), v1("memory")) {
            (Some(cpu), Some(memory)) => Some(Self {
                pids: v1("pids").unwrap_or_else(|| cpu.clone()),
                cpu,
                memory,
                unified: unified.map(str::to_owned),
            }),
            _ => unified.map(Self::uniform),
        }
    }
}

/// A cgroup's memory figures, in bytes (upstream: cAdvisor's `MemoryStats` of runc's managers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupMemory {
    /// All memory in use (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub usage: u64,
    /// Usage minus the inactive file pages.
    pub working_set: u64,
    /// Anonymous memory (v1 `total_rss`, v2 `anon`).
    pub rss: u64,
    /// Minor page faults of the cgroup itself (`pgfault`).
    pub page_faults: u64,
    /// Major page faults (`pgmajfault`).
    pub major_page_faults: u64,
    /// The limit; `None` when unlimited (above 2^62, upstream `isMemoryUnlimited`).
    pub limit: Option<u64>,
}

impl CgroupMemory {
    /// The limit minus the working set (upstream: `availableBytes`), none without a limit.
    pub fn available(&self) -> Option<u64> {
        self.limit.map(|l| l.saturating_sub(self.working_set))
    }
}

/// The three pressures of a cgroup (or of the node, `/proc/pressure`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pressures {
    /// `cpu.pressure`.
    pub cpu: Option<PsiStats>,
    /// `memory.pressure`.
    pub memory: Option<PsiStats>,
    /// `io.pressure`.
    pub io: Option<PsiStats>,
}

/// One reading of a cgroup (upstream: what the summary takes of cAdvisor's `ContainerStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CgroupSample {
    /// CPU time used, in core-nanoseconds.
    pub cpu_usage_core_nanos: u64,
    /// Memory.
    pub memory: CgroupMemory,
    /// Its pressures (none where the kernel or the hierarchy has no pressure files).
    pub pressure: Pressures,
    /// The processes in it (upstream: cAdvisor's `ProcessCount`, `cgroup.procs`).
    pub processes: u64,
    /// When it was made (upstream: cAdvisor's `CreationTime`, the oldest of its directories'
    /// modification times).
    pub created: Option<Timestamp>,
}

/// A `*.pressure` file (`some avg10=.. avg60=.. avg300=.. total=..` and `full ...`); a missing
/// `full` line (the CPU's before Linux 5.13) reads as zeros, as runc's `statPSI`.
pub fn parse_psi(text: &str) -> Option<PsiStats> {
    let mut out = PsiStats::default();
    let mut some = false;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let data = match fields.next() {
            Some("some") => {
                some = true;
                &mut out.some
            }
            Some("full") => &mut out.full,
            _ => continue,
        };
        for field in fields {
            let (key, value) = field.split_once('=')?;
            match key {
                "avg10" => data.avg10 = value.parse().ok()?,
                "avg60" => data.avg60 = value.parse().ok()?,
                "avg300" => data.avg300 = value.parse().ok()?,
                "total" => data.total = value.parse().ok()?,
                _ => {}
            }
        }
    }
    some.then_some(out)
}

/// `/proc/<pid>/net/dev`'s interfaces (upstream: cAdvisor's network stats, which leave out
/// `lo`, `veth*` and `docker*`).
pub fn parse_net_dev(text: &str) -> Vec<InterfaceStats> {
    text.lines()
        .skip(2)
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let name = name.trim();
            if name == "lo" || name.starts_with("veth") || name.starts_with("docker") {
                return None;
            }
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(|v| v.parse().ok())
                .collect::<Option<_>>()?;
            // Receive: bytes packets errs ...(8 fields); transmit: bytes packets errs ...
            (f.len() >= 11).then(|| InterfaceStats {
                name: name.to_owned(),
                rx_bytes: Some(f[0]),
                rx_errors: Some(f[2]),
                tx_bytes: Some(f[8]),
                tx_errors: Some(f[10]),
            })
        })
        .collect()
}

/// Whether a cgroup directory's name is a container's (64 hex digits, runc's cgroupfs name) or
/// a pod's (`pod<uid>`).
fn is_workload_cgroup(name: &str) -> bool {
    (name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())) || name.starts_with("pod")
}

/// How deep [`NodeReader::workload_cgroups`] looks (`<root>/kubepods/<qos>/pod<uid>/<id>`
/// under a nested cgroup root).
const WORKLOAD_DEPTH: usize = 8;

impl NodeReader {
    /// The directory of `name` in the hierarchy of `controller` (`cpuacct`, `memory`, `pids`;
    /// the v2 hierarchy on a v2 host).
    fn v1_dir(&self, controller: &str) -> PathBuf {
        let cgroup = &self.roots.cgroup;
        if self.version() == CgroupVersion::V2 {
            return cgroup.clone();
        }
        let own = cgroup.join(controller);
        if own.is_dir() {
            return own;
        }
        // Distributions that mount `cpu,cpuacct` together.
        let joint = cgroup.join(format!("cpu,{controller}"));
        if joint.is_dir() { joint } else { own }
    }

    /// The v2 hierarchy: the root on a v2 host, `unified` on a hybrid one.
    fn v2_dir(&self) -> Option<PathBuf> {
        match self.version() {
            CgroupVersion::V2 => Some(self.roots.cgroup.clone()),
            CgroupVersion::V1 => {
                let unified = self.roots.cgroup.join("unified");
                unified
                    .join("cgroup.controllers")
                    .is_file()
                    .then_some(unified)
            }
        }
    }

    fn under(dir: &Path, name: &str) -> PathBuf {
        dir.join(name.trim_start_matches('/'))
    }

    /// The node's pressures (`/proc/pressure`, upstream: the root cgroup's).
    pub fn node_pressure(&self) -> Pressures {
        let read = |what: &str| {
            std::fs::read_to_string(self.roots.proc.join("pressure").join(what))
                .ok()
                .as_deref()
                .and_then(parse_psi)
        };
        Pressures {
            cpu: read("cpu"),
            memory: read("memory"),
            io: read("io"),
        }
    }

    /// The cgroups of process `pid` (`/proc/<pid>/cgroup`).
    pub fn process_cgroups(&self, pid: u32) -> Result<CgroupPaths, StatsError> {
        let path = self.roots.proc.join(pid.to_string()).join("cgroup");
        CgroupPaths::of_process(&read(&path)?).ok_or(StatsError::Missing {
            path,
            field: "cpuacct and memory cgroups",
        })
    }

    /// The interfaces of process `pid`'s network namespace.
    pub fn process_interfaces(&self, pid: u32) -> Result<Vec<InterfaceStats>, StatsError> {
        let path = self.roots.proc.join(pid.to_string()).join("net/dev");
        Ok(parse_net_dev(&read(&path)?))
    }

    /// The first process of cgroup `name` (in the pids hierarchy, or the v2 one).
    pub fn first_process(&self, name: &str) -> Option<u32> {
        let path = Self::under(&self.v1_dir("pids"), name).join("cgroup.procs");
        read(&path)
            .ok()?
            .lines()
            .find_map(|l| l.trim().parse().ok())
    }

    /// The containers' and pods' cgroups by their directories' names (a container ID,
    /// `pod<uid>`), as cAdvisor finds them by walking the hierarchy (upstream:
    /// `extractIDFromCgroupPath`): name to cgroup path.
    pub fn workload_cgroups(&self) -> HashMap<String, String> {
        let mut found = HashMap::new();
        let top = self.v1_dir("cpuacct");
        let mut stack = vec![(top.clone(), 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if is_workload_cgroup(&name)
                    && let Ok(rel) = path.strip_prefix(&top)
                {
                    found.insert(name, format!("/{}", rel.display()));
                }
                if depth + 1 < WORKLOAD_DEPTH {
                    stack.push((path, depth + 1));
                }
            }
        }
        found
    }

    /// A cgroup's CPU, memory, pressures and processes (upstream: cAdvisor's `GetStats` of a
    /// container through runc's `fs`/`fs2` managers; the pressures also from a hybrid host's
    /// unified hierarchy, where runc makes each cgroup too, which upstream leaves out).
    pub fn read_cgroup(&self, paths: &CgroupPaths) -> Result<CgroupSample, StatsError> {
        let v2 = self.version() == CgroupVersion::V2;
        let cpu_dir = Self::under(&self.v1_dir("cpuacct"), &paths.cpu);
        let memory_dir = Self::under(&self.v1_dir("memory"), &paths.memory);
        let parse = |path: PathBuf, field: &'static str| -> Result<u64, StatsError> {
            let text = read(&path)?;
            text.trim()
                .parse()
                .map_err(|_| StatsError::Missing { path, field })
        };
        let cpu = if v2 {
            let path = cpu_dir.join("cpu.stat");
            need(&path, &read(&path)?, "usage_usec")? * 1_000
        } else {
            parse(cpu_dir.join("cpuacct.usage"), "usage")?
        };
        let (usage, limit, stat_path) = if v2 {
            let limit = read(&memory_dir.join("memory.max"))
                .ok()
                .and_then(|l| l.trim().parse::<u64>().ok());
            (
                parse(memory_dir.join("memory.current"), "memory.current")?,
                limit,
                memory_dir.join("memory.stat"),
            )
        } else {
            (
                parse(memory_dir.join("memory.usage_in_bytes"), "usage_in_bytes")?,
                parse(memory_dir.join("memory.limit_in_bytes"), "limit_in_bytes").ok(),
                memory_dir.join("memory.stat"),
            )
        };
        let stat = read(&stat_path)?;
        let (inactive_file, rss) = if v2 {
            ("inactive_file", "anon")
        } else {
            ("total_inactive_file", "total_rss")
        };
        let memory = CgroupMemory {
            usage,
            working_set: usage.saturating_sub(flat_key(&stat, inactive_file).unwrap_or(0)),
            rss: need(&stat_path, &stat, rss)?,
            page_faults: flat_key(&stat, "pgfault").unwrap_or(0),
            major_page_faults: flat_key(&stat, "pgmajfault").unwrap_or(0),
            limit: limit.filter(|l| *l <= 1 << 62),
        };
        let pressure = match (self.v2_dir(), &paths.unified) {
            (Some(dir), Some(name)) => {
                let dir = Self::under(&dir, name);
                let psi = |file: &str| {
                    std::fs::read_to_string(dir.join(file))
                        .ok()
                        .as_deref()
                        .and_then(parse_psi)
                };
                Pressures {
                    cpu: psi("cpu.pressure"),
                    memory: psi("memory.pressure"),
                    io: psi("io.pressure"),
                }
            }
            _ => Pressures::default(),
        };
        let pids_dir = Self::under(&self.v1_dir("pids"), &paths.pids);
        let processes = read(&pids_dir.join("cgroup.procs"))
            .map(|t| t.lines().filter(|l| !l.trim().is_empty()).count() as u64)
            .unwrap_or(0);
        let created = [&cpu_dir, &memory_dir]
            .iter()
            .filter_map(|d| std::fs::metadata(d).ok()?.modified().ok())
            .min()
            .and_then(|t| Timestamp::try_from(t).ok());
        Ok(CgroupSample {
            cpu_usage_core_nanos: cpu,
            memory,
            pressure,
            processes,
            created,
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

/// The shortest span a CPU rate is made over (upstream: cAdvisor's housekeeping interval,
/// which the kubelet sets to 10 s).
pub const RATE_WINDOW: SignedDuration = SignedDuration::from_secs(10);

/// How long an unused sample is kept (upstream: `defaultCachePeriod`, 10 minutes).
const CACHE_PERIOD: SignedDuration = SignedDuration::from_secs(600);

/// The previous CPU reading per key (a container ID, a pod UID, the node), to make a rate of
/// two readings (upstream: the CRI stats provider's `cpuUsageCache`).
#[derive(Debug, Default)]
pub struct CpuRates {
    previous: Mutex<HashMap<String, (CpuReading, Option<u64>)>>,
}

impl CpuRates {
    /// `usageNanoCores` of `key` at reading `now`: the rate between the previous reading and
    /// `now`, which replaces it, once they are [`RATE_WINDOW`] apart or when there is no rate
    /// yet; within the window, the last rate, and the previous reading stays (upstream: the
    /// cAdvisor overlay's `CpuInst`, of its two last samples a housekeeping interval apart,
    /// whatever the requests in between; without it `getAndUpdateContainerUsageNanoCores`).
    /// `None` for the first reading, a reading not newer, or a counter that went back (a
    /// restarted container).
    pub fn update(&self, key: &str, now: CpuReading) -> Option<u64> {
        let mut previous = self.previous.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((before, Some(rate))) = previous.get(key)
            && now.usage_core_nanos >= before.usage_core_nanos
            && now.at.duration_since(before.at) < RATE_WINDOW
        {
            return Some(*rate);
        }
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
            "rss 1\ninactive_file 2\npgfault 7\npgmajfault 0\ntotal_rss 500000\n\
             total_inactive_file 100000\ntotal_pgfault 9\ntotal_pgmajfault 1\n",
        );
        write(&proc, "meminfo", MEMINFO);
        let reader = NodeReader::new(StatsRoots { cgroup, proc });
        assert_eq!(reader.version(), CgroupVersion::V1);
        let sample = reader.read().unwrap();
        assert_eq!(sample.cpu_usage_core_nanos, 123_456_789);
        assert_eq!(sample.memory.usage, 900_000);
        assert_eq!(sample.memory.working_set, 800_000);
        assert_eq!(sample.memory.rss, 500_000);
        // cAdvisor's: the root cgroup's own `pgfault`/`pgmajfault`, not the `total_` ones.
        assert_eq!(
            (sample.memory.page_faults, sample.memory.major_page_faults),
            (7, 0)
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
    /// two, none when the counter went back; and cAdvisor's `CpuInst`: readings closer than
    /// the housekeeping window keep the last rate (a request right after another does not
    /// read a rate of a few milliseconds, 0 for a sleeping process).
    #[test]
    fn usage_nano_cores_needs_two_readings() {
        let rates = CpuRates::default();
        let t0 = Timestamp::from_second(1_000).unwrap();
        let at = |millis: i64| t0.checked_add(SignedDuration::from_millis(millis)).unwrap();
        let reading = |usage, millis| CpuReading {
            usage_core_nanos: usage,
            at: at(millis),
        };
        assert_eq!(rates.update("c", reading(1_000_000_000, 0)), None);
        assert_eq!(rates.last("c"), None);
        // 0.5 s of CPU in 2 s: a quarter of a core (no rate yet: made at once).
        assert_eq!(
            rates.update("c", reading(1_500_000_000, 2_000)),
            Some(250_000_000)
        );
        assert_eq!(rates.last("c"), Some(250_000_000));
        // 40 ms later, nothing used: still the last rate, not 0.
        assert_eq!(
            rates.update("c", reading(1_500_000_000, 2_040)),
            Some(250_000_000)
        );
        // A window after the reading the rate was made at: the new rate (1 s in 10 s).
        assert_eq!(
            rates.update("c", reading(2_500_000_000, 12_000)),
            Some(100_000_000)
        );
        assert_eq!(rates.update("c", reading(10, 13_000)), None, "went back");
        assert_eq!(rates.update("c", reading(10, 13_000)), None, "not newer");
        rates.forget_older_than_period(at(13_000 + 601_000));
        assert_eq!(rates.update("c", reading(20, 615_000)), None, "forgotten");
    }

    const PSI: &str = "some avg10=1.50 avg60=0.25 avg300=0.00 total=123456\n\
        full avg10=0.75 avg60=0.00 avg300=0.00 total=6543\n";

    /// runc's `statPSI`: both lines; a file without `full` (the CPU's before Linux 5.13) has
    /// zeros there; a file that is not a pressure file is none.
    #[test]
    fn pressure_files_are_parsed_as_runc_does() {
        let psi = parse_psi(PSI).unwrap();
        assert_eq!(psi.some.total, 123_456);
        assert_eq!((psi.some.avg10, psi.some.avg60), (1.5, 0.25));
        assert_eq!((psi.full.total, psi.full.avg10), (6543, 0.75));
        let no_full = parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=9\n").unwrap();
        assert_eq!(no_full.some.total, 9);
        assert_eq!(no_full.full, Default::default());
        assert_eq!(parse_psi(""), None);
        assert_eq!(parse_psi("some avg10=x total=1\n"), None);
    }

    /// upstream `cgroups.ParseCgroupFile`: a hybrid host's per-hierarchy paths (the session's
    /// memory cgroup apart from its CPU one), and a v2 host's one path.
    #[test]
    fn a_process_cgroups_are_read_per_hierarchy() {
        let hybrid = "9:name=systemd:/\n8:pids:/p\n4:memory:/session/1\n2:cpuacct:/\n\
            1:cpu:/\n0::/u\n";
        assert_eq!(
            CgroupPaths::of_process(hybrid).unwrap(),
            CgroupPaths {
                cpu: "/".into(),
                memory: "/session/1".into(),
                pids: "/p".into(),
                unified: Some("/u".into()),
            }
        );
        let joint = "3:cpu,cpuacct:/a\n2:memory:/a\n";
        let paths = CgroupPaths::of_process(joint).unwrap();
        assert_eq!((paths.cpu.as_str(), paths.pids.as_str()), ("/a", "/a"));
        assert_eq!(paths.unified, None);
        assert_eq!(
            CgroupPaths::of_process("0::/system.slice/x.service\n").unwrap(),
            CgroupPaths::uniform("/system.slice/x.service")
        );
        assert_eq!(CgroupPaths::of_process("garbage"), None);
    }

    /// A fake hybrid tree: v1 `cpuacct`, `memory`, `pids` and the `unified` v2 hierarchy.
    fn hybrid_tree(root: &Path) -> NodeReader {
        let (cgroup, proc) = (root.join("cgroup"), root.join("proc"));
        write(&cgroup, "unified/cgroup.controllers", "");
        write(&cgroup, "cpuacct/cpuacct.usage", "1\n");
        write(&proc, "meminfo", MEMINFO);
        NodeReader::new(StatsRoots { cgroup, proc })
    }

    /// cAdvisor's figures of a v1 cgroup (runc's `fs` manager): `cpuacct.usage`, usage minus
    /// `total_inactive_file`, `total_rss`, the cgroup's own `pgfault`; `availableBytes` is the
    /// limit minus the working set; the processes of `cgroup.procs`; the pressures from the
    /// hybrid setup's unified hierarchy.
    #[test]
    fn a_v1_cgroup_is_read_as_cadvisor_reads_it_with_the_unified_pressures() {
        let dir = tempfile::tempdir().unwrap();
        let reader = hybrid_tree(dir.path());
        let cgroup = dir.path().join("cgroup");
        let c = "k/pod1/abc";
        write(&cgroup, &format!("cpuacct/{c}/cpuacct.usage"), "20000000\n");
        write(
            &cgroup,
            &format!("memory/{c}/memory.usage_in_bytes"),
            "3000000\n",
        );
        write(
            &cgroup,
            &format!("memory/{c}/memory.limit_in_bytes"),
            "80000000\n",
        );
        write(
            &cgroup,
            &format!("memory/{c}/memory.stat"),
            "rss 5\npgfault 300\npgmajfault 2\ntotal_rss 1000000\ntotal_inactive_file 500000\n\
             total_pgfault 900\n",
        );
        write(&cgroup, &format!("pids/{c}/cgroup.procs"), "12\n13\n14\n");
        for file in ["cpu.pressure", "memory.pressure", "io.pressure"] {
            write(&cgroup, &format!("unified/{c}/{file}"), PSI);
        }
        let sample = reader
            .read_cgroup(&CgroupPaths::uniform("/k/pod1/abc"))
            .unwrap();
        assert_eq!(sample.cpu_usage_core_nanos, 20_000_000);
        assert_eq!(
            sample.memory,
            CgroupMemory {
                usage: 3_000_000,
                working_set: 2_500_000,
                rss: 1_000_000,
                page_faults: 300,
                major_page_faults: 2,
                limit: Some(80_000_000),
            }
        );
        assert_eq!(sample.memory.available(), Some(77_500_000));
        assert_eq!(sample.processes, 3);
        let psi = parse_psi(PSI);
        assert_eq!(
            sample.pressure,
            Pressures {
                cpu: psi,
                memory: psi,
                io: psi
            }
        );
        assert!(sample.created.is_some());
        // Unlimited (the kernel's 2^63 rounded down to a page): no availableBytes.
        write(
            &cgroup,
            &format!("memory/{c}/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        let sample = reader
            .read_cgroup(&CgroupPaths::uniform("/k/pod1/abc"))
            .unwrap();
        assert_eq!(sample.memory.available(), None);
        // Without a unified hierarchy: no pressures.
        std::fs::remove_file(cgroup.join("unified/cgroup.controllers")).unwrap();
        let sample = reader
            .read_cgroup(&CgroupPaths::uniform("/k/pod1/abc"))
            .unwrap();
        assert_eq!(sample.pressure, Pressures::default());
        let err = reader
            .read_cgroup(&CgroupPaths::uniform("/gone"))
            .unwrap_err();
        assert!(err.to_string().contains("gone"), "{err}");
    }

    /// runc's `fs2` manager: `cpu.stat`'s `usage_usec`, `memory.current`, `anon`, `memory.max`
    /// (`max`: unlimited) and the cgroup's own pressure files.
    #[test]
    fn a_v2_cgroup_is_read_with_its_pressures() {
        let dir = tempfile::tempdir().unwrap();
        let (cgroup, proc) = (dir.path().join("cgroup"), dir.path().join("proc"));
        write(&cgroup, "cgroup.controllers", "cpu memory pids\n");
        write(&cgroup, "kubelet/cpu.stat", "usage_usec 40000\n");
        write(&cgroup, "kubelet/memory.current", "2000000\n");
        write(&cgroup, "kubelet/memory.max", "max\n");
        write(
            &cgroup,
            "kubelet/memory.stat",
            "anon 1500000\ninactive_file 100000\npgfault 5000\npgmajfault 1\n",
        );
        write(&cgroup, "kubelet/cgroup.procs", "7\n");
        write(&cgroup, "kubelet/memory.pressure", PSI);
        let reader = NodeReader::new(StatsRoots { cgroup, proc });
        let sample = reader
            .read_cgroup(&CgroupPaths::uniform("/kubelet"))
            .unwrap();
        assert_eq!(sample.cpu_usage_core_nanos, 40_000_000);
        assert_eq!(sample.memory.working_set, 1_900_000);
        assert_eq!(sample.memory.rss, 1_500_000);
        assert_eq!(sample.memory.page_faults, 5000);
        assert_eq!(sample.memory.available(), None);
        assert_eq!(sample.processes, 1);
        assert_eq!(sample.pressure.memory, parse_psi(PSI));
        assert_eq!(sample.pressure.cpu, None);
    }

    /// cAdvisor finds containers by their cgroups' names (`extractIDFromCgroupPath`): the
    /// containers' (64 hex digits) and pods' (`pod<uid>`) directories anywhere in the tree.
    #[test]
    fn workload_cgroups_are_found_by_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let reader = hybrid_tree(dir.path());
        let cgroup = dir.path().join("cgroup");
        let id = "a".repeat(64);
        let sandbox = "0123456789abcdef".repeat(4);
        for path in [
            format!("cpuacct/r/kubepods/burstable/poduid-1/{id}"),
            format!("cpuacct/r/kubepods/burstable/poduid-1/{sandbox}"),
            "cpuacct/r/kubepods/besteffort".to_owned(),
            "cpuacct/system/not-a-container".to_owned(),
        ] {
            std::fs::create_dir_all(cgroup.join(path)).unwrap();
        }
        let found = reader.workload_cgroups();
        assert_eq!(found.len(), 3, "{found:?}");
        assert_eq!(found["poduid-1"], "/r/kubepods/burstable/poduid-1");
        assert_eq!(found[&id], format!("/r/kubepods/burstable/poduid-1/{id}"));
        assert!(found.contains_key(&sandbox));
        // The sandbox's first process, in the pids hierarchy.
        write(
            &cgroup,
            &format!("pids/r/kubepods/burstable/poduid-1/{sandbox}/cgroup.procs"),
            "4711\n4712\n",
        );
        assert_eq!(reader.first_process(&found[&sandbox]), Some(4711));
    }

    /// cAdvisor's network figures of `/proc/<pid>/net/dev`, without `lo` and `veth*`; the
    /// node's pressures from `/proc/pressure`; a process's cgroups from `/proc/<pid>/cgroup`.
    #[test]
    fn procfs_gives_interfaces_node_pressures_and_process_cgroups() {
        let dir = tempfile::tempdir().unwrap();
        let reader = hybrid_tree(dir.path());
        let proc = dir.path().join("proc");
        write(
            &proc,
            "42/net/dev",
            "Inter-|   Receive                                                |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
             lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0\n  \
             eth0:    1500      12    3    0    0     0          0         0      900       9    4    0    0     0       0          0\n\
             veth12:    10       1    0    0    0     0          0         0       10       1    0    0    0     0       0          0\n",
        );
        write(&proc, "42/cgroup", "2:cpuacct:/a\n1:memory:/b\n0::/c\n");
        write(&proc, "pressure/cpu", PSI);
        write(&proc, "pressure/io", PSI);
        assert_eq!(
            reader.process_interfaces(42).unwrap(),
            vec![InterfaceStats {
                name: "eth0".into(),
                rx_bytes: Some(1500),
                rx_errors: Some(3),
                tx_bytes: Some(900),
                tx_errors: Some(4),
            }]
        );
        let pressure = reader.node_pressure();
        assert_eq!(pressure.cpu, parse_psi(PSI));
        assert_eq!(pressure.memory, None);
        assert_eq!(pressure.io, parse_psi(PSI));
        let paths = reader.process_cgroups(42).unwrap();
        assert_eq!((paths.cpu.as_str(), paths.memory.as_str()), ("/a", "/b"));
        assert_eq!(paths.unified.as_deref(), Some("/c"));
        assert!(reader.process_cgroups(43).is_err());
    }
}

/// One block device's figures of a cgroup's `io.stat` (cgroup v2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IoDevice {
    /// The device's major number.
    pub major: u64,
    /// Its minor number.
    pub minor: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Read operations.
    pub reads: u64,
    /// Write operations.
    pub writes: u64,
}

/// A container cgroup's figures as cAdvisor gathers them for `/metrics/cadvisor` (cgroup v2:
/// runc's `fs2` manager and cAdvisor's process walk).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CadvisorSample {
    /// `cpu.stat` `usage_usec`, `user_usec`, `system_usec`, in microseconds.
    pub cpu_usage_usec: u64,
    /// User time.
    pub cpu_user_usec: u64,
    /// System time.
    pub cpu_system_usec: u64,
    /// `memory.current`.
    pub memory_usage: u64,
    /// Usage minus `inactive_file`.
    pub memory_working_set: u64,
    /// `anon`.
    pub memory_rss: u64,
    /// `file`.
    pub memory_cache: u64,
    /// `file_mapped`.
    pub memory_mapped_file: u64,
    /// `memory.peak` (0 before Linux 5.19).
    pub memory_max_usage: u64,
    /// `memory.swap.current` (0 without swap accounting).
    pub memory_swap: u64,
    /// `pgfault` and `pgmajfault` of `memory.stat`.
    pub pgfault: u64,
    /// Major faults.
    pub pgmajfault: u64,
    /// `memory.events` `high`, `max`, `oom_kill`.
    pub events_high: u64,
    /// `max` events.
    pub events_max: u64,
    /// OOM kills.
    pub oom_kills: u64,
    /// `cpu.max`'s period (100000 when absent).
    pub cpu_period: u64,
    /// `cpu.weight` as CPU shares (cAdvisor's conversion; 1024 when absent).
    pub cpu_shares: u64,
    /// `cpu.max`'s quota (`None`: `max`).
    pub cpu_quota: Option<u64>,
    /// `memory.max` (`None`: `max`).
    pub memory_limit: Option<u64>,
    /// `memory.low` (`None`: `max`).
    pub memory_reservation: Option<u64>,
    /// `memory.swap.max` (`None`: `max` or no swap accounting).
    pub memory_swap_limit: Option<u64>,
    /// `io.stat`, by device.
    pub io: Vec<IoDevice>,
    /// Processes (`cgroup.procs`).
    pub processes: u64,
    /// Threads (`cgroup.threads`).
    pub threads: u64,
    /// `pids.max` (`None`: `max`).
    pub threads_max: Option<u64>,
    /// Open file descriptors of its processes.
    pub file_descriptors: u64,
    /// Of which sockets.
    pub sockets: u64,
    /// The soft `RLIMIT_NOFILE` of its first process.
    pub max_open_files_soft: Option<u64>,
}

/// A number, or `None` for `max`.
fn limit(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// `io.stat` lines: `MAJ:MIN rbytes=.. wbytes=.. rios=.. wios=.. ...`.
pub fn parse_io_stat(text: &str) -> Vec<IoDevice> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some((major, minor)) = fields.next().and_then(|d| d.split_once(':')) else {
            continue;
        };
        let (Ok(major), Ok(minor)) = (major.parse(), minor.parse()) else {
            continue;
        };
        let mut device = IoDevice {
            major,
            minor,
            ..IoDevice::default()
        };
        for field in fields {
            let Some((key, value)) = field.split_once('=') else {
                continue;
            };
            let value = value.parse().unwrap_or(0);
            match key {
                "rbytes" => device.read_bytes = value,
                "wbytes" => device.write_bytes = value,
                "rios" => device.reads = value,
                "wios" => device.writes = value,
                _ => {}
            }
        }
        out.push(device);
    }
    out
}

/// cAdvisor's `convertCPUWeightToCPULimit` inverse for `cpu.weight` (runc's
/// `ConvertCPUSharesToCgroupV2Value` undone): `2 + (weight - 1) * 262142 / 9999`.
pub fn shares_of_weight(weight: u64) -> u64 {
    2 + (weight.max(1) - 1) * 262_142 / 9999
}

impl NodeReader {
    /// The open file descriptors (and of them sockets) of `procs`, and the soft
    /// `RLIMIT_NOFILE` of the first (cAdvisor's `processStatsFromProcs`). Processes that exit
    /// while they are read are skipped.
    fn process_figures(&self, procs: &[u32]) -> (u64, u64, Option<u64>) {
        let (mut fds, mut sockets) = (0, 0);
        for pid in procs {
            let Ok(entries) = std::fs::read_dir(self.roots.proc.join(pid.to_string()).join("fd"))
            else {
                continue;
            };
            for entry in entries.flatten() {
                fds += 1;
                if std::fs::read_link(entry.path())
                    .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
                {
                    sockets += 1;
                }
            }
        }
        let soft = procs.first().and_then(|pid| {
            let limits =
                std::fs::read_to_string(self.roots.proc.join(pid.to_string()).join("limits"))
                    .ok()?;
            let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
            line["Max open files".len()..]
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        });
        (fds, sockets, soft)
    }

    /// A container's cgroup `name` as cAdvisor reads it for `/metrics/cadvisor` (runc's
    /// `fs2` manager on cgroup v2, its `fs` one on v1; v1 has no `memory.events`, read as 0).
    pub fn read_cadvisor(&self, name: &str) -> Result<CadvisorSample, StatsError> {
        if self.version() == CgroupVersion::V1 {
            return self.read_cadvisor_v1(name);
        }
        let dir = Self::under(&self.roots.cgroup, name);
        let optional = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
        let cpu_path = dir.join("cpu.stat");
        let cpu = read(&cpu_path)?;
        let memory_current = read(&dir.join("memory.current"))?;
        let stat_path = dir.join("memory.stat");
        let stat = read(&stat_path)?;
        let events = optional("memory.events").unwrap_or_default();
        let usage = limit(&memory_current).unwrap_or(0);
        let key = |text: &str, k: &str| flat_key(text, k).unwrap_or(0);
        let (quota, period) = optional("cpu.max")
            .map(|t| {
                let mut fields = t.split_whitespace();
                let quota = fields.next().and_then(|q| q.parse().ok());
                let period = fields
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(100_000);
                (quota, period)
            })
            .unwrap_or((None, 100_000));
        let procs: Vec<u32> = optional("cgroup.procs")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        let threads = optional("cgroup.threads").map_or(0, |t| {
            t.lines().filter(|l| !l.trim().is_empty()).count() as u64
        });
        let (fds, sockets, max_open_files_soft) = self.process_figures(&procs);
        Ok(CadvisorSample {
            cpu_usage_usec: need(&cpu_path, &cpu, "usage_usec")?,
            cpu_user_usec: key(&cpu, "user_usec"),
            cpu_system_usec: key(&cpu, "system_usec"),
            memory_usage: usage,
            memory_working_set: usage.saturating_sub(key(&stat, "inactive_file")),
            memory_rss: need(&stat_path, &stat, "anon")?,
            memory_cache: key(&stat, "file"),
            memory_mapped_file: key(&stat, "file_mapped"),
            memory_max_usage: optional("memory.peak").and_then(|t| limit(&t)).unwrap_or(0),
            memory_swap: optional("memory.swap.current")
                .and_then(|t| limit(&t))
                .unwrap_or(0),
            pgfault: key(&stat, "pgfault"),
            pgmajfault: key(&stat, "pgmajfault"),
            events_high: key(&events, "high"),
            events_max: key(&events, "max"),
            oom_kills: key(&events, "oom_kill"),
            cpu_period: period,
            cpu_shares: optional("cpu.weight")
                .and_then(|t| limit(&t))
                .map_or(1024, shares_of_weight),
            cpu_quota: quota,
            memory_limit: optional("memory.max").and_then(|t| limit(&t)),
            memory_reservation: optional("memory.low").and_then(|t| limit(&t)),
            memory_swap_limit: optional("memory.swap.max").and_then(|t| limit(&t)),
            io: parse_io_stat(&optional("io.stat").unwrap_or_default()),
            processes: procs.len() as u64,
            threads,
            threads_max: optional("pids.max").and_then(|t| limit(&t)),
            file_descriptors: fds,
            sockets,
            max_open_files_soft,
        })
    }

    /// [`Self::read_cadvisor`] on cgroup v1: each controller's hierarchy under `name`.
    fn read_cadvisor_v1(&self, name: &str) -> Result<CadvisorSample, StatsError> {
        let dir = |controller: &str| Self::under(&self.v1_dir(controller), name);
        let (cpuacct, cpu, memory, pids, blkio) = (
            dir("cpuacct"),
            dir("cpu"),
            dir("memory"),
            dir("pids"),
            dir("blkio"),
        );
        let optional = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
        let number = |dir: &Path, file: &str| optional(dir, file).and_then(|t| limit(&t));
        let usage_path = cpuacct.join("cpuacct.usage");
        let usage_ns: u64 = read(&usage_path)?
            .trim()
            .parse()
            .map_err(|_| StatsError::Missing {
                path: usage_path,
                field: "usage",
            })?;
        // `cpuacct.stat` is in USER_HZ ticks (100 a second on Linux).
        let ticks = optional(&cpuacct, "cpuacct.stat").unwrap_or_default();
        let tick_usec = |k: &str| flat_key(&ticks, k).unwrap_or(0) * 10_000;
        let usage = number(&memory, "memory.usage_in_bytes").ok_or(StatsError::Missing {
            path: memory.join("memory.usage_in_bytes"),
            field: "usage_in_bytes",
        })?;
        let stat_path = memory.join("memory.stat");
        let stat = read(&stat_path)?;
        let key = |text: &str, k: &str| flat_key(text, k).unwrap_or(0);
        let memsw = number(&memory, "memory.memsw.usage_in_bytes");
        let oom = optional(&memory, "memory.oom_control").unwrap_or_default();
        let quota = optional(&cpu, "cpu.cfs_quota_us")
            .and_then(|q| q.trim().parse::<i64>().ok())
            .and_then(|q| u64::try_from(q).ok());
        let procs: Vec<u32> = optional(&pids, "cgroup.procs")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        let threads = optional(&pids, "tasks").map_or(0, |t| {
            t.lines().filter(|l| !l.trim().is_empty()).count() as u64
        });
        let (fds, sockets, max_open_files_soft) = self.process_figures(&procs);
        let bytes = optional(&blkio, "blkio.throttle.io_service_bytes_recursive")
            .or_else(|| optional(&blkio, "blkio.throttle.io_service_bytes"))
            .unwrap_or_default();
        let ops = optional(&blkio, "blkio.throttle.io_serviced_recursive")
            .or_else(|| optional(&blkio, "blkio.throttle.io_serviced"))
            .unwrap_or_default();
        Ok(CadvisorSample {
            cpu_usage_usec: usage_ns / 1_000,
            cpu_user_usec: tick_usec("user"),
            cpu_system_usec: tick_usec("system"),
            memory_usage: usage,
            memory_working_set: usage.saturating_sub(key(&stat, "total_inactive_file")),
            memory_rss: need(&stat_path, &stat, "total_rss")?,
            memory_cache: key(&stat, "total_cache"),
            memory_mapped_file: key(&stat, "total_mapped_file"),
            memory_max_usage: number(&memory, "memory.max_usage_in_bytes").unwrap_or(0),
            memory_swap: memsw.map_or(0, |sw| sw.saturating_sub(usage)),
            pgfault: key(&stat, "total_pgfault"),
            pgmajfault: key(&stat, "total_pgmajfault"),
            events_high: 0,
            events_max: 0,
            oom_kills: key(&oom, "oom_kill"),
            cpu_period: number(&cpu, "cpu.cfs_period_us").unwrap_or(100_000),
            cpu_shares: number(&cpu, "cpu.shares").unwrap_or(1024),
            cpu_quota: quota,
            memory_limit: number(&memory, "memory.limit_in_bytes"),
            memory_reservation: number(&memory, "memory.soft_limit_in_bytes"),
            memory_swap_limit: number(&memory, "memory.memsw.limit_in_bytes"),
            io: parse_blkio_v1(&bytes, &ops),
            processes: procs.len() as u64,
            threads,
            threads_max: number(&pids, "pids.max"),
            file_descriptors: fds,
            sockets,
            max_open_files_soft,
        })
    }
}

/// cgroup v1's `blkio.throttle.io_service_bytes` and `io_serviced` (`MAJ:MIN Read|Write|...
/// N` lines, a `Total` line last) as one [`IoDevice`] per device.
pub fn parse_blkio_v1(bytes: &str, ops: &str) -> Vec<IoDevice> {
    let mut devices: Vec<IoDevice> = Vec::new();
    for (text, is_bytes) in [(bytes, true), (ops, false)] {
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            let (Some(dev), Some(op), Some(value)) = (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Some((Ok(major), Ok(minor))) = dev
                .split_once(':')
                .map(|(a, b)| (a.parse::<u64>(), b.parse::<u64>()))
            else {
                continue;
            };
            let value: u64 = value.parse().unwrap_or(0);
            let at = match devices
                .iter()
                .position(|d| d.major == major && d.minor == minor)
            {
                Some(at) => at,
                None => {
                    devices.push(IoDevice {
                        major,
                        minor,
                        ..IoDevice::default()
                    });
                    devices.len() - 1
                }
            };
            let device = &mut devices[at];
            match (op, is_bytes) {
                ("Read", true) => device.read_bytes = value,
                ("Write", true) => device.write_bytes = value,
                ("Read", false) => device.reads = value,
                ("Write", false) => device.writes = value,
                _ => {}
            }
        }
    }
    devices
}

/// One interface's counters of `/proc/net/dev`, as cAdvisor's network series need them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetDevice {
    /// The interface.
    pub name: String,
    /// Received: bytes, packets, errors, drops.
    pub rx: [u64; 4],
    /// Transmitted: bytes, packets, errors, drops.
    pub tx: [u64; 4],
}

/// `/proc/net/dev` (every interface but `lo`, as cAdvisor).
pub fn parse_net_devices(text: &str) -> Vec<NetDevice> {
    text.lines()
        .skip(2)
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let name = name.trim();
            if name == "lo" {
                return None;
            }
            let v: Vec<u64> = rest
                .split_whitespace()
                .map(|f| f.parse().unwrap_or(0))
                .collect();
            (v.len() >= 12).then(|| NetDevice {
                name: name.to_owned(),
                rx: [v[0], v[1], v[2], v[3]],
                tx: [v[8], v[9], v[10], v[11]],
            })
        })
        .collect()
}

/// One block device's line of `/proc/diskstats` (cAdvisor's `DiskStats` of the root container).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskStat {
    /// `/dev/<name>`.
    pub device: String,
    /// Reads completed, reads merged, sectors read, milliseconds reading.
    pub reads: [u64; 4],
    /// Writes completed, writes merged, sectors written, milliseconds writing.
    pub writes: [u64; 4],
    /// I/Os in progress, milliseconds doing I/O, weighted milliseconds.
    pub io: [u64; 3],
}

/// `/proc/diskstats`, without loop and RAM devices.
pub fn parse_diskstats(text: &str) -> Vec<DiskStat> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 14 || f[2].starts_with("loop") || f[2].starts_with("ram") {
                return None;
            }
            let n = |i: usize| f[i].parse().unwrap_or(0);
            Some(DiskStat {
                device: format!("/dev/{}", f[2]),
                reads: [n(3), n(4), n(5), n(6)],
                writes: [n(7), n(8), n(9), n(10)],
                io: [n(11), n(12), n(13)],
            })
        })
        .collect()
}

impl NodeReader {
    /// The node's block devices (`/proc/diskstats`).
    pub fn disk_stats(&self) -> Vec<DiskStat> {
        std::fs::read_to_string(self.roots.proc.join("diskstats"))
            .map(|t| parse_diskstats(&t))
            .unwrap_or_default()
    }

    /// The interfaces of process `pid`'s network namespace, with packets and drops.
    pub fn net_devices(&self, pid: u32) -> Vec<NetDevice> {
        std::fs::read_to_string(self.roots.proc.join(pid.to_string()).join("net/dev"))
            .map(|t| parse_net_devices(&t))
            .unwrap_or_default()
    }
}
