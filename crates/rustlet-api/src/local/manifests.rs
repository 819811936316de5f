//! A directory of manifests kept in the store: every `*.yaml`, `*.yml` and `*.json` file holds
//! one or more documents (YAML `---` separated, or concatenated JSON values) of the kinds the
//! store knows. [`DirectorySync::sync`] applies what changed since the last call:
//!
//! * a new or changed document is created or updated; pods get `spec.nodeName` of this node and,
//!   without `metadata.uid`, a fresh random UID when they are created, as the API server gives
//!   one. The UID is remembered per (file, namespace, name, spec) in a small state file
//!   ([`DirectorySync::with_uid_state`], written atomically), so a restart gives the same pods
//!   the same UIDs and adopts their mounts; a spec change, or a document removed and restored,
//!   is a new pod with a new UID. A UID written in the manifest is kept.
//! * the terminal statuses (`Succeeded`, `Failed`) of the pods are kept in another state file
//!   ([`DirectorySync::with_status_state`]), as the API server keeps them in etcd: after a
//!   restart a finished pod comes back with its status, so the pod workers do not run it again
//!   (W2). Other statuses are not kept: the node agent makes them again from what runs.
//! * a new incarnation of a pod (another UID under the same name) is created only once the old
//!   one is gone: the old one is deleted gracefully and the document waits, as a create waits
//!   for a terminating pod of the same name in the API server (409 until then);
//! * a pod whose document disappeared gets a `deletionTimestamp` (it is not dropped: the status
//!   manager deletes it once its volumes are gone); other objects are removed;
//! * a file that fails to parse is reported with its name and position and skipped: what it
//!   applied before stays as it was, and no other file is disturbed. YAML is read as the API
//!   server's reader does, 1.1 octal included (`defaultMode: 0400` is 256);
//! * a document of a kind the store does not serve (a Service, a Deployment) is reported as
//!   ignored, by kind and name, and the file's other documents are applied;
//! * an object that two files (or two documents) provide stays with the one that provided it
//!   first (a new object: the first file in name order), as the API server answers
//!   AlreadyExists to a second create; the other is reported as a conflict naming both files,
//!   and takes over when the first one goes;
//! * every problem is reported once per file content, and again only when the file changes.
//!
//! [`DirectorySync::run`] calls it when the directory's inotify watch announces a change
//! ([`crate::dir_watch`]: a closed write, a rename, a removal, a touch), so a change is applied
//! within milliseconds, and every [`WATCHED_PERIOD`](crate::dir_watch::WATCHED_PERIOD) as a
//! safety net (every [`SCAN_INTERVAL`] while no watch could be set up).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ring::digest::{SHA256, digest};
use rustlet_core::pod::PodPhase;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::dir_watch::DirWatch;

use super::store::{
    DeleteOptions, Deleted, Kind, ObjectRef, Selection, Store, StoreError, random_uid, uid_from,
};

/// How often [`DirectorySync::run`] looks at the directory while it has no inotify watch.
pub const SCAN_INTERVAL: Duration = Duration::from_millis(500);

/// The largest manifest file read (upstream's limit on a static pod manifest fetched by URL:
/// 10 MiB); a larger file is reported and skipped, and what it applied before stays.
pub const MAX_MANIFEST_BYTES: u64 = 10 << 20;

/// A document that could not be applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// The directory or a file could not be read.
    #[error("read {}: {message}", path.display())]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        message: String,
    },
    /// A file is larger than [`MAX_MANIFEST_BYTES`]; it is not read.
    #[error("read {}: {size} bytes is more than the {MAX_MANIFEST_BYTES} a manifest may have", path.display())]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// A file is not valid YAML/JSON.
    #[error("parse {}{}: {message}", path.display(), position(*line, *column))]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line, when known.
        line: Option<u64>,
        /// 1-based column, when known.
        column: Option<u64>,
        /// The parser's message.
        message: String,
    },
    /// A document is not an object the store accepts.
    #[error("{} document {document}: {source}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based index of the document in the file.
        document: usize,
        /// Why.
        source: Box<StoreError>,
    },
    /// A state file (UIDs, statuses) could not be read or written.
    #[error("state file {}: {message}", path.display())]
    State {
        /// The state file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A document of a kind local mode does not serve (a Service, a Deployment, ...): the
    /// file's other documents are applied.
    #[error("{} document {document}: {kind} {name:?} ignored: local mode does not serve this kind", path.display())]
    Ignored {
        /// The file.
        path: PathBuf,
        /// 1-based index of the document in the file.
        document: usize,
        /// `apiVersion/kind`.
        kind: String,
        /// `metadata.name`.
        name: String,
    },
    /// Another file (or an earlier document of the same file) provides the same object: as
    /// the API server answers AlreadyExists, the first one is kept.
    #[error("{} document {document}: {reference} already exists: {} provides it", path.display(), other.display())]
    Conflict {
        /// The file.
        path: PathBuf,
        /// 1-based index of the document in the file.
        document: usize,
        /// The object.
        reference: ObjectRef,
        /// The file that provides it.
        other: PathBuf,
    },
    /// The store refused a write.
    #[error("apply {reference} from {}{}: {source}", path.display(), document_suffix(*document))]
    Apply {
        /// The file (the directory, for a withdrawal).
        path: PathBuf,
        /// 1-based index of the document in the file, when a document is applied.
        document: Option<usize>,
        /// The object.
        reference: ObjectRef,
        /// Why.
        source: Box<StoreError>,
    },
}

