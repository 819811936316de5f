//! `desired_state_of_world_populator_test.go`: inline-volume cases, and PVC-backed cases on the
//! fake attachable plugin.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, PodStatus, Volume};
use rustlet_core::UniquePodName;

use crate::cache::{ActualStateOfWorld, DesiredStateOfWorld, MarkVolumeOpts, VolumeMountState};
use crate::plugins::builtin_plugins;
use crate::populator::Populator;
use crate::testing::{FakePods, empty_dir, pod_with_volumes, volume};

struct Fixture {
    pods: Arc<FakePods>,
    dsw: Arc<DesiredStateOfWorld>,
    asw: Arc<ActualStateOfWorld>,
    populator: Populator,
}

fn fixture() -> Fixture {
    let pods = Arc::new(FakePods::default());
    let dsw = Arc::new(DesiredStateOfWorld::new(builtin_plugins()));
    let asw = Arc::new(ActualStateOfWorld::new(builtin_plugins()));
    let populator = Populator::new(dsw.clone(), asw.clone(), pods.clone(), pods.clone());
    Fixture {
        pods,
        dsw,
        asw,
        populator,
    }
}

#[test]
fn test_find_and_add_new_pods_with_different_conditions() {
    // (has added pods, pod state) -> added?
    for (has_added, state, want) in [
        (true, "running", true),
        (true, "terminating", false),
        (true, "terminated", false),
        (false, "running", true),
        (false, "terminating", true),
        (false, "terminated", false),
    ] {
        let f = fixture();
        f.populator
            .has_added_pods()
            .store(has_added, Ordering::SeqCst);
        f.pods
            .add(pod_with_volumes("p", vec![volume(empty_dir("v"))]));
        match state {
            "terminating" => f.pods.set_terminating("p"),
            "terminated" => f.pods.set_runtime_removed("p"),
            _ => {}
        }
        f.populator.populate();
        assert_eq!(
            f.dsw.pods().contains(&UniquePodName::new("p")),
            want,
            "{has_added} {state}"
        );
    }
}

/// A pod whose status changed is held once: the desired state keeps the pod source's latest
/// version, not the first it saw (each version is a full typed copy of the pod).
#[test]
fn a_processed_pod_is_kept_in_its_latest_version_only() {
    let f = fixture();
    let first = pod_with_volumes("p", vec![volume(empty_dir("a")), volume(empty_dir("b"))]);
    f.pods.add(first.clone());
    f.populator.populate();
    assert_eq!(f.dsw.volumes_to_mount().len(), 2);
    let first_version = Arc::downgrade(&first);
    let mut newer = (*first).clone();
    newer.status = Some(PodStatus {
        phase: Some("Running".into()),
        ..Default::default()
    });
    let newer = Arc::new(newer);
    f.pods.add(newer.clone());
    drop(first);
    f.populator.populate();
    assert!(
        first_version.upgrade().is_none(),
        "nothing keeps the first version"
    );
    let kept = f.dsw.volumes_to_mount();
    assert_eq!(kept.len(), 2);
    assert!(kept.iter().all(|v| Arc::ptr_eq(&v.pod, &newer)));
}

/// Issue 29: a newer version that differs only in its status replaces the kept one at once,
/// without a pass (in a storm the pod workers' status writes outran the passes, and the desired
/// state kept a second typed copy of every pod until the next one); a version with another
/// spec is left to the passes, which decide what to mount for it.
#[test]
fn a_status_only_version_replaces_the_kept_one_without_a_pass() {
    let f = fixture();
    let first = pod_with_volumes("p", vec![volume(empty_dir("a")), volume(empty_dir("b"))]);
    f.pods.add(first.clone());
    f.populator.populate();
    let first_version = Arc::downgrade(&first);
    let mut newer = (*first).clone();
    newer.status = Some(PodStatus {
        phase: Some("Running".into()),
        ..Default::default()
    });
    let newer = Arc::new(newer);
    f.pods.add(newer.clone());
    drop(first);
    f.populator.refresh_pod_object(&newer);
    assert!(
        first_version.upgrade().is_none(),
        "nothing keeps the first version"
    );
    assert!(
        f.dsw
            .volumes_to_mount()
            .iter()
            .all(|v| Arc::ptr_eq(&v.pod, &newer))
    );

    let mut respec = (*newer).clone();
    respec
        .spec
        .as_mut()
        .unwrap()
        .volumes
        .as_mut()
        .unwrap()
        .pop();
    let respec = Arc::new(respec);
    f.pods.add(respec.clone());
    f.populator.refresh_pod_object(&respec);
    assert!(
        f.dsw
            .volumes_to_mount()
            .iter()
            .all(|v| Arc::ptr_eq(&v.pod, &newer)),
        "a changed spec waits for a pass"
    );
}

