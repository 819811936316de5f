//! Wiring: one agent from an [`AgentConfig`]. Every rule lives in a library; this module only
//! builds the pieces, connects their seams and runs them until a signal.

use std::fs::File;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::fcntl::{Flock, FlockArg};
use prometheus_client::registry::Registry;
use rustlet_api::content::ObjectSourceConfig;
use rustlet_api::local::LocalPodStatusClient;
use rustlet_api::local::manifests::DirectorySync;
use rustlet_api::local::store::{Store, StoreConfig};
use rustlet_api::node::machine::{HostMachine, Machine as _};
use rustlet_api::node::{DevicePlugins, NodeConfig, NodeRegistrar, NodeRuntime};
use rustlet_api::static_pods::{MirrorPods, StaticPodSource, StaticPodWorkers};
use rustlet_api::{
    ApiObjects, Backend, ClientConfig, KubeEventRecorder, KubePodStatusClient, KubeRetries,
    NodeCache, PodCache, build_clients,
};
use rustlet_core::PodUid;
use rustlet_core::node_status::RuntimeCondition;
use rustlet_cri::cgroups::PodCgroupsConfig;
use rustlet_cri::deviceplugin::DeviceManager;
use rustlet_cri::{CriConfig, CriRuntime};
use rustlet_pods::admission::{AdmitHandlers, ResourceAllocator};
use rustlet_pods::apparmor::AppArmorHost;
use rustlet_pods::sysctl::Allowlist;
use rustlet_pods::{
    PodLifecycles, PodWorkers, PodWorkersConfig, PodWorkersDeps, Runtime, SimulatedConfig,
    SimulatedRuntime,
};
use rustlet_status::{
    PodStatusClient, RetryPolicy, StatusManager, StatusManagerConfig, StatusManagerDeps,
    StatusMetrics, SystemClock,
};
use rustlet_volume::claims::NodeIdentity;
use rustlet_volume::events::{EventRecorder, LoggedEvents};
use rustlet_volume::manager::{VolumeManager, VolumeManagerConfig, VolumeManagerDeps};
use rustlet_volume::node::{NodeStatus, NothingAttached};
use rustlet_volume::objects::VolumeObjects;
use rustlet_volume::plugins::builtin_plugins;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::{
    AgentConfig, HealthzEndpoint, KubeletServer, LogRotation, Mode, ReadOnlyEndpoints, RuntimeKind,
};
use crate::http::{Endpoints, Health, healthz_router, router};
use crate::process::ProcessMetrics;
use crate::stats::{StatsDeps, StatsProvider};
use rustlet_server::stats::cgroup::StatsRoots;

/// How long the HTTP server and the other tasks get to stop after the status flush.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Takes `<root>/rustlet.lock` (flock: the kernel releases it when the holder dies, so a
/// restart after `kill -9` is never blocked); a second agent on the same root is refused.
fn lock_root(root: &Path) -> Result<Flock<File>> {
    std::fs::create_dir_all(root)
        .with_context(|| format!("creating --root-dir {}", root.display()))?;
    let path = root.join("rustlet.lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(lock),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => bail!(
            "another rustlet already runs on --root-dir {} (it holds {}): one agent per root directory",
            root.display(),
            path.display()
        ),
        Err((_, e)) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}

/// Where the agent's objects come from and go to.
struct Api {
    backend: Backend,
    status_client: Arc<dyn PodStatusClient>,
    events: Arc<dyn EventRecorder>,
    /// Cluster mode: registers the Node, keeps its status, renews its Lease, reports
    /// `volumesInUse`.
    registrar: Option<NodeRegistrar>,
    /// Cluster mode: the client mirror pods are written with.
    client: Option<kube::Client>,
    /// Local mode: the manifest intake, stopped after the statuses' last flush (its last act
    /// keeps the finished pods' statuses for the next start).
    intake: Option<(CancellationToken, JoinHandle<()>)>,
}

