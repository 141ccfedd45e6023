//! Types shared by the four kinds: the class reference, machine templates, node templates, the per-machine
//! configuration that overrides controller flags, and the machine summary of set and deployment status.

use std::collections::BTreeMap;

use k8s_openapi::{api::core::v1::NodeSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{GoDuration, machine::LastOperation, status_value::status_enum};

/// Reference to the class a machine is made from (`spec.class`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClassSpec {
    /// API group of the class; empty means `machine.sapcloud.io`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    /// Kind of the class; `MachineClass` is the one kind served, any other starts a class migration.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Name of the class, in the machine's namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// Metadata and node spec that the node of a machine should carry (`spec.nodeTemplate`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeTemplateSpec {
    /// Labels and annotations applied to the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crd::preserve_unknown_object")]
    pub metadata: Option<ObjectMeta>,
    /// Node spec fields applied to the node (taints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<NodeSpec>,
}

/// Per-machine overrides of the machine controller's flags, inlined into the machine spec as in the reference.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineConfiguration {
    /// How long a drain may take before it turns into a force drain (`--machine-drain-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<GoDuration>,
    /// How long a machine may be unhealthy before it is marked Failed (`--machine-health-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_timeout: Option<GoDuration>,
    /// How long a machine may take to join before it is marked Failed (`--machine-creation-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timeout: Option<GoDuration>,
    /// How long an in-place update may take (`--machine-inplace-update-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_update_timeout: Option<GoDuration>,
    /// How long a preserved machine stays preserved (`--machine-preserve-timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_preserve_timeout: Option<GoDuration>,
    /// Never mark this machine Failed for being unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_health_timeout: Option<bool>,
    /// How many times an eviction is retried during a drain (`--machine-max-evict-retries`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_evict_retries: Option<i32>,
    /// Comma-separated node condition types that make the machine unhealthy when True (`--node-conditions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_conditions: Option<String>,
}

impl MachineConfiguration {
    /// True when no override is set, so that the inlined configuration adds nothing to the wire form.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// Template of the machines of a set or deployment (`spec.template`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MachineTemplateSpec {
    /// Labels and annotations of the machines made from this template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crd::preserve_unknown_object")]
    pub metadata: Option<ObjectMeta>,
    /// Spec of the machines made from this template.
    #[serde(default)]
    pub spec: crate::MachineSpec,
}

impl MachineTemplateSpec {
    /// The template's labels, empty when there are none.
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default()
    }
}

/// Summary of a machine whose last operation failed, in set and deployment status (`failedMachines`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSummary {
    /// Name of the machine.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Provider ID of the machine.
    #[serde(default, skip_serializing_if = "String::is_empty", rename = "providerID")]
    pub provider_id: String,
    /// The machine's last operation.
    #[serde(default)]
    pub last_operation: LastOperation,
    /// Name of the owner of the machine.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner_ref: String,
}

status_enum! {
    /// Status of a condition: True, False or Unknown.
    pub enum ConditionStatus {
        /// The resource is in the condition.
        True,
        /// The resource is not in the condition.
        False,
        /// It cannot be told whether the resource is in the condition.
        Unknown,
    }
}

impl Default for ConditionStatus {
    /// `Unknown`: nothing is claimed about a condition not yet observed.
    fn default() -> Self {
        Self::Unknown
    }
}
