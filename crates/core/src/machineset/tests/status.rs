//! Status counts, failed machines, the ReplicaFailure condition, when status is written.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mcm_api::{
    ConditionStatus, LastOperation, Machine, MachinePhase, MachineSetCondition, MachineSetConditionType,
    MachineSetStatus, MachineState, MachineSummary,
};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::*;

fn phase_since(name: &str, phase: MachinePhase, since: i64) -> Machine {
    let mut m = machine(name, Some(phase));
    m.status.as_mut().unwrap().current_status.last_update_time = Some(Time(at(since)));
    m
}

#[test]
fn status_counts_as_the_reference_and_honours_min_ready_seconds_when_asked() {
    let mut set = set(5);
    set.spec.min_ready_seconds = 60;
    let mut unlabeled = phase_since("unlabeled", MachinePhase::Pending, 0);
    unlabeled.metadata.labels = None;
    let mut deleting = phase_since("deleting", MachinePhase::Running, 0);
    deleting.metadata.deletion_timestamp = Some(Time(at(990)));
    let machines = [
        phase_since("ready-long", MachinePhase::Running, 900),
        phase_since("ready-new", MachinePhase::Running, 980),
        phase_since("no-target", MachinePhase::Available, 100),
        unlabeled,
        deleting,
    ];
    let refs: Vec<&Machine> = machines.iter().collect();
    let plan = status(
        &set,
        &refs,
        &ManageResult::NotRun,
        MinReadySeconds::Honour,
        at(1000),
    );
    let s = &plan.update.status;
    assert_eq!(s.replicas, 5);
    assert_eq!(s.fully_labeled_replicas, 4);
    assert_eq!(s.ready_replicas, 2, "Running and not being deleted");
    assert_eq!(
        s.available_replicas, 2,
        "ready-long and no-target; ready-new only at 1040"
    );
    assert_eq!(s.observed_generation, 4);
    assert_eq!(plan.recheck_after, Some(Duration::from_secs(40)));

    let later = status(
        &set,
        &refs,
        &ManageResult::NotRun,
        MinReadySeconds::Honour,
        at(1040),
    );
    assert_eq!(
        later.update.status.available_replicas, 3,
        "Running for at least minReadySeconds"
    );
    assert_eq!(later.recheck_after, None);

    set.spec.min_ready_seconds = 0;
    let without_min_ready = status(
        &set,
        &refs,
        &ManageResult::NotRun,
        MinReadySeconds::Honour,
        at(1000),
    );
    assert_eq!(without_min_ready.update.status.available_replicas, 3);
}

/// The reference's `isMachineAvailable` ignores `minReadySeconds` (Gardener sets 500 on every deployment because
/// of that): by default a Running machine is available at once and nothing is rechecked.
#[test]
fn min_ready_seconds_is_ignored_by_default_as_the_reference_does() {
    let mut set = set(3);
    set.spec.min_ready_seconds = 500;
    let machines = [
        phase_since("just-running", MachinePhase::Running, 999),
        phase_since("no-target", MachinePhase::Available, 999),
        phase_since("pending", MachinePhase::Pending, 0),
    ];
    let refs: Vec<&Machine> = machines.iter().collect();
    let plan = status(
        &set,
        &refs,
        &ManageResult::NotRun,
        MinReadySeconds::default(),
        at(1000),
    );
    assert_eq!(plan.update.status.available_replicas, 2);
    assert_eq!(plan.recheck_after, None, "nothing to wait for");
    let honoured = status(
        &set,
        &refs,
        &ManageResult::NotRun,
        MinReadySeconds::Honour,
        at(1000),
    );
    assert_eq!(honoured.update.status.available_replicas, 0);
    assert_eq!(honoured.recheck_after, Some(Duration::from_secs(499)));
}

#[test]
fn failed_machines_are_summarized_except_preserved_ones() {
    let set = set(3);
    let failure = LastOperation {
        description: "Cloud provider message - machine codes error: code = [Internal] message = [boom]"
            .into(),
        state: Some(MachineState::Failed),
        ..LastOperation::default()
    };
    let mut b = machine("b", Some(MachinePhase::CrashLoopBackOff));
    b.spec.provider_id = "sim:///b".into();
    b.status.as_mut().unwrap().last_operation = failure.clone();
    let mut preserved = machine("a", Some(MachinePhase::Failed));
    preserved.status.as_mut().unwrap().last_operation = failure.clone();
    preserved
        .status
        .as_mut()
        .unwrap()
        .current_status
        .preserve_expiry_time = Some(Time(at(5000)));
    let machines = [b, preserved, running("c")];
    let refs: Vec<&Machine> = machines.iter().collect();
    let s = status(
        &set,
        &refs,
        &ManageResult::NotRun,
        MinReadySeconds::Ignore,
        at(1000),
    )
    .update
    .status;
    assert_eq!(
        s.failed_machines,
        Some(vec![MachineSummary {
            name: "b".into(),
            provider_id: "sim:///b".into(),
            last_operation: failure,
            owner_ref: "ms".into(),
        }])
    );
    assert_eq!(s.preserved_failed_replicas, 1);
    let none = status(
        &set,
        &[&running("c")],
        &ManageResult::NotRun,
        MinReadySeconds::Ignore,
        at(1000),
    );
    assert_eq!(none.update.status.failed_machines, None);
}

