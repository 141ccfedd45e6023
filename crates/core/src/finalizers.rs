//! Finalizers on MachineClasses and Secrets (reference §3.7): a class is kept while machines use it, a secret while
//! classes use it.
//!
//! - A MachineClass gets `machine.sapcloud.io/machine-controller-manager` when at least one machine references it
//!   (`spec.class.kind` `MachineClass`, same namespace and name); the finalizer goes once the class is being deleted
//!   and no machine references it.
//! - A Secret referenced by a class's `secretRef` or `credentialsSecretRef` gets `machine.sapcloud.io/machine-controller`;
//!   the finalizer goes when no class references it any more.

use k8s_openapi::Resource as _;
use k8s_openapi::{
    api::core::v1::{Secret, SecretReference},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use mcm_api::{Machine, MachineClass, MetaExt, keys::finalizers};
use serde_json::{Value, json};

/// What to do with a finalizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum FinalizerChange {
    /// Add it (it is missing).
    Add,
    /// Remove it (it is there).
    Remove,
    /// Nothing to do.
    Keep,
}

/// The merge patch applying `change` of `finalizer` to the finalizer list of the object whose metadata is `meta`:
/// the whole list and the object's resourceVersion, so that a concurrent change of the list fails with a conflict
/// instead of being overwritten. `None` when it would change nothing (keep, adding one that is there, removing one
/// that is not). One shape for every controller that writes finalizers.
pub fn patch(meta: &ObjectMeta, finalizer: &str, change: FinalizerChange) -> Option<Value> {
    let current = meta.finalizers.clone().unwrap_or_default();
    let present = current.iter().any(|f| f == finalizer);
    let list: Vec<String> = match change {
        FinalizerChange::Add if !present => current.into_iter().chain([finalizer.to_owned()]).collect(),
        FinalizerChange::Remove if present => current.into_iter().filter(|f| f != finalizer).collect(),
        _ => return None,
    };
    Some(json!({ "metadata": { "finalizers": list, "resourceVersion": meta.resource_version } }))
}

/// The JSON patch (RFC 6902) removing `finalizer` from the finalizer list of the object whose metadata is `meta`: a
/// `test` of the whole list as `meta` has it, then its replacement. A concurrent change of the list fails the test
/// instead of being overwritten, as the resourceVersion guard of [`patch`] does, but a change of anything else (a
/// node's heartbeat, a status write) does not: a cached copy is enough (issue 26: no GET, no conflict retry). `None`
/// when the finalizer is not there.
pub fn removal_json_patch(meta: &ObjectMeta, finalizer: &str) -> Option<Value> {
    let current = meta.finalizers.clone().unwrap_or_default();
    if !current.iter().any(|f| f == finalizer) {
        return None;
    }
    let list: Vec<&String> = current.iter().filter(|f| *f != finalizer).collect();
    Some(json!([
        { "op": "test", "path": "/metadata/finalizers", "value": current },
        { "op": "replace", "path": "/metadata/finalizers", "value": list },
    ]))
}

/// Whether a machine references the class (kind `MachineClass`, same namespace and name).
pub fn machine_uses_class(machine: &Machine, class: &MachineClass) -> bool {
    let spec = &machine.spec.class;
    spec.kind == MachineClass::KIND
        && Some(spec.name.as_str()) == class.metadata.name.as_deref()
        && machine.metadata.namespace == class.metadata.namespace
}

/// The change of the MachineClass finalizer, given the machines of the class's namespace.
pub fn class_finalizer(class: &MachineClass, machines: &[&Machine]) -> FinalizerChange {
    class_finalizer_by_use(class, machines.iter().any(|m| machine_uses_class(m, class)))
}

/// [`class_finalizer`] for a caller that knows whether a machine uses the class (an index of the uses).
pub fn class_finalizer_by_use(class: &MachineClass, used: bool) -> FinalizerChange {
    let present = class.has_finalizer(finalizers::MACHINE_CONTROLLER_MANAGER);
    let deleting = class.is_deleting();
    match (present, used, deleting) {
        (false, true, _) => FinalizerChange::Add,
        (true, false, true) => FinalizerChange::Remove,
        _ => FinalizerChange::Keep,
    }
}

fn refers_to(reference: Option<&SecretReference>, class: &MachineClass, secret: &Secret) -> bool {
    reference.is_some_and(|r| {
        // An empty namespace in a reference means the class's own.
        let namespace = r
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .or(class.metadata.namespace.as_deref());
        r.name.as_deref() == secret.metadata.name.as_deref()
            && namespace == secret.metadata.namespace.as_deref()
    })
}

/// Whether a class references the secret (`secretRef` or `credentialsSecretRef`).
pub fn class_uses_secret(class: &MachineClass, secret: &Secret) -> bool {
    refers_to(class.secret_ref.as_ref(), class, secret)
        || refers_to(class.credentials_secret_ref.as_ref(), class, secret)
}

