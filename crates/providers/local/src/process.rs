//! Machine processes: starting a detached process group, telling whether a group still runs, stopping it.
//!
//! A machine is the process group of `/bin/sh <machine-dir>/userdata.sh`, started as the leader of a new group
//! (`process_group(0)`), so that signals to the provider's own group (a terminal's Ctrl-C) do not reach it, and so
//! that the whole tree the script starts (unless it leaves the group on purpose with `setsid`) can be signalled at
//! once with `kill(-pgid, sig)`.
//!
//! Whether a group runs is read from `/proc` on Linux (the processes whose group is `pgid`, zombies not counted:
//! a dead process whose parent has not reaped it yet runs no more); elsewhere from `kill(-pgid, 0)`.

use std::{
    ffi::OsString,
    fs::File,
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use rustix::process::{Pid, Signal};

/// How often a stopping group is polled.
const POLL: Duration = Duration::from_millis(20);

/// How long a group may take to vanish after SIGKILL before the stop is reported as failed.
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(5);

/// The stack of a reaper thread, which only waits and logs (one per machine started by this provider).
const REAPER_STACK: usize = 256 * 1024;

/// The PATH when the provider has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What to start: the script, its directory, its log and its environment.
pub(crate) struct Launch<'a> {
    /// The machine directory (the working directory and `HOME`).
    pub dir: &'a Path,
    /// The script run with `/bin/sh`.
    pub script: &'a Path,
    /// The log file that receives stdout and stderr (appended).
    pub log: &'a Path,
    /// Prepended to the provider's PATH.
    pub bin_dir: &'a Path,
    /// The variables set besides PATH and HOME.
    pub vars: Vec<(&'static str, OsString)>,
    /// For thread names and log lines.
    pub label: String,
}

/// A started process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Started {
    /// The leader's process ID, also the group's ID.
    pub pid: i32,
    /// The leader's start time (clock ticks after boot, `/proc/<pid>/stat` field 22), when known.
    pub start_time: Option<u64>,
}

/// Starts the script detached, in a new process group, from a cleared environment, and reaps it from a thread of
/// its own when it exits (so that it leaves no zombie while the provider lives). The process outlives the provider.
pub(crate) fn start(launch: &Launch<'_>) -> std::io::Result<Started> {
    let log = File::options().create(true).append(true).open(launch.log)?;
    let stderr = log.try_clone()?;
    let mut reaper_log = log.try_clone()?;
    let mut path = OsString::from(launch.bin_dir.as_os_str());
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()));
    let mut command = Command::new("/bin/sh");
    command
        .arg(launch.script)
        .current_dir(launch.dir)
        .env_clear()
        .env("PATH", path)
        .env("HOME", launch.dir)
        .envs(launch.vars.iter().map(|(key, value)| (key, value)))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn()?;
    let pid = i32::try_from(child.id()).map_err(std::io::Error::other)?;
    // Read before the reaper may reap it: the child is at worst a zombie until then.
    let start_time = stat(pid).map(|stat| stat.start_time);
    let label = launch.label.clone();
    let reaper = thread::Builder::new()
        .name(format!("local-reaper-{pid}"))
        .stack_size(REAPER_STACK)
        .spawn(move || match child.wait() {
            Ok(status) => {
                tracing::info!(machine = %label, pid, %status, "machine process exited");
                // Through the handle opened at start: once the machine directory is deleted, this goes nowhere.
                let _ = writeln!(
                    reaper_log,
                    "[mcm-provider-local] the machine process exited ({status})"
                );
            }
            Err(err) => {
                tracing::warn!(machine = %label, pid, error = %err, "waiting for the machine process");
            }
        });
    if let Err(err) = reaper {
        // Without a reaper the process would stay a zombie once it exits; it still runs, so carry on.
        tracing::warn!(machine = %launch.label, pid, error = %err, "starting the reaper thread");
    }
    Ok(Started { pid, start_time })
}

/// What `/proc/<pid>/stat` tells.
#[derive(Clone, Copy, Debug)]
struct Stat {
    state: char,
    pgrp: i32,
    start_time: u64,
}

/// `/proc/<pid>/stat` of a process, when there is a `/proc` and the process exists.
fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain anything: parse after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state), fields[2] field 5 (pgrp), fields[19] field 22 (starttime).
    Some(Stat {
        state: fields.first()?.chars().next()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

fn has_proc() -> bool {
    Path::new("/proc/self/stat").exists()
}

/// The running (not zombie) processes of group `pgid`, from `/proc`; `None` without `/proc`.
fn proc_members(pgid: i32) -> Option<Vec<i32>> {
    let entries = std::fs::read_dir("/proc").ok()?;
    let members = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|s| s.pgrp == pgid && !matches!(s.state, 'Z' | 'X' | 'x')))
        .collect();
    Some(members)
}

/// A group ID that may be signalled: positive, not init's, not the provider's own group.
fn signallable(pgid: i32) -> Option<Pid> {
    if pgid <= 1 || rustix::process::getpgrp().as_raw_pid() == pgid {
        return None;
    }
    Pid::from_raw(pgid)
}

/// Whether group `pgid` belongs to the machine that recorded it: `false` when its leader's process ID has been
/// reused since (the process with that ID started at another time). A process ID is not reused while a group of
/// that ID has members, so a group without its leader is still the machine's.
pub(crate) fn is_ours(pgid: i32, start_time: Option<u64>) -> bool {
    match (stat(pgid), start_time) {
        (Some(now), Some(recorded)) => now.start_time == recorded,
        _ => true,
    }
}

/// Whether any process of group `pgid` still runs.
pub(crate) fn group_running(pgid: i32) -> bool {
    let Some(group) = signallable(pgid) else {
        return false;
    };
    if has_proc() {
        return proc_members(pgid).is_some_and(|members| !members.is_empty());
    }
    rustix::process::test_kill_process_group(group).is_ok()
}

/// Sends `signal` to group `pgid`; a group that is gone is fine.
fn signal_group(pgid: i32, signal: Signal) -> std::io::Result<()> {
    let Some(group) = signallable(pgid) else {
        return Ok(());
    };
    match rustix::process::kill_process_group(group, signal) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// Polls until group `pgid` runs no more, at most `timeout`; whether it stopped.
fn wait_gone(pgid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !group_running(pgid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL);
    }
}

/// How a group was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// Nothing ran.
    NotRunning,
    /// It went after SIGTERM.
    Terminated,
    /// It went after SIGKILL.
    Killed,
}

/// Stops group `pgid`: SIGTERM, up to `grace` for it to go, then SIGKILL and up to [`KILL_WAIT`]. `Ok(None)` when
/// it still runs after that (a process stuck in the kernel).
pub(crate) fn stop_group(pgid: i32, grace: Duration) -> std::io::Result<Option<Stopped>> {
    if !group_running(pgid) {
        return Ok(Some(Stopped::NotRunning));
    }
    signal_group(pgid, Signal::TERM)?;
    if wait_gone(pgid, grace) {
        return Ok(Some(Stopped::Terminated));
    }
    signal_group(pgid, Signal::KILL)?;
    Ok(wait_gone(pgid, KILL_WAIT).then_some(Stopped::Killed))
}
