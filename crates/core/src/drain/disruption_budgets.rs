//! PodDisruptionBudgets: which ones cover a pod, which can never allow a disruption, and what blocks an eviction.
//!
//! Separate because budgets are matched by label selector, a concern of their own (the MachineSet reuses it).

use std::{collections::BTreeMap, fmt};

use k8s_openapi::{
    api::{core::v1::Pod, policy::v1::PodDisruptionBudget},
    apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement},
};

use super::pod_selection::PodRef;

/// One `matchExpressions` requirement against `labels` (operators `In`, `NotIn`, `Exists`, `DoesNotExist`; an
/// unknown operator matches nothing, as the API server would have rejected it).
fn requirement_matches(requirement: &LabelSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&requirement.key);
    let values = requirement.values.as_deref().unwrap_or_default();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// Whether a label selector matches `labels`: every `matchLabels` entry and every `matchExpressions` requirement
/// holds. An empty selector matches everything (Kubernetes' `LabelSelectorAsSelector`).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let match_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions = selector
        .match_expressions
        .iter()
        .flatten()
        .all(|r| requirement_matches(r, labels));
    match_labels && expressions
}

/// The PodDisruptionBudgets that guard `pod`: same namespace, and a selector that matches the pod's labels. In
/// policy/v1 an empty selector selects every pod of the namespace and a missing one selects none. Sorted by name.
pub fn pdbs_for_pod<'a>(pod: &Pod, pdbs: &'a [PodDisruptionBudget]) -> Vec<&'a PodDisruptionBudget> {
    let empty = BTreeMap::new();
    let pod_labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let mut matching: Vec<&PodDisruptionBudget> = pdbs
        .iter()
        .filter(|pdb| pdb.metadata.namespace == pod.metadata.namespace)
        .filter(|pdb| {
            pdb.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|selector| selector_matches(selector, pod_labels))
        })
        .collect();
    matching.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    matching
}

/// Whether a PodDisruptionBudget can never allow a disruption (reference `isMisconfiguredPdb`, issues #52/#591):
/// its status is current (`generation == observedGeneration`), it expects pods (`expectedPods > 0`), all of them are
/// healthy (`currentHealthy ≥ expectedPods`), none is being disrupted, and still `disruptionsAllowed == 0`. An
/// eviction it refuses fails the drain at once instead of being retried until the drain timeout.
pub fn misconfigured_pdb(pdb: &PodDisruptionBudget) -> bool {
    let Some(status) = pdb.status.as_ref() else {
        return false;
    };
    pdb.metadata.generation == status.observed_generation
        && status.expected_pods > 0
        && status.current_healthy >= status.expected_pods
        && status.disrupted_pods.as_ref().is_none_or(BTreeMap::is_empty)
        && status.disruptions_allowed == 0
}

/// A pod whose eviction a PodDisruptionBudget refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// The pod.
    pub pod: PodRef,
    /// The name of the PodDisruptionBudget (in the pod's namespace), if one is known.
    pub pdb: Option<String>,
    /// Whether that budget is misconfigured ([`misconfigured_pdb`]): the drain fails at once.
    pub misconfigured: bool,
}

/// The blocker of `pod` whose eviction was refused (HTTP 429): a misconfigured guarding budget if there is one, else
/// the first guarding budget by name. (The reference picks one arbitrarily when several match.)
pub fn blocker(pod: &Pod, pdbs: &[PodDisruptionBudget]) -> Blocker {
    let guarding = pdbs_for_pod(pod, pdbs);
    let chosen = guarding
        .iter()
        .find(|pdb| misconfigured_pdb(pdb))
        .or_else(|| guarding.first());
    Blocker {
        pod: PodRef::of(pod),
        pdb: chosen.and_then(|pdb| pdb.metadata.name.clone()),
        misconfigured: chosen.is_some_and(|pdb| misconfigured_pdb(pdb)),
    }
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pod {} cannot be evicted: ", self.pod)?;
        match &self.pdb {
            Some(pdb) if self.misconfigured => write!(
                f,
                "PodDisruptionBudget {}/{pdb} allows no disruption although all its pods are healthy \
                 (misconfigured)",
                self.pod.namespace
            ),
            Some(pdb) => write!(
                f,
                "PodDisruptionBudget {}/{pdb} allows no disruption now",
                self.pod.namespace
            ),
            None => f.write_str("a PodDisruptionBudget allows no disruption now"),
        }
    }
}
