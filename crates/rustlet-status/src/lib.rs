//! rustlet-status: the status manager. Not built yet (issue 3): this crate holds only its
//! contract so far.
//!
//! Mirrors upstream `pkg/kubelet/status/status_manager.go`: a per-pod versioned status cache,
//! one sync task fed by a capacity-1 kick channel and a 10 s batch ticker, GET-merge-PATCH of the
//! status subresource with the pod UID as precondition, and the final DELETE with
//! `gracePeriodSeconds: 0` once a terminating pod is finished. The rules themselves come from
//! `rustlet-core`.
//!
//! Invariants it will keep: the sync task alone owns the map of synced versions; a status is
//! deleted from the API only when `rustlet_core::deletion_decision` says so. It depends on
//! `rustlet-core` only and must never import kube, nix or any crate above it; the API is reached
//! through a client trait that `rustlet-api` implements.
