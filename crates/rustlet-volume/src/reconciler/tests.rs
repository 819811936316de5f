//! Reconciler tests: upstream `reconciler_test.go` cases for non-attachable volumes, with the
//! fake plugin's call counters and magic volume names, on paused tokio time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustlet_core::{PodUid, UniquePodName};
use rustlet_mount::fake::FakeMounter;

use super::{PassReport, Reconciler};
use crate::cache::{
    ActualStateOfWorld, DesiredStateOfWorld, MarkVolumeOpts, PodVolumeState, VolumeMountState,
};
use crate::events::{EventKind, FAILED_MOUNT};
use crate::executor::OperationExecutor;
use crate::plugin::{PluginManager, VolumeHost};
use crate::testing::{
    FAIL_ON_SETUP, FAIL_ON_TEARDOWN, FakePlugin, FakeRecorder, Serves, TIMEOUT_ON_SETUP, empty_dir,
    pod,
};

struct World {
    _root: tempfile::TempDir,
    dsw: Arc<DesiredStateOfWorld>,
    asw: Arc<ActualStateOfWorld>,
    executor: Arc<OperationExecutor>,
    reconciler: Reconciler,
    plugin: FakePlugin,
    events: Arc<FakeRecorder>,
    ready: Arc<AtomicBool>,
}

fn world() -> World {
    world_with(FakePlugin::default())
}

/// A world whose one plugin serves emptyDirs, with `plugin`'s other settings.
fn world_with(plugin: FakePlugin) -> World {
    let root = tempfile::tempdir().unwrap();
    let plugin = FakePlugin {
        name: "kubernetes.io/empty-dir",
        serves: Serves::EmptyDir,
        ..plugin
    };
    let plugins = PluginManager::new(vec![Arc::new(plugin.clone())]);
    let host = VolumeHost {
        root_dir: root.path().to_owned(),
        mounter: Arc::new(FakeMounter::new()),
        node_allocatable_memory: None,
    };
    let dsw = Arc::new(DesiredStateOfWorld::new(plugins.clone()));
    let asw = Arc::new(ActualStateOfWorld::new(plugins.clone()));
    let events = Arc::new(FakeRecorder::default());
    let executor = Arc::new(OperationExecutor::new(
        asw.clone(),
        plugins,
        host,
        events.clone(),
    ));
    let ready = Arc::new(AtomicBool::new(true));
    let reconciler = Reconciler::new(dsw.clone(), asw.clone(), executor.clone(), ready.clone());
    World {
        _root: root,
        dsw,
        asw,
        executor,
        reconciler,
        plugin,
        events,
        ready,
    }
}

impl World {
    async fn pass(&self) -> PassReport {
        let report = self.reconciler.reconcile();
        self.executor.operations().wait().await;
        report
    }

