//! Environment variables read from files in a pod's volumes (`env[].valueFrom.fileKeyRef`, the
//! EnvFiles feature, beta and on in v1.37): upstream `makeEnvironmentVariables` (the
//! `FileKeyRef` case) and `pkg/kubelet/util/env.ParseEnv`.
//!
//! * The file is `path` beneath the mounted volume `volumeName` of the pod (any volume the
//!   volume manager mounted; typically an emptyDir an init container wrote). A volume the pod
//!   has not mounted: `cannot find the volume "<name>" referenced by FileKeyRef`.
//! * [`parse_env`] is upstream's strict parser: `KEY='value'` lines, single quotes required,
//!   literal content (no escapes, no expansion), multi-line values, `#` comments and blank
//!   lines, leading blanks ignored, blanks before `=` refused, blanks after `=` an empty value.
//!   Lines are read as Go's `bufio.Scanner` reads them: a trailing `\r` dropped, at most
//!   64 KiB - 1 bytes each (`bufio.Scanner: token too long`).
//! * A file that does not parse is `couldn't parse env file` (the detail logged, as upstream);
//!   a key that is absent or empty is skipped when `optional`, else
//!   `environment variable key "<key>" not found in file "<path>"`.
//!
//! The file is the pod's content, hostile input. Deviations from upstream, all refusals where
//! upstream would follow or read on: the path is opened beneath the volume's directory
//! without following any symlink (`rustlet_mount::safe_path`; upstream `SecureJoin` resolves a
//! symlink as if the volume were the root and then opens the path again), and must be a
//! regular file (upstream's `open` of a FIFO blocks); at most [`MAX_FILE_BYTES`] are read and
//! the selected value holds at most [`MAX_VALUE_BYTES`] (upstream reads the whole file and
//! buffers every value); a value must be UTF-8 (upstream would fail later, in the CRI's
//! protobuf encoding). The values are read before the container is made, all at once: a
//! `fileKeyRef` error is reported before any other error of the container's environment
//! (upstream: the first in `env` order).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, FileKeySelector};
use rustlet_mount::safe_path::{OpenKind, open_beneath};

/// Go's `bufio.MaxScanTokenSize`: a line (with its newline) fits in 64 KiB.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// The most read from one env file.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// The longest value taken from an env file (Linux refuses a longer environment string,
/// `MAX_ARG_STRLEN`, at 128 KiB anyway).
pub const MAX_VALUE_BYTES: usize = 1024 * 1024;

/// One `fileKeyRef`: a key of a file beneath a volume.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileKey {
    /// The pod's volume.
    pub volume: String,
    /// The file, relative to the volume.
    pub path: String,
    /// The key in the file.
    pub key: String,
}

impl FileKey {
    /// The key a selector names.
    pub fn of(selector: &FileKeySelector) -> Self {
        Self {
            volume: selector.volume_name.clone(),
            path: selector.path.clone(),
            key: selector.key.clone(),
        }
    }
}

/// A container's `fileKeyRef` values, as read before it is created; an optional key that was
/// absent (or empty) has none.
pub type EnvFiles = BTreeMap<FileKey, String>;

/// Why a file's content is not an env file, or could not be read (upstream `ParseEnv`'s
/// errors, with its messages).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The file could not be opened.
    #[error("failed to open environment variable file {path:?}: {message}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// Reading failed, or a line was too long.
    #[error("error reading environment variable file {path:?}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A line that is not `KEY='value'`.
    #[error("invalid environment variable format at line {line}: {reason}")]
    Format {
        /// The line (from 1).
        line: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A quote opened and never closed.
    #[error("invalid environment variable format starting at line {0}: unclosed single quote")]
    Unclosed(usize),
    /// Deviation: the selected value is longer than [`MAX_VALUE_BYTES`].
    #[error("the value of {key:?} is longer than {MAX_VALUE_BYTES} bytes")]
    ValueTooLong {
        /// The key.
        key: String,
    },
    /// Deviation: the selected value is not UTF-8.
    #[error("the value of {key:?} is not UTF-8")]
    NotUtf8 {
        /// The key.
        key: String,
    },
}

