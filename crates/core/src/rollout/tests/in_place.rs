//! The InPlaceUpdate rollout: simulated end to end (the deployment side is `in_place::decide`, the set controller
//! and the machine side are modelled), and its single rules.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use mcm_api::{
    MachinePhase,
    keys::{annotations, in_place_update, labels, taints},
};
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::rollout::in_place::{
    InPlaceAction, InPlaceInput, MachineView, NodeView, Orchestration, Transfer, candidate_patch,
    clean_node_patch, decide,
};

const OLD: &str = "md-old";

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap()
}
const NEW: &str = "md-new";

/// A deployment's world: two sets, machines with nodes, a model of the set controller and of the machine side.
struct World {
    replicas: i32,
    orchestration: Orchestration,
    fenceposts: Fenceposts,
    surge: i32,
    sets: BTreeMap<String, SetView>,
    machines: Vec<MachineView>,
    nodes: BTreeMap<String, NodeView>,
    /// The deployment template's class: the target every candidate is to carry.
    target: String,
    /// Machines the set controller created or deleted.
    created: Vec<String>,
    deleted: Vec<String>,
    next: usize,
}

fn selector(set: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("name".to_owned(), "md".to_owned()),
        (labels::MACHINE_TEMPLATE_HASH.to_owned(), set.to_owned()),
    ])
}

impl World {
    fn new(replicas: i32, orchestration: Orchestration, max_unavailable: i32, surge: i32) -> Self {
        let mut world = Self {
            replicas,
            orchestration,
            fenceposts: fp(0, max_unavailable),
            surge,
            sets: BTreeMap::new(),
            machines: Vec::new(),
            nodes: BTreeMap::new(),
            target: "medium".into(),
            created: Vec::new(),
            deleted: Vec::new(),
            next: 0,
        };
        let mut old = view(OLD, 1, replicas, replicas, replicas);
        old.desired_replicas = Some(replicas);
        world.sets.insert(OLD.into(), old);
        for _ in 0..replicas {
            world.add_machine(OLD);
        }
        world.created.clear();
        world
    }

    fn add_machine(&mut self, set: &str) {
        let name = format!("m{}", self.next);
        self.next += 1;
        let mut labels = selector(set);
        labels.insert("own".into(), "kept".into());
        self.machines.push(MachineView {
            name: name.clone(),
            set: set.into(),
            resource_version: "1".into(),
            labels,
            phase: Some(MachinePhase::Running),
            node: Some(format!("node-{name}")),
            deleting: false,
        });
        self.nodes.insert(format!("node-{name}"), NodeView::default());
        self.created.push(name);
    }

    fn selectors(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        self.sets.keys().map(|s| (s.clone(), selector(s))).collect()
    }

    fn plan(&self) -> crate::rollout::in_place::InPlacePlan {
        let new = self.sets.get(NEW).cloned();
        let old: Vec<SetView> = self.sets.values().filter(|s| s.name != NEW).cloned().collect();
        let selectors = self.selectors();
        decide(&InPlaceInput {
            replicas: self.replicas,
            orchestration: self.orchestration,
            fenceposts: self.fenceposts,
            surge: self.surge,
            paused: false,
            new: new.as_ref(),
            old: &old,
            selectors: &selectors,
            machines: &self.machines,
            nodes: &self.nodes,
            target_class: Some(&self.target),
        })
    }

