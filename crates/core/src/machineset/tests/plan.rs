//! The plan: slow start, burst, frozen sets, scale-down, the autoscaler handshake, deleting sets.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use mcm_api::{
    Machine, MachinePhase,
    keys::{annotations, labels},
};
use pretty_assertions::assert_eq;

use super::*;
use crate::machineset::common::name_of;

#[test]
fn slow_start_batches_double_from_one() {
    // slowStartBatch: "Batch sizes start at SlowStartInitialBatchSize and double with each successful iteration".
    assert_eq!(slow_start_batches(10, 1), vec![1, 2, 4, 3]);
    assert_eq!(slow_start_batches(1, 1), vec![1]);
    assert_eq!(slow_start_batches(0, 1), Vec::<usize>::new());
    assert_eq!(slow_start_batches(7, 1), vec![1, 2, 4]);
    assert_eq!(slow_start_batches(5, 0), vec![1, 2, 2]);
}

#[test]
fn scale_up_creates_the_missing_machines_in_slow_start_batches() {
    let plan = plan_for(&set(10), &[running("a")], &Expectations::new());
    assert_eq!(plan.create, 9);
    assert_eq!(plan.create_batches, vec![1, 2, 4, 2]);
    assert!(plan.delete.is_empty());
    assert!(plan.holds.is_empty());
    assert!(!plan.add_finalizer);
}

#[test]
fn at_most_burst_replicas_are_created_per_pass() {
    // Reference: "MS creates min(−diff, BurstReplicas=100) machines".
    let plan = plan_for(&set(250), &[], &Expectations::new());
    assert_eq!(plan.create, BURST_REPLICAS);
    assert_eq!(plan.create_batches.iter().sum::<usize>(), BURST_REPLICAS);
}

#[test]
fn terminating_machines_and_machines_being_deleted_do_not_count() {
    // Reference §5: "diff = #non-Terminating machines − spec.replicas. Terminating machines do not count."
    let mut deleting = running("b");
    deleting.metadata.deletion_timestamp = Some(Time(at(900)));
    let machines = [
        running("a"),
        deleting,
        machine("c", Some(MachinePhase::Terminating)),
    ];
    let plan = plan_for(&set(3), &machines, &Expectations::new());
    assert_eq!(plan.create, 2);
    assert!(
        plan.delete.is_empty(),
        "machines on their way out are not deleted again"
    );
}

#[test]
fn failed_machines_are_deleted_and_replaced_in_the_same_pass() {
    // Reference §5: "every Failed machine that is not preserved ... this is how failed machines are replaced".
    let machines = [running("a"), machine("b", Some(MachinePhase::Failed))];
    let plan = plan_for(&set(2), &machines, &Expectations::new());
    assert_eq!(deleted(&plan), vec![("b", DeletionReason::Failed)]);
    assert_eq!(plan.create, 1);
}

#[test]
fn a_preserved_failed_machine_is_neither_deleted_nor_replaced_until_its_preservation_ends() {
    // Reference §3.8: "A preserved Failed machine is not deleted or replaced by the MachineSet".
    let mut failed = machine("b", Some(MachinePhase::Failed));
    failed
        .status
        .as_mut()
        .unwrap()
        .current_status
        .preserve_expiry_time = Some(Time(at(1600)));
    let machines = [running("a"), failed.clone()];
    let plan = plan_for(&set(2), &machines, &Expectations::new());
    assert!(plan.delete.is_empty());
    assert_eq!(plan.create, 0);
    assert_eq!(plan.requeue_after, Some(Duration::from_mins(10)));

    // Preservation expired: "A still-Failed machine then terminates."
    failed
        .status
        .as_mut()
        .unwrap()
        .current_status
        .preserve_expiry_time = Some(Time(at(999)));
    let plan = plan_for(&set(2), &[running("a"), failed.clone()], &Expectations::new());
    assert_eq!(deleted(&plan), vec![("b", DeletionReason::Failed)]);
    assert_eq!(plan.create, 1);

    // Preservation being set up (annotation, no expiry yet) keeps it too.
    failed
        .status
        .as_mut()
        .unwrap()
        .current_status
        .preserve_expiry_time = None;
    annotate(&mut failed, annotations::PRESERVE, "when-failed");
    assert!(keeps_failed_machine(&failed, at(1000)));
    annotate(
        &mut failed,
        annotations::LAST_APPLIED_NODE_PRESERVE_VALUE,
        "false",
    );
    assert!(!keeps_failed_machine(&failed, at(1000)), "the node's value wins");
}

