//! End to end: `mcm up` (embedded API server, local provider as a gRPC child, every controller) driven with kubectl
//! and the example manifests unchanged: the Machine, the MachineSet and the MachineDeployment reach Running with
//! Ready nodes; the deployment rolls to local-medium; a killed machine process turns its node Unknown and the
//! machine is replaced; a userData that fails leaves its machine Pending, then Failed at the creation timeout;
//! `mcm up` resumes with the machines still there; deleting everything and `mcm down --purge` leave no process and
//! no state behind; `kubectl delete node` replaces the node's machine and the node goes; `kubectl annotate node X
//! node.machine.sapcloud.io/preserve=now` preserves its machine until the annotation is removed; a class change of an
//! InPlaceUpdate deployment is applied by the node agents on the same machines.

use crate::support;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use support::{Background, COMMAND_DEADLINE, arg, poll};

/// Machines boot a shell and a node agent; several at once on a busy 2-core machine take a while.
const SLOW: Duration = Duration::from_secs(90);

fn example(file: &str) -> PathBuf {
    mcm_testkit::example("local", file)
}

struct Up {
    dir: PathBuf,
    process: Option<Background>,
}

impl Up {
    fn start(test: &str, extra: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("mcm-e2e-up-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut up = Self { dir, process: None };
        up.spawn(extra);
        up
    }

    fn spawn(&mut self, extra: &[&str]) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
        command
            .args(["up", "--data-dir"])
            .arg(&self.dir)
            .args([
                "--node-monitor-grace-period",
                "4s",
                "--node-heartbeat-interval",
                "1s",
            ])
            .args(extra);
        let process = Background::spawn(command, "mcm up".into());
        process.wait_for_stdout("mcm up to be ready", |out| out.contains("mcm up: ready"));
        self.process = Some(process);
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.dir.join("kubeconfig"))
            .args(args)
            .output()
            .expect("kubectl runs")
    }

    fn kubectl_ok(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        assert!(
            output.status.success(),
            "kubectl {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `name=phase` of every machine.
    fn phases(&self) -> Vec<(String, String)> {
        let out = self.kubectl_ok(&[
            "get",
            "machines",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name}={.status.currentStatus.phase}{"\n"}{end}"#,
        ]);
        out.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(n, p)| (n.to_owned(), p.to_owned()))
            .collect()
    }

    /// `kubectl get <object> -o jsonpath=<path>`: one field of one object (`object` as `kind name` or `kind/name`).
    fn jsonpath(&self, object: &[&str], path: &str) -> String {
        let jsonpath = format!("jsonpath={path}");
        let mut args = vec!["get"];
        args.extend_from_slice(object);
        args.extend(["-o", &jsonpath]);
        self.kubectl_ok(&args)
    }

    /// Applies the local example manifests `files` in order, as a user following the README does.
    fn apply_examples(&self, files: &[&str]) {
        for file in files {
            self.kubectl_ok(&["apply", "-f", arg(&example(file))]);
        }
    }

    /// Writes and applies a Secret `<prefix>-boot` whose userData is `user_data`, a local MachineClass
    /// `<prefix>-class` using it and a Machine `<prefix>-machine` of that class.
    fn apply_one_machine(&self, prefix: &str, user_data: &str) {
        let user_data: String = user_data.lines().flat_map(|line| ["    ", line, "\n"]).collect();
        let manifest = self.dir.join(format!("{prefix}.yaml"));
        std::fs::write(
            &manifest,
            format!(
                r#"apiVersion: v1
kind: Secret
metadata: {{ name: {prefix}-boot, namespace: default }}
stringData:
  userData: |
{user_data}---
apiVersion: machine.sapcloud.io/v1alpha1
kind: MachineClass
metadata: {{ name: {prefix}-class, namespace: default }}
provider: local
providerSpec: {{ vmPool: pool, size: small, tags: {{ kubernetes.io/cluster/demo: "1" }} }}
secretRef: {{ name: {prefix}-boot, namespace: default }}
---
apiVersion: machine.sapcloud.io/v1alpha1
kind: Machine
metadata: {{ name: {prefix}-machine, namespace: default }}
spec: {{ class: {{ kind: MachineClass, name: {prefix}-class }} }}
"#
            ),
        )
        .expect("the manifest");
        self.kubectl_ok(&["apply", "-f", arg(&manifest)]);
    }

    /// Waits until exactly `count` machines are Running with as many Ready nodes.
    fn wait_running(&self, what: &str, count: usize) {
        poll(what, SLOW, || {
            (all_running(self, count) && ready_nodes(self) == count).then_some(())
        });
    }

    /// The node a machine names (its `node` label); asserts that it names one.
    fn node_of(&self, machine: &str) -> String {
        let node = self.jsonpath(&["machine", machine], "{.metadata.labels.node}");
        assert!(!node.is_empty(), "the machine names its node");
        node
    }

    fn machine_dir(&self, name: &str) -> PathBuf {
        self.dir.join("machines/default").join(name)
    }

    /// The process group of a machine, from its record.
    fn pgid(&self, name: &str) -> i32 {
        let record =
            std::fs::read_to_string(self.machine_dir(name).join("machine.json")).expect("the record");
        let record: serde_json::Value = serde_json::from_str(&record).expect("JSON");
        i32::try_from(record["pgid"].as_i64().expect("a pgid")).expect("an i32")
    }

    fn down(&mut self, purge: bool) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
        command.args(["down", "--data-dir"]).arg(&self.dir);
        if purge {
            command.arg("--purge");
        }
        let output = command.output().expect("mcm down runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        if let Some(process) = self.process.take() {
            let output = process.finish(COMMAND_DEADLINE);
            assert!(output.status.success(), "mcm up exits cleanly: {output:?}");
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if self.dir.exists() {
            let _ = Command::new(env!("CARGO_BIN_EXE_mcm"))
                .args(["down", "--purge", "--data-dir"])
                .arg(&self.dir)
                .output();
        }
    }
}

