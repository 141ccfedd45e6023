//! `mcm provider ...`: providers out of process. `mcm provider sim serve` serves the sim provider over gRPC (its
//! simulated kubelets join the target cluster); `mcm provider test` runs the conformance suite against any provider.
//! A provider reads the `MC_` variables of spec 000 (`mcm_grpc::env`); a flag given on the command line wins.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Args, Subcommand};
use mcm_driver::DriverMethod;
use mcm_grpc::{ProviderEnv, ProviderInfo};

/// `mcm provider`.
#[derive(Debug, Args)]
pub struct ProviderArgs {
    #[command(subcommand)]
    command: ProviderCommand,
}

#[derive(Debug, Subcommand)]
enum ProviderCommand {
    /// The sim provider: in-memory VMs whose simulated kubelets register nodes on the target cluster.
    Sim {
        #[command(subcommand)]
        command: SimCommand,
    },
    /// The local provider: machines are local process trees that boot from userData (the default of `mcm up`).
    Local {
        #[command(subcommand)]
        command: LocalCommand,
    },
    /// The AWS provider: EC2 instances from Gardener's AWS MachineClasses (docs/providers/aws.md).
    Aws {
        #[command(subcommand)]
        command: AwsCommand,
    },
    /// Run the provider conformance suite against a live provider: identity and probe, CreateMachine (and its
    /// idempotency), GetMachineStatus, ListMachines, InitializeMachine (and Uninitialized until it succeeds), an
    /// invalid providerSpec, error messages, DeleteMachine (and its idempotency), NotFound after deletion,
    /// GetVolumeIDs. Creates and deletes machines
    /// named <name-prefix>-<n> with the class given (default: the built-in local example's class and secret, see
    /// `mcm examples local`). Exit code 0 when no check failed, 1 otherwise.
    Test(TestArgs),
    /// Call one Driver method of a live provider and print its answer (see `mcm provider call --help`): `list`
    /// prints each VM's providerID and machine name. A provider error prints its machine code and message (secret
    /// values redacted) and exits 1; bad usage exits 2.
    Call(crate::provider_call::CallArgs),
}

#[derive(Debug, Args)]
struct TestArgs {
    /// The provider's endpoint (else MC_ENDPOINT): unix:///path/to.sock or tcp://host:port.
    #[arg(long, env = "MC_ENDPOINT")]
    endpoint: String,
    /// A valid MachineClass of the provider (YAML or JSON file). Default: the built-in example
    /// examples/local/01-machine-class.yaml (class local-small, whose providerSpec the sim and local providers take).
    #[arg(long, requires = "secret")]
    class: Option<PathBuf>,
    /// The class's Secret (YAML or JSON file; never printed). Default: the built-in example
    /// examples/local/00-secret.yaml.
    #[arg(long, requires = "class")]
    secret: Option<PathBuf>,
    /// The report: `text` (a line per check) or `json` (one JSON object on stdout, nothing else: each check's id,
    /// the spec sentence it checks, its result `pass`, `fail` or `skip` and its message, and the verdict).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Machines are named <name-prefix>-<n>.
    #[arg(long, default_value = "mcm-conformance")]
    name_prefix: String,
    /// How to reach the provider.
    #[command(flatten)]
    client: ClientArgs,
}

/// How `mcm provider test` and `mcm provider call` reach a live provider: the call deadline and, for tcp://, TLS.
#[derive(Args, Debug)]
pub(crate) struct ClientArgs {
    /// The deadline of each call.
    #[arg(long, default_value = "1m", value_parser = crate::parse_duration)]
    call_timeout: Duration,
    /// Client certificate (PEM) for a tcp:// endpoint.
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// The CA (PEM) of the provider's certificate.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
}

impl ClientArgs {
    /// A gRPC driver for `endpoint` with these options.
    pub(crate) fn driver(self, endpoint: &mcm_grpc::Endpoint) -> anyhow::Result<mcm_grpc::GrpcDriver> {
        let tls = self.tls_cert.map(|cert| mcm_grpc::TlsFiles {
            cert,
            key: self.tls_key.unwrap_or_default(),
            ca: self.tls_ca.unwrap_or_default(),
        });
        mcm_grpc::GrpcDriver::new(
            endpoint.clone(),
            mcm_grpc::ClientOptions {
                call_timeout: self.call_timeout,
                tls,
                ..mcm_grpc::ClientOptions::default()
            },
        )
        .with_context(|| format!("--endpoint {endpoint}"))
    }
}

