//! End to end: the real `mcm node-agent` binary, as a machine of the local provider runs it, against an embedded API
//! server started in process (in memory, its own temporary directory and free port per test, so tests run in
//! parallel). The agent gets the provider's `MCM_LOCAL_*` environment and the example secret's flags; a bootstrap
//! token Secret is created as the machine controller creates it. Every wait polls with a deadline.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        certificates::v1::CertificateSigningRequest,
        coordination::v1::Lease,
        core::v1::{Node, NodeCondition, Secret},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use mcm_apiserver::{ApiServer, Config};
use mcm_core::userdata::{BootstrapToken, bootstrap_token_id_for_machine, bootstrap_token_secret};
use serde_json::json;

/// How long any wait may take: generous for a loaded 2-core machine; a passing test never waits this long.
const DEADLINE: Duration = Duration::from_secs(45);
/// How long the agent may take to exit after a signal.
const EXIT_DEADLINE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(100);
/// The secret part of every test token: distinctive, so that its absence from the agent's output means something.
const TOKEN_SECRET: &str = "q7w2e9r4t1y8u3i6";
/// The variables the local provider sets; cleared from the test's environment before each run.
const VARIABLES: [&str; 7] = [
    "MCM_LOCAL_API_SERVER",
    "MCM_LOCAL_CA_FILE",
    "MCM_LOCAL_MACHINE_DIR",
    "MCM_LOCAL_PROVIDER_ID",
    "MCM_LOCAL_CPU",
    "MCM_LOCAL_MEMORY",
    "MCM_LOCAL_NODE_NAME",
];

/// An embedded API server, an admin client, and a directory for machines and logs.
struct Cluster {
    server: ApiServer,
    dir: tempfile::TempDir,
    admin: Client,
}

impl Cluster {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = Config {
            in_memory: true,
            ..Config::new(dir.path().join("server"))
        };
        let server = ApiServer::start(config).await.expect("the API server starts");
        let file = Kubeconfig::read_from(server.kubeconfig()).expect("its kubeconfig");
        let mut config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
            .await
            .expect("a client configuration");
        config.default_retry = false;
        let admin = Client::try_from(config).expect("a client");
        Self { server, dir, admin }
    }

    /// The CA the server wrote into its data directory.
    fn ca_file(&self) -> PathBuf {
        self.dir.path().join("server/ca.crt")
    }

    /// A machine's directory (not created: the agent creates it).
    fn machine_dir(&self, machine: &str) -> PathBuf {
        self.dir.path().join("machines").join(machine)
    }

    /// The bootstrap token of a machine, as the machine controller makes it (Secret in kube-system, expiring in
    /// an hour); returns the token.
    async fn token(&self, machine: &str) -> String {
        let token = BootstrapToken::from_parts(&bootstrap_token_id_for_machine(machine), TOKEN_SECRET)
            .expect("a well-formed token");
        let expires = Timestamp::now() + Duration::from_hours(1);
        let secret = bootstrap_token_secret(&token, machine, expires, "");
        self.secrets()
            .create(&PostParams::default(), &secret)
            .await
            .expect("the bootstrap token Secret is created");
        token.expose()
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.admin.clone(), "kube-system")
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.admin.clone())
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.admin.clone(), "kube-node-lease")
    }

    fn csrs(&self) -> Api<CertificateSigningRequest> {
        Api::all(self.admin.clone())
    }

    /// `mcm node-agent` with the local provider's environment for `machine` and a 1 s heartbeat (no
    /// `--node-name` or `--bootstrap-token` yet).
    fn agent_command(&self, machine: &str) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
        command.args(["node-agent", "--heartbeat-interval", "1s"]);
        for variable in VARIABLES {
            command.env_remove(variable);
        }
        command
            .env("RUST_LOG", "debug")
            .env("MCM_LOCAL_API_SERVER", self.server.url())
            .env("MCM_LOCAL_CA_FILE", self.ca_file())
            .env("MCM_LOCAL_MACHINE_DIR", self.machine_dir(machine))
            .env("MCM_LOCAL_PROVIDER_ID", provider_id(machine))
            .env("MCM_LOCAL_CPU", "2")
            .env("MCM_LOCAL_MEMORY", "4Gi");
        command
    }

    /// Starts the agent as the example secret's userData does: `--node-name <machine> --bootstrap-token <token>`.
    fn boot(&self, machine: &str, token: &str, run: &str) -> Agent {
        let mut command = self.agent_command(machine);
        command.args(["--node-name", machine, "--bootstrap-token", token]);
        Agent::spawn(command, &self.dir.path().join(format!("{machine}-{run}")))
    }

    /// Waits until the node exists and `check` holds for it.
    async fn node_where(&self, agent: &Agent, what: &str, check: impl Fn(&Node) -> bool) -> Node {
        let nodes = self.nodes();
        let name = agent.node.clone();
        eventually(
            agent,
            what,
            || {
                let nodes = nodes.clone();
                let name = name.clone();
                async move { nodes.get_opt(&name).await.ok().flatten() }
            },
            check,
        )
        .await
    }

    async fn lease_renew_time(&self, name: &str) -> Option<Timestamp> {
        let lease = self.leases().get_opt(name).await.ok().flatten()?;
        lease.spec?.renew_time.map(|t| t.0)
    }
}

