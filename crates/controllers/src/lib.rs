//! kube-runtime controllers that observe, call `mcm-core`, and act: the machine controller (creation, health, node
//! sync, class migration, deletion with drain), the class and secret finalizers, the MachineSet and
//! MachineDeployment controllers, and the metrics endpoint. See docs/machine-controller.md.

mod cache;
pub mod deletion;
pub mod drain;
pub mod events;
mod invalid;
pub mod leader;
pub mod logging;
pub mod machine;
pub mod machinedeployment;
pub mod machineset;
pub mod metrics;
pub mod migration;
pub mod orphans;
pub mod overshoot;
mod owners;
pub mod reachability;
pub mod references;
pub mod secrets;
mod throttle;
pub mod watch_health;

/// What can fail while a controller acts: today only requests to an API server (provider errors are outcomes the
/// decisions handle, not errors). One type for every controller, re-exported by each module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to an API server failed.
    #[error("API request failed: {0}")]
    Kube(#[from] kube::Error),
}