/// Whether any process of the group still runs (zombies, which a container's init may leave, do not count).
fn group_alive(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| {
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            fields.first().is_some_and(|state| *state != "Z")
                && fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid)
        })
    })
}

fn all_running(up: &Up, count: usize) -> bool {
    let phases = up.phases();
    phases.len() == count && phases.iter().all(|(_, p)| p == "Running")
}

fn ready_nodes(up: &Up) -> usize {
    up.kubectl_ok(&[
        "get",
        "nodes",
        "-o",
        r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
    ])
    .lines()
    .filter(|s| *s == "True")
    .count()
}

#[test]
#[allow(clippy::too_many_lines)] // one story, told in order: run, roll, kill, resume, delete, purge
fn the_examples_run_roll_replace_a_killed_machine_resume_and_leave_nothing_behind() {
    let mut up = Up::start("examples", &["--machine-health-timeout", "5s"]);
    up.apply_examples(&[
        "00-secret.yaml",
        "01-machine-class.yaml",
        "02-machine-class-medium.yaml",
        "10-machine.yaml",
        "20-machine-set.yaml",
        "30-machine-deployment.yaml",
    ]);
    up.wait_running("six Running machines with Ready nodes", 6);
    let capacity = up.jsonpath(&["node", "single-machine"], "{.status.capacity.cpu}");
    assert_eq!(capacity, "2", "local-small nodes report 2 CPUs");

    // Rolling the deployment to local-medium.
    up.kubectl_ok(&[
        "patch",
        "machinedeployment",
        "workers",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"template":{"spec":{"class":{"name":"local-medium"}}}}}"#,
    ]);
    poll("the deployment rolled to local-medium", SLOW, || {
        let classes = up.kubectl_ok(&[
            "get",
            "machines",
            "-l",
            "name=workers",
            "-o",
            r#"jsonpath={range .items[*]}{.spec.class.name}/{.status.currentStatus.phase}{"\n"}{end}"#,
        ]);
        let lines: Vec<&str> = classes.lines().collect();
        (lines.len() == 3 && lines.iter().all(|l| *l == "local-medium/Running")).then_some(())
    });

    // A killed machine process: its node turns Unknown, and the set replaces the machine.
    let victim = up
        .phases()
        .into_iter()
        .map(|(name, _)| name)
        .find(|name| name.starts_with("workers-set-"))
        .expect("a machine of the set");
    let pgid = up.pgid(&victim);
    let killed = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    poll("the killed machine's node to turn Unknown", SLOW, || {
        let status = up.jsonpath(
            &["node", &victim],
            r#"{.status.conditions[?(@.type=="Ready")].status}"#,
        );
        (status == "Unknown").then_some(())
    });
    poll("the killed machine replaced", SLOW, || {
        let phases = up.phases();
        let set: Vec<&(String, String)> = phases
            .iter()
            .filter(|(n, _)| n.starts_with("workers-set-"))
            .collect();
        (set.len() == 2 && set.iter().all(|(n, p)| *n != victim && p == "Running")).then_some(())
    });

    // Stopped and started again: the machines are still there and still Running.
    let before: Vec<String> = up.phases().into_iter().map(|(n, _)| n).collect();
    let pgids: Vec<i32> = before.iter().map(|name| up.pgid(name)).collect();
    up.down(false);
    assert!(
        pgids.iter().all(|pgid| group_alive(*pgid)),
        "machines outlive mcm up"
    );
    up.spawn(&["--machine-health-timeout", "5s"]);
    poll("the same machines Running after the restart", SLOW, || {
        let after: Vec<String> = up.phases().into_iter().map(|(n, _)| n).collect();
        (after == before && all_running(&up, before.len()) && ready_nodes(&up) == before.len()).then_some(())
    });

    // Deleting everything stops every machine process and removes its state.
    for file in [
        "30-machine-deployment.yaml",
        "20-machine-set.yaml",
        "10-machine.yaml",
    ] {
        up.kubectl_ok(&["delete", "-f", arg(&example(file)), "--wait=false"]);
    }
    poll("no machine left", SLOW, || up.phases().is_empty().then_some(()));
    poll("no machine process left", SLOW, || {
        pgids.iter().all(|pgid| !group_alive(*pgid)).then_some(())
    });
    let left = std::fs::read_dir(up.dir.join("machines/default")).map_or(0, Iterator::count);
    assert_eq!(left, 0, "no machine directory left");
    up.down(true);
    assert!(!up.dir.exists(), "--purge removes the data directory");
}

