use k8s_openapi::api::core::v1::NodeCondition;
use mcm_api::builders::{MachineBuilder, NodeBuilder};

use super::*;

const HOUR: Duration = Duration::from_hours(1);

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

fn machine(phase: MachinePhase) -> MachineBuilder {
    MachineBuilder::new("m1").namespace("ns").node("n1").phase(phase)
}

fn node() -> NodeBuilder {
    NodeBuilder::new("n1").resource_version("7")
}

fn decide(machine: &Machine, node: Option<&Node>, now: i64) -> PreservationPlan {
    plan(&PreservationInput {
        machine,
        node,
        timeout: HOUR,
        now: at(now),
    })
}

fn drained_condition() -> NodeCondition {
    NodeCondition {
        type_: "Preserved".into(),
        status: "True".into(),
        reason: Some(PRESERVED_BY_USER.into()),
        message: Some(format!("{DRAIN_SUCCESSFUL} Machine preserved until x.")),
        ..NodeCondition::default()
    }
}

#[test]
fn a_machine_without_annotations_or_expiry_is_left_alone() {
    let m = machine(MachinePhase::Failed).build();
    let n = node().build();
    let p = decide(&m, Some(&n), 1000);
    assert_eq!(p.decision, Some(Decision::Untouched));
    assert_eq!(
        (p.expiry, p.node_patch, p.machine_patch, p.drain),
        (None, None, None, false)
    );
}

#[test]
fn now_on_a_running_machine_sets_the_expiry_and_the_autoscaler_annotations_without_taint_or_drain() {
    let m = machine(MachinePhase::Running)
        .annotation(annotations::PRESERVE, "now")
        .build();
    let n = node().build();
    let p = decide(&m, Some(&n), 1000);
    assert_eq!(p.decision, Some(Decision::Preserve(PreserveValue::Now)));
    assert_eq!(p.expiry, Some(Some(at(1000 + 3600))));
    let patch = p.node_patch.expect("a node patch");
    assert_eq!(
        patch["metadata"]["annotations"][annotations::SCALE_DOWN_DISABLED],
        "true"
    );
    assert_eq!(
        patch["metadata"]["annotations"][annotations::SCALE_DOWN_DISABLED_BY_MCM],
        "true"
    );
    assert!(
        patch.get("spec").is_none(),
        "no taint on a Running machine's node: {patch}"
    );
    assert!(!p.drain);
    assert_eq!(p.requeue_after, Some(Duration::from_secs(3601)));
}

#[test]
fn when_failed_waits_for_the_failure_then_taints_and_drains() {
    let running = machine(MachinePhase::Running)
        .annotation(annotations::PRESERVE, "when-failed")
        .build();
    let p = decide(&running, Some(&node().build()), 1000);
    assert_eq!(p.decision, Some(Decision::Stop { forget: false }));
    assert_eq!(p.expiry, None, "nothing to stop: no expiry");

    let failed = machine(MachinePhase::Failed)
        .annotation(annotations::PRESERVE, "when-failed")
        .build();
    let n = node().taint("other", None, "NoExecute").build();
    let p = decide(&failed, Some(&n), 1000);
    assert_eq!(p.decision, Some(Decision::Preserve(PreserveValue::WhenFailed)));
    assert!(p.drain);
    let patch = p.node_patch.unwrap();
    let taints = patch["spec"]["taints"].as_array().unwrap();
    assert_eq!(taints.len(), 2, "the other taint is kept: {patch}");
    assert_eq!(taints[1]["key"], taints::PRESERVED);
    assert_eq!(taints[1]["effect"], "NoSchedule");
    assert_eq!(
        patch["metadata"]["resourceVersion"], "7",
        "the list write is guarded"
    );
}

#[test]
fn a_drained_node_is_not_drained_again() {
    let m = machine(MachinePhase::Failed)
        .annotation(annotations::PRESERVE, "now")
        .preserved_until(at(5000))
        .build();
    let n = node()
        .taint(taints::PRESERVED, None, "NoSchedule")
        .with(|n| {
            n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
                conditions: Some(vec![drained_condition()]),
                ..Default::default()
            });
        })
        .annotation(annotations::SCALE_DOWN_DISABLED, "true")
        .build();
    let p = decide(&m, Some(&n), 1000);
    assert!(!p.drain);
    assert_eq!(p.node_patch, None);
    assert_eq!(p.expiry, None, "the expiry is kept");
}

