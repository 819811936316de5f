//! The event seam (upstream `record.EventRecorder`): what the volume manager tells users about
//! their pods. `rustlet-api` implements it over kube-runtime's recorder.

use k8s_openapi::api::core::v1::Pod;

/// `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Informational.
    Normal,
    /// Something went wrong.
    Warning,
}

/// Reason of a failed mount (upstream `events.FailedMountVolume`).
pub const FAILED_MOUNT: &str = "FailedMount";
/// Reason of a failed unmount (upstream `events.FailedUnMountVolume`).
pub const FAILED_UNMOUNT: &str = "FailedUnMount";

/// Records events about pods.
pub trait EventRecorder: Send + Sync {
    /// One event.
    fn event(&self, pod: &Pod, kind: EventKind, reason: &str, message: &str);
}

/// Drops every event (for agents without an API server).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoEvents;

impl EventRecorder for NoEvents {
    fn event(&self, _pod: &Pod, _kind: EventKind, _reason: &str, _message: &str) {}
}

/// Upstream `GenerateError(prefix, err)`'s event text: `<prefix> for volume "<name>" : <err>`.
pub fn volume_error_message(prefix: &str, volume: &str, err: &dyn std::fmt::Display) -> String {
    format!("{prefix} for volume {volume:?} : {err}")
}
