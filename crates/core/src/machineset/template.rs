//! The machine a set creates and the patch that propagates the set's template to the machines it already has.
//!
//! Separate because it is about the template, not about how many machines there are.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mcm_api::{
    GoDuration, Machine, MachineConfiguration, MachineSet, MetaExt,
    keys::{annotations, finalizers},
};
use serde_json::{Map, Value, json};

use super::ownership::owner_reference;

/// The effective creation timeout the set hands to its machines: the set's
/// `node.machine.sapcloud.io/effective-creation-timeout` annotation (copied from its MachineDeployment), else the
/// template's.
pub fn effective_creation_timeout(set: &MachineSet) -> Option<&str> {
    set.annotation(annotations::EFFECTIVE_CREATION_TIMEOUT)
        .or_else(|| {
            set.spec
                .template
                .metadata
                .as_ref()
                .and_then(|m| m.annotation(annotations::EFFECTIVE_CREATION_TIMEOUT))
        })
}

/// The `generateName` of the set's machines: `<set-name>-` (the reference's `getMachinesPrefix`; the name alone if the
/// dash would make it longer than a DNS subdomain may be).
pub fn generate_name(set: &MachineSet) -> String {
    let name = set.metadata.name.as_deref().unwrap_or_default();
    if name.len() < 253 {
        format!("{name}-")
    } else {
        name.to_owned()
    }
}

/// The machine to create for `set`, complete so that it needs no second write: `generateName` `<set-name>-`, the set's
/// namespace, the template's labels and annotations (plus the set's effective creation timeout annotation), the
/// template's finalizers plus `machine.sapcloud.io/machine-controller-manager`, the set's [`owner_reference`], and the
/// template's spec — without `providerID`, which the machine controller sets once for the machine's own VM.
pub fn machine_to_create(set: &MachineSet) -> Machine {
    let template = &set.spec.template;
    let meta = template.metadata.as_ref();
    let labels = meta.and_then(|m| m.labels.clone()).filter(|l| !l.is_empty());
    let mut machine_annotations = meta.and_then(|m| m.annotations.clone()).unwrap_or_default();
    if let Some(timeout) = effective_creation_timeout(set) {
        machine_annotations.insert(
            annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
            timeout.to_owned(),
        );
    }
    let mut machine_finalizers = meta.and_then(|m| m.finalizers.clone()).unwrap_or_default();
    if !machine_finalizers
        .iter()
        .any(|f| f == finalizers::MACHINE_CONTROLLER_MANAGER)
    {
        machine_finalizers.push(finalizers::MACHINE_CONTROLLER_MANAGER.to_owned());
    }
    let mut spec = template.spec.clone();
    spec.provider_id.clear();
    Machine {
        metadata: ObjectMeta {
            generate_name: Some(generate_name(set)),
            namespace: set.metadata.namespace.clone(),
            labels,
            annotations: (!machine_annotations.is_empty()).then_some(machine_annotations),
            finalizers: Some(machine_finalizers),
            owner_references: Some(vec![owner_reference(set)]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// The duration fields of [`MachineConfiguration`] (JSON names), compared by value in [`propagation_patch`].
const DURATION_FIELDS: [&str; 5] = [
    "drainTimeout",
    "healthTimeout",
    "creationTimeout",
    "inPlaceUpdateTimeout",
    "machinePreserveTimeout",
];

fn configuration_view(config: &MachineConfiguration) -> Map<String, Value> {
    match serde_json::to_value(config) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

/// The part of a machine the set propagates, as JSON: `metadata.annotations` with only the effective creation timeout,
/// and `spec` with `nodeTemplate`, the configuration fields and `class.kind`.
fn propagated_view(
    timeout: Option<&str>,
    node_template: Option<&mcm_api::NodeTemplateSpec>,
    config: Map<String, Value>,
    class_kind: &str,
) -> Value {
    let mut machine_annotations = Map::new();
    if let Some(timeout) = timeout {
        machine_annotations.insert(annotations::EFFECTIVE_CREATION_TIMEOUT.into(), json!(timeout));
    }
    let mut spec = config;
    if let Some(template) = node_template {
        spec.insert(
            "nodeTemplate".into(),
            serde_json::to_value(template).unwrap_or(Value::Null),
        );
    }
    let mut class = Map::new();
    if !class_kind.is_empty() {
        class.insert("kind".into(), json!(class_kind));
    }
    spec.insert("class".into(), Value::Object(class));
    json!({ "metadata": { "annotations": machine_annotations }, "spec": spec })
}

/// The RFC 7386 merge patch that turns `old` into `new`: objects are diffed key by key (a key `new` lacks becomes
/// `null`), anything else is replaced whole. `None` when they are equal.
pub(crate) fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = Map::new();
            for (key, value) in new {
                match old.get(key) {
                    Some(previous) => {
                        if let Some(diff) = merge_diff(previous, value) {
                            patch.insert(key.clone(), diff);
                        }
                    }
                    None => {
                        patch.insert(key.clone(), value.clone());
                    }
                }
            }
            for key in old.keys() {
                if !new.contains_key(key) {
                    patch.insert(key.clone(), Value::Null);
                }
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ if old == new => None,
        _ => Some(new.clone()),
    }
}

fn same_duration(a: &Value, b: &Value) -> bool {
    match (a.as_str(), b.as_str()) {
        (Some(a), Some(b)) => matches!(
            (GoDuration::new(a).parse(), GoDuration::new(b).parse()),
            (Ok(x), Ok(y)) if x == y
        ),
        _ => false,
    }
}

/// The minimal JSON merge patch that brings an existing machine in line with the set's template without replacing
/// it (the reference's `syncMachinesNodeTemplates`, `syncMachinesConfig`, `syncMachinesClassKind`, plus the effective
/// creation timeout of [`effective_creation_timeout`]): `spec.nodeTemplate`, the machine configuration (timeouts,
/// `maxEvictRetries`, `nodeConditions`, `disableHealthTimeout`), `spec.class.kind`, and the annotation
/// `node.machine.sapcloud.io/effective-creation-timeout` (removed when the set has none). `None` when the machine
/// already matches, or is not active (being deleted, Terminating or Failed: the reference skips inactive machines).
/// Durations equal in value (`10m` and `10m0s`) count as equal.
pub fn propagation_patch(set: &MachineSet, machine: &Machine) -> Option<Value> {
    if machine.is_failed_or_terminating() {
        return None;
    }
    let template = &set.spec.template.spec;
    let old_config = configuration_view(&machine.spec.configuration);
    let mut new_config = configuration_view(&template.configuration);
    for field in DURATION_FIELDS {
        if let (Some(old), Some(new)) = (old_config.get(field), new_config.get(field))
            && old != new
            && same_duration(old, new)
        {
            new_config.insert(field.to_owned(), old.clone());
        }
    }
    let old = propagated_view(
        machine.annotation(annotations::EFFECTIVE_CREATION_TIMEOUT),
        machine.spec.node_template.as_ref(),
        old_config,
        &machine.spec.class.kind,
    );
    let new = propagated_view(
        effective_creation_timeout(set),
        template.node_template.as_ref(),
        new_config,
        &template.class.kind,
    );
    merge_diff(&old, &new)
}