async fn connect(config: &AgentConfig, registry: &mut Registry) -> Result<Api> {
    let kube_config = match &config.mode {
        Mode::Local(dir) => {
            let store = Arc::new(Store::with_config(
                Arc::new(SystemClock),
                StoreConfig::in_process(),
            ));
            // Pods without a UID of their own keep theirs across restarts through this file,
            // so a restart adopts their mounts.
            // And finished pods keep their statuses, so a restart does not run them again.
            let manifests = DirectorySync::new(dir, &config.node_name, store.clone())
                .with_uid_state(config.root_dir.join("local-pod-uids.json"))?
                .with_status_state(config.root_dir.join("local-pod-statuses.json"))?;
            // The first scan before anything reads the store, so the pod source is complete
            // when it says it is ready.
            let (manifests, report) = manifests
                .sync_on_blocking_pool()
                .await
                .context("the first scan of the manifest directory was interrupted")?;
            for error in &report.errors {
                warn!("{error}");
            }
            // As upstream's kubelet without an API server: events are logged (at debug level,
            // upstream's verbosity 3), not kept; nothing could read them from the agent's store.
            info!("no API server: events are logged at debug level, not sent");
            let stop = CancellationToken::new();
            let intake = tokio::spawn(manifests.run(stop.clone()));
            return Ok(Api {
                backend: Backend::Local(store.clone()),
                status_client: Arc::new(LocalPodStatusClient::new(store.clone())),
                events: Arc::new(LoggedEvents),
                registrar: None,
                client: None,
                intake: Some((stop, intake)),
            });
        }
        Mode::Kubeconfig(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        Mode::InCluster => kube::Config::incluster().context("in-cluster configuration")?,
    };
    let node = NodeConfig {
        node_ip: Some(config.node_ip.clone()),
        labels: config.node_labels.clone(),
        taints: config.register_with_taints.clone(),
        max_pods: config.max_pods,
        kubelet_port: i32::from(config.port),
        lease_duration_seconds: config.node_lease_duration_seconds,
        renew_interval: config.node_lease_renew_interval,
        status_update_frequency: config.node_status_update_frequency,
        status_report_frequency: config.node_status_report_frequency,
        eviction: config.eviction_hard,
        ..NodeConfig::for_host(&config.node_name)
    };
    let lease_duration =
        Duration::from_secs(u64::try_from(node.lease_duration_seconds).unwrap_or(40));
    // upstream: the kubelet's kube, event and heartbeat clients: events have their own
    // bucket, and the Lease and node status none, so neither waits behind the other traffic.
    let clients = build_clients(
        kube_config,
        &ClientConfig {
            qps: config.api_qps,
            burst: config.api_burst,
            // One retry policy: the status manager's back-off and the rate limiter.
            retries: KubeRetries::Off,
            event_qps: config.event_qps,
            event_burst: config.event_burst,
            heartbeat_timeout: config.node_lease_renew_interval.min(lease_duration),
        },
    )
    .context("building the API clients")?;
    let client = clients.main.clone();
    // The runtime is set once it is built (`run`).
    let registrar = NodeRegistrar::new(clients.heartbeat.clone(), node)
        .with_machine(Arc::new(HostMachine::new(&config.root_dir)));
    let events = KubeEventRecorder::new(clients.events.clone(), "kubelet", &config.node_name);
    events.register_metrics(registry);
    Ok(Api {
        backend: Backend::Cluster(client.clone()),
        status_client: Arc::new(KubePodStatusClient::new(client.clone())),
        events: Arc::new(events),
        registrar: Some(registrar),
        client: Some(client),
        intake: None,
    })
}

/// upstream's resource allocation admit handler over the device manager: each container's
/// device plugin resources, init containers first (`rustlet-pods` cannot name `rustlet-cri`).
/// The pods bound to the node that are not terminal are the active ones; the others' devices
/// are free again. A pod the runtime may already run (after an agent restart) is not
/// allocated at admission (upstream: a container already running has its devices): its
/// containers are allocated when they start again.
struct DeviceAllocator {
    manager: DeviceManager,
    pods: Arc<PodCache>,
    runtime: Arc<dyn Runtime>,
}

/// A container's resource limits.
type Limits =
    std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>;

/// The containers of `pod` that ask for a device plugin resource, init containers first, with
/// their limits (upstream's `allocateContainerResources` skips the other resources).
fn device_requests(
    pod: &k8s_openapi::api::core::v1::Pod,
    is_device_resource: impl Fn(&str) -> bool,
) -> Vec<(&str, &Limits)> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .filter_map(|container| {
            let limits = container.resources.as_ref()?.limits.as_ref()?;
            limits
                .keys()
                .any(|resource| is_device_resource(resource))
                .then_some((container.name.as_str(), limits))
        })
        .collect()
}