#[test]
fn v2_volumes_no_container_uses_are_never_added() {
    let f = fixture();
    let mut pod = (*pod_with_volumes("p", vec![volume(empty_dir("used"))])).clone();
    pod.spec
        .as_mut()
        .unwrap()
        .volumes
        .as_mut()
        .unwrap()
        .push(volume(empty_dir("unused")));
    f.pods.add(Arc::new(pod));
    f.populator.populate();
    let names = f.dsw.volume_names_for_pod(&UniquePodName::new("p"));
    assert_eq!(names.keys().collect::<Vec<_>>(), ["used"]);
}

#[test]
fn test_find_and_add_new_pods_find_and_remove_deleted_pods() {
    let f = fixture();
    f.pods
        .add(pod_with_volumes("p", vec![volume(empty_dir("v"))]));
    f.populator.populate();
    assert_eq!(f.dsw.volumes_to_mount().len(), 1);
    // Deleted but containers still running: kept.
    f.pods.remove("p");
    f.populator.populate();
    assert_eq!(f.dsw.volumes_to_mount().len(), 1);
    // Runtime gone: removed.
    f.pods.set_runtime_removed("p");
    f.populator.populate();
    assert!(f.dsw.volumes_to_mount().is_empty());
}

/// upstream: TestFindAndRemoveDeletedPodsWithActualState; its last step (an uncertain mount
/// counts) is also TestFindAndRemoveDeletedPodsWithUncertain's, ported as such below.
#[test]
fn test_find_and_remove_deleted_pods_with_actual_state() {
    let f = fixture();
    f.pods
        .add(pod_with_volumes("p", vec![volume(empty_dir("v"))]));
    f.populator.populate();
    let vol = f.dsw.volumes_to_mount()[0].volume_name.clone();
    f.pods.set_runtime_removed("p");
    f.populator.populate();
    assert_eq!(
        f.dsw.volumes_to_mount().len(),
        1,
        "V22 step 3: never mounted and still known: kept"
    );
    f.asw
        .mark_volume_as_attached(Some(vol.clone()), &empty_dir("v"), "")
        .unwrap();
    f.asw
        .mark_volume_as_mounted(MarkVolumeOpts {
            pod_name: UniquePodName::new("p"),
            pod_uid: rustlet_core::PodUid::new("p"),
            volume_name: vol,
            spec: empty_dir("v"),
            outer_volume_spec_name: "v".into(),
            volume_gid: None,
            state: VolumeMountState::Uncertain,
        })
        .unwrap();
    f.populator.populate();
    assert!(
        f.dsw.volumes_to_mount().is_empty(),
        "an uncertain mount counts: removed, so it is torn down"
    );
}

#[test]
fn test_find_and_add_new_pods_with_volume_retrieval_error() {
    let f = fixture();
    let claim = Volume {
        name: "data".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: "c".into(),
            read_only: None,
        }),
        ..Default::default()
    };
    f.pods
        .add(pod_with_volumes("p", vec![claim, volume(empty_dir("ok"))]));
    f.populator.populate();
    let errors = f.dsw.pop_pod_errors(&UniquePodName::new("p"));
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("need an API to read them"), "{errors:?}");
    assert_eq!(
        f.dsw.volumes_to_mount().len(),
        1,
        "the good volume is still added"
    );
    let p = UniquePodName::new("p");
    // Never seen by a wait: retried on every pass.
    f.populator.populate();
    assert_eq!(f.dsw.pop_pod_errors(&p).len(), 1);
    // After a reprocess (from a wait) and one more failure, it is marked processed.
    f.populator.reprocess_pod(&p);
    f.populator.populate();
    assert_eq!(f.dsw.pop_pod_errors(&p).len(), 1);
    f.populator.populate();
    assert!(
        f.dsw.pop_pod_errors(&p).is_empty(),
        "not retried every pass any more"
    );
    f.populator.reprocess_pod(&p);
    f.populator.populate();
    assert_eq!(
        f.dsw.pop_pod_errors(&p).len(),
        1,
        "retried after the next reprocess"
    );
}

