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
/// its `graceful_shutdown_on` has). kube-runtime holds every reconcile until the controller's store is ready, and
/// its graceful shutdown stops the watch that would make it ready: stopped before the first sync, the work waited
/// for ever (a process stopped or losing its Lease right after start never exited). So a shutdown before the sync
/// (`synced` says whether the controller's store has synced) drops the work, in which no reconcile can have
/// started; after it, the graceful shutdown lets reconciles in flight finish.
pub(crate) async fn until_stopped(
    work: impl Future<Output = ()>,
    synced: impl FnOnce() -> bool,
    shutdown: impl Future<Output = ()>,
) {
    let work = std::pin::pin!(work);
    let shutdown = std::pin::pin!(shutdown);
    if let futures::future::Either::Right(((), work)) = futures::future::select(work, shutdown).await
        && synced()
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

/// A node as the controllers read it (the shared cache): without what no decision reads and a kubelet reports in
/// every node's status (the container images, often its largest part; allocatable, node info, daemon endpoints,
/// config, runtime handlers, features, volumes in use). Capacity (node sync), conditions, addresses and the attached
/// volumes (drain) stay. Nothing writes a cached node back whole (every node write is a patch), so what is dropped
/// here is never lost.
pub(crate) fn lean_node(node: &mut k8s_openapi::api::core::v1::Node) {
    lean(node);
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.allocatable = None;
        status.node_info = None;
        status.daemon_endpoints = None;
        status.config = None;
        status.runtime_handlers = None;
        status.features = None;
        status.volumes_in_use = None;
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
                "annotations": {LAST_APPLIED: "{}", "machinepriority.machine.sapcloud.io": "1"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]
            },
            "spec": {"class": {"kind": "MachineClass", "name": "c"}, "providerID": "sim://1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        lean(&mut machine);
        assert_eq!(machine.metadata.managed_fields, None);
        let annotations = machine.metadata.annotations.clone().unwrap();
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert_eq!(annotations["machinepriority.machine.sapcloud.io"], "1");
        assert_eq!(machine.spec.provider_id, "sim://1");
        assert_eq!(machine.status.unwrap().conditions.len(), 1);
    }

    #[test]
    fn lean_nodes_keep_taints_and_conditions_where_they_are_read() {
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "annotations": {"a": "b"}},
            "spec": {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "images": [{"names": ["registry/image:1"], "sizeBytes": 1}],
                "allocatable": {"cpu": "2"},
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "k",
                    "osImage": "o", "containerRuntimeVersion": "c", "kubeletVersion": "v1.33.0",
                    "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}
            }
        }))
        .unwrap();
        let mut lean = node;
        lean_node(&mut lean);
        let status = lean.status.unwrap();
        assert!(status.images.is_none());
        assert!(status.node_info.is_none() && status.allocatable.is_none());
        assert_eq!(status.conditions.unwrap()[0].type_, "Ready");
        assert_eq!(lean.spec.unwrap().taints.unwrap()[0].key, "k");
        assert_eq!(lean.metadata.annotations.unwrap()["a"], "b");
    }
}
