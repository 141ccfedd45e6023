//! Tests of the drain decisions, one file per concern; the fixtures shared by them are here.

mod disruption_budgets;
mod force;
mod outcome;
mod pod_selection;
mod volumes;

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{NodeCondition, PersistentVolumeClaimVolumeSource, Pod, PodSpec, Volume},
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

fn pod(name: &str) -> Pod {
    PodBuilder::new(name)
        .namespace("default")
        .uid(&format!("uid-{name}"))
        .node("node-1")
        .build()
}

fn labelled(mut p: Pod, key: &str, value: &str) -> Pod {
    p.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(key.into(), value.into());
    p
}

fn with_claim(mut p: Pod, claim: &str) -> Pod {
    p.spec
        .get_or_insert_with(PodSpec::default)
        .volumes
        .get_or_insert_with(Vec::new)
        .push(Volume {
            name: format!("vol-{claim}"),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                read_only: None,
            }),
            ..Volume::default()
        });
    p
}

fn with_priority(mut p: Pod, priority: i32) -> Pod {
    p.spec.get_or_insert_with(PodSpec::default).priority = Some(priority);
    p
}

fn names(pods: &[PodRef]) -> Vec<&str> {
    pods.iter().map(|p| p.name.as_str()).collect()
}
