//! Crash points: the places, after each API write and provider call of the controllers' flows, where a test makes a
//! controller stop as if its process died (tests/crash_points.rs). Compiled in only with the `failpoints` feature
//! (tikv's `fail` crate); without it the `crash_point!` lines expand to nothing and this module does not exist.
//!
//! A point is armed for a scope: a name prefix of the object the controller works on (the machine, its node, the
//! set, the deployment). The `fail` registry is one per process and the tests run in parallel, each with its own API
//! server: the prefix keeps a test's crash from firing in another test that passes the same point (the `fail` point
//! is on while any prefix is armed; the prefixes are kept here, since several tests may arm one point). An armed
//! point fires once per prefix (it disarms itself), records that it fired, and panics. kube-runtime runs each
//! reconcile in a task of its own and unwraps its join in the controller's stream, so the panic ends the whole
//! controller, like a killed process: nothing after the point is done, and the reconciles in flight are aborted.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Mutex, PoisonError},
};

use mcm_api::MachinePhase;
use mcm_core::{creation::CallOutcome, deletion::DeletionStep};

/// A crash point. Every `crash_point!` in the controllers names one; [`CrashPoint::ALL`] lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CrashPoint {
    /// Machine controller: the machine's finalizer was added.
    MachineFinalizer,
    /// Creation: GetMachineStatus answered.
    CreateGetMachineStatus,
    /// Creation: CreateMachine answered (the VM exists, nothing is recorded yet).
    CreateCreateMachine,
    /// Creation: the VM (providerID, node label) was recorded before InitializeMachine.
    CreateRecord,
    /// Creation: InitializeMachine answered.
    CreateInitializeMachine,
    /// Creation: the VM was recorded at the end of the flow (a VM found by GetMachineStatus).
    CreateFinishRecord,
    /// Creation: the status ending the flow (phase Pending, or Available without a target cluster) was written.
    CreateStatus,
    /// Creation: a failed call's status (CrashLoopBackOff) was written.
    CreateErrorStatus,
    /// Machine controller: phase Failed was written (a vanished VM, a creation or health timeout).
    CreateFail,
    /// Machine controller: another status (Running, Unknown, no phase change) was written.
    MachineHealthStatus,
    /// Machine controller: the node's labels, taints or finalizer were synced from the machine.
    MachineNodeSync,
    /// Deletion: the status the pass writes before its action (phase Terminating, a skipped step) was written, or
    /// staged to go with the next write (issue 26): a crash here loses it.
    DeletionStepWrite,
    /// Deletion: GetMachineStatus answered.
    DeletionGetVmStatus,
    /// Deletion: a drain pass ended.
    DeletionDrain,
    /// Deletion: the node's VolumeAttachments were deleted.
    DeletionVolumeAttachments,
    /// Deletion: DeleteMachine answered.
    DeletionDeleteVm,
    /// Deletion: the node's finalizer was removed, before the node's deletion.
    DeletionNodeFinalizer,
    /// Deletion: the node was deleted.
    DeletionDeleteNode,
    /// Deletion: the machine's finalizer was removed.
    DeletionRemoveFinalizer,
    /// Deletion: the node label was recorded after GetMachineStatus.
    DeletionNodeLabel,
    /// Deletion: the status naming the next step was written after an action, or staged to go with the next write (a
    /// crash here loses it and redoes the step).
    DeletionNextStepWrite,
    /// Drain: the node was cordoned.
    DrainCordon,
    /// Drain: the pods that may go at once were evicted.
    DrainEvictions,
    /// Drain: a force drain deleted the pods.
    DrainForceDeletions,
    /// Drain: a pod with volumes was evicted (one at a time).
    DrainVolumePod,
    /// MachineSet controller: an orphan machine was adopted.
    SetAdopt,
    /// MachineSet controller: the set's finalizer was added.
    SetFinalizer,
    /// MachineSet controller: machines were created.
    SetCreateMachines,
    /// MachineSet controller: a machine was deleted.
    SetDeleteMachine,
    /// MachineSet controller: the set's status was written.
    SetStatus,
    /// MachineDeployment controller: the new set was created.
    RolloutCreateSet,
    /// MachineDeployment controller: a set was patched (scaled, annotated).
    RolloutPatchSet,
    /// MachineDeployment controller: the deployment's revision annotation was written.
    RolloutRevision,
    /// MachineDeployment controller: the deployment's status was written.
    RolloutStatus,
    /// MachineDeployment controller: a node got the marks of a rollout (scale-down-disabled annotation, taint).
    RolloutNodeMarks,
    /// MachineDeployment controller: an old set beyond the revision history limit was deleted.
    RolloutCleanup,
}

