//! Single objects the volume plugins read on demand: PersistentVolumeClaims, PersistentVolumes,
//! and service account tokens from the TokenRequest API for projected volumes.
//!
//! Tokens are cached per request (namespace, service account, audiences, expiration, bound pod)
//! and requested again by upstream's token manager rule: when less than 20% of the token's
//! lifetime is left, or when it is older than 24 hours.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, ServiceAccount};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use rustlet_status::{ClientError, Clock, SystemClock};

use crate::kube_status::client_error;

/// Upstream's ceiling on a cached token's age before it is requested again.
const MAX_TOKEN_AGE: SignedDuration = SignedDuration::from_hours(24);

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

/// Errors of the object getters and the token request.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// GET of a PersistentVolumeClaim failed.
    #[error("get persistentvolumeclaim {namespace}/{name}: {source}")]
    GetClaim {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The API error.
        source: ClientError,
    },
    /// GET of a PersistentVolume failed.
    #[error("get persistentvolume {name}: {source}")]
    GetVolume {
        /// Its name.
        name: String,
        /// The API error.
        source: ClientError,
    },
    /// POST of a TokenRequest failed.
    #[error("request token for serviceaccount {namespace}/{name}: {source}")]
    RequestToken {
        /// The service account's namespace.
        namespace: String,
        /// The service account.
        name: String,
        /// The API error.
        source: ClientError,
    },
    /// The API server answered a TokenRequest without a token or an expiration.
    #[error("token for serviceaccount {namespace}/{name}: response has no {missing}")]
    IncompleteToken {
        /// The service account's namespace.
        namespace: String,
        /// The service account.
        name: String,
        /// Which field was missing.
        missing: &'static str,
    },
}

impl ObjectError {
    /// The object (or service account) does not exist.
    pub fn is_not_found(&self) -> bool {
        match self {
            Self::GetClaim { source, .. }
            | Self::GetVolume { source, .. }
            | Self::RequestToken { source, .. } => matches!(source, ClientError::NotFound(_)),
            Self::IncompleteToken { .. } => false,
        }
    }
}

/// PV/PVC getters and the TokenRequest client, over one `kube::Client`.
#[derive(Clone)]
pub struct KubeObjects {
    client: kube::Client,
    clock: Arc<dyn Clock>,
    tokens: Arc<Mutex<HashMap<TokenRequestKey, ServiceAccountToken>>>,
}

impl std::fmt::Debug for KubeObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeObjects").finish_non_exhaustive()
    }
}

impl KubeObjects {
    /// Getters over `client`, with the system clock for token expiry.
    pub fn new(client: kube::Client) -> Self {
        Self::with_clock(client, Arc::new(SystemClock))
    }

    /// Getters over `client` with `clock` deciding when a cached token is stale.
    pub fn with_clock(client: kube::Client, clock: Arc<dyn Clock>) -> Self {
        Self {
            client,
            clock,
            tokens: Arc::default(),
        }
    }

    /// GET `/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}`.
    pub async fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PersistentVolumeClaim, ObjectError> {
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
            .map_err(|e| ObjectError::GetClaim {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                source: client_error(e),
            })
    }

    /// GET `/api/v1/persistentvolumes/{name}`.
    pub async fn persistent_volume(&self, name: &str) -> Result<PersistentVolume, ObjectError> {
        Api::<PersistentVolume>::all(self.client.clone())
            .get(name)
            .await
            .map_err(|e| ObjectError::GetVolume {
                name: name.to_owned(),
                source: client_error(e),
            })
    }

    /// A token for `key`: the cached one while it is fresh, else a new one from
    /// POST `/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token`, bound to the pod.
    pub async fn service_account_token(
        &self,
        key: &TokenRequestKey,
    ) -> Result<ServiceAccountToken, ObjectError> {
        let now = self.clock.now();
        if let Some(cached) = self.tokens.lock().expect("token cache").get(key)
            && !cached.requires_refresh(now)
        {
            return Ok(cached.clone());
        }
        let request = TokenRequest {
            metadata: Default::default(),
            spec: Some(TokenRequestSpec {
                audiences: Some(key.audiences.clone()),
                expiration_seconds: Some(key.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(key.pod_name.clone()),
                    uid: Some(key.pod_uid.clone()),
                }),
                ..Default::default()
            }),
            status: None,
        };
        let err = |source| ObjectError::RequestToken {
            namespace: key.namespace.clone(),
            name: key.service_account.clone(),
            source,
        };
        let incomplete = |missing| ObjectError::IncompleteToken {
            namespace: key.namespace.clone(),
            name: key.service_account.clone(),
            missing,
        };
        let answer = Api::<ServiceAccount>::namespaced(self.client.clone(), &key.namespace)
            .create_token_request(&key.service_account, &PostParams::default(), &request)
            .await
            .map_err(|e| err(client_error(e)))?;
        let status = answer.status.ok_or_else(|| incomplete("status"))?;
        let token = status.token.ok_or_else(|| incomplete("status.token"))?;
        let expires_at = status
            .expiration_timestamp
            .ok_or_else(|| incomplete("status.expirationTimestamp"))?
            .0;
        let token = ServiceAccountToken {
            token,
            expires_at,
            issued_at: now,
        };
        self.tokens
            .lock()
            .expect("token cache")
            .insert(key.clone(), token.clone());
        Ok(token)
    }

    /// Forget the tokens bound to a pod that is gone (upstream `DeleteServiceAccountToken`).
    pub fn forget_tokens_of(&self, pod_uid: &str) {
        self.tokens
            .lock()
            .expect("token cache")
            .retain(|k, _| k.pod_uid != pod_uid);
    }
}

#[cfg(test)]
mod tests;
