//! `LinuxMounter`: mount, bind, read-only bind, tmpfs, unmount, and the mount-point checks.
//!
//! Upstream: `mount-utils` `mount_linux.go` (`Mount`, `MountSensitive`, `Unmount`,
//! `IsLikelyNotMountPoint`, `IsMountPoint`, `List`, `GetMountRefs`) and `mount_helper_common.go`
//! (`CleanupMountPoint`, `PathExists`). Unlike upstream, every mount is a direct `mount(2)`
//! through sys-mount (no `mount(8)` exec, no systemd scope): tens of microseconds instead of
//! milliseconds, and no helper that could canonicalise a path again (CVE-2021-25741).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::statvfs::{FsFlags, statvfs};
use sys_mount::{FilesystemType, Mount, MountFlags, UnmountFlags, unmount};
use tracing::debug;

use crate::error::{Error, Result, is_corrupted_mount_errno};
use crate::mountinfo::{self, MountInfo, SELF_MOUNTINFO};
use crate::options::{LOCKED_FLAGS, SensitiveOptions, parse_options};

/// One mount request, as `mount(8)` would take it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountRequest {
    /// Source: a device, a directory (for binds) or a name (`tmpfs`).
    pub source: String,
    /// The mount point; it must exist.
    pub target: PathBuf,
    /// Filesystem type (`tmpfs`, `ext4`); ignored for binds.
    pub fstype: String,
    /// Options such as `ro`, `bind`, `nosuid`, `size=1m`.
    pub options: Vec<String>,
    /// Options passed to the kernel but never logged nor shown by `Debug`.
    pub sensitive_options: SensitiveOptions,
}

/// How to bind-mount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BindAccess {
    /// Writable like the source.
    #[default]
    ReadWrite,
    /// Read-only (bind, then remount read-only keeping the source's locked flags).
    ReadOnly,
}

/// A tmpfs mount's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TmpfsOptions {
    /// `size=` in bytes; `None` is the kernel default (half of RAM).
    pub size_bytes: Option<u64>,
    /// `mode=` of the root directory.
    pub mode: Option<u32>,
}

impl Default for TmpfsOptions {
    fn default() -> Self {
        Self {
            size_bytes: None,
            mode: Some(0o755),
        }
    }
}

/// How to unmount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnmountMode {
    /// `umount2(target, 0)`: fails with EBUSY while something is open beneath.
    #[default]
    Normal,
    /// `umount2(target, MNT_DETACH)`: detach now, release when the last user is gone.
    Lazy,
}

/// How thoroughly to check for a mount point before removing a directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MountPointCheck {
    /// Device numbers of path and parent (fast; misses same-filesystem bind mounts).
    Likely,
    /// The mount table (exact).
    #[default]
    Exact,
}

/// The Linux mount backend. Stateless: the kernel's mount table is the state.
#[derive(Clone, Debug, Default)]
pub struct LinuxMounter {
    mountinfo: Option<PathBuf>,
}

fn mount_err(source: &str, target: &Path, fstype: &str, error: std::io::Error) -> Error {
    Error::Mount {
        source_name: source.to_owned(),
        target: target.to_owned(),
        fstype: fstype.to_owned(),
        error,
    }
}

impl LinuxMounter {
    /// A mounter over the calling process's mount namespace.
    pub fn new() -> Self {
        Self::default()
    }

    /// A mounter that reads its mount table from another mountinfo file (tests, or another
    /// process's `/proc/<pid>/mountinfo`).
    pub fn with_mountinfo(path: impl Into<PathBuf>) -> Self {
        Self {
            mountinfo: Some(path.into()),
        }
    }

    fn mountinfo_path(&self) -> &Path {
        self.mountinfo
            .as_deref()
            .unwrap_or(Path::new(SELF_MOUNTINFO))
    }

    /// Mounts as `mount -t fstype -o options source target` would, with binds done in two
    /// steps so their options apply (upstream V115).
    pub fn mount(&self, request: &MountRequest) -> Result<()> {
        let parsed = parse_options(&request.options);
        debug!(source = %request.source, target = %request.target.display(), fstype = %request.fstype,
               options = ?request.options, sensitive = ?request.sensitive_options, "mount");
        if parsed.bind {
            let extra = parsed.flags - (MountFlags::BIND | MountFlags::REC);
            return self.bind_with_flags(
                Path::new(&request.source),
                &request.target,
                parsed.flags.contains(MountFlags::REC),
                extra,
            );
        }
        let mut data = parsed.data;
        data.extend(request.sensitive_options.expose().iter().cloned());
        let data = data.join(",");
        self.raw_mount(
            &request.source,
            &request.target,
            &request.fstype,
            parsed.flags,
            &data,
        )
    }

