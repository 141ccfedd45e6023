//! Where the flow starts and resumes, the VM status step and the lifecycle hooks.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mcm_api::{MachineOperationType, MachinePhase, MachineState};
use mcm_driver::{GetMachineStatusResponse, MachineCode};
use pretty_assertions::assert_eq;

use super::*;
use crate::{deletion::steps::GET_VM_STATUS, retry_policy::RetryDecision};

#[test]
fn machines_not_being_deleted_or_not_ours_are_left_alone() {
    let f = Fixture::new();
    let mut alive = machine();
    alive.metadata.deletion_timestamp = None;
    assert_eq!(
        decide(&f.input(&alive, None, DELETED)).action,
        DeletionAction::Nothing
    );
    let mut foreign = machine();
    foreign.metadata.finalizers = Some(vec!["someone.else/finalizer".into()]);
    let plan = decide(&f.input(&foreign, None, DELETED));
    assert_eq!(plan.action, DeletionAction::Nothing);
    assert_eq!(plan.write, None);
}

#[test]
fn the_flow_starts_by_setting_terminating_then_asks_for_the_vm() {
    // Reference step 1: phase Terminating, preserveExpiryTime cleared, lastOperation Delete/Processing
    // "Set machine status to termination. Now, getting VM Status".
    let f = Fixture::new();
    let m = machine();
    let plan = decide(&f.input(&m, None, DELETED + 1));
    assert_eq!(plan.step, DeletionStep::GetVmStatus);
    assert_eq!(plan.action, DeletionAction::GetVmStatus);
    let write = plan.write.unwrap();
    assert_eq!(write.description, DeletionDescription::Started);
    let current = write.status.current_status.as_ref().unwrap();
    assert_eq!(current.phase, Some(MachinePhase::Terminating));
    assert_eq!(current.last_update_time, Some(Time(at(DELETED + 1))));
    assert_eq!(current.preserve_expiry_time, None);
    let op = write.status.last_operation.as_ref().unwrap();
    assert_eq!(op.r#type, Some(MachineOperationType::Delete));
    assert_eq!(op.state, Some(MachineState::Processing));
    assert_eq!(op.error_code, "", "a creation error code is cleared");
    assert!(write.status.changes(m.status.as_ref()));
}

#[test]
fn an_unknown_description_restarts_at_the_first_step_keeping_the_terminating_time() {
    let f = Fixture::new();
    let m = at_step(machine(), "something else entirely");
    let plan = decide(&f.input(&m, None, DELETED + 500));
    assert_eq!(plan.action, DeletionAction::GetVmStatus);
    let write = plan.write.unwrap();
    assert_eq!(write.description, DeletionDescription::Started);
    assert_eq!(
        write.status.current_status.unwrap().last_update_time,
        Some(Time(at(DELETED))),
        "lastUpdateTime is the drain timer (issue #563)"
    );
}

#[test]
fn each_persisted_step_resumes_where_it_stopped() {
    let f = Fixture::new();
    let n = with_volumes(node("node-1"));
    let cases = [
        (DeletionStep::GetVmStatus, DeletionAction::GetVmStatus),
        (
            DeletionStep::DeleteVolumeAttachments,
            DeletionAction::DeleteVolumeAttachments {
                node: "node-1".into(),
            },
        ),
        (DeletionStep::DeleteVm, DeletionAction::DeleteVm),
        (
            DeletionStep::DeleteNode,
            DeletionAction::DeleteNode {
                node: "node-1".into(),
            },
        ),
        (DeletionStep::RemoveFinalizer, DeletionAction::RemoveFinalizer),
    ];
    for (step, action) in cases {
        let m = at_step(machine(), &format!("Something happened. {step}"));
        let plan = decide(&f.input(&m, Some(&n), DELETED + 1));
        assert_eq!(plan.step, step);
        assert_eq!(plan.action, action);
        assert_eq!(
            plan.write,
            None,
            "nothing to write before repeating {}",
            step.name()
        );
    }
    let m = at_step(machine(), "Initiate node drain");
    let plan = decide(&f.input(&m, Some(&n), DELETED + 1));
    assert!(matches!(plan.action, DeletionAction::Drain { ref node, .. } if node == "node-1"));
}

#[test]
fn vm_status_success_goes_to_the_drain_and_records_a_missing_node_label() {
    let f = Fixture::new();
    let m = at_step(machine(), GET_VM_STATUS);
    let ok = StepOutcome::GetVmStatus(Ok(GetMachineStatusResponse {
        node_name: "from-provider".into(),
        ..GetMachineStatusResponse::default()
    }));
    let next = after(&f.input(&m, None, DELETED + 1), &ok);
    assert_eq!(next.next, Some(DeletionStep::Drain));
    assert_eq!(text(next.write.as_ref()), "Initiate node drain");
    assert_eq!(next.node_label, None, "the machine has its label");
    assert_eq!(
        next.write.unwrap().status.current_status,
        None,
        "currentStatus is kept"
    );

    // Reference: the label, else the node whose machine-name label names the machine, else the provider's.
    let m = unlabelled(m);
    let next = after(&f.input(&m, None, DELETED + 1), &ok);
    assert_eq!(next.node_label.as_deref(), Some("from-provider"));
    let found = node("found-by-label");
    let next = after(&f.input(&m, Some(&found), DELETED + 1), &ok);
    assert_eq!(next.node_label.as_deref(), Some("found-by-label"));
}

#[test]
fn vm_status_not_found_unimplemented_and_uninitialized_still_drain() {
    // Reference #850: the deletion goes on so that DeleteMachine cleans up NICs and disks.
    let f = Fixture::new();
    let m = at_step(machine(), GET_VM_STATUS);
    for code in [
        MachineCode::NotFound,
        MachineCode::Unimplemented,
        MachineCode::Uninitialized,
    ] {
        let next = after(
            &f.input(&m, None, DELETED + 1),
            &StepOutcome::GetVmStatus(Err(err(code))),
        );
        assert_eq!(next.next, Some(DeletionStep::Drain), "{code:?}");
        assert_eq!(state(next.write.as_ref()), MachineState::Processing);
        assert_eq!(next.retry, None);
    }
}

#[test]
fn other_vm_status_errors_keep_the_step_and_follow_the_retry_policy() {
    let f = Fixture::new();
    let m = at_step(machine(), GET_VM_STATUS);
    let next = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::GetVmStatus(Err(err(MachineCode::Unavailable))),
    );
    assert_eq!(next.next, Some(DeletionStep::GetVmStatus));
    assert_eq!(state(next.write.as_ref()), MachineState::Failed);
    assert_eq!(
        text(next.write.as_ref()),
        "Getting the VM status failed: machine codes error: code = [Unavailable] message = [boom]. Will retry. \
         Set machine status to termination. Now, getting VM Status"
    );
    assert!(matches!(next.retry, Some(RetryDecision::Retry { .. })));
    let next = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::GetVmStatus(Err(err(MachineCode::PermissionDenied))),
    );
    assert!(matches!(next.retry, Some(RetryDecision::AwaitChange { .. })));
}

