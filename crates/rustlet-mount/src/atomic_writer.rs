//! The atomic writer of content volumes (upstream `pkg/volume/util/atomic_writer.go`, V96-V101):
//! a payload of files is written into a fresh `..<timestamp>` directory, `..data` is switched to
//! it by one `rename(2)`, and every top-level name is a symlink through `..data`, so a reader
//! always sees one complete version.
//!
//! Safer than upstream: every file operation is relative to a directory fd opened with
//! `O_NOFOLLOW`, so a symlink planted in the volume (by a container that can write to it) is
//! never followed: nothing is ever written outside the target directory. The version just
//! replaced is removed at the next call (the next change or periodic SetUp) rather than at
//! once, so a reader resolving a name during an update never meets a vanished directory. A planted entry at a
//! user-visible name is replaced by the writer's own symlink; `..data` pointing anywhere but a
//! `..<timestamp>` sibling is ignored (a first write).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};

use crate::remove::remove_all_one_filesystem;

/// Upstream `maxPathLength`.
pub const MAX_PATH_LENGTH: usize = 4096;
/// Upstream `maxFileNameLength`.
pub const MAX_FILE_NAME_LENGTH: usize = 255;
const DATA_DIR: &str = "..data";
const DATA_DIR_TMP: &str = "..data_tmp";

/// One file of a payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProjection {
    /// The content.
    pub data: Vec<u8>,
    /// The exact mode bits (the umask has no effect).
    pub mode: u32,
    /// The owner, when the volume asks for one.
    pub fs_user: Option<u32>,
}

/// Why a write failed; nothing visible changed unless said otherwise.
#[derive(Debug, thiserror::Error)]
pub enum AtomicWriteError {
    /// The target directory is missing or not a directory (upstream: set up by the wrapper).
    #[error("open the target directory {path}: {source}")]
    OpenTarget {
        /// The target.
        path: PathBuf,
        /// Why.
        source: Errno,
    },
    /// A payload path is not allowed (V97), in upstream's words.
    #[error(transparent)]
    InvalidPath(#[from] InvalidPath),
    /// Two payload paths collide (`a` a file and `a/b` a file).
    #[error("payload paths collide: {0:?} is both a file and a directory")]
    Collision(String),
    /// A file operation failed.
    #[error("{operation} {path:?} in {target}: {source}")]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The path relative to the target.
        path: String,
        /// The target.
        target: PathBuf,
        /// Why.
        source: Errno,
    },
}

/// Why a payload path is refused (V97), each with upstream `validatePath`'s exact wording.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidPath {
    /// The path is empty (upstream quotes it: `""`).
    #[error("invalid path: must not be empty: \"\"")]
    Empty,
    /// The path is absolute.
    #[error("invalid path: must be relative path: {0}")]
    Absolute(String),
    /// The path is longer than [`MAX_PATH_LENGTH`] bytes.
    #[error(
        "invalid path: must be less than or equal to {} characters",
        MAX_PATH_LENGTH
    )]
    TooLong,
    /// An element is `..`.
    #[error("invalid path: must not contain '..': {0}")]
    Backstep(String),
    /// An element is longer than [`MAX_FILE_NAME_LENGTH`] bytes.
    #[error(
        "invalid path: filenames must be less than or equal to {} characters",
        MAX_FILE_NAME_LENGTH
    )]
    FileNameTooLong,
    /// The first element starts with `..`: the writer's own names.
    #[error("invalid path: must not start with '..': {0}")]
    Reserved(String),
    /// Cleaned, the path names the target directory itself (`.`, `./`). Deviation: upstream
    /// accepts it and fails later writing a file over the directory (errata 4); the wording
    /// follows upstream's.
    #[error("invalid path: must name a file, not the volume's directory: {0}")]
    NoFile(String),
}

/// Upstream `validatePath`, on the raw key, its checks in its order: empty, absolute, the
/// length, then each element (`..`, then its length), then a first element starting with `..`.
pub fn validate_path(path: &str) -> Result<(), InvalidPath> {
    if path.is_empty() {
        return Err(InvalidPath::Empty);
    }
    if path.starts_with('/') {
        return Err(InvalidPath::Absolute(path.to_owned()));
    }
    if path.len() > MAX_PATH_LENGTH {
        return Err(InvalidPath::TooLong);
    }
    let elements: Vec<&str> = path.split('/').collect();
    for element in &elements {
        if *element == ".." {
            return Err(InvalidPath::Backstep(path.to_owned()));
        }
        if element.len() > MAX_FILE_NAME_LENGTH {
            return Err(InvalidPath::FileNameTooLong);
        }
    }
    if elements[0].starts_with("..") {
        return Err(InvalidPath::Reserved(path.to_owned()));
    }
    Ok(())
}

