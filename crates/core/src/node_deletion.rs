//! Deleting a Node deletes its Machine (reference v0.61+, PRs #1055 and #1097; `node.go` `triggerMachineDeletion`;
//! docs/node-deletion.md).
//!
//! The machine controller puts the finalizer `node.machine.sapcloud.io/machine-controller` on the node of every
//! machine it syncs, so `kubectl delete node` leaves the Node with a `deletionTimestamp`. [`decide`] says what that
//! (or a node delete event, for a node deleted without our finalizer) comes to:
//! - the one Machine whose `node` label names the node, not yet deleting: delete it. Its normal deletion flow
//!   then drains the node, deletes the VM, removes our finalizer and deletes the Node, and its MachineSet replaces
//!   it;
//! - that machine already deleting: nothing, its flow is under way;
//! - no machine names the node: our finalizer goes at once (nothing else would ever remove it); the reference
//!   leaves it to its orphan-node pass, which waits for the creation timeout;
//! - several machines name it: nothing is deleted (the reference's `errMultipleMachineMatch`).
//!
//! A node carrying `node.machine.sapcloud.io/not-managed-by-mcm` is never acted on, as in the reference. Everything
//! is recomputed from the objects, so a restarted controller decides the same.

use k8s_openapi::api::core::v1::Node;
use mcm_api::{
    Machine,
    keys::{annotations, finalizers, labels},
};
use serde_json::Value;

use crate::finalizers::{FinalizerChange, patch};

/// The reason of the Normal Event recorded on a machine deleted because its node was.
/// (Not `NodeDeleted`: the deletion flow's node step records that one when it deletes the node.)
pub const EVENT_REASON: &str = "TriggeredByNodeDeletion";

/// The message of that Event.
pub fn event_message(node: &str) -> String {
    format!("Node {node:?} was deleted: deleting the machine backing it")
}

/// What the controller saw of the node.
#[derive(Clone, Copy, Debug)]
pub enum NodeSeen<'a> {
    /// The node as it is now (possibly with a `deletionTimestamp`).
    Present(&'a Node),
    /// The node's last version, from its delete event: it is gone.
    Gone(&'a Node),
}

impl<'a> NodeSeen<'a> {
    fn node(self) -> &'a Node {
        match self {
            Self::Present(node) | Self::Gone(node) => node,
        }
    }
}

/// What to do about one node.
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub enum NodeDeletionDecision {
    /// The node is not being deleted, or it is marked not managed by this controller: nothing to do.
    NotDeleting,
    /// Delete this machine (the one whose `node` label names the node) and record [`EVENT_REASON`].
    DeleteMachine {
        /// The machine's name.
        machine: String,
    },
    /// The node's machine is already being deleted; its flow removes our finalizer and the node.
    MachineDeleting {
        /// The machine's name.
        machine: String,
    },
    /// No machine names the node, which still carries our finalizer: apply this merge patch (the finalizer list
    /// without ours, guarded by the node's resourceVersion) so that the node goes.
    RemoveFinalizer {
        /// The merge patch of the node.
        patch: Value,
    },
    /// No machine names the node and nothing of ours holds it: nothing to do.
    NoMachine,
    /// Several machines name the node: nothing is deleted (which one would be a guess).
    Ambiguous {
        /// Their names, sorted.
        machines: Vec<String>,
    },
}

/// Whether the node is marked not managed by this controller (the orphan-node pass's annotation).
fn not_managed(node: &Node) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(annotations::NOT_MANAGED_BY_MCM))
}

/// Whether the machine's `node` label names `node`.
pub fn machine_of_node(machine: &Machine, node: &str) -> bool {
    !node.is_empty()
        && machine
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::NODE))
            .is_some_and(|n| n == node)
}