#[async_trait::async_trait]
impl ResourceAllocator for DeviceAllocator {
    async fn allocate(&self, pod: &k8s_openapi::api::core::v1::Pod) -> Result<(), String> {
        // Issue 29: a pod that asks for no device is admitted without looking at the node's
        // other pods (upstream updates the allocated devices only before an allocation); that
        // look is O(pods), and a storm admits every pod in turn.
        let requests = device_requests(pod, |r| self.manager.is_device_plugin_resource(r));
        if requests.is_empty() {
            return Ok(());
        }
        let uid = PodUid::of(pod);
        if self.runtime.pods_that_may_run().contains(&uid) {
            return Ok(());
        }
        let mut active: std::collections::BTreeSet<String> = self
            .pods
            .pods()
            .iter()
            .filter(|p| {
                !p.status
                    .as_ref()
                    .is_some_and(rustlet_core::pod::is_phase_terminal)
            })
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        active.insert(uid.as_str().to_owned());
        for (container, limits) in requests {
            self.manager
                .allocate(uid.as_str(), container, limits, Some(&active))
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// The device manager as the node status asks it (`rustlet-api` cannot name `rustlet-cri`).
struct DevicePluginsForNode(DeviceManager);

impl DevicePlugins for DevicePluginsForNode {
    fn resources(&self) -> rustlet_core::node_status::DevicePluginResources {
        self.0.resources()
    }
}

/// The pod workers' runtime as the node status asks it (`rustlet-api` cannot name
/// `rustlet-pods`).
struct RuntimeForNode(Arc<dyn Runtime>);

#[async_trait::async_trait]
impl NodeRuntime for RuntimeForNode {
    fn type_name(&self) -> String {
        self.0.type_name()
    }

    async fn version(&self) -> Result<String, String> {
        self.0.version().await.map_err(|e| e.to_string())
    }

    async fn status(&self) -> Result<Vec<RuntimeCondition>, String> {
        self.0.status().await.map_err(|e| e.to_string())
    }

    fn runtime_handlers(&self) -> Vec<k8s_openapi::api::core::v1::NodeRuntimeHandler> {
        self.0.runtime_handlers()
    }
}

/// The pod workers' lifecycle table as the mirror pods' view of the static pods (W9, W30).
struct StaticPodsForMirrors(Arc<PodLifecycles>);

impl StaticPodWorkers for StaticPodsForMirrors {
    fn is_syncing(&self, uid: &PodUid) -> bool {
        self.0.is_static_pod_syncing(uid)
    }

    fn is_terminating(&self, namespace: &str, name: &str) -> bool {
        self.0.static_pod_may_run(namespace, name)
    }

    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.subscribe_static()
    }
}

/// Spawns a long-running task; if it ends while the agent runs, health says so.
fn supervise(
    name: &'static str,
    health: &Arc<Health>,
    cancel: &CancellationToken,
    task: JoinHandle<()>,
) -> JoinHandle<()> {
    let (health, cancel) = (health.clone(), cancel.clone());
    tokio::spawn(async move {
        let result = task.await;
        if !cancel.is_cancelled() {
            let reason = match result {
                Ok(()) => format!("{name} stopped"),
                Err(e) => format!("{name} failed: {e}"),
            };
            warn!("{reason}");
            health.set_failed(reason);
        }
    })
}

/// Runs the agent until SIGTERM or SIGINT; then stops taking work, flushes pending statuses
/// (bounded) and returns, leaving every mount in place.
pub async fn run(config: AgentConfig) -> Result<()> {
    let _lock = lock_root(&config.root_dir)?;
    let admit_handlers = admit_handlers(&config)?;
    let started_at = k8s_openapi::jiff::Timestamp::now();
    let cgroup_tree = |root: &str| PodCgroupsConfig {
        mount: "/sys/fs/cgroup".into(),
        root: root.to_owned(),
    };
    // upstream `setupNode`: the kubelet moves itself into `kubeletCgroups`.
    if let Some(name) = &config.system_cgroups.kubelet {
        cgroup_tree("/")
            .move_process(name, std::process::id())
            .with_context(|| format!("moving the agent into kubeletCgroups {name}"))?;
    }
    // upstream `enforceNodeAllocatableCgroups` and the QoS container manager's `Start`: the
    // pods' cgroup limited to the node's allocatable (its capacity: no reservations here),
    // with its QoS cgroups (the pod cgroups are the CRI runtime's).
    let pod_cgroup_root = match config.runtime {
        RuntimeKind::Cri => config.pod_cgroup_root.as_deref(),
        RuntimeKind::Simulated => None,
    };
    if let Some(root) = pod_cgroup_root {
        let figures = HostMachine::new(&config.root_dir).figures();
        cgroup_tree(root)
            .ensure_top_level_cgroups(figures.cpus, figures.memory_bytes)
            .with_context(|| format!("making the pods' cgroup under cgroupRoot {root}"))?;
    }
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let cancel = CancellationToken::new();
    let health = Arc::new(Health::starting(
        "starting: the managers are not running yet",
    ));
    let mut registry = Registry::default();
    let listener = match config.read_only {
        ReadOnlyEndpoints::Off => None,
        ReadOnlyEndpoints::Listen(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--listen {addr}"))?,
        ),
    };
    let mut api = connect(&config, &mut registry).await?;

    let pods = Arc::new(match config.pod_manifest_path {
        Some(_) => PodCache::with_static_source(),
        None => PodCache::new(),
    });
    // Cluster mode: `volumesAttached` from a watch of this Node, which reconstruction reads
    // before anything is unmounted (V74). Local mode has no attach/detach controller: nothing
    // is attached, and reconstructed volumes need not wait.
    let nodes = api.registrar.is_some().then(|| Arc::new(NodeCache::new()));
    let node_status: Arc<dyn NodeStatus> = match &nodes {
        Some(nodes) => nodes.clone(),
        None => Arc::new(NothingAttached),
    };
    let lifecycles = Arc::new(PodLifecycles::new());
    // ConfigMaps and Secrets of content volumes and containers' environment, watched per registered pod.
    let objects: Arc<dyn VolumeObjects> = Arc::new(ApiObjects::new(
        api.backend.clone(),
        ObjectSourceConfig::default(),
    ));
    let (runtime, cri): (Arc<dyn Runtime>, _) = match config.runtime {
        RuntimeKind::Simulated => (
            Arc::new(SimulatedRuntime::new(SimulatedConfig {
                node_ip: config.node_ip.clone(),
                pod_ip_base: config.simulated_pod_ip_base,
                start_delay: config.simulated_start_delay,
                ..SimulatedConfig::default()
            })),
            None,
        ),
        RuntimeKind::Cri => {
            let cri = CriRuntime::connect(
                CriConfig {
                    node_ip: config.node_ip.clone(),
                    node_name: config.node_name.clone(),
                    pod_logs_dir: config.logs.pod_logs_dir.clone(),
                    container_logs_dir: config.logs.container_logs_dir.clone(),
                    pod_cgroups: config.pod_cgroup_root.clone().map(|root| PodCgroupsConfig {
                        mount: "/sys/fs/cgroup".into(),
                        root,
                    }),
                    ..CriConfig::new(&config.container_runtime_endpoint, &config.root_dir)
                },
                Some(objects.clone()),
            )
            .await
            .context("--runtime cri")?;
            // The lifecycle hooks' failures are events on the pod.
            cri.set_event_recorder(api.events.clone());
            // upstream `setupDataDirs` (after the runtime answered, as in upstream's `Run`): the
            // root directory is a shared mount, so that a container's `Bidirectional` mount
            // below a volume reaches the volume's directory (the runtime refuses such a mount
            // from a source that is not shared) and the pod's other containers.
            let root = config.root_dir.clone();
            tokio::task::spawn_blocking(move || {
                let root = std::fs::canonicalize(&root)?;
                rustlet_mount::LinuxMounter::new()
                    .make_rshared(&root)
                    .map_err(std::io::Error::other)
            })
            .await
            .context("making --root-dir a shared mount")?
            .with_context(|| {
                format!(
                    "making --root-dir {} a shared mount",
                    config.root_dir.display()
                )
            })?;
            (cri.clone() as Arc<dyn Runtime>, Some(cri))
        }
    };

    // Cluster mode: the device plugins register on `<devicePluginsDir>/kubelet.sock`, and
    // the node status reports their resources (local mode has no node status). Deviation:
    // upstream's kubelet does not start when its registration server cannot; here the agent
    // runs on without device plugins and says so (a unix socket's path has at most 107
    // bytes: a deep root's default directory may be too long for one).
    let device_manager = match &api.registrar {
        Some(_) => {
            let manager = DeviceManager::new(&config.device_plugins_dir);
            match manager.start(cancel.clone()).await {
                Ok(()) => Some(manager),
                Err(e) => {
                    error!("device plugins are off (devicePluginsDir): {e}");
                    None
                }
            }
        }
        None => None,
    };
    // Containers whose limits name a device plugin resource get its devices.
    if let (Some(manager), Some(cri)) = (&device_manager, &cri) {
        cri.set_device_manager(manager.clone());
    }
    // The node status asks the runtime for its version and conditions.
    let registrar = api.registrar.take().map(|r| {
        let r = r.with_runtime(Arc::new(RuntimeForNode(runtime.clone())));
        let r = match &device_manager {
            Some(manager) => r.with_device_plugins(Arc::new(DevicePluginsForNode(manager.clone()))),
            None => r,
        };
        Arc::new(match &nodes {
            Some(nodes) => r.with_node_cache(nodes.clone()),
            None => r,
        })
    });

    let volumes = Arc::new(VolumeManager::new(
        VolumeManagerDeps {
            pods: pods.clone(),
            states: lifecycles.clone(),
            mounter: Arc::new(rustlet_mount::LinuxMounter::new()),
            plugins: builtin_plugins(),
            events: api.events.clone(),
            node: node_status,
            objects: Some(objects),
        },
        VolumeManagerConfig {
            node: NodeIdentity::new(&config.node_name),
            // A Memory emptyDir without limits, and downward API limits, use it.
            node_allocatable_memory: Some(rustlet_api::node::host_memory_bytes())
                .filter(|m| *m > 0),
            ..VolumeManagerConfig::new(&config.root_dir)
        },
    ));
    volumes.register_metrics(&mut registry);

    let status_metrics = StatusMetrics::default();
    status_metrics.register(&mut registry);
    let mut deps = StatusManagerDeps::new(
        Some(api.status_client.clone()),
        pods.clone(),
        lifecycles.clone(),
    );
    deps.metrics = status_metrics;
    let status = Arc::new(StatusManager::new(
        deps,
        StatusManagerConfig {
            sync_period: config.status_sync_period,
            api_qps: config.api_qps,
            api_burst: config.api_burst,
            max_concurrent_syncs: config.status_sync_concurrency,
            kick_interval: config.status_kick_interval,
            request_timeout: config.api_request_timeout,
            retry: RetryPolicy::default(),
            ..StatusManagerConfig::default()
        },
    ));
    let process = ProcessMetrics::default();
    process.register(&mut registry);

    // The sources first: the pod cache says it is ready after its first list.
    let mut tasks = Vec::new();
    {
        let (pods, backend, node) = (pods.clone(), api.backend.clone(), config.node_name.clone());
        let task = tokio::spawn(async move { pods.run(&backend, &node).await });
        tasks.push(supervise("the pod watch", &health, &cancel, task));
    }
    if let Some(nodes) = &nodes {
        let (nodes, backend, node) = (nodes.clone(), api.backend.clone(), config.node_name.clone());
        let mut changes = nodes.subscribe();
        let task = tokio::spawn(async move { nodes.run(&backend, &node).await });
        tasks.push(supervise("the node watch", &health, &cancel, task));
        // A change of the node status wakes the volume manager (attach waits, V74).
        let volumes = volumes.clone();
        tasks.push(tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                volumes.node_status_updated();
            }
        }));
    }
    if let Some(dir) = &config.pod_manifest_path {
        let source = StaticPodSource::new(dir, &config.node_name);
        let task = tokio::spawn(source.run(pods.clone(), cancel.clone()));
        tasks.push(supervise("the static pod source", &health, &cancel, task));
        if let Some(client) = &api.client {
            let workers = Arc::new(StaticPodsForMirrors(lifecycles.clone()));
            let mirrors = MirrorPods::new(client.clone(), &config.node_name, workers);
            let task = tokio::spawn(mirrors.run(pods.clone(), cancel.clone()));
            tasks.push(supervise("the mirror pods", &health, &cancel, task));
        }
    }
    if let Some(registrar) = &registrar {
        let (lease, c) = (registrar.clone(), cancel.clone());
        let task = tokio::spawn(async move { lease.run(c).await });
        tasks.push(supervise("node registration", &health, &cancel, task));
        let (registrar, volumes, c) = (registrar.clone(), volumes.clone(), cancel.clone());
        let task = tokio::spawn(async move {
            volumes.report_volumes_in_use(registrar.as_ref(), c).await;
        });
        tasks.push(supervise("volumesInUse reporting", &health, &cancel, task));
    }
    // Cluster mode: the Services of the containers' environment.
    if let (Some(cri), Some(client)) = (&cri, &api.client) {
        let services = Arc::new(crate::services::ApiServices::default());
        cri.set_services(services.clone());
        let task = tokio::spawn(services.run(client.clone(), cancel.clone()));
        tasks.push(supervise("the service watch", &health, &cancel, task));
    }
    if let Some(cri) = cri {
        let task = tokio::spawn(cri.clone().run(cancel.clone()));
        tasks.push(supervise(
            "the container runtime relist",
            &health,
            &cancel,
            task,
        ));
        // The kubelet's container log manager runs for the CRI runtime (the simulated one
        // writes no logs).
        if let LogRotation::Rotate(rotation) = config.logs.rotation {
            let task = tokio::spawn(crate::logs::run(
                cri as Arc<dyn Runtime>,
                rotation,
                cancel.clone(),
            ));
            tasks.push(supervise(
                "the container log manager",
                &health,
                &cancel,
                task,
            ));
        }
    }
    let status_task = status
        .start(cancel.clone())
        .context("the status manager has no API client")?;
    {
        let task = tokio::spawn(volumes.clone().run(cancel.clone()));
        tasks.push(supervise("the volume manager", &health, &cancel, task));
    }
    let node_runtime = runtime.clone();
    let workers = PodWorkers::new(
        PodWorkersDeps {
            pods: pods.clone(),
            changes: pods.subscribe(),
            lifecycles,
            status: status.clone(),
            volumes: volumes.clone(),
            runtime,
            // gRPC probes run from the agent, whichever the runtime (upstream's prober).
            grpc: Some(Arc::new(rustlet_cri::GrpcHealthProber::new())),
            events: api.events.clone(),
        },
        PodWorkersConfig {
            host_ips: vec![config.node_ip.clone()],
            admit_handlers,
            ..PodWorkersConfig::new(&config.root_dir)
        },
    );
    if let Some(manager) = &device_manager {
        workers.set_resource_allocator(Arc::new(DeviceAllocator {
            manager: manager.clone(),
            pods: pods.clone(),
            runtime: node_runtime.clone(),
        }));
    }
    let probe_counts = workers.probe_counts();
    {
        let task = tokio::spawn(workers.run(cancel.clone()));
        tasks.push(supervise("the pod workers", &health, &cancel, task));
    }

    // What the kubelet server and the read-only port answer `/stats` and `/metrics/*` with.
    let stats = Arc::new(StatsProvider::new(StatsDeps {
        node_name: config.node_name.clone(),
        root_dir: config.root_dir.clone(),
        roots: StatsRoots::default(),
        runtime: node_runtime.clone(),
        pods: pods.clone(),
        volumes: volumes.clone(),
        system_cgroups: crate::stats::SystemCgroups {
            kubelet: config.system_cgroups.kubelet.clone(),
            runtime: config.system_cgroups.runtime.clone(),
            misc: config.system_cgroups.system.clone(),
            pods: pod_cgroup_root
                .map_or_else(|| "/".to_owned(), |root| cgroup_tree(root).pods_cgroup()),
        },
        started_at,
    }));
    let metrics = crate::http::AgentMetrics {
        registry: Arc::new(registry),
        process,
    };
    let node_api = |configz| {
        Arc::new(crate::server::NodeServer {
            pods: pods.clone(),
            status: status.clone(),
            runtime: node_runtime.clone(),
            configz,
            stats: stats.clone(),
            probe_counts: probe_counts.clone(),
            metrics: metrics.clone(),
        })
    };
    let kubelet_server = match &config.server {
        KubeletServer::Off => {
            info!("the kubelet server is off");
            None
        }
        KubeletServer::Serve(settings) => {
            let node = node_api(crate::server::configz(&config, settings));
            Some(
                crate::server::start(&config, settings, api.client.clone(), node, cancel.clone())
                    .await?,
            )
        }
    };

    let endpoints = Arc::new(Endpoints {
        health: health.clone(),
        pods: pods.clone(),
        status: status.clone(),
        metrics: metrics.clone(),
        stats: node_api(serde_json::Value::Null),
    });
    let server = listener.map(|listener| {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let app = router(endpoints);
            let stop = async move { cancel.cancelled().await };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
            {
                warn!("HTTP server: {e}");
            }
        })
    });
    let healthz = match config.healthz {
        HealthzEndpoint::Off => None,
        HealthzEndpoint::Listen(addr) => Some(tokio::spawn(serve_healthz(
            addr,
            healthz_router(health.clone()),
            cancel.clone(),
        ))),
    };
    health.set_ok();
    match config.read_only {
        ReadOnlyEndpoints::Listen(listen) => {
            info!(node = %config.node_name, root = %config.root_dir.display(), %listen, "rustlet running");
        }
        ReadOnlyEndpoints::Off => {
            info!(node = %config.node_name, root = %config.root_dir.display(), "rustlet running; the read-only endpoints are off");
        }
    }

    tokio::select! {
        _ = sigterm.recv() => info!("SIGTERM: stopping"),
        _ = sigint.recv() => info!("SIGINT: stopping"),
    }
    health.set_failed("stopping".into());
    cancel.cancel();
    // The status manager flushes within its own deadline; mounts stay for the next start.
    let _ = status_task.await;
    if let Some((stop, intake)) = api.intake {
        stop.cancel();
        let _ = tokio::time::timeout(STOP_GRACE, intake).await;
    }
    if let Some(server) = server {
        let _ = tokio::time::timeout(STOP_GRACE, server).await;
    }
    if let Some(server) = kubelet_server {
        let _ = tokio::time::timeout(STOP_GRACE, server).await;
    }
    if let Some(server) = healthz {
        let _ = tokio::time::timeout(STOP_GRACE, server).await;
    }
    for task in tasks {
        task.abort();
    }
    info!("rustlet stopped; mounts left in place");
    Ok(())
}

