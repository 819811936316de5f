//! Local mode: the seams over an in-process [`store::Store`] instead of an API server, loaded
//! from a directory of manifests ([`manifests`]).

pub mod manifests;
pub mod store;

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use rustlet_status::{ClientError, PodStatusClient};
use serde_json::Value;

use kube::runtime::watcher;
use store::{
    DeleteOptions, EventType, FieldSelector, Kind, ObjectRef, Preconditions, Selection, Store,
    StoreError,
};
use tracing::warn;

use crate::pod_cache::PodCache;

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

fn decode_pod(object: Value) -> Result<Pod, ClientError> {
    serde_json::from_value(object).map_err(|e| ClientError::Api {
        code: 500,
        message: format!("decode pod: {e}"),
    })
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
        decode_pod(object)
    }

    async fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Pod, ClientError> {
        let object = self
            .store
            .patch_status(&ObjectRef::new(Kind::Pod, namespace, name), patch)
            .map_err(client_error)?;
        decode_pod(object)
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

/// Feed `cache` from the store's pods bound to `node_name`, as the pod watch does against an
/// API server: a list (replacing the cache's view), then every change; a watch that falls too
/// far behind lists again. Runs until the store is dropped.
pub async fn feed_pod_cache(store: Arc<Store>, cache: Arc<PodCache>, node_name: &str) {
    let selection = Selection {
        kind: Kind::Pod,
        namespace: None,
        fields: FieldSelector(vec![("spec.nodeName".into(), true, node_name.to_owned())]),
    };
    loop {
        let (items, resource_version) = store.list(&selection);
        let Ok(mut watch) = store.watch(selection.clone(), resource_version) else {
            continue;
        };
        cache.apply(watcher::Event::Init);
        for item in items {
            match serde_json::from_value::<Pod>(item) {
                Ok(pod) => cache.apply(watcher::Event::InitApply(pod)),
                Err(err) => warn!("local pod does not decode: {err}"),
            }
        }
        cache.apply(watcher::Event::InitDone);
        while let Ok(event) = watch.next().await {
            let pod = match serde_json::from_value::<Pod>(event.object.clone()) {
                Ok(pod) => pod,
                Err(err) => {
                    warn!("local pod does not decode: {err}");
                    continue;
                }
            };
            match event.type_ {
                EventType::Added | EventType::Modified => cache.apply(watcher::Event::Apply(pod)),
                EventType::Deleted => cache.apply(watcher::Event::Delete(pod)),
            }
        }
    }
}

#[cfg(test)]
mod tests;
