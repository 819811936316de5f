//! This node in the API, as a kubelet keeps it (upstream `kubelet_node_status.go`, the node
//! lease controller): the Node registered with the kubelet's labels, annotation and taints
//! (created, or reconciled when it exists, with upstream's back-off), its status computed every
//! `nodeStatusUpdateFrequency` by `rustlet_core::node_status`'s setters from the machine's
//! figures ([`machine::Machine`]) and the runtime's answers ([`NodeRuntime`]) and patched only
//! on a change or every `nodeStatusReportFrequency`, `status.volumesInUse` written from the
//! volume manager, and the `coordination.k8s.io/v1` Lease in `kube-node-lease` renewed every
//! 10 s.
//!
//! Every request is one `system:node:<name>` may make: its own Node by name (never a list),
//! `nodes/<name>/status`, its own Lease.

pub mod machine;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeRuntimeHandler, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, GetParams, Patch, PatchParams, PostParams};
use rustlet_core::node::{
    CONTROLLER_MANAGED_ATTACH_ANNOTATION, LABEL_ARCH, LABEL_OS, reconcile_attach_detach_annotation,
    reconcile_default_labels, registration_labels,
};
use rustlet_core::node_status::{
    DevicePluginResources, EvictionThresholds, NETWORK_READY, NETWORK_UNKNOWN, RUNTIME_READY,
    RuntimeCondition, StatusInputs, go_os_arch, node_status_has_changed, node_status_patch,
    pressure, reconcile_node_resources, runtime_errors, runtime_readiness, set_node_status,
};
use rustlet_status::{ClientError, Clock, SystemClock};
use rustlet_volume::node::{VolumesInUseWriter, WriteError};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::kube_status::client_error;
use crate::node_cache::NodeCache;
use machine::{HostMachine, Machine};

/// The namespace of node leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// `nodeInfo.kubeletVersion`: the Kubernetes release this agent speaks for, the one `tools/k8s`
/// pins for the real control plane (`k8s.io/kubernetes v1.37.2`), which is the release of the
/// workspace's `k8s-openapi` feature (`v1_37`; k8s-openapi names no patch release). A test
/// checks it against `tools/k8s/go.mod`.
pub const KUBELET_VERSION: &str = "v1.37.2";

/// How many times one status update is tried (upstream `nodeStatusUpdateRetry`).
pub const NODE_STATUS_UPDATE_RETRY: usize = 5;

/// The first registration back-off step and its cap (upstream `registerWithAPIServer`).
const REGISTER_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(7));

/// What the node looks like and how often it is reported.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeConfig {
    /// `metadata.name`.
    pub name: String,
    /// The `Hostname` address and the `kubernetes.io/hostname` label. Deviation: the node name
    /// (upstream: the OS hostname unless `--hostname-override`), so several agents on one
    /// machine are distinct nodes.
    pub hostname: String,
    /// The `InternalIP` address (`nodeIP` / `--node-ip`).
    pub node_ip: Option<String>,
    /// `--node-labels`, set at registration (checked by the binary against NodeRestriction).
    pub labels: BTreeMap<String, String>,
    /// `--register-with-taints`, set at registration (NodeRestriction forbids changing taints
    /// later).
    pub taints: Vec<Taint>,
    /// `status.capacity.pods` (`maxPods`, 110).
    pub max_pods: u32,
    /// `daemonEndpoints.kubeletEndpoint.port` (`port`, 10250).
    pub kubelet_port: i32,
    /// `spec.leaseDurationSeconds` of the Lease (`nodeLeaseDurationSeconds`, 40).
    pub lease_duration_seconds: i32,
    /// How often the Lease is renewed (upstream: a quarter of the lease duration, 10 s).
    pub renew_interval: Duration,
    /// How often the status is computed (`nodeStatusUpdateFrequency`, 10 s).
    pub status_update_frequency: Duration,
    /// How long an unchanged status goes unreported at most (`nodeStatusReportFrequency`,
    /// 5 min).
    pub status_report_frequency: Duration,
    /// The hard eviction thresholds: pressure conditions and the allocatable reservation.
    pub eviction: EvictionThresholds,
    /// How long a pressure condition stays after its signal was last seen
    /// (`evictionPressureTransitionPeriod`, 5 min).
    pub pressure_transition_period: Duration,
    /// How long without a successful runtime status before "container runtime is down"
    /// (upstream `maxWaitForContainerRuntime`, 30 s).
    pub runtime_sync_threshold: Duration,
}

