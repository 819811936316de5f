//! The device manager against a fake plugin over real gRPC on unix sockets in a temp dir, named
//! after upstream's `device_plugin_failures_test.go` specs (its `testdeviceplugin` is the
//! model of [`FakePlugin`]) and the manager's rules. Real time: the sockets are real; the grace
//! period is read at a later instant ([`DeviceManager::resources_at`]) instead of waited for.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::Stream;
use tokio::sync::mpsc;
use tonic::transport::Server;

use super::pb::device_plugin_server::{DevicePlugin, DevicePluginServer};
use super::pb::registration_client::RegistrationClient;
use super::*;

/// A plugin as upstream's `testdeviceplugin`: records its calls, fails the methods it is told
/// to, streams the lists it is given, mounts a file per allocated device.
#[derive(Clone, Default)]
struct FakePlugin {
    calls: Arc<Mutex<Vec<String>>>,
    failing: Arc<Mutex<BTreeSet<&'static str>>>,
    /// The open ListAndWatch streams' senders.
    streams: Arc<Mutex<Vec<ListSender>>>,
    devices: Arc<Mutex<Vec<pb::Device>>>,
}

type ListSender = mpsc::UnboundedSender<Result<pb::ListAndWatchResponse, Status>>;

type ListStream = Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for FakePlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        self.called("GetDevicePluginOptions");
        if self.fails("GetDevicePluginOptions") {
            return Err(Status::unknown("GetDevicePluginOptions failed"));
        }
        Ok(Response::new(pb::DevicePluginOptions::default()))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(&self, _: Request<pb::Empty>) -> Result<Response<ListStream>, Status> {
        self.called("ListAndWatch");
        if self.fails("ListAndWatch") {
            return Err(Status::unknown("ListAndWatch failed"));
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(Ok(self.list())).unwrap();
        self.streams.lock().unwrap().push(tx);
        let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        Ok(Response::new(pb::PreferredAllocationResponse::default()))
    }

    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        self.called("Allocate");
        if self.fails("Allocate") {
            return Err(Status::unknown("Allocate failed"));
        }
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| pb::ContainerAllocateResponse {
                envs: r
                    .devices_ids
                    .iter()
                    .map(|id| (format!("DEVICE_{id}"), "1".to_owned()))
                    .collect(),
                mounts: r
                    .devices_ids
                    .iter()
                    .map(|id| pb::Mount {
                        container_path: format!("/tmp/device-{id}"),
                        host_path: format!("/tmp/device-{id}"),
                        read_only: false,
                    })
                    .collect(),
                ..pb::ContainerAllocateResponse::default()
            })
            .collect();
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse::default()))
    }
}

