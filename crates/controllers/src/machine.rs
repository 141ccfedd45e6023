//! The machine controller: observes machines, their classes, secrets and nodes through reflector stores, asks
//! `mcm-core` what to do (creation steps, health, node sync), and acts — provider calls, one patch per object when
//! something changes, Events, requeues. See docs/machine-controller.md.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::{FutureExt, StreamExt};
use k8s_openapi::{
    ByteString,
    api::core::v1::{Node, Secret},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use mcm_api::{Machine, MachineClass, keys, validation};
use mcm_core::{
    ControllerSettings, Redactor, StatusUpdate,
    creation::{self, CallOutcome, CreationInput, CreationStep},
    finalizers::FinalizerChange,
    health::{self, HealthInput},
    nodesync::{self, NodeSyncInput},
    remediation, userdata,
};
use mcm_driver::{
    CreateMachineRequest, DeleteMachineRequest, Driver, DriverError, GetMachineStatusRequest,
    InitializeMachineRequest, MachineCode,
};
use serde_json::json;

use crate::{
    events::{EventType, Recorder},
    metrics::MachineStep as Step,
    migration::Outcome,
};

/// How the machine controller runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The namespace of the machines, classes and secrets (`--namespace`).
    pub namespace: String,
    /// Flag values: timeouts, node conditions, retry and remediation settings.
    pub settings: ControllerSettings,
    /// Reconciles at once (`--concurrent-syncs`).
    pub concurrency: u16,
}

pub use crate::Error;

/// How soon a frozen controller looks at a machine again.
const FROZEN_RETRY: Duration = Duration::from_secs(5);

/// How soon a machine whose finalizer write met a newer version (409) is looked at again, should no event come.
const CONFLICT_RETRY: Duration = Duration::from_secs(1);

/// Shared by every reconcile.
pub struct Context {
    control: Client,
    target: Option<Client>,
    driver: Arc<dyn Driver>,
    config: Config,
    machines: Store<Machine>,
    classes: Store<MachineClass>,
    secrets: Store<Secret>,
    /// The Secrets that cannot be decoded: reported on the machines whose class uses them.
    undecodable: crate::secrets::Undecodable,
    nodes: Option<Store<Node>>,
    failures: std::sync::Mutex<BTreeMap<String, u32>>,
    /// Per machine, after a failed provider call: when the provider may be called again (the back-off of a code
    /// marked Y is over, or the machine, its class or its secret changed after a code marked N). Reconciles come
    /// for many reasons, the controller's own status write among them: without the gate each one called again.
    retry_gates: std::sync::Mutex<BTreeMap<String, mcm_core::retry_policy::RetryGate>>,
    /// The remediation guard's lock (count → decide → write, one machine at a time), holding the machines this
    /// controller marked Failed that the cache does not show yet: name → (the resourceVersion the write replaced,
    /// the machine as written). Without both, two machines of a group timing out together were both Failed.
    remediation: tokio::sync::Mutex<BTreeMap<String, (String, Machine)>>,
    /// For each object we wrote: the resourceVersion our write replaced. While a cache still shows that version,
    /// it has not seen our write yet, and deciding again would repeat it (equality only: resourceVersions are
    /// opaque).
    replaced: std::sync::Mutex<BTreeMap<String, std::collections::BTreeSet<String>>>,
    recorder: Recorder,
    /// Per machine: what the deletion flow remembers between passes.
    deletions: crate::deletion::DeletionMemory,
    /// Per machine: when the class migration may be tried again after a failure.
    migration_gates: std::sync::Mutex<BTreeMap<String, mcm_core::retry_policy::RetryGate>>,
    /// Set while an API server is unreachable: nothing but deletions under way is done.
    freeze: crate::reachability::Freeze,
    /// The orphan collection, poked after each finished deletion.
    orphans: Option<crate::orphans::Trigger>,
    /// The machine step durations and the failed joins are recorded here.
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Node name → the machine whose `node` label names it, as of the machine's last reconcile: a node event finds
    /// its machine at once instead of scanning every machine (a scan per heartbeat made the cost quadratic in N).
    node_index: NodeIndex,
}

/// Node name → machine name (the controller's namespace).
type NodeIndex = Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>;

/// What `mcm run` hands the machine controller besides its configuration.
#[derive(Clone, Debug, Default)]
pub struct Extras {
    /// Prometheus metrics fed from the machine cache.
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The API server reachability freeze (`crate::reachability::run` sets it).
    pub freeze: crate::reachability::Freeze,
    /// The orphan VM collection to poke after deletions (`crate::orphans`).
    pub orphans: Option<crate::orphans::Trigger>,
}

