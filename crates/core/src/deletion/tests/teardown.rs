//! VolumeAttachments, VM deletion, node deletion, finalizer removal, and the controller's own machine.

use mcm_api::MachineState;
use mcm_driver::{DeleteMachineResponse, DriverError, MachineCode};
use pretty_assertions::assert_eq;

use super::*;
use crate::retry_policy::RetryDecision;

#[test]
fn volume_attachments_are_deleted_until_none_is_live() {
    // Reference step 4: move on once node.status.volumesAttached is empty, no live VolumeAttachment remains, or
    // the node is gone.
    let f = Fixture::new();
    let m = at_step(machine(), "Force Drain successful. Delete Volume Attachments");
    let with = with_volumes(node("node-1"));
    assert_eq!(
        decide(&f.input(&m, Some(&with), DELETED + 1)).action,
        DeletionAction::DeleteVolumeAttachments {
            node: "node-1".into()
        }
    );
    let without = node("node-1");
    let plan = decide(&f.input(&m, Some(&without), DELETED + 1));
    assert_eq!(plan.action, DeletionAction::DeleteVm);
    assert_eq!(
        plan.write.unwrap().description,
        DeletionDescription::VolumesDetached {
            node: "node-1".into()
        }
    );
    let plan = decide(&f.input(&m, None, DELETED + 1));
    assert_eq!(plan.action, DeletionAction::DeleteVm);
    assert_eq!(
        text(plan.write.as_ref()),
        "Skipping deleteNodeVolAttachments due to - node \"node-1\" not found. Moving to VM Deletion. Initiate \
         VM deletion"
    );

    let deleting = after(
        &f.input(&m, Some(&with), DELETED + 1),
        &StepOutcome::VolumeAttachments(Ok(2)),
    );
    assert_eq!(deleting.next, Some(DeletionStep::DeleteVolumeAttachments));
    assert_eq!(deleting.requeue_after, Some(VOLUME_POLL_INTERVAL));
    let none = after(
        &f.input(&m, Some(&with), DELETED + 1),
        &StepOutcome::VolumeAttachments(Ok(0)),
    );
    assert_eq!(none.next, Some(DeletionStep::DeleteVm));
    let failed = after(
        &f.input(&m, Some(&with), DELETED + 1),
        &StepOutcome::VolumeAttachments(Err("forbidden".into())),
    );
    assert_eq!(failed.next, Some(DeletionStep::DeleteVolumeAttachments));
    assert_eq!(state(failed.write.as_ref()), MachineState::Failed);
}

#[test]
fn vm_deletion_not_found_counts_as_done() {
    let f = Fixture::new();
    let m = at_step(machine(), "Initiate VM deletion");
    let ok = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::DeleteVm(Ok(DeleteMachineResponse {
            last_known_state: "gone".into(),
        })),
    );
    assert_eq!(ok.next, Some(DeletionStep::DeleteNode));
    let write = ok.write.unwrap();
    assert_eq!(write.description, DeletionDescription::VmDeleted);
    assert_eq!(write.status.last_known_state.as_deref(), Some("gone"));
    let not_found = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::DeleteVm(Err(err(MachineCode::NotFound))),
    );
    assert_eq!(not_found.next, Some(DeletionStep::DeleteNode));
    assert_eq!(
        not_found.write.unwrap().description,
        DeletionDescription::VmNotFound
    );
}

