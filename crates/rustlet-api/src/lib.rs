//! rustlet-api: adapters that make the managers' seams real, over a cluster or without one.
//!
//! Every reading adapter works over a [`Backend`]: `Backend::Cluster(kube::Client)` or
//! `Backend::Local(Arc<local::store::Store>)`. Both give the same `watcher::Event` streams and
//! the same errors, so local mode behaves as a cluster does.
//!
//! | adapter | seam it fills |
//! |---|---|
//! | [`kube_status::KubePodStatusClient`] / [`local::LocalPodStatusClient`] | `rustlet_status::PodStatusClient` |
//! | [`pod_cache::PodCache`] | `rustlet_status::PodManager`, `rustlet_volume::populator::PodSource` |
//! | [`node_cache::NodeCache`] | `rustlet_volume::node::NodeStatus` |
//! | [`objects::ApiObjects`] (with [`content::ObjectSource`]) | `rustlet_volume::objects::VolumeObjects` |
//! | [`events::KubeEventRecorder`] / [`local::events::LocalEventRecorder`] | `rustlet_volume::events::EventRecorder` |
//! | [`node::NodeRegistrar`] | the Node object and its status, `status.volumesInUse`, the node Lease |
//!
//! * The status client: GET; strategic merge PATCH of the status subresource with the UID,
//!   and optionally the resourceVersion, as preconditions in the body; DELETE with
//!   `gracePeriodSeconds: 0` and a UID precondition; API errors mapped to the typed error.
//! * [`pod_cache::PodCache`]: the pods bound to this node (`fieldSelector=spec.nodeName=`),
//!   indexed by UID with static/mirror translation. [`node_cache::NodeCache`]: this node.
//! * [`objects::ApiObjects`]: ConfigMaps and Secrets that registered pods reference (one watch
//!   per object, reference counted by pod, immutable ones no longer watched, changes announced:
//!   upstream's watch-based manager), PVC and PV reads, and TokenRequest for projected service
//!   account tokens (cached, renewed at 80% of their lifetime or after 24 h less a jitter, the
//!   old one served while a renewal fails; a cluster only).
//! * [`rate_limit::RateLimitLayer`]: QPS/burst shared by every caller of one `kube::Client`;
//!   [`client::build_clients`] builds the agent's three clients (upstream's kube, event and
//!   heartbeat clients: a bucket for events of their own, none for the Lease and node status),
//!   with kube's own retries on or off.
//! * [`events::KubeEventRecorder`]: events.k8s.io/v1 through kube-runtime's recorder, from a
//!   bounded queue drained by one task (the oldest dropped and counted when it is full).
//! * [`dir_watch::DirWatch`]: inotify on a manifest directory, so `DirectorySync` and the
//!   static pod source read a change at once (a periodic scan stays as the safety net).
//! * [`static_pods`]: static pods from a manifest directory (`--pod-manifest-path`) into the
//!   pod cache, and their mirror pods in the API, which follow the pod workers through the
//!   [`static_pods::StaticPodWorkers`] seam.
//! * [`node::NodeRegistrar`]: registers the Node as the kubelet does (labels, annotation,
//!   taints; an existing Node reconciled), keeps its status (upstream's setters over the
//!   [`node::machine::Machine`] and [`node::NodeRuntime`] seams, patched on a change or every
//!   `nodeStatusReportFrequency`), writes `status.volumesInUse`, and renews the
//!   `kube-node-lease` Lease every 10 s.
//! * [`local`]: local mode. [`local::store::Store`] keeps objects with the API server's
//!   semantics (UIDs, resourceVersions, the status subresource, preconditions, graceful pod
//!   deletion, resumable watches) and admits objects as the API server does
//!   ([`local::admission`]: typed decoding, defaults, validation of names, keys and paths); [`local::manifests::DirectorySync`] keeps a directory of
//!   manifests in it; [`local::watch`] turns its list and watch into `watcher::Event`s;
//!   [`local::events::LocalEventRecorder`] stores events as kube-runtime's recorder sends them.
//! * [`test_server`] (feature `test-util`): the test API server, REST over the same store, with
//!   fault injection and a request log; a conformance table runs against both.
//!
//! It depends on `rustlet-core`, `rustlet-status` and `rustlet-volume`, whose traits it
//! implements, and must never be imported by them.

pub mod backend;
pub mod client;
pub mod content;
pub mod dir_watch;
pub mod events;
pub mod kube_status;
pub mod local;
pub mod node;
pub mod node_cache;
pub mod objects;
pub mod pod_cache;
pub mod rate_limit;
pub mod static_pods;
#[cfg(feature = "test-util")]
pub mod test_server;

pub use backend::Backend;
pub use client::{ApiClients, ClientConfig, ClientKind, KubeRetries, build_client, build_clients};
pub use content::{ConfigMapSource, ObjectSource, SecretSource};
pub use events::KubeEventRecorder;
pub use kube_status::KubePodStatusClient;
pub use node_cache::NodeCache;
pub use objects::ApiObjects;
pub use pod_cache::PodCache;
pub use rate_limit::RateLimitLayer;

/// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
