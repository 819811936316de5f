//! `FakeMounter`: an in-memory mount table with an action log and injectable errors, for unit
//! tests of code above this crate (upstream `mount-utils/fake_mounter.go`).
//!
//! It offers the same operations as `LinuxMounter`. Paths are real (tests use temp dirs, and
//! existence checks stat the real file system); only the mount table is in memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use nix::errno::Errno;

use crate::error::{Error, Result, io_err};
use crate::mounter::{BindAccess, MountPointCheck, MountRequest, TmpfsOptions, UnmountMode};
use crate::mountinfo::MountInfo;
use crate::options::parse_options;

/// One mount in the fake table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeMount {
    /// Source.
    pub source: String,
    /// Mount point.
    pub target: PathBuf,
    /// Filesystem type (`none` for binds).
    pub fstype: String,
    /// Options as given (sensitive ones left out).
    pub options: Vec<String>,
}

/// What the fake was asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeAction {
    /// A mount (of any kind).
    Mount {
        /// Source.
        source: String,
        /// Target.
        target: PathBuf,
        /// Filesystem type.
        fstype: String,
    },
    /// An unmount.
    Unmount {
        /// Target.
        target: PathBuf,
    },
}

/// Which operation an injected error applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FakeOp {
    /// `mount`, `bind`, `tmpfs`.
    Mount,
    /// `unmount`.
    Unmount,
    /// The mount-point checks.
    Check,
}

#[derive(Debug, Default)]
struct State {
    mounts: Vec<FakeMount>,
    log: Vec<FakeAction>,
    errors: HashMap<(FakeOp, PathBuf), Errno>,
    /// Reads of the whole table (`list`): what a caller pays per read on a busy node.
    table_reads: usize,
}

/// The fake. Cloning shares the table (like an `Arc`).
#[derive(Clone, Debug, Default)]
pub struct FakeMounter {
    state: Arc<Mutex<State>>,
}

impl FakeMounter {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `op` on `path` fail with `errno` until [`Self::clear_error`].
    pub fn inject_error(&self, op: FakeOp, path: impl Into<PathBuf>, errno: Errno) {
        self.state().errors.insert((op, path.into()), errno);
    }

    /// Removes an injected error.
    pub fn clear_error(&self, op: FakeOp, path: &Path) {
        self.state().errors.remove(&(op, path.to_owned()));
    }

    /// The mounts, oldest first.
    pub fn mounts(&self) -> Vec<FakeMount> {
        self.state().mounts.clone()
    }

    /// How many times the whole mount table was read ([`FakeMounter::list`]).
    pub fn table_reads(&self) -> usize {
        self.state().table_reads
    }

    /// The action log so far.
    pub fn actions(&self) -> Vec<FakeAction> {
        self.state().log.clone()
    }

    /// Returns and clears the action log.
    pub fn take_actions(&self) -> Vec<FakeAction> {
        std::mem::take(&mut self.state().log)
    }

    fn injected(&self, op: FakeOp, path: &Path) -> Option<Errno> {
        self.state().errors.get(&(op, path.to_owned())).copied()
    }

