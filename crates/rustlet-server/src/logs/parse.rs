//! One line of a container log file: the CRI format containerd writes, or Docker's JSON
//! (upstream: `parseCRILog`, `parseDockerJSONLog`, `getParseFunc` in cri-client's `logs.go`).

use super::time::{LogTime, TimeParseError};

/// Which stream a line came from (upstream: `runtimeapi.LogStreamType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStreamType {
    /// `stdout`.
    Stdout,
    /// `stderr`.
    Stderr,
}

impl LogStreamType {
    fn parse(s: &[u8]) -> Option<Self> {
        match s {
            b"stdout" => Some(Self::Stdout),
            b"stderr" => Some(Self::Stderr),
            _ => None,
        }
    }
}

/// Why a line did not parse (upstream's wording).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseLogError {
    /// No space after the timestamp.
    #[error("timestamp is not found")]
    TimestampNotFound,
    /// The timestamp is not RFC 3339.
    #[error("unexpected timestamp format \"2006-01-02T15:04:05.999999999Z07:00\": {0}")]
    Timestamp(#[from] TimeParseError),
    /// No space after the stream.
    #[error("stream type is not found")]
    StreamNotFound,
    /// Neither `stdout` nor `stderr`.
    #[error("unexpected stream type {0:?}")]
    UnexpectedStream(String),
    /// No space after the tags.
    #[error("log tag is not found")]
    TagNotFound,
    /// Not Docker's JSON either.
    #[error("failed with {0} to unmarshal log")]
    Json(String),
    /// The first line is in no format known (upstream: `getParseFunc`).
    #[error("unsupported log format: {0:?}")]
    UnsupportedFormat(String),
}

/// A parsed line: its time, stream, whether the runtime split it (`P`), and its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriLine<'a> {
    /// When the runtime wrote it.
    pub time: LogTime,
    /// Its stream.
    pub stream: LogStreamType,
    /// The first tag is `P`: the content continues in the next line.
    pub partial: bool,
    /// The content; a partial line's trailing `\n` is removed (upstream: "Trim the tailing new
    /// line if this is a partial line").
    pub content: &'a [u8],
}

/// upstream: `parseCRILog`: `<RFC3339Nano> <stdout|stderr> <P|F>[:tags] <content>`.
pub fn parse_cri_log(line: &[u8]) -> Result<CriLine<'_>, ParseLogError> {
    let idx = line
        .iter()
        .position(|&c| c == b' ')
        .ok_or(ParseLogError::TimestampNotFound)?;
    let time = LogTime::parse(&line[..idx])?;
    let rest = &line[idx + 1..];
    let idx = rest
        .iter()
        .position(|&c| c == b' ')
        .ok_or(ParseLogError::StreamNotFound)?;
    let stream = LogStreamType::parse(&rest[..idx]).ok_or_else(|| {
        ParseLogError::UnexpectedStream(String::from_utf8_lossy(&rest[..idx]).into_owned())
    })?;
    let rest = &rest[idx + 1..];
    let idx = rest
        .iter()
        .position(|&c| c == b' ')
        .ok_or(ParseLogError::TagNotFound)?;
    // Keep this forward compatible: only the first of the `:`-separated tags counts.
    let first_tag = rest[..idx].split(|&c| c == b':').next().unwrap_or_default();
    let partial = first_tag == b"P";
    let mut content = &rest[idx + 1..];
    if partial && content.last() == Some(&b'\n') {
        content = &content[..content.len() - 1];
    }
    Ok(CriLine {
        time,
        stream,
        partial,
        content,
    })
}

#[derive(serde::Deserialize)]
struct JsonLog {
    #[serde(default)]
    log: String,
    #[serde(default)]
    stream: String,
    time: String,
}

/// A line in Docker's JSON format, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonLine {
    /// `time`.
    pub time: LogTime,
    /// `stream`.
    pub stream: LogStreamType,
    /// `log`.
    pub content: Vec<u8>,
}

