//! rustlet-status: the status manager. It owns every pod's status on the node and gets it to
//! the API server, correctly, cheaply, and never to the wrong pod.
//!
//! Mirrors upstream `pkg/kubelet/status/status_manager.go`; the rules themselves (R1-R67 of
//! `shared/spec/status-manager.md`) live in `rustlet-core`.
//!
//! # How it works
//!
//! Mutators ([`StatusManager::set_pod_status`], `set_container_readiness`,
//! `set_container_startup`, `terminate_pod`) run the core rules under a write lock, store a new
//! version per pod, and kick the sync task through a capacity-1 channel (bursts coalesce; with a
//! `kick_interval`, kick batches start at most once per interval). The
//! single sync task ([`StatusManager::start`]) syncs every pod whose version is newer than the
//! one it last synced, runs a full batch every 10 s that also reconciles drift and retries
//! deletions, and retries failures after a jittered exponential backoff. Each sync reads the API
//! pod (from the pod manager's watch copy, patching with its `resourceVersion` as precondition,
//! waiting up to `watch_lag_allowance` for the watch to deliver our last write before it
//! falls back to GET, and falling back to GET on 409; never reading a pod the watch saw deleted, which the Node
//! authorizer refuses; or always by GET, upstream's shape), merges, and sends one
//! strategic merge patch of the status subresource carrying the pod UID as precondition. Up to
//! `max_concurrent_syncs` pods sync at once, each as its own task, behind a token-bucket rate
//! limit; every API call has a deadline (`request_timeout`), and a batch skips pods still in
//! flight, so a slow pod holds back only itself. Retry times that pass without their pod
//! being synced are dropped (the task never wakes for nothing), and a DELETE answered 404 is
//! done.
//!
//! # Invariants
//!
//! * **Who owns what.** The cache (`statuses`) belongs to the manager and is guarded by a lock
//!   never held across an await; the synced-version map belongs to the sync task alone (no
//!   lock). A synced version is recorded only after the API has that version.
//! * **Versions never go back** while an entry exists; NotFound never deletes the cache (#17980).
//! * **When a status may be deleted from the API:** only when the API copy has a deletion
//!   timestamp, is not a mirror pod, has a terminal phase, and the cached status is finished
//!   (`TerminatePod` ran): `rustlet_core::deletion_decision` says `Delete`. The DELETE carries
//!   `gracePeriodSeconds: 0` and the pod UID as precondition. Static pods write to their mirror
//!   pod and are never deleted.
//! * At most one request is in flight per pod (a batch syncs each pod once and the next batch
//!   starts when it is done).
//!
//! # Boundaries
//!
//! Depends on `rustlet-core`; never on kube, nix or a crate above it. The API is reached through
//! [`PodStatusClient`], implemented in `rustlet-api`. Mocks and fakes for other crates' tests are
//! behind the `test-util` feature ([`testing`]).
//!
//! Deliberately not ported: init-container coalescing (R14, an unmerged upstream PR). Kept as
//! upstream: `at` (R61) is the first-seen time of the entry.

mod config;
mod limiter;
mod manager;
mod metrics;
mod resize;
mod seams;
mod sync;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;

#[cfg(test)]
mod tests;

pub use config::{BackoffConfig, ReadStrategy, RetryPolicy, StatusManagerConfig};
pub use limiter::RateLimiter;
pub use manager::{StatusManager, StatusManagerDeps, UpdateResult};
pub use metrics::StatusMetrics;
pub use resize::{RESIZE_DEFERRED, RESIZE_INFEASIBLE};
pub use seams::{
    ClientError, Clock, PodManager, PodStatusClient, StartupLatencyHook, SystemClock,
    UidTranslations,
};
#[cfg(any(test, feature = "test-util"))]
pub use seams::{MockPodManager, MockPodStatusClient, MockStartupLatencyHook};

/// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