fn provider_id(machine: &str) -> String {
    format!("local:///default/{machine}")
}

/// A running agent, its output going to files; killed and reaped when dropped.
struct Agent {
    child: Child,
    node: String,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Agent {
    fn spawn(mut command: Command, logs: &Path) -> Self {
        let node = command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .skip_while(|a| a != "--node-name")
            .nth(1)
            .or_else(|| {
                command
                    .get_envs()
                    .find(|(k, _)| *k == "MCM_LOCAL_NODE_NAME")
                    .and_then(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()))
            })
            .unwrap_or_default();
        let stdout = logs.with_extension("out");
        let stderr = logs.with_extension("err");
        let file = |path: &Path| std::fs::File::create(path).expect("a log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(file(&stdout))
            .stderr(file(&stderr))
            .spawn()
            .expect("mcm node-agent starts");
        Self {
            child,
            node,
            stdout,
            stderr,
        }
    }

    /// Everything it printed so far (stdout, then stderr).
    fn output(&self) -> String {
        let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
        format!("{}{}", read(&self.stdout), read(&self.stderr))
    }

    fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args(["-s", signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -s {signal} failed");
    }

    /// Waits for it to exit; panics with its output after `deadline`.
    async fn exit_within(&mut self, deadline: Duration) -> ExitStatus {
        let end = Instant::now() + deadline;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < end,
                "the agent did not exit within {deadline:?}:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends `signal` and asserts a clean exit (0) within [`EXIT_DEADLINE`].
    async fn stop_with(&mut self, signal: &str) {
        let sent = Instant::now();
        self.signal(signal);
        let status = self.exit_within(EXIT_DEADLINE).await;
        assert_eq!(
            status.code(),
            Some(0),
            "exit after {signal} ({:?} after the signal):\n{}",
            sent.elapsed(),
            self.output()
        );
    }

    /// Asserts that nothing it printed holds the token, its secret part, a private key or a certificate.
    fn assert_no_secrets(&self, token: &str) {
        let output = self.output();
        for secret in [token, TOKEN_SECRET, "PRIVATE KEY", "BEGIN CERTIFICATE"] {
            assert!(
                !output.contains(secret),
                "the agent's output holds {secret:?}:\n{output}"
            );
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("output of the agent of {}:\n{}", self.node, self.output());
        }
    }
}

/// Polls `fetch` until it returns a value `check` accepts; panics with the agent's output after [`DEADLINE`].
async fn eventually<T, F, Fut>(agent: &Agent, what: &str, mut fetch: F, check: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = fetch().await.filter(|v| check(v)) {
            return value;
        }
        assert!(
            Instant::now() < end,
            "timed out after {DEADLINE:?} waiting for {what}; agent output:\n{}",
            agent.output()
        );
        tokio::time::sleep(POLL).await;
    }
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn status_of(node: &Node, type_: &str) -> Option<String> {
    condition(node, type_).map(|c| c.status.clone())
}

fn is_ready(node: &Node) -> bool {
    status_of(node, "Ready").as_deref() == Some("True")
}

fn ready_heartbeat(node: &Node) -> Option<Timestamp> {
    condition(node, "Ready")?
        .last_heartbeat_time
        .as_ref()
        .map(|t| t.0)
}

#[track_caller]
fn assert_private(path: &Path) {
    let mode = std::fs::metadata(path)
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "mode of {}", path.display());
}

/// Asserts what a registered Node of the agent carries: providerID, labels, capacity and allocatable, addresses,
/// nodeInfo, and kubelet's conditions with their times.
fn assert_registered(node: &Node, machine: &str) {
    let spec = node.spec.clone().expect("spec");
    assert_eq!(spec.provider_id.as_deref(), Some(provider_id(machine).as_str()));
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some(machine)
    );
    assert_eq!(labels.get("kubernetes.io/os").map(String::as_str), Some("linux"));
    assert!(labels.contains_key("kubernetes.io/arch"), "{labels:?}");
    let status = node.status.clone().expect("status");
    for resources in [status.capacity.clone(), status.allocatable.clone()] {
        let resources = resources.expect("capacity and allocatable");
        let get = |key: &str| resources.get(key).map(|q| q.0.as_str());
        assert_eq!(
            (get("cpu"), get("memory"), get("pods")),
            (Some("2"), Some("4Gi"), Some("110"))
        );
    }
    let addresses: Vec<(String, String)> = status
        .addresses
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(
        addresses,
        [
            ("InternalIP".to_owned(), "127.0.0.1".to_owned()),
            ("Hostname".to_owned(), machine.to_owned())
        ]
    );
    let info = status.node_info.clone().expect("nodeInfo");
    assert!(info.kubelet_version.starts_with("mcm-node-agent/"), "{info:?}");
    assert_eq!(info.operating_system, "linux");
    assert!(!info.architecture.is_empty());
    for (type_, want, reason) in [
        ("Ready", "True", "KubeletReady"),
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
    ] {
        let c = condition(node, type_).unwrap_or_else(|| panic!("no {type_} condition"));
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            (want, Some(reason)),
            "{c:?}"
        );
        assert!(
            c.last_heartbeat_time.is_some() && c.last_transition_time.is_some(),
            "{c:?}"
        );
    }
}

