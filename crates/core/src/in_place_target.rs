//! What a node is to be updated to in place, handed to its node agent on the Node itself: the annotation
//! `node.machine.sapcloud.io/in-place-update-target` (ours; the reference has no such key, Gardener's node agent
//! reads its own OperatingSystemConfig Secret instead).
//!
//! Why on the Node: a node agent runs with the node's credential, which (kube-apiserver's Node authorizer, and ours)
//! may read its own Node but no MachineDeployment, MachineClass or class Secret. Only what is not secret is handed
//! over: the target class's name and its `nodeTemplate` (resources, instance type, region, zone), never its
//! providerSpec or userData. The MachineDeployment controller writes it in the same patch as the label
//! `candidate-for-update`, so the node never carries the label without it.

use std::collections::BTreeMap;

use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::api::resource::Quantity};
use mcm_api::{
    MetaExt, NodeTemplate,
    keys::{annotations, kubernetes::INSTANCE_TYPE_LABEL},
};
use serde::{Deserialize, Serialize};

/// The resources a node agent takes from the target's `nodeTemplate.capacity`: those it reports at boot.
pub const RESOURCES: [&str; 2] = ["cpu", "memory"];

/// The target of a node's in-place update.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// The MachineClass the node is updated to (the MachineDeployment's template class).
    pub class: String,
    /// That class's `nodeTemplate`, when it has one (absent when the class has none or was not found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_template: Option<NodeTemplate>,
}

/// Why a node's target cannot be applied; the message is the node agent's `update-failed-reason`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// The node has no target annotation.
    #[error(
        "the node has no annotation {key}: the MachineDeployment controller writes it with candidate-for-update",
        key = annotations::IN_PLACE_UPDATE_TARGET
    )]
    Missing,
    /// The annotation is not the JSON of a target.
    #[error("annotation {key}: not a valid target: {0}", key = annotations::IN_PLACE_UPDATE_TARGET)]
    Malformed(String),
    /// The target class gives no `nodeTemplate.capacity` for a resource the agent needs.
    #[error(
        "the target class {class:?} has no nodeTemplate.capacity.{resource}: the node's new resources are taken from it"
    )]
    NoCapacity {
        /// The target class.
        class: String,
        /// The missing resource.
        resource: &'static str,
    },
}

impl Target {
    /// The target of `class` with that class's `node_template`.
    pub fn new(class: &str, node_template: Option<NodeTemplate>) -> Self {
        Self {
            class: class.to_owned(),
            node_template,
        }
    }

    /// The annotation's value.
    pub fn annotation(&self) -> String {
        // A struct of strings and quantities always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The node's target, read from its annotation.
    pub fn of(node: &Node) -> Result<Self, TargetError> {
        let raw = node
            .annotation(annotations::IN_PLACE_UPDATE_TARGET)
            .ok_or(TargetError::Missing)?;
        let target: Self =
            serde_json::from_str(raw).map_err(|err| TargetError::Malformed(err.to_string()))?;
        if target.class.is_empty() {
            return Err(TargetError::Malformed("class: must not be empty".into()));
        }
        Ok(target)
    }

    /// The class named by the node's annotation, when it can be read (the rollout's "is it current" test).
    pub fn class_of(node: &Node) -> Option<String> {
        Self::of(node).ok().map(|t| t.class)
    }

    /// The node's resources after the update: each of [`RESOURCES`] from `nodeTemplate.capacity`, all required.
    pub fn resources(&self) -> Result<BTreeMap<String, Quantity>, TargetError> {
        let capacity = self.node_template.as_ref().map(|t| &t.capacity);
        RESOURCES
            .iter()
            .map(|&resource| {
                capacity
                    .and_then(|c| c.get(resource))
                    .filter(|q| !q.0.trim().is_empty())
                    .map(|q| (resource.to_owned(), q.clone()))
                    .ok_or_else(|| TargetError::NoCapacity {
                        class: self.class.clone(),
                        resource,
                    })
            })
            .collect()
    }

    /// The node labels the update sets: `node.kubernetes.io/instance-type` when the target names one.
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.node_template
            .as_ref()
            .map(|t| t.instance_type.trim())
            .filter(|t| !t.is_empty())
            .map(|t| BTreeMap::from([(INSTANCE_TYPE_LABEL.to_owned(), t.to_owned())]))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use pretty_assertions::assert_eq;

    fn template(capacity: &[(&str, &str)], instance_type: &str) -> NodeTemplate {
        NodeTemplate {
            capacity: capacity
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                .collect(),
            instance_type: instance_type.to_owned(),
            ..NodeTemplate::default()
        }
    }

    fn node_with(annotation: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                annotations: annotation.map(|a| {
                    BTreeMap::from([(annotations::IN_PLACE_UPDATE_TARGET.to_owned(), a.to_owned())])
                }),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn the_annotation_round_trips_and_carries_no_provider_spec() {
        let target = Target::new("medium", Some(template(&[("cpu", "4"), ("memory", "8Gi")], "m")));
        let raw = target.annotation();
        assert_eq!(
            raw,
            r#"{"class":"medium","nodeTemplate":{"capacity":{"cpu":"4","memory":"8Gi"},"instanceType":"m","region":"","zone":""}}"#
        );
        assert_eq!(Target::of(&node_with(Some(&raw))), Ok(target));
    }

    #[test]
    fn resources_and_the_instance_type_come_from_the_node_template() {
        let target = Target::new(
            "medium",
            Some(template(
                &[("cpu", "4"), ("memory", "8Gi"), ("gpu", "0")],
                "medium",
            )),
        );
        assert_eq!(
            target.resources().unwrap(),
            BTreeMap::from([
                ("cpu".to_owned(), Quantity("4".into())),
                ("memory".to_owned(), Quantity("8Gi".into())),
            ])
        );
        assert_eq!(
            target.labels(),
            BTreeMap::from([(INSTANCE_TYPE_LABEL.to_owned(), "medium".to_owned())])
        );
    }

    #[test]
    fn a_target_without_capacity_is_refused_naming_the_class_and_the_field() {
        let bare = Target::new("plain", None);
        let err = bare.resources().unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"the target class "plain" has no nodeTemplate.capacity.cpu: the node's new resources are taken from it"#
        );
        let no_memory = Target::new("half", Some(template(&[("cpu", "2")], "")));
        assert!(matches!(
            no_memory.resources(),
            Err(TargetError::NoCapacity {
                resource: "memory",
                ..
            })
        ));
        assert!(no_memory.labels().is_empty(), "no instance type, no label");
    }

    #[test]
    fn a_missing_or_malformed_annotation_is_an_error_naming_the_key() {
        assert_eq!(Target::of(&node_with(None)), Err(TargetError::Missing));
        let err = Target::of(&node_with(Some("{not json"))).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "annotation node.machine.sapcloud.io/in-place-update-target: not a valid target"
            ),
            "{err}"
        );
        assert!(matches!(
            Target::of(&node_with(Some(r#"{"class":""}"#))),
            Err(TargetError::Malformed(_))
        ));
        assert_eq!(
            Target::class_of(&node_with(Some(r#"{"class":"x"}"#))),
            Some("x".into())
        );
    }
}
