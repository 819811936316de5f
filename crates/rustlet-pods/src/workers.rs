//! Pod workers (upstream `pod_workers.go` and the kubelet's `SyncPod`, `SyncTerminatingPod`,
//! `SyncTerminatedPod`; spec `pod-lifecycle.md` W1-W23): one task per pod UID drives the pod
//! from its first sight to its deletion and feeds the status and volume managers.
//!
//! ```text
//!  first sight ─► SYNCING ──(deletionTimestamp | gone from the source | terminal phase)──┐
//!   (terminal in the API and nothing running: born TERMINATED, W2)                       ▼
//!                 FINISHED ◄── terminate_pod ◄── TERMINATED ◄── kill, final status ◄── TERMINATING
//!                    │        (volumes unmounted, pod dir removed)
//!                    └── forgotten once the pod leaves the source (its UID may come back)
//! ```
//!
//! A pod added again under its UID while its worker terminates it (it left the source and came
//! back, or a static pod's manifest was removed and written again: a new
//! `kubernetes.io/config.seen`) is terminated, then, once FINISHED, given a new worker that
//! starts it again (upstream `restartRequested`); its exited containers stay, so restart
//! counts go on.
//!
//! [`PodLifecycles`] is the table of those states. It is built first, because the managers
//! read it: it is the volume manager's `PodStateProvider` and the status manager's
//! `PodDeletionSafety` (a pod could have running containers until it is terminated; an unknown
//! pod could until the sources have been seen once, W16).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;
use rustlet_core::deletion::PodDeletionSafety;
use rustlet_core::generate::need_to_reconcile_pod_readiness;
use rustlet_core::pod::{
    CONFIG_SEEN_ANNOTATION, PodPhase, condition_type, is_restartable_init_container, is_static_pod,
};
use rustlet_core::{ChangeLog, FeatureGates, PodChanges, PodUid};
use rustlet_status::StatusManager;
use rustlet_volume::events::{EventKind, EventRecorder, FAILED_MOUNT};
use rustlet_volume::manager::VolumeManager;
use rustlet_volume::populator::{PodSource, PodStateProvider};
use rustlet_volume::subpath::ContainerMount;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::actions::{ContainerToKill, KillReason, ProbeFailures, compute_pod_actions};
use crate::admission::{AdmitHandlers, ResourceAllocator, allocation_rejection, rejected_status};
use crate::lifecycle::POST_START_HOOK_ERROR;
use crate::prober::{
    GrpcProber, OnChange, ProbeCounts, ProbeKind, ProbeResult, ProbeResults, ProbeTask,
};
use crate::runtime::{
    ContainerKind, InstanceState, Runtime, RuntimeError, RuntimePodStatus, container_hash,
    ephemeral_container, format_pod, full_name,
};
use crate::status::{
    ContainerProbes, StatusInput, WaitingReason, active_deadline, generate_api_status,
    past_active_deadline,
};

/// The event of a sandbox the runtime could not make (upstream `events.FailedCreatePodSandBox`).
pub const FAILED_CREATE_POD_SANDBOX: &str = "FailedCreatePodSandBox";

/// Where a pod is in its lifecycle (upstream `podSyncStatus`'s `WorkType` plus `finished`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lifecycle {
    /// Setting up and running.
    Syncing,
    /// Being stopped: no container starts again.
    Terminating,
    /// Stopped; volumes and the pod directory are being reclaimed.
    Terminated,
    /// Reclaimed and handed to the status manager (`terminate_pod`).
    Finished,
}

/// The lifecycle table: every pod UID a worker knows, and whether the sources were seen once.
#[derive(Debug, Default)]
pub struct PodLifecycles {
    states: Mutex<HashMap<PodUid, Lifecycle>>,
    synced: AtomicBool,
    /// Which pods' lifecycles changed (the volume manager's populator visits only those).
    changes: Mutex<ChangeLog>,
    /// Pods no worker knows whose containers the runtime may still run (found after a
    /// restart): they count as running until the orphan pass has stopped them (W26 step 12).
    runtime_only: Mutex<HashSet<PodUid>>,
    /// Bumped when a pod reaches `Terminated` or is forgotten: a static pod waiting for its
    /// earlier incarnation (W9) looks again.
    ended: watch::Sender<u64>,
    /// W9/W30: by full name (`<name>_<namespace>`), the static pod whose worker was allowed to
    /// start (upstream `startedStaticPodsByFullname`). Its mirror pod follows it: created or
    /// replaced only while it syncs, and an orphaned mirror kept while it terminates.
    started_static: Mutex<HashMap<String, PodUid>>,
    /// Bumped when a static pod's worker starts, reaches `Terminated` or is forgotten (the
    /// mirror pods look again).
    static_changed: watch::Sender<u64>,
}

impl PodLifecycles {
    /// An empty table; unknown pods count as possibly running until [`Self::mark_synced`].
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<PodUid, Lifecycle>> {
        self.states.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pod's lifecycle, if a worker knows it.
    pub fn get(&self, uid: &PodUid) -> Option<Lifecycle> {
        self.lock().get(uid).copied()
    }

    /// Every known pod and its lifecycle.
    pub fn snapshot(&self) -> HashMap<PodUid, Lifecycle> {
        self.lock().clone()
    }

    fn log(&self) -> MutexGuard<'_, ChangeLog> {
        self.changes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn started_static(&self) -> MutexGuard<'_, HashMap<String, PodUid>> {
        self.started_static
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn is_started_static(&self, uid: &PodUid) -> bool {
        self.started_static().values().any(|u| u == uid)
    }

    fn set(&self, uid: &PodUid, state: Lifecycle) {
        let mut states = self.lock();
        let before = states.insert(uid.clone(), state);
        if before != Some(state) {
            self.log().record(uid.clone());
            if state >= Lifecycle::Terminated {
                self.ended.send_modify(|n| *n += 1);
            }
            let ended = state >= Lifecycle::Terminated && before < Some(Lifecycle::Terminated);
            if ended && self.is_started_static(uid) {
                self.static_changed.send_modify(|n| *n += 1);
            }
        }
    }

    fn forget(&self, uid: &PodUid) {
        let mut states = self.lock();
        if states.remove(uid).is_some() {
            self.log().record(uid.clone());
            self.ended.send_modify(|n| *n += 1);
        }
        let mut started = self.started_static();
        let before = started.len();
        started.retain(|_, u| u != uid);
        if started.len() != before {
            self.static_changed.send_modify(|n| *n += 1);
        }
    }

    /// W9 passed (upstream `allowStaticPodStart`): the static pod `uid` named `full_name`
    /// starts; it replaces the earlier incarnation as the one its mirror pod follows.
    fn static_started(&self, full_name: &str, uid: &PodUid) {
        self.started_static()
            .insert(full_name.to_owned(), uid.clone());
        self.static_changed.send_modify(|n| *n += 1);
    }

    /// Whether the static pod `uid` was allowed to start (W9) and is syncing: upstream's
    /// `SyncPod` runs for it, which creates its mirror pod or replaces an outdated one (W30).
    pub fn is_static_pod_syncing(&self, uid: &PodUid) -> bool {
        let states = self.lock();
        states.get(uid) == Some(&Lifecycle::Syncing) && self.is_started_static(uid)
    }

    /// Whether the static pod named `namespace`/`name` whose worker started has not terminated
    /// yet: its containers may still run. For a mirror pod whose static pod left the source
    /// this is upstream's `IsPodForMirrorPodTerminatingByFullName`: its worker is terminating
    /// it, or is about to (upstream's housekeeping asks only after `SyncKnownPods` requested
    /// the termination; here the dispatcher may not have told the worker yet), and the orphaned
    /// mirror stays until it terminated.
    pub fn static_pod_may_run(&self, namespace: &str, name: &str) -> bool {
        let states = self.lock();
        let started = self.started_static();
        started
            .get(&format!("{name}_{namespace}"))
            .and_then(|uid| states.get(uid))
            .is_some_and(|state| *state < Lifecycle::Terminated)
    }

    /// A receiver that sees a new value whenever a static pod's worker starts, terminates or
    /// is forgotten: the answers of [`Self::is_static_pod_syncing`] and
    /// [`Self::static_pod_may_run`] change only then (and with the lifecycles).
    pub fn subscribe_static(&self) -> watch::Receiver<u64> {
        self.static_changed.subscribe()
    }

    /// The sources were read once (upstream `podsSynced`, W16).
    pub fn mark_synced(&self) {
        let _states = self.lock();
        self.synced.store(true, Ordering::Release);
        // Every pod no worker knows changes its answers.
        self.log().reset();
    }

    /// Whether the sources were read once.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Upstream `CouldHaveRunningContainers`.
    pub fn could_have_running_containers(&self, uid: &PodUid) -> bool {
        match self.get(uid) {
            Some(state) => state < Lifecycle::Terminated,
            None => !self.is_synced() || self.is_runtime_only(uid),
        }
    }

    fn runtime_only(&self) -> MutexGuard<'_, HashSet<PodUid>> {
        self.runtime_only.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_runtime_only(&self, uid: &PodUid) -> bool {
        self.runtime_only().contains(uid)
    }

    /// The pods no worker knows whose containers may still run (upstream's runtime pods that
    /// housekeeping hands to `SyncPodKill`, W26 step 12); those that joined or left the set
    /// are recorded as changed. Whether any did.
    pub fn set_runtime_only(&self, uids: HashSet<PodUid>) -> bool {
        let mut current = self.runtime_only();
        if *current == uids {
            return false;
        }
        let mut log = self.log();
        for uid in current.symmetric_difference(&uids) {
            log.record(uid.clone());
        }
        *current = uids;
        true
    }
}

impl PodStateProvider for PodLifecycles {
    fn should_pod_containers_be_terminating(&self, uid: &PodUid) -> bool {
        match self.get(uid) {
            Some(state) => state >= Lifecycle::Terminating,
            None => self.is_synced(),
        }
    }

