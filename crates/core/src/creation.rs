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
//! marked Failed at that instant without another provider call. Retries follow [`crate::retry_policy`].
//!
//! Spec 003 ("never two VMs for one machine"; providerID and nodeRef never change once set) is enforced here: a
//! providerID or node label once recorded is never overwritten, and a machine whose recorded VM is reported
//! `NotFound` is marked Failed at once instead of getting a second VM (the reference, seeing `NotFound` for a machine
//! with a node label, carries on as if the VM existed).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::NodeAddress;
use mcm_api::{
    Machine, MachineOperationType, MachinePhase, MachineState,
    keys::{annotations, labels},
};
use mcm_driver::{
    CreateMachineResponse, DriverError, DriverMethod, GetMachineStatusResponse, InitializeMachineResponse,
    MachineCode,
};
use serde_json::{Map, Value, json};

use crate::{
    descriptions::{Description, Redactor},
    retry_policy::{self, RetryDecision},
    status::{StatusUpdate, operation, phase_status},
    timeouts::{self, ControllerSettings},
};

/// What the creation flow knows about the machine's VM.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VmInfo {
    /// The provider's ID of the VM ("" when not known).
    pub provider_id: String,
    /// The name the VM's node registers with ("" when not known).
    pub node_name: String,
    /// Opaque provider state to save on the machine ("" when none).
    pub last_known_state: String,
    /// The VM's addresses (recorded only without a target cluster).
    pub addresses: Vec<NodeAddress>,
}

impl VmInfo {
    /// The VM as the machine records it (spec.providerID and label `node`).
    pub fn recorded(machine: &Machine) -> Self {
        Self {
            provider_id: machine.spec.provider_id.clone(),
            node_name: node_label(machine).unwrap_or_default().to_owned(),
            ..Self::default()
        }
    }

    /// Fills what `self` does not know from `other`.
    fn or(mut self, other: Self) -> Self {
        if self.provider_id.is_empty() {
            self.provider_id = other.provider_id;
        }
        if self.node_name.is_empty() {
            self.node_name = other.node_name;
        }
        if self.last_known_state.is_empty() {
            self.last_known_state = other.last_known_state;
        }
        if self.addresses.is_empty() {
            self.addresses = other.addresses;
        }
        self
    }
}

impl From<&GetMachineStatusResponse> for VmInfo {
    fn from(r: &GetMachineStatusResponse) -> Self {
        Self {
            provider_id: r.provider_id.clone(),
            node_name: r.node_name.clone(),
            last_known_state: String::new(),
            addresses: r.addresses.clone(),
        }
    }
}

impl From<&CreateMachineResponse> for VmInfo {
    fn from(r: &CreateMachineResponse) -> Self {
        Self {
            provider_id: r.provider_id.clone(),
            node_name: r.node_name.clone(),
            last_known_state: r.last_known_state.clone(),
            addresses: r.addresses.clone(),
        }
    }
}

impl From<&InitializeMachineResponse> for VmInfo {
    fn from(r: &InitializeMachineResponse) -> Self {
        Self {
            provider_id: r.provider_id.clone(),
            node_name: r.node_name.clone(),
            last_known_state: String::new(),
            addresses: r.addresses.clone(),
        }
    }
}

fn node_label(machine: &Machine) -> Option<&str> {
    machine
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::NODE))
        .map(String::as_str)
        .filter(|n| !n.is_empty())
}

/// What to record on the machine about its VM (a metadata/spec update, before any further call). Only what is not
/// recorded yet: a providerID or node label once set is never changed (spec 003).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct VmRecord {
    /// Set `spec.providerID`.
    pub provider_id: Option<String>,
    /// Set the label `node`.
    pub node_label: Option<String>,
    /// Set the annotation `machinepriority.machine.sapcloud.io` to its default `3` (it is absent).
    pub priority_annotation: bool,
}

impl VmRecord {
    /// What `machine` still lacks of `vm`; `None` when it records everything already.
    pub fn for_vm(machine: &Machine, vm: &VmInfo) -> Option<Self> {
        let provider_id = (machine.spec.provider_id.is_empty() && !vm.provider_id.is_empty())
            .then(|| vm.provider_id.clone());
        let node_label =
            (node_label(machine).is_none() && !vm.node_name.is_empty()).then(|| vm.node_name.clone());
        let priority_annotation = machine
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::MACHINE_PRIORITY))
            .is_none_or(String::is_empty);
        let record = Self {
            provider_id,
            node_label,
            priority_annotation,
        };
        (record != Self::default()).then_some(record)
    }

    /// The JSON merge patch of the machine (main resource) that records this.
    pub fn merge_patch(&self) -> Value {
        let mut metadata = Map::new();
        if let Some(node) = &self.node_label {
            metadata.insert("labels".into(), json!({ labels::NODE: node }));
        }
        if self.priority_annotation {
            metadata.insert(
                "annotations".into(),
                json!({ annotations::MACHINE_PRIORITY: annotations::MACHINE_PRIORITY_DEFAULT }),
            );
        }
        let mut patch = Map::new();
        if !metadata.is_empty() {
            patch.insert("metadata".into(), Value::Object(metadata));
        }
        if let Some(provider_id) = &self.provider_id {
            patch.insert("spec".into(), json!({ "providerID": provider_id }));
        }
        Value::Object(patch)
    }
}

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

