//! The MachineSet controller, the acting half of `mcm_core::machineset`: claim machines (adopt matching orphans,
//! release those that stopped matching), ask `decide` for the pass, delete and create machines (slow-start
//! batches, expectations raised so that a lagging cache never yields an extra machine), propagate the template to
//! existing machines, and write the status only when it changes.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::{FutureExt, StreamExt, future::join_all};
use k8s_openapi::Resource as _;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use mcm_api::{Machine, MachineDeployment, MachineSet, MetaExt, keys};
use mcm_core::finalizers::FinalizerChange;
use mcm_core::machineset::{
    self, Expectations, MachineSetInput, ManageResult, ReplicaFailure, ReplicaFailureReason,
};
use mcm_core::validity::{self, InvalidSpec};

use crate::events::{EventType, Recorder};

/// How the MachineSet controller runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The namespace of the sets and machines.
    pub namespace: String,
    /// Sets reconciled at once.
    pub concurrency: u16,
    /// How often a set is looked at again without a change.
    pub resync: Duration,
    /// Whether `availableReplicas` waits `minReadySeconds` (`--honour-min-ready-seconds`; the reference does not).
    pub min_ready_seconds: machineset::MinReadySeconds,
}

pub use crate::Error;

struct Context {
    client: Client,
    config: Config,
    machines: Store<Machine>,
    /// Whether the shared machine cache has synced (never ask the store itself: `crate::shared_cache`).
    machines_synced: crate::shared_cache::Synced,
    /// The machines of each set (and the orphans), beside `machines`.
    owners: crate::owners::OwnerIndex,
    expectations: std::sync::Mutex<BTreeMap<String, Expectations>>,
    recorder: Recorder,
    /// The invalid sets warned about.
    warned: crate::invalid::Warned,
    /// The sets and machines warned about for settings that have no effect.
    no_effect: crate::ignored::NoEffect,
    /// Counts the stale machines removed (`mcm_machine_stale_machines_total`).
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl Context {
    fn sets(&self) -> Api<MachineSet> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn machine_api(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn with_expectations<T>(&self, set: &str, f: impl FnOnce(&mut Expectations) -> T) -> T {
        let mut all = self
            .expectations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(all.entry(set.to_owned()).or_default())
    }
}

/// Runs the MachineSet controller on the process's shared machine cache until `shutdown` resolves. With `metrics`,
/// its set cache feeds them at scrape time and its reconciles are metered; `None` runs the controller alone.
pub async fn run(
    client: Client,
    config: Config,
    caches: crate::shared_cache::Caches,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let namespace = config.namespace.clone();
    // The set queue's triggers are metered (the work queue metrics): the controller is built on its own watch.
    let meter = crate::metrics::Metrics::reconcile_meter(metrics.as_ref(), "machineset");
    let (sets, set_writer) = reflector::store::<MachineSet>();
    let controller = Controller::for_stream(
        meter.triggers(
            reflector::reflector(
                set_writer,
                watcher(
                    Api::<MachineSet>::namespaced(client.clone(), &namespace),
                    watcher::Config::default(),
                ),
            )
            .applied_objects(),
        ),
        sets.clone(),
    );
    let set_store = sets.clone();
    if let Some(metrics) = &metrics {
        metrics.attach_machine_sets(sets.clone());
    }
    let mapper_namespace = namespace.clone();
    let owners = caches.owners.clone();
    let by_machine = move |machine: Arc<Machine>| -> Vec<ObjectRef<MachineSet>> {
        // The set a machine just left (an in-place transfer, a release) counts it no more: its status must say so.
        let left: Vec<ObjectRef<MachineSet>> = owners
            .moved_from(&machine)
            .and_then(|uid| {
                sets.state()
                    .iter()
                    .find(|set| set.uid().as_deref() == Some(uid.as_str()))
                    .map(|set| ObjectRef::from_obj(&**set))
            })
            .into_iter()
            .collect();
        if let Some(owner) = machine.controller_ref() {
            if owner.kind == MachineSet::KIND {
                return [ObjectRef::new(&owner.name).within(&mapper_namespace)]
                    .into_iter()
                    .chain(left)
                    .collect();
            }
            return left;
        }
        // An orphan: the sets that would adopt it.
        sets.state()
            .iter()
            .filter(|set| machineset::selects(set, &machine))
            .map(|set| ObjectRef::from_obj(&**set))
            .chain(left)
            .collect()
    };
    let context = Arc::new(Context {
        recorder: Recorder::new(client.clone(), "machineset-controller"),
        client,
        config: config.clone(),
        machines: caches.machines.store(),
        machines_synced: caches.machines.readiness(),
        owners: caches.owners.clone(),
        expectations: std::sync::Mutex::default(),
        warned: crate::invalid::Warned::default(),
        no_effect: crate::ignored::NoEffect::default(),
        metrics: metrics.clone(),
    });
    let shutdown = shutdown.boxed().shared();
    let work = controller
        .watches_shared_stream(caches.machines.objects(), meter.mapper(by_machine))
        .with_config(kube::runtime::controller::Config::default().concurrency(config.concurrency))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            meter.reconcile(crate::logging::traced(
                crate::logging::Kind::MachineSet,
                reconcile,
            )),
            meter.error_policy(error_policy),
            context,
        )
        .for_each(|result| {
            meter.outcome(&result);
            async move {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "machine set reconcile ended with an error");
                }
            }
        });
    crate::cache::until_stopped(work, || crate::cache::synced(&set_store), shutdown).await;
}

