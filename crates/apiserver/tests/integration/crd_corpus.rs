//! A corpus of machine objects sent through the real `kube` client to the server, which serves the four kinds from
//! the CRDs `mcm crds` generates: each object's verdict (stored, or refused with the field and reason) and what is
//! stored of it (fields kept, fields pruned) is the one written down here from the reference's CRD rules
//! (gardener/machine-controller-manager `kubernetes/crds`): no `enum` on status strings, a node template that keeps
//! fields it does not declare, quantities as int-or-string matching the quantity pattern, `spec.template` required on
//! a MachineDeployment, `podCIDRs` a set, `null` dropped and no `default` written.

use crate::support;

use kube::{
    Api,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use support::{TestServer, api_error};

/// What the reference's CRDs do with an object.
enum Verdict {
    /// Stored: these JSON pointers hold these strings, and these pointers are absent.
    Stored {
        kept: &'static [(&'static str, &'static str)],
        absent: &'static [&'static str],
    },
    /// Refused with 422 and a cause of this reason on this field.
    Refused {
        field: &'static str,
        reason: &'static str,
    },
}

/// One object of the corpus: `spec` (and `status`, written through the status subresource) of a `kind`.
struct Case {
    name: &'static str,
    plural: &'static str,
    kind: &'static str,
    body: Value,
    status: Option<Value>,
    verdict: Verdict,
}

fn api(t: &TestServer, plural: &str, kind: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "machine.sapcloud.io".into(),
        version: "v1alpha1".into(),
        api_version: "machine.sapcloud.io/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::namespaced_with(t.client.clone(), "default", &resource)
}

fn class(name: &'static str, node_template: Value, verdict: Verdict) -> Case {
    Case {
        name,
        plural: "machineclasses",
        kind: "MachineClass",
        body: {
            let mut body = json!({ "providerSpec": { "image": "x" }, "provider": "sim" });
            body["nodeTemplate"] = node_template;
            body
        },
        status: None,
        verdict,
    }
}

fn template() -> Value {
    json!({ "metadata": { "labels": { "app": "a" } }, "spec": { "class": { "kind": "MachineClass", "name": "c" } } })
}

fn selector() -> Value {
    json!({ "matchLabels": { "app": "a" } })
}

fn node_template(capacity: Value) -> Value {
    let mut template = json!({ "instanceType": "m5.large", "region": "eu-1", "zone": "eu-1a" });
    template["capacity"] = capacity;
    template
}

