//! Tests of the MachineDeployment arithmetic, one file per concern; the fixtures shared by them are here.

mod fenceposts;
mod hash;
mod history;
mod in_place;
mod progress;
mod simulated;
mod step;

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString};
use mcm_api::{ClassSpec, MachineSpec, MachineTemplateSpec, StrategyType};

use super::*;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).unwrap()
}

fn template(class: &str) -> MachineTemplateSpec {
    MachineTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
            ..ObjectMeta::default()
        }),
        spec: MachineSpec {
            class: ClassSpec {
                kind: "MachineClass".into(),
                name: class.into(),
                ..ClassSpec::default()
            },
            ..MachineSpec::default()
        },
    }
}

fn view(name: &str, created: i64, replicas: i32, actual: i32, available: i32) -> SetView {
    SetView {
        name: name.into(),
        created: Some(at(created)),
        replicas,
        actual,
        live: actual,
        ready: available,
        available,
        desired_replicas: None,
        max_replicas: None,
        revision: None,
        scale_up_disabled: false,
    }
}

fn annotated(mut set: SetView, replicas: i32, fp: Fenceposts) -> SetView {
    set.desired_replicas = Some(replicas);
    set.max_replicas = Some(replicas + fp.max_surge);
    set
}

fn fp(max_surge: i32, max_unavailable: i32) -> Fenceposts {
    Fenceposts {
        max_surge,
        max_unavailable,
    }
}

fn scales(plan: &[Scale]) -> Vec<(&str, i32)> {
    plan.iter().map(|s| (s.name.as_str(), s.replicas)).collect()
}

fn pct(text: &str) -> IntOrString {
    IntOrString::String(text.into())
}

fn input<'a>(
    replicas: i32,
    strategy: StrategyType,
    f: Fenceposts,
    new: Option<&'a SetView>,
    old: &'a [SetView],
) -> RolloutInput<'a> {
    RolloutInput {
        replicas,
        strategy,
        fenceposts: f,
        paused: false,
        new,
        old,
    }
}
