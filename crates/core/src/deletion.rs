//! The machine deletion flow, one persisted step at a time (reference §3.5 `triggerDeletionFlow`; spec 004).
//!
//! Deletion is a sequence of [`DeletionStep`]s. The step to do next is persisted in the machine's
//! `status.lastOperation.description`, in the reference's wire form: every description of this flow ends with the
//! reference's marker of the next step (`… Initiate node drain`), so that a controller that crashed, or the reference
//! itself, resumes at that step. The markers are written and read here only ([`DeletionStep`]'s `Display` and
//! [`DeletionStep::parse`]); the whole descriptions are [`DeletionDescription`]s.
//!
//! The controller calls [`decide`] with what it observed; the [`DeletionPlan`] says which step it is at, what status to
//! write first ([`DeletionPlan::write`]: persisted before anything is done, so a crash repeats the step instead of
//! skipping it) and what to do ([`DeletionAction`]). After doing it, the controller calls [`after`] with the
//! [`StepOutcome`] and writes [`AfterStep::write`], which persists the next step. Every action is safe to repeat:
//! `GetMachineStatus`, the drain, VolumeAttachment deletion, `DeleteMachine` (`NotFound` counts as done), node
//! deletion (`NotFound` counts as done) and the finalizer removal.
//!
//! Added to the reference's flow: lifecycle hooks (Cluster API's, with this project's annotation prefixes) — a
//! `pre-drain.delete.hook.machine.sapcloud.io/<name>` annotation holds the machine before the drain and a
//! `pre-terminate.delete.hook.machine.sapcloud.io/<name>` one before the VM is deleted, until removed — and the
//! machine running the controller itself is never drained or deleted (spec 004). Both holds keep the marker of the step
//! held, so a reference-compatible reader sees the right next step.

use std::{fmt, time::Duration};

use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{Node, NodeCondition},
    apimachinery::pkg::apis::meta::v1::Time,
};
use mcm_api::{
    CurrentStatus, LastOperation, Machine, MachineOperationType, MachinePhase, MachineState,
    keys::{extensions, finalizers, labels},
};
use mcm_driver::{DeleteMachineResponse, DriverError, DriverMethod, GetMachineStatusResponse, MachineCode};

use crate::{
    descriptions::Redactor,
    drain::{self, DrainMode, DrainOutcome, ForceReason},
    retry_policy::{self, RetryClass, RetryDecision, RetrySettings},
    status::StatusUpdate,
    timeouts::{self, EffectiveSettings},
};

/// The reference's step markers (`machineutils`), in the order its decoder tries them.
const GET_VM_STATUS: &str = "Set machine status to termination. Now, getting VM Status";
const INITIATE_DRAIN: &str = "Initiate node drain";
const DELETE_VOLUME_ATTACHMENTS: &str = "Delete Volume Attachments";
const INITIATE_VM_DELETION: &str = "Initiate VM deletion";
/// An older reference step (node finalizer removal), merged into node deletion in reference PR #1097.
const REMOVE_NODE_FINALIZERS: &str = "Remove node finalizers";
const INITIATE_NODE_DELETION: &str = "Initiate node object deletion";
const INITIATE_FINALIZER_REMOVAL: &str = "Initiate machine object finalizer removal";

/// How often the VolumeAttachment step looks again while attachments are being deleted (the reference's 5s).
pub const VOLUME_POLL_INTERVAL: Duration = Duration::from_secs(5);

/// A step of the deletion flow, in order. `Display` writes its wire marker (empty for [`DeletionStep::SetTerminating`]:
/// the flow starts wherever no marker is found); [`DeletionStep::parse`] reads the step from a description.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeletionStep {
    /// Set phase Terminating (reference step 1). No marker.
    SetTerminating,
    /// Ask the provider for the VM (`GetMachineStatus`) and make sure the machine records its node.
    /// Marker `Set machine status to termination. Now, getting VM Status`.
    GetVmStatus,
    /// Wait for pre-drain hooks, then cordon and drain the node. Marker `Initiate node drain`.
    Drain,
    /// After a force drain: delete the node's VolumeAttachments. Marker `Delete Volume Attachments`.
    DeleteVolumeAttachments,
    /// Wait for pre-terminate hooks, then `DeleteMachine`. Marker `Initiate VM deletion`.
    DeleteVm,
    /// Remove the node's finalizer and delete the node. Marker `Initiate node object deletion` (also read from the
    /// older `Remove node finalizers`).
    DeleteNode,
    /// Remove the machine's finalizer. Marker `Initiate machine object finalizer removal`.
    RemoveFinalizer,
}

