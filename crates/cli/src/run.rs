//! `mcm run`: the controllers against any API server with a built-in or out-of-process provider, and the pieces
//! `mcm up` shares with it: the controller flags ([`ControllerFlags`], named and defaulted as in the reference) and
//! [`Controllers`], every controller of the process started and stopped together.

use std::{net::IpAddr, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Args;

use crate::{client_from, parse_duration, parse_share, wait_for_signal};

/// Which controllers a process runs: both roles of the reference, or one of its two binaries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Role {
    /// Everything (the default).
    #[default]
    All,
    /// The reference's machine-controller-manager: MachineSet, MachineDeployment and the overshoot safety.
    #[value(alias = "mcm")]
    MachineControllerManager,
    /// The reference's machine-controller: machines, class and secret finalizers, orphan collection, the API server
    /// reachability freeze.
    #[value(alias = "mc")]
    MachineController,
}

impl Role {
    /// Runs the machine controller's half.
    pub(crate) fn machines(self) -> bool {
        self != Self::MachineControllerManager
    }

    /// Runs the set controllers' half.
    pub(crate) fn sets(self) -> bool {
        self != Self::MachineController
    }

    /// The metrics port of the role: the reference's 10258 for machine-controller-manager, 10259 for
    /// machine-controller and for both (the combined process serves the machine metrics, which live on 10259).
    pub(crate) fn default_port(self) -> u16 {
        if self == Self::MachineControllerManager {
            10258
        } else {
            10259
        }
    }
}

/// The reference's `--concurrent-syncs` of the machine controller.
const MACHINE_CONCURRENT_SYNCS: u16 = 50;
/// The reference's `--concurrent-syncs` of machine-controller-manager (sets and deployments).
const SET_CONCURRENT_SYNCS: u16 = 10;

