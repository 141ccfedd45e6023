//! Each builder gives the object a user would write as a manifest: the built object equals the manifest parsed.

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    apimachinery::pkg::util::intstr::IntOrString,
    jiff::Timestamp,
};
use serde_json::json;

use super::*;
use crate::{
    Machine, MachineClass, MachineDeployment, MachineOperationType, MachinePhase, MachineSet, MachineState,
};

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

#[test]
fn a_machine_is_the_manifest_its_calls_describe() {
    let set = MachineSetBuilder::new("ms").uid("uid-ms").build();
    let built = MachineBuilder::new("m1")
        .namespace("ns")
        .uid("uid-m1")
        .class("small")
        .provider_id("sim:///pool/m1")
        .node("n1")
        .label("app", "web")
        .annotation("a", "b")
        .finalizer("f")
        .owned_by(&set)
        .created_at(at(100))
        .deleting_at(at(200))
        .phase(MachinePhase::Running)
        .phase_since(at(150))
        .operation(MachineOperationType::Create, MachineState::Successful)
        .description("joined")
        .error_code("ResourceExhausted")
        .build();
    let manifest: Machine = serde_json::from_value(json!({
        "metadata": {
            "name": "m1", "namespace": "ns", "uid": "uid-m1",
            "labels": { "node": "n1", "app": "web" },
            "annotations": { "a": "b" },
            "finalizers": ["f"],
            "ownerReferences": [{
                "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet", "name": "ms", "uid": "uid-ms",
                "controller": true, "blockOwnerDeletion": true
            }],
            "creationTimestamp": "1970-01-01T00:01:40Z",
            "deletionTimestamp": "1970-01-01T00:03:20Z"
        },
        "spec": { "class": { "kind": "MachineClass", "name": "small" }, "providerID": "sim:///pool/m1" },
        "status": {
            "currentStatus": { "phase": "Running", "lastUpdateTime": "1970-01-01T00:02:30Z" },
            "lastOperation": {
                "type": "Create", "state": "Successful", "description": "joined", "errorCode": "ResourceExhausted"
            }
        }
    }))
    .unwrap();
    assert_eq!(built, manifest);
}

#[test]
fn a_new_machine_has_a_name_and_nothing_else() {
    let built = MachineBuilder::new("m1").build();
    assert_eq!(
        built,
        serde_json::from_value::<Machine>(json!({ "metadata": { "name": "m1" } })).unwrap()
    );
    assert!(built.status.is_none(), "no status until a status call");
    let unphased = MachineBuilder::new("m1").phase(None).build();
    assert_eq!(unphased.status.unwrap().current_status.phase, None);
}

#[test]
fn sets_and_deployments_select_what_their_template_labels() {
    let set = MachineSetBuilder::new("ms")
        .replicas(3)
        .matching([("app", "web")])
        .class("small")
        .min_ready_seconds(5)
        .build();
    let manifest: MachineSet = serde_json::from_value(json!({
        "metadata": { "name": "ms" },
        "spec": {
            "replicas": 3, "minReadySeconds": 5,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": { "class": { "kind": "MachineClass", "name": "small" } }
            }
        }
    }))
    .unwrap();
    assert_eq!(set, manifest);

    let deployment = MachineDeploymentBuilder::new("md")
        .replicas(2)
        .selector([("pool", "a")])
        .strategy("RollingUpdate")
        .max_surge(IntOrString::String("50%".into()))
        .max_unavailable(IntOrString::Int(0))
        .paused(true)
        .revision_history_limit(1)
        .build();
    let manifest: MachineDeployment = serde_json::from_value(json!({
        "metadata": { "name": "md" },
        "spec": {
            "replicas": 2, "paused": true, "revisionHistoryLimit": 1,
            "selector": { "matchLabels": { "pool": "a" } },
            "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxSurge": "50%", "maxUnavailable": 0 } }
        }
    }))
    .unwrap();
    assert_eq!(deployment, manifest);
}

#[test]
fn a_class_names_its_provider_and_secrets() {
    let class = MachineClassBuilder::new("small")
        .namespace("default")
        .provider("sim")
        .provider_spec(json!({ "size": "small" }))
        .secret_ref("boot", "default")
        .credentials_secret_ref("creds", "default")
        .build();
    let manifest: MachineClass = serde_json::from_value(json!({
        "metadata": { "name": "small", "namespace": "default" },
        "provider": "sim",
        "providerSpec": { "size": "small" },
        "secretRef": { "name": "boot", "namespace": "default" },
        "credentialsSecretRef": { "name": "creds", "namespace": "default" }
    }))
    .unwrap();
    assert_eq!(class, manifest);
}

#[test]
fn nodes_and_pods_are_the_manifests_their_calls_describe() {
    let node = NodeBuilder::new("n1")
        .resource_version("7")
        .provider_id("sim:///pool/n1")
        .taint("k", Some("v"), "NoSchedule")
        .condition("Ready", "True", Some(at(0)))
        .heartbeat("MemoryPressure", "False", "KubeletHasSufficientMemory", at(60))
        .attached_volume("vol-1")
        .build();
    let manifest: Node = serde_json::from_value(json!({
        "metadata": { "name": "n1", "resourceVersion": "7" },
        "spec": { "providerID": "sim:///pool/n1", "taints": [{ "key": "k", "value": "v", "effect": "NoSchedule" }] },
        "status": {
            "conditions": [
                { "type": "Ready", "status": "True", "lastTransitionTime": "1970-01-01T00:00:00Z" },
                {
                    "type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                    "lastHeartbeatTime": "1970-01-01T00:01:00Z"
                }
            ],
            "volumesAttached": [{ "name": "vol-1", "devicePath": "" }]
        }
    }))
    .unwrap();
    assert_eq!(node, manifest);

    let pod = PodBuilder::new("web")
        .namespace("default")
        .node("n1")
        .priority(10)
        .container("c", "busybox")
        .grace_period(5)
        .claim("data")
        .phase("Running")
        .condition("Ready", "True")
        .build();
    let manifest: Pod = serde_json::from_value(json!({
        "metadata": { "name": "web", "namespace": "default" },
        "spec": {
            "nodeName": "n1", "priority": 10, "containers": [{ "name": "c", "image": "busybox" }],
            "terminationGracePeriodSeconds": 5,
            "volumes": [{ "name": "vol-data", "persistentVolumeClaim": { "claimName": "data" } }]
        },
        "status": { "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] }
    }))
    .unwrap();
    assert_eq!(pod, manifest);
}

#[test]
fn with_changes_a_field_no_call_covers() {
    let machine = MachineBuilder::new("m1")
        .with(|m| m.status.get_or_insert_default().last_known_state = "opaque".into())
        .build();
    assert_eq!(machine.status.unwrap().last_known_state, "opaque");
}
