//! The in-process object store behind local mode (and, later, the test API server), with the
//! API server's semantics for what Rustlet uses: UIDs, one `resourceVersion` counter that
//! increases on every write, the status subresource (a write to it changes only `status`; a
//! write to the object never changes `status`), graceful pod deletion through
//! `deletionTimestamp`, UID and resourceVersion preconditions (a conflict on mismatch), and
//! watches that resume from a resourceVersion (or answer "gone" when it is too old).
//!
//! Objects are kept as JSON, the shape they have on the wire. A pod's text is kept cut where
//! its status begins, so a status write (most of a storm's writes) parses and encodes only the
//! status and copies the rest (`PodCut`).

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use ring::digest::{SHA256, digest};
use rustlet_core::patch::apply_status_patch;
use rustlet_status::{Clock, SystemClock};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::admission::{Operation, admit, admit_pod_status, admit_status};

/// How a store keeps its past.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// How many past events a watch can resume from (older: 410 Gone, the watcher lists
    /// again). Each one can keep an old version of its object alive.
    pub history: usize,
    /// How many events a live watcher may fall behind before it has to list again.
    pub watch_buffer: usize,
}

impl Default for StoreConfig {
    /// The test API server's: resumes as a cluster's watch cache allows them.
    fn default() -> Self {
        Self {
            history: 1024,
            watch_buffer: 1024,
        }
    }
}

impl StoreConfig {
    /// An agent's own store in local mode: its watchers resume only across the gap between
    /// a list and its watch (a few events), so a short history is enough and keeps no old
    /// versions alive. Its watchers share the agent's two cores with a storm's writers (1,000
    /// pods: ~7,000 events in a second): 1,024 events of slack let the pod watch fall behind
    /// and list all 1,000 pods again (a second typed copy of each, 15 MB, in a third of the
    /// runs); 8 events per pod of a 1,000-pod node do not. An event is dropped as soon as
    /// every watcher has taken it, so the room costs only while a watcher is behind.
    pub fn in_process() -> Self {
        Self {
            history: 64,
            watch_buffer: 8192,
        }
    }
}

/// The kinds the store keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `v1` Pod.
    Pod,
    /// `v1` ConfigMap.
    ConfigMap,
    /// `v1` Secret.
    Secret,
    /// `v1` PersistentVolume (cluster scoped).
    PersistentVolume,
    /// `v1` PersistentVolumeClaim.
    PersistentVolumeClaim,
    /// `v1` Node (cluster scoped).
    Node,
    /// `coordination.k8s.io/v1` Lease.
    Lease,
    /// `events.k8s.io/v1` Event.
    Event,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 8] = [
        Kind::Pod,
        Kind::ConfigMap,
        Kind::Secret,
        Kind::PersistentVolume,
        Kind::PersistentVolumeClaim,
        Kind::Node,
        Kind::Lease,
        Kind::Event,
    ];

    /// `apiVersion`.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Lease => "coordination.k8s.io/v1",
            Kind::Event => "events.k8s.io/v1",
            _ => "v1",
        }
    }

    /// `kind`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
            Kind::PersistentVolume => "PersistentVolume",
            Kind::PersistentVolumeClaim => "PersistentVolumeClaim",
            Kind::Node => "Node",
            Kind::Lease => "Lease",
            Kind::Event => "Event",
        }
    }

    /// The REST resource name (`pods`, `configmaps`, ...).
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::ConfigMap => "configmaps",
            Kind::Secret => "secrets",
            Kind::PersistentVolume => "persistentvolumes",
            Kind::PersistentVolumeClaim => "persistentvolumeclaims",
            Kind::Node => "nodes",
            Kind::Lease => "leases",
            Kind::Event => "events",
        }
    }

    /// The kind of a document with this `apiVersion` and `kind`.
    pub fn from_type(api_version: &str, kind: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.api_version() == api_version && k.name() == kind)
    }

    /// Whether objects of this kind live in a namespace.
    pub fn is_namespaced(self) -> bool {
        !matches!(self, Kind::PersistentVolume | Kind::Node)
    }

    /// The fields a field selector may name (the API server's selectable fields; any other
    /// is refused with 400 "field label not supported").
    pub fn selectable_fields(self) -> &'static [&'static str] {
        match self {
            Kind::Pod => &[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            Kind::Secret => &["metadata.name", "metadata.namespace", "type"],
            Kind::Node => &["metadata.name", "spec.unschedulable"],
            Kind::Event => &[
                "metadata.name",
                "metadata.namespace",
                "reason",
                "type",
                "reportingController",
                "regarding.kind",
                "regarding.name",
                "regarding.namespace",
                "regarding.uid",
            ],
            _ => &["metadata.name", "metadata.namespace"],
        }
    }

    /// Whether it has a `status` subresource.
    pub fn has_status(self) -> bool {
        matches!(
            self,
            Kind::Pod | Kind::PersistentVolume | Kind::PersistentVolumeClaim | Kind::Node
        )
    }
}

/// Where an object is: kind, namespace (empty when cluster scoped) and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace; empty for cluster-scoped kinds.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ObjectRef {
    /// A reference; `namespace` is ignored for cluster-scoped kinds.
    pub fn new(kind: Kind, namespace: &str, name: &str) -> Self {
        Self {
            kind,
            namespace: if kind.is_namespaced() {
                namespace.to_owned()
            } else {
                String::new()
            },
            name: name.to_owned(),
        }
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind.name(), self.name)
        } else {
            write!(f, "{} {}/{}", self.kind.name(), self.namespace, self.name)
        }
    }
}

