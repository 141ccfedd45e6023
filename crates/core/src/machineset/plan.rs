//! [`decide`]: the MachineSet plan (finalizer, deletions, patches, creations in slow-start batches).
//!
//! Separate because it is the one place that combines ownership, expectations and the deletion order.

use std::{collections::BTreeSet, fmt, time::Duration};

use jiff::Timestamp;
use mcm_api::{
    Machine, MachinePhase, MachineSet, MetaExt,
    keys::{annotations, finalizers, labels},
    validation::{self, FieldError},
};
use serde_json::Value;

use super::{
    BURST_REPLICAS, FREEZE_VALUE, SLOW_START_INITIAL_BATCH_SIZE,
    common::{labels_of, min_duration, name_of, until},
    deletion_order::{
        DeletePolicy, DeletePolicyError, DeletionOrder, delete_policy, keeps_failed_machine,
        marked_for_deletion_at, parse_time,
    },
    expectations::Expectations,
    template::propagation_patch,
};

/// What [`decide`] looks at.
#[derive(Clone, Copy, Debug)]
pub struct MachineSetInput<'a> {
    /// The set, as read (the reference GETs it from the API server).
    pub set: &'a MachineSet,
    /// The machines the set owns ([`Claims::owned`](super::Claims::owned) plus those adopted successfully), from the cache.
    pub machines: &'a [&'a Machine],
    /// The set's expectations, after [`Expectations::observe`] on the cache.
    pub expectations: &'a Expectations,
    /// The `machine.sapcloud.io/delete-policy` annotation of the set's MachineDeployment, when it has one.
    pub deployment_delete_policy: Option<&'a str>,
    /// Now.
    pub now: Timestamp,
    /// The seed of the Random delete policy (any number; a new one per pass is fine).
    pub random: u64,
}

/// Why a machine is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeletionReason {
    /// The set has more machines than `spec.replicas` (picked in [`DeletionOrder`]).
    ScaleDown,
    /// The cluster-autoscaler marked it (priority `1`, marked before the set's
    /// `last-deployment-replica-change-by-scaler-time`; reference §6.5).
    MarkedByAutoscaler,
    /// The machine is Failed and not preserved: it is replaced.
    Failed,
    /// The set is being deleted: all its machines go first.
    SetDeleted,
}

impl DeletionReason {
    /// A short name for events and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ScaleDown => "ScaleDown",
            Self::MarkedByAutoscaler => "MarkedByAutoscaler",
            Self::Failed => "Failed",
            Self::SetDeleted => "SetDeleted",
        }
    }
}

/// A machine to delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineDeletion {
    /// The machine's name.
    pub name: String,
    /// Why.
    pub reason: DeletionReason,
}

/// A patch for an existing machine (template propagation).
#[derive(Clone, Debug, PartialEq)]
pub struct MachinePatch {
    /// The machine's name.
    pub name: String,
    /// The JSON merge patch.
    pub patch: Value,
}

/// Why the plan does less than the replica count asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// The set is invalid: nothing is created or deleted (report the errors on the set and as an event).
    Invalid(Vec<FieldError>),
    /// Creations or deletions are not in the cache yet: nothing is created or deleted until they are, or until
    /// `until`.
    ExpectationsPending {
        /// Creations not seen yet.
        creations: usize,
        /// Deletions not seen yet.
        deletions: usize,
        /// When they stop holding the set.
        until: Timestamp,
    },
    /// The set carries `freeze=True` (safety controller): it does not scale up; deletions go on.
    Frozen {
        /// Machines missing.
        missing: usize,
    },
    /// The set carries `node.machine.sapcloud.io/scale-up-disabled`: it does not scale up.
    ScaleUpDisabled {
        /// Machines missing.
        missing: usize,
    },
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid(errors) => write!(f, "invalid: {}", validation::summarize(errors)),
            Self::ExpectationsPending {
                creations,
                deletions,
                until,
            } => write!(
                f,
                "waiting for {creations} creation(s) and {deletions} deletion(s) to show in the cache (at most until \
                 {until})"
            ),
            Self::Frozen { missing } => write!(
                f,
                "frozen by the safety controller (label {}={FREEZE_VALUE}): {missing} machine(s) not created",
                labels::FREEZE
            ),
            Self::ScaleUpDisabled { missing } => write!(
                f,
                "scale-up disabled (label {}): {missing} machine(s) not created",
                labels::SCALE_UP_DISABLED
            ),
        }
    }
}

