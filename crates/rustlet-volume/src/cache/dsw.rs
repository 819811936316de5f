//! The desired state of world (upstream `cache/desired_state_of_world.go`): which volumes
//! should be mounted for which pods. Filled by the populator, read by the reconciler.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Volume};
use rustlet_core::quantity::quantity_ceil;
use rustlet_core::{UniquePodName, UniqueVolumeName};

use super::signals::{PodSignal, PodSignals};
use super::small_map::SmallMap;
use super::{Generational, Scope, Touch, Touched};
use crate::plugin::{PluginError, PluginManager, unique_volume_name};
use crate::spec::VolumeSpec;

/// Upstream `maxPodErrors`: a pod's error set stops growing past this size (V28).
pub const MAX_POD_ERRORS: usize = 10;

/// One (volume, pod) pair to mount (upstream `VolumeToMount`).
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeToMount {
    /// The unique volume name.
    pub volume_name: UniqueVolumeName,
    /// The pod.
    pub pod_name: UniquePodName,
    /// The pod object.
    pub pod: Arc<Pod>,
    /// What to mount.
    pub spec: VolumeSpec,
    /// The names in `pod.spec.volumes` that refer to it (usually one).
    pub outer_volume_spec_names: Vec<String>,
    /// The plugin attaches volumes to the node.
    pub plugin_is_attachable: bool,
    /// The plugin mounts a global path first.
    pub plugin_is_device_mountable: bool,
    /// `pv.beta.kubernetes.io/gid` of the PV, if any.
    pub volume_gid: Option<String>,
    /// The node status lists this volume in `volumesInUse` (V14).
    pub reported_in_use: bool,
    /// Size limit in bytes for local ephemeral volumes (V29); `None`: no limit.
    pub desired_size_limit: Option<u64>,
}

#[derive(Clone, Debug)]
struct PodToMount {
    pod: Arc<Pod>,
    spec: VolumeSpec,
    outer_names: Vec<String>,
    /// The plugin asks for periodic remounts of this volume (V19).
    remountable: bool,
}

#[derive(Clone, Debug)]
struct VolumeEntry {
    plugin_name: String,
    pods: SmallMap<UniquePodName, PodToMount>,
    attachable: bool,
    device_mountable: bool,
    gid: Option<String>,
    reported_in_use: bool,
    size_limit: Option<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    volumes: HashMap<UniqueVolumeName, VolumeEntry>,
    /// Per pod: outer name → volume (an index, so per-pod queries cost the pod's volumes).
    by_pod: HashMap<UniquePodName, SmallMap<String, UniqueVolumeName>>,
    pod_errors: HashMap<UniquePodName, BTreeSet<String>>,
}

/// One (volume, pod) pair as the reconciler gets it.
fn to_mount(
    volume_name: &UniqueVolumeName,
    pod_name: &UniquePodName,
    entry: &VolumeEntry,
    pod: &PodToMount,
) -> VolumeToMount {
    VolumeToMount {
        volume_name: volume_name.clone(),
        pod_name: pod_name.clone(),
        pod: pod.pod.clone(),
        spec: pod.spec.clone(),
        outer_volume_spec_names: pod.outer_names.clone(),
        plugin_is_attachable: entry.attachable,
        plugin_is_device_mountable: entry.device_mountable,
        volume_gid: entry.gid.clone(),
        reported_in_use: entry.reported_in_use,
        desired_size_limit: entry.size_limit,
    }
}

/// The desired state of world. One lock over everything, as upstream.
#[derive(Debug)]
pub struct DesiredStateOfWorld {
    state: Generational<Inner>,
    plugins: PluginManager,
    /// Signals to the tasks waiting on a pod's mounts: a pod's volumes added or removed, an
    /// error recorded for it.
    signals: Arc<PodSignals>,
}

const PV_GID_ANNOTATION: &str = "pv.beta.kubernetes.io/gid";

fn is_local_ephemeral(volume: &Volume) -> bool {
    volume.git_repo.is_some()
        || volume.config_map.is_some()
        || volume.downward_api.is_some()
        || volume
            .empty_dir
            .as_ref()
            .is_some_and(|e| e.medium.as_deref().unwrap_or("").is_empty())
}

