//! The MachineSet controller with the machine controller, against the embedded API server over HTTPS with the sim
//! provider and its kubelet: scaling up and down, and a lagging cache that must never yield an extra machine.

use crate::support;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use mcm_api::{
    Machine, MachinePhase,
    builders::{MachineDeploymentBuilder, MachineSetBuilder},
};
use serde_json::json;
use support::{Cluster, Setup};

const DEADLINE: Duration = Duration::from_mins(1);

/// Server (with `watch_delay` on every watch event), sim provider and kubelet, the machine, set and deployment
/// controllers, and the classes `small` and `medium`.
async fn start(watch_delay: Duration) -> Cluster {
    let mut setup = Setup::for_sets();
    setup.server.watch_delay = watch_delay;
    Cluster::start_with_set_controllers(setup, support::set_config()).await
}

/// This file's helpers on the shared harness.
impl Cluster {
    async fn create_set(&self, replicas: i32) {
        let set = MachineSetBuilder::new("workers")
            .replicas(replicas)
            .matching([("pool", "workers")])
            .class("small")
            .build();
        self.sets().create(&PostParams::default(), &set).await.unwrap();
    }

    async fn scale(&self, replicas: i32) {
        self.sets()
            .patch(
                "workers",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "replicas": replicas } })),
            )
            .await
            .unwrap();
    }

    /// The machines of the set that are not being deleted.
    async fn live_machines(&self) -> Vec<Machine> {
        self.machines()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .collect()
    }
}

/// Waits until `probe` gives a value, within this file's deadline.
async fn eventually<T>(what: &str, probe: impl AsyncFnMut() -> Option<T>) -> T {
    support::wait_within(DEADLINE, what, probe).await
}

/// Records the largest number of live machines seen at once, over every version the watch delivers.
fn count_peak(api: Api<Machine>) -> (Arc<Mutex<usize>>, tokio::task::JoinHandle<()>) {
    let peak = Arc::new(Mutex::new(0usize));
    let seen = peak.clone();
    let task = tokio::spawn(async move {
        let (store, writer) = kube::runtime::reflector::store::<Machine>();
        let mut stream = watcher(api, watcher::Config::default())
            .reflect(writer)
            .applied_objects()
            .boxed();
        while stream.next().await.is_some() {
            let live = store
                .state()
                .iter()
                .filter(|m| m.metadata.deletion_timestamp.is_none())
                .count();
            let mut peak = seen.lock().unwrap();
            *peak = (*peak).max(live);
        }
    });
    (peak, task)
}

/// Reference §5: a MachineSet keeps `spec.replicas` machines, creating with the template and deleting in the
/// reference's order; status counts ready machines. Scale 0 → 10 → 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_scales_from_zero_to_ten_to_three() {
    let h = start(Duration::ZERO).await;
    h.create_set(0).await;
    eventually("the set's finalizer and status", || async {
        let set = h.sets().get("workers").await.unwrap();
        (set.status.as_ref().map(|s| s.observed_generation) == set.metadata.generation).then_some(())
    })
    .await;
    assert!(h.live_machines().await.is_empty());

    h.scale(10).await;
    eventually("ten Running machines", || async {
        let machines = h.live_machines().await;
        (machines.len() == 10 && machines.iter().all(|m| m.phase() == Some(MachinePhase::Running)))
            .then_some(())
    })
    .await;
    let set = eventually("readyReplicas 10", || async {
        let set = h.sets().get("workers").await.unwrap();
        (set.status.as_ref().map(|s| s.ready_replicas) == Some(10)).then_some(set)
    })
    .await;
    for machine in h.live_machines().await {
        assert!(
            machine.name_any().starts_with("workers-"),
            "{}",
            machine.name_any()
        );
        assert_eq!(machine.labels().get("pool").map(String::as_str), Some("workers"));
        let owner = &machine.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("MachineSet", set.uid().unwrap().as_str())
        );
    }
    assert_eq!(h.driver.vms().len(), 10);

    h.scale(3).await;
    eventually("three machines and three VMs left", || async {
        (h.machines()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
            == 3
            && h.driver.vms().len() == 3)
            .then_some(())
    })
    .await;
    eventually("status replicas 3", || async {
        let set = h.sets().get("workers").await.unwrap();
        set.status
            .as_ref()
            .is_some_and(|s| s.replicas == 3 && s.ready_replicas == 3)
            .then_some(())
    })
    .await;
    h.stop().await;
}

