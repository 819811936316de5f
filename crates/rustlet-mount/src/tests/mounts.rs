//! Real mounts, one temp dir per test, in the private mount namespace of `cargo xtask test`.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::statfs::{TMPFS_MAGIC, statfs};
use nix::sys::statvfs::{FsFlags, statvfs};

use crate::mounter::{BindAccess, MountPointCheck, MountRequest, TmpfsOptions, UnmountMode};
use crate::options::SensitiveOptions;
use crate::testing::privileged_dir;

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn tmpfs_with_size_and_mode_and_its_unmount() {
    let Some(t) = privileged_dir("tmpfs_with_size_and_mode_and_its_unmount") else {
        return;
    };
    let target = t.mkdir("tmpfs");
    t.mounter
        .tmpfs(
            &target,
            TmpfsOptions {
                size_bytes: Some(1 << 20),
                mode: Some(0o750),
            },
        )
        .unwrap();
    let fs = statfs(&target).unwrap();
    assert_eq!(fs.filesystem_type(), TMPFS_MAGIC);
    assert_eq!(fs.blocks() * fs.block_size() as u64, 1 << 20);
    assert_eq!(
        std::fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o750
    );
    let flags = statvfs(&target).unwrap().flags();
    assert!(flags.contains(FsFlags::ST_NOSUID) && flags.contains(FsFlags::ST_NODEV));
    assert!(t.mounter.is_mount_point(&target).unwrap());
    assert!(!t.mounter.is_likely_not_mount_point(&target).unwrap());

    t.mounter.unmount(&target, UnmountMode::Normal).unwrap();
    assert!(!t.mounter.is_mount_point(&target).unwrap());
    assert!(t.mounter.is_likely_not_mount_point(&target).unwrap());
    let err = t.mounter.unmount(&target, UnmountMode::Normal).unwrap_err();
    assert_eq!(err.errno(), Some(Errno::EINVAL), "{err}");
}

#[test]
fn bind_mount_shows_the_source_and_is_found_exactly() {
    let Some(t) = privileged_dir("bind_mount_shows_the_source_and_is_found_exactly") else {
        return;
    };
    let source = t.mkdir("src");
    let target = t.mkdir("dst");
    write(&source.join("f"), "data");
    t.mounter
        .bind(&source, &target, BindAccess::ReadWrite)
        .unwrap();
    assert_eq!(std::fs::read_to_string(target.join("f")).unwrap(), "data");
    write(&target.join("g"), "through the bind");
    assert_eq!(
        std::fs::read_to_string(source.join("g")).unwrap(),
        "through the bind"
    );
    // Same filesystem: the device check cannot see it, the mount table can.
    assert!(t.mounter.is_likely_not_mount_point(&target).unwrap());
    assert!(t.mounter.is_mount_point(&target).unwrap());
    t.mounter.unmount(&target, UnmountMode::Normal).unwrap();
    assert!(!target.join("f").exists());
}

#[test]
fn read_only_bind_is_really_read_only_and_keeps_locked_flags() {
    let Some(t) = privileged_dir("read_only_bind_is_really_read_only_and_keeps_locked_flags")
    else {
        return;
    };
    let source = t.mkdir("src");
    t.mounter.tmpfs(&source, TmpfsOptions::default()).unwrap(); // nosuid,nodev source
    write(&source.join("f"), "data");
    let target = t.mkdir("ro");
    t.mounter
        .bind(&source, &target, BindAccess::ReadOnly)
        .unwrap();
    let err = std::fs::write(target.join("f"), "changed").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    assert_eq!(std::fs::read_to_string(target.join("f")).unwrap(), "data");
    let flags = statvfs(&target).unwrap().flags();
    assert!(flags.contains(FsFlags::ST_RDONLY));
    assert!(
        flags.contains(FsFlags::ST_NOSUID) && flags.contains(FsFlags::ST_NODEV),
        "locked flags kept: {flags:?}"
    );
    write(&source.join("f"), "source still writable");
}

