//! rustlet-api: adapters that make the managers' seams real.
//!
//! Built so far:
//!
//! * [`kube_status::KubePodStatusClient`]: the status manager's `rustlet_status::PodStatusClient`
//!   over a `kube::Client` (GET; strategic merge PATCH of the status subresource with the UID,
//!   and optionally the resourceVersion, as preconditions in the body; DELETE with
//!   `gracePeriodSeconds: 0` and a UID precondition), API errors mapped to the typed error.
//! * [`pod_cache::PodCache`]: the pods bound to this node from a watch with
//!   `fieldSelector=spec.nodeName=<node>`, indexed by UID with static/mirror translation: the
//!   status manager's `PodManager` and the volume manager's `PodSource`.
//! * [`node_cache::NodeCache`]: this node from a watch: the volume manager's `NodeStatus`.
//!
//! * [`rate_limit::RateLimitLayer`]: QPS/burst shared by every caller of one `kube::Client`;
//!   [`client::build_client`] builds that client (rate limit, and kube's own retries on or off).
//! * [`events::KubeEventRecorder`]: the volume manager's `EventRecorder` (events.k8s.io/v1).
//! * [`node::NodeRegistrar`]: registers the Node when absent, writes `status.volumesInUse`, and
//!   renews the `kube-node-lease` Lease every 10 s.
//! * [`objects::KubeObjects`]: PersistentVolumeClaim and PersistentVolume getters, and
//!   TokenRequest for projected service account tokens (bound to the pod, cached, renewed at 80%
//!   of their lifetime or after 24 h).
//!
//! * [`content::ObjectSource`] ([`ConfigMapSource`], [`SecretSource`]): the ConfigMaps and
//!   Secrets that registered pods reference, one watch per object, reference counted by pod, with
//!   change announcements (upstream's watch-based manager), for the content plugins to come.
//!
//! * [`local`]: local mode. [`local::store::Store`] keeps objects with the API server's
//!   semantics (UIDs, resourceVersions, the status subresource, preconditions, graceful pod
//!   deletion, resumable watches); [`local::manifests::DirectorySync`] keeps a directory of
//!   manifests in it; [`local::LocalPodStatusClient`] is the status manager's client over it.
//!
//! * [`test_server`] (feature `test-util`): the test API server, REST over the same store, with
//!   fault injection and a request log; a conformance table runs against both.
//!
//! Still to come (issue 6): the ConfigMap/Secret/node seams over the local store, and watch
//! fault cases beyond a cut stream.
//!
//! It depends on `rustlet-core`, `rustlet-status` and `rustlet-volume`, whose traits it
//! implements, and must never be imported by them.

pub mod backend;
pub mod client;
pub mod content;
pub mod events;
pub mod kube_status;
pub mod local;
pub mod node;
pub mod node_cache;
pub mod objects;
pub mod pod_cache;
pub mod rate_limit;
#[cfg(feature = "test-util")]
pub mod test_server;

pub use backend::Backend;
pub use client::{ClientConfig, KubeRetries, build_client};
pub use content::{ConfigMapSource, ObjectSource, SecretSource};
pub use events::KubeEventRecorder;
pub use kube_status::KubePodStatusClient;
pub use node_cache::NodeCache;
pub use objects::ApiObjects;
pub use pod_cache::PodCache;
pub use rate_limit::RateLimitLayer;
