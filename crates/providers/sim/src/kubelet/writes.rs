//! The kubelet's API writes for nodes, Leases and pods: register (or adopt) a node, create or renew its Lease, start
//! a pending pod, end a deleting one. Each counts what it wrote and what failed.

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
};
use mcm_core::node_report::NodeLease;
use serde_json::{Value, json};

use super::{AGENT_TERMINATES_PODS, bump, jobs::Done, runner::Runner, world::PodKey};

pub(super) fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

impl Runner {
    /// Marks a pending pod Running and Ready (guarded by its resourceVersion: a pod changed meanwhile is left to
    /// the next pass, which sees the change).
    pub(super) async fn start_pod(&self, key: &PodKey, resource_version: &str) -> Done {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        let now = Time(jiff::Timestamp::now());
        let conditions: Vec<Value> = ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
            .into_iter()
            .map(|type_| json!({ "type": type_, "status": "True", "lastTransitionTime": now }))
            .collect();
        let patch = json!({
            "metadata": { "resourceVersion": resource_version },
            "status": { "phase": "Running", "startTime": now, "conditions": conditions },
        });
        match api
            .patch_status(&key.1, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(pod) => {
                bump(&self.counters.pods_started);
                Done::PodStarted {
                    pod: Some(Box::new(pod)),
                    ok: true,
                }
            }
            // Changed or gone meanwhile: the watch brings the news.
            Err(err) if is_status(&err, 409) || is_status(&err, 404) => {
                Done::PodStarted { pod: None, ok: true }
            }
            Err(err) => {
                bump(&self.counters.failed_requests);
                tracing::warn!(namespace = key.0, pod = key.1, error = %err, "sim kubelet: starting a pod failed");
                Done::PodStarted { pod: None, ok: false }
            }
        }
    }

    /// Ends a pod whose grace period has passed: a deletion with grace 0, for this pod only (uid precondition).
    pub(super) async fn end_pod(&self, key: PodKey, uid: String) -> Done {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&key.1, &params).await {
            Ok(outcome) => {
                bump(&self.counters.pods_ended);
                tracing::debug!(namespace = key.0, pod = key.1, "sim kubelet: pod ended");
                Done::PodEnded {
                    key,
                    uid,
                    left: outcome.left().map(Box::new),
                    ok: true,
                }
            }
            // Gone already, or another pod of that name by now.
            Err(err) if is_status(&err, 404) || is_status(&err, 409) => Done::PodEnded {
                key,
                uid,
                left: None,
                ok: true,
            },
            Err(err) => {
                bump(&self.counters.failed_requests);
                tracing::warn!(namespace = key.0, pod = key.1, error = %err, "sim kubelet: ending a pod failed");
                Done::PodEnded {
                    key,
                    uid,
                    left: None,
                    ok: false,
                }
            }
        }
    }

    /// Creates the node, or adopts an existing one of the same name that is not being deleted.
    pub(super) async fn register(&self, name: &str, node: &Node) -> Option<Node> {
        match self.nodes.create(&PostParams::default(), node).await {
            Ok(stored) => {
                bump(&self.counters.node_creates);
                tracing::debug!(node = name, "sim kubelet: node registered");
                Some(stored)
            }
            Err(err) if is_status(&err, 409) => match self.nodes.get(name).await {
                Ok(existing) if existing.metadata.deletion_timestamp.is_none() => {
                    tracing::debug!(node = name, "sim kubelet: existing node adopted");
                    if existing
                        .annotations()
                        .get(AGENT_TERMINATES_PODS)
                        .map(String::as_str)
                        == Some("true")
                    {
                        return Some(existing);
                    }
                    // The adopted node says from now on that this kubelet ends its pods.
                    let patch = json!({ "metadata": { "annotations": { AGENT_TERMINATES_PODS: "true" } } });
                    match self
                        .nodes
                        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                    {
                        Ok(annotated) => Some(annotated),
                        Err(err) => {
                            bump(&self.counters.failed_requests);
                            tracing::warn!(node = name, error = %err, "sim kubelet: annotating an adopted node failed");
                            None
                        }
                    }
                }
                Ok(_) => None,
                Err(err) => {
                    bump(&self.counters.failed_requests);
                    tracing::warn!(node = name, error = %err, "sim kubelet: reading an existing node failed");
                    None
                }
            },
            Err(err) => {
                bump(&self.counters.failed_requests);
                tracing::warn!(node = name, error = %err, "sim kubelet: node registration failed");
                None
            }
        }
    }

    /// Creates or renews the node's Lease; false when it failed.
    pub(super) async fn write_lease(&self, name: &str, uid: &str, create_first: bool) -> bool {
        let lease = NodeLease::new(name, uid, self.config.lease_duration, jiff::Timestamp::now());
        if create_first {
            match self.leases.create(&PostParams::default(), &lease.lease()).await {
                Ok(_) => {
                    bump(&self.counters.lease_creates);
                    return true;
                }
                Err(err) if is_status(&err, 409) => {}
                Err(err) => {
                    bump(&self.counters.failed_requests);
                    tracing::warn!(node = name, error = %err, "sim kubelet: lease creation failed");
                    return false;
                }
            }
            return self.renew_lease(name, &lease, false).await;
        }
        self.renew_lease(name, &lease, true).await
    }

    /// Renews the Lease with a merge patch; creates it when it is missing and `create_missing`.
    async fn renew_lease(&self, name: &str, lease: &NodeLease, create_missing: bool) -> bool {
        let patch = Patch::Merge(lease.renewal_patch());
        match self.leases.patch(name, &PatchParams::default(), &patch).await {
            Ok(_) => {
                bump(&self.counters.lease_renewals);
                true
            }
            Err(err) if is_status(&err, 404) && create_missing => {
                match self.leases.create(&PostParams::default(), &lease.lease()).await {
                    Ok(_) => {
                        bump(&self.counters.lease_creates);
                        true
                    }
                    Err(err) => {
                        bump(&self.counters.failed_requests);
                        tracing::warn!(node = name, error = %err, "sim kubelet: lease creation failed");
                        false
                    }
                }
            }
            Err(err) => {
                bump(&self.counters.failed_requests);
                tracing::warn!(node = name, error = %err, "sim kubelet: lease renewal failed");
                false
            }
        }
    }
}
