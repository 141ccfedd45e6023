//! [`plan`]: which sets and deployments to freeze or unfreeze in a pass, with their conditions and events.
//!
//! Separate from the patches because it decides the desired state; [`super::set_patches`] and
//! [`super::deployment_patches`] only write it.

use jiff::Timestamp;
use k8s_openapi::Resource as _;
use mcm_api::{Machine, MachineDeployment, MachineSet, MetaExt, keys::annotations};
use serde_json::Value;

use super::{
    common::name_of,
    counting::{
        Settings, Thresholds, count, has_unfreeze_annotation, is_frozen, owning_deployment, thresholds,
    },
    events,
    patches::{ConditionChange, deployment_patches, set_patches},
    reasons,
};

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
    /// Counted machines ([`counts_for`](super::counts_for)).
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
            Self::MachineSet => MachineSet::KIND,
            Self::MachineDeployment => MachineDeployment::KIND,
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
    let mut sets: Vec<&MachineSet> = input.sets.iter().copied().filter(|s| !s.is_deleting()).collect();
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
        .filter(|d| !d.is_deleting())
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
