//! Finalizer list writes, in one shape for every controller: a JSON merge patch with the whole list and the
//! object's resourceVersion, so that a concurrent change of the list fails with a conflict instead of being
//! overwritten.

use kube::Resource;
use mcm_core::finalizers::FinalizerChange;
use serde_json::{Value, json};

/// The merge patch applying `change` of `finalizer` to `object`'s list; `None` when it would change nothing (keep,
/// adding one that is there, removing one that is not).
pub(crate) fn patch(object: &impl Resource, finalizer: &str, change: FinalizerChange) -> Option<Value> {
    let current = object.meta().finalizers.clone().unwrap_or_default();
    let present = current.iter().any(|f| f == finalizer);
    let list: Vec<String> = match change {
        FinalizerChange::Add if !present => current.into_iter().chain([finalizer.to_owned()]).collect(),
        FinalizerChange::Remove if present => current.into_iter().filter(|f| f != finalizer).collect(),
        _ => return None,
    };
    Some(json!({ "metadata": { "finalizers": list, "resourceVersion": object.meta().resource_version } }))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;

    use super::*;

    fn secret(finalizers: &[&str]) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
        secret.metadata.resource_version = Some("7".into());
        secret
    }

    #[test]
    fn the_list_is_written_whole_and_guarded_by_the_resource_version() {
        let patch = patch(&secret(&["a"]), "b", FinalizerChange::Add).expect("a patch");
        assert_eq!(
            patch,
            json!({ "metadata": { "finalizers": ["a", "b"], "resourceVersion": "7" } })
        );
        let patch = patch_of(&["a", "b"], "a", FinalizerChange::Remove);
        assert_eq!(
            patch,
            Some(json!({ "metadata": { "finalizers": ["b"], "resourceVersion": "7" } }))
        );
    }

    #[test]
    fn nothing_is_written_when_nothing_changes() {
        assert_eq!(patch_of(&["a"], "a", FinalizerChange::Add), None);
        assert_eq!(patch_of(&["a"], "b", FinalizerChange::Remove), None);
        assert_eq!(patch_of(&["a"], "a", FinalizerChange::Keep), None);
    }

    fn patch_of(list: &[&str], finalizer: &str, change: FinalizerChange) -> Option<Value> {
        patch(&secret(list), finalizer, change)
    }
}
