//! One machine's reconcile: observe (caches, references, validity), then hand over to creation, health, migration
//! or deletion; invalid input is reported on the machine.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The merged secret of a class: `secretRef` data with `credentialsSecretRef` data on top (credentials win). A
/// missing secret counts as empty, as in the reference; the second value names the missing ones
/// (`mcm_core::validity::missing_secrets`).
pub(super) fn merged_secret(
    ctx: &Context,
    class: &MachineClass,
) -> (Secret, Vec<descriptions::MissingSecret>) {
    let secret = crate::secrets::merged(
        mcm_core::validity::secret_references(class, &ctx.config.namespace)
            .filter_map(|(_, namespace, name)| ctx.secrets.get(&ObjectRef::new(name).within(namespace)))
            .map(|secret| (*secret).clone()),
    );
    let missing = mcm_core::validity::missing_secrets(class, &ctx.config.namespace, |namespace, name| {
        ctx.secrets.get(&ObjectRef::new(name).within(namespace)).is_some()
    });
    (secret, missing)
}

/// A new machine whose class or secret has not been seen yet waits a moment instead of being reported: they
/// arrive on other watches than the machine, and their events reconcile it when they do.
pub(super) fn waiting_for_references(machine: &Machine) -> bool {
    machine.status.is_none()
        && machine
            .metadata
            .creation_timestamp
            .as_ref()
            .is_some_and(|created| {
                jiff::Timestamp::now().duration_since(created.0).unsigned_abs() < CLASS_ARRIVAL_GRACE
            })
}

pub(super) async fn write_status(
    ctx: &Context,
    machine: &Machine,
    update: &StatusUpdate,
) -> Result<(), Error> {
    if !update.changes(machine.status.as_ref()) {
        return Ok(());
    }
    let written = ctx
        .machine_api()
        .patch_status(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(update.merge_patch()),
        )
        .await?;
    crash_point!(status update.phase(), &machine.name_any());
    let key = format!("machine/{}", machine.name_any());
    ctx.wrote(
        &key,
        machine.resource_version(),
        written.resource_version().as_deref(),
    );
    Ok(())
}

/// Whether the class, secret and node caches have synced (without waiting: see [`crate::cache::synced`]).
pub(super) fn caches_ready(ctx: &Context) -> bool {
    crate::cache::synced(&ctx.classes)
        && crate::cache::synced(&ctx.secrets)
        && ctx
            .nodes_synced
            .as_ref()
            .is_none_or(crate::shared_cache::Synced::get)
}

