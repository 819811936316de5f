//! The `VolumeManager` facade (upstream `volume_manager.go`, V1-V16), event-driven: the
//! populator runs when pods change, the reconciler when the desired or actual state changes,
//! and a waiter is woken by the changes to its own pod (the caches' per-pod signals) instead
//! of polling every 300 ms; upstream's 300 ms poll stays only as the floor under the signals,
//! and a periodic resync as a safety net.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use rustlet_core::{PodChanges, PodUid, UniquePodName, UniqueVolumeName};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::cache::{ActualStateOfWorld, Attachability, DesiredStateOfWorld, PodVolumeState};
use crate::claims::NodeIdentity;
use crate::events::EventRecorder;
use crate::executor::OperationExecutor;
use crate::metrics::VolumeMetrics;
use crate::mounter::Mounter;
use crate::node::{NodeStatus, VolumesInUseWriter};
use crate::objects::{ObjectChange, VolumeObjects};
use crate::plugin::{PluginManager, VolumeHost};
use crate::populator::{PodSource, PodStateProvider, Populator, pod_volume_names};
use crate::reconciler::{PassScope, Reconciler};
use crate::reconstruct::{
    OrphanKept, ReconstructReport, clean_orphan_volumes, cleanup_orphaned_pod_dirs, reconstruct,
};
use crate::subpath::{ContainerMount, ContainerMountError, make_mounts};

/// Configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeManagerConfig {
    /// The agent's root directory (pods live under `<root>/pods/<uid>`).
    pub root_dir: PathBuf,
    /// Safety-net period of the populator and reconciler when nothing wakes them.
    pub resync_period: Duration,
    /// How long `wait_for_attach_and_mount` and `wait_for_unmount` wait (upstream 2 min 3 s).
    pub wait_timeout: Duration,
    /// How often every pod is processed again, so volumes whose plugin requires a periodic
    /// remount (content volumes) are set up again (upstream: every pod sync, `syncFrequency`
    /// 1 min, through `ReprocessPod`).
    pub remount_period: Duration,
    /// Node allocatable memory, the size of a Memory emptyDir in a pod without limits.
    pub node_allocatable_memory: Option<u64>,
    /// This node (its name and labels), for the node affinity of PersistentVolumes.
    pub node: NodeIdentity,
    /// Every this many resyncs, the populator looks at every pod (a consistency check); the
    /// others, like every event, look at the pods the pod source and the pod workers logged
    /// as changed. 1: every resync looks at every pod, as upstream's loop does.
    pub full_populate_every: u32,
}

impl VolumeManagerConfig {
    /// Defaults under `root_dir`: resync every second, waits of 2 min 3 s.
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        Self {
            root_dir: root_dir.into(),
            resync_period: Duration::from_secs(1),
            wait_timeout: Duration::from_secs(123),
            remount_period: Duration::from_secs(60),
            node_allocatable_memory: None,
            node: NodeIdentity::default(),
            full_populate_every: 10,
        }
    }
}

/// What the manager is built from.
pub struct VolumeManagerDeps {
    /// The pods bound to the node.
    pub pods: Arc<dyn PodSource>,
    /// The pod workers' view of pod lifecycles.
    pub states: Arc<dyn PodStateProvider>,
    /// The mount backend.
    pub mounter: Arc<dyn Mounter>,
    /// The volume plugins.
    pub plugins: PluginManager,
    /// Where events go.
    pub events: Arc<dyn EventRecorder>,
    /// `node.status.volumesAttached`, for attachable volumes.
    pub node: Arc<dyn NodeStatus>,
    /// ConfigMaps, Secrets, claims and tokens. With them the content plugins (configMap,
    /// secret, downwardAPI, projected) and the local PV plugin join `plugins`; the populator
    /// registers every pod's references before its volumes are mounted; and a change of a
    /// registered ConfigMap or Secret sets the volumes of the pods that reference it up again
    /// at once (upstream waits for the next pod sync, 60-90 s).
    pub objects: Option<Arc<dyn VolumeObjects>>,
}

/// Why a wait ended without success (upstream's message shapes, V5 and V7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitError {
    /// Some expected volumes are not mounted.
    NotMounted {
        /// Expected outer names not mounted (sorted).
        unmounted: Vec<String>,
        /// Outer names of attachable volumes that are not attached (sorted).
        unattached: Vec<String>,
        /// Expected outer names the desired state does not have (sorted).
        failed_to_process: Vec<String>,
        /// Why the wait ended.
        cause: WaitCause,
    },
    /// Volumes are still mounted.
    StillMounted {
        /// Their unique names (sorted, errata 2).
        mounted: Vec<String>,
        /// Why the wait ended.
        cause: WaitCause,
    },
}