/// Conditions a write requires of the stored object (`DeleteOptions.preconditions`, or
/// `metadata.uid`/`metadata.resourceVersion` in an update or patch body).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Preconditions {
    /// The stored object's UID must be this.
    pub uid: Option<String>,
    /// The stored object's resourceVersion must be this.
    pub resource_version: Option<String>,
}

impl Preconditions {
    /// The preconditions a body carries in its `metadata`.
    pub fn from_body(body: &Value) -> Self {
        let field = |f: &str| {
            body.pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Self {
            uid: field("uid"),
            resource_version: field("resourceVersion"),
        }
    }
}

/// What a store operation refuses; each maps to the API server's status code.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// 404.
    #[error("{0} not found")]
    NotFound(ObjectRef),
    /// 409 on create.
    #[error("{0} already exists")]
    AlreadyExists(ObjectRef),
    /// 409: a precondition did not hold.
    #[error("{reference}: precondition failed: {message}")]
    Conflict {
        /// The object.
        reference: ObjectRef,
        /// Which precondition, expected and found.
        message: String,
    },
    /// 422: the body is not a valid object of its kind.
    #[error("{0}")]
    Invalid(String),
    /// 400: the request itself is malformed (a field selector the kind does not support).
    #[error("{0}")]
    BadRequest(String),
    /// 410: a watch asked for a resourceVersion older than the history kept.
    #[error("too old resource version: {requested} (oldest kept {oldest})")]
    Gone {
        /// The resourceVersion asked for.
        requested: u64,
        /// The oldest resumable one.
        oldest: u64,
    },
}

impl StoreError {
    /// The HTTP status code the API server would answer.
    pub fn code(&self) -> u16 {
        match self {
            Self::NotFound(_) => 404,
            Self::AlreadyExists(_) | Self::Conflict { .. } => 409,
            Self::Invalid(_) => 422,
            Self::BadRequest(_) => 400,
            Self::Gone { .. } => 410,
        }
    }

    /// The API's `reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "NotFound",
            Self::AlreadyExists(_) => "AlreadyExists",
            Self::Conflict { .. } => "Conflict",
            Self::Invalid(_) => "Invalid",
            Self::BadRequest(_) => "BadRequest",
            Self::Gone { .. } => "Expired",
        }
    }
}

/// A watch event's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// `ADDED`.
    Added,
    /// `MODIFIED`.
    Modified,
    /// `DELETED`.
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as a watch delivers it.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchEvent {
    /// What happened.
    pub type_: EventType,
    /// Which object.
    pub reference: ObjectRef,
    /// The object after the change (before it, for a deletion), shared with the store.
    pub object: Arc<StoredObject>,
    /// For a modification, the object before it (a watch with a field selector turns an object
    /// that starts or stops matching into ADDED or DELETED, as the API server does).
    pub previous: Option<Arc<StoredObject>>,
    /// The store's resourceVersion of this change.
    pub resource_version: u64,
}

/// A patch type (the request's `Content-Type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/strategic-merge-patch+json`: lists with a merge key merge by it (pod
    /// status); other kinds' status fields merge as JSON merge.
    StrategicMerge,
    /// `application/merge-patch+json` (RFC 7386): lists are replaced.
    Merge,
    /// `application/json-patch+json` (RFC 6902): a list of operations.
    Json,
}

impl PatchKind {
    /// What [`Store::patch_status`] takes for a kind's status: a pod's a strategic merge
    /// patch, any other's a JSON merge patch.
    fn of_status(kind: Kind) -> Self {
        if kind == Kind::Pod {
            PatchKind::StrategicMerge
        } else {
            PatchKind::Merge
        }
    }
}

/// Equality field selectors, as the API accepts them: `a.b=x,c.d==y,e!=z`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(pub(crate) Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parse `field=value` terms (also `==` and `!=`), comma separated.
    pub fn parse(selector: &str) -> Result<Self, StoreError> {
        let mut terms = Vec::new();
        for term in selector.split(',').filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(StoreError::BadRequest(format!(
                    "field selector term {term:?} is not field=value"
                )));
            };
            terms.push((field.trim().to_owned(), equal, value.trim().to_owned()));
        }
        Ok(Self(terms))
    }

    /// Whether `object` matches every term (a missing field is the empty string).
    pub fn matches(&self, object: &StoredObject) -> bool {
        self.0
            .iter()
            .all(|(field, equal, value)| (object.field(field) == value) == *equal)
    }

    /// [`Self::parse`], then [`Self::check`] against `kind`: what a list or watch of `kind`
    /// accepts.
    pub fn parse_for(kind: Kind, selector: &str) -> Result<Self, StoreError> {
        let fields = Self::parse(selector)?;
        fields.check(kind)?;
        Ok(fields)
    }

    /// As the API server: a field `kind` cannot be selected by is a 400.
    pub fn check(&self, kind: Kind) -> Result<(), StoreError> {
        match self
            .0
            .iter()
            .find(|(field, _, _)| !kind.selectable_fields().contains(&field.as_str()))
        {
            Some((field, _, _)) => Err(StoreError::BadRequest(format!(
                "field label not supported: {field}"
            ))),
            None => Ok(()),
        }
    }
}

