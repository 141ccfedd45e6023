//! The provider conformance suite: the rules of the provider contract (spec 000, and spec 002 section 11 for
//! `InitializeMachine`) checked against a live provider through a [`GrpcDriver`].
//!
//! [`run`] creates, inspects and deletes a few VMs named `<name_prefix>-<n>` from the [`Input`] class and returns one
//! [`Check`] per rule, each quoting the spec sentence it checks. The checks run in a fixed order (see
//! [`CHECK_NAMES`]); each one that needs a VM says so and is skipped when an earlier step could not make one, and
//! every VM the suite may have created is deleted at the end, whatever failed (the `cleanup` check says whether that
//! worked). Every call is bounded by [`CALL_TIMEOUT`] (or the bound given to [`run_with_timeout`]); a call that does
//! not answer in time fails its check. [`render`] makes a report of the checks, [`passed`] the verdict.
//!
//! Optional calls are judged against the identity's `optional_methods`: a declared call must work, an undeclared one
//! must answer `Unimplemented`. A check uses another optional call only as corroboration (for example ListMachines to
//! see that a repeated CreateMachine made no second VM), and only when that call is declared and answers; its
//! failures are reported by its own check, so that one broken rule fails one check.
//!
//! The name prefix must not be used by any other machine of the provider: the suite deletes `<name_prefix>-1` to
//! `<name_prefix>-4`.

use std::{
    collections::BTreeMap,
    fmt::{self, Write as _},
    future::Future,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use mcm_api::{ClassSpec, Machine, MachineClass, MachineSpec};
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, DriverMethod, GenerateMachineClassForMigrationRequest, GetMachineStatusRequest,
    GetMachineStatusResponse, GetVolumeIdsRequest, InitializeMachineRequest, InitializeMachineResponse,
    ListMachinesRequest, MachineCode,
};

use crate::{GrpcDriver, PROTOCOL_VERSION, ProviderInfo};

/// How long one call of the suite may take; a call that takes longer fails its check.
pub const CALL_TIMEOUT: Duration = Duration::from_mins(1);

/// Check: the Identity service answers a name and protocol version `v1`, and the probe answers ready.
pub const IDENTITY: &str = "identity";
/// Check: CreateMachine answers a non-empty providerID and node name.
pub const CREATE_MACHINE: &str = "create-machine";
/// Check: CreateMachine repeated for the same machine answers the same VM and makes no second one.
pub const CREATE_MACHINE_IDEMPOTENT: &str = "create-machine-idempotent";
/// Check: GetMachineStatus finds the VM (declared), or answers Unimplemented (not declared).
pub const GET_MACHINE_STATUS: &str = "get-machine-status";
/// Check: ListMachines lists providerID to machine name (declared), or answers Unimplemented (not declared).
pub const LIST_MACHINES: &str = "list-machines";
/// Check: InitializeMachine initializes the VM (declared), or answers Unimplemented (not declared).
pub const INITIALIZE_MACHINE: &str = "initialize-machine";
/// Check: a providerSpec missing a mandatory field is refused with InvalidArgument and a message, and makes no VM.
pub const INVALID_PROVIDER_SPEC: &str = "invalid-provider-spec";
/// Check: every error answered during the whole run carries a message.
pub const ERROR_MESSAGES: &str = "error-messages";
/// Check: DeleteMachine succeeds, again for the deleted VM, and for a machine that never had one.
pub const DELETE_MACHINE_IDEMPOTENT: &str = "delete-machine-idempotent";
/// Check: after deletion GetMachineStatus answers NotFound and ListMachines no longer lists the VM.
pub const DELETED_MACHINE_NOT_FOUND: &str = "deleted-machine-not-found";
/// Check: GetVolumeIDs of an empty list answers an empty list (declared), or Unimplemented (not declared).
pub const GET_VOLUME_IDS: &str = "get-volume-ids";
/// Check: GenerateMachineClassForMigration answers Unimplemented when not declared.
pub const GENERATE_MACHINE_CLASS_FOR_MIGRATION: &str = "generate-machine-class-for-migration";
/// Check: every VM the suite may have made is deleted at the end.
pub const CLEANUP: &str = "cleanup";

/// The names of the checks, in the order [`run`] returns them.
pub const CHECK_NAMES: [&str; 13] = [
    IDENTITY,
    CREATE_MACHINE,
    CREATE_MACHINE_IDEMPOTENT,
    INITIALIZE_MACHINE,
    GET_MACHINE_STATUS,
    LIST_MACHINES,
    INVALID_PROVIDER_SPEC,
    ERROR_MESSAGES,
    DELETE_MACHINE_IDEMPOTENT,
    DELETED_MACHINE_NOT_FOUND,
    GET_VOLUME_IDS,
    GENERATE_MACHINE_CLASS_FOR_MIGRATION,
    CLEANUP,
];

// The spec sentences each check verifies, quoted.

