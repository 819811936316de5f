//! Prometheus metrics with upstream's names (spec section 2.6): volumes by plugin and state,
//! and operation durations by operation, plugin and status.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::cache::asw::ActualStateOfWorld;
use crate::cache::dsw::DesiredStateOfWorld;

/// Label pairs.
pub type Labels = Vec<(String, String)>;

fn operation_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 4.0, 12))
}

/// The volume manager's metrics. Cloning shares the series.
#[derive(Clone, Debug)]
pub struct VolumeMetrics {
    /// `storage_operation_duration_seconds{operation_name, volume_plugin, status}`.
    pub operation_duration: Family<Labels, Histogram, fn() -> Histogram>,
    /// `force_cleaned_failed_volume_operations_total` (upstream, V76): volumes that failed
    /// reconstruction and were cleaned up.
    pub force_cleaned: Counter,
}

impl Default for VolumeMetrics {
    fn default() -> Self {
        Self {
            operation_duration: Family::new_with_constructor(
                operation_histogram as fn() -> Histogram,
            ),
            force_cleaned: Counter::default(),
        }
    }
}

impl VolumeMetrics {
    /// Registers every series (the agent prefixes them, e.g. with `kubelet_`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "storage_operation_duration_seconds",
            "Duration of volume operations",
            self.operation_duration.clone(),
        );
        registry.register(
            "force_cleaned_failed_volume_operations",
            "Volumes that failed reconstruction and were cleaned up",
            self.force_cleaned.clone(),
        );
    }

    /// Counts one volume cleaned up after a failed reconstruction (V76).
    pub fn force_cleaned(&self) {
        self.force_cleaned.inc();
    }

    /// Records one finished operation.
    pub fn operation(&self, operation: &str, plugin: &str, success: bool, seconds: f64) {
        let labels = vec![
            ("operation_name".to_owned(), operation.to_owned()),
            ("volume_plugin".to_owned(), plugin.to_owned()),
            (
                "status".to_owned(),
                if success { "success" } else { "fail-unknown" }.to_owned(),
            ),
        ];
        self.operation_duration
            .get_or_create(&labels)
            .observe(seconds);
    }
}

/// `volume_manager_total_volumes{plugin_name, state}` (state `desired_state_of_world` or
/// `actual_state_of_world`), counted from the caches on each scrape, as upstream's
/// `totalVolumesCollector`: nothing is counted while nobody asks, and a plugin whose volumes
/// are all gone drops out instead of staying at its last count.
#[derive(Debug)]
pub struct TotalVolumes {
    pub(crate) dsw: Arc<DesiredStateOfWorld>,
    pub(crate) asw: Arc<ActualStateOfWorld>,
}

impl Collector for TotalVolumes {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let states: [(&str, BTreeMap<String, i64>); 2] = [
            ("desired_state_of_world", self.dsw.volume_counts_by_plugin()),
            ("actual_state_of_world", self.asw.volume_counts_by_plugin()),
        ];
        let mut family = encoder.encode_descriptor(
            "volume_manager_total_volumes",
            "Number of volumes in the desired and actual state",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (state, counts) in states {
            for (plugin, count) in counts {
                let labels: Labels = vec![
                    ("plugin_name".to_owned(), plugin),
                    ("state".to_owned(), state.to_owned()),
                ];
                ConstGauge::new(count).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustlet_core::{PodUid, UniquePodName};

    use super::TotalVolumes;
    use crate::cache::{ActualStateOfWorld, DesiredStateOfWorld, MarkVolumeOpts, VolumeMountState};
    use crate::testing::{fake_plugins, persistent, pod};

    /// upstream: TestMetricCollection
    ///
    /// One pod volume added to the desired state and mounted in the actual state: the
    /// collector reports one `fake-plugin` volume in each of the two states, and nothing else.
    #[test]
    fn test_metric_collection() {
        let plugins = fake_plugins();
        let dsw = Arc::new(DesiredStateOfWorld::new(plugins.clone()));
        let asw = Arc::new(ActualStateOfWorld::new(plugins));
        let pod_name = UniquePodName::new("pod1uid");
        let spec = persistent("fake-device1");
        let volume_name = dsw
            .add_pod_to_volume(&pod_name, pod("pod1uid"), spec.clone(), "volume-name")
            .unwrap();
        let attached = asw
            .mark_volume_as_attached(None, &spec, "fake/device/path")
            .unwrap();
        assert_eq!(attached, volume_name);
        asw.mark_volume_as_mounted(MarkVolumeOpts {
            pod_name,
            pod_uid: PodUid::new("pod1uid"),
            volume_name,
            spec,
            outer_volume_spec_name: "volume-name".into(),
            volume_gid: None,
            state: VolumeMountState::Mounted,
        })
        .unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(TotalVolumes { dsw, asw }));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("volume_manager_total_volumes{"))
            .collect();
        assert_eq!(
            series,
            [
                "volume_manager_total_volumes{plugin_name=\"fake-plugin\",state=\"desired_state_of_world\"} 1",
                "volume_manager_total_volumes{plugin_name=\"fake-plugin\",state=\"actual_state_of_world\"} 1",
            ],
            "{text}"
        );
    }
}
