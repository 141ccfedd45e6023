//! Server-side printing: `meta.k8s.io` Tables for `kubectl get` (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`).
//!
//! kubectl prints whatever columns and cells the server sends, so the server decides what `get` shows. Custom
//! resources get their CRD printer columns (or Name, Age); built-ins get the columns of the real server's printers
//! (`kubectl get nodes`, `get pods -o wide`, ...). Cells are computed from the stored JSON, ages against `now`.

use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Map, Value, json};

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

/// Kubernetes' human-readable age ("0s", "30s", "4m41s", "3h12m", "5d", "2y"), as duration.HumanDuration prints it.
pub fn human_age(age: Duration) -> String {
    let seconds = age.as_secs();
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Age of an RFC 3339 timestamp at `now`, as the real server renders it: "<unknown>" when absent or empty,
/// "<invalid>" when unparsable or more than a second in the future.
fn age_since(timestamp: Option<&str>, now: Timestamp) -> String {
    let Some(text) = timestamp.filter(|t| !t.is_empty()) else {
        return "<unknown>".to_owned();
    };
    let Ok(ts) = text.parse::<Timestamp>() else {
        return "<invalid>".to_owned();
    };
    age_at(ts, now)
}

/// Age of a timestamp at `now`; "<invalid>" when more than a second in the future.
fn age_at(ts: Timestamp, now: Timestamp) -> String {
    let seconds = now.duration_since(ts).as_secs();
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    human_age(Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
}

/// What each row of a Table carries besides its cells: the `includeObject` query parameter of a Table request, as
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

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although \
    some resources may allow a client to request the generation of a name automatically. Name is primarily intended \
    for creation idempotence and configuration definition. Cannot be updated. More info: \
    https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was \
    created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set \
    this value. It is represented in RFC3339 form and is in UTC.";

/// A column of a built-in printer.
struct Col {
    name: &'static str,
    type_: &'static str,
    format: &'static str,
    description: &'static str,
    priority: i32,
}

const fn col(name: &'static str, description: &'static str) -> Col {
    Col {
        name,
        type_: "string",
        format: "",
        description,
        priority: 0,
    }
}

const fn wide(name: &'static str, description: &'static str) -> Col {
    Col {
        name,
        type_: "string",
        format: "",
        description,
        priority: 1,
    }
}

const NAME: Col = Col {
    name: "Name",
    type_: "string",
    format: "name",
    description: NAME_DESCRIPTION,
    priority: 0,
};
const AGE: Col = col("Age", AGE_DESCRIPTION);

fn column_json(name: &str, type_: &str, format: &str, description: &str, priority: i32) -> Value {
    json!({ "name": name, "type": type_, "format": format, "description": description, "priority": priority })
}

type RowFn = fn(&Value, Timestamp) -> Vec<Value>;

/// How a resource's rows are printed.
enum Printer<'a> {
    /// A custom resource with its CRD columns (empty: Name, Age).
    Custom(&'a ResourceDef),
    /// A built-in kind with the real server's columns.
    Builtin(&'static [Col], RowFn),
}

impl<'a> Printer<'a> {
    fn of(def: &'a ResourceDef) -> Self {
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

    fn columns(&self) -> Vec<Value> {
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

    fn cells(&self, obj: &Value, now: Timestamp) -> Vec<Value> {
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

// ---------------------------------------------------------------------------------------------------------------
// Value helpers.

fn at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter().try_fold(v, |cur, key| cur.get(key))
}

fn str_at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v str> {
    at(v, path).and_then(Value::as_str)
}

fn string_at(v: &Value, path: &[&str]) -> String {
    str_at(v, path).unwrap_or_default().to_owned()
}

fn array_at<'v>(v: &'v Value, path: &[&str]) -> &'v [Value] {
    at(v, path).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn int_at(v: &Value, path: &[&str]) -> i64 {
    at(v, path).and_then(Value::as_i64).unwrap_or(0)
}

fn name_of(obj: &Value) -> String {
    string_at(obj, &["metadata", "name"])
}

fn creation_age(obj: &Value, now: Timestamp) -> Value {
    json!(age_since(str_at(obj, &["metadata", "creationTimestamp"]), now))
}

fn is_deleting(obj: &Value) -> bool {
    at(obj, &["metadata", "deletionTimestamp"]).is_some_and(|t| !t.is_null())
}

/// An int-or-string as text (`2`, `"50%"`).
fn int_or_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Custom resources: CRD printer columns.

/// Evaluates a simple JSON path (`.a.b`, `.metadata.labels['a.b/c']`, `.items[0]`, optionally in `{}`); None when
/// the path leads nowhere or uses unsupported syntax.
fn eval_path<'v>(obj: &'v Value, path: &str) -> Option<&'v Value> {
    let mut rest = path.trim();
    if let Some(inner) = rest.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
        rest = inner.trim();
    }
    let mut cur = obj;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            if key.is_empty() {
                return None;
            }
            cur = cur.as_object()?.get(key)?;
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let r = r.trim_start();
            if let Some(quote) = r.chars().next().filter(|c| *c == '\'' || *c == '"') {
                let body = &r[1..];
                let close = body.find(quote)?;
                let key = &body[..close];
                rest = body[close + 1..].trim_start().strip_prefix(']')?;
                cur = cur.as_object()?.get(key)?;
            } else {
                let close = r.find(']')?;
                let index: i64 = r[..close].trim().parse().ok()?;
                rest = &r[close + 1..];
                let items = cur.as_array()?;
                let len = i64::try_from(items.len()).ok()?;
                let index = if index < 0 { len + index } else { index };
                cur = items.get(usize::try_from(index).ok()?)?;
            }
        } else {
            return None;
        }
    }
    Some(cur)
}