impl Context {
    fn machine_api(&self) -> Api<Machine> {
        Api::namespaced(self.control.clone(), &self.config.namespace)
    }

    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.as_ref()?.get(&ObjectRef::new(name))
    }

    fn failures(&self, machine: &str) -> u32 {
        self.failures
            .lock()
            .map_or(0, |m| m.get(machine).copied().unwrap_or(0))
    }

    fn note_failure(&self, machine: &str) -> u32 {
        self.failures.lock().map_or(1, |mut m| {
            let n = m.entry(machine.to_owned()).or_default();
            *n += 1;
            *n
        })
    }

    /// Notes a write of `key` (e.g. `machine/m1`) that turned version `before` into `after`. A write that changed
    /// nothing (the same version back) leaves no mark.
    fn wrote(&self, key: &str, before: Option<String>, after: Option<&str>) {
        if let (Some(before), Ok(mut m)) = (before, self.replaced.lock())
            && after != Some(before.as_str())
        {
            m.entry(key.to_owned()).or_default().insert(before);
        }
    }

    /// Whether the cache still shows a version one of our writes replaced. Once it shows any other version, it
    /// has caught up with our writes and the marks go.
    fn stale(&self, key: &str, current: Option<&str>) -> bool {
        let Ok(mut m) = self.replaced.lock() else {
            return false;
        };
        let replaced = current
            .as_ref()
            .is_some_and(|rv| m.get(key).is_some_and(|set| set.contains(*rv)));
        if !replaced {
            m.remove(key);
        }
        replaced
    }

    fn clear_failures(&self, machine: &str) {
        if let Ok(mut m) = self.failures.lock() {
            m.remove(machine);
        }
        if let Ok(mut gates) = self.retry_gates.lock() {
            gates.remove(machine);
        }
    }

    /// How long the provider may not be called yet for `machine` after a failed call; `None` when it may.
    fn retry_wait(&self, machine: &str, now: jiff::Timestamp, fingerprint: &str) -> Option<Duration> {
        let gates = self.retry_gates.lock().ok()?;
        let gate = gates.get(machine).filter(|g| !g.is_open(now, fingerprint))?;
        Duration::try_from(gate.not_before.duration_since(now)).ok()
    }

    /// What identifies the inputs of a machine's provider calls: its generation, its class's and secrets'
    /// resourceVersions.
    fn fingerprint(&self, machine: &Machine, class: &MachineClass) -> String {
        let secrets: Vec<Arc<Secret>> = [&class.secret_ref, &class.credentials_secret_ref]
            .into_iter()
            .flatten()
            .filter_map(|r| {
                let namespace = r.namespace.as_deref().unwrap_or(&self.config.namespace);
                self.secrets
                    .get(&ObjectRef::new(r.name.as_deref()?).within(namespace))
            })
            .collect();
        let secrets: Vec<&Secret> = secrets.iter().map(|s| &**s).collect();
        mcm_core::retry_policy::fingerprint(machine, Some(class), &secrets)
    }
}

/// Runs the machine controller until `shutdown` resolves.
pub async fn run(
    control: Client,
    target: Option<Client>,
    driver: Arc<dyn Driver>,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    run_with_metrics(control, target, driver, config, None, shutdown).await;
}

/// Runs the machine controller until `shutdown` resolves, its machine cache feeding `metrics` at scrape time.
pub async fn run_with_metrics(
    control: Client,
    target: Option<Client>,
    driver: Arc<dyn Driver>,
    config: Config,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let extras = Extras {
        metrics,
        ..Extras::default()
    };
    run_with(control, target, driver, config, extras, shutdown).await;
}

