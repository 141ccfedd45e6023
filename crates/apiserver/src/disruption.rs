//! PodDisruptionBudgets and evictions, as kube-controller-manager's disruption controller and kube-apiserver's
//! `pods/eviction` subresource handle them.
//!
//! A PDB's status is computed from the pods it selects (expected, currently healthy, desired healthy, disruptions
//! allowed, and the pods being disrupted right now). An eviction is refused with 429 TooManyRequests when it
//! would take the healthy pods below what the budget asks; otherwise the budget is charged and the pod is deleted
//! with its grace period. Charging and checking happen in one store transaction, so concurrent evictions never
//! exceed the budget.

use crate::objects::timestamp;
use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use crate::{
    error::{ApiError, Cause},
    metadata::is_deleting,
    objects::{self, Context, DeleteOptions, FieldValidation},
    registry::ResourceDef,
    store::{Mutation, Store},
};

/// How long a pod stays in `disruptedPods` when its deletion is not observed (kube-controller-manager's value).
const DISRUPTED_POD_TIMEOUT_SECONDS: i64 = 120;

fn parse_time(value: &Value) -> Option<jiff::Timestamp> {
    value.as_str().and_then(|s| s.parse().ok())
}

/// True when the pod counts as healthy for a budget: Ready, and not being deleted.
pub fn is_healthy(pod: &Value) -> bool {
    !is_deleting(pod)
        && pod["status"]["conditions"].as_array().is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// The pods a PDB selects: policy/v1 semantics, where an empty selector selects every pod of the namespace and
/// an absent one selects none.
fn selected<'a>(pdb: &Value, pods: &'a [Arc<Value>]) -> Vec<&'a Value> {
    let Some(selector) = pdb["spec"].get("selector").filter(|s| !s.is_null()) else {
        return Vec::new();
    };
    let Ok(selector) = serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>(
        selector.clone(),
    ) else {
        return Vec::new();
    };
    let Ok(selector) = kube::core::Selector::try_from(selector) else {
        return Vec::new();
    };
    pods.iter()
        .map(|p| &**p)
        .filter(|pod| pod["metadata"]["namespace"] == pdb["metadata"]["namespace"])
        .filter(|pod| {
            use kube::core::SelectorExt as _;
            selector.matches(&objects::labels(pod))
        })
        .collect()
}

fn scaled(value: &IntOrString, total: i64) -> i64 {
    match value {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(text) => {
            let percent: i64 = text.trim_end_matches('%').parse().unwrap_or(0);
            // Round up, as the disruption controller does for both minAvailable and maxUnavailable.
            (percent * total + 99) / 100
        }
    }
}

/// The budget's numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Pods the budget covers.
    pub expected: i64,
    /// Healthy pods not being disrupted.
    pub current_healthy: i64,
    /// Healthy pods the budget asks for.
    pub desired_healthy: i64,
    /// Disruptions allowed now.
    pub disruptions_allowed: i64,
    /// Pods being disrupted (evicted, deletion not yet observed), by name, with the eviction time.
    pub disrupted: BTreeMap<String, String>,
}