impl CrashPoint {
    /// Every crash point, in the order of the flows.
    pub const ALL: [Self; 36] = [
        Self::MachineFinalizer,
        Self::CreateGetMachineStatus,
        Self::CreateCreateMachine,
        Self::CreateRecord,
        Self::CreateInitializeMachine,
        Self::CreateFinishRecord,
        Self::CreateStatus,
        Self::CreateErrorStatus,
        Self::CreateFail,
        Self::MachineHealthStatus,
        Self::MachineNodeSync,
        Self::DeletionStepWrite,
        Self::DeletionGetVmStatus,
        Self::DeletionDrain,
        Self::DeletionVolumeAttachments,
        Self::DeletionDeleteVm,
        Self::DeletionNodeFinalizer,
        Self::DeletionDeleteNode,
        Self::DeletionRemoveFinalizer,
        Self::DeletionNodeLabel,
        Self::DeletionNextStepWrite,
        Self::DrainCordon,
        Self::DrainEvictions,
        Self::DrainForceDeletions,
        Self::DrainVolumePod,
        Self::SetAdopt,
        Self::SetFinalizer,
        Self::SetCreateMachines,
        Self::SetDeleteMachine,
        Self::SetStatus,
        Self::RolloutCreateSet,
        Self::RolloutPatchSet,
        Self::RolloutRevision,
        Self::RolloutStatus,
        Self::RolloutNodeMarks,
        Self::RolloutCleanup,
    ];

    /// The point's name in the `fail` registry: `crash::` and the variant's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::MachineFinalizer => "crash::MachineFinalizer",
            Self::CreateGetMachineStatus => "crash::CreateGetMachineStatus",
            Self::CreateCreateMachine => "crash::CreateCreateMachine",
            Self::CreateRecord => "crash::CreateRecord",
            Self::CreateInitializeMachine => "crash::CreateInitializeMachine",
            Self::CreateFinishRecord => "crash::CreateFinishRecord",
            Self::CreateStatus => "crash::CreateStatus",
            Self::CreateErrorStatus => "crash::CreateErrorStatus",
            Self::CreateFail => "crash::CreateFail",
            Self::MachineHealthStatus => "crash::MachineHealthStatus",
            Self::MachineNodeSync => "crash::MachineNodeSync",
            Self::DeletionStepWrite => "crash::DeletionStepWrite",
            Self::DeletionGetVmStatus => "crash::DeletionGetVmStatus",
            Self::DeletionDrain => "crash::DeletionDrain",
            Self::DeletionVolumeAttachments => "crash::DeletionVolumeAttachments",
            Self::DeletionDeleteVm => "crash::DeletionDeleteVm",
            Self::DeletionNodeFinalizer => "crash::DeletionNodeFinalizer",
            Self::DeletionDeleteNode => "crash::DeletionDeleteNode",
            Self::DeletionRemoveFinalizer => "crash::DeletionRemoveFinalizer",
            Self::DeletionNodeLabel => "crash::DeletionNodeLabel",
            Self::DeletionNextStepWrite => "crash::DeletionNextStepWrite",
            Self::DrainCordon => "crash::DrainCordon",
            Self::DrainEvictions => "crash::DrainEvictions",
            Self::DrainForceDeletions => "crash::DrainForceDeletions",
            Self::DrainVolumePod => "crash::DrainVolumePod",
            Self::SetAdopt => "crash::SetAdopt",
            Self::SetFinalizer => "crash::SetFinalizer",
            Self::SetCreateMachines => "crash::SetCreateMachines",
            Self::SetDeleteMachine => "crash::SetDeleteMachine",
            Self::SetStatus => "crash::SetStatus",
            Self::RolloutCreateSet => "crash::RolloutCreateSet",
            Self::RolloutPatchSet => "crash::RolloutPatchSet",
            Self::RolloutRevision => "crash::RolloutRevision",
            Self::RolloutStatus => "crash::RolloutStatus",
            Self::RolloutNodeMarks => "crash::RolloutNodeMarks",
            Self::RolloutCleanup => "crash::RolloutCleanup",
        }
    }

    /// The point right after a status write of the machine controller, by the phase it writes.
    pub fn after_status_write(phase: Option<MachinePhase>) -> Self {
        match phase {
            Some(MachinePhase::Pending | MachinePhase::Available) => Self::CreateStatus,
            Some(MachinePhase::CrashLoopBackOff) => Self::CreateErrorStatus,
            Some(MachinePhase::Failed) => Self::CreateFail,
            _ => Self::MachineHealthStatus,
        }
    }

    /// The point right after a provider call of the creation flow (`None`: no call was made).
    pub fn after_creation_call(outcome: Option<&CallOutcome>) -> Option<Self> {
        outcome.map(|outcome| match outcome {
            CallOutcome::GetMachineStatus(_) => Self::CreateGetMachineStatus,
            CallOutcome::CreateMachine { .. } => Self::CreateCreateMachine,
            CallOutcome::InitializeMachine { .. } => Self::CreateInitializeMachine,
        })
    }

    /// The point right after the effect of a deletion step: its action, or for [`DeletionStep::SetTerminating`]
    /// (which has none) the Terminating write.
    pub fn after_deletion_step(step: DeletionStep) -> Self {
        match step {
            DeletionStep::SetTerminating => Self::DeletionStepWrite,
            DeletionStep::GetVmStatus => Self::DeletionGetVmStatus,
            DeletionStep::Drain => Self::DeletionDrain,
            DeletionStep::DeleteVolumeAttachments => Self::DeletionVolumeAttachments,
            DeletionStep::DeleteVm => Self::DeletionDeleteVm,
            DeletionStep::DeleteNode => Self::DeletionDeleteNode,
            DeletionStep::RemoveFinalizer => Self::DeletionRemoveFinalizer,
        }
    }
}

