//! The MachineSet controller's decisions (reference §5; spec 002 §12 "Machine Set" and the FAQ "How does MCM prioritize
//! the machines for deletion on scale-down of machinedeployment?").
//!
//! A set keeps `spec.replicas` machines made from its template. The controller observes the set and the machines of
//! its namespace (cache), and calls, in this order:
//!
//! 1. [`claim_machines`]: which machines the set owns, adopts (orphans that match its selector) and releases (owned
//!    machines that no longer match), with the patches of [`adoption_patch`] and [`release_patch`];
//! 2. [`Expectations::observe`] with the machines of the cache, then [`decide`] with the owned machines: the
//!    [`MachineSetPlan`] says which finalizer to add or remove, which machines to patch (template propagation), which
//!    to delete (in [`DeletionOrder`]) and how many to create (in slow-start batches, each one [`machine_to_create`]);
//! 3. after acting, [`status`] with what happened ([`ManageResult`]): a [`SetStatusUpdate`] written only when
//!    [`SetStatusUpdate::changes`] says so, and when to look again so that `minReadySeconds` is honoured without
//!    polling.
//!
//! Everything here is pure: the current time and the random seed of the Random delete policy are parameters.

mod auto_preservation;
mod common;
mod deletion_order;
mod expectations;
mod ownership;
mod plan;
mod status;
mod template;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use auto_preservation::{auto_preservation, auto_preserved_count};
pub use deletion_order::{
    DeletePolicy, DeletePolicyError, DeletionKey, DeletionOrder, PolicySource, delete_policy,
    keeps_failed_machine, marked_for_deletion_at, phase_rank,
};
pub use expectations::Expectations;
pub use ownership::{
    Claim, Claims, adoption_patch, claim, claim_machines, owner_reference, release_patch, selects,
};
pub use plan::{
    DeletionReason, Hold, MachineDeletion, MachinePatch, MachineSetInput, MachineSetPlan, decide,
    marked_by_autoscaler, slow_start_batches,
};
pub use status::{
    ManageResult, MinReadySeconds, ReplicaFailure, ReplicaFailureReason, SetStatusUpdate, StatusPlan, status,
};
pub(crate) use template::merge_diff;
pub use template::{effective_creation_timeout, generate_name, machine_to_create, propagation_patch};

/// The most machines a set creates, or deletes, in one pass (the reference's `BurstReplicas`).
pub const BURST_REPLICAS: usize = 100;

/// The first slow-start batch (the reference's and Kubernetes' `SlowStartInitialBatchSize`).
pub const SLOW_START_INITIAL_BATCH_SIZE: usize = 1;

/// After this long, unmet expectations count as met (Kubernetes' `ExpectationsTimeout`), so that a creation or
/// deletion the cache never shows (for example a machine deleted by someone else before the cache saw it) cannot hold
/// a set for ever.
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_mins(5);

/// The value of the `freeze` label that stops a set from scaling up (set by the safety controller).
pub const FREEZE_VALUE: &str = "True";

/// Values of `node.machine.sapcloud.io/preserve` that keep a Failed machine while its preservation is being set up.
const PRESERVE_VALUES: [&str; 3] = ["now", "when-failed", "auto-preserved"];

/// The value of `node.machine.sapcloud.io/preserve` set by auto-preservation.
const AUTO_PRESERVED: &str = "auto-preserved";
