//! The jobs of a pass (one API job each), their outcomes, and how the runner executes them and records what they
//! did.

use k8s_openapi::api::{
    core::v1::{AttachedVolume, Node, NodeStatus, Pod},
    storage::v1::VolumeAttachment,
};
use kube::{
    ResourceExt as _,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tokio::time::Instant;

use super::{
    bump,
    runner::{Runner, Track},
    world::{PodKey, namespaced_key, store, uid_of},
    writes::is_status,
};

/// One API job of a pass.
pub(super) enum Job {
    Register {
        vm_id: u64,
        node: Box<Node>,
    },
    Renew {
        name: String,
        uid: String,
    },
    Status {
        name: String,
        status: Box<NodeStatus>,
    },
    /// Mark a pending pod Running and Ready.
    StartPod {
        key: PodKey,
        resource_version: String,
    },
    /// Delete a pod whose grace period has passed, with grace 0.
    EndPod {
        key: PodKey,
        uid: String,
    },
    /// Bring a node's volumes in step with its pods.
    Volumes(Box<VolumeJob>),
    /// Update the node's VM in place and report the result (`update-result`).
    InPlaceUpdate {
        name: String,
        vm_id: u64,
        /// The namespace and name of the VM's machine.
        machine: (String, String),
    },
}

/// What a node's volumes need: VolumeAttachments to create (or mark attached), the new `volumesAttached` list,
/// VolumeAttachments to delete. Done in this order.
pub(super) struct VolumeJob {
    pub(super) node: String,
    /// (PersistentVolume name, volume handle) to attach.
    pub(super) attach: Vec<(String, String)>,
    /// The node's `status.volumesAttached` to write, when it changes.
    pub(super) entries: Option<Vec<AttachedVolume>>,
    /// (name, uid) of the VolumeAttachments to delete.
    pub(super) detach: Vec<(String, String)>,
}

/// The outcome of a job.
pub(super) enum Done {
    Registered {
        name: String,
        vm_id: u64,
        node: Box<Node>,
        lease_ok: bool,
    },
    RegisterFailed {
        name: String,
    },
    Renewed {
        name: String,
        ok: bool,
    },
    StatusWritten {
        name: String,
        node: Option<Box<Node>>,
        gone: bool,
    },
    PodStarted {
        pod: Option<Box<Pod>>,
        ok: bool,
    },
    PodEnded {
        key: PodKey,
        uid: String,
        /// The pod as it still is (held by finalizers), if it is.
        left: Option<Box<Pod>>,
        ok: bool,
    },
    VolumesWritten {
        node: String,
        attached: Vec<VolumeAttachment>,
        written: Option<Box<Node>>,
        /// (name, uid) of the VolumeAttachments deleted.
        detached: Vec<(String, String)>,
        ok: bool,
    },
    /// An in-place update's result was reported (`node` as written), or not (`None`: tried again).
    InPlaceUpdated {
        name: String,
        node: Option<Box<Node>>,
    },
}

impl Runner {
    /// Records the outcomes of a pass's jobs; returns when to run again at the latest.
    pub(super) fn settle(&mut self, done: Vec<Done>, mut wake: Instant) -> Instant {
        let now = Instant::now();
        let interval = self.config.heartbeat_interval;
        let mut pods_failed = false;
        for outcome in done {
            match outcome {
                Done::Registered {
                    name,
                    vm_id,
                    node,
                    lease_ok,
                } => {
                    self.retries.remove(&name);
                    let next_renew = now + if lease_ok { interval } else { self.retry_delay };
                    wake = wake.min(next_renew);
                    self.tracks.insert(
                        name.clone(),
                        Track {
                            vm_id,
                            uid: node.metadata.uid.clone().unwrap_or_default(),
                            next_renew,
                            status_retry_at: None,
                            gone: false,
                            wanted: None,
                        },
                    );
                    self.observe(&name, *node);
                }
                Done::RegisterFailed { name } => {
                    let at = now + self.retry_delay;
                    self.retries.insert(name, at);
                    wake = wake.min(at);
                }
                Done::Renewed { name, ok } => {
                    if let Some(track) = self.tracks.get_mut(&name) {
                        track.next_renew = now + if ok { interval } else { self.retry_delay };
                        wake = wake.min(track.next_renew);
                    }
                }
                Done::StatusWritten { name, node, gone } => {
                    if let Some(track) = self.tracks.get_mut(&name) {
                        if gone {
                            track.gone = true;
                        } else if node.is_none() {
                            let at = now + self.retry_delay;
                            track.status_retry_at = Some(at);
                            wake = wake.min(at);
                        } else {
                            track.status_retry_at = None;
                        }
                    }
                    if let Some(node) = node {
                        self.observe(&name, *node);
                    }
                }
                Done::InPlaceUpdated { name, node } => {
                    if let Some(track) = self.tracks.get_mut(&name) {
                        // The VM changed: the status it should report is computed again.
                        track.wanted = None;
                    }
                    match node {
                        Some(node) => self.observe(&name, *node),
                        None => wake = wake.min(now + self.retry_delay),
                    }
                }
                Done::PodStarted { .. } | Done::PodEnded { .. } | Done::VolumesWritten { .. } => {
                    let (ok, look_again) = self.settle_pod_work(outcome);
                    pods_failed |= !ok;
                    if look_again {
                        wake = now;
                    }
                }
            }
        }
        self.world.retry_at = pods_failed.then(|| now + self.retry_delay);
        if let Some(at) = self.world.retry_at {
            wake = wake.min(at);
        }
        wake
    }

    /// Records the outcome of a pod or volume job: whether it succeeded, and whether to look again at once (a pod
    /// ended: its volumes may be detached now).
    fn settle_pod_work(&mut self, outcome: Done) -> (bool, bool) {
        match outcome {
            Done::PodStarted { pod, ok } => {
                if let Some(pod) = pod {
                    store(&mut self.world.pods, namespaced_key(&*pod), *pod);
                }
                (ok, false)
            }
            Done::PodEnded { key, uid, left, ok } => {
                if ok {
                    match left {
                        Some(pod) => store(&mut self.world.pods, key, *pod),
                        None => {
                            if self.world.pods.get(&key).is_some_and(|p| uid_of(p) == uid) {
                                self.world.pods.remove(&key);
                            }
                        }
                    }
                    self.world.ended.insert(uid);
                }
                (ok, ok)
            }
            Done::VolumesWritten {
                node,
                attached,
                written,
                detached,
                ok,
            } => {
                for va in attached {
                    store(&mut self.world.attachments, va.name_any(), va);
                }
                if let Some(written) = written {
                    self.observe(&node, *written);
                }
                for (name, uid) in detached {
                    if self
                        .world
                        .attachments
                        .get(&name)
                        .is_some_and(|va| uid_of(va) == uid)
                    {
                        self.world.attachments.remove(&name);
                    }
                    self.world.detached.insert(uid);
                }
                (ok, false)
            }
            Done::Registered { .. }
            | Done::RegisterFailed { .. }
            | Done::Renewed { .. }
            | Done::StatusWritten { .. }
            | Done::InPlaceUpdated { .. } => (true, false),
        }
    }

    pub(super) async fn execute(&self, job: Job) -> Done {
        match job {
            Job::Register { vm_id, node } => {
                let name = node.metadata.name.clone().unwrap_or_default();
                match self.register(&name, &node).await {
                    Some(stored) => {
                        let uid = stored.metadata.uid.clone().unwrap_or_default();
                        let lease_ok = self.write_lease(&name, &uid, true).await;
                        Done::Registered {
                            name,
                            vm_id,
                            node: Box::new(stored),
                            lease_ok,
                        }
                    }
                    None => Done::RegisterFailed { name },
                }
            }
            Job::Renew { name, uid } => {
                let ok = self.write_lease(&name, &uid, false).await;
                Done::Renewed { name, ok }
            }
            Job::Status { name, status } => {
                let patch = Patch::Merge(json!({ "status": status }));
                match self
                    .nodes
                    .patch_status(&name, &PatchParams::default(), &patch)
                    .await
                {
                    Ok(node) => {
                        bump(&self.counters.node_status_writes);
                        Done::StatusWritten {
                            name,
                            node: Some(Box::new(node)),
                            gone: false,
                        }
                    }
                    Err(err) => {
                        bump(&self.counters.failed_requests);
                        let gone = is_status(&err, 404);
                        if !gone {
                            tracing::warn!(node = name, error = %err, "sim kubelet: node status write failed");
                        }
                        Done::StatusWritten {
                            name,
                            node: None,
                            gone,
                        }
                    }
                }
            }
            Job::StartPod {
                key,
                resource_version,
            } => self.start_pod(&key, &resource_version).await,
            Job::EndPod { key, uid } => self.end_pod(key, uid).await,
            Job::Volumes(job) => self.write_volumes(*job).await,
            Job::InPlaceUpdate {
                name,
                vm_id,
                machine: (namespace, machine),
            } => self.update_in_place(name, vm_id, namespace, machine).await,
        }
    }
}