/// A cell of a CRD column, typed as the apiextensions server types it; missing or mistyped values are null.
fn custom_cell(type_: &str, value: Option<&Value>, now: Timestamp) -> Value {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Value::Null;
    };
    match type_ {
        "string" => match value {
            Value::String(s) => json!(s),
            Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_) => {
                json!(value.to_string())
            }
            Value::Null => Value::Null,
        },
        "integer" => value
            .as_i64()
            .map(Value::from)
            .or_else(|| value.as_f64().map(|f| json!(f as i64)))
            .unwrap_or(Value::Null),
        "number" => value.as_f64().map_or(Value::Null, |f| json!(f)),
        "boolean" => value.as_bool().map_or(Value::Null, Value::from),
        "date" => value
            .as_str()
            .map_or(Value::Null, |s| json!(age_since(Some(s), now))),
        _ => Value::Null,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Built-in printers, after the real server's (pkg/printers/internalversion).

const DEFAULT_COLUMNS: &[Col] = &[NAME, AGE];

fn default_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![json!(name_of(obj)), creation_age(obj, now)]
}

const NODE_COLUMNS: &[Col] = &[
    NAME,
    col("Status", "The status of the node"),
    col("Roles", "The roles of the node"),
    AGE,
    col("Version", "Kubelet Version reported by the node."),
    wide("Internal-IP", "List of addresses reachable to the node."),
    wide("External-IP", "List of addresses reachable to the node."),
    wide(
        "OS-Image",
        "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
    ),
    wide(
        "Kernel-Version",
        "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
    ),
    wide(
        "Container-Runtime",
        "ContainerRuntime Version reported by the node through runtime remote API.",
    ),
];

fn node_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let ready = array_at(obj, &["status", "conditions"])
        .iter()
        .rev()
        .find(|c| c.get("type") == Some(&json!("Ready")));
    let mut status = vec![match ready {
        Some(c) if c.get("status") == Some(&json!("True")) => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    }];
    if at(obj, &["spec", "unschedulable"])
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        status.push("SchedulingDisabled");
    }
    let mut roles: Vec<&str> = Vec::new();
    if let Some(labels) = at(obj, &["metadata", "labels"]).and_then(Value::as_object) {
        for (key, value) in labels {
            let role = if let Some(role) = key.strip_prefix("node-role.kubernetes.io/") {
                role
            } else if key == "kubernetes.io/role" {
                value.as_str().unwrap_or_default()
            } else {
                ""
            };
            if !role.is_empty() && !roles.contains(&role) {
                roles.push(role);
            }
        }
    }
    roles.sort_unstable();
    let roles = if roles.is_empty() {
        "<none>".to_owned()
    } else {
        roles.join(",")
    };
    let address = |kind: &str| {
        array_at(obj, &["status", "addresses"])
            .iter()
            .find(|a| a.get("type").and_then(Value::as_str) == Some(kind))
            .and_then(|a| a.get("address").and_then(Value::as_str))
            .unwrap_or("<none>")
            .to_owned()
    };
    let info = |field: &str| {
        let value = string_at(obj, &["status", "nodeInfo", field]);
        if value.is_empty() {
            "<unknown>".to_owned()
        } else {
            value
        }
    };
    vec![
        json!(name_of(obj)),
        json!(status.join(",")),
        json!(roles),
        creation_age(obj, now),
        json!(string_at(obj, &["status", "nodeInfo", "kubeletVersion"])),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(info("osImage")),
        json!(info("kernelVersion")),
        json!(info("containerRuntimeVersion")),
    ]
}

