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
use rustlet_core::deletion::PodDeletionSafety;
use rustlet_core::pod::{PodPhase, condition_type};
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

use crate::prober::{OnChange, ProbeKind, ProbeResult, ProbeResults, ProbeTask};
use crate::runtime::{
    ContainerKind, InstanceState, Runtime, RuntimeError, RuntimePodStatus, full_name,
};
use crate::status::{ContainerProbes, StatusInput, WaitingReason, generate_api_status};

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

    fn set(&self, uid: &PodUid, state: Lifecycle) {
        let mut states = self.lock();
        if states.insert(uid.clone(), state) != Some(state) {
            self.log().record(uid.clone());
        }
    }

    fn forget(&self, uid: &PodUid) {
        let mut states = self.lock();
        if states.remove(uid).is_some() {
            self.log().record(uid.clone());
        }
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
    /// Wait after a failed sync before the next one (upstream `backOffPeriod`, 10 s).
    pub sync_error_backoff: Duration,
    /// Housekeeping period: orphaned statuses, finished workers (upstream 2 s).
    pub housekeeping_period: Duration,
    /// Feature gates in force.
    pub gates: FeatureGates,
}

impl PodWorkersConfig {
    /// Upstream's timings under `root_dir`.
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        Self {
            root_dir: root_dir.into(),
            host_ips: Vec::new(),
            crash_loop_initial: Duration::from_secs(10),
            crash_loop_max: Duration::from_secs(300),
            sync_error_backoff: Duration::from_secs(10),
            housekeeping_period: Duration::from_secs(2),
            gates: FeatureGates::default(),
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
    /// Containers that started before this (the agent's start less 10 s) were adopted from an
    /// earlier agent: B11.
    adopted_before: k8s_openapi::jiff::Timestamp,
    pods: Arc<dyn PodSource>,
    lifecycles: Arc<PodLifecycles>,
    status: Arc<StatusManager>,
    volumes: Arc<VolumeManager>,
    runtime: Arc<dyn Runtime>,
    events: Arc<dyn EventRecorder>,
    config: PodWorkersConfig,
}

/// B11: the agent's start less 10 s, on the wall clock.
fn adopted_before() -> k8s_openapi::jiff::Timestamp {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
    k8s_openapi::jiff::Timestamp::from_second(now - 10)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
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
                adopted_before: adopted_before(),
                pods: deps.pods,
                lifecycles: deps.lifecycles,
                status: deps.status,
                volumes: deps.volumes,
                runtime: deps.runtime,
                events: deps.events,
                config,
            }),
            changes: deps.changes,
        }
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
        let mut runtime_events = self.shared.runtime.changes();
        let mut tick = tokio::time::interval(self.shared.config.housekeeping_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let pods = self.shared.pods.pods();
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
                    Some(tx) => {
                        // Only what a worker acts on wakes it: not the status writes this agent
                        // makes itself (each comes back through the watch).
                        tx.send_if_modified(|current| {
                            let same = current.in_source && Arc::ptr_eq(&current.pod, pod);
                            let wake = !same && (!current.in_source || matters(&current.pod, pod));
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
                            }
                            wake
                        });
                    }
                    None => {
                        volumes_changed = true;
                        let (tx, rx) = watch::channel(PodSlot {
                            pod: pod.clone(),
                            in_source: true,
                        });
                        workers.insert(uid.clone(), tx);
                        known.insert(uid.clone());
                        // A pod first seen terminal in the API or being deleted never syncs
                        // (W2, W21: its worker goes straight to termination): the volume
                        // manager must not mount for it meanwhile (upstream's UpdatePod
                        // starts such a worker terminating).
                        let first = if api_phase_terminal(pod)
                            || pod.metadata.deletion_timestamp.is_some()
                        {
                            Lifecycle::Terminating
                        } else {
                            Lifecycle::Syncing
                        };
                        self.shared.lifecycles.set(&uid, first);
                        let worker = Worker {
                            shared: self.shared.clone(),
                            incarnation: if successors.remove(&uid) {
                                Incarnation::Successor
                            } else {
                                Incarnation::First
                            },
                            uid: uid.clone(),
                            rx,
                            cancel: cancel.clone(),
                            backoff: HashMap::new(),
                            probes: HashMap::new(),
                            probe_wake: Arc::new(Notify::new()),
                            probe_killed: HashSet::new(),
                        };
                        let span = info_span!("pod", pod = %full_name(pod), %uid);
                        tokio::spawn(worker.run().instrument(span));
                    }
                }
            }
            // Pods gone from the source: their workers terminate them (orphans), and finished
            // ones are forgotten.
            workers.retain(|uid, tx| {
                if present.contains(uid.as_str()) {
                    return true;
                }
                volumes_changed = true;
                if self.shared.lifecycles.get(uid) == Some(Lifecycle::Finished) || tx.is_closed() {
                    self.shared.lifecycles.forget(uid);
                    known.remove(uid);
                    return false;
                }
                tx.send_if_modified(|current| std::mem::replace(&mut current.in_source, false));
                true
            });
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
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = self.changes.changed() => if changed.is_err() { return },
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
                _ = tick.tick() => {
                    self.shared.status.retain_statuses(|uid| present.contains(uid.as_str()));
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
            }
        }
    }
}

