//! The node's kubelet server, as upstream's `pkg/kubelet/server` serves it on :10250: what
//! `kubectl logs`, `exec`, `attach`, `port-forward` and `top` reach through the API server.
//!
//! Modules are added as issue 26 builds them. Today: [`logs`], the `/containerLogs` query,
//! the CRI container-log reader (tail, since, limit, timestamps, stream, follow) and the
//! container log manager's rotation; [`streaming`], the upgrade proxy of exec, attach and
//! port-forward to the runtime's stream server. To come: the kubelet's authentication and authorization
//! in front of every endpoint, the routes.
//!
//! Invariants: every endpoint that upstream guards is guarded the same way (authenticate, then
//! authorize the verb and `nodes` subresource derived from the path); reading a log is bounded
//! in memory however large the file; nothing here writes outside the agent's root and log
//! directories.
//!
//! Layer: above `rustlet-core`; never imports `rustlet` (the binary) nor `tonic` (the CRI
//! calls it needs come through traits the binary implements over `rustlet-cri`).

pub mod logs;
pub mod streaming;
