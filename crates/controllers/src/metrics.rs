//! Prometheus metrics under the reference's names (namespace `mcm`, reference §8.3) and the HTTP endpoints
//! `/metrics`, `/healthz` and `/readyz` (§8.4) served on `--port`.
//!
//! Machine, MachineSet and MachineDeployment state is read from the controllers' caches at scrape time, so keeping
//! it costs nothing between scrapes; the machine step durations are set by the machine controller as each step
//! completes; provider calls are counted and timed by [`MeteredDriver`], which wraps any [`Driver`]; reconciles are
//! counted, timed and followed by a [`ReconcileMeter`] per controller. Every metric is listed in
//! docs/machine-controller.md.

use std::{
    collections::HashMap,
    future::Future,
    net::SocketAddr,
    sync::{Arc, Mutex, OnceLock, PoisonError, atomic::AtomicU64},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use futures::future::BoxFuture;
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::util::intstr::IntOrString};
use kube::{
    Resource, ResourceExt,
    runtime::{
        controller::Action,
        reflector::{ObjectRef, Store},
    },
};
use mcm_api::{
    Machine, MachineClass, MachineDeployment, MachinePhase, MachineSet, MachineSummary, StrategyType, keys,
};
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, DriverMethod, GenerateMachineClassForMigrationRequest,
    GenerateMachineClassForMigrationResponse, GetMachineStatusRequest, GetMachineStatusResponse,
    GetVolumeIdsRequest, GetVolumeIdsResponse, InitializeMachineRequest, InitializeMachineResponse,
    ListMachinesRequest, ListMachinesResponse,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// `{name, namespace}` of one object.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ObjectLabels {
    name: String,
    namespace: String,
}

impl ObjectLabels {
    fn of(object: &impl Resource) -> Self {
        Self {
            name: object.meta().name.clone().unwrap_or_default(),
            namespace: object.meta().namespace.clone().unwrap_or_default(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    provider: String,
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailedLabels {
    provider: String,
    operation: String,
    error_code: String,
}

/// The labels of `mcm_machine_info` (the reference's, `createdAt` included).
#[allow(non_snake_case)] // label names are the reference's
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MachineInfoLabels {
    name: String,
    namespace: String,
    createdAt: String,
    spec_provider_id: String,
    spec_class_api_group: String,
    spec_class_kind: String,
    spec_class_name: String,
    node_name: String,
}

/// `{name, namespace, condition}` of the status condition gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    name: String,
    namespace: String,
    condition: String,
}

/// The labels of `mcm_machine_set_info`.
#[allow(non_snake_case)] // label names are the reference's
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SetInfoLabels {
    name: String,
    namespace: String,
    createdAt: String,
    spec_machine_class_api_group: String,
    spec_machine_class_kind: String,
    spec_machine_class_name: String,
}

/// The labels of `mcm_machine_deployment_info`.
#[allow(non_snake_case)] // label names are the reference's
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeploymentInfoLabels {
    name: String,
    namespace: String,
    createdAt: String,
    spec_strategy_type: String,
}

/// One failed machine of a set's or deployment's `status.failedMachines` (the reference's labels; value 1).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailedMachineLabels {
    name: String,
    namespace: String,
    failed_machine_name: String,
    failed_machine_provider_id: String,
    failed_machine_last_operation_state: String,
    failed_machine_last_operation_machine_operation_type: String,
    failed_machine_owner_ref: String,
}

/// `{namespace, machine_deployment, instance_type, zone}` of the machine step gauges and the failed-join counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    namespace: String,
    machine_deployment: String,
    instance_type: String,
    zone: String,
}

/// `{namespace, machine_deployment}` of `mcm_machine_drain_duration_seconds` (the reference's drain gauge has no
/// placement labels).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DrainLabels {
    namespace: String,
    machine_deployment: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The per-object gauges read from the machine cache at scrape time.
#[derive(Default)]
struct MachineFamilies {
    items: Gauge,
    phase: Family<ObjectLabels, Gauge>,
    info: Family<MachineInfoLabels, Gauge>,
    condition: Family<ConditionLabels, Gauge>,
}

/// The MachineSet gauges read from the set controller's cache at scrape time.
#[derive(Default)]
struct SetFamilies {
    items: Gauge,
    info: Family<SetInfoLabels, Gauge>,
    spec_replicas: Family<ObjectLabels, Gauge>,
    spec_min_ready_seconds: Family<ObjectLabels, Gauge>,
    condition: Family<ConditionLabels, Gauge>,
    failed_machines: Family<FailedMachineLabels, Gauge>,
    available: Family<ObjectLabels, Gauge>,
    fully_labelled: Family<ObjectLabels, Gauge>,
    ready: Family<ObjectLabels, Gauge>,
    replicas: Family<ObjectLabels, Gauge>,
}

/// The MachineDeployment gauges read from the deployment controller's cache at scrape time.
#[derive(Default)]
struct DeploymentFamilies {
    items: Gauge,
    info: Family<DeploymentInfoLabels, Gauge>,
    spec_paused: Family<ObjectLabels, Gauge>,
    spec_replicas: Family<ObjectLabels, Gauge>,
    spec_min_ready_seconds: Family<ObjectLabels, Gauge>,
    spec_max_surge: Family<ObjectLabels, Gauge>,
    spec_max_unavailable: Family<ObjectLabels, Gauge>,
    spec_revision_history_limit: Family<ObjectLabels, Gauge>,
    spec_progress_deadline_seconds: Family<ObjectLabels, Gauge>,
    spec_rollback_to_revision: Family<ObjectLabels, Gauge>,
    condition: Family<ConditionLabels, Gauge>,
    available: Family<ObjectLabels, Gauge>,
    unavailable: Family<ObjectLabels, Gauge>,
    ready: Family<ObjectLabels, Gauge>,
    updated: Family<ObjectLabels, Gauge>,
    replicas: Family<ObjectLabels, Gauge>,
    collision_count: Family<ObjectLabels, Gauge>,
    failed_machines: Family<FailedMachineLabels, Gauge>,
}

/// The machine step gauges, set by the machine controller as each step completes.
#[derive(Default)]
struct StepFamilies {
    create: Family<StepLabels, FloatGauge>,
    initialize: Family<StepLabels, FloatGauge>,
    join: Family<StepLabels, FloatGauge>,
    delete: Family<StepLabels, FloatGauge>,
    drain: Family<DrainLabels, FloatGauge>,
    failed_join: Family<StepLabels, Gauge>,
}

/// The per-controller reconcile metrics ([`ReconcileMeter`]).
#[derive(Clone)]
struct ReconcileFamilies {
    total: Family<ReconcileLabels, Counter>,
    errors: Family<ControllerLabels, Counter>,
    duration: Family<ControllerLabels, Histogram>,
    depth: Family<QueueLabels, Gauge>,
    longest_running: Family<QueueLabels, FloatGauge>,
    unfinished: Family<QueueLabels, FloatGauge>,
}

impl Default for ReconcileFamilies {
    fn default() -> Self {
        Self {
            total: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.001, 2.0, 16,
                ))
            }),
            depth: Family::default(),
            longest_running: Family::default(),
            unfinished: Family::default(),
        }
    }
}

