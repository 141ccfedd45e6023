//! The spec's per-method tables of machine codes as data: for each provider call and code, the condition, the
//! recovery behaviour, and whether "Auto Retry Required" is Y.
//!
//! The tables are those of spec 000 (`CreateMachine`, `DeleteMachine`, `GetMachineStatus`, `ListMachines`,
//! `GetVolumeIDs`, `GenerateMachineClassForMigration` under its "MigrateMachineClass Errors" heading), plus what
//! spec 002 section 11 adds: the `InitializeMachine` table and the `17 UNINITIALIZED` row of `GetMachineStatus`.
//! Texts are the spec's, with backticks removed and white space folded. The test `tests/retry_tables.rs` reads the
//! tables out of the spec files at test time and compares them row by row with this data.
//!
//! **A code that a method's table does not list is treated as not auto-retried** ([`auto_retry`] answers false):
//! the error is recorded and the machine waits for a change, as for any other N code.

use crate::MachineCode;

/// The provider calls of spec 000 (and `InitializeMachine` of spec 002 section 11).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DriverMethod {
    /// `CreateMachine` (REQUIRED).
    CreateMachine,
    /// `InitializeMachine` (optional).
    InitializeMachine,
    /// `DeleteMachine` (REQUIRED).
    DeleteMachine,
    /// `GetMachineStatus` (optional).
    GetMachineStatus,
    /// `ListMachines` (optional).
    ListMachines,
    /// `GetVolumeIDs` (optional).
    GetVolumeIds,
    /// `GenerateMachineClassForMigration` (optional; SHOULD be implemented).
    GenerateMachineClassForMigration,
}

impl DriverMethod {
    /// Every method.
    pub const ALL: [Self; 7] = [
        Self::CreateMachine,
        Self::InitializeMachine,
        Self::DeleteMachine,
        Self::GetMachineStatus,
        Self::ListMachines,
        Self::GetVolumeIds,
        Self::GenerateMachineClassForMigration,
    ];

    /// The method's name in the spec.
    pub fn name(self) -> &'static str {
        match self {
            Self::CreateMachine => "CreateMachine",
            Self::InitializeMachine => "InitializeMachine",
            Self::DeleteMachine => "DeleteMachine",
            Self::GetMachineStatus => "GetMachineStatus",
            Self::ListMachines => "ListMachines",
            Self::GetVolumeIds => "GetVolumeIDs",
            Self::GenerateMachineClassForMigration => "GenerateMachineClassForMigration",
        }
    }

    /// The method with this spec name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|method| method.name() == name)
    }

    /// Whether the spec makes the method REQUIRED (the others default to `Unimplemented`).
    pub fn is_required(self) -> bool {
        matches!(self, Self::CreateMachine | Self::DeleteMachine)
    }
}

/// One row of a method's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeRule {
    /// The machine code.
    pub code: MachineCode,
    /// The spec's "Condition" column.
    pub condition: &'static str,
    /// The spec's "Recovery Behavior" column (may be empty).
    pub recovery: &'static str,
    /// The spec's "Auto Retry Required" column: Y is true.
    pub auto_retry: bool,
}

const fn rule(
    code: MachineCode,
    condition: &'static str,
    recovery: &'static str,
    auto_retry: bool,
) -> CodeRule {
    CodeRule {
        code,
        condition,
        recovery,
        auto_retry,
    }
}

/// The table of a method, in the spec's order.
pub fn table(method: DriverMethod) -> &'static [CodeRule] {
    match method {
        DriverMethod::CreateMachine => CREATE_MACHINE,
        DriverMethod::InitializeMachine => INITIALIZE_MACHINE,
        DriverMethod::DeleteMachine => DELETE_MACHINE,
        DriverMethod::GetMachineStatus => GET_MACHINE_STATUS,
        DriverMethod::ListMachines => LIST_MACHINES,
        DriverMethod::GetVolumeIds => GET_VOLUME_IDS,
        DriverMethod::GenerateMachineClassForMigration => GENERATE_MACHINE_CLASS_FOR_MIGRATION,
    }
}

/// The row of a method's table for a code, if the table lists the code.
pub fn rule_for(method: DriverMethod, code: MachineCode) -> Option<&'static CodeRule> {
    table(method).iter().find(|rule| rule.code == code)
}

/// Whether an error of this code from this method is retried automatically (with back-off). Codes a table does not
/// list are not.
pub fn auto_retry(method: DriverMethod, code: MachineCode) -> bool {
    rule_for(method, code).is_some_and(|rule| rule.auto_retry)
}

// The data below was produced from the spec text and is checked against it by tests/retry_tables.rs.

