//! `mcm capi run`: the Cluster API infrastructure-machine provider (MCMMachine controller, `mcm-capi`) against a
//! Cluster API management cluster, with the built-in sim provider or any provider out of process over gRPC.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::{parse_duration, run::grpc_driver, wait_for_signal};

/// `mcm capi`.
#[derive(Debug, Args)]
pub(crate) struct CapiArgs {
    #[command(subcommand)]
    command: CapiCommand,
}

#[derive(Debug, Subcommand)]
enum CapiCommand {
    /// Reconcile MCMMachines (infrastructure.machine.sapcloud.io/v1beta1) as Cluster API's infrastructure
    /// machines: waits for the cluster.x-k8s.io CRDs, then creates and deletes VMs through the provider.
    Run(RunArgs),
}

/// `mcm capi run`.
#[derive(Debug, Args)]
struct RunArgs {
    /// Kubeconfig of the management cluster; `inClusterConfig` or nothing for the pod's service account.
    #[arg(long)]
    kubeconfig: Option<String>,
    /// Only this namespace's MCMMachines (all namespaces by default).
    #[arg(long)]
    namespace: Option<String>,
    /// The built-in provider to drive (`sim`: in-memory machines, no kubelets).
    #[arg(long, value_parser = ["sim"], required_unless_present = "provider_endpoint", conflicts_with = "provider_endpoint")]
    provider: Option<String>,
    /// Drive a provider out of process over gRPC: unix:///path/to.sock, or tcp://host:port with the TLS flags.
    #[arg(long)]
    provider_endpoint: Option<String>,
    /// Client certificate (PEM) for a tcp:// provider endpoint.
    #[arg(long, requires_all = ["provider_tls_key", "provider_tls_ca"])]
    provider_tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long)]
    provider_tls_key: Option<PathBuf>,
    /// The CA (PEM) that signed the provider's certificate.
    #[arg(long)]
    provider_tls_ca: Option<PathBuf>,
    /// The deadline of every call to an out-of-process provider.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    provider_call_timeout: Duration,
    /// How often an MCMMachine waiting for something not watched (a secret, a MachineClass) is looked at again.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    wait_resync: Duration,
    /// First delay of the exponential back-off after a transient provider error.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    retry_backoff_base: Duration,
    /// The back-off never waits longer than this.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    retry_backoff_cap: Duration,
}

/// Runs `mcm capi`.
pub(crate) async fn main(args: CapiArgs) -> anyhow::Result<()> {
    let CapiCommand::Run(args) = args.command;
    let source = crate::client::Source::from_flag(args.kubeconfig.as_deref().unwrap_or_default());
    let limit = crate::client::RateLimit { qps: 20.0, burst: 30 };
    let client = crate::client::connect(&source, limit)
        .await
        .context("the management cluster")?
        .context("the management cluster is required")?;
    let driver: Arc<dyn mcm_driver::Driver> = if let Some(endpoint) = &args.provider_endpoint {
        let endpoint: mcm_grpc::Endpoint = endpoint.parse().context("--provider-endpoint")?;
        let tls = args.provider_tls_cert.clone().map(|cert| mcm_grpc::TlsFiles {
            cert,
            key: args.provider_tls_key.clone().unwrap_or_default(),
            ca: args.provider_tls_ca.clone().unwrap_or_default(),
        });
        Arc::new(grpc_driver(&endpoint, args.provider_call_timeout, tls)?)
    } else {
        Arc::new(mcm_provider_sim::SimDriver::new(
            mcm_provider_sim::SimConfig::default(),
        ))
    };
    let mut config = mcm_capi::Config {
        namespace: args.namespace,
        wait_resync: args.wait_resync,
        ..mcm_capi::Config::default()
    };
    config.retry.backoff_base = args.retry_backoff_base;
    config.retry.backoff_cap = args.retry_backoff_cap;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut controller = tokio::spawn(mcm_capi::run(client, driver, config, async {
        let _ = stopped.await;
    }));
    println!("mcm capi run: MCMMachine controller started");
    tokio::select! {
        result = wait_for_signal() => result?,
        // The controller stops by itself only on an error (discovery failed).
        result = &mut controller => return Ok(result.context("the controller task")??),
    }
    let _ = stop.send(());
    controller.await.context("the controller task")??;
    Ok(())
}
