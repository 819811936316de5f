//! Upstream `desired_state_of_world_test.go` and `actual_state_of_world_test.go`, ported by
//! name (the SELinux cases wait for SELinux support).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use rustlet_core::{PodUid, UniquePodName, UniqueVolumeName};

use super::asw::{
    ActualStateOfWorld, DeviceMountState, MarkVolumeOpts, PodVolumeState, VolumeMountState,
};
use super::dsw::{DesiredStateOfWorld, desired_size_limit};
use crate::spec::VolumeSpec;
use crate::testing::{empty_dir, fake_plugins, persistent, pod};

fn pod_name(uid: &str) -> UniquePodName {
    UniquePodName::new(uid)
}

#[test]
fn test_add_pod_to_volume_positive_new_pod_new_volume() {
    let dsw = DesiredStateOfWorld::new(fake_plugins());
    let name = dsw
        .add_pod_to_volume(
            &pod_name("pod1uid"),
            pod("pod1uid"),
            empty_dir("volume-name"),
            "volume-name",
        )
        .unwrap();
    assert_eq!(name.as_str(), "kubernetes.io/empty-dir/pod1uid-volume-name");
    assert!(dsw.volume_exists(&name));
    assert!(dsw.pod_exists_in_volume(&pod_name("pod1uid"), &name));
    let to_mount = dsw.volumes_to_mount();
    assert_eq!(to_mount.len(), 1);
    assert_eq!(to_mount[0].volume_name, name);
    assert_eq!(to_mount[0].outer_volume_spec_names, ["volume-name"]);
    assert!(!to_mount[0].plugin_is_attachable && !to_mount[0].reported_in_use);
}

#[test]
fn test_add_pod_to_volume_positive_existing_pod_existing_volume() {
    let dsw = DesiredStateOfWorld::new(fake_plugins());
    let first = dsw
        .add_pod_to_volume(&pod_name("p"), pod("p"), empty_dir("v"), "v")
        .unwrap();
    let second = dsw
        .add_pod_to_volume(&pod_name("p"), pod("p"), empty_dir("v"), "v")
        .unwrap();
    assert_eq!(first, second);
    assert_eq!(dsw.volumes_to_mount().len(), 1);
}

#[test]
fn test_add_pod_to_volume_positive_names_for_different_pods_and_different_volumes() {
    let dsw = DesiredStateOfWorld::new(fake_plugins());
    let a = dsw
        .add_pod_to_volume(&pod_name("a"), pod("a"), empty_dir("data"), "data")
        .unwrap();
    let b = dsw
        .add_pod_to_volume(&pod_name("b"), pod("b"), empty_dir("data"), "data")
        .unwrap();
    assert_ne!(a, b, "per-pod plugin: one entry per pod");
    let pa = dsw
        .add_pod_to_volume(&pod_name("a"), pod("a"), persistent("pv-1"), "claim")
        .unwrap();
    let pb = dsw
        .add_pod_to_volume(&pod_name("b"), pod("b"), persistent("pv-1"), "claim")
        .unwrap();
    assert_eq!(pa, pb, "attachable plugin: pods share the entry");
    assert_eq!(pa.as_str(), "fake-plugin/pv-1");
    assert_eq!(dsw.volumes_to_mount().len(), 4);
}

#[test]
fn v25_a_second_outer_name_for_the_same_volume_is_appended() {
    let dsw = DesiredStateOfWorld::new(fake_plugins());
    let name = dsw
        .add_pod_to_volume(&pod_name("a"), pod("a"), persistent("pv-1"), "claim-a")
        .unwrap();
    dsw.add_pod_to_volume(&pod_name("a"), pod("a"), persistent("pv-1"), "claim-b")
        .unwrap();
    assert_eq!(
        dsw.volumes_to_mount()[0].outer_volume_spec_names,
        ["claim-a", "claim-b"]
    );
    let names = dsw.volume_names_for_pod(&pod_name("a"));
    assert_eq!(names.get("claim-b"), Some(&name));
}

