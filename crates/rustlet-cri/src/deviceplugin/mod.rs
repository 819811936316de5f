//! The device plugin manager (upstream `pkg/kubelet/cm/devicemanager`): the `Registration`
//! gRPC service of the device plugin API v1beta1 on `<dir>/kubelet.sock`, one client per
//! registered resource, and the devices' bookkeeping ([`devices`]) the node status and the
//! containers read.
//!
//! A plugin serves `DevicePlugin` on a socket of its own in the same directory and calls
//! `Register` with the API version, its socket's file name and a resource name. The manager
//! checks the version, the name (an extended resource name) and the file name, dials the
//! socket, asks `GetDevicePluginOptions` (a failure refuses the registration: the resource is
//! never known), then follows the plugin's `ListAndWatch`: every list sets the resource's
//! devices, healthy and unhealthy. When the stream ends, for whatever reason, it is not asked
//! again (upstream does not retry either: the plugin registers again): every device turns
//! unhealthy, and after [`devices::ENDPOINT_STOP_GRACE_PERIOD`] the resource goes to 0. A
//! registration under a name another plugin serves replaces that plugin, whose stream is
//! dropped.
//!
//! [`DeviceManager::allocate`] gives a container the devices its limits ask of a registered
//! resource and asks the plugin's `Allocate`; [`ContainerDevices`] is what the answers add to
//! the container's CRI config (environment, mounts, devices, annotations).
//!
//! Deadlines: dialling a plugin and each unary call (`GetDevicePluginOptions`, `Allocate`)
//! have 10 s (upstream: the dial's 10 s; `PreStartContainer`'s 30 s). `ListAndWatch` is a
//! watch, open as long as the plugin keeps it: its connection is checked by HTTP/2 pings every
//! 30 s, 20 s to answer, so a plugin that hangs is taken for stopped.
//!
//! A hostile plugin gets an error and changes nothing else: a version other than v1beta1, a
//! name that is not an extended resource name (no domain, `kubernetes.io`, `requests.`), an
//! endpoint that is not a plain file name in the directory (`../x`, `/x`, `kubelet.sock`), a
//! list of more than [`MAX_DEVICES`] devices or a message over 4 MiB (the plugin is then taken
//! for stopped).
//!
//! Deviations: no checkpoint (`kubelet_internal_checkpoint`): after an agent restart the
//! resources are unknown until their plugins register again, and devices given to running
//! containers are not remembered; no NUMA alignment, `GetPreferredAllocation` or
//! `PreStartContainer` (devices are given in ID order; a plugin asking `preStartRequired` is
//! not called before a start); no CDI devices; no plugin watcher (`plugins_registry`), only
//! the `Registration` socket.

pub mod devices;

/// The device plugin API v1beta1, generated from `proto/deviceplugin/v1beta1/api.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("v1beta1");
}

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use rustlet_core::node_status::DevicePluginResources;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

pub use devices::ENDPOINT_STOP_GRACE_PERIOD;
use devices::{Allocation, ContainerKey, Devices};
use pb::device_plugin_client::DevicePluginClient;
use pb::registration_server::{Registration, RegistrationServer};

/// The API version this manager speaks (upstream `pluginapi.Version`).
pub const VERSION: &str = "v1beta1";

/// The versions a plugin may register with (upstream `pluginapi.SupportedVersions`).
pub const SUPPORTED_VERSIONS: [&str; 1] = [VERSION];

/// The registration socket's file name in the directory (upstream `KubeletSocket`'s).
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// The health of a healthy device (upstream `pluginapi.Healthy`); any other is unhealthy.
pub const HEALTHY: &str = "Healthy";

/// How long dialling a plugin may take (upstream's 10 s).
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `GetDevicePluginOptions` and `Allocate` may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The most devices a list may have; a longer one stops the plugin.
pub const MAX_DEVICES: usize = 100_000;