const POD_COLUMNS: &[Col] = &[
    NAME,
    col(
        "Ready",
        "The aggregate readiness state of this pod for accepting traffic.",
    ),
    col("Status", "The aggregate status of the containers in this pod."),
    col(
        "Restarts",
        "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
    ),
    AGE,
    wide(
        "IP",
        "podIP address allocated to the pod. Routable at least within the cluster.",
    ),
    wide("Node", "NodeName indicates in which node this pod is scheduled."),
    wide(
        "Nominated Node",
        "nominatedNodeName is set only when this pod preempts other pods on the node.",
    ),
    wide(
        "Readiness Gates",
        "If specified, all readiness gates will be evaluated for pod readiness.",
    ),
];

fn condition_true(obj: &Value, type_: &str) -> bool {
    array_at(obj, &["status", "conditions"]).iter().any(|c| {
        c.get("type").and_then(Value::as_str) == Some(type_)
            && c.get("status").and_then(Value::as_str) == Some("True")
    })
}

/// Latest `lastState.terminated.finishedAt` of a container status, if later than `latest`.
fn later_restart(status: &Value, latest: Option<Timestamp>) -> Option<Timestamp> {
    let finished =
        str_at(status, &["lastState", "terminated", "finishedAt"]).and_then(|t| t.parse::<Timestamp>().ok());
    match (latest, finished) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Counters of the pod printer, updated by the init-container and container passes.
#[derive(Default)]
struct PodCounts {
    ready: usize,
    restarts: i64,
    last_restart: Option<Timestamp>,
}

/// The reason of a terminated container state (`Init:` prefixed for init containers).
fn terminated_reason(t: &Value, prefix: &str) -> String {
    let reason = str_at(t, &["reason"]).unwrap_or_default();
    if !reason.is_empty() {
        format!("{prefix}{reason}")
    } else if int_at(t, &["signal"]) != 0 {
        format!("{prefix}Signal:{}", int_at(t, &["signal"]))
    } else {
        format!("{prefix}ExitCode:{}", int_at(t, &["exitCode"]))
    }
}

/// The init-container pass of printPod: counts restarts (all, and of restartable sidecars separately), ready
/// sidecars, and returns the `Init:` reason while the pod is still initializing.
fn init_containers(obj: &Value, counts: &mut PodCounts, sidecars: &mut PodCounts) -> Option<String> {
    let specs = array_at(obj, &["spec", "initContainers"]);
    let restartable = |name: Option<&str>| {
        specs.iter().any(|c| {
            c.get("name").and_then(Value::as_str) == name
                && c.get("restartPolicy").and_then(Value::as_str) == Some("Always")
        })
    };
    for (i, c) in array_at(obj, &["status", "initContainerStatuses"])
        .iter()
        .enumerate()
    {
        let count = int_at(c, &["restartCount"]);
        counts.restarts = counts.restarts.saturating_add(count);
        counts.last_restart = later_restart(c, counts.last_restart);
        let is_restartable = restartable(c.get("name").and_then(Value::as_str));
        if is_restartable {
            sidecars.restarts = sidecars.restarts.saturating_add(count);
            sidecars.last_restart = later_restart(c, sidecars.last_restart);
        }
        let terminated = at(c, &["state", "terminated"]).filter(|t| t.is_object());
        if terminated.is_some_and(|t| int_at(t, &["exitCode"]) == 0) {
            continue;
        }
        if is_restartable && c.get("started").and_then(Value::as_bool).unwrap_or(false) {
            if c.get("ready").and_then(Value::as_bool).unwrap_or(false) {
                counts.ready += 1;
            }
            continue;
        }
        let waiting_reason = str_at(c, &["state", "waiting", "reason"]).unwrap_or_default();
        return Some(if let Some(t) = terminated {
            terminated_reason(t, "Init:")
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            format!("Init:{waiting_reason}")
        } else {
            format!("Init:{i}/{}", specs.len())
        });
    }
    None
}

/// The pod's Ready, Status and Restarts cells, following the real server's printPod.
fn pod_summary(obj: &Value, now: Timestamp) -> (String, String, String) {
    let phase = str_at(obj, &["status", "phase"]).unwrap_or_default();
    let status_reason = str_at(obj, &["status", "reason"]).unwrap_or_default();
    let mut reason = if status_reason.is_empty() {
        phase.to_owned()
    } else {
        status_reason.to_owned()
    };
    if array_at(obj, &["status", "conditions"]).iter().any(|c| {
        c.get("type").and_then(Value::as_str) == Some("PodScheduled")
            && c.get("reason").and_then(Value::as_str) == Some("SchedulingGated")
    }) {
        "SchedulingGated".clone_into(&mut reason);
    }
    let init_specs = array_at(obj, &["spec", "initContainers"]);
    let total = array_at(obj, &["spec", "containers"]).len()
        + init_specs
            .iter()
            .filter(|c| c.get("restartPolicy").and_then(Value::as_str) == Some("Always"))
            .count();
    let mut counts = PodCounts::default();
    let mut sidecars = PodCounts::default();
    let init_reason = init_containers(obj, &mut counts, &mut sidecars);
    let initializing = init_reason.is_some();
    if let Some(init_reason) = init_reason {
        reason = init_reason;
    }
    if !initializing || condition_true(obj, "Initialized") {
        counts.restarts = sidecars.restarts;
        counts.last_restart = sidecars.last_restart;
        let mut has_running = false;
        for c in array_at(obj, &["status", "containerStatuses"]).iter().rev() {
            counts.restarts = counts.restarts.saturating_add(int_at(c, &["restartCount"]));
            counts.last_restart = later_restart(c, counts.last_restart);
            let waiting_reason = str_at(c, &["state", "waiting", "reason"]).unwrap_or_default();
            let terminated = at(c, &["state", "terminated"]).filter(|t| t.is_object());
            let running = at(c, &["state", "running"]).is_some_and(Value::is_object);
            if !waiting_reason.is_empty() {
                waiting_reason.clone_into(&mut reason);
            } else if let Some(t) = terminated {
                reason = terminated_reason(t, "");
            } else if c.get("ready").and_then(Value::as_bool).unwrap_or(false) && running {
                has_running = true;
                counts.ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let now_reason = if condition_true(obj, "Ready") {
                "Running"
            } else {
                "NotReady"
            };
            now_reason.clone_into(&mut reason);
        }
    }
    if is_deleting(obj) && status_reason == "NodeLost" {
        "Unknown".clone_into(&mut reason);
    } else if is_deleting(obj) && phase != "Succeeded" && phase != "Failed" {
        "Terminating".clone_into(&mut reason);
    }
    let restarts = match counts.last_restart {
        Some(ts) if counts.restarts != 0 => format!("{} ({} ago)", counts.restarts, age_at(ts, now)),
        _ => counts.restarts.to_string(),
    };
    (format!("{}/{total}", counts.ready), reason, restarts)
}

fn pod_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (ready, status, restarts) = pod_summary(obj, now);
    let or_none = |s: String| if s.is_empty() { "<none>".to_owned() } else { s };
    let ip = array_at(obj, &["status", "podIPs"])
        .first()
        .and_then(|p| p.get("ip").and_then(Value::as_str))
        .or_else(|| str_at(obj, &["status", "podIP"]))
        .unwrap_or_default()
        .to_owned();
    let gates = array_at(obj, &["spec", "readinessGates"]);
    let readiness_gates = if gates.is_empty() {
        "<none>".to_owned()
    } else {
        let conditions = array_at(obj, &["status", "conditions"]);
        let true_count = gates
            .iter()
            .filter(|gate| {
                let wanted = gate.get("conditionType");
                conditions
                    .iter()
                    .find(|c| c.get("type") == wanted)
                    .is_some_and(|c| c.get("status") == Some(&json!("True")))
            })
            .count();
        format!("{true_count}/{}", gates.len())
    };
    vec![
        json!(name_of(obj)),
        json!(ready),
        json!(status),
        json!(restarts),
        creation_age(obj, now),
        json!(or_none(ip)),
        json!(or_none(string_at(obj, &["spec", "nodeName"]))),
        json!(or_none(string_at(obj, &["status", "nominatedNodeName"]))),
        json!(readiness_gates),
    ]
}

const NAMESPACE_COLUMNS: &[Col] = &[NAME, col("Status", "The status of the namespace"), AGE];

fn namespace_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(name_of(obj)),
        json!(string_at(obj, &["status", "phase"])),
        creation_age(obj, now),
    ]
}

