//! Fake plugins and fixtures (behind `test-util`), after upstream's `FakeVolumePlugin`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use std::collections::HashMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    ConfigMap, EmptyDirVolumeSource, HostPathVolumeSource, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeSpec, Pod, Secret, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff;
use tokio::sync::broadcast;

use rustlet_core::PodUid;
use rustlet_core::refs::{ObjectKind, referenced_names};

use crate::events::{EventKind, EventRecorder};
use crate::objects::{
    FetchFailure, ObjectChange, ObjectError, ServiceAccountToken, TokenRequestKey, VolumeObjects,
};
use crate::plugin::{
    PluginError, PluginManager, VolumeError, VolumeHost, VolumeMounter, VolumePlugin,
    VolumeUnmounter,
};
use crate::spec::VolumeSpec;

/// A volume name that makes the fake SetUp fail for good (upstream `FailOnSetupVolumeName`).
pub const FAIL_ON_SETUP: &str = "fail-setup";
/// A volume name that makes the fake SetUp end in an unknown state (upstream
/// `TimeoutOnSetupVolumeName`).
pub const TIMEOUT_ON_SETUP: &str = "timeout-setup";
/// A volume name whose fake SetUp panics.
pub const PANIC_ON_SETUP: &str = "panic-setup";
/// A volume name whose fake TearDown fails.
pub const FAIL_ON_TEARDOWN: &str = "fail-teardown";
/// A volume name whose first fake SetUp (of [`FakeAttachablePlugin`]) times out and whose later
/// ones fail for good (upstream `TimeoutAndFailOnSetupVolumeName`).
pub const TIMEOUT_AND_FAIL_ON_SETUP: &str = "timeout-and-fail-setup-volume";
/// A volume name whose first fake SetUp succeeds and whose later ones time out (upstream
/// `SuccessAndTimeoutSetupVolumeName`).
pub const SUCCESS_AND_TIMEOUT_SETUP: &str = "success-and-timeout-setup-volume-name";
/// A volume name whose first fake SetUp succeeds and whose later ones fail for good (upstream
/// `SuccessAndFailOnSetupVolumeName`).
pub const SUCCESS_AND_FAIL_ON_SETUP: &str = "success-and-failed-setup-device-name";
/// A volume name whose fake MountDevice always times out (upstream
/// `TimeoutOnMountDeviceVolumeName`).
pub const TIMEOUT_ON_MOUNT_DEVICE: &str = "timeout-mount-device-volume";
/// A volume name whose first fake MountDevice times out and whose later ones fail for good
/// (upstream `TimeoutAndFailOnMountDeviceVolumeName`).
pub const TIMEOUT_AND_FAIL_ON_MOUNT_DEVICE: &str = "timeout-and-fail-mount-device-name";
/// A volume name whose fake MountDevice always fails for good (upstream
/// `FailMountDeviceVolumeName`).
pub const FAIL_MOUNT_DEVICE: &str = "fail-mount-device-volume-name";
/// A volume name whose first fake MountDevice succeeds and whose later ones time out
/// (upstream `SuccessAndTimeoutDeviceName`).
pub const SUCCESS_AND_TIMEOUT_DEVICE: &str = "success-and-timeout-device-name";
/// A volume name whose first fake MountDevice succeeds and whose later ones fail for good
/// (upstream `SuccessAndFailOnMountDeviceName`).
pub const SUCCESS_AND_FAIL_ON_MOUNT_DEVICE: &str = "success-and-failed-mount-device-name";

/// Call counters of a fake plugin, shared by its mounters.
#[derive(Debug, Default)]
pub struct Calls {
    /// SetUp calls.
    pub set_up: AtomicUsize,
    /// TearDown calls.
    pub tear_down: AtomicUsize,
    /// From now on every SetUp times out (an uncertain outcome), whatever the volume's name.
    pub time_out_set_ups: std::sync::atomic::AtomicBool,
    /// The volume name and the thread of every SetUp, in order.
    pub set_up_threads: Mutex<Vec<(String, std::thread::ThreadId)>>,
    /// SetUps of the volume of this name pass this gate first.
    pub set_up_gate: Mutex<Option<(String, Arc<ThreadGate>)>>,
}

impl Calls {
    /// SetUp calls so far.
    pub fn set_ups(&self) -> usize {
        self.set_up.load(Ordering::SeqCst)
    }

    /// TearDown calls so far.
    pub fn tear_downs(&self) -> usize {
        self.tear_down.load(Ordering::SeqCst)
    }
}

struct FakeVolume {
    path: PathBuf,
    name: String,
    calls: Arc<Calls>,
}

impl VolumeMounter for FakeVolume {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn set_up(&self) -> Result<(), VolumeError> {
        let gate = self
            .calls
            .set_up_gate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some((name, gate)) = gate
            && name == self.name
        {
            gate.pass();
        }
        self.calls
            .set_up_threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((self.name.clone(), std::thread::current().id()));
        self.calls.set_up.fetch_add(1, Ordering::SeqCst);
        if self.name == PANIC_ON_SETUP {
            panic!("fake SetUp panicked");
        }
        if self.calls.time_out_set_ups.load(Ordering::SeqCst) {
            return Err(VolumeError::Uncertain("mount timed out: fake error".into()));
        }
        match self.name.as_str() {
            FAIL_ON_SETUP => Err(VolumeError::Final("mount failed: fake error".into())),
            TIMEOUT_ON_SETUP => Err(VolumeError::Uncertain("mount timed out: fake error".into())),
            _ => std::fs::create_dir_all(&self.path).map_err(|e| VolumeError::Final(e.to_string())),
        }
    }
}