/// `filepath.Clean` of a relative path that [`validate_path`] accepted; then checked again, so
/// `./..data` and `.` (upstream quirks, errata 4) are refused.
fn clean(path: &str) -> Result<String, InvalidPath> {
    validate_path(path)?;
    let cleaned: Vec<&str> = path
        .split('/')
        .filter(|e| !e.is_empty() && *e != ".")
        .collect();
    let first = cleaned
        .first()
        .ok_or_else(|| InvalidPath::NoFile(path.to_owned()))?;
    if first.starts_with("..") {
        return Err(InvalidPath::Reserved(path.to_owned()));
    }
    Ok(cleaned.join("/"))
}

/// V97: every path cleaned and validated; no file where another needs a directory.
pub fn validate_payload(
    payload: &BTreeMap<String, FileProjection>,
) -> Result<BTreeMap<String, FileProjection>, AtomicWriteError> {
    let mut out = BTreeMap::new();
    for (path, file) in payload {
        out.insert(clean(path)?, file.clone());
    }
    for path in out.keys() {
        let mut parent = path.as_str();
        while let Some((dir, _)) = parent.rsplit_once('/') {
            if out.contains_key(dir) {
                return Err(AtomicWriteError::Collision(dir.to_owned()));
            }
            parent = dir;
        }
    }
    Ok(out)
}

/// The directories a payload needs (every parent of every path).
fn parents(payload: &BTreeMap<String, FileProjection>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for path in payload.keys() {
        let mut parent = path.as_str();
        while let Some((dir, _)) = parent.rsplit_once('/') {
            out.insert(dir.to_owned());
            parent = dir;
        }
    }
    out
}

/// V99 step 3 (upstream `pathsToRemove`): the old entries (files and directories, relative)
/// that the new payload neither has nor needs as a parent.
pub fn paths_to_remove(
    old: &BTreeSet<String>,
    payload: &BTreeMap<String, FileProjection>,
) -> BTreeSet<String> {
    let needed = parents(payload);
    old.iter()
        .filter(|p| !payload.contains_key(*p) && !needed.contains(*p))
        .cloned()
        .collect()
}

/// Writes payloads into one target directory.
#[derive(Debug)]
pub struct AtomicWriter {
    target: PathBuf,
}

fn open_dir(dir: &impl AsFd, name: &str) -> Result<OwnedFd, Errno> {
    openat(
        dir,
        name,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    )
}

fn lstat_at(dir: &impl AsFd, name: &str) -> Result<FileStat, Errno> {
    fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
}

fn kind(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT
}

/// The entries below `dir` (relative, files and directories), never following a symlink.
fn walk(dir: &OwnedFd, prefix: &str, out: &mut BTreeSet<String>) -> Result<(), Errno> {
    let mut entries = nix::dir::Dir::from_fd(nix::unistd::dup(dir)?)?;
    let names: Vec<String> = entries
        .iter()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().ok().map(str::to_owned))
        .filter(|n| n != "." && n != "..")
        .collect();
    for name in names {
        let relative = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let stat = lstat_at(dir, &name)?;
        out.insert(relative.clone());
        if kind(&stat) == SFlag::S_IFDIR {
            walk(&open_dir(dir, &name)?, &relative, out)?;
        }
    }
    Ok(())
}

/// Reads `path` below `dir`, never following a symlink; `None` if it is not a regular file.
fn read_file(dir: &OwnedFd, path: &str) -> Option<Vec<u8>> {
    let mut current = nix::unistd::dup(dir).ok()?;
    let elements: Vec<&str> = path.split('/').collect();
    let (last, parents) = elements.split_last()?;
    for element in parents {
        current = open_dir(&current, element).ok()?;
    }
    let fd = openat(
        &current,
        *last,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut file = std::fs::File::from(fd);
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut data = Vec::new();
    file.read_to_end(&mut data).ok()?;
    Some(data)
}

static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// `..YYYY_MM_DD_HH_MM_SS.<unique>`, upstream's timestamped directory name (UTC).
fn timestamped_name() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let unique = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    format!(
        "..{year:04}_{month:02}_{day:02}_{:02}_{:02}_{:02}.{}{:09}{unique}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        std::process::id(),
        now.subsec_nanos(),
    )
}

