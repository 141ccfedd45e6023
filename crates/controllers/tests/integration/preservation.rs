//! Machine preservation (reference v0.62+, docs/preservation.md) with the machine and set controllers, the sim
//! provider and its kubelet, over real HTTP: the annotation `node.machine.sapcloud.io/preserve` on the node or the
//! machine, the expiry, the node's autoscaler annotations, `Preserved` condition and `preserved` taint, the drain,
//! and a preserved Failed machine kept by its set until it recovers.

use crate::support;

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::{
    Machine, MachinePhase, MachineSet,
    builders::{MachineSetBuilder, PodBuilder},
    keys::{annotations, taints},
};
use mcm_controllers::machinedeployment;
use serde_json::json;
use support::{CLASS, Cluster, History, NAMESPACE, node_label, settings, wait_for, watch_window};

fn preserved_condition(node: &Node) -> Option<(String, String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Preserved")
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

fn has_preserved_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == taints::PRESERVED && t.effect == "NoSchedule")
        })
}

fn annotation<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

async fn wait_node(cluster: &Cluster, name: &str, what: &str, check: impl Fn(&Node) -> bool) -> Node {
    wait_for(&format!("node {name}: {what}"), async || {
        cluster.nodes().get_opt(name).await.ok().flatten().filter(&check)
    })
    .await
}

async fn annotate_node(cluster: &Cluster, name: &str, value: Option<&str>) {
    cluster
        .nodes()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {annotations::PRESERVE: value}}})),
        )
        .await
        .expect("the node is annotated");
}

/// A MachineSet `workers` of one machine; returns the machine once Running.
async fn one_machine_set(cluster: &Cluster) -> Machine {
    let set = MachineSetBuilder::new("workers")
        .replicas(1)
        .matching([("pool", "workers")])
        .class(CLASS)
        .build();
    cluster
        .sets()
        .create(&PostParams::default(), &set)
        .await
        .expect("the set is created");
    wait_for("the set's machine Running", async || {
        let list = cluster.machines().list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|m| m.phase() == Some(MachinePhase::Running))
    })
    .await
}

/// Two pods on `node`: `work` (to be evicted) and `agent`, controlled by a DaemonSet (to stay).
async fn create_pods(cluster: &Cluster, node: &str) -> Api<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    for (pod, daemon) in [("work", false), ("agent", true)] {
        let mut built = PodBuilder::new(pod).node(node).container("c", "i");
        if daemon {
            built = built.owner(OwnerReference {
                api_version: "apps/v1".into(),
                kind: "DaemonSet".into(),
                name: "ds".into(),
                uid: "ds-uid".into(),
                controller: Some(true),
                block_owner_deletion: None,
            });
        }
        pods.create(&PostParams::default(), &built.build())
            .await
            .expect("the pod is created");
    }
    pods
}

/// "now" on the node: the machine gets `preserveExpiryTime` (now + `machinePreserveTimeout`) and records the node's
/// value; the node gets the autoscaler annotations and `Preserved=True` ("Preserved by user."), no taint (the
/// machine is Running). At the expiry all of it is undone and the node's annotation removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn now_on_the_node_preserves_until_the_expiry_which_undoes_it() {
    let mut settings = settings();
    settings.machine_preserve_timeout = Duration::from_secs(6);
    let cluster = Cluster::start(settings).await;
    cluster.create_class().await;
    cluster.create_machine("keep").await;
    let running = cluster.wait_phase("keep", MachinePhase::Running).await;
    let node = node_label(&running).expect("a node").to_owned();

    annotate_node(&cluster, &node, Some("now")).await;
    let preserved = cluster
        .wait_machine("keep", "an expiry and the node's value recorded", |m| {
            m.preserve_expiry().is_some()
                && annotation(&m.metadata, annotations::LAST_APPLIED_NODE_PRESERVE_VALUE) == Some("now")
        })
        .await;
    let expiry = preserved.preserve_expiry().unwrap();
    let left = expiry.duration_since(jiff::Timestamp::now()).as_secs_f64();
    assert!(left > 0.0 && left <= 7.0, "expiry about 6s away, {left}s");
    let marked = wait_node(&cluster, &node, "Preserved=True", |n| {
        preserved_condition(n).is_some_and(|(status, _, _)| status == "True")
    })
    .await;
    let (_, reason, message) = preserved_condition(&marked).unwrap();
    assert_eq!(reason, "Preserved by user.");
    assert!(message.starts_with("Machine preserved until "), "{message}");
    assert_eq!(
        annotation(&marked.metadata, annotations::SCALE_DOWN_DISABLED),
        Some("true")
    );
    assert_eq!(
        annotation(&marked.metadata, annotations::SCALE_DOWN_DISABLED_BY_MCM),
        Some("true")
    );
    assert!(
        !has_preserved_taint(&marked),
        "a Running machine's node is not tainted"
    );

    let stopped = wait_node(&cluster, &node, "preservation stopped", |n| {
        preserved_condition(n)
            .is_some_and(|(status, reason, _)| status == "False" && reason == "Preservation stopped.")
    })
    .await;
    let unmarked = wait_node(&cluster, &node, "annotations removed", |n| {
        annotation(&n.metadata, annotations::SCALE_DOWN_DISABLED).is_none()
            && annotation(&n.metadata, annotations::PRESERVE).is_none()
    })
    .await;
    assert!(!has_preserved_taint(&unmarked));
    assert!(
        jiff::Timestamp::now() >= expiry,
        "stopped at the expiry, not before ({stopped:?})"
    );
    let after = cluster
        .wait_machine("keep", "expiry and last-applied cleared", |m| {
            m.preserve_expiry().is_none()
                && annotation(&m.metadata, annotations::LAST_APPLIED_NODE_PRESERVE_VALUE).is_none()
        })
        .await;
    assert_eq!(after.phase(), Some(MachinePhase::Running));
    cluster.stop().await;
}

