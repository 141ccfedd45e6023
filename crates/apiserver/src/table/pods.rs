//! The Pod printer: Ready, Status and Restarts computed as the real server's printPod does (init containers,
//! restartable sidecars, waiting and terminated reasons, Terminating), plus the wide columns.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::age::age_at;
use super::printer::{AGE, Col, NAME, col, wide};
use super::values::{array_at, at, creation_age, int_at, name_of, str_at, string_at};
use crate::metadata::is_deleting;

pub(super) const POD_COLUMNS: &[Col] = &[
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

pub(super) fn pod_row(obj: &Value, now: Timestamp) -> Vec<Value> {
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