/// The decision about a node, given the machines of the controller's namespace (only looked at when the node is
/// being deleted or gone).
pub fn decide<'m>(
    seen: NodeSeen<'_>,
    machines: impl IntoIterator<Item = &'m Machine>,
) -> NodeDeletionDecision {
    let node = seen.node();
    let deleting = match seen {
        NodeSeen::Present(node) => node.metadata.deletion_timestamp.is_some(),
        NodeSeen::Gone(_) => true,
    };
    if !deleting || not_managed(node) {
        return NodeDeletionDecision::NotDeleting;
    }
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let mut matching: Vec<&Machine> = machines
        .into_iter()
        .filter(|m| machine_of_node(m, name))
        .collect();
    match matching.len() {
        0 => match seen {
            NodeSeen::Present(node) => patch(&node.metadata, finalizers::NODE, FinalizerChange::Remove)
                .map_or(NodeDeletionDecision::NoMachine, |patch| {
                    NodeDeletionDecision::RemoveFinalizer { patch }
                }),
            NodeSeen::Gone(_) => NodeDeletionDecision::NoMachine,
        },
        1 => {
            let machine = matching.remove(0);
            let name = machine.metadata.name.clone().unwrap_or_default();
            if machine.metadata.deletion_timestamp.is_some() {
                NodeDeletionDecision::MachineDeleting { machine: name }
            } else {
                NodeDeletionDecision::DeleteMachine { machine: name }
            }
        }
        _ => {
            let mut names: Vec<String> = matching
                .iter()
                .map(|m| m.metadata.name.clone().unwrap_or_default())
                .collect();
            names.sort();
            NodeDeletionDecision::Ambiguous { machines: names }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use mcm_api::builders::{MachineBuilder, NodeBuilder};
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;

    fn now() -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_000_000).unwrap()
    }

    fn node(finalizers: &[&str]) -> Node {
        NodeBuilder::new("node-1")
            .resource_version("42")
            .with(|n| n.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect()))
            .build()
    }

    fn deleting(mut n: Node) -> Node {
        n.metadata.deletion_timestamp = Some(Time(now()));
        n
    }

    /// A machine `default/<name>` whose node label names `node`.
    fn machine(name: &str, node: &str) -> MachineBuilder {
        MachineBuilder::new(name).namespace("default").node(node)
    }

    fn machine_deleting(name: &str, node: &str) -> Machine {
        machine(name, node).deleting_at(now()).build()
    }

    #[test]
    fn a_node_being_deleted_deletes_the_machine_its_node_label_names() {
        let n = deleting(node(&[finalizers::NODE]));
        let ours = machine("m-1", "node-1").build();
        let other = machine("m-2", "node-2").build();
        assert_eq!(
            decide(NodeSeen::Present(&n), [&other, &ours]),
            NodeDeletionDecision::DeleteMachine {
                machine: "m-1".into()
            }
        );
    }

    #[test]
    fn a_node_deleted_without_our_finalizer_deletes_its_machine_too() {
        // The reference's deleteNode handler: a delete event triggers the machine's deletion as well.
        let n = node(&[]);
        let ours = machine("m-1", "node-1").build();
        assert_eq!(
            decide(NodeSeen::Gone(&n), [&ours]),
            NodeDeletionDecision::DeleteMachine {
                machine: "m-1".into()
            }
        );
    }

    #[test]
    fn a_node_not_being_deleted_is_left_alone() {
        let n = node(&[finalizers::NODE]);
        let ours = machine("m-1", "node-1").build();
        assert_eq!(
            decide(NodeSeen::Present(&n), [&ours]),
            NodeDeletionDecision::NotDeleting
        );
    }

    #[test]
    fn a_machine_already_deleting_is_left_to_its_flow() {
        let n = deleting(node(&[finalizers::NODE]));
        let ours = machine_deleting("m-1", "node-1");
        assert_eq!(
            decide(NodeSeen::Present(&n), [&ours]),
            NodeDeletionDecision::MachineDeleting {
                machine: "m-1".into()
            }
        );
        assert_eq!(
            decide(NodeSeen::Gone(&n), [&ours]),
            NodeDeletionDecision::MachineDeleting {
                machine: "m-1".into()
            }
        );
    }

    #[test]
    fn without_a_machine_our_finalizer_goes_and_no_other() {
        let n = deleting(node(&["other/keep", finalizers::NODE]));
        let elsewhere = machine("m-2", "node-2").build();
        assert_eq!(
            decide(NodeSeen::Present(&n), [&elsewhere]),
            NodeDeletionDecision::RemoveFinalizer {
                patch: json!({ "metadata": { "finalizers": ["other/keep"], "resourceVersion": "42" } })
            }
        );
        let without_ours = deleting(node(&["other/keep"]));
        assert_eq!(
            decide(NodeSeen::Present(&without_ours), [&elsewhere]),
            NodeDeletionDecision::NoMachine
        );
        assert_eq!(
            decide(NodeSeen::Gone(&n), [&elsewhere]),
            NodeDeletionDecision::NoMachine
        );
    }

    #[test]
    fn a_machine_without_a_node_label_or_an_empty_one_names_no_node() {
        let mut unlabelled = machine("node-1", "").build();
        assert!(!machine_of_node(&unlabelled, "node-1"));
        unlabelled.metadata.labels = None;
        assert!(!machine_of_node(&unlabelled, "node-1"));
        assert!(!machine_of_node(&unlabelled, ""));
    }

    #[test]
    fn several_machines_naming_the_node_delete_none() {
        let n = deleting(node(&[finalizers::NODE]));
        let a = machine("m-b", "node-1").build();
        let b = machine("m-a", "node-1").build();
        assert_eq!(
            decide(NodeSeen::Present(&n), [&a, &b]),
            NodeDeletionDecision::Ambiguous {
                machines: vec!["m-a".into(), "m-b".into()]
            }
        );
    }

    #[test]
    fn a_node_marked_not_managed_is_never_acted_on() {
        let mut n = deleting(node(&[finalizers::NODE]));
        n.metadata.annotations = Some(BTreeMap::from([(
            annotations::NOT_MANAGED_BY_MCM.into(),
            "1".into(),
        )]));
        let ours = machine("m-1", "node-1").build();
        assert_eq!(
            decide(NodeSeen::Present(&n), [&ours]),
            NodeDeletionDecision::NotDeleting
        );
        assert_eq!(
            decide(NodeSeen::Gone(&n), [&ours]),
            NodeDeletionDecision::NotDeleting
        );
    }

    #[test]
    fn the_event_names_the_node() {
        assert_eq!(
            event_message("node-1"),
            "Node \"node-1\" was deleted: deleting the machine backing it"
        );
    }
}
