//! Deleting a Node deletes its Machine (docs/node-deletion.md), against the embedded API server over HTTPS with the
//! sim provider and its kubelet, the machine and MachineSet controllers and the node deletion controller. Watches
//! record every version of the Machines and Nodes: the set replaces exactly one machine, the node stays (held by
//! our finalizer) until the machine's deletion flow reaches node deletion, and then goes.

use crate::support;

use std::{collections::BTreeSet, time::Duration};

use k8s_openapi::api::core::v1::Node;
use kube::{
    ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::{
    Machine, MachinePhase,
    builders::{MachineSetBuilder, NodeBuilder},
    keys,
};
use mcm_controllers::{machine, machinedeployment, node_deletion};
use mcm_core::{
    deletion::{DeletionStep, current_step},
    node_deletion::EVENT_REASON,
};
use serde_json::json;
use support::{CLASS, Cluster, DEADLINE, History, NAMESPACE, node_label, settings, wait_for, watch_window};
use tokio::{sync::oneshot, task::JoinHandle};

/// A running node deletion controller.
struct NodeDeletion {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl NodeDeletion {
    fn start(cluster: &Cluster) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(node_deletion::run(
            cluster.client.clone(),
            cluster.client.clone(),
            config(),
            async move {
                let _ = stopped.await;
            },
        ));
        Self { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("the node deletion controller stops in time")
            .expect("its task ends cleanly");
    }
}

/// Whether the node carries our finalizer.
fn held(node: &Node) -> bool {
    node.finalizers().iter().any(|f| f == keys::finalizers::NODE)
}

/// The machines, now.
async fn machines(cluster: &Cluster) -> Vec<Machine> {
    cluster
        .machines()
        .list(&ListParams::default())
        .await
        .expect("machines are listed")
        .items
}

/// Server, provider, kubelet, machine and set controllers, and a MachineSet `workers` of `replicas` Running
/// machines whose nodes carry our finalizer.
async fn world(replicas: usize) -> Cluster {
    let mut cluster = Cluster::start(settings()).await;
    cluster.create_class().await;
    cluster.start_set_controllers(machinedeployment::Config::new(NAMESPACE));
    let set = MachineSetBuilder::new("workers")
        .replicas(i32::try_from(replicas).expect("a replica count"))
        .matching([("pool", "workers")])
        .class(CLASS)
        .build();
    cluster
        .sets()
        .create(&PostParams::default(), &set)
        .await
        .expect("the set is created");
    running_with_held_nodes(&cluster, replicas, &[]).await;
    cluster
}

/// Waits until `count` machines exist, all Running, none of them in `not`, each with its node carrying our finalizer;
/// returns them.
async fn running_with_held_nodes(cluster: &Cluster, count: usize, not: &[&str]) -> Vec<Machine> {
    wait_for(&format!("{count} Running machines with held nodes"), async || {
        let machines = machines(cluster).await;
        if machines.len() != count
            || machines
                .iter()
                .any(|m| m.phase() != Some(MachinePhase::Running) || not.contains(&m.name_any().as_str()))
        {
            return None;
        }
        for machine in &machines {
            let node = cluster.nodes().get_opt(node_label(machine)?).await.ok()??;
            if !held(&node) {
                return None;
            }
        }
        Some(machines)
    })
    .await
}

/// Waits until the node is gone.
async fn wait_node_gone(cluster: &Cluster, node: &str) {
    wait_for(&format!("node {node} to be gone"), async || {
        cluster
            .nodes()
            .get_opt(node)
            .await
            .ok()
            .and_then(|n| n.is_none().then_some(()))
    })
    .await;
}

/// Waits for the machine's `TriggeredByNodeDeletion` Event (recorded just after the delete the test may already
/// have seen) and asserts there is exactly one.
async fn one_node_deleted_event(cluster: &Cluster, machine: &str) {
    let count = wait_for("the TriggeredByNodeDeletion Event", async || {
        let count = node_deleted_events(cluster, machine).await;
        (count > 0).then_some(count)
    })
    .await;
    assert_eq!(count, 1, "one TriggeredByNodeDeletion Event");
}

/// How many `TriggeredByNodeDeletion` Events the machine has.
async fn node_deleted_events(cluster: &Cluster, machine: &str) -> usize {
    cluster
        .events_of(machine)
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some(EVENT_REASON))
        .count()
}

/// The names of every machine the history saw.
fn names_seen(history: &History<Machine>) -> BTreeSet<String> {
    history
        .versions()
        .into_iter()
        .map(|s| s.object.name_any())
        .collect()
}

/// Asserts, from the recorded versions, that the node was held (being deleted, with our finalizer) and lost our
/// finalizer only after the machine's deletion flow had reached node deletion (its VM deleted).
fn assert_released_after_the_flow(
    machines: &History<Machine>,
    nodes: &History<Node>,
    machine: &str,
    node: &str,
) {
    let node_versions = nodes.of(node);
    assert!(
        node_versions
            .iter()
            .any(|s| s.object.metadata.deletion_timestamp.is_some() && held(&s.object)),
        "node {node} was held while being deleted: {node_versions:#?}"
    );
    let released = node_versions
        .iter()
        .find(|s| s.object.metadata.deletion_timestamp.is_some() && !held(&s.object))
        .expect("the node lost our finalizer")
        .rv;
    let reached = machines
        .of(machine)
        .iter()
        .find(|s| {
            s.object.metadata.deletion_timestamp.is_some()
                && current_step(&s.object) >= DeletionStep::DeleteNode
        })
        .expect("the machine's flow reached node deletion")
        .rv;
    assert!(
        released > reached,
        "our finalizer went (rv {released}) only after the flow reached node deletion (rv {reached})"
    );
    assert!(
        node_versions.last().is_some_and(|s| s.deleted),
        "the node's last version is its deletion"
    );
}

/// The config of the node deletion controllers of these tests.
fn config() -> node_deletion::Config {
    node_deletion::Config {
        namespace: NAMESPACE.into(),
        retry: Duration::from_millis(200),
        resync: Duration::from_secs(30),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_a_node_replaces_its_machine_exactly_once_and_the_node_goes() {
    let cluster = world(2).await;
    let controller = NodeDeletion::start(&cluster);
    delete_a_node_and_see_it_replaced_once(&cluster).await;
    controller.stop().await;
    cluster.stop().await;
}

/// As `mcm run` runs it: inside the machine controller, on its caches (one watch of the Machines and Nodes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_machine_controllers_caches_deleting_a_node_replaces_its_machine_exactly_once() {
    let mut cluster = world(2).await;
    cluster.stop_controller().await;
    cluster.start_controller_with_extras(machine::Extras {
        node_deletion: Some(config()),
        ..machine::Extras::default()
    });
    delete_a_node_and_see_it_replaced_once(&cluster).await;
    cluster.stop().await;
}

/// Deletes the node of one of the two Running machines and checks: that machine goes, exactly one replacement
/// comes, one Event, the VM deleted, the node released only after the machine's flow.
async fn delete_a_node_and_see_it_replaced_once(cluster: &Cluster) {
    let machine_history = History::start(cluster.machines()).await;
    let node_history = History::start(cluster.nodes()).await;
    let victim = machines(cluster).await.remove(0);
    let (machine, node) = (victim.name_any(), node_label(&victim).expect("a node").to_owned());

    cluster
        .nodes()
        .delete(&node, &DeleteParams::default())
        .await
        .expect("the node is deleted");
    cluster.wait_gone(&machine).await;
    wait_node_gone(cluster, &node).await;
    running_with_held_nodes(cluster, 2, &[&machine]).await;

    assert_eq!(
        names_seen(&machine_history).len(),
        3,
        "two machines and exactly one replacement: {:?}",
        names_seen(&machine_history)
    );
    one_node_deleted_event(cluster, &machine).await;
    assert!(
        !cluster.driver.vms().iter().any(|vm| vm.machine_name == machine),
        "the machine's VM is deleted"
    );
    assert_released_after_the_flow(&machine_history, &node_history, &machine, &node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_already_terminating_is_left_to_its_flow() {
    let cluster = world(1).await;
    let controller = NodeDeletion::start(&cluster);
    let machine = machines(&cluster).await.remove(0);
    let (name, node) = (
        machine.name_any(),
        node_label(&machine).expect("a node").to_owned(),
    );
    // A pre-drain hook holds the machine's deletion before the drain.
    let hook = "pre-drain.delete.hook.machine.sapcloud.io/test";
    cluster
        .patch_machine(&name, json!({ "metadata": { "annotations": { hook: "" } } }))
        .await;
    cluster
        .machines()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("the machine is deleted");
    cluster
        .wait_machine(&name, "held before the drain", |m| {
            m.phase() == Some(MachinePhase::Terminating) && current_step(m) == DeletionStep::Drain
        })
        .await;
    let machine_history = History::start(cluster.machines()).await;
    let node_history = History::start(cluster.nodes()).await;

    cluster
        .nodes()
        .delete(&node, &DeleteParams::default())
        .await
        .expect("the node is deleted");
    let acted = watch_window(Duration::from_secs(2), async || {
        (node_deleted_events(&cluster, &name).await > 0).then_some(())
    })
    .await;
    assert_eq!(
        acted, None,
        "a machine already being deleted is not deleted again"
    );
    let node_now = cluster.nodes().get(&node).await.expect("the node is still there");
    assert!(
        held(&node_now),
        "our finalizer holds the node while the flow is held"
    );

    cluster
        .patch_machine(&name, json!({ "metadata": { "annotations": { hook: null } } }))
        .await;
    cluster.wait_gone(&name).await;
    wait_node_gone(&cluster, &node).await;
    running_with_held_nodes(&cluster, 1, &[&name]).await;
    assert_eq!(
        names_seen(&machine_history).len(),
        2,
        "the machine and one replacement: {:?}",
        names_seen(&machine_history)
    );
    assert_released_after_the_flow(&machine_history, &node_history, &name, &node);
    controller.stop().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_deleted_without_our_finalizer_deletes_its_machine() {
    let mut cluster = world(1).await;
    let controller = NodeDeletion::start(&cluster);
    let machine = machines(&cluster).await.remove(0);
    let (name, node) = (
        machine.name_any(),
        node_label(&machine).expect("a node").to_owned(),
    );
    // With the machine controller stopped nothing puts our finalizer back: the node goes at once.
    cluster.stop_controller().await;
    let machine_history = History::start(cluster.machines()).await;
    cluster
        .nodes()
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .expect("our finalizer is removed");
    cluster
        .nodes()
        .delete(&node, &DeleteParams::default())
        .await
        .expect("the node is deleted");
    wait_node_gone(&cluster, &node).await;
    cluster
        .wait_machine(&name, "being deleted", |m| {
            m.metadata.deletion_timestamp.is_some()
        })
        .await;
    one_node_deleted_event(&cluster, &name).await;

    cluster.start_controller();
    cluster.wait_gone(&name).await;
    running_with_held_nodes(&cluster, 1, &[&name]).await;
    assert_eq!(
        names_seen(&machine_history).len(),
        2,
        "the machine and one replacement: {:?}",
        names_seen(&machine_history)
    );
    controller.stop().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleting_node_no_machine_names_loses_our_finalizer() {
    let cluster = world(1).await;
    let controller = NodeDeletion::start(&cluster);
    let machine = machines(&cluster).await.remove(0);
    let stray = NodeBuilder::new("stray")
        .finalizer(keys::finalizers::NODE)
        .finalizer("example.com/keep")
        .build();
    cluster
        .nodes()
        .create(&PostParams::default(), &stray)
        .await
        .expect("the stray node is created");
    cluster
        .nodes()
        .delete("stray", &DeleteParams::default())
        .await
        .expect("the stray node is deleted");
    let left = wait_for("our finalizer to leave the stray node", async || {
        cluster
            .nodes()
            .get_opt("stray")
            .await
            .ok()
            .flatten()
            .filter(|n| !held(n))
    })
    .await;
    assert_eq!(
        left.finalizers(),
        ["example.com/keep".to_owned()],
        "only our finalizer goes"
    );
    cluster
        .nodes()
        .patch(
            "stray",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .expect("the other finalizer is removed");
    wait_node_gone(&cluster, "stray").await;

    let after = cluster.machine(&machine.name_any()).await;
    assert!(
        after.metadata.deletion_timestamp.is_none(),
        "no machine is deleted for a node it does not back"
    );
    controller.stop().await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_controller_started_after_the_node_was_deleted_still_deletes_the_machine() {
    let cluster = world(1).await;
    let controller = NodeDeletion::start(&cluster);
    controller.stop().await;
    let machine = machines(&cluster).await.remove(0);
    let (name, node) = (
        machine.name_any(),
        node_label(&machine).expect("a node").to_owned(),
    );
    cluster
        .nodes()
        .delete(&node, &DeleteParams::default())
        .await
        .expect("the node is deleted");
    let terminating = cluster
        .nodes()
        .get(&node)
        .await
        .expect("our finalizer holds the node");
    assert!(terminating.metadata.deletion_timestamp.is_some());

    let controller = NodeDeletion::start(&cluster);
    cluster.wait_gone(&name).await;
    wait_node_gone(&cluster, &node).await;
    running_with_held_nodes(&cluster, 1, &[&name]).await;
    one_node_deleted_event(&cluster, &name).await;
    controller.stop().await;
    cluster.stop().await;
}
