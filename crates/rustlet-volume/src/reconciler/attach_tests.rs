//! The attach path: upstream `reconciler_test.go` controller-attach cases and uncertain-state
//! tables, with the fake attachable plugin and the fake mounter; a restart with attachable and
//! device-mountable volumes mounted (V73-V75); and `reconstruct_test.go`'s
//! `TestReconstructVolumesMount`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use rustlet_core::{UniquePodName, UniqueVolumeName};
use rustlet_mount::fake::FakeMounter;

use super::{PassReport, Reconciler};
use crate::cache::Attachability;
use crate::cache::{ActualStateOfWorld, DesiredStateOfWorld, DeviceMountState, PodVolumeState};
use crate::executor::OperationExecutor;
use crate::node::AttachedToNode;
use crate::operations::OperationKey;
use crate::plugin::{PluginManager, VolumeHost};
use crate::reconstruct::reconstruct;
use crate::testing::{
    FakeAttachablePlugin, FakeNodeStatus, FakeRecorder, local_persistent, persistent, pod,
};

struct World {
    root: Arc<tempfile::TempDir>,
    dsw: Arc<DesiredStateOfWorld>,
    asw: Arc<ActualStateOfWorld>,
    executor: Arc<OperationExecutor>,
    reconciler: Reconciler,
    /// The attachable (and device-mountable) plugin.
    plugin: FakeAttachablePlugin,
    /// The device-mountable, not attachable, plugin.
    local: FakeAttachablePlugin,
    node: Arc<FakeNodeStatus>,
    mounter: FakeMounter,
    /// The populator's "desired state is complete" flag (upstream `populatorHasAddedPods`).
    ready: Arc<AtomicBool>,
}

fn world() -> World {
    world_with(FakeAttachablePlugin::default())
}

/// A world whose attachable plugin is `plugin` (upstream's tests set `SupportsRemount` on theirs).
fn world_with(plugin: FakeAttachablePlugin) -> World {
    world_on_with(
        Arc::new(tempfile::tempdir().unwrap()),
        FakeMounter::new(),
        Arc::new(FakeNodeStatus::default()),
        plugin,
    )
}

/// A fresh agent's caches over this root and mount table (what a restart keeps).
fn world_on(
    root: Arc<tempfile::TempDir>,
    mounter: FakeMounter,
    node: Arc<FakeNodeStatus>,
) -> World {
    world_on_with(root, mounter, node, FakeAttachablePlugin::default())
}

fn world_on_with(
    root: Arc<tempfile::TempDir>,
    mounter: FakeMounter,
    node: Arc<FakeNodeStatus>,
    plugin: FakeAttachablePlugin,
) -> World {
    let local = FakeAttachablePlugin::device_mountable();
    let plugins = PluginManager::new(vec![Arc::new(plugin.clone()), Arc::new(local.clone())]);
    let host = VolumeHost {
        root_dir: root.path().to_owned(),
        mounter: Arc::new(mounter.clone()),
        node_allocatable_memory: None,
    };
    let dsw = Arc::new(DesiredStateOfWorld::new(plugins.clone()));
    let asw = Arc::new(ActualStateOfWorld::new(plugins.clone()));
    let executor = Arc::new(
        OperationExecutor::new(
            asw.clone(),
            plugins,
            host,
            Arc::new(FakeRecorder::default()),
        )
        .with_node_status(node.clone()),
    );
    let ready = Arc::new(AtomicBool::new(true));
    let reconciler = Reconciler::new(dsw.clone(), asw.clone(), executor.clone(), ready.clone());
    World {
        root,
        dsw,
        asw,
        executor,
        reconciler,
        plugin,
        local,
        node,
        mounter,
        ready,
    }
}

impl World {
    async fn pass(&self) -> PassReport {
        let report = self.reconciler.reconcile();
        self.executor.operations().wait().await;
        report
    }

    fn add(&self, pod_uid: &str) -> UniqueVolumeName {
        self.add_pv(pod_uid, "pv-1", "data")
    }

    /// The pod's volume `outer`, the attachable PV `pv`.
    fn add_pv(&self, pod_uid: &str, pv: &str, outer: &str) -> UniqueVolumeName {
        self.dsw
            .add_pod_to_volume(
                &UniquePodName::new(pod_uid),
                pod(pod_uid),
                persistent(pv),
                outer,
            )
            .unwrap()
    }