    fn add(&self, uid: &str, volume: &str) -> rustlet_core::UniqueVolumeName {
        self.dsw
            .add_pod_to_volume(
                &UniquePodName::new(uid),
                pod(uid),
                empty_dir(volume),
                volume,
            )
            .unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn test_run_positive_do_nothing() {
    let w = world();
    assert_eq!(w.pass().await, PassReport::default());
    assert_eq!(
        (w.plugin.calls.set_ups(), w.plugin.calls.tear_downs()),
        (0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn non_attachable_volume_is_mounted_in_one_pass_then_left_alone() {
    let w = world();
    let vol = w.add("p1", "cache");
    assert_eq!(w.pass().await.mounts, 1);
    assert!(matches!(
        w.asw.pod_exists_in_volume(&UniquePodName::new("p1"), &vol),
        PodVolumeState::Mounted { .. }
    ));
    assert_eq!(
        w.asw.mounted_volumes_for_pod(&UniquePodName::new("p1"))[0].outer_volume_spec_names,
        ["cache"]
    );
    assert_eq!(
        w.pass().await,
        PassReport::default(),
        "steady state: nothing to do"
    );
    assert_eq!(w.plugin.calls.set_ups(), 1);
}

/// A storm larger than `MAX_OPERATIONS_IN_FLIGHT`: one pass starts that many mounts, the
/// next (after they ended) the rest; each volume is set up once.
#[tokio::test(start_paused = true)]
async fn a_pass_starts_at_most_the_cap_of_operations() {
    let w = world();
    let pods = crate::reconciler::MAX_OPERATIONS_IN_FLIGHT + 44;
    for i in 0..pods {
        w.add(&format!("p{i}"), "cache");
    }
    let first = w.reconciler.reconcile();
    assert_eq!(first.mounts, crate::reconciler::MAX_OPERATIONS_IN_FLIGHT);
    assert!(
        !w.executor
            .operations()
            .has_room(crate::reconciler::MAX_OPERATIONS_IN_FLIGHT)
    );
    w.executor.operations().wait().await;
    assert_eq!(w.pass().await.mounts, 44);
    assert_eq!(w.pass().await, PassReport::default());
    assert_eq!(w.plugin.calls.set_ups(), pods);
}

/// Issue 15: volumes held back by the cap are not looked at by every pass while the cap is
/// full (a storm's passes were O(held back) each); they join as room is freed, and the
/// started ones come back through their ends, not by being looked at while they run.
#[tokio::test(start_paused = true)]
async fn held_back_volumes_wait_for_room_and_started_ones_for_their_end() {
    use super::{MAX_OPERATIONS_IN_FLIGHT, PassScope};
    let w = world();
    let pods = MAX_OPERATIONS_IN_FLIGHT + 44;
    for i in 0..pods {
        w.add(&format!("p{i}"), "cache");
    }
    assert_eq!(w.reconciler.reconcile().mounts, MAX_OPERATIONS_IN_FLIGHT);
    // The first pass recorded the started ones as attached (a write): each is looked at once
    // more, and left to its end.
    assert_eq!(w.reconciler.reconcile(), PassReport::default());
    assert_eq!(
        w.reconciler.last_pass(),
        PassScope::Volumes {
            looked: MAX_OPERATIONS_IN_FLIGHT,
            again: 0
        }
    );
    // The cap is full and nothing ended: nothing to look at.
    assert_eq!(w.reconciler.reconcile(), PassReport::default());
    assert_eq!(w.reconciler.last_pass(), PassScope::Skipped);
    // The started ones end (each wrote its volume): those, and the held-back ones, once.
    w.executor.operations().wait().await;
    assert_eq!(w.pass().await.mounts, 44);
    assert_eq!(
        w.reconciler.last_pass(),
        PassScope::Volumes {
            looked: pods,
            again: 0
        }
    );
    assert_eq!(w.pass().await, PassReport::default());
    assert_eq!(
        w.reconciler.last_pass(),
        PassScope::Volumes {
            looked: 44,
            again: 0
        }
    );
    assert_eq!(w.pass().await, PassReport::default());
    assert_eq!(w.reconciler.last_pass(), PassScope::Skipped);
    assert_eq!(w.plugin.calls.set_ups(), pods);
}

/// Issue 15: a failed SetUp that wrote nothing is still retried after its back-off: its end
/// names its volume to the next pass, which meets the back-off and keeps looking until it ends.
#[tokio::test(start_paused = true)]
async fn a_failed_operation_that_wrote_nothing_is_retried_after_its_back_off() {
    use super::PassScope;
    let w = world();
    w.add("p1", FAIL_ON_SETUP);
    w.pass().await; // recorded as attached (a write); the first SetUp fails
    w.pass().await; // backing off
    tokio::time::advance(Duration::from_millis(501)).await;
    assert_eq!(w.pass().await.mounts, 1, "the second attempt");
    // It failed again; this time nothing was written before it (already attached).
    assert_eq!(w.pass().await, PassReport::default());
    assert_eq!(
        w.reconciler.last_pass(),
        PassScope::Volumes {
            looked: 1,
            again: 0
        },
        "named by its end"
    );
    assert_eq!(w.pass().await, PassReport::default());
    assert_eq!(
        w.reconciler.last_pass(),
        PassScope::Volumes {
            looked: 1,
            again: 1
        },
        "backing off: looked at again"
    );
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert_eq!(w.pass().await.mounts, 1, "the third attempt");
    assert_eq!(w.plugin.calls.set_ups(), 3);
}

#[tokio::test(start_paused = true)]
async fn unmount_after_the_pod_leaves_then_the_volume_is_dropped() {
    let w = world();
    let vol = w.add("p1", "cache");
    w.pass().await;
    w.dsw
        .delete_pod_from_volume(&UniquePodName::new("p1"), &vol);
    let report = w.pass().await;
    assert_eq!(report.unmounts, 1);
    assert_eq!(w.plugin.calls.tear_downs(), 1);
    assert!(
        w.asw
            .pod_removed_from_volume(&UniquePodName::new("p1"), &vol)
    );
    assert_eq!(
        w.pass().await.detached,
        1,
        "V45: dropped on the pass after TearDown"
    );
    assert!(w.asw.attached_volumes().is_empty());
}

#[tokio::test(start_paused = true)]
async fn nothing_is_unmounted_before_the_sources_are_ready() {
    let w = world();
    let vol = w.add("p1", "cache");
    w.pass().await;
    w.ready.store(false, Ordering::Release);
    w.dsw
        .delete_pod_from_volume(&UniquePodName::new("p1"), &vol);
    assert_eq!(w.pass().await, PassReport::default());
    assert_eq!(w.plugin.calls.tear_downs(), 0);
    w.ready.store(true, Ordering::Release);
    assert_eq!(w.pass().await.unmounts, 1);
}

#[tokio::test(start_paused = true)]
async fn failed_set_up_raises_failed_mount_and_backs_off() {
    let w = world();
    let vol = w.add("p1", FAIL_ON_SETUP);
    w.pass().await;
    assert_eq!(w.plugin.calls.set_ups(), 1);
    assert!(matches!(
        w.asw.pod_exists_in_volume(&UniquePodName::new("p1"), &vol),
        PodVolumeState::NotMounted { .. }
    ));
    let events = w.events.events();
    assert_eq!(
        events,
        [(
            EventKind::Warning,
            FAILED_MOUNT.to_owned(),
            format!(
                "MountVolume.SetUp failed for volume {FAIL_ON_SETUP:?} : mount failed: fake error"
            )
        )]
    );
    // Within the 500 ms backoff nothing is retried; after it, SetUp runs again.
    w.pass().await;
    assert_eq!(w.plugin.calls.set_ups(), 1);
    tokio::time::advance(Duration::from_millis(501)).await;
    w.pass().await;
    assert_eq!(w.plugin.calls.set_ups(), 2);
}

/// upstream: Test_UncertainVolumeMountState (its `TimeoutOnSetupVolumeName` case, on a per-pod
/// plugin; the whole table is `test_uncertain_volume_mount_state` in `attach_tests.rs`)
#[tokio::test(start_paused = true)]
async fn uncertain_set_up_is_possibly_mounted_and_is_torn_down_when_the_pod_goes() {
    let w = world();
    let pod_name = UniquePodName::new("p1");
    let vol = w.add("p1", TIMEOUT_ON_SETUP);
    w.pass().await;
    assert!(matches!(
        w.asw.pod_exists_in_volume(&pod_name, &vol),
        PodVolumeState::Uncertain { .. }
    ));
    assert_eq!(w.asw.possibly_mounted_volumes_for_pod(&pod_name).len(), 1);
    assert!(w.asw.mounted_volumes_for_pod(&pod_name).is_empty());
    w.dsw.delete_pod_from_volume(&pod_name, &vol);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        w.pass().await.unmounts,
        1,
        "an uncertain mount is torn down, not forgotten"
    );
    assert_eq!(w.plugin.calls.tear_downs(), 1);
}

#[tokio::test(start_paused = true)]
async fn failed_tear_down_leaves_the_mount_uncertain() {
    let w = world();
    let pod_name = UniquePodName::new("p1");
    let vol = w.add("p1", FAIL_ON_TEARDOWN);
    w.pass().await;
    w.dsw.delete_pod_from_volume(&pod_name, &vol);
    w.pass().await;
    assert!(matches!(
        w.asw.pod_exists_in_volume(&pod_name, &vol),
        PodVolumeState::Uncertain { .. }
    ));
    assert!(!w.asw.pod_removed_from_volume(&pod_name, &vol));
    assert_eq!(
        w.pass().await.detached,
        0,
        "never dropped while possibly mounted"
    );
}

/// upstream: TestReconstructVolumesMount (its case (b), PR #110670, on a per-pod plugin; the
/// whole table is `test_reconstruct_volumes_mount` in `attach_tests.rs`)
#[tokio::test(start_paused = true)]
async fn reconstructed_volume_stays_uncertain_after_a_final_set_up_error() {
    let w = world();
    let pod_name = UniquePodName::new("p1");
    let vol = w.add("p1", FAIL_ON_SETUP);
    w.asw
        .mark_volume_as_attached(Some(vol.clone()), &empty_dir(FAIL_ON_SETUP), "")
        .unwrap();
    let opts = MarkVolumeOpts {
        pod_name: pod_name.clone(),
        pod_uid: PodUid::new("p1"),
        volume_name: vol.clone(),
        spec: empty_dir(FAIL_ON_SETUP),
        outer_volume_spec_name: FAIL_ON_SETUP.into(),
        volume_gid: None,
        state: VolumeMountState::Uncertain,
    };
    assert!(
        w.asw
            .check_and_mark_volume_as_uncertain_via_reconstruction(opts)
            .unwrap()
    );
    w.pass().await;
    assert_eq!(w.plugin.calls.set_ups(), 1);
    assert!(matches!(
        w.asw.pod_exists_in_volume(&pod_name, &vol),
        PodVolumeState::Uncertain { .. }
    ));
    assert_eq!(w.plugin.calls.tear_downs(), 0);
}

#[tokio::test(start_paused = true)]
async fn two_pods_of_a_per_pod_plugin_mount_independently() {
    let w = world();
    let a = w.add("a", "data");
    let b = w.add("b", "data");
    assert_ne!(a, b);
    assert_eq!(w.pass().await.mounts, 2);
    assert_eq!(w.asw.mounted_volumes().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn executor_changes_are_signalled() {
    let w = world();
    let changes = w.executor.subscribe();
    w.add("p1", "cache");
    w.pass().await;
    assert!(
        changes.has_changed().unwrap(),
        "waiters are woken by the actual state, not by polling"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_pass_is_skipped_until_either_state_changes() {
    let w = world();
    w.add("p1", "a");
    w.pass().await;
    assert_eq!(w.pass().await, PassReport::default(), "idle");
    let before = w.plugin.calls.set_ups();
    assert_eq!(
        w.pass().await,
        PassReport::default(),
        "skipped: nothing changed"
    );
    w.add("p2", "b");
    assert_eq!(
        w.pass().await.mounts,
        1,
        "a desired-state change is seen at once"
    );
    assert_eq!(w.plugin.calls.set_ups(), before + 1);
    // An actual-state change made behind the reconciler's back (a crash-recovered entry, say)
    // is seen too.
    let (report, clean) = w.reconciler.full_pass(true);
    assert_eq!((report, clean), (PassReport::default(), true));
    let vol = w
        .dsw
        .volumes_to_mount()
        .into_iter()
        .find(|v| v.pod_name.as_str() == "p1")
        .unwrap()
        .volume_name;
    w.asw
        .mark_volume_as_unmounted(&UniquePodName::new("p1"), &vol);
    assert_eq!(w.pass().await.mounts, 1);
}

/// Issue 10 item 15 (V55, upstream `SuccessAndTimeoutSetupVolumeName`): a volume mounted once
/// whose remount times out stays mounted; only a volume not mounted becomes uncertain.
///
/// upstream: Test_UncertainVolumeMountState (that case, on a per-pod plugin)
#[tokio::test(start_paused = true)]
async fn v55_a_remount_that_times_out_never_downgrades_a_mounted_volume() {
    let w = world_with(FakePlugin {
        requires_remount: true,
        ..FakePlugin::default()
    });
    let pod_name = UniquePodName::new("p1");
    let vol = w.add("p1", "v");
    w.pass().await;
    assert!(w.asw.pod_exists_in_volume(&pod_name, &vol).is_mounted());
    w.asw
        .mark_remount_required(&pod_name, std::slice::from_ref(&vol));
    w.plugin
        .calls
        .time_out_set_ups
        .store(true, std::sync::atomic::Ordering::SeqCst);
    w.pass().await;
    assert_eq!(w.plugin.calls.set_ups(), 2, "the remount ran and timed out");
    let state = w.asw.pod_exists_in_volume(&pod_name, &vol);
    assert!(
        state.is_mounted(),
        "still mounted, not uncertain: {state:?}"
    );
    assert_eq!(w.asw.mounted_volumes_for_pod(&pod_name).len(), 1);
}

/// Issue 15: after the first pass, a pass looks only at the volumes written since the last
/// one (and at those it started something for), not at every volume; a change of the
/// sources-ready flag looks at everything again.
#[tokio::test(start_paused = true)]
async fn a_pass_looks_only_at_the_volumes_written_since_the_last() {
    use super::PassScope;
    let volumes = |looked| PassScope::Volumes { looked, again: 0 };
    let w = world();
    for i in 0..50 {
        w.add(&format!("p{i}"), "cache");
    }
    assert_eq!(w.pass().await.mounts, 50);
    assert_eq!(w.reconciler.last_pass(), PassScope::Everything, "the first");
    // The mounts it started are looked at once more (each wrote its volume and ended).
    assert_eq!(w.pass().await, PassReport::default());
    assert_eq!(w.reconciler.last_pass(), volumes(50));
    assert_eq!(w.pass().await, PassReport::default());
    assert_eq!(
        w.reconciler.last_pass(),
        PassScope::Skipped,
        "nothing changed"
    );
    // One pod more: its volume only, then once more after its mount.
    let vol = w.add("new", "cache");
    assert_eq!(w.pass().await.mounts, 1);
    assert_eq!(w.reconciler.last_pass(), volumes(1));
    assert!(
        w.asw
            .pod_exists_in_volume(&UniquePodName::new("new"), &vol)
            .is_mounted()
    );
    w.pass().await;
    assert_eq!(w.reconciler.last_pass(), volumes(1));
    // A pod leaves: its volume is unmounted, looking at it alone.
    w.dsw
        .delete_pod_from_volume(&UniquePodName::new("p7"), &w.add("p7", "cache"));
    assert_eq!(w.pass().await.unmounts, 1);
    assert_eq!(w.reconciler.last_pass(), volumes(1));
    // The sources' readiness flips: every volume once.
    w.ready.store(false, Ordering::SeqCst);
    w.pass().await;
    assert_eq!(w.reconciler.last_pass(), PassScope::Everything);
    assert_eq!(w.asw.mounted_volumes().len(), 50);
}

/// Issue 29: a pod's volumes are set up in one blocking-pool hop, one after the other, on one
/// thread, and recorded together; while one of them hangs, another pod's volume is set up
/// and recorded meanwhile.
#[tokio::test(start_paused = true)]
async fn a_pods_volumes_are_set_up_in_one_hop_and_other_pods_do_not_wait() {
    let w = world();
    let gate = Arc::new(crate::testing::ThreadGate::new());
    *w.plugin.calls.set_up_gate.lock().unwrap() = Some(("a".into(), gate.clone()));
    gate.arm();
    // A failed assertion releases the parked SetUp (the runtime's end waits for it).
    struct ReleaseOnDrop(Arc<crate::testing::ThreadGate>);
    impl Drop for ReleaseOnDrop {
        fn drop(&mut self) {
            self.0.release();
        }
    }
    let _release = ReleaseOnDrop(gate.clone());
    let mut changed = w.executor.subscribe();
    let a = w.add("p1", "a");
    let b = w.add("p1", "b");
    assert_eq!(w.reconciler.reconcile().mounts, 2);
    assert_eq!(gate.parked().await, crate::testing::GateOutcome::Parked);
    // Another pod's volume, once p1's hop holds its thread: the blocking pool reuses an idle
    // thread, so only a hop started while p1's hangs shows that it does not wait for it.
    let other = w.add("p2", "c");
    assert_eq!(w.reconciler.reconcile().mounts, 1);
    // p2's hop is not held by p1's (paused time: waited for with the executor's notices).
    while !w
        .asw
        .pod_exists_in_volume(&UniquePodName::new("p2"), &other)
        .is_mounted()
    {
        changed.changed().await.unwrap();
    }
    // p1's volumes come in one hop: neither is recorded while one of them hangs.
    let p1 = UniquePodName::new("p1");
    for volume in [&a, &b] {
        assert!(!w.asw.pod_exists_in_volume(&p1, volume).is_mounted());
    }
    gate.release();
    w.executor.operations().wait().await;
    let threads = w.plugin.calls.set_up_threads.lock().unwrap().clone();
    let thread_of = |volume: &str| threads.iter().find(|(n, _)| n == volume).unwrap().1;
    assert_eq!(thread_of("a"), thread_of("b"), "one hop: {threads:?}");
    assert_ne!(thread_of("a"), thread_of("c"), "a hop per pod: {threads:?}");
    for volume in [&a, &b] {
        assert!(w.asw.pod_exists_in_volume(&p1, volume).is_mounted());
    }
}

/// Issue 29: a panicking SetUp in a pod's hop fails its own volume (uncertain, a FailedMount
/// event, a back-off) and no other: the pod's other volume is mounted.
#[tokio::test(start_paused = true)]
async fn a_panicking_set_up_fails_its_volume_alone() {
    let w = world();
    let panicking = w.add("p1", crate::testing::PANIC_ON_SETUP);
    let fine = w.add("p1", "fine");
    assert_eq!(w.pass().await.mounts, 2);
    let p1 = UniquePodName::new("p1");
    assert!(w.asw.pod_exists_in_volume(&p1, &fine).is_mounted());
    assert!(matches!(
        w.asw.pod_exists_in_volume(&p1, &panicking),
        PodVolumeState::Uncertain { .. }
    ));
    let events = w.events.events();
    assert!(
        events
            .iter()
            .any(|(kind, reason, message)| *kind == EventKind::Warning
                && reason == FAILED_MOUNT
                && message.contains("panicked")),
        "{events:?}"
    );
    assert_eq!(w.pass().await.mounts, 0, "backing off");
}
