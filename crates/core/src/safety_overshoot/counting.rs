//! What counts: the settings, the freeze label and annotation, the machines that count for a set, its owning deployment,
//! the deployment's surge and the thresholds that follow.
//!
//! Separate because it is observation: it reads objects and decides nothing.

use k8s_openapi::Resource as _;
use k8s_openapi::apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString};
use mcm_api::{
    ConditionStatus, Machine, MachineDeployment, MachineDeploymentConditionType, MachineSet,
    MachineSetConditionType, MetaExt,
    keys::{annotations, labels},
};

use super::{
    DEFAULT_SAFETY_DOWN, DEFAULT_SAFETY_UP,
    common::{NO_MAP, labels_of, name_of, namespace_of},
};
use crate::{
    machineset::FREEZE_VALUE,
    rollout::{DEFAULT_FENCEPOST, scaled_value},
};

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

/// Whether the object carries the label `freeze=True` (the freeze itself; the condition only reports it).
pub fn is_frozen(meta: &ObjectMeta) -> bool {
    meta.label(labels::FREEZE) == Some(FREEZE_VALUE)
}

/// Whether the object carries the manual unfreeze annotation (any value, as in the reference).
pub fn has_unfreeze_annotation(meta: &ObjectMeta) -> bool {
    meta.annotation(annotations::UNFREEZE).is_some()
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
    let owned = machine
        .controller_refs()
        .any(|r| r.kind == MachineSet::KIND && r.name == name_of(&set.metadata));
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
    let owner = set.controller_ref_of_kind(MachineDeployment::KIND)?;
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
