//! In-place updates as the local machine's node agent performs them. On the `InPlaceUpdate` condition
//! `ReadyForUpdate` (and no `update-result` yet), the agent reads the target its own Node carries (the annotation
//! `node.machine.sapcloud.io/in-place-update-target`: the class and its `nodeTemplate`, written by the
//! MachineDeployment controller; `mcm_core::in_place_target`) and applies it: the node's `cpu` and `memory` become
//! the target's `nodeTemplate.capacity`, the label `node.kubernetes.io/instance-type` its `instanceType`. What was
//! applied is saved in `<machine-dir>/in-place-update.json` (mode 0600, through a rename), so that a restarted agent
//! keeps reporting it. The machine's process and its userData are not re-run: the agent's node credential cannot
//! read the class's Secret, and a local machine has no operating system to reconfigure.

use std::{collections::BTreeMap, path::Path};

use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::api::resource::Quantity};
use mcm_apiserver::files::write_atomic;
use mcm_core::in_place_target::{Target, TargetError};
use serde::{Deserialize, Serialize};

/// The record of the last update applied, in `--machine-dir`.
pub(super) const APPLIED_FILE: &str = "in-place-update.json";
/// Its mode: the owner's alone, as every file of the machine directory.
const PRIVATE_MODE: u32 = 0o600;

/// What an in-place update changed on the node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Applied {
    /// The class updated to.
    pub(super) class: String,
    /// The node's resources from then on (`cpu`, `memory`).
    pub(super) resources: BTreeMap<String, Quantity>,
    /// The node labels set (the instance type).
    pub(super) labels: BTreeMap<String, String>,
}

impl Applied {
    /// What applying the node's target comes to, or why it cannot be applied.
    pub(super) fn of(node: &Node) -> Result<Self, TargetError> {
        let target = Target::of(node)?;
        Ok(Self {
            resources: target.resources()?,
            labels: target.labels(),
            class: target.class,
        })
    }

    /// The record saved by an earlier update, if any.
    pub(super) fn load(machine_dir: &Path) -> Result<Option<Self>, String> {
        let path = machine_dir.join(APPLIED_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|err| format!("{} is not a valid record: {err}", path.display())),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(format!("cannot read {}: {err}", path.display())),
        }
    }

    /// Saves the record (mode 0600, through a rename).
    pub(super) fn save(&self, machine_dir: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        write_atomic(&machine_dir.join(APPLIED_FILE), &bytes, PRIVATE_MODE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use mcm_api::keys::annotations::IN_PLACE_UPDATE_TARGET;
    use std::os::unix::fs::PermissionsExt as _;

    fn node(target: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    IN_PLACE_UPDATE_TARGET.to_owned(),
                    target.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn the_target_becomes_the_nodes_resources_and_instance_type_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let applied = Applied::of(&node(
            r#"{"class":"local-medium","nodeTemplate":{"capacity":{"cpu":"4","gpu":"0","memory":"8Gi"},"instanceType":"medium"}}"#,
        ))
        .unwrap();
        assert_eq!(applied.class, "local-medium");
        assert_eq!(
            applied.resources,
            BTreeMap::from([
                ("cpu".to_owned(), Quantity("4".into())),
                ("memory".to_owned(), Quantity("8Gi".into())),
            ])
        );
        assert_eq!(
            applied.labels,
            BTreeMap::from([("node.kubernetes.io/instance-type".to_owned(), "medium".to_owned())])
        );
        assert_eq!(Applied::load(dir.path()), Ok(None), "nothing applied yet");
        applied.save(dir.path()).unwrap();
        let mode = std::fs::metadata(dir.path().join(APPLIED_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(Applied::load(dir.path()), Ok(Some(applied)));
    }

    #[test]
    fn a_target_without_capacity_or_a_broken_record_is_an_error_naming_it() {
        let err = Applied::of(&node(r#"{"class":"bare"}"#)).unwrap_err();
        assert!(err.to_string().contains("nodeTemplate.capacity.cpu"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(APPLIED_FILE), "{").unwrap();
        let err = Applied::load(dir.path()).unwrap_err();
        assert!(
            err.contains(APPLIED_FILE) && err.contains("not a valid record"),
            "{err}"
        );
    }
}
