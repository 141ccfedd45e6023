//! The API server reachability freeze against a real outage: the embedded API server (on disk, so it comes back
//! with everything) is stopped for longer than the status-check timeout while the kubelets cannot heartbeat, then
//! restarted on the same port. With the freeze, the machine controller does nothing while the server is away and
//! holds on until the kubelets are back: no machine is replaced. The same outage with the freeze switched off (a
//! very long timeout) replaces machines, which proves that the freeze is what protects them.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use mcm_api::{
    Machine, MachineClass, MachinePhase, MachineSet,
    builders::{MachineClassBuilder, MachineSetBuilder},
};
use mcm_apiserver::{ApiServer, Config as ServerConfig};
use mcm_controllers::{machine, machineset, reachability};
use mcm_core::reachability::ReachabilitySettings;
use mcm_provider_sim::{Faults, Kubelet, KubeletConfig, KubeletHandle, SimConfig, SimDriver};
use serde_json::json;
use tokio::sync::watch;

const DEADLINE: Duration = Duration::from_mins(1);
/// The sim kubelets' heartbeat; the node monitor's grace is a few of them.
const HEARTBEAT: Duration = Duration::from_millis(300);
const GRACE: Duration = Duration::from_millis(1500);
/// Short, so that without the freeze an Unknown machine is Failed long before its kubelet is back.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