/// How long the healthz endpoint waits before binding again (upstream: `wait.Until(..., 5s)`).
const HEALTHZ_RETRY: Duration = Duration::from_secs(5);

/// Serves `app` on `addr` until `cancel`. As upstream's healthz server, a failure to bind (the
/// port taken by another agent) or to serve is logged and tried again every
/// [`HEALTHZ_RETRY`]; it never stops the agent.
async fn serve_healthz(addr: SocketAddr, app: axum::Router, cancel: CancellationToken) {
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                info!(listen = %addr, "healthz endpoint listening");
                let stop = cancel.clone().cancelled_owned();
                match axum::serve(listener, app.clone())
                    .with_graceful_shutdown(stop)
                    .await
                {
                    Ok(()) if cancel.is_cancelled() => return,
                    Ok(()) => warn!(listen = %addr, "healthz endpoint stopped serving"),
                    Err(e) => warn!(listen = %addr, "healthz endpoint: {e}"),
                }
            }
            Err(e) => {
                warn!(listen = %addr, "healthz endpoint (--healthz-port): {e}; trying again in 5s")
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(HEALTHZ_RETRY) => {}
        }
    }
}

/// The admit handlers of upstream's `NewMainKubelet`, from the host as it is at start: the safe
/// sysctls of the running kernel (all those with a kernel condition dropped when its version
/// cannot be read, as upstream) and `allowedUnsafeSysctls`; whether AppArmor is enabled.
fn admit_handlers(config: &AgentConfig) -> Result<AdmitHandlers> {
    let kernel = rustlet_pods::sysctl::read_kernel_version()
        .inspect_err(|e| {
            warn!(error = %e, "unable to determine which safe sysctls the kernel namespaces");
        })
        .ok();
    let safe = rustlet_pods::sysctl::safe_sysctl_allowlist(kernel.as_ref());
    let sysctls = Allowlist::new(
        safe.iter()
            .copied()
            .chain(config.allowed_unsafe_sysctls.iter().map(String::as_str)),
    )
    .context("config key allowedUnsafeSysctls")?;
    let apparmor = AppArmorHost::detect();
    info!(kernel = ?kernel.map(|k| k.to_string()), ?apparmor, "pod admission");
    Ok(AdmitHandlers {
        node_os: std::env::consts::OS.to_owned(),
        sysctls,
        apparmor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// Issue 29: the device allocation admits a pod that asks for no device plugin resource
    /// without the O(pods) look at the node's other pods; the containers it allocates for are
    /// those asking for one, init containers first (upstream `Allocate`).
    #[test]
    fn device_requests_are_the_containers_asking_for_a_device_plugin_resource_init_first() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {
                "initContainers": [
                    {"name": "init", "resources": {"limits": {"example.com/dev": "1"}}},
                    {"name": "plain-init"}
                ],
                "containers": [
                    {"name": "cpu-only", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
                    {"name": "both", "resources": {"limits": {"memory": "1Gi", "example.com/dev": "2"}}},
                    {"name": "other-extended", "resources": {"limits": {"example.com/other": "1"}}}
                ]
            }
        }))
        .unwrap();
        let is_device = |r: &str| r == "example.com/dev";
        let asked: Vec<(&str, Vec<&str>)> = device_requests(&pod, is_device)
            .into_iter()
            .map(|(name, limits)| (name, limits.keys().map(String::as_str).collect()))
            .collect();
        assert_eq!(
            asked,
            [
                ("init", vec!["example.com/dev"]),
                ("both", vec!["example.com/dev", "memory"]),
            ]
        );
        let mut plain = pod.clone();
        let spec = plain.spec.as_mut().unwrap();
        spec.init_containers = None;
        spec.containers.retain(|c| c.name == "cpu-only");
        assert!(device_requests(&plain, is_device).is_empty());
        assert!(device_requests(&k8s_openapi::api::core::v1::Pod::default(), is_device).is_empty());
    }

    async fn get_healthz(addr: SocketAddr) -> Option<String> {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut out = String::new();
        stream.read_to_string(&mut out).await.ok()?;
        Some(out)
    }

    /// Issue 26 item 6: a taken healthz port does not stop the agent; the endpoint binds again
    /// every 5 s (upstream's `wait.Until`) and serves once the port is free; it stops with the
    /// agent.
    #[tokio::test(start_paused = true)]
    async fn healthz_port_taken_is_tried_again_every_5s() {
        let blocker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = blocker.local_addr().unwrap();
        let health = Arc::new(Health::starting("starting"));
        health.set_ok();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(serve_healthz(addr, healthz_router(health), cancel.clone()));
        // The first bind fails; the loop sleeps (no spin: the paused clock would not move
        // otherwise).
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!task.is_finished());
        drop(blocker);
        assert!(
            get_healthz(addr).await.is_none(),
            "nothing listens before the retry"
        );
        let started = tokio::time::Instant::now();
        let answer = loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if let Some(answer) = get_healthz(addr).await {
                break answer;
            }
            assert!(started.elapsed() < HEALTHZ_RETRY * 2, "never bound again");
        };
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok"), "{answer}");
        assert!(
            started.elapsed() >= HEALTHZ_RETRY - Duration::from_secs(1),
            "bound again before its 5 s"
        );
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("stops with the agent")
            .unwrap();
    }
}
