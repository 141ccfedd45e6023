//! `mcm up` and `mcm down`: the whole system on one machine with no cluster. `mcm up` runs the embedded API server,
//! the local provider as a child process serving gRPC (with its `MC_` variables supplied), and every controller,
//! with everything in one data directory; it stops cleanly on Ctrl-C and resumes on the next start with the
//! machines still there (they are process trees of their own). `mcm down` stops it; `--purge` also stops every
//! machine and removes all state.
//!
//! The data directory D (default `$XDG_DATA_HOME/mcm`, else `~/.local/share/mcm`):
//!
//! | path | what |
//! |---|---|
//! | `D/kubeconfig` | the admin kubeconfig (mode 0600) |
//! | `D/apiserver/` | the API server's store, certificates (`ca.crt`) and token |
//! | `D/machines/` | the local provider's machines, one directory each |
//! | `D/provider/provider.sock` | the provider's socket (mode 0600) |
//! | `D/logs/provider.log` | the provider's log |
//! | `D/mcm.pid` | the process of the running `mcm up` |

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::Args;

use crate::run::{ControllerFlags, Controllers};

/// `mcm up`.
#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// The data directory (default: $XDG_DATA_HOME/mcm, else ~/.local/share/mcm).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Port of the API server on 127.0.0.1; 0 picks a free one the first time and keeps it afterwards.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Port of the controllers' /metrics and /healthz on 127.0.0.1; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    metrics_port: u16,
    /// A node whose heartbeat is older than this turns Unknown (kube-controller-manager's flag of this name).
    #[arg(long, default_value = "40s", value_parser = crate::parse_duration)]
    node_monitor_grace_period: Duration,
    /// How often the machines' node agents heartbeat (keep it well below the grace period).
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    node_heartbeat_interval: Duration,
    /// Events not written for this long are deleted (kube-apiserver's flag of this name).
    #[arg(long, default_value = mcm_apiserver::event_ttl::DEFAULT_EVENT_TTL_FLAG, value_parser = crate::parse_duration)]
    event_ttl: Duration,
    #[command(flatten)]
    controllers: ControllerFlags,
}

/// `mcm down`.
#[derive(Debug, Args)]
pub(crate) struct DownArgs {
    /// The data directory `mcm up` used.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Also stop every machine and remove the data directory.
    #[arg(long)]
    purge: bool,
}

/// The default data directory.
fn default_data_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("mcm"));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .context("neither --data-dir nor XDG_DATA_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".local/share/mcm"))
}

fn data_dir(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let dir = match given {
        Some(dir) => dir,
        None => default_data_dir()?,
    };
    // Absolute: the socket path and the machines' environment must not depend on a working directory.
    std::path::absolute(&dir).with_context(|| format!("--data-dir {}", dir.display()))
}

fn private_dir(path: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("securing {}", path.display()))
}

/// Whether a process with this id runs: signal 0 reaches it and, where /proc tells, it is not a zombie (an exited
/// `mcm up` whose parent has not reaped it yet has stopped all the same).
fn alive(pid: i32) -> bool {
    let reachable = rustix::process::Pid::from_raw(pid)
        .is_some_and(|pid| rustix::process::test_kill_process(pid).is_ok());
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z")
    });
    reachable && !zombie
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The running `mcm up` of this data directory, if any.
fn running(dir: &Path) -> Option<i32> {
    read_pid(&dir.join("mcm.pid")).filter(|pid| alive(*pid))
}

/// The processes serving the local provider on this data directory: `mcm provider local serve --state-dir D`,
/// found by their command lines in /proc (so also one an older `mcm up` left, whatever its pid).
fn providers_of(dir: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| serves_local_provider(&cmdline, dir))
        })
        .filter(|pid| alive(*pid))
        .collect()
}

/// Whether a NUL-separated command line is `<mcm> provider local serve ... --state-dir <dir> ...`.
fn serves_local_provider(cmdline: &[u8], dir: &Path) -> bool {
    const SERVE: [&[u8]; 3] = [b"provider", b"local", b"serve"];
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let dir = dir.as_os_str().as_encoded_bytes();
    args.get(1..4) == Some(&SERVE[..])
        && args.windows(2).any(|pair| {
            (pair[0] == b"--state-dir" && pair[1] == dir)
                || pair[0].strip_prefix(b"--state-dir=".as_slice()) == Some(dir)
        })
}

