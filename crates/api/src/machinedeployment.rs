//! `MachineDeployment`: declarative updates of machines through machine sets.

use k8s_openapi::apimachinery::pkg::{
    apis::meta::v1::{LabelSelector, ObjectMeta, Time},
    util::intstr::IntOrString,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    ConditionStatus, MachineSummary, MachineTemplateSpec,
    machineset::{is_zero_i32, is_zero_i64},
    resource::namespaced_kind,
    status_value::status_enum,
};

/// Declarative updates of machines through machine sets (short name `mcd`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct MachineDeployment {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Desired state of the deployment.
    #[serde(default)]
    pub spec: MachineDeploymentSpec,
    /// Observed state of the deployment, written by the deployment controller.
    #[serde(default)]
    pub status: Option<MachineDeploymentStatus>,
}

namespaced_kind!(MachineDeployment, kind = "MachineDeployment", plural = "machinedeployments", fields = {
    metadata: "metadata",
    spec: "spec",
    status: "status" skip_if Option::is_none,
});

/// Desired state of a machine deployment (`spec`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentSpec {
    /// Number of machines wanted.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub replicas: i32,
    /// Selects the machines of the deployment; must match the template's labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Template of the machines.
    #[serde(default)]
    pub template: MachineTemplateSpec,
    /// How machines are replaced when the template changes.
    #[serde(default, skip_serializing_if = "MachineDeploymentStrategy::is_empty")]
    pub strategy: MachineDeploymentStrategy,
    /// Seconds a machine must be Running before it counts as available.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub min_ready_seconds: i32,
    /// How many old machine sets are kept for rollback; absent keeps all of them, as in the reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<i32>,
    /// A paused deployment is not rolled.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Deprecated: the revision to roll back to; cleared when the rollback is done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_to: Option<RollbackConfig>,
    /// Seconds a rollout may go without progress before it is reported as failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline_seconds: Option<i32>,
    /// How many Failed machines are preserved automatically for diagnosis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_preserve_failed_machine_max: Option<i32>,
}

/// How machines are replaced (`spec.strategy`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentStrategy {
    /// `RollingUpdate` (the default when empty), `Recreate`, `OnDelete` or `InPlaceUpdate`. Kept as text so that a
    /// wrong value is reported by validation with its field path instead of making the object unreadable.
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub r#type: String,
    /// Parameters of a rolling update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdateMachineDeployment>,
    /// Parameters of an in-place update (required with strategy type `InPlaceUpdate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_update: Option<InPlaceUpdateMachineDeployment>,
}

impl MachineDeploymentStrategy {
    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// The strategy type; an empty type is RollingUpdate. `Err` carries the unsupported text.
    pub fn strategy_type(&self) -> Result<StrategyType, &str> {
        match self.r#type.as_str() {
            "" | "RollingUpdate" => Ok(StrategyType::RollingUpdate),
            "Recreate" => Ok(StrategyType::Recreate),
            "OnDelete" => Ok(StrategyType::OnDelete),
            "InPlaceUpdate" => Ok(StrategyType::InPlaceUpdate),
            other => Err(other),
        }
    }
}

/// The strategy types this project knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StrategyType {
    /// Replace machines gradually within maxSurge and maxUnavailable.
    RollingUpdate,
    /// Delete all old machines before creating new ones.
    Recreate,
    /// Replace old machines only as someone else deletes them.
    OnDelete,
    /// Update machines in place: their VMs are kept and the machines move to the new set once updated.
    InPlaceUpdate,
}

impl StrategyType {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RollingUpdate => "RollingUpdate",
            Self::Recreate => "Recreate",
            Self::OnDelete => "OnDelete",
            Self::InPlaceUpdate => "InPlaceUpdate",
        }
    }
}

/// Parameters of a rolling update (`spec.strategy.rollingUpdate`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdateMachineDeployment {
    /// Machines that may be unavailable during the update: a number or a percentage (rounded down); default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// Machines that may exist above the desired number: a number or a percentage (rounded up); default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
}

/// Parameters of an in-place update (`spec.strategy.inPlaceUpdate`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceUpdateMachineDeployment {
    /// Machines that may be unavailable during the update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// Machines that may exist above the desired number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
    /// `Auto` or `Manual`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub orchestration_type: String,
}

impl InPlaceUpdateMachineDeployment {
    /// Whether the user selects the nodes to update (`orchestrationType: Manual`).
    pub fn is_manual(&self) -> bool {
        self.orchestration_type == "Manual"
    }
}

/// The revision to roll back to (`spec.rollbackTo`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollbackConfig {
    /// The revision; 0 means the last one.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub revision: i64,
}

/// Observed state of a machine deployment (`status`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentStatus {
    /// The most recent generation observed by the deployment controller.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub observed_generation: i64,
    /// Non-terminated machines selected by the deployment.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub replicas: i32,
    /// Non-terminated machines that have the desired template.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub updated_replicas: i32,
    /// Running machines.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub ready_replicas: i32,
    /// Machines Running for at least minReadySeconds.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub available_replicas: i32,
    /// Machines still missing for full capacity: max(replicas wanted - available, 0).
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub unavailable_replicas: i32,
    /// Failed machines that are preserved.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub preserved_failed_replicas: i32,
    /// Conditions of the deployment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<MachineDeploymentCondition>,
    /// Count of template hash collisions, used to name new machine sets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collision_count: Option<i32>,
    /// Machines of the deployment whose last operation failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_machines: Vec<MachineSummary>,
}

status_enum! {
    /// Type of a machine deployment condition.
    pub enum MachineDeploymentConditionType {
        /// At least the minimum of available machines is up.
        Available,
        /// A rollout is making progress (or has stopped making it).
        Progressing,
        /// A machine could not be created or deleted.
        ReplicaFailure,
        /// The safety controller froze the deployment.
        Frozen,
    }
}

/// A condition of a machine deployment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentCondition {
    /// Type of the condition.
    #[serde(rename = "type")]
    pub r#type: MachineDeploymentConditionType,
    /// Status of the condition.
    pub status: ConditionStatus,
    /// When the condition was last updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
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
