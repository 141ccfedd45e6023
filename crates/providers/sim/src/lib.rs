//! The simulated provider: a [`mcm_driver::Driver`] whose VMs live in memory, a simulated kubelet that registers
//! and heartbeats their nodes, and latency and fault injection. The provider of the integration tests and of the
//! benchmark. See docs/provider-sim.md.
//!
//! - [`SimDriver`] implements every call of spec 000 (and InitializeMachine of spec 002 section 11) on in-memory
//!   VMs: provider IDs are `sim:///<namespace>/<machine-name>`, node names are machine names, the providerSpec is
//!   validated with the example schema of spec 000 ([`provider_spec`], [`sizes`]), and a class's tags tell which
//!   VMs belong to its cluster.
//! - [`Faults`] (from [`SimDriver::faults`]) injects call faults, VM faults and kubelet faults, sets latencies and
//!   counts calls.
//! - [`Kubelet::start`] runs the simulated kubelet of a driver against a cluster.
//! - [`EchoRequests`] wraps a driver so that its first call per method and machine fails quoting the whole request
//!   (`mcm provider sim serve --echo-requests`): the test of the controllers' redaction.

mod driver;
mod echo;
mod faults;
mod kubelet;
pub mod provider_spec;
pub mod sizes;

pub use driver::{CALL_LOG_LENGTH, CSI_DRIVER, PROVIDER_ID_PREFIX, SimConfig, SimDriver, UserData, Vm};
pub use echo::EchoRequests;
pub use faults::{Fault, FaultId, Faults, Latency, Target};
pub use kubelet::{
    AGENT_TERMINATES_PODS, HOSTNAME_LABEL, INSTANCE_TYPE_LABEL, Kubelet, KubeletConfig, KubeletHandle,
    KubeletStats, MAX_PODS, NODE_LEASE_NAMESPACE,
};
