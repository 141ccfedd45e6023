//! Accept negotiation and what each row carries (`includeObject`).

use serde_json::{Value, json};

use super::{TABLE, def, now};
use crate::table::{IncludeObject, TABLE_V1, TABLE_V1BETA1, table_with, wants_table};

#[test]
fn rows_carry_what_include_object_asks_for() {
    let event = json!({ "kind": "Event", "apiVersion": "v1", "metadata": { "name": "e" }, "lastTimestamp": "2026-11-22T11:09:00Z" });
    let events = def("", "events");
    let row = |include| {
        table_with(&events, &[&event], include, true, json!({}), now(), TABLE_V1)["rows"][0]["object"].clone()
    };
    assert_eq!(row(IncludeObject::Object), event);
    assert_eq!(row(IncludeObject::None), Value::Null);
    assert_eq!(
        row(IncludeObject::Metadata),
        json!({ "kind": "PartialObjectMetadata", "apiVersion": TABLE_V1, "metadata": { "name": "e" } })
    );
    assert_eq!(IncludeObject::parse(None), Ok(IncludeObject::Metadata));
    assert_eq!(IncludeObject::parse(Some("Object")), Ok(IncludeObject::Object));
    assert_eq!(IncludeObject::parse(Some("None")), Ok(IncludeObject::None));
    let err = IncludeObject::parse(Some("Everything")).unwrap_err();
    assert!(
        err.starts_with("includeObject: Unsupported value: \"Everything\""),
        "{err}"
    );
}

#[test]
fn accept_negotiation() {
    assert_eq!(wants_table(TABLE), Some(TABLE_V1));
    assert_eq!(
        wants_table("application/json;as=Table;v=v1beta1;g=meta.k8s.io"),
        Some(TABLE_V1BETA1)
    );
    assert_eq!(wants_table("application/json"), None);
    assert_eq!(wants_table("application/json;as=Table;v=v2;g=meta.k8s.io"), None);
    assert_eq!(
        wants_table(
            "application/json;as=Table;v=v2;g=meta.k8s.io,application/json;as=Table;v=v1;g=meta.k8s.io"
        ),
        Some(TABLE_V1)
    );
    assert_eq!(
        wants_table("application/json, application/json;as=Table;v=v1;g=meta.k8s.io"),
        None
    );
    assert_eq!(
        wants_table("application/vnd.kubernetes.protobuf,application/json"),
        None
    );
    assert_eq!(wants_table("*/*"), None);
    assert_eq!(wants_table(""), None);
}
