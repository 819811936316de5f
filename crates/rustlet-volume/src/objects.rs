//! The objects seam: the API objects volume plugins read while they set a volume up.
//!
//! ConfigMaps and Secrets come from per-pod registrations (upstream's configmap/secret managers:
//! a pod's references are registered before any of its volumes is mounted, and released when
//! the pod is gone, not at TearDown); PersistentVolumeClaims and PersistentVolumes are plain
//! reads; projected service account tokens come from the TokenRequest API through a cache
//! that follows upstream's token manager. `rustlet-api` implements it over a cluster and over
//! the local store; [`crate::testing::FakeVolumeObjects`] is the test double.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rustlet_core::PodUid;
use rustlet_core::refs::ObjectKind;
use tokio::sync::broadcast;

/// Upstream's ceiling on a cached token's age before it is requested again.
pub const MAX_TOKEN_AGE: SignedDuration = SignedDuration::from_hours(24);

/// What a projected `serviceAccountToken` source asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenRequestKey {
    /// The pod's namespace (the service account's namespace).
    pub namespace: String,
    /// The service account's name.
    pub service_account: String,
    /// The audiences (empty: the API server's default).
    pub audiences: Vec<String>,
    /// `expirationSeconds` (projected volumes default to 3607).
    pub expiration_seconds: i64,
    /// The pod the token is bound to.
    pub pod_name: String,
    /// The bound pod's UID.
    pub pod_uid: String,
}

/// A token and when it stops being valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccountToken {
    /// The bearer token.
    pub token: String,
    /// `status.expirationTimestamp`.
    pub expires_at: Timestamp,
    /// When it was obtained (by this node's clock).
    pub issued_at: Timestamp,
}

impl ServiceAccountToken {
    /// Upstream `requiresRefresh`: less than 20% of the lifetime left, or older than 24 hours.
    pub fn requires_refresh(&self, now: Timestamp) -> bool {
        let lifetime = self.expires_at.duration_since(self.issued_at);
        let refresh_at = self.expires_at - lifetime / 5;
        now >= refresh_at || now >= self.issued_at + MAX_TOKEN_AGE
    }
}

/// A ConfigMap or Secret that changed (created, modified or deleted) while registered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectChange {
    /// ConfigMap or Secret.
    pub kind: ObjectKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// Why a read failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchFailure {
    /// The object does not exist.
    #[error("not found")]
    NotFound,
    /// No registered pod references it (upstream: `object "<ns>"/"<name>" not registered`).
    #[error("not registered by any pod")]
    NotRegistered,
    /// Its cache did not sync in time (upstream: "failed to sync ... cache").
    #[error("cache not synced after {0:?}")]
    NotSynced(Duration),
    /// The API server refused.
    #[error("API error {code}: {message}")]
    Api {
        /// HTTP status code.
        code: u16,
        /// The server's message.
        message: String,
    },
    /// The request did not get an answer.
    #[error("transport: {0}")]
    Transport(String),
    /// The answer lacked a field it must have.
    #[error("response has no {0}")]
    Incomplete(&'static str),
    /// This source cannot provide it (for example, tokens in local mode).
    #[error("{0}")]
    Unsupported(&'static str),
}

impl FetchFailure {
    /// Whether trying again later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::NotSynced(_) | Self::Transport(_) | Self::NotRegistered => true,
            Self::Api { code, .. } => *code == 429 || *code >= 500,
            Self::NotFound | Self::Incomplete(_) | Self::Unsupported(_) => false,
        }
    }
}

/// A failed read, named by its operation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// Reading a ConfigMap failed.
    #[error("get configmap {namespace}/{name}: {reason}")]
    GetConfigMap {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why.
        reason: FetchFailure,
    },
    /// Reading a Secret failed.
    #[error("get secret {namespace}/{name}: {reason}")]
    GetSecret {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why.
        reason: FetchFailure,
    },
    /// Reading a PersistentVolumeClaim failed.
    #[error("get persistentvolumeclaim {namespace}/{name}: {reason}")]
    GetClaim {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why.
        reason: FetchFailure,
    },
    /// Reading a PersistentVolume failed.
    #[error("get persistentvolume {name}: {reason}")]
    GetVolume {
        /// Its name.
        name: String,
        /// Why.
        reason: FetchFailure,
    },
    /// Requesting a service account token failed.
    #[error("request token for serviceaccount {namespace}/{name}: {reason}")]
    RequestToken {
        /// The service account's namespace.
        namespace: String,
        /// The service account.
        name: String,
        /// Why.
        reason: FetchFailure,
    },
}

