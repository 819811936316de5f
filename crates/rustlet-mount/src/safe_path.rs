//! Path operations beneath a root that never follow a symlink (and never climb with `..`) out
//! of it, and the subPath bind of a pinned fd.
//!
//! Upstream: `pkg/volume/util/subpath/subpath_linux.go` (`doSafeOpen`, `doSafeMakeDir`,
//! `PrepareSafeSubpath`), the CVE-2017-1002101 and CVE-2021-25741 fixes.
//!
//! # Guarantees
//!
//! * A relative path given to these functions must be plain: not absolute, no `..`. That is
//!   checked before any system call ([`Error::InvalidPath`]).
//! * No symlink is followed anywhere beneath the root, not even one that would stay inside:
//!   with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` where the kernel has it (5.6+), else
//!   by a walk that opens one component at a time with `O_NOFOLLOW` from the parent's fd. A
//!   symlink fails with ELOOP; nothing outside the root is opened, created or modified.
//! * The result is an fd: callers use the fd (or `/proc/self/fd/N`), never the path again, so a
//!   component swapped for a symlink after the check changes nothing.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, mkdirat};

use crate::error::{Error, Result, io_err};
use crate::mounter::{BindAccess, LinuxMounter};

/// How a path beneath a root is resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolver {
    /// One `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`.
    Openat2,
    /// A component-by-component `openat(2)` walk with `O_NOFOLLOW`.
    Walk,
}

impl Resolver {
    /// `Openat2` when the running kernel has it, else `Walk` (probed once).
    pub fn detect() -> Self {
        static DETECTED: OnceLock<Resolver> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_CLOEXEC);
            match openat2(nix::fcntl::AT_FDCWD, "/", how) {
                Err(Errno::ENOSYS) => Resolver::Walk,
                _ => Resolver::Openat2,
            }
        })
    }
}

/// What to open at the end of the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenKind {
    /// An existing directory, for reading or as a parent fd.
    Directory,
    /// An existing non-directory file, read-only.
    File,
    /// Any existing object except a symlink, as an `O_PATH` fd (to bind-mount or stat it).
    Path,
    /// A regular file, created if absent (truncated if present) with this mode, write-only.
    CreateFile(u32),
}

impl OpenKind {
    fn flags(self) -> (OFlag, Mode) {
        let base = OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        match self {
            Self::Directory => (base | OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()),
            Self::File => (base | OFlag::O_RDONLY, Mode::empty()),
            Self::Path => (base | OFlag::O_PATH, Mode::empty()),
            Self::CreateFile(mode) => (
                base | OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC,
                Mode::from_bits_truncate(mode),
            ),
        }
    }
}

/// The plain components of a relative path, or why it is not plain.
pub fn plain_components(path: &Path) -> Result<Vec<&std::ffi::OsStr>> {
    let invalid = |reason| Error::InvalidPath {
        path: path.to_owned(),
        reason,
    };
    let mut out = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            Component::ParentDir => return Err(invalid("contains \"..\"")),
            Component::RootDir | Component::Prefix(_) => return Err(invalid("is absolute")),
        }
    }
    if path.as_os_str().as_encoded_bytes().contains(&0) {
        return Err(invalid("contains a NUL byte"));
    }
    Ok(out)
}

fn open_root(root: &Path) -> Result<OwnedFd> {
    open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::OpenBeneath {
        root: root.to_owned(),
        path: PathBuf::new(),
        error: io_err(e),
    })
}

fn check_not_symlink(fd: &OwnedFd) -> std::result::Result<FileStat, Errno> {
    let st = fstat(fd.as_fd())?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK {
        return Err(Errno::ELOOP);
    }
    Ok(st)
}

