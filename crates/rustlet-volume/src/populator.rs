//! The desired-state populator (upstream `populator/desired_state_of_world_populator.go`,
//! V17-V23): turns the pods bound to the node into (volume, pod) pairs of the desired state, and
//! removes the pairs of pods that are gone or whose containers have all stopped.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Pod, Volume};
use rustlet_core::{PodChanges, PodUid, UniquePodName};
use tracing::{debug, info, warn};

use crate::cache::{ActualStateOfWorld, DesiredStateOfWorld};
use crate::claims::{ClaimLookup, Claims, NodeIdentity};
use crate::objects::VolumeObjects;
use crate::spec::VolumeSpec;

/// The pods bound to this node (upstream `PodManager.GetPods`), mirror pods excluded.
pub trait PodSource: Send + Sync {
    /// Every pod.
    fn pods(&self) -> Vec<Arc<Pod>>;
    /// Whether every configured pod source has delivered its first full list (upstream
    /// `sourcesReady.AllReady`).
    fn all_sources_ready(&self) -> bool;
    /// The pods added, changed or removed since `cursor` (see [`rustlet_core::PodChanges`]),
    /// so that periodic work can tell that nothing changed. The default keeps no log: the
    /// work runs every period, as upstream's does.
    fn changes_since(&self, cursor: u64) -> rustlet_core::PodChanges {
        let _ = cursor;
        rustlet_core::PodChanges::All { cursor: 0 }
    }
    /// One pod by UID. The default looks through [`Self::pods`] (a copy of every pod: a source
    /// with an index should say so).
    fn pod(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.pods().into_iter().find(|p| PodUid::of(p) == *uid)
    }
}

/// What the pod workers know about a pod's lifecycle (V23).
pub trait PodStateProvider: Send + Sync {
    /// Termination has been requested (deleted, evicted, terminal phase).
    fn should_pod_containers_be_terminating(&self, uid: &PodUid) -> bool;
    /// Every container has stopped (or the pod is unknown once sources are synced).
    fn should_pod_runtime_be_removed(&self, uid: &PodUid) -> bool;
    /// The pods whose answers may have changed since `cursor` (see
    /// [`rustlet_core::PodChanges`]). The default keeps no log: every populator pass asks
    /// about every pod, as upstream's does.
    fn changes_since(&self, cursor: u64) -> rustlet_core::PodChanges {
        let _ = cursor;
        rustlet_core::PodChanges::All { cursor: 0 }
    }
}

/// V2: the names used by any container's `volumeMounts` or `volumeDevices` (init, regular,
/// ephemeral), split into (mounts, devices).
pub fn pod_volume_names(pod: &Pod) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut mounts, mut devices) = (BTreeSet::new(), BTreeSet::new());
    let Some(spec) = &pod.spec else {
        return (mounts, devices);
    };
    let mut visit =
        |vm: Option<&Vec<k8s_openapi::api::core::v1::VolumeMount>>,
         vd: Option<&Vec<k8s_openapi::api::core::v1::VolumeDevice>>| {
            mounts.extend(vm.into_iter().flatten().map(|m| m.name.clone()));
            devices.extend(vd.into_iter().flatten().map(|d| d.name.clone()));
        };
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        visit(c.volume_mounts.as_ref(), c.volume_devices.as_ref());
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        visit(c.volume_mounts.as_ref(), c.volume_devices.as_ref());
    }
    (mounts, devices)
}

fn unique_pod_name(pod: &Pod) -> UniquePodName {
    UniquePodName::from(pod_uid_str(pod))
}

