//! The machine side of an in-place update (strategy `InPlaceUpdate`, reference v0.58+ `machine_util.go`
//! `updateNodeConditionBasedOnLabel`, `inPlaceUpdate`, `drainNodeForInPlace`): the node condition `InPlaceUpdate`
//! kept in step with the node's labels, the drain before the update, the machine's `InPlaceUpdating` status, and
//! what a node agent reads and writes. The phases that follow the agent's result and the in-place update timeout
//! are the health check's ([`crate::health`]).
//!
//! The condition moves `CandidateForUpdate` (label `candidate-for-update`) → `SelectedForUpdate` (plus label
//! `selected-for-update`) → drain (cordon; forced by the machine label `force-drain=True`, by the drain timeout
//! since the selection, or by a node not Ready / read-only for 5 minutes) → machine `InPlaceUpdating` and
//! `DrainSuccessful` → `ReadyForUpdate` → the node agent updates the node and sets the label
//! `update-result=successful|failed` (annotation `update-failed-reason`) → `UpdateSuccessful` / `UpdateFailed`. A
//! node whose condition says `UpdateSuccessful` and that lost its `update-result` label is a candidate again (the
//! next update).

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{Node, NodeCondition},
    apimachinery::pkg::apis::meta::v1::Time,
};
use mcm_api::{
    Machine, MachineOperationType, MachinePhase, MachineState, MetaExt,
    keys::{annotations, in_place_update as reasons, labels, node_conditions},
};
use serde_json::{Value, json};

use crate::{
    descriptions::{Description, Redactor},
    drain::{self, DrainMode, ForceReason},
    status::{StatusUpdate, operation, phase_status},
    timeouts::{self, EffectiveSettings},
};

/// The message of `CandidateForUpdate` (reference).
pub const CANDIDATE_MESSAGE: &str = "Node is a candidate for in-place update";
/// The message of `SelectedForUpdate` (reference).
pub const SELECTED_MESSAGE: &str = "Node is selected for in-place update";
/// The message of `DrainSuccessful` (reference).
pub const DRAINED_MESSAGE: &str = "Node draining successful";
/// The message of `ReadyForUpdate` (reference).
pub const READY_MESSAGE: &str = "Node is ready for in-place update";
/// The message of `UpdateSuccessful` (reference).
pub const SUCCESSFUL_MESSAGE: &str = "Node in-place update successful";
/// The message of `UpdateFailed`, followed by the node's `update-failed-reason` (reference).
pub const FAILED_MESSAGE_PREFIX: &str = "Node in-place update failed: ";
/// The value of the machine label `force-drain` that forces the drain (the reference compares with `"True"`).
pub const FORCE_DRAIN_VALUE: &str = "True";

/// The node's `InPlaceUpdate` condition, if it has one.
pub fn condition_of(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == node_conditions::IN_PLACE_UPDATE))
}

/// The reason of the node's `InPlaceUpdate` condition, if it has one.
pub fn reason_of(node: &Node) -> Option<&str> {
    condition_of(node).and_then(|c| c.reason.as_deref())
}

fn has_label(node: &Node, key: &str) -> bool {
    node.metadata.labels.as_ref().is_some_and(|l| l.contains_key(key))
}

/// Whether the node takes part in an in-place update at all (the label `candidate-for-update` or an
/// `InPlaceUpdate` condition): the controller's cheap test before it resolves settings and calls [`decide`].
pub fn concerns(node: &Node) -> bool {
    has_label(node, labels::CANDIDATE_FOR_UPDATE) || condition_of(node).is_some()
}

/// The `InPlaceUpdate` condition with `reason` and `message`, status True, its transition at `now` (every step is
/// a transition, as in the reference).
pub fn condition(reason: &str, message: &str, now: Timestamp) -> NodeCondition {
    NodeCondition {
        type_: node_conditions::IN_PLACE_UPDATE.to_owned(),
        status: "True".to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_heartbeat_time: None,
        last_transition_time: Some(Time(now)),
    }
}

/// What the machine controller observed for one machine with a node.
#[derive(Clone, Copy, Debug)]
pub struct InPlaceInput<'a> {
    /// The machine.
    pub machine: &'a Machine,
    /// Its node.
    pub node: &'a Node,
    /// The machine's effective settings (drain timeout and retries, the force-drain period).
    pub settings: &'a EffectiveSettings,
    /// Removes secret values from the node agent's failure reason.
    pub redactor: &'a Redactor,
    /// Now.
    pub now: Timestamp,
}

