//! Every `status.lastOperation.description` the creation flow and the health check write, in one place.
//!
//! The description is a compatible wire string (users, dashboards and Gardener read it), so it is written here and
//! only here, by [`Description`]'s `Display`, and read back by [`Description::parse`]. Controllers never build or
//! match description strings themselves. Where the reference's text is known it is kept word for word
//! (`Creating machine on cloud provider`, `Cloud provider message - …`, `VM using old node obj`, `Machine … successfully
//! joined the cluster`, …); where the reference prints Go structs (`%+v` of node conditions) or an odd unit
//! (`… in 20m0s minutes.`) the text is made readable, and descriptions the reference does not have (a vanished VM,
//! the CrashLoopBackOff timer) are new and say so.
//!
//! Texts shown to users must never carry secret values: provider messages can echo what they were given, so they go
//! through a [`Redactor`] built from the class's secret before they are put into a description.

use std::{fmt, time::Duration};

use k8s_openapi::api::core::v1::NodeCondition;
use mcm_api::GoDuration;
use mcm_driver::{DriverError, MachineCode};

pub use crate::redact::Redactor;

/// Suffix the reference appends to initialization failures (`machineutils.InstanceInitialization`).
const INSTANCE_INITIALIZATION: &str = "Initialize VM Instance";
const PROVIDER_ERROR_PREFIX: &str = "Cloud provider message - ";
const INIT_ERROR_PREFIX: &str = "Provider error: ";
const CODES_ERROR_PREFIX: &str = "machine codes error: code = [";
const CODES_ERROR_MIDDLE: &str = "] message = [";
const UNKNOWN_TRANSITION: &str = " is unhealthy - changing MachineState to Unknown";
const NODE_MISSING_PREFIX: &str = "Node object went missing. Machine ";
const NODE_CONDITIONS: &str = ". Node conditions: ";
const MIGRATION_PREFIX: &str = "Migration of ";
const MIGRATION_MIDDLE: &str = " to MachineClass failed: ";
const INVALID_SPEC_PREFIX: &str = "Invalid machine or class: ";
const SECRET_NOT_FOUND_MIDDLE: &str = ": Secret ";
const SECRET_NOT_FOUND_NAMESPACE: &str = " not found in namespace ";
const SECRETS_SEPARATOR: &str = "; ";
const IN_PLACE_UPDATING: &str = " is undergoing an in-place update";
const IN_PLACE_UPDATED: &str = " successfully updated dependencies";
const IN_PLACE_FAILED: &str = " failed to update dependencies: ";
const IN_PLACE_TIMED_OUT: &str = " failed to in-place update in ";

