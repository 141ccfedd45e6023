//! The safety controller's overshoot freeze (reference §7, `machine_safety.go`; spec 002 "Safety Controller":
//! "freezes the MachineDeployment and MachineSet controller if the number of Machine objects goes beyond a certain
//! threshold on top of Spec.Replicas … unfreezes … once situation is resolved to normal. A freeze label is applied
//! on MachineDeployment/MachineSet to enforce the freeze condition").
//!
//! The controller observes the machines, sets and deployments of its namespace (caches), calls [`plan`], and acts
//! on the [`Plan`]: for each [`Write`] it re-reads the object, recomputes the patches against that fresh version
//! ([`set_patches`] / [`deployment_patches`] with the write's [`Desired`] state), applies them in the order of
//! [`ObjectPatches::status_first`], and records the write's event when the patches change the freeze label
//! ([`ObjectPatches::transition`]). Nothing here reads a clock: the time of the condition transitions is a
//! parameter.
//!
//! # The rules
//!
//! - **Counted machines** ([`counts_for`]): machines of the set's namespace whose labels include all the set's
//!   template labels and whose *controller* owner reference is a `MachineSet` of the set's name. The reference
//!   counts any owner reference with the set's name (of any kind); a machine has one controller, so here a machine
//!   counts for at most one set, and a non-controller reference is not ownership. Machines being deleted **count**,
//!   as in the reference: the freeze guards against Machine objects piling up, and a machine whose deletion is
//!   stuck is still one (a set that keeps replacing machines whose deletion never ends is exactly a runaway).
//!   Hence a frozen set unfreezes once the machines it scaled down are really gone, and (as in the reference) a
//!   large scale-down can freeze a set until the machines it deletes are gone — harmless, since a freeze only
//!   blocks scale-up.
//! - **Thresholds** ([`thresholds`]): `upper = 2·set.replicas + safety_up`; for a set owned by a MachineDeployment
//!   (its controller owner reference, see [`owning_deployment`]) `upper = md.replicas + surge + safety_up`, where
//!   `surge` is `maxSurge` of `rollingUpdate`, else of `inPlaceUpdate` (a percentage of `md.replicas` rounded up),
//!   and 1 (the API default) when neither sets it or the value is unusable (the reference aborts the whole pass on
//!   an absent or bad maxSurge, which leaves every later set unguarded). `lower = upper − safety_down`; a
//!   `safety_down` of 0 acts as 1, since freezing and unfreezing at the same count would flap.
//! - **Per set** (sets being deleted are left alone: they create nothing and their machines are on their way out):
//!   1. the unfreeze annotation (`safety.machine.sapcloud.io/unfreeze`, any value) on the set or on its deployment
//!      unfreezes it at once, and the annotation is removed (one-shot). A set still at or over its upper threshold
//!      is frozen again by the next pass, as in the reference: the annotation is for an operator who fixed the cause
//!      or wants the set controller to act once;
//!   2. else `count ≥ upper` freezes it (label `freeze=True`, condition `Frozen=True` with reason
//!      `OverShootingReplicaCount` and a message naming the count and the threshold; event `FrozeMachineSet`);
//!   3. else `count ≤ lower` unfreezes it (label and condition removed; event `UnfrozeMachineSet`);
//!   4. else (between the thresholds) it stays as it is.
//!
//!   The label is the freeze (the set controller obeys it, `machineset::decide`); the condition reports it and is
//!   kept in line with the label: added to a labelled set that lacks it, removed from an unlabelled one.
//! - **Every set is evaluated in every pass.** The reference returns from its loop after the first freeze or
//!   unfreeze, so with many overshooting sets it takes one period (1 minute) per set; here all of them change in
//!   the same pass.
//! - **Deployments** are frozen iff at least one of their (not deleted) sets is frozen after the pass. A deployment
//!   that becomes frozen because one of its sets froze in this pass gets that set's reason and message; otherwise
//!   (it was out of line with its sets) reason `MachineDeploymentStateSync`. The unfreeze annotation on a deployment
//!   unfreezes all its sets and the deployment, and is removed; it is not copied to the sets (the reference copies it
//!   and removes it there in a later step of the same pass; the effect is the same). Events `FrozeMachineDeployment`
//!   and `UnfrozeMachineDeployment` are recorded on deployments (not in the reference, which records events on sets
//!   only).
//! - **No write when nothing changes**: a Frozen condition with status True is left as it is (its message is not
//!   rewritten as the count moves), and objects already in the desired state get no [`Write`].

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::{
    apis::meta::v1::{ObjectMeta, Time},
    util::intstr::IntOrString,
};
use mcm_api::{
    ConditionStatus, Machine, MachineDeployment, MachineDeploymentCondition, MachineDeploymentConditionType,
    MachineSet, MachineSetCondition, MachineSetConditionType,
    keys::{annotations, labels},
};
use serde_json::{Map, Value, json};

use crate::{
    machineset::{FREEZE_VALUE, MACHINE_SET_KIND},
    rollout::{DEFAULT_FENCEPOST, scaled_value},
};

/// The default of `--safety-up`: machines tolerated above the expected maximum before a set is frozen.
pub const DEFAULT_SAFETY_UP: u32 = 2;

/// The default of `--safety-down`: how far below the upper threshold the count must fall to unfreeze.
pub const DEFAULT_SAFETY_DOWN: u32 = 1;

/// `kind` of a set's owner reference to its deployment.
pub const MACHINE_DEPLOYMENT_KIND: &str = "MachineDeployment";

/// Reasons of the `Frozen` condition, and of unfreezing (logs and event messages).
pub mod reasons {
    /// The set has too many machines (the reference's `OverShootingReplicaCount`).
    pub const OVERSHOOTING_REPLICA_COUNT: &str = "OverShootingReplicaCount";
    /// The deployment was brought in line with its sets (the reference's `MachineDeploymentStateSync`).
    pub const MACHINE_DEPLOYMENT_STATE_SYNC: &str = "MachineDeploymentStateSync";
    /// Unfrozen by hand with the `safety.machine.sapcloud.io/unfreeze` annotation.
    pub const UNFREEZE_ANNOTATION: &str = "UnfreezeAnnotation";
    /// Unfrozen because the count fell to the lower threshold (the reference's `UnderShootingReplicaCount`).
    pub const UNDERSHOOTING_REPLICA_COUNT: &str = "UnderShootingReplicaCount";
}

/// Reasons of the Events the safety controller records.
pub mod events {
    /// A set was frozen (reference).
    pub const FROZE_MACHINE_SET: &str = "FrozeMachineSet";
    /// A set was unfrozen (reference).
    pub const UNFROZE_MACHINE_SET: &str = "UnfrozeMachineSet";
    /// A deployment was frozen (this project's addition).
    pub const FROZE_MACHINE_DEPLOYMENT: &str = "FrozeMachineDeployment";
    /// A deployment was unfrozen (this project's addition).
    pub const UNFROZE_MACHINE_DEPLOYMENT: &str = "UnfrozeMachineDeployment";
}

