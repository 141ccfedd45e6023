//! `/metrics` over real HTTP while a MachineDeployment of two machines goes through the machine, set and deployment
//! controllers against the embedded API server with the sim provider: the figures are there and move — machine,
//! set and deployment counts and status from the caches, the step duration gauges of the deployment as machines
//! are created, join, are drained and deleted, and the reconcile counters and work queue gauges per controller.

use crate::support;

use std::{net::SocketAddr, sync::Arc};

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use mcm_api::{MachineDeployment, builders::MachineDeploymentBuilder};
use mcm_controllers::{machinedeployment, metrics::Metrics};
use support::{CLASS, Cluster, NAMESPACE, http_get, settings};
use tokio::sync::oneshot;

const DEPLOYMENT: &str = "metered";

/// The values of the samples of `name` whose labels include every pair of `labels`.
fn samples(text: &str, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (label_text, value) = match rest.strip_prefix('{') {
                Some(rest) => rest.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            labels
                .iter()
                .all(|(key, value)| label_text.contains(&format!("{key}=\"{value}\"")))
                .then(|| value.trim().parse().ok())
                .flatten()
        })
        .collect()
}

/// The one value of `name` with `labels`, if exactly one sample matches.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    match samples(text, name, labels).as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

async fn scrape(address: SocketAddr) -> String {
    let (status, body) = http_get(address, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Scrapes until `check` gives a value; panics naming `what` (and showing the last scrape) after the deadline.
async fn wait_scrape<T>(address: SocketAddr, what: &str, check: impl Fn(&str) -> Option<T>) -> T {
    let last = std::sync::Mutex::new(String::new());
    let found = tokio::time::timeout(support::DEADLINE, async {
        loop {
            let text = scrape(address).await;
            if let Some(found) = check(&text) {
                return found;
            }
            *last.lock().unwrap() = text;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "timed out waiting for {what}; last scrape:\n{}",
            last.lock().unwrap()
        )
    })
}

fn reconciles(text: &str, controller: &str) -> f64 {
    samples(
        text,
        "mcm_controller_reconcile_total",
        &[("controller", controller)],
    )
    .iter()
    .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one story: creation, the steady state, deletion
async fn metrics_follow_a_deployment_from_creation_to_deletion() {
    let metrics = Arc::new(Metrics::new());
    let mut cluster = Cluster::start_without_controller(settings()).await;
    cluster.create_class().await;
    cluster.start_controller_with_metrics(metrics.clone());
    cluster.start_set_controllers_with_metrics(
        machinedeployment::Config {
            concurrency: 4,
            ..machinedeployment::Config::new(NAMESPACE)
        },
        metrics.clone(),
    );
    let (stop_server, server_stopped) = oneshot::channel::<()>();
    let (address, server) =
        mcm_controllers::metrics::serve("127.0.0.1:0".parse().unwrap(), metrics.clone(), async move {
            let _ = server_stopped.await;
        })
        .await
        .expect("the metrics server starts");

    let empty = scrape(address).await;
    assert_eq!(
        value(&empty, "mcm_machine_deployment_items_total", &[]),
        Some(0.0),
        "{empty}"
    );

    let deployment = MachineDeploymentBuilder::new(DEPLOYMENT)
        .replicas(2)
        .matching([("name", DEPLOYMENT)])
        .strategy("RollingUpdate")
        .max_surge(IntOrString::Int(1))
        .max_unavailable(IntOrString::String("50%".into()))
        .class(CLASS)
        .build();
    let deployments: Api<MachineDeployment> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();

    // Machines: two, both Running, their info and node conditions; the deployment's create and join gauges.
    let of_deployment = [("namespace", NAMESPACE), ("machine_deployment", DEPLOYMENT)];
    let steady = wait_scrape(address, "two Running machines and the creation gauges", |text| {
        (value(text, "mcm_machine_items_total", &[]) == Some(2.0)
            && samples(
                text,
                "mcm_machine_current_status_phase",
                &[("namespace", NAMESPACE)],
            ) == [1.0, 1.0]
            && samples(text, "mcm_machine_status_condition", &[("condition", "Ready")]) == [1.0, 1.0]
            && !samples(text, "mcm_machine_create_duration_seconds", &of_deployment).is_empty()
            && !samples(text, "mcm_machine_join_duration_seconds", &of_deployment).is_empty()
            && value(text, "mcm_machine_set_items_total", &[]) == Some(1.0)
            && samples(
                text,
                "mcm_machine_set_status_replicas",
                &[("namespace", NAMESPACE)],
            ) == [2.0]
            && samples(
                text,
                "mcm_machine_set_status_ready_replicas",
                &[("namespace", NAMESPACE)],
            ) == [2.0]
            && value(
                text,
                "mcm_machine_deployment_status_replicas",
                &[("name", DEPLOYMENT), ("namespace", NAMESPACE)],
            ) == Some(2.0)
            && value(
                text,
                "mcm_machine_deployment_status_available_replicas",
                &[("name", DEPLOYMENT)],
            ) == Some(2.0))
        .then(|| text.to_owned())
    })
    .await;
    // The join gauge knows the node: its instance type is the sim node's label.
    let join = samples(
        &steady,
        "mcm_machine_join_duration_seconds",
        &[("machine_deployment", DEPLOYMENT), ("instance_type", "small")],
    );
    assert_eq!(join.len(), 1, "{steady}");
    // In whole seconds, as the reference rounds it.
    assert!(join[0] >= 0.0 && join[0].fract() == 0.0, "{steady}");
    // The info gauges carry the reference's labels.
    let machines = cluster
        .machines()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for machine in &machines {
        let name = machine.metadata.name.as_deref().unwrap();
        let node = support::node_label(machine).unwrap();
        let info = [
            ("name", name),
            ("spec_provider_id", machine.spec.provider_id.as_str()),
            ("spec_class_kind", "MachineClass"),
            ("spec_class_name", CLASS),
            ("node_name", node),
        ];
        assert_eq!(value(&steady, "mcm_machine_info", &info), Some(1.0), "{steady}");
    }
    let deployment_labels = [("name", DEPLOYMENT), ("namespace", NAMESPACE)];
    for (metric, expected) in [
        ("mcm_machine_deployment_items_total", 1.0),
        ("mcm_machine_deployment_info_spec_replicas", 2.0),
        ("mcm_machine_deployment_info_spec_paused", 0.0),
        ("mcm_machine_deployment_info_spec_rolling_update_max_surge", 1.0),
        (
            "mcm_machine_deployment_info_spec_rolling_update_max_unavailable",
            1.0,
        ),
        ("mcm_machine_deployment_status_updated_replicas", 2.0),
        ("mcm_machine_deployment_status_ready_replicas", 2.0),
    ] {
        let labels: &[(&str, &str)] = if metric.ends_with("items_total") {
            &[]
        } else {
            &deployment_labels
        };
        assert_eq!(
            value(&steady, metric, labels),
            Some(expected),
            "{metric}\n{steady}"
        );
    }
    assert_eq!(
        value(
            &steady,
            "mcm_machine_deployment_info",
            &[("name", DEPLOYMENT), ("spec_strategy_type", "RollingUpdate")],
        ),
        Some(1.0),
        "{steady}"
    );
    assert_eq!(
        value(
            &steady,
            "mcm_machine_deployment_status_condition",
            &[("name", DEPLOYMENT), ("condition", "Available")],
        ),
        Some(1.0),
        "{steady}"
    );
    assert_eq!(
        samples(
            &steady,
            "mcm_machine_set_info",
            &[("spec_machine_class_name", CLASS)]
        ),
        [1.0],
        "{steady}"
    );
    // Every controller was metered, and its work queue gauges are there.
    for controller in ["machine", "machineset", "machinedeployment"] {
        assert!(reconciles(&steady, controller) > 0.0, "{controller}\n{steady}");
        assert_eq!(
            samples(
                &steady,
                "mcm_controller_reconcile_duration_seconds_count",
                &[("controller", controller)],
            )
            .len(),
            1,
            "{controller}\n{steady}"
        );
        for family in [
            "mcm_workqueue_depth",
            "mcm_workqueue_adds_total",
            "mcm_workqueue_queue_duration_seconds_count",
            "mcm_workqueue_work_duration_seconds_count",
            "mcm_workqueue_unfinished_work_seconds",
            "mcm_workqueue_longest_running_processor_seconds",
            "mcm_workqueue_retries_total",
        ] {
            assert_eq!(
                samples(&steady, family, &[("name", controller)]).len(),
                1,
                "{family} {controller}\n{steady}"
            );
        }
        // The reconciles went through the queue: added, waited and worked (the exact counts are the unit tests').
        let of = [("name", controller)];
        for family in [
            "mcm_workqueue_adds_total",
            "mcm_workqueue_queue_duration_seconds_count",
            "mcm_workqueue_work_duration_seconds_count",
        ] {
            assert!(
                value(&steady, family, &of).unwrap() >= 1.0,
                "{family} {controller}\n{steady}"
            );
        }
    }

    // Deleting a machine: it is drained and its VM deleted (the delete and drain gauges appear), the set replaces
    // it, and every controller reconciles more.
    let before = [
        reconciles(&steady, "machine"),
        reconciles(&steady, "machineset"),
        reconciles(&steady, "machinedeployment"),
    ];
    assert!(
        samples(&steady, "mcm_machine_delete_duration_seconds", &of_deployment).is_empty(),
        "{steady}"
    );
    let victim = machines[0].metadata.name.clone().unwrap();
    cluster
        .machines()
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    cluster.wait_gone(&victim).await;
    let after = wait_scrape(address, "the deletion gauges and more reconciles", |text| {
        (!samples(text, "mcm_machine_delete_duration_seconds", &of_deployment).is_empty()
            && !samples(text, "mcm_machine_drain_duration_seconds", &of_deployment).is_empty()
            && reconciles(text, "machine") > before[0]
            && reconciles(text, "machineset") > before[1]
            && reconciles(text, "machinedeployment") > before[2])
            .then(|| text.to_owned())
    })
    .await;
    // The drain gauge has no placement labels (as the reference's).
    assert!(
        after
            .lines()
            .filter(|l| l.starts_with("mcm_machine_drain_duration_seconds{"))
            .all(|l| !l.contains("instance_type")),
        "{after}"
    );
    // The set replaces the machine: two Running machines again.
    wait_scrape(address, "two Running machines again", |text| {
        (samples(
            text,
            "mcm_machine_current_status_phase",
            &[("namespace", NAMESPACE)],
        ) == [1.0, 1.0]
            && value(
                text,
                "mcm_machine_deployment_status_available_replicas",
                &[("name", DEPLOYMENT)],
            ) == Some(2.0))
        .then_some(())
    })
    .await;
    // Nothing failed to join.
    assert!(
        samples(&after, "mcm_machine_num_failed_join", &of_deployment).is_empty(),
        "{after}"
    );

    let _ = stop_server.send(());
    let _ = tokio::time::timeout(support::DEADLINE, server).await;
    cluster.stop().await;
}

/// Reference pkg/controller/machineset.go: a machine its set deletes while Failed after a health check (unhealthy
/// for longer than the health timeout) counts in `mcm_machine_stale_machines_total`; a scale-down would not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_replaced_after_its_health_timeout_counts_as_stale() {
    let metrics = Arc::new(Metrics::new());
    let mut settings = settings();
    settings.machine_health_timeout = std::time::Duration::from_secs(3);
    let mut cluster = Cluster::start_without_controller(settings).await;
    cluster.create_class().await;
    cluster.start_controller_with_metrics(metrics.clone());
    cluster.start_set_controllers_with_metrics(machinedeployment::Config::new(NAMESPACE), metrics.clone());
    let (stop_server, server_stopped) = oneshot::channel::<()>();
    let (address, server) =
        mcm_controllers::metrics::serve("127.0.0.1:0".parse().unwrap(), metrics.clone(), async move {
            let _ = server_stopped.await;
        })
        .await
        .expect("the metrics server starts");
    assert_eq!(
        value(&scrape(address).await, "mcm_machine_stale_machines_total", &[]),
        Some(0.0)
    );

    let deployment = MachineDeploymentBuilder::new("stale")
        .replicas(1)
        .matching([("name", "stale")])
        .strategy("RollingUpdate")
        .class(CLASS)
        .build();
    Api::<MachineDeployment>::namespaced(cluster.client.clone(), NAMESPACE)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    wait_scrape(address, "one Running machine", |text| {
        (samples(
            text,
            "mcm_machine_current_status_phase",
            &[("namespace", NAMESPACE)],
        ) == [1.0])
        .then_some(())
    })
    .await;
    let sick = cluster
        .machines()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    cluster.faults.set_node_not_ready(&sick);
    cluster.wait_gone(&sick).await;
    wait_scrape(address, "the stale machine counted", |text| {
        (value(text, "mcm_machine_stale_machines_total", &[]) == Some(1.0)).then_some(())
    })
    .await;

    let _ = stop_server.send(());
    let _ = tokio::time::timeout(support::DEADLINE, server).await;
    cluster.stop().await;
}