/// Asserts that the machine joined through one CSR its bootstrap token made (approved and issued at once), and
/// that the Node and its status were written by the node's own identity while the token only made the CSR.
async fn assert_joined_through_one_csr_and_wrote_as_the_node(cluster: &Cluster, machine: &str) {
    let node_user = format!("system:node:{machine}");
    // The certificate came from a CSR the bootstrap token made, approved and issued at once.
    let csrs = cluster
        .csrs()
        .list(&ListParams::default())
        .await
        .expect("list CSRs")
        .items;
    assert_eq!(csrs.len(), 1, "{csrs:?}");
    let csr = &csrs[0];
    let bootstrapper = format!("system:bootstrap:{}", bootstrap_token_id_for_machine(machine));
    assert_eq!(csr.spec.username.as_deref(), Some(bootstrapper.as_str()));
    assert_eq!(
        csr.spec.signer_name,
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    let csr_status = csr.status.clone().expect("a status");
    assert!(csr_status.certificate.is_some_and(|c| !c.0.is_empty()), "Issued");
    let approved = csr_status.conditions.unwrap_or_default();
    assert!(
        approved
            .iter()
            .any(|c| c.type_ == "Approved" && c.status == "True"),
        "{approved:?}"
    );

    // The Node, the Lease and the status were written by the node's own identity; the token only made the CSR.
    let requests = cluster.server.requests().snapshot();
    let count = |user: &str, verb: &str, resource: &str| {
        requests
            .iter()
            .filter(|(k, _)| k.user == user && k.verb == verb && k.resource == resource)
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    assert_eq!(count(node_user.as_str(), "create", "nodes"), 1, "{requests:#?}");
    assert!(
        count(node_user.as_str(), "patch", "nodes/status") >= 1,
        "{requests:#?}"
    );
    let leases = "leases.coordination.k8s.io";
    assert_eq!(count(node_user.as_str(), "create", leases), 1, "{requests:#?}");
    assert!(count(node_user.as_str(), "patch", leases) >= 1, "{requests:#?}");
    let node_creators: Vec<&str> = requests
        .keys()
        .filter(|k| k.verb == "create" && k.resource == "nodes")
        .map(|k| k.user.as_str())
        .collect();
    assert_eq!(node_creators, [node_user.as_str()]);
    let bootstrap_writes: Vec<(&str, &str)> = requests
        .keys()
        .filter(|k| k.user == bootstrapper && mcm_apiserver::requests::is_write(&k.verb))
        .map(|k| (k.verb.as_str(), k.resource.as_str()))
        .collect();
    assert_eq!(
        bootstrap_writes,
        [("create", "certificatesigningrequests.certificates.k8s.io")]
    );
}

/// The whole join: token → CSR (auto-approved for the bootstrap token) → the node's own certificate, with which it
/// creates its Node (labels, providerID, capacity, addresses, nodeInfo, kubelet's conditions), renews its Lease and
/// posts Ready heartbeats. SIGTERM ends it at once with exit 0, and the Node stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_joins_with_its_token_and_registers_its_ready_node_as_itself() {
    let cluster = Cluster::start().await;
    let token = cluster.token("machine-1").await;
    let mut agent = cluster.boot("machine-1", &token, "1");

    let node = cluster.node_where(&agent, "a Ready node", is_ready).await;
    assert_registered(&node, "machine-1");

    // The Lease is the node's, owned by the Node, and renewed every second.
    let leases = cluster.leases();
    let lease = eventually(
        &agent,
        "the node's Lease",
        || async { leases.get_opt("machine-1").await.ok().flatten() },
        |_| true,
    )
    .await;
    let lease_spec = lease.spec.clone().expect("spec");
    assert_eq!(lease_spec.holder_identity.as_deref(), Some("machine-1"));
    assert_eq!(lease_spec.lease_duration_seconds, Some(40));
    let owner = &lease.metadata.owner_references.clone().expect("an owner")[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", "machine-1"));
    assert_eq!(Some(&owner.uid), node.metadata.uid.as_ref());
    let first = lease_spec.renew_time.expect("renewTime").0;
    eventually(
        &agent,
        "the Lease to be renewed",
        || cluster.lease_renew_time("machine-1"),
        |t| *t > first,
    )
    .await;
    // The Ready heartbeat of the status moves too (at least every 4 heartbeats).
    let heartbeat = ready_heartbeat(&node).expect("a Ready heartbeat");
    cluster
        .node_where(&agent, "a later Ready heartbeat", |n| {
            ready_heartbeat(n).is_some_and(|t| t > heartbeat)
        })
        .await;

    assert_joined_through_one_csr_and_wrote_as_the_node(&cluster, "machine-1").await;

    // Key and certificate are kept, private, for a restart.
    let pki = cluster.machine_dir("machine-1").join("pki");
    assert_private(&pki.join("client.pem"));
    assert_private(&pki.join("ca.crt"));

    agent.stop_with("TERM").await;
    assert!(
        cluster.nodes().get_opt("machine-1").await.unwrap().is_some(),
        "the Node stays"
    );
    agent.assert_no_secrets(&token);
}

/// `conditions/<Type>` files set node conditions (added ones and built-in ones), their removal clears them;
/// files that are not conditions are ignored with a warning; conditions others posted are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn condition_files_set_and_clear_node_conditions() {
    let cluster = Cluster::start().await;
    let token = cluster.token("machine-2").await;
    let mut agent = cluster.boot("machine-2", &token, "1");
    cluster.node_where(&agent, "a Ready node", is_ready).await;

    // Someone else (a node problem detector) posts a condition of its own.
    let foreign = json!({ "status": { "conditions": [{
        "type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated", "message": "routes are set",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z",
    }] } });
    cluster
        .nodes()
        .patch_status("machine-2", &PatchParams::default(), &Patch::Strategic(&foreign))
        .await
        .expect("the admin posts a condition");

    let conditions = cluster.machine_dir("machine-2").join("conditions");
    let deadlock = conditions.join("KernelDeadlock");
    std::fs::write(&deadlock, "True\n").expect("write a condition file");
    std::fs::write(conditions.join("Ready"), "False").expect("write a condition file");
    std::fs::write(conditions.join("Flaky"), "maybe").expect("write a condition file");
    let node = cluster
        .node_where(&agent, "KernelDeadlock True and Ready False", |n| {
            status_of(n, "KernelDeadlock").as_deref() == Some("True")
                && status_of(n, "Ready").as_deref() == Some("False")
        })
        .await;
    let set = condition(&node, "KernelDeadlock").expect("KernelDeadlock");
    assert_eq!(set.reason.as_deref(), Some("NodeAgentFile"));
    assert!(
        set.message
            .as_deref()
            .is_some_and(|m| m.contains(&*deadlock.to_string_lossy())),
        "the message names the file: {set:?}"
    );
    assert_eq!(
        condition(&node, "Ready").unwrap().reason.as_deref(),
        Some("NodeAgentFile")
    );
    assert_eq!(status_of(&node, "Flaky"), None, "not a condition status");
    assert!(
        agent.output().contains("Flaky"),
        "a warning names the ignored file:\n{}",
        agent.output()
    );
    assert_eq!(
        status_of(&node, "NetworkUnavailable").as_deref(),
        Some("False"),
        "kept"
    );

    std::fs::remove_file(&deadlock).expect("remove");
    std::fs::remove_file(conditions.join("Ready")).expect("remove");
    let node = cluster
        .node_where(&agent, "KernelDeadlock gone and Ready True again", |n| {
            condition(n, "KernelDeadlock").is_none() && is_ready(n)
        })
        .await;
    assert_eq!(
        condition(&node, "Ready").unwrap().reason.as_deref(),
        Some("KubeletReady")
    );
    let heartbeat = ready_heartbeat(&node).unwrap();
    let node = cluster
        .node_where(&agent, "a later status write", |n| {
            ready_heartbeat(n).is_some_and(|t| t > heartbeat)
        })
        .await;
    assert_eq!(
        status_of(&node, "NetworkUnavailable").as_deref(),
        Some("False"),
        "still kept"
    );

    agent.stop_with("TERM").await;
    agent.assert_no_secrets(&token);
}

/// A restarted agent reuses its saved certificate: the token Secret is gone (as after the machine joined), yet the
/// agent (started by the same userData, with the now refused token) adopts its Node and heartbeats, and makes no
/// new CSR. SIGINT stops it cleanly too. Without the token, the node name from MCM_LOCAL_NODE_NAME, it works as
/// well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_reuses_its_certificate_after_the_token_is_deleted() {
    let cluster = Cluster::start().await;
    let token = cluster.token("machine-3").await;
    let mut first = cluster.boot("machine-3", &token, "1");
    let node = cluster.node_where(&first, "a Ready node", is_ready).await;
    first.stop_with("TERM").await;
    first.assert_no_secrets(&token);

    let secret = format!("bootstrap-token-{}", bootstrap_token_id_for_machine("machine-3"));
    cluster
        .secrets()
        .delete(&secret, &DeleteParams::default())
        .await
        .expect("the token Secret is deleted");

    let restarted_at = Timestamp::now();
    let mut second = cluster.boot("machine-3", &token, "2");
    eventually(
        &second,
        "the Lease renewed after the restart",
        || cluster.lease_renew_time("machine-3"),
        |t| *t > restarted_at,
    )
    .await;
    let again = cluster
        .node_where(&second, "a Ready heartbeat after the restart", |n| {
            is_ready(n) && ready_heartbeat(n).is_some_and(|t| t > restarted_at)
        })
        .await;
    assert_eq!(again.metadata.uid, node.metadata.uid, "the same Node, adopted");
    assert!(
        second.output().contains("reusing the saved client certificate"),
        "{}",
        second.output()
    );
    let csrs = cluster.csrs().list(&ListParams::default()).await.unwrap().items;
    assert_eq!(csrs.len(), 1, "no new CSR: {csrs:?}");
    second.stop_with("INT").await;
    second.assert_no_secrets(&token);

    let mut command = cluster.agent_command("machine-3");
    command.env("MCM_LOCAL_NODE_NAME", "machine-3");
    let started_at = Timestamp::now();
    let mut third = Agent::spawn(command, &cluster.dir.path().join("machine-3-3"));
    eventually(
        &third,
        "the Lease renewed by a tokenless agent",
        || cluster.lease_renew_time("machine-3"),
        |t| *t > started_at,
    )
    .await;
    third.stop_with("TERM").await;
}

