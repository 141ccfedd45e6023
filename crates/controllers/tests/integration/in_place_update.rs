//! The InPlaceUpdate strategy end to end against the embedded API server: the sim provider and its kubelet (playing
//! Gardener's node agent: it applies the new class to the VM and reports `update-result`), the machine controller
//! (the `InPlaceUpdate` node condition, the drain, the in-place phases) and the MachineSet and MachineDeployment
//! controllers (candidates, selection, moving updated machines to the new set). Nothing in the test plays a part of
//! the protocol except the user's `selected-for-update` labels with Manual.
//!
//! What a user checks: a change of `spec.template.spec.class.name` completes with the same machines and VMs (every
//! version of every machine is watched: none created, none deleted, providerIDs unchanged, the VMs now of the new
//! class), never more than maxUnavailable nodes are updated at once, `updatedReplicas` = replicas at the end, the old
//! set is at 0 and labelled `scale-up-disabled`, the in-place labels are gone; with Manual nothing is selected until
//! the user labels a node.

use crate::support;

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::{
    InPlaceUpdateMachineDeployment, Machine, MachineDeployment, MachinePhase, MachineSet, MetaExt,
    builders::MachineDeploymentBuilder,
    keys::{annotations, kubernetes::INSTANCE_TYPE_LABEL, labels, taints},
};
use serde_json::json;
use support::{Cluster, History, Setup, wait_within, watch_window};

/// The deployment of every test.
const NAME: &str = "pool";

/// Long enough for a rollout of a few machines on a busy machine.
const DEADLINE: Duration = Duration::from_mins(2);

async fn start() -> Cluster {
    Cluster::start_with_set_controllers(Setup::for_sets(), support::set_config()).await
}

/// The InPlaceUpdate deployment [`NAME`] of `replicas` machines of the class `small`.
fn in_place(replicas: i32, orchestration: &str, max_unavailable: i32) -> MachineDeployment {
    let mut deployment = MachineDeploymentBuilder::new(NAME)
        .matching([("pool", NAME)])
        .class("small")
        .replicas(replicas)
        .strategy("InPlaceUpdate")
        .build();
    deployment.spec.strategy.in_place_update = Some(InPlaceUpdateMachineDeployment {
        orchestration_type: orchestration.into(),
        max_surge: Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0)),
        max_unavailable: Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
            max_unavailable,
        )),
    });
    deployment
}

/// The machines by name with their providerIDs, once `replicas` are Running and counted by the deployment.
async fn running(cluster: &Cluster, replicas: i32) -> BTreeMap<String, String> {
    wait_within(DEADLINE, "every machine Running and available", async || {
        let status = cluster.deployments().get(NAME).await.ok()?.status?;
        if status.available_replicas != replicas || status.updated_replicas != replicas {
            return None;
        }
        let machines = cluster.machines().list(&ListParams::default()).await.ok()?.items;
        let running: BTreeMap<String, String> = machines
            .iter()
            .filter(|m| m.phase() == Some(MachinePhase::Running) && m.node_name().is_some())
            .map(|m| (m.name_any(), m.spec.provider_id.clone()))
            .collect();
        (running.len() == usize::try_from(replicas).unwrap()).then_some(running)
    })
    .await
}

fn has_label(node: &Node, key: &str) -> bool {
    node.label(key).is_some()
}

/// The most nodes seen under update at once (selected and without a result yet), over every version the watch saw.
fn most_under_update(history: &History<Node>) -> usize {
    let mut latest: BTreeMap<String, Node> = BTreeMap::new();
    let mut most = 0;
    for seen in history.versions() {
        latest.insert(seen.object.name_any(), seen.object);
        let now = latest
            .values()
            .filter(|n| has_label(n, labels::SELECTED_FOR_UPDATE) && !has_label(n, labels::UPDATE_RESULT))
            .count();
        most = most.max(now);
    }
    most
}

