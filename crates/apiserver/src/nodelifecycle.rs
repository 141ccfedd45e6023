//! The node lifecycle, as kube-controller-manager's node lifecycle controller runs it: a node whose heartbeat
//! (its Lease in `kube-node-lease`, or its Ready condition's `lastHeartbeatTime`) is older than the node monitor
//! grace period gets its conditions set to Unknown with the reasons Kubernetes uses, and the
//! `node.kubernetes.io/unreachable:NoSchedule` taint; when the node reports Ready again, the taint goes.

use crate::objects::timestamp;
use std::time::Duration;

use mcm_api::keys::kubernetes::NODE_LEASE_NAMESPACE;
use serde_json::{Value, json};

use crate::store::{Mutation, Store};

/// The taint of an unreachable node.
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// The conditions the controller turns Unknown (those a kubelet reports).
const CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

fn time(value: &Value) -> Option<jiff::Timestamp> {
    value.as_str().and_then(|s| s.parse().ok())
}

/// The node's last sign of life: the later of its Lease renewal and its Ready heartbeat, or its creation.
pub fn last_heartbeat(node: &Value, lease: Option<&Value>) -> Option<jiff::Timestamp> {
    let renewed = lease.and_then(|l| time(&l["spec"]["renewTime"]));
    let ready = node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| time(&c["lastHeartbeatTime"]));
    renewed
        .max(ready)
        .or_else(|| time(&node["metadata"]["creationTimestamp"]))
}

/// The node as the controller wants it at `now`, or None when nothing changes.
pub fn reconcile(
    node: &Value,
    lease: Option<&Value>,
    now: jiff::Timestamp,
    grace: Duration,
) -> Option<Value> {
    let silent = last_heartbeat(node, lease).is_some_and(|last| {
        now.duration_since(last) > jiff::SignedDuration::try_from(grace).unwrap_or_default()
    });
    let mut next = node.clone();
    let mut changed = false;
    if silent {
        let mut conditions = node["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for kind in CONDITIONS {
            match conditions.iter_mut().find(|c| c["type"] == kind) {
                Some(condition) if condition["status"] != "Unknown" => {
                    condition["status"] = json!("Unknown");
                    condition["reason"] = json!("NodeStatusUnknown");
                    condition["message"] = json!("Kubelet stopped posting node status.");
                    condition["lastTransitionTime"] = json!(timestamp(now));
                    changed = true;
                }
                Some(_) => {}
                None => {
                    conditions.push(json!({
                        "type": kind,
                        "status": "Unknown",
                        "reason": "NodeStatusNeverUpdated",
                        "message": "Kubelet never posted node status.",
                        "lastHeartbeatTime": node["metadata"]["creationTimestamp"],
                        "lastTransitionTime": timestamp(now),
                    }));
                    changed = true;
                }
            }
        }
        next["status"]["conditions"] = Value::Array(conditions);
    }
    let ready = node["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
    let mut taints = node["spec"]["taints"].as_array().cloned().unwrap_or_default();
    let tainted = taints.iter().any(|t| t["key"] == UNREACHABLE_TAINT);
    if silent && !tainted {
        taints.push(json!({ "key": UNREACHABLE_TAINT, "effect": "NoSchedule", "timeAdded": timestamp(now) }));
        changed = true;
    } else if !silent && ready && tainted {
        taints.retain(|t| t["key"] != UNREACHABLE_TAINT);
        changed = true;
    }
    if !changed {
        return None;
    }
    if !next.get("spec").is_some_and(Value::is_object) {
        next["spec"] = json!({});
    }
    if taints.is_empty() {
        if let Some(spec) = next["spec"].as_object_mut() {
            spec.remove("taints");
        }
    } else {
        next["spec"]["taints"] = Value::Array(taints);
    }
    if let Some(meta) = next["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
    }
    Some(next)
}

/// Checks every node once. Called periodically by the server.
pub fn monitor(store: &Store, now: jiff::Timestamp, grace: Duration) {
    let (nodes, _) = store.list("/nodes", None);
    for node in nodes {
        let name = node["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let lease = store.get("coordination.k8s.io/leases", NODE_LEASE_NAMESPACE, &name);
        let result = store.mutate("/nodes", "", &name, |current| {
            let Some(current) = current else {
                return Ok(Mutation::Unchanged);
            };
            Ok(reconcile(current, lease.as_deref(), now, grace).map_or(Mutation::Unchanged, Mutation::Put))
        });
        if let Err(err) = result {
            tracing::warn!(node = %name, error = %err, "could not update the lifecycle of a node");
        }
    }
}

#[cfg(test)]
mod tests {
    use mcm_api::builders::NodeBuilder;

    use super::*;

    /// The stored node `n1`, created an hour before noon, whose kubelet last posted Ready and MemoryPressure at
    /// `heartbeat`.
    fn node(heartbeat: &str) -> Value {
        let heartbeat: jiff::Timestamp = heartbeat.parse().unwrap();
        let node = NodeBuilder::new("n1")
            .created_at("2026-11-22T11:00:00Z".parse().unwrap())
            .heartbeat("Ready", "True", "KubeletReady", heartbeat)
            .heartbeat("MemoryPressure", "False", "KubeletHasSufficientMemory", heartbeat)
            .build();
        serde_json::to_value(node).unwrap()
    }

    const GRACE: Duration = Duration::from_secs(40);

    #[test]
    fn a_silent_node_turns_unknown_and_unreachable_after_the_grace_period() {
        let now: jiff::Timestamp = "2026-11-22T12:00:41Z".parse().unwrap();
        let next = reconcile(&node("2026-11-22T12:00:00Z"), None, now, GRACE).expect("changed");
        let ready = next["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], "Unknown");
        assert_eq!(ready["reason"], "NodeStatusUnknown");
        assert_eq!(ready["message"], "Kubelet stopped posting node status.");
        assert_eq!(
            ready["lastHeartbeatTime"], "2026-11-22T12:00:00Z",
            "the heartbeat time is kept"
        );
        let never = next["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "DiskPressure")
            .unwrap();
        assert_eq!(never["reason"], "NodeStatusNeverUpdated");
        assert_eq!(next["spec"]["taints"][0]["key"], UNREACHABLE_TAINT);
        assert!(
            reconcile(&next, None, now, GRACE).is_none(),
            "a second pass changes nothing"
        );
    }

    #[test]
    fn a_fresh_lease_keeps_the_node_as_it_is() {
        let now: jiff::Timestamp = "2026-11-22T12:00:41Z".parse().unwrap();
        let lease = json!({ "spec": { "renewTime": "2026-11-22T12:00:30.000000Z" } });
        assert!(reconcile(&node("2026-11-22T12:00:00Z"), Some(&lease), now, GRACE).is_none());
    }

    #[test]
    fn the_unreachable_taint_goes_when_the_node_is_ready_again() {
        let now: jiff::Timestamp = "2026-11-22T12:00:41Z".parse().unwrap();
        let mut recovered = node("2026-11-22T12:00:40Z");
        recovered["spec"] = json!({ "taints": [{ "key": UNREACHABLE_TAINT, "effect": "NoSchedule" }] });
        let next = reconcile(&recovered, None, now, GRACE).expect("changed");
        assert!(next["spec"].get("taints").is_none());
    }
}