/// upstream: `parseDockerJSONLog`: `{"log":"content","stream":"stdout","time":"..."}`.
///
/// Deviation: a stream other than stdout/stderr fails here (the line is skipped); upstream
/// accepts it and fails the whole read when it writes the line.
pub fn parse_docker_json_log(line: &[u8]) -> Result<JsonLine, ParseLogError> {
    let l: JsonLog =
        serde_json::from_slice(line).map_err(|e| ParseLogError::Json(e.to_string()))?;
    let time = LogTime::parse(l.time.as_bytes())?;
    let stream = LogStreamType::parse(l.stream.as_bytes())
        .ok_or(ParseLogError::UnexpectedStream(l.stream))?;
    Ok(JsonLine {
        time,
        stream,
        content: l.log.into_bytes(),
    })
}

/// The format of a log file, chosen from its first line (upstream: `getParseFunc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// The CRI format.
    Cri,
    /// Docker's JSON.
    DockerJson,
}

impl LogFormat {
    /// upstream: `getParseFunc`: CRI first, then Docker JSON.
    pub fn detect(line: &[u8]) -> Result<Self, ParseLogError> {
        if parse_cri_log(line).is_ok() {
            Ok(Self::Cri)
        } else if parse_docker_json_log(line).is_ok() {
            Ok(Self::DockerJson)
        } else {
            Err(ParseLogError::UnsupportedFormat(
                String::from_utf8_lossy(line).into_owned(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// upstream: `TestParseLog`.
    #[test]
    fn test_parse_log() {
        let t = |s: &[u8]| LogTime::parse(s).unwrap();
        // CRI, full line.
        let l =
            parse_cri_log(b"2016-10-20T18:39:20.57606443Z stdout F cri stdout test log\n").unwrap();
        assert_eq!(
            l,
            CriLine {
                time: t(b"2016-10-20T18:39:20.57606443Z"),
                stream: LogStreamType::Stdout,
                partial: false,
                content: b"cri stdout test log\n"
            }
        );
        // CRI, partial line: the newline goes.
        let l =
            parse_cri_log(b"2016-10-20T18:39:20.57606443Z stderr P cri stderr partial\n").unwrap();
        assert!(l.partial);
        assert_eq!(
            (l.stream, l.content),
            (LogStreamType::Stderr, &b"cri stderr partial"[..])
        );
        // Extra tags are ignored.
        let l = parse_cri_log(b"2016-10-20T18:39:20.57606443Z stdout P:x:y content\n").unwrap();
        assert!(l.partial);
        // Empty content.
        let l = parse_cri_log(b"2016-10-20T18:39:20.57606443Z stdout F \n").unwrap();
        assert_eq!(l.content, b"\n");
        // Docker JSON.
        let l = parse_docker_json_log(
            br#"{"log":"docker stdout test log","stream":"stdout","time":"2016-10-20T18:39:20.57606443Z"}"#,
        )
        .unwrap();
        assert_eq!(l.content, b"docker stdout test log");
        assert_eq!(l.time, t(b"2016-10-20T18:39:20.57606443Z"));
        // Errors, worded as upstream.
        assert_eq!(
            parse_cri_log(b"nospace").unwrap_err().to_string(),
            "timestamp is not found"
        );
        assert_eq!(
            parse_cri_log(b"2016-10-20T18:39:20.57606443Z stdin F x")
                .unwrap_err()
                .to_string(),
            "unexpected stream type \"stdin\""
        );
        assert_eq!(
            parse_cri_log(b"2016-10-20T18:39:20.57606443Z stdout")
                .unwrap_err()
                .to_string(),
            "stream type is not found"
        );
        assert_eq!(
            parse_cri_log(b"2016-10-20T18:39:20.57606443Z stdout F")
                .unwrap_err()
                .to_string(),
            "log tag is not found"
        );
        assert!(parse_cri_log(b"2016-10-20 stdout F x").is_err());
        assert_eq!(
            LogFormat::detect(b"2016-10-20T18:39:20.57606443Z stdout F x\n").unwrap(),
            LogFormat::Cri
        );
        assert_eq!(
            LogFormat::detect(br#"{"log":"x","stream":"stderr","time":"2016-10-20T18:39:20Z"}"#)
                .unwrap(),
            LogFormat::DockerJson
        );
        assert!(matches!(
            LogFormat::detect(b"garbage\n"),
            Err(ParseLogError::UnsupportedFormat(_))
        ));
    }
}