    fn should_pod_runtime_be_removed(&self, uid: &PodUid) -> bool {
        match self.get(uid) {
            Some(state) => state >= Lifecycle::Terminated,
            None => self.is_synced() && !self.is_runtime_only(uid),
        }
    }

    fn changes_since(&self, cursor: u64) -> PodChanges {
        self.log().since(cursor)
    }
}

impl PodDeletionSafety for PodLifecycles {
    fn pod_could_have_running_containers(&self, pod: &Pod) -> bool {
        self.could_have_running_containers(&PodUid::of(pod))
    }
}

/// What the workers are built from.
pub struct PodWorkersDeps {
    /// The pods bound to this node.
    pub pods: Arc<dyn PodSource>,
    /// Bumped whenever `pods` changes.
    pub changes: watch::Receiver<u64>,
    /// The lifecycle table the managers read.
    pub lifecycles: Arc<PodLifecycles>,
    /// The status manager.
    pub status: Arc<StatusManager>,
    /// The volume manager.
    pub volumes: Arc<VolumeManager>,
    /// The container runtime.
    pub runtime: Arc<dyn Runtime>,
    /// The gRPC health check of `grpc` probes (`None`: such a probe errors, as one the agent
    /// cannot run).
    pub grpc: Option<Arc<dyn GrpcProber>>,
    /// Where pod events go.
    pub events: Arc<dyn EventRecorder>,
}

/// Tunables of the workers.
#[derive(Clone, Debug, PartialEq)]
pub struct PodWorkersConfig {
    /// The agent's root directory (`<root>/pods/<uid>` is removed once a pod is reclaimed).
    pub root_dir: PathBuf,
    /// The node's addresses (`hostIP`, `hostIPs`, host-network pod IPs).
    pub host_ips: Vec<String>,
    /// First crash-loop back-off (upstream 10 s), doubling up to `crash_loop_max` (300 s).
    pub crash_loop_initial: Duration,
    /// Longest crash-loop back-off.
    pub crash_loop_max: Duration,
    /// A container that ran longer than this before it exited starts its back-off afresh
    /// (upstream 600 s, fixed: the kubelet's `HasExpiredFunc`).
    pub crash_loop_reset: Duration,
    /// Wait after a failed sync before the next one (upstream `backOffPeriod`, 10 s).
    pub sync_error_backoff: Duration,
    /// Housekeeping period: orphaned statuses, finished workers (upstream 2 s).
    pub housekeeping_period: Duration,
    /// Feature gates in force.
    pub gates: FeatureGates,
    /// What admits a pod first seen (upstream `canAdmitPod`'s handlers).
    pub admit_handlers: AdmitHandlers,
}

impl PodWorkersConfig {
    /// Upstream's timings under `root_dir`.
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        Self {
            root_dir: root_dir.into(),
            host_ips: Vec::new(),
            crash_loop_initial: Duration::from_secs(10),
            crash_loop_max: Duration::from_secs(300),
            crash_loop_reset: Duration::from_secs(600),
            sync_error_backoff: Duration::from_secs(10),
            housekeeping_period: Duration::from_secs(2),
            gates: FeatureGates::default(),
            admit_handlers: AdmitHandlers::default(),
        }
    }
}

/// The pod workers: a dispatcher that follows the pod source and one task per pod.
pub struct PodWorkers {
    shared: Arc<Shared>,
    changes: watch::Receiver<u64>,
}

struct Shared {
    probe_results: Arc<ProbeResults>,
    /// `prober_probe_total` (`/metrics/probes`).
    probe_counts: Arc<ProbeCounts>,
    /// W9: the UIDs of static pods by full name (`<name>_<namespace>`), in the order their
    /// workers were made. A static pod starts only when every UID before it has terminated,
    /// so two incarnations of one manifest (an etcd, an API server) never run at once.
    static_turns: Mutex<HashMap<String, Vec<PodUid>>>,
    /// Containers that started before this (the agent's start less 10 s) were adopted from an
    /// earlier agent: B11.
    adopted_before: k8s_openapi::jiff::Timestamp,
    pods: Arc<dyn PodSource>,
    lifecycles: Arc<PodLifecycles>,
    status: Arc<StatusManager>,
    volumes: Arc<VolumeManager>,
    runtime: Arc<dyn Runtime>,
    grpc: Option<Arc<dyn GrpcProber>>,
    events: Arc<dyn EventRecorder>,
    config: PodWorkersConfig,
    /// The resource allocation admit handler, once set.
    allocator: std::sync::OnceLock<Arc<dyn ResourceAllocator>>,
}

