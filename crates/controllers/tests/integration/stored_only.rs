//! What the reference accepts and this project only stores is never silently ignored (issue 23, part 5):
//! - a MachineDeployment with an InPlaceUpdate strategy we refuse (an unknown orchestration type) stored by a server
//!   without our admission (a cluster with only the CRDs) is held: no MachineSet is ever created, its conditions name
//!   `spec.strategy.inPlaceUpdate.orchestrationType` and the reason, and a Warning Event says so;
//! - a setting that is stored but has no effect (the label `force-drain` on a preserved machine) gets one Warning
//!   Event naming it. (Preservation and the in-place update timeout, warned about here before they were
//!   implemented, have their own tests: preservation.rs, in_place_machine.rs.)

use crate::support;

use k8s_openapi::api::core::v1::Event;
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use mcm_api::{ConditionStatus, MachineDeployment, MachineDeploymentConditionType, MachineSet};
use mcm_controllers::machinedeployment;
use serde_json::{Value, json};
use support::{CLASS, Cluster, History, NAMESPACE, wait_for};

/// A deployment of `replicas` machines of [`CLASS`] named `name`, with `spec` merged over the usual fields.
fn deployment(name: &str, replicas: i32, spec: &Value) -> MachineDeployment {
    let mut value = json!({
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "pool": name } },
            "template": {
                "metadata": { "labels": { "pool": name } },
                "spec": { "class": { "kind": "MachineClass", "name": CLASS } }
            }
        }
    });
    for (key, field) in spec.as_object().expect("an object") {
        value["spec"][key] = field.clone();
    }
    serde_json::from_value(value).expect("a deployment")
}

/// The Warning Events about the MachineDeployment `name` with `reason`, as their messages.
async fn warnings(client: &Client, name: &str, reason: &str) -> Vec<String> {
    warnings_about(client, "MachineDeployment", name, reason).await
}

/// The Warning Events about the object `name` of `kind` with `reason`, as their messages.
async fn warnings_about(client: &Client, kind: &str, name: &str, reason: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .expect("events are listed")
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some(kind)
                && e.involved_object.name.as_deref() == Some(name)
                && e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some(reason)
        })
        .map(|e| e.message.unwrap_or_default())
        .collect()
}

/// On a cluster without our admission an InPlaceUpdate deployment with an unknown orchestration type is stored; the
/// controller holds it before creating any MachineSet (the reference refuses it in its validation too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_update_deployment_is_held_with_a_clear_condition_and_no_set() {
    let mut cluster = Cluster::start_with_admission(support::settings(), false).await;
    cluster.create_class().await;
    let deployments: Api<MachineDeployment> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let sets: Api<MachineSet> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let set_history = History::start(sets.clone()).await;
    cluster.start_set_controllers(machinedeployment::Config::new(NAMESPACE));
    let spec = json!({ "strategy": { "type": "InPlaceUpdate", "inPlaceUpdate": { "orchestrationType": "Rolling" } } });
    deployments
        .create(&PostParams::default(), &deployment("inplace", 2, &spec))
        .await
        .expect("stored without admission");

    let held = wait_for("the deployment to be held as invalid", async || {
        let deployment = deployments.get("inplace").await.ok()?;
        let conditions = deployment.status?.conditions;
        let failure = conditions.iter().find(|c| {
            c.r#type == MachineDeploymentConditionType::ReplicaFailure && c.status == ConditionStatus::True
        })?;
        Some((failure.reason.clone(), failure.message.clone(), conditions))
    })
    .await;
    let (reason, message, conditions) = held;
    assert_eq!(reason, "InvalidSpec");
    assert!(
        message.contains("spec.strategy.inPlaceUpdate.orchestrationType")
            && message.contains("Unsupported value: \"Rolling\""),
        "{message}"
    );
    for type_ in [
        MachineDeploymentConditionType::Available,
        MachineDeploymentConditionType::Progressing,
    ] {
        let condition = conditions
            .iter()
            .find(|c| c.r#type == type_)
            .unwrap_or_else(|| panic!("a {type_:?} condition: {conditions:?}"));
        assert_eq!(
            (condition.status, condition.reason.as_str()),
            (ConditionStatus::False, "InvalidSpec")
        );
    }
    let events = wait_for("the InvalidSpec Warning Event", async || {
        let events = warnings(&cluster.client, "inplace", "InvalidSpec").await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].contains("spec.strategy.inPlaceUpdate.orchestrationType"),
        "{events:?}"
    );

    // A valid deployment created afterwards gets its set: the controller has gone past the held one by then.
    deployments
        .create(&PostParams::default(), &deployment("rolling", 1, &json!({})))
        .await
        .unwrap();
    wait_for("the valid deployment's set", async || {
        set_history
            .versions()
            .iter()
            .any(|s| {
                s.object
                    .metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("rolling-"))
            })
            .then_some(())
    })
    .await;
    let for_in_place: Vec<String> = set_history
        .versions()
        .iter()
        .filter_map(|s| s.object.metadata.name.clone())
        .filter(|n| n.starts_with("inplace"))
        .collect();
    assert!(
        for_in_place.is_empty(),
        "sets made for the held deployment: {for_in_place:?}"
    );
    cluster.stop().await;
}

/// The template's `inPlaceUpdateTimeout` works (the machine side of in-place updates): no `NoEffect` warning. The
/// label `force-drain` is read by the in-place update drain only, so on a preserved machine it gets one Warning
/// Event `NoEffect` naming it; the machines are created as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_force_drain_label_on_a_preserved_machine_gets_one_no_effect_warning() {
    let mut cluster = Cluster::start_with_admission(support::settings(), true).await;
    cluster.create_class().await;
    cluster.start_set_controllers(machinedeployment::Config::new(NAMESPACE));
    let deployments: Api<MachineDeployment> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    deployments
        .create(
            &PostParams::default(),
            &deployment(
                "keep",
                2,
                &json!({ "template": {
                    "metadata": {
                        "labels": { "pool": "keep", "force-drain": "True" },
                        "annotations": { "node.machine.sapcloud.io/preserve": "when-failed" }
                    },
                    "spec": { "class": { "kind": "MachineClass", "name": CLASS }, "inPlaceUpdateTimeout": "5m" }
                } }),
            ),
        )
        .await
        .unwrap();
    // The deployment's status counts both machines: it has been through several passes by then.
    wait_for("the deployment's 2 machines counted", async || {
        let status = deployments.get("keep").await.ok()?.status?;
        (status.replicas == 2).then_some(())
    })
    .await;
    assert!(warnings(&cluster.client, "keep", "NoEffect").await.is_empty());
    let machines: Api<mcm_api::Machine> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let names: Vec<String> = machines
        .list(&ListParams::default().labels("pool=keep"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    for name in &names {
        let events = wait_for("the machine's NoEffect warning", async || {
            let events = warnings_about(&cluster.client, "Machine", name, "NoEffect").await;
            (!events.is_empty()).then_some(events)
        })
        .await;
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(
            events[0].contains("metadata.labels[force-drain]") && !events[0].contains("inPlaceUpdateTimeout"),
            "{events:?}"
        );
    }
    cluster.stop().await;
}
