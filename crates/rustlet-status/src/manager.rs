//! `StatusManager`: the cache of pod statuses and its public mutators (upstream `manager`'s
//! `SetPodStatus`, `SetContainerReadiness`, `SetContainerStartup`, `TerminatePod`,
//! `GetPodStatus`, `RemoveOrphanedStatuses`, `Start`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use rustlet_core::deletion::PodDeletionSafety;
use rustlet_core::probe::{ProbeOutcome, with_container_readiness, with_container_startup};
use rustlet_core::terminate::terminate_status;
use rustlet_core::transition::TransitionError;
use rustlet_core::update::{
    ContainerKind, UpdateContext, UpdateOutcome, UpdateSource, prepare_update,
};
use rustlet_core::{FeatureGates, PodPhase, PodUid, VersionedPodStatus};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::StatusManagerConfig;
use crate::metrics::StatusMetrics;
use crate::resize::{RESIZE_DEFERRED, RESIZE_INFEASIBLE, ResizeState};
use crate::seams::{Clock, PodManager, PodStatusClient, StartupLatencyHook, SystemClock};
use crate::sync::Syncer;

/// What the manager is built from.
pub struct StatusManagerDeps {
    /// The API client; `None` runs the manager standalone: statuses are cached and served but
    /// never synced (upstream: nil kubeClient).
    pub client: Option<Arc<dyn PodStatusClient>>,
    /// The pod manager view.
    pub pods: Arc<dyn PodManager>,
    /// Whether a pod's containers could still run.
    pub safety: Arc<dyn PodDeletionSafety>,
    /// Optional startup-latency tracking.
    pub latency: Option<Arc<dyn StartupLatencyHook>>,
    /// Wall clock for the timestamps the rules write.
    pub clock: Arc<dyn Clock>,
    /// Metrics to update (register them where you like).
    pub metrics: StatusMetrics,
}

impl StatusManagerDeps {
    /// Dependencies with the system clock, fresh metrics and no latency hook.
    pub fn new(
        client: Option<Arc<dyn PodStatusClient>>,
        pods: Arc<dyn PodManager>,
        safety: Arc<dyn PodDeletionSafety>,
    ) -> Self {
        Self {
            client,
            pods,
            safety,
            latency: None,
            clock: Arc::new(SystemClock),
            metrics: StatusMetrics::default(),
        }
    }
}

/// The result of one mutator call.
#[derive(Clone, Debug, PartialEq)]
pub enum UpdateResult {
    /// Stored as this version; the sync task was kicked.
    Stored(u64),
    /// Equal to the cached status (R11) or not a change: nothing stored.
    Unchanged,
    /// Refused: a container left the terminated state (R6).
    Rejected(TransitionError),
    /// The pod or container is unknown, or no status is cached yet (R15).
    Ignored,
}

/// State shared by the mutators and the sync task.
pub(crate) struct Shared {
    /// Cached statuses by source pod UID (the static pod's UID for static pods). Guarded by a
    /// lock held only for map work, never across an await. Boxed (issue 29): an entry
    /// is 720 bytes inline, and a table at most 7/8 full that doubles as it grows held 1,000
    /// statuses in 2,048 slots (1.5 MB, and the old table beside it while it grew).
    pub(crate) statuses: RwLock<HashMap<PodUid, Box<VersionedPodStatus>>>,
    /// Capacity-1 "something changed" signal: bursts coalesce into one pending kick.
    kick: mpsc::Sender<()>,
    /// Set before a kick for a change that must not wait for the sync task's `kick_interval`:
    /// a terminal phase, a finished pod, a pod being deleted (the deletion waits on it).
    urgent: AtomicBool,
    pub(crate) pods: Arc<dyn PodManager>,
    pub(crate) latency: Option<Arc<dyn StartupLatencyHook>>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) gates: FeatureGates,
    pub(crate) metrics: StatusMetrics,
    /// In-place resize conditions (R48-R54).
    pub(crate) resize: Mutex<ResizeState>,
    /// Entries changed since the sync task last looked: its batches visit these, not every
    /// pod (issue 15).
    dirty: Mutex<Dirty>,
    /// Bumped whenever an entry may have been added (a status for a new UID, a resize
    /// condition): [`StatusManager::additions`].
    additions: AtomicU64,
}

