//! `minReadySeconds` as the reference treats it: ignored. Gardener sets `minReadySeconds: 500` on every
//! MachineDeployment because the reference's `isMachineAvailable` looks at the phase only; a machine is available as
//! soon as it is Running, and a rolling update does not wait 500 s per batch. (Honouring it is the opt-in
//! `--honour-min-ready-seconds`; machinedeployment_strategies.rs runs with it on.)

use crate::support;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::{
    ConditionStatus, MachineDeployment, MachineDeploymentConditionType, MachinePhase,
    builders::MachineDeploymentBuilder,
};
use mcm_controllers::machinedeployment;
use serde_json::json;
use support::{CLASS, Cluster, NAMESPACE, wait_for};

/// The deployment's status once every machine counts: `available` machines, and the `Available` condition True.
fn available(deployment: &MachineDeployment, replicas: i32) -> bool {
    let Some(status) = deployment.status.as_ref() else {
        return false;
    };
    status.available_replicas == replicas
        && status.conditions.iter().any(|c| {
            c.r#type == MachineDeploymentConditionType::Available && c.status == ConditionStatus::True
        })
}

/// Gardener's shape (minReadySeconds 500, progressDeadlineSeconds 600): the deployment is Available once its
/// machines are Running, and a rolling update to another class completes, each batch going on as soon as the new
/// machines are Running (the test's 45 s deadline is far below one 500 s wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_with_min_ready_seconds_500_is_available_and_rolls_without_waiting() {
    let mut cluster = Cluster::start(support::settings()).await;
    cluster.create_class().await;
    let mut second = cluster.classes().get(CLASS).await.unwrap();
    second.metadata = kube::api::ObjectMeta {
        name: Some("second".into()),
        ..Default::default()
    };
    cluster
        .classes()
        .create(&PostParams::default(), &second)
        .await
        .unwrap();
    cluster.start_set_controllers(machinedeployment::Config::new(NAMESPACE));
    let deployments: Api<MachineDeployment> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    let deployment = MachineDeploymentBuilder::new("workers")
        .replicas(2)
        .min_ready_seconds(500)
        .with(|d| d.spec.progress_deadline_seconds = Some(600))
        .matching([("pool", "workers")])
        .strategy("RollingUpdate")
        .max_surge(IntOrString::Int(1))
        .max_unavailable(IntOrString::Int(0))
        .class(CLASS)
        .build();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    wait_for("2 machines available and the deployment Available", async || {
        let deployment = deployments.get("workers").await.ok()?;
        available(&deployment, 2).then_some(())
    })
    .await;

    deployments
        .patch(
            "workers",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "template": { "spec": { "class": { "name": "second" } } } } })),
        )
        .await
        .unwrap();
    wait_for("the rollout to the second class complete", async || {
        let deployment = deployments.get("workers").await.ok()?;
        let status = deployment.status.as_ref()?;
        let machines = cluster.machines().list(&ListParams::default()).await.ok()?.items;
        let done = status.observed_generation == deployment.metadata.generation.unwrap_or_default()
            && status.updated_replicas == 2
            && status.replicas == 2
            && available(&deployment, 2)
            && machines.len() == 2
            && machines.iter().all(|m| {
                m.spec.class.name == "second"
                    && m.status.as_ref().and_then(|s| s.current_status.phase) == Some(MachinePhase::Running)
            });
        done.then_some(())
    })
    .await;
    cluster.stop().await;
}
