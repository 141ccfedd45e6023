//! A planned change of a machine's status, shared by the creation and health decisions.
//!
//! Decisions return a [`StatusUpdate`]; the controller writes it (for example as the JSON merge patch of
//! [`StatusUpdate::merge_patch`] on the `status` subresource) only when [`StatusUpdate::changes`] says it changes
//! something, so that a repeated reconcile writes nothing.

use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{NodeAddress, NodeCondition},
    apimachinery::pkg::apis::meta::v1::Time,
};
use mcm_api::{
    CurrentStatus, LastOperation, MachineOperationType, MachinePhase, MachineState, MachineStatus,
};
use serde_json::{Map, Value, json};

use crate::descriptions::Description;

/// New values for parts of `status`; `None` leaves a part as it is.
#[derive(Clone, Debug, Default, PartialEq)]
#[must_use]
pub struct StatusUpdate {
    /// The new `lastOperation`, replacing the old one whole.
    pub last_operation: Option<LastOperation>,
    /// The new `currentStatus`, replacing the old one whole.
    pub current_status: Option<CurrentStatus>,
    /// The new `lastKnownState` (an empty string removes it).
    pub last_known_state: Option<String>,
    /// The new `conditions`, copied from the node.
    pub conditions: Option<Vec<NodeCondition>>,
    /// The new `addresses` (only without a target cluster).
    pub addresses: Option<Vec<NodeAddress>>,
}

impl StatusUpdate {
    /// A failed Create lastOperation saying `description` at `now`, the phase left as it is: what a machine shows
    /// whose creation cannot start (invalid machine or class, a missing Secret, a failed class migration) until its
    /// inputs change. Its `errorCode` is cleared: a provider's code belongs to the provider error it came with.
    pub fn creation_blocked(description: &Description, now: Timestamp) -> Self {
        Self {
            last_operation: Some(operation(
                description,
                MachineState::Failed,
                Some(MachineOperationType::Create),
                None,
                now,
            )),
            ..Self::default()
        }
    }

    /// The phase this update sets, if it sets one.
    pub fn phase(&self) -> Option<MachinePhase> {
        self.current_status.as_ref().and_then(|c| c.phase)
    }

    /// The text of the description this update writes (empty when it writes none): an Event's message.
    pub fn description_text(&self) -> &str {
        self.last_operation
            .as_ref()
            .map_or("", |op| op.description.as_str())
    }

    /// The description this update writes, parsed, if it writes one of [`Description`]'s.
    pub fn description(&self) -> Option<Description> {
        self.last_operation
            .as_ref()
            .and_then(|op| Description::parse(&op.description))
    }

    /// Applies the update to a status (what the API server does with [`StatusUpdate::merge_patch`]).
    pub fn apply(&self, status: &mut MachineStatus) {
        if let Some(op) = &self.last_operation {
            status.last_operation = op.clone();
        }
        if let Some(current) = &self.current_status {
            status.current_status = current.clone();
        }
        if let Some(state) = &self.last_known_state {
            status.last_known_state.clone_from(state);
        }
        if let Some(conditions) = &self.conditions {
            status.conditions.clone_from(conditions);
        }
        if let Some(addresses) = &self.addresses {
            status.addresses.clone_from(addresses);
        }
    }

    /// Whether writing the update would change the status. The time of the last operation is ignored, so that the
    /// same error seen again is not written again (the reference damps repeated cloud errors the same way);
    /// `currentStatus` is compared whole, because its time is the health timer.
    pub fn changes(&self, status: Option<&MachineStatus>) -> bool {
        let empty = MachineStatus::default();
        let status = status.unwrap_or(&empty);
        let op_changes = self.last_operation.as_ref().is_some_and(|op| {
            let old = &status.last_operation;
            op.description != old.description
                || op.error_code != old.error_code
                || op.state != old.state
                || op.r#type != old.r#type
        });
        op_changes
            || self
                .current_status
                .as_ref()
                .is_some_and(|c| *c != status.current_status)
            || self
                .last_known_state
                .as_ref()
                .is_some_and(|s| *s != status.last_known_state)
            || self.conditions.as_ref().is_some_and(|c| *c != status.conditions)
            || self.addresses.as_ref().is_some_and(|a| *a != status.addresses)
    }

    /// The JSON merge patch (RFC 7386) for the machine's `status` subresource: `{"status": {...}}`. Replaced objects
    /// carry an explicit `null` for every field they no longer have, so the patch replaces rather than merges.
    pub fn merge_patch(&self) -> Value {
        let mut status = Map::new();
        if let Some(op) = &self.last_operation {
            status.insert(
                "lastOperation".into(),
                whole(
                    op,
                    &["description", "errorCode", "lastUpdateTime", "state", "type"],
                ),
            );
        }
        if let Some(current) = &self.current_status {
            status.insert(
                "currentStatus".into(),
                whole(
                    current,
                    &["phase", "timeoutActive", "lastUpdateTime", "preserveExpiryTime"],
                ),
            );
        }
        if let Some(state) = &self.last_known_state {
            let value = if state.is_empty() {
                Value::Null
            } else {
                json!(state)
            };
            status.insert("lastKnownState".into(), value);
        }
        if let Some(conditions) = &self.conditions {
            status.insert("conditions".into(), to_value(conditions));
        }
        if let Some(addresses) = &self.addresses {
            status.insert("addresses".into(), to_value(addresses));
        }
        json!({ "status": status })
    }
}

