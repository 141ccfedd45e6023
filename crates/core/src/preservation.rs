//! Machine preservation (reference v0.62+, `docs/usage/machine-preservation.md`; docs/preservation.md): which
//! preserve value applies to a machine, whether it is to be preserved or its preservation stopped, and the writes
//! that follow — `status.currentStatus.preserveExpiryTime`, the machine's preserve annotations, the node's
//! cluster-autoscaler annotations and `node.machine.sapcloud.io/preserved` taint, and its `Preserved` condition.
//!
//! The value comes from `node.machine.sapcloud.io/preserve` on the node when the node has it (or had it: the
//! machine's `last-applied-node-preserve-value` remembers what the node said), else on the machine:
//! - `now`: preserved until the expiry, whatever the phase;
//! - `when-failed`: preserved while Failed; a recovered machine stops being preserved;
//! - `auto-preserved` (set by the MachineSet controller): as `when-failed`, and the annotation goes when it stops;
//! - `false`, empty or removed: not preserved (an active preservation stops).
//!
//! An expired preservation stops and its annotations go, so that the machine is not preserved again at once.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, Taint},
    apimachinery::pkg::apis::meta::v1::Time,
};
use mcm_api::{
    Machine, MachinePhase, MetaExt,
    keys::{annotations, node_conditions, taints},
};
use serde_json::{Map, Value, json};

use crate::timeouts;

/// Reason of the `Preserved` condition when the MachineSet controller preserved the machine.
pub const PRESERVED_BY_MCM: &str = "Preserved by MCM.";
/// Reason of the `Preserved` condition when a user's annotation preserved the machine.
pub const PRESERVED_BY_USER: &str = "Preserved by user.";
/// Reason of the `Preserved` condition once preservation stopped.
pub const PRESERVATION_STOPPED: &str = "Preservation stopped.";
/// Start of the condition message once a preserved Failed machine's node is drained.
pub const DRAIN_SUCCESSFUL: &str = "Preserved node drained successfully.";
/// Start of the condition message when that drain did not succeed.
pub const DRAIN_UNSUCCESSFUL: &str = "Preserved node could not be drained.";

/// A value of `node.machine.sapcloud.io/preserve`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreserveValue {
    /// `now`.
    Now,
    /// `when-failed`.
    WhenFailed,
    /// `auto-preserved` (written by the MachineSet controller).
    AutoPreserved,
    /// `false`.
    False,
}

impl PreserveValue {
    /// The value on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Now => "now",
            Self::WhenFailed => "when-failed",
            Self::AutoPreserved => "auto-preserved",
            Self::False => "false",
        }
    }

    /// The value of `text`; `None` for anything else (the empty string included).
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Now, Self::WhenFailed, Self::AutoPreserved, Self::False]
            .into_iter()
            .find(|v| v.as_str() == text)
    }
}

/// What preservation observes of one machine.
#[derive(Clone, Copy, Debug)]
pub struct PreservationInput<'a> {
    /// The machine.
    pub machine: &'a Machine,
    /// Its node; `None` when it has no `node` label or the node does not exist.
    pub node: Option<&'a Node>,
    /// The effective preservation timeout (`spec.machinePreserveTimeout`, else `--machine-preserve-timeout`).
    pub timeout: Duration,
    /// Now.
    pub now: Timestamp,
}

/// What is decided for the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No preserve annotation, no expiry: preservation has nothing to do.
    Untouched,
    /// Preserve (or keep preserving) with this value.
    Preserve(PreserveValue),
    /// Stop an active preservation; `forget`: remove the preserve annotations too (expired, or an auto-preserved
    /// machine that recovered), so that it is not preserved again at once.
    Stop {
        /// Whether the preserve annotations go.
        forget: bool,
    },
}

/// The writes preservation asks for, in the order the controller makes them (see [`plan`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PreservationPlan {
    /// The decision (`None`: untouched).
    pub decision: Option<Decision>,
    /// Annotation values that are not understood, named (the controller logs them).
    pub warnings: Vec<String>,
    /// `status.currentStatus.preserveExpiryTime` to write: `Some(Some(t))` sets it, `Some(None)` clears it.
    pub expiry: Option<Option<Timestamp>>,
    /// Merge patch of the node: cluster-autoscaler annotations, the preserve annotation, the taints (the whole
    /// list, guarded by the node's resourceVersion).
    pub node_patch: Option<Value>,
    /// The `Preserved` condition to write when preservation stops (a strategic merge patch keyed by type).
    pub stopped_condition: Option<NodeCondition>,
    /// Whether the node must be drained (a preserved Failed machine whose node is not drained yet); the condition
    /// then follows the drain's result ([`preserved_condition`]).
    pub drain: bool,
    /// Merge patch of the machine's annotations (the preserve annotation, `last-applied-node-preserve-value`).
    pub machine_patch: Option<Value>,
    /// When to look again: the expiry.
    pub requeue_after: Option<Duration>,
}