/// The admin's stand-in for the machine controller: the `InPlaceUpdate` condition `ReadyForUpdate`.
async fn ready_for_update(cluster: &Cluster, node: &str) {
    cluster
        .nodes()
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{
                "type": "InPlaceUpdate", "status": "True", "reason": "ReadyForUpdate",
                "message": "Node is ready for in-place update"
            }]}})),
        )
        .await
        .expect("the admin writes the condition");
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn capacity(node: &Node, resource: &str) -> Option<String> {
    let status = node.status.as_ref()?;
    Some(status.capacity.as_ref()?.get(resource)?.0.clone())
}

/// Asked for an in-place update (the machine controller's `InPlaceUpdate` condition `ReadyForUpdate`), the agent
/// applies the target its Node carries (the MachineDeployment controller's `in-place-update-target` annotation):
/// the node's cpu, memory and instance type become the target class's `nodeTemplate`, written before it answers
/// `update-result=successful`, and kept by a restarted agent. The condition is left to the machine controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_update_applies_the_target_class_and_a_restart_keeps_it() {
    let cluster = Cluster::start().await;
    let token = cluster.token("machine-6").await;
    let mut agent = cluster.boot("machine-6", &token, "1");
    let node = cluster.node_where(&agent, "a Ready node", is_ready).await;
    assert_eq!(capacity(&node, "cpu").as_deref(), Some("2"));
    let target = r#"{"class":"local-medium","nodeTemplate":{"capacity":{"cpu":"4","gpu":"0","memory":"8Gi"},"instanceType":"medium","region":"local","zone":"local-a"}}"#;
    cluster
        .nodes()
        .patch(
            "machine-6",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "labels": {"node.machine.sapcloud.io/candidate-for-update": "true"},
                "annotations": {"node.machine.sapcloud.io/in-place-update-target": target},
            }})),
        )
        .await
        .expect("the admin marks the node a candidate");
    ready_for_update(&cluster, "machine-6").await;
    let node = cluster
        .node_where(&agent, "update-result=successful", |n| {
            label(n, "node.machine.sapcloud.io/update-result") == Some("successful")
        })
        .await;
    assert_eq!(
        (
            capacity(&node, "cpu").as_deref(),
            capacity(&node, "memory").as_deref()
        ),
        (Some("4"), Some("8Gi")),
        "the new resources are written before the result"
    );
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    assert_eq!(
        allocatable.and_then(|a| a.get("cpu")).map(|q| q.0.as_str()),
        Some("4")
    );
    assert_eq!(label(&node, "node.kubernetes.io/instance-type"), Some("medium"));
    assert_eq!(
        condition(&node, "InPlaceUpdate").and_then(|c| c.reason.as_deref()),
        Some("ReadyForUpdate"),
        "the condition is the machine controller's"
    );
    assert!(is_ready(&node), "the agent's own conditions are kept");
    assert_private(&cluster.machine_dir("machine-6").join("in-place-update.json"));
    agent.stop_with("TERM").await;
    assert_eq!(
        agent.output().matches("in-place update applied").count(),
        1,
        "{}",
        agent.output()
    );
    agent.assert_no_secrets(&token);

    // The machine controller's next step, and the rollout's cleanup, as the admin: then a restart.
    cluster
        .nodes()
        .patch(
            "machine-6",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "labels": {"node.machine.sapcloud.io/candidate-for-update": null,
                           "node.machine.sapcloud.io/update-result": null},
                "annotations": {"node.machine.sapcloud.io/in-place-update-target": null},
            }})),
        )
        .await
        .expect("the admin cleans the node");
    let restarted_at = Timestamp::now();
    let mut second = cluster.boot("machine-6", &token, "2");
    let node = cluster
        .node_where(&second, "a heartbeat after the restart", |n| {
            ready_heartbeat(n).is_some_and(|t| t > restarted_at)
        })
        .await;
    assert_eq!(
        capacity(&node, "cpu").as_deref(),
        Some("4"),
        "the restarted agent keeps the update"
    );
    assert!(
        second
            .output()
            .contains("reporting the in-place update applied earlier"),
        "{}",
        second.output()
    );
    second.stop_with("TERM").await;
}

