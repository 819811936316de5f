//! [`CriRuntime`]: the pod workers' `Runtime` over CRI (upstream's `kubeGenericRuntimeManager`
//! and generic PLEG, reduced to what the workers ask).
//!
//! What runs is read from a cache that a relist refreshes every second (upstream's PLEG relist
//! period): `ListPodSandbox` and `ListContainers`, then `ContainerStatus` only for containers
//! whose state changed since the last relist. The runtime's own actions (create, start, stop)
//! write what they did into the cache at once, and a relist that began before an action never
//! overwrites it (each pod record carries the epoch of its last action), so a worker never sees
//! a container it just started vanish and start it twice.
//!
//! Sandboxes and containers are matched to pods by the `io.kubernetes.pod.uid` label, so an
//! agent restart adopts what runs (no restart), and housekeeping stops and removes what belongs
//! to pods no worker knows. Exited containers beyond the newest two of a name (the second is
//! `lastState`) and dead sandboxes of a pod that has a newer one are garbage-collected.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{
    Container, NodeRuntimeHandler, NodeRuntimeHandlerFeatures, Pod, Service,
};
use k8s_openapi::jiff::Timestamp;
use rustlet_core::PodUid;
use rustlet_core::node_status::RuntimeCondition;
use rustlet_pods::lifecycle::{
    FAILED_POST_START_HOOK, FAILED_PRE_STOP_HOOK, HookTarget, POST_START_HOOK_ERROR, run_hook,
};
use rustlet_pods::runtime::{
    ContainerInstance, ContainerKind, ContainerLogInfo, ExecOutput, FsUsage, InstanceState,
    PodUsage, RunningContainerLog, Runtime, RuntimeError, RuntimePodStatus, Sandbox, Streams,
    full_name,
};
use rustlet_volume::env_files::EnvFiles;
use rustlet_volume::events::{EventKind, EventRecorder};
use rustlet_volume::objects::VolumeObjects;
use rustlet_volume::plugins::downward::NodeAllocatable;
use rustlet_volume::subpath::ContainerMount;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cgroups::{PodCgroupsConfig, pod_cgroup_name};
use crate::client::{CriClient, CriError};
use crate::config::service_env;
use crate::config::{
    CONTAINER_HASH_ANNOTATION, CONTAINER_KIND_ANNOTATION, ContainerInputs, ETC_HOSTS_PATH,
    EnvSources, HostsSource, POD_NAME_LABEL, POD_NAMESPACE_LABEL, POD_UID_LABEL, PodAddresses,
    PullPolicy, add_devices, container_config, container_env, hosts_file_content,
    mounts_hosts_file, pod_hostname_and_domain, sandbox_config,
};
use crate::deviceplugin::{ContainerDevices, DeviceManager};
use crate::logs::{self, LogLayoutError};
use crate::ordering::TerminationOrdering;
use crate::resources::NodeResources;
use crate::security::{ContainerSecurityInputs, ImageUser, SECCOMP_PROFILE_DIR};
use crate::termination;

/// Settings of the CRI runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriConfig {
    /// `unix:///run/containerd/containerd.sock`.
    pub endpoint: String,
    /// The deadline of each call (a stop's is its grace period plus this).
    pub request_timeout: Duration,
    /// The deadline of an image pull.
    pub pull_timeout: Duration,
    /// How often what runs is listed again (upstream's PLEG: 1 s).
    pub relist_period: Duration,
    /// The agent's root directory.
    pub root_dir: PathBuf,
    /// The pods' log directories go under it, `<namespace>_<name>_<uid>/<container>/<n>.log`
    /// (the kubelet's `podLogsDir`, upstream's default `/var/log/pods`; here
    /// `<root>/pod-logs` unless configured: see [`crate::logs`]). Absolute.
    pub pod_logs_dir: PathBuf,
    /// The `/var/log/containers`-style symlinks to each container's log go under it
    /// (`<root>/container-logs` unless configured). Absolute.
    pub container_logs_dir: PathBuf,
    /// The node's address: the IP of host-network pods.
    pub node_ip: String,
    /// First image pull back-off (upstream 10 s), doubling up to `image_backoff_max` (300 s).
    pub image_backoff_initial: Duration,
    /// Longest image pull back-off.
    pub image_backoff_max: Duration,
    /// Grace period of the containers of a pod no worker knows (left from before a restart).
    pub orphan_grace: Duration,
    /// How often a running pod's worker looks again when no relist announced a change (the
    /// relist's events wake it at once; this is the safety net).
    pub worker_resync: Duration,
    /// The node this agent runs as: with `root_dir`, the mark on everything it creates
    /// ([`Self::owner_labels`]).
    pub node_name: String,
    /// The cluster's DNS domain (upstream `clusterDomain`; empty by default, as upstream's):
    /// the FQDN of a pod with `subdomain` in its hosts file, and its host name with
    /// `setHostnameAsFQDN`.
    pub cluster_domain: String,
    /// The node's hosts file, the base of a host-network pod's (upstream: `/etc/hosts`).
    pub node_hosts_file: PathBuf,
    /// The node's memory and cgroup mode, which containers' resources depend on
    /// ([`crate::resources`]); [`CriConfig::new`] reads this host's ([`host_node_resources`]).
    pub node_resources: NodeResources,
    /// Where the pods' cgroups go (upstream's `cgroupsPerQOS` with the `cgroupfs` driver);
    /// `None` (the default): none are made, and the sandboxes get no `cgroup_parent` (a
    /// deviation: upstream's kubelet makes them under the root `/`).
    pub pod_cgroups: Option<PodCgroupsConfig>,
}

/// This host's [`NodeResources`]: `MemTotal` of `/proc/meminfo` (0 when unreadable) and
/// whether `/sys/fs/cgroup` is a cgroup v2 root (it has `cgroup.controllers`; a v1 or hybrid
/// hierarchy's tmpfs has not).
pub fn host_node_resources() -> NodeResources {
    let memory_capacity = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                let kib = line.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?;
                kib.trim().parse::<i64>().ok()?.checked_mul(1024)
            })
        })
        .unwrap_or(0);
    NodeResources {
        memory_capacity,
        cgroup_v2_unified: Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
    }
}

/// The pods' log directories' default place under the root directory.
pub const DEFAULT_POD_LOGS_DIR: &str = "pod-logs";
/// The container log symlinks' default place under the root directory.
pub const DEFAULT_CONTAINER_LOGS_DIR: &str = "container-logs";

/// The label naming the node of the agent that created a sandbox or container.
pub const OWNER_NODE_LABEL: &str = "io.rustlet.node-name";
/// The label naming the root directory of the agent that created a sandbox or container.
pub const OWNER_ROOT_DIR_LABEL: &str = "io.rustlet.root-dir";

impl CriConfig {
    /// Upstream's timings for `endpoint` under `root_dir`.
    pub fn new(endpoint: impl Into<String>, root_dir: impl Into<PathBuf>) -> Self {
        let root_dir: PathBuf = root_dir.into();
        Self {
            endpoint: endpoint.into(),
            request_timeout: Duration::from_secs(120),
            pull_timeout: Duration::from_secs(300),
            relist_period: Duration::from_secs(1),
            pod_logs_dir: root_dir.join(DEFAULT_POD_LOGS_DIR),
            container_logs_dir: root_dir.join(DEFAULT_CONTAINER_LOGS_DIR),
            root_dir,
            node_ip: "127.0.0.1".into(),
            image_backoff_initial: Duration::from_secs(10),
            image_backoff_max: Duration::from_secs(300),
            orphan_grace: Duration::from_secs(2),
            worker_resync: Duration::from_secs(10),
            node_name: String::new(),
            cluster_domain: String::new(),
            node_hosts_file: PathBuf::from(ETC_HOSTS_PATH),
            node_resources: host_node_resources(),
            pod_cgroups: None,
        }
    }

    /// The mark this agent puts on every sandbox and container it creates, and by which alone
    /// it lists, adopts, stops and removes them: its node name and root directory. A
    /// containerd shared with a kubelet or another agent (the default endpoint is the system's
    /// socket) holds pods with upstream's labels that are not ours to touch. Deviation:
    /// upstream's kubelet owns its runtime and lists everything.
    pub fn owner_labels(&self) -> HashMap<String, String> {
        HashMap::from([
            (OWNER_NODE_LABEL.to_owned(), self.node_name.clone()),
            (
                OWNER_ROOT_DIR_LABEL.to_owned(),
                self.root_dir.to_string_lossy().into_owned(),
            ),
        ])
    }
}

#[derive(Clone, Debug)]
struct SandboxRecord {
    id: String,
    attempt: u32,
    ready: bool,
    host_network: bool,
    ip: Option<String>,
    created_at: i64,
}

#[derive(Clone, Debug)]
struct ContainerRecord {
    id: String,
    sandbox_id: String,
    /// The CRI state number, to tell whether a relist must ask for the status again.
    cri_state: i32,
    instance: ContainerInstance,
    created_at: i64,
    /// The file the runtime writes (CRI `log_path`); empty if it writes none.
    log_path: PathBuf,
    /// Its `/var/log/containers`-style symlink.
    log_symlink: Option<PathBuf>,
}

#[derive(Clone, Debug, Default)]
struct PodRecord {
    /// Newest first.
    sandboxes: Vec<SandboxRecord>,
    /// Newest first.
    containers: Vec<ContainerRecord>,
    /// The epoch of the runtime's last action on this pod.
    touched: u64,
}

impl PodRecord {
    /// A sandbox this runtime just made, as the newest. A relist that ran between the CRI call
    /// and this may have listed it already: it is there once.
    fn add_sandbox(&mut self, record: SandboxRecord) {
        self.sandboxes.retain(|s| s.id != record.id);
        self.sandboxes.insert(0, record);
    }

    /// A container this runtime just started, as the newest; there once, as
    /// [`Self::add_sandbox`] (twice, it was its own `lastState`).
    fn add_container(&mut self, record: ContainerRecord) {
        self.containers.retain(|c| c.id != record.id);
        self.containers.insert(0, record);
    }
}