/// `--safety-up` and `--safety-down`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Settings {
    /// Machines tolerated above the expected maximum (`--safety-up`, default 2).
    pub safety_up: u32,
    /// How far below the upper threshold a frozen set unfreezes (`--safety-down`, default 1; 0 acts as 1).
    pub safety_down: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            safety_up: DEFAULT_SAFETY_UP,
            safety_down: DEFAULT_SAFETY_DOWN,
        }
    }
}

/// When a set freezes and unfreezes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Thresholds {
    /// Frozen when the count is at least this.
    pub upper: i64,
    /// Unfrozen when the count is at most this (always below `upper`).
    pub lower: i64,
}

static NO_MAP: BTreeMap<String, String> = BTreeMap::new();

fn labels_of(meta: &ObjectMeta) -> &BTreeMap<String, String> {
    meta.labels.as_ref().unwrap_or(&NO_MAP)
}

fn name_of(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

fn namespace_of(meta: &ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or_default()
}

fn is_deleting(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some()
}

/// Whether the object carries the label `freeze=True` (the freeze itself; the condition only reports it).
pub fn is_frozen(meta: &ObjectMeta) -> bool {
    labels_of(meta).get(labels::FREEZE).map(String::as_str) == Some(FREEZE_VALUE)
}

/// Whether the object carries the manual unfreeze annotation (any value, as in the reference).
pub fn has_unfreeze_annotation(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(annotations::UNFREEZE))
}

/// Whether the set's `freeze` label and its `Frozen=True` condition disagree (an interrupted write, or another
/// writer's status patch that carried an old conditions list): a pass brings them in line.
pub fn set_out_of_line(set: &MachineSet) -> bool {
    let reported = set.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == MachineSetConditionType::Frozen && c.status == ConditionStatus::True)
    });
    is_frozen(&set.metadata) != reported
}

/// Whether the deployment's `freeze` label and its `Frozen=True` condition disagree (see [`set_out_of_line`]).
pub fn deployment_out_of_line(deployment: &MachineDeployment) -> bool {
    let reported = deployment.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == MachineDeploymentConditionType::Frozen && c.status == ConditionStatus::True)
    });
    is_frozen(&deployment.metadata) != reported
}

/// Whether `machine` counts for `set`: same namespace, the set's template labels all present with the same values,
/// and a controller owner reference of kind `MachineSet` naming the set. Machines being deleted count (see the
/// module documentation).
pub fn counts_for(set: &MachineSet, machine: &Machine) -> bool {
    if namespace_of(&machine.metadata) != namespace_of(&set.metadata) {
        return false;
    }
    let owned = machine.metadata.owner_references.iter().flatten().any(|r| {
        r.controller == Some(true) && r.kind == MACHINE_SET_KIND && r.name == name_of(&set.metadata)
    });
    if !owned {
        return false;
    }
    let machine_labels = labels_of(&machine.metadata);
    set.spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref())
        .unwrap_or(&NO_MAP)
        .iter()
        .all(|(k, v)| machine_labels.get(k) == Some(v))
}

/// How many of `machines` count for `set` ([`counts_for`]).
pub fn count<'a>(set: &MachineSet, machines: impl IntoIterator<Item = &'a Machine>) -> usize {
    machines.into_iter().filter(|m| counts_for(set, m)).count()
}

/// The deployment that controls `set`: its controller owner reference of kind `MachineDeployment`, found by name
/// in the set's namespace (and by uid when both the reference and the deployment have one, so that a deployment
/// recreated under the same name is not taken for the old one). A set without one is on its own.
pub fn owning_deployment<'a>(
    set: &MachineSet,
    deployments: impl IntoIterator<Item = &'a MachineDeployment>,
) -> Option<&'a MachineDeployment> {
    let owner = set
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true) && r.kind == MACHINE_DEPLOYMENT_KIND)?;
    deployments.into_iter().find(|d| {
        name_of(&d.metadata) == owner.name
            && namespace_of(&d.metadata) == namespace_of(&set.metadata)
            && (owner.uid.is_empty() || d.metadata.uid.as_deref().is_none_or(|uid| uid == owner.uid))
    })
}

/// The surge a deployment allows: `maxSurge` of `rollingUpdate`, else of `inPlaceUpdate`, against
/// `spec.replicas` (a percentage rounded up); 1 when neither sets it. `Err` carries the default used and why the
/// value is unusable.
pub fn surge(deployment: &MachineDeployment) -> Result<i64, (i64, String)> {
    let strategy = &deployment.spec.strategy;
    let value: Option<&IntOrString> = match (&strategy.rolling_update, &strategy.in_place_update) {
        (Some(rolling), _) => rolling.max_surge.as_ref(),
        (None, Some(in_place)) => in_place.max_surge.as_ref(),
        (None, None) => None,
    };
    let default = i64::from(DEFAULT_FENCEPOST);
    match value {
        None => Ok(default),
        Some(value) => scaled_value(value, deployment.spec.replicas.max(0), true)
            .map(|s| i64::from(s.max(0)))
            .map_err(|reason| (default, format!("maxSurge {value:?}: {reason}"))),
    }
}

/// The thresholds of `set` (with its owning deployment, if any), and a problem with the deployment's maxSurge if
/// the default had to be used (report it; the thresholds are usable).
pub fn thresholds(
    set: &MachineSet,
    deployment: Option<&MachineDeployment>,
    settings: Settings,
) -> (Thresholds, Option<String>) {
    let up = i64::from(settings.safety_up);
    let (upper, problem) = match deployment {
        None => (2 * i64::from(set.spec.replicas.max(0)) + up, None),
        Some(d) => {
            let (surge, problem) = match surge(d) {
                Ok(s) => (s, None),
                Err((s, why)) => (s, Some(why)),
            };
            (i64::from(d.spec.replicas.max(0)) + surge + up, problem)
        }
    };
    let lower = upper - i64::from(settings.safety_down.max(1));
    (Thresholds { upper, lower }, problem)
}

// ---------------------------------------------------------------------------------------------------------------------
// The plan
// ---------------------------------------------------------------------------------------------------------------------

/// What the safety controller looks at in one pass (the caches of one namespace).
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The machine sets.
    pub sets: &'a [&'a MachineSet],
    /// The machine deployments.
    pub deployments: &'a [&'a MachineDeployment],
    /// The machines.
    pub machines: &'a [&'a Machine],
    /// `--safety-up` and `--safety-down`.
    pub settings: Settings,
    /// Now: the `lastTransitionTime` of conditions set in this pass.
    pub now: Timestamp,
}

/// Why a set's freeze state changes in this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The count reached the upper threshold.
    Overshooting,
    /// The count fell to the lower threshold.
    BelowLowerThreshold,
    /// The unfreeze annotation on the set.
    AnnotationOnSet,
    /// The unfreeze annotation on the set's deployment (its name).
    AnnotationOnDeployment(String),
}

/// How one set stands (for logs and metrics; the writes are in [`Plan::writes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetEvaluation {
    /// The set's name.
    pub name: String,
    /// Its owning deployment's name.
    pub deployment: Option<String>,
    /// Counted machines ([`counts_for`]).
    pub machines: usize,
    /// Its thresholds.
    pub thresholds: Thresholds,
    /// An unusable maxSurge of its deployment (the default 1 was used).
    pub surge_problem: Option<String>,
    /// Frozen (label) before the pass.
    pub was_frozen: bool,
    /// Frozen after the pass.
    pub frozen: bool,
    /// Why the state changes; `None` when it does not.
    pub cause: Option<Cause>,
}