/// Whether the machine is in the creation flow: not being deleted, not Failed or Terminating, and without a recorded
/// VM or without a phase or in CrashLoopBackOff. (The reference also runs the flow for a Failed machine without a
/// providerID; a Failed machine is to be replaced, never to get a VM.)
pub fn needs_creation(machine: &Machine) -> bool {
    if machine.metadata.deletion_timestamp.is_some() {
        return false;
    }
    match machine.phase() {
        Some(MachinePhase::Failed | MachinePhase::Terminating) => false,
        None | Some(MachinePhase::CrashLoopBackOff) => true,
        Some(_) => machine.spec.provider_id.is_empty(),
    }
}

/// The instant a creation that keeps failing turns the machine Failed: its creation timestamp plus the effective
/// creation timeout. A machine without a creation timestamp (never stored by an API server) has no deadline
/// ([`Timestamp::MAX`]). The controller sets a timer at this instant for a machine in CrashLoopBackOff.
pub fn crash_loop_deadline(machine: &Machine, settings: &ControllerSettings) -> Timestamp {
    timeouts::created_at(machine).map_or(Timestamp::MAX, |created| {
        timeouts::add(created, timeouts::effective_creation_timeout(machine, settings))
    })
}

/// The phase of a failed creation at `now`: Failed exactly when `now ≥` [`crash_loop_deadline`], else
/// CrashLoopBackOff.
pub fn failure_phase(machine: &Machine, settings: &ControllerSettings, now: Timestamp) -> MachinePhase {
    if now >= crash_loop_deadline(machine, settings) {
        MachinePhase::Failed
    } else {
        MachinePhase::CrashLoopBackOff
    }
}

/// The next step of the creation flow: with `last_call` `None` at the start of a pass, else with the outcome of the
/// call the previous step asked for.
pub fn decide(input: &CreationInput<'_>, last_call: Option<&CallOutcome>) -> CreationStep {
    let machine = input.machine;
    match last_call {
        None => start(input),
        Some(CallOutcome::GetMachineStatus(Ok(response))) => {
            // The VM exists: adopt it. A recorded identity wins over the provider's (spec 003).
            let vm = VmInfo::recorded(machine).or(VmInfo::from(response));
            // The flow is not over (no phase, or CrashLoopBackOff), so this VM's initialization is not known to
            // have succeeded: a crash between CreateMachine and InitializeMachine, or CreateMachine's answer lost
            // to the call timeout, leaves exactly this state. Providers must answer Uninitialized for such a VM
            // (spec 002 section 11); the flow does not rely on them alone and initializes before it adopts (the
            // spec makes InitializeMachine safe to repeat: "Initialization is reattempted"). The phase written at
            // the end of the flow is the durable record that initialization is done: no extra write.
            if let Some(step) = missing_identity(input, &vm, DriverMethod::GetMachineStatus) {
                return step;
            }
            initialize(machine, vm)
        }
        Some(CallOutcome::GetMachineStatus(Err(error))) => match error.code {
            MachineCode::NotFound | MachineCode::Unimplemented if machine.spec.provider_id.is_empty() => {
                CreationStep::CallCreateMachine
            }
            MachineCode::NotFound => fail(
                input,
                &Description::VmVanished {
                    machine: machine_name(machine),
                    provider_id: machine.spec.provider_id.clone(),
                },
                None,
            ),
            // The provider cannot tell, or says the VM is not initialized; the machine records its VM: initialize
            // it, then carry on with it.
            MachineCode::Unimplemented | MachineCode::Uninitialized => {
                initialize(machine, VmInfo::recorded(machine))
            }
            _ => record_error(input, DriverMethod::GetMachineStatus, error),
        },
        Some(CallOutcome::CreateMachine {
            result: Ok(response),
            node_exists,
        }) => {
            let vm = VmInfo::from(response);
            if *node_exists
                && !vm.node_name.is_empty()
                && Some(vm.node_name.as_str()) != machine.metadata.name.as_deref()
            {
                let status = failed_status(input, &Description::VmUsingOldNode, None);
                return CreationStep::DeleteStaleVm { vm, status };
            }
            if let Some(step) = missing_identity(input, &vm, DriverMethod::CreateMachine) {
                return step;
            }
            initialize(machine, vm)
        }
        Some(CallOutcome::CreateMachine {
            result: Err(error), ..
        }) => record_error(input, DriverMethod::CreateMachine, error),
        Some(CallOutcome::InitializeMachine { vm, result }) => match result {
            Ok(response) => finish(
                input,
                &vm.clone().or(VmInfo::from(response)),
                DriverMethod::InitializeMachine,
            ),
            // The InitializeMachine table: NotFound and Unimplemented skip initialization.
            Err(error) if matches!(error.code, MachineCode::NotFound | MachineCode::Unimplemented) => {
                finish(input, vm, DriverMethod::InitializeMachine)
            }
            Err(error) => record_error(input, DriverMethod::InitializeMachine, error),
        },
    }
}