#[test]
fn v17_has_added_pods_waits_for_the_sources() {
    let f = fixture();
    f.pods.set_ready(false);
    f.populator.populate();
    assert!(!f.populator.has_added_pods().load(Ordering::SeqCst));
    f.pods.set_ready(true);
    f.populator.populate();
    assert!(f.populator.has_added_pods().load(Ordering::SeqCst));
}

/// Issue 29: a full pass over pods whose objects are the ones processed last time asks
/// nothing about them but whether their runtime is gone (the question whether their containers
/// should be terminating, with its UID, was half of an idle node's full pass); a new version
/// of a pod is looked at as before.
#[test]
fn a_full_pass_over_the_objects_processed_last_time_asks_only_about_removal() {
    use std::sync::atomic::Ordering;
    let pods = Arc::new(FakePods::default());
    let states = Arc::new(super::CountingStates::new(pods.clone()));
    let dsw = Arc::new(DesiredStateOfWorld::new(builtin_plugins()));
    let asw = Arc::new(ActualStateOfWorld::new(builtin_plugins()));
    let populator = Populator::new(dsw.clone(), asw.clone(), pods.clone(), states.clone());
    for i in 0..10 {
        pods.add(pod_with_volumes(
            &format!("p{i}"),
            vec![volume(empty_dir("v"))],
        ));
    }
    populator.populate();
    assert_eq!(dsw.pods().len(), 10);
    let terminating = || states.asked_terminating.swap(0, Ordering::SeqCst);
    terminating();
    assert_eq!(
        states.asked_by(|| populator.populate()),
        10,
        "removal: every pod"
    );
    assert_eq!(terminating(), 0, "the same objects: no other question");
    // A new version of p3 (a label): looked at, and the desired state holds it.
    let mut p3 = (*pod_with_volumes("p3", vec![volume(empty_dir("v"))])).clone();
    p3.metadata.labels = Some([("v".to_owned(), "2".to_owned())].into());
    pods.add(Arc::new(p3));
    populator.populate();
    assert_eq!(terminating(), 1, "the new version of p3 alone");
    let held = dsw
        .volumes_to_mount_for_pod(&UniquePodName::new("p3"))
        .into_iter()
        .map(|v| v.pod.metadata.labels.clone())
        .collect::<Vec<_>>();
    assert_eq!(held, vec![Some([("v".to_owned(), "2".to_owned())].into())]);
    populator.populate();
    assert_eq!(terminating(), 0);
}

