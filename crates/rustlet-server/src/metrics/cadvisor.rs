//! `/metrics/cadvisor` (upstream: the kubelet's cAdvisor registry, cAdvisor's
//! `metrics/prometheus.go` with the kubelet's label function): per running container, its
//! cgroup's CPU, memory, block I/O, processes and limits as cAdvisor names them
//! (`container_*`, labels `container`, `id`, `image`, `name`, `namespace`, `pod`), and the
//! machine's (`machine_cpu_cores`, `machine_memory_bytes`).
//!
//! The root container (`id="/"`) has the node's network (`/proc/net/dev` of the agent's
//! namespace), disks (`/proc/diskstats`) and root filesystem series.
//!
//! Deviations: a container whose cgroup cannot be read is left out; no sample timestamps; no
//! pod-level (`POD`) network series; a container's `device` is `MAJ:MIN` for block devices
//! (cAdvisor writes the device's name) and empty for its writable layer; cgroup v1 has no
//! `memory.events` (its `container_memory_events_*` are 0); the root container has no cgroup
//! series.

use k8s_openapi::jiff::Timestamp;

use super::{Desc, Kind, Sample, Stability, encode};
use crate::stats::cgroup::{CadvisorSample, DiskStat, NetDevice};

/// One running container and its figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CadvisorContainer {
    /// Its pod's namespace.
    pub namespace: String,
    /// Its pod's name.
    pub pod: String,
    /// The spec container's name.
    pub container: String,
    /// Its cgroup (cAdvisor's container name, the `id` label).
    pub cgroup: String,
    /// The runtime's ID of the instance (the `name` label).
    pub name: String,
    /// Its image.
    pub image: String,
    /// When it was created.
    pub created: Option<Timestamp>,
    /// Its cgroup's figures.
    pub sample: CadvisorSample,
    /// Bytes its writable layer uses.
    pub fs_usage_bytes: Option<u64>,
}

/// The root container's (`/`, the whole machine) figures cAdvisor reports beside the
/// containers': its network, its disks and its root filesystem.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RootFigures {
    /// The node's interfaces.
    pub network: Vec<NetDevice>,
    /// The node's block devices.
    pub disks: Vec<DiskStat>,
    /// The root filesystem: its device, capacity, available bytes, inodes, free inodes.
    pub fs: Option<RootFs>,
}

/// The filesystem the root container's `container_fs_*` series describe.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RootFs {
    /// Its device.
    pub device: String,
    /// Size in bytes.
    pub capacity_bytes: u64,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Inodes in all.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
}

/// The machine's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Machine {
    /// Logical CPUs.
    pub cpu_cores: u64,
    /// Memory, in bytes.
    pub memory_bytes: u64,
}

const fn desc(name: &'static str, help: &'static str, kind: Kind) -> Desc {
    Desc {
        name,
        help,
        stability: Stability::Unlabelled,
        kind,
    }
}

/// cAdvisor's `specMemoryValue`: an unlimited value (above 2^62) is 0.
fn spec_memory(v: Option<u64>) -> f64 {
    v.filter(|v| *v <= 1 << 62).unwrap_or(0) as f64
}

