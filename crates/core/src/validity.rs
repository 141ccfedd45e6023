//! Whether a MachineSet or MachineDeployment may be acted on, and how an invalid one is reported on itself.
//!
//! An object that fails `mcm_api::validation` is *held*: its controller creates, deletes, scales and adopts nothing
//! for it until it is fixed (a `replicas: -1` would otherwise delete every machine). What it reports, so that
//! Gardener's health checks (Available must be True, Progressing True when present, ReplicaFailure not True) and
//! `kubectl describe` see it:
//! - MachineSet: `ReplicaFailure=True`, reason [`INVALID_SPEC`], the field errors as the message;
//! - MachineDeployment: `ReplicaFailure=True`, `Progressing=False` and `Available=False`, each with reason
//!   [`INVALID_SPEC`] and the field errors as the message (its availability is measured against a spec that cannot
//!   be read, so it claims none);
//! - both: one Warning Event with reason [`INVALID_SPEC`] per distinct message ([`should_warn`]);
//! - the counts in the status go on being observed; `observedGeneration` moves to the generation that was judged.
//!
//! Once the object is valid again, the conditions with reason [`INVALID_SPEC`] are removed and the controller acts
//! as usual.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mcm_api::{
    ConditionStatus, MachineClass, MachineDeployment, MachineDeploymentCondition,
    MachineDeploymentConditionType, MachineSet, MachineSetCondition, MachineSetConditionType,
    validation::{self, FieldError},
};

use crate::descriptions::{MissingSecret, SecretField};

/// The reason of the conditions and of the Warning Event of an invalid object.
pub const INVALID_SPEC: &str = "InvalidSpec";

/// The reason of the Warning Events of a class whose Secret does not exist, on the class and on its machines.
pub const SECRET_NOT_FOUND: &str = "SecretNotFound";

/// Why an object is held: every field error, and the message naming them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidSpec {
    /// The field errors, in the order validation found them.
    pub errors: Vec<FieldError>,
    /// The errors as one text (`spec.replicas: Invalid value: -1: must be greater than or equal to 0; ...`): the
    /// conditions' message.
    pub message: String,
}

impl InvalidSpec {
    fn of(errors: Vec<FieldError>) -> Option<Self> {
        if errors.is_empty() {
            return None;
        }
        let message = validation::summarize(&errors);
        Some(Self { errors, message })
    }

    /// The Warning Event's message: the field errors and what the controller does about them.
    pub fn event_message(&self) -> String {
        format!(
            "invalid spec, nothing is created, deleted or scaled until it is fixed: {}",
            self.message
        )
    }
}

/// `None` when the set may be acted on; otherwise why not.
pub fn check_machine_set(set: &MachineSet) -> Option<InvalidSpec> {
    InvalidSpec::of(validation::validate_machine_set(set))
}

/// `None` when the deployment may be acted on; otherwise why not.
pub fn check_machine_deployment(deployment: &MachineDeployment) -> Option<InvalidSpec> {
    InvalidSpec::of(validation::validate_machine_deployment(deployment))
}

/// Whether to record the Warning Event for `message`: not when the object already carries it as its
/// `ReplicaFailure` message (`on_object`, so a restart does not repeat it) nor when this controller already warned
/// with it (`remembered`, so a cache that has not seen the status write yet does not repeat it either).
pub fn should_warn(on_object: Option<&str>, remembered: Option<&str>, message: &str) -> bool {
    on_object != Some(message) && remembered != Some(message)
}

/// The message of the set's `ReplicaFailure=True` condition with reason [`INVALID_SPEC`], if it has one.
pub fn set_invalid_message(conditions: &[MachineSetCondition]) -> Option<&str> {
    conditions
        .iter()
        .find(|c| {
            c.r#type == MachineSetConditionType::ReplicaFailure
                && c.status == ConditionStatus::True
                && c.reason == INVALID_SPEC
        })
        .map(|c| c.message.as_str())
}

/// The message of the deployment's `ReplicaFailure=True` condition with reason [`INVALID_SPEC`], if it has one.
pub fn deployment_invalid_message(conditions: &[MachineDeploymentCondition]) -> Option<&str> {
    conditions
        .iter()
        .find(|c| {
            c.r#type == MachineDeploymentConditionType::ReplicaFailure
                && c.status == ConditionStatus::True
                && c.reason == INVALID_SPEC
        })
        .map(|c| c.message.as_str())
}

