//! The reconciler (upstream `reconciler/reconciler.go`, V42-V47): one pass brings the actual
//! state toward the desired state, in upstream's order: unmount what is no longer desired,
//! attach-wait or mount what is, then drop volumes no pod uses. After a restart, nothing is
//! unmounted until the reconstructed volumes were checked against the node status (V74).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rustlet_core::UniqueVolumeName;
use tracing::{debug, info};

use crate::cache::{ActualStateOfWorld, DesiredStateOfWorld, PodVolumeState, Scope};
use crate::executor::{ExecError, OperationExecutor};
use crate::operations::{OperationKey, StartError};
use crate::populator::PodStateProvider;

/// What one pass started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// UnmountVolume operations started.
    pub unmounts: usize,
    /// MountVolume operations started (remounts included).
    pub mounts: usize,
    /// Volumes dropped from the actual state (no pod uses them, nothing to unmount).
    pub detached: usize,
    /// UnmountDevice operations started.
    pub device_unmounts: usize,
}

impl PassReport {
    fn add(&mut self, other: &Self) {
        self.unmounts += other.unmounts;
        self.mounts += other.mounts;
        self.detached += other.detached;
        self.device_unmounts += other.device_unmounts;
    }
}

/// At most this many volume operations run at once, so a storm does not hold thousands of
/// started operations (about 2 KB each) waiting for the blocking threads (32). Measured with
/// 1,000 pods (2,000 mounts): 256 kept the agent's peak RSS at ~90 MiB but slowed the storm
/// (p99 1.09-1.25 s), no cap reached 94-97 MiB (p99 0.93-1.09 s); 1,024 gave 91-94 MiB and
/// 1.01-1.07 s. Upstream starts every operation at once.
pub const MAX_OPERATIONS_IN_FLIGHT: usize = 1024;

/// The reconciler.
pub struct Reconciler {
    dsw: Arc<DesiredStateOfWorld>,
    asw: Arc<ActualStateOfWorld>,
    executor: Arc<OperationExecutor>,
    /// Set once the populator has made a full pass over all pod sources: before that, nothing is
    /// unmounted (a volume of a pod not yet seen must not be torn down).
    sources_ready: Arc<AtomicBool>,
    /// What the next pass must look at besides the volumes written since the last one.
    next: Mutex<NextPass>,
    /// V74 (`volumesNeedUpdateFromNodeStatus`): reconstructed volumes whose attachability and
    /// device path wait for a read of the node status. While any wait, nothing is unmounted.
    needs_node_status: Mutex<BTreeSet<UniqueVolumeName>>,
    /// Whose containers may still run ([`Self::with_pod_states`]): their volumes are not
    /// unmounted yet.
    pod_states: Option<Arc<dyn PodStateProvider>>,
}

/// What the last pass looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PassScope {
    /// No pass yet.
    #[default]
    None,
    /// Nothing written and nothing held back since the last pass: no look at all.
    Skipped,
    /// `looked` volumes: written since the pass before, whose operations ended since, or held
    /// back by the cap on operations in flight; `again` of them had met an obstacle (an
    /// operation running or backing off, not attached yet) and are looked at again by every
    /// pass until it clears.
    Volumes {
        /// Volumes looked at.
        looked: usize,
        /// Of those, the ones looked at again after an obstacle.
        again: usize,
    },
    /// Every volume.
    Everything,
}

/// The reconciler's memory between passes (issue 15: a pass looks at the volumes written
/// since the last one, not at every volume).
#[derive(Debug, Default)]
struct NextPass {
    /// Volumes whose last look met an obstacle (an operation running or backing off, not
    /// attached yet): looked at again by every pass until it clears.
    retry: HashSet<UniqueVolumeName>,
    /// Volumes not started for want of room under [`MAX_OPERATIONS_IN_FLIGHT`], in the order
    /// met: a pass takes as many as there is room for, so a storm's held-back volumes are each
    /// looked at about once, not by every pass while the first thousand run. Whoever found no
    /// room asked to hear when an operation ends (`has_room`): the manager then runs a pass.
    held_back: HeldBack,
    /// The sources-ready flag the last pass ran with (`None`: no pass yet). A change lets
    /// unmounts start: every volume is looked at.
    ready: Option<bool>,
    /// Something not tied to a volume held the last pass back (the node status read):
    /// the next looks at every volume.
    everything: bool,
    /// What the last pass looked at.
    last: PassScope,
}

/// Volumes held back by the cap on operations in flight: first held back, first taken; each
/// at most once.
#[derive(Debug, Default)]
struct HeldBack {
    queue: VecDeque<UniqueVolumeName>,
    members: HashSet<UniqueVolumeName>,
}

