//! Upstream "ContainerMetrics when querying /metrics/cadvisor should report container
//! metrics": the families it requires, by the labels it matches (`namespace`, `pod`,
//! `container`), read from a container's cgroup v2 directory and procfs as cAdvisor does.

use std::path::Path;

use super::*;
use crate::stats::cgroup::{
    NodeReader, StatsRoots, parse_blkio_v1, parse_diskstats, parse_io_stat, parse_net_devices,
    shares_of_weight,
};

/// The container-level families the upstream spec requires of each test container.
const REQUIRED: &[&str] = &[
    "container_blkio_device_usage_total",
    "container_cpu_system_seconds_total",
    "container_cpu_usage_seconds_total",
    "container_cpu_user_seconds_total",
    "container_file_descriptors",
    "container_fs_reads_bytes_total",
    "container_fs_reads_total",
    "container_fs_usage_bytes",
    "container_fs_writes_bytes_total",
    "container_fs_writes_total",
    "container_last_seen",
    "container_memory_cache",
    "container_memory_events_high_total",
    "container_memory_events_max_total",
    "container_memory_failcnt",
    "container_memory_failures_total",
    "container_memory_mapped_file",
    "container_memory_max_usage_bytes",
    "container_memory_rss",
    "container_memory_swap",
    "container_memory_usage_bytes",
    "container_memory_working_set_bytes",
    "container_oom_events_total",
    "container_processes",
    "container_sockets",
    "container_spec_cpu_period",
    "container_spec_cpu_shares",
    "container_spec_memory_limit_bytes",
    "container_spec_memory_reservation_limit_bytes",
    "container_spec_memory_swap_limit_bytes",
    "container_start_time_seconds",
    "container_threads",
    "container_threads_max",
    "container_ulimits_soft",
];

fn write(dir: &Path, file: &str, content: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(file), content).unwrap();
}

/// A cgroup v2 tree with one container cgroup (`/kubepods/pod1/abc`) running this test's own
/// process, as runc leaves it for a container limited to 80M without a CPU request.
fn tree() -> (tempfile::TempDir, NodeReader) {
    let root = tempfile::tempdir().unwrap();
    let cgroup = root.path().join("cgroup");
    write(&cgroup, "cgroup.controllers", "cpu io memory pids\n");
    let dir = cgroup.join("kubepods/pod1/abc");
    write(
        &dir,
        "cpu.stat",
        "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
    );
    write(&dir, "memory.current", "4194304\n");
    write(
        &dir,
        "memory.stat",
        "anon 1048576\nfile 2097152\nfile_mapped 65536\ninactive_file 1048576\npgfault 1200\npgmajfault 3\n",
    );
    write(
        &dir,
        "memory.events",
        "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
    );
    write(&dir, "memory.peak", "5242880\n");
    write(&dir, "memory.swap.current", "0\n");
    write(&dir, "memory.max", "79998976\n");
    write(&dir, "memory.low", "0\n");
    write(&dir, "memory.swap.max", "0\n");
    write(&dir, "cpu.max", "max 100000\n");
    write(&dir, "cpu.weight", "1\n");
    write(&dir, "pids.max", "max\n");
    write(
        &dir,
        "io.stat",
        "253:0 rbytes=8192 wbytes=8192 rios=2 wios=2 dbytes=0 dios=0\n",
    );
    let pid = std::process::id();
    write(&dir, "cgroup.procs", &format!("{pid}\n"));
    write(&dir, "cgroup.threads", &format!("{pid}\n"));
    let reader = NodeReader::new(StatsRoots {
        cgroup,
        proc: "/proc".into(),
    });
    (root, reader)
}

fn container(reader: &NodeReader, pod: &str) -> CadvisorContainer {
    CadvisorContainer {
        namespace: "ns".into(),
        pod: pod.into(),
        container: "busybox-container".into(),
        cgroup: "/kubepods/pod1/abc".into(),
        name: "abc".into(),
        image: "busybox:1.37".into(),
        created: Some(Timestamp::from_second(1_800_000_000).unwrap()),
        sample: reader.read_cadvisor("/kubepods/pod1/abc").unwrap(),
        fs_usage_bytes: Some(8192),
    }
}

/// The samples of `family` for `pod`'s container: (labels, value).
fn samples(text: &str, family: &str, pod: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, labels) = series.split_once('{')?;
            (name == family && labels.contains(&format!("pod=\"{pod}\"")))
                .then(|| (labels.to_owned(), value.parse().unwrap()))
        })
        .collect()
}

