//! The MachineDeployment controller, the acting half of `mcm_core::rollout` and `mcm_core::autoscaler`: find the
//! deployment's new set (the one whose template equals the deployment's, hash label aside) and its old sets, run the
//! cluster-autoscaler's trigger-deletion handshake, ask `rollout::step` (InPlaceUpdate: `rollout::in_place`, acted on
//! in [`in_place`]) what to do, and do it: create the new set
//! (template hash label, revision and replicas annotations, the deployment's annotations, owner reference), keep the
//! new set in line (nodeTemplate, machine configuration, annotations, revision) without a rollout, scale sets, mark
//! old sets of an OnDelete rollout scale-up-disabled, mark the nodes of a rollout (scale-down-disabled annotations,
//! PreferNoSchedule taint on old machines' nodes), clean up history, roll back on `spec.rollbackTo`, and write the
//! status (counts, Available, Progressing with its deadline) only when it changes. All writes to one set in a pass
//! go out as one patch. Machines are the MachineSet controller's business.

mod autoscaler;
mod held;
mod in_place;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::{FutureExt, StreamExt};
use k8s_openapi::{
    Resource as _,
    api::core::v1::Node,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time},
};
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
    ConditionStatus, Machine, MachineDeployment, MachineDeploymentCondition, MachineDeploymentConditionType,
    MachineDeploymentStatus, MachineSet, MachineSetSpec, MetaExt, StrategyType, keys,
};
use mcm_core::{
    rollout::{self, ProgressInput, RolloutInput, RolloutPhase, SetView, StatusCounts},
    validity,
};
use serde_json::{Value, json};

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
    /// Annotate every node of a deployment `cluster-autoscaler.kubernetes.io/scale-down-disabled` while a rollout
    /// has old machines (`--autoscaler-scaledown-annotation-during-rollout`, default true).
    pub autoscaler_scale_down_annotation_during_rollout: bool,
}

impl Config {
    /// The reference's defaults in `namespace`: 10 deployments at once, a 10 minute resync, the autoscaler
    /// annotation during rollouts on.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            concurrency: 10,
            resync: Duration::from_mins(10),
            autoscaler_scale_down_annotation_during_rollout: true,
        }
    }
}

pub use crate::Error;

/// How soon a deployment is looked at again when a node was missing from the cache or changed under a patch.
const RETRY_SOON: Duration = Duration::from_secs(1);

struct Context {
    client: Client,
    target: Option<Client>,
    config: Config,
    sets: Store<MachineSet>,
    machines: Store<Machine>,
    /// Whether the shared machine cache has synced (never ask the store itself: `crate::shared_cache`).
    machines_synced: crate::shared_cache::Synced,
    /// The machines of each set, beside `machines`.
    owners: crate::owners::OwnerIndex,
    /// Spaces the passes of a deployment of many machines.
    throttle: crate::throttle::PassThrottle,
    nodes: Option<Store<Node>>,
    /// Whether the shared node cache has synced.
    nodes_synced: Option<crate::shared_cache::Synced>,
    recorder: Recorder,
    /// The invalid deployments warned about.
    warned: crate::invalid::Warned,
    /// The deployments warned about for settings that have no effect.
    no_effect: crate::ignored::NoEffect,
}

