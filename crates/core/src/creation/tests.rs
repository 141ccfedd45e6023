//! Tests of the creation flow.

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;
use k8s_openapi::{api::core::v1::NodeAddress, apimachinery::pkg::apis::meta::v1::Time};
use mcm_api::{
    Machine, MachineOperationType, MachinePhase, MachineState, MachineStatus,
    builders::MachineBuilder,
    keys::{annotations, labels},
};
use mcm_driver::{
    CreateMachineResponse, DriverError, DriverMethod, GetMachineStatusResponse, InitializeMachineResponse,
    MachineCode,
};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;
use crate::{
    descriptions::{Description, Redactor},
    retry_policy::RetryDecision,
    timeouts::ControllerSettings,
};

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

const CREATED: i64 = 1_000_000;

fn new_machine() -> Machine {
    MachineBuilder::new("m-1")
        .namespace("ns")
        .created_at(at(CREATED))
        .build()
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
    let CreationStep::Finish { record, status } = decide(&f.input(&m, CREATED + 2), Some(&outcome)) else {
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
    let CreationStep::Finish { record, status } = decide(&f.input(&m, CREATED + 2), Some(&outcome)) else {
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
    let CreationStep::Finish { record, status } = decide(&f.input(&m, CREATED + 1), Some(&outcome)) else {
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
    let CreationStep::CallInitializeMachine { vm, .. } = decide(&f.input(&m, CREATED + 1), Some(&outcome))
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
    let CreationStep::DeleteStaleVm { vm, status } = decide(&f.input(&m, CREATED + 1), Some(&outcome)) else {
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
    let CreationStep::RecordError { code, status, .. } = decide(&f.input(&m, CREATED + 1), Some(&outcome))
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
    let CreationStep::RecordError { status, .. } = decide(&f.input(&m, CREATED + 1), Some(&outcome)) else {
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