    /// The deployment controller acts on its plan (every write succeeds).
    fn apply(&mut self, plan: &crate::rollout::in_place::InPlacePlan) {
        if let Some(replicas) = plan.rollout.create_new {
            let mut new = view(NEW, 2, replicas, 0, 0);
            new.desired_replicas = Some(self.replicas);
            self.sets.insert(NEW.into(), new);
        }
        for scale in &plan.rollout.scale {
            let set = self.sets.get_mut(&scale.name).unwrap();
            set.replicas = scale.replicas;
            set.desired_replicas = Some(self.replicas);
        }
        for name in &plan.rollout.disable_scale_up {
            self.sets.get_mut(name).unwrap().scale_up_disabled = true;
        }
        for action in &plan.actions {
            match action {
                InPlaceAction::MarkCandidate { node } => {
                    self.label(node, labels::CANDIDATE_FOR_UPDATE);
                    self.nodes.get_mut(node).unwrap().target_class = Some(self.target.clone());
                }
                InPlaceAction::Select { node } => self.label(node, labels::SELECTED_FOR_UPDATE),
                InPlaceAction::CleanMachine { machine, .. } => {
                    self.machine(machine).labels.remove(labels::UPDATE_RESULT);
                }
                InPlaceAction::CleanNode { node } => {
                    let node = self.nodes.get_mut(node).unwrap();
                    for key in [
                        labels::CANDIDATE_FOR_UPDATE,
                        labels::SELECTED_FOR_UPDATE,
                        labels::UPDATE_RESULT,
                    ] {
                        node.labels.remove(key);
                    }
                    node.target_class = None;
                }
                InPlaceAction::Transfer(Transfer { to, replicas, moves }) => {
                    for moved in moves {
                        let machine = self.machine(&moved.machine);
                        machine.set.clone_from(to);
                        for (key, value) in &moved.labels {
                            match value.as_str() {
                                Some(v) => machine.labels.insert(key.clone(), v.to_owned()),
                                None => machine.labels.remove(key),
                            };
                        }
                    }
                    let new = self.sets.get_mut(to).unwrap();
                    new.replicas = replicas + count(moves.len());
                    new.scale_up_disabled = true;
                }
                InPlaceAction::ReleaseNewSet { set } => {
                    self.sets.get_mut(set).unwrap().scale_up_disabled = false;
                }
                InPlaceAction::AwaitNewSet { .. } => {}
            }
        }
    }

    fn label(&mut self, node: &str, key: &str) {
        self.nodes
            .get_mut(node)
            .unwrap()
            .labels
            .insert(key.into(), crate::rollout::in_place::TRUE.into());
    }

    fn machine(&mut self, name: &str) -> &mut MachineView {
        self.machines.iter_mut().find(|m| m.name == name).unwrap()
    }

    /// The set controller: create or delete to match replicas (a held set does not create); statuses follow.
    fn sets_act(&mut self) {
        let names: Vec<String> = self.sets.keys().cloned().collect();
        for name in names {
            let set = self.sets[&name].clone();
            let have = count(self.machines.iter().filter(|m| m.set == name).count());
            for _ in have..set.replicas {
                if !set.scale_up_disabled {
                    self.add_machine(&name);
                }
            }
            for _ in set.replicas..have {
                let pos = self.machines.iter().rposition(|m| m.set == name).unwrap();
                let gone = self.machines.remove(pos);
                self.deleted.push(gone.name);
            }
            let mine = || self.machines.iter().filter(|m| m.set == name);
            let available = count(mine().filter(|m| m.phase == Some(MachinePhase::Running)).count());
            let set = self.sets.get_mut(&name).unwrap();
            set.actual = count(mine().count());
            set.available = available;
        }
    }

    /// The machine side moves one selected machine a step: drained and updating, then updated (`pick` chooses).
    fn machine_side(&mut self, pick: usize) {
        let selected: Vec<usize> = (0..self.machines.len())
            .filter(|i| {
                let m = &self.machines[*i];
                let node = &self.nodes[m.node.as_ref().unwrap()];
                node.labels.contains_key(labels::SELECTED_FOR_UPDATE)
                    && !node.labels.contains_key(labels::UPDATE_RESULT)
            })
            .collect();
        if selected.is_empty() {
            return;
        }
        let index = selected[pick % selected.len()];
        let machine = &mut self.machines[index];
        let node = self.nodes.get_mut(machine.node.as_ref().unwrap()).unwrap();
        if machine.phase == Some(MachinePhase::InPlaceUpdating) {
            assert_eq!(
                node.target_class.as_ref(),
                Some(&self.target),
                "the node agent finds the deployment's class as its target"
            );
            node.in_place_reason = Some(in_place_update::UPDATE_SUCCESSFUL.into());
            node.labels.insert(
                labels::UPDATE_RESULT.into(),
                in_place_update::RESULT_SUCCESSFUL.into(),
            );
            machine.phase = Some(MachinePhase::Running);
        } else {
            machine.phase = Some(MachinePhase::InPlaceUpdating);
        }
    }

    fn unavailable(&self) -> i32 {
        self.replicas
            - count(
                self.machines
                    .iter()
                    .filter(|m| m.phase == Some(MachinePhase::Running))
                    .count(),
            )
    }

