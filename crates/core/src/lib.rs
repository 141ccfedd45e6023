//! Pure decisions of the machine controller manager: no client, no clock (time is a parameter), no I/O.
//!
//! Controllers observe (read caches), call a function here that returns a plan (a value: status to write, provider
//! call to make, patch to apply, when to look again), and act on it. Everything here is deterministic: the current
//! time, random numbers and the state of other objects are parameters.
//!
//! The machine controller's decisions (see `docs/machine-controller-decisions.md`):
//! - [`retry_policy`]: what to do after a provider call failed, by method and machine code;
//! - [`timeouts`]: the controller settings (flag defaults) and the effective per-machine values;
//! - [`creation`]: the next step of the creation flow, CrashLoopBackOff and its deadline, the stale-node guard;
//! - [`deletion`]: the deletion flow as persisted steps, lifecycle hooks, the controller's own machine;
//! - [`drain`]: force rules, eviction retries, pod selection and order, PodDisruptionBudgets, volume waits;
//! - [`health`]: health of a node and the phase transitions it drives;
//! - [`remediation`]: how many unhealthy machines of a group may be replaced at once;
//! - [`nodesync`]: the node template (labels, annotations, taints, virtual capacity) as minimal node patches;
//! - [`userdata`]: userData placeholders and the bootstrap token;
//! - [`descriptions`]: every lastOperation description, written and parsed in one place;
//! - [`finalizers`]: when MachineClasses and Secrets get or lose their finalizers;
//! - [`migration`]: moving machines from a class of another kind to a `MachineClass` (spec 000);
//! - [`machineset`]: the MachineSet controller's ownership, expectations, replicas, deletion order and status;
//! - [`rollout`]: the MachineDeployment arithmetic (template hash, maxSurge/maxUnavailable, rolling update, scaling);
//! - [`status`]: the planned status change shared by the decisions;
//! - [`validity`]: whether a MachineSet or MachineDeployment may be acted on, and how an invalid one reports itself.

pub mod autoscaler;
pub mod creation;
pub mod deletion;
pub mod descriptions;
pub mod drain;
pub mod finalizers;
pub mod health;
pub mod leader;
pub mod machineset;
pub mod migration;
pub mod nodesync;
mod quantity;
pub mod reachability;
pub mod redact;
pub mod remediation;
pub mod retry_policy;
pub mod rollout;
pub mod safety_orphans;
pub mod safety_overshoot;
pub mod status;
pub mod timeouts;
pub mod userdata;
pub mod validity;

pub use descriptions::{Description, Redactor};
pub use retry_policy::{RetryDecision, RetrySettings};
pub use status::StatusUpdate;
pub use timeouts::{ControllerSettings, EffectiveSettings, effective_settings};
