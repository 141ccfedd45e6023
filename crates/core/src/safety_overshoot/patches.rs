//! The metadata and status patches that bring a set or a deployment to its desired freeze state.
//!
//! Separate because they are the wire form of the plan, written only where something changes.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use mcm_api::{
    ConditionStatus, MachineDeployment, MachineDeploymentCondition, MachineDeploymentConditionType,
    MachineSet, MachineSetCondition, MachineSetConditionType,
    keys::{annotations, labels},
};
use serde_json::{Map, Value, json};

use super::{
    counting::{has_unfreeze_annotation, is_frozen},
    plan::{Desired, ObjectPatches},
};
use crate::machineset::FREEZE_VALUE;

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
        /// The reason ([`reasons`](super::reasons)).
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
