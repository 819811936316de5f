//! The attach path: upstream `reconciler_test.go` controller-attach cases, with the fake
//! attachable plugin and the fake mounter.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use rustlet_core::{UniquePodName, UniqueVolumeName};
use rustlet_mount::fake::FakeMounter;

use super::{PassReport, Reconciler};
use crate::cache::{ActualStateOfWorld, DesiredStateOfWorld, DeviceMountState, PodVolumeState};
use crate::executor::OperationExecutor;
use crate::node::AttachedToNode;
use crate::operations::OperationKey;
use crate::plugin::{PluginManager, VolumeHost};
use crate::testing::{FakeAttachablePlugin, FakeNodeStatus, FakeRecorder, persistent, pod};

struct World {
    _root: tempfile::TempDir,
    dsw: Arc<DesiredStateOfWorld>,
    asw: Arc<ActualStateOfWorld>,
    executor: Arc<OperationExecutor>,
    reconciler: Reconciler,
    plugin: FakeAttachablePlugin,
    node: Arc<FakeNodeStatus>,
    mounter: FakeMounter,
}

fn world() -> World {
    let root = tempfile::tempdir().unwrap();
    let plugin = FakeAttachablePlugin::default();
    let plugins = PluginManager::new(vec![Arc::new(plugin.clone())]);
    let mounter = FakeMounter::new();
    let host = VolumeHost {
        root_dir: root.path().to_owned(),
        mounter: Arc::new(mounter.clone()),
        node_allocatable_memory: None,
    };
    let dsw = Arc::new(DesiredStateOfWorld::new(plugins.clone()));
    let asw = Arc::new(ActualStateOfWorld::new(plugins.clone()));
    let node = Arc::new(FakeNodeStatus::default());
    let executor = Arc::new(
        OperationExecutor::new(
            asw.clone(),
            plugins,
            host,
            Arc::new(FakeRecorder::default()),
        )
        .with_node_status(node.clone()),
    );
    let reconciler = Reconciler::new(
        dsw.clone(),
        asw.clone(),
        executor.clone(),
        Arc::new(AtomicBool::new(true)),
    );
    World {
        _root: root,
        dsw,
        asw,
        executor,
        reconciler,
        plugin,
        node,
        mounter,
    }
}

impl World {
    async fn pass(&self) -> PassReport {
        let report = self.reconciler.reconcile();
        self.executor.operations().wait().await;
        report
    }

    fn add(&self, pod_uid: &str) -> UniqueVolumeName {
        self.dsw
            .add_pod_to_volume(
                &UniquePodName::new(pod_uid),
                pod(pod_uid),
                persistent("pv-1"),
                "data",
            )
            .unwrap()
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
