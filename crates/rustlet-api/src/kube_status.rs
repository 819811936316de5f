//! The status manager's API client over kube-rs (fills `rustlet_status::PodStatusClient`).

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use rustlet_status::{ClientError, PodStatusClient};
use serde_json::Value;

/// `PodStatusClient` over a `kube::Client`.
#[derive(Clone)]
pub struct KubePodStatusClient {
    client: kube::Client,
}

impl KubePodStatusClient {
    /// An adapter over this client (its rate limits and credentials apply).
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

/// Maps a kube error onto the status manager's classification.
pub fn client_error(err: kube::Error) -> ClientError {
    match err {
        kube::Error::Api(status) => match status.code {
            404 => ClientError::NotFound(status.message),
            409 => ClientError::Conflict(status.message),
            code => ClientError::Api {
                code,
                message: status.message,
            },
        },
        other => ClientError::Transport(other.to_string()),
    }
}

#[async_trait]
impl PodStatusClient for KubePodStatusClient {
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ClientError> {
        self.pods(namespace).get(name).await.map_err(client_error)
    }

    async fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Pod, ClientError> {
        self.pods(namespace)
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .map_err(client_error)
    }

    async fn delete_pod(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ClientError> {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.pods(namespace)
            .delete(name, &params)
            .await
            .map(drop)
            .map_err(client_error)
    }
}

#[cfg(test)]
mod tests;
