//! Force rules and the drain mode: when a drain is forced, its timeout and how often an eviction is retried.
//!
//! Separate because it is decided once per drain, before any pod is looked at.

use std::{fmt, time::Duration};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::NodeCondition;
use mcm_api::{Machine, MetaExt, keys::labels};

use super::{FORCE_MAX_EVICT_RETRIES, FORCE_TIMEOUT, READONLY_FILESYSTEM, READY, common::go};
use crate::timeouts::{self, EffectiveSettings};

/// Why a drain is forced (pods deleted with grace period 0, PodDisruptionBudgets not honoured, no waiting).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForceReason {
    /// The machine has the label `force-deletion` with a value that parses as true.
    Label {
        /// The label's value as written.
        value: String,
    },
    /// The drain timeout has passed since the machine's deletion timestamp.
    DrainTimeout {
        /// The effective drain timeout.
        timeout: Duration,
    },
    /// The node's `Ready` condition has not been `True` for at least `after`.
    NodeNotReady {
        /// The force-drain period (5m).
        after: Duration,
    },
    /// The node's `ReadonlyFilesystem` condition has not been `False` for at least `after`.
    ReadonlyFilesystem {
        /// The force-drain period (5m).
        after: Duration,
    },
    /// In-place update: the machine has the label `force-drain=True`.
    DrainLabel,
    /// In-place update: the drain timeout has passed since the node was selected for the update.
    SelectedTimeout {
        /// The effective drain timeout.
        timeout: Duration,
    },
}

impl fmt::Display for ForceReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Label { value } => {
                write!(f, "the machine has the label {}={value}", labels::FORCE_DELETION)
            }
            Self::DrainTimeout { timeout } => {
                write!(
                    f,
                    "the drain timeout of {} has passed since the deletion",
                    go(*timeout)
                )
            }
            Self::NodeNotReady { after } => write!(f, "the node has not been Ready for {}", go(*after)),
            Self::ReadonlyFilesystem { after } => {
                write!(f, "the node's filesystem has been read-only for {}", go(*after))
            }
            Self::DrainLabel => write!(f, "the machine has the label {}=True", labels::FORCE_DRAIN),
            Self::SelectedTimeout { timeout } => write!(
                f,
                "the drain timeout of {} has passed since the node was selected for an in-place update",
                go(*timeout)
            ),
        }
    }
}

/// Go's `strconv.ParseBool`: `1 t T TRUE true True` are true, `0 f F FALSE false False` are false, anything else is
/// not a boolean.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The machine's `force-deletion` label, if it parses as true.
fn force_label(machine: &Machine) -> Option<ForceReason> {
    let value = machine.label(labels::FORCE_DELETION)?;
    (parse_bool(value) == Some(true)).then(|| ForceReason::Label {
        value: value.to_owned(),
    })
}

/// When the condition of `type_` has been unhealthy since (its `lastTransitionTime`), if it is present and
/// unhealthy: `Ready` unless `True`, `ReadonlyFilesystem` unless `False`. A condition without a transition time gives
/// no instant and so never forces a drain (the reference reads Go's zero time there, i.e. "forever").
fn unhealthy_since(conditions: &[NodeCondition], type_: &str) -> Option<Timestamp> {
    let condition = conditions.iter().find(|c| c.type_ == type_)?;
    let healthy = if type_ == READY { "True" } else { "False" };
    if condition.status == healthy {
        return None;
    }
    condition.last_transition_time.as_ref().map(|t| t.0)
}

/// The instants at which each force rule that depends on time fires, with the reason it gives.
fn force_deadlines(
    machine: &Machine,
    conditions: &[NodeCondition],
    settings: &EffectiveSettings,
) -> Vec<(Timestamp, ForceReason)> {
    let mut deadlines = Vec::new();
    if let Some(deleted) = machine.metadata.deletion_timestamp.as_ref() {
        deadlines.push((
            timeouts::add(deleted.0, settings.drain_timeout),
            ForceReason::DrainTimeout {
                timeout: settings.drain_timeout,
            },
        ));
    }
    deadlines.extend(node_force_deadlines(conditions, settings));
    deadlines
}