/// A lastOperation description of the creation flow or the health check, typed.
///
/// `to_string()` gives the wire text; [`Description::parse`] reads it back. Machine names are Kubernetes names (no
/// white space), which is what makes the texts unambiguous.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Description {
    /// `Creating machine on cloud provider` (reference): the VM exists and the machine waits for its node (Pending).
    CreatingMachine,
    /// `Cloud provider message - machine codes error: code = [<code>] message = [<message>]` (reference, with Go's
    /// `status.Error` text): a provider call of the creation flow failed.
    ProviderError {
        /// The machine code.
        code: MachineCode,
        /// The provider's message, already redacted.
        message: String,
    },
    /// `Provider error: machine codes error: code = [<code>] message = [<message>]. Initialize VM Instance`
    /// (reference): `InitializeMachine` failed.
    InitializationFailed {
        /// The machine code.
        code: MachineCode,
        /// The provider's message, already redacted.
        message: String,
    },
    /// `VM using old node obj` (reference): the new VM's node name belongs to an existing node (stale-node guard).
    VmUsingOldNode,
    /// New: `The VM of machine <machine> (providerID <id>) was not found at the provider; a machine never gets a second
    /// VM`. The recorded VM is gone; the machine is Failed so that its set replaces it (spec 003).
    VmVanished {
        /// The machine's name.
        machine: String,
        /// The providerID the machine recorded.
        provider_id: String,
    },
    /// New: `Machine <machine> failed to be created in <timeout>. Last error: <last>`. The creation timeout passed
    /// while creation was failing (CrashLoopBackOff → Failed, fired by a timer).
    CreationTimedOut {
        /// The machine's name.
        machine: String,
        /// The effective creation timeout.
        timeout: Duration,
        /// The description of the last failure, as it was on the machine.
        last_error: String,
    },
    /// `Machine <machine> successfully joined the cluster in <d>` (reference; without ` in <d>` when the machine has
    /// no creation timestamp): first join, Pending → Running.
    Joined {
        /// The machine's name.
        machine: String,
        /// How long the machine took to join, from its creation, in whole seconds.
        after: Option<Duration>,
    },
    /// `Machine <machine> successfully re-joined the cluster` (reference): Unknown → Running.
    Rejoined {
        /// The machine's name.
        machine: String,
    },
    /// `Node object went missing. Machine <machine> is unhealthy - changing MachineState to Unknown` (reference).
    NodeMissing {
        /// The machine's name.
        machine: String,
    },
    /// `Machine <machine> is unhealthy - changing MachineState to Unknown. Node conditions: <summary>` (reference; the
    /// summary is readable, see [`conditions_summary`], where the reference prints Go structs).
    Unhealthy {
        /// The machine's name.
        machine: String,
        /// The node conditions, summarized.
        conditions: String,
    },
    /// `Machine <machine> failed to join the cluster in <timeout>.` (reference, without its stray ` minutes`):
    /// Pending → Failed at the creation timeout.
    JoinTimedOut {
        /// The machine's name.
        machine: String,
        /// The effective creation timeout.
        timeout: Duration,
    },
    /// New: `Migration of <kind> <class> to MachineClass failed: machine codes error: code = [..] message = [..]`.
    /// The machine refers to a class of another kind and the provider could not convert it (spec 000
    /// `GenerateMachineClassForMigration`).
    MigrationFailed {
        /// The kind of the old class (e.g. `AWSMachineClass`).
        kind: String,
        /// The name of the old class.
        class: String,
        /// The machine code.
        code: MachineCode,
        /// The provider's message.
        message: String,
    },
    /// `Machine <machine> is not healthy since <timeout>. Changing status to failed. Node conditions: <summary>`
    /// (reference, without its stray ` minutes`): Unknown → Failed at the health timeout.
    HealthTimedOut {
        /// The machine's name.
        machine: String,
        /// The effective health timeout.
        timeout: Duration,
        /// The node conditions, summarized.
        conditions: String,
    },
    /// New: `Invalid machine or class: <problems>`. The machine, its class or the class's Secrets fail validation
    /// (field paths and reasons, [`mcm_api::validation::summarize`]); nothing is created until they change.
    InvalidSpec {
        /// The problems, each naming its field.
        problems: String,
    },
    /// `Machine <machine> is undergoing an in-place update` (reference): the node is drained for an in-place update;
    /// phase InPlaceUpdating.
    InPlaceUpdating {
        /// The machine's name.
        machine: String,
    },
    /// `Machine <machine> successfully updated dependencies` (reference): the node agent reported
    /// `update-result=successful`; phase InPlaceUpdateSuccessful.
    InPlaceUpdated {
        /// The machine's name.
        machine: String,
    },
    /// `Machine <machine> failed to update dependencies: <reason>` (reference): the node agent reported
    /// `update-result=failed` with the node annotation `update-failed-reason`; phase InPlaceUpdateFailed.
    InPlaceUpdateFailed {
        /// The machine's name.
        machine: String,
        /// The node's `update-failed-reason`, redacted.
        reason: String,
    },
    /// `Machine <machine> failed to in-place update in <timeout>.` (reference, without its stray ` minutes`):
    /// InPlaceUpdating for longer than the in-place update timeout → InPlaceUpdateFailed.
    InPlaceUpdateTimedOut {
        /// The machine's name.
        machine: String,
        /// The effective in-place update timeout.
        timeout: Duration,
    },
    /// New: `secretRef: Secret "<name>" not found in namespace "<namespace>"`, several joined by `; ` (issue 19).
    /// A Secret the class refers to does not exist; the machine waits for it instead of reporting a missing
    /// `userData` key. The text starts with the reference's field, which is how it parses back.
    SecretNotFound {
        /// The missing Secrets, in field order (`secretRef`, then `credentialsSecretRef`); never empty.
        missing: Vec<MissingSecret>,
    },
}

