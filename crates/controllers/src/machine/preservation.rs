//! The preservation act: the writes of `mcm_core::preservation::plan`, in the reference's order. Preserving: the
//! expiry first, then the node's autoscaler annotations and taint, the drain of a Failed machine's node, the node's
//! `Preserved` condition, and the machine's annotations. Stopping: the condition, the node's annotations and taint,
//! the machine's annotations, and the expiry last (an interrupted stop is finished by the next reconcile).

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::drain::DrainPass;
use mcm_core::{
    drain,
    preservation::{self, Decision, DrainResult, PreservationInput},
};

/// How soon a preservation whose node write met a newer version (409) or whose drain goes on looks again.
const PRESERVATION_RETRY: Duration = Duration::from_secs(1);

/// Preserves `machine`, or stops its preservation, as its annotations and its node's say; returns when to look
/// again (the expiry, a drain under way), `None` when only events matter.
pub(super) async fn manage_preservation(
    machine: &Machine,
    node: Option<&Node>,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Result<Option<Duration>, Error> {
    let name = machine.name_any();
    // An earlier step of this reconcile wrote the machine or the node: decide on the versions that follow.
    if ctx.stale(&format!("machine/{name}"), machine.resource_version().as_deref())
        || node.is_some_and(|n| ctx.stale(&format!("node/{}", n.name_any()), n.resource_version().as_deref()))
    {
        return Ok(Some(PRESERVATION_RETRY));
    }
    let effective = mcm_core::effective_settings(machine, &ctx.config.settings);
    let plan = preservation::plan(&PreservationInput {
        machine,
        node,
        timeout: effective.preserve_timeout,
        now,
    });
    for warning in &plan.warnings {
        tracing::warn!(machine = %name, "{warning}");
    }
    let Some(decision) = plan.decision else {
        return Ok(None);
    };
    let mut requeue = plan.requeue_after;
    match decision {
        Decision::Untouched => return Ok(None),
        Decision::Preserve(value) => {
            let expiry = match plan.expiry {
                Some(Some(expiry)) => {
                    write_expiry(machine, Some(expiry), ctx).await?;
                    tracing::info!(machine = %name, value = value.as_str(), until = %expiry, "machine preserved");
                    expiry
                }
                _ => machine.preserve_expiry().unwrap_or(now),
            };
            if let Some(node) = node {
                if !patch_node(node, plan.node_patch.as_ref(), ctx).await? {
                    return Ok(Some(PRESERVATION_RETRY));
                }
                let result = if plan.drain {
                    match drain_preserved(machine, node, &effective, ctx, now).await {
                        Some(result) => result,
                        None => return Ok(Some(effective.evict_retry_interval.max(PRESERVATION_RETRY))),
                    }
                } else {
                    DrainResult::NotNeeded
                };
                if result == DrainResult::Failed {
                    requeue = Some(effective.evict_retry_interval.max(PRESERVATION_RETRY));
                }
                let existing = preservation::preserved_condition_of(node);
                if let Some(condition) =
                    preservation::preserved_condition(machine.phase(), value, expiry, existing, result, now)
                {
                    write_condition(node, &condition, ctx).await?;
                }
            }
            patch_machine(machine, plan.machine_patch.as_ref(), ctx).await?;
        }
        Decision::Stop { forget } => {
            if let Some(node) = node {
                if let Some(condition) = &plan.stopped_condition {
                    write_condition(node, condition, ctx).await?;
                }
                if !patch_node(node, plan.node_patch.as_ref(), ctx).await? {
                    return Ok(Some(PRESERVATION_RETRY));
                }
            }
            patch_machine(machine, plan.machine_patch.as_ref(), ctx).await?;
            if plan.expiry == Some(None) {
                write_expiry(machine, None, ctx).await?;
                tracing::info!(machine = %name, forget, "machine preservation stopped");
            }
        }
    }
    Ok(requeue)
}

/// Writes or clears `status.currentStatus.preserveExpiryTime`.
async fn write_expiry(
    machine: &Machine,
    expiry: Option<jiff::Timestamp>,
    ctx: &Context,
) -> Result<(), Error> {
    let name = machine.name_any();
    let written = ctx
        .machine_api()
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(preservation::expiry_patch(expiry)),
        )
        .await?;
    ctx.wrote(
        &format!("machine/{name}"),
        machine.resource_version(),
        written.resource_version().as_deref(),
    );
    Ok(())
}