/// Why a container's `fileKeyRef` cannot be resolved (the container waits with
/// `CreateContainerConfigError` and this message, as upstream's).
#[derive(Debug, thiserror::Error)]
pub enum EnvFileError {
    /// The pod has no mounted volume of that name.
    #[error("cannot find the volume {0:?} referenced by FileKeyRef")]
    NoVolume(String),
    /// The file did not parse (the detail is in the source, and logged).
    #[error("couldn't parse env file")]
    Parse(#[source] ParseError),
    /// The key is absent or empty and not optional.
    #[error("environment variable key {key:?} not found in file {path:?}")]
    KeyNotFound {
        /// The key.
        key: String,
        /// The file.
        path: PathBuf,
    },
}

/// Reads the next line as Go's `bufio.Scanner` with `ScanLines` does: `None` at the end; a
/// trailing `\r` dropped; a line that does not fit [`MAX_LINE_BYTES`] with its newline is an
/// error (`bufio.Scanner: token too long`).
fn next_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> Result<bool, String> {
    line.clear();
    let read = reader
        .by_ref()
        .take(MAX_LINE_BYTES as u64)
        .read_until(b'\n', line)
        .map_err(|e| e.to_string())?;
    if read == 0 {
        return Ok(false);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() == MAX_LINE_BYTES {
        return Err("bufio.Scanner: token too long".into());
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(true)
}

fn trim_left(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(bytes.len());
    &bytes[start..]
}

fn find(bytes: &[u8], byte: u8) -> Option<usize> {
    bytes.iter().position(|b| *b == byte)
}

/// Upstream `ParseEnv` on a reader: the value of `key` (`""` when absent, or assigned with a
/// blank after `=`). `path` names the file in errors.
pub fn parse_env(reader: impl Read, path: &Path, key: &str) -> Result<String, ParseError> {
    let mut reader = BufReader::new(reader);
    let key = key.as_bytes();
    let read_error = |message: String| ParseError::Read {
        path: path.to_owned(),
        message,
    };
    let format = |line, reason| ParseError::Format { line, reason };
    let mut line = Vec::new();
    let mut number = 0;
    while next_line(&mut reader, &mut line).map_err(read_error)? {
        number += 1;
        let text = trim_left(&line);
        if text.is_empty() || text.starts_with(b"#") {
            continue;
        }
        let Some(eq) = find(text, b'=') else {
            return Err(format(number, "missing '='"));
        };
        let name_part = &text[..eq];
        let name_end = name_part
            .iter()
            .rposition(|b| !matches!(b, b' ' | b'\t'))
            .map_or(0, |i| i + 1);
        let name = &name_part[..name_end];
        if name.is_empty() {
            return Err(format(number, "empty variable name"));
        }
        if name.len() != name_part.len() {
            return Err(format(number, "whitespace before '=' is not allowed"));
        }
        let value_part = &text[eq + 1..];
        let trimmed = trim_left(value_part);
        if trimmed.len() != value_part.len() {
            // As a shell: `KEY= 'v'` assigns the empty string.
            if name == key {
                return Ok(String::new());
            }
            continue;
        }
        let Some(mut rest) = trimmed.strip_prefix(b"'").map(<[u8]>::to_vec) else {
            return Err(format(number, "value must be enclosed in single quotes"));
        };
        let selected = name == key;
        // Only the selected key's value is kept (upstream builds every one).
        let mut value: Vec<u8> = Vec::new();
        let start = number;
        loop {
            if let Some(close) = find(&rest, b'\'') {
                let after = trim_left(&rest[close + 1..]);
                if !after.is_empty() && !after.starts_with(b"#") {
                    return Err(format(number, "unexpected content after closing quote"));
                }
                if selected {
                    value.extend_from_slice(&rest[..close]);
                    if value.len() > MAX_VALUE_BYTES {
                        return Err(ParseError::ValueTooLong {
                            key: String::from_utf8_lossy(key).into_owned(),
                        });
                    }
                    return String::from_utf8(value).map_err(|_| ParseError::NotUtf8 {
                        key: String::from_utf8_lossy(key).into_owned(),
                    });
                }
                break;
            }
            if selected {
                value.extend_from_slice(&rest);
                value.push(b'\n');
                if value.len() > MAX_VALUE_BYTES {
                    return Err(ParseError::ValueTooLong {
                        key: String::from_utf8_lossy(key).into_owned(),
                    });
                }
            }
            // Upstream: any end of the scan here (the end of the file, a read error, a line
            // too long) is the unclosed quote.
            if !matches!(next_line(&mut reader, &mut line), Ok(true)) {
                return Err(ParseError::Unclosed(start));
            }
            number += 1;
            rest.clear();
            rest.extend_from_slice(&line);
        }
    }
    Ok(String::new())
}

/// Opens `rel` beneath `root` without following a symlink, as a regular file (a FIFO is
/// refused before it could block the read).
fn open_regular(root: &Path, rel: &Path) -> Result<std::fs::File, String> {
    let pinned = open_beneath(root, rel, OpenKind::Path).map_err(|e| e.to_string())?;
    let meta = std::fs::metadata(format!("/proc/self/fd/{}", pinned.as_raw_fd()))
        .map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!("larger than {MAX_FILE_BYTES} bytes"));
    }
    // The pinned fd, never the path again: a component swapped afterwards changes nothing.
    std::fs::File::open(format!("/proc/self/fd/{}", pinned.as_raw_fd())).map_err(|e| e.to_string())
}

/// Upstream `ParseEnv` of the file `rel` beneath the volume directory `root` (see the module
/// documentation for how it is opened and bounded).
pub fn read_env_file(root: &Path, rel: &str, key: &str) -> Result<String, ParseError> {
    let path = root.join(rel);
    let file = open_regular(root, Path::new(rel)).map_err(|message| ParseError::Open {
        path: path.clone(),
        message,
    })?;
    let bounded = file.take(MAX_FILE_BYTES);
    parse_env(bounded, &path, key)
}

/// The `fileKeyRef` selectors of a container's `env`, in order.
pub fn selectors(container: &Container) -> Vec<FileKeySelector> {
    container
        .env
        .iter()
        .flatten()
        .filter_map(|var| var.value_from.as_ref()?.file_key_ref.clone())
        .collect()
}

/// Upstream's `FileKeyRef` case of `makeEnvironmentVariables` for each selector in order:
/// `volume_path` says where a mounted volume of the pod is. The first failure is the error.
pub fn resolve(
    selectors: &[FileKeySelector],
    volume_path: impl Fn(&str) -> Option<PathBuf>,
) -> Result<EnvFiles, EnvFileError> {
    let mut out = EnvFiles::new();
    for selector in selectors {
        let Some(root) = volume_path(&selector.volume_name) else {
            return Err(EnvFileError::NoVolume(selector.volume_name.clone()));
        };
        let value = read_env_file(&root, &selector.path, &selector.key).map_err(|e| {
            tracing::warn!(error = %e, "Failed to parse env file");
            EnvFileError::Parse(e)
        })?;
        if value.is_empty() {
            if selector.optional == Some(true) {
                continue;
            }
            return Err(EnvFileError::KeyNotFound {
                key: selector.key.clone(),
                path: root.join(&selector.path),
            });
        }
        out.insert(FileKey::of(selector), value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
