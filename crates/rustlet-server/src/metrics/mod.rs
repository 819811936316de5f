//! The kubelet's Prometheus endpoints besides `/metrics`: `/metrics/resource` ([`resource`],
//! what metrics-server reads), `/metrics/probes` ([`probes`]) and `/metrics/cadvisor`
//! ([`cadvisor`]), in the Prometheus text format
//! (0.0.4) with upstream's names, help texts, label order and number format, as
//! `k8s.io/component-base/metrics` and `prometheus/common/expfmt` write them.

pub mod cadvisor;
pub mod probes;
pub mod resource;

use std::fmt::Write as _;

/// The content type of the Prometheus text format (upstream's `expfmt.FmtText`).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric's stability, written before its help text (upstream: `[ALPHA]`, `[BETA]`,
/// `[STABLE]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stability {
    /// `[ALPHA]`.
    Alpha,
    /// `[BETA]`.
    Beta,
    /// `[STABLE]`.
    Stable,
    /// None written: a family registered outside component-base (cAdvisor's).
    Unlabelled,
}

/// A metric's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `counter`.
    Counter,
    /// `gauge`.
    Gauge,
}

/// One family's description.
#[derive(Clone, Copy, Debug)]
pub struct Desc {
    /// The name.
    pub name: &'static str,
    /// The help text (without the stability).
    pub help: &'static str,
    /// Its stability.
    pub stability: Stability,
    /// Its type.
    pub kind: Kind,
}

/// One sample: label pairs, value, optional timestamp.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The label pairs (sorted by name when written, as client_golang's `MakeLabelPairs`).
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: f64,
    /// Milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
}

/// Go's `strconv.FormatFloat(f, 'g', -1, 64)`, as expfmt writes values: the shortest digits,
/// in exponent form (`1.2345e+07`) when the decimal exponent is below -4 or at least 6.
pub fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    // Rust's `{:e}` writes the shortest digits that round-trip: `d.ddde±x`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, digits) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m.replace('.', "")),
        None => ("", mantissa.replace('.', "")),
    };
    // `strconv/ftoa.go`: `%e` when exp < -4 || exp >= eprec, and `if shortest { eprec = 6 }`.
    let eprec = 6;
    if exp < -4 || exp >= eprec {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}{rest}e{exp_sign}{:02}", exp.abs());
    }
    if exp < 0 {
        let zeros = "0".repeat(usize::try_from(-exp - 1).unwrap_or(0));
        return format!("{sign}0.{zeros}{digits}");
    }
    let point = usize::try_from(exp + 1).unwrap_or(0);
    if digits.len() <= point {
        let zeros = "0".repeat(point - digits.len());
        format!("{sign}{digits}{zeros}")
    } else {
        let (int, frac) = digits.split_at(point);
        format!("{sign}{int}.{frac}")
    }
}

/// A label value escaped as expfmt does (`\\`, `\"`, `\n`).
fn escape(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// Writes families in name order, each with its samples sorted by label values; a family
/// without samples is left out (client_golang's `Gather` and `NormalizeMetricFamilies`).
pub fn encode(mut families: Vec<(Desc, Vec<Sample>)>) -> String {
    families.retain(|(_, samples)| !samples.is_empty());
    families.sort_by_key(|(desc, _)| desc.name);
    let mut out = String::new();
    for (desc, mut samples) in families {
        let stability = match desc.stability {
            Stability::Alpha => "[ALPHA] ",
            Stability::Beta => "[BETA] ",
            Stability::Stable => "[STABLE] ",
            Stability::Unlabelled => "",
        };
        let kind = match desc.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(out, "# HELP {} {stability}{}", desc.name, desc.help);
        let _ = writeln!(out, "# TYPE {} {kind}", desc.name);
        for sample in &mut samples {
            sample.labels.sort_by_key(|(name, _)| *name);
        }
        samples.sort_by(|a, b| {
            let values = |s: &Sample| s.labels.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>();
            values(a).cmp(&values(b))
        });
        for sample in samples {
            out.push_str(desc.name);
            if !sample.labels.is_empty() {
                let labels: Vec<String> = sample
                    .labels
                    .iter()
                    .map(|(name, value)| format!("{name}=\"{}\"", escape(value)))
                    .collect();
                let _ = write!(out, "{{{}}}", labels.join(","));
            }
            let _ = write!(out, " {}", go_float(sample.value));
            if let Some(ms) = sample.timestamp_ms {
                let _ = write!(out, " {ms}");
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values as Go's `strconv.FormatFloat(f, 'g', -1, 64)` writes them.
    #[test]
    fn floats_are_written_as_go_writes_them() {
        for (f, go) in [
            (0.0, "0"),
            (1.0, "1"),
            (357.35491, "357.35491"),
            (123456.0, "123456"),
            (1e6, "1e+06"),
            (12_238_848.0, "1.2238848e+07"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (1_624_396_278.302, "1.624396278302e+09"),
        ] {
            assert_eq!(go_float(f), go, "{f}");
        }
    }
}
