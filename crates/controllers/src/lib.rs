//! kube-runtime controllers that observe, call `mcm-core`, and act: today the machine controller (creation,
//! health, node sync; a minimal deletion until the deletion flow lands). See docs/machine-controller.md.

pub mod deletion;
pub mod drain;
pub mod events;
pub mod machine;
pub mod machinedeployment;
pub mod machineset;
pub mod metrics;
pub mod migration;
pub mod references;
