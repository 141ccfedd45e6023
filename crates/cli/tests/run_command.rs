//! End to end: `mcm run` (the machine controller with the sim provider) against a real `mcm apiserver` process,
//! driven with `kubectl` and the example manifests; `--port` serves `/metrics` and `/healthz`.

mod support;

use std::{path::PathBuf, process::Command};

use support::{Background, CONDITION_DEADLINE, Server, address_of, arg, get, poll};

fn example(file: &str) -> PathBuf {
    let path = mcm_testkit::shared_dir().join("examples/local").join(file);
    assert!(path.is_file(), "no example {}", path.display());
    path
}

fn mcm_run(server: &Server, extra: &[&str]) -> Background {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
    command
        .args(["run", "--control-kubeconfig"])
        .arg(server.kubeconfig())
        .args(["--provider", "sim", "--port", "0", "--address", "127.0.0.1"])
        .args(["--sim-heartbeat-interval", "1s"])
        .args(extra);
    Background::spawn(command, "mcm run".into())
}

#[test]
fn the_example_machine_runs_and_shows_in_metrics_and_its_class_and_secret_are_held() {
    let server = Server::start("run-example");
    let run = mcm_run(&server, &[]);
    let address = address_of(&run);
    assert_eq!(get(address, "/healthz"), (200, "OK".to_owned()));

    for file in ["00-secret.yaml", "01-machine-class.yaml", "10-machine.yaml"] {
        server.kubectl_ok(&["apply", "-f", arg(&example(file))]);
    }
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
    for file in ["00-secret.yaml", "01-machine-class.yaml", "20-machine-set.yaml"] {
        server.kubectl_ok(&["apply", "-f", arg(&example(file))]);
    }
    let sets = mcm_run(&server, &["--controllers", "machine-controller-manager"]);
    address_of(&sets);
    poll("the set's two machines created", CONDITION_DEADLINE, || {
        let names = server.kubectl_ok(&["get", "machines", "-o", "name"]);
        (names.lines().count() == 2).then_some(())
    });
    let phases = server.kubectl_ok(&[
        "get",
        "machines",
        "-o",
        "jsonpath={range .items[*]}{.status.currentStatus.phase}{\"\\n\"}{end}",
    ]);
    assert!(
        !phases.contains("Running"),
        "without the machine-controller role no machine runs: {phases}"
    );
    let machines = mcm_run(&server, &["--controllers", "mc"]);
    address_of(&machines);
    poll("both machines Running", CONDITION_DEADLINE, || {
        let phases = server.kubectl_ok(&[
            "get",
            "machines",
            "-o",
            "jsonpath={range .items[*]}{.status.currentStatus.phase}{\"\\n\"}{end}",
        ]);
        (phases.lines().filter(|p| *p == "Running").count() == 2).then_some(())
    });
    drop(machines);
    drop(sets);
}
