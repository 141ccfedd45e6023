//! The drain step: skipped without a node, normal and forced drains, blocked and in-progress drains.

use std::time::Duration;

use mcm_api::MachineState;
use pretty_assertions::assert_eq;

use super::*;
use crate::drain::{Blocker, DrainOutcome, ForceReason, PodRef};

#[test]
fn a_machine_without_a_node_skips_the_drain_within_the_pass() {
    // Reference §4: "An empty node label ⇒ skip the drain and go to VM deletion" (issue #465: machines that
    // never joined).
    let f = Fixture::new();
    let m = unlabelled(at_step(machine(), "Initiate node drain"));
    let plan = decide(&f.input(&m, None, DELETED + 1));
    assert_eq!(plan.step, DeletionStep::DeleteVm);
    assert_eq!(plan.action, DeletionAction::DeleteVm);
    assert_eq!(plan.write.unwrap().description, DeletionDescription::NoNodeName);

    // A node name whose node does not exist: nothing to drain either.
    let m = at_step(machine(), "Initiate node drain");
    let plan = decide(&f.input(&m, None, DELETED + 1));
    assert_eq!(plan.action, DeletionAction::DeleteVm);
    assert_eq!(
        text(plan.write.as_ref()),
        "Node node-1 not found, nothing to drain. Initiate VM deletion"
    );

    // With a pre-terminate hook, the skip ends in the hold.
    let m = annotated(m, "pre-terminate.delete.hook.machine.sapcloud.io/x");
    let plan = decide(&f.input(&m, None, DELETED + 1));
    assert!(matches!(plan.action, DeletionAction::Hold(_)));
    assert_eq!(
        DeletionStep::parse(&text(plan.write.as_ref())),
        DeletionStep::DeleteVm
    );
}

#[test]
fn a_normal_drain_uses_the_effective_timeout_and_retries() {
    let f = Fixture::new();
    let n = node("node-1");
    let m = at_step(machine(), "Initiate node drain");
    let DeletionAction::Drain { node, mode } = decide(&f.input(&m, Some(&n), DELETED + 1)).action else {
        panic!("drain")
    };
    assert_eq!(node, "node-1");
    assert_eq!(mode.force, None);
    assert_eq!(mode.timeout, Duration::from_hours(2));
    assert_eq!(mode.max_evict_retries, 360);
    assert_eq!(mode.force_at, Some(at(DELETED + 7200)));
}

#[test]
fn a_node_being_deleted_is_drained_like_any_other() {
    // Reference v0.61+ (`drainNode`): the node of a machine deleted because its Node was deleted still exists
    // (our node finalizer holds it) and is drained as usual; only a node that is gone skips the drain (above).
    let f = Fixture::new();
    let mut n = node("node-1");
    n.metadata.deletion_timestamp = Some(Time(at(DELETED)));
    n.metadata.finalizers = Some(vec![finalizers::NODE.into()]);
    let m = at_step(machine(), "Initiate node drain");
    let DeletionAction::Drain { node, mode } = decide(&f.input(&m, Some(&n), DELETED + 1)).action else {
        panic!("drain")
    };
    assert_eq!(node, "node-1");
    assert_eq!(mode.force, None, "a normal drain, not a forced one");
}

#[test]
fn a_node_not_ready_for_five_minutes_is_force_drained() {
    // Spec 002 FAQ: "if the node Ready is False ... for greater than 5 minutes (non-configurable), then a
    // forceful drain is initiated".
    let f = Fixture::new();
    let n = not_ready(node("node-1"), DELETED - 300);
    let m = at_step(machine(), "Initiate node drain");
    let DeletionAction::Drain { mode, .. } = decide(&f.input(&m, Some(&n), DELETED)).action else {
        panic!("drain")
    };
    assert_eq!(
        mode.force,
        Some(ForceReason::NodeNotReady {
            after: Duration::from_mins(5)
        })
    );
    assert_eq!(mode.timeout, Duration::from_mins(1));
    assert_eq!(mode.max_evict_retries, 1);
}