#[derive(Clone, Copy, Debug)]
struct PullBackoff {
    delay: Duration,
    until: Instant,
}

#[derive(Debug, Default)]
struct State {
    pods: HashMap<PodUid, PodRecord>,
    epoch: u64,
    last_relist: Option<Instant>,
    /// Per pod and image: failed pulls back off.
    pulls: HashMap<(PodUid, String), PullBackoff>,
    /// Pods and containers being removed in the background (not started twice).
    removing: HashSet<String>,
    /// Whether the last relist failed (to log a change of state once).
    relist_failing: bool,
}

/// The Services a container's environment is made from (upstream: the kubelet's service
/// lister, a cache of every Service).
pub trait ServiceSource: Send + Sync {
    /// Every Service the agent knows; `None` until they were listed once.
    fn services(&self) -> Option<Vec<Arc<Service>>>;
}

/// The CRI runtime.
pub struct CriRuntime {
    client: CriClient,
    /// ConfigMaps and Secrets for the containers' environment.
    objects: Option<Arc<dyn VolumeObjects>>,
    /// Services for the containers' environment ([`Self::set_services`]); without it a
    /// container gets no Service variables (upstream: a kubelet without an API server).
    services: std::sync::OnceLock<Arc<dyn ServiceSource>>,
    /// Where the lifecycle hooks' failures are told ([`Self::set_event_recorder`]); without
    /// it they are only logged.
    recorder: std::sync::OnceLock<Arc<dyn EventRecorder>>,
    /// The device plugins, asked for the devices a container's limits name (none: no device
    /// plugin resource is given to containers).
    devices: std::sync::OnceLock<DeviceManager>,
    config: CriConfig,
    /// The runtime's name: the scheme of container IDs (`containerd://...`).
    scheme: String,
    state: Mutex<State>,
    me: Weak<CriRuntime>,
    /// Pods a relist saw change by themselves (upstream's PLEG events).
    events: tokio::sync::broadcast::Sender<PodUid>,
    /// Whether the default handler supports recursive read-only mounts, as the last `Status`
    /// said (no until one did).
    supports_rro: AtomicBool,
    /// The handlers the last `Status` named, as the node reports them.
    handlers: Mutex<Vec<NodeRuntimeHandler>>,
}

/// Upstream `toKubeContainerRuntimeHandlers` and the `RuntimeHandlers` node status setter:
/// each handler with both features said (a feature the runtime leaves out is `false`).
fn node_runtime_handlers(handlers: &[cri::RuntimeHandler]) -> Vec<NodeRuntimeHandler> {
    handlers
        .iter()
        .map(|h| {
            let features = h.features.unwrap_or_default();
            NodeRuntimeHandler {
                name: Some(h.name.clone()),
                features: Some(NodeRuntimeHandlerFeatures {
                    recursive_read_only_mounts: Some(features.recursive_read_only_mounts),
                    user_namespaces: Some(features.user_namespaces),
                }),
            }
        })
        .collect()
}

/// Upstream `runtimeClassSupportsRecursiveReadOnlyMounts` for a pod without a runtime class:
/// the handler named `""` (the default) says it supports recursive read-only mounts.
fn default_handler_supports_rro(handlers: &[cri::RuntimeHandler]) -> bool {
    handlers
        .iter()
        .find(|h| h.name.is_empty())
        .and_then(|h| h.features.as_ref())
        .is_some_and(|f| f.recursive_read_only_mounts)
}

