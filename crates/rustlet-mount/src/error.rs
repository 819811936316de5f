//! The crate's error type: which operation failed, on which path, with which errno, and
//! whether retrying can help.

use std::io;
use std::path::PathBuf;

use nix::errno::Errno;

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A failed mount-library operation. Every variant names the operation and the path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `mount(2)` failed. Retryable when the errno is transient (EBUSY, EAGAIN, EINTR).
    #[error("mount of {source_name:?} on {target} (type {fstype}) failed: {error}")]
    Mount {
        /// Mount source (device, directory or pseudo name).
        source_name: String,
        /// Mount point.
        target: PathBuf,
        /// Filesystem type.
        fstype: String,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// The remount that applies options to a bind mount failed; the bind was undone.
    #[error("remount of bind mount {target} with {flags} failed: {error}")]
    Remount {
        /// Mount point.
        target: PathBuf,
        /// The flags asked for, as text.
        flags: String,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// `umount2(2)` failed. EBUSY is retryable (or use a lazy unmount).
    #[error("unmount of {target} failed: {error}")]
    Unmount {
        /// Mount point.
        target: PathBuf,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// A `stat`-like call failed.
    #[error("stat of {path} failed: {error}")]
    Stat {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// Reading the mount table failed.
    #[error("reading {path} failed: {error}")]
    ReadMountInfo {
        /// The mountinfo file.
        path: PathBuf,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// A mountinfo line did not parse. Not retryable.
    #[error("mountinfo line {line}: {reason}")]
    ParseMountInfo {
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        reason: String,
    },
    /// Opening a path beneath a root failed (including a symlink or `..` that would leave the
    /// root: the kernel answers ELOOP or EXDEV, the walk answers ELOOP).
    #[error("opening {path} beneath {root} failed: {error}")]
    OpenBeneath {
        /// The root the path must stay under.
        root: PathBuf,
        /// The path relative to the root.
        path: PathBuf,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// A relative path was required and this one is absolute, empty or climbs with `..`.
    #[error("path {path} is not a plain relative path: {reason}")]
    InvalidPath {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: &'static str,
    },
    /// A path resolved outside the base it must stay in.
    #[error("subpath {path} not within volume path {base}")]
    NotWithinBase {
        /// The resolved path.
        path: PathBuf,
        /// The base.
        base: PathBuf,
    },
    /// Removing a file or directory failed.
    #[error("removing {path} failed: {error}")]
    Remove {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// A recursive removal met a mount point and stopped there; nothing beneath it was touched.
    /// Retryable once the mount is gone.
    #[error("refusing to remove {path}: it is a mount point (removal never crosses a mount point)")]
    CrossesMountPoint {
        /// The mount point found.
        path: PathBuf,
    },
    /// A mount point was still mounted after unmounting it. Retryable.
    #[error("failed to unmount path {path}")]
    StillMounted {
        /// The path.
        path: PathBuf,
    },
    /// Creating a directory or file failed.
    #[error("creating {path} failed: {error}")]
    Create {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        error: io::Error,
    },
}

impl Error {
    /// The errno behind this error, if it came from the OS.
    pub fn errno(&self) -> Option<Errno> {
        let io = match self {
            Self::Mount { error, .. }
            | Self::Remount { error, .. }
            | Self::Unmount { error, .. }
            | Self::Stat { error, .. }
            | Self::ReadMountInfo { error, .. }
            | Self::OpenBeneath { error, .. }
            | Self::Remove { error, .. }
            | Self::Create { error, .. } => error,
            _ => return None,
        };
        io.raw_os_error().map(Errno::from_raw)
    }

    /// True when the same call may succeed later without anyone fixing the input.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::CrossesMountPoint { .. } | Self::StillMounted { .. } => true,
            Self::ParseMountInfo { .. } | Self::InvalidPath { .. } | Self::NotWithinBase { .. } => {
                false
            }
            _ => {
                matches!(
                    self.errno(),
                    Some(Errno::EBUSY | Errno::EAGAIN | Errno::EINTR | Errno::ETIMEDOUT)
                ) || self.is_corrupted_mount()
            }
        }
    }

    /// True when the errno says the mount behind the path is broken (upstream
    /// `IsCorruptedMnt`): ENOTCONN, ESTALE, EIO, EACCES, EHOSTDOWN, EWOULDBLOCK, ENODEV.
    pub fn is_corrupted_mount(&self) -> bool {
        self.errno().is_some_and(is_corrupted_mount_errno)
    }

    /// True for "not found" (ENOENT).
    pub fn is_not_found(&self) -> bool {
        self.errno() == Some(Errno::ENOENT)
    }
}

/// Upstream `IsCorruptedMnt` on an errno.
pub fn is_corrupted_mount_errno(errno: Errno) -> bool {
    matches!(
        errno,
        Errno::ENOTCONN
            | Errno::ESTALE
            | Errno::EIO
            | Errno::EACCES
            | Errno::EHOSTDOWN
            | Errno::EWOULDBLOCK
            | Errno::ENODEV
    )
}

pub(crate) fn io_err(errno: Errno) -> io::Error {
    io::Error::from_raw_os_error(errno as i32)
}