    fn raw_mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        flags: MountFlags,
        data: &str,
    ) -> Result<()> {
        let mut builder = Mount::builder()
            .fstype(FilesystemType::Manual(fstype))
            .flags(flags);
        if !data.is_empty() {
            builder = builder.data(data);
        }
        builder
            .mount(source, target)
            .map(drop)
            .map_err(|e| mount_err(source, target, fstype, e))
    }

    /// Bind-mounts `source` on `target`; read-only takes a second remount call, because the
    /// kernel ignores `MS_RDONLY` on the first bind.
    pub fn bind(&self, source: &Path, target: &Path, access: BindAccess) -> Result<()> {
        let extra = match access {
            BindAccess::ReadWrite => MountFlags::empty(),
            BindAccess::ReadOnly => MountFlags::RDONLY,
        };
        self.bind_with_flags(source, target, false, extra)
    }

    fn bind_with_flags(
        &self,
        source: &Path,
        target: &Path,
        recursive: bool,
        extra: MountFlags,
    ) -> Result<()> {
        let mut flags = MountFlags::BIND;
        if recursive {
            flags |= MountFlags::REC;
        }
        let source_name = source.to_string_lossy();
        self.raw_mount(&source_name, target, "none", flags, "")?;
        if extra.is_empty() {
            return Ok(());
        }
        // Carry the locked per-mount flags over, or the remount clears them (as root) or
        // fails with EPERM (in a user namespace).
        let mut remount = MountFlags::REMOUNT | MountFlags::BIND | extra;
        if let Ok(stat) = statvfs(target) {
            let have = stat.flags();
            let pairs = [
                (FsFlags::ST_NOSUID, LOCKED_FLAGS[0]),
                (FsFlags::ST_NODEV, LOCKED_FLAGS[1]),
                (FsFlags::ST_NOEXEC, LOCKED_FLAGS[2]),
                (FsFlags::ST_NOATIME, LOCKED_FLAGS[3]),
                (FsFlags::ST_RELATIME, LOCKED_FLAGS[4]),
            ];
            for (fs_flag, mount_flag) in pairs {
                if have.contains(fs_flag) {
                    remount |= mount_flag;
                }
            }
        }
        let result = Mount::builder()
            .fstype(FilesystemType::Manual("none"))
            .flags(remount)
            .mount("", target)
            .map(drop);
        if let Err(error) = result {
            // Do not leave a writable bind behind a failed read-only request.
            let _ = unmount(target, UnmountFlags::DETACH);
            return Err(Error::Remount {
                target: target.to_owned(),
                flags: format!("{remount:?}"),
                error,
            });
        }
        Ok(())
    }

    /// Mounts a tmpfs with `nosuid,nodev` and the given size and mode.
    ///
    /// Needs CAP_SYS_ADMIN, so compiled but not run here (see `examples/tmpfs_in_private_ns.rs`):
    ///
    /// ```no_run
    /// use std::path::Path;
    /// use rustlet_mount::{LinuxMounter, TmpfsOptions};
    ///
    /// let mounter = LinuxMounter::new();
    /// let target = Path::new("/var/lib/demo/scratch");
    /// mounter.tmpfs(target, TmpfsOptions { size_bytes: Some(64 << 20), mode: Some(0o755) })?;
    /// assert!(mounter.is_tmpfs_mount_point(target)?);
    /// # Ok::<(), rustlet_mount::Error>(())
    /// ```
    pub fn tmpfs(&self, target: &Path, options: TmpfsOptions) -> Result<()> {
        let mut data = Vec::new();
        if let Some(size) = options.size_bytes {
            data.push(format!("size={size}"));
        }
        if let Some(mode) = options.mode {
            data.push(format!("mode={mode:o}"));
        }
        self.raw_mount(
            "tmpfs",
            target,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            &data.join(","),
        )
    }

    /// Unmounts `target`.
    pub fn unmount(&self, target: &Path, mode: UnmountMode) -> Result<()> {
        if target.as_os_str().as_encoded_bytes().contains(&0) {
            return Err(Error::InvalidPath {
                path: target.to_owned(),
                reason: "contains a NUL byte",
            });
        }
        let flags = match mode {
            UnmountMode::Normal => UnmountFlags::empty(),
            UnmountMode::Lazy => UnmountFlags::DETACH,
        };
        debug!(target = %target.display(), ?mode, "unmount");
        unmount(target, flags).map_err(|error| Error::Unmount {
            target: target.to_owned(),
            error,
        })
    }

    /// Upstream `IsLikelyNotMountPoint`: true when `path` has the same device as its parent.
    /// Fast, and wrong for a bind mount from the same filesystem (use [`Self::is_mount_point`]).
    pub fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool> {
        let stat = |p: &Path| {
            std::fs::metadata(p).map_err(|error| Error::Stat {
                path: p.to_owned(),
                error,
            })
        };
        let own = stat(path)?;
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("/"));
        let parent_meta = stat(parent)?;
        Ok(own.dev() == parent_meta.dev() && path != Path::new("/"))
    }

    /// Exact: whether `path` is the mount point of an entry in the mount table, bind mounts
    /// from the same filesystem included. The path is canonicalised first (upstream compares
    /// the `EvalSymlinks` path).
    pub fn is_mount_point(&self, path: &Path) -> Result<bool> {
        let resolved = std::fs::canonicalize(path).map_err(|error| Error::Stat {
            path: path.to_owned(),
            error,
        })?;
        Ok(self.list()?.iter().any(|m| m.mount_point == resolved))
    }

    /// Whether a tmpfs is mounted exactly at `path`: `statfs` says tmpfs and the device differs
    /// from the parent's (a tmpfs always has a device of its own). Two `stat`s and a `statfs`,
    /// no mount table read.
    pub fn is_tmpfs_mount_point(&self, path: &Path) -> Result<bool> {
        let fs = nix::sys::statfs::statfs(path).map_err(|e| Error::Stat {
            path: path.to_owned(),
            error: crate::error::io_err(e),
        })?;
        if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
            return Ok(false);
        }
        self.is_likely_not_mount_point(path).map(|not| !not)
    }

    /// The mount table.
    pub fn list(&self) -> Result<Vec<MountInfo>> {
        mountinfo::read(self.mountinfo_path())
    }

    /// Upstream `MakeRShared` (`DoMakeRShared`): makes `path` a shared mount, recursively, so
    /// that a mount made below it in a container with `Bidirectional` propagation appears
    /// here, and one made here appears in a container with `HostToContainer`. Nothing when
    /// the mount `path` is on is shared already; else `path` is bound on itself and that bind
    /// made `rshared` (the mount `path` is on, and anything above it, stay as they are).
    pub fn make_rshared(&self, path: &Path) -> Result<()> {
        if self.is_shared(path)? {
            return Ok(());
        }
        self.bind_with_flags(path, path, false, MountFlags::empty())?;
        use nix::mount::{MsFlags, mount};
        mount(
            None::<&str>,
            path,
            None::<&str>,
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| mount_err("none", path, "none", e.into()))
    }

    /// Upstream `isShared`: whether the mount `path` is on (the mount table's longest mount
    /// point that contains it) is a shared one (`shared:N`).
    pub fn is_shared(&self, path: &Path) -> Result<bool> {
        let mounts = self.list()?;
        let on = mounts
            .iter()
            .filter(|m| path.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.as_os_str().len());
        Ok(on.is_some_and(|m| m.optional_fields.iter().any(|f| f.starts_with("shared:"))))
    }

    /// Upstream `GetMountRefs`: the other mount points that show the same filesystem directory
    /// as the mount at `path` (same device and root), e.g. the global mount behind a pod bind.
    pub fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>> {
        let resolved = match std::fs::canonicalize(path) {
            Ok(p) => p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => {
                return Err(Error::Stat {
                    path: path.to_owned(),
                    error,
                });
            }
        };
        let table = self.list()?;
        let Some(this) = table.iter().rev().find(|m| m.mount_point == resolved) else {
            return Ok(Vec::new());
        };
        Ok(table
            .iter()
            .filter(|m| {
                m.major == this.major
                    && m.minor == this.minor
                    && m.root == this.root
                    && m.mount_point != resolved
            })
            .map(|m| m.mount_point.clone())
            .collect())
    }

    /// Upstream `PathExists`: ENOENT is false; a corrupted mount counts as existing so that
    /// clean-up goes on to unmount it.
    pub fn path_exists(&self, path: &Path) -> Result<bool> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e)
                if e.raw_os_error()
                    .map(Errno::from_raw)
                    .is_some_and(is_corrupted_mount_errno) =>
            {
                Ok(true)
            }
            Err(error) => Err(Error::Stat {
                path: path.to_owned(),
                error,
            }),
        }
    }

    /// True when stat-ing `path` fails with a corrupted-mount errno (ENOTCONN, ESTALE, EIO, ...).
    pub fn is_corrupted_mount(&self, path: &Path) -> bool {
        std::fs::metadata(path)
            .err()
            .and_then(|e| e.raw_os_error())
            .is_some_and(|raw| is_corrupted_mount_errno(Errno::from_raw(raw)))
    }

    /// Upstream `CleanupMountPoint`: unmount `path` if it is mounted (or corrupted), then remove
    /// the (now empty) directory. A missing path is success; a path still mounted afterwards is
    /// [`Error::StillMounted`]. Never removes anything recursively.
    pub fn cleanup_mount_point(&self, path: &Path, check: MountPointCheck) -> Result<()> {
        if !self.path_exists(path)? {
            return Ok(());
        }
        if self.is_corrupted_mount(path) {
            self.unmount(path, UnmountMode::Normal)?;
            return remove_empty(path);
        }
        let mounted = |m: &Self| -> Result<bool> {
            match check {
                MountPointCheck::Likely => m.is_likely_not_mount_point(path).map(|not| !not),
                MountPointCheck::Exact => m.is_mount_point(path),
            }
        };
        if mounted(self)? {
            self.unmount(path, UnmountMode::Normal)?;
            if mounted(self)? {
                return Err(Error::StillMounted {
                    path: path.to_owned(),
                });
            }
        }
        remove_empty(path)
    }
}

/// Removes a file or an empty directory (never recursive).
fn remove_empty(path: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(path).map_err(|error| Error::Stat {
        path: path.to_owned(),
        error,
    })?;
    let result = if meta.is_dir() {
        std::fs::remove_dir(path)
    } else {
        std::fs::remove_file(path)
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(Error::Remove {
            path: path.to_owned(),
            error,
        }),
    }
}