/// Waits until the rollout is done as a user sees it: one set of `replicas` owning every machine, the other at 0,
/// `updatedReplicas` = replicas, and no node with an in-place label, a cordon or the rollout's PreferNoSchedule
/// taint left. Returns (new set, old set).
async fn rolled_out_in_place(cluster: &Cluster, replicas: i32, old: &str) -> (MachineSet, MachineSet) {
    let done = watch_window(DEADLINE, async || {
        let status = cluster.deployments().get(NAME).await.ok()?.status?;
        if status.updated_replicas != replicas
            || status.replicas != replicas
            || status.available_replicas != replicas
        {
            return None;
        }
        let sets = cluster.sets().list(&ListParams::default()).await.ok()?.items;
        let old_set = sets.iter().find(|s| s.name_any() == old)?.clone();
        let new_set = sets.iter().find(|s| s.name_any() != old)?.clone();
        if new_set.spec.replicas != replicas || old_set.spec.replicas != 0 {
            return None;
        }
        let machines = cluster.machines().list(&ListParams::default()).await.ok()?.items;
        let uid = new_set.uid()?;
        if !machines.iter().all(|m| m.is_controlled_by(&uid)) {
            return None;
        }
        let nodes = cluster.nodes().list(&ListParams::default()).await.ok()?.items;
        let clean = nodes.iter().all(|n| {
            [
                labels::CANDIDATE_FOR_UPDATE,
                labels::SELECTED_FOR_UPDATE,
                labels::UPDATE_RESULT,
            ]
            .iter()
            .all(|k| !has_label(n, k))
                && n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)
                && n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_none_or(|t| t.iter().all(|t| t.key != taints::PREFER_NO_SCHEDULE))
        });
        clean.then_some((new_set, old_set))
    })
    .await;
    match done {
        Some(done) => done,
        None => panic!(
            "the in-place rollout did not complete in {DEADLINE:?}: {}",
            state(cluster).await
        ),
    }
}

/// The state of the rollout as a user would look at it, for a failure message.
async fn state(cluster: &Cluster) -> String {
    let sets = cluster.sets().list(&ListParams::default()).await.unwrap().items;
    let machines = cluster
        .machines()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let nodes = cluster.nodes().list(&ListParams::default()).await.unwrap().items;
    let status = cluster.deployments().get(NAME).await.unwrap().status;
    let sets: Vec<String> = sets
        .iter()
        .map(|s| {
            format!(
                "{} replicas={} labels={:?} status={:?}",
                s.name_any(),
                s.spec.replicas,
                s.labels(),
                s.status
            )
        })
        .collect();
    let machines: Vec<String> = machines
        .iter()
        .map(|m| {
            format!(
                "{} phase={:?} owner={:?} labels={:?}",
                m.name_any(),
                m.phase(),
                m.controller_ref().map(|r| r.name.clone()),
                m.labels()
            )
        })
        .collect();
    let nodes: Vec<String> = nodes
        .iter()
        .map(|n| {
            format!(
                "{} labels={:?} unschedulable={:?} in-place={:?}",
                n.name_any(),
                n.labels(),
                n.spec.as_ref().and_then(|s| s.unschedulable),
                mcm_core::in_place_update::reason_of(n)
            )
        })
        .collect();
    format!("deployment status {status:?}\nsets {sets:#?}\nmachines {machines:#?}\nnodes {nodes:#?}")
}

/// Every machine name the watch saw, and whether any was deleted.
fn machine_names(history: &History<Machine>) -> (Vec<String>, bool) {
    let versions = history.versions();
    let mut names: Vec<String> = versions.iter().map(|s| s.object.name_any()).collect();
    names.sort();
    names.dedup();
    (names, versions.iter().any(|s| s.deleted))
}

async fn only_set(cluster: &Cluster) -> MachineSet {
    let sets = cluster.sets().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(sets.len(), 1, "{sets:?}");
    sets.into_iter().next().unwrap()
}

async fn change_class(cluster: &Cluster) {
    cluster
        .deployments()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "template": { "spec": { "class": { "name": "medium" } } } } })),
        )
        .await
        .unwrap();
}