const SECRET_COLUMNS: &[Col] = &[
    NAME,
    col("Type", "Used to facilitate programmatic handling of secret data."),
    col("Data", "Data contains the secret data."),
    AGE,
];

fn secret_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let type_ = str_at(obj, &["type"])
        .filter(|t| !t.is_empty())
        .unwrap_or("Opaque");
    let data = at(obj, &["data"]).and_then(Value::as_object).map_or(0, Map::len);
    vec![
        json!(name_of(obj)),
        json!(type_),
        json!(data),
        creation_age(obj, now),
    ]
}

const EVENT_COLUMNS: &[Col] = &[
    col(
        "Last Seen",
        "The time at which the most recent occurrence of this event was recorded.",
    ),
    col(
        "Type",
        "Type of this event (Normal, Warning), new types could be added in the future",
    ),
    col(
        "Reason",
        "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
    ),
    col("Object", "The object that this event is about."),
    wide(
        "Subobject",
        "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement.",
    ),
    wide("Source", "The component reporting this event."),
    col(
        "Message",
        "A human-readable description of the status of this operation.",
    ),
    wide("First Seen", "The time at which the event was first recorded."),
    wide("Count", "The number of times this event has occurred."),
    Col {
        name: "Name",
        type_: "string",
        format: "name",
        description: NAME_DESCRIPTION,
        priority: 1,
    },
];

