//! The machine side of an in-place update (reference v0.58+, docs/in-place-update-machine.md) with the machine and
//! MachineSet controllers, the sim provider and its kubelet as the node agent, over real HTTP. The test puts the
//! node labels `candidate-for-update` and `selected-for-update` itself, as the deployment side does; the
//! MachineDeployment that owns the set is stored, not reconciled, and names the class to update to.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::{
    Machine, MachineDeployment, MachinePhase, MetaExt as _,
    builders::{MachineDeploymentBuilder, MachineSetBuilder},
    keys::{in_place_update as reasons, kubernetes::INSTANCE_TYPE_LABEL, labels, node_conditions},
};
use serde_json::json;
use support::{CLASS, Cluster, History, NAMESPACE, node_label, set_config, settings, wait_for, watch_window};

/// The class the deployment names: the target of the update.
const TARGET_CLASS: &str = "sim-medium";

/// The reason and message of the node's `InPlaceUpdate` condition.
fn in_place(node: &Node) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == node_conditions::IN_PLACE_UPDATE)
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// The distinct reasons the node's condition went through, in order.
fn reasons_seen(history: &History<Node>, node: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for version in history.versions() {
        if version.object.name_any() != node {
            continue;
        }
        if let Some((reason, _)) = in_place(&version.object)
            && seen.last() != Some(&reason)
        {
            seen.push(reason);
        }
    }
    seen
}

/// The distinct phases the machine went through, in order.
fn phases_seen(history: &History<Machine>, machine: &str) -> Vec<MachinePhase> {
    let mut seen = Vec::new();
    for version in history.versions() {
        if version.object.name_any() != machine {
            continue;
        }
        if let Some(phase) = version.object.phase()
            && seen.last() != Some(&phase)
        {
            seen.push(phase);
        }
    }
    seen
}

/// A cluster with classes `sim-small` and `sim-medium`, a MachineDeployment `workers` (stored only) naming
/// `sim-medium`, and its MachineSet `workers-1` of one machine of `sim-small`; returns the machine once Running.
async fn one_machine_to_update(cluster: &mut Cluster) -> Machine {
    cluster.create_class().await;
    cluster
        .create_sim_class(
            TARGET_CLASS,
            json!({
                "vmPool": "pool",
                "size": "medium",
                "tags": { "kubernetes.io/cluster/test": "1", "kubernetes.io/role/node": "1" }
            }),
        )
        .await;
    let deployment = Api::<MachineDeployment>::namespaced(cluster.client.clone(), NAMESPACE)
        .create(
            &PostParams::default(),
            &MachineDeploymentBuilder::new("workers")
                .replicas(1)
                .matching([("pool", "workers")])
                .class(TARGET_CLASS)
                .build(),
        )
        .await
        .expect("the deployment is created");
    let set = MachineSetBuilder::new("workers-1")
        .replicas(1)
        .matching([("pool", "workers")])
        .class(CLASS)
        .owned_by(&deployment)
        .build();
    cluster
        .sets()
        .create(&PostParams::default(), &set)
        .await
        .expect("the set is created");
    cluster.start_set_controller(set_config());
    wait_for("the set's machine Running", async || {
        let list = cluster.machines().list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|m| m.phase() == Some(MachinePhase::Running) && node_label(m).is_some())
    })
    .await
}

async fn label_node(cluster: &Cluster, node: &str, key: &str) {
    cluster
        .nodes()
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key: "true"}}})),
        )
        .await
        .expect("the node is labelled");
}

async fn wait_node(cluster: &Cluster, name: &str, what: &str, check: impl Fn(&Node) -> bool) -> Node {
    wait_for(&format!("node {name}: {what}"), async || {
        cluster.nodes().get_opt(name).await.ok().flatten().filter(&check)
    })
    .await
}

/// Candidate, then selected (as the deployment side labels nodes).
async fn select(cluster: &Cluster, node: &str) {
    label_node(cluster, node, labels::CANDIDATE_FOR_UPDATE).await;
    wait_node(cluster, node, "CandidateForUpdate", |n| {
        in_place(n).is_some_and(|(r, _)| r == reasons::CANDIDATE_FOR_UPDATE)
    })
    .await;
    label_node(cluster, node, labels::SELECTED_FOR_UPDATE).await;
}

/// Two pods on `node` that end at once when deleted: `work` (to be evicted) and `agent`, controlled by a DaemonSet
/// (to stay).
async fn create_pods(cluster: &Cluster, node: &str) -> Api<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    for (pod, daemon) in [("work", false), ("agent", true)] {
        let mut value = json!({
            "metadata": {"name": pod},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "i"}]}
        });
        if daemon {
            value["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "ds-uid", "controller": true
            }]);
        }
        pods.create(&PostParams::default(), &serde_json::from_value(value).unwrap())
            .await
            .expect("the pod is created");
    }
    pods
}

