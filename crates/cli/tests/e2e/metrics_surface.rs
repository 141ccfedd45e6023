//! End to end: the `/metrics` of `mcm run` against the reference's list of metric families (gardener/machine-
//! controller-manager at 54caf546: pkg/metrics/metrics.go, pkg/util/provider/metrics/metrics.go, the workqueue and
//! REST client adapters it registers, and client_golang's process collector). After one clean lifecycle — a
//! MachineDeployment's machines created and joined, one of them drained and deleted and replaced — every family
//! is there under the reference's name with the reference's label names.

use crate::support;

use std::collections::BTreeSet;

use support::{Background, CONDITION_DEADLINE, Server, address_of, get, mcm_run_command, poll};

/// When a family shows samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shown {
    /// After a clean lifecycle with a deployment alive (its samples are checked).
    Always,
    /// Only once something happened that a clean lifecycle does not have (a failure, a set condition, a rollback,
    /// a hash collision): in the reference too a labelled vector shows nothing before (and neither declares an empty
    /// family). Its labels are checked when it shows; the unit tests of the metrics (crates/controllers
    /// src/metrics/tests) make each of them show.
    OnEvent,
    /// Filled by a provider's own cloud API code (the AWS provider's); the sim has none, as the reference's
    /// providers without such code show none.
    ByProvider,
}

use Shown::{Always, ByProvider, OnEvent};

const OBJECT: &[&str] = &["name", "namespace"];
const CONDITION: &[&str] = &["name", "namespace", "condition"];
const FAILED_MACHINES: &[&str] = &[
    "name",
    "namespace",
    "failed_machine_name",
    "failed_machine_provider_id",
    "failed_machine_owner_ref",
    "failed_machine_last_operation_state",
    "failed_machine_last_operation_machine_operation_type",
];
const STEP: &[&str] = &["namespace", "machine_deployment", "instance_type", "zone"];
const QUEUE: &[&str] = &["name"];