/// One stored version of an object: its compact JSON text (what a GET or a watch sends, and
/// a few KB where the same pod as a `Value` tree takes ~20 KB), with the values of its kind's
/// selectable fields kept beside it so a watch's field selector never parses the text.
#[derive(Debug, PartialEq, Eq)]
pub struct StoredObject {
    json: Box<str>,
    fields: Box<[(&'static str, Box<str>)]>,
    resource_version: u64,
    /// A pod's text, where a status write cuts it (`None`: not a pod, or laid out otherwise).
    cut: Option<PodCut>,
}

/// Where a stored pod's text is cut so that a status write parses and encodes only the status:
/// the spec (most of a pod) is copied as text. `json[rv]` is `metadata.resourceVersion`'s
/// value and `json[uid]` `metadata.uid`'s, without their quotes (each taken only when it has
/// no escapes, so the text is the value); the status is the object's last member, and
/// `json[..status_at]` is everything before it (`json[status_at..]` is `,"status":{…}}`, or
/// the closing `}` when there is no status).
#[derive(Clone, Debug, PartialEq, Eq)]
struct PodCut {
    rv: Range<usize>,
    uid: Option<Range<usize>>,
    status_at: usize,
}

/// `,"status":`, between the rest of a cut pod's text and its status.
const STATUS_MEMBER: &str = ",\"status\":";

/// The text of the field at dotted `path` under `root` (`spec.nodeName`), when it is a
/// scalar: what a field selector compares.
fn selectable_text(root: &Value, path: &str) -> Option<Box<str>> {
    let found = path.split('.').try_fold(root, |v, key| v.get(key))?;
    let text = match found {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    Some(text.into_boxed_str())
}

/// `value`'s compact JSON appended to `out` (`serde_json`'s own encoding).
fn encode_into(out: &mut Vec<u8>, value: &impl serde::Serialize) {
    serde_json::to_writer(out, value).expect("a Value and a str always encode");
}

/// `object` as compact JSON, byte for byte `object.to_string()`, with where a status write
/// cuts it when it is laid out for that (an object whose metadata is an object with a
/// resourceVersion, and whose status, if any, comes last).
fn encode_pod(object: &Value) -> (String, Option<PodCut>) {
    let Value::Object(members) = object else {
        return (object.to_string(), None);
    };
    let mut out = Vec::with_capacity(2048);
    let (mut rv, mut uid, mut status_at) = (None, None, None);
    let mut laid_out = true;
    out.push(b'{');
    for (i, (key, value)) in members.iter().enumerate() {
        if key == "status" {
            laid_out &= i > 0 && i + 1 == members.len();
            status_at = Some(out.len());
        }
        if i > 0 {
            out.push(b',');
        }
        encode_into(&mut out, key);
        out.push(b':');
        match value {
            Value::Object(metadata) if key == "metadata" => {
                out.push(b'{');
                for (j, (name, value)) in metadata.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    encode_into(&mut out, name);
                    out.push(b':');
                    let start = out.len();
                    encode_into(&mut out, value);
                    // The value's text between its quotes is the value: no escapes.
                    let plain = match value {
                        Value::String(text) => {
                            (out.len() - start == text.len() + 2).then(|| start + 1..out.len() - 1)
                        }
                        _ => None,
                    };
                    match name.as_str() {
                        "resourceVersion" => rv = plain,
                        "uid" => uid = plain,
                        _ => {}
                    }
                }
                out.push(b'}');
            }
            _ => encode_into(&mut out, value),
        }
    }
    out.push(b'}');
    let json = String::from_utf8(out).expect("serde_json writes UTF-8");
    let cut = match rv {
        Some(rv) if laid_out => Some(PodCut {
            rv,
            uid,
            status_at: status_at.unwrap_or(json.len() - 1),
        }),
        _ => None,
    };
    (json, cut)
}

impl StoredObject {
    fn new(kind: Kind, object: &Value) -> Self {
        let fields = kind
            .selectable_fields()
            .iter()
            .filter_map(|name| Some((*name, selectable_text(object, name)?)))
            .collect();
        let resource_version = field(object, "/metadata/resourceVersion")
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0);
        let (json, cut) = if kind == Kind::Pod {
            encode_pod(object)
        } else {
            (object.to_string(), None)
        };
        Self {
            json: json.into_boxed_str(),
            fields,
            resource_version,
            cut,
        }
    }

    /// A cut pod's status text (`None`: it has none).
    fn status_text(&self, cut: &PodCut) -> Option<&str> {
        self.json
            .get(cut.status_at..self.json.len() - 1)?
            .strip_prefix(STATUS_MEMBER)
    }

    /// This cut pod under resourceVersion `resource_version` with status `status` (and its
    /// text): the text before the status is copied, its resourceVersion replaced; the
    /// selectable fields of the status are taken from `status`, the others kept.
    fn with_status(
        &self,
        cut: &PodCut,
        resource_version: u64,
        (status, status_text): (&Value, &str),
    ) -> Self {
        let rv_text = resource_version.to_string();
        let head = &self.json[..cut.status_at];
        let mut json = String::with_capacity(
            head.len() + rv_text.len() + STATUS_MEMBER.len() + status_text.len() + 1,
        );
        json.push_str(&head[..cut.rv.start]);
        json.push_str(&rv_text);
        json.push_str(&head[cut.rv.end..]);
        json.push_str(STATUS_MEMBER);
        json.push_str(status_text);
        json.push('}');
        let shift = |at: usize| {
            if at >= cut.rv.end {
                at - cut.rv.len() + rv_text.len()
            } else {
                at
            }
        };
        let fields = Kind::Pod
            .selectable_fields()
            .iter()
            .filter_map(|name| match name.strip_prefix("status.") {
                Some(path) => Some((*name, selectable_text(status, path)?)),
                None => self
                    .fields
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(n, v)| (*n, v.clone())),
            })
            .collect();
        Self {
            json: json.into_boxed_str(),
            fields,
            resource_version,
            cut: Some(PodCut {
                rv: cut.rv.start..cut.rv.start + rv_text.len(),
                uid: cut.uid.as_ref().map(|uid| shift(uid.start)..shift(uid.end)),
                status_at: shift(cut.status_at),
            }),
        }
    }