#[test]
fn every_required_family_is_there_for_each_container_with_cadvisors_values() {
    let (_root, reader) = tree();
    let now = Timestamp::from_second(1_800_000_060).unwrap();
    let text = cadvisor_metrics(
        &[container(&reader, "pod0"), container(&reader, "pod1")],
        &RootFigures::default(),
        Some(Machine {
            cpu_cores: 2,
            memory_bytes: 8 << 30,
        }),
        now,
    );
    for family in REQUIRED {
        for pod in ["pod0", "pod1"] {
            let found = samples(&text, family, pod);
            assert!(!found.is_empty(), "{family} of {pod}:\n{text}");
            assert!(
                found.iter().all(
                    |(labels, _)| labels.contains("container=\"busybox-container\",")
                        && labels.contains("namespace=\"ns\"")
                ),
                "{family}: {found:?}"
            );
        }
    }
    let value = |family: &str| samples(&text, family, "pod0")[0].1;
    assert_eq!(value("container_cpu_usage_seconds_total"), 2.5);
    assert_eq!(value("container_cpu_user_seconds_total"), 2.0);
    assert_eq!(value("container_cpu_system_seconds_total"), 0.5);
    assert_eq!(value("container_memory_working_set_bytes"), 3_145_728.0);
    assert_eq!(value("container_memory_rss"), 1_048_576.0);
    assert_eq!(value("container_memory_cache"), 2_097_152.0);
    assert_eq!(value("container_memory_failcnt"), 0.0);
    assert_eq!(value("container_spec_cpu_period"), 100_000.0);
    assert_eq!(
        value("container_spec_cpu_shares"),
        2.0,
        "weight 1: shares 2"
    );
    assert_eq!(value("container_spec_memory_limit_bytes"), 79_998_976.0);
    assert_eq!(value("container_threads_max"), 0.0, "max: 0");
    assert_eq!(value("container_processes"), 1.0);
    assert_eq!(value("container_threads"), 1.0);
    assert_eq!(value("container_last_seen"), 1_800_000_060.0);
    assert_eq!(value("container_start_time_seconds"), 1_800_000_000.0);
    assert!(
        value("container_file_descriptors") >= 3.0,
        "this process's fds"
    );
    assert!(value("container_ulimits_soft") > 0.0);
    let blkio = samples(&text, "container_blkio_device_usage_total", "pod0");
    assert_eq!(blkio.len(), 2, "Read and Write");
    assert!(
        blkio
            .iter()
            .any(|(l, v)| l.contains("operation=\"Write\"") && *v == 8192.0)
    );
    assert!(text.contains("# TYPE container_cpu_usage_seconds_total counter\n"));
    assert!(text.contains("\nmachine_cpu_cores 2\n"), "{text}");
    assert!(
        !text.contains("container_spec_cpu_quota"),
        "no quota: no series"
    );
}

/// The spec also requires, of any container, the families it accepts missing for its own
/// (the filesystems' and the network's): cAdvisor's root container has them. Each family is
/// written once (the text format refuses a name twice).
#[test]
fn the_root_container_has_the_network_disk_and_filesystem_families() {
    let (_root, reader) = tree();
    let root = RootFigures {
        network: parse_net_devices(
            "Inter-|\n face |\n    lo: 9 9 0 0 0 0 0 0 9 9 0 0 0 0 0 0\n  eth0: 100 2 0 1 0 0 0 0 200 3 0 0 0 0 0 0\n",
        ),
        disks: parse_diskstats(
            "   7       0 loop0 1 0 0 0 0 0 0 0 0 0 0\n 253       0 vda 10 1 80 5000 20 2 160 7000 0 9000 12000 0 0 0 0\n",
        ),
        fs: Some(RootFs {
            device: "/var/lib/rustlet".into(),
            capacity_bytes: 100 << 30,
            used_bytes: 10 << 30,
            inodes: 1000,
            inodes_free: 900,
        }),
    };
    let text = cadvisor_metrics(
        &[container(&reader, "pod0")],
        &root,
        None,
        Timestamp::UNIX_EPOCH,
    );
    for family in [
        "container_fs_io_current",
        "container_fs_io_time_seconds_total",
        "container_fs_io_time_weighted_seconds_total",
        "container_fs_inodes_free",
        "container_fs_inodes_total",
        "container_fs_limit_bytes",
        "container_fs_read_seconds_total",
        "container_fs_reads_merged_total",
        "container_fs_sector_reads_total",
        "container_fs_sector_writes_total",
        "container_fs_write_seconds_total",
        "container_fs_writes_merged_total",
        "container_network_receive_bytes_total",
        "container_network_receive_errors_total",
        "container_network_receive_packets_dropped_total",
        "container_network_receive_packets_total",
        "container_network_transmit_bytes_total",
        "container_network_transmit_errors_total",
        "container_network_transmit_packets_dropped_total",
        "container_network_transmit_packets_total",
    ] {
        assert_eq!(
            text.matches(&format!("# TYPE {family} ")).count(),
            1,
            "{family}:\n{text}"
        );
    }
    assert_eq!(
        text.matches("# TYPE container_fs_reads_total ").count(),
        1,
        "merged"
    );
    assert!(text.contains("container_network_receive_bytes_total{container=\"\",id=\"/\",image=\"\",interface=\"eth0\",name=\"\",namespace=\"\",pod=\"\"} 100\n"), "{text}");
    assert!(!text.contains("interface=\"lo\""));
    assert!(
        text.contains(
            "container_fs_sector_reads_total{container=\"\",device=\"/dev/vda\",id=\"/\""
        ),
        "{text}"
    );
    assert!(!text.contains("loop0"));
}