    fn selected_in_old(&self) -> i32 {
        count(
            self.machines
                .iter()
                .filter(|m| {
                    m.set != NEW
                        && self.nodes[m.node.as_ref().unwrap()]
                            .labels
                            .contains_key(labels::SELECTED_FOR_UPDATE)
                })
                .count(),
        )
    }
}

/// Runs the world until the plan is Complete (or `steps` run out), checking maxUnavailable after every act: never more
/// nodes selected at once than maxUnavailable plus the fresh machines of the surge, never fewer machines available
/// than `replicas − maxUnavailable`.
fn run(world: &mut World, picks: &[usize], steps: usize) -> bool {
    for round in 0..steps {
        let plan = world.plan();
        if plan.rollout.phase == RolloutPhase::Complete {
            return true;
        }
        world.apply(&plan);
        assert!(
            world.selected_in_old() <= world.fenceposts.max_unavailable + world.surge,
            "{} nodes selected at once with maxUnavailable {} and surge {}",
            world.selected_in_old(),
            world.fenceposts.max_unavailable,
            world.surge
        );
        world.sets_act();
        world.machine_side(picks.get(round).copied().unwrap_or(round));
        assert!(
            world.unavailable() <= world.fenceposts.max_unavailable,
            "{} unavailable",
            world.unavailable()
        );
    }
    false
}

proptest! {
    #[test]
    fn auto_updates_every_machine_in_place_within_max_unavailable(
        replicas in 1i32..8,
        max_unavailable in 1i32..4,
        picks in proptest::collection::vec(0usize..16, 0..200),
    ) {
        let max_unavailable = max_unavailable.min(replicas);
        let mut world = World::new(replicas, Orchestration::Auto, max_unavailable, 0);
        let before: Vec<String> = world.machines.iter().map(|m| m.name.clone()).collect();
        prop_assert!(run(&mut world, &picks, 400), "the rollout completes");
        prop_assert_eq!(&world.created, &Vec::<String>::new(), "no machine created");
        prop_assert_eq!(&world.deleted, &Vec::<String>::new(), "no machine deleted");
        let after: Vec<String> = world.machines.iter().map(|m| m.name.clone()).collect();
        prop_assert_eq!(after, before);
        prop_assert_eq!(world.sets[NEW].replicas, replicas);
        prop_assert_eq!(world.sets[OLD].replicas, 0);
        for machine in &world.machines {
            prop_assert_eq!(machine.set.as_str(), NEW);
            prop_assert_eq!(machine.labels.get(labels::MACHINE_TEMPLATE_HASH).map(String::as_str), Some(NEW));
            prop_assert_eq!(machine.labels.get("own").map(String::as_str), Some("kept"));
            prop_assert!(!machine.labels.contains_key(labels::UPDATE_RESULT));
            prop_assert!(world.nodes[machine.node.as_ref().unwrap()].labels.is_empty(), "node labels cleaned");
        }
    }
}

#[test]
fn with_surge_the_new_set_starts_with_fresh_machines_and_the_rest_of_the_old_ones_go() {
    // The reference: the new set is created at maxSurge; once it has every replica the old machines not updated go.
    let mut world = World::new(4, Orchestration::Auto, 1, 1);
    assert!(run(&mut world, &[], 400));
    assert_eq!(world.created.len(), 1, "one surge machine: {:?}", world.created);
    assert_eq!(
        world.deleted.len(),
        1,
        "one old machine not needed: {:?}",
        world.deleted
    );
    assert_eq!((world.sets[NEW].replicas, world.sets[OLD].replicas), (4, 0));
}

