//! The node's kubelet server, as upstream's `pkg/kubelet/server` serves it on :10250: what
//! `kubectl logs`, `exec`, `attach`, `port-forward` and `top` reach through the API server.
//!
//! Modules are added as issue 26 builds them:
//!
//! * [`tls`]: the serving certificate (`tlsCertFile`/`tlsPrivateKeyFile`, or a self-signed one
//!   generated under `<root>/pki` and reused), the client CA (`clientCAFile`), the rustls
//!   server configuration, and [`tls::serve`], the accept loop that hands each request its
//!   connection's client certificates.
//! * [`auth`]: the kubelet's authentication (x509 client certificates, bearer tokens through a
//!   `TokenReview`, anonymous when enabled) and authorization (the verb and `nodes`
//!   subresources a path maps to, through a `SubjectAccessReview`, or `AlwaysAllow`), with
//!   upstream's caches, and [`auth::AuthLayer`], the tower layer that puts both in front of
//!   every route.
//! * [`logs`]: the `/containerLogs` query, the CRI container-log reader (tail, since, limit,
//!   timestamps, stream, follow) and the container log manager's rotation.
//! * [`routes`]: the axum router (`/healthz`, `/pods`, `/configz`, `/containerLogs`, `/exec`,
//!   `/attach`, `/portForward`, `/stats/summary`, `/metrics/resource`, `/metrics/cadvisor`, `/metrics/probes`) over [`routes::NodeApi`], which the binary implements.
//! * [`stats`]: the `/stats/summary` document and the node's figures from the cgroup tree.
//! * [`metrics`]: `/metrics/resource`, `/metrics/cadvisor` and `/metrics/probes` in the
//!   Prometheus text format.
//! * [`streaming`]: the upgrade proxy of exec, attach and port-forward to the runtime's stream
//!   server.
//!
//! Invariants: every endpoint that upstream guards is guarded the same way (authenticate, then
//! authorize the verb and `nodes` subresource derived from the path); reading a log is bounded
//! in memory however large the file; nothing here writes outside the agent's root and log
//! directories.
//!
//! Layer: above `rustlet-core`; never imports `rustlet` (the binary) nor `tonic` (the CRI
//! calls it needs come through traits the binary implements over `rustlet-cri`).

pub mod auth;
pub mod logs;
pub mod metrics;
pub mod routes;
pub mod stats;
pub mod streaming;
pub mod tls;

#[cfg(test)]
mod test_pki;

/// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
