//! The pods bound to this node, from a kube-runtime watcher with
//! `fieldSelector=spec.nodeName=<node>`: the pod-manager view of the status manager
//! (`rustlet_status::PodManager`) and the volume manager's `PodSource`, indexed by UID, with
//! static/mirror translation and a change signal the managers react to.
//!
//! Static pods come from the agent's own manifests, not from the API; [`PodCache::upsert_static`]
//! adds them. Mirror pods (the API copies of static pods) come from the watch.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use rustlet_core::PodUid;
use rustlet_core::pod::{is_mirror_pod, is_static_pod};
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
}

fn full_name(pod: &Pod) -> FullName {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

impl Pods {
    fn insert(&mut self, pod: Pod) {
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
                watcher::Event::Apply(pod) => pods.insert(pod),
                watcher::Event::Delete(pod) => pods.remove(&pod),
                watcher::Event::Init => pods.relist = Some(Vec::new()),
                watcher::Event::InitApply(pod) => {
                    pods.relist.get_or_insert_with(Vec::new).push(pod)
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

    /// Adds or replaces a static pod (from the agent's manifests).
    pub fn upsert_static(&self, pod: Pod) {
        self.write().insert(pod);
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
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
        self.read().synced
    }
}

#[cfg(test)]
mod tests;
