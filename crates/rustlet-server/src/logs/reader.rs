//! Reading a container's log file into one writer: tail, since, limit, timestamps, stream
//! filtering, and `follow` until the container stops (upstream: `ReadLogs`, `waitLogs`,
//! `findTailLineStartIndex` in cri-client's `logs.go` and `tail.go`).
//!
//! Memory is bounded by [`ReaderConfig::buffer_size`] however large the file and its lines:
//! a file line longer than the buffer is sent in pieces (the first carries the CRI header), so
//! nothing ever holds a whole line. Upstream reads each line whole (`ReadBytes('\n')`).

use std::io::SeekFrom;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use inotify::{EventStream, Inotify, WatchMask};
use tokio::fs::File;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWrite, AsyncWriteExt};

use super::options::{LogOptions, StreamSelection};
use super::parse::{LogFormat, LogStreamType, ParseLogError, parse_cri_log, parse_docker_json_log};
use super::time::LogTime;

/// The boxed error a [`ContainerRunning`] check may return.
pub type StatusError = Box<dyn std::error::Error + Send + Sync>;

/// "Is the container still running?", asked each time a follow reaches the end of the file
/// (upstream: `isContainerRunning`, a CRI `ContainerStatus` call). The binary implements it over
/// the CRI.
#[async_trait::async_trait]
pub trait ContainerRunning: Send + Sync {
    /// `Ok(false)` ends the follow after one last read to the end of the file.
    async fn is_running(&self) -> Result<bool, StatusError>;
}

/// How the reader reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderConfig {
    /// The one read buffer's size, the most of the file held at once (at least 4 KiB).
    pub buffer_size: usize,
    /// A follow re-reads this often even without an inotify event (upstream:
    /// `logForceCheckPeriod`, 1 s).
    pub recheck_period: Duration,
    /// Whether a follow also watches the directory with inotify.
    pub watch: WatchMode,
}

/// How a follow waits for new bytes.
///
/// Deviation: upstream fails the read when it cannot create its fsnotify watcher or after five
/// watch errors; here the follow goes on with the re-check alone (a node past its inotify
/// instance limit still serves `kubectl logs -f`, one second late at most).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WatchMode {
    /// inotify on the log's directory, plus the re-check (upstream's way).
    #[default]
    Inotify,
    /// The re-check alone (for file systems without inotify).
    PollOnly,
}

impl Default for ReaderConfig {
    fn default() -> Self {
        Self {
            buffer_size: 64 * 1024,
            recheck_period: Duration::from_secs(1),
            watch: WatchMode::Inotify,
        }
    }
}

/// The smallest buffer: a CRI header (timestamp, stream, tags) always fits in it.
pub const MIN_BUFFER_SIZE: usize = 4096;

/// The block size of the backward scan for `tailLines` (upstream: `blockSize`, 1 KiB; 8 KiB
/// here for fewer reads, still bounded).
const TAIL_BLOCK_SIZE: u64 = 8192;

/// What a read did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Bytes written to the output.
    pub bytes_written: u64,
    /// The most file bytes held in the buffer at once.
    pub peak_buffered: usize,
    /// The buffer's capacity (it never grows).
    pub buffer_capacity: usize,
    /// How many times the file at the path was found re-created and reopened.
    pub reopened: u32,
}