/// The fields of an event that its table shows, read from either event API.
struct EventView<'v> {
    first_timestamp: Option<&'v str>,
    last_timestamp: Option<&'v str>,
    event_time: Option<&'v str>,
    series: Option<&'v Value>,
    count: i64,
    object: &'v Value,
    type_: &'v str,
    reason: &'v str,
    message: &'v str,
    source_component: &'v str,
    source_host: &'v str,
    reporting_controller: &'v str,
    reporting_instance: &'v str,
}

fn core_event_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let s = |path: &[&str]| str_at(obj, path).unwrap_or_default();
    event_row(
        obj,
        &EventView {
            first_timestamp: str_at(obj, &["firstTimestamp"]),
            last_timestamp: str_at(obj, &["lastTimestamp"]),
            event_time: str_at(obj, &["eventTime"]),
            series: at(obj, &["series"]).filter(|v| v.is_object()),
            count: int_at(obj, &["count"]),
            object: at(obj, &["involvedObject"]).unwrap_or(&Value::Null),
            type_: s(&["type"]),
            reason: s(&["reason"]),
            message: s(&["message"]),
            source_component: s(&["source", "component"]),
            source_host: s(&["source", "host"]),
            reporting_controller: s(&["reportingComponent"]),
            reporting_instance: s(&["reportingInstance"]),
        },
        now,
    )
}

fn events_event_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let s = |path: &[&str]| str_at(obj, path).unwrap_or_default();
    event_row(
        obj,
        &EventView {
            first_timestamp: str_at(obj, &["deprecatedFirstTimestamp"]),
            last_timestamp: str_at(obj, &["deprecatedLastTimestamp"]),
            event_time: str_at(obj, &["eventTime"]),
            series: at(obj, &["series"]).filter(|v| v.is_object()),
            count: int_at(obj, &["deprecatedCount"]),
            object: at(obj, &["regarding"]).unwrap_or(&Value::Null),
            type_: s(&["type"]),
            reason: s(&["reason"]),
            message: s(&["note"]),
            source_component: s(&["deprecatedSource", "component"]),
            source_host: s(&["deprecatedSource", "host"]),
            reporting_controller: s(&["reportingController"]),
            reporting_instance: s(&["reportingInstance"]),
        },
        now,
    )
}