impl VolumeUnmounter for FakeVolume {
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn tear_down(&self) -> Result<(), VolumeError> {
        self.calls.tear_down.fetch_add(1, Ordering::SeqCst);
        if self.name == FAIL_ON_TEARDOWN {
            return Err(VolumeError::Final("unmount failed: fake error".into()));
        }
        match std::fs::remove_dir(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(VolumeError::Final(e.to_string()))
            }
            _ => Ok(()),
        }
    }
}

/// Records events in memory.
#[derive(Debug, Default)]
pub struct FakeRecorder {
    events: Mutex<Vec<(EventKind, String, String)>>,
}

impl FakeRecorder {
    /// `(kind, reason, message)` of every event so far.
    pub fn events(&self) -> Vec<(EventKind, String, String)> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl EventRecorder for FakeRecorder {
    fn event(&self, _pod: &Pod, kind: EventKind, reason: &str, message: &str) {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push((
            kind,
            reason.to_owned(),
            message.to_owned(),
        ));
    }
}

/// What a fake plugin serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Serves {
    /// Inline `emptyDir` volumes.
    #[default]
    EmptyDir,
    /// Inline `hostPath` volumes.
    HostPath,
    /// PersistentVolumes.
    PersistentVolumes,
}

/// A configurable fake plugin. Its mounters create and remove a directory; the magic volume
/// names [`FAIL_ON_SETUP`], [`TIMEOUT_ON_SETUP`] and [`FAIL_ON_TEARDOWN`] switch the error paths.
#[derive(Clone, Debug, Default)]
pub struct FakePlugin {
    /// Plugin name.
    pub name: &'static str,
    /// What it serves.
    pub serves: Serves,
    /// Attachable.
    pub attachable: bool,
    /// Device-mountable.
    pub device_mountable: bool,
    /// Requires remount.
    pub requires_remount: bool,
    /// Calls made through its mounters.
    pub calls: Arc<Calls>,
}

impl VolumePlugin for FakePlugin {
    fn name(&self) -> &str {
        self.name
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        match (self.serves, spec) {
            (Serves::EmptyDir, VolumeSpec::Pod(v)) => v.empty_dir.is_some(),
            (Serves::HostPath, VolumeSpec::Pod(v)) => v.host_path.is_some(),
            (Serves::PersistentVolumes, VolumeSpec::Persistent { .. }) => true,
            _ => false,
        }
    }

    fn is_attachable(&self) -> bool {
        self.attachable
    }

    fn is_device_mountable(&self) -> bool {
        self.device_mountable
    }

    fn requires_remount(&self, _spec: &VolumeSpec) -> bool {
        self.requires_remount
    }

    fn new_mounter(
        &self,
        spec: &VolumeSpec,
        pod: &Pod,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeMounter>, PluginError> {
        let uid = PodUid::of(pod);
        Ok(Box::new(FakeVolume {
            path: host.pod_volume_dir(&uid, self.name, spec.name())?,
            name: spec.name().to_owned(),
            calls: self.calls.clone(),
        }))
    }

    fn new_unmounter(
        &self,
        inner_name: &str,
        pod_uid: &PodUid,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeUnmounter>, PluginError> {
        Ok(Box::new(FakeVolume {
            path: host.pod_volume_dir(pod_uid, self.name, inner_name)?,
            name: inner_name.to_owned(),
            calls: self.calls.clone(),
        }))
    }
}

/// Plain per-pod plugins for emptyDir and hostPath, and an attachable fake for PVs.
pub fn fake_plugins() -> PluginManager {
    let plain = |name, serves| FakePlugin {
        name,
        serves,
        ..FakePlugin::default()
    };
    PluginManager::new(vec![
        Arc::new(plain("kubernetes.io/empty-dir", Serves::EmptyDir)),
        Arc::new(plain("kubernetes.io/host-path", Serves::HostPath)),
        Arc::new(FakePlugin {
            name: "fake-plugin",
            serves: Serves::PersistentVolumes,
            attachable: true,
            device_mountable: true,
            ..FakePlugin::default()
        }),
    ])
}

/// An emptyDir pod volume.
pub fn empty_dir(name: &str) -> VolumeSpec {
    VolumeSpec::pod(Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    })
}

/// A hostPath pod volume.
pub fn host_path(name: &str, path: &str) -> VolumeSpec {
    VolumeSpec::pod(Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: None,
        }),
        ..Default::default()
    })
}

/// A PersistentVolume spec.
pub fn persistent(name: &str) -> VolumeSpec {
    VolumeSpec::persistent(
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec::default()),
            ..Default::default()
        },
        false,
    )
}