fn document_suffix(document: Option<usize>) -> String {
    document.map_or_else(String::new, |d| format!(" document {d}"))
}

fn position(line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(":{l}:{c}"),
        (Some(l), None) => format!(":{l}"),
        _ => String::new(),
    }
}

/// Parse a manifest file's text into its documents, each of a kind the store serves and named
/// (empty documents are skipped); any other document fails the file.
pub fn parse_documents(path: &Path, text: &str) -> Result<Vec<Value>, ManifestError> {
    let documents = parse_yaml(path, text)?;
    for (i, document) in documents.iter().enumerate() {
        Store::reference_of(document).map_err(|source| ManifestError::Invalid {
            path: path.to_owned(),
            document: i + 1,
            source: Box::new(source),
        })?;
    }
    Ok(documents)
}

/// Parse a manifest file's text into its documents (empty documents are skipped), whatever
/// their kinds.
pub fn parse_yaml(path: &Path, text: &str) -> Result<Vec<Value>, ManifestError> {
    let is_json = path.extension().is_some_and(|e| e == "json");
    let documents: Vec<Value> = if is_json {
        serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .map_err(|e| ManifestError::Parse {
                path: path.to_owned(),
                line: Some(e.line() as u64),
                column: Some(e.column() as u64),
                message: e.to_string(),
            })?
    } else {
        // YAML 1.1 octal (`defaultMode: 0400`), as the API server's YAML reader takes it.
        let options = serde_saphyr::options! { legacy_octal_numbers: true };
        serde_saphyr::from_multiple_with_options::<Value>(text, options).map_err(|e| {
            let location = e.location();
            ManifestError::Parse {
                path: path.to_owned(),
                line: location.map(|l| l.line()),
                column: location.map(|l| l.column()),
                message: e.to_string(),
            }
        })?
    };
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

/// A document of a file, with its 1-based index and the object it names.
type Doc = (usize, ObjectRef, Value);

/// A changed file read in this scan: its content hash, its stamp and its documents.
type Fresh = (Vec<u8>, Option<Stamp>, Vec<Doc>);

/// What reading a changed file gave.
enum Parsed {
    /// Too large or unreadable: what it applied before stays.
    Skipped,
    /// Its documents.
    Read {
        hash: Vec<u8>,
        stamp: Option<Stamp>,
        /// The documents of kinds the store serves.
        objects: Vec<Doc>,
        /// The other documents: ignored kinds, objects without a name.
        problems: Vec<ManifestError>,
    },
}

/// The object a document names, or why it is not applied: a kind the store does not serve is
/// ignored (and said so), a document without a name is invalid.
fn classify(path: &Path, document: usize, value: &Value) -> Result<ObjectRef, ManifestError> {
    let text = |pointer: &str| value.pointer(pointer).and_then(Value::as_str).unwrap_or("");
    let (api_version, kind) = (text("/apiVersion"), text("/kind"));
    if Kind::from_type(api_version, kind).is_none() {
        return Err(ManifestError::Ignored {
            path: path.to_owned(),
            document,
            kind: format!("{api_version}/{kind}"),
            name: text("/metadata/name").to_owned(),
        });
    }
    Store::reference_of(value).map_err(|source| ManifestError::Invalid {
        path: path.to_owned(),
        document,
        source: Box::new(source),
    })
}

/// Who provides which object in a scan ([`DirectorySync::sync`]): an unchanged file keeps its
/// objects, a changed file that still has one keeps it, and any other goes to the first
/// changed file, in path order, that has it.
#[derive(Default)]
struct Owners {
    /// A changed file was read (and `before` taken).
    started: bool,
    /// The file each object came from before the scan.
    before: BTreeMap<ObjectRef, PathBuf>,
    /// The objects of each changed file read so far.
    read: BTreeMap<PathBuf, BTreeSet<ObjectRef>>,
    /// The first changed file, in path order, that has each object.
    first: BTreeMap<ObjectRef, PathBuf>,
}

impl Owners {
    /// The scan's first changed file is about to be applied: what the files provided before.
    fn start(&mut self, files: &BTreeMap<FileKey, Applied>) {
        self.started = true;
        self.before = files
            .iter()
            .flat_map(|(path, applied)| {
                applied
                    .objects
                    .iter()
                    .map(|r| (r.clone(), path.to_path_buf()))
            })
            .collect();
    }

    /// The changed file at `path` (read in path order) has `docs`.
    fn read(&mut self, path: &Path, docs: &[Doc]) {
        for (_, reference, _) in docs {
            if !self.first.contains_key(reference) {
                self.first.insert(reference.clone(), path.to_owned());
            }
        }
        let objects = docs.iter().map(|(_, r, _)| r.clone()).collect();
        self.read.insert(path.to_owned(), objects);
    }

    /// Every object of the changed file at `path` has its owner settled: none was provided
    /// by a present file later in path order, which is not read yet.
    fn settled(&self, path: &Path, docs: &[Doc], present: &SortedPaths) -> bool {
        docs.iter().all(|(_, reference, _)| {
            self.before.get(reference).is_none_or(|before| {
                before.as_os_str() <= path.as_os_str() || !present.contains(before)
            })
        })
    }

    /// The file that provides `reference`, once settled.
    fn owner(&self, reference: &ObjectRef, present: &SortedPaths) -> Option<&Path> {
        match self.before.get(reference) {
            Some(before) if present.contains(before) && !self.read.contains_key(before) => {
                Some(before)
            }
            Some(before) if self.read.get(before).is_some_and(|o| o.contains(reference)) => {
                Some(before)
            }
            _ => self.first.get(reference).map(PathBuf::as_path),
        }
    }
}

#[derive(Default)]
struct Applied {
    /// The content hash; empty while a document of the file waits, so it is read again.
    hash: Vec<u8>,
    /// The file's (mtime, ctime, size, inode) when it was read: an unchanged stamp skips the
    /// read and the hash (1,000 manifests every 500 ms otherwise cost a few % of a core).
    stamp: Option<Stamp>,
    objects: BTreeSet<ObjectRef>,
    /// The UID-state keys of its pods without a UID of their own.
    uid_keys: BTreeSet<String>,
}

/// What a file's metadata says of its content.
type Stamp = (std::time::SystemTime, std::time::SystemTime, u64, u64);

/// The stamp of a file, trusted only when its last change is more than a second before the
/// scan: a change within the filesystem clock's tick of a read could keep the same stamp
/// ("racy" files are read again, as git does).
fn stamp(metadata: &std::fs::Metadata, scan: std::time::SystemTime) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let modified = metadata.modified().ok()?;
    let changed = std::time::UNIX_EPOCH
        + Duration::new(
            u64::try_from(metadata.ctime()).ok()?,
            u32::try_from(metadata.ctime_nsec()).ok()?,
        );
    let settled = scan.checked_sub(Duration::from_secs(1))?;
    (modified < settled && changed < settled).then_some((
        modified,
        changed,
        metadata.len(),
        metadata.ino(),
    ))
}

