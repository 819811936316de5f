//! Static pods: pods from the agent's own manifest directory (`--pod-manifest-path`; upstream
//! `pkg/kubelet/config/file.go` and `common.go` `applyDefaults`, spec W28-W29), and their mirror
//! pods in the API (upstream `mirror_client.go`, W30).
//!
//! * One pod per file (`*.yaml`, `*.yml`, `*.json`; dotfiles ignored; at most
//!   [`crate::local::manifests::MAX_MANIFEST_BYTES`]), decoded, defaulted and validated as the
//!   API server would (`local::admission`). A file that does not hold exactly one valid pod is
//!   reported (path, position) and skipped.
//! * Defaults: name `<name>-<node>`, namespace `default` if empty, `spec.nodeName` = the node,
//!   the `{operator: Exists, effect: NoExecute}` toleration, phase Pending, and without a UID
//!   one derived from the file, the node and the decoded pod (so an edit is a new pod and a
//!   restart keeps it; deviation: SHA-256 where upstream hashes with MD5, so the UIDs differ
//!   from a kubelet's). Annotations `kubernetes.io/config.hash` = the UID and
//!   `kubernetes.io/config.source: file`, and `kubernetes.io/config.seen` (upstream's config
//!   layer's first-seen time): the time a UID first appeared in a read, kept while every read
//!   has it. A manifest removed and written again (its pod removed and added back, upstream:
//!   the pod workers restart it once it terminated) gets a new one even when the removal and
//!   the write fall in one burst of the [`DirWatch`] and the read sees the same file
//!   ([`DirWatch::take_removed`]): the pods of the removed names leave the cache first.
//! * [`MirrorPods`] keeps one mirror pod in the API per static pod, following the pod workers
//!   ([`StaticPodWorkers`]) as upstream's `syncPod` and housekeeping do: a copy with
//!   `kubernetes.io/config.mirror` = the static pod's hash and a controller owner reference to
//!   the Node is created, and a mirror being deleted or with another hash replaced, only for a
//!   static pod whose worker started it (W9: an edited manifest's new pod waits until the old
//!   one stopped, and the old mirror stays meanwhile); a mirror without a static pod is deleted
//!   once the sources were read and no static pod of its name still runs or stops (deletions:
//!   grace 0, the mirror's UID as precondition). Deleting a mirror never stops the static pod.
//!   Deviations: the pass runs on every change of the pod cache or of the static pods' workers
//!   and every 10 s, where upstream reconciles a mirror in its static pod's `syncPod`; and
//!   upstream's `fastStaticPodsRegistration` (every missing mirror made once when the Node is
//!   registered, whatever its worker) is not done: a static pod's worker starts at once unless
//!   an earlier incarnation of its manifest still runs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use rustlet_core::PodUid;
use rustlet_status::ClientError;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::dir_watch::DirWatch;
use crate::kube_status::client_error;
use crate::local::admission::{Operation, admit};
use crate::local::manifests::{MAX_MANIFEST_BYTES, ManifestError, parse_documents};
use crate::local::store::{Kind, ObjectRef, StoreError, uid_from};
use crate::pod_cache::{PodCache, full_name};

/// `kubernetes.io/config.source`: where a pod comes from (`api` or `file`).
pub const CONFIG_SOURCE: &str = rustlet_core::pod::CONFIG_SOURCE_ANNOTATION;
/// `kubernetes.io/config.hash`: a static pod's UID.
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
/// `kubernetes.io/config.seen`: when the source first saw the pod.
pub const CONFIG_SEEN: &str = rustlet_core::pod::CONFIG_SEEN_ANNOTATION;
/// `kubernetes.io/config.mirror`: on a mirror pod, the hash of its static pod.
pub const CONFIG_MIRROR: &str = rustlet_core::pod::CONFIG_MIRROR_ANNOTATION;

