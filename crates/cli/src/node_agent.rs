//! `mcm node-agent`: the agent a machine of the local provider runs at boot (its userData `exec`s it). It joins the
//! cluster the way kubelet TLS bootstrapping does, registers the machine's Node and keeps it alive, without running
//! any pods.
//!
//! **Join.** With the bootstrap token (`--bootstrap-token <id>.<secret>`, the controller's `<<BOOTSTRAP_TOKEN>>`) as
//! bearer, the agent creates a `certificates.k8s.io/v1` CertificateSigningRequest (generateName `csr-`) for a fresh
//! ECDSA P-256 key: subject `O=system:nodes, CN=system:node:<node-name>`, no subject alternative names, signer
//! `kubernetes.io/kube-apiserver-client-kubelet`, usages digital signature and client auth. The embedded API server
//! approves and signs such a request in its create; on another server the agent watches its request (by name, as
//! kubelet does) until `status.certificate` is set, it is Denied or Failed, or `--bootstrap-timeout` passes. From
//! then on it uses only that client certificate (and the cluster CA of `--ca-file`).
//!
//! **On disk** (in `--machine-dir`, which the agent creates when missing):
//! - `pki/client.pem`: the private key and the client certificate (PEM, mode 0600, written through a rename);
//! - `pki/ca.crt`: the CA the certificate was obtained under (mode 0600);
//! - `conditions/`: condition files (below), created empty.
//!
//! On a restart the saved certificate is reused while it is for this node, matches its key, was obtained under the
//! same CA and is valid for at least another minute: a restarted agent needs no token (which may have expired or
//! been deleted since). Otherwise it joins again with the token.
//!
//! **The Node** `<node-name>` is created with the node credential, or updated if it exists (after an agent
//! restart): labels `kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch` (as kubelet sets them; no
//! `node.kubernetes.io/instance-type`, which the agent has no source for), `spec.providerID` (`--provider-id`; an
//! existing different one is left alone, as it is immutable on Kubernetes), and the status: capacity and allocatable
//! `cpu`, `memory` (`--cpu`, `--memory`; the host's when not given) and `pods` (110), addresses `InternalIP`
//! 127.0.0.1 and `Hostname` <node-name>, `nodeInfo` (kubeletVersion `mcm-node-agent/<version>`, operatingSystem and
//! architecture as Go names them, kernel, OS image and boot id of the host), and the conditions kubelet posts:
//! MemoryPressure, DiskPressure, PIDPressure `False` and Ready `True` (reasons and messages as kubelet's). A Node
//! deleted while the agent runs is not registered again (the machine controller deletes Nodes): heartbeats stop.
//!
//! **Heartbeat**, every `--heartbeat-interval`: the Lease `kube-node-lease/<node-name>` is created or renewed
//! (holderIdentity the node name, leaseDurationSeconds 40, renewTime now, owned by the Node); the node status is
//! written (heartbeat times now, transition times kept for unchanged statuses) when it differs from what the agent
//! reports and at least every 4 intervals, as kubelet does. Status writes are merge patches guarded by the Node's
//! resourceVersion; conditions others posted are kept.
//!
//! **Condition files**, read every heartbeat: each file `<machine-dir>/conditions/<Type>` whose trimmed content is
//! `True`, `False` or `Unknown` sets the node condition `<Type>` to that status (reason `NodeAgentFile`, message
//! naming the file). Removing the file removes a condition it added, or sets a built-in one (Ready, MemoryPressure,
//! DiskPressure, PIDPressure) back to its default. `echo True > conditions/KernelDeadlock` makes the machine
//! controller see an unhealthy node; `echo False > conditions/Ready` makes the node NotReady. Hidden files, names
//! that are not condition types and other contents are ignored (with a warning).
//!
//! **Exit codes.** SIGTERM or SIGINT: heartbeats stop and the agent exits 0 (the Node stays; the machine controller
//! deletes it). A misconfiguration (a missing or invalid flag or variable, an unreadable CA, a malformed token, no
//! token and no saved certificate) exits 2 with a message naming the flag and its variable. A refused token, a
//! denied request or no certificate within `--bootstrap-timeout` exit 1 with the API server's reason.
//!
//! The token, the key and the certificate never appear in a log line or a message (the token id, which names the
//! token's Secret, may).

use std::{
    collections::BTreeMap,
    fmt,
    io::{Read as _, Write as _},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use base64::Engine as _;
use clap::Args;
use k8s_openapi::{
    ByteString,
    api::{
        certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec},
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo},
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};
use tokio::time::Instant;
use tracing::Instrument as _;

/// The signer of kubelet client certificates.
const KUBELET_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The namespace of node Leases.
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// `leaseDurationSeconds` of the node's Lease (kubelet's default).
const LEASE_DURATION_SECONDS: i32 = 40;
/// Pods a node takes (kubelet's default `maxPods`).
const MAX_PODS: &str = "110";
/// The node status is written at least every this many heartbeats.
const STATUS_EVERY: u32 = 4;
/// The reason of conditions set by files.
const FILE_REASON: &str = "NodeAgentFile";
/// A saved certificate is reused only while it is valid for at least this long.
const MIN_REMAINING_VALIDITY: Duration = Duration::from_mins(1);
/// The longest pause between retries of a failed request.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Exit code of a misconfiguration.
const EXIT_MISCONFIGURED: i32 = 2;
/// Exit code of a join the API server refused.
const EXIT_FAILED: i32 = 1;

/// The conditions kubelet posts: type, healthy status, reason, message.
const BUILT_IN_CONDITIONS: [(&str, &str, &str, &str); 4] = [
    (
        "MemoryPressure",
        "False",
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
    ),
    (
        "DiskPressure",
        "False",
        "KubeletHasNoDiskPressure",
        "kubelet has no disk pressure",
    ),
    (
        "PIDPressure",
        "False",
        "KubeletHasSufficientPID",
        "kubelet has sufficient PID available",
    ),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
];

const CONDITIONS_HELP: &str = "\
Condition files (read every heartbeat): each file <machine-dir>/conditions/<Type> whose trimmed content is True,
False or Unknown sets the node condition <Type> to that status (reason NodeAgentFile, message naming the file);
removing the file removes a condition it added, or sets a built-in one (Ready, MemoryPressure, DiskPressure,
PIDPressure) back to its default. E.g. `echo True > conditions/KernelDeadlock` makes the machine controller see an
unhealthy node; `echo False > conditions/Ready` makes the node NotReady.

Files: <machine-dir>/pki/client.pem (key and client certificate, mode 0600) and pki/ca.crt are reused on a restart
while the certificate is valid, so a restarted agent needs no bootstrap token.

Exit codes: 0 after SIGTERM or SIGINT (the Node is left to the machine controller), 2 for a misconfiguration, 1 when
the API server refuses the token or no certificate is issued.";

