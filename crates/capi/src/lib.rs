//! The Cluster API infrastructure-machine provider (spec 001, contracts v1beta1 and v1beta2) on top of our drivers.
//!
//! - [`types`]: the kinds `MCMMachine` and `MCMMachineTemplate` of `infrastructure.machine.sapcloud.io/v1beta1`.
//! - [`crd`]: their CustomResourceDefinitions and the `ClusterRole` that lets the Cluster API manager use them.
//! - [`decide`]: the reconcile order of spec 001 as pure decisions (they take `now`).
//! - [`controller`]: the controller that watches the kinds, the Cluster API `Machine`s and `Cluster`s, and calls a
//!   [`mcm_driver::Driver`].

pub mod controller;
pub mod crd;
pub mod decide;
pub mod types;

pub use controller::{Config, run};
pub use types::{MCMMachine, MCMMachineSpec, MCMMachineStatus, MCMMachineTemplate};
