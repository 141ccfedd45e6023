//! End to end: `mcm bench` against its own embedded API server, with the controllers and the sim provider as child
//! processes, writes a report with its phases (two rolls here), request counts, a ceiling at the start and after
//! each phase, and what the server stores. Figures are measured, never asserted.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// How long the whole small benchmark may take.
const DEADLINE: Duration = Duration::from_mins(3);

/// Runs `mcm bench` with `args` and `TMPDIR` in `dir`, within [`DEADLINE`]; returns its report, checked to be the
/// same on stdout and in `--output`.
fn run_bench(dir: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let output = dir.join("report.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(args)
        .arg("--output")
        .arg(&output)
        .env("TMPDIR", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mcm bench starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "mcm bench did not finish within {DEADLINE:?}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(status.success(), "mcm bench failed: {status}\nstderr:\n{stderr}");

    let stdout: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).expect("JSON in --output");
    assert_eq!(stdout, report, "stdout and --output carry the same report");
    report
}

#[test]
fn bench_reports_each_phase_with_writes_requests_ceilings_and_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let report = run_bench(
        dir.path(),
        &[
            "bench",
            "--machines",
            "5",
            "--heartbeat-interval",
            "1s",
            "--rolls",
            "2",
            "--event-ttl",
            "10m",
        ],
    );
    assert_eq!(report["machines"], 5);
    assert_eq!(report["heartbeat_interval"], "1s");
    assert_eq!(report["event_ttl"], "10m0s");
    assert!(
        report["api_server"]
            .as_str()
            .unwrap()
            .starts_with("embedded on disk"),
        "{report}"
    );
    assert!(report["ceiling"]["writes"].as_u64().unwrap() > 0, "{report}");
    assert!(
        report["ceiling"]["writes_per_second"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let phases = report["phases"].as_array().expect("phases");
    let names: Vec<&str> = phases.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["create", "roll", "roll_2", "scale_to_zero"]);
    for phase in phases {
        assert!(
            phase["ceiling_after"]["writes_per_second"].as_f64().unwrap() > 0.0,
            "the ceiling is measured again after each phase: {phase}"
        );
        let store = &phase["store"];
        assert!(store["objects"].as_u64().unwrap() > 0, "{phase}");
        assert!(
            store["events"].as_u64().unwrap() > 0,
            "the controllers' Events are stored (a 10m TTL keeps them): {phase}"
        );
        assert!(store["disk_mib"].as_f64().unwrap() > 0.0, "on disk: {phase}");
        assert!(phase["writes_per_machine"].as_f64().unwrap() > 0.0, "{phase}");
        assert!(phase["ratio_to_ceiling"].as_f64().unwrap() > 0.0, "{phase}");
        assert!(phase["seconds"].as_f64().unwrap() > 0.0, "{phase}");
        let requests = phase["requests"].as_object().expect("requests");
        assert!(!requests.is_empty(), "{phase}");
        assert!(
            requests
                .keys()
                .any(|kind| kind.starts_with("patch machines.machine.sapcloud.io")),
            "the controllers' machine writes are counted: {phase}"
        );
        assert!(
            phase["controller_peak_rss_mib"].as_f64().unwrap() > 0.0,
            "{phase}"
        );
        assert!(
            phase["controller_cpu_seconds"].as_f64().unwrap() >= 0.0,
            "{phase}"
        );
    }
    for (phase, name) in [(0, "create"), (1, "roll"), (2, "roll_2")] {
        assert_eq!(
            phases[phase]["requests"]["create machines.machine.sapcloud.io"], 5,
            "the controllers created 5 machines in {name} (the second roll goes back to the first class): {report}"
        );
    }
    assert!(
        phases[3]["store"]["events"].as_u64().unwrap() > phases[0]["store"]["events"].as_u64().unwrap(),
        "Events accumulate within their TTL: {report}"
    );
    // The scratch directory (server data, socket, logs) is removed afterwards.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|name| name.to_string_lossy().starts_with("mcm-bench-"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