#[allow(clippy::too_many_lines)] // the corpus is data, one case after the other
fn corpus() -> Vec<Case> {
    vec![
        class(
            "quantities-as-integers-and-strings",
            node_template(json!({ "cpu": 2, "memory": "8Gi", "gpu": 0, "pods": "1e2" })),
            Verdict::Stored {
                kept: &[],
                absent: &[],
            },
        ),
        class(
            "node-template-keeps-fields-it-does-not-declare",
            json!({ "capacity": { "cpu": "2", "gpu": "1", "memory": "4Gi" }, "instanceType": "t", "region": "r", "zone": "z",
                    "gpuModel": "A100", "extra": { "nested": [1, 2] } }),
            Verdict::Stored {
                kept: &[],
                absent: &[],
            },
        ),
        class(
            "quantity-with-a-unit-word",
            node_template(json!({ "cpu": "2 cores", "gpu": 0, "memory": "1Gi" })),
            Verdict::Refused {
                field: "nodeTemplate.capacity.cpu",
                reason: "FieldValueInvalid",
            },
        ),
        class(
            "quantity-as-a-fraction-number",
            node_template(json!({ "cpu": 1, "gpu": 0, "memory": 1.5 })),
            Verdict::Refused {
                field: "nodeTemplate.capacity.memory",
                reason: "FieldValueTypeInvalid",
            },
        ),
        class(
            "virtual-capacity-with-a-bad-suffix",
            json!({ "capacity": { "cpu": "2", "gpu": "0", "memory": "1Gi" }, "virtualCapacity": { "vgpu": "2Xi" },
                    "instanceType": "t", "region": "r", "zone": "z" }),
            Verdict::Refused {
                field: "nodeTemplate.virtualCapacity.vgpu",
                reason: "FieldValueInvalid",
            },
        ),
        class(
            "node-template-without-zone",
            json!({ "capacity": { "cpu": "2", "gpu": "0", "memory": "1Gi" }, "instanceType": "t", "region": "r" }),
            Verdict::Refused {
                field: "nodeTemplate.zone",
                reason: "FieldValueRequired",
            },
        ),
        Case {
            name: "unknown-status-values",
            plural: "machines",
            kind: "Machine",
            body: json!({ "spec": { "class": { "kind": "MachineClass", "name": "c" } } }),
            status: Some(json!({
                "currentStatus": { "phase": "Hibernating", "lastUpdateTime": "2026-01-01T00:00:00Z" },
                "lastOperation": { "state": "Queued", "type": "Resize", "description": "d",
                                   "lastUpdateTime": "2026-01-01T00:00:00Z" }
            })),
            verdict: Verdict::Stored {
                kept: &[],
                absent: &[],
            },
        },
        Case {
            name: "phase-of-the-wrong-type",
            plural: "machines",
            kind: "Machine",
            body: json!({ "spec": { "class": { "kind": "MachineClass", "name": "c" } } }),
            status: Some(json!({ "currentStatus": { "phase": 5 } })),
            verdict: Verdict::Refused {
                field: "status.currentStatus.phase",
                reason: "FieldValueTypeInvalid",
            },
        },
        Case {
            name: "no-defaults-written-and-nulls-dropped",
            plural: "machines",
            kind: "Machine",
            body: json!({ "spec": { "class": { "kind": "MachineClass", "name": "c" }, "providerID": null,
                                    "nodeTemplate": { "spec": { "podCIDRs": ["10.0.0.0/24"] } } } }),
            status: Some(json!({ "lastOperation": { "description": "d" }, "lastKnownState": null })),
            verdict: Verdict::Stored {
                kept: &[],
                absent: &[
                    "/spec/providerID",
                    "/status/currentStatus",
                    "/status/lastKnownState",
                ],
            },
        },
        Case {
            name: "pod-cidrs-are-a-set",
            plural: "machines",
            kind: "Machine",
            body: json!({ "spec": { "class": { "kind": "MachineClass", "name": "c" },
                                    "nodeTemplate": { "spec": { "podCIDRs": ["10.0.0.0/24", "10.0.0.0/24"] } } } }),
            status: None,
            verdict: Verdict::Refused {
                field: "spec.nodeTemplate.spec.podCIDRs[1]",
                reason: "FieldValueDuplicate",
            },
        },
        Case {
            name: "unknown-condition-type-and-status",
            plural: "machinesets",
            kind: "MachineSet",
            body: json!({ "spec": { "replicas": 0, "selector": selector(), "template": template() } }),
            status: Some(json!({
                "replicas": 0,
                "machineSetCondition": [{ "type": "Degraded", "status": "Maybe", "reason": "r" }],
                "lastOperation": { "state": "Queued", "type": "Resize" }
            })),
            verdict: Verdict::Stored {
                kept: &[],
                absent: &[],
            },
        },
        Case {
            name: "deployment-without-template",
            plural: "machinedeployments",
            kind: "MachineDeployment",
            body: json!({ "spec": { "replicas": 1, "selector": selector() } }),
            status: None,
            verdict: Verdict::Refused {
                field: "spec.template",
                reason: "FieldValueRequired",
            },
        },
        Case {
            name: "deployment-status-with-unknown-values",
            plural: "machinedeployments",
            kind: "MachineDeployment",
            body: json!({ "spec": { "replicas": 0, "selector": selector(), "template": template(),
                                    "strategy": { "type": "RollingUpdate",
                                                  "rollingUpdate": { "maxSurge": "25%", "maxUnavailable": 0 } } } }),
            status: Some(json!({
                "conditions": [{ "type": "Hibernated", "status": "Maybe", "reason": "r" }],
                "failedMachines": [{ "name": "m", "lastOperation": { "state": "Queued", "type": "Resize" } }]
            })),
            verdict: Verdict::Stored {
                kept: &[],
                absent: &["/spec/template/spec/nodeTemplate", "/spec/minReadySeconds"],
            },
        },
        Case {
            name: "undeclared-fields-pruned",
            plural: "machines",
            kind: "Machine",
            body: json!({ "spec": { "class": { "kind": "MachineClass", "name": "c" }, "colour": "blue" } }),
            status: Some(json!({ "currentStatus": { "phase": "Running", "mood": "happy" } })),
            verdict: Verdict::Stored {
                kept: &[("/status/currentStatus/phase", "Running")],
                absent: &["/spec/colour", "/status/currentStatus/mood"],
            },
        },
    ]
}

