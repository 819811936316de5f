//! This node in the API, as a kubelet keeps it: the Node object registered when absent
//! (capacity from the host, `pods: 110`, addresses, a Ready condition, posted again when the
//! node lifecycle controller has turned it Unknown), `status.volumesInUse`
//! written from the volume manager, and the `coordination.k8s.io/v1` Lease in `kube-node-lease`
//! renewed every 10 s.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, GetParams, Patch, PatchParams, PostParams};
use rustlet_status::{ClientError, Clock, SystemClock};
use rustlet_volume::node::{VolumesInUseWriter, WriteError};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::kube_status::client_error;

/// The namespace of node leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// What the node looks like.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeConfig {
    /// `metadata.name`.
    pub name: String,
    /// `status.capacity.pods` (kubelet default 110).
    pub max_pods: i64,
    /// `status.addresses`.
    pub addresses: Vec<NodeAddress>,
    /// CPUs to report (default: the host's).
    pub cpus: i64,
    /// Memory to report, in bytes (default: the host's `MemTotal`).
    pub memory_bytes: u64,
    /// `spec.leaseDurationSeconds` of the Lease (kubelet default 40).
    pub lease_duration_seconds: i32,
    /// How often the Lease is renewed (kubelet default 10 s).
    pub renew_interval: Duration,
}

/// This host's memory (`MemTotal`), 0 when unknown.
pub fn host_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}

