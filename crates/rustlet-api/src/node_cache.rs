//! This node's status from a watch of the Node object: the volume manager's `NodeStatus` seam
//! (`status.volumesAttached`), with a change signal (wire it to
//! `VolumeManager::node_status_updated`).

use std::sync::RwLock;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use rustlet_core::UniqueVolumeName;
use rustlet_volume::node::{AttachedToNode, NodeStatus};
use tokio::sync::watch;
use tracing::warn;

use crate::backend::Backend;

/// The last seen copy of this node.
#[derive(Debug)]
pub struct NodeCache {
    node: RwLock<Option<Node>>,
    changed: watch::Sender<u64>,
}

impl Default for NodeCache {
    fn default() -> Self {
        Self {
            node: RwLock::new(None),
            changed: watch::channel(0).0,
        }
    }
}

impl NodeCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// A receiver that sees a new value after every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The last seen copy of the Node (`None` before the watch delivered it, or after a
    /// delete).
    pub fn node(&self) -> Option<Node> {
        self.node.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Applies one watcher event.
    pub fn apply(&self, event: watcher::Event<Node>) {
        let mut node = self.node.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(n) | watcher::Event::InitApply(n) => *node = Some(n),
            watcher::Event::Delete(_) => *node = None,
            watcher::Event::Init | watcher::Event::InitDone => return,
        }
        drop(node);
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Watches the Node named `node_name` until the stream ends.
    pub async fn run(&self, backend: &Backend, node_name: &str) {
        let mut stream = backend.watch::<Node>(None, &format!("metadata.name={node_name}"));
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => self.apply(event),
                Err(err) => warn!("node watch: {err}"),
            }
        }
    }
}

impl NodeStatus for NodeCache {
    fn volumes_attached(&self) -> Vec<AttachedToNode> {
        let node = self.node.read().unwrap_or_else(|e| e.into_inner());
        node.iter()
            .filter_map(|n| n.status.as_ref()?.volumes_attached.as_ref())
            .flatten()
            .map(|v| AttachedToNode {
                name: UniqueVolumeName::new(v.name.clone()),
                device_path: v.device_path.clone(),
            })
            .collect()
    }

    fn observed_volumes_attached(&self) -> Option<Vec<AttachedToNode>> {
        if self
            .node
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
        {
            return None;
        }
        Some(self.volumes_attached())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{AttachedVolume, NodeStatus as K8sNodeStatus};

    #[test]
    fn volumes_attached_come_from_the_node_status() {
        let cache = NodeCache::new();
        assert!(cache.volumes_attached().is_empty());
        assert_eq!(
            cache.observed_volumes_attached(),
            None,
            "not read yet (V74)"
        );
        let node = Node {
            status: Some(K8sNodeStatus {
                volumes_attached: Some(vec![AttachedVolume {
                    name: "kubernetes.io/csi/d^v1".into(),
                    device_path: "/dev/xvdb".into(),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let changes = cache.subscribe();
        cache.apply(watcher::Event::Apply(node.clone()));
        assert!(changes.has_changed().unwrap());
        assert_eq!(
            cache.volumes_attached(),
            [AttachedToNode {
                name: UniqueVolumeName::new("kubernetes.io/csi/d^v1"),
                device_path: "/dev/xvdb".into()
            }]
        );
        assert_eq!(cache.observed_volumes_attached().map(|v| v.len()), Some(1));
        cache.apply(watcher::Event::Delete(node));
        assert!(cache.volumes_attached().is_empty());
        assert_eq!(cache.observed_volumes_attached(), None);
    }

    #[tokio::test]
    async fn the_watch_is_of_this_node_by_name_and_resumes_from_the_list() {
        use futures::pin_mut;
        use http::{Method, Request, Response};
        use kube::client::Body;

        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let cache = std::sync::Arc::new(NodeCache::new());
        let runner = {
            let cache = cache.clone();
            tokio::spawn(async move { cache.run(&Backend::Cluster(client), "node-a").await })
        };
        pin_mut!(handle);
        let (req, send) = handle.next_request().await.unwrap();
        assert_eq!(req.method(), Method::GET);
        let uri = req.uri().to_string();
        assert!(uri.starts_with("/api/v1/nodes?"), "{uri}");
        assert!(
            uri.contains("fieldSelector=metadata.name%3Dnode-a"),
            "{uri}"
        );
        let list = serde_json::json!({"apiVersion":"v1","kind":"NodeList",
            "metadata":{"resourceVersion":"7"},
            "items":[{"metadata":{"name":"node-a","resourceVersion":"6"},
                "status":{"volumesAttached":[{"name":"kubernetes.io/csi/d^v","devicePath":""}]}}]});
        send.send_response(Response::new(Body::from(
            serde_json::to_vec(&list).unwrap(),
        )));
        let (req, _send) = handle.next_request().await.unwrap();
        let uri = req.uri().to_string();
        assert!(
            uri.contains("watch=true")
                && uri.contains("fieldSelector=metadata.name%3Dnode-a")
                && uri.contains("resourceVersion=7"),
            "{uri}"
        );
        assert_eq!(cache.volumes_attached().len(), 1);
        runner.abort();
    }
}
