//! Process metrics (`process_*`, as the Prometheus client libraries export them), read from
//! `/proc/self` at each scrape.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The process gauges.
#[derive(Clone, Debug, Default)]
pub struct ProcessMetrics {
    cpu_seconds: Gauge<f64, AtomicU64>,
    resident_memory_bytes: Gauge,
    open_fds: Gauge,
    threads: Gauge,
}

impl ProcessMetrics {
    /// Registers the gauges.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "process_cpu_seconds",
            "User and system CPU time spent in seconds",
            self.cpu_seconds.clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            self.resident_memory_bytes.clone(),
        );
        registry.register(
            "process_open_fds",
            "Number of open file descriptors",
            self.open_fds.clone(),
        );
        registry.register(
            "process_threads",
            "Number of OS threads",
            self.threads.clone(),
        );
    }

    /// Reads `/proc/self` into the gauges (a value that cannot be read is left as it was).
    pub fn update(&self) {
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
            && let Some(after) = stat.rsplit_once(')').map(|(_, rest)| rest)
        {
            // Fields after the command: state is field 3; utime 14, stime 15, threads 20,
            // rss 24 (1-based over the whole line).
            let fields: Vec<&str> = after.split_whitespace().collect();
            let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<i64>().ok());
            let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
                .ok()
                .flatten()
                .unwrap_or(100) as f64;
            let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
                .ok()
                .flatten()
                .unwrap_or(4096);
            if let (Some(u), Some(s)) = (field(14), field(15)) {
                self.cpu_seconds.set((u + s) as f64 / ticks);
            }
            if let Some(threads) = field(20) {
                self.threads.set(threads);
            }
            if let Some(rss) = field(24) {
                self.resident_memory_bytes.set(rss * page);
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(dir.count() as i64);
        }
    }
}