/// Record what the machine lacks of `vm`, then call `InitializeMachine`: the providerID is on the machine before the
/// call, so that nothing after it can lead to a second VM.
fn initialize(machine: &Machine, vm: VmInfo) -> CreationStep {
    CreationStep::CallInitializeMachine {
        record: VmRecord::for_vm(machine, &vm),
        vm,
    }
}

fn machine_name(machine: &Machine) -> String {
    machine.metadata.name.clone().unwrap_or_default()
}

fn start(input: &CreationInput<'_>) -> CreationStep {
    let machine = input.machine;
    if !needs_creation(machine) {
        return CreationStep::Skip;
    }
    if machine.phase() == Some(MachinePhase::CrashLoopBackOff)
        && !input.node_ready
        && input.now >= crash_loop_deadline(machine, input.settings)
    {
        let last_error = machine
            .status
            .as_ref()
            .map(|s| s.last_operation.description.clone())
            .unwrap_or_default();
        let description = Description::CreationTimedOut {
            machine: machine_name(machine),
            timeout: timeouts::effective_creation_timeout(machine, input.settings),
            last_error,
        };
        let error_code = machine
            .status
            .as_ref()
            .and_then(|s| MachineCode::from_name(&s.last_operation.error_code));
        return fail(input, &description, error_code);
    }
    CreationStep::CallGetMachineStatus
}

/// The Failed status of a machine whose recorded VM the provider no longer knows (GetMachineStatus NotFound while
/// the providerID is set). Spec 003: a machine never gets a second VM; its set replaces it instead.
pub fn vanished_status(machine: &Machine, now: Timestamp) -> StatusUpdate {
    let description = Description::VmVanished {
        machine: machine_name(machine),
        provider_id: machine.spec.provider_id.clone(),
    };
    StatusUpdate {
        last_operation: Some(operation(
            &description,
            MachineState::Failed,
            Some(MachineOperationType::Create),
            Some(MachineCode::NotFound),
            now,
        )),
        current_status: Some(phase_status(
            machine.status.as_ref(),
            MachinePhase::Failed,
            false,
            now,
        )),
        ..StatusUpdate::default()
    }
}

/// A Failed status with a Create/Failed last operation.
fn failed_status(
    input: &CreationInput<'_>,
    description: &Description,
    error_code: Option<MachineCode>,
) -> StatusUpdate {
    let existing = input.machine.status.as_ref();
    StatusUpdate {
        last_operation: Some(operation(
            description,
            MachineState::Failed,
            Some(MachineOperationType::Create),
            error_code,
            input.now,
        )),
        current_status: Some(phase_status(existing, MachinePhase::Failed, false, input.now)),
        ..StatusUpdate::default()
    }
}

fn fail(
    input: &CreationInput<'_>,
    description: &Description,
    error_code: Option<MachineCode>,
) -> CreationStep {
    CreationStep::Fail {
        status: failed_status(input, description, error_code),
    }
}

/// An `Internal` error when the provider left out what the flow needs: a providerID always, a node name with a target
/// cluster.
fn missing_identity(input: &CreationInput<'_>, vm: &VmInfo, method: DriverMethod) -> Option<CreationStep> {
    let missing = if vm.provider_id.is_empty() {
        "no providerID"
    } else if input.has_target_cluster && vm.node_name.is_empty() {
        "no node name"
    } else {
        return None;
    };
    let error = DriverError::internal(format!(
        "the provider answered {} for machine {} with {missing}",
        method.name(),
        machine_name(input.machine)
    ));
    Some(record_error(input, method, &error))
}

fn finish(input: &CreationInput<'_>, vm: &VmInfo, method: DriverMethod) -> CreationStep {
    if let Some(step) = missing_identity(input, vm, method) {
        return step;
    }
    let machine = input.machine;
    let record = VmRecord::for_vm(machine, vm);
    let status = matches!(machine.phase(), None | Some(MachinePhase::CrashLoopBackOff)).then(|| {
        let phase = if input.has_target_cluster {
            MachinePhase::Pending
        } else {
            MachinePhase::Available
        };
        StatusUpdate {
            last_operation: Some(operation(
                &Description::CreatingMachine,
                MachineState::Processing,
                Some(MachineOperationType::Create),
                None,
                input.now,
            )),
            current_status: Some(phase_status(
                machine.status.as_ref(),
                phase,
                phase == MachinePhase::Pending,
                input.now,
            )),
            last_known_state: (!vm.last_known_state.is_empty()).then(|| vm.last_known_state.clone()),
            addresses: (!input.has_target_cluster && !vm.addresses.is_empty()).then(|| vm.addresses.clone()),
            conditions: None,
        }
    });
    CreationStep::Finish { record, status }
}

