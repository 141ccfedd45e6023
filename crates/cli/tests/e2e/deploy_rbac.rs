//! The RBAC of `deploy/` is exactly what `mcm run` needs, and it splits between the control and the target cluster
//! as the seed layout splits it. The embedded API server (`mcm apiserver --token-auth-file`) authenticates the
//! controllers with two identities, one per cluster: the Deployment's service account
//! (`system:serviceaccount:<namespace>:<name>`) on the control cluster, and the seed layout's target identity
//! (`system:serviceaccount:kube-system:machine-controller-manager`) on the target cluster, the same server (both in
//! `system:masters` so that nothing is refused while the requests are recorded); the provider runs out of process
//! as the Deployment runs it, with its own identity (its simulated kubelets write nodes, pods and volume attachments,
//! which are not the controller's requests); the controllers run with the Deployment's arguments. The test drives a
//! whole lifecycle through kubectl as the admin: a MachineDeployment scales up to Running and rolls to another class
//! (with a virtual capacity, and no revision history: the old set is deleted), the unfreeze annotation is acted on,
//! a machine whose node runs two pods (one with a volume) is deleted and drained, a machine of an old
//! provider-specific class kind is migrated, the deployment scales down, a machine is force-deleted while the
//! provider is away (its node's volume attachment is deleted), and everything is deleted. Then the requests the API
//! server counted for each identity are evaluated against that identity's rules (`overlays/seed-aws` for the
//! control identity, `overlays/seed-aws/target-cluster` for the target one: together the base's rules, which
//! `deploy_layouts.rs` checks) as RBAC evaluates them (API groups, resources and subresources, verbs,
//! resourceNames, a Role's namespace against cluster-wide grants): the test fails listing every request no rule of
//! its identity allows ("missing") and every (API group, resource, verb) a rule grants that no request of its
//! identity used ("unused"), except the few listed in [`NOT_EXERCISED`] with the code path that needs them. The
//! table of every rule with its request count is printed (`--nocapture`).

use crate::support;
use crate::support::deploy;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use deploy::{CONTROLLER, Manifests, PROVIDER, Permission, Rbac, Request, SEED_TARGET};
use mcm_api::builders::PodBuilder;
use support::{Background, Server, address_of, arg, get};

/// The seed layout's kustomization: its rules are the control identity's.
const SEED: &str = "overlays/seed-aws";
/// The service account of the target identity, in `kube-system` (`overlays/seed-aws/target-cluster`).
const TARGET_ACCOUNT: &str = "machine-controller-manager";
/// The provider's user (its simulated kubelets write the target cluster); not the controllers'.
const PROVIDER_USER: &str = "mcm-provider-sim";
/// How long one step of the lifecycle (a rollout, a drain) may take.
const STEP_DEADLINE: Duration = Duration::from_mins(2);
/// Where the test's pods run: another namespace than the controllers', as a drain meets them.
const APPS: &str = "apps";

/// Rules of `deploy/` that the lifecycle of this test does not reach, as (verb, resource, why the code
/// needs it). Everything else granted must be used, and an entry here that the run did use fails the test too (the
/// list stays true).
const NOT_EXERCISED: &[(&str, &str, &str)] = &[
    (
        "update",
        "secrets",
        "a bootstrap token Secret whose name is taken (409 on create) is replaced (crates/controllers/src/machine/provision.rs \
         boot_secret); names are random",
    ),
    (
        "get",
        "awsmachineclasses",
        "class migration of the reference's provider-specific kinds; the sim provider converts only SimMachineClass",
    ),
    ("patch", "awsmachineclasses", "as above"),
    ("get", "azuremachineclasses", "as above"),
    ("patch", "azuremachineclasses", "as above"),
    ("get", "gcpmachineclasses", "as above"),
    ("patch", "gcpmachineclasses", "as above"),
    ("get", "openstackmachineclasses", "as above"),
    ("patch", "openstackmachineclasses", "as above"),
    ("get", "alicloudmachineclasses", "as above"),
    ("patch", "alicloudmachineclasses", "as above"),
    ("get", "packetmachineclasses", "as above"),
    ("patch", "packetmachineclasses", "as above"),
];

