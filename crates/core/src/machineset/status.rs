//! The set's status after a pass: replica counts, failed machines, the ReplicaFailure condition, when to look again.
//!
//! Separate because it runs after acting, on what happened.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mcm_api::{
    ConditionStatus, Machine, MachinePhase, MachineSet, MachineSetCondition, MachineSetConditionType,
    MachineSetStatus, MachineState, MachineSummary, MetaExt,
};
use serde_json::{Map, Value, json};

use super::common::{labels_of, name_of, until};
use crate::timeouts;

/// Why creating or deleting machines failed (the `ReplicaFailure` condition's reasons).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplicaFailureReason {
    /// A machine could not be created.
    FailedCreate,
    /// A machine could not be deleted.
    FailedDelete,
}

impl ReplicaFailureReason {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailedCreate => "FailedCreate",
            Self::FailedDelete => "FailedDelete",
        }
    }
}

/// Whether `availableReplicas` waits `minReadySeconds` after a machine is Running.
///
/// The reference ignores the field (`isMachineAvailable` looks at the phase only), and Gardener sets it to 500 on
/// every deployment because of that; honouring it is the opt-in `--honour-min-ready-seconds`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MinReadySeconds {
    /// Available as soon as Running (the reference's behaviour, the default).
    #[default]
    Ignore,
    /// Available once Running for `minReadySeconds` (Kubernetes Deployments' meaning).
    Honour,
}

/// A failure of the pass's creations or deletions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaFailure {
    /// Create or delete.
    pub reason: ReplicaFailureReason,
    /// The error, for the condition's message.
    pub message: String,
}

/// What came of the pass's creations and deletions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManageResult {
    /// Nothing was tried (held by expectations, invalid, being deleted): the `ReplicaFailure` condition stays as it
    /// is.
    NotRun,
    /// Everything tried succeeded: the `ReplicaFailure` condition is removed.
    Succeeded,
    /// Something failed: the `ReplicaFailure` condition is set.
    Failed(ReplicaFailure),
}

/// The set's new status. Write it (for example as [`SetStatusUpdate::merge_patch`] on the `status` subresource)
/// only when [`SetStatusUpdate::changes`] says so.
#[derive(Clone, Debug, Default, PartialEq)]
#[must_use]
pub struct SetStatusUpdate {
    /// The whole new status: the fields the set controller owns computed, the others (`lastOperation`, conditions
    /// of other types) carried over.
    pub status: MachineSetStatus,
}

/// The status fields the set controller writes (JSON names).
const OWNED_STATUS_FIELDS: [&str; 9] = [
    "replicas",
    "autoPreserveFailedMachineCount",
    "fullyLabeledReplicas",
    "readyReplicas",
    "availableReplicas",
    "preservedFailedReplicas",
    "observedGeneration",
    "machineSetCondition",
    "failedMachines",
];

impl SetStatusUpdate {
    /// Whether writing the update changes the status.
    pub fn changes(&self, current: Option<&MachineSetStatus>) -> bool {
        let empty = MachineSetStatus::default();
        self.status != *current.unwrap_or(&empty)
    }

    /// Applies the update (what the API server does with [`SetStatusUpdate::merge_patch`]).
    pub fn apply(&self, status: &mut MachineSetStatus) {
        let kept_operation = std::mem::take(&mut status.last_operation);
        *status = self.status.clone();
        status.last_operation = kept_operation;
    }

    /// The JSON merge patch for the set's `status` subresource: `{"status": {...}}` with every field the set
    /// controller owns, `null` for those that are now empty or zero (so the patch clears them), and nothing else.
    pub fn merge_patch(&self) -> Value {
        let serialized = match serde_json::to_value(&self.status) {
            Ok(Value::Object(map)) => map,
            _ => Map::new(),
        };
        let status: Map<String, Value> = OWNED_STATUS_FIELDS
            .iter()
            .map(|field| {
                (
                    (*field).to_owned(),
                    serialized.get(*field).cloned().unwrap_or(Value::Null),
                )
            })
            .collect();
        json!({ "status": status })
    }
}

/// The status and when to compute it again.
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub struct StatusPlan {
    /// The new status.
    pub update: SetStatusUpdate,
    /// When a Running machine reaches `minReadySeconds` and so becomes available: compute the status again then.
    pub recheck_after: Option<Duration>,
}

/// Whether a machine counts as ready: Running and not being deleted (reference: readyReplicas = Running).
fn is_ready(machine: &Machine) -> bool {
    !machine.is_deleting() && machine.phase() == Some(MachinePhase::Running)
}