/// The format of `mcm provider test`'s report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    /// One line per check, then a summary.
    Text,
    /// One JSON object.
    Json,
}

#[derive(Debug, Subcommand)]
enum SimCommand {
    /// Serve the sim provider over gRPC on MC_ENDPOINT (or --endpoint) until SIGINT or SIGTERM. Environment:
    /// MC_ENDPOINT (REQUIRED), MC_TLS_CERT_FILE, MC_TLS_KEY_FILE, MC_TLS_CLIENT_CA_FILE (REQUIRED for tcp://),
    /// MC_LOG_FORMAT (text|json), MC_LOG_LEVEL.
    Serve(SimServeArgs),
}

#[derive(Debug, Subcommand)]
enum LocalCommand {
    /// Serve the local provider over gRPC on MC_ENDPOINT (or --endpoint) until SIGINT or SIGTERM. Machines keep
    /// running when it stops; a restarted provider finds them in --state-dir. Environment: MC_ENDPOINT (REQUIRED),
    /// MC_TLS_* (REQUIRED for tcp://), MC_LOG_FORMAT, MC_LOG_LEVEL.
    Serve(LocalServeArgs),
}

#[derive(Debug, Subcommand)]
enum AwsCommand {
    /// Serve the AWS provider over gRPC on MC_ENDPOINT (or --endpoint) until SIGINT or SIGTERM. Credentials come
    /// from each class's Secret. Environment: MC_ENDPOINT (REQUIRED), MC_TLS_* (REQUIRED for tcp://),
    /// MC_LOG_FORMAT, MC_LOG_LEVEL, and AWS_ENDPOINT_URL_EC2 / AWS_ENDPOINT_URL_STS / AWS_ENDPOINT_URL to point the
    /// provider at another EC2 (an emulator, a private cloud).
    Serve(AwsServeArgs),
}

