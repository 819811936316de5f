//! Removal never crosses a mount point, and never follows a symlink.

use std::path::Path;

use crate::error::Error;
use crate::mounter::{BindAccess, TmpfsOptions};
use crate::remove::remove_all_one_filesystem_with;
use crate::safe_path::Resolver;
use crate::testing::privileged_dir;

fn tree(root: &Path) {
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::write(root.join("a/file"), "x").unwrap();
    std::fs::write(root.join("a/b/c/deep"), "y").unwrap();
}

#[test]
fn removes_a_plain_tree_and_unlinks_symlinks_without_following_them() {
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let outside = base.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "precious").unwrap();
        let victim = base.join("victim");
        tree(&victim);
        std::os::unix::fs::symlink(&outside, victim.join("a/link-to-outside")).unwrap();
        remove_all_one_filesystem_with(&victim, resolver).unwrap();
        assert!(!victim.exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "precious",
            "{resolver:?}"
        );
        remove_all_one_filesystem_with(&victim, resolver).unwrap(); // missing: success
    }
}

#[test]
fn removal_stops_at_a_tmpfs_and_at_a_same_filesystem_bind() {
    let Some(t) = privileged_dir("removal_stops_at_a_tmpfs_and_at_a_same_filesystem_bind") else {
        return;
    };
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        let name = format!("{resolver:?}");
        let victim = t.mkdir(&format!("victim-{name}"));
        tree(&victim);

        let mounted = victim.join("a/b/volume");
        std::fs::create_dir(&mounted).unwrap();
        t.mounter.tmpfs(&mounted, TmpfsOptions::default()).unwrap();
        std::fs::write(mounted.join("user-data"), "do not delete").unwrap();
        let err = remove_all_one_filesystem_with(&victim, resolver).unwrap_err();
        assert!(
            matches!(&err, Error::CrossesMountPoint { path } if *path == mounted),
            "{name}: {err}"
        );
        assert_eq!(
            std::fs::read_to_string(mounted.join("user-data")).unwrap(),
            "do not delete"
        );
        t.mounter
            .unmount(&mounted, crate::mounter::UnmountMode::Normal)
            .unwrap();

        let pv = t.mkdir(&format!("pv-{name}"));
        std::fs::write(pv.join("claim-data"), "persistent").unwrap();
        let bind = victim.join("a/bind");
        std::fs::create_dir_all(&bind).unwrap();
        t.mounter.bind(&pv, &bind, BindAccess::ReadWrite).unwrap();
        let err = remove_all_one_filesystem_with(&victim, resolver).unwrap_err();
        assert!(
            matches!(&err, Error::CrossesMountPoint { path } if *path == bind),
            "{name}: {err}"
        );
        assert_eq!(
            std::fs::read_to_string(pv.join("claim-data")).unwrap(),
            "persistent"
        );

        // The root itself being a mount point is refused too.
        let err = remove_all_one_filesystem_with(&bind, resolver).unwrap_err();
        assert!(
            matches!(err, Error::CrossesMountPoint { .. }),
            "{name}: {err}"
        );
        assert!(pv.join("claim-data").exists());

        t.mounter
            .unmount(&bind, crate::mounter::UnmountMode::Normal)
            .unwrap();
        remove_all_one_filesystem_with(&victim, resolver).unwrap();
        assert!(!victim.exists());
        assert!(pv.join("claim-data").exists());
    }
}

/// Builds `levels` nested directories `d/d/d/...` under `base` (with a file every 1000 levels)
/// through fds, since the path soon exceeds PATH_MAX; returns the path of level `mark` (if
/// asked), short enough to mount on.
fn deep_tree(base: &Path, levels: usize, mark: Option<usize>) -> Option<std::path::PathBuf> {
    use nix::fcntl::{OFlag, open, openat};
    use nix::sys::stat::{Mode, mkdirat};
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut fd = open(base, flags, Mode::empty()).unwrap();
    let mut marked = None;
    let mut path = base.to_owned();
    for level in 0..levels {
        mkdirat(&fd, "d", Mode::from_bits_truncate(0o755)).unwrap();
        if level % 1000 == 0 {
            let file = openat(
                &fd,
                "f",
                OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            )
            .unwrap();
            drop(file);
        }
        if Some(level) == mark {
            mkdirat(&fd, "m", Mode::from_bits_truncate(0o755)).unwrap();
            marked = Some(path.join("m"));
        }
        if path.as_os_str().len() < 3000 {
            path.push("d");
        }
        fd = openat(&fd, "d", flags, Mode::empty()).unwrap();
    }
    marked
}

/// The old removal recursed once per level with an fd open per level: past a few thousand
/// levels it overflowed the thread's stack (an abort) or ran out of fds. The fd limit is
/// raised here so that only the stack could stop it.
#[test]
fn issue10_a_tree_deeper_than_20000_levels_is_removed_with_bounded_stack_and_fds() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < 30_000 && hard >= 30_000 {
        setrlimit(Resource::RLIMIT_NOFILE, 30_000, hard).unwrap();
    }
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let victim = base.join("victim");
        std::fs::create_dir(&victim).unwrap();
        deep_tree(&victim, 25_000, None);
        // A small stack, as a blocking-pool thread has: the walk must not need one per level.
        let handle = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || remove_all_one_filesystem_with(&victim, resolver).map(|()| victim))
            .unwrap();
        let victim = handle.join().expect("no stack overflow").unwrap();
        assert!(!victim.exists(), "{resolver:?}");
    }
}

#[test]
fn issue10_a_mount_point_deep_inside_a_deep_tree_stops_the_removal_and_keeps_its_data() {
    let Some(t) = privileged_dir("a_mount_point_deep_inside_a_deep_tree") else {
        return;
    };
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        let victim = t.mkdir(&format!("victim-{resolver:?}"));
        let mounted = deep_tree(&victim, 21_000, Some(1_200)).unwrap();
        t.mounter.tmpfs(&mounted, TmpfsOptions::default()).unwrap();
        std::fs::write(mounted.join("user-data"), "do not delete").unwrap();
        let err = remove_all_one_filesystem_with(&victim, resolver).unwrap_err();
        assert!(
            matches!(&err, Error::CrossesMountPoint { path } if *path == mounted),
            "{resolver:?}: {err}"
        );
        assert_eq!(
            std::fs::read_to_string(mounted.join("user-data")).unwrap(),
            "do not delete"
        );
        t.mounter
            .unmount(&mounted, crate::mounter::UnmountMode::Normal)
            .unwrap();
        remove_all_one_filesystem_with(&victim, resolver).unwrap();
        assert!(!victim.exists());
    }
}