#[test]
fn manual_never_selects_and_the_new_set_starts_empty() {
    let mut world = World::new(3, Orchestration::Manual, 1, 5);
    for _ in 0..10 {
        let plan = world.plan();
        assert!(
            !plan
                .actions
                .iter()
                .any(|a| matches!(a, InPlaceAction::Select { .. })),
            "{plan:?}"
        );
        world.apply(&plan);
        world.sets_act();
    }
    assert_eq!(world.sets[NEW].replicas, 0);
    assert!(world.created.is_empty());
    assert!(
        world
            .nodes
            .values()
            .all(|n| n.labels.contains_key(labels::CANDIDATE_FOR_UPDATE))
    );
    assert!(world.sets[OLD].scale_up_disabled);
    // The user selects one node; the machine side updates it; it moves to the new set.
    let node = world.machines[1].node.clone().unwrap();
    world.label(&node, labels::SELECTED_FOR_UPDATE);
    world.machine_side(0);
    world.machine_side(0);
    let plan = world.plan();
    let transfer = plan
        .actions
        .iter()
        .find_map(|a| match a {
            InPlaceAction::Transfer(t) => Some(t.clone()),
            _ => None,
        })
        .expect("a transfer");
    assert_eq!(transfer.moves.len(), 1);
    assert_eq!(transfer.moves[0].machine, "m1");
    world.apply(&plan);
    world.sets_act();
    // The old set keeps its replicas and the new set its hold until the statuses count the move.
    assert_eq!((world.sets[NEW].replicas, world.sets[OLD].replicas), (1, 3));
    assert!(world.sets[NEW].scale_up_disabled);
    let plan = world.plan();
    assert_eq!(
        plan.actions,
        vec![InPlaceAction::ReleaseNewSet { set: NEW.into() }]
    );
    world.apply(&plan);
    world.sets_act();
    assert_eq!((world.sets[NEW].replicas, world.sets[OLD].replicas), (1, 2));
    assert!(!world.sets[NEW].scale_up_disabled);
    assert!(world.created.is_empty() && world.deleted.is_empty());
}

#[test]
fn a_machine_moves_only_with_the_condition_and_the_label_and_not_while_updating() {
    let mut world = World::new(2, Orchestration::Manual, 1, 0);
    let plan = world.plan();
    world.apply(&plan);
    world.sets_act();
    let node = world.machines[0].node.clone().unwrap();
    let transfers = |world: &World| {
        world
            .plan()
            .actions
            .iter()
            .filter(|a| matches!(a, InPlaceAction::Transfer(_)))
            .count()
    };
    // The label alone (the node agent said so, the machine controller not yet).
    world.nodes.get_mut(&node).unwrap().labels.insert(
        labels::UPDATE_RESULT.into(),
        in_place_update::RESULT_SUCCESSFUL.into(),
    );
    assert_eq!(transfers(&world), 0);
    // The condition too, but the machine is still InPlaceUpdating.
    world.nodes.get_mut(&node).unwrap().in_place_reason = Some(in_place_update::UPDATE_SUCCESSFUL.into());
    world.machines[0].phase = Some(MachinePhase::InPlaceUpdating);
    assert_eq!(transfers(&world), 0);
    // A failed update never moves.
    world.machines[0].phase = Some(MachinePhase::InPlaceUpdateFailed);
    world.nodes.get_mut(&node).unwrap().in_place_reason = Some(in_place_update::UPDATE_FAILED.into());
    assert_eq!(transfers(&world), 0);
    world.nodes.get_mut(&node).unwrap().in_place_reason = Some(in_place_update::UPDATE_SUCCESSFUL.into());
    world.machines[0].phase = Some(MachinePhase::InPlaceUpdateSuccessful);
    assert_eq!(transfers(&world), 1);
}

#[test]
fn the_moved_machine_keeps_its_own_labels_and_takes_the_new_selector() {
    let mut world = World::new(1, Orchestration::Manual, 1, 0);
    let plan = world.plan();
    world.apply(&plan);
    let node = world.machines[0].node.clone().unwrap();
    let view = world.nodes.get_mut(&node).unwrap();
    view.in_place_reason = Some(in_place_update::UPDATE_SUCCESSFUL.into());
    view.labels.insert(
        labels::UPDATE_RESULT.into(),
        in_place_update::RESULT_SUCCESSFUL.into(),
    );
    let plan = world.plan();
    let Some(InPlaceAction::Transfer(transfer)) = plan
        .actions
        .iter()
        .find(|a| matches!(a, InPlaceAction::Transfer(_)))
    else {
        panic!("a transfer: {plan:?}");
    };
    assert_eq!(
        serde_json::Value::Object(transfer.moves[0].labels.clone()),
        json!({ "name": "md", labels::MACHINE_TEMPLATE_HASH: NEW, labels::UPDATE_RESULT: "successful" })
    );
    let patch = crate::rollout::in_place::move_patch(&transfer.moves[0], NEW, "uid-new");
    assert_eq!(patch["metadata"]["resourceVersion"], json!("1"));
    assert_eq!(patch["metadata"]["ownerReferences"][0]["name"], json!(NEW));
    assert_eq!(patch["metadata"]["ownerReferences"][0]["controller"], json!(true));
}

