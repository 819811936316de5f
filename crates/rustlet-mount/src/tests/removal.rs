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
