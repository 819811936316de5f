//! Resource quantities: value comparison (`100m` equals `0.1`), as upstream's semantic
//! equality compares `resource.Quantity` with `Cmp`.
//!
//! A quantity is parsed into an exact decimal `mantissa × 10^exponent`; binary suffixes are
//! multiplied into the mantissa. What does not parse, or overflows, is compared as text.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

#[derive(Debug, PartialEq, Eq)]
struct Decimal {
    mantissa: i128,
    exponent: i32,
}

fn parse(text: &str) -> Option<Decimal> {
    let text = text.trim();
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return None; // "." alone, or a second point ("1..2")
    }
    let mut mantissa: i128 = 0;
    for digit in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa
            .checked_mul(10)?
            .checked_add(i128::from(digit - b'0'))?;
    }
    let mut exponent = -i32::try_from(frac_part.len()).ok()?;
    let binary_power = |k: u32| -> Option<i128> { 1i128.checked_shl(10 * k) };
    match suffix {
        "" => {}
        "Ki" => mantissa = mantissa.checked_mul(binary_power(1)?)?,
        "Mi" => mantissa = mantissa.checked_mul(binary_power(2)?)?,
        "Gi" => mantissa = mantissa.checked_mul(binary_power(3)?)?,
        "Ti" => mantissa = mantissa.checked_mul(binary_power(4)?)?,
        "Pi" => mantissa = mantissa.checked_mul(binary_power(5)?)?,
        "Ei" => mantissa = mantissa.checked_mul(binary_power(6)?)?,
        "n" => exponent -= 9,
        "u" => exponent -= 6,
        "m" => exponent -= 3,
        "k" => exponent += 3,
        "M" => exponent += 6,
        "G" => exponent += 9,
        "T" => exponent += 12,
        "P" => exponent += 15,
        "E" => exponent += 18,
        s if s.starts_with(['e', 'E']) => {
            let power = &s[1..];
            let digits = power.trim_start_matches(['+', '-']);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            exponent = exponent.checked_add(power.parse::<i32>().ok()?)?;
        }
        _ => return None,
    }
    if negative {
        mantissa = -mantissa;
    }
    if mantissa == 0 {
        return Some(Decimal {
            mantissa: 0,
            exponent: 0,
        });
    }
    while mantissa % 10 == 0 {
        mantissa /= 10;
        exponent += 1;
    }
    Some(Decimal { mantissa, exponent })
}

/// The value of a quantity rounded up to a whole number (bytes, for storage sizes); `None`
/// when it does not parse or does not fit.
pub fn quantity_ceil(q: &Quantity) -> Option<i128> {
    let d = parse(&q.0)?;
    if d.exponent >= 0 {
        return d
            .mantissa
            .checked_mul(10i128.checked_pow(u32::try_from(d.exponent).ok()?)?);
    }
    let divisor = 10i128.checked_pow(u32::try_from(-d.exponent).ok()?)?;
    let quotient = d.mantissa.div_euclid(divisor);
    Some(if d.mantissa.rem_euclid(divisor) == 0 {
        quotient
    } else {
        quotient + 1
    })
}

/// The value of a quantity in thousandths, rounded up (upstream `MilliValue`, for CPU); `None`
/// when it does not parse or does not fit.
pub fn quantity_milli_ceil(q: &Quantity) -> Option<i128> {
    let d = parse(&q.0)?;
    quantity_ceil(&Quantity(format!(
        "{}e{}",
        d.mantissa,
        d.exponent.checked_add(3)?
    )))
}

/// Whether `text` is a quantity upstream's `ParseQuantity` accepts (its grammar:
/// `^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$`, one point at most, a known suffix).
pub fn is_quantity(text: &str) -> bool {
    parse(text).is_some()
}

