//! The Progressing condition: its reasons, progress made, and the deadline.
//!
//! Separate because it reports on a rollout after the fact and never changes what a step does.

use jiff::Timestamp;
use mcm_api::ConditionStatus;

use super::{
    history::{StatusCounts, progress_deadline},
    step::RolloutPhase,
};

/// The Progressing condition's reasons (the reference's, with `MachineSet` for `ReplicaSet`).
pub mod reasons {
    /// A new set was created for the current template.
    pub const NEW_MACHINE_SET_CREATED: &str = "NewMachineSetCreated";
    /// An existing set (a rollback's) became the new one.
    pub const FOUND_NEW_MACHINE_SET: &str = "FoundNewMachineSet";
    /// Machines moved since the last status.
    pub const MACHINE_SET_UPDATED: &str = "MachineSetUpdated";
    /// The rollout is complete.
    pub const NEW_MACHINE_SET_AVAILABLE: &str = "NewMachineSetAvailable";
    /// No progress within `progressDeadlineSeconds`.
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    /// `spec.paused` is set.
    pub const DEPLOYMENT_PAUSED: &str = "DeploymentPaused";
    /// `spec.paused` was cleared.
    pub const DEPLOYMENT_RESUMED: &str = "DeploymentResumed";
}

/// What the controller saw for the Progressing condition.
#[derive(Clone, Debug)]
pub struct ProgressInput<'a> {
    /// The deployment's current Progressing condition: status, reason, `lastUpdateTime`.
    pub previous: Option<(ConditionStatus, &'a str, Option<Timestamp>)>,
    /// `spec.paused`.
    pub paused: bool,
    /// The phase [`step`](fn@super::step) reported.
    pub phase: RolloutPhase,
    /// The new set's name, if it exists.
    pub new_set: Option<&'a str>,
    /// This pass created the new set.
    pub created: bool,
    /// This pass made an existing set the new one (a rollback).
    pub found: bool,
    /// The counts of the status as last written.
    pub before: StatusCounts,
    /// The counts now.
    pub after: StatusCounts,
    /// `spec.progressDeadlineSeconds`.
    pub deadline_seconds: Option<i32>,
    /// The current time.
    pub now: Timestamp,
}

/// The Progressing condition to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgressCondition {
    /// True, False or Unknown.
    pub status: ConditionStatus,
    /// One of [`reasons`].
    pub reason: &'static str,
    /// For people.
    pub message: String,
    /// `lastUpdateTime` becomes now even when status and reason stay (progress was made).
    pub touch: bool,
}

/// Whether machines moved since the last status (Kubernetes' `DeploymentProgressing`): more updated, ready or
/// available machines, or fewer old ones.
pub fn made_progress(before: StatusCounts, after: StatusCounts) -> bool {
    after.updated_replicas > before.updated_replicas
        || after.replicas - after.updated_replicas < before.replicas - before.updated_replicas
        || after.ready_replicas > before.ready_replicas
        || after.available_replicas > before.available_replicas
}

/// The Progressing condition (Kubernetes' `checkPausedConditions` and `syncRolloutStatus`, as the reference): paused
/// → Unknown/DeploymentPaused, and on resume Unknown/DeploymentResumed (a reported deadline is never overwritten by
/// either); a created or found new set, or progress → True with `lastUpdateTime` now; complete → True/
/// NewMachineSetAvailable; no progress for `progressDeadlineSeconds` since `lastUpdateTime` → False/
/// ProgressDeadlineExceeded (no automatic rollback). `None` keeps the condition as it is.
pub fn progressing(input: &ProgressInput<'_>) -> Option<ProgressCondition> {
    let set = input.new_set.unwrap_or_default();
    let previous_reason = input.previous.map(|(_, reason, _)| reason);
    let timed_out = previous_reason == Some(reasons::PROGRESS_DEADLINE_EXCEEDED);
    let condition = |status, reason, message: String, touch| {
        Some(ProgressCondition {
            status,
            reason,
            message,
            touch,
        })
    };
    if input.paused {
        return (!timed_out && previous_reason != Some(reasons::DEPLOYMENT_PAUSED)).then(|| {
            ProgressCondition {
                status: ConditionStatus::Unknown,
                reason: reasons::DEPLOYMENT_PAUSED,
                message: "Deployment is paused.".into(),
                touch: true,
            }
        });
    }
    if input.phase == RolloutPhase::Complete {
        return condition(
            ConditionStatus::True,
            reasons::NEW_MACHINE_SET_AVAILABLE,
            format!("MachineSet {set:?} has successfully progressed."),
            false,
        );
    }
    if input.created {
        return condition(
            ConditionStatus::True,
            reasons::NEW_MACHINE_SET_CREATED,
            format!("Created new MachineSet {set:?}."),
            true,
        );
    }
    if input.found {
        return condition(
            ConditionStatus::True,
            reasons::FOUND_NEW_MACHINE_SET,
            format!("Found new MachineSet {set:?}."),
            true,
        );
    }
    if previous_reason == Some(reasons::DEPLOYMENT_PAUSED) {
        return condition(
            ConditionStatus::Unknown,
            reasons::DEPLOYMENT_RESUMED,
            "Deployment is resumed.".into(),
            true,
        );
    }
    if made_progress(input.before, input.after) || input.previous.is_none() {
        return condition(
            ConditionStatus::True,
            reasons::MACHINE_SET_UPDATED,
            format!("MachineSet {set:?} is progressing."),
            true,
        );
    }
    let last = input.previous.and_then(|(_, _, at)| at);
    if timed_out
        || last
            .and_then(|at| progress_deadline(input.deadline_seconds, at))
            .is_some_and(|deadline| deadline <= input.now)
    {
        return condition(
            ConditionStatus::False,
            reasons::PROGRESS_DEADLINE_EXCEEDED,
            format!("MachineSet {set:?} has timed out progressing."),
            false,
        );
    }
    None
}