/// Issue 15: a pass of what changed makes V19-V22's decisions for the pods the source or the
/// pod workers named (and those asked to be processed again, or kept for a later look), not
/// for every pod; the resync's full pass stays the safety net.
#[test]
fn a_pass_of_what_changed_adds_and_removes_only_the_pods_named() {
    let pods = Arc::new(FakePods::default());
    let states = Arc::new(super::CountingStates::new(pods.clone()));
    let dsw = Arc::new(DesiredStateOfWorld::new(builtin_plugins()));
    let asw = Arc::new(ActualStateOfWorld::new(builtin_plugins()));
    let populator = Populator::new(dsw.clone(), asw.clone(), pods.clone(), states.clone());
    for i in 0..100 {
        pods.add(pod_with_volumes(
            &format!("p{i}"),
            vec![volume(empty_dir("v"))],
        ));
    }
    populator.populate_changed(); // not steady yet: a full pass
    assert_eq!(dsw.pods().len(), 100);
    let asked = |f: &dyn Fn()| states.asked_by(f);
    assert_eq!(
        asked(&|| populator.populate_changed()),
        0,
        "nothing changed"
    );
    pods.add(pod_with_volumes("new", vec![volume(empty_dir("v"))]));
    assert_eq!(
        asked(&|| populator.populate_changed()),
        1,
        "the new pod only"
    );
    assert!(dsw.pods().contains(&UniquePodName::new("new")));
    // Deleted, containers still running: kept; the runtime gone (the workers' log): removed.
    pods.remove("p3");
    populator.populate_changed();
    assert!(dsw.pods().contains(&UniquePodName::new("p3")));
    pods.set_runtime_removed("p3");
    assert_eq!(asked(&|| populator.populate_changed()), 1);
    assert!(!dsw.pods().contains(&UniquePodName::new("p3")));
    // V22's quirk: known, runtime gone, never mounted: kept, and looked at again on each pass
    // until its mount shows, then removed.
    pods.set_runtime_removed("p5");
    populator.populate_changed();
    assert!(dsw.pods().contains(&UniquePodName::new("p5")));
    let vol = dsw.volume_names_for_pod(&UniquePodName::new("p5"))["v"].clone();
    asw.mark_volume_as_attached(Some(vol.clone()), &empty_dir("v"), "")
        .unwrap();
    asw.mark_volume_as_mounted(MarkVolumeOpts {
        pod_name: UniquePodName::new("p5"),
        pod_uid: rustlet_core::PodUid::new("p5"),
        volume_name: vol,
        spec: empty_dir("v"),
        outer_volume_spec_name: "v".into(),
        volume_gid: None,
        state: VolumeMountState::Mounted,
    })
    .unwrap();
    populator.populate_changed();
    assert!(!dsw.pods().contains(&UniquePodName::new("p5")));
    // A reprocess request is served by the next pass.
    populator.reprocess_pod(&UniquePodName::new("p7"));
    assert_eq!(asked(&|| populator.populate_changed()), 1);
    assert_eq!(asked(&|| populator.populate_changed()), 0);
    // The same decisions as a full pass: nothing left for it to do.
    let before = dsw.pods();
    populator.populate();
    assert_eq!(dsw.pods(), before);
}

/// Upstream `prepareDSWPWithPodPV`: a populator over the fake attachable plugin and a bound
/// claim `ns/file-bound` of the PV `dswp-test-volume-name`, with the pod `dswp-test-pod` using it
/// added and processed (the claim is read off the pass, so two passes).
struct PvFixture {
    f: Fixture,
    plugin: crate::testing::FakeAttachablePlugin,
    pod: Arc<k8s_openapi::api::core::v1::Pod>,
    volume: rustlet_core::UniqueVolumeName,
}