/// A bootstrap token as given on the command line: never printed (`Debug` is redacted, there is no `Display`).
#[derive(Clone)]
pub struct TokenArg(String);

impl fmt::Debug for TokenArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

// clap's value parsers return Result; this one accepts everything (the format is checked later, without echoing).
#[allow(clippy::unnecessary_wraps)]
fn token_arg(text: &str) -> Result<TokenArg, String> {
    Ok(TokenArg(text.to_owned()))
}

/// `mcm node-agent`.
#[derive(Debug, Args)]
#[command(after_help = CONDITIONS_HELP)]
pub struct NodeAgentArgs {
    /// The name of the Node to register: the machine's name (the controller's <<MACHINE_NAME>>).
    #[arg(long, env = "MCM_LOCAL_NODE_NAME")]
    node_name: Option<String>,
    /// Kubernetes bootstrap token <token-id>.<token-secret> to join with (the controller's <<BOOTSTRAP_TOKEN>>);
    /// never logged. Not needed while the certificate saved in the machine directory is valid.
    #[arg(long, value_name = "TOKEN", value_parser = token_arg)]
    bootstrap_token: Option<TokenArg>,
    /// URL of the cluster's API server (https://host:port).
    #[arg(long, env = "MCM_LOCAL_API_SERVER")]
    api_server: Option<String>,
    /// The cluster's CA certificate (PEM), which signed the API server's certificate.
    #[arg(long, env = "MCM_LOCAL_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// The machine's state directory (writable): saved credentials in pki/, condition files in conditions/.
    #[arg(long, env = "MCM_LOCAL_MACHINE_DIR")]
    machine_dir: Option<PathBuf>,
    /// The Node's spec.providerID (the machine's VM).
    #[arg(long, env = "MCM_LOCAL_PROVIDER_ID")]
    provider_id: Option<String>,
    /// CPU capacity of the Node, a quantity (2, 500m); the host's CPUs when not given.
    #[arg(long, env = "MCM_LOCAL_CPU")]
    cpu: Option<String>,
    /// Memory capacity of the Node, a quantity (4Gi); the host's memory when not given.
    #[arg(long, env = "MCM_LOCAL_MEMORY")]
    memory: Option<String>,
    /// How often the Lease is renewed and the condition files are read; the node status is written at least every
    /// 4 intervals.
    #[arg(long, env = "MCM_LOCAL_HEARTBEAT_INTERVAL", default_value = "10s", value_parser = crate::parse_duration)]
    heartbeat_interval: Duration,
    /// How long to wait for the client certificate to be issued when joining.
    #[arg(long, default_value = "15m", value_parser = crate::parse_duration)]
    bootstrap_timeout: Duration,
}

/// Why the agent stops with an error.
#[derive(Debug)]
enum Failure {
    /// Exit 2: a flag or variable is missing or wrong.
    Misconfigured(String),
    /// Exit 1: the join failed.
    Failed(String),
}

/// The validated configuration.
struct Settings {
    node_name: String,
    token: Option<Token>,
    api_server: String,
    ca_pem: String,
    machine_dir: PathBuf,
    provider_id: Option<String>,
    cpu: String,
    memory: String,
    heartbeat_interval: Duration,
    bootstrap_timeout: Duration,
}

/// A well-formed bootstrap token.
struct Token {
    id: String,
    secret: String,
}

impl Token {
    /// `<id>.<secret>`, id `[a-z0-9]{6}`, secret `[a-z0-9]{16}`.
    fn parse(text: &str) -> Option<Self> {
        let (id, secret) = text.trim().split_once('.')?;
        let valid = |part: &str, len: usize| {
            part.len() == len && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        };
        (valid(id, 6) && valid(secret, 16)).then(|| Self {
            id: id.to_owned(),
            secret: secret.to_owned(),
        })
    }

    fn bearer(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }
}

/// Runs the agent; returns the process exit code.
pub fn main(args: NodeAgentArgs) -> i32 {
    let settings = match Settings::from_args(args) {
        Ok(settings) => settings,
        Err(failure) => return report(&failure),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => return report(&Failure::Failed(format!("cannot start the async runtime: {err}"))),
    };
    let span = tracing::info_span!("node_agent", node = %settings.node_name);
    let result = runtime.block_on(run(settings).instrument(span));
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => 0,
        Err(failure) => report(&failure),
    }
}

fn report(failure: &Failure) -> i32 {
    match failure {
        Failure::Misconfigured(message) => {
            eprintln!("error: mcm node-agent: {message}");
            EXIT_MISCONFIGURED
        }
        Failure::Failed(message) => {
            eprintln!("Error: mcm node-agent: {message}");
            EXIT_FAILED
        }
    }
}

/// A flag and its environment variable, for messages.
fn flag(name: &str, variable: Option<&str>) -> String {
    match variable {
        Some(variable) => format!("--{name} (or {variable})"),
        None => format!("--{name}"),
    }
}

fn required(value: Option<String>, name: &str, variable: &str) -> Result<String, Failure> {
    value
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| Failure::Misconfigured(format!("{} is required", flag(name, Some(variable)))))
}