/// The next step of the machine side.
#[derive(Clone, Debug, PartialEq)]
pub enum InPlaceStep {
    /// Nothing to do: no update under way, or waiting for the selection or the node agent (their label changes
    /// are node events, which reconcile the machine).
    Wait,
    /// Write this `InPlaceUpdate` node condition.
    Condition(NodeCondition),
    /// Cordon and drain the node as the mode says; once drained, write [`updating_status`], then
    /// [`drained_condition`].
    Drain(DrainMode),
}

/// Decides the next step from the node's labels and `InPlaceUpdate` condition (the reference's
/// `updateNodeConditionBasedOnLabel`, then `inPlaceUpdate`):
/// - with the label `candidate-for-update`: no condition yet, or `UpdateSuccessful` without an `update-result`
///   label (the next update) → `CandidateForUpdate`; `CandidateForUpdate` and the label `selected-for-update` →
///   `SelectedForUpdate`; otherwise, unless `SelectedForUpdate` is still being drained, the label `update-result`
///   `successful` → `UpdateSuccessful`, `failed` → `UpdateFailed` with `update-failed-reason`;
/// - then, whatever the labels: `SelectedForUpdate` → drain; `DrainSuccessful` → `ReadyForUpdate`.
///
/// A machine being deleted is left to the deletion flow.
pub fn decide(input: &InPlaceInput<'_>) -> InPlaceStep {
    if input.machine.is_deleting() {
        return InPlaceStep::Wait;
    }
    let node = input.node;
    let now = input.now;
    let reason = reason_of(node);
    let selected = has_label(node, labels::SELECTED_FOR_UPDATE);
    if has_label(node, labels::CANDIDATE_FOR_UPDATE) {
        let next_update =
            reason == Some(reasons::UPDATE_SUCCESSFUL) && !has_label(node, labels::UPDATE_RESULT);
        if reason.is_none() || next_update {
            return InPlaceStep::Condition(condition(reasons::CANDIDATE_FOR_UPDATE, CANDIDATE_MESSAGE, now));
        }
        if selected && reason == Some(reasons::CANDIDATE_FOR_UPDATE) {
            return InPlaceStep::Condition(condition(reasons::SELECTED_FOR_UPDATE, SELECTED_MESSAGE, now));
        }
        let draining = selected && reason == Some(reasons::SELECTED_FOR_UPDATE);
        if !draining && let Some(step) = result_condition(input, reason) {
            return step;
        }
    }
    match reason {
        Some(reasons::SELECTED_FOR_UPDATE) => InPlaceStep::Drain(drain_mode(input)),
        Some(reasons::DRAIN_SUCCESSFUL) => {
            InPlaceStep::Condition(condition(reasons::READY_FOR_UPDATE, READY_MESSAGE, now))
        }
        _ => InPlaceStep::Wait,
    }
}

/// The node agent's `update-result`, as the condition says it, unless it says so already.
fn result_condition(input: &InPlaceInput<'_>, reason: Option<&str>) -> Option<InPlaceStep> {
    let node = input.node;
    match node.label(labels::UPDATE_RESULT) {
        Some(reasons::RESULT_SUCCESSFUL) if reason != Some(reasons::UPDATE_SUCCESSFUL) => {
            Some(InPlaceStep::Condition(condition(
                reasons::UPDATE_SUCCESSFUL,
                SUCCESSFUL_MESSAGE,
                input.now,
            )))
        }
        Some(reasons::RESULT_FAILED) if reason != Some(reasons::UPDATE_FAILED) => {
            let message = format!("{FAILED_MESSAGE_PREFIX}{}", failed_reason(node, input.redactor));
            Some(InPlaceStep::Condition(condition(
                reasons::UPDATE_FAILED,
                &message,
                input.now,
            )))
        }
        _ => None,
    }
}

/// The node's `update-failed-reason` annotation, secret values removed ("" without one).
pub fn failed_reason(node: &Node, redactor: &Redactor) -> String {
    redactor.redact(
        node.annotation(annotations::UPDATE_FAILED_REASON)
            .unwrap_or_default(),
    )
}

