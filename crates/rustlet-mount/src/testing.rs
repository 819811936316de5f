//! The privileged-test helper: a temp dir in which a test may mount, or a clear skip.
//!
//! Mounts are per mount namespace, and `unshare` inside a multi-threaded test binary only moves
//! one thread, so the whole test run is wrapped instead: `cargo xtask test` runs `cargo test`
//! under `unshare -m --propagation private` and sets `RUSTLET_PRIVATE_MOUNT_NS=1`. This helper
//! checks all of that before it lets a test mount anything, so the host's mount table is never
//! touched: root, the variable, a mount namespace other than PID 1's, and `/` not shared.
//!
//! When a check fails the test prints `skipped: needs CAP_SYS_ADMIN` (and why) and returns early;
//! with `RUSTLET_REQUIRE_PRIVILEGED=1` (CI) it panics instead, so a skip cannot pass unnoticed.

use std::path::{Path, PathBuf};

use crate::mounter::{LinuxMounter, UnmountMode};

/// A temp dir for one privileged test; on drop, everything mounted beneath it is lazily
/// unmounted (newest first) before the dir is removed.
pub struct PrivilegedDir {
    dir: Option<tempfile::TempDir>,
    /// The mounter tests should use.
    pub mounter: LinuxMounter,
}

impl PrivilegedDir {
    /// The temp dir's path (canonical, so it matches the mount table).
    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("live").path()
    }

    /// `path/name`, created as a directory.
    pub fn mkdir(&self, name: &str) -> PathBuf {
        let p = self.path().join(name);
        std::fs::create_dir_all(&p).expect("create test dir");
        p
    }
}

impl Drop for PrivilegedDir {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        let root = dir.path().to_owned();
        if let Ok(table) = self.mounter.list() {
            for m in table
                .iter()
                .rev()
                .filter(|m| m.mount_point.starts_with(&root))
            {
                let _ = self.mounter.unmount(&m.mount_point, UnmountMode::Lazy);
            }
        }
        let _ = dir.close();
    }
}

fn why_not_privileged() -> Option<String> {
    let euid_zero = std::fs::read_to_string("/proc/self/status")
        .ok()
        .is_some_and(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2))
                == Some("0")
        });
    if !euid_zero {
        return Some("not running as root".into());
    }
    if std::env::var("RUSTLET_PRIVATE_MOUNT_NS").as_deref() != Ok("1") {
        return Some("not inside the private mount namespace of `cargo xtask test`".into());
    }
    let ns = |p: &str| std::fs::read_link(p).ok();
    match (ns("/proc/self/ns/mnt"), ns("/proc/1/ns/mnt")) {
        (Some(own), Some(init)) if own == init => {
            return Some("the mount namespace is the host's (PID 1's)".into());
        }
        (None, _) => return Some("cannot read /proc/self/ns/mnt".into()),
        _ => {}
    }
    let root_shared = LinuxMounter::new().list().ok().is_none_or(|t| {
        t.iter().any(|m| {
            m.mount_point == Path::new("/")
                && m.optional_fields.iter().any(|f| f.starts_with("shared:"))
        })
    });
    if root_shared {
        return Some(
            "`/` is shared (or the mount table is unreadable): mounts could propagate".into(),
        );
    }
    None
}

/// A temp dir to mount in, or `None` after printing why the test is skipped. Panics instead of
/// skipping when `RUSTLET_REQUIRE_PRIVILEGED=1`.
pub fn privileged_dir(test: &str) -> Option<PrivilegedDir> {
    if let Some(reason) = why_not_privileged() {
        if std::env::var("RUSTLET_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
            panic!(
                "{test}: privileged test cannot run ({reason}) and RUSTLET_REQUIRE_PRIVILEGED=1"
            );
        }
        eprintln!("{test}: skipped: needs CAP_SYS_ADMIN ({reason})");
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("rustlet-mount-test-")
        .tempdir()
        .expect("temp dir");
    let canonical = std::fs::canonicalize(dir.path()).expect("canonical temp dir");
    assert_eq!(canonical, dir.path(), "temp dir must have a canonical path");
    Some(PrivilegedDir {
        dir: Some(dir),
        mounter: LinuxMounter::new(),
    })
}