/// "when-failed" on the machine of a set: while Running nothing happens; once Failed the machine is preserved —
/// its node tainted `node.machine.sapcloud.io/preserved:NoSchedule` (not cordoned), drained (a pod on it evicted,
/// a DaemonSet pod left), `Preserved=True` "Preserved node drained successfully." — and the set neither deletes
/// nor replaces it (every version watched). When the node recovers the machine returns to Running and, its value
/// being "when-failed", the preservation stops: taint, condition, expiry undone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_machine_preserved_when_failed_is_kept_drained_and_released_on_recovery() {
    let mut settings = settings();
    settings.machine_health_timeout = Duration::from_secs(2);
    let mut cluster = Cluster::start(settings).await;
    cluster.create_class().await;
    cluster.start_set_controllers(machinedeployment::Config::new(NAMESPACE));
    let history = History::<Machine>::start(cluster.machines()).await;
    let machine = one_machine_set(&cluster).await;
    let name = machine.name_any();
    let node = node_label(&machine).expect("a node").to_owned();
    cluster
        .patch_machine(
            &name,
            json!({"metadata": {"annotations": {annotations::PRESERVE: "when-failed"}}}),
        )
        .await;
    let pods = create_pods(&cluster, &node).await;
    // Running with "when-failed": not preserved.
    assert!(
        watch_window(Duration::from_secs(1), async || {
            cluster.machine(&name).await.preserve_expiry().map(|_| ())
        })
        .await
        .is_none(),
        "a Running machine with when-failed is not preserved"
    );

    cluster.faults.set_node_not_ready(&node);
    cluster.wait_phase(&name, MachinePhase::Failed).await;
    let preserved = cluster
        .wait_machine(&name, "preserved", |m| m.preserve_expiry().is_some())
        .await;
    assert_eq!(preserved.phase(), Some(MachinePhase::Failed));
    let drained = wait_node(&cluster, &node, "drained and Preserved=True", |n| {
        preserved_condition(n).is_some_and(|(status, _, _)| status == "True")
    })
    .await;
    let (_, reason, message) = preserved_condition(&drained).unwrap();
    assert_eq!(reason, "Preserved by user.");
    assert!(
        message.starts_with("Preserved node drained successfully. Machine preserved until "),
        "{message}"
    );
    assert!(has_preserved_taint(&drained));
    assert_ne!(
        drained.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "tainted, not cordoned"
    );
    assert_eq!(
        annotation(&drained.metadata, annotations::SCALE_DOWN_DISABLED),
        Some("true")
    );
    wait_for("the pod evicted", async || {
        pods.get_opt("work").await.ok().and_then(|p| {
            p.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
                .then_some(())
        })
    })
    .await;
    let agent = pods.get("agent").await.expect("the DaemonSet pod stays");
    assert!(agent.metadata.deletion_timestamp.is_none());

    // Kept: the set neither deletes nor replaces a preserved Failed machine.
    let replaced = watch_window(Duration::from_secs(3), async || {
        let list = cluster.machines().list(&ListParams::default()).await.ok()?;
        (list.items.len() != 1).then_some(list.items.len())
    })
    .await;
    assert_eq!(replaced, None, "no replacement while preserved");

    cluster.faults.set_node_ready(&node);
    cluster.wait_phase(&name, MachinePhase::Running).await;
    let released = wait_node(&cluster, &node, "preservation stopped", |n| {
        !has_preserved_taint(n)
            && preserved_condition(n)
                .is_some_and(|(status, reason, _)| status == "False" && reason == "Preservation stopped.")
            && annotation(&n.metadata, annotations::SCALE_DOWN_DISABLED).is_none()
    })
    .await;
    assert!(!has_preserved_taint(&released));
    cluster
        .wait_machine(&name, "expiry cleared, annotation kept", |m| {
            m.preserve_expiry().is_none()
                && annotation(&m.metadata, annotations::PRESERVE) == Some("when-failed")
        })
        .await;

    let versions = history.versions();
    assert!(
        versions
            .iter()
            .all(|v| !v.deleted && v.object.metadata.deletion_timestamp.is_none()),
        "no machine was deleted"
    );
    let names: std::collections::BTreeSet<String> = versions
        .iter()
        .filter_map(|v| v.object.metadata.name.clone())
        .collect();
    assert_eq!(names.len(), 1, "one machine only: {names:?}");
    cluster.stop().await;
}

