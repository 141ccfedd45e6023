//! End to end: `mcm provider call` against the sim provider out of process (`mcm provider sim serve` on a unix
//! socket in the test's own directory), as an operator uses it: create two machines, list them, ask one's status,
//! delete one, list again; a provider error (status of an unknown machine) prints its code and exits 1; bad usage
//! exits 2 naming the flag; JSON output parses.

use crate::support;

use std::{path::PathBuf, process::Command};

use support::{Background, example};

/// A sim provider serving on a socket in a fresh directory of its own; stopped and removed on drop.
struct Provider {
    process: Background,
    endpoint: String,
    dir: tempfile::TempDir,
}

impl Provider {
    fn start(test: &str) -> Self {
        Self::start_with(test, &[])
    }

    fn start_with(test: &str, flags: &[&str]) -> Self {
        Self::start_configured(test, |command| {
            command.args(flags);
        })
    }

    /// A provider whose command (flags, environment) `configure` completes.
    fn start_configured(test: &str, configure: impl FnOnce(&mut Command)) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("mcm-e2e-call-{test}-"))
            .tempdir()
            .expect("a test directory");
        let endpoint = format!("unix://{}", dir.path().join("p.sock").display());
        let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
        command.args(["provider", "sim", "serve", "--endpoint", &endpoint]);
        configure(&mut command);
        let process = Background::spawn(command, "mcm provider sim serve".into());
        process.wait_for_stdout("the provider to serve", |out| out.contains("serving on"));
        Self {
            process,
            endpoint,
            dir,
        }
    }

    /// `mcm provider call <args> --endpoint <ours>`: (exit code, stdout, stderr).
    fn call(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
            .args(["provider", "call"])
            .args(args)
            .args(["--endpoint", &self.endpoint])
            .output()
            .expect("mcm provider call runs");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    fn call_ok(&self, args: &[&str]) -> String {
        let (code, stdout, stderr) = self.call(args);
        assert_eq!(code, Some(0), "mcm provider call {args:?}: {stdout}\n{stderr}");
        stdout
    }
}

/// The value of `key: value` in a text answer.
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{key}: ")))
        .unwrap_or_else(|| panic!("no {key} in {text}"))
}

