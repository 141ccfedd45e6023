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
}

#[derive(Debug, Subcommand)]
enum SimCommand {
    /// Serve the sim provider over gRPC on MC_ENDPOINT (or --endpoint) until SIGINT or SIGTERM. Environment:
    /// MC_ENDPOINT (REQUIRED), MC_TLS_CERT_FILE, MC_TLS_KEY_FILE, MC_TLS_CLIENT_CA_FILE (REQUIRED for tcp://),
    /// MC_LOG_FORMAT (text|json), MC_LOG_LEVEL.
    Serve(SimServeArgs),
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
}

/// Runs `mcm provider ...`; the exit code is 2 for a misconfigured provider (spec 000: fail fast).
pub fn main(args: ProviderArgs) -> anyhow::Result<()> {
    match args.command {
        ProviderCommand::Sim {
            command: SimCommand::Serve(args),
        } => {
            let env = match ProviderEnv::from_lookup(|name| {
                if name == "MC_ENDPOINT" && args.endpoint.is_some() {
                    args.endpoint.clone()
                } else {
                    std::env::var(name).ok()
                }
            }) {
                Ok(env) => env,
                Err(err) => {
                    eprintln!("mcm provider sim serve: misconfigured: {err}");
                    std::process::exit(2);
                }
            };
            init_provider_logging(&env);
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(serve_sim(args, env))
        }
    }
}

fn init_provider_logging(env: &ProviderEnv) {
    let filter = tracing_subscriber::EnvFilter::new(&env.log_level);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if env.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
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
            let client = crate::client_from(path).await?;
            let config = mcm_provider_sim::KubeletConfig {
                heartbeat_interval: args.sim_heartbeat_interval,
                ..mcm_provider_sim::KubeletConfig::default()
            };
            Some(mcm_provider_sim::Kubelet::start(&driver, client, config))
        }
        None => None,
    };
    println!("mcm provider sim: serving on {}", env.endpoint);
    let result = mcm_grpc::serve(
        Arc::new(driver),
        sim_info(),
        &env.endpoint,
        env.tls.as_ref(),
        async {
            let _ = crate::wait_for_signal().await;
        },
    )
    .await;
    if let Some(kubelet) = kubelet {
        kubelet.stop().await;
    }
    match result {
        Ok(()) => Ok(()),
        Err(
            err @ (mcm_grpc::ServeError::InUse(_)
            | mcm_grpc::ServeError::TlsRequired
            | mcm_grpc::ServeError::Tls(_)),
        ) => {
            eprintln!("mcm provider sim serve: misconfigured: {err}");
            std::process::exit(2);
        }
        Err(err) => Err(err).context("serving the sim provider"),
    }
}
