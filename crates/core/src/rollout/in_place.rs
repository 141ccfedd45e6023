//! [`decide`]: one pass of an InPlaceUpdate rollout (reference `deployment_inplace.go`, PR #973): the machines keep
//! their VMs; the machine controller and a node agent update them one node at a time, and the deployment controller
//! moves each updated machine from its old set to the new one.
//!
//! The protocol, deployment side (the machine side is the machine controller's):
//! 1. old sets with replicas are labelled `node.machine.sapcloud.io/scale-up-disabled` (a machine moved away must
//!    not be replaced), and the nodes of their machines `candidate-for-update=true`;
//! 2. `Auto`: nodes are labelled `selected-for-update=true` within maxUnavailable (the reference's
//!    `maxUpdatePossible` and `selectNumOfMachineForUpdate`); `Manual`: the user labels them;
//! 3. a machine of an old set whose node has the condition `InPlaceUpdate` with reason `UpdateSuccessful` **and** the
//!    label `update-result=successful`, and whose phase is not `InPlaceUpdating`, is moved to the new set
//!    ([`Transfer`]); the old set shrinks and the new set grows by as many;
//! 4. the new set's machines then lose the `update-result` label and their nodes the in-place labels, the
//!    `update-failed-reason` annotation and the PreferNoSchedule taint, and are uncordoned;
//! 5. old sets shrink to the machines they still have; once the new set has every replica, old sets go to 0.
//!
//! The scale-down-disabled annotations and the PreferNoSchedule taint of old sets' nodes are the marks every rollout
//! gives (`crate::autoscaler::node_marks`); the controller applies them as for RollingUpdate. Creation, pause and
//! scaling events go through [`step`](super::step) as for the other strategies. Pure: no client, no clock.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use mcm_api::{
    Machine, MachinePhase, MetaExt, StrategyType,
    keys::{annotations, in_place_update, labels, taints},
};
use serde_json::{Map, Value, json};

use super::{
    fenceposts::Fenceposts,
    sets::SetView,
    step::{
        RolloutInput, RolloutPhase, RolloutPlan, Scale, by_age, is_complete, is_scaling_event,
        new_set_replicas, step,
    },
};

/// The value of the labels the deployment controller sets (`candidate-for-update`, `selected-for-update`,
/// `scale-up-disabled`).
pub const TRUE: &str = "true";

/// Who selects the nodes to update (`spec.strategy.inPlaceUpdate.orchestrationType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Orchestration {
    /// The deployment controller selects them within maxUnavailable.
    Auto,
    /// The user labels them `selected-for-update`.
    Manual,
}

/// A machine of the deployment, as the decision needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineView {
    /// Its name.
    pub name: String,
    /// The set that controls it.
    pub set: String,
    /// The resourceVersion the decision is made on: every patch of the machine carries it.
    pub resource_version: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its phase.
    pub phase: Option<MachinePhase>,
    /// Its node (the `node` label).
    pub node: Option<String>,
    /// It has a deletionTimestamp.
    pub deleting: bool,
}

impl MachineView {
    /// The view of `machine`, controlled by the set `set`.
    pub fn of(machine: &Machine, set: &str) -> Self {
        Self {
            name: machine.metadata.name.clone().unwrap_or_default(),
            set: set.to_owned(),
            resource_version: machine.metadata.resource_version.clone().unwrap_or_default(),
            labels: machine.metadata.labels.clone().unwrap_or_default(),
            phase: machine.phase(),
            node: machine.node_name().map(str::to_owned),
            deleting: machine.is_deleting(),
        }
    }

    fn carries_success(&self) -> bool {
        self.labels.get(labels::UPDATE_RESULT).map(String::as_str) == Some(in_place_update::RESULT_SUCCESSFUL)
    }
}

/// A node of the deployment's machines, as the decision needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// The reason of its `InPlaceUpdate` condition, if it has one.
    pub in_place_reason: Option<String>,
    /// The class of its in-place update target annotation, if it has a readable one.
    pub target_class: Option<String>,
}