/// Computes a budget from its spec, the pods it selects and the pods it already charged.
pub fn budget(
    pdb: &Value,
    pods: &[Arc<Value>],
    disrupted: &BTreeMap<String, String>,
    now: jiff::Timestamp,
) -> Budget {
    let pods = selected(pdb, pods);
    let live: Vec<&str> = pods
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    // A charged pod stays charged until it is gone, is being deleted, or the timeout passed.
    let disrupted: BTreeMap<String, String> = disrupted
        .iter()
        .filter(|(name, at)| {
            let recent = parse_time(&json!(at))
                .is_some_and(|at| now.as_second() - at.as_second() < DISRUPTED_POD_TIMEOUT_SECONDS);
            let still_live = pods
                .iter()
                .any(|p| p["metadata"]["name"] == json!(name) && !is_deleting(p));
            recent && still_live && live.contains(&name.as_str())
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let expected = i64::try_from(pods.len()).unwrap_or(i64::MAX);
    let healthy = pods
        .iter()
        .filter(|pod| {
            is_healthy(pod) && !disrupted.contains_key(pod["metadata"]["name"].as_str().unwrap_or_default())
        })
        .count();
    let current_healthy = i64::try_from(healthy).unwrap_or(i64::MAX);
    let spec = &pdb["spec"];
    let desired_healthy = if let Ok(min) = serde_json::from_value::<IntOrString>(spec["minAvailable"].clone())
    {
        scaled(&min, expected)
    } else if let Ok(max) = serde_json::from_value::<IntOrString>(spec["maxUnavailable"].clone()) {
        (expected - scaled(&max, expected)).max(0)
    } else {
        0
    };
    let disruptions_allowed = (current_healthy - desired_healthy).max(0);
    Budget {
        expected,
        current_healthy,
        desired_healthy,
        disruptions_allowed,
        disrupted,
    }
}

fn disrupted_of(pdb: &Value) -> BTreeMap<String, String> {
    pdb["status"]["disruptedPods"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// The status a PDB should have, keeping the condition's transition time when its status does not change.
fn status_for(pdb: &Value, budget: &Budget, now: jiff::Timestamp) -> Value {
    let allowed = budget.disruptions_allowed > 0;
    let condition_status = if allowed { "True" } else { "False" };
    let previous = pdb["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "DisruptionAllowed"))
        .cloned();
    let transition = match &previous {
        Some(c) if c["status"] == condition_status => c["lastTransitionTime"].clone(),
        _ => json!(timestamp(now)),
    };
    let generation = pdb["metadata"]["generation"].as_i64().unwrap_or(1);
    json!({
        "observedGeneration": generation,
        "disruptedPods": budget.disrupted,
        "disruptionsAllowed": budget.disruptions_allowed,
        "currentHealthy": budget.current_healthy,
        "desiredHealthy": budget.desired_healthy,
        "expectedPods": budget.expected,
        "conditions": [{
            "type": "DisruptionAllowed",
            "status": condition_status,
            "reason": if allowed { "SufficientPods" } else { "InsufficientPods" },
            "message": "",
            "observedGeneration": generation,
            "lastTransitionTime": transition,
        }],
    })
}

/// Recomputes the status of every PDB from the pods it selects, writing only statuses that changed.
pub fn refresh_budgets(store: &Store, now: jiff::Timestamp) {
    let (pdbs, _) = store.list("policy/poddisruptionbudgets", None);
    if pdbs.is_empty() {
        return;
    }
    let (pods, _) = store.list("/pods", None);
    for pdb in pdbs {
        let namespace = pdb["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let name = pdb["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let result = store.mutate("policy/poddisruptionbudgets", &namespace, &name, |current| {
            let Some(current) = current else {
                return Ok(Mutation::Unchanged);
            };
            let budget = budget(current, &pods, &disrupted_of(current), now);
            let status = status_for(current, &budget, now);
            if current["status"] == status {
                return Ok(Mutation::Unchanged);
            }
            let mut next = (**current).clone();
            next["status"] = status;
            Ok(Mutation::Put(next))
        });
        if let Err(err) = result {
            tracing::warn!(namespace = %namespace, pdb = %name, error = %err, "could not update a PodDisruptionBudget status");
        }
    }
}

/// Serves `POST pods/<name>/eviction`: deletes the pod when its budgets allow it, 429 otherwise. Returns the
/// Status body of a successful eviction (201).
pub fn evict(
    store: &Store,
    pods_def: &Arc<ResourceDef>,
    namespace: &str,
    name: &str,
    eviction: &Value,
    now: jiff::Timestamp,
) -> Result<Value, ApiError> {
    if let Some(body_name) = eviction["metadata"]["name"].as_str()
        && !body_name.is_empty()
        && body_name != name
    {
        return Err(ApiError::BadRequest(format!(
            "name in URL does not match name in Eviction object ({name} != {body_name})"
        )));
    }
    let options = eviction
        .get("deleteOptions")
        .filter(|o| !o.is_null())
        .map_or(Ok(DeleteOptions::default()), |o| {
            DeleteOptions::parse(o.to_string().as_bytes(), &crate::rest::Query::default())
        })?;
    let pod = store
        .get("/pods", namespace, name)
        .ok_or_else(|| ApiError::not_found(pods_def, name))?;
    let ctx = Context {
        def: Arc::clone(pods_def),
        namespace: namespace.to_owned(),
        now,
        field_validation: FieldValidation::Ignore,
        admission: false,
        manager: None,
        dry_run: false,
    };
    let terminal = matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
    let deleting = is_deleting(&pod);
    let success =
        json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201 });
    if terminal || deleting {
        // A terminal pod disrupts nothing; a pod already being deleted is left to that deletion.
        if terminal {
            objects::delete(store, &ctx, name, &options)?;
        }
        return Ok(success);
    }
    let (pdbs, _) = store.list("policy/poddisruptionbudgets", Some(namespace));
    let (pods, _) = store.list("/pods", Some(namespace));
    let covering: Vec<&Arc<Value>> = pdbs
        .iter()
        .filter(|pdb| selected(pdb, std::slice::from_ref(&pod)).len() == 1)
        .collect();
    let pdb = match covering.as_slice() {
        [] => {
            objects::delete(store, &ctx, name, &options)?;
            return Ok(success);
        }
        [pdb] => *pdb,
        _ => {
            return Err(ApiError::Internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".into(),
            ));
        }
    };
    let pdb_name = pdb["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let healthy = is_healthy(&pod);
    let policy_always = pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow";
    // Charge the budget and check it in one transaction on the PDB.
    store.mutate("policy/poddisruptionbudgets", namespace, &pdb_name, |current| {
        let Some(current) = current else {
            return Ok(Mutation::Unchanged);
        };
        let budget = budget(current, &pods, &disrupted_of(current), now);
        if !healthy && (policy_always || budget.current_healthy >= budget.desired_healthy) {
            // An unhealthy pod may go without charging the budget while the budget is met.
            return Ok(Mutation::Unchanged);
        }
        if budget.disruptions_allowed <= 0 {
            return Err(ApiError::TooManyRequests(
                "Cannot evict pod as it would violate the pod's disruption budget.".into(),
                None,
                vec![Cause {
                    reason: "DisruptionBudget",
                    message: format!(
                        "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                        budget.desired_healthy, budget.current_healthy
                    ),
                    field: String::new(),
                }],
            ));
        }
        let mut charged = budget.disrupted.clone();
        charged.insert(name.to_owned(), timestamp(now));
        let charged_budget = Budget {
            current_healthy: budget.current_healthy - 1,
            disruptions_allowed: budget.disruptions_allowed - 1,
            disrupted: charged,
            ..budget
        };
        let mut next = (**current).clone();
        next["status"] = status_for(current, &charged_budget, now);
        Ok(Mutation::Put(next))
    })?;
    objects::delete(store, &ctx, name, &options)?;
    Ok(success)
}

#[cfg(test)]
mod tests {
    use mcm_api::builders::PodBuilder;

    use super::*;

    /// The stored pod `ns/<name>` labelled app=web, Ready or not.
    fn pod(name: &str, ready: bool) -> Arc<Value> {
        let pod = PodBuilder::new(name)
            .namespace("ns")
            .label("app", "web")
            .condition("Ready", if ready { "True" } else { "False" })
            .build();
        Arc::new(serde_json::to_value(pod).unwrap())
    }

    fn pdb(spec: &Value) -> Value {
        json!({ "metadata": { "name": "web", "namespace": "ns", "generation": 1 }, "spec": spec })
    }

    #[test]
    fn min_available_and_max_unavailable_give_the_disruptions_allowed() {
        let pods = [pod("a", true), pod("b", true), pod("c", false)];
        let now = jiff::Timestamp::now();
        let selector = json!({ "matchLabels": { "app": "web" } });
        let b = budget(
            &pdb(&json!({ "selector": selector, "minAvailable": 1 })),
            &pods,
            &BTreeMap::new(),
            now,
        );
        assert_eq!(
            (
                b.expected,
                b.current_healthy,
                b.desired_healthy,
                b.disruptions_allowed
            ),
            (3, 2, 1, 1)
        );
        let b = budget(
            &pdb(&json!({ "selector": selector, "maxUnavailable": 0 })),
            &pods,
            &BTreeMap::new(),
            now,
        );
        assert_eq!((b.desired_healthy, b.disruptions_allowed), (3, 0));
        let b = budget(
            &pdb(&json!({ "selector": selector, "minAvailable": "50%" })),
            &pods,
            &BTreeMap::new(),
            now,
        );
        assert_eq!((b.desired_healthy, b.disruptions_allowed), (2, 0));
    }

    #[test]
    fn charged_pods_do_not_count_as_healthy_until_they_time_out() {
        let pods = [pod("a", true), pod("b", true)];
        let now = jiff::Timestamp::now();
        let spec = json!({ "selector": { "matchLabels": { "app": "web" } }, "minAvailable": 1 });
        let charged = BTreeMap::from([("a".to_owned(), timestamp(now))]);
        assert_eq!(budget(&pdb(&spec), &pods, &charged, now).disruptions_allowed, 0);
        let later = now + jiff::SignedDuration::from_secs(DISRUPTED_POD_TIMEOUT_SECONDS + 1);
        assert_eq!(budget(&pdb(&spec), &pods, &charged, later).disruptions_allowed, 1);
    }

    #[test]
    fn an_absent_selector_selects_nothing_and_an_empty_one_everything() {
        let pods = [pod("a", true)];
        let now = jiff::Timestamp::now();
        assert_eq!(
            budget(&pdb(&json!({ "minAvailable": 1 })), &pods, &BTreeMap::new(), now).expected,
            0
        );
        assert_eq!(
            budget(
                &pdb(&json!({ "selector": {}, "minAvailable": 1 })),
                &pods,
                &BTreeMap::new(),
                now
            )
            .expected,
            1
        );
    }
}