#[test]
fn the_node_value_wins_and_is_recorded_on_the_machine() {
    let m = machine(MachinePhase::Running)
        .annotation(annotations::PRESERVE, "false")
        .build();
    let n = node().annotation(annotations::PRESERVE, "now").build();
    let p = decide(&m, Some(&n), 1000);
    assert_eq!(p.decision, Some(Decision::Preserve(PreserveValue::Now)));
    let patch = p.machine_patch.unwrap();
    assert_eq!(
        patch["metadata"]["annotations"][annotations::PRESERVE],
        Value::Null
    );
    assert_eq!(
        patch["metadata"]["annotations"][annotations::LAST_APPLIED_NODE_PRESERVE_VALUE],
        "now"
    );
}

#[test]
fn a_node_annotation_removed_while_we_were_away_stops_preservation() {
    // The machine still says `now`, but the node had it (last-applied) and no longer has.
    let m = machine(MachinePhase::Running)
        .annotation(annotations::LAST_APPLIED_NODE_PRESERVE_VALUE, "now")
        .preserved_until(at(5000))
        .build();
    let n = node()
        .annotation(annotations::SCALE_DOWN_DISABLED, "true")
        .annotation(annotations::SCALE_DOWN_DISABLED_BY_MCM, "true")
        .build();
    let p = decide(&m, Some(&n), 1000);
    assert_eq!(p.decision, Some(Decision::Stop { forget: false }));
    assert_eq!(p.expiry, Some(None));
    let stopped = p.stopped_condition.unwrap();
    assert_eq!(
        (stopped.status.as_str(), stopped.reason.as_deref()),
        ("False", Some(PRESERVATION_STOPPED))
    );
    let patch = p.node_patch.unwrap();
    assert_eq!(
        patch["metadata"]["annotations"][annotations::SCALE_DOWN_DISABLED],
        Value::Null
    );
    let machine_patch = p.machine_patch.unwrap();
    assert_eq!(
        machine_patch["metadata"]["annotations"][annotations::LAST_APPLIED_NODE_PRESERVE_VALUE],
        Value::Null
    );
}

#[test]
fn an_autoscaler_annotation_someone_else_set_is_left_on_stop() {
    let m = machine(MachinePhase::Running).preserved_until(at(5000)).build();
    let n = node()
        .annotation(annotations::SCALE_DOWN_DISABLED, "true")
        .build();
    let p = decide(&m, Some(&n), 1000);
    assert_eq!(p.decision, Some(Decision::Stop { forget: false }));
    assert_eq!(p.node_patch, None);
}

#[test]
fn expiry_stops_preservation_removes_the_annotations_and_the_taint() {
    let m = machine(MachinePhase::Failed)
        .annotation(annotations::LAST_APPLIED_NODE_PRESERVE_VALUE, "when-failed")
        .preserved_until(at(1000))
        .build();
    let n = node()
        .annotation(annotations::PRESERVE, "when-failed")
        .taint(taints::PRESERVED, None, "NoSchedule")
        .build();
    let p = decide(&m, Some(&n), 1000);
    assert_eq!(p.decision, Some(Decision::Stop { forget: true }));
    assert_eq!(p.expiry, Some(None));
    let patch = p.node_patch.unwrap();
    assert_eq!(
        patch["metadata"]["annotations"][annotations::PRESERVE],
        Value::Null
    );
    assert_eq!(patch["spec"]["taints"], json!([]));
    let machine_patch = p.machine_patch.unwrap();
    assert_eq!(
        machine_patch["metadata"]["annotations"][annotations::LAST_APPLIED_NODE_PRESERVE_VALUE],
        Value::Null
    );
}

#[test]
fn a_recovered_machine_preserved_now_stays_preserved_but_untainted() {
    let m = machine(MachinePhase::Running)
        .annotation(annotations::PRESERVE, "now")
        .preserved_until(at(5000))
        .build();
    let n = node()
        .annotation(annotations::SCALE_DOWN_DISABLED, "true")
        .taint(taints::PRESERVED, None, "NoSchedule")
        .build();
    let p = decide(&m, Some(&n), 1000);
    assert_eq!(p.decision, Some(Decision::Preserve(PreserveValue::Now)));
    assert_eq!(p.node_patch.unwrap()["spec"]["taints"], json!([]));
    assert_eq!(p.expiry, None);
}

