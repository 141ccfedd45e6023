//! Health of a machine's node and the phase transitions it drives (reference §3.4 `reconcileMachineHealth`).
//!
//! - A node is healthy when it reports at least one condition, `Ready` is `True`, and every condition type of the
//!   effective node-conditions list that it reports is `False` ([`is_healthy`]).
//! - Pending, Unknown or CrashLoopBackOff with a healthy node → Running. The first join writes
//!   `Create/Successful "Machine <m> successfully joined the cluster in <d>"`, and the controller then sets the
//!   annotation `node.machine.sapcloud.io/machine-join-duration` and deletes the bootstrap token ([`FirstJoin`]);
//!   a later join writes `HealthCheck/Successful "… re-joined the cluster"`. While the node carries the taint
//!   `node.gardener.cloud/critical-components-not-ready`, a Pending machine stays Pending.
//! - Running with an unhealthy or missing node → Unknown, which restarts `currentStatus.lastUpdateTime` (the health
//!   timer).
//! - Pending at `creationTimestamp + creation timeout` → Failed.
//! - Unknown at `currentStatus.lastUpdateTime + health timeout` (unless `disableHealthTimeout`) → Failed, but only
//!   when the remediation guard allows: the plan carries the Failed status as a [`HealthPlan::failure_candidate`]
//!   for the controller to pass through [`crate::remediation::decide`] with the rest of the group.
//! - In-place updates (reference v0.58+): InPlaceUpdating and InPlaceUpdateFailed are neither Running nor Unknown
//!   for health, and the health timeout never fails them. The node label `update-result` moves them:
//!   `successful` → InPlaceUpdateSuccessful (`InPlaceUpdate/Successful "… successfully updated dependencies"`),
//!   `failed` → InPlaceUpdateFailed (`InPlaceUpdate/Failed "… failed to update dependencies: <reason>"`).
//!   InPlaceUpdating at `currentStatus.lastUpdateTime + in-place update timeout` → InPlaceUpdateFailed.
//!   InPlaceUpdateSuccessful with a healthy node → Running ("re-joined", as the reference does).
//! - Node conditions are copied onto the machine only when one is added or removed or changes type, status or
//!   reason; heartbeat-only changes write nothing.
//!
//! The plan names the exact instant of the next timeout instead of polling every minute as the reference does.

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use mcm_api::{
    Machine, MachineOperationType, MachinePhase, MachineState, MetaExt,
    keys::{annotations, in_place_update, labels, taints},
};
use serde_json::{Value, json};

use crate::{
    descriptions::{Description, Redactor, conditions_summary},
    status::{StatusUpdate, operation, phase_status},
    timeouts::{self, ControllerSettings, SettingProblem, effective_settings},
    userdata,
};

/// The node condition type that must be `True`.
pub const READY: &str = "Ready";

/// Whether node conditions say the node is healthy: at least one condition, `Ready` present and `True`, and every
/// type of `node_conditions` that is present `False`.
///
/// (The reference accepts a node without a `Ready` condition when it has any other; a node without `Ready` is not
/// known to be ready, so it is not healthy here.)
pub fn is_healthy(conditions: &[NodeCondition], node_conditions: &[String]) -> bool {
    !conditions.is_empty()
        && conditions.iter().any(|c| c.type_ == READY && c.status == "True")
        && conditions.iter().all(|c| {
            (c.type_ != READY || c.status == "True")
                && (!node_conditions.contains(&c.type_) || c.status == "False")
        })
}

/// Whether the node's conditions differ from the machine's copy in a way worth writing: a condition added or
/// removed, or a type's status or reason changed. Order, messages and heartbeat/transition times do not count.
pub fn conditions_changed(machine_conditions: &[NodeCondition], node_conditions: &[NodeCondition]) -> bool {
    fn key(conditions: &[NodeCondition]) -> BTreeMap<&str, Vec<(&str, &str)>> {
        let mut map: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
        for c in conditions {
            map.entry(c.type_.as_str())
                .or_default()
                .push((c.status.as_str(), c.reason.as_deref().unwrap_or("")));
        }
        map
    }
    key(machine_conditions) != key(node_conditions)
}

/// Whether the node carries the taint that keeps a Pending machine from Running (any effect).
pub fn has_critical_components_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == taints::CRITICAL_COMPONENTS_NOT_READY))
}

/// Whether a rollout of the machine's deployment is in progress, as the reference tells it: the node carries the
/// annotation `cluster-autoscaler.kubernetes.io/scale-down-disabled-by-mcm`. No machine is marked Failed for its
/// health during a rollout.
pub fn is_rolling_out(node: Option<&Node>) -> bool {
    node.is_some_and(|n| n.annotation(annotations::SCALE_DOWN_DISABLED_BY_MCM).is_some())
}