/// The kind of object a write is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    /// A MachineSet.
    MachineSet,
    /// A MachineDeployment.
    MachineDeployment,
}

impl ObjectKind {
    /// The kind's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MachineSet => MACHINE_SET_KIND,
            Self::MachineDeployment => MACHINE_DEPLOYMENT_KIND,
        }
    }
}

/// The freeze state an object must have after the pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// Label `freeze=True` and condition `Frozen=True` when true; neither when false.
    pub frozen: bool,
    /// The condition's reason when frozen (a Frozen=True condition already there is kept as it is); why it is
    /// unfrozen otherwise ([`reasons`]).
    pub reason: &'static str,
    /// The condition's message when frozen; the event's message.
    pub message: String,
    /// Remove the unfreeze annotation.
    pub remove_unfreeze_annotation: bool,
}

/// The patches that bring one object to a [`Desired`] state.
#[derive(Clone, Debug, Default, PartialEq)]
#[must_use]
pub struct ObjectPatches {
    /// JSON merge patch of the object: `{"metadata": {"labels": {"freeze": "True" | null}, "annotations":
    /// {"safety.machine.sapcloud.io/unfreeze": null}}}` (maps merge key by key: no precondition needed).
    pub metadata: Option<Value>,
    /// The change of the `Frozen` condition that `status` writes.
    pub condition: Option<ConditionChange>,
    /// JSON merge patch of the `status` subresource: the conditions list whole (a merge patch replaces lists), with
    /// the object's `metadata.resourceVersion`, so that a concurrent change answers 409 rather than being lost.
    pub status: Option<Value>,
    /// Apply `status` before `metadata` (unfreezing: the report goes first and the label, the freeze itself, last, so
    /// that an interrupted unfreeze leaves the label and is completed by the next pass); freezing applies the label
    /// first, then the condition (recompute `status` against the object the label write returned: its
    /// resourceVersion changed).
    pub status_first: bool,
    /// `Some(true)` when `metadata` adds the freeze label, `Some(false)` when it removes it.
    pub transition: Option<bool>,
}

impl ObjectPatches {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.metadata.is_none() && self.status.is_none()
    }
}

/// An Event to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEvent {
    /// Its reason ([`events`]).
    pub reason: &'static str,
    /// Its message.
    pub message: String,
}

/// One object to change.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    /// Set or deployment.
    pub kind: ObjectKind,
    /// Its name.
    pub name: String,
    /// The state it must have.
    pub desired: Desired,
    /// The patches against the object as the caches show it.
    pub patches: ObjectPatches,
    /// The event to record if the write changes the freeze label as the caches show it; `None` for a
    /// condition-only fix. A controller that re-reads the object records [`event_for`] the transition of the
    /// patches it actually applied instead.
    pub event: Option<PlannedEvent>,
    /// For a deployment: its sets. Skip the deployment's write when one of their writes failed, so that an unfreeze
    /// annotation is not removed before every set it unfreezes is unfrozen.
    pub after_sets: Vec<String>,
}

/// One pass of the safety controller: sets first (by name), then deployments (by name).
#[derive(Clone, Debug, Default, PartialEq)]
#[must_use]
pub struct Plan {
    /// Every set looked at, by name.
    pub evaluations: Vec<SetEvaluation>,
    /// The objects to change, in the order to write them.
    pub writes: Vec<Write>,
}

impl Plan {
    /// The events of the writes (what a pass records when every write changes what the caches showed).
    pub fn events(&self) -> impl Iterator<Item = (&Write, &PlannedEvent)> {
        self.writes
            .iter()
            .filter_map(|w| w.event.as_ref().map(|e| (w, e)))
    }
}

/// The event of a write of `kind` to `desired` whose patches change the freeze label (`transition`, see
/// [`ObjectPatches::transition`]); `None` when they do not (a condition-only fix or an annotation removal).
pub fn event_for(kind: ObjectKind, desired: &Desired, transition: Option<bool>) -> Option<PlannedEvent> {
    let frozen = transition?;
    let reason = match (kind, frozen) {
        (ObjectKind::MachineSet, true) => events::FROZE_MACHINE_SET,
        (ObjectKind::MachineSet, false) => events::UNFROZE_MACHINE_SET,
        (ObjectKind::MachineDeployment, true) => events::FROZE_MACHINE_DEPLOYMENT,
        (ObjectKind::MachineDeployment, false) => events::UNFROZE_MACHINE_DEPLOYMENT,
    };
    Some(PlannedEvent {
        reason,
        message: desired.message.clone(),
    })
}

fn overshoot_message(set: &str, count: usize, thresholds: Thresholds) -> String {
    format!(
        "The number of machines backing MachineSet {set} is {count} >= {upper}, which is the Max-ScaleUp-Limit \
         (it is unfrozen at {lower} or fewer)",
        upper = thresholds.upper,
        lower = thresholds.lower,
    )
}

fn held_message(set: &str, count: usize, thresholds: Thresholds) -> String {
    format!(
        "MachineSet {set} is frozen: {count} machines back it, more than {lower}, the count at which it is \
         unfrozen (it froze at {upper} or more)",
        upper = thresholds.upper,
        lower = thresholds.lower,
    )
}

fn evaluate(
    set: &MachineSet,
    deployment: Option<&MachineDeployment>,
    machines: &[&Machine],
    settings: Settings,
) -> SetEvaluation {
    let name = name_of(&set.metadata).to_owned();
    let machines = count(set, machines.iter().copied());
    let (thresholds, surge_problem) = thresholds(set, deployment, settings);
    let was_frozen = is_frozen(&set.metadata);
    let count = i64::try_from(machines).unwrap_or(i64::MAX);
    let (frozen, cause) = if has_unfreeze_annotation(&set.metadata) {
        (false, was_frozen.then_some(Cause::AnnotationOnSet))
    } else if let Some(d) = deployment.filter(|d| has_unfreeze_annotation(&d.metadata)) {
        (
            false,
            was_frozen.then(|| Cause::AnnotationOnDeployment(name_of(&d.metadata).to_owned())),
        )
    } else if count >= thresholds.upper {
        (true, (!was_frozen).then_some(Cause::Overshooting))
    } else if count <= thresholds.lower {
        (false, was_frozen.then_some(Cause::BelowLowerThreshold))
    } else {
        (was_frozen, None)
    };
    SetEvaluation {
        name,
        deployment: deployment.map(|d| name_of(&d.metadata).to_owned()),
        machines,
        thresholds,
        surge_problem,
        was_frozen,
        frozen,
        cause,
    }
}

