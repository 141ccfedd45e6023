//! `MachineClass`: the provider-specific template machines are made from.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::SecretReference,
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::resource::namespaced_kind;

/// A template of provider configuration shared by machines, sets and deployments (short name `mcc`).
/// It has no spec and no status: its fields sit at the top level, as in the reference.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineClass {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Resources and placement of the nodes, for cluster-autoscaler scale-from-zero.
    #[serde(default)]
    pub node_template: Option<NodeTemplate>,
    /// Secret holding the provider credentials; its keys override those of `secretRef`.
    #[serde(default)]
    pub credentials_secret_ref: Option<SecretReference>,
    /// Provider-specific configuration, opaque to the controllers and passed to the provider unchanged.
    #[serde(default)]
    pub provider_spec: serde_json::Value,
    /// Name of the provider that serves this class.
    #[serde(default)]
    pub provider: String,
    /// Secret holding userData and, unless `credentialsSecretRef` is set, the credentials.
    #[serde(default)]
    pub secret_ref: Option<SecretReference>,
}

namespaced_kind!(MachineClass, kind = "MachineClass", plural = "machineclasses", fields = {
    metadata: "metadata",
    node_template: "nodeTemplate" skip_if Option::is_none,
    credentials_secret_ref: "credentialsSecretRef" skip_if Option::is_none,
    provider_spec: "providerSpec",
    provider: "provider" skip_if String::is_empty,
    secret_ref: "secretRef" skip_if Option::is_none,
});

/// Resources and placement of the nodes of a class (`nodeTemplate`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTemplate {
    /// Resources of a node: `cpu`, `gpu` and `memory` are expected.
    #[serde(default)]
    pub capacity: BTreeMap<String, Quantity>,
    /// Extended resources merged into the node's capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_capacity: Option<BTreeMap<String, Quantity>>,
    /// Instance type of the nodes.
    #[serde(default)]
    pub instance_type: String,
    /// Region of the nodes.
    #[serde(default)]
    pub region: String,
    /// Zone of the nodes.
    #[serde(default)]
    pub zone: String,
    /// CPU architecture of the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
}
