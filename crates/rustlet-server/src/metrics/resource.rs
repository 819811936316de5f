//! `/metrics/resource` (upstream: `pkg/kubelet/metrics/collectors/resource_metrics.go`): the
//! node's, pods' and containers' CPU seconds, working-set and swap bytes and the containers'
//! start times, with the sample times as timestamps, from the CPU-and-memory summary. What
//! metrics-server reads for `kubectl top`.
//!
//! Deviation: none in the series. `scrape_error` (deprecated in 1.29.0) is hidden in 1.37 as
//! component-base hides a metric from the minor release after its deprecation, so it is not
//! written; `resource_scrape_error` is.

use super::{Desc, Kind, Sample, Stability, encode};
use crate::stats::summary::{ContainerStats, PodStats, Summary};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const fn desc(name: &'static str, help: &'static str, stability: Stability, kind: Kind) -> Desc {
    Desc {
        name,
        help,
        stability,
        kind,
    }
}

const NODE_CPU: Desc = desc(
    "node_cpu_usage_seconds_total",
    "Cumulative cpu time consumed by the node in core-seconds",
    Stability::Stable,
    Kind::Counter,
);
const NODE_MEMORY: Desc = desc(
    "node_memory_working_set_bytes",
    "Current working set of the node in bytes",
    Stability::Stable,
    Kind::Gauge,
);
const NODE_SWAP: Desc = desc(
    "node_swap_usage_bytes",
    "Current swap usage of the node in bytes. Reported only on non-windows systems",
    Stability::Alpha,
    Kind::Gauge,
);
const CONTAINER_CPU: Desc = desc(
    "container_cpu_usage_seconds_total",
    "Cumulative cpu time consumed by the container in core-seconds",
    Stability::Stable,
    Kind::Counter,
);
const CONTAINER_MEMORY: Desc = desc(
    "container_memory_working_set_bytes",
    "Current working set of the container in bytes",
    Stability::Stable,
    Kind::Gauge,
);
const CONTAINER_SWAP: Desc = desc(
    "container_swap_usage_bytes",
    "Current amount of the container swap usage in bytes. Reported only on non-windows systems",
    Stability::Alpha,
    Kind::Gauge,
);
const CONTAINER_SWAP_LIMIT: Desc = desc(
    "container_swap_limit_bytes",
    "Current amount of the container swap limit in bytes. Reported only on non-windows systems",
    Stability::Alpha,
    Kind::Gauge,
);
const CONTAINER_START: Desc = desc(
    "container_start_time_seconds",
    "Start time of the container since unix epoch in seconds",
    Stability::Stable,
    Kind::Gauge,
);
const POD_CPU: Desc = desc(
    "pod_cpu_usage_seconds_total",
    "Cumulative cpu time consumed by the pod in core-seconds",
    Stability::Stable,
    Kind::Counter,
);
const POD_MEMORY: Desc = desc(
    "pod_memory_working_set_bytes",
    "Current working set of the pod in bytes",
    Stability::Stable,
    Kind::Gauge,
);
const POD_SWAP: Desc = desc(
    "pod_swap_usage_bytes",
    "Current amount of the pod swap usage in bytes. Reported only on non-windows systems",
    Stability::Alpha,
    Kind::Gauge,
);
const SCRAPE_ERROR: Desc = desc(
    "resource_scrape_error",
    "1 if there was an error while getting container metrics, 0 otherwise",
    Stability::Stable,
    Kind::Gauge,
);

fn millis(time: &Time) -> Option<i64> {
    Some(time.0.as_millisecond())
}

fn seconds_of_nanos(nanos: u64) -> f64 {
    nanos as f64 / 1e9
}

fn container_labels(pod: &PodStats, c: &ContainerStats) -> Vec<(&'static str, String)> {
    vec![
        ("container", c.name.clone()),
        ("pod", pod.pod_ref.name.clone()),
        ("namespace", pod.pod_ref.namespace.clone()),
    ]
}

fn pod_labels(pod: &PodStats) -> Vec<(&'static str, String)> {
    vec![
        ("pod", pod.pod_ref.name.clone()),
        ("namespace", pod.pod_ref.namespace.clone()),
    ]
}