pub(super) async fn reconcile(machine: Arc<Machine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = machine.name_any();
    // Decide only on synced caches: a class or secret not seen yet is not missing. Look, never wait: kube's
    // `Store::wait_until_ready` wakes only the last of several concurrent waiters (one oneshot receiver, one
    // waker), so reconciles started together before the caches synced (a restarted controller) hung for ever.
    if !caches_ready(&ctx) {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    if let Some(node) = machine.node_name() {
        let mut index = ctx
            .node_index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        index.insert(node.to_owned(), name.clone());
        // Entries of deleted machines go once they could be half of the index (amortized: never per reconcile).
        if index.len() > (2 * ctx.machines.len()).max(64) {
            let namespace = &ctx.config.namespace;
            index.retain(|_, machine| {
                ctx.machines
                    .get(&ObjectRef::new(machine).within(namespace))
                    .is_some()
            });
        }
    }
    if ctx.stale(&format!("machine/{name}"), machine.resource_version().as_deref()) {
        // Our own write is on its way through the watch; its event reconciles again.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    if machine.is_deleting() {
        return delete(&machine, &ctx).await;
    }
    if ctx.freeze.is_frozen() {
        // An API server is unreachable: what we would see of nodes is stale, so nothing is decided (reference
        // "LongRetry"); the unfreeze restarts the health clocks and its status writes reconcile again.
        return Ok(Action::requeue(FROZEN_RETRY));
    }
    if let Some(patch) = mcm_core::finalizers::patch(
        &machine.metadata,
        keys::finalizers::MACHINE_CONTROLLER_MANAGER,
        FinalizerChange::Add,
    ) {
        return add_finalizer(&name, patch, &ctx).await;
    }
    if mcm_core::migration::needs_migration(&machine.spec.class) {
        return migrate_class(&machine, &ctx).await;
    }
    let problems = validation::validate_machine(&machine);
    let class = ctx
        .classes
        .get(&ObjectRef::new(&machine.spec.class.name).within(&ctx.config.namespace));
    if class.is_none() && problems.is_empty() && waiting_for_references(&machine) {
        // The class's watch event reconciles this machine when it arrives; look again after the grace anyway.
        return Ok(Action::requeue(CLASS_ARRIVAL_GRACE));
    }
    let problems = match (&class, problems.is_empty()) {
        (_, false) => validation::summarize(&problems),
        (None, true) => descriptions::class_not_found(
            <MachineClass as k8s_openapi::Resource>::KIND,
            &machine.spec.class.name,
        ),
        (Some(class), true) => validation::summarize(&validation::validate_machine_class(class)),
    };
    let Some(class) = class.filter(|_| problems.is_empty()) else {
        return report_invalid(&machine, &ctx, problems).await;
    };
    if let Some(problem) = ctx.undecodable.problem_of(&class, &ctx.config.namespace) {
        return report_invalid(&machine, &ctx, problem).await;
    }
    let (secret, missing) = merged_secret(&ctx, &class);
    if !missing.is_empty() {
        if waiting_for_references(&machine) {
            return Ok(Action::requeue(CLASS_ARRIVAL_GRACE));
        }
        if creation::needs_creation(&machine) {
            // Named as it is (not as a missing userData key); the secret's arrival reconciles the machine.
            let description = Description::SecretNotFound { missing };
            report_blocked(&machine, &ctx, &description, validity::SECRET_NOT_FOUND).await?;
            return Ok(Action::requeue(ctx.config.settings.retry.await_change_resync));
        }
    }
    let redactor = Redactor::from_secret_data(secret.data.as_ref().unwrap_or(&BTreeMap::new()));
    let now = jiff::Timestamp::now();
    if creation::needs_creation(&machine) {
        return create(&machine, &class, &secret, &redactor, &ctx, now).await;
    }
    ctx.memory.change(&name, Attempts::creation_done);
    let node_name = machine.labels().get(keys::labels::NODE).cloned();
    let node = node_name.as_deref().and_then(|n| ctx.node(n));
    let mut requeue = None;
    if ctx.target.is_some() {
        requeue = check_health(&machine, &class, &secret, node.as_deref(), &redactor, &ctx, now).await?;
        if let Some(node) = &node {
            sync_node(&machine, &class, node, &ctx).await?;
            if let Some(after) = manage_in_place_update(&machine, node, &redactor, &ctx, now).await? {
                requeue = Some(requeue.map_or(after, |r: Duration| r.min(after)));
            }
        }
    }
    if let Some(after) = manage_preservation(&machine, node.as_deref(), &ctx, now).await? {
        requeue = Some(requeue.map_or(after, |r: Duration| r.min(after)));
    }
    Ok(requeue.map_or_else(
        || Action::requeue(ctx.config.settings.retry.await_change_resync),
        Action::requeue,
    ))
}

/// Writes the machine finalizer patch of `mcm_core::finalizers::patch`: the whole list, guarded by the
/// resourceVersion, so that a finalizer another writer added meanwhile is not lost. A conflict (409) is retried on
/// the newer version (the other write's watch event reconciles again; [`CONFLICT_RETRY`] should none come).
async fn add_finalizer(name: &str, patch: serde_json::Value, ctx: &Context) -> Result<Action, Error> {
    match ctx
        .machine_api()
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 409 => {
            tracing::debug!(machine = %name, "finalizer write conflicted; retrying on the newer version");
            return Ok(Action::requeue(CONFLICT_RETRY));
        }
        result => result?,
    };
    crash_point!(MachineFinalizer, name);
    Ok(Action::await_change())
}

