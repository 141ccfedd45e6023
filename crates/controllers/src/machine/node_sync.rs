//! The node sync: labels, taints, annotations and the node finalizer as `mcm_core::nodesync` plans them.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) async fn sync_node(
    machine: &Machine,
    class: &MachineClass,
    node: &Node,
    ctx: &Context,
) -> Result<(), Error> {
    let Some(target) = &ctx.target else { return Ok(()) };
    let api: Api<Node> = Api::all(target.clone());
    let key = format!("node/{}", node.name_any());
    if ctx.stale(&key, node.resource_version().as_deref()) {
        return Ok(());
    }
    let plan = nodesync::plan(&NodeSyncInput::new(machine, Some(class), node));
    let mut node_patch = plan.node_patch.clone();
    // The finalizer rides in the same write, guarded by the node's resourceVersion (see the machine's).
    if let Some(finalizer) =
        mcm_core::finalizers::patch(&node.metadata, keys::finalizers::NODE, FinalizerChange::Add)
    {
        let patch = node_patch.get_or_insert_with(|| json!({}));
        for field in ["finalizers", "resourceVersion"] {
            patch["metadata"][field] = finalizer["metadata"][field].clone();
        }
    }
    if let Some(patch) = node_patch {
        let written = match api
            .patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            // Another writer changed the node first: its watch event brings the machine back here.
            Err(kube::Error::Api(status)) if status.code == 409 => return Ok(()),
            result => result?,
        };
        ctx.wrote(
            &key,
            node.resource_version(),
            written.resource_version().as_deref(),
        );
        crash_point!(MachineNodeSync, &machine.name_any());
    }
    if let Some(patch) = plan.status_patch {
        api.patch_status(&node.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    if let Some(patch) = plan.capacity_annotation_patch {
        api.patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    Ok(())
}
