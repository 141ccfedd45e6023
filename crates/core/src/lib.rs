//! Pure decisions of the machine controller manager: no client, no clock (time is a parameter), no I/O.
//!
//! Controllers observe (read caches), call a function here that returns a plan (a value: status to write, provider
//! call to make, patch to apply, when to look again), and act on it. Everything here is deterministic: the current
//! time, random numbers and the state of other objects are parameters.
//!
//! The modules, one line each, are listed below; `docs/machine-controller-decisions.md` explains the machine
//! controller's decisions in prose.

// The cluster-autoscaler's side of a deployment: the trigger-deletion handshake and the node marks of a rollout.
pub mod autoscaler;
// The next step of the creation flow, CrashLoopBackOff and its deadline, the stale-node guard.
pub mod creation;
// The deletion flow as persisted steps, lifecycle hooks, the controller's own machine.
pub mod deletion;
// Every lastOperation description, written and parsed in one place.
pub mod descriptions;
// Event correlation as client-go does it: aggregation of similar Events, count bumps of repeats, the spam filter.
pub mod event_correlation;
// Force rules, eviction retries, pod selection and order, PodDisruptionBudgets, volume waits.
pub mod drain;
// When MachineClasses and Secrets get or lose their finalizers.
pub mod finalizers;
// Health of a node and the phase transitions it drives.
pub mod health;
// Settings the reference acts on and this project only stores, named for a one-time warning.
pub mod ignored;
// What a node is updated to in place, handed to its node agent on the Node (the target annotation).
pub mod in_place_target;
// The machine side of an in-place update: the node's InPlaceUpdate condition, the drain, what node agents do.
pub mod in_place_update;
// Leader election on a Lease: acquire, renew, release, decided purely.
pub mod leader;
// The MachineSet controller's ownership, expectations, replicas, deletion order and status.
pub mod machineset;
// Moving machines from a class of another kind to a `MachineClass` (spec 000).
pub mod migration;
// Deleting a Node deletes its Machine; a deleting node no machine names loses our finalizer.
pub mod node_deletion;
// What a kubelet reports (conditions, Lease, status timing), shared by the sim kubelet and `mcm node-agent`.
pub mod node_report;
// The node template (labels, annotations, taints, virtual capacity) as minimal node patches.
pub mod nodesync;
// Machine preservation: the preserve value that applies, the expiry, the node's annotations, taint and condition.
pub mod preservation;
// Semantic equality of Kubernetes quantities (`1Gi` = `1024Mi`).
mod quantity;
// The API server reachability freeze: an unreachable control or target API server freezes the machine controller.
pub mod reachability;
// Removing secret values from texts that reach users (descriptions, Events, logs).
pub mod redact;
// The remediation guard: which unhealthy machines of a group may be marked Failed (and so replaced) now.
pub mod remediation;
// What to do after a provider call failed, by method and machine code.
pub mod retry_policy;
// The MachineDeployment arithmetic (template hash, maxSurge/maxUnavailable, rolling update, scaling, progress, in-place).
pub mod rollout;
// Orphan VM collection and unmanaged nodes (the machine controller's safety loop).
pub mod safety_orphans;
// The safety controller's overshoot freeze of sets and deployments with too many machines.
pub mod safety_overshoot;
// The planned status change shared by the decisions.
pub mod status;
// The controller settings (flag defaults) and the effective per-machine values.
pub mod timeouts;
// userData placeholders and the bootstrap token.
pub mod userdata;
// Whether a MachineSet or MachineDeployment may be acted on, and how an invalid one reports itself.
pub mod validity;

pub use descriptions::{Description, Redactor};
pub use retry_policy::{RetryDecision, RetrySettings};
pub use status::StatusUpdate;
pub use timeouts::{ControllerSettings, EffectiveSettings, effective_settings};