/// Whether a new copy of a pod is worth a worker's pass: anything but the status and the
/// metadata the API server bumps on every write (the agent's own status writes come back
/// through the watch), and a terminal phase written by someone else.
fn matters(old: &Pod, new: &Pod) -> bool {
    old.spec != new.spec
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

/// One restart back-off per container name (upstream's crash-loop back-off).
#[derive(Clone, Copy, Debug)]
struct RestartBackoff {
    delay: Duration,
    /// The restart it allowed last.
    last_restart: Instant,
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
    incarnation: Incarnation,
    uid: PodUid,
    rx: watch::Receiver<PodSlot>,
    cancel: CancellationToken,
    backoff: HashMap<String, RestartBackoff>,
    /// The probe tasks of this pod (B2), each stopped by its token and triggered by its
    /// notify.
    probes: HashMap<(String, ProbeKind), (CancellationToken, Arc<Notify>)>,
    /// Woken when a probe result of this pod changes (B6).
    probe_wake: Arc<Notify>,
    /// Containers killed for a failed liveness or startup probe: restarted unless `Never`.
    probe_killed: HashSet<String>,
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

    /// Starts the probe tasks of the pod's regular containers that have none (B2), on a
    /// runtime that runs probes.
    fn ensure_probes(&mut self, pod: &Arc<Pod>) {
        if !self.shared.runtime.runs_probes() {
            return;
        }
        for container in pod.spec.iter().flat_map(|s| &s.containers) {
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
                    results: self.shared.probe_results.clone(),
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

    /// B10's input: each regular container's startup and readiness results, for its newest
    /// instance. B11: a container adopted from an earlier agent (started before this one's
    /// start less 10 s) without a result yet keeps what `old` said: `started` if it was, and
    /// `ready` while the pod was Ready, so an agent restart does not flip a pod unready until
    /// its probes run again.
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
        pod.spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| {
                let newest = runtime.instances(&c.name).0;
                let id = newest.map(|i| i.id.as_str());
                let adopted = newest.is_some_and(|i| {
                    matches!(i.state, InstanceState::Running { started_at } if started_at < self.shared.adopted_before)
                });
                let was_started = old
                    .container_statuses
                    .iter()
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

    fn old_status(&self, pod: &Pod) -> PodStatus {
        self.shared
            .status
            .get_pod_status(&self.uid)
            .or_else(|| pod.status.clone())
            .unwrap_or_default()
    }

    fn set_status(
        &self,
        pod: &Pod,
        runtime: &RuntimePodStatus,
        terminal: bool,
        waiting: &HashMap<String, WaitingReason>,
    ) -> PodStatus {
        let old = self.old_status(pod);
        let probes = self.probe_view(pod, runtime, &old);
        let status = generate_api_status(&StatusInput {
            pod,
            runtime,
            old: &old,
            pod_is_terminal: terminal,
            host_ips: &self.shared.config.host_ips,
            waiting,
            gates: &self.shared.config.gates,
            probes: &probes,
        });
        self.shared.status.set_pod_status(pod, status.clone());
        status
    }

    fn event(&self, pod: &Pod, kind: EventKind, reason: &str, message: &str) {
        self.shared.events.event(pod, kind, reason, message);
    }

    async fn run(mut self) {
        let Some(pod) = self.pod() else { return };
        if self.incarnation == Incarnation::Successor {
            // What the finished incarnation left in the runtime is not this pod's.
            self.shared.runtime.remove_pod(&self.uid).await;
        }
        let runtime = self.shared.runtime.pod_status(&self.uid).await;
        // W2: a pod already terminal in the API with nothing running is born terminated.
        let born_terminated = api_phase_terminal(&pod) && !runtime.any_running();
        if !born_terminated && !self.sync_loop().await {
            return;
        }
        if !born_terminated && !self.terminate().await {
            return;
        }
        self.reclaim().await;
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
            let synced = self.sync_pod(&pod).await;
            if let Err(e @ SyncError::Mount(_)) = &synced {
                self.event(&pod, EventKind::Warning, FAILED_MOUNT, &e.to_string());
            }
            // Not kept while waiting: the source's newer versions replace it.
            drop(pod);
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

    /// Upstream `SyncPod` (W20) for the simulated shape: status, volumes, sandbox, init
    /// containers in order, regular containers with the restart policy and crash-loop back-off.
    async fn sync_pod(&mut self, pod: &Arc<Pod>) -> Result<Synced, SyncError> {
        let no_waiting = HashMap::new();
        let runtime = self.shared.runtime.pod_status(&self.uid).await;
        self.set_status(pod, &runtime, false, &no_waiting);
        let mounted = tokio::select! {
            r = self.shared.volumes.wait_for_attach_and_mount(pod) => r,
            // The pod changed (deleted?) or the agent stops: the next pass decides.
            _ = self.rx.changed() => return Ok(Synced::Running(Some(Instant::now()))),
            () = self.cancel.cancelled() => return Ok(Synced::Running(None)),
        };
        mounted?;
        let runtime_api = self.shared.runtime.clone();
        runtime_api.run_pod_sandbox(pod).await?;
        self.ensure_probes(pod);
        // Borrowed (the pod outlives the pass): a copy was a deep clone of the whole spec per
        // pass, and 1.5 KB more in every worker's task.
        let spec = pod.spec.as_ref();
        let restart_policy = spec
            .and_then(|s| s.restart_policy.as_deref())
            .unwrap_or("Always")
            .to_owned();

        // Init containers, in order; each must exit 0 before the next starts.
        for container in spec
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
        {
            let runtime = runtime_api.pod_status(&self.uid).await;
            let (newest, _) = runtime.instances(&container.name);
            match newest.map(|c| &c.state) {
                Some(InstanceState::Exited { exit_code: 0, .. }) => continue,
                Some(InstanceState::Running { .. }) => {
                    return Ok(Synced::Running(runtime_api.next_change(&self.uid)));
                }
                Some(InstanceState::Exited { .. }) if restart_policy == "Never" => {
                    self.set_status(pod, &runtime, false, &no_waiting);
                    return Ok(Synced::Terminal);
                }
                _ => match self.prepare_mounts(pod, container).await {
                    Err(waiting) => {
                        let runtime = runtime_api.pod_status(&self.uid).await;
                        let waiting = HashMap::from([(container.name.clone(), waiting)]);
                        self.set_status(pod, &runtime, false, &waiting);
                        let retry = Instant::now() + self.shared.config.sync_error_backoff;
                        return Ok(Synced::Running(Some(retry)));
                    }
                    Ok(mounts) => {
                        if let Err(waiting) = self
                            .start(pod, container, ContainerKind::Init, &mounts)
                            .await?
                        {
                            let runtime = runtime_api.pod_status(&self.uid).await;
                            let waiting = HashMap::from([(container.name.clone(), waiting)]);
                            self.set_status(pod, &runtime, false, &waiting);
                            let retry = Instant::now() + self.shared.config.sync_error_backoff;
                            let next = runtime_api
                                .next_change(&self.uid)
                                .map_or(retry, |n| n.min(retry));
                            return Ok(Synced::Running(Some(next)));
                        }
                    }
                },
            }
            let runtime = runtime_api.pod_status(&self.uid).await;
            if !matches!(
                runtime.instances(&container.name).0.map(|c| &c.state),
                Some(InstanceState::Exited { exit_code: 0, .. })
            ) {
                self.set_status(pod, &runtime, false, &no_waiting);
                return Ok(Synced::Running(runtime_api.next_change(&self.uid)));
            }
        }

        // Regular containers.
        let now = Instant::now();
        let mut waiting = HashMap::new();
        let mut wake: Option<Instant> = None;
        let runtime = runtime_api.pod_status(&self.uid).await;
        for container in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
            let newest = runtime.instances(&container.name).0;
            let exited = match newest.map(|c| &c.state) {
                // Created and never started (an agent that died between the two): started
                // afresh, as one that never ran.
                None | Some(InstanceState::Created) => None,
                Some(InstanceState::Exited { exit_code, .. }) => Some(*exit_code),
                Some(InstanceState::Running { .. }) => {
                    // C11: a failed liveness or startup probe kills the container.
                    let id = newest.map(|c| c.id.as_str()).unwrap_or_default();
                    if let Some(kind) = self.failed_probe(id) {
                        self.kill_for_probe(pod, container, id, kind, &restart_policy)
                            .await?;
                        wake = Some(now);
                    }
                    continue;
                }
            };
            let probe_killed = self.probe_killed.remove(&container.name);
            let restart = match (exited, restart_policy.as_str()) {
                (None, _) => true,
                (Some(_), "Never") => false,
                (Some(_), _) if probe_killed => true,
                (Some(_), "Always") => true,
                (Some(code), "OnFailure") => code != 0,
                _ => false,
            };
            if !restart {
                continue;
            }
            if exited.is_some() {
                let initial = self.shared.config.crash_loop_initial;
                let max = self.shared.config.crash_loop_max;
                if let Some(b) = self.backoff.get(&container.name).copied()
                    && now < b.last_restart + b.delay
                {
                    let due = b.last_restart + b.delay;
                    wake = Some(wake.map_or(due, |w| w.min(due)));
                    waiting.insert(
                        container.name.clone(),
                        WaitingReason {
                            reason: "CrashLoopBackOff".into(),
                            message: format!(
                                "back-off {}s restarting failed container={} pod={}_{}({})",
                                b.delay.as_secs(),
                                container.name,
                                pod.metadata.name.as_deref().unwrap_or_default(),
                                pod.metadata.namespace.as_deref().unwrap_or_default(),
                                self.uid
                            ),
                        },
                    );
                    continue;
                }
                let delay = self
                    .backoff
                    .get(&container.name)
                    .map_or(initial, |b| (b.delay * 2).min(max));
                self.backoff.insert(
                    container.name.clone(),
                    RestartBackoff {
                        delay,
                        last_restart: now,
                    },
                );
            }
            let mounts = match self.prepare_mounts(pod, container).await {
                Ok(mounts) => mounts,
                Err(reason) => {
                    waiting.insert(container.name.clone(), reason);
                    let retry = now + self.shared.config.sync_error_backoff;
                    wake = Some(wake.map_or(retry, |w| w.min(retry)));
                    continue;
                }
            };
            if let Err(reason) = self
                .start(pod, container, ContainerKind::Regular, &mounts)
                .await?
            {
                waiting.insert(container.name.clone(), reason);
                let retry = now + self.shared.config.sync_error_backoff;
                wake = Some(wake.map_or(retry, |w| w.min(retry)));
            }
        }
        let runtime = runtime_api.pod_status(&self.uid).await;
        let status = self.set_status(pod, &runtime, false, &waiting);
        if PodPhase::of(&status).is_terminal() {
            return Ok(Synced::Terminal);
        }
        let next = match (runtime_api.next_change(&self.uid), wake) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(Synced::Running(next))
    }

    /// Which of a running instance's probes failed in a way that kills it, if any.
    fn failed_probe(&self, id: &str) -> Option<ProbeKind> {
        if id.is_empty() || !self.shared.runtime.runs_probes() {
            return None;
        }
        let results = &self.shared.probe_results;
        [ProbeKind::Liveness, ProbeKind::Startup]
            .into_iter()
            .find(|kind| results.get(id, *kind) == Some(ProbeResult::Failure))
    }

    /// Kills a container whose liveness or startup probe failed (C11), with the probe's
    /// `terminationGracePeriodSeconds` or the pod's.
    async fn kill_for_probe(
        &mut self,
        pod: &Pod,
        container: &Container,
        id: &str,
        kind: ProbeKind,
        restart_policy: &str,
    ) -> Result<(), SyncError> {
        let what = match kind {
            ProbeKind::Startup => "startup",
            _ => "liveness",
        };
        let mut message = format!("Container {} failed {what} probe", container.name);
        if restart_policy != "Never" {
            message.push_str(", will be restarted");
        }
        self.event(pod, EventKind::Normal, "Killing", &message);
        info!(container = %container.name, "{message}");
        let grace = kind
            .of(container)
            .and_then(|p| p.termination_grace_period_seconds)
            .map_or_else(
                || grace_period(pod),
                |s| Duration::from_secs(u64::try_from(s.max(1)).unwrap_or(1)),
            );
        self.shared.runtime.kill_container(pod, id, grace).await?;
        self.probe_killed.insert(container.name.clone());
        Ok(())
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
            .container_mounts(pod, container)
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
        match self
            .shared
            .runtime
            .start_container(pod, container, kind, mounts)
            .await
        {
            Ok(()) => {}
            Err(RuntimeError::ContainerWaiting {
                reason, message, ..
            }) => {
                let event = if reason == "ImagePullBackOff" {
                    "BackOff"
                } else {
                    "Failed"
                };
                self.event(pod, EventKind::Warning, event, &message);
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
