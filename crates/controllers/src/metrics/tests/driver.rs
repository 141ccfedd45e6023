//! Provider calls counted and timed by the metered driver.

use std::sync::Arc;

use async_trait::async_trait;
use mcm_api::Machine;
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError,
};

use crate::metrics::{MeteredDriver, Metrics};

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