/// The instants at which the node's own state forces a drain (not Ready, read-only filesystem, for
/// `force_drain_unhealthy_after`), with the reason each gives; shared by every drain (deletion, in-place update).
pub fn node_force_deadlines(
    conditions: &[NodeCondition],
    settings: &EffectiveSettings,
) -> Vec<(Timestamp, ForceReason)> {
    let after = settings.force_drain_unhealthy_after;
    let mut deadlines = Vec::new();
    if let Some(since) = unhealthy_since(conditions, READY) {
        deadlines.push((timeouts::add(since, after), ForceReason::NodeNotReady { after }));
    }
    if let Some(since) = unhealthy_since(conditions, READONLY_FILESYSTEM) {
        deadlines.push((
            timeouts::add(since, after),
            ForceReason::ReadonlyFilesystem { after },
        ));
    }
    deadlines
}

/// Whether, and why, the drain of `machine` is forced at `now` (reference §4, `drainNode`). Any of:
/// - the label `force-deletion` parses as true (`strconv.ParseBool`);
/// - `now − deletionTimestamp ≥ drain timeout`;
/// - the node's `Ready` has not been `True` for at least 5 minutes (`force_drain_unhealthy_after`);
/// - the node's `ReadonlyFilesystem` has not been `False` for at least 5 minutes (PR #839).
///
/// `conditions` are the node's (the machine's copy when the node is gone). The reference compares with `>`; the
/// instant itself counts here, so that a timer set at [`force_at`] finds the drain forced.
pub fn force_reason(
    machine: &Machine,
    conditions: &[NodeCondition],
    now: Timestamp,
    settings: &EffectiveSettings,
) -> Option<ForceReason> {
    force_label(machine).or_else(|| {
        force_deadlines(machine, conditions, settings)
            .into_iter()
            .filter(|(at, _)| now >= *at)
            .min_by_key(|(at, _)| *at)
            .map(|(_, reason)| reason)
    })
}

/// The earliest instant at which a time rule of [`force_reason`] will force the drain (`None` when no rule can fire
/// by the passing of time: no deletion timestamp and a healthy node). The controller sets a timer there.
pub fn force_at(
    machine: &Machine,
    conditions: &[NodeCondition],
    settings: &EffectiveSettings,
) -> Option<Timestamp> {
    force_deadlines(machine, conditions, settings)
        .into_iter()
        .map(|(at, _)| at)
        .min()
}

/// How many times an eviction refused by a PodDisruptionBudget is tried: `min(configured, drain timeout / interval)`
/// and at least 1 (reference: `min(maxEvictRetries, drainTimeout.Seconds() / PodEvictionRetryInterval.Seconds())`;
/// the flag's default 360 is 2h / 20s). A negative `configured` counts as 0; a zero interval leaves `configured`.
pub fn max_evict_retries(drain_timeout: Duration, configured: i32, interval: Duration) -> u32 {
    let configured = u32::try_from(configured).unwrap_or(0);
    let by_timeout = if interval.is_zero() {
        u32::MAX
    } else {
        u32::try_from(drain_timeout.as_nanos() / interval.as_nanos()).unwrap_or(u32::MAX)
    };
    configured.min(by_timeout).max(1)
}

/// How a drain runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainMode {
    /// Why the drain is forced; `None` for a normal drain (evictions honouring PodDisruptionBudgets, waiting for
    /// pods and volumes).
    pub force: Option<ForceReason>,
    /// How long the drain may take: the effective drain timeout, [`FORCE_TIMEOUT`] under force.
    pub timeout: Duration,
    /// Eviction attempts per pod ([`max_evict_retries`]), [`FORCE_MAX_EVICT_RETRIES`] under force.
    pub max_evict_retries: u32,
    /// For a normal drain: when it turns into a force drain ([`force_at`]); the controller looks again then.
    pub force_at: Option<Timestamp>,
}

/// The drain mode of `machine` at `now` (see [`force_reason`]).
pub fn drain_mode(
    machine: &Machine,
    conditions: &[NodeCondition],
    now: Timestamp,
    settings: &EffectiveSettings,
) -> DrainMode {
    match force_reason(machine, conditions, now, settings) {
        Some(reason) => DrainMode {
            force: Some(reason),
            timeout: FORCE_TIMEOUT,
            max_evict_retries: FORCE_MAX_EVICT_RETRIES,
            force_at: None,
        },
        None => DrainMode {
            force: None,
            timeout: settings.drain_timeout,
            max_evict_retries: max_evict_retries(
                settings.drain_timeout,
                settings.max_evict_retries,
                settings.evict_retry_interval,
            ),
            force_at: force_at(machine, conditions, settings),
        },
    }
}