/// How often the directory is read again while it has no inotify watch.
pub const STATIC_SCAN_INTERVAL: Duration = Duration::from_secs(1);

/// The static pods of one directory.
#[derive(Clone, Debug)]
pub struct StaticPodSource {
    dir: PathBuf,
    node_name: String,
}

fn is_manifest(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or(".");
    let ext = path.extension().and_then(|e| e.to_str());
    !name.starts_with('.') && matches!(ext, Some("yaml" | "yml" | "json")) && path.is_file()
}

impl StaticPodSource {
    /// The static pods in `dir` for the node `node_name`.
    pub fn new(dir: impl Into<PathBuf>, node_name: impl Into<String>) -> Self {
        Self {
            dir: dir.into(),
            node_name: node_name.into(),
        }
    }

    /// Reads every manifest: the pods, and the files skipped with why.
    pub fn scan(&self) -> (Vec<Pod>, Vec<ManifestError>) {
        let (files, errors) = self.scan_files();
        (files.into_iter().map(|(_, pod)| pod).collect(), errors)
    }

    /// [`Self::scan`] with the file each pod was read from.
    pub fn scan_files(&self) -> (Vec<(PathBuf, Pod)>, Vec<ManifestError>) {
        let mut pods = BTreeMap::new();
        let mut errors = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => {
                errors.push(ManifestError::Read {
                    path: self.dir.clone(),
                    message: e.to_string(),
                });
                return (Vec::new(), errors);
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| is_manifest(p))
            .collect();
        paths.sort();
        for path in paths {
            match self.read(&path) {
                Ok(pod) => {
                    let key = (
                        pod.metadata.namespace.clone().unwrap_or_default(),
                        pod.metadata.name.clone().unwrap_or_default(),
                    );
                    match pods.entry(key) {
                        std::collections::btree_map::Entry::Occupied(taken) => {
                            let (ns, name) = taken.key();
                            errors.push(invalid(
                                &path,
                                format!("another file already defines pod {ns}/{name}"),
                            ));
                        }
                        std::collections::btree_map::Entry::Vacant(slot) => {
                            slot.insert((path, pod));
                        }
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        (pods.into_values().collect(), errors)
    }

    fn read(&self, path: &Path) -> Result<Pod, ManifestError> {
        let size = std::fs::metadata(path).map_or(0, |m| m.len());
        if size > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge {
                path: path.to_owned(),
                size,
            });
        }
        let text = std::fs::read_to_string(path).map_err(|e| ManifestError::Read {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let mut documents = parse_documents(path, &text)?;
        if documents.len() != 1 {
            return Err(invalid(
                path,
                format!(
                    "a static pod manifest holds one pod, this one {} documents",
                    documents.len()
                ),
            ));
        }
        static_pod(path, documents.remove(0), &self.node_name)
    }

    /// Reads the directory into `cache` until cancelled: at once, on every change its
    /// [`DirWatch`] announces, and every [`DirWatch::period`] (the first read marks the static
    /// source ready). Each read runs on the blocking pool.
    pub async fn run(self, cache: Arc<PodCache>, cancel: CancellationToken) {
        let mut watch = DirWatch::new(&self.dir, STATIC_SCAN_INTERVAL);
        let mut next = tokio::time::Instant::now();
        let mut reported: Vec<String> = Vec::new();
        let mut seen = FirstSeen::default();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = watch.changed() => {}
                () = tokio::time::sleep_until(next) => {}
            }
            let removed = watch.take_removed();
            // Files of up to 10 MiB read and parsed: on the blocking pool (issue 24, item 14).
            let source = self.clone();
            let (files, errors) =
                match tokio::task::spawn_blocking(move || source.scan_files()).await {
                    Ok(scanned) => scanned,
                    Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
                    Err(_) => return,
                };
            let now: Vec<String> = errors.iter().map(ToString::to_string).collect();
            if now != reported {
                for error in &now {
                    warn!("static pod manifest skipped: {error}");
                }
                reported = now;
            }
            if let Some(without) = seen.without_removed(&files, &removed) {
                // Upstream's file source handled the removal on its own: the pod left.
                cache.set_static_pods(without);
            }
            cache.set_static_pods(seen.stamp(files));
            watch.rearm();
            next = tokio::time::Instant::now() + watch.period();
        }
    }
}

/// `kubernetes.io/config.seen` of the static pods: when each UID was first read, until a read
/// no longer has it.
#[derive(Debug, Default)]
struct FirstSeen {
    by_uid: HashMap<PodUid, String>,
}

impl FirstSeen {
    /// The pods of one read, each with its first-seen time (now, for a UID the last read did
    /// not have); UIDs it does not have are forgotten.
    fn stamp(&mut self, files: Vec<(PathBuf, Pod)>) -> Vec<Pod> {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut by_uid = HashMap::with_capacity(files.len());
        let pods = files
            .into_iter()
            .map(|(_, mut pod)| {
                let uid = PodUid::of(&pod);
                let at = self.by_uid.remove(&uid).unwrap_or_else(|| now.clone());
                pod.metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(CONFIG_SEEN.into(), at.clone());
                by_uid.insert(uid, at);
                pod
            })
            .collect();
        self.by_uid = by_uid;
        pods
    }

    /// When the last burst removed (or renamed away) the file of a pod of `files`: the pods of
    /// `files` without those, stamped (the removed ones are forgotten, so that they are seen
    /// anew). `None` when it removed none of them.
    fn without_removed(
        &mut self,
        files: &[(PathBuf, Pod)],
        removed: &BTreeSet<OsString>,
    ) -> Option<Vec<Pod>> {
        let was_removed = |path: &Path| path.file_name().is_some_and(|n| removed.contains(n));
        if !files.iter().any(|(path, _)| was_removed(path)) {
            return None;
        }
        let kept = files
            .iter()
            .filter(|(path, _)| !was_removed(path))
            .cloned()
            .collect();
        Some(self.stamp(kept))
    }
}

fn invalid(path: &Path, message: String) -> ManifestError {
    ManifestError::Invalid {
        path: path.to_owned(),
        document: 1,
        source: Box::new(StoreError::Invalid(message)),
    }
}

/// W29 for one decoded document, for the fuzz targets (`fuzz/`): the static pod a manifest
/// file's one document `object` at `path` gives on the node `node_name`.
#[cfg(feature = "fuzzing")]
pub fn fuzz_static_pod(path: &Path, object: Value, node_name: &str) -> Result<Pod, ManifestError> {
    static_pod(path, object, node_name)
}

/// W29 for one decoded document.
fn static_pod(path: &Path, mut object: Value, node_name: &str) -> Result<Pod, ManifestError> {
    if object["kind"] != "Pod" {
        return Err(invalid(
            path,
            format!(
                "a static pod manifest holds a Pod, not a {}",
                object["kind"]
            ),
        ));
    }
    let node = node_name.to_lowercase();
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if name.is_empty() {
        return Err(invalid(path, "metadata.name: Required value".into()));
    }
    let namespace = match object["metadata"]["namespace"].as_str() {
        Some(ns) if !ns.is_empty() => ns.to_owned(),
        _ => "default".to_owned(),
    };
    object["metadata"]["name"] = Value::String(format!("{name}-{node}"));
    object["metadata"]["namespace"] = Value::String(namespace.clone());
    if !object["spec"].is_object() {
        object["spec"] = serde_json::json!({});
    }
    object["spec"]["nodeName"] = Value::String(node_name.to_owned());
    if let Some(o) = object.as_object_mut() {
        o.remove("status");
    }
    let reference = ObjectRef::new(Kind::Pod, &namespace, &format!("{name}-{node}"));
    let admitted =
        admit(&reference, object, Operation::Create).map_err(|source| ManifestError::Invalid {
            path: path.to_owned(),
            document: 1,
            source: Box::new(source),
        })?;
    let mut pod: Pod =
        serde_json::from_value(admitted).map_err(|e| invalid(path, e.to_string()))?;
    let uid = match pod.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid.to_owned(),
        _ => {
            let seed = format!(
                "{}\0host:{node_name}\0file:{}",
                serde_json::to_string(&pod).unwrap_or_default(),
                path.display()
            );
            uid_from(seed.as_bytes())
        }
    };
    pod.metadata.uid = Some(uid.clone());
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_HASH.into(), uid);
    annotations.insert(CONFIG_SOURCE.into(), "file".into());
    let spec = pod.spec.get_or_insert_with(Default::default);
    let no_execute = Toleration {
        operator: Some("Exists".into()),
        effect: Some("NoExecute".into()),
        ..Default::default()
    };
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    if !tolerations.contains(&no_execute) {
        tolerations.push(no_execute);
    }
    Ok(pod)
}