impl FakePlugin {
    fn failing(methods: &[&'static str]) -> Self {
        let plugin = Self::default();
        plugin.failing.lock().unwrap().extend(methods);
        plugin
    }

    fn called(&self, method: &str) {
        self.calls.lock().unwrap().push(method.to_owned());
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn fails(&self, method: &str) -> bool {
        self.failing.lock().unwrap().contains(method)
    }

    fn list(&self) -> pb::ListAndWatchResponse {
        pb::ListAndWatchResponse {
            devices: self.devices.lock().unwrap().clone(),
        }
    }

    /// upstream `UpdateDevices`: the new list to every open stream.
    fn update_devices(&self, devices: &[(&str, bool)]) {
        *self.devices.lock().unwrap() = device_list(devices);
        let list = self.list();
        for tx in self.streams.lock().unwrap().iter() {
            let _ = tx.send(Ok(list.clone()));
        }
    }

    /// The open streams end with an error (upstream's error injector on the ticker).
    fn fail_streams(&self) {
        for tx in self.streams.lock().unwrap().drain(..) {
            let _ = tx.send(Err(Status::unknown("ListAndWatch failed")));
        }
    }
}

fn device_list(devices: &[(&str, bool)]) -> Vec<pb::Device> {
    devices
        .iter()
        .map(|(id, healthy)| pb::Device {
            id: (*id).to_owned(),
            health: if *healthy { "Healthy" } else { "Unhealthy" }.to_owned(),
            topology: None,
        })
        .collect()
}

/// A plugin served on `<dir>/<name>`; stopped when `stop` is cancelled.
struct Served {
    plugin: FakePlugin,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    /// upstream `Stop`: the server stops, its streams with it.
    async fn stop(self) {
        self.stop.cancel();
        self.plugin.streams.lock().unwrap().clear();
        let _ = self.task.await;
    }
}

fn serve(plugin: FakePlugin, dir: &Path, name: &str) -> Served {
    let listener = UnixListener::bind(dir.join(name)).unwrap();
    let incoming = futures::stream::unfold(listener, |l| async move {
        Some((l.accept().await.map(|(s, _)| s), l))
    });
    let stop = CancellationToken::new();
    let cancelled = stop.clone();
    let service = DevicePluginServer::new(plugin.clone());
    let task = tokio::spawn(async move {
        let _ = Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, cancelled.cancelled_owned())
            .await;
    });
    Served { plugin, stop, task }
}

struct Setup {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    manager: DeviceManager,
    cancel: CancellationToken,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("device-plugins");
    let manager = DeviceManager::new(&dir);
    let cancel = CancellationToken::new();
    manager.start(cancel.clone()).await.unwrap();
    Setup {
        _dir: tmp,
        dir,
        manager,
        cancel,
    }
}

/// upstream `RegisterDevicePlugin`: a Register call on `kubelet.sock`, as grpc-go prints its
/// error.
async fn register(dir: &Path, version: &str, endpoint: &str, resource: &str) -> Result<(), String> {
    let channel = dial(dir.join(KUBELET_SOCKET))
        .await
        .map_err(|e| e.to_string())?;
    let mut client = RegistrationClient::new(channel);
    let request = pb::RegisterRequest {
        version: version.to_owned(),
        endpoint: endpoint.to_owned(),
        resource_name: resource.to_owned(),
        options: None,
    };
    tokio::time::timeout(Duration::from_secs(60), client.register(request))
        .await
        .expect("Register answers in time")
        .map(drop)
        .map_err(|s| go_status(&s))
}

/// The resource's (allocatable, capacity) as the node status would read them, `None` where
/// absent (the spec's -1).
fn values(manager: &DeviceManager, at: Instant, resource: &str) -> (Option<u64>, Option<u64>) {
    let r = manager.resources_at(at);
    let capacity = r.capacity.get(resource).copied();
    // The node status copies a capacity without allocatable into allocatable.
    let allocatable = r.allocatable.get(resource).copied().or(capacity);
    (allocatable, capacity)
}

/// Polls until the resource reads `want` (a minute at most, the spec's
/// `nodeStatusUpdateTimeout`).
async fn eventually(manager: &DeviceManager, resource: &str, want: (Option<u64>, Option<u64>)) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = values(manager, Instant::now(), resource);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{resource}: {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const RESOURCE: &str = "test.device/device-plugin-failures";

#[tokio::test]
async fn when_get_device_plugin_options_fails_device_plugin_will_not_be_used() {
    let s = setup().await;
    let served = serve(
        FakePlugin::failing(&["GetDevicePluginOptions"]),
        &s.dir,
        "plugin.sock",
    );
    served.plugin.update_devices(&[("testdevice", true)]);
    let err = register(&s.dir, VERSION, "plugin.sock", RESOURCE)
        .await
        .unwrap_err();
    assert!(err.contains("failed to get device plugin options"), "{err}");
    assert!(err.contains("GetDevicePluginOptions failed"), "{err}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(served.plugin.calls(), ["GetDevicePluginOptions"]);
    assert_eq!(values(&s.manager, Instant::now(), RESOURCE), (None, None));
    assert!(!s.manager.is_device_plugin_resource(RESOURCE));
    served.stop().await;
}

#[tokio::test]
async fn will_set_allocatable_to_zero_when_a_single_device_became_unhealthy_and_then_back_to_1_if_it_got_healthy_again()
 {
    let s = setup().await;
    let served = serve(FakePlugin::default(), &s.dir, "plugin.sock");
    served.plugin.update_devices(&[("testdevice", true)]);
    register(&s.dir, VERSION, "plugin.sock", RESOURCE)
        .await
        .unwrap();
    eventually(&s.manager, RESOURCE, (Some(1), Some(1))).await;
    served.plugin.update_devices(&[("testdevice", false)]);
    eventually(&s.manager, RESOURCE, (Some(0), Some(1))).await;
    served.plugin.update_devices(&[("testdevice", true)]);
    eventually(&s.manager, RESOURCE, (Some(1), Some(1))).await;
    served.stop().await;
}

#[tokio::test]
async fn will_lower_allocatable_to_a_number_of_unhealthy_devices_and_then_back_if_they_became_healthy_again()
 {
    let s = setup().await;
    let served = serve(FakePlugin::default(), &s.dir, "plugin.sock");
    let mut devices = [("0", true), ("1", true), ("2", true), ("3", true)];
    served.plugin.update_devices(&devices);
    register(&s.dir, VERSION, "plugin.sock", RESOURCE)
        .await
        .unwrap();
    eventually(&s.manager, RESOURCE, (Some(4), Some(4))).await;
    for (unhealthy, want) in [
        (&[3][..], 3),
        (&[][..], 4),
        (&[1, 3][..], 2),
        (&[1][..], 3),
        (&[][..], 4),
    ] {
        for (i, d) in devices.iter_mut().enumerate() {
            d.1 = !unhealthy.contains(&i);
        }
        served.plugin.update_devices(&devices);
        eventually(&s.manager, RESOURCE, (Some(want), Some(4))).await;
    }
    served.stop().await;
}

#[tokio::test]
async fn when_list_and_watch_fails_immediately_node_allocatable_will_be_set_to_zero_and_kubelet_will_not_retry_to_list_resources()
 {
    let s = setup().await;
    assert_eq!(values(&s.manager, Instant::now(), RESOURCE), (None, None));
    let served = serve(
        FakePlugin::failing(&["ListAndWatch"]),
        &s.dir,
        "plugin.sock",
    );
    served.plugin.update_devices(&[("testdevice", true)]);
    register(&s.dir, VERSION, "plugin.sock", RESOURCE)
        .await
        .unwrap();
    eventually(&s.manager, RESOURCE, (Some(0), Some(0))).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        served.plugin.calls(),
        ["GetDevicePluginOptions", "ListAndWatch"],
        "never retried"
    );
    // Past the grace period: removed once (the node status sets it to 0), then absent.
    let later = Instant::now() + ENDPOINT_STOP_GRACE_PERIOD + Duration::from_secs(1);
    assert_eq!(s.manager.resources_at(later).removed, [RESOURCE]);
    assert_eq!(
        s.manager.resources_at(later),
        DevicePluginResources::default()
    );
    served.stop().await;
}

#[tokio::test]
async fn when_list_and_watch_fails_after_provisioning_devices_node_allocatable_will_be_set_to_zero_and_kubelet_will_not_retry_to_list_resources()
 {
    let s = setup().await;
    let served = serve(FakePlugin::default(), &s.dir, "plugin.sock");
    served.plugin.update_devices(&[("0", true), ("1", true)]);
    register(&s.dir, VERSION, "plugin.sock", RESOURCE)
        .await
        .unwrap();
    eventually(&s.manager, RESOURCE, (Some(2), Some(2))).await;
    served.plugin.failing.lock().unwrap().insert("ListAndWatch");
    served.plugin.fail_streams();
    eventually(&s.manager, RESOURCE, (Some(0), Some(2))).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        served.plugin.calls(),
        ["GetDevicePluginOptions", "ListAndWatch"],
        "never retried"
    );
    // Within the grace period the capacity stays; after it the resource goes to 0.
    let within = Instant::now() + ENDPOINT_STOP_GRACE_PERIOD - Duration::from_secs(5);
    assert_eq!(values(&s.manager, within, RESOURCE), (Some(0), Some(2)));
    let after = Instant::now() + ENDPOINT_STOP_GRACE_PERIOD + Duration::from_secs(1);
    assert_eq!(s.manager.resources_at(after).removed, [RESOURCE]);
    served.stop().await;
}

#[tokio::test]
async fn when_device_plugin_is_stopped_after_provisioning_devices_node_allocatable_will_be_set_to_zero()
 {
    let s = setup().await;
    let served = serve(FakePlugin::default(), &s.dir, "plugin.sock");
    served.plugin.update_devices(&[("0", true), ("1", true)]);
    register(&s.dir, VERSION, "plugin.sock", RESOURCE)
        .await
        .unwrap();
    eventually(&s.manager, RESOURCE, (Some(2), Some(2))).await;
    served.stop().await;
    eventually(&s.manager, RESOURCE, (Some(0), Some(2))).await;
    let after = Instant::now() + ENDPOINT_STOP_GRACE_PERIOD + Duration::from_secs(1);
    assert_eq!(s.manager.resources_at(after).removed, [RESOURCE]);
    assert_eq!(values(&s.manager, after, RESOURCE), (None, None));
}

/// upstream e2e "will set allocatable to zero when a single device became unhealthy, but
/// capacity will stay at 1": a container given the device keeps it (and its answer) when the
/// device turns unhealthy; another is refused with upstream's words.
#[tokio::test]
async fn will_set_allocatable_to_zero_when_a_single_device_became_unhealthy_but_capacity_will_stay_at_1()
 {
    let s = setup().await;
    let served = serve(FakePlugin::default(), &s.dir, "plugin.sock");
    served.plugin.update_devices(&[("testdevice", true)]);
    register(&s.dir, VERSION, "plugin.sock", RESOURCE)
        .await
        .unwrap();
    eventually(&s.manager, RESOURCE, (Some(1), Some(1))).await;
    let limits = BTreeMap::from([
        (RESOURCE.to_owned(), Quantity("1".into())),
        ("cpu".to_owned(), Quantity("100m".into())),
    ]);
    let active = BTreeSet::from(["pod-a".to_owned(), "pod-b".to_owned()]);
    let given = s
        .manager
        .allocate("pod-a", "container-1", &limits, Some(&active))
        .await
        .unwrap();
    assert_eq!(given.mounts.len(), 1);
    assert_eq!(given.mounts[0].host_path, "/tmp/device-testdevice");
    assert_eq!(given.envs["DEVICE_testdevice"], "1");
    assert_eq!(
        s.manager.container_devices("pod-a", "container-1"),
        BTreeMap::from([(RESOURCE.to_owned(), vec!["testdevice".to_owned()])])
    );
    // Allocatable does not count allocated devices (the scheduler does).
    eventually(&s.manager, RESOURCE, (Some(1), Some(1))).await;
    // The only device is taken: another pod cannot have it.
    let err = s
        .manager
        .allocate("pod-b", "container-1", &limits, Some(&active))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "requested number of devices unavailable for {RESOURCE}. Requested: 1, Available: 0"
        )
    );
    served.plugin.update_devices(&[("testdevice", false)]);
    eventually(&s.manager, RESOURCE, (Some(0), Some(1))).await;
    let err = s
        .manager
        .allocate("pod-b", "container-1", &limits, Some(&active))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("no healthy devices present; cannot allocate unhealthy devices {RESOURCE}")
    );
    // pod-a gone: its device is free again (still unhealthy); the plugin was asked once.
    let active = BTreeSet::from(["pod-b".to_owned()]);
    served.plugin.update_devices(&[("testdevice", true)]);
    eventually(&s.manager, RESOURCE, (Some(1), Some(1))).await;
    s.manager
        .allocate("pod-b", "container-1", &limits, Some(&active))
        .await
        .unwrap();
    assert_eq!(
        served
            .plugin
            .calls()
            .iter()
            .filter(|c| *c == "Allocate")
            .count(),
        2
    );
    served.stop().await;
}

