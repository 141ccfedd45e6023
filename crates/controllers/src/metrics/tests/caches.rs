//! The gauges read from the machine, machine set and machine deployment caches, encoded as the reference does.

use k8s_openapi::api::core::v1::NodeCondition;
use mcm_api::{MachineDeployment, MachinePhase, MachineSet};

use super::{lines, machine, store_of};
use crate::metrics::{Metrics, condition_value, phase_value};

#[test]
fn phases_are_encoded_as_the_reference_does() {
    assert_eq!(phase_value(Some(MachinePhase::Terminating)), -4);
    assert_eq!(phase_value(Some(MachinePhase::Failed)), -3);
    assert_eq!(phase_value(Some(MachinePhase::CrashLoopBackOff)), -2);
    assert_eq!(phase_value(Some(MachinePhase::Unknown)), -1);
    assert_eq!(phase_value(Some(MachinePhase::Pending)), 0);
    assert_eq!(phase_value(Some(MachinePhase::Running)), 1);
    assert_eq!(phase_value(None), 0);
}

#[test]
fn machine_info_and_conditions_are_read_from_the_cache() {
    let metrics = Metrics::new();
    metrics.attach_machines(&crate::shared_cache::SharedCache::fixed(
        vec![
            machine("m1")
                .created_at("2024-01-02T03:04:05Z".parse().unwrap())
                .node("node-1")
                .label("name", "pool")
                .class("small")
                .with(|m| "machine.sapcloud.io".clone_into(&mut m.spec.class.api_group))
                .provider_id("sim://pool/1")
                .phase(MachinePhase::Running)
                .conditions(
                    [
                        ("Ready", "True"),
                        ("DiskPressure", "False"),
                        ("NetworkUnavailable", "Unknown"),
                    ]
                    .map(|(type_, status)| NodeCondition {
                        type_: type_.to_owned(),
                        status: status.to_owned(),
                        ..NodeCondition::default()
                    })
                    .to_vec(),
                )
                .build(),
            machine("m2").class("small").build(),
        ],
        true,
    ));
    let text = metrics.encode();
    assert!(text.contains("mcm_machine_items_total 2\n"), "{text}");
    assert!(
        text.contains(
            r#"mcm_machine_info{name="m1",namespace="ns",createdAt="1704164645",spec_provider_id="sim://pool/1",spec_class_api_group="machine.sapcloud.io",spec_class_kind="MachineClass",spec_class_name="small",node_name="node-1"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"mcm_machine_info{name="m2",namespace="ns",createdAt="0",spec_provider_id="",spec_class_api_group="",spec_class_kind="MachineClass",spec_class_name="small",node_name=""} 1"#
        ),
        "{text}"
    );
    for (condition, value) in [("Ready", 1), ("DiskPressure", 0), ("NetworkUnavailable", 2)] {
        let line = format!(
            r#"mcm_machine_status_condition{{name="m1",namespace="ns",condition="{condition}"}} {value}"#
        );
        assert!(text.contains(&line), "{line}\n{text}");
    }
    assert_eq!(lines(&text, "mcm_machine_status_condition{").len(), 3, "{text}");
    assert!(
        text.contains(r#"mcm_machine_current_status_phase{name="m1",namespace="ns"} 1"#),
        "{text}"
    );
}

#[test]
fn conditions_are_encoded_as_the_reference_does() {
    assert_eq!(condition_value("True"), 1);
    assert_eq!(condition_value("False"), 0);
    assert_eq!(condition_value("Unknown"), 2);
    assert_eq!(condition_value("Maybe"), 2);
}

#[test]
fn machine_sets_and_deployments_are_read_from_their_caches() {
    let metrics = Metrics::new();
    let failed = serde_json::json!([{
        "name": "m9", "providerID": "sim://9", "ownerRef": "pool-abc",
        "lastOperation": { "state": "Failed", "type": "Create", "description": "quota" }
    }]);
    let set: MachineSet = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "pool-abc", "namespace": "ns", "creationTimestamp": "2024-01-02T03:04:05Z" },
        "spec": {
            "replicas": 3, "minReadySeconds": 7,
            "machineClass": { "kind": "MachineClass", "name": "small" },
            "template": { "spec": { "class": { "kind": "MachineClass", "name": "small" } } }
        },
        "status": {
            "replicas": 3, "fullyLabeledReplicas": 3, "readyReplicas": 2, "availableReplicas": 1,
            "machineSetCondition": [{ "type": "ReplicaFailure", "status": "True" }],
            "failedMachines": failed
        }
    }))
    .unwrap();
    let deployment: MachineDeployment = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "pool", "namespace": "ns", "creationTimestamp": "2024-01-02T03:04:05Z" },
        "spec": {
            "replicas": 4, "minReadySeconds": 5, "paused": true, "revisionHistoryLimit": 2,
            "progressDeadlineSeconds": 600,
            "strategy": { "rollingUpdate": { "maxSurge": "25%", "maxUnavailable": "25%" } },
            "template": { "spec": { "class": { "kind": "MachineClass", "name": "small" } } }
        },
        "status": {
            "replicas": 5, "updatedReplicas": 2, "readyReplicas": 4, "availableReplicas": 3,
            "unavailableReplicas": 1, "collisionCount": 1,
            "conditions": [
                { "type": "Available", "status": "False" },
                { "type": "Progressing", "status": "Unknown" }
            ],
            "failedMachines": failed
        }
    }))
    .unwrap();
    metrics.attach_machine_sets(store_of(vec![set]));
    metrics.attach_machine_deployments(store_of(vec![deployment]));
    let text = metrics.encode();
    let of = r#"{name="pool-abc",namespace="ns"}"#;
    for expected in [
        "mcm_machine_set_items_total 1".to_owned(),
        r#"mcm_machine_set_info{name="pool-abc",namespace="ns",createdAt="1704164645",spec_machine_class_api_group="",spec_machine_class_kind="MachineClass",spec_machine_class_name="small"} 1"#.to_owned(),
        format!("mcm_machine_set_info_spec_replicas{of} 3"),
        format!("mcm_machine_set_info_spec_min_ready_seconds{of} 7"),
        format!("mcm_machine_set_status_replicas{of} 3"),
        format!("mcm_machine_set_status_fully_labelled_replicas{of} 3"),
        format!("mcm_machine_set_status_ready_replicas{of} 2"),
        format!("mcm_machine_set_status_available_replicas{of} 1"),
        r#"mcm_machine_set_status_condition{name="pool-abc",namespace="ns",condition="ReplicaFailure"} 1"#.to_owned(),
        r#"mcm_machine_set_failed_machines{name="pool-abc",namespace="ns",failed_machine_name="m9",failed_machine_provider_id="sim://9",failed_machine_last_operation_state="Failed",failed_machine_last_operation_machine_operation_type="Create",failed_machine_owner_ref="pool-abc"} 1"#.to_owned(),
    ] {
        assert!(text.contains(&expected), "{expected}\n{text}");
    }
    let of = r#"{name="pool",namespace="ns"}"#;
    for expected in [
        "mcm_machine_deployment_items_total 1".to_owned(),
        r#"mcm_machine_deployment_info{name="pool",namespace="ns",createdAt="1704164645",spec_strategy_type="RollingUpdate"} 1"#.to_owned(),
        format!("mcm_machine_deployment_info_spec_paused{of} 1"),
        format!("mcm_machine_deployment_info_spec_replicas{of} 4"),
        format!("mcm_machine_deployment_info_spec_min_ready_seconds{of} 5"),
        // 25% of 4: maxSurge rounds up, maxUnavailable down (both 1 here).
        format!("mcm_machine_deployment_info_spec_rolling_update_max_surge{of} 1"),
        format!("mcm_machine_deployment_info_spec_rolling_update_max_unavailable{of} 1"),
        format!("mcm_machine_deployment_info_spec_revision_history_limit{of} 2"),
        format!("mcm_machine_deployment_info_spec_progress_deadline_seconds{of} 600"),
        format!("mcm_machine_deployment_status_replicas{of} 5"),
        format!("mcm_machine_deployment_status_updated_replicas{of} 2"),
        format!("mcm_machine_deployment_status_ready_replicas{of} 4"),
        format!("mcm_machine_deployment_status_available_replicas{of} 3"),
        format!("mcm_machine_deployment_status_unavailable_replicas{of} 1"),
        format!("mcm_machine_deployment_status_collision_count{of} 1"),
        r#"mcm_machine_deployment_status_condition{name="pool",namespace="ns",condition="Available"} 0"#.to_owned(),
        r#"mcm_machine_deployment_status_condition{name="pool",namespace="ns",condition="Progressing"} 2"#.to_owned(),
        r#"mcm_machine_deployment_failed_machines{name="pool",namespace="ns",failed_machine_name="m9","#.to_owned(),
    ] {
        assert!(text.contains(&expected), "{expected}\n{text}");
    }
    assert!(
        lines(&text, "mcm_machine_deployment_info_spec_rollback_to_revision{").is_empty(),
        "{text}"
    );
}

