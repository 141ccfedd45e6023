//! End to end: `mcm run` (the machine controller with the sim provider) against a real `mcm apiserver` process,
//! driven with `kubectl` and the example manifests; `--port` serves `/metrics` and `/healthz`.

use crate::support;

use std::process::Command;

use support::{Background, CONDITION_DEADLINE, Server, address_of, arg, get, mcm_run_command, poll};

fn mcm_run(server: &Server, extra: &[&str]) -> Background {
    let mut command = mcm_run_command(server, &["--provider", "sim"]);
    command.args(["--sim-heartbeat-interval", "1s"]).args(extra);
    Background::spawn(command, "mcm run".into())
}

#[test]
fn the_example_machine_runs_and_shows_in_metrics_and_its_class_and_secret_are_held() {
    let server = Server::start("run-example");
    let run = mcm_run(&server, &[]);
    let address = address_of(&run);
    assert_eq!(get(address, "/healthz"), (200, "OK".to_owned()));

    server.apply_examples(&["00-secret.yaml", "01-machine-class.yaml", "10-machine.yaml"]);
    server.kubectl_ok(&[
        "wait",
        "--for=jsonpath={.status.currentStatus.phase}=Running",
        "machine/single-machine",
        "--timeout=60s",
    ]);
    let metrics = poll("the machine in /metrics", CONDITION_DEADLINE, || {
        let (status, body) = get(address, "/metrics");
        assert_eq!(status, 200, "{body}");
        body.contains(r#"mcm_machine_current_status_phase{name="single-machine",namespace="default"} 1"#)
            .then_some(body)
    });
    assert!(metrics.contains("mcm_machine_items_total 1"), "{metrics}");
    assert!(
        metrics.contains(r#"mcm_cloud_api_driver_request_duration_seconds_count{provider="sim",operation="CreateMachine"} 1"#),
        "{metrics}"
    );

    // Reference §3.7: the class in use and the secret it refers to carry finalizers (names from the examples).
    for (kind, name, finalizer) in [
        (
            "machineclass",
            "local-small",
            "machine.sapcloud.io/machine-controller-manager",
        ),
        ("secret", "local-worker", "machine.sapcloud.io/machine-controller"),
    ] {
        poll(
            &format!("the finalizer of {kind} {name}"),
            CONDITION_DEADLINE,
            || {
                server
                    .kubectl_ok(&["get", kind, name, "-o", "jsonpath={.metadata.finalizers}"])
                    .contains(&format!("\"{finalizer}\""))
                    .then_some(())
            },
        );
    }
    drop(run);
}

#[test]
fn a_bad_flag_value_exits_with_a_message_naming_the_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args([
            "run",
            "--control-kubeconfig",
            "/nonexistent",
            "--provider",
            "sim",
            "--max-unhealthy-share",
            "2",
        ])
        .output()
        .expect("mcm runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--max-unhealthy-share"), "{stderr}");
    assert!(stderr.contains("between 0 and 1"), "{stderr}");
}

/// The reference's two-container layout: `--controllers machine-controller-manager` (sets, deployments) and
/// `--controllers machine-controller` (machines) in two processes together run the MachineSet example; the set
/// role alone creates the machines but never runs them.
#[test]
fn the_two_roles_in_two_processes_run_a_machine_set() {
    let server = Server::start("run-roles");
    server.apply_examples(&["00-secret.yaml", "01-machine-class.yaml", "20-machine-set.yaml"]);
    let sets = mcm_run(&server, &["--controllers", "machine-controller-manager"]);
    address_of(&sets);
    poll("the set's two machines created", CONDITION_DEADLINE, || {
        let names = server.kubectl_ok(&["get", "machines", "-o", "name"]);
        (names.lines().count() == 2).then_some(())
    });
    let phases = server.machine_phases(&[]);
    assert!(
        !phases.iter().any(|p| p == "Running"),
        "without the machine-controller role no machine runs: {phases:?}"
    );
    let machines = mcm_run(&server, &["--controllers", "mc"]);
    address_of(&machines);
    poll("both machines Running", CONDITION_DEADLINE, || {
        let phases = server.machine_phases(&[]);
        (phases.iter().filter(|p| *p == "Running").count() == 2).then_some(())
    });
    drop(machines);
    drop(sets);
}

