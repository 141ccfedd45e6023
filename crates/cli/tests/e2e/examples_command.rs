//! `mcm examples`: the example manifests built into the binary are the repository's `examples/` files, byte for byte;
//! `--list` names every file and its object, `--dir` writes them, an unknown file is refused naming it; and the sim
//! examples, piped into `kubectl apply -f -`, give running machines with Ready nodes under
//! `mcm run --provider sim` against a real `mcm apiserver`.

use crate::support;

use std::process::Command;

use support::{Background, COMMAND_DEADLINE, Server, arg, mcm_run_command, poll};

/// Machines start in parallel, but the test machine is a busy 2-core one.
const RUNNING_DEADLINE: std::time::Duration = std::time::Duration::from_secs(90);

fn mcm(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(args)
        .output()
        .expect("mcm runs")
}

/// The YAML files of `examples/<set>`, sorted by name: (name, text).
fn files_of(set: &str) -> Vec<(String, String)> {
    let dir = mcm_testkit::examples_dir().join(set);
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .map(|path| {
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&path).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn the_printed_examples_are_the_repositorys_files_in_order_as_one_yaml_stream() {
    for set in ["local", "sim"] {
        let output = mcm(&["examples", set]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let stream = String::from_utf8(output.stdout).unwrap();
        let documents: Vec<&str> = stream.split("\n---\n").collect();
        let files = files_of(set);
        assert_eq!(
            documents.len(),
            files.len(),
            "one document per file of examples/{set}"
        );
        for ((name, text), document) in files.iter().zip(&documents) {
            assert!(
                document.starts_with(&format!("# examples/{set}/{name}\n")),
                "each document names its file: {document}"
            );
            assert!(
                document.trim_end().ends_with(text.trim_end()),
                "examples/{set}/{name} is printed unchanged:\n{document}"
            );
        }
    }
    // The default set is local.
    assert_eq!(mcm(&["examples"]).stdout, mcm(&["examples", "local"]).stdout);
}

#[test]
fn list_names_every_file_with_its_object_and_files_can_be_picked() {
    let output = mcm(&["examples", "--list"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let list = String::from_utf8(output.stdout).unwrap();
    for set in ["local", "sim"] {
        for (name, _) in files_of(set) {
            assert!(
                list.contains(&format!("{set}/{name}\t")),
                "{set}/{name} listed:\n{list}"
            );
        }
    }
    assert!(
        list.contains("local/00-secret.yaml\tSecret default/local-worker"),
        "{list}"
    );
    assert!(
        list.contains("sim/01-machine-class.yaml\tMachineClass default/sim-small"),
        "{list}"
    );
    assert!(
        list.contains("sim/30-machine-deployment.yaml\tMachineDeployment default/sim-workers"),
        "{list}"
    );

    let picked = mcm(&["examples", "local", "10-machine", "00-secret.yaml"]);
    assert!(picked.status.success());
    let picked = String::from_utf8(picked.stdout).unwrap();
    let machine = picked.find("kind: Machine\n").expect("the machine");
    let secret = picked.find("kind: Secret\n").expect("the secret");
    assert!(machine < secret, "in the order given:\n{picked}");
    assert!(
        !picked.contains("kind: MachineSet"),
        "only the files given:\n{picked}"
    );
}

#[test]
fn an_unknown_file_is_refused_naming_it_and_the_known_ones() {
    let output = mcm(&["examples", "sim", "02-machine-class-medium"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty(), "nothing printed");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("\"02-machine-class-medium\"") && stderr.contains("00-secret.yaml"),
        "{stderr}"
    );
    let output = mcm(&["examples", "gcp"]);
    assert_eq!(
        output.status.code(),
        Some(2),
        "a set clap does not know is a usage error"
    );
}

#[test]
fn dir_writes_the_files_and_the_readme() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("sim-examples");
    let output = mcm(&["examples", "sim", "--dir", arg(&target)]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for (name, text) in files_of("sim") {
        assert_eq!(
            std::fs::read_to_string(target.join(&name)).unwrap(),
            text,
            "{name}"
        );
    }
    let readme = std::fs::read_to_string(target.join("README.md")).unwrap();
    assert_eq!(
        readme,
        std::fs::read_to_string(mcm_testkit::example("sim", "README.md")).unwrap()
    );
}

/// The sim examples as a user applies them: `mcm examples sim | kubectl apply -f -`, with `mcm run --provider sim`.
/// The Machine, the MachineSet's two and the MachineDeployment's three machines run, with Ready nodes.
#[test]
fn the_sim_examples_run_with_mcm_run_provider_sim() {
    let server = Server::start("examples-sim");
    let mut run = mcm_run_command(&server, &["--provider", "sim"]);
    run.args(["--sim-heartbeat-interval", "1s"]);
    let run = Background::spawn(run, "mcm run".into());

    let pipeline = format!(
        "'{}' examples sim | kubectl --kubeconfig '{}' --cache-dir '{}' apply -f -",
        env!("CARGO_BIN_EXE_mcm"),
        server.kubeconfig().display(),
        server.cache_dir().display()
    );
    let mut shell = Command::new("sh");
    shell.args(["-c", &pipeline]);
    let applied =
        Background::spawn(shell, "mcm examples sim | kubectl apply -f -".into()).finish(COMMAND_DEADLINE);
    let stdout = String::from_utf8_lossy(&applied.stdout);
    assert!(
        applied.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    for object in [
        "secret/sim-worker created",
        "machineclass.machine.sapcloud.io/sim-small created",
        "machine.machine.sapcloud.io/sim-machine created",
        "machineset.machine.sapcloud.io/sim-set created",
        "machinedeployment.machine.sapcloud.io/sim-workers created",
    ] {
        assert!(stdout.contains(object), "{object}:\n{stdout}");
    }

    poll("six Running machines", RUNNING_DEADLINE, || {
        let phases = server.machine_phases(&[]);
        (phases.len() == 6 && phases.iter().all(|phase| phase == "Running")).then_some(())
    });
    server.kubectl_ok(&["wait", "--for=condition=Ready", "nodes", "--all", "--timeout=60s"]);
    let nodes = server.kubectl_ok(&["get", "nodes", "-o", "name"]);
    assert_eq!(nodes.lines().count(), 6, "{nodes}");
    assert!(nodes.contains("node/sim-machine"), "{nodes}");
    server.kubectl_ok(&[
        "wait",
        "--for=jsonpath={.status.availableReplicas}=3",
        "machinedeployment/sim-workers",
        "--timeout=60s",
    ]);
    drop(run);
}