/// The largest message taken from a plugin (gRPC's default).
const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// HTTP/2 pings on a plugin's connection, and how long an answer may take.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a `Register` call may take in all (a dial and an options call).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the manager could not start.
#[derive(Debug, thiserror::Error)]
pub enum DevicePluginError {
    /// The directory could not be made or cleaned, or the socket not bound.
    #[error("device plugin directory {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Why a registration was refused (upstream's words where it has them).
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// Another API version.
    #[error(
        "requested API version {0:?} is not supported by kubelet. Supported version is [\"v1beta1\"]"
    )]
    UnsupportedVersion(String),
    /// Not an extended resource name.
    #[error("the ResourceName {0:?} is invalid")]
    InvalidResourceName(String),
    /// Not a plain socket file name in the directory.
    #[error(
        "the endpoint {0:?} is invalid: it must be the file name of a socket in the device plugin directory"
    )]
    InvalidEndpoint(String),
    /// The plugin's socket could not be dialled in time.
    #[error("failed to dial device plugin: {0}")]
    Dial(String),
    /// `GetDevicePluginOptions` failed.
    #[error("failed to get device plugin options: {0}")]
    Options(String),
}

/// Why a container could not be given its devices (upstream admission's
/// `UnexpectedAdmissionError`).
#[derive(Debug, thiserror::Error)]
pub enum AllocateFailure {
    /// The bookkeeping refused.
    #[error(transparent)]
    Devices(#[from] devices::AllocateError),
    /// A limit that is not a whole number of devices.
    #[error("the limit {quantity:?} of {resource} is not a whole number of devices")]
    BadQuantity {
        /// The resource.
        resource: String,
        /// Its limit.
        quantity: String,
    },
    /// The plugin's `Allocate` failed.
    #[error("{0}")]
    Rpc(String),
    /// The plugin answered no container.
    #[error("no containers return in allocation response")]
    EmptyResponse,
}

/// What a container's devices add to its CRI config (upstream `DeviceRunContainerOptions`),
/// merged from the plugins' `Allocate` answers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerDevices {
    /// Environment variables.
    pub envs: BTreeMap<String, String>,
    /// Bind mounts.
    pub mounts: Vec<pb::Mount>,
    /// Device nodes.
    pub devices: Vec<pb::DeviceSpec>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
}

impl ContainerDevices {
    /// Whether nothing is to be added.
    pub fn is_empty(&self) -> bool {
        self.envs.is_empty()
            && self.mounts.is_empty()
            && self.devices.is_empty()
            && self.annotations.is_empty()
    }

    /// Adds one plugin's answer (upstream `deviceRunContainerOptions`: a later value of a
    /// variable or annotation wins, a mount or device of a path already there is skipped).
    fn add(&mut self, answer: &pb::ContainerAllocateResponse) {
        for (k, v) in &answer.envs {
            self.envs.insert(k.clone(), v.clone());
        }
        for (k, v) in &answer.annotations {
            self.annotations.insert(k.clone(), v.clone());
        }
        for m in &answer.mounts {
            if !self
                .mounts
                .iter()
                .any(|have| have.container_path == m.container_path)
            {
                self.mounts.push(m.clone());
            }
        }
        for d in &answer.devices {
            if !self
                .devices
                .iter()
                .any(|have| have.container_path == d.container_path)
            {
                self.devices.push(d.clone());
            }
        }
    }
}

/// A connected plugin.
struct Plugin {
    generation: u64,
    client: DevicePluginClient<Channel>,
    watch: AbortHandle,
}

#[derive(Default)]
struct State {
    devices: Devices,
    plugins: BTreeMap<String, Plugin>,
    /// Each container's plugins' answers, by resource.
    answers: BTreeMap<ContainerKey, BTreeMap<String, pb::ContainerAllocateResponse>>,
}

struct Inner {
    dir: PathBuf,
    state: Mutex<State>,
}

/// The device plugin manager; cheap to clone.
#[derive(Clone)]
pub struct DeviceManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceManager")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