impl NodeView {
    /// The view of `node`.
    pub fn of(node: &Node) -> Self {
        Self {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            in_place_reason: crate::in_place_update::reason_of(node).map(str::to_owned),
            target_class: crate::in_place_target::Target::class_of(node),
        }
    }

    fn has(&self, key: &str) -> bool {
        self.labels.contains_key(key)
    }

    /// Whether the node needs the candidate mark: it lacks the label, or its target is not `target_class` while its
    /// node agent has not started on the old one (no `ReadyForUpdate`, no `update-result`).
    fn needs_mark(&self, target_class: Option<&str>) -> bool {
        if !self.has(labels::CANDIDATE_FOR_UPDATE) {
            return true;
        }
        let stale = target_class.is_some_and(|class| self.target_class.as_deref() != Some(class));
        stale
            && self.in_place_reason.as_deref() != Some(in_place_update::READY_FOR_UPDATE)
            && !self.has(labels::UPDATE_RESULT)
    }

    /// The node agent and the machine controller both said the update succeeded (the reference's
    /// `!isUpdateNotSuccessful`).
    fn updated(&self) -> bool {
        self.in_place_reason.as_deref() == Some(in_place_update::UPDATE_SUCCESSFUL)
            && self.labels.get(labels::UPDATE_RESULT).map(String::as_str)
                == Some(in_place_update::RESULT_SUCCESSFUL)
    }
}

/// What [`decide`] looks at.
#[derive(Clone, Copy, Debug)]
pub struct InPlaceInput<'a> {
    /// The deployment's `spec.replicas`.
    pub replicas: i32,
    /// Auto or Manual.
    pub orchestration: Orchestration,
    /// [`fenceposts`](fn@super::fenceposts) of the deployment (maxSurge 0, maxUnavailable of `inPlaceUpdate`).
    pub fenceposts: Fenceposts,
    /// [`in_place_surge`](super::in_place_surge): how many fresh machines the new set may add.
    pub surge: i32,
    /// `spec.paused`.
    pub paused: bool,
    /// The new set, if any.
    pub new: Option<&'a SetView>,
    /// The other sets.
    pub old: &'a [SetView],
    /// Each set's `spec.selector.matchLabels`, by set name.
    pub selectors: &'a BTreeMap<String, BTreeMap<String, String>>,
    /// The machines of every set.
    pub machines: &'a [MachineView],
    /// The nodes of those machines that the cache holds, by name.
    pub nodes: &'a BTreeMap<String, NodeView>,
    /// The class of the deployment's template: the target every candidate node is to carry (`None`: not compared).
    pub target_class: Option<&'a str>,
}

/// One machine to move to the new set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    /// The machine.
    pub machine: String,
    /// Its resourceVersion as decided on.
    pub resource_version: String,
    /// Its old set.
    pub from: String,
    /// Its node, uncordoned once moved.
    pub node: Option<String>,
    /// Labels to write (`null` removes): the new set's selector labels, the machine's own non-selector labels kept,
    /// the old set's selector labels the new one lacks removed, and `update-result=successful`.
    pub labels: Map<String, Value>,
}

/// Machines moved to the new set in one go. The controller: (1) raises the new set's replicas by `moves.len()` and
/// labels it `scale-up-disabled` (so that it neither deletes the machines arriving nor creates any while they
/// come), one patch carrying the set's resourceVersion; (2) patches each machine (owner reference and labels, with
/// its resourceVersion; a conflict skips it); (3) uncordons each moved machine's node; (4) when a move was skipped,
/// sets the new set's replicas to its old value plus the machines moved. The new set stays labelled, and no old
/// set is lowered, until the set controllers have counted the moves in their statuses: a set controller whose cache
/// shows a set's new replicas before the machines that moved would create (new set) or delete (old set) to match.
/// The next passes lower the old sets to the machines their statuses count and release the new set once its status
/// counts its replicas ([`InPlaceAction::ReleaseNewSet`], [`InPlaceAction::AwaitNewSet`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// The new set.
    pub to: String,
    /// Its replicas before the transfer.
    pub replicas: i32,
    /// The machines, oldest set first.
    pub moves: Vec<Move>,
}