    /// Upstream's reconciler loop (a pass every 100 ms) for `duration` of paused time.
    async fn run_for(&self, duration: std::time::Duration) {
        let end = tokio::time::Instant::now() + duration;
        while tokio::time::Instant::now() < end {
            self.pass().await;
            tokio::time::advance(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Upstream `waitForDetach`: runs the loop until the volume is gone from the actual state
    /// (at most a minute of paused time).
    async fn run_until_gone(&self, volume: &UniqueVolumeName) {
        for _ in 0..600 {
            if !self
                .asw
                .attached_volumes()
                .iter()
                .any(|v| v.volume_name == *volume)
            {
                return;
            }
            self.pass().await;
            tokio::time::advance(std::time::Duration::from_millis(100)).await;
        }
        panic!("volume {volume} still in the actual state");
    }

    /// The pod's device-mountable (local PV) volume.
    fn add_local(&self, pod_uid: &str) -> UniqueVolumeName {
        self.dsw
            .add_pod_to_volume(
                &UniquePodName::new(pod_uid),
                pod(pod_uid),
                local_persistent("disk-1"),
                "disk",
            )
            .unwrap()
    }

    /// The agent dies and a new one starts on the same root, with this view of the node, and
    /// reconstructs (V69-V73).
    fn restart(&self, node: FakeNodeStatus) -> World {
        let w = world_on(self.root.clone(), self.mounter.clone(), Arc::new(node));
        let host = VolumeHost {
            root_dir: w.root.path().to_owned(),
            mounter: Arc::new(w.mounter.clone()),
            node_allocatable_memory: None,
        };
        let report = reconstruct(&w.asw, &self.executor_plugins(), &host);
        assert!(report.failed.is_empty(), "{report:?}");
        w.reconciler
            .add_volumes_needing_node_status(report.volume_names);
        w
    }

    fn executor_plugins(&self) -> PluginManager {
        PluginManager::new(vec![
            Arc::new(self.plugin.clone()),
            Arc::new(self.local.clone()),
        ])
    }

    fn attach(&self, volume: &UniqueVolumeName) {
        self.dsw
            .mark_volumes_reported_in_use(std::slice::from_ref(volume));
        self.node.set(vec![AttachedToNode {
            name: volume.clone(),
            device_path: "/dev/fake-1".into(),
        }]);
    }
}

#[tokio::test(start_paused = true)]
async fn test_run_positive_volume_mount_controller_attach_enabled() {
    let w = world();
    let vol = w.add("p1");
    assert_eq!(
        vol.as_str(),
        "kubernetes.io/fake-attachable/pv-1",
        "shared name"
    );
    w.attach(&vol);
    assert_eq!(w.pass().await.mounts, 1);
    // WaitForAttach ×1, MountDevice ×1, SetUp ×1; no TearDown, no UnmountDevice.
    assert_eq!(w.plugin.calls.counts(), (1, 1, 1, 0, 0));
    let global = w.asw.globally_mounted_volumes();
    assert_eq!(global.len(), 1);
    assert_eq!(global[0].device_path, "/dev/fake-1");
    assert!(
        global[0]
            .device_mount_path
            .ends_with("plugins/kubernetes.io/fake-attachable/mounts/pv-1")
    );
    assert!(matches!(
        w.asw.pod_exists_in_volume(&UniquePodName::new("p1"), &vol),
        PodVolumeState::Mounted { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn test_run_negative_volume_mount_controller_attach_enabled() {
    let w = world();
    let vol = w.add("p1");
    // Not reported in use: nothing starts, and no backoff is recorded (V46).
    w.pass().await;
    assert_eq!(w.plugin.calls.counts(), (0, 0, 0, 0, 0));
    assert!(
        w.executor
            .operations()
            .is_operation_safe_to_retry(&OperationKey::new(vol.clone(), None), "volume_mount")
    );
    // Reported in use but not yet attached according to the node: still waiting.
    w.dsw
        .mark_volumes_reported_in_use(std::slice::from_ref(&vol));
    w.pass().await;
    assert_eq!(w.plugin.calls.counts(), (0, 0, 0, 0, 0));
    assert_eq!(
        w.asw.pod_exists_in_volume(&UniquePodName::new("p1"), &vol),
        PodVolumeState::NotAttached
    );
    // The node status lists it: mounted.
    w.node.set(vec![AttachedToNode {
        name: vol.clone(),
        device_path: "/dev/fake-1".into(),
    }]);
    assert_eq!(w.pass().await.mounts, 1);
}

#[tokio::test(start_paused = true)]
async fn test_run_positive_volume_unmount_controller_attach_enabled() {
    let w = world();
    let vol = w.add("p1");
    w.attach(&vol);
    w.pass().await;
    w.dsw
        .delete_pod_from_volume(&UniquePodName::new("p1"), &vol);
    assert_eq!(w.pass().await.unmounts, 1);
    assert_eq!(w.pass().await.device_unmounts, 1);
    assert_eq!(w.pass().await.detached, 1);
    // TearDown ×1, UnmountDevice ×1, and the volume is only marked detached (no Detach call).
    assert_eq!(w.plugin.calls.counts(), (1, 1, 1, 1, 1));
    assert!(w.asw.attached_volumes().is_empty());
    assert!(w.mounter.mounts().is_empty(), "nothing left mounted");
}

#[tokio::test(start_paused = true)]
async fn shared_volume_mounts_the_device_once_and_unmounts_it_after_the_last_pod() {
    let w = world();
    let vol = w.add("p1");
    w.add("p2");
    w.attach(&vol);
    w.pass().await;
    w.pass().await;
    let (_, mount_device, set_up, _, _) = w.plugin.calls.counts();
    assert_eq!((mount_device, set_up), (1, 2));
    w.dsw
        .delete_pod_from_volume(&UniquePodName::new("p1"), &vol);
    w.pass().await;
    w.pass().await;
    assert_eq!(
        w.plugin.calls.counts().4,
        0,
        "another pod still uses the device"
    );
    assert_eq!(
        w.asw.device_state(&vol),
        Some(DeviceMountState::GloballyMounted)
    );
    w.dsw
        .delete_pod_from_volume(&UniquePodName::new("p2"), &vol);
    w.pass().await;
    w.pass().await;
    w.pass().await;
    assert_eq!(w.plugin.calls.counts().4, 1);
    assert!(w.asw.attached_volumes().is_empty());
}

fn attached(w: &World, volume: &UniqueVolumeName) -> crate::cache::AttachedVolume {
    w.asw
        .attached_volumes()
        .into_iter()
        .find(|v| v.volume_name == *volume)
        .unwrap()
}

/// Before the restart: pod p1 has the attachable pv-1 (attached as /dev/fake-1) and the local
/// disk-1 mounted, each with its global mount.
fn mounted_world() -> (World, UniqueVolumeName, UniqueVolumeName) {
    let w = world();
    let attachable = w.add("p1");
    let local = w.add_local("p1");
    w.attach(&attachable);
    (w, attachable, local)
}

#[tokio::test(start_paused = true)]
async fn v73_reconstruction_marks_devices_uncertain_with_their_global_mount_path() {
    let (w, attachable, local) = mounted_world();
    assert_eq!(w.pass().await.mounts, 2);
    let mounts_before = w.mounter.mounts().len();
    assert_eq!(mounts_before, 4, "two global mounts and two pod mounts");
    let w2 = w.restart(FakeNodeStatus::unseen());
    for volume in [&attachable, &local] {
        let v = attached(&w2, volume);
        assert_eq!(v.device_state, DeviceMountState::Uncertain, "{volume}");
        assert_eq!(v.attachability, Attachability::Uncertain, "{volume}");
        assert_eq!(
            v.device_path, "",
            "the device path comes from the node status"
        );
        let global = attached(&w, volume).device_mount_path;
        assert!(!global.is_empty());
        assert_eq!(v.device_mount_path, global, "{volume}");
        assert!(matches!(
            w2.asw
                .pod_exists_in_volume(&UniquePodName::new("p1"), volume),
            PodVolumeState::Uncertain { .. }
        ));
    }
    assert!(w2.reconciler.waits_for_node_status());
}

#[tokio::test(start_paused = true)]
async fn v74_nothing_is_unmounted_until_the_node_status_is_read() {
    let (w, attachable, local) = mounted_world();
    w.pass().await;
    let before = w.mounter.mounts();
    // The pod was deleted while the agent was down: nothing desired.
    let w2 = w.restart(FakeNodeStatus::unseen());
    for _ in 0..5 {
        assert_eq!(w2.pass().await, PassReport::default());
    }
    assert_eq!(w2.mounter.mounts(), before, "no TearDown, no UnmountDevice");
    assert_eq!(w2.plugin.calls.counts(), (0, 0, 0, 0, 0));
    assert!(w2.reconciler.waits_for_node_status());

    // The node is read; the attach/detach controller still lists pv-1 as attached.
    w2.node.set(vec![AttachedToNode {
        name: attachable.clone(),
        device_path: "/dev/fake-1".into(),
    }]);
    assert_eq!(w2.pass().await.unmounts, 2);
    assert!(!w2.reconciler.waits_for_node_status());
    assert_eq!(
        attached(&w2, &attachable).attachability,
        Attachability::Attachable
    );
    assert_eq!(attached(&w2, &attachable).device_path, "/dev/fake-1");
    assert_eq!(
        attached(&w2, &local).attachability,
        Attachability::NotAttachable
    );
    // The global mounts go too (UnmountDevice of a device-uncertain volume), then the volumes.
    assert_eq!(w2.pass().await.device_unmounts, 2);
    assert_eq!(w2.pass().await.detached, 2);
    assert_eq!(w2.plugin.calls.counts(), (0, 0, 0, 1, 1));
    assert_eq!(w2.local.calls.counts(), (0, 0, 0, 1, 1));
    assert!(w2.mounter.mounts().is_empty(), "nothing leaked");
    assert!(w2.asw.attached_volumes().is_empty());
}

/// upstream: TestReconstructVolumesMount (its case (a), after a restart and with the device
/// path from the node status)
#[tokio::test(start_paused = true)]
async fn v75_still_desired_attachable_volume_is_mounted_with_the_node_status_device_path() {
    let (w, attachable, local) = mounted_world();
    w.pass().await;
    let before = w.mounter.mounts();
    let w2 = w.restart(FakeNodeStatus::unseen());
    // The pod comes back into the desired state.
    assert_eq!(w2.add("p1"), attachable);
    assert_eq!(w2.add_local("p1"), local);
    // The local volume needs no device path: MountDevice (idempotent) and SetUp again.
    assert_eq!(w2.pass().await.mounts, 1);
    assert!(matches!(
        w2.asw
            .pod_exists_in_volume(&UniquePodName::new("p1"), &local),
        PodVolumeState::Mounted { .. }
    ));
    // The attachable one waits for its device path instead of failing WaitForAttach.
    assert_eq!(w2.plugin.calls.counts(), (0, 0, 0, 0, 0));
    assert!(matches!(
        w2.asw
            .pod_exists_in_volume(&UniquePodName::new("p1"), &attachable),
        PodVolumeState::Uncertain { .. }
    ));
    w2.node.set(vec![AttachedToNode {
        name: attachable.clone(),
        device_path: "/dev/fake-1".into(),
    }]);
    assert_eq!(w2.pass().await.mounts, 1);
    assert_eq!(*w2.plugin.calls.waited_for.lock().unwrap(), "/dev/fake-1");
    // WaitForAttach, MountDevice again (the device was uncertain), SetUp; nothing torn down.
    assert_eq!(w2.plugin.calls.counts(), (1, 1, 1, 0, 0));
    for volume in [&attachable, &local] {
        assert!(matches!(
            w2.asw
                .pod_exists_in_volume(&UniquePodName::new("p1"), volume),
            PodVolumeState::Mounted { .. }
        ));
        assert_eq!(
            w2.asw.device_state(volume),
            Some(DeviceMountState::GloballyMounted)
        );
    }
    assert_eq!(attached(&w2, &attachable).device_path, "/dev/fake-1");
    assert_eq!(
        attached(&w2, &attachable).attachability,
        Attachability::Attachable
    );
    assert_eq!(
        w2.mounter.mounts(),
        before,
        "adopted: no double mount, none lost"
    );
}

// Ported from upstream `reconciler_test.go`. Deviations, each a case that cannot apply here:
//
// * Kubelet-managed attach (`controllerAttachDetachEnabled=false`): the agent never attaches
//   or detaches a volume itself; the attach/detach controller does, and the agent reads the
//   result from `node.status.volumesAttached` (V46, the `NodeStatus` seam). In
//   `Test_Run_Positive_VolumeAttachAndMount` and `Test_Run_Positive_VolumeAttachMountUnmountDetach`
//   the node status stands in for upstream's Attach call (the volume is reported in use and
//   listed as attached), the plugin has no Attach or Detach to count, and upstream's
//   "Detach ×1" is the volume leaving the actual state once its device is unmounted.
// * Block mode (`volumeDevices`, SetUpDevice / MapPodDevice / TearDownDevice): the agent
//   supports filesystem volumes only, so every table case runs in Filesystem mode only.
// * Node expansion (`FailVolumeExpansion`, PV 10G, PVC status 2G): the agent does not expand
//   filesystems (no `ExpandInUseVolume`, no expansion during mount), so that case of
//   `Test_UncertainVolumeMountState` has nothing to run.

/// upstream: Test_Run_Positive_VolumeAttachAndMount
///
/// The volume is attached (by the controller, see the deviations above): WaitForAttach ×1,
/// MountDevice ×1, SetUp ×1; no TearDown, no UnmountDevice, and the volume stays.
#[tokio::test(start_paused = true)]
async fn test_run_positive_volume_attach_and_mount() {
    let w = world();
    let vol = w.add_pv("pod1uid", "fake-device1", "volume-name");
    w.attach(&vol);
    w.run_for(std::time::Duration::from_secs(1)).await;
    assert!(
        w.asw.mounted_volumes().iter().any(|m| m.volume_name == vol),
        "waitForMount"
    );
    // (WaitForAttach, MountDevice, SetUp, TearDown, UnmountDevice)
    assert_eq!(w.plugin.calls.counts(), (1, 1, 1, 0, 0));
    assert_eq!(attached(&w, &vol).device_path, "/dev/fake-1");
}

/// upstream: Test_Run_Positive_VolumeAttachMountUnmountDetach
///
/// Mounted as above; the pod leaves the desired state: TearDown ×1, UnmountDevice ×1, and the
/// volume leaves the actual state (upstream's Detach, see the deviations above).
#[tokio::test(start_paused = true)]
async fn test_run_positive_volume_attach_mount_unmount_detach() {
    let w = world();
    let vol = w.add_pv("pod1uid", "fake-device1", "volume-name");
    w.attach(&vol);
    w.run_for(std::time::Duration::from_secs(1)).await;
    assert!(w.asw.mounted_volumes().iter().any(|m| m.volume_name == vol));
    assert_eq!(w.plugin.calls.counts(), (1, 1, 1, 0, 0));
    w.dsw
        .delete_pod_from_volume(&UniquePodName::new("pod1uid"), &vol);
    w.run_until_gone(&vol).await;
    assert_eq!(w.plugin.calls.counts(), (1, 1, 1, 1, 1));
    assert!(w.mounter.mounts().is_empty(), "nothing left mounted");
}

/// One case of upstream's uncertain-state tables.
struct UncertainCase<S> {
    name: &'static str,
    /// The PV's name: the fake plugin's magic name.
    volume: &'static str,
    /// The state expected before the pod goes.
    state: S,
    unmount_device_calls: usize,
    tear_down_calls: usize,
    /// Upstream `supportRemount`: the first mount succeeds, then a remount is asked for.
    remount: bool,
}

/// Upstream's shared steps: a PVC-backed pod whose volume is reported in use and attached,
/// the reconciler until the volume is in the actual state, the 10 s wait of the
/// "timeout, then failure" cases, and the remount of the "success, then ..." cases.
async fn uncertain_case_world<S>(case: &UncertainCase<S>) -> (World, UniqueVolumeName) {
    use crate::testing::{TIMEOUT_AND_FAIL_ON_MOUNT_DEVICE, TIMEOUT_AND_FAIL_ON_SETUP};
    let w = world_with(FakeAttachablePlugin {
        requires_remount: case.remount,
        ..FakeAttachablePlugin::default()
    });
    let vol = w.add_pv("pod1uid", case.volume, "volume-name");
    w.attach(&vol);
    w.pass().await;
    assert!(
        w.asw
            .attached_volumes()
            .iter()
            .any(|v| v.volume_name == vol),
        "{}: waitForVolumeToExistInASW",
        case.name
    );
    if [TIMEOUT_AND_FAIL_ON_MOUNT_DEVICE, TIMEOUT_AND_FAIL_ON_SETUP].contains(&case.volume) {
        // Upstream: "Wait upto 10s for reconciler to catch up" (the retry after the back-off).
        w.run_for(std::time::Duration::from_secs(10)).await;
    }
    if case.remount {
        // Upstream: "wait for mount and then break it via remount".
        assert!(
            w.asw.mounted_volumes().iter().any(|m| m.volume_name == vol),
            "{}: waitForMount",
            case.name
        );
        w.asw
            .mark_remount_required(&UniquePodName::new("pod1uid"), std::slice::from_ref(&vol));
        w.run_for(std::time::Duration::from_secs(10)).await;
    }
    (w, vol)
}

/// upstream: Test_UncertainDeviceGlobalMounts
///
/// Upstream's table (spec V68), in Filesystem mode (see the deviations above): the device state
/// MountDevice's outcome leaves, and how many UnmountDevice calls the pod's removal makes (and,
/// beyond upstream's table, the TearDown calls: none where SetUp never ran).
#[tokio::test(start_paused = true)]
async fn test_uncertain_device_global_mounts() {
    use crate::testing::{
        FAIL_MOUNT_DEVICE, SUCCESS_AND_FAIL_ON_MOUNT_DEVICE, SUCCESS_AND_TIMEOUT_DEVICE,
        TIMEOUT_AND_FAIL_ON_MOUNT_DEVICE, TIMEOUT_ON_MOUNT_DEVICE,
    };
    let cases = [
        UncertainCase {
            name: "timed out operations should result in device marked as uncertain",
            volume: TIMEOUT_ON_MOUNT_DEVICE,
            state: DeviceMountState::Uncertain,
            unmount_device_calls: 1,
            tear_down_calls: 0,
            remount: false,
        },
        UncertainCase {
            name: "failed operation should result in not-mounted device",
            volume: FAIL_MOUNT_DEVICE,
            state: DeviceMountState::NotMounted,
            unmount_device_calls: 0,
            tear_down_calls: 0,
            remount: false,
        },
        UncertainCase {
            name: "timeout followed by failed operation should result in non-mounted device",
            volume: TIMEOUT_AND_FAIL_ON_MOUNT_DEVICE,
            state: DeviceMountState::NotMounted,
            unmount_device_calls: 0,
            tear_down_calls: 0,
            remount: false,
        },
        UncertainCase {
            name: "success followed by timeout operation should result in mounted device",
            volume: SUCCESS_AND_TIMEOUT_DEVICE,
            state: DeviceMountState::GloballyMounted,
            unmount_device_calls: 1,
            tear_down_calls: 1,
            remount: true,
        },
        UncertainCase {
            name: "success followed by failed operation should result in mounted device",
            volume: SUCCESS_AND_FAIL_ON_MOUNT_DEVICE,
            state: DeviceMountState::GloballyMounted,
            unmount_device_calls: 1,
            tear_down_calls: 1,
            remount: true,
        },
    ];
    for case in cases {
        let (w, vol) = uncertain_case_world(&case).await;
        let device = w.asw.device_state(&vol);
        assert_eq!(device, Some(case.state), "{}", case.name);
        if case.state == DeviceMountState::Uncertain {
            // Upstream `waitForUncertainGlobalMount`: among the volumes no pod has mounted.
            assert!(
                w.asw
                    .unmounted_volumes()
                    .iter()
                    .any(|v| v.volume_name == vol && v.device_state == DeviceMountState::Uncertain),
                "{}",
                case.name
            );
        }
        if case.state == DeviceMountState::GloballyMounted {
            assert!(
                w.asw.mounted_volumes().iter().any(|m| m.volume_name == vol),
                "{}: waitForMount",
                case.name
            );
        }
        w.dsw
            .delete_pod_from_volume(&UniquePodName::new("pod1uid"), &vol);
        w.run_until_gone(&vol).await;
        let (_, _, _, tear_downs, unmount_devices) = w.plugin.calls.counts();
        assert_eq!(
            (unmount_devices, tear_downs),
            (case.unmount_device_calls, case.tear_down_calls),
            "{}: (UnmountDevice, TearDown)",
            case.name
        );
        assert!(
            w.mounter.mounts().is_empty(),
            "{}: nothing leaked",
            case.name
        );
    }
}

/// upstream: Test_UncertainVolumeMountState
///
/// Upstream's table (spec V68), in Filesystem mode and without the expansion case (see the
/// deviations above): the device is always globally mounted first; the pod's mount state
/// SetUp's outcome leaves, and the UnmountDevice and TearDown calls the pod's removal makes.
#[tokio::test(start_paused = true)]
async fn test_uncertain_volume_mount_state() {
    use crate::cache::VolumeMountState;
    use crate::testing::{
        FAIL_ON_SETUP, SUCCESS_AND_FAIL_ON_SETUP, SUCCESS_AND_TIMEOUT_SETUP,
        TIMEOUT_AND_FAIL_ON_SETUP, TIMEOUT_ON_SETUP,
    };
    let cases = [
        UncertainCase {
            name: "timed out operations should result in volume marked as uncertain",
            volume: TIMEOUT_ON_SETUP,
            state: VolumeMountState::Uncertain,
            unmount_device_calls: 1,
            tear_down_calls: 1,
            remount: false,
        },
        UncertainCase {
            name: "failed operation should result in not-mounted volume",
            volume: FAIL_ON_SETUP,
            state: VolumeMountState::NotMounted,
            unmount_device_calls: 1,
            tear_down_calls: 0,
            remount: false,
        },
        UncertainCase {
            name: "timeout followed by failed operation should result in non-mounted volume",
            volume: TIMEOUT_AND_FAIL_ON_SETUP,
            state: VolumeMountState::NotMounted,
            unmount_device_calls: 1,
            tear_down_calls: 0,
            remount: false,
        },
        UncertainCase {
            name: "success followed by timeout operation should result in mounted volume",
            volume: SUCCESS_AND_TIMEOUT_SETUP,
            state: VolumeMountState::Mounted,
            unmount_device_calls: 1,
            tear_down_calls: 1,
            remount: true,
        },
        UncertainCase {
            name: "success followed by failed operation should result in mounted volume",
            volume: SUCCESS_AND_FAIL_ON_SETUP,
            state: VolumeMountState::Mounted,
            unmount_device_calls: 1,
            tear_down_calls: 1,
            remount: true,
        },
    ];
    let pod_name = UniquePodName::new("pod1uid");
    for case in cases {
        let (w, vol) = uncertain_case_world(&case).await;
        // Upstream `waitForGlobalMount`: every case mounts the device first.
        assert!(
            w.asw
                .globally_mounted_volumes()
                .iter()
                .any(|v| v.volume_name == vol),
            "{}: waitForGlobalMount",
            case.name
        );
        let state = w.asw.pod_exists_in_volume(&pod_name, &vol);
        let possibly_mounted = w
            .asw
            .all_mounted_volumes()
            .iter()
            .any(|m| m.volume_name == vol);
        match case.state {
            VolumeMountState::Uncertain => {
                // Upstream `waitForUncertainPodMount`: not mounted, yet possibly mounted.
                assert!(
                    matches!(state, PodVolumeState::Uncertain { .. }),
                    "{}: {state:?}",
                    case.name
                );
                assert!(possibly_mounted, "{}", case.name);
            }
            VolumeMountState::Mounted => assert!(
                w.asw.mounted_volumes().iter().any(|m| m.volume_name == vol),
                "{}: waitForMount, {state:?}",
                case.name
            ),
            VolumeMountState::NotMounted => {
                assert!(
                    matches!(state, PodVolumeState::NotMounted { .. }),
                    "{}: {state:?}",
                    case.name
                );
                assert!(!possibly_mounted, "{}", case.name);
            }
        }
        w.dsw.delete_pod_from_volume(&pod_name, &vol);
        w.run_until_gone(&vol).await;
        let (_, _, _, tear_downs, unmount_devices) = w.plugin.calls.counts();
        assert_eq!(
            (unmount_devices, tear_downs),
            (case.unmount_device_calls, case.tear_down_calls),
            "{}: (UnmountDevice, TearDown)",
            case.name
        );
        assert!(
            w.mounter.mounts().is_empty(),
            "{}: nothing leaked",
            case.name
        );
    }
}

/// upstream: TestReconstructVolumesMount
///
/// A volume reconstructed from its pod directory is uncertain; its pod is added to the desired
/// state and one pass runs: MountDevice is tried once, and then (a) the volume is mounted
/// (SetUp ×1), or (b) SetUp fails and it stays uncertain (PR #110670), or (c) MountDevice fails
/// and it stays uncertain with its global mount path, or (d) the same while the populator has
/// not added its pods. In no case is anything torn down.
///
/// Deviations: upstream's (c) and (d) are Block mode (a failed map, the global map path
/// `plugins/fake-plugin/volumeDevices/pluginDependentPath`); the agent has no block mode, so
/// they run in Filesystem mode with a failed MountDevice and the global mount path. The volume
/// is recorded as attached with the device path the node status gives (upstream: empty, its
/// fake's WaitForAttach ignores it; this fake refuses an empty one, see
/// `v75_still_desired_attachable_volume_is_mounted_with_the_node_status_device_path`).
#[tokio::test(start_paused = true)]
async fn test_reconstruct_volumes_mount() {
    use crate::testing::{FAIL_MOUNT_DEVICE, FAIL_ON_SETUP};
    struct Case {
        name: &'static str,
        volume: &'static str,
        expect_mount: bool,
        device_mount_path: bool,
        pod_not_added: bool,
    }
    let cases = [
        Case {
            name: "reconstructed volume is mounted",
            volume: "volumename",
            expect_mount: true,
            device_mount_path: false,
            pod_not_added: false,
        },
        Case {
            name: "reconstructed volume fails to mount",
            volume: FAIL_ON_SETUP,
            expect_mount: false,
            device_mount_path: false,
            pod_not_added: false,
        },
        Case {
            name: "reconstructed volume device mount fails",
            volume: FAIL_MOUNT_DEVICE,
            expect_mount: false,
            device_mount_path: true,
            pod_not_added: false,
        },
        Case {
            name: "reconstructed volume, pod hasn't been added",
            volume: FAIL_MOUNT_DEVICE,
            expect_mount: false,
            device_mount_path: true,
            pod_not_added: true,
        },
    ];
    let pod_name = UniquePodName::new("pod1uid");
    for case in cases {
        let root = Arc::new(tempfile::tempdir().unwrap());
        std::fs::create_dir_all(root.path().join(format!(
            "pods/pod1uid/volumes/kubernetes.io~fake-attachable/{}",
            case.volume
        )))
        .unwrap();
        let w = world_on(
            root.clone(),
            FakeMounter::new(),
            Arc::new(FakeNodeStatus::default()),
        );
        let host = VolumeHost {
            root_dir: root.path().to_owned(),
            mounter: Arc::new(w.mounter.clone()),
            node_allocatable_memory: None,
        };
        // Act 1: reconstruction. The volume is uncertain.
        let report = reconstruct(&w.asw, &w.executor_plugins(), &host);
        assert!(report.failed.is_empty(), "{}: {report:?}", case.name);
        assert!(w.asw.mounted_volumes().is_empty(), "{}", case.name);
        assert_eq!(w.asw.all_mounted_volumes().len(), 1, "{}", case.name);
        // Arrange 2: the desired state; the device paths count as read from the node status
        // (upstream clears `volumesNeedUpdateFromNodeStatus`: nothing is added to it here).
        let vol = w.add_pv("pod1uid", case.volume, case.volume);
        w.asw
            .mark_volume_as_attached(Some(vol.clone()), &persistent(case.volume), "fake/path")
            .unwrap();
        w.ready
            .store(!case.pod_not_added, std::sync::atomic::Ordering::SeqCst);
        // Act 2: one pass.
        w.pass().await;
        let (_, mount_device, set_up, tear_down, _) = w.plugin.calls.counts();
        assert_eq!(mount_device, 1, "{}: MountDevice", case.name);
        if case.expect_mount {
            assert!(
                w.asw.mounted_volumes().iter().any(|m| m.volume_name == vol),
                "{}: waitForMount",
                case.name
            );
            assert_eq!(set_up, 1, "{}: SetUp", case.name);
        } else {
            assert!(
                !w.executor
                    .operations()
                    .is_operation_pending(&OperationKey::new(vol.clone(), Some(pod_name.clone()))),
                "{}",
                case.name
            );
            assert!(
                w.asw.mounted_volumes().is_empty(),
                "{}: uncertain",
                case.name
            );
            let all = w.asw.all_mounted_volumes();
            assert_eq!(all.len(), 1, "{}: {all:?}", case.name);
            assert!(
                matches!(
                    w.asw.pod_exists_in_volume(&pod_name, &vol),
                    PodVolumeState::Uncertain { .. }
                ),
                "{}",
                case.name
            );
            if case.device_mount_path {
                assert_eq!(
                    std::path::PathBuf::from(&all[0].device_mount_path),
                    root.path()
                        .join("plugins/kubernetes.io/fake-attachable/mounts")
                        .join(case.volume),
                    "{}",
                    case.name
                );
            }
        }
        assert_eq!(tear_down, 0, "{}: no TearDown", case.name);
    }
}