impl Context {
    fn deployments(&self) -> Api<MachineDeployment> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn set_api(&self) -> Api<MachineSet> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn machine_api(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn synced(&self) -> bool {
        crate::cache::synced(&self.sets)
            && self.machines_synced.get()
            && self
                .nodes_synced
                .as_ref()
                .is_none_or(crate::shared_cache::Synced::get)
    }
}

/// Runs the MachineDeployment controller on the process's shared caches of the Machines and Nodes until `shutdown`
/// resolves. `target` is the cluster of the nodes (`None`: no node annotations or taints). With `metrics`, the
/// deployment cache feeds them at scrape time and the reconciles are metered; `None` runs the controller alone.
#[allow(clippy::too_many_lines)] // the wiring of the watches reads best in one place
pub async fn run(
    client: Client,
    target: Option<Client>,
    config: Config,
    caches: crate::shared_cache::Caches,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let namespace = config.namespace.clone();
    // The deployment queue's triggers are metered (the work queue metrics): the controller is built on its own watch.
    let meter = crate::metrics::Metrics::reconcile_meter(metrics.as_ref(), "machinedeployment");
    let (deployments, deployment_writer) = reflector::store::<MachineDeployment>();
    let controller = Controller::for_stream(
        meter.triggers(
            reflector::reflector(
                deployment_writer,
                watcher(
                    Api::<MachineDeployment>::namespaced(client.clone(), &namespace),
                    watcher::Config::default(),
                ),
            )
            .applied_objects(),
        ),
        deployments.clone(),
    );
    if let Some(metrics) = &metrics {
        metrics.attach_machine_deployments(deployments.clone());
    }
    let (sets, set_writer) = reflector::store::<MachineSet>();
    let set_stream = watcher(
        Api::<MachineSet>::namespaced(client.clone(), &namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(set_writer)
    .touched_objects();
    let machines = caches.machines.store();
    let nodes = caches.nodes.as_ref().filter(|_| target.is_some());
    let by_set = {
        let namespace = namespace.clone();
        move |set: MachineSet| {
            set.controller_ref_of_kind(MachineDeployment::KIND)
                .map(|r| ObjectRef::new(&r.name).within(&namespace))
        }
    };
    // A machine's changes matter to its deployment (OnDelete counts live machines; nodes get marks): machine → its
    // set → the set's deployment.
    let by_machine = {
        let namespace = namespace.clone();
        let sets = sets.clone();
        move |machine: Arc<Machine>| {
            let set_name = &machine.controller_ref_of_kind(MachineSet::KIND)?.name;
            let set = sets.get(&ObjectRef::new(set_name).within(&namespace))?;
            set.controller_ref_of_kind(MachineDeployment::KIND)
                .map(|r| ObjectRef::new(&r.name).within(&namespace))
        }
    };
    let context = Arc::new(Context {
        recorder: Recorder::new(client.clone(), "machinedeployment-controller"),
        client,
        target,
        config: config.clone(),
        sets,
        machines,
        machines_synced: caches.machines.readiness(),
        owners: caches.owners.clone(),
        throttle: crate::throttle::PassThrottle::default(),
        nodes: nodes.map(crate::shared_cache::SharedCache::store),
        nodes_synced: nodes.map(crate::shared_cache::SharedCache::readiness),
        warned: crate::invalid::Warned::default(),
        no_effect: crate::ignored::NoEffect::default(),
    });
    // A node in an in-place update wakes its deployment (the node agent's `update-result`, the machine controller's
    // condition); the node cache runs as long as the controller does.
    let controller = match nodes {
        Some(nodes) => {
            let machines = context.machines.clone();
            let sets = context.sets.clone();
            let namespace = namespace.clone();
            controller.watches_shared_stream(
                nodes.objects(),
                meter.mapper(move |node: Arc<Node>| {
                    in_place::deployment_of_node(&node, &machines, &sets, &namespace)
                }),
            )
        }
        None => controller,
    };
    let shutdown = shutdown.boxed().shared();
    let work = controller
        .watches_stream(set_stream, meter.mapper(by_set))
        .watches_shared_stream(caches.machines.objects(), meter.mapper(by_machine))
        .with_config(kube::runtime::controller::Config::default().concurrency(config.concurrency))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            meter.reconcile(crate::logging::traced(
                crate::logging::Kind::MachineDeployment,
                reconcile,
            )),
            meter.error_policy(error_policy),
            context,
        )
        .for_each(|result| {
            meter.outcome(&result);
            async move {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "machine deployment reconcile ended with an error");
                }
            }
        });
    crate::cache::until_stopped(work, || crate::cache::synced(&deployments), shutdown).await;
}

