//! What a scrape reads from the controllers' caches: machine, machine set and machine deployment state turned into
//! gauges (cleared and refilled on each scrape), encoded as the reference encodes phases and conditions.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcm_api::{Machine, MachineDeployment, MachinePhase, MachineSet, MachineSummary, StrategyType};

use super::{
    Metrics,
    labels::{
        ConditionLabels, DeploymentInfoLabels, FailedMachineLabels, MachineInfoLabels, ObjectLabels,
        SetInfoLabels,
    },
};

/// The value of `mcm_machine_current_status_phase` for a phase, as the reference encodes it.
pub fn phase_value(phase: Option<MachinePhase>) -> i64 {
    match phase {
        Some(MachinePhase::Terminating) => -4,
        Some(MachinePhase::Failed) => -3,
        Some(MachinePhase::CrashLoopBackOff) => -2,
        Some(MachinePhase::Unknown) => -1,
        Some(MachinePhase::Running) => 1,
        // Pending, and machines without a phase yet (the reference reports 0 for both).
        _ => 0,
    }
}

/// The value of a `*_status_condition` gauge for a condition status, as the reference encodes it: True 1, False 0,
/// Unknown 2 (and 2 for any other text: a status nobody can read is unknown).
pub fn condition_value(status: &str) -> i64 {
    match status {
        "True" => 1,
        "False" => 0,
        _ => 2,
    }
}

fn created_at(meta: &kube::api::ObjectMeta) -> String {
    meta.creation_timestamp
        .as_ref()
        .map_or_else(|| "0".to_owned(), |t| t.0.as_second().to_string())
}

pub(super) fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn failed_machine_labels(owner: &ObjectLabels, failed: &MachineSummary) -> FailedMachineLabels {
    FailedMachineLabels {
        name: owner.name.clone(),
        namespace: owner.namespace.clone(),
        failed_machine_name: failed.name.clone(),
        failed_machine_provider_id: failed.provider_id.clone(),
        failed_machine_last_operation_state: failed
            .last_operation
            .state
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default(),
        failed_machine_last_operation_machine_operation_type: failed
            .last_operation
            .r#type
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default(),
        failed_machine_owner_ref: failed.owner_ref.clone(),
    }
}

impl Metrics {
    pub(super) fn refresh_machines(&self, machines: &[Arc<Machine>]) {
        let m = &self.machine;
        m.items.set(count(machines.len()));
        m.phase.clear();
        m.info.clear();
        m.condition.clear();
        for machine in machines {
            let object = ObjectLabels::of(&**machine);
            m.phase.get_or_create(&object).set(phase_value(machine.phase()));
            let class = &machine.spec.class;
            m.info
                .get_or_create(&MachineInfoLabels {
                    name: object.name.clone(),
                    namespace: object.namespace.clone(),
                    createdAt: created_at(&machine.metadata),
                    spec_provider_id: machine.spec.provider_id.clone(),
                    spec_class_api_group: class.api_group.clone(),
                    spec_class_kind: class.kind.clone(),
                    spec_class_name: class.name.clone(),
                    node_name: machine.node_name().unwrap_or_default().to_owned(),
                })
                .set(1);
            for condition in machine.status.iter().flat_map(|s| &s.conditions) {
                m.condition
                    .get_or_create(&ConditionLabels {
                        name: object.name.clone(),
                        namespace: object.namespace.clone(),
                        condition: condition.type_.clone(),
                    })
                    .set(condition_value(&condition.status));
            }
        }
    }

    pub(super) fn refresh_sets(&self, sets: &[Arc<MachineSet>]) {
        let s = &self.sets;
        s.items.set(count(sets.len()));
        for family in [
            &s.spec_replicas,
            &s.spec_min_ready_seconds,
            &s.available,
            &s.fully_labelled,
            &s.ready,
            &s.replicas,
        ] {
            family.clear();
        }
        s.info.clear();
        s.condition.clear();
        s.failed_machines.clear();
        for set in sets {
            let object = ObjectLabels::of(&**set);
            // `spec.machineClass` is optional; the machines are made from the template's class.
            let class = if set.spec.machine_class.name.is_empty() {
                &set.spec.template.spec.class
            } else {
                &set.spec.machine_class
            };
            s.info
                .get_or_create(&SetInfoLabels {
                    name: object.name.clone(),
                    namespace: object.namespace.clone(),
                    createdAt: created_at(&set.metadata),
                    spec_machine_class_api_group: class.api_group.clone(),
                    spec_machine_class_kind: class.kind.clone(),
                    spec_machine_class_name: class.name.clone(),
                })
                .set(1);
            s.spec_replicas
                .get_or_create(&object)
                .set(set.spec.replicas.into());
            s.spec_min_ready_seconds
                .get_or_create(&object)
                .set(set.spec.min_ready_seconds.into());
            let status = set.status.clone().unwrap_or_default();
            s.available
                .get_or_create(&object)
                .set(status.available_replicas.into());
            s.fully_labelled
                .get_or_create(&object)
                .set(status.fully_labeled_replicas.into());
            s.ready.get_or_create(&object).set(status.ready_replicas.into());
            s.replicas.get_or_create(&object).set(status.replicas.into());
            for condition in &status.conditions {
                s.condition
                    .get_or_create(&ConditionLabels {
                        name: object.name.clone(),
                        namespace: object.namespace.clone(),
                        condition: condition.r#type.as_str().to_owned(),
                    })
                    .set(condition_value(condition.status.as_str()));
            }
            for failed in status.failed_machines.iter().flatten() {
                s.failed_machines
                    .get_or_create(&failed_machine_labels(&object, failed))
                    .set(1);
            }
        }
    }