#[test]
fn vm_deletion_errors_keep_the_step_and_are_redacted() {
    let mut f = Fixture::new();
    f.redactor.add(b"very-secret-key");
    let m = at_step(machine(), "Initiate VM deletion");
    let transient = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::DeleteVm(Err(DriverError::new(
            MachineCode::Unavailable,
            "cloud said very-secret-key is busy",
        ))),
    );
    assert_eq!(transient.next, Some(DeletionStep::DeleteVm));
    assert!(matches!(transient.retry, Some(RetryDecision::Retry { .. })));
    let description = text(transient.write.as_ref());
    assert!(!description.contains("very-secret-key"), "{description}");
    assert!(description.contains("However, will re-try in the next resync. Initiate VM deletion"));
    // Expired credentials (spec 002 FAQ "stuck in deletion"): an N code waits for a change of the secret.
    let denied = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::DeleteVm(Err(err(MachineCode::PermissionDenied))),
    );
    assert!(matches!(denied.retry, Some(RetryDecision::AwaitChange { .. })));
    assert_eq!(state(denied.write.as_ref()), MachineState::Failed);
    assert!(
        text(denied.write.as_ref())
            .ends_with("Will retry when the machine, its class or its secret changes. Initiate VM deletion")
    );
}

#[test]
fn node_deletion_then_finalizer_removal() {
    let f = Fixture::new();
    let m = at_step(
        machine(),
        "VM deletion was successful. Initiate node object deletion",
    );
    for (deletion, expected) in [
        (
            NodeDeletion::Deleted,
            "Deletion of Node Object \"node-1\" is successful. Initiate machine object finalizer removal",
        ),
        (
            NodeDeletion::NotFound,
            "No node object found for \"node-1\", continuing deletion flow. Initiate machine object finalizer \
             removal",
        ),
    ] {
        let next = after(
            &f.input(&m, None, DELETED + 1),
            &StepOutcome::DeleteNode(deletion),
        );
        assert_eq!(next.next, Some(DeletionStep::RemoveFinalizer));
        assert_eq!(text(next.write.as_ref()), expected);
    }
    let failed = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::DeleteNode(NodeDeletion::Failed("conflict".into())),
    );
    assert_eq!(failed.next, Some(DeletionStep::DeleteNode));
    assert_eq!(state(failed.write.as_ref()), MachineState::Failed);

    // A machine that never had a node goes on to the finalizer.
    let lonely = unlabelled(m);
    let plan = decide(&f.input(&lonely, None, DELETED + 1));
    assert_eq!(plan.action, DeletionAction::RemoveFinalizer);
    assert!(matches!(
        plan.write.unwrap().description,
        DeletionDescription::NoNodeLabel { .. }
    ));

    let m = at_step(machine(), "Initiate machine object finalizer removal");
    let done = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::RemoveFinalizer(Ok(())),
    );
    assert_eq!(done.next, None);
    assert_eq!(done.write, None);
    assert_eq!(done.requeue_after, None);
    let again = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::RemoveFinalizer(Err("conflict".into())),
    );
    assert_eq!(again.next, Some(DeletionStep::RemoveFinalizer));
    assert!(again.requeue_after.is_some());
}

#[test]
fn the_machine_running_the_controller_is_never_drained_or_deleted() {
    // Spec 004: "One reason a Machine may not be deleted is if it corresponds to the node running the Machine
    // controller."
    let mut f = Fixture::new();
    f.controller_node = Some("node-1");
    let n = node("node-1");
    for m in [
        machine(),
        at_step(machine(), "Initiate node drain"),
        at_step(machine(), "Initiate VM deletion"),
    ] {
        let plan = decide(&f.input(&m, Some(&n), DELETED + 1));
        assert_eq!(
            plan.action,
            DeletionAction::Hold(Hold::ControllerNode {
                node: "node-1".into()
            })
        );
        let write = plan.write.unwrap();
        assert_eq!(write.status.current_status, None, "the phase is not touched");
        assert_eq!(write.description.state(), MachineState::Failed);
        let description = write.status.last_operation.unwrap().description;
        assert!(
            description.contains("neither drained nor deleted"),
            "{description}"
        );
        assert_eq!(
            DeletionStep::parse(&description),
            current_step(&m),
            "the step is kept"
        );
    }
    // Another machine is deleted as usual.
    f.controller_node = Some("node-9");
    assert_eq!(
        decide(&f.input(&machine(), Some(&n), DELETED + 1)).action,
        DeletionAction::GetVmStatus
    );
}