/// Stops a process: SIGTERM, then SIGKILL if it still runs after `grace`.
fn stop_process(pid: i32, grace: Duration) {
    let Some(process) = rustix::process::Pid::from_raw(pid) else {
        return;
    };
    let _ = rustix::process::kill_process(process, rustix::process::Signal::TERM);
    let deadline = Instant::now() + grace;
    while alive(pid) {
        if Instant::now() > deadline {
            let _ = rustix::process::kill_process(process, rustix::process::Signal::KILL);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops every local provider still serving this data directory with no `mcm up` (one whose `mcm up` was killed
/// before it could stop it, from a version without [`exit_with_parent`]); returns their pids. Machines are not
/// touched: they are process trees of their own, and the next provider finds them on disk.
fn stop_stale_providers(dir: &Path) -> Vec<i32> {
    let stale = providers_of(dir);
    for pid in &stale {
        tracing::warn!(pid, data_dir = %dir.display(), "stopping a local provider left running by an earlier mcm up");
        stop_process(*pid, Duration::from_secs(10));
    }
    stale
}

/// `mcm provider local serve --parent-pid P`: the kernel sends this process SIGTERM when its parent dies
/// (PR_SET_PDEATHSIG), so a provider never outlives an `mcm up` that was killed (`kill -9`, a crash). Exits at
/// once when the parent is already gone. The machines, separate process trees, keep running either way.
///
/// The death signal follows the parent *thread* that forked: `mcm up` starts the provider from its main thread
/// (inside `block_on`), which lives as long as the process.
pub(crate) fn exit_with_parent(parent: i32) -> anyhow::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .context("--parent-pid: asking for a signal when mcm up exits (prctl PR_SET_PDEATHSIG)")?;
    if rustix::process::getppid().map(rustix::process::Pid::as_raw_pid) != Some(parent) {
        bail!("--parent-pid: process {parent} (mcm up) is gone; not serving without it");
    }
    Ok(())
}

/// `mcm up`: until SIGINT or SIGTERM.
pub(crate) async fn up(args: UpArgs) -> anyhow::Result<()> {
    crate::run_checks::check(&args.controllers, None)?;
    let dir = data_dir(args.data_dir.clone())?;
    private_dir(&dir)?;
    if let Some(pid) = running(&dir) {
        bail!(
            "mcm up already runs with {} (pid {pid}); `mcm down --data-dir {}` stops it",
            dir.display(),
            dir.display()
        );
    }
    std::fs::write(dir.join("mcm.pid"), std::process::id().to_string()).context("writing mcm.pid")?;
    let result = run(&dir, &args).await;
    let _ = std::fs::remove_file(dir.join("mcm.pid"));
    result
}

async fn run(dir: &Path, args: &UpArgs) -> anyhow::Result<()> {
    // One `mcm up` per data directory (mcm.pid) and its own API server: nobody to elect against, and a restart after
    // a crash must not wait for a stale Lease to expire.
    let flags = &crate::run::ControllerFlags {
        leader_elect: false,
        ..args.controllers.clone()
    };
    for sub in ["apiserver", "provider", "logs"] {
        private_dir(&dir.join(sub))?;
    }
    // Taken over explicitly: a provider an earlier `mcm up` left running is stopped (and logged), never reused.
    stop_stale_providers(dir);
    let mut config = mcm_apiserver::server::Config::new(dir.join("apiserver"));
    config.port = args.port;
    config.node_monitor_grace_period = args.node_monitor_grace_period;
    config.event_ttl = args.event_ttl;
    // Every CRD of `mcm crds`: the machine kinds are the server's own, the Cluster API kinds are added here.
    config.extra_crds = mcm_capi::crd::all().context("generating the Cluster API CRDs")?;
    let server = mcm_apiserver::server::ApiServer::start(config)
        .await
        .with_context(|| format!("starting the API server in {}", dir.join("apiserver").display()))?;
    let kubeconfig = dir.join("kubeconfig");
    std::fs::copy(server.kubeconfig(), &kubeconfig).context("writing the kubeconfig")?;
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o600))
        .context("securing the kubeconfig")?;

    let socket = dir.join("provider/provider.sock");
    let endpoint = mcm_grpc::Endpoint::Unix(socket);
    let mut provider = start_provider(dir, &endpoint, server.url(), args.node_heartbeat_interval)?;
    let driver = crate::run::grpc_driver(&endpoint, flags.provider_call_timeout, None)?;
    wait_provider(&driver, &mut provider, dir).await?;

    let client = crate::client::connect(
        &crate::client::Source::Kubeconfig(kubeconfig.clone()),
        flags.rate_limit(),
    )
    .await?
    .context("the embedded API server")?;
    let controllers = Controllers::start(
        client.clone(),
        Some(client),
        Arc::new(driver.clone()),
        "local",
        Some(driver),
        flags,
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), args.metrics_port),
    )
    .await?;
    print_next_steps(dir, server.url(), controllers.address);

    let waited = crate::wait_for_signal().await;
    println!(
        "mcm up: stopping (machines keep running; `mcm up` resumes them, `mcm down --purge` removes them)"
    );
    let stopped = controllers.stop().await;
    stop_child(&mut provider).await;
    server.shutdown().await;
    waited?;
    stopped
}