fn open_at_root(
    root_fd: &OwnedFd,
    rel: &Path,
    kind: OpenKind,
    resolver: Resolver,
) -> std::result::Result<OwnedFd, Errno> {
    let components = plain_components(rel).map_err(|_| Errno::EINVAL)?;
    let (flags, mode) = kind.flags();
    let fd = match resolver {
        Resolver::Openat2 => {
            let target: PathBuf = if components.is_empty() {
                PathBuf::from(".")
            } else {
                components.iter().collect()
            };
            let how = OpenHow::new().flags(flags).mode(mode).resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS,
            );
            openat2(root_fd.as_fd(), target.as_path(), how)?
        }
        Resolver::Walk => {
            let Some((last, parents)) = components.split_last() else {
                return openat(root_fd.as_fd(), ".", flags, mode);
            };
            let mut dir: Option<OwnedFd> = None;
            for name in parents {
                let parent = dir.as_ref().unwrap_or(root_fd);
                let next = openat(
                    parent.as_fd(),
                    *name,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )?;
                dir = Some(next);
            }
            openat(dir.as_ref().unwrap_or(root_fd).as_fd(), *last, flags, mode)?
        }
    };
    if kind == OpenKind::Path {
        check_not_symlink(&fd)?;
    }
    Ok(fd)
}

/// Opens `rel` beneath `root` without following any symlink and without leaving `root`.
pub fn open_beneath(root: &Path, rel: &Path, kind: OpenKind) -> Result<OwnedFd> {
    open_beneath_with(root, rel, kind, Resolver::detect())
}

/// [`open_beneath`] with a chosen resolver (both are tested against the same attacks).
pub fn open_beneath_with(
    root: &Path,
    rel: &Path,
    kind: OpenKind,
    resolver: Resolver,
) -> Result<OwnedFd> {
    plain_components(rel)?;
    let root_fd = open_root(root)?;
    open_at_root(&root_fd, rel, kind, resolver).map_err(|e| Error::OpenBeneath {
        root: root.to_owned(),
        path: rel.to_owned(),
        error: io_err(e),
    })
}

/// Upstream `SafeMakeDir`: creates every missing directory of `rel` beneath `root` with
/// `mode` (set with `fchmod`, so the umask does not apply), one component at a time with
/// `O_NOFOLLOW`. An existing symlink anywhere fails with ELOOP. Returns the last directory.
pub fn create_dir_all_beneath(root: &Path, rel: &Path, mode: u32) -> Result<OwnedFd> {
    let components = plain_components(rel)?;
    let err = |e: Errno| Error::Create {
        path: root.join(rel),
        error: io_err(e),
    };
    let mut dir = open_root(root)?;
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    for name in components {
        let next = match openat(dir.as_fd(), name, dir_flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                match mkdirat(dir.as_fd(), name, Mode::from_bits_truncate(mode)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(err(e)),
                }
                let fd = openat(dir.as_fd(), name, dir_flags, Mode::empty()).map_err(err)?;
                fchmod(fd.as_fd(), Mode::from_bits_truncate(mode)).map_err(err)?;
                fd
            }
            Err(e) => return Err(err(e)),
        };
        dir = next;
    }
    Ok(dir)
}

/// Upstream `PathWithinBase`: `full` is `base` or below it, compared lexically.
pub fn path_within_base(full: &Path, base: &Path) -> bool {
    full.strip_prefix(base)
        .is_ok_and(|rest| !rest.components().any(|c| c == Component::ParentDir))
}

impl LinuxMounter {
    /// Bind-mounts the object an fd pins onto `target`, through `/proc/self/fd/N`: the kernel
    /// binds that exact inode, so a path component swapped for a symlink after the fd was
    /// opened cannot redirect the mount (CVE-2021-25741). No helper re-resolves the path.
    pub fn bind_fd(&self, fd: &impl AsRawFd, target: &Path, access: BindAccess) -> Result<()> {
        let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        self.bind(&source, target, access)
    }

    /// [`prepare_subpath`] with this mounter.
    pub fn prepare_subpath(&self, subpath: &Subpath) -> Result<()> {
        prepare_subpath(self, subpath)
    }
}

