//! One test per row of [`decide`], [`drain_mode`] and the agent helpers.

use std::time::Duration;

use mcm_api::builders::{MachineBuilder, NodeBuilder};
use pretty_assertions::assert_eq;

use super::*;
use crate::ControllerSettings;

const T0: i64 = 1_000_000;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

fn machine() -> Machine {
    MachineBuilder::new("m-1")
        .node("m-1")
        .phase(MachinePhase::Running)
        .build()
}

/// A Ready node with `labels` and, when `reason` is given, the InPlaceUpdate condition since `since`.
fn node(labels: &[(&str, &str)], reason: Option<&str>, since: i64) -> Node {
    let mut builder = NodeBuilder::new("m-1").labels(labels.iter().copied()).condition(
        "Ready",
        "True",
        Some(at(T0 - 1000)),
    );
    if let Some(reason) = reason {
        builder = builder.condition(node_conditions::IN_PLACE_UPDATE, "True", Some(at(since)));
        let mut node = builder.build();
        let conditions = node.status.as_mut().unwrap().conditions.as_mut().unwrap();
        conditions[1].reason = Some(reason.to_owned());
        return node;
    }
    builder.build()
}

fn step(machine: &Machine, node: &Node, now: i64) -> InPlaceStep {
    let settings = crate::effective_settings(machine, &ControllerSettings::default());
    decide(&InPlaceInput {
        machine,
        node,
        settings: &settings,
        redactor: &Redactor::new(),
        now: at(now),
    })
}

fn written(step: &InPlaceStep) -> (&str, &str) {
    match step {
        InPlaceStep::Condition(c) => (
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default(),
        ),
        other => panic!("expected a condition, got {other:?}"),
    }
}

const CANDIDATE: (&str, &str) = (labels::CANDIDATE_FOR_UPDATE, "true");
const SELECTED: (&str, &str) = (labels::SELECTED_FOR_UPDATE, "true");

#[test]
fn a_node_without_the_candidate_label_or_a_condition_is_left_alone() {
    let n = node(&[], None, T0);
    assert!(!concerns(&n));
    assert_eq!(step(&machine(), &n, T0), InPlaceStep::Wait);
    assert!(concerns(&node(&[CANDIDATE], None, T0)));
    assert!(concerns(&node(&[], Some(reasons::UPDATE_SUCCESSFUL), T0)));
}

#[test]
fn a_candidate_node_gets_candidate_for_update_at_now() {
    let s = step(&machine(), &node(&[CANDIDATE], None, T0), T0 + 5);
    assert_eq!(
        written(&s),
        (
            reasons::CANDIDATE_FOR_UPDATE,
            "Node is a candidate for in-place update"
        )
    );
    let InPlaceStep::Condition(c) = s else {
        unreachable!()
    };
    assert_eq!(c.type_, "InPlaceUpdate");
    assert_eq!(c.status, "True");
    assert_eq!(c.last_transition_time, Some(Time(at(T0 + 5))));
}

#[test]
fn a_candidate_stays_candidate_until_it_is_selected() {
    let n = node(&[CANDIDATE], Some(reasons::CANDIDATE_FOR_UPDATE), T0);
    assert_eq!(step(&machine(), &n, T0 + 5), InPlaceStep::Wait);
    let n = node(&[CANDIDATE, SELECTED], Some(reasons::CANDIDATE_FOR_UPDATE), T0);
    assert_eq!(
        written(&step(&machine(), &n, T0 + 5)),
        (
            reasons::SELECTED_FOR_UPDATE,
            "Node is selected for in-place update"
        )
    );
}

