//! The timestamps of CRI log lines: Go's `RFC3339NanoLenient` in, `RFC3339NanoFixed` out, with
//! the line's own UTC offset kept (Go's `time.Parse` keeps it and `Format` writes it back).

use std::fmt;

use k8s_openapi::jiff::{
    Timestamp,
    civil::DateTime,
    tz::{Offset, TimeZone},
};

/// A log line's time: the instant, and the offset it was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogTime {
    /// The instant.
    pub instant: Timestamp,
    /// The offset from UTC in seconds the runtime wrote (0 for `Z`).
    pub offset_seconds: i32,
}

/// Why a timestamp did not parse (upstream: the error of `time.Parse(timeFormatIn, ...)`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("parsing time {input:?} as \"2006-01-02T15:04:05.999999999Z07:00\": {reason}")]
pub struct TimeParseError {
    /// The text that did not parse.
    pub input: String,
    /// What was wrong with it.
    pub reason: &'static str,
}

fn digits(b: &[u8], at: usize, n: usize) -> Option<i32> {
    let s = b.get(at..at + n)?;
    let mut v = 0i32;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + i32::from(c - b'0');
    }
    Some(v)
}

impl LogTime {
    /// Parses `2006-01-02T15:04:05[.999999999](Z|±07:00)` (upstream: `timeFormatIn`,
    /// `RFC3339NanoLenient`: the fraction is optional and 1 to 9 digits).
    pub fn parse(input: &[u8]) -> Result<Self, TimeParseError> {
        let err = |reason| TimeParseError {
            input: String::from_utf8_lossy(input).into_owned(),
            reason,
        };
        let b = input;
        let field = |at, n| digits(b, at, n).ok_or_else(|| err("expected digits"));
        let sep = |at: usize, c: u8| {
            if b.get(at) == Some(&c) {
                Ok(())
            } else {
                Err(err("unexpected separator"))
            }
        };
        let year = field(0, 4)?;
        sep(4, b'-')?;
        let month = field(5, 2)?;
        sep(7, b'-')?;
        let day = field(8, 2)?;
        sep(10, b'T')?;
        let hour = field(11, 2)?;
        sep(13, b':')?;
        let minute = field(14, 2)?;
        sep(16, b':')?;
        let second = field(17, 2)?;
        let mut at = 19;
        let mut nanos = 0i32;
        if b.get(at) == Some(&b'.') {
            at += 1;
            let start = at;
            while at < b.len() && b[at].is_ascii_digit() {
                at += 1;
            }
            let n = at - start;
            if n == 0 || n > 9 {
                return Err(err("fractional second must have 1 to 9 digits"));
            }
            nanos = field(start, n)? * 10i32.pow(9 - n as u32);
        }
        let offset_seconds = match b.get(at) {
            Some(b'Z') if b.len() == at + 1 => 0,
            Some(&sign @ (b'+' | b'-')) if b.len() == at + 6 => {
                let h = field(at + 1, 2)?;
                sep(at + 3, b':')?;
                let m = field(at + 4, 2)?;
                if h > 23 || m > 59 {
                    return Err(err("time zone offset out of range"));
                }
                let s = h * 3600 + m * 60;
                if sign == b'-' { -s } else { s }
            }
            _ => return Err(err("expected Z or a ±hh:mm offset at the end")),
        };
        let civil = DateTime::new(
            year as i16,
            month as i8,
            day as i8,
            hour as i8,
            minute as i8,
            second as i8,
            nanos,
        )
        .map_err(|_| err("date or time out of range"))?;
        let offset = Offset::from_seconds(offset_seconds)
            .map_err(|_| err("time zone offset out of range"))?;
        let instant = offset
            .to_timestamp(civil)
            .map_err(|_| err("date or time out of range"))?;
        Ok(Self {
            instant,
            offset_seconds,
        })
    }

    /// A time in UTC.
    pub fn utc(instant: Timestamp) -> Self {
        Self {
            instant,
            offset_seconds: 0,
        }
    }
}

/// Writes `2006-01-02T15:04:05.000000000Z07:00` (upstream: `RFC3339NanoFixed`, `timeFormatOut`):
/// nine fraction digits always, `Z` for a zero offset, the line's own offset otherwise.
impl fmt::Display for LogTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let offset = Offset::from_seconds(self.offset_seconds).unwrap_or(Offset::UTC);
        let dt = TimeZone::fixed(offset).to_datetime(self.instant);
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}",
            dt.year(),
            dt.month(),
            dt.day(),
            dt.hour(),
            dt.minute(),
            dt.second(),
            dt.subsec_nanosecond()
        )?;
        if self.offset_seconds == 0 {
            f.write_str("Z")
        } else {
            let sign = if self.offset_seconds < 0 { '-' } else { '+' };
            let abs = self.offset_seconds.unsigned_abs();
            write!(f, "{sign}{:02}:{:02}", abs / 3600, abs % 3600 / 60)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lenient_fractions_and_offsets_and_formats_fixed() {
        let t = LogTime::parse(b"2016-10-06T00:17:09.669794202Z").unwrap();
        assert_eq!(t.to_string(), "2016-10-06T00:17:09.669794202Z");
        let t = LogTime::parse(b"2016-10-06T00:17:09.5Z").unwrap();
        assert_eq!(t.to_string(), "2016-10-06T00:17:09.500000000Z");
        let t = LogTime::parse(b"2016-10-06T02:17:09+02:00").unwrap();
        assert_eq!(t.to_string(), "2016-10-06T02:17:09.000000000+02:00");
        assert_eq!(
            t.instant,
            LogTime::parse(b"2016-10-06T00:17:09Z").unwrap().instant
        );
        for bad in [
            &b"2016-10-06 00:17:09Z"[..],
            b"2016-13-06T00:17:09Z",
            b"2016-10-06T00:17:09",
            b"x",
        ] {
            assert!(
                LogTime::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
