//! [`Metrics::new`]: every metric registered under its reference name and help text, in the order of the docs'
//! table. Separate because the registration alone is long and changes only when a metric is added.

use std::sync::{Mutex, OnceLock};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::{
    Metrics,
    labels::{
        DeploymentFamilies, FailedLabels, MachineFamilies, ObjectLabels, OperationLabels, QueueFamilies,
        ReconcileFamilies, SCRAPE_FAILURE_KINDS, ScrapeFailureLabels, SetFamilies, StepFamilies,
    },
};

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
        let queues = QueueFamilies::default();
        let stale_machines = Counter::default();
        let scrape_failures = Family::<ScrapeFailureLabels, Counter>::default();
        for (binary, kind) in SCRAPE_FAILURE_KINDS {
            let _ = scrape_failures.get_or_create(&ScrapeFailureLabels { binary, kind });
        }
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
        Self::register_queues(r, &queues);
        r.register(
            "machine_stale_machines",
            "Total count of stale machines flagged for termination that turned stale due to long unhealthiness: \
             machines deleted by their set while Failed after a health check",
            stale_machines.clone(),
        );
        r.register(
            "misc_scrape_failure",
            "Total count of scrape failures",
            scrape_failures.clone(),
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
            queues,
            meters: Mutex::default(),
            frozen,
            driver_duration,
            driver_failed,
            orphan_vms_found,
            orphan_vms_deleted,
            stale_machines,
            scrape_failures,
            readiness: Mutex::default(),
            extra: Mutex::default(),
            scrape: Mutex::default(),
        }
    }

    /// client-go's workqueue families under the reference's names (`mcm_workqueue_*{name}`).
    fn register_queues(r: &mut Registry, q: &QueueFamilies) {
        r.register(
            "workqueue_depth",
            "Current depth of workqueue: objects of a controller waiting for a reconcile (due now, or held while \
             their reconcile runs)",
            q.depth.clone(),
        );
        r.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            q.adds.clone(),
        );
        r.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            q.queue_duration.clone(),
        );
        r.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            q.work_duration.clone(),
        );
        r.register(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has done that is in progress and hasn't been observed by work_duration",
            q.unfinished.clone(),
        );
        r.register(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            q.longest_running.clone(),
        );
        r.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            q.retries.clone(),
        );
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
}