/// Whether the health check applies: the machine has a node (label `node`) and a phase, and is not being deleted.
pub fn applies(machine: &Machine) -> bool {
    !machine.is_deleting() && machine.phase().is_some() && machine.node_name().is_some()
}

/// What the health check observed.
#[derive(Clone, Copy, Debug)]
pub struct HealthInput<'a> {
    /// The machine.
    pub machine: &'a Machine,
    /// Its node (named by the label `node`), `None` when the node cache has no such node.
    pub node: Option<&'a Node>,
    /// The controller settings.
    pub settings: &'a ControllerSettings,
    /// Removes secret values from the node agent's in-place update failure reason.
    pub redactor: &'a Redactor,
    /// Now.
    pub now: Timestamp,
}

/// The phase transition the plan makes (for events and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthTransition {
    /// No phase change.
    None,
    /// → Running; `first` for the first join (Pending after creation), else a re-join.
    Joined {
        /// Whether it is the first join.
        first: bool,
    },
    /// Running → Unknown.
    BecameUnknown {
        /// Whether the node is missing (else it is unhealthy).
        node_missing: bool,
    },
    /// Pending → Failed at the creation timeout (the reference's `mcm_machine_num_failed_join`).
    JoinTimedOut,
    /// The health timeout expired: Unknown → Failed if the remediation guard allows
    /// ([`HealthPlan::failure_candidate`]).
    HealthTimedOut,
}

/// The first join of a machine: what the controller does besides writing the status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirstJoin {
    /// How long the machine took to join, from its creation (whole seconds); `None` without a creation timestamp.
    pub join_duration: Option<Duration>,
    /// The bootstrap token Secret (in `kube-system` of the target cluster) to delete: it is not needed any more.
    pub bootstrap_token_secret: String,
}

impl FirstJoin {
    /// The merge patch of the machine that sets `node.machine.sapcloud.io/machine-join-duration` (a Go duration);
    /// `None` without a join duration.
    pub fn machine_patch(&self) -> Option<Value> {
        let duration = self.join_duration?;
        Some(json!({
            "metadata": {"annotations": {
                annotations::MACHINE_JOIN_DURATION: mcm_api::GoDuration::from_std(duration).0
            }}
        }))
    }
}

/// The health check's plan.
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub struct HealthPlan {
    /// The transition made.
    pub transition: HealthTransition,
    /// The status to write (conditions and/or phase), `None` when nothing changes.
    pub status: Option<StatusUpdate>,
    /// The Failed status to write instead of `status` if the remediation guard allows it now; if it does not, write
    /// `status` and look again after `requeue_after`.
    pub failure_candidate: Option<StatusUpdate>,
    /// Set on the first join.
    pub first_join: Option<FirstJoin>,
    /// When to look again at the latest (the next timeout, or the guard's recheck), `None` when only events matter.
    pub requeue_after: Option<Duration>,
    /// Per-machine settings that could not be used (for reporting).
    pub problems: Vec<SettingProblem>,
}

impl HealthPlan {
    fn nothing(problems: Vec<SettingProblem>) -> Self {
        Self {
            transition: HealthTransition::None,
            status: None,
            failure_candidate: None,
            first_join: None,
            requeue_after: None,
            problems,
        }
    }
}

fn machine_conditions(machine: &Machine) -> &[NodeCondition] {
    machine.status.as_ref().map_or(&[], |s| s.conditions.as_slice())
}

/// What the transitions of one decision share.
struct Context<'a> {
    input: &'a HealthInput<'a>,
    effective: timeouts::EffectiveSettings,
    name: String,
    existing: Option<&'a mcm_api::MachineStatus>,
    /// The conditions health is judged on: the node's, or the machine's copy when the node is missing.
    conditions: &'a [NodeCondition],
}

