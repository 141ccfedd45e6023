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
//! **In-place updates**: asked to apply one (node condition `InPlaceUpdate` reason `ReadyForUpdate`, no
//! `node.machine.sapcloud.io/update-result` yet), the agent applies the target its Node carries (the annotation
//! `node.machine.sapcloud.io/in-place-update-target`): `cpu` and `memory` from the class's `nodeTemplate.capacity`,
//! the instance-type label from its `instanceType`, saved in `<machine-dir>/in-place-update.json`; it writes the
//! status, then answers `update-result=successful`. A target it cannot apply is answered `update-result=failed` with
//! the annotation `update-failed-reason` naming what is missing, at once (`in_place`).
//!
//! **Exit codes.** SIGTERM or SIGINT: heartbeats stop and the agent exits 0 (the Node stays; the machine controller
//! deletes it). A misconfiguration (a missing or invalid flag or variable, an unreadable CA, a malformed token, no
//! token and no saved certificate) exits 2 with a message naming the flag and its variable. A refused token, a
//! denied request or no certificate within `--bootstrap-timeout` exit 1 with the API server's reason.
//!
//! The token, the key and the certificate never appear in a log line or a message (the token id, which names the
//! token's Secret, may).
//!
//! This file holds the entry point and what the parts share; the submodules hold the command line (`settings`),
//! the join (`join`), the credentials on disk (`credentials`), the condition files (`conditions`), in-place updates
//! (`in_place`), the host's facts (`host`) and the heartbeating agent (`agent`).

mod agent;
mod conditions;
mod credentials;
mod host;
mod in_place;
mod join;
mod settings;
#[cfg(test)]
mod tests;

use std::time::Duration;

use tracing::Instrument as _;

pub use settings::NodeAgentArgs;

use agent::Agent;
use join::join;
use settings::Settings;

/// The longest pause between retries of a failed request.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Exit code of a misconfiguration.
const EXIT_MISCONFIGURED: i32 = 2;
/// Exit code of a join the API server refused.
const EXIT_FAILED: i32 = 1;

/// Why the agent stops with an error.
#[derive(Debug)]
enum Failure {
    /// Exit 2: a flag or variable is missing or wrong.
    Misconfigured(String),
    /// Exit 1: the join failed.
    Failed(String),
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