/// Removing the annotation ends a preservation before its expiry; "false" on the node wins over "now" on the
/// machine (the machine's own annotation is removed, the node's value recorded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_value_wins_and_false_stops_preservation() {
    let cluster = Cluster::start(settings()).await;
    cluster.create_class().await;
    cluster
        .create_machine_from(
            json!({"metadata": {"name": "m", "annotations": {annotations::PRESERVE: "now"}}}),
        )
        .await;
    let running = cluster.wait_phase("m", MachinePhase::Running).await;
    let node = node_label(&running).expect("a node").to_owned();
    cluster
        .wait_machine("m", "preserved by its own annotation", |m| {
            m.preserve_expiry().is_some()
        })
        .await;
    wait_node(&cluster, &node, "Preserved=True", |n| {
        preserved_condition(n).is_some_and(|(status, _, _)| status == "True")
    })
    .await;

    annotate_node(&cluster, &node, Some("false")).await;
    let stopped = cluster
        .wait_machine("m", "stopped, the node's value recorded", |m| {
            m.preserve_expiry().is_none()
                && annotation(&m.metadata, annotations::PRESERVE).is_none()
                && annotation(&m.metadata, annotations::LAST_APPLIED_NODE_PRESERVE_VALUE) == Some("false")
        })
        .await;
    assert_eq!(stopped.phase(), Some(MachinePhase::Running));
    let node_after = wait_node(&cluster, &node, "Preserved=False", |n| {
        preserved_condition(n).is_some_and(|(status, _, _)| status == "False")
    })
    .await;
    assert_eq!(
        annotation(&node_after.metadata, annotations::PRESERVE),
        Some("false"),
        "the user's false stays"
    );
    cluster.stop().await;
}

/// `autoPreserveFailedMachineMax: 1`: the set's machine that fails is annotated `auto-preserved` by the set and
/// preserved by the machine controller (`Preserved by MCM.`), kept (not replaced), counted in
/// `autoPreserveFailedMachineCount` and `preservedFailedReplicas`. Lowering the max to 0 takes the annotation off;
/// the preservation stops and the set replaces the Failed machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_auto_preserves_its_failed_machine_up_to_its_max() {
    let mut settings = settings();
    settings.machine_health_timeout = Duration::from_secs(2);
    let mut cluster = Cluster::start(settings).await;
    cluster.create_class().await;
    cluster.start_set_controllers(machinedeployment::Config::new(NAMESPACE));
    let sets: Api<MachineSet> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let machine = one_machine_set(&cluster).await;
    sets.patch(
        "workers",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"autoPreserveFailedMachineMax": 1}})),
    )
    .await
    .expect("the max is set");
    let name = machine.name_any();
    let node = node_label(&machine).expect("a node").to_owned();

    cluster.faults.set_node_not_ready(&node);
    let preserved = cluster
        .wait_machine(&name, "auto-preserved", |m| {
            m.preserve_expiry().is_some()
                && annotation(&m.metadata, annotations::PRESERVE) == Some("auto-preserved")
        })
        .await;
    assert_eq!(preserved.phase(), Some(MachinePhase::Failed));
    let marked = wait_node(&cluster, &node, "Preserved by MCM.", |n| {
        preserved_condition(n).is_some_and(|(_, reason, _)| reason == "Preserved by MCM.")
    })
    .await;
    assert!(has_preserved_taint(&marked));
    wait_for("the set counts it", async || {
        let status = sets.get("workers").await.ok()?.status?;
        (status.auto_preserve_failed_machine_count == Some(1) && status.preserved_failed_replicas == 1)
            .then_some(())
    })
    .await;
    let replaced = watch_window(Duration::from_secs(2), async || {
        let list = cluster.machines().list(&ListParams::default()).await.ok()?;
        (list.items.len() != 1).then_some(list.items.len())
    })
    .await;
    assert_eq!(replaced, None, "no replacement while auto-preserved");

    sets.patch(
        "workers",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"autoPreserveFailedMachineMax": 0}})),
    )
    .await
    .expect("the max is lowered");
    wait_for("the Failed machine replaced", async || {
        let list = cluster.machines().list(&ListParams::default()).await.ok()?;
        let old_gone = list
            .items
            .iter()
            .all(|m| m.name_any() != name || m.metadata.deletion_timestamp.is_some());
        let new_running = list
            .items
            .iter()
            .any(|m| m.name_any() != name && m.phase() == Some(MachinePhase::Running));
        (old_gone && new_running).then_some(())
    })
    .await;
    wait_for("the count back to none", async || {
        let status = sets.get("workers").await.ok()?.status.unwrap_or_default();
        status.auto_preserve_failed_machine_count.is_none().then_some(())
    })
    .await;
    cluster.stop().await;
}
