//! What the flow knows about a machine's VM ([`VmInfo`], from any provider answer) and what it records of it on the
//! machine ([`VmRecord`]: providerID, node label, addresses; never overwritten once set).
//!
//! Separate because spec 003 (never two VMs, identity never overwritten) is enforced by these two types alone.

use k8s_openapi::api::core::v1::NodeAddress;
use mcm_api::{
    Machine, MetaExt as _,
    keys::{annotations, labels},
};
use mcm_driver::{CreateMachineResponse, GetMachineStatusResponse, InitializeMachineResponse};
use serde_json::{Map, Value, json};

/// What the creation flow knows about the machine's VM.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VmInfo {
    /// The provider's ID of the VM ("" when not known).
    pub provider_id: String,
    /// The name the VM's node registers with ("" when not known).
    pub node_name: String,
    /// Opaque provider state to save on the machine ("" when none).
    pub last_known_state: String,
    /// The VM's addresses (recorded only without a target cluster).
    pub addresses: Vec<NodeAddress>,
}

impl VmInfo {
    /// The VM as the machine records it (spec.providerID and label `node`).
    pub fn recorded(machine: &Machine) -> Self {
        Self {
            provider_id: machine.spec.provider_id.clone(),
            node_name: machine.node_name().unwrap_or_default().to_owned(),
            ..Self::default()
        }
    }

    /// Fills what `self` does not know from `other`.
    pub(super) fn or(mut self, other: Self) -> Self {
        if self.provider_id.is_empty() {
            self.provider_id = other.provider_id;
        }
        if self.node_name.is_empty() {
            self.node_name = other.node_name;
        }
        if self.last_known_state.is_empty() {
            self.last_known_state = other.last_known_state;
        }
        if self.addresses.is_empty() {
            self.addresses = other.addresses;
        }
        self
    }
}

impl From<&GetMachineStatusResponse> for VmInfo {
    fn from(r: &GetMachineStatusResponse) -> Self {
        Self {
            provider_id: r.provider_id.clone(),
            node_name: r.node_name.clone(),
            last_known_state: String::new(),
            addresses: r.addresses.clone(),
        }
    }
}

impl From<&CreateMachineResponse> for VmInfo {
    fn from(r: &CreateMachineResponse) -> Self {
        Self {
            provider_id: r.provider_id.clone(),
            node_name: r.node_name.clone(),
            last_known_state: r.last_known_state.clone(),
            addresses: r.addresses.clone(),
        }
    }
}

impl From<&InitializeMachineResponse> for VmInfo {
    fn from(r: &InitializeMachineResponse) -> Self {
        Self {
            provider_id: r.provider_id.clone(),
            node_name: r.node_name.clone(),
            last_known_state: String::new(),
            addresses: r.addresses.clone(),
        }
    }
}

/// What to record on the machine about its VM (a metadata/spec update, before any further call). Only what is not
/// recorded yet: a providerID or node label once set is never changed (spec 003).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct VmRecord {
    /// Set `spec.providerID`.
    pub provider_id: Option<String>,
    /// Set the label `node`.
    pub node_label: Option<String>,
    /// Set the annotation `machinepriority.machine.sapcloud.io` to its default `3` (it is absent).
    pub priority_annotation: bool,
}

impl VmRecord {
    /// What `machine` still lacks of `vm`; `None` when it records everything already.
    pub fn for_vm(machine: &Machine, vm: &VmInfo) -> Option<Self> {
        let provider_id = (machine.spec.provider_id.is_empty() && !vm.provider_id.is_empty())
            .then(|| vm.provider_id.clone());
        let node_label =
            (machine.node_name().is_none() && !vm.node_name.is_empty()).then(|| vm.node_name.clone());
        let priority_annotation = machine
            .annotation(annotations::MACHINE_PRIORITY)
            .is_none_or(str::is_empty);
        let record = Self {
            provider_id,
            node_label,
            priority_annotation,
        };
        (record != Self::default()).then_some(record)
    }

    /// The JSON merge patch of the machine (main resource) that records this.
    pub fn merge_patch(&self) -> Value {
        let mut metadata = Map::new();
        if let Some(node) = &self.node_label {
            metadata.insert("labels".into(), json!({ labels::NODE: node }));
        }
        if self.priority_annotation {
            metadata.insert(
                "annotations".into(),
                json!({ annotations::MACHINE_PRIORITY: annotations::MACHINE_PRIORITY_DEFAULT }),
            );
        }
        let mut patch = Map::new();
        if !metadata.is_empty() {
            patch.insert("metadata".into(), Value::Object(metadata));
        }
        if let Some(provider_id) = &self.provider_id {
            patch.insert("spec".into(), json!({ "providerID": provider_id }));
        }
        Value::Object(patch)
    }
}
