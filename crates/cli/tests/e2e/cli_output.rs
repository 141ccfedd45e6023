//! What `mcm` writes where a user pipes it: a reader that closes standard output early (`mcm crds | head`) ends the
//! command quietly with exit 0, and logs going to a pipe or a file carry no ANSI colour codes.

use crate::support;

use std::{
    io::{BufRead, BufReader, Read},
    process::{Command, Stdio},
};

use support::{Background, COMMAND_DEADLINE};

fn mcm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcm"))
}

/// A scratch directory of this test (removed first and on drop).
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("mcm-e2e-output-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the test directory");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn crds_into_a_reader_that_stops_after_one_line_exits_0_without_an_error() {
    let mut child = mcm()
        .arg("crds")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mcm crds starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("the first line");
    assert!(!first.trim().is_empty(), "mcm crds printed something");
    // `head -1`: the reader goes away while the CRDs (far more than a pipe's buffer) are still being written.
    drop(stdout);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    let status = child.wait().expect("mcm crds exits");
    assert!(status.success(), "exit {status}, stderr:\n{stderr}");
    assert_eq!(stderr, "", "nothing on stderr");
}

#[test]
fn a_command_printing_lines_into_a_closed_pipe_exits_0_without_an_error() {
    let scratch = Scratch::new("closed");
    for args in [
        vec!["crds"],
        vec!["crds", "--capi-rbac"],
        vec!["down", "--data-dir"],
    ] {
        // A pipe whose reader is gone before the command starts: its first write fails.
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let mut command = mcm();
        command.args(&args);
        if args[0] == "down" {
            command.arg(scratch.0.join("never-up"));
        }
        let output = command
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("mcm runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "mcm {args:?}: exit {}, stderr:\n{stderr}",
            output.status
        );
        assert_eq!(stderr, "", "mcm {args:?}: nothing on stderr");
    }
}

#[test]
fn logs_to_a_pipe_carry_no_ansi_colour_codes() {
    let scratch = Scratch::new("ansi");
    let mut command = mcm();
    command
        .args(["apiserver", "--in-memory", "--port", "0", "--data-dir"])
        .arg(scratch.0.join("data"))
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR");
    let server = Background::spawn(command, "mcm apiserver".into());
    server.wait_for_stderr("the listening line", |err| err.contains("API server listening"));
    let output = server.terminate(COMMAND_DEADLINE);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("INFO"), "levels are still written:\n{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "ANSI codes in a log to a pipe:\n{stderr:?}"
    );
}
