//! ConfigMap and Secret sources for the content volumes, as upstream's watch-based manager:
//! only the objects that registered pods reference are watched, one watch per object
//! (`fieldSelector=metadata.name=<name>` in the pod's namespace), reference counted by pod.
//! A watch starts when the first pod references the object and stops when the last one goes;
//! an immutable object stops being watched once it has been seen. Every change (created,
//! modified, deleted) is announced on [`ObjectSource::subscribe`], so the volume manager can
//! refresh the volumes built from it.
//!
//! [`ObjectSource::get`] answers from the watch's cache, waiting (up to
//! [`ObjectSourceConfig::sync_timeout`], upstream's 1 s) for the first list of a new watch.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::runtime::watcher;
use rustlet_core::PodUid;
use rustlet_core::refs::{ObjectKind, referenced_names};
use rustlet_volume::objects::{FetchFailure, ObjectChange, ObjectError};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::backend::{Backend, Stored, WatchItem};

/// A namespaced object a source can watch.
pub trait ContentObject: Stored {
    /// Which references of a pod name objects of this type.
    const OBJECT_KIND: ObjectKind;
    /// `immutable: true`: it can never change, so it need not be watched once seen.
    fn is_immutable(&self) -> bool;
}

impl ContentObject for ConfigMap {
    const OBJECT_KIND: ObjectKind = ObjectKind::ConfigMap;
    fn is_immutable(&self) -> bool {
        self.immutable == Some(true)
    }
}

impl ContentObject for Secret {
    const OBJECT_KIND: ObjectKind = ObjectKind::Secret;
    fn is_immutable(&self) -> bool {
        self.immutable == Some(true)
    }
}

/// `(namespace, name)` of a watched object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Its namespace (the referencing pod's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// What the watch of one object knows.
#[derive(Clone, Debug)]
pub enum ObjectState<K> {
    /// The first list has not answered yet.
    Syncing,
    /// The object as last seen.
    Present(Arc<K>),
    /// The object does not exist (or was deleted).
    Absent,
}

/// Tunables.
#[derive(Clone, Debug)]
pub struct ObjectSourceConfig {
    /// How long [`ObjectSource::get`] waits for a new watch's first list (upstream: 1 s).
    pub sync_timeout: Duration,
}

impl Default for ObjectSourceConfig {
    fn default() -> Self {
        Self {
            sync_timeout: Duration::from_secs(1),
        }
    }
}

struct Entry<K> {
    pods: usize,
    state: watch::Sender<ObjectState<K>>,
    stop: CancellationToken,
}

struct Inner<K> {
    objects: HashMap<ObjectKey, Entry<K>>,
    by_pod: HashMap<PodUid, BTreeSet<ObjectKey>>,
}

/// The ConfigMaps (or Secrets) that registered pods reference.
pub struct ObjectSource<K: ContentObject> {
    backend: Backend,
    config: ObjectSourceConfig,
    inner: Arc<Mutex<Inner<K>>>,
    changes: broadcast::Sender<ObjectChange>,
}

/// The ConfigMap source.
pub type ConfigMapSource = ObjectSource<ConfigMap>;
/// The Secret source.
pub type SecretSource = ObjectSource<Secret>;

impl<K: ContentObject> Debug for ObjectSource<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectSource")
            .field("kind", &K::OBJECT_KIND)
            .field("watched", &self.watched())
            .finish()
    }
}

impl<K: ContentObject> Drop for ObjectSource<K> {
    fn drop(&mut self) {
        for entry in self.lock().objects.values() {
            entry.stop.cancel();
        }
    }
}

impl<K: ContentObject> ObjectSource<K> {
    /// A source over `backend`; nothing is watched until a pod registers.
    pub fn new(backend: Backend, config: ObjectSourceConfig) -> Self {
        Self::announcing_on(backend, config, broadcast::channel(256).0)
    }

