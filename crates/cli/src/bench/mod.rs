//! `mcm bench`: the scale benchmark of the controllers (issue 12). It runs the controllers (`mcm run`) and the sim
//! provider (`mcm provider sim serve`, with its simulated kubelets) as processes of their own against a fresh
//! embedded API server (or a cluster given by a kubeconfig), drives a MachineDeployment of N machines through its
//! phases (create, one or more rolls to the other class, scale to 0) and reports per phase the time, the controllers'
//! API requests and writes as the server counted them, their CPU seconds and peak memory, and the time against a
//! ceiling: how fast the same server accepts comparable writes from one client at the controllers' concurrency. The
//! ceiling is measured again after each phase, with what the embedded server then stores, so that a long run shows
//! whether the server slows as its store grows. One JSON object goes to stdout (and --output); progress to stderr.

mod ceiling;
mod cluster;
mod phases;
mod process;

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Args;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use self::{
    cluster::Cluster,
    phases::{Caches, Phase},
    process::Child,
};

/// `mcm bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Machines of the MachineDeployment.
    #[arg(long)]
    machines: usize,
    /// Run against the cluster of this kubeconfig, in a namespace created for the run (and deleted afterwards),
    /// instead of a fresh embedded API server. The controllers then share the kubeconfig's identity.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Also write the JSON report to this file.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Keep the embedded API server's objects in memory (default: on disk in a temporary directory).
    #[arg(long, conflicts_with = "kubeconfig")]
    in_memory: bool,
    /// Heartbeat interval of the simulated kubelets.
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    heartbeat_interval: Duration,
    /// `--concurrent-syncs` of the controllers (by default theirs: 50 machines, 10 sets, 10 deployments); also the
    /// concurrency of the ceiling (default 50).
    #[arg(long)]
    concurrent_syncs: Option<u16>,
    /// How long one phase may take before the benchmark fails.
    #[arg(long, default_value = "30m", value_parser = crate::parse_duration)]
    phase_timeout: Duration,
    /// How many times the deployment is rolled between create and scale-down (back and forth between two classes):
    /// a longer run, to see whether the server slows as it goes on.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rolls: u32,
    /// `--event-ttl` of the embedded API server: Events not written for this long are deleted.
    #[arg(
        long,
        default_value = mcm_apiserver::event_ttl::DEFAULT_EVENT_TTL_FLAG,
        value_parser = crate::parse_duration,
        conflicts_with = "kubeconfig"
    )]
    event_ttl: Duration,
}

/// The report.
#[derive(Debug, Serialize)]
struct Report {
    machines: usize,
    api_server: String,
    /// The embedded server's `--event-ttl` (none against a kubeconfig's cluster: its own applies).
    event_ttl: Option<String>,
    heartbeat_interval: String,
    /// The controllers' client-side rate limit.
    client_rate_limit: &'static str,
    concurrent_syncs: String,
    /// Whether this binary was built with optimizations.
    build: &'static str,
    /// The identity whose requests are counted as the controllers'.
    controllers_user: String,
    ceiling: ceiling::Ceiling,
    phases: Vec<PhaseReport>,
    /// CPU seconds of the controllers from their start to the end of the last phase (startup included).
    controller_cpu_seconds_total: f64,
    /// The controllers' peak resident memory over the whole run.
    controller_peak_rss_mib: f64,
}

/// One phase of the report.
#[derive(Debug, Serialize)]
struct PhaseReport {
    name: String,
    seconds: f64,
    /// Writes of the controllers (every verb but get, list and watch).
    writes: u64,
    writes_per_machine: f64,
    /// Writes of the controllers to machines (`machines.machine.sapcloud.io` and its status) per machine: the
    /// figure of the "at most 5 writes per machine to Running" goal.
    machine_writes_per_machine: f64,
    /// `seconds` over the time the ceiling needs for `writes`.
    ratio_to_ceiling: f64,
    /// The controllers' requests, `"<verb> <resource>": count`.
    requests: BTreeMap<String, u64>,
    /// Writes of every other user (the driver, the simulated kubelets), per user.
    other_writes: BTreeMap<String, u64>,
    controller_cpu_seconds: f64,
    /// Peak resident memory of the controllers since they started, read at the end of the phase (VmHWM).
    controller_peak_rss_mib: f64,
    /// Resident memory of the controllers at the end of the phase (VmRSS).
    controller_rss_mib: f64,
    /// The ceiling measured again right after the phase, against the store as the phase left it (and with the
    /// simulated kubelets' heartbeats going on).
    ceiling_after: ceiling::Ceiling,
    /// What the embedded server stores at the end of the phase (none against a kubeconfig's cluster).
    store: Option<cluster::StoreFigures>,
}