/// The per-pod query (through the index) gives what filtering the whole desired state gives:
/// one entry per volume even with two outer names, another pod's volumes left out, nothing
/// once the pod's volumes are gone.
#[test]
fn volumes_to_mount_for_pod_is_the_whole_list_filtered_by_pod() {
    let dsw = DesiredStateOfWorld::new(fake_plugins());
    dsw.add_pod_to_volume(&pod_name("a"), pod("a"), persistent("pv-1"), "claim-a")
        .unwrap();
    dsw.add_pod_to_volume(&pod_name("a"), pod("a"), persistent("pv-1"), "claim-b")
        .unwrap();
    let shared = dsw
        .add_pod_to_volume(&pod_name("a"), pod("a"), persistent("pv-2"), "c")
        .unwrap();
    dsw.add_pod_to_volume(&pod_name("b"), pod("b"), persistent("pv-2"), "c")
        .unwrap();
    dsw.add_pod_to_volume(&pod_name("b"), pod("b"), empty_dir("v"), "v")
        .unwrap();
    let key = |v: &crate::cache::dsw::VolumeToMount| {
        (
            v.volume_name.clone(),
            v.pod_name.clone(),
            v.outer_volume_spec_names.clone(),
        )
    };
    for uid in ["a", "b", "c"] {
        let mut whole: Vec<_> = dsw
            .volumes_to_mount()
            .iter()
            .filter(|v| v.pod_name == pod_name(uid))
            .map(key)
            .collect();
        whole.sort();
        let per_pod: Vec<_> = dsw
            .volumes_to_mount_for_pod(&pod_name(uid))
            .iter()
            .map(key)
            .collect();
        assert_eq!(per_pod, whole, "pod {uid}");
    }
    assert_eq!(dsw.volumes_to_mount_for_pod(&pod_name("a")).len(), 2);
    dsw.delete_pod_from_volume(&pod_name("b"), &shared);
    assert_eq!(dsw.volumes_to_mount_for_pod(&pod_name("b")).len(), 1);
    assert_eq!(dsw.volumes_to_mount_for_pod(&pod_name("a")).len(), 2);
}

#[test]
fn v25_no_plugin_is_an_error() {
    let dsw = DesiredStateOfWorld::new(fake_plugins());
    let spec = VolumeSpec::pod(Volume {
        name: "nothing".into(),
        ..Default::default()
    });
    let err = dsw
        .add_pod_to_volume(&pod_name("a"), pod("a"), spec, "nothing")
        .unwrap_err();
    assert_eq!(err.to_string(), "no volume plugin matched name: nothing");
}

#[test]
fn test_delete_pod_from_volume_positive_pod_exists_volume_exists() {
    let dsw = DesiredStateOfWorld::new(fake_plugins());
    let name = dsw
        .add_pod_to_volume(&pod_name("p"), pod("p"), empty_dir("v"), "v")
        .unwrap();
    dsw.add_error_to_pod(&pod_name("p"), "oops");
    dsw.delete_pod_from_volume(&pod_name("p"), &name);
    assert!(!dsw.volume_exists(&name));
    assert!(!dsw.pod_exists_in_volume(&pod_name("p"), &name));
    assert!(
        dsw.pop_pod_errors(&pod_name("p")).is_empty(),
        "V26: errors go with the pod"
    );
}

#[test]
fn test_mark_volumes_reported_in_use_positive_new_pod_new_volume() {
    let dsw = DesiredStateOfWorld::new(fake_plugins());
    let v1 = dsw
        .add_pod_to_volume(&pod_name("p"), pod("p"), persistent("pv-1"), "c1")
        .unwrap();
    let v2 = dsw
        .add_pod_to_volume(&pod_name("p"), pod("p"), persistent("pv-2"), "c2")
        .unwrap();
    let v3 = dsw
        .add_pod_to_volume(&pod_name("p"), pod("p"), persistent("pv-3"), "c3")
        .unwrap();
    let reported = |dsw: &DesiredStateOfWorld| -> Vec<UniqueVolumeName> {
        dsw.volumes_to_mount()
            .into_iter()
            .filter(|v| v.reported_in_use)
            .map(|v| v.volume_name)
            .collect()
    };
    dsw.mark_volumes_reported_in_use(std::slice::from_ref(&v2));
    assert_eq!(reported(&dsw), std::slice::from_ref(&v2));
    dsw.mark_volumes_reported_in_use(std::slice::from_ref(&v3));
    assert_eq!(reported(&dsw), [v3], "replace semantics");
    assert!(!reported(&dsw).contains(&v1));
}