/// Why reading a log failed (each names the operation and the path).
#[derive(Debug, thiserror::Error)]
pub enum ReadLogsError {
    /// upstream: "failed to try resolving symlinks in path".
    #[error("resolving symlinks in log path {path:?}")]
    ResolvePath {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Opening, seeking or reading the file.
    #[error("{operation} log file {path:?}")]
    File {
        /// What was being done.
        operation: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The first line is in no known format (upstream: "failed to get parse function").
    #[error("choosing the parse function for log file {path:?}")]
    Format {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: ParseLogError,
    },
    /// Writing to the output.
    #[error("writing the log of {path:?} to the client")]
    Write {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The container status check failed (upstream: `ContainerStatus`'s error ends the follow).
    #[error("checking whether the container of log {path:?} is running")]
    ContainerStatus {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: StatusError,
    },
}

/// upstream: `findTailLineStartIndex`: the offset of the start of the last `n` lines, reading
/// backwards block by block. An incomplete last line (no `\n`) is not counted.
pub async fn find_tail_line_start_index(f: &mut File, n: u64) -> std::io::Result<u64> {
    let size = f.seek(SeekFrom::End(0)).await?;
    let mut buf = vec![0u8; TAIL_BLOCK_SIZE as usize];
    let mut left = size;
    let mut len = 0usize;
    let mut cnt = 0u64;
    let mut right = size;
    while right > 0 && cnt <= n {
        left = right.saturating_sub(TAIL_BLOCK_SIZE);
        len = (right - left) as usize;
        f.seek(SeekFrom::Start(left)).await?;
        f.read_exact(&mut buf[..len]).await?;
        cnt += buf[..len].iter().filter(|&&c| c == b'\n').count() as u64;
        right = left;
    }
    let mut block = &buf[..len];
    while cnt > n {
        let idx = block
            .iter()
            .position(|&c| c == b'\n')
            .map_or(block.len(), |i| i + 1);
        block = &block[idx..];
        left += idx as u64;
        cnt -= 1;
    }
    Ok(left)
}

/// Where the current file line is.
#[derive(Debug, Clone, Copy)]
enum LineState {
    /// The next bytes start a file line.
    Start,
    /// Inside a file line longer than the buffer: its header was parsed from the first piece.
    Inside {
        time: LogTime,
        stream: LogStreamType,
        partial: bool,
    },
    /// Inside a file line that did not parse: dropped up to its `\n`.
    Skipping,
}

/// One piece of a file line handed to the writer.
struct Piece<'a> {
    bytes: &'a [u8],
    /// It ends the file line (it ends with `\n`, or it is the last bytes before the end).
    ends_line: bool,
}

/// What reading to the end of the available bytes found.
enum Pass {
    /// At the end of the file; more may come.
    Eof,
    /// `tailLines` or `limitBytes` is reached: the read is over.
    Done,
}

/// Whether to go on after a piece.
enum Flow {
    /// Go on.
    More,
    /// `limitBytes` is reached.
    Done,
}

/// upstream: `logWriter`: since, timestamps, limitBytes, and (here) the stream filter.
struct LogWriter<'w, W> {
    out: &'w mut W,
    options: LogOptions,
    remain: Option<u64>,
    is_new_line: bool,
    written: u64,
}

impl<W: AsyncWrite + Unpin> LogWriter<'_, W> {
    /// upstream: `logWriter.write`. Returns `false` when `limitBytes` is reached.
    ///
    /// Deviation: a line of the stream not asked for (`stream=Stdout|Stderr`) is neither
    /// written nor counted against `limitBytes`.
    async fn write(
        &mut self,
        time: LogTime,
        stream: LogStreamType,
        content: &[u8],
    ) -> std::io::Result<bool> {
        let add_prefix = self.is_new_line;
        self.is_new_line = content.last().is_none_or(|&c| c == b'\n');
        if self.options.since.is_some_and(|since| time.instant < since) {
            return Ok(true);
        }
        let wanted = match self.options.stream {
            StreamSelection::All => true,
            StreamSelection::Stdout => stream == LogStreamType::Stdout,
            StreamSelection::Stderr => stream == LogStreamType::Stderr,
        };
        if !wanted {
            return Ok(true);
        }
        let prefix = if self.options.timestamps && add_prefix {
            format!("{time} ")
        } else {
            String::new()
        };
        let mut budget = self.remain.unwrap_or(u64::MAX);
        for part in [prefix.as_bytes(), content] {
            let n = part
                .len()
                .min(usize::try_from(budget).unwrap_or(usize::MAX));
            if n > 0 {
                self.out.write_all(&part[..n]).await?;
            }
            budget -= n as u64;
            self.written += n as u64;
        }
        if let Some(remain) = &mut self.remain {
            *remain = budget;
            if budget == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The open file and its read buffer.
struct Source {
    file: File,
    inode: (u64, u64),
    buf: Vec<u8>,
    start: usize,
    end: usize,
    peak: usize,
    /// Bytes read from the file so far.
    read_total: u64,
}

impl Source {
    async fn open(path: &Path, capacity: usize) -> std::io::Result<Self> {
        let file = File::open(path).await?;
        let meta = file.metadata().await?;
        Ok(Self {
            file,
            inode: (meta.dev(), meta.ino()),
            buf: vec![0; capacity],
            start: 0,
            end: 0,
            peak: 0,
            read_total: 0,
        })
    }

    /// The next piece: up to and including a `\n`, or a full buffer. `None`: read more.
    fn next_piece(&mut self) -> Option<(usize, usize, bool)> {
        let pending = &self.buf[self.start..self.end];
        if let Some(i) = pending.iter().position(|&c| c == b'\n') {
            let range = (self.start, self.start + i + 1, true);
            self.start += i + 1;
            return Some(range);
        }
        if pending.len() == self.buf.len() {
            let range = (self.start, self.end, false);
            self.start = self.end;
            return Some(range);
        }
        None
    }

    /// Reads more bytes after the pending ones. `Ok(0)`: end of file.
    async fn fill(&mut self) -> std::io::Result<usize> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let n = self.file.read(&mut self.buf[self.end..]).await?;
        self.end += n;
        self.peak = self.peak.max(self.end - self.start);
        self.read_total += n as u64;
        Ok(n)
    }

    /// Takes the pending bytes of an incomplete last line.
    fn take_pending(&mut self) -> Option<(usize, usize)> {
        (self.start < self.end).then(|| {
            let r = (self.start, self.end);
            self.start = self.end;
            r
        })
    }
}

/// Reads one container log file (upstream: `ReadLogs`).
#[derive(Debug, Clone)]
pub struct LogReader {
    path: PathBuf,
    options: LogOptions,
    config: ReaderConfig,
}

impl LogReader {
    /// A reader of the log at `path` with `options` and the default [`ReaderConfig`].
    pub fn new(path: impl Into<PathBuf>, options: LogOptions) -> Self {
        Self {
            path: path.into(),
            options,
            config: ReaderConfig::default(),
        }
    }

    /// The same reader with `config` (the buffer is at least [`MIN_BUFFER_SIZE`]).
    pub fn with_config(mut self, config: ReaderConfig) -> Self {
        self.config = ReaderConfig {
            buffer_size: config.buffer_size.max(MIN_BUFFER_SIZE),
            ..config
        };
        self
    }

    /// Writes the log to `out` as the options ask; with `follow`, keeps writing as the file
    /// grows (and after it is re-created) until `running` says the container stopped. The
    /// output is flushed before every wait, so a chunked HTTP body sends what it has. Dropping
    /// the future ends the read (the HTTP layer drops it when the client goes away; upstream
    /// watches its context).
    pub async fn read_logs<W: AsyncWrite + Unpin>(
        &self,
        running: &dyn ContainerRunning,
        out: &mut W,
    ) -> Result<ReadStats, ReadLogsError> {
        // upstream: "explicitly resolve symlinks before reading the logs".
        let path = tokio::fs::canonicalize(&self.path)
            .await
            .map_err(|source| ReadLogsError::ResolvePath {
                path: self.path.clone(),
                source,
            })?;
        let file_err = |operation, path: &Path| {
            let path = path.to_path_buf();
            move |source| ReadLogsError::File {
                operation,
                path,
                source,
            }
        };
        let mut src = Source::open(&path, self.config.buffer_size)
            .await
            .map_err(file_err("opening", &path))?;
        if let Some(tail) = self.options.tail {
            let start = find_tail_line_start_index(&mut src.file, tail)
                .await
                .map_err(file_err("tailing", &path))?;
            src.file
                .seek(SeekFrom::Start(start))
                .await
                .map_err(file_err("seeking", &path))?;
        }
        let mut pump = Pump {
            path: &path,
            format: None,
            state: LineState::Start,
            // upstream: limitedMode := (opts.tail >= 0) && (!opts.follow)
            lines_left: self.options.tail.filter(|_| !self.options.follow),
            writer: LogWriter {
                out,
                options: self.options.clone(),
                remain: self.options.bytes,
                is_new_line: true,
                written: 0,
            },
        };
        let mut stats = ReadStats {
            buffer_capacity: src.buf.capacity(),
            ..ReadStats::default()
        };
        let result = self
            .pump_all(&path, &mut src, &mut pump, running, &mut stats)
            .await;
        stats.bytes_written = pump.writer.written;
        stats.peak_buffered = stats.peak_buffered.max(src.peak);
        pump.writer
            .out
            .flush()
            .await
            .map_err(|source| ReadLogsError::Write {
                path: path.clone(),
                source,
            })?;
        result.map(|()| stats)
    }

    async fn pump_all<W: AsyncWrite + Unpin>(
        &self,
        path: &Path,
        src: &mut Source,
        pump: &mut Pump<'_, '_, W>,
        running: &dyn ContainerRunning,
        stats: &mut ReadStats,
    ) -> Result<(), ReadLogsError> {
        let mut wakeup = Wakeup::NotYet;
        // upstream: `found`: whether the container was running at the last check.
        let mut found = true;
        // upstream: waitLogs' `errRetry`: five watch errors are retried.
        let mut watch_errors_left = 5u32;
        // When the runtime was last asked whether the container runs.
        let mut last_status_check: Option<tokio::time::Instant> = None;
        loop {
            let read_before = src.read_total;
            if let Pass::Done = pump.pass(src).await? {
                return Ok(());
            }
            let grew = src.read_total > read_before;
            if !self.options.follow {
                // upstream: an incomplete last line is still written ("Incomplete line in log file").
                if let Some((a, b)) = src.take_pending() {
                    pump.piece(Piece {
                        bytes: &src.buf[a..b],
                        ends_line: true,
                    })
                    .await?;
                }
                return Ok(());
            }
            if !found {
                return Ok(());
            }
            // Deviation: a re-created file is noticed by comparing the path's inode with the
            // open file's at every wake (upstream: an inotify `Create` of the same name), so a
            // missed event costs one re-check period, and the old file is read to its end
            // before the switch (upstream switches at once).
            if let Ok(meta) = tokio::fs::metadata(path).await
                && (meta.dev(), meta.ino()) != src.inode
            {
                match Source::open(path, self.config.buffer_size).await {
                    Ok(new) => {
                        let ends = Piece {
                            bytes: &[],
                            ends_line: true,
                        };
                        if let Some((a, b)) = src.take_pending()
                            && let Flow::Done = pump
                                .piece(Piece {
                                    bytes: &src.buf[a..b],
                                    ..ends
                                })
                                .await?
                        {
                            return Ok(());
                        }
                        stats.peak_buffered = stats.peak_buffered.max(src.peak);
                        *src = new;
                        stats.reopened += 1;
                        tracing::debug!(path = %path.display(), "opened the re-created log file");
                        continue;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => {
                        return Err(ReadLogsError::File {
                            operation: "reopening",
                            path: path.into(),
                            source,
                        });
                    }
                }
            }
            pump.writer
                .out
                .flush()
                .await
                .map_err(|source| ReadLogsError::Write {
                    path: path.into(),
                    source,
                })?;
            if let Wakeup::NotYet = wakeup {
                wakeup = match self.config.watch {
                    WatchMode::PollOnly => Wakeup::Polling,
                    WatchMode::Inotify => {
                        let dir = path.parent().unwrap_or(Path::new("/"));
                        match watch(dir) {
                            Ok(events) => Wakeup::Inotify(events),
                            Err(error) => {
                                tracing::warn!(%error, dir = %dir.display(), "no inotify watch; re-reading every re-check period");
                                Wakeup::Polling
                            }
                        }
                    }
                };
                // upstream: "try again to read as we might have missed the event".
                continue;
            }
            // upstream: waitLogs: no need to wait if the container is not running.
            // Deviation: upstream asks the runtime (CRI `ContainerStatus`) at every wake, so a
            // follow of a container writing 10 lines a second makes 10 runtime calls a second;
            // a wake that brought new bytes shows the container is writing, so here the runtime
            // is asked once per re-check period while bytes come, and after a wake that brought
            // none at most ten times per period (an inotify `CLOSE_WRITE` after the `MODIFY`
            // already read brings none). A stopped container ends the follow within two re-check
            // periods of its last write (upstream: one).
            let due = last_status_check.is_none_or(|at| {
                let period = self.config.recheck_period;
                at.elapsed() >= if grew { period } else { period / 10 }
            });
            if due {
                last_status_check = Some(tokio::time::Instant::now());
                found = running.is_running().await.map_err(|source| {
                    ReadLogsError::ContainerStatus {
                        path: path.into(),
                        source,
                    }
                })?;
                if !found {
                    continue;
                }
            }
            let recheck = tokio::time::sleep(self.config.recheck_period);
            let Wakeup::Inotify(events) = &mut wakeup else {
                recheck.await;
                continue;
            };
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(_)) => {
                        // Take whatever else is queued, so a burst of writes is one re-read.
                        while let Some(Some(Ok(_))) = futures::FutureExt::now_or_never(events.next()) {}
                    }
                    Some(Err(error)) if watch_errors_left > 0 => {
                        watch_errors_left -= 1;
                        tracing::warn!(%error, path = %path.display(), "inotify error; retrying");
                    }
                    // upstream ends the read after its retries; here the re-check goes on alone.
                    Some(Err(error)) => {
                        tracing::warn!(%error, path = %path.display(), "inotify errors; re-reading every re-check period");
                        wakeup = Wakeup::Polling;
                    }
                    None => wakeup = Wakeup::Polling,
                },
                () = recheck => {}
            }
        }
    }
}

/// How a follow learns that the file may have changed.
enum Wakeup {
    /// Not set up yet (upstream creates its watcher at the first end of file).
    NotYet,
    /// An inotify watch on the directory, and the re-check.
    Inotify(EventStream<Vec<u8>>),
    /// The re-check alone.
    Polling,
}

/// Watches `dir` for anything that may mean new bytes or a new file.
fn watch(dir: &Path) -> std::io::Result<EventStream<Vec<u8>>> {
    let inotify = Inotify::init()?;
    inotify.watches().add(
        dir,
        WatchMask::MODIFY
            | WatchMask::CREATE
            | WatchMask::MOVED_FROM
            | WatchMask::MOVED_TO
            | WatchMask::DELETE
            | WatchMask::ATTRIB
            | WatchMask::CLOSE_WRITE,
    )?;
    inotify.into_event_stream(vec![0u8; 4096])
}

/// Turns buffered file bytes into written log content.
struct Pump<'p, 'w, W> {
    path: &'p Path,
    format: Option<LogFormat>,
    state: LineState,
    /// upstream: `limitedNum` in limited mode (tail without follow).
    lines_left: Option<u64>,
    writer: LogWriter<'w, W>,
}

impl<W: AsyncWrite + Unpin> Pump<'_, '_, W> {
    /// Reads and writes until the end of the available bytes (an incomplete line stays pending).
    async fn pass(&mut self, src: &mut Source) -> Result<Pass, ReadLogsError> {
        loop {
            if self.lines_left == Some(0) {
                return Ok(Pass::Done);
            }
            match src.next_piece() {
                Some((a, b, ends_line)) => {
                    if let Flow::Done = self
                        .piece(Piece {
                            bytes: &src.buf[a..b],
                            ends_line,
                        })
                        .await?
                    {
                        return Ok(Pass::Done);
                    }
                }
                None => {
                    let n = src.fill().await.map_err(|source| ReadLogsError::File {
                        operation: "reading",
                        path: self.path.into(),
                        source,
                    })?;
                    if n == 0 {
                        return Ok(Pass::Eof);
                    }
                }
            }
        }
    }

