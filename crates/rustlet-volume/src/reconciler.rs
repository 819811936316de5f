//! The reconciler (upstream `reconciler/reconciler.go`, V42-V47): one pass brings the actual
//! state toward the desired state, in upstream's order: unmount what is no longer desired,
//! attach-wait or mount what is, then drop volumes no pod uses.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{debug, warn};

use crate::cache::{ActualStateOfWorld, DesiredStateOfWorld, PodVolumeState};
use crate::executor::{ExecError, OperationExecutor};
use crate::operations::OperationKey;

/// What one pass started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// UnmountVolume operations started.
    pub unmounts: usize,
    /// MountVolume operations started (remounts included).
    pub mounts: usize,
    /// Volumes dropped from the actual state (no pod uses them, nothing to unmount).
    pub detached: usize,
}

/// The reconciler.
pub struct Reconciler {
    dsw: Arc<DesiredStateOfWorld>,
    asw: Arc<ActualStateOfWorld>,
    executor: Arc<OperationExecutor>,
    /// Set once the populator has made a full pass over all pod sources: before that, nothing is
    /// unmounted (a volume of a pod not yet seen must not be torn down).
    sources_ready: Arc<AtomicBool>,
}

fn log_start_error(what: &str, err: &ExecError) {
    match err {
        ExecError::NotNow(_) => {} // V47: expected (running, or backing off)
        other => warn!("{what}: {other}"),
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
        }
    }

    /// One pass (V42).
    pub fn reconcile(&self) -> PassReport {
        let mut report = PassReport::default();
        let ready = self.sources_ready.load(Ordering::Acquire);
        if ready {
            // V43: mounted or uncertain, and no longer desired.
            for mounted in self.asw.all_mounted_volumes() {
                if !self
                    .dsw
                    .pod_exists_in_volume(&mounted.pod_name, &mounted.volume_name)
                {
                    match self.executor.unmount_volume(&mounted) {
                        Ok(_) => report.unmounts += 1,
                        Err(e) => log_start_error("operationExecutor.UnmountVolume", &e),
                    }
                }
            }
        }
        // V44.
        for volume in self.dsw.volumes_to_mount() {
            let mut state = self
                .asw
                .pod_exists_in_volume(&volume.pod_name, &volume.volume_name);
            if state == PodVolumeState::NotAttached {
                // V46/V52: non-attachable volumes are recorded as attached right away, and
                // mounted in the same pass.
                if let Err(e) = self.executor.verify_controller_attached_volume(&volume) {
                    log_start_error("operationExecutor.VerifyControllerAttachedVolume", &e);
                    continue;
                }
                state = self
                    .asw
                    .pod_exists_in_volume(&volume.pod_name, &volume.volume_name);
            }
            let remount = match state {
                PodVolumeState::NotMounted { .. } | PodVolumeState::Uncertain { .. } => false,
                PodVolumeState::RemountRequired { .. } => true,
                PodVolumeState::Mounted { .. } | PodVolumeState::NotAttached => continue,
            };
            debug!(volume = %volume.volume_name, pod = %volume.pod_name, remount, "operationExecutor.MountVolume started");
            match self.executor.mount_volume(&volume, remount) {
                Ok(_) => report.mounts += 1,
                Err(e) => log_start_error("operationExecutor.MountVolume", &e),
            }
        }
        if ready {
            // V45: volumes without pods that nobody wants and no operation touches.
            for volume in self.asw.unmounted_volumes() {
                let key = OperationKey {
                    volume: Some(volume.volume_name.clone()),
                    pod: None,
                    node: None,
                };
                if self.dsw.volume_exists(&volume.volume_name)
                    || self.executor.operations().is_operation_pending(&key)
                {
                    continue;
                }
                if volume.device_state.may_be_mounted() {
                    continue; // UnmountDevice: comes with the attach path
                }
                self.asw.mark_volume_as_detached(&volume.volume_name);
                debug!(volume = %volume.volume_name, "Volume detached");
                report.detached += 1;
            }
        }
        report
    }
}

#[cfg(test)]
mod tests;