#[test]
fn a_machine_is_stale_when_failed_after_a_health_check() {
    use mcm_api::{MachineOperationType, MachineState};

    use crate::metrics::turned_stale;

    let failed = |operation| {
        machine("m1")
            .phase(MachinePhase::Failed)
            .operation(operation, MachineState::Failed)
            .build()
    };
    assert!(turned_stale(&failed(MachineOperationType::HealthCheck)));
    // Failed while being created (the creation timeout) is not stale; neither is a healthy machine after a check.
    assert!(!turned_stale(&failed(MachineOperationType::Create)));
    let running = machine("m2")
        .phase(MachinePhase::Running)
        .operation(MachineOperationType::HealthCheck, MachineState::Successful)
        .build();
    assert!(!turned_stale(&running));
    assert!(!turned_stale(&machine("m3").build()));

    // The counter is there from the start, at 0, and counts each removal.
    let metrics = Metrics::new();
    assert!(metrics.encode().contains("mcm_machine_stale_machines_total 0\n"));
    metrics.stale_machine_removed();
    assert!(metrics.encode().contains("mcm_machine_stale_machines_total 1\n"));
    // The reference's scrape failure kinds, each under its binary, at 0.
    let text = metrics.encode();
    for (binary, kind) in [
        ("machine-controller-manager", "Machinedeployment-count"),
        ("machine-controller-manager", "Machineset-count"),
        ("machine-controller-manager-provider", "Machine-count"),
    ] {
        let sample = format!(r#"mcm_misc_scrape_failure_total{{binary="{binary}",kind="{kind}"}} 0"#);
        assert!(text.contains(&sample), "{sample}\n{text}");
    }
}