impl DeletionStep {
    /// Every step, in order.
    pub const ALL: [Self; 7] = [
        Self::SetTerminating,
        Self::GetVmStatus,
        Self::Drain,
        Self::DeleteVolumeAttachments,
        Self::DeleteVm,
        Self::DeleteNode,
        Self::RemoveFinalizer,
    ];

    /// The reference's markers and the steps they name, in the order the reference's decoder tries them.
    const DECODE_ORDER: [(&'static str, Self); 7] = [
        (GET_VM_STATUS, Self::GetVmStatus),
        (INITIATE_DRAIN, Self::Drain),
        (DELETE_VOLUME_ATTACHMENTS, Self::DeleteVolumeAttachments),
        (INITIATE_VM_DELETION, Self::DeleteVm),
        (REMOVE_NODE_FINALIZERS, Self::DeleteNode),
        (INITIATE_NODE_DELETION, Self::DeleteNode),
        (INITIATE_FINALIZER_REMOVAL, Self::RemoveFinalizer),
    ];

    /// The wire marker ("" for [`DeletionStep::SetTerminating`]).
    pub fn marker(self) -> &'static str {
        match self {
            Self::SetTerminating => "",
            Self::GetVmStatus => GET_VM_STATUS,
            Self::Drain => INITIATE_DRAIN,
            Self::DeleteVolumeAttachments => DELETE_VOLUME_ATTACHMENTS,
            Self::DeleteVm => INITIATE_VM_DELETION,
            Self::DeleteNode => INITIATE_NODE_DELETION,
            Self::RemoveFinalizer => INITIATE_FINALIZER_REMOVAL,
        }
    }

    /// A short name for logs and events (`SetTerminating`, `Drain`, …).
    pub fn name(self) -> &'static str {
        match self {
            Self::SetTerminating => "SetTerminating",
            Self::GetVmStatus => "GetVmStatus",
            Self::Drain => "Drain",
            Self::DeleteVolumeAttachments => "DeleteVolumeAttachments",
            Self::DeleteVm => "DeleteVm",
            Self::DeleteNode => "DeleteNode",
            Self::RemoveFinalizer => "RemoveFinalizer",
        }
    }

    /// The step a description names. Every description of this flow, and every one the reference writes, ends with
    /// the marker of its next step, so the marker the text ends with decides; a text that ends with none is decoded
    /// by the reference's rule (the first marker, in the reference's order, the text contains); a text with no marker
    /// restarts the flow at [`DeletionStep::SetTerminating`] (reference: "Unable to decode deletion flow state …
    /// Re-initiate termination"). Reading the end first means a message that quotes a marker cannot mislead.
    pub fn parse(description: &str) -> Self {
        let text = description.trim_end();
        Self::DECODE_ORDER
            .iter()
            .find(|(marker, _)| text.ends_with(marker))
            .or_else(|| {
                Self::DECODE_ORDER
                    .iter()
                    .find(|(marker, _)| text.contains(marker))
            })
            .map_or(Self::SetTerminating, |(_, step)| *step)
    }
}

impl fmt::Display for DeletionStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.marker())
    }
}

/// A lifecycle hook kind: annotations with its prefix hold the deletion until they are removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookKind {
    /// `pre-drain.delete.hook.machine.sapcloud.io/<name>`: held before the drain.
    PreDrain,
    /// `pre-terminate.delete.hook.machine.sapcloud.io/<name>`: held before the VM is deleted.
    PreTerminate,
}

impl HookKind {
    /// The annotation prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            Self::PreDrain => extensions::PRE_DRAIN_HOOK_PREFIX,
            Self::PreTerminate => extensions::PRE_TERMINATE_HOOK_PREFIX,
        }
    }

    /// The step the hooks hold.
    pub fn step(self) -> DeletionStep {
        match self {
            Self::PreDrain => DeletionStep::Drain,
            Self::PreTerminate => DeletionStep::DeleteVm,
        }
    }
}

impl fmt::Display for HookKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::PreDrain => "pre-drain",
            Self::PreTerminate => "pre-terminate",
        })
    }
}

/// The hooks of `kind` on the machine: the names after the prefix of its annotations, sorted (any value; an
/// annotation is a hook as long as it is there).
pub fn hooks(machine: &Machine, kind: HookKind) -> Vec<String> {
    machine
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter_map(|(key, _)| key.strip_prefix(kind.prefix()))
        .map(str::to_owned)
        .collect()
}

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