/// The page of `summary` (the CPU-and-memory summary; `Err` when it could not be made:
/// then only `resource_scrape_error 1`). upstream: `resourceMetricsCollector.CollectWithStability`.
pub fn resource_metrics<E>(summary: Result<&Summary, E>) -> String {
    let mut node_cpu = Vec::new();
    let mut node_memory = Vec::new();
    let mut node_swap = Vec::new();
    let mut container_cpu = Vec::new();
    let mut container_memory = Vec::new();
    let mut container_swap = Vec::new();
    let mut container_swap_limit = Vec::new();
    let mut container_start = Vec::new();
    let mut pod_cpu = Vec::new();
    let mut pod_memory = Vec::new();
    let mut pod_swap = Vec::new();
    let error = match summary {
        Err(_) => 1.0,
        Ok(summary) => {
            let node = &summary.node;
            if let Some(cpu) = &node.cpu
                && let Some(used) = cpu.usage_core_nano_seconds
            {
                node_cpu.push(Sample {
                    labels: Vec::new(),
                    value: seconds_of_nanos(used),
                    timestamp_ms: millis(&cpu.time),
                });
            }
            if let Some(memory) = &node.memory
                && let Some(ws) = memory.working_set_bytes
            {
                node_memory.push(Sample {
                    labels: Vec::new(),
                    value: ws as f64,
                    timestamp_ms: millis(&memory.time),
                });
            }
            // upstream: the node's swap sample carries the memory's time.
            if let Some(swap) = &node.swap
                && let Some(used) = swap.swap_usage_bytes
                && let Some(memory) = &node.memory
            {
                node_swap.push(Sample {
                    labels: Vec::new(),
                    value: used as f64,
                    timestamp_ms: millis(&memory.time),
                });
            }
            for pod in &summary.pods {
                for c in &pod.containers {
                    let start = c.start_time.0;
                    if start.as_second() > 0 {
                        container_start.push(Sample {
                            labels: container_labels(pod, c),
                            value: start.as_nanosecond() as f64 / 1e9,
                            timestamp_ms: None,
                        });
                    }
                    if let Some(cpu) = &c.cpu
                        && let Some(used) = cpu.usage_core_nano_seconds
                    {
                        container_cpu.push(Sample {
                            labels: container_labels(pod, c),
                            value: seconds_of_nanos(used),
                            timestamp_ms: millis(&cpu.time),
                        });
                    }
                    if let Some(memory) = &c.memory
                        && let Some(ws) = memory.working_set_bytes
                    {
                        container_memory.push(Sample {
                            labels: container_labels(pod, c),
                            value: ws as f64,
                            timestamp_ms: millis(&memory.time),
                        });
                    }
                    if let Some(swap) = &c.swap {
                        if let Some(used) = swap.swap_usage_bytes {
                            container_swap.push(Sample {
                                labels: container_labels(pod, c),
                                value: used as f64,
                                timestamp_ms: millis(&swap.time),
                            });
                        }
                        if let Some(available) = swap.swap_available_bytes {
                            container_swap_limit.push(Sample {
                                labels: container_labels(pod, c),
                                value: (available + swap.swap_usage_bytes.unwrap_or(0)) as f64,
                                timestamp_ms: millis(&swap.time),
                            });
                        }
                    }
                }
                if let Some(cpu) = &pod.cpu
                    && let Some(used) = cpu.usage_core_nano_seconds
                {
                    pod_cpu.push(Sample {
                        labels: pod_labels(pod),
                        value: seconds_of_nanos(used),
                        timestamp_ms: millis(&cpu.time),
                    });
                }
                if let Some(memory) = &pod.memory
                    && let Some(ws) = memory.working_set_bytes
                {
                    pod_memory.push(Sample {
                        labels: pod_labels(pod),
                        value: ws as f64,
                        timestamp_ms: millis(&memory.time),
                    });
                }
                if let Some(swap) = &pod.swap
                    && let Some(used) = swap.swap_usage_bytes
                {
                    pod_swap.push(Sample {
                        labels: pod_labels(pod),
                        value: used as f64,
                        timestamp_ms: millis(&swap.time),
                    });
                }
            }
            0.0
        }
    };
    let scrape_error = vec![Sample {
        labels: Vec::new(),
        value: error,
        timestamp_ms: None,
    }];
    encode(vec![
        (NODE_CPU, node_cpu),
        (NODE_MEMORY, node_memory),
        (NODE_SWAP, node_swap),
        (CONTAINER_START, container_start),
        (CONTAINER_CPU, container_cpu),
        (CONTAINER_MEMORY, container_memory),
        (CONTAINER_SWAP, container_swap),
        (CONTAINER_SWAP_LIMIT, container_swap_limit),
        (POD_CPU, pod_cpu),
        (POD_MEMORY, pod_memory),
        (POD_SWAP, pod_swap),
        (SCRAPE_ERROR, scrape_error),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::summary::{CpuStats, MemoryStats, NodeStats, PodReference, SwapStats};
    use k8s_openapi::jiff::Timestamp;

    fn at(ms: i64) -> Time {
        Time(Timestamp::from_millisecond(ms).unwrap())
    }

    fn cpu(ms: i64, nanos: u64) -> Option<CpuStats> {
        Some(CpuStats {
            time: at(ms),
            usage_nano_cores: None,
            usage_core_nano_seconds: Some(nanos),
            psi: None,
        })
    }

    fn memory(ms: i64, ws: u64) -> Option<MemoryStats> {
        Some(MemoryStats {
            time: at(ms),
            available_bytes: None,
            usage_bytes: None,
            working_set_bytes: Some(ws),
            rss_bytes: None,
            page_faults: None,
            major_page_faults: None,
            psi: None,
        })
    }

    /// upstream's `TestCollectResourceMetrics` ("arbitrary node metrics", "arbitrary container
    /// metrics for different container, pods and namespaces"): the page byte for byte.
    #[test]
    fn test_collect_resource_metrics() {
        let ts = 1_624_396_278_302;
        let summary = Summary {
            node: NodeStats {
                cpu: cpu(ts, 10_000_000_000),
                memory: memory(ts, 1000),
                swap: Some(SwapStats {
                    time: at(ts),
                    swap_available_bytes: None,
                    swap_usage_bytes: Some(500),
                }),
                ..NodeStats::default()
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "pod_a".into(),
                    namespace: "namespace_a".into(),
                    uid: "u1".into(),
                },
                start_time: at(ts),
                containers: vec![
                    ContainerStats {
                        name: "container_b".into(),
                        start_time: at(1_624_396_278_302),
                        cpu: cpu(ts, 10_000_000_000),
                        memory: memory(ts, 1000),
                        io: None,
                        rootfs: None,
                        logs: None,
                        swap: None,
                    },
                    ContainerStats {
                        name: "container_a".into(),
                        start_time: at(1_624_396_278_302),
                        cpu: cpu(ts, 10_000_000_000),
                        memory: memory(ts, 1000),
                        io: None,
                        rootfs: None,
                        logs: None,
                        swap: None,
                    },
                ],
                cpu: cpu(ts, 10_000_000_000),
                memory: memory(ts, 12_238_848),
                io: None,
                network: None,
                volume_stats: Vec::new(),
                ephemeral_storage: None,
                process_stats: None,
                swap: None,
            }],
        };
        let expected = "\
# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container=\"container_a\",namespace=\"namespace_a\",pod=\"pod_a\"} 10 1624396278302
container_cpu_usage_seconds_total{container=\"container_b\",namespace=\"namespace_a\",pod=\"pod_a\"} 10 1624396278302
# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container=\"container_a\",namespace=\"namespace_a\",pod=\"pod_a\"} 1000 1624396278302
container_memory_working_set_bytes{container=\"container_b\",namespace=\"namespace_a\",pod=\"pod_a\"} 1000 1624396278302
# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch in seconds
# TYPE container_start_time_seconds gauge
container_start_time_seconds{container=\"container_a\",namespace=\"namespace_a\",pod=\"pod_a\"} 1.624396278302e+09
container_start_time_seconds{container=\"container_b\",namespace=\"namespace_a\",pod=\"pod_a\"} 1.624396278302e+09
# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 10 1624396278302
# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 1000 1624396278302
# HELP node_swap_usage_bytes [ALPHA] Current swap usage of the node in bytes. Reported only on non-windows systems
# TYPE node_swap_usage_bytes gauge
node_swap_usage_bytes 500 1624396278302
# HELP pod_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the pod in core-seconds
# TYPE pod_cpu_usage_seconds_total counter
pod_cpu_usage_seconds_total{namespace=\"namespace_a\",pod=\"pod_a\"} 10 1624396278302
# HELP pod_memory_working_set_bytes [STABLE] Current working set of the pod in bytes
# TYPE pod_memory_working_set_bytes gauge
pod_memory_working_set_bytes{namespace=\"namespace_a\",pod=\"pod_a\"} 1.2238848e+07 1624396278302
# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE resource_scrape_error gauge
resource_scrape_error 0
";
        assert_eq!(resource_metrics::<()>(Ok(&summary)), expected);
    }

    /// upstream's "error getting summary": only `resource_scrape_error 1`.
    #[test]
    fn a_failed_summary_is_resource_scrape_error_1() {
        assert_eq!(
            resource_metrics(Err("no runtime")),
            "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n\
             # TYPE resource_scrape_error gauge\nresource_scrape_error 1\n"
        );
    }
}
