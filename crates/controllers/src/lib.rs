//! kube-runtime controllers that observe, call `mcm-core`, and act: the machine controller (creation, health, node
//! sync, class migration, deletion with drain), the class and secret finalizers, the MachineSet and
//! MachineDeployment controllers, and the metrics endpoint. See docs/machine-controller.md.

/// A crash point (see [`crash`]): with the `failpoints` feature a test can make the controller stop here as if its
/// process died; without it, nothing. `crash_point!(Point, scope)`, `crash_point!(step s, scope)` for the point after
/// deletion step `s`, `crash_point!(call outcome, scope)` for the point after a creation call,
/// `crash_point!(status phase, scope)` for the point after a machine status write; the scope is the name of the
/// object the controller works on.
#[cfg(feature = "failpoints")]
macro_rules! crash_point {
    (status $phase:expr, $scope:expr) => {
        $crate::crash::reached($crate::crash::CrashPoint::after_status_write($phase), $scope)
    };
    (call $outcome:expr, $scope:expr) => {
        if let Some(point) = $crate::crash::CrashPoint::after_creation_call($outcome) {
            $crate::crash::reached(point, $scope);
        }
    };
    (step $step:expr, $scope:expr) => {
        $crate::crash::reached($crate::crash::CrashPoint::after_deletion_step($step), $scope)
    };
    ($point:ident, $scope:expr) => {
        $crate::crash::reached($crate::crash::CrashPoint::$point, $scope)
    };
}
#[cfg(not(feature = "failpoints"))]
macro_rules! crash_point {
    ($($anything:tt)*) => {};
}

mod cache;
#[cfg(feature = "failpoints")]
pub mod crash;
pub mod deletion;
pub mod drain;
pub mod events;
mod ignored;
mod invalid;
pub mod leader;
pub mod logging;
pub mod machine;
pub mod machinedeployment;
pub mod machineset;
pub mod metrics;
pub mod migration;
pub mod node_deletion;
pub mod orphans;
pub mod overshoot;
mod owners;
pub mod reachability;
pub mod references;
pub mod secrets;
pub mod shared_cache;
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
