//! The actual state of world (upstream `cache/actual_state_of_world.go`): which volumes are
//! attached and mounted, as the operations report it. Mount states are enums, uncertain ones
//! included: a mount whose outcome is unknown (timeout, crash, reconstruction) counts as
//! possibly mounted, never as absent.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use rustlet_core::{PodUid, UniquePodName, UniqueVolumeName};

use super::signals::{PodSignal, PodSignals};
use super::small_map::SmallMap;
use super::{Generational, Scope, Touch, Touched};
use crate::plugin::{PluginError, PluginManager, unique_volume_name};
use crate::spec::VolumeSpec;

/// The state of one pod's mount of a volume (upstream `VolumeMountState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeMountState {
    /// SetUp succeeded.
    Mounted,
    /// SetUp may or may not have left a mount (timeout, partial failure, reconstruction).
    Uncertain,
    /// The entry exists, nothing is mounted.
    NotMounted,
}

/// The state of a volume's global (device) mount (upstream `DeviceMountState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceMountState {
    /// MountDevice succeeded.
    GloballyMounted,
    /// MountDevice was interrupted, UnmountDevice failed, or the entry was reconstructed.
    Uncertain,
    /// No global mount.
    NotMounted,
}

impl DeviceMountState {
    /// Whether UnmountDevice must be attempted (upstream `DeviceMayBeMounted`).
    pub fn may_be_mounted(self) -> bool {
        matches!(self, Self::GloballyMounted | Self::Uncertain)
    }
}

/// Whether a volume's plugin attaches (uncertain only for reconstructed volumes until the node
/// status is read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attachability {
    /// Attachable.
    Attachable,
    /// Not attachable.
    NotAttachable,
    /// Not known yet.
    Uncertain,
}

/// Errors of the actual state (names of the failed operation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AswError {
    /// V32.
    #[error("no volume with the name {0:?} exists in the list of attached volumes")]
    VolumeNotAttached(UniqueVolumeName),
    /// V36.
    #[error("failed to DeleteVolume {volume:?}, it still has {pods} mountedPods")]
    VolumeStillMounted {
        /// The volume.
        volume: UniqueVolumeName,
        /// How many pods.
        pods: usize,
    },
    /// No plugin for the spec.
    #[error(transparent)]
    Plugin(#[from] PluginError),
}

/// What `pod_exists_in_volume` finds (upstream returns a bool, a path and sentinel errors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodVolumeState {
    /// The volume is not in the actual state at all: wait for attach.
    NotAttached,
    /// Attached (or needs no attach), not mounted for this pod: mount it.
    NotMounted {
        /// The attach result, possibly empty.
        device_path: String,
    },
    /// Possibly mounted: mount again, SetUp is idempotent.
    Uncertain {
        /// The attach result, possibly empty.
        device_path: String,
    },
    /// Mounted, but the plugin asked for a periodic remount.
    RemountRequired {
        /// The attach result, possibly empty.
        device_path: String,
    },
    /// Mounted.
    Mounted {
        /// The attach result, possibly empty.
        device_path: String,
    },
}

impl PodVolumeState {
    /// Counted as mounted by `WaitForAttachAndMount` (remount-required still is).
    pub fn is_mounted(&self) -> bool {
        matches!(self, Self::Mounted { .. } | Self::RemountRequired { .. })
    }
}

/// One pod's mount, as returned by the queries (upstream `MountedVolume`).
#[derive(Clone, Debug, PartialEq)]
pub struct MountedVolume {
    /// The pod.
    pub pod_name: UniquePodName,
    /// Its UID.
    pub pod_uid: PodUid,
    /// The volume.
    pub volume_name: UniqueVolumeName,
    /// The pod's names for it.
    pub outer_volume_spec_names: Vec<String>,
    /// The plugin.
    pub plugin_name: String,
    /// The spec.
    pub spec: VolumeSpec,
    /// The mount state.
    pub state: VolumeMountState,
    /// The volume's global mount path, if any.
    pub device_mount_path: String,
    /// The PV's GID annotation.
    pub volume_gid: Option<String>,
}

