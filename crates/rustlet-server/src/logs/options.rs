//! `/containerLogs` query parameters: decoded into [`PodLogOptions`] (upstream's
//! `v1.PodLogOptions`), validated as the kubelet does, and turned into the reader's
//! [`LogOptions`] (upstream's CRI `LogOptions`).
//!
//! k8s-openapi has no `PodLogOptions` (it is a query-parameter type, not an object), so the
//! struct here mirrors upstream's field for field; `sinceTime` is k8s-openapi's `Time`.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::time::LogTime;

/// upstream: `v1.LogStreamStdout`.
pub const LOG_STREAM_STDOUT: &str = "Stdout";
/// upstream: `v1.LogStreamStderr`.
pub const LOG_STREAM_STDERR: &str = "Stderr";
/// upstream: `v1.LogStreamAll`.
pub const LOG_STREAM_ALL: &str = "All";

/// upstream: `v1.PodLogOptions`, as the kubelet decodes it from the query.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodLogOptions {
    /// `container` (the kubelet sets it from the path).
    pub container: Option<String>,
    /// `follow`: stream until the container stops.
    pub follow: bool,
    /// `previous`: the previous instance's log.
    pub previous: bool,
    /// `sinceSeconds`.
    pub since_seconds: Option<i64>,
    /// `sinceTime` (RFC 3339).
    pub since_time: Option<Time>,
    /// `timestamps`: prefix each line with its time.
    pub timestamps: bool,
    /// `tailLines` (also the legacy `tail`).
    pub tail_lines: Option<i64>,
    /// `limitBytes`.
    pub limit_bytes: Option<i64>,
    /// `insecureSkipTLSVerifyBackend` (meaningful to the API server only).
    pub insecure_skip_tls_verify_backend: bool,
    /// `stream` (KEP-3288): `All`, `Stdout` or `Stderr`.
    pub stream: Option<String>,
}

/// One validation error, worded as upstream's `field.Error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldError {
    /// `field.Invalid`.
    Invalid {
        /// The field path.
        field: &'static str,
        /// The value, as Go's `%v` prints it.
        value: String,
        /// Why.
        detail: &'static str,
    },
    /// `field.Forbidden`.
    Forbidden {
        /// The field path (upstream uses the empty path for the cross-field rules).
        field: &'static str,
        /// Why.
        detail: &'static str,
    },
    /// `field.NotSupported`.
    NotSupported {
        /// The field path.
        field: &'static str,
        /// The value given.
        value: String,
        /// The values accepted.
        supported: &'static [&'static str],
    },
}

/// `<field>: <body>`, as Go's `field.Error.Error()` (an empty path gives a leading `: `, as there).
impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid {
                field,
                value,
                detail,
            } => write!(f, "{field}: Invalid value: {value}: {detail}"),
            Self::Forbidden { field, detail } => write!(f, "{field}: Forbidden: {detail}"),
            Self::NotSupported {
                field,
                value,
                supported,
            } => {
                let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
                write!(
                    f,
                    "{field}: Unsupported value: {value:?}: supported values: {}",
                    list.join(", ")
                )
            }
        }
    }
}

/// Why a `/containerLogs` query was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LogQueryError {
    /// A parameter did not decode (upstream: `DecodeParameters` failed; HTTP 400).
    #[error("decoding the containerLogs query: parameter {parameter}={value:?}: {reason}")]
    Decode {
        /// The parameter's name.
        parameter: &'static str,
        /// Its value.
        value: String,
        /// What was wrong.
        reason: String,
    },
    /// The options are invalid (upstream: `ValidatePodLogOptions`; HTTP 422).
    #[error("validating the containerLogs query: {}", aggregate(.0))]
    Invalid(Vec<FieldError>),
}

/// Go's `utilerrors.NewAggregate(...).Error()`: one error alone, several in brackets.
fn aggregate(errs: &[FieldError]) -> String {
    match errs {
        [one] => one.to_string(),
        many => format!(
            "[{}]",
            many.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

impl LogQueryError {
    /// The HTTP status upstream's `getContainerLogs` answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::Decode { .. } => 400,
            Self::Invalid(_) => 422,
        }
    }

    /// The body upstream's `getContainerLogs` answers with.
    pub fn http_body(&self) -> &'static str {
        match self {
            Self::Decode { .. } => r#"{"message": "Unable to decode query."}"#,
            Self::Invalid(_) => r#"{"message": "Invalid request."}"#,
        }
    }
}

