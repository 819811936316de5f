//! Container log rotation as the kubelet's container log manager
//! (`pkg/kubelet/logs/container_log_manager.go`): every `containerLogMonitorInterval`, each
//! running container's log at or above `containerLogMaxSize` is renamed to
//! `<path>.<YYYYMMDD-HHMMSS>` and the runtime reopens a new one (CRI `ReopenContainerLog`);
//! older rotated files are gzipped, and at most `containerLogMaxFiles - 2` of them are kept.
//!
//! Deviations: upstream's listing only fills a de-duplicating work queue that
//! `containerLogMaxWorkers` workers drain; here each pass lists and then processes its containers,
//! at most `containerLogMaxWorkers` at once, and the next pass waits until this one is done
//! (the same bound: no container is processed twice at once, and never more than that many
//! files are rotated or compressed at a time). The rotated file's suffix is in UTC (upstream
//! formats the local time, which is UTC on most nodes).

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use flate2::{Compression, write::GzEncoder};
use k8s_openapi::jiff::{Timestamp, tz::TimeZone};

use super::reader::StatusError;

/// upstream: `compressSuffix`.
const COMPRESS_SUFFIX: &str = ".gz";
/// upstream: `tmpSuffix`.
const TMP_SUFFIX: &str = ".tmp";

/// upstream: `LogRotatePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRotatePolicy {
    /// `containerLogMaxSize` in bytes: a log this large is rotated.
    pub max_size: u64,
    /// `containerLogMaxFiles`: the live file and the rotated ones together (more than 1).
    pub max_files: usize,
}

impl Default for LogRotatePolicy {
    /// The kubelet's defaults: 10 Mi and 5 files.
    fn default() -> Self {
        Self {
            max_size: 10 * 1024 * 1024,
            max_files: 5,
        }
    }
}

impl LogRotatePolicy {
    /// upstream: `NewContainerLogManager`'s check: `MaxFiles` must be more than 1.
    pub fn new(max_size: u64, max_files: usize) -> Result<Self, RotationError> {
        if max_files <= 1 {
            return Err(RotationError::InvalidMaxFiles(max_files));
        }
        Ok(Self {
            max_size,
            max_files,
        })
    }
}

/// A running container and its CRI log path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerLog {
    /// The CRI container ID.
    pub id: String,
    /// Its `ContainerStatus.log_path`.
    pub log_path: PathBuf,
}

/// What rotation needs from the runtime; the binary implements it over the CRI.
#[async_trait::async_trait]
pub trait LogRuntime: Send + Sync {
    /// The running containers and their log paths (upstream: `ListContainers`, only
    /// `CONTAINER_RUNNING` ones, then `ContainerStatus` for the path).
    async fn running_container_logs(&self) -> Result<Vec<ContainerLog>, StatusError>;
    /// CRI `ReopenContainerLog`: the runtime closes the file it writes and creates a new one.
    async fn reopen_container_log(&self, id: &str) -> Result<(), StatusError>;
}

/// The wall clock that names rotated files.
pub trait WallClock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let secs = i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX);
        Timestamp::new(secs, since_epoch.subsec_nanos() as i32).unwrap_or(Timestamp::UNIX_EPOCH)
    }
}