fn record_error(input: &CreationInput<'_>, method: DriverMethod, error: &DriverError) -> CreationStep {
    let machine = input.machine;
    let description = if method == DriverMethod::InitializeMachine {
        Description::initialization_failed(error, input.redactor)
    } else {
        Description::provider_error(error, input.redactor)
    };
    let phase = if input.node_ready {
        MachinePhase::CrashLoopBackOff
    } else {
        failure_phase(machine, input.settings, input.now)
    };
    let retry = retry_policy::decide(
        method,
        error.code,
        input.failures,
        input.random,
        &input.settings.retry,
    );
    let requeue_after = (phase == MachinePhase::CrashLoopBackOff).then(|| {
        if input.node_ready {
            return retry.requeue_after();
        }
        let until_deadline = timeouts::elapsed(input.now, crash_loop_deadline(machine, input.settings));
        retry.requeue_after().min(until_deadline)
    });
    CreationStep::RecordError {
        status: StatusUpdate {
            last_operation: Some(operation(
                &description,
                MachineState::Failed,
                Some(MachineOperationType::Create),
                Some(error.code),
                input.now,
            )),
            current_status: Some(phase_status(machine.status.as_ref(), phase, false, input.now)),
            ..StatusUpdate::default()
        },
        retry,
        requeue_after,
        method,
        code: error.code,
    }
}

