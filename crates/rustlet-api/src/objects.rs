//! The volume manager's objects seam (`rustlet_volume::objects::VolumeObjects`) over a
//! [`Backend`]: the ConfigMaps and Secrets registered pods reference (from
//! [`crate::content::ObjectSource`]s, announcing changes on one channel), PersistentVolumeClaim
//! and PersistentVolume reads, and service account tokens from the TokenRequest API.
//!
//! Tokens are cached per request (namespace, service account, audiences, expiration, bound pod)
//! and requested again by upstream's token manager rule
//! (`rustlet_volume::objects::ServiceAccountToken::requires_refresh`, with a fresh jitter of
//! up to ten seconds per check); a failed refresh serves the cached token until it expires,
//! and each new token drops the expired ones. The local store issues
//! no tokens: in local mode a projected `serviceAccountToken` fails with a clear error, as it
//! does on a standalone kubelet.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use k8s_openapi::jiff::SignedDuration;
use kube::api::{Api, PostParams};
use rustlet_core::PodUid;
use rustlet_status::{ClientError, Clock, SystemClock};
use rustlet_volume::objects::{
    FetchFailure, MAX_REFRESH_JITTER, ObjectChange, ObjectError, ServiceAccountToken,
    TokenRequestKey, VolumeObjects,
};
use tokio::sync::broadcast;

use crate::backend::Backend;
use crate::content::{ConfigMapSource, ObjectSource, ObjectSourceConfig, SecretSource};
use crate::kube_status::client_error;

/// An API client error as the objects seam's reason.
pub fn fetch_failure(err: ClientError) -> FetchFailure {
    match err {
        ClientError::NotFound(_) => FetchFailure::NotFound,
        ClientError::Conflict(message) => FetchFailure::Api { code: 409, message },
        ClientError::Api { code, message } => FetchFailure::Api { code, message },
        ClientError::Transport(message) => FetchFailure::Transport(message),
    }
}

/// The objects seam over one backend.
pub struct ApiObjects {
    backend: Backend,
    config_maps: ConfigMapSource,
    secrets: SecretSource,
    changes: broadcast::Sender<ObjectChange>,
    clock: Arc<dyn Clock>,
    tokens: Mutex<HashMap<TokenRequestKey, ServiceAccountToken>>,
}

impl std::fmt::Debug for ApiObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiObjects")
            .field("backend", &self.backend)
            .field("config_maps", &self.config_maps)
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

impl ApiObjects {
    /// Objects from `backend`, with the system clock for token expiry.
    pub fn new(backend: Backend, config: ObjectSourceConfig) -> Self {
        Self::with_clock(backend, config, Arc::new(SystemClock))
    }

    /// Objects from `backend`, with `clock` deciding when a cached token is stale.
    pub fn with_clock(backend: Backend, config: ObjectSourceConfig, clock: Arc<dyn Clock>) -> Self {
        let changes = broadcast::channel(256).0;
        Self {
            config_maps: ObjectSource::announcing_on(
                backend.clone(),
                config.clone(),
                changes.clone(),
            ),
            secrets: ObjectSource::announcing_on(backend.clone(), config, changes.clone()),
            backend,
            changes,
            clock,
            tokens: Mutex::default(),
        }
    }

    /// The ConfigMap source (what is watched).
    pub fn config_maps(&self) -> &ConfigMapSource {
        &self.config_maps
    }