/// Why a rotation failed (each names the operation and the file).
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    /// upstream: "invalid MaxFiles %d, must be > 1".
    #[error("invalid MaxFiles {0}, must be > 1")]
    InvalidMaxFiles(usize),
    /// Listing the running containers.
    #[error("failed to list containers")]
    ListContainers(#[source] StatusError),
    /// `ReopenContainerLog`.
    #[error("failed to reopen container log {id:?}")]
    Reopen {
        /// The container.
        id: String,
        /// The cause.
        #[source]
        source: StatusError,
    },
    /// A file operation.
    #[error("failed to {operation} {path:?}")]
    File {
        /// What was being done.
        operation: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Renaming the live file.
    #[error("failed to rotate log {from:?} to {to:?}")]
    Rename {
        /// The live file.
        from: PathBuf,
        /// The rotated name.
        to: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A blocking file task panicked or was cancelled.
    #[error("the log rotation file task of {path:?} did not finish")]
    Task {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: tokio::task::JoinError,
    },
}

fn file_err(
    operation: &'static str,
    path: &Path,
) -> impl FnOnce(io::Error) -> RotationError + use<> {
    let path = path.to_path_buf();
    move |source| RotationError::File {
        operation,
        path,
        source,
    }
}

/// The manager's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerLogManagerConfig {
    /// When and how much to keep.
    pub policy: LogRotatePolicy,
    /// `containerLogMonitorInterval` (10 s).
    pub monitor_interval: Duration,
    /// `containerLogMaxWorkers` (1): containers processed at once.
    pub max_workers: usize,
}

impl Default for ContainerLogManagerConfig {
    fn default() -> Self {
        Self {
            policy: LogRotatePolicy::default(),
            monitor_interval: Duration::from_secs(10),
            max_workers: 1,
        }
    }
}

/// upstream: `containerLogManager`.
pub struct ContainerLogManager<R, C = SystemClock> {
    runtime: R,
    clock: C,
    config: ContainerLogManagerConfig,
}

impl<R: LogRuntime> ContainerLogManager<R> {
    /// A manager over `runtime` with the system clock.
    pub fn new(runtime: R, config: ContainerLogManagerConfig) -> Self {
        Self {
            runtime,
            clock: SystemClock,
            config,
        }
    }
}

impl<R: LogRuntime, C: WallClock> ContainerLogManager<R, C> {
    /// The same manager naming rotated files by `clock`.
    pub fn with_clock<C2: WallClock>(self, clock: C2) -> ContainerLogManager<R, C2> {
        ContainerLogManager {
            runtime: self.runtime,
            clock,
            config: self.config,
        }
    }

    /// Rotates every `monitor_interval`, first at once (upstream: `Start`, `wait.Forever`).
    /// Runs until the task is dropped; a failed pass is logged and the next one tries again.
    pub async fn run(&self) {
        let mut ticks = tokio::time::interval(self.config.monitor_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(error) = self.rotate_logs().await {
                tracing::error!(%error, "failed to rotate container logs");
            }
        }
    }

    /// One pass over the running containers (upstream: `rotateLogs` and `processContainer`),
    /// at most `max_workers` at once. A container's failure is logged and the others go on.
    pub async fn rotate_logs(&self) -> Result<(), RotationError> {
        use futures::StreamExt as _;

        let containers = self
            .runtime
            .running_container_logs()
            .await
            .map_err(RotationError::ListContainers)?;
        futures::stream::iter(containers)
            .for_each_concurrent(self.config.max_workers.max(1), |c| async move {
                if let Err(error) = self.process_container(&c).await {
                    tracing::error!(%error, container_id = %c.id, path = %c.log_path.display(), "failed to rotate the container's log");
                }
            })
            .await;
        Ok(())
    }

    /// upstream: `processContainer`: a missing live file is reopened first; one under
    /// `max_size` is left alone.
    async fn process_container(&self, c: &ContainerLog) -> Result<(), RotationError> {
        let size = match tokio::fs::metadata(&c.log_path).await {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.reopen(&c.id).await?;
                tokio::fs::metadata(&c.log_path)
                    .await
                    .map_err(file_err("stat after reopen", &c.log_path))?
                    .len()
            }
            Err(e) => return Err(file_err("stat", &c.log_path)(e)),
        };
        if size < self.config.policy.max_size {
            return Ok(());
        }
        self.rotate_log(&c.id, &c.log_path).await
    }

    async fn reopen(&self, id: &str) -> Result<(), RotationError> {
        self.runtime
            .reopen_container_log(id)
            .await
            .map_err(|source| RotationError::Reopen {
                id: id.to_owned(),
                source,
            })
    }

    /// upstream: `rotateLog`: clean up, drop the excess, compress, then rotate the live file.
    async fn rotate_log(&self, id: &str, log: &Path) -> Result<(), RotationError> {
        let policy = self.config.policy;
        let path = log.to_path_buf();
        tokio::task::spawn_blocking(move || -> Result<(), RotationError> {
            let logs = rotated_logs(&path)?;
            let logs = cleanup_unused_logs(logs)?;
            let logs = remove_excess_logs(logs, policy.max_files)?;
            for l in logs.iter().filter(|l| !has_suffix(l, COMPRESS_SUFFIX)) {
                compress_log(l)?;
            }
            Ok(())
        })
        .await
        .map_err(|source| RotationError::Task {
            path: log.to_path_buf(),
            source,
        })??;
        self.rotate_latest_log(id, log).await
    }

    /// upstream: `rotateLatestLog`: rename, reopen; if the reopen fails, rename back so the next
    /// pass tries again.
    async fn rotate_latest_log(&self, id: &str, log: &Path) -> Result<(), RotationError> {
        let rotated = rotated_name(log, self.clock.now());
        tokio::fs::rename(log, &rotated)
            .await
            .map_err(|source| RotationError::Rename {
                from: log.to_path_buf(),
                to: rotated.clone(),
                source,
            })?;
        if let Err(e) = self.reopen(id).await {
            if let Err(error) = tokio::fs::rename(&rotated, log).await {
                // upstream: "This shouldn't happen": the original log is lost to the reader.
                tracing::error!(%error, rotated = %rotated.display(), log = %log.display(), container_id = id, "failed to rename the rotated log back");
            }
            return Err(e);
        }
        Ok(())
    }
}

/// upstream: `Clean`: removes the container's live and rotated logs (`<log_path>*`).
pub async fn clean_logs(log_path: &Path) -> Result<(), RotationError> {
    let path = log_path.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<(), RotationError> {
        for l in matching(&path, "")? {
            match std::fs::remove_file(&l) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(file_err("remove container log", &l)(e));
                }
                _ => {}
            }
        }
        Ok(())
    })
    .await
    .map_err(|source| RotationError::Task {
        path: log_path.to_path_buf(),
        source,
    })?
}

