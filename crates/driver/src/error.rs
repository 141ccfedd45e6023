//! The error of every provider call: a machine code and a message.

use crate::MachineCode;

/// A failed provider call. The code decides the controller's recovery (see [`crate::retry`]); the message is shown
/// to users as written. It is carried as data end to end and never parsed back out of a string.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct DriverError {
    /// The machine code; never [`MachineCode::Ok`].
    pub code: MachineCode,
    /// Human-readable description (spec 000: MUST be present when the code is not OK). Never holds secret values.
    pub message: String,
}

impl DriverError {
    /// An error with this code and message.
    pub fn new(code: MachineCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `Unimplemented` for a call the provider does not implement.
    pub fn unimplemented(method: crate::DriverMethod) -> Self {
        Self::new(
            MachineCode::Unimplemented,
            format!("{} is not implemented by this provider", method.name()),
        )
    }

    /// `InvalidArgument` with a message naming the problem.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(MachineCode::InvalidArgument, message)
    }

    /// `NotFound` with a message.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(MachineCode::NotFound, message)
    }

    /// `Internal` with a message.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(MachineCode::Internal, message)
    }
}