/// What the set controller does in one pass. Act in this order: add the finalizer; apply `propagate`; delete
/// (raise [`Expectations::expect_deletion`] before each call, [`Expectations::deletion_failed`] after a failed one;
/// NotFound counts as done); create `create` machines ([`machine_to_create`](super::machine_to_create)) batch by batch as in
/// `create_batches`, stopping after the first batch with an error, and raise [`Expectations::expect_creation`] with
/// the name of each created machine; remove the finalizer; then [`status`](fn@super::status).
#[derive(Clone, Debug, Default, PartialEq)]
#[must_use]
pub struct MachineSetPlan {
    /// Add `machine.sapcloud.io/machine-controller-manager` to the set.
    pub add_finalizer: bool,
    /// The set is being deleted and no machine of it is left: remove the finalizer.
    pub remove_finalizer: bool,
    /// Machines to create now.
    pub create: usize,
    /// Slow-start batches of `create` (1, 2, 4, …).
    pub create_batches: Vec<usize>,
    /// Machines to delete, in order.
    pub delete: Vec<MachineDeletion>,
    /// Template propagation to existing machines.
    pub propagate: Vec<MachinePatch>,
    /// Why less is done than the replica count asks.
    pub holds: Vec<Hold>,
    /// The delete policy in force.
    pub delete_policy: Option<DeletePolicy>,
    /// An unusable delete policy annotation (report it; the reference's order is used).
    pub policy_problem: Option<DeletePolicyError>,
    /// When to look again (expectations expiring, a preserved Failed machine's preservation ending); `None`: on
    /// the next change.
    pub requeue_after: Option<Duration>,
}

/// The slow-start batch sizes for `count` creations (the reference's and Kubernetes' `slowStartBatch`): the first
/// batch has `initial` calls and each next batch twice as many, the last one what is left. The controller stops after
/// the first batch with an error, so a quota or a wrong template costs one call, not `count`.
pub fn slow_start_batches(count: usize, initial: usize) -> Vec<usize> {
    let mut batches = Vec::new();
    let mut remaining = count;
    let mut size = remaining.min(initial.max(1));
    while size > 0 {
        batches.push(size);
        remaining -= size;
        size = remaining.min(size.saturating_mul(2));
    }
    batches
}

/// The machines the cluster-autoscaler marked for deletion (reference `getMachinesMarkedForDeletion`): priority
/// annotation exactly `1` and a `marked-for-deletion-time` at or before the set's
/// `last-deployment-replica-change-by-scaler-time`. None when the set has no (readable) such time.
pub fn marked_by_autoscaler<'a>(set: &MachineSet, machines: &[&'a Machine]) -> Vec<&'a Machine> {
    let Some(changed_at) = set
        .annotation(annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME)
        .and_then(parse_time)
    else {
        return Vec::new();
    };
    machines
        .iter()
        .copied()
        .filter(|m| m.annotation(annotations::MACHINE_PRIORITY) == Some("1"))
        .filter(|m| marked_for_deletion_at(m).is_some_and(|at| at <= changed_at))
        .collect()
}

/// Decides one pass of the set controller; see [`MachineSetPlan`] for how to act on it.
///
/// - **Being deleted**: every machine not yet being deleted is deleted (reference: "delete all child machines, then
///   remove the finalizer once none remain"); the finalizer goes when no machine is left. Validation and
///   expectations do not hold a deletion.
/// - **Invalid** (`mcm_api::validation`): nothing is created, deleted or patched.
/// - Otherwise the finalizer is added and the template propagated ([`propagation_patch`]); while
///   [`Expectations::satisfied`] is false nothing is created or deleted.
/// - **Counting** (reference §5 manageReplicas, "Terminating machines do not count"): machines being deleted or
///   Terminating do not count; Failed machines that are not kept ([`keeps_failed_machine`]) are deleted and do not
///   count, so their replacements are created in the same pass; machines marked by the cluster-autoscaler
///   ([`marked_by_autoscaler`]) are deleted and do not count. The rest are the active machines.
/// - **Scale up**: `replicas − active` machines (at most [`BURST_REPLICAS`]) in [`slow_start_batches`], unless the
///   set carries `freeze=True` or `node.machine.sapcloud.io/scale-up-disabled` (deletions go on).
/// - **Scale down**: the first `active − replicas` active machines (at most [`BURST_REPLICAS`]) in
///   [`DeletionOrder`] with the set's delete policy ([`delete_policy`]).
/// - At most [`BURST_REPLICAS`] deletions per pass: scale-down first, then marked, then Failed (the reference's order).
pub fn decide(input: &MachineSetInput<'_>) -> MachineSetPlan {
    let set = input.set;
    let now = input.now;
    let mut plan = MachineSetPlan::default();
    match delete_policy(set, input.deployment_delete_policy) {
        Ok(policy) => plan.delete_policy = policy,
        Err(problem) => plan.policy_problem = Some(problem),
    }
    let order = DeletionOrder::new(plan.delete_policy, input.random, now);

    if set.is_deleting() {
        let mut remaining: Vec<&Machine> = input
            .machines
            .iter()
            .copied()
            .filter(|m| !m.is_deleting())
            .collect();
        order.sort(&mut remaining);
        plan.delete = remaining
            .iter()
            .map(|m| MachineDeletion {
                name: name_of(m).to_owned(),
                reason: DeletionReason::SetDeleted,
            })
            .collect();
        plan.remove_finalizer =
            input.machines.is_empty() && set.has_finalizer(finalizers::MACHINE_CONTROLLER_MANAGER);
        return plan;
    }

    let errors = validation::validate_machine_set(set);
    if !errors.is_empty() {
        plan.holds.push(Hold::Invalid(errors));
        return plan;
    }
    plan.add_finalizer = !set.has_finalizer(finalizers::MACHINE_CONTROLLER_MANAGER);
    plan.propagate = input
        .machines
        .iter()
        .filter_map(|m| {
            propagation_patch(set, m).map(|patch| MachinePatch {
                name: name_of(m).to_owned(),
                patch,
            })
        })
        .collect();
    // A preserved Failed machine is deleted when its preservation ends.
    plan.requeue_after = input
        .machines
        .iter()
        .filter(|m| !m.is_terminating() && m.phase() == Some(MachinePhase::Failed))
        .filter_map(|m| m.preserve_expiry().filter(|t| *t > now))
        .map(|t| until(now, t))
        .min();

    if !input.expectations.satisfied(now) {
        let until_at = input.expectations.expires_at().unwrap_or(now);
        plan.holds.push(Hold::ExpectationsPending {
            creations: input.expectations.pending_creations(),
            deletions: input.expectations.pending_deletions(),
            until: until_at,
        });
        plan.requeue_after = min_duration(plan.requeue_after, Some(until(now, until_at)));
        return plan;
    }
    manage_replicas(input, &order, &mut plan);
    plan
}

