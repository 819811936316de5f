//! The seams of the status manager: the API client, the pod manager view, the startup-latency
//! hook and the clock. Small traits defined by this consumer; `rustlet-api` implements the
//! client over kube-rs and over the local store.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use rustlet_core::{PodChanges, PodUid};
use serde_json::Value;

/// An API error, classified the way the status manager acts on it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// 404: the pod is gone. Not retryable for this pod object.
    #[error("not found: {0}")]
    NotFound(String),
    /// 409: a precondition (UID or resourceVersion) did not hold. Retry after a fresh read.
    #[error("conflict: {0}")]
    Conflict(String),
    /// Any other status from the server (429, 500, ...). Retryable when 429 or 5xx.
    #[error("API error {code}: {message}")]
    Api {
        /// HTTP status code.
        code: u16,
        /// The server's message.
        message: String,
    },
    /// The request did not get an answer (connection, timeout). Retryable.
    #[error("transport error: {0}")]
    Transport(String),
}

impl ClientError {
    /// 404.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound(_))
    }

    /// 409.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict(_))
    }

    /// A 422 naming `metadata.uid`: the API server's answer to a status patch whose UID
    /// differs from the stored pod's. A patch has no storage preconditions, so the server
    /// compares the resourceVersion first (409) and then finds the immutable UID changed (422):
    /// the pod was deleted and re-created under the same name.
    pub fn is_uid_mismatch(&self) -> bool {
        matches!(self, Self::Api { code: 422, message } if message.contains("metadata.uid"))
    }

    /// Worth retrying unchanged later.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transport(_) | Self::Conflict(_) => true,
            Self::Api { code, .. } => *code == 429 || *code >= 500,
            Self::NotFound(_) => false,
        }
    }

    /// The HTTP status code, for metrics (`0` when there was no answer).
    pub fn code(&self) -> u16 {
        match self {
            Self::NotFound(_) => 404,
            Self::Conflict(_) => 409,
            Self::Api { code, .. } => *code,
            Self::Transport(_) => 0,
        }
    }
}

/// The three API calls of the status manager (upstream: the clientset calls in `syncPod`).
#[cfg_attr(any(test, feature = "test-util"), mockall::automock)]
#[async_trait]
pub trait PodStatusClient: Send + Sync {
    /// `GET /api/v1/namespaces/{ns}/pods/{name}`.
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ClientError>;

    /// `PATCH /api/v1/namespaces/{ns}/pods/{name}/status` with
    /// `application/strategic-merge-patch+json`; the body carries `metadata.uid` (and, when the
    /// caller read from the watch cache, `metadata.resourceVersion`) as preconditions.
    async fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Pod, ClientError>;

    /// `DELETE /api/v1/namespaces/{ns}/pods/{name}` with `gracePeriodSeconds: 0` and
    /// `preconditions.uid`.
    async fn delete_pod(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ClientError>;
}

/// UID translations between static pods and their mirror pods (upstream `GetUIDTranslations`):
/// `pod_to_mirror` has an entry for every static pod, with an empty UID when it has no mirror yet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UidTranslations {
    /// Static pod UID to mirror pod UID (empty when none).
    pub pod_to_mirror: HashMap<PodUid, PodUid>,
    /// Mirror pod UID to static pod UID.
    pub mirror_to_pod: HashMap<PodUid, PodUid>,
}

/// The agent's view of the pods bound to the node, fed by the API watch (upstream
/// `status.PodManager`).
#[cfg_attr(any(test, feature = "test-util"), mockall::automock)]
pub trait PodManager: Send + Sync {
    /// A non-mirror pod by UID.
    fn pod_by_uid(&self, uid: &PodUid) -> Option<Arc<Pod>>;
    /// The mirror pod of a static pod.
    fn mirror_pod_of(&self, pod: &Pod) -> Option<Arc<Pod>>;
    /// Mirror UID to static UID; any other UID unchanged.
    fn translate_pod_uid(&self, uid: &PodUid) -> PodUid;
    /// Both translation maps.
    fn uid_translations(&self) -> UidTranslations;
    /// The pods whose copy changed since `cursor` (a mirror pod's change names the mirror's
    /// UID), so that a full batch visits only those (see [`PodChanges`]). The default keeps no
    /// log: every full batch looks at every pod, as upstream's does.
    fn changes_since(&self, cursor: u64) -> PodChanges {
        let _ = cursor;
        PodChanges::All { cursor: 0 }
    }
}

/// Pod startup latency tracking (upstream `PodStartupLatencyStateHelper`).
#[cfg_attr(any(test, feature = "test-util"), mockall::automock)]
pub trait StartupLatencyHook: Send + Sync {
    /// Called with the API server's pod after a PATCH that changed it.
    fn record_status_updated(&self, pod: &Pod);
    /// Called when a status leaves the cache after a delete or a UID mismatch.
    fn delete_pod_startup_state(&self, uid: &PodUid);
}

/// Wall-clock time for the timestamps the rules write (transition times, start times).
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let secs = i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX);
        let nanos = i32::try_from(since_epoch.subsec_nanos()).unwrap_or(0);
        Timestamp::new(secs, nanos).unwrap_or(Timestamp::UNIX_EPOCH)
    }
}