/// When a machine becomes (or became) available: Running (or Available, the phase without a target cluster) and not
/// being deleted, from its phase's `lastUpdateTime` plus `minReadySeconds`. `None` if it is not Running or Available,
/// or if `minReadySeconds` > 0 and the phase has no time (it cannot be told how long it has been up).
fn available_at(machine: &Machine, min_ready: Duration) -> Option<Timestamp> {
    if machine.is_deleting()
        || !matches!(
            machine.phase(),
            Some(MachinePhase::Running | MachinePhase::Available)
        )
    {
        return None;
    }
    if min_ready.is_zero() {
        return Some(Timestamp::MIN);
    }
    machine
        .status
        .as_ref()
        .and_then(|s| s.current_status.last_update_time.as_ref())
        .map(|since| timeouts::add(since.0, min_ready))
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn summary(set: &MachineSet, machine: &Machine) -> MachineSummary {
    MachineSummary {
        name: name_of(machine).to_owned(),
        provider_id: machine.spec.provider_id.clone(),
        last_operation: machine
            .status
            .as_ref()
            .map(|s| s.last_operation.clone())
            .unwrap_or_default(),
        owner_ref: set.metadata.name.clone().unwrap_or_default(),
    }
}

fn conditions(
    current: &[MachineSetCondition],
    result: &ManageResult,
    now: Timestamp,
) -> Vec<MachineSetCondition> {
    let is_failure = |c: &MachineSetCondition| c.r#type == MachineSetConditionType::ReplicaFailure;
    let mut conditions = current.to_vec();
    match result {
        ManageResult::NotRun => {}
        ManageResult::Succeeded => conditions.retain(|c| !is_failure(c)),
        ManageResult::Failed(failure) => {
            let same = conditions.iter().any(|c| {
                is_failure(c) && c.status == ConditionStatus::True && c.reason == failure.reason.as_str()
            });
            if !same {
                conditions.retain(|c| !is_failure(c));
                conditions.push(MachineSetCondition {
                    r#type: MachineSetConditionType::ReplicaFailure,
                    status: ConditionStatus::True,
                    last_transition_time: Some(Time(now)),
                    reason: failure.reason.as_str().to_owned(),
                    message: failure.message.clone(),
                });
            }
        }
    }
    conditions
}

/// The set's status from its owned machines (reference `calculateMachineSetStatus`):
/// - `replicas`: the machines of the set, those being deleted included;
/// - `fullyLabeledReplicas`: those whose labels include all the template's labels;
/// - `readyReplicas`: Running, not being deleted;
/// - `availableReplicas`: Running or Available (no target cluster), not being deleted, for at least
///   `minReadySeconds` since the phase's `lastUpdateTime` when `min_ready` is [`MinReadySeconds::Honour`] (the
///   reference ignores `minReadySeconds`, and so does the default [`MinReadySeconds::Ignore`]);
/// - `preservedFailedReplicas`: Failed and preserved;
/// - `autoPreserveFailedMachineCount`: annotated `auto-preserved` (absent when none);
/// - `failedMachines`: machines whose last operation failed and that are not preserved, by name, as the reference's
///   `MachineSummary` (absent when there are none);
/// - the `ReplicaFailure` condition from `result` (set with reason `FailedCreate`/`FailedDelete` and the error, kept
///   while the reason stays the same, removed after a pass whose creations and deletions all succeeded); other
///   conditions (`Frozen`, the safety controller's) are kept;
/// - `observedGeneration`: the set's generation.
///
/// `recheck_after` is the soonest instant a Running machine reaches `minReadySeconds` (never when ignored).
pub fn status(
    set: &MachineSet,
    machines: &[&Machine],
    result: &ManageResult,
    min_ready_seconds: MinReadySeconds,
    now: Timestamp,
) -> StatusPlan {
    let current = set.status.clone().unwrap_or_default();
    let min_ready = match min_ready_seconds {
        MinReadySeconds::Ignore => Duration::ZERO,
        MinReadySeconds::Honour => {
            Duration::from_secs(u64::try_from(set.spec.min_ready_seconds).unwrap_or(0))
        }
    };
    let template_labels = set.spec.template.labels();
    let mut recheck_at: Option<Timestamp> = None;
    let mut available = 0;
    for machine in machines {
        match available_at(machine, min_ready) {
            Some(at) if at <= now => available += 1,
            Some(at) => recheck_at = Some(recheck_at.map_or(at, |r| r.min(at))),
            None => {}
        }
    }
    let fully_labeled = machines
        .iter()
        .filter(|m| {
            let machine_labels = labels_of(&m.metadata);
            template_labels
                .iter()
                .all(|(k, v)| machine_labels.get(k) == Some(v))
        })
        .count();
    let preserved_failed = machines
        .iter()
        .filter(|m| m.phase() == Some(MachinePhase::Failed) && m.is_preserved(now))
        .count();
    let mut failed: Vec<MachineSummary> = machines
        .iter()
        .filter(|m| {
            m.status
                .as_ref()
                .is_some_and(|s| s.last_operation.state == Some(MachineState::Failed))
                && !m.is_preserved(now)
        })
        .map(|m| summary(set, m))
        .collect();
    failed.sort_by(|a, b| a.name.cmp(&b.name));
    let status = MachineSetStatus {
        replicas: count(machines.len()),
        fully_labeled_replicas: count(fully_labeled),
        ready_replicas: count(machines.iter().filter(|m| is_ready(m)).count()),
        available_replicas: count(available),
        preserved_failed_replicas: count(preserved_failed),
        observed_generation: set.metadata.generation.unwrap_or(0),
        conditions: conditions(&current.conditions, result, now),
        last_operation: current.last_operation.clone(),
        failed_machines: (!failed.is_empty()).then_some(failed),
        auto_preserve_failed_machine_count: i32::try_from(super::auto_preserved_count(machines))
            .ok()
            .filter(|n| *n > 0),
    };
    StatusPlan {
        update: SetStatusUpdate { status },
        recheck_after: recheck_at.map(|at| until(now, at)),
    }
}
