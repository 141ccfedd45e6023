//! `mcm run` with the arguments of the reference's own sample Deployment (gardener/machine-controller-manager
//! `kubernetes/deployment/out-of-tree/deployment.yaml`), written down here as its two containers pass them, with the
//! `$(VARIABLES)` substituted as the kubelet substitutes them. Each container's binary is our one binary with the
//! role it stands for (`--controllers`, and `--provider sim` for the provider's container), and `--port 0 --address
//! 127.0.0.1` so that tests running in parallel share no port; every argument of the sample is passed unchanged.

use crate::support;

use std::process::Command;

use support::{Background, COMMAND_DEADLINE, Server, address_of, get};

/// The machine-controller-manager container's arguments; `{target}`, `{control}`, `{namespace}` are its variables.
const MCM_ARGS: [&str; 7] = [
    "--target-kubeconfig={target}",
    "--control-kubeconfig={control}",
    "--namespace={namespace}",
    "--safety-up=2",
    "--safety-down=1",
    "--machine-safety-overshooting-period=1",
    "--v=2",
];

/// The provider's machine-controller container's arguments (the sample swaps the two kubeconfig variables).
const MC_ARGS: [&str; 8] = [
    "--control-kubeconfig={target}",
    "--target-kubeconfig={control}",
    "--namespace={namespace}",
    "--machine-drain-timeout=5m",
    "--machine-health-timeout=10m",
    "--machine-safety-orphan-vms-period=30m",
    "--node-conditions=ReadonlyFilesystem,KernelDeadlock,DiskPressure,NetworkUnavailable",
    "--v=3",
];

fn substituted(server: &Server, args: &[&str]) -> Vec<String> {
    let kubeconfig = server.kubeconfig().display().to_string();
    args.iter()
        .map(|a| {
            a.replace("{target}", &kubeconfig)
                .replace("{control}", &kubeconfig)
                .replace("{namespace}", "default")
        })
        .collect()
}

/// `mcm run` standing for the sample container `role`: the machine controller with the sim provider (the sample's
/// AWS provider image), the controller manager with none (as the reference's takes none).
fn mcm_run(role: &str, args: &[String]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
    command.args(["run", "--controllers", role]);
    if role == "machine-controller" {
        command.args(["--provider", "sim"]);
    }
    command.args(args).args(["--port", "0", "--address", "127.0.0.1"]);
    command
}

#[test]
fn the_machine_controller_containers_sample_arguments_run_unchanged() {
    let server = Server::start("sample-args-mc");
    let run = Background::spawn(
        mcm_run("machine-controller", &substituted(&server, &MC_ARGS)),
        "mcm run (machine-controller)".into(),
    );
    let address = address_of(&run);
    assert_eq!(get(address, "/healthz"), (200, "OK".to_owned()));
    server.apply_examples(&["00-secret.yaml", "01-machine-class.yaml", "10-machine.yaml"]);
    server.kubectl_ok(&[
        "wait",
        "--for=jsonpath={.status.currentStatus.phase}=Running",
        "machine/single-machine",
        "--timeout=60s",
    ]);
    let output = run.stop();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("has no effect"),
        "every argument of the sample means something here: {stderr}"
    );
}

/// The sample's `--machine-safety-overshooting-period=1` has no unit: the reference's flag set (pflag's
/// `DurationVar`, Go's `time.ParseDuration`: "missing unit in duration") refuses it and the container exits with
/// code 2; so does `mcm run`,
/// naming the flag and Go's reason. Every other argument of that container runs unchanged.
#[test]
fn the_machine_controller_manager_containers_sample_arguments_are_read_as_the_reference_reads_them() {
    let server = Server::start("sample-args-mcm");
    let args = substituted(&server, &MCM_ARGS);
    let refused = mcm_run("machine-controller-manager", &args)
        .output()
        .expect("mcm runs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--machine-safety-overshooting-period") && stderr.contains("missing a unit"),
        "{stderr}"
    );

    let unit_less = "--machine-safety-overshooting-period=1";
    let rest: Vec<String> = args.into_iter().filter(|a| a != unit_less).collect();
    assert_eq!(rest.len(), MCM_ARGS.len() - 1);
    let run = Background::spawn(
        mcm_run("machine-controller-manager", &rest),
        "mcm run (machine-controller-manager)".into(),
    );
    let address = address_of(&run);
    assert_eq!(get(address, "/healthz"), (200, "OK".to_owned()));
    let output = run.terminate(COMMAND_DEADLINE);
    assert!(output.status.success(), "a clean shutdown: {output:?}");
}
