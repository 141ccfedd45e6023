//! [`decide`]: the step a machine is at, the status to persist first and the action of this pass (hooks, skips, holds).
//!
//! Separate from [`after`](fn@super::after) because it runs before the action, on what the controller observed.

use mcm_api::{Machine, MachinePhase, MetaExt, keys::finalizers};

use super::{
    common::{conditions, machine_name, node_name, terminating, write},
    description::DeletionDescription,
    plan::{DeletionAction, DeletionInput, DeletionPlan, DeletionWrite, Hold},
    steps::{DeletionStep, HookKind, hooks},
};
use crate::drain::{self};

/// The persisted step of a machine: [`DeletionStep::SetTerminating`] unless its phase is Terminating, else the step
/// its description names.
pub fn current_step(machine: &Machine) -> DeletionStep {
    match &machine.status {
        Some(status) if status.current_status.phase == Some(MachinePhase::Terminating) => {
            DeletionStep::parse(&status.last_operation.description)
        }
        _ => DeletionStep::SetTerminating,
    }
}

/// What one step comes to in [`decide`].
enum Visit {
    /// Do this.
    Act(DeletionAction),
    /// Hold, writing this.
    Hold(Hold, DeletionWrite),
    /// Nothing to do at this step: write this (it names the next step) and go on.
    Skip(DeletionWrite),
}

/// A hold on hooks of `kind`, if the machine has any.
fn hook_hold(input: &DeletionInput<'_>, kind: HookKind) -> Option<Visit> {
    let names = hooks(input.machine, kind);
    (!names.is_empty()).then(|| {
        let description = DeletionDescription::HooksPending {
            kind,
            hooks: names.clone(),
        };
        Visit::Hold(Hold::Hooks { kind, hooks: names }, write(input, description))
    })
}

/// The drain step. Without a target cluster there is nothing to drain and pre-drain hooks do not apply (as after
/// `GetMachineStatus`, which skips to VM deletion then); otherwise pre-drain hooks hold the machine whether or not it
/// has a node.
fn visit_drain(input: &DeletionInput<'_>) -> Visit {
    let skip = |description| Visit::Skip(write(input, description));
    if !input.has_target_cluster {
        return skip(DeletionDescription::NoTargetCluster {
            next: DeletionStep::DeleteVm,
        });
    }
    if let Some(hold) = hook_hold(input, HookKind::PreDrain) {
        return hold;
    }
    let Some(node) = node_name(input) else {
        return skip(DeletionDescription::NoNodeName);
    };
    if input.node.is_none() {
        return skip(DeletionDescription::NodeNotFound { node });
    }
    let mode = drain::drain_mode(input.machine, conditions(input), input.now, input.settings);
    Visit::Act(DeletionAction::Drain { node, mode })
}

fn visit_volume_attachments(input: &DeletionInput<'_>) -> Visit {
    let skip = |description| Visit::Skip(write(input, description));
    if !input.has_target_cluster {
        return skip(DeletionDescription::NoTargetCluster {
            next: DeletionStep::DeleteVm,
        });
    }
    let node = node_name(input).unwrap_or_default();
    if node.is_empty() || input.node.is_none() {
        return skip(DeletionDescription::VolumeAttachmentsNodeGone { node });
    }
    if drain::no_volumes_attached(input.node) {
        return skip(DeletionDescription::VolumesDetached { node });
    }
    Visit::Act(DeletionAction::DeleteVolumeAttachments { node })
}

fn visit_node_deletion(input: &DeletionInput<'_>) -> Visit {
    let skip = |description| Visit::Skip(write(input, description));
    if !input.has_target_cluster {
        return skip(DeletionDescription::NoTargetCluster {
            next: DeletionStep::RemoveFinalizer,
        });
    }
    match node_name(input) {
        Some(node) => Visit::Act(DeletionAction::DeleteNode { node }),
        None => skip(DeletionDescription::NoNodeLabel {
            machine: machine_name(input.machine),
        }),
    }
}

fn visit(input: &DeletionInput<'_>, step: DeletionStep) -> Visit {
    match step {
        DeletionStep::SetTerminating => Visit::Skip(terminating(input)),
        DeletionStep::GetVmStatus => Visit::Act(DeletionAction::GetVmStatus),
        DeletionStep::Drain => visit_drain(input),
        DeletionStep::DeleteVolumeAttachments => visit_volume_attachments(input),
        DeletionStep::DeleteVm => {
            hook_hold(input, HookKind::PreTerminate).unwrap_or(Visit::Act(DeletionAction::DeleteVm))
        }
        DeletionStep::DeleteNode => visit_node_deletion(input),
        DeletionStep::RemoveFinalizer => Visit::Act(DeletionAction::RemoveFinalizer),
    }
}

/// `next` written over `previous` (see [`DeletionWrite::then`]).
fn merge(previous: Option<DeletionWrite>, next: DeletionWrite) -> DeletionWrite {
    match previous {
        Some(previous) => previous.then(next),
        None => next,
    }
}

/// The machine runs on the controller's own node (spec 004).
fn controller_node(input: &DeletionInput<'_>) -> Option<String> {
    let own = input.controller_node.filter(|n| !n.is_empty())?;
    node_name(input).filter(|node| node == own)
}

/// The plan of this pass of the deletion flow. Steps with nothing to do (no target cluster, no node, no volumes) are
/// skipped within the pass: the plan's write then persists the step of its action, before the action.
pub fn decide(input: &DeletionInput<'_>) -> DeletionPlan {
    let machine = input.machine;
    let persisted = current_step(machine);
    if !machine.is_deleting() || !machine.has_finalizer(finalizers::MACHINE_CONTROLLER_MANAGER) {
        return DeletionPlan {
            step: persisted,
            action: DeletionAction::Nothing,
            write: None,
            requeue_after: None,
        };
    }
    if let Some(node) = controller_node(input) {
        let description = DeletionDescription::ControllerNode {
            machine: machine_name(machine),
            node: node.clone(),
            at: persisted,
        };
        return DeletionPlan {
            step: persisted,
            action: DeletionAction::Hold(Hold::ControllerNode { node }),
            write: Some(write(input, description)),
            requeue_after: Some(input.retry.await_change_resync),
        };
    }
    let mut step = persisted;
    let mut pending: Option<DeletionWrite> = None;
    // Each skip moves to a later step, so this ends within the number of steps.
    for _ in DeletionStep::ALL {
        match visit(input, step) {
            Visit::Act(action) => {
                return DeletionPlan {
                    step,
                    action,
                    write: pending,
                    requeue_after: None,
                };
            }
            Visit::Hold(hold, hold_write) => {
                return DeletionPlan {
                    step,
                    action: DeletionAction::Hold(hold),
                    write: Some(merge(pending, hold_write)),
                    requeue_after: Some(input.retry.await_change_resync),
                };
            }
            Visit::Skip(skipped) => {
                step = skipped.description.next_step();
                pending = Some(merge(pending, skipped));
            }
        }
    }
    // Unreachable: RemoveFinalizer always acts.
    DeletionPlan {
        step,
        action: DeletionAction::RemoveFinalizer,
        write: pending,
        requeue_after: None,
    }
}
