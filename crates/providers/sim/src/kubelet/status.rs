//! The node status the kubelet reports (capacity from the VM's size, kubelet's conditions with faults applied), its
//! fingerprint (two statuses with the same one need no write) and the node as last seen on the server.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, NodeStatus, NodeSystemInfo},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Time},
};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::MAX_PODS;
use crate::faults::NodeFaults;

/// A node as last seen on the server.
pub(super) struct Observed {
    pub(super) uid: String,
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
        resource_version: resource_version(&node),
        fingerprint: node.status.as_ref().map(fingerprint),
        status: node.status,
    }
}

/// The VM fields the kubelet needs.
pub(super) struct VmView {
    pub(super) id: u64,
    pub(super) provider_id: String,
    pub(super) size: crate::sizes::Size,
    pub(super) root_fs_size: Option<u64>,
    pub(super) addresses: Vec<k8s_openapi::api::core::v1::NodeAddress>,
    pub(super) boot_at: Instant,
}

/// The healthy conditions of a kubelet, in the kubelet's order: type, status, reason, message.
const KUBELET_CONDITIONS: [(&str, &str, &str, &str); 4] = [
    (
        "MemoryPressure",
        "False",
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
    ),
    (
        "DiskPressure",
        "False",
        "KubeletHasNoDiskPressure",
        "kubelet has no disk pressure",
    ),
    (
        "PIDPressure",
        "False",
        "KubeletHasSufficientPID",
        "kubelet has sufficient PID available",
    ),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
];

/// The conditions the node reports (without times), faults applied.
fn desired_conditions(faults: Option<&NodeFaults>) -> Vec<NodeCondition> {
    let forced = faults.map(|f| &f.conditions);
    let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: None,
        last_transition_time: None,
    };
    let mut conditions: Vec<NodeCondition> = KUBELET_CONDITIONS
        .iter()
        .map(|&(type_, healthy, reason, message)| {
            match forced.and_then(|f| f.get(type_)).map(|s| s.as_str()) {
                Some(status) if status != healthy => {
                    if type_ == "Ready" && status == "False" {
                        condition(
                            type_,
                            status,
                            "KubeletNotReady",
                            "the node is not ready (simulated fault)",
                        )
                    } else {
                        condition(type_, status, "SimulatedFault", "set by fault injection")
                    }
                }
                _ => condition(type_, healthy, reason, message),
            }
        })
        .collect();
    for (type_, status) in forced.into_iter().flatten() {
        if !KUBELET_CONDITIONS.iter().any(|c| c.0 == type_) {
            conditions.push(condition(
                type_,
                status.as_str(),
                "SimulatedFault",
                "set by fault injection",
            ));
        }
    }
    conditions
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

/// The part of a status the kubelet reports, without times and with conditions sorted by type: two statuses
/// with the same fingerprint need no write.
pub(super) fn fingerprint(status: &NodeStatus) -> Value {
    let mut conditions: Vec<Value> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| json!([c.type_, c.status, c.reason, c.message]))
        .collect();
    conditions.sort_by(|a, b| a[0].as_str().cmp(&b[0].as_str()));
    json!({
        "addresses": status.addresses,
        "allocatable": status.allocatable,
        "capacity": status.capacity,
        "nodeInfo": status.node_info,
        "conditions": conditions,
    })
}

/// The status to write: `desired` with heartbeat times `now`, and transition times kept from `current` for
/// conditions whose status did not change.
pub(super) fn stamped(
    mut desired: NodeStatus,
    current: Option<&NodeStatus>,
    now: jiff::Timestamp,
) -> NodeStatus {
    for condition in desired.conditions.iter_mut().flatten() {
        let kept = current
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == condition.type_))
            .filter(|c| c.status == condition.status)
            .and_then(|c| c.last_transition_time.clone());
        condition.last_heartbeat_time = Some(Time(now));
        condition.last_transition_time = Some(kept.unwrap_or(Time(now)));
    }
    desired
}