/// Go's `runtime.Convert_Slice_string_To_bool`: only `0` and `false` (any case) are false.
fn query_bool(value: &str) -> bool {
    !(value == "0" || value.eq_ignore_ascii_case("false"))
}

fn query_int(parameter: &'static str, value: &str) -> Result<i64, LogQueryError> {
    value.parse::<i64>().map_err(|e| LogQueryError::Decode {
        parameter,
        value: value.to_owned(),
        reason: e.to_string(),
    })
}

/// `metav1.Time.UnmarshalQueryParameter`: empty or `null` is the zero time, else RFC 3339.
fn query_time(value: &str) -> Result<Time, LogQueryError> {
    if value.is_empty() || value == "null" {
        // Go's zero time.Time.
        let zero = LogTime::parse(b"0001-01-01T00:00:00Z").expect("the zero time parses");
        return Ok(Time(zero.instant));
    }
    LogTime::parse(value.as_bytes())
        .map(|t| Time(t.instant))
        .map_err(|e| LogQueryError::Decode {
            parameter: "sinceTime",
            value: value.to_owned(),
            reason: e.to_string(),
        })
}

/// Decodes and validates a `/containerLogs` query string (without the `?`).
///
/// upstream: `getContainerLogs` in `pkg/kubelet/server/server.go` (the legacy `tail` parameter
/// becomes `tailLines`, `tail=all` drops it; the first value of a repeated parameter counts, as
/// `url.Values`' conversion takes `[0]`), then `ValidatePodLogOptions`. Unknown parameters are
/// ignored, as the parameter codec ignores them.
///
/// ```
/// use rustlet_server::logs::parse_pod_log_query;
///
/// let options = parse_pod_log_query("tail=5&sinceSeconds=60").unwrap();
/// assert_eq!(options.tail_lines, Some(5)); // the legacy `tail`
/// assert_eq!(options.since_seconds, Some(60));
/// assert!(parse_pod_log_query("tailLines=-1").is_err()); // ValidatePodLogOptions
/// ```
pub fn parse_pod_log_query(query: &str) -> Result<PodLogOptions, LogQueryError> {
    let mut first: Vec<(String, String)> = Vec::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if !first.iter().any(|(key, _)| *key == k) {
            first.push((k.into_owned(), v.into_owned()));
        }
    }
    let get = |name: &str| {
        first
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let mut tail_lines = get("tailLines").map(str::to_owned);
    if let Some(tail) = get("tail").filter(|t| !t.is_empty()) {
        tail_lines = if tail == "all" {
            None
        } else {
            Some(tail.to_owned())
        };
    }
    let opts = PodLogOptions {
        container: get("container").map(str::to_owned),
        follow: get("follow").is_some_and(query_bool),
        previous: get("previous").is_some_and(query_bool),
        since_seconds: get("sinceSeconds")
            .map(|v| query_int("sinceSeconds", v))
            .transpose()?,
        since_time: get("sinceTime").map(query_time).transpose()?,
        timestamps: get("timestamps").is_some_and(query_bool),
        tail_lines: tail_lines
            .as_deref()
            .map(|v| query_int("tailLines", v))
            .transpose()?,
        limit_bytes: get("limitBytes")
            .map(|v| query_int("limitBytes", v))
            .transpose()?,
        insecure_skip_tls_verify_backend: get("insecureSkipTLSVerifyBackend")
            .is_some_and(query_bool),
        stream: get("stream").map(str::to_owned),
    };
    let errs = validate_pod_log_options(&opts);
    if errs.is_empty() {
        Ok(opts)
    } else {
        Err(LogQueryError::Invalid(errs))
    }
}

/// The stream values upstream accepts, in the order upstream builds its set.
const VALID_LOG_STREAMS: &[&str] = &[LOG_STREAM_STDOUT, LOG_STREAM_STDERR, LOG_STREAM_ALL];

