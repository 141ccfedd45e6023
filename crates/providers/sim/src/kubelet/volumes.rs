//! Volumes, as the attach/detach controller and the CSI attacher keep them: what a node's volumes need given its
//! pods, and the writes that attach (VolumeAttachment, `volumesAttached`) and detach them.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{AttachedVolume, Pod},
        storage::v1::{
            VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
        },
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
};
use serde_json::{Value, json};

use super::{
    bump,
    jobs::{Done, VolumeJob},
    runner::Runner,
    world::{Watched, finished, uid_of},
    writes::is_status,
};

/// The name of a volume in `node.status.volumesAttached` (`kubernetes.io/csi/<driver>^<handle>`, as the CSI
/// attacher names it).
fn attached_volume_name(handle: &str) -> String {
    format!("{}{handle}", attached_volume_prefix())
}

fn attached_volume_prefix() -> String {
    format!("kubernetes.io/csi/{}^", crate::CSI_DRIVER)
}

/// The VolumeAttachment name of a volume on a node: `csi-` and a hash of handle, attacher and node (Kubernetes
/// takes a SHA-256 of the same three; a 64-bit FNV-1a is enough to keep names apart here).
fn attachment_name(handle: &str, node: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in [handle, crate::CSI_DRIVER, node].join("\0").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("csi-{hash:016x}")
}

impl Runner {
    /// What the node's volumes need, if anything: the sim CSI volumes used by its pods that have not finished (and
    /// were not ended) are attached, every other one of its volumes is detached.
    pub(super) fn volume_job(&self, node: &str, pods: &[&Pod]) -> Option<VolumeJob> {
        let world = &self.world;
        if [Watched::Claims, Watched::Volumes, Watched::Attachments]
            .iter()
            .any(|w| !world.synced.contains(w))
        {
            return None;
        }
        let current = self.observed.get(node)?;
        let mut wanted: BTreeMap<String, String> = BTreeMap::new();
        for pod in pods
            .iter()
            .filter(|p| !finished(p) && !world.ended.contains(uid_of(**p)))
        {
            wanted.extend(world.csi_volumes(pod));
        }
        let attachments: Vec<&VolumeAttachment> = world
            .attachments
            .values()
            .filter(|va| va.spec.node_name == node && va.metadata.deletion_timestamp.is_none())
            .collect();
        let pv_of = |va: &VolumeAttachment| va.spec.source.persistent_volume_name.clone();
        let attach: Vec<(String, String)> = wanted
            .iter()
            .filter(|(pv, _)| {
                !attachments.iter().any(|va| {
                    pv_of(va).as_ref() == Some(*pv) && va.status.as_ref().is_some_and(|s| s.attached)
                })
            })
            .map(|(pv, handle)| (pv.clone(), handle.clone()))
            .collect();
        let detach: Vec<(String, String)> = attachments
            .iter()
            .filter(|va| pv_of(va).is_none_or(|pv| !wanted.contains_key(&pv)))
            .map(|va| (va.name_any(), uid_of(*va).to_owned()))
            .collect();
        let prefix = attached_volume_prefix();
        let listed = current
            .status
            .as_ref()
            .and_then(|s| s.volumes_attached.clone())
            .unwrap_or_default();
        let mut have: Vec<&str> = listed
            .iter()
            .map(|v| v.name.as_str())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        have.sort_unstable();
        let mut want: Vec<String> = wanted.values().map(|h| attached_volume_name(h)).collect();
        want.sort_unstable();
        want.dedup();
        let entries = (have != want).then(|| {
            listed
                .iter()
                .filter(|v| !v.name.starts_with(&prefix))
                .cloned()
                .chain(want.iter().map(|name| AttachedVolume {
                    name: name.clone(),
                    device_path: String::new(),
                }))
                .collect()
        });
        (!attach.is_empty() || !detach.is_empty() || entries.is_some()).then(|| VolumeJob {
            node: node.to_owned(),
            attach,
            entries,
            detach,
        })
    }

    /// Attaches, lists and detaches a node's volumes, in this order; stops at the first failure (the next pass
    /// decides again from what the server has).
    pub(super) async fn write_volumes(&self, job: VolumeJob) -> Done {
        let VolumeJob {
            node,
            attach,
            entries,
            detach,
        } = job;
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let mut attached = Vec::new();
        let mut written = None;
        let mut detached = Vec::new();
        let ok = async {
            for (pv, handle) in &attach {
                attached.push(self.attach(&api, &node, pv, handle).await?);
            }
            if let Some(entries) = &entries {
                let list = if entries.is_empty() { Value::Null } else { json!(entries) };
                let patch = Patch::Merge(json!({ "status": { "volumesAttached": list } }));
                match self.nodes.patch_status(&node, &PatchParams::default(), &patch).await {
                    Ok(stored) => {
                        bump(&self.counters.volume_writes);
                        written = Some(Box::new(stored));
                    }
                    Err(err) => {
                        bump(&self.counters.failed_requests);
                        tracing::warn!(node, error = %err, "sim kubelet: writing volumesAttached failed");
                        return None;
                    }
                }
            }
            for (name, uid) in detach {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: Some(uid.clone()),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match api.delete(&name, &params).await {
                    Ok(_) => {
                        bump(&self.counters.volume_writes);
                        detached.push((name, uid));
                    }
                    Err(err) if is_status(&err, 404) || is_status(&err, 409) => detached.push((name, uid)),
                    Err(err) => {
                        bump(&self.counters.failed_requests);
                        tracing::warn!(node, attachment = name, error = %err, "sim kubelet: deleting a VolumeAttachment failed");
                        return None;
                    }
                }
            }
            Some(())
        }
        .await
        .is_some();
        Done::VolumesWritten {
            node,
            attached,
            written,
            detached,
            ok,
        }
    }

    /// Creates the VolumeAttachment of a volume on a node with `status.attached` true (or marks an existing one
    /// attached). `None` when a request failed.
    async fn attach(
        &self,
        api: &Api<VolumeAttachment>,
        node: &str,
        pv: &str,
        handle: &str,
    ) -> Option<VolumeAttachment> {
        let name = attachment_name(handle, node);
        let wanted = VolumeAttachment {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: crate::CSI_DRIVER.to_owned(),
                node_name: node.to_owned(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some(pv.to_owned()),
                    ..VolumeAttachmentSource::default()
                },
            },
            status: Some(VolumeAttachmentStatus {
                attached: true,
                ..VolumeAttachmentStatus::default()
            }),
        };
        let failed = |err: &kube::Error| {
            bump(&self.counters.failed_requests);
            tracing::warn!(node, attachment = name, error = %err, "sim kubelet: attaching a volume failed");
        };
        let current = match api.create(&PostParams::default(), &wanted).await {
            Ok(created) => {
                bump(&self.counters.volume_writes);
                created
            }
            Err(err) if is_status(&err, 409) => match api.get(&name).await {
                Ok(existing) => existing,
                Err(err) => {
                    failed(&err);
                    return None;
                }
            },
            Err(err) => {
                failed(&err);
                return None;
            }
        };
        if current.status.as_ref().is_some_and(|s| s.attached) {
            return Some(current);
        }
        let patch = Patch::Merge(json!({ "status": { "attached": true } }));
        match api.patch_status(&name, &PatchParams::default(), &patch).await {
            Ok(marked) => {
                bump(&self.counters.volume_writes);
                Some(marked)
            }
            Err(err) => {
                failed(&err);
                None
            }
        }
    }
}
