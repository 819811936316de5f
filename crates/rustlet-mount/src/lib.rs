//! rustlet-mount: a careful Linux mount library.
//!
//! Mount, bind, read-only bind, tmpfs, unmount and making a directory an `rshared` mount
//! (upstream `MakeRShared`) through direct `mount(2)`/`umount2(2)` calls (sys-mount, nix); the
//! mount table from `/proc/self/mountinfo`; mount-point checks; path operations beneath a
//! root; and a removal that never crosses a mount point. It mirrors
//! upstream `k8s.io/mount-utils` and `pkg/volume/util/subpath`, without exec-ing `mount(8)`.
//!
//! # Guarantees
//!
//! * **Symlinks.** [`safe_path`] never follows a symlink beneath the root it is given, and
//!   refuses absolute paths and `..` before any system call; what it opens is returned as an fd,
//!   and [`LinuxMounter::bind_fd`] mounts that fd (`/proc/self/fd/N`), so a symlink swapped in
//!   after the check cannot redirect a mount.
//! * **Mount points.** [`remove::remove_all_one_filesystem`] stops at the first mount point it
//!   meets (same-filesystem bind mounts included) and touches nothing beneath it;
//!   [`LinuxMounter::cleanup_mount_point`] unmounts and then removes only an empty directory.
//! * **Secrets.** [`SensitiveOptions`] reach the kernel but never a log line or a `Debug`.
//! * **Content.** [`atomic_writer`] and [`ownership`] work only through directory fds opened
//!   without following symlinks: a volume's own (hostile) content never leads a write, a chown
//!   or a chmod outside it, and their walks are iterative with a bounded number of fds.
//! * **Errors** say which operation failed, on which path, with which errno, and whether a
//!   retry can help ([`Error::is_retryable`]).
//!
//! # Boundaries
//!
//! Usable alone: no Kubernetes types in the API, and no dependency on any other workspace crate
//! (`rustlet-volume` depends on this crate and adapts it to its `Mounter` trait). The
//! [`fake::FakeMounter`] behind the `test-util` feature offers the same operations in memory.
//!
//! `unsafe` is denied: every system call goes through sys-mount or nix.

pub mod atomic_writer;
pub mod error;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod mounter;
pub mod mountinfo;
pub mod options;
pub mod ownership;
pub mod remove;
pub mod safe_path;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;

#[cfg(test)]
mod tests;

pub use error::{Error, Result, is_corrupted_mount_errno};
pub use mounter::{
    BindAccess, LinuxMounter, MountPointCheck, MountRequest, TmpfsOptions, UnmountMode,
};
pub use mountinfo::MountInfo;
pub use options::SensitiveOptions;
pub use remove::remove_all_one_filesystem;
pub use safe_path::{
    OpenKind, Resolver, Subpath, create_dir_all_beneath, open_beneath, prepare_subpath,
};

/// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