/// The metrics of one `mcm run` process.
pub struct Metrics {
    registry: Registry,
    machines: OnceLock<Store<Machine>>,
    machine_sets: OnceLock<Store<MachineSet>>,
    machine_deployments: OnceLock<Store<MachineDeployment>>,
    machine: MachineFamilies,
    sets: SetFamilies,
    deployments: DeploymentFamilies,
    steps: StepFamilies,
    reconciles: ReconcileFamilies,
    meters: Mutex<Vec<Arc<MeterShared>>>,
    frozen: Gauge,
    driver_duration: Family<OperationLabels, Histogram>,
    driver_failed: Family<FailedLabels, Counter>,
    orphan_vms_found: Counter,
    orphan_vms_deleted: Counter,
    readiness: Mutex<Vec<(String, ReadinessCheck)>>,
    /// Families of others (an in-process provider's own) encoded into every scrape after ours.
    extra: Mutex<Vec<ExtraFamilies>>,
    /// One scrape at a time: the scrape-time families are cleared and refilled.
    scrape: Mutex<()>,
}

/// Writes further metric families into a scrape, in the text format and without the closing `# EOF` (as
/// [`prometheus_client::encoding::text::encode_registry`] does).
pub type ExtraFamilies = Box<dyn Fn(&mut String) -> std::fmt::Result + Send + Sync>;

/// A readiness check: `Err(reason)` while not ready.
type ReadinessCheck = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

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

/// A step of a machine whose duration is gauged (reference `MachineDurations`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MachineStep {
    /// Creation: from the machine's creationTimestamp until the creation flow wrote phase Pending (or Available
    /// without a target cluster), i.e. after CreateMachine (and InitializeMachine) returned OK.
    Create,
    /// The InitializeMachine call that returned OK (not recorded when the provider does not implement it).
    Initialize,
    /// From the machine's creationTimestamp until it first turned Running (its node joined and is healthy).
    Join,
    /// From the first drain pass until the drain finished (a successful drain, or a force drain that ended).
    Drain,
    /// From the machine's deletionTimestamp until DeleteMachine returned OK (or NotFound).
    Delete,
}

/// `later - earlier` as a duration, zero when `later` is not after `earlier`.
pub fn elapsed(earlier: jiff::Timestamp, later: jiff::Timestamp) -> Duration {
    Duration::try_from(later.duration_since(earlier)).unwrap_or(Duration::ZERO)
}

/// Instance type and zone of a machine for the step metrics: the node's well-known labels
/// (`node.kubernetes.io/instance-type`, `topology.kubernetes.io/zone`) when the node is known; else, as the reference
/// labels `mcm_machine_num_failed_join`, the class's `nodeTemplate.instanceType` and the zone label of the machine's
/// `spec.nodeTemplate` (then the class's `nodeTemplate.zone`); else empty.
pub fn placement(machine: &Machine, node: Option<&Node>, class: Option<&MachineClass>) -> (String, String) {
    let node_label = |key: &str| {
        node.and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    let template = class.and_then(|c| c.node_template.as_ref());
    let instance_type = node_label(INSTANCE_TYPE_LABEL)
        .or_else(|| template.map(|t| t.instance_type.clone()))
        .unwrap_or_default();
    let zone = node_label(ZONE_LABEL)
        .or_else(|| {
            machine
                .spec
                .node_template
                .as_ref()
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.labels.as_ref())
                .and_then(|l| l.get(ZONE_LABEL))
                .filter(|v| !v.is_empty())
                .cloned()
        })
        .or_else(|| template.map(|t| t.zone.clone()))
        .unwrap_or_default();
    (instance_type, zone)
}

/// The node label of the instance type.
const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
/// The node label of the zone.
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

fn created_at(meta: &kube::api::ObjectMeta) -> String {
    meta.creation_timestamp
        .as_ref()
        .map_or_else(|| "0".to_owned(), |t| t.0.as_second().to_string())
}