/// Scale up or down, Failed and marked machines (the part of [`decide`] held by expectations).
fn manage_replicas(input: &MachineSetInput<'_>, order: &DeletionOrder, plan: &mut MachineSetPlan) {
    let set = input.set;
    let now = input.now;
    let not_going: Vec<&Machine> = input
        .machines
        .iter()
        .copied()
        .filter(|m| !m.is_terminating())
        .collect();
    let failed: Vec<&Machine> = not_going
        .iter()
        .copied()
        .filter(|m| m.phase() == Some(MachinePhase::Failed) && !keeps_failed_machine(m, now))
        .collect();
    let active: Vec<&Machine> = not_going
        .iter()
        .copied()
        .filter(|m| !failed.iter().any(|f| std::ptr::eq(*f, *m)))
        .collect();
    let marked = marked_by_autoscaler(set, &active);
    let mut remaining: Vec<&Machine> = active
        .iter()
        .copied()
        .filter(|m| !marked.iter().any(|x| std::ptr::eq(*x, *m)))
        .collect();
    let replicas = usize::try_from(set.spec.replicas).unwrap_or(0);

    let mut deletions: Vec<MachineDeletion> = Vec::new();
    if remaining.len() < replicas {
        let missing = replicas - remaining.len();
        let set_labels = labels_of(&set.metadata);
        if set_labels.get(labels::FREEZE).map(String::as_str) == Some(FREEZE_VALUE) {
            plan.holds.push(Hold::Frozen { missing });
        } else if set_labels.contains_key(labels::SCALE_UP_DISABLED) {
            plan.holds.push(Hold::ScaleUpDisabled { missing });
        } else {
            plan.create = missing.min(BURST_REPLICAS);
            plan.create_batches = slow_start_batches(plan.create, SLOW_START_INITIAL_BATCH_SIZE);
        }
    } else if remaining.len() > replicas {
        let excess = (remaining.len() - replicas).min(BURST_REPLICAS);
        order.sort(&mut remaining);
        deletions.extend(remaining[..excess].iter().map(|m| MachineDeletion {
            name: name_of(m).to_owned(),
            reason: DeletionReason::ScaleDown,
        }));
    }
    let mut marked = marked;
    order.sort(&mut marked);
    deletions.extend(marked.iter().map(|m| MachineDeletion {
        name: name_of(m).to_owned(),
        reason: DeletionReason::MarkedByAutoscaler,
    }));
    let mut failed = failed;
    order.sort(&mut failed);
    deletions.extend(failed.iter().map(|m| MachineDeletion {
        name: name_of(m).to_owned(),
        reason: DeletionReason::Failed,
    }));
    let mut seen = BTreeSet::new();
    deletions.retain(|d| seen.insert(d.name.clone()));
    deletions.truncate(BURST_REPLICAS);
    plan.delete = deletions;
}