/// The pod's UID as the populator's maps take it for a lookup (they key on [`UniquePodName`],
/// which borrows as `str`): the full pass over every pod allocates no name for a pod it knows.
fn pod_uid_str(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// What V20 gave for one volume of a pod.
enum SpecOutcome {
    Ready(Box<VolumeSpec>),
    /// A claim is being read; the pod is processed again when it is.
    Pending,
    Failed(String),
}

/// The populator.
pub struct Populator {
    dsw: Arc<DesiredStateOfWorld>,
    asw: Arc<ActualStateOfWorld>,
    pods: Arc<dyn PodSource>,
    states: Arc<dyn PodStateProvider>,
    /// Pod → processed. An entry with `false` means "seen, reprocess on next pass".
    processed: Arc<Mutex<HashMap<UniquePodName, bool>>>,
    /// Set after the first full pass once every source is ready (upstream `HasAddedPods`).
    has_added_pods: Arc<AtomicBool>,
    /// Where pods register the ConfigMaps and Secrets they reference (content volumes).
    objects: Option<Arc<dyn VolumeObjects>>,
    /// Each processed pod, in the version the desired state holds (and, with `objects`, the
    /// pods registered there), released once they are gone.
    registered: Mutex<HashMap<UniquePodName, Arc<Pod>>>,
    /// The labels and annotations a pod with downward API volumes was last processed with.
    downward: Mutex<HashMap<UniquePodName, PodFields>>,
    /// Claim lookups (PVC → PV), made off the pass.
    claims: Arc<Claims>,
    /// This node, for the PVs' node affinity.
    node: NodeIdentity,
    /// One copy of each distinct inline volume.
    volumes: VolumeInterner,
    /// How far [`Populator::populate_changed`] read the pod source's and the pod workers'
    /// change logs.
    cursors: Mutex<(u64, u64)>,
    /// Pods the next pass of what changed looks at whatever the logs say: asked to be
    /// processed again (V21), waiting for a claim lookup, or kept by V22's quirk (a mount may
    /// still complete).
    recheck: Mutex<HashSet<UniquePodName>>,
    /// How many times a pod was asked to be processed again (V21), for the tests of who asks.
    reprocess_requests: std::sync::atomic::AtomicU64,
}

/// Identical inline volumes (the replicas of one template) share one copy in the desired
/// state: a typed `Volume` is 3.3 KB inline whatever source it holds, and every pod volume
/// kept one (6.6 MB at 1,000 pods of two volumes). Each name remembers at most
/// [`VolumeInterner::PER_NAME`] distinct specs, so a lookup is a few comparisons at most;
/// a spec beyond them is kept on its own, as before.
#[derive(Debug, Default)]
struct VolumeInterner {
    by_name: Mutex<HashMap<String, Vec<std::sync::Weak<Volume>>>>,
}

impl VolumeInterner {
    const PER_NAME: usize = 16;

    fn intern(&self, volume: &Volume) -> Arc<Volume> {
        let mut by_name = self.by_name.lock().unwrap_or_else(|e| e.into_inner());
        if !by_name.contains_key(&volume.name) {
            by_name.insert(volume.name.clone(), Vec::new());
        }
        let known = by_name.get_mut(&volume.name).expect("inserted above");
        // A spec no pod holds any more is forgotten (its weak reference still pins the
        // allocation).
        known.retain(|w| w.strong_count() > 0);
        if let Some(same) = known
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .find(|v| **v == *volume)
        {
            return same;
        }
        let fresh = Arc::new(volume.clone());
        if known.len() >= Self::PER_NAME {
            known.remove(0);
        }
        known.push(Arc::downgrade(&fresh));
        fresh
    }
}

/// What a downward API volume can show that changes without a spec change.
type PodFields = (
    Option<std::collections::BTreeMap<String, String>>,
    Option<std::collections::BTreeMap<String, String>>,
);

/// Whether a volume of the pod shows pod fields (downwardAPI, or a projected downwardAPI).
fn uses_downward_api(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| {
            v.downward_api.is_some()
                || v.projected
                    .as_ref()
                    .is_some_and(|p| p.sources.iter().flatten().any(|s| s.downward_api.is_some()))
        })
}