/// A pod with a UID and name.
pub fn pod(uid: &str) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            name: Some(format!("pod-{uid}")),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        ..Default::default()
    })
}

/// A pod source and pod-state provider in memory.
#[derive(Debug)]
pub struct FakePods {
    pods: Mutex<Vec<Arc<Pod>>>,
    /// The same pods by UID (O(1) [`crate::populator::PodSource::pod`]).
    by_uid: Mutex<HashMap<PodUid, Arc<Pod>>>,
    ready: std::sync::atomic::AtomicBool,
    terminating: Mutex<std::collections::HashSet<PodUid>>,
    removed: Mutex<std::collections::HashSet<PodUid>>,
    /// Every add and removal, as the agent's pod cache logs them.
    changes: Mutex<rustlet_core::ChangeLog>,
    /// Every lifecycle change, as the agent's pod workers log them.
    state_changes: Mutex<rustlet_core::ChangeLog>,
}

impl Default for FakePods {
    fn default() -> Self {
        Self {
            pods: Mutex::new(Vec::new()),
            by_uid: Mutex::default(),
            ready: std::sync::atomic::AtomicBool::new(true),
            terminating: Mutex::default(),
            removed: Mutex::default(),
            changes: Mutex::default(),
            state_changes: Mutex::default(),
        }
    }
}

impl FakePods {
    /// Adds (or replaces) a pod.
    pub fn add(&self, pod: Arc<Pod>) {
        let mut pods = self.pods.lock().unwrap();
        let uid = PodUid::of(&pod);
        self.changes.lock().unwrap().record(uid.clone());
        let replaced = self.by_uid.lock().unwrap().insert(uid, pod.clone());
        if let Some(old) = replaced {
            pods.retain(|p| !Arc::ptr_eq(p, &old));
        }
        pods.push(pod);
    }

    /// Removes a pod from the source.
    pub fn remove(&self, uid: &str) {
        self.changes.lock().unwrap().record(PodUid::new(uid));
        self.by_uid.lock().unwrap().remove(&PodUid::new(uid));
        self.pods
            .lock()
            .unwrap()
            .retain(|p| PodUid::of(p).as_str() != uid);
    }

    /// Whether the sources are ready.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, std::sync::atomic::Ordering::SeqCst);
    }

    /// Termination requested for a pod.
    pub fn set_terminating(&self, uid: &str) {
        self.terminating.lock().unwrap().insert(PodUid::new(uid));
        self.state_changes.lock().unwrap().record(PodUid::new(uid));
    }

    /// Every container of a pod stopped.
    pub fn set_runtime_removed(&self, uid: &str) {
        self.removed.lock().unwrap().insert(PodUid::new(uid));
        self.state_changes.lock().unwrap().record(PodUid::new(uid));
    }
}

impl crate::populator::PodSource for FakePods {
    fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.lock().unwrap().clone()
    }

    fn all_sources_ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn changes_since(&self, cursor: u64) -> rustlet_core::PodChanges {
        self.changes.lock().unwrap().since(cursor)
    }

    fn pod(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.by_uid.lock().unwrap().get(uid).cloned()
    }
}

impl crate::populator::PodStateProvider for FakePods {
    fn should_pod_containers_be_terminating(&self, uid: &PodUid) -> bool {
        self.terminating.lock().unwrap().contains(uid) || self.removed.lock().unwrap().contains(uid)
    }

    fn should_pod_runtime_be_removed(&self, uid: &PodUid) -> bool {
        self.removed.lock().unwrap().contains(uid)
    }

    fn changes_since(&self, cursor: u64) -> rustlet_core::PodChanges {
        self.state_changes.lock().unwrap().since(cursor)
    }
}

/// A pod whose single container mounts every given volume.
pub fn pod_with_volumes(uid: &str, volumes: Vec<Volume>) -> Arc<Pod> {
    use k8s_openapi::api::core::v1::{Container, PodSpec, VolumeMount};
    let mounts = volumes
        .iter()
        .map(|v| VolumeMount {
            name: v.name.clone(),
            mount_path: format!("/mnt/{}", v.name),
            ..Default::default()
        })
        .collect();
    let mut pod = (*pod(uid)).clone();
    pod.spec = Some(PodSpec {
        containers: vec![Container {
            name: "c".into(),
            volume_mounts: Some(mounts),
            ..Default::default()
        }],
        volumes: Some(volumes),
        ..Default::default()
    });
    Arc::new(pod)
}

/// The inline volume of a pod-volume spec.
pub fn volume(spec: VolumeSpec) -> Volume {
    match spec {
        VolumeSpec::Pod(v) => Arc::unwrap_or_clone(v),
        VolumeSpec::Persistent { .. } => panic!("not an inline volume"),
    }
}

/// Call counters of the fake attachable plugin.
#[derive(Debug, Default)]
pub struct AttachCalls {
    /// WaitForAttach calls.
    pub wait_for_attach: AtomicUsize,
    /// MountDevice calls.
    pub mount_device: AtomicUsize,
    /// UnmountDevice calls.
    pub unmount_device: AtomicUsize,
    /// SetUp calls.
    pub set_up: AtomicUsize,
    /// TearDown calls.
    pub tear_down: AtomicUsize,
    /// The device path of the last WaitForAttach.
    pub waited_for: Mutex<String>,
    /// The volumes MountDevice was called for before (upstream's fake keeps a per-volume
    /// device state for the same purpose): the magic names' "first call, later calls".
    mount_device_seen: Mutex<std::collections::HashSet<String>>,
    /// The volumes SetUp was called for before.
    set_up_seen: Mutex<std::collections::HashSet<String>>,
}