    /// The Secret source (what is watched).
    pub fn secrets(&self) -> &SecretSource {
        &self.secrets
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, HashMap<TokenRequestKey, ServiceAccountToken>> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// POST `/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token`, bound to the pod.
    async fn request_token(
        &self,
        client: &kube::Client,
        key: &TokenRequestKey,
    ) -> Result<ServiceAccountToken, FetchFailure> {
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
        let answer = Api::<ServiceAccount>::namespaced(client.clone(), &key.namespace)
            .create_token_request(&key.service_account, &PostParams::default(), &request)
            .await
            .map_err(|e| fetch_failure(client_error(e)))?;
        // The lifetime the server issued it for (it may shorten what was asked).
        let lifetime = answer
            .spec
            .and_then(|spec| spec.expiration_seconds)
            .unwrap_or(key.expiration_seconds);
        let status = answer.status.ok_or(FetchFailure::Incomplete("status"))?;
        let token = status
            .token
            .ok_or(FetchFailure::Incomplete("status.token"))?;
        let expires_at = status
            .expiration_timestamp
            .ok_or(FetchFailure::Incomplete("status.expirationTimestamp"))?
            .0;
        Ok(ServiceAccountToken {
            token,
            expires_at,
            lifetime: SignedDuration::from_secs(lifetime),
        })
    }
}

#[async_trait]
impl VolumeObjects for ApiObjects {
    fn register_pod(&self, pod: &Pod) {
        self.config_maps.register_pod(pod);
        self.secrets.register_pod(pod);
    }

    fn unregister_pod(&self, pod: &Pod) {
        self.config_maps.unregister_pod(pod);
        self.secrets.unregister_pod(pod);
    }

    async fn config_map(&self, namespace: &str, name: &str) -> Result<Arc<ConfigMap>, ObjectError> {
        self.config_maps.get(namespace, name).await
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Arc<Secret>, ObjectError> {
        self.secrets.get(namespace, name).await
    }

    /// GET `/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}`.
    async fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PersistentVolumeClaim, ObjectError> {
        self.backend
            .get(Some(namespace), name)
            .await
            .map_err(|e| ObjectError::claim(namespace, name, fetch_failure(e)))
    }

    /// GET `/api/v1/persistentvolumes/{name}`.
    async fn persistent_volume(&self, name: &str) -> Result<PersistentVolume, ObjectError> {
        self.backend
            .get(None, name)
            .await
            .map_err(|e| ObjectError::volume(name, fetch_failure(e)))
    }

    async fn service_account_token(
        &self,
        key: &TokenRequestKey,
    ) -> Result<ServiceAccountToken, ObjectError> {
        let now = self.clock.now();
        // Upstream draws a jitter of whole seconds below ten for each check.
        let jitter = SignedDuration::from_secs(fastrand::i64(0..MAX_REFRESH_JITTER.as_secs()));
        let cached = match self.tokens().get(key).cloned() {
            Some(cached) if !cached.requires_refresh(now, jitter) => return Ok(cached),
            cached => cached,
        };
        let Backend::Cluster(client) = &self.backend else {
            return Err(ObjectError::token(
                key,
                FetchFailure::Unsupported(
                    "local mode has no token issuer (a projected serviceAccountToken needs a \
                     cluster)",
                ),
            ));
        };
        match self.request_token(client, key).await {
            Ok(token) => {
                let mut tokens = self.tokens();
                // Upstream's token manager drops expired tokens every minute; here each new
                // token does, so a pod's old requests do not stay behind.
                tokens.retain(|_, held| !held.expired(now));
                tokens.insert(key.clone(), token.clone());
                Ok(token)
            }
            // Upstream: a failed refresh keeps serving the old token until it expires.
            Err(reason) => match cached {
                Some(cached) if !cached.expired(self.clock.now()) => {
                    tracing::error!(
                        namespace = %key.namespace,
                        service_account = %key.service_account,
                        pod = %key.pod_name,
                        error = %reason,
                        "couldn't refresh a service account token; the old one is served until \
                         it expires"
                    );
                    Ok(cached)
                }
                _ => Err(ObjectError::token(key, reason)),
            },
        }
    }

    fn forget_tokens_of(&self, pod: &PodUid) {
        self.tokens().retain(|k, _| k.pod_uid != pod.as_str());
    }

    fn changes(&self) -> broadcast::Receiver<ObjectChange> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests;