impl Context<'_> {
    fn last_type(&self) -> Option<MachineOperationType> {
        self.existing.and_then(|s| s.last_operation.r#type)
    }

    fn set(
        &self,
        status: &mut StatusUpdate,
        description: &Description,
        state: MachineState,
        r#type: Option<MachineOperationType>,
        phase: MachinePhase,
    ) {
        let now = self.input.now;
        status.last_operation = Some(operation(description, state, r#type, None, now));
        status.current_status = Some(phase_status(self.existing, phase, false, now));
    }
}

/// Decides the health check of one machine.
pub fn decide(input: &HealthInput<'_>) -> HealthPlan {
    let machine = input.machine;
    let effective = effective_settings(machine, input.settings);
    if !applies(machine) {
        return HealthPlan::nothing(effective.problems);
    }

    // Conditions: the node's when there is a node, written only on a real change.
    let node_conditions = input
        .node
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let new_conditions = input
        .node
        .filter(|_| conditions_changed(machine_conditions(machine), node_conditions))
        .map(|_| node_conditions.to_vec());
    let conditions = if input.node.is_some() {
        node_conditions
    } else {
        machine_conditions(machine)
    };
    let healthy = input.node.is_some() && is_healthy(conditions, &effective.node_conditions);
    let ctx = Context {
        input,
        name: machine.metadata.name.clone().unwrap_or_default(),
        existing: machine.status.as_ref(),
        conditions,
        effective,
    };

    let mut plan = HealthPlan::nothing(ctx.effective.problems.clone());
    let mut status = StatusUpdate {
        conditions: new_conditions,
        ..StatusUpdate::default()
    };
    let phase = machine.phase();
    let held_pending =
        phase == Some(MachinePhase::Pending) && input.node.is_some_and(has_critical_components_taint);
    match phase {
        Some(MachinePhase::InPlaceUpdating | MachinePhase::InPlaceUpdateFailed) => {
            in_place(&ctx, &mut plan, &mut status);
        }
        Some(MachinePhase::Running) if !healthy => become_unknown(&ctx, &mut plan, &mut status),
        Some(
            MachinePhase::Pending
            | MachinePhase::Unknown
            | MachinePhase::CrashLoopBackOff
            | MachinePhase::InPlaceUpdateSuccessful
            // A phase this build does not know (a newer version wrote it): a healthy node makes it Running, as
            // the reference does for every phase it does not single out; an unhealthy one starts no timeout.
            | MachinePhase::Other(_),
        ) if healthy && !held_pending => {
            join(&ctx, &mut plan, &mut status);
        }
        // A preserved Failed machine that recovered returns to Running (reference §3.8; docs/preservation.md).
        Some(MachinePhase::Failed) if healthy && machine.is_preserved(input.now) => {
            join(&ctx, &mut plan, &mut status);
        }
        Some(MachinePhase::Pending) => pending_timeout(&ctx, &mut plan, &mut status),
        Some(MachinePhase::Unknown) if !ctx.effective.health_timeout_disabled => {
            health_timeout(&ctx, &mut plan, &mut status);
        }
        _ => {}
    }

    plan.status = (status != StatusUpdate::default() && status.changes(ctx.existing)).then_some(status);
    plan
}

/// Running → Unknown; the health timer starts.
fn become_unknown(ctx: &Context<'_>, plan: &mut HealthPlan, status: &mut StatusUpdate) {
    let node_missing = ctx.input.node.is_none();
    let description = if node_missing {
        Description::NodeMissing {
            machine: ctx.name.clone(),
        }
    } else {
        Description::Unhealthy {
            machine: ctx.name.clone(),
            conditions: conditions_summary(ctx.conditions),
        }
    };
    ctx.set(
        status,
        &description,
        MachineState::Processing,
        Some(MachineOperationType::HealthCheck),
        MachinePhase::Unknown,
    );
    plan.transition = HealthTransition::BecameUnknown { node_missing };
    plan.requeue_after = (!ctx.effective.health_timeout_disabled).then_some(ctx.effective.health_timeout);
}

/// → Running: a first join (after creation) or a re-join.
fn join(ctx: &Context<'_>, plan: &mut HealthPlan, status: &mut StatusUpdate) {
    let first = ctx.existing.is_some_and(|s| {
        s.last_operation.r#type == Some(MachineOperationType::Create)
            && s.last_operation.state != Some(MachineState::Successful)
    });
    let (description, r#type) = if first {
        let join_duration = timeouts::created_at(ctx.input.machine)
            .map(|created| Duration::from_secs(timeouts::elapsed(created, ctx.input.now).as_secs()));
        plan.first_join = Some(FirstJoin {
            join_duration,
            bootstrap_token_secret: userdata::bootstrap_token_secret_name_for_machine(&ctx.name),
        });
        let description = Description::Joined {
            machine: ctx.name.clone(),
            after: join_duration,
        };
        (description, MachineOperationType::Create)
    } else {
        let description = Description::Rejoined {
            machine: ctx.name.clone(),
        };
        (description, MachineOperationType::HealthCheck)
    };
    ctx.set(
        status,
        &description,
        MachineState::Successful,
        Some(r#type),
        MachinePhase::Running,
    );
    plan.transition = HealthTransition::Joined { first };
}

/// InPlaceUpdating or InPlaceUpdateFailed: the node agent's `update-result`, else (InPlaceUpdating only) the in-place
/// update timeout, measured from `currentStatus.lastUpdateTime`. Never the health timeout.
fn in_place(ctx: &Context<'_>, plan: &mut HealthPlan, status: &mut StatusUpdate) {
    let node = ctx.input.node;
    let phase = ctx.input.machine.phase();
    let machine = ctx.name.clone();
    match node.and_then(|n| n.label(labels::UPDATE_RESULT)) {
        Some(in_place_update::RESULT_SUCCESSFUL) => {
            ctx.set(
                status,
                &Description::InPlaceUpdated { machine },
                MachineState::Successful,
                Some(MachineOperationType::InPlaceUpdate),
                MachinePhase::InPlaceUpdateSuccessful,
            );
            return;
        }
        Some(in_place_update::RESULT_FAILED) if phase != Some(MachinePhase::InPlaceUpdateFailed) => {
            let reason = node.map(|n| crate::in_place_update::failed_reason(n, ctx.input.redactor));
            ctx.set(
                status,
                &Description::InPlaceUpdateFailed {
                    machine,
                    reason: reason.unwrap_or_default(),
                },
                MachineState::Failed,
                Some(MachineOperationType::InPlaceUpdate),
                MachinePhase::InPlaceUpdateFailed,
            );
            return;
        }
        _ => {}
    }
    if phase != Some(MachinePhase::InPlaceUpdating) {
        return;
    }
    let now = ctx.input.now;
    let timeout = ctx.effective.inplace_update_timeout;
    let since = ctx
        .existing
        .and_then(|s| s.current_status.last_update_time.as_ref())
        .map_or(now, |t| t.0);
    let deadline = timeouts::add(since, timeout);
    if now < deadline {
        plan.requeue_after = Some(timeouts::elapsed(now, deadline));
        return;
    }
    ctx.set(
        status,
        &Description::InPlaceUpdateTimedOut { machine, timeout },
        MachineState::Failed,
        Some(MachineOperationType::InPlaceUpdate),
        MachinePhase::InPlaceUpdateFailed,
    );
}

/// Pending → Failed at the creation deadline; until then, a timer at the deadline.
fn pending_timeout(ctx: &Context<'_>, plan: &mut HealthPlan, status: &mut StatusUpdate) {
    let now = ctx.input.now;
    let deadline = crate::creation::crash_loop_deadline(ctx.input.machine, ctx.input.settings);
    if now < deadline {
        plan.requeue_after = Some(timeouts::elapsed(now, deadline));
        return;
    }
    let description = Description::JoinTimedOut {
        machine: ctx.name.clone(),
        timeout: ctx.effective.creation_timeout,
    };
    ctx.set(
        status,
        &description,
        MachineState::Failed,
        ctx.last_type().or(Some(MachineOperationType::Create)),
        MachinePhase::Failed,
    );
    plan.transition = HealthTransition::JoinTimedOut;
}

/// Unknown → Failed candidate at the health deadline; until then, a timer at the deadline.
fn health_timeout(ctx: &Context<'_>, plan: &mut HealthPlan, status: &mut StatusUpdate) {
    let now = ctx.input.now;
    let recheck = ctx.input.settings.remediation.recheck_interval;
    let Some(since) = ctx
        .existing
        .and_then(|s| s.current_status.last_update_time.as_ref())
    else {
        // No start of the health timer recorded: start it now.
        status.current_status = Some(phase_status(ctx.existing, MachinePhase::Unknown, false, now));
        plan.requeue_after = Some(ctx.effective.health_timeout);
        return;
    };
    let deadline = timeouts::add(since.0, ctx.effective.health_timeout);
    if now < deadline {
        plan.requeue_after = Some(timeouts::elapsed(now, deadline));
        return;
    }
    plan.requeue_after = Some(recheck);
    if is_rolling_out(ctx.input.node) {
        return;
    }
    let description = Description::HealthTimedOut {
        machine: ctx.name.clone(),
        timeout: ctx.effective.health_timeout,
        conditions: conditions_summary(ctx.conditions),
    };
    let mut candidate = status.clone();
    ctx.set(
        &mut candidate,
        &description,
        MachineState::Failed,
        ctx.last_type().or(Some(MachineOperationType::HealthCheck)),
        MachinePhase::Failed,
    );
    plan.failure_candidate = Some(candidate);
    plan.transition = HealthTransition::HealthTimedOut;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{
        api::core::v1::{NodeSpec, NodeStatus, Taint},
        apimachinery::pkg::apis::meta::v1::Time,
    };
    use mcm_api::GoDuration;
    use pretty_assertions::assert_eq;

    use super::*;

    const CREATED: i64 = 1_000_000;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn condition(type_: &str, status: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            ..NodeCondition::default()
        }
    }

    fn healthy_conditions() -> Vec<NodeCondition> {
        vec![
            condition("Ready", "True"),
            condition("DiskPressure", "False"),
            condition("MemoryPressure", "False"),
        ]
    }

    fn node(conditions: Vec<NodeCondition>) -> Node {
        Node {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("m-1".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                conditions: Some(conditions),
                ..NodeStatus::default()
            }),
        }
    }

    fn machine(phase: MachinePhase, since: i64, conditions: Vec<NodeCondition>) -> Machine {
        let machine = mcm_api::builders::MachineBuilder::new("m-1")
            .created_at(at(CREATED))
            .node("m-1")
            .conditions(conditions)
            .phase(phase)
            .phase_since(at(since));
        if phase == MachinePhase::Pending {
            machine
                .operation(MachineOperationType::Create, MachineState::Processing)
                .build()
        } else {
            machine.build()
        }
    }

    fn plan(machine: &Machine, node: Option<&Node>, now: i64) -> HealthPlan {
        decide(&HealthInput {
            machine,
            node,
            settings: &ControllerSettings::default(),
            redactor: &Redactor::new(),
            now: at(now),
        })
    }

    #[test]
    fn healthy_means_ready_and_no_listed_problem() {
        let list = ControllerSettings::default().node_conditions;
        assert!(is_healthy(&healthy_conditions(), &list));
        assert!(!is_healthy(&[], &list));
        assert!(!is_healthy(&[condition("Ready", "False")], &list));
        assert!(!is_healthy(&[condition("Ready", "Unknown")], &list));
        assert!(
            !is_healthy(&[condition("MemoryPressure", "False")], &list),
            "no Ready condition"
        );
        assert!(!is_healthy(
            &[condition("Ready", "True"), condition("DiskPressure", "True")],
            &list
        ));
        assert!(!is_healthy(
            &[condition("Ready", "True"), condition("KernelDeadlock", "Unknown")],
            &list
        ));
        // A type that is not listed does not matter, and a listed type that is absent is fine.
        assert!(is_healthy(
            &[condition("Ready", "True"), condition("MemoryPressure", "True")],
            &list
        ));
        assert!(is_healthy(
            &[condition("Ready", "True"), condition("DiskPressure", "True")],
            &[]
        ));
    }

    #[test]
    fn heartbeat_only_changes_are_not_changes() {
        let mut old = healthy_conditions();
        let mut new = healthy_conditions();
        new[0].last_heartbeat_time = Some(Time(at(5)));
        new[0].message = Some("kubelet is posting ready status".into());
        new.reverse();
        assert!(!conditions_changed(&old, &new));
        new[0].reason = Some("Other".into());
        assert!(conditions_changed(&old, &new));
        old.pop();
        assert!(conditions_changed(&old, &healthy_conditions()));
    }

    #[test]
    fn first_join_runs_records_the_duration_and_frees_the_token() {
        let m = machine(MachinePhase::Pending, CREATED + 10, vec![]);
        let n = node(healthy_conditions());
        let plan = plan(&m, Some(&n), CREATED + 312);
        assert_eq!(plan.transition, HealthTransition::Joined { first: true });
        let status = plan.status.unwrap();
        assert_eq!(status.phase(), Some(MachinePhase::Running));
        assert_eq!(status.conditions.as_ref(), Some(&healthy_conditions()));
        let op = status.last_operation.unwrap();
        assert_eq!(
            op.description,
            "Machine m-1 successfully joined the cluster in 5m12s"
        );
        assert_eq!(op.r#type, Some(MachineOperationType::Create));
        assert_eq!(op.state, Some(MachineState::Successful));
        let join = plan.first_join.unwrap();
        assert_eq!(join.join_duration, Some(Duration::from_secs(312)));
        assert_eq!(
            join.bootstrap_token_secret,
            userdata::bootstrap_token_secret_name_for_machine("m-1")
        );
        assert_eq!(
            join.machine_patch().unwrap(),
            json!({"metadata": {"annotations": {"node.machine.sapcloud.io/machine-join-duration": "5m12s"}}})
        );
    }

    #[test]
    fn the_critical_components_taint_keeps_a_pending_machine_pending() {
        let m = machine(MachinePhase::Pending, CREATED + 10, vec![]);
        let mut n = node(healthy_conditions());
        n.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: taints::CRITICAL_COMPONENTS_NOT_READY.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }]);
        let plan = plan(&m, Some(&n), CREATED + 60);
        assert_eq!(plan.transition, HealthTransition::None);
        // Conditions are still copied, and the creation deadline is the next timer.
        let status = plan.status.unwrap();
        assert_eq!(status.phase(), None);
        assert!(status.conditions.is_some());
        assert_eq!(plan.requeue_after, Some(Duration::from_mins(19)));
    }

    #[test]
    fn an_unhealthy_running_machine_becomes_unknown_and_restarts_the_timer() {
        let m = machine(MachinePhase::Running, CREATED + 10, healthy_conditions());
        let mut conditions = healthy_conditions();
        conditions[0] = NodeCondition {
            reason: Some("KubeletNotReady".into()),
            ..condition("Ready", "False")
        };
        let n = node(conditions);
        let plan = plan(&m, Some(&n), CREATED + 5000);
        assert_eq!(
            plan.transition,
            HealthTransition::BecameUnknown { node_missing: false }
        );
        let status = plan.status.unwrap();
        assert_eq!(status.phase(), Some(MachinePhase::Unknown));
        assert_eq!(
            status.current_status.as_ref().unwrap().last_update_time,
            Some(Time(at(CREATED + 5000)))
        );
        let op = status.last_operation.unwrap();
        assert_eq!(op.r#type, Some(MachineOperationType::HealthCheck));
        assert_eq!(op.state, Some(MachineState::Processing));
        assert_eq!(
            op.description,
            "Machine m-1 is unhealthy - changing MachineState to Unknown. Node conditions: Ready=False \
             (KubeletNotReady), DiskPressure=False, MemoryPressure=False"
        );
        assert_eq!(plan.requeue_after, Some(Duration::from_mins(10)));
    }

    #[test]
    fn a_missing_node_makes_a_running_machine_unknown() {
        let m = machine(MachinePhase::Running, CREATED + 10, healthy_conditions());
        let plan = plan(&m, None, CREATED + 5000);
        assert_eq!(
            plan.transition,
            HealthTransition::BecameUnknown { node_missing: true }
        );
        assert_eq!(
            plan.status.unwrap().description(),
            Some(Description::NodeMissing {
                machine: "m-1".into()
            })
        );
    }

    #[test]
    fn an_unknown_machine_that_recovers_rejoins() {
        let m = machine(MachinePhase::Unknown, CREATED + 10, healthy_conditions());
        let n = node(healthy_conditions());
        let plan = plan(&m, Some(&n), CREATED + 100);
        assert_eq!(plan.transition, HealthTransition::Joined { first: false });
        assert_eq!(plan.first_join, None);
        let status = plan.status.unwrap();
        assert_eq!(status.conditions, None, "conditions did not change");
        let op = status.last_operation.unwrap();
        assert_eq!(op.description, "Machine m-1 successfully re-joined the cluster");
        assert_eq!(op.r#type, Some(MachineOperationType::HealthCheck));
    }

    #[test]
    fn pending_fails_at_the_creation_timeout() {
        let m = machine(MachinePhase::Pending, CREATED + 10, vec![]);
        let before = plan(&m, None, CREATED + 20 * 60 - 1);
        assert_eq!(before.transition, HealthTransition::None);
        assert_eq!(before.status, None);
        assert_eq!(before.requeue_after, Some(Duration::from_secs(1)));
        let after = plan(&m, None, CREATED + 20 * 60);
        assert_eq!(after.transition, HealthTransition::JoinTimedOut);
        let status = after.status.unwrap();
        assert_eq!(status.phase(), Some(MachinePhase::Failed));
        let op = status.last_operation.unwrap();
        assert_eq!(op.description, "Machine m-1 failed to join the cluster in 20m0s.");
        assert_eq!(op.r#type, Some(MachineOperationType::Create));
        assert_eq!(op.state, Some(MachineState::Failed));
    }

    #[test]
    fn unknown_is_a_failure_candidate_after_the_health_timeout() {
        let conditions = vec![condition("Ready", "Unknown")];
        let m = machine(MachinePhase::Unknown, CREATED + 100, conditions.clone());
        let n = node(conditions);
        let before = plan(&m, Some(&n), CREATED + 100 + 599);
        assert_eq!(before.failure_candidate, None);
        assert_eq!(before.requeue_after, Some(Duration::from_secs(1)));
        let after = plan(&m, Some(&n), CREATED + 100 + 600);
        assert_eq!(after.transition, HealthTransition::HealthTimedOut);
        assert_eq!(after.status, None, "nothing to write unless the guard allows");
        let candidate = after.failure_candidate.unwrap();
        assert_eq!(candidate.phase(), Some(MachinePhase::Failed));
        assert_eq!(
            candidate.last_operation.unwrap().description,
            "Machine m-1 is not healthy since 10m0s. Changing status to failed. Node conditions: Ready=Unknown"
        );
        assert_eq!(after.requeue_after, Some(Duration::from_secs(10)));
    }

    /// A phase this build does not know (a newer version wrote it) is never read as Failed or timed out: a healthy
    /// node makes the machine Running, as the reference does for any phase it does not single out, and an unhealthy
    /// one, however long, changes nothing (no failure candidate, so no replacement).
    #[test]
    fn a_phase_this_build_does_not_know_joins_when_healthy_and_never_times_out() {
        let unknown = MachinePhase::parse("Hibernating");
        let m = machine(unknown, CREATED, healthy_conditions());
        let joined = plan(&m, Some(&node(healthy_conditions())), CREATED + 10);
        assert_eq!(joined.status.unwrap().phase(), Some(MachinePhase::Running));

        let conditions = vec![condition("Ready", "False")];
        let m = machine(unknown, CREATED, conditions.clone());
        for later in [CREATED + 10, CREATED + 86_400 * 30] {
            for n in [Some(node(conditions.clone())), None] {
                let kept = plan(&m, n.as_ref(), later);
                assert_eq!(kept.failure_candidate, None);
                assert_eq!(
                    kept.status.as_ref().and_then(StatusUpdate::phase),
                    None,
                    "{kept:?}"
                );
            }
        }
    }

    #[test]
    fn disabled_health_timeout_and_rollouts_keep_unknown_machines() {
        let conditions = vec![condition("Ready", "False")];
        let mut m = machine(MachinePhase::Unknown, CREATED, conditions.clone());
        let mut n = node(conditions);
        n.metadata.annotations = Some(BTreeMap::from([(
            annotations::SCALE_DOWN_DISABLED_BY_MCM.to_owned(),
            "true".to_owned(),
        )]));
        let rolling = plan(&m, Some(&n), CREATED + 100_000);
        assert_eq!(rolling.failure_candidate, None);
        assert_eq!(rolling.requeue_after, Some(Duration::from_secs(10)));

        m.spec.configuration.disable_health_timeout = Some(true);
        let disabled = plan(&m, None, CREATED + 100_000);
        assert_eq!(disabled.failure_candidate, None);
        assert_eq!(disabled.requeue_after, None);
    }

    #[test]
    fn a_per_machine_health_timeout_applies_and_bad_values_are_reported() {
        let conditions = vec![condition("Ready", "False")];
        let mut m = machine(MachinePhase::Unknown, CREATED, conditions);
        m.spec.configuration.health_timeout = Some(GoDuration::new("30s"));
        assert!(plan(&m, None, CREATED + 30).failure_candidate.is_some());
        m.spec.configuration.health_timeout = Some(GoDuration::new("half an hour"));
        let p = plan(&m, None, CREATED + 30);
        assert!(p.failure_candidate.is_none());
        assert_eq!(p.problems[0].field, "spec.healthTimeout");
    }

    #[test]
    fn conditions_are_written_only_when_they_change() {
        let m = machine(MachinePhase::Running, CREATED, healthy_conditions());
        let mut heartbeat = healthy_conditions();
        heartbeat[0].last_heartbeat_time = Some(Time(at(CREATED + 99)));
        let n = node(heartbeat);
        let p = plan(&m, Some(&n), CREATED + 100);
        assert_eq!(p, HealthPlan::nothing(vec![]));

        let mut changed = healthy_conditions();
        changed.push(condition("NetworkUnavailable", "False"));
        let n = node(changed.clone());
        let p = plan(&m, Some(&n), CREATED + 100);
        assert_eq!(p.transition, HealthTransition::None);
        assert_eq!(p.status.unwrap().conditions, Some(changed));
    }

    #[test]
    fn a_preserved_failed_machine_whose_node_recovered_returns_to_running() {
        let n = node(healthy_conditions());
        let mut m = machine(MachinePhase::Failed, CREATED, healthy_conditions());
        m.status.as_mut().unwrap().current_status.preserve_expiry_time = Some(Time(at(CREATED + 3600)));
        let p = plan(&m, Some(&n), CREATED + 10);
        assert_eq!(p.transition, HealthTransition::Joined { first: false });
        let status = p.status.expect("a status");
        assert_eq!(status.phase(), Some(MachinePhase::Running));
        assert_eq!(
            status.current_status.unwrap().preserve_expiry_time.map(|t| t.0),
            Some(at(CREATED + 3600)),
            "the expiry is kept"
        );
    }

    fn in_place_node(result: Option<&str>, reason: Option<&str>) -> Node {
        let mut n = node(healthy_conditions());
        if let Some(result) = result {
            n.metadata.labels = Some(BTreeMap::from([(
                labels::UPDATE_RESULT.to_owned(),
                result.to_owned(),
            )]));
        }
        if let Some(reason) = reason {
            n.metadata.annotations = Some(BTreeMap::from([(
                annotations::UPDATE_FAILED_REASON.to_owned(),
                reason.to_owned(),
            )]));
        }
        n
    }

    #[test]
    fn in_place_updating_is_never_failed_by_the_health_timeout_and_fails_at_the_in_place_timeout() {
        // Unhealthy for far longer than the health timeout: no Unknown, no failure candidate.
        let conditions = vec![condition("Ready", "False")];
        let m = machine(MachinePhase::InPlaceUpdating, CREATED, conditions.clone());
        let n = node(conditions);
        let before = plan(&m, Some(&n), CREATED + 20 * 60 - 1);
        assert_eq!(before.failure_candidate, None);
        assert_eq!(before.status.as_ref().and_then(StatusUpdate::phase), None);
        assert_eq!(before.requeue_after, Some(Duration::from_secs(1)));
        let after = plan(&m, Some(&n), CREATED + 20 * 60);
        assert_eq!(after.failure_candidate, None);
        let status = after.status.unwrap();
        assert_eq!(status.phase(), Some(MachinePhase::InPlaceUpdateFailed));
        let op = status.last_operation.unwrap();
        assert_eq!(op.description, "Machine m-1 failed to in-place update in 20m0s.");
        assert_eq!(op.r#type, Some(MachineOperationType::InPlaceUpdate));
        assert_eq!(op.state, Some(MachineState::Failed));
    }

    #[test]
    fn a_per_machine_in_place_update_timeout_applies() {
        let mut m = machine(MachinePhase::InPlaceUpdating, CREATED, healthy_conditions());
        m.spec.configuration.in_place_update_timeout = Some(GoDuration::new("30s"));
        let n = node(healthy_conditions());
        assert_eq!(plan(&m, Some(&n), CREATED + 29).status, None);
        assert_eq!(
            plan(&m, Some(&n), CREATED + 30).status.unwrap().phase(),
            Some(MachinePhase::InPlaceUpdateFailed)
        );
    }

    #[test]
    fn the_agents_result_moves_an_updating_machine() {
        let m = machine(MachinePhase::InPlaceUpdating, CREATED, healthy_conditions());
        let ok = in_place_node(Some("successful"), None);
        let status = plan(&m, Some(&ok), CREATED + 10).status.unwrap();
        assert_eq!(status.phase(), Some(MachinePhase::InPlaceUpdateSuccessful));
        let op = status.last_operation.unwrap();
        assert_eq!(op.description, "Machine m-1 successfully updated dependencies");
        assert_eq!(op.state, Some(MachineState::Successful));
        assert_eq!(op.r#type, Some(MachineOperationType::InPlaceUpdate));

        let failed = in_place_node(Some("failed"), Some("disk full"));
        let status = plan(&m, Some(&failed), CREATED + 10).status.unwrap();
        assert_eq!(status.phase(), Some(MachinePhase::InPlaceUpdateFailed));
        let op = status.last_operation.unwrap();
        assert_eq!(
            op.description,
            "Machine m-1 failed to update dependencies: disk full"
        );
        assert_eq!(op.state, Some(MachineState::Failed));
    }

    #[test]
    fn in_place_update_failed_stays_whatever_the_health_until_a_success() {
        let conditions = vec![condition("Ready", "False")];
        let m = machine(MachinePhase::InPlaceUpdateFailed, CREATED, conditions.clone());
        let n = node(conditions);
        let p = plan(&m, Some(&n), CREATED + 100_000);
        assert_eq!(p.failure_candidate, None);
        assert_eq!(p.status, None);
        let m = machine(MachinePhase::InPlaceUpdateFailed, CREATED, healthy_conditions());
        let failed = in_place_node(Some("failed"), Some("disk full"));
        assert_eq!(plan(&m, Some(&failed), CREATED + 100_000).status, None);
        let ok = in_place_node(Some("successful"), None);
        assert_eq!(
            plan(&m, Some(&ok), CREATED + 10).status.unwrap().phase(),
            Some(MachinePhase::InPlaceUpdateSuccessful)
        );
    }

    #[test]
    fn in_place_update_successful_with_a_healthy_node_rejoins() {
        let m = machine(
            MachinePhase::InPlaceUpdateSuccessful,
            CREATED,
            healthy_conditions(),
        );
        let p = plan(&m, Some(&node(healthy_conditions())), CREATED + 10);
        assert_eq!(p.transition, HealthTransition::Joined { first: false });
        let status = p.status.unwrap();
        assert_eq!(status.phase(), Some(MachinePhase::Running));
        assert_eq!(
            status.last_operation.unwrap().description,
            "Machine m-1 successfully re-joined the cluster"
        );
        let unhealthy = plan(&m, Some(&node(vec![condition("Ready", "False")])), CREATED + 10);
        assert_eq!(unhealthy.status.and_then(|s| s.phase()), None);
    }

    #[test]
    fn failed_terminating_and_unlabelled_machines_are_left_alone() {
        let n = node(healthy_conditions());
        for phase in [MachinePhase::Failed, MachinePhase::Terminating] {
            let m = machine(phase, CREATED, healthy_conditions());
            assert_eq!(
                plan(&m, Some(&n), CREATED + 10).transition,
                HealthTransition::None
            );
        }
        let mut m = machine(MachinePhase::Pending, CREATED, vec![]);
        m.metadata.labels = None;
        assert_eq!(plan(&m, Some(&n), CREATED + 10), HealthPlan::nothing(vec![]));
    }
}
