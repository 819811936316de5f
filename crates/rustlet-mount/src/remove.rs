//! Recursive removal that never crosses a mount point.
//!
//! `rm -rf` through a still-mounted volume is how node agents destroyed user data
//! (kubernetes/kubernetes#60987): this walk stops at the first mount point it meets, bind mounts
//! from the same filesystem included, and reports it; nothing beneath a mount point is read,
//! unlinked or modified. Symlinks are unlinked, never followed.
//!
//! The walk is iterative (no recursion: a container can make a tree 20,000 levels deep) and
//! keeps at most [`MAX_OPEN_DIRS`] directory fds open: an older directory's fd is closed and,
//! when the walk comes back to it, reopened as `..` of its child and checked to be the same
//! directory (device and inode) before anything in it is unlinked.
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

pub(crate) enum Guard {
    Kernel,
    /// The mount points, and the length of the longest (a longer path is none of them).
    MountTable(HashSet<PathBuf>, usize),
}

pub(crate) fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

pub(crate) fn open_dir(
    parent: &OwnedFd,
    name: &OsStr,
    path: &Path,
    guard: &Guard,
) -> Result<OwnedFd> {
    let result = match guard {
        Guard::Kernel => {
            let how = OpenHow::new()
                .flags(dir_flags())
                .resolve(ResolveFlag::RESOLVE_NO_XDEV | ResolveFlag::RESOLVE_NO_SYMLINKS);
            openat2(parent.as_fd(), name, how)
        }
        Guard::MountTable(points, longest) => {
            if path.as_os_str().len() <= *longest && points.contains(path) {
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

/// At most this many directory fds are open at once during a walk, however deep the tree.
pub const MAX_OPEN_DIRS: usize = 16;

fn remove_err(path: &Path) -> impl Fn(Errno) -> Error + '_ {
    move |e| Error::Remove {
        path: path.to_owned(),
        error: io_err(e),
    }
}

/// The entries of a directory (without `.` and `..`), read at once.
fn list(dir: &OwnedFd, path: &Path) -> Result<Vec<(Vec<u8>, Option<Type>)>> {
    let fd = dir.try_clone().map_err(|error| Error::Remove {
        path: path.to_owned(),
        error,
    })?;
    let mut listing = Dir::from_fd(fd).map_err(remove_err(path))?;
    let mut entries = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(remove_err(path))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            entries.push((name.to_vec(), entry.file_type()));
        }
    }
    Ok(entries)
}

fn identity(fd: &OwnedFd, path: &Path) -> Result<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd.as_fd()).map_err(remove_err(path))?;
    Ok((st.st_dev as u64, st.st_ino as u64))
}

/// One directory of the walk.
struct Frame {
    /// Closed for all but the deepest [`MAX_OPEN_DIRS`] frames; reopened through `..` of its
    /// child when the walk comes back to it.
    fd: Option<OwnedFd>,
    /// Its name in its parent.
    name: Vec<u8>,
    /// `(st_dev, st_ino)`, checked when it is reopened through `..`.
    identity: (u64, u64),
    /// Entries not yet removed.
    entries: Vec<(Vec<u8>, Option<Type>)>,
}

/// Reopens a closed directory as the `..` of its (open) child, and makes sure it is the very
/// directory the walk came from (nothing moved it meanwhile).
fn reopen_parent(child: &OwnedFd, expected: (u64, u64), path: &Path) -> Result<OwnedFd> {
    let fd = openat(child.as_fd(), "..", dir_flags(), Mode::empty()).map_err(remove_err(path))?;
    if identity(&fd, path)? != expected {
        return Err(Error::Remove {
            path: path.to_owned(),
            error: std::io::Error::other("the directory was moved during the removal"),
        });
    }
    Ok(fd)
}

/// What a post-order walk does with each entry (children before their directory).
pub(crate) trait PostOrder {
    /// A non-directory entry of `parent` (a symlink is one: it is never followed).
    fn leaf(&mut self, parent: &OwnedFd, name: &OsStr, path: &Path) -> Result<()>;
    /// A directory whose entries were all visited; `dir` is its own fd.
    fn dir_done(
        &mut self,
        parent: &OwnedFd,
        name: &OsStr,
        dir: &OwnedFd,
        path: &Path,
    ) -> Result<()>;
    /// A child directory that cannot be entered (another mount): an error stops the walk, `Ok`
    /// skips that subtree.
    fn cannot_enter(&mut self, err: Error) -> Result<()> {
        Err(err)
    }
}

/// The removal's visitor: unlink everything.
struct Unlink;

impl PostOrder for Unlink {
    fn leaf(&mut self, parent: &OwnedFd, name: &OsStr, path: &Path) -> Result<()> {
        unlinkat(parent.as_fd(), name, UnlinkatFlags::NoRemoveDir).map_err(remove_err(path))
    }