    fn record_mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        options: Vec<String>,
    ) -> Result<()> {
        if let Some(errno) = self.injected(FakeOp::Mount, target) {
            return Err(Error::Mount {
                source_name: source.to_owned(),
                target: target.to_owned(),
                fstype: fstype.to_owned(),
                error: io_err(errno),
            });
        }
        if !target.exists() {
            return Err(Error::Mount {
                source_name: source.to_owned(),
                target: target.to_owned(),
                fstype: fstype.to_owned(),
                error: io_err(Errno::ENOENT),
            });
        }
        let mut state = self.state();
        state.log.push(FakeAction::Mount {
            source: source.to_owned(),
            target: target.to_owned(),
            fstype: fstype.to_owned(),
        });
        state.mounts.push(FakeMount {
            source: source.to_owned(),
            target: target.to_owned(),
            fstype: fstype.to_owned(),
            options,
        });
        Ok(())
    }

    /// Like `LinuxMounter::mount`.
    pub fn mount(&self, request: &MountRequest) -> Result<()> {
        let fstype = if parse_options(&request.options).bind {
            "none"
        } else {
            &request.fstype
        };
        self.record_mount(
            &request.source,
            &request.target,
            fstype,
            request.options.clone(),
        )
    }

    /// Like `LinuxMounter::bind`.
    pub fn bind(&self, source: &Path, target: &Path, access: BindAccess) -> Result<()> {
        let mut options = vec!["bind".to_owned()];
        if access == BindAccess::ReadOnly {
            options.push("ro".to_owned());
        }
        self.record_mount(&source.to_string_lossy(), target, "none", options)
    }

    /// Like `LinuxMounter::prepare_subpath`: the same path checks (plain, resolved once,
    /// within the volume), the target created to match, and a recorded bind of the resolved
    /// path (a fake cannot pin an inode).
    pub fn prepare_subpath(&self, subpath: &crate::safe_path::Subpath) -> Result<()> {
        let (_, resolved) = crate::safe_path::resolve_subpath(subpath)?;
        if let Some(parent) = subpath.target.parent() {
            std::fs::create_dir_all(parent).map_err(|error| Error::Create {
                path: parent.to_owned(),
                error,
            })?;
        }
        let created = if resolved.is_dir() {
            std::fs::create_dir_all(&subpath.target)
        } else {
            std::fs::write(&subpath.target, b"")
        };
        created.map_err(|error| Error::Create {
            path: subpath.target.clone(),
            error,
        })?;
        if self.is_mount_point(&subpath.target).unwrap_or(false) {
            self.unmount(&subpath.target, UnmountMode::Normal)?;
        }
        self.bind(&resolved, &subpath.target, BindAccess::ReadWrite)
    }

    /// Like `LinuxMounter::tmpfs`.
    pub fn tmpfs(&self, target: &Path, options: TmpfsOptions) -> Result<()> {
        let mut opts = vec!["nosuid".to_owned(), "nodev".to_owned()];
        if let Some(size) = options.size_bytes {
            opts.push(format!("size={size}"));
        }
        self.record_mount("tmpfs", target, "tmpfs", opts)
    }

    /// Like `LinuxMounter::unmount`: removes the newest mount on `target`; EINVAL when none.
    pub fn unmount(&self, target: &Path, _mode: UnmountMode) -> Result<()> {
        let err = |errno| Error::Unmount {
            target: target.to_owned(),
            error: io_err(errno),
        };
        if let Some(errno) = self.injected(FakeOp::Unmount, target) {
            return Err(err(errno));
        }
        let mut state = self.state();
        state.log.push(FakeAction::Unmount {
            target: target.to_owned(),
        });
        match state.mounts.iter().rposition(|m| m.target == target) {
            Some(i) => {
                state.mounts.remove(i);
                Ok(())
            }
            None => Err(err(Errno::EINVAL)),
        }
    }

    /// Like `LinuxMounter::is_mount_point` (the fake has no device numbers, so the likely
    /// check is the same as the exact one).
    pub fn is_mount_point(&self, path: &Path) -> Result<bool> {
        if let Some(errno) = self.injected(FakeOp::Check, path) {
            return Err(Error::Stat {
                path: path.to_owned(),
                error: io_err(errno),
            });
        }
        if !path.exists() {
            return Err(Error::Stat {
                path: path.to_owned(),
                error: io_err(Errno::ENOENT),
            });
        }
        Ok(self.state().mounts.iter().any(|m| m.target == path))
    }

    /// Like `LinuxMounter::is_tmpfs_mount_point`: the newest mount at `path` is a tmpfs.
    pub fn is_tmpfs_mount_point(&self, path: &Path) -> Result<bool> {
        if !path.exists() {
            return Err(Error::Stat {
                path: path.to_owned(),
                error: io_err(Errno::ENOENT),
            });
        }
        Ok(self
            .state()
            .mounts
            .iter()
            .rev()
            .find(|m| m.target == path)
            .is_some_and(|m| m.fstype == "tmpfs"))
    }

    /// Like `LinuxMounter::is_likely_not_mount_point`.
    pub fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool> {
        self.is_mount_point(path).map(|mounted| !mounted)
    }

    /// The table as mountinfo entries (ids in mount order, device 0:0).
    pub fn list(&self) -> Result<Vec<MountInfo>> {
        let mut state = self.state();
        state.table_reads += 1;
        Ok(state
            .mounts
            .iter()
            .zip(1u32..)
            .map(|(m, id)| MountInfo {
                id,
                parent_id: 0,
                major: 0,
                minor: 0,
                root: PathBuf::from("/"),
                mount_point: m.target.clone(),
                mount_options: m.options.clone(),
                optional_fields: Vec::new(),
                fstype: m.fstype.clone(),
                source: m.source.clone(),
                super_options: Vec::new(),
            })
            .collect())
    }

    /// Like `LinuxMounter::mount_refs`: other targets with the same source.
    pub fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>> {
        let state = self.state();
        let Some(this) = state.mounts.iter().rev().find(|m| m.target == path) else {
            return Ok(Vec::new());
        };
        Ok(state
            .mounts
            .iter()
            .filter(|m| m.source == this.source && m.target != path)
            .map(|m| m.target.clone())
            .collect())
    }

    /// Like `LinuxMounter::cleanup_mount_point`.
    pub fn cleanup_mount_point(&self, path: &Path, _check: MountPointCheck) -> Result<()> {
        if !path.exists() {
            return Ok(());
        }
        if self.is_mount_point(path)? {
            self.unmount(path, UnmountMode::Normal)?;
            if self.is_mount_point(path)? {
                return Err(Error::StillMounted {
                    path: path.to_owned(),
                });
            }
        }
        std::fs::remove_dir(path).map_err(|error| Error::Remove {
            path: path.to_owned(),
            error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_tracks_mounts_logs_actions_and_injects_errors() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t");
        std::fs::create_dir(&target).unwrap();
        let fake = FakeMounter::new();
        fake.tmpfs(&target, TmpfsOptions::default()).unwrap();
        assert!(fake.is_mount_point(&target).unwrap());
        assert_eq!(fake.list().unwrap()[0].fstype, "tmpfs");

        fake.inject_error(FakeOp::Unmount, &target, Errno::EBUSY);
        let err = fake.unmount(&target, UnmountMode::Normal).unwrap_err();
        assert!(err.is_retryable(), "{err}");
        fake.clear_error(FakeOp::Unmount, &target);

        fake.cleanup_mount_point(&target, MountPointCheck::Exact)
            .unwrap();
        assert!(!target.exists());
        assert_eq!(
            fake.take_actions(),
            [
                FakeAction::Mount {
                    source: "tmpfs".into(),
                    target: target.clone(),
                    fstype: "tmpfs".into()
                },
                FakeAction::Unmount {
                    target: target.clone()
                },
            ]
        );
        assert!(fake.mounts().is_empty());
        assert!(matches!(fake.is_mount_point(&target), Err(e) if e.is_not_found()));
    }

    #[test]
    fn fake_refuses_mounting_on_a_missing_target_and_unmounting_nothing() {
        let fake = FakeMounter::new();
        assert!(
            fake.bind(
                Path::new("/src"),
                Path::new("/definitely/missing"),
                BindAccess::ReadOnly
            )
            .is_err()
        );
        let err = fake
            .unmount(Path::new("/nothing"), UnmountMode::Normal)
            .unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EINVAL));
    }
}