/// An example manifest with its namespace (`default`) replaced by the Deployment's.
fn example_in(server: &Server, file: &str, namespace: &str) -> PathBuf {
    let path = mcm_testkit::example("local", file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    server.write(
        file,
        &text.replace("namespace: default", &format!("namespace: {namespace}")),
    )
}

/// kubectl as the admin, in `namespace` unless the args name another.
struct Kubectl<'a> {
    server: &'a Server,
    namespace: &'a str,
}

impl Kubectl<'_> {
    fn ok(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.namespace];
        all.extend_from_slice(args);
        self.server.kubectl_ok(&all)
    }

    /// Writes `text` (an object that names its namespace) into the test's directory as `name` and applies it.
    fn apply(&self, name: &str, text: &str) {
        let path = self.server.write(name, text);
        self.server.kubectl_ok(&["apply", "-f", arg(&path)]);
    }

    /// Waits for `probe`; after the deadline fails with `what` and the state of the cluster.
    fn wait<T>(&self, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
        let end = Instant::now() + STEP_DEADLINE;
        loop {
            if let Some(value) = probe() {
                return value;
            }
            assert!(
                Instant::now() < end,
                "timed out after {STEP_DEADLINE:?} waiting for {what}\n{}",
                self.state()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What a failed wait shows: machines, sets, nodes, pods and volume attachments.
    fn state(&self) -> String {
        let get = |args: &[&str]| {
            let output = self.server.kubectl(args);
            format!(
                "$ kubectl {}\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )
        };
        [
            get(&["-n", self.namespace, "get", "machines,machinesets,machinedeployments", "-o", "wide"]),
            get(&["-n", self.namespace, "get", "machines", "-o", "jsonpath={range .items[*]}{.metadata.name}: {.status.lastOperation.description}{\"\\n\"}{end}"]),
            get(&["get", "nodes,volumeattachments"]),
            get(&["get", "pods", "-A", "-o", "wide"]),
        ]
        .join("\n")
    }

    /// `name class phase node` of every machine.
    fn machines(&self) -> Vec<(String, String, String, String)> {
        self.ok(&[
            "get",
            "machines",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.class.name} {.status.currentStatus.phase} \
             {.metadata.labels.node}{\"\\n\"}{end}",
        ])
        .lines()
        .map(|line| {
            let mut fields = line.split(' ').map(str::to_owned);
            let mut next = || fields.next().unwrap_or_default();
            (next(), next(), next(), next())
        })
        .collect()
    }

    /// Waits until the machines are `count` Running machines of `class`; their names and nodes.
    fn wait_running(&self, count: usize, class: &str) -> Vec<(String, String)> {
        self.wait(&format!("{count} Running machines of {class}"), || {
            let machines = self.machines();
            (machines.len() == count
                && machines
                    .iter()
                    .all(|(_, c, phase, node)| c == class && phase == "Running" && !node.is_empty()))
            .then(|| {
                machines
                    .into_iter()
                    .map(|(name, _, _, node)| (name, node))
                    .collect()
            })
        })
    }

    /// Waits until `kubectl get <args> -o name` prints nothing.
    fn wait_empty(&self, what: &str, args: &[&str]) {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "name"]);
        self.wait(what, || self.ok(&all).trim().is_empty().then_some(()));
    }

    fn jsonpath(&self, kind: &str, name: &str, path: &str) -> String {
        self.ok(&[
            "get",
            kind,
            name,
            "--ignore-not-found",
            "-o",
            &format!("jsonpath={path}"),
        ])
    }

    /// Whether the node `node` runs pods `phases` (in [`APPS`]) and has a sim volume attached.
    fn pods_running_with_volume(&self, node: &str, pods: usize) -> bool {
        let phases = self.ok(&[
            "-n",
            APPS,
            "get",
            "pods",
            "-o",
            "jsonpath={.items[*].status.phase}",
        ]);
        let attached = self.ok(&[
            "get",
            "volumeattachments",
            "-o",
            "jsonpath={range .items[*]}{.spec.nodeName} {.status.attached}{\"\\n\"}{end}",
        ]);
        let volumes = self.jsonpath("node", node, "{.status.volumesAttached[*].name}");
        phases.split(' ').filter(|p| *p == "Running").count() == pods
            && attached.lines().any(|l| l == format!("{node} true"))
            && !volumes.is_empty()
    }
}

/// The provider as the Deployment's sidecar runs it: its args and `MC_` variables, the socket moved into the test's
/// directory, and a kubeconfig of its own for its simulated kubelets.
struct Provider<'a> {
    manifests: &'a Manifests,
    endpoint: String,
    kubeconfig: PathBuf,
    process: Option<Background>,
    /// What the stopped processes logged.
    logs: String,
}