impl Settings {
    fn from_args(args: NodeAgentArgs) -> Result<Self, Failure> {
        let bad = |name: &str, variable: Option<&str>, why: String| {
            Failure::Misconfigured(format!("invalid {}: {why}", flag(name, variable)))
        };
        let node_name = required(args.node_name, "node-name", "MCM_LOCAL_NODE_NAME")?;
        mcm_api::validation::check_dns1123_subdomain(&node_name).map_err(|why| {
            bad(
                "node-name",
                Some("MCM_LOCAL_NODE_NAME"),
                format!("{node_name:?}: {why}"),
            )
        })?;
        let token = match args.bootstrap_token {
            None => None,
            Some(TokenArg(text)) if text.trim().is_empty() => None,
            Some(TokenArg(text)) => Some(Token::parse(&text).ok_or_else(|| {
                bad(
                    "bootstrap-token",
                    None,
                    "not a bootstrap token: expected <token-id>.<token-secret>, 6 and 16 characters of [a-z0-9] \
                     (the value is not shown)"
                        .into(),
                )
            })?),
        };
        let api_server = required(args.api_server, "api-server", "MCM_LOCAL_API_SERVER")?;
        let host = api_server.strip_prefix("https://").unwrap_or_default();
        if host.is_empty() || host.starts_with('/') || api_server.contains(char::is_whitespace) {
            return Err(bad(
                "api-server",
                Some("MCM_LOCAL_API_SERVER"),
                format!("{api_server:?} is not an https:// URL"),
            ));
        }
        let ca_file = required(
            args.ca_file.map(|p| p.to_string_lossy().into_owned()),
            "ca-file",
            "MCM_LOCAL_CA_FILE",
        )?;
        let ca_pem = std::fs::read_to_string(&ca_file).map_err(|err| {
            bad(
                "ca-file",
                Some("MCM_LOCAL_CA_FILE"),
                format!("cannot read {ca_file}: {err}"),
            )
        })?;
        if !pem_blocks(&ca_pem)
            .iter()
            .any(|(label, _)| label == "CERTIFICATE")
        {
            return Err(bad(
                "ca-file",
                Some("MCM_LOCAL_CA_FILE"),
                format!("{ca_file} holds no PEM certificate"),
            ));
        }
        let machine_dir = PathBuf::from(required(
            args.machine_dir.map(|p| p.to_string_lossy().into_owned()),
            "machine-dir",
            "MCM_LOCAL_MACHINE_DIR",
        )?);
        std::fs::create_dir_all(machine_dir.join(CONDITIONS_DIR)).map_err(|err| {
            bad(
                "machine-dir",
                Some("MCM_LOCAL_MACHINE_DIR"),
                format!(
                    "cannot create {}: {err}",
                    machine_dir.join(CONDITIONS_DIR).display()
                ),
            )
        })?;
        let provider_id = args
            .provider_id
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty());
        let cpu = quantity(args.cpu, "cpu", "MCM_LOCAL_CPU", || {
            std::thread::available_parallelism()
                .ok()
                .map(|n| n.get().to_string())
        })?;
        let memory = quantity(args.memory, "memory", "MCM_LOCAL_MEMORY", host_memory)?;
        if args.heartbeat_interval.is_zero() {
            return Err(bad("heartbeat-interval", None, "must be more than 0s".into()));
        }
        Ok(Self {
            node_name,
            token,
            api_server: api_server.trim_end_matches('/').to_owned(),
            ca_pem,
            machine_dir,
            provider_id,
            cpu,
            memory,
            heartbeat_interval: args.heartbeat_interval,
            bootstrap_timeout: args.bootstrap_timeout,
        })
    }
}

/// A quantity flag: its value when it is a quantity, else the host's (`host`) when it is not given.
fn quantity(
    value: Option<String>,
    name: &str,
    variable: &str,
    host: impl FnOnce() -> Option<String>,
) -> Result<String, Failure> {
    match value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()) {
        Some(value) if is_quantity(&value) => Ok(value),
        Some(value) => Err(Failure::Misconfigured(format!(
            "invalid {}: {value:?} is not a quantity",
            flag(name, Some(variable))
        ))),
        None => host().ok_or_else(|| {
            Failure::Misconfigured(format!(
                "{} is required: the host's value is unknown",
                flag(name, Some(variable))
            ))
        }),
    }
}

/// A Kubernetes quantity: a decimal number with an optional binary (Ki..Ei), decimal (n, u, m, k, M..E) or
/// exponent suffix.
fn is_quantity(text: &str) -> bool {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let number_end = unsigned
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let number_ok =
        !number.is_empty() && number.matches('.').count() <= 1 && number.bytes().any(|b| b.is_ascii_digit());
    let suffix_ok = matches!(
        suffix,
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E"
    ) || suffix
        .strip_prefix(['e', 'E'])
        .map(|exp| exp.strip_prefix(['+', '-']).unwrap_or(exp))
        .is_some_and(|exp| !exp.is_empty() && exp.bytes().all(|b| b.is_ascii_digit()));
    number_ok && suffix_ok
}

/// The host's memory from /proc/meminfo (`MemTotal: <n> kB`), as `<n>Ki`.
fn host_memory() -> Option<String> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(format!("{kib}Ki"))
}

async fn run(settings: Settings) -> Result<(), Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let install = |kind: SignalKind, name: &str| {
        signal(kind).map_err(|err| Failure::Failed(format!("cannot install the {name} handler: {err}")))
    };
    let mut terminate = install(SignalKind::terminate(), "SIGTERM")?;
    let mut interrupt = install(SignalKind::interrupt(), "SIGINT")?;
    let stop = async move {
        tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        }
    };
    tokio::pin!(stop);
    let client = tokio::select! {
        client = join(&settings) => client?,
        signal = &mut stop => {
            tracing::info!(signal, "stopping before the join completed");
            return Ok(());
        }
    };
    let mut agent = Agent::new(&settings, client);
    tokio::select! {
        () = agent.run() => Ok(()),
        signal = &mut stop => {
            tracing::info!(signal, "stopping: heartbeats end, the Node stays");
            Ok(())
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Join: saved credentials, or a CertificateSigningRequest made with the bootstrap token.

const PKI_DIR: &str = "pki";
const CLIENT_PEM: &str = "client.pem";
const CA_PEM: &str = "ca.crt";
const CONDITIONS_DIR: &str = "conditions";

/// A client of the cluster as `user` (a kubeconfig `user` entry), with the CA of `--ca-file`.
async fn cluster_client(settings: &Settings, user: Value) -> Result<Client, Failure> {
    let b64 = |data: &str| base64::engine::general_purpose::STANDARD.encode(data);
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "cluster", "cluster": {
            "server": settings.api_server,
            "certificate-authority-data": b64(&settings.ca_pem),
        } }],
        "users": [{ "name": "node-agent", "user": user }],
        "contexts": [{ "name": "node-agent", "context": { "cluster": "cluster", "user": "node-agent" } }],
        "current-context": "node-agent",
    });
    // Errors below describe the configuration's shape, never its credentials.
    let kubeconfig: Kubeconfig = serde_json::from_value(kubeconfig)
        .map_err(|err| Failure::Failed(format!("cannot build the client configuration: {err}")))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|err| {
            Failure::Misconfigured(format!(
                "{} or {}: {err}",
                flag("api-server", Some("MCM_LOCAL_API_SERVER")),
                flag("ca-file", Some("MCM_LOCAL_CA_FILE"))
            ))
        })?;
    Client::try_from(config).map_err(|err| Failure::Failed(format!("cannot build the client: {err}")))
}

/// A client with the node's key and certificate (`credentials`: both PEM, key first).
async fn node_client(settings: &Settings, credentials: &Credentials) -> Result<Client, Failure> {
    let b64 = |data: &str| base64::engine::general_purpose::STANDARD.encode(data);
    cluster_client(
        settings,
        json!({
            "client-certificate-data": b64(&credentials.cert_pem),
            "client-key-data": b64(&credentials.key_pem),
        }),
    )
    .await
}

/// The node's key and certificate.
struct Credentials {
    key_pem: String,
    cert_pem: String,
    not_after: Timestamp,
}