/// The flags of the controllers, shared by `mcm run` and `mcm up`.
#[derive(Debug, Args)]
pub(crate) struct ControllerFlags {
    /// Which controllers to run: all (default), machine-controller-manager (alias mcm: sets, deployments, overshoot
    /// safety) or machine-controller (alias mc: machines, finalizers, orphan collection, reachability freeze), for
    /// the reference's two-container layout.
    #[arg(long, value_enum, default_value_t = Role::All)]
    pub(crate) controllers: Role,
    /// A MachineSet is frozen (no scale-up) when its machines reach 2 × replicas (or, in a deployment, replicas +
    /// maxSurge) + this many.
    #[arg(long, default_value_t = 2)]
    pub(crate) safety_up: u32,
    /// ... and unfrozen when they are this many below that again.
    #[arg(long, default_value_t = 1)]
    pub(crate) safety_down: u32,
    /// How often every MachineSet is checked for overshooting (also on every machine creation).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub(crate) machine_safety_overshooting_period: Duration,
    /// How often the VMs of every class are listed to delete those no machine owns (orphans).
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub(crate) machine_safety_orphan_vms_period: Duration,
    /// A VM is only collected once it has been seen for this long (never one whose machine is being created).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub(crate) machine_safety_orphan_vms_grace: Duration,
    /// Report orphan VMs (Events, metrics, logs) without deleting any.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) orphan_collection_dry_run: bool,
    /// How often the control and target API servers are probed (at least the timeout).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub(crate) machine_safety_apiserver_statuscheck_period: Duration,
    /// An API server unreachable for longer than this freezes the machine controller (deletions under way go on);
    /// after it answers again for as long, the freeze lifts and Unknown machines' health clocks restart.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(crate) machine_safety_apiserver_statuscheck_timeout: Duration,
    /// Namespace of the machines, classes and secrets.
    #[arg(long, default_value = "default")]
    pub(crate) namespace: String,
    /// The deadline of every call to an out-of-process provider.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub(crate) provider_call_timeout: Duration,
    /// Objects reconciled at once per controller; by default each keeps the reference's: 50 machines, 10 sets and
    /// 10 deployments.
    #[arg(long)]
    pub(crate) concurrent_syncs: Option<u16>,
    /// How long a machine may take from creation to a joined node before it is Failed.
    #[arg(long, default_value = "20m", value_parser = parse_duration)]
    pub(crate) machine_creation_timeout: Duration,
    /// How long a machine may stay Unknown before it is Failed.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub(crate) machine_health_timeout: Duration,
    /// Node condition types that make a node unhealthy unless they are False (comma-separated).
    #[arg(
        long,
        default_value = "KernelDeadlock,ReadonlyFilesystem,DiskPressure,NetworkUnavailable"
    )]
    pub(crate) node_conditions: String,
    /// How often a machine waiting for a change (after a provider error that is not retried) is looked at anyway.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub(crate) machine_safety_resync: Duration,
    /// How many unhealthy machines of one MachineDeployment may be replaced at once.
    #[arg(long, default_value_t = 1)]
    pub(crate) max_concurrent_replacements: usize,
    /// No unhealthy machine of a group is replaced while more than this share of the group is unhealthy.
    #[arg(long, default_value_t = 0.5, value_parser = parse_share)]
    pub(crate) max_unhealthy_share: f64,
    /// How long a drain may take before it turns into a force drain (per machine: `spec.drainTimeout`).
    #[arg(long, default_value = "2h", value_parser = parse_duration)]
    pub(crate) machine_drain_timeout: Duration,
    /// Eviction attempts per pod refused by a PodDisruptionBudget, at most the drain timeout divided by
    /// `--machine-evict-retry-interval` (per machine: `spec.maxEvictRetries`).
    #[arg(long, default_value_t = 360)]
    pub(crate) machine_max_evict_retries: i32,
    /// How long to wait for a pod's volumes to detach from the drained node (on top of its grace period).
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub(crate) machine_pv_detach_timeout: Duration,
    /// How long to wait for a pod's volumes to attach on another node before moving on.
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    pub(crate) machine_pv_reattach_timeout: Duration,
    /// How often a drain looks again: refused evictions are retried, pods and volumes checked (the reference's
    /// fixed 20s).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub(crate) machine_evict_retry_interval: Duration,
    /// The node this controller runs on: its machine is never drained or deleted (spec 004).
    #[arg(long, env = "NODE_NAME")]
    pub(crate) controller_node: Option<String>,
    /// First delay of the per-machine exponential back-off after a provider error marked for retry.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) machine_retry_backoff_base: Duration,
    /// The back-off never waits longer than this.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub(crate) machine_retry_backoff_cap: Duration,
    /// While a rollout has old machines, annotate every node of the deployment
    /// `cluster-autoscaler.kubernetes.io/scale-down-disabled=true` (removed again when it completes).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) autoscaler_scaledown_annotation_during_rollout: bool,
}

/// `mcm run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Kubeconfig of the control cluster (machines, classes, secrets).
    #[arg(long)]
    pub(crate) control_kubeconfig: PathBuf,
    /// Kubeconfig of the target cluster (nodes), or `none`: machines then become Available and nodes are not
    /// watched. Defaults to the control kubeconfig.
    #[arg(long)]
    pub(crate) target_kubeconfig: Option<String>,
    /// The built-in provider to drive (`sim`: in-memory machines with a simulated kubelet on the target cluster).
    #[arg(long, value_parser = ["sim"], required_unless_present = "provider_endpoint", conflicts_with = "provider_endpoint")]
    pub(crate) provider: Option<String>,
    /// Drive a provider out of process over gRPC instead: unix:///path/to.sock, or tcp://host:port with
    /// --provider-tls-cert, --provider-tls-key and --provider-tls-ca.
    #[arg(long)]
    pub(crate) provider_endpoint: Option<String>,
    /// Client certificate (PEM) for a tcp:// provider endpoint.
    #[arg(long, requires_all = ["provider_tls_key", "provider_tls_ca"])]
    pub(crate) provider_tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long)]
    pub(crate) provider_tls_key: Option<PathBuf>,
    /// The CA (PEM) that signed the provider's certificate.
    #[arg(long)]
    pub(crate) provider_tls_ca: Option<PathBuf>,
    /// Port of `/metrics`, `/healthz` and `/readyz`; 0 picks a free port (printed at start). Default: 10259, or 10258
    /// with `--controllers machine-controller-manager` (the reference's ports).
    #[arg(long)]
    pub(crate) port: Option<u16>,
    /// Address of `/metrics` and `/healthz` (all interfaces by default, as the reference, so Prometheus can scrape
    /// a pod).
    #[arg(long, default_value = "0.0.0.0")]
    pub(crate) address: IpAddr,
    /// Heartbeat interval of the sim provider's simulated kubelets.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) sim_heartbeat_interval: Duration,
    #[command(flatten)]
    pub(crate) controllers: ControllerFlags,
}

