//! The operation executor (upstream `operationexecutor` + `operation_generator.go`, V51-V53):
//! starts one operation per key through [`NestedPendingOperations`], runs the plugin's
//! blocking work off the async threads, and records the outcome in the actual state.
//!
//! Built so far: attach verification for non-attachable volumes, MountVolume and UnmountVolume.
//! The attach path (WaitForAttach, MountDevice, UnmountDevice) comes next.
//!
//! Deviation from upstream (issue 29): upstream runs every operation in a goroutine of its
//! own. Here the MountVolume operations a reconciler pass starts for one pod's per-pod volumes
//! run in one task and one blocking-pool hop, their SetUps one after the other
//! ([`OperationExecutor::run_mounts`]); each keeps its own key, outcome and back-off. A pod
//! starts only when all its volumes are mounted, so this costs it the sum of its SetUps instead
//! of the longest one; a shared (attachable, device-mountable) volume's operation runs alone.

use std::sync::Arc;

use rustlet_core::PodUid;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::cache::{
    ActualStateOfWorld, MarkVolumeOpts, MountedVolume, VolumeMountState, VolumeToMount,
};
use crate::cache::{AttachedVolume, DeviceMountState};
use crate::events::{EventKind, EventRecorder, FAILED_MOUNT, volume_error_message};
use crate::metrics::VolumeMetrics;
use crate::node::{NodeStatus, NothingAttached};
use crate::operations::{NestedPendingOperations, OperationKey, StartError};
use crate::plugin::{PluginManager, PodDirs, VolumeError, VolumeHost, VolumePlugin};

/// Operation names (upstream `operationName`s).
pub mod op {
    /// MountVolume.
    pub const VOLUME_MOUNT: &str = "volume_mount";
    /// UnmountVolume.
    pub const VOLUME_UNMOUNT: &str = "volume_unmount";
    /// UnmountDevice.
    pub const UNMOUNT_DEVICE: &str = "unmount_device";
}

/// The error prefix of a failed SetUp (the only step whose outcome changes the pod's mount
/// state).
const SET_UP_FAILED: &str = "MountVolume.SetUp failed";

/// Why an operation was not started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// Running or backing off: expected, the reconciler ignores it (V47).
    #[error(transparent)]
    NotNow(#[from] StartError),
    /// The volume is attachable and not yet in `node.status.volumesInUse`: it waits for the next
    /// node status update (V46). Expected; not logged.
    #[error(
        "Volume {0} has not been added to the list of VolumesInUse in the node's volume status"
    )]
    NotReportedInUse(String),
    /// The node status does not list the volume as attached yet (V52).
    #[error("Volume {0} not attached according to node status")]
    NotAttachedYet(String),
}

/// Runs volume operations.
pub struct OperationExecutor {
    pub(crate) ops: Arc<NestedPendingOperations>,
    asw: Arc<ActualStateOfWorld>,
    plugins: PluginManager,
    host: VolumeHost,
    events: Arc<dyn EventRecorder>,
    changed: watch::Sender<u64>,
    /// Bumped when an operation's outcome leaves work for the reconciler (an unmount finished, so
    /// the volume may be dropped; a mount ended uncertain; any operation failed, bumped by the
    /// operation table once the failure is recorded). A successful mount leaves none.
    needs_pass: watch::Sender<u64>,
    metrics: VolumeMetrics,
    node: Arc<dyn NodeStatus>,
}

impl OperationExecutor {
    /// An executor over these caches and plugins.
    pub fn new(
        asw: Arc<ActualStateOfWorld>,
        plugins: PluginManager,
        host: VolumeHost,
        events: Arc<dyn EventRecorder>,
    ) -> Self {
        // A failed operation asks for a pass once its end is recorded (the pass then meets the
        // back-off and the manager's retry timer is set): telling it from inside the operation
        // would let the pass run first, see the operation still running, and wait for nothing.
        let needs_pass = watch::channel(0).0;
        Self {
            ops: Arc::new(NestedPendingOperations::new().with_failure_signal(needs_pass.clone())),
            asw,
            plugins,
            host,
            events,
            changed: watch::channel(0).0,
            needs_pass,
            metrics: VolumeMetrics::default(),
            node: Arc::new(NothingAttached),
        }
    }