/// The manifest-to-UID memory (see the module doc).
#[derive(Debug, Default)]
struct UidState {
    path: Option<PathBuf>,
    uids: BTreeMap<String, String>,
    dirty: bool,
}

/// The terminal statuses kept across restarts (see the module doc).
#[derive(Debug, Default)]
struct StatusState {
    path: Option<PathBuf>,
    /// UID → the pod's terminal status, as last written.
    saved: BTreeMap<String, Value>,
    /// The store's resourceVersion when the file was last brought up to date.
    seen: u64,
    /// A scan has applied the directory (and so given back the kept statuses): before it,
    /// the store lacks the finished pods, and saving would erase their statuses.
    scanned: bool,
}

/// Reads a JSON state file; an absent one is empty. One that is not what it should be (a
/// crash on a file system that lost the write, a hand edit) is said once, moved aside as
/// `<file>.corrupt-<UTC time>` for whoever wants to look, and read as empty: the agent starts,
/// and the next scan writes a new one. (Pods without a UID of their own then get new UIDs,
/// and their old directories are torn down as orphans: that is what the file protected.)
/// A file that cannot be read at all (permissions, I/O) stays an error.
fn read_state<T: serde::de::DeserializeOwned + Default>(
    path: &Path,
    what: &str,
) -> Result<T, ManifestError> {
    let error = |message: String| ManifestError::State {
        path: path.to_owned(),
        message,
    };
    let bytes = match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(T::default()),
        Err(e) => return Err(error(e.to_string())),
        Ok(bytes) => bytes,
    };
    let parse_error = match serde_json::from_slice(&bytes) {
        Ok(value) => return Ok(value),
        Err(e) => e,
    };
    let stamp = k8s_openapi::jiff::Timestamp::now().strftime("%Y%m%dT%H%M%S%.fZ");
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".corrupt-{stamp}"));
    let aside = PathBuf::from(aside);
    std::fs::rename(path, &aside)
        .map_err(|e| error(format!("moving the unreadable file aside: {e}")))?;
    warn!(
        file = %path.display(),
        moved_to = %aside.display(),
        "state file is not a map of {what} ({parse_error}): moved aside, starting from an empty one"
    );
    Ok(T::default())
}