/// `CreateMachine` (spec 000).
pub(crate) const CREATE_MACHINE: &[CodeRule] = &[
    rule(MachineCode::Ok, "Successful", "", false),
    rule(MachineCode::Canceled, "Cancelled", "", false),
    rule(
        MachineCode::Unknown,
        "Something went wrong",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::InvalidArgument,
        "Re-check supplied parameters",
        "Update providerSpec to fix issues.",
        false,
    ),
    rule(
        MachineCode::DeadlineExceeded,
        "Timeout",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::AlreadyExists,
        "Already exists but desired parameters doesn't match",
        "Create machine with a different name",
        false,
    ),
    rule(
        MachineCode::PermissionDenied,
        "Insufficent permissions",
        "Update requestor permissions to grant the same",
        false,
    ),
    rule(
        MachineCode::ResourceExhausted,
        "Resource limits have been reached",
        "Enhance resource limits associated with the user/account to process this",
        false,
    ),
    rule(
        MachineCode::FailedPrecondition,
        "VM is in inconsistent state",
        "Manual intervention might be needed to fix the state of the VM",
        false,
    ),
    rule(
        MachineCode::Aborted,
        "Operation is pending",
        "Wait until previous pending operation is processed",
        true,
    ),
    rule(
        MachineCode::OutOfRange,
        "Resources were out of range",
        "Update request paramaters to request valid resource requests",
        false,
    ),
    rule(
        MachineCode::Unimplemented,
        "Not implemented",
        "Retry with an alternate logic or implement this method at the provider. Most methods by default are in this state",
        false,
    ),
    rule(
        MachineCode::Internal,
        "Major error",
        "Needs manual intervension to fix this",
        false,
    ),
    rule(
        MachineCode::Unavailable,
        "Not Available",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::Unauthenticated,
        "Missing provider credentials",
        "Fix the provider credentials",
        false,
    ),
];

/// `InitializeMachine` (spec 002 (InitializeMachine Errors)).
pub(crate) const INITIALIZE_MACHINE: &[CodeRule] = &[
    rule(MachineCode::Ok, "Successful", "", false),
    rule(
        MachineCode::NotFound,
        "Timeout",
        "Skip Initialization and Continue",
        false,
    ),
    rule(
        MachineCode::Unimplemented,
        "Not implemented",
        "Skip Initialization and continue",
        false,
    ),
    rule(
        MachineCode::Internal,
        "Major error",
        "Needs investigation and possible intervention to fix this",
        true,
    ),
    rule(
        MachineCode::Uninitialized,
        "Failed Initialization",
        "Initialization is reattempted in next reconcile cycle",
        true,
    ),
];

/// `DeleteMachine` (spec 000).
pub(crate) const DELETE_MACHINE: &[CodeRule] = &[
    rule(MachineCode::Ok, "Successful", "", false),
    rule(MachineCode::Canceled, "Cancelled", "", false),
    rule(
        MachineCode::Unknown,
        "Something went wrong",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::InvalidArgument,
        "Re-check supplied parameters",
        "Update Machine.Name to fix issues.",
        false,
    ),
    rule(
        MachineCode::DeadlineExceeded,
        "Timeout",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::PermissionDenied,
        "Insufficent permissions",
        "Update requestor permissions to grant the same",
        false,
    ),
    rule(
        MachineCode::FailedPrecondition,
        "VM is in inconsistent state",
        "Manual intervention might be needed to fix the state of the VM",
        false,
    ),
    rule(
        MachineCode::Aborted,
        "Operation is pending",
        "Wait until previous pending operation is processed",
        true,
    ),
    rule(
        MachineCode::Unimplemented,
        "Not implemented",
        "Retry with an alternate logic or implement this method at the provider. Most methods by default are in this state",
        false,
    ),
    rule(
        MachineCode::Internal,
        "Major error",
        "Needs manual intervension to fix this",
        false,
    ),
    rule(
        MachineCode::Unavailable,
        "Not Available",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::Unauthenticated,
        "Missing provider credentials",
        "Fix the provider credentials",
        false,
    ),
];

/// `GetMachineStatus` (spec 000).
pub(crate) const GET_MACHINE_STATUS: &[CodeRule] = &[
    rule(MachineCode::Ok, "Successful", "", false),
    rule(MachineCode::Canceled, "Cancelled", "", false),
    rule(
        MachineCode::Unknown,
        "Something went wrong",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::InvalidArgument,
        "Re-check supplied parameters",
        "Update Machine.Name to fix issues.",
        false,
    ),
    rule(
        MachineCode::DeadlineExceeded,
        "Timeout",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::NotFound,
        "Machine isn't found at provider",
        "Not required",
        false,
    ),
    rule(
        MachineCode::PermissionDenied,
        "Insufficent permissions",
        "Update requestor permissions to grant the same",
        false,
    ),
    rule(
        MachineCode::FailedPrecondition,
        "VM is in inconsistent state",
        "Manual intervention might be needed to fix the state of the VM",
        false,
    ),
    rule(
        MachineCode::OutOfRange,
        "Multiple VMs found",
        "Orphan VM handler to cleanup orphan VMs / Manual intervention maybe required if orphan VM handler isn't enabled.",
        true,
    ),
    rule(
        MachineCode::Unimplemented,
        "Not implemented",
        "Retry with an alternate logic or implement this method at the provider. Most methods by default are in this state",
        false,
    ),
    rule(
        MachineCode::Internal,
        "Major error",
        "Needs manual intervension to fix this",
        false,
    ),
    rule(
        MachineCode::Unavailable,
        "Not Available",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::Unauthenticated,
        "Missing provider credentials",
        "Fix the provider credentials",
        false,
    ),
    rule(
        MachineCode::Uninitialized,
        "Failed Initialization",
        "Initialization is reattempted in next reconcile cycle",
        false,
    ),
];

