//! Orphan VM collection and unmanaged nodes (reference §3.9, the machine controller's safety loop), deciding with
//! [`mcm_core::safety_orphans`].
//!
//! Every [`Config::period`] (`--machine-safety-orphan-vms-period`, 15m), and soon after a [`Trigger::poke`] (the
//! machine controller pokes after a machine deletion and when GetMachineStatus answers `OutOfRange`), one pass:
//!
//! 1. lists the MachineClasses of the namespace and calls ListMachines for each, with the class's secret
//!    (`secretRef` data with `credentialsSecretRef` data on top, as the machine controller sends it); a class whose
//!    secret is missing, or whose call fails, is skipped for this pass;
//! 2. reads the Machines from the process's shared cache (after the ListMachines calls, see
//!    [`mcm_core::safety_orphans`]: the machine controller creates a VM only for a Machine it has seen in that same
//!    cache, and the last look before each deletion reads the API server), so a pass lists no Machine and copies none;
//! 3. decides the orphans: VMs seen for at least [`Config::grace`] with no Machine of their name, or extra VMs of
//!    a Machine that records another provider ID and is not being created;
//! 4. for each orphan: a Warning Event `OrphanVMFound` on the class (once per VM) and the metric
//!    `mcm_machine_orphan_vms_found_total`; then, unless [`Config::dry_run`] (`--orphan-collection-dry-run`), a
//!    last look at the Machine of the name and DeleteMachine with a stand-in Machine carrying the orphan's machine
//!    name and provider ID, a Normal Event `OrphanVMDeleted` and `mcm_machine_orphan_vms_deleted_total` (a failed
//!    deletion is a Warning Event `OrphanVMDeletionFailed` and is tried again next pass);
//! 5. with a target cluster: marks the nodes (read from the shared node cache) no Machine claims, older than [`Config::creation_timeout`], with
//!    `node.machine.sapcloud.io/not-managed-by-mcm=1` (dropping the node finalizer), and unmarks them once a Machine
//!    claims them.
//!
//! [`PokeOnOutOfRange`] wraps a driver so that every GetMachineStatus answering `OutOfRange` pokes the trigger.
//!
//! When an orphan candidate is still within its grace period, the next pass comes when the grace ends rather than a
//! whole period later. Event messages name provider IDs, machines and classes; provider error messages are redacted
//! with the class's secret values first.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use async_trait::async_trait;
use futures::FutureExt;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use mcm_api::{Machine, MachineClass};
use mcm_core::{
    Redactor,
    safety_orphans::{self, FirstSeen, NodeChange, NodeInput, OrphanVm, Verdict, VmInput},
};
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, GenerateMachineClassForMigrationRequest, GenerateMachineClassForMigrationResponse,
    GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest, GetVolumeIdsResponse,
    InitializeMachineRequest, InitializeMachineResponse, ListMachinesRequest, ListMachinesResponse,
    MachineCode,
};
use tokio::sync::Notify;

use crate::{
    events::{EventType, Recorder},
    metrics::Metrics,
};

/// Reason of the Event on a class when one of its VMs is found orphaned.
pub const REASON_FOUND: &str = "OrphanVMFound";
/// Reason of the Event on a class when an orphan VM was deleted.
pub const REASON_DELETED: &str = "OrphanVMDeleted";
/// Reason of the Event on a class when deleting an orphan VM failed.
pub const REASON_DELETION_FAILED: &str = "OrphanVMDeletionFailed";

/// How long after a poke the pass starts (10s): the pokes of a burst (a scale-down deleting many machines) share
/// one pass, and every pass calls ListMachines once per class, against the provider's rate limits.
pub const DEFAULT_POKE_DELAY: Duration = Duration::from_secs(10);

/// How soon a pass is tried again while the shared caches have not synced.
const CACHE_WAIT: Duration = Duration::from_secs(1);

/// How the collection runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The namespace of the machines, classes and secrets (`--namespace`).
    pub namespace: String,
    /// `--machine-safety-orphan-vms-period` (15m): the time between two passes.
    pub period: Duration,
    /// How long a VM must have been seen before it may be deleted (5m, [`safety_orphans::DEFAULT_GRACE`]).
    pub grace: Duration,
    /// `--machine-creation-timeout` (20m): a node without machine younger than this is not marked unmanaged.
    pub creation_timeout: Duration,
    /// `--orphan-collection-dry-run`: report orphans (Events, metric, log), delete nothing, only log node changes.
    pub dry_run: bool,
    /// How long after a poke the pass starts ([`DEFAULT_POKE_DELAY`]).
    pub poke_delay: Duration,
}

