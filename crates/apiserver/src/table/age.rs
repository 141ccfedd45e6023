//! Ages as kubectl prints them (`4m41s`, `3h12m`, `2y`): Kubernetes' HumanDuration, and the `<unknown>` /
//! `<invalid>` cells of missing or future timestamps. Separate because every printer (built-in and CRD) uses it.

use std::time::Duration;

use jiff::Timestamp;

/// Kubernetes' human-readable age ("0s", "30s", "4m41s", "3h12m", "5d", "2y"), as duration.HumanDuration prints it.
pub fn human_age(age: Duration) -> String {
    let seconds = age.as_secs();
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Age of an RFC 3339 timestamp at `now`, as the real server renders it: "<unknown>" when absent or empty,
/// "<invalid>" when unparsable or more than a second in the future.
pub(super) fn age_since(timestamp: Option<&str>, now: Timestamp) -> String {
    let Some(text) = timestamp.filter(|t| !t.is_empty()) else {
        return "<unknown>".to_owned();
    };
    let Ok(ts) = text.parse::<Timestamp>() else {
        return "<invalid>".to_owned();
    };
    age_at(ts, now)
}

/// Age of a timestamp at `now`; "<invalid>" when more than a second in the future.
pub(super) fn age_at(ts: Timestamp, now: Timestamp) -> String {
    let seconds = now.duration_since(ts).as_secs();
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    human_age(Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
}