/// This host's memory (`MemTotal`), 0 when unknown.
pub fn host_memory_bytes() -> u64 {
    HostMachine::new("/").figures().memory_bytes
}

impl NodeConfig {
    /// Kubelet defaults for a node named `name`.
    pub fn for_host(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            hostname: name.to_lowercase(),
            name,
            node_ip: None,
            labels: BTreeMap::new(),
            taints: Vec::new(),
            max_pods: 110,
            kubelet_port: 10250,
            lease_duration_seconds: 40,
            renew_interval: Duration::from_secs(10),
            status_update_frequency: Duration::from_secs(10),
            status_report_frequency: Duration::from_secs(5 * 60),
            eviction: EvictionThresholds::default(),
            pressure_transition_period: Duration::from_secs(5 * 60),
            runtime_sync_threshold: Duration::from_secs(30),
        }
    }
}

/// What the node status asks of the container runtime (upstream `containerRuntime.Type`,
/// `Version` and `Status`); the binary adapts `rustlet_pods::Runtime` to it.
#[async_trait::async_trait]
pub trait NodeRuntime: Send + Sync {
    /// The runtime's name (`containerd`), the scheme of `containerRuntimeVersion`.
    fn type_name(&self) -> String;
    /// Its version (CRI `Version`'s `runtime_version`).
    async fn version(&self) -> Result<String, String>;
    /// Its conditions (CRI `Status`: `RuntimeReady`, `NetworkReady`).
    async fn status(&self) -> Result<Vec<RuntimeCondition>, String>;
    /// Its handlers and their features, as its last `status` said. Default: none.
    fn runtime_handlers(&self) -> Vec<NodeRuntimeHandler> {
        Vec::new()
    }
}

/// The device plugins' resources for the node status (upstream's container manager's
/// `GetDevicePluginResourceCapacity`, the device manager's `GetCapacity`); the binary fills it
/// from `rustlet-cri`'s device manager. A call hands over the resources removed since the last
/// one: each is set to 0 once.
pub trait DevicePlugins: Send + Sync {
    /// The registered resources' capacity and allocatable, and those removed since.
    fn resources(&self) -> DevicePluginResources;
}

/// A runtime nobody asked: ready, version unknown (for a registrar without a runtime).
#[derive(Clone, Copy, Debug, Default)]
pub struct AssumedReadyRuntime;

#[async_trait::async_trait]
impl NodeRuntime for AssumedReadyRuntime {
    fn type_name(&self) -> String {
        "unknown".into()
    }

    async fn version(&self) -> Result<String, String> {
        Err("no runtime".into())
    }

    async fn status(&self) -> Result<Vec<RuntimeCondition>, String> {
        Ok(vec![
            RuntimeCondition::ready(RUNTIME_READY),
            RuntimeCondition::ready(NETWORK_READY),
        ])
    }
}

/// What one run of the status update did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusUpdate {
    /// Nothing changed and the report frequency has not passed: nothing sent.
    Unchanged,
    /// The status was patched.
    Patched,
}

/// The runtime's health as the status loop last saw it (upstream `runtimeState`).
#[derive(Debug)]
struct RuntimeState {
    last_sync: Option<Instant>,
    runtime_error: Option<String>,
    network_error: Option<String>,
}

/// What the status loop keeps between runs.
#[derive(Debug)]
struct LoopState {
    /// The last patch (upstream `lastStatusReportTime`).
    last_report: Option<Instant>,
    runtime: RuntimeState,
    /// When each pressure signal (memory, disk, pid) was last observed.
    pressure_seen: [Option<Instant>; 3],
}