#[allow(clippy::needless_pass_by_value)] // the signature is kube-runtime's
fn error_policy(set: Arc<MachineSet>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(set = %set.name_any(), error = %error, "machine set reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// The delete-policy annotation of the set's MachineDeployment, if it is owned by one.
async fn deployment_delete_policy(set: &MachineSet, ctx: &Context) -> Option<String> {
    let owner = set.controller_ref_of_kind(MachineDeployment::KIND)?;
    let api: Api<MachineDeployment> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let deployment = api.get_opt(&owner.name).await.ok().flatten()?;
    deployment
        .annotations()
        .get(keys::extensions::DELETE_POLICY)
        .cloned()
}

async fn reconcile(set: Arc<MachineSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.machines_synced.get() {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    pass(set, &ctx).await
}

#[allow(clippy::too_many_lines)] // the order of the acts is the contract of MachineSetPlan; one place reads best
async fn pass(set: Arc<MachineSet>, ctx: &Context) -> Result<Action, Error> {
    let name = set.name_any();
    let now = jiff::Timestamp::now();
    // The set's machines and the orphans it may adopt: all that `claim_machines` does not ignore.
    let uid = set.uid().unwrap_or_default();
    // The machines whose creation or deletion is awaited, as the cache holds them, looked up before the set's own:
    // the cache only moves forward, so a creation seen here is among `all` too. Looked up after `all`, a machine that
    // arrived in between met its expectation without being counted, and the set created one too many.
    let awaited: Vec<Arc<Machine>> = ctx
        .with_expectations(&name, |e| e.awaited().map(str::to_owned).collect::<Vec<_>>())
        .iter()
        .filter_map(|machine| {
            ctx.machines
                .get(&ObjectRef::new(machine).within(&ctx.config.namespace))
        })
        .collect();
    let all = ctx
        .owners
        .machines(&ctx.machines, &ctx.config.namespace, &uid, true);
    let claims = machineset::claim_machines(&set, all.iter().map(|m| &**m));
    if !set.is_deleting()
        && let Some(invalid) = validity::check_machine_set(&set)
    {
        return hold(&set, &claims.owned, &invalid, ctx, now).await;
    }
    warn_no_effect(&set, &claims.owned, ctx).await;
    let mut owned: Vec<&Machine> = claims.owned.clone();
    for machine in &claims.adopt {
        match ctx
            .machine_api()
            .patch(
                &machine.name_any(),
                &PatchParams::default(),
                &Patch::Merge(machineset::adoption_patch(&set, machine)),
            )
            .await
        {
            Ok(_) => owned.push(machine),
            Err(err) => {
                tracing::warn!(set = %name, machine = %machine.name_any(), error = %err, "adoption failed");
            }
        }
        crash_point!(SetAdopt, &name);
    }
    for machine in &claims.release {
        let _ = ctx
            .machine_api()
            .patch(
                &machine.name_any(),
                &PatchParams::default(),
                &Patch::Merge(machineset::release_patch(&set, machine)),
            )
            .await;
    }
    // Auto-preservation first, so that the machines it annotates are kept by this very pass (reference order).
    let mut annotated: Vec<Machine> = Vec::new();
    if !set.is_deleting() {
        for patch in machineset::auto_preservation(&set, &owned) {
            match ctx
                .machine_api()
                .patch(
                    &patch.name,
                    &PatchParams::default(),
                    &Patch::Merge(patch.patch.clone()),
                )
                .await
            {
                Ok(machine) => {
                    tracing::info!(set = %name, machine = %patch.name, patch = %patch.patch, "auto-preservation");
                    annotated.push(machine);
                }
                Err(err) => {
                    tracing::warn!(set = %name, machine = %patch.name, error = %err, "auto-preservation write failed");
                }
            }
        }
    }
    let owned: Vec<&Machine> = owned
        .into_iter()
        .map(|m| {
            annotated
                .iter()
                .find(|a| a.metadata.name == m.metadata.name)
                .unwrap_or(m)
        })
        .collect();
    let expectations = ctx.with_expectations(&name, |e| {
        // Besides the set's own machines, the awaited ones (one may have another owner); the later look, `all`, wins.
        e.observe(awaited.iter().chain(&all).map(|m| &**m));
        e.expire(now);
        e.clone()
    });
    let random = rand::random();
    let decide = |policy: Option<&str>| {
        machineset::decide(&MachineSetInput {
            set: &set,
            machines: &owned,
            expectations: &expectations,
            deployment_delete_policy: policy,
            now,
            random,
        })
    };
    // The deployment's delete policy only orders deletions: it is read (a GET, the set controller caches no
    // deployments) only in a pass that deletes machines, not in every pass (issue 26).
    let mut plan = decide(None);
    if !plan.delete.is_empty()
        && let Some(policy) = deployment_delete_policy(&set, ctx).await
    {
        plan = decide(Some(&policy));
    }
    if let Some(problem) = &plan.policy_problem {
        ctx.recorder
            .record(
                &*set,
                EventType::Warning,
                "InvalidDeletePolicy",
                &problem.to_string(),
            )
            .await;
    }
    if plan.add_finalizer {
        if let Some(patch) = mcm_core::finalizers::patch(
            &set.metadata,
            keys::finalizers::MACHINE_CONTROLLER_MANAGER,
            FinalizerChange::Add,
        ) {
            ctx.sets()
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
            crash_point!(SetFinalizer, &name);
        }
        // The set's own change reconciles it again, with the finalizer in place.
        return Ok(Action::await_change());
    }
    for patch in &plan.propagate {
        ctx.machine_api()
            .patch(
                &patch.name,
                &PatchParams::default(),
                &Patch::Merge(patch.patch.clone()),
            )
            .await?;
    }
    // A deletion refused because the machine changed means the plan was decided on a stale view: its creations
    // (a Failed machine's replacement, say) wait for the pass that the machine's event brings, lest the set run
    // one machine over while the machine it would replace lives on.
    let mut decided_on_stale = false;
    // The machines as decided on, by name: one lookup per deletion rather than a scan of the set's machines.
    let decided_on: BTreeMap<&str, &Machine> = if plan.delete.is_empty() {
        BTreeMap::new()
    } else {
        owned
            .iter()
            .filter_map(|m| Some((m.metadata.name.as_deref()?, *m)))
            .collect()
    };
    let mut result = if plan.delete.is_empty() && plan.create == 0 {
        ManageResult::NotRun
    } else {
        ManageResult::Succeeded
    };
    for deletion in &plan.delete {
        ctx.with_expectations(&name, |e| e.expect_deletion(deletion.name.clone(), now));
        // Guarded by the version decided on: a machine changed since (moved to another set by an in-place transfer
        // this cache has not seen yet, say) is not deleted but decided on again when its event comes.
        let decided_on = decided_on.get(deletion.name.as_str());
        let params = DeleteParams {
            preconditions: decided_on.map(|m| Preconditions {
                uid: m.uid(),
                resource_version: m.resource_version(),
            }),
            ..DeleteParams::default()
        };
        match ctx.machine_api().delete(&deletion.name, &params).await {
            Ok(_) => {
                crash_point!(SetDeleteMachine, &name);
                let deleted =
                    ObjectRef::<Machine>::new(&deletion.name).within(&set.namespace().unwrap_or_default());
                if let (Some(metrics), Some(machine)) = (&ctx.metrics, ctx.machines.get(&deleted))
                    && crate::metrics::turned_stale(&machine)
                {
                    metrics.stale_machine_removed();
                }
                ctx.recorder
                    .record(
                        &*set,
                        EventType::Normal,
                        "SuccessfulDelete",
                        &format!("Deleted machine {} ({})", deletion.name, deletion.reason.as_str()),
                    )
                    .await;
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::debug!(set = %name, machine = %deletion.name, "the machine changed since the decision: not deleted");
                ctx.with_expectations(&name, |e| e.deletion_failed(&deletion.name));
                decided_on_stale = true;
            }
            Err(err) => {
                ctx.with_expectations(&name, |e| e.deletion_failed(&deletion.name));
                result = ManageResult::Failed(ReplicaFailure {
                    reason: ReplicaFailureReason::FailedDelete,
                    message: err.to_string(),
                });
            }
        }
    }
    if plan.create > 0 && !decided_on_stale {
        let template = machineset::machine_to_create(&set);
        let machines = ctx.machine_api();
        let params = PostParams::default();
        'batches: for batch in &plan.create_batches {
            let calls = (0..*batch).map(|_| machines.create(&params, &template));
            let mut failed = false;
            for created in join_all(calls).await {
                match created {
                    Ok(machine) => {
                        let machine_name = machine.name_any();
                        ctx.with_expectations(&name, |e| e.expect_creation(machine_name.clone(), now));
                        ctx.recorder
                            .record(
                                &*set,
                                EventType::Normal,
                                "SuccessfulCreate",
                                &format!("Created machine {machine_name}"),
                            )
                            .await;
                    }
                    Err(err) => {
                        if !matches!(&err, kube::Error::Api(_)) {
                            // The outcome is unknown (the machine may exist): wait rather than risk a second one.
                            ctx.with_expectations(&name, |e| e.expect_unknown_creation(now));
                        }
                        ctx.recorder
                            .record(&*set, EventType::Warning, "FailedCreate", &err.to_string())
                            .await;
                        result = ManageResult::Failed(ReplicaFailure {
                            reason: ReplicaFailureReason::FailedCreate,
                            message: err.to_string(),
                        });
                        failed = true;
                    }
                }
            }
            crash_point!(SetCreateMachines, &name);
            if failed {
                break 'batches;
            }
        }
    }
    if plan.remove_finalizer {
        if let Some(patch) = mcm_core::finalizers::patch(
            &set.metadata,
            keys::finalizers::MACHINE_CONTROLLER_MANAGER,
            FinalizerChange::Remove,
        ) {
            ctx.sets()
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
        }
        if let Ok(mut all) = ctx.expectations.lock() {
            all.remove(&name);
        }
        return Ok(Action::await_change());
    }
    let mut status = machineset::status(&set, &owned, &result, ctx.config.min_ready_seconds, now);
    // Valid (again): a condition an invalid spec left goes.
    status.update.status.conditions = validity::set_conditions(&status.update.status.conditions, None, now);
    ctx.warned.forget(&*set);
    if status.update.changes(set.status.as_ref()) {
        ctx.sets()
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(status.update.merge_patch()),
            )
            .await?;
        crash_point!(SetStatus, &name);
    }
    let requeue = [plan.requeue_after, status.recheck_after, Some(ctx.config.resync)]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(ctx.config.resync);
    Ok(Action::requeue(requeue))
}

/// Warns once about what the set and its machines set that has no effect (`mcm_core::ignored`): among others a
/// preserve annotation without an expiry, which is why such a Failed machine is replaced rather than kept.
async fn warn_no_effect(set: &MachineSet, machines: &[&Machine], ctx: &Context) {
    ctx.no_effect
        .warn(&ctx.recorder, set, &mcm_core::ignored::of_machine_set(set))
        .await;
    for machine in machines {
        ctx.no_effect
            .warn(&ctx.recorder, *machine, &mcm_core::ignored::of_machine(machine))
            .await;
    }
}

/// A pass over an invalid set (`mcm_core::validity`): no adoption, release, creation, deletion or propagation; the
/// status counts observed, `ReplicaFailure=True` with reason `InvalidSpec`, and one Warning Event per distinct
/// problem.
async fn hold(
    set: &MachineSet,
    owned: &[&Machine],
    invalid: &InvalidSpec,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Result<Action, Error> {
    let mut status = machineset::status(
        set,
        owned,
        &ManageResult::NotRun,
        ctx.config.min_ready_seconds,
        now,
    );
    let current = set.status.clone().unwrap_or_default();
    status.update.status.conditions = validity::set_conditions(&current.conditions, Some(invalid), now);
    if status.update.changes(set.status.as_ref()) {
        ctx.sets()
            .patch_status(
                &set.name_any(),
                &PatchParams::default(),
                &Patch::Merge(status.update.merge_patch()),
            )
            .await?;
    }
    ctx.warned
        .warn(
            &ctx.recorder,
            set,
            validity::set_invalid_message(&current.conditions),
            invalid,
        )
        .await;
    let requeue = status
        .recheck_after
        .map_or(ctx.config.resync, |r| r.min(ctx.config.resync));
    Ok(Action::requeue(requeue))
}
