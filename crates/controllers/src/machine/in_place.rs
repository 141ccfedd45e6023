//! The in-place update act: the writes of `mcm_core::in_place_update::decide` — the node's `InPlaceUpdate`
//! condition, the cordon and drain before the update (the deletion flow's [`DrainPass`]), then the machine's
//! `InPlaceUpdating` status and `DrainSuccessful`. The phases that follow the node agent's result, and the in-place
//! update timeout, are the health check's.

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::drain::DrainPass;
use mcm_core::{
    drain::{DrainMode, DrainOutcome},
    in_place_update::{self, InPlaceInput, InPlaceStep},
};

/// How soon a step whose input is not in the cache yet (our own write on its way) looks again.
const IN_PLACE_RETRY: Duration = Duration::from_secs(1);

/// Takes the machine's in-place update one step on, as its node's labels and `InPlaceUpdate` condition say; returns
/// when to look again (a drain under way), `None` when the next step waits for a node event.
pub(super) async fn manage_in_place_update(
    machine: &Machine,
    node: &Node,
    redactor: &Redactor,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Result<Option<Duration>, Error> {
    let name = machine.name_any();
    if !in_place_update::concerns(node) {
        ctx.in_place_drains.forget(&name);
        return Ok(None);
    }
    // An earlier step of this reconcile wrote the machine or the node: decide on the versions that follow.
    if ctx.stale(&format!("machine/{name}"), machine.resource_version().as_deref())
        || ctx.stale(
            &format!("node/{}", node.name_any()),
            node.resource_version().as_deref(),
        )
    {
        return Ok(Some(IN_PLACE_RETRY));
    }
    let effective = mcm_core::effective_settings(machine, &ctx.config.settings);
    let step = in_place_update::decide(&InPlaceInput {
        machine,
        node,
        settings: &effective,
        redactor,
        now,
    });
    match step {
        InPlaceStep::Wait => {
            ctx.in_place_drains.forget(&name);
            Ok(None)
        }
        InPlaceStep::Condition(condition) => {
            ctx.in_place_drains.forget(&name);
            write_condition(node, &condition, ctx).await?;
            tracing::info!(
                machine = %name,
                node = %node.name_any(),
                reason = condition.reason.as_deref().unwrap_or_default(),
                "in-place update: node condition written"
            );
            Ok(None)
        }
        InPlaceStep::Drain(mode) => drain(machine, node, &mode, &effective, ctx, now).await,
    }
}

/// Writes the node's `InPlaceUpdate` condition (strategic merge by type: the kubelet's conditions stay) and notes
/// the write, so that the next decision waits for the cache to show it.
async fn write_condition(node: &Node, condition: &NodeCondition, ctx: &Context) -> Result<(), Error> {
    let Some(target) = &ctx.target else { return Ok(()) };
    let api: Api<Node> = Api::all(target.clone());
    let written = api
        .patch_status(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(mcm_core::preservation::condition_patch(condition)),
        )
        .await?;
    ctx.wrote(
        &format!("node/{}", node.name_any()),
        node.resource_version(),
        written.resource_version().as_deref(),
    );
    Ok(())
}

/// One pass of the drain before the update (cordoning first). Drained: the machine turns `InPlaceUpdating`, then
/// the node's condition `DrainSuccessful`. Otherwise a look again after the eviction retry interval, or sooner when
/// the drain turns into a forced one.
async fn drain(
    machine: &Machine,
    node: &Node,
    mode: &DrainMode,
    effective: &mcm_core::EffectiveSettings,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Result<Option<Duration>, Error> {
    let Some(target) = &ctx.target else {
        return Ok(None);
    };
    let name = machine.name_any();
    let node_name = node.name_any();
    let mut tracker = ctx.in_place_drains.take(&name);
    tracker.started.get_or_insert(now);
    let outcome = DrainPass {
        target,
        driver: &*ctx.driver,
        node: &node_name,
        cached: Some(node),
        mode,
        settings: effective,
        now,
        cordon: true,
    }
    .run(&mut tracker)
    .await;
    let retry = effective.evict_retry_interval.max(IN_PLACE_RETRY);
    let until_forced = |at: jiff::Timestamp| Duration::try_from(at.duration_since(now)).unwrap_or_default();
    let retry = mode
        .force_at
        .map_or(retry, |at| retry.min(until_forced(at).max(IN_PLACE_RETRY)));
    match &outcome {
        DrainOutcome::Drained { .. } => {
            tracing::info!(
                machine = %name,
                node = %node_name,
                forced = mode.force.as_ref().map(ToString::to_string).unwrap_or_default(),
                outcome = %outcome,
                "node drained for an in-place update"
            );
            let status = in_place_update::updating_status(machine, now);
            write_status(ctx, machine, &status).await?;
            if machine.phase() != status.phase() {
                ctx.recorder
                    .record(
                        machine,
                        EventType::Normal,
                        mcm_api::MachinePhase::InPlaceUpdating.as_str(),
                        status.description_text(),
                    )
                    .await;
            }
            write_condition(node, &in_place_update::drained_condition(now), ctx).await?;
            Ok(None)
        }
        DrainOutcome::InProgress { .. } => {
            tracing::debug!(machine = %name, node = %node_name, outcome = %outcome, "in-place update: drain in progress");
            ctx.in_place_drains.keep(name, tracker);
            Ok(Some(retry))
        }
        other => {
            tracing::warn!(
                machine = %name,
                node = %node_name,
                outcome = %other,
                "in-place update: drain failed; retrying (forced once the drain timeout since the selection passed)"
            );
            Ok(Some(retry))
        }
    }
}