impl NodeConfig {
    /// Kubelet defaults for a node named `name`, capacity read from this host.
    pub fn for_host(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            addresses: vec![NodeAddress {
                type_: "Hostname".into(),
                address: name.clone(),
            }],
            name,
            max_pods: 110,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as i64),
            memory_bytes: host_memory_bytes(),
            lease_duration_seconds: 40,
            renew_interval: Duration::from_secs(10),
        }
    }

    /// The Node object to create.
    pub fn node(&self, now: Timestamp) -> Node {
        let capacity: BTreeMap<String, Quantity> = [
            ("cpu".to_owned(), Quantity(self.cpus.to_string())),
            (
                "memory".to_owned(),
                Quantity(format!("{}Ki", self.memory_bytes / 1024)),
            ),
            ("pods".to_owned(), Quantity(self.max_pods.to_string())),
        ]
        .into();
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(rustlet_core::node::well_known_labels(&self.name)),
                ..Default::default()
            },
            status: Some(NodeStatus {
                allocatable: Some(capacity.clone()),
                capacity: Some(capacity),
                addresses: Some(self.addresses.clone()),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    reason: Some("KubeletReady".into()),
                    message: Some("kubelet is posting ready status".into()),
                    last_heartbeat_time: Some(Time(now)),
                    last_transition_time: Some(Time(now)),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// Keeps this node registered, its lease fresh and its `volumesInUse` current.
pub struct NodeRegistrar {
    nodes: Api<Node>,
    leases: Api<Lease>,
    config: NodeConfig,
    clock: Box<dyn Clock>,
}

impl NodeRegistrar {
    /// A registrar over this client: the agent's heartbeat client
    /// ([`crate::client::ApiClients::heartbeat`], no rate limit), so the Lease and the node
    /// status never wait behind events or pod status writes. Deviation: upstream registers the
    /// Node through its main client; here registration shares the heartbeat client too (one
    /// registrar, and registration is rare).
    pub fn new(client: kube::Client, config: NodeConfig) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client, NODE_LEASE_NAMESPACE),
            config,
            clock: Box::new(SystemClock),
        }
    }

    /// Creates the Node when it is absent; returns the API's copy.
    pub async fn register(&self) -> Result<Node, ClientError> {
        match self.nodes.get(&self.config.name).await {
            Ok(node) => Ok(node),
            Err(kube::Error::Api(s)) if s.code == 404 => self
                .nodes
                .create(&PostParams::default(), &self.config.node(self.clock.now()))
                .await
                .map_err(client_error),
            Err(e) => Err(client_error(e)),
        }
    }

    /// Writes `status.volumesInUse` (a merge patch of the status subresource).
    pub async fn set_volumes_in_use(&self, volumes: &[String]) -> Result<(), ClientError> {
        let patch = serde_json::json!({ "status": { "volumesInUse": volumes } });
        self.nodes
            .patch_status(
                &self.config.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map(drop)
            .map_err(client_error)
    }

    /// Posts the Ready condition again when the Node in the API (read from the API server's
    /// cache, as upstream's kubelet reads it every `nodeStatusUpdateFrequency`) has anything
    /// but Ready=True: the node lifecycle controller marks it Unknown after a gap in the
    /// heartbeats, and only the node turns it back (upstream: `tryUpdateNodeStatus` with the
    /// `ReadyCondition` setter). A JSON merge patch of all the conditions read, the Ready one
    /// replaced, under the read resourceVersion (a concurrent write by the controller makes it
    /// a 409, tried again at the next renewal). Deviation, until the node status is written as
    /// upstream writes it: only the Ready condition is posted, and only when it is not True.
    /// Returns whether it posted.
    pub async fn post_ready_unless_ready(&self) -> Result<bool, ClientError> {
        let node = self
            .nodes
            .get_with(&self.config.name, &GetParams::any())
            .await
            .map_err(client_error)?;
        let mut conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
        if conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
        {
            return Ok(false);
        }
        let ready = self
            .config
            .node(self.clock.now())
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .expect("NodeConfig::node has a Ready condition");
        conditions.retain(|c| c.type_ != "Ready");
        conditions.insert(0, ready);
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": node.metadata.resource_version },
            "status": { "conditions": conditions },
        });
        self.nodes
            .patch_status(
                &self.config.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(client_error)?;
        Ok(true)
    }

    /// Creates the Lease (owned by the Node) or renews it with an update that carries its
    /// resourceVersion.
    pub async fn renew_lease(&self, node_uid: &str) -> Result<Lease, ClientError> {
        let now = MicroTime(self.clock.now());
        match self.leases.get(&self.config.name).await {
            Ok(mut lease) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                spec.renew_time = Some(now);
                spec.holder_identity = Some(self.config.name.clone());
                spec.lease_duration_seconds = Some(self.config.lease_duration_seconds);
                self.leases
                    .replace(&self.config.name, &PostParams::default(), &lease)
                    .await
                    .map_err(client_error)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(NODE_LEASE_NAMESPACE.into()),
                        owner_references: Some(vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: self.config.name.clone(),
                            uid: node_uid.to_owned(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.config.name.clone()),
                        lease_duration_seconds: Some(self.config.lease_duration_seconds),
                        renew_time: Some(now),
                        ..Default::default()
                    }),
                };
                self.leases
                    .create(&PostParams::default(), &lease)
                    .await
                    .map_err(client_error)
            }
            Err(e) => Err(client_error(e)),
        }
    }

    /// Registers, then renews the lease every `renew_interval` until `cancel` fires; before
    /// each renewal after the first, posts Ready again if the Node lost it.
    pub async fn run(&self, cancel: CancellationToken) {
        let mut node_uid = None;
        loop {
            if node_uid.is_none() {
                match self.register().await {
                    Ok(node) => node_uid = node.metadata.uid,
                    Err(e) => warn!("registering node {}: {e}", self.config.name),
                }
            } else if let Err(e) = self.post_ready_unless_ready().await {
                warn!(
                    "posting the Ready condition of node {}: {e}",
                    self.config.name
                );
            }
            if let Some(uid) = &node_uid
                && let Err(e) = self.renew_lease(uid).await
            {
                warn!("renewing lease of node {}: {e}", self.config.name);
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.config.renew_interval) => {}
            }
        }
    }
}

#[async_trait::async_trait]
impl VolumesInUseWriter for NodeRegistrar {
    async fn write_volumes_in_use(&self, volumes: &[String]) -> Result<(), WriteError> {
        Ok(self.set_volumes_in_use(volumes).await?)
    }
}

#[cfg(test)]
mod tests;