/// A target the agent cannot apply (none on the node, or a class without `nodeTemplate.capacity`) is answered at
/// once: `update-result=failed` and an `update-failed-reason` naming what is missing, once; the node keeps its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_update_without_a_usable_target_fails_at_once_naming_what_is_missing() {
    let cluster = Cluster::start().await;
    let token = cluster.token("machine-7").await;
    let mut agent = cluster.boot("machine-7", &token, "1");
    cluster.node_where(&agent, "a Ready node", is_ready).await;
    ready_for_update(&cluster, "machine-7").await;
    let node = cluster
        .node_where(&agent, "update-result=failed", |n| {
            label(n, "node.machine.sapcloud.io/update-result") == Some("failed")
        })
        .await;
    let reason = |node: &Node| {
        node.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("node.machine.sapcloud.io/update-failed-reason"))
            .cloned()
            .unwrap_or_default()
    };
    assert!(
        reason(&node)
            .starts_with("the node has no annotation node.machine.sapcloud.io/in-place-update-target"),
        "{}",
        reason(&node)
    );
    assert_eq!(
        capacity(&node, "cpu").as_deref(),
        Some("2"),
        "the node keeps its size"
    );

    // The next update, with a class that has no nodeTemplate.
    cluster
        .nodes()
        .patch(
            "machine-7",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "labels": {"node.machine.sapcloud.io/update-result": null},
                "annotations": {"node.machine.sapcloud.io/in-place-update-target": r#"{"class":"bare"}"#},
            }})),
        )
        .await
        .expect("the admin asks again");
    let node = cluster
        .node_where(&agent, "update-result=failed again", |n| {
            label(n, "node.machine.sapcloud.io/update-result") == Some("failed") && reason(n).contains("bare")
        })
        .await;
    assert_eq!(
        reason(&node),
        r#"the target class "bare" has no nodeTemplate.capacity.cpu: the node's new resources are taken from it"#
    );
    agent.stop_with("TERM").await;
    assert_eq!(
        agent.output().matches("in-place update refused").count(),
        2,
        "{}",
        agent.output()
    );
    assert!(
        !cluster
            .machine_dir("machine-7")
            .join("in-place-update.json")
            .exists(),
        "nothing applied"
    );
}

