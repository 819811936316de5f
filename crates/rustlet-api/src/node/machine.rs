//! The machine's figures the node status is made of (upstream: cAdvisor's `MachineInfo` and
//! `VersionInfo`, the eviction manager's signals), read from `/proc`, `/sys`, `/etc` and a
//! statfs of the agent's root directory, behind the [`Machine`] seam so the node status can be
//! tested with fixed figures ([`FakeMachine`], feature `test-util`).

use std::path::{Path, PathBuf};

use rustlet_core::node_status::{FsFigures, HugePages, MachineFigures, PidFigures};

/// Where the node status reads the machine's figures.
pub trait Machine: Send + Sync {
    /// The figures now (each read best-effort: what cannot be read is `None` or empty).
    fn figures(&self) -> MachineFigures;
}

/// This host, with `nodefs` the filesystem of the agent's root directory.
#[derive(Clone, Debug)]
pub struct HostMachine {
    root_dir: PathBuf,
}

impl HostMachine {
    /// The host, its `nodefs` the filesystem holding `root_dir`.
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        Self {
            root_dir: root_dir.into(),
        }
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn trimmed(path: &str) -> String {
    read(path).map(|s| s.trim().to_owned()).unwrap_or_default()
}

/// `/proc/meminfo`'s fields in bytes.
fn meminfo(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(':').next() == Some(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The CPUs of a kernel list (`0-3,8`).
fn cpu_count(list: &str) -> Option<u32> {
    let mut count = 0;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        count += match part.split_once('-') {
            Some((a, b)) => b.parse::<u32>().ok()? - a.parse::<u32>().ok()? + 1,
            None => {
                part.parse::<u32>().ok()?;
                1
            }
        };
    }
    (count > 0).then_some(count)
}

/// `PRETTY_NAME` of an os-release file (unquoted).
fn pretty_name(text: &str) -> Option<String> {
    let value = text.lines().find_map(|l| l.strip_prefix("PRETTY_NAME="))?;
    Some(value.trim().trim_matches('"').trim_matches('\'').to_owned())
}

fn hugepages(dir: &Path) -> Vec<HugePages> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut pools: Vec<HugePages> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let kib: u64 = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            let pages = std::fs::read_to_string(e.path().join("nr_hugepages"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some(HugePages {
                page_size_bytes: kib * 1024,
                pages,
            })
        })
        .collect();
    pools.sort_by_key(|p| p.page_size_bytes);
    pools
}

fn statfs(path: &Path) -> Option<FsFigures> {
    let stat = nix::sys::statvfs::statvfs(path).ok()?;
    let block = stat.fragment_size();
    Some(FsFigures {
        capacity_bytes: stat.blocks().saturating_mul(block),
        available_bytes: stat.blocks_available().saturating_mul(block),
        inodes: stat.files(),
        inodes_free: stat.files_free(),
    })
}

impl Machine for HostMachine {
    /// Deviations from cAdvisor: `memory.available` is `MemFree + Inactive(file)` of
    /// `/proc/meminfo` (upstream: capacity minus the root cgroup's working set, usage minus
    /// inactive file pages: the same figure where usage is `MemTotal − MemFree`); the processes
    /// in use are the total of `/proc/loadavg` (upstream: `sysinfo`'s `procs`, the same count).
    fn figures(&self) -> MachineFigures {
        let mem = read("/proc/meminfo").unwrap_or_default();
        let pids = (|| {
            let loadavg = read("/proc/loadavg")?;
            let running = loadavg
                .split_whitespace()
                .nth(3)?
                .split_once('/')?
                .1
                .parse()
                .ok()?;
            let max = trimmed("/proc/sys/kernel/pid_max").parse().ok()?;
            Some(PidFigures { running, max })
        })();
        MachineFigures {
            cpus: read("/sys/devices/system/cpu/online")
                .and_then(|l| cpu_count(&l))
                .unwrap_or_else(|| {
                    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
                }),
            memory_bytes: meminfo(&mem, "MemTotal").unwrap_or(0),
            hugepages: hugepages(Path::new("/sys/kernel/mm/hugepages")),
            memory_available_bytes: meminfo(&mem, "MemFree")
                .zip(meminfo(&mem, "Inactive(file)"))
                .map(|(free, inactive)| free + inactive),
            root_fs: statfs(&self.root_dir),
            pids,
            machine_id: trimmed("/etc/machine-id"),
            system_uuid: trimmed("/sys/class/dmi/id/product_uuid"),
            boot_id: trimmed("/proc/sys/kernel/random/boot_id"),
            kernel_version: trimmed("/proc/sys/kernel/osrelease"),
            os_image: read("/etc/os-release")
                .and_then(|t| pretty_name(&t))
                .unwrap_or_else(|| "Linux".into()),
        }
    }
}

/// Fixed figures, changed by the test (feature `test-util`).
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Default)]
pub struct FakeMachine {
    figures: std::sync::Mutex<MachineFigures>,
}