fn ts(ns: i64) -> Timestamp {
    Timestamp::from_nanosecond(i128::from(ns)).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The instance's state; `message`: an exited one's termination message
/// ([`termination::termination_message`]).
fn instance_state(status: &cri::ContainerStatus, message: String) -> InstanceState {
    match cri::ContainerState::try_from(status.state) {
        Ok(cri::ContainerState::ContainerCreated) => InstanceState::Created,
        Ok(cri::ContainerState::ContainerRunning) => InstanceState::Running {
            started_at: ts(status.started_at),
        },
        // Not "exited with code 0": the process may still run (upstream reports it as
        // `ContainerStatusUnknown` and kills it before a restart).
        Ok(cri::ContainerState::ContainerUnknown) => InstanceState::Unknown,
        _ => {
            let started_at = ts(status.started_at);
            // A very short-lived process can finish "before" it started (containerd quirk).
            let finished_at = ts(status.finished_at.max(status.started_at));
            let reason = if status.reason.is_empty() {
                if status.exit_code == 0 {
                    "Completed"
                } else {
                    "Error"
                }
                .to_owned()
            } else {
                status.reason.clone()
            };
            InstanceState::Exited {
                started_at,
                finished_at,
                exit_code: status.exit_code,
                reason,
                message,
            }
        }
    }
}

fn waiting(pod: &Pod, container: &str, reason: &str, message: String) -> RuntimeError {
    RuntimeError::ContainerWaiting {
        pod: full_name(pod),
        container: container.to_owned(),
        reason: reason.to_owned(),
        message,
    }
}

impl CriRuntime {
    /// Connects (the version check), then lists what runs, so that the workers see the pods
    /// that survived an agent restart from their first pass.
    pub async fn connect(
        config: CriConfig,
        objects: Option<Arc<dyn VolumeObjects>>,
    ) -> Result<Arc<Self>, CriError> {
        let client = CriClient::connect(&config.endpoint, config.request_timeout).await?;
        let version = client.version().await?;
        info!(
            endpoint = %config.endpoint,
            runtime = %version.name,
            version = %version.version,
            "connected to the container runtime"
        );
        let this = Arc::new_cyclic(|me| Self {
            client,
            objects,
            services: std::sync::OnceLock::new(),
            recorder: std::sync::OnceLock::new(),
            devices: std::sync::OnceLock::new(),
            config,
            scheme: version.name,
            state: Mutex::new(State::default()),
            me: me.clone(),
            events: tokio::sync::broadcast::channel(1024).0,
            supports_rro: AtomicBool::new(false),
            handlers: Mutex::new(Vec::new()),
        });
        this.relist().await?;
        Ok(this)
    }

    /// Where the Services of the containers' environment come from (once; a second call
    /// changes nothing).
    pub fn set_services(&self, source: Arc<dyn ServiceSource>) {
        let _ = self.services.set(source);
    }

    /// Where the events of the lifecycle hooks go (upstream: the runtime manager's
    /// `recorder`): `FailedPostStartHook`, the `Killing` that follows it, and
    /// `FailedPreStopHook`. Once; a second call changes nothing.
    pub fn set_event_recorder(&self, recorder: Arc<dyn EventRecorder>) {
        let _ = self.recorder.set(recorder);
    }

    /// The device manager that gives containers the devices their limits name (upstream: the
    /// container manager's `GetResources` → `GetDeviceRunContainerOptions`). Once; a second
    /// call changes nothing.
    pub fn set_device_manager(&self, manager: DeviceManager) {
        let _ = self.devices.set(manager);
    }

    /// One event about `pod` (upstream: `recordContainerEvent`), when a recorder is set.
    fn record(&self, pod: &Pod, kind: EventKind, reason: &str, message: &str) {
        if let Some(recorder) = self.recorder.get() {
            recorder.event(pod, kind, reason, message);
        }
    }

    /// The client.
    pub fn client(&self) -> &CriClient {
        &self.client
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pod's log directory (upstream: `BuildPodLogsDirectory`).
    fn log_dir(&self, pod: &Pod) -> Result<PathBuf, LogLayoutError> {
        let m = &pod.metadata;
        logs::pod_logs_directory(
            &self.config.pod_logs_dir,
            m.namespace.as_deref().unwrap_or("default"),
            m.name.as_deref().unwrap_or_default(),
            &PodUid::of(pod),
        )
    }

    /// Relists every `relist_period` until `cancel` fires; a failing relist keeps the last
    /// known state (and says so once), and the next one that succeeds picks up.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.relist_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let result = self.relist().await;
            let mut state = self.state();
            match result {
                Ok(()) if state.relist_failing => {
                    state.relist_failing = false;
                    info!("the container runtime answers again");
                }
                Err(e) if !state.relist_failing => {
                    state.relist_failing = true;
                    warn!(error = %e, "relisting the container runtime failed; keeping the last known state");
                }
                _ => {}
            }
        }
    }

    /// One relist (upstream's generic PLEG `Relist`).
    pub async fn relist(&self) -> Result<(), CriError> {
        let started = self.state().epoch;
        let owner = self.config.owner_labels();
        let sandboxes = self.client.list_pod_sandboxes_labelled(&owner).await?;
        let containers = self.client.list_containers_labelled(&owner).await?;
        let (known_sandboxes, known_containers) = {
            let state = self.state();
            let mut sb = HashMap::new();
            let mut ct = HashMap::new();
            for pod in state.pods.values() {
                for s in &pod.sandboxes {
                    sb.insert(s.id.clone(), s.clone());
                }
                for c in &pod.containers {
                    ct.insert(c.id.clone(), c.clone());
                }
            }
            (sb, ct)
        };
        let mut pods = self
            .records(
                sandboxes,
                containers,
                None,
                &known_sandboxes,
                &known_containers,
            )
            .await?;
        let (garbage, changed) = {
            let mut state = self.state();
            // What an action changed after this relist began stays as the action left it; a
            // pod's record that differs otherwise changed by itself (an exit, a sandbox that
            // died, something removed from outside): its worker is told.
            let mut changed = Vec::new();
            let old = std::mem::take(&mut state.pods);
            let known: HashSet<PodUid> = old.keys().cloned().collect();
            for (uid, record) in old {
                if record.touched > started {
                    pods.insert(uid, record);
                } else if pods.get(&uid).is_none_or(|new| !same_state(&record, new)) {
                    changed.push(uid);
                }
            }
            // New to the cache and not made by an action: adopted, or made from outside.
            changed.extend(pods.keys().filter(|uid| !known.contains(*uid)).cloned());
            state.pods = pods;
            state.last_relist = Some(Instant::now());
            (garbage(&state.pods), changed)
        };
        for uid in changed {
            let _ = self.events.send(uid);
        }
        self.collect(garbage);
        Ok(())
    }

    async fn sandbox_record(&self, id: &str, ready: bool) -> Result<SandboxRecord, CriError> {
        let status = self.client.pod_sandbox_status(id).await?;
        let host_network = status
            .linux
            .as_ref()
            .and_then(|l| l.namespaces.as_ref())
            .and_then(|n| n.options.as_ref())
            .is_some_and(|o| o.network == cri::NamespaceMode::Node as i32);
        let ip = status
            .network
            .as_ref()
            .map(|n| n.ip.clone())
            .filter(|ip| !ip.is_empty())
            .or_else(|| host_network.then(|| self.config.node_ip.clone()));
        Ok(SandboxRecord {
            id: id.to_owned(),
            attempt: status.metadata.as_ref().map_or(0, |m| m.attempt),
            ready,
            host_network,
            ip,
            created_at: status.created_at,
        })
    }

    async fn container_record(
        &self,
        id: &str,
        sandbox_id: &str,
    ) -> Result<ContainerRecord, CriError> {
        let status = self.client.container_status(id).await?;
        let message = if cri::ContainerState::try_from(status.state)
            == Ok(cri::ContainerState::ContainerExited)
        {
            let exited = status.clone();
            tokio::task::spawn_blocking(move || termination::termination_message(&exited))
                .await
                .unwrap_or_default()
        } else {
            String::new()
        };
        let kind = match status
            .annotations
            .get(CONTAINER_KIND_ANNOTATION)
            .map(String::as_str)
        {
            Some("init") => ContainerKind::Init,
            Some("ephemeral") => ContainerKind::Ephemeral,
            _ => ContainerKind::Regular,
        };
        let metadata = status.metadata.clone().unwrap_or_default();
        let label = |key: &str| status.labels.get(key).map_or("", String::as_str);
        let log_symlink = logs::container_log_symlink(
            &self.config.container_logs_dir,
            label(POD_NAMESPACE_LABEL),
            label(POD_NAME_LABEL),
            &metadata.name,
            id,
        )
        .ok();
        Ok(ContainerRecord {
            id: id.to_owned(),
            sandbox_id: sandbox_id.to_owned(),
            cri_state: status.state,
            created_at: status.created_at,
            log_path: PathBuf::from(&status.log_path),
            log_symlink,
            instance: ContainerInstance {
                id: format!("{}://{id}", self.scheme),
                name: metadata.name,
                kind,
                image: status
                    .image
                    .as_ref()
                    .map(|i| {
                        if i.user_specified_image.is_empty() {
                            i.image.clone()
                        } else {
                            i.user_specified_image.clone()
                        }
                    })
                    .unwrap_or_default(),
                image_id: status.image_ref.clone(),
                attempt: i32::try_from(metadata.attempt).unwrap_or(i32::MAX),
                state: instance_state(&status, message),
                sandbox_id: sandbox_id.to_owned(),
                hash: status.annotations.get(CONTAINER_HASH_ANNOTATION).cloned(),
            },
        })
    }

    /// Replaces one pod's record with what the runtime says now (after an action).
    async fn refresh_pod(&self, uid: &PodUid) -> Result<(), CriError> {
        let owner = self.config.owner_labels();
        let sandboxes = self.client.list_pod_sandboxes_labelled(&owner).await?;
        let containers = self.client.list_containers_labelled(&owner).await?;
        let mut pods = self
            .records(
                sandboxes,
                containers,
                Some(uid),
                &HashMap::new(),
                &HashMap::new(),
            )
            .await?;
        self.store(uid, pods.remove(uid).unwrap_or_default());
        Ok(())
    }

    /// The pod records of what was listed (only `only`'s, if given), newest first. A sandbox
    /// or container whose listed state is the one `known` has keeps its record; the others'
    /// statuses are asked for (an exited container's status never changes, a running one's
    /// only by exiting).
    async fn records(
        &self,
        sandboxes: Vec<cri::PodSandbox>,
        containers: Vec<cri::Container>,
        only: Option<&PodUid>,
        known_sandboxes: &HashMap<String, SandboxRecord>,
        known_containers: &HashMap<String, ContainerRecord>,
    ) -> Result<HashMap<PodUid, PodRecord>, CriError> {
        let wanted = |labels: &HashMap<String, String>| {
            labels
                .get(POD_UID_LABEL)
                .filter(|uid| only.is_none_or(|only| only.as_str() == uid.as_str()))
                .map(PodUid::new)
        };
        let mut pods: HashMap<PodUid, PodRecord> = HashMap::new();
        for sandbox in sandboxes {
            let Some(uid) = wanted(&sandbox.labels) else {
                continue;
            };
            let ready = sandbox.state == cri::PodSandboxState::SandboxReady as i32;
            let record = match known_sandboxes.get(&sandbox.id) {
                Some(known) if known.ready == ready => known.clone(),
                _ => match self.sandbox_record(&sandbox.id, ready).await {
                    Ok(record) => record,
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(e),
                },
            };
            pods.entry(uid).or_default().sandboxes.push(record);
        }
        for container in containers {
            let Some(uid) = wanted(&container.labels) else {
                continue;
            };
            let record = match known_containers.get(&container.id) {
                Some(known) if known.cri_state == container.state => known.clone(),
                _ => match self
                    .container_record(&container.id, &container.pod_sandbox_id)
                    .await
                {
                    Ok(record) => record,
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(e),
                },
            };
            pods.entry(uid).or_default().containers.push(record);
        }
        for pod in pods.values_mut() {
            pod.sandboxes
                .sort_by_key(|s| std::cmp::Reverse(s.created_at));
            pod.containers
                .sort_by_key(|c| std::cmp::Reverse(c.created_at));
        }
        Ok(pods)
    }

    /// Stores a pod's record as an action left it.
    fn store(&self, uid: &PodUid, mut record: PodRecord) {
        let mut state = self.state();
        state.epoch += 1;
        record.touched = state.epoch;
        state.pods.insert(uid.clone(), record);
    }

    fn update(&self, uid: &PodUid, change: impl FnOnce(&mut PodRecord)) {
        let mut state = self.state();
        state.epoch += 1;
        let epoch = state.epoch;
        let record = state.pods.entry(uid.clone()).or_default();
        change(record);
        record.touched = epoch;
    }

    /// Removes dead containers and sandboxes in the background.
    fn collect(&self, garbage: Garbage) {
        if garbage.containers.is_empty() && garbage.sandboxes.is_empty() {
            return;
        }
        let Some(this) = self.me.upgrade() else {
            return;
        };
        // Each ID once, however many relists find it before its removal ends.
        let (containers, sandboxes): (Vec<String>, Vec<String>) = {
            let mut state = self.state();
            let mut fresh = |ids: Vec<String>| -> Vec<String> {
                ids.into_iter()
                    .filter(|id| state.removing.insert(id.clone()))
                    .collect()
            };
            (fresh(garbage.containers), fresh(garbage.sandboxes))
        };
        if containers.is_empty() && sandboxes.is_empty() {
            return;
        }
        let logs: HashMap<String, (PathBuf, Option<PathBuf>)> = {
            let state = self.state();
            state
                .pods
                .values()
                .flat_map(|p| &p.containers)
                .filter(|c| containers.contains(&c.id))
                .map(|c| (c.id.clone(), (c.log_path.clone(), c.log_symlink.clone())))
                .collect()
        };
        tokio::spawn(async move {
            for id in &containers {
                debug!(container = %id, "removing a dead container");
                if let Err(e) = this.client.remove_container(id).await {
                    warn!(container = %id, error = %e, "removing a dead container failed");
                    continue;
                }
                // upstream: `removeContainerLog`: its log files and its symlink go with it.
                if let Some((path, link)) = logs.get(id).cloned() {
                    let removed = tokio::task::spawn_blocking(move || {
                        logs::remove_container_logs(&path, link.as_deref())
                    })
                    .await;
                    if let Ok(Err(e)) = removed {
                        warn!(container = %id, error = %e, "removing a dead container's logs failed");
                    }
                }
            }
            for id in &sandboxes {
                debug!(sandbox = %id, "removing a dead sandbox");
                if let Err(e) = this.client.remove_pod_sandbox(id).await {
                    warn!(sandbox = %id, error = %e, "removing a dead sandbox failed");
                }
            }
            let mut state = this.state();
            for id in containers.iter().chain(&sandboxes) {
                state.removing.remove(id);
            }
        });
    }

    /// The image for `container`, pulled as its policy says; `ErrImagePull`,
    /// `ImagePullBackOff` or `ErrImageNeverPull` otherwise.
    async fn ensure_image(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox: &cri::PodSandboxConfig,
    ) -> Result<String, RuntimeError> {
        let image = container.image.as_deref().unwrap_or_default();
        if image.is_empty() {
            return Err(waiting(
                pod,
                &container.name,
                "InvalidImageName",
                "the container has no image".into(),
            ));
        }
        let policy = PullPolicy::of(container);
        let present = match self.client.image_status(image).await {
            Ok(found) => found.map(|i| i.id),
            Err(e) => {
                return Err(waiting(pod, &container.name, "ErrImagePull", e.to_string()));
            }
        };
        match (policy, present) {
            (PullPolicy::Never, None) => {
                return Err(waiting(
                    pod,
                    &container.name,
                    "ErrImageNeverPull",
                    format!("Container image {image:?} is not present with pull policy of Never"),
                ));
            }
            (PullPolicy::Never | PullPolicy::IfNotPresent, Some(id)) => return Ok(id),
            _ => {}
        }
        let key = (PodUid::of(pod), image.to_owned());
        let now = Instant::now();
        if let Some(b) = self.state().pulls.get(&key)
            && now < b.until
        {
            return Err(waiting(
                pod,
                &container.name,
                "ImagePullBackOff",
                format!("Back-off pulling image {image:?}"),
            ));
        }
        match self
            .client
            .pull_image(image, sandbox.clone(), self.config.pull_timeout)
            .await
        {
            Ok(reference) => {
                self.state().pulls.remove(&key);
                info!(%image, "pulled image");
                Ok(reference)
            }
            Err(e) => {
                let mut state = self.state();
                let delay = state
                    .pulls
                    .get(&key)
                    .map_or(self.config.image_backoff_initial, |b| {
                        (b.delay * 2).min(self.config.image_backoff_max)
                    });
                state.pulls.insert(
                    key,
                    PullBackoff {
                        delay,
                        until: Instant::now() + delay,
                    },
                );
                Err(waiting(
                    pod,
                    &container.name,
                    "ErrImagePull",
                    format!("Failed to pull image {image:?}: {e}"),
                ))
            }
        }
    }

    /// The ConfigMaps and Secrets the container's environment names (upstream reads them
    /// through the same managers as the volumes; the pod is registered with them by then).
    async fn env_sources(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Result<EnvSources, RuntimeError> {
        let memory = u64::try_from(self.config.node_resources.memory_capacity).ok();
        let mut sources = EnvSources {
            allocatable: NodeAllocatable::of_host(memory.filter(|m| *m > 0)),
            ..EnvSources::default()
        };
        let config_error =
            |message: String| waiting(pod, &container.name, "CreateContainerConfigError", message);
        // upstream: makeEnvironmentVariables: a pod from the API waits until the Services were
        // listed once (a static pod does not); `enableServiceLinks` is defaulted to true by the
        // API server (deviation: unset counts as true, upstream refuses it).
        if let Some(source) = self.services.get() {
            match source.services() {
                Some(services) => {
                    let links = pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.enable_service_links)
                        .unwrap_or(true);
                    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
                    sources.services = service_env(&services, namespace, links);
                }
                None if rustlet_core::pod::is_static_pod(pod) => {}
                None => {
                    return Err(config_error(
                        "services have not yet been read at least once, cannot construct envvars"
                            .into(),
                    ));
                }
            }
        }
        let (maps, secrets) = EnvSources::names(container);
        if maps.is_empty() && secrets.is_empty() {
            return Ok(sources);
        }
        let Some(objects) = &self.objects else {
            return Err(config_error(
                "the environment names ConfigMaps or Secrets and this agent reads none".into(),
            ));
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        for name in maps {
            let found = match objects.config_map(namespace, &name).await {
                Ok(cm) => Some(cm),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(config_error(e.to_string())),
            };
            sources.config_maps.insert(name, found);
        }
        for name in secrets {
            let found = match objects.secret(namespace, &name).await {
                Ok(secret) => Some(secret),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(config_error(e.to_string())),
            };
            sources.secrets.insert(name, found);
        }
        Ok(sources)
    }

    /// Stops every container and sandbox of `uid` (`grace` for the containers; with the pod's
    /// spec, each container's `preStop` hook runs first, within it).
    async fn stop_pod(
        &self,
        uid: &PodUid,
        pod: Option<&Pod>,
        grace: Duration,
    ) -> Result<(), CriError> {
        self.refresh_pod(uid).await?;
        let (containers, sandboxes, pod_ip) = {
            let state = self.state();
            let Some(record) = state.pods.get(uid) else {
                return Ok(());
            };
            let containers: Vec<(String, String)> = record
                .containers
                .iter()
                .filter(|c| !matches!(c.instance.state, InstanceState::Exited { .. }))
                .map(|c| (c.id.clone(), c.instance.name.clone()))
                .collect();
            let sandboxes: Vec<String> = record
                .sandboxes
                .iter()
                .filter(|s| s.ready)
                .map(|s| s.id.clone())
                .collect();
            let pod_ip = record.sandboxes.first().and_then(|s| s.ip.clone());
            (containers, sandboxes, pod_ip)
        };
        // In parallel, each with the whole grace period (upstream `killContainersWithSyncResult`);
        // the sidecars stop after the regular containers, in reverse order.
        let names: Vec<&str> = containers.iter().map(|(_, name)| name.as_str()).collect();
        let ordering = pod.map(|p| TerminationOrdering::new(p, &names));
        let stops = containers.iter().map(|(id, name)| {
            let stop = StopContainer {
                pod,
                spec: pod.and_then(|p| spec_container(p, name)),
                id,
                pod_ip: pod_ip.as_deref().unwrap_or_default(),
                grace,
                ordering: ordering.as_ref(),
            };
            self.stop_container(stop)
        });
        let mut first_error = None;
        for done in futures::future::join_all(stops).await {
            match done {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        for id in sandboxes {
            match self.client.stop_pod_sandbox(&id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        self.refresh_pod(uid).await
    }

    /// Stops one container (upstream: `killContainer`): its `preStop` hook first when it has
    /// one and the grace period is not zero (upstream: `executePreStopHook`: the hook is waited
    /// for at most the grace period, a failure is logged and is a `FailedPreStopHook` event,
    /// and the stop goes on; a hook still
    /// running then is left to run, as upstream's goroutine, until it ends: an exec hook ends
    /// when the container is killed. Deviation: it is ended at the latest the runtime's
    /// request timeout after the grace period, and an exec hook's `ExecSync` call that timeout
    /// after it began; upstream's run unbounded), then its turn
    /// in the pod's [`TerminationOrdering`] within what is left if anything is (a hook that
    /// used up the grace period leaves no wait), then `StopContainer` with what
    /// is left of the grace period, in whole seconds and at least upstream's
    /// `minimumGracePeriodInSeconds` (2 s). Deviation: without a hook or a wait the grace
    /// period is passed on as it came (upstream clamps it to 2 s too); a container whose stop
    /// failed counts as stopped for the ones that wait for it (upstream lets them wait out
    /// their grace period).
    async fn stop_container(&self, stop: StopContainer<'_>) -> Result<(), CriError> {
        let StopContainer {
            pod,
            spec,
            id,
            pod_ip,
            mut grace,
            ordering,
        } = stop;
        // Whether a hook ran or a turn was waited for: the minimum applies.
        let mut clamp = false;
        let pre_stop = spec.and_then(|c| c.lifecycle.as_ref()?.pre_stop.as_ref());
        if let (Some(pod), Some(spec), Some(handler)) = (pod, spec, pre_stop)
            && !grace.is_zero()
        {
            let start = Instant::now();
            // The hook runs in a task of its own, which the end of the grace period leaves
            // running (upstream's goroutine): cancelling its `ExecSync` would make containerd
            // kill the hook's process at once, while upstream's goes on until the container is
            // killed (`minimumGracePeriodInSeconds` later at least). Its failure is logged and
            // is an event whenever it comes, as upstream's goroutine records it.
            // Bounded all the same: an `httpGet` hook has no timeout of its own.
            let bound = grace + self.config.request_timeout;
            let hook = self.me.upgrade().map(|runtime| {
                let (pod, spec, handler) = (pod.clone(), spec.clone(), handler.clone());
                let (instance_id, pod_ip) = (format!("{}://{id}", self.scheme), pod_ip.to_owned());
                tokio::spawn(async move {
                    let target = HookTarget {
                        pod: &pod,
                        container: &spec,
                        instance_id: &instance_id,
                        pod_ip: &pod_ip,
                    };
                    let result =
                        tokio::time::timeout(bound, run_hook(runtime.as_ref(), target, &handler))
                            .await;
                    if let Ok(Err(e)) = &result {
                        warn!(container = %spec.name, error = %e, "PreStop hook failed");
                        // upstream: the hook's message stays out of the event ("so that
                        // secrets won't leak from the server").
                        runtime.record(
                            &pod,
                            EventKind::Warning,
                            FAILED_PRE_STOP_HOOK,
                            "PreStopHook failed",
                        );
                    }
                })
            });
            // (No runtime to run it: the agent is being dropped.)
            if let Some(hook) = hook {
                match tokio::time::timeout(grace, hook).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        warn!(container = %spec.name, error = %e, "PreStop hook's task failed");
                    }
                    Err(_) => {
                        info!(container = %spec.name, ?grace, "PreStop hook not completed in grace period");
                    }
                }
            }
            let elapsed = Duration::from_secs(start.elapsed().as_secs());
            grace = grace.saturating_sub(elapsed);
            clamp = true;
        }
        // A hook that used up the grace period leaves no wait (upstream waits for its turn
        // only `if gracePeriod > 0`, and gives the minimum after).
        let name = spec.map(|c| c.name.as_str());
        if let (Some(ordering), Some(name)) = (ordering, name)
            && !grace.is_zero()
        {
            let waited = ordering.wait_for_turn(name, grace).await;
            if !waited.is_zero() {
                let waited = Duration::from_secs(waited.as_secs());
                grace = grace.saturating_sub(waited);
                clamp = true;
            }
        }
        if clamp {
            grace = grace.max(MINIMUM_GRACE_PERIOD);
        }
        let stopped = self.client.stop_container(raw_id(id), grace).await;
        if let (Some(ordering), Some(name)) = (ordering, name) {
            ordering.terminated(name);
        }
        stopped
    }

    /// The container's `/var/log/containers`-style symlink to its log, made only when the log
    /// exists (upstream: `startContainer`'s legacy symlink; a failure is logged, not fatal).
    async fn link_container_log(&self, log: PathBuf, link: PathBuf) {
        let links_dir = self.config.container_logs_dir.clone();
        let made = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            match std::fs::symlink_metadata(&log) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                _ => {}
            }
            std::fs::create_dir_all(&links_dir)?;
            // A link of the same name is a leftover: the container IDs are unique.
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&log, &link)
        })
        .await;
        match made {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "failed to create the container log symlink"),
            Err(e) => warn!(error = %e, "failed to create the container log symlink"),
        }
    }

    /// Removes every container and sandbox of `uid` and its log directory.
    async fn remove_all(&self, uid: &PodUid) -> Result<(), CriError> {
        // The pod's image pull back-offs go with it (deviation: upstream's keyed back-off keeps
        // an entry until its periodic GC finds it older than twice the longest delay).
        self.state().pulls.retain(|(pod, _), _| pod != uid);
        self.refresh_pod(uid).await?;
        let record = self.state().pods.get(uid).cloned().unwrap_or_default();
        for c in &record.containers {
            match self.client.remove_container(&c.id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        for s in &record.sandboxes {
            match self.client.remove_pod_sandbox(&s.id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        // Cleared, not forgotten: a relist that began before the removal must not bring the
        // old record back; the next one drops the empty record.
        self.store(uid, PodRecord::default());
        // Found by the UID (the pod object may be gone), never across a mount point; the
        // symlinks into it go first.
        let (pods_dir, links_dir, pod) = (
            self.config.pod_logs_dir.clone(),
            self.config.container_logs_dir.clone(),
            uid.clone(),
        );
        let removed =
            tokio::task::spawn_blocking(move || logs::remove_pod_logs(&pods_dir, &links_dir, &pod))
                .await;
        if let Ok(Err(e)) = removed {
            warn!(%uid, error = %e, "removing the pod's log directory failed");
        }
        if let Some(cgroups) = self.config.pod_cgroups.clone() {
            // upstream: `podContainerManager.Destroy` once the pod's containers are gone.
            let pod = uid.to_string();
            let removed = tokio::task::spawn_blocking(move || cgroups.remove(&pod)).await;
            if let Ok(Err(e)) = removed {
                warn!(%uid, error = %e, "removing the pod's cgroup failed");
            }
        }
        Ok(())
    }
}

/// A container ID without its `<runtime>://` scheme.
/// upstream: `minimumGracePeriodInSeconds`, the least a container is given to stop after its
/// `preStop` hook.
const MINIMUM_GRACE_PERIOD: Duration = Duration::from_secs(2);

/// One container to stop, and what its `preStop` hook needs.
struct StopContainer<'a> {
    /// The pod (`None`: an orphan, whose spec is not known: no hook).
    pod: Option<&'a Pod>,
    /// The spec container of that name.
    spec: Option<&'a Container>,
    /// The CRI container ID (raw).
    id: &'a str,
    /// The pod's IP, for an `httpGet` hook.
    pod_ip: &'a str,
    /// The grace period.
    grace: Duration,
    /// The order of the pod's stop, when the whole pod stops.
    ordering: Option<&'a TerminationOrdering>,
}

/// The pod's spec container (init or regular) named `name`.
fn spec_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == name)
}