/// Obtains the node's client: from the saved credentials when they are still good, else by joining with the token.
async fn join(settings: &Settings) -> Result<Client, Failure> {
    let pki = settings.machine_dir.join(PKI_DIR);
    match load_credentials(&pki, settings) {
        Ok(credentials) => {
            tracing::info!(
                path = %pki.join(CLIENT_PEM).display(),
                expires = %credentials.not_after,
                "reusing the saved client certificate"
            );
            return node_client(settings, &credentials).await;
        }
        Err(why) => tracing::info!(reason = %why, "no saved client certificate to reuse; joining"),
    }
    let Some(token) = &settings.token else {
        return Err(Failure::Misconfigured(format!(
            "--bootstrap-token is required: there is no valid client certificate in {}",
            pki.display()
        )));
    };
    let key = rcgen::KeyPair::generate()
        .map_err(|err| Failure::Failed(format!("cannot generate a private key: {err}")))?;
    let request = certificate_request(&key, &settings.node_name)?;
    let bootstrap = cluster_client(settings, json!({ "token": token.bearer() })).await?;
    let cert_pem = request_certificate(bootstrap, request, settings, &token.id).await?;
    let credentials = Credentials {
        key_pem: key.serialize_pem(),
        not_after: certificate_of(&cert_pem)
            .map(|c| c.not_after)
            .map_err(|why| Failure::Failed(format!("the issued certificate is unusable: {why}")))?,
        cert_pem,
    };
    match save_credentials(&pki, &credentials, &settings.ca_pem) {
        Ok(()) => tracing::info!(
            path = %pki.join(CLIENT_PEM).display(),
            expires = %credentials.not_after,
            "joined: client certificate issued and saved"
        ),
        Err(err) => tracing::warn!(
            path = %pki.display(),
            error = %err,
            "joined, but the client certificate could not be saved: a restart will need a valid token"
        ),
    }
    node_client(settings, &credentials).await
}

/// The PEM CERTIFICATE REQUEST of a kubelet client certificate for `node`.
fn certificate_request(key: &rcgen::KeyPair, node: &str) -> Result<String, Failure> {
    let mut params = rcgen::CertificateParams::default();
    let mut subject = rcgen::DistinguishedName::new();
    subject.push(rcgen::DnType::OrganizationName, "system:nodes");
    subject.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.distinguished_name = subject;
    params
        .serialize_request(key)
        .and_then(|request| request.pem())
        .map_err(|err| Failure::Failed(format!("cannot make the certificate request: {err}")))
}

/// Whether a failed request may succeed later: no answer, or 429 and 5xx.
fn is_transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        _ => true,
    }
}

fn api_reason(status: &kube::core::Status) -> String {
    if status.message.is_empty() || status.message == status.reason {
        format!("{} ({})", status.reason, status.code)
    } else {
        format!("{} ({} {})", status.message, status.code, status.reason)
    }
}

/// Exponential back-off: 1 s, doubling, at most [`MAX_BACKOFF`].
struct Backoff(Duration);

impl Backoff {
    fn new() -> Self {
        Self(Duration::from_secs(1))
    }

    fn next(&mut self) -> Duration {
        let delay = self.0;
        self.0 = (self.0 * 2).min(MAX_BACKOFF);
        delay
    }
}

/// Creates the CertificateSigningRequest with the bootstrap client and waits for its certificate (PEM).
async fn request_certificate(
    bootstrap: Client,
    request_pem: String,
    settings: &Settings,
    token_id: &str,
) -> Result<String, Failure> {
    let deadline = Instant::now() + settings.bootstrap_timeout;
    let api: Api<CertificateSigningRequest> = Api::all(bootstrap);
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("csr-".into()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request_pem.into_bytes()),
            signer_name: KUBELET_SIGNER.into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    let mut backoff = Backoff::new();
    let created = loop {
        match api.create(&PostParams::default(), &csr).await {
            Ok(created) => break created,
            Err(kube::Error::Api(status)) if status.code == 401 => {
                return Err(Failure::Failed(format!(
                    "the API server refused the bootstrap token {token_id} (Secret \
                     kube-system/bootstrap-token-{token_id}): {}; it may have expired or been deleted",
                    api_reason(&status)
                )));
            }
            Err(err) if is_transient(&err) && Instant::now() < deadline => {
                let delay = backoff.next();
                tracing::warn!(error = %err, retry_in = ?delay, "creating the certificate signing request failed");
                tokio::time::sleep_until((Instant::now() + delay).min(deadline)).await;
            }
            Err(kube::Error::Api(status)) => {
                return Err(Failure::Failed(format!(
                    "the API server refused the certificate signing request: {}",
                    api_reason(&status)
                )));
            }
            Err(err) => {
                return Err(Failure::Failed(format!(
                    "could not create the certificate signing request within {:?}: {err}",
                    settings.bootstrap_timeout
                )));
            }
        }
    };
    let name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %name, "certificate signing request created");
    let mut current = Some(created);
    loop {
        if let Some(csr) = &current {
            if let Some(pem) = issued(csr) {
                tracing::info!(csr = %name, "certificate issued");
                return Ok(pem);
            }
            if let Some(refusal) = refused(csr) {
                return Err(Failure::Failed(format!(
                    "the certificate signing request {name} was {refusal}"
                )));
            }
        } else {
            return Err(Failure::Failed(format!(
                "the certificate signing request {name} was deleted before a certificate was issued"
            )));
        }
        let decided = |csr: Option<&CertificateSigningRequest>| {
            csr.is_none_or(|csr| issued(csr).is_some() || refused(csr).is_some())
        };
        let wait = kube::runtime::wait::await_condition(api.clone(), &name, decided);
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(csr)) => current = csr,
            Ok(Err(err)) => {
                let delay = backoff.next();
                tracing::warn!(csr = %name, error = %err, retry_in = ?delay, "watching the certificate signing request failed");
                tokio::time::sleep_until((Instant::now() + delay).min(deadline)).await;
                if Instant::now() >= deadline {
                    return Err(not_issued(&name, settings));
                }
            }
            Err(_) => return Err(not_issued(&name, settings)),
        }
    }
}

fn not_issued(name: &str, settings: &Settings) -> Failure {
    Failure::Failed(format!(
        "no certificate was issued for the certificate signing request {name} within {:?} (--bootstrap-timeout); \
         an admin may approve it",
        settings.bootstrap_timeout
    ))
}

/// The certificate of a signed request (PEM).
fn issued(csr: &CertificateSigningRequest) -> Option<String> {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .filter(|c| !c.0.is_empty())
        .map(|c| String::from_utf8_lossy(&c.0).into_owned())
}

/// How a request was refused: `denied (<reason>: <message>)` or `failed (...)`.
fn refused(csr: &CertificateSigningRequest) -> Option<String> {
    let conditions = csr.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| matches!(c.type_.as_str(), "Denied" | "Failed") && c.status == "True")
        .map(|c| {
            format!(
                "{} ({}: {})",
                c.type_.to_lowercase(),
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            )
        })
}

