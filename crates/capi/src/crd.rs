//! The CustomResourceDefinitions of `MCMMachine` and `MCMMachineTemplate`, generated from the Rust types, and the
//! aggregated `ClusterRole` that lets the Cluster API manager use them (spec 001 "RBAC", "Cluster API
//! controllers").

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mcm_api::crd::{CrdError, KindDef, build, root_schema, schema_of};
use serde_json::{Value, json};

use crate::types::{GROUP, MCMMachineSpec, MCMMachineStatus, MCMMachineTemplateSpec, VERSION};

/// The labels that tell Cluster API which of our versions serve each of its contract versions (A1: "Providers must
/// label their CRDs `cluster.x-k8s.io/<contract-version>: <crd versions>`").
pub const CONTRACT_LABELS: [(&str, &str); 2] = [
    ("cluster.x-k8s.io/v1beta1", VERSION),
    ("cluster.x-k8s.io/v1beta2", VERSION),
];

/// `contract.CalculateCRDName(Group, Kind)`: `<lower-case kind>s.<group>`.
pub fn crd_name(group: &str, kind: &str) -> String {
    format!("{}s.{group}", kind.to_lowercase())
}

/// A printer column as Cluster API providers declare them (priority 0).
fn column(name: &str, type_: &str, path: &str, description: &str) -> CustomResourceColumnDefinition {
    mcm_api::crd::column(name, type_, path, description, None)
}

/// A kind of our Cluster API group: namespaced, category `cluster-api`, the contract labels; the plural is the
/// lower-case kind + `s` (so that the CRD name is [`crd_name`]).
fn capi_kind(
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    short_name: &'static str,
    schema: Value,
    status: bool,
    columns: Vec<CustomResourceColumnDefinition>,
) -> Result<CustomResourceDefinition, CrdError> {
    build(KindDef {
        group: GROUP,
        version: VERSION,
        kind,
        plural,
        singular,
        short_name,
        categories: &["cluster-api"],
        labels: &CONTRACT_LABELS,
        schema,
        status,
        scale: false,
        columns,
    })
}

/// The CRD of `MCMMachine` (`mcmmachines.infrastructure.machine.sapcloud.io`, short name `mcmm`).
pub fn mcm_machine() -> Result<CustomResourceDefinition, CrdError> {
    capi_kind(
        "MCMMachine",
        "mcmmachines",
        "mcmmachine",
        "mcmm",
        root_schema(
            "MCMMachine is the Cluster API infrastructure machine made by a machine-controller-manager provider.",
            json!({ "spec": schema_of::<MCMMachineSpec>(), "status": schema_of::<MCMMachineStatus>() }),
            &[],
        ),
        true,
        vec![
            column(
                "Cluster",
                "string",
                ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
                "Cluster to which this MCMMachine belongs",
            ),
            column(
                "Machine",
                "string",
                ".metadata.ownerReferences[?(@.kind==\"Machine\")].name",
                "Machine object which owns this MCMMachine",
            ),
            column(
                "ProviderID",
                "string",
                ".spec.providerID",
                "Provider ID of the VM",
            ),
            column(
                "Ready",
                "string",
                ".status.ready",
                "The VM is provisioned and ready",
            ),
            column(
                "Age",
                "date",
                ".metadata.creationTimestamp",
                "Time since the MCMMachine was created",
            ),
        ],
    )
}

/// The CRD of `MCMMachineTemplate` (`mcmmachinetemplates.infrastructure.machine.sapcloud.io`, short name `mcmmt`).
pub fn mcm_machine_template() -> Result<CustomResourceDefinition, CrdError> {
    capi_kind(
        "MCMMachineTemplate",
        "mcmmachinetemplates",
        "mcmmachinetemplate",
        "mcmmt",
        root_schema(
            "MCMMachineTemplate is the template of MCMMachines for Cluster API MachineDeployments and control planes.",
            json!({ "spec": schema_of::<MCMMachineTemplateSpec>() }),
            &[],
        ),
        false,
        vec![column(
            "Age",
            "date",
            ".metadata.creationTimestamp",
            "Time since the MCMMachineTemplate was created",
        )],
    )
}

/// Both CRDs, in the order `mcm crds` prints them (after the four machine.sapcloud.io ones).
pub fn all() -> Result<Vec<CustomResourceDefinition>, CrdError> {
    Ok(vec![mcm_machine()?, mcm_machine_template()?])
}

/// The `ClusterRole` aggregated into the Cluster API manager's role (label `cluster.x-k8s.io/aggregate-to-manager`):
/// full access to both kinds, as spec 001 asks of providers not sponsored by SIG Cluster Lifecycle.
pub fn manager_cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some("capi-mcm-machines".into()),
            labels: Some(
                [(
                    "cluster.x-k8s.io/aggregate-to-manager".to_owned(),
                    "true".to_owned(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![GROUP.into()]),
            resources: Some(vec!["mcmmachines".into(), "mcmmachinetemplates".into()]),
            verbs: ["create", "delete", "get", "list", "patch", "update", "watch"]
                .into_iter()
                .map(String::from)
                .collect(),
            ..PolicyRule::default()
        }]),
        aggregation_rule: None,
    }
}

/// The ClusterRole as a YAML document (with its leading `---`).
pub fn manager_cluster_role_yaml() -> Result<String, CrdError> {
    let yaml =
        serde_saphyr::to_string(&manager_cluster_role()).map_err(|err| CrdError::Yaml(err.to_string()))?;
    let mut out = String::from("---\n");
    out.push_str(&yaml);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_calculate_crd_name() {
        let crds = all().unwrap();
        assert_eq!(
            crds[0].metadata.name.as_deref(),
            Some("mcmmachines.infrastructure.machine.sapcloud.io")
        );
        assert_eq!(
            crds[1].metadata.name.as_deref(),
            Some("mcmmachinetemplates.infrastructure.machine.sapcloud.io")
        );
        for crd in &crds {
            let labels = crd.metadata.labels.as_ref().unwrap();
            assert_eq!(labels["cluster.x-k8s.io/v1beta1"], "v1beta1");
            assert_eq!(labels["cluster.x-k8s.io/v1beta2"], "v1beta1");
            assert_eq!(crd.spec.scope, "Namespaced");
            assert_eq!(
                crd.spec.names.categories.as_deref(),
                Some(&["cluster-api".to_owned()][..])
            );
        }
    }

    #[test]
    fn provider_spec_keeps_unknown_fields() {
        let crd = serde_json::to_value(mcm_machine().unwrap()).unwrap();
        let spec =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        assert_eq!(spec["providerSpec"]["x-kubernetes-preserve-unknown-fields"], true);
        assert_eq!(spec["providerID"]["type"], "string");
    }
}
