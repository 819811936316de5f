//! The pods bound to this node, from a kube-runtime watcher with
//! `fieldSelector=spec.nodeName=<node>`: the pod-manager view of the status manager
//! (`rustlet_status::PodManager`) and the volume manager's `PodSource`, indexed by UID, with
//! static/mirror translation and a change signal the managers react to.
//!
//! Static pods come from the agent's own manifests, not from the API:
//! [`PodCache::set_static_pods`] replaces the whole static set after each read of the
//! directory (so a withdrawn or edited manifest's old pod goes), and a cache made
//! [`PodCache::with_static_source`] is ready only once both the API list and the static source
//! have been read. Mirror pods (the API copies of static pods) come from the watch. Every pod
//! from the API is marked `kubernetes.io/config.source: api`, as upstream's config layer does,
//! so a user's pod annotated `file` is never taken for a static pod.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use rustlet_core::pod::{is_mirror_pod, is_static_pod};
use rustlet_core::{ChangeLog, PodChanges, PodUid};
use rustlet_status::UidTranslations;
use tokio::sync::watch;
use tracing::warn;

use crate::backend::Backend;

type FullName = (String, String);

#[derive(Debug, Default)]
struct Pods {
    /// Non-mirror pods by UID.
    by_uid: HashMap<PodUid, Arc<Pod>>,
    /// Mirror pods by namespace and name (the static pod's full name).
    mirrors: HashMap<FullName, Arc<Pod>>,
    /// Static pods' UIDs by full name.
    statics: HashMap<FullName, PodUid>,
    /// The watch's objects while a (re)list is in progress.
    relist: Option<Vec<Pod>>,
    /// The first full list has arrived.
    synced: bool,
    /// A static source exists; `static_synced` says it was read once.
    static_expected: bool,
    static_synced: bool,
    /// Which pods changed (the status manager's full batch visits only those).
    changes: ChangeLog,
}

/// A pod's namespace and name.
pub(crate) fn full_name(pod: &Pod) -> FullName {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Gives back the room a decoder left in a pod's lists. A list decoded from JSON text grows by
/// doubling (serde cannot know its length ahead), so a list of one volume mount holds room for
/// four; a pod in the cache lives as long as it is the newest version (issue 29: decoding
/// through a `serde_json::Value` tree gave exact lists but cost twice the time of a decode).
fn compact(pod: &mut Pod) {
    fn shrink<T>(list: &mut Option<Vec<T>>) {
        if let Some(list) = list {
            list.shrink_to_fit();
        }
    }
    fn container(c: &mut k8s_openapi::api::core::v1::Container) {
        shrink(&mut c.args);
        shrink(&mut c.command);
        shrink(&mut c.env);
        shrink(&mut c.env_from);
        shrink(&mut c.ports);
        shrink(&mut c.resize_policy);
        shrink(&mut c.restart_policy_rules);
        shrink(&mut c.volume_devices);
        shrink(&mut c.volume_mounts);
    }
    shrink(&mut pod.metadata.owner_references);
    shrink(&mut pod.metadata.finalizers);
    shrink(&mut pod.metadata.managed_fields);
    if let Some(spec) = &mut pod.spec {
        spec.containers.shrink_to_fit();
        spec.containers.iter_mut().for_each(container);
        shrink(&mut spec.init_containers);
        spec.init_containers
            .iter_mut()
            .flatten()
            .for_each(container);
        shrink(&mut spec.ephemeral_containers);
        shrink(&mut spec.volumes);
        for volume in spec.volumes.iter_mut().flatten() {
            if let Some(projected) = &mut volume.projected {
                shrink(&mut projected.sources);
            }
        }
        shrink(&mut spec.tolerations);
        shrink(&mut spec.image_pull_secrets);
        shrink(&mut spec.host_aliases);
        shrink(&mut spec.readiness_gates);
        shrink(&mut spec.resource_claims);
        shrink(&mut spec.scheduling_gates);
        shrink(&mut spec.topology_spread_constraints);
    }
    if let Some(status) = &mut pod.status {
        shrink(&mut status.conditions);
        shrink(&mut status.container_statuses);
        shrink(&mut status.init_container_statuses);
        shrink(&mut status.ephemeral_container_statuses);
        shrink(&mut status.pod_ips);
        shrink(&mut status.host_ips);
        for statuses in [
            &mut status.container_statuses,
            &mut status.init_container_statuses,
            &mut status.ephemeral_container_statuses,
        ] {
            for status in statuses.iter_mut().flatten() {
                shrink(&mut status.volume_mounts);
            }
        }
    }
}

/// Upstream's config layer: a pod from the API server has source `api`.
fn from_api(mut pod: Pod) -> Pod {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            crate::static_pods::CONFIG_SOURCE.to_owned(),
            "api".to_owned(),
        );
    pod
}

impl Pods {
    fn insert(&mut self, mut pod: Pod) {
        compact(&mut pod);
        self.changes.record(PodUid::of(&pod));
        if is_mirror_pod(&pod) {
            self.mirrors.insert(full_name(&pod), Arc::new(pod));
        } else {
            if is_static_pod(&pod) {
                self.statics.insert(full_name(&pod), PodUid::of(&pod));
            }
            self.by_uid.insert(PodUid::of(&pod), Arc::new(pod));
        }
    }

    fn remove(&mut self, pod: &Pod) {
        self.changes.record(PodUid::of(pod));
        if is_mirror_pod(pod) {
            self.mirrors.remove(&full_name(pod));
        } else {
            self.by_uid.remove(&PodUid::of(pod));
        }
    }
}

/// The pod cache.
#[derive(Debug)]
pub struct PodCache {
    pods: RwLock<Pods>,
    changed: watch::Sender<u64>,
}