/// The saved credentials when they can be reused (see the module doc); else why not.
fn load_credentials(pki: &Path, settings: &Settings) -> Result<Credentials, String> {
    let path = pki.join(CLIENT_PEM);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Err("none saved".into()),
        Err(err) => return Err(format!("cannot read {}: {err}", path.display())),
    };
    let saved_ca = std::fs::read_to_string(pki.join(CA_PEM)).unwrap_or_default();
    if saved_ca.trim() != settings.ca_pem.trim() {
        return Err("it was issued under another CA than --ca-file's".into());
    }
    let blocks = pem_blocks(&text);
    let cert_pem = blocks
        .iter()
        .find(|(label, _)| label == "CERTIFICATE")
        .map(|(_, der)| to_pem("CERTIFICATE", der))
        .ok_or("the file holds no certificate")?;
    let key_pem = blocks
        .iter()
        .find(|(label, _)| label.ends_with("PRIVATE KEY"))
        .map(|(label, der)| to_pem(label, der))
        .ok_or("the file holds no private key")?;
    let certificate = certificate_of(&cert_pem)?;
    let expected = format!("system:node:{}", settings.node_name);
    if certificate.common_name.as_deref() != Some(expected.as_str()) {
        return Err(format!("it is not for {expected}"));
    }
    let key = rcgen::KeyPair::from_pem(&key_pem).map_err(|_| "the private key is unreadable")?;
    if rcgen::PublicKeyData::subject_public_key_info(&key) != certificate.public_key_info {
        return Err("the certificate does not match the private key".into());
    }
    let left = certificate.not_after.duration_since(Timestamp::now());
    if left.as_secs() < i64::try_from(MIN_REMAINING_VALIDITY.as_secs()).unwrap_or(i64::MAX) {
        return Err(format!(
            "it expired (or expires within a minute) at {}",
            certificate.not_after
        ));
    }
    Ok(Credentials {
        key_pem,
        cert_pem,
        not_after: certificate.not_after,
    })
}

/// Writes `pki/client.pem` (key, then certificate) and `pki/ca.crt`, mode 0600, each through a rename.
fn save_credentials(pki: &Path, credentials: &Credentials, ca_pem: &str) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(pki)?;
    std::fs::set_permissions(pki, std::fs::Permissions::from_mode(0o700))?;
    // The CA first: a crash between the two writes leaves a certificate that is not reused, never a wrong one.
    write_private(&pki.join(CA_PEM), ca_pem.as_bytes())?;
    let mut both = credentials.key_pem.clone();
    if !both.ends_with('\n') {
        both.push('\n');
    }
    both.push_str(&credentials.cert_pem);
    write_private(&pki.join(CLIENT_PEM), both.as_bytes())
}

fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)?;
    file.write_all(contents)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path)
}

/// The PEM blocks of a text: label and DER.
fn pem_blocks(text: &str) -> Vec<(String, Vec<u8>)> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        let Some(label) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
        else {
            continue;
        };
        let end = format!("-----END {label}-----");
        let mut body = String::new();
        let mut closed = false;
        for line in lines.by_ref() {
            if line == end {
                closed = true;
                break;
            }
            body.push_str(line);
        }
        if let (true, Ok(der)) = (closed, base64::engine::general_purpose::STANDARD.decode(body)) {
            blocks.push((label.to_owned(), der));
        }
    }
    blocks
}

fn to_pem(label: &str, der: &[u8]) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = format!("-----BEGIN {label}-----\n");
    for chunk in encoded.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(chunk));
        pem.push('\n');
    }
    pem.push_str("-----END ");
    pem.push_str(label);
    pem.push_str("-----\n");
    pem
}

/// What the agent needs to know of its certificate.
struct CertificateInfo {
    common_name: Option<String>,
    not_after: Timestamp,
    /// The DER SubjectPublicKeyInfo.
    public_key_info: Vec<u8>,
}

/// Reads a PEM certificate's subject CN, notAfter and public key.
fn certificate_of(pem: &str) -> Result<CertificateInfo, String> {
    let der = pem_blocks(pem)
        .into_iter()
        .find(|(label, _)| label == "CERTIFICATE")
        .map(|(_, der)| der)
        .ok_or("no PEM certificate")?;
    let common_name = mcm_apiserver::x509::certificate_subject(&der)
        .map_err(|err| format!("unreadable certificate: {err}"))?
        .common_name()
        .map(str::to_owned);
    let (not_after, public_key_info) = validity_and_key(&der).ok_or("unreadable certificate")?;
    Ok(CertificateInfo {
        common_name,
        not_after,
        public_key_info,
    })
}

/// One DER element: tag, content, the whole element, the rest after it.
type DerElement<'a> = (u8, &'a [u8], &'a [u8], &'a [u8]);

/// The first DER element of `input`.
fn der_element(input: &[u8]) -> Option<DerElement<'_>> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let len = rest[..count]
            .iter()
            .fold(0usize, |len, &b| (len << 8) | usize::from(b));
        (len, &rest[count..])
    };
    if rest.len() < len {
        return None;
    }
    let header = input.len() - rest.len();
    Some((tag, &rest[..len], &input[..header + len], &rest[len..]))
}

/// notAfter and the SubjectPublicKeyInfo of a DER certificate.
fn validity_and_key(der: &[u8]) -> Option<(Timestamp, Vec<u8>)> {
    const SEQUENCE: u8 = 0x30;
    let (SEQUENCE, certificate, _, _) = der_element(der)? else {
        return None;
    };
    let (SEQUENCE, tbs, _, _) = der_element(certificate)? else {
        return None;
    };
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = der_element(rest)?.3; // version
    }
    rest = der_element(rest)?.3; // serialNumber
    rest = der_element(rest)?.3; // signature
    rest = der_element(rest)?.3; // issuer
    let (SEQUENCE, validity, _, after_validity) = der_element(rest)? else {
        return None;
    };
    let (_, _, _, after_not_before) = der_element(validity)?;
    let (tag, not_after, _, _) = der_element(after_not_before)?;
    let not_after = der_time(tag, not_after)?;
    let after_subject = der_element(after_validity)?.3;
    let (SEQUENCE, _, key_info, _) = der_element(after_subject)? else {
        return None;
    };
    Some((not_after, key_info.to_vec()))
}

/// A UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
fn der_time(tag: u8, content: &[u8]) -> Option<Timestamp> {
    let text = std::str::from_utf8(content).ok()?.strip_suffix('Z')?;
    let full = match (tag, text.len()) {
        (0x17, 12) => {
            let year: u32 = text[..2].parse().ok()?;
            format!("{}{text}", if year < 50 { "20" } else { "19" })
        }
        (0x18, 14) => text.to_owned(),
        _ => return None,
    };
    if !full.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    format!(
        "{}-{}-{}T{}:{}:{}Z",
        &full[..4],
        &full[4..6],
        &full[6..8],
        &full[8..10],
        &full[10..12],
        &full[12..14]
    )
    .parse()
    .ok()
}