fn set_desired(set: &MachineSet, eval: &SetEvaluation) -> Desired {
    let (reason, message) = if eval.frozen {
        let message = if i64::try_from(eval.machines).unwrap_or(i64::MAX) >= eval.thresholds.upper {
            overshoot_message(&eval.name, eval.machines, eval.thresholds)
        } else {
            held_message(&eval.name, eval.machines, eval.thresholds)
        };
        (reasons::OVERSHOOTING_REPLICA_COUNT, message)
    } else {
        match &eval.cause {
            Some(Cause::AnnotationOnSet) => (
                reasons::UNFREEZE_ANNOTATION,
                format!(
                    "MachineSet {} unfrozen by its annotation {}",
                    eval.name,
                    annotations::UNFREEZE
                ),
            ),
            Some(Cause::AnnotationOnDeployment(d)) => (
                reasons::UNFREEZE_ANNOTATION,
                format!(
                    "MachineSet {} unfrozen by the annotation {} of its MachineDeployment {d}",
                    eval.name,
                    annotations::UNFREEZE
                ),
            ),
            _ => (
                reasons::UNDERSHOOTING_REPLICA_COUNT,
                format!(
                    "The number of machines backing MachineSet {} is {} <= {}, the count at which it is unfrozen",
                    eval.name, eval.machines, eval.thresholds.lower
                ),
            ),
        }
    };
    Desired {
        frozen: eval.frozen,
        reason,
        message,
        remove_unfreeze_annotation: has_unfreeze_annotation(&set.metadata),
    }
}

fn deployment_desired(deployment: &MachineDeployment, sets: &[&SetEvaluation]) -> Desired {
    let name = name_of(&deployment.metadata);
    let frozen: Vec<&str> = sets
        .iter()
        .filter(|e| e.frozen)
        .map(|e| e.name.as_str())
        .collect();
    let remove_unfreeze_annotation = has_unfreeze_annotation(&deployment.metadata);
    if !frozen.is_empty() {
        let froze_now = sets.iter().find(|e| e.cause == Some(Cause::Overshooting));
        let (reason, message) = match froze_now {
            Some(e) => (
                reasons::OVERSHOOTING_REPLICA_COUNT,
                overshoot_message(&e.name, e.machines, e.thresholds),
            ),
            None => (
                reasons::MACHINE_DEPLOYMENT_STATE_SYNC,
                format!(
                    "MachineDeployment {name} was out of line with its machine sets; frozen because MachineSet(s) \
                     {} are frozen",
                    frozen.join(", ")
                ),
            ),
        };
        return Desired {
            frozen: true,
            reason,
            message,
            remove_unfreeze_annotation,
        };
    }
    let (reason, message) = if remove_unfreeze_annotation {
        (
            reasons::UNFREEZE_ANNOTATION,
            format!(
                "MachineDeployment {name} and its machine sets unfrozen by its annotation {}",
                annotations::UNFREEZE
            ),
        )
    } else if let Some(e) = sets.iter().find(|e| e.cause == Some(Cause::BelowLowerThreshold)) {
        (
            reasons::UNDERSHOOTING_REPLICA_COUNT,
            format!(
                "MachineDeployment {name} unfrozen: the number of machines backing MachineSet {} is {} <= {}",
                e.name, e.machines, e.thresholds.lower
            ),
        )
    } else {
        (
            reasons::MACHINE_DEPLOYMENT_STATE_SYNC,
            format!("MachineDeployment {name} unfrozen: none of its machine sets is frozen"),
        )
    };
    Desired {
        frozen: false,
        reason,
        message,
        remove_unfreeze_annotation,
    }
}

/// Decides one pass: every set (not being deleted) is evaluated, then every deployment (not being deleted) is
/// brought in line with its sets. See the module documentation for the rules.
pub fn plan(input: &Input<'_>) -> Plan {
    let mut sets: Vec<&MachineSet> = input
        .sets
        .iter()
        .copied()
        .filter(|s| !is_deleting(&s.metadata))
        .collect();
    sets.sort_by(|a, b| name_of(&a.metadata).cmp(name_of(&b.metadata)));
    let mut result = Plan::default();
    for set in &sets {
        let deployment = owning_deployment(set, input.deployments.iter().copied());
        let eval = evaluate(set, deployment, input.machines, input.settings);
        let desired = set_desired(set, &eval);
        let patches = set_patches(set, &desired, input.now);
        if !patches.is_empty() {
            let event = event_for(ObjectKind::MachineSet, &desired, patches.transition);
            result.writes.push(Write {
                kind: ObjectKind::MachineSet,
                name: eval.name.clone(),
                desired,
                patches,
                event,
                after_sets: Vec::new(),
            });
        }
        result.evaluations.push(eval);
    }
    let mut deployments: Vec<&MachineDeployment> = input
        .deployments
        .iter()
        .copied()
        .filter(|d| !is_deleting(&d.metadata))
        .collect();
    deployments.sort_by(|a, b| name_of(&a.metadata).cmp(name_of(&b.metadata)));
    for deployment in deployments {
        let name = name_of(&deployment.metadata);
        let of_it: Vec<&SetEvaluation> = result
            .evaluations
            .iter()
            .filter(|e| e.deployment.as_deref() == Some(name))
            .collect();
        let desired = deployment_desired(deployment, &of_it);
        let patches = deployment_patches(deployment, &desired, input.now);
        if patches.is_empty() {
            continue;
        }
        let event = event_for(ObjectKind::MachineDeployment, &desired, patches.transition);
        let after_sets = of_it.iter().map(|e| e.name.clone()).collect();
        result.writes.push(Write {
            kind: ObjectKind::MachineDeployment,
            name: name.to_owned(),
            desired,
            patches,
            event,
            after_sets,
        });
    }
    result
}

// ---------------------------------------------------------------------------------------------------------------------
// Patches
// ---------------------------------------------------------------------------------------------------------------------

/// The metadata merge patch and the label transition for `meta` to reach `desired`.
fn metadata_patch(meta: &ObjectMeta, desired: &Desired) -> (Option<Value>, Option<bool>) {
    let labelled = is_frozen(meta);
    let mut patch = Map::new();
    let mut transition = None;
    if desired.frozen && !labelled {
        patch.insert("labels".into(), json!({ labels::FREEZE: FREEZE_VALUE }));
        transition = Some(true);
    } else if !desired.frozen && labelled {
        patch.insert("labels".into(), json!({ labels::FREEZE: null }));
        transition = Some(false);
    }
    if desired.remove_unfreeze_annotation && has_unfreeze_annotation(meta) {
        patch.insert("annotations".into(), json!({ annotations::UNFREEZE: null }));
    }
    let patch = (!patch.is_empty()).then(|| json!({ "metadata": patch }));
    (patch, transition)
}

/// The status merge patch writing `conditions` (under `field`) whole, guarded by the object's resourceVersion.
fn status_patch<T: serde::Serialize>(meta: &ObjectMeta, field: &str, conditions: &[T]) -> Value {
    let list = if conditions.is_empty() {
        Value::Null
    } else {
        serde_json::to_value(conditions).unwrap_or(Value::Null)
    };
    let mut patch = Map::new();
    if let Some(rv) = &meta.resource_version {
        patch.insert("metadata".into(), json!({ "resourceVersion": rv }));
    }
    let mut status = Map::new();
    status.insert(field.to_owned(), list);
    patch.insert("status".into(), Value::Object(status));
    Value::Object(patch)
}

/// A change of the `Frozen` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConditionChange {
    /// Set `Frozen=True` with this reason and message (replacing a Frozen condition of another status).
    Set {
        /// The reason ([`reasons`]).
        reason: &'static str,
        /// The message.
        message: String,
    },
    /// Remove the `Frozen` condition.
    Remove,
}

