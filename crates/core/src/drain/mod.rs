//! The pure parts of a node drain (reference §4, `pkg/util/provider/drain`): whether a drain is forced and why, how
//! many eviction attempts it makes, which pods it evicts and in which order, which PodDisruptionBudgets guard a pod,
//! which volumes to wait for after a pod is evicted, and the messages that describe how a drain went.
//!
//! The controller lists what a drain needs from its caches (pods bound to the node, PodDisruptionBudgets,
//! PersistentVolumeClaims, VolumeAttachments, the node), calls these functions, and evicts: pods in
//! [`DrainPlan::parallel`] at once, pods in [`DrainPlan::serial`] one at a time, each followed by the wait for its
//! volumes ([`pvs_to_track`], [`volumes_detached`], [`volume_reattached`]). A force drain ([`DrainMode::force`])
//! deletes [`DrainPlan::force_deletions`] with grace period 0 and waits for nothing. The outcome is reported as a
//! [`DrainOutcome`], whose text goes into the machine's `lastOperation` through [`crate::deletion`].
//!
//! Rules quoted from the reference, and where this module differs, are on each function; the summary is in
//! `docs/machine-deletion-decisions.md`.

mod common;
mod disruption_budgets;
mod force;
mod outcome;
mod pod_selection;
#[cfg(test)]
mod tests;
mod volumes;

use std::time::Duration;

pub use disruption_budgets::{Blocker, blocker, misconfigured_pdb, pdbs_for_pod, selector_matches};
pub use force::{
    DrainMode, ForceReason, drain_mode, force_at, force_reason, max_evict_retries, node_force_deadlines,
    parse_bool,
};
pub use outcome::DrainOutcome;
pub use pod_selection::{
    DrainPlan, PodRef, SkipReason, WaitReason, claims, detach_timeout, grace_period, is_daemonset_pod,
    is_finished, is_mirror_pod, plan, pod_gone, pod_gone_timeout, wait_done,
};
pub use volumes::{
    is_attached_volume, live_volume_attachments, no_volumes_attached, pvs_to_track, volume_reattached,
    volumes_detached,
};

/// A force drain gives up after this long (reference: `timeOutDuration = 1 * time.Minute` under force).
pub const FORCE_TIMEOUT: Duration = Duration::from_mins(1);
/// A force drain tries each eviction once (reference: `maxEvictRetries = 1` under force).
pub const FORCE_MAX_EVICT_RETRIES: u32 = 1;
/// Extra time to wait for an evicted pod to go, on top of its grace period (reference: `+ 30s`).
pub const POD_GONE_SLACK: Duration = Duration::from_secs(30);
/// Annotation of mirror pods (static pods shown by the kubelet); they are never evicted.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Value of [`extensions::DRAIN_LABEL`](mcm_api::keys::extensions::DRAIN_LABEL) that leaves a pod alone.
pub const DRAIN_SKIP: &str = "skip";
/// Value of [`extensions::DRAIN_LABEL`](mcm_api::keys::extensions::DRAIN_LABEL) that waits for a pod to finish instead of evicting it.
pub const DRAIN_WAIT_COMPLETED: &str = "wait-completed";
/// Default grace period of a pod without `terminationGracePeriodSeconds` (Kubernetes' default).
const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);
const READY: &str = "Ready";
const READONLY_FILESYSTEM: &str = "ReadonlyFilesystem";