#[test]
fn a_failing_user_data_leaves_the_machine_pending_then_failed() {
    let mut up = Up::start("failing", &["--machine-creation-timeout", "6s"]);
    up.apply_one_machine("broken", "#!/bin/sh\necho \"cannot boot\" >&2\nexit 3");
    poll("the machine Pending", SLOW, || {
        up.phases()
            .iter()
            .any(|(n, p)| n == "broken-machine" && p == "Pending")
            .then_some(())
    });
    poll("the machine Failed at the creation timeout", SLOW, || {
        up.phases()
            .iter()
            .any(|(n, p)| n == "broken-machine" && p == "Failed")
            .then_some(())
    });
    let log =
        std::fs::read_to_string(up.machine_dir("broken-machine").join("machine.log")).unwrap_or_default();
    assert!(
        log.contains("cannot boot"),
        "the machine's output is in its log: {log}"
    );
    up.down(true);
    assert!(!Path::new(&up.dir).exists());
}

/// How long a process may take to stop.
const PROCESS_DEADLINE: Duration = Duration::from_secs(20);

/// The processes serving the local provider on `dir` (`mcm provider local serve ... --state-dir <dir>`), zombies
/// excluded.
fn provider_pids(dir: &Path) -> Vec<i32> {
    const SERVE: [&[u8]; 3] = [b"provider", b"local", b"serve"];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            let running = std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .is_some_and(|state| state != "Z")
            });
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            running
                && args.get(1..4) == Some(&SERVE[..])
                && args
                    .windows(2)
                    .any(|pair| pair[0] == b"--state-dir" && pair[1] == dir.as_os_str().as_encoded_bytes())
        })
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect()
}

