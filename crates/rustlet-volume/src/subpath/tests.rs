//! subPath safety with real mounts (privileged, each test in its own temp dir): creation of a
//! missing subpath, the CVE-2017-1002101 symlink escapes refused, `subPathExpr`, and the
//! clean-up before TearDown.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, EnvVar, VolumeMount};
use rustlet_mount::LinuxMounter;
use rustlet_mount::testing::privileged_dir;

use super::*;

fn container(mounts: Vec<VolumeMount>) -> Container {
    Container {
        name: "app".into(),
        env: Some(vec![EnvVar {
            name: "POD".into(),
            value: Some("web-1".into()),
            ..Default::default()
        }]),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, sub_path: Option<&str>, expr: Option<&str>) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        sub_path: sub_path.map(str::to_owned),
        sub_path_expr: expr.map(str::to_owned),
        ..Default::default()
    }
}

#[test]
fn subpath_expr_expands_the_containers_env() {
    let c = container(vec![]);
    assert_eq!(expand_subpath_expr("$(POD)/logs", &c), "web-1/logs");
    assert_eq!(expand_subpath_expr("$$(POD)", &c), "$(POD)");
    assert_eq!(expand_subpath_expr("$(MISSING)/x", &c), "$(MISSING)/x");
}

#[test]
fn subpaths_are_created_bound_and_cleaned_up() {
    let Some(dir) = privileged_dir("subpaths_are_created_bound_and_cleaned_up") else {
        return;
    };
    let linux = LinuxMounter::new();
    let volume = dir.mkdir("pod/volumes/kubernetes.io~empty-dir/data");
    let pod_dir = dir.path().join("pod");
    let c = container(vec![
        mount("data", "/data", None, None),
        mount("data", "/logs", Some("logs/app"), None),
        mount("data", "/per-pod", None, Some("$(POD)")),
    ]);
    let volumes = |name: &str| (name == "data").then(|| (volume.clone(), false));
    let mounts = make_mounts(&c, &volumes, &pod_dir, &linux, false).unwrap();
    assert_eq!(mounts[0].host_path, volume, "no subPath: the volume itself");
    let logs = subpath_target(&pod_dir, "data", "app", 1);
    assert_eq!(mounts[1].host_path, logs);
    assert!(volume.join("logs/app").is_dir(), "created in the volume");
    std::fs::write(logs.join("line"), "written through the bind").unwrap();
    assert_eq!(
        std::fs::read_to_string(volume.join("logs/app/line")).unwrap(),
        "written through the bind"
    );
    assert_eq!(
        mounts[2].host_path,
        subpath_target(&pod_dir, "data", "app", 2)
    );
    assert!(volume.join("web-1").is_dir());
    assert!(linux.is_mount_point(&logs).unwrap());

    // Preparing again (a container restart) replaces, never stacks.
    make_mounts(&c, &volumes, &pod_dir, &linux, false).unwrap();
    let stacked = linux
        .list()
        .unwrap()
        .iter()
        .filter(|m| m.mount_point == logs)
        .count();
    assert_eq!(stacked, 1);

    clean_subpaths(&pod_dir, "data", &linux).unwrap();
    assert!(!pod_dir.join("volume-subpaths").exists());
    assert_eq!(
        std::fs::read_to_string(volume.join("logs/app/line")).unwrap(),
        "written through the bind",
        "the volume's data stays"
    );
}

#[test]
fn symlinks_planted_by_a_container_never_lead_a_subpath_outside() {
    let Some(dir) = privileged_dir("symlinks_planted_by_a_container") else {
        return;
    };
    let linux = LinuxMounter::new();
    let outside = dir.mkdir("host-secret");
    std::fs::write(outside.join("shadow"), "root").unwrap();
    let volume = dir.mkdir("pod/volumes/kubernetes.io~empty-dir/data");
    let pod_dir = dir.path().join("pod");
    // CVE-2017-1002101: the container makes `escape -> <host dir>` and `mid -> <host dir>`.
    std::os::unix::fs::symlink(&outside, volume.join("escape")).unwrap();
    std::os::unix::fs::symlink(&outside, volume.join("mid")).unwrap();
    std::os::unix::fs::symlink("/", volume.join("root")).unwrap();
    let volumes = |name: &str| (name == "data").then(|| (volume.clone(), false));
    let cases: Vec<(&str, Option<&str>, Option<&str>)> = vec![
        ("escape", Some("escape"), None),
        ("through a middle link", Some("mid/shadow"), None),
        ("to /", Some("root/etc"), None),
        ("dotdot", Some("../../host-secret"), None),
        ("absolute", Some("/etc"), None),
        ("expr dotdot", None, Some("../$(POD)")),
    ];
    for (what, sub_path, expr) in cases {
        let c = container(vec![mount("data", "/x", sub_path, expr)]);
        let err = make_mounts(&c, &volumes, &pod_dir, &linux, false).unwrap_err();
        assert!(
            matches!(err, ContainerMountError::SubPath { .. }),
            "{what}: {err}"
        );
        assert!(
            !err.to_string().contains(outside.to_str().unwrap()),
            "{what}: no host path in the message: {err}"
        );
    }
    let mounted: Vec<PathBuf> = linux
        .list()
        .unwrap()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|m| m.starts_with(dir.path()))
        .collect();
    assert!(mounted.is_empty(), "{mounted:?}");
    assert_eq!(
        std::fs::read_to_string(outside.join("shadow")).unwrap(),
        "root"
    );
    // A missing subpath under a planted link is not created outside either.
    let c = container(vec![mount("data", "/x", Some("mid/new/dir"), None)]);
    assert!(make_mounts(&c, &volumes, &pod_dir, &linux, false).is_err());
    assert!(!outside.join("new").exists());
}

