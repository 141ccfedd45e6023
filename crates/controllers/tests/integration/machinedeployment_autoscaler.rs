//! The MachineDeployment controller with the cluster-autoscaler and the nodes, against the embedded API server with
//! the sim provider: the trigger-deletion handshake deletes exactly the machines the autoscaler chose; a rollout
//! marks the nodes (scale-down-disabled annotations, PreferNoSchedule taint on old machines' nodes) and clears the
//! marks when it completes; a stuck rollout reports ProgressDeadlineExceeded and recovers; nodeTemplate,
//! configuration and the effective creation timeout reach existing machines without a rollout.

use crate::support;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::{
    ConditionStatus, Machine, MachineDeployment, MachineDeploymentConditionType, MachinePhase, MachineSet,
    keys,
};
use mcm_controllers::machinedeployment;
use mcm_driver::{DriverMethod, MachineCode};
use mcm_provider_sim::Target;
use serde_json::json;
use support::{CLASS, Cluster, History, NAMESPACE, node_label, settings, wait_for};

const DEPLOYMENT: &str = "pool";

async fn start() -> Cluster {
    let mut cluster = Cluster::start(settings()).await;
    cluster.create_class().await;
    cluster
        .create_sim_class(
            "sim-medium",
            json!({
                "vmPool": "pool",
                "size": "medium",
                "tags": { "kubernetes.io/cluster/test": "1", "kubernetes.io/role/node": "1" }
            }),
        )
        .await;
    cluster.start_set_controllers(machinedeployment::Config {
        concurrency: 4,
        ..machinedeployment::Config::new(NAMESPACE)
    });
    cluster
}

fn deployments(cluster: &Cluster) -> Api<MachineDeployment> {
    Api::namespaced(cluster.client.clone(), NAMESPACE)
}

/// Creates the deployment; `extra_spec` fields are added to its spec.
async fn create_deployment(cluster: &Cluster, replicas: i32, extra_spec: serde_json::Value) {
    let mut value = json!({
        "metadata": { "name": DEPLOYMENT },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "pool": DEPLOYMENT } },
            "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 0 } },
            "template": {
                "metadata": { "labels": { "pool": DEPLOYMENT } },
                "spec": { "class": { "kind": "MachineClass", "name": CLASS } }
            }
        }
    });
    if let serde_json::Value::Object(fields) = extra_spec {
        for (key, field) in fields {
            value["spec"][key] = field;
        }
    }
    let deployment: MachineDeployment = serde_json::from_value(value).unwrap();
    deployments(cluster)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
}

async fn patch_deployment(cluster: &Cluster, patch: serde_json::Value) {
    deployments(cluster)
        .patch(DEPLOYMENT, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// The machines not being deleted.
async fn live(cluster: &Cluster) -> Vec<Machine> {
    cluster
        .machines()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .collect()
}

/// Waits until exactly `n` machines exist, all Running with a node and of `class`, and returns them.
async fn wait_running(cluster: &Cluster, n: usize, class: &str) -> Vec<Machine> {
    wait_for(&format!("{n} Running machines of {class}"), async || {
        let all = cluster
            .machines()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        (all.len() == n
            && all.iter().all(|m| {
                m.phase() == Some(MachinePhase::Running)
                    && m.spec.class.name == class
                    && node_label(m).is_some()
            }))
        .then_some(all)
    })
    .await
}

fn progressing(deployment: &MachineDeployment) -> Option<(ConditionStatus, String)> {
    deployment
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == MachineDeploymentConditionType::Progressing)
        .map(|c| (c.status, c.reason.clone()))
}

async fn wait_complete(cluster: &Cluster, replicas: i32) -> MachineDeployment {
    wait_for("the rollout to complete", async || {
        let d = deployments(cluster).get(DEPLOYMENT).await.unwrap();
        let status = d.status.as_ref()?;
        (status.updated_replicas == replicas
            && status.available_replicas == replicas
            && status.replicas == replicas
            && progressing(&d) == Some((ConditionStatus::True, "NewMachineSetAvailable".into())))
        .then_some(d)
    })
    .await
}

fn annotation<'a>(object: &'a impl ResourceExt, key: &str) -> Option<&'a str> {
    object.annotations().get(key).map(String::as_str)
}

fn has_prefer_no_schedule_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter().any(|t| {
                t.key == keys::annotations::PREFER_NO_SCHEDULE
                    && t.effect == "PreferNoSchedule"
                    && t.value.as_deref() == Some("True")
            })
        })
}

