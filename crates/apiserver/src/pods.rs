//! Graceful pod deletion, as kube-apiserver and the kubelet carry it out between them.
//!
//! Deleting a pod that is bound to a node and not yet finished gives it a grace period: `deletionTimestamp` is
//! set to now + grace and `deletionGracePeriodSeconds` to the grace. There is no kubelet to confirm termination,
//! so this server removes the pod when the grace period has passed, unless a live node agent of that node takes
//! pod termination on itself (the node carries the annotation [`AGENT_TERMINATES_PODS`] and its Lease was renewed
//! within the node monitor grace period); then the agent deletes the pod with grace 0 when its work has stopped.

use crate::objects::timestamp;
use std::time::Duration;

use mcm_api::keys::kubernetes::NODE_LEASE_NAMESPACE;
use serde_json::{Value, json};

use crate::{
    objects::DeleteOptions,
    store::{Mutation, Store},
};

pub use mcm_api::keys::extensions::AGENT_TERMINATES_PODS;

/// A pod's default grace period when its spec names none (Kubernetes' default).
const DEFAULT_GRACE_SECONDS: i64 = 30;

fn deletion_time(pod: &Value) -> Option<jiff::Timestamp> {
    pod["metadata"]["deletionTimestamp"]
        .as_str()
        .and_then(|s| s.parse().ok())
}

/// True while a deleting pod's grace period has not passed.
pub fn grace_pending(pod: &Value, now: jiff::Timestamp) -> bool {
    deletion_time(pod).is_some_and(|at| at > now)
}

/// How a DELETE of this pod is carried out when it gets a grace period: `None` means "delete at once" (the pod is
/// not bound to a node, it has finished, or the grace is 0). A second DELETE may shorten the grace, never extend it.
pub fn graceful_deletion(
    current: &Value,
    mut next: Value,
    options: &DeleteOptions,
    now: jiff::Timestamp,
) -> Option<Mutation> {
    let bound = current["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(current["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
    let grace = options
        .grace_period_seconds
        .or_else(|| current["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(DEFAULT_GRACE_SECONDS);
    if !bound || finished || grace <= 0 {
        return None;
    }
    let deadline = now + jiff::SignedDuration::from_secs(grace);
    if deletion_time(current).is_some_and(|at| at <= deadline) {
        return Some(Mutation::Unchanged);
    }
    let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
    let meta = next["metadata"].as_object_mut()?;
    meta.insert("deletionTimestamp".into(), json!(timestamp(deadline)));
    meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
    meta.insert("generation".into(), json!(generation + 1));
    Some(Mutation::Put(next))
}

/// Whether a live agent on this node terminates pods itself.
fn agent_terminates(store: &Store, node: &str, now: jiff::Timestamp, grace: Duration) -> bool {
    let Some(node_object) = store.get("/nodes", "", node) else {
        return false;
    };
    if node_object["metadata"]["annotations"][AGENT_TERMINATES_PODS] != "true" {
        return false;
    }
    store
        .get("coordination.k8s.io/leases", NODE_LEASE_NAMESPACE, node)
        .is_some_and(|lease| {
            lease["spec"]["renewTime"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .is_some_and(|renewed| now.duration_since(renewed).unsigned_abs() <= grace)
        })
}

/// Removes pods whose grace period has passed and whose finalizers are gone, unless their node's live agent
/// terminates them itself. Called periodically by the server.
pub fn expire(store: &Store, now: jiff::Timestamp, node_monitor_grace: Duration) {
    let (pods, _) = store.list("/pods", None);
    for pod in pods
        .iter()
        .filter(|p| deletion_time(p).is_some_and(|at| at <= now))
    {
        let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
        if !node.is_empty() && agent_terminates(store, node, now, node_monitor_grace) {
            continue;
        }
        let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let result = store.mutate("/pods", namespace, name, |current| match current {
            Some(current)
                if deletion_time(current).is_some_and(|at| at <= now)
                    && current["metadata"]["finalizers"]
                        .as_array()
                        .is_none_or(Vec::is_empty) =>
            {
                Ok(Mutation::Delete((**current).clone()))
            }
            _ => Ok(Mutation::Unchanged),
        });
        if let Err(err) = result {
            tracing::warn!(namespace, pod = name, error = %err, "could not remove a pod after its grace period");
        }
    }
}

#[cfg(test)]
mod tests {
    use mcm_api::builders::PodBuilder;

    use super::*;

    /// The stored pod `ns/p` with a grace period of 20 s, bound to `node` when given, in `phase`.
    fn pod(node: Option<&str>, phase: &str) -> Value {
        let pod = PodBuilder::new("p")
            .namespace("ns")
            .generation(1)
            .grace_period(20)
            .phase(phase);
        let pod = match node {
            Some(node) => pod.node(node),
            None => pod,
        };
        serde_json::to_value(pod.build()).unwrap()
    }

    #[test]
    fn a_bound_running_pod_gets_its_grace_period_and_an_unbound_one_goes_at_once() {
        let now: jiff::Timestamp = "2026-11-22T12:00:00Z".parse().unwrap();
        let running = pod(Some("n1"), "Running");
        let Some(Mutation::Put(marked)) =
            graceful_deletion(&running, running.clone(), &DeleteOptions::default(), now)
        else {
            panic!("a bound pod is marked");
        };
        assert_eq!(marked["metadata"]["deletionTimestamp"], "2026-11-22T12:00:20Z");
        assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 20);
        let unbound = pod(None, "Pending");
        assert!(graceful_deletion(&unbound, unbound.clone(), &DeleteOptions::default(), now).is_none());
        let done = pod(Some("n1"), "Succeeded");
        assert!(graceful_deletion(&done, done.clone(), &DeleteOptions::default(), now).is_none());
        let zero = DeleteOptions {
            grace_period_seconds: Some(0),
            ..DeleteOptions::default()
        };
        assert!(graceful_deletion(&running, running.clone(), &zero, now).is_none());
    }

    #[test]
    fn a_second_delete_may_shorten_the_grace_but_not_extend_it() {
        let now: jiff::Timestamp = "2026-11-22T12:00:00Z".parse().unwrap();
        let mut deleting = pod(Some("n1"), "Running");
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-22T12:00:20Z");
        let longer = DeleteOptions {
            grace_period_seconds: Some(60),
            ..DeleteOptions::default()
        };
        assert!(matches!(
            graceful_deletion(&deleting, deleting.clone(), &longer, now),
            Some(Mutation::Unchanged)
        ));
        let shorter = DeleteOptions {
            grace_period_seconds: Some(5),
            ..DeleteOptions::default()
        };
        let Some(Mutation::Put(marked)) = graceful_deletion(&deleting, deleting.clone(), &shorter, now)
        else {
            panic!("a shorter grace applies");
        };
        assert_eq!(marked["metadata"]["deletionTimestamp"], "2026-11-22T12:00:05Z");
    }
}