/// The armed points, each with the prefixes it is armed for (several tests may arm the same point).
static ARMED: Mutex<BTreeMap<CrashPoint, BTreeSet<String>>> = Mutex::new(BTreeMap::new());

/// The points that fired, with the scope each fired for.
static FIRED: Mutex<BTreeMap<CrashPoint, Vec<String>>> = Mutex::new(BTreeMap::new());

/// Arms `point` for the objects whose name starts with `prefix`: the next controller to reach it for such an object
/// crashes there, once.
///
/// # Panics
/// If the `fail` crate refuses the configuration (it never does for `return`).
pub fn arm(point: CrashPoint, prefix: &str) {
    let mut armed = ARMED.lock().unwrap_or_else(PoisonError::into_inner);
    armed.entry(point).or_default().insert(prefix.to_owned());
    if let Err(err) = fail::cfg(point.name(), "return") {
        panic!("arming {}: {err}", point.name());
    }
}

/// Disarms `point` for `prefix` (whether or not it fired).
pub fn disarm(point: CrashPoint, prefix: &str) {
    let mut armed = ARMED.lock().unwrap_or_else(PoisonError::into_inner);
    let prefixes = armed.entry(point).or_default();
    prefixes.remove(prefix);
    if prefixes.is_empty() {
        armed.remove(&point);
        fail::remove(point.name());
    }
}

/// The scopes `point` fired for whose name starts with `prefix`.
pub fn fired(point: CrashPoint, prefix: &str) -> Vec<String> {
    FIRED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&point)
        .into_iter()
        .flatten()
        .filter(|scope| scope.starts_with(prefix))
        .cloned()
        .collect()
}

/// Called by `crash_point!`: crashes when `point` is armed for a prefix of `scope`, and disarms it for that prefix.
///
/// # Panics
/// That is the crash: when `point` is armed for a prefix of `scope`.
pub fn reached(point: CrashPoint, scope: &str) {
    fail::fail_point!(point.name(), |_| {
        let prefix = ARMED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&point)
            .and_then(|prefixes| prefixes.iter().find(|p| scope.starts_with(p.as_str())).cloned());
        if let Some(prefix) = prefix {
            disarm(point, &prefix);
            FIRED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(point)
                .or_default()
                .push(scope.to_owned());
            tracing::warn!(
                point = point.name(),
                scope,
                "crash point reached: the controller stops here"
            );
            panic!("crash point {} reached for {scope}", point.name());
        }
    });
}
