//! The facade: `volume_manager_test.go` cases for inline volumes, and real mounts.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, HostPathVolumeSource, PersistentVolumeClaimVolumeSource, Volume,
};
use rustlet_core::UniquePodName;
use rustlet_mount::LinuxMounter;
use rustlet_mount::fake::FakeMounter;
use tokio_util::sync::CancellationToken;

use super::CountingStates;
use crate::manager::{VolumeManager, VolumeManagerConfig, VolumeManagerDeps, WaitCause, WaitError};
use crate::mounter::Mounter;
use crate::plugins::builtin_plugins;
use crate::testing::{FakePods, FakeRecorder, pod_with_volumes};

fn empty_dir(name: &str, medium: Option<&str>) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: medium.map(str::to_owned),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn host_path(name: &str, path: &std::path::Path, type_: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.to_string_lossy().into_owned(),
            type_: Some(type_.into()),
        }),
        ..Default::default()
    }
}

struct Running {
    manager: Arc<VolumeManager>,
    pods: Arc<FakePods>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn start(root: &std::path::Path, mounter: Arc<dyn Mounter>, wait_timeout: Duration) -> Running {
    start_with(
        VolumeManagerConfig {
            wait_timeout,
            node_allocatable_memory: Some(64 << 20),
            ..VolumeManagerConfig::new(root)
        },
        mounter,
    )
}

fn start_with(config: VolumeManagerConfig, mounter: Arc<dyn Mounter>) -> Running {
    let pods = Arc::new(FakePods::default());
    start_with_states(config, mounter, pods.clone(), pods)
}

/// A running manager over `pods`, asking `states` about the pods' lifecycles.
fn start_with_states(
    config: VolumeManagerConfig,
    mounter: Arc<dyn Mounter>,
    pods: Arc<FakePods>,
    states: Arc<dyn crate::populator::PodStateProvider>,
) -> Running {
    start_over(config, mounter, pods, states, builtin_plugins())
}

/// A running manager with these plugins, over `pods`, asking `states` about lifecycles.
fn start_over(
    config: VolumeManagerConfig,
    mounter: Arc<dyn Mounter>,
    pods: Arc<FakePods>,
    states: Arc<dyn crate::populator::PodStateProvider>,
    plugins: crate::plugin::PluginManager,
) -> Running {
    let deps = VolumeManagerDeps {
        pods: pods.clone(),
        states,
        mounter,
        plugins,
        events: Arc::new(FakeRecorder::default()),
        node: Arc::new(crate::node::NothingAttached),
        objects: None,
    };
    let manager = Arc::new(VolumeManager::new(deps, config));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager.clone().run(cancel.clone()));
    Running {
        manager,
        pods,
        cancel,
        task,
    }
}

/// A running manager whose one plugin is `plugin` serving emptyDirs (its call counters stay
/// shared with the caller's copy), on a fake mounter.
fn start_with_plugin(config: VolumeManagerConfig, plugin: &crate::testing::FakePlugin) -> Running {
    let plugin = crate::testing::FakePlugin {
        name: "kubernetes.io/empty-dir",
        serves: crate::testing::Serves::EmptyDir,
        ..plugin.clone()
    };
    let pods = Arc::new(FakePods::default());
    start_over(
        config,
        Arc::new(FakeMounter::new()),
        pods.clone(),
        pods,
        crate::plugin::PluginManager::new(vec![Arc::new(plugin)]),
    )
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap();
    }
}