const IDENTITY_REQUIREMENT: &str = concat!(
    "spec 000 Available Services: \"This specification does not dictate the mechanism by which mode of operation ",
    "MUST be discovered, and instead places that burden upon the VM Provider.\" (protocol v1: the Identity service ",
    "answers the provider's name, protocol_version \"v1\" and its optional calls, and Probe answers ready)"
);
const CREATE_MACHINE_REQUIREMENT: &str = concat!(
    "spec 000 CreateMachine: \"A Provider is REQUIRED to implement this interface method.\" \"The ",
    "`CreateMachineResponse` returned by this method is expected to return `ProviderID` that uniquely identifys the ",
    "VM at the provider\" and \"`NodeName` that is the expected name of the machine when it joins the cluster.\""
);
const CREATE_MACHINE_IDEMPOTENT_REQUIREMENT: &str = concat!(
    "spec 000 CreateMachine: \"If VM backing the `Machine.Name` already exists, and is compatible with the ",
    "specified `Machine` object in the `CreateMachineRequest`, the Provider MUST reply `0 OK` with the corresponding ",
    "`CreateMachineResponse`.\" \"The provider MUST have a unique way to map a `machine object` to a `VM`.\""
);
const GET_MACHINE_STATUS_REQUIREMENT: &str = concat!(
    "spec 000 GetMachineStatus: \"If a VM corresponding to the specified machine object's `Machine.Name` exists on ",
    "provider the `GetMachineStatusResponse` fields are to be filled similar to the `CreateMachineResponse`.\" ",
    "\"This operation MUST be idempotent.\" Not declared: \"A Provider can OPTIONALLY implement this driver call. ",
    "Else should return a `UNIMPLEMENTED` status in error.\""
);
const LIST_MACHINES_REQUIREMENT: &str = concat!(
    "spec 000 ListMachines: \"The Provider SHALL return the information about all the machines associated with the ",
    "`MachineClass`.\" \"Key is expected to contain the `ProviderID` & Value is expected to contain the ",
    "`Machine.Name`\". Not declared: \"A Provider can OPTIONALLY implement this driver call. Else should return a ",
    "`UNIMPLEMENTED` status in error.\""
);
const INITIALIZE_MACHINE_REQUIREMENT: &str = concat!(
    "spec 002 section 11 InitializeMachine: \"This call requests the provider to initialize a newly created VM ",
    "backing the machine-object.\", returning the \"ProviderID that uniquely identifys the VM at the provider\" and ",
    "the \"NodeName\"; \"If the provider is unable to complete the InitializeMachine call successfully, it MUST ",
    "return a non-ok machine code in the machine status.\" Not declared: \"Provider can OPTIONALLY implement this ",
    "driver call. Else should return a UNIMPLEMENTED status in error.\""
);
const INVALID_PROVIDER_SPEC_REQUIREMENT: &str = concat!(
    "spec 000: \"The `ProviderSpec` is validated by methods that receive it as a request field for presence of all ",
    "mandatory parameters and tags, and for validity of all parameters.\" CreateMachine Errors: \"If the conditions ",
    "defined below are encountered, the provider MUST return the specified machine error code.\" \"3 ",
    "INVALID_ARGUMENT | Re-check supplied parameters | [...] Exact issue to be given in `.message`\""
);
const ERROR_MESSAGES_REQUIREMENT: &str = concat!(
    "spec 000, every call: \"The status `message` MUST contain a human readable description of error, if the ",
    "status `code` is not `OK`.\""
);
const DELETE_MACHINE_IDEMPOTENT_REQUIREMENT: &str = concat!(
    "spec 000 DeleteMachine: \"A Provider is REQUIRED to implement this driver call.\" \"If a VM corresponding to ",
    "the specified machine-object's name does not exist or the artifacts associated with the VM do not exist ",
    "anymore (after deletion), the Provider MUST reply `0 OK`.\""
);
const DELETED_MACHINE_NOT_FOUND_REQUIREMENT: &str = concat!(
    "spec 000 GetMachineStatus Errors: \"If the conditions defined below are encountered, the provider MUST return ",
    "the specified machine error code.\" \"5 NOT_FOUND | Machine isn't found at provider\"; ListMachines: \"The ",
    "Provider SHALL return the information about all the machines associated with the `MachineClass`.\""
);
const GET_VOLUME_IDS_REQUIREMENT: &str = concat!(
    "spec 000 GetVolumeIDs: \"On succesful returnal of a list of `Volume-IDs` for all supplied `PVSpecs`, the ",
    "Provider MUST reply `0 OK`.\" \"This operation MUST be idempotent.\" Not declared: \"A Provider can OPTIONALLY ",
    "implement this driver call. Else should return a `UNIMPLEMENTED` status in error.\""
);
const GENERATE_MACHINE_CLASS_FOR_MIGRATION_REQUIREMENT: &str = concat!(
    "spec 000 GenerateMachineClassForMigration: \"A Provider SHOULD implement this driver call, else it MUST return ",
    "a `UNIMPLEMENTED` status in error.\""
);
const CLEANUP_REQUIREMENT: &str = concat!(
    "spec 000 Machine Provider Interface: \"The provider MUST have a unique way to map a `machine object` to a `VM` ",
    "which triggers the deletion for the corresponding VM backing the machine object.\""
);