/// A Node deleted while its agent runs is not registered again; the agent keeps running until SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_is_not_registered_again() {
    let cluster = Cluster::start().await;
    let token = cluster.token("machine-4").await;
    let mut agent = cluster.boot("machine-4", &token, "1");
    cluster.node_where(&agent, "a Ready node", is_ready).await;
    cluster
        .nodes()
        .delete("machine-4", &DeleteParams::default())
        .await
        .expect("the admin deletes the Node");
    let warned = || agent.output().contains("the node was deleted");
    let end = Instant::now() + DEADLINE;
    while !warned() {
        assert!(
            Instant::now() < end,
            "no warning about the deleted node:\n{}",
            agent.output()
        );
        tokio::time::sleep(POLL).await;
    }
    // Three more heartbeats' worth of time: no Node appears again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        cluster.nodes().get_opt("machine-4").await.unwrap().is_none(),
        "registered again"
    );
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "the agent keeps running"
    );
    agent.stop_with("TERM").await;
}

/// A token the API server refuses (well-formed, but no Secret holds it) ends the agent with exit 1 and the server's
/// reason, without printing the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_exits_1_with_the_servers_reason() {
    let cluster = Cluster::start().await;
    let token = format!("{}.{TOKEN_SECRET}", bootstrap_token_id_for_machine("machine-5"));
    let mut agent = cluster.boot("machine-5", &token, "1");
    let status = agent.exit_within(DEADLINE).await;
    let output = agent.output();
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(output.contains("refused the bootstrap token"), "{output}");
    assert!(output.contains("Unauthorized"), "{output}");
    assert!(cluster.nodes().get_opt("machine-5").await.unwrap().is_none());
    agent.assert_no_secrets(&token);
}