/// B11: the agent's start less 10 s, on the wall clock.
fn adopted_before() -> k8s_openapi::jiff::Timestamp {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
    k8s_openapi::jiff::Timestamp::from_second(now - 10)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

impl Shared {
    fn static_turns(&self) -> MutexGuard<'_, HashMap<String, Vec<PodUid>>> {
        self.static_turns.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Upstream's `kubecontainer.GetPodFullName`: `<name>_<namespace>`.
fn static_full_name(pod: &Pod) -> String {
    format!(
        "{}_{}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default()
    )
}

fn api_phase_terminal(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .is_some_and(|s| PodPhase::of(s).is_terminal())
}

impl PodWorkers {
    /// Workers over these dependencies.
    pub fn new(deps: PodWorkersDeps, config: PodWorkersConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                probe_results: Arc::new(ProbeResults::default()),
                probe_counts: Arc::new(ProbeCounts::default()),
                static_turns: Mutex::new(HashMap::new()),
                adopted_before: adopted_before(),
                pods: deps.pods,
                lifecycles: deps.lifecycles,
                status: deps.status,
                volumes: deps.volumes,
                runtime: deps.runtime,
                grpc: deps.grpc,
                events: deps.events,
                config,
                allocator: std::sync::OnceLock::new(),
            }),
            changes: deps.changes,
        }
    }

    /// The resource allocation admit handler (upstream's device manager's `Allocate` at
    /// admission): a new pod gets its devices before its worker starts, or is rejected
    /// `UnexpectedAdmissionError`. Once; a second call changes nothing.
    pub fn set_resource_allocator(&self, allocator: Arc<dyn ResourceAllocator>) {
        let _ = self.shared.allocator.set(allocator);
    }

    /// The probes run so far, by container and result (`/metrics/probes`).
    pub fn probe_counts(&self) -> Arc<ProbeCounts> {
        self.shared.probe_counts.clone()
    }

    /// A pod present with the UID of a finished worker whose status the status manager has
    /// already dropped (it deleted the old incarnation), not being deleted: the same UID came
    /// back (a manifest with its own UID, restored). A finished pod that stays in the API
    /// (Succeeded, not deleted) keeps its status and is not restarted.
    /// Tells the lifecycle table which pods the runtime may still run that no worker knows;
    /// whether that changed.
    fn note_runtime_only(&self, known: &HashSet<PodUid>) -> bool {
        let mut orphans = self.shared.runtime.pods_that_may_run();
        orphans.retain(|uid| !known.contains(uid));
        self.shared.lifecycles.set_runtime_only(orphans)
    }

    /// Upstream `HandlePodAdditions`' admission of a pod first seen, unless its API phase is
    /// terminal ([`AdmitHandlers::admit`]): a rejected pod gets upstream's `rejectPod` (a
    /// Warning event, the status Failed with the reason) and its worker never starts it.
    async fn admit(&self, pod: &Pod) -> Admission {
        if api_phase_terminal(pod) {
            return Admission::Admitted;
        }
        let mut rejection = self.shared.config.admit_handlers.admit(pod);
        if rejection.is_none()
            && pod.metadata.deletion_timestamp.is_none()
            && let Some(allocator) = self.shared.allocator.get()
            && let Err(e) = allocator.allocate(pod).await
        {
            rejection = Some(allocation_rejection(&e));
        }
        let Some(rejection) = rejection else {
            return Admission::Admitted;
        };
        warn!(pod = %full_name(pod), reason = rejection.reason, message = %rejection.message,
              "pod rejected at admission");
        self.shared.events.event(
            pod,
            EventKind::Warning,
            rejection.reason,
            &rejection.message,
        );
        self.shared
            .status
            .set_pod_status(pod, rejected_status(pod, &rejection));
        Admission::Rejected
    }

    /// Upstream `SyncKnownPods` (`removeTerminatedWorker` of a pod with `restartRequested`)
    /// and `HandlePodCleanups` (which restarts a desired pod no worker knows): a pod of
    /// `restarts` whose worker finished loses its worker and lifecycle, and the next pass
    /// starts a new worker if the source still has it. Its exited containers stay (the
    /// restart counts go on from them). A pod whose status is terminal stays finished
    /// (upstream's active pods leave it out).
    fn restart_finished(
        &self,
        restarts: &mut HashSet<PodUid>,
        workers: &mut HashMap<PodUid, watch::Sender<PodSlot>>,
        known: &mut HashSet<PodUid>,
    ) {
        restarts.retain(|uid| match self.shared.lifecycles.get(uid) {
            Some(Lifecycle::Finished) => {
                let terminal = self
                    .shared
                    .status
                    .get_pod_status(uid)
                    .is_some_and(|s| PodPhase::of(&s).is_terminal());
                if terminal {
                    if let (Some(tx), Some(pod)) = (workers.get(uid), self.shared.pods.pod(uid)) {
                        tx.send_if_modified(|current| {
                            *current = PodSlot {
                                pod,
                                in_source: true,
                            };
                            false
                        });
                    }
                    return false;
                }
                info!(%uid, "pod terminated and was added again with the same UID: restarting it");
                workers.remove(uid);
                known.remove(uid);
                self.shared.static_turns().retain(|_, turns| {
                    turns.retain(|u| u != uid);
                    !turns.is_empty()
                });
                self.shared.lifecycles.forget(uid);
                false
            }
            Some(_) => true,
            None => false,
        });
    }

    /// A worker whose pod is not in the source: `false` when it is forgotten (its pod
    /// finished, or the worker is gone), else it is told, and terminates the pod (an orphan).
    fn keep_departed(
        &self,
        uid: &PodUid,
        tx: &watch::Sender<PodSlot>,
        known: &mut HashSet<PodUid>,
    ) -> bool {
        if self.shared.lifecycles.get(uid) == Some(Lifecycle::Finished) || tx.is_closed() {
            self.shared.static_turns().retain(|_, turns| {
                turns.retain(|u| u != uid);
                !turns.is_empty()
            });
            self.shared.lifecycles.forget(uid);
            known.remove(uid);
            return false;
        }
        tx.send_if_modified(|current| std::mem::replace(&mut current.in_source, false));
        true
    }

    fn is_new_incarnation(&self, uid: &PodUid, pod: &Pod) -> bool {
        self.shared.lifecycles.get(uid) == Some(Lifecycle::Finished)
            && pod.metadata.deletion_timestamp.is_none()
            && self.shared.status.get_pod_status(uid).is_none()
    }

    /// Follows the pod source until `cancel` fires: a worker per new UID, the newest pod to
    /// each worker, and housekeeping. On cancellation the workers stop where they are: nothing
    /// is killed or unmounted (a restart adopts it).
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut workers: HashMap<PodUid, watch::Sender<PodSlot>> = HashMap::new();
        // The UIDs of `workers`, kept beside it for the runtime's orphan check (copying them
        // into a set every housekeeping period was a tenth of the settled agent's idle CPU).
        let mut known: HashSet<PodUid> = HashSet::new();
        // UIDs whose finished incarnation was just replaced (filled and drained in one pass).
        let mut successors: HashSet<PodUid> = HashSet::new();
        // Upstream `restartRequested`: pods added again under their UID while their worker
        // terminates them (back in the source after leaving it, or removed and added back in
        // one go: a new `kubernetes.io/config.seen`). Restarted once their worker finished.
        let mut restarts: HashSet<PodUid> = HashSet::new();
        let mut runtime_events = self.shared.runtime.changes();
        let mut tick = tokio::time::interval(self.shared.config.housekeeping_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Issue 29: a full pass over the source is O(pods). It runs on a housekeeping tick only
        // when it could change something: workers of pods gone from the source (finished ones
        // are forgotten), a restart, the first sync, or a status cached since the last
        // housekeeping's retain (which needs the whole source). A settled node's tick does no
        // pass. A change of the source visits only the pods its change log names (a storm
        // changes the source thousands of times), unless the log cannot say.
        let mut source_changed = true;
        let mut housekeeping = false;
        // Where the source's change log was read last.
        let mut cursor = 0u64;
        // Workers of pods not in the source after the last full pass. (A pod that leaves it
        // in a partial pass is a change: the retain it makes due brings the next
        // housekeeping's full pass, which forgets its worker once it finished.)
        let mut gone = 0usize;
        // The source changed since the last retain of the cached statuses.
        let mut retain_due = true;
        // `StatusManager::additions` as the last retain saw it.
        let mut retained_at: Option<u64> = None;
        loop {
            let restarting = !restarts.is_empty();
            if restarting {
                self.restart_finished(&mut restarts, &mut workers, &mut known);
            }
            let additions = self.shared.status.additions();
            let retain = housekeeping && (retain_due || retained_at != Some(additions));
            let mut full = restarting
                || retain
                || (housekeeping && gone > 0)
                || !self.shared.lifecycles.is_synced();
            let changed = std::mem::take(&mut source_changed);
            retain_due |= changed;
            // The pods a partial pass visits (none: a full pass, or no pass).
            let mut visit: Vec<PodUid> = Vec::new();
            if full || changed {
                // Read before the pods: what changes after this is read next time.
                let changes = self.shared.pods.changes_since(cursor);
                cursor = changes.cursor();
                match changes {
                    PodChanges::Since { uids, .. } if !full => {
                        let mut seen = HashSet::with_capacity(uids.len());
                        visit = uids
                            .into_iter()
                            .filter(|u| seen.insert(u.clone()))
                            .collect();
                    }
                    _ => full = true,
                }
            }
            let pods = if full {
                self.shared.pods.pods()
            } else {
                visit
                    .iter()
                    .filter_map(|uid| self.shared.pods.pod(uid))
                    .collect()
            };
            // Borrowed UIDs, and nothing more for a pod its worker already has in this very
            // version: a storm changes the source thousands of times, each pass is O(pods).
            let mut present: HashSet<&str> = HashSet::with_capacity(pods.len());
            let mut volumes_changed = false;
            for pod in &pods {
                let uid_str = pod.metadata.uid.as_deref().unwrap_or_default();
                present.insert(uid_str);
                if workers.get(uid_str).is_some_and(|tx| {
                    let slot = tx.borrow();
                    slot.in_source && Arc::ptr_eq(&slot.pod, pod)
                }) {
                    continue;
                }
                let uid = PodUid::of(pod);
                if workers.contains_key(&uid) && self.is_new_incarnation(&uid, pod) {
                    // W4/W19: the UID came back after its old incarnation was finished and
                    // deleted: a new worker starts it.
                    info!(%uid, "pod re-created with the UID of a finished one: starting it again");
                    workers.remove(&uid);
                    known.remove(&uid);
                    successors.insert(uid.clone());
                }
                match workers.get(&uid) {
                    Some(tx) if added_again(&tx.borrow(), pod) => {
                        // Upstream `UpdatePod` with `SyncPodCreate` for a pod whose
                        // termination was requested: it terminates, then restarts.
                        if restarts.insert(uid.clone()) {
                            info!(%uid, "pod added again with the UID of one being terminated: restarting it once it terminated");
                        }
                        if tx.send_if_modified(|current| {
                            std::mem::replace(&mut current.in_source, false)
                        }) {
                            volumes_changed = true;
                        }
                    }
                    Some(tx) => {
                        // Only what a worker acts on wakes it: not the status writes this agent
                        // makes itself (each comes back through the watch).
                        let mut replaced = false;
                        tx.send_if_modified(|current| {
                            let same = current.in_source && Arc::ptr_eq(&current.pod, pod);
                            let wake = !same
                                && (!current.in_source
                                    || matters(&current.pod, pod, &self.shared.config.gates));
                            if wake
                                && current.pod.metadata.deletion_timestamp
                                    != pod.metadata.deletion_timestamp
                            {
                                volumes_changed = true;
                            }
                            if !same {
                                *current = PodSlot {
                                    pod: pod.clone(),
                                    in_source: true,
                                };
                                replaced = true;
                            }
                            wake
                        });
                        // The desired state lets the older version go too (issue 29).
                        if replaced {
                            self.shared.volumes.pod_object_updated(pod);
                        }
                    }
                    None => {
                        volumes_changed = true;
                        let (tx, rx) = watch::channel(PodSlot {
                            pod: pod.clone(),
                            in_source: true,
                        });
                        workers.insert(uid.clone(), tx);
                        known.insert(uid.clone());
                        let admission = self.admit(pod).await;
                        // A pod first seen terminal in the API or being deleted never syncs
                        // (W2, W21: its worker goes straight to termination), nor does a
                        // rejected one: the volume manager must not mount for it meanwhile
                        // (upstream's UpdatePod starts such a worker terminating).
                        let first = if admission == Admission::Rejected
                            || api_phase_terminal(pod)
                            || pod.metadata.deletion_timestamp.is_some()
                        {
                            Lifecycle::Terminating
                        } else {
                            Lifecycle::Syncing
                        };
                        self.shared.lifecycles.set(&uid, first);
                        if is_static_pod(pod) {
                            self.shared
                                .static_turns()
                                .entry(static_full_name(pod))
                                .or_default()
                                .push(uid.clone());
                        }
                        let worker = Worker {
                            shared: self.shared.clone(),
                            admission,
                            incarnation: if successors.remove(&uid) {
                                Incarnation::Successor
                            } else {
                                Incarnation::First
                            },
                            uid: uid.clone(),
                            rx,
                            cancel: cancel.clone(),
                            back_off: CrashLoopBackOff::default(),
                            probes: HashMap::new(),
                            probe_wake: Arc::new(Notify::new()),
                        };
                        let span = info_span!("pod", pod = %full_name(pod), %uid);
                        tokio::spawn(worker.run().instrument(span));
                    }
                }
            }
            // Pods gone from the source: their workers terminate them (orphans), and finished
            // ones are forgotten.
            if full {
                workers.retain(|uid, tx| {
                    present.contains(uid.as_str()) || {
                        volumes_changed = true;
                        self.keep_departed(uid, tx, &mut known)
                    }
                });
            } else {
                for uid in visit.iter().filter(|u| !present.contains(u.as_str())) {
                    let Some(tx) = workers.get(uid) else { continue };
                    volumes_changed = true;
                    if !self.keep_departed(uid, tx, &mut known) {
                        workers.remove(uid);
                    }
                }
            }
            if self.shared.pods.all_sources_ready() && !self.shared.lifecycles.is_synced() {
                // Before anything counts as gone: what the runtime still runs for pods no
                // worker knows (deleted while the agent was down) keeps its volumes.
                self.note_runtime_only(&known);
                self.shared.lifecycles.mark_synced();
                volumes_changed = true;
            }
            // The volume manager needs a pass when pods come, go or start terminating, not
            // after every status write (a pass is O(pods)).
            if volumes_changed {
                self.shared.volumes.pod_updated();
            }
            if full {
                gone = workers.len().saturating_sub(present.len());
            }
            if std::mem::take(&mut housekeeping) {
                if retain {
                    self.shared
                        .status
                        .retain_statuses(|uid| present.contains(uid.as_str()));
                    retain_due = false;
                    retained_at = Some(additions);
                }
                if self.shared.lifecycles.is_synced() {
                    // What the runtime runs for a pod no worker knows (deleted while the
                    // agent was down) is stopped and removed; a worker's own pods stay.
                    // Its volumes wait until the runtime saw it stopped.
                    if self.note_runtime_only(&known) {
                        self.shared.volumes.pod_updated();
                    }
                    self.shared.runtime.remove_orphans(&known).await;
                }
            }
            // Not kept while waiting for the next change: a snapshot held across the wait kept
            // every pod's previous version alive once the source had a newer one (issue 29).
            drop(present);
            drop(pods);
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = self.changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    source_changed = true;
                }
                // The runtime saw a pod change by itself (a container exited): its worker
                // looks again; when events were missed, every worker does.
                event = async {
                    match runtime_events.as_mut() {
                        Some(events) => events.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    use tokio::sync::broadcast::error::RecvError;
                    match event {
                        Ok(uid) => {
                            if let Some(tx) = workers.get(&uid) {
                                tx.send_modify(|_| {});
                            }
                        }
                        Err(RecvError::Lagged(_)) => {
                            for tx in workers.values() {
                                tx.send_modify(|_| {});
                            }
                        }
                        Err(RecvError::Closed) => runtime_events = None,
                    }
                }
                // Housekeeping runs at the top of the next turn, after the pass it may need.
                _ = tick.tick() => housekeeping = true,
            }
        }
    }
}

