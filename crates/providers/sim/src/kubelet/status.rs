//! The node status the kubelet reports (capacity from the VM's size, kubelet's conditions with faults applied), its
//! fingerprint (two statuses with the same one need no write) and the node as last seen on the server.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, NodeStatus, NodeSystemInfo},
    apimachinery::pkg::api::resource::Quantity,
};
use mcm_core::node_report::{self, condition};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::MAX_PODS;
use crate::faults::NodeFaults;

/// A node as last seen on the server.
pub(super) struct Observed {
    pub(super) uid: String,
    /// The node asks its agent for an in-place update now (`ReadyForUpdate`, no `update-result` yet).
    pub(super) wants_update: bool,
    pub(super) resource_version: Option<u64>,
    pub(super) status: Option<NodeStatus>,
    /// The fingerprint of `status`.
    pub(super) fingerprint: Option<Value>,
}

fn resource_version(node: &Node) -> Option<u64> {
    node.metadata
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
}

pub(super) fn observed_of(node: Node) -> Observed {
    Observed {
        uid: node.metadata.uid.clone().unwrap_or_default(),
        wants_update: super::in_place::wants_update(&node),
        resource_version: resource_version(&node),
        fingerprint: node.status.as_ref().map(fingerprint),
        status: node.status,
    }
}

/// The VM fields the kubelet needs.
pub(super) struct VmView {
    pub(super) id: u64,
    /// The namespace and name of the machine the VM backs.
    pub(super) machine: (String, String),
    pub(super) provider_id: String,
    pub(super) size: crate::sizes::Size,
    pub(super) root_fs_size: Option<u64>,
    pub(super) addresses: Vec<k8s_openapi::api::core::v1::NodeAddress>,
    pub(super) boot_at: Instant,
}

/// The conditions the node reports (without times): kubelet's, faults applied.
fn desired_conditions(faults: Option<&NodeFaults>) -> Vec<NodeCondition> {
    let forced = faults.map(|f| &f.conditions);
    let fault = |type_: &str, status: &str| condition(type_, status, FAULT_REASON, "set by fault injection");
    node_report::reported_conditions(
        |kubelet| match forced
            .and_then(|f| f.get(kubelet.type_))
            .map(mcm_api::ConditionStatus::as_str)
        {
            Some(status) if status != kubelet.status => {
                Some(if kubelet.type_ == "Ready" && status == "False" {
                    condition(
                        "Ready",
                        status,
                        "KubeletNotReady",
                        "the node is not ready (simulated fault)",
                    )
                } else {
                    fault(kubelet.type_, status)
                })
            }
            _ => None,
        },
        forced
            .into_iter()
            .flatten()
            .filter(|(type_, _)| !node_report::is_kubelet_condition(type_))
            .map(|(type_, status)| fault(type_, status.as_str())),
    )
}

/// The status the node reports, without condition times.
pub(super) fn desired_status(vm: &VmView, faults: Option<&NodeFaults>, kubelet_version: &str) -> NodeStatus {
    let mut resources = BTreeMap::from([
        ("cpu".to_owned(), vm.size.cpu_quantity()),
        ("memory".to_owned(), vm.size.memory_quantity()),
        ("pods".to_owned(), Quantity(MAX_PODS.to_string())),
    ]);
    if let Some(gb) = vm.root_fs_size {
        resources.insert("ephemeral-storage".into(), Quantity(format!("{gb}G")));
    }
    NodeStatus {
        addresses: Some(vm.addresses.clone()),
        allocatable: Some(resources.clone()),
        capacity: Some(resources),
        conditions: Some(desired_conditions(faults)),
        node_info: Some(NodeSystemInfo {
            architecture: "amd64".into(),
            boot_id: format!("sim-boot-{}", vm.id),
            container_runtime_version: "sim://1.0.0".into(),
            kernel_version: "6.1.0-sim".into(),
            kube_proxy_version: String::new(),
            kubelet_version: kubelet_version.into(),
            machine_id: format!("sim-machine-{}", vm.id),
            operating_system: "linux".into(),
            os_image: "Simulated Linux".into(),
            swap: None,
            system_uuid: format!("sim-{}", vm.id),
        }),
        ..NodeStatus::default()
    }
}

/// The merge patch of the node status's capacity and allocatable from `status` (an in-place update changed the
/// size); `ephemeral-storage` is removed when the status has none.
pub(super) fn resources_patch(status: &NodeStatus) -> Value {
    let resources = |list: Option<&BTreeMap<String, Quantity>>| {
        let mut map = serde_json::Map::new();
        map.insert("ephemeral-storage".into(), Value::Null);
        for (name, quantity) in list.into_iter().flatten() {
            map.insert(name.clone(), json!(quantity));
        }
        Value::Object(map)
    };
    json!({ "status": {
        "capacity": resources(status.capacity.as_ref()),
        "allocatable": resources(status.allocatable.as_ref()),
    } })
}

/// The part of a status the kubelet reports, without times and with conditions sorted by type: two statuses
/// with the same fingerprint need no write.
pub(super) fn fingerprint(status: &NodeStatus) -> Value {
    json!({
        "addresses": status.addresses,
        "allocatable": status.allocatable,
        "capacity": status.capacity,
        "nodeInfo": status.node_info,
        "conditions": node_report::fingerprint(&reported(status.conditions.as_deref().unwrap_or_default())),
    })
}

/// Reason of the conditions fault injection sets.
const FAULT_REASON: &str = "SimulatedFault";

/// Whether this kubelet reports conditions of this kind: kubelet's own types and those fault injection sets.
/// Conditions others write (the machine controller's `Preserved`) are theirs.
fn is_reported(condition: &NodeCondition) -> bool {
    node_report::is_kubelet_condition(&condition.type_) || condition.reason.as_deref() == Some(FAULT_REASON)
}

fn reported(conditions: &[NodeCondition]) -> Vec<NodeCondition> {
    conditions.iter().filter(|c| is_reported(c)).cloned().collect()
}

/// The status to write: `desired` with heartbeat times `now`, and transition times kept from `current` for
/// conditions whose status did not change.
pub(super) fn stamped(
    mut desired: NodeStatus,
    current: Option<&NodeStatus>,
    now: jiff::Timestamp,
) -> NodeStatus {
    let current = current.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    node_report::stamp(
        desired.conditions.as_deref_mut().unwrap_or_default(),
        current,
        now,
    );
    // The status is written with a merge patch, which replaces the list: conditions others wrote are kept.
    if let Some(conditions) = desired.conditions.as_mut() {
        let foreign: Vec<NodeCondition> = current
            .iter()
            .filter(|c| !is_reported(c) && !conditions.iter().any(|d| d.type_ == c.type_))
            .cloned()
            .collect();
        conditions.extend(foreign);
    }
    desired
}
