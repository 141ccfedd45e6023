//! The benchmark's child processes (`mcm provider sim serve` and `mcm run`) and what `/proc` tells of them: CPU
//! seconds (utime + stime of `/proc/<pid>/stat` over `CLK_TCK`), peak and current resident memory (`VmHWM` and
//! `VmRSS` of `/proc/<pid>/status`).

use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};

/// A child process with its output going to a log file; killed and reaped when dropped (tokio's `kill_on_drop`).
pub(super) struct Child {
    process: tokio::process::Child,
    what: &'static str,
    log: std::path::PathBuf,
}

impl Child {
    /// Starts `mcm <args>` (this binary) with `env`, stdout piped (to find its start line) and stderr to `log`.
    pub(super) fn spawn(
        what: &'static str,
        args: &[&std::ffi::OsStr],
        env: &[(&str, &str)],
        log: &Path,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("finding this binary")?;
        let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut command = tokio::process::Command::new(exe);
        command
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(file))
            .kill_on_drop(true);
        let child = command.spawn().with_context(|| format!("starting {what}"))?;
        Ok(Self {
            process: child,
            what,
            log: log.to_path_buf(),
        })
    }

    /// The process id.
    pub(super) fn pid(&self) -> anyhow::Result<u32> {
        self.process
            .id()
            .with_context(|| format!("{} has exited", self.what))
    }

    /// Reads its standard output until a line contains `needle` and returns that line; fails if it exits first or
    /// after `deadline`. The rest of its output is drained in the background.
    pub(super) async fn wait_for_line(&mut self, needle: &str, deadline: Duration) -> anyhow::Result<String> {
        let stdout = self.process.stdout.take().context("stdout already taken")?;
        let mut lines = BufReader::new(stdout).lines();
        let found = tokio::time::timeout(deadline, async {
            while let Some(line) = lines.next_line().await? {
                if line.contains(needle) {
                    return Ok(Some(line));
                }
            }
            Ok::<_, std::io::Error>(None)
        })
        .await;
        let line = match found {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => bail!(
                "{} exited before printing {needle:?}; see {}",
                self.what,
                self.log.display()
            ),
            Ok(Err(err)) => return Err(err).context(format!("reading the output of {}", self.what)),
            Err(_) => bail!(
                "{} did not print {needle:?} within {deadline:?}; see {}",
                self.what,
                self.log.display()
            ),
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(line)
    }

    /// Fails if the process has exited.
    pub(super) fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.process.try_wait().context("waiting for a child")? {
            bail!("{} exited ({status}); see {}", self.what, self.log.display());
        }
        Ok(())
    }

    /// Sends SIGTERM and waits up to 10s for it to exit, then kills it.
    pub(super) async fn stop(mut self) {
        if let Some(pid) = self
            .process
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        if tokio::time::timeout(Duration::from_secs(10), self.process.wait())
            .await
            .is_err()
        {
            let _ = self.process.kill().await;
        }
    }
}

/// CPU and memory of a process at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Usage {
    /// User plus system CPU seconds since it started.
    pub(super) cpu_seconds: f64,
    /// Peak resident set (`VmHWM`) in MiB.
    pub(super) peak_rss_mib: f64,
    /// Current resident set (`VmRSS`) in MiB.
    pub(super) rss_mib: f64,
}

/// Reads the usage of `pid` from `/proc`.
pub(super) fn usage(pid: u32) -> anyhow::Result<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).context("reading /proc/<pid>/stat")?;
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading /proc/<pid>/status")?;
    Ok(Usage {
        cpu_seconds: cpu_seconds(&stat).context("parsing /proc/<pid>/stat")?,
        peak_rss_mib: kib_field(&status, "VmHWM:").context("VmHWM in /proc/<pid>/status")? / 1024.0,
        rss_mib: kib_field(&status, "VmRSS:").context("VmRSS in /proc/<pid>/status")? / 1024.0,
    })
}

/// utime + stime (fields 14 and 15, counted after the parenthesized command name) over the clock tick rate.
fn cpu_seconds(stat: &str) -> Option<f64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // rest starts with the state (field 3); utime is field 14, stime field 15.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    #[allow(clippy::cast_precision_loss)] // ticks of a benchmark run fit f64 exactly
    Some((utime + stime) as f64 / rustix::param::clock_ticks_per_second() as f64)
}

/// A `Name:   1234 kB` line of `/proc/<pid>/status`, in KiB.
fn kib_field(status: &str, name: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

/// Polls `probe` every `every` until it answers `Some`, failing after `deadline` with `what`; `alive` is checked on
/// each round so that a crashed child ends the wait at once.
pub(super) async fn poll_until<T, F, Fut>(
    what: &str,
    deadline: Duration,
    every: Duration,
    mut alive: impl FnMut() -> anyhow::Result<()>,
    mut probe: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let end = Instant::now() + deadline;
    loop {
        alive()?;
        if let Some(value) = probe().await? {
            return Ok(value);
        }
        if Instant::now() >= end {
            bail!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::cast_precision_loss)] // a tick rate fits f64 exactly
    fn reads_cpu_ticks_after_the_command_name_even_with_spaces_and_parentheses() {
        let stat = "42 (mcm (x) y) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 1 0";
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        assert_eq!(cpu_seconds(stat), Some(200.0 / ticks));
    }

    #[test]
    fn reads_memory_fields_in_kib() {
        let status = "Name:\tmcm\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(kib_field(status, "VmHWM:"), Some(20480.0));
        assert_eq!(kib_field(status, "VmRSS:"), Some(10240.0));
        assert_eq!(kib_field(status, "VmSwap:"), None);
    }

    #[test]
    fn this_process_has_a_usage() {
        let usage = usage(std::process::id()).unwrap();
        assert!(usage.peak_rss_mib > 0.0 && usage.rss_mib > 0.0);
    }
}