impl DeviceManager {
    /// A manager of the plugins in `dir` that serves nothing yet (see [`DeviceManager::start`]).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            inner: Arc::new(Inner {
                dir: dir.into(),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The plugins' directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Makes the directory (0750), removes the sockets in it (upstream
    /// `CleanupPluginDirectory`: plugins watch for the registration socket's re-creation and
    /// register again) and serves `Registration` on `<dir>/kubelet.sock` until `cancel`, then
    /// drops every plugin and removes the socket.
    pub async fn start(&self, cancel: CancellationToken) -> Result<(), DevicePluginError> {
        let dir = self.inner.dir.clone();
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| DevicePluginError::Io { path, source }
        };
        let listener = {
            let made = dir.clone();
            tokio::task::spawn_blocking(move || -> Result<_, DevicePluginError> {
                let dir = made;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o750)
                    .create(&dir)
                    .map_err(io(&dir))?;
                cleanup_sockets(&dir).map_err(io(&dir))?;
                let socket = dir.join(KUBELET_SOCKET);
                let std_listener =
                    std::os::unix::net::UnixListener::bind(&socket).map_err(io(&socket))?;
                std_listener.set_nonblocking(true).map_err(io(&socket))?;
                Ok(std_listener)
            })
            .await
            .map_err(|e| DevicePluginError::Io {
                path: dir.clone(),
                source: std::io::Error::other(e),
            })??
        };
        let listener = UnixListener::from_std(listener).map_err(io(&dir.join(KUBELET_SOCKET)))?;
        let incoming = futures::stream::unfold(listener, |listener| async move {
            let next = listener.accept().await.map(|(stream, _)| stream);
            Some((next, listener))
        });
        let service = RegistrationServer::new(RegistrationService {
            manager: self.clone(),
        })
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let manager = self.clone();
        info!(socket = %dir.join(KUBELET_SOCKET).display(), "device plugin registration server started");
        tokio::spawn(async move {
            let served = Server::builder()
                .timeout(REGISTER_TIMEOUT)
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, cancel.cancelled())
                .await;
            if let Err(e) = served {
                warn!("device plugin registration server failed: {e}");
            }
            manager.stop();
            let _ = std::fs::remove_file(dir.join(KUBELET_SOCKET));
        });
        Ok(())
    }

    /// Drops every plugin's stream (the agent stops).
    fn stop(&self) {
        let mut state = self.lock();
        for plugin in std::mem::take(&mut state.plugins).into_values() {
            plugin.watch.abort();
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The resources for the node status now (upstream `GetCapacity`); hands over the
    /// resources removed since the last call.
    pub fn resources(&self) -> DevicePluginResources {
        self.resources_at(Instant::now())
    }

    /// [`DeviceManager::resources`] as at `now`.
    pub fn resources_at(&self, now: Instant) -> DevicePluginResources {
        self.lock().devices.capacity(now)
    }

    /// Handles one `Register` (upstream `server.Register` and `connectClient`).
    pub async fn register(&self, request: pb::RegisterRequest) -> Result<(), RegisterError> {
        let pb::RegisterRequest {
            version,
            endpoint,
            resource_name,
            ..
        } = request;
        if !SUPPORTED_VERSIONS.contains(&version.as_str()) {
            return Err(RegisterError::UnsupportedVersion(version));
        }
        if !devices::is_extended_resource_name(&resource_name) {
            return Err(RegisterError::InvalidResourceName(resource_name));
        }
        if !is_socket_file_name(&endpoint) {
            return Err(RegisterError::InvalidEndpoint(endpoint));
        }
        let socket = self.inner.dir.join(&endpoint);
        let channel = dial(socket.clone()).await?;
        let mut client =
            DevicePluginClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
        let mut options_request = Request::new(pb::Empty {});
        options_request.set_timeout(CALL_TIMEOUT);
        match tokio::time::timeout(
            CALL_TIMEOUT,
            client.get_device_plugin_options(options_request),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(status)) => return Err(RegisterError::Options(go_status(&status))),
            Err(_) => {
                return Err(RegisterError::Options(
                    "rpc error: code = DeadlineExceeded desc = context deadline exceeded".into(),
                ));
            }
        }
        let mut state = self.lock();
        let generation = state.devices.connected(&resource_name);
        let watch = tokio::spawn(self.clone().watch(
            resource_name.clone(),
            generation,
            client.clone(),
        ))
        .abort_handle();
        let replaced = state.plugins.insert(
            resource_name.clone(),
            Plugin {
                generation,
                client,
                watch,
            },
        );
        drop(state);
        if let Some(old) = replaced {
            info!(resource = %resource_name, "device plugin replaced by a new registration");
            old.watch.abort();
        }
        info!(resource = %resource_name, socket = %socket.display(), "device plugin registered");
        Ok(())
    }

    /// Follows one plugin's `ListAndWatch` until it ends; then its devices are unhealthy.
    async fn watch(
        self,
        resource: String,
        generation: u64,
        mut client: DevicePluginClient<Channel>,
    ) {
        let ended = self.follow(&resource, generation, &mut client).await;
        warn!(resource = %resource, "ListAndWatch ended unexpectedly for device plugin: {ended}");
        let mut state = self.lock();
        state
            .devices
            .disconnected(&resource, generation, Instant::now());
        if state
            .plugins
            .get(&resource)
            .is_some_and(|p| p.generation == generation)
        {
            state.plugins.remove(&resource);
        }
    }

    /// The stream's updates into the bookkeeping; returns why it ended.
    async fn follow(
        &self,
        resource: &str,
        generation: u64,
        client: &mut DevicePluginClient<Channel>,
    ) -> String {
        let mut stream = match client.list_and_watch(pb::Empty {}).await {
            Ok(response) => response.into_inner(),
            Err(status) => return go_status(&status),
        };
        loop {
            match stream.message().await {
                Ok(Some(list)) => {
                    if list.devices.len() > MAX_DEVICES {
                        return format!(
                            "the plugin listed {} devices, more than the {MAX_DEVICES} a resource may have",
                            list.devices.len()
                        );
                    }
                    let healthy = list.devices.iter().filter(|d| d.health == HEALTHY).count();
                    info!(
                        resource,
                        total = list.devices.len(),
                        healthy,
                        "device plugin listed its devices"
                    );
                    let listed = list
                        .devices
                        .into_iter()
                        .map(|d| {
                            let ok = d.health == HEALTHY;
                            (d.id, ok)
                        })
                        .collect::<Vec<_>>();
                    if !self.lock().devices.listed(resource, generation, listed) {
                        return "replaced by a new registration".into();
                    }
                }
                Ok(None) => return "the stream was closed".into(),
                Err(status) => return go_status(&status),
            }
        }
    }

    /// Whether `resource` is a device plugin's (registered, or given to a container).
    pub fn is_device_plugin_resource(&self, resource: &str) -> bool {
        self.lock().devices.is_device_plugin_resource(resource)
    }

    /// Gives container `container` of pod `pod_uid` the devices its `limits` ask of device
    /// plugin resources (upstream `Allocate` → `allocateContainerResources`), asking each
    /// plugin's `Allocate`, and returns what they add to its config. Devices it has already
    /// (a restart) are kept and their answers reused. With `active_pods` (upstream
    /// `UpdateAllocatedDevices`), the containers of other pods give theirs back first.
    pub async fn allocate(
        &self,
        pod_uid: &str,
        container: &str,
        limits: &BTreeMap<String, Quantity>,
        active_pods: Option<&BTreeSet<String>>,
    ) -> Result<ContainerDevices, AllocateFailure> {
        let key: ContainerKey = (pod_uid.to_owned(), container.to_owned());
        if let Some(active_pods) = active_pods {
            let mut state = self.lock();
            state.devices.release_inactive(active_pods);
            state
                .answers
                .retain(|(pod, _), _| active_pods.contains(pod));
        }
        for (resource, quantity) in limits {
            if !self.is_device_plugin_resource(resource) {
                continue;
            }
            let needed = device_count(resource, quantity)?;
            if needed == 0 {
                continue;
            }
            let (ids, client) = {
                let mut state = self.lock();
                match state.devices.reserve(&key, resource, needed)? {
                    Allocation::Existing => continue,
                    Allocation::New(ids) => {
                        let client = state.plugins.get(resource).map(|p| p.client.clone());
                        (ids, client)
                    }
                }
            };
            let answer = match client {
                Some(client) => call_allocate(client, ids).await,
                None => Err(AllocateFailure::Rpc(format!(
                    "unknown Device Plugin {resource}"
                ))),
            };
            let mut state = self.lock();
            match answer {
                Ok(answer) => {
                    state
                        .answers
                        .entry(key.clone())
                        .or_default()
                        .insert(resource.clone(), answer);
                }
                Err(e) => {
                    state.devices.unreserve(&key, resource);
                    return Err(e);
                }
            }
        }
        let state = self.lock();
        let mut out = ContainerDevices::default();
        for answer in state.answers.get(&key).into_iter().flat_map(|m| m.values()) {
            out.add(answer);
        }
        Ok(out)
    }

    /// The devices each container was given, by resource (for tests and diagnostics).
    pub fn container_devices(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> BTreeMap<String, Vec<String>> {
        self.lock()
            .devices
            .container_devices(&(pod_uid.to_owned(), container.to_owned()))
    }

    /// The generation of the plugin serving `resource`, if one is connected.
    #[cfg(test)]
    fn generation(&self, resource: &str) -> Option<u64> {
        self.lock().plugins.get(resource).map(|p| p.generation)
    }
}

/// A limit as a number of devices: a whole, non-negative number.
fn device_count(resource: &str, quantity: &Quantity) -> Result<usize, AllocateFailure> {
    let bad = || AllocateFailure::BadQuantity {
        resource: resource.to_owned(),
        quantity: quantity.0.clone(),
    };
    let milli = rustlet_core::quantity::quantity_milli_ceil(quantity).ok_or_else(bad)?;
    if milli % 1000 != 0 {
        return Err(bad());
    }
    usize::try_from(milli / 1000).map_err(|_| bad())
}

/// One `Allocate` of `ids` under [`CALL_TIMEOUT`]: the first container's answer.
async fn call_allocate(
    mut client: DevicePluginClient<Channel>,
    ids: Vec<String>,
) -> Result<pb::ContainerAllocateResponse, AllocateFailure> {
    let mut request = Request::new(pb::AllocateRequest {
        container_requests: vec![pb::ContainerAllocateRequest { devices_ids: ids }],
    });
    request.set_timeout(CALL_TIMEOUT);
    let response = tokio::time::timeout(CALL_TIMEOUT, client.allocate(request))
        .await
        .map_err(|_| {
            AllocateFailure::Rpc(
                "rpc error: code = DeadlineExceeded desc = context deadline exceeded".into(),
            )
        })?
        .map_err(|status| AllocateFailure::Rpc(go_status(&status)))?;
    response
        .into_inner()
        .container_responses
        .into_iter()
        .next()
        .ok_or(AllocateFailure::EmptyResponse)
}

/// The `Registration` service.
struct RegistrationService {
    manager: DeviceManager,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let request = request.into_inner();
        let resource = request.resource_name.clone();
        info!(resource = %resource, "got registration request from device plugin");
        match self.manager.register(request).await {
            Ok(()) => Ok(Response::new(pb::Empty {})),
            Err(e) => {
                warn!(resource = %resource, "device plugin registration refused: {e}");
                Err(match e {
                    RegisterError::UnsupportedVersion(_)
                    | RegisterError::InvalidResourceName(_)
                    | RegisterError::InvalidEndpoint(_) => Status::invalid_argument(e.to_string()),
                    RegisterError::Dial(_) | RegisterError::Options(_) => {
                        Status::unknown(e.to_string())
                    }
                })
            }
        }
    }
}