/// The reference's families: name as scraped, label names, when shown.
const REFERENCE: &[(&str, &[&str], Shown)] = &[
    // pkg/metrics/metrics.go, pkg/controller/metrics.go (machine-controller-manager).
    ("mcm_machine_stale_machines_total", &[], Always),
    ("mcm_machine_set_items_total", &[], Always),
    (
        "mcm_machine_set_info",
        &[
            "name",
            "namespace",
            "createdAt",
            "spec_machine_class_api_group",
            "spec_machine_class_kind",
            "spec_machine_class_name",
        ],
        Always,
    ),
    ("mcm_machine_set_info_spec_replicas", OBJECT, Always),
    ("mcm_machine_set_info_spec_min_ready_seconds", OBJECT, Always),
    ("mcm_machine_set_status_condition", CONDITION, OnEvent),
    ("mcm_machine_set_failed_machines", FAILED_MACHINES, OnEvent),
    ("mcm_machine_set_status_available_replicas", OBJECT, Always),
    ("mcm_machine_set_status_fully_labelled_replicas", OBJECT, Always),
    ("mcm_machine_set_status_ready_replicas", OBJECT, Always),
    ("mcm_machine_set_status_replicas", OBJECT, Always),
    ("mcm_machine_deployment_items_total", &[], Always),
    (
        "mcm_machine_deployment_info",
        &["name", "namespace", "createdAt", "spec_strategy_type"],
        Always,
    ),
    ("mcm_machine_deployment_info_spec_paused", OBJECT, Always),
    ("mcm_machine_deployment_info_spec_replicas", OBJECT, Always),
    (
        "mcm_machine_deployment_info_spec_min_ready_seconds",
        OBJECT,
        Always,
    ),
    (
        "mcm_machine_deployment_info_spec_rolling_update_max_surge",
        OBJECT,
        Always,
    ),
    (
        "mcm_machine_deployment_info_spec_rolling_update_max_unavailable",
        OBJECT,
        Always,
    ),
    (
        "mcm_machine_deployment_info_spec_revision_history_limit",
        OBJECT,
        Always,
    ),
    (
        "mcm_machine_deployment_info_spec_progress_deadline_seconds",
        OBJECT,
        Always,
    ),
    (
        "mcm_machine_deployment_info_spec_rollback_to_revision",
        OBJECT,
        OnEvent,
    ),
    ("mcm_machine_deployment_status_condition", CONDITION, Always),
    ("mcm_machine_deployment_status_available_replicas", OBJECT, Always),
    (
        "mcm_machine_deployment_status_unavailable_replicas",
        OBJECT,
        Always,
    ),
    ("mcm_machine_deployment_status_ready_replicas", OBJECT, Always),
    ("mcm_machine_deployment_status_updated_replicas", OBJECT, Always),
    ("mcm_machine_deployment_status_collision_count", OBJECT, OnEvent),
    ("mcm_machine_deployment_status_replicas", OBJECT, Always),
    ("mcm_machine_deployment_failed_machines", FAILED_MACHINES, OnEvent),
    ("mcm_misc_scrape_failure_total", &["binary", "kind"], Always),
    // pkg/util/provider/metrics/metrics.go (the provider's machine-controller).
    ("mcm_machine_controller_frozen", &[], Always),
    ("mcm_machine_items_total", &[], Always),
    ("mcm_machine_current_status_phase", OBJECT, Always),
    (
        "mcm_machine_info",
        &[
            "name",
            "namespace",
            "createdAt",
            "spec_provider_id",
            "spec_class_api_group",
            "spec_class_kind",
            "spec_class_name",
            "node_name",
        ],
        Always,
    ),
    ("mcm_machine_status_condition", CONDITION, Always),
    ("mcm_machine_create_duration_seconds", STEP, Always),
    ("mcm_machine_initialize_duration_seconds", STEP, Always),
    ("mcm_machine_join_duration_seconds", STEP, Always),
    (
        "mcm_machine_drain_duration_seconds",
        &["namespace", "machine_deployment"],
        Always,
    ),
    ("mcm_machine_delete_duration_seconds", STEP, Always),
    ("mcm_machine_num_failed_join", STEP, OnEvent),
    (
        "mcm_cloud_api_requests_total",
        &["provider", "service"],
        ByProvider,
    ),
    (
        "mcm_cloud_api_requests_failed_total",
        &["provider", "service"],
        ByProvider,
    ),
    (
        "mcm_cloud_api_api_request_duration_seconds",
        &["provider", "service"],
        ByProvider,
    ),
    (
        "mcm_cloud_api_driver_request_duration_seconds",
        &["provider", "operation"],
        Always,
    ),
    (
        "mcm_cloud_api_driver_requests_failed_total",
        &["provider", "operation", "error_code"],
        OnEvent,
    ),
    // pkg/util/workqueue/prometheus/prometheus.go: client-go's workqueue metrics, per queue.
    ("mcm_workqueue_depth", QUEUE, Always),
    ("mcm_workqueue_adds_total", QUEUE, Always),
    ("mcm_workqueue_queue_duration_seconds", QUEUE, Always),
    ("mcm_workqueue_work_duration_seconds", QUEUE, Always),
    ("mcm_workqueue_unfinished_work_seconds", QUEUE, Always),
    ("mcm_workqueue_longest_running_processor_seconds", QUEUE, Always),
    ("mcm_workqueue_retries_total", QUEUE, Always),
    // pkg/util/client/metrics/prometheus/prometheus.go: client-go's REST client metrics.
    ("rest_client_requests_total", &["code", "method", "host"], Always),
    ("rest_client_request_latency_seconds", &["verb", "url"], Always),
    // client_golang's process collector (every Prometheus-instrumented process).
    ("process_cpu_seconds_total", &[], Always),
    ("process_open_fds", &[], Always),
    ("process_max_fds", &[], Always),
    ("process_virtual_memory_bytes", &[], Always),
    ("process_virtual_memory_max_bytes", &[], Always),
    ("process_resident_memory_bytes", &[], Always),
    ("process_start_time_seconds", &[], Always),
    ("process_network_receive_bytes_total", &[], Always),
    ("process_network_transmit_bytes_total", &[], Always),
];

/// The reference's queue names that our controllers have (the reference's machine-controller-manager and
/// machine-controller queues of the same work; docs/operations.md maps the others).
const QUEUES: &[&str] = &[
    "machine",
    "machineset",
    "machinedeployment",
    "machineclass",
    "secret",
    "machinesafetyorphanvms",
    "machinesafetyapiserver",
    "machinesafetyovershooting",
];

/// The label names of each sample of `family` (histograms by their `_count`), `le` aside.
fn label_sets(text: &str, family: &str) -> Vec<BTreeSet<String>> {
    text.lines()
        .filter_map(|line| {
            let rest = line
                .strip_prefix(family)
                .map(|rest| rest.strip_prefix("_count").unwrap_or(rest))?;
            let labels = if let Some(rest) = rest.strip_prefix('{') {
                rest.split_once("} ")?.0
            } else {
                rest.strip_prefix(' ')?;
                ""
            };
            Some(
                labels
                    .split("\",")
                    .filter(|pair| !pair.is_empty())
                    .filter_map(|pair| pair.split_once('=').map(|(name, _)| name.to_owned()))
                    .collect(),
            )
        })
        .collect()
}

