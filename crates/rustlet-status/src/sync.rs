//! The sync task: the only owner of the synced-version map (upstream `syncBatch`, `syncPod`,
//! `needsUpdate`, `needsReconcile`).
//!
//! State machine of one cached pod, as the task sees it:
//!
//! * **Pending**: cached version > synced version. A kick batch syncs it.
//! * **Synced**: cached version == synced version. Only a full batch looks at it again: to retry
//!   its deletion (R32) or to overwrite drift in kubelet-owned fields (R33).
//! * **Backing off**: its last sync failed (API error, 404); no batch touches it until its retry
//!   time, when a retry batch syncs it (full-batch rules). Success leaves the state.
//! * **Gone**: deleted from the API (or recreated under another UID): the cache entry is dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use rustlet_core::deletion::{PodDeletionSafety, can_be_deleted};
use rustlet_core::equality::is_pod_status_by_kubelet_equal;
use rustlet_core::merge::{MergeContext, merge_pod_status};
use rustlet_core::normalize::normalize_status;
use rustlet_core::patch::status_patch;
use rustlet_core::pod::is_static_pod;
use rustlet_core::{PodUid, VersionedPodStatus};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::config::{ReadStrategy, StatusManagerConfig};
use crate::limiter::RateLimiter;
use crate::manager::Shared;
use crate::seams::{ClientError, PodStatusClient};

/// Which batch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BatchKind {
    /// After a kick: pods whose cached version is newer than the synced one (R30).
    Kick,
    /// Every sync period: also deletion retries and reconciliation (R31-R33).
    Full,
    /// When a backoff expires: the pods whose retry time has come, with full-batch rules.
    Retry,
}

/// What one pod's sync came to.
#[derive(Debug)]
pub(crate) enum SyncOutcome {
    /// The API has this version (patched, or nothing to patch).
    Synced {
        api_uid: PodUid,
        version: u64,
        deletion: Deletion,
    },
    /// The pod is not in the API (R34): nothing recorded.
    NotFound,
    /// The API pod has another UID (R35): the stale cache entry was dropped.
    Recreated,
    /// A request failed: nothing recorded, retried after a backoff.
    Failed(ClientError),
}

/// The final DELETE, if any.
#[derive(Debug)]
pub(crate) enum Deletion {
    NotDue,
    Deleted,
    Failed(ClientError),
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    pub(crate) attempt: u32,
    pub(crate) not_before: Instant,
}

/// What every concurrent `sync_pod` shares.
pub(crate) struct SyncContext {
    pub(crate) shared: Arc<Shared>,
    client: Arc<dyn PodStatusClient>,
    safety: Arc<dyn PodDeletionSafety>,
    limiter: RateLimiter,
    pub(crate) config: StatusManagerConfig,
}

/// The sync task's state. Owned by one task; no lock.
pub(crate) struct Syncer {
    pub(crate) ctx: Arc<SyncContext>,
    pub(crate) kick_rx: mpsc::Receiver<()>,
    /// Last version synced per API object UID (the mirror UID for static pods).
    pub(crate) api_status_versions: HashMap<PodUid, u64>,
    pub(crate) backoff: HashMap<PodUid, Backoff>,
    /// Per cache UID: the pod manager copy's resourceVersion and our version the last time
    /// they were found equal, so an unchanged pair is not compared again (R33 at O(1)).
    reconciled: HashMap<PodUid, (String, u64)>,
    rng: u64,
}

impl Syncer {
    pub(crate) fn new(
        shared: Arc<Shared>,
        client: Arc<dyn PodStatusClient>,
        safety: Arc<dyn PodDeletionSafety>,
        kick_rx: mpsc::Receiver<()>,
        config: StatusManagerConfig,
    ) -> Self {
        let limiter = RateLimiter::new(config.api_qps, config.api_burst);
        Self {
            ctx: Arc::new(SyncContext {
                shared,
                client,
                safety,
                limiter,
                config,
            }),
            kick_rx,
            api_status_versions: HashMap::new(),
            backoff: HashMap::new(),
            reconciled: HashMap::new(),
            rng: 0x2545_F491_4F6C_DD1D,
        }
    }