/// What the pod workers say about static pods, for their mirror pods. `rustlet-pods` answers
/// (its lifecycle table); the binary connects the two.
pub trait StaticPodWorkers: Send + Sync {
    /// Whether the static pod `uid` was allowed to start (W9: no earlier incarnation of its
    /// full name still runs; upstream `allowPodStart`) and is syncing: upstream's `syncPod`
    /// runs for it, which creates its mirror or replaces an outdated one
    /// (`tryReconcileMirrorPods`).
    fn is_syncing(&self, uid: &PodUid) -> bool;

    /// Upstream `IsPodForMirrorPodTerminatingByFullName`, asked for a mirror pod whose static
    /// pod left the source: whether the started static pod named `namespace`/`name` has not
    /// terminated yet. Its orphaned mirror stays until it has.
    fn is_terminating(&self, namespace: &str, name: &str) -> bool;

    /// A receiver that sees a new value whenever an answer of [`Self::is_syncing`] or
    /// [`Self::is_terminating`] may have changed (a static pod started or terminated).
    fn subscribe(&self) -> watch::Receiver<u64>;
}

/// Keeps the API's mirror pods in step with the static pods (cluster mode).
#[derive(Clone)]
pub struct MirrorPods {
    pods: Api<Pod>,
    nodes: Api<Node>,
    node_name: String,
    workers: Arc<dyn StaticPodWorkers>,
}