fn count(n: usize) -> i64 {
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
    /// The registry with every metric registered, the cache-fed gauges empty until caches are attached.
    #[allow(clippy::too_many_lines)] // one registration per metric, in the order of the docs' table
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("mcm");
        let machine = MachineFamilies::default();
        let sets = SetFamilies::default();
        let deployments = DeploymentFamilies::default();
        let steps = StepFamilies::default();
        let reconciles = ReconcileFamilies::default();
        let frozen = Gauge::default();
        let driver_duration = Family::<OperationLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.005, 2.0, 14,
            ))
        });
        let driver_failed = Family::<FailedLabels, Counter>::default();
        let orphan_vms_found = Counter::default();
        let orphan_vms_deleted = Counter::default();
        let r = &mut registry;
        r.register(
            "machine_items_total",
            "Count of machines currently managed by the machine controller",
            machine.items.clone(),
        );
        r.register(
            "machine_current_status_phase",
            "Current phase of a machine: Terminating -4, Failed -3, CrashLoopBackOff -2, Unknown -1, Pending 0, \
             Running 1",
            machine.phase.clone(),
        );
        r.register(
            "machine_info",
            "Information of the machines currently managed by the machine controller (value 1)",
            machine.info.clone(),
        );
        r.register(
            "machine_status_condition",
            "Status of a condition of a machine (its node's, mirrored): True 1, False 0, Unknown 2",
            machine.condition.clone(),
        );
        r.register(
            "machine_create_duration_seconds",
            "Seconds from a machine's creation until its VM was created (phase Pending), last machine of the \
             deployment",
            steps.create.clone(),
        );
        r.register(
            "machine_initialize_duration_seconds",
            "Seconds the InitializeMachine call of a machine took, last machine of the deployment",
            steps.initialize.clone(),
        );
        r.register(
            "machine_join_duration_seconds",
            "Seconds from a machine's creation until it first turned Running, last machine of the deployment",
            steps.join.clone(),
        );
        r.register(
            "machine_drain_duration_seconds",
            "Seconds the drain of a machine's node took, last machine of the deployment",
            steps.drain.clone(),
        );
        r.register(
            "machine_delete_duration_seconds",
            "Seconds from a machine's deletion until its VM was deleted, last machine of the deployment",
            steps.delete.clone(),
        );
        r.register(
            "machine_num_failed_join",
            "Machines of a deployment that did not join within the creation timeout (Pending -> Failed); a counter \
             by behaviour, typed gauge to keep the reference's name without _total",
            steps.failed_join.clone(),
        );
        r.register(
            "machine_controller_frozen",
            "1 while the machine controller is frozen (API server unreachable), else 0",
            frozen.clone(),
        );
        r.register(
            "cloud_api_driver_request_duration_seconds",
            "Duration of provider (driver) calls",
            driver_duration.clone(),
        );
        r.register(
            "cloud_api_driver_requests_failed",
            "Provider (driver) calls that failed, by machine code",
            driver_failed.clone(),
        );
        r.register(
            "machine_orphan_vms_found",
            "VMs without a machine (or extra VMs of a machine) found by the orphan VM collection, each counted once",
            orphan_vms_found.clone(),
        );
        r.register(
            "machine_orphan_vms_deleted",
            "Orphan VMs deleted by the orphan VM collection",
            orphan_vms_deleted.clone(),
        );
        Self::register_sets(r, &sets);
        Self::register_deployments(r, &deployments);
        r.register(
            "controller_reconcile",
            "Reconciles finished, by controller and result (success or error)",
            reconciles.total.clone(),
        );
        r.register(
            "controller_reconcile_errors",
            "Reconciles that ended with an error, by controller",
            reconciles.errors.clone(),
        );
        r.register(
            "controller_reconcile_duration_seconds",
            "Duration of reconciles, by controller",
            reconciles.duration.clone(),
        );
        r.register(
            "workqueue_depth",
            "Objects of a controller whose reconcile is running or whose requeue is due and not started yet \
             (watch-triggered reconciles not started yet are not visible; see docs/machine-controller.md)",
            reconciles.depth.clone(),
        );
        r.register(
            "workqueue_longest_running_processor_seconds",
            "Seconds the longest running reconcile of a controller has been running",
            reconciles.longest_running.clone(),
        );
        r.register(
            "workqueue_unfinished_work_seconds",
            "Seconds of work in progress: the sum over running reconciles of how long each has been running",
            reconciles.unfinished.clone(),
        );
        Self {
            registry,
            machines: OnceLock::new(),
            machine_sets: OnceLock::new(),
            machine_deployments: OnceLock::new(),
            machine,
            sets,
            deployments,
            steps,
            reconciles,
            meters: Mutex::default(),
            frozen,
            driver_duration,
            driver_failed,
            orphan_vms_found,
            orphan_vms_deleted,
            readiness: Mutex::default(),
            extra: Mutex::default(),
            scrape: Mutex::default(),
        }
    }

    fn register_sets(r: &mut Registry, sets: &SetFamilies) {
        r.register(
            "machine_set_items_total",
            "Count of machine sets currently managed by the set controller",
            sets.items.clone(),
        );
        r.register(
            "machine_set_info",
            "Information of a machine set (value 1)",
            sets.info.clone(),
        );
        r.register(
            "machine_set_info_spec_replicas",
            "spec.replicas of a machine set",
            sets.spec_replicas.clone(),
        );
        r.register(
            "machine_set_info_spec_min_ready_seconds",
            "spec.minReadySeconds of a machine set",
            sets.spec_min_ready_seconds.clone(),
        );
        r.register(
            "machine_set_status_condition",
            "Status of a condition of a machine set: True 1, False 0, Unknown 2",
            sets.condition.clone(),
        );
        r.register(
            "machine_set_failed_machines",
            "A failed machine in status.failedMachines of a machine set (value 1)",
            sets.failed_machines.clone(),
        );
        r.register(
            "machine_set_status_available_replicas",
            "status.availableReplicas of a machine set",
            sets.available.clone(),
        );
        r.register(
            "machine_set_status_fully_labelled_replicas",
            "status.fullyLabeledReplicas of a machine set",
            sets.fully_labelled.clone(),
        );
        r.register(
            "machine_set_status_ready_replicas",
            "status.readyReplicas of a machine set",
            sets.ready.clone(),
        );
        r.register(
            "machine_set_status_replicas",
            "status.replicas of a machine set",
            sets.replicas.clone(),
        );
    }

    fn register_deployments(r: &mut Registry, d: &DeploymentFamilies) {
        let gauges: [(&str, &str, &Family<ObjectLabels, Gauge>); 14] = [
            (
                "machine_deployment_info_spec_paused",
                "spec.paused of a machine deployment (1 paused)",
                &d.spec_paused,
            ),
            (
                "machine_deployment_info_spec_replicas",
                "spec.replicas of a machine deployment",
                &d.spec_replicas,
            ),
            (
                "machine_deployment_info_spec_min_ready_seconds",
                "spec.minReadySeconds of a machine deployment",
                &d.spec_min_ready_seconds,
            ),
            (
                "machine_deployment_info_spec_rolling_update_max_surge",
                "maxSurge of a RollingUpdate machine deployment (a percentage resolved against spec.replicas, rounded \
                 up; 1 when absent)",
                &d.spec_max_surge,
            ),
            (
                "machine_deployment_info_spec_rolling_update_max_unavailable",
                "maxUnavailable of a RollingUpdate machine deployment (a percentage resolved against spec.replicas, \
                 rounded down; 1 when absent)",
                &d.spec_max_unavailable,
            ),
            (
                "machine_deployment_info_spec_revision_history_limit",
                "spec.revisionHistoryLimit of a machine deployment, when set",
                &d.spec_revision_history_limit,
            ),
            (
                "machine_deployment_info_spec_progress_deadline_seconds",
                "spec.progressDeadlineSeconds of a machine deployment, when set",
                &d.spec_progress_deadline_seconds,
            ),
            (
                "machine_deployment_info_spec_rollback_to_revision",
                "spec.rollbackTo.revision of a machine deployment, while set",
                &d.spec_rollback_to_revision,
            ),
            (
                "machine_deployment_status_available_replicas",
                "status.availableReplicas of a machine deployment",
                &d.available,
            ),
            (
                "machine_deployment_status_unavailable_replicas",
                "status.unavailableReplicas of a machine deployment",
                &d.unavailable,
            ),
            (
                "machine_deployment_status_ready_replicas",
                "status.readyReplicas of a machine deployment",
                &d.ready,
            ),
            (
                "machine_deployment_status_updated_replicas",
                "status.updatedReplicas of a machine deployment",
                &d.updated,
            ),
            (
                "machine_deployment_status_replicas",
                "status.replicas of a machine deployment",
                &d.replicas,
            ),
            (
                "machine_deployment_status_collision_count",
                "status.collisionCount of a machine deployment, when set",
                &d.collision_count,
            ),
        ];
        r.register(
            "machine_deployment_items_total",
            "Count of machine deployments currently managed by the deployment controller",
            d.items.clone(),
        );
        r.register(
            "machine_deployment_info",
            "Information of a machine deployment (value 1)",
            d.info.clone(),
        );
        for (name, help, family) in gauges {
            r.register(name, help, family.clone());
        }
        r.register(
            "machine_deployment_status_condition",
            "Status of a condition of a machine deployment: True 1, False 0, Unknown 2",
            d.condition.clone(),
        );
        r.register(
            "machine_deployment_failed_machines",
            "A failed machine in status.failedMachines of a machine deployment (value 1)",
            d.failed_machines.clone(),
        );
    }

    /// Adds metric families that are not the controllers' own to every scrape of `/metrics`: a provider running
    /// in this process (`mcm run --provider aws`) has its cloud API metrics served here, as the reference's
    /// provider process serves them on its one `/metrics`. Their names must not clash with ours.
    pub fn add_families(&self, families: ExtraFamilies) {
        self.extra
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(families);
    }

    /// Adds a check to `/readyz`: the process is ready when every check passes. `name` appears in the answer.
    pub fn add_readiness_check(
        &self,
        name: &str,
        check: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) {
        self.readiness
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((name.to_owned(), Box::new(check)));
    }

    /// The `/readyz` answer: whether ready, and one line per check (`[+]name ok` or `[-]name failed: reason`, as
    /// kube-apiserver's verbose readyz).
    pub fn readiness(&self) -> (bool, String) {
        let mut ready = true;
        let mut text = String::new();
        if let Some(machines) = self.machines.get()
            && !crate::cache::synced(machines)
        {
            ready = false;
            text.push_str("[-]machine-cache failed: the machine cache has not synced yet\n");
        }
        let checks = self.readiness.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, check) in checks.iter() {
            match check() {
                Ok(()) => {
                    use std::fmt::Write as _;
                    let _ = writeln!(text, "[+]{name} ok");
                }
                Err(reason) => {
                    use std::fmt::Write as _;
                    ready = false;
                    let _ = writeln!(text, "[-]{name} failed: {reason}");
                }
            }
        }
        text.push_str(if ready {
            "readyz check passed\n"
        } else {
            "readyz check failed\n"
        });
        (ready, text)
    }

    /// Counts an orphan VM found (`mcm_machine_orphan_vms_found_total`).
    pub fn orphan_vm_found(&self) {
        self.orphan_vms_found.inc();
    }

    /// Counts an orphan VM deleted (`mcm_machine_orphan_vms_deleted_total`).
    pub fn orphan_vm_deleted(&self) {
        self.orphan_vms_deleted.inc();
    }

    /// Reads machine state from this cache at scrape time (the machine controller attaches its own).
    pub fn attach_machines(&self, machines: Store<Machine>) {
        let _ = self.machines.set(machines);
    }

    /// Reads machine set state from this cache at scrape time (the set controller attaches its own).
    pub fn attach_machine_sets(&self, sets: Store<MachineSet>) {
        let _ = self.machine_sets.set(sets);
    }

    /// Reads machine deployment state from this cache at scrape time (the deployment controller attaches its own).
    pub fn attach_machine_deployments(&self, deployments: Store<MachineDeployment>) {
        let _ = self.machine_deployments.set(deployments);
    }

    /// Sets `mcm_machine_controller_frozen`.
    pub fn set_frozen(&self, frozen: bool) {
        self.frozen.set(i64::from(frozen));
    }

    /// Sets the gauge of `step` for the machine's deployment (its `name` label) to `took`. A machine without a
    /// `name` label belongs to no deployment and is not recorded (as in the reference).
    pub fn machine_step(
        &self,
        step: MachineStep,
        machine: &Machine,
        node: Option<&Node>,
        class: Option<&MachineClass>,
        took: Duration,
    ) {
        let Some(labels) = Self::step_labels(machine, node, class) else {
            return;
        };
        let seconds = took.as_secs_f64();
        let family = match step {
            MachineStep::Create => &self.steps.create,
            MachineStep::Initialize => &self.steps.initialize,
            MachineStep::Join => &self.steps.join,
            MachineStep::Delete => &self.steps.delete,
            MachineStep::Drain => {
                self.steps
                    .drain
                    .get_or_create(&DrainLabels {
                        namespace: labels.namespace,
                        machine_deployment: labels.machine_deployment,
                    })
                    .set(seconds);
                return;
            }
        };
        family.get_or_create(&labels).set(seconds);
    }

    /// Counts a machine of a deployment that did not join within the creation timeout
    /// (`mcm_machine_num_failed_join`).
    pub fn machine_failed_join(&self, machine: &Machine, node: Option<&Node>, class: Option<&MachineClass>) {
        if let Some(labels) = Self::step_labels(machine, node, class) {
            self.steps.failed_join.get_or_create(&labels).inc();
        }
    }

    fn step_labels(
        machine: &Machine,
        node: Option<&Node>,
        class: Option<&MachineClass>,
    ) -> Option<StepLabels> {
        let deployment = machine
            .labels()
            .get(keys::labels::NAME)
            .filter(|n| !n.is_empty())?
            .clone();
        let (instance_type, zone) = placement(machine, node, class);
        Some(StepLabels {
            namespace: machine.namespace().unwrap_or_default(),
            machine_deployment: deployment,
            instance_type,
            zone,
        })
    }

    /// A [`ReconcileMeter`] for the controller named `controller` (also the `name` of its work queue metrics), whose
    /// objects are in `store` (a requeue of an object gone from it is never run, so it stops counting). Without
    /// metrics the meter does nothing.
    pub fn reconcile_meter<K>(
        metrics: Option<&Arc<Self>>,
        controller: &str,
        store: &Store<K>,
    ) -> ReconcileMeter
    where
        K: Resource + Clone + Send + Sync + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let Some(metrics) = metrics else {
            return ReconcileMeter::default();
        };
        let store = store.clone();
        let shared = Arc::new(MeterShared {
            controller: controller.to_owned(),
            families: metrics.reconciles.clone(),
            work: Mutex::default(),
            exists: Box::new(move |(namespace, name): &WorkKey| {
                let reference = ObjectRef::<K>::new_with(name, K::DynamicType::default());
                let reference = if namespace.is_empty() {
                    reference
                } else {
                    reference.within(namespace)
                };
                store.get(&reference).is_some()
            }),
        });
        metrics
            .meters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(shared.clone());
        ReconcileMeter(Some(shared))
    }

    /// The text exposition (Prometheus / OpenMetrics text), the cache-fed gauges refreshed first.
    pub fn encode(&self) -> String {
        let _one_scrape = self.scrape.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(store) = self.machines.get() {
            self.refresh_machines(&store.state());
        }
        if let Some(store) = self.machine_sets.get() {
            self.refresh_sets(&store.state());
        }
        if let Some(store) = self.machine_deployments.get() {
            self.refresh_deployments(&store.state());
        }
        self.refresh_queues();
        let mut out = String::new();
        // Writing into a String cannot fail; an extra source that fails loses only its own families.
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, &self.registry);
        for families in self.extra.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            let mut text = String::new();
            if families(&mut text).is_ok() {
                out.push_str(&text);
            }
        }
        let _ = prometheus_client::encoding::text::encode_eof(&mut out);
        out
    }

    fn refresh_machines(&self, machines: &[Arc<Machine>]) {
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
                    node_name: machine
                        .labels()
                        .get(keys::labels::NODE)
                        .cloned()
                        .unwrap_or_default(),
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

    fn refresh_sets(&self, sets: &[Arc<MachineSet>]) {
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

    fn refresh_deployments(&self, deployments: &[Arc<MachineDeployment>]) {
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

    fn refresh_queues(&self) {
        let meters = self.meters.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        for meter in meters.iter() {
            let queue = QueueLabels {
                name: meter.controller.clone(),
            };
            let view = meter.queue(now);
            let r = &self.reconciles;
            r.depth.get_or_create(&queue).set(count(view.depth));
            r.longest_running
                .get_or_create(&queue)
                .set(view.longest_running.as_secs_f64());
            r.unfinished
                .get_or_create(&queue)
                .set(view.unfinished.as_secs_f64());
        }
    }

    fn observe(&self, provider: &str, method: DriverMethod, started: Instant, error: Option<&DriverError>) {
        let operation = method.name().to_owned();
        self.driver_duration
            .get_or_create(&OperationLabels {
                provider: provider.to_owned(),
                operation: operation.clone(),
            })
            .observe(started.elapsed().as_secs_f64());
        if let Some(error) = error {
            self.driver_failed
                .get_or_create(&FailedLabels {
                    provider: provider.to_owned(),
                    operation,
                    error_code: error.code.name().to_owned(),
                })
                .inc();
        }
    }
}

/// `(namespace, name)` of an object a controller reconciles.
type WorkKey = (String, String);

fn work_key(object: &impl Resource) -> WorkKey {
    let meta = object.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// What a meter knows of its controller's work: reconciles running (since when) and requeues scheduled (due when).
#[derive(Default)]
struct Work {
    running: HashMap<WorkKey, Instant>,
    scheduled: HashMap<WorkKey, Instant>,
    /// When `scheduled` grows past this, the requeues of objects gone from the cache are dropped (scrapes drop them
    /// too; this bounds the map of a process that is never scraped).
    prune_at: usize,
}

/// The work queue figures of one controller at one instant.
struct QueueView {
    depth: usize,
    longest_running: Duration,
    unfinished: Duration,
}

struct MeterShared {
    controller: String,
    families: ReconcileFamilies,
    work: Mutex<Work>,
    /// Whether the controller's cache still holds the object: kube-runtime drops a requeue of an object gone from
    /// it without a reconcile, so such a requeue must stop counting.
    exists: Box<dyn Fn(&WorkKey) -> bool + Send + Sync>,
}

impl MeterShared {
    fn work(&self) -> std::sync::MutexGuard<'_, Work> {
        self.work.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn queue(&self, now: Instant) -> QueueView {
        let mut work = self.work();
        let due: Vec<WorkKey> = work
            .scheduled
            .iter()
            .filter(|(_, due)| **due <= now)
            .map(|(key, _)| key.clone())
            .collect();
        let mut waiting = 0;
        for key in due {
            if (self.exists)(&key) {
                waiting += 1;
            } else {
                work.scheduled.remove(&key);
            }
        }
        let running: Vec<Duration> = work.running.values().map(|since| now - *since).collect();
        QueueView {
            depth: running.len() + waiting,
            longest_running: running.iter().max().copied().unwrap_or_default(),
            unfinished: running.iter().sum(),
        }
    }
}

/// Counts, times and follows the reconciles of one controller: `mcm_controller_reconcile_total{controller,result}`,
/// `mcm_controller_reconcile_errors_total`, `mcm_controller_reconcile_duration_seconds` and the work queue gauges.
/// kube-runtime's scheduler does not show its queue, so the meter follows what passes through the reconciler and
/// the error policy ([`ReconcileMeter::reconcile`], [`ReconcileMeter::error_policy`]): which objects are being
/// reconciled, and when each one's requeue is due. A default meter does nothing.
#[derive(Clone, Default)]
pub struct ReconcileMeter(Option<Arc<MeterShared>>);

impl std::fmt::Debug for ReconcileMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ReconcileMeter")
            .field(&self.0.as_ref().map(|m| m.controller.as_str()))
            .finish()
    }
}

impl ReconcileMeter {
    /// Notes that the reconcile of `object` starts: its earlier requeue, if any, is what started it (or was replaced
    /// by an earlier trigger). The returned guard records the reconcile when it is finished, and forgets it if it
    /// is dropped unfinished (a reconcile cancelled at shutdown counts nowhere).
    pub fn start(&self, object: &impl Resource) -> ReconcileGuard {
        let Some(shared) = &self.0 else {
            return ReconcileGuard(None);
        };
        let key = work_key(object);
        let started = Instant::now();
        {
            let mut work = shared.work();
            work.scheduled.remove(&key);
            work.running.insert(key.clone(), started);
        }
        ReconcileGuard(Some(GuardInner {
            shared: shared.clone(),
            key,
            started,
        }))
    }

    /// `reconcile` metered: pass the result to `Controller::run` in place of the reconciler.
    pub fn reconcile<K, C, E, Fut>(
        &self,
        mut reconcile: impl FnMut(Arc<K>, Arc<C>) -> Fut,
    ) -> impl FnMut(Arc<K>, Arc<C>) -> BoxFuture<'static, Result<Action, E>>
    where
        K: Resource,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let meter = self.clone();
        move |object: Arc<K>, context: Arc<C>| {
            let guard = meter.start(&*object);
            let future = reconcile(object, context);
            Box::pin(async move {
                let result = future.await;
                guard.finish(result.as_ref().ok());
                result
            })
        }
    }

    /// `error_policy` metered (the requeue it asks for is followed): pass the result to `Controller::run`.
    pub fn error_policy<K, C, E>(
        &self,
        policy: impl Fn(Arc<K>, &E, Arc<C>) -> Action,
    ) -> impl Fn(Arc<K>, &E, Arc<C>) -> Action
    where
        K: Resource,
    {
        let meter = self.clone();
        move |object: Arc<K>, error: &E, context: Arc<C>| -> Action {
            let key = work_key(&*object);
            let action = policy(object, error, context);
            if let Some(shared) = &meter.0 {
                schedule(shared, key, &action);
            }
            action
        }
    }
}