/// A set's conditions after this pass's verdict: with `invalid`, `ReplicaFailure=True` with reason
/// [`INVALID_SPEC`] replaces any `ReplicaFailure` (its transition time kept while it stays True); without, a
/// `ReplicaFailure` with reason [`INVALID_SPEC`] is removed. Other conditions are kept as they are.
pub fn set_conditions(
    current: &[MachineSetCondition],
    invalid: Option<&InvalidSpec>,
    now: Timestamp,
) -> Vec<MachineSetCondition> {
    let is_failure = |c: &MachineSetCondition| c.r#type == MachineSetConditionType::ReplicaFailure;
    let mut conditions: Vec<MachineSetCondition> = current
        .iter()
        .filter(|c| !(is_failure(c) && (invalid.is_some() || c.reason == INVALID_SPEC)))
        .cloned()
        .collect();
    if let Some(invalid) = invalid {
        let transition = current
            .iter()
            .find(|c| is_failure(c) && c.status == ConditionStatus::True)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        conditions.push(MachineSetCondition {
            r#type: MachineSetConditionType::ReplicaFailure,
            status: ConditionStatus::True,
            last_transition_time: Some(transition),
            reason: INVALID_SPEC.to_owned(),
            message: invalid.message.clone(),
        });
    }
    conditions
}