fn pod_with_ephemeral_limit(limit: Option<&str>) -> Pod {
    let resources = limit.map(|l| ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "ephemeral-storage".to_owned(),
            Quantity(l.to_owned()),
        )])),
        ..Default::default()
    });
    Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                resources,
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn empty_dir_with_limit(limit: Option<&str>) -> VolumeSpec {
    let mut spec = empty_dir("cache");
    if let VolumeSpec::Pod(v) = &mut spec {
        std::sync::Arc::make_mut(v)
            .empty_dir
            .as_mut()
            .unwrap()
            .size_limit = limit.map(|l| Quantity(l.to_owned()));
    }
    spec
}

#[test]
fn test_add_pod_to_volume_with_empty_dir_size_limit() {
    const GI: u64 = 1 << 30;
    let table = [
        (Some("2Gi"), Some("1Gi"), Some(GI)),
        (Some("2Gi"), Some("2Gi"), Some(2 * GI)),
        (Some("2Gi"), Some("3Gi"), Some(2 * GI)),
        (Some("2Gi"), None, Some(2 * GI)),
        (None, Some("1Gi"), Some(GI)),
        (None, Some("2Gi"), Some(2 * GI)),
        (None, Some("3Gi"), Some(3 * GI)),
        (None, None, None),
    ];
    for (pod_limit, size_limit, want) in table {
        let p = pod_with_ephemeral_limit(pod_limit);
        assert_eq!(
            desired_size_limit(&p, &empty_dir_with_limit(size_limit)),
            want,
            "{pod_limit:?} {size_limit:?}"
        );
    }
    let dsw = DesiredStateOfWorld::new(fake_plugins());
    dsw.add_pod_to_volume(
        &pod_name("p"),
        Arc::new(pod_with_ephemeral_limit(Some("2Gi"))),
        empty_dir_with_limit(Some("1Gi")),
        "cache",
    )
    .unwrap();
    assert_eq!(dsw.volumes_to_mount()[0].desired_size_limit, Some(GI));
}

#[test]
fn v28_pod_errors_are_a_bounded_sorted_set() {
    let dsw = DesiredStateOfWorld::new(fake_plugins());
    let p = pod_name("p");
    dsw.add_error_to_pod(&p, "b");
    dsw.add_error_to_pod(&p, "a");
    dsw.add_error_to_pod(&p, "b");
    assert_eq!(dsw.pods_with_errors(), std::slice::from_ref(&p));
    assert_eq!(dsw.pop_pod_errors(&p), ["a", "b"]);
    assert!(dsw.pop_pod_errors(&p).is_empty(), "popped");
    for i in 0..30 {
        dsw.add_error_to_pod(&p, format!("e{i:02}"));
    }
    assert_eq!(
        dsw.pop_pod_errors(&p).len(),
        11,
        "insertion stops once more than 10 are held"
    );
}

fn opts(
    pod_uid: &str,
    volume: &UniqueVolumeName,
    spec: VolumeSpec,
    state: VolumeMountState,
) -> MarkVolumeOpts {
    MarkVolumeOpts {
        pod_name: pod_name(pod_uid),
        pod_uid: PodUid::new(pod_uid),
        volume_name: volume.clone(),
        spec,
        outer_volume_spec_name: "outer".into(),
        volume_gid: None,
        state,
    }
}

#[test]
fn test_mark_volume_as_attached_positive_new_volume() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    let name = asw
        .mark_volume_as_attached(None, &persistent("pv-1"), "/dev/fake")
        .unwrap();
    assert_eq!(name.as_str(), "fake-plugin/pv-1");
    let attached = asw.attached_volumes();
    assert_eq!(attached.len(), 1);
    assert_eq!(attached[0].device_path, "/dev/fake");
    assert_eq!(asw.unmounted_volumes().len(), 1);
}

#[test]
fn test_mark_volume_as_attached_supplied_volume_name_positive_new_volume() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    let name = asw
        .mark_volume_as_attached(
            Some(UniqueVolumeName::new("fake/supplied")),
            &persistent("pv-1"),
            "",
        )
        .unwrap();
    assert_eq!(name.as_str(), "fake/supplied");
}