/// The field of a class that refers to a Secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretField {
    /// `secretRef`: the userData and the provider's secrets.
    SecretRef,
    /// `credentialsSecretRef`: the provider's credentials (win over `secretRef`'s).
    CredentialsSecretRef,
}

impl SecretField {
    /// Both fields, in the order they are merged and reported.
    pub const ALL: [Self; 2] = [Self::SecretRef, Self::CredentialsSecretRef];

    /// Whether `text` starts as a [`MissingSecret`] of this field does.
    fn starts(self, text: &str) -> bool {
        text.strip_prefix(self.as_str())
            .is_some_and(|rest| rest.starts_with(SECRET_NOT_FOUND_MIDDLE))
    }

    /// The field's name in a MachineClass.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SecretRef => "secretRef",
            Self::CredentialsSecretRef => "credentialsSecretRef",
        }
    }
}

/// A Secret a class refers to that does not exist: `secretRef: Secret "boot" not found in namespace "default"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingSecret {
    /// The class's field naming it.
    pub field: SecretField,
    /// The Secret's name.
    pub name: String,
    /// The Secret's namespace (the controller's when the reference names none).
    pub namespace: String,
}

impl fmt::Display for MissingSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{SECRET_NOT_FOUND_MIDDLE}{:?}{SECRET_NOT_FOUND_NAMESPACE}{:?}",
            self.field.as_str(),
            self.name,
            self.namespace
        )
    }
}

impl MissingSecret {
    /// Reads back the `; `-joined texts of [`Description::SecretNotFound`].
    fn parse_all(text: &str) -> Option<Vec<Self>> {
        text.split(SECRETS_SEPARATOR).map(Self::parse).collect()
    }

    /// Reads one back from its `Display` text (Kubernetes names: no quotes or escapes to undo).
    fn parse(text: &str) -> Option<Self> {
        let (field, rest) = text.split_once(SECRET_NOT_FOUND_MIDDLE)?;
        let field = SecretField::ALL.into_iter().find(|f| f.as_str() == field)?;
        let (name, namespace) = rest.split_once(SECRET_NOT_FOUND_NAMESPACE)?;
        let unquote = |text: &str| {
            text.strip_prefix('"')?
                .strip_suffix('"')
                .filter(|t| !t.contains(['"', '\\']))
                .and_then(self::name)
        };
        Some(Self {
            field,
            name: unquote(name)?,
            namespace: unquote(namespace)?,
        })
    }
}

/// The problem of a machine whose class does not exist, as a field error: `spec.class.name: Not found: <kind>
/// "<name>" does not exist`. Reported inside [`Description::InvalidSpec`].
pub fn class_not_found(kind: &str, name: &str) -> String {
    format!("spec.class.name: Not found: {kind} {name:?} does not exist")
}

/// The message of the Warning Event of a failed provider call of the creation flow: the call, its code and the
/// lastOperation description written for it.
pub fn call_failed_event(method: mcm_driver::DriverMethod, code: MachineCode, description: &str) -> String {
    format!("{} failed ({code}): {description}", method.name())
}

/// The message of the Normal Event of a finished class migration.
pub fn migrated_event(kind: &str, class: &str, moved: usize) -> String {
    format!("Migrated {kind} {class} to MachineClass {class}; {moved} references moved")
}

/// Go's `status.Status.Error()` text of the reference's machine-code errors.
fn codes_error(code: MachineCode, message: &str) -> String {
    format!(
        "{CODES_ERROR_PREFIX}{}{CODES_ERROR_MIDDLE}{message}]",
        code.name()
    )
}

