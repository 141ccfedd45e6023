//! The MachineSet controller with the machine controller, against the embedded API server over HTTPS with the sim
//! provider and its kubelet: scaling up and down, and a lagging cache that must never yield an extra machine.

mod support;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use mcm_api::{
    Machine, MachineClass, MachineDeployment, MachinePhase, MachineSet,
    builders::{MachineClassBuilder, MachineSetBuilder},
};
use mcm_apiserver::{ApiServer, Config as ServerConfig};
use mcm_controllers::{machine, machinedeployment, machineset};
use mcm_provider_sim::{Kubelet, KubeletConfig, KubeletHandle, SimConfig, SimDriver};
use serde_json::json;
use tokio::sync::watch;

const DEADLINE: Duration = Duration::from_mins(1);

struct Harness {
    server: Option<ApiServer>,
    _dir: tempfile::TempDir,
    client: Client,
    driver: SimDriver,
    kubelet: Option<KubeletHandle>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

impl Harness {
    /// Server (with `watch_delay` on every watch event), sim provider and kubelet, machine and set controllers.
    async fn start(watch_delay: Duration) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ServerConfig::new(dir.path());
        config.in_memory = true;
        config.watch_delay = watch_delay;
        // A vanished VM's silent node turns Unknown within seconds.
        config.node_monitor_grace_period = Duration::from_secs(2);
        config.node_monitor_period = Duration::from_millis(200);
        let server = ApiServer::start(config).await.unwrap();
        let client = support::client_for(&server).await;
        let driver = SimDriver::new(SimConfig::default());
        let kubelet = Kubelet::start(
            &driver,
            client.clone(),
            KubeletConfig {
                heartbeat_interval: Duration::from_millis(500),
                ..KubeletConfig::default()
            },
        );
        let (stop, rx) = watch::channel(false);
        let machines = tokio::spawn(machine::run(
            client.clone(),
            Some(client.clone()),
            Arc::new(driver.clone()),
            machine::Config {
                namespace: "default".into(),
                settings: mcm_core::ControllerSettings::default(),
                concurrency: 8,
            },
            machine::Extras::default(),
            stopped(rx.clone()),
        ));
        let sets = tokio::spawn(machineset::run(
            client.clone(),
            machineset::Config {
                namespace: "default".into(),
                concurrency: 4,
                resync: Duration::from_mins(10),
                min_ready_seconds: mcm_core::machineset::MinReadySeconds::Ignore,
            },
            None,
            stopped(rx.clone()),
        ));
        let deployments = tokio::spawn(machinedeployment::run(
            client.clone(),
            Some(client.clone()),
            machinedeployment::Config {
                concurrency: 4,
                ..machinedeployment::Config::new("default")
            },
            None,
            stopped(rx),
        ));
        let h = Self {
            server: Some(server),
            _dir: dir,
            client,
            driver,
            kubelet: Some(kubelet),
            stop,
            tasks: vec![machines, sets, deployments],
        };
        h.create_class().await;
        h
    }

    async fn stop(mut self) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            let _ = tokio::time::timeout(DEADLINE, task).await;
        }
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.stop().await;
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }

    fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), "default")
    }

    fn sets(&self) -> Api<MachineSet> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create_class(&self) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": "boot" },
            "stringData": { "userData": "#!/bin/sh\necho <<MACHINE_NAME>>\n" }
        }))
        .unwrap();
        Api::<Secret>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        for size in ["small", "medium"] {
            let class = MachineClassBuilder::new(size)
                .provider("sim")
                .provider_spec(
                    json!({ "vmPool": "pool-a", "size": size, "tags": { "kubernetes.io/cluster/c": "1" } }),
                )
                .secret_ref("boot", "default")
                .build();
            Api::<MachineClass>::namespaced(self.client.clone(), "default")
                .create(&PostParams::default(), &class)
                .await
                .unwrap();
        }
    }

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

async fn eventually<T, Fut>(what: &str, mut probe: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let h = Harness::start(Duration::ZERO).await;
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
    let h = Harness::start(Duration::from_millis(700)).await;
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
    let h = Harness::start(Duration::ZERO).await;
    let deployments: Api<MachineDeployment> = Api::namespaced(h.client.clone(), "default");
    let deployment: MachineDeployment = serde_json::from_value(json!({
        "metadata": { "name": "pool" },
        "spec": {
            "replicas": 4,
            "selector": { "matchLabels": { "pool": "rolling" } },
            "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 1 } },
            "template": {
                "metadata": { "labels": { "pool": "rolling" } },
                "spec": { "class": { "kind": "MachineClass", "name": "small" } }
            }
        }
    }))
    .unwrap();
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
