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

/// Upstream's bound on the random jitter that brings a token's refresh forward (`maxJitter`), so
/// the pods of a node do not all ask again in the same second.
pub const MAX_REFRESH_JITTER: SignedDuration = SignedDuration::from_secs(10);

/// A token and when it stops being valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccountToken {
    /// The bearer token.
    pub token: String,
    /// `status.expirationTimestamp` (whole seconds, by the API server's clock).
    pub expires_at: Timestamp,
    /// The answer's `spec.expirationSeconds`: the lifetime the token was issued for, so it was
    /// issued at `expires_at - lifetime` (upstream's `iat`).
    pub lifetime: SignedDuration,
}

impl ServiceAccountToken {
    /// When the token was issued, as upstream's token manager reckons it: its expiry less the
    /// lifetime it was issued for (not when this node received it).
    pub fn issued_at(&self) -> Timestamp {
        self.expires_at - self.lifetime
    }

    /// Whether the token has expired at `now`.
    pub fn expired(&self, now: Timestamp) -> bool {
        now > self.expires_at
    }

    /// Upstream `requiresRefresh`, `jitter` (at most [`MAX_REFRESH_JITTER`], drawn afresh for
    /// each check by the caller) bringing the first two forward: older than 24 hours, less than
    /// 20 % of the lifetime (in whole seconds) left, or issued after `now` (the node's clock
    /// went back).
    pub fn requires_refresh(&self, now: Timestamp, jitter: SignedDuration) -> bool {
        let issued = self.issued_at();
        let fifth = SignedDuration::from_secs(self.lifetime.as_secs() * 20 / 100);
        now > issued + MAX_TOKEN_AGE - jitter
            || now > self.expires_at - fifth - jitter
            || now < issued
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

    fn issued_for(lifetime: i64) -> ServiceAccountToken {
        ServiceAccountToken {
            token: "t".into(),
            expires_at: at(lifetime),
            lifetime: SignedDuration::from_secs(lifetime),
        }
    }

    #[test]
    fn a_token_is_refreshed_when_a_fifth_of_its_lifetime_is_left() {
        let token = issued_for(3600);
        assert_eq!(token.issued_at(), at(0));
        let none = SignedDuration::ZERO;
        assert!(!token.requires_refresh(at(2880), none));
        assert!(token.requires_refresh(at(2881), none));
        // The jitter brings it forward by up to ten seconds.
        assert!(!token.requires_refresh(at(2870), MAX_REFRESH_JITTER));
        assert!(token.requires_refresh(at(2871), MAX_REFRESH_JITTER));
        // A fifth of the lifetime in whole seconds, as upstream's integer arithmetic.
        let odd = issued_for(3607);
        assert!(!odd.requires_refresh(at(3607 - 721), none));
        assert!(odd.requires_refresh(at(3607 - 720), none));
    }

    #[test]
    fn a_long_lived_token_is_refreshed_after_a_day() {
        let token = issued_for(10 * 86_400);
        assert!(!token.requires_refresh(at(86_400), SignedDuration::ZERO));
        assert!(token.requires_refresh(at(86_401), SignedDuration::ZERO));
        assert!(token.requires_refresh(at(86_391), MAX_REFRESH_JITTER));
    }

    #[test]
    fn a_token_issued_after_now_is_refreshed_as_the_clock_went_back() {
        let token = issued_for(3600);
        assert!(token.requires_refresh(at(-1), SignedDuration::ZERO));
        assert!(!token.requires_refresh(at(0), SignedDuration::ZERO));
    }

    #[test]
    fn a_token_expires_after_its_expiration_timestamp() {
        let token = issued_for(600);
        assert!(!token.expired(at(600)));
        assert!(token.expired(at(601)));
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