/// A set controller whose cache shows a set's new replicas before the machines that moved would create or delete
/// to match: the hold stays, and no old set is lowered, until the statuses count the moves.
#[test]
fn a_held_new_set_is_awaited_until_its_status_counts_the_moved_machines_and_old_sets_wait_for_theirs() {
    let mut world = World::new(2, Orchestration::Auto, 1, 0);
    let plan = world.plan();
    world.apply(&plan);
    world.sets_act();
    // A transfer of one machine whose move neither set controller has counted yet.
    let new = world.sets.get_mut(NEW).unwrap();
    new.replicas = 1;
    new.scale_up_disabled = true;
    let plan = world.plan();
    assert_eq!(plan.actions, vec![InPlaceAction::AwaitNewSet { set: NEW.into() }]);
    assert!(plan.rollout.scale.is_empty(), "{plan:?}");
    // The old set's controller counted the machine gone: the old set comes down to it.
    world.sets.get_mut(OLD).unwrap().actual = 1;
    let plan = world.plan();
    assert_eq!(
        plan.rollout.scale,
        vec![Scale {
            name: OLD.into(),
            replicas: 1
        }]
    );
    assert_eq!(plan.actions, vec![InPlaceAction::AwaitNewSet { set: NEW.into() }]);
    // The new set's controller counted it too: released.
    world.sets.get_mut(NEW).unwrap().actual = 1;
    assert_eq!(
        world.plan().actions,
        vec![InPlaceAction::ReleaseNewSet { set: NEW.into() }]
    );
}

#[test]
fn selection_counts_machines_already_selected_against_max_unavailable() {
    let mut world = World::new(5, Orchestration::Auto, 2, 0);
    let plan = world.plan();
    world.apply(&plan);
    world.sets_act();
    let plan = world.plan();
    let selected = plan
        .actions
        .iter()
        .filter(|a| matches!(a, InPlaceAction::Select { .. }))
        .count();
    assert_eq!(selected, 2);
    world.apply(&plan);
    // Nothing more while both are under way.
    let plan = world.plan();
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, InPlaceAction::Select { .. })),
        "{plan:?}"
    );
}

/// The target is written with the candidate mark; a template change mid-rollout re-marks the candidates whose agent
/// has not started (no `ReadyForUpdate`, no `update-result`) and leaves the others alone.
#[test]
fn candidates_carry_the_deployment_class_as_target_refreshed_until_their_agent_starts() {
    let mut world = World::new(3, Orchestration::Manual, 1, 0);
    for _ in 0..3 {
        let plan = world.plan();
        world.apply(&plan);
        world.sets_act();
    }
    assert!(
        world
            .nodes
            .values()
            .all(|n| n.target_class.as_deref() == Some("medium")
                && n.labels.contains_key(labels::CANDIDATE_FOR_UPDATE))
    );
    assert!(
        !world
            .plan()
            .actions
            .iter()
            .any(|a| matches!(a, InPlaceAction::MarkCandidate { .. })),
        "nothing to mark once every candidate has the target"
    );
    let ready = world.nodes.get_mut("node-m0").unwrap();
    ready.in_place_reason = Some(in_place_update::READY_FOR_UPDATE.into());
    let reported = world.nodes.get_mut("node-m1").unwrap();
    reported
        .labels
        .insert(labels::UPDATE_RESULT.into(), "failed".into());
    world.target = "large".into();
    let marked: Vec<_> = world
        .plan()
        .actions
        .into_iter()
        .filter_map(|a| match a {
            InPlaceAction::MarkCandidate { node } => Some(node),
            _ => None,
        })
        .collect();
    assert_eq!(marked, vec!["node-m2".to_owned()]);
}

#[test]
fn the_candidate_patch_writes_only_what_differs() {
    let target = r#"{"class":"medium"}"#;
    let mut node = Node::default();
    assert_eq!(
        candidate_patch(&node, target),
        Some(json!({ "metadata": {
            "labels": { labels::CANDIDATE_FOR_UPDATE: "true" },
            "annotations": { annotations::IN_PLACE_UPDATE_TARGET: target },
        } }))
    );
    node.metadata.labels = Some(BTreeMap::from([(
        labels::CANDIDATE_FOR_UPDATE.to_owned(),
        "true".to_owned(),
    )]));
    assert_eq!(
        candidate_patch(&node, target),
        Some(json!({ "metadata": { "annotations": { annotations::IN_PLACE_UPDATE_TARGET: target } } }))
    );
    node.metadata.annotations = Some(BTreeMap::from([(
        annotations::IN_PLACE_UPDATE_TARGET.to_owned(),
        target.to_owned(),
    )]));
    assert_eq!(candidate_patch(&node, target), None);
}

