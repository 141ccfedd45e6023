//! `mcm`: the one binary of the machine controller manager.

use std::{
    io::{IsTerminal, Write},
    net::IpAddr,
    path::PathBuf,
    time::Duration,
};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

mod bench;
mod capi;
mod client;
mod examples;
mod flag_names;
mod klog_flags;
mod node_agent;
mod provider;
mod provider_call;
mod raw_objects;
mod run;
mod run_checks;
mod sim_control;
mod up;

/// A declarative manager of Kubernetes worker machines, compatible with machine.sapcloud.io/v1alpha1.
#[derive(Debug, Parser)]
#[command(name = "mcm", version, about, long_about = None)]
struct Cli {
    /// Log format: `text` (the default) or `json`. For `mcm provider ... serve` it wins over MC_LOG_FORMAT.
    #[arg(long, global = true, value_parser = ["text", "json"], value_name = "FORMAT")]
    log_format: Option<String>,
    /// Log verbosity as klog's `--v` of the reference: 0-3 info (the default 0), 4-5 debug, 6 and above trace. For
    /// `mcm provider ... serve` it wins over MC_LOG_LEVEL. RUST_LOG, when set, takes precedence over both (e.g.
    /// `RUST_LOG=mcm_controllers=debug`).
    #[arg(long = "v", short = 'v', global = true, value_name = "LEVEL")]
    verbosity: Option<u8>,
    #[command(flatten)]
    klog: klog_flags::KlogFlags,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions of the four kinds (MachineClass, Machine, MachineSet,
    /// MachineDeployment) and of the Cluster API provider's two (MCMMachine, MCMMachineTemplate) as YAML, ready for
    /// `kubectl apply -f -`.
    Crds(CrdsArgs),
    /// Print the example manifests built into this binary (the repository's examples/), ready for
    /// `mcm examples local | kubectl apply -f -` from any directory; `--list` names them, `--dir D` writes them.
    Examples(examples::ExamplesArgs),
    /// Run the embedded Kubernetes-compatible API server alone (for provider authors and tests). It writes
    /// DATA_DIR/kubeconfig (mode 0600) for kubectl, keeps its state in DATA_DIR, and runs until SIGINT or SIGTERM.
    Apiserver(ApiserverArgs),
    /// Run the machine controller against any API server (a real cluster or `mcm apiserver`), with a built-in
    /// provider. Flags are named and defaulted as in the reference machine-controller.
    Run(Box<run::RunArgs>),
    /// Providers out of process: `mcm provider sim serve` serves the sim provider over gRPC; `mcm provider test`
    /// runs the conformance suite against any provider.
    Provider(provider::ProviderArgs),
    /// The Cluster API infrastructure-machine provider: `mcm capi run` reconciles MCMMachines
    /// (infrastructure.machine.sapcloud.io) with the sim provider or any provider over gRPC (docs/cluster-api.md).
    Capi(capi::CapiArgs),
    /// The agent a machine of the local provider runs at boot: joins the cluster and heartbeats its Node.
    ///
    /// It joins with a bootstrap token (kubelet TLS bootstrapping: a CertificateSigningRequest for its own client
    /// certificate), registers its Node, renews its Lease and reports conditions, some set by files in
    /// <machine-dir>/conditions, until SIGTERM or SIGINT. Flags default to the local provider's MCM_LOCAL_*
    /// variables.
    NodeAgent(node_agent::NodeAgentArgs),
    /// The whole system on this machine, no cluster needed: the embedded API server, the local provider (machines
    /// are local process trees) and every controller, all state in --data-dir; writes DATA_DIR/kubeconfig. Stops on
    /// Ctrl-C; the next `mcm up` resumes with the machines still there. Takes the controller flags of `mcm run`.
    Up(Box<up::UpArgs>),
    /// Stop `mcm up`; with --purge also stop every machine and remove all state.
    Down(up::DownArgs),
    /// The scale benchmark: a MachineDeployment of --machines N created, rolled to another class and scaled to 0,
    /// with the controllers (`mcm run`, client rate limit off) and the sim provider as processes of their own
    /// against a fresh embedded API server (or --kubeconfig). Prints one JSON report: per phase the time, the
    /// controllers' requests and writes, their CPU and peak memory, and the time against the server's write ceiling.
    Bench(bench::BenchArgs),
}

#[derive(Debug, Args)]
struct CrdsArgs {
    /// Also print the ClusterRole (label `cluster.x-k8s.io/aggregate-to-manager: "true"`) that gives the Cluster
    /// API manager full access to MCMMachines and MCMMachineTemplates.
    #[arg(long)]
    capi_rbac: bool,
}

#[derive(Debug, Args)]
struct ApiserverArgs {
    /// Directory for the store, certificates, admin token and kubeconfig; reused across restarts.
    #[arg(long)]
    data_dir: PathBuf,
    /// Port to listen on; 0 picks a free port the first time and reuses it later with the same data dir.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Address to listen on. Loopback by default; anything else exposes the server to the network.
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// Keep objects in memory only (nothing survives a restart).
    #[arg(long)]
    in_memory: bool,
    /// How many recent changes watches can resume from; older resourceVersions get 410 Gone.
    #[arg(long, default_value_t = 10_000)]
    watch_window: usize,
    /// How often watches that ask for bookmarks get one (Go duration, e.g. 60s).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    bookmark_interval: Duration,
    /// A node whose heartbeat (Lease or Ready condition) is older than this turns Unknown, as with
    /// kube-controller-manager's flag of the same name.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    node_monitor_grace_period: Duration,
    /// How often the garbage collector looks for dependents of deleted owners (ownerReferences).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    gc_interval: Duration,
    /// Events not written for this long are deleted, as with kube-apiserver's flag of the same name.
    #[arg(long, default_value = mcm_apiserver::event_ttl::DEFAULT_EVENT_TTL_FLAG, value_parser = parse_duration)]
    event_ttl: Duration,
    /// How often nodes, pod grace periods and PodDisruptionBudget statuses are checked.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    node_monitor_period: Duration,
    /// A connection that has not completed its TLS handshake this long after it was accepted is closed.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    tls_handshake_timeout: Duration,
    /// At most this many connections are open at once; more wait in the accept backlog until one ends.
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// Test hook: deliver every watch event this much after its commit, to test controllers against a lagging
    /// cache. Off (0s) by default.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    test_watch_delay: Duration,
    /// Test hook: fail this share (0 to 1) of requests with --test-fail-status. Off (0) by default.
    #[arg(long, default_value_t = 0.0, value_parser = parse_share)]
    test_fail_share: f64,
    /// Test hook: the HTTP status of injected failures (429, 500, 503, 504, ...).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u16).range(400..600))]
    test_fail_status: u16,
    /// Test hook: inject failures into writes only (POST, PUT, PATCH, DELETE), never reads.
    #[arg(long)]
    test_fail_writes_only: bool,
    /// Test hook: store the objects of this YAML or JSON file as they are at start, with no admission or
    /// validation (as a real cluster can hold objects written by old clients, e.g. a Secret whose data is not
    /// base64). Repeatable.
    #[arg(long)]
    test_raw_object: Vec<PathBuf>,
    /// A static token file as kube-apiserver's: CSV records `token,user,uid[,"group1,group2"]`, read once at start.
    /// Its users authenticate with their bearer tokens besides the admin; a user in `system:masters` may do
    /// everything. Tokens are never logged.
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
}

pub(crate) fn parse_share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(share),
        _ => Err(format!("{text:?} is not a share between 0 and 1")),
    }
}

pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    mcm_api::GoDuration::new(text)
        .parse()
        .map_err(|err| err.to_string())
}

/// The log level of a klog verbosity.
pub(crate) fn level_of(verbosity: u8) -> &'static str {
    match verbosity {
        0..=3 => "info",
        4..=5 => "debug",
        _ => "trace",
    }
}

/// Whether log lines may carry ANSI colours: only when standard error is a terminal (never in a file, a pipe or
/// `kubectl logs`).
pub(crate) fn log_colours() -> bool {
    std::io::stderr().is_terminal()
}

/// Logging on standard error at `level` (RUST_LOG, when set, wins), as JSON lines or text.
pub(crate) fn init_logging_at(json: bool, level: &str) {
    use tracing_subscriber::{layer::SubscriberExt as _, util::SubscriberInitExt as _};
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(log_colours())
        .with_writer(std::io::stderr);
    // No kube client line may carry a response body (a Secret's values): docs/pitfalls.md.
    let no_bodies = mcm_controllers::logging::NoResponseBodies;
    if json {
        builder.json().finish().with(no_bodies).init();
    } else {
        builder.finish().with(no_bodies).init();
    }
}

/// Logging as `--log-format` and `--v` say (text, info by default).
fn init_logging(format: Option<&str>, verbosity: Option<u8>) {
    init_logging_at(format == Some("json"), level_of(verbosity.unwrap_or(0)));
}

