//! Freezing and unfreezing sets.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mcm_api::{ConditionStatus, MachineSet, MachineSetCondition, MachineSetConditionType, keys::labels};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

#[test]
fn a_set_at_its_upper_threshold_is_frozen_with_label_condition_and_event() {
    let s = set("a", 2);
    let plan = run(&[&s], &[], &machines_of(&s, 6));
    assert_eq!(plan.evaluations[0].cause, Some(Cause::Overshooting));
    let w = write(&plan, ObjectKind::MachineSet, "a").expect("a write");
    assert_eq!(
        w.patches.metadata,
        Some(json!({ "metadata": { "labels": { "freeze": "True" } } }))
    );
    assert!(!w.patches.status_first, "the label first");
    assert_eq!(w.patches.transition, Some(true));
    let status = w.patches.status.as_ref().unwrap();
    assert_eq!(status["metadata"]["resourceVersion"], "7");
    let condition = &status["status"]["machineSetCondition"][0];
    assert_eq!(condition["type"], "Frozen");
    assert_eq!(condition["status"], "True");
    assert_eq!(condition["reason"], "OverShootingReplicaCount");
    let message = condition["message"].as_str().unwrap();
    assert!(message.contains(" 6 >= 6"), "{message}");
    assert_eq!(condition["lastTransitionTime"], "1970-01-01T00:16:40Z");
    let event = w.event.as_ref().unwrap();
    assert_eq!(event.reason, "FrozeMachineSet");
    assert_eq!(event.message, message);
}

#[test]
fn below_the_upper_threshold_nothing_is_written() {
    let s = set("a", 2);
    let plan = run(&[&s], &[], &machines_of(&s, 5));
    assert!(plan.writes.is_empty());
    assert_eq!(plan.evaluations[0].machines, 5);
    assert!(!plan.evaluations[0].frozen);
}

#[test]
fn a_frozen_set_stays_frozen_between_the_thresholds_and_unfreezes_at_the_lower_one() {
    let settings = Settings {
        safety_up: 2,
        safety_down: 3,
    }; // upper 6, lower 3
    let mut s = set("a", 2);
    freeze_label(&mut s.metadata);
    frozen_set_condition(&mut s);
    for count in [4, 5, 6, 9] {
        let plan = run_with(&[&s], &[], &machines_of(&s, count), settings);
        assert!(plan.writes.is_empty(), "count {count}: {plan:?}");
        assert!(plan.evaluations[0].frozen);
    }
    let plan = run_with(&[&s], &[], &machines_of(&s, 3), settings);
    assert_eq!(plan.evaluations[0].cause, Some(Cause::BelowLowerThreshold));
    let w = write(&plan, ObjectKind::MachineSet, "a").unwrap();
    assert_eq!(
        w.patches.metadata,
        Some(json!({ "metadata": { "labels": { "freeze": null } } }))
    );
    assert_eq!(
        w.patches.status,
        Some(json!({ "metadata": { "resourceVersion": "7" }, "status": { "machineSetCondition": null } }))
    );
    assert!(w.patches.status_first, "the report first, the label last");
    assert_eq!(w.event.as_ref().unwrap().reason, "UnfrozeMachineSet");
}

#[test]
fn an_unfrozen_set_between_the_thresholds_stays_unfrozen() {
    let settings = Settings {
        safety_up: 2,
        safety_down: 3,
    };
    let s = set("a", 2);
    let plan = run_with(&[&s], &[], &machines_of(&s, 5), settings);
    assert!(plan.writes.is_empty());
}

#[test]
fn other_conditions_are_kept_and_an_existing_frozen_condition_is_not_rewritten() {
    let mut s = set("a", 2);
    s.status
        .get_or_insert_default()
        .conditions
        .push(MachineSetCondition {
            r#type: MachineSetConditionType::ReplicaFailure,
            status: ConditionStatus::True,
            last_transition_time: None,
            reason: "FailedCreate".into(),
            message: "quota".into(),
        });
    let plan = run(&[&s], &[], &machines_of(&s, 7));
    let status = write(&plan, ObjectKind::MachineSet, "a")
        .unwrap()
        .patches
        .status
        .clone()
        .unwrap();
    let list = status["status"]["machineSetCondition"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["type"], "ReplicaFailure");
    assert_eq!(list[1]["type"], "Frozen");

    // Frozen and reported: a higher count writes nothing (the message is not refreshed).
    freeze_label(&mut s.metadata);
    frozen_set_condition(&mut s);
    assert!(run(&[&s], &[], &machines_of(&s, 9)).writes.is_empty());
}