fn schedule(shared: &MeterShared, key: WorkKey, action: &Action) {
    let mut work = shared.work();
    match requeue_after(action).and_then(|after| Instant::now().checked_add(after)) {
        Some(due) => {
            work.scheduled.insert(key, due);
        }
        None => {
            work.scheduled.remove(&key);
        }
    }
    if work.scheduled.len() > work.prune_at.max(PRUNE_AT_LEAST) {
        work.scheduled.retain(|key, _| (shared.exists)(key));
        work.prune_at = work.scheduled.len() * 2;
    }
}

/// The size of the requeue map below which it is never pruned.
const PRUNE_AT_LEAST: usize = 1024;

/// When `action` requeues, read from its `Debug` text (`Action { requeue_after: Some(5s) }`): kube-runtime keeps the
/// field private. `None` for `await_change` (and, should the text ever change, for anything unreadable: the unit
/// test pins the format).
pub fn requeue_after(action: &Action) -> Option<Duration> {
    let text = format!("{action:?}");
    let inner = text.split("Some(").nth(1)?.split(')').next()?;
    let (number, scale) = [("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)]
        .into_iter()
        .find_map(|(unit, scale)| inner.strip_suffix(unit).map(|n| (n, scale)))?;
    let seconds: f64 = number.parse().ok()?;
    Duration::try_from_secs_f64(seconds * scale).ok()
}

struct GuardInner {
    shared: Arc<MeterShared>,
    key: WorkKey,
    started: Instant,
}

/// One reconcile in progress ([`ReconcileMeter::start`]).
pub struct ReconcileGuard(Option<GuardInner>);

impl ReconcileGuard {
    /// Records the reconcile: `Some(action)` when it succeeded (its requeue is followed), `None` when it failed (the
    /// error policy's requeue is followed by [`ReconcileMeter::error_policy`]).
    pub fn finish(mut self, outcome: Option<&Action>) {
        let Some(inner) = self.0.take() else { return };
        let shared = &inner.shared;
        let controller = ControllerLabels {
            controller: shared.controller.clone(),
        };
        shared
            .families
            .duration
            .get_or_create(&controller)
            .observe(inner.started.elapsed().as_secs_f64());
        let result = if outcome.is_some() { "success" } else { "error" };
        shared
            .families
            .total
            .get_or_create(&ReconcileLabels {
                controller: shared.controller.clone(),
                result: result.to_owned(),
            })
            .inc();
        if outcome.is_none() {
            shared.families.errors.get_or_create(&controller).inc();
        }
        shared.work().running.remove(&inner.key);
        if let Some(action) = outcome {
            schedule(shared, inner.key.clone(), action);
        }
    }
}

impl Drop for ReconcileGuard {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            inner.shared.work().running.remove(&inner.key);
        }
    }
}

