//! Reconstruction after a restart (upstream `reconciler/reconstruct.go`, V69-V76) and the
//! clean-up of orphaned pod directories (upstream `kubelet_volumes.go`, V80-V81).
//!
//! Every `<root>/pods/<uid>/volumes/<escaped plugin>/<name>` becomes an *uncertain* mount in the
//! actual state: a volume whose pod comes back is mounted again (SetUp is idempotent, so data on
//! a surviving tmpfs stays), and one that is no longer desired is torn down once the desired
//! state is complete. Nothing is ever removed across a mount point.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustlet_core::{PodUid, UniquePodName, UniqueVolumeName};
use rustlet_mount::remove_all_one_filesystem;
use tracing::{info, warn};

use crate::cache::{ActualStateOfWorld, DesiredStateOfWorld, MarkVolumeOpts, VolumeMountState};
use crate::metrics::VolumeMetrics;
use crate::plugin::{PluginManager, VolumeHost, unescape_plugin_name, unique_volume_name};

/// One volume directory found on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodVolumeDir {
    /// The pod UID (the directory name).
    pub pod_uid: PodUid,
    /// The plugin name (unescaped).
    pub plugin_name: String,
    /// The inner spec name.
    pub spec_name: String,
    /// The directory.
    pub path: PathBuf,
}

/// What reconstruction did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconstructReport {
    /// Volumes added to the actual state as uncertain.
    pub reconstructed: Vec<PodVolumeDir>,
    /// Volumes that could not be rebuilt (no plugin, no spec): upstream
    /// `volumesFailedReconstruction`.
    pub failed: Vec<PodVolumeDir>,
    /// The unique names of the reconstructed volumes: upstream
    /// `volumesNeedUpdateFromNodeStatus` (V74), read against the node status before anything
    /// is unmounted.
    pub volume_names: BTreeSet<UniqueVolumeName>,
}

fn read_dir_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// V70: the volume directories of every pod under `<root>/pods`.
pub fn volumes_from_pod_dirs(root: &Path) -> Vec<PodVolumeDir> {
    let pods = root.join("pods");
    let mut out = Vec::new();
    for uid in read_dir_names(&pods) {
        let volumes = pods.join(&uid).join("volumes");
        for plugin in read_dir_names(&volumes) {
            for name in read_dir_names(&volumes.join(&plugin)) {
                out.push(PodVolumeDir {
                    pod_uid: PodUid::new(uid.clone()),
                    plugin_name: unescape_plugin_name(&plugin),
                    path: volumes.join(&plugin).join(&name),
                    spec_name: name,
                });
            }
        }
    }
    out
}

/// V69-V73: rebuilds the actual state from disk.
pub fn reconstruct(
    asw: &ActualStateOfWorld,
    plugins: &PluginManager,
    host: &VolumeHost,
) -> ReconstructReport {
    let mut report = ReconstructReport::default();
    for dir in volumes_from_pod_dirs(&host.root_dir) {
        let pod_name = UniquePodName::new(dir.pod_uid.as_str());
        if asw.volume_exists_with_spec_name(&pod_name, &dir.spec_name) {
            continue; // V71
        }
        let rebuilt = (|| -> Result<UniqueVolumeName, String> {
            let plugin = plugins
                .find_by_name(&dir.plugin_name)
                .ok_or_else(|| format!("no volume plugin {}", dir.plugin_name))?;
            let spec = plugin
                .construct_volume_spec(&dir.spec_name, &dir.path, host)
                .map_err(|e| e.to_string())?;
            let volume_name =
                unique_volume_name(plugin.as_ref(), &spec, &pod_name).map_err(|e| e.to_string())?;
            asw.add_attach_uncertain_reconstructed_volume(volume_name.clone(), &spec, "")
                .map_err(|e| e.to_string())?;
            // V73: the global mount may exist too; UnmountDevice (or MountDevice again, which is
            // idempotent) settles it. The device path comes from the node status (V74).
            if plugin.is_device_mountable() || plugin.is_attachable() {
                let device = plugin.new_device_mounter(host).map_err(|e| e.to_string())?;
                let device_mount_path =
                    device.device_mount_path(&spec).map_err(|e| e.to_string())?;
                asw.mark_device_as_uncertain(
                    &volume_name,
                    "",
                    &device_mount_path.to_string_lossy(),
                )
                .map_err(|e| e.to_string())?;
            }
            asw.check_and_mark_volume_as_uncertain_via_reconstruction(MarkVolumeOpts {
                pod_name: pod_name.clone(),
                pod_uid: dir.pod_uid.clone(),
                volume_name: volume_name.clone(),
                spec,
                outer_volume_spec_name: dir.spec_name.clone(),
                volume_gid: None,
                state: VolumeMountState::Uncertain,
            })
            .map_err(|e| e.to_string())?;
            Ok(volume_name)
        })();
        match rebuilt {
            Ok(volume_name) => {
                report.volume_names.insert(volume_name);
                report.reconstructed.push(dir);
            }
            Err(err) => {
                warn!(path = %dir.path.display(), "Could not construct volume information: {err}");
                report.failed.push(dir);
            }
        }
    }
    info!(
        reconstructed = report.reconstructed.len(),
        failed = report.failed.len(),
        "volume reconstruction done"
    );
    report
}