/// Reference §8.1: `--target-kubeconfig none` disables the target cluster: the machine becomes Available (no node to
/// wait for) and its deletion neither drains nor waits for a node.
#[test]
fn with_target_kubeconfig_none_machines_become_available_and_are_deleted_without_a_drain() {
    let server = Server::start("run-target-none");
    let run = mcm_run(&server, &["--target-kubeconfig", "none"]);
    address_of(&run);
    server.apply_examples(&["00-secret.yaml", "01-machine-class.yaml", "10-machine.yaml"]);
    server.kubectl_ok(&[
        "wait",
        "--for=jsonpath={.status.currentStatus.phase}=Available",
        "machine/single-machine",
        "--timeout=60s",
    ]);
    let nodes = server.kubectl_ok(&["get", "nodes", "-o", "name"]);
    assert_eq!(nodes.trim(), "", "no kubelet joins a target that is not there");
    server.kubectl_ok(&["delete", "machine", "single-machine", "--timeout=60s"]);
    assert!(
        server
            .kubectl_ok(&["get", "machines", "-o", "name"])
            .trim()
            .is_empty()
    );
    drop(run);
}

/// Without a kubeconfig `mcm run` uses the pod's in-cluster configuration; outside a pod it says which flags to give
/// and exits non-zero instead of guessing.
#[test]
fn without_a_kubeconfig_outside_a_pod_the_error_names_the_flags() {
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args([
            "run",
            "--provider",
            "sim",
            "--port",
            "0",
            "--address",
            "127.0.0.1",
        ])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .expect("mcm runs");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--control-kubeconfig"), "{stderr}");
    assert!(stderr.contains("in-cluster"), "{stderr}");

    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(["run", "--provider", "sim", "--control-kubeconfig", "none"])
        .output()
        .expect("mcm runs");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--control-kubeconfig none"), "{stderr}");
}

/// Reference §8.1 and §8.2: every flag of the two reference binaries is accepted by `mcm run` and explained by
/// `--help`, and boolean flags take `--flag=false` as Go's flag package does.
#[test]
fn every_reference_flag_is_explained_by_help_and_booleans_take_false() {
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(["run", "--help"])
        .output()
        .expect("mcm runs");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    let reference = [
        "--port",
        "--address",
        "--control-kubeconfig",
        "--target-kubeconfig",
        "--namespace",
        "--concurrent-syncs",
        "--kube-api-qps",
        "--kube-api-burst",
        "--min-resync-period",
        "--safety-up",
        "--safety-down",
        "--machine-safety-overshooting-period",
        "--autoscaler-scaledown-annotation-during-rollout",
        "--profiling",
        "--contention-profiling",
        "--cloud-provider",
        "--kube-api-content-type",
        "--controller-start-interval",
        "--leader-elect",
        "--leader-elect-lease-duration",
        "--leader-elect-renew-deadline",
        "--leader-elect-retry-period",
        "--leader-elect-resource-lock",
        "--v",
        "--machine-creation-timeout",
        "--machine-health-timeout",
        "--machine-drain-timeout",
        "--machine-inplace-update-timeout",
        "--machine-max-evict-retries",
        "--machine-pv-detach-timeout",
        "--machine-pv-reattach-timeout",
        "--machine-safety-orphan-vms-period",
        "--machine-safety-apiserver-statuscheck-period",
        "--machine-safety-apiserver-statuscheck-timeout",
        "--machine-preserve-timeout",
        "--node-conditions",
        "--bootstrap-token-auth-extra-groups",
        "--resource-exhausted-retry",
    ];
    let lines: Vec<&str> = help.lines().collect();
    for flag in reference {
        let at = lines
            .iter()
            .position(|line| {
                // `-v, --v <LEVEL>`: a short form first.
                let line = line.trim_start();
                let line = match line.as_bytes() {
                    [b'-', short, b',', b' ', ..] if short.is_ascii_alphabetic() => &line[4..],
                    _ => line,
                };
                line.split([' ', '=']).next().is_some_and(|first| first == flag)
            })
            .unwrap_or_else(|| panic!("{flag} missing from `mcm run --help`:\n{help}"));
        let explanation = lines.get(at + 1).map_or("", |line| line.trim());
        assert!(
            !explanation.is_empty() && !explanation.starts_with('-'),
            "{flag} has no explanation in `mcm run --help`: {explanation:?}"
        );
    }

    // Booleans as Go parses them: `--flag`, `--flag=true`, `--flag=false`. Parsing succeeds (the run then fails on
    // the missing kubeconfig, exit 1, not on the flags, exit 2).
    for flags in [
        &["--leader-elect=false"][..],
        &[
            "--leader-elect=true",
            "--profiling=false",
            "--contention-profiling=false",
        ],
        &["--profiling", "--contention-profiling"],
        &["--autoscaler-scaledown-annotation-during-rollout=false"],
        &["--honour-min-ready-seconds"],
        &["--orphan-collection-dry-run=false", "--v=3"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
            .args(["run", "--provider", "sim", "--control-kubeconfig", "/nonexistent"])
            .args(flags)
            .output()
            .expect("mcm runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{flags:?}: {stderr}");
        assert!(stderr.contains("/nonexistent"), "{flags:?}: {stderr}");
    }
}

/// Flags the reference acts on and `mcm run` only accepts warn when set to anything but their default, naming the
/// flag and why (docs/compatibility.md); at their defaults they say nothing.
#[test]
fn flags_without_effect_warn_when_set() {
    let run = |flags: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
            .args(["run", "--provider", "sim", "--control-kubeconfig", "/nonexistent"])
            .args(flags)
            .output()
            .expect("mcm runs");
        assert_eq!(output.status.code(), Some(1), "{flags:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let stderr = run(&[
        "--min-resync-period=1h",
        "--kube-api-content-type=application/json",
        "--vmodule=machine*=4",
        "--log-flush-frequency=5s",
    ]);
    for (flag, why) in [
        ("--min-resync-period", "caches are event driven"),
        ("--kube-api-content-type", "requests are JSON"),
        ("--vmodule", "RUST_LOG"),
        ("--log-flush-frequency", "written at once"),
    ] {
        let line = stderr
            .lines()
            .find(|line| line.contains(flag) && line.contains("it has no effect"))
            .unwrap_or_else(|| panic!("no warning about {flag}:\n{stderr}"));
        assert!(line.contains(why), "{line}");
    }
    let stderr = run(&[
        "--machine-preserve-timeout=1h",
        "--machine-inplace-update-timeout=5m",
        "--min-resync-period=12h",
    ]);
    assert!(!stderr.contains("it has no effect"), "{stderr}");
}