/// upstream `devicesToAllocate`: a failed `Allocate` gives the devices back; a container of a
/// resource nobody registered is refused.
#[tokio::test]
async fn a_failed_allocate_gives_the_devices_back() {
    let s = setup().await;
    let served = serve(FakePlugin::failing(&["Allocate"]), &s.dir, "plugin.sock");
    served.plugin.update_devices(&[("0", true)]);
    register(&s.dir, VERSION, "plugin.sock", RESOURCE)
        .await
        .unwrap();
    eventually(&s.manager, RESOURCE, (Some(1), Some(1))).await;
    let limits = BTreeMap::from([(RESOURCE.to_owned(), Quantity("1".into()))]);
    let active = BTreeSet::from(["pod-a".to_owned()]);
    let err = s
        .manager
        .allocate("pod-a", "c", &limits, Some(&active))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "rpc error: code = Unknown desc = Allocate failed"
    );
    assert!(s.manager.container_devices("pod-a", "c").is_empty());
    // A resource that is not a device plugin's is not the manager's business.
    let other = BTreeMap::from([("example.com/unknown".to_owned(), Quantity("1".into()))]);
    assert!(
        s.manager
            .allocate("pod-a", "c", &other, Some(&active))
            .await
            .unwrap()
            .is_empty()
    );
    served.stop().await;
}

