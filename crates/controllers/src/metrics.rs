//! Prometheus metrics under the reference's names (namespace `mcm`, reference §8.3) and the HTTP endpoints
//! `/metrics`, `/healthz` and `/readyz` (§8.4) served on `--port`.
//!
//! Machine, MachineSet and MachineDeployment state is read from the controllers' caches at scrape time, so keeping
//! it costs nothing between scrapes; the machine step durations are set by the machine controller as each step
//! completes; provider calls are counted and timed by [`MeteredDriver`], which wraps any [`Driver`]; reconciles are
//! counted, timed and followed by a [`ReconcileMeter`] per controller, which mirrors its work queue; the requests of
//! every kube client are counted by [`RestMetricsLayer`]; the process figures are read from `/proc` at scrape time.
//! Every metric is listed in docs/operations.md.
//!
//! This file holds [`Metrics`] and its scrape; the submodules hold the label sets and families (`labels`), their
//! registration (`register`), the cache-fed gauges (`scrape`), the machine step gauges (`steps`), the reconcile
//! meters (`reconcile`) and the work queue mirror (`queue`), the metered driver (`driver`), the REST client layer
//! (`rest`), the process collector (`process`) and the HTTP endpoints (`server`).

mod driver;
mod labels;
mod process;
mod queue;
mod reconcile;
mod register;
mod rest;
mod scrape;
mod server;
mod steps;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use kube::runtime::reflector::Store;
use mcm_api::{Machine, MachineDeployment, MachineSet};
use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

pub use driver::MeteredDriver;
pub use reconcile::{ReconcileGuard, ReconcileMeter, requeue_after};
pub use rest::{RestMetrics, RestMetricsLayer, url_template};
pub use scrape::{condition_value, phase_value};
pub use server::serve;
pub use steps::{MachineStep, elapsed, placement};

use labels::{
    DeploymentFamilies, FailedLabels, MachineFamilies, OperationLabels, QueueFamilies, ReconcileFamilies,
    ScrapeFailureLabels, SetFamilies, StepFamilies,
};
use reconcile::MeterShared;

/// The metrics of one `mcm run` process.
pub struct Metrics {
    registry: Registry,
    machines: OnceLock<crate::shared_cache::SharedCache<Machine>>,
    machine_sets: OnceLock<Store<MachineSet>>,
    machine_deployments: OnceLock<Store<MachineDeployment>>,
    machine: MachineFamilies,
    sets: SetFamilies,
    deployments: DeploymentFamilies,
    steps: StepFamilies,
    reconciles: ReconcileFamilies,
    queues: QueueFamilies,
    meters: Mutex<Vec<Arc<MeterShared>>>,
    frozen: Gauge,
    driver_duration: Family<OperationLabels, Histogram>,
    driver_failed: Family<FailedLabels, Counter>,
    orphan_vms_found: Counter,
    orphan_vms_deleted: Counter,
    stale_machines: Counter,
    scrape_failures: Family<ScrapeFailureLabels, Counter>,
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

impl Metrics {
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
            && !machines.synced()
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

    /// Counts a machine deleted by its set while Failed after a health check
    /// (`mcm_machine_stale_machines_total`, as the reference counts it).
    pub fn stale_machine_removed(&self) {
        self.stale_machines.inc();
    }

    /// Reads machine state from this cache at scrape time (the machine controller attaches the shared one).
    pub fn attach_machines(&self, machines: &crate::shared_cache::SharedCache<Machine>) {
        let _ = self.machines.set(machines.clone());
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

    /// The text exposition (Prometheus / OpenMetrics text), the cache-fed gauges refreshed first.
    pub fn encode(&self) -> String {
        let _one_scrape = self.scrape.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cache) = self.machines.get() {
            self.refresh_machines(&cache.store().state());
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
        // The process-wide families without the `mcm` prefix: `rest_client_*` and `process_*`.
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, unprefixed());
        for families in self.extra.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            let mut text = String::new();
            if families(&mut text).is_ok() {
                out.push_str(&text);
            } else {
                self.scrape_failures
                    .get_or_create(&ScrapeFailureLabels {
                        binary: labels::PROVIDER_BINARY,
                        kind: labels::EXTRA_FAMILIES_KIND,
                    })
                    .inc();
            }
        }
        let _ = prometheus_client::encoding::text::encode_eof(&mut out);
        out
    }
}

/// Whether a machine deleted by its set counts in `mcm_machine_stale_machines_total`: Failed after a health check
/// (its last operation a `HealthCheck`, i.e. unhealthy for too long), as the reference counts it.
pub fn turned_stale(machine: &Machine) -> bool {
    machine.status.as_ref().is_some_and(|status| {
        machine.phase() == Some(mcm_api::MachinePhase::Failed)
            && status.last_operation.r#type == Some(mcm_api::MachineOperationType::HealthCheck)
    })
}

/// The registry of the process-wide families that carry no `mcm` prefix, as client-go's and the Prometheus client's:
/// the REST client metrics of every API client of the process ([`RestMetrics`]) and the process metrics read from
/// `/proc`. One per process, as client-go's are: every [`Metrics`] serves it.
fn unprefixed() -> &'static Registry {
    static REGISTRY: std::sync::LazyLock<Registry> = std::sync::LazyLock::new(|| {
        let mut registry = Registry::default();
        rest::register(&mut registry, RestMetrics::global());
        registry.register_collector(Box::new(process::ProcessCollector));
        registry
    });
    &REGISTRY
}
