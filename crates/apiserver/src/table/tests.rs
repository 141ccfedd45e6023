//! Unit tests of server-side printing, one concern per file in `tests/`; the fixtures they share are here.

use std::sync::Arc;

use jiff::Timestamp;
use serde_json::Value;

use crate::registry::ResourceDef;

mod age;
mod builtins;
mod custom;
mod negotiation;

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

fn now() -> Timestamp {
    "2026-11-22T11:10:00Z".parse().unwrap()
}

fn def(group: &str, plural: &str) -> Arc<ResourceDef> {
    let registry = crate::preinstalled::registry();
    let version = if group == "machine.sapcloud.io" {
        "v1alpha1"
    } else {
        "v1"
    };
    registry.find(group, version, plural).unwrap()
}

fn column_names(table: &Value) -> Vec<(String, i64)> {
    table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["priority"].as_i64().unwrap(),
            )
        })
        .collect()
}