/// Whether `endpoint` names a file directly in the directory, not the registration socket.
fn is_socket_file_name(endpoint: &str) -> bool {
    !endpoint.is_empty()
        && endpoint.len() <= 255
        && !endpoint.contains('/')
        && !endpoint.contains('\0')
        && endpoint != "."
        && endpoint != ".."
        && endpoint != KUBELET_SOCKET
}

/// A channel to the plugin's socket, connected within [`DIAL_TIMEOUT`] (upstream `dial`:
/// authority `localhost`, blocking until connected).
async fn dial(socket: PathBuf) -> Result<Channel, RegisterError> {
    let endpoint = Endpoint::from_static("http://localhost")
        .connect_timeout(DIAL_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    let path = socket.clone();
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    }));
    match tokio::time::timeout(DIAL_TIMEOUT, connect).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => Err(RegisterError::Dial(format!(
            "{}: {}",
            socket.display(),
            crate::grpc_probe::chain(&e)
        ))),
        Err(_) => Err(RegisterError::Dial(format!(
            "{}: context deadline exceeded",
            socket.display()
        ))),
    }
}

/// A status as grpc-go prints one (`rpc error: code = Unknown desc = ...`).
fn go_status(status: &Status) -> String {
    let code = match status.code() {
        tonic::Code::Cancelled => "Canceled".to_owned(),
        code => format!("{code:?}"),
    };
    format!("rpc error: code = {code} desc = {}", status.message())
}

/// Removes the sockets directly in `dir` (upstream `CleanupPluginDirectory`); files that are
/// not sockets and directories stay.
fn cleanup_sockets(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_socket() {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
