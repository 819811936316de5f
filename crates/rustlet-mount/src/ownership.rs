//! fsGroup ownership of a volume (upstream `SetVolumeOwnership`, V110-V112): every entry's group
//! becomes the fsGroup (a symlink's own group; it is never followed), files gain the group
//! read (and write, for a writable volume) bits, directories also the group execute bit and
//! setgid, children before the root.
//!
//! The walk is the removal's (iterative, at most a few directory fds, never entering another
//! mount), so a pod's hostile tree (20,000 levels deep, odd names) neither crashes nor stalls
//! it; a chmod goes through an `O_PATH` fd of the exact entry, so a symlink swapped in cannot
//! redirect it. As upstream, a failure on one entry is counted and logged, not returned.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, fchmod, fstat};
use nix::unistd::{Gid, fchown, fchownat};
use tracing::warn;

use crate::error::{Error, Result, io_err};
use crate::remove::{PostOrder, dir_flags, guard_for, walk_post_order};
use crate::safe_path::Resolver;

/// Upstream `fsGroupChangePolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChangePolicy {
    /// Walk every time (the default).
    #[default]
    Always,
    /// Skip the walk when the root already has the group, the bits and setgid.
    OnRootMismatch,
}

/// What to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ownership {
    /// The pod's `securityContext.fsGroup`.
    pub gid: u32,
    /// A read-only volume gets group read only (`0440`), else read and write (`0660`).
    pub read_only: bool,
    /// `securityContext.fsGroupChangePolicy`.
    pub policy: ChangePolicy,
}

impl Ownership {
    fn mask(&self) -> u32 {
        if self.read_only { 0o440 } else { 0o660 }
    }

    fn dir_bits(&self) -> u32 {
        self.mask() | 0o110 | libc::S_ISGID
    }
}

/// What a walk did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnershipReport {
    /// Entries changed (the root included).
    pub changed: u64,
    /// Entries whose chown or chmod failed (logged).
    pub failed: u64,
    /// `OnRootMismatch` found the root already right: nothing walked.
    pub skipped: bool,
}

struct Apply {
    ownership: Ownership,
    report: OwnershipReport,
}

impl Apply {
    fn outcome(&mut self, path: &Path, result: std::result::Result<(), nix::errno::Errno>) {
        match result {
            Ok(()) => self.report.changed += 1,
            Err(e) => {
                self.report.failed += 1;
                warn!(path = %path.display(), error = %e, "setting volume ownership");
            }
        }
    }
}

fn gid(g: u32) -> Option<Gid> {
    Some(Gid::from_raw(g))
}

impl PostOrder for Apply {
    fn leaf(&mut self, parent: &OwnedFd, name: &OsStr, path: &Path) -> Result<()> {
        let result = (|| {
            fchownat(
                parent.as_fd(),
                name,
                None,
                gid(self.ownership.gid),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )?;
            // The exact entry, pinned: a symlink is left as it is.
            let fd = openat(
                parent.as_fd(),
                name,
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            let st = fstat(fd.as_fd())?;
            if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                return Ok(());
            }
            let mode = (st.st_mode & 0o7777) | self.ownership.mask();
            std::fs::set_permissions(
                format!("/proc/self/fd/{}", fd.as_raw_fd()),
                std::fs::Permissions::from_mode(mode),
            )
            .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
        })();
        self.outcome(path, result);
        Ok(())
    }

    fn dir_done(
        &mut self,
        _parent: &OwnedFd,
        _name: &OsStr,
        dir: &OwnedFd,
        path: &Path,
    ) -> Result<()> {
        let result = apply_dir(dir, &self.ownership);
        self.outcome(path, result);
        Ok(())
    }

    /// Another mount beneath the volume is not this volume's: left alone.
    fn cannot_enter(&mut self, err: Error) -> Result<()> {
        warn!(error = %err, "setting volume ownership: not entering another mount");
        Ok(())
    }
}

fn apply_dir(dir: &OwnedFd, ownership: &Ownership) -> std::result::Result<(), nix::errno::Errno> {
    fchown(dir.as_fd(), None, gid(ownership.gid))?;
    let st = fstat(dir.as_fd())?;
    let mode = (st.st_mode & 0o7777) | ownership.dir_bits();
    fchmod(dir.as_fd(), Mode::from_bits_truncate(mode))
}