/// `command` without `--node-name <name>` and without MCM_LOCAL_NODE_NAME.
fn without_node_name(command: &Command) -> Command {
    let mut without = Command::new(command.get_program());
    let mut skip = false;
    for arg in command.get_args() {
        if std::mem::take(&mut skip) {
            continue;
        }
        if arg == "--node-name" {
            skip = true;
            continue;
        }
        without.arg(arg);
    }
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => without.env(key, value),
            None => without.env_remove(key),
        };
    }
    without.env_remove("MCM_LOCAL_NODE_NAME");
    without
}

/// Misconfigurations exit 2 and name the flag and its variable, without contacting any server: no API server, an
/// unreadable CA, a token that is not one (not printed), no token and no saved certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misconfigurations_exit_2_naming_the_flag_or_variable() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ca = dir.path().join("ca.crt");
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let good_token = format!("abcdef.{TOKEN_SECRET}");
    let base = |token: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
        command.args(["node-agent", "--node-name", "machine-6"]);
        if let Some(token) = token {
            command.args(["--bootstrap-token", token]);
        }
        for variable in VARIABLES {
            command.env_remove(variable);
        }
        command
            .env("MCM_LOCAL_API_SERVER", "https://127.0.0.1:1")
            .env("MCM_LOCAL_CA_FILE", &ca)
            .env("MCM_LOCAL_MACHINE_DIR", dir.path().join("machine"))
            .env("MCM_LOCAL_CPU", "2")
            .env("MCM_LOCAL_MEMORY", "4Gi");
        command
    };
    let mut cases: Vec<(&str, Command, Vec<&str>)> = Vec::new();
    let mut no_server = base(Some(&good_token));
    no_server.env_remove("MCM_LOCAL_API_SERVER");
    cases.push((
        "no API server",
        no_server,
        vec!["--api-server", "MCM_LOCAL_API_SERVER"],
    ));
    let mut no_ca = base(Some(&good_token));
    no_ca.env("MCM_LOCAL_CA_FILE", dir.path().join("missing.crt"));
    cases.push((
        "an unreadable CA",
        no_ca,
        vec!["--ca-file", "MCM_LOCAL_CA_FILE", "missing.crt"],
    ));
    let malformed = "abcdef.NOT-A-TOKEN-q7w2e9";
    cases.push((
        "a malformed token",
        base(Some(malformed)),
        vec!["--bootstrap-token"],
    ));
    cases.push((
        "the controller's placeholder",
        base(Some("<<BOOTSTRAP_TOKEN>>")),
        vec!["--bootstrap-token"],
    ));
    cases.push((
        "no token, nothing saved",
        base(None),
        vec!["--bootstrap-token is required"],
    ));
    let mut bad_memory = base(Some(&good_token));
    bad_memory.env("MCM_LOCAL_MEMORY", "lots");
    cases.push((
        "a memory that is not a quantity",
        bad_memory,
        vec!["--memory", "MCM_LOCAL_MEMORY"],
    ));
    let without_name = without_node_name(&base(Some(&good_token)));
    cases.push((
        "no node name",
        without_name,
        vec!["--node-name", "MCM_LOCAL_NODE_NAME"],
    ));

    for (case, mut command, expected) in cases {
        let output = command
            .stdin(Stdio::null())
            .output()
            .expect("mcm node-agent runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(output.status.code(), Some(2), "{case}: {text}");
        for word in expected {
            assert!(text.contains(word), "{case}: no {word:?} in:\n{text}");
        }
        for secret in [good_token.as_str(), TOKEN_SECRET, malformed, "q7w2e9"] {
            assert!(!text.contains(secret), "{case}: the token is printed:\n{text}");
        }
    }
}
