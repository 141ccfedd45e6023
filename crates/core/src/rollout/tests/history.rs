//! Revisions, history cleanup and status counts.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mcm_api::{MachineSet, MachineSetStatus, keys::annotations};
use pretty_assertions::assert_eq;

use super::*;

fn set_with_revision(name: &str, created: i64, revision: i64) -> MachineSet {
    let mut set = MachineSet::default();
    set.metadata.name = Some(name.into());
    set.metadata.creation_timestamp = Some(Time(at(created)));
    set.metadata.annotations = Some(BTreeMap::from([(
        annotations::REVISION.into(),
        revision.to_string(),
    )]));
    set
}

#[test]
fn revisions_count_up_and_rollback_zero_means_the_previous_one() {
    let a = set_with_revision("a", 1, 1);
    let b = set_with_revision("b", 2, 2);
    let c = set_with_revision("c", 3, 5);
    assert_eq!(next_revision([&a, &b, &c]), 6);
    assert_eq!(next_revision([]), 1);
    let all = [&a, &b, &c];
    assert_eq!(rollback_revision(all, 0), Some(2));
    assert_eq!(
        rollback_target(&all, 0).map(|s| s.metadata.name.as_deref()),
        Some(Some("b"))
    );
    assert_eq!(
        rollback_target(&all, 1).map(|s| s.metadata.name.as_deref()),
        Some(Some("a"))
    );
    assert_eq!(rollback_target(&all, 4), None);
    assert_eq!(rollback_revision([&a], 0), None);
}

#[test]
fn history_beyond_the_limit_goes_oldest_first_but_never_a_set_with_machines() {
    let mut sets: Vec<MachineSet> = (0..4)
        .map(|i| set_with_revision(&format!("s{i}"), i, i))
        .collect();
    sets[1].status = Some(MachineSetStatus {
        replicas: 1,
        ..MachineSetStatus::default()
    });
    let refs: Vec<&MachineSet> = sets.iter().collect();
    let names =
        |v: Vec<&MachineSet>| -> Vec<String> { v.iter().map(|s| s.metadata.name.clone().unwrap()).collect() };
    assert_eq!(names(history_to_clean_up(&refs, Some(1))), vec!["s0", "s2"]);
    assert!(
        history_to_clean_up(&refs, None).is_empty(),
        "no limit keeps everything, as the reference"
    );
    assert!(history_to_clean_up(&refs, Some(10)).is_empty());
}

#[test]
fn status_counts_and_availability() {
    let new = view("new", 2, 3, 3, 2);
    let old = [view("old", 1, 1, 2, 1)];
    let counts = status_counts(Some(&new), &old);
    assert_eq!(
        counts,
        StatusCounts {
            replicas: 5,
            updated_replicas: 3,
            ready_replicas: 3,
            available_replicas: 3,
            unavailable_replicas: 1,
        }
    );
    assert!(has_minimum_availability(4, fp(1, 1), 3, 0));
    assert!(!has_minimum_availability(4, fp(1, 0), 3, 0));
    assert!(
        has_minimum_availability(4, fp(1, 0), 3, 1),
        "preserved Failed machines lower the threshold"
    );
    assert_eq!(progress_deadline(Some(600), at(100)), Some(at(700)));
    assert_eq!(progress_deadline(None, at(100)), None);
}
