//! [`decide`]: the next step of the creation flow, CrashLoopBackOff and its deadline, Failed, the stale-node guard.
//!
//! Separate from the types it uses because this is the flow itself; [`super::VmRecord`] and [`super::CreationStep`] are its vocabulary.

use jiff::Timestamp;
use mcm_api::{Machine, MachineOperationType, MachinePhase, MachineState, MetaExt as _};
use mcm_driver::{DriverError, DriverMethod, MachineCode};

use super::{
    plan::{CallOutcome, CreationInput, CreationStep},
    vm::{VmInfo, VmRecord},
};
use crate::{
    descriptions::Description,
    retry_policy::{self},
    status::{StatusUpdate, operation, phase_status},
    timeouts::{self, ControllerSettings},
};

/// Whether the machine is in the creation flow: not being deleted, not Failed or Terminating, and without a recorded
/// VM or without a phase or in CrashLoopBackOff. (The reference also runs the flow for a Failed machine without a
/// providerID; a Failed machine is to be replaced, never to get a VM.)
pub fn needs_creation(machine: &Machine) -> bool {
    if machine.is_deleting() {
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

/// When a creation that keeps failing turns the machine Failed: [`crash_loop_deadline`], or never
/// ([`Timestamp::MAX`]) while the machine's node is healthy (the creation timeout is the time a VM has to become a
/// node). The one home of that rule: the flow's decisions and the controller's timer both use it.
pub fn failure_deadline(machine: &Machine, settings: &ControllerSettings, node_ready: bool) -> Timestamp {
    if node_ready {
        Timestamp::MAX
    } else {
        crash_loop_deadline(machine, settings)
    }
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
        && input.now >= failure_deadline(machine, input.settings, input.node_ready)
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
    let deadline = failure_deadline(machine, input.settings, input.node_ready);
    let phase = if input.now >= deadline {
        MachinePhase::Failed
    } else {
        MachinePhase::CrashLoopBackOff
    };
    let retry = retry_policy::decide(
        method,
        error.code,
        input.failures,
        input.random,
        &input.settings.retry,
    );
    let requeue_after = (phase == MachinePhase::CrashLoopBackOff)
        .then(|| retry.requeue_after().min(timeouts::elapsed(input.now, deadline)));
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