fn to_value<T: serde::Serialize>(value: &T) -> Value {
    // The API types serialize to JSON without failing (string keys, no non-finite floats).
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// The object serialized with `null` for each of `fields` it leaves out.
fn whole<T: serde::Serialize>(value: &T, fields: &[&str]) -> Value {
    let mut value = to_value(value);
    if let Value::Object(map) = &mut value {
        for field in fields {
            map.entry(*field).or_insert(Value::Null);
        }
    }
    value
}

/// A last operation at `now`.
pub(crate) fn operation(
    description: &Description,
    state: MachineState,
    r#type: Option<MachineOperationType>,
    error_code: Option<mcm_driver::MachineCode>,
    now: Timestamp,
) -> LastOperation {
    LastOperation {
        description: description.to_string(),
        error_code: error_code.map(|code| code.name().to_owned()).unwrap_or_default(),
        last_update_time: Some(Time(now)),
        state: Some(state),
        r#type,
    }
}

/// The current status for `phase`: when the phase does not change, its time is kept (it is the health timer and the
/// drain timer); a new phase starts at `now`. `preserveExpiryTime` is kept.
pub(crate) fn phase_status(
    existing: Option<&MachineStatus>,
    phase: MachinePhase,
    timeout_active: bool,
    now: Timestamp,
) -> CurrentStatus {
    let old = existing.map(|s| &s.current_status);
    let last_update_time = match old {
        Some(old) if old.phase == Some(phase) && old.last_update_time.is_some() => {
            old.last_update_time.clone()
        }
        _ => Some(Time(now)),
    };
    CurrentStatus {
        phase: Some(phase),
        timeout_active,
        last_update_time,
        preserve_expiry_time: old.and_then(|o| o.preserve_expiry_time.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    #[test]
    fn same_phase_keeps_its_timer_and_a_new_phase_starts_one() {
        let mut status = MachineStatus::default();
        status.current_status.phase = Some(MachinePhase::Unknown);
        status.current_status.last_update_time = Some(Time(at(100)));
        let same = phase_status(Some(&status), MachinePhase::Unknown, false, at(500));
        assert_eq!(same.last_update_time, Some(Time(at(100))));
        let other = phase_status(Some(&status), MachinePhase::Running, false, at(500));
        assert_eq!(other.last_update_time, Some(Time(at(500))));
    }

    #[test]
    fn the_same_error_again_is_not_a_change() {
        let description = Description::CreatingMachine;
        let first = StatusUpdate {
            last_operation: Some(operation(
                &description,
                MachineState::Processing,
                Some(MachineOperationType::Create),
                None,
                at(1),
            )),
            ..StatusUpdate::default()
        };
        let mut status = MachineStatus::default();
        assert!(first.changes(Some(&status)));
        first.apply(&mut status);
        let again = StatusUpdate {
            last_operation: Some(operation(
                &description,
                MachineState::Processing,
                Some(MachineOperationType::Create),
                None,
                at(99),
            )),
            ..StatusUpdate::default()
        };
        assert!(!again.changes(Some(&status)));
    }

    #[test]
    fn a_blocked_creation_keeps_the_phase_and_is_written_once() {
        let description = Description::InvalidSpec {
            problems: "spec.class.name: Required value".into(),
        };
        let update = StatusUpdate::creation_blocked(&description, at(7));
        let patch = update.merge_patch();
        assert!(patch["status"].get("currentStatus").is_none(), "{patch}");
        assert_eq!(patch["status"]["lastOperation"]["state"], "Failed");
        assert_eq!(patch["status"]["lastOperation"]["type"], "Create");
        assert_eq!(
            patch["status"]["lastOperation"]["description"],
            "Invalid machine or class: spec.class.name: Required value"
        );
        let mut status = MachineStatus::default();
        status.current_status.phase = Some(MachinePhase::CrashLoopBackOff);
        assert!(update.changes(Some(&status)));
        update.apply(&mut status);
        assert_eq!(status.current_status.phase, Some(MachinePhase::CrashLoopBackOff));
        assert!(!StatusUpdate::creation_blocked(&description, at(60)).changes(Some(&status)));
        assert_eq!(update.description(), Some(description));
    }

    #[test]
    fn merge_patch_replaces_objects_whole() {
        let update = StatusUpdate {
            last_operation: Some(operation(
                &Description::CreatingMachine,
                MachineState::Processing,
                Some(MachineOperationType::Create),
                None,
                at(0),
            )),
            last_known_state: Some(String::new()),
            ..StatusUpdate::default()
        };
        let patch = update.merge_patch();
        assert_eq!(patch["status"]["lastOperation"]["errorCode"], Value::Null);
        assert_eq!(
            patch["status"]["lastOperation"]["description"],
            "Creating machine on cloud provider"
        );
        assert_eq!(patch["status"]["lastOperation"]["type"], "Create");
        assert_eq!(patch["status"]["lastKnownState"], Value::Null);
        assert!(patch["status"].get("currentStatus").is_none());

        // Applied as a merge patch over an old status with an error code, the error code goes.
        let mut old =
            json!({"status": {"lastOperation": {"errorCode": "ResourceExhausted", "description": "x"}}});
        json_patch::merge(&mut old, &patch);
        assert!(old["status"]["lastOperation"].get("errorCode").is_none());
    }
}