    /// A source that announces changes on `changes` (shared by the ConfigMap and Secret
    /// sources of one [`crate::objects::ApiObjects`]).
    pub fn announcing_on(
        backend: Backend,
        config: ObjectSourceConfig,
        changes: broadcast::Sender<ObjectChange>,
    ) -> Self {
        Self {
            backend,
            config,
            inner: Arc::new(Mutex::new(Inner {
                objects: HashMap::new(),
                by_pod: HashMap::new(),
            })),
            changes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The objects whose watch is running or whose immutable copy is kept.
    pub fn watched(&self) -> BTreeSet<ObjectKey> {
        self.lock().objects.keys().cloned().collect()
    }

    /// Announcements of changed objects (created, modified, deleted).
    pub fn subscribe(&self) -> broadcast::Receiver<ObjectChange> {
        self.changes.subscribe()
    }

    /// Register (or re-register, after a spec change) `pod`'s references. New references are
    /// added before old ones are dropped, so an object still referenced keeps its watch.
    /// Must be called inside a tokio runtime.
    pub fn register_pod(&self, pod: &Pod) {
        let uid = PodUid::of(pod);
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let keys: BTreeSet<ObjectKey> = referenced_names(pod, K::OBJECT_KIND)
            .into_iter()
            .map(|name| ObjectKey {
                namespace: namespace.clone(),
                name,
            })
            .collect();
        let mut inner = self.lock();
        for key in &keys {
            self.add_ref(&mut inner, key);
        }
        if let Some(old) = inner.by_pod.insert(uid, keys) {
            for key in old {
                Self::drop_ref(&mut inner, &key);
            }
        }
    }

    /// Drop `pod`'s references; watches nobody needs stop.
    pub fn unregister_pod(&self, pod: &Pod) {
        let uid = PodUid::of(pod);
        let mut inner = self.lock();
        if let Some(old) = inner.by_pod.remove(&uid) {
            for key in old {
                Self::drop_ref(&mut inner, &key);
            }
        }
    }

    fn add_ref(&self, inner: &mut Inner<K>, key: &ObjectKey) {
        if let Some(entry) = inner.objects.get_mut(key) {
            entry.pods += 1;
            return;
        }
        let state = watch::channel(ObjectState::Syncing).0;
        let stop = CancellationToken::new();
        let stream = self
            .backend
            .watch::<K>(Some(&key.namespace), &format!("metadata.name={}", key.name));
        tokio::spawn(watch_one(
            stream,
            key.clone(),
            state.clone(),
            self.changes.clone(),
            stop.clone(),
        ));
        inner.objects.insert(
            key.clone(),
            Entry {
                pods: 1,
                state,
                stop,
            },
        );
    }

    fn drop_ref(inner: &mut Inner<K>, key: &ObjectKey) {
        let Some(entry) = inner.objects.get_mut(key) else {
            return;
        };
        entry.pods -= 1;
        if entry.pods == 0 {
            entry.stop.cancel();
            inner.objects.remove(key);
        }
    }

    /// The object, from its watch's cache.
    pub async fn get(&self, namespace: &str, name: &str) -> Result<Arc<K>, ObjectError> {
        let key = ObjectKey {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        let failed = |reason| ObjectError::content(K::OBJECT_KIND, namespace, name, reason);
        let Some(mut state) = self.lock().objects.get(&key).map(|e| e.state.subscribe()) else {
            return Err(failed(FetchFailure::NotRegistered));
        };
        let waited = self.config.sync_timeout;
        let synced = tokio::time::timeout(
            waited,
            state.wait_for(|s| !matches!(s, ObjectState::Syncing)),
        )
        .await;
        let state = match synced {
            Ok(Ok(state)) => state.clone(),
            // The sender lives in the entry; a closed channel means it was unregistered.
            Ok(Err(_)) => return Err(failed(FetchFailure::NotRegistered)),
            Err(_) => return Err(failed(FetchFailure::NotSynced(waited))),
        };
        match state {
            ObjectState::Present(object) => Ok(object),
            ObjectState::Absent | ObjectState::Syncing => Err(failed(FetchFailure::NotFound)),
        }
    }
}

fn same_version<K: ContentObject>(state: &ObjectState<K>, object: &K) -> bool {
    match state {
        ObjectState::Present(old) => {
            old.meta().resource_version.is_some()
                && old.meta().resource_version == object.meta().resource_version
        }
        _ => false,
    }
}

async fn watch_one<K: ContentObject>(
    mut stream: BoxStream<'static, WatchItem<K>>,
    key: ObjectKey,
    state: watch::Sender<ObjectState<K>>,
    changes: broadcast::Sender<ObjectChange>,
    stop: CancellationToken,
) {
    let mut listed: Option<K> = None;
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            event = stream.next() => event,
        };
        let next = match event {
            None => return,
            Some(Err(err)) => {
                warn!(namespace = %key.namespace, name = %key.name, "{:?} watch: {err}", K::OBJECT_KIND);
                continue;
            }
            Some(Ok(watcher::Event::Init)) => {
                listed = None;
                continue;
            }
            Some(Ok(watcher::Event::InitApply(object))) => {
                listed = Some(object);
                continue;
            }
            Some(Ok(watcher::Event::InitDone)) => listed.take(),
            Some(Ok(watcher::Event::Apply(object))) => Some(object),
            Some(Ok(watcher::Event::Delete(_))) => None,
        };
        let immutable = next.as_ref().is_some_and(ContentObject::is_immutable);
        let mut changed = false;
        state.send_if_modified(|current| {
            let unchanged = match (&*current, &next) {
                (ObjectState::Absent, None) => true,
                (current, Some(object)) => same_version(current, object),
                _ => false,
            };
            let was_syncing = matches!(current, ObjectState::Syncing);
            *current = next.map_or(ObjectState::Absent, |o| ObjectState::Present(Arc::new(o)));
            // The first list is not a change: nothing was built from the object yet.
            changed = !was_syncing && !unchanged;
            was_syncing || !unchanged
        });
        if changed {
            // Nobody listening is fine: the change is in the cache either way.
            let _ = changes.send(ObjectChange {
                kind: K::OBJECT_KIND,
                namespace: key.namespace.clone(),
                name: key.name.clone(),
            });
        }
        if immutable {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