/// Runs the machine controller until `shutdown` resolves, with metrics and the reachability freeze.
#[allow(clippy::too_many_lines)] // the wiring of the watches reads best in one place
pub async fn run_with(
    control: Client,
    target: Option<Client>,
    driver: Arc<dyn Driver>,
    config: Config,
    extras: Extras,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let Extras {
        metrics,
        freeze,
        orphans,
    } = extras;
    let namespace = config.namespace.clone();
    let machines_api: Api<Machine> = Api::namespaced(control.clone(), &namespace);
    let controller = Controller::new(machines_api, watcher::Config::default());
    let machines = controller.store();
    if let Some(metrics) = &metrics {
        metrics.attach_machines(machines.clone());
    }

    // Each watch's failures are seen (and /readyz fails while one keeps failing); Secrets are decoded one at a time,
    // so that one bad Secret cannot stop the namespace (crate::secrets).
    let health = |kind| {
        let health = crate::watch_health::WatchHealth::new(kind);
        health.register(metrics.as_deref());
        health
    };
    let (classes, class_writer) = reflector::store::<MachineClass>();
    let class_health = health("MachineClass");
    let class_stream = watcher(
        Api::<MachineClass>::namespaced(control.clone(), &namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .inspect(move |item| class_health.observe(item))
    .reflect(class_writer)
    .applied_objects();
    let (secrets, secret_writer) = reflector::store::<Secret>();
    let undecodable = crate::secrets::Undecodable::default();
    let secret_health = health("Secret");
    let secret_stream = crate::secrets::watch(control.clone(), &namespace, undecodable.clone())
        .default_backoff()
        .inspect(move |item| secret_health.observe(item))
        .reflect(secret_writer)
        .applied_objects();

    let by_class = {
        let machines = machines.clone();
        move |class: MachineClass| {
            let name = class.name_any();
            machines
                .state()
                .into_iter()
                .filter(|m| m.spec.class.name == name)
                .map(|m| ObjectRef::from_obj(&*m))
                .collect::<Vec<_>>()
        }
    };
    let by_secret = {
        let machines = machines.clone();
        let classes = classes.clone();
        move |secret: Secret| {
            let name = secret.name_any();
            let using: Vec<String> = classes
                .state()
                .iter()
                .filter(|c| {
                    [&c.secret_ref, &c.credentials_secret_ref]
                        .into_iter()
                        .any(|r| r.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str()))
                })
                .map(|c| c.name_any())
                .collect();
            machines
                .state()
                .into_iter()
                .filter(|m| using.contains(&m.spec.class.name))
                .map(|m| ObjectRef::from_obj(&*m))
                .collect::<Vec<_>>()
        }
    };
    let mut controller = controller
        .watches_stream(class_stream, by_class)
        .watches_stream(secret_stream, by_secret);

    let node_index = NodeIndex::default();
    let nodes = if let Some(target) = &target {
        let (nodes, node_writer) = reflector::store::<Node>();
        let node_health = health("Node");
        let node_stream = watcher(Api::<Node>::all(target.clone()), watcher::Config::default())
            .default_backoff()
            .inspect(move |item| node_health.observe(item))
            .modify(crate::cache::lean_node)
            .reflect(node_writer)
            .applied_objects();
        let machines = machines.clone();
        let index = node_index.clone();
        let namespace = namespace.clone();
        let by_node = move |node: Node| {
            let name = node.name_any();
            let indexed = index
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&name)
                .cloned();
            // The machine whose `node` label names the node, the machine the node's label names, and the machine
            // named as the node: looked up, never scanned for.
            let mut candidates: Vec<String> = indexed.into_iter().collect();
            candidates.extend(node.labels().get(keys::labels::NODE_MACHINE_NAME).cloned());
            candidates.push(name);
            candidates.sort();
            candidates.dedup();
            candidates
                .into_iter()
                .map(|machine| ObjectRef::<Machine>::new(&machine).within(&namespace))
                .filter(|reference| machines.get(reference).is_some())
                .collect::<Vec<_>>()
        };
        controller = controller.watches_stream(node_stream, by_node);
        Some(nodes)
    } else {
        None
    };

    let context = Arc::new(Context {
        recorder: Recorder::new(control.clone(), "machine-controller"),
        control,
        target,
        driver,
        machines,
        classes,
        secrets,
        undecodable,
        nodes,
        failures: std::sync::Mutex::default(),
        retry_gates: std::sync::Mutex::default(),
        remediation: tokio::sync::Mutex::default(),
        replaced: std::sync::Mutex::default(),
        migration_gates: std::sync::Mutex::default(),
        deletions: crate::deletion::DeletionMemory::default(),
        freeze,
        orphans,
        config: config.clone(),
        metrics: metrics.clone(),
        node_index,
    });
    let meter = crate::metrics::Metrics::reconcile_meter(metrics.as_ref(), "machine", &context.machines);
    let store = context.machines.clone();
    let shutdown = shutdown.boxed().shared();
    let work = controller
        .with_config(kube::runtime::controller::Config::default().concurrency(config.concurrency))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            meter.reconcile(crate::logging::traced(crate::logging::Kind::Machine, reconcile)),
            meter.error_policy(error_policy),
            context,
        )
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "machine reconcile ended with an error");
            }
        });
    crate::cache::until_stopped(work, &store, shutdown).await;
}

