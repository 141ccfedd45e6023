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

mod after;
mod common;
mod decide;
mod description;
mod plan;
mod steps;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use after::after;
pub use decide::{current_step, decide};
pub use description::DeletionDescription;
pub use plan::{
    AfterStep, DeletionAction, DeletionInput, DeletionPlan, DeletionWrite, Hold, NodeDeletion, StepOutcome,
    merge_writes,
};
pub use steps::{DeletionStep, HookKind, hooks};

/// How often the VolumeAttachment step looks again while attachments are being deleted (the reference's 5s).
pub const VOLUME_POLL_INTERVAL: Duration = Duration::from_secs(5);