#[allow(clippy::needless_pass_by_value)] // the signature is kube-runtime's
fn error_policy(deployment: Arc<MachineDeployment>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(deployment = %deployment.name_any(), error = %error, "machine deployment reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

fn owned_by(set: &MachineSet, deployment: &MachineDeployment) -> bool {
    deployment.uid().is_some_and(|uid| set.is_controlled_by(&uid))
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

/// The new MachineSet of a deployment: its template with the hash label, the deployment's annotations (those
/// handed down), the replicas annotations and the next revision, owned by the deployment.
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
    let mut annotations = rollout::copied_annotations(deployment);
    annotations.extend(rollout::replicas_annotations(replicas, fenceposts));
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
            selector: Some(selector),
            template,
            min_ready_seconds: deployment.spec.min_ready_seconds,
            auto_preserve_failed_machine_max: deployment.spec.auto_preserve_failed_machine_max,
            ..MachineSetSpec::default()
        },
        status: None,
    }
}

/// A condition as it should be written: `lastUpdateTime` moves when the status or reason changes or `touch` says
/// so; `lastTransitionTime` only when the status changes.
fn condition(
    current: &[MachineDeploymentCondition],
    type_: MachineDeploymentConditionType,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    touch: bool,
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
        last_update_time: if unchanged && !touch {
            previous.and_then(|p| p.last_update_time.clone())
        } else {
            Some(Time(now))
        },
        last_transition_time: Some(transition),
        reason: reason.to_owned(),
        message: message.to_owned(),
    }
}

/// The `ScalingMachineSet` Event of a set scaled `direction` (`up` or `down`) to `replicas`, as the reference words it.
async fn record_scaled(
    deployment: &MachineDeployment,
    set: &str,
    direction: &str,
    replicas: i32,
    ctx: &Context,
) {
    ctx.recorder
        .record(
            deployment,
            EventType::Normal,
            "ScalingMachineSet",
            &format!("Scaled {direction} machine set {set} to {replicas}"),
        )
        .await;
}

/// Deep-merges RFC 7386 merge patch `more` into `patch` (keeping `null`s, which remove), so that everything a pass
/// writes to one set goes out as one request.
fn merge_patches(patch: &mut Value, more: Value) {
    match (patch, more) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                match into.get_mut(&key) {
                    Some(existing) if existing.is_object() && value.is_object() => {
                        merge_patches(existing, value);
                    }
                    _ => {
                        into.insert(key, value);
                    }
                }
            }
        }
        (slot, more) => *slot = more,
    }
}

/// Counts of the status as last written, to tell progress.
fn counts_of(status: &MachineDeploymentStatus) -> StatusCounts {
    StatusCounts {
        replicas: status.replicas,
        updated_replicas: status.updated_replicas,
        ready_replicas: status.ready_replicas,
        available_replicas: status.available_replicas,
        unavailable_replicas: status.unavailable_replicas,
    }
}

/// Machines of a set, from the cache (claimed by the set's controller reference), found through the owner index.
fn machines_of(set: &MachineSet, ctx: &Context) -> Vec<Arc<Machine>> {
    let Some(uid) = set.uid() else {
        return Vec::new();
    };
    let mut machines = ctx
        .owners
        .machines(&ctx.machines, &ctx.config.namespace, &uid, false);
    machines.retain(|m| {
        m.controller_ref_of_kind(MachineSet::KIND)
            .is_some_and(|r| r.uid == uid)
    });
    machines
}