/// One act of an in-place pass, performed in order after the [`RolloutPlan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InPlaceAction {
    /// Label the node `candidate-for-update=true` and give it the target annotation ([`candidate_patch`]).
    MarkCandidate {
        /// The node.
        node: String,
    },
    /// Label the node `selected-for-update=true`.
    Select {
        /// The node.
        node: String,
    },
    /// Remove `update-result` from a machine of the new set (it has been counted there).
    CleanMachine {
        /// The machine.
        machine: String,
        /// Its resourceVersion as decided on.
        resource_version: String,
    },
    /// Remove the in-place labels, the `update-failed-reason` annotation and the PreferNoSchedule taint from the
    /// node of an updated machine of the new set, and uncordon it ([`clean_node_patch`]).
    CleanNode {
        /// The node.
        node: String,
    },
    /// Move updated machines to the new set.
    Transfer(Transfer),
    /// The new set carries `scale-up-disabled` from a transfer and its status counts all its replicas (its
    /// controller has seen the machines that came): remove the label, guarded by the resourceVersion decided on.
    ReleaseNewSet {
        /// The new set.
        set: String,
    },
    /// The new set carries `scale-up-disabled` from a transfer and its status counts fewer machines than its
    /// replicas: either its controller has not seen the moves yet (wait), or the transfer stopped between raising
    /// the replicas and moving every machine. A fresh list (not the cache, which may lag) tells: replicas above the
    /// machines the set controls come down to them, the label stays.
    AwaitNewSet {
        /// The new set.
        set: String,
    },
}

/// What the deployment controller does in an in-place pass: the set operations every strategy has, then `actions`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct InPlacePlan {
    /// Create, scale and label sets, and where the rollout stands.
    pub rollout: RolloutPlan,
    /// The in-place acts, in order.
    pub actions: Vec<InPlaceAction>,
}