/// A hostile registration is refused with a clear error and touches nothing: another version,
/// a name that is not an extended resource name, an endpoint outside the directory or the
/// registration socket itself, a socket nobody serves.
#[tokio::test]
async fn a_bad_registration_is_refused_and_changes_nothing() {
    let s = setup().await;
    let served = serve(FakePlugin::default(), &s.dir, "plugin.sock");
    served.plugin.update_devices(&[("0", true)]);
    for (version, endpoint, resource, want) in [
        (
            "v1alpha1",
            "plugin.sock",
            RESOURCE,
            "code = InvalidArgument desc = requested API version \"v1alpha1\" is not supported by kubelet. Supported version is [\"v1beta1\"]",
        ),
        (
            VERSION,
            "plugin.sock",
            "gpu",
            "the ResourceName \"gpu\" is invalid",
        ),
        (
            VERSION,
            "plugin.sock",
            "kubernetes.io/gpu",
            "the ResourceName \"kubernetes.io/gpu\" is invalid",
        ),
        (
            VERSION,
            "plugin.sock",
            "requests.example.com/gpu",
            "is invalid",
        ),
        (VERSION, "plugin.sock", "Example.com/gpu", "is invalid"),
        (
            VERSION,
            "../plugin.sock",
            RESOURCE,
            "the endpoint \"../plugin.sock\" is invalid",
        ),
        (VERSION, "/tmp/plugin.sock", RESOURCE, "is invalid"),
        (VERSION, KUBELET_SOCKET, RESOURCE, "is invalid"),
        (VERSION, "", RESOURCE, "is invalid"),
        (
            VERSION,
            "missing.sock",
            RESOURCE,
            "failed to dial device plugin",
        ),
    ] {
        let err = register(&s.dir, version, endpoint, resource)
            .await
            .unwrap_err();
        assert!(err.contains(want), "{endpoint} {resource}: {err}");
    }
    assert!(served.plugin.calls().is_empty());
    assert_eq!(s.manager.resources(), DevicePluginResources::default());
    served.stop().await;
}