/// `ListMachines` (spec 000).
pub(crate) const LIST_MACHINES: &[CodeRule] = &[
    rule(MachineCode::Ok, "Successful", "", false),
    rule(MachineCode::Canceled, "Cancelled", "", false),
    rule(
        MachineCode::Unknown,
        "Something went wrong",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::InvalidArgument,
        "Re-check supplied parameters",
        "Update ProviderSpec to fix issues.",
        false,
    ),
    rule(
        MachineCode::DeadlineExceeded,
        "Timeout",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::PermissionDenied,
        "Insufficent permissions",
        "Update requestor permissions to grant the same",
        false,
    ),
    rule(
        MachineCode::Unimplemented,
        "Not implemented",
        "Retry with an alternate logic or implement this method at the provider. Most methods by default are in this state",
        false,
    ),
    rule(
        MachineCode::Internal,
        "Major error",
        "Needs manual intervension to fix this",
        false,
    ),
    rule(
        MachineCode::Unavailable,
        "Not Available",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::Unauthenticated,
        "Missing provider credentials",
        "Fix the provider credentials",
        false,
    ),
];

/// `GetVolumeIDs` (spec 000).
pub(crate) const GET_VOLUME_IDS: &[CodeRule] = &[
    rule(MachineCode::Ok, "Successful", "", false),
    rule(MachineCode::Canceled, "Cancelled", "", false),
    rule(
        MachineCode::Unknown,
        "Something went wrong",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::InvalidArgument,
        "Re-check supplied parameters",
        "Update PVSpecList to fix issues.",
        false,
    ),
    rule(
        MachineCode::DeadlineExceeded,
        "Timeout",
        "Retry operation after sometime",
        true,
    ),
    rule(
        MachineCode::Unimplemented,
        "Not implemented",
        "Retry with an alternate logic or implement this method at the provider. Most methods by default are in this state",
        false,
    ),
    rule(
        MachineCode::Internal,
        "Major error",
        "Needs manual intervension to fix this",
        false,
    ),
    rule(
        MachineCode::Unavailable,
        "Not Available",
        "Retry operation after sometime",
        true,
    ),
];

/// `GenerateMachineClassForMigration` (spec 000).
pub(crate) const GENERATE_MACHINE_CLASS_FOR_MIGRATION: &[CodeRule] = &[
    rule(
        MachineCode::Ok,
        "Successful",
        "Machine reconcilation is retried once the new class has been created",
        true,
    ),
    rule(MachineCode::Unimplemented, "Not implemented", "None", false),
    rule(
        MachineCode::Internal,
        "Major error",
        "Might need manual intervension to fix this",
        true,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_create_codes_retry_and_configuration_codes_do_not() {
        for code in [
            MachineCode::Unknown,
            MachineCode::DeadlineExceeded,
            MachineCode::Aborted,
            MachineCode::Unavailable,
        ] {
            assert!(auto_retry(DriverMethod::CreateMachine, code), "{code}");
        }
        for code in [
            MachineCode::InvalidArgument,
            MachineCode::ResourceExhausted,
            MachineCode::Unauthenticated,
        ] {
            assert!(!auto_retry(DriverMethod::CreateMachine, code), "{code}");
        }
    }

    #[test]
    fn unlisted_codes_are_not_auto_retried() {
        assert!(rule_for(DriverMethod::CreateMachine, MachineCode::NotFound).is_none());
        assert!(!auto_retry(DriverMethod::CreateMachine, MachineCode::NotFound));
        assert!(!auto_retry(DriverMethod::GetVolumeIds, MachineCode::DataLoss));
    }

    #[test]
    fn uninitialized_retries_initialize_but_not_get_machine_status() {
        assert!(auto_retry(
            DriverMethod::InitializeMachine,
            MachineCode::Uninitialized
        ));
        assert!(!auto_retry(
            DriverMethod::GetMachineStatus,
            MachineCode::Uninitialized
        ));
        assert!(rule_for(DriverMethod::GetMachineStatus, MachineCode::Uninitialized).is_some());
    }
}
