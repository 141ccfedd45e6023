//! The MachineDeployment controller's acts for the cluster-autoscaler (decisions in `mcm_core::autoscaler`): the
//! trigger-deletion handshake and the node marks of a rollout.

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    runtime::reflector::{ObjectRef, Store},
};
use mcm_api::{Machine, MachineDeployment, MetaExt, keys::annotations};
use mcm_core::autoscaler;
use serde_json::json;

use crate::Error;

/// Runs the trigger-deletion handshake: stamps the listed machines and rewrites the deployment's annotations. Returns
/// whether a machine was stamped in this pass; the caller then scales nothing until its cache has seen the stamps, so
/// that the set controller deletes the machines the autoscaler chose and no other.
pub(super) async fn handshake<'a>(
    deployment: &MachineDeployment,
    machine: impl Fn(&str) -> Option<&'a Machine>,
    machine_api: &Api<Machine>,
    deployment_api: &Api<MachineDeployment>,
    now: jiff::Timestamp,
) -> Result<bool, Error> {
    let Some(plan) = autoscaler::trigger_deletion(deployment, machine, now) else {
        return Ok(false);
    };
    for (name, patch) in &plan.mark {
        tracing::info!(deployment = %deployment.metadata.name.as_deref().unwrap_or_default(), machine = %name,
            "marking the machine for deletion as the cluster-autoscaler asked");
        match machine_api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => return Err(err.into()),
        }
    }
    if !plan.deployment_annotations.is_empty() {
        deployment_api
            .patch(
                deployment.metadata.name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "annotations": plan.deployment_annotations } })),
            )
            .await?;
    }
    Ok(!plan.mark.is_empty())
}

/// Whether the machine's node keeps the scale-down annotations after a rollout because the machine is preserved.
fn preserved(machine: &Machine, now: jiff::Timestamp) -> bool {
    machine.is_preserved(now)
        || machine
            .annotation(annotations::PRESERVE)
            .is_some_and(|v| !v.is_empty() && v != "false")
}

/// What marking the nodes came to.
#[derive(Debug, Default)]
pub(super) struct Marked {
    /// A wanted node is not in the cache yet, or a patch met a concurrent change: look again soon.
    pub(super) retry_soon: bool,
}

/// Gives every node of the deployment's machines its marks: `(machine, belongs to an old set)` pairs, `rolling_out`
/// while old sets have machines, `annotate` as `--autoscaler-scaledown-annotation-during-rollout`.
pub(super) async fn mark_nodes(
    target: &Client,
    nodes: &Store<Node>,
    machines: &[(&Machine, bool)],
    rolling_out: bool,
    annotate: bool,
    now: jiff::Timestamp,
) -> Result<Marked, Error> {
    let api: Api<Node> = Api::all(target.clone());
    let mut marked = Marked::default();
    for (machine, old) in machines {
        let Some(node_name) = machine.node_name() else {
            continue;
        };
        let Some(node) = nodes.get(&ObjectRef::new(node_name)) else {
            marked.retry_soon |= rolling_out;
            continue;
        };
        let marks = autoscaler::node_marks(autoscaler::NodeSituation {
            rolling_out,
            old_machine: *old,
            annotate,
            preserved: preserved(machine, now),
        });
        let Some(patch) = autoscaler::node_patch(&node, marks) else {
            continue;
        };
        tracing::debug!(node = %node_name, rolling_out, old = *old, "marking the node for the rollout");
        match api
            .patch(node_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                crash_point!(RolloutNodeMarks, node_name);
            }
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                marked.retry_soon = true;
            }
            Err(err) => return Err(err.into()),
        }
    }
    Ok(marked)
}