/// upstream: a second registration of a resource takes over its endpoint; here the old
/// plugin's stream is dropped, and its later end changes nothing.
#[tokio::test]
async fn a_new_registration_of_a_resource_replaces_the_old_plugin() {
    let s = setup().await;
    let old = serve(FakePlugin::default(), &s.dir, "old.sock");
    old.plugin.update_devices(&[("0", true), ("1", true)]);
    register(&s.dir, VERSION, "old.sock", RESOURCE)
        .await
        .unwrap();
    eventually(&s.manager, RESOURCE, (Some(2), Some(2))).await;
    let first = s.manager.generation(RESOURCE).unwrap();
    let new = serve(FakePlugin::default(), &s.dir, "new.sock");
    new.plugin
        .update_devices(&[("a", true), ("b", true), ("c", false)]);
    register(&s.dir, VERSION, "new.sock", RESOURCE)
        .await
        .unwrap();
    eventually(&s.manager, RESOURCE, (Some(2), Some(3))).await;
    assert_ne!(s.manager.generation(RESOURCE), Some(first));
    // The old plugin's updates and end are ignored.
    old.plugin.update_devices(&[("0", true)]);
    old.stop().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        values(&s.manager, Instant::now(), RESOURCE),
        (Some(2), Some(3))
    );
    new.stop().await;
    eventually(&s.manager, RESOURCE, (Some(0), Some(3))).await;
}

/// A plugin listing more than `MAX_DEVICES` devices is taken for stopped: its resource never
/// has them.
#[tokio::test]
async fn a_list_of_too_many_devices_stops_the_plugin() {
    let s = setup().await;
    let served = serve(FakePlugin::default(), &s.dir, "plugin.sock");
    let ids: Vec<String> = (0..=MAX_DEVICES).map(|i| i.to_string()).collect();
    let list: Vec<(&str, bool)> = ids.iter().map(|id| (id.as_str(), true)).collect();
    served.plugin.update_devices(&list);
    register(&s.dir, VERSION, "plugin.sock", RESOURCE)
        .await
        .unwrap();
    eventually(&s.manager, RESOURCE, (Some(0), Some(0))).await;
    served.stop().await;
}

/// upstream `CleanupPluginDirectory`: the sockets left in the directory are removed at start,
/// other files and directories stay; the registration socket goes when the manager stops.
#[tokio::test]
async fn start_removes_stale_sockets_and_stop_removes_the_registration_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("device-plugins");
    std::fs::create_dir(&dir).unwrap();
    let stale = std::os::unix::net::UnixListener::bind(dir.join("stale.sock")).unwrap();
    std::fs::write(dir.join("kubelet_internal_checkpoint"), "{}").unwrap();
    std::fs::create_dir(dir.join("sub")).unwrap();
    let manager = DeviceManager::new(&dir);
    let cancel = CancellationToken::new();
    manager.start(cancel.clone()).await.unwrap();
    drop(stale);
    assert!(!dir.join("stale.sock").exists());
    assert!(dir.join("kubelet_internal_checkpoint").is_file());
    assert!(dir.join("sub").is_dir());
    assert!(dir.join(KUBELET_SOCKET).exists());
    cancel.cancel();
    let deadline = Instant::now() + Duration::from_secs(10);
    while dir.join(KUBELET_SOCKET).exists() {
        assert!(Instant::now() < deadline, "the socket stays");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