/// The expiry of `machine`'s preservation, if set.
fn expiry(machine: &Machine) -> Option<Timestamp> {
    machine.preserve_expiry()
}

/// The value that applies, with what the machine's annotations must become to follow the node.
struct Effective {
    value: Option<PreserveValue>,
    /// The node's annotation is in charge (it has one, or had one: `last-applied-node-preserve-value`).
    node_in_charge: bool,
    node_value: Option<String>,
}

/// Which value applies: the node's when the node has the annotation or had it, else the machine's. A node value
/// that is not understood stops everything (`Err`, named); a machine value that is not understood counts as absent.
fn effective(input: &PreservationInput<'_>, warnings: &mut Vec<String>) -> Result<Effective, ()> {
    let machine = input.machine;
    let mut machine_value = machine.annotation(annotations::PRESERVE).map(str::to_owned);
    if let Some(v) = machine_value.as_deref()
        && PreserveValue::parse(v).is_none()
    {
        warnings.push(format!(
            "annotation {}={v:?} on the machine is not one of now, when-failed, auto-preserved, false: ignored",
            annotations::PRESERVE
        ));
        machine_value = None;
    }
    let node_value = input
        .node
        .and_then(|n| n.annotation(annotations::PRESERVE))
        .map(str::to_owned);
    if let Some(v) = node_value.as_deref().filter(|v| !v.is_empty())
        && PreserveValue::parse(v).is_none()
    {
        warnings.push(format!(
            "annotation {}={v:?} on the node is not one of now, when-failed, auto-preserved, false: preservation \
             left as it is",
            annotations::PRESERVE
        ));
        return Err(());
    }
    let last_applied = machine
        .annotation(annotations::LAST_APPLIED_NODE_PRESERVE_VALUE)
        .unwrap_or_default();
    let node_in_charge = input.node.is_some()
        && (node_value.as_deref().is_some_and(|v| !v.is_empty()) || !last_applied.is_empty());
    let value = if node_in_charge {
        node_value.as_deref().and_then(PreserveValue::parse)
    } else {
        machine_value.as_deref().and_then(PreserveValue::parse)
    };
    Ok(Effective {
        value,
        node_in_charge,
        node_value,
    })
}

/// Decides the preservation of one machine (reference `manageMachinePreservation`).
pub fn plan(input: &PreservationInput<'_>) -> PreservationPlan {
    let machine = input.machine;
    let mut out = PreservationPlan::default();
    if machine.is_deleting() {
        return out;
    }
    let Ok(effective) = effective(input, &mut out.warnings) else {
        return out;
    };
    let bound = expiry(machine).is_some()
        || machine.annotation(annotations::PRESERVE).is_some()
        || input
            .node
            .is_some_and(|n| n.annotation(annotations::PRESERVE).is_some())
        || machine
            .annotation(annotations::LAST_APPLIED_NODE_PRESERVE_VALUE)
            .is_some_and(|v| !v.is_empty());
    if !bound {
        out.decision = Some(Decision::Untouched);
        return out;
    }
    let failed = machine.phase() == Some(MachinePhase::Failed);
    let expired = expiry(machine).is_some_and(|t| t <= input.now);
    let decision = match effective.value {
        None | Some(PreserveValue::False) => Decision::Stop { forget: false },
        Some(PreserveValue::WhenFailed | PreserveValue::Now) if expired => Decision::Stop { forget: true },
        Some(PreserveValue::WhenFailed) if !failed => Decision::Stop { forget: false },
        Some(PreserveValue::AutoPreserved) if !failed || expired => Decision::Stop { forget: true },
        Some(value) => Decision::Preserve(value),
    };
    out.decision = Some(decision);
    match decision {
        Decision::Preserve(_) => preserve(input, &mut out),
        Decision::Stop { forget } => stop(input, forget, &mut out),
        Decision::Untouched => {}
    }
    if !matches!(decision, Decision::Stop { forget: true }) {
        out.machine_patch = follow_node(machine, &effective);
    }
    out
}