    pub(super) fn refresh_deployments(&self, deployments: &[Arc<MachineDeployment>]) {
        let d = &self.deployments;
        d.items.set(count(deployments.len()));
        for family in [
            &d.spec_paused,
            &d.spec_replicas,
            &d.spec_min_ready_seconds,
            &d.spec_max_surge,
            &d.spec_max_unavailable,
            &d.spec_revision_history_limit,
            &d.spec_progress_deadline_seconds,
            &d.spec_rollback_to_revision,
            &d.available,
            &d.unavailable,
            &d.ready,
            &d.updated,
            &d.replicas,
            &d.collision_count,
        ] {
            family.clear();
        }
        d.info.clear();
        d.condition.clear();
        d.failed_machines.clear();
        for deployment in deployments {
            let object = ObjectLabels::of(&**deployment);
            self.refresh_deployment_spec(&object, deployment);
            self.refresh_deployment_status(&object, deployment);
        }
    }

    fn refresh_deployment_spec(&self, object: &ObjectLabels, deployment: &MachineDeployment) {
        let d = &self.deployments;
        let spec = &deployment.spec;
        let strategy = spec.strategy.strategy_type();
        d.info
            .get_or_create(&DeploymentInfoLabels {
                name: object.name.clone(),
                namespace: object.namespace.clone(),
                createdAt: created_at(&deployment.metadata),
                spec_strategy_type: strategy.map_or_else(str::to_owned, |s| s.as_str().to_owned()),
            })
            .set(1);
        d.spec_paused.get_or_create(object).set(i64::from(spec.paused));
        d.spec_replicas.get_or_create(object).set(spec.replicas.into());
        d.spec_min_ready_seconds
            .get_or_create(object)
            .set(spec.min_ready_seconds.into());
        if strategy == Ok(StrategyType::RollingUpdate) {
            let rolling = spec.strategy.rolling_update.clone().unwrap_or_default();
            let resolve = |value: Option<&IntOrString>, round_up: bool| {
                value.map_or(Ok(1), |v| {
                    mcm_core::rollout::scaled_value(v, spec.replicas, round_up)
                })
            };
            if let Ok(surge) = resolve(rolling.max_surge.as_ref(), true) {
                d.spec_max_surge.get_or_create(object).set(surge.into());
            }
            if let Ok(unavailable) = resolve(rolling.max_unavailable.as_ref(), false) {
                d.spec_max_unavailable
                    .get_or_create(object)
                    .set(unavailable.into());
            }
        }
        if let Some(limit) = spec.revision_history_limit {
            d.spec_revision_history_limit
                .get_or_create(object)
                .set(limit.into());
        }
        if let Some(deadline) = spec.progress_deadline_seconds {
            d.spec_progress_deadline_seconds
                .get_or_create(object)
                .set(deadline.into());
        }
        if let Some(rollback) = &spec.rollback_to {
            d.spec_rollback_to_revision
                .get_or_create(object)
                .set(rollback.revision);
        }
    }

    fn refresh_deployment_status(&self, object: &ObjectLabels, deployment: &MachineDeployment) {
        let d = &self.deployments;
        let status = deployment.status.clone().unwrap_or_default();
        d.available
            .get_or_create(object)
            .set(status.available_replicas.into());
        d.unavailable
            .get_or_create(object)
            .set(status.unavailable_replicas.into());
        d.ready.get_or_create(object).set(status.ready_replicas.into());
        d.updated
            .get_or_create(object)
            .set(status.updated_replicas.into());
        d.replicas.get_or_create(object).set(status.replicas.into());
        if let Some(collisions) = status.collision_count {
            d.collision_count.get_or_create(object).set(collisions.into());
        }
        for condition in &status.conditions {
            d.condition
                .get_or_create(&ConditionLabels {
                    name: object.name.clone(),
                    namespace: object.namespace.clone(),
                    condition: condition.r#type.as_str().to_owned(),
                })
                .set(condition_value(condition.status.as_str()));
        }
        for failed in &status.failed_machines {
            d.failed_machines
                .get_or_create(&failed_machine_labels(object, failed))
                .set(1);
        }
    }
}