#[test]
fn a_recovered_auto_preserved_machine_stops_and_forgets() {
    let m = machine(MachinePhase::Running)
        .annotation(annotations::PRESERVE, "auto-preserved")
        .preserved_until(at(5000))
        .build();
    let p = decide(&m, None, 1000);
    assert_eq!(p.decision, Some(Decision::Stop { forget: true }));
    assert_eq!(
        p.machine_patch.unwrap()["metadata"]["annotations"][annotations::PRESERVE],
        Value::Null
    );
    assert_eq!(p.expiry, Some(None));
}

#[test]
fn invalid_values_are_named_machine_ignored_node_stops_everything() {
    let m = machine(MachinePhase::Failed)
        .annotation(annotations::PRESERVE, "yes")
        .build();
    let p = decide(&m, None, 1000);
    assert!(p.warnings[0].contains("\"yes\""), "{:?}", p.warnings);
    assert_eq!(p.decision, Some(Decision::Stop { forget: false }));
    assert_eq!(p.expiry, None);

    let m = machine(MachinePhase::Failed)
        .annotation(annotations::PRESERVE, "now")
        .build();
    let n = node().annotation(annotations::PRESERVE, "always").build();
    let p = decide(&m, Some(&n), 1000);
    assert_eq!(p.decision, None);
    assert!(p.warnings[0].contains("on the node"), "{:?}", p.warnings);
}

#[test]
fn a_machine_without_node_is_preserved_by_its_own_annotation() {
    let m = MachineBuilder::new("m1")
        .phase(MachinePhase::Failed)
        .annotation(annotations::PRESERVE, "now")
        .build();
    let p = decide(&m, None, 1000);
    assert_eq!(p.expiry, Some(Some(at(4600))));
    assert!(!p.drain);
    assert_eq!(p.node_patch, None);
}

#[test]
fn the_condition_follows_the_phase_the_drain_and_who_preserved() {
    let until = at(4600);
    let c = preserved_condition(
        Some(MachinePhase::Running),
        PreserveValue::Now,
        until,
        None,
        DrainResult::NotNeeded,
        at(1000),
    )
    .unwrap();
    assert_eq!(c.status, "True");
    assert_eq!(c.reason.as_deref(), Some(PRESERVED_BY_USER));
    assert_eq!(
        c.message.as_deref(),
        Some("Machine preserved until 1970-01-01 01:16:40 +0000 UTC.")
    );
    assert_eq!(
        preserved_condition(
            Some(MachinePhase::Running),
            PreserveValue::Now,
            until,
            Some(&c),
            DrainResult::NotNeeded,
            at(2000)
        ),
        None,
        "written once"
    );

    let failed = preserved_condition(
        Some(MachinePhase::Failed),
        PreserveValue::AutoPreserved,
        until,
        Some(&c),
        DrainResult::Failed,
        at(2000),
    )
    .unwrap();
    assert_eq!(failed.status, "False");
    assert_eq!(failed.reason.as_deref(), Some(PRESERVED_BY_MCM));
    assert!(failed.message.as_deref().unwrap().starts_with(DRAIN_UNSUCCESSFUL));
    let drained = preserved_condition(
        Some(MachinePhase::Failed),
        PreserveValue::AutoPreserved,
        until,
        Some(&failed),
        DrainResult::Drained,
        at(3000),
    )
    .unwrap();
    assert_eq!(drained.status, "True");
    assert!(drained.message.as_deref().unwrap().starts_with(DRAIN_SUCCESSFUL));
    assert_eq!(drained.last_transition_time, Some(Time(at(3000))));
}

#[test]
fn a_deleting_machine_is_not_preserved() {
    let m = machine(MachinePhase::Failed)
        .annotation(annotations::PRESERVE, "now")
        .deleting_at(at(900))
        .build();
    assert_eq!(decide(&m, None, 1000), PreservationPlan::default());
}