/// Writes a JSON state file durably: a temporary file written and flushed to disk, renamed
/// over it, and the rename flushed with the directory, so a crash leaves the old file or the
/// new one, whole.
fn write_state(path: &Path, value: &impl serde::Serialize) -> Result<(), ManifestError> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(value)?;
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)?;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| ManifestError::State {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// What applying one document did.
enum Applied1 {
    Unchanged,
    Changed,
    /// The old incarnation is still terminating.
    Waiting,
}

/// What one [`DirectorySync::sync`] did.
#[derive(Debug, Default, PartialEq)]
pub struct SyncReport {
    /// Objects created or changed.
    pub applied: Vec<ObjectRef>,
    /// Pods whose document disappeared, now terminating.
    pub terminating: Vec<ObjectRef>,
    /// Other objects whose document disappeared, removed.
    pub removed: Vec<ObjectRef>,
    /// Pods whose new incarnation waits for the old one (another UID, same name) to be gone.
    pub waiting: Vec<ObjectRef>,
    /// Files (or documents) skipped, with why.
    pub errors: Vec<ManifestError>,
}

/// What [`DirectorySync::run`] does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Read the directory ([`DirectorySync::sync`]).
    Scan,
    /// Bring the status state file up to date.
    SaveStatuses,
    /// The same, for the last time.
    Stop,
}

/// Keeps a directory's manifests in a store.
pub struct DirectorySync {
    dir: PathBuf,
    node_name: String,
    store: Arc<Store>,
    files: BTreeMap<FileKey, Applied>,
    uids: UidState,
    statuses: StatusState,
    /// Per file: the content (hash) the errors were reported for, and their messages.
    reported: BTreeMap<PathBuf, (Vec<u8>, BTreeSet<String>)>,
}

impl std::fmt::Debug for DirectorySync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectorySync")
            .field("dir", &self.dir)
            .field("files", &self.files.len())
            .finish()
    }
}

fn is_manifest(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    let ext = path.extension().and_then(|e| e.to_str());
    !hidden && matches!(ext, Some("yaml" | "yml" | "json"))
}

impl DirectorySync {
    /// Sync `dir` into `store` for the node `node_name`.
    pub fn new(dir: impl Into<PathBuf>, node_name: impl Into<String>, store: Arc<Store>) -> Self {
        Self {
            dir: dir.into(),
            node_name: node_name.into(),
            store,
            files: BTreeMap::new(),
            uids: UidState::default(),
            statuses: StatusState::default(),
            reported: BTreeMap::new(),
        }
    }

    /// Remembers the UIDs given to pods in `path` (read now if it exists, written durably
    /// after every scan that changes it). A corrupt file is reported once, moved aside and
    /// replaced; one that cannot be read at all is an error.
    pub fn with_uid_state(mut self, path: impl Into<PathBuf>) -> Result<Self, ManifestError> {
        let path = path.into();
        let uids = read_state(&path, "UIDs")?;
        self.uids = UidState {
            path: Some(path),
            uids,
            dirty: false,
        };
        Ok(self)
    }

    /// Keeps the terminal statuses of pods in `path` (read now if it exists; written
    /// durably after a scan when they changed): a pod created again under a UID found there
    /// gets its status back. A corrupt file is handled as [`Self::with_uid_state`]'s.
    pub fn with_status_state(mut self, path: impl Into<PathBuf>) -> Result<Self, ManifestError> {
        let path = path.into();
        let saved = read_state(&path, "pod statuses")?;
        self.statuses = StatusState {
            path: Some(path),
            saved,
            seen: 0,
            scanned: false,
        };
        Ok(self)
    }

    /// Creates the object; a pod whose UID has a kept status gets it back.
    fn create(&self, object: Value) -> Result<(), StoreError> {
        let mut created = self.store.create(object)?;
        let uid = created.pointer("/metadata/uid").and_then(Value::as_str);
        if let Some(status) = uid.and_then(|uid| self.statuses.saved.get(uid)) {
            created["status"] = status.clone();
            self.store.update_status(created)?;
        }
        Ok(())
    }

    /// The UID-state key of a pod document from `file` (relative to the directory).
    pub fn pod_key(file: &Path, namespace: &str, name: &str, spec: &Value) -> String {
        let seed = format!("{}\0{namespace}\0{name}\0{spec}", file.display());
        uid_from(seed.as_bytes())
    }

    fn prepare(
        &mut self,
        file: &Path,
        mut object: Value,
        reference: &ObjectRef,
        uid_keys: &mut BTreeSet<String>,
    ) -> Value {
        if reference.kind == Kind::Pod {
            if !object["spec"].is_object() {
                object["spec"] = serde_json::json!({});
            }
            object["spec"]["nodeName"] = Value::String(self.node_name.clone());
            let uid_missing = object
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty);
            if uid_missing {
                let relative = file.strip_prefix(&self.dir).unwrap_or(file);
                let key = Self::pod_key(
                    relative,
                    &reference.namespace,
                    &reference.name,
                    &object["spec"],
                );
                let uids = &mut self.uids;
                let uid = uids
                    .uids
                    .entry(key.clone())
                    .or_insert_with(|| {
                        uids.dirty = true;
                        random_uid()
                    })
                    .clone();
                uid_keys.insert(key);
                object["metadata"]["uid"] = Value::String(uid);
            }
            // The status belongs to the node agent, not to the manifest.
            if let Some(o) = object.as_object_mut() {
                o.remove("status");
            }
        }
        if let Some(meta) = object["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        object
    }

