//! `mcm run`: the controllers against any API server with a built-in or out-of-process provider, and the pieces
//! `mcm up` shares with it: the controller flags ([`ControllerFlags`], named and defaulted as in the reference) and
//! [`Controllers`], every controller of the process started and stopped together.

use std::{net::IpAddr, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Args;

use crate::{parse_duration, parse_share, wait_for_signal};

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
#[derive(Clone, Debug, Args)]
#[allow(clippy::struct_excessive_bools)] // command-line flags, as the reference names them
pub(crate) struct ControllerFlags {
    /// Which controllers to run: all (default), machine-controller-manager (alias mcm: sets, deployments, overshoot
    /// safety) or machine-controller (alias mc: machines, finalizers, orphan collection, reachability freeze), for
    /// the reference's two-container layout.
    #[arg(long, value_enum, default_value_t = Role::All)]
    pub(crate) controllers: Role,
    /// A MachineSet is frozen (no scale-up) when its machines reach 2 × replicas (or, in a deployment, replicas +
    /// maxSurge) + this many.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true)]
    pub(crate) safety_up: i32,
    /// ... and unfrozen when they are this many below that again.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub(crate) safety_down: i32,
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
    /// Objects reconciled at once per controller (at least 1); by default each keeps the reference's: 50 machines,
    /// 10 sets and 10 deployments.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) concurrent_syncs: Option<i32>,
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
    #[arg(long, default_value_t = 360, allow_negative_numbers = true)]
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
    /// How long a machine may stay InPlaceUpdating (from its drain to the node agent's update-result) before it is
    /// InPlaceUpdateFailed; a machine's `inPlaceUpdateTimeout` overrides it (docs/in-place-update-machine.md).
    #[arg(long, default_value = "20m", value_parser = parse_duration)]
    pub(crate) machine_inplace_update_timeout: Duration,
    /// How long a machine stays preserved (`node.machine.sapcloud.io/preserve`; docs/preservation.md); a machine's
    /// `machinePreserveTimeout` overrides it.
    #[arg(long, default_value = "96h", value_parser = parse_duration)]
    pub(crate) machine_preserve_timeout: Duration,
    /// Extra groups of the bootstrap tokens created for machines whose userData asks for one (comma-separated;
    /// the token Secret's `auth-extra-groups`).
    #[arg(long, default_value = "")]
    pub(crate) bootstrap_token_auth_extra_groups: String,
    /// After ResourceExhausted (quota, capacity) a machine is tried again after this long even if nothing changed;
    /// 0 means the default.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub(crate) resource_exhausted_retry: Duration,
    /// Run the controllers only while holding the leader Lease, so that a second instance stands by (the lock is
    /// `machine-controller-manager` for the set controllers and `machine-controller` for the machine controller, in
    /// --leader-elect-resource-namespace).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) leader_elect: bool,
    /// How long a leader's Lease is valid without a renewal: a standby takes over after this when the leader dies.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub(crate) leader_elect_lease_duration: Duration,
    /// A leader that could not renew its Lease for this long stops (the process exits, as the reference's does).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) leader_elect_renew_deadline: Duration,
    /// How often a standby tries to take the Lease and the leader renews it.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub(crate) leader_elect_retry_period: Duration,
    /// The kind of lock: only `leases` (coordination.k8s.io/v1), the reference's default.
    #[arg(long, default_value = "leases", value_parser = ["leases"])]
    pub(crate) leader_elect_resource_lock: String,
    /// The namespace of the Lease; by default --namespace.
    #[arg(long)]
    pub(crate) leader_elect_resource_namespace: Option<String>,
    /// The informer resync period of the reference (12h). Accepted for compatibility; no effect: caches here are
    /// event driven and each controller has its own safety resync (--machine-safety-resync).
    #[arg(long, default_value = MIN_RESYNC_PERIOD, value_parser = parse_duration)]
    pub(crate) min_resync_period: Duration,
    /// Accepted for compatibility with the reference (parsed but unused there too); no effect.
    #[arg(long, default_value = "")]
    pub(crate) cloud_provider: String,
    /// Accepted for compatibility with the reference (parsed but unused there too); no effect: requests are JSON.
    #[arg(long, default_value = KUBE_API_CONTENT_TYPE)]
    pub(crate) kube_api_content_type: String,
    /// Accepted for compatibility with the reference (parsed but unused there too); no effect.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub(crate) controller_start_interval: Duration,
    /// Accepted for compatibility with the reference; no effect (Go's pprof has no counterpart here).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) profiling: bool,
    /// Accepted for compatibility with the reference; no effect.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) contention_profiling: bool,
    /// Requests per second to each API server on average (client side, as client-go's limiter), greater than 0 as
    /// the reference checks; `unlimited` turns the limit off.
    #[arg(long, default_value = "20", value_parser = crate::run_checks::parse_qps, allow_negative_numbers = true)]
    pub(crate) kube_api_qps: crate::run_checks::Qps,
    /// Requests that may go out back to back above the average.
    #[arg(long, default_value_t = 30, allow_negative_numbers = true)]
    pub(crate) kube_api_burst: i32,
    /// While a rollout has old machines, annotate every node of the deployment
    /// `cluster-autoscaler.kubernetes.io/scale-down-disabled=true` (removed again when it completes).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) autoscaler_scaledown_annotation_during_rollout: bool,
    /// Count a machine available only once it has been Running for its set's `minReadySeconds`. Off by default, as
    /// in the reference, which ignores `minReadySeconds` (Gardener sets 500 on every deployment because of that).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) honour_min_ready_seconds: bool,
}

/// `mcm run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Kubeconfig of the control cluster (machines, classes, secrets). Defaults to the target kubeconfig; with
    /// neither, or `inClusterConfig`, the pod's service account (in-cluster configuration).
    #[arg(long)]
    pub(crate) control_kubeconfig: Option<String>,
    /// Kubeconfig of the target cluster (nodes, pods), or `none`: machines then become Available without a node, are
    /// never drained, and nodes are not watched. Defaults to the control kubeconfig.
    #[arg(long)]
    pub(crate) target_kubeconfig: Option<String>,
    /// The built-in provider to drive (`sim`: in-memory machines with a simulated kubelet on the target cluster;
    /// `aws`: EC2 instances, endpoint from AWS_ENDPOINT_URL_EC2 / AWS_ENDPOINT_URL, credentials from class secrets).
    /// This or --provider-endpoint is required unless `--controllers machine-controller-manager`, which calls no
    /// provider (as the reference's controller manager takes none).
    #[arg(long, value_parser = ["sim", "aws"], conflicts_with = "provider_endpoint")]
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

/// Warns once per flag accepted only for compatibility, naming it and why it has no effect: the one home of that
/// warning for every such flag (`mcm run`'s and klog's).
pub(crate) fn warn_without_effect(ignored: &[(&'static str, &'static str)]) {
    for (flag, why) in ignored {
        tracing::warn!(
            flag,
            why,
            "accepted for compatibility with the reference; it has no effect"
        );
    }
}

/// The default of `--min-resync-period` (the reference's).
const MIN_RESYNC_PERIOD: &str = "12h";
/// The default of `--kube-api-content-type` (the reference's).
const KUBE_API_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

impl ControllerFlags {
    /// The flags accepted only for compatibility that are set to anything but their default, each with why it has
    /// no effect (docs/compatibility.md).
    pub(crate) fn ignored(&self) -> Vec<(&'static str, &'static str)> {
        let reference_unused = "unused by the reference too";
        [
            (
                "--profiling",
                self.profiling,
                "Go's pprof has no counterpart here",
            ),
            (
                "--contention-profiling",
                self.contention_profiling,
                "Go's pprof has no counterpart here",
            ),
            (
                "--cloud-provider",
                !self.cloud_provider.is_empty(),
                reference_unused,
            ),
            (
                "--controller-start-interval",
                !self.controller_start_interval.is_zero(),
                reference_unused,
            ),
            (
                "--kube-api-content-type",
                self.kube_api_content_type != KUBE_API_CONTENT_TYPE,
                "unused by the reference too; requests are JSON",
            ),
            (
                "--min-resync-period",
                parse_duration(MIN_RESYNC_PERIOD).is_ok_and(|d| d != self.min_resync_period),
                "caches are event driven; the periodic pass is --machine-safety-resync",
            ),
        ]
        .into_iter()
        .filter(|(_, set, _)| *set)
        .map(|(flag, _, why)| (flag, why))
        .collect()
    }

    /// Warns about [`Self::ignored`] flags, so a reference deployment's flags work and nobody believes they do
    /// something.
    pub(crate) fn warn_ignored(&self) {
        warn_without_effect(&self.ignored());
    }

    /// Objects reconciled at once: `--concurrent-syncs` (checked to be at least 1 before anything starts), else
    /// `default`.
    fn concurrency(&self, default: u16) -> u16 {
        self.concurrent_syncs
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n > 0)
            .unwrap_or(default)
    }

    /// The API server probes' settings (`--machine-safety-apiserver-statuscheck-*`).
    fn reachability(&self) -> mcm_core::reachability::ReachabilitySettings {
        mcm_core::reachability::ReachabilitySettings {
            period: self.machine_safety_apiserver_statuscheck_period,
            timeout: self.machine_safety_apiserver_statuscheck_timeout,
        }
    }

    /// The client-side request limit of `--kube-api-qps` and `--kube-api-burst`.
    pub(crate) fn rate_limit(&self) -> crate::client::RateLimit {
        crate::client::RateLimit {
            qps: match self.kube_api_qps {
                crate::run_checks::Qps::PerSecond(qps) => qps,
                crate::run_checks::Qps::Unlimited => 0.0,
            },
            burst: u32::try_from(self.kube_api_burst).unwrap_or(0),
        }
    }

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
            machine_inplace_update_timeout: self.machine_inplace_update_timeout,
            machine_preserve_timeout: self.machine_preserve_timeout,
            bootstrap_token_auth_extra_groups: self.bootstrap_token_auth_extra_groups.clone(),
            ..mcm_core::ControllerSettings::default()
        };
        if !self.resource_exhausted_retry.is_zero() {
            settings.retry.resource_exhausted_retry = self.resource_exhausted_retry;
        }
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
    /// What `/metrics` serves.
    pub(crate) metrics: Arc<mcm_controllers::metrics::Metrics>,
}

