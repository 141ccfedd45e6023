//! `meta.v1.Duration`: nanoseconds on the wire, Go's duration text (`1h2m3.5s`, `300ms`) in JSON.

const UNITS: [(&str, i64); 7] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Nanoseconds of a Go duration text; None when it is not one.
pub fn parse(text: &str) -> Option<i64> {
    let (negative, mut rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = UNITS.iter().find(|(name, _)| *name == &rest[..unit])?.1;
        rest = &rest[unit..];
        #[allow(clippy::cast_precision_loss)]
        let part = number * scale as f64;
        total += part;
    }
    #[allow(clippy::cast_possible_truncation)]
    let nanos = total.round() as i64;
    Some(if negative { -nanos } else { nanos })
}

/// Go's `time.Duration.String()` of nanoseconds.
pub fn format(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    if n < 1_000_000_000 {
        let (value, unit, scale) = if n < 1_000 {
            (n, "ns", 1)
        } else if n < 1_000_000 {
            (n, "µs", 1_000)
        } else {
            (n, "ms", 1_000_000)
        };
        return format!("{sign}{}{unit}", fraction(value, scale));
    }
    let hours = n / 3_600_000_000_000;
    let minutes = n / 60_000_000_000 % 60;
    let seconds = fraction(n % 60_000_000_000, 1_000_000_000);
    match (hours, minutes) {
        (0, 0) => format!("{sign}{seconds}s"),
        (0, m) => format!("{sign}{m}m{seconds}s"),
        (h, m) => format!("{sign}{h}h{m}m{seconds}s"),
    }
}

/// `value / scale` with the fraction's trailing zeros dropped (`1500, 1000` → `1.5`).
fn fraction(value: u64, scale: u64) -> String {
    let whole = value / scale;
    let rest = value % scale;
    if rest == 0 {
        return whole.to_string();
    }
    let width = scale.to_string().len() - 1;
    let digits = format!("{rest:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_duration_texts_round_trip() {
        for (text, nanos) in [
            ("0s", 0),
            ("1h0m0s", 3_600_000_000_000),
            ("1m30s", 90_000_000_000),
            ("1.5s", 1_500_000_000),
            ("300ms", 300_000_000),
            ("-2s", -2_000_000_000),
        ] {
            assert_eq!(parse(text), Some(nanos), "{text}");
            assert_eq!(format(nanos), text);
        }
        assert_eq!(parse("90s"), Some(90_000_000_000));
        assert_eq!(parse("ten"), None);
        assert_eq!(parse(""), None);
    }
}