#[test]
fn the_replica_failure_condition_follows_the_last_pass() {
    let mut set = set(3);
    set.status = Some(MachineSetStatus {
        conditions: vec![MachineSetCondition {
            r#type: MachineSetConditionType::Frozen,
            status: ConditionStatus::True,
            last_transition_time: None,
            reason: "OverShootingReplicaCount".into(),
            message: String::new(),
        }],
        ..MachineSetStatus::default()
    });
    let failed = ManageResult::Failed(ReplicaFailure {
        reason: ReplicaFailureReason::FailedCreate,
        message: "quota exceeded".into(),
    });
    let first = status(&set, &[], &failed, MinReadySeconds::Ignore, at(1000)).update;
    let condition = first.status.conditions.last().unwrap();
    assert_eq!(condition.r#type, MachineSetConditionType::ReplicaFailure);
    assert_eq!(condition.reason, "FailedCreate");
    assert_eq!(condition.message, "quota exceeded");
    assert_eq!(condition.last_transition_time, Some(Time(at(1000))));
    assert_eq!(first.status.conditions[0].r#type, MachineSetConditionType::Frozen);

    // Same reason again later: nothing changes (reference SetCondition keeps a condition of equal status and
    // reason).
    let mut stored = set.clone();
    first.apply(stored.status.as_mut().unwrap());
    let again = ManageResult::Failed(ReplicaFailure {
        reason: ReplicaFailureReason::FailedCreate,
        message: "quota exceeded again".into(),
    });
    let second = status(&stored, &[], &again, MinReadySeconds::Ignore, at(2000)).update;
    assert!(!second.changes(stored.status.as_ref()));
    // A pass that did nothing keeps it; a pass that succeeded clears it.
    assert!(
        !status(
            &stored,
            &[],
            &ManageResult::NotRun,
            MinReadySeconds::Ignore,
            at(3000)
        )
        .update
        .changes(stored.status.as_ref())
    );
    let cleared = status(
        &stored,
        &[],
        &ManageResult::Succeeded,
        MinReadySeconds::Ignore,
        at(3000),
    )
    .update;
    assert_eq!(cleared.status.conditions.len(), 1);
    assert!(cleared.changes(stored.status.as_ref()));
}

#[test]
fn status_is_written_only_when_it_changes_and_the_patch_clears_zeroes() {
    let mut set = set(2);
    let machines = [running("a"), running("b")];
    let refs: Vec<&Machine> = machines.iter().collect();
    let update = status(
        &set,
        &refs,
        &ManageResult::Succeeded,
        MinReadySeconds::Ignore,
        at(1000),
    )
    .update;
    assert!(update.changes(None));
    let mut object = json!({ "status": { "lastOperation": { "description": "kept" } } });
    json_patch::merge(&mut object, &update.merge_patch());
    let written: MachineSetStatus = serde_json::from_value(object["status"].clone()).unwrap();
    assert_eq!(written.replicas, 2);
    assert_eq!(written.last_operation.description, "kept");
    set.status = Some(written);
    assert!(
        !status(
            &set,
            &refs,
            &ManageResult::Succeeded,
            MinReadySeconds::Ignore,
            at(1100)
        )
        .update
        .changes(set.status.as_ref())
    );

    // Scaled to zero: the patch writes null for the counts, so they do not linger.
    let empty = status(
        &set,
        &[],
        &ManageResult::Succeeded,
        MinReadySeconds::Ignore,
        at(1200),
    )
    .update;
    let patch = empty.merge_patch();
    assert_eq!(patch["status"]["replicas"], Value::Null);
    assert_eq!(patch["status"]["readyReplicas"], Value::Null);
    assert_eq!(patch["status"]["observedGeneration"], 4);
    assert!(patch["status"].get("lastOperation").is_none());
    let mut object = serde_json::to_value(set.status.as_ref().unwrap()).unwrap();
    json_patch::merge(&mut object, &patch["status"]);
    let written: MachineSetStatus = serde_json::from_value(object).unwrap();
    assert_eq!(written.replicas, 0);
    let mut applied = set.status.clone().unwrap();
    empty.apply(&mut applied);
    assert_eq!(applied, written);
}