impl Config {
    /// The defaults for `namespace`: the reference's period and creation timeout, this project's grace.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            period: safety_orphans::DEFAULT_PERIOD,
            grace: safety_orphans::DEFAULT_GRACE,
            creation_timeout: Duration::from_mins(20),
            dry_run: false,
            poke_delay: DEFAULT_POKE_DELAY,
        }
    }
}

/// Asks the collection for a pass soon: cheap to clone, cheap to poke, any number of times (pokes before a pass
/// starts are served by that pass).
#[derive(Clone, Debug, Default)]
pub struct Trigger(Arc<Notify>);

impl Trigger {
    /// A trigger no collection listens to yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a pass after [`Config::poke_delay`] (or lets the one about to start serve this poke too).
    pub fn poke(&self) {
        self.0.notify_one();
    }
}

/// A [`Driver`] that pokes a [`Trigger`] whenever GetMachineStatus answers `OutOfRange` ("Multiple VMs found",
/// spec 000: "Orphan VM handler to cleanup orphan VMs"), whoever called it (creation, health check, deletion); every
/// call is passed on unchanged. An alternative to poking at each call site of the machine controller.
pub struct PokeOnOutOfRange {
    inner: Arc<dyn Driver>,
    trigger: Trigger,
}

impl PokeOnOutOfRange {
    /// Wraps `inner`, poking `trigger`.
    pub fn new(inner: Arc<dyn Driver>, trigger: Trigger) -> Self {
        Self { inner, trigger }
    }
}

impl std::fmt::Debug for PokeOnOutOfRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PokeOnOutOfRange").finish_non_exhaustive()
    }
}

#[async_trait]
impl Driver for PokeOnOutOfRange {
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        self.inner.create_machine(request).await
    }

    async fn initialize_machine(
        &self,
        request: &InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        self.inner.initialize_machine(request).await
    }

    async fn delete_machine(
        &self,
        request: &DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        self.inner.delete_machine(request).await
    }

    async fn get_machine_status(
        &self,
        request: &GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        let result = self.inner.get_machine_status(request).await;
        if matches!(&result, Err(err) if err.code == MachineCode::OutOfRange) {
            self.trigger.poke();
        }
        result
    }

    async fn list_machines(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        self.inner.list_machines(request).await
    }

    async fn get_volume_ids(
        &self,
        request: &GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        self.inner.get_volume_ids(request).await
    }

    async fn generate_machine_class_for_migration(
        &self,
        request: &GenerateMachineClassForMigrationRequest,
    ) -> Result<GenerateMachineClassForMigrationResponse, DriverError> {
        self.inner.generate_machine_class_for_migration(request).await
    }
}

/// What the collection remembers between passes.
#[derive(Debug, Default)]
struct Memory {
    /// Per listed provider ID, when a pass first listed it (the age of a VM, see [`safety_orphans`]).
    first_seen: FirstSeen,
    /// The orphans already reported (Event and metric), so that each is reported once.
    reported: BTreeSet<String>,
    /// The orphans already deleted, so that a VM the provider still lists for a while is not counted twice.
    deleted: BTreeSet<String>,
}

/// The orphan VM collection: build it with [`Collector::new`], start it with [`Collector::run`].
pub struct Collector {
    control: Client,
    target: Option<Client>,
    caches: crate::shared_cache::Caches,
    driver: Arc<dyn Driver>,
    config: Config,
    trigger: Trigger,
    metrics: Option<Arc<Metrics>>,
    recorder: Recorder,
    memory: Memory,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A class, its merged secret and the redactor of the secret's values.
struct ClassContext {
    class: MachineClass,
    secret: Secret,
    redactor: Redactor,
}

/// Runs the collection until `shutdown` resolves (without metrics; see [`Collector::with_metrics`]).
pub async fn run(
    control: Client,
    target: Option<Client>,
    caches: crate::shared_cache::Caches,
    driver: Arc<dyn Driver>,
    config: Config,
    trigger: Trigger,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    Collector::new(control, target, caches, driver, config, trigger)
        .run(shutdown)
        .await;
}

impl Collector {
    /// A collection of the classes of `config.namespace` through `driver`, reading the Machines and Nodes from
    /// `caches`, marking nodes in `target` (none without a target cluster), passing when `trigger` is poked.
    pub fn new(
        control: Client,
        target: Option<Client>,
        caches: crate::shared_cache::Caches,
        driver: Arc<dyn Driver>,
        config: Config,
        trigger: Trigger,
    ) -> Self {
        Self {
            recorder: Recorder::new(control.clone(), "machine-controller"),
            control,
            target,
            caches,
            driver,
            config,
            trigger,
            metrics: None,
            memory: Memory::default(),
        }
    }