#[test]
fn a_selected_node_is_drained_normally_until_the_drain_timeout_since_its_selection() {
    let n = node(&[CANDIDATE, SELECTED], Some(reasons::SELECTED_FOR_UPDATE), T0);
    let InPlaceStep::Drain(mode) = step(&machine(), &n, T0 + 60) else {
        panic!("a drain")
    };
    assert_eq!(mode.force, None);
    assert_eq!(mode.timeout, Duration::from_hours(2));
    assert_eq!(mode.max_evict_retries, 360);
    assert_eq!(mode.force_at, Some(at(T0 + 7200)));
    let InPlaceStep::Drain(mode) = step(&machine(), &n, T0 + 7200) else {
        panic!("a drain")
    };
    assert_eq!(
        mode.force,
        Some(ForceReason::SelectedTimeout {
            timeout: Duration::from_hours(2)
        })
    );
    assert_eq!(mode.timeout, drain::FORCE_TIMEOUT);
    assert_eq!(mode.max_evict_retries, 1);
}

#[test]
fn the_force_drain_label_forces_the_drain_only_with_the_value_true() {
    let n = node(&[CANDIDATE, SELECTED], Some(reasons::SELECTED_FOR_UPDATE), T0);
    let mut m = machine();
    m.metadata
        .labels
        .get_or_insert_default()
        .insert(labels::FORCE_DRAIN.into(), "True".into());
    let InPlaceStep::Drain(mode) = step(&m, &n, T0 + 1) else {
        panic!("a drain")
    };
    assert_eq!(mode.force, Some(ForceReason::DrainLabel));
    assert_eq!(
        ForceReason::DrainLabel.to_string(),
        "the machine has the label force-drain=True"
    );
    m.metadata
        .labels
        .get_or_insert_default()
        .insert(labels::FORCE_DRAIN.into(), "true".into());
    let InPlaceStep::Drain(mode) = step(&m, &n, T0 + 1) else {
        panic!("a drain")
    };
    assert_eq!(mode.force, None, "the reference compares with \"True\"");
}

#[test]
fn a_node_not_ready_for_the_force_period_is_force_drained() {
    let mut n = node(&[CANDIDATE, SELECTED], Some(reasons::SELECTED_FOR_UPDATE), T0);
    let ready = &mut n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0];
    ready.status = "False".into();
    ready.last_transition_time = Some(Time(at(T0)));
    let InPlaceStep::Drain(mode) = step(&machine(), &n, T0 + 299) else {
        panic!("a drain")
    };
    assert_eq!(mode.force, None);
    assert_eq!(mode.force_at, Some(at(T0 + 300)));
    let InPlaceStep::Drain(mode) = step(&machine(), &n, T0 + 300) else {
        panic!("a drain")
    };
    assert!(matches!(mode.force, Some(ForceReason::NodeNotReady { .. })));
}

#[test]
fn a_drained_node_becomes_ready_for_update_and_then_waits_for_the_agent() {
    let n = node(&[CANDIDATE, SELECTED], Some(reasons::DRAIN_SUCCESSFUL), T0);
    assert_eq!(
        written(&step(&machine(), &n, T0 + 1)),
        (reasons::READY_FOR_UPDATE, "Node is ready for in-place update")
    );
    let n = node(&[CANDIDATE, SELECTED], Some(reasons::READY_FOR_UPDATE), T0);
    assert_eq!(step(&machine(), &n, T0 + 1), InPlaceStep::Wait);
    assert!(agent_should_update(&n));
}