fn event_row(obj: &Value, e: &EventView<'_>, now: Timestamp) -> Vec<Value> {
    let first_seen = match e.first_timestamp.filter(|t| !t.is_empty()) {
        Some(t) => age_since(Some(t), now),
        None => age_since(e.event_time, now),
    };
    let mut last_seen = match e.last_timestamp.filter(|t| !t.is_empty()) {
        Some(t) => age_since(Some(t), now),
        None => first_seen.clone(),
    };
    let mut count = e.count;
    if let Some(series) = e.series {
        last_seen = age_since(str_at(series, &["lastObservedTime"]), now);
        count = int_at(series, &["count"]);
    } else if count == 0 {
        count = 1;
    }
    let kind = str_at(e.object, &["kind"]).unwrap_or_default().to_lowercase();
    let target = match str_at(e.object, &["name"]).filter(|n| !n.is_empty()) {
        Some(name) => format!("{kind}/{name}"),
        None => kind,
    };
    let component = if e.source_component.is_empty() {
        e.reporting_controller
    } else {
        e.source_component
    };
    let instance = if e.source_host.is_empty() {
        e.reporting_instance
    } else {
        e.source_host
    };
    let source = match (component.is_empty(), instance.is_empty()) {
        (true, _) => String::new(),
        (false, true) => component.to_owned(),
        (false, false) => format!("{component}, {instance}"),
    };
    vec![
        json!(last_seen),
        json!(e.type_),
        json!(e.reason),
        json!(target),
        json!(str_at(e.object, &["fieldPath"]).unwrap_or_default()),
        json!(source),
        json!(e.message.trim()),
        json!(first_seen),
        json!(count),
        json!(name_of(obj)),
    ]
}

const LEASE_COLUMNS: &[Col] = &[
    NAME,
    col(
        "Holder",
        "holderIdentity contains the identity of the holder of a current lease.",
    ),
    AGE,
];

fn lease_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(name_of(obj)),
        json!(string_at(obj, &["spec", "holderIdentity"])),
        creation_age(obj, now),
    ]
}

const CSR_COLUMNS: &[Col] = &[
    NAME,
    AGE,
    col(
        "SignerName",
        "signerName indicates the requested signer, and is a qualified name.",
    ),
    col(
        "Requestor",
        "username contains the name of the user that created the CertificateSigningRequest.",
    ),
    col(
        "RequestedDuration",
        "expirationSeconds is the requested duration of validity of the issued certificate.",
    ),
    col(
        "Condition",
        "conditions applied to the request. Known conditions are \"Approved\", \"Denied\", and \"Failed\".",
    ),
];

/// The row kubectl prints for a CertificateSigningRequest; Condition is `Denied`, `Approved` or `Pending`, then
/// `,Failed` and `,Issued` when they apply, as the real server's printer writes it.
fn csr_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let or_none = |s: String| if s.is_empty() { "<none>".to_owned() } else { s };
    let duration = at(obj, &["spec", "expirationSeconds"])
        .and_then(Value::as_u64)
        .map_or_else(|| "<none>".to_owned(), |s| human_age(Duration::from_secs(s)));
    let conditions = at(obj, &["status", "conditions"])
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let has = |type_: &str| conditions.iter().any(|c| c["type"] == type_);
    let mut condition = if has("Denied") {
        "Denied"
    } else if has("Approved") {
        "Approved"
    } else {
        "Pending"
    }
    .to_owned();
    if has("Failed") {
        condition.push_str(",Failed");
    }
    if str_at(obj, &["status", "certificate"]).is_some_and(|c| !c.is_empty()) {
        condition.push_str(",Issued");
    }
    vec![
        json!(name_of(obj)),
        creation_age(obj, now),
        json!(or_none(string_at(obj, &["spec", "signerName"]))),
        json!(or_none(string_at(obj, &["spec", "username"]))),
        json!(duration),
        json!(condition),
    ]
}

/// Access modes as the real server abbreviates them, deduplicated in a fixed order.
fn access_modes(modes: &[Value]) -> String {
    let has = |mode: &str| modes.iter().any(|m| m.as_str() == Some(mode));
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(mode, _)| has(mode))
    .map(|(_, short)| *short)
    .collect::<Vec<_>>()
    .join(",")
}