/// How the drain before an update runs (reference `drainNodeForInPlace`): forced, with the force timeout and one
/// eviction attempt, when the machine has the label `force-drain=True`, when the drain timeout has passed since
/// the `SelectedForUpdate` transition, or when the node has not been Ready (or had a read-only filesystem) for the
/// force-drain period; otherwise a normal drain that turns into a forced one at the first of those instants.
pub fn drain_mode(input: &InPlaceInput<'_>) -> DrainMode {
    let settings = input.settings;
    let conditions = input
        .node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let mut deadlines = Vec::new();
    if let Some(since) = condition_of(input.node)
        .filter(|c| c.reason.as_deref() == Some(reasons::SELECTED_FOR_UPDATE))
        .and_then(|c| c.last_transition_time.as_ref())
    {
        deadlines.push((
            timeouts::add(since.0, settings.drain_timeout),
            ForceReason::SelectedTimeout {
                timeout: settings.drain_timeout,
            },
        ));
    }
    deadlines.extend(drain::node_force_deadlines(conditions, settings));
    let forced = if input.machine.label(labels::FORCE_DRAIN) == Some(FORCE_DRAIN_VALUE) {
        Some(ForceReason::DrainLabel)
    } else {
        deadlines
            .iter()
            .filter(|(at, _)| input.now >= *at)
            .min_by_key(|(at, _)| *at)
            .map(|(_, reason)| reason.clone())
    };
    match forced {
        Some(reason) => DrainMode {
            force: Some(reason),
            timeout: drain::FORCE_TIMEOUT,
            max_evict_retries: drain::FORCE_MAX_EVICT_RETRIES,
            force_at: None,
        },
        None => DrainMode {
            force: None,
            timeout: settings.drain_timeout,
            max_evict_retries: drain::max_evict_retries(
                settings.drain_timeout,
                settings.max_evict_retries,
                settings.evict_retry_interval,
            ),
            force_at: deadlines.iter().map(|(at, _)| *at).min(),
        },
    }
}

/// The machine's status once its node is drained: phase `InPlaceUpdating` (its time starts the in-place update
/// timeout), lastOperation `InPlaceUpdate/Processing "Machine <m> is undergoing an in-place update"`.
pub fn updating_status(machine: &Machine, now: Timestamp) -> StatusUpdate {
    let description = Description::InPlaceUpdating {
        machine: machine.metadata.name.clone().unwrap_or_default(),
    };
    StatusUpdate {
        last_operation: Some(operation(
            &description,
            MachineState::Processing,
            Some(MachineOperationType::InPlaceUpdate),
            None,
            now,
        )),
        current_status: Some(phase_status(
            machine.status.as_ref(),
            MachinePhase::InPlaceUpdating,
            false,
            now,
        )),
        ..StatusUpdate::default()
    }
}

/// The condition written after [`updating_status`]: `DrainSuccessful`.
pub fn drained_condition(now: Timestamp) -> NodeCondition {
    condition(reasons::DRAIN_SUCCESSFUL, DRAINED_MESSAGE, now)
}

/// Whether a node agent is to update the node now: its `InPlaceUpdate` condition says `ReadyForUpdate` and it has
/// no `update-result` yet.
pub fn agent_should_update(node: &Node) -> bool {
    reason_of(node) == Some(reasons::READY_FOR_UPDATE) && !has_label(node, labels::UPDATE_RESULT)
}

/// The node merge patch of a node agent's result: the label `update-result` and, for a failure, the annotation
/// `update-failed-reason` (removed on success). `extra_labels` are what the update changed on the node (the
/// instance type), written in the same patch so that the result is never seen before them.
pub fn result_patch(result: Result<(), &str>, extra_labels: &BTreeMap<String, String>) -> Value {
    let (value, reason) = match result {
        Ok(()) => (reasons::RESULT_SUCCESSFUL, Value::Null),
        Err(reason) => (reasons::RESULT_FAILED, json!(reason)),
    };
    let mut node_labels = serde_json::Map::new();
    for (key, label) in extra_labels {
        node_labels.insert(key.clone(), json!(label));
    }
    node_labels.insert(labels::UPDATE_RESULT.to_owned(), json!(value));
    json!({ "metadata": {
        "labels": node_labels,
        "annotations": { annotations::UPDATE_FAILED_REASON: reason },
    } })
}

#[cfg(test)]
#[path = "in_place_update_tests.rs"]
mod tests;