#[test]
fn io_stat_and_cpu_weight_read_as_cadvisor_reads_them() {
    let devices =
        parse_io_stat("8:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0\n\n7:1 rbytes=5\n");
    assert_eq!(devices.len(), 2);
    assert_eq!(
        (
            devices[0].major,
            devices[0].minor,
            devices[0].read_bytes,
            devices[0].write_bytes
        ),
        (8, 0, 1, 2)
    );
    assert_eq!(
        (devices[0].reads, devices[0].writes, devices[1].read_bytes),
        (3, 4, 5)
    );
    assert_eq!(shares_of_weight(1), 2);
    assert_eq!(shares_of_weight(100), 2597);
    assert_eq!(shares_of_weight(10000), 262_144);
}

/// On cgroup v1 (runc's `fs` manager) the same figures come from each controller's
/// hierarchy; a cgroup whose files are gone is an error, not zeros.
#[test]
fn a_cgroup_v1_container_is_read_from_each_controller() {
    let root = tempfile::tempdir().unwrap();
    let cgroup = root.path().join("cgroup");
    let name = "kubepods/burstable/pod1/abc";
    write(
        &cgroup.join("cpuacct").join(name),
        "cpuacct.usage",
        "2500000000\n",
    );
    write(
        &cgroup.join("cpuacct").join(name),
        "cpuacct.stat",
        "user 200\nsystem 50\n",
    );
    write(&cgroup.join("cpu").join(name), "cpu.shares", "2\n");
    write(
        &cgroup.join("cpu").join(name),
        "cpu.cfs_period_us",
        "100000\n",
    );
    write(&cgroup.join("cpu").join(name), "cpu.cfs_quota_us", "-1\n");
    let memory = cgroup.join("memory").join(name);
    write(&memory, "memory.usage_in_bytes", "4194304\n");
    write(&memory, "memory.max_usage_in_bytes", "5242880\n");
    write(&memory, "memory.limit_in_bytes", "79998976\n");
    write(
        &memory,
        "memory.soft_limit_in_bytes",
        "9223372036854771712\n",
    );
    write(
        &memory,
        "memory.oom_control",
        "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
    );
    write(
        &memory,
        "memory.stat",
        "cache 1\ntotal_cache 2097152\ntotal_rss 1048576\ntotal_mapped_file 65536\ntotal_inactive_file 1048576\ntotal_pgfault 1200\ntotal_pgmajfault 3\n",
    );
    let pid = std::process::id();
    write(
        &cgroup.join("pids").join(name),
        "cgroup.procs",
        &format!("{pid}\n"),
    );
    write(
        &cgroup.join("pids").join(name),
        "tasks",
        &format!("{pid}\n"),
    );
    write(&cgroup.join("pids").join(name), "pids.max", "max\n");
    write(
        &cgroup.join("blkio").join(name),
        "blkio.throttle.io_service_bytes_recursive",
        "253:0 Read 8192\n253:0 Write 4096\n253:0 Total 12288\nTotal 12288\n",
    );
    write(
        &cgroup.join("blkio").join(name),
        "blkio.throttle.io_serviced_recursive",
        "253:0 Read 2\n253:0 Write 1\n",
    );
    let reader = NodeReader::new(StatsRoots {
        cgroup: cgroup.clone(),
        proc: "/proc".into(),
    });
    let sample = reader.read_cadvisor(&format!("/{name}")).unwrap();
    assert_eq!(sample.cpu_usage_usec, 2_500_000);
    assert_eq!(
        (sample.cpu_user_usec, sample.cpu_system_usec),
        (2_000_000, 500_000)
    );
    assert_eq!(sample.cpu_shares, 2);
    assert_eq!(sample.cpu_quota, None);
    assert_eq!(sample.memory_working_set, 3_145_728);
    assert_eq!(sample.memory_rss, 1_048_576);
    assert_eq!(sample.memory_limit, Some(79_998_976));
    assert_eq!(spec_memory(sample.memory_reservation), 0.0, "unlimited: 0");
    assert_eq!(
        (sample.processes, sample.threads, sample.threads_max),
        (1, 1, None)
    );
    assert_eq!(
        sample.io,
        parse_blkio_v1(
            "253:0 Read 8192\n253:0 Write 4096\n",
            "253:0 Read 2\n253:0 Write 1\n"
        )
    );
    assert_eq!(
        (
            sample.io[0].read_bytes,
            sample.io[0].write_bytes,
            sample.io[0].reads,
            sample.io[0].writes
        ),
        (8192, 4096, 2, 1)
    );
    assert!(reader.read_cadvisor("/kubepods/gone").is_err());
}