fn ephemeral_limit(
    limits: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> u64 {
    limits
        .and_then(|l| l.get("ephemeral-storage"))
        .and_then(quantity_ceil)
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(0)
}

/// The pod's ephemeral-storage limit (upstream `PodLimits`): the sum over regular containers,
/// or the largest init container's when that is larger; 0 when none is set.
fn pod_ephemeral_limit(pod: &Pod) -> u64 {
    let Some(spec) = &pod.spec else { return 0 };
    let sum: u64 = spec
        .containers
        .iter()
        .map(|c| ephemeral_limit(c.resources.as_ref().and_then(|r| r.limits.as_ref())))
        .sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| ephemeral_limit(c.resources.as_ref().and_then(|r| r.limits.as_ref())))
        .max()
        .unwrap_or(0);
    sum.max(init)
}

/// V29: the size limit of a local ephemeral volume.
pub fn desired_size_limit(pod: &Pod, spec: &VolumeSpec) -> Option<u64> {
    let volume = spec.volume().filter(|v| is_local_ephemeral(v))?;
    let mut limit = pod_ephemeral_limit(pod);
    let size_limit = volume
        .empty_dir
        .as_ref()
        .and_then(|e| e.size_limit.as_ref())
        .and_then(quantity_ceil)
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(0);
    if size_limit > 0 && (limit == 0 || size_limit < limit) {
        limit = size_limit;
    }
    (limit > 0).then_some(limit)
}

impl DesiredStateOfWorld {
    /// An empty desired state over these plugins.
    pub fn new(plugins: PluginManager) -> Self {
        Self {
            state: Generational::default(),
            plugins,
            signals: Arc::default(),
        }
    }

    /// A signal of the changes to `pod`'s volumes and errors from now on. Take it before
    /// reading the state it is about.
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

    /// V25: adds (or refreshes) the pod's use of a volume; returns the unique volume name.
    /// Idempotent; a second outer name for the same volume is appended.
    pub fn add_pod_to_volume(
        &self,
        pod_name: &UniquePodName,
        pod: Arc<Pod>,
        spec: VolumeSpec,
        outer_name: &str,
    ) -> Result<UniqueVolumeName, PluginError> {
        let plugin = self.plugins.find_by_spec(&spec)?;
        let volume_name = unique_volume_name(plugin.as_ref(), &spec, pod_name)?;
        let gid = spec.persistent_volume().and_then(|pv| {
            pv.metadata
                .annotations
                .as_ref()?
                .get(PV_GID_ANNOTATION)
                .cloned()
        });
        let size_limit = desired_size_limit(&pod, &spec);
        {
            // A re-add of an unchanged pair (a reprocessed pod) writes nothing, so it does not
            // count as a change of the desired state.
            let inner = self.read();
            let unchanged = inner
                .volumes
                .get(&volume_name)
                .and_then(|v| v.pods.get(pod_name))
                .is_some_and(|p| {
                    p.spec == spec
                        && p.outer_names.iter().any(|n| n == outer_name)
                        && Arc::ptr_eq(&p.pod, &pod)
                });
            if unchanged {
                return Ok(volume_name);
            }
        }
        let mut guard = self.write(Touch::Volume(&volume_name));
        let inner = &mut *guard;
        let entry = inner
            .volumes
            .entry(volume_name.clone())
            .or_insert_with(|| VolumeEntry {
                plugin_name: plugin.name().to_owned(),
                pods: SmallMap::new(),
                attachable: plugin.is_attachable(),
                device_mountable: plugin.is_device_mountable(),
                gid,
                reported_in_use: false,
                size_limit,
            });
        let mut outer_names = entry
            .pods
            .get(pod_name)
            .map(|p| p.outer_names.clone())
            .unwrap_or_default();
        if !outer_names.iter().any(|n| n == outer_name) {
            outer_names.push(outer_name.to_owned());
        }
        let index = inner.by_pod.entry(pod_name.clone()).or_default();
        for outer in &outer_names {
            index.insert(outer.clone(), volume_name.clone());
        }
        let remountable = plugin.requires_remount(&spec);
        entry.pods.insert(
            pod_name.clone(),
            PodToMount {
                pod,
                spec,
                outer_names,
                remountable,
            },
        );
        drop(guard);
        self.signals.notify(pod_name);
        Ok(volume_name)
    }

    /// The object kept for `pod_name`'s volumes becomes `pod`, a newer version of the same pod
    /// (upstream's desired state points at the pod manager's object, which every update
    /// replaces). Keeping the first version instead would hold a second typed copy of every
    /// pod whose status changed since it was added. Nothing to mount changes; a pod whose
    /// volumes already hold `pod` is not written.
    pub fn refresh_pod(&self, pod_name: &UniquePodName, pod: &Arc<Pod>) {
        let holds_other = |inner: &Inner| {
            inner.by_pod.get(pod_name).is_some_and(|index| {
                index.values().any(|volume_name| {
                    inner
                        .volumes
                        .get(volume_name)
                        .and_then(|entry| entry.pods.get(pod_name))
                        .is_some_and(|p| !Arc::ptr_eq(&p.pod, pod))
                })
            })
        };
        if !holds_other(&self.read()) {
            return;
        }
        // The pod object only: nothing to mount changes.
        let mut guard = self.write(Touch::Nothing);
        let inner = &mut *guard;
        let Some(index) = inner.by_pod.get(pod_name) else {
            return;
        };
        for volume_name in index.values() {
            if let Some(p) = inner
                .volumes
                .get_mut(volume_name)
                .and_then(|entry| entry.pods.get_mut(pod_name))
            {
                p.pod = pod.clone();
            }
        }
    }