/// The grace period a container killed outside a pod's termination gets (upstream
/// `setTerminationGracePeriod`: the pod's deletion grace period, else its
/// `terminationGracePeriodSeconds` (the API server defaults it to 30), else 2 s).
fn termination_grace_period(pod: &Pod) -> Duration {
    let seconds = pod
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| pod.spec.as_ref()?.termination_grace_period_seconds)
        .unwrap_or(2);
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

fn raw_id(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, raw)| raw)
}

/// A streaming call's error: CRI `NotFound` stays one (the server answers 404).
fn stream_error(operation: String, e: &CriError) -> RuntimeError {
    if e.is_not_found() {
        RuntimeError::NotFound {
            operation,
            message: e.to_string(),
        }
    } else {
        RuntimeError::Stream {
            operation,
            message: e.to_string(),
        }
    }
}

impl std::fmt::Debug for CriRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriRuntime")
            .field("endpoint", &self.client.endpoint())
            .field("scheme", &self.scheme)
            .finish_non_exhaustive()
    }
}

/// Whether two records of a pod say the same about what runs.
fn same_state(a: &PodRecord, b: &PodRecord) -> bool {
    a.sandboxes.len() == b.sandboxes.len()
        && a.containers.len() == b.containers.len()
        && a.sandboxes
            .iter()
            .zip(&b.sandboxes)
            .all(|(x, y)| x.id == y.id && x.ready == y.ready)
        && a.containers
            .iter()
            .zip(&b.containers)
            .all(|(x, y)| x.id == y.id && x.cri_state == y.cri_state)
}