impl ControllerFlags {
    /// The machine controller's settings from the flags.
    fn settings(&self) -> mcm_core::ControllerSettings {
        let mut settings = mcm_core::ControllerSettings {
            machine_creation_timeout: self.machine_creation_timeout,
            machine_health_timeout: self.machine_health_timeout,
            node_conditions: mcm_core::timeouts::parse_node_conditions(&self.node_conditions),
            machine_drain_timeout: self.machine_drain_timeout,
            max_evict_retries: self.machine_max_evict_retries,
            machine_pv_detach_timeout: self.machine_pv_detach_timeout,
            machine_pv_reattach_timeout: self.machine_pv_reattach_timeout,
            evict_retry_interval: self.machine_evict_retry_interval,
            controller_node: self.controller_node.clone().filter(|n| !n.is_empty()),
            ..mcm_core::ControllerSettings::default()
        };
        settings.retry.await_change_resync = self.machine_safety_resync;
        settings.retry.backoff_base = self.machine_retry_backoff_base;
        settings.retry.backoff_cap = self.machine_retry_backoff_cap;
        settings.remediation.max_concurrent_replacements = self.max_concurrent_replacements;
        settings.remediation.max_unhealthy_share = self.max_unhealthy_share;
        settings
    }
}

/// Every controller of the process (machine, MachineSet, MachineDeployment, class and secret finalizers) and the
/// metrics and health server, started together and stopped together.
pub(crate) struct Controllers {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
    server: tokio::task::JoinHandle<()>,
    /// Where `/metrics` and `/healthz` are served.
    pub(crate) address: SocketAddr,
}