    /// Reads `node.status.volumesAttached` from this view.
    pub fn with_node_status(mut self, node: Arc<dyn NodeStatus>) -> Self {
        self.node = node;
        self
    }

    /// The node status view attach checks read.
    pub fn node_status(&self) -> &Arc<dyn NodeStatus> {
        &self.node
    }

    /// Records operation durations into these metrics.
    pub fn with_metrics(mut self, metrics: VolumeMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// A receiver that sees a new value when an operation left work for the reconciler.
    pub fn subscribe_needs_pass(&self) -> watch::Receiver<u64> {
        self.needs_pass.subscribe()
    }

    /// A receiver that sees a new value after every operation that changed the actual state.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The operation table.
    pub fn operations(&self) -> &Arc<NestedPendingOperations> {
        &self.ops
    }

    fn notify(changed: &watch::Sender<u64>) {
        changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// V52 for a volume that needs no attach: it is recorded as attached at once (no API call,
    /// so no operation). Attachable volumes are refused for now.
    pub fn verify_controller_attached_volume(
        &self,
        volume: &VolumeToMount,
    ) -> Result<(), ExecError> {
        if volume.plugin_is_attachable {
            // V46: not yet reported in use, so the controller will not attach it: wait, quietly.
            if !volume.reported_in_use {
                return Err(ExecError::NotReportedInUse(volume.volume_name.to_string()));
            }
            // V52 step 5, from the node watch instead of a GET per attempt.
            let attached = self
                .node
                .volumes_attached()
                .into_iter()
                .find(|a| a.name == volume.volume_name);
            let Some(attached) = attached else {
                return Err(ExecError::NotAttachedYet(volume.volume_name.to_string()));
            };
            self.asw
                .mark_volume_as_attached(
                    Some(volume.volume_name.clone()),
                    &volume.spec,
                    &attached.device_path,
                )
                .map_err(|e| ExecError::NotAttachedYet(e.to_string()))?;
            info!(volume = %volume.volume_name, device = %attached.device_path, "Controller attach succeeded");
            Self::notify(&self.changed);
            return Ok(());
        }
        self.asw
            .mark_volume_as_attached(Some(volume.volume_name.clone()), &volume.spec, "")
            .map_err(|e| ExecError::NotAttachedYet(e.to_string()))?;
        Self::notify(&self.changed);
        Ok(())
    }

    /// V51 (filesystem, no device): NewMounter, SetUp, then the actual state. A final SetUp
    /// error leaves no entry (unless the entry came from reconstruction: it stays uncertain); an
    /// uncertain one records the mount as uncertain. Failures raise a `FailedMount` event.
    ///
    /// [`Self::start_mount`] and [`Self::run_mounts`] of one job.
    pub fn mount_volume(
        &self,
        volume: &VolumeToMount,
        remount: bool,
        device_path: &str,
    ) -> Result<JoinHandle<()>, ExecError> {
        let job = self.start_mount(volume, remount, device_path)?;
        Ok(self.run_mounts(vec![job]))
    }

    /// Marks a MountVolume operation as running in the operation table (V48), or says why it
    /// may not start; the job is run by [`Self::run_mounts`], alone or with the other jobs of
    /// its pod.
    pub fn start_mount(
        &self,
        volume: &VolumeToMount,
        remount: bool,
        device_path: &str,
    ) -> Result<MountJob, ExecError> {
        let shared = volume.plugin_is_attachable || volume.plugin_is_device_mountable;
        let key = OperationKey::new(
            volume.volume_name.clone(),
            (!shared).then(|| volume.pod_name.clone()),
        );
        self.ops.start(&key, op::VOLUME_MOUNT)?;
        let plugin_name = self
            .plugins
            .find_by_spec(&volume.spec)
            .map(|p| p.name().to_owned())
            .unwrap_or_default();
        Ok(MountJob {
            key,
            volume: volume.clone(),
            remount,
            device_path: device_path.to_owned(),
            plugin_name,
            // The remount requests this SetUp serves: one made while it runs stays pending.
            epoch: self
                .asw
                .remount_epoch(&volume.pod_name, &volume.volume_name),
            started: std::time::Instant::now(),
        })
    }

    /// Runs started mount jobs in one task and one blocking-pool hop, their SetUps one after
    /// the other (the reconciler hands over one pod's per-pod volumes together: issue 29),
    /// then records each outcome and ends each job's operation. A job's panic fails that job
    /// alone, as an uncertain SetUp.
    pub fn run_mounts(&self, jobs: Vec<MountJob>) -> JoinHandle<()> {
        let (asw, plugins, host, events, changed, needs_pass, metrics, ops) = (
            self.asw.clone(),
            self.plugins.clone(),
            self.host.clone(),
            self.events.clone(),
            self.changed.clone(),
            self.needs_pass.clone(),
            self.metrics.clone(),
            self.ops.clone(),
        );
        let jobs = Arc::new(jobs);
        tokio::spawn(async move {
            let work = {
                let (jobs, asw) = (jobs.clone(), asw.clone());
                tokio::task::spawn_blocking(move || {
                    let dirs = PodDirs::default();
                    jobs.iter()
                        .map(|job| {
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                set_up_job(&plugins, &host, &asw, job, &dirs)
                            }))
                            .unwrap_or_else(|panic| {
                                Err((
                                    SET_UP_FAILED,
                                    VolumeError::Uncertain(format!(
                                        "SetUp panicked: {}",
                                        crate::operations::panic_message(&*panic)
                                    )),
                                ))
                            })
                        })
                        .collect::<Vec<_>>()
                })
            };
            let results = match work.await {
                Ok(results) => results,
                Err(e) => jobs
                    .iter()
                    .map(|_| Err((SET_UP_FAILED, VolumeError::Uncertain(e.to_string()))))
                    .collect(),
            };
            for (job, result) in jobs.iter().zip(results) {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    record_mount(&asw, &*events, &needs_pass, job, result)
                }))
                .unwrap_or_else(|panic| {
                    Err(format!(
                        "operation panicked: {}",
                        crate::operations::panic_message(&*panic)
                    ))
                });
                metrics.operation(
                    op::VOLUME_MOUNT,
                    &job.plugin_name,
                    outcome.is_ok(),
                    job.started.elapsed().as_secs_f64(),
                );
                ops.finish(&job.key, outcome);
            }
            // Once for the pod's jobs, all recorded (the pod's waiter was woken by each record).
            Self::notify(&changed);
        })
    }

    /// V53: NewUnmounter from the plugin name and the inner spec name (no pod object needed),
    /// TearDown, then the actual state. A failed TearDown leaves the mount uncertain.
    pub fn unmount_volume(&self, mounted: &MountedVolume) -> Result<JoinHandle<()>, ExecError> {
        let key = OperationKey::new(mounted.volume_name.clone(), Some(mounted.pod_name.clone()));
        let (asw, plugins, host, changed) = (
            self.asw.clone(),
            self.plugins.clone(),
            self.host.clone(),
            self.changed.clone(),
        );
        let needs_pass = self.needs_pass.clone();
        let metrics = self.metrics.clone();
        let started = std::time::Instant::now();
        let mounted = mounted.clone();
        let handle = self.ops.run(key, op::VOLUME_UNMOUNT, async move {
            let work = {
                let (mounted, plugins, host) = (mounted.clone(), plugins.clone(), host.clone());
                tokio::task::spawn_blocking(move || -> Result<(), String> {
                    let plugin = plugins
                        .find_by_name(&mounted.plugin_name)
                        .ok_or_else(|| format!("UnmountVolume.FindPluginByName failed for volume {:?}", mounted.volume_name))?;
                    // V108: the subpath binds of the volume go first.
                    let pod_dir = host.pod_dir(&mounted.pod_uid).map_err(|e| format!("UnmountVolume.CleanSubPaths failed for volume {:?}: {e}", mounted.volume_name))?;
                    let mut names: Vec<&str> = mounted.outer_volume_spec_names.iter().map(String::as_str).collect();
                    names.push(mounted.spec.name());
                    for name in names {
                        crate::subpath::clean_subpaths(&pod_dir, name, &*host.mounter).map_err(|e| {
                            format!("UnmountVolume.CleanSubPaths failed for volume {:?}: {e}", mounted.volume_name)
                        })?;
                    }
                    let unmounter = plugin
                        .new_unmounter(mounted.spec.name(), &mounted.pod_uid, &host)
                        .map_err(|e| format!("UnmountVolume.NewUnmounter failed for volume {:?}: {e}", mounted.volume_name))?;
                    unmounter.tear_down().map_err(|e| format!("UnmountVolume.TearDown failed for volume {:?} : {e}", mounted.volume_name))
                })
            };
            let result = work.await.unwrap_or_else(|e| Err(e.to_string()));
            match &result {
                Ok(()) => {
                    info!(volume = %mounted.volume_name, pod = %mounted.pod_name, "UnmountVolume.TearDown succeeded");
                    asw.mark_volume_as_unmounted(&mounted.pod_name, &mounted.volume_name);
                }
                Err(_) => {
                    let _ = asw.mark_volume_mount_as_uncertain(MarkVolumeOpts {
                        pod_name: mounted.pod_name.clone(),
                        pod_uid: mounted.pod_uid.clone(),
                        volume_name: mounted.volume_name.clone(),
                        spec: mounted.spec.clone(),
                        outer_volume_spec_name: mounted.outer_volume_spec_names.first().cloned().unwrap_or_default(),
                        volume_gid: mounted.volume_gid.clone(),
                        state: VolumeMountState::Uncertain,
                    });
                }
            }
            metrics.operation(op::VOLUME_UNMOUNT, &mounted.plugin_name, result.is_ok(), started.elapsed().as_secs_f64());
            Self::notify(&changed);
            Self::notify(&needs_pass);
            result
        })?;
        Ok(handle)
    }

    /// V54: UnmountDevice of a volume no pod uses any more: refuses while other mounts of the
    /// same directory exist; a failure leaves the device uncertain.
    pub fn unmount_device(&self, volume: &AttachedVolume) -> Result<JoinHandle<()>, ExecError> {
        let key = OperationKey::new(volume.volume_name.clone(), None);
        let (asw, plugins, host, changed, needs_pass, metrics) = (
            self.asw.clone(),
            self.plugins.clone(),
            self.host.clone(),
            self.changed.clone(),
            self.needs_pass.clone(),
            self.metrics.clone(),
        );
        let volume = volume.clone();
        let started = std::time::Instant::now();
        let handle = self.ops.run(key, op::UNMOUNT_DEVICE, async move {
            let work = {
                let (asw, volume) = (asw.clone(), volume.clone());
                tokio::task::spawn_blocking(move || -> Result<(), String> {
                    let plugin = plugins.find_by_name(&volume.plugin_name).ok_or_else(|| {
                        format!("UnmountDevice.FindDeviceMountablePluginByName failed for volume {:?}", volume.volume_name)
                    })?;
                    let device = plugin.new_device_mounter(&host).map_err(|e| e.to_string())?;
                    let path = if volume.device_mount_path.is_empty() {
                        device.device_mount_path(&volume.spec).map_err(|e| e.to_string())?
                    } else {
                        std::path::PathBuf::from(&volume.device_mount_path)
                    };
                    let refs: Vec<_> = host
                        .mounter
                        .mount_refs(&path)
                        .map_err(|e| e.to_string())?
                        .into_iter()
                        .filter(|r| !r.starts_with(&path))
                        .collect();
                    if !refs.is_empty() {
                        return Err(format!("the device mount path {path:?} is still mounted by other references {refs:?}"));
                    }
                    match device.unmount_device(&path) {
                        Ok(()) => asw.mark_device_as_unmounted(&volume.volume_name).map_err(|e| e.to_string()),
                        Err(e) => {
                            let _ = asw.mark_device_as_uncertain(&volume.volume_name, "", &path.to_string_lossy());
                            Err(format!("UnmountDevice failed for volume {:?} : {e}", volume.volume_name))
                        }
                    }
                })
            };
            let result = work.await.unwrap_or_else(|e| Err(e.to_string()));
            if result.is_ok() {
                info!(volume = %volume.volume_name, "UnmountDevice succeeded");
            }
            metrics.operation(op::UNMOUNT_DEVICE, &volume.plugin_name, result.is_ok(), started.elapsed().as_secs_f64());
            Self::notify(&changed);
            Self::notify(&needs_pass);
            result
        })?;
        Ok(handle)
    }
}

