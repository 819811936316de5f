//! Where the adapters read and watch: a cluster's API server through a `kube::Client`, or the
//! local store in the same process. The pod and node caches and the ConfigMap/Secret sources
//! consume one stream shape (kube-runtime's `watcher::Event`) from either, so their logic is
//! written once and local mode behaves as a cluster does.

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret,
};
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use rustlet_status::ClientError;
use serde::de::DeserializeOwned;

use crate::kube_status::client_error;
use crate::local::store::{FieldSelector, Kind, ObjectRef, Selection, Store, StoreError};

/// The API the adapters talk to.
#[derive(Clone)]
pub enum Backend {
    /// A cluster's API server (rate limits and credentials are the client's).
    Cluster(kube::Client),
    /// The local store (local mode).
    Local(Arc<Store>),
}

impl Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cluster(_) => f.write_str("Backend::Cluster"),
            Self::Local(_) => f.write_str("Backend::Local"),
        }
    }
}

/// An object type both backends serve.
pub trait Stored:
    kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    /// Its kind in the local store.
    const KIND: Kind;

    /// Its kube API in `namespace` (`None`: all namespaces, or a cluster-scoped type).
    fn api(client: kube::Client, namespace: Option<&str>) -> Api<Self>;
}

macro_rules! namespaced {
    ($($ty:ty => $kind:expr),* $(,)?) => {$(
        impl Stored for $ty {
            const KIND: Kind = $kind;
            fn api(client: kube::Client, namespace: Option<&str>) -> Api<Self> {
                match namespace {
                    Some(namespace) => Api::namespaced(client, namespace),
                    None => Api::all(client),
                }
            }
        }
    )*};
}

macro_rules! cluster_scoped {
    ($($ty:ty => $kind:expr),* $(,)?) => {$(
        impl Stored for $ty {
            const KIND: Kind = $kind;
            fn api(client: kube::Client, _namespace: Option<&str>) -> Api<Self> {
                Api::all(client)
            }
        }
    )*};
}

namespaced! {
    Pod => Kind::Pod,
    ConfigMap => Kind::ConfigMap,
    Secret => Kind::Secret,
    PersistentVolumeClaim => Kind::PersistentVolumeClaim,
}

cluster_scoped! {
    Node => Kind::Node,
    PersistentVolume => Kind::PersistentVolume,
}

/// A watch stream's error; the stream goes on (a cluster watch backs off and lists again, a
/// local watch that fell behind lists again).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// kube-runtime's watcher failed.
    #[error("watch: {0}")]
    Cluster(#[from] watcher::Error),
    /// The local store refused (a watch that fell too far behind is Gone).
    #[error("local watch: {0}")]
    Local(#[from] StoreError),
    /// A stored object does not decode as its type.
    #[error("decode {kind:?}: {message}")]
    Decode {
        /// Its kind.
        kind: Kind,
        /// The decoder's message.
        message: String,
    },
}

/// One item of a watch stream.
pub type WatchItem<K> = Result<watcher::Event<K>, WatchError>;

impl Backend {
    /// Watch `K` in `namespace` (`None`: all) whose fields match `fields` (`a.b=x,...`):
    /// a list (`Init`, `InitApply`..., `InitDone`), then changes; after an error, a new list.
    pub fn watch<K: Stored>(
        &self,
        namespace: Option<&str>,
        fields: &str,
    ) -> BoxStream<'static, WatchItem<K>> {
        match self {
            Self::Cluster(client) => {
                let config = watcher::Config::default().fields(fields);
                watcher(K::api(client.clone(), namespace), config)
                    .default_backoff()
                    .map(|item| item.map_err(WatchError::from))
                    .boxed()
            }
            Self::Local(store) => match FieldSelector::parse_for(K::KIND, fields) {
                Ok(fields) => crate::local::watch::events(
                    store.clone(),
                    Selection {
                        kind: K::KIND,
                        namespace: namespace.map(str::to_owned),
                        fields,
                    },
                )
                .boxed(),
                Err(err) => futures::stream::iter([Err(WatchError::Local(err))]).boxed(),
            },
        }
    }

    /// GET one `K`.
    pub async fn get<K: Stored>(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<K, ClientError> {
        match self {
            Self::Cluster(client) => K::api(client.clone(), namespace)
                .get(name)
                .await
                .map_err(client_error),
            Self::Local(store) => {
                let reference = ObjectRef::new(K::KIND, namespace.unwrap_or_default(), name);
                let object = store.get(&reference).map_err(crate::local::client_error)?;
                serde_json::from_value(object).map_err(|e| ClientError::Api {
                    code: 500,
                    message: format!("decode {reference}: {e}"),
                })
            }
        }
    }
}
