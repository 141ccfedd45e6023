//! Force rules, timeouts and eviction retries.

use std::{collections::BTreeMap, time::Duration};

use mcm_api::keys::labels;
use pretty_assertions::assert_eq;

use super::*;

#[test]
fn parse_bool_is_gos() {
    for yes in ["1", "t", "T", "TRUE", "true", "True"] {
        assert_eq!(parse_bool(yes), Some(true), "{yes}");
    }
    for no in ["0", "f", "F", "FALSE", "false", "False"] {
        assert_eq!(parse_bool(no), Some(false), "{no}");
    }
    for neither in ["", "yes", "tRUE", " true", "2"] {
        assert_eq!(parse_bool(neither), None, "{neither}");
    }
}

#[test]
fn the_force_deletion_label_forces_when_it_parses_true() {
    // Reference §4: "the machine label force-deletion parses as true (strconv.ParseBool)".
    let s = settings();
    for (value, forced) in [
        ("True", true),
        ("1", true),
        ("t", true),
        ("false", false),
        ("yes", false),
    ] {
        let mut m = deleted_machine();
        m.metadata.labels = Some(BTreeMap::from([(labels::FORCE_DELETION.into(), value.into())]));
        let reason = force_reason(&m, &[], at(DELETED), &s);
        assert_eq!(reason.is_some(), forced, "{value}");
    }
    let mut m = deleted_machine();
    m.metadata.labels = Some(BTreeMap::from([(labels::FORCE_DELETION.into(), "True".into())]));
    assert_eq!(
        force_reason(&m, &[], at(DELETED), &s).unwrap().to_string(),
        "the machine has the label force-deletion=True"
    );
}

#[test]
fn the_drain_timeout_since_the_deletion_forces() {
    // Reference §4: "now − deletionTimestamp > drainTimeout (effective drainTimeout, default 2h)".
    let s = settings();
    let m = deleted_machine();
    assert_eq!(force_reason(&m, &[], at(DELETED + 7199), &s), None);
    assert_eq!(
        force_reason(&m, &[], at(DELETED + 7200), &s),
        Some(ForceReason::DrainTimeout {
            timeout: Duration::from_hours(2)
        })
    );
    assert_eq!(force_at(&m, &[], &s), Some(at(DELETED + 7200)));
}

#[test]
fn a_node_not_ready_for_five_minutes_forces() {
    // Reference §4: "the Node has been Ready!=True for more than 5 min".
    let s = settings();
    let m = deleted_machine();
    for status in ["False", "Unknown"] {
        let conditions = [condition("Ready", status, Some(DELETED - 100))];
        assert_eq!(force_reason(&m, &conditions, at(DELETED + 199), &s), None);
        assert_eq!(
            force_reason(&m, &conditions, at(DELETED + 200), &s),
            Some(ForceReason::NodeNotReady {
                after: Duration::from_mins(5)
            })
        );
        assert_eq!(force_at(&m, &conditions, &s), Some(at(DELETED + 200)));
    }
    let ready = [condition("Ready", "True", Some(DELETED - 10_000))];
    assert_eq!(force_reason(&m, &ready, at(DELETED + 200), &s), None);
    // Without a transition time there is no instant to measure from: not forced.
    let unknown_since = [condition("Ready", "False", None)];
    assert_eq!(force_reason(&m, &unknown_since, at(DELETED + 200), &s), None);
}

#[test]
fn a_readonly_filesystem_for_five_minutes_forces() {
    // Reference §4 (PR #839): "ReadonlyFilesystem!=False for more than 5 min".
    let s = settings();
    let m = deleted_machine();
    let conditions = [
        condition("Ready", "True", Some(0)),
        condition("ReadonlyFilesystem", "True", Some(DELETED)),
    ];
    assert_eq!(force_reason(&m, &conditions, at(DELETED + 299), &s), None);
    assert_eq!(
        force_reason(&m, &conditions, at(DELETED + 300), &s),
        Some(ForceReason::ReadonlyFilesystem {
            after: Duration::from_mins(5)
        })
    );
    let fine = [condition("ReadonlyFilesystem", "False", Some(0))];
    assert_eq!(force_reason(&m, &fine, at(DELETED + 300), &s), None);
}

#[test]
fn under_force_the_timeout_is_one_minute_and_one_attempt() {
    // Reference §4: "Under force: drain timeout = 1 min, maxEvictRetries = 1".
    let s = settings();
    let m = deleted_machine();
    let normal = drain_mode(&m, &[], at(DELETED), &s);
    assert_eq!(normal.force, None);
    assert_eq!(normal.timeout, Duration::from_hours(2));
    assert_eq!(normal.max_evict_retries, 360);
    assert_eq!(normal.force_at, Some(at(DELETED + 7200)));
    let forced = drain_mode(&m, &[], at(DELETED + 7200), &s);
    assert!(forced.force.is_some());
    assert_eq!(forced.timeout, Duration::from_mins(1));
    assert_eq!(forced.max_evict_retries, 1);
    assert_eq!(forced.force_at, None);
}

#[test]
fn max_evict_retries_is_bounded_by_the_drain_timeout() {
    // Reference: min(maxEvictRetries, drainTimeout / PodEvictionRetryInterval); 2h / 20s = 360.
    let interval = Duration::from_secs(20);
    assert_eq!(max_evict_retries(Duration::from_hours(2), 360, interval), 360);
    assert_eq!(max_evict_retries(Duration::from_hours(4), 360, interval), 360);
    assert_eq!(max_evict_retries(Duration::from_mins(10), 360, interval), 30);
    assert_eq!(max_evict_retries(Duration::from_mins(10), 5, interval), 5);
    assert_eq!(max_evict_retries(Duration::from_secs(30), 360, interval), 1);
    assert_eq!(max_evict_retries(Duration::ZERO, 360, interval), 1, "at least 1");
    assert_eq!(max_evict_retries(Duration::from_hours(2), -4, interval), 1);
    assert_eq!(max_evict_retries(Duration::from_hours(2), 9, Duration::ZERO), 9);
}