    /// Create or update one object. A pod under another UID is a new incarnation: the old one
    /// is deleted gracefully and the new one created once it is gone; a document whose pod is
    /// terminating (withdrawn, then restored) waits too.
    fn apply(&self, object: Value, reference: &ObjectRef) -> Result<Applied1, StoreError> {
        let Ok(stored) = self.store.get(reference) else {
            self.create(object)?;
            return Ok(Applied1::Changed);
        };
        let is_pod = reference.kind == Kind::Pod;
        let terminating = !stored["metadata"]["deletionTimestamp"].is_null();
        let uid = object.pointer("/metadata/uid").and_then(Value::as_str);
        let stored_uid = stored.pointer("/metadata/uid").and_then(Value::as_str);
        if is_pod && terminating {
            return Ok(Applied1::Waiting);
        }
        if uid.is_some() && uid != stored_uid {
            if !is_pod {
                let replace = DeleteOptions {
                    grace_period_seconds: Some(0),
                    ..DeleteOptions::default()
                };
                self.store.delete(reference, &replace)?;
                self.create(object)?;
                return Ok(Applied1::Changed);
            }
            return match self.store.delete(reference, &DeleteOptions::default())? {
                Deleted::Terminating(_) => Ok(Applied1::Waiting),
                Deleted::Removed(_) => {
                    self.create(object)?;
                    Ok(Applied1::Changed)
                }
            };
        }
        let before = stored["metadata"]["resourceVersion"].clone();
        let updated = self.store.update(object)?;
        Ok(if updated["metadata"]["resourceVersion"] != before {
            Applied1::Changed
        } else {
            Applied1::Unchanged
        })
    }

    /// Forgets the UIDs of documents no file provides any more (after a scan that read or
    /// lost a file: `files_changed`), and writes the state file (a temporary file renamed over
    /// it) if anything changed or an earlier write failed.
    fn save_uids(&mut self, report: &mut SyncReport, files_changed: bool) {
        if files_changed {
            let provided: BTreeSet<&String> =
                self.files.values().flat_map(|a| &a.uid_keys).collect();
            let before = self.uids.uids.len();
            self.uids.uids.retain(|key, _| provided.contains(key));
            if self.uids.uids.len() != before {
                self.uids.dirty = true;
            }
        }
        let Some(path) = self.uids.path.clone() else {
            return;
        };
        if !self.uids.dirty {
            return;
        }
        match write_state(&path, &self.uids.uids) {
            Ok(()) => self.uids.dirty = false,
            Err(err) => report.errors.push(err),
        }
    }

    /// Brings the status state file up to date with the terminal statuses in the store (the
    /// store is listed only when something was written to it since the last time). Statuses of
    /// pods no longer in the store are forgotten.
    /// Whether [`Self::save_statuses`] has anything to look at: a state file, a first scan
    /// done, and the store changed since it last looked. No I/O: the 500 ms period asks this
    /// before a hop to the blocking pool (issue 29: a settled node's hops were most of its
    /// wake-ups).
    fn statuses_due(&self) -> bool {
        self.statuses.path.is_some()
            && self.statuses.scanned
            && self.store.resource_version() != self.statuses.seen
    }

    fn save_statuses(&mut self, report: &mut SyncReport) {
        if !self.statuses_due() {
            return;
        }
        let Some(path) = self.statuses.path.clone() else {
            return;
        };
        let seen = self.store.resource_version();
        let (pods, _) = self.store.list_shared(&Selection::all(Kind::Pod));
        let terminal: BTreeMap<String, Value> = pods
            .iter()
            // The phase is kept beside the text: only finished pods are parsed.
            .filter(|pod| PodPhase::parse(Some(pod.field("status.phase"))).is_terminal())
            .filter_map(|pod| {
                let pod = pod.to_value();
                let uid = pod.pointer("/metadata/uid")?.as_str()?;
                Some((uid.to_owned(), pod["status"].clone()))
            })
            .collect();
        if terminal != self.statuses.saved {
            if let Err(err) = write_state(&path, &terminal) {
                report.errors.push(err);
                return;
            }
            self.statuses.saved = terminal;
        }
        self.statuses.seen = seen;
    }

    fn withdraw(&self, reference: &ObjectRef, report: &mut SyncReport) {
        match self.store.delete(reference, &DeleteOptions::default()) {
            Ok(Deleted::Terminating(_)) => report.terminating.push(reference.clone()),
            Ok(Deleted::Removed(_)) => report.removed.push(reference.clone()),
            Err(StoreError::NotFound(_)) => {}
            Err(source) => report.errors.push(ManifestError::Apply {
                path: self.dir.clone(),
                document: None,
                reference: reference.clone(),
                source: Box::new(source),
            }),
        }
    }