/// A MountVolume operation started by [`OperationExecutor::start_mount`], to be run by
/// [`OperationExecutor::run_mounts`].
#[derive(Debug)]
pub struct MountJob {
    key: OperationKey,
    volume: VolumeToMount,
    remount: bool,
    device_path: String,
    plugin_name: String,
    epoch: u64,
    started: std::time::Instant,
}

impl MountJob {
    /// The volume is mounted once for every pod (attachable or device-mountable): its operation
    /// is not the pod's alone, and it runs on its own.
    pub fn is_shared(&self) -> bool {
        self.key.pod.is_none()
    }

    /// The pod.
    pub fn pod_name(&self) -> &rustlet_core::UniquePodName {
        &self.volume.pod_name
    }
}

/// V51's blocking steps of one job: FindPluginBySpec, the device steps, NewMounter, SetUp.
fn set_up_job(
    plugins: &PluginManager,
    host: &VolumeHost,
    asw: &ActualStateOfWorld,
    job: &MountJob,
    dirs: &PodDirs,
) -> Result<(), (&'static str, VolumeError)> {
    let volume = &job.volume;
    let plugin = plugins.find_by_spec(&volume.spec).map_err(|e| {
        (
            "MountVolume.FindPluginBySpec failed",
            VolumeError::Final(e.to_string()),
        )
    })?;
    if volume.plugin_is_attachable || volume.plugin_is_device_mountable {
        mount_device_steps(asw, plugin.as_ref(), host, volume, job.device_path.clone())?;
    }
    let mounter = plugin
        .new_mounter(&volume.spec, &volume.pod, host)
        .map_err(|e| {
            (
                "MountVolume.NewMounter initialization failed",
                VolumeError::Final(e.to_string()),
            )
        })?;
    mounter.set_up_in(dirs).map_err(|e| (SET_UP_FAILED, e))
}

