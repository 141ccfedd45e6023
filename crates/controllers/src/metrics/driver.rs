//! [`MeteredDriver`]: provider calls counted and timed (`mcm_cloud_api_driver_*`), whatever the driver.

use std::{sync::Arc, time::Instant};

use async_trait::async_trait;
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, DriverMethod, GenerateMachineClassForMigrationRequest,
    GenerateMachineClassForMigrationResponse, GetMachineStatusRequest, GetMachineStatusResponse,
    GetVolumeIdsRequest, GetVolumeIdsResponse, InitializeMachineRequest, InitializeMachineResponse,
    ListMachinesRequest, ListMachinesResponse,
};

use super::{
    Metrics,
    labels::{FailedLabels, OperationLabels},
};

impl Metrics {
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
