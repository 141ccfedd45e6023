//! End to end: the API server paused (SIGSTOP: connections hang, nothing answers) for longer than both the
//! reachability timeout (`--machine-safety-apiserver-statuscheck-timeout`) and the health timeout, with and without
//! leader election, while `mcm run` manages a MachineSet of two machines through the sim provider out of process
//! (whose kubelets cannot heartbeat meanwhile).
//!
//! Which wins: with leader election the renew deadline (2 s here, 10 s by default) is shorter than the reachability
//! timeout (4 s here, 30 s by default), so the lost Lease ends the process first (exit 1, as the reference's
//! `klog.Fatalf`); a restarted process stands by until the server answers, takes the expired Lease and carries on.
//! Without leader election the reachability freeze holds the machine controller until the server has answered for
//! a whole timeout, then restarts the health clocks. Either way: the same machines before and after (0
//! replacements), two VMs, all Running again by themselves.

use crate::support;

use std::time::{Duration, Instant};

use support::{Background, CONDITION_DEADLINE, Server, mcm_run_command, poll, start_sim_provider};

/// Short timings so that the pause outlasts every one of them within seconds.
const TIMINGS: [&str; 12] = [
    "--machine-safety-apiserver-statuscheck-timeout",
    "4s",
    "--machine-safety-apiserver-statuscheck-period",
    "4s",
    "--machine-health-timeout",
    "3s",
    "--leader-elect-lease-duration",
    "3s",
    "--leader-elect-renew-deadline",
    "2s",
    "--leader-elect-retry-period",
    "500ms",
];

/// How long the server stays paused: past the reachability timeout, the health timeout and the node grace period.
const PAUSE: Duration = Duration::from_secs(7);

fn machine_names(server: &Server) -> Vec<String> {
    let mut names: Vec<String> = server
        .kubectl_ok(&[
            "get",
            "machines",
            "-l",
            "pool=sim-set",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}",
        ])
        .lines()
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

fn all_running(server: &Server, count: usize) -> Option<()> {
    let phases = server.machine_phases(&["-l", "pool=sim-set"]);
    (phases.len() == count && phases.iter().all(|p| p == "Running")).then_some(())
}

fn run(server: &Server, endpoint: &str, leader_elect: bool, what: &str) -> Background {
    let mut command = mcm_run_command(server, &["--provider-endpoint", endpoint]);
    command.args(TIMINGS);
    command.arg(format!("--leader-elect={leader_elect}"));
    Background::spawn(command, what.into())
}

fn pause_and_resume(test: &str, leader_elect: bool) {
    let server = Server::start_with(test, |_| vec!["--node-monitor-grace-period".into(), "2s".into()]);
    let (_provider, endpoint) = start_sim_provider(&server, |command| {
        command.args(["--sim-heartbeat-interval", "500ms"]);
    });
    for file in ["00-secret.yaml", "01-machine-class.yaml", "20-machine-set.yaml"] {
        server.kubectl_ok(&["apply", "-f", support::arg(&mcm_testkit::example("sim", file))]);
    }
    let mut running = run(&server, &endpoint, leader_elect, "mcm run");
    poll("two Running machines", CONDITION_DEADLINE, || {
        all_running(&server, 2)
    });
    let before = machine_names(&server);

    server.pause();
    let paused = Instant::now();
    if leader_elect {
        // The lost Lease wins: the process exits within the renew deadline (and a little), long before the pause
        // ends or the reachability timeout could freeze it.
        let output = running.finish(PAUSE);
        assert_eq!(output.status.code(), Some(1), "a lost Lease ends the process");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stderr.contains("leadership lost") || stdout.contains("leadership lost"),
            "the reason is logged:\n{stdout}\n{stderr}"
        );
        assert!(paused.elapsed() < PAUSE, "it exited before the pause ended");
        // As its Deployment would: start it again while the server is still paused; it stands by.
        running = run(&server, &endpoint, true, "mcm run (restarted)");
    } else {
        running.wait_for_stderr("the freeze", |err| {
            err.contains("the machine controller is frozen")
        });
    }
    // The rest of the pause is the injected fault's length, not a wait for a condition.
    std::thread::sleep(PAUSE.saturating_sub(paused.elapsed()));
    server.resume();

    poll("both machines Running again", CONDITION_DEADLINE, || {
        all_running(&server, 2)
    });
    let after = machine_names(&server);
    assert_eq!(after, before, "the same machines: none was replaced");
    // Bounded observation window (something must NOT happen): past another health timeout, still the same two.
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        assert_eq!(
            machine_names(&server),
            before,
            "a machine was replaced after the pause"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let listed = Background::spawn(
        {
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_mcm"));
            command.args(["provider", "call", "list", "--endpoint", &endpoint]);
            command.args([
                "--class",
                support::arg(&mcm_testkit::example("sim", "01-machine-class.yaml")),
                "--secret",
                support::arg(&mcm_testkit::example("sim", "00-secret.yaml")),
            ]);
            command
        },
        "mcm provider call list".into(),
    )
    .finish(CONDITION_DEADLINE);
    let vms = String::from_utf8_lossy(&listed.stdout).lines().count();
    assert_eq!(
        vms,
        2,
        "two VMs, no double-create:\n{}",
        String::from_utf8_lossy(&listed.stdout)
    );
    drop(running);
}

#[test]
fn a_paused_api_server_with_leader_election_ends_the_leader_and_replaces_nothing() {
    pause_and_resume("pause-le", true);
}

#[test]
fn a_paused_api_server_without_leader_election_freezes_and_replaces_nothing() {
    pause_and_resume("pause-freeze", false);
}
