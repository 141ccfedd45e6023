//! What the deletion decisions take and return: the input, the plan and its action, a step's outcome, the next write.
//!
//! Separate so that [`decide`](fn@super::decide) and [`after`](fn@super::after) share one vocabulary.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use mcm_api::Machine;
use mcm_driver::{DeleteMachineResponse, DriverError, GetMachineStatusResponse};

use super::{
    description::DeletionDescription,
    steps::{DeletionStep, HookKind},
};
use crate::{
    descriptions::Redactor,
    drain::{DrainMode, DrainOutcome, ForceReason},
    retry_policy::{RetryDecision, RetrySettings},
    status::StatusUpdate,
    timeouts::EffectiveSettings,
};

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
    /// The write may wait for the next one of the pass and go with it ([`DeletionWrite::then`]); see
    /// [`DeletionDescription::deferrable`]. A waiting write is written before the pass ends, unless the flow is over.
    pub deferrable: bool,
}

impl DeletionWrite {
    /// `next` written over this one: a later write replaces an earlier one, but keeps the phase and the
    /// lastKnownState the earlier one set; the result may wait only if `next` may (this one waited already).
    #[must_use]
    pub fn then(self, mut next: Self) -> Self {
        if next.status.current_status.is_none() {
            next.status.current_status = self.status.current_status;
        }
        if next.status.last_known_state.is_none() {
            next.status.last_known_state = self.status.last_known_state;
        }
        next
    }
}

/// `next` after a waiting write, if any (see [`DeletionWrite::then`]).
pub fn merge_writes(previous: Option<DeletionWrite>, next: Option<DeletionWrite>) -> Option<DeletionWrite> {
    match (previous, next) {
        (Some(previous), Some(next)) => Some(previous.then(next)),
        (previous, None) => previous,
        (None, next) => next,
    }
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
    /// Delete the live VolumeAttachments of `node` ([`drain::live_volume_attachments`](crate::drain::live_volume_attachments)); report
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
