//! rustlet-api: adapters that make the managers' seams real.
//!
//! Built so far: [`kube_status::KubePodStatusClient`], the status manager's
//! `rustlet_status::PodStatusClient` over a `kube::Client` (GET; strategic merge PATCH of the
//! status subresource with the UID, and optionally the resourceVersion, as preconditions in the
//! body; DELETE with `gracePeriodSeconds: 0` and a UID precondition), with API errors mapped to
//! the client's typed error. Still to come (issue 6): the pod watch and pod-manager view, the
//! ConfigMap/Secret sources, PV/PVC getters, Node registration and Lease, events, TokenRequest,
//! client-side rate limiting shared by all callers, the local store and the test API server.
//!
//! It depends on `rustlet-core`, `rustlet-status` and (later) `rustlet-volume`, whose traits it
//! implements, and must never be imported by them.

pub mod kube_status;

pub use kube_status::KubePodStatusClient;