/// One pass of an InPlaceUpdate deployment:
/// - no new set yet: create it with `min(replicas + surge − machines, replicas)` (0 with Manual), the reference's
///   `NewISNewReplicas`; paused, or a scaling event: [`step`](super::step) (proportional scaling);
/// - a new set still labelled `scale-up-disabled` by a transfer: old sets down to what their statuses count, the new
///   set released once its status counts its replicas, nothing else;
/// - otherwise, in the reference's order: label old sets `scale-up-disabled` and their nodes `candidate-for-update`;
///   clean the new set's updated machines and nodes; shrink old sets to the machines they have; then the new set:
///   down to `replicas` if above, up to `replicas − old` if the old sets cannot make up the rest, else move the
///   updated machines (never beyond `replicas`); then, with nothing moved and the new set full, old sets to 0; else
///   (Auto) select nodes: while `undergoing + new < replicas` and `Σreplicas − minAvailable − newUnavailable −
///   undergoing > 0`, up to `min(available − undergoing − minAvailable, replicas − new − undergoing)` candidates,
///   oldest set first, where `minAvailable = replicas − maxUnavailable` and `undergoing` counts old machines whose
///   node is selected.
pub fn decide(input: &InPlaceInput<'_>) -> InPlacePlan {
    let replicas = input.replicas.max(0);
    let shared = RolloutInput {
        replicas,
        strategy: StrategyType::InPlaceUpdate,
        fenceposts: input.fenceposts,
        paused: input.paused,
        new: input.new,
        old: input.old,
    };
    let Some(new) = input.new else {
        let mut rollout = step(&shared);
        if !input.paused {
            rollout.create_new = Some(match input.orchestration {
                Orchestration::Manual => 0,
                Orchestration::Auto => new_set_replicas(
                    replicas,
                    Fenceposts {
                        max_surge: input.surge,
                        ..input.fenceposts
                    },
                    &SetView::default(),
                    input.old,
                ),
            });
        }
        return InPlacePlan {
            rollout,
            actions: Vec::new(),
        };
    };
    if input.paused || is_scaling_event(replicas, Some(new), input.old) {
        return InPlacePlan {
            rollout: step(&shared),
            actions: Vec::new(),
        };
    }
    let mut plan = InPlacePlan {
        rollout: RolloutPlan::new(RolloutPhase::Progressing),
        actions: Vec::new(),
    };
    if new.scale_up_disabled {
        settle_transfer(input.old, new, &mut plan);
        return plan;
    }
    mark_old(input, &mut plan);
    clean_new(input, new, &mut plan);

    // Old sets shrink to the machines they have (scale-up-disabled, they would never replace the others).
    let old_targets: BTreeMap<&str, i32> = input
        .old
        .iter()
        .map(|s| (s.name.as_str(), s.replicas.min(s.actual)))
        .collect();
    let old_total: i32 = old_targets.values().sum();

    // The new set.
    let mut new_target = new.replicas;
    if new.replicas > replicas {
        new_target = replicas;
    } else if new.replicas < replicas {
        if old_total == 0 {
            new_target = replicas;
        } else if old_total + new.replicas < replicas {
            new_target = replicas - old_total;
        } else if let Some(transfer) = transfer(input, new, replicas - new.replicas) {
            // The moved machines' sets are scaled by the transfer itself; other scales wait for the next pass.
            plan.actions.push(InPlaceAction::Transfer(transfer));
            return finish(plan, replicas, new, input.old);
        }
    }
    let all_old_to_zero = new_target == replicas && old_total > 0;
    let mut old_sorted: Vec<&SetView> = input.old.iter().collect();
    old_sorted.sort_by(|a, b| by_age(a, b));
    for set in &old_sorted {
        let target = if all_old_to_zero {
            0
        } else {
            old_targets[set.name.as_str()]
        };
        if target != set.replicas {
            plan.rollout.scale.push(Scale {
                name: set.name.clone(),
                replicas: target,
            });
        }
    }
    if new_target != new.replicas {
        plan.rollout.scale.push(Scale {
            name: new.name.clone(),
            replicas: new_target,
        });
    }
    if plan.rollout.scale.is_empty() && old_total > 0 && input.orchestration == Orchestration::Auto {
        select(input, new, old_total, &old_sorted, &mut plan);
    }
    finish(plan, replicas, new, input.old)
}

/// After a transfer, with the new set held: old sets come down to the machines their statuses count (their
/// controllers have seen the moves: lowering them earlier would have them delete machines that left), and the new
/// set is released once its status counts its replicas, else awaited.
fn settle_transfer(old: &[SetView], new: &SetView, plan: &mut InPlacePlan) {
    for set in old {
        let target = set.replicas.min(set.actual);
        if target != set.replicas {
            plan.rollout.scale.push(Scale {
                name: set.name.clone(),
                replicas: target,
            });
        }
    }
    let set = new.name.clone();
    plan.actions.push(if new.actual >= new.replicas {
        InPlaceAction::ReleaseNewSet { set }
    } else {
        InPlaceAction::AwaitNewSet { set }
    });
}

/// Old sets with replicas are labelled `scale-up-disabled`, the nodes of their machines `candidate-for-update`.
fn mark_old(input: &InPlaceInput<'_>, plan: &mut InPlacePlan) {
    if input.old.iter().any(|s| s.replicas > 0) {
        plan.rollout.disable_scale_up = input
            .old
            .iter()
            .filter(|s| !s.scale_up_disabled && (s.replicas > 0 || s.actual > 0))
            .map(|s| s.name.clone())
            .collect();
    }
    for set in input.old {
        for machine in machines_of(input.machines, &set.name).filter(|m| !m.deleting) {
            if let Some((node, view)) = node_of(input.nodes, machine)
                && view.needs_mark(input.target_class)
            {
                plan.actions.push(InPlaceAction::MarkCandidate {
                    node: node.to_owned(),
                });
            }
        }
    }
}