/// Runs `mcm bench`.
pub(crate) fn main(args: &BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.machines > 0, "--machines must be at least 1");
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let report = runtime.block_on(bench(args))?;
    let text = serde_json::to_string_pretty(&report).context("writing the report")? + "\n";
    print!("{text}");
    if let Some(path) = &args.output {
        std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

async fn bench(args: &BenchArgs) -> anyhow::Result<Report> {
    let cluster = match &args.kubeconfig {
        Some(path) => Cluster::external(path).await?,
        None => Cluster::embedded(args.in_memory, args.event_ttl).await?,
    };
    eprintln!(
        "mcm bench: {} machines against {} (namespace {})",
        args.machines, cluster.description, cluster.namespace
    );
    let result = run(args, &cluster).await;
    cluster.finish().await;
    result
}

#[allow(clippy::cast_precision_loss)] // machine and write counts of a benchmark fit f64 exactly
fn per(a: u64, b: usize) -> f64 {
    a as f64 / b as f64
}

async fn run(args: &BenchArgs, cluster: &Cluster) -> anyhow::Result<Report> {
    let concurrency = args.concurrent_syncs.map_or(50, usize::from);
    let objects = args.machines.clamp(200, 2000);
    eprintln!("mcm bench: ceiling: {objects} creates and {objects} status patches, {concurrency} at once");
    let ceiling = ceiling::measure(&cluster.client, objects, concurrency, "start").await?;
    eprintln!(
        "mcm bench: ceiling: {:.0} writes/s ({} writes in {:.2}s)",
        ceiling.writes_per_second, ceiling.writes, ceiling.seconds
    );

    let query = phases::create_classes(&cluster.client, &cluster.namespace).await?;
    let heartbeat = mcm_api::GoDuration::from_std(args.heartbeat_interval).0;
    let syncs = args.concurrent_syncs.map(|n| n.to_string());
    let Processes {
        mut provider,
        mut controllers,
        driver,
        pid,
    } = start_processes(cluster, &heartbeat, syncs.as_deref()).await?;
    let caches = Caches::start(&cluster.client, &cluster.namespace).await?;
    // Let the startup lists and the classes' finalizers settle before the first snapshot.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut reports = Vec::new();
    for phase in Phase::sequence(args.rolls) {
        let before = cluster.counts().await;
        let usage_before = process::usage(pid)?;
        let started = Instant::now();
        eprintln!("mcm bench: {} ...", phase.name());
        phase
            .start(&cluster.client, &cluster.namespace, args.machines)
            .await?;
        phases::wait(
            phase,
            &caches,
            args.machines,
            &driver,
            &query,
            args.phase_timeout,
            || {
                controllers.check_alive()?;
                provider.check_alive()
            },
        )
        .await?;
        let seconds = started.elapsed().as_secs_f64();
        let usage = process::usage(pid)?;
        let after = cluster.counts().await;
        let store = cluster.store_figures();
        let ceiling_after = ceiling::measure(&cluster.client, objects, concurrency, &phase.name()).await?;
        let report = phase_report(
            phase,
            seconds,
            args.machines,
            &ceiling,
            cluster,
            before.as_ref().zip(after.as_ref()),
            (usage_before, usage),
            (ceiling_after, store),
        );
        print_done(&report);
        reports.push(report);
    }
    let total = process::usage(pid)?;
    controllers.stop().await;
    provider.stop().await;
    Ok(Report {
        machines: args.machines,
        api_server: cluster.description.clone(),
        event_ttl: args
            .kubeconfig
            .is_none()
            .then(|| mcm_api::GoDuration::from_std(args.event_ttl).0),
        heartbeat_interval: heartbeat,
        client_rate_limit: "off (--kube-api-qps unlimited)",
        concurrent_syncs: syncs.unwrap_or_else(|| "default (50 machines, 10 sets, 10 deployments)".into()),
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        controllers_user: cluster.controllers_user.clone(),
        ceiling,
        phases: reports,
        controller_cpu_seconds_total: round(total.cpu_seconds),
        controller_peak_rss_mib: round(total.peak_rss_mib),
    })
}

/// The children of a run and how to reach them.
struct Processes {
    provider: Child,
    controllers: Child,
    driver: mcm_grpc::GrpcDriver,
    pid: u32,
}

/// Starts the sim provider and the controllers (client rate limit off), and waits until the controllers are ready.
async fn start_processes(
    cluster: &Cluster,
    heartbeat: &str,
    syncs: Option<&str>,
) -> anyhow::Result<Processes> {
    let socket = cluster.dir.join("provider.sock");
    let endpoint = format!("unix://{}", socket.display());
    let mut provider = Child::spawn(
        "mcm provider sim serve",
        &[
            OsStr::new("provider"),
            OsStr::new("sim"),
            OsStr::new("serve"),
            OsStr::new("--target-kubeconfig"),
            cluster.admin_kubeconfig.as_os_str(),
            OsStr::new("--sim-heartbeat-interval"),
            OsStr::new(heartbeat),
        ],
        &[("MC_ENDPOINT", &endpoint)],
        &cluster.dir.join("provider.log"),
    )?;
    provider
        .wait_for_line("serving on", Duration::from_secs(30))
        .await?;
    let driver = mcm_grpc::GrpcDriver::new(
        endpoint.parse().context("the provider endpoint")?,
        mcm_grpc::ClientOptions::default(),
    )
    .context("a client of the provider")?;

    let mut run_args: Vec<&OsStr> = vec![
        OsStr::new("run"),
        OsStr::new("--control-kubeconfig"),
        cluster.controllers_kubeconfig.as_os_str(),
        OsStr::new("--provider-endpoint"),
        OsStr::new(&endpoint),
        OsStr::new("--namespace"),
        OsStr::new(&cluster.namespace),
        OsStr::new("--port"),
        OsStr::new("0"),
        OsStr::new("--address"),
        OsStr::new("127.0.0.1"),
        OsStr::new("--leader-elect=false"),
        OsStr::new("--kube-api-qps"),
        OsStr::new("unlimited"),
    ];
    if let Some(syncs) = syncs {
        run_args.extend([OsStr::new("--concurrent-syncs"), OsStr::new(syncs)]);
    }
    let mut controllers = Child::spawn("mcm run", &run_args, &[], &cluster.dir.join("controllers.log"))?;
    let line = controllers
        .wait_for_line("metrics and health on http://", Duration::from_mins(1))
        .await?;
    let address: SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .with_context(|| format!("no address in {line:?}"))?;
    process::poll_until(
        "the controllers to be ready (/readyz)",
        Duration::from_mins(1),
        Duration::from_millis(100),
        || controllers.check_alive(),
        || async { Ok(ready(address).await.then_some(())) },
    )
    .await?;
    let pid = controllers.pid()?;
    eprintln!("mcm bench: controllers ready (pid {pid}, client rate limit off: --kube-api-qps unlimited)");
    Ok(Processes {
        provider,
        controllers,
        driver,
        pid,
    })
}

/// The progress line at the end of a phase.
fn print_done(report: &PhaseReport) {
    eprintln!(
        "mcm bench: {} done in {:.2}s: {} writes ({:.2}/machine), {:.2}x the ceiling, {:.2} CPU s, {:.1} MiB peak; \
         ceiling now {:.0} writes/s{}",
        report.name,
        report.seconds,
        report.writes,
        report.writes_per_machine,
        report.ratio_to_ceiling,
        report.controller_cpu_seconds,
        report.controller_peak_rss_mib,
        report.ceiling_after.writes_per_second,
        report.store.as_ref().map_or_else(String::new, |s| format!(
            ", {} objects stored ({} Events)",
            s.objects, s.events
        )),
    );
}

/// Two decimals are plenty for the report.
fn round(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

#[allow(clippy::too_many_arguments)] // one call site, each argument a figure of the phase
fn phase_report(
    phase: Phase,
    seconds: f64,
    machines: usize,
    ceiling: &ceiling::Ceiling,
    cluster: &Cluster,
    counts: Option<(&cluster::Counts, &cluster::Counts)>,
    (usage_before, usage): (process::Usage, process::Usage),
    (ceiling_after, store): (ceiling::Ceiling, Option<cluster::StoreFigures>),
) -> PhaseReport {
    let (requests, other_writes) = counts.map_or_else(Default::default, |(before, after)| {
        let requests = cluster::difference(before, after, &cluster.controllers_user);
        let other_writes = after
            .keys()
            .filter(|user| **user != cluster.controllers_user)
            .map(|user| {
                (
                    user.clone(),
                    cluster::writes(&cluster::difference(before, after, user)),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        (requests, other_writes)
    });
    let writes = cluster::writes(&requests);
    let machine_writes = cluster::writes(
        &requests
            .iter()
            .filter(|(kind, _)| {
                kind.split_once(' ')
                    .is_some_and(|(_, r)| r.starts_with("machines."))
            })
            .map(|(k, n)| (k.clone(), *n))
            .collect(),
    );
    let ceiling_seconds = ceiling.seconds_for(writes);
    PhaseReport {
        name: phase.name(),
        seconds: round(seconds),
        writes,
        writes_per_machine: round(per(writes, machines)),
        machine_writes_per_machine: round(per(machine_writes, machines)),
        ratio_to_ceiling: if ceiling_seconds > 0.0 {
            round(seconds / ceiling_seconds)
        } else {
            0.0
        },
        requests,
        other_writes,
        controller_cpu_seconds: round(usage.cpu_seconds - usage_before.cpu_seconds),
        controller_peak_rss_mib: round(usage.peak_rss_mib),
        controller_rss_mib: round(usage.rss_mib),
        ceiling_after,
        store,
    }
}

/// Whether `GET /readyz` answers 200.
async fn ready(address: SocketAddr) -> bool {
    let Ok(Ok(mut stream)) =
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(address)).await
    else {
        return false;
    };
    let request = format!("GET /readyz HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut response)).await;
    read.is_ok_and(|r| r.is_ok()) && response.starts_with(b"HTTP/1.1 200")
}