#[allow(clippy::needless_pass_by_value)] // the signature is kube-runtime's
fn error_policy(machine: Arc<Machine>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(machine = %machine.name_any(), error = %error, "machine reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// The merged secret of a class: `secretRef` data with `credentialsSecretRef` data on top (credentials win). A
/// missing secret counts as empty, as in the reference; the second value names the missing ones
/// (`mcm_core::validity::missing_secrets`).
fn merged_secret(ctx: &Context, class: &MachineClass) -> (Secret, Vec<String>) {
    let mut data: BTreeMap<String, ByteString> = BTreeMap::new();
    for reference in [&class.secret_ref, &class.credentials_secret_ref]
        .into_iter()
        .flatten()
    {
        let Some(name) = reference.name.as_deref() else {
            continue;
        };
        let namespace = reference
            .namespace
            .clone()
            .unwrap_or_else(|| ctx.config.namespace.clone());
        if let Some(secret) = ctx.secrets.get(&ObjectRef::new(name).within(&namespace)) {
            data.extend(secret.data.clone().unwrap_or_default());
        }
    }
    let missing = mcm_core::validity::missing_secrets(class, &ctx.config.namespace, |namespace, name| {
        ctx.secrets.get(&ObjectRef::new(name).within(namespace)).is_some()
    });
    (
        Secret {
            data: Some(data),
            ..Secret::default()
        },
        missing,
    )
}

/// A new machine whose class or secret has not been seen yet waits a moment instead of being reported: they
/// arrive on other watches than the machine, and their events reconcile it when they do.
fn waiting_for_references(machine: &Machine) -> bool {
    machine.status.is_none()
        && machine
            .metadata
            .creation_timestamp
            .as_ref()
            .is_some_and(|created| {
                jiff::Timestamp::now().duration_since(created.0).unsigned_abs() < CLASS_ARRIVAL_GRACE
            })
}

async fn write_status(ctx: &Context, machine: &Machine, update: &StatusUpdate) -> Result<(), Error> {
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
fn caches_ready(ctx: &Context) -> bool {
    crate::cache::synced(&ctx.classes)
        && crate::cache::synced(&ctx.secrets)
        && ctx.nodes.as_ref().is_none_or(crate::cache::synced)
}

async fn reconcile(machine: Arc<Machine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = machine.name_any();
    // Decide only on synced caches: a class or secret not seen yet is not missing. Look, never wait: kube's
    // `Store::wait_until_ready` wakes only the last of several concurrent waiters (one oneshot receiver, one
    // waker), so reconciles started together before the caches synced (a restarted controller) hung for ever.
    if !caches_ready(&ctx) {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    if let Some(node) = machine.labels().get(keys::labels::NODE).filter(|n| !n.is_empty()) {
        let mut index = ctx
            .node_index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        index.insert(node.clone(), name.clone());
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
    if machine.metadata.deletion_timestamp.is_some() {
        return delete(&machine, &ctx).await;
    }
    if ctx.freeze.is_frozen() {
        // An API server is unreachable: what we would see of nodes is stale, so nothing is decided (reference
        // "LongRetry"); the unfreeze restarts the health clocks and its status writes reconcile again.
        return Ok(Action::requeue(FROZEN_RETRY));
    }
    // The whole list, guarded by the resourceVersion: a finalizer another writer added meanwhile is not lost (409,
    // and the other write's watch event reconciles again).
    if let Some(patch) = mcm_core::finalizers::patch(
        &machine.metadata,
        keys::finalizers::MACHINE_CONTROLLER_MANAGER,
        FinalizerChange::Add,
    ) {
        match ctx
            .machine_api()
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::debug!(machine = %name, "finalizer write conflicted; retrying on the newer version");
                return Ok(Action::requeue(CONFLICT_RETRY));
            }
            result => result?,
        };
        crash_point!(MachineFinalizer, &name);
        return Ok(Action::await_change());
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
        (None, true) => format!(
            "spec.class.name: Not found: MachineClass {:?} does not exist",
            machine.spec.class.name
        ),
        (Some(class), true) => validation::summarize(&validation::validate_machine_class(class)),
    };
    let Some(class) = class.filter(|_| problems.is_empty()) else {
        return report_invalid(&machine, &ctx, &problems).await;
    };
    if let Some(problem) = ctx.undecodable.problem_of(&class, &ctx.config.namespace) {
        return report_invalid(&machine, &ctx, &problem).await;
    }
    let (secret, missing_secrets) = merged_secret(&ctx, &class);
    if !missing_secrets.is_empty() {
        if waiting_for_references(&machine) {
            return Ok(Action::requeue(CLASS_ARRIVAL_GRACE));
        }
        if creation::needs_creation(&machine) {
            // Named as it is (not as a missing userData key); the secret's arrival reconciles the machine.
            report_error(&machine, &ctx, &missing_secrets.join("; "), "SecretNotFound").await?;
            return Ok(Action::requeue(ctx.config.settings.retry.await_change_resync));
        }
    }
    let redactor = Redactor::from_secret_data(secret.data.as_ref().unwrap_or(&BTreeMap::new()));
    let now = jiff::Timestamp::now();
    if creation::needs_creation(&machine) {
        return create(&machine, &class, &secret, &redactor, &ctx, now).await;
    }
    ctx.clear_failures(&name);
    let node_name = machine.labels().get(keys::labels::NODE).cloned();
    let node = node_name.as_deref().and_then(|n| ctx.node(n));
    let mut requeue = None;
    if ctx.target.is_some() {
        requeue = check_health(&machine, &class, &secret, node.as_deref(), &ctx, now).await?;
        if let Some(node) = &node {
            sync_node(&machine, &class, node, &ctx).await?;
        }
    }
    Ok(requeue.map_or_else(
        || Action::requeue(ctx.config.settings.retry.await_change_resync),
        Action::requeue,
    ))
}

/// How long a new machine may wait for its class to show up before it is reported missing: the class and the
/// machine arrive on different watches, so a class created just before its machine can be seen after it.
const CLASS_ARRIVAL_GRACE: Duration = Duration::from_secs(5);

async fn report_invalid(machine: &Machine, ctx: &Context, problems: &str) -> Result<Action, Error> {
    let description = format!("Invalid machine or class: {problems}");
    report_error(machine, ctx, &description, "InvalidSpec").await?;
    // Nothing is created or destroyed: wait for the machine, its class or its secret to change.
    Ok(Action::requeue(ctx.config.settings.retry.await_change_resync))
}

/// Writes a failed Create lastOperation with `description` and records it as a Warning Event with `reason`, unless
/// the machine already says so (no repeated writes for the same error).
async fn report_error(
    machine: &Machine,
    ctx: &Context,
    description: &str,
    reason: &str,
) -> Result<(), Error> {
    let current = machine
        .status
        .as_ref()
        .map(|s| s.last_operation.description.as_str());
    if current != Some(description) {
        let patch = json!({ "status": { "lastOperation": {
            "description": description,
            "state": "Failed",
            "type": "Create",
            "lastUpdateTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        } } });
        ctx.machine_api()
            .patch_status(&machine.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        ctx.recorder
            .record(machine, EventType::Warning, reason, description)
            .await;
    }
    Ok(())
}

/// The class migration flow for a machine naming a class of another kind (spec 000), see [`crate::migration`].
async fn migrate_class(machine: &Machine, ctx: &Context) -> Result<Action, Error> {
    let name = machine.name_any();
    let machines = ctx.machines.state();
    let migration = crate::migration::Migration {
        client: &ctx.control,
        namespace: &ctx.config.namespace,
        driver: &*ctx.driver,
        machines: &machines,
        retry: &ctx.config.settings.retry,
    };
    let gate = ctx
        .migration_gates
        .lock()
        .ok()
        .and_then(|gates| gates.get(&name).cloned());
    let now = jiff::Timestamp::now();
    match migration
        .run(
            machine,
            ctx.failures(&name) + 1,
            rand::random(),
            gate.as_ref(),
            now,
        )
        .await?
    {
        Outcome::Waiting => Ok(Action::requeue(gate.map_or(Duration::ZERO, |g| {
            g.not_before.duration_since(now).unsigned_abs()
        }))),
        Outcome::Migrated { moved } => {
            ctx.clear_failures(&name);
            if let Ok(mut gates) = ctx.migration_gates.lock() {
                gates.remove(&name);
            }
            let old = &machine.spec.class;
            let message = format!(
                "Migrated {} {} to MachineClass {}; {moved} references moved",
                old.kind, old.name, old.name
            );
            tracing::info!(machine = %name, kind = %old.kind, class = %old.name, moved, "class migrated");
            ctx.recorder
                .record(machine, EventType::Normal, "MigratedClass", &message)
                .await;
            Ok(Action::await_change())
        }
        Outcome::OldClassMissing(_) if waiting_for_references(machine) => {
            Ok(Action::requeue(CLASS_ARRIVAL_GRACE))
        }
        Outcome::OldClassMissing(problem) => report_invalid(machine, ctx, &problem).await,
        Outcome::Failed(failure) => {
            ctx.note_failure(&name);
            if let Ok(mut gates) = ctx.migration_gates.lock() {
                gates.insert(name.clone(), failure.gate.clone());
            }
            report_error(machine, ctx, &failure.description.to_string(), "MigrationFailed").await?;
            Ok(Action::requeue(failure.requeue_after))
        }
    }
}

fn request_parts(
    machine: &Machine,
    class: &MachineClass,
    secret: &Secret,
) -> (Machine, MachineClass, Secret) {
    (machine.clone(), class.clone(), secret.clone())
}

/// The secret passed to CreateMachine: userData rendered for the machine (and its bootstrap token, created in the
/// target cluster when the userData asks for one). The rendered userData and the token are added to `redactor`:
/// a provider's message may quote them.
async fn boot_secret(
    machine: &Machine,
    secret: &Secret,
    ctx: &Context,
    redactor: &mut Redactor,
) -> Result<Secret, DriverError> {
    let name = machine.name_any();
    let user_data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(keys::user_data::KEY))
        .map(|b| b.0.clone());
    let Some(user_data) = user_data else {
        return Err(DriverError::invalid_argument(format!(
            "secret of the machine class has no {:?} key",
            keys::user_data::KEY
        )));
    };
    let token = if userdata::wants_bootstrap_token(&user_data) {
        let random: [u8; 32] = rand::random();
        let token = userdata::BootstrapToken::for_machine(&name, &random)
            .map_err(|err| DriverError::internal(format!("bootstrap token: {err}")))?;
        if let Some(target) = &ctx.target {
            let expires = jiff::Timestamp::now()
                + jiff::SignedDuration::try_from(ctx.config.settings.machine_creation_timeout)
                    .unwrap_or_default();
            let object = userdata::bootstrap_token_secret(
                &token,
                &name,
                expires,
                &ctx.config.settings.bootstrap_token_auth_extra_groups,
            );
            let api: Api<Secret> = Api::namespaced(target.clone(), "kube-system");
            match api.create(&PostParams::default(), &object).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    api.replace(&token.secret_name(), &PostParams::default(), &object)
                        .await
                        .ok();
                }
                Err(err) => {
                    return Err(DriverError::new(
                        MachineCode::Unavailable,
                        format!("creating the bootstrap token: {err}"),
                    ));
                }
            }
        }
        redactor.add_bootstrap_token(&token);
        Some(token)
    } else {
        None
    };
    let rendered = userdata::render_user_data(&user_data, &name, token.as_ref());
    redactor.add(&rendered);
    let mut secret = secret.clone();
    secret
        .data
        .get_or_insert_with(BTreeMap::new)
        .insert(keys::user_data::KEY.to_owned(), ByteString(rendered));
    Ok(secret)
}

#[allow(clippy::too_many_lines)] // one loop over the creation steps, each step a short arm
async fn create(
    machine: &Machine,
    class: &MachineClass,
    secret: &Secret,
    redactor: &Redactor,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Result<Action, Error> {
    let name = machine.name_any();
    let mut machine = machine.clone();
    // Learns the rendered userData and the bootstrap token once CreateMachine is called with them.
    let mut redactor = redactor.clone();
    let mut last: Option<CallOutcome> = None;
    for _ in 0..8 {
        let failures = ctx.failures(&name) + u32::from(matches!(&last, Some(o) if outcome_failed(o)));
        let node_ready = node_ready(&machine, ctx);
        let input = CreationInput {
            machine: &machine,
            settings: &ctx.config.settings,
            now,
            has_target_cluster: ctx.target.is_some(),
            failures,
            random: rand::random(),
            redactor: &redactor,
            node_ready,
        };
        let step = creation::decide(&input, last.as_ref());
        let (m, c, s) = request_parts(&machine, class, secret);
        last = match step {
            CreationStep::Skip => return Ok(Action::await_change()),
            CreationStep::CallGetMachineStatus => {
                if let Some(wait) = ctx.retry_wait(&name, now, &ctx.fingerprint(&machine, class)) {
                    // A failed call backs off or waits for a change; the CrashLoopBackOff deadline still fires
                    // (unless the node is healthy: the creation timeout does not fail such a machine).
                    if node_ready {
                        return Ok(Action::requeue(wait));
                    }
                    let deadline = creation::crash_loop_deadline(&machine, &ctx.config.settings);
                    let until_deadline = Duration::try_from(deadline.duration_since(now)).unwrap_or_default();
                    return Ok(Action::requeue(wait.min(until_deadline)));
                }
                Some(CallOutcome::GetMachineStatus(
                    ctx.driver
                        .get_machine_status(&GetMachineStatusRequest {
                            machine: m,
                            machine_class: c,
                            secret: s,
                        })
                        .await,
                ))
            }
            CreationStep::CallCreateMachine => {
                let result = match boot_secret(&machine, secret, ctx, &mut redactor).await {
                    Ok(boot) => {
                        ctx.driver
                            .create_machine(&CreateMachineRequest {
                                machine: m,
                                machine_class: c,
                                secret: boot,
                            })
                            .await
                    }
                    Err(err) => Err(err),
                };
                let node_exists = result.as_ref().is_ok_and(|r| ctx.node(&r.node_name).is_some());
                if let Ok(created) = &result {
                    tracing::info!(machine = %name, node = %created.node_name, provider_id = %created.provider_id, "machine created");
                    ctx.recorder
                        .record(&machine, EventType::Normal, "Created", "Created the machine's VM")
                        .await;
                }
                Some(CallOutcome::CreateMachine { result, node_exists })
            }
            CreationStep::CallInitializeMachine { record, vm } => {
                if let Some(record) = record {
                    machine = apply_record(ctx, &machine, &record).await?;
                    crash_point!(CreateRecord, &name);
                }
                let (m, c, s) = request_parts(&machine, class, secret);
                let started = std::time::Instant::now();
                let result = ctx
                    .driver
                    .initialize_machine(&InitializeMachineRequest {
                        machine: m,
                        machine_class: c,
                        secret: s,
                    })
                    .await;
                if let (Some(metrics), Ok(_)) = (&ctx.metrics, &result) {
                    metrics.machine_step(Step::Initialize, &machine, None, Some(class), started.elapsed());
                }
                Some(CallOutcome::InitializeMachine { vm, result })
            }
            CreationStep::Finish { record, status } => {
                if let Some(record) = record {
                    machine = apply_record(ctx, &machine, &record).await?;
                    crash_point!(CreateFinishRecord, &name);
                }
                if let Some(status) = status {
                    write_status(ctx, &machine, &status).await?;
                    // The creation flow is over (phase Pending, or Available without a target cluster): the
                    // reference's create duration, from the machine's creation.
                    if let (Some(metrics), Some(created)) =
                        (&ctx.metrics, &machine.metadata.creation_timestamp)
                        && status.phase().is_some_and(|p| Some(p) != machine.phase())
                    {
                        let took = crate::metrics::elapsed(created.0, jiff::Timestamp::now());
                        metrics.machine_step(Step::Create, &machine, None, Some(class), took);
                    }
                }
                ctx.clear_failures(&name);
                return Ok(Action::requeue(ctx.config.settings.retry.await_change_resync));
            }
            CreationStep::RecordError {
                status,
                retry,
                requeue_after,
                method,
                code,
            } => {
                ctx.note_failure(&name);
                // The back-off runs from the failure, not from the start of the pass (earlier calls of the pass
                // took time): a retry never comes sooner than the policy says.
                let failed_at = jiff::Timestamp::now().max(now);
                let gate = mcm_core::retry_policy::RetryGate::new(
                    retry,
                    failed_at,
                    ctx.fingerprint(&machine, class),
                );
                if let Ok(mut gates) = ctx.retry_gates.lock() {
                    gates.insert(name.clone(), gate);
                }
                write_status(ctx, &machine, &status).await?;
                let message = status
                    .last_operation
                    .as_ref()
                    .map(|o| o.description.clone())
                    .unwrap_or_default();
                ctx.recorder
                    .record(
                        &machine,
                        EventType::Warning,
                        "ProviderError",
                        &format!("{} failed ({code}): {message}", method.name()),
                    )
                    .await;
                return Ok(requeue_after.map_or_else(Action::await_change, Action::requeue));
            }
            CreationStep::DeleteStaleVm { vm, status } => {
                let mut stale = machine.clone();
                stale.spec.provider_id.clone_from(&vm.provider_id);
                let (_, c, s) = request_parts(&stale, class, secret);
                if let Err(err) = ctx
                    .driver
                    .delete_machine(&DeleteMachineRequest {
                        machine: stale,
                        machine_class: c,
                        secret: s,
                    })
                    .await
                {
                    tracing::warn!(machine = %name, error = %redactor.redact(&err.message), "could not delete a stale VM");
                }
                write_status(ctx, &machine, &status).await?;
                return Ok(Action::await_change());
            }
            CreationStep::Fail { status } => {
                write_status(ctx, &machine, &status).await?;
                let message = status
                    .last_operation
                    .as_ref()
                    .map(|o| o.description.clone())
                    .unwrap_or_default();
                ctx.recorder
                    .record(&machine, EventType::Warning, "Failed", &message)
                    .await;
                return Ok(Action::await_change());
            }
        };
        crash_point!(call last.as_ref(), &name);
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// Whether the machine's node (by its `node` label) exists in the target cluster and is healthy.
fn node_ready(machine: &Machine, ctx: &Context) -> bool {
    machine
        .labels()
        .get(keys::labels::NODE)
        .filter(|n| !n.is_empty())
        .and_then(|n| ctx.node(n))
        .and_then(|node| {
            node.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .map(|conditions| {
                    mcm_core::health::is_healthy(conditions, &ctx.config.settings.node_conditions)
                })
        })
        .unwrap_or(false)
}

/// Records the VM on the machine (providerID, `node` label, priority annotation) and notes the write, so that a
/// cache that has not seen it yet is not decided on again. Returns the machine as written.
async fn apply_record(
    ctx: &Context,
    machine: &Machine,
    record: &creation::VmRecord,
) -> Result<Machine, Error> {
    let written = ctx
        .machine_api()
        .patch(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(record.merge_patch()),
        )
        .await?;
    let key = format!("machine/{}", machine.name_any());
    ctx.wrote(
        &key,
        machine.resource_version(),
        written.resource_version().as_deref(),
    );
    Ok(written)
}

fn outcome_failed(outcome: &CallOutcome) -> bool {
    match outcome {
        CallOutcome::GetMachineStatus(r) => r.is_err(),
        CallOutcome::CreateMachine { result, .. } => result.is_err(),
        CallOutcome::InitializeMachine { result, .. } => result.is_err(),
    }
}

/// Whether the provider says the machine's recorded VM does not exist (GetMachineStatus NotFound). Any other answer,
/// errors included, is not taken as a vanished VM.
async fn vm_vanished(machine: &Machine, class: &MachineClass, secret: &Secret, ctx: &Context) -> bool {
    let (machine, machine_class, secret) = request_parts(machine, class, secret);
    let result = ctx
        .driver
        .get_machine_status(&GetMachineStatusRequest {
            machine,
            machine_class,
            secret,
        })
        .await;
    matches!(result, Err(err) if err.code == MachineCode::NotFound)
}

async fn check_health(
    machine: &Machine,
    class: &MachineClass,
    secret: &Secret,
    node: Option<&Node>,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Result<Option<Duration>, Error> {
    let plan = health::decide(&HealthInput {
        machine,
        node,
        settings: &ctx.config.settings,
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
            let kind = if phase == mcm_api::MachinePhase::Failed {
                EventType::Warning
            } else {
                EventType::Normal
            };
            let message = status
                .last_operation
                .as_ref()
                .map(|o| o.description.clone())
                .unwrap_or_default();
            ctx.recorder.record(machine, kind, phase.as_str(), &message).await;
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

async fn sync_node(machine: &Machine, class: &MachineClass, node: &Node, ctx: &Context) -> Result<(), Error> {
    let Some(target) = &ctx.target else { return Ok(()) };
    let api: Api<Node> = Api::all(target.clone());
    let key = format!("node/{}", node.name_any());
    if ctx.stale(&key, node.resource_version().as_deref()) {
        return Ok(());
    }
    let plan = nodesync::plan(&NodeSyncInput::new(machine, Some(class), node));
    let mut node_patch = plan.node_patch.clone();
    // The finalizer rides in the same write, guarded by the node's resourceVersion (see the machine's).
    if let Some(finalizer) =
        mcm_core::finalizers::patch(&node.metadata, keys::finalizers::NODE, FinalizerChange::Add)
    {
        let patch = node_patch.get_or_insert_with(|| json!({}));
        for field in ["finalizers", "resourceVersion"] {
            patch["metadata"][field] = finalizer["metadata"][field].clone();
        }
    }
    if let Some(patch) = node_patch {
        let written = match api
            .patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            // Another writer changed the node first: its watch event brings the machine back here.
            Err(kube::Error::Api(status)) if status.code == 409 => return Ok(()),
            result => result?,
        };
        ctx.wrote(
            &key,
            node.resource_version(),
            written.resource_version().as_deref(),
        );
        crash_point!(MachineNodeSync, &machine.name_any());
    }
    if let Some(patch) = plan.status_patch {
        api.patch_status(&node.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    if let Some(patch) = plan.capacity_annotation_patch {
        api.patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    Ok(())
}

/// The deletion flow (phase Terminating, hooks, drain, VolumeAttachments, VM, node, finalizer), see
/// [`crate::deletion`].
async fn delete(machine: &Machine, ctx: &Context) -> Result<Action, Error> {
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
                .find(|node| node.labels().get(keys::labels::NODE_MACHINE_NAME) == Some(&name))
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
        ctx.clear_failures(&name);
        // A deletion can leave a VM behind (a provider that lost track of it): look for orphans soon.
        if let Some(trigger) = &ctx.orphans {
            trigger.poke();
        }
    }
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}