#[test]
fn mount_request_with_bind_and_ro_options() {
    let Some(t) = privileged_dir("mount_request_with_bind_and_ro_options") else {
        return;
    };
    let source = t.mkdir("src");
    let target = t.mkdir("dst");
    let request = MountRequest {
        source: source.to_string_lossy().into_owned(),
        target: target.clone(),
        fstype: String::new(),
        options: vec!["bind".into(), "ro".into()],
        sensitive_options: SensitiveOptions::default(),
    };
    t.mounter.mount(&request).unwrap();
    assert_eq!(
        std::fs::write(target.join("x"), "y")
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EROFS)
    );
}

#[test]
fn sensitive_options_reach_the_kernel_but_not_debug() {
    let Some(t) = privileged_dir("sensitive_options_reach_the_kernel_but_not_debug") else {
        return;
    };
    let target = t.mkdir("secret");
    let request = MountRequest {
        source: "tmpfs".into(),
        target: target.clone(),
        fstype: "tmpfs".into(),
        options: vec!["nosuid".into(), "size=2m".into()],
        sensitive_options: SensitiveOptions::new(vec!["mode=0700".into()]),
    };
    assert!(!format!("{request:?}").contains("0700"));
    t.mounter.mount(&request).unwrap();
    assert_eq!(
        std::fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let fs = statfs(&target).unwrap();
    assert_eq!(fs.blocks() * fs.block_size() as u64, 2 << 20);
}

#[test]
fn mount_points_with_spaces_and_newlines() {
    let Some(t) = privileged_dir("mount_points_with_spaces_and_newlines") else {
        return;
    };
    let target = t.mkdir("with space\nand newline\\and backslash");
    t.mounter.tmpfs(&target, TmpfsOptions::default()).unwrap();
    let table = t.mounter.list().unwrap();
    assert!(
        table
            .iter()
            .any(|m| m.mount_point == target && m.fstype == "tmpfs")
    );
    assert!(t.mounter.is_mount_point(&target).unwrap());
    t.mounter.unmount(&target, UnmountMode::Normal).unwrap();
    assert!(
        !t.mounter
            .list()
            .unwrap()
            .iter()
            .any(|m| m.mount_point == target)
    );
}

#[test]
fn lazy_unmount_with_a_busy_file() {
    let Some(t) = privileged_dir("lazy_unmount_with_a_busy_file") else {
        return;
    };
    let target = t.mkdir("busy");
    t.mounter.tmpfs(&target, TmpfsOptions::default()).unwrap();
    let mut file = std::fs::File::create(target.join("open")).unwrap();
    file.write_all(b"still here").unwrap();
    let mut reader = std::fs::File::open(target.join("open")).unwrap();

    let err = t.mounter.unmount(&target, UnmountMode::Normal).unwrap_err();
    assert_eq!(err.errno(), Some(Errno::EBUSY));
    assert!(err.is_retryable());

    t.mounter.unmount(&target, UnmountMode::Lazy).unwrap();
    assert!(!t.mounter.is_mount_point(&target).unwrap());
    let mut text = String::new();
    reader.read_to_string(&mut text).unwrap();
    assert_eq!(text, "still here");
}

#[test]
fn mount_refs_lists_the_other_mounts_of_the_same_directory() {
    let Some(t) = privileged_dir("mount_refs_lists_the_other_mounts_of_the_same_directory") else {
        return;
    };
    let global = t.mkdir("global");
    t.mounter.tmpfs(&global, TmpfsOptions::default()).unwrap();
    let pod_a = t.mkdir("pod-a");
    let pod_b = t.mkdir("pod-b");
    t.mounter
        .bind(&global, &pod_a, BindAccess::ReadWrite)
        .unwrap();
    t.mounter
        .bind(&global, &pod_b, BindAccess::ReadWrite)
        .unwrap();
    let mut refs = t.mounter.mount_refs(&pod_a).unwrap();
    refs.sort();
    assert_eq!(refs, [global.clone(), pod_b.clone()]);
    assert!(
        t.mounter
            .mount_refs(&t.path().join("missing"))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn cleanup_mount_point_unmounts_then_removes() {
    let Some(t) = privileged_dir("cleanup_mount_point_unmounts_then_removes") else {
        return;
    };
    let tmpfs = t.mkdir("tmpfs");
    t.mounter.tmpfs(&tmpfs, TmpfsOptions::default()).unwrap();
    write(&tmpfs.join("f"), "x");
    t.mounter
        .cleanup_mount_point(&tmpfs, MountPointCheck::Likely)
        .unwrap();
    assert!(!tmpfs.exists());

    // A same-filesystem bind needs the exact check.
    let source = t.mkdir("src");
    write(&source.join("keep"), "precious");
    let bind = t.mkdir("bind");
    t.mounter
        .bind(&source, &bind, BindAccess::ReadWrite)
        .unwrap();
    t.mounter
        .cleanup_mount_point(&bind, MountPointCheck::Exact)
        .unwrap();
    assert!(!bind.exists());
    assert_eq!(
        std::fs::read_to_string(source.join("keep")).unwrap(),
        "precious"
    );

    t.mounter
        .cleanup_mount_point(&t.path().join("missing"), MountPointCheck::Exact)
        .unwrap();
    let plain = t.mkdir("plain");
    t.mounter
        .cleanup_mount_point(&plain, MountPointCheck::Exact)
        .unwrap();
    assert!(!plain.exists());
}

#[test]
fn cleanup_mount_point_never_removes_a_non_empty_directory() {
    let Some(t) = privileged_dir("cleanup_mount_point_never_removes_a_non_empty_directory") else {
        return;
    };
    let dir = t.mkdir("full");
    write(&dir.join("data"), "keep");
    let err = t
        .mounter
        .cleanup_mount_point(&dir, MountPointCheck::Exact)
        .unwrap_err();
    assert_eq!(err.errno(), Some(Errno::ENOTEMPTY), "{err}");
    assert!(dir.join("data").exists());
}

#[test]
fn bind_of_a_pinned_fd_survives_a_symlink_swap() {
    use crate::safe_path::{OpenKind, open_beneath};
    let Some(t) = privileged_dir("bind_of_a_pinned_fd_survives_a_symlink_swap") else {
        return;
    };
    let volume = t.mkdir("volume");
    let outside = t.mkdir("outside");
    write(&outside.join("host-secret"), "host");
    std::fs::create_dir(volume.join("sub")).unwrap();
    write(&volume.join("sub/mine"), "pod data");

    let fd = open_beneath(&volume, Path::new("sub"), OpenKind::Path).unwrap();
    // The attacker swaps the checked directory for a symlink to the host.
    std::fs::rename(volume.join("sub"), volume.join("sub-moved")).unwrap();
    std::os::unix::fs::symlink(&outside, volume.join("sub")).unwrap();

    let target = t.mkdir("container-view");
    t.mounter
        .bind_fd(&fd, &target, BindAccess::ReadWrite)
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(target.join("mine")).unwrap(),
        "pod data"
    );
    assert!(!target.join("host-secret").exists());
}

#[test]
fn prepare_subpath_binds_the_checked_directory_and_file() {
    use crate::safe_path::{Subpath, prepare_subpath};
    let Some(t) = privileged_dir("prepare_subpath_binds_the_checked_directory_and_file") else {
        return;
    };
    let volume = t.mkdir("volume");
    std::fs::create_dir_all(volume.join("a/b")).unwrap();
    write(&volume.join("a/b/f"), "in volume");
    let target = t.path().join("volume-subpaths/v/c/0");
    prepare_subpath(
        &t.mounter,
        &Subpath {
            volume_path: volume.clone(),
            path: "a/b".into(),
            target: target.clone(),
        },
    )
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(target.join("f")).unwrap(),
        "in volume"
    );
    assert!(t.mounter.is_mount_point(&target).unwrap());
    // Again after a container restart: the stale mount is replaced, not stacked.
    prepare_subpath(
        &t.mounter,
        &Subpath {
            volume_path: volume.clone(),
            path: "a/b".into(),
            target: target.clone(),
        },
    )
    .unwrap();
    assert_eq!(
        t.mounter
            .list()
            .unwrap()
            .iter()
            .filter(|m| m.mount_point == target)
            .count(),
        1
    );

    let file_target = t.path().join("volume-subpaths/v/c/1");
    prepare_subpath(
        &t.mounter,
        &Subpath {
            volume_path: volume.clone(),
            path: "a/b/f".into(),
            target: file_target.clone(),
        },
    )
    .unwrap();
    assert_eq!(std::fs::read_to_string(&file_target).unwrap(), "in volume");
}

/// A FUSE mount whose daemon is gone (its `/dev/fuse` fd closed right after mounting) answers
/// every stat with ENOTCONN: the classic corrupted mount.
#[test]
fn corrupted_mount_is_detected_and_cleaned_up() {
    use std::os::fd::AsRawFd;
    let Some(t) = privileged_dir("corrupted_mount_is_detected_and_cleaned_up") else {
        return;
    };
    let Ok(fuse) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    else {
        eprintln!(
            "corrupted_mount_is_detected_and_cleaned_up: skipped: no /dev/fuse on this machine"
        );
        return;
    };
    let target = t.mkdir("dead-fuse");
    let request = MountRequest {
        source: "fuse".into(),
        target: target.clone(),
        fstype: "fuse".into(),
        options: vec![
            format!("fd={}", fuse.as_raw_fd()),
            "rootmode=40000".into(),
            "user_id=0".into(),
            "group_id=0".into(),
        ],
        sensitive_options: SensitiveOptions::default(),
    };
    t.mounter.mount(&request).unwrap();
    drop(fuse); // the "daemon" dies

    assert!(t.mounter.is_corrupted_mount(&target));
    assert!(
        t.mounter.path_exists(&target).unwrap(),
        "V120: a corrupted mount counts as existing"
    );
    let stat_err = std::fs::metadata(&target).unwrap_err();
    assert_eq!(stat_err.raw_os_error(), Some(libc::ENOTCONN));

    t.mounter
        .cleanup_mount_point(&target, MountPointCheck::Exact)
        .unwrap();
    assert!(!target.exists());
    assert!(
        !t.mounter
            .list()
            .unwrap()
            .iter()
            .any(|m| m.mount_point == target)
    );
}

#[test]
fn errors_name_the_operation_path_and_errno() {
    let Some(t) = privileged_dir("errors_name_the_operation_path_and_errno") else {
        return;
    };
    let missing = t.path().join("missing");
    let err = t
        .mounter
        .tmpfs(&missing, TmpfsOptions::default())
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("mount of \"tmpfs\" on ") && text.contains("missing"),
        "{text}"
    );
    assert_eq!(err.errno(), Some(Errno::ENOENT));
    assert!(err.is_not_found() && !err.is_retryable());
}