/// More mounts than `MAX_OPERATIONS_IN_FLIGHT` at once: the ones held back start as the
/// first ones end (the run loop's pass on freed room), not at the next resync.
#[tokio::test(start_paused = true)]
async fn mounts_held_back_by_the_cap_start_when_room_is_freed() {
    let root = tempfile::tempdir().unwrap();
    // No resync (nor remount tick) within the waits' deadline: a held-back mount that waited
    // for one would make its wait fail. (The passes' rests are paced on their real cost, so virtual time passes
    // faster on a loaded machine; an hour's margin keeps that out of the outcome.)
    let r = start_with(
        VolumeManagerConfig {
            wait_timeout: Duration::from_secs(1800),
            resync_period: Duration::from_secs(3600),
            remount_period: Duration::from_secs(3600),
            ..VolumeManagerConfig::new(root.path())
        },
        Arc::new(FakeMounter::new()),
    );
    // More than two passes' worth: the first pass and the one the waiters' wake-up asks for
    // cannot start them all.
    let pods: Vec<_> = (0..2 * crate::reconciler::MAX_OPERATIONS_IN_FLIGHT + 20)
        .map(|i| pod_with_volumes(&format!("p{i}"), vec![empty_dir("cache", None)]))
        .collect();
    for pod in &pods {
        r.pods.add(pod.clone());
    }
    r.manager.pod_updated();
    for result in
        futures::future::join_all(pods.iter().map(|p| r.manager.wait_for_attach_and_mount(p))).await
    {
        result.expect("mounted without a resync");
    }
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn v1_v2_pods_without_used_volumes_return_at_once() {
    let root = tempfile::tempdir().unwrap();
    let r = start(
        root.path(),
        Arc::new(FakeMounter::new()),
        Duration::from_secs(5),
    );
    let mut pod = (*pod_with_volumes("p", vec![])).clone();
    pod.spec.as_mut().unwrap().volumes = Some(vec![empty_dir("declared-but-unused", None)]);
    r.manager.wait_for_attach_and_mount(&pod).await.unwrap();
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn wait_for_attach_and_mount_then_unmount_with_the_fake_mounter() {
    let root = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    let r = start(root.path(), Arc::new(fake.clone()), Duration::from_secs(5));
    let host_dir = root.path().join("host-data");
    let pod = pod_with_volumes(
        "p1",
        vec![
            empty_dir("cache", None),
            empty_dir("mem", Some("Memory")),
            host_path("host", &host_dir, "DirectoryOrCreate"),
        ],
    );
    r.pods.add(pod.clone());
    r.manager.pod_updated();
    r.manager.wait_for_attach_and_mount(&pod).await.unwrap();

    let mounted = r
        .manager
        .get_mounted_volumes_for_pod(&UniquePodName::new("p1"));
    assert_eq!(mounted.keys().collect::<Vec<_>>(), ["cache", "host", "mem"]);
    assert_eq!(
        mounted["cache"].path,
        root.path()
            .join("pods/p1/volumes/kubernetes.io~empty-dir/cache")
    );
    assert_eq!(mounted["host"].path, host_dir);
    assert!(host_dir.is_dir(), "DirectoryOrCreate made it");
    assert_eq!(fake.mounts().len(), 1, "only the Memory emptyDir mounts");
    assert!(
        r.manager.get_volumes_in_use().is_empty(),
        "V12: non-attachable volumes are never reported"
    );
    assert!(r.manager.reconciler_states_has_been_synced());

    r.pods.remove("p1");
    r.pods.set_runtime_removed("p1");
    r.manager.pod_updated();
    r.manager.wait_for_unmount(&pod).await.unwrap();
    assert!(
        !r.manager
            .has_possibly_mounted_volumes(&UniquePodName::new("p1"))
    );
    assert!(fake.mounts().is_empty());
    assert!(
        !root
            .path()
            .join("pods/p1/volumes/kubernetes.io~empty-dir/cache")
            .exists()
    );
    assert!(host_dir.is_dir(), "hostPath is never removed");
    r.stop().await;
}

/// Issue 29: a wait is woken by its own pod's changes (the mount recorded, then the unmount),
/// not by upstream's 300 ms poll, which stays only as the floor under the signals; and a
/// pod's wait is not woken by other pods' mounts (`cache::signals`).
#[tokio::test(start_paused = true)]
async fn a_wait_ends_on_its_pods_own_signal_not_on_the_poll() {
    let root = tempfile::tempdir().unwrap();
    let r = start(
        root.path(),
        Arc::new(FakeMounter::new()),
        Duration::from_secs(120),
    );
    let pod = pod_with_volumes(
        "p1",
        vec![empty_dir("cache", None), empty_dir("mem", Some("Memory"))],
    );
    r.pods.add(pod.clone());
    r.manager.pod_updated();
    let started = tokio::time::Instant::now();
    r.manager.wait_for_attach_and_mount(&pod).await.unwrap();
    let mounted = tokio::time::Instant::now() - started;
    assert!(
        mounted < crate::manager::WAIT_POLL,
        "mounted after {mounted:?}"
    );

    r.pods.remove("p1");
    r.pods.set_runtime_removed("p1");
    r.manager.pod_updated();
    let started = tokio::time::Instant::now();
    r.manager.wait_for_unmount(&pod).await.unwrap();
    let unmounted = tokio::time::Instant::now() - started;
    assert!(
        unmounted < crate::manager::WAIT_POLL,
        "unmounted after {unmounted:?}"
    );
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn v4_populator_errors_fail_the_wait_early() {
    let root = tempfile::tempdir().unwrap();
    let r = start(
        root.path(),
        Arc::new(FakeMounter::new()),
        Duration::from_secs(120),
    );
    let claim = Volume {
        name: "data".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: "c".into(),
            read_only: None,
        }),
        ..Default::default()
    };
    let pod = pod_with_volumes("p2", vec![claim, empty_dir("cache", None)]);
    r.pods.add(pod.clone());
    let started = tokio::time::Instant::now();
    let err = r.manager.wait_for_attach_and_mount(&pod).await.unwrap_err();
    assert!(
        tokio::time::Instant::now() - started < crate::manager::WAIT_POLL,
        "at the error, not at the deadline (nor at the next poll)"
    );
    let WaitError::NotMounted {
        unmounted,
        failed_to_process,
        cause: WaitCause::PodErrors(errors),
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert!(unmounted.contains(&"data".to_owned()), "{unmounted:?}");
    assert_eq!(failed_to_process, &["data"]);
    assert!(errors.contains("need an API to read them"), "{errors}");
    assert!(
        err.to_string()
            .contains("unattached volumes=[], failed to process volumes=[data]: volume data: "),
        "{err}"
    );
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn v5_timeout_names_the_unmounted_volumes() {
    let root = tempfile::tempdir().unwrap();
    let r = start(
        root.path(),
        Arc::new(FakeMounter::new()),
        Duration::from_secs(3),
    );
    // A hostPath that must exist and does not: SetUp fails on every attempt.
    let pod = pod_with_volumes(
        "p3",
        vec![
            host_path("missing", &root.path().join("nope"), "Directory"),
            empty_dir("b", None),
        ],
    );
    r.pods.add(pod.clone());
    let err = r.manager.wait_for_attach_and_mount(&pod).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "unmounted volumes=[missing], unattached volumes=[], failed to process volumes=[]: context deadline exceeded"
    );
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn v13_not_synced_before_the_sources_are_ready() {
    let root = tempfile::tempdir().unwrap();
    let pods_ready_later = start(
        root.path(),
        Arc::new(FakeMounter::new()),
        Duration::from_secs(3),
    );
    pods_ready_later.pods.set_ready(false);
    // The first pass may already have run with ready sources; a fresh manager shows the gate.
    let pods = Arc::new(FakePods::default());
    pods.set_ready(false);
    let deps = VolumeManagerDeps {
        pods: pods.clone(),
        states: pods.clone(),
        mounter: Arc::new(FakeMounter::new()),
        plugins: builtin_plugins(),
        events: Arc::new(FakeRecorder::default()),
        node: Arc::new(crate::node::NothingAttached),
        objects: None,
    };
    let manager = VolumeManager::new(deps, VolumeManagerConfig::new(root.path()));
    manager.sync_once();
    assert!(!manager.reconciler_states_has_been_synced());
    pods.set_ready(true);
    manager.sync_once();
    assert!(manager.reconciler_states_has_been_synced());
    pods_ready_later.stop().await;
}

#[tokio::test]
async fn real_mounts_empty_dir_memory_and_host_path() {
    let Some(t) =
        rustlet_mount::testing::privileged_dir("real_mounts_empty_dir_memory_and_host_path")
    else {
        return;
    };
    let linux = LinuxMounter::new();
    let r = start(t.path(), Arc::new(linux.clone()), Duration::from_secs(10));
    let host_dir = t.mkdir("host");
    std::fs::write(host_dir.join("keep"), "host data").unwrap();
    let pod = pod_with_volumes(
        "real",
        vec![
            empty_dir("disk", None),
            empty_dir("mem", Some("Memory")),
            host_path("host", &host_dir, "Directory"),
        ],
    );
    r.pods.add(pod.clone());
    r.manager.pod_updated();
    r.manager.wait_for_attach_and_mount(&pod).await.unwrap();
    let mounted = r
        .manager
        .get_mounted_volumes_for_pod(&UniquePodName::new("real"));
    let mem = &mounted["mem"].path;
    assert!(
        linux
            .list()
            .unwrap()
            .iter()
            .any(|m| m.mount_point == *mem && m.fstype == "tmpfs")
    );
    std::fs::write(mem.join("f"), "in memory").unwrap();

    r.pods.remove("real");
    r.pods.set_runtime_removed("real");
    r.manager.pod_updated();
    r.manager.wait_for_unmount(&pod).await.unwrap();
    assert!(!linux.list().unwrap().iter().any(|m| m.mount_point == *mem));
    assert!(!mem.exists());
    assert_eq!(
        std::fs::read_to_string(host_dir.join("keep")).unwrap(),
        "host data"
    );
    r.stop().await;
}

/// upstream: TestMetricCollection (through the running manager; the port itself is
/// `metrics::tests::test_metric_collection`)
#[tokio::test(start_paused = true)]
async fn metrics_with_upstream_names() {
    let root = tempfile::tempdir().unwrap();
    let r = start(
        root.path(),
        Arc::new(FakeMounter::new()),
        Duration::from_secs(5),
    );
    let pod = pod_with_volumes(
        "pm",
        vec![empty_dir("a", None), empty_dir("b", Some("Memory"))],
    );
    r.pods.add(pod.clone());
    r.manager.wait_for_attach_and_mount(&pod).await.unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    r.manager.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        "volume_manager_total_volumes{plugin_name=\"kubernetes.io/empty-dir\",state=\"desired_state_of_world\"} 2",
        "volume_manager_total_volumes{plugin_name=\"kubernetes.io/empty-dir\",state=\"actual_state_of_world\"} 2",
        "storage_operation_duration_seconds_count{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\"} 2",
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
    // Counted on each scrape: once the pod's volumes are gone, the plugin drops out of both
    // states instead of staying at its last count.
    r.pods.remove("pm");
    r.pods.set_runtime_removed("pm");
    r.manager.pod_updated();
    r.manager.wait_for_unmount(&pod).await.unwrap();
    // The next pass (virtual time) drops the unmounted volumes from the actual state.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(!text.contains("volume_manager_total_volumes{"), "{text}");
    r.stop().await;
}

#[tokio::test(start_paused = true)]
async fn test_wait_for_attach_and_mount_error_names_unattached_volumes() {
    use crate::plugin::PluginManager;
    use crate::testing::{FakeAttachablePlugin, persistent};
    let root = tempfile::tempdir().unwrap();
    let pods = Arc::new(FakePods::default());
    let mut plugins: Vec<Arc<dyn crate::plugin::VolumePlugin>> =
        vec![Arc::new(FakeAttachablePlugin::default())];
    plugins.extend([
        Arc::new(crate::plugins::empty_dir::EmptyDirPlugin) as Arc<dyn crate::plugin::VolumePlugin>,
        Arc::new(crate::plugins::host_path::HostPathPlugin),
    ]);
    let deps = VolumeManagerDeps {
        pods: pods.clone(),
        states: pods.clone(),
        mounter: Arc::new(FakeMounter::new()),
        plugins: PluginManager::new(plugins),
        events: Arc::new(FakeRecorder::default()),
        node: Arc::new(crate::node::NothingAttached),
        objects: None,
    };
    let config = VolumeManagerConfig {
        wait_timeout: Duration::from_secs(2),
        ..VolumeManagerConfig::new(root.path())
    };
    let manager = Arc::new(VolumeManager::new(deps, config));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager.clone().run(cancel.clone()));
    // The pod's claim resolved to a PV served by an attachable plugin; nothing attaches it.
    let claim = Volume {
        name: "data".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: "c".into(),
            read_only: None,
        }),
        ..Default::default()
    };
    let pod = pod_with_volumes("pa", vec![claim]);
    let vol = manager
        .desired_state()
        .add_pod_to_volume(
            &UniquePodName::new("pa"),
            pod.clone(),
            persistent("pv-1"),
            "data",
        )
        .unwrap();
    assert_eq!(
        manager.get_volumes_in_use(),
        std::slice::from_ref(&vol),
        "V12: attachable volumes are reported in use"
    );
    let err = manager.wait_for_attach_and_mount(&pod).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "unmounted volumes=[data], unattached volumes=[data], failed to process volumes=[]: context deadline exceeded"
    );
    manager.mark_volumes_as_reported_in_use(std::slice::from_ref(&vol));
    assert!(manager.desired_state().volumes_to_mount()[0].reported_in_use);
    cancel.cancel();
    task.await.unwrap();
}