/// Auto: a class change is rolled out on the same VMs, one node at a time with maxUnavailable 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_updates_every_machine_in_place_keeping_its_vm_within_max_unavailable() {
    let cluster = start().await;
    cluster
        .deployments()
        .create(&PostParams::default(), &in_place(3, "Auto", 1))
        .await
        .unwrap();
    let before = running(&cluster, 3).await;
    let old = only_set(&cluster).await.name_any();
    let machine_history = History::start(cluster.machines()).await;
    let node_history = History::start(cluster.nodes()).await;
    let set_history = History::start(cluster.sets()).await;

    change_class(&cluster).await;
    let (new_set, old_set) = rolled_out_in_place(&cluster, 3, &old).await;

    let (names, deleted) = machine_names(&machine_history);
    assert_eq!(
        names,
        before.keys().cloned().collect::<Vec<_>>(),
        "no machine created"
    );
    assert!(!deleted, "no machine deleted");
    let machines = cluster
        .machines()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for machine in &machines {
        assert_eq!(
            before.get(&machine.name_any()),
            Some(&machine.spec.provider_id),
            "the VM is kept"
        );
        assert_eq!(
            machine.label(labels::MACHINE_TEMPLATE_HASH),
            new_set.label(labels::MACHINE_TEMPLATE_HASH)
        );
        assert_eq!(machine.label(labels::UPDATE_RESULT), None);
        assert_eq!(
            machine.label("pool"),
            Some(NAME),
            "the machine keeps the deployment's labels"
        );
    }
    let vms = cluster.driver.vms();
    assert_eq!(vms.len(), 3, "one VM per machine, none added");
    assert!(
        vms.iter().all(|vm| vm.class_name == "medium"),
        "every VM updated to the new class: {:?}",
        vms.iter().map(|vm| &vm.class_name).collect::<Vec<_>>()
    );
    let nodes = cluster.nodes().list(&ListParams::default()).await.unwrap().items;
    assert!(
        nodes
            .iter()
            .all(|n| n.label(INSTANCE_TYPE_LABEL) == Some("medium")),
        "every node reports the new size"
    );
    assert_eq!(most_under_update(&node_history), 1, "one node at a time");
    assert_eq!(old_set.label(labels::SCALE_UP_DISABLED), Some("true"));
    // The old set was labelled before it lost its first machine.
    let old_versions = set_history.of(&old);
    let labelled = old_versions
        .iter()
        .position(|s| s.object.label(labels::SCALE_UP_DISABLED).is_some())
        .expect("the old set labelled");
    let shrunk = old_versions
        .iter()
        .position(|s| s.object.spec.replicas < 3)
        .expect("the old set shrunk");
    assert!(
        labelled < shrunk,
        "scale-up disabled before the first machine moved"
    );
    cluster.stop().await;
}