/// The reference's start-up validation (`MCMServer.Validate`, `MCServer.Validate`): every problem at once, in its
/// words and as `utilerrors.NewAggregate` lists them, exit code 1, before any client or controller starts.
#[test]
fn flags_the_reference_refuses_at_start_are_refused_with_its_messages() {
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(["run", "--provider", "sim", "--control-kubeconfig", "/nonexistent"])
        .args(["--concurrent-syncs=0", "--kube-api-qps=0", "--safety-up=-1"])
        .output()
        .expect("mcm runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "[concurrent syncs should be greater than zero: got: 0, kube api qps should be greater than zero: got: \
             0.000000, safety up should be a non negative value: got: -1]"
        ),
        "{stderr}"
    );
    assert!(
        !stderr.contains("/nonexistent"),
        "refused before the kubeconfig is read: {stderr}"
    );
}

/// A drain refused by a PodDisruptionBudget (429) is retried by the controller on `--machine-evict-retry-interval`,
/// not inside the client: a `force-deletion=true` label put on the machine meanwhile is seen and the machine goes
/// (kube's built-in client retry, on by default, would block the eviction for minutes; docs/pitfalls.md).
#[test]
fn a_pdb_blocked_drain_gives_way_to_the_force_deletion_label() {
    let server = Server::start("run-pdb-force");
    let run = mcm_run(&server, &["--machine-evict-retry-interval", "1s"]);
    address_of(&run);
    server.apply_examples(&["00-secret.yaml", "01-machine-class.yaml", "10-machine.yaml"]);
    server.kubectl_ok(&[
        "wait",
        "--for=jsonpath={.status.currentStatus.phase}=Running",
        "machine/single-machine",
        "--timeout=60s",
    ]);
    let guarded = server.write(
        "guarded.yaml",
        r"apiVersion: v1
kind: Pod
metadata:
  name: guarded
  namespace: default
  labels:
    app: guarded
spec:
  nodeName: single-machine
  containers:
  - name: c
    image: busybox
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: guarded
  namespace: default
spec:
  minAvailable: 1
  selector:
    matchLabels:
      app: guarded
",
    );
    server.kubectl_ok(&["apply", "-f", arg(&guarded)]);
    server.kubectl_ok(&["delete", "machine", "single-machine", "--wait=false"]);
    poll("the drain to be refused by the PDB", CONDITION_DEADLINE, || {
        let description = server.kubectl_ok(&[
            "get",
            "machine",
            "single-machine",
            "-o",
            "jsonpath={.status.lastOperation.description}",
        ]);
        description.to_lowercase().contains("evict").then_some(())
    });
    assert!(
        !server
            .kubectl_ok(&["get", "pods", "-o", "name"])
            .trim()
            .is_empty(),
        "the PDB holds the pod"
    );
    server.kubectl_ok(&["label", "machine", "single-machine", "force-deletion=true"]);
    poll("the force-deleted machine gone", CONDITION_DEADLINE, || {
        server
            .kubectl_ok(&["get", "machines", "-o", "name"])
            .trim()
            .is_empty()
            .then_some(())
    });
    drop(run);
}
