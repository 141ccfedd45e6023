//! The command line of `mcm node-agent` and its validation into [`Settings`]: every flag and variable checked up
//! front, so that a misconfiguration exits 2 with a message naming the flag, never the token.

use std::{fmt, path::PathBuf, time::Duration};

use clap::Args;

use super::{Failure, conditions::CONDITIONS_DIR, credentials::pem_blocks, host::host_memory};

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
pub struct TokenArg(pub(super) String);

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

/// The validated configuration.
pub(super) struct Settings {
    pub(super) node_name: String,
    pub(super) token: Option<Token>,
    pub(super) api_server: String,
    pub(super) ca_pem: String,
    pub(super) machine_dir: PathBuf,
    pub(super) provider_id: Option<String>,
    pub(super) cpu: String,
    pub(super) memory: String,
    pub(super) heartbeat_interval: Duration,
    pub(super) bootstrap_timeout: Duration,
}

/// A well-formed bootstrap token.
pub(super) struct Token {
    pub(super) id: String,
    pub(super) secret: String,
}

impl Token {
    /// `<id>.<secret>`, id `[a-z0-9]{6}`, secret `[a-z0-9]{16}`.
    pub(super) fn parse(text: &str) -> Option<Self> {
        let (id, secret) = text.trim().split_once('.')?;
        let valid = |part: &str, len: usize| {
            part.len() == len && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        };
        (valid(id, 6) && valid(secret, 16)).then(|| Self {
            id: id.to_owned(),
            secret: secret.to_owned(),
        })
    }

    pub(super) fn bearer(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }
}

/// A flag and its environment variable, for messages.
pub(super) fn flag(name: &str, variable: Option<&str>) -> String {
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
    pub(super) fn from_args(args: NodeAgentArgs) -> Result<Self, Failure> {
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
pub(super) fn is_quantity(text: &str) -> bool {
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
