//! Prometheus metrics with upstream's names (spec section 2.6): volumes by plugin and state,
//! and operation durations by operation, plugin and status.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label pairs.
pub type Labels = Vec<(String, String)>;

fn operation_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 4.0, 12))
}

/// The volume manager's metrics. Cloning shares the series.
#[derive(Clone, Debug)]
pub struct VolumeMetrics {
    /// `volume_manager_total_volumes{plugin_name, state}`, state `desired_state_of_world` or
    /// `actual_state_of_world`; refreshed on the resync period.
    pub total_volumes: Family<Labels, Gauge>,
    /// `storage_operation_duration_seconds{operation_name, volume_plugin, status}`.
    pub operation_duration: Family<Labels, Histogram, fn() -> Histogram>,
    /// `force_cleaned_failed_volume_operations_total` (upstream, V76): volumes that failed
    /// reconstruction and were cleaned up.
    pub force_cleaned: Counter,
}

impl Default for VolumeMetrics {
    fn default() -> Self {
        Self {
            total_volumes: Family::default(),
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
            "volume_manager_total_volumes",
            "Number of volumes in the desired and actual state",
            self.total_volumes.clone(),
        );
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

    /// Sets the volume counts of one state from (plugin, count) pairs.
    pub fn set_totals(&self, state: &str, counts: impl IntoIterator<Item = (String, i64)>) {
        for (plugin, count) in counts {
            self.total_volumes
                .get_or_create(&vec![
                    ("plugin_name".to_owned(), plugin),
                    ("state".to_owned(), state.to_owned()),
                ])
                .set(count);
        }
    }
}
