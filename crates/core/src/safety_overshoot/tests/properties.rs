//! Properties: the patches bring any set or deployment in line, and a second pass writes nothing.

use mcm_api::{
    ConditionStatus, MachineDeployment, MachineDeploymentCondition, MachineDeploymentConditionType,
    MachineSet, MachineSetConditionType,
};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::safety_overshoot::common::name_of;

/// Applies a write's patches to a set as the API server would (merge patches; the precondition dropped).
fn apply_set(set: &MachineSet, patches: &ObjectPatches) -> MachineSet {
    let mut value = serde_json::to_value(set).unwrap();
    for patch in [&patches.metadata, &patches.status].into_iter().flatten() {
        let mut patch = patch.clone();
        if let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
        json_patch::merge(&mut value, &patch);
    }
    serde_json::from_value(value).unwrap()
}

fn apply_deployment(deployment: &MachineDeployment, patches: &ObjectPatches) -> MachineDeployment {
    let mut value = serde_json::to_value(deployment).unwrap();
    for patch in [&patches.metadata, &patches.status].into_iter().flatten() {
        let mut patch = patch.clone();
        if let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
        json_patch::merge(&mut value, &patch);
    }
    serde_json::from_value(value).unwrap()
}

fn frozen_condition_of(set: &MachineSet) -> bool {
    set.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == MachineSetConditionType::Frozen && c.status == ConditionStatus::True)
    })
}

fn deployment_frozen_condition(d: &MachineDeployment) -> bool {
    d.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == MachineDeploymentConditionType::Frozen && c.status == ConditionStatus::True)
    })
}

proptest! {
    /// For any starting state (label, condition, annotations) and counts: applying the plan reaches a fixpoint
    /// (planning again writes nothing), label and condition agree on every object, a set is frozen iff it was
    /// frozen and stays between the thresholds or is at/over the upper one (without an unfreeze annotation),
    /// and a deployment is frozen iff one of its sets is.
    #[test]
    fn the_plan_reaches_a_consistent_fixpoint(
        states in proptest::collection::vec(
            (0i32..4, 0usize..12, any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
            1..5,
        ),
        deployment_state in (any::<bool>(), any::<bool>(), any::<bool>()),
        safety_up in 0u32..4,
        safety_down in 0u32..4,
    ) {
        let settings = Settings { safety_up, safety_down };
        let mut d = deployment("d", 3, Some(json!(1)));
        if deployment_state.0 { freeze_label(&mut d.metadata); }
        if deployment_state.1 { annotate_unfreeze(&mut d.metadata); }
        if deployment_state.2 {
            d.status.get_or_insert_default().conditions.push(MachineDeploymentCondition {
                r#type: MachineDeploymentConditionType::Frozen,
                status: ConditionStatus::True,
                last_update_time: None,
                last_transition_time: None,
                reason: "x".into(),
                message: "x".into(),
            });
        }
        let mut sets = Vec::new();
        let mut machines = Vec::new();
        for (i, (replicas, count, label, condition, annotation, owned)) in states.iter().enumerate() {
            let name = format!("s{i}");
            let mut s = if *owned { owned_set(&name, *replicas, "d") } else { set(&name, *replicas) };
            if *label { freeze_label(&mut s.metadata); }
            if *condition { frozen_set_condition(&mut s); }
            if *annotation { annotate_unfreeze(&mut s.metadata); }
            machines.extend(machines_of(&s, *count));
            sets.push(s);
        }
        let set_refs: Vec<&MachineSet> = sets.iter().collect();
        let first = run_with(&set_refs, &[&d], &machines, settings);

        let mut after_sets = sets.clone();
        let mut after_d = d.clone();
        for w in &first.writes {
            prop_assert!(!w.patches.is_empty());
            match w.kind {
                ObjectKind::MachineSet => {
                    let s = after_sets.iter_mut().find(|s| name_of(&s.metadata) == w.name).unwrap();
                    *s = apply_set(s, &w.patches);
                }
                ObjectKind::MachineDeployment => after_d = apply_deployment(&after_d, &w.patches),
            }
        }
        // Unfrozen by hand: its own annotation, or its deployment's.
        let manual = |e: &SetEvaluation| {
            let set = sets.iter().find(|x| name_of(&x.metadata) == e.name).unwrap();
            has_unfreeze_annotation(&set.metadata) || (e.deployment.is_some() && deployment_state.1)
        };
        for (s, e) in after_sets.iter().zip(&first.evaluations) {
            prop_assert_eq!(is_frozen(&s.metadata), e.frozen);
            prop_assert_eq!(frozen_condition_of(s), e.frozen);
            prop_assert!(!has_unfreeze_annotation(&s.metadata));
            let count = i64::try_from(e.machines).unwrap();
            let expected = !manual(e)
                && (count >= e.thresholds.upper || (e.was_frozen && count > e.thresholds.lower));
            prop_assert_eq!(e.frozen, expected);
            prop_assert!(e.thresholds.lower < e.thresholds.upper);
        }
        let any_frozen = first.evaluations.iter().any(|e| e.deployment.is_some() && e.frozen);
        prop_assert_eq!(is_frozen(&after_d.metadata), any_frozen);
        prop_assert_eq!(deployment_frozen_condition(&after_d), any_frozen);
        prop_assert!(!has_unfreeze_annotation(&after_d.metadata));

        let after_refs: Vec<&MachineSet> = after_sets.iter().collect();
        let second = run_with(&after_refs, &[&after_d], &machines, settings);
        // A fixpoint, except that a set unfrozen by hand while still at or over its upper threshold is frozen
        // again (the annotation is one-shot), and its deployment with it.
        let refrozen: Vec<&SetEvaluation> = first
            .evaluations
            .iter()
            .filter(|e| manual(e) && i64::try_from(e.machines).unwrap() >= e.thresholds.upper)
            .collect();
        for w in &second.writes {
            match w.kind {
                ObjectKind::MachineSet => {
                    prop_assert!(refrozen.iter().any(|e| e.name == w.name), "{:?}", w);
                    prop_assert_eq!(w.patches.transition, Some(true));
                }
                ObjectKind::MachineDeployment => {
                    prop_assert!(refrozen.iter().any(|e| e.deployment.is_some()), "{:?}", w);
                }
            }
        }
    }
}