impl Provider<'_> {
    fn start(&mut self) {
        let container = self.manifests.container(PROVIDER);
        let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
        command
            .args(container.args.unwrap_or_default())
            .arg("--target-kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--sim-heartbeat-interval", "1s"]);
        for variable in container.env.unwrap_or_default() {
            let value = if variable.name == "MC_ENDPOINT" {
                self.endpoint.clone()
            } else {
                variable.value.unwrap_or_default()
            };
            command.env(variable.name, value);
        }
        let provider = Background::spawn(command, "the provider sidecar".into());
        provider.wait_for_stdout("the provider to serve", |out| out.contains("serving on"));
        self.process = Some(provider);
    }

    /// Stops it with SIGTERM; it must exit cleanly.
    fn stop(&mut self) {
        let output = self
            .process
            .take()
            .expect("the provider runs")
            .terminate(STEP_DEADLINE);
        self.logs.push_str(&String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "the provider stopped cleanly");
    }

    fn stderr(&self) -> String {
        let running = self.process.as_ref().map(Background::stderr).unwrap_or_default();
        format!("{}{running}", self.logs)
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The kubeconfigs `mcm run` gets: one cluster (the embedded server), two identities.
struct Clusters {
    /// The Deployment's service account: the control cluster.
    control: PathBuf,
    /// The seed layout's identity on the target cluster (`overlays/seed-aws/target-cluster`).
    target: PathBuf,
}

/// `mcm run` with the Deployment's args, except what a pod has and a test has not: the kubeconfigs of the two
/// identities instead of the in-cluster configuration, the provider socket and a free loopback port; and shorter
/// periods so that the lifecycle reaches the safety loops and the volume waits within the test.
fn start_controllers(manifests: &Manifests, clusters: &Clusters, endpoint: &str) -> Background {
    let replaced = [
        "--provider-endpoint",
        "--port",
        "--address",
        "--control-kubeconfig",
        "--target-kubeconfig",
    ];
    let args: Vec<String> = manifests
        .container(CONTROLLER)
        .args
        .unwrap_or_default()
        .into_iter()
        .filter(|a| !replaced.contains(&a.split('=').next().unwrap_or_default()))
        .collect();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
    command
        .args(&args)
        .arg("--control-kubeconfig")
        .arg(&clusters.control)
        .arg("--target-kubeconfig")
        .arg(&clusters.target)
        .args([
            "--provider-endpoint",
            endpoint,
            "--port",
            "0",
            "--address",
            "127.0.0.1",
        ])
        .args([
            "--machine-safety-overshooting-period=1s",
            "--machine-safety-orphan-vms-period=2s",
            "--machine-evict-retry-interval=1s",
            "--machine-pv-reattach-timeout=2s",
        ])
        .env_remove("NODE_NAME");
    Background::spawn(command, "mcm run".into())
}

#[test]
#[allow(clippy::too_many_lines)] // one lifecycle, step after step
fn mcm_run_needs_exactly_the_rules_of_deploy_rbac_yaml() {
    let started = Instant::now();
    let manifests = Manifests::load();
    let user = manifests.service_account_user();
    let (namespace, _) = manifests.service_account();
    // Each identity with its rules: the seed layout's split of the base's (deploy_layouts.rs checks that the two
    // together are exactly the base's rules).
    let control_rules = Manifests::render(SEED).rbac();
    let target_rules =
        Rbac::for_service_account(&Manifests::render(SEED_TARGET), "kube-system", TARGET_ACCOUNT);
    let target_user = format!("system:serviceaccount:kube-system:{TARGET_ACCOUNT}");
    let pid = std::process::id();
    let (mcm_token, provider_token) = (format!("mcm-{pid}-token"), format!("provider-{pid}-token"));
    let target_token = format!("target-{pid}-token");

    let server = Server::start_with("deploy-rbac", |dir| {
        let file = dir.join("tokens.csv");
        std::fs::write(
            &file,
            format!(
                "{mcm_token},{user},uid-mcm,system:masters\n{target_token},{target_user},uid-target,system:masters\n\
                 {provider_token},{PROVIDER_USER},uid-provider,system:masters\n"
            ),
        )
        .expect("the token file");
        vec!["--token-auth-file".into(), file.display().to_string()]
    });
    let clusters = Clusters {
        control: server.kubeconfig_with_token("mcm.kubeconfig", &mcm_token),
        target: server.kubeconfig_with_token("target.kubeconfig", &target_token),
    };
    let provider_kubeconfig = server.kubeconfig_with_token("provider.kubeconfig", &provider_token);
    let k = Kubectl {
        server: &server,
        namespace: &namespace,
    };
    // The namespace of base/rbac.yaml (the embedded server serves the machine kinds as if deploy/crds.yaml were applied:
    // it has no CustomResourceDefinition API; deploy_manifests.rs checks crds.yaml is `mcm crds`).
    let namespace_doc = manifests
        .of_kind("Namespace")
        .find(|n| n.name() == namespace)
        .expect("base/rbac.yaml creates the namespace");
    let apps = serde_json::json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": APPS } });
    for (file, document) in [("namespace.json", &namespace_doc.value), ("apps.json", &apps)] {
        server.kubectl_ok(&["apply", "-f", arg(&server.write(file, &document.to_string()))]);
    }

    let socket = server.dir.join("provider.sock");
    let endpoint = format!("unix://{}", socket.display());
    let mut provider = Provider {
        manifests: &manifests,
        endpoint: endpoint.clone(),
        kubeconfig: provider_kubeconfig,
        process: None,
        logs: String::new(),
    };
    provider.start();
    let run = start_controllers(&manifests, &clusters, &endpoint);
    let address = address_of(&run);
    // The probes of the Deployment answer on the binary's port.
    k.wait("/readyz 200", || (get(address, "/readyz").0 == 200).then_some(()));
    assert_eq!(get(address, "/healthz").0, 200);

    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lifecycle(&k, &server, &namespace, &mut provider);
    }));
    if let Err(panic) = outcome {
        // The whole logs outlive the test's directory, for the diagnosis.
        let logs = std::env::temp_dir().join(format!("mcm-deploy-rbac-{pid}"));
        let _ = std::fs::create_dir_all(&logs);
        let _ = std::fs::write(logs.join("mcm-run.log"), run.stderr());
        let _ = std::fs::write(logs.join("provider.log"), provider.stderr());
        eprintln!(
            "mcm run, last lines:\n{}\n\nthe provider, last lines:\n{}\n\nwhole logs in {}",
            tail(&run.stderr(), 40),
            tail(&provider.stderr(), 20),
            logs.display()
        );
        std::panic::resume_unwind(panic);
    }
    let took = started.elapsed();

    // A clean stop (leader election releases its Leases on the way out).
    let output = run.terminate(STEP_DEADLINE);
    assert!(
        output.status.success(),
        "mcm run stopped cleanly: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    drop(provider);

    let counters: serde_json::Value =
        serde_json::from_str(&server.kubectl_ok(&["get", "--raw", "/debug/requests"]))
            .expect("JSON counters");
    let requests_of = |user: &str| -> Vec<(Request, u64)> {
        counters
            .as_array()
            .expect("a list")
            .iter()
            .filter(|c| c["user"] == user)
            .map(|c| {
                let text = |key: &str| c[key].as_str().unwrap_or_default().to_owned();
                (
                    Request::from_counter(
                        &text("verb"),
                        &text("resource"),
                        &text("namespace"),
                        &text("name"),
                    ),
                    c["count"].as_u64().unwrap_or_default(),
                )
            })
            .collect()
    };
    let (control_requests, target_requests) = (requests_of(&user), requests_of(&target_user));
    for (who, requests) in [(&user, &control_requests), (&target_user, &target_requests)] {
        assert!(
            !requests.is_empty(),
            "the controllers' requests are counted under {who}"
        );
    }
    assert!(
        counters
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["user"] == PROVIDER_USER),
        "the provider's kubelets wrote as their own user"
    );
    let report = Report::new(vec![
        (control_rules.permissions(), control_requests),
        (target_rules.permissions(), target_requests),
    ]);
    eprintln!(
        "lifecycle in {took:?}, {} requests of {user} (control) and {target_user} (target) in {} counters\n{}",
        report.requests,
        report.counters,
        report.table()
    );
    let problems = report.problems();
    assert!(
        problems.is_empty(),
        "the RBAC of deploy/ does not fit `mcm run`:\n{}",
        problems.join("\n")
    );
}

