//! Change notification for a manifest directory (inotify), as upstream's file source watches
//! `--pod-manifest-path`: a manifest written, renamed into place, touched or removed is read at
//! once instead of at the next periodic scan.
//!
//! The watch only says "something changed"; the reader still scans the directory (which is
//! what decides), and keeps a periodic scan as a safety net ([`DirWatch::period`]: long while
//! the watch works, short when it could not be set up or the directory went away). Events
//! are those that mean a finished change: `IN_CLOSE_WRITE` (a writer closed the file, so a
//! half-written manifest is not read), `IN_MOVED_TO`/`IN_MOVED_FROM` (an editor's rename),
//! `IN_DELETE`, `IN_ATTRIB` (`touch`), and the directory itself going away.
//!
//! A burst also says which names were removed or renamed away in it
//! ([`DirWatch::take_removed`]): a manifest removed and written again within one burst reads
//! the same in the scan, and upstream's file source, which handles each event on its own, saw
//! its pod removed and added again.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tracing::debug;

/// How long the burst of events after a first one may go on before the scan (files written
/// together are read in one scan).
pub const SETTLE: Duration = Duration::from_millis(5);

/// The most a burst delays the scan. Upstream's file source reads each file as its event
/// comes; a burst that goes on is read in scans this far apart (50 ms until issue 29: the
/// agent sat idle through the first 50 ms of a storm while its manifests were written).
pub const SETTLE_AT_MOST: Duration = Duration::from_millis(10);

/// The safety-net scan period while the watch works: upstream's file source re-reads every
/// 20 s (`--file-check-frequency`) besides its inotify watch; a lost event costs at most this.
/// (10 s until issue 15: the scan of 1,000 quiet manifests was a third of the settled
/// agent's idle CPU.)
pub const WATCHED_PERIOD: Duration = Duration::from_secs(20);

/// The most removed names one burst remembers (a directory emptied at once: the scan sees
/// those files gone anyway; only a name removed and written again past this is missed).
pub const MAX_REMOVED: usize = 4096;

struct Fd(Inotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// A watch on one directory; inactive when inotify is unavailable (no instances left) or the
/// directory does not exist, until [`DirWatch::rearm`] succeeds.
pub struct DirWatch {
    dir: PathBuf,
    fd: Option<AsyncFd<Fd>>,
    unwatched_period: Duration,
    /// Events were drained and not yet announced: a [`DirWatch::changed`] dropped while its
    /// burst settled (another `select!` branch won) must not lose them.
    pending: bool,
    /// The names removed or renamed away in the current burst (at most [`MAX_REMOVED`]).
    removed: BTreeSet<OsString>,
}

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatch")
            .field("dir", &self.dir)
            .field("active", &self.is_active())
            .finish()
    }
}

