//! The columns of a Table and the choice of printer per resource: CRD printer columns for custom resources, the
//! real server's columns and row function for each built-in kind (Name, Age for the rest).

use jiff::Timestamp;
use serde_json::{Value, json};

use super::age::age_since;
use super::builtins::{
    CSR_COLUMNS, DEFAULT_COLUMNS, LEASE_COLUMNS, NAMESPACE_COLUMNS, NODE_COLUMNS, PDB_COLUMNS,
    SECRET_COLUMNS, csr_row, default_row, lease_row, namespace_row, node_row, pdb_row, secret_row,
};
use super::custom::{custom_cell, eval_path};
use super::events::{EVENT_COLUMNS, core_event_row, events_event_row};
use super::pods::{POD_COLUMNS, pod_row};
use super::storage::{
    PV_COLUMNS, PVC_COLUMNS, VOLUME_ATTACHMENT_COLUMNS, pv_row, pvc_row, volume_attachment_row,
};
use super::values::{name_of, str_at};
use crate::registry::ResourceDef;

pub(super) const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although \
    some resources may allow a client to request the generation of a name automatically. Name is primarily intended \
    for creation idempotence and configuration definition. Cannot be updated. More info: \
    https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
pub(super) const AGE_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was \
    created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set \
    this value. It is represented in RFC3339 form and is in UTC.";

/// A column of a built-in printer.
pub(super) struct Col {
    pub(super) name: &'static str,
    pub(super) type_: &'static str,
    pub(super) format: &'static str,
    pub(super) description: &'static str,
    pub(super) priority: i32,
}

pub(super) const fn col(name: &'static str, description: &'static str) -> Col {
    Col {
        name,
        type_: "string",
        format: "",
        description,
        priority: 0,
    }
}

pub(super) const fn wide(name: &'static str, description: &'static str) -> Col {
    Col {
        name,
        type_: "string",
        format: "",
        description,
        priority: 1,
    }
}

pub(super) const NAME: Col = Col {
    name: "Name",
    type_: "string",
    format: "name",
    description: NAME_DESCRIPTION,
    priority: 0,
};
pub(super) const AGE: Col = col("Age", AGE_DESCRIPTION);

fn column_json(name: &str, type_: &str, format: &str, description: &str, priority: i32) -> Value {
    json!({ "name": name, "type": type_, "format": format, "description": description, "priority": priority })
}

type RowFn = fn(&Value, Timestamp) -> Vec<Value>;

/// How a resource's rows are printed.
pub(super) enum Printer<'a> {
    /// A custom resource with its CRD columns (empty: Name, Age).
    Custom(&'a ResourceDef),
    /// A built-in kind with the real server's columns.
    Builtin(&'static [Col], RowFn),
}

impl<'a> Printer<'a> {
    pub(super) fn of(def: &'a ResourceDef) -> Self {
        if def.custom {
            return Printer::Custom(def);
        }
        match (def.group.as_str(), def.kind.as_str()) {
            ("", "Node") => Printer::Builtin(NODE_COLUMNS, node_row),
            ("", "Pod") => Printer::Builtin(POD_COLUMNS, pod_row),
            ("", "Namespace") => Printer::Builtin(NAMESPACE_COLUMNS, namespace_row),
            ("", "Secret") => Printer::Builtin(SECRET_COLUMNS, secret_row),
            ("", "Event") => Printer::Builtin(EVENT_COLUMNS, core_event_row),
            ("events.k8s.io", "Event") => Printer::Builtin(EVENT_COLUMNS, events_event_row),
            ("", "PersistentVolume") => Printer::Builtin(PV_COLUMNS, pv_row),
            ("", "PersistentVolumeClaim") => Printer::Builtin(PVC_COLUMNS, pvc_row),
            ("coordination.k8s.io", "Lease") => Printer::Builtin(LEASE_COLUMNS, lease_row),
            ("storage.k8s.io", "VolumeAttachment") => {
                Printer::Builtin(VOLUME_ATTACHMENT_COLUMNS, volume_attachment_row)
            }
            ("policy", "PodDisruptionBudget") => Printer::Builtin(PDB_COLUMNS, pdb_row),
            ("certificates.k8s.io", "CertificateSigningRequest") => Printer::Builtin(CSR_COLUMNS, csr_row),
            _ => Printer::Builtin(DEFAULT_COLUMNS, default_row),
        }
    }

    pub(super) fn columns(&self) -> Vec<Value> {
        match self {
            Printer::Custom(def) => {
                let mut out = vec![column_json(
                    NAME.name,
                    NAME.type_,
                    NAME.format,
                    NAME.description,
                    0,
                )];
                if def.columns.is_empty() {
                    out.push(column_json("Age", "date", "", AGE_DESCRIPTION, 0));
                }
                out.extend(
                    def.columns
                        .iter()
                        .map(|c| column_json(&c.name, &c.type_, "", &c.description, c.priority)),
                );
                out
            }
            Printer::Builtin(cols, _) => cols
                .iter()
                .map(|c| column_json(c.name, c.type_, c.format, c.description, c.priority))
                .collect(),
        }
    }

    pub(super) fn cells(&self, obj: &Value, now: Timestamp) -> Vec<Value> {
        match self {
            Printer::Custom(def) => {
                let mut cells = vec![json!(name_of(obj))];
                if def.columns.is_empty() {
                    cells.push(json!(age_since(
                        str_at(obj, &["metadata", "creationTimestamp"]),
                        now
                    )));
                }
                cells.extend(
                    def.columns
                        .iter()
                        .map(|c| custom_cell(&c.type_, eval_path(obj, &c.json_path), now)),
                );
                cells
            }
            Printer::Builtin(_, row) => row(obj, now),
        }
    }
}
