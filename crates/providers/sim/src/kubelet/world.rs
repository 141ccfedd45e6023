//! What the watches report of pods, claims, volumes and the sim driver's VolumeAttachments, and what the kubelet
//! did that the watches may not show yet; with the keyed-map helpers that keep late events from undoing it.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::VolumeAttachment,
};
use kube::{Resource, ResourceExt as _};
use tokio::time::Instant;

use super::{runner::Scope, watch::Seen};

/// A namespaced object's namespace and name.
pub(super) type PodKey = (String, String);

pub(super) fn namespaced_key<K: Resource>(object: &K) -> (String, String) {
    let meta = object.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

pub(super) fn uid_of<K: Resource>(object: &K) -> &str {
    object.meta().uid.as_deref().unwrap_or_default()
}

fn version_of<K: Resource>(object: &K) -> Option<u64> {
    object
        .meta()
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
}

/// Stores `object` under `key` unless the stored version is newer (a late watch event after the kubelet's own
/// write).
pub(super) fn store<Q: std::hash::Hash + Eq, K: Resource>(map: &mut HashMap<Q, K>, key: Q, object: K) {
    if map
        .get(&key)
        .is_some_and(|current| version_of(current) > version_of(&object))
    {
        return;
    }
    map.insert(key, object);
}

/// Removes the object under `key` if it is the one deleted (same uid; a new object of the same name stays).
fn forget<Q: std::hash::Hash + Eq, K: Resource>(map: &mut HashMap<Q, K>, key: &Q, deleted: &K) {
    if map
        .get(key)
        .is_some_and(|current| uid_of(current) == uid_of(deleted))
    {
        map.remove(key);
    }
}

/// Applies a watch event to a map of objects.
pub(super) fn apply_keyed<Q: std::hash::Hash + Eq, K: Resource>(
    map: &mut HashMap<Q, K>,
    event: Seen<K>,
    key: impl Fn(&K) -> Q,
) {
    match event {
        Seen::Reset(objects, _) => {
            *map = objects.into_iter().map(|o| (key(&o), o)).collect();
        }
        Seen::Applied(object) => store(map, key(&object), object),
        Seen::Deleted(object) => forget(map, &key(&object), &object),
    }
}

/// The node a pod is bound to.
pub(super) fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

pub(super) fn pod_phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// A pod that has finished (its volumes are unmounted).
pub(super) fn finished(pod: &Pod) -> bool {
    matches!(pod_phase(pod), Some("Succeeded" | "Failed"))
}

/// The pod-related watches. Nothing is decided on one before it has listed once (an empty map is not an empty
/// cluster).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Watched {
    Pods,
    Claims,
    Volumes,
    Attachments,
}

/// Pods, claims, volumes and the sim driver's VolumeAttachments as the watches report them, and what the kubelet
/// did that the watches may not show yet.
#[derive(Default)]
pub(super) struct World {
    pub(super) pods: HashMap<PodKey, Pod>,
    pub(super) claims: HashMap<(String, String), PersistentVolumeClaim>,
    pub(super) volumes: HashMap<String, PersistentVolume>,
    /// VolumeAttachments of the sim CSI driver, by name.
    pub(super) attachments: HashMap<String, VolumeAttachment>,
    /// uids of the pods the kubelet ended, until the watch reports them deleted: a late event does not bring such a
    /// pod back, and one kept by finalizers is neither deleted again nor counted as using its volumes.
    pub(super) ended: HashSet<String>,
    /// uids of the VolumeAttachments the kubelet deleted, until the watch reports them deleted.
    pub(super) detached: HashSet<String>,
    /// The watches that have listed once.
    pub(super) synced: HashSet<Watched>,
    /// After a failed pod or volume request: no such request before this.
    pub(super) retry_at: Option<Instant>,
}

impl World {
    /// Records a pod watch event; returns the node the pod is bound to.
    pub(super) fn apply_pod(&mut self, event: Seen<Pod>, scope: &mut Scope) -> Option<String> {
        match event {
            Seen::Reset(pods, _) => {
                self.pods = pods.into_iter().map(|p| (namespaced_key(&p), p)).collect();
                let uids: HashSet<&str> = self.pods.values().map(uid_of).collect();
                self.ended.retain(|uid| uids.contains(uid.as_str()));
                self.synced.insert(Watched::Pods);
                *scope = Scope::All;
                None
            }
            Seen::Applied(pod) => {
                let node = bound_node(&pod).map(str::to_owned);
                let key = namespaced_key(&pod);
                let held = self.pods.get(&key).is_some_and(|p| uid_of(p) == uid_of(&pod));
                // A late event about a pod the kubelet ended (and forgot) does not bring it back.
                if held || !self.ended.contains(uid_of(&pod)) {
                    store(&mut self.pods, key, pod);
                }
                node
            }
            Seen::Deleted(pod) => {
                self.ended.remove(uid_of(&pod));
                forget(&mut self.pods, &namespaced_key(&pod), &pod);
                bound_node(&pod).map(str::to_owned)
            }
        }
    }

    /// Records a VolumeAttachment watch event (only the sim driver's are kept); returns the node it is for.
    pub(super) fn apply_attachment(
        &mut self,
        event: Seen<VolumeAttachment>,
        scope: &mut Scope,
    ) -> Option<String> {
        let ours = |va: &VolumeAttachment| va.spec.attacher == crate::CSI_DRIVER;
        match event {
            Seen::Reset(attachments, _) => {
                self.attachments = attachments
                    .into_iter()
                    .filter(ours)
                    .map(|va| (va.name_any(), va))
                    .collect();
                let uids: HashSet<&str> = self.attachments.values().map(uid_of).collect();
                self.detached.retain(|uid| uids.contains(uid.as_str()));
                self.synced.insert(Watched::Attachments);
                *scope = Scope::All;
                None
            }
            Seen::Applied(va) if ours(&va) => {
                let node = va.spec.node_name.clone();
                if !self.detached.contains(uid_of(&va)) {
                    store(&mut self.attachments, va.name_any(), va);
                }
                Some(node)
            }
            Seen::Deleted(va) if ours(&va) => {
                self.detached.remove(uid_of(&va));
                forget(&mut self.attachments, &va.name_any(), &va);
                Some(va.spec.node_name)
            }
            Seen::Applied(_) | Seen::Deleted(_) => None,
        }
    }

    /// The CSI volumes of the sim driver a pod uses: (PersistentVolume name, volume handle), through its claims
    /// (`persistentVolumeClaim` volumes and generic ephemeral volumes, whose claim is `<pod>-<volume>`) and the
    /// volumes they are bound to.
    pub(super) fn csi_volumes(&self, pod: &Pod) -> Vec<(String, String)> {
        let (namespace, pod_name) = namespaced_key(pod);
        pod.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|volume| {
                let claim = match (&volume.persistent_volume_claim, &volume.ephemeral) {
                    (Some(source), _) => source.claim_name.clone(),
                    (None, Some(_)) => format!("{pod_name}-{}", volume.name),
                    (None, None) => return None,
                };
                let pv = self
                    .claims
                    .get(&(namespace.clone(), claim))?
                    .spec
                    .as_ref()?
                    .volume_name
                    .clone()
                    .filter(|n| !n.is_empty())?;
                let csi = self.volumes.get(&pv)?.spec.as_ref()?.csi.as_ref()?;
                (csi.driver == crate::CSI_DRIVER && !csi.volume_handle.is_empty())
                    .then(|| (pv, csi.volume_handle.clone()))
            })
            .collect()
    }
}
