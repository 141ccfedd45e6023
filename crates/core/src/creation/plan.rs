//! What the creation decision takes and returns: the input, the outcome of the last provider call, the next step.
//!
//! Separate so that the controller, which acts on a [`CreationStep`], reads the vocabulary without the flow.

use std::time::Duration;

use jiff::Timestamp;
use mcm_api::Machine;
use mcm_driver::{
    CreateMachineResponse, DriverError, DriverMethod, GetMachineStatusResponse, InitializeMachineResponse,
    MachineCode,
};

use super::vm::{VmInfo, VmRecord};
use crate::{
    descriptions::Redactor, retry_policy::RetryDecision, status::StatusUpdate, timeouts::ControllerSettings,
};

/// The outcome of the provider call the previous step asked for.
#[derive(Clone, Debug, PartialEq)]
pub enum CallOutcome {
    /// `GetMachineStatus` answered.
    GetMachineStatus(Result<GetMachineStatusResponse, DriverError>),
    /// `CreateMachine` answered. `node_exists` tells whether a Node named as the response's node name exists in the
    /// target cluster (looked up in the node cache after the call), for the stale-node guard.
    CreateMachine {
        /// The answer.
        result: Result<CreateMachineResponse, DriverError>,
        /// Whether a Node named `result.node_name` exists.
        node_exists: bool,
    },
    /// `InitializeMachine` answered; `vm` is the VM of the step that asked for the call.
    InitializeMachine {
        /// The VM that was initialized.
        vm: VmInfo,
        /// The answer.
        result: Result<InitializeMachineResponse, DriverError>,
    },
}

impl CallOutcome {
    /// Whether the call failed (the decision on it counts one more failure, [`super::Attempts::counting`]).
    pub fn failed(&self) -> bool {
        match self {
            Self::GetMachineStatus(result) => result.is_err(),
            Self::CreateMachine { result, .. } => result.is_err(),
            Self::InitializeMachine { result, .. } => result.is_err(),
        }
    }
}

/// What the creation decision needs besides the provider's answers.
#[derive(Clone, Copy, Debug)]
pub struct CreationInput<'a> {
    /// The machine, as the cache holds it (with any [`VmRecord`] of an earlier step applied).
    pub machine: &'a Machine,
    /// The controller settings.
    pub settings: &'a ControllerSettings,
    /// Now.
    pub now: Timestamp,
    /// Whether there is a target cluster (`--target-kubeconfig` not `none`); without one, machines become Available
    /// instead of Pending and need no node name.
    pub has_target_cluster: bool,
    /// Consecutive failed provider calls of this machine, this one included when the outcome is a failure (for the
    /// back-off).
    pub failures: u32,
    /// A random number in `[0, 1)` for the back-off's jitter.
    pub random: f64,
    /// Removes the class secret's values from provider messages.
    pub redactor: &'a Redactor,
    /// Whether the machine's node exists and is healthy ([`crate::health::is_healthy`]). The creation timeout is
    /// the time a VM has to become a healthy node: a machine whose node is healthy is never failed by it, whatever
    /// step (in practice `InitializeMachine`) is still failing; it stays in CrashLoopBackOff and keeps retrying.
    pub node_ready: bool,
}

/// The next step of the creation flow.
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub enum CreationStep {
    /// The machine is not in the creation flow (it has its VM and a phase, or it is Failed, Terminating or being
    /// deleted).
    Skip,
    /// Call `GetMachineStatus` (the first call of every pass).
    CallGetMachineStatus,
    /// No VM exists and none was ever recorded: call `CreateMachine`.
    CallCreateMachine,
    /// Apply `record` (if any), then call `InitializeMachine` for `vm`.
    CallInitializeMachine {
        /// What to record on the machine first.
        record: Option<VmRecord>,
        /// The VM to initialize (pass it back in [`CallOutcome::InitializeMachine`]).
        vm: VmInfo,
    },
    /// The flow is done: apply `record` (if any), then write `status` if [`StatusUpdate::changes`] says so
    /// (phase Pending, or Available without a target cluster, with lastOperation
    /// `Create/Processing "Creating machine on cloud provider"`).
    Finish {
        /// What to record on the machine.
        record: Option<VmRecord>,
        /// The status to write.
        status: Option<StatusUpdate>,
    },
    /// A provider call failed (or answered something unusable): write `status` (phase CrashLoopBackOff, or Failed
    /// once the creation timeout passed, with the error in lastOperation and `errorCode`), and look again after
    /// `requeue_after` (the earlier of the retry and the CrashLoopBackOff deadline; `None` when Failed).
    RecordError {
        /// The status to write.
        status: StatusUpdate,
        /// The retry decision for the failed call.
        retry: RetryDecision,
        /// When to look again.
        requeue_after: Option<Duration>,
        /// The call that failed.
        method: DriverMethod,
        /// Its code.
        code: MachineCode,
    },
    /// Stale-node guard: the new VM registers under the name of an existing, older Node. Delete the VM (a
    /// `DeleteMachine` with `vm.provider_id`), then write `status` (Failed, `VM using old node obj`) whatever the
    /// deletion's outcome; the deletion flow of the Failed machine finds any VM left by the machine's name.
    DeleteStaleVm {
        /// The VM to delete.
        vm: VmInfo,
        /// The status to write.
        status: StatusUpdate,
    },
    /// The machine is Failed without another provider call: its recorded VM vanished, or it was in
    /// CrashLoopBackOff when the creation timeout passed. Write `status`.
    Fail {
        /// The status to write.
        status: StatusUpdate,
    },
}