/// The new set's moved machines lose `update-result` (the move counted them already: the label has done its work),
/// and the nodes of its updated machines are cleaned (the reference's `syncMachineSets`).
fn clean_new(input: &InPlaceInput<'_>, new: &SetView, plan: &mut InPlacePlan) {
    for machine in machines_of(input.machines, &new.name) {
        if machine.carries_success() {
            plan.actions.push(InPlaceAction::CleanMachine {
                machine: machine.name.clone(),
                resource_version: machine.resource_version.clone(),
            });
        }
        if let Some((node, view)) = node_of(input.nodes, machine)
            && view.updated()
        {
            plan.actions.push(InPlaceAction::CleanNode {
                node: node.to_owned(),
            });
        }
    }
}

/// Auto: nodes of old machines to select within maxUnavailable (the reference's `reconcileOldMachineSetsInPlace`
/// and `selectNumOfMachineForUpdate`), oldest set first.
fn select(
    input: &InPlaceInput<'_>,
    new: &SetView,
    old_total: i32,
    old_sorted: &[&SetView],
    plan: &mut InPlacePlan,
) {
    let replicas = input.replicas.max(0);
    let selected =
        |m: &&MachineView| node_of(input.nodes, m).is_some_and(|(_, v)| v.has(labels::SELECTED_FOR_UPDATE));
    let undergoing: usize = old_sorted
        .iter()
        .map(|s| machines_of(input.machines, &s.name).filter(selected).count())
        .sum();
    let undergoing = i32::try_from(undergoing).unwrap_or(i32::MAX);
    let wanted = replicas - new.replicas - undergoing;
    let min_available = replicas - input.fenceposts.max_unavailable;
    let new_unavailable = (new.replicas - new.available).max(0);
    let possible = old_total + new.replicas - min_available - new_unavailable - undergoing;
    let available = new.available + old_sorted.iter().map(|s| s.available).sum::<i32>() - undergoing;
    if wanted <= 0 || possible <= 0 || available <= min_available {
        return;
    }
    let mut left = (available - min_available).min(wanted);
    for set in old_sorted {
        let mut from_set = set.replicas.min(left);
        let mut machines: Vec<&MachineView> = machines_of(input.machines, &set.name)
            .filter(|m| !m.deleting)
            .collect();
        machines.sort_by(|a, b| a.name.cmp(&b.name));
        for machine in machines {
            if from_set == 0 {
                break;
            }
            let Some((node, view)) = node_of(input.nodes, machine) else {
                continue;
            };
            if view.has(labels::SELECTED_FOR_UPDATE) || view.has(labels::UPDATE_RESULT) {
                continue;
            }
            plan.actions.push(InPlaceAction::Select {
                node: node.to_owned(),
            });
            from_set -= 1;
            left -= 1;
        }
    }
}

/// The machines of the set `set`.
fn machines_of<'a>(machines: &'a [MachineView], set: &'a str) -> impl Iterator<Item = &'a MachineView> {
    machines.iter().filter(move |m| m.set == set)
}

/// The machine's node and its view, when the cache holds it.
fn node_of<'a>(
    nodes: &'a BTreeMap<String, NodeView>,
    machine: &'a MachineView,
) -> Option<(&'a str, &'a NodeView)> {
    let name = machine.node.as_deref()?;
    nodes.get(name).map(|view| (name, view))
}