/// A name `..data` may point to: one of the writer's own sibling directories.
fn is_timestamped_name(name: &str) -> bool {
    name.starts_with("..")
        && name != DATA_DIR
        && name != DATA_DIR_TMP
        && name.len() > 2
        && !name.contains('/')
}

impl AtomicWriter {
    /// V96: a writer for an existing directory.
    pub fn new(target: impl Into<PathBuf>) -> Result<Self, AtomicWriteError> {
        let target = target.into();
        let writer = Self { target };
        writer.open_target()?;
        Ok(writer)
    }

    fn open_target(&self) -> Result<OwnedFd, AtomicWriteError> {
        openat(
            AT_FDCWD,
            &self.target,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .map_err(|source| AtomicWriteError::OpenTarget {
            path: self.target.clone(),
            source,
        })
    }

    fn io(&self, operation: &'static str, path: &str) -> impl Fn(Errno) -> AtomicWriteError {
        let (target, path) = (self.target.clone(), path.to_owned());
        move |source| AtomicWriteError::Io {
            operation,
            path: path.clone(),
            target: target.clone(),
            source,
        }
    }

    /// The directory `..data` points to, if it is one of ours.
    fn current(&self, target: &OwnedFd) -> Option<String> {
        let link = readlinkat(target, DATA_DIR).ok()?;
        let name = link.to_str()?.to_owned();
        is_timestamped_name(&name).then_some(name)
    }

    /// V99: writes `payload`; returns whether a new version was written (an unchanged payload
    /// only restores missing user-visible symlinks).
    pub fn write(
        &self,
        payload: &BTreeMap<String, FileProjection>,
    ) -> Result<bool, AtomicWriteError> {
        let payload = validate_payload(payload)?;
        let target = self.open_target()?;
        let old = self.current(&target);
        let old_dir = old.as_deref().and_then(|name| open_dir(&target, name).ok());
        let mut old_paths = BTreeSet::new();
        if let Some(dir) = &old_dir {
            walk(dir, "", &mut old_paths).map_err(self.io("walk", old.as_deref().unwrap_or("")))?;
        }
        let to_remove = paths_to_remove(&old_paths, &payload);
        let changed = match &old_dir {
            None => true,
            Some(dir) => payload
                .iter()
                .any(|(path, file)| read_file(dir, path).as_deref() != Some(&file.data[..])),
        };
        if !changed && to_remove.is_empty() {
            self.user_visible(&target, &payload)?;
            // The version replaced by the last write goes now (see step 11).
            if let Some(current) = old.as_deref() {
                self.remove_versions_except(&target, &[current]);
            }
            return Ok(false);
        }
        let new = timestamped_name();
        mkdirat(&target, new.as_str(), Mode::from_bits_truncate(0o755))
            .map_err(self.io("mkdir", &new))?;
        let new_dir = open_dir(&target, &new).map_err(self.io("open", &new))?;
        fchmod(&new_dir, Mode::from_bits_truncate(0o755)).map_err(self.io("chmod", &new))?;
        if let Err(err) = self.write_files(&new_dir, &payload) {
            let _ = remove_all_one_filesystem(&self.target.join(&new));
            return Err(err);
        }
        // The switch.
        match unlinkat(&target, DATA_DIR_TMP, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(self.io("remove", DATA_DIR_TMP)(e)),
        }
        if let Err(e) = symlinkat(new.as_str(), &target, DATA_DIR_TMP) {
            let _ = remove_all_one_filesystem(&self.target.join(&new));
            return Err(self.io("symlink", DATA_DIR_TMP)(e));
        }
        if let Err(e) = renameat(&target, DATA_DIR_TMP, &target, DATA_DIR) {
            let _ = unlinkat(&target, DATA_DIR_TMP, UnlinkatFlags::NoRemoveDir);
            let _ = remove_all_one_filesystem(&self.target.join(&new));
            return Err(self.io("rename", DATA_DIR)(e));
        }
        self.user_visible(&target, &payload)?;
        // V99 step 10: the top-level names that went.
        for path in to_remove.iter().filter(|p| !p.contains('/')) {
            if self.is_our_link(&target, path) {
                unlinkat(&target, path.as_str(), UnlinkatFlags::NoRemoveDir)
                    .map_err(self.io("remove", path))?;
            }
        }
        // V99 step 11, a little later than upstream: the version just replaced stays until the
        // next call (a change, or the periodic SetUp that finds nothing changed: at most the
        // remount period), so a reader in the middle of resolving `key -> ..data/key` never
        // meets a vanished directory (upstream removes it at once, and such a reader gets
        // ENOENT). Older versions go; an error leaves only an unreachable version behind.
        self.remove_versions_except(&target, &[new.as_str(), old.as_deref().unwrap_or("")]);
        Ok(true)
    }

    fn write_files(
        &self,
        dir: &OwnedFd,
        payload: &BTreeMap<String, FileProjection>,
    ) -> Result<(), AtomicWriteError> {
        for (path, file) in payload {
            let elements: Vec<&str> = path.split('/').collect();
            let (last, parents) = elements.split_last().expect("validated: not empty");
            let mut current = nix::unistd::dup(dir).map_err(self.io("dup", path))?;
            for element in parents {
                match mkdirat(&current, *element, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(self.io("mkdir", path)(e)),
                }
                current = open_dir(&current, element).map_err(self.io("open", path))?;
            }
            let fd = openat(
                &current,
                *last,
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            )
            .map_err(self.io("create", path))?;
            if let Some(user) = file.fs_user {
                nix::unistd::fchown(&fd, Some(nix::unistd::Uid::from_raw(user)), None)
                    .map_err(self.io("chown", path))?;
            }
            let mut handle = std::fs::File::from(fd);
            handle.write_all(&file.data).map_err(|e| {
                self.io("write", path)(Errno::from_raw(e.raw_os_error().unwrap_or(0)))
            })?;
            fchmod(&handle, Mode::from_bits_truncate(file.mode)).map_err(self.io("chmod", path))?;
        }
        Ok(())
    }

    fn remove_versions_except(&self, target: &OwnedFd, keep: &[&str]) {
        let Ok(dup) = nix::unistd::dup(target) else {
            return;
        };
        let Ok(mut entries) = nix::dir::Dir::from_fd(dup) else {
            return;
        };
        let stale: Vec<String> = entries
            .iter()
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().ok().map(str::to_owned))
            .filter(|n| {
                n != "." && n != ".." && is_timestamped_name(n) && !keep.contains(&n.as_str())
            })
            .collect();
        for name in stale {
            if lstat_at(target, &name).is_ok_and(|s| kind(&s) == SFlag::S_IFDIR) {
                let _ = remove_all_one_filesystem(&self.target.join(name));
            }
        }
    }