#[test]
fn cleaning_a_node_removes_only_what_the_update_added() {
    let mut node = Node::default();
    node.metadata.resource_version = Some("9".into());
    node.metadata.labels = Some(BTreeMap::from([
        (labels::CANDIDATE_FOR_UPDATE.to_owned(), "true".to_owned()),
        (labels::SELECTED_FOR_UPDATE.to_owned(), "true".to_owned()),
        (labels::UPDATE_RESULT.to_owned(), "successful".to_owned()),
        ("zone".to_owned(), "a".to_owned()),
    ]));
    node.metadata.annotations = Some(BTreeMap::from([
        (annotations::UPDATE_FAILED_REASON.to_owned(), "earlier".to_owned()),
        (
            annotations::IN_PLACE_UPDATE_TARGET.to_owned(),
            r#"{"class":"c"}"#.to_owned(),
        ),
        ("kept".to_owned(), "yes".to_owned()),
    ]));
    let taint = |key: &str| Taint {
        key: key.into(),
        value: Some("True".into()),
        effect: "PreferNoSchedule".into(),
        time_added: None,
    };
    node.spec = Some(NodeSpec {
        unschedulable: Some(true),
        taints: Some(vec![taint("other"), taint(taints::PREFER_NO_SCHEDULE)]),
        ..NodeSpec::default()
    });
    assert_eq!(
        clean_node_patch(&node),
        Some(json!({
            "metadata": {
                "labels": {
                    labels::CANDIDATE_FOR_UPDATE: null,
                    labels::SELECTED_FOR_UPDATE: null,
                    labels::UPDATE_RESULT: null,
                },
                "annotations": {
                    annotations::UPDATE_FAILED_REASON: null,
                    annotations::IN_PLACE_UPDATE_TARGET: null,
                },
                "resourceVersion": "9",
            },
            "spec": {
                "unschedulable": false,
                "taints": [{ "key": "other", "value": "True", "effect": "PreferNoSchedule" }],
            },
        }))
    );
    let clean = Node::default();
    assert_eq!(clean_node_patch(&clean), None);
}

#[test]
fn in_place_fenceposts_read_in_place_update_as_the_reference_does() {
    let md: mcm_api::MachineDeployment = serde_json::from_value(json!({
        "spec": { "replicas": 10, "strategy": { "type": "InPlaceUpdate",
            "inPlaceUpdate": { "orchestrationType": "Auto", "maxSurge": "25%", "maxUnavailable": "25%" } } }
    }))
    .unwrap();
    // MaxSurge is the rolling update's only: 0; maxUnavailable 25% of 10 rounded down; the creation surge rounds up.
    assert_eq!(fenceposts(&md).unwrap(), fp(0, 2));
    assert_eq!(in_place_surge(&md).unwrap(), 3);
    let manual: mcm_api::MachineDeployment = serde_json::from_value(json!({
        "spec": { "replicas": 10, "strategy": { "type": "InPlaceUpdate",
            "inPlaceUpdate": { "orchestrationType": "Manual", "maxSurge": 4, "maxUnavailable": 0 } } }
    }))
    .unwrap();
    // Manual: maxSurge counts as 0, so maxUnavailable 0 becomes 1; the new set gets no fresh machine.
    assert_eq!(fenceposts(&manual).unwrap(), fp(0, 1));
    assert_eq!(in_place_surge(&manual).unwrap(), 0);
}

#[test]
fn a_scaling_event_in_the_middle_of_an_in_place_rollout_is_scaled_as_any_rollout() {
    let mut world = World::new(4, Orchestration::Auto, 1, 0);
    let plan = world.plan();
    world.apply(&plan);
    world.sets_act();
    // Two machines moved already.
    world.sets.get_mut(OLD).unwrap().replicas = 2;
    world.sets.get_mut(NEW).unwrap().replicas = 2;
    world.replicas = 6;
    let plan = world.plan();
    assert_eq!(plan.rollout.phase, RolloutPhase::Scaling);
    assert!(plan.actions.is_empty(), "{plan:?}");
    // Scale-out goes to the new set only.
    assert_eq!(scales(&plan.rollout.scale), [(NEW, 4), (OLD, 2)]);
}