#[test]
fn without_a_target_cluster_the_flow_skips_to_vm_deletion_and_node_deletion() {
    let mut f = Fixture::new();
    f.target = false;
    let m = at_step(machine(), GET_VM_STATUS);
    let next = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::GetVmStatus(Ok(GetMachineStatusResponse::default())),
    );
    assert_eq!(next.next, Some(DeletionStep::DeleteVm));
    let m = at_step(
        machine(),
        "VM deletion was successful. Initiate node object deletion",
    );
    let plan = decide(&f.input(&m, None, DELETED + 1));
    assert_eq!(plan.action, DeletionAction::RemoveFinalizer);
    assert_eq!(plan.step, DeletionStep::RemoveFinalizer);
    assert_eq!(
        plan.write.unwrap().description,
        DeletionDescription::NoTargetCluster {
            next: DeletionStep::RemoveFinalizer
        }
    );
}

#[test]
fn pre_drain_hooks_hold_the_machine_before_the_drain_until_removed() {
    let f = Fixture::new();
    let n = node("node-1");
    let m = annotated(
        annotated(
            at_step(machine(), "Initiate node drain"),
            "pre-drain.delete.hook.machine.sapcloud.io/b",
        ),
        "pre-drain.delete.hook.machine.sapcloud.io/a",
    );
    let plan = decide(&f.input(&m, Some(&n), DELETED + 1));
    assert_eq!(
        plan.action,
        DeletionAction::Hold(Hold::Hooks {
            kind: HookKind::PreDrain,
            hooks: vec!["a".into(), "b".into()]
        })
    );
    assert_eq!(plan.step, DeletionStep::Drain);
    assert_eq!(plan.requeue_after, Some(Duration::from_mins(10)));
    let held = text(plan.write.as_ref());
    assert_eq!(held, "Waiting for pre-drain hooks [a, b]. Initiate node drain");
    assert_eq!(
        DeletionStep::parse(&held),
        DeletionStep::Drain,
        "a reference reader sees the drain next"
    );

    // Held again: the same write changes nothing.
    let mut held_machine = m.clone();
    plan.write
        .unwrap()
        .status
        .apply(held_machine.status.as_mut().unwrap());
    let again = decide(&f.input(&held_machine, Some(&n), DELETED + 60));
    assert!(!again.write.unwrap().status.changes(held_machine.status.as_ref()));

    // Released: the drain starts.
    let mut released = held_machine;
    released.metadata.annotations = None;
    assert!(matches!(
        decide(&f.input(&released, Some(&n), DELETED + 61)).action,
        DeletionAction::Drain { .. }
    ));
}

#[test]
fn pre_terminate_hooks_hold_the_machine_before_vm_deletion() {
    let f = Fixture::new();
    let m = annotated(
        at_step(machine(), "Drain successful. Initiate VM deletion"),
        "pre-terminate.delete.hook.machine.sapcloud.io/backup",
    );
    let plan = decide(&f.input(&m, None, DELETED + 1));
    assert_eq!(plan.step, DeletionStep::DeleteVm);
    assert!(matches!(
        plan.action,
        DeletionAction::Hold(Hold::Hooks {
            kind: HookKind::PreTerminate,
            ..
        })
    ));
    assert_eq!(
        text(plan.write.as_ref()),
        "Waiting for pre-terminate hooks [backup]. Initiate VM deletion"
    );
    // A pre-drain hook does not hold the VM deletion.
    let m = annotated(
        at_step(machine(), "Drain successful. Initiate VM deletion"),
        "pre-drain.delete.hook.machine.sapcloud.io/late",
    );
    assert_eq!(
        decide(&f.input(&m, None, DELETED + 1)).action,
        DeletionAction::DeleteVm
    );
}
