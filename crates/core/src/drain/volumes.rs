//! Volumes: which PersistentVolumes a drain waits for, and when they are detached or reattached elsewhere.
//!
//! Separate because volume waits are about PersistentVolumes, nodes and VolumeAttachments, after a pod is gone.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    core::v1::{Node, Pod},
    storage::v1::VolumeAttachment,
};
use mcm_api::MetaExt;

use super::pod_selection::{PodRef, claims};

/// The PersistentVolumes to wait for after evicting `pod`: the volumes bound to its claims (`pv_of_claim` maps
/// `(namespace, claim)` to the bound PV), except volumes that another pod in `pods_on_node` also uses (reference:
/// "PVs shared by more than one pod on the node are not tracked"). Sorted, without duplicates.
pub fn pvs_to_track(
    pod: &Pod,
    pods_on_node: &[Pod],
    pv_of_claim: &BTreeMap<(String, String), String>,
) -> Vec<String> {
    let pvs_of = |p: &Pod| -> Vec<String> {
        let namespace = p.metadata.namespace.clone().unwrap_or_default();
        let mut pvs: Vec<String> = claims(p)
            .into_iter()
            .filter_map(|claim| pv_of_claim.get(&(namespace.clone(), claim)).cloned())
            .collect();
        pvs.sort();
        pvs.dedup();
        pvs
    };
    let me = PodRef::of(pod);
    let mut users: BTreeMap<String, usize> = BTreeMap::new();
    for other in pods_on_node.iter().filter(|p| PodRef::of(p) != me) {
        for pv in pvs_of(other) {
            *users.entry(pv).or_default() += 1;
        }
    }
    pvs_of(pod)
        .into_iter()
        .filter(|pv| !users.contains_key(pv))
        .collect()
}

/// Whether the node's attached volume `attached` (an entry of `node.status.volumesAttached`, named e.g.
/// `kubernetes.io/csi/<driver>^<volumeHandle>`) is the volume `volume_id`. The reference matches the ID as an
/// unanchored regular expression; here it is matched as a plain substring (IDs are not patterns), and an empty ID
/// matches nothing (the reference ignores PVs without an ID).
pub fn is_attached_volume(volume_id: &str, attached: &str) -> bool {
    !volume_id.is_empty() && attached.contains(volume_id)
}

/// Whether none of `volume_ids` is attached to `node` any more (`node.status.volumesAttached`); true when the node
/// is gone.
pub fn volumes_detached(volume_ids: &[String], node: Option<&Node>) -> bool {
    let attached = node
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.volumes_attached.as_deref())
        .unwrap_or_default();
    !volume_ids
        .iter()
        .any(|id| attached.iter().any(|a| is_attached_volume(id, &a.name)))
}

/// Whether the PersistentVolume `pv` is attached to a node other than `old_node`: a VolumeAttachment for it with
/// `status.attached` on another node (reference: `status.attached && spec.nodeName != old`).
pub fn volume_reattached(pv: &str, old_node: &str, attachments: &[VolumeAttachment]) -> bool {
    attachments.iter().any(|va| {
        va.spec.source.persistent_volume_name.as_deref() == Some(pv)
            && va.spec.node_name != old_node
            && va.status.as_ref().is_some_and(|s| s.attached)
    })
}

/// The VolumeAttachments of `node` not yet being deleted (reference `getLiveVolumeAttachmentsForNode`), deleted
/// after a force drain.
pub fn live_volume_attachments<'a>(
    node: &str,
    attachments: &'a [VolumeAttachment],
) -> Vec<&'a VolumeAttachment> {
    attachments
        .iter()
        .filter(|va| va.spec.node_name == node && !va.metadata.is_deleting())
        .collect()
}

/// Whether `node.status.volumesAttached` is empty (or the node is gone).
pub fn no_volumes_attached(node: Option<&Node>) -> bool {
    node.and_then(|n| n.status.as_ref())
        .and_then(|s| s.volumes_attached.as_ref())
        .is_none_or(Vec::is_empty)
}