    /// Parses and writes one piece of a file line.
    async fn piece(&mut self, piece: Piece<'_>) -> Result<Flow, ReadLogsError> {
        let write_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ReadLogsError::Write { path, source }
        };
        let more = match self.state {
            LineState::Start => {
                let format = match self.format {
                    Some(f) => f,
                    None => {
                        let f = LogFormat::detect(piece.bytes).map_err(|source| {
                            ReadLogsError::Format {
                                path: self.path.into(),
                                source,
                            }
                        })?;
                        *self.format.insert(f)
                    }
                };
                match format {
                    LogFormat::Cri => match parse_cri_log(piece.bytes) {
                        Ok(line) => {
                            if !piece.ends_line {
                                self.state = LineState::Inside {
                                    time: line.time,
                                    stream: line.stream,
                                    partial: line.partial,
                                };
                            }
                            self.writer
                                .write(line.time, line.stream, line.content)
                                .await
                                .map_err(write_err(self.path))?
                        }
                        Err(e) => self.skip(&piece, &e),
                    },
                    // A JSON line is parsed whole; one longer than the buffer is skipped.
                    LogFormat::DockerJson => {
                        match piece.ends_line.then(|| parse_docker_json_log(piece.bytes)) {
                            Some(Ok(line)) => self
                                .writer
                                .write(line.time, line.stream, &line.content)
                                .await
                                .map_err(write_err(self.path))?,
                            Some(Err(e)) => self.skip(&piece, &e),
                            None => self.skip(
                                &piece,
                                &ParseLogError::Json("a line longer than the read buffer".into()),
                            ),
                        }
                    }
                }
            }
            LineState::Inside {
                time,
                stream,
                partial,
            } => {
                let mut content = piece.bytes;
                if piece.ends_line && partial && content.last() == Some(&b'\n') {
                    content = &content[..content.len() - 1];
                }
                self.writer
                    .write(time, stream, content)
                    .await
                    .map_err(write_err(self.path))?
            }
            LineState::Skipping => true,
        };
        if piece.ends_line {
            self.state = LineState::Start;
            if let Some(n) = &mut self.lines_left {
                *n = n.saturating_sub(1);
            }
        }
        Ok(if more { Flow::More } else { Flow::Done })
    }

    /// upstream: "Failed when parsing line in log file": logged, and the line is dropped.
    fn skip(&mut self, piece: &Piece<'_>, error: &ParseLogError) -> bool {
        tracing::warn!(path = %self.path.display(), %error, "failed when parsing a line in the log file");
        if !piece.ends_line {
            self.state = LineState::Skipping;
        }
        true
    }
}

#[cfg(test)]
mod tests;
