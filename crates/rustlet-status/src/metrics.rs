//! Prometheus metrics of the status manager (prometheus-client). Register them into the
//! agent's registry with [`StatusMetrics::register`]; the manager only updates them.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label pairs.
pub type Labels = Vec<(String, String)>;

/// The status manager's metrics. Cloning shares the underlying series.
#[derive(Clone, Debug)]
pub struct StatusMetrics {
    /// `pod_status_sync_duration_seconds` (upstream name): from the first accepted update of a
    /// not-yet-synced status to its successful sync (R59; reset per synced version, R61).
    pub sync_duration: Histogram,
    /// `status_api_requests_total{verb, code}`: API calls made, by verb and HTTP code (0: no
    /// answer).
    pub api_requests: Family<Labels, Counter>,
    /// `status_sync_batches_total{kind}`: batches the sync task ran, by kind (`kick`, `full`,
    /// `retry`). Bounded work is visible here: an idle manager runs one full batch a period.
    pub sync_batches: Family<Labels, Counter>,
    /// `status_pods_pending_sync`: cached pods whose latest version is not yet synced, as of the
    /// last batch.
    pub pods_pending_sync: Gauge,
    /// `terminated_containers_total{container_type, exit_code, reason}` (upstream R13).
    pub terminated_containers: Family<Labels, Counter>,
    /// `pod_pending_resizes{reason}` (upstream R54, reason lower-cased).
    pub pending_resizes: Family<Labels, Gauge>,
    /// `pod_in_progress_resizes` (upstream R54).
    pub in_progress_resizes: Gauge,
}

impl Default for StatusMetrics {
    fn default() -> Self {
        Self {
            sync_duration: Histogram::new(exponential_buckets(0.001, 2.0, 18)),
            api_requests: Family::default(),
            sync_batches: Family::default(),
            pods_pending_sync: Gauge::default(),
            terminated_containers: Family::default(),
            pending_resizes: Family::default(),
            in_progress_resizes: Gauge::default(),
        }
    }
}

impl StatusMetrics {
    /// Registers every series under `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "pod_status_sync_duration_seconds",
            "Duration from a pod status update to its sync to the API server",
            self.sync_duration.clone(),
        );
        registry.register(
            "status_api_requests",
            "API requests of the status manager by verb and HTTP code",
            self.api_requests.clone(),
        );
        registry.register(
            "status_sync_batches",
            "Batches run by the status sync task, by kind",
            self.sync_batches.clone(),
        );
        registry.register(
            "status_pods_pending_sync",
            "Cached pod statuses not yet synced to the API server",
            self.pods_pending_sync.clone(),
        );
        registry.register(
            "terminated_containers",
            "Containers seen entering the terminated state",
            self.terminated_containers.clone(),
        );
        registry.register(
            "pod_pending_resizes",
            "Pending pod resizes by reason",
            self.pending_resizes.clone(),
        );
        registry.register(
            "pod_in_progress_resizes",
            "Pod resizes in progress",
            self.in_progress_resizes.clone(),
        );
    }

    /// Counts one API request.
    pub fn request(&self, verb: &str, code: u16) {
        self.api_requests
            .get_or_create(&vec![
                ("verb".into(), verb.into()),
                ("code".into(), code.to_string()),
            ])
            .inc();
    }

    /// The count of requests with this verb and code so far.
    pub fn requests(&self, verb: &str, code: u16) -> u64 {
        self.api_requests
            .get_or_create(&vec![
                ("verb".into(), verb.into()),
                ("code".into(), code.to_string()),
            ])
            .get()
    }

    /// Counts one batch of this kind.
    pub fn batch(&self, kind: &str) {
        self.sync_batches
            .get_or_create(&vec![("kind".into(), kind.into())])
            .inc();
    }

    /// The count of batches of this kind so far.
    pub fn batches(&self, kind: &str) -> u64 {
        self.sync_batches
            .get_or_create(&vec![("kind".into(), kind.into())])
            .get()
    }
}