/// What the deletion decision needs.
#[derive(Clone, Copy, Debug)]
pub struct DeletionInput<'a> {
    /// The machine, as the cache holds it.
    pub machine: &'a Machine,
    /// The machine's node from the cache: the node named by the machine's `node` label, else the node whose label
    /// `node.gardener.cloud/machine-name` names the machine; `None` when there is none.
    pub node: Option<&'a Node>,
    /// Whether there is a target cluster (`--target-kubeconfig` not `none`).
    pub has_target_cluster: bool,
    /// Now.
    pub now: Timestamp,
    /// The machine's effective settings (drain timeout, evict retries, volume timeouts, …).
    pub settings: &'a EffectiveSettings,
    /// The retry policy (back-off of failed steps).
    pub retry: &'a RetrySettings,
    /// The name of the node the controller itself runs on, if known (spec 004: its machine is never drained or
    /// deleted).
    pub controller_node: Option<&'a str>,
    /// Consecutive failures of this machine's deletion steps, this one included when the outcome is a failure.
    pub failures: u32,
    /// A random number in `[0, 1)` for the back-off's jitter.
    pub random: f64,
    /// Removes the class secret's values from provider messages.
    pub redactor: &'a Redactor,
}

/// A status to write, with the description it writes (for the Event).
#[derive(Clone, Debug, PartialEq)]
pub struct DeletionWrite {
    /// The description written.
    pub description: DeletionDescription,
    /// The status update (write it when [`StatusUpdate::changes`] says so).
    pub status: StatusUpdate,
}

/// Why the deletion is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Lifecycle hooks are present; the deletion goes on when they are all removed (a change of the machine).
    Hooks {
        /// The kind.
        kind: HookKind,
        /// The hook names.
        hooks: Vec<String>,
    },
    /// The machine runs the controller itself (spec 004).
    ControllerNode {
        /// The node.
        node: String,
    },
}

/// What the controller does for the current step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeletionAction {
    /// The machine is not being deleted, or does not carry this controller's finalizer: nothing to do.
    Nothing,
    /// Do nothing now: the deletion waits (for a change of the machine, or the safety resync).
    Hold(Hold),
    /// Call `GetMachineStatus`; report [`StepOutcome::GetVmStatus`].
    GetVmStatus,
    /// Cordon and drain `node` in `mode` (see [`crate::drain`]); report [`StepOutcome::Drain`] with `mode.force`.
    Drain {
        /// The node.
        node: String,
        /// How to drain.
        mode: DrainMode,
    },
    /// Delete the live VolumeAttachments of `node` ([`drain::live_volume_attachments`]); report
    /// [`StepOutcome::VolumeAttachments`].
    DeleteVolumeAttachments {
        /// The node.
        node: String,
    },
    /// Call `DeleteMachine`; report [`StepOutcome::DeleteVm`].
    DeleteVm,
    /// Remove the node finalizer `node.machine.sapcloud.io/machine-controller` from `node` and delete it; report
    /// [`StepOutcome::DeleteNode`].
    DeleteNode {
        /// The node.
        node: String,
    },
    /// Remove the finalizer `machine.sapcloud.io/machine-controller-manager` from the machine; report
    /// [`StepOutcome::RemoveFinalizer`].
    RemoveFinalizer,
}

/// The plan of one pass of the deletion flow: write [`DeletionPlan::write`] (if any, and if it changes something),
/// then do [`DeletionPlan::action`].
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub struct DeletionPlan {
    /// The step the action belongs to.
    pub step: DeletionStep,
    /// What to do.
    pub action: DeletionAction,
    /// The status to write before the action: it persists the step (phase Terminating at the start, a skipped step,
    /// a hold).
    pub write: Option<DeletionWrite>,
    /// For holds: when to look again at the latest (the safety resync); `None` otherwise.
    pub requeue_after: Option<Duration>,
}

/// What the action of a plan came to.
#[derive(Clone, Debug, PartialEq)]
pub enum StepOutcome {
    /// `GetMachineStatus` answered.
    GetVmStatus(Result<GetMachineStatusResponse, DriverError>),
    /// The drain (or this pass of it) ended.
    Drain {
        /// The plan's `mode.force`.
        force: Option<ForceReason>,
        /// How it went.
        outcome: DrainOutcome,
    },
    /// The VolumeAttachment step: `Ok(n)` with the number of live attachments found (and deleted); 0 means none was
    /// left.
    VolumeAttachments(Result<usize, String>),
    /// `DeleteMachine` answered.
    DeleteVm(Result<DeleteMachineResponse, DriverError>),
    /// The node deletion.
    DeleteNode(NodeDeletion),
    /// The finalizer removal.
    RemoveFinalizer(Result<(), String>),
}

/// How a node deletion went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeDeletion {
    /// Deleted.
    Deleted,
    /// There was no such node (404): counts as deleted.
    NotFound,
    /// The API call failed.
    Failed(String),
}