impl Controllers {
    /// Starts the controllers on `control` (machines, sets, classes) and `target` (nodes; `None` for
    /// `--target-kubeconfig none`) with `driver`, named `provider` in the metrics, serving metrics on `metrics`.
    pub(crate) async fn start(
        control: kube::Client,
        target: Option<kube::Client>,
        driver: Arc<dyn mcm_driver::Driver>,
        provider: &str,
        probe: Option<mcm_grpc::GrpcDriver>,
        flags: &ControllerFlags,
        metrics: SocketAddr,
    ) -> anyhow::Result<Self> {
        flags.reachability().validate().map_err(anyhow::Error::msg)?;
        let registry = Arc::new(mcm_controllers::metrics::Metrics::new());
        let driver = Arc::new(mcm_controllers::metrics::MeteredDriver::new(
            driver,
            provider,
            registry.clone(),
        ));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        if let Some(probe) = probe {
            watch_provider(probe, &registry, stopped_when(stopped.clone()));
        }
        let (address, server) =
            mcm_controllers::metrics::serve(metrics, registry.clone(), stopped_when(stopped.clone()))
                .await
                .with_context(|| format!("serving metrics on {metrics}"))?;
        tracing::info!(namespace = %flags.namespace, provider, %address, "controllers starting");
        let trigger = mcm_controllers::orphans::Trigger::new();
        // GetMachineStatus answering OutOfRange (several VMs for one machine) starts an orphan pass.
        let driver: Arc<dyn mcm_driver::Driver> = Arc::new(mcm_controllers::orphans::PokeOnOutOfRange::new(
            driver,
            trigger.clone(),
        ));
        let halves = Arc::new(Halves {
            control: control.clone(),
            target,
            driver,
            flags: flags.clone(),
            registry: registry.clone(),
            trigger,
            caches: std::sync::OnceLock::new(),
        });
        let role = flags.controllers;
        let identity = mcm_controllers::leader::default_identity();
        let mut tasks = Vec::new();
        let wanted: [(bool, &str, StartHalf); 2] = [
            (
                role.machines(),
                mcm_core::leader::MC_LOCK_NAME,
                Halves::start_machines,
            ),
            (role.sets(), mcm_core::leader::MCM_LOCK_NAME, Halves::start_sets),
        ];
        for (wanted, lock, start) in wanted {
            if !wanted {
                continue;
            }
            if !flags.leader_elect {
                tasks.extend(start(&halves, &stopped));
                continue;
            }
            let mut config = mcm_controllers::leader::Config::new(
                flags
                    .leader_elect_resource_namespace
                    .clone()
                    .unwrap_or_else(|| flags.namespace.clone()),
                lock,
                identity.clone(),
            );
            config.settings = mcm_core::leader::LeaderElectionSettings {
                lease_duration: flags.leader_elect_lease_duration,
                renew_deadline: flags.leader_elect_renew_deadline,
                retry_period: flags.leader_elect_retry_period,
            };
            let elector = mcm_controllers::leader::LeaderElector::new(control.clone(), config)
                .map_err(anyhow::Error::msg)?;
            registry.add_readiness_check(&format!("leader-election {lock}"), elector.readiness());
            let task = tokio::spawn(lead(elector, halves.clone(), start, stopped.clone()));
            tasks.push(("leader election", task));
        }
        tracing::info!(identity, leader_elect = flags.leader_elect, "controllers started");
        Ok(Self {
            stop,
            tasks,
            server,
            address,
            metrics: registry,
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

/// A future resolving when the process stops.
async fn stopped_when(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// The named tasks of a started half.
type Tasks = Vec<(&'static str, tokio::task::JoinHandle<()>)>;
/// Starts one half of the controllers (each stops when the process stops).
type StartHalf = fn(&Halves, &tokio::sync::watch::Receiver<bool>) -> Tasks;

/// What the two halves of the controllers share: the reference's machine-controller (machines) and
/// machine-controller-manager (sets and deployments), each started when its Lease is held.
struct Halves {
    control: kube::Client,
    target: Option<kube::Client>,
    driver: Arc<dyn mcm_driver::Driver>,
    flags: ControllerFlags,
    registry: Arc<mcm_controllers::metrics::Metrics>,
    trigger: mcm_controllers::orphans::Trigger,
    /// The one watch of the Machines and of the Nodes every controller of the process reads, started by the first
    /// half to start (a standby watches nothing).
    caches: std::sync::OnceLock<mcm_controllers::shared_cache::Caches>,
}

impl Halves {
    /// The shared caches, started at the first call; they stop when the process stops.
    fn caches(&self, stopped: &tokio::sync::watch::Receiver<bool>) -> &mcm_controllers::shared_cache::Caches {
        self.caches.get_or_init(|| {
            mcm_controllers::shared_cache::Caches::start(
                &self.control,
                self.target.as_ref(),
                &self.flags.namespace,
                Some(&self.registry),
                stopped_when(stopped.clone()),
            )
        })
    }

    /// The machine controller, the class and secret finalizers, the orphan collection, the API server reachability
    /// freeze and (with a target cluster) the node deletion controller.
    fn start_machines(&self, stopped: &tokio::sync::watch::Receiver<bool>) -> Tasks {
        let flags = &self.flags;
        let caches = self.caches(stopped).clone();
        let orphans = tokio::spawn(
            mcm_controllers::orphans::Collector::new(
                self.control.clone(),
                self.target.clone(),
                caches.clone(),
                self.driver.clone(),
                mcm_controllers::orphans::Config {
                    period: flags.machine_safety_orphan_vms_period,
                    grace: flags.machine_safety_orphan_vms_grace,
                    creation_timeout: flags.machine_creation_timeout,
                    dry_run: flags.orphan_collection_dry_run,
                    ..mcm_controllers::orphans::Config::new(flags.namespace.clone())
                },
                self.trigger.clone(),
            )
            .with_metrics(self.registry.clone())
            .run(stopped_when(stopped.clone())),
        );
        let freeze = mcm_controllers::reachability::Freeze::default();
        let probes = tokio::spawn(mcm_controllers::reachability::run(
            self.control.clone(),
            self.target.clone(),
            mcm_controllers::reachability::Config {
                namespace: flags.namespace.clone(),
                settings: flags.reachability(),
            },
            freeze.clone(),
            Some(self.registry.clone()),
            stopped_when(stopped.clone()),
        ));
        let machines = tokio::spawn(mcm_controllers::machine::run(
            self.control.clone(),
            self.target.clone(),
            self.driver.clone(),
            mcm_controllers::machine::Config {
                namespace: flags.namespace.clone(),
                settings: flags.settings(),
                concurrency: flags.concurrency(MACHINE_CONCURRENT_SYNCS),
            },
            caches.clone(),
            mcm_controllers::machine::Extras {
                metrics: Some(self.registry.clone()),
                freeze,
                orphans: Some(self.trigger.clone()),
                node_deletion: Some(mcm_controllers::node_deletion::Config {
                    namespace: flags.namespace.clone(),
                    retry: flags.machine_retry_backoff_base,
                    resync: flags.machine_safety_resync,
                }),
            },
            stopped_when(stopped.clone()),
        ));
        let references = tokio::spawn(mcm_controllers::references::run(
            self.control.clone(),
            flags.namespace.clone(),
            caches,
            flags.machine_safety_resync,
            Some(self.registry.clone()),
            stopped_when(stopped.clone()),
        ));
        vec![
            ("the orphan VM collection", orphans),
            ("the API server reachability probes", probes),
            ("the machine controller", machines),
            ("the class and secret finalizer controller", references),
        ]
    }

    /// The MachineSet and MachineDeployment controllers and the overshoot safety.
    fn start_sets(&self, stopped: &tokio::sync::watch::Receiver<bool>) -> Tasks {
        let flags = &self.flags;
        let caches = self.caches(stopped).clone();
        let overshoot = tokio::spawn(mcm_controllers::overshoot::run(
            self.control.clone(),
            mcm_controllers::overshoot::Config {
                period: flags.machine_safety_overshooting_period,
                safety_up: u32::try_from(flags.safety_up).unwrap_or(0),
                safety_down: u32::try_from(flags.safety_down).unwrap_or(0),
                ..mcm_controllers::overshoot::Config::new(flags.namespace.clone())
            },
            caches.clone(),
            Some(self.registry.clone()),
            stopped_when(stopped.clone()),
        ));
        let sets = tokio::spawn(mcm_controllers::machineset::run(
            self.control.clone(),
            mcm_controllers::machineset::Config {
                namespace: flags.namespace.clone(),
                concurrency: flags.concurrency(SET_CONCURRENT_SYNCS),
                resync: flags.machine_safety_resync,
                min_ready_seconds: if flags.honour_min_ready_seconds {
                    mcm_core::machineset::MinReadySeconds::Honour
                } else {
                    mcm_core::machineset::MinReadySeconds::Ignore
                },
            },
            caches.clone(),
            Some(self.registry.clone()),
            stopped_when(stopped.clone()),
        ));
        let deployments = tokio::spawn(mcm_controllers::machinedeployment::run(
            self.control.clone(),
            self.target.clone(),
            mcm_controllers::machinedeployment::Config {
                namespace: flags.namespace.clone(),
                concurrency: flags.concurrency(SET_CONCURRENT_SYNCS),
                resync: flags.machine_safety_resync,
                autoscaler_scale_down_annotation_during_rollout: flags
                    .autoscaler_scaledown_annotation_during_rollout,
            },
            caches,
            Some(self.registry.clone()),
            stopped_when(stopped.clone()),
        ));
        vec![
            ("the overshoot safety", overshoot),
            ("the machine set controller", sets),
            ("the machine deployment controller", deployments),
        ]
    }
}

/// Runs one half of the controllers only while holding its Lease: stands by until elected, starts the half, and
/// when the process stops, stops the half first and then releases the Lease so a standby takes over at once. A
/// lost Lease ends the process (exit 1) as the reference's `klog.Fatalf` does: its Deployment restarts it as a
/// standby, and nothing of the half acts after the loss.
async fn lead(
    elector: mcm_controllers::leader::LeaderElector,
    halves: Arc<Halves>,
    start: StartHalf,
    stopped: tokio::sync::watch::Receiver<bool>,
) {
    let lease = elector.config().name.clone();
    let mut state = elector.subscribe();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let election = tokio::spawn(elector.run(async move {
        let _ = released.await;
    }));
    let shutdown = stopped_when(stopped.clone());
    tokio::pin!(shutdown);
    tokio::select! {
        () = &mut shutdown => {}
        leads = mcm_controllers::leader::wait_until_leading(&mut state) => {
            if !leads {
                tracing::error!(lease, "leader election ended before leading; exiting");
                std::process::exit(1);
            }
            tracing::info!(lease, "leading: starting the controllers of the lease");
            let tasks = start(&halves, &stopped);
            tokio::select! {
                () = &mut shutdown => {
                    for (name, task) in tasks {
                        if let Err(err) = task.await {
                            tracing::error!(lease, controller = name, error = %err, "stopped unexpectedly");
                        }
                    }
                }
                lost = mcm_controllers::leader::wait_until_not_leading(&mut state) => {
                    tracing::error!(lease, state = ?lost, "leadership lost; exiting so that nothing acts without it");
                    std::process::exit(1);
                }
            }
        }
    }
    let _ = release.send(());
    let _ = election.await;
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
    crate::run_checks::check(
        &args.controllers,
        Some((
            args.control_kubeconfig.as_deref(),
            args.target_kubeconfig.as_deref(),
        )),
    )?;
    args.controllers.warn_ignored();
    anyhow::ensure!(
        !args.controllers.controllers.machines()
            || args.provider.is_some()
            || args.provider_endpoint.is_some(),
        "--provider or --provider-endpoint is required: the machine controller (--controllers all or \
         machine-controller) drives a provider"
    );
    let (control, target) = crate::client::resolve(
        args.control_kubeconfig.as_deref(),
        args.target_kubeconfig.as_deref(),
    )?;
    let limit = args.controllers.rate_limit();
    let control_client = crate::client::connect(&control, limit)
        .await
        .context("the control cluster")?
        .context("the control cluster is required")?;
    let target = if target == control {
        Some(control_client.clone())
    } else {
        crate::client::connect(&target, limit)
            .await
            .context("the target cluster")?
    };
    let control = control_client;
    let mut kubelet = None;
    let mut probe = None;
    let mut cloud_metrics = None;
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
        } else if args.provider.as_deref() == Some("aws") {
            let driver = mcm_provider_aws::AwsDriver::new(mcm_provider_aws::AwsConfig::from_env());
            cloud_metrics = Some(driver.metrics());
            (Arc::new(driver), "aws".to_owned())
        } else if args.provider.is_none() {
            // `--controllers machine-controller-manager` without a provider: the set controllers call none, and no
            // machine controller runs to call this one (an in-memory sim, without kubelets).
            let driver = mcm_provider_sim::SimDriver::new(mcm_provider_sim::SimConfig::default());
            (Arc::new(driver), "none".to_owned())
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
    // The provider in this process: its cloud API metrics on the controllers' `/metrics`, where the reference's
    // provider process serves them too.
    if let Some(cloud) = cloud_metrics {
        controllers
            .metrics
            .add_families(Box::new(move |out| cloud.encode_families(out)));
    }
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