/// A local provider on `up`'s data directory started by hand, with no `mcm up` above it: what an `mcm up` of a
/// version whose provider did not die with it left behind after a `kill -9`.
fn stale_provider(up: &Up) -> Background {
    let kubeconfig = std::fs::read_to_string(up.dir.join("kubeconfig")).expect("the kubeconfig");
    let url = kubeconfig
        .lines()
        .find_map(|line| line.trim().strip_prefix("server: "))
        .expect("a server URL")
        .trim_matches('"')
        .to_owned();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
    command
        .args(["provider", "local", "serve", "--state-dir"])
        .arg(&up.dir)
        .args(["--api-server", &url, "--ca-file"])
        .arg(up.dir.join("apiserver/ca.crt"))
        .env(
            "MC_ENDPOINT",
            format!("unix://{}", up.dir.join("provider/provider.sock").display()),
        );
    let provider = Background::spawn(command, "a stale mcm provider local serve".into());
    provider.wait_for_stdout("the stale provider to serve", |out| out.contains("serving on"));
    provider
}

/// The log lines of `stderr` that say `message` about `machine`.
fn logged(stderr: &str, message: &str, machine: &str) -> bool {
    stderr
        .lines()
        .any(|line| line.contains(message) && line.contains(&format!("machine={machine}")))
}

#[test]
#[allow(clippy::too_many_lines)] // one story, told in order: run, crash, take over, delete, crash, purge
fn a_killed_mcm_up_takes_its_provider_along_and_down_purge_leaves_no_process() {
    let mut up = Up::start("crash", &[]);
    up.apply_one_machine(
        "crash",
        r#"#!/bin/sh
exec mcm node-agent --node-name "<<MACHINE_NAME>>" --bootstrap-token "<<BOOTSTRAP_TOKEN>>""#,
    );
    up.wait_running("the machine Running with a Ready node", 1);
    let pgid = up.pgid("crash-machine");
    let providers = provider_pids(&up.dir);
    assert_eq!(providers.len(), 1, "one provider serves {}", up.dir.display());

    // At the default level, one line per machine created and joined, with the machine and node as fields; no ANSI
    // colour codes in a log that goes to a pipe or a file.
    let process = up.process.take().expect("mcm up runs");
    poll("the machine's created and joined lines", SLOW, || {
        let stderr = process.stderr();
        (logged(&stderr, "machine created", "crash-machine")
            && logged(&stderr, "machine joined", "crash-machine")
            && stderr.contains("node=crash-machine"))
        .then_some(())
    });
    let provider_log = std::fs::read_to_string(up.dir.join("logs/provider.log")).expect("the provider log");
    for (what, text) in [("mcm up", process.stderr()), ("provider.log", provider_log)] {
        assert!(!text.is_empty(), "{what} logged nothing");
        assert!(!text.contains("\x1b["), "ANSI codes in {what}:\n{text}");
    }

    // kill -9: the provider child goes with it; the machine keeps running.
    let killed = process.stop();
    assert!(!killed.status.success());
    poll(
        "the provider gone after mcm up was killed",
        PROCESS_DEADLINE,
        || provider_pids(&up.dir).is_empty().then_some(()),
    );
    assert!(group_alive(pgid), "the machine outlives a killed mcm up");

    // A provider left running (as older versions did) is stopped, logged, and replaced by the next mcm up.
    let stale = stale_provider(&up);
    let stale_pids = provider_pids(&up.dir);
    assert_eq!(stale_pids.len(), 1);
    up.spawn(&[]);
    let stale_out = stale.finish(PROCESS_DEADLINE);
    assert!(
        stale_out.status.success(),
        "the stale provider stops cleanly: {stale_out:?}"
    );
    let process = up.process.as_ref().expect("mcm up runs");
    assert!(
        process
            .stderr()
            .lines()
            .any(|line| line.contains("stopping a local provider left running")
                && line.contains(&format!("pid={}", stale_pids[0]))),
        "the take-over is logged:\n{}",
        process.stderr()
    );
    let now = provider_pids(&up.dir);
    assert!(
        now.len() == 1 && now != stale_pids,
        "mcm up serves with a provider of its own: {now:?}"
    );
    poll("the same machine Running after the restart", SLOW, || {
        (all_running(&up, 1) && ready_nodes(&up) == 1 && group_alive(pgid)).then_some(())
    });

    // Deleting the machine: one line at the default level, and its processes go.
    up.kubectl_ok(&["delete", "machine", "crash-machine", "--wait=false"]);
    poll("the machine's deleted line", SLOW, || {
        logged(&up.process.as_ref()?.stderr(), "machine deleted", "crash-machine").then_some(())
    });
    poll("no machine process left", SLOW, || {
        (!group_alive(pgid)).then_some(())
    });

    // Killed again with a stale provider left behind: `mcm down --purge` stops it and leaves no process.
    let _ = up.process.take().expect("mcm up runs").stop();
    poll(
        "the provider gone after mcm up was killed",
        PROCESS_DEADLINE,
        || provider_pids(&up.dir).is_empty().then_some(()),
    );
    let stale = stale_provider(&up);
    let down = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(["down", "--purge", "--data-dir"])
        .arg(&up.dir)
        .output()
        .expect("mcm down runs");
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
    assert!(
        String::from_utf8_lossy(&down.stdout).contains("stopped the local provider"),
        "{}",
        String::from_utf8_lossy(&down.stdout)
    );
    let _ = stale.finish(PROCESS_DEADLINE);
    assert!(provider_pids(&up.dir).is_empty(), "no provider left");
    assert!(!up.dir.exists(), "--purge removes the data directory");
}

