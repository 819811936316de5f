//! Container logs as the kubelet serves and rotates them: the `/containerLogs` query
//! ([`options`]), the CRI and Docker JSON line formats ([`parse`]), the reader with tail,
//! since, limit, timestamps, stream filtering and follow ([`reader`]), and the container log
//! manager's rotation ([`rotation`]).
//!
//! Invariants: a read holds at most one buffer of the file however large the file or its lines;
//! a follow ends only when the container is no longer running (or the client goes away), and
//! follows the live file across rotations; rotated files are never read (as upstream).

pub mod options;
pub mod parse;
pub mod reader;
pub mod rotation;
pub mod time;

pub use options::{LogOptions, LogQueryError, PodLogOptions, StreamSelection, parse_pod_log_query};
pub use reader::{ContainerRunning, LogReader, ReadLogsError, ReadStats, ReaderConfig, WatchMode};
pub use rotation::{ContainerLogManager, LogRotatePolicy, LogRuntime};