    fn is_our_link(&self, target: &OwnedFd, name: &str) -> bool {
        readlinkat(target, name)
            .ok()
            .and_then(|l| l.to_str().map(|s| s == format!("{DATA_DIR}/{name}")))
            .unwrap_or(false)
    }

    /// V99 step 9: `<top> -> ..data/<top>` for every top-level element. A planted entry there
    /// (a file or a foreign symlink) is replaced; a planted directory is left (it may hold a
    /// mount) and reported.
    fn user_visible(
        &self,
        target: &OwnedFd,
        payload: &BTreeMap<String, FileProjection>,
    ) -> Result<(), AtomicWriteError> {
        let tops: BTreeSet<&str> = payload
            .keys()
            .map(|p| p.split('/').next().unwrap_or(p))
            .collect();
        for top in tops {
            match lstat_at(target, top) {
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(self.io("stat", top)(e)),
                Ok(_) if self.is_our_link(target, top) => continue,
                Ok(stat) if kind(&stat) == SFlag::S_IFDIR => {
                    return Err(self.io("replace the directory", top)(Errno::EISDIR));
                }
                Ok(_) => unlinkat(target, top, UnlinkatFlags::NoRemoveDir)
                    .map_err(self.io("remove", top))?,
            }
            symlinkat(format!("{DATA_DIR}/{top}").as_str(), target, top)
                .map_err(self.io("symlink", top))?;
        }
        Ok(())
    }

    /// The target directory.
    pub fn target(&self) -> &Path {
        &self.target
    }
}

#[cfg(test)]
mod tests;
