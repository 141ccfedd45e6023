//! Go duration strings (`metav1.Duration`) as they appear on the wire.
//!
//! Durations stay strings in the API types so that an invalid value (`"5 minutes"`) does not make the whole object
//! undecodable: a watch keeps working and validation reports the field path and the reason instead.

use std::{borrow::Cow, fmt, time::Duration};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Go duration string such as `"10m"`, `"1h30m"` or `"500ms"`, kept verbatim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GoDuration(pub String);

/// Why a Go duration string could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The text is not a Go duration.
    #[error("invalid duration {value:?}: {reason}")]
    Invalid {
        /// The text as written.
        value: String,
        /// What the parser said.
        reason: String,
    },
    /// The duration is negative, which no timeout or period may be.
    #[error("duration {0:?} must not be negative")]
    Negative(String),
}

impl GoDuration {
    /// Wraps a duration string without checking it; [`GoDuration::parse`] checks.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// Formats a standard duration the way Go's `time.Duration.String` does (`10m0s`, `1h0m0s`, `1.5s`, `500ms`).
    pub fn from_std(duration: Duration) -> Self {
        Self(format_go(duration))
    }

    /// Parses the string as a Go duration; negative durations are refused.
    pub fn parse(&self) -> Result<Duration, DurationError> {
        let parsed: kube::core::Duration =
            self.0
                .parse()
                .map_err(|err: kube::core::duration::ParseError| DurationError::Invalid {
                    value: self.0.clone(),
                    reason: err.to_string(),
                })?;
        if parsed.is_negative() {
            return Err(DurationError::Negative(self.0.clone()));
        }
        Ok(parsed.into())
    }

    /// The duration as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Go's `time.Duration.String` for a non-negative duration.
fn format_go(duration: Duration) -> String {
    fn with_fraction(whole: u128, fraction: u128, fraction_digits: usize, unit: &str) -> String {
        let mut text = whole.to_string();
        if fraction > 0 {
            let digits = format!("{fraction:0fraction_digits$}");
            text.push('.');
            text.push_str(digits.trim_end_matches('0'));
        }
        text.push_str(unit);
        text
    }
    let nanos = duration.as_nanos();
    match nanos {
        0 => "0s".to_owned(),
        1..1_000 => format!("{nanos}ns"),
        1_000..1_000_000 => with_fraction(nanos / 1_000, nanos % 1_000, 3, "\u{b5}s"),
        1_000_000..1_000_000_000 => with_fraction(nanos / 1_000_000, nanos % 1_000_000, 6, "ms"),
        _ => {
            let total_seconds = nanos / 1_000_000_000;
            let seconds = with_fraction(total_seconds % 60, nanos % 1_000_000_000, 9, "s");
            let (minutes, hours) = ((total_seconds / 60) % 60, total_seconds / 3600);
            if hours > 0 {
                format!("{hours}h{minutes}m{seconds}")
            } else if minutes > 0 {
                format!("{minutes}m{seconds}")
            } else {
                seconds
            }
        }
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl JsonSchema for GoDuration {
    fn schema_name() -> Cow<'static, str> {
        "GoDuration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // Not format "duration": that would mean ISO 8601, and these are Go durations.
        schemars::json_schema!({ "type": "string" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations_as_the_reference_writes_them() {
        assert_eq!(GoDuration::new("5m").parse(), Ok(Duration::from_mins(5)));
        assert_eq!(GoDuration::new("1h30m").parse(), Ok(Duration::from_mins(90)));
        assert_eq!(GoDuration::new("500ms").parse(), Ok(Duration::from_millis(500)));
    }

    #[test]
    fn refuses_text_and_negative_durations() {
        assert!(matches!(
            GoDuration::new("5 minutes").parse(),
            Err(DurationError::Invalid { .. })
        ));
        assert_eq!(
            GoDuration::new("-1m").parse(),
            Err(DurationError::Negative("-1m".into()))
        );
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(15), "15ns"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_mins(10), "10m0s"),
            (Duration::from_secs(3725), "1h2m5s"),
            (Duration::from_hours(96), "96h0m0s"),
        ];
        for (duration, text) in cases {
            assert_eq!(GoDuration::from_std(duration).as_str(), text);
            assert_eq!(GoDuration::new(text).parse(), Ok(duration), "{text} parses back");
        }
    }
}
