//! The status manager's configuration, as a struct (no bool mode flags).

use std::time::Duration;

use rustlet_core::FeatureGates;

/// Where `sync_pod` reads the API pod before patching.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadStrategy {
    /// From the pod manager's watch-fed copy, patching with its `resourceVersion` as an
    /// optimistic-concurrency precondition; on 409 (or with a copy still older than our last
    /// write after `watch_lag_allowance`) fall back to GET-merge-PATCH. One API call per change in the common case. A pod the watch no longer
    /// has was deleted: it is not read (the Node authorizer refuses that read; upstream's
    /// shape makes it).
    #[default]
    WatchCache,
    /// Upstream's shape: a quorum GET before every PATCH. Two calls per change.
    AlwaysGet,
}

/// Retry spacing for failed syncs: exponential with jitter, capped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffConfig {
    /// Delay after the first failure.
    pub initial: Duration,
    /// Upper bound of the delay.
    pub max: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(250),
            max: Duration::from_secs(10),
        }
    }
}

/// What happens to a pod whose sync failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryPolicy {
    /// Upstream's: nothing of its own; the next batch of either kind (a kick, or the full batch
    /// every sync period) syncs the pod again.
    NextBatch,
    /// A retry batch for the pod after a jittered exponential back-off.
    Backoff(BackoffConfig),
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::Backoff(BackoffConfig::default())
    }
}

/// Configuration of a [`crate::StatusManager`].
#[derive(Clone, Debug, PartialEq)]
pub struct StatusManagerConfig {
    /// Period of the full batch (upstream `syncPeriod`, 10 s).
    pub sync_period: Duration,
    /// Client-side rate limit, requests per second (kubelet `kubeAPIQPS`, 50).
    pub api_qps: f64,
    /// Client-side burst (kubelet `kubeAPIBurst`, 100).
    pub api_burst: u32,
    /// Pods synced at once; one request in flight per pod at most (upstream: 1).
    pub max_concurrent_syncs: usize,
    /// How the API pod is read before a patch.
    pub read_strategy: ReadStrategy,
    /// With [`ReadStrategy::WatchCache`]: how long a sync waits for the watch to deliver our
    /// last write before it reads the pod by name instead (a pod deleted meanwhile is then
    /// seen deleted, not read).
    pub watch_lag_allowance: Duration,
    /// What follows a failed sync.
    pub retry: RetryPolicy,
    /// Deadline of every API call; a call past it fails as a retryable transport error.
    pub request_timeout: Duration,
    /// On shutdown, how long to keep flushing statuses not yet synced.
    pub shutdown_flush_deadline: Duration,
    /// Feature gates in force.
    pub gates: FeatureGates,
    /// Every this many full batches, one looks at every cached pod (a consistency check); the
    /// others look only at pods whose status or API copy changed, that are not synced, or that
    /// are finished (their deletion may become due). 1: every full batch looks at every pod,
    /// as upstream's does.
    pub full_scan_every: u32,
    /// The least time between the starts of two kick batches. A change after a quiet spell is
    /// synced at once; the changes of a burst that follow it wait for the next batch, one
    /// interval after that one began, and each pod is written once in it at its latest
    /// version, however often it changed meanwhile. Zero (the default, upstream's shape): a
    /// kick batch starts at every signal. Local mode sets it (`statusKickIntervalSeconds`):
    /// its writes go to the agent's own store, and in a start of many pods they would take a
    /// third of the CPU the pods need to start.
    pub kick_interval: Duration,
}

impl Default for StatusManagerConfig {
    fn default() -> Self {
        Self {
            sync_period: Duration::from_secs(10),
            api_qps: 50.0,
            api_burst: 100,
            max_concurrent_syncs: 16,
            read_strategy: ReadStrategy::default(),
            watch_lag_allowance: Duration::from_secs(1),
            retry: RetryPolicy::default(),
            request_timeout: Duration::from_secs(10),
            shutdown_flush_deadline: Duration::from_secs(5),
            gates: FeatureGates::default(),
            // Every 5 minutes with the 10 s period.
            full_scan_every: 30,
            kick_interval: Duration::ZERO,
        }
    }
}

impl StatusManagerConfig {
    /// Upstream's behaviour: GET before every PATCH, one pod at a time, no back-off of its own
    /// (a failed pod is retried by the next batch of either kind), and no rate limit of the
    /// manager's own (for parity tests and as the benchmark baseline).
    pub fn upstream() -> Self {
        Self {
            max_concurrent_syncs: 1,
            read_strategy: ReadStrategy::AlwaysGet,
            api_qps: f64::INFINITY,
            retry: RetryPolicy::NextBatch,
            full_scan_every: 1,
            ..Self::default()
        }
    }
}
