//! `mcm`: the one binary of the machine controller manager.

use std::{io::Write, net::IpAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

mod provider;

/// A declarative manager of Kubernetes worker machines, compatible with machine.sapcloud.io/v1alpha1.
#[derive(Debug, Parser)]
#[command(name = "mcm", version, about, long_about = None)]
struct Cli {
    /// Log format: `text` or `json`.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions of the four kinds (MachineClass, Machine, MachineSet,
    /// MachineDeployment) as YAML, ready for `kubectl apply -f -`.
    Crds,
    /// Run the embedded Kubernetes-compatible API server alone (for provider authors and tests). It writes
    /// DATA_DIR/kubeconfig (mode 0600) for kubectl, keeps its state in DATA_DIR, and runs until SIGINT or SIGTERM.
    Apiserver(ApiserverArgs),
    /// Run the machine controller against any API server (a real cluster or `mcm apiserver`), with a built-in
    /// provider. Flags are named and defaulted as in the reference machine-controller.
    Run(Box<RunArgs>),
    /// Providers out of process: `mcm provider sim serve` serves the sim provider over gRPC; `mcm provider test`
    /// runs the conformance suite against any provider.
    Provider(provider::ProviderArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Kubeconfig of the control cluster (machines, classes, secrets).
    #[arg(long)]
    control_kubeconfig: PathBuf,
    /// Kubeconfig of the target cluster (nodes), or `none`: machines then become Available and nodes are not
    /// watched. Defaults to the control kubeconfig.
    #[arg(long)]
    target_kubeconfig: Option<String>,
    /// Namespace of the machines, classes and secrets.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// The built-in provider to drive (`sim`: in-memory machines with a simulated kubelet on the target cluster).
    #[arg(long, value_parser = ["sim"], required_unless_present = "provider_endpoint", conflicts_with = "provider_endpoint")]
    provider: Option<String>,
    /// Drive a provider out of process over gRPC instead: unix:///path/to.sock, or tcp://host:port with
    /// --provider-tls-cert, --provider-tls-key and --provider-tls-ca.
    #[arg(long)]
    provider_endpoint: Option<String>,
    /// The deadline of every call to an out-of-process provider.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    provider_call_timeout: Duration,
    /// Client certificate (PEM) for a tcp:// provider endpoint.
    #[arg(long, requires_all = ["provider_tls_key", "provider_tls_ca"])]
    provider_tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long)]
    provider_tls_key: Option<PathBuf>,
    /// The CA (PEM) that signed the provider's certificate.
    #[arg(long)]
    provider_tls_ca: Option<PathBuf>,
    /// Machines reconciled at once.
    #[arg(long, default_value_t = 50)]
    concurrent_syncs: u16,
    /// How long a machine may take from creation to a joined node before it is Failed.
    #[arg(long, default_value = "20m", value_parser = parse_duration)]
    machine_creation_timeout: Duration,
    /// How long a machine may stay Unknown before it is Failed.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    machine_health_timeout: Duration,
    /// Node condition types that make a node unhealthy unless they are False (comma-separated).
    #[arg(
        long,
        default_value = "KernelDeadlock,ReadonlyFilesystem,DiskPressure,NetworkUnavailable"
    )]
    node_conditions: String,
    /// How often a machine waiting for a change (after a provider error that is not retried) is looked at anyway.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    machine_safety_resync: Duration,
    /// How many unhealthy machines of one MachineDeployment may be replaced at once.
    #[arg(long, default_value_t = 1)]
    max_concurrent_replacements: usize,
    /// No unhealthy machine of a group is replaced while more than this share of the group is unhealthy.
    #[arg(long, default_value_t = 0.5, value_parser = parse_share)]
    max_unhealthy_share: f64,
    /// How long a drain may take before it turns into a force drain (per machine: `spec.drainTimeout`).
    #[arg(long, default_value = "2h", value_parser = parse_duration)]
    machine_drain_timeout: Duration,
    /// Eviction attempts per pod refused by a PodDisruptionBudget, at most the drain timeout divided by
    /// `--machine-evict-retry-interval` (per machine: `spec.maxEvictRetries`).
    #[arg(long, default_value_t = 360)]
    machine_max_evict_retries: i32,
    /// How long to wait for a pod's volumes to detach from the drained node (on top of its grace period).
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    machine_pv_detach_timeout: Duration,
    /// How long to wait for a pod's volumes to attach on another node before moving on.
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    machine_pv_reattach_timeout: Duration,
    /// How often a drain looks again: refused evictions are retried, pods and volumes checked (the reference's
    /// fixed 20s).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    machine_evict_retry_interval: Duration,
    /// The node this controller runs on: its machine is never drained or deleted (spec 004).
    #[arg(long, env = "NODE_NAME")]
    controller_node: Option<String>,
    /// First delay of the per-machine exponential back-off after a provider error marked for retry.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    machine_retry_backoff_base: Duration,
    /// The back-off never waits longer than this.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    machine_retry_backoff_cap: Duration,
    /// Port of `/metrics` and `/healthz`; 0 picks a free port (printed at start).
    #[arg(long, default_value_t = 10259)]
    port: u16,
    /// Address of `/metrics` and `/healthz` (all interfaces by default, as the reference, so Prometheus can scrape
    /// a pod).
    #[arg(long, default_value = "0.0.0.0")]
    address: IpAddr,
    /// While a rollout has old machines, annotate every node of the deployment
    /// `cluster-autoscaler.kubernetes.io/scale-down-disabled=true` (removed again when it completes).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    autoscaler_scaledown_annotation_during_rollout: bool,
    /// Heartbeat interval of the sim provider's simulated kubelets.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    sim_heartbeat_interval: Duration,
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
    /// How often nodes, pod grace periods and PodDisruptionBudget statuses are checked.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    node_monitor_period: Duration,
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
}