fn parse_codes_error(text: &str) -> Option<(MachineCode, String)> {
    let rest = text.strip_prefix(CODES_ERROR_PREFIX)?;
    let (code, rest) = rest.split_once(CODES_ERROR_MIDDLE)?;
    let message = rest.strip_suffix(']')?;
    Some((MachineCode::from_name(code)?, message.to_owned()))
}

fn go(duration: Duration) -> String {
    GoDuration::from_std(duration).0
}

fn parse_go(text: &str) -> Option<Duration> {
    GoDuration::new(text).parse().ok()
}

/// A machine name as the descriptions carry it: not empty, no white space.
fn name(text: &str) -> Option<String> {
    (!text.is_empty() && !text.contains(char::is_whitespace)).then(|| text.to_owned())
}

impl fmt::Display for Description {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CreatingMachine => f.write_str("Creating machine on cloud provider"),
            Self::ProviderError { code, message } => {
                write!(f, "{PROVIDER_ERROR_PREFIX}{}", codes_error(*code, message))
            }
            Self::InitializationFailed { code, message } => write!(
                f,
                "{INIT_ERROR_PREFIX}{}. {INSTANCE_INITIALIZATION}",
                codes_error(*code, message)
            ),
            Self::VmUsingOldNode => f.write_str("VM using old node obj"),
            Self::MigrationFailed {
                kind,
                class,
                code,
                message,
            } => write!(
                f,
                "{MIGRATION_PREFIX}{kind} {class}{MIGRATION_MIDDLE}{}",
                codes_error(*code, message)
            ),
            Self::VmVanished { machine, provider_id } => write!(
                f,
                "The VM of machine {machine} (providerID {provider_id}) was not found at the provider; a machine \
                 never gets a second VM"
            ),
            Self::CreationTimedOut {
                machine,
                timeout,
                last_error,
            } => write!(
                f,
                "Machine {machine} failed to be created in {}. Last error: {last_error}",
                go(*timeout)
            ),
            Self::Joined {
                machine,
                after: Some(after),
            } => write!(
                f,
                "Machine {machine} successfully joined the cluster in {}",
                go(*after)
            ),
            Self::Joined { machine, after: None } => {
                write!(f, "Machine {machine} successfully joined the cluster")
            }
            Self::Rejoined { machine } => write!(f, "Machine {machine} successfully re-joined the cluster"),
            Self::NodeMissing { machine } => write!(f, "{NODE_MISSING_PREFIX}{machine}{UNKNOWN_TRANSITION}"),
            Self::Unhealthy { machine, conditions } => write!(
                f,
                "Machine {machine}{UNKNOWN_TRANSITION}{NODE_CONDITIONS}{conditions}"
            ),
            Self::JoinTimedOut { machine, timeout } => write!(
                f,
                "Machine {machine} failed to join the cluster in {}.",
                go(*timeout)
            ),
            Self::HealthTimedOut {
                machine,
                timeout,
                conditions,
            } => write!(
                f,
                "Machine {machine} is not healthy since {}. Changing status to failed{NODE_CONDITIONS}{conditions}",
                go(*timeout)
            ),
            Self::InPlaceUpdating { machine } => write!(f, "Machine {machine}{IN_PLACE_UPDATING}"),
            Self::InPlaceUpdated { machine } => write!(f, "Machine {machine}{IN_PLACE_UPDATED}"),
            Self::InPlaceUpdateFailed { machine, reason } => {
                write!(f, "Machine {machine}{IN_PLACE_FAILED}{reason}")
            }
            Self::InPlaceUpdateTimedOut { machine, timeout } => {
                write!(f, "Machine {machine}{IN_PLACE_TIMED_OUT}{}.", go(*timeout))
            }
            Self::InvalidSpec { problems } => write!(f, "{INVALID_SPEC_PREFIX}{problems}"),
            Self::SecretNotFound { missing } => {
                for (i, secret) in missing.iter().enumerate() {
                    if i > 0 {
                        f.write_str(SECRETS_SEPARATOR)?;
                    }
                    write!(f, "{secret}")?;
                }
                Ok(())
            }
        }
    }
}

