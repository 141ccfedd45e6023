//! The MachineDeployment arithmetic (reference §6; spec 002 §10 and the FAQ "How to better control the rollout
//! process of the worker nodes?" and "How MCM responds when scale-out/scale-in is done during rolling update of a
//! machinedeployment?"): the template hash and the new set's name, maxSurge and maxUnavailable, the rolling-update
//! step, Recreate and OnDelete, proportional scaling during a rollout, revisions, rollback and history cleanup, and the
//! availability and progress checks, and the InPlaceUpdate rollout ([`in_place`]).
//!
//! The controller observes the deployment and its MachineSets ([`SetView::of`]), calls [`step`], and applies the
//! [`RolloutPlan`]: create the new set, or scale sets (each scale writes `spec.replicas` and the
//! [`replicas_annotations`]), or label old sets. It calls [`step`] again after the sets' statuses change. Pure: no
//! client, no clock.

mod fenceposts;
mod hash;
mod history;
pub mod in_place;
mod new_set;
mod progress;
mod sets;
mod step;
#[cfg(test)]
mod tests;

pub use fenceposts::{
    DEFAULT_FENCEPOST, FencepostError, Fenceposts, fenceposts, in_place_surge, resolve_fenceposts,
    scaled_value,
};
pub use hash::{equal_ignore_hash, machine_set_name, safe_encode, template_hash, template_with_hash};
pub use history::{
    StatusCounts, has_minimum_availability, history_to_clean_up, next_revision, progress_deadline, revision,
    rollback_revision, rollback_target, status_counts,
};
pub use new_set::{NOT_COPIED_ANNOTATIONS, copied_annotations, new_set_sync};
pub use progress::{ProgressCondition, ProgressInput, made_progress, progressing, reasons};
pub use sets::{SetView, replicas_annotations};
pub use step::{
    RolloutInput, RolloutPhase, RolloutPlan, Scale, is_complete, is_scaling_event, new_set_replicas, scale,
    scale_down_old, step,
};