/// Item 16 (V14): the volumes marked as reported in use are the ones written to the node
/// status, not a second read: a volume added while the write was on its way waits for the
/// next write.
#[tokio::test(start_paused = true)]
async fn the_volumes_reported_in_use_are_the_ones_written() {
    use std::sync::Mutex;

    use crate::node::{VolumesInUseWriter, WriteError};
    use crate::plugin::PluginManager;
    use crate::testing::{FakeAttachablePlugin, persistent};

    /// Records each write with which volumes were marked reported when it began; adds a
    /// second volume during the first write; stops the reporter at the second.
    struct Writer {
        manager: Arc<VolumeManager>,
        cancel: CancellationToken,
        writes: Mutex<Vec<(Vec<String>, Vec<String>)>>,
    }
    #[async_trait::async_trait]
    impl VolumesInUseWriter for Writer {
        async fn write_volumes_in_use(&self, volumes: &[String]) -> Result<(), WriteError> {
            let marked: Vec<String> = self
                .manager
                .desired_state()
                .volumes_to_mount()
                .into_iter()
                .filter(|v| v.reported_in_use)
                .map(|v| v.volume_name.to_string())
                .collect();
            let mut writes = self.writes.lock().unwrap();
            writes.push((volumes.to_vec(), marked));
            if writes.len() == 1 {
                self.manager
                    .desired_state()
                    .add_pod_to_volume(
                        &UniquePodName::new("pb"),
                        pod_with_volumes("pb", vec![]),
                        persistent("pv-2"),
                        "data",
                    )
                    .unwrap();
            } else {
                self.cancel.cancel();
            }
            Ok(())
        }
    }

    let root = tempfile::tempdir().unwrap();
    let pods = Arc::new(FakePods::default());
    let deps = VolumeManagerDeps {
        pods: pods.clone(),
        states: pods.clone(),
        mounter: Arc::new(FakeMounter::new()),
        plugins: PluginManager::new(vec![Arc::new(FakeAttachablePlugin::default())]),
        events: Arc::new(FakeRecorder::default()),
        node: Arc::new(crate::node::NothingAttached),
        objects: None,
    };
    let manager = Arc::new(VolumeManager::new(
        deps,
        VolumeManagerConfig::new(root.path()),
    ));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager.clone().run(cancel.clone()));
    let first = manager
        .desired_state()
        .add_pod_to_volume(
            &UniquePodName::new("pa"),
            pod_with_volumes("pa", vec![]),
            persistent("pv-1"),
            "data",
        )
        .unwrap();
    let writer = Writer {
        manager: manager.clone(),
        cancel: CancellationToken::new(),
        writes: Mutex::default(),
    };
    manager
        .report_volumes_in_use(&writer, writer.cancel.clone())
        .await;
    let writes = writer.writes.into_inner().unwrap();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[0], (vec![first.to_string()], vec![]));
    let (written, marked) = &writes[1];
    assert_eq!(written.len(), 2, "the second write lists both: {written:?}");
    assert_eq!(
        marked,
        &[first.to_string()],
        "only the first write's volume was marked before the second write"
    );
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn test_get_extra_supplemental_groups_for_pod() {
    use crate::cache::{MarkVolumeOpts, VolumeMountState};
    use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec};
    let root = tempfile::tempdir().unwrap();
    for (gid, existing, want) in [
        (Some("777"), vec![], vec![777]),
        (Some(""), vec![], vec![]),
        (Some("a"), vec![], vec![]),
        (Some("555"), vec![555], vec![]),
        (None, vec![], vec![]),
    ] {
        let r = start(
            root.path(),
            Arc::new(FakeMounter::new()),
            Duration::from_secs(1),
        );
        let mut pod = (*pod_with_volumes("g", vec![])).clone();
        pod.spec = Some(PodSpec {
            security_context: Some(PodSecurityContext {
                supplemental_groups: Some(existing),
                ..Default::default()
            }),
            ..Default::default()
        });
        let asw = r.manager.actual_state();
        let vol = asw
            .mark_volume_as_attached(None, &crate::testing::empty_dir("v"), "")
            .unwrap();
        asw.mark_volume_as_mounted(MarkVolumeOpts {
            pod_name: UniquePodName::new("g"),
            pod_uid: rustlet_core::PodUid::new("g"),
            volume_name: vol,
            spec: crate::testing::empty_dir("v"),
            outer_volume_spec_name: "v".into(),
            volume_gid: gid.map(str::to_owned),
            state: VolumeMountState::Mounted,
        })
        .unwrap();
        assert_eq!(
            r.manager.get_extra_supplemental_groups_for_pod(&pod),
            want,
            "{gid:?}"
        );
        r.stop().await;
    }
}