impl Description {
    /// Reads a description written by [`Description`]'s `Display` back; `None` for any other text (descriptions of
    /// other flows, or written by hand).
    pub fn parse(text: &str) -> Option<Self> {
        if text == "Creating machine on cloud provider" {
            return Some(Self::CreatingMachine);
        }
        if text == "VM using old node obj" {
            return Some(Self::VmUsingOldNode);
        }
        if let Some(rest) = text.strip_prefix(PROVIDER_ERROR_PREFIX) {
            let (code, message) = parse_codes_error(rest)?;
            return Some(Self::ProviderError { code, message });
        }
        if let Some(rest) = text.strip_prefix(INIT_ERROR_PREFIX) {
            let rest = rest.strip_suffix(INSTANCE_INITIALIZATION)?.strip_suffix(". ")?;
            let (code, message) = parse_codes_error(rest)?;
            return Some(Self::InitializationFailed { code, message });
        }
        if let Some(rest) = text.strip_prefix(MIGRATION_PREFIX) {
            let (class, rest) = rest.split_once(MIGRATION_MIDDLE)?;
            let (kind, class) = class.split_once(' ')?;
            let (code, message) = parse_codes_error(rest)?;
            return Some(Self::MigrationFailed {
                kind: name(kind)?,
                class: name(class)?,
                code,
                message,
            });
        }
        if let Some(rest) = text.strip_prefix("The VM of machine ") {
            let (machine, rest) = rest.split_once(" (providerID ")?;
            let provider_id =
                rest.strip_suffix(") was not found at the provider; a machine never gets a second VM")?;
            return Some(Self::VmVanished {
                machine: name(machine)?,
                provider_id: provider_id.to_owned(),
            });
        }
        if let Some(problems) = text.strip_prefix(INVALID_SPEC_PREFIX) {
            return Some(Self::InvalidSpec {
                problems: problems.to_owned(),
            });
        }
        if SecretField::ALL.iter().any(|field| field.starts(text)) {
            return MissingSecret::parse_all(text).map(|missing| Self::SecretNotFound { missing });
        }
        if let Some(rest) = text.strip_prefix(NODE_MISSING_PREFIX) {
            let machine = rest.strip_suffix(UNKNOWN_TRANSITION)?;
            return Some(Self::NodeMissing {
                machine: name(machine)?,
            });
        }
        let rest = text.strip_prefix("Machine ")?;
        let (machine, rest) = rest.split_once(' ')?;
        let machine = name(machine)?;
        let rest = format!(" {rest}");
        if let Some(after) = rest.strip_prefix(" successfully joined the cluster") {
            let after = match after.strip_prefix(" in ") {
                Some(duration) => Some(parse_go(duration)?),
                None if after.is_empty() => None,
                None => return None,
            };
            return Some(Self::Joined { machine, after });
        }
        if rest == " successfully re-joined the cluster" {
            return Some(Self::Rejoined { machine });
        }
        if let Some(in_place) = Self::parse_in_place(&machine, &rest) {
            return Some(in_place);
        }
        if let Some(conditions) = rest
            .strip_prefix(UNKNOWN_TRANSITION)
            .and_then(|r| r.strip_prefix(NODE_CONDITIONS))
        {
            return Some(Self::Unhealthy {
                machine,
                conditions: conditions.to_owned(),
            });
        }
        if let Some(rest) = rest.strip_prefix(" failed to join the cluster in ") {
            let timeout = parse_go(rest.strip_suffix('.')?)?;
            return Some(Self::JoinTimedOut { machine, timeout });
        }
        if let Some(rest) = rest.strip_prefix(" failed to be created in ") {
            let (timeout, last_error) = rest.split_once(". Last error: ")?;
            return Some(Self::CreationTimedOut {
                machine,
                timeout: parse_go(timeout)?,
                last_error: last_error.to_owned(),
            });
        }
        if let Some(rest) = rest.strip_prefix(" is not healthy since ") {
            let (timeout, conditions) = rest.split_once(". Changing status to failed")?;
            let conditions = conditions.strip_prefix(NODE_CONDITIONS)?;
            return Some(Self::HealthTimedOut {
                machine,
                timeout: parse_go(timeout)?,
                conditions: conditions.to_owned(),
            });
        }
        None
    }