/// A volume with its device state, as returned by the volume-level queries.
#[derive(Clone, Debug, PartialEq)]
pub struct AttachedVolume {
    /// The volume.
    pub volume_name: UniqueVolumeName,
    /// The spec.
    pub spec: VolumeSpec,
    /// The plugin.
    pub plugin_name: String,
    /// Attachability.
    pub attachability: Attachability,
    /// Global mount state.
    pub device_state: DeviceMountState,
    /// Attach result.
    pub device_path: String,
    /// Global mount path.
    pub device_mount_path: String,
}

/// Arguments of `mark_volume_as_mounted` (upstream `MarkVolumeOpts`).
#[derive(Clone, Debug, PartialEq)]
pub struct MarkVolumeOpts {
    /// The pod.
    pub pod_name: UniquePodName,
    /// Its UID.
    pub pod_uid: PodUid,
    /// The volume (must be attached).
    pub volume_name: UniqueVolumeName,
    /// The spec.
    pub spec: VolumeSpec,
    /// The pod's name for the volume.
    pub outer_volume_spec_name: String,
    /// GID annotation.
    pub volume_gid: Option<String>,
    /// The state to record.
    pub state: VolumeMountState,
}

impl MountedVolume {
    fn of(
        volume_name: &UniqueVolumeName,
        volume: &VolumeEntry,
        pod_name: &UniquePodName,
        pod: &PodMount,
    ) -> Self {
        Self {
            pod_name: pod_name.clone(),
            pod_uid: pod.pod_uid.clone(),
            volume_name: volume_name.clone(),
            outer_volume_spec_names: pod.outer_names.clone(),
            plugin_name: volume.plugin_name.clone(),
            spec: pod.spec.clone(),
            state: pod.state,
            device_mount_path: volume.device_mount_path.clone(),
            volume_gid: pod.gid.clone(),
        }
    }
}

#[derive(Clone, Debug)]
struct PodMount {
    pod_uid: PodUid,
    spec: VolumeSpec,
    outer_names: Vec<String>,
    /// Remounts asked for (V19), and the number served by a SetUp that started after them: a
    /// request made while a SetUp runs is not lost when that SetUp ends.
    remount_requested: u64,
    remount_served: u64,
    gid: Option<String>,
    state: VolumeMountState,
}

#[derive(Clone, Debug)]
struct VolumeEntry {
    spec: VolumeSpec,
    plugin_name: String,
    pods: SmallMap<UniquePodName, PodMount>,
    attachability: Attachability,
    device_state: DeviceMountState,
    device_path: String,
    device_mount_path: String,
}

#[derive(Debug, Default)]
struct Inner {
    volumes: HashMap<UniqueVolumeName, VolumeEntry>,
    /// Per pod: the volumes it has an entry in (an index for per-pod queries).
    by_pod: HashMap<UniquePodName, BTreeSet<UniqueVolumeName>>,
    /// (volume, pod) pairs added by reconstruction and not yet confirmed by a real mount.
    found_during_reconstruction: BTreeMap<UniqueVolumeName, BTreeMap<UniquePodName, PodUid>>,
}

/// The actual state of world. One lock over everything, as upstream.
#[derive(Debug)]
pub struct ActualStateOfWorld {
    state: Generational<Inner>,
    plugins: PluginManager,
    /// Signals to the tasks waiting on a pod's mounts: every change to a pod's entries.
    signals: Arc<PodSignals>,
}

impl ActualStateOfWorld {
    /// An empty actual state.
    pub fn new(plugins: PluginManager) -> Self {
        Self {
            state: Generational::default(),
            plugins,
            signals: Arc::default(),
        }
    }

