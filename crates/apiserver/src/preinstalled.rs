//! The CustomResourceDefinitions a server starts with, as a cluster set up for the machine controller manager has
//! them: the four machine kinds (the CRDs of `mcm crds`), the provider-specific class kinds of older MCM releases
//! (served free-form so that machines still naming them can be migrated to MachineClass, spec 000
//! GenerateMachineClassForMigration; `SimMachineClass` is the sim provider's, for tests of that flow), and whatever
//! [`Config::extra_crds`](crate::Config::extra_crds) adds (`mcm apiserver` and `mcm up` add the Cluster API kinds).
//!
//! They are ordinary stored CRDs, served through the one CRD path ([`crate::crd::sync`]): at every start each one
//! whose name is not stored is created ([`install`]), so a fresh data dir gets them all and one that has them (the
//! reference's CRDs applied over ours, a newer version of ours) keeps what it has. What the machine kinds have beyond
//! a plain custom resource (validating admission, [`crate::admission`]) is keyed by group and kind and applies to
//! whichever CRD serves them.

use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};

use crate::{
    error::ApiError,
    objects::{self, Context, FieldValidation},
    registry::Registry,
    store::Store,
};

/// Old provider-specific class kinds (kind, plural), served for class migration only.
const LEGACY_CLASS_KINDS: [(&str, &str); 7] = [
    ("AWSMachineClass", "awsmachineclasses"),
    ("AzureMachineClass", "azuremachineclasses"),
    ("GCPMachineClass", "gcpmachineclasses"),
    ("OpenStackMachineClass", "openstackmachineclasses"),
    ("AlicloudMachineClass", "alicloudmachineclasses"),
    ("PacketMachineClass", "packetmachineclasses"),
    ("SimMachineClass", "simmachineclasses"),
];

/// The CRD of a legacy class kind: metadata plus a free-form spec (the old CRDs were provider-defined).
fn legacy_class_crd(kind: &str, plural: &str) -> Value {
    let group = mcm_api::GROUP;
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("{plural}.{group}") },
        "spec": {
            "group": group,
            "names": { "kind": kind, "plural": plural },
            "scope": "Namespaced",
            "versions": [{
                "name": mcm_api::VERSION,
                "served": true,
                "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                    },
                } },
            }],
        },
    })
}

/// The CRDs every server starts with: the machine kinds (`mcm crds`), then the legacy class kinds. Generated once
/// per process (the schemas come from the Rust types).
///
/// # Panics
/// Never in practice: generating the machine CRDs fails only on a bug in the type definitions, which
/// `mcm_api`'s tests catch.
pub fn machine_crds() -> Arc<[Value]> {
    static CRDS: OnceLock<Arc<[Value]>> = OnceLock::new();
    Arc::clone(CRDS.get_or_init(|| {
        let machine = mcm_api::crd::all().expect("the machine CRDs generate from their types");
        machine
            .iter()
            .map(|crd| serde_json::to_value(crd).expect("a CRD serializes"))
            .chain(
                LEGACY_CLASS_KINDS
                    .iter()
                    .map(|(kind, plural)| legacy_class_crd(kind, plural)),
            )
            .collect()
    }))
}

/// Creates each of `crds` whose name no stored CRD has, as a client's create would (defaults, validation,
/// status), and returns the names created. `builtins` serves the CRD resource.
///
/// # Errors
/// A CRD the server refuses (only a bug in the given definitions) or a store failure.
pub fn install(store: &Store, builtins: &Registry, crds: &[Value]) -> Result<Vec<String>, ApiError> {
    let def = builtins
        .find(crate::crd::GROUP, crate::crd::VERSION, crate::crd::PLURAL)
        .ok_or_else(|| ApiError::Internal("CustomResourceDefinitions are not served".into()))?;
    let ctx = Context {
        def,
        namespace: String::new(),
        now: jiff::Timestamp::now(),
        field_validation: FieldValidation::Strict,
        admission: false,
        dry_run: false,
        manager: None,
    };
    let key = crate::crd::store_key();
    let mut created = Vec::new();
    for crd in crds {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        if store.get(&key, "", name).is_none() {
            objects::create(store, &ctx, crd.clone())?;
            created.push(name.to_owned());
        }
    }
    if !created.is_empty() {
        tracing::info!(crds = ?created, "pre-installed CustomResourceDefinitions created");
    }
    Ok(created)
}

/// The resources a fresh server serves: the built-ins and the custom resources of [`machine_crds`]. For code that
/// reasons about served resources without a store (unit tests, tools).
pub fn registry() -> Registry {
    let mut crds: Vec<Value> = machine_crds().to_vec();
    for crd in &mut crds {
        crate::crd::set_defaults(crd);
    }
    Registry::new().with_custom(crds.iter().flat_map(crate::crd::resource_defs).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_kinds_are_served_from_their_crds_with_columns_short_names_and_scale() {
        let registry = registry();
        let machines = registry
            .find("machine.sapcloud.io", "v1alpha1", "machines")
            .unwrap();
        let names: Vec<&str> = machines.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["Status", "Age", "Node", "ProviderID"]);
        assert_eq!(machines.short_names, ["mc"]);
        assert!(machines.custom && machines.status_subresource && machines.generation);
        assert_eq!(
            machines.collection_path(Some("default")),
            "/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machines"
        );
        let sets = registry
            .find("machine.sapcloud.io", "v1alpha1", "machinesets")
            .unwrap();
        assert!(sets.scale_subresource);
        assert_eq!(sets.scale_paths.spec_replicas, "spec.replicas");
        let classes = registry
            .find("machine.sapcloud.io", "v1alpha1", "machineclasses")
            .unwrap();
        assert!(!classes.status_subresource && !classes.scale_subresource);
        assert!(
            registry
                .find("machine.sapcloud.io", "v1alpha1", "simmachineclasses")
                .is_some()
        );
        assert!(
            Registry::new()
                .find("machine.sapcloud.io", "v1alpha1", "machines")
                .is_none(),
            "no built-in path for custom kinds"
        );
    }

    #[test]
    fn install_creates_only_the_crds_not_stored() {
        let store = Store::open(None, 100).unwrap();
        let builtins = Registry::new();
        let crds = machine_crds();
        let first = install(&store, &builtins, &crds).unwrap();
        assert_eq!(first.len(), 4 + LEGACY_CLASS_KINDS.len());
        assert_eq!(first[1], "machines.machine.sapcloud.io");
        let stored = store
            .get(&crate::crd::store_key(), "", "machines.machine.sapcloud.io")
            .unwrap();
        assert_eq!(stored["status"]["conditions"][1]["type"], "Established");
        assert_eq!(stored["spec"]["conversion"]["strategy"], "None");
        let rv = store.current_rv();
        assert!(install(&store, &builtins, &crds).unwrap().is_empty());
        assert_eq!(store.current_rv(), rv, "a second start writes nothing");
    }
}
