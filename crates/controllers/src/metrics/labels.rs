//! The label sets and metric families of the controllers' metrics, under the reference's label names. Separate so
//! that registration, the scrape-time refresh and the meters share one definition of each.

use std::sync::atomic::AtomicU64;

use kube::Resource;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
};

/// `{name, namespace}` of one object.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ObjectLabels {
    pub(super) name: String,
    pub(super) namespace: String,
}

impl ObjectLabels {
    pub(super) fn of(object: &impl Resource) -> Self {
        Self {
            name: object.meta().name.clone().unwrap_or_default(),
            namespace: object.meta().namespace.clone().unwrap_or_default(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OperationLabels {
    pub(super) provider: String,
    pub(super) operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FailedLabels {
    pub(super) provider: String,
    pub(super) operation: String,
    pub(super) error_code: String,
}

/// The labels of `mcm_machine_info` (the reference's, `createdAt` included).
#[allow(non_snake_case)] // label names are the reference's
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct MachineInfoLabels {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) createdAt: String,
    pub(super) spec_provider_id: String,
    pub(super) spec_class_api_group: String,
    pub(super) spec_class_kind: String,
    pub(super) spec_class_name: String,
    pub(super) node_name: String,
}

/// `{name, namespace, condition}` of the status condition gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ConditionLabels {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) condition: String,
}

/// The labels of `mcm_machine_set_info`.
#[allow(non_snake_case)] // label names are the reference's
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SetInfoLabels {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) createdAt: String,
    pub(super) spec_machine_class_api_group: String,
    pub(super) spec_machine_class_kind: String,
    pub(super) spec_machine_class_name: String,
}

/// The labels of `mcm_machine_deployment_info`.
#[allow(non_snake_case)] // label names are the reference's
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DeploymentInfoLabels {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) createdAt: String,
    pub(super) spec_strategy_type: String,
}

/// One failed machine of a set's or deployment's `status.failedMachines` (the reference's labels; value 1).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FailedMachineLabels {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) failed_machine_name: String,
    pub(super) failed_machine_provider_id: String,
    pub(super) failed_machine_last_operation_state: String,
    pub(super) failed_machine_last_operation_machine_operation_type: String,
    pub(super) failed_machine_owner_ref: String,
}

/// `{namespace, machine_deployment, instance_type, zone}` of the machine step gauges and the failed-join counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StepLabels {
    pub(super) namespace: String,
    pub(super) machine_deployment: String,
    pub(super) instance_type: String,
    pub(super) zone: String,
}