#[test]
fn kubectl_delete_node_replaces_its_machine_and_the_node_goes() {
    let mut up = Up::start("node-deletion", &[]);
    up.apply_examples(&["00-secret.yaml", "01-machine-class.yaml", "20-machine-set.yaml"]);
    up.wait_running("two Running machines with Ready nodes", 2);
    let (victim, _) = up.phases().remove(0);
    let node = up.node_of(&victim);
    let pgid = up.pgid(&victim);

    up.kubectl_ok(&["delete", "node", &node, "--wait=false"]);
    poll("the machine replaced", SLOW, || {
        let phases = up.phases();
        (phases.len() == 2 && phases.iter().all(|(n, p)| *n != victim && p == "Running")).then_some(())
    });
    poll("the node gone", SLOW, || {
        let output = up.kubectl(&["get", "node", &node]);
        (!output.status.success() && String::from_utf8_lossy(&output.stderr).contains("NotFound"))
            .then_some(())
    });
    poll("the machine's processes gone", SLOW, || {
        (!group_alive(pgid)).then_some(())
    });
    let reasons = up.kubectl_ok(&[
        "get",
        "events",
        "-o",
        r#"jsonpath={range .items[*]}{.involvedObject.name}={.reason}{"\n"}{end}"#,
    ]);
    assert!(
        reasons
            .lines()
            .any(|l| l == format!("{victim}=TriggeredByNodeDeletion")),
        "a TriggeredByNodeDeletion Event on the machine: {reasons}"
    );
    up.down(true);
}

/// Preservation with kubectl (docs/preservation.md): `kubectl annotate node X node.machine.sapcloud.io/preserve=now`
/// gives the machine a `preserveExpiryTime` (`--machine-preserve-timeout` from now) and the node the
/// cluster-autoscaler annotation and `Preserved=True`; removing the annotation undoes it.
#[test]
fn kubectl_annotate_node_preserve_now_preserves_its_machine_until_removed() {
    let mut up = Up::start("preserve", &["--machine-preserve-timeout", "1h"]);
    up.apply_examples(&["00-secret.yaml", "01-machine-class.yaml", "10-machine.yaml"]);
    up.wait_running("a Running machine with a Ready node", 1);
    let node = up.node_of("single-machine");
    let node_ref = format!("node/{node}");
    let expiry_path = "{.status.currentStatus.preserveExpiryTime}";
    up.kubectl_ok(&["annotate", &node_ref, "node.machine.sapcloud.io/preserve=now"]);
    let expiry = poll("the machine preserved", SLOW, || {
        let expiry = up.jsonpath(&["machine", "single-machine"], expiry_path);
        (!expiry.is_empty()).then_some(expiry)
    });
    let expiry: jiff::Timestamp = expiry.trim().parse().expect("an RFC 3339 time");
    let ahead = expiry.duration_since(jiff::Timestamp::now()).as_secs();
    assert!((3500..=3600).contains(&ahead), "about 1h ahead: {ahead}s");
    let preserved = r#"{.status.conditions[?(@.type=="Preserved")].status}/{.metadata.annotations.cluster-autoscaler\.kubernetes\.io/scale-down-disabled}"#;
    poll("the node marked preserved", SLOW, || {
        (up.jsonpath(&[&node_ref], preserved) == "True/true").then_some(())
    });

    up.kubectl_ok(&["annotate", &node_ref, "node.machine.sapcloud.io/preserve-"]);
    poll("the preservation stopped", SLOW, || {
        let expiry = up.jsonpath(&["machine", "single-machine"], expiry_path);
        (expiry.is_empty() && up.jsonpath(&[&node_ref], preserved) == "False/").then_some(())
    });
    up.down(true);
}