/// Whether `pod`, in the source, was added again under the UID of the worker's `slot`: the
/// worker saw it leave the source, or the source removed it and added it back at once (a new
/// first-seen time).
fn added_again(slot: &PodSlot, pod: &Pod) -> bool {
    let seen = |pod: &Pod| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CONFIG_SEEN_ANNOTATION))
            .cloned()
    };
    !slot.in_source
        || matches!((seen(&slot.pod), seen(pod)), (Some(before), Some(now)) if before != now)
}

/// Whether a new copy of a pod is worth a worker's pass: anything but the status and the
/// metadata the API server bumps on every write (the agent's own status writes come back
/// through the watch), a terminal phase written by someone else, and a `Ready` condition that
/// its readiness gates' conditions (set by other clients) no longer agree with (upstream's
/// `HandlePodReconcile` and `NeedToReconcilePodReadiness`, G7).
fn matters(old: &Pod, new: &Pod, gates: &FeatureGates) -> bool {
    need_to_reconcile_pod_readiness(new, gates)
        || old.spec != new.spec
        || old.metadata.deletion_timestamp != new.metadata.deletion_timestamp
        || old.metadata.deletion_grace_period_seconds != new.metadata.deletion_grace_period_seconds
        || old.metadata.labels != new.metadata.labels
        || old.metadata.annotations != new.metadata.annotations
        || old.metadata.uid != new.metadata.uid
        || api_phase_terminal(old) != api_phase_terminal(new)
}

/// Why a sync stopped short.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("Unable to attach or mount volumes: {0}")]
    Mount(#[from] rustlet_volume::manager::WaitError),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
}

/// What ends a wait of the worker.
enum Wake {
    PodChanged,
    Due,
    Cancelled,
}

/// One crash-loop back-off entry (client-go's `backoffEntry`).
#[derive(Clone, Copy, Debug)]
struct BackOffEntry {
    /// The current delay.
    delay: Duration,
    /// When the last restart was let through, on the runtime's clock (`lastUpdate`).
    last_update: Timestamp,
}

/// The pod's crash-loop back-off (upstream: the kubelet's `backOff`, a `flowcontrol.Backoff`
/// keyed by `GetStableKey`: pod name, namespace and UID, container name and spec hash; C15). The
/// pod part is this worker's; the key here is the container name and its [`container_hash`],
/// so a changed spec starts afresh.
#[derive(Debug, Default)]
struct CrashLoopBackOff {
    entries: HashMap<(String, String), BackOffEntry>,
}

/// A restart held back: how long the delay is and when it ends, on the runtime's clock.
#[derive(Clone, Copy, Debug)]
struct BackingOff {
    delay: Duration,
    due: Timestamp,
}

