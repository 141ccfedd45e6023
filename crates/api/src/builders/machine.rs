//! [`MachineBuilder`]: a Machine for a test.

use k8s_openapi::{api::core::v1::NodeCondition, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

use super::meta::builder;
use crate::{
    Machine, MachineOperationType, MachinePhase, MachineSpec, MachineState, MachineStatus, keys::labels,
};

builder!(
    /// Builds a [`Machine`]:
    /// `MachineBuilder::new("m1").namespace("ns").phase(MachinePhase::Running).node("n1").build()`.
    /// The status exists as soon as one status call is made, and not before.
    MachineBuilder,
    machine: Machine
);

impl MachineBuilder {
    /// Made from the MachineClass `name` (`spec.class` kind `MachineClass`).
    #[must_use]
    pub fn class(mut self, name: &str) -> Self {
        "MachineClass".clone_into(&mut self.machine.spec.class.kind);
        name.clone_into(&mut self.machine.spec.class.name);
        self
    }

    /// Sets `spec.providerID`.
    #[must_use]
    pub fn provider_id(mut self, id: &str) -> Self {
        id.clone_into(&mut self.machine.spec.provider_id);
        self
    }

    /// Replaces the whole spec (a set's template spec, for one).
    #[must_use]
    pub fn spec(mut self, spec: MachineSpec) -> Self {
        self.machine.spec = spec;
        self
    }

    /// Labels the machine with its node's name (the `node` label, the machine-to-node link).
    #[must_use]
    pub fn node(self, node: &str) -> Self {
        self.label(labels::NODE, node)
    }

    /// Sets the phase; `None` leaves it unset (a new machine) but still creates the status.
    #[must_use]
    pub fn phase(mut self, phase: impl Into<Option<MachinePhase>>) -> Self {
        self.status_mut().current_status.phase = phase.into();
        self
    }

    /// Sets when the phase last changed (`currentStatus.lastUpdateTime`).
    #[must_use]
    pub fn phase_since(mut self, at: Timestamp) -> Self {
        self.status_mut().current_status.last_update_time = Some(Time(at));
        self
    }

    /// Sets when preservation ends (`currentStatus.preserveExpiryTime`).
    #[must_use]
    pub fn preserved_until(mut self, at: Timestamp) -> Self {
        self.status_mut().current_status.preserve_expiry_time = Some(Time(at));
        self
    }

    /// Sets the type and state of the last operation.
    #[must_use]
    pub fn operation(mut self, r#type: MachineOperationType, state: MachineState) -> Self {
        let operation = &mut self.status_mut().last_operation;
        operation.r#type = Some(r#type);
        operation.state = Some(state);
        self
    }

    /// Sets the last operation's description.
    #[must_use]
    pub fn description(mut self, description: &str) -> Self {
        description.clone_into(&mut self.status_mut().last_operation.description);
        self
    }

    /// Sets the last operation's error code.
    #[must_use]
    pub fn error_code(mut self, code: &str) -> Self {
        code.clone_into(&mut self.status_mut().last_operation.error_code);
        self
    }

    /// Sets the node conditions copied into the status.
    #[must_use]
    pub fn conditions(mut self, conditions: Vec<NodeCondition>) -> Self {
        self.status_mut().conditions = conditions;
        self
    }

    /// Replaces the whole status.
    #[must_use]
    pub fn status(mut self, status: MachineStatus) -> Self {
        self.machine.status = Some(status);
        self
    }

    fn status_mut(&mut self) -> &mut MachineStatus {
        self.machine.status.get_or_insert_default()
    }
}