    /// A signal of the changes to `pod`'s mount entries from now on (each mark as mounted,
    /// uncertain or unmounted). Take it before reading the state it is about.
    pub(crate) fn pod_signal(&self, pod: &UniquePodName) -> PodSignal {
        self.signals.subscribe(pod)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.state.read()
    }

    fn write(&self, touch: Touch<'_>) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.state.write(touch)
    }

    /// A counter that changes whenever the state may have changed (every write).
    pub fn generation(&self) -> u64 {
        self.state.generation()
    }

    /// The volumes written since the last call (the reconciler's; one consumer).
    pub fn take_touched(&self) -> Touched {
        self.state.take_touched()
    }

    fn add_volume(
        &self,
        name: Option<UniqueVolumeName>,
        spec: &VolumeSpec,
        device_path: &str,
        attachability: Option<Attachability>,
    ) -> Result<UniqueVolumeName, AswError> {
        let plugin = self.plugins.find_by_spec(spec)?;
        let name = match name {
            Some(name) => name,
            // Attached volumes are named the shared way; the pod part is not used.
            None => unique_volume_name(plugin.as_ref(), spec, &UniquePodName::default())?,
        };
        let attachability = attachability.unwrap_or(if plugin.is_attachable() {
            Attachability::Attachable
        } else {
            Attachability::NotAttachable
        });
        let mut inner = self.write(Touch::Volume(&name));
        match inner.volumes.get_mut(&name) {
            Some(existing) => existing.device_path = device_path.to_owned(),
            None => {
                inner.volumes.insert(
                    name.clone(),
                    VolumeEntry {
                        spec: spec.clone(),
                        plugin_name: plugin.name().to_owned(),
                        pods: SmallMap::new(),
                        attachability,
                        device_state: DeviceMountState::NotMounted,
                        device_path: device_path.to_owned(),
                        device_mount_path: String::new(),
                    },
                );
            }
        }
        Ok(name)
    }

    /// V31: records the volume as attached (or as needing no attach); an existing entry only
    /// gets the new device path.
    pub fn mark_volume_as_attached(
        &self,
        name: Option<UniqueVolumeName>,
        spec: &VolumeSpec,
        device_path: &str,
    ) -> Result<UniqueVolumeName, AswError> {
        self.add_volume(name, spec, device_path, None)
    }

    /// V31: a reconstructed volume whose attachability is not known yet.
    pub fn add_attach_uncertain_reconstructed_volume(
        &self,
        name: UniqueVolumeName,
        spec: &VolumeSpec,
        device_path: &str,
    ) -> Result<UniqueVolumeName, AswError> {
        self.add_volume(
            Some(name),
            spec,
            device_path,
            Some(Attachability::Uncertain),
        )
    }

    /// V32: records a pod's mount in the given state.
    pub fn mark_volume_as_mounted(&self, opts: MarkVolumeOpts) -> Result<(), AswError> {
        let pod_name = opts.pod_name.clone();
        let marked = self.mark_pod_entry(opts);
        self.signals.notify(&pod_name);
        marked
    }

    fn mark_pod_entry(&self, opts: MarkVolumeOpts) -> Result<(), AswError> {
        let mut inner = self.write(Touch::Volume(&opts.volume_name));
        if inner.volumes.contains_key(&opts.volume_name) {
            inner
                .by_pod
                .entry(opts.pod_name.clone())
                .or_default()
                .insert(opts.volume_name.clone());
        }
        let Some(volume) = inner.volumes.get_mut(&opts.volume_name) else {
            return Err(AswError::VolumeNotAttached(opts.volume_name));
        };
        let rebuild = volume
            .pods
            .get(&opts.pod_name)
            .is_none_or(|p| p.state == VolumeMountState::Uncertain);
        if rebuild {
            volume.pods.insert(
                opts.pod_name.clone(),
                PodMount {
                    pod_uid: opts.pod_uid.clone(),
                    spec: opts.spec.clone(),
                    outer_names: vec![opts.outer_volume_spec_name.clone()],
                    remount_requested: 0,
                    remount_served: 0,
                    gid: opts.volume_gid.clone(),
                    state: opts.state,
                },
            );
        }
        let pod = volume.pods.get_mut(&opts.pod_name).expect("inserted above");
        pod.state = opts.state;
        if !pod.outer_names.contains(&opts.outer_volume_spec_name) {
            pod.outer_names.push(opts.outer_volume_spec_name.clone());
        }
        if opts.state == VolumeMountState::Mounted
            && let Some(pods) = inner.found_during_reconstruction.get_mut(&opts.volume_name)
        {
            pods.remove(&opts.pod_name);
            if pods.is_empty() {
                inner.found_during_reconstruction.remove(&opts.volume_name);
            }
        }
        Ok(())
    }

