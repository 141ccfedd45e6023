//! Tests of the MachineSet decisions, one file per concern; the fixtures shared by them are here.

mod deletion_order;
mod expectations;
mod lagging_cache;
mod ownership;
mod plan;
mod properties;
mod status;
mod template;

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mcm_api::{
    Machine, MachinePhase, MachineSet,
    builders::{MachineBuilder, MachineSetBuilder},
    keys::finalizers,
};
use serde_json::Value;

use super::*;
use crate::machineset::common::name_of;

const SET_UID: &str = "uid-ms";

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

fn app_labels() -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_owned(), "web".to_owned())])
}

fn set(replicas: i32) -> MachineSet {
    MachineSetBuilder::new("ms")
        .namespace("ns")
        .uid(SET_UID)
        .generation(4)
        .finalizer(finalizers::MACHINE_CONTROLLER_MANAGER)
        .replicas(replicas)
        .matching([("app", "web")])
        .class("small")
        .build()
}

fn machine(name: &str, phase: Option<MachinePhase>) -> Machine {
    MachineBuilder::new(name)
        .namespace("ns")
        .uid(&format!("uid-{name}"))
        .labels([("app", "web")])
        .created_at(at(100))
        .owned_by(&set(1))
        .class("small")
        .phase(phase)
        .phase_since(at(100))
        .build()
}

fn annotate(m: &mut Machine, key: &str, value: &str) {
    m.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.into(), value.into());
}

fn running(name: &str) -> Machine {
    machine(name, Some(MachinePhase::Running))
}

fn plan_for(set: &MachineSet, machines: &[Machine], expectations: &Expectations) -> MachineSetPlan {
    let refs: Vec<&Machine> = machines.iter().collect();
    decide(&MachineSetInput {
        set,
        machines: &refs,
        expectations,
        deployment_delete_policy: None,
        now: at(1000),
        random: 7,
    })
}

fn deleted(plan: &MachineSetPlan) -> Vec<(&str, DeletionReason)> {
    plan.delete.iter().map(|d| (d.name.as_str(), d.reason)).collect()
}

fn annotate_set(set: &mut MachineSet, key: &str, value: &str) {
    set.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.into(), value.into());
}
fn names<'a>(machines: &[&'a Machine]) -> Vec<&'a str> {
    machines.iter().map(|m| name_of(m)).collect()
}

fn sorted<'a>(order: &DeletionOrder, machines: &'a [Machine]) -> Vec<&'a str> {
    let mut refs: Vec<&Machine> = machines.iter().collect();
    order.sort(&mut refs);
    names(&refs)
}

fn created(mut m: Machine, second: i64) -> Machine {
    m.metadata.creation_timestamp = Some(Time(at(second)));
    m
}

fn apply_patch(machine: &Machine, patch: &Value) -> Machine {
    let mut object = serde_json::to_value(machine).unwrap();
    json_patch::merge(&mut object, patch);
    serde_json::from_value(object).unwrap()
}