/// The families of `containers`, the root container and `machine`, `now` the scrape's time.
pub fn cadvisor_metrics(
    containers: &[CadvisorContainer],
    root: &RootFigures,
    machine: Option<Machine>,
    now: Timestamp,
) -> String {
    use Kind::{Counter, Gauge};
    type Values = Vec<(Vec<(&'static str, String)>, f64)>;
    type Family = (Desc, fn(&CadvisorContainer, Timestamp) -> Values);
    let families: Vec<Family> = vec![
        (
            desc(
                "container_blkio_device_usage_total",
                "Blkio Device bytes usage",
                Counter,
            ),
            |c, _| {
                c.sample
                    .io
                    .iter()
                    .flat_map(|d| {
                        let labels = |op: &str| {
                            vec![
                                ("device", format!("{}:{}", d.major, d.minor)),
                                ("major", d.major.to_string()),
                                ("minor", d.minor.to_string()),
                                ("operation", op.to_owned()),
                            ]
                        };
                        [
                            (labels("Read"), d.read_bytes as f64),
                            (labels("Write"), d.write_bytes as f64),
                        ]
                    })
                    .collect()
            },
        ),
        (
            desc(
                "container_cpu_system_seconds_total",
                "Cumulative system cpu time consumed in seconds.",
                Counter,
            ),
            |c, _| vec![(Vec::new(), c.sample.cpu_system_usec as f64 / 1e6)],
        ),
        (
            desc(
                "container_cpu_usage_seconds_total",
                "Cumulative cpu time consumed in seconds.",
                Counter,
            ),
            |c, _| {
                vec![(
                    vec![("cpu", "total".to_owned())],
                    c.sample.cpu_usage_usec as f64 / 1e6,
                )]
            },
        ),
        (
            desc(
                "container_cpu_user_seconds_total",
                "Cumulative user cpu time consumed in seconds.",
                Counter,
            ),
            |c, _| vec![(Vec::new(), c.sample.cpu_user_usec as f64 / 1e6)],
        ),
        (
            desc(
                "container_file_descriptors",
                "Number of open file descriptors for the container.",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.file_descriptors as f64)],
        ),
        (
            desc(
                "container_fs_reads_bytes_total",
                "Cumulative count of bytes read",
                Counter,
            ),
            |c, _| per_device(c, |d| d.read_bytes),
        ),
        (
            desc(
                "container_fs_reads_total",
                "Cumulative count of reads completed",
                Counter,
            ),
            |c, _| per_device(c, |d| d.reads),
        ),
        (
            desc(
                "container_fs_usage_bytes",
                "Number of bytes that are consumed by the container on this filesystem.",
                Gauge,
            ),
            |c, _| {
                c.fs_usage_bytes
                    .map(|b| (vec![("device", String::new())], b as f64))
                    .into_iter()
                    .collect()
            },
        ),
        (
            desc(
                "container_fs_writes_bytes_total",
                "Cumulative count of bytes written",
                Counter,
            ),
            |c, _| per_device(c, |d| d.write_bytes),
        ),
        (
            desc(
                "container_fs_writes_total",
                "Cumulative count of writes completed",
                Counter,
            ),
            |c, _| per_device(c, |d| d.writes),
        ),
        (
            desc(
                "container_last_seen",
                "Last time a container was seen by the exporter",
                Gauge,
            ),
            |_, now| vec![(Vec::new(), now.as_second() as f64)],
        ),
        (
            desc(
                "container_memory_cache",
                "Number of bytes of page cache memory.",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.memory_cache as f64)],
        ),
        (
            desc(
                "container_memory_events_high_total",
                "Cumulative count of memory high events (memory.events high).",
                Counter,
            ),
            |c, _| vec![(Vec::new(), c.sample.events_high as f64)],
        ),
        (
            desc(
                "container_memory_events_max_total",
                "Cumulative count of memory max events (memory.events max).",
                Counter,
            ),
            |c, _| vec![(Vec::new(), c.sample.events_max as f64)],
        ),
        (
            desc(
                "container_memory_failcnt",
                "Number of memory usage hits limits",
                Counter,
            ),
            // cgroup v2 has no failcnt: cAdvisor writes 0.
            |_, _| vec![(Vec::new(), 0.0)],
        ),
        (
            desc(
                "container_memory_failures_total",
                "Cumulative count of memory allocation failures.",
                Counter,
            ),
            |c, _| {
                let mut out = Vec::new();
                for scope in ["container", "hierarchy"] {
                    for (kind, value) in [
                        ("pgfault", c.sample.pgfault),
                        ("pgmajfault", c.sample.pgmajfault),
                    ] {
                        out.push((
                            vec![
                                ("failure_type", kind.to_owned()),
                                ("scope", scope.to_owned()),
                            ],
                            value as f64,
                        ));
                    }
                }
                out
            },
        ),
        (
            desc(
                "container_memory_mapped_file",
                "Size of memory mapped files in bytes.",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.memory_mapped_file as f64)],
        ),
        (
            desc(
                "container_memory_max_usage_bytes",
                "Maximum memory usage recorded in bytes",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.memory_max_usage as f64)],
        ),
        (
            desc("container_memory_rss", "Size of RSS in bytes.", Gauge),
            |c, _| vec![(Vec::new(), c.sample.memory_rss as f64)],
        ),
        (
            desc(
                "container_memory_swap",
                "Container swap usage in bytes.",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.memory_swap as f64)],
        ),
        (
            desc(
                "container_memory_usage_bytes",
                "Current memory usage in bytes, including all memory regardless of when it was accessed",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.memory_usage as f64)],
        ),
        (
            desc(
                "container_memory_working_set_bytes",
                "Current working set in bytes.",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.memory_working_set as f64)],
        ),
        (
            desc(
                "container_oom_events_total",
                "Count of out of memory events observed for the container",
                Counter,
            ),
            |c, _| vec![(Vec::new(), c.sample.oom_kills as f64)],
        ),
        (
            desc(
                "container_processes",
                "Number of processes running inside the container.",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.processes as f64)],
        ),
        (
            desc(
                "container_sockets",
                "Number of open sockets for the container.",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.sockets as f64)],
        ),
        (
            desc(
                "container_spec_cpu_period",
                "CPU period of the container.",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.cpu_period as f64)],
        ),
        (
            desc(
                "container_spec_cpu_quota",
                "CPU quota of the container.",
                Gauge,
            ),
            |c, _| {
                c.sample
                    .cpu_quota
                    .map(|q| (Vec::new(), q as f64))
                    .into_iter()
                    .collect()
            },
        ),
        (
            desc(
                "container_spec_cpu_shares",
                "CPU share of the container.",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.cpu_shares as f64)],
        ),
        (
            desc(
                "container_spec_memory_limit_bytes",
                "Memory limit for the container.",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), spec_memory(c.sample.memory_limit))],
        ),
        (
            desc(
                "container_spec_memory_reservation_limit_bytes",
                "Memory reservation limit for the container.",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), spec_memory(c.sample.memory_reservation))],
        ),
        (
            desc(
                "container_spec_memory_swap_limit_bytes",
                "Memory swap limit for the container.",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), spec_memory(c.sample.memory_swap_limit))],
        ),
        (
            desc(
                "container_start_time_seconds",
                "Start time of the container since unix epoch in seconds.",
                Gauge,
            ),
            |c, _| {
                c.created
                    .map(|t| (Vec::new(), t.as_second() as f64))
                    .into_iter()
                    .collect()
            },
        ),
        (
            desc(
                "container_threads",
                "Number of threads running inside the container",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.threads as f64)],
        ),
        (
            desc(
                "container_threads_max",
                "Maximum number of threads allowed inside the container, infinity if value is zero",
                Gauge,
            ),
            |c, _| vec![(Vec::new(), c.sample.threads_max.unwrap_or(0) as f64)],
        ),
        (
            desc(
                "container_ulimits_soft",
                "Soft ulimit values for the container root process. Unlimited if -1, except priority and nice",
                Gauge,
            ),
            |c, _| {
                c.sample
                    .max_open_files_soft
                    .map(|v| (vec![("ulimit", "max_open_files".to_owned())], v as f64))
                    .into_iter()
                    .collect()
            },
        ),
    ];
    let mut out: Vec<(Desc, Vec<Sample>)> = families
        .into_iter()
        .map(|(desc, values)| {
            let samples = containers
                .iter()
                .flat_map(|c| {
                    values(c, now).into_iter().map(|(extra, value)| {
                        let mut labels = vec![
                            ("container", c.container.clone()),
                            ("id", c.cgroup.clone()),
                            ("image", c.image.clone()),
                            ("name", c.name.clone()),
                            ("namespace", c.namespace.clone()),
                            ("pod", c.pod.clone()),
                        ];
                        labels.extend(extra);
                        Sample {
                            labels,
                            value,
                            timestamp_ms: None,
                        }
                    })
                })
                .collect();
            (desc, samples)
        })
        .collect();
    // One family per name: the root's samples join the containers' of the same name.
    for (desc, samples) in root_families(root) {
        match out.iter_mut().find(|(d, _)| d.name == desc.name) {
            Some((_, existing)) => existing.extend(samples),
            None => out.push((desc, samples)),
        }
    }
    if let Some(machine) = machine {
        let plain = |value: u64| {
            vec![Sample {
                labels: Vec::new(),
                value: value as f64,
                timestamp_ms: None,
            }]
        };
        out.push((
            desc("machine_cpu_cores", "Number of logical CPU cores.", Gauge),
            plain(machine.cpu_cores),
        ));
        out.push((
            desc(
                "machine_memory_bytes",
                "Amount of memory installed on the machine.",
                Gauge,
            ),
            plain(machine.memory_bytes),
        ));
    }
    encode(out)
}