#[test]
fn an_operator_creates_lists_inspects_and_deletes_vms() {
    let provider = Provider::start("lifecycle");
    let class = example("01-machine-class.yaml");
    let secret = example("00-secret.yaml");
    let files = ["--class", support::arg(&class), "--secret", support::arg(&secret)];

    let first = provider.call_ok(&[&["create", "--machine", "vm-one"][..], &files[..]].concat());
    let first_id = field(&first, "providerID").to_owned();
    assert!(first_id.starts_with("sim://"), "{first}");
    assert!(!field(&first, "nodeName").is_empty(), "{first}");
    // Without --class/--secret the built-in local example is used, the same class as the files above.
    let second = provider.call_ok(&["create", "--machine", "vm-two"]);
    let second_id = field(&second, "providerID").to_owned();
    assert_ne!(first_id, second_id);

    let list = provider.call_ok(&["list"]);
    assert_eq!(list.lines().count(), 2, "one line per VM: {list}");
    assert!(
        list.lines().any(|line| line == format!("{first_id}\tvm-one")),
        "{list}"
    );
    assert!(
        list.lines().any(|line| line == format!("{second_id}\tvm-two")),
        "{list}"
    );

    // The sim has something to initialise: status says so (exit 1, code 17) until `init` succeeded.
    let (code, _, stderr) = provider.call(&["status", "--machine", "vm-one"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("Uninitialized (17)"), "{stderr}");
    for machine in ["vm-one", "vm-two"] {
        let initialized = provider.call_ok(&["init", "--machine", machine]);
        assert!(!field(&initialized, "providerID").is_empty(), "{initialized}");
    }
    let status = provider.call_ok(&["status", "--machine", "vm-one"]);
    assert_eq!(field(&status, "providerID"), first_id);
    assert_eq!(field(&status, "nodeName"), field(&first, "nodeName"));

    let deleted = provider.call_ok(&["delete", "--machine", "vm-one", "--provider-id", &first_id]);
    assert!(
        deleted.contains("vm-one") && deleted.contains("deleted"),
        "{deleted}"
    );

    let list = provider.call_ok(&["list", "--output", "json"]);
    let list: serde_json::Value = serde_json::from_str(&list).expect("list --output json is JSON");
    assert_eq!(
        list["machines"],
        serde_json::json!([{ "providerID": second_id, "machine": "vm-two" }]),
        "only vm-two is left"
    );

    let status = provider.call_ok(&["status", "--machine", "vm-two", "--output", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status --output json is JSON");
    assert_eq!(status["providerID"], second_id.as_str());

    let volumes = provider.call_ok(&[
        "volumes",
        "--pv-file",
        support::arg(&write_pvs(provider.dir.path())),
    ]);
    assert_eq!(volumes, "vol-1\n", "only the sim's own CSI volume is its");

    for text in [&first, &second] {
        assert!(!text.contains("userData"), "the secret is never printed: {text}");
    }
}

fn write_pvs(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("pvs.yaml");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: a\nspec:\n  csi:\n    driver: \
         sim.csi.machine.sapcloud.io\n    volumeHandle: vol-1\n---\napiVersion: v1\nkind: PersistentVolume\n\
         metadata:\n  name: b\nspec:\n  csi:\n    driver: other.example.com\n    volumeHandle: vol-2\n",
    )
    .expect("the PV file");
    path
}

#[test]
fn a_provider_error_prints_its_code_and_exits_1() {
    let provider = Provider::start("error");
    let (code, stdout, stderr) = provider.call(&["status", "--machine", "never-created"]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("NotFound"), "the machine code is named: {stderr}");
    assert!(stdout.is_empty(), "no answer on stdout: {stdout}");
}

/// `--v` is klog's verbosity, as in the reference's providers: 4 and above log every call (debug), and the flag wins
/// over MC_LOG_LEVEL either way.
#[test]
fn the_provider_logs_as_its_v_flag_says() {
    let verbose = Provider::start_configured("v4", |command| {
        command
            .args(["--v", "4"])
            .env("MC_LOG_LEVEL", "error")
            .env_remove("RUST_LOG");
    });
    verbose.call_ok(&["list"]);
    verbose
        .process
        .wait_for_stderr("a debug line for the call", |err| {
            err.contains("provider call succeeded") && err.contains("ListMachines")
        });

    let quiet = Provider::start_configured("v2", |command| {
        command
            .args(["--v", "2"])
            .env("MC_LOG_LEVEL", "debug")
            .env_remove("RUST_LOG");
    });
    quiet.call_ok(&["list"]);
    // A failed call is logged at info: once its line is there, the list's debug line would be before it.
    let (code, _, _) = quiet.call(&["status", "--machine", "never-created"]);
    assert_eq!(code, Some(1));
    quiet.process.wait_for_stderr("the failed call at info", |err| {
        err.contains("provider call failed")
    });
    let stderr = quiet.process.stderr();
    assert!(
        !stderr.contains("provider call succeeded"),
        "--v 2 is info: {stderr}"
    );
    assert!(!stderr.contains("DEBUG"), "--v 2 is info: {stderr}");
}

#[test]
fn bad_usage_exits_2_naming_the_flag() {
    let provider = Provider::start("usage");
    let (code, _, stderr) = provider.call(&["create"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--machine"), "{stderr}");
    let (code, _, stderr) = provider.call(&["volumes"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--pv-file"), "{stderr}");
    let (code, _, stderr) = provider.call(&[
        "list",
        "--class",
        "/nonexistent/class.yaml",
        "--secret",
        "/nonexistent/s.yaml",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--class"), "{stderr}");
}

#[test]
fn a_provider_message_quoting_the_secret_is_printed_redacted() {
    // --echo-requests: the first call of each method per machine fails quoting the whole request, secret included.
    let provider = Provider::start_with("redacted", &["--echo-requests"]);
    let (code, stdout, stderr) = provider.call(&["create", "--machine", "echoed"]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    let text = std::fs::read_to_string(example("00-secret.yaml")).expect("the example secret");
    let secret: k8s_openapi::api::core::v1::Secret = serde_saphyr::from_str(&text).expect("a Secret");
    let values: Vec<String> = secret
        .data
        .iter()
        .flat_map(|data| data.values())
        .map(|value| String::from_utf8_lossy(&value.0).trim().to_owned())
        .chain(
            secret
                .string_data
                .iter()
                .flat_map(|data| data.values())
                .map(|v| v.trim().to_owned()),
        )
        .filter(|value| value.len() >= 6)
        .collect();
    assert!(!values.is_empty(), "the example secret has values to leak");
    for value in &values {
        assert!(
            !stderr.contains(value.as_str()),
            "a secret value is printed: {stderr}"
        );
        for line in value.lines().map(str::trim).filter(|line| line.len() >= 12) {
            assert!(
                !stderr.contains(line),
                "a line of a secret value is printed: {stderr}"
            );
        }
    }
    assert!(
        stderr.contains("create: ") && stderr.contains("[redacted]"),
        "the error is printed, the secret's values replaced: {stderr}"
    );
}

/// A plain HTTP/1.1 request to the control endpoint (one per connection): status code and body.
fn http(address: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the control endpoint");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("read timeout");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status code");
    (status, body.to_owned())
}

/// The control address `mcm provider sim serve --control-address` printed.
fn control_address(provider: &Provider) -> std::net::SocketAddr {
    let stdout = provider
        .process
        .wait_for_stdout("the control address", |out| out.contains("control on http://"));
    stdout
        .split("control on http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|address| address.parse().ok())
        .expect("an address")
}

/// A test outside the process injects a fault into the running provider binary, a client call sees its code and
/// message, the fault is cleared and the same call succeeds; a hanging method ends at the client's deadline; the
/// call counts tell what the provider received; a bad request names its field.
#[test]
fn faults_injected_through_the_control_endpoint_reach_calls_and_clear() {
    let provider = Provider::start_with("control", &["--control-address", "127.0.0.1:0"]);
    let control = control_address(&provider);

    let (status, body) = http(
        control,
        "POST",
        "/faults",
        r#"{"method":"CreateMachine","code":"ResourceExhausted","message":"quota exceeded (injected)"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let (code, stdout, stderr) = provider.call(&["create", "--machine", "vm-a"]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("ResourceExhausted") && stderr.contains("quota exceeded (injected)"),
        "{stderr}"
    );
    let (status, body) = http(control, "DELETE", "/faults", "");
    assert_eq!(status, 200, "{body}");
    provider.call_ok(&["create", "--machine", "vm-a"]);

    let (status, body) = http(
        control,
        "PUT",
        "/latency",
        r#"{"method":"GetMachineStatus","latency":"hang"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (code, _, stderr) = provider.call(&["status", "--machine", "vm-a", "--call-timeout", "1s"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("DeadlineExceeded"), "{stderr}");
    let (status, _) = http(
        control,
        "PUT",
        "/latency",
        r#"{"method":"GetMachineStatus","latency":"0s"}"#,
    );
    assert_eq!(status, 200);
    // The sim's VMs are uninitialized until InitializeMachine succeeds.
    provider.call_ok(&["init", "--machine", "vm-a"]);
    let answer = provider.call_ok(&["status", "--machine", "vm-a"]);
    assert!(answer.contains("vm-a"), "{answer}");

    let (status, body) = http(control, "GET", "/calls", "");
    assert_eq!(status, 200, "{body}");
    let counts: serde_json::Value = serde_json::from_str(&body).expect("JSON counts");
    assert_eq!(counts["CreateMachine"], 2, "{body}");
    assert_eq!(counts["GetMachineStatus"], 2, "{body}");

    let (status, body) = http(
        control,
        "POST",
        "/faults",
        r#"{"method":"Create","code":"Internal"}"#,
    );
    assert_eq!(status, 400);
    assert!(body.contains("method: unknown method \"Create\""), "{body}");
    let (status, _) = http(control, "DELETE", "/faults/99", "");
    assert_eq!(status, 404);
}

#[test]
fn the_control_endpoint_refuses_a_non_loopback_address() {
    let dir = tempfile::tempdir().expect("a test directory");
    let endpoint = format!("unix://{}", dir.path().join("p.sock").display());
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(["provider", "sim", "serve", "--endpoint", &endpoint])
        .args(["--control-address", "0.0.0.0:0"])
        .output()
        .expect("mcm provider sim serve runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--control-address") && stderr.contains("loopback"),
        "{stderr}"
    );
}

/// `PUT /reachable` false: the provider stops serving (its socket goes), so a client sees Unavailable as for a dead
/// provider; true: it serves again, its VMs kept.
#[test]
fn the_control_endpoint_makes_the_provider_unreachable_and_back() {
    let provider = Provider::start_with("reach", &["--control-address", "127.0.0.1:0"]);
    let control = control_address(&provider);
    provider.call_ok(&["create", "--machine", "vm-r"]);

    let (status, body) = http(control, "PUT", "/reachable", r#"{"reachable":false}"#);
    assert_eq!(status, 200, "{body}");
    provider
        .process
        .wait_for_stdout("the provider to stop serving", |out| {
            out.contains("unreachable (PUT /reachable")
        });
    let (code, _, stderr) = provider.call(&["list"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("Unavailable"), "{stderr}");

    let (status, body) = http(control, "PUT", "/reachable", r#"{"reachable":true}"#);
    assert_eq!(status, 200, "{body}");
    let listed = support::poll("the provider to serve again", support::CONDITION_DEADLINE, || {
        let (code, stdout, _) = provider.call(&["list"]);
        (code == Some(0)).then_some(stdout)
    });
    assert!(listed.contains("vm-r"), "the VM was kept: {listed}");

    let (status, body) = http(control, "PUT", "/reachable", r#"{"reachable":"no"}"#);
    assert_eq!(status, 400);
    assert!(body.contains("the reachability: invalid type"), "{body}");
}