/// The whole protocol: the condition goes CandidateForUpdate → SelectedForUpdate → DrainSuccessful →
/// ReadyForUpdate → UpdateSuccessful; the node is cordoned and its pod evicted (a DaemonSet pod stays); the machine
/// goes InPlaceUpdating → InPlaceUpdateSuccessful (then Running again, re-joined); the VM is the same one (same
/// providerID, no other machine ever), and the node reports the new class's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selected_node_is_drained_updated_in_place_and_keeps_its_vm() {
    let mut settings = settings();
    settings.evict_retry_interval = Duration::from_millis(200);
    let mut cluster = Cluster::start(settings).await;
    let machines = History::<Machine>::start(cluster.machines()).await;
    let nodes = History::<Node>::start(cluster.nodes()).await;
    let machine = one_machine_to_update(&mut cluster).await;
    let name = machine.name_any();
    let node = node_label(&machine).expect("a node").to_owned();
    let provider_id = machine.spec.provider_id.clone();
    let before = cluster.nodes().get(&node).await.unwrap();
    assert_eq!(
        before.labels().get(INSTANCE_TYPE_LABEL).map(String::as_str),
        Some("small")
    );

    let pods = create_pods(&cluster, &node).await;

    select(&cluster, &node).await;
    let updated = wait_node(&cluster, &node, "UpdateSuccessful", |n| {
        in_place(n).is_some_and(|(r, _)| r == reasons::UPDATE_SUCCESSFUL)
    })
    .await;
    assert_eq!(in_place(&updated).unwrap().1, "Node in-place update successful");
    // The watch may deliver the last version after the read above saw it.
    let reasons = wait_for("the node's history to show UpdateSuccessful", async || {
        let reasons = reasons_seen(&nodes, &node);
        (reasons.last().map(String::as_str) == Some(reasons::UPDATE_SUCCESSFUL)).then_some(reasons)
    })
    .await;
    assert_eq!(
        reasons,
        [
            reasons::CANDIDATE_FOR_UPDATE,
            reasons::SELECTED_FOR_UPDATE,
            reasons::DRAIN_SUCCESSFUL,
            reasons::READY_FOR_UPDATE,
            reasons::UPDATE_SUCCESSFUL
        ]
    );
    // Drained: cordoned, the pod evicted, the DaemonSet pod left.
    assert_eq!(updated.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    assert!(
        pods.get_opt("work").await.unwrap().is_none(),
        "the pod was evicted"
    );
    assert!(
        pods.get_opt("agent").await.unwrap().is_some(),
        "the DaemonSet pod stays"
    );
    // The node agent's result, and the new size.
    assert_eq!(
        updated.labels().get(labels::UPDATE_RESULT).map(String::as_str),
        Some("successful")
    );
    assert_eq!(
        updated.labels().get(INSTANCE_TYPE_LABEL).map(String::as_str),
        Some("medium")
    );
    let capacity = updated.status.as_ref().and_then(|s| s.capacity.clone()).unwrap();
    assert_eq!(capacity["cpu"].0, "4");
    assert_eq!(capacity["memory"].0, "8Gi");

    let rejoined = cluster.wait_phase(&name, MachinePhase::Running).await;
    let phases = wait_for("the machine's history to show Running again", async || {
        let phases = phases_seen(&machines, &name);
        let updated = phases.contains(&MachinePhase::InPlaceUpdateSuccessful);
        (updated && phases.last() == Some(&MachinePhase::Running)).then_some(phases)
    })
    .await;
    let updating = phases.iter().position(|p| *p == MachinePhase::InPlaceUpdating);
    let successful = phases
        .iter()
        .position(|p| *p == MachinePhase::InPlaceUpdateSuccessful);
    assert!(
        matches!((updating, successful), (Some(u), Some(s)) if u < s),
        "{phases:?}"
    );
    assert_eq!(phases.last(), Some(&MachinePhase::Running), "{phases:?}");
    assert_eq!(
        rejoined.status.as_ref().unwrap().last_operation.description,
        format!("Machine {name} successfully re-joined the cluster")
    );
    // The VM is kept: same providerID, one VM, now of the target class; no other machine was ever made.
    assert_eq!(rejoined.spec.provider_id, provider_id);
    let vms = cluster.driver.vms();
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert_eq!(vms[0].provider_id, provider_id);
    assert_eq!(vms[0].class_name, TARGET_CLASS);
    assert_eq!(vms[0].provider_spec.size.name, "medium");
    let mut names: Vec<String> = machines.versions().iter().map(|v| v.object.name_any()).collect();
    names.dedup();
    assert_eq!(names, std::slice::from_ref(&name));
    let events = cluster.events_of(&name).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("InPlaceUpdating")
                && e.message.as_deref() == Some(&format!("Machine {name} is undergoing an in-place update"))),
        "{events:?}"
    );
    cluster.stop().await;
}