fn rro_mount(read_only: bool, rro: Option<&str>, propagation: Option<&str>) -> VolumeMount {
    VolumeMount {
        name: "mnt".into(),
        mount_path: "/mnt".into(),
        read_only: Some(read_only),
        recursive_read_only: rro.map(str::to_owned),
        mount_propagation: propagation.map(str::to_owned),
        ..Default::default()
    }
}

/// Issue 27 (node features), upstream `TestResolveRecursiveReadOnly`: each mode on a runtime
/// with and without the feature, and the invalid combinations, with upstream's messages.
#[test]
fn resolve_recursive_read_only_as_upstream() {
    let cases: [(VolumeMount, bool, Result<bool, &str>); 12] = [
        (rro_mount(false, None, None), false, Ok(false)),
        (rro_mount(true, None, None), true, Ok(false)),
        (rro_mount(true, Some("Disabled"), None), true, Ok(false)),
        (rro_mount(false, Some("Disabled"), None), true, Ok(false)),
        (rro_mount(true, Some("IfPossible"), None), false, Ok(false)),
        (rro_mount(true, Some("IfPossible"), None), true, Ok(true)),
        (
            rro_mount(true, Some("IfPossible"), Some("None")),
            true,
            Ok(true),
        ),
        (rro_mount(true, Some("Enabled"), None), true, Ok(true)),
        (
            rro_mount(true, Some("Enabled"), None),
            false,
            Err(
                "volume \"mnt\" requested recursive read-only mode, but it is not supported by the runtime",
            ),
        ),
        (
            rro_mount(false, Some("Enabled"), None),
            true,
            Err("volume \"mnt\" requested recursive read-only mode, but it is not read-only"),
        ),
        (
            rro_mount(true, Some("Enabled"), Some("HostToContainer")),
            true,
            Err(
                "volume \"mnt\" requested recursive read-only mode, but it is not compatible with propagation \"HostToContainer\"",
            ),
        ),
        (
            rro_mount(true, Some("Sometimes"), None),
            true,
            Err("unknown recursive read-only mode \"Sometimes\""),
        ),
    ];
    for (mount, supported, want) in cases {
        let got = resolve_recursive_read_only(&mount, supported).map_err(|e| e.to_string());
        assert_eq!(
            got,
            want.map_err(str::to_owned),
            "{mount:?} supported={supported}"
        );
    }
}

fn propagating(privileged: bool, mode: &str) -> Container {
    Container {
        name: "mount".into(),
        security_context: Some(k8s_openapi::api::core::v1::SecurityContext {
            privileged: Some(privileged),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "mnt".into(),
            mount_path: "/mnt".into(),
            mount_propagation: Some(mode.into()),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// Issue 27 (node features), upstream `makeMounts` with `translateMountPropagation` and
/// `resolveRecursiveReadOnly` ("Mount recursive read-only ... should accept non-recursive
/// read-only mounts" and "... should reject recursive read-only mounts"): each mount carries
/// its propagation; `Bidirectional` from an unprivileged container, an unknown mode and an
/// unsupported recursive read-only mount are refused with upstream's messages.
#[test]
fn make_mounts_resolves_propagation_and_recursive_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let linux = LinuxMounter::new();
    let volume = dir.path().join("mnt");
    let volumes = |name: &str| (name == "mnt").then(|| (volume.clone(), false));
    let make = |c: &Container, rro: bool| make_mounts(c, &volumes, dir.path(), &linux, rro);

    let mounts = make(&propagating(true, "Bidirectional"), false).unwrap();
    assert_eq!(mounts[0].propagation, MountPropagation::Bidirectional);
    let mounts = make(&propagating(false, "HostToContainer"), false).unwrap();
    assert_eq!(mounts[0].propagation, MountPropagation::HostToContainer);
    let mounts = make(&propagating(false, "None"), false).unwrap();
    assert_eq!(mounts[0].propagation, MountPropagation::Private);
    assert_eq!(
        make(&propagating(false, "Bidirectional"), false)
            .unwrap_err()
            .to_string(),
        "volume \"mnt\" of container \"mount\": Bidirectional mount propagation is available only to privileged containers"
    );
    assert_eq!(
        make(&propagating(true, "Sideways"), false)
            .unwrap_err()
            .to_string(),
        "invalid MountPropagation mode: \"Sideways\""
    );

    let c = container(vec![rro_mount(true, Some("Enabled"), None)]);
    assert_eq!(
        make(&c, false).unwrap_err().to_string(),
        "failed to resolve recursive read-only mode: volume \"mnt\" requested recursive read-only mode, but it is not supported by the runtime"
    );
    let mounts = make(&c, true).unwrap();
    assert!(mounts[0].recursive_read_only && mounts[0].read_only);
    let c = container(vec![rro_mount(true, Some("IfPossible"), None)]);
    assert!(!make(&c, false).unwrap()[0].recursive_read_only);
}
