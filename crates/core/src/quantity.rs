//! Semantic equality of Kubernetes quantities (`1Gi` = `1024Mi`, `1000m` = `1`).
//!
//! A real API server canonicalizes quantities it stores (`1000m` comes back as `1`); comparing strings would make
//! the node sync rewrite the node's capacity forever. Values are compared exactly in units of 10⁻⁹; a quantity
//! that cannot be represented that way (finer than nano, or too large) is compared as written.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Whether two quantities are the same amount.
pub(crate) fn equal(a: &Quantity, b: &Quantity) -> bool {
    a.0 == b.0 || matches!((nanos(&a.0), nanos(&b.0)), (Some(x), Some(y)) if x == y)
}

/// The value of a quantity in units of 10⁻⁹, if it can be represented exactly.
fn nanos(text: &str) -> Option<i128> {
    let text = text.trim();
    let (negative, text) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let mut mantissa: i128 = 0;
    for digit in whole.bytes().chain(fraction.bytes()) {
        if digit == b'.' {
            return None;
        }
        mantissa = mantissa.checked_mul(10)?.checked_add(i128::from(digit - b'0'))?;
    }
    let fraction_digits = i32::try_from(fraction.len()).ok()?;
    // value = mantissa · 10^(exp10 − fraction_digits) · 2^exp2, in units of 10⁻⁹: add 9 to the decimal exponent.
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        exponent => {
            let digits = exponent
                .strip_prefix('e')
                .or_else(|| exponent.strip_prefix('E'))?;
            (digits.parse::<i32>().ok().filter(|e| e.abs() <= 30)?, 0)
        }
    };
    let mut value = mantissa.checked_mul(1i128.checked_shl(exp2)?)?;
    let scale = exp10 - fraction_digits + 9;
    if scale >= 0 {
        value = value.checked_mul(10i128.checked_pow(u32::try_from(scale).ok()?)?)?;
    } else {
        let divisor = 10i128.checked_pow(scale.unsigned_abs())?;
        if value % divisor != 0 {
            return None;
        }
        value /= divisor;
    }
    Some(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_owned())
    }

    #[test]
    fn equal_amounts_in_different_notations_are_equal() {
        for (a, b) in [
            ("1Gi", "1024Mi"),
            ("1", "1000m"),
            ("1k", "1000"),
            ("1.5", "1500m"),
            ("1e3", "1k"),
            ("1E3", "1000"),
            ("0", "0m"),
            ("+2", "2"),
            ("100n", "0.0000001"),
        ] {
            assert!(equal(&q(a), &q(b)), "{a} = {b}");
        }
        for (a, b) in [("1Gi", "1G"), ("1", "2"), ("-1", "1"), ("1m", "1M")] {
            assert!(!equal(&q(a), &q(b)), "{a} != {b}");
        }
    }

    #[test]
    fn odd_text_is_compared_as_written() {
        assert!(equal(&q("lots"), &q("lots")));
        assert!(!equal(&q("lots"), &q("many")));
        for text in [
            "",
            "-",
            ".",
            "1..2",
            "1e999",
            "99999999999999999999999999999999999999999Ei",
            "1Xi",
        ] {
            let _ = nanos(text);
        }
        assert_eq!(nanos("1Ei"), Some((1i128 << 60) * 1_000_000_000));
    }
}