/// The lifecycle the controllers go through, driven as the admin.
#[allow(clippy::too_many_lines)] // one lifecycle, step after step
fn lifecycle(k: &Kubectl, server: &Server, namespace: &str, provider: &mut Provider) {
    // Scale up to Running.
    for file in [
        "00-secret.yaml",
        "01-machine-class.yaml",
        "02-machine-class-medium.yaml",
    ] {
        k.ok(&["apply", "-f", arg(&example_in(server, file, namespace))]);
    }
    // A virtual capacity on the class rolled to: the node sync writes node status.
    k.ok(&[
        "patch",
        "machineclass",
        "local-medium",
        "--type=merge",
        "-p",
        r#"{"nodeTemplate":{"virtualCapacity":{"example.com/accelerator":"1"}}}"#,
    ]);
    k.ok(&[
        "apply",
        "-f",
        arg(&example_in(server, "30-machine-deployment.yaml", namespace)),
    ]);
    k.wait_running(3, "local-small");

    // Roll to the other class, keeping no history: the old set is deleted once the rollout completes.
    k.ok(&[
        "patch",
        "machinedeployment",
        "workers",
        "--type=merge",
        "-p",
        r#"{"spec":{"revisionHistoryLimit":0}}"#,
    ]);
    k.ok(&[
        "patch",
        "machinedeployment",
        "workers",
        "--type=merge",
        "-p",
        r#"{"spec":{"template":{"spec":{"class":{"name":"local-medium"}}}}}"#,
    ]);
    let machines = k.wait_running(3, "local-medium");
    k.wait("the old set deleted", || {
        (k.ok(&["get", "machinesets", "-o", "name"]).lines().count() == 1).then_some(())
    });

    // The safety's unfreeze annotation on the deployment and its new set: acted on and removed.
    let set = k
        .ok(&[
            "get",
            "machinesets",
            "-o",
            "jsonpath={range .items[?(@.spec.replicas==3)]}{.metadata.name}{end}",
        ])
        .trim()
        .to_owned();
    assert!(!set.is_empty(), "the new set");
    let unfreeze = "safety.machine.sapcloud.io/unfreeze";
    k.ok(&[
        "annotate",
        "machinedeployment",
        "workers",
        &format!("{unfreeze}=true"),
    ]);
    k.ok(&["annotate", "machineset", &set, &format!("{unfreeze}=true")]);
    k.wait("the unfreeze annotations removed", || {
        let annotations = k.ok(&[
            "get",
            "machinedeployments,machinesets",
            "-o",
            "jsonpath={.items[*].metadata.annotations}",
        ]);
        (!annotations.contains(unfreeze)).then_some(())
    });

    // A drain: a pod with a volume and one without on the node of a machine that is deleted; the volume pod is
    // evicted after the other, and its volume followed until it detached.
    let (drained, drained_node) = machines[0].clone();
    for (index, object) in volume_json("data").iter().enumerate() {
        k.apply(&format!("data-{index}.json"), object);
    }
    k.apply("db.json", &pod_json("db", &drained_node, Some("data"), 1));
    k.apply("web.json", &pod_json("web", &drained_node, None, 1));
    k.wait("the pods Running and the volume attached", || {
        k.pods_running_with_volume(&drained_node, 2).then_some(())
    });
    k.ok(&["delete", "machine", &drained, "--wait=false"]);
    k.wait_empty(
        "the drained machine gone",
        &["machine", &drained, "--ignore-not-found"],
    );
    k.wait_empty("the drained pods gone", &["pods", "-n", APPS]);
    k.wait_running(3, "local-medium");

    // A machine of an old provider-specific class kind: its class is migrated to a MachineClass.
    k.apply("legacy-class.json", &legacy_class_json(namespace));
    k.apply(
        "legacy-machine.json",
        &serde_json::json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": "Machine",
            "metadata": { "name": "legacy-machine", "namespace": namespace },
            "spec": { "class": { "kind": "SimMachineClass", "name": "legacy" } },
        })
        .to_string(),
    );
    k.wait("the legacy machine migrated", || {
        (k.jsonpath("machine", "legacy-machine", "{.spec.class.kind}") == "MachineClass").then_some(())
    });
    k.ok(&["delete", "machine", "legacy-machine", "--wait=false"]);
    k.wait_empty(
        "the legacy machine gone",
        &["machine", "legacy-machine", "--ignore-not-found"],
    );
    k.ok(&["delete", "machineclass", "legacy", "--wait=false"]);
    k.ok(&["delete", "simmachineclass", "legacy", "--wait=false"]);

    // Scale down.
    k.ok(&["scale", "machinedeployment", "workers", "--replicas=1"]);
    let machines = k.wait_running(1, "local-medium");

    // A force deletion while the provider is away. The node runs a pod with a volume and an hour of grace: the
    // drain evicts it and waits for it to go. The provider (whose simulated kubelet would detach the volume itself
    // once the pod is gone) stops, and the machine gets `force-deletion=true`: the pod is deleted at once, then the
    // node's volume attachments; the VM deletion waits for a provider. The new one has none of the old VMs
    // (NotFound, which a deletion takes as done).
    let (forced, forced_node) = machines[0].clone();
    for (index, object) in volume_json("batch-data").iter().enumerate() {
        k.apply(&format!("batch-data-{index}.json"), object);
    }
    k.apply(
        "batch.json",
        &pod_json("batch", &forced_node, Some("batch-data"), 3600),
    );
    k.wait("the batch pod Running and its volume attached", || {
        k.pods_running_with_volume(&forced_node, 1).then_some(())
    });
    k.ok(&["delete", "machine", &forced, "--wait=false"]);
    k.wait("the batch pod evicted (terminating)", || {
        let deleting = k.ok(&[
            "-n",
            APPS,
            "get",
            "pod",
            "batch",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ]);
        (!deleting.is_empty()).then_some(())
    });
    provider.stop();
    k.ok(&["label", "machine", &forced, "force-deletion=true"]);
    k.wait_empty(
        "the forced node's volume attachment deleted",
        &["volumeattachments"],
    );
    provider.start();
    k.wait_empty(
        "the forced machine gone",
        &["machine", &forced, "--ignore-not-found"],
    );
    k.wait_empty("the forced pod gone", &["pods", "-n", APPS]);
    k.wait_running(1, "local-medium");

    // Delete everything.
    k.ok(&["delete", "machinedeployment", "workers", "--wait=false"]);
    k.wait_empty("no machines left", &["machines"]);
    k.wait_empty("no machine sets left", &["machinesets"]);
    k.wait_empty("no machine deployments left", &["machinedeployments"]);
    k.wait_empty("no nodes left", &["nodes"]);
    k.ok(&["delete", "machineclasses", "--all", "--wait=false"]);
    k.ok(&["delete", "secret", "local-worker", "--wait=false"]);
    k.wait_empty("no machine classes left", &["machineclasses"]);
    k.wait_empty(
        "the secret gone",
        &["secret", "local-worker", "--ignore-not-found"],
    );
}