/// Whether `name` was seen before by `seen` (and records it).
fn seen_before(seen: &Mutex<std::collections::HashSet<String>>, name: &str) -> bool {
    !seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name.to_owned())
}

/// What the magic volume names make the fake attachable plugin's MountDevice return
/// (upstream `FakeVolume.mountDeviceInternal`).
fn magic_mount_device(calls: &AttachCalls, name: &str) -> Result<(), VolumeError> {
    let again = seen_before(&calls.mount_device_seen, name);
    let timeout = || VolumeError::Uncertain("timed out mounting error: fake error".into());
    let fail = || VolumeError::Final(format!("error mounting disk: {name}"));
    match name {
        TIMEOUT_ON_MOUNT_DEVICE => Err(timeout()),
        FAIL_MOUNT_DEVICE => Err(fail()),
        TIMEOUT_AND_FAIL_ON_MOUNT_DEVICE if again => Err(fail()),
        TIMEOUT_AND_FAIL_ON_MOUNT_DEVICE => Err(timeout()),
        SUCCESS_AND_TIMEOUT_DEVICE if again => Err(timeout()),
        SUCCESS_AND_FAIL_ON_MOUNT_DEVICE if again => Err(fail()),
        _ => Ok(()),
    }
}

/// What the magic volume names make the fake attachable plugin's SetUp return (upstream
/// `FakeVolume.setupInternal`).
fn magic_set_up(calls: &AttachCalls, name: &str) -> Result<(), VolumeError> {
    let again = seen_before(&calls.set_up_seen, name);
    let timeout = || VolumeError::Uncertain("time out on setup: fake error".into());
    let fail = || VolumeError::Final("mounting volume failed: fake error".into());
    match name {
        TIMEOUT_ON_SETUP => Err(timeout()),
        FAIL_ON_SETUP => Err(fail()),
        TIMEOUT_AND_FAIL_ON_SETUP if again => Err(fail()),
        TIMEOUT_AND_FAIL_ON_SETUP => Err(timeout()),
        SUCCESS_AND_TIMEOUT_SETUP if again => Err(timeout()),
        SUCCESS_AND_FAIL_ON_SETUP if again => Err(fail()),
        _ => Ok(()),
    }
}

impl AttachCalls {
    /// (WaitForAttach, MountDevice, SetUp, TearDown, UnmountDevice) so far.
    pub fn counts(&self) -> (usize, usize, usize, usize, usize) {
        let g = |a: &AtomicUsize| a.load(Ordering::SeqCst);
        (
            g(&self.wait_for_attach),
            g(&self.mount_device),
            g(&self.set_up),
            g(&self.tear_down),
            g(&self.unmount_device),
        )
    }
}

/// A test-only attachable, device-mountable plugin for PersistentVolumes (upstream's
/// `FakeVolumePlugin` in its attachable role). MountDevice binds a fake device directory
/// `<root>/fake-devices/<pv>` onto the global path; SetUp binds the global path into the pod.
/// The magic PV names of upstream's fake ([`TIMEOUT_ON_MOUNT_DEVICE`], [`FAIL_ON_SETUP`], ...)
/// switch MountDevice's and SetUp's error paths.
///
/// [`FakeDeviceKind::DeviceMountable`] makes it a device-mountable plugin that is not attachable
/// (upstream's local volume plugin): it serves the PVs with a `local` source, the attachable kind
/// the others, so both can be registered together.
#[derive(Clone, Debug, Default)]
pub struct FakeAttachablePlugin {
    /// Calls made through it.
    pub calls: Arc<AttachCalls>,
    /// Which kind of plugin it is.
    pub kind: FakeDeviceKind,
    /// Its volumes require a periodic remount (upstream `SupportsRemount`).
    pub requires_remount: bool,
    /// Set: the plugin no longer attaches (upstream `NonAttachable`, a CSI driver whose
    /// `attachRequired` changed). Shared by the clones, so a test flips a registered plugin.
    pub non_attachable: Arc<std::sync::atomic::AtomicBool>,
}

/// The kinds of the fake device plugin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FakeDeviceKind {
    /// Attachable and device-mountable (named [`FAKE_ATTACHABLE`]).
    #[default]
    Attachable,
    /// Device-mountable only (named [`FAKE_DEVICE_MOUNTABLE`]).
    DeviceMountable,
}

impl FakeAttachablePlugin {
    /// The device-mountable, not attachable, kind.
    pub fn device_mountable() -> Self {
        Self {
            kind: FakeDeviceKind::DeviceMountable,
            ..Self::default()
        }
    }
}

/// A PV the device-mountable kind serves (it has a `local` source).
pub fn local_persistent(name: &str) -> VolumeSpec {
    let mut spec = persistent(name);
    if let VolumeSpec::Persistent { pv, .. } = &mut spec {
        Arc::make_mut(pv).spec.get_or_insert_default().local = Some(Default::default());
    }
    spec
}