impl ObjectError {
    /// A failed read of the ConfigMap or Secret `(namespace, name)`.
    pub fn content(kind: ObjectKind, namespace: &str, name: &str, reason: FetchFailure) -> Self {
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        match kind {
            ObjectKind::ConfigMap => Self::GetConfigMap {
                namespace,
                name,
                reason,
            },
            ObjectKind::Secret => Self::GetSecret {
                namespace,
                name,
                reason,
            },
        }
    }

    /// A failed read of a claim.
    pub fn claim(namespace: &str, name: &str, reason: FetchFailure) -> Self {
        Self::GetClaim {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            reason,
        }
    }

    /// A failed read of a persistent volume.
    pub fn volume(name: &str, reason: FetchFailure) -> Self {
        Self::GetVolume {
            name: name.to_owned(),
            reason,
        }
    }

    /// A failed token request for `key`.
    pub fn token(key: &TokenRequestKey, reason: FetchFailure) -> Self {
        Self::RequestToken {
            namespace: key.namespace.clone(),
            name: key.service_account.clone(),
            reason,
        }
    }

    /// Why it failed.
    pub fn reason(&self) -> &FetchFailure {
        match self {
            Self::GetConfigMap { reason, .. }
            | Self::GetSecret { reason, .. }
            | Self::GetClaim { reason, .. }
            | Self::GetVolume { reason, .. }
            | Self::RequestToken { reason, .. } => reason,
        }
    }

    /// The object does not exist (an `optional` source then counts as empty).
    pub fn is_not_found(&self) -> bool {
        *self.reason() == FetchFailure::NotFound
    }

    /// Whether trying again later can succeed.
    pub fn is_retryable(&self) -> bool {
        self.reason().is_retryable()
    }
}

/// The API objects volume plugins read.
#[async_trait]
pub trait VolumeObjects: Send + Sync {
    /// Register `pod`'s ConfigMap and Secret references (again after a spec change: new ones
    /// are added before old ones are dropped). Called before any of its volumes is mounted.
    fn register_pod(&self, pod: &Pod);

    /// Release `pod`'s references (when the pod is gone, not at TearDown).
    fn unregister_pod(&self, pod: &Pod);

    /// A ConfigMap a registered pod references.
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Arc<ConfigMap>, ObjectError>;

    /// A Secret a registered pod references.
    async fn secret(&self, namespace: &str, name: &str) -> Result<Arc<Secret>, ObjectError>;

    /// A PersistentVolumeClaim.
    async fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PersistentVolumeClaim, ObjectError>;

    /// A PersistentVolume.
    async fn persistent_volume(&self, name: &str) -> Result<PersistentVolume, ObjectError>;

    /// A token for `key`: the cached one while it is fresh
    /// ([`ServiceAccountToken::requires_refresh`]), else a new one.
    async fn service_account_token(
        &self,
        key: &TokenRequestKey,
    ) -> Result<ServiceAccountToken, ObjectError>;

    /// Forget the tokens bound to a pod that is gone (upstream `DeleteServiceAccountToken`).
    fn forget_tokens_of(&self, pod: &PodUid);

    /// Announcements of registered ConfigMaps and Secrets that changed.
    fn changes(&self) -> broadcast::Receiver<ObjectChange>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    #[test]
    fn a_token_is_refreshed_when_a_fifth_of_its_lifetime_is_left() {
        let token = ServiceAccountToken {
            token: "t".into(),
            issued_at: at(0),
            expires_at: at(3600),
        };
        assert!(!token.requires_refresh(at(2879)));
        assert!(token.requires_refresh(at(2880)));
    }

    #[test]
    fn a_long_lived_token_is_refreshed_after_a_day() {
        let token = ServiceAccountToken {
            token: "t".into(),
            issued_at: at(0),
            expires_at: at(10 * 86_400),
        };
        assert!(!token.requires_refresh(at(86_399)));
        assert!(token.requires_refresh(at(86_400)));
    }

    #[test]
    fn errors_name_the_operation_and_classify_the_reason() {
        let missing = ObjectError::content(ObjectKind::Secret, "ns", "s", FetchFailure::NotFound);
        assert_eq!(missing.to_string(), "get secret ns/s: not found");
        assert!(missing.is_not_found());
        assert!(!missing.is_retryable());
        let busy = ObjectError::claim(
            "ns",
            "c",
            FetchFailure::Api {
                code: 429,
                message: "slow down".into(),
            },
        );
        assert!(busy.is_retryable());
        assert!(!busy.is_not_found());
        let unsynced = ObjectError::content(
            ObjectKind::ConfigMap,
            "ns",
            "c",
            FetchFailure::NotSynced(Duration::from_secs(1)),
        );
        assert_eq!(
            unsynced.to_string(),
            "get configmap ns/c: cache not synced after 1s"
        );
        assert!(unsynced.is_retryable());
    }
}