/// The rules of an identity and its requests with their counts.
type Identity = (Vec<Permission>, Vec<(Request, u64)>);

/// What the requests of each identity used of its rules.
struct Report {
    /// Each permission with the number of requests of its identity it allowed.
    used: Vec<(Permission, u64)>,
    /// Requests no rule of their identity allows.
    missing: Vec<(Request, u64)>,
    /// How many requests, in how many counters.
    requests: u64,
    counters: usize,
}

impl Report {
    /// From (the rules of an identity, its requests) for every identity.
    fn new(identities: Vec<Identity>) -> Self {
        let mut report = Self {
            used: Vec::new(),
            missing: Vec::new(),
            requests: 0,
            counters: 0,
        };
        for (permissions, requests) in identities {
            report.requests += requests.iter().map(|(_, n)| n).sum::<u64>();
            report.counters += requests.len();
            report.missing.extend(
                requests
                    .iter()
                    .filter(|(r, _)| !permissions.iter().any(|p| p.allows(r)))
                    .cloned(),
            );
            for permission in permissions {
                let count = requests
                    .iter()
                    .filter(|(r, _)| permission.allows(r))
                    .map(|(_, n)| n)
                    .sum();
                report.used.push((permission, count));
            }
        }
        report
    }

    fn exempt(permission: &Permission) -> Option<&'static str> {
        NOT_EXERCISED
            .iter()
            .find(|(verb, resource, _)| *verb == permission.verb && *resource == permission.resource)
            .map(|(_, _, why)| *why)
    }

    fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (request, count) in &self.missing {
            out.push(format!("missing: {request} ({count}x)"));
        }
        for (permission, count) in &self.used {
            match (count, Self::exempt(permission)) {
                (0, None) => out.push(format!("unused: {permission}")),
                (n, Some(_)) if *n > 0 => out.push(format!(
                    "used now, remove it from NOT_EXERCISED: {permission} ({n}x)"
                )),
                _ => {}
            }
        }
        for (verb, resource, _) in NOT_EXERCISED {
            if !self
                .used
                .iter()
                .any(|(p, _)| p.verb == *verb && p.resource == *resource)
            {
                out.push(format!(
                    "NOT_EXERCISED names {verb} {resource}, which deploy/ does not grant"
                ));
            }
        }
        out
    }

    /// Every permission with its request count (for the log and docs/deploy.md).
    fn table(&self) -> String {
        let mut lines: BTreeMap<String, u64> = BTreeMap::new();
        for (permission, count) in &self.used {
            let note = if Self::exempt(permission).is_some() {
                " (not exercised)"
            } else {
                ""
            };
            *lines.entry(format!("{permission}{note}")).or_default() += count;
        }
        lines
            .into_iter()
            .map(|(line, count)| format!("{count:>6}  {line}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A PersistentVolume `pv-<name>` of the sim provider's CSI driver and a claim `name` in [`APPS`] bound to it.
fn volume_json(name: &str) -> [String; 2] {
    [
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": { "name": format!("pv-{name}") },
            "spec": {
                "capacity": { "storage": "1Gi" },
                "accessModes": ["ReadWriteOnce"],
                "csi": { "driver": mcm_provider_sim::CSI_DRIVER, "volumeHandle": format!("vol-{name}") },
                "claimRef": { "namespace": APPS, "name": name },
            },
        }),
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": { "name": name, "namespace": APPS },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": { "requests": { "storage": "1Gi" } },
                "volumeName": format!("pv-{name}"),
            },
        }),
    ]
    .map(|object| object.to_string())
}

/// A pod in [`APPS`] labelled `app=<name>`, of one container, bound to `node`, with the claim when given.
fn pod_json(name: &str, node: &str, claim: Option<&str>, grace: i64) -> String {
    let pod = PodBuilder::new(name)
        .namespace(APPS)
        .label("app", name)
        .node(node)
        .grace_period(grace)
        .container("c", "busybox");
    let pod = match claim {
        Some(claim) => pod.claim(claim),
        None => pod,
    };
    serde_json::to_string(&pod.build()).expect("a pod serializes")
}

/// A `SimMachineClass` (the sim provider's old provider-specific kind) with the example's providerSpec and secret.
fn legacy_class_json(namespace: &str) -> String {
    serde_json::json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "SimMachineClass",
        "metadata": { "name": "legacy", "namespace": namespace },
        "spec": {
            "vmPool": "test-worker-pool",
            "size": "small",
            "tags": { "kubernetes.io/cluster/demo": "1", "kubernetes.io/role/node": "1" },
            "secretRef": { "name": "local-worker", "namespace": namespace },
        },
    })
    .to_string()
}