#[tokio::test(start_paused = true)]
async fn test_wait_for_all_pods_unmount() {
    use crate::cache::{MarkVolumeOpts, VolumeMountState};
    let root = tempfile::tempdir().unwrap();
    let r = start(
        root.path(),
        Arc::new(FakeMounter::new()),
        Duration::from_secs(1),
    );
    // Pods whose volume never unmounts (the populator never sees them, so it keeps nothing
    // desired, but nothing tears the fake entries down either: sources are not ready).
    r.pods.set_ready(false);
    let pods: Vec<_> = (0..10)
        .map(|i| pod_with_volumes(&format!("w{i}"), vec![]))
        .collect();
    let asw = r.manager.actual_state();
    for i in 0..10 {
        let vol = asw
            .mark_volume_as_attached(
                Some(rustlet_core::UniqueVolumeName::new(format!(
                    "fake/fake-device-{i}"
                ))),
                &crate::testing::empty_dir("v"),
                "",
            )
            .unwrap();
        asw.mark_volume_as_mounted(MarkVolumeOpts {
            pod_name: UniquePodName::new(format!("w{i}")),
            pod_uid: rustlet_core::PodUid::new(format!("w{i}")),
            volume_name: vol,
            spec: crate::testing::empty_dir("v"),
            outer_volume_spec_name: "v".into(),
            volume_gid: None,
            state: VolumeMountState::Mounted,
        })
        .unwrap();
    }
    let errors = r
        .manager
        .wait_for_all_pods_unmount(&pods)
        .await
        .unwrap_err();
    assert_eq!(errors.len(), 10, "one entry per pod");
    assert!(
        errors.iter().any(|(_, e)| e.to_string()
            == "mounted volumes=[fake/fake-device-3]: context deadline exceeded")
    );
    // Pods without volumes succeed at once.
    r.manager
        .wait_for_all_pods_unmount(&[pod_with_volumes("none", vec![])])
        .await
        .unwrap();
    r.stop().await;
}