/// Sends one case; the stored object, or the refusal.
async fn send(t: &TestServer, case: &Case) -> kube::Result<DynamicObject> {
    let api = api(t, case.plural, case.kind);
    let mut object = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": case.kind,
        "metadata": { "name": case.name },
    });
    if let (Value::Object(object), Value::Object(body)) = (&mut object, case.body.clone()) {
        object.extend(body);
    }
    let object: DynamicObject = serde_json::from_value(object).expect("a dynamic object");
    let created = api.create(&PostParams::default(), &object).await?;
    match &case.status {
        None => Ok(created),
        Some(status) => {
            api.patch_status(
                case.name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
        }
    }
}

/// Every written-down value of `sent` is in `stored` (what was sent is what is read back), but for `absent`.
fn assert_kept(case: &Case, sent: &Value, stored: &Value, absent: &[&str], path: &str) {
    if absent.contains(&path) {
        return;
    }
    match sent {
        Value::Object(fields) => {
            for (name, child) in fields {
                let child_path = format!("{path}/{name}");
                if child.is_null() || absent.contains(&child_path.as_str()) {
                    continue;
                }
                assert_kept(case, child, &stored[name], absent, &child_path);
            }
        }
        other => assert_eq!(other, stored, "{}: {path} stored as sent", case.name),
    }
}

#[tokio::test]
async fn each_object_of_the_corpus_gets_the_reference_crds_verdict_and_is_stored_as_they_store_it() {
    let t = TestServer::start().await;
    for case in corpus() {
        let result = send(&t, &case).await;
        match (&case.verdict, result) {
            (Verdict::Stored { kept, absent }, Ok(_)) => {
                let stored = api(&t, case.plural, case.kind)
                    .get(case.name)
                    .await
                    .expect("a stored object reads back");
                let stored = serde_json::to_value(&stored).expect("JSON");
                assert_kept(&case, &case.body, &stored, absent, "");
                if let Some(status) = &case.status {
                    assert_kept(&case, status, &stored["status"], absent, "/status");
                }
                for (pointer, value) in *kept {
                    assert_eq!(
                        stored.pointer(pointer),
                        Some(&json!(value)),
                        "{}: {pointer}",
                        case.name
                    );
                }
                for pointer in *absent {
                    assert_eq!(
                        stored.pointer(pointer),
                        None,
                        "{}: {pointer} is not stored",
                        case.name
                    );
                }
            }
            (Verdict::Refused { field, reason }, Err(error)) => {
                let status = api_error::<()>(Err(error));
                assert_eq!(status.code, 422, "{}: {status:?}", case.name);
                let causes = status
                    .details
                    .as_ref()
                    .map(|d| d.causes.clone())
                    .unwrap_or_default();
                assert!(
                    causes.iter().any(|c| c.field == *field && c.reason == *reason),
                    "{}: expected {reason} on {field}, got {causes:?}",
                    case.name
                );
            }
            (Verdict::Stored { .. }, Err(error)) => panic!("{}: refused: {error}", case.name),
            (Verdict::Refused { field, .. }, Ok(_)) => {
                panic!("{}: stored, but the reference refuses {field}", case.name)
            }
        }
    }
}