/// What follows an action.
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub struct AfterStep {
    /// Set the machine's `node` label to this first (a metadata patch), when it lacks one.
    pub node_label: Option<String>,
    /// The status to write: it persists [`AfterStep::next`].
    pub write: Option<DeletionWrite>,
    /// The step to do next; `None` when the flow is over (the finalizer is gone).
    pub next: Option<DeletionStep>,
    /// When to look again: `Some(ZERO)` at once, `Some(d)` after `d`, `None` no more.
    pub requeue_after: Option<Duration>,
    /// For a failed provider call, the retry policy's decision (Y codes back off, N codes wait for a change).
    pub retry: Option<RetryDecision>,
}

/// Whether the machine carries this controller's finalizer.
pub fn has_finalizer(machine: &Machine) -> bool {
    machine
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == finalizers::MACHINE_CONTROLLER_MANAGER)
}

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

fn machine_name(machine: &Machine) -> String {
    machine.metadata.name.clone().unwrap_or_default()
}

/// The machine's node name: its `node` label, else the name of the node found for it.
fn node_name(input: &DeletionInput<'_>) -> Option<String> {
    input
        .machine
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::NODE))
        .filter(|n| !n.is_empty())
        .cloned()
        .or_else(|| input.node.and_then(|n| n.metadata.name.clone()))
        .filter(|n| !n.is_empty())
}

/// The node conditions the force rules read: the node's, else the machine's copy.
fn conditions<'a>(input: &DeletionInput<'a>) -> &'a [NodeCondition] {
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
fn write(input: &DeletionInput<'_>, description: DeletionDescription) -> DeletionWrite {
    DeletionWrite {
        status: StatusUpdate {
            last_operation: Some(operation(&description, input.now)),
            ..StatusUpdate::default()
        },
        description,
    }
}