/// The fake attachable plugin's name.
pub const FAKE_ATTACHABLE: &str = "kubernetes.io/fake-attachable";
/// The fake device-mountable plugin's name.
pub const FAKE_DEVICE_MOUNTABLE: &str = "kubernetes.io/fake-device-mountable";

struct FakeDevice {
    plugin: &'static str,
    host: VolumeHost,
    calls: Arc<AttachCalls>,
}

impl crate::plugin::DeviceMounter for FakeDevice {
    fn wait_for_attach(
        &self,
        _spec: &VolumeSpec,
        device_path: &str,
    ) -> Result<String, VolumeError> {
        self.calls.wait_for_attach.fetch_add(1, Ordering::SeqCst);
        device_path.clone_into(&mut self.calls.waited_for.lock().unwrap());
        if device_path.is_empty() {
            return Err(VolumeError::Final("no device path".into()));
        }
        Ok(device_path.to_owned())
    }

    fn device_mount_path(&self, spec: &VolumeSpec) -> Result<PathBuf, VolumeError> {
        Ok(self.host.plugin_global_mount_dir(self.plugin, spec.name()))
    }

    fn mount_device(
        &self,
        spec: &VolumeSpec,
        _device_path: &str,
        path: &std::path::Path,
    ) -> Result<(), VolumeError> {
        self.calls.mount_device.fetch_add(1, Ordering::SeqCst);
        magic_mount_device(&self.calls, spec.name())?;
        let device = self.host.root_dir.join("fake-devices").join(spec.name());
        let fail = |e: &dyn std::fmt::Display| VolumeError::Final(e.to_string());
        std::fs::create_dir_all(&device).map_err(|e| fail(&e))?;
        std::fs::create_dir_all(path).map_err(|e| fail(&e))?;
        if !self
            .host
            .mounter
            .is_mount_point(path)
            .map_err(|e| fail(&e))?
        {
            self.host
                .mounter
                .bind(&device, path, rustlet_mount::BindAccess::ReadWrite)
                .map_err(|e| fail(&e))?;
        }
        Ok(())
    }

    fn unmount_device(&self, path: &std::path::Path) -> Result<(), VolumeError> {
        self.calls.unmount_device.fetch_add(1, Ordering::SeqCst);
        self.host
            .mounter
            .cleanup_mount_point(path, rustlet_mount::MountPointCheck::Exact)
            .map_err(|e| VolumeError::Final(e.to_string()))
    }
}

struct FakeAttachedVolume {
    /// The inner spec name (the PV's).
    name: String,
    pod_dir: PathBuf,
    global: PathBuf,
    host: VolumeHost,
    calls: Arc<AttachCalls>,
}

impl VolumeMounter for FakeAttachedVolume {
    fn path(&self) -> PathBuf {
        self.pod_dir.clone()
    }

    fn set_up(&self) -> Result<(), VolumeError> {
        self.calls.set_up.fetch_add(1, Ordering::SeqCst);
        magic_set_up(&self.calls, &self.name)?;
        let fail = |e: &dyn std::fmt::Display| VolumeError::Final(e.to_string());
        std::fs::create_dir_all(&self.pod_dir).map_err(|e| fail(&e))?;
        if !self
            .host
            .mounter
            .is_mount_point(&self.pod_dir)
            .map_err(|e| fail(&e))?
        {
            self.host
                .mounter
                .bind(
                    &self.global,
                    &self.pod_dir,
                    rustlet_mount::BindAccess::ReadWrite,
                )
                .map_err(|e| fail(&e))?;
        }
        Ok(())
    }
}

impl VolumeUnmounter for FakeAttachedVolume {
    fn path(&self) -> PathBuf {
        self.pod_dir.clone()
    }

    fn tear_down(&self) -> Result<(), VolumeError> {
        self.calls.tear_down.fetch_add(1, Ordering::SeqCst);
        self.host
            .mounter
            .cleanup_mount_point(&self.pod_dir, rustlet_mount::MountPointCheck::Exact)
            .map_err(|e| VolumeError::Uncertain(e.to_string()))
    }
}

impl FakeAttachablePlugin {
    fn plugin_name(&self) -> &'static str {
        match self.kind {
            FakeDeviceKind::Attachable => FAKE_ATTACHABLE,
            FakeDeviceKind::DeviceMountable => FAKE_DEVICE_MOUNTABLE,
        }
    }
}

impl VolumePlugin for FakeAttachablePlugin {
    fn name(&self) -> &str {
        self.plugin_name()
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        let VolumeSpec::Persistent { pv, .. } = spec else {
            return false;
        };
        let local = pv.spec.as_ref().is_some_and(|s| s.local.is_some());
        local == (self.kind == FakeDeviceKind::DeviceMountable)
    }

    fn is_attachable(&self) -> bool {
        self.kind == FakeDeviceKind::Attachable && !self.non_attachable.load(Ordering::SeqCst)
    }

    fn is_device_mountable(&self) -> bool {
        true
    }