#[test]
fn label_and_condition_are_brought_in_line() {
    // The label without the condition (an interrupted freeze, or a condition lost to another writer): the
    // condition is added, without an event.
    let mut labelled = set("a", 2);
    freeze_label(&mut labelled.metadata);
    let plan = run(&[&labelled], &[], &machines_of(&labelled, 6));
    let w = write(&plan, ObjectKind::MachineSet, "a").unwrap();
    assert_eq!(w.patches.metadata, None);
    assert!(w.patches.status.is_some());
    assert_eq!(w.event, None);

    // A condition False (written by someone else) is replaced by True.
    let mut other = set("a", 2);
    freeze_label(&mut other.metadata);
    frozen_set_condition(&mut other);
    other.status.as_mut().unwrap().conditions[0].status = ConditionStatus::False;
    let plan = run(&[&other], &[], &machines_of(&other, 6));
    let status = write(&plan, ObjectKind::MachineSet, "a")
        .unwrap()
        .patches
        .status
        .clone()
        .unwrap();
    assert_eq!(status["status"]["machineSetCondition"][0]["status"], "True");

    // The condition without the label, below the upper threshold: not frozen, so the condition goes.
    let mut reported = set("a", 2);
    frozen_set_condition(&mut reported);
    let plan = run(&[&reported], &[], &machines_of(&reported, 2));
    let w = write(&plan, ObjectKind::MachineSet, "a").unwrap();
    assert_eq!(w.patches.metadata, None);
    assert!(w.patches.status.is_some());
    assert_eq!(w.event, None);

    // A freeze label of another value is not the freeze: left alone.
    let mut other_value = set("a", 2);
    other_value
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::FREEZE.into(), "False".into());
    assert!(
        run(&[&other_value], &[], &machines_of(&other_value, 2))
            .writes
            .is_empty()
    );
}

#[test]
fn label_and_condition_out_of_line_are_told() {
    let mut s = set("a", 1);
    assert!(!set_out_of_line(&s));
    freeze_label(&mut s.metadata);
    assert!(set_out_of_line(&s));
    frozen_set_condition(&mut s);
    assert!(!set_out_of_line(&s));
    s.metadata.labels = None;
    assert!(set_out_of_line(&s));

    let mut d = deployment("d", 1, None);
    assert!(!deployment_out_of_line(&d));
    freeze_label(&mut d.metadata);
    assert!(deployment_out_of_line(&d));
}

#[test]
fn the_unfreeze_annotation_unfreezes_at_once_and_is_removed() {
    let mut s = set("a", 2);
    freeze_label(&mut s.metadata);
    frozen_set_condition(&mut s);
    annotate_unfreeze(&mut s.metadata);
    // Even far over the threshold: the annotation wins in this pass.
    let plan = run(&[&s], &[], &machines_of(&s, 20));
    assert_eq!(plan.evaluations[0].cause, Some(Cause::AnnotationOnSet));
    let w = write(&plan, ObjectKind::MachineSet, "a").unwrap();
    assert_eq!(
        w.patches.metadata,
        Some(json!({ "metadata": {
            "labels": { "freeze": null },
            "annotations": { "safety.machine.sapcloud.io/unfreeze": null }
        } }))
    );
    assert!(w.patches.status.is_some());
    assert_eq!(w.desired.reason, reasons::UNFREEZE_ANNOTATION);
    assert_eq!(w.event.as_ref().unwrap().reason, "UnfrozeMachineSet");

    // On a set that is not frozen, the annotation is only removed, without an event.
    let mut idle = set("b", 2);
    annotate_unfreeze(&mut idle.metadata);
    let plan = run(&[&idle], &[], &[]);
    let w = write(&plan, ObjectKind::MachineSet, "b").unwrap();
    assert_eq!(
        w.patches.metadata,
        Some(json!({ "metadata": { "annotations": { "safety.machine.sapcloud.io/unfreeze": null } } }))
    );
    assert_eq!((w.patches.status.clone(), w.event.clone()), (None, None));
}

#[test]
fn every_overshooting_set_is_frozen_in_the_same_pass() {
    let sets: Vec<MachineSet> = ["a", "b", "c"].iter().map(|n| set(n, 1)).collect();
    let mut machines = machines_of(&sets[0], 4);
    machines.extend(machines_of(&sets[1], 9));
    machines.extend(machines_of(&sets[2], 3));
    let refs: Vec<&MachineSet> = sets.iter().collect();
    let plan = run(&refs, &[], &machines);
    let frozen: Vec<&str> = plan
        .events()
        .filter(|(_, e)| e.reason == events::FROZE_MACHINE_SET)
        .map(|(w, _)| w.name.as_str())
        .collect();
    assert_eq!(frozen, ["a", "b"]);
}

#[test]
fn sets_being_deleted_are_left_alone() {
    let mut s = set("a", 1);
    s.metadata.deletion_timestamp = Some(Time(at(1)));
    let plan = run(&[&s], &[], &machines_of(&s, 10));
    assert!(plan.writes.is_empty());
    assert!(plan.evaluations.is_empty());
}