#[derive(Debug, Args)]
struct AwsServeArgs {
    /// Where to serve (overrides MC_ENDPOINT): unix:///path/to.sock or tcp://host:port.
    #[arg(long)]
    endpoint: Option<String>,
    /// Serve the provider-side metrics (`mcm_cloud_api_requests_total`, ...) on http://<address>/metrics
    /// (port 0 picks a free one; the address is printed). Not served when absent.
    #[arg(long)]
    metrics_address: Option<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
struct LocalServeArgs {
    /// Where to serve (overrides MC_ENDPOINT): unix:///path/to.sock or tcp://host:port.
    #[arg(long)]
    endpoint: Option<String>,
    /// Where the machines live (under `machines/`, one directory each: state, userData, log).
    #[arg(long)]
    state_dir: PathBuf,
    /// The cluster machines join (URL of its API server), given to each machine.
    #[arg(long)]
    api_server: String,
    /// The cluster's CA certificate (PEM), given to each machine.
    #[arg(long)]
    ca_file: PathBuf,
    /// Directory put first on the machines' PATH (where `mcm` is; default: this binary's directory).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// How often the machines' node agents heartbeat.
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    node_heartbeat_interval: Duration,
    /// Exit when this process, the parent (`mcm up` passes its own pid), exits; the machines keep running.
    #[arg(long)]
    parent_pid: Option<i32>,
}

#[derive(Debug, Args)]
struct SimServeArgs {
    /// Where to serve (overrides MC_ENDPOINT): unix:///path/to.sock or tcp://host:port.
    #[arg(long)]
    endpoint: Option<String>,
    /// Kubeconfig of the cluster the simulated kubelets register their nodes on; without it VMs never join.
    #[arg(long)]
    target_kubeconfig: Option<PathBuf>,
    /// Heartbeat interval of the simulated kubelets.
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    sim_heartbeat_interval: Duration,
    /// Test only: the first call of each method for each machine fails with a retryable code and a message quoting
    /// the whole request (secret values, userData, bootstrap token; raw and base64), as some cloud APIs do. For
    /// testing that the controllers redact provider messages; never in production.
    #[arg(long)]
    echo_requests: bool,
    /// Test only: serve the fault-injection control endpoint on this loopback address (port 0 picks a free one; the
    /// address is printed): POST/DELETE /faults, PUT /latency, PUT /reachable, GET /calls (docs/provider-sim.md). It has no
    /// authentication, so a non-loopback address is refused. Not served when absent.
    #[arg(long)]
    control_address: Option<std::net::SocketAddr>,
}

/// Runs `mcm provider ...`; the exit code is 2 for a misconfigured provider (spec 000: fail fast). `--log-format`
/// and `--v`, when given, win over MC_LOG_FORMAT and MC_LOG_LEVEL.
pub fn main(args: ProviderArgs, log_format: Option<&str>, verbosity: Option<u8>) -> anyhow::Result<()> {
    let start_logging = |env: &ProviderEnv| init_provider_logging(env, log_format, verbosity);
    match args.command {
        ProviderCommand::Sim {
            command: SimCommand::Serve(args),
        } => {
            let env = provider_env(args.endpoint.as_ref(), "mcm provider sim serve");
            start_logging(&env);
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(serve_sim(args, env))
        }
        ProviderCommand::Local {
            command: LocalCommand::Serve(args),
        } => {
            if let Some(parent) = args.parent_pid {
                crate::up::exit_with_parent(parent)?;
            }
            let env = provider_env(args.endpoint.as_ref(), "mcm provider local serve");
            start_logging(&env);
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(serve_local(args, env))
        }
        ProviderCommand::Aws {
            command: AwsCommand::Serve(args),
        } => {
            let env = provider_env(args.endpoint.as_ref(), "mcm provider aws serve");
            start_logging(&env);
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(serve_aws(env, args.metrics_address))
        }
        ProviderCommand::Test(args) => {
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            if !runtime.block_on(conformance(args))? {
                std::process::exit(1);
            }
            Ok(())
        }
        ProviderCommand::Call(args) => crate::provider_call::main(args),
    }
}

/// The provider's `MC_` variables (a flag wins over MC_ENDPOINT); a misconfiguration exits 2 naming the variable.
fn provider_env(endpoint: Option<&String>, command: &str) -> ProviderEnv {
    match ProviderEnv::from_lookup(|name| {
        if name == "MC_ENDPOINT" && endpoint.is_some() {
            endpoint.cloned()
        } else {
            std::env::var(name).ok()
        }
    }) {
        Ok(env) => env,
        Err(err) => {
            eprintln!("{command}: misconfigured: {err}");
            std::process::exit(2);
        }
    }
}

async fn serve_local(args: LocalServeArgs, env: ProviderEnv) -> anyhow::Result<()> {
    let bin_dir = match args.bin_dir {
        Some(dir) => dir,
        None => std::env::current_exe()
            .context("finding this binary")?
            .parent()
            .map(std::path::Path::to_path_buf)
            .context("the directory of this binary")?,
    };
    let driver = mcm_provider_local::LocalDriver::new(mcm_provider_local::LocalConfig {
        heartbeat_interval: args.node_heartbeat_interval,
        ..mcm_provider_local::LocalConfig::new(args.state_dir, bin_dir, args.api_server, args.ca_file)
    })
    .context("preparing the local provider")?;
    println!("mcm provider local: serving on {}", env.endpoint);
    let info = ProviderInfo {
        name: "local".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        optional_methods: mcm_provider_local::optional_methods(),
    };
    let result = mcm_grpc::serve(Arc::new(driver), info, &env.endpoint, env.tls.as_ref(), async {
        let _ = crate::wait_for_signal().await;
    })
    .await;
    serve_result(result, "mcm provider local serve")
}

async fn serve_aws(env: ProviderEnv, metrics_address: Option<std::net::SocketAddr>) -> anyhow::Result<()> {
    let config = mcm_provider_aws::AwsConfig::from_env();
    if let Some(endpoint) = &config.ec2_endpoint {
        tracing::info!(ec2_endpoint = %endpoint, "EC2 endpoint overridden");
    }
    let driver = mcm_provider_aws::AwsDriver::new(config);
    if let Some(address) = metrics_address {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("--metrics-address {address}"))?;
        println!(
            "mcm provider aws: metrics on http://{}/metrics",
            listener.local_addr()?
        );
        tokio::spawn(serve_metrics(listener, driver.metrics()));
    }
    println!("mcm provider aws: serving on {}", env.endpoint);
    let result = mcm_grpc::serve(
        Arc::new(driver),
        aws_info(),
        &env.endpoint,
        env.tls.as_ref(),
        async {
            let _ = crate::wait_for_signal().await;
        },
    )
    .await;
    serve_result(result, "mcm provider aws serve")
}

/// Answers every HTTP request on `listener` with the metrics text (one request per connection).
async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<mcm_provider_aws::metrics::CloudApiMetrics>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    while let Ok((mut stream, _)) = listener.accept().await {
        let metrics = metrics.clone();
        tokio::spawn(async move {
            // Read the whole head before answering: closing on a half-sent request breaks the client's pipe.
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&chunk[..n]),
                }
            }
            let found = request.starts_with(b"GET /metrics ");
            let (status, body) = if found {
                ("200 OK", metrics.encode())
            } else {
                ("404 Not Found", "not found\n".to_owned())
            };
            let answer = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
        });
    }
}