/// The first write: phase Terminating (its time kept if it already was), `preserveExpiryTime` cleared, lastOperation
/// `Delete/Processing "Set machine status to termination. Now, getting VM Status"` (reference step 1).
fn terminating(input: &DeletionInput<'_>) -> DeletionWrite {
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

/// `next` written over `previous`: a later write replaces an earlier one, but keeps the phase the earlier one set.
fn merge(previous: Option<DeletionWrite>, mut next: DeletionWrite) -> DeletionWrite {
    if let Some(previous) = previous
        && next.status.current_status.is_none()
    {
        next.status.current_status = previous.status.current_status;
    }
    next
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
    if machine.metadata.deletion_timestamp.is_none() || !has_finalizer(machine) {
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
    let labelled = input
        .machine
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::NODE))
        .is_some_and(|n| !n.is_empty());
    if labelled {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{
        api::core::v1::{AttachedVolume, NodeStatus},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };
    use mcm_api::MachineStatus;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    use super::*;
    use crate::{
        drain::{Blocker, PodRef},
        timeouts::{ControllerSettings, effective_settings},
    };

    const DELETED: i64 = 1_000_000;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    /// A Running machine `m-1` on `node-1`, deleted at `DELETED`, with our finalizer.
    fn machine() -> Machine {
        let mut m = Machine {
            metadata: ObjectMeta {
                name: Some("m-1".into()),
                namespace: Some("default".into()),
                deletion_timestamp: Some(Time(at(DELETED))),
                finalizers: Some(vec![finalizers::MACHINE_CONTROLLER_MANAGER.into()]),
                labels: Some(BTreeMap::from([(labels::NODE.into(), "node-1".into())])),
                ..ObjectMeta::default()
            },
            ..Machine::default()
        };
        let mut status = MachineStatus::default();
        status.current_status.phase = Some(MachinePhase::Running);
        status.current_status.last_update_time = Some(Time(at(10)));
        status.current_status.preserve_expiry_time = Some(Time(at(20)));
        status.last_operation.description = "Machine m-1 successfully joined the cluster in 1m0s".into();
        status.last_operation.error_code = "ResourceExhausted".into();
        m.status = Some(status);
        m
    }

    /// `m` in phase Terminating (since `DELETED`) with `description`.
    fn at_step(mut m: Machine, description: &str) -> Machine {
        let status = m.status.get_or_insert_with(MachineStatus::default);
        status.current_status.phase = Some(MachinePhase::Terminating);
        status.current_status.last_update_time = Some(Time(at(DELETED)));
        status.current_status.preserve_expiry_time = None;
        status.last_operation.description = description.into();
        m
    }

    fn annotated(mut m: Machine, key: &str) -> Machine {
        m.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), String::new());
        m
    }

    fn unlabelled(mut m: Machine) -> Machine {
        m.metadata.labels = None;
        m
    }

    fn node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(at(0))),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    fn not_ready(mut n: Node, since: i64) -> Node {
        n.status.as_mut().unwrap().conditions = Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "Unknown".into(),
            last_transition_time: Some(Time(at(since))),
            ..NodeCondition::default()
        }]);
        n
    }

    fn with_volumes(mut n: Node) -> Node {
        n.status.as_mut().unwrap().volumes_attached = Some(vec![AttachedVolume {
            name: "kubernetes.io/csi/ebs^vol-1".into(),
            device_path: String::new(),
        }]);
        n
    }

    struct Fixture {
        settings: EffectiveSettings,
        retry: RetrySettings,
        redactor: Redactor,
        target: bool,
        controller_node: Option<&'static str>,
        failures: u32,
    }

    impl Fixture {
        fn new() -> Self {
            Self {
                settings: effective_settings(&Machine::default(), &ControllerSettings::default()),
                retry: RetrySettings::default(),
                redactor: Redactor::new(),
                target: true,
                controller_node: None,
                failures: 1,
            }
        }

        fn input<'a>(&'a self, machine: &'a Machine, node: Option<&'a Node>, now: i64) -> DeletionInput<'a> {
            DeletionInput {
                machine,
                node,
                has_target_cluster: self.target,
                now: at(now),
                settings: &self.settings,
                retry: &self.retry,
                controller_node: self.controller_node,
                failures: self.failures,
                random: 0.0,
                redactor: &self.redactor,
            }
        }
    }

    fn err(code: MachineCode) -> DriverError {
        DriverError::new(code, "boom")
    }

    fn text(write: Option<&DeletionWrite>) -> String {
        write
            .unwrap()
            .status
            .last_operation
            .as_ref()
            .unwrap()
            .description
            .clone()
    }

    fn state(write: Option<&DeletionWrite>) -> MachineState {
        write
            .unwrap()
            .status
            .last_operation
            .as_ref()
            .unwrap()
            .state
            .unwrap()
    }

    // --- Wire markers --------------------------------------------------------------------------------------------

    #[test]
    fn every_step_round_trips_through_its_marker() {
        for step in DeletionStep::ALL {
            assert_eq!(DeletionStep::parse(&step.to_string()), step, "{}", step.name());
        }
        assert_eq!(DeletionStep::SetTerminating.to_string(), "");
    }

    #[test]
    fn descriptions_written_by_the_reference_are_read_as_the_reference_reads_them() {
        // Reference §3.5: the next step is decoded by substring match on lastOperation.description.
        let cases = [
            (
                "Set machine status to termination. Now, getting VM Status",
                DeletionStep::GetVmStatus,
            ),
            (
                "Error occurred with decoding machine error status while getting VM status, aborting with retry. \
                 Set machine status to termination. Now, getting VM Status",
                DeletionStep::GetVmStatus,
            ),
            ("Initiate node drain", DeletionStep::Drain),
            (
                "Drain failed due to - error when evicting pods. Will retry in next sync. Initiate node drain",
                DeletionStep::Drain,
            ),
            (
                "Force Drain successful. Delete Volume Attachments",
                DeletionStep::DeleteVolumeAttachments,
            ),
            (
                "Drain failed due to - x. However, since it's a force deletion shall continue deletion of VM. Delete \
                 Volume Attachments",
                DeletionStep::DeleteVolumeAttachments,
            ),
            ("Drain successful. Initiate VM deletion", DeletionStep::DeleteVm),
            (
                "Skipping drain as nodeName is not a valid one for machine. Initiate VM deletion",
                DeletionStep::DeleteVm,
            ),
            (
                "No Live VolumeAttachments for node: n. Moving to VM Deletion. Initiate VM deletion",
                DeletionStep::DeleteVm,
            ),
            (
                "VM deletion was successful. Initiate node object deletion",
                DeletionStep::DeleteNode,
            ),
            (
                "VM not found. Continuing deletion flow. Initiate node object deletion",
                DeletionStep::DeleteNode,
            ),
            (
                "VM was not found at provider. Initiate node object deletion",
                DeletionStep::DeleteNode,
            ),
            (
                "VM deletion was successful. Remove node finalizers",
                DeletionStep::DeleteNode,
            ),
            (
                "Deletion of Node Object \"n\" is successful. Initiate machine object finalizer removal",
                DeletionStep::RemoveFinalizer,
            ),
            // Not ending with a marker: the reference's substring rule.
            ("Initiate node drain (by hand)", DeletionStep::Drain),
            // Unknown text: restart at the first step.
            ("Creating machine on cloud provider", DeletionStep::SetTerminating),
            ("", DeletionStep::SetTerminating),
        ];
        for (text, step) in cases {
            assert_eq!(DeletionStep::parse(text), step, "{text}");
        }
    }

    #[test]
    fn a_message_quoting_a_marker_does_not_mislead() {
        // The reference would read "Initiate node drain" first (its order); the text ends with the VM deletion marker.
        let description = DeletionDescription::VmDeletionFailed {
            code: MachineCode::Unavailable,
            message: "Initiate node drain".into(),
            backoff: true,
        };
        assert_eq!(
            DeletionStep::parse(&description.to_string()),
            DeletionStep::DeleteVm
        );
    }

    #[test]
    fn reference_texts_are_written_word_for_word() {
        let cases = [
            (
                DeletionDescription::Started,
                "Set machine status to termination. Now, getting VM Status",
            ),
            (DeletionDescription::VmFound, "Initiate node drain"),
            (
                DeletionDescription::NoNodeName,
                "Skipping drain as nodeName is not a valid one for machine. Initiate VM deletion",
            ),
            (
                DeletionDescription::VmDeleted,
                "VM deletion was successful. Initiate node object deletion",
            ),
            (
                DeletionDescription::VmNotFound,
                "VM not found. Continuing deletion flow. Initiate node object deletion",
            ),
            (
                DeletionDescription::NodeDeleted { node: "n".into() },
                "Deletion of Node Object \"n\" is successful. Initiate machine object finalizer removal",
            ),
            (
                DeletionDescription::NodeAlreadyGone { node: "n".into() },
                "No node object found for \"n\", continuing deletion flow. Initiate machine object finalizer removal",
            ),
            (
                DeletionDescription::VolumesDetached { node: "n".into() },
                "Node Volumes for node: n are already detached. Moving to VM Deletion. Initiate VM deletion",
            ),
            (
                DeletionDescription::ForceDrainFailed {
                    outcome: DrainOutcome::Failed { message: "x".into() },
                },
                "Drain failed due to - x. However, since it's a force deletion shall continue deletion of VM. \
                 Delete Volume Attachments",
            ),
            (
                DeletionDescription::VmDeletionFailed {
                    code: MachineCode::Unavailable,
                    message: "m".into(),
                    backoff: true,
                },
                "VM deletion failed due to - machine codes error: code = [Unavailable] message = [m]. However, will \
                 re-try in the next resync. Initiate VM deletion",
            ),
            (
                DeletionDescription::HooksPending {
                    kind: HookKind::PreDrain,
                    hooks: vec!["a".into(), "b".into()],
                },
                "Waiting for pre-drain hooks [a, b]. Initiate node drain",
            ),
            (
                DeletionDescription::HooksPending {
                    kind: HookKind::PreTerminate,
                    hooks: vec!["backup".into()],
                },
                "Waiting for pre-terminate hooks [backup]. Initiate VM deletion",
            ),
        ];
        for (description, expected) in cases {
            assert_eq!(description.to_string(), expected);
        }
    }

    fn step_strategy() -> impl Strategy<Value = DeletionStep> {
        proptest::sample::select(DeletionStep::ALL.to_vec())
    }

    /// Free text, sometimes quoting a marker.
    fn message_strategy() -> impl Strategy<Value = String> {
        let markers: Vec<String> = DeletionStep::DECODE_ORDER
            .iter()
            .map(|(m, _)| (*m).to_owned())
            .collect();
        prop_oneof![
            any::<String>(),
            (any::<String>(), proptest::sample::select(markers)).prop_map(|(a, m)| format!("{a}{m}")),
        ]
    }

    fn outcome_strategy() -> impl Strategy<Value = DrainOutcome> {
        let pod = ("[a-z0-9-]{1,10}", "[a-z0-9-]{1,10}").prop_map(|(namespace, name)| PodRef {
            namespace,
            name,
            uid: String::new(),
        });
        let blocker = (pod, proptest::option::of("[a-z0-9-]{1,10}"), any::<bool>()).prop_map(
            |(pod, pdb, misconfigured)| Blocker {
                pod,
                pdb,
                misconfigured,
            },
        );
        prop_oneof![
            (0usize..5, 0usize..5).prop_map(|(evicted, deleted)| DrainOutcome::Drained { evicted, deleted }),
            (0usize..5, proptest::option::of(blocker.clone()))
                .prop_map(|(remaining, blocked)| DrainOutcome::InProgress { remaining, blocked }),
            blocker.prop_map(DrainOutcome::Blocked),
            (0u64..10_000, 0usize..5).prop_map(|(s, remaining)| DrainOutcome::TimedOut {
                timeout: Duration::from_secs(s),
                remaining
            }),
            message_strategy().prop_map(|message| DrainOutcome::Failed { message }),
        ]
    }

    fn description_strategy() -> impl Strategy<Value = DeletionDescription> {
        use DeletionDescription as D;
        let name = "[a-z0-9][a-z0-9.-]{0,20}";
        let code = (0u32..18).prop_map(|n| MachineCode::from_number(n).unwrap());
        let reason = prop_oneof![
            Just(ForceReason::Label { value: "True".into() }),
            Just(ForceReason::DrainTimeout {
                timeout: Duration::from_hours(2)
            }),
            Just(ForceReason::NodeNotReady {
                after: Duration::from_mins(5)
            }),
        ];
        let kind = prop_oneof![Just(HookKind::PreDrain), Just(HookKind::PreTerminate)];
        prop_oneof![
            Just(D::Started),
            Just(D::VmFound),
            Just(D::NoNodeName),
            Just(D::VmDeleted),
            Just(D::VmNotFound),
            (code.clone(), message_strategy())
                .prop_map(|(code, message)| D::VmStatusFailed { code, message }),
            code.clone().prop_map(|code| D::VmStatusUnknown { code }),
            prop_oneof![Just(DeletionStep::DeleteVm), Just(DeletionStep::RemoveFinalizer)]
                .prop_map(|next| D::NoTargetCluster { next }),
            (kind, proptest::collection::vec("[a-z0-9][a-z0-9._-]{0,10}", 1..4))
                .prop_map(|(kind, hooks)| D::HooksPending { kind, hooks }),
            name.prop_map(|node| D::NodeNotFound { node }),
            outcome_strategy().prop_map(|outcome| D::DrainInProgress { outcome }),
            outcome_strategy().prop_map(|outcome| D::DrainFailed { outcome }),
            outcome_strategy().prop_map(|outcome| D::Drained { outcome }),
            (reason, outcome_strategy()).prop_map(|(reason, outcome)| D::ForceDrained { reason, outcome }),
            outcome_strategy().prop_map(|outcome| D::ForceDrainFailed { outcome }),
            (name, 0usize..9).prop_map(|(node, count)| D::VolumeAttachmentsDeleting { node, count }),
            name.prop_map(|node| D::VolumesDetached { node }),
            name.prop_map(|node| D::NoLiveVolumeAttachments { node }),
            name.prop_map(|node| D::VolumeAttachmentsNodeGone { node }),
            (name, message_strategy())
                .prop_map(|(node, message)| D::VolumeAttachmentsFailed { node, message }),
            (code, message_strategy(), any::<bool>()).prop_map(|(code, message, backoff)| {
                D::VmDeletionFailed {
                    code,
                    message,
                    backoff,
                }
            }),
            name.prop_map(|node| D::NodeDeleted { node }),
            name.prop_map(|node| D::NodeAlreadyGone { node }),
            name.prop_map(|machine| D::NoNodeLabel { machine }),
            (name, message_strategy()).prop_map(|(node, message)| D::NodeDeletionFailed { node, message }),
            (name, name, step_strategy()).prop_map(|(machine, node, at)| D::ControllerNode {
                machine,
                node,
                at
            }),
        ]
    }

    proptest! {
        #[test]
        fn every_description_names_its_next_step(description in description_strategy()) {
            // The persisted step is read back from the written text, whatever the messages inside say.
            let text = description.to_string();
            prop_assert_eq!(DeletionStep::parse(&text), description.next_step(), "{}", text);
        }

        #[test]
        fn parse_never_panics(text in any::<String>()) {
            let _ = DeletionStep::parse(&text);
        }

        #[test]
        fn a_text_without_a_marker_restarts(text in "[a-z ,.]{0,60}") {
            prop_assert_eq!(DeletionStep::parse(&text), DeletionStep::SetTerminating);
        }
    }

    // --- decide ---------------------------------------------------------------------------------------------------

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
            text(denied.write.as_ref()).ends_with(
                "Will retry when the machine, its class or its secret changes. Initiate VM deletion"
            )
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

    // --- The whole flow, with crashes ------------------------------------------------------------------------------

    /// A simulated world: the VM, the node, and counters.
    #[derive(Debug)]
    struct World {
        vm: bool,
        node: Option<Node>,
        vm_deletions: usize,
        drains_after_vm_deletion: usize,
        force: bool,
    }

    /// Performs `action` in the world and reports its outcome.
    fn act(world: &mut World, action: &DeletionAction) -> Option<StepOutcome> {
        Some(match action {
            DeletionAction::Nothing | DeletionAction::Hold(_) => return None,
            DeletionAction::GetVmStatus => StepOutcome::GetVmStatus(if world.vm {
                Ok(GetMachineStatusResponse::default())
            } else {
                Err(err(MachineCode::NotFound))
            }),
            DeletionAction::Drain { mode, .. } => {
                if !world.vm {
                    world.drains_after_vm_deletion += 1;
                }
                StepOutcome::Drain {
                    force: mode.force.clone(),
                    outcome: DrainOutcome::Drained {
                        evicted: 1,
                        deleted: 0,
                    },
                }
            }
            DeletionAction::DeleteVolumeAttachments { .. } => {
                if let Some(status) = world.node.as_mut().and_then(|n| n.status.as_mut()) {
                    status.volumes_attached = None;
                }
                StepOutcome::VolumeAttachments(Ok(1))
            }
            DeletionAction::DeleteVm => {
                if world.vm {
                    world.vm = false;
                    world.vm_deletions += 1;
                    StepOutcome::DeleteVm(Ok(DeleteMachineResponse::default()))
                } else {
                    StepOutcome::DeleteVm(Err(err(MachineCode::NotFound)))
                }
            }
            DeletionAction::DeleteNode { .. } => StepOutcome::DeleteNode(if world.node.take().is_some() {
                NodeDeletion::Deleted
            } else {
                NodeDeletion::NotFound
            }),
            DeletionAction::RemoveFinalizer => StepOutcome::RemoveFinalizer(Ok(())),
        })
    }

    fn apply(machine: &mut Machine, write: Option<&DeletionWrite>) {
        if let Some(write) = write {
            write
                .status
                .apply(machine.status.get_or_insert_with(MachineStatus::default));
        }
    }

    /// Runs the flow to its end; `crashes[i]` says where pass `i` is cut short (0: not at all, 1: before the plan's
    /// write, 2: before the action, 3: before the write after it). Returns the steps whose actions ran, in order.
    fn run(f: &Fixture, world: &mut World, crashes: &[u8]) -> Vec<DeletionStep> {
        let mut m = machine();
        if world.force {
            m.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert(labels::FORCE_DELETION.into(), "true".into());
        }
        let mut acted = Vec::new();
        for pass in 0..100 {
            let crash = crashes.get(pass).copied().unwrap_or(0);
            let input = f.input(&m, world.node.as_ref(), DELETED + i64::try_from(pass).unwrap());
            let plan = decide(&input);
            if plan.action == DeletionAction::Nothing {
                return acted;
            }
            if crash == 1 {
                continue;
            }
            let mut next = m.clone();
            apply(&mut next, plan.write.as_ref());
            if crash == 2 {
                m = next;
                continue;
            }
            let outcome = act(world, &plan.action).expect("no holds here");
            acted.push(plan.step);
            if crash == 3 {
                m = next;
                continue;
            }
            let input = f.input(&next, world.node.as_ref(), DELETED + i64::try_from(pass).unwrap());
            let done = after(&input, &outcome);
            apply(&mut next, done.write.as_ref());
            if done.next.is_none() {
                next.metadata.finalizers = Some(vec![]);
            }
            m = next;
        }
        panic!("the flow did not end: {acted:?}");
    }

    fn world(force: bool) -> World {
        World {
            vm: true,
            node: Some(with_volumes(node("node-1"))),
            vm_deletions: 0,
            drains_after_vm_deletion: 0,
            force,
        }
    }

    #[test]
    fn the_whole_flow_runs_each_step_once() {
        use DeletionStep as S;
        let f = Fixture::new();
        let mut w = world(false);
        assert_eq!(
            run(&f, &mut w, &[]),
            [
                S::GetVmStatus,
                S::Drain,
                S::DeleteVm,
                S::DeleteNode,
                S::RemoveFinalizer
            ]
        );
        assert_eq!(w.vm_deletions, 1);
        assert!(w.node.is_none());

        // A force drain goes through the VolumeAttachments (the attachment is deleted once, then none is live).
        let mut w = world(true);
        assert_eq!(
            run(&f, &mut w, &[]),
            [
                S::GetVmStatus,
                S::Drain,
                S::DeleteVolumeAttachments,
                S::DeleteVm,
                S::DeleteNode,
                S::RemoveFinalizer
            ]
        );

        // Without a target cluster: no drain, no node.
        let mut f = Fixture::new();
        f.target = false;
        let mut w = world(false);
        w.node = None;
        assert_eq!(
            run(&f, &mut w, &[]),
            [S::GetVmStatus, S::DeleteVm, S::RemoveFinalizer]
        );
    }

    proptest! {
        #[test]
        fn a_crash_anywhere_resumes_at_its_step_and_deletes_the_vm_once(
            crashes in proptest::collection::vec(0u8..4, 0..25),
            force in any::<bool>(),
        ) {
            let f = Fixture::new();
            let mut w = world(force);
            let acted = run(&f, &mut w, &crashes);
            // The VM is deleted exactly once; repeated DeleteMachine calls find it gone (NotFound counts as done).
            prop_assert_eq!(w.vm_deletions, 1);
            prop_assert!(!w.vm);
            prop_assert!(w.node.is_none(), "the node is deleted");
            prop_assert_eq!(w.drains_after_vm_deletion, 0, "never a drain after the VM is gone");
            // Steps only move forward: a crash repeats the step it was in, never an earlier one.
            prop_assert!(acted.windows(2).all(|p| p[0] <= p[1]), "{:?}", acted);
            prop_assert_eq!(acted.last().copied(), Some(DeletionStep::RemoveFinalizer));
        }
    }
}