/// Preserving: the expiry (once), the autoscaler annotations, the taint of a Failed machine's node (off again when
/// the machine recovered), and a drain of a Failed machine's node that is not drained yet.
fn preserve(input: &PreservationInput<'_>, out: &mut PreservationPlan) {
    let machine = input.machine;
    let until = expiry(machine).unwrap_or_else(|| {
        // Whole seconds: the expiry is written as an RFC 3339 time without fractions.
        let at = timeouts::add(input.now, input.timeout);
        Timestamp::from_second(at.as_second()).unwrap_or(at)
    });
    if expiry(machine).is_none() {
        out.expiry = Some(Some(until));
    }
    out.requeue_after = Some(Duration::from_secs(
        u64::try_from(until.as_second() - input.now.as_second()).unwrap_or(0) + 1,
    ));
    let Some(node) = input.node else { return };
    let failed = machine.phase() == Some(MachinePhase::Failed);
    let mut patch = Map::new();
    if node.annotation(annotations::SCALE_DOWN_DISABLED) != Some("true") {
        patch.insert(
            "annotations".into(),
            json!({
                annotations::SCALE_DOWN_DISABLED: "true",
                annotations::SCALE_DOWN_DISABLED_BY_MCM: "true",
            }),
        );
    }
    let tainted = has_taint(node);
    let mut taints = None;
    if failed && !tainted {
        let mut list = node_taints(node);
        list.push(Taint {
            key: taints::PRESERVED.into(),
            effect: "NoSchedule".into(),
            time_added: Some(Time(input.now)),
            value: None,
        });
        taints = Some(list);
    } else if machine.phase() == Some(MachinePhase::Running) && tainted {
        taints = Some(without_taint(node));
    }
    out.node_patch = node_patch(node, patch, taints);
    out.drain = failed && !drained(node);
}

/// Stopping an active preservation (one with an expiry): condition `False`, our autoscaler annotations and the taint
/// off the node, the preserve annotations gone when `forget`, the expiry cleared last.
fn stop(input: &PreservationInput<'_>, forget: bool, out: &mut PreservationPlan) {
    if expiry(input.machine).is_none() {
        return;
    }
    if let Some(node) = input.node {
        let existing = preserved_condition_of(node);
        if existing.is_none_or(|c| c.status != "False" || c.reason.as_deref() != Some(PRESERVATION_STOPPED)) {
            out.stopped_condition = Some(NodeCondition {
                type_: node_conditions::PRESERVED.into(),
                status: "False".into(),
                reason: Some(PRESERVATION_STOPPED.into()),
                message: Some(String::new()),
                last_transition_time: Some(Time(input.now)),
                last_heartbeat_time: None,
            });
        }
        let mut remove = Map::new();
        if node.annotation(annotations::SCALE_DOWN_DISABLED_BY_MCM) == Some("true") {
            remove.insert(annotations::SCALE_DOWN_DISABLED.into(), Value::Null);
            remove.insert(annotations::SCALE_DOWN_DISABLED_BY_MCM.into(), Value::Null);
        }
        if forget && node.annotation(annotations::PRESERVE).is_some() {
            remove.insert(annotations::PRESERVE.into(), Value::Null);
        }
        let mut patch = Map::new();
        if !remove.is_empty() {
            patch.insert("annotations".into(), Value::Object(remove));
        }
        let taints = has_taint(node).then(|| without_taint(node));
        out.node_patch = node_patch(node, patch, taints);
    }
    if forget {
        let machine = input.machine;
        let mut remove = Map::new();
        for key in [
            annotations::PRESERVE,
            annotations::LAST_APPLIED_NODE_PRESERVE_VALUE,
        ] {
            if machine.annotation(key).is_some() {
                remove.insert(key.into(), Value::Null);
            }
        }
        if !remove.is_empty() {
            out.machine_patch = Some(json!({"metadata": {"annotations": remove}}));
        }
    }
    out.expiry = Some(None);
}

/// When the node's annotation is in charge: the machine's own preserve annotation goes and
/// `last-applied-node-preserve-value` records the node's value (removed once the node has none).
fn follow_node(machine: &Machine, effective: &Effective) -> Option<Value> {
    if !effective.node_in_charge {
        return None;
    }
    let node_value = effective.node_value.as_deref().unwrap_or_default();
    let last_applied = machine
        .annotation(annotations::LAST_APPLIED_NODE_PRESERVE_VALUE)
        .unwrap_or_default();
    let own = machine.annotation(annotations::PRESERVE).is_some();
    if node_value == last_applied && !own {
        return None;
    }
    let mut patch = Map::new();
    if own {
        patch.insert(annotations::PRESERVE.into(), Value::Null);
    }
    let recorded = if node_value.is_empty() {
        Value::Null
    } else {
        Value::String(node_value.to_owned())
    };
    patch.insert(annotations::LAST_APPLIED_NODE_PRESERVE_VALUE.into(), recorded);
    Some(json!({"metadata": {"annotations": patch}}))
}

