//! [`DeletionDescription`]: every lastOperation description of the flow, its wire text and the step it persists.
//!
//! Separate because the texts are many and matter word for word; the decisions only pick one.

use std::fmt;

use mcm_api::{MachineState, keys::labels};
use mcm_driver::MachineCode;

use super::steps::{DeletionStep, HookKind};
use crate::drain::{DrainOutcome, ForceReason};

/// Every `lastOperation.description` of the deletion flow. `Display` writes the wire text, which ends with the
/// marker of [`DeletionDescription::next_step`]; texts marked "reference" are the reference's word for word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeletionDescription {
    /// `Set machine status to termination. Now, getting VM Status` (reference): phase Terminating was set.
    Started,
    /// `Getting the VM status failed: machine codes error: code = [..] message = [..]. Will retry. <GetVmStatus>`.
    VmStatusFailed {
        /// The machine code.
        code: MachineCode,
        /// The provider's message, redacted.
        message: String,
    },
    /// `Initiate node drain` (reference): the VM exists.
    VmFound,
    /// `The provider answered <code> for the VM status; the deletion goes on so that the provider can clean up what
    /// is left. Initiate node drain`: `NotFound`, `Unimplemented` or `Uninitialized` (reference #850: the deletion goes
    /// on, so that DeleteMachine removes NICs and disks).
    VmStatusUnknown {
        /// The machine code.
        code: MachineCode,
    },
    /// `No target cluster: there is no node to drain or delete. <next>`.
    NoTargetCluster {
        /// The step skipped to ([`DeletionStep::DeleteVm`] or [`DeletionStep::RemoveFinalizer`]).
        next: DeletionStep,
    },
    /// `Waiting for <kind> hooks [a, b]. <marker of the held step>`.
    HooksPending {
        /// The kind.
        kind: HookKind,
        /// The hook names.
        hooks: Vec<String>,
    },
    /// `Skipping drain as nodeName is not a valid one for machine. Initiate VM deletion` (reference): no node name.
    NoNodeName,
    /// `Node <node> not found, nothing to drain. Initiate VM deletion`.
    NodeNotFound {
        /// The node name.
        node: String,
    },
    /// `Drain in progress: <outcome>. Initiate node drain`.
    DrainInProgress {
        /// The drain's progress.
        outcome: DrainOutcome,
    },
    /// `Drain failed due to - <outcome>. Will retry in next sync. Initiate node drain` (reference).
    DrainFailed {
        /// What went wrong (a blocked drain names the pod and the PodDisruptionBudget).
        outcome: DrainOutcome,
    },
    /// `Drain successful (<outcome>). Initiate VM deletion` (reference, with the outcome added).
    Drained {
        /// How many pods went.
        outcome: DrainOutcome,
    },
    /// `Force Drain successful (<reason>; <outcome>). Delete Volume Attachments` (reference, with reason and outcome).
    ForceDrained {
        /// Why the drain was forced.
        reason: ForceReason,
        /// How many pods went.
        outcome: DrainOutcome,
    },
    /// `Drain failed due to - <outcome>. However, since it's a force deletion shall continue deletion of VM. Delete
    /// Volume Attachments` (reference).
    ForceDrainFailed {
        /// What went wrong.
        outcome: DrainOutcome,
    },
    /// `Deleting <n> VolumeAttachments of node <node>. Delete Volume Attachments`.
    VolumeAttachmentsDeleting {
        /// The node.
        node: String,
        /// How many were deleted in this pass.
        count: usize,
    },
    /// `Node Volumes for node: <node> are already detached. Moving to VM Deletion. Initiate VM deletion` (reference).
    VolumesDetached {
        /// The node.
        node: String,
    },
    /// `No Live VolumeAttachments for node: <node>. Moving to VM Deletion. Initiate VM deletion` (reference).
    NoLiveVolumeAttachments {
        /// The node.
        node: String,
    },
    /// `Skipping deleteNodeVolAttachments due to - node "<node>" not found. Moving to VM Deletion. Initiate VM
    /// deletion` (reference, with the API error text made plain).
    VolumeAttachmentsNodeGone {
        /// The node ("" when the machine names none).
        node: String,
    },
    /// `Deleting the VolumeAttachments of node <node> failed: <message>. Will retry in next sync. Delete Volume
    /// Attachments`.
    VolumeAttachmentsFailed {
        /// The node.
        node: String,
        /// The error.
        message: String,
    },
    /// `VM deletion was successful. Initiate node object deletion` (reference).
    VmDeleted,
    /// `VM not found. Continuing deletion flow. Initiate node object deletion` (reference).
    VmNotFound,
    /// `VM deletion failed due to - machine codes error: code = [..] message = [..]. However, will re-try in the next
    /// resync. Initiate VM deletion` (reference) for codes retried with back-off; `… Will retry when the machine, its
    /// class or its secret changes. Initiate VM deletion` for the others (the reference: `Aborting operation`).
    VmDeletionFailed {
        /// The machine code.
        code: MachineCode,
        /// The provider's message, redacted.
        message: String,
        /// Whether the code is retried with back-off (else: on a change).
        backoff: bool,
    },
    /// `Deletion of Node Object "<node>" is successful. Initiate machine object finalizer removal` (reference).
    NodeDeleted {
        /// The node.
        node: String,
    },
    /// `No node object found for "<node>", continuing deletion flow. Initiate machine object finalizer removal`
    /// (reference).
    NodeAlreadyGone {
        /// The node.
        node: String,
    },
    /// `Label "node" not present on machine "<machine>" or no associated node object found, continuing deletion
    /// flow. Initiate machine object finalizer removal` (reference).
    NoNodeLabel {
        /// The machine.
        machine: String,
    },
    /// `Deletion of Node Object "<node>" failed due to error: <message>. Initiate node object deletion` (reference).
    NodeDeletionFailed {
        /// The node.
        node: String,
        /// The error.
        message: String,
    },
    /// `Machine <machine> runs on node <node>, which runs this machine controller: it is neither drained nor deleted
    /// (spec 004). <marker of the held step>`.
    ControllerNode {
        /// The machine.
        machine: String,
        /// The node.
        node: String,
        /// The step held.
        at: DeletionStep,
    },
}