impl Populator {
    /// A populator feeding `dsw`.
    pub fn new(
        dsw: Arc<DesiredStateOfWorld>,
        asw: Arc<ActualStateOfWorld>,
        pods: Arc<dyn PodSource>,
        states: Arc<dyn PodStateProvider>,
    ) -> Self {
        Self {
            dsw,
            asw,
            pods,
            states,
            processed: Arc::new(Mutex::new(HashMap::new())),
            has_added_pods: Arc::new(AtomicBool::new(false)),
            objects: None,
            registered: Mutex::new(HashMap::new()),
            downward: Mutex::new(HashMap::new()),
            volumes: VolumeInterner::default(),
            claims: Arc::new(Claims::default()),
            node: NodeIdentity::default(),
            cursors: Mutex::new((0, 0)),
            recheck: Mutex::new(HashSet::new()),
            reprocess_requests: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// This node, as PVs' node affinity sees it.
    pub fn with_node(mut self, node: NodeIdentity) -> Self {
        self.node = node;
        self
    }

    /// Notified when a claim lookup finished: a pass should run.
    pub fn claims_resolved(&self) -> Arc<tokio::sync::Notify> {
        self.claims.resolved.clone()
    }

    /// V20 (upstream `createVolumeSpec`).
    fn create_volume_spec(&self, pod: &Pod, name: &str, devices: &BTreeSet<String>) -> SpecOutcome {
        let Some(volume) = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref()?.iter().find(|v| v.name == name))
        else {
            return SpecOutcome::Failed(format!(
                "volume {name} is referenced by a container but not declared in the pod"
            ));
        };
        if volume.ephemeral.is_some() {
            return SpecOutcome::Failed(format!(
                "volume {name}: ephemeral volumes are not supported by this agent yet"
            ));
        }
        if let Some(source) = &volume.persistent_volume_claim {
            let Some(objects) = &self.objects else {
                return SpecOutcome::Failed(format!(
                    "volume {name}: PersistentVolumeClaims need an API to read them from"
                ));
            };
            if devices.contains(name) {
                return SpecOutcome::Failed(format!(
                    "volume {name} has volumeMode Filesystem, but is specified in volumeDevices"
                ));
            }
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            let pod_name = unique_pod_name(pod);
            let processed = self.processed.clone();
            let on_done = move || {
                processed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(pod_name, false);
            };
            return match self.claims.lookup(
                objects,
                namespace,
                &source.claim_name,
                &self.node,
                on_done,
            ) {
                ClaimLookup::Bound(pv) => SpecOutcome::Ready(Box::new(VolumeSpec::persistent(
                    *pv,
                    source.read_only.unwrap_or(false),
                ))),
                ClaimLookup::Failed(err) => SpecOutcome::Failed(err),
                ClaimLookup::Pending => SpecOutcome::Pending,
            };
        }
        if devices.contains(name) {
            return SpecOutcome::Failed(format!(
                "volume {name} has volumeMode Filesystem, but is specified in volumeDevices"
            ));
        }
        SpecOutcome::Ready(Box::new(VolumeSpec::Pod(self.volumes.intern(volume))))
    }

    fn downward(&self) -> std::sync::MutexGuard<'_, HashMap<UniquePodName, PodFields>> {
        self.downward.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pod's labels or annotations changed since its downward API volumes were set up
    /// (upstream notices at the next pod sync; the agent asks on every sync of the pod).
    pub fn downward_fields_changed(&self, pod: &Pod) -> bool {
        self.downward()
            .get(&unique_pod_name(pod))
            .is_some_and(|(labels, annotations)| {
                *labels != pod.metadata.labels || *annotations != pod.metadata.annotations
            })
    }

    /// Registers every pod's references with `objects` before any of its volumes is added
    /// (upstream's order: a mount never reads an object its pod has not registered), and
    /// releases them when the pod is gone (not at TearDown).
    pub fn with_objects(mut self, objects: Arc<dyn VolumeObjects>) -> Self {
        self.objects = Some(objects);
        self
    }

    fn registered(&self) -> std::sync::MutexGuard<'_, HashMap<UniquePodName, Arc<Pod>>> {
        self.registered.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The "desired state is complete" flag the reconciler reads before it unmounts anything.
    pub fn has_added_pods(&self) -> Arc<AtomicBool> {
        self.has_added_pods.clone()
    }

    fn cursors(&self) -> std::sync::MutexGuard<'_, (u64, u64)> {
        self.cursors.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn recheck(&self) -> std::sync::MutexGuard<'_, HashSet<UniquePodName>> {
        self.recheck.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn processed(&self) -> std::sync::MutexGuard<'_, HashMap<UniquePodName, bool>> {
        self.processed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the pod's volumes were all added and it is not asked to be processed again
    /// (upstream `podPreviouslyProcessed`).
    #[cfg(test)]
    pub(crate) fn pod_previously_processed(&self, pod_name: &UniquePodName) -> bool {
        self.processed().get(pod_name) == Some(&true)
    }

    /// A newer version of a processed pod that differs only where the populator does not look
    /// (its status, the metadata each write bumps) replaces the kept one here and in the
    /// desired state at once, not at the next pass (issue 29: in a storm every pod's status
    /// writes made newer versions faster than passes came, and the desired state kept a second
    /// typed copy of each until then). Anything else is left to the passes.
    pub fn refresh_pod_object(&self, pod: &Arc<Pod>) {
        if self.processed().get(pod_uid_str(pod)) != Some(&true) {
            return;
        }
        {
            let mut registered = self.registered();
            match registered.get_mut(pod_uid_str(pod)) {
                Some(kept)
                    if !Arc::ptr_eq(kept, pod)
                        && kept.spec == pod.spec
                        && kept.metadata.labels == pod.metadata.labels
                        && kept.metadata.annotations == pod.metadata.annotations
                        && kept.metadata.deletion_timestamp == pod.metadata.deletion_timestamp =>
                {
                    *kept = pod.clone();
                }
                _ => return,
            }
        }
        self.dsw.refresh_pod(&unique_pod_name(pod), pod);
    }

    /// V21: the pod is processed again on the next pass (the entry stays, with `false`).
    pub fn reprocess_pod(&self, pod_name: &UniquePodName) {
        self.reprocess_requests.fetch_add(1, Ordering::Relaxed);
        self.processed().insert(pod_name.clone(), false);
        self.recheck().insert(pod_name.clone());
    }

    /// How many times [`Self::reprocess_pod`] was called.
    #[cfg_attr(not(test), expect(dead_code, reason = "the tests' count of who asks"))]
    pub(crate) fn reprocess_requests(&self) -> u64 {
        self.reprocess_requests.load(Ordering::Relaxed)
    }

    /// One upstream `populatorLoop`; sets the has-added-pods flag after a full pass made while
    /// every source was ready (V17).
    pub fn populate(&self) {
        let sources_ready = self.pods.all_sources_ready();
        let steady = self.has_added_pods.load(Ordering::Acquire);
        let pods = self.pods.pods();
        for pod in &pods {
            self.add_pod(pod, steady);
        }
        // V22's attachability re-check. Deviations: upstream makes it for the pairs of pods
        // still in the pod manager, on every pass; here it is made per volume (the flag is the
        // volume's), on the full passes only: nothing that changes a plugin's attachability is
        // logged as a pod change, and the agent's own plugins never change theirs.
        for volume in self.dsw.volumes_no_longer_attachable() {
            info!(volume = %volume, "Volume changes from attachable to non-attachable");
            self.dsw.mark_volume_attachability(&volume, false);
        }
        // V22 for every pod the desired state or the populator's own maps know; the same
        // decision per pod as a pass of what changed makes.
        let known: HashMap<&str, &Arc<Pod>> = pods.iter().map(|p| (pod_uid_str(p), p)).collect();
        let mut names: HashSet<UniquePodName> = self.dsw.pods().into_iter().collect();
        names.extend(self.dsw.pods_with_errors());
        names.extend(self.processed().keys().cloned());
        names.extend(self.downward().keys().cloned());
        names.extend(self.registered().keys().cloned());
        for name in &names {
            self.remove_pod(name, known.get(name.as_str()).copied());
        }
        if sources_ready {
            self.has_added_pods.store(true, Ordering::Release);
        }
    }

    /// The add half of a pass, for one pod of the source.
    fn add_pod(&self, pod: &Arc<Pod>, steady: bool) {
        // The object processed last time: nothing to do whatever its state (the question
        // below, its UID's allocation and a lookup, was half of a full pass of an idle node).
        if self.is_processed_object(pod) {
            return;
        }
        let uid = PodUid::of(pod);
        let skip = if steady {
            self.states.should_pod_containers_be_terminating(&uid)
        } else {
            self.states.should_pod_runtime_be_removed(&uid)
        };
        // A pod that is terminal in the API and was never set up here (found so after a
        // restart: it finished before) runs no container again: nothing to mount for it.
        let finished_before = pod
            .status
            .as_ref()
            .is_some_and(|s| rustlet_core::pod::PodPhase::of(s).is_terminal())
            && !self.processed().contains_key(pod_uid_str(pod));
        if !skip && !finished_before {
            self.process_pod_volumes(pod);
        }
    }

    /// A pass over the pods that changed since the last pass (issue 15): those the pod source
    /// or the pod workers logged, and those kept for a later look (asked to be processed again,
    /// waiting for a claim, V22's quirk): no walk over every processed pod. The same decisions as [`Self::populate`], which looks at every
    /// pod and which this falls back to before the desired state is complete or when a log
    /// cannot answer.
    pub fn populate_changed(&self) {
        let steady = self.has_added_pods.load(Ordering::Acquire);
        let (source, states) = {
            let mut cursors = self.cursors();
            let source = self.pods.changes_since(cursors.0);
            let states = self.states.changes_since(cursors.1);
            cursors.0 = source.cursor();
            cursors.1 = states.cursor();
            (source, states)
        };
        // What changed so far is covered by a full pass too (the cursors moved on).
        let (
            PodChanges::Since { uids: changed, .. },
            PodChanges::Since {
                uids: state_changed,
                ..
            },
        ) = (source, states)
        else {
            return self.populate();
        };
        if !steady {
            return self.populate();
        }
        let mut visit: HashSet<UniquePodName> = std::mem::take(&mut *self.recheck());
        visit.extend(
            changed
                .into_iter()
                .chain(state_changed)
                .map(UniquePodName::from),
        );
        for name in visit {
            let known = self.pods.pod(&PodUid::from(&name));
            if let Some(pod) = &known {
                self.add_pod(pod, steady);
            }
            self.remove_pod(&name, known.as_ref());
        }
    }

    /// The removal half of a pass (V22), for one pod; `known`: the pod in the source. Removes
    /// its pairs once its runtime is gone (but V22's quirk), and forgets what the populator
    /// kept of a pod that is neither in the source nor in the desired state.
    fn remove_pod(&self, name: &UniquePodName, known: Option<&Arc<Pod>>) {
        let uid = PodUid::from(name);
        let runtime_removed = self.states.should_pod_runtime_be_removed(&uid);
        if runtime_removed {
            for volume in self.dsw.volume_names_for_pod(name).into_values() {
                // Upstream quirk (V22 step 3): a known pod whose volume never mounted stays;
                // a later pass looks again (its mount may complete).
                if known.is_some() && self.asw.pod_removed_from_volume(name, &volume) {
                    self.recheck().insert(name.clone());
                    continue;
                }
                if !self.dsw.pod_exists_in_volume(name, &volume) {
                    continue; // the same volume under two outer names
                }
                debug!(pod = %name, volume = %volume, "Removing volume from desired state");
                self.dsw.delete_pod_from_volume(name, &volume);
                self.processed().remove(name);
            }
        }
        if known.is_some() {
            return;
        }
        self.dsw.pop_pod_errors(name);
        if self.dsw.pod_has_volumes(name) {
            return;
        }
        self.downward().remove(name);
        if runtime_removed {
            self.processed().remove(name);
            let gone = self.registered().remove(name);
            if let (Some(objects), Some(pod)) = (&self.objects, gone) {
                objects.unregister_pod(&pod);
            }
        }
    }

    /// This very object was processed (no newer version came since): processing it again
    /// would change nothing.
    fn is_processed_object(&self, pod: &Arc<Pod>) -> bool {
        let uid = pod_uid_str(pod);
        // One lock at a time (no order between the two to keep).
        let processed = self.processed().get(uid) == Some(&true);
        processed
            && self
                .registered()
                .get(uid)
                .is_some_and(|kept| Arc::ptr_eq(kept, pod))
    }

    /// V19.
    fn process_pod_volumes(&self, pod: &Arc<Pod>) {
        if self.processed().get(pod_uid_str(pod)) == Some(&true) {
            // The latest version replaces the one kept, so a pod is held once, not twice. The
            // version the desired state holds is the one kept here: the same object (every
            // pass of an idle node, over every pod) needs no look at the desired state.
            {
                let mut registered = self.registered();
                match registered.get_mut(pod_uid_str(pod)) {
                    Some(kept) if Arc::ptr_eq(kept, pod) => return,
                    Some(kept) => *kept = pod.clone(),
                    None => {
                        registered.insert(unique_pod_name(pod), pod.clone());
                    }
                }
            }
            self.dsw.refresh_pod(&unique_pod_name(pod), pod);
            return;
        }
        let pod_name = unique_pod_name(pod);
        if let Some(objects) = &self.objects {
            // Again on every reprocess: a changed spec adds its new references first.
            objects.register_pod(pod);
        }
        self.registered().insert(pod_name.clone(), pod.clone());
        let (mounts, devices) = pod_volume_names(pod);
        let mut all_added = true;
        let mut pending = false;
        let mut added_names = Vec::new();
        for name in mounts.union(&devices) {
            let added = match self.create_volume_spec(pod, name, &devices) {
                SpecOutcome::Ready(spec) => self
                    .dsw
                    .add_pod_to_volume(&pod_name, pod.clone(), *spec, name)
                    .map(|volume_name| added_names.push(volume_name))
                    .map_err(|e| e.to_string()),
                SpecOutcome::Failed(err) => Err(err),
                SpecOutcome::Pending => {
                    pending = true;
                    all_added = false;
                    continue;
                }
            };
            if let Err(err) = added {
                warn!(pod = %pod_name, volume = %name, "Error processing volume: {err}");
                self.dsw.add_error_to_pod(&pod_name, err);
                all_added = false;
            }
        }
        if uses_downward_api(pod) {
            let fields = (
                pod.metadata.labels.clone(),
                pod.metadata.annotations.clone(),
            );
            self.downward().insert(pod_name.clone(), fields);
        }
        let mut processed = self.processed();
        if pending {
            // Processed again once the claim lookup ends (it marks the pod).
            processed.entry(pod_name.clone()).or_insert(false);
            drop(processed);
            self.recheck().insert(pod_name);
            return;
        }
        if all_added {
            processed.insert(pod_name.clone(), true);
            drop(processed);
            self.asw.mark_remount_required(&pod_name, &added_names);
            self.dsw.pop_pod_errors(&pod_name);
        } else if let Some(flag) = processed.get_mut(&pod_name) {
            // Seen before (by a wait's reprocess): retried only after the next reprocess, so a
            // broken pod does not cost API calls every pass.
            *flag = true;
        }
    }
}

#[cfg(test)]
mod interner_tests {
    use super::*;