    /// The in-place update descriptions: `rest` is what follows `Machine <machine>`.
    fn parse_in_place(machine: &str, rest: &str) -> Option<Self> {
        let machine = machine.to_owned();
        if rest == IN_PLACE_UPDATING {
            return Some(Self::InPlaceUpdating { machine });
        }
        if rest == IN_PLACE_UPDATED {
            return Some(Self::InPlaceUpdated { machine });
        }
        if let Some(reason) = rest.strip_prefix(IN_PLACE_FAILED) {
            return Some(Self::InPlaceUpdateFailed {
                machine,
                reason: reason.to_owned(),
            });
        }
        let timeout = rest.strip_prefix(IN_PLACE_TIMED_OUT)?.strip_suffix('.')?;
        Some(Self::InPlaceUpdateTimedOut {
            machine,
            timeout: parse_go(timeout)?,
        })
    }

    /// The description of a failed provider call of the creation flow, its message redacted.
    pub fn provider_error(error: &DriverError, redactor: &Redactor) -> Self {
        Self::ProviderError {
            code: error.code,
            message: redactor.redact(&error.message),
        }
    }

    /// The description of a failed `InitializeMachine`, its message redacted.
    pub fn initialization_failed(error: &DriverError, redactor: &Redactor) -> Self {
        Self::InitializationFailed {
            code: error.code,
            message: redactor.redact(&error.message),
        }
    }
}