/// The deployment's conditions while it is invalid: `ReplicaFailure=True`, `Progressing=False` and
/// `Available=False`, each with reason [`INVALID_SPEC`] and the field errors as message. `lastUpdateTime` moves only
/// when status, reason or message change, `lastTransitionTime` only when the status changes; other conditions
/// (`Frozen`) are kept.
pub fn deployment_conditions(
    current: &[MachineDeploymentCondition],
    invalid: &InvalidSpec,
    now: Timestamp,
) -> Vec<MachineDeploymentCondition> {
    const HELD: [(MachineDeploymentConditionType, ConditionStatus); 3] = [
        (MachineDeploymentConditionType::Available, ConditionStatus::False),
        (
            MachineDeploymentConditionType::Progressing,
            ConditionStatus::False,
        ),
        (
            MachineDeploymentConditionType::ReplicaFailure,
            ConditionStatus::True,
        ),
    ];
    let mut conditions: Vec<MachineDeploymentCondition> = current
        .iter()
        .filter(|c| HELD.iter().all(|(t, _)| *t != c.r#type))
        .cloned()
        .collect();
    for (type_, status) in HELD {
        let previous = current.iter().find(|c| c.r#type == type_);
        let same_status = previous.filter(|p| p.status == status);
        let unchanged = same_status.filter(|p| p.reason == INVALID_SPEC && p.message == invalid.message);
        conditions.push(MachineDeploymentCondition {
            r#type: type_,
            status,
            last_update_time: unchanged
                .and_then(|p| p.last_update_time.clone())
                .or(Some(Time(now))),
            last_transition_time: same_status
                .and_then(|p| p.last_transition_time.clone())
                .or(Some(Time(now))),
            reason: INVALID_SPEC.to_owned(),
            message: invalid.message.clone(),
        });
    }
    conditions
}

/// The deployment's conditions without those an invalid spec put there (reason [`INVALID_SPEC`]): what the
/// controller starts from once the spec is valid again, so that Available and Progressing are computed afresh.
pub fn without_invalid_spec(conditions: &[MachineDeploymentCondition]) -> Vec<MachineDeploymentCondition> {
    conditions
        .iter()
        .filter(|c| c.reason != INVALID_SPEC)
        .cloned()
        .collect()
}

/// The class's secret references whose Secret does not exist (`exists(namespace, name)` says), in field order: what
/// the machines of the class report ([`Description::SecretNotFound`]) instead of trying to create anything, and what
/// the class's Warning Event says. A reference without a name is validation's to report; one without a namespace
/// means `default_namespace`.
pub fn missing_secrets(
    class: &MachineClass,
    default_namespace: &str,
    exists: impl Fn(&str, &str) -> bool,
) -> Vec<MissingSecret> {
    secret_references(class, default_namespace)
        .filter(|(_, namespace, name)| !exists(namespace, name))
        .map(|(field, namespace, name)| MissingSecret {
            field,
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        })
        .collect()
}

/// The Secrets a class refers to, as `(field, namespace, name)` in field order: `secretRef`, then
/// `credentialsSecretRef`, whose keys win when the two are merged into the secret a provider gets. A reference
/// without a name is left out (validation reports it); one without a namespace means `default_namespace`.
pub fn secret_references<'a>(
    class: &'a MachineClass,
    default_namespace: &'a str,
) -> impl Iterator<Item = (SecretField, &'a str, &'a str)> + 'a {
    SecretField::ALL.into_iter().filter_map(move |field| {
        let reference = match field {
            SecretField::SecretRef => class.secret_ref.as_ref(),
            SecretField::CredentialsSecretRef => class.credentials_secret_ref.as_ref(),
        }?;
        let name = reference.name.as_deref().filter(|n| !n.is_empty())?;
        let namespace = reference
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(default_namespace);
        Some((field, namespace, name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(message: &str) -> InvalidSpec {
        InvalidSpec {
            errors: vec![FieldError::required("spec.selector", "")],
            message: message.to_owned(),
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn a_set_condition_replaces_a_replica_failure_and_goes_when_valid() {
        let failed = MachineSetCondition {
            r#type: MachineSetConditionType::ReplicaFailure,
            status: ConditionStatus::True,
            last_transition_time: Some(Time(at(10))),
            reason: "FailedCreate".into(),
            message: "quota".into(),
        };
        let frozen = MachineSetCondition {
            r#type: MachineSetConditionType::Frozen,
            status: ConditionStatus::True,
            last_transition_time: None,
            reason: "Overshoot".into(),
            message: String::new(),
        };
        let held = set_conditions(&[failed, frozen.clone()], Some(&invalid("m")), at(20));
        assert_eq!(held.len(), 2);
        assert_eq!(set_invalid_message(&held), Some("m"));
        // Still True: the transition time stays.
        assert_eq!(held[1].last_transition_time, Some(Time(at(10))));
        assert_eq!(set_conditions(&held, None, at(30)), vec![frozen]);
    }

    #[test]
    fn deployment_conditions_claim_neither_availability_nor_progress() {
        let held = deployment_conditions(&[], &invalid("m"), at(5));
        let status_of = |t| {
            held.iter()
                .find(|c| c.r#type == t)
                .map(|c| (c.status, c.reason.as_str()))
        };
        assert_eq!(
            status_of(MachineDeploymentConditionType::Available),
            Some((ConditionStatus::False, INVALID_SPEC))
        );
        assert_eq!(
            status_of(MachineDeploymentConditionType::Progressing),
            Some((ConditionStatus::False, INVALID_SPEC))
        );
        assert_eq!(deployment_invalid_message(&held), Some("m"));
        // The same verdict later changes nothing (no status write).
        assert_eq!(deployment_conditions(&held, &invalid("m"), at(50)), held);
        assert!(without_invalid_spec(&held).is_empty());
    }

    #[test]
    fn a_missing_secret_is_named_with_its_field_and_namespace() {
        let class: MachineClass = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "c" },
            "providerSpec": {},
            "secretRef": { "name": "boot" },
            "credentialsSecretRef": { "name": "creds", "namespace": "infra" }
        }))
        .unwrap();
        let text = |missing: Vec<MissingSecret>| missing.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(
            text(missing_secrets(&class, "default", |_, name| name == "creds")),
            [r#"secretRef: Secret "boot" not found in namespace "default""#]
        );
        assert_eq!(
            text(missing_secrets(&class, "default", |namespace, _| namespace == "default")),
            [r#"credentialsSecretRef: Secret "creds" not found in namespace "infra""#]
        );
        assert!(missing_secrets(&class, "default", |_, _| true).is_empty());
    }

    #[test]
    fn secret_references_come_in_merge_order_with_the_namespace_defaulted() {
        let class: MachineClass = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "c" },
            "providerSpec": {},
            "secretRef": { "name": "boot", "namespace": "" },
            "credentialsSecretRef": { "name": "creds", "namespace": "infra" }
        }))
        .unwrap();
        assert_eq!(
            secret_references(&class, "default").collect::<Vec<_>>(),
            [
                (SecretField::SecretRef, "default", "boot"),
                (SecretField::CredentialsSecretRef, "infra", "creds")
            ]
        );
        let nameless: MachineClass = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "c" }, "providerSpec": {}, "secretRef": { "namespace": "infra" }
        }))
        .unwrap();
        assert_eq!(secret_references(&nameless, "default").count(), 0);
    }

    #[test]
    fn one_warning_per_message() {
        assert!(should_warn(None, None, "a"));
        assert!(!should_warn(Some("a"), None, "a"));
        assert!(!should_warn(None, Some("a"), "a"));
        assert!(should_warn(Some("a"), Some("a"), "b"));
    }
}