/// Go's `status.Error` text of a machine-code error, as the reference prints provider errors.
fn codes_error(code: MachineCode, message: &str) -> String {
    format!(
        "machine codes error: code = [{}] message = [{message}]",
        code.name()
    )
}

impl fmt::Display for DeletionDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_body(f)?;
        let marker = self.next_step().marker();
        match (self, marker.is_empty()) {
            (_, true) => Ok(()),
            // The reference's texts that are only the marker.
            (Self::Started | Self::VmFound, false) => f.write_str(marker),
            (_, false) => write!(f, " {marker}"),
        }
    }
}

impl DeletionDescription {
    /// The text before the marker.
    fn write_body(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Started | Self::VmFound => Ok(()),
            Self::VmStatusFailed { code, message } => write!(
                f,
                "Getting the VM status failed: {}. Will retry.",
                codes_error(*code, message)
            ),
            Self::VmStatusUnknown { code } => write!(
                f,
                "The provider answered {} for the VM status; the deletion goes on so that the provider can clean \
                 up what is left.",
                code.name()
            ),
            Self::NoTargetCluster { .. } => {
                f.write_str("No target cluster: there is no node to drain or delete.")
            }
            Self::HooksPending { kind, hooks } => {
                write!(f, "Waiting for {kind} hooks [{}].", hooks.join(", "))
            }
            Self::NoNodeName => f.write_str("Skipping drain as nodeName is not a valid one for machine."),
            Self::NodeNotFound { node } => write!(f, "Node {node} not found, nothing to drain."),
            Self::DrainInProgress { outcome } => write!(f, "Drain in progress: {outcome}."),
            Self::DrainFailed { outcome } => {
                write!(f, "Drain failed due to - {outcome}. Will retry in next sync.")
            }
            Self::Drained { outcome } => write!(f, "Drain successful ({outcome})."),
            Self::ForceDrained { reason, outcome } => {
                write!(f, "Force Drain successful ({reason}; {outcome}).")
            }
            Self::ForceDrainFailed { outcome } => write!(
                f,
                "Drain failed due to - {outcome}. However, since it's a force deletion shall continue deletion of VM."
            ),
            Self::VolumeAttachmentsDeleting { node, count } => {
                write!(f, "Deleting {count} VolumeAttachments of node {node}.")
            }
            Self::VolumesDetached { node } => write!(
                f,
                "Node Volumes for node: {node} are already detached. Moving to VM Deletion."
            ),
            Self::NoLiveVolumeAttachments { node } => {
                write!(
                    f,
                    "No Live VolumeAttachments for node: {node}. Moving to VM Deletion."
                )
            }
            Self::VolumeAttachmentsNodeGone { node } => write!(
                f,
                "Skipping deleteNodeVolAttachments due to - node \"{node}\" not found. Moving to VM Deletion."
            ),
            Self::VolumeAttachmentsFailed { node, message } => write!(
                f,
                "Deleting the VolumeAttachments of node {node} failed: {message}. Will retry in next sync."
            ),
            Self::VmDeleted => f.write_str("VM deletion was successful."),
            Self::VmNotFound => f.write_str("VM not found. Continuing deletion flow."),
            Self::VmDeletionFailed {
                code,
                message,
                backoff,
            } => {
                let then = if *backoff {
                    "However, will re-try in the next resync."
                } else {
                    "Will retry when the machine, its class or its secret changes."
                };
                write!(
                    f,
                    "VM deletion failed due to - {}. {then}",
                    codes_error(*code, message)
                )
            }
            Self::NodeDeleted { node } => write!(f, "Deletion of Node Object \"{node}\" is successful."),
            Self::NodeAlreadyGone { node } => {
                write!(
                    f,
                    "No node object found for \"{node}\", continuing deletion flow."
                )
            }
            Self::NoNodeLabel { machine } => write!(
                f,
                "Label \"{}\" not present on machine \"{machine}\" or no associated node object found, continuing \
                 deletion flow.",
                labels::NODE
            ),
            Self::NodeDeletionFailed { node, message } => {
                write!(
                    f,
                    "Deletion of Node Object \"{node}\" failed due to error: {message}."
                )
            }
            Self::ControllerNode { machine, node, .. } => write!(
                f,
                "Machine {machine} runs on node {node}, which runs this machine controller: it is neither drained \
                 nor deleted (spec 004)."
            ),
        }
    }

    /// The step this description persists: the one to do next (its text ends with that step's marker).
    pub fn next_step(&self) -> DeletionStep {
        use DeletionStep as S;
        match self {
            Self::Started | Self::VmStatusFailed { .. } => S::GetVmStatus,
            Self::VmFound
            | Self::VmStatusUnknown { .. }
            | Self::DrainInProgress { .. }
            | Self::DrainFailed { .. } => S::Drain,
            Self::NoTargetCluster { next } => *next,
            Self::HooksPending { kind, .. } => kind.step(),
            Self::ForceDrained { .. }
            | Self::ForceDrainFailed { .. }
            | Self::VolumeAttachmentsDeleting { .. }
            | Self::VolumeAttachmentsFailed { .. } => S::DeleteVolumeAttachments,
            Self::NoNodeName
            | Self::NodeNotFound { .. }
            | Self::Drained { .. }
            | Self::VolumesDetached { .. }
            | Self::NoLiveVolumeAttachments { .. }
            | Self::VolumeAttachmentsNodeGone { .. }
            | Self::VmDeletionFailed { .. } => S::DeleteVm,
            Self::VmDeleted | Self::VmNotFound | Self::NodeDeletionFailed { .. } => S::DeleteNode,
            Self::NodeDeleted { .. } | Self::NodeAlreadyGone { .. } | Self::NoNodeLabel { .. } => {
                S::RemoveFinalizer
            }
            Self::ControllerNode { at, .. } => *at,
        }
    }

    /// The `lastOperation.state`: Failed when a step failed (it is retried) or the deletion is refused, else
    /// Processing.
    pub fn state(&self) -> MachineState {
        match self {
            Self::VmStatusFailed { .. }
            | Self::DrainFailed { .. }
            | Self::VolumeAttachmentsFailed { .. }
            | Self::VmDeletionFailed { .. }
            | Self::NodeDeletionFailed { .. }
            | Self::ControllerNode { .. } => MachineState::Failed,
            _ => MachineState::Processing,
        }
    }

    /// Whether the write of this description may wait and be merged into the next status write of the pass (issue
    /// 26: fewer writes per machine): it records a step whose redo after a crash is harmless. Setting Terminating has
    /// no action; GetMachineStatus only reads; the node deletion counts NotFound as done. A crash before the merged
    /// write resumes at the last persisted step and redoes these steps, never a drain after the VM is gone (the
    /// drain's outcome is written before the VM deletion). The VM deletion's outcome is written, not deferred: the node
    /// finalizer, which holds a node a user deleted while the machine drains it, goes only once the persisted step
    /// is the node deletion.
    pub fn deferrable(&self) -> bool {
        matches!(
            self,
            Self::Started
                | Self::VmFound
                | Self::VmStatusUnknown { .. }
                | Self::NodeDeleted { .. }
                | Self::NodeAlreadyGone { .. }
        )
    }

    /// Whether this description is reported by an Event: the lifecycle steps a user reads in `kubectl describe
    /// machine` (deletion started, hooks, drain progress and end, VM deleted) and every failure. Not the VM status
    /// check (an internal step, followed at once by the drain) nor the node deletion (the machine itself is gone a
    /// moment later; a failure to delete the node is a Warning). The reference's machine controller records no
    /// Events at all; docs/machine-controller.md lists these.
    pub fn recorded(&self) -> bool {
        !matches!(
            self,
            Self::VmFound
                | Self::VmStatusUnknown { .. }
                | Self::NodeDeleted { .. }
                | Self::NodeAlreadyGone { .. }
                | Self::NoNodeLabel { .. }
        )
    }

    /// The reason of the Event that reports this description (Warning when [`DeletionDescription::state`] is Failed).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Started => "Terminating",
            Self::VmStatusFailed { .. } => "VmStatusFailed",
            Self::VmFound | Self::VmStatusUnknown { .. } => "VmStatusChecked",
            Self::NoTargetCluster { .. } | Self::NoNodeName | Self::NodeNotFound { .. } => "DrainSkipped",
            Self::HooksPending { .. } => "WaitingForHooks",
            Self::DrainInProgress { .. } => "Draining",
            Self::DrainFailed { .. } => "DrainFailed",
            Self::Drained { .. } | Self::ForceDrained { .. } => "Drained",
            Self::ForceDrainFailed { .. } => "ForceDrainFailed",
            Self::VolumeAttachmentsDeleting { .. } => "DeletingVolumeAttachments",
            Self::VolumesDetached { .. }
            | Self::NoLiveVolumeAttachments { .. }
            | Self::VolumeAttachmentsNodeGone { .. } => "VolumeAttachmentsDeleted",
            Self::VolumeAttachmentsFailed { .. } => "VolumeAttachmentDeletionFailed",
            Self::VmDeleted | Self::VmNotFound => "VmDeleted",
            Self::VmDeletionFailed { .. } => "VmDeletionFailed",
            Self::NodeDeleted { .. } | Self::NodeAlreadyGone { .. } | Self::NoNodeLabel { .. } => {
                "NodeDeleted"
            }
            Self::NodeDeletionFailed { .. } => "NodeDeletionFailed",
            Self::ControllerNode { .. } => "DeletionRefused",
        }
    }
}
