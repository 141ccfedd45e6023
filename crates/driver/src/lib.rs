//! The provider contract (spec 000): what a provider ("driver") offers the machine controller.
//!
//! [`Driver`] has one async method per call of the spec; the optional ones answer [`MachineCode::Unimplemented`]
//! unless a provider implements them. Every failure is a [`DriverError`] carrying a [`MachineCode`] (0..=17, the gRPC
//! codes plus `Uninitialized`) and a message; it is never parsed back from a string. [`retry`] holds the spec's
//! per-method tables of codes, recovery behaviour and "Auto Retry Required" as data.
//!
//! This crate has no tokio and no gRPC, so that the pure decisions of `mcm-core` can use its types.

mod code;
mod driver;
mod error;
pub mod retry;
mod types;

pub use code::MachineCode;
pub use driver::Driver;
pub use error::DriverError;
pub use retry::{CodeRule, DriverMethod};
pub use types::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse,
    GenerateMachineClassForMigrationRequest, GenerateMachineClassForMigrationResponse,
    GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest, GetVolumeIdsResponse,
    InitializeMachineRequest, InitializeMachineResponse, ListMachinesRequest, ListMachinesResponse,
};
