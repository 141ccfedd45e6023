//! The MachineDeployment controller, the acting half of `mcm_core::rollout`: find the deployment's new set (the one
//! whose template equals the deployment's, hash label aside) and its old sets, ask `rollout::step` what to do, and
//! do it: create the new set (template hash label, revision and replicas annotations, owner reference), scale sets,
//! mark old sets of an OnDelete rollout scale-up-disabled, clean up history, roll back on `spec.rollbackTo`, and
//! write the status only when it changes. Machines are the MachineSet controller's business.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference, Time};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use mcm_api::{
    ConditionStatus, MachineDeployment, MachineDeploymentCondition, MachineDeploymentConditionType,
    MachineDeploymentStatus, MachineSet, MachineSetSpec, keys,
};
use mcm_core::rollout::{self, RolloutInput, RolloutPhase, SetView};
use serde_json::json;

use crate::events::{EventType, Recorder};

/// How the MachineDeployment controller runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The namespace of the deployments and sets.
    pub namespace: String,
    /// Deployments reconciled at once.
    pub concurrency: u16,
    /// How often a deployment is looked at again without a change.
    pub resync: Duration,
}

pub use crate::Error;

struct Context {
    client: Client,
    config: Config,
    sets: Store<MachineSet>,
    recorder: Recorder,
}

impl Context {
    fn deployments(&self) -> Api<MachineDeployment> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn set_api(&self) -> Api<MachineSet> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }
}

/// Runs the MachineDeployment controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let namespace = config.namespace.clone();
    let controller = Controller::new(
        Api::<MachineDeployment>::namespaced(client.clone(), &namespace),
        watcher::Config::default(),
    );
    let (sets, writer) = reflector::store::<MachineSet>();
    let set_stream = watcher(
        Api::<MachineSet>::namespaced(client.clone(), &namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .touched_objects();
    let mapper_namespace = namespace.clone();
    let by_set = move |set: MachineSet| {
        set.owner_references()
            .iter()
            .find(|r| r.controller == Some(true) && r.kind == "MachineDeployment")
            .map(|r| ObjectRef::new(&r.name).within(&mapper_namespace))
    };
    let context = Arc::new(Context {
        recorder: Recorder::new(client.clone(), "machinedeployment-controller"),
        client,
        config: config.clone(),
        sets,
    });
    controller
        .watches_stream(set_stream, by_set)
        .with_config(kube::runtime::controller::Config::default().concurrency(config.concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "machine deployment reconcile ended with an error");
            }
        })
        .await;
}

