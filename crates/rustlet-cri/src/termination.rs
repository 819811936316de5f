//! Termination messages (upstream `kuberuntime_container.go`): the file each container instance
//! gets at its `terminationMessagePath` (`makeMounts`: a new empty file, mode 0666, under
//! `<root>/pods/<uid>/containers/<name>/`, bound into the container), and the message of an
//! exited instance read back from it, or from the tail of its log with
//! `terminationMessagePolicy: FallbackToLogsOnError` (`getTerminationMessage`,
//! `readLastStringFromContainerLogs`, `convertToKubeContainerStatus`). The pod's 12 KiB budget
//! is applied where every status is normalised (`rustlet_core::normalize_status`, R10).
//!
//! Blocking file I/O: callers run these on the blocking pool.

use std::hash::BuildHasher;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;

use crate::config::{TERMINATION_MESSAGE_PATH_ANNOTATION, TERMINATION_MESSAGE_POLICY_ANNOTATION};

/// upstream: `MaxContainerTerminationMessageLength`, what is read of the file (its end).
pub const MAX_CONTAINER_TERMINATION_MESSAGE_LENGTH: u64 = 4 * 1024;
/// upstream: `MaxContainerTerminationMessageLogLines`, the log lines looked at.
const MAX_LOG_LINES: usize = 80;
/// upstream: `MaxContainerTerminationMessageLogLength`, what is kept of them (their end).
const MAX_LOG_LENGTH: usize = 2 * 1024;
/// How much of a log's end is read to find its last [`MAX_LOG_LINES`] lines' last
/// [`MAX_LOG_LENGTH`] bytes of content: the content plus each line's prefix (a timestamp, the
/// stream and the tag, about 40 bytes), with room to spare. Deviation: upstream reads the whole
/// of the last 80 lines, however long; the bytes kept are the same.
const LOG_TAIL_READ: u64 = 16 * 1024;