impl Controllers {
    /// Starts the controllers on `control` (machines, sets, classes) and `target` (nodes; `None` for
    /// `--target-kubeconfig none`) with `driver`, named `provider` in the metrics, serving metrics on `metrics`.
    #[allow(clippy::too_many_lines)] // one spawn per controller, flat and in one place
    pub(crate) async fn start(
        control: kube::Client,
        target: Option<kube::Client>,
        driver: Arc<dyn mcm_driver::Driver>,
        provider: &str,
        probe: Option<mcm_grpc::GrpcDriver>,
        flags: &ControllerFlags,
        metrics: SocketAddr,
    ) -> anyhow::Result<Self> {
        let reachability = mcm_core::reachability::ReachabilitySettings {
            period: flags.machine_safety_apiserver_statuscheck_period,
            timeout: flags.machine_safety_apiserver_statuscheck_timeout,
        };
        reachability.validate().map_err(anyhow::Error::msg)?;
        let registry = Arc::new(mcm_controllers::metrics::Metrics::new());
        let driver = Arc::new(mcm_controllers::metrics::MeteredDriver::new(
            driver,
            provider,
            registry.clone(),
        ));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let stopped_when = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        if let Some(probe) = probe {
            watch_provider(probe, &registry, stopped_when(stopped.clone()));
        }
        let (address, server) =
            mcm_controllers::metrics::serve(metrics, registry.clone(), stopped_when(stopped.clone()))
                .await
                .with_context(|| format!("serving metrics on {metrics}"))?;
        tracing::info!(namespace = %flags.namespace, provider, %address, "controllers starting");
        let role = flags.controllers;
        let mut tasks = Vec::new();
        let trigger = mcm_controllers::orphans::Trigger::new();
        // GetMachineStatus answering OutOfRange (several VMs for one machine) starts an orphan pass.
        let driver: Arc<dyn mcm_driver::Driver> = Arc::new(mcm_controllers::orphans::PokeOnOutOfRange::new(
            driver,
            trigger.clone(),
        ));
        if role.machines() {
            let task = tokio::spawn(
                mcm_controllers::orphans::Collector::new(
                    control.clone(),
                    target.clone(),
                    driver.clone(),
                    mcm_controllers::orphans::Config {
                        period: flags.machine_safety_orphan_vms_period,
                        grace: flags.machine_safety_orphan_vms_grace,
                        creation_timeout: flags.machine_creation_timeout,
                        dry_run: flags.orphan_collection_dry_run,
                        ..mcm_controllers::orphans::Config::new(flags.namespace.clone())
                    },
                    trigger.clone(),
                )
                .with_metrics(registry.clone())
                .run(stopped_when(stopped.clone())),
            );
            tasks.push(("the orphan VM collection", task));
        }
        if role.sets() {
            let task = tokio::spawn(mcm_controllers::overshoot::run(
                control.clone(),
                mcm_controllers::overshoot::Config {
                    period: flags.machine_safety_overshooting_period,
                    safety_up: flags.safety_up,
                    safety_down: flags.safety_down,
                    ..mcm_controllers::overshoot::Config::new(flags.namespace.clone())
                },
                stopped_when(stopped.clone()),
            ));
            tasks.push(("the overshoot safety", task));
        }
        let freeze = mcm_controllers::reachability::Freeze::default();
        if role.machines() {
            let task = tokio::spawn(mcm_controllers::reachability::run(
                control.clone(),
                target.clone(),
                mcm_controllers::reachability::Config {
                    namespace: flags.namespace.clone(),
                    settings: reachability,
                },
                freeze.clone(),
                Some(registry.clone()),
                stopped_when(stopped.clone()),
            ));
            tasks.push(("the API server reachability probes", task));
        }
        if role.machines() {
            let task = tokio::spawn(mcm_controllers::machine::run_with(
                control.clone(),
                target.clone(),
                driver,
                mcm_controllers::machine::Config {
                    namespace: flags.namespace.clone(),
                    settings: flags.settings(),
                    concurrency: flags.concurrent_syncs.unwrap_or(MACHINE_CONCURRENT_SYNCS),
                },
                mcm_controllers::machine::Extras {
                    metrics: Some(registry),
                    freeze,
                    orphans: Some(trigger),
                },
                stopped_when(stopped.clone()),
            ));
            tasks.push(("the machine controller", task));
        }
        if role.sets() {
            let task = tokio::spawn(mcm_controllers::machineset::run(
                control.clone(),
                mcm_controllers::machineset::Config {
                    namespace: flags.namespace.clone(),
                    concurrency: flags.concurrent_syncs.unwrap_or(SET_CONCURRENT_SYNCS),
                    resync: flags.machine_safety_resync,
                },
                stopped_when(stopped.clone()),
            ));
            tasks.push(("the machine set controller", task));
        }
        if role.sets() {
            let task = tokio::spawn(mcm_controllers::machinedeployment::run(
                control.clone(),
                target,
                mcm_controllers::machinedeployment::Config {
                    namespace: flags.namespace.clone(),
                    concurrency: flags.concurrent_syncs.unwrap_or(SET_CONCURRENT_SYNCS),
                    resync: flags.machine_safety_resync,
                    autoscaler_scale_down_annotation_during_rollout: flags
                        .autoscaler_scaledown_annotation_during_rollout,
                },
                stopped_when(stopped.clone()),
            ));
            tasks.push(("the machine deployment controller", task));
        }
        if role.machines() {
            let task = tokio::spawn(mcm_controllers::references::run(
                control,
                flags.namespace.clone(),
                flags.machine_safety_resync,
                stopped_when(stopped),
            ));
            tasks.push(("the class and secret finalizer controller", task));
        }
        Ok(Self {
            stop,
            tasks,
            server,
            address,
        })
    }

    /// Stops every controller (work in flight finishes) and the metrics server.
    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        for (name, task) in self.tasks {
            task.await
                .with_context(|| format!("{name} stopped unexpectedly"))?;
        }
        let _ = self.server.await;
        Ok(())
    }
}

/// How often `/readyz` learns whether an out-of-process provider answers.
const PROVIDER_PROBE_PERIOD: Duration = Duration::from_secs(2);