#[test]
fn test_mark_volume_as_attached_positive_existing_volume() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    asw.mark_volume_as_attached(None, &persistent("pv-1"), "/dev/a")
        .unwrap();
    asw.mark_volume_as_attached(None, &persistent("pv-1"), "/dev/b")
        .unwrap();
    let attached = asw.attached_volumes();
    assert_eq!(attached.len(), 1);
    assert_eq!(
        attached[0].device_path, "/dev/b",
        "V31: only the device path changes"
    );
}

#[test]
fn test_add_pod_to_volume_positive_existing_volume_new_node() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    let name = asw
        .mark_volume_as_attached(None, &persistent("pv-1"), "/dev/a")
        .unwrap();
    asw.mark_volume_as_mounted(opts(
        "p",
        &name,
        persistent("pv-1"),
        VolumeMountState::Mounted,
    ))
    .unwrap();
    assert_eq!(
        asw.pod_exists_in_volume(&pod_name("p"), &name),
        PodVolumeState::Mounted {
            device_path: "/dev/a".into()
        }
    );
    assert_eq!(asw.mounted_volumes().len(), 1);
    assert_eq!(
        asw.mounted_volumes_for_pod(&pod_name("p"))[0].volume_name,
        name
    );
}

#[test]
fn test_add_pod_to_volume_positive_existing_volume_existing_node() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    let name = asw
        .mark_volume_as_attached(None, &persistent("pv-1"), "")
        .unwrap();
    asw.mark_volume_as_mounted(opts(
        "p",
        &name,
        persistent("pv-1"),
        VolumeMountState::Mounted,
    ))
    .unwrap();
    asw.mark_volume_as_mounted(opts(
        "p",
        &name,
        persistent("pv-1"),
        VolumeMountState::Mounted,
    ))
    .unwrap();
    assert_eq!(asw.mounted_volumes().len(), 1);
}

#[test]
fn test_add_two_pods_to_volume_positive() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    let name = asw
        .mark_volume_as_attached(None, &persistent("pv-1"), "")
        .unwrap();
    asw.mark_volume_as_mounted(opts(
        "p1",
        &name,
        persistent("pv-1"),
        VolumeMountState::Mounted,
    ))
    .unwrap();
    asw.mark_volume_as_mounted(opts(
        "p2",
        &name,
        persistent("pv-1"),
        VolumeMountState::Mounted,
    ))
    .unwrap();
    assert!(
        asw.pod_exists_in_volume(&pod_name("p1"), &name)
            .is_mounted()
    );
    assert!(
        asw.pod_exists_in_volume(&pod_name("p2"), &name)
            .is_mounted()
    );
    assert!(asw.is_volume_mounted_elsewhere(&name, &pod_name("p1")));
    assert!(asw.is_volume_mounted_elsewhere(&name, &pod_name("p2")));
    asw.mark_volume_as_unmounted(&pod_name("p2"), &name);
    assert!(
        !asw.is_volume_mounted_elsewhere(&name, &pod_name("p1")),
        "p2 is gone"
    );
}

#[test]
fn test_actual_state_of_world_found_during_reconstruction() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    let name = asw
        .mark_volume_as_attached(None, &persistent("pv-1"), "")
        .unwrap();
    // Added by reconstruction: reported as reconstructed, uncertain.
    assert!(
        asw.check_and_mark_volume_as_uncertain_via_reconstruction(opts(
            "p",
            &name,
            persistent("pv-1"),
            VolumeMountState::Uncertain
        ))
        .unwrap()
    );
    assert!(asw.is_volume_reconstructed(&name, &pod_name("p")));
    assert_eq!(
        asw.pod_exists_in_volume(&pod_name("p"), &name),
        PodVolumeState::Uncertain {
            device_path: String::new()
        }
    );
    // Still uncertain after another uncertain mark.
    asw.mark_volume_mount_as_uncertain(opts(
        "p",
        &name,
        persistent("pv-1"),
        VolumeMountState::Uncertain,
    ))
    .unwrap();
    assert!(asw.is_volume_reconstructed(&name, &pod_name("p")));
    // A real mount confirms it.
    asw.mark_volume_as_mounted(opts(
        "p",
        &name,
        persistent("pv-1"),
        VolumeMountState::Mounted,
    ))
    .unwrap();
    assert!(!asw.is_volume_reconstructed(&name, &pod_name("p")));
    // A mounted pod is not turned uncertain by reconstruction.
    assert!(
        !asw.check_and_mark_volume_as_uncertain_via_reconstruction(opts(
            "p",
            &name,
            persistent("pv-1"),
            VolumeMountState::Uncertain
        ))
        .unwrap()
    );
    assert!(asw.pod_exists_in_volume(&pod_name("p"), &name).is_mounted());
}

