//! `reconstruct_test.go` cases, orphan clean-up, and the crash test: drop the manager in the
//! middle of a storm of mounts and unmounts, restart it on the same root, and check that the
//! mount table converges to exactly the desired set with the data of surviving tmpfs volumes
//! intact.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Volume};
use rustlet_core::{PodUid, UniquePodName};
use rustlet_mount::fake::FakeMounter;
use rustlet_mount::{LinuxMounter, TmpfsOptions};
use tokio_util::sync::CancellationToken;

use crate::cache::{ActualStateOfWorld, PodVolumeState};
use crate::manager::{VolumeManager, VolumeManagerConfig, VolumeManagerDeps};
use crate::mounter::Mounter;
use crate::node::{AttachedToNode, NodeStatus};
use crate::plugin::{PluginManager, VolumeHost};
use crate::plugins::builtin_plugins;
use crate::reconstruct::{OrphanKept, cleanup_orphaned_pod_dirs, reconstruct};
use crate::testing::{
    FAKE_ATTACHABLE, FakeAttachablePlugin, FakeNodeStatus, FakePods, FakeRecorder, pod_with_volumes,
};

fn mem(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn disk(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

fn host(root: &std::path::Path, mounter: Arc<dyn Mounter>) -> VolumeHost {
    VolumeHost {
        root_dir: root.to_owned(),
        mounter,
        node_allocatable_memory: Some(64 << 20),
    }
}

#[test]
fn test_reconstruct_volumes() {
    let root = tempfile::tempdir().unwrap();
    for pod in ["pod1", "pod2"] {
        std::fs::create_dir_all(
            root.path()
                .join(format!("pods/{pod}/volumes/kubernetes.io~empty-dir/cache")),
        )
        .unwrap();
    }
    std::fs::create_dir_all(
        root.path()
            .join("pods/pod1/volumes/missing-plugin/pvc-abcdef"),
    )
    .unwrap();
    let asw = ActualStateOfWorld::new(builtin_plugins());
    let report = reconstruct(
        &asw,
        &builtin_plugins(),
        &host(root.path(), Arc::new(FakeMounter::new())),
    );
    assert_eq!(report.reconstructed.len(), 2, "{report:?}");
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].spec_name, "pvc-abcdef");
    assert_eq!(report.failed[0].plugin_name, "missing-plugin");
    assert!(asw.mounted_volumes().is_empty(), "0 certain mounts");
    assert_eq!(asw.all_mounted_volumes().len(), 2, "2 uncertain");
    let pod1 = UniquePodName::new("pod1");
    assert_eq!(asw.possibly_mounted_volumes_for_pod(&pod1).len(), 1);
    let vol = asw.possibly_mounted_volumes_for_pod(&pod1)[0]
        .volume_name
        .clone();
    assert!(asw.is_volume_reconstructed(&vol, &pod1));
    assert!(matches!(
        asw.pod_exists_in_volume(&pod1, &vol),
        PodVolumeState::Uncertain { .. }
    ));
    // Running it again adds nothing (V71).
    let again = reconstruct(
        &asw,
        &builtin_plugins(),
        &host(root.path(), Arc::new(FakeMounter::new())),
    );
    assert!(again.reconstructed.is_empty());
}

#[test]
fn v80_orphaned_pod_dirs_go_unless_something_is_mounted() {
    let root = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    let h = host(root.path(), Arc::new(fake.clone()));
    let asw = Arc::new(ActualStateOfWorld::new(builtin_plugins()));
    for uid in ["gone", "busy", "known"] {
        std::fs::create_dir_all(
            root.path()
                .join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/v")),
        )
        .unwrap();
        std::fs::create_dir_all(root.path().join(format!("pods/{uid}/plugins/x"))).unwrap();
        std::fs::write(root.path().join(format!("pods/{uid}/etc-hosts")), "").unwrap();
    }
    fake.tmpfs(
        &root
            .path()
            .join("pods/busy/volumes/kubernetes.io~empty-dir/v"),
        TmpfsOptions::default(),
    )
    .unwrap();
    let states = FakePods::default();
    for uid in ["gone", "busy"] {
        states.set_runtime_removed(uid);
    }
    let kept = cleanup_orphaned_pod_dirs(&h, &asw, &|uid| uid.as_str() == "known", &states);
    assert_eq!(kept, [OrphanKept::MountedOnDisk(PodUid::new("busy"))]);
    assert!(!root.path().join("pods/gone").exists());
    assert!(root.path().join("pods/busy").exists());
    assert!(root.path().join("pods/known").exists());
    assert_eq!(fake.table_reads(), 1, "one read for both candidates");
}