/// Issue 10 item 13: the resync (and its housekeeping) has a deadline that pod events do not
/// push back; under an event every 100 ms an orphaned pod directory still goes.
#[tokio::test(start_paused = true)]
async fn housekeeping_runs_on_time_under_a_steady_stream_of_pod_events() {
    let root = tempfile::tempdir().unwrap();
    let orphan = root.path().join("pods/orphan/volumes");
    std::fs::create_dir_all(&orphan).unwrap();
    let r = start(
        root.path(),
        Arc::new(FakeMounter::new()),
        Duration::from_secs(10),
    );
    r.pods.set_runtime_removed("orphan");
    for _ in 0..30 {
        r.manager.pod_updated();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !root.path().join("pods/orphan").exists(),
        "housekeeping ran within 3 s of events every 100 ms"
    );
    r.stop().await;
}

/// Issue 10 item 16: a volume whose plugin requires a periodic remount is set up again every
/// remount period, though no wait reprocesses its pod; others are left alone.
#[tokio::test(start_paused = true)]
async fn volumes_that_require_remount_are_set_up_again_every_remount_period() {
    use crate::testing::FakePlugin;
    let root = tempfile::tempdir().unwrap();
    let plugin = FakePlugin {
        requires_remount: true,
        ..FakePlugin::default()
    };
    let Running {
        manager,
        pods,
        cancel,
        task,
    } = start_with_plugin(VolumeManagerConfig::new(root.path()), &plugin);
    let pod = pod_with_volumes("p1", vec![empty_dir("v", None)]);
    pods.add(pod.clone());
    manager.pod_updated();
    manager.wait_for_attach_and_mount(&pod).await.unwrap();
    assert_eq!(plugin.calls.set_ups(), 1);
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(plugin.calls.set_ups(), 1, "not before the period");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        plugin.calls.set_ups(),
        2,
        "remounted once the period passed"
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(plugin.calls.set_ups(), 3);
    cancel.cancel();
    task.await.unwrap();
}