/// The order of two quantities' values; `None` when either does not parse.
pub fn quantity_cmp(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    let (x, y) = (parse(a)?, parse(b)?);
    // Align to the smaller exponent; if that overflows, the magnitudes decide (approximately).
    let common = x.exponent.min(y.exponent);
    let scale = |d: &Decimal| -> Option<i128> {
        d.mantissa
            .checked_mul(10i128.checked_pow(u32::try_from(d.exponent - common).ok()?)?)
    };
    match (scale(&x), scale(&y)) {
        (Some(a), Some(b)) => Some(a.cmp(&b)),
        _ => {
            let value = |d: &Decimal| d.mantissa as f64 * 10f64.powi(d.exponent);
            value(&x).partial_cmp(&value(&y))
        }
    }
}

/// True when both quantities denote the same value.
pub fn quantity_eq(a: &Quantity, b: &Quantity) -> bool {
    if a.0 == b.0 {
        return true;
    }
    match (parse(&a.0), parse(&b.0)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_owned())
    }

    #[test]
    fn malformed_quantities_are_refused_without_a_panic() {
        for text in [
            "1..2", ".", "", "1.2.3", "1e", "1e+", "1ex", "12x", "Gi", "1Gb", "m1",
        ] {
            assert!(!is_quantity(text), "{text}");
        }
        for text in ["1", "1.5", ".5", "100m", "1Gi", "1e3", "+2k", "-1"] {
            assert!(is_quantity(text), "{text}");
        }
    }

    #[test]
    fn quantities_compare_by_value() {
        use std::cmp::Ordering::*;
        assert_eq!(quantity_cmp("2", "1"), Some(Greater));
        assert_eq!(quantity_cmp("1000m", "1"), Some(Equal));
        assert_eq!(quantity_cmp("128Mi", "1Gi"), Some(Less));
        assert_eq!(quantity_cmp("-1", "0"), Some(Less));
        assert_eq!(quantity_cmp("1E18", "1n"), Some(Greater), "far apart");
        assert_eq!(quantity_cmp("x", "1"), None);
        for (a, b) in [
            ("100m", "0.1"),
            ("1Gi", "1073741824"),
            ("+2k", "2000"),
            ("1e3", "1000"),
            ("128Mi", "134217728"),
        ] {
            assert_eq!(quantity_cmp(a, b), Some(Equal), "{a} = {b}");
        }
    }

    #[test]
    fn milli_values_round_up() {
        for (text, milli) in [
            ("1", 1000),
            ("250m", 250),
            ("0.5", 500),
            ("1.0001", 1001),
            ("2k", 2_000_000),
            ("1n", 1),
        ] {
            assert_eq!(
                quantity_milli_ceil(&Quantity(text.into())),
                Some(milli),
                "{text}"
            );
        }
        assert_eq!(quantity_milli_ceil(&Quantity("x".into())), None);
    }

    #[test]
    fn equal_values_in_different_notations() {
        for (a, b) in [
            ("100m", "0.1"),
            ("1", "1000m"),
            ("1Ki", "1024"),
            ("1Mi", "1048576"),
            ("1k", "1000"),
            ("1e3", "1k"),
            ("0", "0m"),
            ("1.5Gi", "1536Mi"),
            ("-1", "-1000m"),
        ] {
            assert!(quantity_eq(&q(a), &q(b)), "{a} == {b}");
        }
    }

    #[test]
    fn ceil_to_whole_units() {
        assert_eq!(quantity_ceil(&q("2Gi")), Some(2 << 30));
        assert_eq!(quantity_ceil(&q("1500m")), Some(2));
        assert_eq!(quantity_ceil(&q("1k")), Some(1000));
        assert_eq!(quantity_ceil(&q("junk")), None);
    }

    #[test]
    fn different_values_differ() {
        for (a, b) in [("100m", "0.2"), ("1Ki", "1k"), ("1", "-1"), ("abc", "abd")] {
            assert!(!quantity_eq(&q(a), &q(b)), "{a} != {b}");
        }
    }
}