#[test]
fn test_mark_volume_as_detached_negative_pod_in_volume() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    let name = asw
        .mark_volume_as_attached(None, &persistent("pv-1"), "")
        .unwrap();
    asw.mark_volume_as_mounted(opts(
        "p",
        &name,
        persistent("pv-1"),
        VolumeMountState::Mounted,
    ))
    .unwrap();
    asw.mark_volume_as_detached(&name);
    assert_eq!(
        asw.attached_volumes().len(),
        1,
        "V36: a volume with a pod is not removed"
    );
    assert_eq!(
        asw.delete_volume(&name).unwrap_err().to_string(),
        "failed to DeleteVolume UniqueVolumeName(\"fake-plugin/pv-1\"), it still has 1 mountedPods"
    );
    asw.mark_volume_as_unmounted(&pod_name("p"), &name);
    asw.mark_volume_as_detached(&name);
    assert!(asw.attached_volumes().is_empty());
}

#[test]
fn test_add_pod_to_volume_negative_volume_doesnt_exist() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    let name = UniqueVolumeName::new("fake-plugin/missing");
    let err = asw
        .mark_volume_as_mounted(opts(
            "p",
            &name,
            persistent("missing"),
            VolumeMountState::Mounted,
        ))
        .unwrap_err();
    assert!(
        err.to_string().starts_with("no volume with the name"),
        "{err}"
    );
    assert!(asw.mounted_volumes().is_empty());
    assert_eq!(
        asw.pod_exists_in_volume(&pod_name("p"), &name),
        PodVolumeState::NotAttached
    );
}

#[test]
fn test_mark_device_as_mounted_positive_new_volume() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    let name = asw
        .mark_volume_as_attached(None, &persistent("pv-1"), "/dev/a")
        .unwrap();
    asw.mark_device_as_mounted(&name, "", "/var/lib/kubelet/plugins/fake/mounts/pv-1")
        .unwrap();
    let global = asw.globally_mounted_volumes();
    assert_eq!(global.len(), 1);
    assert_eq!(
        global[0].device_mount_path,
        "/var/lib/kubelet/plugins/fake/mounts/pv-1"
    );
    assert_eq!(
        global[0].device_path, "/dev/a",
        "V38: an empty device path keeps the stored one"
    );
    asw.mark_device_as_uncertain(&name, "", "/p").unwrap();
    assert!(asw.globally_mounted_volumes().is_empty());
    assert!(asw.attached_volumes()[0].device_state.may_be_mounted());
    asw.mark_device_as_unmounted(&name).unwrap();
    let v = &asw.attached_volumes()[0];
    assert_eq!(
        (v.device_state, v.device_mount_path.as_str()),
        (DeviceMountState::NotMounted, "")
    );
}

#[test]
fn test_uncertain_volume_mounts() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    let name = asw
        .mark_volume_as_attached(None, &empty_dir("v"), "")
        .unwrap();
    asw.mark_volume_mount_as_uncertain(opts(
        "p",
        &name,
        empty_dir("v"),
        VolumeMountState::Uncertain,
    ))
    .unwrap();
    assert!(asw.mounted_volumes_for_pod(&pod_name("p")).is_empty());
    assert_eq!(
        asw.possibly_mounted_volumes_for_pod(&pod_name("p")).len(),
        1
    );
    assert!(!asw.pod_removed_from_volume(&pod_name("p"), &name));
    assert!(!asw.pod_exists_in_volume(&pod_name("p"), &name).is_mounted());
}