/// The `targetContainerName` of the ephemeral container `container` of `pod` (`None` for any
/// other container, or without one).
fn ephemeral_target<'a>(
    pod: &'a Pod,
    container: &Container,
    kind: ContainerKind,
) -> Option<&'a str> {
    if kind != ContainerKind::Ephemeral {
        return None;
    }
    pod.spec
        .as_ref()?
        .ephemeral_containers
        .iter()
        .flatten()
        .find(|e| e.name == container.name)?
        .target_container_name
        .as_deref()
        .filter(|t| !t.is_empty())
}

/// Dead objects a relist found.
#[derive(Debug, Default)]
struct Garbage {
    containers: Vec<String>,
    sandboxes: Vec<String>,
}

/// Exited containers beyond the newest two of each name, and not-ready sandboxes of a pod that
/// has a newer sandbox and no container left in them.
fn garbage(pods: &HashMap<PodUid, PodRecord>) -> Garbage {
    let mut out = Garbage::default();
    for pod in pods.values() {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for c in &pod.containers {
            let n = seen.entry(c.instance.name.as_str()).or_default();
            *n += 1;
            if *n > 2 && matches!(c.instance.state, InstanceState::Exited { .. }) {
                out.containers.push(c.id.clone());
            }
        }
        // Removing a sandbox removes its containers: only one none of the kept ones is in.
        for s in pod.sandboxes.iter().skip(1).filter(|s| !s.ready) {
            let in_use = pod
                .containers
                .iter()
                .any(|c| c.sandbox_id == s.id && !out.containers.contains(&c.id));
            if !in_use {
                out.sandboxes.push(s.id.clone());
            }
        }
    }
    out
}

#[async_trait]
impl Runtime for CriRuntime {
    fn name(&self) -> &str {
        "cri"
    }

    /// CRI `Version`'s `runtime_name` at connection (`containerd`).
    fn type_name(&self) -> String {
        self.scheme.clone()
    }

    /// CRI `Version`'s `runtime_version` (upstream `containerRuntime.Version`).
    async fn version(&self) -> Result<String, RuntimeError> {
        self.client
            .version()
            .await
            .map(|v| v.version)
            .map_err(|e| RuntimeError::Query {
                runtime: self.scheme.clone(),
                operation: "version".into(),
                message: e.to_string(),
            })
    }

    /// CRI `Status`'s conditions (upstream `containerRuntime.Status`); its handlers' features
    /// are kept (upstream `runtimeState.setRuntimeHandlers`).
    async fn status(&self) -> Result<Vec<RuntimeCondition>, RuntimeError> {
        let (conditions, handlers) =
            self.client
                .status()
                .await
                .map_err(|e| RuntimeError::Query {
                    runtime: self.scheme.clone(),
                    operation: "status".into(),
                    message: e.to_string(),
                })?;
        self.supports_rro
            .store(default_handler_supports_rro(&handlers), Ordering::Relaxed);
        *self
            .handlers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = node_runtime_handlers(&handlers);
        Ok(conditions
            .into_iter()
            .map(|c| RuntimeCondition {
                type_: c.r#type,
                status: c.status,
                reason: c.reason,
                message: c.message,
            })
            .collect())
    }

    async fn run_pod_sandbox(&self, pod: &Pod) -> Result<Sandbox, RuntimeError> {
        let uid = PodUid::of(pod);
        let newest = self
            .state()
            .pods
            .get(&uid)
            .and_then(|p| p.sandboxes.first().cloned());
        if let Some(s) = &newest
            && s.ready
        {
            return Ok(Sandbox {
                id: s.id.clone(),
                ready: true,
                host_network: s.host_network,
                ip: s.ip.clone(),
            });
        }
        let failed = |message: String| RuntimeError::CreateSandbox {
            pod: full_name(pod),
            message,
        };
        let attempt = newest.map_or(0, |s| s.attempt + 1);
        let log_dir = self.log_dir(pod).map_err(|e| failed(e.to_string()))?;
        let dir = log_dir.clone();
        tokio::task::spawn_blocking(move || std::fs::create_dir_all(dir))
            .await
            .map_err(|e| failed(e.to_string()))?
            .map_err(|e| failed(format!("creating {}: {e}", log_dir.display())))?;
        let mut config = sandbox_config(pod, attempt, &log_dir, &self.config.cluster_domain)
            .map_err(|e| failed(e.to_string()))?;
        config.labels.extend(self.config.owner_labels());
        if let Some(cgroups) = self.config.pod_cgroups.clone() {
            // upstream: `podContainerManager.EnsureExists` before the sandbox.
            let owned = pod.clone();
            let parent = tokio::task::spawn_blocking(move || cgroups.ensure(&owned))
                .await
                .map_err(|e| failed(e.to_string()))?
                .map_err(|e| failed(format!("making the pod's cgroup: {e}")))?;
            if let Some(linux) = config.linux.as_mut() {
                linux.cgroup_parent = parent;
            }
        }
        let id = self
            .client
            .run_pod_sandbox(config)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let record = self
            .sandbox_record(&id, true)
            .await
            .map_err(|e| failed(e.to_string()))?;
        info!(sandbox = %id, ip = ?record.ip, "sandbox started");
        let sandbox = Sandbox {
            id: record.id.clone(),
            ready: true,
            host_network: record.host_network,
            ip: record.ip.clone(),
        };
        self.update(&uid, |p| p.add_sandbox(record));
        Ok(sandbox)
    }

    async fn start_container(
        &self,
        pod: &Pod,
        container: &Container,
        kind: ContainerKind,
        mounts: &[ContainerMount],
    ) -> Result<(), RuntimeError> {
        self.start_container_with_env_files(pod, container, kind, mounts, &EnvFiles::new())
            .await
    }