    /// Reads one changed file: its documents, each one this store serves with its reference,
    /// and the problems of the others. `None` when the file is unchanged since it was applied.
    fn read_file(
        &mut self,
        path: &Path,
        scan: std::time::SystemTime,
        report: &mut SyncReport,
    ) -> Option<Parsed> {
        let metadata = std::fs::metadata(path).ok();
        let file_stamp = metadata.as_ref().and_then(|m| stamp(m, scan));
        if file_stamp.is_some()
            && self
                .files
                .get(path.as_os_str())
                .is_some_and(|a| !a.hash.is_empty() && a.stamp == file_stamp)
        {
            return None;
        }
        let size = metadata.as_ref().map_or(0, std::fs::Metadata::len);
        if size > MAX_MANIFEST_BYTES {
            // Too large to read: keep what it applied before; said once per size and time.
            let key = format!("{size}/{:?}", metadata.and_then(|m| m.modified().ok()));
            let err = ManifestError::TooLarge {
                path: path.to_owned(),
                size,
            };
            self.report_once(path, key.as_bytes(), err, report);
            return Some(Parsed::Skipped);
        }
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) => {
                let err = ManifestError::Read {
                    path: path.to_owned(),
                    message: e.to_string(),
                };
                self.report_once(path, b"unreadable", err, report);
                return Some(Parsed::Skipped);
            }
        };
        let hash = digest(&SHA256, text.as_bytes()).as_ref().to_vec();
        if let Some(applied) = self.files.get_mut(path.as_os_str())
            && applied.hash == hash
        {
            applied.stamp = file_stamp;
            return None;
        }
        let documents = match parse_yaml(path, &text) {
            Ok(documents) => documents,
            Err(err) => {
                // What the file applied before stays; said once for this content.
                self.report_once(path, &hash, err, report);
                let applied = self.files.entry(FileKey::from(path)).or_default();
                applied.hash = hash;
                applied.stamp = file_stamp;
                return None;
            }
        };
        let mut objects = Vec::new();
        let mut problems = Vec::new();
        for (i, document) in documents.into_iter().enumerate() {
            match classify(path, i + 1, &document) {
                Ok(reference) => objects.push((i + 1, reference, document)),
                Err(err) => problems.push(err),
            }
        }
        Some(Parsed::Read {
            hash,
            stamp: file_stamp,
            objects,
            problems,
        })
    }

    /// Reports `err` unless it was reported for this file content (`content`) already: a
    /// broken file is reported once, and again only when it changes.
    fn report_once(
        &mut self,
        path: &Path,
        content: &[u8],
        err: ManifestError,
        report: &mut SyncReport,
    ) {
        let (seen_content, messages) = self.reported.entry(path.to_owned()).or_default();
        if seen_content.as_slice() != content {
            content.clone_into(seen_content);
            messages.clear();
        }
        if messages.insert(err.to_string()) {
            report.errors.push(err);
        }
    }

    /// Apply what changed in the directory since the last call.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use rustlet_api::local::manifests::DirectorySync;
    /// use rustlet_api::local::store::Store;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: default}\n";
    /// std::fs::write(dir.path().join("settings.yaml"), cm).unwrap();
    /// let mut sync = DirectorySync::new(dir.path(), "node-a", Arc::new(Store::default()));
    /// assert_eq!(sync.sync().applied.len(), 1);
    /// assert!(sync.sync().applied.is_empty(), "nothing changed since");
    /// std::fs::remove_file(dir.path().join("settings.yaml")).unwrap();
    /// assert_eq!(sync.sync().removed.len(), 1);
    /// ```
    pub fn sync(&mut self) -> SyncReport {
        let mut report = SyncReport::default();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => {
                let err = ManifestError::Read {
                    path: self.dir.clone(),
                    message: e.to_string(),
                };
                let dir = self.dir.clone();
                self.report_once(&dir, b"unreadable", err, &mut report);
                return report;
            }
        };
        self.reported.remove(&self.dir);
        // The entry's type comes with the directory listing: only a symlink costs a `stat`.
        let present: SortedPaths = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let path = e.path();
                if !is_manifest(&path) {
                    return None;
                }
                let kind = e.file_type().ok()?;
                let file = if kind.is_symlink() {
                    path.is_file()
                } else {
                    kind.is_file()
                };
                file.then_some(path)
            })
            .collect::<Vec<_>>()
            .into();
        // Every changed file is read in path order (a file that cannot be read or parsed
        // keeps what it applied before). As the API server answers AlreadyExists to a second
        // create, an object stays with the file that provides it already (an unchanged file,
        // or a changed one that still has it); a new one goes to the first file in path order.
        // A file that moved an object away in this scan gives it up first, so a move is not a
        // conflict. A changed file is applied as soon as that settles its objects: at once,
        // unless one of them was provided by a file later in path order, which must be read
        // first. Only those files' documents wait, so a burst of new manifests is not held
        // in memory all at once (issue 29: the parsed documents of 1,000 new pods were ~4 MB).
        let scan = std::time::SystemTime::now();
        let mut owners = Owners::default();
        let mut deferred: Vec<(PathBuf, Fresh)> = Vec::new();
        let mut kept: BTreeSet<PathBuf> = BTreeSet::new();
        let mut dropped: BTreeSet<ObjectRef> = BTreeSet::new();
        for path in &present {
            match self.read_file(path, scan, &mut report) {
                None => {}
                Some(Parsed::Skipped) => {
                    kept.insert(path.to_path_buf());
                }
                Some(Parsed::Read {
                    hash,
                    stamp,
                    objects,
                    problems,
                }) => {
                    for err in problems {
                        self.report_once(path, &hash, err, &mut report);
                    }
                    let path = path.to_path_buf();
                    if !owners.started {
                        owners.start(&self.files);
                    }
                    owners.read(&path, &objects);
                    if owners.settled(&path, &objects, &present) {
                        self.apply_file(
                            path,
                            (hash, stamp, objects),
                            &owners,
                            &present,
                            &mut dropped,
                            &mut report,
                        );
                    } else {
                        deferred.push((path, (hash, stamp, objects)));
                    }
                }
            }
        }
        self.reported
            .retain(|p, _| present.contains(p) || p == &self.dir);
        if !owners.started && present.contains_all(self.files.keys().map(FileKey::as_path)) {
            // Nothing read and nothing gone (the safety-net scan of a quiet directory): what
            // the files provide is what it was.
            self.save_uids(&mut report, false);
            self.statuses.scanned = true;
            self.save_statuses(&mut report);
            return report;
        }
        for (path, fresh) in deferred {
            self.apply_file(path, fresh, &owners, &present, &mut dropped, &mut report);
        }
        let gone: Vec<FileKey> = self
            .files
            .keys()
            .filter(|p| !present.contains(p) && !kept.contains(p.as_path()) && !p.exists())
            .cloned()
            .collect();
        for path in gone {
            let applied = self.files.remove(&path).expect("listed above");
            dropped.extend(applied.objects);
        }
        // Withdraw only after every file is read: an object that moved to another file in
        // the same scan is still provided and stays (no DELETED/ADDED flicker for watchers).
        let still: BTreeSet<&ObjectRef> = self.files.values().flat_map(|a| &a.objects).collect();
        let withdrawn: Vec<ObjectRef> =
            dropped.into_iter().filter(|r| !still.contains(r)).collect();
        for reference in &withdrawn {
            self.withdraw(reference, &mut report);
        }
        self.save_uids(&mut report, true);
        self.statuses.scanned = true;
        self.save_statuses(&mut report);
        report
    }

    /// Applies a changed file's documents: the objects it provides (`owners`) are created or
    /// updated, the others are conflicts, reported; what it provided before and no longer
    /// does goes into `dropped`.
    fn apply_file(
        &mut self,
        path: PathBuf,
        (hash, file_stamp, docs): Fresh,
        owners: &Owners,
        present: &SortedPaths,
        dropped: &mut BTreeSet<ObjectRef>,
        report: &mut SyncReport,
    ) {
        let mut objects = BTreeSet::new();
        let mut uid_keys = BTreeSet::new();
        let mut waiting = false;
        let mut conflicted = false;
        for (document, reference, value) in docs {
            let owner = owners.owner(&reference, present);
            if owner != Some(path.as_path()) || objects.contains(&reference) {
                let other = owner.map_or_else(|| path.clone(), Path::to_path_buf);
                let err = ManifestError::Conflict {
                    path: path.clone(),
                    document,
                    reference: reference.clone(),
                    other,
                };
                self.report_once(&path, &hash, err, report);
                // Read again every scan, so it takes over once the other file goes.
                conflicted |= owner != Some(path.as_path());
                continue;
            }
            let object = self.prepare(&path, value, &reference, &mut uid_keys);
            match self.apply(object, &reference) {
                Ok(Applied1::Changed) => report.applied.push(reference.clone()),
                Ok(Applied1::Unchanged) => {}
                Ok(Applied1::Waiting) => {
                    waiting = true;
                    report.waiting.push(reference.clone());
                }
                Err(source) => {
                    let err = ManifestError::Apply {
                        path: path.clone(),
                        document: Some(document),
                        reference: reference.clone(),
                        source: Box::new(source),
                    };
                    self.report_once(&path, &hash, err, report);
                }
            }
            objects.insert(reference);
        }
        let hash = if waiting || conflicted {
            Vec::new()
        } else {
            hash
        };
        let old = self.files.insert(
            FileKey::from(path.as_path()),
            Applied {
                hash,
                stamp: file_stamp,
                objects,
                uid_keys,
            },
        );
        dropped.extend(old.into_iter().flat_map(|a| a.objects));
    }

    /// `work` on the blocking pool, which `self` goes to and comes back from. `None` when the
    /// runtime shut down before it ran.
    async fn on_blocking_pool<T: Send + 'static>(
        self,
        work: impl FnOnce(&mut Self) -> T + Send + 'static,
    ) -> Option<(Self, T)> {
        let mut this = self;
        let handle = tokio::task::spawn_blocking(move || {
            let out = work(&mut this);
            (this, out)
        });
        match handle.await {
            Ok(done) => Some(done),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => None,
        }
    }

    /// [`Self::sync`] on the blocking pool, for async callers: a scan reads files of up to
    /// [`MAX_MANIFEST_BYTES`], hashes and parses them and writes the state files, none of which
    /// may hold a thread of the async runtime (issue 24, item 14). `None` when the runtime shut
    /// down before it ran.
    pub async fn sync_on_blocking_pool(self) -> Option<(Self, SyncReport)> {
        self.on_blocking_pool(Self::sync).await
    }

    /// [`Self::save_statuses`] as a report of its own.
    fn save_statuses_now(&mut self) -> SyncReport {
        let mut report = SyncReport::default();
        self.save_statuses(&mut report);
        report
    }

    /// Sync every [`SCAN_INTERVAL`] until cancelled; then the status state file is brought up
    /// to date one last time (cancel it after the status manager's last flush, so a pod that
    /// finished just before a shutdown keeps its status). Every scan and state write runs on
    /// the blocking pool ([`Self::sync_on_blocking_pool`]).
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut watch = DirWatch::new(&self.dir, SCAN_INTERVAL);
        let mut next = tokio::time::Instant::now();
        // Statuses change without the directory changing: their state file keeps its period.
        let mut statuses = tokio::time::interval(SCAN_INTERVAL);
        statuses.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let step = tokio::select! {
                () = cancel.cancelled() => Step::Stop,
                _ = statuses.tick() => Step::SaveStatuses,
                () = watch.changed() => Step::Scan,
                () = tokio::time::sleep_until(next) => Step::Scan,
            };
            let work: fn(&mut Self) -> SyncReport = match step {
                Step::Scan => Self::sync,
                // Nothing to save: no hop to the blocking pool.
                Step::SaveStatuses if !self.statuses_due() => continue,
                Step::SaveStatuses | Step::Stop => Self::save_statuses_now,
            };
            let Some((this, report)) = self.on_blocking_pool(work).await else {
                return;
            };
            self = this;
            for err in report.errors {
                warn!("{err}");
            }
            match step {
                Step::Stop => return,
                Step::SaveStatuses => {}
                Step::Scan => {
                    watch.rearm();
                    next = tokio::time::Instant::now() + watch.period();
                }
            }
        }
    }
}