/// What differs from the reference's list in a scrape: a family without a sample where one is due, or a sample whose
/// label names are not the reference's.
fn differences(text: &str) -> Vec<String> {
    let mut missing = Vec::new();
    for (family, labels, shown) in REFERENCE {
        let wanted: BTreeSet<String> = labels.iter().map(|l| (*l).to_owned()).collect();
        let samples = label_sets(text, family);
        if *shown == Always && samples.is_empty() {
            missing.push(format!("{family}: no sample"));
        }
        for found in samples {
            if found != wanted {
                missing.push(format!("{family}: labels {found:?}, the reference's {wanted:?}"));
            }
        }
    }
    missing
}

#[test]
fn after_a_clean_lifecycle_every_reference_family_is_there_with_its_labels() {
    let server = Server::start("metrics-surface");
    let mut command = mcm_run_command(&server, &["--provider", "sim"]);
    command.args(["--sim-heartbeat-interval", "1s"]);
    let run = Background::spawn(command, "mcm run".into());
    let address = address_of(&run);

    // The deployment's machines are created and join; one is deleted (drained, its VM deleted) and replaced.
    server.apply_examples(&[
        "00-secret.yaml",
        "01-machine-class.yaml",
        "30-machine-deployment.yaml",
    ]);
    // The optional spec fields the reference reports when set.
    server.kubectl_ok(&[
        "patch",
        "machinedeployment",
        "workers",
        "--type=merge",
        "-p",
        r#"{"spec":{"revisionHistoryLimit":5,"progressDeadlineSeconds":600}}"#,
    ]);
    let running = |count: usize| {
        poll(
            &format!("{count} machines Running"),
            CONDITION_DEADLINE * 3,
            || {
                let phases = server.machine_phases(&[]);
                (phases.len() == count && phases.iter().all(|p| p == "Running")).then_some(())
            },
        );
    };
    running(3);
    let victim = server.kubectl_ok(&["get", "machines", "-o", "jsonpath={.items[0].metadata.name}"]);
    server.kubectl_ok(&["delete", "machine", victim.trim(), "--timeout=60s"]);
    running(3);
    let text = poll("the deletion gauges in /metrics", CONDITION_DEADLINE, || {
        let (status, body) = get(address, "/metrics");
        assert_eq!(status, 200, "{body}");
        (body.contains("mcm_machine_delete_duration_seconds{")
            && body.contains("mcm_machine_drain_duration_seconds{"))
        .then_some(body)
    });

    let missing = differences(&text);
    assert!(missing.is_empty(), "{}\n{text}", missing.join("\n"));

    // Each queue shows every workqueue family; the work was seen (added, picked up, done).
    for queue in QUEUES {
        for (family, _, _) in REFERENCE
            .iter()
            .filter(|(f, _, _)| f.starts_with("mcm_workqueue_"))
        {
            let sample = if family.ends_with("_seconds")
                && !family.contains("unfinished")
                && !family.contains("longest")
            {
                format!("{family}_count{{name=\"{queue}\"}} ")
            } else {
                format!("{family}{{name=\"{queue}\"}} ")
            };
            assert!(text.contains(&sample), "{sample}\n{text}");
        }
    }
    for queue in [
        "machine",
        "machineset",
        "machinedeployment",
        "machinesafetyorphanvms",
        "machinesafetyapiserver",
        "machinesafetyovershooting",
    ] {
        let adds = format!("mcm_workqueue_adds_total{{name=\"{queue}\"}} ");
        let value: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&adds))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_default();
        assert!(value >= 1.0, "{adds}\n{text}");
    }
    // The REST client counted our requests to the API server, by code, method and host; URLs are templates.
    assert!(
        text.lines()
            .any(|l| l.starts_with("rest_client_requests_total{code=\"200\",method=\"GET\",host=\"")),
        "{text}"
    );
    assert!(
        text.contains("/namespaces/%7Bnamespace%7D/machines/%7Bname%7D"),
        "{text}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("rest_client_request_latency_seconds") && l.contains(victim.trim())),
        "no object name in a URL label\n{text}"
    );
    // Step gauges in whole seconds, as the reference rounds them.
    for line in text
        .lines()
        .filter(|l| l.starts_with("mcm_machine_join_duration_seconds{"))
    {
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(value >= 0.0 && value.fract() == 0.0, "{line}");
    }
    drop(run);
}