    /// The task: kicks, the periodic full batch, backoff retries; on cancellation a last flush.
    pub(crate) async fn run(mut self, cancel: CancellationToken) {
        let period = self.ctx.config.sync_period;
        let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let next_retry = self.backoff.values().map(|b| b.not_before).min();
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                Some(()) = self.kick_rx.recv() => { self.sync_batch(BatchKind::Kick).await; }
                _ = ticker.tick() => { self.sync_batch(BatchKind::Full).await; }
                () = sleep_until_opt(next_retry) => { self.sync_batch(BatchKind::Retry).await; }
            }
        }
        let deadline = self.ctx.config.shutdown_flush_deadline;
        match tokio::time::timeout(deadline, self.flush()).await {
            Ok(()) => info!("status manager stopped; unsynced statuses flushed"),
            Err(_) => warn!(
                ?deadline,
                "status manager stopped before every status was flushed"
            ),
        }
    }

    /// Syncs every pending version, ignoring backoffs, until nothing is pending or a pass makes
    /// no progress.
    async fn flush(&mut self) {
        self.backoff.clear();
        loop {
            let synced = self.sync_batch(BatchKind::Kick).await;
            if synced == 0 || self.backoff.len() >= synced {
                return;
            }
        }
    }

    /// Upstream `needsUpdate` given the synced version (`None`: never synced).
    fn needs_update(
        &self,
        synced: Option<u64>,
        status_uid: &PodUid,
        status: &VersionedPodStatus,
    ) -> bool {
        match synced {
            Some(synced) if synced >= status.version => {}
            _ => return true,
        }
        // Only a finished pod can be due for deletion (R40): skip the lookup for the others.
        status.pod_is_finished
            && self
                .ctx
                .shared
                .pods
                .pod_by_uid(status_uid)
                .is_some_and(|pod| can_be_deleted(&pod, status.pod_is_finished))
    }

    fn needs_reconcile(&mut self, cache_uid: &PodUid, status: &VersionedPodStatus) -> bool {
        let pods = &self.ctx.shared.pods;
        let Some(mut pod) = pods.pod_by_uid(cache_uid) else {
            return false;
        };
        if is_static_pod(&pod) {
            let Some(mirror) = pods.mirror_pod_of(&pod) else {
                return false;
            };
            pod = mirror;
        }
        let rv = pod.metadata.resource_version.as_ref();
        if let (Some(rv), Some((seen_rv, seen_version))) = (rv, self.reconciled.get(cache_uid))
            && rv == seen_rv
            && *seen_version == status.version
        {
            return false;
        }
        let mut api_status = pod.status.clone().unwrap_or_default();
        normalize_status(pod.spec.as_ref(), &mut api_status);
        if is_pod_status_by_kubelet_equal(&api_status, &status.status, &self.ctx.shared.gates) {
            if let Some(rv) = rv {
                self.reconciled
                    .insert(cache_uid.clone(), (rv.clone(), status.version));
            }
            return false;
        }
        debug!(uid = %cache_uid, "Pod status is inconsistent with cached status for pod, a reconciliation should be triggered");
        true
    }

    /// One batch (upstream `syncBatch`); returns how many pods it synced.
    pub(crate) async fn sync_batch(&mut self, kind: BatchKind) -> usize {
        let translations = self.ctx.shared.pods.uid_translations();
        let now = Instant::now();
        let shared = self.ctx.shared.clone();
        let mut work = Vec::new();
        {
            let map = shared.read();
            if kind == BatchKind::Full {
                self.api_status_versions.retain(|uid, _| {
                    map.contains_key(uid) || translations.mirror_to_pod.contains_key(uid)
                });
                if !self.backoff.is_empty() {
                    self.backoff.retain(|uid, _| map.contains_key(uid));
                }
                // The memo only needs pruning once it holds entries for pods that are gone.
                if self.reconciled.len() > map.len() {
                    self.reconciled.retain(|uid, _| map.contains_key(uid));
                }
            }
            let mut pending = 0i64;
            for (uid, status) in map.iter() {
                let status_uid = match translations.pod_to_mirror.get(uid) {
                    Some(mirror) if mirror.is_empty() => continue, // static pod without mirror (R29)
                    Some(mirror) => mirror,
                    None => uid,
                };
                let recorded = self.api_status_versions.get(status_uid).copied();
                let synced = recorded.unwrap_or(0);
                if synced < status.version {
                    pending += 1;
                }
                if !self.backoff.is_empty() || kind == BatchKind::Retry {
                    match self.backoff.get(uid) {
                        Some(b) if b.not_before > now => continue,
                        None if kind == BatchKind::Retry => continue,
                        _ => {}
                    }
                }
                let due = match kind {
                    BatchKind::Kick => synced < status.version,
                    BatchKind::Full | BatchKind::Retry => {
                        if self.needs_update(recorded, status_uid, status) {
                            true
                        } else if self.needs_reconcile(uid, status) {
                            self.api_status_versions.remove(status_uid);
                            true
                        } else {
                            false
                        }
                    }
                };
                if due {
                    work.push((uid.clone(), status_uid.clone(), status.clone()));
                }
            }
            shared.metrics.pods_pending_sync.set(pending);
        }

        let count = work.len();
        let concurrency = self.ctx.config.max_concurrent_syncs.max(1);
        let ctx = self.ctx.clone();
        let results: Vec<(PodUid, SyncOutcome)> = futures::stream::iter(work)
            .map(|(uid, status_uid, status)| {
                let ctx = ctx.clone();
                async move {
                    let outcome = sync_pod(&ctx, &uid, &status_uid, &status).await;
                    (uid, outcome)
                }
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        for (uid, outcome) in results {
            self.record(uid, outcome);
        }
        count
    }

    fn record(&mut self, uid: PodUid, outcome: SyncOutcome) {
        match outcome {
            SyncOutcome::Synced {
                api_uid,
                version,
                deletion,
            } => {
                self.api_status_versions.insert(api_uid, version);
                match deletion {
                    Deletion::Failed(e) => self.schedule_retry(uid, &e),
                    Deletion::NotDue | Deletion::Deleted => {
                        self.backoff.remove(&uid);
                    }
                }
            }
            SyncOutcome::Recreated => {
                self.backoff.remove(&uid);
            }
            SyncOutcome::NotFound => self.schedule_retry(uid, &"not found"),
            SyncOutcome::Failed(e) => self.schedule_retry(uid, &e),
        }
    }

    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Exponential backoff with ±20 % jitter: initial × 2^attempt, capped.
    fn schedule_retry(&mut self, uid: PodUid, reason: &dyn std::fmt::Display) {
        let jitter = 0.8 + 0.4 * (self.next_random() % 1000) as f64 / 1000.0;
        let config = self.ctx.config.backoff;
        let entry = self.backoff.entry(uid.clone()).or_insert(Backoff {
            attempt: 0,
            not_before: Instant::now(),
        });
        let base = config
            .initial
            .saturating_mul(1u32 << entry.attempt.min(20))
            .min(config.max);
        entry.attempt = entry.attempt.saturating_add(1);
        let delay = base.mul_f64(jitter);
        entry.not_before = Instant::now() + delay;
        debug!(%uid, %reason, attempt = entry.attempt, ?delay, "pod status sync failed; retrying after a backoff");
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl SyncContext {
    async fn call<T>(
        &self,
        verb: &str,
        request: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        self.limiter.acquire().await;
        let result = request.await;
        let code = match &result {
            Ok(_) => 200,
            Err(e) => e.code(),
        };
        self.shared.metrics.request(verb, code);
        result
    }

    async fn get(&self, status: &VersionedPodStatus) -> Result<Pod, ClientError> {
        self.call(
            "get",
            self.client.get_pod(&status.pod_namespace, &status.pod_name),
        )
        .await
    }

    /// The pod manager's watch-fed copy of the API pod, when it is the object we write to.
    fn cached_api_pod(&self, cache_uid: &PodUid, status_uid: &PodUid) -> Option<Pod> {
        let pods = &self.shared.pods;
        let mut pod = pods.pod_by_uid(cache_uid)?;
        if is_static_pod(&pod) {
            pod = pods.mirror_pod_of(&pod)?;
        }
        let usable = pod.metadata.uid.as_deref() == Some(status_uid.as_str())
            && pod
                .metadata
                .resource_version
                .as_deref()
                .is_some_and(|rv| !rv.is_empty());
        usable.then(|| (*pod).clone())
    }
}

/// Upstream `syncPod` (R34-R39), plus the watch-cache read with a resourceVersion precondition.
pub(crate) async fn sync_pod(
    ctx: &SyncContext,
    cache_uid: &PodUid,
    status_uid: &PodUid,
    status: &VersionedPodStatus,
) -> SyncOutcome {
    let span = info_span!("sync_pod", pod = %format!("{}/{}", status.pod_namespace, status.pod_name), uid = %cache_uid, version = status.version);
    async move {
        let cached = match ctx.config.read_strategy {
            ReadStrategy::WatchCache => ctx.cached_api_pod(cache_uid, status_uid),
            ReadStrategy::AlwaysGet => None,
        };
        let (mut api_pod, mut from_cache) = match cached {
            Some(pod) => (pod, true),
            None => match ctx.get(status).await {
                Ok(pod) => (pod, false),
                Err(e) if e.is_not_found() => {
                    debug!("Pod does not exist on the server");
                    return SyncOutcome::NotFound;
                }
                Err(e) => {
                    info!(error = %e, "Failed to get status for pod");
                    return SyncOutcome::Failed(e);
                }
            },
        };
        loop {
            let api_uid = PodUid::new(api_pod.metadata.uid.clone().unwrap_or_default());
            let translated = ctx.shared.pods.translate_pod_uid(&api_uid);
            if !translated.is_empty() && translated != *cache_uid {
                info!(new_uid = %translated, "Pod was deleted and then recreated, skipping status update");
                ctx.shared.delete_pod_status(cache_uid);
                return SyncOutcome::Recreated;
            }
            let api_status = api_pod.status.clone().unwrap_or_default();
            let merge_ctx = MergeContext {
                pod: &api_pod,
                could_have_running_containers: ctx.safety.pod_could_have_running_containers(&api_pod),
                now: ctx.shared.clock.now(),
                gates: &ctx.shared.gates,
            };
            let merged = merge_pod_status(&api_status, &status.status, merge_ctx);
            let precondition = if from_cache { api_pod.metadata.resource_version.as_deref() } else { None };
            let pod_after = match status_patch(api_uid.as_str(), precondition, &api_status, &merged) {
                None => {
                    debug!("Status for pod is up-to-date");
                    api_pod
                }
                Some(patch) => {
                    let (ns, name) = (&status.pod_namespace, &status.pod_name);
                    match ctx.call("patch", ctx.client.patch_pod_status(ns, name, &patch)).await {
                        Ok(pod) => {
                            debug!(%patch, "Status for pod updated successfully");
                            if let Some(latency) = &ctx.shared.latency {
                                latency.record_status_updated(&pod);
                            }
                            pod
                        }
                        Err(e) if e.is_conflict() && from_cache => {
                            debug!("Watch copy was stale: falling back to GET");
                            match ctx.get(status).await {
                                Ok(pod) => {
                                    api_pod = pod;
                                    from_cache = false;
                                    continue;
                                }
                                Err(e) if e.is_not_found() => return SyncOutcome::NotFound,
                                Err(e) => return SyncOutcome::Failed(e),
                            }
                        }
                        Err(e) if e.is_not_found() => return SyncOutcome::NotFound,
                        Err(e) => {
                            info!(error = %e, "Failed to update status for pod");
                            return SyncOutcome::Failed(e);
                        }
                    }
                }
            };
            observe_sync_duration(ctx, status);
            let deletion = if can_be_deleted(&pod_after, status.pod_is_finished) {
                let uid = pod_after.metadata.uid.clone().unwrap_or_default();
                let request = ctx.client.delete_pod(&status.pod_namespace, &status.pod_name, &uid);
                match ctx.call("delete", request).await {
                    Ok(()) => {
                        info!("Pod fully terminated and removed from etcd");
                        ctx.shared.delete_pod_status(cache_uid);
                        Deletion::Deleted
                    }
                    Err(e) => {
                        info!(error = %e, "Failed to delete status for pod");
                        Deletion::Failed(e)
                    }
                }
            } else {
                Deletion::NotDue
            };
            return SyncOutcome::Synced { api_uid, version: status.version, deletion };
        }
    }
    .instrument(span)
    .await
}

fn observe_sync_duration(ctx: &SyncContext, status: &VersionedPodStatus) {
    let now = ctx.shared.clock.now();
    if let Ok(elapsed) = now.duration_since(status.at).try_into() {
        let elapsed: Duration = elapsed;
        ctx.shared
            .metrics
            .sync_duration
            .observe(elapsed.as_secs_f64());
    }
}