// ---------------------------------------------------------------------------------------------------------------
// The Node, its Lease and its conditions.

/// The status of a condition file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileCondition {
    status: String,
    path: PathBuf,
}

/// A condition type a file may name: letters, digits, `.`, `_`, `-`, starting with a letter or digit.
fn is_condition_type(name: &str) -> bool {
    name.len() <= 316
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The condition files of a directory; `problems` collects (file, why) of the ignored ones.
fn read_condition_files(
    dir: &Path,
    problems: &mut BTreeMap<PathBuf, String>,
) -> BTreeMap<String, FileCondition> {
    let mut conditions = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return conditions;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            problems.insert(path, "the name is not UTF-8".into());
            continue;
        };
        if name.starts_with('.') || !path.is_file() {
            continue;
        }
        if !is_condition_type(&name) {
            problems.insert(path, "the name is not a condition type".into());
            continue;
        }
        let mut content = String::new();
        let read = std::fs::File::open(&path).and_then(|file| file.take(256).read_to_string(&mut content));
        if let Err(err) = read {
            problems.insert(path, format!("unreadable: {err}"));
            continue;
        }
        match content.trim() {
            status @ ("True" | "False" | "Unknown") => {
                conditions.insert(
                    name,
                    FileCondition {
                        status: status.to_owned(),
                        path,
                    },
                );
            }
            other => {
                let shown: String = other.chars().take(32).collect();
                problems.insert(
                    path,
                    format!("the content {shown:?} is not True, False or Unknown"),
                );
            }
        }
    }
    conditions
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: None,
        last_transition_time: None,
    }
}

/// The conditions the agent reports (without times): the built-in ones, overridden or added by files.
fn reported_conditions(files: &BTreeMap<String, FileCondition>) -> Vec<NodeCondition> {
    let from_file = |type_: &str, file: &FileCondition| {
        condition(
            type_,
            &file.status,
            FILE_REASON,
            &format!("set by the file {}", file.path.display()),
        )
    };
    let mut conditions: Vec<NodeCondition> = BUILT_IN_CONDITIONS
        .iter()
        .map(|&(type_, status, reason, message)| match files.get(type_) {
            Some(file) => from_file(type_, file),
            None => condition(type_, status, reason, message),
        })
        .collect();
    for (type_, file) in files {
        if !BUILT_IN_CONDITIONS.iter().any(|c| c.0 == type_) {
            conditions.push(from_file(type_, file));
        }
    }
    conditions
}

/// The conditions to write: `reported`, stamped with `now` as heartbeat and with transition times kept from
/// `current` where the status did not change, followed by the conditions of `current` others posted (not built-in,
/// not reported, not set by a file: a file removed while the agent was down loses its condition too).
fn merged_conditions(
    current: &[NodeCondition],
    reported: &[NodeCondition],
    now: Timestamp,
) -> Vec<NodeCondition> {
    let mut merged: Vec<NodeCondition> = reported
        .iter()
        .map(|wanted| {
            let kept = current
                .iter()
                .find(|c| c.type_ == wanted.type_ && c.status == wanted.status)
                .and_then(|c| c.last_transition_time.clone());
            NodeCondition {
                last_heartbeat_time: Some(Time(now)),
                last_transition_time: Some(kept.unwrap_or(Time(now))),
                ..wanted.clone()
            }
        })
        .collect();
    merged.extend(
        current
            .iter()
            .filter(|c| {
                !BUILT_IN_CONDITIONS.iter().any(|b| b.0 == c.type_)
                    && !reported.iter().any(|r| r.type_ == c.type_)
                    && c.reason.as_deref() != Some(FILE_REASON)
            })
            .cloned(),
    );
    merged
}

/// A condition without its times: type, status, reason, message.
type ConditionFingerprint = (String, String, Option<String>, Option<String>);

/// Conditions without times, sorted by type: equal fingerprints need no write.
fn fingerprint(conditions: &[NodeCondition]) -> Vec<ConditionFingerprint> {
    let mut list: Vec<_> = conditions
        .iter()
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.message.clone(),
            )
        })
        .collect();
    list.sort();
    list
}

/// `std::env::consts::ARCH` as Go (and so Kubernetes: `kubernetes.io/arch`, `nodeInfo.architecture`) names it.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        "loongarch64" => "loong64",
        "mips64" if cfg!(target_endian = "little") => "mips64le",
        other => other,
    }
}

/// `std::env::consts::OS` as Go names it.
fn go_os() -> &'static str {
    match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// `PRETTY_NAME` of /etc/os-release.
fn os_image() -> String {
    let release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    release
        .lines()
        .find_map(|line| line.strip_prefix("PRETTY_NAME="))
        .map_or_else(
            || "Linux".to_owned(),
            |value| value.trim().trim_matches('"').to_owned(),
        )
}

/// What happened in one heartbeat.
enum Beat {
    /// The Node is alive.
    Alive,
    /// The Node is gone: heartbeats stop.
    NodeGone,
}

/// The running agent, after the join.
struct Agent {
    name: String,
    nodes: Api<Node>,
    leases: Api<Lease>,
    interval: Duration,
    conditions_dir: PathBuf,
    provider_id: Option<String>,
    labels: BTreeMap<String, String>,
    resources: BTreeMap<String, Quantity>,
    addresses: Vec<NodeAddress>,
    node_info: NodeSystemInfo,
    /// Heartbeats since the last status write.
    beats_since_status: u32,
    /// The status needs writing at the next heartbeat (after a conflict, or an adopted Node).
    force_status: bool,
    /// The reported fields as the server returned them after the last status write (the server may normalize
    /// quantities): a Node whose fields differ gets them again.
    written: Option<Value>,
    /// The condition files of the last heartbeat, to log changes.
    files: BTreeMap<String, FileCondition>,
    /// Ignored files already warned about, with why.
    warned: BTreeMap<PathBuf, String>,
}

