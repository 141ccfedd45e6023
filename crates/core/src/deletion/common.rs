//! Readers and status writes shared by [`decide`](fn@super::decide) and [`after`](fn@super::after).

use jiff::Timestamp;
use k8s_openapi::{api::core::v1::NodeCondition, apimachinery::pkg::apis::meta::v1::Time};
use mcm_api::{CurrentStatus, LastOperation, Machine, MachineOperationType, MachinePhase};

use super::{
    description::DeletionDescription,
    plan::{DeletionInput, DeletionWrite},
};
use crate::status::StatusUpdate;

pub(super) fn machine_name(machine: &Machine) -> String {
    machine.metadata.name.clone().unwrap_or_default()
}

/// The machine's node name: its `node` label, else the name of the node found for it.
pub(super) fn node_name(input: &DeletionInput<'_>) -> Option<String> {
    input
        .machine
        .node_name()
        .map(str::to_owned)
        .or_else(|| input.node.and_then(|n| n.metadata.name.clone()))
        .filter(|n| !n.is_empty())
}

/// The node conditions the force rules read: the node's, else the machine's copy.
pub(super) fn conditions<'a>(input: &DeletionInput<'a>) -> &'a [NodeCondition] {
    match input.node.and_then(|n| n.status.as_ref()) {
        Some(status) => status.conditions.as_deref().unwrap_or_default(),
        None => input
            .machine
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default(),
    }
}

/// A Delete last operation with `description` at `now`.
fn operation(description: &DeletionDescription, now: Timestamp) -> LastOperation {
    LastOperation {
        description: description.to_string(),
        error_code: String::new(),
        last_update_time: Some(Time(now)),
        state: Some(description.state()),
        r#type: Some(MachineOperationType::Delete),
    }
}

/// A write of `description` that leaves `currentStatus` as it is (its `lastUpdateTime` is the drain timer, as the
/// reference keeps it across steps; issue #563).
pub(super) fn write(input: &DeletionInput<'_>, description: DeletionDescription) -> DeletionWrite {
    DeletionWrite {
        status: StatusUpdate {
            last_operation: Some(operation(&description, input.now)),
            ..StatusUpdate::default()
        },
        deferrable: description.deferrable(),
        description,
    }
}

/// The first write: phase Terminating (its time kept if it already was), `preserveExpiryTime` cleared, lastOperation
/// `Delete/Processing "Set machine status to termination. Now, getting VM Status"` (reference step 1).
pub(super) fn terminating(input: &DeletionInput<'_>) -> DeletionWrite {
    let mut update = write(input, DeletionDescription::Started);
    let old = input.machine.status.as_ref().map(|s| &s.current_status);
    let last_update_time = match old {
        Some(old) if old.phase == Some(MachinePhase::Terminating) && old.last_update_time.is_some() => {
            old.last_update_time.clone()
        }
        _ => Some(Time(input.now)),
    };
    update.status.current_status = Some(CurrentStatus {
        phase: Some(MachinePhase::Terminating),
        timeout_active: false,
        last_update_time,
        preserve_expiry_time: None,
    });
    update
}