/// Manual: nothing is selected until the user labels a node; each labelled node is updated and moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_selects_nothing_until_the_user_labels_a_node() {
    let cluster = start().await;
    cluster
        .deployments()
        .create(&PostParams::default(), &in_place(2, "Manual", 1))
        .await
        .unwrap();
    let before = running(&cluster, 2).await;
    let old = only_set(&cluster).await.name_any();
    let machine_history = History::start(cluster.machines()).await;
    change_class(&cluster).await;

    // Every node becomes a candidate; the new set starts empty.
    let nodes_api: Api<Node> = cluster.nodes();
    let candidates = wait_within(DEADLINE, "both nodes candidates", async || {
        let nodes = nodes_api.list(&ListParams::default()).await.ok()?.items;
        let candidates: Vec<String> = nodes
            .iter()
            .filter(|n| has_label(n, labels::CANDIDATE_FOR_UPDATE))
            .map(ResourceExt::name_any)
            .collect();
        (candidates.len() == 2).then_some(candidates)
    })
    .await;
    // Each candidate carries its target for the node agent, which may not read MachineClasses: the class and its
    // nodeTemplate.
    let medium = cluster.classes().get("medium").await.unwrap();
    for node in &candidates {
        let node = nodes_api.get(node).await.unwrap();
        let target = mcm_core::in_place_target::Target::of(&node).expect("the target annotation");
        assert_eq!(target.class, "medium");
        assert_eq!(target.node_template, medium.node_template);
    }
    let sets = cluster.sets().list(&ListParams::default()).await.unwrap().items;
    let new = sets.iter().find(|s| s.name_any() != old).expect("the new set");
    assert_eq!(new.spec.replicas, 0, "Manual: the new set starts at 0");
    let selected = watch_window(Duration::from_secs(3), async || {
        let nodes = nodes_api.list(&ListParams::default()).await.ok()?.items;
        nodes
            .iter()
            .find(|n| has_label(n, labels::SELECTED_FOR_UPDATE))
            .map(ResourceExt::name_any)
    })
    .await;
    assert_eq!(selected, None, "nothing selected by the controller");

    for node in &candidates {
        nodes_api
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { labels::SELECTED_FOR_UPDATE: "true" } } })),
            )
            .await
            .unwrap();
    }
    rolled_out_in_place(&cluster, 2, &old).await;
    let nodes = nodes_api.list(&ListParams::default()).await.unwrap().items;
    assert!(
        nodes
            .iter()
            .all(|n| n.annotation(annotations::IN_PLACE_UPDATE_TARGET).is_none()),
        "the cleanup removes the targets"
    );
    let (names, deleted) = machine_names(&machine_history);
    assert_eq!(
        names,
        before.keys().cloned().collect::<Vec<_>>(),
        "no machine created"
    );
    assert!(!deleted, "no machine deleted");
    cluster.stop().await;
}

/// An old set never scales up during an in-place rollout: a machine deleted from it is not replaced there (the old
/// set shrinks to the machines it has); the new set makes up the difference with a machine of the new template.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_deleted_from_an_old_set_is_replaced_by_the_new_set_only() {
    let cluster = start().await;
    cluster
        .deployments()
        .create(&PostParams::default(), &in_place(2, "Manual", 1))
        .await
        .unwrap();
    let before = running(&cluster, 2).await;
    let old = only_set(&cluster).await;
    let old_hash = old.label(labels::MACHINE_TEMPLATE_HASH).unwrap().to_owned();
    let machine_history = History::start(cluster.machines()).await;
    let set_history = History::start(cluster.sets()).await;
    change_class(&cluster).await;
    wait_within(DEADLINE, "the old set labelled scale-up-disabled", async || {
        let set = cluster.sets().get(&old.name_any()).await.ok()?;
        set.label(labels::SCALE_UP_DISABLED).map(|_| ())
    })
    .await;

    let (gone, kept) = {
        let mut names = before.keys();
        (names.next().unwrap().clone(), names.next().unwrap().clone())
    };
    cluster
        .machines()
        .delete(&gone, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    cluster.wait_gone(&gone).await;
    let node = cluster.machine(&kept).await.node_name().unwrap().to_owned();
    cluster
        .nodes()
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { labels::SELECTED_FOR_UPDATE: "true" } } })),
        )
        .await
        .unwrap();
    let (new_set, _) = rolled_out_in_place(&cluster, 2, &old.name_any()).await;

    let created: Vec<Machine> = machine_history
        .versions()
        .into_iter()
        .map(|s| s.object)
        .filter(|m| !before.contains_key(&m.name_any()))
        .collect();
    assert!(!created.is_empty(), "a replacement was made");
    assert!(
        created
            .iter()
            .all(|m| m.label(labels::MACHINE_TEMPLATE_HASH) != Some(old_hash.as_str())),
        "no machine of the old template was created"
    );
    assert!(
        created
            .iter()
            .all(|m| m.controller_ref().map(|r| r.name.as_str()) == Some(new_set.name_any().as_str())),
        "the replacement is the new set's"
    );
    let grew = set_history
        .of(&old.name_any())
        .windows(2)
        .any(|w| w[1].object.spec.replicas > w[0].object.spec.replicas);
    assert!(!grew, "the old set never scaled up");
    assert!(
        cluster.machines().get(&kept).await.is_ok(),
        "the updated machine kept"
    );
    cluster.stop().await;
}