    async fn start_container_with_env_files(
        &self,
        pod: &Pod,
        container: &Container,
        kind: ContainerKind,
        mounts: &[ContainerMount],
        env_files: &EnvFiles,
    ) -> Result<(), RuntimeError> {
        let uid = PodUid::of(pod);
        let (sandbox, attempt, never_started) = {
            let state = self.state();
            let record = state.pods.get(&uid);
            let sandbox = record
                .and_then(|p| p.sandboxes.first())
                .filter(|s| s.ready)
                .cloned();
            let of_name = || {
                record
                    .into_iter()
                    .flat_map(|p| &p.containers)
                    .filter(|c| c.instance.name == container.name)
            };
            // `None`: no instance known (the log directory decides, below).
            let attempt = of_name().next().map(|c| {
                u32::try_from(c.instance.attempt)
                    .unwrap_or(0)
                    .saturating_add(1)
            });
            // Instances created and never started (an agent that died between the two) are
            // removed before a new one is made.
            let never_started: Vec<String> = of_name()
                .filter(|c| c.instance.state == InstanceState::Created)
                .map(|c| c.id.clone())
                .collect();
            (sandbox, attempt, never_started)
        };
        for id in never_started {
            info!(container = %container.name, %id, "removing a container that was created and never started");
            match self.client.remove_container(&id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    return Err(waiting(
                        pod,
                        &container.name,
                        "CreateContainerError",
                        e.to_string(),
                    ));
                }
            }
        }
        let Some(sandbox) = sandbox else {
            return Err(RuntimeError::StartContainer {
                pod: full_name(pod),
                container: container.name.clone(),
                message: "the pod has no ready sandbox".into(),
            });
        };
        // The name becomes a directory of the pod's logs: one path component, never more
        // (the API server validates it; a hostile manifest is refused here too).
        let name = container.name.as_str();
        if name.is_empty() || name.contains(['/', '\0']) || name == "." || name == ".." {
            return Err(waiting(
                pod,
                name,
                "CreateContainerConfigError",
                format!("container name {name:?} is not a valid name"),
            ));
        }
        let config_error =
            |message: String| waiting(pod, name, "CreateContainerConfigError", message);
        let log_dir = self.log_dir(pod).map_err(|e| config_error(e.to_string()))?;
        let attempt = match attempt {
            Some(attempt) => attempt,
            None => {
                let dir = logs::container_logs_directory(&log_dir, name)
                    .map_err(|e| config_error(e.to_string()))?;
                let counted =
                    tokio::task::spawn_blocking(move || logs::restart_count_from_log_dir(&dir))
                        .await;
                match counted {
                    Ok(Ok(attempt)) => attempt,
                    // upstream: logged, and the count starts at 0.
                    Ok(Err(e)) => {
                        warn!(container = name, error = %e, "cannot count the restarts from the log directory");
                        0
                    }
                    Err(e) => {
                        warn!(container = name, error = %e, "cannot count the restarts from the log directory");
                        0
                    }
                }
            }
        };
        let mut sandbox_cfg =
            sandbox_config(pod, sandbox.attempt, &log_dir, &self.config.cluster_domain)
                .map_err(|e| config_error(e.to_string()))?;
        sandbox_cfg.labels.extend(self.config.owner_labels());
        if let (Some(cgroups), Some(linux)) = (&self.config.pod_cgroups, sandbox_cfg.linux.as_mut())
        {
            linux.cgroup_parent = pod_cgroup_name(
                &cgroups.root,
                rustlet_core::qos::pod_qos(pod),
                pod.metadata.uid.as_deref().unwrap_or_default(),
            );
        }
        let image_ref = self.ensure_image(pod, container, &sandbox_cfg).await?;
        // upstream: getImageUser (the user a container without `runAsUser` runs as). Asked of
        // the image ID just resolved rather than the spec's name, so that it is the same image.
        let image_user = match self.client.image_status(&image_ref).await {
            Ok(image) => ImageUser::of(image.as_ref()),
            Err(e) => return Err(config_error(e.to_string())),
        };
        let mut sources = self.env_sources(pod, container).await?;
        sources.files = env_files.clone();
        let env = container_env(
            pod,
            container,
            PodAddresses {
                pod_ip: sandbox.ip.as_deref().unwrap_or_default(),
                host_ip: &self.config.node_ip,
            },
            &sources,
        )
        .map_err(|e| {
            waiting(
                pod,
                &container.name,
                "CreateContainerConfigError",
                e.to_string(),
            )
        })?;
        if !env.invalid.is_empty() {
            warn!(
                container = %container.name,
                keys = ?env.invalid,
                "Keys from envFrom were skipped since they are invalid environment variable names"
            );
        }
        // upstream: GenerateRunContainerOptions → GetDeviceRunContainerOptions: the devices
        // the limits name of device plugin resources: those admission allocated (the binary's
        // `ResourceAllocator`), or allocated now when the container has none (upstream's
        // re-allocation; its failure is upstream's `CreateContainerConfigError` too).
        let devices = match self.devices.get() {
            None => ContainerDevices::default(),
            Some(manager) => {
                let limits = container
                    .resources
                    .as_ref()
                    .and_then(|r| r.limits.clone())
                    .unwrap_or_default();
                manager
                    .allocate(uid.as_str(), &container.name, &limits, None)
                    .await
                    .map_err(|e| config_error(e.to_string()))?
            }
        };
        // upstream: GenerateRunContainerOptions: the host name, for every pod.
        let host_name = pod_hostname_and_domain(pod, &self.config.cluster_domain)
            .map_err(|e| config_error(e.to_string()))?;
        // upstream: makeMounts: the kubelet's hosts file, written again at each start.
        let mut mounts = mounts.to_vec();
        if mounts_hosts_file(pod, container, sandbox.ip.as_deref()) {
            let pod_dir = uid
                .as_path_component()
                .map(|uid| self.config.root_dir.join("pods").join(uid))
                .map_err(|e| config_error(e.to_string()))?;
            let host_path = pod_dir.join("etc-hosts");
            let (path, node_hosts) = (host_path.clone(), self.config.node_hosts_file.clone());
            let (pod_copy, pod_ip) = (pod.clone(), sandbox.ip.clone().unwrap_or_default());
            let host_network = sandbox.host_network;
            tokio::task::spawn_blocking(move || -> Result<(), String> {
                let node = if host_network {
                    std::fs::read(&node_hosts)
                        .map_err(|e| format!("reading {}: {e}", node_hosts.display()))?
                } else {
                    Vec::new()
                };
                let source = if host_network {
                    HostsSource::HostNetwork { node_hosts: &node }
                } else {
                    HostsSource::PodNetwork {
                        pod_ips: &[pod_ip.as_str()],
                        name: &host_name,
                    }
                };
                std::fs::create_dir_all(&pod_dir)
                    .and_then(|()| std::fs::write(&path, hosts_file_content(&pod_copy, source)))
                    .and_then(|()| {
                        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
                    })
                    .map_err(|e| format!("writing {}: {e}", path.display()))
            })
            .await
            .map_err(|e| config_error(e.to_string()))?
            .map_err(config_error)?;
            mounts.push(ContainerMount {
                name: "k8s-managed-etc-hosts".into(),
                container_path: ETC_HOSTS_PATH.into(),
                host_path,
                read_only: false,
                recursive_read_only: false,
                propagation: Default::default(),
            });
        }
        // upstream: makeMounts: a new file per instance, bound at `terminationMessagePath`.
        let termination_log = match container
            .termination_message_path
            .as_deref()
            .filter(|p| !p.is_empty())
        {
            None => None,
            Some(_) => {
                let dir = uid
                    .as_path_component()
                    .map(|uid| {
                        self.config
                            .root_dir
                            .join("pods")
                            .join(uid)
                            .join("containers")
                            .join(name)
                    })
                    .map_err(|e| config_error(e.to_string()))?;
                let made = tokio::task::spawn_blocking(move || {
                    termination::create_termination_log(&dir).map_err(|e| {
                        format!("creating the termination log in {}: {e}", dir.display())
                    })
                })
                .await
                .map_err(|e| config_error(e.to_string()))?
                .map_err(config_error)?;
                Some(made)
            }
        };
        // upstream `getTargetID`: an ephemeral container's `targetContainerName` is the newest
        // instance of that name, which must exist.
        let namespace_target = match ephemeral_target(pod, container, kind) {
            None => None,
            Some(target) => {
                let state = self.state();
                let found = state
                    .pods
                    .get(&uid)
                    .into_iter()
                    .flat_map(|p| &p.containers)
                    .find(|c| c.instance.name == target)
                    .map(|c| c.id.clone());
                match found {
                    Some(id) => Some(id),
                    None => {
                        return Err(config_error(format!(
                            "unable to find target container {target}"
                        )));
                    }
                }
            }
        };
        let mut config = container_config(
            pod,
            container,
            &ContainerInputs {
                kind,
                attempt,
                image_ref: &image_ref,
                mounts: &mounts,
                env: &env.vars,
                security: ContainerSecurityInputs {
                    image_user: &image_user,
                    seccomp_profile_root: &self.config.root_dir.join(SECCOMP_PROFILE_DIR),
                    namespace_target: namespace_target.as_deref(),
                },
                termination_log: termination_log.as_deref(),
                node: self.config.node_resources,
            },
        )
        .map_err(|e| config_error(e.to_string()))?;
        add_devices(&mut config, &devices);
        config.labels.extend(self.config.owner_labels());
        let container_log_dir = logs::container_logs_directory(&log_dir, &container.name)
            .map_err(|e| config_error(e.to_string()))?;
        let _ =
            tokio::task::spawn_blocking(move || std::fs::create_dir_all(container_log_dir)).await;
        let id = self
            .client
            .create_container(&sandbox.id, config, sandbox_cfg)
            .await
            .map_err(|e| waiting(pod, &container.name, "CreateContainerError", e.to_string()))?;
        if let Err(e) = self.client.start_container(&id).await {
            // Not left behind as `Created`: the next sync creates a new one.
            let _ = self.client.remove_container(&id).await;
            return Err(waiting(
                pod,
                &container.name,
                "RunContainerError",
                e.to_string(),
            ));
        }
        let record = self.container_record(&id, &sandbox.id).await.map_err(|e| {
            RuntimeError::StartContainer {
                pod: full_name(pod),
                container: container.name.clone(),
                message: e.to_string(),
            }
        })?;
        debug!(container = %container.name, id = %id, "container started");
        // The file containerd writes, as it says (the sandbox's directory and the container's
        // path): a sandbox an older agent made may have another directory.
        if let Some(link) = record.log_symlink.clone()
            && !record.log_path.as_os_str().is_empty()
        {
            self.link_container_log(record.log_path.clone(), link).await;
        }
        self.update(&uid, |p| p.add_container(record));
        // upstream: startContainer's step 4, the postStart hook; its failure kills the
        // container (its `preStop` runs first, as in upstream's `killContainer`) and is the
        // container's `PostStartHookError`.
        if let Some(handler) = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref())
        {
            let instance_id = format!("{}://{id}", self.scheme);
            let pod_ip = sandbox.ip.as_deref().unwrap_or_default();
            let target = HookTarget {
                pod,
                container,
                instance_id: &instance_id,
                pod_ip,
            };
            if let Err(e) = run_hook(self, target, handler).await {
                warn!(container = %container.name, error = %e, "Failed to execute PostStartHook");
                // upstream: the hook's message stays out of the event ("so that secrets won't
                // leak from the server"); the kill's `Killing` event says why.
                self.record(
                    pod,
                    EventKind::Warning,
                    FAILED_POST_START_HOOK,
                    "PostStartHook failed",
                );
                self.record(pod, EventKind::Normal, "Killing", FAILED_POST_START_HOOK);
                let stop = StopContainer {
                    pod: Some(pod),
                    spec: Some(container),
                    id: &id,
                    pod_ip,
                    grace: termination_grace_period(pod),
                    ordering: None,
                };
                if let Err(kill) = self.stop_container(stop).await {
                    warn!(container = %container.name, error = %kill, "Failed to kill container");
                }
                let _ = self.refresh_pod(&uid).await;
                return Err(waiting(
                    pod,
                    &container.name,
                    POST_START_HOOK_ERROR,
                    e.to_string(),
                ));
            }
        }
        Ok(())
    }

    async fn pod_status(&self, uid: &PodUid) -> RuntimePodStatus {
        let state = self.state();
        let Some(record) = state.pods.get(uid) else {
            return RuntimePodStatus::default();
        };
        RuntimePodStatus {
            sandbox: record.sandboxes.first().map(|s| Sandbox {
                id: s.id.clone(),
                ready: s.ready,
                host_network: s.host_network,
                ip: s.ip.clone(),
            }),
            containers: record
                .containers
                .iter()
                .map(|c| c.instance.clone())
                .collect(),
        }
    }

    async fn kill_pod(&self, pod: &Pod, grace: Duration) -> Result<(), RuntimeError> {
        self.stop_pod(&PodUid::of(pod), Some(pod), grace)
            .await
            .map_err(|e| RuntimeError::KillPod {
                pod: full_name(pod),
                message: e.to_string(),
            })
    }

    async fn remove_pod(&self, uid: &PodUid) {
        if let Err(e) = self.remove_all(uid).await {
            // Housekeeping removes it once the worker forgot the pod.
            warn!(%uid, error = %e, "removing the pod's containers failed");
        }
    }

    fn supports_recursive_read_only_mounts(&self) -> bool {
        self.supports_rro.load(Ordering::Relaxed)
    }

    fn runtime_handlers(&self) -> Vec<NodeRuntimeHandler> {
        self.handlers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn runs_probes(&self) -> bool {
        true
    }

    async fn exec_sync(
        &self,
        id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, RuntimeError> {
        let raw = id.split_once("://").map_or(id, |(_, raw)| raw);
        match self.client.exec_sync(raw, cmd.to_vec(), timeout).await {
            Ok(r) => {
                let stderr = String::from_utf8_lossy(&r.stderr).into_owned();
                let mut output = String::from_utf8_lossy(&r.stdout).into_owned();
                output.push_str(&stderr);
                Ok(ExecOutput {
                    exit_code: r.exit_code,
                    output,
                    stderr,
                    timed_out: false,
                })
            }
            Err(CriError::Call {
                code: tonic::Code::DeadlineExceeded,
                ..
            }) => Ok(ExecOutput {
                exit_code: -1,
                output: String::new(),
                stderr: String::new(),
                timed_out: true,
            }),
            Err(e) => Err(RuntimeError::Exec {
                container: id.to_owned(),
                message: e.to_string(),
            }),
        }
    }

    async fn exec_stream(
        &self,
        id: &str,
        cmd: &[String],
        streams: Streams,
    ) -> Result<String, RuntimeError> {
        let raw = raw_id(id);
        let request = cri::ExecRequest {
            container_id: raw.to_owned(),
            cmd: cmd.to_vec(),
            tty: streams.tty,
            stdin: streams.stdin,
            stdout: streams.stdout,
            stderr: streams.stderr,
        };
        self.client
            .exec(request)
            .await
            .map_err(|e| stream_error(format!("exec in container {id}"), &e))
    }

    async fn attach_stream(&self, id: &str, streams: Streams) -> Result<String, RuntimeError> {
        let request = cri::AttachRequest {
            container_id: raw_id(id).to_owned(),
            stdin: streams.stdin,
            tty: streams.tty,
            stdout: streams.stdout,
            stderr: streams.stderr,
        };
        self.client
            .attach(request)
            .await
            .map_err(|e| stream_error(format!("attach to container {id}"), &e))
    }

    async fn port_forward_stream(
        &self,
        uid: &PodUid,
        ports: &[i32],
    ) -> Result<String, RuntimeError> {
        let operation = || format!("port-forward to pod {uid}");
        // upstream: `GetPortForward` uses the pod's newest sandbox.
        let sandbox = self
            .state()
            .pods
            .get(uid)
            .and_then(|p| p.sandboxes.first())
            .map(|s| s.id.clone())
            .ok_or_else(|| RuntimeError::NotFound {
                operation: operation(),
                message: "the pod has no sandbox".into(),
            })?;
        self.client
            .port_forward(&sandbox, ports.to_vec())
            .await
            .map_err(|e| stream_error(operation(), &e))
    }

    async fn container_log(&self, id: &str) -> Result<ContainerLogInfo, RuntimeError> {
        let status = self
            .client
            .container_status(raw_id(id))
            .await
            .map_err(|e| stream_error(format!("the log of container {id}"), &e))?;
        Ok(ContainerLogInfo {
            path: PathBuf::from(status.log_path),
            running: status.state == cri::ContainerState::ContainerRunning as i32,
        })
    }

    /// upstream: the container log manager's `rotateLogs` (`ListContainers`, running only) and
    /// `processContainer` (`ContainerStatus.log_path`): this agent's containers only. One whose
    /// status is gone meanwhile is left out.
    async fn running_container_logs(&self) -> Result<Vec<RunningContainerLog>, RuntimeError> {
        let query = |e: CriError| RuntimeError::Query {
            runtime: self.scheme.clone(),
            operation: "list the running containers' logs".into(),
            message: e.to_string(),
        };
        let running = self
            .client
            .list_running_containers_labelled(&self.config.owner_labels())
            .await
            .map_err(query)?;
        let mut out = Vec::with_capacity(running.len());
        for c in running {
            match self.client.container_status(&c.id).await {
                Ok(status) if !status.log_path.is_empty() => out.push(RunningContainerLog {
                    id: c.id,
                    path: PathBuf::from(status.log_path),
                }),
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(query(e)),
            }
        }
        Ok(out)
    }

    async fn reopen_container_log(&self, id: &str) -> Result<(), RuntimeError> {
        self.client
            .reopen_container_log(raw_id(id))
            .await
            .map_err(|e| stream_error(format!("reopen the log of container {id}"), &e))
    }

    async fn pod_usage(&self) -> Result<Vec<PodUsage>, RuntimeError> {
        let owner = self.config.owner_labels();
        let query = |e: CriError| RuntimeError::Query {
            runtime: self.scheme.clone(),
            operation: "stats".into(),
            message: e.to_string(),
        };
        let sandboxes = self
            .client
            .list_pod_sandboxes_labelled(&owner)
            .await
            .map_err(query)?;
        let containers = self
            .client
            .list_containers_labelled(&owner)
            .await
            .map_err(query)?;
        let container_stats = self
            .client
            .list_container_stats(&owner)
            .await
            .map_err(query)?;
        // An older runtime may not answer it: the pods' figures are then their containers'.
        let sandbox_stats = match self.client.list_pod_sandbox_stats(&owner).await {
            Ok(stats) => stats,
            Err(e) => {
                debug!(error = %e, "ListPodSandboxStats");
                Vec::new()
            }
        };
        Ok(crate::stats::pod_usage(
            &crate::stats::CriLists {
                sandboxes,
                containers,
                container_stats,
                sandbox_stats,
            },
            &self.scheme,
        ))
    }

    async fn image_fs_usage(&self) -> Result<Vec<FsUsage>, RuntimeError> {
        let filesystems = self
            .client
            .image_fs_info()
            .await
            .map_err(|e| RuntimeError::Query {
                runtime: self.scheme.clone(),
                operation: "image filesystem stats".into(),
                message: e.to_string(),
            })?;
        Ok(filesystems.iter().map(crate::stats::fs).collect())
    }

    async fn kill_container(
        &self,
        pod: &Pod,
        id: &str,
        grace: Duration,
    ) -> Result<(), RuntimeError> {
        let raw = id.split_once("://").map_or(id, |(_, raw)| raw);
        let failed = |e: CriError| RuntimeError::KillPod {
            pod: full_name(pod),
            message: e.to_string(),
        };
        let (name, pod_ip) = {
            let state = self.state();
            let record = state.pods.get(&PodUid::of(pod));
            let name = record
                .and_then(|p| p.containers.iter().find(|c| c.id == raw))
                .map(|c| c.instance.name.clone());
            let pod_ip = record
                .and_then(|p| p.sandboxes.first())
                .and_then(|s| s.ip.clone());
            (name, pod_ip)
        };
        let stop = StopContainer {
            pod: Some(pod),
            spec: name.as_deref().and_then(|n| spec_container(pod, n)),
            id: raw,
            pod_ip: pod_ip.as_deref().unwrap_or_default(),
            grace,
            ordering: None,
        };
        match self.stop_container(stop).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(failed(e)),
        }
        self.refresh_pod(&PodUid::of(pod)).await.map_err(failed)
    }

    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<PodUid>> {
        Some(self.events.subscribe())
    }

    fn pods_that_may_run(&self) -> HashSet<PodUid> {
        self.state()
            .pods
            .iter()
            .filter(|(_, p)| {
                p.sandboxes.iter().any(|s| s.ready)
                    || p.containers
                        .iter()
                        .any(|c| c.cri_state != cri::ContainerState::ContainerExited as i32)
            })
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    async fn remove_orphans(&self, keep: &HashSet<PodUid>) {
        let orphans: Vec<PodUid> = {
            let mut state = self.state();
            let found: Vec<PodUid> = state
                .pods
                .iter()
                .filter(|(uid, p)| {
                    let empty = p.sandboxes.is_empty() && p.containers.is_empty();
                    !empty && !keep.contains(*uid)
                })
                .map(|(uid, _)| uid.clone())
                .collect();
            found
                .into_iter()
                .filter(|uid| state.removing.insert(format!("pod:{uid}")))
                .collect()
        };
        let Some(this) = self.me.upgrade() else {
            return;
        };
        for uid in orphans {
            let this = this.clone();
            info!(%uid, "stopping and removing the containers of a pod no worker knows");
            tokio::spawn(async move {
                let result = match this.stop_pod(&uid, None, this.config.orphan_grace).await {
                    Ok(()) => this.remove_all(&uid).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = result {
                    warn!(%uid, error = %e, "removing an orphaned pod failed; retrying later");
                }
                this.state().removing.remove(&format!("pod:{uid}"));
            });
        }
    }

    fn next_change(&self, uid: &PodUid) -> Option<Instant> {
        let state = self.state();
        let now = Instant::now();
        let running = state.pods.get(uid).is_some_and(|p| {
            p.containers
                .iter()
                .any(|c| !matches!(c.instance.state, InstanceState::Exited { .. }))
        });
        // A pod in image pull back-off is looked at again soon, so that its containers show
        // `ImagePullBackOff` between the pulls, as upstream's do.
        let backing_off = state
            .pulls
            .iter()
            .any(|((pod, _), b)| pod == uid && b.until > now);
        if backing_off {
            // The next relist may see it change: wake just after it.
            let next = state
                .last_relist
                .map_or(now, |at| at + self.config.relist_period)
                .max(now);
            return Some(next + Duration::from_millis(10));
        }
        // A relist announces what changes by itself (`changes`); this is the safety net.
        running.then(|| now + self.config.worker_resync)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A relist that listed a container between its `StartContainer` and the runtime's own
    /// record of it (seen once under load in `cri_probes_flip_readiness_both_ways_and_a_failed_liveness_probe_restarts`:
    /// the restarted container was its own `lastState`, `running`): the container is in the
    /// pod's record once, the newest; so is a sandbox.
    #[test]
    fn a_started_container_a_relist_already_listed_is_recorded_once() {
        let container = |id: &str, attempt: i32| ContainerRecord {
            id: id.into(),
            sandbox_id: "s".into(),
            cri_state: cri::ContainerState::ContainerRunning as i32,
            instance: ContainerInstance {
                id: format!("containerd://{id}"),
                name: "app".into(),
                kind: ContainerKind::Regular,
                image: "busybox".into(),
                image_id: String::new(),
                attempt,
                state: InstanceState::Running {
                    started_at: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                },
                sandbox_id: "s".into(),
                hash: None,
            },
            created_at: i64::from(attempt),
            log_path: PathBuf::new(),
            log_symlink: None,
        };
        let mut record = PodRecord::default();
        record.add_container(container("old", 0));
        // The relist's copy of the new container, then the start's own.
        record.add_container(container("new", 1));
        record.add_container(container("new", 1));
        let ids: Vec<&str> = record.containers.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["new", "old"]);
        let sandbox = |id: &str| SandboxRecord {
            id: id.into(),
            attempt: 0,
            ready: true,
            host_network: false,
            ip: None,
            created_at: 0,
        };
        record.add_sandbox(sandbox("s"));
        record.add_sandbox(sandbox("s"));
        assert_eq!(record.sandboxes.len(), 1);
    }

    /// Issue 27 (node features), upstream `runtimeClassSupportsRecursiveReadOnlyMounts` for a
    /// pod without a runtime class: only the default handler's (`""`) feature counts; a runtime
    /// that reports no handlers (containerd 1.6) does not support recursive read-only mounts.
    #[test]
    fn the_default_handlers_features_say_whether_recursive_read_only_mounts_work() {
        let handler = |name: &str, rro: Option<bool>| cri::RuntimeHandler {
            name: name.into(),
            features: rro.map(|recursive_read_only_mounts| cri::RuntimeHandlerFeatures {
                recursive_read_only_mounts,
                ..Default::default()
            }),
        };
        assert!(!default_handler_supports_rro(&[]));
        assert!(default_handler_supports_rro(&[handler("", Some(true))]));
        assert!(!default_handler_supports_rro(&[handler("", Some(false))]));
        assert!(!default_handler_supports_rro(&[handler("", None)]));
        assert!(!default_handler_supports_rro(&[
            handler("runc", Some(true)),
            handler("", Some(false)),
        ]));
        // The node's `status.runtimeHandlers` (upstream `toKubeRuntimeStatus`): a handler
        // without features supports neither.
        let node = node_runtime_handlers(&[handler("", Some(true)), handler("kata", None)]);
        let said = |h: &NodeRuntimeHandler| {
            let f = h.features.clone().unwrap();
            (
                h.name.clone().unwrap(),
                f.recursive_read_only_mounts,
                f.user_namespaces,
            )
        };
        assert_eq!(
            node.iter().map(said).collect::<Vec<_>>(),
            [
                (String::new(), Some(true), Some(false)),
                ("kata".to_owned(), Some(false), Some(false)),
            ]
        );
    }

    fn container(id: &str, sandbox: &str, name: &str, exited: bool) -> ContainerRecord {
        let state = if exited {
            InstanceState::Exited {
                started_at: Timestamp::UNIX_EPOCH,
                finished_at: Timestamp::UNIX_EPOCH,
                exit_code: 1,
                reason: "Error".into(),
                message: String::new(),
            }
        } else {
            InstanceState::Running {
                started_at: Timestamp::UNIX_EPOCH,
            }
        };
        ContainerRecord {
            id: id.into(),
            sandbox_id: sandbox.into(),
            cri_state: 0,
            created_at: 0,
            log_path: PathBuf::new(),
            log_symlink: None,
            instance: ContainerInstance {
                id: format!("containerd://{id}"),
                name: name.into(),
                kind: ContainerKind::Regular,
                image: String::new(),
                image_id: String::new(),
                attempt: 0,
                state,
                sandbox_id: sandbox.into(),
                hash: None,
            },
        }
    }

    fn sandbox(id: &str, ready: bool) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            attempt: 0,
            ready,
            host_network: false,
            ip: None,
            created_at: 0,
        }
    }

    /// Item 16: the image pull back-off entries of a removed pod are dropped; another pod's
    /// stay.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_removed_pods_image_pull_back_offs_are_dropped() {
        let Some(containerd) = crate::testing::PrivateContainerd::start(
            "a_removed_pods_image_pull_back_offs_are_dropped",
        )
        .await
        else {
            return;
        };
        let root = crate::testing::scratch(&containerd, "root");
        let runtime = CriRuntime::connect(CriConfig::new(containerd.endpoint(), root), None)
            .await
            .unwrap();
        let pod = |uid: &str| Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(uid.into()),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        // No registry: every pull fails and backs off.
        let absent = Container {
            name: "main".into(),
            image: Some("localhost/absent:1".into()),
            ..Default::default()
        };
        for uid in ["gone", "stays"] {
            let pulled = runtime
                .ensure_image(&pod(uid), &absent, &cri::PodSandboxConfig::default())
                .await;
            assert!(
                matches!(&pulled, Err(RuntimeError::ContainerWaiting { reason, .. }) if reason == "ErrImagePull"),
                "{pulled:?}"
            );
        }
        let backing_off = |runtime: &CriRuntime| {
            let mut uids: Vec<String> = runtime
                .state()
                .pulls
                .keys()
                .map(|(uid, _)| uid.to_string())
                .collect();
            uids.sort();
            uids
        };
        assert_eq!(backing_off(&runtime), ["gone", "stays"]);
        runtime.remove_pod(&PodUid::new("gone")).await;
        assert_eq!(backing_off(&runtime), ["stays"]);
    }

    /// Item 8: CRI's `CONTAINER_UNKNOWN` is not an exit with code 0 (which let a run-once pod
    /// go Succeeded while its process might still run).
    #[test]
    fn a_container_unknown_status_is_an_unknown_instance_not_completed() {
        let status = cri::ContainerStatus {
            state: cri::ContainerState::ContainerUnknown as i32,
            exit_code: 0,
            ..Default::default()
        };
        assert_eq!(
            instance_state(&status, String::new()),
            InstanceState::Unknown
        );
        let exited = cri::ContainerStatus {
            state: cri::ContainerState::ContainerExited as i32,
            exit_code: 0,
            ..Default::default()
        };
        assert!(matches!(
            instance_state(&exited, String::new()),
            InstanceState::Exited { exit_code: 0, ref reason, .. } if reason == "Completed"
        ));
    }

    #[test]
    fn garbage_keeps_the_newest_two_of_a_name_and_sandboxes_still_holding_them() {
        let pod = PodRecord {
            // Newest first.
            sandboxes: vec![
                sandbox("s3", true),
                sandbox("s2", false),
                sandbox("s1", false),
            ],
            containers: vec![
                container("c4", "s3", "app", false),
                container("c3", "s2", "app", true),
                container("c2", "s1", "app", true),
                container("c1", "s1", "app", true),
                container("x1", "s3", "other", true),
            ],
            touched: 0,
        };
        let found = garbage(&HashMap::from([(PodUid::new("u"), pod)]));
        // c4 runs and c3 is its lastState: both kept; c2 and c1 go, and with them the only
        // reason to keep s1; s2 still holds c3; the ready sandbox is never collected.
        assert_eq!(found.containers, ["c2", "c1"]);
        assert_eq!(found.sandboxes, ["s1"]);
    }
}