/// Cache UIDs whose entry changed or went since the sync task last took them. Bounded: past
/// [`Dirty::LIMIT`] it only says that anything may have changed.
#[derive(Debug, Default)]
pub(crate) struct Dirty {
    /// Entries stored (a set: a pod updated again before the task looked costs a lookup, no
    /// allocation).
    pub(crate) uids: HashSet<PodUid>,
    /// Entries removed (and possibly stored again since, as a new pod under the same UID:
    /// what was synced of the old one must be forgotten first).
    pub(crate) removed: Vec<PodUid>,
    pub(crate) overflow: bool,
}

impl Dirty {
    /// Changes kept between two looks of the sync task (a kick follows every change, so this
    /// is only reached when the task is not running).
    const LIMIT: usize = 65_536;
}

impl Shared {
    pub(crate) fn resize(&self) -> std::sync::MutexGuard<'_, ResizeState> {
        self.resize.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The resize state, to change (it may gain an entry).
    fn resize_mut(&self) -> std::sync::MutexGuard<'_, ResizeState> {
        self.added();
        self.resize()
    }

    fn added(&self) {
        self.additions.fetch_add(1, Ordering::Release);
    }

    /// Whether a change that must not wait for the kick interval came since the last call.
    pub(crate) fn take_urgent(&self) -> bool {
        self.urgent.swap(false, Ordering::AcqRel)
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, HashMap<PodUid, Box<VersionedPodStatus>>> {
        self.statuses.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, HashMap<PodUid, Box<VersionedPodStatus>>> {
        self.statuses.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The entry of `uid` was stored (or removed): the sync task's next batch looks at it.
    fn mark_dirty(&self, uid: &str, removed: bool) {
        let mut dirty = self.dirty.lock().unwrap_or_else(|e| e.into_inner());
        if dirty.overflow {
            return;
        }
        if dirty.uids.len() + dirty.removed.len() >= Dirty::LIMIT {
            *dirty = Dirty {
                overflow: true,
                ..Dirty::default()
            };
            return;
        }
        if removed {
            dirty.removed.push(PodUid::new(uid));
        } else if !dirty.uids.contains(uid) {
            dirty.uids.insert(PodUid::new(uid));
        }
    }

    /// What changed since the last call.
    pub(crate) fn take_dirty(&self) -> Dirty {
        std::mem::take(&mut *self.dirty.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The sync task has written `version` of this pod: the next update starts the sync
    /// duration clock again (R61).
    pub(crate) fn mark_synced(&self, uid: &PodUid, version: u64) {
        if let Some(entry) = self.write().get_mut(uid)
            && entry.version == version
        {
            entry.at = None;
        }
    }

    /// Upstream `deletePodStatus` (R26).
    pub(crate) fn delete_pod_status(&self, uid: &PodUid) {
        self.write().remove(uid);
        self.mark_dirty(uid.as_str(), true);
        self.resize().remove(uid);
        if let Some(latency) = &self.latency {
            latency.delete_pod_startup_state(uid);
        }
    }
}

/// The status manager. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct StatusManager {
    shared: Arc<Shared>,
    syncer: Mutex<Option<Syncer>>,
}

impl StatusManager {
    /// A manager with an empty cache; call [`Self::start`] to sync.
    pub fn new(deps: StatusManagerDeps, config: StatusManagerConfig) -> Self {
        let (kick, kick_rx) = mpsc::channel(1);
        let shared = Arc::new(Shared {
            statuses: RwLock::new(HashMap::new()),
            kick,
            urgent: AtomicBool::new(false),
            pods: deps.pods,
            latency: deps.latency,
            clock: deps.clock,
            gates: config.gates.clone(),
            dirty: Mutex::new(Dirty::default()),
            additions: AtomicU64::new(0),
            resize: Mutex::new(ResizeState::new(
                deps.metrics.pending_resizes.clone(),
                deps.metrics.in_progress_resizes.clone(),
            )),
            metrics: deps.metrics,
        });
        let syncer = deps
            .client
            .map(|client| Syncer::new(shared.clone(), client, deps.safety, kick_rx, config));
        Self {
            shared,
            syncer: Mutex::new(syncer),
        }
    }

    /// Spawns the single sync task (upstream `Start`); it stops when `cancel` fires, after
    /// flushing unsynced statuses for at most the configured deadline. Returns `None` when the
    /// manager has no client (standalone) or was already started.
    pub fn start(&self, cancel: CancellationToken) -> Option<JoinHandle<()>> {
        let syncer = self.syncer.lock().unwrap_or_else(|e| e.into_inner()).take();
        match syncer {
            Some(syncer) => Some(tokio::spawn(syncer.run(cancel))),
            None => {
                info!("no API client or already started: not starting the status sync task");
                None
            }
        }
    }

    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn take_syncer(&self) -> Syncer {
        self.syncer.lock().unwrap().take().expect("syncer")
    }

    /// The cached status of a pod; a mirror pod's UID is translated to its static pod's.
    pub fn get_pod_status(&self, uid: &PodUid) -> Option<PodStatus> {
        self.with_pod_status(uid, |status| status.cloned())
    }

    /// [`Self::get_pod_status`] lent instead of copied: `f` sees the cached status (`None`
    /// when there is none) under the cache's read lock, so it must be short (serializing one
    /// status is; waiting on anything is not). For readers of many pods at once, such as a
    /// `/pods` listing, that would otherwise copy every status.
    pub fn with_pod_status<R>(&self, uid: &PodUid, f: impl FnOnce(Option<&PodStatus>) -> R) -> R {
        let uid = self.shared.pods.translate_pod_uid(uid);
        let map = self.shared.read();
        f(map.get(&uid).map(|v| &v.status))
    }

    /// The cached entry of a pod (version, finished mark, status), by source UID.
    pub fn get_versioned_status(&self, uid: &PodUid) -> Option<VersionedPodStatus> {
        self.shared
            .read()
            .get(uid)
            .map(|v| VersionedPodStatus::clone(v))
    }

    /// Number of cached statuses.
    pub fn len(&self) -> usize {
        self.shared.read().len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn update(&self, pod: &Pod, status: PodStatus, source: UpdateSource) -> UpdateResult {
        let mut map = self.shared.write();
        self.store(&mut map, pod, status, source)
    }

    /// Runs R2-R12 and stores the result, all under the caller's write lock (R55).
    fn store(
        &self,
        map: &mut HashMap<PodUid, Box<VersionedPodStatus>>,
        pod: &Pod,
        status: PodStatus,
        source: UpdateSource,
    ) -> UpdateResult {
        // Borrowed: the accepted path allocates no key for a pod already cached.
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        // One lookup: the entry is read here and replaced in place below.
        let slot = map.get_mut(uid);
        let cached = slot.as_deref().map(|v| &**v);
        let mirror_status = match cached {
            Some(_) => None,
            None => self
                .shared
                .pods
                .mirror_pod_of(pod)
                .and_then(|m| m.status.clone()),
        };
        let ctx = UpdateContext {
            cached,
            mirror_status: mirror_status.as_ref(),
            now: self.shared.clock.now(),
            gates: &self.shared.gates,
        };
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        match prepare_update(pod, status, source, ctx) {
            UpdateOutcome::Accepted(accepted) => {
                if let Some((kept, attempted)) = &accepted.phase_regression_prevented {
                    error!(pod = name, %uid, kept, attempted, "Pod attempted illegal phase transition");
                }
                if accepted.finished_was_sticky {
                    info!(pod = name, %uid, "Got unexpected podIsFinished=false, while podIsFinished=true in status cache, programmer error.");
                }
                for t in &accepted.newly_terminated {
                    let kind = match t.kind {
                        ContainerKind::Init => "init_container",
                        ContainerKind::Regular => "container",
                        ContainerKind::Ephemeral => "ephemeral_container",
                    };
                    self.shared
                        .metrics
                        .terminated_containers
                        .get_or_create(&vec![
                            ("container_type".into(), kind.into()),
                            ("exit_code".into(), t.exit_code.to_string()),
                            ("reason".into(), t.reason.clone()),
                        ])
                        .inc();
                }
                let version = accepted.entry.version;
                let urgent = accepted.entry.pod_is_finished
                    || PodPhase::of(&accepted.entry.status).is_terminal()
                    || pod.metadata.deletion_timestamp.is_some();
                self.shared.mark_dirty(uid, false);
                match slot {
                    // In place: the accepted path allocates no entry.
                    Some(slot) => **slot = accepted.entry,
                    None => {
                        map.insert(PodUid::new(uid), Box::new(accepted.entry));
                        self.shared.added();
                    }
                }
                // Before the kick, so that the task taking it sees the flag.
                if urgent {
                    self.shared.urgent.store(true, Ordering::Release);
                }
                // Never blocks: a pending kick already covers this change.
                let _ = self.shared.kick.try_send(());
                UpdateResult::Stored(version)
            }
            UpdateOutcome::Unchanged => {
                debug!(pod = name, %uid, "Ignoring same status for pod");
                UpdateResult::Unchanged
            }
            UpdateOutcome::Rejected(err) => {
                error!(pod = name, %uid, error = %err, "Status update on pod aborted");
                UpdateResult::Rejected(err)
            }
        }
    }

    /// Caches a fully generated status for `pod` (R1-R12); forced when the pod is being deleted.
    ///
    /// A standalone manager (no client: statuses are cached, never synced) over a pod manager
    /// that knows no pods:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use k8s_openapi::api::core::v1::{Pod, PodStatus};
    /// use rustlet_core::{PodUid, deletion::FixedDeletionSafety};
    /// use rustlet_status::{
    ///     PodManager, StatusManager, StatusManagerConfig, StatusManagerDeps, UidTranslations,
    ///     UpdateResult,
    /// };
    ///
    /// struct NoPods;
    /// impl PodManager for NoPods {
    ///     fn pod_by_uid(&self, _: &PodUid) -> Option<Arc<Pod>> { None }
    ///     fn mirror_pod_of(&self, _: &Pod) -> Option<Arc<Pod>> { None }
    ///     fn translate_pod_uid(&self, uid: &PodUid) -> PodUid { uid.clone() }
    ///     fn uid_translations(&self) -> UidTranslations { UidTranslations::default() }
    /// }
    ///
    /// let deps = StatusManagerDeps::new(None, Arc::new(NoPods), Arc::new(FixedDeletionSafety::default()));
    /// let manager = StatusManager::new(deps, StatusManagerConfig::default());
    /// let mut pod = Pod::default();
    /// pod.metadata.uid = Some("uid-1".into());
    /// let running = PodStatus { phase: Some("Running".into()), ..PodStatus::default() };
    /// assert_eq!(manager.set_pod_status(&pod, running.clone()), UpdateResult::Stored(1));
    /// assert_eq!(manager.set_pod_status(&pod, running), UpdateResult::Unchanged);
    /// let cached = manager.get_pod_status(&PodUid::new("uid-1")).unwrap();
    /// assert_eq!(cached.phase.as_deref(), Some("Running"));
    /// ```
    pub fn set_pod_status(&self, pod: &Pod, status: PodStatus) -> UpdateResult {
        self.update(pod, status, UpdateSource::SetPodStatus)
    }

    fn probe(
        &self,
        pod_uid: &PodUid,
        change: impl FnOnce(&Pod, &PodStatus) -> ProbeOutcome,
    ) -> UpdateResult {
        let Some(pod) = self.shared.pods.pod_by_uid(pod_uid) else {
            debug!(%pod_uid, "Pod not found in the pod manager: ignoring probe result");
            return UpdateResult::Ignored;
        };
        let mut map = self.shared.write();
        let Some(cached) = map.get(pod_uid).map(|v| v.status.clone()) else {
            warn!(%pod_uid, "Container readiness changed before pod has synced");
            return UpdateResult::Ignored;
        };
        match change(&pod, &cached) {
            ProbeOutcome::Changed(status) => {
                self.store(&mut map, &pod, *status, UpdateSource::ContainerProbe)
            }
            ProbeOutcome::Unchanged => UpdateResult::Unchanged,
            ProbeOutcome::ContainerNotFound => {
                warn!(%pod_uid, "Container not found in pod status");
                UpdateResult::Ignored
            }
        }
    }

    /// Sets one container's `ready` and regenerates Ready and ContainersReady (R15-R17).
    pub fn set_container_readiness(
        &self,
        pod_uid: &PodUid,
        container_id: &str,
        ready: bool,
    ) -> UpdateResult {
        let gates = self.shared.gates.clone();
        self.probe(pod_uid, |pod, cached| {
            with_container_readiness(pod, cached, container_id, ready, &gates)
        })
    }

    /// Sets one container's `started` (R18).
    pub fn set_container_startup(
        &self,
        pod_uid: &PodUid,
        container_id: &str,
        started: bool,
    ) -> UpdateResult {
        self.probe(pod_uid, |_, cached| {
            with_container_startup(cached, container_id, started)
        })
    }

    /// The final status of a pod whose containers are gone (R19-R24): forced, finished.
    pub fn terminate_pod(&self, pod: &Pod) -> UpdateResult {
        let mut map = self.shared.write();
        let status = terminate_status(pod, map.get(&PodUid::of(pod)).map(|v| &v.status));
        self.store(&mut map, pod, status, UpdateSource::TerminatePod)
    }

    /// Drops every cached status whose UID is not in `keep` (R25). The sync task forgets what
    /// it synced of them in its next batch.
    pub fn remove_orphaned_statuses(&self, keep: &HashSet<PodUid>) {
        self.retain_statuses(|uid| keep.contains(uid));
    }

    /// [`Self::remove_orphaned_statuses`] with the UIDs to keep as a predicate (the pod workers
    /// ask their borrowed view of the pod source every housekeeping period, rather than copying
    /// every UID into a set).
    pub fn retain_statuses(&self, keep: impl Fn(&PodUid) -> bool) {
        self.shared.write().retain(|uid, _| {
            let kept = keep(uid);
            if !kept {
                debug!(%uid, "Removing pod from status map.");
                self.shared.mark_dirty(uid.as_str(), true);
            }
            kept
        });
        self.shared.resize().retain(|uid| keep(uid));
    }

    /// Moves whenever an entry may have been added to the cache (a status for a UID it did not
    /// hold, a resize condition): a [`Self::retain_statuses`] with an unchanged predicate has
    /// nothing to remove until it does. Read it before the retain that it is compared with.
    pub fn additions(&self) -> u64 {
        self.shared.additions.load(Ordering::Acquire)
    }

    /// The cached resize conditions of a pod: Pending first, then InProgress (R52).
    pub fn get_pod_resize_conditions(&self, uid: &PodUid) -> Vec<PodCondition> {
        self.shared.resize().get(uid)
    }

    /// Sets or refreshes `PodResizePending` (R49); reasons other than `Infeasible` become
    /// `Deferred`. True when it is new or its reason or generation changed.
    pub fn set_pod_resize_pending_condition(
        &self,
        uid: &PodUid,
        reason: &str,
        message: &str,
        observed_generation: i64,
    ) -> bool {
        let now = self.shared.clock.now();
        self.shared
            .resize_mut()
            .set_pending(uid, reason, message, observed_generation, now)
    }

    /// Sets or refreshes `PodResizeInProgress` (R50); returns the effective generation and
    /// whether anything but the times changed.
    pub fn set_pod_resize_in_progress_condition(
        &self,
        uid: &PodUid,
        reason: &str,
        message: &str,
        observed_generation: i64,
    ) -> (i64, bool) {
        let now = self.shared.clock.now();
        self.shared
            .resize_mut()
            .set_in_progress(uid, reason, message, observed_generation, now)
    }

    /// Removes `PodResizePending` (R51).
    pub fn clear_pod_resize_pending_condition(&self, uid: &PodUid) {
        self.shared.resize().clear_pending(uid);
    }

    /// Removes `PodResizeInProgress` (R51): its generation and true, or (0, false).
    pub fn clear_pod_resize_in_progress_condition(&self, uid: &PodUid) -> (i64, bool) {
        self.shared.resize().clear_in_progress(uid)
    }

    /// A pending resize with reason `Deferred`.
    pub fn is_pod_resize_deferred(&self, uid: &PodUid) -> bool {
        self.shared.resize().pending_reason(uid).as_deref() == Some(RESIZE_DEFERRED)
    }

    /// A pending resize with reason `Infeasible`.
    pub fn is_pod_resize_infeasible(&self, uid: &PodUid) -> bool {
        self.shared.resize().pending_reason(uid).as_deref() == Some(RESIZE_INFEASIBLE)
    }

    /// Rebuilds the resize conditions from the API pods after a restart (R53).
    pub fn backfill_pod_resize_conditions(&self, pods: &[Pod]) {
        let now = self.shared.clock.now();
        self.shared.resize_mut().backfill(pods, now);
    }
}
