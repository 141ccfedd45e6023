//! Ages as HumanDuration prints them, and the cells of missing, unreadable or future timestamps.

use std::time::Duration;

use super::now;
use crate::table::{age::age_since, human_age};

#[test]
fn human_age_follows_human_duration() {
    let cases = [
        (0, "0s"),
        (59, "59s"),
        (119, "119s"),
        (120, "2m"),
        (281, "4m41s"),
        (599, "9m59s"),
        (600, "10m"),
        (3 * 3600 - 1, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 12 * 60 + 5, "3h12m"),
        (8 * 3600, "8h"),
        (25 * 3600, "25h"),
        (47 * 3600 + 59 * 60, "47h"),
        (48 * 3600, "2d"),
        (3 * 86400, "3d"),
        (3 * 86400 + 5 * 3600, "3d5h"),
        (8 * 86400, "8d"),
        (729 * 86400, "729d"),
        (730 * 86400, "2y"),
        (731 * 86400, "2y1d"),
        (8 * 365 * 86400, "8y"),
        (20 * 365 * 86400 + 86400, "20y"),
    ];
    for (secs, want) in cases {
        assert_eq!(human_age(Duration::from_secs(secs)), want, "{secs}s");
    }
    assert_eq!(human_age(Duration::from_millis(1999)), "1s");
    let now = now();
    assert_eq!(age_since(Some("2026-11-22T11:09:30Z"), now), "30s");
    assert_eq!(age_since(Some("2026-11-22T11:10:01Z"), now), "0s");
    assert_eq!(age_since(Some("2026-11-22T11:10:05Z"), now), "<invalid>");
    assert_eq!(age_since(Some("yesterday"), now), "<invalid>");
    assert_eq!(age_since(None, now), "<unknown>");
}