impl HeldBack {
    fn push(&mut self, name: UniqueVolumeName) {
        if self.members.insert(name.clone()) {
            self.queue.push_back(name);
        }
    }

    /// Up to `n` of the longest held back.
    fn take(&mut self, n: usize) -> impl Iterator<Item = UniqueVolumeName> + '_ {
        let n = n.min(self.queue.len());
        self.queue.drain(..n).inspect(|name| {
            self.members.remove(name);
        })
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn clear(&mut self) {
        self.queue.clear();
        self.members.clear();
    }
}

/// What one pass came to, besides its report.
#[derive(Debug, Default)]
struct PassOutcome {
    report: PassReport,
    /// Volumes that met an obstacle.
    retry: HashSet<UniqueVolumeName>,
    /// Volumes not started for want of room, in order.
    held_back: Vec<UniqueVolumeName>,
    /// An obstacle not tied to a volume.
    everything: bool,
}

impl PassOutcome {
    fn clean(&self) -> bool {
        self.retry.is_empty() && self.held_back.is_empty() && !self.everything
    }
}

/// Whether a volume whose operation could not start must be looked at again by the next
/// pass: not when a conflicting operation runs on it (its end brings the volume back, see
/// `take_ended`), else yes (a back-off, a wait for the node status).
fn look_again(err: &ExecError) -> bool {
    !matches!(err, ExecError::NotNow(StartError::AlreadyExists { .. }))
}

fn log_start_error(what: &str, err: &ExecError) {
    match err {
        // V47: expected (running, backing off, or waiting for the node status).
        ExecError::NotNow(_) | ExecError::NotReportedInUse(_) => {}
        ExecError::NotAttachedYet(_) => debug!("{what}: {err}"),
    }
}

impl Reconciler {
    /// A reconciler over these caches.
    pub fn new(
        dsw: Arc<DesiredStateOfWorld>,
        asw: Arc<ActualStateOfWorld>,
        executor: Arc<OperationExecutor>,
        sources_ready: Arc<AtomicBool>,
    ) -> Self {
        Self {
            dsw,
            asw,
            executor,
            sources_ready,
            next: Mutex::new(NextPass::default()),
            needs_node_status: Mutex::new(BTreeSet::new()),
            pod_states: None,
        }
    }

    /// A volume no longer desired is unmounted only once the pod workers say its pod's
    /// containers are stopped (`should_pod_runtime_be_removed`): a pod only the runtime knows
    /// after a restart (deleted meanwhile) was never desired here, and its containers run until
    /// the orphan pass stops them (W26 step 12). Deviation: upstream's reconciler unmounts a
    /// reconstructed volume of such a pod at once. Without it, nothing is held back.
    pub fn with_pod_states(mut self, states: Arc<dyn PodStateProvider>) -> Self {
        self.pod_states = Some(states);
        self
    }

    /// V74: these reconstructed volumes wait for the node status before anything is unmounted.
    pub fn add_volumes_needing_node_status(
        &self,
        names: impl IntoIterator<Item = UniqueVolumeName>,
    ) {
        self.needs_node_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(names);
    }

