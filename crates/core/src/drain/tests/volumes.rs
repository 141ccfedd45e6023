//! Volume tracking, detachment and reattachment.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::Node,
        storage::v1::{
            VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
        },
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use mcm_api::builders::NodeBuilder;
use pretty_assertions::assert_eq;

use super::*;

fn claim_map(entries: &[(&str, &str)]) -> BTreeMap<(String, String), String> {
    entries
        .iter()
        .map(|(claim, pv)| (("default".to_owned(), (*claim).to_owned()), (*pv).to_owned()))
        .collect()
}

#[test]
fn shared_volumes_are_not_tracked() {
    // Reference: "PVs shared by more than one pod on the node are not tracked".
    let a = bound("a").claim("data-a").claim("shared").build();
    let b = bound("b").claim("shared").build();
    let unbound = bound("c").claim("pending").build();
    let pods = [a.clone(), b, unbound.clone()];
    let map = claim_map(&[("data-a", "pv-a"), ("shared", "pv-s")]);
    assert_eq!(pvs_to_track(&a, &pods, &map), ["pv-a"]);
    assert!(
        pvs_to_track(&unbound, &pods, &map).is_empty(),
        "an unbound claim has no volume"
    );
    // Once the other user is gone, the volume is tracked.
    assert_eq!(pvs_to_track(&a, std::slice::from_ref(&a), &map), ["pv-a", "pv-s"]);
}

/// A node reporting `names` attached (`status.volumesAttached`).
fn node_with_volumes(names: &[&str]) -> Node {
    names
        .iter()
        .fold(NodeBuilder::new("node-1"), |node, name| {
            node.attached_volume(name)
        })
        .build()
}

#[test]
fn detach_is_done_when_no_id_appears_in_volumes_attached() {
    let node = node_with_volumes(&[
        "kubernetes.io/csi/ebs.csi.aws.com^vol-0abc",
        "kubernetes.io/aws-ebs/vol-9",
    ]);
    assert!(!volumes_detached(&["vol-0abc".into()], Some(&node)));
    assert!(!volumes_detached(&["vol-9".into(), "vol-x".into()], Some(&node)));
    assert!(volumes_detached(&["vol-x".into()], Some(&node)));
    assert!(
        volumes_detached(&[String::new()], Some(&node)),
        "an empty ID matches nothing"
    );
    assert!(volumes_detached(&["vol-0abc".into()], None), "the node is gone");
    assert!(no_volumes_attached(Some(&node_with_volumes(&[]))));
    assert!(!no_volumes_attached(Some(&node)));
}

fn attachment(pv: &str, node: &str, attached: bool, deleting: bool) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(format!("va-{pv}-{node}")),
            deletion_timestamp: deleting.then(|| Time(at(1))),
            ..ObjectMeta::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: "csi".into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.into()),
                inline_volume_spec: None,
            },
        },
        status: Some(VolumeAttachmentStatus {
            attached,
            ..VolumeAttachmentStatus::default()
        }),
    }
}

#[test]
fn reattach_is_done_when_attached_on_another_node() {
    let vas = [
        attachment("pv-1", "node-1", true, false),
        attachment("pv-1", "node-2", false, false),
    ];
    assert!(
        !volume_reattached("pv-1", "node-1", &vas),
        "not attached yet elsewhere"
    );
    let vas = [attachment("pv-1", "node-2", true, false)];
    assert!(volume_reattached("pv-1", "node-1", &vas));
    assert!(!volume_reattached("pv-2", "node-1", &vas));
}

#[test]
fn live_attachments_are_the_nodes_not_being_deleted() {
    let vas = [
        attachment("pv-1", "node-1", true, false),
        attachment("pv-2", "node-1", true, true),
        attachment("pv-3", "node-2", true, false),
    ];
    let live = live_volume_attachments("node-1", &vas);
    assert_eq!(live.len(), 1);
    assert_eq!(
        live[0].spec.source.persistent_volume_name.as_deref(),
        Some("pv-1")
    );
}