/// Probes an out-of-process provider in the background and makes `/readyz` fail while it does not answer ready.
fn watch_provider(
    provider: mcm_grpc::GrpcDriver,
    metrics: &Arc<mcm_controllers::metrics::Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let state = Arc::new(std::sync::Mutex::new(Err::<(), String>("not probed yet".into())));
    let seen = state.clone();
    metrics.add_readiness_check("provider", move || {
        seen.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    });
    tokio::spawn(async move {
        tokio::pin!(shutdown);
        loop {
            let answer = match provider.probe().await {
                Ok(true) => Ok(()),
                Ok(false) => Err(format!("the provider at {} is not ready", provider.endpoint())),
                Err(err) => Err(err.message),
            };
            *state.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = answer;
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(PROVIDER_PROBE_PERIOD) => {}
            }
        }
    });
}

/// A client for an out-of-process provider, from the flags.
pub(crate) fn grpc_driver(
    endpoint: &mcm_grpc::Endpoint,
    call_timeout: Duration,
    tls: Option<mcm_grpc::TlsFiles>,
) -> anyhow::Result<mcm_grpc::GrpcDriver> {
    mcm_grpc::GrpcDriver::new(
        endpoint.clone(),
        mcm_grpc::ClientOptions {
            call_timeout,
            tls,
            ..mcm_grpc::ClientOptions::default()
        },
    )
    .with_context(|| format!("the provider endpoint {endpoint}"))
}

/// The name a provider gives itself, asked once with a short deadline; its endpoint when it does not answer yet
/// (the calls' back-off finds it later).
pub(crate) async fn provider_name(driver: &mcm_grpc::GrpcDriver) -> String {
    match tokio::time::timeout(Duration::from_secs(2), driver.provider_info()).await {
        Ok(Ok((info, _))) => info.name,
        _ => driver.endpoint().to_string(),
    }
}

/// `mcm run`: until SIGINT or SIGTERM.
pub(crate) async fn run_controllers(args: RunArgs) -> anyhow::Result<()> {
    let control = client_from(&args.control_kubeconfig).await?;
    let target = match args.target_kubeconfig.as_deref() {
        Some("none") => None,
        Some(path) => Some(client_from(std::path::Path::new(path)).await?),
        None => Some(control.clone()),
    };
    let mut kubelet = None;
    let mut probe = None;
    let (driver, provider): (Arc<dyn mcm_driver::Driver>, String) =
        if let Some(endpoint) = &args.provider_endpoint {
            let endpoint: mcm_grpc::Endpoint = endpoint.parse().context("--provider-endpoint")?;
            let tls = args.provider_tls_cert.clone().map(|cert| mcm_grpc::TlsFiles {
                cert,
                key: args.provider_tls_key.clone().unwrap_or_default(),
                ca: args.provider_tls_ca.clone().unwrap_or_default(),
            });
            let grpc = grpc_driver(&endpoint, args.controllers.provider_call_timeout, tls)?;
            let name = provider_name(&grpc).await;
            println!("mcm run: provider {name} at {endpoint}");
            probe = Some(grpc.clone());
            (Arc::new(grpc), name)
        } else {
            let driver = mcm_provider_sim::SimDriver::new(mcm_provider_sim::SimConfig::default());
            kubelet = target.as_ref().map(|target| {
                let config = mcm_provider_sim::KubeletConfig {
                    heartbeat_interval: args.sim_heartbeat_interval,
                    ..mcm_provider_sim::KubeletConfig::default()
                };
                mcm_provider_sim::Kubelet::start(&driver, target.clone(), config)
            });
            (Arc::new(driver), args.provider.clone().unwrap_or_default())
        };
    let controllers = Controllers::start(
        control,
        target,
        driver,
        &provider,
        probe,
        &args.controllers,
        SocketAddr::new(
            args.address,
            args.port
                .unwrap_or_else(|| args.controllers.controllers.default_port()),
        ),
    )
    .await?;
    println!(
        "mcm run: metrics and health on http://{} (/metrics, /healthz, /readyz)",
        controllers.address
    );
    wait_for_signal().await?;
    controllers.stop().await?;
    if let Some(kubelet) = kubelet {
        kubelet.stop().await;
    }
    Ok(())
}