fn node_patch(node: &Node, metadata: Map<String, Value>, taints: Option<Vec<Taint>>) -> Option<Value> {
    if metadata.is_empty() && taints.is_none() {
        return None;
    }
    let mut metadata = metadata;
    let mut patch = json!({});
    if let Some(taints) = taints {
        // The taint list is replaced as a whole: guard it against a concurrent writer.
        if let Some(rv) = &node.metadata.resource_version {
            metadata.insert("resourceVersion".into(), Value::String(rv.clone()));
        }
        patch["spec"] = json!({ "taints": taints });
    }
    patch["metadata"] = Value::Object(metadata);
    Some(patch)
}

fn node_taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

fn is_preserved_taint(t: &Taint) -> bool {
    t.key == taints::PRESERVED && t.effect == "NoSchedule"
}

fn has_taint(node: &Node) -> bool {
    node_taints(node).iter().any(is_preserved_taint)
}

fn without_taint(node: &Node) -> Vec<Taint> {
    node_taints(node)
        .into_iter()
        .filter(|t| !is_preserved_taint(t))
        .collect()
}

/// The node's `Preserved` condition.
pub fn preserved_condition_of(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .and_then(|c| c.iter().find(|c| c.type_ == node_conditions::PRESERVED))
}

/// Whether the node of a preserved Failed machine was drained already (its condition says so).
fn drained(node: &Node) -> bool {
    preserved_condition_of(node)
        .is_some_and(|c| c.message.as_deref().is_some_and(|m| m.contains(DRAIN_SUCCESSFUL)))
}

/// How the drain of a preserved Failed machine's node went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainResult {
    /// No drain was needed (the machine is not Failed, or its node was drained before).
    NotNeeded,
    /// The node is drained.
    Drained,
    /// The drain did not succeed (timed out, blocked or failed).
    Failed,
}

/// The expiry as the reference prints it in messages (Go's `time.Time` format, UTC).
pub fn expiry_text(expiry: Timestamp) -> String {
    expiry.strftime("%Y-%m-%d %H:%M:%S +0000 UTC").to_string()
}

/// The `Preserved` condition of a preserved machine's node, `None` when `existing` says it already (reference
/// `computeNewNodePreservedCondition`): a Failed machine's node is `True` once drained ("Preserved node drained
/// successfully. Machine preserved until …."), `False` when the drain did not succeed; any other machine's node is
/// `True` ("Machine preserved until …."). The reason says who preserved it.
pub fn preserved_condition(
    phase: Option<MachinePhase>,
    value: PreserveValue,
    expiry: Timestamp,
    existing: Option<&NodeCondition>,
    drain: DrainResult,
    now: Timestamp,
) -> Option<NodeCondition> {
    let until = format!("Machine preserved until {}.", expiry_text(expiry));
    let (status, message) = if phase == Some(MachinePhase::Failed) {
        match drain {
            DrainResult::Failed => ("False", format!("{DRAIN_UNSUCCESSFUL} {until}")),
            DrainResult::Drained => ("True", format!("{DRAIN_SUCCESSFUL} {until}")),
            // Drained before: the condition stays as it is.
            DrainResult::NotNeeded => match existing {
                Some(c) => (
                    if c.status == "True" { "True" } else { "False" },
                    c.message.clone().unwrap_or_default(),
                ),
                None => ("False", until),
            },
        }
    } else {
        match existing {
            Some(c) if c.status == "True" => ("True", c.message.clone().unwrap_or_default()),
            _ => ("True", until),
        }
    };
    let reason = if value == PreserveValue::AutoPreserved {
        PRESERVED_BY_MCM
    } else {
        PRESERVED_BY_USER
    };
    if existing.is_some_and(|c| {
        c.status == status
            && c.message.as_deref() == Some(message.as_str())
            && c.reason.as_deref() == Some(reason)
    }) {
        return None;
    }
    let transition = existing
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Some(NodeCondition {
        type_: node_conditions::PRESERVED.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_transition_time: Some(transition),
        last_heartbeat_time: None,
    })
}

/// The strategic merge patch of `nodes/<name>/status` that writes `condition` (merged by type, the kubelet's
/// conditions kept).
pub fn condition_patch(condition: &NodeCondition) -> Value {
    json!({"status": {"conditions": [condition]}})
}

/// The merge patch of the machine's status that sets or clears `preserveExpiryTime`.
pub fn expiry_patch(expiry: Option<Timestamp>) -> Value {
    json!({"status": {"currentStatus": {"preserveExpiryTime": expiry.map(Time)}}})
}

#[cfg(test)]
#[path = "preservation_tests.rs"]
mod tests;
