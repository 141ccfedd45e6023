//! Tests of the drain decisions, one file per concern; the fixtures shared by them are here.

mod disruption_budgets;
mod force;
mod outcome;
mod pod_selection;
mod volumes;

use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{NodeCondition, Pod},
    apimachinery::pkg::apis::meta::v1::Time,
};
use mcm_api::{
    Machine,
    builders::{MachineBuilder, PodBuilder},
};

use super::*;
use crate::timeouts::{ControllerSettings, EffectiveSettings, effective_settings};

const DELETED: i64 = 1_000_000;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

fn settings() -> EffectiveSettings {
    effective_settings(&Machine::default(), &ControllerSettings::default())
}

fn deleted_machine() -> Machine {
    MachineBuilder::new("m-1").deleting_at(at(DELETED)).build()
}

fn condition(type_: &str, status: &str, since: Option<i64>) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        last_transition_time: since.map(|s| Time(at(s))),
        ..NodeCondition::default()
    }
}

/// A pod `default/<name>` bound to `node-1`, to add to before building.
fn bound(name: &str) -> PodBuilder {
    PodBuilder::new(name)
        .namespace("default")
        .uid(&format!("uid-{name}"))
        .node("node-1")
}

fn pod(name: &str) -> Pod {
    bound(name).build()
}

fn names(pods: &[PodRef]) -> Vec<&str> {
    pods.iter().map(|p| p.name.as_str()).collect()
}