async fn roll_back(
    deployment: &MachineDeployment,
    owned: &[&MachineSet],
    revision: i64,
    ctx: &Context,
) -> Result<(), Error> {
    let patch = if let Some(target) = rollout::rollback_target(owned, revision) {
        let mut template = target.spec.template.clone();
        if let Some(labels) = template.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
            labels.remove(keys::labels::MACHINE_TEMPLATE_HASH);
        }
        if rollout::equal_ignore_hash(&template, &deployment.spec.template) {
            ctx.recorder
                .record(
                    deployment,
                    EventType::Warning,
                    "DeploymentRollbackTemplateUnchanged",
                    &format!(
                        "The rollback revision contains the same template as current deployment {:?}",
                        deployment.name_any()
                    ),
                )
                .await;
            json!({ "spec": { "rollbackTo": null } })
        } else {
            ctx.recorder
                .record(
                    deployment,
                    EventType::Normal,
                    "DeploymentRollback",
                    &format!(
                        "Rolled back deployment {:?} to revision {}",
                        deployment.name_any(),
                        rollout::revision(target).unwrap_or_default()
                    ),
                )
                .await;
            // The set's annotations that the deployment hands down come back with the template.
            let annotations: BTreeMap<String, String> = target
                .annotations()
                .iter()
                .filter(|(k, _)| !rollout::NOT_COPIED_ANNOTATIONS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            json!({
                "metadata": { "annotations": annotations },
                "spec": { "template": template, "rollbackTo": null }
            })
        }
    } else {
        ctx.recorder
            .record(
                deployment,
                EventType::Warning,
                "DeploymentRollbackRevisionNotFound",
                &format!("Unable to find the revision {revision} to roll back to"),
            )
            .await;
        json!({ "spec": { "rollbackTo": null } })
    };
    ctx.deployments()
        .patch(
            &deployment.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await?;
    Ok(())
}

/// The replicas annotations of a scale, plus the autoscaler's last replica change (the set controller compares the
/// machines' marked times with it), written together with `spec.replicas` so the set never sees one without the
/// other.
fn scale_patch(deployment: &MachineDeployment, replicas: i32, fenceposts: rollout::Fenceposts) -> Value {
    let mut annotations: serde_json::Map<String, Value> =
        rollout::replicas_annotations(deployment.spec.replicas, fenceposts)
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
    if let Some(time) = deployment
        .annotations()
        .get(keys::annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME)
    {
        annotations.insert(
            keys::annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME.to_owned(),
            Value::String(time.clone()),
        );
    }
    json!({ "metadata": { "annotations": annotations }, "spec": { "replicas": replicas } })
}

/// The status subresource merge patch writing every field the deployment controller owns.
fn status_patch(status: &MachineDeploymentStatus) -> Value {
    json!({ "status": {
        "observedGeneration": status.observed_generation,
        "replicas": status.replicas,
        "updatedReplicas": status.updated_replicas,
        "readyReplicas": status.ready_replicas,
        "availableReplicas": status.available_replicas,
        "unavailableReplicas": status.unavailable_replicas,
        "conditions": status.conditions,
    } })
}

#[allow(clippy::too_many_lines)] // the order of the acts is the contract of RolloutPlan; one place reads best
async fn reconcile(deployment: Arc<MachineDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.synced() {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    let name = deployment.name_any();
    let started = std::time::Instant::now();
    if let Some(wait) = ctx.throttle.wait(&name, started) {
        return Ok(Action::requeue(wait));
    }
    let result = pass(deployment, &ctx).await;
    let ended = std::time::Instant::now();
    ctx.throttle.record(&name, ended, ended - started);
    result
}

/// One pass over a deployment (held by [`reconcile`] when the last one was too recent, see [`crate::throttle`]).
#[allow(clippy::too_many_lines)] // the order of the acts is the contract of RolloutPlan; one place reads best
async fn pass(deployment: Arc<MachineDeployment>, ctx: &Context) -> Result<Action, Error> {
    if deployment.is_deleting() {
        // Its sets go by garbage collection (owner references), their machines by the set controller.
        return Ok(Action::await_change());
    }
    let name = deployment.name_any();
    let now = jiff::Timestamp::now();
    let all_sets = ctx.sets.state();
    let owned: Vec<&MachineSet> = all_sets
        .iter()
        .map(|s| &**s)
        .filter(|s| owned_by(s, &deployment))
        .collect();
    let set_machines: Vec<(String, Vec<Arc<Machine>>)> = owned
        .iter()
        .map(|s| (s.name_any(), machines_of(s, ctx)))
        .collect();
    let machines_by_set: BTreeMap<String, Vec<&Machine>> = set_machines
        .iter()
        .map(|(set, machines)| (set.clone(), machines.iter().map(|m| &**m).collect()))
        .collect();
    // An invalid deployment (an empty selector among other things) is held: nothing is done to its sets.
    if let Some(invalid) = validity::check_machine_deployment(&deployment) {
        return held::hold(&deployment, &owned, &machines_by_set, &invalid, ctx, now).await;
    }
    ctx.warned.forget(&*deployment);
    ctx.no_effect
        .warn(
            &ctx.recorder,
            &*deployment,
            &mcm_core::ignored::of_machine_deployment(&deployment),
        )
        .await;

    // The cluster-autoscaler's handshake comes first: the machines it chose must carry their marks before any set
    // is scaled down.
    let machine_named = |name: &str| {
        machines_by_set
            .values()
            .flatten()
            .copied()
            .find(|m| m.metadata.name.as_deref() == Some(name))
    };
    if autoscaler::handshake(
        &deployment,
        machine_named,
        &ctx.machine_api(),
        &ctx.deployments(),
        now,
    )
    .await?
    {
        return Ok(Action::requeue(RETRY_SOON));
    }

    if let Some(rollback) = &deployment.spec.rollback_to {
        roll_back(&deployment, &owned, rollback.revision, ctx).await?;
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
    let live = |set: &MachineSet| {
        machines_by_set.get(&set.name_any()).map_or(0, |machines| {
            i32::try_from(machines.iter().filter(|m| !m.is_deleting()).count()).unwrap_or(i32::MAX)
        })
    };
    // A set's status lags its machines by as long as its controller takes to write it (a set just created, or a
    // busy set controller, shows 0): the machines the cache holds count too, so that the surge is reckoned with every
    // machine that exists (a rolling update once had 4 old machines and 3 new ones with maxSurge 1 because the old
    // set's status still said 0).
    let cached = |set: &MachineSet| {
        machines_by_set
            .get(&set.name_any())
            .map_or(0, |machines| i32::try_from(machines.len()).unwrap_or(i32::MAX))
    };
    let view = |set: &MachineSet| {
        let of = SetView::of(set);
        SetView {
            live: live(set),
            actual: of.actual.max(cached(set)),
            ..of
        }
    };
    let new_view = new.map(view);
    let old_sets: Vec<&MachineSet> = owned
        .iter()
        .copied()
        .filter(|s| Some(s.name_any()) != new.map(ResourceExt::name_any))
        .collect();
    let old_views: Vec<SetView> = old_sets.iter().map(|s| view(s)).collect();
    let in_place_plan = if strategy == StrategyType::InPlaceUpdate {
        let Some(nodes) = &ctx.nodes else {
            tracing::warn!(deployment = %name, "{}", in_place::NO_TARGET);
            ctx.recorder
                .record(
                    &*deployment,
                    EventType::Warning,
                    "InvalidSpec",
                    in_place::NO_TARGET,
                )
                .await;
            return Ok(Action::requeue(ctx.config.resync));
        };
        Some(in_place::decide(
            &deployment,
            fenceposts,
            &owned,
            new_view.as_ref(),
            &old_views,
            &machines_by_set,
            nodes,
        ))
    } else {
        None
    };
    let plan = match &in_place_plan {
        Some(in_place) => in_place.rollout.clone(),
        None => rollout::step(&RolloutInput {
            replicas: deployment.spec.replicas,
            strategy,
            fenceposts,
            paused: deployment.spec.paused,
            new: new_view.as_ref(),
            old: &old_views,
        }),
    };

    let mut created = None;
    if let Some(replicas) = plan.create_new {
        let set = new_set(&deployment, &owned, replicas, fenceposts);
        match ctx.set_api().create(&PostParams::default(), &set).await {
            Ok(set) => {
                crash_point!(RolloutCreateSet, &name);
                record_scaled(&deployment, &set.name_any(), "up", replicas, ctx).await;
                created = Some(set);
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
            Err(err) => {
                ctx.recorder
                    .record(
                        &*deployment,
                        EventType::Warning,
                        "MachineSetCreateError",
                        &format!("Failed to create new machine set {:?}: {err}", set.name_any()),
                    )
                    .await;
                return Err(err.into());
            }
        }
    }

    // Every write to a set in this pass, merged into one patch per set.
    let mut patches: BTreeMap<String, Value> = BTreeMap::new();
    let revision = rollout::next_revision(old_sets.iter().copied());
    // A set reused by a rollback is found again as the new one and takes the newest revision.
    let found = new.is_some_and(|set| rollout::revision(set).is_some_and(|r| r < revision));
    if let Some(new) = new
        && let Some(sync) = rollout::new_set_sync(&deployment, new, revision)
    {
        patches.insert(new.name_any(), sync);
    }
    let mut scaled = Vec::new();
    for scale in &plan.scale {
        merge_patches(
            patches.entry(scale.name.clone()).or_insert_with(|| json!({})),
            scale_patch(&deployment, scale.replicas, fenceposts),
        );
        let before = owned
            .iter()
            .find(|s| s.name_any() == scale.name)
            .map_or(0, |s| s.spec.replicas);
        scaled.push((scale.name.clone(), before, scale.replicas));
    }
    for (sets, value) in [
        (&plan.disable_scale_up, json!("true")),
        (&plan.enable_scale_up, Value::Null),
    ] {
        for set in sets {
            merge_patches(
                patches.entry(set.clone()).or_insert_with(|| json!({})),
                json!({ "metadata": { "labels": { keys::labels::SCALE_UP_DISABLED: value } } }),
            );
        }
    }
    let rolling_out = old_views.iter().any(|s| s.replicas > 0 || s.actual > 0)
        || old_sets
            .iter()
            .any(|s| machines_by_set.get(&s.name_any()).is_some_and(|m| !m.is_empty()));
    if rolling_out {
        // Old sets with machines carry the PreferNoSchedule mark (as their nodes carry the taint).
        for (set, view) in old_sets.iter().zip(&old_views) {
            let has_machines = view.replicas > 0 || view.actual > 0;
            if has_machines
                && !set
                    .annotations()
                    .contains_key(keys::annotations::PREFER_NO_SCHEDULE)
            {
                merge_patches(
                    patches.entry(set.name_any()).or_insert_with(|| json!({})),
                    json!({ "metadata": { "annotations": { keys::annotations::PREFER_NO_SCHEDULE: "True" } } }),
                );
            }
        }
    }
    for (set, patch) in &patches {
        ctx.set_api()
            .patch(set, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        crash_point!(RolloutPatchSet, &name);
    }
    for (set, before, after) in scaled {
        let direction = if after >= before { "up" } else { "down" };
        record_scaled(&deployment, &set, direction, after, ctx).await;
    }

    let mut requeue = ctx.config.resync;
    if let (Some(target), Some(nodes)) = (&ctx.target, &ctx.nodes) {
        // The in-place acts first; the nodes they wrote get their marks on the next pass, which sees the writes.
        let mut written = std::collections::BTreeSet::new();
        if let Some(in_place) = &in_place_plan {
            let acted = in_place::act(
                &deployment,
                &in_place.actions,
                &owned,
                fenceposts,
                target,
                nodes,
                ctx,
            )
            .await?;
            if acted.retry_soon {
                requeue = RETRY_SOON;
            }
            written = acted.nodes;
        }
        let old_names: Vec<String> = old_sets.iter().map(|s| s.name_any()).collect();
        let machines: Vec<(&Machine, bool)> = machines_by_set
            .iter()
            .flat_map(|(set, machines)| {
                let old = old_names.contains(set);
                machines.iter().map(move |m| (*m, old))
            })
            .filter(|(m, _)| m.node_name().is_none_or(|n| !written.contains(n)))
            .collect();
        let marked = autoscaler::mark_nodes(
            target,
            nodes,
            &machines,
            rolling_out,
            ctx.config.autoscaler_scale_down_annotation_during_rollout,
            now,
        )
        .await?;
        if marked.retry_soon {
            requeue = RETRY_SOON;
        }
    }

    if plan.phase == RolloutPhase::Complete {
        for set in rollout::history_to_clean_up(&old_sets, deployment.spec.revision_history_limit) {
            match ctx
                .set_api()
                .delete(&set.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {
                    crash_point!(RolloutCleanup, &name);
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(err.into()),
            }
        }
    }

    // The deployment mirrors its new set's revision.
    let new_name = created
        .as_ref()
        .map(ResourceExt::name_any)
        .or_else(|| new.map(ResourceExt::name_any));
    let new_revision = if created.is_none() && found {
        Some(revision)
    } else {
        created.as_ref().or(new).and_then(rollout::revision)
    };
    if let Some(revision) = new_revision.filter(|r| *r > 0)
        && deployment.annotations().get(keys::annotations::REVISION) != Some(&revision.to_string())
    {
        ctx.deployments()
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "annotations": { keys::annotations::REVISION: revision.to_string() } } })),
            )
            .await?;
        crash_point!(RolloutRevision, &name);
    }

    let counts = rollout::status_counts(new_view.as_ref(), &old_views);
    let original = deployment.status.clone().unwrap_or_default();
    // Conditions an invalid spec left are dropped: Available and Progressing are computed afresh.
    let current = MachineDeploymentStatus {
        conditions: validity::without_invalid_spec(&original.conditions),
        ..original.clone()
    };
    let available =
        rollout::has_minimum_availability(deployment.spec.replicas, fenceposts, counts.available_replicas, 0);
    let mut conditions: Vec<MachineDeploymentCondition> = current
        .conditions
        .iter()
        .filter(|c| c.r#type != MachineDeploymentConditionType::Available)
        .cloned()
        .collect();
    conditions.push(if available {
        condition(
            &current.conditions,
            MachineDeploymentConditionType::Available,
            ConditionStatus::True,
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
            false,
            now,
        )
    } else {
        condition(
            &current.conditions,
            MachineDeploymentConditionType::Available,
            ConditionStatus::False,
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
            false,
            now,
        )
    });
    let previous = current
        .conditions
        .iter()
        .find(|c| c.r#type == MachineDeploymentConditionType::Progressing);
    let progress = rollout::progressing(&ProgressInput {
        previous: previous.map(|c| {
            (
                c.status,
                c.reason.as_str(),
                c.last_update_time.as_ref().map(|t| t.0),
            )
        }),
        paused: deployment.spec.paused,
        phase: plan.phase,
        new_set: new_name.as_deref(),
        created: created.is_some(),
        found,
        before: counts_of(&current),
        after: counts,
        deadline_seconds: deployment.spec.progress_deadline_seconds,
        now,
    });
    if let Some(progress) = &progress {
        conditions.retain(|c| c.r#type != MachineDeploymentConditionType::Progressing);
        conditions.push(condition(
            &current.conditions,
            MachineDeploymentConditionType::Progressing,
            progress.status,
            progress.reason,
            &progress.message,
            progress.touch,
            now,
        ));
        if progress.reason == rollout::reasons::PROGRESS_DEADLINE_EXCEEDED
            && previous.is_none_or(|p| p.reason != progress.reason)
        {
            ctx.recorder
                .record(
                    &*deployment,
                    EventType::Warning,
                    progress.reason,
                    &progress.message,
                )
                .await;
        }
    }
    // Look again when the deadline would pass without progress.
    if !deployment.spec.paused && plan.phase != RolloutPhase::Complete {
        let last = conditions
            .iter()
            .find(|c| c.r#type == MachineDeploymentConditionType::Progressing)
            .filter(|c| c.reason != rollout::reasons::PROGRESS_DEADLINE_EXCEEDED)
            .and_then(|c| c.last_update_time.as_ref())
            .map(|t| t.0);
        if let Some(deadline) =
            last.and_then(|at| rollout::progress_deadline(deployment.spec.progress_deadline_seconds, at))
        {
            let wait = deadline.duration_since(now).unsigned_abs() + Duration::from_millis(100);
            requeue = requeue.min(if deadline > now { wait } else { RETRY_SOON });
        }
    }
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
    if status != original {
        ctx.deployments()
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(status_patch(&status)),
            )
            .await?;
        crash_point!(RolloutStatus, &name);
    }
    Ok(Action::requeue(requeue))
}
