//! Prometheus metrics under the reference's names (namespace `mcm`, reference §8.3) and the HTTP endpoints
//! `/metrics` and `/healthz` (§8.4) served on `--port`.
//!
//! Machine state is read from the machine controller's cache at scrape time, so keeping it costs nothing between
//! scrapes; provider calls are counted and timed by [`MeteredDriver`], which wraps any [`Driver`].

use std::{
    net::SocketAddr,
    sync::{Arc, OnceLock},
    time::Instant,
};

use async_trait::async_trait;
use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use kube::{ResourceExt, runtime::reflector::Store};
use mcm_api::{Machine, MachinePhase};
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MachineLabels {
    name: String,
    namespace: String,
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

/// The metrics of one `mcm run` process.
pub struct Metrics {
    registry: Registry,
    machines: OnceLock<Store<Machine>>,
    machine_items: Gauge,
    machine_phase: Family<MachineLabels, Gauge>,
    frozen: Gauge,
    driver_duration: Family<OperationLabels, Histogram>,
    driver_failed: Family<FailedLabels, Counter>,
    orphan_vms_found: Counter,
    orphan_vms_deleted: Counter,
    readiness: std::sync::Mutex<Vec<(String, ReadinessCheck)>>,
}

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

impl Metrics {
    /// The registry with every metric registered, machine gauges empty until a machine cache is attached.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("mcm");
        let machine_items = Gauge::default();
        let machine_phase = Family::<MachineLabels, Gauge>::default();
        let frozen = Gauge::default();
        let driver_duration = Family::<OperationLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.005, 2.0, 14,
            ))
        });
        let driver_failed = Family::<FailedLabels, Counter>::default();
        let orphan_vms_found = Counter::default();
        let orphan_vms_deleted = Counter::default();
        registry.register(
            "machine_items_total",
            "Count of machines currently managed by the machine controller",
            machine_items.clone(),
        );
        registry.register(
            "machine_current_status_phase",
            "Current phase of a machine: Terminating -4, Failed -3, CrashLoopBackOff -2, Unknown -1, Pending 0, \
             Running 1",
            machine_phase.clone(),
        );
        registry.register(
            "machine_controller_frozen",
            "1 while the machine controller is frozen (API server unreachable), else 0",
            frozen.clone(),
        );
        registry.register(
            "cloud_api_driver_request_duration_seconds",
            "Duration of provider (driver) calls",
            driver_duration.clone(),
        );
        registry.register(
            "cloud_api_driver_requests_failed",
            "Provider (driver) calls that failed, by machine code",
            driver_failed.clone(),
        );
        registry.register(
            "machine_orphan_vms_found",
            "VMs without a machine (or extra VMs of a machine) found by the orphan VM collection, each counted once",
            orphan_vms_found.clone(),
        );
        registry.register(
            "machine_orphan_vms_deleted",
            "Orphan VMs deleted by the orphan VM collection",
            orphan_vms_deleted.clone(),
        );
        Self {
            registry,
            machines: OnceLock::new(),
            machine_items,
            machine_phase,
            frozen,
            driver_duration,
            driver_failed,
            orphan_vms_found,
            orphan_vms_deleted,
            readiness: std::sync::Mutex::default(),
        }
    }

    /// Adds a check to `/readyz`: the process is ready when every check passes. `name` appears in the answer.
    pub fn add_readiness_check(
        &self,
        name: &str,
        check: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) {
        self.readiness
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        let checks = self
            .readiness
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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

    /// Sets `mcm_machine_controller_frozen`.
    pub fn set_frozen(&self, frozen: bool) {
        self.frozen.set(i64::from(frozen));
    }

    /// The text exposition (Prometheus / OpenMetrics text), machine gauges refreshed from the cache first.
    pub fn encode(&self) -> String {
        if let Some(store) = self.machines.get() {
            let machines = store.state();
            self.machine_items
                .set(i64::try_from(machines.len()).unwrap_or(i64::MAX));
            self.machine_phase.clear();
            for machine in &machines {
                self.machine_phase
                    .get_or_create(&MachineLabels {
                        name: machine.name_any(),
                        namespace: machine.namespace().unwrap_or_default(),
                    })
                    .set(phase_value(machine.phase()));
            }
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
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
}
