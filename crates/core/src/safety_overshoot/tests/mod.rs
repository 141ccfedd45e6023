//! Tests of the overshoot safety decisions, one file per concern; the fixtures shared by them are here.

mod deployments;
mod properties;
mod sets;
mod thresholds;

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::{
    Resource as _,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use mcm_api::{
    ConditionStatus, Machine, MachineDeployment, MachineSet, MachineSetCondition, MachineSetConditionType,
    builders::{MachineBuilder, MachineDeploymentBuilder, MachineSetBuilder},
    keys::{annotations, labels},
};
use serde_json::Value;

use super::*;
use crate::{machineset::FREEZE_VALUE, safety_overshoot::common::name_of};

const NS: &str = "default";

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

fn owner(kind: &str, name: &str, uid: &str, controller: bool) -> OwnerReference {
    OwnerReference {
        api_version: mcm_api::API_VERSION.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(controller),
        block_owner_deletion: None,
    }
}

fn set(name: &str, replicas: i32) -> MachineSet {
    MachineSetBuilder::new(name)
        .namespace(NS)
        .uid(&format!("uid-{name}"))
        .resource_version("7")
        .replicas(replicas)
        .matching([("pool", name)])
        .build()
}

fn owned_set(name: &str, replicas: i32, deployment: &str) -> MachineSet {
    let mut s = set(name, replicas);
    s.metadata.owner_references = Some(vec![owner(
        MachineDeployment::KIND,
        deployment,
        &format!("uid-{deployment}"),
        true,
    )]);
    s
}

fn deployment(name: &str, replicas: i32, max_surge: Option<Value>) -> MachineDeployment {
    let deployment = MachineDeploymentBuilder::new(name)
        .namespace(NS)
        .uid(&format!("uid-{name}"))
        .resource_version("9")
        .replicas(replicas);
    match max_surge {
        Some(surge) => deployment
            .strategy("RollingUpdate")
            .max_surge(serde_json::from_value(surge).unwrap()),
        None => deployment,
    }
    .build()
}

fn machines_of(set: &MachineSet, n: usize) -> Vec<Machine> {
    let name = name_of(&set.metadata);
    (0..n)
        .map(|i| {
            MachineBuilder::new(&format!("{name}-{i}"))
                .namespace(NS)
                .labels([("pool", name)])
                .owner(owner(MachineSet::KIND, name, "x", true))
                .build()
        })
        .collect()
}

fn freeze_label(meta: &mut ObjectMeta) {
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::FREEZE.into(), FREEZE_VALUE.into());
}

fn annotate_unfreeze(meta: &mut ObjectMeta) {
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(annotations::UNFREEZE.into(), "True".into());
}

fn frozen_set_condition(set: &mut MachineSet) {
    set.status
        .get_or_insert_default()
        .conditions
        .push(MachineSetCondition {
            r#type: MachineSetConditionType::Frozen,
            status: ConditionStatus::True,
            last_transition_time: None,
            reason: reasons::OVERSHOOTING_REPLICA_COUNT.into(),
            message: "old".into(),
        });
}

fn run(sets: &[&MachineSet], deployments: &[&MachineDeployment], machines: &[Machine]) -> Plan {
    run_with(sets, deployments, machines, Settings::default())
}

fn run_with(
    sets: &[&MachineSet],
    deployments: &[&MachineDeployment],
    machines: &[Machine],
    settings: Settings,
) -> Plan {
    let machines: Vec<&Machine> = machines.iter().collect();
    plan(&Input {
        sets,
        deployments,
        machines: &machines,
        settings,
        now: at(1000),
    })
}

fn write<'a>(plan: &'a Plan, kind: ObjectKind, name: &str) -> Option<&'a Write> {
    plan.writes.iter().find(|w| w.kind == kind && w.name == name)
}

type Change = Box<dyn Fn(&mut Machine)>;
