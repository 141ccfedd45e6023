//! End to end: `mcm bench` against its own embedded API server, with the controllers and the sim provider as child
//! processes, writes a report with three phases, request counts and a ceiling. Figures are measured, never asserted.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// How long the whole small benchmark may take.
const DEADLINE: Duration = Duration::from_mins(3);

#[test]
fn bench_reports_three_phases_with_writes_requests_and_a_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("report.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args([
            "bench",
            "--machines",
            "5",
            "--heartbeat-interval",
            "1s",
            "--output",
        ])
        .arg(&output)
        .env("TMPDIR", dir.path())
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

    assert_eq!(report["machines"], 5);
    assert_eq!(report["heartbeat_interval"], "1s");
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
    assert_eq!(names, ["create", "roll", "scale_to_zero"]);
    for phase in phases {
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
    assert_eq!(
        phases[0]["requests"]["create machines.machine.sapcloud.io"], 5,
        "the controllers created the 5 machines: {report}"
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
