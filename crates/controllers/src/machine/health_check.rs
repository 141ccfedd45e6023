//! The health act: a created machine's health as `mcm_core::health` decides it (node conditions, timeouts,
//! remediation), its status writes and the first join.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) async fn check_health(
    machine: &Machine,
    class: &MachineClass,
    secret: &Secret,
    node: Option<&Node>,
    redactor: &Redactor,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Result<Option<Duration>, Error> {
    let plan = health::decide(&HealthInput {
        machine,
        node,
        settings: &ctx.config.settings,
        redactor,
        now,
    });
    let mut status = plan.status.clone();
    // A machine turning Unknown may have lost its VM: ask the provider once, at the transition. A vanished VM fails
    // the machine at once (spec 003), without waiting for the health timeout.
    let turning_unknown = status.as_ref().and_then(StatusUpdate::phase)
        == Some(mcm_api::MachinePhase::Unknown)
        && machine.phase() != Some(mcm_api::MachinePhase::Unknown);
    if turning_unknown
        && !machine.spec.provider_id.is_empty()
        && vm_vanished(machine, class, secret, ctx).await
    {
        status = Some(creation::vanished_status(machine, now));
    }
    // Held until the Failed phase is written (docs/machine-controller-decisions.md: serialize remediation).
    let mut remediation_guard = None;
    if let Some(failure) = &plan.failure_candidate {
        let mut written = ctx.remediation.lock().await;
        let all = ctx.machines.state();
        // Forget the writes the cache shows by now (it holds another version of the machine, or none).
        written.retain(|name, (replaced, _)| {
            all.iter()
                .any(|m| m.name_any() == *name && m.resource_version().as_deref() == Some(replaced.as_str()))
        });
        let key = remediation::group_key(machine);
        let group: Vec<&Machine> = all
            .iter()
            .map(|m| {
                written
                    .get(&m.name_any())
                    .map_or(&**m, |(_, as_written)| as_written)
            })
            .filter(|m| remediation::group_key(m) == key)
            .collect();
        let name = machine.name_any();
        let decision = remediation::decide(
            &group,
            &[name.as_str()],
            None,
            now,
            &ctx.config.settings.remediation,
        );
        if decision.allowed.iter().any(|n| n == &name) {
            status = Some(failure.clone());
            remediation_guard = Some(written);
        }
    }
    if let Some(status) = &status {
        write_status(ctx, machine, status).await?;
        if let (Some(written), Some(replaced)) = (&mut remediation_guard, machine.resource_version()) {
            let mut failed = machine.clone();
            failed.status.get_or_insert_default().current_status.phase = Some(mcm_api::MachinePhase::Failed);
            written.insert(machine.name_any(), (replaced, failed));
        }
        drop(remediation_guard.take());
        if let Some(phase) = status.phase().filter(|p| Some(*p) != machine.phase()) {
            let kind = if matches!(
                phase,
                mcm_api::MachinePhase::Failed | mcm_api::MachinePhase::InPlaceUpdateFailed
            ) {
                EventType::Warning
            } else {
                EventType::Normal
            };
            let message = status.description_text();
            ctx.recorder.record(machine, kind, phase.as_str(), message).await;
        }
        if let Some(metrics) = &ctx.metrics
            && plan.transition == health::HealthTransition::JoinTimedOut
        {
            metrics.machine_failed_join(machine, node, Some(class));
        }
    }
    if let Some(join) = &plan.first_join {
        let node_name = node.map(ResourceExt::name_any).unwrap_or_default();
        tracing::info!(machine = %machine.name_any(), node = %node_name, "machine joined: node Ready, machine Running");
        if let (Some(metrics), Some(created)) = (&ctx.metrics, &machine.metadata.creation_timestamp) {
            let took = crate::metrics::elapsed(created.0, now);
            metrics.machine_step(Step::Join, machine, node, Some(class), took);
        }
        // The join duration is in the Running lastOperation's description; the reference's annotation
        // `machine-join-duration` would be a sixth write per machine (docs/machine-controller.md).
        let wants_token = secret
            .data
            .as_ref()
            .and_then(|d| d.get(keys::user_data::KEY))
            .is_some_and(|user_data| userdata::wants_bootstrap_token(&user_data.0));
        if let Some(target) = &ctx.target
            && wants_token
        {
            let api: Api<Secret> = Api::namespaced(target.clone(), "kube-system");
            let _ = api
                .delete(&join.bootstrap_token_secret, &DeleteParams::default())
                .await;
        }
    }
    Ok(plan.requeue_after)
}