/// V76 (upstream `cleanOrphanVolumes`), once the desired state is complete: each volume that
/// could not be rebuilt and that the desired state does not hold for its pod (by spec name) is
/// unmounted and its (empty) directory removed, so orphan clean-up can remove the pod directory;
/// one the desired state holds is left to the normal mount. Like upstream, nothing is removed
/// recursively and the list is then cleared whatever happened.
///
/// Deviation: upstream unmounts through the plugin (`UnmountVolume` with a minimal
/// `MountedVolume`), which needs the very plugin whose absence is the usual reason for the
/// failure, and so leaks the mount forever; here the mount point itself is cleaned up, which
/// needs no plugin.
pub fn clean_orphan_volumes(
    failed: &mut Vec<PodVolumeDir>,
    dsw: &DesiredStateOfWorld,
    host: &VolumeHost,
    metrics: &VolumeMetrics,
) {
    for dir in failed.drain(..) {
        let pod = UniquePodName::new(dir.pod_uid.as_str());
        if dsw.volume_exists_with_spec_name(&pod, &dir.spec_name) {
            continue;
        }
        match host
            .mounter
            .cleanup_mount_point(&dir.path, rustlet_mount::MountPointCheck::Exact)
        {
            Ok(()) => {
                metrics.force_cleaned();
                info!(path = %dir.path.display(), "cleaned up a volume that failed reconstruction");
            }
            Err(e) => {
                warn!(path = %dir.path.display(), error = %e, "could not clean up a volume that failed reconstruction; left for orphan clean-up")
            }
        }
    }
}

/// Why an orphaned pod directory was kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrphanKept {
    /// The pod workers say its containers could still run (a force-deleted pod being killed).
    ContainersMayRun(PodUid),
    /// The volume manager still has mounted or uncertain volumes for it.
    VolumesInUse(PodUid),
    /// Something under `volumes/` is a mount point (or the check failed).
    MountedOnDisk(PodUid),
    /// A removal failed (never across a mount point).
    RemoveFailed(PodUid, String),
}

/// V80: removes `pods/<uid>` directories of pods that are neither `known`, nor possibly running
/// (upstream asks the pod workers, `states`), nor have volumes, never recursively across a
/// mount point. Returns what was kept and why.
pub fn cleanup_orphaned_pod_dirs(
    host: &VolumeHost,
    asw: &Arc<ActualStateOfWorld>,
    known: &dyn Fn(&PodUid) -> bool,
    states: &dyn crate::populator::PodStateProvider,
) -> Vec<OrphanKept> {
    let mut kept = Vec::new();
    let pods_dir = host.root_dir.join("pods");
    // Read only when an orphan gets that far: with every pod known (each second on a busy
    // node) the mount table is not read at all (it was 30 % of the idle agent's CPU at 1,000
    // pods).
    let mut table = None;
    for uid in read_dir_names(&pods_dir) {
        let uid = PodUid::new(uid);
        if known(&uid) {
            continue;
        }
        if !states.should_pod_runtime_be_removed(&uid) {
            kept.push(OrphanKept::ContainersMayRun(uid));
            continue;
        }
        if !asw
            .possibly_mounted_volumes_for_pod(&UniquePodName::new(uid.as_str()))
            .is_empty()
        {
            kept.push(OrphanKept::VolumesInUse(uid));
            continue;
        }
        let pod_dir = pods_dir.join(uid.as_str());
        let mounted = match table.get_or_insert_with(|| host.mounter.list()) {
            Ok(table) => table.iter().any(|m| m.mount_point.starts_with(&pod_dir)),
            Err(_) => true, // fail safe
        };
        if mounted {
            kept.push(OrphanKept::MountedOnDisk(uid));
            continue;
        }
        // Volume dirs with regular files are not emptied here: a removal of pod data must go
        // through the volume's TearDown, so only empty volume dirs go.
        let volumes = pod_dir.join("volumes");
        let mut failed = None;
        for plugin in read_dir_names(&volumes) {
            for name in read_dir_names(&volumes.join(&plugin)) {
                if let Err(e) = std::fs::remove_dir(volumes.join(&plugin).join(&name)) {
                    failed = Some(format!(
                        "orphaned pod {uid:?} found, but failed to rmdir() volume at path {}: {e}",
                        volumes.join(&plugin).join(&name).display()
                    ));
                }
            }
        }
        if let Some(err) = failed {
            kept.push(OrphanKept::RemoveFailed(uid, err));
            continue;
        }
        match remove_all_one_filesystem(&pod_dir) {
            Ok(()) => info!(%uid, "Cleaned up orphaned pod directory"),
            Err(e) => kept.push(OrphanKept::RemoveFailed(uid, e.to_string())),
        }
    }
    kept
}