fn parse_share(text: &str) -> Result<f64, String> {
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

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds => {
            let crds = mcm_api::crd::all().context("generating the CRDs")?;
            let yaml = mcm_api::crd::to_yaml(&crds).context("writing the CRDs as YAML")?;
            std::io::stdout()
                .lock()
                .write_all(yaml.as_bytes())
                .context("writing to standard output")?;
        }
        Command::Run(args) => {
            init_logging(&cli.log_format);
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(run_controllers(*args))?;
        }
        Command::Provider(args) => provider::main(args)?,
        Command::Apiserver(args) => {
            init_logging(&cli.log_format);
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
    config.watch_delay = args.test_watch_delay;
    config.failure = (args.test_fail_share > 0.0).then_some(mcm_apiserver::hooks::Failure {
        share: args.test_fail_share,
        status: args.test_fail_status,
        writes_only: args.test_fail_writes_only,
    });
    let server = mcm_apiserver::server::ApiServer::start(config)
        .await
        .with_context(|| format!("starting the API server in {}", args.data_dir.display()))?;
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

pub(crate) async fn client_from(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let file =
        kube::config::Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("using {}", path.display()))?;
    kube::Client::try_from(config).context("building the client")
}

#[allow(clippy::too_many_lines)] // flags to settings, then one spawn per controller: flat and in one place
async fn run_controllers(args: RunArgs) -> anyhow::Result<()> {
    let control = client_from(&args.control_kubeconfig).await?;
    let target = match args.target_kubeconfig.as_deref() {
        Some("none") => None,
        Some(path) => Some(client_from(std::path::Path::new(path)).await?),
        None => Some(control.clone()),
    };
    let mut settings = mcm_core::ControllerSettings {
        machine_creation_timeout: args.machine_creation_timeout,
        machine_health_timeout: args.machine_health_timeout,
        node_conditions: mcm_core::timeouts::parse_node_conditions(&args.node_conditions),
        machine_drain_timeout: args.machine_drain_timeout,
        max_evict_retries: args.machine_max_evict_retries,
        machine_pv_detach_timeout: args.machine_pv_detach_timeout,
        machine_pv_reattach_timeout: args.machine_pv_reattach_timeout,
        evict_retry_interval: args.machine_evict_retry_interval,
        controller_node: args.controller_node.clone().filter(|n| !n.is_empty()),
        ..mcm_core::ControllerSettings::default()
    };
    settings.retry.await_change_resync = args.machine_safety_resync;
    settings.retry.backoff_base = args.machine_retry_backoff_base;
    settings.retry.backoff_cap = args.machine_retry_backoff_cap;
    settings.remediation.max_concurrent_replacements = args.max_concurrent_replacements;
    settings.remediation.max_unhealthy_share = args.max_unhealthy_share;
    let metrics = Arc::new(mcm_controllers::metrics::Metrics::new());
    let (inner, provider_name, kubelet): (Arc<dyn mcm_driver::Driver>, String, _) =
        if let Some(endpoint) = &args.provider_endpoint {
            let endpoint: mcm_grpc::Endpoint = endpoint.parse().context("--provider-endpoint")?;
            let tls = args.provider_tls_cert.clone().map(|cert| mcm_grpc::TlsFiles {
                cert,
                key: args.provider_tls_key.clone().unwrap_or_default(),
                ca: args.provider_tls_ca.clone().unwrap_or_default(),
            });
            let grpc = mcm_grpc::GrpcDriver::new(
                endpoint.clone(),
                mcm_grpc::ClientOptions {
                    call_timeout: args.provider_call_timeout,
                    tls,
                    ..mcm_grpc::ClientOptions::default()
                },
            )
            .with_context(|| format!("--provider-endpoint {endpoint}"))?;
            // The metrics name the provider as it names itself; one that is not up yet is found later by the
            // calls' back-off, and named by its endpoint meanwhile.
            let name = match tokio::time::timeout(Duration::from_secs(2), grpc.provider_info()).await {
                Ok(Ok((info, _))) => info.name,
                _ => endpoint.to_string(),
            };
            println!("mcm run: provider {name} at {endpoint}");
            (Arc::new(grpc), name, None)
        } else {
            let driver = mcm_provider_sim::SimDriver::new(mcm_provider_sim::SimConfig::default());
            let kubelet = target.as_ref().map(|target| {
                let config = mcm_provider_sim::KubeletConfig {
                    heartbeat_interval: args.sim_heartbeat_interval,
                    ..mcm_provider_sim::KubeletConfig::default()
                };
                mcm_provider_sim::Kubelet::start(&driver, target.clone(), config)
            });
            (
                Arc::new(driver),
                args.provider.clone().unwrap_or_default(),
                kubelet,
            )
        };
    let driver = Arc::new(mcm_controllers::metrics::MeteredDriver::new(
        inner,
        &provider_name,
        metrics.clone(),
    ));
    let config = mcm_controllers::machine::Config {
        namespace: args.namespace.clone(),
        settings,
        concurrency: args.concurrent_syncs,
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let stopped_when = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let (address, server) = mcm_controllers::metrics::serve(
        std::net::SocketAddr::new(args.address, args.port),
        metrics.clone(),
        stopped_when(stopped.clone()),
    )
    .await
    .with_context(|| format!("serving metrics on {}:{}", args.address, args.port))?;
    println!("mcm run: metrics and health on http://{address} (/metrics, /healthz)");
    tracing::info!(namespace = %args.namespace, provider = %provider_name, %address, "machine controller starting");
    let controller = tokio::spawn(mcm_controllers::machine::run_with_metrics(
        control.clone(),
        target.clone(),
        driver,
        config,
        Some(metrics),
        stopped_when(stopped.clone()),
    ));
    let sets = tokio::spawn(mcm_controllers::machineset::run(
        control.clone(),
        mcm_controllers::machineset::Config {
            namespace: args.namespace.clone(),
            concurrency: args.concurrent_syncs,
            resync: args.machine_safety_resync,
        },
        stopped_when(stopped.clone()),
    ));
    let deployments = tokio::spawn(mcm_controllers::machinedeployment::run(
        control.clone(),
        target.clone(),
        mcm_controllers::machinedeployment::Config {
            namespace: args.namespace.clone(),
            concurrency: args.concurrent_syncs,
            resync: args.machine_safety_resync,
            autoscaler_scale_down_annotation_during_rollout: args
                .autoscaler_scaledown_annotation_during_rollout,
        },
        stopped_when(stopped.clone()),
    ));
    let references = tokio::spawn(mcm_controllers::references::run(
        control,
        args.namespace.clone(),
        args.machine_safety_resync,
        stopped_when(stopped),
    ));
    wait_for_signal().await?;
    let _ = stop.send(true);
    controller
        .await
        .context("the machine controller stopped unexpectedly")?;
    deployments
        .await
        .context("the machine deployment controller stopped unexpectedly")?;
    sets.await
        .context("the machine set controller stopped unexpectedly")?;
    references
        .await
        .context("the class and secret finalizer controller stopped unexpectedly")?;
    let _ = server.await;
    if let Some(kubelet) = kubelet {
        kubelet.stop().await;
    }
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