fn scale_down_disabled_by_us(node: &Node) -> bool {
    annotation(node, keys::annotations::SCALE_DOWN_DISABLED) == Some("true")
        && annotation(node, keys::annotations::SCALE_DOWN_DISABLED_BY_MCM) == Some("true")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_autoscaler_handshake_deletes_exactly_the_machines_it_chose() {
    let cluster = start().await;
    create_deployment(&cluster, 4, json!({})).await;
    let machines = wait_running(&cluster, 4, CLASS).await;
    let history = History::<Machine>::start(cluster.machines()).await;
    // The autoscaler picks two machines (here the last two by name, whatever the default deletion order would
    // choose), one in the current format and one in the legacy one, and lowers replicas in the same update.
    let mut names: Vec<String> = machines.iter().map(ResourceExt::name_any).collect();
    names.sort();
    let chosen: BTreeSet<String> = names[2..].iter().cloned().collect();
    let kept: BTreeSet<String> = names[..2].iter().cloned().collect();
    let marked_at = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    patch_deployment(
        &cluster,
        json!({
            "metadata": { "annotations": {
                keys::annotations::TRIGGER_DELETION_BY_MCM: format!("{}~{marked_at},{}", names[2], names[3]),
                keys::annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME: marked_at,
            } },
            "spec": { "replicas": 2 }
        }),
    )
    .await;

    wait_for("only the machines the autoscaler did not choose", async || {
        let all = cluster
            .machines()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let left: BTreeSet<String> = all.iter().map(ResourceExt::name_any).collect();
        (left == kept).then_some(())
    })
    .await;
    let deployment = wait_for("the trigger annotation consumed", async || {
        let d = deployments(&cluster).get(DEPLOYMENT).await.unwrap();
        annotation(&d, keys::annotations::TRIGGER_DELETION_BY_MCM)
            .is_none()
            .then_some(d)
    })
    .await;
    assert_eq!(
        annotation(&deployment, keys::annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME),
        Some(marked_at.as_str())
    );

    let versions = history.versions();
    for name in &chosen {
        assert!(
            versions.iter().any(|v| v.object.name_any() == *name
                && annotation(&v.object, keys::annotations::MACHINE_PRIORITY) == Some("1")
                && annotation(&v.object, keys::annotations::MARKED_FOR_DELETION_TIME)
                    == Some(marked_at.as_str())),
            "{name} was stamped priority 1 with the autoscaler's time"
        );
    }
    for name in &kept {
        assert!(
            history
                .of(name)
                .iter()
                .all(|v| v.object.metadata.deletion_timestamp.is_none()
                    && annotation(&v.object, keys::annotations::MACHINE_PRIORITY) != Some("1")),
            "{name} was never marked nor deleted"
        );
    }
    let ever: BTreeSet<String> = versions.iter().map(|v| v.object.name_any()).collect();
    assert_eq!(ever.len(), 4, "no machine was created: {ever:?}");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_marks_the_nodes_and_clears_the_marks_when_it_completes() {
    let cluster = start().await;
    create_deployment(&cluster, 2, json!({})).await;
    let old_nodes: BTreeSet<String> = wait_running(&cluster, 2, CLASS)
        .await
        .iter()
        .filter_map(|m| node_label(m).map(str::to_owned))
        .collect();
    wait_complete(&cluster, 2).await;
    let nodes = History::<Node>::start(cluster.nodes()).await;
    let sets = History::<MachineSet>::start(Api::namespaced(cluster.client.clone(), NAMESPACE)).await;
    patch_deployment(
        &cluster,
        json!({ "spec": { "template": { "spec": { "class": { "name": "sim-medium" } } } } }),
    )
    .await;
    let machines = wait_running(&cluster, 2, "sim-medium").await;
    wait_complete(&cluster, 2).await;
    let new_nodes: BTreeSet<String> = machines
        .iter()
        .filter_map(|m| node_label(m).map(str::to_owned))
        .collect();
    wait_for("the new nodes without rollout marks", async || {
        let mut clean = true;
        for name in &new_nodes {
            let node = cluster.nodes().get(name).await.unwrap();
            clean &= !has_prefer_no_schedule_taint(&node)
                && annotation(&node, keys::annotations::SCALE_DOWN_DISABLED).is_none()
                && annotation(&node, keys::annotations::SCALE_DOWN_DISABLED_BY_MCM).is_none();
        }
        clean.then_some(())
    })
    .await;

    let versions = nodes.versions();
    for old in &old_nodes {
        assert!(
            versions.iter().any(|v| v.object.name_any() == *old
                && has_prefer_no_schedule_taint(&v.object)
                && scale_down_disabled_by_us(&v.object)),
            "old node {old} carried the PreferNoSchedule taint and the scale-down-disabled annotations"
        );
    }
    for new in &new_nodes {
        let seen = nodes.of(new);
        assert!(
            seen.iter().all(|v| !has_prefer_no_schedule_taint(&v.object)),
            "new node {new} never got the taint"
        );
        assert!(
            seen.iter().any(|v| scale_down_disabled_by_us(&v.object)),
            "new node {new} had scale-down disabled while old machines were still there"
        );
    }
    let old_set_marked = sets.versions().iter().any(|v| {
        v.object.spec.template.spec.class.name == CLASS
            && annotation(&v.object, keys::annotations::PREFER_NO_SCHEDULE) == Some("True")
    });
    assert!(old_set_marked, "the old set was marked PreferNoSchedule");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_rollout_reports_progress_deadline_exceeded_and_recovers() {
    let cluster = start().await;
    create_deployment(&cluster, 2, json!({ "progressDeadlineSeconds": 2 })).await;
    let before: BTreeSet<String> = wait_running(&cluster, 2, CLASS)
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    wait_complete(&cluster, 2).await;
    // No new machine can be created: the rollout cannot progress.
    let fault = cluster
        .faults
        .fail(DriverMethod::CreateMachine, MachineCode::Unavailable, Target::All);
    patch_deployment(
        &cluster,
        json!({ "spec": { "template": { "spec": { "class": { "name": "sim-medium" } } } } }),
    )
    .await;
    let stuck = wait_for("Progressing=False/ProgressDeadlineExceeded", async || {
        let d = deployments(&cluster).get(DEPLOYMENT).await.unwrap();
        (progressing(&d) == Some((ConditionStatus::False, "ProgressDeadlineExceeded".into()))).then_some(d)
    })
    .await;
    let condition = stuck
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.r#type == MachineDeploymentConditionType::Progressing)
        .unwrap();
    assert!(
        condition.message.contains("has timed out progressing"),
        "{}",
        condition.message
    );
    assert!(
        !cluster
            .events_for(None, DEPLOYMENT, "ProgressDeadlineExceeded")
            .await
            .is_empty(),
        "a Warning event tells the user"
    );
    // maxUnavailable 0: the old machines are all still there and Running; no automatic rollback.
    let old_still: BTreeSet<String> = live(&cluster)
        .await
        .iter()
        .filter(|m| m.phase() == Some(MachinePhase::Running))
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(old_still, before);
    assert_eq!(
        deployments(&cluster)
            .get(DEPLOYMENT)
            .await
            .unwrap()
            .spec
            .template
            .spec
            .class
            .name,
        "sim-medium"
    );

    cluster.faults.remove(fault);
    wait_running(&cluster, 2, "sim-medium").await;
    wait_complete(&cluster, 2).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_template_and_configuration_reach_existing_machines_without_a_rollout() {
    let cluster = start().await;
    create_deployment(&cluster, 2, json!({})).await;
    let before: BTreeSet<String> = wait_running(&cluster, 2, CLASS)
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    patch_deployment(
        &cluster,
        json!({
            "metadata": { "annotations": { keys::annotations::EFFECTIVE_CREATION_TIMEOUT: "25m" } },
            "spec": { "template": { "spec": {
                "nodeTemplate": { "metadata": { "labels": { "topology.example.com/zone": "z1" } } },
                "drainTimeout": "7m"
            } } }
        }),
    )
    .await;
    let machines = wait_for("the machines to carry the new template parts", async || {
        let all = cluster
            .machines()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        all.iter()
            .all(|m| {
                m.spec
                    .node_template
                    .as_ref()
                    .and_then(|t| t.metadata.as_ref())
                    .and_then(|m| m.labels.as_ref())
                    .and_then(|l| l.get("topology.example.com/zone"))
                    .is_some_and(|z| z == "z1")
                    && m.spec.configuration.drain_timeout.as_ref().map(|d| d.0.as_str()) == Some("7m")
                    && annotation(m, keys::annotations::EFFECTIVE_CREATION_TIMEOUT) == Some("25m")
            })
            .then_some(all)
    })
    .await;
    let after: BTreeSet<String> = machines.iter().map(ResourceExt::name_any).collect();
    assert_eq!(after, before, "the same machines: nothing was replaced");
    let sets = cluster.sets().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(sets.len(), 1, "no new set");
    assert_eq!(
        annotation(&sets[0], keys::annotations::EFFECTIVE_CREATION_TIMEOUT),
        Some("25m")
    );
    // The node sync hands the nodeTemplate's labels on to the nodes.
    for machine in &machines {
        let node = node_label(machine).unwrap().to_owned();
        wait_for("the node to carry the zone label", async || {
            let n = cluster.nodes().get(&node).await.unwrap();
            (n.labels().get("topology.example.com/zone").map(String::as_str) == Some("z1")).then_some(())
        })
        .await;
    }
    cluster.stop().await;
}