/// A [`Driver`] that counts and times every call of the driver it wraps.
pub struct MeteredDriver {
    inner: Arc<dyn Driver>,
    provider: String,
    metrics: Arc<Metrics>,
}

impl MeteredDriver {
    /// Wraps `inner`, reporting under the label `provider`.
    pub fn new(inner: Arc<dyn Driver>, provider: &str, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            provider: provider.to_owned(),
            metrics,
        }
    }

    fn done<T>(
        &self,
        method: DriverMethod,
        started: Instant,
        result: Result<T, DriverError>,
    ) -> Result<T, DriverError> {
        self.metrics
            .observe(&self.provider, method, started, result.as_ref().err());
        result
    }
}

#[async_trait]
impl Driver for MeteredDriver {
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        let started = Instant::now();
        let result = self.inner.create_machine(request).await;
        self.done(DriverMethod::CreateMachine, started, result)
    }

    async fn initialize_machine(
        &self,
        request: &InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        let started = Instant::now();
        let result = self.inner.initialize_machine(request).await;
        self.done(DriverMethod::InitializeMachine, started, result)
    }

    async fn delete_machine(
        &self,
        request: &DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        let started = Instant::now();
        let result = self.inner.delete_machine(request).await;
        self.done(DriverMethod::DeleteMachine, started, result)
    }

    async fn get_machine_status(
        &self,
        request: &GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        let started = Instant::now();
        let result = self.inner.get_machine_status(request).await;
        self.done(DriverMethod::GetMachineStatus, started, result)
    }

    async fn list_machines(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        let started = Instant::now();
        let result = self.inner.list_machines(request).await;
        self.done(DriverMethod::ListMachines, started, result)
    }

    async fn get_volume_ids(
        &self,
        request: &GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        let started = Instant::now();
        let result = self.inner.get_volume_ids(request).await;
        self.done(DriverMethod::GetVolumeIds, started, result)
    }

    async fn generate_machine_class_for_migration(
        &self,
        request: &GenerateMachineClassForMigrationRequest,
    ) -> Result<GenerateMachineClassForMigrationResponse, DriverError> {
        let started = Instant::now();
        let result = self.inner.generate_machine_class_for_migration(request).await;
        self.done(DriverMethod::GenerateMachineClassForMigration, started, result)
    }
}