    /// A pod's mount whose outcome is unknown.
    pub fn mark_volume_mount_as_uncertain(&self, opts: MarkVolumeOpts) -> Result<(), AswError> {
        self.mark_volume_as_mounted(MarkVolumeOpts {
            state: VolumeMountState::Uncertain,
            ..opts
        })
    }

    /// V36: the pod's entry is gone (TearDown succeeded).
    pub fn mark_volume_as_unmounted(
        &self,
        pod_name: &UniquePodName,
        volume_name: &UniqueVolumeName,
    ) {
        let mut inner = self.write(Touch::Volume(volume_name));
        if let Some(volume) = inner.volumes.get_mut(volume_name) {
            volume.pods.remove(pod_name);
        }
        if let Some(pods) = inner.found_during_reconstruction.get_mut(volume_name) {
            pods.remove(pod_name);
        }
        if let Some(volumes) = inner.by_pod.get_mut(pod_name) {
            volumes.remove(volume_name);
            if volumes.is_empty() {
                inner.by_pod.remove(pod_name);
            }
        }
        drop(inner);
        self.signals.notify(pod_name);
    }

    /// V36: removes a volume with no pods left.
    pub fn delete_volume(&self, volume_name: &UniqueVolumeName) -> Result<(), AswError> {
        let mut inner = self.write(Touch::Volume(volume_name));
        if let Some(volume) = inner.volumes.get(volume_name) {
            if !volume.pods.is_empty() {
                return Err(AswError::VolumeStillMounted {
                    volume: volume_name.clone(),
                    pods: volume.pods.len(),
                });
            }
            inner.volumes.remove(volume_name);
            inner.found_during_reconstruction.remove(volume_name);
        }
        Ok(())
    }

    /// V36: drops the volume unless pods remain (then nothing happens).
    pub fn mark_volume_as_detached(&self, volume_name: &UniqueVolumeName) {
        let _ = self.delete_volume(volume_name);
    }

    /// V37: each of these volumes of the pod whose plugin requires remount is marked so. The
    /// caller names the pod's volumes (the desired state knows them): upstream walks every
    /// volume of the node for each pod, O(pods × volumes) when every pod is reprocessed.
    /// Only the volumes marked count as written: a reprocessed pod of emptyDirs alone sends
    /// the reconciler nothing to look at.
    pub fn mark_remount_required(&self, pod_name: &UniquePodName, volumes: &[UniqueVolumeName]) {
        let remountable: Vec<UniqueVolumeName> = {
            let inner = self.read();
            volumes
                .iter()
                .filter(|volume_name| {
                    inner
                        .volumes
                        .get(*volume_name)
                        .and_then(|v| v.pods.get(pod_name))
                        .is_some_and(|pod| {
                            self.plugins
                                .find_by_spec(&pod.spec)
                                .is_ok_and(|p| p.requires_remount(&pod.spec))
                        })
                })
                .cloned()
                .collect()
        };
        if remountable.is_empty() {
            return;
        }
        let mut inner = self.write(Touch::Volumes(&remountable));
        for volume_name in &remountable {
            if let Some(pod) = inner
                .volumes
                .get_mut(volume_name)
                .and_then(|v| v.pods.get_mut(pod_name))
            {
                pod.remount_requested += 1;
            }
        }
    }