/// Housekeeping runs every second: with every pod directory belonging to a known pod, it
/// does not read the mount table (its cost grows with the node's mounts).
#[test]
fn v80_no_orphan_no_mount_table_read() {
    let root = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    let h = host(root.path(), Arc::new(fake.clone()));
    let asw = Arc::new(ActualStateOfWorld::new(builtin_plugins()));
    for uid in ["a", "b"] {
        std::fs::create_dir_all(root.path().join(format!("pods/{uid}/volumes"))).unwrap();
    }
    let set = BTreeSet::from([PodUid::new("a"), PodUid::new("b")]);
    let known = |uid: &PodUid| set.contains(uid);
    let kept = cleanup_orphaned_pod_dirs(&h, &asw, &known, &FakePods::default());
    assert!(kept.is_empty());
    assert_eq!(fake.table_reads(), 0);
    // An orphan whose containers may run stops before the table too.
    std::fs::create_dir_all(root.path().join("pods/c/volumes")).unwrap();
    let kept = cleanup_orphaned_pod_dirs(&h, &asw, &known, &FakePods::default());
    assert_eq!(kept, [OrphanKept::ContainersMayRun(PodUid::new("c"))]);
    assert_eq!(fake.table_reads(), 0);
}

/// Issue 10 item 14 (V80): a pod gone from the source (force-deleted) whose containers may
/// still run keeps its directory, as upstream asks the pod workers.
#[test]
fn v80_a_pod_whose_containers_may_still_run_keeps_its_directory() {
    let root = tempfile::tempdir().unwrap();
    let h = host(root.path(), Arc::new(FakeMounter::new()));
    let asw = Arc::new(ActualStateOfWorld::new(builtin_plugins()));
    std::fs::create_dir_all(root.path().join("pods/forced/volumes")).unwrap();
    std::fs::write(root.path().join("pods/forced/etc-hosts"), "").unwrap();
    let states = FakePods::default();
    let kept = cleanup_orphaned_pod_dirs(&h, &asw, &|_| false, &states);
    assert_eq!(kept, [OrphanKept::ContainersMayRun(PodUid::new("forced"))]);
    assert!(root.path().join("pods/forced/etc-hosts").exists());
    states.set_runtime_removed("forced");
    assert!(cleanup_orphaned_pod_dirs(&h, &asw, &|_| false, &states).is_empty());
    assert!(!root.path().join("pods/forced").exists());
}

#[test]
fn v80_a_volume_dir_with_data_is_never_emptied_by_orphan_clean_up() {
    let root = tempfile::tempdir().unwrap();
    let h = host(root.path(), Arc::new(FakeMounter::new()));
    let asw = Arc::new(ActualStateOfWorld::new(builtin_plugins()));
    let volume = root
        .path()
        .join("pods/gone/volumes/kubernetes.io~empty-dir/v");
    std::fs::create_dir_all(&volume).unwrap();
    std::fs::write(volume.join("data"), "x").unwrap();
    let states = FakePods::default();
    states.set_runtime_removed("gone");
    let kept = cleanup_orphaned_pod_dirs(&h, &asw, &|_| false, &states);
    assert!(
        matches!(&kept[..], [OrphanKept::RemoveFailed(uid, msg)] if uid.as_str() == "gone" && msg.contains("failed to rmdir() volume"))
    );
    assert!(volume.join("data").exists());
}

struct Agent {
    manager: Arc<VolumeManager>,
    pods: Arc<FakePods>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Starts an agent whose pod source is complete from the first pass: `setup` fills it before
/// the sources report ready (a real source is ready only once it delivered its full list;
/// with an empty-but-ready source the first pass would rightly tear every volume down).
fn start_with(
    root: &std::path::Path,
    mounter: Arc<dyn Mounter>,
    setup: impl FnOnce(&FakePods),
) -> Agent {
    start_full(
        root,
        mounter,
        (builtin_plugins(), Arc::new(crate::node::NothingAttached)),
        setup,
    )
}

fn start_full(
    root: &std::path::Path,
    mounter: Arc<dyn Mounter>,
    (plugins, node): (PluginManager, Arc<dyn NodeStatus>),
    setup: impl FnOnce(&FakePods),
) -> Agent {
    let pods = Arc::new(FakePods::default());
    pods.set_ready(false);
    setup(&pods);
    pods.set_ready(true);
    let deps = VolumeManagerDeps {
        pods: pods.clone(),
        states: pods.clone(),
        mounter,
        plugins,
        events: Arc::new(FakeRecorder::default()),
        node,
        objects: None,
    };
    let config = VolumeManagerConfig {
        node_allocatable_memory: Some(64 << 20),
        ..VolumeManagerConfig::new(root)
    };
    let manager = Arc::new(VolumeManager::new(deps, config));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager.clone().run(cancel.clone()));
    Agent {
        manager,
        pods,
        cancel,
        task,
    }
}