async fn readyz_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    let (ready, text) = metrics.readiness();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, text)
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        StatusCode::OK,
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}

/// Binds `addr` (port 0 picks a free port) and serves `/metrics` and `/healthz` until `shutdown` resolves. Returns
/// the bound address and the server task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    // `/healthz` answers OK while the process serves, as the reference's does (§8.4); `/readyz` answers 503 until the
    // machine cache has synced and while any added check fails (the provider unreachable).
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "OK" }))
        .route("/readyz", get(readyz_handler))
        .with_state(metrics);
    let task = tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::warn!(error = %err, "metrics server stopped");
        }
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_families_are_served_before_the_one_closing_eof() {
        let metrics = Metrics::new();
        let mut other = Registry::with_prefix("mcm");
        let requests = Family::<FailedLabels, Counter>::default();
        other.register("cloud_api_requests", "Requests to a cloud", requests.clone());
        requests
            .get_or_create(&FailedLabels {
                provider: "aws".into(),
                operation: "x".into(),
                error_code: "y".into(),
            })
            .inc();
        metrics.add_families(Box::new(move |out| {
            prometheus_client::encoding::text::encode_registry(out, &other)
        }));
        let text = metrics.encode();
        assert!(
            text.contains(r#"mcm_cloud_api_requests_total{provider="aws",operation="x",error_code="y"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("# TYPE mcm_machine_items_total"),
            "ours still there: {text}"
        );
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn readyz_fails_until_the_machine_cache_syncs_and_while_a_check_fails() {
        let metrics = Metrics::new();
        assert!(metrics.readiness().0, "nothing to wait for yet");
        let (store, mut writer) = kube::runtime::reflector::store::<Machine>();
        metrics.attach_machines(store);
        let (ready, text) = metrics.readiness();
        assert!(!ready);
        assert!(text.contains("[-]machine-cache failed"), "{text}");
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        assert!(metrics.readiness().0, "synced");
        let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = healthy.clone();
        metrics.add_readiness_check("provider", move || {
            if seen.load(std::sync::atomic::Ordering::SeqCst) {
                Ok(())
            } else {
                Err("unreachable".into())
            }
        });
        let (ready, text) = metrics.readiness();
        assert!(!ready);
        assert!(text.contains("[-]provider failed: unreachable"), "{text}");
        healthy.store(true, std::sync::atomic::Ordering::SeqCst);
        let (ready, text) = metrics.readiness();
        assert!(ready, "{text}");
        assert!(text.contains("[+]provider ok"), "{text}");
    }

    #[test]
    fn phases_are_encoded_as_the_reference_does() {
        assert_eq!(phase_value(Some(MachinePhase::Terminating)), -4);
        assert_eq!(phase_value(Some(MachinePhase::Failed)), -3);
        assert_eq!(phase_value(Some(MachinePhase::CrashLoopBackOff)), -2);
        assert_eq!(phase_value(Some(MachinePhase::Unknown)), -1);
        assert_eq!(phase_value(Some(MachinePhase::Pending)), 0);
        assert_eq!(phase_value(Some(MachinePhase::Running)), 1);
        assert_eq!(phase_value(None), 0);
    }

    #[tokio::test]
    async fn driver_failures_are_counted_by_operation_and_code() {
        struct Failing;
        #[async_trait]
        impl Driver for Failing {
            async fn create_machine(
                &self,
                _: &CreateMachineRequest,
            ) -> Result<CreateMachineResponse, DriverError> {
                Err(DriverError::new(
                    mcm_driver::MachineCode::ResourceExhausted,
                    "quota",
                ))
            }
            async fn delete_machine(
                &self,
                _: &DeleteMachineRequest,
            ) -> Result<DeleteMachineResponse, DriverError> {
                Ok(DeleteMachineResponse::default())
            }
        }
        let metrics = Arc::new(Metrics::new());
        let driver = MeteredDriver::new(Arc::new(Failing), "sim", metrics.clone());
        let request = CreateMachineRequest {
            machine: Machine::default(),
            machine_class: mcm_api::MachineClass::default(),
            secret: k8s_openapi::api::core::v1::Secret::default(),
        };
        assert!(driver.create_machine(&request).await.is_err());
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"mcm_cloud_api_driver_requests_failed_total{provider="sim",operation="CreateMachine",error_code="ResourceExhausted"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"mcm_cloud_api_driver_request_duration_seconds_count{provider="sim",operation="CreateMachine"} 1"#),
            "{text}"
        );
    }

    fn store_of<K>(objects: Vec<K>) -> Store<K>
    where
        K: Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let (store, mut writer) = kube::runtime::reflector::store::<K>();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
        for object in objects {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::InitApply(object));
        }
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        store
    }

    fn machine(value: serde_json::Value) -> Machine {
        serde_json::from_value(value).expect("a machine")
    }

    /// The lines of `text` that start with `prefix`.
    fn lines<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    #[test]
    fn machine_info_and_conditions_are_read_from_the_cache() {
        let metrics = Metrics::new();
        metrics.attach_machines(store_of(vec![
            machine(serde_json::json!({
                "metadata": {
                    "name": "m1", "namespace": "ns", "creationTimestamp": "2024-01-02T03:04:05Z",
                    "labels": { "node": "node-1", "name": "pool" }
                },
                "spec": {
                    "class": { "apiGroup": "machine.sapcloud.io", "kind": "MachineClass", "name": "small" },
                    "providerID": "sim://pool/1"
                },
                "status": {
                    "currentStatus": { "phase": "Running" },
                    "conditions": [
                        { "type": "Ready", "status": "True" },
                        { "type": "DiskPressure", "status": "False" },
                        { "type": "NetworkUnavailable", "status": "Unknown" }
                    ]
                }
            })),
            machine(serde_json::json!({
                "metadata": { "name": "m2", "namespace": "ns" },
                "spec": { "class": { "kind": "MachineClass", "name": "small" } }
            })),
        ]));
        let text = metrics.encode();
        assert!(text.contains("mcm_machine_items_total 2\n"), "{text}");
        assert!(
            text.contains(
                r#"mcm_machine_info{name="m1",namespace="ns",createdAt="1704164645",spec_provider_id="sim://pool/1",spec_class_api_group="machine.sapcloud.io",spec_class_kind="MachineClass",spec_class_name="small",node_name="node-1"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"mcm_machine_info{name="m2",namespace="ns",createdAt="0",spec_provider_id="",spec_class_api_group="",spec_class_kind="MachineClass",spec_class_name="small",node_name=""} 1"#
            ),
            "{text}"
        );
        for (condition, value) in [("Ready", 1), ("DiskPressure", 0), ("NetworkUnavailable", 2)] {
            let line = format!(
                r#"mcm_machine_status_condition{{name="m1",namespace="ns",condition="{condition}"}} {value}"#
            );
            assert!(text.contains(&line), "{line}\n{text}");
        }
        assert_eq!(lines(&text, "mcm_machine_status_condition{").len(), 3, "{text}");
        assert!(
            text.contains(r#"mcm_machine_current_status_phase{name="m1",namespace="ns"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn conditions_are_encoded_as_the_reference_does() {
        assert_eq!(condition_value("True"), 1);
        assert_eq!(condition_value("False"), 0);
        assert_eq!(condition_value("Unknown"), 2);
        assert_eq!(condition_value("Maybe"), 2);
    }

    #[test]
    fn machine_sets_and_deployments_are_read_from_their_caches() {
        let metrics = Metrics::new();
        let failed = serde_json::json!([{
            "name": "m9", "providerID": "sim://9", "ownerRef": "pool-abc",
            "lastOperation": { "state": "Failed", "type": "Create", "description": "quota" }
        }]);
        let set: MachineSet = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "pool-abc", "namespace": "ns", "creationTimestamp": "2024-01-02T03:04:05Z" },
            "spec": {
                "replicas": 3, "minReadySeconds": 7,
                "machineClass": { "kind": "MachineClass", "name": "small" },
                "template": { "spec": { "class": { "kind": "MachineClass", "name": "small" } } }
            },
            "status": {
                "replicas": 3, "fullyLabeledReplicas": 3, "readyReplicas": 2, "availableReplicas": 1,
                "machineSetCondition": [{ "type": "ReplicaFailure", "status": "True" }],
                "failedMachines": failed
            }
        }))
        .unwrap();
        let deployment: MachineDeployment = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "pool", "namespace": "ns", "creationTimestamp": "2024-01-02T03:04:05Z" },
            "spec": {
                "replicas": 4, "minReadySeconds": 5, "paused": true, "revisionHistoryLimit": 2,
                "progressDeadlineSeconds": 600,
                "strategy": { "rollingUpdate": { "maxSurge": "25%", "maxUnavailable": "25%" } },
                "template": { "spec": { "class": { "kind": "MachineClass", "name": "small" } } }
            },
            "status": {
                "replicas": 5, "updatedReplicas": 2, "readyReplicas": 4, "availableReplicas": 3,
                "unavailableReplicas": 1, "collisionCount": 1,
                "conditions": [
                    { "type": "Available", "status": "False" },
                    { "type": "Progressing", "status": "Unknown" }
                ],
                "failedMachines": failed
            }
        }))
        .unwrap();
        metrics.attach_machine_sets(store_of(vec![set]));
        metrics.attach_machine_deployments(store_of(vec![deployment]));
        let text = metrics.encode();
        let of = r#"{name="pool-abc",namespace="ns"}"#;
        for expected in [
            "mcm_machine_set_items_total 1".to_owned(),
            r#"mcm_machine_set_info{name="pool-abc",namespace="ns",createdAt="1704164645",spec_machine_class_api_group="",spec_machine_class_kind="MachineClass",spec_machine_class_name="small"} 1"#.to_owned(),
            format!("mcm_machine_set_info_spec_replicas{of} 3"),
            format!("mcm_machine_set_info_spec_min_ready_seconds{of} 7"),
            format!("mcm_machine_set_status_replicas{of} 3"),
            format!("mcm_machine_set_status_fully_labelled_replicas{of} 3"),
            format!("mcm_machine_set_status_ready_replicas{of} 2"),
            format!("mcm_machine_set_status_available_replicas{of} 1"),
            r#"mcm_machine_set_status_condition{name="pool-abc",namespace="ns",condition="ReplicaFailure"} 1"#.to_owned(),
            r#"mcm_machine_set_failed_machines{name="pool-abc",namespace="ns",failed_machine_name="m9",failed_machine_provider_id="sim://9",failed_machine_last_operation_state="Failed",failed_machine_last_operation_machine_operation_type="Create",failed_machine_owner_ref="pool-abc"} 1"#.to_owned(),
        ] {
            assert!(text.contains(&expected), "{expected}\n{text}");
        }
        let of = r#"{name="pool",namespace="ns"}"#;
        for expected in [
            "mcm_machine_deployment_items_total 1".to_owned(),
            r#"mcm_machine_deployment_info{name="pool",namespace="ns",createdAt="1704164645",spec_strategy_type="RollingUpdate"} 1"#.to_owned(),
            format!("mcm_machine_deployment_info_spec_paused{of} 1"),
            format!("mcm_machine_deployment_info_spec_replicas{of} 4"),
            format!("mcm_machine_deployment_info_spec_min_ready_seconds{of} 5"),
            // 25% of 4: maxSurge rounds up, maxUnavailable down (both 1 here).
            format!("mcm_machine_deployment_info_spec_rolling_update_max_surge{of} 1"),
            format!("mcm_machine_deployment_info_spec_rolling_update_max_unavailable{of} 1"),
            format!("mcm_machine_deployment_info_spec_revision_history_limit{of} 2"),
            format!("mcm_machine_deployment_info_spec_progress_deadline_seconds{of} 600"),
            format!("mcm_machine_deployment_status_replicas{of} 5"),
            format!("mcm_machine_deployment_status_updated_replicas{of} 2"),
            format!("mcm_machine_deployment_status_ready_replicas{of} 4"),
            format!("mcm_machine_deployment_status_available_replicas{of} 3"),
            format!("mcm_machine_deployment_status_unavailable_replicas{of} 1"),
            format!("mcm_machine_deployment_status_collision_count{of} 1"),
            r#"mcm_machine_deployment_status_condition{name="pool",namespace="ns",condition="Available"} 0"#.to_owned(),
            r#"mcm_machine_deployment_status_condition{name="pool",namespace="ns",condition="Progressing"} 2"#.to_owned(),
            r#"mcm_machine_deployment_failed_machines{name="pool",namespace="ns",failed_machine_name="m9","#.to_owned(),
        ] {
            assert!(text.contains(&expected), "{expected}\n{text}");
        }
        assert!(
            lines(&text, "mcm_machine_deployment_info_spec_rollback_to_revision{").is_empty(),
            "{text}"
        );
    }

    #[test]
    fn step_gauges_are_set_per_deployment_and_placement() {
        let metrics = Metrics::new();
        let m = machine(serde_json::json!({
            "metadata": { "name": "m1", "namespace": "ns", "labels": { "name": "pool" } },
            "spec": {
                "class": { "kind": "MachineClass", "name": "small" },
                "nodeTemplate": { "metadata": { "labels": { "topology.kubernetes.io/zone": "zone-b" } } }
            }
        }));
        let class: MachineClass = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "small", "namespace": "ns" },
            "nodeTemplate": { "capacity": {}, "instanceType": "m5.large", "region": "r", "zone": "zone-c" }
        }))
        .unwrap();
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "node-1", "labels": {
                "node.kubernetes.io/instance-type": "small", "topology.kubernetes.io/zone": "zone-a"
            } }
        }))
        .unwrap();
        // Before the node exists: the class's instance type and the machine's zone label.
        metrics.machine_step(
            MachineStep::Create,
            &m,
            None,
            Some(&class),
            Duration::from_millis(2500),
        );
        metrics.machine_step(
            MachineStep::Initialize,
            &m,
            None,
            Some(&class),
            Duration::from_secs(1),
        );
        // With the node: its labels.
        metrics.machine_step(
            MachineStep::Join,
            &m,
            Some(&node),
            Some(&class),
            Duration::from_secs(30),
        );
        metrics.machine_step(
            MachineStep::Drain,
            &m,
            Some(&node),
            Some(&class),
            Duration::from_secs(4),
        );
        metrics.machine_step(
            MachineStep::Delete,
            &m,
            Some(&node),
            Some(&class),
            Duration::from_secs(9),
        );
        // A later machine of the same deployment replaces the value.
        metrics.machine_step(
            MachineStep::Delete,
            &m,
            Some(&node),
            Some(&class),
            Duration::from_secs(8),
        );
        metrics.machine_failed_join(&m, None, Some(&class));
        metrics.machine_failed_join(&m, None, Some(&class));
        // A machine of no deployment is not recorded.
        let standalone = machine(serde_json::json!({ "metadata": { "name": "single", "namespace": "ns" } }));
        metrics.machine_step(
            MachineStep::Create,
            &standalone,
            None,
            None,
            Duration::from_secs(1),
        );
        metrics.machine_failed_join(&standalone, None, None);
        let text = metrics.encode();
        let before = r#"{namespace="ns",machine_deployment="pool",instance_type="m5.large",zone="zone-b"}"#;
        let after = r#"{namespace="ns",machine_deployment="pool",instance_type="small",zone="zone-a"}"#;
        for expected in [
            format!("mcm_machine_create_duration_seconds{before} 2.5"),
            format!("mcm_machine_initialize_duration_seconds{before} 1.0"),
            format!("mcm_machine_join_duration_seconds{after} 30.0"),
            r#"mcm_machine_drain_duration_seconds{namespace="ns",machine_deployment="pool"} 4.0"#.to_owned(),
            format!("mcm_machine_delete_duration_seconds{after} 8.0"),
            format!("mcm_machine_num_failed_join{before} 2"),
        ] {
            assert!(text.contains(&expected), "{expected}\n{text}");
        }
        assert_eq!(
            lines(&text, "mcm_machine_create_duration_seconds{").len(),
            1,
            "{text}"
        );
        assert_eq!(lines(&text, "mcm_machine_num_failed_join{").len(), 1, "{text}");
        assert!(
            text.contains("# TYPE mcm_machine_num_failed_join gauge"),
            "{text}"
        );
    }

    #[test]
    fn placement_prefers_the_node_then_the_templates() {
        let m = machine(serde_json::json!({ "metadata": { "name": "m1" } }));
        assert_eq!(placement(&m, None, None), (String::new(), String::new()));
        let class: MachineClass = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "small" },
            "nodeTemplate": { "capacity": {}, "instanceType": "m5.large", "region": "r", "zone": "zone-c" }
        }))
        .unwrap();
        assert_eq!(
            placement(&m, None, Some(&class)),
            ("m5.large".to_owned(), "zone-c".to_owned())
        );
        let unlabelled: Node =
            serde_json::from_value(serde_json::json!({ "metadata": { "name": "n" } })).unwrap();
        assert_eq!(
            placement(&m, Some(&unlabelled), Some(&class)),
            ("m5.large".to_owned(), "zone-c".to_owned())
        );
    }

    #[test]
    fn requeues_are_read_from_actions() {
        for duration in [
            Duration::from_secs(5),
            Duration::from_millis(100),
            Duration::from_millis(1500),
            Duration::from_mins(10),
            Duration::from_micros(250),
            Duration::from_nanos(7),
            Duration::ZERO,
        ] {
            let read = requeue_after(&Action::requeue(duration)).expect("a requeue");
            assert!(
                read.abs_diff(duration) < Duration::from_micros(1),
                "{duration:?} read as {read:?}"
            );
        }
        assert_eq!(requeue_after(&Action::await_change()), None);
    }

    #[test]
    fn the_meter_counts_reconciles_and_follows_the_queue() {
        let metrics = Arc::new(Metrics::new());
        let m1 = machine(serde_json::json!({ "metadata": { "name": "m1", "namespace": "ns" } }));
        let m2 = machine(serde_json::json!({ "metadata": { "name": "m2", "namespace": "ns" } }));
        let gone = machine(serde_json::json!({ "metadata": { "name": "gone", "namespace": "ns" } }));
        let store = store_of(vec![m1.clone(), m2.clone()]);
        let meter = Metrics::reconcile_meter(Some(&metrics), "machine", &store);

        // m1 succeeds and requeues at once (due), m2 is still running, `gone` fails and its requeue is due, but it
        // left the cache: kube-runtime drops such a requeue, so it does not count.
        meter.start(&m1).finish(Some(&Action::requeue(Duration::ZERO)));
        let running = meter.start(&m2);
        meter.start(&gone).finish(None);
        let policy =
            meter.error_policy(|_: Arc<Machine>, _: &String, _: Arc<()>| Action::requeue(Duration::ZERO));
        let _ = policy(Arc::new(gone.clone()), &"boom".to_owned(), Arc::new(()));
        let text = metrics.encode();
        for expected in [
            r#"mcm_controller_reconcile_total{controller="machine",result="success"} 1"#,
            r#"mcm_controller_reconcile_total{controller="machine",result="error"} 1"#,
            r#"mcm_controller_reconcile_errors_total{controller="machine"} 1"#,
            r#"mcm_controller_reconcile_duration_seconds_count{controller="machine"} 2"#,
            // m2 running, m1's requeue due.
            r#"mcm_workqueue_depth{name="machine"} 2"#,
        ] {
            assert!(text.contains(expected), "{expected}\n{text}");
        }
        assert!(
            lines(
                &text,
                r#"mcm_workqueue_longest_running_processor_seconds{name="machine"}"#
            )
            .len()
                == 1,
            "{text}"
        );

        // m2 finishes and waits for a change; m1's reconcile starts (its requeue is consumed) and finishes with a
        // requeue far away; a reconcile dropped unfinished counts nowhere.
        running.finish(Some(&Action::await_change()));
        meter
            .start(&m1)
            .finish(Some(&Action::requeue(Duration::from_mins(10))));
        drop(meter.start(&m2));
        let text = metrics.encode();
        for expected in [
            r#"mcm_controller_reconcile_total{controller="machine",result="success"} 3"#,
            r#"mcm_workqueue_depth{name="machine"} 0"#,
            r#"mcm_workqueue_unfinished_work_seconds{name="machine"} 0.0"#,
        ] {
            assert!(text.contains(expected), "{expected}\n{text}");
        }

        // Without metrics the meter does nothing.
        let idle = Metrics::reconcile_meter(None, "machine", &store);
        idle.start(&m1).finish(None);
    }

    #[tokio::test]
    async fn the_wrapped_reconciler_is_metered() {
        let metrics = Arc::new(Metrics::new());
        let m1 = machine(serde_json::json!({ "metadata": { "name": "m1", "namespace": "ns" } }));
        let store = store_of(vec![m1.clone()]);
        let meter = Metrics::reconcile_meter(Some(&metrics), "machineset", &store);
        let mut reconcile = meter.reconcile(|machine: Arc<Machine>, _: Arc<()>| async move {
            if machine.name_any() == "m1" {
                Ok(Action::await_change())
            } else {
                Err(crate::Error::Kube(kube::Error::LinesCodecMaxLineLengthExceeded))
            }
        });
        assert!(reconcile(Arc::new(m1), Arc::new(())).await.is_ok());
        let other = machine(serde_json::json!({ "metadata": { "name": "m2", "namespace": "ns" } }));
        assert!(reconcile(Arc::new(other), Arc::new(())).await.is_err());
        let text = metrics.encode();
        assert!(
            text.contains(r#"mcm_controller_reconcile_total{controller="machineset",result="success"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"mcm_controller_reconcile_errors_total{controller="machineset"} 1"#),
            "{text}"
        );
    }
}