/// A manifest's path as the key of the files applied: compared by its bytes (issue 29: a
/// lookup in a map of 1,000 `PathBuf`s parsed path components at each of its comparisons,
/// for every file of every 20 s scan). The files are entries of one directory, so their order
/// by bytes is their order as paths (`OsString`'s own order: bytes).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct FileKey(std::ffi::OsString);

impl FileKey {
    fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }
}

impl From<&Path> for FileKey {
    fn from(path: &Path) -> Self {
        Self(path.as_os_str().to_owned())
    }
}

/// `OsString` orders as `OsStr` does: a lookup by a borrowed path's bytes finds the key.
impl std::borrow::Borrow<std::ffi::OsStr> for FileKey {
    fn borrow(&self) -> &std::ffi::OsStr {
        &self.0
    }
}

impl std::ops::Deref for FileKey {
    type Target = Path;

    fn deref(&self) -> &Path {
        self.as_path()
    }
}

/// The manifest files of one scan, in name order (issue 29: the 20 s safety-net scan of a
/// quiet directory of 1,000 manifests spent more of its time in `Path` comparisons, which parse
/// components, than in its `stat`s): [`FileKey`]s, sorted and found by their bytes.
struct SortedPaths(Vec<FileKey>);

impl From<Vec<PathBuf>> for SortedPaths {
    fn from(paths: Vec<PathBuf>) -> Self {
        let mut keys: Vec<FileKey> = paths
            .into_iter()
            .map(|p| FileKey(p.into_os_string()))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        Self(keys)
    }
}

impl SortedPaths {
    fn contains(&self, path: &Path) -> bool {
        self.0
            .binary_search_by(|k| k.0.as_os_str().cmp(path.as_os_str()))
            .is_ok()
    }

    /// Every one of `paths` is here.
    fn contains_all<'a>(&self, paths: impl ExactSizeIterator<Item = &'a Path>) -> bool {
        paths.len() <= self.0.len() && paths.into_iter().all(|p| self.contains(p))
    }

    fn iter(&self) -> std::slice::Iter<'_, FileKey> {
        self.0.iter()
    }
}

impl<'a> IntoIterator for &'a SortedPaths {
    type Item = &'a FileKey;
    type IntoIter = std::slice::Iter<'a, FileKey>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests;