/// The pacer: a pass after a quiet spell starts at once, however many came before it.
#[test]
fn pacer_lets_an_isolated_pass_start_at_once() {
    use crate::manager::PassPacer;
    let start = tokio::time::Instant::now();
    let mut pacer = PassPacer::new(start);
    let mut now = start;
    for _ in 0..1000 {
        // 300 µs passes, 1.3 ms apart (a pod added after each mount): never a rest.
        now += Duration::from_micros(1300);
        assert_eq!(pacer.after_pass(now, Duration::from_micros(300)), None);
    }
    // One expensive pass (a storm's first) may still run without a rest: within the burst.
    now += Duration::from_secs(1);
    assert_eq!(pacer.after_pass(now, Duration::from_millis(1)), None);
}

/// The pacer under a storm (every pass starts as soon as allowed): passes take at most a
/// quarter of the wall-clock time, whatever they cost.
#[test]
fn pacer_holds_back_to_back_passes_to_a_quarter_of_a_core() {
    use crate::manager::PassPacer;
    for cost_us in [50, 800, 5_000, 40_000] {
        let cost = Duration::from_micros(cost_us);
        let start = tokio::time::Instant::now();
        let mut pacer = PassPacer::new(start);
        let mut now = start;
        let mut busy = Duration::ZERO;
        for _ in 0..2000 {
            now += cost;
            busy += cost;
            if let Some(resume) = pacer.after_pass(now, cost) {
                assert!(resume > now);
                now = resume;
            }
        }
        let share = busy.as_secs_f64() / (now - start).as_secs_f64();
        // At most a quarter, plus the one burst spread over the run.
        let burst = crate::manager::PASS_BURST.as_secs_f64() / (now - start).as_secs_f64();
        assert!(share <= 0.25 + burst + 1e-9, "{cost_us} µs passes: {share}");
        assert!(
            share > 0.2,
            "{cost_us} µs passes are not held back more than needed: {share}"
        );
    }
}