    /// The remount requests of a pod's mount so far: a SetUp started now serves them.
    pub fn remount_epoch(&self, pod_name: &UniquePodName, volume_name: &UniqueVolumeName) -> u64 {
        self.read()
            .volumes
            .get(volume_name)
            .and_then(|v| v.pods.get(pod_name))
            .map_or(0, |p| p.remount_requested)
    }

    /// A SetUp that started at `epoch` succeeded: the requests up to it are served. Returns
    /// whether a newer request is still pending (it came while the SetUp ran).
    pub fn mark_remount_served(
        &self,
        pod_name: &UniquePodName,
        volume_name: &UniqueVolumeName,
        epoch: u64,
    ) -> bool {
        let mut inner = self.write(Touch::Volume(volume_name));
        let Some(pod) = inner
            .volumes
            .get_mut(volume_name)
            .and_then(|v| v.pods.get_mut(pod_name))
        else {
            return false;
        };
        pod.remount_served = pod.remount_served.max(epoch);
        pod.remount_requested > pod.remount_served
    }

    /// V38: sets the global mount state; an empty `device_path` keeps the stored one.
    pub fn set_device_mount_state(
        &self,
        volume_name: &UniqueVolumeName,
        state: DeviceMountState,
        device_path: &str,
        device_mount_path: &str,
    ) -> Result<(), AswError> {
        let mut inner = self.write(Touch::Volume(volume_name));
        let volume = inner
            .volumes
            .get_mut(volume_name)
            .ok_or_else(|| AswError::VolumeNotAttached(volume_name.clone()))?;
        volume.device_state = state;
        if !device_path.is_empty() {
            volume.device_path = device_path.to_owned();
        }
        volume.device_mount_path = if state == DeviceMountState::NotMounted {
            String::new()
        } else {
            device_mount_path.to_owned()
        };
        Ok(())
    }

    /// V38.
    pub fn mark_device_as_mounted(
        &self,
        volume_name: &UniqueVolumeName,
        device_path: &str,
        device_mount_path: &str,
    ) -> Result<(), AswError> {
        self.set_device_mount_state(
            volume_name,
            DeviceMountState::GloballyMounted,
            device_path,
            device_mount_path,
        )
    }

    /// V38.
    pub fn mark_device_as_uncertain(
        &self,
        volume_name: &UniqueVolumeName,
        device_path: &str,
        device_mount_path: &str,
    ) -> Result<(), AswError> {
        self.set_device_mount_state(
            volume_name,
            DeviceMountState::Uncertain,
            device_path,
            device_mount_path,
        )
    }

    /// The global mount state of a volume, if it is known.
    pub fn device_state(&self, volume_name: &UniqueVolumeName) -> Option<DeviceMountState> {
        self.read().volumes.get(volume_name).map(|v| v.device_state)
    }

    /// V38: back to `NotMounted`, the global path forgotten.
    pub fn mark_device_as_unmounted(&self, volume_name: &UniqueVolumeName) -> Result<(), AswError> {
        self.set_device_mount_state(volume_name, DeviceMountState::NotMounted, "", "")
    }

    /// V33: what the reconciler must do for this (pod, volume).
    pub fn pod_exists_in_volume(
        &self,
        pod_name: &UniquePodName,
        volume_name: &UniqueVolumeName,
    ) -> PodVolumeState {
        let inner = self.read();
        let Some(volume) = inner.volumes.get(volume_name) else {
            return PodVolumeState::NotAttached;
        };
        let device_path = volume.device_path.clone();
        match volume.pods.get(pod_name) {
            None => PodVolumeState::NotMounted { device_path },
            Some(pod) => match pod.state {
                VolumeMountState::NotMounted => PodVolumeState::NotMounted { device_path },
                VolumeMountState::Uncertain => PodVolumeState::Uncertain { device_path },
                VolumeMountState::Mounted if pod.remount_requested > pod.remount_served => {
                    PodVolumeState::RemountRequired { device_path }
                }
                VolumeMountState::Mounted => PodVolumeState::Mounted { device_path },
            },
        }
    }