/// Upstream `IsMirrorPodOf`: the mirror of this static pod (same full name, its hash).
fn is_mirror_of(mirror: &Pod, static_pod: &Pod) -> bool {
    full_name(mirror) == full_name(static_pod)
        && annotation(mirror, CONFIG_MIRROR)
            .is_some_and(|h| Some(h) == annotation(static_pod, CONFIG_HASH))
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

impl MirrorPods {
    /// Mirror pods of `node_name`'s static pods, through `client`, as `workers` let them be.
    pub fn new(
        client: kube::Client,
        node_name: impl Into<String>,
        workers: Arc<dyn StaticPodWorkers>,
    ) -> Self {
        Self {
            pods: Api::all(client.clone()),
            nodes: Api::all(client),
            node_name: node_name.into(),
            workers,
        }
    }

    /// Upstream `CreateMirrorPod`: a copy of the static pod with the mirror annotation and a
    /// controller reference to the Node.
    pub async fn create(&self, static_pod: &Pod) -> Result<Pod, ClientError> {
        let node = self
            .nodes
            .get(&self.node_name)
            .await
            .map_err(client_error)?;
        let mut annotations = static_pod.metadata.annotations.clone().unwrap_or_default();
        let hash = annotation(static_pod, CONFIG_HASH)
            .unwrap_or_default()
            .to_owned();
        annotations.insert(CONFIG_MIRROR.into(), hash);
        let mirror = Pod {
            metadata: ObjectMeta {
                name: static_pod.metadata.name.clone(),
                namespace: static_pod.metadata.namespace.clone(),
                labels: static_pod.metadata.labels.clone(),
                annotations: Some(annotations),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: self.node_name.clone(),
                    uid: node.metadata.uid.unwrap_or_default(),
                    controller: Some(true),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: static_pod.spec.clone(),
            status: None,
        };
        let namespace = static_pod
            .metadata
            .namespace
            .as_deref()
            .unwrap_or("default");
        Api::<Pod>::namespaced(self.pods.clone().into_client(), namespace)
            .create(&PostParams::default(), &mirror)
            .await
            .map_err(client_error)
    }

    /// Upstream `DeleteMirrorPod`: grace 0 with the mirror's UID as precondition. Whether this
    /// call deleted it (not when it was gone already or had another UID: 404, 409).
    pub async fn delete(&self, mirror: &Pod) -> Result<bool, ClientError> {
        let (namespace, name) = full_name(mirror);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: mirror.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match Api::<Pod>::namespaced(self.pods.clone().into_client(), &namespace)
            .delete(&name, &params)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => match client_error(e) {
                ClientError::NotFound(_) | ClientError::Conflict(_) => Ok(false),
                other => Err(other),
            },
        }
    }

    /// One pass, as upstream: for every static pod whose worker started it and syncs it
    /// (`syncPod`'s `tryReconcileMirrorPods`), its mirror being deleted or with another hash is
    /// deleted, and one is created when there was none or it was just deleted; once the sources
    /// were read, a mirror without a static pod of its name is deleted unless a static pod of
    /// that name still runs or stops (`HandlePodCleanups`, `deleteOrphanedMirrorPods`). A static
    /// pod waiting for its turn (an earlier incarnation of its manifest still stopping) leaves
    /// the old mirror as it is.
    pub async fn reconcile(&self, cache: &PodCache) -> Vec<ClientError> {
        let statics = cache.static_pods();
        let mirrors: BTreeMap<_, _> = cache
            .mirror_pods()
            .into_iter()
            .map(|m| (full_name(&m), m))
            .collect();
        let mut errors = Vec::new();
        for static_pod in &statics {
            if !self.workers.is_syncing(&PodUid::of(static_pod)) {
                continue;
            }
            let mirror = mirrors.get(&full_name(static_pod));
            let mut deleted = false;
            if let Some(mirror) = mirror
                .filter(|m| m.metadata.deletion_timestamp.is_some() || !is_mirror_of(m, static_pod))
            {
                info!(pod = ?full_name(mirror), uid = ?mirror.metadata.uid, "deleting the mirror pod of a static pod that changed");
                match self.delete(mirror).await {
                    Ok(gone) => deleted = gone,
                    Err(e) => errors.push(e),
                }
            }
            if mirror.is_none() || deleted {
                info!(pod = ?full_name(static_pod), "creating the mirror pod of a static pod");
                match self.create(static_pod).await {
                    Ok(_) => {}
                    Err(ClientError::Conflict(_)) => {} // created meanwhile; the watch brings it
                    Err(e) => errors.push(e),
                }
            }
        }
        // Upstream's housekeeping runs only once every source was read: before that a mirror
        // only looks orphaned.
        if !rustlet_volume::populator::PodSource::all_sources_ready(cache) {
            return errors;
        }
        for (name, mirror) in &mirrors {
            if statics.iter().any(|s| full_name(s) == *name)
                || self.workers.is_terminating(&name.0, &name.1)
            {
                continue;
            }
            info!(pod = ?name, uid = ?mirror.metadata.uid, "deleting the mirror pod of a static pod that went");
            if let Err(e) = self.delete(mirror).await {
                errors.push(e);
            }
        }
        errors
    }

    /// Reconciles after every change of the pod cache or of the static pods' workers (one
    /// started, or terminated) and every 10 s, until cancelled.
    pub async fn run(self, cache: Arc<PodCache>, cancel: CancellationToken) {
        let mut changes = cache.subscribe();
        let mut workers = self.workers.subscribe();
        loop {
            for error in self.reconcile(&cache).await {
                warn!("mirror pods: {error}");
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
                changed = workers.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Mutex;

    use crate::backend::Backend;
    use crate::local::store::Store;
    use crate::test_server::TestApiServer;

    const PROXY: &str = "apiVersion: v1
kind: Pod
metadata:
  name: proxy
spec:
  containers:
  - name: c
    image: busybox
";

    #[test]
    fn w29_a_static_pod_gets_its_name_namespace_node_uid_and_annotations() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("proxy.yaml"), PROXY).unwrap();
        let source = StaticPodSource::new(dir.path(), "Node-A");
        let (pods, errors) = source.scan();
        assert!(errors.is_empty(), "{errors:?}");
        let pod = &pods[0];
        assert_eq!(pod.metadata.name.as_deref(), Some("proxy-node-a"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node-A"));
        assert_eq!(
            spec.restart_policy.as_deref(),
            Some("Always"),
            "API defaults"
        );
        assert!(spec.tolerations.as_ref().unwrap().iter().any(|t| {
            t.operator.as_deref() == Some("Exists") && t.effect.as_deref() == Some("NoExecute")
        }));
        let uid = pod.metadata.uid.clone().unwrap();
        assert_eq!(annotation(pod, CONFIG_HASH), Some(uid.as_str()));
        assert_eq!(annotation(pod, CONFIG_SOURCE), Some("file"));
        assert!(rustlet_core::pod::is_static_pod(pod));
        assert_eq!(
            source.scan().0[0].metadata.uid.as_deref(),
            Some(uid.as_str()),
            "stable"
        );
        std::fs::write(
            dir.path().join("proxy.yaml"),
            PROXY.replace("busybox", "busybox:2"),
        )
        .unwrap();
        assert_ne!(
            source.scan().0[0].metadata.uid.as_deref(),
            Some(uid.as_str()),
            "an edit is a new pod"
        );
    }

    /// Upstream's file source handles the removal and the new write of a manifest as two
    /// events: its config layer removes the pod and adds it back with a new first-seen time
    /// (`kubernetes.io/config.seen`), and the pod workers restart it. Here both fall in one
    /// burst, and the read finds the same file (the same UID).
    #[tokio::test]
    async fn a_manifest_removed_and_written_again_is_seen_anew() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.yaml");
        std::fs::write(&path, PROXY).unwrap();
        let cache = Arc::new(PodCache::with_static_source());
        let cancel = CancellationToken::new();
        let task = tokio::spawn(
            StaticPodSource::new(dir.path(), "node-a").run(cache.clone(), cancel.clone()),
        );
        let seen = |cache: &PodCache| {
            cache
                .static_pods()
                .first()
                .and_then(|p| annotation(p, CONFIG_SEEN).map(str::to_owned))
        };
        let mut changes = cache.subscribe();
        let first = loop {
            if let Some(first) = seen(&cache) {
                break first;
            }
            tokio::time::timeout(Duration::from_secs(10), changes.changed())
                .await
                .expect("read")
                .unwrap();
        };
        let uid = cache.static_pods()[0].metadata.uid.clone();
        // A touch is no removal: the pod keeps its first-seen time.
        std::fs::write(&path, PROXY).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(seen(&cache).as_deref(), Some(first.as_str()));
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, PROXY).unwrap();
        let again = loop {
            match seen(&cache) {
                Some(again) if again != first => break again,
                _ => tokio::time::timeout(Duration::from_secs(10), changes.changed())
                    .await
                    .expect("seen anew")
                    .unwrap(),
            }
        };
        assert!(again > first, "{again} after {first}");
        assert_eq!(cache.static_pods()[0].metadata.uid, uid, "the same pod");
        cancel.cancel();
        task.await.unwrap();
    }

    #[test]
    fn w28_files_that_are_not_exactly_one_valid_pod_are_reported_and_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ok.yaml"), PROXY).unwrap();
        std::fs::write(dir.path().join("two.yaml"), format!("{PROXY}---\n{PROXY}")).unwrap();
        std::fs::write(
            dir.path().join("cm.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("bad.yaml"),
            PROXY.replace("name: proxy", "name: Bad_Name"),
        )
        .unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), "garbage: [").unwrap();
        let (pods, errors) = StaticPodSource::new(dir.path(), "n").scan();
        assert_eq!(pods.len(), 1);
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 3, "{text:?}");
        for file in ["two.yaml", "cm.yaml", "bad.yaml"] {
            assert!(text.iter().any(|t| t.contains(file)), "{file}: {text:?}");
        }
    }

    /// The pod workers as the mirror pods see them: which static pods sync, which names still
    /// stop.
    #[derive(Default)]
    struct FakeWorkers {
        syncing: Mutex<HashSet<PodUid>>,
        stopping: Mutex<HashSet<(String, String)>>,
        changed: watch::Sender<u64>,
    }

    impl FakeWorkers {
        fn set(&self, syncing: &[&Pod], stopping: &[&Pod]) {
            *self.syncing.lock().unwrap() = syncing.iter().map(|p| PodUid::of(p)).collect();
            *self.stopping.lock().unwrap() = stopping.iter().map(|p| full_name(p)).collect();
            self.changed.send_modify(|n| *n += 1);
        }
    }

    impl StaticPodWorkers for FakeWorkers {
        fn is_syncing(&self, uid: &PodUid) -> bool {
            self.syncing.lock().unwrap().contains(uid)
        }

        fn is_terminating(&self, namespace: &str, name: &str) -> bool {
            self.stopping
                .lock()
                .unwrap()
                .contains(&(namespace.to_owned(), name.to_owned()))
        }

        fn subscribe(&self) -> watch::Receiver<u64> {
            self.changed.subscribe()
        }
    }

    /// The mirror pods of node `node-a` running over the test API server, the pod cache fed
    /// by its watch.
    struct Mirrors {
        server: TestApiServer,
        cache: Arc<PodCache>,
        workers: Arc<FakeWorkers>,
        cancel: CancellationToken,
    }

    impl Mirrors {
        async fn start() -> Self {
            let server = TestApiServer::start(Arc::new(Store::default()))
                .await
                .unwrap();
            server
                .store()
                .create(serde_json::json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": "node-a"}}))
                .unwrap();
            let client = kube::Client::new(server.router(), "default");
            let cache = Arc::new(PodCache::with_static_source());
            let workers = Arc::new(FakeWorkers::default());
            let cancel = CancellationToken::new();
            {
                let (cache, backend) = (cache.clone(), Backend::Cluster(client.clone()));
                tokio::spawn(async move { cache.run(&backend, "node-a").await });
            }
            let mirrors = MirrorPods::new(client, "node-a", workers.clone());
            tokio::spawn(mirrors.run(cache.clone(), cancel.clone()));
            Self {
                server,
                cache,
                workers,
                cancel,
            }
        }

        /// The mirror pod of `graceful` in the API: its UID and its static pod's hash.
        fn mirror(&self) -> Option<(String, String)> {
            let reference = ObjectRef::new(Kind::Pod, "ns", "graceful-node-a");
            let pod: Pod =
                serde_json::from_value(self.server.store().get(&reference).ok()?).unwrap();
            Some((
                pod.metadata.uid.clone().unwrap(),
                annotation(&pod, CONFIG_MIRROR).unwrap().to_owned(),
            ))
        }

        /// Waits (paused time) until the mirror is `wanted`, at most `within`.
        async fn until(
            &self,
            what: &str,
            within: Duration,
            wanted: impl Fn(Option<&(String, String)>) -> bool,
        ) {
            let deadline = tokio::time::Instant::now() + within;
            loop {
                let mirror = self.mirror();
                if wanted(mirror.as_ref()) {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: not within {within:?}: {mirror:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    impl Drop for Mirrors {
        fn drop(&mut self) {
            self.cancel.cancel();
        }
    }

    /// The static pod `graceful` in `ns` with a 20 s grace period, running `image`.
    fn graceful(image: &str) -> Pod {
        let manifest = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "graceful", "namespace": "ns"},
            "spec": {"terminationGracePeriodSeconds": 20,
                     "containers": [{"name": "m-test", "image": image}]}});
        static_pod(Path::new("/etc/static/graceful.yaml"), manifest, "node-a").unwrap()
    }

    fn hash(pod: &Pod) -> String {
        annotation(pod, CONFIG_HASH).unwrap().to_owned()
    }

    /// Upstream "MirrorPodWithGracePeriod when create a mirror pod mirror pod termination
    /// should satisfy grace period when static pod is updated" (W30; `tryReconcileMirrorPods`
    /// runs in `syncPod`, after `allowPodStart`): while the edited manifest's old incarnation
    /// takes its 20 s to stop, the new one waits for its turn and the old mirror stays, with
    /// its UID; once the new one's worker started it, the mirror is replaced at once (the
    /// workers' signal wakes the pass, not the 10 s resync).
    #[tokio::test(start_paused = true)]
    async fn w30_an_outdated_mirror_stays_until_the_new_incarnation_starts() {
        let m = Mirrors::start().await;
        let (old, new) = (graceful("busybox"), graceful("pause"));
        assert_ne!(hash(&old), hash(&new));
        m.cache.set_static_pods(vec![old.clone()]);
        m.workers.set(&[&old], &[]);
        m.until("the mirror is created", Duration::from_secs(2), |mirror| {
            mirror.is_some_and(|(_, h)| *h == hash(&old))
        })
        .await;
        let (uid, _) = m.mirror().unwrap();

        // The manifest is edited: the old pod stops (20 s), the new one waits for its turn.
        m.cache.set_static_pods(vec![new.clone()]);
        m.workers.set(&[], &[&old]);
        for _ in 0..95 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(
                m.mirror(),
                Some((uid.clone(), hash(&old))),
                "the old mirror stays while its pod stops"
            );
        }
        m.workers.set(&[&new], &[]);
        m.until("the mirror is replaced", Duration::from_secs(1), |mirror| {
            mirror.is_some_and(|(u, h)| *u != uid && *h == hash(&new))
        })
        .await;
    }

    /// Upstream "MirrorPodWithGracePeriod when create a mirror pod mirror pod termination
    /// should satisfy grace period when static pod is deleted" (`HandlePodCleanups` deletes an
    /// orphaned mirror only when `!IsPodForMirrorPodTerminatingByFullName`): the mirror of a
    /// deleted static pod stays, with its UID, while the pod stops, and goes once it stopped.
    #[tokio::test(start_paused = true)]
    async fn w30_an_orphaned_mirror_stays_while_its_static_pod_terminates() {
        let m = Mirrors::start().await;
        let pod = graceful("busybox");
        m.cache.set_static_pods(vec![pod.clone()]);
        m.workers.set(&[&pod], &[]);
        m.until("the mirror is created", Duration::from_secs(2), |mirror| {
            mirror.is_some()
        })
        .await;
        let mirror = m.mirror();

        // The manifest is deleted: the pod stops (20 s).
        m.cache.set_static_pods(Vec::new());
        m.workers.set(&[], &[&pod]);
        for _ in 0..95 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(m.mirror(), mirror, "the mirror stays while its pod stops");
        }
        m.workers.set(&[], &[]);
        m.until(
            "the orphaned mirror is deleted",
            Duration::from_secs(1),
            |mirror| mirror.is_none(),
        )
        .await;
    }
}
