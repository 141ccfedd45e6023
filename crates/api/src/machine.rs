//! `Machine`: one VM (or physical machine) backed by a provider.

use k8s_openapi::{
    api::core::v1::{NodeAddress, NodeCondition},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    ClassSpec, MachineConfiguration, NodeTemplateSpec,
    resource::{empty_as_none, namespaced_kind},
    status_value::status_enum,
};

/// A machine: the representation of a physical or virtual machine (short name `mc`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Machine {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Desired state of the machine.
    #[serde(default)]
    pub spec: MachineSpec,
    /// Observed state of the machine, written by the machine controller.
    #[serde(default)]
    pub status: Option<MachineStatus>,
}

namespaced_kind!(Machine, kind = "Machine", plural = "machines", fields = {
    metadata: "metadata",
    spec: "spec",
    status: "status" skip_if Option::is_none,
});

/// Desired state of a machine (`spec`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// The class the machine is made from.
    #[serde(default)]
    pub class: ClassSpec,
    /// The provider's unique ID of the VM; set once by the machine controller and never changed.
    #[serde(default, rename = "providerID", skip_serializing_if = "String::is_empty")]
    pub provider_id: String,
    /// Labels, annotations and taints for the machine's node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_template: Option<NodeTemplateSpec>,
    /// Per-machine overrides of the controller's timeouts, inlined as in the reference.
    #[serde(flatten)]
    pub configuration: MachineConfiguration,
}

/// Observed state of a machine (`status`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Addresses of the machine; filled only when there is no target cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<NodeAddress>,
    /// Conditions of the machine's node, copied from the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<NodeCondition>,
    /// The last operation performed on the machine and how it went.
    #[serde(default)]
    pub last_operation: LastOperation,
    /// The machine's phase.
    #[serde(default)]
    pub current_status: CurrentStatus,
    /// Opaque state the provider returned from its last create or delete, passed back on later calls.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_known_state: String,
}

/// The last operation performed on an object (`status.lastOperation`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastOperation {
    /// Human-readable description; its strings are written and read in one place (the machine controller).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Machine code of a failed create, as consumed by the cluster-autoscaler back-off.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_code: String,
    /// When the operation was last updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// State of the operation.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "empty_as_none"
    )]
    pub state: Option<MachineState>,
    /// Type of the operation.
    #[serde(
        default,
        rename = "type",
        skip_serializing_if = "Option::is_none",
        deserialize_with = "empty_as_none"
    )]
    pub r#type: Option<MachineOperationType>,
}

/// The machine's phase and when it last changed (`status.currentStatus`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CurrentStatus {
    /// Phase of the machine; absent means new.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "empty_as_none"
    )]
    pub phase: Option<MachinePhase>,
    /// Vestigial field of the reference, kept for compatibility.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timeout_active: bool,
    /// When the phase last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// When preservation of the machine ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserve_expiry_time: Option<Time>,
}

status_enum! {
    /// Phase of a machine (`status.currentStatus.phase`).
    pub enum MachinePhase {
        /// The machine is being created.
        Pending,
        /// The VM exists but there is no target cluster to join (`--target-kubeconfig none`).
        Available,
        /// The node is Ready.
        Running,
        /// The machine is being deleted.
        Terminating,
        /// The node is not healthy, or missing.
        Unknown,
        /// The machine failed (creation or health timeout) and is to be replaced.
        Failed,
        /// Creation is failing and is retried.
        CrashLoopBackOff,
        /// The machine is being updated in place.
        InPlaceUpdating,
        /// The in-place update succeeded.
        InPlaceUpdateSuccessful,
        /// The in-place update failed.
        InPlaceUpdateFailed,
    }
}

status_enum! {
    /// State of a machine's last operation (`status.lastOperation.state`).
    pub enum MachineState {
        /// The operation is not complete yet.
        Processing,
        /// The operation failed.
        Failed,
        /// The operation completed.
        Successful,
    }
}

status_enum! {
    /// Type of a machine's last operation (`status.lastOperation.type`).
    pub enum MachineOperationType {
        /// Creation of the VM.
        Create,
        /// An update of the machine.
        Update,
        /// An in-place update of the machine.
        InPlaceUpdate,
        /// A drain of the node.
        DrainNode,
        /// A health check of the node.
        HealthCheck,
        /// Deletion of the machine.
        Delete,
    }
}

impl Machine {
    /// The machine's phase, `None` when it is new.
    pub fn phase(&self) -> Option<MachinePhase> {
        self.status.as_ref().and_then(|s| s.current_status.phase)
    }
}