/// Why the flow cannot start with the class's secret, as a recorded error: the secret has to change, so the
/// machine waits for that change (`reason` comes from [`crate::userdata`] errors, which never hold secret values).
pub fn secret_problem(input: &CreationInput<'_>, reason: &str) -> CreationStep {
    // InvalidArgument is an N code of CreateMachine: the error is recorded and the machine waits for a change.
    record_error(
        input,
        DriverMethod::CreateMachine,
        &DriverError::invalid_argument(reason),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use mcm_api::MachineStatus;
    use pretty_assertions::assert_eq;

    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    const CREATED: i64 = 1_000_000;

    fn new_machine() -> Machine {
        let mut m = Machine::default();
        m.metadata.name = Some("m-1".into());
        m.metadata.namespace = Some("ns".into());
        m.metadata.creation_timestamp = Some(Time(at(CREATED)));
        m
    }

    fn with_phase(mut m: Machine, phase: MachinePhase, description: &str) -> Machine {
        let mut status = m.status.take().unwrap_or_default();
        status.current_status.phase = Some(phase);
        status.current_status.last_update_time = Some(Time(at(CREATED + 5)));
        status.last_operation.description = description.into();
        m.status = Some(status);
        m
    }

    fn recorded(mut m: Machine) -> Machine {
        m.spec.provider_id = "sim:///m-1".into();
        m.metadata.labels = Some(BTreeMap::from([(labels::NODE.to_owned(), "m-1".to_owned())]));
        m.metadata.annotations = Some(BTreeMap::from([(
            annotations::MACHINE_PRIORITY.to_owned(),
            "3".to_owned(),
        )]));
        m
    }

    struct Fixture {
        settings: ControllerSettings,
        redactor: Redactor,
    }

    impl Fixture {
        fn new() -> Self {
            Self {
                settings: ControllerSettings::default(),
                redactor: Redactor::new(),
            }
        }

        fn input<'a>(&'a self, machine: &'a Machine, now: i64) -> CreationInput<'a> {
            CreationInput {
                machine,
                settings: &self.settings,
                now: at(now),
                has_target_cluster: true,
                failures: 1,
                random: 0.0,
                redactor: &self.redactor,
                node_ready: false,
            }
        }
    }

    fn vm() -> GetMachineStatusResponse {
        GetMachineStatusResponse {
            provider_id: "sim:///m-1".into(),
            node_name: "m-1".into(),
            addresses: vec![],
        }
    }

    fn created() -> CreateMachineResponse {
        CreateMachineResponse {
            provider_id: "sim:///m-1".into(),
            node_name: "m-1".into(),
            last_known_state: "state-1".into(),
            addresses: vec![],
        }
    }

    fn err(code: MachineCode) -> DriverError {
        DriverError::new(code, "boom")
    }

    #[test]
    fn a_new_machine_starts_with_get_machine_status() {
        let f = Fixture::new();
        let m = new_machine();
        assert_eq!(
            decide(&f.input(&m, CREATED + 1), None),
            CreationStep::CallGetMachineStatus
        );
    }

    #[test]
    fn machines_with_a_vm_and_a_phase_failed_or_deleting_are_not_in_the_flow() {
        let f = Fixture::new();
        let running = with_phase(recorded(new_machine()), MachinePhase::Running, "");
        assert_eq!(decide(&f.input(&running, CREATED + 1), None), CreationStep::Skip);
        let failed = with_phase(new_machine(), MachinePhase::Failed, "");
        assert_eq!(decide(&f.input(&failed, CREATED + 1), None), CreationStep::Skip);
        let mut deleting = new_machine();
        deleting.metadata.deletion_timestamp = Some(Time(at(CREATED + 1)));
        assert!(!needs_creation(&deleting));
        let pending_without_vm = with_phase(new_machine(), MachinePhase::Pending, "");
        assert!(needs_creation(&pending_without_vm));
    }

    #[test]
    fn not_found_or_unimplemented_without_a_provider_id_creates() {
        let f = Fixture::new();
        let m = new_machine();
        for code in [MachineCode::NotFound, MachineCode::Unimplemented] {
            let outcome = CallOutcome::GetMachineStatus(Err(err(code)));
            assert_eq!(
                decide(&f.input(&m, CREATED + 1), Some(&outcome)),
                CreationStep::CallCreateMachine
            );
        }
    }

    /// Issue: after a lost CreateMachine answer (call timeout) the next pass found the VM and adopted it
    /// uninitialized. A VM found while the flow is not over is recorded, initialized, then the flow finishes.
    #[test]
    fn an_unrecorded_vm_is_recorded_and_initialized_before_it_is_adopted() {
        let f = Fixture::new();
        let m = new_machine();
        let outcome = CallOutcome::GetMachineStatus(Ok(vm()));
        let CreationStep::CallInitializeMachine { record, vm } =
            decide(&f.input(&m, CREATED + 1), Some(&outcome))
        else {
            panic!("an unrecorded VM is initialized first")
        };
        let record = record.unwrap();
        assert_eq!(record.provider_id.as_deref(), Some("sim:///m-1"));
        assert_eq!(record.node_label.as_deref(), Some("m-1"));
        assert!(record.priority_annotation);
        assert_eq!(
            record.merge_patch(),
            json!({
                "metadata": {
                    "labels": {"node": "m-1"},
                    "annotations": {"machinepriority.machine.sapcloud.io": "3"}
                },
                "spec": {"providerID": "sim:///m-1"}
            })
        );
        // The controller applied the record; initialization succeeds: the phase is Pending, nothing else to record.
        let m = recorded(m);
        let outcome = CallOutcome::InitializeMachine {
            vm,
            result: Ok(InitializeMachineResponse::default()),
        };
        let CreationStep::Finish { record, status } = decide(&f.input(&m, CREATED + 2), Some(&outcome))
        else {
            panic!("finish")
        };
        assert_eq!(record, None);
        let status = status.unwrap();
        assert_eq!(status.phase(), Some(MachinePhase::Pending));
        assert_eq!(status.description(), Some(Description::CreatingMachine));
        let op = status.last_operation.as_ref().unwrap();
        assert_eq!(op.r#type, Some(MachineOperationType::Create));
        assert_eq!(op.state, Some(MachineState::Processing));
        assert!(status.current_status.as_ref().unwrap().timeout_active);
    }

    /// Issue: a crash between CreateMachine and InitializeMachine skipped initialization for good when the provider
    /// answered OK after the restart. A recorded VM of a machine whose flow is not over (no phase, or
    /// CrashLoopBackOff) is initialized whatever GetMachineStatus says of it.
    #[test]
    fn a_recorded_vm_is_initialized_after_a_restart_whatever_the_provider_says() {
        let f = Fixture::new();
        for m in [
            recorded(new_machine()),
            recorded(with_phase(new_machine(), MachinePhase::CrashLoopBackOff, "x")),
        ] {
            for outcome in [
                CallOutcome::GetMachineStatus(Ok(vm())),
                CallOutcome::GetMachineStatus(Err(err(MachineCode::Unimplemented))),
                CallOutcome::GetMachineStatus(Err(err(MachineCode::Uninitialized))),
            ] {
                assert_eq!(
                    decide(&f.input(&m, CREATED + 1), Some(&outcome)),
                    CreationStep::CallInitializeMachine {
                        record: None,
                        vm: VmInfo::recorded(&m)
                    },
                    "{outcome:?}"
                );
            }
        }
    }

    #[test]
    fn a_created_vm_is_recorded_before_initialization_then_pending() {
        let f = Fixture::new();
        let m = new_machine();
        let outcome = CallOutcome::CreateMachine {
            result: Ok(created()),
            node_exists: false,
        };
        let CreationStep::CallInitializeMachine { record, vm } =
            decide(&f.input(&m, CREATED + 1), Some(&outcome))
        else {
            panic!("initialize next")
        };
        assert_eq!(record.unwrap().provider_id.as_deref(), Some("sim:///m-1"));
        // The controller applied the record; initialization is not implemented by the provider.
        let m = recorded(m);
        let outcome = CallOutcome::InitializeMachine {
            vm,
            result: Err(err(MachineCode::Unimplemented)),
        };
        let CreationStep::Finish { record, status } = decide(&f.input(&m, CREATED + 2), Some(&outcome))
        else {
            panic!("finish")
        };
        assert_eq!(record, None);
        let status = status.unwrap();
        assert_eq!(status.phase(), Some(MachinePhase::Pending));
        assert_eq!(status.last_known_state.as_deref(), Some("state-1"));
    }

    /// Spec 002 section 11 sends a machine whose initialization fails to CrashLoopBackOff and, as any creation
    /// failure, to Failed at the creation timeout. The creation timeout is the time a VM has to become a node:
    /// a machine whose node is healthy is never failed by it (a provider outage must not replace healthy machines).
    #[test]
    fn a_machine_whose_node_is_ready_is_never_failed_by_the_creation_timeout() {
        let f = Fixture::new();
        let deadline = CREATED
            + ControllerSettings::default()
                .machine_creation_timeout
                .as_secs()
                .cast_signed();
        let m = recorded(with_phase(new_machine(), MachinePhase::CrashLoopBackOff, "x"));
        let mut input = f.input(&m, deadline + 60);
        input.node_ready = true;
        assert_eq!(decide(&input, None), CreationStep::CallGetMachineStatus);
        let outcome = CallOutcome::InitializeMachine {
            vm: VmInfo::recorded(&m),
            result: Err(err(MachineCode::Unavailable)),
        };
        let CreationStep::RecordError {
            status,
            retry,
            requeue_after,
            ..
        } = decide(&input, Some(&outcome))
        else {
            panic!("error")
        };
        assert_eq!(status.phase(), Some(MachinePhase::CrashLoopBackOff));
        assert!(matches!(retry, RetryDecision::Retry { .. }));
        assert_eq!(requeue_after, Some(retry.requeue_after()));
        // Without a healthy node the same failure at the same instant is Failed.
        input.node_ready = false;
        assert!(matches!(decide(&input, None), CreationStep::Fail { .. }));
        let CreationStep::RecordError { status, .. } = decide(&input, Some(&outcome)) else {
            panic!("error")
        };
        assert_eq!(status.phase(), Some(MachinePhase::Failed));
    }

    #[test]
    fn initialization_not_found_skips_and_uninitialized_retries() {
        let f = Fixture::new();
        let m = recorded(new_machine());
        let vm = VmInfo::recorded(&m);
        let skip = CallOutcome::InitializeMachine {
            vm: vm.clone(),
            result: Err(err(MachineCode::NotFound)),
        };
        assert!(matches!(
            decide(&f.input(&m, CREATED + 1), Some(&skip)),
            CreationStep::Finish { .. }
        ));
        let again = CallOutcome::InitializeMachine {
            vm,
            result: Err(err(MachineCode::Uninitialized)),
        };
        let CreationStep::RecordError {
            status,
            retry,
            requeue_after,
            ..
        } = decide(&f.input(&m, CREATED + 1), Some(&again))
        else {
            panic!("error")
        };
        assert!(matches!(retry, RetryDecision::Retry { .. }));
        assert_eq!(requeue_after, Some(Duration::from_secs(5)));
        assert_eq!(status.phase(), Some(MachinePhase::CrashLoopBackOff));
        assert_eq!(
            status.description(),
            Some(Description::InitializationFailed {
                code: MachineCode::Uninitialized,
                message: "boom".into()
            })
        );
        assert_eq!(status.last_operation.unwrap().error_code, "Uninitialized");
    }

    #[test]
    fn uninitialized_status_goes_to_initialization() {
        let f = Fixture::new();
        let m = recorded(with_phase(new_machine(), MachinePhase::CrashLoopBackOff, "x"));
        let outcome = CallOutcome::GetMachineStatus(Err(err(MachineCode::Uninitialized)));
        assert_eq!(
            decide(&f.input(&m, CREATED + 1), Some(&outcome)),
            CreationStep::CallInitializeMachine {
                record: None,
                vm: VmInfo::recorded(&m)
            }
        );
    }

    #[test]
    fn a_vanished_vm_fails_the_machine_and_never_creates_a_second_one() {
        let f = Fixture::new();
        let m = with_phase(recorded(new_machine()), MachinePhase::CrashLoopBackOff, "x");
        let outcome = CallOutcome::GetMachineStatus(Err(err(MachineCode::NotFound)));
        let CreationStep::Fail { status } = decide(&f.input(&m, CREATED + 1), Some(&outcome)) else {
            panic!("fail")
        };
        assert_eq!(status.phase(), Some(MachinePhase::Failed));
        assert_eq!(
            status.description(),
            Some(Description::VmVanished {
                machine: "m-1".into(),
                provider_id: "sim:///m-1".into()
            })
        );
    }

    #[test]
    fn a_recorded_identity_is_never_overwritten() {
        let f = Fixture::new();
        let m = recorded(new_machine());
        let other = GetMachineStatusResponse {
            provider_id: "sim:///other".into(),
            node_name: "other".into(),
            addresses: vec![],
        };
        let outcome = CallOutcome::GetMachineStatus(Ok(other.clone()));
        let CreationStep::CallInitializeMachine { record, vm } =
            decide(&f.input(&m, CREATED + 1), Some(&outcome))
        else {
            panic!("initialize")
        };
        assert_eq!(record, None);
        assert_eq!(
            vm.provider_id, "sim:///m-1",
            "the recorded VM is the one initialized"
        );
        let outcome = CallOutcome::InitializeMachine {
            vm,
            result: Ok(InitializeMachineResponse {
                provider_id: other.provider_id,
                node_name: other.node_name,
                addresses: vec![],
            }),
        };
        let CreationStep::Finish { record, status } = decide(&f.input(&m, CREATED + 1), Some(&outcome))
        else {
            panic!("finish")
        };
        assert_eq!(record, None);
        assert_eq!(status.unwrap().phase(), Some(MachinePhase::Pending));
    }

    #[test]
    fn unimplemented_status_with_a_recorded_vm_carries_on() {
        let f = Fixture::new();
        let m = recorded(with_phase(new_machine(), MachinePhase::CrashLoopBackOff, "x"));
        let outcome = CallOutcome::GetMachineStatus(Err(err(MachineCode::Unimplemented)));
        let CreationStep::CallInitializeMachine { vm, .. } =
            decide(&f.input(&m, CREATED + 1), Some(&outcome))
        else {
            panic!("initialize")
        };
        let outcome = CallOutcome::InitializeMachine {
            vm,
            result: Err(err(MachineCode::Unimplemented)),
        };
        let CreationStep::Finish { status, .. } = decide(&f.input(&m, CREATED + 1), Some(&outcome)) else {
            panic!("finish")
        };
        assert_eq!(status.unwrap().phase(), Some(MachinePhase::Pending));
    }

    #[test]
    fn transient_create_errors_back_off_in_crash_loop() {
        let f = Fixture::new();
        let m = new_machine();
        let outcome = CallOutcome::CreateMachine {
            result: Err(err(MachineCode::Unavailable)),
            node_exists: false,
        };
        let mut input = f.input(&m, CREATED + 60);
        input.failures = 4;
        let CreationStep::RecordError {
            status,
            retry,
            requeue_after,
            method,
            code,
        } = decide(&input, Some(&outcome))
        else {
            panic!("error")
        };
        assert_eq!(method, DriverMethod::CreateMachine);
        assert_eq!(code, MachineCode::Unavailable);
        assert_eq!(
            retry,
            RetryDecision::Retry {
                after: Duration::from_secs(40)
            }
        );
        assert_eq!(requeue_after, Some(Duration::from_secs(40)));
        assert_eq!(status.phase(), Some(MachinePhase::CrashLoopBackOff));
        let op = status.last_operation.unwrap();
        assert_eq!(
            op.description,
            "Cloud provider message - machine codes error: code = [Unavailable] message = [boom]"
        );
        assert_eq!(op.error_code, "Unavailable");
        assert_eq!(op.state, Some(MachineState::Failed));
    }

    #[test]
    fn configuration_errors_wait_for_a_change_but_not_past_the_deadline() {
        let f = Fixture::new();
        let m = new_machine();
        let outcome = CallOutcome::CreateMachine {
            result: Err(err(MachineCode::ResourceExhausted)),
            node_exists: false,
        };
        // 15 minutes after creation: 5 minutes to the 20m deadline, less than the 10m resync.
        let CreationStep::RecordError {
            retry,
            requeue_after,
            status,
            ..
        } = decide(&f.input(&m, CREATED + 15 * 60), Some(&outcome))
        else {
            panic!("error")
        };
        assert_eq!(
            retry,
            RetryDecision::AwaitChange {
                resync_after: Duration::from_mins(10)
            }
        );
        assert_eq!(requeue_after, Some(Duration::from_mins(5)));
        assert_eq!(
            status.last_operation.unwrap().error_code,
            "ResourceExhausted",
            "the cluster-autoscaler reads it"
        );
    }

    #[test]
    fn failures_at_or_after_the_deadline_are_failed() {
        let f = Fixture::new();
        let m = new_machine();
        let deadline = crash_loop_deadline(&m, &f.settings);
        assert_eq!(deadline, at(CREATED + 20 * 60));
        assert_eq!(
            failure_phase(&m, &f.settings, at(CREATED + 20 * 60 - 1)),
            MachinePhase::CrashLoopBackOff
        );
        assert_eq!(failure_phase(&m, &f.settings, deadline), MachinePhase::Failed);
        let outcome = CallOutcome::GetMachineStatus(Err(err(MachineCode::Internal)));
        let CreationStep::RecordError {
            status,
            requeue_after,
            ..
        } = decide(&f.input(&m, CREATED + 20 * 60), Some(&outcome))
        else {
            panic!("error")
        };
        assert_eq!(status.phase(), Some(MachinePhase::Failed));
        assert_eq!(requeue_after, None);
    }

    #[test]
    fn the_deadline_follows_the_effective_creation_timeout() {
        let mut m = new_machine();
        m.metadata.annotations = Some(BTreeMap::from([(
            annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
            "1h".to_owned(),
        )]));
        assert_eq!(
            crash_loop_deadline(&m, &ControllerSettings::default()),
            at(CREATED + 3600)
        );
        m.metadata.creation_timestamp = None;
        assert_eq!(
            crash_loop_deadline(&m, &ControllerSettings::default()),
            Timestamp::MAX
        );
    }

    #[test]
    fn crash_loop_turns_failed_at_the_deadline_without_a_provider_call() {
        let f = Fixture::new();
        let mut m = with_phase(
            new_machine(),
            MachinePhase::CrashLoopBackOff,
            "Cloud provider message - machine codes error: code = [ResourceExhausted] message = [quota]",
        );
        m.status.as_mut().unwrap().last_operation.error_code = "ResourceExhausted".into();
        assert_eq!(
            decide(&f.input(&m, CREATED + 20 * 60 - 1), None),
            CreationStep::CallGetMachineStatus
        );
        let CreationStep::Fail { status } = decide(&f.input(&m, CREATED + 20 * 60), None) else {
            panic!("fail")
        };
        assert_eq!(status.phase(), Some(MachinePhase::Failed));
        let Some(Description::CreationTimedOut {
            machine,
            timeout,
            last_error,
        }) = status.description()
        else {
            panic!("creation timed out")
        };
        assert_eq!(machine, "m-1");
        assert_eq!(timeout, Duration::from_mins(20));
        assert!(last_error.contains("quota"));
        assert_eq!(status.last_operation.unwrap().error_code, "ResourceExhausted");
    }

    #[test]
    fn the_stale_node_guard_deletes_the_new_vm() {
        let f = Fixture::new();
        let m = new_machine();
        let response = CreateMachineResponse {
            node_name: "old-node".into(),
            ..created()
        };
        let outcome = CallOutcome::CreateMachine {
            result: Ok(response),
            node_exists: true,
        };
        let CreationStep::DeleteStaleVm { vm, status } = decide(&f.input(&m, CREATED + 1), Some(&outcome))
        else {
            panic!("stale")
        };
        assert_eq!(vm.provider_id, "sim:///m-1");
        assert_eq!(status.phase(), Some(MachinePhase::Failed));
        assert_eq!(status.description(), Some(Description::VmUsingOldNode));

        // A node named as the machine is this machine's own node, joined early: not stale.
        let outcome = CallOutcome::CreateMachine {
            result: Ok(created()),
            node_exists: true,
        };
        assert!(matches!(
            decide(&f.input(&m, CREATED + 1), Some(&outcome)),
            CreationStep::CallInitializeMachine { .. }
        ));
    }

    #[test]
    fn a_provider_answer_without_identity_is_an_error() {
        let f = Fixture::new();
        let m = new_machine();
        let outcome = CallOutcome::CreateMachine {
            result: Ok(CreateMachineResponse {
                node_name: String::new(),
                ..created()
            }),
            node_exists: false,
        };
        let CreationStep::RecordError { code, status, .. } =
            decide(&f.input(&m, CREATED + 1), Some(&outcome))
        else {
            panic!("error")
        };
        assert_eq!(code, MachineCode::Internal);
        assert!(
            status
                .last_operation
                .unwrap()
                .description
                .contains("no node name")
        );

        // Without a target cluster no node name is needed, and the machine becomes Available with its addresses.
        let mut adopted = new_machine();
        adopted.spec.provider_id = "sim:///m-1".into();
        let mut input = f.input(&adopted, CREATED + 1);
        input.has_target_cluster = false;
        let outcome = CallOutcome::InitializeMachine {
            vm: VmInfo::recorded(&adopted),
            result: Ok(InitializeMachineResponse {
                provider_id: "sim:///m-1".into(),
                node_name: String::new(),
                addresses: vec![NodeAddress {
                    address: "10.0.0.1".into(),
                    type_: "InternalIP".into(),
                }],
            }),
        };
        let CreationStep::Finish { status, .. } = decide(&input, Some(&outcome)) else {
            panic!("finish")
        };
        let status = status.unwrap();
        assert_eq!(status.phase(), Some(MachinePhase::Available));
        assert_eq!(status.addresses.unwrap().len(), 1);
    }

    #[test]
    fn provider_messages_are_redacted() {
        let mut f = Fixture::new();
        f.redactor.add(b"super-secret-password");
        let m = new_machine();
        let outcome = CallOutcome::CreateMachine {
            result: Err(DriverError::new(
                MachineCode::InvalidArgument,
                "login with super-secret-password refused",
            )),
            node_exists: false,
        };
        let CreationStep::RecordError { status, .. } = decide(&f.input(&m, CREATED + 1), Some(&outcome))
        else {
            panic!("error")
        };
        let description = status.last_operation.unwrap().description;
        assert!(!description.contains("super-secret-password"), "{description}");
        assert!(description.contains("[redacted]"));
    }

    #[test]
    fn a_secret_problem_waits_for_a_change() {
        let f = Fixture::new();
        let m = new_machine();
        let CreationStep::RecordError { retry, status, .. } = secret_problem(
            &f.input(&m, CREATED + 1),
            "the secret of machine class \"c\" has no \"userData\" key",
        ) else {
            panic!("error")
        };
        assert!(matches!(retry, RetryDecision::AwaitChange { .. }));
        assert_eq!(status.phase(), Some(MachinePhase::CrashLoopBackOff));
    }

    #[test]
    fn repeating_a_finished_pass_writes_nothing() {
        let f = Fixture::new();
        let m = recorded(new_machine());
        let outcome = CallOutcome::InitializeMachine {
            vm: VmInfo::recorded(&m),
            result: Ok(InitializeMachineResponse::default()),
        };
        let CreationStep::Finish { status, .. } = decide(&f.input(&m, CREATED + 1), Some(&outcome)) else {
            panic!("finish")
        };
        let mut applied = m;
        let mut machine_status = MachineStatus::default();
        status.unwrap().apply(&mut machine_status);
        applied.status = Some(machine_status);
        // Pending with its VM: the flow is over.
        assert_eq!(decide(&f.input(&applied, CREATED + 2), None), CreationStep::Skip);
    }
}
