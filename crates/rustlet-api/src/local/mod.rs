//! Local mode: the seams over an in-process [`store::Store`] instead of an API server, loaded
//! from a directory of manifests ([`manifests`]).

pub mod admission;
pub mod events;
pub mod manifests;
pub mod pod_status;
pub mod store;
pub mod validation;
pub mod watch;

#[cfg(test)]
mod admission_table;

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use rustlet_status::{ClientError, PodStatusClient};
use serde_json::Value;

use store::{DeleteOptions, Kind, ObjectRef, Preconditions, Store, StoreError};

/// A store refusal as the API client error the managers handle.
pub fn client_error(err: StoreError) -> ClientError {
    match err {
        StoreError::NotFound(_) => ClientError::NotFound(err.to_string()),
        StoreError::AlreadyExists(_) | StoreError::Conflict { .. } => {
            ClientError::Conflict(err.to_string())
        }
        other => ClientError::Api {
            code: other.code(),
            message: other.to_string(),
        },
    }
}

/// A stored pod that does not decode as one: the store's fault, a 500.
fn decode_failed(e: serde_json::Error) -> ClientError {
    ClientError::Api {
        code: 500,
        message: format!("decode pod: {e}"),
    }
}

/// The status manager's `PodStatusClient` over the local store.
#[derive(Clone, Debug)]
pub struct LocalPodStatusClient {
    store: Arc<Store>,
}

impl LocalPodStatusClient {
    /// A client of `store`.
    pub fn new(store: Arc<Store>) -> Self {
        Self { store }
    }
}

#[async_trait]
impl PodStatusClient for LocalPodStatusClient {
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ClientError> {
        let object = self
            .store
            .get(&ObjectRef::new(Kind::Pod, namespace, name))
            .map_err(client_error)?;
        serde_json::from_value(object).map_err(decode_failed)
    }

    async fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Pod, ClientError> {
        let stored = self
            .store
            .patch_status_shared(&ObjectRef::new(Kind::Pod, namespace, name), patch)
            .map_err(client_error)?;
        // Straight from the text: the status manager reads this pod and lets it go, so the
        // exact list sizes a `Value` tree gives (`StoredObject::decode`) buy nothing here.
        serde_json::from_str(stored.json()).map_err(decode_failed)
    }

    async fn delete_pod(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ClientError> {
        let options = DeleteOptions {
            grace_period_seconds: Some(0),
            preconditions: Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            },
        };
        self.store
            .delete(&ObjectRef::new(Kind::Pod, namespace, name), &options)
            .map(drop)
            .map_err(client_error)
    }
}

#[cfg(test)]
mod tests;