/// Applies `ownership` to the volume at `dir` and everything beneath it on its own mount.
pub fn set_volume_ownership(dir: &Path, ownership: Ownership) -> Result<OwnershipReport> {
    let root = nix::fcntl::open(dir, dir_flags(), Mode::empty()).map_err(|e| Error::Stat {
        path: dir.to_owned(),
        error: io_err(e),
    })?;
    if ownership.policy == ChangePolicy::OnRootMismatch {
        let st = fstat(root.as_fd()).map_err(|e| Error::Stat {
            path: dir.to_owned(),
            error: io_err(e),
        })?;
        let bits = ownership.dir_bits();
        if st.st_gid == ownership.gid && st.st_mode & bits == bits {
            return Ok(OwnershipReport {
                skipped: true,
                ..OwnershipReport::default()
            });
        }
    }
    let mut apply = Apply {
        ownership,
        report: OwnershipReport::default(),
    };
    let guard = guard_for(Resolver::detect())?;
    let walk_root = root.try_clone().map_err(|error| Error::Stat {
        path: dir.to_owned(),
        error,
    })?;
    walk_post_order(walk_root, dir, &guard, &mut apply)?;
    let result = apply_dir(&root, &ownership);
    apply.outcome(dir, result);
    Ok(apply.report)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    const GID: u32 = 4242;

    fn ownership(read_only: bool, policy: ChangePolicy) -> Ownership {
        Ownership {
            gid: GID,
            read_only,
            policy,
        }
    }

    #[test]
    fn groups_and_bits_as_upstream_children_before_the_root() {
        if !nix::unistd::getuid().is_root() {
            eprintln!("skipped: needs root to chown");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/file"), "x").unwrap();
        std::fs::set_permissions(
            dir.path().join("a/b/file"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::fs::write(outside.path().join("victim"), "host").unwrap();
        std::fs::set_permissions(
            outside.path().join("victim"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::os::unix::fs::symlink(outside.path().join("victim"), dir.path().join("link")).unwrap();
        let report =
            set_volume_ownership(dir.path(), ownership(false, ChangePolicy::Always)).unwrap();
        assert_eq!(report.failed, 0);
        assert_eq!(report.changed, 5, "a, a/b, a/b/file, link, the root");
        let meta = |p: &str| std::fs::symlink_metadata(dir.path().join(p)).unwrap();
        assert_eq!(meta("a/b/file").gid(), GID);
        assert_eq!(meta("a/b/file").mode() & 0o7777, 0o660, "group rw, no exec");
        assert_eq!(meta("a").mode() & 0o7777, 0o755 | 0o660 | 0o110 | 0o2000);
        assert_eq!(meta("link").gid(), GID, "the link's own group");
        let victim = std::fs::metadata(outside.path().join("victim")).unwrap();
        assert_eq!(victim.gid(), 0, "the link is never followed");
        assert_eq!(victim.mode() & 0o7777, 0o600);
        let root = std::fs::metadata(dir.path()).unwrap();
        assert_eq!(root.gid(), GID);
        assert!(root.mode() & 0o2000 != 0, "setgid");

        // OnRootMismatch: the root is right now, nothing is walked.
        std::fs::write(dir.path().join("new"), "y").unwrap();
        // (setgid gave it the group already; take it back to see whether a walk happens.)
        nix::unistd::chown(&dir.path().join("new"), None, Some(Gid::from_raw(0))).unwrap();
        let again =
            set_volume_ownership(dir.path(), ownership(false, ChangePolicy::OnRootMismatch))
                .unwrap();
        assert!(again.skipped);
        assert_ne!(meta("new").gid(), GID);
        // Always walks again.
        set_volume_ownership(dir.path(), ownership(true, ChangePolicy::Always)).unwrap();
        assert_eq!(meta("new").gid(), GID);
    }

    #[test]
    fn a_deep_tree_neither_crashes_nor_exhausts_fds() {
        if !nix::unistd::getuid().is_root() {
            eprintln!("skipped: needs root to chown");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut fd = nix::fcntl::open(dir.path(), dir_flags(), Mode::empty()).unwrap();
        for _ in 0..3000 {
            nix::sys::stat::mkdirat(&fd, "d", Mode::from_bits_truncate(0o700)).unwrap();
            fd = openat(&fd, "d", dir_flags(), Mode::empty()).unwrap();
        }
        let report =
            set_volume_ownership(dir.path(), ownership(false, ChangePolicy::Always)).unwrap();
        assert_eq!(report.changed, 3001);
        assert_eq!(report.failed, 0);
    }
}
