//! Recursive removal that never crosses a mount point.
//!
//! `rm -rf` through a still-mounted volume is how node agents destroyed user data
//! (kubernetes/kubernetes#60987): this walk stops at the first mount point it meets, bind mounts
//! from the same filesystem included, and reports it; nothing beneath a mount point is read,
//! unlinked or modified. Symlinks are unlinked, never followed.
//!
//! Each directory is opened from its parent's fd with `openat2(RESOLVE_NO_XDEV |
//! RESOLVE_NO_SYMLINKS)`, so entering another mount fails with EXDEV in the kernel itself; on a
//! kernel without `openat2` the walk opens with `O_NOFOLLOW` and compares each directory against
//! the mount table read once at the start.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::error::{Error, Result, io_err};
use crate::mountinfo::{self, SELF_MOUNTINFO};
use crate::safe_path::Resolver;

enum Guard {
    Kernel,
    MountTable(HashSet<PathBuf>),
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

fn open_dir(parent: &OwnedFd, name: &OsStr, path: &Path, guard: &Guard) -> Result<OwnedFd> {
    let result = match guard {
        Guard::Kernel => {
            let how = OpenHow::new()
                .flags(dir_flags())
                .resolve(ResolveFlag::RESOLVE_NO_XDEV | ResolveFlag::RESOLVE_NO_SYMLINKS);
            openat2(parent.as_fd(), name, how)
        }
        Guard::MountTable(points) => {
            if points.contains(path) {
                Err(Errno::EXDEV)
            } else {
                openat(parent.as_fd(), name, dir_flags(), Mode::empty())
            }
        }
    };
    result.map_err(|e| match e {
        Errno::EXDEV => Error::CrossesMountPoint {
            path: path.to_owned(),
        },
        e => Error::Remove {
            path: path.to_owned(),
            error: io_err(e),
        },
    })
}

fn remove_children(dir: OwnedFd, path: &Path, guard: &Guard) -> Result<()> {
    let mut entries: Vec<(Vec<u8>, Option<Type>)> = Vec::new();
    {
        let mut listing = Dir::from_fd(dir.try_clone().map_err(|error| Error::Remove {
            path: path.to_owned(),
            error,
        })?)
        .map_err(|e| Error::Remove {
            path: path.to_owned(),
            error: io_err(e),
        })?;
        for entry in listing.iter() {
            let entry = entry.map_err(|e| Error::Remove {
                path: path.to_owned(),
                error: io_err(e),
            })?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                entries.push((name.to_vec(), entry.file_type()));
            }
        }
    }
    for (name, file_type) in entries {
        let name = OsStr::from_bytes(&name);
        let child = path.join(name);
        let is_dir = match file_type {
            Some(t) => t == Type::Directory,
            None => nix::sys::stat::fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
                .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
                .map_err(|e| Error::Remove {
                    path: child.clone(),
                    error: io_err(e),
                })?,
        };
        if is_dir {
            let child_fd = open_dir(&dir, name, &child, guard)?;
            remove_children(child_fd, &child, guard)?;
            unlinkat(dir.as_fd(), name, UnlinkatFlags::RemoveDir)
        } else {
            unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir)
        }
        .map_err(|e| Error::Remove {
            path: child.clone(),
            error: io_err(e),
        })?;
    }
    Ok(())
}

/// Removes `path` and everything beneath it, on its own mount only. A missing path is success.
/// If `path` or anything beneath it is a mount point, the walk stops with
/// [`Error::CrossesMountPoint`] and nothing beneath that mount point is touched.
pub fn remove_all_one_filesystem(path: &Path) -> Result<()> {
    remove_all_one_filesystem_with(path, Resolver::detect())
}

/// [`remove_all_one_filesystem`] with a chosen guard: `Openat2` lets the kernel refuse the
/// crossing; `Walk` compares against the mount table.
pub fn remove_all_one_filesystem_with(path: &Path, resolver: Resolver) -> Result<()> {
    let path = match std::fs::canonicalize(path.parent().unwrap_or(Path::new("/"))) {
        Ok(parent) => parent.join(path.file_name().unwrap_or_default()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(Error::Stat {
                path: path.to_owned(),
                error,
            });
        }
    };
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(Error::Stat { path, error }),
    };
    if !meta.is_dir() {
        return std::fs::remove_file(&path).map_err(|error| Error::Remove { path, error });
    }
    let guard = match resolver {
        Resolver::Openat2 => Guard::Kernel,
        Resolver::Walk => Guard::MountTable(
            mountinfo::read(Path::new(SELF_MOUNTINFO))?
                .into_iter()
                .map(|m| m.mount_point)
                .collect(),
        ),
    };
    let parent_path = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().unwrap_or_default();
    let parent =
        nix::fcntl::open(parent_path, dir_flags(), Mode::empty()).map_err(|e| Error::Remove {
            path: parent_path.to_owned(),
            error: io_err(e),
        })?;
    let dir = open_dir(&parent, name, &path, &guard)?;
    remove_children(dir, &path, &guard)?;
    unlinkat(parent.as_fd(), name, UnlinkatFlags::RemoveDir).map_err(|e| Error::Remove {
        path: path.clone(),
        error: io_err(e),
    })
}
