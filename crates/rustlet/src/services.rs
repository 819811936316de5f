//! The Services of the containers' environment in cluster mode (upstream: the kubelet's
//! service lister, an informer over every Service): a watch of all Services into a map, which
//! the CRI runtime reads through `rustlet_cri::ServiceSource`. The Node authorizer lets a node
//! list and watch Services (`NodeRules`). Local mode has none (upstream: a kubelet without an
//! API server sets no Service variables).
//!
//! Deviation: an API server that does not serve Services at all (404 on the list; the in-tree
//! test server) counts as listed and empty, so that pods still start; upstream's kubelet would
//! wait for a list that never succeeds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Services by namespace and name.
type ServiceMap = HashMap<(String, String), Arc<Service>>;

/// Every Service by namespace and name; `None` until the first list completed.
#[derive(Debug, Default)]
pub struct ApiServices {
    listed: Mutex<Option<ServiceMap>>,
}

fn key(service: &Service) -> (String, String) {
    (
        service.metadata.namespace.clone().unwrap_or_default(),
        service.metadata.name.clone().unwrap_or_default(),
    )
}

impl ApiServices {
    /// Watches every Service until `cancel`: a list, then changes; after an error a new list
    /// (the watcher backs off).
    pub async fn run(self: Arc<Self>, client: kube::Client, cancel: CancellationToken) {
        let mut events = watcher(Api::<Service>::all(client), watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut building = HashMap::new();
        loop {
            let event = tokio::select! {
                () = cancel.cancelled() => return,
                event = events.next() => event,
            };
            let Some(event) = event else { return };
            match event {
                Ok(watcher::Event::Init) => building.clear(),
                Ok(watcher::Event::InitApply(service)) => {
                    building.insert(key(&service), Arc::new(service));
                }
                Ok(watcher::Event::InitDone) => {
                    *self.lock() = Some(std::mem::take(&mut building));
                }
                Ok(watcher::Event::Apply(service)) => {
                    self.lock()
                        .get_or_insert_with(HashMap::new)
                        .insert(key(&service), Arc::new(service));
                }
                Ok(watcher::Event::Delete(service)) => {
                    if let Some(map) = self.lock().as_mut() {
                        map.remove(&key(&service));
                    }
                }
                Err(watcher::Error::InitialListFailed(kube::Error::Api(status)))
                    if status.code == 404 =>
                {
                    let mut listed = self.lock();
                    if listed.is_none() {
                        info!(
                            "the API server serves no Services: containers get no Service variables"
                        );
                        *listed = Some(HashMap::new());
                    }
                }
                Err(e) => warn!(error = %e, "watching Services"),
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<ServiceMap>> {
        self.listed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl rustlet_cri::ServiceSource for ApiServices {
    fn services(&self) -> Option<Vec<Arc<Service>>> {
        self.lock()
            .as_ref()
            .map(|map| map.values().cloned().collect())
    }
}