/// V51's last step and V55: records a job's outcome in the actual state, logs it and raises
/// `FailedMount`; returns the outcome for the operation table.
fn record_mount(
    asw: &ActualStateOfWorld,
    events: &dyn EventRecorder,
    needs_pass: &watch::Sender<u64>,
    job: &MountJob,
    result: Result<(), (&'static str, VolumeError)>,
) -> Result<(), String> {
    let volume = &job.volume;
    let outer = volume
        .outer_volume_spec_names
        .first()
        .cloned()
        .unwrap_or_default();
    let opts = |state| MarkVolumeOpts {
        pod_name: volume.pod_name.clone(),
        pod_uid: PodUid::new(volume.pod.metadata.uid.clone().unwrap_or_default()),
        volume_name: volume.volume_name.clone(),
        spec: volume.spec.clone(),
        outer_volume_spec_name: outer.clone(),
        volume_gid: volume.volume_gid.clone(),
        state,
    };
    match result {
        Ok(()) => {
            let marked = asw.mark_volume_as_mounted(opts(VolumeMountState::Mounted));
            if asw.mark_remount_served(&volume.pod_name, &volume.volume_name, job.epoch) {
                // A change came during this SetUp: the next pass sets it up again.
                OperationExecutor::notify(needs_pass);
            }
            if job.remount {
                debug!(volume = %volume.volume_name, pod = %volume.pod_name, "MountVolume.SetUp succeeded (remount)");
            } else {
                info!(volume = %volume.volume_name, pod = %volume.pod_name, "MountVolume.SetUp succeeded for volume {outer:?}");
            }
            marked.map_err(|e| e.to_string())
        }
        Err((prefix, err)) => {
            // Upstream `markVolumeErrorState` follows SetUp only: a failed step before it
            // (WaitForAttach, MountDevice: `markDeviceErrorState` above) never touched the
            // pod's mount, so its state stays as it was.
            match &err {
                _ if prefix != SET_UP_FAILED => {}
                VolumeError::Uncertain(_) => {
                    // V55: only a volume not mounted becomes uncertain; an entry already
                    // mounted is never downgraded by a failed remount.
                    if !asw
                        .pod_exists_in_volume(&volume.pod_name, &volume.volume_name)
                        .is_mounted()
                    {
                        let _ =
                            asw.mark_volume_mount_as_uncertain(opts(VolumeMountState::Uncertain));
                    }
                }
                VolumeError::Final(_) => {
                    // V55: a final error forgets a failed first mount, but a reconstructed or
                    // earlier-mounted entry keeps its state (a remount failure does not
                    // unmount).
                    let was = asw.pod_exists_in_volume(&volume.pod_name, &volume.volume_name);
                    let keep = asw.is_volume_reconstructed(&volume.volume_name, &volume.pod_name)
                        || (job.remount && was.is_mounted());
                    if !keep && matches!(was, crate::cache::PodVolumeState::Uncertain { .. }) {
                        asw.mark_volume_as_unmounted(&volume.pod_name, &volume.volume_name);
                    }
                }
            }
            let message = volume_error_message(prefix, &outer, &err);
            warn!(pod = %volume.pod_name, "{message}");
            events.event(&volume.pod, EventKind::Warning, FAILED_MOUNT, &message);
            Err(message)
        }
    }
}

/// V51 steps 6-7: WaitForAttach, then MountDevice unless the device is already globally mounted.
fn mount_device_steps(
    asw: &ActualStateOfWorld,
    plugin: &dyn VolumePlugin,
    host: &VolumeHost,
    volume: &VolumeToMount,
    device_path: String,
) -> Result<(), (&'static str, VolumeError)> {
    let device = plugin.new_device_mounter(host).map_err(|e| {
        (
            "MountVolume.NewDeviceMounter initialization failed",
            VolumeError::Final(e.to_string()),
        )
    })?;
    let mut device_path = device_path;
    if volume.plugin_is_attachable {
        device_path = device
            .wait_for_attach(&volume.spec, &device_path)
            .map_err(|e| ("MountVolume.WaitForAttach failed", e))?;
    }
    if !volume.plugin_is_device_mountable
        || asw.device_state(&volume.volume_name) == Some(DeviceMountState::GloballyMounted)
    {
        return Ok(());
    }
    let path = device
        .device_mount_path(&volume.spec)
        .map_err(|e| ("MountVolume.GetDeviceMountPath failed", e))?;
    let path_text = path.to_string_lossy().into_owned();
    match device.mount_device(&volume.spec, &device_path, &path) {
        Ok(()) => asw
            .mark_device_as_mounted(&volume.volume_name, &device_path, &path_text)
            .map_err(|e| {
                (
                    "MountVolume.MarkDeviceAsMounted failed",
                    VolumeError::Final(e.to_string()),
                )
            }),
        Err(e) => {
            mark_device_error_state(asw, &volume.volume_name, &e, (&device_path, &path_text));
            Err(("MountVolume.MountDevice failed", e))
        }
    }
}

/// V55 for the device (upstream `markDeviceErrorState`): an unknown outcome leaves a device that
/// was not mounted uncertain (UnmountDevice will be tried); a final error after an uncertain one
/// means nothing is mounted, unless the uncertain state came from reconstruction (then it stays,
/// so that the device is still cleaned up). A device already mounted is never downgraded.
fn mark_device_error_state(
    asw: &ActualStateOfWorld,
    volume_name: &rustlet_core::UniqueVolumeName,
    err: &VolumeError,
    (device_path, device_mount_path): (&str, &str),
) {
    let state = asw.device_state(volume_name);
    match err {
        VolumeError::Final(_) if state == Some(DeviceMountState::Uncertain) => {
            if asw.is_volume_device_reconstructed(volume_name) {
                debug!(volume = %volume_name, "MountVolume.markDeviceErrorState leaving volume uncertain");
                return;
            }
            let _ = asw.mark_device_as_unmounted(volume_name);
        }
        VolumeError::Uncertain(_) if state == Some(DeviceMountState::NotMounted) => {
            let _ = asw.mark_device_as_uncertain(volume_name, device_path, device_mount_path);
        }
        _ => {}
    }
}
