//! Revisions, rollback, history cleanup and the status counts and availability of a deployment.
//!
//! Separate because it looks at the sets' revisions and statuses, not at the replicas a step moves.

use jiff::Timestamp;
use mcm_api::{MachineSet, keys::annotations};

use super::{
    fenceposts::Fenceposts,
    sets::{SetView, annotation_number},
    step::by_age,
};
use crate::timeouts;

/// The set's revision (`deployment.kubernetes.io/revision`), if readable.
pub fn revision(set: &MachineSet) -> Option<i64> {
    annotation_number(set, annotations::REVISION)
}

/// The revision of a new set: one more than the highest of the old sets (Kubernetes' `MaxRevision + 1`).
pub fn next_revision<'a>(old: impl IntoIterator<Item = &'a MachineSet>) -> i64 {
    old.into_iter().filter_map(revision).max().unwrap_or(0) + 1
}

/// The revision a `rollbackTo.revision` names: itself, or for 0 the last revision before the newest (Kubernetes'
/// `LastRevision`). `None` when there is none.
pub fn rollback_revision<'a>(sets: impl IntoIterator<Item = &'a MachineSet>, requested: i64) -> Option<i64> {
    if requested > 0 {
        return Some(requested);
    }
    let mut revisions: Vec<i64> = sets.into_iter().filter_map(revision).collect();
    revisions.sort_unstable();
    revisions.dedup();
    revisions.iter().rev().nth(1).copied()
}

/// The set to roll back to: the one carrying the revision [`rollback_revision`] names. The controller copies its
/// template (without the hash label) and annotations into the deployment and clears `rollbackTo`; `None` is the
/// reference's `DeploymentRollbackRevisionNotFound`.
pub fn rollback_target<'a>(sets: &[&'a MachineSet], requested: i64) -> Option<&'a MachineSet> {
    let wanted = rollback_revision(sets.iter().copied(), requested)?;
    sets.iter().copied().find(|s| revision(s) == Some(wanted))
}

/// Old sets to delete to respect `revisionHistoryLimit` (reference `cleanupMachineDeployment`): with a limit, the
/// oldest sets (by revision, then creation time) beyond it among those not being deleted — skipping any that still has replicas or machines, or whose
/// status is behind its spec. No limit keeps every set (the reference's behaviour for an absent limit).
pub fn history_to_clean_up<'a>(old: &[&'a MachineSet], limit: Option<i32>) -> Vec<&'a MachineSet> {
    let Some(limit) = limit else {
        return Vec::new();
    };
    let mut alive: Vec<&MachineSet> = old
        .iter()
        .copied()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .collect();
    let excess = alive
        .len()
        .saturating_sub(usize::try_from(limit.max(0)).unwrap_or(0));
    // Oldest revision first (Kubernetes sorts by revision): creation times have a one-second resolution, so two
    // sets created within a second would otherwise go by name. Sets without a revision count as oldest.
    alive.sort_by(|a, b| {
        revision(a)
            .cmp(&revision(b))
            .then_with(|| by_age(&SetView::of(a), &SetView::of(b)))
    });
    alive
        .into_iter()
        .take(excess)
        .filter(|s| {
            let status = s.status.clone().unwrap_or_default();
            s.spec.replicas == 0
                && status.replicas == 0
                && s.metadata.generation.unwrap_or(0) <= status.observed_generation
        })
        .collect()
}

/// The deployment's status counts (reference `calculateDeploymentStatus`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusCounts {
    /// Machines of all sets (`status.replicas` summed).
    pub replicas: i32,
    /// Machines of the new set.
    pub updated_replicas: i32,
    /// Ready machines.
    pub ready_replicas: i32,
    /// Available machines.
    pub available_replicas: i32,
    /// `max(Σ spec.replicas − available, 0)`.
    pub unavailable_replicas: i32,
}

/// The deployment's status counts from its sets.
pub fn status_counts(new: Option<&SetView>, old: &[SetView]) -> StatusCounts {
    let all: Vec<&SetView> = new.into_iter().chain(old.iter()).collect();
    let available: i32 = all.iter().map(|s| s.available).sum();
    let desired: i32 = all.iter().map(|s| s.replicas).sum();
    StatusCounts {
        replicas: all.iter().map(|s| s.actual).sum(),
        updated_replicas: new.map_or(0, |n| n.actual),
        ready_replicas: all.iter().map(|s| s.ready).sum(),
        available_replicas: available,
        unavailable_replicas: (desired - available).max(0),
    }
}

/// Whether the deployment has minimum availability (the `Available` condition, reasons `MinimumReplicasAvailable`
/// and `MinimumReplicasUnavailable`): available ≥ replicas − maxUnavailable − preserved Failed machines (reference
/// §1.4).
pub fn has_minimum_availability(
    replicas: i32,
    fenceposts: Fenceposts,
    available: i32,
    preserved_failed: i32,
) -> bool {
    available >= replicas - fenceposts.max_unavailable - preserved_failed
}

/// When the rollout is reported as stuck (`Progressing=False/ProgressDeadlineExceeded`): the Progressing condition's
/// `lastUpdateTime` plus `progressDeadlineSeconds`; `None` without a deadline (infinite, as the reference).
pub fn progress_deadline(deadline_seconds: Option<i32>, last_progress: Timestamp) -> Option<Timestamp> {
    let seconds = u64::try_from(deadline_seconds?).ok()?;
    Some(timeouts::add(
        last_progress,
        std::time::Duration::from_secs(seconds),
    ))
}
