//! The built-in printers, each against the cells the real server prints, and garbage that must never panic.

use serde_json::json;

use super::{column_names, def, now};
use crate::registry::Registry;
use crate::table::{TABLE_V1, table};

#[test]
fn node_not_ready_and_cordoned() {
    let nodes = def("", "nodes");
    let node = json!({
        "metadata": { "name": "node-1", "creationTimestamp": "2026-11-22T08:00:00Z",
                      "labels": { "node-role.kubernetes.io/worker": "", "node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "worker" } },
        "spec": { "unschedulable": true },
        "status": {
            "conditions": [{ "type": "Ready", "status": "False" }],
            "addresses": [{ "type": "InternalIP", "address": "10.0.0.1" }],
            "nodeInfo": { "kubeletVersion": "v1.32.0", "osImage": "Linux" }
        }
    });
    let t = table(&nodes, &[&node], true, json!({}), now(), TABLE_V1);
    assert_eq!(
        column_names(&t)
            .iter()
            .map(|(n, p)| format!("{n}:{p}"))
            .collect::<Vec<_>>(),
        [
            "Name:0",
            "Status:0",
            "Roles:0",
            "Age:0",
            "Version:0",
            "Internal-IP:1",
            "External-IP:1",
            "OS-Image:1",
            "Kernel-Version:1",
            "Container-Runtime:1"
        ]
    );
    assert_eq!(
        t["rows"][0]["cells"],
        json!([
            "node-1",
            "NotReady,SchedulingDisabled",
            "control-plane,worker",
            "3h10m",
            "v1.32.0",
            "10.0.0.1",
            "<none>",
            "Linux",
            "<unknown>",
            "<unknown>"
        ])
    );
    let bare = json!({ "metadata": { "name": "bare" } });
    let t = table(&nodes, &[&bare], true, json!({}), now(), TABLE_V1);
    assert_eq!(t["rows"][0]["cells"][1], "Unknown");
    assert_eq!(t["rows"][0]["cells"][2], "<none>");
    assert_eq!(t["rows"][0]["cells"][4], "");
}

#[test]
fn pods() {
    let pods = def("", "pods");
    let running = json!({
        "metadata": { "name": "web", "creationTimestamp": "2026-11-22T11:00:00Z" },
        "spec": { "nodeName": "node-1", "containers": [{ "name": "a" }, { "name": "b" }] },
        "status": {
            "phase": "Running", "podIP": "10.1.0.5",
            "containerStatuses": [
                { "name": "a", "ready": true, "restartCount": 0, "state": { "running": {} } },
                { "name": "b", "ready": false, "restartCount": 2, "state": { "running": {} },
                  "lastState": { "terminated": { "exitCode": 1, "finishedAt": "2026-11-22T11:05:00Z" } } }
            ]
        }
    });
    let t = table(&pods, &[&running], true, json!({}), now(), TABLE_V1);
    assert_eq!(
        t["rows"][0]["cells"],
        json!([
            "web",
            "1/2",
            "Running",
            "2 (5m ago)",
            "10m",
            "10.1.0.5",
            "node-1",
            "<none>",
            "<none>"
        ])
    );
    let terminating = json!({
        "metadata": { "name": "old", "creationTimestamp": "2026-11-22T11:00:00Z", "deletionTimestamp": "2026-11-22T11:09:00Z" },
        "spec": { "containers": [{ "name": "a" }] },
        "status": { "phase": "Running" }
    });
    let t = table(&pods, &[&terminating], true, json!({}), now(), TABLE_V1);
    assert_eq!(
        t["rows"][0]["cells"],
        json!([
            "old",
            "0/1",
            "Terminating",
            "0",
            "10m",
            "<none>",
            "<none>",
            "<none>",
            "<none>"
        ])
    );
    let waiting = json!({
        "metadata": { "name": "w" },
        "spec": { "containers": [{ "name": "a" }], "initContainers": [{ "name": "i" }] },
        "status": { "phase": "Pending",
                    "initContainerStatuses": [{ "name": "i", "state": { "waiting": { "reason": "PodInitializing" } } }] }
    });
    let t = table(&pods, &[&waiting], true, json!({}), now(), TABLE_V1);
    assert_eq!(t["rows"][0]["cells"][2], "Init:0/1");
    let crash = json!({
        "metadata": { "name": "c" },
        "spec": { "containers": [{ "name": "a" }] },
        "status": { "phase": "Running", "containerStatuses": [{ "name": "a", "state": { "waiting": { "reason": "CrashLoopBackOff" } } }] }
    });
    assert_eq!(
        table(&pods, &[&crash], true, json!({}), now(), TABLE_V1)["rows"][0]["cells"][2],
        "CrashLoopBackOff"
    );
}

#[test]
fn other_builtins() {
    let t = table(
        &def("", "secrets"),
        &[&json!({ "metadata": { "name": "s" }, "data": { "a": "", "b": "" } })],
        true,
        json!({}),
        now(),
        TABLE_V1,
    );
    assert_eq!(t["rows"][0]["cells"], json!(["s", "Opaque", 2, "<unknown>"]));

    let ns = json!({ "metadata": { "name": "trace" }, "status": { "phase": "Active" } });
    assert_eq!(
        table(&def("", "namespaces"), &[&ns], true, json!({}), now(), TABLE_V1)["rows"][0]["cells"][1],
        "Active"
    );
}

#[test]
fn events_both_apis() {
    let event = json!({
        "metadata": { "name": "m.1" },
        "involvedObject": { "kind": "Machine", "name": "m" },
        "type": "Normal", "reason": "Created", "message": " made \n",
        "firstTimestamp": "2026-11-22T11:00:00Z", "lastTimestamp": "2026-11-22T11:09:00Z", "count": 3,
        "source": { "component": "mcm" }
    });
    let t = table(&def("", "events"), &[&event], true, json!({}), now(), TABLE_V1);
    assert_eq!(
        t["rows"][0]["cells"],
        json!([
            "60s",
            "Normal",
            "Created",
            "machine/m",
            "",
            "mcm",
            "made",
            "10m",
            3,
            "m.1"
        ])
    );
    assert_eq!(t["columnDefinitions"][9]["format"], "name");

    let new_event = json!({
        "metadata": { "name": "n.1" }, "regarding": { "kind": "Node", "name": "n" }, "note": "hi", "type": "Warning",
        "reason": "R", "eventTime": "2026-11-22T11:09:50.000000Z", "reportingController": "ctl", "reportingInstance": "i-1"
    });
    let t = table(
        &def("events.k8s.io", "events"),
        &[&new_event],
        true,
        json!({}),
        now(),
        TABLE_V1,
    );
    assert_eq!(
        t["rows"][0]["cells"],
        json!([
            "10s", "Warning", "R", "node/n", "", "ctl, i-1", "hi", "10s", 1, "n.1"
        ])
    );
}

#[test]
fn storage_and_coordination() {
    let lease = json!({ "metadata": { "name": "node-1" }, "spec": { "holderIdentity": "node-1" } });
    assert_eq!(
        table(
            &def("coordination.k8s.io", "leases"),
            &[&lease],
            true,
            json!({}),
            now(),
            TABLE_V1
        )["rows"][0]["cells"][1],
        "node-1"
    );

    let pv = json!({
        "metadata": { "name": "pv1" },
        "spec": { "capacity": { "storage": "10Gi" }, "accessModes": ["ReadWriteMany", "ReadWriteOnce", "ReadWriteOnce"],
                  "persistentVolumeReclaimPolicy": "Delete", "claimRef": { "namespace": "ns", "name": "c" }, "storageClassName": "fast" },
        "status": { "phase": "Bound" }
    });
    let t = table(
        &def("", "persistentvolumes"),
        &[&pv],
        true,
        json!({}),
        now(),
        TABLE_V1,
    );
    assert_eq!(
        t["rows"][0]["cells"],
        json!([
            "pv1",
            "10Gi",
            "RWO,RWX",
            "Delete",
            "Bound",
            "ns/c",
            "fast",
            "<unset>",
            "",
            "<unknown>",
            "<unset>"
        ])
    );

    let pvc = json!({
        "metadata": { "name": "c" }, "spec": { "volumeName": "pv1", "storageClassName": "fast", "volumeMode": "Filesystem" },
        "status": { "phase": "Bound", "capacity": { "storage": "10Gi" }, "accessModes": ["ReadWriteOnce"] }
    });
    let t = table(
        &def("", "persistentvolumeclaims"),
        &[&pvc],
        true,
        json!({}),
        now(),
        TABLE_V1,
    );
    assert_eq!(
        t["rows"][0]["cells"],
        json!([
            "c",
            "Bound",
            "pv1",
            "10Gi",
            "RWO",
            "fast",
            "<unset>",
            "<unknown>",
            "Filesystem"
        ])
    );

    let va = json!({ "metadata": { "name": "va" }, "spec": { "attacher": "csi", "nodeName": "n", "source": { "persistentVolumeName": "pv1" } }, "status": { "attached": true } });
    let t = table(
        &def("storage.k8s.io", "volumeattachments"),
        &[&va],
        true,
        json!({}),
        now(),
        TABLE_V1,
    );
    assert_eq!(
        t["rows"][0]["cells"],
        json!(["va", "csi", "pv1", "n", true, "<unknown>"])
    );

    let pdb = json!({ "metadata": { "name": "p" }, "spec": { "minAvailable": 1 }, "status": { "disruptionsAllowed": 0 } });
    let t = table(
        &def("policy", "poddisruptionbudgets"),
        &[&pdb],
        true,
        json!({}),
        now(),
        TABLE_V1,
    );
    assert_eq!(t["rows"][0]["cells"], json!(["p", "1", "N/A", 0, "<unknown>"]));
}

#[test]
fn garbage_never_panics() {
    // Garbage never panics.
    for r in Registry::new().all() {
        for junk in [
            json!(null),
            json!([]),
            json!("x"),
            json!({ "metadata": 5, "status": { "conditions": "no" } }),
            json!({
                "metadata": { "creationTimestamp": "-009999-01-01T00:00:00Z", "labels": { "node": [] } },
                "spec": { "initContainers": [{ "name": "i", "restartPolicy": "Always" }], "minAvailable": {} },
                "status": {
                    "initContainerStatuses": [{ "name": "i", "restartCount": i64::MAX, "started": true }],
                    "containerStatuses": [{ "restartCount": i64::MAX, "state": { "terminated": { "signal": 9 } } }],
                    "currentStatus": { "phase": 7 }
                }
            }),
        ] {
            let t = table(r, &[&junk], true, json!([]), now(), TABLE_V1);
            assert_eq!(
                t["rows"][0]["cells"].as_array().unwrap().len(),
                t["columnDefinitions"].as_array().unwrap().len()
            );
        }
    }
}

#[test]
fn certificate_signing_requests_print_signer_requestor_duration_and_condition() {
    let csrs = def("certificates.k8s.io", "certificatesigningrequests");
    let pending = json!({
        "metadata": { "name": "csr-a", "creationTimestamp": "2026-11-22T11:09:00Z" },
        "spec": { "signerName": "kubernetes.io/kube-apiserver-client-kubelet", "username": "system:bootstrap:abcdef" },
    });
    let issued = json!({
        "metadata": { "name": "csr-b", "creationTimestamp": "2026-11-22T11:09:00Z" },
        "spec": { "signerName": "kubernetes.io/kube-apiserver-client-kubelet", "username": "system:node:n1",
                  "expirationSeconds": 86400 },
        "status": { "conditions": [{ "type": "Approved", "status": "True" }], "certificate": "LS0t" },
    });
    let denied = json!({
        "metadata": { "name": "csr-c" },
        "spec": {},
        "status": { "conditions": [{ "type": "Denied", "status": "True" }, { "type": "Failed", "status": "True" }] },
    });
    let t = table(
        &csrs,
        &[&pending, &issued, &denied],
        true,
        json!({}),
        now(),
        TABLE_V1,
    );
    let names: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "Name",
            "Age",
            "SignerName",
            "Requestor",
            "RequestedDuration",
            "Condition"
        ]
    );
    assert_eq!(
        t["rows"][0]["cells"],
        json!([
            "csr-a",
            "60s",
            "kubernetes.io/kube-apiserver-client-kubelet",
            "system:bootstrap:abcdef",
            "<none>",
            "Pending"
        ])
    );
    assert_eq!(t["rows"][1]["cells"][4], "24h");
    assert_eq!(t["rows"][1]["cells"][5], "Approved,Issued");
    assert_eq!(t["rows"][2]["cells"][2], "<none>");
    assert_eq!(t["rows"][2]["cells"][5], "Denied,Failed");
}
