//! The new set kept in line with its deployment: copied annotations and the patch that syncs it without a new set.
//!
//! Separate because it patches the set's template and annotations in place; the arithmetic only moves replicas.

use std::collections::BTreeMap;

use mcm_api::{MachineDeployment, MachineSet, MachineTemplateSpec, keys::annotations};
use serde_json::Value;

use super::history::revision;

/// Deployment annotations not handed down to its sets (the reference's skip list): kubectl's last-applied
/// configuration, the replica and revision bookkeeping, the PreferNoSchedule mark, the manual unfreeze and the
/// autoscaler's trigger list (which names machines, not sets).
pub const NOT_COPIED_ANNOTATIONS: [&str; 8] = [
    "kubectl.kubernetes.io/last-applied-configuration",
    annotations::REVISION,
    annotations::REVISION_HISTORY,
    annotations::DESIRED_REPLICAS,
    annotations::MAX_REPLICAS,
    annotations::PREFER_NO_SCHEDULE,
    annotations::UNFREEZE,
    annotations::TRIGGER_DELETION_BY_MCM,
];

/// The annotations a set of `deployment` carries from it (Kubernetes' `copyDeploymentAnnotationsToReplicaSet`: all
/// but [`NOT_COPIED_ANNOTATIONS`]).
pub fn copied_annotations(deployment: &MachineDeployment) -> BTreeMap<String, String> {
    deployment
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !NOT_COPIED_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The merge patch that keeps the deployment's new set in line without a rollout (the reference's
/// `getNewMachineSet` on an existing set): the [`copied_annotations`] added or overwritten (and the effective creation
/// timeout removed when the deployment dropped it), `revision` when the set's is lower (a set reused by a rollback
/// becomes the newest revision), no PreferNoSchedule mark, and the template's `nodeTemplate`, machine configuration
/// and `class.kind` — the parts [`equal_ignore_hash`](super::equal_ignore_hash) ignores, which the set controller then hands to the existing
/// machines — and `autoPreserveFailedMachineMax`. `None` when the set is already in line.
pub fn new_set_sync(deployment: &MachineDeployment, set: &MachineSet, revision: i64) -> Option<Value> {
    let theirs = set.metadata.annotations.clone().unwrap_or_default();
    let mut wanted = copied_annotations(deployment);
    if self::revision(set).is_none_or(|r| r < revision) {
        wanted.insert(annotations::REVISION.to_owned(), revision.to_string());
    }
    let mut changes = serde_json::Map::new();
    for (key, value) in wanted {
        if theirs.get(&key) != Some(&value) {
            changes.insert(key, Value::String(value));
        }
    }
    for gone in [
        annotations::EFFECTIVE_CREATION_TIMEOUT,
        annotations::PREFER_NO_SCHEDULE,
    ] {
        let dropped = gone == annotations::PREFER_NO_SCHEDULE
            || deployment
                .metadata
                .annotations
                .as_ref()
                .is_none_or(|a| !a.contains_key(gone));
        if dropped && theirs.contains_key(gone) {
            changes.insert(gone.to_owned(), Value::Null);
        }
    }
    let view = |template: &MachineTemplateSpec| {
        let spec = &template.spec;
        let mut view = match serde_json::to_value(&spec.configuration) {
            Ok(Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        if let Some(node_template) = &spec.node_template {
            view.insert(
                "nodeTemplate".into(),
                serde_json::to_value(node_template).unwrap_or(Value::Null),
            );
        }
        view.insert("class".into(), serde_json::json!({ "kind": spec.class.kind }));
        Value::Object(view)
    };
    let template_spec =
        crate::machineset::merge_diff(&view(&set.spec.template), &view(&deployment.spec.template));
    let mut patch = serde_json::Map::new();
    if !changes.is_empty() {
        patch.insert("metadata".into(), serde_json::json!({ "annotations": changes }));
    }
    if let Some(spec) = template_spec {
        patch.insert("spec".into(), serde_json::json!({ "template": { "spec": spec } }));
    }
    // `autoPreserveFailedMachineMax` reaches the new set without a rollout (reference `getNewMachineSet`).
    if set.spec.auto_preserve_failed_machine_max != deployment.spec.auto_preserve_failed_machine_max {
        let spec = patch.entry("spec").or_insert_with(|| serde_json::json!({}));
        spec["autoPreserveFailedMachineMax"] =
            serde_json::json!(deployment.spec.auto_preserve_failed_machine_max);
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}