/// `<log>.<YYYYMMDD-HHMMSS>` (upstream: `timestampFormat`, `20060102-150405`).
pub fn rotated_name(log: &Path, now: Timestamp) -> PathBuf {
    let dt = TimeZone::UTC.to_datetime(now);
    let mut name = log.as_os_str().to_owned();
    name.push(format!(
        ".{:04}{:02}{:02}-{:02}{:02}{:02}",
        dt.year(),
        dt.month(),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second()
    ));
    PathBuf::from(name)
}

fn has_suffix(p: &Path, suffix: &str) -> bool {
    p.as_os_str()
        .as_encoded_bytes()
        .ends_with(suffix.as_bytes())
}

/// The files of `log`'s directory whose names start with `log`'s name and `extra`, sorted
/// (Go's `filepath.Glob("<log><extra>*")`).
fn matching(log: &Path, extra: &str) -> Result<Vec<PathBuf>, RotationError> {
    let dir = log.parent().unwrap_or(Path::new("."));
    let Some(name) = log.file_name() else {
        return Ok(Vec::new());
    };
    let mut prefix = name.as_encoded_bytes().to_vec();
    prefix.extend_from_slice(extra.as_bytes());
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(file_err("list the log directory", dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(file_err("list the log directory", dir))?;
        if entry.file_name().as_encoded_bytes().starts_with(&prefix) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// The rotated files of `log` (`<log>.*`).
fn rotated_logs(log: &Path) -> Result<Vec<PathBuf>, RotationError> {
    matching(log, ".")
}

/// upstream: `isInUse`: temporary files are not; compressed ones are; an uncompressed one whose
/// `.gz` exists is not (the compression finished but the removal did not).
fn is_in_use(l: &Path, logs: &[PathBuf]) -> bool {
    if has_suffix(l, TMP_SUFFIX) {
        return false;
    }
    if has_suffix(l, COMPRESS_SUFFIX) {
        return true;
    }
    let mut gz = l.as_os_str().to_owned();
    gz.push(COMPRESS_SUFFIX);
    !logs.iter().any(|other| other.as_os_str() == gz)
}

/// upstream: `filterUnusedLogs`: (in use, unused).
pub fn filter_unused_logs(logs: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    logs.iter().cloned().partition(|l| is_in_use(l, logs))
}

/// upstream: `cleanupUnusedLogs`: removes the leftovers of an interrupted rotation.
fn cleanup_unused_logs(logs: Vec<PathBuf>) -> Result<Vec<PathBuf>, RotationError> {
    let (in_use, unused) = filter_unused_logs(&logs);
    for l in &unused {
        std::fs::remove_file(l).map_err(file_err("remove unused log", l))?;
    }
    Ok(in_use)
}

/// upstream: `removeExcessLogs`: keeps the newest `max_files - 2` rotated files (the live one
/// and the one about to be rotated make up the rest), removing the oldest first so that an
/// ongoing read of a newer one is not broken.
fn remove_excess_logs(
    mut logs: Vec<PathBuf>,
    max_files: usize,
) -> Result<Vec<PathBuf>, RotationError> {
    logs.sort();
    let max_rotated = max_files.saturating_sub(2);
    let excess = logs.len().saturating_sub(max_rotated);
    for l in &logs[..excess] {
        std::fs::remove_file(l).map_err(file_err("remove old log", l))?;
    }
    Ok(logs.split_off(excess))
}

/// upstream: `compressLog`: `log` → `log.tmp` (gzip, the same mode) → `log.gz`, then `log` is
/// removed. The temporary file is removed whatever happens.
fn compress_log(log: &Path) -> Result<(), RotationError> {
    let mut tmp = log.as_os_str().to_owned();
    tmp.push(TMP_SUFFIX);
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let mode = std::fs::metadata(log)
            .map_err(file_err("stat log file", log))?
            .permissions();
        let mut r = std::fs::File::open(log).map_err(file_err("open log", log))?;
        let f = std::fs::File::create(&tmp).map_err(file_err("create temporary log", &tmp))?;
        f.set_permissions(mode)
            .map_err(file_err("set the mode of temporary log", &tmp))?;
        let mut w = GzEncoder::new(f, Compression::default());
        io::copy(&mut r, &mut w).map_err(file_err("compress log into", &tmp))?;
        w.finish()
            .map_err(file_err("finish compressing into", &tmp))?;
        let mut gz = log.as_os_str().to_owned();
        gz.push(COMPRESS_SUFFIX);
        let gz = PathBuf::from(gz);
        std::fs::rename(&tmp, &gz).map_err(file_err("rename the compressed log to", &gz))?;
        std::fs::remove_file(log).map_err(file_err("remove log after compress", log))
    })();
    // Best effort cleanup of the temporary file (gone already after a successful rename).
    let _ = std::fs::remove_file(&tmp);
    result
}

#[cfg(test)]
mod tests;