/// Issue 15: the pacer is charged for looking again (full passes, volumes re-looked after an
/// obstacle), not for the work changes asked for.
#[test]
fn the_pacer_is_charged_for_looking_again_not_for_new_work() {
    use crate::manager::{Populate, paced_cost};
    use crate::reconciler::PassScope;
    let cost = Duration::from_millis(8);
    let volumes = |looked, again| PassScope::Volumes { looked, again };
    assert_eq!(
        paced_cost(Populate::Changed, volumes(3000, 0), cost),
        Duration::ZERO,
        "a storm's first pass: all new"
    );
    assert_eq!(
        paced_cost(Populate::No, volumes(100, 25), cost),
        Duration::from_millis(2)
    );
    assert_eq!(paced_cost(Populate::No, volumes(10, 10), cost), cost);
    assert_eq!(
        paced_cost(Populate::Changed, PassScope::Everything, cost),
        cost
    );
    assert_eq!(paced_cost(Populate::Everything, volumes(10, 0), cost), cost);
    assert_eq!(
        paced_cost(Populate::Changed, PassScope::Skipped, cost),
        cost
    );
}

/// Housekeeping on an idle node: skipped while nothing changed since a run that kept nothing,
/// but at least every `MAX_SKIPS + 1` periods; run again after any change of the pods, of
/// either state, or after a run that kept an orphan.
#[test]
fn housekeeping_runs_when_something_changed_and_at_least_every_thirty_periods() {
    use crate::manager::HousekeepingGate;
    let pods = FakePods::default();
    let mut gate = HousekeepingGate::default();
    assert!(gate.due(&pods, (1, 1)), "the first period runs");
    gate.ran(true, (1, 1));
    for _ in 0..HousekeepingGate::MAX_SKIPS {
        assert!(!gate.due(&pods, (1, 1)), "nothing changed");
    }
    assert!(gate.due(&pods, (1, 1)), "the safety net");
    gate.ran(true, (1, 1));
    assert!(!gate.due(&pods, (1, 1)));
    pods.add(pod_with_volumes("p", vec![]));
    assert!(gate.due(&pods, (1, 1)), "a pod came");
    gate.ran(true, (1, 1));
    assert!(gate.due(&pods, (2, 1)), "the desired state changed");
    gate.ran(true, (2, 1));
    assert!(gate.due(&pods, (2, 2)), "the actual state changed");
    gate.ran(false, (2, 2));
    assert!(
        gate.due(&pods, (2, 2)),
        "the last run kept an orphan: again"
    );
    gate.ran(true, (2, 2));
    pods.remove("p");
    assert!(gate.due(&pods, (2, 2)), "a pod went");
}