/// `{namespace, machine_deployment}` of `mcm_machine_drain_duration_seconds` (the reference's drain gauge has no
/// placement labels).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DrainLabels {
    pub(super) namespace: String,
    pub(super) machine_deployment: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ControllerLabels {
    pub(super) controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReconcileLabels {
    pub(super) controller: String,
    pub(super) result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct QueueLabels {
    pub(super) name: String,
}

pub(super) type FloatGauge = Gauge<f64, AtomicU64>;

/// The per-object gauges read from the machine cache at scrape time.
#[derive(Default)]
pub(super) struct MachineFamilies {
    pub(super) items: Gauge,
    pub(super) phase: Family<ObjectLabels, Gauge>,
    pub(super) info: Family<MachineInfoLabels, Gauge>,
    pub(super) condition: Family<ConditionLabels, Gauge>,
}

/// The MachineSet gauges read from the set controller's cache at scrape time.
#[derive(Default)]
pub(super) struct SetFamilies {
    pub(super) items: Gauge,
    pub(super) info: Family<SetInfoLabels, Gauge>,
    pub(super) spec_replicas: Family<ObjectLabels, Gauge>,
    pub(super) spec_min_ready_seconds: Family<ObjectLabels, Gauge>,
    pub(super) condition: Family<ConditionLabels, Gauge>,
    pub(super) failed_machines: Family<FailedMachineLabels, Gauge>,
    pub(super) available: Family<ObjectLabels, Gauge>,
    pub(super) fully_labelled: Family<ObjectLabels, Gauge>,
    pub(super) ready: Family<ObjectLabels, Gauge>,
    pub(super) replicas: Family<ObjectLabels, Gauge>,
}

/// The MachineDeployment gauges read from the deployment controller's cache at scrape time.
#[derive(Default)]
pub(super) struct DeploymentFamilies {
    pub(super) items: Gauge,
    pub(super) info: Family<DeploymentInfoLabels, Gauge>,
    pub(super) spec_paused: Family<ObjectLabels, Gauge>,
    pub(super) spec_replicas: Family<ObjectLabels, Gauge>,
    pub(super) spec_min_ready_seconds: Family<ObjectLabels, Gauge>,
    pub(super) spec_max_surge: Family<ObjectLabels, Gauge>,
    pub(super) spec_max_unavailable: Family<ObjectLabels, Gauge>,
    pub(super) spec_revision_history_limit: Family<ObjectLabels, Gauge>,
    pub(super) spec_progress_deadline_seconds: Family<ObjectLabels, Gauge>,
    pub(super) spec_rollback_to_revision: Family<ObjectLabels, Gauge>,
    pub(super) condition: Family<ConditionLabels, Gauge>,
    pub(super) available: Family<ObjectLabels, Gauge>,
    pub(super) unavailable: Family<ObjectLabels, Gauge>,
    pub(super) ready: Family<ObjectLabels, Gauge>,
    pub(super) updated: Family<ObjectLabels, Gauge>,
    pub(super) replicas: Family<ObjectLabels, Gauge>,
    pub(super) collision_count: Family<ObjectLabels, Gauge>,
    pub(super) failed_machines: Family<FailedMachineLabels, Gauge>,
}

/// The machine step gauges, set by the machine controller as each step completes.
#[derive(Default)]
pub(super) struct StepFamilies {
    pub(super) create: Family<StepLabels, FloatGauge>,
    pub(super) initialize: Family<StepLabels, FloatGauge>,
    pub(super) join: Family<StepLabels, FloatGauge>,
    pub(super) delete: Family<StepLabels, FloatGauge>,
    pub(super) drain: Family<DrainLabels, FloatGauge>,
    pub(super) failed_join: Family<StepLabels, Gauge>,
}

/// The per-controller reconcile metrics ([`ReconcileMeter`]).
#[derive(Clone)]
pub(super) struct ReconcileFamilies {
    pub(super) total: Family<ReconcileLabels, Counter>,
    pub(super) errors: Family<ControllerLabels, Counter>,
    pub(super) duration: Family<ControllerLabels, Histogram>,
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
        }
    }
}

/// The work queue families of client-go's workqueue metrics, by queue `name` ([`ReconcileMeter`]).
pub(super) struct QueueFamilies {
    pub(super) depth: Family<QueueLabels, Gauge>,
    pub(super) adds: Family<QueueLabels, Counter>,
    pub(super) queue_duration: Family<QueueLabels, Histogram>,
    pub(super) work_duration: Family<QueueLabels, Histogram>,
    pub(super) unfinished: Family<QueueLabels, FloatGauge>,
    pub(super) longest_running: Family<QueueLabels, FloatGauge>,
    pub(super) retries: Family<QueueLabels, Counter>,
}

impl Default for QueueFamilies {
    fn default() -> Self {
        let histogram = || Histogram::new(super::queue::duration_buckets());
        Self {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(histogram),
            work_duration: Family::new_with_constructor(histogram),
            unfinished: Family::default(),
            longest_running: Family::default(),
            retries: Family::default(),
        }
    }
}

/// The `binary` of the scrape failures of the set and deployment metrics (the reference's
/// machine-controller-manager).
pub(super) const MANAGER_BINARY: &str = "machine-controller-manager";
/// The `binary` of the scrape failures of the machine metrics (the reference's provider process).
pub(super) const PROVIDER_BINARY: &str = "machine-controller-manager-provider";
/// The reference's `kind`s, each with its `binary`: shown at 0 from the start.
pub(super) const SCRAPE_FAILURE_KINDS: [(&str, &str); 3] = [
    (MANAGER_BINARY, "Machinedeployment-count"),
    (MANAGER_BINARY, "Machineset-count"),
    (PROVIDER_BINARY, "Machine-count"),
];
/// Ours: the families of an in-process provider could not be encoded (they are left out of that scrape).
pub(super) const EXTRA_FAMILIES_KIND: &str = "provider-families";

/// `{binary, kind}` of `mcm_misc_scrape_failure_total`: the reference's const label `binary` (the process whose
/// scrape failed: `machine-controller-manager` for sets and deployments, `machine-controller-manager-provider` for
/// machines) and `kind`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ScrapeFailureLabels {
    pub(super) binary: &'static str,
    pub(super) kind: &'static str,
}
