//! The `Driver` trait: one async method per provider call.

use async_trait::async_trait;

use crate::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, DriverError,
    DriverMethod, GenerateMachineClassForMigrationRequest, GenerateMachineClassForMigrationResponse,
    GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest, GetVolumeIdsResponse,
    InitializeMachineRequest, InitializeMachineResponse, ListMachinesRequest, ListMachinesResponse,
};

/// A provider of machines (spec 000). `create_machine` and `delete_machine` are REQUIRED; the others are optional
/// and answer `Unimplemented` unless implemented. Every call is idempotent as the spec asks, so the controller may
/// repeat any call after a crash.
#[async_trait]
pub trait Driver: Send + Sync {
    /// Creates the VM of a machine, or adopts an existing compatible one (answering OK); an existing VM that does
    /// not match answers `AlreadyExists`.
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError>;

    /// Initializes a VM after creation; `Uninitialized` asks for another attempt. Optional.
    async fn initialize_machine(
        &self,
        request: &InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        let _ = request;
        Err(DriverError::unimplemented(DriverMethod::InitializeMachine))
    }

    /// Deletes the VM of a machine; a VM that does not exist answers OK.
    async fn delete_machine(
        &self,
        request: &DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError>;

    /// Tells whether the VM of a machine exists (`NotFound` when not; `OutOfRange` for several). Optional.
    async fn get_machine_status(
        &self,
        request: &GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        let _ = request;
        Err(DriverError::unimplemented(DriverMethod::GetMachineStatus))
    }

    /// Lists the VMs of a class's cluster, provider ID to machine name (used for orphan collection). Optional.
    async fn list_machines(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        let _ = request;
        Err(DriverError::unimplemented(DriverMethod::ListMachines))
    }

    /// Returns the volume IDs of the persistent volumes the provider owns (for volume-aware drains). Optional.
    async fn get_volume_ids(
        &self,
        request: &GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        let _ = request;
        Err(DriverError::unimplemented(DriverMethod::GetVolumeIds))
    }

    /// Fills a `MachineClass` from a provider-specific class (class migration). Optional.
    async fn generate_machine_class_for_migration(
        &self,
        request: &GenerateMachineClassForMigrationRequest,
    ) -> Result<GenerateMachineClassForMigrationResponse, DriverError> {
        let _ = request;
        Err(DriverError::unimplemented(
            DriverMethod::GenerateMachineClassForMigration,
        ))
    }
}
