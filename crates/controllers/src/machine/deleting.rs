//! The glue between a machine's reconcile and the deletion flow of [`crate::deletion`].

#[allow(clippy::wildcard_imports)]
use super::*;

/// The deletion flow (phase Terminating, hooks, drain, VolumeAttachments, VM, node, finalizer), see
/// [`crate::deletion`].
pub(super) async fn delete(machine: &Machine, ctx: &Context) -> Result<Action, Error> {
    let name = machine.name_any();
    let class = ctx
        .classes
        .get(&ObjectRef::new(&machine.spec.class.name).within(&ctx.config.namespace));
    let secret = class
        .as_ref()
        .map(|class| merged_secret(ctx, class).0)
        .unwrap_or_default();
    // The node the machine's label names; only a machine without that label (its node never synced) is looked for
    // among all nodes. A scan for every pass of every deletion made scaling down quadratic in the machines.
    let node = match machine.labels().get(keys::labels::NODE) {
        Some(node) => ctx.node(node),
        None => ctx.nodes.as_ref().and_then(|nodes| {
            nodes
                .state()
                .into_iter()
                .find(|node| node.label(keys::labels::NODE_MACHINE_NAME) == Some(name.as_str()))
        }),
    };
    let key = format!("machine/{name}");
    let wrote = |before: Option<String>, after: Option<&str>| ctx.wrote(&key, before, after);
    let requeue = crate::deletion::Deletion {
        machines: ctx.machine_api(),
        target: ctx.target.as_ref(),
        driver: &*ctx.driver,
        class: class.as_deref(),
        secret: &secret,
        node: node.as_deref(),
        settings: &ctx.config.settings,
        recorder: &ctx.recorder,
        memory: &ctx.deletions,
        wrote: &wrote,
        metrics: ctx.metrics.as_deref(),
    }
    .run(machine)
    .await?;
    if requeue.is_none() {
        ctx.memory.change(&name, Attempts::creation_done);
        // A deletion can leave a VM behind (a provider that lost track of it): look for orphans soon.
        if let Some(trigger) = &ctx.orphans {
            trigger.poke();
        }
    }
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}
