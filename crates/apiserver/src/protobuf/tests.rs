//! Round trips of the codec: what a Go client sends decodes to the JSON we store, and back.

use pretty_assertions::assert_eq;
use serde_json::json;

use super::codec::{self, CodecError};

fn round_trip(object: &serde_json::Value) -> serde_json::Value {
    let body = codec::encode(object).expect("encodes");
    assert!(body.starts_with(b"k8s\0"), "the magic prefix");
    codec::decode(&body).expect("decodes")
}

#[test]
fn a_secret_round_trips_with_its_binary_data() {
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": "creds", "namespace": "default", "uid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
            "resourceVersion": "12", "creationTimestamp": "2026-11-22T11:09:16Z",
            "labels": {"app": "x"},
            "managedFields": [{"manager": "kubectl-create", "operation": "Update", "apiVersion": "v1",
                               "time": "2026-11-22T11:09:16Z", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:data": {".": {}, "f:password": {}}}}]
        },
        "type": "Opaque",
        "data": {"password": "AP8Qcw==", "empty": ""},
    });
    assert_eq!(round_trip(&secret), secret);
}

#[test]
fn a_node_round_trips_with_quantities_times_and_taints() {
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-1", "creationTimestamp": "2026-11-22T11:09:16Z",
                     "deletionTimestamp": "2026-11-22T12:00:00Z", "deletionGracePeriodSeconds": 0},
        "spec": {"providerID": "local:///node-1", "podCIDRs": ["10.0.0.0/24"], "unschedulable": true,
                 "taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
                             "timeAdded": "2026-11-22T11:10:00Z"}]},
        "status": {
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "3800m", "memory": "15Gi"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": "2026-11-22T11:09:20Z",
                            "lastTransitionTime": "2026-11-22T11:09:16Z"}],
            "addresses": [{"type": "InternalIP", "address": "10.1.2.3"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        },
    });
    assert_eq!(round_trip(&node), node);
}

#[test]
fn a_status_round_trips_with_its_causes() {
    let status = json!({
        "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "message": "Secret \"x\" is invalid: data[bad]: Invalid value", "reason": "Invalid", "code": 422,
        "details": {"name": "x", "kind": "Secret",
                    "causes": [{"reason": "FieldValueInvalid", "message": "Invalid value", "field": "data[bad]"}]},
    });
    assert_eq!(round_trip(&status), status);
}

#[test]
fn micro_times_int_or_strings_and_lists_keep_their_json_forms() {
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "node-1", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40,
                 "renewTime": "2026-11-22T11:09:16.123456Z"},
    });
    assert_eq!(round_trip(&lease), lease);
    let pdb = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"minAvailable": "50%", "maxUnavailable": 1,
                 "selector": {"matchLabels": {"app": "x"}}},
    });
    assert_eq!(round_trip(&pdb), pdb);
    let list = json!({
        "apiVersion": "v1", "kind": "NamespaceList", "metadata": {"resourceVersion": "7", "continue": "abc"},
        "items": [{"metadata": {"name": "a"}, "status": {"phase": "Active"}}],
    });
    assert_eq!(round_trip(&list), list);
}

#[test]
fn bad_bodies_are_refused_with_the_reason() {
    assert_eq!(codec::decode(b"{\"kind\":\"Secret\"}"), Err(CodecError::NoMagic));
    assert!(matches!(
        codec::decode(b"k8s\0\xff\xff\xff"),
        Err(CodecError::Malformed(_))
    ));
    let machine = json!({"apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine", "metadata": {}});
    assert!(matches!(
        codec::encode(&machine),
        Err(CodecError::UnknownKind { .. })
    ));
    let bad = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": 3}});
    assert_eq!(
        codec::encode(&bad),
        Err(CodecError::Field {
            path: "metadata.name".into(),
            reason: "expected a string, got a number".into()
        })
    );
}

#[test]
fn embedded_structs_stay_inline_in_json() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "100m"}},
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080},
                                              "periodSeconds": 10},
                            "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}],
            "volumes": [{"name": "data", "secret": {"secretName": "s"}},
                        {"name": "cfg", "configMap": {"name": "c", "items": [{"key": "a", "path": "a"}]}}],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]},
    });
    assert_eq!(round_trip(&pod), pod);
}
