//! Built-in printers after the real server's (pkg/printers/internalversion) for the small kinds: the default
//! (Name, Age), Node, Namespace, Secret, Lease, CertificateSigningRequest and PodDisruptionBudget. Pods, events
//! and storage have files of their own.

use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::age::human_age;
use super::printer::{AGE, Col, NAME, col, wide};
use super::values::{array_at, at, creation_age, int_at, int_or_string, name_of, str_at, string_at};

pub(super) const DEFAULT_COLUMNS: &[Col] = &[NAME, AGE];

pub(super) fn default_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![json!(name_of(obj)), creation_age(obj, now)]
}

pub(super) const NODE_COLUMNS: &[Col] = &[
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

pub(super) fn node_row(obj: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) const NAMESPACE_COLUMNS: &[Col] = &[NAME, col("Status", "The status of the namespace"), AGE];

pub(super) fn namespace_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(name_of(obj)),
        json!(string_at(obj, &["status", "phase"])),
        creation_age(obj, now),
    ]
}

pub(super) const SECRET_COLUMNS: &[Col] = &[
    NAME,
    col("Type", "Used to facilitate programmatic handling of secret data."),
    col("Data", "Data contains the secret data."),
    AGE,
];

pub(super) fn secret_row(obj: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) const LEASE_COLUMNS: &[Col] = &[
    NAME,
    col(
        "Holder",
        "holderIdentity contains the identity of the holder of a current lease.",
    ),
    AGE,
];

pub(super) fn lease_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(name_of(obj)),
        json!(string_at(obj, &["spec", "holderIdentity"])),
        creation_age(obj, now),
    ]
}

pub(super) const CSR_COLUMNS: &[Col] = &[
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
pub(super) fn csr_row(obj: &Value, now: Timestamp) -> Vec<Value> {
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

pub(super) const PDB_COLUMNS: &[Col] = &[
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

pub(super) fn pdb_row(obj: &Value, now: Timestamp) -> Vec<Value> {
    let or_na = |v: Option<String>| v.unwrap_or_else(|| "N/A".to_owned());
    vec![
        json!(name_of(obj)),
        json!(or_na(int_or_string(at(obj, &["spec", "minAvailable"])))),
        json!(or_na(int_or_string(at(obj, &["spec", "maxUnavailable"])))),
        json!(int_at(obj, &["status", "disruptionsAllowed"])),
        creation_age(obj, now),
    ]
}
