//! How drain outcomes read.

use std::time::Duration;

use pretty_assertions::assert_eq;

use super::*;

#[test]
fn drain_outcomes_read_well() {
    let cases = [
        (
            DrainOutcome::Drained {
                evicted: 0,
                deleted: 0,
            },
            "no pods to evict",
        ),
        (
            DrainOutcome::Drained {
                evicted: 1,
                deleted: 0,
            },
            "1 pod evicted",
        ),
        (
            DrainOutcome::Drained {
                evicted: 0,
                deleted: 4,
            },
            "4 pods deleted",
        ),
        (
            DrainOutcome::Drained {
                evicted: 3,
                deleted: 1,
            },
            "3 pods evicted, 1 pod deleted",
        ),
        (
            DrainOutcome::InProgress {
                remaining: 1,
                blocked: None,
            },
            "1 pod left",
        ),
        (
            DrainOutcome::TimedOut {
                timeout: Duration::from_hours(2),
                remaining: 2,
            },
            "the drain did not finish within 2h0m0s, 2 pods left",
        ),
        (
            DrainOutcome::Failed {
                message: "pods is forbidden".into(),
            },
            "pods is forbidden",
        ),
    ];
    for (outcome, text) in cases {
        assert_eq!(outcome.to_string(), text);
    }
    assert!(
        DrainOutcome::Drained {
            evicted: 0,
            deleted: 0
        }
        .is_drained()
    );
}