#[cfg(any(test, feature = "test-util"))]
impl FakeMachine {
    /// A machine with these figures.
    pub fn new(figures: MachineFigures) -> Self {
        Self {
            figures: std::sync::Mutex::new(figures),
        }
    }

    /// A plausible machine: 2 CPUs, 4 GiB with 3 GiB available, a 10 GiB root filesystem
    /// half free.
    pub fn plausible() -> Self {
        Self::new(MachineFigures {
            cpus: 2,
            memory_bytes: 4 << 30,
            hugepages: Vec::new(),
            memory_available_bytes: Some(3 << 30),
            root_fs: Some(FsFigures {
                capacity_bytes: 10 << 30,
                available_bytes: 5 << 30,
                inodes: 1 << 20,
                inodes_free: 1 << 19,
            }),
            pids: Some(PidFigures {
                running: 200,
                max: 4_194_304,
            }),
            machine_id: "fake-machine-id".into(),
            system_uuid: "fake-system-uuid".into(),
            boot_id: "fake-boot-id".into(),
            kernel_version: "6.1.0-fake".into(),
            os_image: "Fake Linux 1".into(),
        })
    }

    /// Changes the figures.
    pub fn update(&self, change: impl FnOnce(&mut MachineFigures)) {
        change(&mut self.figures.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

#[cfg(any(test, feature = "test-util"))]
impl Machine for FakeMachine {
    fn figures(&self) -> MachineFigures {
        self.figures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_parsers_read_the_kernels_formats() {
        assert_eq!(cpu_count("0-3\n"), Some(4));
        assert_eq!(cpu_count("0,2-3,8"), Some(4));
        assert_eq!(cpu_count("x"), None);
        let mem = "MemTotal:        4039636 kB\nMemFree:  100 kB\nInactive(file):   20 kB\n";
        assert_eq!(meminfo(mem, "MemTotal"), Some(4_039_636 * 1024));
        assert_eq!(meminfo(mem, "Inactive(file)"), Some(20 * 1024));
        assert_eq!(meminfo(mem, "Inactive"), None);
        assert_eq!(
            pretty_name("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n")
                .as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
    }

    /// This host's figures are read: memory, CPUs, the root filesystem, the boot ID.
    #[test]
    fn this_host_has_figures() {
        let dir = tempfile::tempdir().unwrap();
        let figures = HostMachine::new(dir.path()).figures();
        assert!(figures.cpus >= 1);
        assert!(figures.memory_bytes > 0);
        assert!(figures.memory_available_bytes.is_some());
        let fs = figures.root_fs.unwrap();
        assert!(fs.capacity_bytes >= fs.available_bytes && fs.capacity_bytes > 0);
        assert!(figures.pids.is_some_and(|p| p.max > p.running));
        assert_eq!(figures.boot_id.len(), 36, "{figures:?}");
        assert!(!figures.kernel_version.is_empty());
    }
}