#[test]
fn the_agents_result_becomes_the_condition_once() {
    let ok = (labels::UPDATE_RESULT, "successful");
    let n = node(&[CANDIDATE, SELECTED, ok], Some(reasons::READY_FOR_UPDATE), T0);
    assert!(!agent_should_update(&n), "the agent has answered");
    assert_eq!(
        written(&step(&machine(), &n, T0 + 1)),
        (reasons::UPDATE_SUCCESSFUL, "Node in-place update successful")
    );
    let n = node(&[CANDIDATE, SELECTED, ok], Some(reasons::UPDATE_SUCCESSFUL), T0);
    assert_eq!(step(&machine(), &n, T0 + 1), InPlaceStep::Wait);

    let failed = (labels::UPDATE_RESULT, "failed");
    let mut n = node(
        &[CANDIDATE, SELECTED, failed],
        Some(reasons::READY_FOR_UPDATE),
        T0,
    );
    n.metadata.annotations = Some(
        [(
            annotations::UPDATE_FAILED_REASON.to_owned(),
            "class c2 not found; token abcdef.0123456789abcdef".to_owned(),
        )]
        .into(),
    );
    let mut redactor = Redactor::new();
    redactor.add_secret_data(
        &[(
            "userData".to_owned(),
            k8s_openapi::ByteString(b"abcdef.0123456789abcdef".to_vec()),
        )]
        .into(),
    );
    let m = machine();
    let settings = crate::effective_settings(&m, &ControllerSettings::default());
    let s = decide(&InPlaceInput {
        machine: &m,
        node: &n,
        settings: &settings,
        redactor: &redactor,
        now: at(T0 + 1),
    });
    assert_eq!(
        written(&s),
        (
            reasons::UPDATE_FAILED,
            "Node in-place update failed: class c2 not found; token [redacted]"
        )
    );
    let n = node(&[CANDIDATE, failed], Some(reasons::UPDATE_FAILED), T0);
    assert_eq!(step(&machine(), &n, T0 + 1), InPlaceStep::Wait);
}

#[test]
fn a_successful_node_without_its_result_is_a_candidate_for_the_next_update() {
    let n = node(&[CANDIDATE], Some(reasons::UPDATE_SUCCESSFUL), T0);
    assert_eq!(
        written(&step(&machine(), &n, T0 + 1)).0,
        reasons::CANDIDATE_FOR_UPDATE
    );
    // Without the candidate label (moved to the new set) nothing happens.
    let n = node(&[], Some(reasons::UPDATE_SUCCESSFUL), T0);
    assert_eq!(step(&machine(), &n, T0 + 1), InPlaceStep::Wait);
}

#[test]
fn a_machine_being_deleted_is_left_to_the_deletion_flow() {
    let m = MachineBuilder::new("m-1")
        .node("m-1")
        .phase(MachinePhase::Terminating)
        .deleting_at(at(T0))
        .build();
    let n = node(&[CANDIDATE, SELECTED], Some(reasons::SELECTED_FOR_UPDATE), T0);
    assert_eq!(step(&m, &n, T0 + 1), InPlaceStep::Wait);
}

#[test]
fn the_updating_status_starts_the_in_place_timer() {
    let m = MachineBuilder::new("m-1")
        .node("m-1")
        .phase(MachinePhase::Running)
        .phase_since(at(T0))
        .build();
    let update = updating_status(&m, at(T0 + 30));
    assert_eq!(update.phase(), Some(MachinePhase::InPlaceUpdating));
    assert_eq!(
        update.current_status.as_ref().unwrap().last_update_time,
        Some(Time(at(T0 + 30)))
    );
    let op = update.last_operation.as_ref().unwrap();
    assert_eq!(op.description, "Machine m-1 is undergoing an in-place update");
    assert_eq!(op.r#type, Some(MachineOperationType::InPlaceUpdate));
    assert_eq!(op.state, Some(MachineState::Processing));
    assert_eq!(
        drained_condition(at(T0)).reason.as_deref(),
        Some("DrainSuccessful")
    );
}

#[test]
fn the_result_patch_sets_the_label_and_the_reason_in_one_write() {
    let extra = [(
        mcm_api::keys::kubernetes::INSTANCE_TYPE_LABEL.to_owned(),
        "medium".to_owned(),
    )]
    .into();
    assert_eq!(
        result_patch(Ok(()), &extra),
        json!({"metadata": {
            "labels": {"node.kubernetes.io/instance-type": "medium", "node.machine.sapcloud.io/update-result": "successful"},
            "annotations": {"node.machine.sapcloud.io/update-failed-reason": null}
        }})
    );
    assert_eq!(
        result_patch(Err("no class"), &BTreeMap::new()),
        json!({"metadata": {
            "labels": {"node.machine.sapcloud.io/update-result": "failed"},
            "annotations": {"node.machine.sapcloud.io/update-failed-reason": "no class"}
        }})
    );
}