/// How long a new machine may wait for its class to show up before it is reported missing: the class and the
/// machine arrive on different watches, so a class created just before its machine can be seen after it.
pub(super) const CLASS_ARRIVAL_GRACE: Duration = Duration::from_secs(5);

/// The reason of the Warning Event of a failed class migration.
const MIGRATION_FAILED: &str = "MigrationFailed";

/// Reports an invalid machine or class (`problems` name their fields) and waits for a change.
pub(super) async fn report_invalid(
    machine: &Machine,
    ctx: &Context,
    problems: String,
) -> Result<Action, Error> {
    let description = Description::InvalidSpec { problems };
    report_blocked(machine, ctx, &description, validity::INVALID_SPEC).await?;
    // Nothing is created or destroyed: wait for the machine, its class or its secret to change.
    Ok(Action::requeue(ctx.config.settings.retry.await_change_resync))
}

/// Writes the failed Create lastOperation of [`StatusUpdate::creation_blocked`] and records it as a Warning Event
/// with `reason`, unless the machine already says so (no repeated writes for the same error).
pub(super) async fn report_blocked(
    machine: &Machine,
    ctx: &Context,
    description: &Description,
    reason: &str,
) -> Result<(), Error> {
    let update = StatusUpdate::creation_blocked(description, jiff::Timestamp::now());
    if update.changes(machine.status.as_ref()) {
        ctx.machine_api()
            .patch_status(
                &machine.name_any(),
                &PatchParams::default(),
                &Patch::Merge(update.merge_patch()),
            )
            .await?;
        ctx.recorder
            .record(machine, EventType::Warning, reason, &description.to_string())
            .await;
    }
    Ok(())
}

/// The class migration flow for a machine naming a class of another kind (spec 000), see [`crate::migration`].
pub(super) async fn migrate_class(machine: &Machine, ctx: &Context) -> Result<Action, Error> {
    let name = machine.name_any();
    let machines = ctx.machines.state();
    let migration = crate::migration::Migration {
        client: &ctx.control,
        namespace: &ctx.config.namespace,
        driver: &*ctx.driver,
        machines: &machines,
        retry: &ctx.config.settings.retry,
    };
    let attempts = ctx.memory.attempts(&name);
    let now = jiff::Timestamp::now();
    match migration
        .run(
            machine,
            attempts.counting(true),
            rand::random(),
            attempts.migration_gate(),
            now,
        )
        .await?
    {
        Outcome::Waiting => Ok(Action::requeue(attempts.migration_wait(now))),
        Outcome::Migrated { moved } => {
            ctx.memory.change(&name, Attempts::migrated);
            let old = &machine.spec.class;
            let message = descriptions::migrated_event(&old.kind, &old.name, moved);
            tracing::info!(machine = %name, kind = %old.kind, class = %old.name, moved, "class migrated");
            ctx.recorder
                .record(machine, EventType::Normal, "MigratedClass", &message)
                .await;
            Ok(Action::await_change())
        }
        Outcome::OldClassMissing(_) if waiting_for_references(machine) => {
            Ok(Action::requeue(CLASS_ARRIVAL_GRACE))
        }
        Outcome::OldClassMissing(problem) => report_invalid(machine, ctx, problem).await,
        Outcome::Failed(failure) => {
            ctx.memory.change(&name, |attempts| {
                attempts.migration_failed(failure.gate.clone());
            });
            report_blocked(machine, ctx, &failure.description, MIGRATION_FAILED).await?;
            Ok(Action::requeue(failure.requeue_after))
        }
    }
}