/// Standard output was closed by its reader (`mcm crds | head`): the command ends quietly with exit 0, as a Unix
/// filter does.
#[derive(Debug)]
struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `text` to standard output and flushes it; a reader that went away is [`StdoutClosed`], which [`main`]
/// turns into a quiet exit 0. Commands that print whole documents (crds, examples) write through this.
pub(crate) fn write_stdout(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        result => result.context("writing to standard output"),
    }
}

/// `println!` to a closed standard output panics ("failed printing to stdout: Broken pipe"); that panic, and only
/// that one, ends the process quietly with exit 0 instead of a panic message and exit 101.
fn quiet_when_stdout_closes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

fn main() -> anyhow::Result<()> {
    quiet_when_stdout_closes();
    match run_command(Cli::parse_from(flag_names::normalize(std::env::args_os()))) {
        Err(err) if err.downcast_ref::<StdoutClosed>().is_some() => Ok(()),
        result => result,
    }
}

fn run_command(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crds(args) => {
            let mut crds = mcm_api::crd::all().context("generating the CRDs")?;
            crds.extend(mcm_capi::crd::all().context("generating the Cluster API CRDs")?);
            let mut yaml = mcm_api::crd::to_yaml(&crds).context("writing the CRDs as YAML")?;
            if args.capi_rbac {
                yaml.push_str(
                    &mcm_capi::crd::manager_cluster_role_yaml().context("writing the ClusterRole as YAML")?,
                );
            }
            write_stdout(&yaml)?;
        }
        Command::Examples(args) => examples::main(&args)?,
        Command::Run(args) => {
            init_logging(cli.log_format.as_deref(), cli.verbosity);
            cli.klog.warn_ignored();
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(run::run_controllers(*args))?;
        }
        Command::Provider(args) => provider::main(args, cli.log_format.as_deref(), cli.verbosity)?,
        Command::Capi(args) => {
            init_logging(cli.log_format.as_deref(), cli.verbosity);
            cli.klog.warn_ignored();
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(capi::main(args))?;
        }
        Command::Up(args) => {
            init_logging(cli.log_format.as_deref(), cli.verbosity);
            cli.klog.warn_ignored();
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(up::up(*args))?;
        }
        Command::Down(args) => up::down(args)?,
        Command::Bench(args) => {
            init_logging(cli.log_format.as_deref(), cli.verbosity);
            cli.klog.warn_ignored();
            bench::main(&args)?;
        }
        Command::NodeAgent(args) => {
            init_logging(cli.log_format.as_deref(), cli.verbosity);
            cli.klog.warn_ignored();
            std::process::exit(node_agent::main(args));
        }
        Command::Apiserver(args) => {
            init_logging(cli.log_format.as_deref(), cli.verbosity);
            cli.klog.warn_ignored();
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(run_apiserver(args))?;
        }
    }
    Ok(())
}

async fn run_apiserver(args: ApiserverArgs) -> anyhow::Result<()> {
    let mut config = mcm_apiserver::server::Config::new(&args.data_dir);
    config.port = args.port;
    config.bind = args.bind;
    config.in_memory = args.in_memory;
    config.watch_window = args.watch_window;
    config.bookmark_interval = args.bookmark_interval;
    config.node_monitor_grace_period = args.node_monitor_grace_period;
    config.node_monitor_period = args.node_monitor_period;
    config.gc_interval = args.gc_interval;
    config.event_ttl = args.event_ttl;
    config.tls_handshake_timeout = args.tls_handshake_timeout;
    config.max_connections = usize::try_from(args.max_connections).unwrap_or(usize::MAX);
    config.token_auth_file = args.token_auth_file;
    config.extra_crds = mcm_capi::crd::all().context("generating the Cluster API CRDs")?;
    config.watch_delay = args.test_watch_delay;
    config.failure = (args.test_fail_share > 0.0).then_some(mcm_apiserver::hooks::Failure {
        share: args.test_fail_share,
        status: args.test_fail_status,
        writes_only: args.test_fail_writes_only,
    });
    let server = mcm_apiserver::server::ApiServer::start(config)
        .await
        .with_context(|| format!("starting the API server in {}", args.data_dir.display()))?;
    for file in &args.test_raw_object {
        raw_objects::store(&server, file)?;
    }
    println!("mcm apiserver listening on {}", server.url());
    println!("kubeconfig: {}", server.kubeconfig().display());
    println!(
        "try: kubectl --kubeconfig {} get namespaces",
        server.kubeconfig().display()
    );
    wait_for_signal().await?;
    server.shutdown().await;
    Ok(())
}

pub(crate) async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("waiting for SIGINT")?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
