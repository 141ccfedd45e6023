//! [`after`]: what a step's outcome leads to (the next step, a retry, a hold) and the status that persists it.
//!
//! Separate from [`decide`](fn@super::decide) because it runs after the action, on its result.

use std::time::Duration;

use mcm_driver::{DeleteMachineResponse, DriverError, DriverMethod, GetMachineStatusResponse, MachineCode};

use super::{
    VOLUME_POLL_INTERVAL,
    common::{conditions, machine_name, node_name, write},
    description::DeletionDescription,
    plan::{AfterStep, DeletionInput, NodeDeletion, StepOutcome},
    steps::DeletionStep,
};
use crate::{
    drain::{self, DrainOutcome, ForceReason},
    retry_policy::{self, RetryClass, RetryDecision},
    timeouts::{self},
};

/// `after` a success: write `description` and go on at once.
fn proceed(input: &DeletionInput<'_>, description: DeletionDescription) -> AfterStep {
    AfterStep {
        node_label: None,
        next: Some(description.next_step()),
        write: Some(write(input, description)),
        requeue_after: Some(Duration::ZERO),
        retry: None,
    }
}

/// `after` a failure that is not a provider call's: write `description`, back off.
fn retry_later(
    input: &DeletionInput<'_>,
    description: DeletionDescription,
    cap: Option<Duration>,
) -> AfterStep {
    let delay = retry_policy::backoff(input.failures, input.random, input.retry);
    AfterStep {
        requeue_after: Some(cap.map_or(delay, |cap| delay.min(cap))),
        ..proceed(input, description)
    }
}

/// The node label to record after `GetMachineStatus`, if the machine has none: the node found for the machine, else
/// the provider's node name (reference: "ensure the node label").
fn node_label_to_record(input: &DeletionInput<'_>, provider_node: Option<&str>) -> Option<String> {
    if input.machine.node_name().is_some() {
        return None;
    }
    input
        .node
        .and_then(|n| n.metadata.name.clone())
        .or_else(|| provider_node.map(str::to_owned))
        .filter(|n| !n.is_empty())
}

fn after_vm_status(
    input: &DeletionInput<'_>,
    result: &Result<GetMachineStatusResponse, DriverError>,
) -> AfterStep {
    let go_on = |code: Option<MachineCode>, provider_node: Option<&str>| {
        let description = match (input.has_target_cluster, code) {
            (false, _) => DeletionDescription::NoTargetCluster {
                next: DeletionStep::DeleteVm,
            },
            (true, None) => DeletionDescription::VmFound,
            (true, Some(code)) => DeletionDescription::VmStatusUnknown { code },
        };
        AfterStep {
            node_label: node_label_to_record(input, provider_node),
            ..proceed(input, description)
        }
    };
    match result {
        Ok(response) => go_on(None, Some(&response.node_name)),
        Err(error)
            if matches!(
                error.code,
                MachineCode::NotFound | MachineCode::Unimplemented | MachineCode::Uninitialized
            ) =>
        {
            go_on(Some(error.code), None)
        }
        Err(error) => {
            let retry = provider_retry(input, DriverMethod::GetMachineStatus, error.code);
            let description = DeletionDescription::VmStatusFailed {
                code: error.code,
                message: input.redactor.redact(&error.message),
            };
            AfterStep {
                requeue_after: Some(retry.requeue_after()),
                retry: Some(retry),
                ..proceed(input, description)
            }
        }
    }
}

fn provider_retry(input: &DeletionInput<'_>, method: DriverMethod, code: MachineCode) -> RetryDecision {
    retry_policy::decide(method, code, input.failures, input.random, input.retry)
}

/// Time left until a normal drain turns into a force drain (the cap of its requeues).
fn until_forced(input: &DeletionInput<'_>) -> Option<Duration> {
    drain::force_at(input.machine, conditions(input), input.settings)
        .map(|at| timeouts::elapsed(input.now, at))
}

fn after_drain(input: &DeletionInput<'_>, force: Option<&ForceReason>, outcome: &DrainOutcome) -> AfterStep {
    let outcome = outcome.clone();
    let interval = input.settings.evict_retry_interval;
    match (force, outcome) {
        (_, outcome @ DrainOutcome::InProgress { .. }) => {
            let cap = if force.is_some() {
                None
            } else {
                until_forced(input)
            };
            AfterStep {
                requeue_after: Some(cap.map_or(interval, |cap| interval.min(cap))),
                ..proceed(input, DeletionDescription::DrainInProgress { outcome })
            }
        }
        (Some(reason), outcome @ DrainOutcome::Drained { .. }) => proceed(
            input,
            DeletionDescription::ForceDrained {
                reason: reason.clone(),
                outcome,
            },
        ),
        // Reference: under force, a failed drain is ignored and the flow goes on to the VolumeAttachments.
        (Some(_), outcome) => proceed(input, DeletionDescription::ForceDrainFailed { outcome }),
        (None, outcome @ DrainOutcome::Drained { .. }) => {
            proceed(input, DeletionDescription::Drained { outcome })
        }
        (None, outcome) => retry_later(
            input,
            DeletionDescription::DrainFailed { outcome },
            until_forced(input),
        ),
    }
}