    fn empty_dir(name: &str, medium: Option<&str>) -> Volume {
        Volume {
            name: name.into(),
            empty_dir: Some(k8s_openapi::api::core::v1::EmptyDirVolumeSource {
                medium: medium.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn identical_volumes_share_one_copy_and_different_ones_do_not() {
        let interner = VolumeInterner::default();
        let a = interner.intern(&empty_dir("cache", None));
        let b = interner.intern(&empty_dir("cache", None));
        assert!(Arc::ptr_eq(&a, &b), "replicas share the spec");
        let tmpfs = interner.intern(&empty_dir("cache", Some("Memory")));
        assert!(!Arc::ptr_eq(&a, &tmpfs));
        assert_eq!(
            tmpfs.empty_dir.as_ref().unwrap().medium.as_deref(),
            Some("Memory")
        );
        let other = interner.intern(&empty_dir("scratch", None));
        assert!(!Arc::ptr_eq(&a, &other));
        assert_eq!(other.name, "scratch");
        // Once no pod holds a spec, an equal one is a fresh copy.
        drop((a, b));
        let again = interner.intern(&empty_dir("cache", None));
        assert_eq!(Arc::strong_count(&again), 1);
    }

    #[test]
    fn a_name_remembers_a_bounded_number_of_specs() {
        let interner = VolumeInterner::default();
        let held: Vec<Arc<Volume>> = (0..40)
            .map(|i| interner.intern(&empty_dir("v", Some(&format!("m{i}")))))
            .collect();
        let by_name = interner.by_name.lock().unwrap();
        assert_eq!(by_name["v"].len(), VolumeInterner::PER_NAME);
        drop(by_name);
        // The newest are still shared, every spec stays right.
        let last = interner.intern(&empty_dir("v", Some("m39")));
        assert!(Arc::ptr_eq(&last, &held[39]));
        let first = interner.intern(&empty_dir("v", Some("m0")));
        assert!(!Arc::ptr_eq(&first, &held[0]));
        assert_eq!(*first, *held[0]);
    }
}