/// The root container's labels (cAdvisor's `/`: no pod, no container) and `extra`.
fn root_sample(extra: Vec<(&'static str, String)>, value: u64) -> Sample {
    let mut labels = vec![
        ("container", String::new()),
        ("id", "/".to_owned()),
        ("image", String::new()),
        ("name", String::new()),
        ("namespace", String::new()),
        ("pod", String::new()),
    ];
    labels.extend(extra);
    Sample {
        labels,
        value: value as f64,
        timestamp_ms: None,
    }
}

/// A disk family: name, help, type, and the figure of a `/proc/diskstats` line.
type DiskFamily = (&'static str, &'static str, Kind, fn(&DiskStat) -> u64);

/// The root container's network, disk and filesystem families.
fn root_families(root: &RootFigures) -> Vec<(Desc, Vec<Sample>)> {
    use Kind::{Counter, Gauge};
    let mut out = Vec::new();
    let network: [(&'static str, &'static str, bool, usize); 8] = [
        (
            "container_network_receive_bytes_total",
            "Cumulative count of bytes received",
            true,
            0,
        ),
        (
            "container_network_receive_packets_total",
            "Cumulative count of packets received",
            true,
            1,
        ),
        (
            "container_network_receive_errors_total",
            "Cumulative count of errors encountered while receiving",
            true,
            2,
        ),
        (
            "container_network_receive_packets_dropped_total",
            "Cumulative count of packets dropped while receiving",
            true,
            3,
        ),
        (
            "container_network_transmit_bytes_total",
            "Cumulative count of bytes transmitted",
            false,
            0,
        ),
        (
            "container_network_transmit_packets_total",
            "Cumulative count of packets transmitted",
            false,
            1,
        ),
        (
            "container_network_transmit_errors_total",
            "Cumulative count of errors encountered while transmitting",
            false,
            2,
        ),
        (
            "container_network_transmit_packets_dropped_total",
            "Cumulative count of packets dropped while transmitting",
            false,
            3,
        ),
    ];
    for (name, help, rx, at) in network {
        let samples = root
            .network
            .iter()
            .map(|n| {
                let value = if rx { n.rx[at] } else { n.tx[at] };
                root_sample(vec![("interface", n.name.clone())], value)
            })
            .collect();
        out.push((desc(name, help, Counter), samples));
    }
    let disk: [DiskFamily; 11] = [
        (
            "container_fs_reads_total",
            "Cumulative count of reads completed",
            Counter,
            |d| d.reads[0],
        ),
        (
            "container_fs_reads_merged_total",
            "Cumulative count of reads merged",
            Counter,
            |d| d.reads[1],
        ),
        (
            "container_fs_sector_reads_total",
            "Cumulative count of sector reads completed",
            Counter,
            |d| d.reads[2],
        ),
        (
            "container_fs_read_seconds_total",
            "Cumulative count of seconds spent reading",
            Counter,
            |d| d.reads[3] / 1000,
        ),
        (
            "container_fs_writes_total",
            "Cumulative count of writes completed",
            Counter,
            |d| d.writes[0],
        ),
        (
            "container_fs_writes_merged_total",
            "Cumulative count of writes merged",
            Counter,
            |d| d.writes[1],
        ),
        (
            "container_fs_sector_writes_total",
            "Cumulative count of sector writes completed",
            Counter,
            |d| d.writes[2],
        ),
        (
            "container_fs_write_seconds_total",
            "Cumulative count of seconds spent writing",
            Counter,
            |d| d.writes[3] / 1000,
        ),
        (
            "container_fs_io_current",
            "Number of I/Os currently in progress",
            Gauge,
            |d| d.io[0],
        ),
        (
            "container_fs_io_time_seconds_total",
            "Cumulative count of seconds spent doing I/Os",
            Counter,
            |d| d.io[1] / 1000,
        ),
        (
            "container_fs_io_time_weighted_seconds_total",
            "Cumulative weighted I/O time in seconds",
            Counter,
            |d| d.io[2] / 1000,
        ),
    ];
    for (name, help, kind, value) in disk {
        let samples = root
            .disks
            .iter()
            .map(|d| root_sample(vec![("device", d.device.clone())], value(d)))
            .collect();
        out.push((desc(name, help, kind), samples));
    }
    if let Some(fs) = &root.fs {
        let fs_families: [(&'static str, &'static str, u64); 4] = [
            (
                "container_fs_limit_bytes",
                "Number of bytes that can be consumed by the container on this filesystem.",
                fs.capacity_bytes,
            ),
            (
                "container_fs_usage_bytes",
                "Number of bytes that are consumed by the container on this filesystem.",
                fs.used_bytes,
            ),
            ("container_fs_inodes_total", "Number of Inodes", fs.inodes),
            (
                "container_fs_inodes_free",
                "Number of available Inodes",
                fs.inodes_free,
            ),
        ];
        for (name, help, value) in fs_families {
            out.push((
                desc(name, help, Gauge),
                vec![root_sample(vec![("device", fs.device.clone())], value)],
            ));
        }
    }
    out
}

/// One sample per block device of the container's `io.stat`.
fn per_device(
    c: &CadvisorContainer,
    value: fn(&crate::stats::cgroup::IoDevice) -> u64,
) -> Vec<(Vec<(&'static str, String)>, f64)> {
    c.sample
        .io
        .iter()
        .map(|d| {
            (
                vec![("device", format!("{}:{}", d.major, d.minor))],
                value(d) as f64,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests;