fn flags() -> AddWatchFlags {
    AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

/// The one `unsafe` of the crate: tokio's safe constructors are deprecated (they cannot check
/// the descriptor's lifetime), and its replacement states that contract as `unsafe`.
#[allow(unsafe_code)]
fn register(inotify: Inotify) -> std::io::Result<AsyncFd<Fd>> {
    // SAFETY: `Fd` owns the inotify instance (its `OwnedFd`) for as long as the `AsyncFd`
    // lives, nothing else closes it, and `as_raw_fd` always returns that same descriptor.
    unsafe { AsyncFd::register_with_interest(Fd(inotify), Interest::READABLE) }
        .map_err(std::io::Error::from)
}

impl DirWatch {
    /// Watch `dir` (inside a tokio runtime); `unwatched_period` is the scan period while the
    /// watch is not active.
    pub fn new(dir: impl Into<PathBuf>, unwatched_period: Duration) -> Self {
        let mut watch = Self {
            dir: dir.into(),
            fd: None,
            unwatched_period,
            pending: false,
            removed: BTreeSet::new(),
        };
        watch.rearm();
        watch
    }

    /// The directory watched.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether changes are being announced.
    pub fn is_active(&self) -> bool {
        self.fd.is_some()
    }

    /// The period of the safety-net scan: [`WATCHED_PERIOD`] while active, else the period
    /// given to [`DirWatch::new`].
    pub fn period(&self) -> Duration {
        if self.is_active() {
            WATCHED_PERIOD
        } else {
            self.unwatched_period
        }
    }

    /// Sets the watch up again if it is not active (call after each scan: the directory may
    /// have been created or replaced).
    pub fn rearm(&mut self) {
        if self.fd.is_some() {
            return;
        }
        let armed = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .and_then(|inotify| {
                inotify.add_watch(&self.dir, flags())?;
                Ok(inotify)
            })
            .map_err(std::io::Error::from)
            .and_then(register);
        match armed {
            Ok(fd) => self.fd = Some(fd),
            Err(err) => debug!(
                dir = %self.dir.display(),
                "no inotify watch, scanning every {:?}: {err}",
                self.unwatched_period
            ),
        }
    }

    /// Drains the queued events; `Ok(true)` if any, `Err` when the watch ended (the directory
    /// went away, or the queue overflowed and events were lost).
    fn drain(fd: &AsyncFd<Fd>, removed: &mut BTreeSet<OsString>) -> Result<bool, ()> {
        let mut any = false;
        loop {
            match fd.get_ref().0.read_events() {
                Ok(events) if events.is_empty() => return Ok(any),
                Ok(events) => {
                    for event in events {
                        if event.mask.intersects(
                            AddWatchFlags::IN_IGNORED
                                | AddWatchFlags::IN_DELETE_SELF
                                | AddWatchFlags::IN_MOVE_SELF
                                | AddWatchFlags::IN_Q_OVERFLOW,
                        ) {
                            return Err(());
                        }
                        if event
                            .mask
                            .intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM)
                            && removed.len() < MAX_REMOVED
                            && let Some(name) = event.name
                        {
                            removed.insert(name);
                        }
                    }
                    any = true;
                }
                Err(nix::errno::Errno::EAGAIN) => return Ok(any),
                Err(_) => return Err(()),
            }
        }
    }

    /// Waits for a change, then for its burst to settle ([`SETTLE`] without an event, at most
    /// [`SETTLE_AT_MOST`]). Never returns while inactive. When the watch ends (the directory
    /// went away, events were lost) it returns at once and becomes inactive: scan, then
    /// [`DirWatch::rearm`]. Cancel-safe: a change drained by a call that was dropped is
    /// announced by the next call.
    pub async fn changed(&mut self) {
        let Some(fd) = &self.fd else {
            return std::future::pending().await;
        };
        if !self.pending {
            // A new burst: what the last one removed was taken or is of no interest.
            self.removed.clear();
            loop {
                let Ok(mut ready) = fd.readable().await else {
                    return self.end();
                };
                match Self::drain(fd, &mut self.removed) {
                    Ok(any) => {
                        // Drained to EAGAIN: wait for the next edge.
                        ready.clear_ready();
                        if any {
                            self.pending = true;
                            break;
                        }
                    }
                    Err(()) => return self.end(),
                }
            }
        }
        let deadline = tokio::time::Instant::now() + SETTLE_AT_MOST;
        loop {
            let quiet = tokio::time::Instant::now() + SETTLE;
            let Ok(Ok(mut ready)) =
                tokio::time::timeout_at(quiet.min(deadline), fd.readable()).await
            else {
                break;
            };
            match Self::drain(fd, &mut self.removed) {
                Ok(_) => ready.clear_ready(),
                Err(()) => return self.end(),
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        self.pending = false;
    }

    /// The names removed (`IN_DELETE`) or renamed away (`IN_MOVED_FROM`) in the burst the last
    /// [`DirWatch::changed`] announced, whether or not they exist again; empty after a call.
    pub fn take_removed(&mut self) -> BTreeSet<OsString> {
        std::mem::take(&mut self.removed)
    }

    /// The watch ended (the directory went away, events were lost): announce it (the caller
    /// scans) and stay inactive until [`DirWatch::rearm`].
    fn end(&mut self) {
        debug!(dir = %self.dir.display(), "inotify watch ended; scanning until it is set up again");
        self.pending = false;
        self.fd = None;
    }
}

#[cfg(test)]
mod tests;