    fn dir_done(
        &mut self,
        parent: &OwnedFd,
        name: &OsStr,
        _dir: &OwnedFd,
        path: &Path,
    ) -> Result<()> {
        unlinkat(parent.as_fd(), name, UnlinkatFlags::RemoveDir).map_err(remove_err(path))
    }
}

/// Empties the directory `dir` (at `path`), depth first, without recursion: a tree as deep as
/// the filesystem allows needs no stack and at most [`MAX_OPEN_DIRS`] fds.
fn remove_children(dir: OwnedFd, path: &Path, guard: &Guard) -> Result<()> {
    walk_post_order(dir, path, guard, &mut Unlink)
}

/// Visits everything beneath `dir` (at `path`), children before their directory, without
/// recursion and with at most [`MAX_OPEN_DIRS`] fds; `dir` itself is not visited.
pub(crate) fn walk_post_order(
    dir: OwnedFd,
    path: &Path,
    guard: &Guard,
    visitor: &mut dyn PostOrder,
) -> Result<()> {
    let mut current = path.to_owned();
    let mut stack = vec![Frame {
        identity: identity(&dir, path)?,
        entries: list(&dir, path)?,
        fd: Some(dir),
        name: Vec::new(),
    }];
    // Frames below this index have their fd closed.
    let mut first_open = 0;
    loop {
        let depth = stack.len();
        let top = stack
            .last_mut()
            .expect("the root frame stays until the end");
        let Some((name, file_type)) = top.entries.pop() else {
            // `top` is empty: unlink it from its parent (reopened if its fd was closed).
            let done = stack.pop().expect("non-empty");
            let parent_index = stack.len().wrapping_sub(1);
            let Some(parent) = stack.last_mut() else {
                return Ok(());
            };
            let child_fd = done.fd.expect("the deepest frame is open");
            if parent.fd.is_none() {
                current.pop();
                parent.fd = Some(reopen_parent(&child_fd, parent.identity, &current)?);
                current.push(OsStr::from_bytes(&done.name));
                first_open = parent_index;
            }
            let parent_fd = parent.fd.as_ref().expect("reopened above");
            visitor.dir_done(
                parent_fd,
                OsStr::from_bytes(&done.name),
                &child_fd,
                &current,
            )?;
            drop(child_fd);
            current.pop();
            continue;
        };
        let fd = top.fd.as_ref().expect("the deepest frame is open");
        let os_name = OsStr::from_bytes(&name);
        // `current` is the child's path while it is worked on (no copy per entry: a deep
        // tree's paths are long).
        current.push(os_name);
        let is_dir = match file_type {
            Some(t) => t == Type::Directory,
            None => nix::sys::stat::fstatat(fd.as_fd(), os_name, AtFlags::AT_SYMLINK_NOFOLLOW)
                .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
                .map_err(remove_err(&current))?,
        };
        if !is_dir {
            visitor.leaf(fd, os_name, &current)?;
            current.pop();
            continue;
        }
        let child_fd = match open_dir(fd, os_name, &current, guard) {
            Ok(child) => child,
            Err(err) => {
                visitor.cannot_enter(err)?;
                current.pop();
                continue;
            }
        };
        let frame = Frame {
            identity: identity(&child_fd, &current)?,
            entries: list(&child_fd, &current)?,
            fd: Some(child_fd),
            name,
        };
        if depth + 1 - first_open > MAX_OPEN_DIRS {
            stack[first_open].fd = None;
            first_open += 1;
        }
        stack.push(frame);
    }
}

/// How a walk refuses to enter another mount: the kernel (`openat2`), or the mount table read
/// now.
pub(crate) fn guard_for(resolver: Resolver) -> Result<Guard> {
    Ok(match resolver {
        Resolver::Openat2 => Guard::Kernel,
        Resolver::Walk => {
            let points: HashSet<PathBuf> = mountinfo::read(Path::new(SELF_MOUNTINFO))?
                .into_iter()
                .map(|m| m.mount_point)
                .collect();
            let longest = points
                .iter()
                .map(|p| p.as_os_str().len())
                .max()
                .unwrap_or(0);
            Guard::MountTable(points, longest)
        }
    })
}

/// Removes `path` and everything beneath it, on its own mount only. A missing path is success.
/// If `path` or anything beneath it is a mount point, the walk stops with
/// [`Error::CrossesMountPoint`] and nothing beneath that mount point is touched.
///
/// ```
/// use rustlet_mount::remove_all_one_filesystem;
///
/// let dir = tempfile::tempdir()?;
/// let tree = dir.path().join("pod");
/// std::fs::create_dir_all(tree.join("volumes/cache"))?;
/// std::fs::write(tree.join("volumes/cache/data"), "x")?;
/// remove_all_one_filesystem(&tree)?; // nothing is mounted beneath it: all of it goes
/// assert!(!tree.exists());
/// remove_all_one_filesystem(&tree)?; // a missing path is success
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
    let guard = guard_for(resolver)?;
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