    fn requires_remount(&self, _spec: &VolumeSpec) -> bool {
        self.requires_remount
    }

    fn new_device_mounter(
        &self,
        host: &VolumeHost,
    ) -> Result<Box<dyn crate::plugin::DeviceMounter>, PluginError> {
        Ok(Box::new(FakeDevice {
            plugin: self.plugin_name(),
            host: host.clone(),
            calls: self.calls.clone(),
        }))
    }

    fn new_mounter(
        &self,
        spec: &VolumeSpec,
        pod: &Pod,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeMounter>, PluginError> {
        let uid = PodUid::of(pod);
        Ok(Box::new(FakeAttachedVolume {
            name: spec.name().to_owned(),
            pod_dir: host.pod_volume_dir(&uid, self.plugin_name(), spec.name())?,
            global: host.plugin_global_mount_dir(self.plugin_name(), spec.name()),
            host: host.clone(),
            calls: self.calls.clone(),
        }))
    }

    fn construct_volume_spec(
        &self,
        inner_name: &str,
        _mount_path: &std::path::Path,
        _host: &VolumeHost,
    ) -> Result<VolumeSpec, PluginError> {
        Ok(match self.kind {
            FakeDeviceKind::Attachable => persistent(inner_name),
            FakeDeviceKind::DeviceMountable => local_persistent(inner_name),
        })
    }

    fn new_unmounter(
        &self,
        inner_name: &str,
        pod_uid: &PodUid,
        host: &VolumeHost,
    ) -> Result<Box<dyn VolumeUnmounter>, PluginError> {
        Ok(Box::new(FakeAttachedVolume {
            name: inner_name.to_owned(),
            pod_dir: host.pod_volume_dir(pod_uid, self.plugin_name(), inner_name)?,
            global: host.plugin_global_mount_dir(self.plugin_name(), inner_name),
            host: host.clone(),
            calls: self.calls.clone(),
        }))
    }
}

/// A node status whose attached volumes a test sets: read, with nothing attached, by default.
#[derive(Debug)]
pub struct FakeNodeStatus {
    /// `None` while the node has not been read.
    attached: Mutex<Option<Vec<crate::node::AttachedToNode>>>,
}

impl Default for FakeNodeStatus {
    fn default() -> Self {
        Self {
            attached: Mutex::new(Some(Vec::new())),
        }
    }
}

impl FakeNodeStatus {
    /// A node not read yet (the agent's node watch has not listed it).
    pub fn unseen() -> Self {
        Self {
            attached: Mutex::new(None),
        }
    }

    /// Replaces `volumesAttached` (the node is now read).
    pub fn set(&self, attached: Vec<crate::node::AttachedToNode>) {
        *self.attached.lock().unwrap() = Some(attached);
    }
}

impl crate::node::NodeStatus for FakeNodeStatus {
    fn volumes_attached(&self) -> Vec<crate::node::AttachedToNode> {
        self.attached.lock().unwrap().clone().unwrap_or_default()
    }