/// A failed SetUp wakes the run loop: the pass right after it meets the back-off and sets the
/// retry timer, so the second attempt comes when the 500 ms back-off ends, not at the next
/// resync (an hour away here).
#[tokio::test(start_paused = true)]
async fn a_failed_set_up_is_retried_when_its_back_off_ends() {
    use crate::testing::{FAIL_ON_SETUP, FakePlugin};
    let root = tempfile::tempdir().unwrap();
    let plugin = FakePlugin::default();
    let config = VolumeManagerConfig {
        resync_period: Duration::from_secs(3600),
        remount_period: Duration::from_secs(3600),
        ..VolumeManagerConfig::new(root.path())
    };
    let Running {
        manager,
        pods,
        cancel,
        task,
    } = start_with_plugin(config, &plugin);
    let pod = pod_with_volumes("p1", vec![empty_dir(FAIL_ON_SETUP, None)]);
    pods.add(pod.clone());
    manager.pod_updated();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(plugin.calls.set_ups(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(plugin.calls.set_ups(), 1, "backing off");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(plugin.calls.set_ups(), 2, "retried as the back-off ended");
    // The second back-off is 1 s.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(plugin.calls.set_ups(), 3);
    cancel.cancel();
    task.await.unwrap();
}

/// Adds `count` pods of one emptyDir each and waits until every one is mounted.
async fn mount_empty_dir_pods(manager: &VolumeManager, pods: &FakePods, count: usize) {
    let all: Vec<_> = (0..count)
        .map(|i| pod_with_volumes(&format!("p{i}"), vec![empty_dir("v", None)]))
        .collect();
    for pod in &all {
        pods.add(pod.clone());
    }
    manager.pod_updated();
    for pod in &all {
        manager.wait_for_attach_and_mount(pod).await.unwrap();
    }
}

/// Issue 15: the remount tick reprocesses only the pods with a volume whose plugin wants
/// periodic remounts (`volumes_that_require_remount_are_set_up_again_every_remount_period`
/// shows those are); a node of emptyDirs is not walked every minute.
#[tokio::test(start_paused = true)]
async fn the_remount_tick_reprocesses_only_pods_with_volumes_that_want_it() {
    let root = tempfile::tempdir().unwrap();
    let pods = Arc::new(FakePods::default());
    let config = VolumeManagerConfig {
        resync_period: Duration::from_secs(3600),
        remount_period: Duration::from_secs(5),
        ..VolumeManagerConfig::new(root.path())
    };
    // emptyDir as built in; hostPath by a plugin that wants periodic remounts.
    let remounted = crate::testing::FakePlugin {
        name: "kubernetes.io/host-path",
        serves: crate::testing::Serves::HostPath,
        requires_remount: true,
        ..Default::default()
    };
    let plugins = crate::plugin::PluginManager::new(vec![
        Arc::new(crate::plugins::empty_dir::EmptyDirPlugin),
        Arc::new(remounted),
    ]);
    let r = start_over(
        config,
        Arc::new(FakeMounter::new()),
        pods.clone(),
        pods.clone(),
        plugins,
    );
    mount_empty_dir_pods(&r.manager, &pods, 50).await;
    let wants_it = pod_with_volumes("wants-it", vec![host_path("h", root.path(), "")]);
    pods.add(wants_it.clone());
    r.manager.pod_updated();
    r.manager
        .wait_for_attach_and_mount(&wants_it)
        .await
        .unwrap();
    // The waits' own requests are made by the time they return: the window counts the
    // ticks' alone (counting the populator's questions instead also counted the passes that
    // served late operation ends, which failed on a loaded machine).
    let before = r.manager.populator.reprocess_requests();
    tokio::time::sleep(Duration::from_secs(11)).await;
    let requests = r.manager.populator.reprocess_requests() - before;
    assert!(
        (2..=3).contains(&requests),
        "two or three remount ticks of 5 s in 11 s, each reprocessing the one pod that wants it (not the 50 others): {requests} requests"
    );
    r.stop().await;
}

/// The running loop on an idle node (paused time): of ten resyncs, one looks at every pod
/// and the others at what changed (nothing), so the populator asks about each pod once per
/// ten seconds, not every second; a pod added meanwhile is mounted at once all the same.
#[tokio::test(start_paused = true)]
async fn resyncs_look_at_every_pod_once_in_ten() {
    let root = tempfile::tempdir().unwrap();
    let pods = Arc::new(FakePods::default());
    let states = Arc::new(CountingStates::new(pods.clone()));
    let Running {
        manager,
        cancel,
        task,
        ..
    } = start_with_states(
        VolumeManagerConfig::new(root.path()),
        Arc::new(FakeMounter::new()),
        pods.clone(),
        states.clone(),
    );
    mount_empty_dir_pods(&manager, &pods, 50).await;
    // Settle to a resync boundary, then count over ten of them.
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    let before = states.asked.load(std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let asked = states.asked.load(std::sync::atomic::Ordering::SeqCst) - before;
    assert!(
        (50..=2 * 50).contains(&asked),
        "one full look at 50 pods in ten resyncs (upstream's shape: ten), asked {asked}"
    );
    let late = pod_with_volumes("late", vec![empty_dir("v", None)]);
    pods.add(late.clone());
    manager.pod_updated();
    manager.wait_for_attach_and_mount(&late).await.unwrap();
    cancel.cancel();
    task.await.unwrap();
}