/// The updated machines of old sets to move, oldest set first, at most `room`.
fn transfer(input: &InPlaceInput<'_>, new: &SetView, room: i32) -> Option<Transfer> {
    let mut old_sorted: Vec<&SetView> = input.old.iter().collect();
    old_sorted.sort_by(|a, b| by_age(a, b));
    let no_labels = BTreeMap::new();
    let new_selector = input.selectors.get(&new.name).unwrap_or(&no_labels);
    let mut moves = Vec::new();
    for set in old_sorted {
        let old_selector = input.selectors.get(&set.name).unwrap_or(&no_labels);
        let mut machines: Vec<&MachineView> = input.machines.iter().filter(|m| m.set == set.name).collect();
        machines.sort_by(|a, b| a.name.cmp(&b.name));
        for machine in machines {
            if i32::try_from(moves.len()).unwrap_or(i32::MAX) >= room {
                break;
            }
            let updated = machine
                .node
                .as_deref()
                .and_then(|n| input.nodes.get(n))
                .is_some_and(NodeView::updated);
            if !updated || machine.deleting || machine.phase == Some(MachinePhase::InPlaceUpdating) {
                continue;
            }
            moves.push(Move {
                machine: machine.name.clone(),
                resource_version: machine.resource_version.clone(),
                from: set.name.clone(),
                node: machine.node.clone(),
                labels: moved_labels(old_selector, new_selector),
            });
        }
    }
    (!moves.is_empty()).then(|| Transfer {
        to: new.name.clone(),
        replicas: new.replicas,
        moves,
    })
}

/// The label changes of a moved machine: the old set's selector labels the new one lacks go, the new set's selector
/// labels and `update-result=successful` come (every other label of the machine stays).
fn moved_labels(
    old_selector: &BTreeMap<String, String>,
    new_selector: &BTreeMap<String, String>,
) -> Map<String, Value> {
    let mut changes: Map<String, Value> = old_selector
        .keys()
        .filter(|k| !new_selector.contains_key(*k))
        .map(|k| (k.clone(), Value::Null))
        .collect();
    changes.extend(new_selector.iter().map(|(k, v)| (k.clone(), json!(v))));
    changes.insert(
        labels::UPDATE_RESULT.to_owned(),
        json!(in_place_update::RESULT_SUCCESSFUL),
    );
    changes
}

/// The phase of the pass: Progressing when it does something, else Complete or Waiting.
fn finish(mut plan: InPlacePlan, replicas: i32, new: &SetView, old: &[SetView]) -> InPlacePlan {
    let rollout = &plan.rollout;
    let idle = rollout.scale.is_empty()
        && rollout.disable_scale_up.is_empty()
        && rollout.enable_scale_up.is_empty()
        && plan.actions.is_empty();
    if idle {
        plan.rollout.phase = if is_complete(replicas, Some(new), old) {
            RolloutPhase::Complete
        } else {
            RolloutPhase::Waiting
        };
    }
    plan
}

// ---------------------------------------------------------------------------------------------------------------------
// The writes
// ---------------------------------------------------------------------------------------------------------------------

/// The merge patch labelling a node `key=true`, or `None` when it has the label.
pub fn node_label_patch(node: &Node, key: &str) -> Option<Value> {
    (node.label(key) != Some(TRUE)).then(|| json!({ "metadata": { "labels": { key: TRUE } } }))
}

/// The merge patch marking a node a candidate: the label `candidate-for-update=true` and the annotation
/// `in-place-update-target` = `target` (an [`crate::in_place_target::Target::annotation`]), each only when it
/// differs; `None` when the node has both.
pub fn candidate_patch(node: &Node, target: &str) -> Option<Value> {
    let mut metadata = Map::new();
    if node.label(labels::CANDIDATE_FOR_UPDATE) != Some(TRUE) {
        metadata.insert("labels".into(), json!({ labels::CANDIDATE_FOR_UPDATE: TRUE }));
    }
    if node.annotation(annotations::IN_PLACE_UPDATE_TARGET) != Some(target) {
        metadata.insert(
            "annotations".into(),
            json!({ annotations::IN_PLACE_UPDATE_TARGET: target }),
        );
    }
    (!metadata.is_empty()).then(|| json!({ "metadata": metadata }))
}