/// Issue 7: "expectations enforced, so a lagging cache never yields extra machines". Every watch event reaches the
/// controllers 700ms late; a set of 5 never has more than 5 live machines at any observed moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_cache_never_yields_an_extra_machine() {
    let h = start(Duration::from_millis(700)).await;
    let (peak, watcher_task) = count_peak(h.machines());
    h.create_set(5).await;
    eventually("five Running machines", || async {
        let machines = h.live_machines().await;
        (machines.len() == 5 && machines.iter().all(|m| m.phase() == Some(MachinePhase::Running)))
            .then_some(())
    })
    .await;
    // Failed machines are replaced one for one, still without overshoot.
    let victim = h.live_machines().await[0].name_any();
    h.driver.faults().vanish(&victim);
    eventually("the vanished machine replaced", || async {
        let machines = h.live_machines().await;
        (machines.len() == 5
            && machines.iter().all(|m| m.name_any() != victim)
            && machines.iter().all(|m| m.phase() == Some(MachinePhase::Running)))
        .then_some(())
    })
    .await;
    assert_eq!(*peak.lock().unwrap(), 5, "never more than 5 live machines");
    watcher_task.abort();
    h.stop().await;
}

/// Spec 002 §12 / reference §6.3: a RollingUpdate never has more than `replicas + maxSurge` machines nor fewer than
/// `replicas - maxUnavailable` Running ones, on every observed state, and ends with every machine on the new
/// template and the old set scaled to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_keeps_within_surge_and_unavailability() {
    let h = start(Duration::ZERO).await;
    let deployments = h.deployments();
    let deployment = MachineDeploymentBuilder::new("pool")
        .replicas(4)
        .matching([("pool", "rolling")])
        .strategy("RollingUpdate")
        .max_surge(IntOrString::Int(1))
        .max_unavailable(IntOrString::Int(1))
        .class("small")
        .build();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    eventually("four Running machines of the small class", || async {
        let machines = h.live_machines().await;
        (machines.len() == 4 && machines.iter().all(|m| m.phase() == Some(MachinePhase::Running)))
            .then_some(())
    })
    .await;

    // Watch every machine version from here: total and Running counts at each observed state.
    let bounds = Arc::new(Mutex::new((0usize, usize::MAX)));
    let seen = bounds.clone();
    let api = h.machines();
    let watch = tokio::spawn(async move {
        let (store, writer) = kube::runtime::reflector::store::<Machine>();
        let mut stream = watcher(api, watcher::Config::default())
            .reflect(writer)
            .applied_objects()
            .boxed();
        let mut started = false;
        while stream.next().await.is_some() {
            let state = store.state();
            let live = state.iter().filter(|m| m.metadata.deletion_timestamp.is_none());
            let total = live.clone().count();
            let running = live.filter(|m| m.phase() == Some(MachinePhase::Running)).count();
            // The initial list fills the store one object at a time: count from the first complete picture on.
            if total < 4 && !started {
                continue;
            }
            started = true;
            let mut bounds = seen.lock().unwrap();
            bounds.0 = bounds.0.max(total);
            bounds.1 = bounds.1.min(running);
        }
    });
    deployments
        .patch(
            "pool",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "template": { "spec": { "class": { "name": "medium" } } } } })),
        )
        .await
        .unwrap();
    eventually("four Running machines of the medium class", || async {
        let machines = h.machines().list(&ListParams::default()).await.unwrap().items;
        (machines.len() == 4
            && machines
                .iter()
                .all(|m| m.spec.class.name == "medium" && m.phase() == Some(MachinePhase::Running)))
        .then_some(())
    })
    .await;
    let deployment = eventually("the deployment's status", || async {
        let d = deployments.get("pool").await.unwrap();
        d.status
            .as_ref()
            .is_some_and(|s| s.updated_replicas == 4 && s.available_replicas == 4 && s.replicas == 4)
            .then_some(d)
    })
    .await;
    let sets = h.sets().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(sets.len(), 2, "the new set and the old one, kept as history");
    assert!(
        sets.iter().any(|s| s.spec.replicas == 0),
        "the old set is scaled to zero"
    );
    let (max_total, min_running) = *bounds.lock().unwrap();
    watch.abort();
    assert!(
        max_total <= 5,
        "total never above replicas + maxSurge: {max_total}"
    );
    assert!(
        min_running >= 3,
        "Running never below replicas - maxUnavailable: {min_running}"
    );
    assert_eq!(
        deployment.status.unwrap().observed_generation,
        deployment.metadata.generation.unwrap()
    );
    h.stop().await;
}