/// Applies the machine's annotation patch.
async fn patch_machine(
    machine: &Machine,
    patch: Option<&serde_json::Value>,
    ctx: &Context,
) -> Result<(), Error> {
    let Some(patch) = patch else { return Ok(()) };
    let name = machine.name_any();
    let written = ctx
        .machine_api()
        .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    ctx.wrote(
        &format!("machine/{name}"),
        machine.resource_version(),
        written.resource_version().as_deref(),
    );
    Ok(())
}

/// Applies the node's patch; `false` when the node changed meanwhile (409: its event brings the machine back).
async fn patch_node(node: &Node, patch: Option<&serde_json::Value>, ctx: &Context) -> Result<bool, Error> {
    let (Some(patch), Some(target)) = (patch, &ctx.target) else {
        return Ok(true);
    };
    let api: Api<Node> = Api::all(target.clone());
    let written = match api
        .patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 409 => return Ok(false),
        result => result?,
    };
    ctx.wrote(
        &format!("node/{}", node.name_any()),
        node.resource_version(),
        written.resource_version().as_deref(),
    );
    Ok(true)
}

/// Writes the node's `Preserved` condition (strategic merge by type: the kubelet's conditions stay).
async fn write_condition(node: &Node, condition: &NodeCondition, ctx: &Context) -> Result<(), Error> {
    let Some(target) = &ctx.target else { return Ok(()) };
    let api: Api<Node> = Api::all(target.clone());
    api.patch_status(
        &node.name_any(),
        &PatchParams::default(),
        &Patch::Strategic(preservation::condition_patch(condition)),
    )
    .await?;
    Ok(())
}

/// One pass of the drain of a preserved Failed machine's node (DaemonSet pods stay; no cordon: the taint keeps new
/// pods away). `None` while it goes on.
async fn drain_preserved(
    machine: &Machine,
    node: &Node,
    effective: &mcm_core::EffectiveSettings,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Option<DrainResult> {
    let target = ctx.target.as_ref()?;
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let mode = drain::drain_mode(machine, conditions, now, effective);
    let name = machine.name_any();
    let mut tracker = ctx.preserve_drains.take(&name);
    let started = *tracker.started.get_or_insert(now);
    let timed_out = mcm_core::timeouts::add(started, effective.drain_timeout) <= now;
    let outcome = DrainPass {
        target,
        driver: &*ctx.driver,
        node: &node.name_any(),
        cached: Some(node),
        mode: &mode,
        settings: effective,
        now,
        cordon: false,
    }
    .run(&mut tracker)
    .await;
    let result = match &outcome {
        drain::DrainOutcome::Drained { .. } => Some(DrainResult::Drained),
        drain::DrainOutcome::InProgress { remaining, .. } if timed_out => {
            tracing::warn!(machine = %name, node = %node.name_any(), remaining, "preserved node not drained within the drain timeout");
            Some(DrainResult::Failed)
        }
        drain::DrainOutcome::InProgress { .. } => {
            ctx.preserve_drains.keep(name.clone(), tracker);
            None
        }
        other => {
            tracing::warn!(machine = %name, node = %node.name_any(), outcome = ?other, "preserved node could not be drained");
            Some(DrainResult::Failed)
        }
    };
    if let Some(DrainResult::Drained) = result {
        tracing::info!(machine = %name, node = %node.name_any(), "preserved node drained");
    }
    result
}