    /// V74: some reconstructed volumes still wait for the node status (so V13's synced gate is
    /// closed and unmounts are held back).
    pub fn waits_for_node_status(&self) -> bool {
        !self
            .needs_node_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// V74 (`updateReconstructedFromNodeStatus`): a volume listed in `volumesAttached` gets its
    /// device path and is attachable, the others are not; then the list is cleared. While the
    /// node has not been read, the list stays and the next pass tries again. Returns whether
    /// volumes still wait.
    fn update_reconstructed_from_node_status(&self) -> bool {
        let mut waiting = self
            .needs_node_status
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if waiting.is_empty() {
            return false;
        }
        let Some(attached) = self.executor.node_status().observed_volumes_attached() else {
            debug!(
                volumes = waiting.len(),
                "reconstructed volumes wait for the node status"
            );
            return true;
        };
        for name in waiting.iter() {
            match attached.iter().find(|a| a.name == *name) {
                Some(a) => {
                    self.asw
                        .update_reconstructed_device_path(name, &a.device_path);
                    self.asw
                        .update_reconstructed_volume_attachability(name, true);
                }
                None => self
                    .asw
                    .update_reconstructed_volume_attachability(name, false),
            }
        }
        info!(
            volumes = waiting.len(),
            "reconstructed volumes updated from the node status"
        );
        waiting.clear();
        false
    }

    /// One pass (V42) over the volumes either state wrote since the last pass, those whose
    /// operations ended since, those that met an obstacle, and as many held back by the cap
    /// on operations in flight as there is room for (O(changed)); none: the pass is skipped,
    /// it would find nothing (the event-driven steady state is O(1)). After a change of the
    /// sources-ready flag or an obstacle not tied to a volume, every volume, as upstream's
    /// every pass does.
    pub fn reconcile(&self) -> PassReport {
        let ready = self.sources_ready.load(Ordering::Acquire);
        let mut touched = self.dsw.take_touched();
        touched.merge(self.asw.take_touched());
        touched.merge(self.executor.operations().take_ended());
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let everything = touched.all
            || next.everything
            || next.ready != Some(ready)
            || self.waits_for_node_status();
        if everything {
            next.last = PassScope::Everything;
            next.held_back.clear();
            let outcome = self.pass(Scope::All, ready);
            next.ready = Some(ready);
            next.everything = outcome.everything;
            next.retry = outcome.retry;
            for name in outcome.held_back {
                next.held_back.push(name);
            }
            return outcome.report;
        }
        let mut volumes = std::mem::take(&mut next.retry);
        let again = volumes.len();
        volumes.extend(touched.volumes);
        let mut report = PassReport::default();
        let mut retry = HashSet::new();
        let mut looked = 0;
        // Held-back volumes join as room allows; when the ones taken need no operation (room
        // is left), the next ones are looked at in the same call.
        loop {
            let room = self.executor.operations().room(MAX_OPERATIONS_IN_FLIGHT);
            volumes.extend(next.held_back.take(room));
            if volumes.is_empty() {
                break;
            }
            looked += volumes.len();
            let outcome = self.pass(Scope::Volumes(&volumes), ready);
            report.add(&outcome.report);
            retry.extend(outcome.retry);
            next.everything |= outcome.everything;
            for name in outcome.held_back {
                next.held_back.push(name);
            }
            volumes.clear();
            if next.held_back.is_empty()
                || !self
                    .executor
                    .operations()
                    .has_room(MAX_OPERATIONS_IN_FLIGHT)
            {
                break;
            }
        }
        next.last = if looked == 0 {
            PassScope::Skipped
        } else {
            PassScope::Volumes { looked, again }
        };
        next.ready = Some(ready);
        next.retry = retry;
        report
    }

    /// What the last [`Self::reconcile`] looked at.
    pub fn last_pass(&self) -> PassScope {
        self.next.lock().unwrap_or_else(|e| e.into_inner()).last
    }

    /// One full scan in upstream's order. `clean` is false when something could not start
    /// (an operation running or backing off, an unsupported attach), so the next pass must look
    /// again even if nothing changed.
    pub fn full_pass(&self, ready: bool) -> (PassReport, bool) {
        let outcome = self.pass(Scope::All, ready);
        let clean = outcome.clean();
        (outcome.report, clean)
    }

    /// One pass over the volumes in `scope`, in upstream's order.
    fn pass(&self, scope: Scope<'_>, ready: bool) -> PassOutcome {
        let mut out = PassOutcome::default();
        // V42 steps 1 and 5. Better than upstream: the node status is read before this pass's
        // mounts, so a reconstructed attachable volume still desired is mounted with the device
        // path the node reports instead of an empty one (a failed WaitForAttach and a back-off).
        let waiting = self.update_reconstructed_from_node_status();
        let ready = ready && !waiting;
        if waiting {
            out.everything = true;
        }
        if ready {
            // V43: mounted or uncertain, and no longer desired. Lock order: each phase holds one
            // cache's read view while the other iterates; only this single reconciler thread
            // nests, and no writer holds one cache while taking the other, so no cycle forms.
            let stale = {
                let desired = self.dsw.reader();
                self.asw.possibly_mounted_where(scope, |volume, pod| {
                    !desired.pod_exists_in_volume(pod, volume)
                })
            };
            for mounted in stale {
                if let Some(states) = &self.pod_states
                    && !states.should_pod_runtime_be_removed(&mounted.pod_uid)
                {
                    // Looked at again each pass until the runtime saw the pod stopped.
                    out.retry.insert(mounted.volume_name.clone());
                    continue;
                }
                // Not started: the next pass looks again. Started: its end brings the volume
                // back (`take_ended`), success or failure.
                match self.executor.unmount_volume(&mounted) {
                    Ok(_) => out.report.unmounts += 1,
                    Err(e) => {
                        if look_again(&e) {
                            out.retry.insert(mounted.volume_name.clone());
                        }
                        log_start_error("operationExecutor.UnmountVolume", &e);
                    }
                }
            }
        }
        // V44. Only pairs not already mounted are copied out: the steady state copies nothing.
        let pending = {
            let actual = self.asw.reader();
            self.dsw.volumes_to_mount_where(scope, |volume, pod| {
                !actual.is_mounted_and_current(pod, volume)
            })
        };
        // Issue 29: a pod's per-pod mounts run together, in one task and one blocking-pool
        // hop (a shared volume's runs alone: its WaitForAttach may take long).
        let mut batches: Vec<Vec<crate::executor::MountJob>> = Vec::new();
        let mut by_pod: HashMap<rustlet_core::UniquePodName, usize> = HashMap::new();
        let mut pending = pending.into_iter();
        while let Some(volume) = pending.next() {
            if !self
                .executor
                .operations()
                .has_room(MAX_OPERATIONS_IN_FLIGHT)
            {
                // The rest waits for a pass after some of the running ones end (the manager
                // runs one when room is freed); a volume whose operation runs comes back with
                // its end.
                let ops = self.executor.operations();
                out.held_back.extend(
                    std::iter::once(volume)
                        .chain(pending)
                        .map(|v| v.volume_name)
                        .filter(|name| {
                            !ops.is_operation_pending(&OperationKey {
                                volume: Some(name.clone()),
                                pod: None,
                                node: None,
                            })
                        }),
                );
                break;
            }
            let mut state = self
                .asw
                .pod_exists_in_volume(&volume.pod_name, &volume.volume_name);
            if state == PodVolumeState::NotAttached {
                // V46/V52: non-attachable volumes are recorded as attached right away, and
                // mounted in the same pass.
                if let Err(e) = self.executor.verify_controller_attached_volume(&volume) {
                    out.retry.insert(volume.volume_name.clone());
                    log_start_error("operationExecutor.VerifyControllerAttachedVolume", &e);
                    continue;
                }
                state = self
                    .asw
                    .pod_exists_in_volume(&volume.pod_name, &volume.volume_name);
            }
            if waiting
                && volume.plugin_is_attachable
                && self
                    .asw
                    .is_volume_reconstructed(&volume.volume_name, &volume.pod_name)
            {
                continue; // its device path is not known yet
            }
            let (remount, device_path) = match state {
                PodVolumeState::NotMounted { device_path }
                | PodVolumeState::Uncertain { device_path } => (false, device_path),
                PodVolumeState::RemountRequired { device_path } => (true, device_path),
                PodVolumeState::Mounted { .. } | PodVolumeState::NotAttached => continue,
            };
            debug!(volume = %volume.volume_name, pod = %volume.pod_name, remount, "operationExecutor.MountVolume started");
            // Not started (running, backing off): the next pass looks again. Started: its end
            // brings the volume back (`take_ended`), also when a failed SetUp wrote nothing,
            // and a pass then meets its back-off and keeps it until the back-off ends.
            match self.executor.start_mount(&volume, remount, &device_path) {
                Ok(job) => {
                    out.report.mounts += 1;
                    if job.is_shared() {
                        self.executor.run_mounts(vec![job]);
                    } else {
                        let at = *by_pod.entry(job.pod_name().clone()).or_insert_with(|| {
                            batches.push(Vec::new());
                            batches.len() - 1
                        });
                        batches[at].push(job);
                    }
                }
                Err(e) => {
                    if look_again(&e) {
                        out.retry.insert(volume.volume_name.clone());
                    }
                    log_start_error("operationExecutor.MountVolume", &e);
                }
            }
        }
        for jobs in batches {
            self.executor.run_mounts(jobs);
        }
        if ready {
            // V45: volumes without pods that nobody wants and no operation touches.
            for volume in self.asw.unmounted_volumes_in(scope) {
                if self.dsw.volume_exists(&volume.volume_name) {
                    continue;
                }
                let key = OperationKey {
                    volume: Some(volume.volume_name.clone()),
                    pod: None,
                    node: None,
                };
                if self.executor.operations().is_operation_pending(&key) {
                    continue; // its end brings the volume back
                }
                if volume.device_state.may_be_mounted() {
                    // The global mount goes first; the volume is dropped on a later pass (the
                    // operation's end brings it back).
                    match self.executor.unmount_device(&volume) {
                        Ok(_) => out.report.device_unmounts += 1,
                        Err(e) => {
                            if look_again(&e) {
                                out.retry.insert(volume.volume_name.clone());
                            }
                            log_start_error("operationExecutor.UnmountDevice", &e);
                        }
                    }
                    continue;
                }
                self.asw.mark_volume_as_detached(&volume.volume_name);
                debug!(volume = %volume.volume_name, "Volume detached");
                out.report.detached += 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod attach_tests;