    /// A read view held across many lookups (one lock acquisition for a whole pass).
    pub fn reader(&self) -> AswReader<'_> {
        AswReader(self.read())
    }

    /// True when the pod's mount of the volume is `Mounted` and needs no remount (the cheap
    /// form of [`Self::pod_exists_in_volume`] for the reconciler's steady state).
    pub fn is_mounted_and_current(
        &self,
        pod_name: &UniquePodName,
        volume_name: &UniqueVolumeName,
    ) -> bool {
        self.read()
            .volumes
            .get(volume_name)
            .and_then(|v| v.pods.get(pod_name))
            .is_some_and(|p| {
                p.state == VolumeMountState::Mounted && p.remount_requested <= p.remount_served
            })
    }

    /// V34: the pod's mount is gone (no entry, or `NotMounted`).
    pub fn pod_removed_from_volume(
        &self,
        pod_name: &UniquePodName,
        volume_name: &UniqueVolumeName,
    ) -> bool {
        self.read()
            .volumes
            .get(volume_name)
            .and_then(|v| v.pods.get(pod_name))
            .is_none_or(|p| p.state == VolumeMountState::NotMounted)
    }

    /// V40: another pod's entry is not `NotMounted`.
    pub fn is_volume_mounted_elsewhere(
        &self,
        volume_name: &UniqueVolumeName,
        pod_name: &UniquePodName,
    ) -> bool {
        self.read().volumes.get(volume_name).is_some_and(|v| {
            v.pods
                .iter()
                .any(|(p, m)| p != pod_name && m.state != VolumeMountState::NotMounted)
        })
    }

    /// V35: the pod has a volume with this inner spec name.
    pub fn volume_exists_with_spec_name(&self, pod_name: &UniquePodName, spec_name: &str) -> bool {
        self.read().volumes.values().any(|v| {
            v.pods
                .get(pod_name)
                .is_some_and(|p| p.spec.name() == spec_name)
        })
    }

    /// Mounted or uncertain entries of the volumes in `scope` for which `wanted(volume, pod)`
    /// is true, cloned.
    pub fn possibly_mounted_where(
        &self,
        scope: Scope<'_>,
        mut wanted: impl FnMut(&UniqueVolumeName, &UniquePodName) -> bool,
    ) -> Vec<MountedVolume> {
        self.mounted_filter(scope, |volume, pod, state| {
            state != VolumeMountState::NotMounted && wanted(volume, pod)
        })
    }

    fn mounted(
        &self,
        filter: impl Fn(&UniquePodName, VolumeMountState) -> bool,
    ) -> Vec<MountedVolume> {
        self.mounted_filter(Scope::All, |_, pod, state| filter(pod, state))
    }

    fn mounted_filter(
        &self,
        scope: Scope<'_>,
        mut filter: impl FnMut(&UniqueVolumeName, &UniquePodName, VolumeMountState) -> bool,
    ) -> Vec<MountedVolume> {
        let inner = self.read();
        let mut out = Vec::new();
        for (volume_name, volume) in scope.entries(&inner.volumes) {
            for (pod_name, pod) in &volume.pods {
                if filter(volume_name, pod_name, pod.state) {
                    out.push(MountedVolume::of(volume_name, volume, pod_name, pod));
                }
            }
        }
        out
    }

    /// V35: `Mounted` entries of every pod.
    pub fn mounted_volumes(&self) -> Vec<MountedVolume> {
        self.mounted(|_, s| s == VolumeMountState::Mounted)
    }

    /// V35: `Mounted` entries of one pod.
    pub fn mounted_volumes_for_pod(&self, pod_name: &UniquePodName) -> Vec<MountedVolume> {
        self.pod_mounts(pod_name, |s| s == VolumeMountState::Mounted)
    }

    fn pod_mounts(
        &self,
        pod_name: &UniquePodName,
        filter: impl Fn(VolumeMountState) -> bool,
    ) -> Vec<MountedVolume> {
        let inner = self.read();
        let Some(volumes) = inner.by_pod.get(pod_name) else {
            return Vec::new();
        };
        volumes
            .iter()
            .filter_map(|volume_name| {
                let volume = inner.volumes.get(volume_name)?;
                let pod = volume.pods.get(pod_name)?;
                filter(pod.state).then(|| MountedVolume::of(volume_name, volume, pod_name, pod))
            })
            .collect()
    }

    /// V35: `Mounted` or `Uncertain` entries of one pod.
    pub fn possibly_mounted_volumes_for_pod(&self, pod_name: &UniquePodName) -> Vec<MountedVolume> {
        self.pod_mounts(pod_name, |s| s != VolumeMountState::NotMounted)
    }

    /// V35: `Mounted` or `Uncertain` entries of every pod.
    pub fn all_mounted_volumes(&self) -> Vec<MountedVolume> {
        self.mounted(|_, s| s != VolumeMountState::NotMounted)
    }

    fn volumes(&self, filter: impl Fn(&VolumeEntry) -> bool) -> Vec<AttachedVolume> {
        self.volumes_in(Scope::All, filter)
    }

    fn volumes_in(
        &self,
        scope: Scope<'_>,
        filter: impl Fn(&VolumeEntry) -> bool,
    ) -> Vec<AttachedVolume> {
        scope
            .entries(&self.read().volumes)
            .filter(|(_, v)| filter(v))
            .map(|(name, v)| AttachedVolume {
                volume_name: name.clone(),
                spec: v.spec.clone(),
                plugin_name: v.plugin_name.clone(),
                attachability: v.attachability,
                device_state: v.device_state,
                device_path: v.device_path.clone(),
                device_mount_path: v.device_mount_path.clone(),
            })
            .collect()
    }

    /// Volumes per plugin (for the `volume_manager_total_volumes` metric).
    pub fn volume_counts_by_plugin(&self) -> BTreeMap<String, i64> {
        let inner = self.read();
        let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
        for v in inner.volumes.values() {
            *counts.entry(v.plugin_name.as_str()).or_insert(0) += 1;
        }
        counts.into_iter().map(|(k, n)| (k.to_owned(), n)).collect()
    }

    /// V35: every volume.
    pub fn attached_volumes(&self) -> Vec<AttachedVolume> {
        self.volumes(|_| true)
    }

    /// V35: volumes with no pod entries at all.
    pub fn unmounted_volumes(&self) -> Vec<AttachedVolume> {
        self.unmounted_volumes_in(Scope::All)
    }

    /// [`Self::unmounted_volumes`] among the volumes in `scope`.
    pub fn unmounted_volumes_in(&self, scope: Scope<'_>) -> Vec<AttachedVolume> {
        self.volumes_in(scope, |v| v.pods.is_empty())
    }

    /// V35: volumes whose global mount is `GloballyMounted`.
    pub fn globally_mounted_volumes(&self) -> Vec<AttachedVolume> {
        self.volumes(|v| v.device_state == DeviceMountState::GloballyMounted)
    }

    /// V39: adds the pod as `Uncertain` from reconstruction, unless it is already mounted or
    /// uncertain; returns whether it was added.
    pub fn check_and_mark_volume_as_uncertain_via_reconstruction(
        &self,
        opts: MarkVolumeOpts,
    ) -> Result<bool, AswError> {
        {
            let inner = self.read();
            let volume = inner
                .volumes
                .get(&opts.volume_name)
                .ok_or_else(|| AswError::VolumeNotAttached(opts.volume_name.clone()))?;
            if volume
                .pods
                .get(&opts.pod_name)
                .is_some_and(|p| p.state != VolumeMountState::NotMounted)
            {
                return Ok(false);
            }
        }
        let (volume_name, pod_name, pod_uid) = (
            opts.volume_name.clone(),
            opts.pod_name.clone(),
            opts.pod_uid.clone(),
        );
        self.mark_volume_mount_as_uncertain(opts)?;
        self.write(Touch::Volume(&volume_name))
            .found_during_reconstruction
            .entry(volume_name)
            .or_default()
            .insert(pod_name, pod_uid);
        Ok(true)
    }

    /// V39: the pair came from reconstruction and no real mount confirmed it yet.
    pub fn is_volume_reconstructed(
        &self,
        volume_name: &UniqueVolumeName,
        pod_name: &UniquePodName,
    ) -> bool {
        self.read()
            .found_during_reconstruction
            .get(volume_name)
            .is_some_and(|p| p.contains_key(pod_name))
    }

    /// V38 (upstream `IsVolumeDeviceReconstructed`): some pod's entry of the volume came from
    /// reconstruction and no real mount confirmed it yet, so the volume's device state came
    /// from reconstruction too.
    pub fn is_volume_device_reconstructed(&self, volume_name: &UniqueVolumeName) -> bool {
        self.read()
            .found_during_reconstruction
            .contains_key(volume_name)
    }

    /// V39: sets the device path while the device state is still `Uncertain`.
    pub fn update_reconstructed_device_path(
        &self,
        volume_name: &UniqueVolumeName,
        device_path: &str,
    ) {
        if let Some(v) = self
            .write(Touch::Volume(volume_name))
            .volumes
            .get_mut(volume_name)
            && v.device_state == DeviceMountState::Uncertain
        {
            v.device_path = device_path.to_owned();
        }
    }

    /// V39: sets attachability while it is still `Uncertain`.
    pub fn update_reconstructed_volume_attachability(
        &self,
        volume_name: &UniqueVolumeName,
        attachable: bool,
    ) {
        if let Some(v) = self
            .write(Touch::Volume(volume_name))
            .volumes
            .get_mut(volume_name)
            && v.attachability == Attachability::Uncertain
        {
            v.attachability = if attachable {
                Attachability::Attachable
            } else {
                Attachability::NotAttachable
            };
        }
    }

    /// V41: a reconstructed pod entry takes the DSW's outer name.
    pub fn sync_reconstructed_volume(
        &self,
        volume_name: &UniqueVolumeName,
        pod_name: &UniquePodName,
        outer_name: &str,
    ) {
        if let Some(pod) = self
            .write(Touch::Volume(volume_name))
            .volumes
            .get_mut(volume_name)
            .and_then(|v| v.pods.get_mut(pod_name))
            && pod.state == VolumeMountState::Uncertain
            && !pod.outer_names.iter().any(|n| n == outer_name)
        {
            pod.outer_names = vec![outer_name.to_owned()];
        }
    }

    /// The pods with any entry, for diagnostics.
    pub fn pods(&self) -> BTreeSet<UniquePodName> {
        self.read().by_pod.keys().cloned().collect()
    }
}

/// A read lock on the actual state, for a batch of lookups.
pub struct AswReader<'a>(std::sync::RwLockReadGuard<'a, Inner>);

impl AswReader<'_> {
    /// See [`ActualStateOfWorld::is_mounted_and_current`].
    pub fn is_mounted_and_current(
        &self,
        pod_name: &UniquePodName,
        volume_name: &UniqueVolumeName,
    ) -> bool {
        self.0
            .volumes
            .get(volume_name)
            .and_then(|v| v.pods.get(pod_name))
            .is_some_and(|p| {
                p.state == VolumeMountState::Mounted && p.remount_requested <= p.remount_served
            })
    }
}
