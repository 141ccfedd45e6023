//! End to end: two `mcm run` processes against one `mcm apiserver`, sharing one provider out of process (as two
//! replicas of deploy/base/deployment.yaml would): the first holds both Leases and acts, the second stands by (ready, and
//! never calls the provider); when the first is killed with SIGKILL the second takes both Leases once they expire and
//! carries on with the same machines.

use crate::support;

use std::time::Instant;

use support::{
    Background, CONDITION_DEADLINE, Server, address_of, get, mcm_run_command, poll, start_sim_provider,
};

/// Short Leases so that the test runs in seconds (the reference's 15s/10s/2s are the defaults).
const LEASE: [&str; 6] = [
    "--leader-elect-lease-duration",
    "3s",
    "--leader-elect-renew-deadline",
    "2s",
    "--leader-elect-retry-period",
    "500ms",
];

/// `mcm run` with `provider` (`--provider sim` or `--provider-endpoint E`) and the Lease timings `lease`.
fn mcm_run(server: &Server, provider: &[&str], lease: &[&str], what: &str) -> Background {
    let mut command = mcm_run_command(server, provider);
    command.args(lease);
    Background::spawn(command, what.into())
}

/// A long Lease: only a release explains a quick takeover.
const LONG_LEASE: [&str; 6] = [
    "--leader-elect-lease-duration",
    "60s",
    "--leader-elect-renew-deadline",
    "40s",
    "--leader-elect-retry-period",
    "500ms",
];