async fn prepare_dswp_with_pod_pv() -> PvFixture {
    use crate::plugin::PluginManager;
    use crate::testing::{FakeAttachablePlugin, FakeVolumeObjects};
    use k8s_openapi::api::core::v1::{
        ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
        PersistentVolumeClaimStatus, PersistentVolumeSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let plugin = FakeAttachablePlugin::default();
    let plugins = PluginManager::new(vec![Arc::new(plugin.clone())]);
    let objects = Arc::new(FakeVolumeObjects::default());
    objects.put_claim(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("file-bound".into()),
            namespace: Some("ns".into()),
            uid: Some("pvc-uid".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: Some("dswp-test-volume-name".into()),
            ..Default::default()
        }),
        status: Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        }),
    });
    objects.put_volume(PersistentVolume {
        metadata: ObjectMeta {
            name: Some("dswp-test-volume-name".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            claim_ref: Some(ObjectReference {
                namespace: Some("ns".into()),
                name: Some("file-bound".into()),
                uid: Some("pvc-uid".into()),
                ..Default::default()
            }),
            volume_mode: Some("Filesystem".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let pods = Arc::new(FakePods::default());
    let dsw = Arc::new(DesiredStateOfWorld::new(plugins.clone()));
    let asw = Arc::new(ActualStateOfWorld::new(plugins));
    let populator =
        Populator::new(dsw.clone(), asw.clone(), pods.clone(), pods.clone()).with_objects(objects);
    let pod = pod_with_volumes(
        "dswp-test-pod",
        vec![Volume {
            name: "dswp-test-volume-name".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: "file-bound".into(),
                read_only: None,
            }),
            ..Default::default()
        }],
    );
    pods.add(pod.clone());
    populator.populate();
    populator.claims_resolved().notified().await;
    populator.populate();
    let pod_name = UniquePodName::new("dswp-test-pod");
    assert!(
        populator.pod_previously_processed(&pod_name),
        "the pod's volumes were processed"
    );
    let volume =
        rustlet_core::UniqueVolumeName::new("kubernetes.io/fake-attachable/dswp-test-volume-name");
    assert!(dsw.volume_exists(&volume));
    assert!(dsw.pod_exists_in_volume(&pod_name, &volume));
    // Upstream `verifyVolumeExistsInVolumesToMount`, not reported in use.
    assert!(
        dsw.volumes_to_mount()
            .iter()
            .any(|v| v.volume_name == volume && !v.reported_in_use)
    );
    PvFixture {
        f: Fixture {
            pods,
            dsw,
            asw,
            populator,
        },
        plugin,
        pod,
        volume,
    }
}

/// upstream: TestFindAndRemoveDeletedPodsWithUncertain
///
/// The pod is deleted and its runtime removed while its volume's mount is uncertain: an
/// uncertain mount counts as (possibly) mounted, so the pair leaves the desired state (and the
/// reconciler tears it down).
#[tokio::test]
async fn test_find_and_remove_deleted_pods_with_uncertain() {
    let PvFixture { f, pod, volume, .. } = prepare_dswp_with_pod_pv().await;
    let pod_name = UniquePodName::new("dswp-test-pod");
    f.pods.remove("dswp-test-pod");
    f.pods.set_runtime_removed("dswp-test-pod");
    // Upstream `reconcileASW`: the volume attached and mounted for the pod.
    let spec = f.dsw.volumes_to_mount()[0].spec.clone();
    f.asw
        .mark_volume_as_attached(Some(volume.clone()), &spec, "")
        .unwrap();
    let opts = |state| MarkVolumeOpts {
        pod_name: pod_name.clone(),
        pod_uid: rustlet_core::PodUid::of(&pod),
        volume_name: volume.clone(),
        spec: spec.clone(),
        outer_volume_spec_name: "dswp-test-volume-name".into(),
        volume_gid: None,
        state,
    };
    f.asw
        .mark_volume_as_mounted(opts(VolumeMountState::Mounted))
        .unwrap();
    // Then marked uncertain.
    f.asw
        .mark_volume_mount_as_uncertain(opts(VolumeMountState::Uncertain))
        .unwrap();
    // findAndRemoveDeletedPods.
    f.populator.populate();
    assert!(!f.populator.pod_previously_processed(&pod_name));
    assert!(!f.dsw.volume_exists(&volume), "VolumeExists");
    assert!(!f.dsw.pod_exists_in_volume(&pod_name, &volume));
    assert!(
        !f.dsw
            .volumes_to_mount()
            .iter()
            .any(|v| v.volume_name == volume),
        "not in the volumes to mount"
    );
}

/// upstream: TestFindAndRemoveNonattachableVolumes
///
/// The plugin of an added volume stops attaching (a CSI driver whose `attachRequired` changed):
/// the volume stays desired, and the populator's pass marks it not attachable (V22).
#[tokio::test]
async fn test_find_and_remove_nonattachable_volumes() {
    let PvFixture {
        f, plugin, volume, ..
    } = prepare_dswp_with_pod_pv().await;
    let attachable = |f: &Fixture| {
        f.dsw
            .volumes_to_mount()
            .iter()
            .find(|v| v.volume_name == volume)
            .map(|v| v.plugin_is_attachable)
    };
    assert_eq!(attachable(&f), Some(true));
    // Change the volume plugin from attachable to non-attachable.
    plugin.non_attachable.store(true, Ordering::SeqCst);
    assert_eq!(attachable(&f), Some(true), "the volume still exists");
    // findAndRemoveDeletedPods.
    f.populator.populate();
    assert_eq!(
        attachable(&f),
        Some(false),
        "the volume's attachable field follows its plugin"
    );
}