/// Keeps this node registered, its status and lease fresh and its `volumesInUse` current.
pub struct NodeRegistrar {
    nodes: Api<Node>,
    leases: Api<Lease>,
    config: NodeConfig,
    clock: Arc<dyn Clock>,
    machine: Arc<dyn Machine>,
    runtime: Arc<dyn NodeRuntime>,
    state: Mutex<LoopState>,
    /// The Lease as the last create or update returned it: the next renewal updates it without
    /// reading it first (upstream's lease controller keeps `latestLease` the same way).
    latest_lease: std::sync::Mutex<Option<Lease>>,
    /// Whether the Node is registered: `volumesInUse` is written only then (upstream writes it
    /// in the node status, after registration).
    registered: tokio::sync::watch::Sender<bool>,
    /// The watch's copy of the Node, which a status update's first try starts from (upstream's
    /// node informer lister).
    cache: Option<Arc<NodeCache>>,
    /// The device plugins' resources; none without.
    device_plugins: Option<Arc<dyn DevicePlugins>>,
}

impl NodeRegistrar {
    /// A registrar over this client: the agent's heartbeat client
    /// ([`crate::client::ApiClients::heartbeat`], no rate limit), so the Lease and the node
    /// status never wait behind events or pod status writes. Deviation: upstream registers the
    /// Node through its main client; here registration shares the heartbeat client too (one
    /// registrar, and registration is rare). The machine is this host (`nodefs` at `/`) and the
    /// runtime [`AssumedReadyRuntime`] until set.
    pub fn new(client: kube::Client, config: NodeConfig) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client, NODE_LEASE_NAMESPACE),
            config,
            clock: Arc::new(SystemClock),
            machine: Arc::new(HostMachine::new("/")),
            runtime: Arc::new(AssumedReadyRuntime),
            latest_lease: std::sync::Mutex::new(None),
            state: Mutex::new(LoopState {
                last_report: None,
                runtime: RuntimeState {
                    last_sync: None,
                    runtime_error: None,
                    network_error: Some(NETWORK_UNKNOWN.into()),
                },
                pressure_seen: [None; 3],
            }),
            registered: tokio::sync::watch::Sender::new(false),
            cache: None,
            device_plugins: None,
        }
    }

    /// A status update's first try starts from this watch's copy of the Node instead of a GET
    /// (upstream `tryUpdateNodeStatus`: `kl.nodeLister.Get` when `tryNumber == 0`).
    pub fn with_node_cache(mut self, cache: Arc<NodeCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The machine whose figures make the status.
    pub fn with_machine(mut self, machine: Arc<dyn Machine>) -> Self {
        self.machine = machine;
        self
    }

    /// The runtime asked for its version and conditions.
    pub fn with_runtime(mut self, runtime: Arc<dyn NodeRuntime>) -> Self {
        self.runtime = runtime;
        self
    }

    /// The device plugins whose resources the status reports.
    pub fn with_device_plugins(mut self, plugins: Arc<dyn DevicePlugins>) -> Self {
        self.device_plugins = Some(plugins);
        self
    }

    /// The clock of heartbeat and transition times.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Now, in whole seconds (as the API server keeps a `Time`).
    fn wall_now(&self) -> Timestamp {
        let now = self.clock.now();
        Timestamp::from_second(now.as_second()).unwrap_or(now)
    }

    /// Runs the setters on `node` (upstream `setNodeStatus`): asks the runtime, reads the
    /// machine, and updates the loop's runtime and pressure state.
    async fn set_status(&self, node: &mut Node) {
        let now = Instant::now();
        let conditions = self.runtime.status().await;
        let version = self.runtime.version().await;
        let figures = self.machine.figures();
        let mut state = self.state.lock().await;
        // upstream: updateRuntimeUp.
        match conditions {
            Ok(conditions) => {
                let readiness = runtime_readiness(&conditions);
                state.runtime.network_error = readiness.network_error;
                if readiness.runtime_error.is_none() {
                    state.runtime.last_sync = Some(now);
                }
                state.runtime.runtime_error = readiness.runtime_error;
            }
            Err(e) => warn!("container runtime status check failed: {e}"),
        }
        let mut errors = runtime_errors(
            state.runtime.last_sync.map(|t| now - t),
            self.config.runtime_sync_threshold,
            state.runtime.runtime_error.as_deref(),
        );
        errors.extend(state.runtime.network_error.clone());
        // upstream: the eviction manager's pressure, kept for the transition period after
        // its signal was last observed.
        let observed = pressure(&figures, &self.config.eviction);
        let mut held = [false; 3];
        for (i, seen) in [observed.memory, observed.disk, observed.pid]
            .into_iter()
            .enumerate()
        {
            if seen {
                state.pressure_seen[i] = Some(now);
            }
            held[i] = state.pressure_seen[i]
                .is_some_and(|t| now - t < self.config.pressure_transition_period);
        }
        drop(state);
        let runtime_version = format!(
            "{}://{}",
            self.runtime.type_name(),
            version.unwrap_or_else(|_| "Unknown".into())
        );
        let devices = self
            .device_plugins
            .as_ref()
            .map(|p| p.resources())
            .unwrap_or_default();
        let status = node.status.get_or_insert_with(NodeStatus::default);
        let events = set_node_status(
            status,
            &StatusInputs {
                now: self.wall_now(),
                hostname: &self.config.hostname,
                node_ip: self.config.node_ip.as_deref(),
                machine: &figures,
                max_pods: self.config.max_pods,
                eviction: &self.config.eviction,
                pressure: rustlet_core::node_status::Pressure {
                    memory: held[0],
                    disk: held[1],
                    pid: held[2],
                },
                container_runtime_version: &runtime_version,
                kubelet_version: KUBELET_VERSION,
                kubelet_port: self.config.kubelet_port,
                ready_errors: &errors,
                runtime_handlers: &self.runtime.runtime_handlers(),
                device_plugins: &devices,
            },
        );
        for event in events {
            info!(node = %self.config.name, event, "node status is now: {event}");
        }
    }

    /// The Node to register (upstream `initialNode`): the kubelet's labels and `--node-labels`,
    /// the controller-managed attach-detach annotation, `--register-with-taints`, and the full
    /// status.
    pub async fn initial_node(&self) -> Node {
        let mut labels = registration_labels(&self.config.hostname);
        labels.extend(self.config.labels.clone());
        let mut node = Node {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                labels: Some(labels),
                annotations: Some(BTreeMap::from([(
                    CONTROLLER_MANAGED_ATTACH_ANNOTATION.to_owned(),
                    "true".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            spec: (!self.config.taints.is_empty()).then(|| NodeSpec {
                taints: Some(self.config.taints.clone()),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus::default()),
        };
        self.set_status(&mut node).await;
        node
    }

    /// One registration attempt (upstream `tryRegisterWithAPIServer`): create the Node; when it
    /// exists (409, or 403: creating may be forbidden while the Node exists), get it and
    /// reconcile the attach-detach annotation, the default labels and the huge page resources,
    /// patching the status subresource when any changed. Returns the API's Node.
    pub async fn register(&self) -> Result<Node, ClientError> {
        let registered = self.try_register().await?;
        self.registered.send_replace(true);
        Ok(registered)
    }

    async fn try_register(&self) -> Result<Node, ClientError> {
        let node = self.initial_node().await;
        match self.nodes.create(&PostParams::default(), &node).await {
            Ok(created) => return Ok(created),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 403 => {
                info!(node = %self.config.name, "node was previously registered");
            }
            Err(e) => return Err(client_error(e)),
        }
        let existing = self
            .nodes
            .get(&self.config.name)
            .await
            .map_err(client_error)?;
        let mut reconciled = existing.clone();
        let initial_meta = &node.metadata;
        let mut changed = reconcile_attach_detach_annotation(
            initial_meta
                .annotations
                .as_ref()
                .unwrap_or(&BTreeMap::new()),
            reconciled
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new),
        );
        changed |= reconcile_default_labels(
            initial_meta.labels.as_ref().unwrap_or(&BTreeMap::new()),
            reconciled.metadata.labels.get_or_insert_with(BTreeMap::new),
        );
        changed |= reconcile_node_resources(
            node.status.as_ref().unwrap_or(&NodeStatus::default()),
            reconciled.status.get_or_insert_with(NodeStatus::default),
        );
        if !changed {
            return Ok(existing);
        }
        match node_status_patch(&existing, &reconciled) {
            Some(patch) => self.patch_status(&patch).await,
            None => Ok(existing),
        }
    }

    async fn patch_status(&self, patch: &serde_json::Value) -> Result<Node, ClientError> {
        self.nodes
            .patch_status(
                &self.config.name,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await
            .map_err(client_error)
    }

    /// Registers, trying again after 100 ms, doubling up to 7 s (upstream
    /// `registerWithAPIServer`: the wait comes before each attempt).
    pub async fn register_with_backoff(&self) -> Node {
        let mut step = REGISTER_BACKOFF.0;
        loop {
            tokio::time::sleep(step).await;
            step = (step * 2).min(REGISTER_BACKOFF.1);
            match self.register().await {
                Ok(node) => {
                    info!(node = %self.config.name, "registered the node");
                    return node;
                }
                Err(e) => warn!("registering node {}: {e}", self.config.name),
            }
        }
    }

    /// One status update (upstream `tryUpdateNodeStatus`): get the Node (the first try from
    /// the watch's copy, [`Self::with_node_cache`], as upstream from its informer lister; without
    /// one, from the API server's cache, `resourceVersion=0`; a retry from etcd),
    /// restore the OS and architecture labels, run the setters, and patch the status
    /// subresource when anything but the heartbeats changed or `nodeStatusReportFrequency`
    /// has passed since the last report.
    ///
    /// Deviation: upstream spreads the first and each changed report's next deadline by a
    /// random ±50% of the report frequency (`calculateDelay`); here an unchanged status is
    /// reported exactly `nodeStatusReportFrequency` after the last report.
    pub async fn try_update_node_status(
        &self,
        attempt: usize,
    ) -> Result<StatusUpdate, ClientError> {
        let cached = match (attempt, &self.cache) {
            (0, Some(cache)) => cache.node(),
            _ => None,
        };
        let original = match cached {
            Some(node) => node,
            None => {
                let params = if attempt == 0 {
                    GetParams::any()
                } else {
                    GetParams::default()
                };
                self.nodes
                    .get_with(&self.config.name, &params)
                    .await
                    .map_err(client_error)?
            }
        };
        let mut node = original.clone();
        // upstream updateNode: the OS and architecture labels, when missing or wrong.
        let (os, arch) = go_os_arch();
        let labels = node.metadata.labels.get_or_insert_with(BTreeMap::new);
        let mut labels_missing = false;
        for (key, value) in [(LABEL_OS, os), (LABEL_ARCH, arch)] {
            if labels.get(key).map(String::as_str) != Some(value) {
                labels.insert(key.to_owned(), value.to_owned());
                labels_missing = true;
            }
        }
        self.set_status(&mut node).await;
        let changed = labels_missing
            || node_status_has_changed(
                original.status.as_ref().unwrap_or(&NodeStatus::default()),
                node.status.as_ref().unwrap_or(&NodeStatus::default()),
            );
        let now = Instant::now();
        let expired = self
            .state
            .lock()
            .await
            .last_report
            .is_none_or(|t| now - t >= self.config.status_report_frequency);
        if !changed && !expired {
            return Ok(StatusUpdate::Unchanged);
        }
        if let Some(patch) = node_status_patch(&original, &node) {
            self.patch_status(&patch).await?;
        }
        self.state.lock().await.last_report = Some(now);
        Ok(StatusUpdate::Patched)
    }

    /// upstream `updateNodeStatus`: up to [`NODE_STATUS_UPDATE_RETRY`] tries.
    pub async fn update_node_status(&self) -> Result<StatusUpdate, ClientError> {
        let mut last = None;
        for attempt in 0..NODE_STATUS_UPDATE_RETRY {
            match self.try_update_node_status(attempt).await {
                Ok(update) => return Ok(update),
                Err(e) => {
                    warn!(
                        "updating the status of node {}, will retry: {e}",
                        self.config.name
                    );
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Transport("no attempt".into())))
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

    /// Creates the Lease (owned by the Node) or renews it with an update that carries its
    /// resourceVersion.
    pub async fn renew_lease(&self, node_uid: &str) -> Result<Lease, ClientError> {
        let cached = self
            .latest_lease
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        // upstream `controller.sync`: with a Lease in hand, update it at once; a failure (a
        // conflict: someone else wrote it) falls back to reading it.
        if let Some(lease) = cached {
            match self.update_lease(lease).await {
                Ok(lease) => return Ok(self.keep_lease(lease)),
                Err(e) => warn!(
                    "renewing the Lease of node {} from its last copy, reading it again: {e}",
                    self.config.name
                ),
            }
        }
        let renewed = self.read_and_renew_lease(node_uid).await?;
        Ok(self.keep_lease(renewed))
    }

    fn keep_lease(&self, lease: Lease) -> Lease {
        *self.latest_lease.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease.clone());
        lease
    }

    /// Sets the renew time, holder and duration of `lease` and writes it (an update carrying
    /// its resourceVersion).
    async fn update_lease(&self, mut lease: Lease) -> Result<Lease, ClientError> {
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.renew_time = Some(MicroTime(self.clock.now()));
        spec.holder_identity = Some(self.config.name.clone());
        spec.lease_duration_seconds = Some(self.config.lease_duration_seconds);
        self.leases
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
            .map_err(client_error)
    }

    /// Reads the Lease and renews it, or creates it (owned by the Node) when absent.
    async fn read_and_renew_lease(&self, node_uid: &str) -> Result<Lease, ClientError> {
        let now = MicroTime(self.clock.now());
        match self.leases.get(&self.config.name).await {
            Ok(lease) => self.update_lease(lease).await,
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

    async fn lease_loop(&self, node_uid: &str) {
        loop {
            if let Err(e) = self.renew_lease(node_uid).await {
                warn!("renewing lease of node {}: {e}", self.config.name);
            }
            tokio::time::sleep(self.config.renew_interval).await;
        }
    }

    async fn status_loop(&self) {
        loop {
            if let Err(e) = self.update_node_status().await {
                warn!(
                    "unable to update the status of node {}: {e}",
                    self.config.name
                );
            }
            tokio::time::sleep(self.config.status_update_frequency).await;
        }
    }

    /// Registers (with back-off), then renews the Lease every `renew_interval` and updates the
    /// status every `status_update_frequency`, each on its own, until `cancel` fires.
    pub async fn run(&self, cancel: CancellationToken) {
        let node = tokio::select! {
            () = cancel.cancelled() => return,
            node = self.register_with_backoff() => node,
        };
        let uid = node.metadata.uid.unwrap_or_default();
        tokio::select! {
            () = cancel.cancelled() => {}
            () = self.lease_loop(&uid) => {}
            () = self.status_loop() => {}
        }
    }
}

#[async_trait::async_trait]
impl VolumesInUseWriter for NodeRegistrar {
    /// Waits until the Node is registered, then writes.
    async fn write_volumes_in_use(&self, volumes: &[String]) -> Result<(), WriteError> {
        let mut registered = self.registered.subscribe();
        // The sender lives as long as `self`.
        let _ = registered.wait_for(|r| *r).await;
        Ok(self.set_volumes_in_use(volumes).await?)
    }
}

#[cfg(test)]
mod tests;