/// Issue 15: a volume whose plugin wants no remount is not marked and not counted as written
/// (a reprocessed pod of emptyDirs gives the reconciler nothing to look at).
#[test]
fn v37_a_remount_mark_on_a_volume_that_wants_none_writes_nothing() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    let name = asw
        .mark_volume_as_attached(None, &empty_dir("v"), "")
        .unwrap();
    asw.mark_volume_as_mounted(opts("p", &name, empty_dir("v"), VolumeMountState::Mounted))
        .unwrap();
    asw.take_touched();
    asw.mark_remount_required(&pod_name("p"), std::slice::from_ref(&name));
    let touched = asw.take_touched();
    assert!(!touched.all && touched.volumes.is_empty(), "{touched:?}");
    assert!(matches!(
        asw.pod_exists_in_volume(&pod_name("p"), &name),
        PodVolumeState::Mounted { .. }
    ));
}

#[test]
fn v37_remount_required_for_plugins_that_ask_for_it() {
    use crate::plugin::PluginManager;
    use crate::testing::{FakePlugin, Serves};
    let plugins = PluginManager::new(vec![Arc::new(FakePlugin {
        name: "kubernetes.io/configmap-like",
        serves: Serves::EmptyDir,
        attachable: false,
        device_mountable: false,
        requires_remount: true,
        ..FakePlugin::default()
    })]);
    let asw = ActualStateOfWorld::new(plugins);
    let name = asw
        .mark_volume_as_attached(Some(UniqueVolumeName::new("cm/p-v")), &empty_dir("v"), "")
        .unwrap();
    asw.mark_volume_as_mounted(opts("p", &name, empty_dir("v"), VolumeMountState::Mounted))
        .unwrap();
    asw.mark_remount_required(&pod_name("p"), std::slice::from_ref(&name));
    assert_eq!(
        asw.pod_exists_in_volume(&pod_name("p"), &name),
        PodVolumeState::RemountRequired {
            device_path: String::new()
        }
    );
    // A SetUp starts (it serves the requests so far); a change comes while it runs.
    let epoch = asw.remount_epoch(&pod_name("p"), &name);
    asw.mark_remount_required(&pod_name("p"), std::slice::from_ref(&name));
    asw.mark_volume_as_mounted(opts("p", &name, empty_dir("v"), VolumeMountState::Mounted))
        .unwrap();
    assert!(
        asw.mark_remount_served(&pod_name("p"), &name, epoch),
        "the newer request is still pending"
    );
    assert!(
        matches!(
            asw.pod_exists_in_volume(&pod_name("p"), &name),
            PodVolumeState::RemountRequired { .. }
        ),
        "not lost when the older SetUp ends"
    );
    let epoch = asw.remount_epoch(&pod_name("p"), &name);
    asw.mark_volume_as_mounted(opts("p", &name, empty_dir("v"), VolumeMountState::Mounted))
        .unwrap();
    assert!(!asw.mark_remount_served(&pod_name("p"), &name, epoch));
    assert!(
        matches!(
            asw.pod_exists_in_volume(&pod_name("p"), &name),
            PodVolumeState::Mounted { .. }
        ),
        "cleared by the remount that started after every request"
    );
}

#[test]
fn v39_reconstructed_attachability_and_device_path_update_only_while_uncertain() {
    let asw = ActualStateOfWorld::new(fake_plugins());
    let name = asw
        .add_attach_uncertain_reconstructed_volume(
            UniqueVolumeName::new("fake-plugin/pv-1"),
            &persistent("pv-1"),
            "",
        )
        .unwrap();
    asw.update_reconstructed_volume_attachability(&name, true);
    asw.update_reconstructed_volume_attachability(&name, false);
    assert_eq!(
        asw.attached_volumes()[0].attachability,
        super::Attachability::Attachable
    );
    asw.mark_device_as_uncertain(&name, "", "/g").unwrap();
    asw.update_reconstructed_device_path(&name, "fake/path");
    assert_eq!(asw.attached_volumes()[0].device_path, "fake/path");
    asw.mark_device_as_mounted(&name, "", "/g").unwrap();
    asw.update_reconstructed_device_path(&name, "other");
    assert_eq!(asw.attached_volumes()[0].device_path, "fake/path");
}