fn storage_class(obj: &Value) -> String {
    str_at(
        obj,
        &[
            "metadata",
            "annotations",
            "volume.beta.kubernetes.io/storage-class",
        ],
    )
    .or_else(|| str_at(obj, &["spec", "storageClassName"]))
    .unwrap_or_default()
    .to_owned()
}

fn unset_or(v: Option<&str>) -> String {
    v.filter(|s| !s.is_empty()).unwrap_or("<unset>").to_owned()
}

const PV_COLUMNS: &[Col] = &[
    NAME,
    col(
        "Capacity",
        "capacity is the description of the persistent volume's resources and capacity.",
    ),
    col(
        "Access Modes",
        "accessModes contains all ways the volume can be mounted.",
    ),
    col(
        "Reclaim Policy",
        "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim.",
    ),
    col(
        "Status",
        "phase indicates if a volume is available, bound to a claim, or released by a claim.",
    ),
    col(
        "Claim",
        "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim.",
    ),
    col("StorageClass", "StorageClass of the pv"),
    col("VolumeAttributesClass", "VolumeAttributesClass of the pv"),
    col(
        "Reason",
        "reason is a brief CamelCase string that describes any failure.",
    ),
    AGE,
    wide(
        "VolumeMode",
        "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state.",
    ),
];

fn pv_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let claim = match at(obj, &["spec", "claimRef"]).filter(|c| c.is_object()) {
        Some(c) => format!("{}/{}", string_at(c, &["namespace"]), string_at(c, &["name"])),
        None => String::new(),
    };
    let phase = if is_deleting(obj) {
        "Terminating".to_owned()
    } else {
        string_at(obj, &["status", "phase"])
    };
    vec![
        json!(name_of(obj)),
        json!(int_or_string(at(obj, &["spec", "capacity", "storage"])).unwrap_or_default()),
        json!(access_modes(array_at(obj, &["spec", "accessModes"]))),
        json!(string_at(obj, &["spec", "persistentVolumeReclaimPolicy"])),
        json!(phase),
        json!(claim),
        json!(storage_class(obj)),
        json!(unset_or(str_at(obj, &["spec", "volumeAttributesClassName"]))),
        json!(string_at(obj, &["status", "reason"])),
        creation_age(obj, now),
        json!(unset_or(str_at(obj, &["spec", "volumeMode"]))),
    ]
}

const PVC_COLUMNS: &[Col] = &[
    NAME,
    col(
        "Status",
        "phase represents the current phase of PersistentVolumeClaim.",
    ),
    col(
        "Volume",
        "volumeName is the binding reference to the PersistentVolume backing this claim.",
    ),
    col(
        "Capacity",
        "capacity represents the actual resources of the underlying volume.",
    ),
    col(
        "Access Modes",
        "accessModes contains the actual access modes the volume backing the PVC has.",
    ),
    col("StorageClass", "StorageClass of the pvc"),
    col("VolumeAttributesClass", "VolumeAttributesClass of the pvc"),
    AGE,
    wide(
        "VolumeMode",
        "volumeMode defines what type of volume is required by the claim.",
    ),
];

fn pvc_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let phase = if is_deleting(obj) {
        "Terminating".to_owned()
    } else {
        string_at(obj, &["status", "phase"])
    };
    let volume = string_at(obj, &["spec", "volumeName"]);
    let (capacity, modes) = if volume.is_empty() {
        (String::new(), String::new())
    } else {
        (
            int_or_string(at(obj, &["status", "capacity", "storage"])).unwrap_or_default(),
            access_modes(array_at(obj, &["status", "accessModes"])),
        )
    };
    vec![
        json!(name_of(obj)),
        json!(phase),
        json!(volume),
        json!(capacity),
        json!(modes),
        json!(storage_class(obj)),
        json!(unset_or(str_at(obj, &["spec", "volumeAttributesClassName"]))),
        creation_age(obj, now),
        json!(unset_or(str_at(obj, &["spec", "volumeMode"]))),
    ]
}