fn is_rollout_taint(taint: &Taint) -> bool {
    taint.key == taints::PREFER_NO_SCHEDULE
}

/// The merge patch that ends an in-place update on a node of the new set: the labels `candidate-for-update`,
/// `selected-for-update` and `update-result` and the annotations `update-failed-reason` and `in-place-update-target`
/// go, the node is uncordoned,
/// and the PreferNoSchedule taint of the rollout goes (the taint list is then written whole, with the node's
/// resourceVersion, so that a concurrent change of the taints is a conflict rather than lost). `None` when nothing
/// is left to do. Unlike the reference, the `critical-components-not-ready` taint is not added: nothing here would
/// remove it.
pub fn clean_node_patch(node: &Node) -> Option<Value> {
    let mut metadata = Map::new();
    let label_keys = [
        labels::CANDIDATE_FOR_UPDATE,
        labels::SELECTED_FOR_UPDATE,
        labels::UPDATE_RESULT,
    ];
    let gone: Map<String, Value> = label_keys
        .iter()
        .filter(|k| node.label(k).is_some())
        .map(|k| ((*k).to_owned(), Value::Null))
        .collect();
    if !gone.is_empty() {
        metadata.insert("labels".into(), Value::Object(gone));
    }
    let gone: Map<String, Value> = [
        annotations::UPDATE_FAILED_REASON,
        annotations::IN_PLACE_UPDATE_TARGET,
    ]
    .iter()
    .filter(|k| node.annotation(k).is_some())
    .map(|k| ((*k).to_owned(), Value::Null))
    .collect();
    if !gone.is_empty() {
        metadata.insert("annotations".into(), Value::Object(gone));
    }
    let spec = node.spec.as_ref();
    let mut spec_patch = Map::new();
    if spec.and_then(|s| s.unschedulable) == Some(true) {
        spec_patch.insert("unschedulable".into(), json!(false));
    }
    let current: Vec<Taint> = spec.and_then(|s| s.taints.clone()).unwrap_or_default();
    if current.iter().any(is_rollout_taint) {
        let kept: Vec<Taint> = current.into_iter().filter(|t| !is_rollout_taint(t)).collect();
        spec_patch.insert("taints".into(), json!(kept));
        if let Some(version) = &node.metadata.resource_version {
            metadata.insert("resourceVersion".into(), json!(version));
        }
    }
    let mut patch = Map::new();
    if !spec_patch.is_empty() {
        patch.insert("spec".into(), Value::Object(spec_patch));
    }
    if !metadata.is_empty() {
        patch.insert("metadata".into(), Value::Object(metadata));
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

/// The merge patch that uncordons a node, or `None` when it is schedulable.
pub fn uncordon_patch(node: &Node) -> Option<Value> {
    (node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true))
        .then(|| json!({ "spec": { "unschedulable": false } }))
}

/// The merge patch moving a machine to the new set `to` (uid `to_uid`): its controller owner reference replaced, its
/// labels changed as [`Move::labels`] says, guarded by the resourceVersion it was decided on (a conflict means the
/// machine changed: decide again).
pub fn move_patch(moved: &Move, to: &str, to_uid: &str) -> Value {
    json!({ "metadata": {
        "resourceVersion": moved.resource_version,
        "ownerReferences": [{
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "MachineSet",
            "name": to,
            "uid": to_uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }],
        "labels": moved.labels,
    } })
}

/// The merge patch removing `update-result` from a machine, guarded by its resourceVersion.
pub fn clean_machine_patch(resource_version: &str) -> Value {
    json!({ "metadata": { "resourceVersion": resource_version, "labels": { labels::UPDATE_RESULT: null } } })
}
