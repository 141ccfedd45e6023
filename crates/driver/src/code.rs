//! Machine codes: the gRPC status codes 0..=16 plus `Uninitialized` (17), with the reference's numeric values.

use std::fmt;

/// The code of a provider call's outcome (spec 000 "Error Scheme"; reference `machinecodes/codes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum MachineCode {
    /// Success.
    Ok = 0,
    /// The call was cancelled.
    Canceled = 1,
    /// Something went wrong, and it is not known what.
    Unknown = 2,
    /// The request was invalid; the message says which parameter.
    InvalidArgument = 3,
    /// The call did not finish before its deadline.
    DeadlineExceeded = 4,
    /// The VM was not found.
    NotFound = 5,
    /// A VM with other parameters exists already.
    AlreadyExists = 6,
    /// The provider credentials lack a permission.
    PermissionDenied = 7,
    /// A quota or limit was reached.
    ResourceExhausted = 8,
    /// The VM is in a state that does not allow the call (the spec's PRECONDITION_FAILED).
    FailedPrecondition = 9,
    /// Another operation on the machine is pending.
    Aborted = 10,
    /// A parameter is out of range, or several VMs were found for one machine.
    OutOfRange = 11,
    /// The provider does not implement the call.
    Unimplemented = 12,
    /// An invariant of the provider is broken.
    Internal = 13,
    /// The provider's service is unavailable for now.
    Unavailable = 14,
    /// Data was lost.
    DataLoss = 15,
    /// The provider credentials are missing or invalid.
    Unauthenticated = 16,
    /// The VM exists but could not be initialized (MCM-specific, spec 002 section 11).
    Uninitialized = 17,
}

impl MachineCode {
    /// Every code, by number.
    pub const ALL: [Self; 18] = [
        Self::Ok,
        Self::Canceled,
        Self::Unknown,
        Self::InvalidArgument,
        Self::DeadlineExceeded,
        Self::NotFound,
        Self::AlreadyExists,
        Self::PermissionDenied,
        Self::ResourceExhausted,
        Self::FailedPrecondition,
        Self::Aborted,
        Self::OutOfRange,
        Self::Unimplemented,
        Self::Internal,
        Self::Unavailable,
        Self::DataLoss,
        Self::Unauthenticated,
        Self::Uninitialized,
    ];

    /// The code's number.
    pub fn number(self) -> u32 {
        u32::from(self as u8)
    }

    /// The code with this number, if there is one.
    pub fn from_number(number: u32) -> Option<Self> {
        usize::try_from(number)
            .ok()
            .and_then(|n| Self::ALL.get(n).copied())
    }

    /// The name the reference prints (Go `codes.Code.String()`), also written to `lastOperation.errorCode`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::Canceled => "Canceled",
            Self::Unknown => "Unknown",
            Self::InvalidArgument => "InvalidArgument",
            Self::DeadlineExceeded => "DeadlineExceeded",
            Self::NotFound => "NotFound",
            Self::AlreadyExists => "AlreadyExists",
            Self::PermissionDenied => "PermissionDenied",
            Self::ResourceExhausted => "ResourceExhausted",
            Self::FailedPrecondition => "FailedPrecondition",
            Self::Aborted => "Aborted",
            Self::OutOfRange => "OutOfRange",
            Self::Unimplemented => "Unimplemented",
            Self::Internal => "Internal",
            Self::Unavailable => "Unavailable",
            Self::DataLoss => "DataLoss",
            Self::Unauthenticated => "Unauthenticated",
            Self::Uninitialized => "Uninitialized",
        }
    }

    /// The code with this reference name ([`MachineCode::name`]), as read back from `lastOperation.errorCode`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|code| code.name() == name)
    }

    /// The name the spec's tables use (`INVALID_ARGUMENT`, `PRECONDITION_FAILED`, ...).
    pub fn spec_name(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::Canceled => "CANCELED",
            Self::Unknown => "UNKNOWN",
            Self::InvalidArgument => "INVALID_ARGUMENT",
            Self::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Self::NotFound => "NOT_FOUND",
            Self::AlreadyExists => "ALREADY_EXISTS",
            Self::PermissionDenied => "PERMISSION_DENIED",
            Self::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Self::FailedPrecondition => "PRECONDITION_FAILED",
            Self::Aborted => "ABORTED",
            Self::OutOfRange => "OUT_OF_RANGE",
            Self::Unimplemented => "UNIMPLEMENTED",
            Self::Internal => "INTERNAL",
            Self::Unavailable => "UNAVAILABLE",
            Self::DataLoss => "DATA_LOSS",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::Uninitialized => "UNINITIALIZED",
        }
    }
}

impl fmt::Display for MachineCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.number())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_the_references_and_round_trip() {
        for (n, code) in MachineCode::ALL.into_iter().enumerate() {
            assert_eq!(code.number() as usize, n);
            assert_eq!(MachineCode::from_number(code.number()), Some(code));
            assert_eq!(MachineCode::from_name(code.name()), Some(code));
        }
        assert_eq!(MachineCode::Uninitialized.number(), 17);
        assert_eq!(MachineCode::from_number(18), None);
    }
}
