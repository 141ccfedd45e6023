//! The steps of the flow with their wire markers, and the lifecycle hooks that hold a step.
//!
//! Separate because the markers are the wire contract with the reference: written and read here only.

use std::fmt;

use mcm_api::{Machine, keys::extensions};

/// The reference's step markers (`machineutils`), in the order its decoder tries them.
pub(super) const GET_VM_STATUS: &str = "Set machine status to termination. Now, getting VM Status";
const INITIATE_DRAIN: &str = "Initiate node drain";
const DELETE_VOLUME_ATTACHMENTS: &str = "Delete Volume Attachments";
const INITIATE_VM_DELETION: &str = "Initiate VM deletion";
/// An older reference step (node finalizer removal), merged into node deletion in reference PR #1097.
const REMOVE_NODE_FINALIZERS: &str = "Remove node finalizers";
const INITIATE_NODE_DELETION: &str = "Initiate node object deletion";
const INITIATE_FINALIZER_REMOVAL: &str = "Initiate machine object finalizer removal";

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
    pub(super) const DECODE_ORDER: [(&'static str, Self); 7] = [
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