fn start(root: &std::path::Path, mounter: Arc<dyn Mounter>) -> Agent {
    start_with(root, mounter, |_| {})
}

#[tokio::test(start_paused = true)]
async fn v75_a_reconstructed_volume_still_desired_is_adopted_with_its_data() {
    let root = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    let first = start(root.path(), Arc::new(fake.clone()));
    let pod = pod_with_volumes("p", vec![disk("cache")]);
    first.pods.add(pod.clone());
    first.manager.pod_updated();
    first.manager.wait_for_attach_and_mount(&pod).await.unwrap();
    let path = root
        .path()
        .join("pods/p/volumes/kubernetes.io~empty-dir/cache");
    std::fs::write(path.join("data"), "survives").unwrap();
    first.task.abort(); // the agent dies

    let second = start_with(root.path(), Arc::new(fake.clone()), |pods| {
        pods.add(pod.clone())
    });
    second
        .manager
        .wait_for_attach_and_mount(&pod)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(path.join("data")).unwrap(),
        "survives"
    );
    second.cancel.cancel();
    second.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn v75_a_reconstructed_volume_no_longer_desired_is_torn_down() {
    let root = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    let path = root
        .path()
        .join("pods/old/volumes/kubernetes.io~empty-dir/mem");
    std::fs::create_dir_all(&path).unwrap();
    fake.tmpfs(&path, TmpfsOptions::default()).unwrap();
    let agent = start(root.path(), Arc::new(fake.clone()));
    agent.pods.set_runtime_removed("old");
    agent.manager.pod_updated();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(fake.mounts().is_empty(), "unmounted");
    assert!(
        !root.path().join("pods/old").exists(),
        "and the orphaned pod dir removed by housekeeping"
    );
    agent.cancel.cancel();
    agent.task.await.unwrap();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn tmpfs_under(linux: &LinuxMounter, root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut mounts: Vec<_> = linux
        .list()
        .unwrap()
        .into_iter()
        .filter(|m| m.mount_point.starts_with(root) && m.fstype == "tmpfs")
        .map(|m| m.mount_point)
        .collect();
    mounts.sort();
    mounts
}

/// Under the private mount namespace: pods with a Memory emptyDir each; a storm (pods leaving,
/// pods arriving) is started and the agent crashes at several points of it: its whole runtime
/// is shut down where it stands, operations included (a mount syscall in flight completes, its
/// bookkeeping does not: the "crash after mount" case). A fresh agent on the same root must
/// converge to exactly the desired set, each tmpfs mounted once, the surviving pods' data intact.
#[test]
fn crash_in_a_storm_of_mounts_converges_without_leaks_or_double_mounts() {
    let Some(t) = rustlet_mount::testing::privileged_dir(
        "crash_in_a_storm_of_mounts_converges_without_leaks_or_double_mounts",
    ) else {
        return;
    };
    let root = t.path().to_owned();
    let linux = LinuxMounter::new();
    let pod = |i: usize| pod_with_volumes(&format!("pod-{i}"), vec![mem("mem"), disk("disk")]);
    let mem_path =
        |i: usize| root.join(format!("pods/pod-{i}/volumes/kubernetes.io~empty-dir/mem"));

    // Round 0: pods 0..8 mounted, with data.
    let mut rt = runtime();
    let mut agent = rt.block_on(async {
        let agent = start_with(&root, Arc::new(linux.clone()), |pods| {
            (0..8).for_each(|i| pods.add(pod(i)))
        });
        for i in 0..8 {
            agent
                .manager
                .wait_for_attach_and_mount(&pod(i))
                .await
                .unwrap();
            std::fs::write(mem_path(i).join("data"), format!("pod {i}")).unwrap();
        }
        agent
    });
    let mut live: BTreeSet<usize> = (0..8).collect();
    let mut next = 8;
    for round in 0..4usize {
        // The storm: two pods leave, two arrive; the agent dies after `round` ms of it.
        let leaving: Vec<usize> = live.iter().copied().take(2).collect();
        rt.block_on(async {
            for i in &leaving {
                agent.pods.remove(&format!("pod-{i}"));
                agent.pods.set_runtime_removed(&format!("pod-{i}"));
            }
            for k in 0..2 {
                agent.pods.add(pod(next + k));
            }
            agent.manager.pod_updated();
            tokio::time::sleep(Duration::from_millis(round as u64)).await;
        });
        // The crash: every task stops where it stands. A crashed process's threads stop with
        // it, but a runtime cannot stop a blocking thread inside its closure: the one mounting
        // is let finish its syscalls (their bookkeeping is lost with the runtime) before the
        // next agent starts. Left running (`shutdown_background`), it mounted a new pod's
        // tmpfs after the next agent had read the mount table, which no crash can do (CI saw
        // a tmpfs mounted twice).
        rt.shutdown_timeout(Duration::from_secs(30));
        for i in &leaving {
            live.remove(i);
        }
        live.extend([next, next + 1]);
        next += 2;

        rt = runtime();
        agent = rt.block_on(async {
            let b = start_with(&root, Arc::new(linux.clone()), |pods| {
                for i in &live {
                    pods.add(pod(*i));
                }
                for i in (0..next).filter(|i| !live.contains(i)) {
                    pods.set_runtime_removed(&format!("pod-{i}"));
                }
            });
            for i in &live {
                b.manager.wait_for_attach_and_mount(&pod(*i)).await.unwrap();
            }
            let expected: Vec<_> = {
                let mut e: Vec<_> = live.iter().map(|i| mem_path(*i)).collect();
                e.sort();
                e
            };
            // Teardowns of the leaving pods finish asynchronously: wait for convergence.
            let mut seen = tmpfs_under(&linux, &root);
            for _ in 0..500 {
                if seen == expected {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                seen = tmpfs_under(&linux, &root);
            }
            assert_eq!(
                seen, expected,
                "round {round}: exactly the desired set, each mounted once"
            );
            for i in live.iter().filter(|i| **i < 8) {
                assert_eq!(
                    std::fs::read_to_string(mem_path(*i).join("data")).unwrap(),
                    format!("pod {i}"),
                    "round {round}: data intact"
                );
            }
            b
        });
    }
    rt.block_on(async {
        agent.cancel.cancel();
        (&mut agent.task).await.unwrap();
    });
}

/// Issue 10 item 12 (V76): a volume whose plugin is unknown cannot be rebuilt; once the desired
/// state is complete its mount is undone and its empty directory removed, so the pod
/// directory goes too (it used to stay mounted, and the pod directory with it, forever).
///
/// upstream: TestCleanOrphanVolumes (its "not in DSW" case, through the running manager)
#[tokio::test(start_paused = true)]
async fn v76_a_volume_that_failed_reconstruction_is_unmounted_and_its_pod_dir_removed() {
    let root = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    let unknown = root.path().join("pods/gone/volumes/example.com~unknown/v");
    std::fs::create_dir_all(&unknown).unwrap();
    fake.tmpfs(&unknown, TmpfsOptions::default()).unwrap();
    let agent = start_with(root.path(), Arc::new(fake.clone()), |pods| {
        pods.set_runtime_removed("gone")
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!fake.is_mount_point(&unknown).unwrap_or(false), "unmounted");
    assert!(
        !root.path().join("pods/gone").exists(),
        "the pod directory went"
    );
    assert_eq!(agent.manager.metrics().force_cleaned.get(), 1);
    agent.cancel.cancel();
    agent.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn v13_v74_after_a_restart_volumes_in_use_and_unmounts_wait_for_the_node_status() {
    let root = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    // Before the restart: pod `old` had the attachable pv-1 mounted through its global mount.
    let global = root
        .path()
        .join("plugins/kubernetes.io/fake-attachable/mounts/pv-1");
    let pod_dir = root
        .path()
        .join("pods/old/volumes/kubernetes.io~fake-attachable/pv-1");
    for dir in [&global, &pod_dir, &root.path().join("dev")] {
        std::fs::create_dir_all(dir).unwrap();
    }
    fake.bind(
        &root.path().join("dev"),
        &global,
        rustlet_mount::BindAccess::ReadWrite,
    )
    .unwrap();
    fake.bind(&global, &pod_dir, rustlet_mount::BindAccess::ReadWrite)
        .unwrap();
    let plugin = FakeAttachablePlugin::default();
    let mut plugins = builtin_plugins();
    plugins.register(Arc::new(plugin.clone()));
    let node = Arc::new(FakeNodeStatus::unseen());
    // The pod was deleted while the agent was down.
    let agent = start_full(
        root.path(),
        Arc::new(fake.clone()),
        (plugins, node.clone()),
        |pods| pods.set_runtime_removed("old"),
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        !agent.manager.reconciler_states_has_been_synced(),
        "V13: not synced before the node status is read"
    );
    assert_eq!(fake.mounts().len(), 2, "V74: nothing unmounted");
    assert_eq!(plugin.calls.counts(), (0, 0, 0, 0, 0));
    assert!(
        root.path().join("pods/old").exists(),
        "orphan clean-up waits too"
    );

    let volume = rustlet_core::UniqueVolumeName::new(format!("{FAKE_ATTACHABLE}/pv-1"));
    node.set(vec![AttachedToNode {
        name: volume.clone(),
        device_path: "/dev/fake-1".into(),
    }]);
    agent.manager.node_status_updated();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(agent.manager.reconciler_states_has_been_synced());
    assert!(fake.mounts().is_empty(), "TearDown and UnmountDevice ran");
    assert_eq!(plugin.calls.counts(), (0, 0, 0, 1, 1));
    assert!(
        agent.manager.get_volumes_in_use().is_empty(),
        "nothing mounted any more"
    );
    assert!(!root.path().join("pods/old").exists());
    agent.cancel.cancel();
    agent.task.await.unwrap();
}

/// upstream: TestCleanOrphanVolumes
///
/// A volume that failed reconstruction is left alone while the desired state holds it for its
/// pod (the normal mount takes over) and cleaned up when it does not; the list is emptied in
/// both cases. Upstream counts its plugin's TearDown calls; here the mount point is cleaned up
/// without the plugin (the deviation is written at `clean_orphan_volumes`), so the unmounts of
/// the volume's path are counted.
#[test]
fn test_clean_orphan_volumes() {
    use crate::cache::DesiredStateOfWorld;
    use crate::metrics::VolumeMetrics;
    use crate::reconstruct::{PodVolumeDir, clean_orphan_volumes};
    use crate::testing::{persistent, pod};
    use rustlet_mount::fake::FakeAction;
    for (name, in_dsw, expected_unmounts) in [
        ("volume is in DSW and is not cleaned", true, 0),
        ("volume is not in DSW and is cleaned", false, 1),
    ] {
        let root = tempfile::tempdir().unwrap();
        let fake = FakeMounter::new();
        let host = host(root.path(), Arc::new(fake.clone()));
        let dsw = DesiredStateOfWorld::new(PluginManager::new(vec![Arc::new(
            FakeAttachablePlugin::default(),
        )]));
        let path = root
            .path()
            .join("pods/pod1uid/volumes/fake-plugin/volume-name");
        std::fs::create_dir_all(&path).unwrap();
        fake.bind(
            &root.path().join("device"),
            &path,
            rustlet_mount::BindAccess::ReadWrite,
        )
        .unwrap();
        let mut failed = vec![PodVolumeDir {
            pod_uid: PodUid::new("pod1uid"),
            plugin_name: "fake-plugin".into(),
            spec_name: "volume-name".into(),
            path: path.clone(),
        }];
        if in_dsw {
            dsw.add_pod_to_volume(
                &UniquePodName::new("pod1uid"),
                pod("pod1uid"),
                persistent("volume-name"),
                "volume-name",
            )
            .unwrap();
        }
        let metrics = VolumeMetrics::default();
        clean_orphan_volumes(&mut failed, &dsw, &host, &metrics);
        assert!(
            failed.is_empty(),
            "{name}: volumesFailedReconstruction emptied"
        );
        let unmounts = fake
            .actions()
            .iter()
            .filter(|a| matches!(a, FakeAction::Unmount { target } if *target == path))
            .count();
        assert_eq!(unmounts, expected_unmounts, "{name}");
        assert_eq!(path.exists(), in_dsw, "{name}");
        assert_eq!(fake.mounts().len(), usize::from(in_dsw), "{name}");
        assert_eq!(
            metrics.force_cleaned.get(),
            expected_unmounts as u64,
            "{name}"
        );
    }
}
