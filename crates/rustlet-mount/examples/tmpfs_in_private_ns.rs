//! rustlet-mount as a library: mount a tmpfs, find it in the mount table, and see a removal
//! stop at the mount point instead of emptying it.
//!
//! Mounting needs root (CAP_SYS_ADMIN). Run with
//! `sudo target/debug/examples/tmpfs_in_private_ns` after
//! `cargo build -p rustlet-mount --example tmpfs_in_private_ns`. The example first moves itself
//! into a mount namespace of its own with `/` private, so nothing it mounts ever reaches the
//! host's mount table; the namespace, and the tmpfs with it, go when the process exits. Not
//! root: it says so and exits with success, changing nothing.

use std::path::Path;

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use rustlet_mount::{Error, LinuxMounter, TmpfsOptions, UnmountMode, remove_all_one_filesystem};

fn main() {
    if !nix::unistd::geteuid().is_root() {
        println!(
            "skipped: this example mounts a tmpfs and needs root (CAP_SYS_ADMIN); it would \
             run in a private mount namespace of its own. Nothing was changed."
        );
        return;
    }
    // A mount namespace of our own (this process is single-threaded, so `unshare` moves all
    // of it), with `/` made private so that no mount propagates back to the host.
    unshare(CloneFlags::CLONE_NEWNS).expect("unshare(CLONE_NEWNS)");
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .expect("make / private in the new namespace");

    let dir = tempfile::tempdir().expect("a temp dir");
    // The mount table names canonical paths.
    let root = dir.path().canonicalize().expect("canonical temp dir");
    run(&root);
}

fn run(root: &Path) {
    let mounter = LinuxMounter::new();
    let data = root.join("data");
    let volume = data.join("volume");
    std::fs::create_dir_all(&volume).expect("create the mount point");
    std::fs::write(data.join("scratch.txt"), "on the root filesystem").expect("write scratch");

    // 1. Mount a 1 MiB tmpfs and write into it.
    mounter
        .tmpfs(
            &volume,
            TmpfsOptions {
                size_bytes: Some(1 << 20),
                mode: Some(0o755),
            },
        )
        .expect("mount the tmpfs");
    std::fs::write(volume.join("keep.txt"), "on the tmpfs").expect("write into the tmpfs");

    // 2. Find it in the mount table.
    let table = mounter.list().expect("read /proc/self/mountinfo");
    let entry = table
        .iter()
        .find(|m| m.mount_point == volume)
        .expect("the tmpfs is in the mount table");
    println!(
        "mounted: {} on {} type {} ({})",
        entry.source,
        entry.mount_point.display(),
        entry.fstype,
        entry.mount_options.join(",")
    );
    assert!(
        mounter
            .is_tmpfs_mount_point(&volume)
            .expect("check the mount point")
    );

    // 3. Remove the tree: the walk stops at the mount point and touches nothing beneath it.
    match remove_all_one_filesystem(&data) {
        Err(Error::CrossesMountPoint { path }) => {
            println!("removal stopped at the mount point {}", path.display());
        }
        other => panic!("expected the removal to stop at the mount point, got {other:?}"),
    }
    assert_eq!(
        std::fs::read_to_string(volume.join("keep.txt")).expect("keep.txt is still there"),
        "on the tmpfs"
    );

    // 4. Unmount, and now the whole tree goes.
    mounter
        .unmount(&volume, UnmountMode::Normal)
        .expect("unmount the tmpfs");
    remove_all_one_filesystem(&data).expect("remove the tree once nothing is mounted");
    assert!(!data.exists());
    println!("unmounted and removed {}", data.display());
}