fn holder(server: &Server, lease: &str) -> String {
    let output = server.kubectl(&["get", "lease", lease, "-o", "jsonpath={.spec.holderIdentity}"]);
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn create_calls(metrics: &str) -> usize {
    metrics
        .lines()
        .find(|line| {
            line.starts_with(
                r#"mcm_cloud_api_driver_request_duration_seconds_count{provider="sim",operation="CreateMachine"}"#,
            )
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_standby_takes_over_both_leases_when_the_leader_is_killed_and_never_acts_before() {
    let server = Server::start("leader-failover");
    let (provider, endpoint) = start_sim_provider(&server, |command| {
        command.args(["--sim-heartbeat-interval", "1s"]);
    });

    let provider_flags = ["--provider-endpoint", endpoint.as_str()];
    let first = mcm_run(&server, &provider_flags, &LEASE, "mcm run (first)");
    let first_address = address_of(&first);
    let leader = poll(
        "the first process to hold both Leases",
        CONDITION_DEADLINE,
        || {
            let machines = holder(&server, "machine-controller");
            let sets = holder(&server, "machine-controller-manager");
            (!machines.is_empty() && machines == sets).then_some(machines)
        },
    );
    let second = mcm_run(&server, &provider_flags, &LEASE, "mcm run (second)");
    let second_address = address_of(&second);
    // The standby knows it is not the leader: it is ready (leadership known), with a check per Lease.
    let readyz = poll("the standby to be ready", CONDITION_DEADLINE, || {
        let (status, body) = get(second_address, "/readyz");
        (status == 200).then_some(body)
    });
    for lease in ["machine-controller", "machine-controller-manager"] {
        assert!(
            readyz.contains(&format!("[+]leader-election {lease} ok")),
            "{readyz}"
        );
    }

    server.apply_examples(&["00-secret.yaml", "01-machine-class.yaml", "20-machine-set.yaml"]);
    poll("the set's two machines Running", CONDITION_DEADLINE, || {
        let phases = server.machine_phases(&[]);
        (phases.iter().filter(|p| *p == "Running").count() == 2).then_some(())
    });
    assert_eq!(
        create_calls(&get(first_address, "/metrics").1),
        2,
        "the leader created both"
    );
    assert_eq!(
        create_calls(&get(second_address, "/metrics").1),
        0,
        "the standby never calls the provider"
    );
    assert_eq!(
        holder(&server, "machine-controller"),
        leader,
        "the leader keeps renewing"
    );

    // SIGKILL: no release, the standby must wait for the Leases to expire.
    let killed = Instant::now();
    drop(first.stop());
    let successor = poll("the standby to take both Leases", CONDITION_DEADLINE, || {
        let machines = holder(&server, "machine-controller");
        let sets = holder(&server, "machine-controller-manager");
        (machines != leader && sets != leader && machines == sets && !machines.is_empty()).then_some(machines)
    });
    eprintln!(
        "takeover {:?} after SIGKILL (lease 3s, retry 500ms)",
        killed.elapsed()
    );
    assert!(!successor.is_empty());
    let transitions = server.kubectl_ok(&[
        "get",
        "lease",
        "machine-controller",
        "-o",
        "jsonpath={.spec.leaseTransitions}",
    ]);
    assert_eq!(transitions, "1", "one change of holder");

    // The new leader carries on: it knows the machines, and scaling up creates through it.
    server.kubectl_ok(&["scale", "machineset", "workers-set", "--replicas=3"]);
    poll("the third machine Running", CONDITION_DEADLINE, || {
        let phases = server.machine_phases(&[]);
        (phases.iter().filter(|p| *p == "Running").count() == 3).then_some(())
    });
    assert_eq!(
        create_calls(&get(second_address, "/metrics").1),
        1,
        "only the new machine was created"
    );
    drop(second);
    drop(provider);
}

/// SIGTERM releases the Leases: the standby takes over at once instead of waiting for them to expire.
#[test]
fn a_leader_stopped_with_sigterm_hands_over_at_once() {
    let server = Server::start("leader-release");
    let (provider, endpoint) = start_sim_provider(&server, |_| {});
    let provider_flags = ["--provider-endpoint", endpoint.as_str()];
    let first = mcm_run(&server, &provider_flags, &LONG_LEASE, "mcm run (first)");
    address_of(&first);
    let leader = poll("the first process to lead", CONDITION_DEADLINE, || {
        let holder = holder(&server, "machine-controller");
        (!holder.is_empty()).then_some(holder)
    });
    let second = mcm_run(&server, &provider_flags, &LONG_LEASE, "mcm run (second)");
    address_of(&second);

    let output = first.terminate(CONDITION_DEADLINE);
    assert!(output.status.success(), "a clean exit: {output:?}");
    // Well within the 60s Lease: the deadline of the poll is 20s.
    poll("the standby to take over", CONDITION_DEADLINE, || {
        let holder = holder(&server, "machine-controller");
        (!holder.is_empty() && holder != leader).then_some(())
    });
    drop(second);
    drop(provider);
}

/// A leader that finds its Lease taken stops at once and exits 1, as the reference does, instead of acting on.
#[test]
fn a_leader_whose_lease_is_taken_exits_non_zero() {
    let server = Server::start("leader-lost");
    let run = mcm_run(&server, &["--provider", "sim"], &LEASE, "mcm run");
    address_of(&run);
    poll("the process to lead", CONDITION_DEADLINE, || {
        (!holder(&server, "machine-controller").is_empty()).then_some(())
    });
    let now = server
        .kubectl_ok(&[
            "get",
            "lease",
            "machine-controller",
            "-o",
            "jsonpath={.spec.renewTime}",
        ])
        .trim()
        .to_owned();
    assert!(!now.is_empty());
    // Another holder with a long, fresh Lease (renewTime as the leader last wrote it, which is recent).
    let patch = format!(
        r#"{{"spec":{{"holderIdentity":"someone-else","leaseDurationSeconds":600,"renewTime":"{now}"}}}}"#
    );
    server.kubectl_ok(&[
        "patch",
        "lease",
        "machine-controller",
        "--type=merge",
        "-p",
        &patch,
    ]);
    let output = run.finish(CONDITION_DEADLINE);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("leadership lost"), "{stderr}");
    assert_eq!(
        holder(&server, "machine-controller"),
        "someone-else",
        "the Lease is left to its holder"
    );
}
