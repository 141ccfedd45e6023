//! The wire form keeps the reference's JSON names, inlining and string values exactly.

use kube::Resource;
use mcm_api::{
    ConditionStatus, CurrentStatus, LastOperation, Machine, MachineClass, MachineDeployment,
    MachineOperationType, MachinePhase, MachineSet, MachineSetCondition, MachineSetConditionType,
    MachineSetStatus, MachineState, MachineStatus,
};
use serde_json::json;

#[test]
fn kinds_identify_as_machine_sapcloud_io_v1alpha1() {
    assert_eq!(Machine::api_version(&()), "machine.sapcloud.io/v1alpha1");
    assert_eq!(Machine::plural(&()), "machines");
    assert_eq!(MachineSet::plural(&()), "machinesets");
    assert_eq!(MachineDeployment::plural(&()), "machinedeployments");
    assert_eq!(MachineClass::plural(&()), "machineclasses");
    assert_eq!(MachineClass::kind(&()), "MachineClass");
    let written = serde_json::to_value(Machine::default()).unwrap();
    assert_eq!(written["apiVersion"], "machine.sapcloud.io/v1alpha1");
    assert_eq!(written["kind"], "Machine");
}

#[test]
fn machine_configuration_is_inlined_into_the_spec() {
    let machine: Machine = serde_json::from_value(json!({
        "metadata": { "name": "m" },
        "spec": { "class": { "kind": "MachineClass", "name": "c" }, "providerID": "sim:///default/m",
                  "drainTimeout": "5m", "maxEvictRetries": 3, "nodeConditions": "ReadonlyFilesystem,KernelDeadlock" }
    }))
    .unwrap();
    assert_eq!(machine.spec.provider_id, "sim:///default/m");
    assert_eq!(machine.spec.configuration.max_evict_retries, Some(3));
    let spec = &serde_json::to_value(&machine).unwrap()["spec"];
    assert_eq!(spec["drainTimeout"], "5m");
    assert_eq!(spec["providerID"], "sim:///default/m");
    assert_eq!(spec["nodeConditions"], "ReadonlyFilesystem,KernelDeadlock");
    assert!(spec.get("configuration").is_none(), "inlined, not nested: {spec}");
}

#[test]
fn status_enums_serialize_to_the_reference_strings() {
    let status = MachineStatus {
        last_operation: LastOperation {
            description: "Creating machine on cloud provider".into(),
            error_code: "Unavailable".into(),
            state: Some(MachineState::Processing),
            r#type: Some(MachineOperationType::Create),
            last_update_time: None,
        },
        current_status: CurrentStatus {
            phase: Some(MachinePhase::CrashLoopBackOff),
            ..CurrentStatus::default()
        },
        ..MachineStatus::default()
    };
    let written = serde_json::to_value(&status).unwrap();
    assert_eq!(written["lastOperation"]["type"], "Create");
    assert_eq!(written["lastOperation"]["state"], "Processing");
    assert_eq!(written["lastOperation"]["errorCode"], "Unavailable");
    assert_eq!(written["currentStatus"]["phase"], "CrashLoopBackOff");
    for phase in MachinePhase::ALL {
        assert_eq!(serde_json::to_value(phase).unwrap(), phase.as_str());
    }
    for op in MachineOperationType::ALL {
        assert_eq!(serde_json::to_value(op).unwrap(), op.as_str());
    }
    for state in MachineState::ALL {
        assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
    }
}

#[test]
fn an_empty_phase_reads_as_new() {
    let status: MachineStatus = serde_json::from_value(
        json!({ "currentStatus": { "phase": "" }, "lastOperation": { "type": "", "state": "" } }),
    )
    .unwrap();
    assert_eq!(status.current_status.phase, None);
    assert_eq!(status.last_operation.r#type, None);
}

/// A newer reference, a mixed rollout or a rollback writes status values this build does not know: the object
/// must still be read (else a watch would drop it), and written back with the value unchanged.
#[test]
fn unknown_status_values_are_read_and_written_back_unchanged() {
    let machine = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": "m" },
        "spec": { "class": { "kind": "MachineClass", "name": "c" } },
        "status": {
            "currentStatus": { "phase": "Hibernating" },
            "lastOperation": { "state": "Queued", "type": "Resize", "description": "d" }
        }
    });
    let read: Machine =
        serde_json::from_value(machine.clone()).expect("an unknown value is no reason to refuse");
    let phase = read.phase().expect("a phase");
    assert!(!phase.is_recognized());
    assert_eq!(phase.as_str(), "Hibernating");
    assert!(!MachinePhase::ALL.contains(&phase));
    let operation = &read.status.as_ref().unwrap().last_operation;
    assert_eq!(operation.state.map(|s| s.to_string()).as_deref(), Some("Queued"));
    assert_eq!(operation.r#type.map(|t| t.to_string()).as_deref(), Some("Resize"));
    assert_eq!(serde_json::to_value(&read).unwrap(), machine);

    let set: MachineSetStatus = serde_json::from_value(json!({
        "machineSetCondition": [{ "type": "Degraded", "status": "Maybe" }]
    }))
    .unwrap();
    let condition = &set.conditions[0];
    assert_eq!(
        (condition.r#type.as_str(), condition.status.as_str()),
        ("Degraded", "Maybe")
    );
    assert!(!condition.r#type.is_recognized() && condition.status != ConditionStatus::Unknown);
}

#[test]
fn machine_set_conditions_keep_the_odd_json_name() {
    let status = MachineSetStatus {
        replicas: 2,
        conditions: vec![MachineSetCondition {
            r#type: MachineSetConditionType::Frozen,
            status: ConditionStatus::True,
            last_transition_time: None,
            reason: "OverShootingReplicaCount".into(),
            message: "frozen".into(),
        }],
        ..MachineSetStatus::default()
    };
    let written = serde_json::to_value(&status).unwrap();
    assert_eq!(written["machineSetCondition"][0]["type"], "Frozen");
    assert_eq!(written["machineSetCondition"][0]["status"], "True");
    assert!(written.get("conditions").is_none());
}

#[test]
fn an_unknown_strategy_type_is_kept_as_text_for_validation_to_report() {
    let deployment: MachineDeployment = serde_json::from_value(
        json!({ "metadata": { "name": "d" }, "spec": { "strategy": { "type": "Sideways" } } }),
    )
    .unwrap();
    assert_eq!(deployment.spec.strategy.strategy_type(), Err("Sideways"));
    assert_eq!(
        serde_json::to_value(&deployment).unwrap()["spec"]["strategy"]["type"],
        "Sideways"
    );
}

#[test]
fn machine_class_fields_sit_at_the_top_level_and_quantities_may_be_numbers() {
    let class: MachineClass = serde_json::from_value(json!({
        "metadata": { "name": "c" },
        "provider": "local",
        "providerSpec": { "vmPool": "p", "size": "small", "tags": { "kubernetes.io/cluster/demo": "1" } },
        "secretRef": { "name": "s", "namespace": "default" },
        "nodeTemplate": { "capacity": { "cpu": 2, "gpu": "0", "memory": "4Gi" }, "instanceType": "small",
                          "region": "local", "zone": "local-a" }
    }))
    .unwrap();
    assert_eq!(class.node_template.as_ref().unwrap().capacity["cpu"].0, "2");
    let written = serde_json::to_value(&class).unwrap();
    assert_eq!(written["providerSpec"]["vmPool"], "p");
    assert_eq!(written["secretRef"]["name"], "s");
    assert!(written.get("spec").is_none() && written.get("status").is_none());
}
