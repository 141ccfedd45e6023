//! [`LocalError`]: what can go wrong in the local provider outside of request validation.

use std::path::PathBuf;

use mcm_driver::{DriverError, MachineCode};

/// A failure of the local provider: its configuration, its state directory, or a machine's processes. Messages name
/// paths and machines, never userData.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The configuration cannot work (for example a `bin_dir` containing `:`, which PATH cannot hold).
    #[error("invalid local provider configuration: {0}")]
    Config(String),
    /// A file or directory operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done ("creating", "reading", ...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A `machine.json` cannot be read as a machine record.
    #[error("{}: not a machine record: {source}", path.display())]
    Record {
        /// The file.
        path: PathBuf,
        /// The error.
        source: serde_json::Error,
    },
    /// A machine directory has no `machine.json` (it was tampered with).
    #[error("{}: a machine directory without machine.json (remove it by hand)", dir.display())]
    MissingRecord {
        /// The machine directory.
        dir: PathBuf,
    },
    /// The machine process could not be started.
    #[error("starting the process of machine {machine}: {source}")]
    Spawn {
        /// `<namespace>/<name>`.
        machine: String,
        /// The error.
        source: std::io::Error,
    },
    /// Signalling the machine's process group failed.
    #[error("stopping process group {pgid} of machine {machine}: {source}")]
    Signal {
        /// `<namespace>/<name>`.
        machine: String,
        /// The process group.
        pgid: i32,
        /// The error.
        source: std::io::Error,
    },
    /// The machine's processes still run after SIGKILL (stuck in the kernel); the deletion is to be retried.
    #[error("process group {pgid} of machine {machine} still runs after SIGKILL; retry the deletion")]
    StillRunning {
        /// `<namespace>/<name>`.
        machine: String,
        /// The process group.
        pgid: i32,
    },
}

impl LocalError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { action, path, source }
    }

    /// The machine code of this error: `Internal` for a broken state directory (a record that cannot be read or is
    /// missing; spec 000: "some invariants expected by underlying system has been broken"), `Unavailable` for
    /// processes that outlive SIGKILL (to be retried), `Unknown` for the rest (I/O, spawning, signalling: retried
    /// after some time).
    pub fn code(&self) -> MachineCode {
        match self {
            Self::Config(_) | Self::Record { .. } | Self::MissingRecord { .. } => MachineCode::Internal,
            Self::StillRunning { .. } => MachineCode::Unavailable,
            Self::Io { .. } | Self::Spawn { .. } | Self::Signal { .. } => MachineCode::Unknown,
        }
    }
}

impl From<LocalError> for DriverError {
    fn from(err: LocalError) -> Self {
        DriverError::new(err.code(), err.to_string())
    }
}