impl Agent {
    fn new(settings: &Settings, client: Client) -> Self {
        let name = settings.node_name.clone();
        let resources = BTreeMap::from([
            ("cpu".to_owned(), Quantity(settings.cpu.clone())),
            ("memory".to_owned(), Quantity(settings.memory.clone())),
            ("pods".to_owned(), Quantity(MAX_PODS.to_owned())),
        ]);
        let labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), name.clone()),
            ("kubernetes.io/os".to_owned(), go_os().to_owned()),
            ("kubernetes.io/arch".to_owned(), go_arch().to_owned()),
        ]);
        let addresses = vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: "127.0.0.1".into(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: name.clone(),
            },
        ];
        let node_info = NodeSystemInfo {
            architecture: go_arch().into(),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            container_runtime_version: String::new(),
            kernel_version: read_trimmed("/proc/sys/kernel/osrelease"),
            kube_proxy_version: String::new(),
            kubelet_version: format!("mcm-node-agent/{}", env!("CARGO_PKG_VERSION")),
            machine_id: String::new(),
            operating_system: go_os().into(),
            os_image: os_image(),
            swap: None,
            system_uuid: String::new(),
        };
        Self {
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client, LEASE_NAMESPACE),
            name,
            interval: settings.heartbeat_interval,
            conditions_dir: settings.machine_dir.join(CONDITIONS_DIR),
            provider_id: settings.provider_id.clone(),
            labels,
            resources,
            addresses,
            node_info,
            beats_since_status: 0,
            force_status: false,
            written: None,
            files: BTreeMap::new(),
            warned: BTreeMap::new(),
        }
    }

    /// Registers the Node (retrying until it works), then heartbeats until the Node is gone; never returns
    /// otherwise (the caller stops it on a signal).
    async fn run(&mut self) {
        let mut backoff = Backoff::new();
        loop {
            let files = self.condition_files();
            match tokio::time::timeout(self.request_timeout(), self.register(&files)).await {
                Ok(Ok(())) => break,
                Ok(Err(err)) => {
                    let delay = backoff.next();
                    tracing::warn!(error = %err, retry_in = ?delay, "registering the node failed");
                    tokio::time::sleep(delay).await;
                }
                Err(_) => tracing::warn!("registering the node timed out; retrying"),
            }
        }
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match tokio::time::timeout(self.request_timeout(), self.beat()).await {
                Ok(Ok(Beat::Alive)) => {}
                Ok(Ok(Beat::NodeGone)) => {
                    tracing::warn!(
                        "the node was deleted: heartbeats stop (it is not registered again); waiting for SIGTERM"
                    );
                    std::future::pending::<()>().await;
                }
                Ok(Err(err)) => tracing::warn!(error = %err, "heartbeat failed"),
                Err(_) => tracing::warn!(timeout = ?self.request_timeout(), "heartbeat timed out"),
            }
        }
    }

    /// How long the requests of one heartbeat may take.
    fn request_timeout(&self) -> Duration {
        self.interval.max(Duration::from_secs(10))
    }

    /// The condition files now; logs what changed since the last look and newly ignored files.
    fn condition_files(&mut self) -> BTreeMap<String, FileCondition> {
        let mut problems = BTreeMap::new();
        let files = read_condition_files(&self.conditions_dir, &mut problems);
        for (path, why) in &problems {
            if self.warned.get(path) != Some(why) {
                tracing::warn!(file = %path.display(), reason = %why, "condition file ignored");
            }
        }
        self.warned = problems;
        for (type_, file) in &files {
            if self.files.get(type_) != Some(file) {
                tracing::info!(condition = %type_, status = %file.status, file = %file.path.display(), "condition set by file");
            }
        }
        for (type_, file) in &self.files {
            if !files.contains_key(type_) {
                tracing::info!(condition = %type_, file = %file.path.display(), "condition file removed");
            }
        }
        self.files.clone_from(&files);
        files
    }

    /// The reported fields besides the conditions, as JSON (to compare with what the server has).
    fn reported_fields(status: &NodeStatus) -> Value {
        json!({
            "capacity": status.capacity,
            "allocatable": status.allocatable,
            "addresses": status.addresses,
            "nodeInfo": status.node_info,
        })
    }

    fn status(&self, conditions: Vec<NodeCondition>) -> NodeStatus {
        NodeStatus {
            capacity: Some(self.resources.clone()),
            allocatable: Some(self.resources.clone()),
            addresses: Some(self.addresses.clone()),
            node_info: Some(self.node_info.clone()),
            conditions: Some(conditions),
            ..NodeStatus::default()
        }
    }

    /// Creates the Node with its full status, or brings an existing one's labels and providerID up to date (its
    /// status follows at the first heartbeat).
    async fn register(&mut self, files: &BTreeMap<String, FileCondition>) -> anyhow::Result<()> {
        let now = Timestamp::now();
        let node = Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(self.labels.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                provider_id: self.provider_id.clone(),
                ..NodeSpec::default()
            }),
            status: Some(self.status(merged_conditions(&[], &reported_conditions(files), now))),
        };
        match self.nodes.create(&PostParams::default(), &node).await {
            Ok(created) => {
                tracing::info!(
                    provider_id = self.provider_id.as_deref().unwrap_or_default(),
                    "node registered"
                );
                self.written = created.status.as_ref().map(Self::reported_fields);
                self.beats_since_status = 0;
                return Ok(());
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(err) => return Err(err.into()),
        }
        let existing = self.nodes.get(&self.name).await?;
        if existing.metadata.deletion_timestamp.is_some() {
            anyhow::bail!("a Node of this name exists and is being deleted");
        }
        let mut patch = serde_json::Map::new();
        let labels = existing.metadata.labels.clone().unwrap_or_default();
        let missing: BTreeMap<&String, &String> = self
            .labels
            .iter()
            .filter(|(k, v)| labels.get(*k) != Some(*v))
            .collect();
        if !missing.is_empty() {
            patch.insert("metadata".into(), json!({ "labels": missing }));
        }
        let current_id = existing.spec.as_ref().and_then(|s| s.provider_id.as_deref());
        match (current_id.filter(|id| !id.is_empty()), &self.provider_id) {
            (None, Some(wanted)) => {
                patch.insert("spec".into(), json!({ "providerID": wanted }));
            }
            (Some(current), Some(wanted)) if current != wanted => tracing::warn!(
                current,
                wanted = %wanted,
                "the existing node has another providerID, which cannot change; it is kept"
            ),
            _ => {}
        }
        if !patch.is_empty() {
            self.nodes
                .patch(
                    &self.name,
                    &PatchParams::default(),
                    &Patch::Merge(Value::Object(patch)),
                )
                .await?;
        }
        tracing::info!("node exists already (agent restart): updated, status follows");
        self.force_status = true;
        Ok(())
    }

    /// One heartbeat: the Lease, then the status when it changed or is due.
    async fn beat(&mut self) -> anyhow::Result<Beat> {
        let files = self.condition_files();
        let Some(node) = self.nodes.get_opt(&self.name).await? else {
            return Ok(Beat::NodeGone);
        };
        let uid = node.metadata.uid.clone().unwrap_or_default();
        let lease = self.renew_lease(&uid).await;
        self.beats_since_status = self.beats_since_status.saturating_add(1);
        let status = self.write_status_if_needed(&node, &files).await;
        lease?;
        status?;
        Ok(Beat::Alive)
    }

    async fn renew_lease(&self, uid: &str) -> anyhow::Result<()> {
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: self.name.clone(),
            uid: uid.to_owned(),
            ..OwnerReference::default()
        };
        let spec = LeaseSpec {
            holder_identity: Some(self.name.clone()),
            lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        };
        let patch = json!({ "metadata": { "ownerReferences": [owner] }, "spec": spec });
        match self
            .leases
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(LEASE_NAMESPACE.into()),
                        owner_references: Some(vec![owner]),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                match self.leases.create(&PostParams::default(), &lease).await {
                    Ok(_) => {
                        tracing::info!("lease created");
                        Ok(())
                    }
                    // Created meanwhile (another agent of this name would be a misconfiguration).
                    Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
                    Err(err) => Err(anyhow::Error::new(err).context("creating the lease")),
                }
            }
            Err(err) => Err(anyhow::Error::new(err).context("renewing the lease")),
        }
    }

    async fn write_status_if_needed(
        &mut self,
        node: &Node,
        files: &BTreeMap<String, FileCondition>,
    ) -> anyhow::Result<()> {
        let current = node.status.clone().unwrap_or_default();
        let current_conditions = current.conditions.clone().unwrap_or_default();
        let now = Timestamp::now();
        let conditions = merged_conditions(&current_conditions, &reported_conditions(files), now);
        let changed = fingerprint(&conditions) != fingerprint(&current_conditions)
            || self.written.as_ref() != Some(&Self::reported_fields(&current));
        if !changed && !self.force_status && self.beats_since_status < STATUS_EVERY {
            return Ok(());
        }
        let patch = json!({
            "metadata": { "resourceVersion": node.metadata.resource_version },
            "status": self.status(conditions),
        });
        match self
            .nodes
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => {
                if changed {
                    tracing::debug!("node status updated");
                }
                self.written = written.status.as_ref().map(Self::reported_fields);
                self.beats_since_status = 0;
                self.force_status = false;
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Changed meanwhile: the next heartbeat reads it again.
                self.force_status = true;
                Ok(())
            }
            Err(err) => {
                self.force_status = true;
                Err(anyhow::Error::new(err).context("writing the node status"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_recognized() {
        for good in ["2", "500m", "4Gi", "1.5", "16318412Ki", "1e3", "+1", "0.5G"] {
            assert!(is_quantity(good), "{good}");
        }
        for bad in ["", "Gi", "4 Gi", "4GB", "1..2", "abc", "1e"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn tokens_have_the_bootstrap_shape() {
        assert!(Token::parse("abcdef.0123456789abcdef").is_some());
        for bad in [
            "abcdef",
            "abcde.0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "<<BOOTSTRAP_TOKEN>>",
        ] {
            assert!(Token::parse(bad).is_none(), "{bad}");
        }
        assert_eq!(
            format!("{:?}", TokenArg("abcdef.0123456789abcdef".into())),
            "[redacted]"
        );
    }

    #[test]
    fn files_override_built_ins_and_add_conditions_and_others_are_kept() {
        let files = BTreeMap::from([
            (
                "Ready".to_owned(),
                FileCondition {
                    status: "False".into(),
                    path: "/m/conditions/Ready".into(),
                },
            ),
            (
                "KernelDeadlock".to_owned(),
                FileCondition {
                    status: "True".into(),
                    path: "/m/conditions/KernelDeadlock".into(),
                },
            ),
        ]);
        let reported = reported_conditions(&files);
        let types: Vec<&str> = reported.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            [
                "MemoryPressure",
                "DiskPressure",
                "PIDPressure",
                "Ready",
                "KernelDeadlock"
            ]
        );
        assert_eq!(reported[3].status, "False");
        assert_eq!(reported[3].reason.as_deref(), Some(FILE_REASON));
        let then = Timestamp::from_second(1_000).unwrap();
        let now = Timestamp::from_second(2_000).unwrap();
        let mut stale = condition(
            "OldFile",
            "True",
            FILE_REASON,
            "set by the file /m/conditions/OldFile",
        );
        stale.last_transition_time = Some(Time(then));
        let mut foreign = condition("NetworkUnavailable", "False", "RouteCreated", "routes");
        foreign.last_transition_time = Some(Time(then));
        let mut ready = condition("MemoryPressure", "False", "x", "y");
        ready.last_transition_time = Some(Time(then));
        let merged = merged_conditions(&[stale, foreign.clone(), ready], &reported, now);
        let types: Vec<&str> = merged.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            [
                "MemoryPressure",
                "DiskPressure",
                "PIDPressure",
                "Ready",
                "KernelDeadlock",
                "NetworkUnavailable"
            ]
        );
        assert_eq!(
            merged[0].last_transition_time,
            Some(Time(then)),
            "unchanged status keeps its transition"
        );
        assert_eq!(merged[0].last_heartbeat_time, Some(Time(now)));
        assert_eq!(merged[3].last_transition_time, Some(Time(now)));
        assert_eq!(merged[5], foreign);
    }

    #[test]
    fn condition_files_are_read_and_bad_ones_reported() {
        let dir = std::env::temp_dir().join(format!("mcm-node-agent-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("KernelDeadlock"), "True\n").unwrap();
        std::fs::write(dir.join("Ready"), " False ").unwrap();
        std::fs::write(dir.join("Broken"), "maybe").unwrap();
        std::fs::write(dir.join(".hidden"), "True").unwrap();
        std::fs::write(dir.join("bad~name"), "True").unwrap();
        let mut problems = BTreeMap::new();
        let files = read_condition_files(&dir, &mut problems);
        let _ = std::fs::remove_dir_all(&dir);
        let statuses: Vec<(&str, &str)> = files
            .iter()
            .map(|(t, f)| (t.as_str(), f.status.as_str()))
            .collect();
        assert_eq!(statuses, [("KernelDeadlock", "True"), ("Ready", "False")]);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn pem_and_der_of_a_generated_certificate_are_read() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:n1");
        params.not_after = rcgen::date_time_ymd(2040, 5, 6);
        let cert = params.self_signed(&key).unwrap();
        let info = certificate_of(&cert.pem()).unwrap();
        assert_eq!(info.common_name.as_deref(), Some("system:node:n1"));
        assert_eq!(info.not_after.to_string(), "2040-05-06T00:00:00Z");
        assert_eq!(
            info.public_key_info,
            rcgen::PublicKeyData::subject_public_key_info(&key)
        );
        let blocks = pem_blocks(&format!("{}{}", key.serialize_pem(), cert.pem()));
        assert_eq!(blocks.len(), 2);
        assert_eq!(
            to_pem(&blocks[1].0, &blocks[1].1),
            cert.pem().replace("\r\n", "\n")
        );
        assert_eq!(
            der_time(0x17, b"491231235959Z").unwrap().to_string(),
            "2049-12-31T23:59:59Z"
        );
        assert_eq!(
            der_time(0x17, b"500101000000Z").unwrap().to_string(),
            "1950-01-01T00:00:00Z"
        );
    }

    #[test]
    fn architecture_uses_go_names() {
        if cfg!(target_arch = "x86_64") {
            assert_eq!(go_arch(), "amd64");
        }
        assert_eq!(go_os(), "linux");
    }
}