fn start_provider(
    dir: &Path,
    endpoint: &mcm_grpc::Endpoint,
    api_server: &str,
    heartbeat: Duration,
) -> anyhow::Result<tokio::process::Child> {
    let exe = std::env::current_exe().context("finding this binary")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("logs/provider.log"))
        .context("opening logs/provider.log")?;
    let mut command = tokio::process::Command::new(&exe);
    command
        .args(["provider", "local", "serve", "--state-dir"])
        .arg(dir)
        .args(["--api-server", api_server, "--ca-file"])
        .arg(dir.join("apiserver/ca.crt"))
        .args([
            "--node-heartbeat-interval",
            &format!("{}ms", heartbeat.as_millis()),
        ])
        // The provider dies with us, also when we are killed (see `exit_with_parent`).
        .args(["--parent-pid", &std::process::id().to_string()])
        .env("MC_ENDPOINT", endpoint.to_string())
        .env("MC_LOG_FORMAT", "text")
        .env("MC_LOG_LEVEL", "info")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().context("the provider log")?)
        .stderr(log)
        // Ctrl-C in the terminal goes to our process group: the provider is stopped by us, in order.
        .process_group(0)
        .kill_on_drop(true);
    command.spawn().context("starting the local provider")
}

async fn wait_provider(
    driver: &mcm_grpc::GrpcDriver,
    provider: &mut tokio::process::Child,
    dir: &Path,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = provider.try_wait().context("watching the provider")? {
            bail!(
                "the local provider exited ({status}); see {}",
                dir.join("logs/provider.log").display()
            );
        }
        // Probed once the socket exists (a probe of a missing socket would only log a back-off).
        if endpoint_ready(driver.endpoint()) && driver.probe().await.unwrap_or(false) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the local provider did not answer within 30s; see {}",
                dir.join("logs/provider.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn endpoint_ready(endpoint: &mcm_grpc::Endpoint) -> bool {
    match endpoint {
        mcm_grpc::Endpoint::Unix(path) => path.exists(),
        mcm_grpc::Endpoint::Tcp(_) => true,
    }
}

async fn stop_child(child: &mut tokio::process::Child) {
    if let Some(pid) = child
        .id()
        .and_then(|id| rustix::process::Pid::from_raw(id.cast_signed()))
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

fn print_next_steps(dir: &Path, url: &str, metrics: SocketAddr) {
    let kubeconfig = dir.join("kubeconfig");
    println!("mcm up: ready. API server {url}, data in {}", dir.display());
    println!("mcm up: metrics and health on http://{metrics} (/metrics, /healthz, /readyz)");
    let mcm = mcm_command();
    println!("next:");
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!(
        "  {mcm} examples local --list     # the built-in examples: a secret, classes, Machine, MachineSet, ..."
    );
    println!("  {mcm} examples local 00-secret 01-machine-class 30-machine-deployment | kubectl apply -f -");
    println!("  {mcm} examples local | kubectl apply -f -   # all of them");
    println!("  kubectl get mcd,mcs,mc,nodes");
    println!(
        "  {mcm} down --data-dir {}          # stop (machines keep running)",
        dir.display()
    );
    println!(
        "  {mcm} down --data-dir {} --purge  # stop and remove every machine and all state",
        dir.display()
    );
}

/// How to call this binary in the next steps: `mcm` when that is what PATH finds, else its full path, so that the
/// commands work as printed from any directory.
fn mcm_command() -> String {
    let Ok(exe) = std::env::current_exe().and_then(std::fs::canonicalize) else {
        return "mcm".to_owned();
    };
    let on_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path)
            .find_map(|dir| std::fs::canonicalize(dir.join("mcm")).ok())
            .is_some_and(|found| found == exe)
    });
    if on_path {
        "mcm".to_owned()
    } else {
        exe.display().to_string()
    }
}

/// `mcm down`.
pub(crate) fn down(args: DownArgs) -> anyhow::Result<()> {
    let dir = data_dir(args.data_dir)?;
    if let Some(pid) = running(&dir) {
        if let Some(process) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(process, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_mins(1);
        while alive(pid) {
            if Instant::now() > deadline {
                bail!("mcm up (pid {pid}) did not stop within a minute");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        println!("mcm down: stopped mcm up (pid {pid})");
    } else {
        println!("mcm down: mcm up is not running with {}", dir.display());
    }
    for pid in stop_stale_providers(&dir) {
        println!("mcm down: stopped the local provider (pid {pid}) an earlier mcm up left running");
    }
    if args.purge {
        let stopped = mcm_provider_local::purge(&dir)
            .with_context(|| format!("stopping the machines in {}", dir.join("machines").display()))?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        println!(
            "mcm down: stopped {stopped} machine(s) and removed {}",
            dir.display()
        );
    }
    Ok(())
}