/// What to do with the Frozen condition whose status is `existing` (`None`: there is none).
fn condition_change(existing: Option<ConditionStatus>, desired: &Desired) -> Option<ConditionChange> {
    match (desired.frozen, existing) {
        (true, Some(ConditionStatus::True)) | (false, None) => None,
        (true, _) => Some(ConditionChange::Set {
            reason: desired.reason,
            message: desired.message.clone(),
        }),
        (false, Some(_)) => Some(ConditionChange::Remove),
    }
}

/// The patches that bring `set` to `desired` (empty when it is there): the `freeze` label and the unfreeze
/// annotation in `metadata`, the `Frozen` condition in the status's `machineSetCondition` list (other conditions
/// kept; a Frozen=True condition kept as it is; `lastTransitionTime` = `now`).
pub fn set_patches(set: &MachineSet, desired: &Desired, now: Timestamp) -> ObjectPatches {
    let (metadata, transition) = metadata_patch(&set.metadata, desired);
    let current: &[MachineSetCondition] = set.status.as_ref().map_or(&[], |s| s.conditions.as_slice());
    let is_frozen_condition = |c: &MachineSetCondition| c.r#type == MachineSetConditionType::Frozen;
    let existing = current.iter().find(|c| is_frozen_condition(c)).map(|c| c.status);
    let condition = condition_change(existing, desired);
    let status = condition.as_ref().map(|change| {
        let mut conditions: Vec<MachineSetCondition> = current
            .iter()
            .filter(|c| !is_frozen_condition(c))
            .cloned()
            .collect();
        if let ConditionChange::Set { reason, message } = change {
            conditions.push(MachineSetCondition {
                r#type: MachineSetConditionType::Frozen,
                status: ConditionStatus::True,
                last_transition_time: Some(Time(now)),
                reason: (*reason).to_owned(),
                message: message.clone(),
            });
        }
        status_patch(&set.metadata, "machineSetCondition", &conditions)
    });
    ObjectPatches {
        metadata,
        condition,
        status,
        status_first: !desired.frozen,
        transition,
    }
}