/// A readable summary of node conditions for descriptions: `Ready=False (KubeletNotReady), DiskPressure=True`, or
/// `none` when there are none. Messages and times are left out: they change with every heartbeat.
pub fn conditions_summary(conditions: &[NodeCondition]) -> String {
    if conditions.is_empty() {
        return "none".to_owned();
    }
    conditions
        .iter()
        .map(|c| match c.reason.as_deref() {
            Some(reason) if !reason.is_empty() => format!("{}={} ({reason})", c.type_, c.status),
            _ => format!("{}={}", c.type_, c.status),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use proptest::prelude::*;

    use super::*;

    fn all_kinds() -> Vec<Description> {
        vec![
            Description::CreatingMachine,
            Description::ProviderError {
                code: MachineCode::Unavailable,
                message: "quota [eu-1] exceeded".into(),
            },
            Description::InitializationFailed {
                code: MachineCode::Uninitialized,
                message: "NIC not ready".into(),
            },
            Description::VmUsingOldNode,
            Description::MigrationFailed {
                kind: "AWSMachineClass".into(),
                class: "c-1".into(),
                code: MachineCode::Unimplemented,
                message: "not supported".into(),
            },
            Description::VmVanished {
                machine: "m-1".into(),
                provider_id: "aws:///eu-1a/i-1".into(),
            },
            Description::CreationTimedOut {
                machine: "m-1".into(),
                timeout: Duration::from_mins(20),
                last_error: "Cloud provider message - boom".into(),
            },
            Description::Joined {
                machine: "m-1".into(),
                after: Some(Duration::from_secs(95)),
            },
            Description::Joined {
                machine: "m-1".into(),
                after: None,
            },
            Description::Rejoined {
                machine: "m-1".into(),
            },
            Description::NodeMissing {
                machine: "m-1".into(),
            },
            Description::Unhealthy {
                machine: "m-1".into(),
                conditions: "Ready=False (KubeletNotReady)".into(),
            },
            Description::JoinTimedOut {
                machine: "m-1".into(),
                timeout: Duration::from_mins(20),
            },
            Description::HealthTimedOut {
                machine: "m-1".into(),
                timeout: Duration::from_mins(10),
                conditions: "Ready=Unknown".into(),
            },
            Description::InPlaceUpdating {
                machine: "m-1".into(),
            },
            Description::InPlaceUpdated {
                machine: "m-1".into(),
            },
            Description::InPlaceUpdateFailed {
                machine: "m-1".into(),
                reason: "class small2 not found".into(),
            },
            Description::InPlaceUpdateTimedOut {
                machine: "m-1".into(),
                timeout: Duration::from_mins(20),
            },
            Description::InvalidSpec {
                problems: class_not_found("MachineClass", "c-1"),
            },
            Description::SecretNotFound {
                missing: vec![missing(SecretField::SecretRef, "boot", "default")],
            },
            Description::SecretNotFound {
                missing: vec![
                    missing(SecretField::SecretRef, "boot", "default"),
                    missing(SecretField::CredentialsSecretRef, "creds", "infra"),
                ],
            },
        ]
    }

    fn missing(field: SecretField, name: &str, namespace: &str) -> MissingSecret {
        MissingSecret {
            field,
            name: name.into(),
            namespace: namespace.into(),
        }
    }

    /// The texts users and docs/machine-controller.md know (issue 19): a missing Secret is named with its field and
    /// namespace, an invalid machine or class with its field errors.
    #[test]
    fn blocked_creation_texts_are_stable() {
        assert_eq!(
            Description::SecretNotFound {
                missing: vec![
                    missing(SecretField::SecretRef, "boot", "default"),
                    missing(SecretField::CredentialsSecretRef, "creds", "infra"),
                ]
            }
            .to_string(),
            r#"secretRef: Secret "boot" not found in namespace "default"; credentialsSecretRef: Secret "creds" not found in namespace "infra""#
        );
        assert_eq!(
            Description::InvalidSpec {
                problems: class_not_found("MachineClass", "small")
            }
            .to_string(),
            r#"Invalid machine or class: spec.class.name: Not found: MachineClass "small" does not exist"#
        );
        assert_eq!(
            Description::parse(r#"secretRef: Secret "boot" not found"#),
            None,
            "a text without its namespace is not a SecretNotFound"
        );
        assert_eq!(
            Description::parse(r#"userDataRef: Secret "boot" not found in namespace "default""#),
            None,
            "only the class's two secret fields"
        );
    }

    #[test]
    fn reference_texts_are_kept_word_for_word() {
        assert_eq!(
            Description::CreatingMachine.to_string(),
            "Creating machine on cloud provider"
        );
        assert_eq!(Description::VmUsingOldNode.to_string(), "VM using old node obj");
        assert_eq!(
            Description::ProviderError {
                code: MachineCode::ResourceExhausted,
                message: "quota".into()
            }
            .to_string(),
            "Cloud provider message - machine codes error: code = [ResourceExhausted] message = [quota]"
        );
        assert_eq!(
            Description::InitializationFailed {
                code: MachineCode::Uninitialized,
                message: "x".into()
            }
            .to_string(),
            "Provider error: machine codes error: code = [Uninitialized] message = [x]. Initialize VM Instance"
        );
        assert_eq!(
            Description::Joined {
                machine: "m".into(),
                after: Some(Duration::from_secs(312))
            }
            .to_string(),
            "Machine m successfully joined the cluster in 5m12s"
        );
        assert_eq!(
            Description::Rejoined { machine: "m".into() }.to_string(),
            "Machine m successfully re-joined the cluster"
        );
        assert_eq!(
            Description::NodeMissing { machine: "m".into() }.to_string(),
            "Node object went missing. Machine m is unhealthy - changing MachineState to Unknown"
        );
        assert_eq!(
            Description::JoinTimedOut {
                machine: "m".into(),
                timeout: Duration::from_mins(20)
            }
            .to_string(),
            "Machine m failed to join the cluster in 20m0s."
        );
        assert_eq!(
            Description::InPlaceUpdating { machine: "m".into() }.to_string(),
            "Machine m is undergoing an in-place update"
        );
        assert_eq!(
            Description::InPlaceUpdated { machine: "m".into() }.to_string(),
            "Machine m successfully updated dependencies"
        );
        assert_eq!(
            Description::InPlaceUpdateFailed {
                machine: "m".into(),
                reason: "disk full".into()
            }
            .to_string(),
            "Machine m failed to update dependencies: disk full"
        );
    }

    #[test]
    fn every_kind_parses_back() {
        for description in all_kinds() {
            let text = description.to_string();
            assert_eq!(Description::parse(&text), Some(description), "{text}");
        }
    }

    #[test]
    fn other_texts_do_not_parse() {
        for text in [
            "",
            "Initiate node drain",
            "Machine",
            "Machine m does something else",
            "Cloud provider message - not a codes error",
            "Machine m successfully joined the cluster in forever",
        ] {
            assert_eq!(Description::parse(text), None, "{text}");
        }
    }

    #[test]
    fn conditions_are_summarized_without_heartbeats() {
        let conditions = vec![
            NodeCondition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: Some("KubeletNotReady".into()),
                message: Some("PLEG is not healthy".into()),
                ..NodeCondition::default()
            },
            NodeCondition {
                type_: "DiskPressure".into(),
                status: "True".into(),
                ..NodeCondition::default()
            },
        ];
        assert_eq!(
            conditions_summary(&conditions),
            "Ready=False (KubeletNotReady), DiskPressure=True"
        );
        assert_eq!(conditions_summary(&[]), "none");
    }

    #[test]
    fn provider_messages_lose_secret_values() {
        let mut data = BTreeMap::new();
        data.insert(
            "userData".to_owned(),
            ByteString(b"#!/bin/bash\nexport TOKEN=abcdef.0123456789abcdef\necho hi\n".to_vec()),
        );
        data.insert("password".to_owned(), ByteString(b"hunter2-secret".to_vec()));
        data.insert("flag".to_owned(), ByteString(b"true".to_vec()));
        let redactor = Redactor::from_secret_data(&data);
        let error = DriverError::new(
            MachineCode::InvalidArgument,
            "bad request: password=hunter2-secret, line export TOKEN=abcdef.0123456789abcdef failed, true",
        );
        let description = Description::provider_error(&error, &redactor).to_string();
        assert!(!description.contains("hunter2-secret"), "{description}");
        assert!(!description.contains("0123456789abcdef"), "{description}");
        assert!(description.contains("[redacted]"));
        assert!(description.contains(", true"), "short values stay: {description}");
        let debug = format!("{redactor:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
    }

    proptest! {
        #[test]
        fn descriptions_round_trip(
            machine in "[a-z0-9][a-z0-9.-]{0,30}",
            provider_id in "[a-z]{1,5}:///[a-z0-9/-]{1,20}",
            message in any::<String>(),
            seconds in 0u64..400_000,
            code_number in 0u32..18,
        ) {
            let code = MachineCode::from_number(code_number).unwrap();
            let timeout = Duration::from_secs(seconds);
            let cases = vec![
                Description::ProviderError { code, message: message.clone() },
                Description::InitializationFailed { code, message: message.clone() },
                Description::VmVanished { machine: machine.clone(), provider_id },
                Description::MigrationFailed {
                    kind: "OldMachineClass".into(), class: machine.clone(), code, message: message.clone(),
                },
                Description::CreationTimedOut { machine: machine.clone(), timeout, last_error: message.clone() },
                Description::Joined { machine: machine.clone(), after: Some(timeout) },
                Description::Rejoined { machine: machine.clone() },
                Description::NodeMissing { machine: machine.clone() },
                Description::Unhealthy { machine: machine.clone(), conditions: message.clone() },
                Description::JoinTimedOut { machine: machine.clone(), timeout },
                Description::InPlaceUpdating { machine: machine.clone() },
                Description::InPlaceUpdated { machine: machine.clone() },
                Description::InPlaceUpdateFailed { machine: machine.clone(), reason: message.clone() },
                Description::InPlaceUpdateTimedOut { machine: machine.clone(), timeout },
                Description::InvalidSpec { problems: message.clone() },
                Description::SecretNotFound { missing: vec![
                    missing(SecretField::SecretRef, &machine, "default"),
                    missing(SecretField::CredentialsSecretRef, &machine, &machine),
                ] },
                Description::HealthTimedOut { machine, timeout, conditions: message },
            ];
            for description in cases {
                let text = description.to_string();
                prop_assert_eq!(Description::parse(&text), Some(description));
            }
        }

        #[test]
        fn parse_never_panics(text in any::<String>()) {
            let _ = Description::parse(&text);
        }
    }
}