#[test]
fn a_frozen_set_does_not_scale_up_but_still_deletes() {
    // Reference §7: "The effect of a freeze is only that the MachineSet does not scale up; scale-down and
    // deletion continue."
    let mut frozen = set(3);
    frozen.metadata.labels = Some(BTreeMap::from([(labels::FREEZE.into(), "True".into())]));
    let machines = [running("a"), machine("b", Some(MachinePhase::Failed))];
    let plan = plan_for(&frozen, &machines, &Expectations::new());
    assert_eq!(plan.create, 0);
    assert_eq!(plan.holds, vec![Hold::Frozen { missing: 2 }]);
    assert_eq!(deleted(&plan), vec![("b", DeletionReason::Failed)]);
    assert!(plan.holds[0].to_string().contains("freeze=True"));

    frozen.spec.replicas = 0;
    let plan = plan_for(&frozen, &machines, &Expectations::new());
    assert_eq!(
        deleted(&plan),
        vec![("a", DeletionReason::ScaleDown), ("b", DeletionReason::Failed)]
    );

    // Only the value True freezes (the reference compares with "True").
    let mut not_frozen = set(3);
    not_frozen.metadata.labels = Some(BTreeMap::from([(labels::FREEZE.into(), "False".into())]));
    assert_eq!(plan_for(&not_frozen, &[], &Expectations::new()).create, 3);
}

#[test]
fn scale_up_disabled_stops_creation() {
    let mut set = set(2);
    set.metadata.labels = Some(BTreeMap::from([(
        labels::SCALE_UP_DISABLED.into(),
        "true".into(),
    )]));
    let plan = plan_for(&set, &[], &Expectations::new());
    assert_eq!(plan.create, 0);
    assert_eq!(plan.holds, vec![Hold::ScaleUpDisabled { missing: 2 }]);
}

#[test]
fn scale_down_deletes_the_first_machines_in_deletion_order() {
    let mut low = running("low");
    annotate(&mut low, annotations::MACHINE_PRIORITY, "1");
    let machines = [
        running("a"),
        machine("pending", Some(MachinePhase::Pending)),
        low,
        running("b"),
    ];
    let plan = plan_for(&set(2), &machines, &Expectations::new());
    assert_eq!(
        deleted(&plan),
        vec![
            ("low", DeletionReason::ScaleDown),
            ("pending", DeletionReason::ScaleDown)
        ]
    );
    assert_eq!(plan.create, 0);
}

#[test]
fn the_autoscaler_handshake_deletes_exactly_the_marked_machines() {
    // Reference §6.5: "The MachineSet deletes marked machines whose mark time ≤ that timestamp."
    let mut set = set(2);
    annotate_set(
        &mut set,
        annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME,
        "2024-01-01T00:10:00Z",
    );
    let mut marked = running("marked");
    annotate(&mut marked, annotations::MACHINE_PRIORITY, "1");
    annotate(
        &mut marked,
        annotations::MARKED_FOR_DELETION_TIME,
        "2024-01-01T00:09:00Z",
    );
    let mut later = running("later");
    annotate(&mut later, annotations::MACHINE_PRIORITY, "1");
    annotate(
        &mut later,
        annotations::MARKED_FOR_DELETION_TIME,
        "2024-01-01T00:11:00Z",
    );
    let machines = [running("a"), marked.clone(), later.clone()];
    let plan = plan_for(&set, &machines, &Expectations::new());
    assert_eq!(
        deleted(&plan),
        vec![("marked", DeletionReason::MarkedByAutoscaler)]
    );
    assert_eq!(plan.create, 0);

    // Marked at exactly the change time counts ("Before or Equal").
    annotate(
        &mut later,
        annotations::MARKED_FOR_DELETION_TIME,
        "2024-01-01T00:10:00Z",
    );
    let machines = [running("a"), marked, later];
    let refs: Vec<&Machine> = machines.iter().collect();
    let names: Vec<&str> = marked_by_autoscaler(&set, &refs)
        .iter()
        .map(|m| name_of(m))
        .collect();
    assert_eq!(names, vec!["marked", "later"]);

    // Without the set's change time (or with an unreadable one), nothing is deleted for a mark.
    let mut unreadable = set.clone();
    annotate_set(
        &mut unreadable,
        annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME,
        "yesterday",
    );
    assert!(marked_by_autoscaler(&unreadable, &refs).is_empty());
}