    /// V26: removes the pod from the volume, the volume when no pod is left, and the pod's
    /// errors.
    pub fn delete_pod_from_volume(&self, pod_name: &UniquePodName, volume_name: &UniqueVolumeName) {
        let mut guard = self.write(Touch::Volume(volume_name));
        let inner = &mut *guard;
        inner.pod_errors.remove(pod_name);
        if let Some(entry) = inner.volumes.get_mut(volume_name) {
            entry.pods.remove(pod_name);
            if entry.pods.is_empty() {
                inner.volumes.remove(volume_name);
            }
        }
        if let Some(index) = inner.by_pod.get_mut(pod_name) {
            index.retain(|_, v| v != volume_name);
            if index.is_empty() {
                inner.by_pod.remove(pod_name);
            }
        }
        drop(guard);
        self.signals.notify(pod_name);
    }

    /// A read view held across many lookups (one lock acquisition for a whole pass).
    pub fn reader(&self) -> DswReader<'_> {
        DswReader(self.read())
    }

    /// V27: the volume is desired for some pod.
    pub fn volume_exists(&self, volume_name: &UniqueVolumeName) -> bool {
        self.read().volumes.contains_key(volume_name)
    }

    /// V27: the volume is desired for this pod.
    pub fn pod_exists_in_volume(
        &self,
        pod_name: &UniquePodName,
        volume_name: &UniqueVolumeName,
    ) -> bool {
        self.read()
            .volumes
            .get(volume_name)
            .is_some_and(|v| v.pods.contains_key(pod_name))
    }

    /// Whether the pod has a volume whose inner spec name is `spec_name`.
    pub fn volume_exists_with_spec_name(&self, pod_name: &UniquePodName, spec_name: &str) -> bool {
        self.read().volumes.values().any(|v| {
            v.pods
                .get(pod_name)
                .is_some_and(|p| p.spec.name() == spec_name)
        })
    }

    /// Every (volume, pod) pair to mount.
    pub fn volumes_to_mount(&self) -> Vec<VolumeToMount> {
        self.volumes_to_mount_where(Scope::All, |_, _| true)
    }

    /// The volumes `pod_name` wants, through the per-pod index: costs the pod's volumes, not
    /// every pod's (a waiting pod asks on every change; cloning the whole desired state each
    /// time was quadratic in a storm of 1,000 pods).
    pub fn volumes_to_mount_for_pod(&self, pod_name: &UniquePodName) -> Vec<VolumeToMount> {
        let inner = self.read();
        let Some(index) = inner.by_pod.get(pod_name) else {
            return Vec::new();
        };
        let mut names: Vec<&UniqueVolumeName> = index.values().collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .filter_map(|volume_name| {
                let entry = inner.volumes.get(volume_name)?;
                let pod = entry.pods.get(pod_name)?;
                Some(to_mount(volume_name, pod_name, entry, pod))
            })
            .collect()
    }

    /// The (volume, pod) pairs of the volumes in `scope` for which `wanted(volume, pod)` is
    /// true, cloned; the others are only looked at (the reconciler's steady state clones
    /// nothing).
    pub fn volumes_to_mount_where(
        &self,
        scope: Scope<'_>,
        mut wanted: impl FnMut(&UniqueVolumeName, &UniquePodName) -> bool,
    ) -> Vec<VolumeToMount> {
        let inner = self.read();
        let mut out = Vec::new();
        for (volume_name, entry) in scope.entries(&inner.volumes) {
            for (pod_name, pod) in &entry.pods {
                if wanted(volume_name, pod_name) {
                    out.push(to_mount(volume_name, pod_name, entry, pod));
                }
            }
        }
        out
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

    /// The attachable volumes some pod wants (V12), without copying the pairs: the agent asks
    /// every second for `node.status.volumesInUse`.
    pub fn attachable_volume_names(&self) -> Vec<UniqueVolumeName> {
        self.read()
            .volumes
            .iter()
            .filter(|(_, entry)| entry.attachable && !entry.pods.is_empty())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// V22 (upstream `MarkVolumeAttachability`): the volume's plugin attaches, or no longer
    /// does. The unique name stays: a plugin that stops attaching is still device-mountable.
    pub fn mark_volume_attachability(&self, volume_name: &UniqueVolumeName, attachable: bool) {
        let mut inner = self.write(Touch::Volume(volume_name));
        if let Some(entry) = inner.volumes.get_mut(volume_name) {
            entry.attachable = attachable;
        }
    }

    /// V22's attachability re-check: the volumes held as attachable whose plugin no longer
    /// attaches (upstream: `FindAttachablePluginBySpec` finds the plugin but not as attachable,
    /// a CSI driver whose `attachRequired` changed). Only attachable entries are looked up.
    pub fn volumes_no_longer_attachable(&self) -> Vec<UniqueVolumeName> {
        self.read()
            .volumes
            .iter()
            .filter(|(_, entry)| entry.attachable)
            .filter(|(_, entry)| {
                entry.pods.values().next().is_some_and(|pod| {
                    self.plugins
                        .find_by_spec(&pod.spec)
                        .is_ok_and(|plugin| !plugin.is_attachable())
                })
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Whether `pod_name` has at least one desired volume.
    pub fn pod_has_volumes(&self, pod_name: &UniquePodName) -> bool {
        self.read().by_pod.contains_key(pod_name)
    }

    /// The pods that have at least one desired volume.
    pub fn pods(&self) -> BTreeSet<UniquePodName> {
        self.read().by_pod.keys().cloned().collect()
    }

    /// The pods with a volume whose plugin asks to be set up again now and then (V19's
    /// periodic remount: content volumes, refreshed from their sources).
    pub fn pods_requiring_remount(&self) -> BTreeSet<UniquePodName> {
        self.read()
            .volumes
            .values()
            .flat_map(|v| v.pods.iter())
            .filter(|(_, p)| p.remountable)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Outer volume name to unique volume name, for one pod.
    pub fn volume_names_for_pod(
        &self,
        pod_name: &UniquePodName,
    ) -> BTreeMap<String, UniqueVolumeName> {
        self.read()
            .by_pod
            .get(pod_name)
            .map_or_else(BTreeMap::new, |index| {
                index
                    .iter()
                    .map(|(outer, volume)| (outer.clone(), volume.clone()))
                    .collect()
            })
    }

    /// V14: exactly these volumes are reported in use (replace semantics).
    pub fn mark_volumes_reported_in_use(&self, reported: &[UniqueVolumeName]) {
        let mut inner = self.write(Touch::Nothing);
        let mut flipped = Vec::new();
        for (name, entry) in inner.volumes.iter_mut() {
            let now = reported.contains(name);
            if entry.reported_in_use != now {
                entry.reported_in_use = now;
                flipped.push(name.clone());
            }
        }
        self.state.touch(Touch::Volumes(&flipped));
    }

    /// V28: records an error for a pod (a set, bounded by [`MAX_POD_ERRORS`]).
    pub fn add_error_to_pod(&self, pod_name: &UniquePodName, error: impl Into<String>) {
        let mut inner = self.write(Touch::Nothing);
        let errors = inner.pod_errors.entry(pod_name.clone()).or_default();
        if errors.len() <= MAX_POD_ERRORS {
            errors.insert(error.into());
        }
        drop(inner);
        self.signals.notify(pod_name);
    }

    /// V28: the pod's errors, sorted, and clears them.
    pub fn pop_pod_errors(&self, pod_name: &UniquePodName) -> Vec<String> {
        self.write(Touch::Nothing)
            .pod_errors
            .remove(pod_name)
            .map(|e| e.into_iter().collect())
            .unwrap_or_default()
    }

    /// V28: the pods with errors.
    pub fn pods_with_errors(&self) -> Vec<UniquePodName> {
        self.read()
            .pod_errors
            .iter()
            .filter(|(_, e)| !e.is_empty())
            .map(|(p, _)| p.clone())
            .collect()
    }
}

/// A read lock on the desired state, for a batch of lookups.
pub struct DswReader<'a>(std::sync::RwLockReadGuard<'a, Inner>);

impl DswReader<'_> {
    /// See [`DesiredStateOfWorld::pod_exists_in_volume`].
    pub fn pod_exists_in_volume(
        &self,
        pod_name: &UniquePodName,
        volume_name: &UniqueVolumeName,
    ) -> bool {
        self.0
            .volumes
            .get(volume_name)
            .is_some_and(|v| v.pods.contains_key(pod_name))
    }
}
