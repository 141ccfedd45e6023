//! Tests of the deletion flow, one file per concern; the fixtures shared by them are here.

mod decide;
mod draining;
mod teardown;
mod whole_flow;
mod wire_markers;

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{AttachedVolume, Node, NodeCondition},
    apimachinery::pkg::apis::meta::v1::Time,
};
use mcm_api::{
    Machine, MachinePhase, MachineState, MachineStatus,
    builders::{MachineBuilder, NodeBuilder},
    keys::finalizers,
};
use mcm_driver::{DriverError, MachineCode};

use super::*;
use crate::{
    descriptions::Redactor,
    retry_policy::RetrySettings,
    timeouts::{ControllerSettings, EffectiveSettings, effective_settings},
};

const DELETED: i64 = 1_000_000;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

/// A Running machine `m-1` on `node-1`, deleted at `DELETED`, with our finalizer.
fn machine() -> Machine {
    MachineBuilder::new("m-1")
        .namespace("default")
        .deleting_at(at(DELETED))
        .finalizer(finalizers::MACHINE_CONTROLLER_MANAGER)
        .node("node-1")
        .phase(MachinePhase::Running)
        .phase_since(at(10))
        .preserved_until(at(20))
        .description("Machine m-1 successfully joined the cluster in 1m0s")
        .error_code("ResourceExhausted")
        .build()
}

/// `m` in phase Terminating (since `DELETED`) with `description`.
fn at_step(mut m: Machine, description: &str) -> Machine {
    let status = m.status.get_or_insert_with(MachineStatus::default);
    status.current_status.phase = Some(MachinePhase::Terminating);
    status.current_status.last_update_time = Some(Time(at(DELETED)));
    status.current_status.preserve_expiry_time = None;
    status.last_operation.description = description.into();
    m
}

fn annotated(mut m: Machine, key: &str) -> Machine {
    m.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.into(), String::new());
    m
}

fn unlabelled(mut m: Machine) -> Machine {
    m.metadata.labels = None;
    m
}

fn node(name: &str) -> Node {
    NodeBuilder::new(name)
        .condition("Ready", "True", Some(at(0)))
        .build()
}

fn not_ready(mut n: Node, since: i64) -> Node {
    n.status.as_mut().unwrap().conditions = Some(vec![NodeCondition {
        type_: "Ready".into(),
        status: "Unknown".into(),
        last_transition_time: Some(Time(at(since))),
        ..NodeCondition::default()
    }]);
    n
}

fn with_volumes(mut n: Node) -> Node {
    n.status.as_mut().unwrap().volumes_attached = Some(vec![AttachedVolume {
        name: "kubernetes.io/csi/ebs^vol-1".into(),
        device_path: String::new(),
    }]);
    n
}

struct Fixture {
    settings: EffectiveSettings,
    retry: RetrySettings,
    redactor: Redactor,
    target: bool,
    controller_node: Option<&'static str>,
    failures: u32,
}

impl Fixture {
    fn new() -> Self {
        Self {
            settings: effective_settings(&Machine::default(), &ControllerSettings::default()),
            retry: RetrySettings::default(),
            redactor: Redactor::new(),
            target: true,
            controller_node: None,
            failures: 1,
        }
    }

    fn input<'a>(&'a self, machine: &'a Machine, node: Option<&'a Node>, now: i64) -> DeletionInput<'a> {
        DeletionInput {
            machine,
            node,
            has_target_cluster: self.target,
            now: at(now),
            settings: &self.settings,
            retry: &self.retry,
            controller_node: self.controller_node,
            failures: self.failures,
            random: 0.0,
            redactor: &self.redactor,
        }
    }
}

fn err(code: MachineCode) -> DriverError {
    DriverError::new(code, "boom")
}

fn text(write: Option<&DeletionWrite>) -> String {
    write
        .unwrap()
        .status
        .last_operation
        .as_ref()
        .unwrap()
        .description
        .clone()
}

fn state(write: Option<&DeletionWrite>) -> MachineState {
    write
        .unwrap()
        .status
        .last_operation
        .as_ref()
        .unwrap()
        .state
        .unwrap()
}