/// upstream: `ValidatePodLogOptions` (the kubelet's `v1` variant, with KEP-3288's `stream`).
///
/// Deviation: upstream lists the supported streams in a Go set's (random) order; here always
/// `"Stdout", "Stderr", "All"`.
pub fn validate_pod_log_options(opts: &PodLogOptions) -> Vec<FieldError> {
    const IS_NEGATIVE: &str = "must be greater than or equal to 0";
    let mut errs = Vec::new();
    if let Some(t) = opts.tail_lines.filter(|t| *t < 0) {
        errs.push(FieldError::Invalid {
            field: "tailLines",
            value: t.to_string(),
            detail: IS_NEGATIVE,
        });
    }
    if let Some(b) = opts.limit_bytes.filter(|b| *b < 1) {
        errs.push(FieldError::Invalid {
            field: "limitBytes",
            value: b.to_string(),
            detail: "must be greater than 0",
        });
    }
    match (opts.since_seconds, &opts.since_time) {
        (Some(_), Some(_)) => errs.push(FieldError::Forbidden {
            field: "",
            detail: "at most one of `sinceTime` or `sinceSeconds` may be specified",
        }),
        (Some(s), None) if s < 1 => errs.push(FieldError::Invalid {
            field: "sinceSeconds",
            value: s.to_string(),
            detail: "must be greater than 0",
        }),
        _ => {}
    }
    if let Some(stream) = &opts.stream {
        if !VALID_LOG_STREAMS.contains(&stream.as_str()) {
            errs.push(FieldError::NotSupported {
                field: "stream",
                value: stream.clone(),
                supported: VALID_LOG_STREAMS,
            });
        }
        if stream != LOG_STREAM_ALL && opts.tail_lines.is_some() {
            errs.push(FieldError::Forbidden {
                field: "",
                detail: "`tailLines` and specific `stream` are mutually exclusive for now",
            });
        }
    }
    errs
}

/// Which of the container's streams to send (`stream`, KEP-3288).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamSelection {
    /// Both, interleaved as written (no `stream`, or `stream=All`).
    #[default]
    All,
    /// Standard output only.
    Stdout,
    /// Standard error only.
    Stderr,
}

/// What the reader does (upstream: the CRI `LogOptions`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogOptions {
    /// The last this many lines of the file (`None`: all).
    pub tail: Option<u64>,
    /// At most this many bytes out (`None`: no limit).
    pub bytes: Option<u64>,
    /// Lines older than this are skipped.
    pub since: Option<Timestamp>,
    /// Keep reading as the file grows, until the container stops.
    pub follow: bool,
    /// Prefix each new line with its time.
    pub timestamps: bool,
    /// Which streams to send.
    pub stream: StreamSelection,
}