    fn observed_volumes_attached(&self) -> Option<Vec<crate::node::AttachedToNode>> {
        self.attached.lock().unwrap().clone()
    }
}

/// A stateful [`crate::objects::VolumeObjects`]: objects a test puts in, registrations checked
/// as the real managers check them (a ConfigMap or Secret no registered pod references is
/// "not registered"), changes announced, tokens issued on a clock the test moves.
#[derive(Debug)]
pub struct FakeVolumeObjects {
    state: Mutex<FakeObjectsState>,
    changes: broadcast::Sender<ObjectChange>,
}

#[derive(Debug)]
struct FakeObjectsState {
    config_maps: HashMap<(String, String), Arc<ConfigMap>>,
    secrets: HashMap<(String, String), Arc<Secret>>,
    claims: HashMap<(String, String), PersistentVolumeClaim>,
    volumes: HashMap<String, PersistentVolume>,
    registered: HashMap<PodUid, Vec<(ObjectKind, String, String)>>,
    tokens: HashMap<TokenRequestKey, ServiceAccountToken>,
    tokens_issued: usize,
    now: jiff::Timestamp,
}

impl Default for FakeVolumeObjects {
    fn default() -> Self {
        Self {
            state: Mutex::new(FakeObjectsState {
                config_maps: Default::default(),
                secrets: Default::default(),
                claims: Default::default(),
                volumes: Default::default(),
                registered: Default::default(),
                tokens: Default::default(),
                tokens_issued: 0,
                now: jiff::Timestamp::from_second(1_700_000_000).expect("a valid timestamp"),
            }),
            changes: broadcast::channel(64).0,
        }
    }
}

fn namespaced_key(meta: &ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

impl FakeVolumeObjects {
    fn lock(&self) -> std::sync::MutexGuard<'_, FakeObjectsState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn announce(&self, kind: ObjectKind, (namespace, name): (String, String)) {
        let registered = self
            .lock()
            .registered
            .values()
            .flatten()
            .any(|(k, ns, n)| *k == kind && *ns == namespace && *n == name);
        if registered {
            let _ = self.changes.send(ObjectChange {
                kind,
                namespace,
                name,
            });
        }
    }

    /// Creates or replaces a ConfigMap (announced when registered).
    pub fn put_config_map(&self, object: ConfigMap) {
        let key = namespaced_key(&object.metadata);
        self.lock()
            .config_maps
            .insert(key.clone(), Arc::new(object));
        self.announce(ObjectKind::ConfigMap, key);
    }

    /// Creates or replaces a Secret (announced when registered).
    pub fn put_secret(&self, object: Secret) {
        let key = namespaced_key(&object.metadata);
        self.lock().secrets.insert(key.clone(), Arc::new(object));
        self.announce(ObjectKind::Secret, key);
    }

    /// Deletes a ConfigMap (announced when registered).
    pub fn delete_config_map(&self, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        self.lock().config_maps.remove(&key);
        self.announce(ObjectKind::ConfigMap, key);
    }

    /// Creates or replaces a claim.
    pub fn put_claim(&self, object: PersistentVolumeClaim) {
        let key = namespaced_key(&object.metadata);
        self.lock().claims.insert(key, object);
    }

    /// Creates or replaces a persistent volume.
    pub fn put_volume(&self, object: PersistentVolume) {
        let name = object.metadata.name.clone().unwrap_or_default();
        self.lock().volumes.insert(name, object);
    }

    /// Moves the token clock.
    pub fn advance(&self, by: jiff::SignedDuration) {
        let mut state = self.lock();
        state.now += by;
    }

    /// Tokens issued so far (cache misses).
    pub fn tokens_issued(&self) -> usize {
        self.lock().tokens_issued
    }

    /// Whether `pod` is registered.
    pub fn is_registered(&self, pod: &PodUid) -> bool {
        self.lock().registered.contains_key(pod)
    }

    fn content<T>(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
        pick: impl FnOnce(&FakeObjectsState) -> Option<Arc<T>>,
    ) -> Result<Arc<T>, ObjectError> {
        let state = self.lock();
        let registered = state
            .registered
            .values()
            .flatten()
            .any(|(k, ns, n)| *k == kind && ns == namespace && n == name);
        if !registered {
            return Err(ObjectError::content(
                kind,
                namespace,
                name,
                FetchFailure::NotRegistered,
            ));
        }
        pick(&state)
            .ok_or_else(|| ObjectError::content(kind, namespace, name, FetchFailure::NotFound))
    }
}

#[async_trait]
impl VolumeObjects for FakeVolumeObjects {
    fn register_pod(&self, pod: &Pod) {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let refs = [ObjectKind::ConfigMap, ObjectKind::Secret]
            .into_iter()
            .flat_map(|kind| {
                let namespace = namespace.clone();
                referenced_names(pod, kind)
                    .into_iter()
                    .map(move |name| (kind, namespace.clone(), name))
            })
            .collect();
        self.lock().registered.insert(PodUid::of(pod), refs);
    }

    fn unregister_pod(&self, pod: &Pod) {
        self.lock().registered.remove(&PodUid::of(pod));
    }