const VOLUME_ATTACHMENT_COLUMNS: &[Col] = &[
    NAME,
    col(
        "Attacher",
        "attacher indicates the name of the volume driver that MUST handle this request.",
    ),
    col(
        "PV",
        "persistentVolumeName represents the name of the persistent volume to attach.",
    ),
    col(
        "Node",
        "nodeName represents the node that the volume should be attached to.",
    ),
    Col {
        name: "Attached",
        type_: "boolean",
        format: "",
        description: "attached indicates the volume is successfully attached.",
        priority: 0,
    },
    AGE,
];

fn volume_attachment_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(name_of(obj)),
        json!(string_at(obj, &["spec", "attacher"])),
        json!(string_at(obj, &["spec", "source", "persistentVolumeName"])),
        json!(string_at(obj, &["spec", "nodeName"])),
        json!(
            at(obj, &["status", "attached"])
                .and_then(Value::as_bool)
                .unwrap_or(false)
        ),
        creation_age(obj, now),
    ]
}

const PDB_COLUMNS: &[Col] = &[
    NAME,
    col(
        "Min Available",
        "The minimum number of pods that must be available.",
    ),
    col(
        "Max Unavailable",
        "The maximum number of pods that may be unavailable.",
    ),
    Col {
        name: "Allowed Disruptions",
        type_: "integer",
        format: "",
        description: "Calculated number of pods that may be disrupted at this time.",
        priority: 0,
    },
    AGE,
];

fn pdb_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let or_na = |v: Option<String>| v.unwrap_or_else(|| "N/A".to_owned());
    vec![
        json!(name_of(obj)),
        json!(or_na(int_or_string(at(obj, &["spec", "minAvailable"])))),
        json!(or_na(int_or_string(at(obj, &["spec", "maxUnavailable"])))),
        json!(int_at(obj, &["status", "disruptionsAllowed"])),
        creation_age(obj, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

    fn now() -> Timestamp {
        "2026-11-22T11:10:00Z".parse().unwrap()
    }

    fn def(group: &str, plural: &str) -> std::sync::Arc<ResourceDef> {
        let registry = Registry::new();
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

    #[test]
    fn rows_carry_what_include_object_asks_for() {
        let event = json!({ "kind": "Event", "apiVersion": "v1", "metadata": { "name": "e" }, "lastTimestamp": "2026-11-22T11:09:00Z" });
        let events = def("", "events");
        let row = |include| {
            table_with(&events, &[&event], include, true, json!({}), now(), TABLE_V1)["rows"][0]["object"]
                .clone()
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

    #[test]
    fn human_age_follows_human_duration() {
        let cases = [
            (0, "0s"),
            (59, "59s"),
            (119, "119s"),
            (120, "2m"),
            (281, "4m41s"),
            (599, "9m59s"),
            (600, "10m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 12 * 60 + 5, "3h12m"),
            (8 * 3600, "8h"),
            (25 * 3600, "25h"),
            (47 * 3600 + 59 * 60, "47h"),
            (48 * 3600, "2d"),
            (3 * 86400, "3d"),
            (3 * 86400 + 5 * 3600, "3d5h"),
            (8 * 86400, "8d"),
            (729 * 86400, "729d"),
            (730 * 86400, "2y"),
            (731 * 86400, "2y1d"),
            (8 * 365 * 86400, "8y"),
            (20 * 365 * 86400 + 86400, "20y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_age(Duration::from_secs(secs)), want, "{secs}s");
        }
        assert_eq!(human_age(Duration::from_millis(1999)), "1s");
        let now = now();
        assert_eq!(age_since(Some("2026-11-22T11:09:30Z"), now), "30s");
        assert_eq!(age_since(Some("2026-11-22T11:10:01Z"), now), "0s");
        assert_eq!(age_since(Some("2026-11-22T11:10:05Z"), now), "<invalid>");
        assert_eq!(age_since(Some("yesterday"), now), "<invalid>");
        assert_eq!(age_since(None, now), "<unknown>");
    }

    #[test]
    fn machine_table_uses_the_crd_columns() {
        let machines = def("machine.sapcloud.io", "machines");
        let running = json!({
            "metadata": { "name": "name", "namespace": "trace", "creationTimestamp": "2026-11-22T11:09:30Z", "labels": { "node": "node-1" } },
            "spec": { "providerID": "local:///node-1" },
            "status": { "currentStatus": { "phase": "Running" } }
        });
        let pending =
            json!({ "metadata": { "name": "pending", "creationTimestamp": "2026-11-22T11:05:19Z" } });
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
}
