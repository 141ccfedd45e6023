//! The API server reachability freeze against a real outage: the embedded API server (on disk, so it comes back
//! with everything) is stopped for longer than the status-check timeout while the kubelets cannot heartbeat, then
//! restarted on the same port. With the freeze, the machine controller does nothing while the server is away and
//! holds on until the kubelets are back: no machine is replaced. The same outage with the freeze switched off (a
//! very long timeout) replaces machines, which proves that the freeze is what protects them.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};
use mcm_api::{Machine, MachinePhase, builders::MachineSetBuilder};
use mcm_controllers::{machine, machineset, reachability};
use mcm_core::reachability::ReachabilitySettings;
use serde_json::json;
use support::{Cluster, NAMESPACE, Setup};

const DEADLINE: Duration = Duration::from_mins(1);
/// The sim kubelets' heartbeat; the node monitor's grace is a few of them.
const HEARTBEAT: Duration = Duration::from_millis(300);
const GRACE: Duration = Duration::from_millis(1500);
/// Short, so that without the freeze an Unknown machine is Failed long before its kubelet is back.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

/// Waits until `probe` gives a value, within this file's deadline.
async fn eventually<T>(what: &str, probe: impl AsyncFnMut() -> Option<T>) -> T {
    support::wait_within(DEADLINE, what, probe).await
}

/// The server on disk (so that it comes back with everything), sim provider and kubelets, the reachability loop with
/// `settings`, the machine controller under its freeze, the MachineSet controller, and the set `workers` of 2.
async fn start(settings: ReachabilitySettings) -> (Cluster, reachability::Freeze) {
    let mut controller_settings = mcm_core::ControllerSettings {
        machine_health_timeout: HEALTH_TIMEOUT,
        ..mcm_core::ControllerSettings::default()
    };
    // The remediation guard would also hold back replacing every machine at once; switched off here so that
    // only the freeze stands between an outage and replacements.
    controller_settings.remediation.max_unhealthy_share = 1.0;
    controller_settings.remediation.max_concurrent_replacements = 100;
    let mut setup = Setup::new(controller_settings);
    setup.server.in_memory = false;
    setup.server.node_monitor_grace_period = GRACE;
    setup.server.node_monitor_period = Duration::from_millis(100);
    setup.heartbeat = HEARTBEAT;
    let mut world = Cluster::start_with(setup).await;
    let freeze = reachability::Freeze::default();
    let (client, loop_freeze) = (world.client.clone(), freeze.clone());
    world.spawn_loop(|shutdown| {
        reachability::run(
            client.clone(),
            Some(client),
            reachability::Config {
                namespace: NAMESPACE.into(),
                settings,
            },
            loop_freeze,
            None,
            shutdown,
        )
    });
    world.start_controller_with_extras(machine::Extras {
        freeze: freeze.clone(),
        ..machine::Extras::default()
    });
    world.start_set_controller(machineset::Config {
        concurrency: 2,
        ..support::set_config()
    });
    world.create_boot_secret().await;
    world
        .create_sim_class(
            "small",
            json!({ "vmPool": "p", "size": "small", "tags": { "kubernetes.io/cluster/c": "1" } }),
        )
        .await;
    let set = MachineSetBuilder::new("workers")
        .replicas(2)
        .matching([("pool", "workers")])
        .class("small")
        .build();
    world.sets().create(&PostParams::default(), &set).await.unwrap();
    (world, freeze)
}

/// This file's helpers on the shared harness.
impl Cluster {
    /// Every machine; none while the server is away.
    async fn all_machines(&self) -> Vec<Machine> {
        self.machines()
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    async fn running(&self) -> Vec<String> {
        eventually("two Running machines", || async {
            let machines = self.all_machines().await;
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
        self.stop_server().await;
    }

    async fn restart(&mut self) {
        self.restart_server().await;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_timeout_freezes_and_replaces_no_machine() {
    let settings = ReachabilitySettings {
        period: Duration::from_secs(2),
        timeout: Duration::from_secs(2),
    };
    let (mut world, freeze) = start(settings).await;
    let before = world.running().await;
    world.outage(&before).await;
    eventually("the freeze", || async { freeze.is_frozen().then_some(()) }).await;
    world.restart().await;
    // The kubelets come back well after the health timeout would have run out: only the freeze (which holds for a
    // timeout after the server answers again) keeps their machines from being Failed meanwhile.
    tokio::time::sleep(HEALTH_TIMEOUT * 2).await;
    assert!(freeze.is_frozen(), "still frozen while the kubelets are away");
    for name in &before {
        world.faults.resume_heartbeats(name);
    }
    eventually("the freeze lifted", || async {
        (!freeze.is_frozen()).then_some(())
    })
    .await;
    let after = world.running().await;
    assert_eq!(after, before, "the same machines, none replaced");
    for machine in world.all_machines().await {
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
    let (mut world, freeze) = start(settings).await;
    let before = world.running().await;
    world.outage(&before).await;
    // As long as the outage above took to freeze.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!freeze.is_frozen());
    world.restart().await;
    eventually("a machine Failed or replaced", || async {
        let machines = world.all_machines().await;
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