/// Why a check that needs the provider's identity was skipped.
const IDENTITY_UNKNOWN: &str = "the provider's identity is unknown (GetProviderInfo failed): which optional calls \
                                it implements cannot be told";

/// What the suite runs against.
#[derive(Clone)]
pub struct Input {
    /// A valid class of the provider; its namespace (else `default`) is the machines' namespace.
    pub class: MachineClass,
    /// The class's secret (credentials, userData).
    pub secret: Secret,
    /// Machines are named `<name_prefix>-<n>` (n = 1 to 4); no other machine of the provider may use the prefix.
    pub name_prefix: String,
}

impl fmt::Debug for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The secret holds credentials: its name only.
        f.debug_struct("Input")
            .field("class", &self.class.metadata.name)
            .field("secret", &self.secret.metadata.name)
            .field("name_prefix", &self.name_prefix)
            .finish()
    }
}

/// How a check went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The provider follows the rule.
    Passed,
    /// The provider breaks the rule: what was seen.
    Failed(String),
    /// The rule could not be checked: why.
    Skipped(String),
}

/// One rule checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// The check's name (one of [`CHECK_NAMES`]).
    pub name: &'static str,
    /// The spec sentence (MUST/SHALL) it checks, quoted.
    pub requirement: &'static str,
    /// How it went.
    pub outcome: Outcome,
}

/// Whether the provider conforms: no check failed, and at least one passed.
pub fn passed(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.outcome == Outcome::Passed)
        && !checks.iter().any(|c| matches!(c.outcome, Outcome::Failed(_)))
}

/// A report: one line per check (`PASS`, `FAIL` or `SKIP`, the name, the detail; a failure also quotes the
/// requirement), then a summary line.
pub fn render(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    let (mut pass, mut fail, mut skip) = (0, 0, 0);
    for check in checks {
        let name = check.name;
        // Writing to a String cannot fail.
        let _ = match &check.outcome {
            Outcome::Passed => {
                pass += 1;
                writeln!(out, "PASS {name}")
            }
            Outcome::Failed(detail) => {
                fail += 1;
                writeln!(
                    out,
                    "FAIL {name:<width$}  {}  [requirement: {}]",
                    one_line(detail),
                    check.requirement
                )
            }
            Outcome::Skipped(detail) => {
                skip += 1;
                writeln!(out, "SKIP {name:<width$}  {}", one_line(detail))
            }
        };
    }
    let verdict = if passed(checks) {
        "the provider conforms"
    } else {
        "the provider does NOT conform"
    };
    let _ = writeln!(
        out,
        "{} checks: {pass} passed, {fail} failed, {skip} skipped: {verdict}",
        checks.len()
    );
    out
}

fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

/// Runs every check against the provider behind `driver`, in the order of [`CHECK_NAMES`], and deletes the VMs it
/// made. It never panics on a provider's answer; every call is bounded by [`CALL_TIMEOUT`].
pub async fn run(driver: &GrpcDriver, input: &Input) -> Vec<Check> {
    run_with_timeout(driver, input, CALL_TIMEOUT).await
}