fn since(later: Timestamp, earlier: Timestamp) -> Duration {
    later
        .duration_since(earlier)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

impl CrashLoopBackOff {
    /// Upstream `doBackOff`: measured from the `finishedAt` of the container's newest exited
    /// instance; none (never ran, or not exited): no back-off and no entry. Otherwise either
    /// held back (`IsInBackOffSince`), or let through, which moves the entry on (`Next`: a new
    /// or expired entry starts at the initial delay, else it doubles up to the maximum). An
    /// entry expires when the container ran for longer than `crash_loop_reset` (upstream's
    /// `HasExpiredFunc`: 600 s from the restart it allowed to the exit that followed).
    fn check(
        &mut self,
        container: &Container,
        runtime: &RuntimePodStatus,
        now: Timestamp,
        config: &PodWorkersConfig,
    ) -> Option<BackingOff> {
        let finished_at = runtime.containers.iter().find_map(|i| match i.state {
            InstanceState::Exited { finished_at, .. } if i.name == container.name => {
                Some(finished_at)
            }
            _ => None,
        })?;
        let key = (container.name.clone(), container_hash(container));
        let expired = |entry: &BackOffEntry| {
            finished_at > entry.last_update
                && since(finished_at, entry.last_update) > config.crash_loop_reset
        };
        if let Some(entry) = self.entries.get(&key)
            && !expired(entry)
            && (now < finished_at || since(now, finished_at) < entry.delay)
        {
            let due = finished_at
                .checked_add(
                    k8s_openapi::jiff::SignedDuration::try_from(entry.delay).unwrap_or_default(),
                )
                .unwrap_or(finished_at);
            return Some(BackingOff {
                delay: entry.delay,
                due,
            });
        }
        let delay = match self.entries.get(&key) {
            Some(entry) if !expired(entry) => (entry.delay * 2).min(config.crash_loop_max),
            _ => config.crash_loop_initial.min(config.crash_loop_max),
        };
        // The entries of the container's earlier specs go (upstream's GC drops them later).
        self.entries
            .retain(|(name, hash), _| *name != key.0 || *hash == key.1);
        self.entries.insert(
            key,
            BackOffEntry {
                delay,
                last_update: now,
            },
        );
        None
    }
}

/// What became of a start.
enum Started {
    Yes,
    /// The crash-loop back-off holds it until `due`.
    BackingOff {
        reason: WaitingReason,
        due: Instant,
    },
    /// It could not start (a waiting reason), retried after the sync back-off.
    No(WaitingReason),
}

/// The probe results as [`compute_pod_actions`] reads them.
struct ProbeView<'a> {
    results: &'a ProbeResults,
    runs: bool,
}

impl ProbeFailures for ProbeView<'_> {
    fn result(&self, id: &str, kind: ProbeKind) -> Option<ProbeResult> {
        if !self.runs {
            // No probe runs: each is taken as passed.
            return Some(ProbeResult::Success);
        }
        if id.is_empty() {
            return None;
        }
        self.results.get(id, kind)
    }
}

/// The Warning event's reason of a container that could not start with this waiting reason
/// (the message is the waiting message): `BackOff` for `ImagePullBackOff`, none for
/// `PostStartHookError` (upstream: `startContainer` records `FailedPostStartHook` without the
/// hook's output, which may hold secrets, and `SyncPod` nothing more; the runtime records it),
/// else `Failed`.
pub(crate) fn start_failure_event(reason: &str) -> Option<&'static str> {
    match reason {
        "ImagePullBackOff" => Some("BackOff"),
        POST_START_HOOK_ERROR => None,
        _ => Some("Failed"),
    }
}

/// A duration as Go's `time.Duration.String` writes it (`10s`, `1m20s`, `5m0s`, `1.5s`).
fn go_duration(d: Duration) -> String {
    let total = d.as_secs();
    let fraction = d.subsec_nanos();
    let seconds = if fraction == 0 {
        format!("{}s", total % 60)
    } else {
        let s = format!("{:.9}", f64::from(fraction) / 1e9);
        format!(
            "{}{}s",
            total % 60,
            s.trim_start_matches('0').trim_end_matches('0')
        )
    };
    match (total / 3600, (total / 60) % 60) {
        (0, 0) if total == 0 && fraction != 0 && d < Duration::from_secs(1) => {
            format!("{}ms", d.as_millis())
        }
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

/// Whether a worker's pod follows a finished one under the same UID (local mode: a manifest
/// that carries its UID, restored or edited).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Incarnation {
    /// The first pod this agent runs under the UID (or the same one, after a restart).
    First,
    /// The UID's earlier incarnation finished here: its exited containers are cleared first.
    Successor,
}

struct Worker {
    shared: Arc<Shared>,
    /// Whether the pod was admitted when first seen (a rejected one never starts).
    admission: Admission,
    incarnation: Incarnation,
    uid: PodUid,
    rx: watch::Receiver<PodSlot>,
    cancel: CancellationToken,
    back_off: CrashLoopBackOff,
    /// The probe tasks of this pod (B2), each stopped by its token and triggered by its
    /// notify.
    probes: HashMap<(String, ProbeKind), (CancellationToken, Arc<Notify>)>,
    /// Woken when a probe result of this pod changes (B6).
    probe_wake: Arc<Notify>,
}

/// The outcome of a pod's admission when first seen (upstream `canAdmitPod`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    /// The pod may run.
    Admitted,
    /// Rejected: Failed at once, nothing started (its worker only reclaims).
    Rejected,
}

/// What a worker is told about its pod: the newest version, the same `Arc` as the pod
/// source's (a worker keeps no older copy of its own), and whether the source still has it
/// (when it left, the last version stays for the termination).
struct PodSlot {
    pod: Arc<Pod>,
    in_source: bool,
}

/// How a sync pass ended.
enum Synced {
    /// Running (or backing off); wake again at this time if nothing else happens.
    Running(Option<Instant>),
    /// Every container is done and none restarts: terminal.
    Terminal,
}

impl Worker {
    /// The newest pod, while the source has it.
    fn pod(&mut self) -> Option<Arc<Pod>> {
        let slot = self.rx.borrow_and_update();
        slot.in_source.then(|| slot.pod.clone())
    }

    /// W9 (upstream `allowPodStart`): waits until every static pod of this full name whose
    /// worker was made before this one has terminated (its containers stopped). `false` when
    /// the agent stops first. A pod deleted or gone while it waits ends the wait: it is never
    /// started.
    async fn wait_for_static_turn(&mut self, full_name: &str) -> bool {
        let mut ended = self.shared.lifecycles.ended.subscribe();
        let mut said = false;
        loop {
            match self.pod() {
                Some(pod) if pod.metadata.deletion_timestamp.is_none() => {}
                _ => return true,
            }
            let before = {
                let mut turns = self.shared.static_turns();
                let list = turns.entry(full_name.to_owned()).or_default();
                let lifecycles = &self.shared.lifecycles;
                list.retain(|uid| {
                    *uid == self.uid
                        || lifecycles
                            .get(uid)
                            .is_some_and(|s| s < Lifecycle::Terminated)
                });
                list.first().filter(|first| **first != self.uid).cloned()
            };
            let Some(before) = before else { return true };
            if !said {
                info!(earlier = %before, "static pod waits for its earlier incarnation to terminate");
                said = true;
            }
            tokio::select! {
                () = self.cancel.cancelled() => return false,
                _ = ended.changed() => {}
                changed = self.rx.changed() => if changed.is_err() { return true },
            }
        }
    }

    /// The newest pod, or the last one known when it left the source.
    fn latest(&mut self) -> Arc<Pod> {
        self.rx.borrow_and_update().pod.clone()
    }