#[test]
fn a_marked_machine_that_replicas_still_count_is_replaced() {
    // The mark is older than the scaler's replica change, but the set's replicas were not lowered: the marked
    // machine goes and the set keeps its count (as the reference, one pass sooner).
    let mut set = set(2);
    annotate_set(
        &mut set,
        annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME,
        "2024-01-01T00:10:00Z",
    );
    let mut marked = running("marked");
    annotate(&mut marked, annotations::MACHINE_PRIORITY, "1");
    annotate(
        &mut marked,
        annotations::MARKED_FOR_DELETION_TIME,
        "2024-01-01T00:09:00Z",
    );
    let plan = plan_for(&set, &[running("a"), marked], &Expectations::new());
    assert_eq!(
        deleted(&plan),
        vec![("marked", DeletionReason::MarkedByAutoscaler)]
    );
    assert_eq!(plan.create, 1);
}

#[test]
fn pending_expectations_hold_deletions_too() {
    let mut exp = Expectations::new();
    exp.expect_deletion("x", at(900));
    let plan = plan_for(&set(0), &[running("a"), running("x")], &exp);
    assert!(plan.delete.is_empty());
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(200)));
}

#[test]
fn an_invalid_set_creates_and_deletes_nothing() {
    // DESIGN principle 5: "no machine is created or destroyed because of it".
    let mut invalid = set(3);
    invalid.spec.selector = Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("app".into(), "other".into())])),
        ..LabelSelector::default()
    });
    let plan = plan_for(
        &invalid,
        &[machine("a", Some(MachinePhase::Failed))],
        &Expectations::new(),
    );
    assert_eq!((plan.create, plan.delete.len(), plan.propagate.len()), (0, 0, 0));
    assert!(matches!(&plan.holds[..], [Hold::Invalid(errors)] if errors[0].path == "spec.selector"));
    invalid.spec.replicas = -1;
    assert!(matches!(
        &plan_for(&invalid, &[], &Expectations::new()).holds[..],
        [Hold::Invalid(_)]
    ));
}

#[test]
fn a_deleting_set_deletes_all_its_machines_then_drops_its_finalizer() {
    // Reference §5: "MachineSet deletion: delete all child machines, then remove the finalizer once none remain."
    let mut deleting = set(3);
    deleting.metadata.deletion_timestamp = Some(Time(at(900)));
    let mut already = running("b");
    already.metadata.deletion_timestamp = Some(Time(at(901)));
    let mut exp = Expectations::new();
    exp.expect_creation("never-seen", at(999));
    let plan = plan_for(&deleting, &[running("a"), already.clone()], &exp);
    assert_eq!(deleted(&plan), vec![("a", DeletionReason::SetDeleted)]);
    assert_eq!(plan.create, 0);
    assert!(!plan.remove_finalizer);
    let plan = plan_for(&deleting, &[already], &exp);
    assert!(plan.delete.is_empty() && !plan.remove_finalizer);
    let plan = plan_for(&deleting, &[], &exp);
    assert!(plan.remove_finalizer);
    deleting.metadata.finalizers = None;
    assert!(!plan_for(&deleting, &[], &exp).remove_finalizer);
}

#[test]
fn a_missing_finalizer_is_added() {
    let mut set = set(0);
    set.metadata.finalizers = None;
    assert!(plan_for(&set, &[], &Expectations::new()).add_finalizer);
}