#[allow(clippy::needless_pass_by_value)] // the signature is kube-runtime's
fn error_policy(deployment: Arc<MachineDeployment>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(deployment = %deployment.name_any(), error = %error, "machine deployment reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

fn owned_by(set: &MachineSet, deployment: &MachineDeployment) -> bool {
    let uid = deployment.uid();
    set.owner_references()
        .iter()
        .any(|r| r.controller == Some(true) && Some(&r.uid) == uid.as_ref())
}

fn owner_reference(deployment: &MachineDeployment) -> OwnerReference {
    OwnerReference {
        api_version: MachineDeployment::api_version(&()).into_owned(),
        kind: MachineDeployment::kind(&()).into_owned(),
        name: deployment.name_any(),
        uid: deployment.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The new MachineSet of a deployment: its template with the hash label, owned by the deployment.
fn new_set(
    deployment: &MachineDeployment,
    owned: &[&MachineSet],
    replicas: i32,
    fenceposts: rollout::Fenceposts,
) -> MachineSet {
    let collision_count = deployment.status.as_ref().and_then(|s| s.collision_count);
    let hash = rollout::template_hash(&deployment.spec.template, collision_count);
    let template = rollout::template_with_hash(&deployment.spec.template, &hash);
    let mut labels = template.labels();
    labels.insert(keys::labels::MACHINE_TEMPLATE_HASH.to_owned(), hash.clone());
    let mut annotations = rollout::replicas_annotations(replicas, fenceposts);
    annotations.insert(
        keys::annotations::REVISION.to_owned(),
        rollout::next_revision(owned.iter().copied()).to_string(),
    );
    let mut selector = deployment.spec.selector.clone().unwrap_or_default();
    selector
        .match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(keys::labels::MACHINE_TEMPLATE_HASH.to_owned(), hash.clone());
    MachineSet {
        metadata: ObjectMeta {
            name: Some(rollout::machine_set_name(&deployment.name_any(), &hash)),
            namespace: deployment.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner_reference(deployment)]),
            ..ObjectMeta::default()
        },
        spec: MachineSetSpec {
            replicas,
            selector: Some(LabelSelector { ..selector }),
            template,
            min_ready_seconds: deployment.spec.min_ready_seconds,
            ..MachineSetSpec::default()
        },
        status: None,
    }
}

fn condition(
    current: &[MachineDeploymentCondition],
    type_: MachineDeploymentConditionType,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    now: jiff::Timestamp,
) -> MachineDeploymentCondition {
    let previous = current.iter().find(|c| c.r#type == type_);
    let unchanged = previous.is_some_and(|p| p.status == status && p.reason == reason);
    let transition = previous
        .filter(|p| p.status == status)
        .and_then(|p| p.last_transition_time.clone())
        .unwrap_or(Time(now));
    MachineDeploymentCondition {
        r#type: type_,
        status,
        last_update_time: if unchanged {
            previous.and_then(|p| p.last_update_time.clone())
        } else {
            Some(Time(now))
        },
        last_transition_time: Some(transition),
        reason: reason.to_owned(),
        message: message.to_owned(),
    }
}

#[allow(clippy::too_many_lines)] // the order of the acts is the contract of RolloutPlan; one place reads best
async fn reconcile(deployment: Arc<MachineDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !crate::cache::synced(&ctx.sets) {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    if deployment.metadata.deletion_timestamp.is_some() {
        // Its sets go by garbage collection (owner references), their machines by the set controller.
        return Ok(Action::await_change());
    }
    let name = deployment.name_any();
    let now = jiff::Timestamp::now();
    let all = ctx.sets.state();
    let owned: Vec<&MachineSet> = all
        .iter()
        .map(|s| &**s)
        .filter(|s| owned_by(s, &deployment))
        .collect();

    if let Some(rollback) = &deployment.spec.rollback_to {
        let patch = if let Some(target) = rollout::rollback_target(&owned, rollback.revision) {
            let mut template = target.spec.template.clone();
            if let Some(labels) = template.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
                labels.remove(keys::labels::MACHINE_TEMPLATE_HASH);
            }
            ctx.recorder
                .record(
                    &*deployment,
                    EventType::Normal,
                    "DeploymentRollback",
                    &format!("Rolled back to revision {:?}", rollout::revision(target)),
                )
                .await;
            json!({ "spec": { "template": template, "rollbackTo": null } })
        } else {
            ctx.recorder
                .record(
                    &*deployment,
                    EventType::Warning,
                    "DeploymentRollbackRevisionNotFound",
                    &format!("Unable to find revision {} to roll back to", rollback.revision),
                )
                .await;
            json!({ "spec": { "rollbackTo": null } })
        };
        ctx.deployments()
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        return Ok(Action::await_change());
    }

    let settings = rollout::fenceposts(&deployment)
        .map_err(|err| format!("{}: {}", err.path, err.reason))
        .and_then(|fenceposts| {
            deployment
                .spec
                .strategy
                .strategy_type()
                .map(|strategy| (fenceposts, strategy))
                .map_err(|other| format!("spec.strategy.type: Unsupported value: {other:?}"))
        });
    let (fenceposts, strategy) = match settings {
        Ok(settings) => settings,
        Err(message) => {
            // Nothing is created or scaled for an invalid deployment; the message names the field.
            ctx.recorder
                .record(&*deployment, EventType::Warning, "InvalidSpec", &message)
                .await;
            return Ok(Action::requeue(ctx.config.resync));
        }
    };
    let mut candidates: Vec<&MachineSet> = owned
        .iter()
        .copied()
        .filter(|s| rollout::equal_ignore_hash(&s.spec.template, &deployment.spec.template))
        .collect();
    candidates.sort_by_key(|s| s.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let new = candidates.first().copied();
    let new_view = new.map(SetView::of);
    let old_sets: Vec<&MachineSet> = owned
        .iter()
        .copied()
        .filter(|s| Some(s.name_any()) != new.map(ResourceExt::name_any))
        .collect();
    let old_views: Vec<SetView> = old_sets.iter().map(|s| SetView::of(s)).collect();
    let plan = rollout::step(&RolloutInput {
        replicas: deployment.spec.replicas,
        strategy,
        fenceposts,
        paused: deployment.spec.paused,
        new: new_view.as_ref(),
        old: &old_views,
    });

    if let Some(replicas) = plan.create_new {
        let set = new_set(&deployment, &owned, replicas, fenceposts);
        match ctx.set_api().create(&PostParams::default(), &set).await {
            Ok(created) => {
                ctx.recorder
                    .record(
                        &*deployment,
                        EventType::Normal,
                        "ScalingMachineSet",
                        &format!(
                            "Created new machine set {} with {replicas} replicas",
                            created.name_any()
                        ),
                    )
                    .await;
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // A set of that name with another template: count a collision, which changes the hash.
                let count = deployment
                    .status
                    .as_ref()
                    .and_then(|s| s.collision_count)
                    .unwrap_or(0)
                    + 1;
                ctx.deployments()
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "status": { "collisionCount": count } })),
                    )
                    .await?;
                return Ok(Action::await_change());
            }
            Err(err) => return Err(err.into()),
        }
    }
    for scale in &plan.scale {
        let annotations = rollout::replicas_annotations(deployment.spec.replicas, fenceposts);
        ctx.set_api()
            .patch(
                &scale.name,
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "metadata": { "annotations": annotations },
                    "spec": { "replicas": scale.replicas }
                })),
            )
            .await?;
        ctx.recorder
            .record(
                &*deployment,
                EventType::Normal,
                "ScalingMachineSet",
                &format!("Scaled machine set {} to {}", scale.name, scale.replicas),
            )
            .await;
    }
    for (sets, value) in [
        (&plan.disable_scale_up, json!("true")),
        (&plan.enable_scale_up, serde_json::Value::Null),
    ] {
        for set in sets {
            ctx.set_api()
                .patch(
                    set,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({ "metadata": { "labels": { keys::labels::SCALE_UP_DISABLED: value } } }),
                    ),
                )
                .await?;
        }
    }
    if plan.phase == RolloutPhase::Complete {
        for set in rollout::history_to_clean_up(&old_sets, deployment.spec.revision_history_limit) {
            match ctx
                .set_api()
                .delete(&set.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(err.into()),
            }
        }
    }

    let counts = rollout::status_counts(new_view.as_ref(), &old_views);
    let current = deployment.status.clone().unwrap_or_default();
    let available =
        rollout::has_minimum_availability(deployment.spec.replicas, fenceposts, counts.available_replicas, 0);
    let mut conditions: Vec<MachineDeploymentCondition> = current
        .conditions
        .iter()
        .filter(|c| {
            !matches!(
                c.r#type,
                MachineDeploymentConditionType::Available | MachineDeploymentConditionType::Progressing
            )
        })
        .cloned()
        .collect();
    conditions.push(if available {
        condition(
            &current.conditions,
            MachineDeploymentConditionType::Available,
            ConditionStatus::True,
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
            now,
        )
    } else {
        condition(
            &current.conditions,
            MachineDeploymentConditionType::Available,
            ConditionStatus::False,
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
            now,
        )
    });
    let (reason, message) = match plan.phase {
        RolloutPhase::Complete => (
            "NewMachineSetAvailable",
            "Machine set has successfully progressed.",
        ),
        RolloutPhase::Paused => ("DeploymentPaused", "Deployment is paused."),
        _ => ("MachineSetUpdated", "Machine set is progressing."),
    };
    conditions.push(condition(
        &current.conditions,
        MachineDeploymentConditionType::Progressing,
        if plan.phase == RolloutPhase::Paused {
            ConditionStatus::Unknown
        } else {
            ConditionStatus::True
        },
        reason,
        message,
        now,
    ));
    let status = MachineDeploymentStatus {
        observed_generation: deployment.metadata.generation.unwrap_or(0),
        replicas: counts.replicas,
        updated_replicas: counts.updated_replicas,
        ready_replicas: counts.ready_replicas,
        available_replicas: counts.available_replicas,
        unavailable_replicas: counts.unavailable_replicas,
        conditions,
        ..current.clone()
    };
    if status != current {
        ctx.deployments()
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": {
                    "observedGeneration": status.observed_generation,
                    "replicas": status.replicas,
                    "updatedReplicas": status.updated_replicas,
                    "readyReplicas": status.ready_replicas,
                    "availableReplicas": status.available_replicas,
                    "unavailableReplicas": status.unavailable_replicas,
                    "conditions": status.conditions,
                } })),
            )
            .await?;
    }
    Ok(Action::requeue(ctx.config.resync))
}