    /// The object as JSON text.
    pub fn json(&self) -> &str {
        &self.json
    }

    /// The object as a `Value` tree (parsed from the text).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.json).expect("the store wrote this text from a Value")
    }

    /// The object as `K`, straight from its text. Its lists grow by doubling as they are
    /// read: a holder that keeps it long gives the room back (the pod cache does).
    pub fn decode<K: serde::de::DeserializeOwned>(&self) -> serde_json::Result<K> {
        serde_json::from_str(&self.json)
    }

    /// A selectable field's value (`status.phase`); empty when absent or not selectable.
    pub fn field(&self, name: &str) -> &str {
        self.fields
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, v)| v)
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }
}

/// What a list or watch selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    /// The kind.
    pub kind: Kind,
    /// Only this namespace (`None`: all).
    pub namespace: Option<String>,
    /// Only objects matching this.
    pub fields: FieldSelector,
}

impl Selection {
    /// Everything of `kind`.
    pub fn all(kind: Kind) -> Self {
        Self {
            kind,
            namespace: None,
            fields: FieldSelector::default(),
        }
    }

    fn matches(&self, reference: &ObjectRef, object: &StoredObject) -> bool {
        reference.kind == self.kind
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| !self.kind.is_namespaced() || *ns == reference.namespace)
            && self.fields.matches(object)
    }
}

/// How to delete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    /// `gracePeriodSeconds`; for pods `None` means `spec.terminationGracePeriodSeconds` (30).
    pub grace_period_seconds: Option<i64>,
    /// `preconditions`.
    pub preconditions: Preconditions,
}

/// What a delete did.
#[derive(Clone, Debug, PartialEq)]
pub enum Deleted {
    /// The object is gone; this is its last state.
    Removed(Value),
    /// A pod got (or already had) a `deletionTimestamp`; this is its new state.
    Terminating(Value),
}

struct Inner {
    resource_version: u64,
    /// Shared with the watch history: one copy of each version, as JSON text.
    objects: BTreeMap<ObjectRef, Arc<StoredObject>>,
    history: VecDeque<Arc<WatchEvent>>,
    history_limit: usize,
}

/// The store.
pub struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<WatchEvent>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("Store")
            .field("resource_version", &inner.resource_version)
            .field("objects", &inner.objects.len())
            .finish()
    }
}

impl Default for Store {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

fn now_string(clock: &dyn Clock) -> String {
    // The API's second precision.
    let now = clock.now();
    Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// A stored pod whose phase is terminal (`Succeeded` or `Failed`).
pub(crate) fn pod_is_terminal(pod: &Value) -> bool {
    rustlet_core::pod::PodPhase::parse(pod.pointer("/status/phase").and_then(Value::as_str))
        .is_terminal()
}

/// Gives `object` this status, or none.
fn set_status(object: &mut Value, status: Option<&Value>) {
    match status {
        Some(status) => object["status"] = status.clone(),
        None => {
            if let Some(o) = object.as_object_mut() {
                o.remove("status");
            }
        }
    }
}

fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    object["metadata"]
        .as_object_mut()
        .expect("metadata was just made an object")
}

fn field<'a>(object: &'a Value, pointer: &str) -> Option<&'a str> {
    object.pointer(pointer).and_then(Value::as_str)
}

/// A precondition on `what` (`UID`, `ResourceVersion`) that the stored object does not meet.
fn precondition_failed(
    reference: &ObjectRef,
    what: &str,
    expected: &str,
    found: &str,
) -> StoreError {
    StoreError::Conflict {
        reference: reference.clone(),
        message: format!(
            "the {what} in the precondition ({expected}) does not match the {what} in record ({found}); the object might have been deleted and then recreated"
        ),
    }
}

/// A patch whose `metadata.uid` is not the stored one: the API server's validation refuses
/// the change of an immutable field.
fn uid_changed(reference: &ObjectRef, uid: &str) -> StoreError {
    StoreError::Invalid(format!(
        "{} {:?} is invalid: metadata.uid: Invalid value: {uid:?}: field is immutable",
        reference.kind.name(),
        reference.name
    ))
}

/// What a status write leaves stored, with the object as a tree when the write built one.
struct Written {
    stored: Arc<StoredObject>,
    tree: Option<Value>,
}

/// 16 bytes in the API's textual UID form (8-4-4-4-12 hex digits).
fn uuid_text(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // One allocation: a store's storm writes an event UID per container start.
    let mut text = String::with_capacity(36);
    for (i, b) in bytes[..16].iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        text.push(char::from(DIGITS[usize::from(b >> 4)]));
        text.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    text
}

/// A UID made from `seed` in the API's textual form (8-4-4-4-12 hex digits).
pub fn uid_from(seed: &[u8]) -> String {
    uuid_text(digest(&SHA256, seed).as_ref())
}

/// A random (version 4) UUID, as the API server gives a new object.
pub fn random_uid() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        // No system randomness: a UID unique to this moment and process still.
        let seed = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
        return uid_from(seed.as_bytes());
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    uuid_text(&bytes)
}

