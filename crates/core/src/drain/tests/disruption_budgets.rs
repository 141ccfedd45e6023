//! PodDisruptionBudgets and blocked drains.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus},
    apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta, Time},
};
use pretty_assertions::assert_eq;

use super::*;

fn pdb(name: &str, selector: Option<LabelSelector>) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            generation: Some(2),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            selector,
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()),
        match_expressions: None,
    }
}

fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: Some(values.iter().map(|v| (*v).into()).collect()),
        }]),
    }
}

#[test]
fn pdbs_match_by_namespace_and_selector() {
    let web = bound("web").label("app", "web").label("tier", "front").build();
    let mut other_namespace = pdb("elsewhere", Some(match_labels(&[("app", "web")])));
    other_namespace.metadata.namespace = Some("kube-system".into());
    let pdbs = [
        pdb("by-label", Some(match_labels(&[("app", "web")]))),
        pdb("wrong-label", Some(match_labels(&[("app", "db")]))),
        pdb("all-of-namespace", Some(LabelSelector::default())),
        pdb("no-selector", None),
        pdb("in", Some(expression("tier", "In", &["front", "back"]))),
        pdb("not-in", Some(expression("tier", "NotIn", &["front"]))),
        pdb("not-in-absent", Some(expression("zone", "NotIn", &["a"]))),
        pdb("exists", Some(expression("tier", "Exists", &[]))),
        pdb("does-not-exist", Some(expression("tier", "DoesNotExist", &[]))),
        pdb("bogus-operator", Some(expression("tier", "Gt", &["1"]))),
        other_namespace,
    ];
    let matched: Vec<&str> = pdbs_for_pod(&web, &pdbs)
        .iter()
        .map(|p| p.metadata.name.as_deref().unwrap())
        .collect();
    // policy/v1: an empty selector selects every pod of the namespace, a missing one none.
    assert_eq!(
        matched,
        ["all-of-namespace", "by-label", "exists", "in", "not-in-absent"]
    );
}

fn with_status(mut p: PodDisruptionBudget, expected: i32, healthy: i32, allowed: i32) -> PodDisruptionBudget {
    p.status = Some(PodDisruptionBudgetStatus {
        expected_pods: expected,
        current_healthy: healthy,
        desired_healthy: expected,
        disruptions_allowed: allowed,
        observed_generation: Some(2),
        ..PodDisruptionBudgetStatus::default()
    });
    p
}

#[test]
fn misconfigured_pdbs_are_those_that_can_never_allow_a_disruption() {
    // Reference isMisconfiguredPdb: generation == observedGeneration && expectedPods > 0 &&
    // currentHealthy >= expectedPods && no disruptedPods && disruptionsAllowed == 0.
    let base = pdb("p", Some(LabelSelector::default()));
    assert!(misconfigured_pdb(&with_status(base.clone(), 2, 2, 0)));
    assert!(!misconfigured_pdb(&base), "no status yet");
    assert!(
        !misconfigured_pdb(&with_status(base.clone(), 2, 2, 1)),
        "allows one"
    );
    assert!(
        !misconfigured_pdb(&with_status(base.clone(), 2, 1, 0)),
        "a pod is unhealthy"
    );
    assert!(
        !misconfigured_pdb(&with_status(base.clone(), 0, 0, 0)),
        "expects no pods"
    );
    let mut stale = with_status(base.clone(), 2, 2, 0);
    stale.metadata.generation = Some(3);
    assert!(!misconfigured_pdb(&stale), "status not observed yet");
    let mut disrupting = with_status(base, 2, 2, 0);
    disrupting.status.as_mut().unwrap().disrupted_pods =
        Some(BTreeMap::from([("web-0".to_owned(), Time(at(1)))]));
    assert!(!misconfigured_pdb(&disrupting), "a disruption is in progress");
}

#[test]
fn a_blocked_drain_names_the_pod_and_the_pdb() {
    let web = bound("web-0").label("app", "web").build();
    let pdbs = [
        with_status(pdb("a-budget", Some(match_labels(&[("app", "web")]))), 3, 2, 0),
        with_status(pdb("web-pdb", Some(match_labels(&[("app", "web")]))), 3, 3, 0),
    ];
    let b = blocker(&web, &pdbs);
    assert_eq!(
        b.pdb.as_deref(),
        Some("web-pdb"),
        "the misconfigured one fails fast"
    );
    assert!(b.misconfigured);
    assert_eq!(
        DrainOutcome::Blocked(b).to_string(),
        "pod default/web-0 cannot be evicted: PodDisruptionBudget default/web-pdb allows no disruption \
         although all its pods are healthy (misconfigured)"
    );
    let b = blocker(&web, &pdbs[..1]);
    assert!(!b.misconfigured);
    assert_eq!(
        DrainOutcome::InProgress {
            remaining: 2,
            blocked: Some(b)
        }
        .to_string(),
        "2 pods left; pod default/web-0 cannot be evicted: PodDisruptionBudget default/a-budget allows no \
         disruption now"
    );
    assert_eq!(
        blocker(&web, &[]).to_string(),
        "pod default/web-0 cannot be evicted: a PodDisruptionBudget allows no disruption now"
    );
}
