//! The `machine.sapcloud.io/v1alpha1` API of the machine controller manager.
//!
//! The four kinds (`Machine`, `MachineSet`, `MachineDeployment`, `MachineClass`) keep the JSON field names,
//! optionality and well-known keys of the Gardener machine controller manager, so that manifests written for it work
//! here unchanged. This crate has no I/O: it holds the types, the well-known [`keys`], the predicates every
//! controller shares ([`MetaExt`] and the inherent methods of the kinds), [`validation`] as pure functions returning
//! field paths, and [`crd`] generation from the Rust types.

mod bootstrap_token;
#[cfg(feature = "builders")]
pub mod builders;
pub mod crd;
pub mod crd_shape;
pub mod duration;
pub mod keys;
mod machine;
mod machineclass;
mod machinedeployment;
mod machineset;
mod predicates;
mod resource;
mod shared;
mod status_value;
pub mod validation;

pub use bootstrap_token::bootstrap_tokens_in;
pub use duration::GoDuration;
pub use machine::{
    CurrentStatus, LastOperation, Machine, MachineOperationType, MachinePhase, MachineSpec, MachineState,
    MachineStatus,
};
pub use machineclass::{MachineClass, NodeTemplate};
pub use machinedeployment::{
    InPlaceUpdateMachineDeployment, MachineDeployment, MachineDeploymentCondition,
    MachineDeploymentConditionType, MachineDeploymentSpec, MachineDeploymentStatus,
    MachineDeploymentStrategy, RollbackConfig, RollingUpdateMachineDeployment, StrategyType,
};
pub use machineset::{
    MachineSet, MachineSetCondition, MachineSetConditionType, MachineSetSpec, MachineSetStatus,
};
pub use predicates::MetaExt;
pub use resource::{API_VERSION, GROUP, VERSION};
pub use shared::{
    ClassSpec, ConditionStatus, MachineConfiguration, MachineSummary, MachineTemplateSpec, NodeTemplateSpec,
};
pub use status_value::{UNRECOGNIZED_CAPACITY, Unrecognized};

/// Re-exported so that users of the API types need not pin k8s-openapi themselves.
pub use k8s_openapi;
