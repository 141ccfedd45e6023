//! The machine step gauges and the failed-join counter, per deployment and placement.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mcm_api::{
    MachineClass, NodeTemplateSpec,
    builders::{MachineBuilder, NodeBuilder},
};

use super::{lines, machine};
use crate::metrics::{MachineStep, Metrics, placement};

#[test]
fn step_gauges_are_set_per_deployment_and_placement() {
    let metrics = Metrics::new();
    let m = machine("m1")
        .label("name", "pool")
        .class("small")
        .with(|m| {
            m.spec.node_template = Some(NodeTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some([("topology.kubernetes.io/zone".to_owned(), "zone-b".to_owned())].into()),
                    ..ObjectMeta::default()
                }),
                spec: None,
            });
        })
        .build();
    let class: MachineClass = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "small", "namespace": "ns" },
        "nodeTemplate": { "capacity": {}, "instanceType": "m5.large", "region": "r", "zone": "zone-c" }
    }))
    .unwrap();
    let node = NodeBuilder::new("node-1")
        .label("node.kubernetes.io/instance-type", "small")
        .label("topology.kubernetes.io/zone", "zone-a")
        .build();
    // Before the node exists: the class's instance type and the machine's zone label.
    metrics.machine_step(
        MachineStep::Create,
        &m,
        None,
        Some(&class),
        Duration::from_millis(2500),
    );
    metrics.machine_step(
        MachineStep::Initialize,
        &m,
        None,
        Some(&class),
        Duration::from_millis(1499),
    );
    // With the node: its labels.
    metrics.machine_step(
        MachineStep::Join,
        &m,
        Some(&node),
        Some(&class),
        Duration::from_secs(30),
    );
    metrics.machine_step(
        MachineStep::Drain,
        &m,
        Some(&node),
        Some(&class),
        Duration::from_secs(4),
    );
    metrics.machine_step(
        MachineStep::Delete,
        &m,
        Some(&node),
        Some(&class),
        Duration::from_secs(9),
    );
    // A later machine of the same deployment replaces the value.
    metrics.machine_step(
        MachineStep::Delete,
        &m,
        Some(&node),
        Some(&class),
        Duration::from_secs(8),
    );
    metrics.machine_failed_join(&m, None, Some(&class));
    metrics.machine_failed_join(&m, None, Some(&class));
    // A machine of no deployment is not recorded.
    let standalone = machine("single").build();
    metrics.machine_step(
        MachineStep::Create,
        &standalone,
        None,
        None,
        Duration::from_secs(1),
    );
    metrics.machine_failed_join(&standalone, None, None);
    let text = metrics.encode();
    let before = r#"{namespace="ns",machine_deployment="pool",instance_type="m5.large",zone="zone-b"}"#;
    let after = r#"{namespace="ns",machine_deployment="pool",instance_type="small",zone="zone-a"}"#;
    for expected in [
        // Whole seconds, halves away from zero, as the reference's Duration.Round(time.Second).
        format!("mcm_machine_create_duration_seconds{before} 3.0"),
        format!("mcm_machine_initialize_duration_seconds{before} 1.0"),
        format!("mcm_machine_join_duration_seconds{after} 30.0"),
        r#"mcm_machine_drain_duration_seconds{namespace="ns",machine_deployment="pool"} 4.0"#.to_owned(),
        format!("mcm_machine_delete_duration_seconds{after} 8.0"),
        format!("mcm_machine_num_failed_join{before} 2"),
    ] {
        assert!(text.contains(&expected), "{expected}\n{text}");
    }
    assert_eq!(
        lines(&text, "mcm_machine_create_duration_seconds{").len(),
        1,
        "{text}"
    );
    assert_eq!(lines(&text, "mcm_machine_num_failed_join{").len(), 1, "{text}");
    assert!(
        text.contains("# TYPE mcm_machine_num_failed_join gauge"),
        "{text}"
    );
}

#[test]
fn placement_prefers_the_node_then_the_templates() {
    let m = MachineBuilder::new("m1").build();
    assert_eq!(placement(&m, None, None), (String::new(), String::new()));
    let class: MachineClass = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "small" },
        "nodeTemplate": { "capacity": {}, "instanceType": "m5.large", "region": "r", "zone": "zone-c" }
    }))
    .unwrap();
    assert_eq!(
        placement(&m, None, Some(&class)),
        ("m5.large".to_owned(), "zone-c".to_owned())
    );
    let unlabelled = NodeBuilder::new("n").build();
    assert_eq!(
        placement(&m, Some(&unlabelled), Some(&class)),
        ("m5.large".to_owned(), "zone-c".to_owned())
    );
}
