//! The API server reachability freeze against a real outage: the embedded API server (on disk, so it comes back
//! with everything) is stopped for longer than the status-check timeout while the kubelets cannot heartbeat, then
//! restarted on the same port. With the freeze, the machine controller does nothing while the server is away and
//! holds on until the kubelets are back: no machine is replaced. The same outage with the freeze switched off (a
//! very long timeout) replaces machines, which proves that the freeze is what protects them. Elapsed time is
//! observed, never slept: how long the nodes have been Unknown is read from their Ready condition, and how long an
//! outage takes to freeze is measured by a witness reachability loop.

use crate::support;

use std::time::Duration;

use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
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
/// The status-check timeout of the frozen run: an outage this long freezes, and the freeze holds this long after the
/// server answers again. Four health timeouts, so that the kubelets can stay away for two of them and still come
/// back while the freeze holds.
const STATUS_CHECK_TIMEOUT: Duration = Duration::from_secs(4);

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
    async fn machines_if_reachable(&self) -> Vec<Machine> {
        self.machines()
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    async fn running(&self) -> Vec<String> {
        eventually("two Running machines", || async {
            let machines = self.machines_if_reachable().await;
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

    /// Whether both nodes' Ready condition has been Unknown for at least `at_least`, by its lastTransitionTime.
    async fn nodes_unknown_for(&self, at_least: Duration) -> bool {
        let Ok(nodes) = self.nodes().list(&ListParams::default()).await else {
            return false;
        };
        let now = Timestamp::now();
        nodes.items.len() == 2
            && nodes.items.iter().all(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|c| c.iter().find(|c| c.type_ == "Ready" && c.status == "Unknown"))
                    .and_then(|c| c.last_transition_time.as_ref())
                    .is_some_and(|since| since.0.checked_add(at_least).is_ok_and(|end| end <= now))
            })
    }

    /// Waits until the server has been away as long as it takes a reachability loop with `settings` to freeze: a
    /// witness loop, wired to no controller, probes from now and is stopped once it has frozen (before it could
    /// unfreeze and restart any health clock).
    async fn outage_as_long_as(&self, settings: ReachabilitySettings) {
        let witness = reachability::Freeze::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(reachability::run(
            self.client.clone(),
            Some(self.client.clone()),
            reachability::Config {
                namespace: NAMESPACE.into(),
                settings,
            },
            witness.clone(),
            None,
            async move {
                let _ = stopped.await;
            },
        ));
        eventually("the witness loop frozen by the outage", || async {
            witness.is_frozen().then_some(())
        })
        .await;
        let _ = stop.send(());
        task.await.expect("the witness loop stops");
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
        period: STATUS_CHECK_TIMEOUT,
        timeout: STATUS_CHECK_TIMEOUT,
    };
    let (mut world, freeze) = start(settings).await;
    let before = world.running().await;
    world.outage(&before).await;
    eventually("the freeze", || async { freeze.is_frozen().then_some(()) }).await;
    world.restart().await;
    // The kubelets come back only after their nodes have been Unknown for twice the health timeout, when a
    // controller without the freeze would have Failed their machines: only the freeze (which holds for a timeout
    // after the server answers again) keeps them as they were meanwhile.
    eventually("the nodes Unknown for twice the health timeout", || async {
        world.nodes_unknown_for(HEALTH_TIMEOUT * 2).await.then_some(())
    })
    .await;
    assert!(freeze.is_frozen(), "still frozen while the kubelets are away");
    for machine in world.machines_if_reachable().await {
        assert_eq!(
            machine.phase(),
            Some(MachinePhase::Running),
            "{} is left alone while frozen",
            machine.name_any()
        );
    }
    for name in &before {
        world.faults.resume_heartbeats(name);
    }
    eventually("the freeze lifted", || async {
        (!freeze.is_frozen()).then_some(())
    })
    .await;
    let after = world.running().await;
    assert_eq!(after, before, "the same machines, none replaced");
    for machine in world.machines_if_reachable().await {
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
    world
        .outage_as_long_as(ReachabilitySettings {
            period: STATUS_CHECK_TIMEOUT,
            timeout: STATUS_CHECK_TIMEOUT,
        })
        .await;
    assert!(!freeze.is_frozen());
    world.restart().await;
    eventually("a machine Failed or replaced", || async {
        let machines = world.machines_if_reachable().await;
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
