//! `MachineSet`: keeps a number of machines made from one template.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    ClassSpec, ConditionStatus, LastOperation, MachineSummary, MachineTemplateSpec,
    resource::namespaced_kind, status_value::status_enum,
};

/// A set of machines made from one template (short name `mcs`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct MachineSet {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Desired state of the set.
    #[serde(default)]
    pub spec: MachineSetSpec,
    /// Observed state of the set, written by the set controller.
    #[serde(default)]
    pub status: Option<MachineSetStatus>,
}

namespaced_kind!(MachineSet, kind = "MachineSet", plural = "machinesets", fields = {
    metadata: "metadata",
    spec: "spec",
    status: "status" skip_if Option::is_none,
});

/// Desired state of a machine set (`spec`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetSpec {
    /// Number of machines wanted.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub replicas: i32,
    /// Selects the machines of the set; must match the template's labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Legacy class reference; the template's class is the one used.
    #[serde(default, skip_serializing_if = "is_empty_class")]
    pub machine_class: ClassSpec,
    /// Template of the machines.
    #[serde(default)]
    pub template: MachineTemplateSpec,
    /// Seconds a machine must be Running before it counts as available.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub min_ready_seconds: i32,
    /// How many Failed machines are preserved automatically for diagnosis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_preserve_failed_machine_max: Option<i32>,
}

/// Observed state of a machine set (`status`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetStatus {
    /// Number of machines of the set.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub replicas: i32,
    /// Number of machines whose labels match the template's labels.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub fully_labeled_replicas: i32,
    /// Number of Running machines.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub ready_replicas: i32,
    /// Number of machines Running for at least minReadySeconds.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub available_replicas: i32,
    /// Number of Failed machines that are preserved.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub preserved_failed_replicas: i32,
    /// The most recent generation observed by the set controller.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub observed_generation: i64,
    /// Conditions of the set (note the reference's JSON name).
    #[serde(
        default,
        rename = "machineSetCondition",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<MachineSetCondition>,
    /// The last operation performed by the set controller.
    #[serde(default, skip_serializing_if = "is_default_operation")]
    pub last_operation: LastOperation,
    /// Machines of the set whose last operation failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_machines: Option<Vec<MachineSummary>>,
    /// How many Failed machines are preserved automatically now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_preserve_failed_machine_count: Option<i32>,
}

status_enum! {
    /// Type of a machine set condition.
    pub enum MachineSetConditionType {
        /// A machine of the set could not be created or deleted.
        ReplicaFailure,
        /// The safety controller froze the set because it overshot its replica count.
        Frozen,
    }
}

/// A condition of a machine set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetCondition {
    /// Type of the condition.
    #[serde(rename = "type")]
    pub r#type: MachineSetConditionType,
    /// Status of the condition.
    pub status: ConditionStatus,
    /// When the condition last changed status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Machine-readable reason of the last transition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Human-readable details of the last transition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
pub(crate) fn is_zero_i32(value: &i32) -> bool {
    *value == 0
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
pub(crate) fn is_zero_i64(value: &i64) -> bool {
    *value == 0
}

fn is_empty_class(class: &ClassSpec) -> bool {
    class == &ClassSpec::default()
}

pub(crate) fn is_default_operation(op: &LastOperation) -> bool {
    op == &LastOperation::default()
}