/// The identity of the AWS provider.
pub fn aws_info() -> ProviderInfo {
    ProviderInfo {
        name: "aws".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        optional_methods: mcm_provider_aws::optional_methods(),
    }
}

/// A serve error that is a misconfiguration exits 2; others are errors.
fn serve_result(result: Result<(), mcm_grpc::ServeError>, command: &str) -> anyhow::Result<()> {
    match result {
        Ok(()) => Ok(()),
        Err(
            err @ (mcm_grpc::ServeError::InUse(_)
            | mcm_grpc::ServeError::TlsRequired
            | mcm_grpc::ServeError::Tls(_)),
        ) => {
            eprintln!("{command}: misconfigured: {err}");
            std::process::exit(2);
        }
        Err(err) => Err(err).with_context(|| format!("{command}: serving")),
    }
}

/// Reads a Kubernetes object from a YAML or JSON file (or, without a file, the built-in example), naming the file
/// in errors.
pub(crate) fn read_object<T: serde::de::DeserializeOwned>(
    path: Option<&std::path::Path>,
    what: &str,
    example: &str,
) -> anyhow::Result<T> {
    let Some(path) = path else {
        let example = crate::examples::Set::Local.manifest(example)?;
        return serde_saphyr::from_str(example.text)
            .with_context(|| format!("the built-in example {} is not a valid {what}", example.name));
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--{what}: reading {}", path.display()))?;
    serde_saphyr::from_str(&text)
        .with_context(|| format!("--{what}: {} is not a valid {what}", path.display()))
}

async fn conformance(args: TestArgs) -> anyhow::Result<bool> {
    let endpoint: mcm_grpc::Endpoint = args.endpoint.parse().context("--endpoint")?;
    let input = mcm_grpc::conformance::Input {
        class: read_object(args.class.as_deref(), "class", "01-machine-class.yaml")?,
        secret: read_object(args.secret.as_deref(), "secret", "00-secret.yaml")?,
        name_prefix: args.name_prefix,
    };
    let built_in = args.class.is_none();
    let driver = args.client.driver(&endpoint)?;
    let class = input.class.metadata.name.clone().unwrap_or_default();
    if args.output == Output::Text {
        println!("mcm provider test: {endpoint}");
        if built_in {
            println!(
                "mcm provider test: class {class} and its secret from the built-in local examples (`mcm examples \
                 local`)"
            );
        }
    }
    let checks = mcm_grpc::conformance::run(&driver, &input).await;
    let passed = mcm_grpc::conformance::passed(&checks);
    let report = match args.output {
        Output::Text => mcm_grpc::conformance::render(&checks),
        Output::Json => {
            let mut json = serde_json::to_string_pretty(&json_report(&endpoint, &class, &checks, passed))
                .context("writing the report as JSON")?;
            json.push('\n');
            json
        }
    };
    std::io::Write::write_all(&mut std::io::stdout().lock(), report.as_bytes())
        .context("writing the report to standard output")?;
    Ok(passed)
}

/// The report of `mcm provider test --output json`: the endpoint, the class used, whether the provider conforms
/// (no check failed), the counts, and each check.
#[derive(Debug, serde::Serialize)]
struct JsonReport<'a> {
    endpoint: String,
    class: &'a str,
    conforms: bool,
    summary: Summary,
    checks: Vec<JsonCheck<'a>>,
}

/// How many checks had each result.
#[derive(Debug, serde::Serialize)]
struct Summary {
    passed: usize,
    failed: usize,
    skipped: usize,
}

/// One check: its id, its `result` (`pass`, `fail` or `skip`), its `message` (what was seen, or why it was skipped;
/// empty for a pass) and the spec sentence it checks (`requirement`).
#[derive(Debug, serde::Serialize)]
struct JsonCheck<'a> {
    id: &'static str,
    result: &'static str,
    message: &'a str,
    requirement: &'static str,
}