    /// Counts orphans found and deleted in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Runs passes until `shutdown` resolves: the first at once, then every period, soon after a poke, and when the
    /// grace of a waiting candidate ends. A pass in flight is abandoned at shutdown (every provider call it makes
    /// is idempotent).
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()> + Send) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut next = tokio::time::Instant::now();
        // A pass is the work of the reference's `machinesafetyorphanvms` queue.
        let meter = Metrics::reconcile_meter(self.metrics.as_ref(), "machinesafetyorphanvms");
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep_until(next) => {}
                () = self.trigger.0.notified() => {
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(self.config.poke_delay) => {}
                    }
                    // Pokes during the delay are served by this pass.
                    let _ = self.trigger.0.notified().now_or_never();
                }
            }
            let guard = meter.pass();
            let recheck = tokio::select! {
                () = &mut shutdown => return,
                recheck = self.pass() => recheck,
            };
            guard.finish(Some(&kube::runtime::controller::Action::await_change()));
            let mut wait = self.config.period;
            if let Some(at) = recheck {
                let until = Duration::try_from(at.duration_since(jiff::Timestamp::now())).unwrap_or_default();
                wait = wait.min(until);
            }
            next = tokio::time::Instant::now() + wait;
        }
    }

    fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.control.clone(), &self.config.namespace)
    }

    /// One pass (see the module documentation); returns when the earliest waiting candidate matures (or, while the
    /// caches have not synced, when to look again).
    async fn pass(&mut self) -> Option<jiff::Timestamp> {
        let caches_synced = self.caches.machines.synced()
            && (self.target.is_none()
                || self
                    .caches
                    .nodes
                    .as_ref()
                    .is_some_and(crate::shared_cache::SharedCache::synced));
        if !caches_synced {
            // No machine seen yet is not no machine: every VM would look orphaned.
            return Some(mcm_core::timeouts::add(jiff::Timestamp::now(), CACHE_WAIT));
        }
        let classes: Api<MachineClass> = Api::namespaced(self.control.clone(), &self.config.namespace);
        let classes = match classes.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(err) => {
                tracing::warn!(error = %err, "orphan collection: cannot list the machine classes");
                return None;
            }
        };
        let mut contexts: BTreeMap<String, ClassContext> = BTreeMap::new();
        let mut listed: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for class in classes {
            let name = class.name_any();
            let Some(secret) = self.secret_of(&class).await else {
                tracing::debug!(class = %name, "orphan collection: a secret of the class is missing; skipped");
                continue;
            };
            let redactor = Redactor::from_secret_data(secret.data.as_ref().unwrap_or(&BTreeMap::new()));
            let request = ListMachinesRequest {
                machine_class: class.clone(),
                secret: secret.clone(),
            };
            match self.driver.list_machines(&request).await {
                Ok(answer) => {
                    listed.insert(name.clone(), answer.machine_list);
                    contexts.insert(
                        name,
                        ClassContext {
                            class,
                            secret,
                            redactor,
                        },
                    );
                }
                Err(err) if err.code == MachineCode::Unimplemented => {
                    tracing::debug!(class = %name, "orphan collection: the provider does not list machines");
                }
                Err(err) => tracing::warn!(
                    class = %name,
                    code = %err.code.name(),
                    error = %redactor.redact(&err.message),
                    "orphan collection: ListMachines failed; the class is skipped this pass"
                ),
            }
        }
        // After the ListMachines calls: every VM of a machine listed above has its Machine in this cache.
        let machines = self.caches.machines.store().state();
        let now = jiff::Timestamp::now();
        let plan = safety_orphans::decide_vms(
            &VmInput {
                listed: &listed,
                machines: &machines,
                now,
                grace: self.config.grace,
            },
            std::mem::take(&mut self.memory.first_seen),
        );
        self.memory.first_seen = plan.first_seen;
        for waiting in &plan.waiting {
            tracing::debug!(
                provider_id = %waiting.vm.provider_id,
                machine = %waiting.vm.machine_name,
                collectable_at = %waiting.collectable_at,
                "orphan collection: a candidate is within its grace period"
            );
        }
        self.collect(&plan.orphans, &contexts).await;
        if let Some(target) = self.target.clone() {
            self.mark_nodes(&target, &machines, now).await;
        }
        plan.recheck_at
    }

    /// Reports and (unless dry run) deletes the orphans.
    async fn collect(&mut self, orphans: &[OrphanVm], contexts: &BTreeMap<String, ClassContext>) {
        let (fresh, keep) = safety_orphans::to_report(orphans, &self.memory.reported);
        let fresh: BTreeSet<String> = fresh.into_iter().map(|vm| vm.provider_id.clone()).collect();
        self.memory.reported = keep;
        self.memory.deleted.retain(|id| self.memory.reported.contains(id));
        for vm in orphans {
            let Some(context) = contexts.get(&vm.class) else {
                continue;
            };
            if fresh.contains(&vm.provider_id) {
                let description = vm.describe();
                let message = if self.config.dry_run {
                    format!("{description}; dry run: not deleted")
                } else {
                    format!("{description}; deleting it")
                };
                tracing::warn!(provider_id = %vm.provider_id, machine = %vm.machine_name, class = %vm.class,
                    dry_run = self.config.dry_run, "orphan VM found: {description}");
                self.recorder
                    .record(&context.class, EventType::Warning, REASON_FOUND, &message)
                    .await;
                if let Some(metrics) = &self.metrics {
                    metrics.orphan_vm_found();
                }
            }
            if self.config.dry_run {
                continue;
            }
            self.delete(vm, context).await;
        }
    }

    /// Deletes one orphan, after a last look at the Machine of its name.
    async fn delete(&mut self, vm: &OrphanVm, context: &ClassContext) {
        let current = match self.machines().get_opt(&vm.machine_name).await {
            Ok(current) => current,
            Err(err) => {
                tracing::warn!(machine = %vm.machine_name, error = %err,
                    "orphan collection: cannot look at the machine; the VM is kept this pass");
                return;
            }
        };
        if !matches!(
            safety_orphans::classify(&vm.provider_id, &vm.machine_name, current.as_ref()),
            Verdict::Orphan(_)
        ) {
            tracing::info!(provider_id = %vm.provider_id, machine = %vm.machine_name,
                "orphan collection: the VM has a machine now; kept");
            return;
        }
        let request = DeleteMachineRequest {
            machine: safety_orphans::stand_in(vm, &self.config.namespace),
            machine_class: context.class.clone(),
            secret: context.secret.clone(),
        };
        match self.driver.delete_machine(&request).await {
            Ok(_) => {
                tracing::info!(provider_id = %vm.provider_id, machine = %vm.machine_name, class = %vm.class,
                    "orphan VM deleted");
                if self.memory.deleted.insert(vm.provider_id.clone()) {
                    let message = format!(
                        "Deleted orphan VM {} of machine {:?}",
                        vm.provider_id, vm.machine_name
                    );
                    self.recorder
                        .record(&context.class, EventType::Normal, REASON_DELETED, &message)
                        .await;
                    if let Some(metrics) = &self.metrics {
                        metrics.orphan_vm_deleted();
                    }
                }
            }
            Err(err) => {
                let error = context.redactor.redact(&err.message);
                tracing::warn!(provider_id = %vm.provider_id, machine = %vm.machine_name, class = %vm.class,
                    code = %err.code.name(), error = %error, "orphan collection: DeleteMachine failed");
                let message = format!(
                    "Deleting orphan VM {} of machine {:?} failed ({}): {error}",
                    vm.provider_id,
                    vm.machine_name,
                    err.code.name()
                );
                self.recorder
                    .record(
                        &context.class,
                        EventType::Warning,
                        REASON_DELETION_FAILED,
                        &message,
                    )
                    .await;
            }
        }
    }

    /// Marks the nodes no machine claims and unmarks the claimed ones (target cluster; a dry run only logs).
    async fn mark_nodes(&self, target: &Client, machines: &[Arc<Machine>], now: jiff::Timestamp) {
        let api: Api<Node> = Api::all(target.clone());
        let nodes = self
            .caches
            .nodes
            .as_ref()
            .map(|nodes| nodes.store().state())
            .unwrap_or_default();
        let changes = safety_orphans::decide_nodes(&NodeInput {
            nodes: &nodes,
            machines,
            now,
            creation_timeout: self.config.creation_timeout,
        });
        for change in changes {
            if self.config.dry_run {
                tracing::info!(node = %change.node(), patch = %change.patch(), "dry run: the node would be patched");
                continue;
            }
            let what = match &change {
                NodeChange::MarkUnmanaged { .. } => "marked as not managed by the machine controller",
                NodeChange::Unmark { .. } => "claimed by a machine again: not-managed mark removed",
            };
            match api
                .patch(
                    change.node(),
                    &PatchParams::default(),
                    &Patch::Merge(change.patch()),
                )
                .await
            {
                Ok(_) => tracing::info!(node = %change.node(), "node {what}"),
                Err(err) => {
                    tracing::debug!(node = %change.node(), error = %err, "orphan collection: node patch failed; next pass");
                }
            }
        }
    }

    /// The class's secret as the machine controller sends it ([`crate::secrets::merged`]). `None` when a referenced
    /// secret is missing (or cannot be read): the class is skipped rather than asked with partial credentials.
    async fn secret_of(&self, class: &MachineClass) -> Option<Secret> {
        let mut secrets = Vec::new();
        for (_, namespace, name) in mcm_core::validity::secret_references(class, &self.config.namespace) {
            let api: Api<Secret> = Api::namespaced(self.control.clone(), namespace);
            match api.get_opt(name).await {
                Ok(secret) => secrets.push(secret?),
                Err(err) => {
                    tracing::warn!(secret = name, namespace, class = %class.name_any(),
                        error = %crate::watch_health::describe_client_error(&err),
                        "orphan collection: cannot read the class's secret; the class is skipped");
                    return None;
                }
            }
        }
        Some(crate::secrets::merged(secrets))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Answers(MachineCode);

    #[async_trait]
    impl Driver for Answers {
        async fn create_machine(
            &self,
            _: &CreateMachineRequest,
        ) -> Result<CreateMachineResponse, DriverError> {
            Ok(CreateMachineResponse::default())
        }

        async fn delete_machine(
            &self,
            _: &DeleteMachineRequest,
        ) -> Result<DeleteMachineResponse, DriverError> {
            Ok(DeleteMachineResponse::default())
        }

        async fn get_machine_status(
            &self,
            _: &GetMachineStatusRequest,
        ) -> Result<GetMachineStatusResponse, DriverError> {
            Err(DriverError::new(self.0, "answer"))
        }
    }

    fn poked(trigger: &Trigger) -> bool {
        trigger.0.notified().now_or_never().is_some()
    }

    #[tokio::test]
    async fn out_of_range_pokes_and_other_answers_do_not() {
        let request = GetMachineStatusRequest {
            machine: Machine::default(),
            machine_class: MachineClass::default(),
            secret: Secret::default(),
        };
        for (code, pokes) in [
            (MachineCode::OutOfRange, true),
            (MachineCode::NotFound, false),
            (MachineCode::Unavailable, false),
        ] {
            let trigger = Trigger::new();
            let driver = PokeOnOutOfRange::new(Arc::new(Answers(code)), trigger.clone());
            let answer = driver.get_machine_status(&request).await;
            assert_eq!(answer.unwrap_err().code, code, "passed on unchanged");
            assert_eq!(poked(&trigger), pokes, "{code:?}");
        }
    }

    #[test]
    fn pokes_before_a_pass_are_served_by_it() {
        let trigger = Trigger::new();
        let clone = trigger.clone();
        trigger.poke();
        clone.poke();
        assert!(poked(&trigger));
        assert!(!poked(&trigger), "one pass for both pokes");
    }
}
