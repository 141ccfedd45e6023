//! The Cluster API infrastructure-machine provider (spec 001, contracts v1beta1 and v1beta2) on top of our drivers.
//!
//! - [`types`]: the kinds `MCMMachine` and `MCMMachineTemplate` of `infrastructure.machine.sapcloud.io/v1beta1`.
//! - [`crd`]: their CustomResourceDefinitions and the `ClusterRole` that lets the Cluster API manager use them.

pub mod crd;
pub mod types;

pub use types::{MCMMachine, MCMMachineSpec, MCMMachineStatus, MCMMachineTemplate};
