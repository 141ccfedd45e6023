//! The MachineDeployment controller alone (no set controller): a set whose status its controller has not written yet
//! (a set just created, or a busy set controller) still counts every machine it has toward `replicas + maxSurge`.

use crate::support;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::{
    Machine, MachineDeployment, MachineSet,
    builders::{MachineBuilder, MachineDeploymentBuilder},
};
use mcm_controllers::machinedeployment;
use serde_json::json;
use support::{Cluster, NAMESPACE, wait_for, watch_window};

/// The sets of the deployment, oldest first.
async fn sets(api: &Api<MachineSet>) -> Vec<MachineSet> {
    let mut sets = api.list(&ListParams::default()).await.unwrap().items;
    sets.sort_by_key(|s| s.metadata.creation_timestamp.clone().map(|t| t.0));
    sets
}

/// maxSurge bounds the machines that exist, not only the sets' `spec.replicas`: with 4 machines of the old set in the
/// cache and its status still at 0, the new set may have 1 replica (4 + 1 = replicas + maxSurge) and no more, even
/// once the old set is scaled down to 3 and before its controller deleted the fourth machine. (Before the fix the
/// deployment trusted the status: it grew the new set to 2, and with a set controller slow to write its status a
/// rolling update had 7 live machines for replicas 4 and maxSurge 1.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_whose_status_lags_counts_its_cached_machines_toward_the_surge() {
    let mut cluster = Cluster::start_without_controller(support::settings()).await;
    cluster.start_deployment_controller(machinedeployment::Config::new(NAMESPACE));
    let client = cluster.client.clone();
    let deployments: Api<MachineDeployment> = Api::namespaced(client.clone(), NAMESPACE);
    let set_api: Api<MachineSet> = Api::namespaced(client.clone(), NAMESPACE);
    let machines: Api<Machine> = Api::namespaced(client, NAMESPACE);
    let deployment = MachineDeploymentBuilder::new("pool")
        .replicas(4)
        .matching([("pool", "stale")])
        .strategy("RollingUpdate")
        .max_surge(IntOrString::Int(1))
        .max_unavailable(IntOrString::Int(1))
        .class("small")
        .build();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let old = wait_for("the first set at 4 replicas", async || {
        sets(&set_api).await.into_iter().find(|s| s.spec.replicas == 4)
    })
    .await;

    // The old set's machines, as its controller would have made them; the set's status is never written.
    for i in 0..4 {
        let template_labels = old
            .spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref());
        let machine = MachineBuilder::new(&format!("old-{i}"))
            .labels(
                template_labels
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            )
            .owned_by(&old)
            .class("small")
            .build();
        machines.create(&PostParams::default(), &machine).await.unwrap();
    }
    deployments
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "template": { "spec": { "class": { "name": "medium" } } } } })),
        )
        .await
        .unwrap();

    // The status of the old set says nothing is available: the rollout scales it down by maxUnavailable (4 → 3)...
    let new = wait_for("a new set, and the old one scaled to 3", async || {
        let sets = sets(&set_api).await;
        let old = sets.iter().find(|s| s.uid() == old.uid())?;
        let new = sets.iter().find(|s| s.uid() != old.uid())?;
        (old.spec.replicas == 3).then(|| new.clone())
    })
    .await;
    assert_eq!(new.spec.replicas, 1, "4 old machines + 1 = replicas + maxSurge");
    // ... and, while the old set's 4 machines exist, the new set stays at 1.
    let grown = watch_window(Duration::from_secs(2), async || {
        let now = set_api.get(&new.name_any()).await.unwrap();
        (now.spec.replicas > 1).then_some(now.spec.replicas)
    })
    .await;
    assert_eq!(grown, None, "the new set grew while 4 old machines exist");

    cluster.stop().await;
}