impl Default for PodCache {
    fn default() -> Self {
        Self {
            pods: RwLock::new(Pods::default()),
            changed: watch::channel(0).0,
        }
    }
}

impl PodCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// A receiver that sees a new value after every change (wire it to
    /// `VolumeManager::pod_updated`).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Pods> {
        self.pods.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Pods> {
        self.pods.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies one watcher event. A relist (`Init` … `InitDone`) replaces the API pods at once;
    /// static pods are kept.
    pub fn apply(&self, event: watcher::Event<Pod>) {
        {
            let mut pods = self.write();
            match event {
                watcher::Event::Apply(pod) => pods.insert(from_api(pod)),
                watcher::Event::Delete(pod) => pods.remove(&from_api(pod)),
                watcher::Event::Init => pods.relist = Some(Vec::new()),
                watcher::Event::InitApply(pod) => {
                    pods.relist.get_or_insert_with(Vec::new).push(from_api(pod))
                }
                watcher::Event::InitDone => {
                    let listed = pods.relist.take().unwrap_or_default();
                    let statics: Vec<Arc<Pod>> = pods
                        .by_uid
                        .values()
                        .filter(|p| is_static_pod(p))
                        .cloned()
                        .collect();
                    pods.by_uid.clear();
                    pods.mirrors.clear();
                    pods.changes.reset();
                    for pod in statics {
                        pods.by_uid.insert(PodUid::of(&pod), pod);
                    }
                    for pod in listed {
                        pods.insert(pod);
                    }
                    pods.synced = true;
                }
            }
        }
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A cache that also has a static pod source: it is ready only once
    /// [`Self::set_static_pods`] was called.
    pub fn with_static_source() -> Self {
        let cache = Self::default();
        cache.write().static_expected = true;
        cache
    }

    /// Adds or replaces one static pod (from the agent's manifests).
    pub fn upsert_static(&self, pod: Pod) {
        self.write().insert(pod);
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Replaces every static pod with `pods` (one read of the static source): pods no longer
    /// there are removed, new or changed ones inserted. Signals a change only if something
    /// changed.
    pub fn set_static_pods(&self, pods: Vec<Pod>) {
        let changed = {
            let mut cache = self.write();
            let was_synced = cache.static_synced;
            cache.static_synced = true;
            let old: HashMap<PodUid, Arc<Pod>> = cache
                .by_uid
                .iter()
                .filter(|(_, p)| is_static_pod(p))
                .map(|(u, p)| (u.clone(), p.clone()))
                .collect();
            let same = old.len() == pods.len()
                && pods
                    .iter()
                    .all(|p| old.get(&PodUid::of(p)).is_some_and(|o| **o == *p));
            if !same {
                for uid in old.keys() {
                    cache.by_uid.remove(uid);
                    cache.changes.record(uid.clone());
                }
                cache.statics.clear();
                for pod in pods {
                    cache.insert(pod);
                }
            }
            !same || !was_synced
        };
        if changed {
            self.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// The static pods.
    pub fn static_pods(&self) -> Vec<Arc<Pod>> {
        self.read()
            .by_uid
            .values()
            .filter(|p| is_static_pod(p))
            .cloned()
            .collect()
    }

    /// The mirror pods (the API's copies of static pods).
    pub fn mirror_pods(&self) -> Vec<Arc<Pod>> {
        self.read().mirrors.values().cloned().collect()
    }

    /// Runs the watch of the pods bound to `node_name` until the stream ends, feeding the
    /// cache. Watch errors are logged; the watcher retries on its own.
    pub async fn run(&self, backend: &Backend, node_name: &str) {
        let mut stream = backend.watch::<Pod>(None, &format!("spec.nodeName={node_name}"));
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => self.apply(event),
                Err(err) => warn!("pod watch: {err}"),
            }
        }
    }

    /// Every non-mirror pod.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.read().by_uid.values().cloned().collect()
    }
}

impl rustlet_status::PodManager for PodCache {
    fn pod_by_uid(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.read().by_uid.get(uid).cloned()
    }

    fn mirror_pod_of(&self, pod: &Pod) -> Option<Arc<Pod>> {
        self.read().mirrors.get(&full_name(pod)).cloned()
    }

    fn translate_pod_uid(&self, uid: &PodUid) -> PodUid {
        let pods = self.read();
        pods.mirrors
            .iter()
            .find(|(_, m)| PodUid::of(m) == *uid)
            .and_then(|(name, _)| pods.statics.get(name).cloned())
            .unwrap_or_else(|| uid.clone())
    }

    fn changes_since(&self, cursor: u64) -> PodChanges {
        self.read().changes.since(cursor)
    }

    fn uid_translations(&self) -> UidTranslations {
        let pods = self.read();
        let mut out = UidTranslations::default();
        for (name, static_uid) in &pods.statics {
            if !pods.by_uid.contains_key(static_uid) {
                continue;
            }
            let mirror = pods
                .mirrors
                .get(name)
                .map(|m| PodUid::of(m))
                .unwrap_or_default();
            if !mirror.is_empty() {
                out.mirror_to_pod.insert(mirror.clone(), static_uid.clone());
            }
            out.pod_to_mirror.insert(static_uid.clone(), mirror);
        }
        out
    }
}

impl rustlet_volume::populator::PodSource for PodCache {
    fn pods(&self) -> Vec<Arc<Pod>> {
        PodCache::pods(self)
    }

    fn all_sources_ready(&self) -> bool {
        let pods = self.read();
        pods.synced && (!pods.static_expected || pods.static_synced)
    }

    fn changes_since(&self, cursor: u64) -> PodChanges {
        self.read().changes.since(cursor)
    }

    fn pod(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.read().by_uid.get(uid).cloned()
    }
}

#[cfg(test)]
mod tests;