/// The change of the Secret finalizer, given the classes of the watched namespace.
pub fn secret_finalizer(secret: &Secret, classes: &[&MachineClass]) -> FinalizerChange {
    let present = secret.has_finalizer(finalizers::SECRET);
    let used = classes.iter().any(|c| class_uses_secret(c, secret));
    match (present, used) {
        (false, true) => FinalizerChange::Add,
        (true, false) => FinalizerChange::Remove,
        _ => FinalizerChange::Keep,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use mcm_api::builders::{MachineBuilder, MachineClassBuilder};

    use super::*;

    fn patch_of(list: &[&str], finalizer: &str, change: FinalizerChange) -> Option<Value> {
        let meta = ObjectMeta {
            finalizers: Some(list.iter().map(|f| (*f).to_owned()).collect()),
            resource_version: Some("7".into()),
            ..ObjectMeta::default()
        };
        patch(&meta, finalizer, change)
    }

    #[test]
    fn the_list_is_written_whole_and_guarded_by_the_resource_version() {
        assert_eq!(
            patch_of(&["a"], "b", FinalizerChange::Add),
            Some(json!({ "metadata": { "finalizers": ["a", "b"], "resourceVersion": "7" } }))
        );
        assert_eq!(
            patch_of(&["a", "b"], "a", FinalizerChange::Remove),
            Some(json!({ "metadata": { "finalizers": ["b"], "resourceVersion": "7" } }))
        );
    }

    #[test]
    fn nothing_is_written_when_nothing_changes() {
        assert_eq!(patch_of(&["a"], "a", FinalizerChange::Add), None);
        assert_eq!(patch_of(&["a"], "b", FinalizerChange::Remove), None);
        assert_eq!(patch_of(&["a"], "a", FinalizerChange::Keep), None);
    }

    fn class(name: &str) -> MachineClass {
        MachineClassBuilder::new(name).namespace("ns").build()
    }

    /// The machine `ns/m` of the class `class`.
    fn machine(class: &str) -> Machine {
        MachineBuilder::new("m").namespace("ns").class(class).build()
    }

    fn secret(name: &str) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("ns".into());
        s
    }

    #[test]
    fn a_used_class_is_kept_until_deleted_and_unused() {
        let mut c = class("c");
        let m = machine("c");
        let other = machine("d");
        assert_eq!(class_finalizer(&c, &[&m]), FinalizerChange::Add);
        assert_eq!(class_finalizer(&c, &[&other]), FinalizerChange::Keep);
        c.metadata.finalizers = Some(vec![finalizers::MACHINE_CONTROLLER_MANAGER.into()]);
        assert_eq!(class_finalizer(&c, &[&m]), FinalizerChange::Keep);
        assert_eq!(
            class_finalizer(&c, &[&other]),
            FinalizerChange::Keep,
            "not deleting"
        );
        c.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(class_finalizer(&c, &[&m]), FinalizerChange::Keep);
        assert_eq!(class_finalizer(&c, &[&other]), FinalizerChange::Remove);
    }

    #[test]
    fn a_secret_is_kept_while_a_class_refers_to_it() {
        let mut c = class("c");
        c.credentials_secret_ref = Some(SecretReference {
            name: Some("creds".into()),
            namespace: None,
        });
        let mut s = secret("creds");
        assert_eq!(secret_finalizer(&s, &[&c]), FinalizerChange::Add);
        s.metadata.finalizers = Some(vec![finalizers::SECRET.into()]);
        assert_eq!(secret_finalizer(&s, &[&c]), FinalizerChange::Keep);
        assert_eq!(secret_finalizer(&s, &[]), FinalizerChange::Remove);
        let elsewhere = Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some("other".into()),
                ..s.metadata.clone()
            },
            ..Secret::default()
        };
        assert!(!class_uses_secret(&c, &elsewhere));
    }

    #[test]
    fn the_removal_json_patch_removes_ours_and_fails_on_a_changed_list_only() {
        let meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            finalizers: Some(vec!["other/one".into(), finalizers::NODE.into()]),
            resource_version: Some("7".into()),
            ..Default::default()
        };
        let patch: json_patch::Patch =
            serde_json::from_value(removal_json_patch(&meta, finalizers::NODE).unwrap()).unwrap();
        // A newer object whose list is the same (a heartbeat changed its status): ours goes, the other stays.
        let mut newer = json!({ "metadata": { "finalizers": ["other/one", finalizers::NODE], "resourceVersion": "9" },
            "status": { "beat": 2 } });
        json_patch::patch(&mut newer, &patch).unwrap();
        assert_eq!(newer["metadata"]["finalizers"], json!(["other/one"]));
        // A list changed meanwhile (a finalizer added): the test fails, nothing is overwritten.
        let mut changed = json!({ "metadata": { "finalizers": ["other/one", finalizers::NODE, "third/x"] } });
        assert!(json_patch::patch(&mut changed, &patch).is_err());
        assert_eq!(removal_json_patch(&meta, "absent/finalizer"), None);
    }
}