/// The patches that bring `deployment` to `desired`, as [`set_patches`] (the status list is `conditions`, and the
/// condition's `lastUpdateTime` is `now` too).
pub fn deployment_patches(
    deployment: &MachineDeployment,
    desired: &Desired,
    now: Timestamp,
) -> ObjectPatches {
    let (metadata, transition) = metadata_patch(&deployment.metadata, desired);
    let current: &[MachineDeploymentCondition] = deployment
        .status
        .as_ref()
        .map_or(&[], |s| s.conditions.as_slice());
    let is_frozen_condition =
        |c: &MachineDeploymentCondition| c.r#type == MachineDeploymentConditionType::Frozen;
    let existing = current.iter().find(|c| is_frozen_condition(c)).map(|c| c.status);
    let condition = condition_change(existing, desired);
    let status = condition.as_ref().map(|change| {
        let mut conditions: Vec<MachineDeploymentCondition> = current
            .iter()
            .filter(|c| !is_frozen_condition(c))
            .cloned()
            .collect();
        if let ConditionChange::Set { reason, message } = change {
            conditions.push(MachineDeploymentCondition {
                r#type: MachineDeploymentConditionType::Frozen,
                status: ConditionStatus::True,
                last_update_time: Some(Time(now)),
                last_transition_time: Some(Time(now)),
                reason: (*reason).to_owned(),
                message: message.clone(),
            });
        }
        status_patch(&deployment.metadata, "conditions", &conditions)
    });
    ObjectPatches {
        metadata,
        condition,
        status,
        status_first: !desired.frozen,
        transition,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    const NS: &str = "default";

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn owner(kind: &str, name: &str, uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: mcm_api::API_VERSION.into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: None,
        }
    }

    fn set(name: &str, replicas: i32) -> MachineSet {
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": NS, "uid": format!("uid-{name}"), "resourceVersion": "7" },
            "spec": {
                "replicas": replicas,
                "selector": { "matchLabels": { "pool": name } },
                "template": { "metadata": { "labels": { "pool": name } } }
            }
        }))
        .unwrap()
    }

    fn owned_set(name: &str, replicas: i32, deployment: &str) -> MachineSet {
        let mut s = set(name, replicas);
        s.metadata.owner_references = Some(vec![owner(
            MACHINE_DEPLOYMENT_KIND,
            deployment,
            &format!("uid-{deployment}"),
            true,
        )]);
        s
    }

    fn deployment(name: &str, replicas: i32, max_surge: Option<Value>) -> MachineDeployment {
        let mut value = json!({
            "metadata": { "name": name, "namespace": NS, "uid": format!("uid-{name}"), "resourceVersion": "9" },
            "spec": { "replicas": replicas }
        });
        if let Some(surge) = max_surge {
            value["spec"]["strategy"] =
                json!({ "type": "RollingUpdate", "rollingUpdate": { "maxSurge": surge } });
        }
        serde_json::from_value(value).unwrap()
    }

    fn machines_of(set: &MachineSet, n: usize) -> Vec<Machine> {
        let name = name_of(&set.metadata);
        (0..n)
            .map(|i| {
                let mut m = Machine::default();
                m.metadata.name = Some(format!("{name}-{i}"));
                m.metadata.namespace = Some(NS.into());
                m.metadata.labels = Some(BTreeMap::from([("pool".into(), name.into())]));
                m.metadata.owner_references = Some(vec![owner(MACHINE_SET_KIND, name, "x", true)]);
                m
            })
            .collect()
    }

    fn freeze_label(meta: &mut ObjectMeta) {
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::FREEZE.into(), FREEZE_VALUE.into());
    }

    fn annotate_unfreeze(meta: &mut ObjectMeta) {
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(annotations::UNFREEZE.into(), "True".into());
    }

    fn frozen_set_condition(set: &mut MachineSet) {
        set.status
            .get_or_insert_default()
            .conditions
            .push(MachineSetCondition {
                r#type: MachineSetConditionType::Frozen,
                status: ConditionStatus::True,
                last_transition_time: None,
                reason: reasons::OVERSHOOTING_REPLICA_COUNT.into(),
                message: "old".into(),
            });
    }

    fn run(sets: &[&MachineSet], deployments: &[&MachineDeployment], machines: &[Machine]) -> Plan {
        run_with(sets, deployments, machines, Settings::default())
    }

    fn run_with(
        sets: &[&MachineSet],
        deployments: &[&MachineDeployment],
        machines: &[Machine],
        settings: Settings,
    ) -> Plan {
        let machines: Vec<&Machine> = machines.iter().collect();
        plan(&Input {
            sets,
            deployments,
            machines: &machines,
            settings,
            now: at(1000),
        })
    }

    fn write<'a>(plan: &'a Plan, kind: ObjectKind, name: &str) -> Option<&'a Write> {
        plan.writes.iter().find(|w| w.kind == kind && w.name == name)
    }

    type Change = Box<dyn Fn(&mut Machine)>;

    // --- counting -----------------------------------------------------------------------------------------------

    #[test]
    fn counting_needs_the_template_labels_and_the_controller_reference_by_name() {
        let s = set("a", 1);
        let base = machines_of(&s, 1).remove(0);
        let cases: Vec<(&str, Change, bool)> = vec![
            ("as made by the set", Box::new(|_| {}), true),
            (
                "being deleted still counts",
                Box::new(|m| {
                    m.metadata.deletion_timestamp = Some(Time(at(1)));
                }),
                true,
            ),
            (
                "an extra label does not matter",
                Box::new(|m| {
                    m.metadata.labels.as_mut().unwrap().insert("x".into(), "y".into());
                }),
                true,
            ),
            (
                "the uid is not compared (reference: by name)",
                Box::new(|m| m.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into()),
                true,
            ),
            (
                "a template label missing",
                Box::new(|m| m.metadata.labels = None),
                false,
            ),
            (
                "a template label with another value",
                Box::new(|m| {
                    m.metadata
                        .labels
                        .as_mut()
                        .unwrap()
                        .insert("pool".into(), "b".into());
                }),
                false,
            ),
            (
                "another set's",
                Box::new(|m| m.metadata.owner_references.as_mut().unwrap()[0].name = "b".into()),
                false,
            ),
            (
                "a reference that is not the controller",
                Box::new(|m| m.metadata.owner_references.as_mut().unwrap()[0].controller = Some(false)),
                false,
            ),
            (
                "a controller of another kind with the set's name",
                Box::new(|m| {
                    m.metadata.owner_references.as_mut().unwrap()[0].kind = MACHINE_DEPLOYMENT_KIND.into();
                }),
                false,
            ),
            (
                "an orphan",
                Box::new(|m| m.metadata.owner_references = None),
                false,
            ),
            (
                "another namespace",
                Box::new(|m| m.metadata.namespace = Some("other".into())),
                false,
            ),
        ];
        for (what, change, expected) in cases {
            let mut m = base.clone();
            change(&mut m);
            assert_eq!(counts_for(&s, &m), expected, "{what}");
        }
    }

    // --- thresholds ---------------------------------------------------------------------------------------------

    #[test]
    fn thresholds_of_a_set_alone_and_of_a_deployment_set() {
        let settings = Settings::default();
        let cases: Vec<(&str, Option<MachineDeployment>, i32, i64, bool)> = vec![
            ("alone: 2*3+2", None, 3, 8, false),
            ("alone with 0 replicas", None, 0, 2, false),
            ("alone with negative replicas", None, -4, 2, false),
            (
                "deployment, maxSurge 1: 5+1+2",
                Some(deployment("d", 5, Some(json!(1)))),
                1,
                8,
                false,
            ),
            (
                "deployment, maxSurge 3",
                Some(deployment("d", 5, Some(json!(3)))),
                1,
                10,
                false,
            ),
            (
                "deployment, maxSurge 25% of 5 rounds up to 2",
                Some(deployment("d", 5, Some(json!("25%")))),
                1,
                9,
                false,
            ),
            (
                "deployment, maxSurge 0",
                Some(deployment("d", 5, Some(json!(0)))),
                1,
                7,
                false,
            ),
            (
                "deployment without a strategy: surge 1",
                Some(deployment("d", 5, None)),
                1,
                8,
                false,
            ),
            (
                "deployment, unusable maxSurge: surge 1, reported",
                Some(deployment("d", 5, Some(json!("x%")))),
                1,
                8,
                true,
            ),
        ];
        for (what, d, replicas, upper, problem) in cases {
            let (t, p) = thresholds(&set("a", replicas), d.as_ref(), settings);
            assert_eq!(
                (t.upper, t.lower, p.is_some()),
                (upper, upper - 1, problem),
                "{what}"
            );
        }
    }

    #[test]
    fn in_place_max_surge_is_used_without_rolling_update() {
        let d: MachineDeployment = serde_json::from_value(json!({
            "metadata": { "name": "d" },
            "spec": { "replicas": 4, "strategy": { "type": "InPlaceUpdate", "inPlaceUpdate": { "maxSurge": 3 } } }
        }))
        .unwrap();
        assert_eq!(surge(&d), Ok(3));
    }

    #[test]
    fn safety_settings_move_the_thresholds_and_safety_down_zero_acts_as_one() {
        let s = set("a", 2);
        let (t, _) = thresholds(
            &s,
            None,
            Settings {
                safety_up: 5,
                safety_down: 3,
            },
        );
        assert_eq!(t, Thresholds { upper: 9, lower: 6 });
        let (t, _) = thresholds(
            &s,
            None,
            Settings {
                safety_up: 0,
                safety_down: 0,
            },
        );
        assert_eq!(t, Thresholds { upper: 4, lower: 3 });
    }

    // --- sets -----------------------------------------------------------------------------------------------------

    #[test]
    fn a_set_at_its_upper_threshold_is_frozen_with_label_condition_and_event() {
        let s = set("a", 2);
        let plan = run(&[&s], &[], &machines_of(&s, 6));
        assert_eq!(plan.evaluations[0].cause, Some(Cause::Overshooting));
        let w = write(&plan, ObjectKind::MachineSet, "a").expect("a write");
        assert_eq!(
            w.patches.metadata,
            Some(json!({ "metadata": { "labels": { "freeze": "True" } } }))
        );
        assert!(!w.patches.status_first, "the label first");
        assert_eq!(w.patches.transition, Some(true));
        let status = w.patches.status.as_ref().unwrap();
        assert_eq!(status["metadata"]["resourceVersion"], "7");
        let condition = &status["status"]["machineSetCondition"][0];
        assert_eq!(condition["type"], "Frozen");
        assert_eq!(condition["status"], "True");
        assert_eq!(condition["reason"], "OverShootingReplicaCount");
        let message = condition["message"].as_str().unwrap();
        assert!(message.contains(" 6 >= 6"), "{message}");
        assert_eq!(condition["lastTransitionTime"], "1970-01-01T00:16:40Z");
        let event = w.event.as_ref().unwrap();
        assert_eq!(event.reason, "FrozeMachineSet");
        assert_eq!(event.message, message);
    }

    #[test]
    fn below_the_upper_threshold_nothing_is_written() {
        let s = set("a", 2);
        let plan = run(&[&s], &[], &machines_of(&s, 5));
        assert!(plan.writes.is_empty());
        assert_eq!(plan.evaluations[0].machines, 5);
        assert!(!plan.evaluations[0].frozen);
    }

    #[test]
    fn a_frozen_set_stays_frozen_between_the_thresholds_and_unfreezes_at_the_lower_one() {
        let settings = Settings {
            safety_up: 2,
            safety_down: 3,
        }; // upper 6, lower 3
        let mut s = set("a", 2);
        freeze_label(&mut s.metadata);
        frozen_set_condition(&mut s);
        for count in [4, 5, 6, 9] {
            let plan = run_with(&[&s], &[], &machines_of(&s, count), settings);
            assert!(plan.writes.is_empty(), "count {count}: {plan:?}");
            assert!(plan.evaluations[0].frozen);
        }
        let plan = run_with(&[&s], &[], &machines_of(&s, 3), settings);
        assert_eq!(plan.evaluations[0].cause, Some(Cause::BelowLowerThreshold));
        let w = write(&plan, ObjectKind::MachineSet, "a").unwrap();
        assert_eq!(
            w.patches.metadata,
            Some(json!({ "metadata": { "labels": { "freeze": null } } }))
        );
        assert_eq!(
            w.patches.status,
            Some(
                json!({ "metadata": { "resourceVersion": "7" }, "status": { "machineSetCondition": null } })
            )
        );
        assert!(w.patches.status_first, "the report first, the label last");
        assert_eq!(w.event.as_ref().unwrap().reason, "UnfrozeMachineSet");
    }

    #[test]
    fn an_unfrozen_set_between_the_thresholds_stays_unfrozen() {
        let settings = Settings {
            safety_up: 2,
            safety_down: 3,
        };
        let s = set("a", 2);
        let plan = run_with(&[&s], &[], &machines_of(&s, 5), settings);
        assert!(plan.writes.is_empty());
    }

    #[test]
    fn other_conditions_are_kept_and_an_existing_frozen_condition_is_not_rewritten() {
        let mut s = set("a", 2);
        s.status
            .get_or_insert_default()
            .conditions
            .push(MachineSetCondition {
                r#type: MachineSetConditionType::ReplicaFailure,
                status: ConditionStatus::True,
                last_transition_time: None,
                reason: "FailedCreate".into(),
                message: "quota".into(),
            });
        let plan = run(&[&s], &[], &machines_of(&s, 7));
        let status = write(&plan, ObjectKind::MachineSet, "a")
            .unwrap()
            .patches
            .status
            .clone()
            .unwrap();
        let list = status["status"]["machineSetCondition"].as_array().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0]["type"], "ReplicaFailure");
        assert_eq!(list[1]["type"], "Frozen");

        // Frozen and reported: a higher count writes nothing (the message is not refreshed).
        freeze_label(&mut s.metadata);
        frozen_set_condition(&mut s);
        assert!(run(&[&s], &[], &machines_of(&s, 9)).writes.is_empty());
    }

    #[test]
    fn label_and_condition_are_brought_in_line() {
        // The label without the condition (an interrupted freeze, or a condition lost to another writer): the
        // condition is added, without an event.
        let mut labelled = set("a", 2);
        freeze_label(&mut labelled.metadata);
        let plan = run(&[&labelled], &[], &machines_of(&labelled, 6));
        let w = write(&plan, ObjectKind::MachineSet, "a").unwrap();
        assert_eq!(w.patches.metadata, None);
        assert!(w.patches.status.is_some());
        assert_eq!(w.event, None);

        // A condition False (written by someone else) is replaced by True.
        let mut other = set("a", 2);
        freeze_label(&mut other.metadata);
        frozen_set_condition(&mut other);
        other.status.as_mut().unwrap().conditions[0].status = ConditionStatus::False;
        let plan = run(&[&other], &[], &machines_of(&other, 6));
        let status = write(&plan, ObjectKind::MachineSet, "a")
            .unwrap()
            .patches
            .status
            .clone()
            .unwrap();
        assert_eq!(status["status"]["machineSetCondition"][0]["status"], "True");

        // The condition without the label, below the upper threshold: not frozen, so the condition goes.
        let mut reported = set("a", 2);
        frozen_set_condition(&mut reported);
        let plan = run(&[&reported], &[], &machines_of(&reported, 2));
        let w = write(&plan, ObjectKind::MachineSet, "a").unwrap();
        assert_eq!(w.patches.metadata, None);
        assert!(w.patches.status.is_some());
        assert_eq!(w.event, None);

        // A freeze label of another value is not the freeze: left alone.
        let mut other_value = set("a", 2);
        other_value
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::FREEZE.into(), "False".into());
        assert!(
            run(&[&other_value], &[], &machines_of(&other_value, 2))
                .writes
                .is_empty()
        );
    }

    #[test]
    fn label_and_condition_out_of_line_are_told() {
        let mut s = set("a", 1);
        assert!(!set_out_of_line(&s));
        freeze_label(&mut s.metadata);
        assert!(set_out_of_line(&s));
        frozen_set_condition(&mut s);
        assert!(!set_out_of_line(&s));
        s.metadata.labels = None;
        assert!(set_out_of_line(&s));

        let mut d = deployment("d", 1, None);
        assert!(!deployment_out_of_line(&d));
        freeze_label(&mut d.metadata);
        assert!(deployment_out_of_line(&d));
    }

    #[test]
    fn the_unfreeze_annotation_unfreezes_at_once_and_is_removed() {
        let mut s = set("a", 2);
        freeze_label(&mut s.metadata);
        frozen_set_condition(&mut s);
        annotate_unfreeze(&mut s.metadata);
        // Even far over the threshold: the annotation wins in this pass.
        let plan = run(&[&s], &[], &machines_of(&s, 20));
        assert_eq!(plan.evaluations[0].cause, Some(Cause::AnnotationOnSet));
        let w = write(&plan, ObjectKind::MachineSet, "a").unwrap();
        assert_eq!(
            w.patches.metadata,
            Some(json!({ "metadata": {
                "labels": { "freeze": null },
                "annotations": { "safety.machine.sapcloud.io/unfreeze": null }
            } }))
        );
        assert!(w.patches.status.is_some());
        assert_eq!(w.desired.reason, reasons::UNFREEZE_ANNOTATION);
        assert_eq!(w.event.as_ref().unwrap().reason, "UnfrozeMachineSet");

        // On a set that is not frozen, the annotation is only removed, without an event.
        let mut idle = set("b", 2);
        annotate_unfreeze(&mut idle.metadata);
        let plan = run(&[&idle], &[], &[]);
        let w = write(&plan, ObjectKind::MachineSet, "b").unwrap();
        assert_eq!(
            w.patches.metadata,
            Some(json!({ "metadata": { "annotations": { "safety.machine.sapcloud.io/unfreeze": null } } }))
        );
        assert_eq!((w.patches.status.clone(), w.event.clone()), (None, None));
    }

    #[test]
    fn every_overshooting_set_is_frozen_in_the_same_pass() {
        let sets: Vec<MachineSet> = ["a", "b", "c"].iter().map(|n| set(n, 1)).collect();
        let mut machines = machines_of(&sets[0], 4);
        machines.extend(machines_of(&sets[1], 9));
        machines.extend(machines_of(&sets[2], 3));
        let refs: Vec<&MachineSet> = sets.iter().collect();
        let plan = run(&refs, &[], &machines);
        let frozen: Vec<&str> = plan
            .events()
            .filter(|(_, e)| e.reason == events::FROZE_MACHINE_SET)
            .map(|(w, _)| w.name.as_str())
            .collect();
        assert_eq!(frozen, ["a", "b"]);
    }

    #[test]
    fn sets_being_deleted_are_left_alone() {
        let mut s = set("a", 1);
        s.metadata.deletion_timestamp = Some(Time(at(1)));
        let plan = run(&[&s], &[], &machines_of(&s, 10));
        assert!(plan.writes.is_empty());
        assert!(plan.evaluations.is_empty());
    }

    // --- deployments ------------------------------------------------------------------------------------------------

    #[test]
    fn a_freeze_propagates_to_the_deployment_with_the_sets_reason() {
        let d = deployment("d", 2, Some(json!(1))); // upper 5
        let s = owned_set("d-1", 2, "d");
        let plan = run(&[&s], &[&d], &machines_of(&s, 5));
        assert_eq!(plan.evaluations[0].deployment.as_deref(), Some("d"));
        assert_eq!(plan.evaluations[0].thresholds.upper, 5);
        let names: Vec<(ObjectKind, &str)> = plan.writes.iter().map(|w| (w.kind, w.name.as_str())).collect();
        assert_eq!(
            names,
            [
                (ObjectKind::MachineSet, "d-1"),
                (ObjectKind::MachineDeployment, "d")
            ],
            "sets first"
        );
        let w = write(&plan, ObjectKind::MachineDeployment, "d").unwrap();
        assert_eq!(w.after_sets, ["d-1"]);
        assert_eq!(
            w.patches.metadata,
            Some(json!({ "metadata": { "labels": { "freeze": "True" } } }))
        );
        let status = w.patches.status.clone().unwrap();
        assert_eq!(status["metadata"]["resourceVersion"], "9");
        let condition = &status["status"]["conditions"][0];
        assert_eq!(condition["type"], "Frozen");
        assert_eq!(condition["reason"], "OverShootingReplicaCount");
        assert!(
            condition["message"]
                .as_str()
                .unwrap()
                .contains("MachineSet d-1 is 5 >= 5")
        );
        assert!(condition.get("lastUpdateTime").is_some());
        assert_eq!(w.event.as_ref().unwrap().reason, "FrozeMachineDeployment");
    }

    #[test]
    fn a_deployment_out_of_line_is_aligned_with_state_sync() {
        // Its set is frozen (and stays frozen between the thresholds), the deployment is not.
        let d = deployment("d", 2, Some(json!(1)));
        let mut s = owned_set("d-1", 2, "d");
        freeze_label(&mut s.metadata);
        frozen_set_condition(&mut s);
        let settings = Settings {
            safety_up: 2,
            safety_down: 3,
        }; // upper 5, lower 2
        let plan = run_with(&[&s], &[&d], &machines_of(&s, 4), settings);
        let w = write(&plan, ObjectKind::MachineDeployment, "d").unwrap();
        assert_eq!(w.desired.reason, reasons::MACHINE_DEPLOYMENT_STATE_SYNC);
        assert_eq!(
            w.patches.status.as_ref().unwrap()["status"]["conditions"][0]["reason"],
            "MachineDeploymentStateSync"
        );
        assert!(write(&plan, ObjectKind::MachineSet, "d-1").is_none());

        // A frozen deployment none of whose sets is frozen is unfrozen.
        let mut frozen_d = deployment("d", 2, Some(json!(1)));
        freeze_label(&mut frozen_d.metadata);
        let calm = owned_set("d-1", 2, "d");
        let plan = run(&[&calm], &[&frozen_d], &machines_of(&calm, 2));
        let w = write(&plan, ObjectKind::MachineDeployment, "d").unwrap();
        assert_eq!(
            w.patches.metadata,
            Some(json!({ "metadata": { "labels": { "freeze": null } } }))
        );
        assert_eq!(w.desired.reason, reasons::MACHINE_DEPLOYMENT_STATE_SYNC);
        assert_eq!(w.event.as_ref().unwrap().reason, "UnfrozeMachineDeployment");

        // A deployment without sets that carries the label is unfrozen too.
        let plan = run(&[], &[&frozen_d], &[]);
        assert!(write(&plan, ObjectKind::MachineDeployment, "d").is_some());
    }

    #[test]
    fn a_deployment_stays_frozen_while_any_of_its_sets_is() {
        let mut d = deployment("d", 2, Some(json!(1)));
        freeze_label(&mut d.metadata);
        d.status
            .get_or_insert_default()
            .conditions
            .push(MachineDeploymentCondition {
                r#type: MachineDeploymentConditionType::Frozen,
                status: ConditionStatus::True,
                last_update_time: None,
                last_transition_time: None,
                reason: reasons::OVERSHOOTING_REPLICA_COUNT.into(),
                message: "m".into(),
            });
        let mut old = owned_set("d-old", 0, "d");
        freeze_label(&mut old.metadata);
        frozen_set_condition(&mut old);
        let mut new = owned_set("d-new", 2, "d");
        freeze_label(&mut new.metadata);
        frozen_set_condition(&mut new);
        let mut machines = machines_of(&old, 6);
        machines.extend(machines_of(&new, 1));
        // d-new unfreezes (1 <= 4), d-old stays frozen (6 >= 5): the deployment stays frozen, untouched.
        let plan = run(&[&old, &new], &[&d], &machines);
        assert!(write(&plan, ObjectKind::MachineSet, "d-new").is_some());
        assert!(write(&plan, ObjectKind::MachineSet, "d-old").is_none());
        assert!(write(&plan, ObjectKind::MachineDeployment, "d").is_none());
    }

    #[test]
    fn the_unfreeze_annotation_on_a_deployment_unfreezes_it_and_all_its_sets() {
        let mut d = deployment("d", 2, Some(json!(1)));
        freeze_label(&mut d.metadata);
        annotate_unfreeze(&mut d.metadata);
        let mut a = owned_set("d-a", 2, "d");
        freeze_label(&mut a.metadata);
        let mut b = owned_set("d-b", 0, "d");
        freeze_label(&mut b.metadata);
        let mut machines = machines_of(&a, 8);
        machines.extend(machines_of(&b, 8));
        let plan = run(&[&a, &b], &[&d], &machines);
        for name in ["d-a", "d-b"] {
            let w = write(&plan, ObjectKind::MachineSet, name).unwrap();
            assert_eq!(
                w.patches.metadata,
                Some(json!({ "metadata": { "labels": { "freeze": null } } }))
            );
            assert_eq!(w.desired.reason, reasons::UNFREEZE_ANNOTATION);
            assert_eq!(w.event.as_ref().unwrap().reason, "UnfrozeMachineSet");
        }
        let w = write(&plan, ObjectKind::MachineDeployment, "d").unwrap();
        assert_eq!(
            w.patches.metadata,
            Some(json!({ "metadata": {
                "labels": { "freeze": null },
                "annotations": { "safety.machine.sapcloud.io/unfreeze": null }
            } }))
        );
        assert_eq!(w.after_sets, ["d-a", "d-b"]);
    }

    #[test]
    fn ownership_needs_the_controller_reference_and_a_matching_uid() {
        let d = deployment("d", 2, None);
        let mut s = owned_set("s", 1, "d");
        assert!(owning_deployment(&s, [&d]).is_some());
        s.metadata.owner_references.as_mut().unwrap()[0].uid = "stale".into();
        assert!(owning_deployment(&s, [&d]).is_none());
        s.metadata.owner_references.as_mut().unwrap()[0].uid = String::new();
        assert!(owning_deployment(&s, [&d]).is_some());
        s.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        assert!(owning_deployment(&s, [&d]).is_none());
    }

    // --- properties -------------------------------------------------------------------------------------------------

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
            s.conditions.iter().any(|c| {
                c.r#type == MachineDeploymentConditionType::Frozen && c.status == ConditionStatus::True
            })
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
}
