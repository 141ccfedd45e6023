//! The provider protocol in another language, end to end with Python's grpcio in both directions: the example
//! provider of `examples/providers/python` passes `mcm provider test` (our client against a Python server, the
//! Uninitialized-until-initialized rule included), its `client.py` talks to `mcm provider sim serve` (a Python
//! client against our server on a unix socket, which grpc-core reaches with the socket path as `:authority`), and its
//! generated stubs are what `generate.sh` makes from proto/ today.
//!
//! python3 with `examples/providers/python/requirements.txt` installed is needed: without it each test prints why
//! and passes, unless `MCM_REQUIRE_PYTHON=1` (CI) makes it fail. `MCM_PYTHON` names another interpreter.

use crate::support;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use support::{Background, COMMAND_DEADLINE};

/// The example's folder.
fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/providers/python")
}

/// The interpreter with the example's requirements, or None after printing why (a failure when
/// `MCM_REQUIRE_PYTHON=1`).
fn python() -> Option<String> {
    let python = std::env::var("MCM_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let probe = Command::new(&python)
        .args([
            "-c",
            "import grpc, grpc_tools, google.protobuf; print(grpc.__version__)",
        ])
        .output();
    let reason = match probe {
        Ok(output) if output.status.success() => return Some(python),
        Ok(output) => format!(
            "{python} lacks the example's requirements (pip install -r examples/providers/python/requirements.txt): \
             {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(err) => format!("{python} cannot be run: {err}"),
    };
    assert!(
        std::env::var("MCM_REQUIRE_PYTHON").as_deref() != Ok("1"),
        "MCM_REQUIRE_PYTHON=1: {reason}"
    );
    println!("skipped: {reason}");
    None
}

/// The Python provider serving on a socket in a fresh directory; stopped on drop.
struct PythonProvider {
    _process: Background,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl PythonProvider {
    fn start(python: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("mcm-e2e-python-")
            .tempdir()
            .expect("a test directory");
        let endpoint = format!("unix://{}", dir.path().join("p.sock").display());
        let mut command = Command::new(python);
        command
            .arg(example_dir().join("provider.py"))
            .env("MC_ENDPOINT", &endpoint);
        let process = Background::spawn(command, "provider.py".into());
        process.wait_for_stdout("the Python provider to serve", |out| out.contains("serving on"));
        Self {
            _process: process,
            endpoint,
            _dir: dir,
        }
    }
}

#[test]
fn the_python_provider_passes_the_conformance_suite() {
    let Some(python) = python() else { return };
    let provider = PythonProvider::start(&python);
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(["provider", "test", "--endpoint", &provider.endpoint, "--class"])
        .arg(example_dir().join("01-machine-class.yaml"))
        .arg("--secret")
        .arg(example_dir().join("00-secret.yaml"))
        .output()
        .expect("mcm provider test runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
    // It answers Uninitialized until InitializeMachine, and declares no GetVolumeIDs: both are judged, not skipped.
    for check in [
        "uninitialized-until-initialized",
        "get-machine-status",
        "get-volume-ids",
    ] {
        assert!(stdout.contains(&format!("PASS {check}")), "{check}: {stdout}");
    }
}

#[test]
fn a_python_client_calls_our_provider_on_a_unix_socket() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().expect("a test directory");
    let endpoint = format!("unix://{}", dir.path().join("p.sock").display());
    let mut sim = Command::new(env!("CARGO_BIN_EXE_mcm"));
    sim.args(["provider", "sim", "serve", "--endpoint", &endpoint]);
    let sim = Background::spawn(sim, "mcm provider sim serve".into());
    sim.wait_for_stdout("the provider to serve", |out| out.contains("serving on"));

    let mut client = Command::new(&python);
    client
        .arg(example_dir().join("client.py"))
        .env("MC_ENDPOINT", &endpoint);
    let output = Background::spawn(client, "client.py".into()).finish(COMMAND_DEADLINE);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("name: sim\nprotocol: v1\n"), "{stdout}");
    assert!(stdout.contains("ready: True"), "{stdout}");
    // An error answer arrives with its machine code read from our status detail, and its message naming the field.
    assert!(
        stdout.contains("status without a class: code 3: machine_class"),
        "{stdout}"
    );
}

#[test]
fn the_generated_stubs_are_what_generate_sh_makes_from_the_proto() {
    let Some(python) = python() else { return };
    let out = tempfile::tempdir().expect("a directory");
    let output = Command::new("sh")
        .arg(example_dir().join("generate.sh"))
        .arg(out.path())
        .env("PATH", path_with(&python))
        .output()
        .expect("generate.sh runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for file in ["provider_pb2.py", "provider_pb2_grpc.py"] {
        let relative = Path::new("mcm/provider/v1").join(file);
        let fresh = std::fs::read_to_string(out.path().join(&relative)).expect("a generated stub");
        let kept = std::fs::read_to_string(example_dir().join("generated").join(&relative))
            .expect("the stub in the repository");
        assert!(
            fresh == kept,
            "examples/providers/python/generated/{} differs from what generate.sh makes: run it again",
            relative.display()
        );
    }
}

/// PATH with the directory of `python` first when it names a file (MCM_PYTHON), so that generate.sh's `python3` is
/// that interpreter.
fn path_with(python: &str) -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    match Path::new(python)
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
    {
        Some(dir) => format!("{}:{path}", dir.display()),
        None => path,
    }
}