    async fn config_map(&self, namespace: &str, name: &str) -> Result<Arc<ConfigMap>, ObjectError> {
        let key = (namespace.to_owned(), name.to_owned());
        self.content(ObjectKind::ConfigMap, namespace, name, |s| {
            s.config_maps.get(&key).cloned()
        })
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Arc<Secret>, ObjectError> {
        let key = (namespace.to_owned(), name.to_owned());
        self.content(ObjectKind::Secret, namespace, name, |s| {
            s.secrets.get(&key).cloned()
        })
    }

    async fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PersistentVolumeClaim, ObjectError> {
        let key = (namespace.to_owned(), name.to_owned());
        self.lock()
            .claims
            .get(&key)
            .cloned()
            .ok_or_else(|| ObjectError::claim(namespace, name, FetchFailure::NotFound))
    }

    async fn persistent_volume(&self, name: &str) -> Result<PersistentVolume, ObjectError> {
        self.lock()
            .volumes
            .get(name)
            .cloned()
            .ok_or_else(|| ObjectError::volume(name, FetchFailure::NotFound))
    }

    async fn service_account_token(
        &self,
        key: &TokenRequestKey,
    ) -> Result<ServiceAccountToken, ObjectError> {
        let mut state = self.lock();
        let now = state.now;
        if let Some(token) = state.tokens.get(key)
            && !token.requires_refresh(now, jiff::SignedDuration::ZERO)
        {
            return Ok(token.clone());
        }
        state.tokens_issued += 1;
        let token = ServiceAccountToken {
            token: format!("token-{}-{}", key.service_account, state.tokens_issued),
            expires_at: now + jiff::SignedDuration::from_secs(key.expiration_seconds),
            lifetime: jiff::SignedDuration::from_secs(key.expiration_seconds),
        };
        state.tokens.insert(key.clone(), token.clone());
        Ok(token)
    }

    fn forget_tokens_of(&self, pod: &PodUid) {
        self.lock()
            .tokens
            .retain(|key, _| key.pod_uid != pod.as_str());
    }

    fn changes(&self) -> broadcast::Receiver<ObjectChange> {
        self.changes.subscribe()
    }
}

/// What [`ThreadGate::parked`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateOutcome {
    /// The gated call is parked on a thread of its own (the blocking pool), holding it.
    Parked,
    /// The gated call came on the thread that runs the test's async tasks: it would have
    /// blocked every task, so it was let through at once (the test fails instead of hanging).
    OnRuntimeThread,
}

#[derive(Debug, Default)]
struct GateState {
    armed: bool,
    outcome: Option<GateOutcome>,
    released: bool,
}

/// A blocking call that a test holds (item 14: blocking work stays off the async runtime).
/// Made on the thread of a `current_thread` runtime (a `#[tokio::test]` body), it parks the
/// first [`ThreadGate::pass`] after [`ThreadGate::arm`] until [`ThreadGate::release`], as a
/// slow disk or a hung mount would; the test meanwhile shows that other tasks go on. A pass on
/// the runtime's own thread never parks (that would deadlock the test): it is recorded as
/// [`GateOutcome::OnRuntimeThread`]. Deterministic: no timeouts, no sleeps.
#[derive(Debug)]
pub struct ThreadGate {
    runtime_thread: std::thread::ThreadId,
    state: Mutex<GateState>,
    released: std::sync::Condvar,
    outcome: tokio::sync::Notify,
}

impl Default for ThreadGate {
    fn default() -> Self {
        Self::new()
    }
}

impl ThreadGate {
    /// A gate, not armed, for the runtime on the calling thread.
    pub fn new() -> Self {
        Self {
            runtime_thread: std::thread::current().id(),
            state: Mutex::default(),
            released: std::sync::Condvar::new(),
            outcome: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next pass parks.
    pub fn arm(&self) {
        let mut state = self.lock();
        state.armed = true;
        state.outcome = None;
        state.released = false;
    }

    /// Called by the gated (blocking) code: parks when armed, unless on the runtime's thread.
    pub fn pass(&self) {
        let mut state = self.lock();
        if !state.armed {
            return;
        }
        state.armed = false;
        if std::thread::current().id() == self.runtime_thread {
            state.outcome = Some(GateOutcome::OnRuntimeThread);
            self.outcome.notify_one();
            return;
        }
        state.outcome = Some(GateOutcome::Parked);
        self.outcome.notify_one();
        while !state.released {
            state = self.released.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits until an armed pass happened: parked, or on the runtime's thread.
    pub async fn parked(&self) -> GateOutcome {
        loop {
            let notified = self.outcome.notified();
            if let Some(outcome) = self.lock().outcome {
                return outcome;
            }
            notified.await;
        }
    }

    /// Lets the parked call go on.
    pub fn release(&self) {
        self.lock().released = true;
        self.released.notify_all();
    }
}

/// A [`rustlet_mount::fake::FakeMounter`] whose `prepare_subpath` first passes a
/// [`ThreadGate`]: a subPath bind that hangs as long as the test wants.
#[derive(Debug)]
pub struct GatedMounter {
    /// What serves every call.
    pub inner: Arc<rustlet_mount::fake::FakeMounter>,
    /// What `prepare_subpath` passes first.
    pub gate: Arc<ThreadGate>,
}

impl crate::mounter::Mounter for GatedMounter {
    fn mount(&self, request: &rustlet_mount::MountRequest) -> rustlet_mount::Result<()> {
        self.inner.mount(request)
    }
    fn bind(
        &self,
        source: &std::path::Path,
        target: &std::path::Path,
        access: rustlet_mount::BindAccess,
    ) -> rustlet_mount::Result<()> {
        self.inner.bind(source, target, access)
    }
    fn tmpfs(
        &self,
        target: &std::path::Path,
        options: rustlet_mount::TmpfsOptions,
    ) -> rustlet_mount::Result<()> {
        self.inner.tmpfs(target, options)
    }
    fn unmount(
        &self,
        target: &std::path::Path,
        mode: rustlet_mount::UnmountMode,
    ) -> rustlet_mount::Result<()> {
        self.inner.unmount(target, mode)
    }
    fn is_likely_not_mount_point(&self, path: &std::path::Path) -> rustlet_mount::Result<bool> {
        self.inner.is_likely_not_mount_point(path)
    }
    fn is_mount_point(&self, path: &std::path::Path) -> rustlet_mount::Result<bool> {
        self.inner.is_mount_point(path)
    }
    fn is_tmpfs_mount_point(&self, path: &std::path::Path) -> rustlet_mount::Result<bool> {
        self.inner.is_tmpfs_mount_point(path)
    }
    fn list(&self) -> rustlet_mount::Result<Vec<rustlet_mount::MountInfo>> {
        self.inner.list()
    }
    fn mount_refs(&self, path: &std::path::Path) -> rustlet_mount::Result<Vec<PathBuf>> {
        self.inner.mount_refs(path)
    }
    fn cleanup_mount_point(
        &self,
        path: &std::path::Path,
        check: rustlet_mount::MountPointCheck,
    ) -> rustlet_mount::Result<()> {
        self.inner.cleanup_mount_point(path, check)
    }
    fn prepare_subpath(&self, subpath: &rustlet_mount::Subpath) -> rustlet_mount::Result<()> {
        self.gate.pass();
        self.inner.prepare_subpath(subpath)
    }
}
