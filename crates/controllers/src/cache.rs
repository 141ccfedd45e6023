//! Cache readiness, checked the one safe way.

use std::future::Future;

use futures::FutureExt;
use kube::runtime::reflector::Store;

/// Whether a store has synced, without waiting: kube's `Store::wait_until_ready` wakes only the last of several
/// concurrent waiters, so reconciles started together must not await it (docs/pitfalls.md). A reconcile that finds
/// a store not synced requeues shortly instead.
pub(crate) fn synced<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.wait_until_ready().now_or_never().is_some()
}

/// Drives a kube-runtime controller's `work` until it ends, stopping it when `shutdown` resolves (the same signal
/// its `graceful_shutdown_on` has). kube-runtime holds every reconcile until the controller's `store` is ready, and
/// its graceful shutdown stops the watch that would make it ready: stopped before the first sync, the work waited
/// for ever (a process stopped or losing its Lease right after start never exited). So a shutdown before the sync
/// drops the work, in which no reconcile can have started; after it, the graceful shutdown lets reconciles in
/// flight finish.
pub(crate) async fn until_stopped<K>(
    work: impl Future<Output = ()>,
    store: &Store<K>,
    shutdown: impl Future<Output = ()>,
) where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let work = std::pin::pin!(work);
    let shutdown = std::pin::pin!(shutdown);
    if let futures::future::Either::Right(((), work)) = futures::future::select(work, shutdown).await
        && synced(store)
    {
        work.await;
    }
}

/// The annotation `kubectl apply` keeps a copy of the whole object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops from a cached object what no controller reads and real API servers add to every object: `managedFields`
/// and kubectl's last-applied copy (on a busy cluster the largest part of a small object).
pub(crate) fn lean<K: kube::Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// A machine as the set and deployment controllers read it: without the node's conditions and addresses mirrored
/// into its status (read only by the machine controller, whose cache keeps them).
pub(crate) fn lean_machine(machine: &mut mcm_api::Machine) {
    lean(machine);
    if let Some(status) = machine.status.as_mut() {
        status.conditions = Vec::new();
        status.addresses = Vec::new();
    }
}

/// A machine reduced to what ownership and class references need (the overshoot safety, the class finalizer):
/// metadata and `spec.class`.
pub(crate) fn machine_identity(machine: &mut mcm_api::Machine) {
    lean(machine);
    let class = std::mem::take(&mut machine.spec.class);
    machine.spec = mcm_api::MachineSpec {
        class,
        ..mcm_api::MachineSpec::default()
    };
    machine.status = None;
}

/// A node as the deployment controller reads it (labels, annotations, taints, resourceVersion, and of its status only
/// the `InPlaceUpdate` condition, which an in-place rollout reads).
pub(crate) fn node_marks(node: &mut k8s_openapi::api::core::v1::Node) {
    lean(node);
    let in_place: Vec<_> = node
        .status
        .take()
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ == mcm_api::keys::node_conditions::IN_PLACE_UPDATE)
        .collect();
    node.status = (!in_place.is_empty()).then(|| k8s_openapi::api::core::v1::NodeStatus {
        conditions: Some(in_place),
        ..Default::default()
    });
}

/// A node as the machine controller reads it: without the container images the kubelet lists (often the largest
/// part of a node's status, and never read).
pub(crate) fn lean_node(node: &mut k8s_openapi::api::core::v1::Node) {
    lean(node);
    if let Some(status) = node.status.as_mut() {
        status.images = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lean_objects_keep_what_the_controllers_read() {
        let mut machine: mcm_api::Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "Machine",
            "metadata": {
                "name": "m", "namespace": "ns", "resourceVersion": "7",
                "labels": {"name": "d"},
                "annotations": {LAST_APPLIED: "{}", "machinepriority.machine.sapcloud.io": "1"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
                "ownerReferences": [{"apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet",
                    "name": "s", "uid": "u", "controller": true}]
            },
            "spec": {"class": {"kind": "MachineClass", "name": "c"}, "providerID": "sim://1"},
            "status": {
                "currentStatus": {"phase": "Running"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]
            }
        }))
        .unwrap();
        let mut set_view = machine.clone();
        lean_machine(&mut set_view);
        assert_eq!(set_view.metadata.managed_fields, None);
        let annotations = set_view.metadata.annotations.clone().unwrap();
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert_eq!(annotations["machinepriority.machine.sapcloud.io"], "1");
        assert_eq!(set_view.phase(), Some(mcm_api::MachinePhase::Running));
        assert_eq!(set_view.spec.provider_id, "sim://1");
        assert!(set_view.status.as_ref().unwrap().conditions.is_empty());
        assert!(set_view.status.as_ref().unwrap().addresses.is_empty());

        machine_identity(&mut machine);
        assert_eq!(machine.spec.class.name, "c");
        assert!(machine.spec.provider_id.is_empty());
        assert!(machine.status.is_none());
        assert_eq!(machine.metadata.owner_references.as_ref().unwrap()[0].name, "s");
        assert_eq!(machine.metadata.labels.as_ref().unwrap()["name"], "d");
        assert_eq!(machine.metadata.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn lean_nodes_keep_taints_and_conditions_where_they_are_read() {
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "annotations": {"a": "b"}},
            "spec": {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "images": [{"names": ["registry/image:1"], "sizeBytes": 1}]
            }
        }))
        .unwrap();
        let mut in_place = node.clone();
        in_place
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(k8s_openapi::api::core::v1::NodeCondition {
                type_: mcm_api::keys::node_conditions::IN_PLACE_UPDATE.into(),
                status: "True".into(),
                reason: Some("UpdateSuccessful".into()),
                ..Default::default()
            });
        node_marks(&mut in_place);
        let kept = in_place.status.unwrap().conditions.unwrap();
        assert_eq!(kept.len(), 1, "only the InPlaceUpdate condition: {kept:?}");
        assert_eq!(kept[0].reason.as_deref(), Some("UpdateSuccessful"));
        let mut marks = node.clone();
        node_marks(&mut marks);
        assert!(marks.status.is_none());
        assert_eq!(marks.spec.unwrap().taints.unwrap()[0].key, "k");
        let mut lean = node;
        lean_node(&mut lean);
        let status = lean.status.unwrap();
        assert!(status.images.is_none());
        assert_eq!(status.conditions.unwrap()[0].type_, "Ready");
    }
}
