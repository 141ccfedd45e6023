//! The creation flow, one step at a time (reference §3.3 `triggerCreationFlow`).
//!
//! The flow is a short conversation with the provider: `GetMachineStatus` first (does a VM exist already?), then
//! `CreateMachine` when none does, then `InitializeMachine` for a new or uninitialized VM, then phase Pending. The
//! controller calls [`decide`] with no outcome to start, makes the provider call the [`CreationStep`] names, and calls
//! [`decide`] again with the call's [`CallOutcome`], until the step is not a call. Before each call it applies the
//! step's [`VmRecord`], so that a VM's providerID is on the machine before anything else can go wrong (a crash after
//! `CreateMachine` must never lead to a second VM).
//!
//! Failures go to CrashLoopBackOff while the creation timeout has not passed and to Failed when it has (exactly when
//! `now ≥ creationTimestamp + effective creation timeout`). Unlike the reference, which notices the timeout only at
//! the next failing retry (issue #790), [`crash_loop_deadline`] gives the instant, and a CrashLoopBackOff machine is
//! marked Failed at that instant without another provider call. Retries follow [`crate::retry_policy`]; what is
//! remembered of failed calls between passes, and when the provider may be called again, is [`Attempts`].
//!
//! Spec 003 ("never two VMs for one machine"; providerID and nodeRef never change once set) is enforced here: a
//! providerID or node label once recorded is never overwritten, and a machine whose recorded VM is reported
//! `NotFound` is marked Failed at once instead of getting a second VM (the reference, seeing `NotFound` for a machine
//! with a node label, carries on as if the VM existed).

mod attempts;
mod decide;
mod plan;
#[cfg(test)]
mod tests;
mod vm;

pub use attempts::Attempts;
pub use decide::{
    crash_loop_deadline, decide, failure_deadline, failure_phase, needs_creation, secret_problem,
    vanished_status,
};
pub use plan::{CallOutcome, CreationInput, CreationStep};
pub use vm::{VmInfo, VmRecord};