/// An in-place update with kubectl (docs/in-place-update.md): a MachineDeployment of strategy InPlaceUpdate rolled
/// from local-small to local-medium keeps its machines, their provider IDs and their processes; each node agent
/// applies the new class (the node's cpu and memory become local-medium's), and `updatedReplicas` counts the
/// machines updated in place.
#[test]
fn kubectl_patch_class_of_an_in_place_deployment_updates_the_machines_where_they_run() {
    let mut up = Up::start("in-place", &[]);
    up.apply_examples(&[
        "00-secret.yaml",
        "01-machine-class.yaml",
        "02-machine-class-medium.yaml",
    ]);
    let manifest = up.dir.join("in-place.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: machine.sapcloud.io/v1alpha1
kind: MachineDeployment
metadata: { name: in-place, namespace: default }
spec:
  replicas: 2
  selector: { matchLabels: { name: in-place } }
  strategy:
    type: InPlaceUpdate
    inPlaceUpdate: { orchestrationType: Auto, maxSurge: 0, maxUnavailable: 1 }
  template:
    metadata: { labels: { name: in-place } }
    spec:
      class: { kind: MachineClass, name: local-small }
",
    )
    .expect("the manifest");
    up.kubectl_ok(&["apply", "-f", arg(&manifest)]);
    up.wait_running("two Running machines with Ready nodes", 2);
    let provider_ids = r#"{range .items[*]}{.metadata.name}={.spec.providerID}{"\n"}{end}"#;
    let before = up.jsonpath(&["machines"], provider_ids);
    let machines: Vec<String> = up.phases().into_iter().map(|(name, _)| name).collect();
    let groups: Vec<i32> = machines.iter().map(|m| up.pgid(m)).collect();
    let cpus = r#"{range .items[*]}{.status.capacity.cpu}/{.status.capacity.memory}/{.metadata.labels.node\.kubernetes\.io/instance-type}{"\n"}{end}"#;
    assert_eq!(up.jsonpath(&["nodes"], cpus), "2/4Gi/\n2/4Gi/\n");

    up.kubectl_ok(&[
        "patch",
        "machinedeployment",
        "in-place",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"template":{"spec":{"class":{"name":"local-medium"}}}}}"#,
    ]);
    poll("every machine updated in place", SLOW, || {
        let updated = up.jsonpath(
            &["machinedeployment", "in-place"],
            "{.status.updatedReplicas}/{.status.availableReplicas}",
        );
        (updated == "2/2" && up.jsonpath(&["nodes"], cpus) == "4/8Gi/medium\n4/8Gi/medium\n").then_some(())
    });
    up.wait_running("both machines Running again", 2);
    assert_eq!(
        up.jsonpath(&["machines"], provider_ids),
        before,
        "the same machines, with the same provider IDs"
    );
    for (machine, pgid) in machines.iter().zip(&groups) {
        assert_eq!(up.pgid(machine), *pgid, "{machine} keeps its process");
        assert!(group_alive(*pgid), "{machine}'s process still runs");
    }
    let marks = r#"{range .items[*]}{.metadata.labels.node\.machine\.sapcloud\.io/candidate-for-update}{.metadata.annotations.node\.machine\.sapcloud\.io/in-place-update-target}{.spec.unschedulable}{"\n"}{end}"#;
    poll("the nodes cleaned and schedulable", SLOW, || {
        let marks = up.jsonpath(&["nodes"], marks);
        marks.lines().all(|l| l.is_empty() || l == "false").then_some(())
    });
    up.down(true);
}
