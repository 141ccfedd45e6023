//! Server-side printing: `meta.k8s.io` Tables for `kubectl get` (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`).
//!
//! kubectl prints whatever columns and cells the server sends, so the server decides what `get` shows. Custom
//! resources get their CRD printer columns (or Name, Age); built-ins get the columns of the real server's printers
//! (`kubectl get nodes`, `get pods -o wide`, ...). Cells are computed from the stored JSON, ages against `now`.
//!
//! This file holds the negotiation ([`wants_table`]) and the Table itself; the printers are in the submodules:
//! `printer` (columns, and which printer a resource gets), `custom` (CRD columns), `builtins`, `pods`, `events`
//! and `storage` (the built-in kinds), `values` (JSON readers they share) and `age` (HumanDuration).

mod age;
mod builtins;
mod custom;
mod events;
mod pods;
mod printer;
mod storage;
#[cfg(test)]
mod tests;
mod values;

use jiff::Timestamp;
use serde_json::{Map, Value, json};

pub use age::human_age;
use printer::Printer;

use crate::discovery::media_ranges;
use crate::registry::ResourceDef;

/// apiVersion of Tables in the `v1` flavour.
pub const TABLE_V1: &str = "meta.k8s.io/v1";
/// apiVersion of Tables in the older `v1beta1` flavour, which kubectl also accepts.
pub const TABLE_V1BETA1: &str = "meta.k8s.io/v1beta1";

/// True when an Accept header asks for a meta.k8s.io Table (v1 or v1beta1) before plain JSON: returns the Table
/// apiVersion to answer with, `"meta.k8s.io/v1"` or `"meta.k8s.io/v1beta1"`.
pub fn wants_table(accept: &str) -> Option<&'static str> {
    for range in media_ranges(accept) {
        if range.essence == "application/json"
            && range.param("as") == Some("Table")
            && range.param("g") == Some("meta.k8s.io")
        {
            match range.param("v") {
                Some("v1") => return Some(TABLE_V1),
                Some("v1beta1") => return Some(TABLE_V1BETA1),
                _ => continue,
            }
        }
        if range.is_plain_json() || range.is_wildcard() {
            return None;
        }
    }
    None
}
/// kube-apiserver reads it. `kubectl get --sort-by` (and any client that needs more than the cells) asks for
/// `Object`; without the parameter a row carries the object's metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IncludeObject {
    /// `"object": null`.
    None,
    /// A `PartialObjectMetadata` of the object (the default).
    #[default]
    Metadata,
    /// The whole object, as a plain GET returns it.
    Object,
}

impl IncludeObject {
    /// Reads the `includeObject` query parameter (absent or empty: [`IncludeObject::Metadata`]); the error names
    /// the parameter and the values it takes, as kube-apiserver's validation of TableOptions does.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value.unwrap_or_default() {
            "" | "Metadata" => Ok(Self::Metadata),
            "None" => Ok(Self::None),
            "Object" => Ok(Self::Object),
            other => Err(format!(
                "includeObject: Unsupported value: {other:?}: supported values: \"Metadata\", \"None\", \"Object\""
            )),
        }
    }

    fn row_object(self, obj: &Value, api_version: &str) -> Value {
        match self {
            Self::None => Value::Null,
            Self::Metadata => {
                let metadata = obj
                    .get("metadata")
                    .filter(|m| m.is_object())
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                json!({ "kind": "PartialObjectMetadata", "apiVersion": api_version, "metadata": metadata })
            }
            Self::Object => obj.clone(),
        }
    }
}

/// A Table for these objects (a list, one object, or a one-row watch event) whose rows carry their objects'
/// metadata (`includeObject=Metadata`, the default); see [`table_with`].
pub fn table(
    def: &ResourceDef,
    objects: &[&Value],
    column_definitions: bool,
    list_metadata: Value,
    now: Timestamp,
    api_version: &str,
) -> Value {
    table_with(
        def,
        objects,
        IncludeObject::Metadata,
        column_definitions,
        list_metadata,
        now,
        api_version,
    )
}

/// A Table for these objects (a list, one object, or a one-row watch event), each row carrying what `include`
/// asks for. `column_definitions` false writes `"columnDefinitions": null` (watch events after the first).
/// `list_metadata` is copied to the Table's metadata (resourceVersion, continue, remainingItemCount). `now` renders
/// ages. `api_version` is what [`wants_table`] chose.
pub fn table_with(
    def: &ResourceDef,
    objects: &[&Value],
    include: IncludeObject,
    column_definitions: bool,
    list_metadata: Value,
    now: Timestamp,
    api_version: &str,
) -> Value {
    let printer = Printer::of(def);
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            json!({
                "cells": printer.cells(obj, now),
                "object": include.row_object(obj, api_version),
            })
        })
        .collect();
    let metadata = if list_metadata.is_object() {
        list_metadata
    } else {
        json!({})
    };
    let mut out = Map::new();
    out.insert("kind".into(), json!("Table"));
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("metadata".into(), metadata);
    out.insert(
        "columnDefinitions".into(),
        if column_definitions {
            Value::Array(printer.columns())
        } else {
            Value::Null
        },
    );
    out.insert("rows".into(), Value::Array(rows));
    Value::Object(out)
}
