//! Custom resources: CRD printer columns, their typed cells and the JSON paths that pick them.

use serde_json::{Value, json};

use super::{column_names, def, now};
use crate::table::{
    TABLE_V1, TABLE_V1BETA1,
    custom::{custom_cell, eval_path},
    table,
};

#[test]
fn machine_table_uses_the_crd_columns() {
    let machines = def("machine.sapcloud.io", "machines");
    let running = json!({
        "metadata": { "name": "name", "namespace": "trace", "creationTimestamp": "2026-11-22T11:09:30Z", "labels": { "node": "node-1" } },
        "spec": { "providerID": "local:///node-1" },
        "status": { "currentStatus": { "phase": "Running" } }
    });
    let pending = json!({ "metadata": { "name": "pending", "creationTimestamp": "2026-11-22T11:05:19Z" } });
    let t = table(
        &machines,
        &[&running, &pending],
        true,
        json!({ "resourceVersion": "12472", "continue": "x" }),
        now(),
        TABLE_V1,
    );
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(
        t["metadata"],
        json!({ "resourceVersion": "12472", "continue": "x" })
    );
    let names = column_names(&t);
    assert_eq!(
        names,
        [
            ("Name".into(), 0),
            ("Status".into(), 0),
            ("Age".into(), 0),
            ("Node".into(), 0),
            ("ProviderID".into(), 1)
        ]
    );
    assert_eq!(t["columnDefinitions"][0]["format"], "name");
    assert_eq!(t["columnDefinitions"][2]["type"], "date");
    assert_eq!(
        t["rows"][0]["cells"],
        json!(["name", "Running", "30s", "node-1", "local:///node-1"])
    );
    assert_eq!(
        t["rows"][1]["cells"],
        json!(["pending", null, "4m41s", null, null])
    );
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(t["rows"][0]["object"]["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(t["rows"][0]["object"]["metadata"]["labels"]["node"], "node-1");

    let event = table(
        &machines,
        &[&pending],
        false,
        json!({ "resourceVersion": "9" }),
        now(),
        TABLE_V1BETA1,
    );
    assert!(event["columnDefinitions"].is_null());
    assert_eq!(event["rows"].as_array().unwrap().len(), 1);
    assert_eq!(event["rows"][0]["object"]["apiVersion"], "meta.k8s.io/v1beta1");
}

#[test]
fn integer_columns_stay_numbers_and_classes_get_name_age() {
    let mcd = def("machine.sapcloud.io", "machinedeployments");
    let obj = json!({ "metadata": { "name": "workers" }, "spec": { "replicas": 3 }, "status": { "readyReplicas": 2.0, "availableReplicas": "x" } });
    let t = table(&mcd, &[&obj], true, Value::Null, now(), TABLE_V1);
    assert_eq!(t["metadata"], json!({}));
    assert_eq!(t["rows"][0]["cells"], json!(["workers", 2, 3, null, null, null]));
    let mcc = def("machine.sapcloud.io", "machineclasses");
    let t = table(
        &mcc,
        &[&json!({ "metadata": { "name": "c", "creationTimestamp": "2026-11-20T11:10:00Z" } })],
        true,
        json!({}),
        now(),
        TABLE_V1,
    );
    assert_eq!(column_names(&t), [("Name".into(), 0), ("Age".into(), 0)]);
    assert_eq!(t["rows"][0]["cells"], json!(["c", "2d"]));
}

#[test]
fn json_paths() {
    let obj = json!({ "metadata": { "labels": { "a.b/c": "x", "node": "n" } }, "items": [1, { "k": true }], "z": null });
    assert_eq!(eval_path(&obj, ".metadata.labels.node"), Some(&json!("n")));
    assert_eq!(eval_path(&obj, ".metadata.labels['a.b/c']"), Some(&json!("x")));
    assert_eq!(
        eval_path(&obj, "{.metadata.labels[\"a.b/c\"]}"),
        Some(&json!("x"))
    );
    assert_eq!(eval_path(&obj, ".items[1].k"), Some(&json!(true)));
    assert_eq!(eval_path(&obj, ".items[-2]"), Some(&json!(1)));
    assert_eq!(eval_path(&obj, ".items[5]"), None);
    assert_eq!(eval_path(&obj, ".items[*]"), None);
    assert_eq!(eval_path(&obj, ".metadata..labels"), None);
    assert_eq!(eval_path(&obj, "metadata"), None);
    assert_eq!(eval_path(&obj, ""), None);
    assert_eq!(eval_path(&obj, ".metadata.labels['unterminated"), None);
    assert_eq!(
        custom_cell("string", eval_path(&obj, ".items[0]"), now()),
        json!("1")
    );
    assert_eq!(custom_cell("string", eval_path(&obj, ".z"), now()), Value::Null);
    assert_eq!(
        custom_cell("boolean", eval_path(&obj, ".items[1].k"), now()),
        json!(true)
    );
    assert_eq!(
        custom_cell("date", Some(&json!("garbage")), now()),
        json!("<invalid>")
    );
}