fn json_report<'a>(
    endpoint: &mcm_grpc::Endpoint,
    class: &'a str,
    checks: &'a [mcm_grpc::conformance::Check],
    passed: bool,
) -> JsonReport<'a> {
    let checks: Vec<JsonCheck<'a>> = checks
        .iter()
        .map(|check| {
            let (result, message) = outcome_result(&check.outcome);
            JsonCheck {
                id: check.name,
                result,
                message,
                requirement: check.requirement,
            }
        })
        .collect();
    let count = |result: &str| checks.iter().filter(|check| check.result == result).count();
    JsonReport {
        endpoint: endpoint.to_string(),
        class,
        conforms: passed,
        summary: Summary {
            passed: count("pass"),
            failed: count("fail"),
            skipped: count("skip"),
        },
        checks,
    }
}

/// The `result` and `message` of an outcome in the JSON report.
fn outcome_result(outcome: &mcm_grpc::conformance::Outcome) -> (&'static str, &str) {
    use mcm_grpc::conformance::Outcome;
    match outcome {
        Outcome::Passed => ("pass", ""),
        Outcome::Failed(detail) => ("fail", detail),
        Outcome::Skipped(detail) => ("skip", detail),
    }
}

/// A provider logs as `--log-format`/`--v` say, else as MC_LOG_FORMAT/MC_LOG_LEVEL say (RUST_LOG wins over both).
fn init_provider_logging(env: &ProviderEnv, log_format: Option<&str>, verbosity: Option<u8>) {
    let json = log_format.map_or(env.log_json, |format| format == "json");
    let level = verbosity.map_or(env.log_level.as_str(), |v| crate::level_of(v));
    crate::init_logging_at(json, level);
}

/// The optional calls the sim provider implements.
pub fn sim_info() -> ProviderInfo {
    ProviderInfo {
        name: "sim".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        optional_methods: vec![
            DriverMethod::InitializeMachine,
            DriverMethod::GetMachineStatus,
            DriverMethod::ListMachines,
            DriverMethod::GetVolumeIds,
            DriverMethod::GenerateMachineClassForMigration,
        ],
    }
}

async fn serve_sim(args: SimServeArgs, env: ProviderEnv) -> anyhow::Result<()> {
    let driver = mcm_provider_sim::SimDriver::new(mcm_provider_sim::SimConfig::default());
    let kubelet = match &args.target_kubeconfig {
        Some(path) => {
            let client = crate::client::from_kubeconfig(path).await?;
            let config = mcm_provider_sim::KubeletConfig {
                heartbeat_interval: args.sim_heartbeat_interval,
                ..mcm_provider_sim::KubeletConfig::default()
            };
            Some(mcm_provider_sim::Kubelet::start(&driver, client, config))
        }
        None => None,
    };
    // Whether the provider serves (the control endpoint's PUT /reachable turns it off and on) and whether it stops.
    let (reachable, mut reachable_now) = tokio::sync::watch::channel(true);
    let control = match args.control_address {
        Some(address) => match crate::sim_control::start(address, driver.faults(), reachable).await {
            Ok((local, task)) => {
                println!("mcm provider sim: control on http://{local}");
                Some(task)
            }
            Err(err) => {
                eprintln!("mcm provider sim serve: misconfigured: {err:#}");
                std::process::exit(2);
            }
        },
        None => None,
    };
    let (quit, mut quitting) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = crate::wait_for_signal().await;
        let _ = quit.send(true);
    });
    let served: Arc<dyn mcm_driver::Driver> = if args.echo_requests {
        tracing::warn!("--echo-requests: provider errors quote whole requests, secrets included (test only)");
        Arc::new(mcm_provider_sim::EchoRequests::new(driver))
    } else {
        Arc::new(driver)
    };
    let result = loop {
        println!("mcm provider sim: serving on {}", env.endpoint);
        let (mut stop, mut off) = (quitting.clone(), reachable_now.clone());
        let result = mcm_grpc::serve(
            served.clone(),
            sim_info(),
            &env.endpoint,
            env.tls.as_ref(),
            async move {
                tokio::select! {
                    _ = stop.wait_for(|quit| *quit) => {}
                    _ = off.wait_for(|reachable| !*reachable) => {}
                }
            },
        )
        .await;
        if result.is_err() || *quitting.borrow() {
            break result;
        }
        // Unreachable (test only): no socket, so calls fail with Unavailable, until PUT /reachable or a signal.
        println!("mcm provider sim: unreachable (PUT /reachable to serve again)");
        tokio::select! {
            _ = quitting.wait_for(|quit| *quit) => break Ok(()),
            _ = reachable_now.wait_for(|reachable| *reachable) => {}
        }
    };
    if let Some(kubelet) = kubelet {
        kubelet.stop().await;
    }
    if let Some(control) = control {
        control.abort();
    }
    serve_result(result, "mcm provider sim serve")
}