fn after_volume_attachments(input: &DeletionInput<'_>, result: &Result<usize, String>) -> AfterStep {
    let node = node_name(input).unwrap_or_default();
    match result {
        Ok(0) => proceed(input, DeletionDescription::NoLiveVolumeAttachments { node }),
        Ok(count) => AfterStep {
            requeue_after: Some(VOLUME_POLL_INTERVAL),
            ..proceed(
                input,
                DeletionDescription::VolumeAttachmentsDeleting { node, count: *count },
            )
        },
        Err(message) => retry_later(
            input,
            DeletionDescription::VolumeAttachmentsFailed {
                node,
                message: message.clone(),
            },
            None,
        ),
    }
}

fn after_vm_deletion(
    input: &DeletionInput<'_>,
    result: &Result<DeleteMachineResponse, DriverError>,
) -> AfterStep {
    match result {
        Ok(response) => {
            let mut step = proceed(input, DeletionDescription::VmDeleted);
            if let Some(write) = step.write.as_mut()
                && !response.last_known_state.is_empty()
            {
                write.status.last_known_state = Some(response.last_known_state.clone());
            }
            step
        }
        Err(error) if error.code == MachineCode::NotFound => proceed(input, DeletionDescription::VmNotFound),
        Err(error) => {
            let retry = provider_retry(input, DriverMethod::DeleteMachine, error.code);
            let description = DeletionDescription::VmDeletionFailed {
                code: error.code,
                message: input.redactor.redact(&error.message),
                backoff: retry_policy::retry_class(DriverMethod::DeleteMachine, error.code)
                    == RetryClass::Auto,
            };
            AfterStep {
                requeue_after: Some(retry.requeue_after()),
                retry: Some(retry),
                ..proceed(input, description)
            }
        }
    }
}

fn after_node_deletion(input: &DeletionInput<'_>, deletion: &NodeDeletion) -> AfterStep {
    let Some(node) = node_name(input) else {
        return proceed(
            input,
            DeletionDescription::NoNodeLabel {
                machine: machine_name(input.machine),
            },
        );
    };
    match deletion {
        NodeDeletion::Deleted => proceed(input, DeletionDescription::NodeDeleted { node }),
        NodeDeletion::NotFound => proceed(input, DeletionDescription::NodeAlreadyGone { node }),
        NodeDeletion::Failed(message) => retry_later(
            input,
            DeletionDescription::NodeDeletionFailed {
                node,
                message: message.clone(),
            },
            None,
        ),
    }
}

fn after_finalizer_removal(input: &DeletionInput<'_>, result: &Result<(), String>) -> AfterStep {
    match result {
        Ok(()) => AfterStep {
            node_label: None,
            write: None,
            next: None,
            requeue_after: None,
            retry: None,
        },
        // The reference writes no status here either; the removal is retried.
        Err(_) => AfterStep {
            node_label: None,
            write: None,
            next: Some(DeletionStep::RemoveFinalizer),
            requeue_after: Some(retry_policy::backoff(input.failures, input.random, input.retry)),
            retry: None,
        },
    }
}

/// What follows the outcome of a plan's action: the status that persists the next step, and when to look again.
///
/// Reference rules kept: `GetMachineStatus` `NotFound`, `Unimplemented` and `Uninitialized` still go to the drain
/// (so that `DeleteMachine` cleans up); without a target cluster the flow skips to VM deletion; a successful normal
/// drain goes straight to VM deletion (volumes were already awaited), a successful force drain to VolumeAttachment
/// deletion, and a failed force drain too; `DeleteMachine` `NotFound` counts as done; a missing node counts as
/// deleted. A failed step keeps its marker, with lastOperation state Failed.
pub fn after(input: &DeletionInput<'_>, outcome: &StepOutcome) -> AfterStep {
    match outcome {
        StepOutcome::GetVmStatus(result) => after_vm_status(input, result),
        StepOutcome::Drain { force, outcome } => after_drain(input, force.as_ref(), outcome),
        StepOutcome::VolumeAttachments(result) => after_volume_attachments(input, result),
        StepOutcome::DeleteVm(result) => after_vm_deletion(input, result),
        StepOutcome::DeleteNode(deletion) => after_node_deletion(input, deletion),
        StepOutcome::RemoveFinalizer(result) => after_finalizer_removal(input, result),
    }
}
