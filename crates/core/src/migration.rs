//! Class migration (spec 000 `GenerateMachineClassForMigration`): a machine whose `spec.class.kind` is not
//! `MachineClass` (for example an old `AWSMachineClass`) gets a `MachineClass` of the same name, filled by the
//! provider; the old class is annotated as migrated and loses our finalizer, and every reference (machines, sets,
//! deployments) moves to the new kind.
//!
//! The spec puts the work around the provider call on the caller: "The task of creating the new CR of the new kind
//! (MachineClass) with the same name as the previous one and also annotating the old machineClass CR with a migrated
//! annotation and migrating existing references is done by the calling library implicitly." The steps are
//! idempotent, so a crash between them is repaired by the next reconcile.

use std::time::Duration;

use k8s_openapi::{Resource as _, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use mcm_api::{ClassSpec, MachineClass, MetaExt, keys};
use mcm_driver::{DriverError, DriverMethod};
use serde_json::{Value, json};

use crate::{
    Description, RetryDecision, RetrySettings,
    retry_policy::{self, RetryGate},
};

/// The version of the old provider-specific class kinds.
pub const OLD_CLASS_VERSION: &str = "v1alpha1";

/// Whether the reference names a class of another kind, which starts the migration flow. An empty kind is a
/// validation error, not a migration.
pub fn needs_migration(class: &ClassSpec) -> bool {
    !class.kind.is_empty() && class.kind != MachineClass::KIND
}

/// The API group of the referenced class.
pub fn group_of(class: &ClassSpec) -> &str {
    if class.api_group.is_empty() {
        mcm_api::GROUP
    } else {
        &class.api_group
    }
}

/// The class handed to the provider to fill: the name and namespace of the old class, nothing else.
pub fn skeleton(class: &ClassSpec, namespace: &str) -> MachineClass {
    MachineClass {
        metadata: ObjectMeta {
            name: Some(class.name.clone()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        ..MachineClass::default()
    }
}

/// The class to create from what the provider filled: the provider's fields under the old class's name and
/// namespace (a provider cannot rename or move it), without server-set metadata.
pub fn class_to_create(filled: &MachineClass, class: &ClassSpec, namespace: &str) -> MachineClass {
    let mut out = filled.clone();
    let labels = filled.metadata.labels.clone();
    let annotations = filled.metadata.annotations.clone();
    out.metadata = ObjectMeta {
        labels,
        annotations,
        ..skeleton(class, namespace).metadata
    };
    out
}

/// The value of the migrated annotation on the old class, as the reference writes it.
pub fn migrated_annotation_value(kind: &str) -> String {
    format!("machine-controller-{kind}")
}

/// The merge patch of the old class: the migrated annotation, and our finalizer removed (the old class no longer
/// holds machines). `None` when both are already so.
pub fn old_class_patch(kind: &str, metadata: &ObjectMeta) -> Option<Value> {
    let value = migrated_annotation_value(kind);
    let annotated = metadata.annotation(keys::annotations::MIGRATED_MACHINE_CLASS) == Some(value.as_str());
    let finalizers = metadata.finalizers.clone().unwrap_or_default();
    let kept: Vec<&String> = finalizers
        .iter()
        .filter(|f| *f != keys::finalizers::MACHINE_CONTROLLER_MANAGER)
        .collect();
    let holds = kept.len() != finalizers.len();
    if annotated && !holds {
        return None;
    }
    let mut patch =
        json!({ "metadata": { "annotations": { keys::annotations::MIGRATED_MACHINE_CLASS: value } } });
    if holds {
        patch["metadata"]["finalizers"] = json!(kept);
        // Guard the list write: a concurrent finalizer change must not be overwritten.
        patch["metadata"]["resourceVersion"] = json!(metadata.resource_version);
    }
    Some(patch)
}

/// Whether a class reference names the old class.
pub fn refers_to(reference: &ClassSpec, old: &ClassSpec) -> bool {
    reference.kind == old.kind && reference.name == old.name && group_of(reference) == group_of(old)
}

/// The merge patch that moves a machine's reference to the new class.
pub fn machine_reference_patch() -> Value {
    json!({ "spec": { "class": { "kind": MachineClass::KIND, "apiGroup": null } } })
}

/// The merge patch that moves a MachineSet's or MachineDeployment's template reference to the new class.
pub fn template_reference_patch() -> Value {
    json!({ "spec": { "template": { "spec": { "class": { "kind": MachineClass::KIND, "apiGroup": null } } } } })
}

/// What identifies the inputs of a migration attempt: the machine's generation and the old class's
/// resourceVersion. A failed attempt is not repeated for the same inputs before its gate opens.
pub fn fingerprint(machine: &mcm_api::Machine, old_class_resource_version: Option<&str>) -> String {
    format!(
        "machine={};old-class={}",
        machine.metadata.generation.unwrap_or_default(),
        old_class_resource_version.unwrap_or_default()
    )
}

/// What to do after `GenerateMachineClassForMigration` failed.
#[derive(Clone, Debug, PartialEq)]
pub struct MigrationFailure {
    /// The lastOperation description for the machine.
    pub description: Description,
    /// When to try again: after a back-off for codes marked for retry, after the slow safety resync (or a change)
    /// otherwise.
    pub requeue_after: Duration,
    /// Whether the failure is final until something changes (Unimplemented and other "N" codes).
    pub awaits_change: bool,
    /// No new attempt before the gate opens: the delay is over or the inputs changed. Without it the machine's own
    /// status write (an event on its watch) would call the provider again at once.
    pub gate: RetryGate,
}

/// The decision after a failed migration call, by the spec 000 table (Unimplemented: N; Internal: Y), taken at
/// `now` for inputs with `fingerprint`.
pub fn on_failure(
    class: &ClassSpec,
    error: &DriverError,
    failures: u32,
    random: f64,
    settings: &RetrySettings,
    now: jiff::Timestamp,
    fingerprint: String,
) -> MigrationFailure {
    let decision = retry_policy::decide(
        DriverMethod::GenerateMachineClassForMigration,
        error.code,
        failures,
        random,
        settings,
    );
    MigrationFailure {
        description: Description::MigrationFailed {
            kind: class.kind.clone(),
            class: class.name.clone(),
            code: error.code,
            message: error.message.clone(),
        },
        requeue_after: decision.requeue_after(),
        awaits_change: matches!(decision, RetryDecision::AwaitChange { .. }),
        gate: RetryGate::new(decision, now, fingerprint),
    }
}

#[cfg(test)]
mod tests {
    use mcm_driver::MachineCode;

    use super::*;

    fn old() -> ClassSpec {
        ClassSpec {
            api_group: String::new(),
            kind: "AWSMachineClass".into(),
            name: "c".into(),
        }
    }

    #[test]
    fn only_other_kinds_start_a_migration() {
        assert!(needs_migration(&old()));
        let mut current = old();
        current.kind = MachineClass::KIND.into();
        assert!(!needs_migration(&current));
        current.kind = String::new();
        assert!(!needs_migration(&current), "an empty kind is a validation error");
    }

    #[test]
    fn the_created_class_keeps_the_old_name_whatever_the_provider_filled() {
        let mut filled = skeleton(&old(), "ns");
        filled.metadata.name = Some("renamed".into());
        filled.metadata.resource_version = Some("7".into());
        filled.provider = "sim".into();
        let class = class_to_create(&filled, &old(), "ns");
        assert_eq!(class.metadata.name.as_deref(), Some("c"));
        assert_eq!(class.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(class.metadata.resource_version, None);
        assert_eq!(class.provider, "sim");
    }

    #[test]
    fn the_old_class_is_annotated_once_and_released() {
        let mut metadata = ObjectMeta {
            finalizers: Some(vec![
                keys::finalizers::MACHINE_CONTROLLER_MANAGER.into(),
                "other".into(),
            ]),
            resource_version: Some("5".into()),
            ..ObjectMeta::default()
        };
        let patch = old_class_patch("AWSMachineClass", &metadata).expect("a patch");
        assert_eq!(
            patch["metadata"]["annotations"][keys::annotations::MIGRATED_MACHINE_CLASS],
            "machine-controller-AWSMachineClass"
        );
        assert_eq!(patch["metadata"]["finalizers"], json!(["other"]));
        assert_eq!(patch["metadata"]["resourceVersion"], "5");
        metadata.finalizers = Some(vec!["other".into()]);
        metadata.annotations = Some(
            [(
                keys::annotations::MIGRATED_MACHINE_CLASS.to_owned(),
                "machine-controller-AWSMachineClass".to_owned(),
            )]
            .into(),
        );
        assert_eq!(old_class_patch("AWSMachineClass", &metadata), None);
    }

    #[test]
    fn references_match_kind_name_and_group() {
        let mut other = old();
        assert!(refers_to(&other, &old()));
        other.api_group = mcm_api::GROUP.into();
        assert!(refers_to(&other, &old()), "empty group means machine.sapcloud.io");
        other.name = "d".into();
        assert!(!refers_to(&other, &old()));
    }

    // spec 000: "A Provider SHOULD implement this driver call, else it MUST return a UNIMPLEMENTED status", and the
    // table marks Unimplemented N (wait for a change) and Internal Y (retry).
    #[test]
    fn unimplemented_waits_for_a_change_and_internal_retries() {
        let settings = RetrySettings::default();
        let unimplemented = on_failure(
            &old(),
            &DriverError::new(MachineCode::Unimplemented, "no"),
            1,
            0.0,
            &settings,
            jiff::Timestamp::UNIX_EPOCH,
            "f1".into(),
        );
        assert!(unimplemented.awaits_change);
        let later = jiff::Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(60);
        assert!(!unimplemented.gate.is_open(later, "f1"), "same inputs: wait");
        assert!(
            unimplemented.gate.is_open(later, "f2"),
            "changed inputs: try again"
        );
        assert_eq!(unimplemented.requeue_after, settings.await_change_resync);
        assert!(
            unimplemented
                .description
                .to_string()
                .starts_with("Migration of AWSMachineClass c to MachineClass failed"),
            "{}",
            unimplemented.description
        );
        let internal = on_failure(
            &old(),
            &DriverError::new(MachineCode::Internal, "boom"),
            1,
            0.0,
            &settings,
            jiff::Timestamp::UNIX_EPOCH,
            "f1".into(),
        );
        assert!(!internal.awaits_change);
        assert!(internal.requeue_after < settings.await_change_resync);
    }
}