/// The node agent fails (sim fault): the condition says UpdateFailed with the reason, the machine is
/// InPlaceUpdateFailed with the reason in its description — and then neither Failed nor deleted, even with its node
/// NotReady for longer than the health timeout. The VM stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_update_is_reported_and_never_fails_or_replaces_the_machine() {
    let mut settings = settings();
    settings.machine_health_timeout = Duration::from_secs(2);
    let mut cluster = Cluster::start(settings).await;
    let machines = History::<Machine>::start(cluster.machines()).await;
    let machine = one_machine_to_update(&mut cluster).await;
    let name = machine.name_any();
    let node = node_label(&machine).expect("a node").to_owned();
    cluster
        .faults
        .fail_in_place_updates(&node, "the new image does not boot");

    select(&cluster, &node).await;
    let failed = cluster.wait_phase(&name, MachinePhase::InPlaceUpdateFailed).await;
    let op = &failed.status.as_ref().unwrap().last_operation;
    assert_eq!(
        op.description,
        format!("Machine {name} failed to update dependencies: the new image does not boot")
    );
    assert_eq!(op.state, Some(mcm_api::MachineState::Failed));
    let n = wait_node(&cluster, &node, "UpdateFailed", |n| {
        in_place(n).is_some_and(|(r, _)| r == reasons::UPDATE_FAILED)
    })
    .await;
    assert_eq!(
        in_place(&n).unwrap().1,
        "Node in-place update failed: the new image does not boot"
    );
    assert_eq!(
        n.labels().get(INSTANCE_TYPE_LABEL).map(String::as_str),
        Some("small")
    );

    cluster.faults.set_node_not_ready(&node);
    let changed = watch_window(Duration::from_secs(5), async || {
        match cluster.machines().get_opt(&name).await.ok().flatten() {
            None => Some("deleted".to_owned()),
            Some(m) if m.phase() != Some(MachinePhase::InPlaceUpdateFailed) => {
                Some(format!("{:?}", m.phase()))
            }
            Some(m) if m.is_deleting() => Some("deleting".to_owned()),
            Some(_) => None,
        }
    })
    .await;
    assert_eq!(changed, None, "the machine left InPlaceUpdateFailed");
    assert!(
        !phases_seen(&machines, &name).contains(&MachinePhase::Failed),
        "{:?}",
        phases_seen(&machines, &name)
    );
    let vms = cluster.driver.vms();
    assert_eq!(vms.len(), 1);
    assert_eq!(vms[0].class_name, CLASS);
    cluster.stop().await;
}

/// A node agent that never answers: the machine is InPlaceUpdateFailed once the in-place update timeout (3s here)
/// has passed since it turned InPlaceUpdating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_nobody_answers_fails_at_the_in_place_update_timeout() {
    let mut settings = settings();
    settings.machine_inplace_update_timeout = Duration::from_secs(3);
    let mut cluster = Cluster::start(settings).await;
    let machine = one_machine_to_update(&mut cluster).await;
    let name = machine.name_any();
    let node = node_label(&machine).expect("a node").to_owned();
    cluster.faults.hold_in_place_updates(&node);

    select(&cluster, &node).await;
    let updating = cluster.wait_phase(&name, MachinePhase::InPlaceUpdating).await;
    let started = updating
        .status
        .as_ref()
        .unwrap()
        .current_status
        .last_update_time
        .clone()
        .unwrap();
    let failed = cluster.wait_phase(&name, MachinePhase::InPlaceUpdateFailed).await;
    let status = failed.status.as_ref().unwrap();
    assert_eq!(
        status.last_operation.description,
        format!("Machine {name} failed to in-place update in 3s.")
    );
    let ended = status.current_status.last_update_time.clone().unwrap();
    assert!(
        ended.0.duration_since(started.0) >= jiff::SignedDuration::from_secs(3),
        "{started:?} → {ended:?}"
    );
    let n = cluster.nodes().get(&node).await.unwrap();
    assert_eq!(
        in_place(&n).map(|(r, _)| r),
        Some(reasons::READY_FOR_UPDATE.to_owned())
    );
    assert_eq!(n.labels().get(labels::UPDATE_RESULT), None);
    cluster.stop().await;
}