/// Issue 27 (node features), upstream `MakeRShared` (kubelet `setupDataDirs`): a directory on
/// a private mount becomes a shared bind of itself, so that a mount made below it appears in a
/// peer (as a container's `Bidirectional` mount of a volume does); a second call changes
/// nothing.
#[test]
fn make_rshared_makes_a_private_directory_a_shared_mount() {
    let Some(t) = privileged_dir("make_rshared_makes_a_private_directory_a_shared_mount") else {
        return;
    };
    let root = t.mkdir("root");
    let volume = t.mkdir("root/volume");
    assert!(
        !t.mounter.is_shared(&root).unwrap(),
        "private to begin with"
    );
    t.mounter.make_rshared(&root).unwrap();
    assert!(t.mounter.is_shared(&root).unwrap());
    assert!(t.mounter.is_shared(&volume).unwrap(), "below it too");
    let mounts = t.mounter.list().unwrap().len();
    t.mounter.make_rshared(&root).unwrap();
    assert_eq!(t.mounter.list().unwrap().len(), mounts, "already shared");

    // A peer of the volume (a container's rshared bind) sees what is mounted below it.
    let peer = t.mkdir("peer");
    t.mounter
        .bind(&volume, &peer, BindAccess::ReadWrite)
        .unwrap();
    let tmpfs = volume.join("tmpfs");
    std::fs::create_dir(&tmpfs).unwrap();
    t.mounter.tmpfs(&tmpfs, TmpfsOptions::default()).unwrap();
    assert!(t.mounter.is_tmpfs_mount_point(&peer.join("tmpfs")).unwrap());
}
