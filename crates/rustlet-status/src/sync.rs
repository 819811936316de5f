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
//!
//! What a batch looks at (issue 15): upstream's batches look at every cached pod. Here a kick
//! batch looks at the pods not synced (the manager's dirty list feeds them), a full batch also
//! at the pods whose pod-manager copy changed (its change log), the finished ones and those
//! backing off; every `full_scan_every`-th full batch, or when a change log cannot answer, at
//! every pod. The outcome per pod is upstream's; the work is O(changed).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
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
use rustlet_core::{PodChanges, PodUid, VersionedPodStatus};
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::config::{ReadStrategy, RetryPolicy, StatusManagerConfig};
use crate::limiter::RateLimiter;
use crate::manager::Shared;
use crate::seams::{ClientError, PodStatusClient, UidTranslations};

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

impl BatchKind {
    fn name(self) -> &'static str {
        match self {
            Self::Kick => "kick",
            Self::Full => "full",
            Self::Retry => "retry",
        }
    }
}

/// What one pod's sync came to.
#[derive(Debug)]
pub(crate) enum SyncOutcome {
    /// The API has this version (patched, or nothing to patch).
    Synced {
        api_uid: PodUid,
        version: u64,
        /// The resourceVersion our write returned (none when nothing was written).
        written_rv: Option<String>,
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

/// One pod a batch decided to sync.
#[derive(Clone, Debug)]
pub(crate) struct Work {
    cache_uid: PodUid,
    status_uid: PodUid,
    status: VersionedPodStatus,
    /// The resourceVersion our last write to this API object returned: a watch copy older than
    /// it is stale.
    written_rv: Option<String>,
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
    /// Per API object UID: the resourceVersion our last write returned.
    written_rv: HashMap<PodUid, String>,
    /// Pods whose sync runs as a task of `run()` (cache UIDs); a batch skips them.
    in_flight: HashSet<PodUid>,
    /// In-flight pods that a batch wanted to sync again: synced once more when they complete.
    recheck: HashSet<PodUid>,
    /// Pods whose cached version was not synced, as the last whole-map plan counted them.
    pending: usize,
    /// Cache UIDs that may have a version newer than the synced one, or wait for their mirror
    /// pod: every batch looks at them. Invariant: a pod with an unsynced version is here or in
    /// the shared dirty list (issue 15: batches visit these, not every pod).
    unsynced: HashSet<PodUid>,
    /// Cache UIDs of finished pods: their deletion may become due without any change the
    /// agent hears of (the deletion-safety check), so every full batch looks at them.
    finished: HashSet<PodUid>,
    /// The pod manager's change log, as far as full batches have read it.
    pod_changes: u64,
    /// Full batches so far (every `full_scan_every`-th looks at every pod).
    full_batches: u64,
    /// A batch must look at every pod (the dirty list overflowed).
    scan_everything: bool,
    pub(crate) rng: u64,
}

/// Which cached pods a batch looks at.
enum Visit {
    Everything,
    These(HashSet<PodUid>),
}

/// Inserts or removes `uid` (no allocation when nothing changes).
fn set_member(set: &mut HashSet<PodUid>, uid: &PodUid, member: bool) {
    if member {
        if !set.contains(uid) {
            set.insert(uid.clone());
        }
    } else {
        set.remove(uid);
    }
}

/// A per-process seed, so the jitter of different agents differs (no retries in lockstep
/// after an API outage).
fn jitter_seed() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish() | 1
}

/// A watch copy whose resourceVersion is older than the one our last write returned.
/// ResourceVersions are opaque; the API server's are integers, and anything else that differs
/// from our write is not trusted.
fn is_older(copy: &str, written: &str) -> bool {
    match (copy.parse::<u64>(), written.parse::<u64>()) {
        (Ok(copy), Ok(written)) => copy < written,
        _ => copy != written,
    }
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
            written_rv: HashMap::new(),
            in_flight: HashSet::new(),
            recheck: HashSet::new(),
            pending: 0,
            unsynced: HashSet::new(),
            finished: HashSet::new(),
            pod_changes: 0,
            full_batches: 0,
            scan_everything: false,
            rng: jitter_seed(),
        }
    }

    /// The task: kicks, the periodic full batch, backoff retries; on cancellation a last flush.
    ///
    /// Each pod's sync runs as its own task (at most `max_concurrent_syncs` at once), so a slow
    /// pod holds back only itself: the next batch skips pods still in flight and syncs the
    /// others. The select is biased towards the rare branches (completions, the full batch,
    /// due retries) and takes kicks last: a timer branch is ready only when due, so kicks
    /// never starve it, and it never starves kicks. With a `kick_interval`, a kick within it of
    /// the last kick batch's start is held until the interval ends (one batch takes a burst),
    /// unless it brings a terminal phase, a finished pod or a pod being deleted.
    pub(crate) async fn run(mut self, cancel: CancellationToken) {
        let period = self.ctx.config.sync_period;
        let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut tasks = Tasks::new(self.ctx.config.max_concurrent_syncs.max(1));
        let interval = self.ctx.config.kick_interval;
        // When the last kick batch began, and when a kick held back by the interval is due.
        let mut last_kick: Option<Instant> = None;
        let mut kick_due: Option<Instant> = None;
        loop {
            let next_retry = self.next_retry();
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                Some(done) = tasks.set.join_next_with_id() => {
                    let done = tasks.finished(done);
                    self.complete(done, &mut tasks);
                }
                _ = ticker.tick() => self.dispatch(BatchKind::Full, None, &mut tasks),
                () = sleep_until_opt(next_retry) => {
                    self.dispatch(BatchKind::Retry, None, &mut tasks);
                }
                () = sleep_until_opt(kick_due) => {
                    kick_due = None;
                    last_kick = Some(Instant::now());
                    self.dispatch(BatchKind::Kick, None, &mut tasks);
                }
                Some(()) = self.kick_rx.recv() => {
                    // A terminal phase, a finished or deleted pod is not held back (its
                    // deletion waits on the write); the batch takes the held-back ones too.
                    let now = Instant::now();
                    let urgent = self.ctx.shared.take_urgent();
                    match last_kick.map(|at| at + interval).filter(|due| *due > now && !urgent) {
                        Some(due) => kick_due = Some(due),
                        None => {
                            kick_due = None;
                            last_kick = Some(now);
                            self.dispatch(BatchKind::Kick, None, &mut tasks);
                        }
                    }
                }
            }
        }
        // Planned syncs not started: the flush below syncs what they would have.
        for work in tasks.queue.drain(..) {
            self.in_flight.remove(&work.cache_uid);
        }
        let deadline = self.ctx.config.shutdown_flush_deadline;
        let flushed = tokio::time::timeout(deadline, async {
            while let Some(done) = tasks.set.join_next_with_id().await {
                if let Some((uid, outcome)) = tasks.finished(done) {
                    self.in_flight.remove(&uid);
                    self.record(uid, outcome);
                }
            }
            self.flush().await;
        })
        .await;
        match flushed {
            Ok(()) => info!("status manager stopped; unsynced statuses flushed"),
            Err(_) => warn!(
                ?deadline,
                "status manager stopped before every status was flushed"
            ),
        }
    }

    /// The earliest retry time of a pod not in flight.
    fn next_retry(&self) -> Option<Instant> {
        self.backoff
            .iter()
            .filter(|(uid, _)| !self.in_flight.contains(*uid))
            .map(|(_, b)| b.not_before)
            .min()
    }

    /// Plans a batch (or one pod, `only`) and spawns a sync task per pod.
    fn dispatch(&mut self, kind: BatchKind, only: Option<&PodUid>, tasks: &mut Tasks) {
        if only.is_none() {
            self.ctx.shared.metrics.batch(kind.name());
        }
        for work in self.plan(kind, only) {
            self.in_flight.insert(work.cache_uid.clone());
            tasks.launch(&self.ctx, work);
        }
    }

    /// A pod's sync task ended: record it, and sync it again if a batch wanted to meanwhile.
    fn complete(&mut self, done: Option<(PodUid, SyncOutcome)>, tasks: &mut Tasks) {
        // A running sync ended: a planned one takes its place.
        tasks.fill(&self.ctx);
        let Some((uid, outcome)) = done else { return };
        self.in_flight.remove(&uid);
        self.record(uid.clone(), outcome);
        if self.recheck.remove(&uid) && !self.backoff.contains_key(&uid) {
            self.dispatch(BatchKind::Kick, Some(&uid), tasks);
        }
    }

    /// Syncs every pending version, ignoring backoffs, until nothing is pending or a pass makes
    /// no progress (the count of pending pods at the start of a pass did not go down).
    async fn flush(&mut self) {
        self.backoff.clear();
        let mut before = usize::MAX;
        loop {
            let synced = self.sync_batch(BatchKind::Kick).await;
            if synced == 0 || self.pending >= before {
                return;
            }
            before = self.pending;
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

    /// Which pods this batch looks at. Upstream looks at every pod in every batch; here a
    /// batch looks at the pods that changed (the cache's dirty list, the pod manager's change
    /// log), those not synced yet, the finished ones (full batches) and those backing off, and
    /// every `full_scan_every`-th full batch at every pod.
    fn visits(
        &mut self,
        kind: BatchKind,
        only: Option<&PodUid>,
        translations: &UidTranslations,
    ) -> Visit {
        if let Some(uid) = only {
            return Visit::These(HashSet::from([uid.clone()]));
        }
        let dirty = self.ctx.shared.take_dirty();
        self.scan_everything |= dirty.overflow;
        // A removed entry may be back already (a pod recreated under its UID, its version
        // counting from 1 again): what was synced of the old one goes first.
        for uid in &dirty.removed {
            self.forget(uid, translations);
        }
        self.unsynced.extend(dirty.removed);
        self.unsynced.extend(dirty.uids);
        let mirror_to_pod = &translations.mirror_to_pod;
        let mut these: HashSet<PodUid> = match kind {
            BatchKind::Kick => self.unsynced.clone(),
            BatchKind::Retry => self.backoff.keys().cloned().collect(),
            BatchKind::Full => {
                let every = u64::from(self.ctx.config.full_scan_every.max(1));
                if self.full_batches.is_multiple_of(every) {
                    self.scan_everything = true;
                }
                self.full_batches += 1;
                match self.ctx.shared.pods.changes_since(self.pod_changes) {
                    PodChanges::All { cursor } => {
                        self.pod_changes = cursor;
                        self.scan_everything = true;
                        HashSet::new()
                    }
                    PodChanges::Since { cursor, uids } => {
                        self.pod_changes = cursor;
                        let mut these: HashSet<PodUid> = uids
                            .into_iter()
                            .map(|uid| mirror_to_pod.get(&uid).cloned().unwrap_or(uid))
                            .collect();
                        these.extend(self.unsynced.iter().cloned());
                        these.extend(self.finished.iter().cloned());
                        these.extend(self.backoff.keys().cloned());
                        these
                    }
                }
            }
        };
        if self.scan_everything && kind != BatchKind::Retry {
            self.scan_everything = false;
            return Visit::Everything;
        }
        // A Retry batch only looks at its pods; a scan waits for the next batch of another kind.
        these.shrink_to_fit();
        Visit::These(these)
    }

    /// What the sync task knew of a pod whose cache entry went (and of its mirror pod's API
    /// object, for a static pod).
    fn forget(&mut self, uid: &PodUid, translations: &UidTranslations) {
        self.unsynced.remove(uid);
        self.finished.remove(uid);
        self.reconciled.remove(uid);
        self.forget_synced(uid);
        if let Some(mirror) = translations.pod_to_mirror.get(uid) {
            self.forget_synced(mirror);
        }
    }

    /// Which pods a batch syncs (upstream `syncBatch`'s selection); `only` restricts it to one
    /// pod. Pods in flight are skipped (and synced again when they complete, if still due).
    /// A retry time that has passed without its pod being synced is dropped: the pod is gone,
    /// has nothing to sync, or waits for its mirror, and a stale deadline would wake the task
    /// again at once, forever.
    fn plan(&mut self, kind: BatchKind, only: Option<&PodUid>) -> Vec<Work> {
        let translations = self.ctx.shared.pods.uid_translations();
        let now = Instant::now();
        let shared = self.ctx.shared.clone();
        let mut work = Vec::new();
        let visit = self.visits(kind, only, &translations);
        let map = shared.read();
        let entries: Box<dyn Iterator<Item = (&PodUid, &VersionedPodStatus)>> = match &visit {
            Visit::Everything => {
                if kind == BatchKind::Full {
                    self.api_status_versions.retain(|uid, _| {
                        map.contains_key(uid) || translations.mirror_to_pod.contains_key(uid)
                    });
                    self.written_rv.retain(|uid, _| {
                        map.contains_key(uid) || translations.mirror_to_pod.contains_key(uid)
                    });
                    // The memo only needs pruning once it holds entries for pods that are gone.
                    if self.reconciled.len() > map.len() {
                        self.reconciled.retain(|uid, _| map.contains_key(uid));
                    }
                }
                // Rebuilt from the pods seen below.
                self.unsynced.clear();
                self.finished.clear();
                Box::new(map.iter().map(|(uid, v)| (uid, &**v)))
            }
            Visit::These(uids) => {
                for uid in uids.iter().filter(|uid| !map.contains_key(*uid)) {
                    self.forget(uid, &translations);
                }
                Box::new(
                    uids.iter()
                        .filter_map(|uid| map.get_key_value(uid).map(|(uid, v)| (uid, &**v))),
                )
            }
        };
        let mut pending = 0i64;
        // A scan starts from empty sets: only insertions (no hashing for the others).
        let rebuilding = matches!(visit, Visit::Everything);
        let mark = |set: &mut HashSet<PodUid>, uid: &PodUid, member: bool| {
            if !rebuilding || member {
                set_member(set, uid, member);
            }
        };
        for (uid, status) in entries {
            let status_uid = match translations.pod_to_mirror.get(uid) {
                Some(mirror) if mirror.is_empty() => {
                    // Static pod without mirror (R29): looked at again until it has one.
                    mark(&mut self.unsynced, uid, true);
                    continue;
                }
                Some(mirror) => mirror,
                None if status.static_pod => {
                    // Deviation: the pod manager no longer knows this static pod (its manifest
                    // went), so it has no mirror to write to; its mirror is being deleted.
                    // Upstream's syncBatch falls back to the static pod's own UID and reads
                    // the mirror by name, which the Node authorizer refuses (403) once the
                    // mirror is gone.
                    continue;
                }
                None => uid,
            };
            mark(&mut self.finished, uid, status.pod_is_finished);
            let recorded = self.api_status_versions.get(status_uid).copied();
            let synced = recorded.unwrap_or(0);
            if synced < status.version {
                pending += 1;
            }
            mark(&mut self.unsynced, uid, synced < status.version);
            if self.in_flight.contains(uid) {
                if synced < status.version || kind != BatchKind::Kick {
                    self.recheck.insert(uid.clone());
                }
                continue;
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
                        mark(&mut self.unsynced, uid, true);
                        true
                    } else {
                        false
                    }
                }
            };
            if due {
                work.push(Work {
                    cache_uid: uid.clone(),
                    status_uid: status_uid.clone(),
                    status: status.clone(),
                    written_rv: self.written_rv.get(status_uid).cloned(),
                });
            }
        }
        if only.is_none() {
            // Every pod with an unsynced version was looked at, except by a Retry batch.
            if kind != BatchKind::Retry {
                shared.metrics.pods_pending_sync.set(pending);
                self.pending = usize::try_from(pending).unwrap_or_default();
            }
            if !self.backoff.is_empty() {
                let dispatched: HashSet<&PodUid> = work.iter().map(|w| &w.cache_uid).collect();
                let in_flight = &self.in_flight;
                self.backoff.retain(|uid, b| {
                    b.not_before > now || dispatched.contains(uid) || in_flight.contains(uid)
                });
            }
        }
        work
    }

    /// One batch, synced to the end (upstream `syncBatch`; `ManualSync` and the shutdown
    /// flush); returns how many pods it synced.
    pub(crate) async fn sync_batch(&mut self, kind: BatchKind) -> usize {
        self.ctx.shared.metrics.batch(kind.name());
        let work = self.plan(kind, None);
        let count = work.len();
        let concurrency = self.ctx.config.max_concurrent_syncs.max(1);
        let ctx = self.ctx.clone();
        let results: Vec<(PodUid, SyncOutcome)> = futures::stream::iter(work)
            .map(|work| {
                let ctx = ctx.clone();
                async move {
                    let outcome = sync_pod(&ctx, &work).await;
                    (work.cache_uid, outcome)
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

    fn forget_synced(&mut self, api_uid: &PodUid) {
        self.api_status_versions.remove(api_uid);
        self.written_rv.remove(api_uid);
    }

    fn record(&mut self, uid: PodUid, outcome: SyncOutcome) {
        match outcome {
            SyncOutcome::Synced {
                api_uid,
                version,
                written_rv,
                deletion,
            } => {
                self.api_status_versions.insert(api_uid.clone(), version);
                if let Some(rv) = written_rv {
                    self.written_rv.insert(api_uid.clone(), rv);
                }
                self.ctx.shared.mark_synced(&uid, version);
                // A deleted pod's status is dropped (`delete_pod_status`); the dirty list's
                // removal makes the next batch forget what was synced of it, so a pod back
                // under the same UID (a manifest restored with its own UID) is synced at once.
                match deletion {
                    Deletion::Failed(e) if e.is_not_found() => {
                        // The pod is already gone: the deletion is done.
                        self.ctx.shared.delete_pod_status(&uid);
                        self.backoff.remove(&uid);
                    }
                    Deletion::Failed(e) => self.schedule_retry(uid, &e),
                    Deletion::Deleted => {
                        self.backoff.remove(&uid);
                    }
                    Deletion::NotDue => {
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

    /// After a failure: upstream leaves the pod to the next batch; otherwise exponential
    /// backoff with ±20 % jitter, initial × 2^attempt, capped.
    fn schedule_retry(&mut self, uid: PodUid, reason: &dyn std::fmt::Display) {
        let config = match self.ctx.config.retry {
            RetryPolicy::NextBatch => {
                debug!(%uid, %reason, "pod status sync failed; the next batch retries it");
                return;
            }
            RetryPolicy::Backoff(config) => config,
        };
        let jitter = 0.8 + 0.4 * (self.next_random() % 1000) as f64 / 1000.0;
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

/// The sync tasks of `run()`, with the pod each one syncs (a task that panicked still frees
/// its pod).
#[derive(Default)]
/// The running syncs (at most `limit`) and the planned ones waiting for a place: a plan waits
/// (~1 KB), not a started task (~5 KB: a storm planned 1,000 at once).
struct Tasks {
    set: JoinSet<SyncOutcome>,
    uids: HashMap<tokio::task::Id, PodUid>,
    queue: VecDeque<Work>,
    limit: usize,
}

impl Tasks {
    fn new(limit: usize) -> Self {
        Self {
            set: JoinSet::new(),
            uids: HashMap::new(),
            queue: VecDeque::new(),
            limit,
        }
    }

    /// Starts `work` now if fewer than `limit` syncs run, else queues it (in plan order).
    fn launch(&mut self, ctx: &Arc<SyncContext>, work: Work) {
        if self.set.len() >= self.limit {
            self.queue.push_back(work);
        } else {
            self.spawn(ctx, work);
        }
    }

    /// Starts queued work while there is room. Queued work writes the pod's status as it is
    /// when its sync starts, not as it was when planned: in a storm, a pod that waited in the
    /// queue while it started would otherwise be written twice (its planned status, then,
    /// rechecked, the newer one), the second write waiting for the watch to deliver the first.
    /// Versions in between are skipped, as they are when changes come between two batches.
    fn fill(&mut self, ctx: &Arc<SyncContext>) {
        while self.set.len() < self.limit {
            let Some(mut work) = self.queue.pop_front() else {
                return;
            };
            if let Some(latest) = ctx.shared.read().get(&work.cache_uid)
                && latest.version > work.status.version
            {
                work.status = (**latest).clone();
            }
            self.spawn(ctx, work);
        }
    }

    fn spawn(&mut self, ctx: &Arc<SyncContext>, work: Work) {
        let ctx = ctx.clone();
        let uid = work.cache_uid.clone();
        let handle = self.set.spawn(async move { sync_pod(&ctx, &work).await });
        self.uids.insert(handle.id(), uid);
    }

    fn finished(
        &mut self,
        done: Result<(tokio::task::Id, SyncOutcome), JoinError>,
    ) -> Option<(PodUid, SyncOutcome)> {
        match done {
            Ok((id, outcome)) => Some((self.uids.remove(&id)?, outcome)),
            Err(e) => {
                let uid = self.uids.remove(&e.id())?;
                warn!(%uid, error = %e, "a pod status sync task ended abnormally");
                Some((
                    uid,
                    SyncOutcome::Failed(ClientError::Transport(e.to_string())),
                ))
            }
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl SyncContext {
    /// One API call: a rate-limit token, then the request under the configured deadline (a
    /// half-open connection must not stall the pod's sync forever).
    async fn call<T>(
        &self,
        verb: &str,
        request: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        self.limiter.acquire().await;
        let deadline = self.config.request_timeout;
        let result = match tokio::time::timeout(deadline, request).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::Transport(format!(
                "{verb} timed out after {deadline:?}"
            ))),
        };
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

    /// The pod manager's watch-fed copy of the API pod, when it is the object we write to and
    /// is not older than our last write to it; [`WatchCopy::Gone`] when the watch no longer
    /// has the pod (or the static pod's mirror): it was deleted from the API server.
    fn cached_api_pod(&self, work: &Work) -> WatchCopy {
        let pods = &self.shared.pods;
        let Some(mut pod) = pods.pod_by_uid(&work.cache_uid) else {
            return WatchCopy::Gone;
        };
        if is_static_pod(&pod) {
            let Some(mirror) = pods.mirror_pod_of(&pod) else {
                return WatchCopy::Gone;
            };
            pod = mirror;
        }
        let rv = pod.metadata.resource_version.as_deref().unwrap_or_default();
        if pod.metadata.uid.as_deref() != Some(work.status_uid.as_str()) || rv.is_empty() {
            debug!(
                copy = rv,
                "watch copy is not the object we write to: reading the pod"
            );
            return WatchCopy::Stale;
        }
        if work
            .written_rv
            .as_deref()
            .is_some_and(|written| is_older(rv, written))
        {
            return WatchCopy::Behind;
        }
        WatchCopy::Usable(pod)
    }

    /// The watch copy once the watch has delivered our last write, polled every
    /// [`WATCH_POLL`] for at most the configured allowance; [`WatchCopy::Stale`] past it.
    ///
    /// Reading the pod by name instead (upstream's shape) races its deletion: the watch is
    /// milliseconds behind, and a GET of a pod deleted in between is refused by the Node
    /// authorizer (403 `no relationship found`), not answered 404.
    async fn caught_up_api_pod(&self, work: &Work) -> WatchCopy {
        let deadline = Instant::now() + self.config.watch_lag_allowance;
        loop {
            match self.cached_api_pod(work) {
                WatchCopy::Behind if Instant::now() < deadline => {
                    tokio::time::sleep(WATCH_POLL.min(deadline - Instant::now())).await;
                }
                WatchCopy::Behind => {
                    debug!(written = ?work.written_rv, allowance = ?self.config.watch_lag_allowance, "watch copy still older than our last write: reading the pod");
                    return WatchCopy::Stale;
                }
                copy => return copy,
            }
        }
    }
}

/// How often a sync looks again at a watch copy older than our last write.
const WATCH_POLL: Duration = Duration::from_millis(10);

/// What the pod manager's watch has of the API pod a sync writes to.
enum WatchCopy {
    /// A copy to merge into and to patch with its resourceVersion as precondition: the pod
    /// manager's own, shared (only read: the merge and the patch are new values).
    Usable(Arc<Pod>),
    /// A copy older than our last write: the watch has not delivered it yet.
    Behind,
    /// Not the object we write to, or still behind past the allowance: read the pod.
    Stale,
    /// No copy: the watch saw the pod deleted (or never had it).
    Gone,
}

/// Upstream `syncPod` (R34-R39), plus the watch-cache read with a resourceVersion precondition.
pub(crate) async fn sync_pod(ctx: &SyncContext, work: &Work) -> SyncOutcome {
    let Work {
        cache_uid, status, ..
    } = work;
    let span = info_span!("sync_pod", pod = %format!("{}/{}", status.pod_namespace, status.pod_name), uid = %cache_uid, version = status.version);
    async move {
        let cached = match ctx.config.read_strategy {
            ReadStrategy::WatchCache => match ctx.caught_up_api_pod(work).await {
                WatchCopy::Usable(pod) => Some(pod),
                WatchCopy::Stale | WatchCopy::Behind => None,
                WatchCopy::Gone => {
                    // Deviation: upstream's syncPod GETs the pod by name all the same, which
                    // the Node authorizer refuses (403 `no relationship found`) once the pod is
                    // gone from its graph; nothing can be written to a deleted pod (the patch
                    // carries its UID), and RemoveOrphanedStatuses drops the entry.
                    debug!("Pod is not in the pod manager: deleted from the server");
                    return SyncOutcome::NotFound;
                }
            },
            ReadStrategy::AlwaysGet => None,
        };
        let (mut api_pod, mut from_cache) = match cached {
            Some(pod) => (pod, true),
            None => match ctx.get(status).await {
                Ok(pod) => (Arc::new(pod), false),
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
        // A 422 on `metadata.uid` means the pod was replaced between our read and our write:
        // read it once more, and R35 decides.
        let mut reread_for_uid = false;
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
            let (pod_after, written_rv) = match status_patch(api_uid.as_str(), precondition, &api_status, &merged) {
                None => {
                    debug!("Status for pod is up-to-date");
                    (api_pod, None)
                }
                Some(patch) => {
                    let (ns, name) = (&status.pod_namespace, &status.pod_name);
                    let reread = match ctx.call("patch", ctx.client.patch_pod_status(ns, name, &patch)).await {
                        Ok(pod) => {
                            debug!(%patch, "Status for pod updated successfully");
                            if let Some(latency) = &ctx.shared.latency {
                                latency.record_status_updated(&pod);
                            }
                            let rv = pod.metadata.resource_version.clone();
                            Ok((Arc::new(pod), rv))
                        }
                        Err(e) if e.is_conflict() && from_cache => {
                            debug!("Watch copy was stale: falling back to GET");
                            Err(())
                        }
                        Err(e) if e.is_uid_mismatch() && !reread_for_uid => {
                            debug!(error = %e, "Pod UID changed under the patch: reading it again");
                            reread_for_uid = true;
                            Err(())
                        }
                        Err(e) if e.is_not_found() => return SyncOutcome::NotFound,
                        Err(e) => {
                            info!(error = %e, "Failed to update status for pod");
                            return SyncOutcome::Failed(e);
                        }
                    };
                    match reread {
                        Ok(done) => done,
                        Err(()) => match ctx.get(status).await {
                            Ok(pod) => {
                                api_pod = Arc::new(pod);
                                from_cache = false;
                                continue;
                            }
                            Err(e) if e.is_not_found() => return SyncOutcome::NotFound,
                            Err(e) => return SyncOutcome::Failed(e),
                        },
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
            return SyncOutcome::Synced { api_uid, version: status.version, written_rv, deletion };
        }
    }
    .instrument(span)
    .await
}

/// R59, from the first update not yet synced (R61, reset per synced version).
fn observe_sync_duration(ctx: &SyncContext, status: &VersionedPodStatus) {
    let Some(at) = status.at else { return };
    let now = ctx.shared.clock.now();
    if let Ok(elapsed) = now.duration_since(at).try_into() {
        let elapsed: Duration = elapsed;
        ctx.shared
            .metrics
            .sync_duration
            .observe(elapsed.as_secs_f64());
    }
}
