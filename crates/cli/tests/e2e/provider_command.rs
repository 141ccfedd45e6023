//! End to end: the sim provider out of process (`mcm provider sim serve` on a unix socket) driven by
//! `mcm run --provider-endpoint`, against a real `mcm apiserver`, with kubectl and the example manifests; and a
//! misconfigured provider failing fast with a message naming the variable (spec 000 "Configuration and Operation").

use crate::support;

use std::process::Command;

use support::{
    Background, COMMAND_DEADLINE, CONDITION_DEADLINE, Server, address_of, example, get, mcm_run_command,
    poll, start_sim_provider,
};

#[test]
fn the_example_machine_runs_through_a_provider_out_of_process() {
    let server = Server::start("provider-grpc");
    let (provider, endpoint) = start_sim_provider(&server, |command| {
        command.args(["--sim-heartbeat-interval", "1s"]);
    });

    let run = mcm_run_command(&server, &["--provider-endpoint", &endpoint]);
    let run = Background::spawn(run, "mcm run".into());
    let address = address_of(&run);
    let stdout = run.stdout();
    assert!(
        stdout.contains("provider sim at unix://"),
        "the controller found the provider by name: {stdout}"
    );

    server.apply_examples(&["00-secret.yaml", "01-machine-class.yaml", "10-machine.yaml"]);
    server.kubectl_ok(&[
        "wait",
        "--for=jsonpath={.status.currentStatus.phase}=Running",
        "machine/single-machine",
        "--timeout=60s",
    ]);
    let provider_id = server.kubectl_ok(&[
        "get",
        "machine",
        "single-machine",
        "-o",
        "jsonpath={.spec.providerID}",
    ]);
    assert!(provider_id.starts_with("sim://"), "{provider_id}");
    poll("the gRPC calls in /metrics", CONDITION_DEADLINE, || {
        get(address, "/metrics")
            .1
            .contains(r#"mcm_cloud_api_driver_request_duration_seconds_count{provider="sim",operation="CreateMachine"} 1"#)
            .then_some(())
    });

    // Deleting goes through the provider too: the VM is gone and the machine with it.
    server.kubectl_ok(&[
        "delete",
        "machine",
        "single-machine",
        "--wait=true",
        "--timeout=60s",
    ]);
    drop(run);
    drop(provider);
}

#[test]
fn a_provider_without_its_endpoint_exits_2_naming_the_variable() {
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(["provider", "sim", "serve"])
        .env_remove("MC_ENDPOINT")
        .output()
        .expect("mcm runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("MC_ENDPOINT") && stderr.contains("required"),
        "{stderr}"
    );
}

#[test]
fn a_tcp_provider_without_tls_files_exits_2_naming_the_variable() {
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(["provider", "sim", "serve"])
        .env("MC_ENDPOINT", "tcp://127.0.0.1:0")
        .env_remove("MC_TLS_CERT_FILE")
        .output()
        .expect("mcm runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("MC_TLS_CERT_FILE"), "{stderr}");
}

#[test]
fn run_refuses_both_a_built_in_provider_and_an_endpoint() {
    let started = std::time::Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(["run", "--control-kubeconfig", "/nonexistent", "--provider", "sim"])
        .args(["--provider-endpoint", "unix:///tmp/x.sock"])
        .output()
        .expect("mcm runs");
    assert!(started.elapsed() < COMMAND_DEADLINE);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--provider-endpoint"), "{stderr}");
}

#[test]
fn the_sim_provider_passes_the_conformance_suite() {
    let dir = std::env::temp_dir().join(format!("mcm-e2e-conformance-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a test directory");
    let endpoint = format!("unix://{}", dir.join("provider.sock").display());
    let mut provider = Command::new(env!("CARGO_BIN_EXE_mcm"));
    provider.args(["provider", "sim", "serve", "--endpoint", &endpoint]);
    let provider = Background::spawn(provider, "mcm provider sim serve".into());
    provider.wait_for_stdout("the provider to serve", |out| out.contains("serving on"));

    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(["provider", "test", "--endpoint", &endpoint, "--class"])
        .arg(example("01-machine-class.yaml"))
        .arg("--secret")
        .arg(example("00-secret.yaml"))
        .output()
        .expect("mcm provider test runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("PASS") && !stdout.contains("FAIL"), "{stdout}");
    assert!(
        !stdout.contains("userData"),
        "the secret is never printed: {stdout}"
    );
    drop(provider);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_conformance_suite_fails_with_exit_1_when_the_provider_is_not_there() {
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args([
            "provider",
            "test",
            "--endpoint",
            "unix:///nonexistent/provider.sock",
            "--class",
        ])
        .arg(example("01-machine-class.yaml"))
        .arg("--secret")
        .arg(example("00-secret.yaml"))
        .args(["--call-timeout", "5s"])
        .output()
        .expect("mcm provider test runs");
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("FAIL"));
}

/// The conformance checks, in the order the report lists them.
const CHECKS: [&str; 14] = [
    "identity",
    "create-machine",
    "create-machine-idempotent",
    "get-machine-status",
    "list-machines",
    "initialize-machine",
    "uninitialized-until-initialized",
    "invalid-provider-spec",
    "error-messages",
    "delete-machine-idempotent",
    "deleted-machine-not-found",
    "get-volume-ids",
    "generate-machine-class-for-migration",
    "cleanup",
];

/// Runs `mcm provider test --output json` against `endpoint` with `extra` flags; its exit code and its whole
/// standard output parsed as one JSON value (so nothing else may be printed there).
fn conformance_json(endpoint: &str, extra: &[&str]) -> (Option<i32>, serde_json::Value) {
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(["provider", "test", "--endpoint", endpoint, "--output", "json"])
        .args(extra)
        .output()
        .expect("mcm provider test runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = serde_json::from_str(&stdout).unwrap_or_else(|err| {
        panic!(
            "stdout is one JSON value ({err}):\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code(), report)
}

/// The check of `report` with `id`.
fn check<'a>(report: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|check| check["id"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {report:#}"))
}

/// Without --class and --secret the suite uses the built-in local examples, so it runs from any directory; the
/// JSON report lists every check with its spec sentence and result, and the exit code is 0 since none failed.
#[test]
fn the_json_report_of_the_sim_provider_lists_every_check_and_exits_0() {
    let dir = tempfile::tempdir().expect("a test directory");
    let endpoint = format!("unix://{}", dir.path().join("provider.sock").display());
    let mut provider = Command::new(env!("CARGO_BIN_EXE_mcm"));
    provider.args(["provider", "sim", "serve", "--endpoint", &endpoint]);
    let provider = Background::spawn(provider, "mcm provider sim serve".into());
    provider.wait_for_stdout("the provider to serve", |out| out.contains("serving on"));

    let (code, report) = conformance_json(&endpoint, &[]);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["conforms"], true, "{report:#}");
    assert_eq!(report["endpoint"], endpoint.as_str());
    assert_eq!(report["class"], "local-small", "the built-in example class");
    let ids: Vec<&str> = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|check| check["id"].as_str().expect("an id"))
        .collect();
    assert_eq!(ids, CHECKS);
    for id in CHECKS {
        let check = check(&report, id);
        assert!(
            check["requirement"]
                .as_str()
                .is_some_and(|r| r.starts_with("spec 00")),
            "{id} quotes its spec sentence: {check}"
        );
        assert!(check["message"].is_string(), "{check}");
    }
    for id in [
        "identity",
        "create-machine",
        "create-machine-idempotent",
        "invalid-provider-spec",
        "cleanup",
    ] {
        assert_eq!(check(&report, id)["result"], "pass", "{report:#}");
    }
    // The sim provider declares GenerateMachineClassForMigration, which the suite cannot convert: a skip, with why.
    let skipped = check(&report, "generate-machine-class-for-migration");
    assert_eq!(skipped["result"], "skip");
    assert!(!skipped["message"].as_str().unwrap().is_empty());
    let summary = &report["summary"];
    assert_eq!(summary["failed"], 0);
    assert_eq!(
        summary["passed"].as_u64().unwrap() + summary["skipped"].as_u64().unwrap(),
        14
    );
    assert!(
        !report.to_string().contains("node-agent"),
        "the secret's userData is never printed"
    );
    drop(provider);
}

/// A provider that is not there fails the checks that need it: the JSON says which and why, and the exit code is 1.
#[test]
fn the_json_report_names_the_failed_checks_and_exits_1() {
    let (code, report) = conformance_json("unix:///nonexistent/provider.sock", &["--call-timeout", "5s"]);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(report["conforms"], false);
    let identity = check(&report, "identity");
    assert_eq!(identity["result"], "fail", "{identity}");
    assert!(!identity["message"].as_str().unwrap().is_empty(), "{identity}");
    assert!(report["summary"]["failed"].as_u64().unwrap() >= 1, "{report:#}");
}

#[test]
fn only_one_of_class_and_secret_is_a_usage_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args([
            "provider",
            "test",
            "--endpoint",
            "unix:///nonexistent.sock",
            "--class",
        ])
        .arg(example("01-machine-class.yaml"))
        .output()
        .expect("mcm runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--secret"));
}

/// `/readyz` answers 503 naming the provider while it is unreachable, and 200 once it serves; `/healthz` is 200 all
/// along (the process is alive).
#[test]
fn readyz_is_503_while_the_provider_is_unreachable() {
    let server = Server::start("provider-readyz");
    let socket = server.dir.join("provider.sock");
    let endpoint = format!("unix://{}", socket.display());
    let mut run = Command::new(env!("CARGO_BIN_EXE_mcm"));
    run.args(["run", "--control-kubeconfig"])
        .arg(server.kubeconfig())
        .args([
            "--provider-endpoint",
            &endpoint,
            "--port",
            "0",
            "--address",
            "127.0.0.1",
        ]);
    let run = Background::spawn(run, "mcm run".into());
    let address = address_of(&run);
    let not_ready = poll("a 503 naming the provider", CONDITION_DEADLINE, || {
        let (status, body) = get(address, "/readyz");
        (status == 503 && body.contains("[-]provider failed")).then_some(body)
    });
    assert!(not_ready.contains("unreachable"), "{not_ready}");
    assert_eq!(get(address, "/healthz").0, 200, "alive all the same");

    let mut provider = Command::new(env!("CARGO_BIN_EXE_mcm"));
    provider.args(["provider", "sim", "serve", "--endpoint", &endpoint]);
    let provider = Background::spawn(provider, "mcm provider sim serve".into());
    provider.wait_for_stdout("the provider to serve", |out| out.contains("serving on"));
    let ready = poll("a 200 once the provider serves", CONDITION_DEADLINE, || {
        let (status, body) = get(address, "/readyz");
        (status == 200).then_some(body)
    });
    assert!(ready.contains("[+]provider ok"), "{ready}");
    drop(run);
    drop(provider);
}