/// A subPath to expose to a container (upstream `Subpath`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subpath {
    /// The volume's directory on the host.
    pub volume_path: PathBuf,
    /// The path inside the volume, relative, as the user wrote it.
    pub path: PathBuf,
    /// Where the bind goes (`<pod dir>/volume-subpaths/<volume>/<container>/<index>`).
    pub target: PathBuf,
}

/// V107 steps 1-2: a plain relative path, the volume and the subpath each resolved once, the
/// subpath within the volume. Returns both resolved paths.
pub fn resolve_subpath(subpath: &Subpath) -> Result<(PathBuf, PathBuf)> {
    plain_components(&subpath.path)?;
    let canon = |p: &Path| {
        std::fs::canonicalize(p).map_err(|error| Error::Stat {
            path: p.to_owned(),
            error,
        })
    };
    let volume = canon(&subpath.volume_path)?;
    let resolved = canon(&subpath.volume_path.join(&subpath.path))?;
    if !path_within_base(&resolved, &volume) {
        return Err(Error::NotWithinBase {
            path: resolved,
            base: volume,
        });
    }
    Ok((volume, resolved))
}

/// Upstream `PrepareSafeSubpath`: resolve the volume path and the subpath once, require the
/// subpath to stay within the volume, open it with no symlink allowed from there (pinning the
/// inode), create the target as a directory (0750) or empty file (0640) to match, and bind the
/// pinned fd onto it. An existing mount on the target is replaced.
pub fn prepare_subpath(mounter: &LinuxMounter, subpath: &Subpath) -> Result<()> {
    let (volume, resolved) = resolve_subpath(subpath)?;
    let rel = resolved.strip_prefix(&volume).unwrap_or(Path::new(""));
    let fd = open_beneath(&volume, rel, OpenKind::Path)?;
    let st = fstat(fd.as_fd()).map_err(|e| Error::Stat {
        path: resolved.clone(),
        error: io_err(e),
    })?;
    let is_dir = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;

    if mounter.is_mount_point(&subpath.target).unwrap_or(false) {
        mounter.unmount(&subpath.target, crate::mounter::UnmountMode::Normal)?;
    }
    let create = |r: std::io::Result<()>| -> Result<()> {
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(error) => Err(Error::Create {
                path: subpath.target.clone(),
                error,
            }),
        }
    };
    if let Some(parent) = subpath.target.parent() {
        create(std::fs::create_dir_all(parent))?;
    }
    if is_dir {
        use std::os::unix::fs::DirBuilderExt;
        create(
            std::fs::DirBuilder::new()
                .mode(0o750)
                .create(&subpath.target),
        )?;
    } else {
        use std::os::unix::fs::OpenOptionsExt;
        create(
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o640)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&subpath.target)
                .map(drop),
        )?;
    }
    let result = mounter.bind_fd(&fd, &subpath.target, BindAccess::ReadWrite);
    if result.is_err() {
        let _ = if is_dir {
            std::fs::remove_dir(&subpath.target)
        } else {
            std::fs::remove_file(&subpath.target)
        };
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_components_reject_absolute_and_parent() {
        assert!(plain_components(Path::new("a/b/./c")).is_ok());
        assert!(matches!(
            plain_components(Path::new("/etc")),
            Err(Error::InvalidPath { .. })
        ));
        assert!(matches!(
            plain_components(Path::new("a/../../etc")),
            Err(Error::InvalidPath { .. })
        ));
    }

    #[test]
    fn path_within_base_is_lexical() {
        assert!(path_within_base(Path::new("/v/a/b"), Path::new("/v")));
        assert!(path_within_base(Path::new("/v"), Path::new("/v")));
        assert!(!path_within_base(Path::new("/vv/a"), Path::new("/v")));
        assert!(!path_within_base(Path::new("/etc"), Path::new("/v")));
    }
}