#[test]
fn a_normal_drain_goes_straight_to_vm_deletion() {
    let f = Fixture::new();
    let m = at_step(machine(), "Initiate node drain");
    let next = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::Drain {
            force: None,
            outcome: DrainOutcome::Drained {
                evicted: 3,
                deleted: 0,
            },
        },
    );
    assert_eq!(next.next, Some(DeletionStep::DeleteVm));
    assert_eq!(
        text(next.write.as_ref()),
        "Drain successful (3 pods evicted). Initiate VM deletion"
    );
    assert_eq!(next.requeue_after, Some(Duration::ZERO));
}

#[test]
fn a_force_drain_goes_to_volume_attachment_deletion_even_when_it_failed() {
    let f = Fixture::new();
    let m = at_step(machine(), "Initiate node drain");
    let reason = ForceReason::Label { value: "True".into() };
    let done = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::Drain {
            force: Some(reason.clone()),
            outcome: DrainOutcome::Drained {
                evicted: 0,
                deleted: 2,
            },
        },
    );
    assert_eq!(done.next, Some(DeletionStep::DeleteVolumeAttachments));
    assert_eq!(
        text(done.write.as_ref()),
        "Force Drain successful (the machine has the label force-deletion=True; 2 pods deleted). Delete Volume \
         Attachments"
    );
    let failed = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::Drain {
            force: Some(reason),
            outcome: DrainOutcome::Failed {
                message: "timed out".into(),
            },
        },
    );
    assert_eq!(failed.next, Some(DeletionStep::DeleteVolumeAttachments));
    assert_eq!(state(failed.write.as_ref()), MachineState::Processing);
}

#[test]
fn a_blocked_drain_is_failed_names_pod_and_pdb_and_is_retried() {
    // Reference: "...Will retry in next sync. Initiate node drain"; issue: the description names the pod and the
    // PDB.
    let f = Fixture::new();
    let m = at_step(machine(), "Initiate node drain");
    let blocker = Blocker {
        pod: PodRef {
            namespace: "shop".into(),
            name: "db-0".into(),
            uid: String::new(),
        },
        pdb: Some("db-pdb".into()),
        misconfigured: true,
    };
    let next = after(
        &f.input(&m, None, DELETED + 7190),
        &StepOutcome::Drain {
            force: None,
            outcome: DrainOutcome::Blocked(blocker),
        },
    );
    assert_eq!(next.next, Some(DeletionStep::Drain));
    assert_eq!(state(next.write.as_ref()), MachineState::Failed);
    let description = text(next.write.as_ref());
    assert!(description.contains("pod shop/db-0"), "{description}");
    assert!(
        description.contains("PodDisruptionBudget shop/db-pdb"),
        "{description}"
    );
    assert!(
        description.ends_with("Will retry in next sync. Initiate node drain"),
        "{description}"
    );
    assert_eq!(next.write.unwrap().status.current_status, None);
    // Retried with back-off, but no later than the moment the drain turns into a force drain.
    assert_eq!(next.requeue_after, Some(Duration::from_secs(5)));
    let mut f = Fixture::new();
    f.failures = 10;
    let next = after(
        &f.input(&m, None, DELETED + 7190),
        &StepOutcome::Drain {
            force: None,
            outcome: DrainOutcome::Failed { message: "x".into() },
        },
    );
    assert_eq!(next.requeue_after, Some(Duration::from_secs(10)));
}

#[test]
fn a_drain_in_progress_looks_again_after_the_evict_retry_interval() {
    let f = Fixture::new();
    let m = at_step(machine(), "Initiate node drain");
    let next = after(
        &f.input(&m, None, DELETED + 1),
        &StepOutcome::Drain {
            force: None,
            outcome: DrainOutcome::InProgress {
                remaining: 2,
                blocked: None,
            },
        },
    );
    assert_eq!(next.next, Some(DeletionStep::Drain));
    assert_eq!(state(next.write.as_ref()), MachineState::Processing);
    assert_eq!(
        text(next.write.as_ref()),
        "Drain in progress: 2 pods left. Initiate node drain"
    );
    assert_eq!(next.requeue_after, Some(Duration::from_secs(20)));
}