/// Why a wait ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitCause {
    /// The deadline passed (upstream `context deadline exceeded`).
    DeadlineExceeded,
    /// The populator recorded errors for the pod, joined by `"; "`.
    PodErrors(String),
}

impl fmt::Display for WaitCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DeadlineExceeded => f.write_str("context deadline exceeded"),
            Self::PodErrors(e) => f.write_str(e),
        }
    }
}

fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotMounted {
                unmounted,
                unattached,
                failed_to_process,
                cause,
            } => write!(
                f,
                "unmounted volumes={}, unattached volumes={}, failed to process volumes={}: {cause}",
                go_list(unmounted),
                go_list(unattached),
                go_list(failed_to_process)
            ),
            Self::StillMounted { mounted, cause } => {
                write!(f, "mounted volumes={}: {cause}", go_list(mounted))
            }
        }
    }
}

impl std::error::Error for WaitError {}

/// A mounted volume as the runtime needs it (upstream `VolumeInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Where the volume is on the host (what to bind into containers).
    pub path: PathBuf,
    /// The inner spec name.
    pub inner_volume_spec_name: String,
    /// The unique volume name.
    pub volume_name: UniqueVolumeName,
    /// Containers must mount it read-only whatever their `volumeMounts` say (configMap,
    /// secret, downwardAPI, projected: upstream's `mustMountRO`).
    pub read_only: bool,
}

/// The volume manager.
pub struct VolumeManager {
    dsw: Arc<DesiredStateOfWorld>,
    asw: Arc<ActualStateOfWorld>,
    pub(crate) populator: Populator,
    pods: Arc<dyn PodSource>,
    states: Arc<dyn PodStateProvider>,
    reconciler: Reconciler,
    executor: Arc<OperationExecutor>,
    host: VolumeHost,
    plugins: PluginManager,
    config: VolumeManagerConfig,
    wake: Notify,
    synced: AtomicBool,
    metrics: VolumeMetrics,
    /// ConfigMaps and Secrets of content volumes: their changes are written into the volumes.
    objects: Option<Arc<dyn VolumeObjects>>,
}

/// How often a wait on a pod's mounts looks again without a signal of its pod: upstream's
/// `podAttachAndMountRetryInterval`, at which upstream polls. The pod's own signals wake the
/// wait at once; the poll is the floor under them, not the way waits end.
pub(crate) const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(300);