    async fn wait(&mut self, until: Option<Instant>) -> Wake {
        let sleep = async {
            match until {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = self.cancel.cancelled() => Wake::Cancelled,
            changed = self.rx.changed() => match changed {
                Ok(()) => Wake::PodChanged,
                Err(_) => Wake::Cancelled,
            },
            () = sleep => Wake::Due,
            () = self.probe_wake.notified() => Wake::Due,
        }
    }

    /// Starts the probe tasks of the pod's regular containers and sidecars that have none (B2),
    /// on a runtime that runs probes.
    fn ensure_probes(&mut self, pod: &Arc<Pod>) {
        if !self.shared.runtime.runs_probes() {
            return;
        }
        for container in probed_containers(pod) {
            for kind in ProbeKind::ALL {
                if kind.of(container).is_none() {
                    continue;
                }
                let key = (container.name.clone(), kind);
                if self.probes.contains_key(&key) {
                    continue;
                }
                let cancel = self.cancel.child_token();
                let (status, uid, wake) = (
                    self.shared.status.clone(),
                    self.uid.clone(),
                    self.probe_wake.clone(),
                );
                // B6: readiness and startup straight into the cached status; every change
                // wakes the worker (a liveness failure kills there).
                let on_change: OnChange = Arc::new(move |id, kind, result| {
                    let passed = result == ProbeResult::Success;
                    match kind {
                        ProbeKind::Readiness => {
                            status.set_container_readiness(&uid, id, passed);
                        }
                        ProbeKind::Startup => {
                            status.set_container_startup(&uid, id, passed);
                        }
                        ProbeKind::Liveness => {}
                    }
                    wake.notify_one();
                });
                let trigger = Arc::new(Notify::new());
                let task = ProbeTask {
                    kind,
                    pod: pod.clone(),
                    uid: self.uid.clone(),
                    container: container.clone(),
                    runtime: self.shared.runtime.clone(),
                    grpc: self.shared.grpc.clone(),
                    results: self.shared.probe_results.clone(),
                    counts: self.shared.probe_counts.clone(),
                    events: self.shared.events.clone(),
                    on_change,
                    cancel: cancel.clone(),
                    adopted_before: self.shared.adopted_before,
                    trigger: trigger.clone(),
                };
                tokio::spawn(task.run().in_current_span());
                self.probes.insert(key, (cancel, trigger));
            }
        }
    }

    /// Stops the probe tasks of these kinds (B7).
    fn stop_probes(&mut self, kinds: &[ProbeKind]) {
        self.probes.retain(|(_, kind), (cancel, _)| {
            if kinds.contains(kind) {
                cancel.cancel();
                false
            } else {
                true
            }
        });
    }

    /// B10's input: each regular container's and sidecar's startup and readiness results, for
    /// its newest instance. B11: a container adopted from an earlier agent (started before this
    /// one's start less 10 s) without a result yet keeps what `old` said: `started` if it was,
    /// and `ready` while the pod was Ready, so an agent restart does not flip a pod unready
    /// until its probes run again.
    fn probe_view(
        &self,
        pod: &Pod,
        runtime: &RuntimePodStatus,
        old: &PodStatus,
    ) -> HashMap<String, ContainerProbes> {
        if !self.shared.runtime.runs_probes() {
            return HashMap::new();
        }
        let results = &self.shared.probe_results;
        let pod_was_ready = rustlet_core::pod::is_condition_true(old, condition_type::READY);
        probed_containers(pod)
            .map(|c| {
                let newest = runtime.instances(&c.name).0;
                let id = newest.map(|i| i.id.as_str());
                let adopted = newest.is_some_and(|i| {
                    matches!(i.state, InstanceState::Running { started_at } if started_at < self.shared.adopted_before)
                });
                let was_started = old
                    .container_statuses
                    .iter()
                    .chain(&old.init_container_statuses)
                    .flatten()
                    .any(|s| s.name == c.name && s.container_id.as_deref() == id && s.started == Some(true));
                let passed = |kind: ProbeKind| {
                    kind.of(c).map(|_| match id.and_then(|id| results.get(id, kind)) {
                        Some(result) => result == ProbeResult::Success,
                        None if adopted => match kind {
                            ProbeKind::Readiness => pod_was_ready,
                            _ => was_started,
                        },
                        None => false,
                    })
                };
                // B10: a running container that is not ready yet gets its readiness probe now
                // (on every status generation), not a period after its worker started.
                let running = newest.is_some_and(|i| matches!(i.state, InstanceState::Running { .. }));
                if running
                    && passed(ProbeKind::Readiness) == Some(false)
                    && let Some((_, trigger)) = self.probes.get(&(c.name.clone(), ProbeKind::Readiness))
                {
                    trigger.notify_one();
                }
                (
                    c.name.clone(),
                    ContainerProbes {
                        startup: passed(ProbeKind::Startup),
                        readiness: passed(ProbeKind::Readiness),
                    },
                )
            })
            .collect()
    }

    /// `f` of the status the pod had: the status manager's cached one, else the pod's own. Lent,
    /// not copied (issue 29: in a storm every sync copied it, and again to hand the new one
    /// over); `f` runs under the cache's read lock, so it only computes.
    fn with_old_status<R>(&self, pod: &Pod, f: impl FnOnce(&PodStatus) -> R) -> R {
        self.shared.status.with_pod_status(&self.uid, |cached| {
            match cached.or(pod.status.as_ref()) {
                Some(old) => f(old),
                None => f(&PodStatus::default()),
            }
        })
    }

    /// Generates the pod's status and hands it to the status manager; its phase.
    fn set_status(
        &self,
        pod: &Pod,
        runtime: &RuntimePodStatus,
        terminal: bool,
        waiting: &HashMap<String, WaitingReason>,
    ) -> PodPhase {
        let (status, newly_evicted) = self.with_old_status(pod, |old| {
            let probes = self.probe_view(pod, runtime, old);
            let evict = past_active_deadline(pod, old, self.shared.runtime.now());
            let status = generate_api_status(&StatusInput {
                pod,
                runtime,
                old,
                pod_is_terminal: terminal,
                host_ips: &self.shared.config.host_ips,
                waiting,
                gates: &self.shared.config.gates,
                probes: &probes,
                evict,
                runtime_supports_rro: self.shared.runtime.supports_recursive_read_only_mounts(),
            });
            (
                status,
                evict.filter(|_| PodPhase::of(old) != PodPhase::Failed),
            )
        });
        if let Some(eviction) = newly_evicted {
            // Deviation: upstream records it at every status generation past the deadline;
            // once here.
            self.event(pod, EventKind::Normal, eviction.reason, eviction.message);
        }
        let phase = PodPhase::of(&status);
        self.shared.status.set_pod_status(pod, status);
        phase
    }

    fn event(&self, pod: &Pod, kind: EventKind, reason: &str, message: &str) {
        self.shared.events.event(pod, kind, reason, message);
    }

    async fn run(mut self) {
        let Some(first) = self.pod() else { return };
        let static_name = is_static_pod(&first).then(|| static_full_name(&first));
        drop(first);
        if let Some(name) = static_name
            && !self.wait_for_static_turn(&name).await
        {
            return;
        }
        // Gone or deleted while it waited: the sync loop ends at once, nothing was started.
        let pod = self.latest();
        if self.incarnation == Incarnation::Successor {
            // What the finished incarnation left in the runtime is not this pod's.
            self.shared.runtime.remove_pod(&self.uid).await;
        }
        let runtime = self.shared.runtime.pod_status(&self.uid).await;
        // W2: a pod already terminal in the API with nothing running is born terminated, and
        // so is a pod rejected at admission (upstream never gives it to a pod worker); one
        // that something still runs for is stopped first, never synced.
        let rejected = self.admission == Admission::Rejected;
        let born_terminated = (rejected || api_phase_terminal(&pod)) && !runtime.any_running();
        if !born_terminated && !rejected {
            let requested = {
                let slot = self.rx.borrow();
                !slot.in_source || slot.pod.metadata.deletion_timestamp.is_some()
            };
            // Upstream `allowPodStart`: a static pod asked to terminate before its turn never
            // starts (nor gets a mirror pod).
            if is_static_pod(&pod) && !requested {
                self.shared
                    .lifecycles
                    .static_started(&static_full_name(&pod), &self.uid);
            }
            // Neither is kept for the worker's life: the version it started with stayed alive
            // beside every newer one, a second typed copy of each running pod (issue 29).
            drop(pod);
            drop(runtime);
            if !self.sync_loop().await {
                return;
            }
        }
        if !born_terminated && !Box::pin(self.terminate()).await {
            return;
        }
        Box::pin(self.reclaim()).await;
    }

    /// SYNCING until the pod must stop; `false` when the agent stops first.
    async fn sync_loop(&mut self) -> bool {
        let mut retry_at = None;
        loop {
            let Some(pod) = self.pod() else {
                info!("pod is gone from the source: terminating it");
                return true;
            };
            if pod.metadata.deletion_timestamp.is_some() || api_phase_terminal(&pod) {
                return true;
            }
            // Handed over, not kept: the pass lets it go while the volumes are mounted. Boxed:
            // a pass's state (several KB) is held only while it runs, not by every idle
            // worker's task (issue 29).
            let synced = Box::pin(self.sync_pod(pod)).await;
            if let Err(e @ SyncError::Mount(_)) = &synced {
                let pod = self.rx.borrow().pod.clone();
                self.event(&pod, EventKind::Warning, FAILED_MOUNT, &e.to_string());
            }
            let next = match synced {
                Ok(Synced::Terminal) => return true,
                Ok(Synced::Running(next)) => next,
                Err(e) => {
                    warn!(error = %e, "Error syncing pod, skipping");
                    retry_at = Some(Instant::now() + self.shared.config.sync_error_backoff);
                    None
                }
            };
            let until = match (next, retry_at.take()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match self.wait(until).await {
                Wake::Cancelled => return false,
                Wake::PodChanged | Wake::Due => {}
            }
        }
    }

    /// Upstream `SyncPod` (W20) and the runtime manager's `SyncPod` (C13): status (a terminal
    /// one ends the pass), volumes, then the actions computed from what the runtime reports
    /// ([`compute_pod_actions`]): kill (the pod, or single containers), a new sandbox, the init
    /// containers (the next one and the sidecars to keep running), the regular containers; each
    /// start behind the crash-loop back-off (C14, C15).
    async fn sync_pod(&mut self, first: Arc<Pod>) -> Result<Synced, SyncError> {
        let no_waiting = HashMap::new();
        let runtime = self.shared.runtime.pod_status(&self.uid).await;
        // W20 step 3: a status that is already terminal ends the pass (a run-once pod whose
        // container the runtime lost is not started again).
        if self
            .set_status(&first, &runtime, false, &no_waiting)
            .is_terminal()
        {
            return Ok(Synced::Terminal);
        }
        let wait = self.shared.volumes.wait_for_attach_and_mount(&first);
        // Not kept through the wait (issue 29): the status just written comes back as a newer
        // version, and in a storm every pod waits at once, each keeping a second typed copy.
        drop(first);
        let mounted = tokio::select! {
            r = wait => r,
            // The pod changed (deleted?) or the agent stops: the next pass decides.
            _ = self.rx.changed() => return Ok(Synced::Running(Some(Instant::now()))),
            () = self.cancel.cancelled() => return Ok(Synced::Running(None)),
        };
        mounted?;
        // A change that wakes a worker came with the mounts: the next pass decides, as when it
        // came first. Otherwise the newest version differs from the first only in what wakes no
        // worker (its status, the metadata each write bumps), and the pass goes on with it. Read
        // without marking it seen: a change after this still wakes the next wait.
        if self.rx.has_changed().unwrap_or(true) {
            return Ok(Synced::Running(Some(Instant::now())));
        }
        let latest = self.rx.borrow().pod.clone();
        let pod = &latest;
        let runtime_api = self.shared.runtime.clone();
        // The actions and the back-off read the runtime as it was before this pass acted
        // (upstream's pod status of the sync).
        let runtime = runtime_api.pod_status(&self.uid).await;
        let probes = ProbeView {
            results: &self.shared.probe_results,
            runs: runtime_api.runs_probes(),
        };
        let actions = compute_pod_actions(pod, &runtime, &probes);
        debug!(?actions, "computed the pod's actions");
        let empty = k8s_openapi::api::core::v1::PodSpec::default();
        let spec = pod.spec.as_ref().unwrap_or(&empty);

        if actions.sandbox_changed && actions.create_sandbox {
            self.event(
                pod,
                EventKind::Normal,
                "SandboxChanged",
                "Pod sandbox changed, it will be killed and re-created.",
            );
        }
        if actions.kill_pod {
            self.stop_pod(pod, &runtime).await?;
            if !actions.create_sandbox {
                // C12 (or C8 for a pod that never restarts): the pod is done.
                let runtime = runtime_api.pod_status(&self.uid).await;
                if self
                    .set_status(pod, &runtime, false, &no_waiting)
                    .is_terminal()
                {
                    return Ok(Synced::Terminal);
                }
                return Ok(Synced::Running(runtime_api.next_change(&self.uid)));
            }
        } else {
            for kill in &actions.kill {
                self.kill_container(pod, kill).await?;
            }
        }
        if actions.create_sandbox
            && let Err(e) = runtime_api.run_pod_sandbox(pod).await
        {
            // upstream `SyncPod`: a Warning `FailedCreatePodSandBox` with the runtime's error on
            // each failed attempt; the pod stays Pending and the sync is retried.
            let why = match &e {
                RuntimeError::CreateSandbox { message, .. } => message.clone(),
                other => other.to_string(),
            };
            self.event(
                pod,
                EventKind::Warning,
                FAILED_CREATE_POD_SANDBOX,
                &format!("Failed to create pod sandbox: {why}"),
            );
            return Err(e.into());
        }
        self.ensure_probes(pod);

        let mut waiting = HashMap::new();
        let mut wake: Option<Instant> = None;
        let mut soonest = |at: Instant| wake = Some(wake.map_or(at, |w: Instant| w.min(at)));
        let retry = Instant::now() + self.shared.config.sync_error_backoff;

        // C13 step 7: the ephemeral containers, before the init containers (so that a pod
        // whose initialization is stuck can be debugged).
        let ephemeral = spec.ephemeral_containers.as_deref().unwrap_or_default();
        for &index in &actions.ephemeral {
            let container = ephemeral_container(&ephemeral[index]);
            match self
                .start_with_back_off(pod, &container, ContainerKind::Ephemeral, &runtime)
                .await?
            {
                Started::Yes => {}
                Started::BackingOff { reason, due } => {
                    waiting.insert(container.name.clone(), reason);
                    soonest(due);
                }
                Started::No(reason) => {
                    waiting.insert(container.name.clone(), reason);
                    soonest(retry);
                }
            }
        }
        // C13 step 8: the init containers to start; an ordinary one that cannot start ends the
        // pass (a sidecar that cannot is skipped).
        let init = spec.init_containers.as_deref().unwrap_or_default();
        let mut init_started = None;
        let mut init_blocked = false;
        for &index in &actions.init_to_start {
            let container = &init[index];
            match self
                .start_with_back_off(pod, container, ContainerKind::Init, &runtime)
                .await?
            {
                Started::Yes => {
                    init_started = Some(container.name.as_str());
                    continue;
                }
                Started::BackingOff { reason, due } => {
                    waiting.insert(container.name.clone(), reason);
                    soonest(due);
                }
                Started::No(reason) => {
                    waiting.insert(container.name.clone(), reason);
                    soonest(retry);
                }
            }
            if !is_restartable_init_container(container) {
                init_blocked = true;
                break;
            }
        }
        // C13 step 10: the regular containers, each on its own (none while an ordinary init
        // container could not start).
        for &index in actions.start.iter().filter(|_| !init_blocked) {
            let container = &spec.containers[index];
            match self
                .start_with_back_off(pod, container, ContainerKind::Regular, &runtime)
                .await?
            {
                Started::Yes => {}
                Started::BackingOff { reason, due } => {
                    waiting.insert(container.name.clone(), reason);
                    soonest(due);
                }
                Started::No(reason) => {
                    waiting.insert(container.name.clone(), reason);
                    soonest(retry);
                }
            }
        }
        let runtime = runtime_api.pod_status(&self.uid).await;
        if self
            .set_status(pod, &runtime, false, &waiting)
            .is_terminal()
        {
            return Ok(Synced::Terminal);
        }
        // An init container that exited before this pass read the runtime again, or a sidecar
        // that runs (upstream: the PLEG's `ContainerStarted`): no change will be announced for
        // it, and the next one waits on it.
        if let Some(name) = init_started
            && runtime.instances(name).0.is_some_and(|i| {
                matches!(i.state, InstanceState::Exited { .. })
                    || (matches!(i.state, InstanceState::Running { .. })
                        && init
                            .iter()
                            .any(|c| c.name == name && is_restartable_init_container(c)))
            })
        {
            wake = Some(Instant::now());
        }
        // The active deadline ends the pod when it comes (upstream: the sync loop's
        // `activeDeadlineHandler.ShouldSync`).
        // A deadline already past that did not end the pod (its API phase is terminal) wakes
        // nothing: the pod ends by the other way.
        let now = runtime_api.now();
        if let Some(deadline) = self
            .with_old_status(pod, |old| active_deadline(pod, old))
            .filter(|d| *d > now)
        {
            let at = Instant::now() + since(deadline, now);
            wake = Some(wake.map_or(at, |w| w.min(at)));
        }
        let next = match (runtime_api.next_change(&self.uid), wake) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(Synced::Running(next))
    }

    /// C18 inside a sync: every container and the sandbox stopped, with the pod's grace period.
    async fn stop_pod(&mut self, pod: &Pod, runtime: &RuntimePodStatus) -> Result<(), SyncError> {
        for c in &runtime.containers {
            if matches!(
                c.state,
                InstanceState::Running { .. } | InstanceState::Unknown
            ) {
                self.event(
                    pod,
                    EventKind::Normal,
                    "Killing",
                    &format!("Stopping container {}", c.name),
                );
            }
        }
        self.shared.runtime.kill_pod(pod, grace_period(pod)).await?;
        Ok(())
    }

    /// C11, C17: kills one container instance, with its probe's
    /// `terminationGracePeriodSeconds` for a probe kill, else the pod's.
    async fn kill_container(&mut self, pod: &Pod, kill: &ContainerToKill) -> Result<(), SyncError> {
        self.event(pod, EventKind::Normal, "Killing", &kill.message);
        info!(container = %kill.name, "{}", kill.message);
        let spec_container = pod
            .spec
            .iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .find(|c| c.name == kill.name);
        let probe = match kill.reason {
            KillReason::Liveness => Some(ProbeKind::Liveness),
            KillReason::Startup => Some(ProbeKind::Startup),
            KillReason::DefinitionChanged | KillReason::Unknown => None,
        };
        let grace = probe
            .zip(spec_container)
            .and_then(|(kind, c)| kind.of(c))
            .and_then(|p| p.termination_grace_period_seconds)
            .map_or_else(
                || grace_period(pod),
                |s| Duration::from_secs(u64::try_from(s.max(1)).unwrap_or(1)),
            );
        self.shared
            .runtime
            .kill_container(pod, &kill.id, grace)
            .await?;
        Ok(())
    }

    /// C14: the crash-loop back-off (C15), then the container's mounts and its start.
    async fn start_with_back_off(
        &mut self,
        pod: &Pod,
        container: &Container,
        kind: ContainerKind,
        runtime: &RuntimePodStatus,
    ) -> Result<Started, SyncError> {
        let now = self.shared.runtime.now();
        if let Some(backing_off) = self
            .back_off
            .check(container, runtime, now, &self.shared.config)
        {
            let name = &container.name;
            self.event(
                pod,
                EventKind::Warning,
                "BackOff",
                &format!(
                    "Back-off restarting failed container {name} in pod {}",
                    format_pod(pod)
                ),
            );
            let remaining = backing_off
                .due
                .duration_since(now)
                .try_into()
                .unwrap_or(Duration::ZERO);
            return Ok(Started::BackingOff {
                reason: WaitingReason {
                    reason: "CrashLoopBackOff".into(),
                    message: format!(
                        "back-off {} restarting failed container={name} pod={}",
                        go_duration(backing_off.delay),
                        format_pod(pod)
                    ),
                },
                due: Instant::now() + remaining,
            });
        }
        let mounts = match self.prepare_mounts(pod, container).await {
            Ok(mounts) => mounts,
            Err(reason) => return Ok(Started::No(reason)),
        };
        Ok(match self.start(pod, container, kind, &mounts).await? {
            Ok(()) => Started::Yes,
            Err(reason) => Started::No(reason),
        })
    }

    /// Upstream `makeMounts` before a container is created: its subPaths prepared safely. A
    /// failure is the container's `CreateContainerConfigError` (and a `Failed` event), retried
    /// after the sync back-off. The preparation runs on the blocking pool (item 14).
    async fn prepare_mounts(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Result<Vec<ContainerMount>, WaitingReason> {
        self.shared
            .volumes
            .container_mounts(
                pod,
                container,
                self.shared.runtime.supports_recursive_read_only_mounts(),
            )
            .await
            .map_err(|err| {
                self.event(pod, EventKind::Warning, "Failed", &format!("Error: {err}"));
                WaitingReason {
                    reason: "CreateContainerConfigError".into(),
                    message: err.to_string(),
                }
            })
    }

    /// Creates and starts a container. `Ok(Err(waiting))`: it could not, for a reason the
    /// container shows while waiting (an image pull, a create or start error: upstream's
    /// `reasonCache`), with its event; retried after the sync back-off.
    async fn start(
        &self,
        pod: &Pod,
        container: &Container,
        kind: ContainerKind,
        mounts: &[ContainerMount],
    ) -> Result<Result<(), WaitingReason>, SyncError> {
        // Upstream `makeEnvironmentVariables`' `FileKeyRef` case (EnvFiles), before the
        // container is made: its error is the container's `CreateContainerConfigError`.
        let env_files = match self.shared.volumes.env_files(pod, container).await {
            Ok(files) => files,
            Err(err) => {
                let message = err.to_string();
                self.event(
                    pod,
                    EventKind::Warning,
                    "Failed",
                    &format!("Error: {message}"),
                );
                warn!(container = %container.name, %message, "container not started");
                return Ok(Err(WaitingReason {
                    reason: "CreateContainerConfigError".into(),
                    message,
                }));
            }
        };
        match self
            .shared
            .runtime
            .start_container_with_env_files(pod, container, kind, mounts, &env_files)
            .await
        {
            Ok(()) => {}
            Err(RuntimeError::ContainerWaiting {
                reason, message, ..
            }) => {
                if let Some(event) = start_failure_event(&reason) {
                    self.event(pod, EventKind::Warning, event, &message);
                }
                warn!(container = %container.name, %reason, %message, "container not started");
                return Ok(Err(WaitingReason { reason, message }));
            }
            Err(e) => return Err(e.into()),
        }
        let name = &container.name;
        self.event(
            pod,
            EventKind::Normal,
            "Created",
            &format!("Created container: {name}"),
        );
        self.event(
            pod,
            EventKind::Normal,
            "Started",
            &format!("Started container {name}"),
        );
        Ok(Ok(()))
    }

    /// TERMINATING (W21): status, kill, final status. `false` when the agent stops first.
    async fn terminate(&mut self) -> bool {
        self.shared
            .lifecycles
            .set(&self.uid, Lifecycle::Terminating);
        self.shared.volumes.pod_updated();
        let no_waiting = HashMap::new();
        loop {
            // The newest pod, or the last one known when it left the source.
            let pod = self.latest();
            let runtime = self.shared.runtime.pod_status(&self.uid).await;
            self.set_status(&pod, &runtime, false, &no_waiting);
            for c in &runtime.containers {
                if matches!(c.state, InstanceState::Running { .. }) {
                    self.event(
                        &pod,
                        EventKind::Normal,
                        "Killing",
                        &format!("Stopping container {}", c.name),
                    );
                }
            }
            let grace = grace_period(&pod);
            // B7: liveness and startup stop before the kill; readiness goes on meanwhile.
            self.stop_probes(&[ProbeKind::Liveness, ProbeKind::Startup]);
            match self.shared.runtime.kill_pod(&pod, grace).await {
                Ok(()) => {
                    self.stop_probes(&ProbeKind::ALL);
                    let runtime = self.shared.runtime.pod_status(&self.uid).await;
                    self.set_status(&pod, &runtime, true, &no_waiting);
                    self.shared.lifecycles.set(&self.uid, Lifecycle::Terminated);
                    self.shared.volumes.pod_updated();
                    return true;
                }
                Err(e) => {
                    warn!(error = %e, "killing pod failed");
                    self.event(
                        &pod,
                        EventKind::Warning,
                        "FailedKillPod",
                        &format!("error killing pod: {e}"),
                    );
                    let retry = Instant::now() + self.shared.config.sync_error_backoff;
                    if let Wake::Cancelled = self.wait(Some(retry)).await {
                        return false;
                    }
                }
            }
        }
    }

    /// TERMINATED (W23): final status, volumes unmounted, pod directory removed, then
    /// `terminate_pod` (the status manager deletes the pod from the API); FINISHED until the
    /// pod leaves the source.
    async fn reclaim(mut self) {
        let pod = self.latest();
        self.shared.lifecycles.set(&self.uid, Lifecycle::Terminated);
        self.shared.volumes.pod_updated();
        let runtime = self.shared.runtime.pod_status(&self.uid).await;
        self.set_status(&pod, &runtime, true, &HashMap::new());
        loop {
            let unmounted = tokio::select! {
                r = self.shared.volumes.wait_for_unmount(&pod) => r,
                () = self.cancel.cancelled() => return,
            };
            let result = match unmounted {
                Err(e) => Err(e.to_string()),
                Ok(()) => self.remove_pod_dir().await,
            };
            match result {
                Ok(()) => break,
                Err(e) => {
                    warn!(error = %e, "pod resources not reclaimed yet; retrying");
                    let retry = Instant::now() + self.shared.config.sync_error_backoff;
                    if let Wake::Cancelled = self.wait(Some(retry)).await {
                        return;
                    }
                }
            }
        }
        // The exited containers stay (upstream leaves them to its container GC): until the
        // terminal status is durable (in the API, or local mode's state file) they are the only
        // record that the pod ran, and a restart in between reads its phase from them instead
        // of running a `Never` pod again. They go with the pod: the runtime's orphan pass
        // removes them once the pod has left the source and its worker is forgotten, and a new
        // incarnation under the same UID clears them first (`Incarnation::Successor`).
        crate::fault::point("reclaimed");
        let pod = self.latest();
        self.shared.status.terminate_pod(&pod);
        self.shared.lifecycles.set(&self.uid, Lifecycle::Finished);
        debug!("pod finished");
    }

    /// Removes `<root>/pods/<uid>`, never across a mount point.
    async fn remove_pod_dir(&self) -> Result<(), String> {
        let uid = self
            .uid
            .as_path_component()
            .map_err(|e| format!("refusing to remove the pod's directory: {e}"))?;
        let dir = self.shared.config.root_dir.join("pods").join(uid);
        tokio::task::spawn_blocking(move || match std::fs::symlink_metadata(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            _ => rustlet_mount::remove_all_one_filesystem(&dir)
                .map_err(|e| format!("removing {}: {e}", dir.display())),
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

/// The containers that have probes: the regular ones and the sidecars (upstream's prober
/// manager `AddPod` skips only the ordinary init containers).
fn probed_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .filter(|c| is_restartable_init_container(c))
            .chain(&s.containers)
    })
}

/// W7 without kill options: the deletion's grace period, else the spec's, at least 1 s.
fn grace_period(pod: &Pod) -> Duration {
    let seconds = pod
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30)
        .max(1);
    Duration::from_secs(u64::try_from(seconds).unwrap_or(1))
}