/// [`run`] with another bound on every call.
pub async fn run_with_timeout(driver: &GrpcDriver, input: &Input, call_timeout: Duration) -> Vec<Check> {
    let mut suite = Suite {
        driver,
        input,
        call_timeout,
        info: None,
        created: None,
        errors: Mutex::new(Vec::new()),
    };
    let mut checks = Vec::with_capacity(CHECK_NAMES.len());

    let (outcome, info) = suite.identity().await;
    suite.info = info;
    checks.push(check(IDENTITY, IDENTITY_REQUIREMENT, outcome));

    let (outcome, created) = suite.create_machine().await;
    suite.created = created;
    checks.push(check(CREATE_MACHINE, CREATE_MACHINE_REQUIREMENT, outcome));

    checks.push(check(
        CREATE_MACHINE_IDEMPOTENT,
        CREATE_MACHINE_IDEMPOTENT_REQUIREMENT,
        verdict(suite.create_machine_idempotent().await),
    ));
    // Right after creation, as the machine controller does: a provider with something to initialise answers
    // GetMachineStatus Uninitialized until then (spec 002 section 11).
    checks.push(check(
        INITIALIZE_MACHINE,
        INITIALIZE_MACHINE_REQUIREMENT,
        verdict(suite.initialize_machine().await),
    ));
    checks.push(check(
        GET_MACHINE_STATUS,
        GET_MACHINE_STATUS_REQUIREMENT,
        verdict(suite.get_machine_status().await),
    ));
    checks.push(check(
        LIST_MACHINES,
        LIST_MACHINES_REQUIREMENT,
        verdict(suite.list_machines().await),
    ));
    checks.push(check(
        INVALID_PROVIDER_SPEC,
        INVALID_PROVIDER_SPEC_REQUIREMENT,
        verdict(suite.invalid_provider_spec().await),
    ));
    // Judged at the end, over the errors of the whole run (cleanup included).
    suite.provoke_errors().await;
    let messages_at = checks.len();
    checks.push(check(
        ERROR_MESSAGES,
        ERROR_MESSAGES_REQUIREMENT,
        Outcome::Skipped(String::new()),
    ));
    checks.push(check(
        DELETE_MACHINE_IDEMPOTENT,
        DELETE_MACHINE_IDEMPOTENT_REQUIREMENT,
        verdict(suite.delete_machine_idempotent().await),
    ));
    checks.push(check(
        DELETED_MACHINE_NOT_FOUND,
        DELETED_MACHINE_NOT_FOUND_REQUIREMENT,
        verdict(suite.deleted_machine_not_found().await),
    ));
    checks.push(check(
        GET_VOLUME_IDS,
        GET_VOLUME_IDS_REQUIREMENT,
        verdict(suite.get_volume_ids().await),
    ));
    checks.push(check(
        GENERATE_MACHINE_CLASS_FOR_MIGRATION,
        GENERATE_MACHINE_CLASS_FOR_MIGRATION_REQUIREMENT,
        verdict(suite.generate_machine_class_for_migration().await),
    ));
    checks.push(check(
        CLEANUP,
        CLEANUP_REQUIREMENT,
        verdict(suite.cleanup().await),
    ));
    checks[messages_at].outcome = suite.error_messages();
    checks
}

fn check(name: &'static str, requirement: &'static str, outcome: Outcome) -> Check {
    Check {
        name,
        requirement,
        outcome,
    }
}

/// A check's result: `Err` is a failure with its detail; `Ok` is [`Outcome::Passed`] or [`Outcome::Skipped`].
type Verdict = Result<Outcome, String>;

fn verdict(result: Verdict) -> Outcome {
    result.unwrap_or_else(Outcome::Failed)
}

/// Passed when there are no problems, else failed with all of them.
fn judge(problems: &[String]) -> Verdict {
    if problems.is_empty() {
        Ok(Outcome::Passed)
    } else {
        Err(problems.join("; "))
    }
}

/// A call that did not succeed.
#[derive(Debug)]
enum CallError {
    /// No answer within the call timeout.
    Timeout(&'static str, Duration),
    /// An error answer.
    Driver(&'static str, DriverError),
}

impl CallError {
    fn code(&self) -> Option<MachineCode> {
        match self {
            Self::Timeout(..) => None,
            Self::Driver(_, error) => Some(error.code),
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(call, timeout) => write!(f, "{call} did not answer within {timeout:?}"),
            Self::Driver(call, error) => write!(f, "{call} answered {} {:?}", error.code, error.message),
        }
    }
}

/// An error answer seen during the run.
struct Seen {
    call: &'static str,
    code: MachineCode,
    message: String,
}

/// The VM of machine 1 (the suite's main machine), the refused creations, and a machine that never has a VM.
const MAIN: u32 = 1;
const WITHOUT_SIZE: u32 = 2;
const WITHOUT_SPEC: u32 = 3;
const NEVER_CREATED: u32 = 4;

struct Suite<'a> {
    driver: &'a GrpcDriver,
    input: &'a Input,
    call_timeout: Duration,
    /// The identity, when GetProviderInfo answered.
    info: Option<ProviderInfo>,
    /// The answer of the first CreateMachine of the main machine, when it succeeded.
    created: Option<CreateMachineResponse>,
    errors: Mutex<Vec<Seen>>,
}

impl Suite<'_> {
    // --- calls -------------------------------------------------------------------------------------------------