impl LogOptions {
    /// upstream: `NewLogOptions(apiOpts, now)`: `sinceSeconds` counts back from `now`, and a
    /// `sinceTime` later than that wins. The options are assumed validated (a negative count is
    /// taken as no limit).
    pub fn new(api: &PodLogOptions, now: Timestamp) -> Self {
        let mut since = api.since_seconds.map(|s| {
            now.checked_sub(SignedDuration::from_secs(s))
                .unwrap_or(Timestamp::MIN)
        });
        if let Some(Time(t)) = api.since_time
            && since.is_none_or(|s| t > s)
        {
            since = Some(t);
        }
        let stream = match api.stream.as_deref() {
            Some(LOG_STREAM_STDOUT) => StreamSelection::Stdout,
            Some(LOG_STREAM_STDERR) => StreamSelection::Stderr,
            _ => StreamSelection::All,
        };
        Self {
            tail: api.tail_lines.and_then(|t| u64::try_from(t).ok()),
            bytes: api.limit_bytes.and_then(|b| u64::try_from(b).ok()),
            since,
            follow: api.follow,
            timestamps: api.timestamps,
            stream,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(query: &str) -> Vec<String> {
        match parse_pod_log_query(query) {
            Err(LogQueryError::Invalid(errs)) => errs.iter().map(ToString::to_string).collect(),
            other => panic!("{query}: expected invalid, got {other:?}"),
        }
    }

    /// upstream: `TestValidatePodLogOptions` (the kubelet's cases, with KEP-3288's stream).
    #[test]
    fn test_validate_pod_log_options() {
        assert_eq!(
            invalid("tailLines=-1"),
            ["tailLines: Invalid value: -1: must be greater than or equal to 0"]
        );
        assert_eq!(
            invalid("limitBytes=0"),
            ["limitBytes: Invalid value: 0: must be greater than 0"]
        );
        assert_eq!(
            invalid("sinceSeconds=0"),
            ["sinceSeconds: Invalid value: 0: must be greater than 0"]
        );
        assert_eq!(
            invalid("sinceSeconds=10&sinceTime=2024-01-01T00:00:00Z"),
            [": Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified"]
        );
        assert_eq!(
            invalid("stream=Both"),
            [r#"stream: Unsupported value: "Both": supported values: "Stdout", "Stderr", "All""#]
        );
        assert_eq!(
            invalid("stream=Stderr&tailLines=3"),
            [": Forbidden: `tailLines` and specific `stream` are mutually exclusive for now"]
        );
        assert_eq!(invalid("stream=Stdout&tail=0").len(), 1);
        let both = parse_pod_log_query("tailLines=-1&limitBytes=0").unwrap_err();
        assert_eq!(
            both.to_string(),
            "validating the containerLogs query: [tailLines: Invalid value: -1: must be greater than or equal to 0, \
             limitBytes: Invalid value: 0: must be greater than 0]"
        );
        assert_eq!(
            (both.http_status(), both.http_body()),
            (422, r#"{"message": "Invalid request."}"#)
        );
        for ok in [
            "",
            "tailLines=0",
            "limitBytes=1",
            "stream=All&tailLines=2",
            "stream=Stdout",
            "sinceSeconds=1",
        ] {
            parse_pod_log_query(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn the_query_decodes_as_upstreams_parameter_codec() {
        let o = parse_pod_log_query(
            "follow=1&previous=False&timestamps=&tail=5&tailLines=9&limitBytes=10&sinceTime=2024-01-02T03:04:05%2B01:00&stream=Stderr&x=y",
        );
        // `tail` with `tailLines`: the legacy name wins, as upstream overwrites `tailLines`;
        // then Stderr with tailLines is invalid.
        assert!(matches!(o, Err(LogQueryError::Invalid(_))));
        let o = parse_pod_log_query(
            "follow=1&previous=False&timestamps=&tail=5&limitBytes=10&follow=0",
        )
        .unwrap();
        assert!(o.follow && !o.previous && o.timestamps);
        assert_eq!((o.tail_lines, o.limit_bytes), (Some(5), Some(10)));
        let o = parse_pod_log_query("tailLines=9&tail=all").unwrap();
        assert_eq!(o.tail_lines, None, "tail=all removes tailLines");
        let o = parse_pod_log_query("sinceTime=2024-01-02T03:04:05%2B01:00").unwrap();
        assert_eq!(o.since_time.unwrap().0.to_string(), "2024-01-02T02:04:05Z");
        let e = parse_pod_log_query("tailLines=x").unwrap_err();
        assert_eq!(
            (e.http_status(), e.http_body()),
            (400, r#"{"message": "Unable to decode query."}"#)
        );
        assert!(matches!(
            e,
            LogQueryError::Decode {
                parameter: "tailLines",
                ..
            }
        ));
    }

    /// upstream: `TestLogOptions` (`NewLogOptions`).
    #[test]
    fn test_log_options() {
        let now: Timestamp = "2024-01-01T00:01:00Z".parse().unwrap();
        let since_time: Timestamp = "2024-01-01T00:00:50Z".parse().unwrap();
        let o = LogOptions::new(&PodLogOptions::default(), now);
        assert_eq!(o, LogOptions::default());
        let o = LogOptions::new(
            &PodLogOptions {
                tail_lines: Some(3),
                limit_bytes: Some(7),
                since_seconds: Some(30),
                follow: true,
                timestamps: true,
                stream: Some("Stdout".into()),
                ..Default::default()
            },
            now,
        );
        assert_eq!(
            o,
            LogOptions {
                tail: Some(3),
                bytes: Some(7),
                since: Some("2024-01-01T00:00:30Z".parse().unwrap()),
                follow: true,
                timestamps: true,
                stream: StreamSelection::Stdout,
            }
        );
        let o = LogOptions::new(
            &PodLogOptions {
                since_time: Some(Time(since_time)),
                ..Default::default()
            },
            now,
        );
        assert_eq!(o.since, Some(since_time));
    }
}
