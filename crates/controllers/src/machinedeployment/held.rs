//! A pass over an invalid MachineDeployment (`mcm_core::validity`): no set is created, scaled, synced, rolled back
//! or cleaned up and no node is marked; the counts are observed from its sets, the conditions say `InvalidSpec`
//! (ReplicaFailure True, Progressing and Available False) and one Warning Event names the fields.

use std::collections::BTreeMap;

use kube::{
    ResourceExt,
    api::{Patch, PatchParams},
    runtime::controller::Action,
};
use mcm_api::{Machine, MachineDeployment, MachineDeploymentStatus, MachineSet};
use mcm_core::{
    rollout::{self, SetView},
    validity::{self, InvalidSpec},
};

use super::{Context, Error, status_patch};

/// Writes the held status (only when it changes) and warns once per distinct problem.
pub(super) async fn hold(
    deployment: &MachineDeployment,
    owned: &[&MachineSet],
    machines_by_set: &BTreeMap<String, Vec<&Machine>>,
    invalid: &InvalidSpec,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Result<Action, Error> {
    let view = |set: &MachineSet| {
        let of = SetView::of(set);
        let cached = machines_by_set
            .get(&set.name_any())
            .map_or(0, |machines| i32::try_from(machines.len()).unwrap_or(i32::MAX));
        SetView {
            actual: of.actual.max(cached),
            ..of
        }
    };
    let mut candidates: Vec<&MachineSet> = owned
        .iter()
        .copied()
        .filter(|s| rollout::equal_ignore_hash(&s.spec.template, &deployment.spec.template))
        .collect();
    candidates.sort_by_key(|s| s.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let new = candidates.first().copied();
    let old: Vec<SetView> = owned
        .iter()
        .copied()
        .filter(|s| new.is_none_or(|n| n.name_any() != s.name_any()))
        .map(view)
        .collect();
    let counts = rollout::status_counts(new.map(view).as_ref(), &old);
    let current = deployment.status.clone().unwrap_or_default();
    let status = MachineDeploymentStatus {
        observed_generation: deployment.metadata.generation.unwrap_or(0),
        replicas: counts.replicas,
        updated_replicas: counts.updated_replicas,
        ready_replicas: counts.ready_replicas,
        available_replicas: counts.available_replicas,
        unavailable_replicas: counts.unavailable_replicas,
        conditions: validity::deployment_conditions(&current.conditions, invalid, now),
        ..current.clone()
    };
    if status != current {
        ctx.deployments()
            .patch_status(
                &deployment.name_any(),
                &PatchParams::default(),
                &Patch::Merge(status_patch(&status)),
            )
            .await?;
    }
    ctx.warned
        .warn(
            &ctx.recorder,
            deployment,
            validity::deployment_invalid_message(&current.conditions),
            invalid,
        )
        .await;
    Ok(Action::requeue(ctx.config.resync))
}