    /// Awaits a call for at most the call timeout, recording an error answer.
    async fn timed<T>(
        &self,
        call: &'static str,
        future: impl Future<Output = Result<T, DriverError>>,
    ) -> Result<T, CallError> {
        match tokio::time::timeout(self.call_timeout, future).await {
            Err(_) => Err(CallError::Timeout(call, self.call_timeout)),
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                self.errors
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Seen {
                        call,
                        code: error.code,
                        message: error.message.clone(),
                    });
                Err(CallError::Driver(call, error))
            }
        }
    }

    fn name(&self, n: u32) -> String {
        format!("{}-{n}", self.input.name_prefix)
    }

    fn namespace(&self) -> String {
        self.input
            .class
            .metadata
            .namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_owned())
    }

    /// Machine `n` of the class, with this providerID (empty before creation).
    fn machine(&self, n: u32, provider_id: &str) -> Machine {
        Machine {
            metadata: ObjectMeta {
                name: Some(self.name(n)),
                namespace: Some(self.namespace()),
                ..ObjectMeta::default()
            },
            spec: MachineSpec {
                class: ClassSpec {
                    api_group: String::new(),
                    kind: "MachineClass".to_owned(),
                    name: self.input.class.metadata.name.clone().unwrap_or_default(),
                },
                provider_id: provider_id.to_owned(),
                ..MachineSpec::default()
            },
            status: None,
        }
    }

    /// The providerID the controller would have recorded on machine `n`.
    fn provider_id(&self, n: u32) -> &str {
        match &self.created {
            Some(created) if n == MAIN => &created.provider_id,
            _ => "",
        }
    }

    fn declared(&self, method: DriverMethod) -> Option<bool> {
        self.info
            .as_ref()
            .map(|info| info.optional_methods.contains(&method))
    }

    async fn create(&self, n: u32, class: &MachineClass) -> Result<CreateMachineResponse, CallError> {
        let request = CreateMachineRequest {
            machine: self.machine(n, ""),
            machine_class: class.clone(),
            secret: self.input.secret.clone(),
        };
        self.timed("CreateMachine", self.driver.create_machine(&request))
            .await
    }

    async fn delete(&self, n: u32) -> Result<DeleteMachineResponse, CallError> {
        let request = DeleteMachineRequest {
            machine: self.machine(n, self.provider_id(n)),
            machine_class: self.input.class.clone(),
            secret: self.input.secret.clone(),
        };
        self.timed("DeleteMachine", self.driver.delete_machine(&request))
            .await
    }

    async fn status(&self, n: u32) -> Result<GetMachineStatusResponse, CallError> {
        let request = GetMachineStatusRequest {
            machine: self.machine(n, self.provider_id(n)),
            machine_class: self.input.class.clone(),
            secret: self.input.secret.clone(),
        };
        self.timed("GetMachineStatus", self.driver.get_machine_status(&request))
            .await
    }

    async fn initialize(&self, n: u32) -> Result<InitializeMachineResponse, CallError> {
        let request = InitializeMachineRequest {
            machine: self.machine(n, self.provider_id(n)),
            machine_class: self.input.class.clone(),
            secret: self.input.secret.clone(),
        };
        self.timed("InitializeMachine", self.driver.initialize_machine(&request))
            .await
    }

    async fn list(&self) -> Result<BTreeMap<String, String>, CallError> {
        let request = ListMachinesRequest {
            machine_class: self.input.class.clone(),
            secret: self.input.secret.clone(),
        };
        self.timed("ListMachines", self.driver.list_machines(&request))
            .await
            .map(|r| r.machine_list)
    }

    /// The provider's list, for corroboration: only when ListMachines is declared and answers (its failures are
    /// the `list-machines` check's).
    async fn listing(&self) -> Option<BTreeMap<String, String>> {
        if self.declared(DriverMethod::ListMachines) == Some(true) {
            self.list().await.ok()
        } else {
            None
        }
    }

    /// Evidence that machine `n` has a VM: GetMachineStatus answering OK, or ListMachines listing it (each only
    /// when declared; an answer other than OK or NotFound proves nothing).
    async fn vm_evidence(&self, n: u32) -> Option<String> {
        let name = self.name(n);
        if self.declared(DriverMethod::GetMachineStatus) == Some(true)
            && let Ok(status) = self.status(n).await
        {
            return Some(format!(
                "GetMachineStatus of machine {name} answers OK with providerID {:?}",
                status.provider_id
            ));
        }
        let listed: Vec<String> = self
            .listing()
            .await?
            .into_iter()
            .filter(|(_, machine)| *machine == name)
            .map(|(id, _)| id)
            .collect();
        (!listed.is_empty()).then(|| format!("ListMachines lists {listed:?} for machine {name}"))
    }

    // --- checks ------------------------------------------------------------------------------------------------

    async fn identity(&self) -> (Outcome, Option<ProviderInfo>) {
        let (info, protocol) = match self.timed("GetProviderInfo", self.driver.provider_info()).await {
            Ok(answer) => answer,
            Err(err) => return (Outcome::Failed(err.to_string()), None),
        };
        let mut problems = Vec::new();
        if info.name.trim().is_empty() {
            problems.push("GetProviderInfo answered an empty provider name".to_owned());
        }
        if protocol != PROTOCOL_VERSION {
            problems.push(format!(
                "GetProviderInfo answered protocol_version {protocol:?}, expected {PROTOCOL_VERSION:?}"
            ));
        }
        match self.timed("Probe", self.driver.probe()).await {
            Ok(true) => {}
            Ok(false) => problems.push("Probe answered ready: false".to_owned()),
            Err(err) => problems.push(err.to_string()),
        }
        (verdict(judge(&problems)), Some(info))
    }

    async fn create_machine(&self) -> (Outcome, Option<CreateMachineResponse>) {
        match self.create(MAIN, &self.input.class).await {
            Err(err) => (Outcome::Failed(err.to_string()), None),
            Ok(created) => {
                let mut problems = Vec::new();
                if created.provider_id.is_empty() {
                    problems.push(format!(
                        "CreateMachine of {} answered an empty providerID",
                        self.name(MAIN)
                    ));
                }
                if created.node_name.is_empty() {
                    problems.push(format!(
                        "CreateMachine of {} answered an empty node name",
                        self.name(MAIN)
                    ));
                }
                (verdict(judge(&problems)), Some(created))
            }
        }
    }

    async fn create_machine_idempotent(&self) -> Verdict {
        let Some(first) = &self.created else {
            return Ok(Outcome::Skipped(
                "the first CreateMachine failed: nothing to repeat".to_owned(),
            ));
        };
        let name = self.name(MAIN);
        let again = self
            .create(MAIN, &self.input.class)
            .await
            .map_err(|err| format!("CreateMachine repeated for machine {name}: {err}"))?;
        let mut problems = Vec::new();
        if again.provider_id != first.provider_id {
            problems.push(format!(
                "CreateMachine repeated for machine {name} answered providerID {:?}, the first {:?}",
                again.provider_id, first.provider_id
            ));
        }
        if again.node_name != first.node_name {
            problems.push(format!(
                "CreateMachine repeated for machine {name} answered node name {:?}, the first {:?}",
                again.node_name, first.node_name
            ));
        }
        if let Some(list) = self.listing().await {
            let vms: Vec<&String> = list
                .iter()
                .filter(|(_, m)| **m == name)
                .map(|(id, _)| id)
                .collect();
            if vms.len() > 1 {
                problems.push(format!(
                    "ListMachines lists {} VMs for machine {name}: {vms:?}",
                    vms.len()
                ));
            }
        }
        judge(&problems)
    }

    async fn get_machine_status(&self) -> Verdict {
        let method = DriverMethod::GetMachineStatus;
        match self.declared(method) {
            None => Ok(Outcome::Skipped(IDENTITY_UNKNOWN.to_owned())),
            Some(false) => expect_unimplemented(method, self.status(MAIN).await),
            Some(true) => {
                let Some(created) = &self.created else {
                    return Ok(Outcome::Skipped("CreateMachine failed: no VM to find".to_owned()));
                };
                let name = self.name(MAIN);
                // Twice: "This operation MUST be idempotent."
                for attempt in ["", " again"] {
                    let status = self
                        .status(MAIN)
                        .await
                        .map_err(|err| format!("GetMachineStatus{attempt} of machine {name}: {err}"))?;
                    if status.provider_id != created.provider_id || status.node_name != created.node_name {
                        return Err(format!(
                            "GetMachineStatus{attempt} of machine {name} answered providerID {:?} and node name \
                             {:?}; CreateMachine answered {:?} and {:?}",
                            status.provider_id, status.node_name, created.provider_id, created.node_name
                        ));
                    }
                }
                Ok(Outcome::Passed)
            }
        }
    }

    async fn list_machines(&self) -> Verdict {
        let method = DriverMethod::ListMachines;
        match self.declared(method) {
            None => Ok(Outcome::Skipped(IDENTITY_UNKNOWN.to_owned())),
            Some(false) => expect_unimplemented(method, self.list().await),
            Some(true) => {
                let list = self.list().await.map_err(|err| err.to_string())?;
                let Some(created) = &self.created else {
                    return Ok(Outcome::Skipped(
                        "ListMachines answered, but CreateMachine failed: no VM to find".to_owned(),
                    ));
                };
                let name = self.name(MAIN);
                match list.get(&created.provider_id) {
                    Some(listed) if *listed == name => Ok(Outcome::Passed),
                    Some(listed) => Err(format!(
                        "ListMachines lists providerID {:?} as machine {listed:?}, expected {name:?}",
                        created.provider_id
                    )),
                    None => Err(format!(
                        "ListMachines does not list providerID {:?} of machine {name}; it lists {}",
                        created.provider_id,
                        excerpt(&list)
                    )),
                }
            }
        }
    }

    async fn initialize_machine(&self) -> Verdict {
        let method = DriverMethod::InitializeMachine;
        match self.declared(method) {
            None => Ok(Outcome::Skipped(IDENTITY_UNKNOWN.to_owned())),
            Some(false) => expect_unimplemented(method, self.initialize(MAIN).await),
            Some(true) => {
                let Some(created) = &self.created else {
                    return Ok(Outcome::Skipped(
                        "CreateMachine failed: no VM to initialize".to_owned(),
                    ));
                };
                let name = self.name(MAIN);
                let initialized = self
                    .initialize(MAIN)
                    .await
                    .map_err(|err| format!("InitializeMachine of machine {name}: {err}"))?;
                if initialized.provider_id != created.provider_id
                    || initialized.node_name != created.node_name
                {
                    return Err(format!(
                        "InitializeMachine of machine {name} answered providerID {:?} and node name {:?}; \
                         CreateMachine answered {:?} and {:?}",
                        initialized.provider_id,
                        initialized.node_name,
                        created.provider_id,
                        created.node_name
                    ));
                }
                Ok(Outcome::Passed)
            }
        }
    }

    async fn invalid_provider_spec(&self) -> Verdict {
        let mut variants = Vec::new();
        if let Some(spec) = self.input.class.provider_spec.as_object()
            && spec.contains_key("size")
        {
            let mut class = self.input.class.clone();
            if let Some(spec) = class.provider_spec.as_object_mut() {
                spec.remove("size");
            }
            variants.push((WITHOUT_SIZE, "a providerSpec without size", class));
        }
        let mut class = self.input.class.clone();
        class.provider_spec = serde_json::Value::Null;
        variants.push((WITHOUT_SPEC, "no providerSpec", class));

        let mut problems = Vec::new();
        for (n, what, class) in &variants {
            let name = self.name(*n);
            match self.create(*n, class).await {
                Ok(created) => problems.push(format!(
                    "CreateMachine of machine {name} with {what} answered OK (providerID {:?}), expected \
                     InvalidArgument",
                    created.provider_id
                )),
                Err(CallError::Driver(_, error)) if error.code == MachineCode::InvalidArgument => {
                    if error.message.trim().is_empty() {
                        problems.push(format!(
                            "CreateMachine of machine {name} with {what} answered InvalidArgument without a message \
                             naming the issue"
                        ));
                    }
                }
                Err(err) => problems.push(format!(
                    "CreateMachine of machine {name} with {what}: {err}; expected InvalidArgument"
                )),
            }
            if let Some(evidence) = self.vm_evidence(*n).await {
                problems.push(format!("the refused CreateMachine made a VM: {evidence}"));
            }
        }
        judge(&problems)
    }

    /// Asks for errors whose messages the `error-messages` check judges: the status of a machine that never had a
    /// VM (NotFound when declared, Unimplemented when not).
    async fn provoke_errors(&self) {
        let _ = self.status(NEVER_CREATED).await;
    }

    fn error_messages(&self) -> Outcome {
        let seen = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.is_empty() {
            return Outcome::Skipped("no call answered an error".to_owned());
        }
        let mut silent: Vec<String> = seen
            .iter()
            .filter(|s| s.message.trim().is_empty())
            .map(|s| format!("{} {}", s.call, s.code))
            .collect();
        if silent.is_empty() {
            return Outcome::Passed;
        }
        let count = silent.len();
        silent.sort();
        silent.dedup();
        Outcome::Failed(format!(
            "{count} of {} error answers had no message: {}",
            seen.len(),
            silent.join(", ")
        ))
    }

    async fn delete_machine_idempotent(&self) -> Verdict {
        let main = self.name(MAIN);
        let first = if self.created.is_some() {
            format!("DeleteMachine of machine {main}")
        } else {
            format!("DeleteMachine of machine {main} (whose CreateMachine failed)")
        };
        let cases = [
            (MAIN, first),
            (
                MAIN,
                format!("DeleteMachine repeated for machine {main}, already deleted"),
            ),
            (
                NEVER_CREATED,
                format!(
                    "DeleteMachine of machine {}, which never had a VM",
                    self.name(NEVER_CREATED)
                ),
            ),
        ];
        let mut problems = Vec::new();
        for (n, what) in cases {
            if let Err(err) = self.delete(n).await {
                problems.push(format!("{what}: {err}, expected OK"));
            }
        }
        judge(&problems)
    }

    async fn deleted_machine_not_found(&self) -> Verdict {
        let name = self.name(MAIN);
        let mut looked = false;
        let mut problems = Vec::new();
        if self.declared(DriverMethod::GetMachineStatus) == Some(true) {
            looked = true;
            match self.status(MAIN).await {
                Err(err) if err.code() == Some(MachineCode::NotFound) => {}
                Ok(status) => problems.push(format!(
                    "GetMachineStatus of deleted machine {name} answered OK with providerID {:?}, expected NotFound",
                    status.provider_id
                )),
                Err(err) => problems.push(format!(
                    "GetMachineStatus of deleted machine {name}: {err}, expected NotFound"
                )),
            }
        }
        if let Some(list) = self.listing().await {
            looked = true;
            let listed: Vec<&String> = list
                .iter()
                .filter(|(id, machine)| {
                    **machine == name
                        || (!self.provider_id(MAIN).is_empty() && id.as_str() == self.provider_id(MAIN))
                })
                .map(|(id, _)| id)
                .collect();
            if !listed.is_empty() {
                problems.push(format!(
                    "ListMachines still lists {listed:?} for deleted machine {name}"
                ));
            }
        }
        if !looked {
            return Ok(Outcome::Skipped(
                "neither GetMachineStatus nor ListMachines is declared (and answering): the deletion cannot be \
                 observed"
                    .to_owned(),
            ));
        }
        judge(&problems)
    }

    async fn get_volume_ids(&self) -> Verdict {
        let method = DriverMethod::GetVolumeIds;
        let request = GetVolumeIdsRequest { pv_specs: Vec::new() };
        match self.declared(method) {
            None => Ok(Outcome::Skipped(IDENTITY_UNKNOWN.to_owned())),
            Some(false) => expect_unimplemented(
                method,
                self.timed("GetVolumeIDs", self.driver.get_volume_ids(&request))
                    .await,
            ),
            Some(true) => {
                // Twice: "This operation MUST be idempotent."
                for attempt in ["", " again"] {
                    let answer = self
                        .timed("GetVolumeIDs", self.driver.get_volume_ids(&request))
                        .await
                        .map_err(|err| format!("GetVolumeIDs{attempt} of no volumes: {err}"))?;
                    if !answer.volume_ids.is_empty() {
                        return Err(format!(
                            "GetVolumeIDs{attempt} of no volumes answered volume IDs {:?}",
                            answer.volume_ids
                        ));
                    }
                }
                Ok(Outcome::Passed)
            }
        }
    }

    async fn generate_machine_class_for_migration(&self) -> Verdict {
        let method = DriverMethod::GenerateMachineClassForMigration;
        match self.declared(method) {
            None => Ok(Outcome::Skipped(IDENTITY_UNKNOWN.to_owned())),
            Some(true) => Ok(Outcome::Skipped(
                "declared; converting needs a provider-specific class of the provider, which the suite does not have"
                    .to_owned(),
            )),
            Some(false) => {
                let kind = "ConformanceMachineClass";
                let name = self.name(MAIN);
                let request = GenerateMachineClassForMigrationRequest {
                    provider_specific_machine_class: serde_json::json!({
                        "apiVersion": "conformance.invalid/v1",
                        "kind": kind,
                        "metadata": { "name": name, "namespace": self.namespace() },
                        "spec": {},
                    }),
                    machine_class: MachineClass {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            namespace: Some(self.namespace()),
                            ..ObjectMeta::default()
                        },
                        ..MachineClass::default()
                    },
                    class_spec: ClassSpec {
                        api_group: "conformance.invalid".to_owned(),
                        kind: kind.to_owned(),
                        name,
                    },
                };
                let answer = self
                    .timed(
                        "GenerateMachineClassForMigration",
                        self.driver.generate_machine_class_for_migration(&request),
                    )
                    .await;
                expect_unimplemented(method, answer)
            }
        }
    }

    /// Deletes every machine the suite used (NotFound counts as gone), then looks for leftovers in the list.
    async fn cleanup(&self) -> Verdict {
        let mut problems = Vec::new();
        for n in [MAIN, WITHOUT_SIZE, WITHOUT_SPEC, NEVER_CREATED] {
            match self.delete(n).await {
                Err(err) if err.code() != Some(MachineCode::NotFound) => {
                    problems.push(format!("DeleteMachine of machine {}: {err}", self.name(n)));
                }
                _ => {}
            }
        }
        if let Some(list) = self.listing().await {
            let prefix = format!("{}-", self.input.name_prefix);
            let left: Vec<String> = list
                .iter()
                .filter(|(_, machine)| {
                    machine
                        .strip_prefix(&prefix)
                        .is_some_and(|n| ["1", "2", "3", "4"].contains(&n))
                })
                .map(|(id, machine)| format!("{id} ({machine})"))
                .collect();
            if !left.is_empty() {
                problems.push(format!(
                    "ListMachines still lists VMs after their deletion: {}",
                    left.join(", ")
                ));
            }
        }
        judge(&problems)
    }
}

/// The verdict on an optional call the identity does not declare: it must answer `Unimplemented`.
fn expect_unimplemented<T>(method: DriverMethod, answer: Result<T, CallError>) -> Verdict {
    match answer {
        Err(err) if err.code() == Some(MachineCode::Unimplemented) => Ok(Outcome::Passed),
        Ok(_) => Err(format!(
            "{} is not in the identity's optional_methods, yet it answered OK: declare it, or answer Unimplemented",
            method.name()
        )),
        Err(err) => Err(format!(
            "{} is not in the identity's optional_methods: expected Unimplemented; {err}",
            method.name()
        )),
    }
}

/// The first entries of a machine list, for a message.
fn excerpt(list: &BTreeMap<String, String>) -> String {
    const SHOWN: usize = 5;
    if list.is_empty() {
        return "nothing".to_owned();
    }
    let mut text = list
        .iter()
        .take(SHOWN)
        .map(|(id, machine)| format!("{id:?} -> {machine:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    if list.len() > SHOWN {
        let _ = write!(text, " and {} more", list.len() - SHOWN);
    }
    text
}
