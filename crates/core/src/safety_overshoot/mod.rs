//! The safety controller's overshoot freeze (reference §7, `machine_safety.go`; spec 002 "Safety Controller":
//! "freezes the MachineDeployment and MachineSet controller if the number of Machine objects goes beyond a certain
//! threshold on top of Spec.Replicas … unfreezes … once situation is resolved to normal. A freeze label is applied
//! on MachineDeployment/MachineSet to enforce the freeze condition").
//!
//! The controller observes the machines, sets and deployments of its namespace (caches), calls [`plan`], and acts
//! on the [`Plan`]: for each [`Write`] it re-reads the object, recomputes the patches against that fresh version
//! ([`set_patches`] / [`deployment_patches`] with the write's [`Desired`] state), applies them in the order of
//! [`ObjectPatches::status_first`], and records the write's event when the patches change the freeze label
//! ([`ObjectPatches::transition`]). Nothing here reads a clock: the time of the condition transitions is a
//! parameter.
//!
//! # The rules
//!
//! - **Counted machines** ([`counts_for`]): machines of the set's namespace whose labels include all the set's
//!   template labels and whose *controller* owner reference is a `MachineSet` of the set's name. The reference
//!   counts any owner reference with the set's name (of any kind); a machine has one controller, so here a machine
//!   counts for at most one set, and a non-controller reference is not ownership. Machines being deleted **count**,
//!   as in the reference: the freeze guards against Machine objects piling up, and a machine whose deletion is
//!   stuck is still one (a set that keeps replacing machines whose deletion never ends is exactly a runaway).
//!   Hence a frozen set unfreezes once the machines it scaled down are really gone, and (as in the reference) a
//!   large scale-down can freeze a set until the machines it deletes are gone — harmless, since a freeze only
//!   blocks scale-up.
//! - **Thresholds** ([`thresholds`]): `upper = 2·set.replicas + safety_up`; for a set owned by a MachineDeployment
//!   (its controller owner reference, see [`owning_deployment`]) `upper = md.replicas + surge + safety_up`, where
//!   `surge` is `maxSurge` of `rollingUpdate`, else of `inPlaceUpdate` (a percentage of `md.replicas` rounded up),
//!   and 1 (the API default) when neither sets it or the value is unusable (the reference aborts the whole pass on
//!   an absent or bad maxSurge, which leaves every later set unguarded). `lower = upper − safety_down`; a
//!   `safety_down` of 0 acts as 1, since freezing and unfreezing at the same count would flap.
//! - **Per set** (sets being deleted are left alone: they create nothing and their machines are on their way out):
//!   1. the unfreeze annotation (`safety.machine.sapcloud.io/unfreeze`, any value) on the set or on its deployment
//!      unfreezes it at once, and the annotation is removed (one-shot). A set still at or over its upper threshold
//!      is frozen again by the next pass, as in the reference: the annotation is for an operator who fixed the cause
//!      or wants the set controller to act once;
//!   2. else `count ≥ upper` freezes it (label `freeze=True`, condition `Frozen=True` with reason
//!      `OverShootingReplicaCount` and a message naming the count and the threshold; event `FrozeMachineSet`);
//!   3. else `count ≤ lower` unfreezes it (label and condition removed; event `UnfrozeMachineSet`);
//!   4. else (between the thresholds) it stays as it is.
//!
//!   The label is the freeze (the set controller obeys it, `machineset::decide`); the condition reports it and is
//!   kept in line with the label: added to a labelled set that lacks it, removed from an unlabelled one.
//! - **Every set is evaluated in every pass.** The reference returns from its loop after the first freeze or
//!   unfreeze, so with many overshooting sets it takes one period (1 minute) per set; here all of them change in
//!   the same pass.
//! - **Deployments** are frozen iff at least one of their (not deleted) sets is frozen after the pass. A deployment
//!   that becomes frozen because one of its sets froze in this pass gets that set's reason and message; otherwise
//!   (it was out of line with its sets) reason `MachineDeploymentStateSync`. The unfreeze annotation on a deployment
//!   unfreezes all its sets and the deployment, and is removed; it is not copied to the sets (the reference copies it
//!   and removes it there in a later step of the same pass; the effect is the same). Events `FrozeMachineDeployment`
//!   and `UnfrozeMachineDeployment` are recorded on deployments (not in the reference, which records events on sets
//!   only).
//! - **No write when nothing changes**: a Frozen condition with status True is left as it is (its message is not
//!   rewritten as the count moves), and objects already in the desired state get no [`Write`].

mod common;
mod counting;
mod patches;
mod plan;
#[cfg(test)]
mod tests;

pub use counting::{
    Settings, Thresholds, count, counts_for, deployment_out_of_line, has_unfreeze_annotation, is_frozen,
    owning_deployment, set_out_of_line, surge, thresholds,
};
pub use patches::{ConditionChange, deployment_patches, set_patches};
pub use plan::{
    Cause, Desired, Input, ObjectKind, ObjectPatches, Plan, PlannedEvent, SetEvaluation, Write, event_for,
    plan,
};

/// The default of `--safety-up`: machines tolerated above the expected maximum before a set is frozen.
pub const DEFAULT_SAFETY_UP: u32 = 2;

/// The default of `--safety-down`: how far below the upper threshold the count must fall to unfreeze.
pub const DEFAULT_SAFETY_DOWN: u32 = 1;

/// Reasons of the `Frozen` condition, and of unfreezing (logs and event messages).
pub mod reasons {
    /// The set has too many machines (the reference's `OverShootingReplicaCount`).
    pub const OVERSHOOTING_REPLICA_COUNT: &str = "OverShootingReplicaCount";
    /// The deployment was brought in line with its sets (the reference's `MachineDeploymentStateSync`).
    pub const MACHINE_DEPLOYMENT_STATE_SYNC: &str = "MachineDeploymentStateSync";
    /// Unfrozen by hand with the `safety.machine.sapcloud.io/unfreeze` annotation.
    pub const UNFREEZE_ANNOTATION: &str = "UnfreezeAnnotation";
    /// Unfrozen because the count fell to the lower threshold (the reference's `UnderShootingReplicaCount`).
    pub const UNDERSHOOTING_REPLICA_COUNT: &str = "UnderShootingReplicaCount";
}

/// Reasons of the Events the safety controller records.
pub mod events {
    /// A set was frozen (reference).
    pub const FROZE_MACHINE_SET: &str = "FrozeMachineSet";
    /// A set was unfrozen (reference).
    pub const UNFROZE_MACHINE_SET: &str = "UnfrozeMachineSet";
    /// A deployment was frozen (this project's addition).
    pub const FROZE_MACHINE_DEPLOYMENT: &str = "FrozeMachineDeployment";
    /// A deployment was unfrozen (this project's addition).
    pub const UNFROZE_MACHINE_DEPLOYMENT: &str = "UnfrozeMachineDeployment";
}