/// The wait's poll, first due one [`WAIT_POLL`] from now.
fn wait_poll() -> tokio::time::Interval {
    let mut poll = tokio::time::interval_at(Instant::now() + WAIT_POLL, WAIT_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    poll
}

fn pod_name_of(pod: &Pod) -> UniquePodName {
    UniquePodName::new(pod.metadata.uid.clone().unwrap_or_default())
}

impl VolumeManager {
    /// A manager with empty caches; call [`Self::run`] to start it.
    pub fn new(mut deps: VolumeManagerDeps, config: VolumeManagerConfig) -> Self {
        if let Some(objects) = &deps.objects {
            crate::plugins::add_object_plugins(&mut deps.plugins, objects.clone());
        }
        let dsw = Arc::new(DesiredStateOfWorld::new(deps.plugins.clone()));
        let asw = Arc::new(ActualStateOfWorld::new(deps.plugins.clone()));
        let host = VolumeHost {
            root_dir: config.root_dir.clone(),
            mounter: deps.mounter,
            node_allocatable_memory: config.node_allocatable_memory,
        };
        let metrics = VolumeMetrics::default();
        let executor = Arc::new(
            OperationExecutor::new(asw.clone(), deps.plugins.clone(), host.clone(), deps.events)
                .with_metrics(metrics.clone())
                .with_node_status(deps.node),
        );
        let mut populator = Populator::new(
            dsw.clone(),
            asw.clone(),
            deps.pods.clone(),
            deps.states.clone(),
        )
        .with_node(config.node.clone());
        if let Some(objects) = &deps.objects {
            populator = populator.with_objects(objects.clone());
        }
        let reconciler = Reconciler::new(
            dsw.clone(),
            asw.clone(),
            executor.clone(),
            populator.has_added_pods(),
        )
        .with_pod_states(deps.states.clone());
        Self {
            dsw,
            asw,
            populator,
            pods: deps.pods,
            states: deps.states,
            reconciler,
            executor,
            host,
            plugins: deps.plugins,
            config,
            wake: Notify::new(),
            synced: AtomicBool::new(false),
            metrics,
            objects: deps.objects,
        }
    }

    /// The pods that reference a changed object are processed again (their content volumes
    /// then need a remount, V19, and SetUp writes the new content).
    fn object_changed(&self, change: Option<&ObjectChange>) {
        for pod in self.pods.pods() {
            let references = change.is_none_or(|c| {
                pod.metadata.namespace.as_deref() == Some(c.namespace.as_str())
                    && rustlet_core::refs::referenced_names(&pod, c.kind).contains(&c.name)
            });
            if references {
                self.populator.reprocess_pod(&pod_name_of(&pod));
            }
        }
    }

    /// The desired state (for inspection).
    pub fn desired_state(&self) -> &Arc<DesiredStateOfWorld> {
        &self.dsw
    }

    /// The actual state (for inspection).
    pub fn actual_state(&self) -> &Arc<ActualStateOfWorld> {
        &self.asw
    }

    /// Tells the manager that the node status changed (volumes attached): a pass runs now.
    pub fn node_status_updated(&self) {
        self.wake.notify_one();
    }

    /// Tells the manager that pods changed: the populator and reconciler run now.
    pub fn pod_updated(&self) {
        self.wake.notify_one();
    }

    /// A newer version of a pod from the pod source, whose change needs no pass (its status):
    /// the desired state keeps it instead of the older one, so the older one is freed now.
    /// Nothing runs and nothing to mount changes.
    pub fn pod_object_updated(&self, pod: &Arc<Pod>) {
        self.populator.refresh_pod_object(pod);
    }

    /// One populator pass and one reconciler pass.
    pub fn sync_once(&self) {
        self.populator.populate();
        self.reconcile_once();
    }

    /// A populator pass over what changed, then a reconciler pass.
    fn sync_changed(&self) {
        self.populator.populate_changed();
        self.reconcile_once();
    }

    /// One reconciler pass (after an operation changed the actual state, the desired state did
    /// not change: no populator pass needed).
    fn reconcile_once(&self) {
        self.reconciler.reconcile();
        if self.populator.has_added_pods().load(Ordering::Acquire)
            && !self.reconciler.waits_for_node_status()
        {
            self.synced.store(true, Ordering::Release);
        }
    }

    /// V69: rebuilds the actual state from the pod directories (before the first pass). The
    /// reconstructed volumes then wait for the node status (V74): no unmount, and no
    /// `volumesInUse` (V13), until it has been read.
    pub fn reconstruct(&self) -> ReconstructReport {
        let report = reconstruct(&self.asw, &self.plugins, &self.host);
        self.reconciler
            .add_volumes_needing_node_status(report.volume_names.iter().cloned());
        report
    }

    /// V80: removes the directories of pods that are gone and have nothing mounted. Runs on
    /// the resync period (upstream: housekeeping every 2 s), once the desired state is complete.
    pub fn housekeeping(&self) -> Vec<OrphanKept> {
        if !self.populator.has_added_pods().load(Ordering::Acquire) {
            return Vec::new();
        }
        // Borrowed UIDs: this runs every second over every pod (clones and a sorted set of
        // them were most of the idle agent's user time at 1,000 pods).
        let pods = self.pods.pods();
        let uids: HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        let known = |uid: &PodUid| {
            uids.contains(uid.as_str())
                || self.dsw.pod_has_volumes(&UniquePodName::new(uid.as_str()))
        };
        cleanup_orphaned_pod_dirs(&self.host, &self.asw, &known, &*self.states)
    }

    /// Runs until `cancel` fires: reconstruction first, then a pass whenever pods change, an
    /// operation finishes, or the resync period passes (which also runs housekeeping).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let report = self.reconstruct();
        let mut failed = report.failed;
        let mut needs_pass = self.executor.subscribe_needs_pass();
        let mut populate = Populate::Everything;
        // A deadline that events do not push back: on a busy node (every pod event, this
        // agent's own status patches included, wakes the loop) housekeeping still runs.
        let mut next_resync = tokio::time::Instant::now() + self.config.resync_period;
        let mut next_remount = tokio::time::Instant::now() + self.config.remount_period;
        let mut object_changes = self.objects.as_ref().map(|o| o.changes());
        let claims_resolved = self.populator.claims_resolved();
        let mut pacer = PassPacer::new(tokio::time::Instant::now());
        let mut housekeeping = HousekeepingGate::default();
        let mut resyncs: u32 = 0;
        loop {
            let started = PassClock::start();
            match populate {
                Populate::Everything => self.sync_once(),
                Populate::Changed => self.sync_changed(),
                Populate::No => self.reconcile_once(),
            }
            let charged = paced_cost(populate, self.reconciler.last_pass(), started.cost());
            let calm_until = pacer.after_pass(tokio::time::Instant::now(), charged);
            if !failed.is_empty() && self.populator.has_added_pods().load(Ordering::Acquire) {
                clean_orphan_volumes(&mut failed, &self.dsw, &self.host, &self.metrics);
            }
            // A retry is due when the earliest backoff ends (upstream: the next 100 ms pass).
            let retry_at = self.executor.operations().next_retry_at();
            populate = tokio::select! {
                () = cancel.cancelled() => return,
                () = self.wake.notified() => Populate::Changed,
                () = claims_resolved.notified() => Populate::Changed,
                change = async {
                    match object_changes.as_mut() {
                        Some(changes) => changes.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    match change {
                        Ok(change) => self.object_changed(Some(&change)),
                        // Missed announcements: every pod with references looks again.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => self.object_changed(None),
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => object_changes = None,
                    }
                    Populate::Changed
                }
                Ok(()) = needs_pass.changed() => Populate::No,
                // Mounts held back by `MAX_OPERATIONS_IN_FLIGHT` start as operations end.
                () = self.executor.operations().room_freed() => Populate::No,
                () = async {
                    match retry_at {
                        Some(at) => tokio::time::sleep_until(at + Duration::from_millis(1)).await,
                        None => std::future::pending().await,
                    }
                } => Populate::No,
                () = tokio::time::sleep_until(next_remount) => {
                    // Issue 10 item 16: V19's remount marking, for pods nothing else reprocesses;
                    // only those with a volume that wants it (issue 15: reprocessing every pod
                    // each minute was a tenth of the settled agent's idle CPU).
                    next_remount = tokio::time::Instant::now() + self.config.remount_period;
                    for pod in self.dsw.pods_requiring_remount() {
                        self.populator.reprocess_pod(&pod);
                    }
                    Populate::Changed
                }
                () = tokio::time::sleep_until(next_resync) => {
                    next_resync = tokio::time::Instant::now() + self.config.resync_period;
                    let inputs = (self.dsw.generation(), self.asw.generation());
                    if housekeeping.due(&*self.pods, inputs) {
                        let ready = self.populator.has_added_pods().load(Ordering::Acquire);
                        let kept = self.housekeeping();
                        housekeeping.ran(ready && kept.is_empty(), inputs);
                        for kept in kept {
                            debug!(?kept, "orphaned pod directory kept");
                        }
                    }
                    // The safety net looks at every pod now and then (upstream's every pass
                    // does), and otherwise at what the logs say changed.
                    resyncs = resyncs.wrapping_add(1);
                    if resyncs.is_multiple_of(self.config.full_populate_every.max(1)) {
                        Populate::Everything
                    } else {
                        Populate::Changed
                    }
                }
            };
            // Under a storm, events come faster than passes (each is O(pods)): the next pass
            // waits so that passes take at most a quarter of a core, and serves everything
            // that came meanwhile. Otherwise nothing waits.
            if let Some(calm_until) = calm_until {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep_until(calm_until) => {}
                }
            }
        }
    }

    /// The manager's metrics (register them into the agent's registry).
    pub fn metrics(&self) -> &VolumeMetrics {
        &self.metrics
    }

    /// Registers the manager's metrics, the volume counts among them (counted on each scrape).
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.metrics.register(registry);
        registry.register_collector(Box::new(crate::metrics::TotalVolumes {
            dsw: self.dsw.clone(),
            asw: self.asw.clone(),
        }));
    }

    /// V13: the reconciler has run with a complete desired state, and the reconstructed volumes
    /// were checked against the node status (V74).
    pub fn reconciler_states_has_been_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    fn mounted_outer_names(
        &self,
        pod_name: &UniquePodName,
    ) -> (BTreeMap<String, UniqueVolumeName>, BTreeSet<String>) {
        let names = self.dsw.volume_names_for_pod(pod_name);
        let mounted = names
            .iter()
            .filter(|(_, vol)| self.asw.pod_exists_in_volume(pod_name, vol).is_mounted())
            .map(|(outer, _)| outer.clone())
            .collect();
        (names, mounted)
    }

    /// V1-V5: waits until every volume the pod's containers use is mounted; fails early with the
    /// populator's errors, and at the deadline with upstream's three lists.
    ///
    /// The pod is read when this is called, not while the future waits: a caller need not keep
    /// its version alive through a long wait (a storm's status writes make newer ones).
    pub fn wait_for_attach_and_mount(
        &self,
        pod: &Pod,
    ) -> impl std::future::Future<Output = Result<(), WaitError>> + Send + '_ {
        let (mounts, devices) = pod_volume_names(pod);
        let expected: BTreeSet<String> = mounts.union(&devices).cloned().collect();
        let pod_name = pod_name_of(pod);
        let downward_changed = !expected.is_empty() && self.populator.downward_fields_changed(pod);
        self.wait_for_mounts(expected, pod_name, downward_changed)
    }

    async fn wait_for_mounts(
        &self,
        expected: BTreeSet<String>,
        pod_name: UniquePodName,
        downward_changed: bool,
    ) -> Result<(), WaitError> {
        if expected.is_empty() {
            return Ok(());
        }
        // Labels or annotations that a downward API volume shows changed: set it up again
        // (the wait need not wait for that).
        if downward_changed {
            self.populator.reprocess_pod(&pod_name);
            self.wake.notify_one();
        }
        // Already mounted: done, without a reprocess (deviation from V3: volumes that need a
        // periodic remount are refreshed every `remount_period` by `run` instead of by every
        // wait).
        let mut early_errors = self.dsw.pop_pod_errors(&pod_name);
        if early_errors.is_empty() && expected.is_subset(&self.mounted_outer_names(&pod_name).1) {
            return Ok(());
        }
        self.populator.reprocess_pod(&pod_name);
        // The pod's own signals, taken before the state is read: what the wait looks at is
        // the pod's errors and volumes (desired state) and its mounts (actual state).
        let mut desired = self.dsw.pod_signal(&pod_name);
        let mut actual = self.asw.pod_signal(&pod_name);
        self.wake.notify_one();
        let deadline = Instant::now() + self.config.wait_timeout;
        let mut poll = wait_poll();
        let cause = loop {
            let mut errors = std::mem::take(&mut early_errors);
            errors.extend(self.dsw.pop_pod_errors(&pod_name));
            if !errors.is_empty() {
                break WaitCause::PodErrors(errors.join("; "));
            }
            let (_, mounted) = self.mounted_outer_names(&pod_name);
            if expected.is_subset(&mounted) {
                return Ok(());
            }
            tokio::select! {
                () = desired.changed() => {}
                () = actual.changed() => {}
                _ = poll.tick() => {}
                () = tokio::time::sleep_until(deadline) => break WaitCause::DeadlineExceeded,
            }
        };
        let (names, mounted) = self.mounted_outer_names(&pod_name);
        let unmounted: Vec<String> = expected.difference(&mounted).cloned().collect();
        if unmounted.is_empty() {
            return Ok(());
        }
        let attachable: BTreeSet<UniqueVolumeName> = self
            .dsw
            .volumes_to_mount_for_pod(&pod_name)
            .into_iter()
            .filter(|v| v.plugin_is_attachable)
            .map(|v| v.volume_name)
            .collect();
        let unattached = names
            .iter()
            .filter(|(_, vol)| {
                attachable.contains(*vol)
                    && self.asw.pod_exists_in_volume(&pod_name, vol) == PodVolumeState::NotAttached
            })
            .map(|(outer, _)| outer.clone())
            .collect();
        let failed_to_process = expected
            .iter()
            .filter(|n| !names.contains_key(*n))
            .cloned()
            .collect();
        Err(WaitError::NotMounted {
            unmounted,
            unattached,
            failed_to_process,
            cause,
        })
    }

    /// V7: waits until the pod has no volume in state `Mounted` (uncertain ones do not block).
    pub async fn wait_for_unmount(&self, pod: &Pod) -> Result<(), WaitError> {
        let pod_name = pod_name_of(pod);
        self.populator.reprocess_pod(&pod_name);
        let mut actual = self.asw.pod_signal(&pod_name);
        self.wake.notify_one();
        let deadline = Instant::now() + self.config.wait_timeout;
        let mut poll = wait_poll();
        loop {
            let mounted = self.asw.mounted_volumes_for_pod(&pod_name);
            if mounted.is_empty() {
                return Ok(());
            }
            tokio::select! {
                () = actual.changed() => {}
                _ = poll.tick() => {}
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        let mut mounted: Vec<String> = self
            .asw
            .mounted_volumes_for_pod(&pod_name)
            .into_iter()
            .map(|m| m.volume_name.to_string())
            .collect();
        mounted.sort();
        mounted.dedup();
        if mounted.is_empty() {
            return Ok(());
        }
        Err(WaitError::StillMounted {
            mounted,
            cause: WaitCause::DeadlineExceeded,
        })
    }

    /// V9: outer name → where the volume is, for volumes mounted and still desired.
    pub fn get_mounted_volumes_for_pod(
        &self,
        pod_name: &UniquePodName,
    ) -> BTreeMap<String, VolumeInfo> {
        let mut out = BTreeMap::new();
        for volume in self.dsw.volumes_to_mount_for_pod(pod_name) {
            if !self
                .asw
                .pod_exists_in_volume(pod_name, &volume.volume_name)
                .is_mounted()
            {
                continue;
            }
            let Ok(plugin) = self.plugins.find_by_spec(&volume.spec) else {
                continue;
            };
            let Ok(mounter) = plugin.new_mounter(&volume.spec, &volume.pod, &self.host) else {
                continue;
            };
            for outer in &volume.outer_volume_spec_names {
                out.insert(
                    outer.clone(),
                    VolumeInfo {
                        path: mounter.path(),
                        inner_volume_spec_name: volume.spec.name().to_owned(),
                        volume_name: volume.volume_name.clone(),
                        read_only: plugin.mounts_read_only(),
                    },
                );
            }
        }
        out
    }

    /// Upstream `makeMounts`: the mounts of `container`, its subPaths prepared safely (see
    /// [`crate::subpath`]), their propagation and recursive read-only mode resolved
    /// (`runtime_supports_rro`: whether the runtime supports recursive read-only mounts). A
    /// runtime calls it before it creates the container.
    ///
    /// The preparation (`stat`, `mkdir` beneath the volume, the pinned bind mount) runs on the
    /// blocking pool: a hung filesystem holds one pool thread, never the async runtime that
    /// drives the other pods, the probes and the HTTP endpoints (issue 24, item 14).
    pub async fn container_mounts(
        &self,
        pod: &Pod,
        container: &k8s_openapi::api::core::v1::Container,
        runtime_supports_rro: bool,
    ) -> Result<Vec<ContainerMount>, ContainerMountError> {
        let volumes = self.get_mounted_volumes_for_pod(&pod_name_of(pod));
        let pod_dir = self.host.pod_dir(&PodUid::of(pod))?;
        let mounter = self.host.mounter.clone();
        let owned = container.clone();
        let work = tokio::task::spawn_blocking(move || {
            make_mounts(
                &owned,
                &|name| volumes.get(name).map(|v| (v.path.clone(), v.read_only)),
                &pod_dir,
                &*mounter,
                runtime_supports_rro,
            )
        });
        match work.await {
            Ok(result) => result,
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => Err(ContainerMountError::Interrupted {
                container: container.name.clone(),
            }),
        }
    }

    /// Upstream's `FileKeyRef` case of `makeEnvironmentVariables` (EnvFiles): the values of
    /// `container`'s `fileKeyRef` variables, read from the pod's mounted volumes (see
    /// [`crate::env_files`]). A runtime's environment takes them as they are. The reads run on
    /// the blocking pool.
    pub async fn env_files(
        &self,
        pod: &Pod,
        container: &k8s_openapi::api::core::v1::Container,
    ) -> Result<crate::env_files::EnvFiles, crate::env_files::EnvFileError> {
        let selectors = crate::env_files::selectors(container);
        if selectors.is_empty() {
            return Ok(crate::env_files::EnvFiles::new());
        }
        let volumes = self.get_mounted_volumes_for_pod(&pod_name_of(pod));
        let work = tokio::task::spawn_blocking(move || {
            crate::env_files::resolve(&selectors, |name| volumes.get(name).map(|v| v.path.clone()))
        });
        match work.await {
            Ok(result) => result,
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => Ok(crate::env_files::EnvFiles::new()),
        }
    }

    /// V11: the GIDs of the pod's mounted volumes (`pv.beta.kubernetes.io/gid`) that the pod
    /// does not already list in `securityContext.supplementalGroups`; unparsable values skipped.
    pub fn get_extra_supplemental_groups_for_pod(&self, pod: &Pod) -> Vec<i64> {
        let existing: BTreeSet<i64> = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|c| c.supplemental_groups.clone())
            .unwrap_or_default()
            .into_iter()
            .collect();
        let mut out = Vec::new();
        for mounted in self.asw.mounted_volumes_for_pod(&pod_name_of(pod)) {
            let Some(gid) = mounted
                .volume_gid
                .as_deref()
                .and_then(|g| g.parse::<i64>().ok())
            else {
                continue;
            };
            if !existing.contains(&gid) && !out.contains(&gid) {
                out.push(gid);
            }
        }
        out
    }

    /// V8: waits for every pod's unmount in parallel; the errors of the pods that still have
    /// mounted volumes, by pod.
    pub async fn wait_for_all_pods_unmount(
        &self,
        pods: &[Arc<Pod>],
    ) -> Result<(), Vec<(String, WaitError)>> {
        let waits = pods.iter().map(|pod| async move {
            let name = pod.metadata.name.clone().unwrap_or_default();
            self.wait_for_unmount(pod).await.map_err(|e| (name, e))
        });
        let errors: Vec<_> = futures::future::join_all(waits)
            .await
            .into_iter()
            .filter_map(Result::err)
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// V10: mounted or uncertain volumes exist for the pod.
    pub fn has_possibly_mounted_volumes(&self, pod_name: &UniquePodName) -> bool {
        !self
            .asw
            .possibly_mounted_volumes_for_pod(pod_name)
            .is_empty()
    }

    /// V12: attachable volumes desired or attached, sorted: what `node.status.volumesInUse` lists.
    pub fn get_volumes_in_use(&self) -> Vec<UniqueVolumeName> {
        let mut set: BTreeSet<UniqueVolumeName> =
            self.dsw.attachable_volume_names().into_iter().collect();
        set.extend(
            self.asw
                .attached_volumes()
                .into_iter()
                .filter(|v| v.attachability == Attachability::Attachable)
                .map(|v| v.volume_name),
        );
        set.into_iter().collect()
    }

    /// V14: exactly these volumes are reported in use.
    pub fn mark_volumes_as_reported_in_use(&self, reported: &[UniqueVolumeName]) {
        self.dsw.mark_volumes_reported_in_use(reported);
        self.wake.notify_one();
    }

    /// V13, V14: keeps `node.status.volumesInUse` following [`Self::get_volumes_in_use`]
    /// through `writer` (once a second, when it changed) until `cancel` fires, and marks as
    /// reported exactly the volumes written: a volume added while the write was on its way is
    /// not in the node status yet, so it is not marked (upstream marks the updated node's
    /// `volumesInUse`).
    pub async fn report_volumes_in_use(
        &self,
        writer: &dyn VolumesInUseWriter,
        cancel: CancellationToken,
    ) {
        let mut last: Option<Vec<UniqueVolumeName>> = None;
        loop {
            // V13: not before the reconciler synced (after a restart, the reconstructed volumes
            // were checked against the node status): an empty list could let the
            // attach/detach controller detach a volume that is still mounted.
            if !self.reconciler_states_has_been_synced() {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
            // Sorted, as `get_volumes_in_use` returns them.
            let in_use = self.get_volumes_in_use();
            if last.as_ref() != Some(&in_use) {
                let written: Vec<String> = in_use.iter().map(ToString::to_string).collect();
                match writer.write_volumes_in_use(&written).await {
                    Ok(()) => {
                        self.mark_volumes_as_reported_in_use(&in_use);
                        last = Some(in_use);
                    }
                    Err(e) => tracing::warn!("reporting volumesInUse: {e}"),
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

/// What the populator looks at before a reconciler pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Populate {
    /// Nothing (an operation ended: only the actual state changed).
    No,
    /// The pods that changed (an event).
    Changed,
    /// Every pod (the first pass, and every `full_populate_every`-th resync).
    Everything,
}

/// When housekeeping (V80, orphaned pod directories) runs on the resync period: when the pods,
/// the desired or the actual state changed since the last run, when that run kept an orphan
/// (it is tried again), and at least every [`HousekeepingGate::MAX_SKIPS`] + 1 periods (a
/// directory nobody announced). Upstream reads the pod directories every 2 s whatever
/// happened; here an idle node reads nothing (it was a fifth of the idle CPU at 1,000 pods).
#[derive(Debug, Default)]
pub(crate) struct HousekeepingGate {
    /// The pod source's change log, as far as read.
    pod_cursor: u64,
    /// (desired, actual) generations of the last run that kept nothing.
    clean_at: Option<(u64, u64)>,
    skipped: u32,
}

impl HousekeepingGate {
    pub(crate) const MAX_SKIPS: u32 = 29;

    /// Whether housekeeping runs now, given the (desired, actual) generations.
    pub(crate) fn due(&mut self, pods: &dyn PodSource, inputs: (u64, u64)) -> bool {
        let pods_changed = match pods.changes_since(self.pod_cursor) {
            PodChanges::Since { cursor, uids } => {
                self.pod_cursor = cursor;
                !uids.is_empty()
            }
            PodChanges::All { cursor } => {
                self.pod_cursor = cursor;
                true
            }
        };
        if !pods_changed && self.clean_at == Some(inputs) && self.skipped < Self::MAX_SKIPS {
            self.skipped += 1;
            return false;
        }
        self.skipped = 0;
        true
    }

    /// Housekeeping ran on these inputs; `clean`: with every source ready, it kept nothing.
    pub(crate) fn ran(&mut self, clean: bool, inputs: (u64, u64)) {
        self.clean_at = clean.then_some(inputs);
    }
}

/// The part of a pass's cost the pacer charges: what it spent looking again at what earlier
/// passes looked at. A full pass (every pod, or every volume) is all that; a pass over what
/// changed is that only in the share of its volumes that met an obstacle before (they are
/// looked at by every pass until it clears, however often passes come). The rest is work the
/// changes asked for, once each: pacing it would only delay it (a storm of 1,000 pods rested
/// 4x its first pass, 120 ms, while the executor had nothing to do).
pub(crate) fn paced_cost(populate: Populate, scope: PassScope, cost: Duration) -> Duration {
    match (populate, scope) {
        (Populate::Everything, _) | (_, PassScope::Everything) => cost,
        (_, PassScope::Volumes { looked, again }) if looked > 0 => {
            cost.mul_f64(again.min(looked) as f64 / looked as f64)
        }
        _ => cost,
    }
}

/// What a pass costs: the CPU time of the thread that ran it (a pass runs on one worker thread
/// without yielding). Not wall-clock time: in a storm the operations a pass starts run on up
/// to 32 blocking threads that preempt it, and its wall time (28 ms for a pass whose CPU time
/// was a few ms, measured on 2 cores) made the pacer rest while the executor had nothing to do.
struct PassClock {
    cpu: Option<Duration>,
    wall: std::time::Instant,
}

impl PassClock {
    fn start() -> Self {
        Self {
            cpu: thread_cpu_time(),
            wall: std::time::Instant::now(),
        }
    }

    /// The pass's CPU time; its wall time where the thread's CPU time cannot be read.
    fn cost(&self) -> Duration {
        match (self.cpu, thread_cpu_time()) {
            (Some(before), Some(now)) => now.saturating_sub(before),
            _ => self.wall.elapsed(),
        }
    }
}

/// The CPU time (user and system) the calling thread has used.
fn thread_cpu_time() -> Option<Duration> {
    use nix::time::{ClockId, clock_gettime};
    let t = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).ok()?;
    Some(Duration::new(
        u64::try_from(t.tv_sec()).ok()?,
        u32::try_from(t.tv_nsec()).ok()?,
    ))
}

/// Paces the volume manager's passes (a leaky bucket of pass time): over any long stretch the
/// passes spend at most a quarter of a core on what the pacer is charged for ([`paced_cost`]:
/// looking again at what earlier passes looked at), and a pass after a quiet spell starts at once.
///
/// Each pass adds `PACE_FACTOR` times its charge to a debt that wall-clock time pays back; the
/// loop rests only while the debt exceeds [`PASS_BURST`]. Under a storm of full passes or of
/// re-looks (events faster than passes) the next pass waits three times the last one and
/// serves everything that came meanwhile. The first version rested three times every pass,
/// however cheap: with tokio's 1 ms timer each rest cost at least a millisecond, most of a pod's
/// add-to-mounted latency (1.3 ms with a floor of 0.1 ms, root dir on a tmpfs). The second was
/// charged each pass's wall time: a storm's first pass (30 ms of CPU, preempted by the 32
/// threads running what it started) then rested 110-200 ms while the executor had run dry,
/// and the storm took 3-5x its floor.
#[derive(Debug)]
pub(crate) struct PassPacer {
    debt: Duration,
    last: Instant,
}

/// Pass time the loop may owe before it rests (see [`PassPacer`]).
pub(crate) const PASS_BURST: Duration = Duration::from_millis(4);

/// A pass plus the rest after it: four times the pass, so passes take at most a quarter of a
/// core.
const PACE_FACTOR: u32 = 4;

impl PassPacer {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            debt: Duration::ZERO,
            last: now,
        }
    }

    /// Records a pass that ended at `now` and took `cost`; returns when the next may start
    /// (`None`: at once).
    pub(crate) fn after_pass(&mut self, now: Instant, cost: Duration) -> Option<Instant> {
        let paid = now.saturating_duration_since(self.last);
        self.last = now;
        self.debt = self.debt.saturating_sub(paid) + cost.saturating_mul(PACE_FACTOR);
        (self.debt > PASS_BURST).then(|| now + (self.debt - PASS_BURST))
    }
}