async fn client_of(server: &ApiServer) -> Client {
    let file = Kubeconfig::read_from(server.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

async fn eventually<T, Fut>(what: &str, mut probe: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Option<T>>,
{
    tokio::time::timeout(DEADLINE, async {
        loop {
            if let Some(value) = probe().await {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

struct World {
    config: ServerConfig,
    server: Option<ApiServer>,
    client: Client,
    faults: Faults,
    freeze: reachability::Freeze,
    kubelet: Option<KubeletHandle>,
    stop: watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

impl World {
    async fn start(settings: ReachabilitySettings) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ServerConfig::new(dir.path());
        config.in_memory = false;
        config.node_monitor_grace_period = GRACE;
        config.node_monitor_period = Duration::from_millis(100);
        let server = ApiServer::start(config.clone()).await.unwrap();
        // Restarts come back on the same port, so every client (kubelets, controllers) finds the server again.
        config.port = server.url().rsplit(':').next().unwrap().parse().unwrap();
        let client = client_of(&server).await;
        let driver = SimDriver::new(SimConfig::default());
        let faults = driver.faults();
        let kubelet = Kubelet::start(
            &driver,
            client.clone(),
            KubeletConfig {
                heartbeat_interval: HEARTBEAT,
                ..KubeletConfig::default()
            },
        );
        let (stop, rx) = watch::channel(false);
        let freeze = reachability::Freeze::default();
        let mut controller_settings = mcm_core::ControllerSettings {
            machine_health_timeout: HEALTH_TIMEOUT,
            ..mcm_core::ControllerSettings::default()
        };
        // The remediation guard would also hold back replacing every machine at once; switched off here so that
        // only the freeze stands between an outage and replacements.
        controller_settings.remediation.max_unhealthy_share = 1.0;
        controller_settings.remediation.max_concurrent_replacements = 100;
        tokio::spawn(reachability::run(
            client.clone(),
            Some(client.clone()),
            reachability::Config {
                namespace: "default".into(),
                settings,
            },
            freeze.clone(),
            None,
            stopped(rx.clone()),
        ));
        tokio::spawn(machine::run(
            client.clone(),
            Some(client.clone()),
            Arc::new(driver),
            machine::Config {
                namespace: "default".into(),
                settings: controller_settings,
                concurrency: 4,
            },
            machine::Extras {
                freeze: freeze.clone(),
                ..machine::Extras::default()
            },
            stopped(rx.clone()),
        ));
        tokio::spawn(machineset::run(
            client.clone(),
            machineset::Config {
                namespace: "default".into(),
                concurrency: 2,
                resync: Duration::from_mins(10),
                min_ready_seconds: mcm_core::machineset::MinReadySeconds::Ignore,
            },
            None,
            stopped(rx),
        ));
        let world = Self {
            config,
            server: Some(server),
            client,
            faults,
            freeze,
            kubelet: Some(kubelet),
            stop,
            _dir: dir,
        };
        world.create_set().await;
        world
    }

    async fn create_set(&self) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": "boot" },
            "stringData": { "userData": "#!/bin/sh\necho hi\n" }
        }))
        .unwrap();
        Api::<Secret>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let class = MachineClassBuilder::new("small")
            .provider("sim")
            .provider_spec(
                json!({ "vmPool": "p", "size": "small", "tags": { "kubernetes.io/cluster/c": "1" } }),
            )
            .secret_ref("boot", "default")
            .build();
        Api::<MachineClass>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
        let set = MachineSetBuilder::new("workers")
            .replicas(2)
            .matching([("pool", "workers")])
            .class("small")
            .build();
        Api::<MachineSet>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &set)
            .await
            .unwrap();
    }

    async fn machines(&self) -> Vec<Machine> {
        Api::<Machine>::namespaced(self.client.clone(), "default")
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    async fn running(&self) -> Vec<String> {
        eventually("two Running machines", || async {
            let machines = self.machines().await;
            (machines.len() == 2 && machines.iter().all(|m| m.phase() == Some(MachinePhase::Running)))
                .then(|| machines.iter().map(ResourceExt::name_any).collect())
        })
        .await
    }

    /// Stops the server with the kubelets cut off too (they cannot heartbeat while it is away).
    async fn outage(&mut self, machines: &[String]) {
        for name in machines {
            self.faults.stop_heartbeats(name);
        }
        self.server.take().unwrap().shutdown().await;
    }

    async fn restart(&mut self) {
        self.server = Some(ApiServer::start(self.config.clone()).await.unwrap());
        eventually("the nodes Unknown after the outage", || async {
            let nodes = Api::<Node>::all(self.client.clone())
                .list(&ListParams::default())
                .await
                .ok()?;
            (nodes.items.len() == 2
                && nodes.items.iter().all(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "Unknown"))
                }))
            .then_some(())
        })
        .await;
    }

    async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.stop().await;
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_timeout_freezes_and_replaces_no_machine() {
    let settings = ReachabilitySettings {
        period: Duration::from_secs(2),
        timeout: Duration::from_secs(2),
    };
    let mut world = World::start(settings).await;
    let before = world.running().await;
    world.outage(&before).await;
    eventually("the freeze", || async { world.freeze.is_frozen().then_some(()) }).await;
    world.restart().await;
    // The kubelets come back well after the health timeout would have run out: only the freeze (which holds for a
    // timeout after the server answers again) keeps their machines from being Failed meanwhile.
    tokio::time::sleep(HEALTH_TIMEOUT * 2).await;
    assert!(
        world.freeze.is_frozen(),
        "still frozen while the kubelets are away"
    );
    for name in &before {
        world.faults.resume_heartbeats(name);
    }
    eventually("the freeze lifted", || async {
        (!world.freeze.is_frozen()).then_some(())
    })
    .await;
    let after = world.running().await;
    assert_eq!(after, before, "the same machines, none replaced");
    for machine in world.machines().await {
        assert_ne!(machine.phase(), Some(MachinePhase::Failed));
    }
    world.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_outage_without_the_freeze_replaces_machines() {
    // A timeout far longer than the outage: the controller never freezes.
    let settings = ReachabilitySettings {
        period: Duration::from_hours(1),
        timeout: Duration::from_hours(1),
    };
    let mut world = World::start(settings).await;
    let before = world.running().await;
    world.outage(&before).await;
    // As long as the outage above took to freeze.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!world.freeze.is_frozen());
    world.restart().await;
    eventually("a machine Failed or replaced", || async {
        let machines = world.machines().await;
        machines
            .iter()
            .any(|m| m.phase() == Some(MachinePhase::Failed) || !before.contains(&m.name_any()))
            .then_some(())
    })
    .await;
    for name in &before {
        world.faults.resume_heartbeats(name);
    }
    world.stop().await;
}