impl Store {
    /// An empty store using `clock` for timestamps.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_config(clock, StoreConfig::default())
    }

    /// An empty store that keeps its past as `config` says.
    pub fn with_config(clock: Arc<dyn Clock>, config: StoreConfig) -> Self {
        let history_limit = config.history.max(1);
        Self {
            // Never 0, which means "any" to a watch: an empty store lists at "1", as etcd's
            // revisions start above 0.
            inner: Mutex::new(Inner {
                resource_version: 1,
                objects: BTreeMap::new(),
                history: VecDeque::with_capacity(history_limit),
                history_limit,
            }),
            events: broadcast::channel(config.watch_buffer.max(1)).0,
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().resource_version
    }

    /// The reference of a document, checking `apiVersion`, `kind` and `metadata.name`;
    /// a namespaced object without a namespace goes to `default`.
    pub fn reference_of(object: &Value) -> Result<ObjectRef, StoreError> {
        let api_version = field(object, "/apiVersion").unwrap_or("");
        let kind_name = field(object, "/kind").unwrap_or("");
        let kind = Kind::from_type(api_version, kind_name).ok_or_else(|| {
            StoreError::Invalid(format!(
                "unsupported apiVersion/kind {api_version:?}/{kind_name:?}"
            ))
        })?;
        let name = field(object, "/metadata/name")
            .filter(|n| !n.is_empty())
            .ok_or_else(|| StoreError::Invalid(format!("{kind_name} without metadata.name")))?;
        let namespace = field(object, "/metadata/namespace")
            .filter(|n| !n.is_empty())
            .unwrap_or("default");
        Ok(ObjectRef::new(kind, namespace, name))
    }

    fn commit(
        &self,
        inner: &mut Inner,
        type_: EventType,
        reference: ObjectRef,
        object: Arc<StoredObject>,
    ) {
        self.commit_change(inner, type_, reference, object, None);
    }

    fn commit_change(
        &self,
        inner: &mut Inner,
        type_: EventType,
        reference: ObjectRef,
        object: Arc<StoredObject>,
        previous: Option<Arc<StoredObject>>,
    ) {
        let event = Arc::new(WatchEvent {
            type_,
            reference,
            object,
            previous,
            resource_version: inner.resource_version,
        });
        if inner.history.len() == inner.history_limit {
            inner.history.pop_front();
        }
        inner.history.push_back(event.clone());
        // No watcher is fine.
        let _ = self.events.send(event);
    }

    fn bump(inner: &mut Inner, object: &mut Value) {
        inner.resource_version += 1;
        metadata_mut(object).insert(
            "resourceVersion".into(),
            Value::String(inner.resource_version.to_string()),
        );
    }

    /// Store a changed object under a new resourceVersion and announce it as MODIFIED.
    fn write_modified(
        &self,
        inner: &mut Inner,
        reference: &ObjectRef,
        object: &mut Value,
    ) -> Arc<StoredObject> {
        Self::bump(inner, object);
        let shared = Arc::new(StoredObject::new(reference.kind, object));
        self.replace(inner, reference, shared.clone());
        shared
    }

    /// Store `shared` as `reference`'s new version and announce it as MODIFIED.
    fn replace(&self, inner: &mut Inner, reference: &ObjectRef, shared: Arc<StoredObject>) {
        let previous = inner.objects.insert(reference.clone(), shared.clone());
        self.commit_change(
            inner,
            EventType::Modified,
            reference.clone(),
            shared,
            previous,
        );
    }

    /// Create `object`. A missing `metadata.uid` is generated; `creationTimestamp` is set.
    pub fn create(&self, object: Value) -> Result<Value, StoreError> {
        let reference = Self::reference_of(&object)?;
        let mut object = admit(&reference, object, Operation::Create)?;
        let mut inner = self.lock();
        if inner.objects.contains_key(&reference) {
            return Err(StoreError::AlreadyExists(reference));
        }
        let seed = format!(
            "{reference}/{}/{}",
            inner.resource_version,
            self.clock.now()
        );
        let created = now_string(&*self.clock);
        let meta = metadata_mut(&mut object);
        if reference.kind.is_namespaced() {
            meta.insert(
                "namespace".into(),
                Value::String(reference.namespace.clone()),
            );
        }
        let uid_missing = meta
            .get("uid")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        if uid_missing {
            meta.insert("uid".into(), Value::String(uid_from(seed.as_bytes())));
        }
        meta.insert("creationTimestamp".into(), Value::String(created));
        meta.remove("deletionTimestamp");
        Self::bump(&mut inner, &mut object);
        let shared = Arc::new(StoredObject::new(reference.kind, &object));
        inner.objects.insert(reference.clone(), shared.clone());
        self.commit(&mut inner, EventType::Added, reference, shared);
        Ok(object)
    }

    /// The stored object.
    pub fn get(&self, reference: &ObjectRef) -> Result<Value, StoreError> {
        Self::stored(&self.lock(), reference)
    }

    /// The stored version, parsed.
    fn stored(inner: &Inner, reference: &ObjectRef) -> Result<Value, StoreError> {
        inner
            .objects
            .get(reference)
            .map(|o| o.to_value())
            .ok_or_else(|| StoreError::NotFound(reference.clone()))
    }

    /// [`Store::list`] without copying: the stored versions themselves.
    pub fn list_shared(&self, selection: &Selection) -> (Vec<Arc<StoredObject>>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .iter()
            .filter(|(r, o)| selection.matches(r, o))
            .map(|(_, o)| o.clone())
            .collect();
        (items, inner.resource_version)
    }

    /// The objects `selection` selects, and the resourceVersion to watch from.
    pub fn list(&self, selection: &Selection) -> (Vec<Value>, u64) {
        let (items, resource_version) = self.list_shared(selection);
        let items = items.iter().map(|o| o.to_value()).collect();
        (items, resource_version)
    }

    fn check(
        reference: &ObjectRef,
        stored: &Value,
        preconditions: &Preconditions,
    ) -> Result<(), StoreError> {
        let checks = [
            ("UID", "/metadata/uid", &preconditions.uid),
            (
                "ResourceVersion",
                "/metadata/resourceVersion",
                &preconditions.resource_version,
            ),
        ];
        for (what, pointer, expected) in checks {
            let Some(expected) = expected else { continue };
            let found = field(stored, pointer).unwrap_or("");
            if found != expected {
                return Err(precondition_failed(reference, what, expected, found));
            }
        }
        Ok(())
    }

    /// Replace an object (PUT). Its `status` is kept when the kind has a status subresource;
    /// `uid`, `creationTimestamp` and `deletionTimestamp` are kept; `metadata.uid` and
    /// `metadata.resourceVersion` in the body are preconditions.
    pub fn update(&self, object: Value) -> Result<Value, StoreError> {
        let reference = Self::reference_of(&object)?;
        let preconditions = Preconditions::from_body(&object);
        let mut object = admit(&reference, object, Operation::Update)?;
        let mut inner = self.lock();
        let stored = Self::stored(&inner, &reference)?;
        Self::check(&reference, &stored, &preconditions)?;
        if reference.kind.has_status() {
            match stored.get("status") {
                Some(status) => object["status"] = status.clone(),
                None => {
                    if let Some(o) = object.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
        }
        let kept: Vec<(String, Value)> = [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
        ]
        .into_iter()
        .filter_map(|k| Some((k.to_owned(), stored["metadata"].get(k)?.clone())))
        .collect();
        let meta = metadata_mut(&mut object);
        meta.remove("deletionTimestamp");
        meta.remove("deletionGracePeriodSeconds");
        meta.extend(kept);
        if reference.kind.is_namespaced() {
            meta.insert(
                "namespace".into(),
                Value::String(reference.namespace.clone()),
            );
        }
        if stored == object {
            return Ok(object);
        }
        self.write_modified(&mut inner, &reference, &mut object);
        Ok(object)
    }

    /// Patch the `status` subresource. Pods take a strategic merge patch of their status
    /// (merge keys: conditions by `type`, container statuses by `name`, ...); other kinds a
    /// JSON merge patch. `metadata.uid` and `metadata.resourceVersion` in the patch are
    /// preconditions; nothing outside `status` changes.
    pub fn patch_status(&self, reference: &ObjectRef, patch: &Value) -> Result<Value, StoreError> {
        self.patch_status_as(reference, patch, PatchKind::of_status(reference.kind))
    }

    /// PUT of the status subresource: the body's `status` replaces the stored one; nothing else
    /// changes; `metadata.uid` and `metadata.resourceVersion` in the body are preconditions.
    pub fn update_status(&self, object: Value) -> Result<Value, StoreError> {
        let reference = Self::reference_of(&object)?;
        if !reference.kind.has_status() {
            return Err(StoreError::Invalid(format!(
                "{} has no status subresource",
                reference.kind.name()
            )));
        }
        let preconditions = Preconditions::from_body(&object);
        let mut inner = self.lock();
        let mut updated = Self::stored(&inner, &reference)?;
        Self::check(&reference, &updated, &preconditions)?;
        // Only the status changes: the old one is kept to compare with, not the whole object.
        let old_status = updated.get("status").cloned();
        set_status(&mut updated, object.get("status"));
        if updated.get("status") == old_status.as_ref() {
            return Ok(updated);
        }
        admit_status(&reference, old_status.as_ref(), &mut updated)?;
        self.write_modified(&mut inner, &reference, &mut updated);
        Ok(updated)
    }

    /// PATCH of the status subresource with the given patch type (the `Content-Type`): only
    /// the status of the result is kept. A JSON patch (RFC 6902) applies to the whole object.
    pub fn patch_status_as(
        &self,
        reference: &ObjectRef,
        patch: &Value,
        kind: PatchKind,
    ) -> Result<Value, StoreError> {
        let written = self.write_status_patch(reference, patch, kind)?;
        Ok(written.tree.unwrap_or_else(|| written.stored.to_value()))
    }

    /// [`Store::patch_status`], answered with the stored version itself (its text and fields),
    /// not a tree: what a client that decodes the result as its type wants. A pod's status
    /// write then parses and encodes only the status, not the whole pod.
    pub(crate) fn patch_status_shared(
        &self,
        reference: &ObjectRef,
        patch: &Value,
    ) -> Result<Arc<StoredObject>, StoreError> {
        let kind = PatchKind::of_status(reference.kind);
        Ok(self.write_status_patch(reference, patch, kind)?.stored)
    }

    fn write_status_patch(
        &self,
        reference: &ObjectRef,
        patch: &Value,
        kind: PatchKind,
    ) -> Result<Written, StoreError> {
        if !reference.kind.has_status() {
            return Err(StoreError::Invalid(format!(
                "{} has no status subresource",
                reference.kind.name()
            )));
        }
        let preconditions = Preconditions::from_body(patch);
        let mut inner = self.lock();
        if reference.kind == Kind::Pod && kind != PatchKind::Json {
            let stored = inner
                .objects
                .get(reference)
                .cloned()
                .ok_or_else(|| StoreError::NotFound(reference.clone()))?;
            if let Some(cut) = &stored.cut {
                let stored = self.patch_cut_pod_status(
                    &mut inner,
                    reference,
                    (&stored, cut),
                    patch,
                    &preconditions,
                    kind,
                )?;
                return Ok(Written { stored, tree: None });
            }
        }
        let mut object = Self::stored(&inner, reference)?;
        // A patch has no storage preconditions: as the API server, the resourceVersion in the
        // body is compared first (409), then validation finds an immutable UID changed (422).
        Self::check(
            reference,
            &object,
            &Preconditions {
                uid: None,
                resource_version: preconditions.resource_version.clone(),
            },
        )?;
        if let Some(uid) = &preconditions.uid
            && field(&object, "/metadata/uid") != Some(uid.as_str())
        {
            return Err(uid_changed(reference, uid));
        }
        // A status write changes the status, and a node's strategic patch also its labels and
        // annotations: the old status is kept to compare with and to admit against, and the
        // whole object only for that node patch (not a copy of every pod's whole object).
        let old_status = object.get("status").cloned();
        let node_merge = kind == PatchKind::StrategicMerge && reference.kind == Kind::Node;
        let old_object = node_merge.then(|| object.clone());
        match kind {
            PatchKind::Json => {
                let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                    .map_err(|e| StoreError::Invalid(format!("a JSON patch: {e}")))?;
                let mut patched = object.clone();
                json_patch::patch(&mut patched, &ops)
                    .map_err(|e| StoreError::Invalid(format!("the JSON patch failed: {e}")))?;
                set_status(&mut object, patched.get("status"));
            }
            // As the API server's node status strategy: only the spec is reset, so a node's
            // status patch may also set its labels and annotations (upstream's kubelet
            // reconciles them so at registration), and the status lists merge by key.
            PatchKind::StrategicMerge if reference.kind == Kind::Node => {
                rustlet_core::node_status::apply_node_status_patch(&mut object, patch);
            }
            PatchKind::StrategicMerge | PatchKind::Merge => {
                if let Some(status_patch) = patch.get("status") {
                    let status = object
                        .as_object_mut()
                        .ok_or_else(|| {
                            StoreError::Invalid(format!("{reference} is not an object"))
                        })?
                        .entry("status")
                        .or_insert_with(|| json!({}));
                    if kind == PatchKind::StrategicMerge && reference.kind == Kind::Pod {
                        apply_status_patch(status, status_patch);
                    } else {
                        json_merge(status, status_patch);
                    }
                }
            }
        }
        let unchanged = match &old_object {
            Some(old) => *old == object,
            None => object.get("status") == old_status.as_ref(),
        };
        if unchanged {
            let stored = inner
                .objects
                .get(reference)
                .cloned()
                .expect("read under the same lock");
            return Ok(Written {
                stored,
                tree: Some(object),
            });
        }
        admit_status(reference, old_status.as_ref(), &mut object)?;
        let stored = self.write_modified(&mut inner, reference, &mut object);
        Ok(Written {
            stored,
            tree: Some(object),
        })
    }

    /// A pod's status patch on its text ([`PodCut`]): the same preconditions, patch and
    /// admission as on the whole pod, with only the status parsed and encoded (and the spec
    /// read only if the admission asks for it).
    fn patch_cut_pod_status(
        &self,
        inner: &mut Inner,
        reference: &ObjectRef,
        (stored, cut): (&Arc<StoredObject>, &PodCut),
        patch: &Value,
        preconditions: &Preconditions,
        kind: PatchKind,
    ) -> Result<Arc<StoredObject>, StoreError> {
        if let Some(expected) = &preconditions.resource_version {
            let found = &stored.json[cut.rv.clone()];
            if found != expected {
                return Err(precondition_failed(
                    reference,
                    "ResourceVersion",
                    expected,
                    found,
                ));
            }
        }
        if let Some(uid) = &preconditions.uid
            && cut.uid.as_ref().map(|at| &stored.json[at.clone()]) != Some(uid.as_str())
        {
            return Err(uid_changed(reference, uid));
        }
        let Some(status_patch) = patch.get("status") else {
            return Ok(stored.clone());
        };
        // The old status is parsed once, patched in place, and compared as text: the same
        // text is the same status (a patch keeps the members' order).
        let old_text = stored.status_text(cut);
        let mut status = match old_text {
            Some(text) => {
                serde_json::from_str(text).expect("the store wrote this text from a Value")
            }
            None => json!({}),
        };
        if kind == PatchKind::StrategicMerge {
            apply_status_patch(&mut status, status_patch);
        } else {
            json_merge(&mut status, status_patch);
        }
        let mut status_text = status.to_string();
        if old_text == Some(status_text.as_str()) {
            return Ok(stored.clone());
        }
        let old = old_text
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default();
        let spec = || {
            serde_json::from_str::<Value>(&stored.json)
                .ok()
                .and_then(|pod| PodSpec::deserialize(pod.get("spec")?).ok())
                .unwrap_or_default()
        };
        if let Some(defaults) = admit_pod_status(reference, old, &status, &spec)? {
            defaults.apply(&mut status);
            status_text = status.to_string();
        }
        inner.resource_version += 1;
        let shared =
            Arc::new(stored.with_status(cut, inner.resource_version, (&status, &status_text)));
        self.replace(inner, reference, shared.clone());
        Ok(shared)
    }

    /// Delete. A pod with a grace period (given, else its
    /// `spec.terminationGracePeriodSeconds`, else 30) that is not yet terminating gets
    /// `deletionTimestamp` and `deletionGracePeriodSeconds` and stays; a grace period of 0, a
    /// terminating pod deleted with a grace period of 0, or any other kind is removed.
    pub fn delete(
        &self,
        reference: &ObjectRef,
        options: &DeleteOptions,
    ) -> Result<Deleted, StoreError> {
        let mut inner = self.lock();
        let stored = Self::stored(&inner, reference)?;
        Self::check(reference, &stored, &options.preconditions)?;
        let mut grace = options.grace_period_seconds.unwrap_or_else(|| {
            stored
                .pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(30)
        });
        // Upstream's pod strategy (`CheckGracefulDelete`): a pod never scheduled, or already
        // Succeeded or Failed, has nothing to stop and goes at once.
        let unscheduled = stored
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        let finished = pod_is_terminal(&stored);
        if unscheduled || finished {
            grace = 0;
        }
        if reference.kind == Kind::Pod && stored.pointer("/metadata/deletionTimestamp").is_some() {
            // Already terminating (upstream `BeforeDelete`): a delete may only shorten the grace
            // period; 0 removes the pod now.
            let current = stored
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let shorter = options.grace_period_seconds.is_some() || unscheduled || finished;
            if !shorter || grace >= current {
                return Ok(Deleted::Terminating(stored));
            }
            if grace > 0 {
                let mut object = stored.clone();
                let since = stored
                    .pointer("/metadata/deletionTimestamp")
                    .and_then(Value::as_str)
                    .and_then(|t| t.parse::<Timestamp>().ok())
                    .unwrap_or_else(|| self.clock.now());
                let at =
                    since - SignedDuration::from_secs(current) + SignedDuration::from_secs(grace);
                let meta = metadata_mut(&mut object);
                meta.insert("deletionTimestamp".into(), Value::String(at.to_string()));
                meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
                self.write_modified(&mut inner, reference, &mut object);
                return Ok(Deleted::Terminating(object));
            }
        } else if reference.kind == Kind::Pod && grace > 0 {
            let mut object = stored.clone();
            let at = self.clock.now() + SignedDuration::from_secs(grace);
            let meta = metadata_mut(&mut object);
            meta.insert(
                "deletionTimestamp".into(),
                Value::String(
                    Timestamp::from_second(at.as_second())
                        .unwrap_or(at)
                        .to_string(),
                ),
            );
            meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
            self.write_modified(&mut inner, reference, &mut object);
            return Ok(Deleted::Terminating(object));
        }
        inner.objects.remove(reference);
        let mut object = stored;
        Self::bump(&mut inner, &mut object);
        let shared = Arc::new(StoredObject::new(reference.kind, &object));
        self.commit(&mut inner, EventType::Deleted, reference.clone(), shared);
        Ok(Deleted::Removed(object))
    }

    /// Watch `selection` from `resource_version` (exclusive): past events still in the history
    /// come first, then live ones. `0` means "any": as the API server, the watch starts with an
    /// ADDED event for every current object, then goes on live, so nothing created between a
    /// list and this watch is lost.
    pub fn watch(&self, selection: Selection, resource_version: u64) -> Result<Watch, StoreError> {
        let inner = self.lock();
        let live = self.events.subscribe();
        let oldest = inner.history.front().map_or(inner.resource_version, |e| {
            e.resource_version.saturating_sub(1)
        });
        if resource_version != 0 && resource_version < oldest {
            return Err(StoreError::Gone {
                requested: resource_version,
                oldest,
            });
        }
        let from = if resource_version == 0 {
            inner.resource_version
        } else {
            resource_version
        };
        let replay = if resource_version == 0 {
            inner
                .objects
                .iter()
                .filter(|(r, o)| selection.matches(r, o))
                .map(|(reference, object)| {
                    Arc::new(WatchEvent {
                        type_: EventType::Added,
                        reference: reference.clone(),
                        object: object.clone(),
                        previous: None,
                        resource_version: match object.resource_version() {
                            0 => from,
                            rv => rv,
                        },
                    })
                })
                .collect()
        } else {
            inner
                .history
                .iter()
                .filter(|e| e.resource_version > from)
                .cloned()
                .collect()
        };
        Ok(Watch {
            selection,
            replay,
            live,
            last: inner.resource_version.max(from),
        })
    }
}

/// RFC 7386 JSON merge patch.
pub fn json_merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let object = target.as_object_mut().expect("made an object above");
    for (key, value) in patch {
        if value.is_null() {
            object.remove(key);
        } else {
            json_merge(object.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// A stream of the changes a selection sees.
#[derive(Debug)]
pub struct Watch {
    selection: Selection,
    replay: VecDeque<Arc<WatchEvent>>,
    live: broadcast::Receiver<Arc<WatchEvent>>,
    last: u64,
}

impl Watch {
    /// The next matching event; `Err(Gone)` when this watcher fell too far behind (relist).
    pub async fn next(&mut self) -> Result<Arc<WatchEvent>, StoreError> {
        loop {
            let event = match self.replay.pop_front() {
                Some(event) => event,
                None => match self.live.recv().await {
                    Ok(event) if event.resource_version <= self.last => continue,
                    Ok(event) => event,
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        return Err(StoreError::Gone {
                            requested: self.last,
                            oldest: self.last + 1,
                        });
                    }
                    Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
                },
            };
            self.last = self.last.max(event.resource_version);
            let matches = |object: &StoredObject| self.selection.matches(&event.reference, object);
            let matched_before = event.previous.as_deref().map(matches);
            let as_type = |type_| {
                Arc::new(WatchEvent {
                    type_,
                    ..(*event).clone()
                })
            };
            match (matches(&event.object), matched_before) {
                (true, Some(false)) => return Ok(as_type(EventType::Added)),
                (true, _) => return Ok(event),
                (false, Some(true)) => return Ok(as_type(EventType::Deleted)),
                (false, _) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests;