/// Creates a new empty termination-log file in `dir` (created if absent), mode 0666 whatever
/// the umask (a container running as any user writes it), under a random name as upstream's
/// `makeUID`, and returns its path.
pub fn create_termination_log(dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let random = std::collections::hash_map::RandomState::new();
    for attempt in 0_u32.. {
        let name = format!("{:08x}", random.hash_one(attempt) as u32);
        let path = dir.join(name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o666)
            .open(&path)
        {
            Ok(_) => {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 16 => {}
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

/// The termination message of an exited container from its CRI status (upstream:
/// `convertToKubeContainerStatus`): the runtime's message, then (after `": "`) the end of the
/// file bound at the `terminationMessagePath` its annotations name (at most 4 KiB); with
/// `FallbackToLogsOnError`, a non-zero exit and an empty or absent file (and not a container
/// that could not run), the end of its log instead.
pub fn termination_message(status: &cri::ContainerStatus) -> String {
    let annotation = |key: &str| status.annotations.get(key).map_or("", String::as_str);
    let reason = if status.reason.is_empty() {
        if status.exit_code == 0 {
            "Completed"
        } else {
            "Error"
        }
    } else {
        status.reason.as_str()
    };
    let fallback_to_logs = annotation(TERMINATION_MESSAGE_POLICY_ANNOTATION)
        == "FallbackToLogsOnError"
        && status.exit_code != 0
        && reason != "ContainerCannotRun";
    let (mut written, check_logs) = from_file(
        status,
        annotation(TERMINATION_MESSAGE_PATH_ANNOTATION),
        fallback_to_logs,
    );
    if check_logs {
        written = last_string_of_log(Path::new(&status.log_path));
    }
    let mut message = status.message.clone();
    if !written.is_empty() {
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&written);
    }
    message
}

/// upstream: `getTerminationMessage`: the message and whether the log is to be read instead.
fn from_file(
    status: &cri::ContainerStatus,
    container_path: &str,
    fallback_to_logs: bool,
) -> (String, bool) {
    if container_path.is_empty() {
        return (String::new(), fallback_to_logs);
    }
    let Some(mount) = status
        .mounts
        .iter()
        .find(|m| m.container_path == container_path)
    else {
        return (String::new(), fallback_to_logs);
    };
    match read_end(
        Path::new(&mount.host_path),
        MAX_CONTAINER_TERMINATION_MESSAGE_LENGTH,
    ) {
        Ok(data) => {
            let empty = data.is_empty();
            (
                String::from_utf8_lossy(&data).into_owned(),
                fallback_to_logs && empty,
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), fallback_to_logs),
        Err(e) => (
            format!("Error on reading termination log {}: {e}", mount.host_path),
            false,
        ),
    }
}

/// upstream: `tail.ReadAtMost`: the last `max` bytes of the file. (The file's directory is the
/// agent's; a container sees only the file, bound into it, and cannot swap it for a symlink.)
fn read_end(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let start = size.saturating_sub(max);
    file.seek(SeekFrom::Start(start))?;
    let mut data = Vec::new();
    file.take(max).read_to_end(&mut data)?;
    Ok(data)
}

/// upstream: `readLastStringFromContainerLogs`: the content of the log's last 80 lines (a full
/// line with its newline, a partial one without), of which the last 2 KiB.
fn last_string_of_log(path: &Path) -> String {
    let data = match read_end(path, LOG_TAIL_READ) {
        Ok(data) => data,
        Err(e) => return format!("Error on reading termination message from logs: {e}"),
    };
    let whole_file = std::fs::metadata(path).is_ok_and(|m| m.len() <= LOG_TAIL_READ);
    let mut lines: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
    // The text after the last newline is not a line yet; the first is cut unless the read
    // began at the file's start.
    lines.pop();
    if !whole_file && !lines.is_empty() {
        lines.remove(0);
    }
    let first = lines.len().saturating_sub(MAX_LOG_LINES);
    let mut content = Vec::new();
    for line in &lines[first..] {
        // `<time> <stream> <tag> <content>`; a line that is not one is skipped (upstream
        // reports the parse error and goes on).
        let mut fields = line.splitn(4, |b| *b == b' ');
        let (Some(_time), Some(_stream), Some(tag)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        content.extend_from_slice(fields.next().unwrap_or_default());
        if !tag.starts_with(b"P") {
            content.push(b'\n');
        }
    }
    let keep = content.len().saturating_sub(MAX_LOG_LENGTH);
    String::from_utf8_lossy(&content[keep..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A directory of the test's own, removed with the returned guard (it was left in the
    /// temporary directory before).
    fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
        let guard = tempfile::Builder::new()
            .prefix(&format!("rustlet-termination-{name}-"))
            .tempdir()
            .unwrap();
        let dir = guard.path().to_path_buf();
        (guard, dir)
    }

    fn exited(
        exit_code: i32,
        policy: &str,
        file: Option<&Path>,
        log: Option<&Path>,
    ) -> cri::ContainerStatus {
        cri::ContainerStatus {
            state: cri::ContainerState::ContainerExited as i32,
            exit_code,
            annotations: HashMap::from([
                (
                    TERMINATION_MESSAGE_PATH_ANNOTATION.to_owned(),
                    "/dev/termination-log".to_owned(),
                ),
                (
                    TERMINATION_MESSAGE_POLICY_ANNOTATION.to_owned(),
                    policy.to_owned(),
                ),
            ]),
            mounts: file
                .map(|f| cri::Mount {
                    container_path: "/dev/termination-log".into(),
                    host_path: f.display().to_string(),
                    ..Default::default()
                })
                .into_iter()
                .collect(),
            log_path: log.map(|l| l.display().to_string()).unwrap_or_default(),
            ..Default::default()
        }
    }

    /// upstream "should report termination message if TerminationMessagePath is set" and
    /// `MaxContainerTerminationMessageLength`: the file's content is the message, its last
    /// 4 KiB when longer; the file is new, empty and writable by anyone.
    #[test]
    fn the_message_is_the_end_of_the_termination_log() {
        let (_guard, dir) = scratch("file");
        let file = create_termination_log(&dir.join("containers/c")).unwrap();
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!((meta.len(), meta.permissions().mode() & 0o777), (0, 0o666));
        assert_ne!(
            create_termination_log(&dir.join("containers/c")).unwrap(),
            file
        );
        std::fs::write(&file, "DONE").unwrap();
        assert_eq!(
            termination_message(&exited(0, "File", Some(&file), None)),
            "DONE"
        );
        let long = format!("{}{}", "a".repeat(100), "b".repeat(4096));
        std::fs::write(&file, &long).unwrap();
        assert_eq!(
            termination_message(&exited(1, "File", Some(&file), None)),
            "b".repeat(4096)
        );
        // No such mount (a container of an older agent), or no file: no message.
        assert_eq!(termination_message(&exited(1, "File", None, None)), "");
        std::fs::remove_file(&file).unwrap();
        assert_eq!(
            termination_message(&exited(1, "File", Some(&file), None)),
            ""
        );
    }

    /// upstream "should report termination message from log output if TerminationMessagePolicy
    /// FallbackToLogsOnError is set", "... as empty when pod succeeds and ..." and "... from
    /// file when pod succeeds and ...": the log's tail only for a failure with no message in
    /// the file; full lines with their newline, partial ones joined.
    #[test]
    fn fallback_to_logs_on_error_reads_the_logs_tail_only_for_a_failure_without_a_file() {
        let (_guard, dir) = scratch("logs");
        let file = create_termination_log(&dir).unwrap();
        let log = dir.join("0.log");
        std::fs::write(
            &log,
            "2026-12-03T19:00:00.000000001Z stdout F first\n\
             2026-12-03T19:00:00.000000002Z stderr P DO\n\
             2026-12-03T19:00:00.000000003Z stderr F NE\n",
        )
        .unwrap();
        let fallback = |code, file: &Path| {
            termination_message(&exited(
                code,
                "FallbackToLogsOnError",
                Some(file),
                Some(&log),
            ))
        };
        assert_eq!(fallback(1, &file), "first\nDONE\n");
        assert_eq!(fallback(0, &file), "", "a success never reads the log");
        assert_eq!(
            termination_message(&exited(1, "File", Some(&file), Some(&log))),
            "",
            "policy File never reads the log"
        );
        std::fs::write(&file, "OK").unwrap();
        assert_eq!(fallback(0, &file), "OK");
        assert_eq!(fallback(1, &file), "OK", "the file wins over the log");
    }

    /// upstream `MaxContainerTerminationMessageLogLines` (80) and `...LogLength` (2 KiB): of a
    /// long log, the last 80 lines, of which the last 2 KiB.
    #[test]
    fn fallback_to_logs_keeps_the_last_80_lines_and_2_kib() {
        let (_guard, dir) = scratch("long");
        let log = dir.join("0.log");
        let line = |n: usize, len: usize| {
            format!(
                "2026-12-03T19:00:00.000000001Z stdout F {n:04}{}\n",
                "x".repeat(len)
            )
        };
        let short: String = (0..200).map(|n| line(n, 0)).collect();
        std::fs::write(&log, short).unwrap();
        let status = exited(2, "FallbackToLogsOnError", None, Some(&log));
        let expected: String = (120..200).map(|n| format!("{n:04}\n")).collect();
        assert_eq!(termination_message(&status), expected);
        let long: String = (0..1000).map(|n| line(n, 95)).collect();
        std::fs::write(&log, long).unwrap();
        let message = termination_message(&status);
        assert_eq!(message.len(), 2048);
        assert!(message.ends_with(&format!("0999{}\n", "x".repeat(95))));
    }
}
