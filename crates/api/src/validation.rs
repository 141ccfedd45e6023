//! Validation of the four kinds as pure functions.
//!
//! Each function returns every problem found, as a field path plus a reason, in the form Kubernetes uses
//! (`spec.template.spec.class.name: Required value`). The controllers put these on the object's status and in an
//! Event; nothing is created or destroyed because of an invalid object. What is checked: what the reference checks
//! (class reference, replicas, selector against template labels, strategy type), and what this project adds (names
//! are DNS-1123, durations parse, maxSurge and maxUnavailable valid and not both zero, the strategy types this
//! project supports, an empty strategy type meaning RollingUpdate, and InPlaceUpdate's parameters).

use std::{collections::BTreeMap, fmt};

use k8s_openapi::apimachinery::pkg::{
    apis::meta::v1::{LabelSelector, ObjectMeta},
    util::intstr::IntOrString,
};
use kube::core::{Selector, SelectorExt};

use crate::{
    ClassSpec, GoDuration, Machine, MachineClass, MachineConfiguration, MachineDeployment, MachineSet,
    MachineTemplateSpec, StrategyType,
};

/// What is wrong with a field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The field must be set.
    Required,
    /// The value is not valid; carries the value as written.
    Invalid(String),
    /// The number is not valid (printed bare, as Kubernetes prints numbers: `Invalid value: -1`).
    InvalidNumber(i64),
    /// The value is not one of the supported ones; carries the value and the supported values.
    NotSupported(String, Vec<&'static str>),
    /// The value is not allowed here.
    Forbidden,
}

/// One problem: the field path, what kind of problem, and a human-readable detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field, such as `spec.template.spec.class.name`.
    pub path: String,
    /// What kind of problem.
    pub kind: ErrorKind,
    /// Why, in words; may be empty.
    pub detail: String,
}

impl FieldError {
    fn new(path: impl Into<String>, kind: ErrorKind, detail: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            kind,
            detail: detail.into(),
        }
    }

    /// `path: Required value`.
    pub fn required(path: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Required, detail)
    }

    /// `path: Invalid value: "value": detail`.
    pub fn invalid(path: impl Into<String>, value: impl fmt::Display, detail: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Invalid(value.to_string()), detail)
    }

    /// `path: Invalid value: -1: detail`, for a number.
    pub fn invalid_number(path: impl Into<String>, value: i64, detail: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::InvalidNumber(value), detail)
    }

    /// `path: Forbidden: detail`.
    pub fn forbidden(path: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Forbidden, detail)
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.path)?;
        match &self.kind {
            ErrorKind::Required => f.write_str("Required value")?,
            ErrorKind::Invalid(value) => write!(f, "Invalid value: {value:?}")?,
            ErrorKind::InvalidNumber(value) => write!(f, "Invalid value: {value}")?,
            ErrorKind::NotSupported(value, supported) => {
                write!(f, "Unsupported value: {value:?}")?;
                if !supported.is_empty() {
                    let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
                    write!(f, ": supported values: {}", list.join(", "))?;
                }
            }
            ErrorKind::Forbidden => f.write_str("Forbidden")?,
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// Joins errors into one message, one error per line part, in the order found.
pub fn summarize(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Validates a Machine.
pub fn validate_machine(machine: &Machine) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_object_name(&machine.metadata, &mut errors);
    validate_class_reference(&machine.spec.class, "spec.class", &mut errors);
    validate_configuration(&machine.spec.configuration, "spec", &mut errors);
    errors
}

/// Validates a MachineSet.
pub fn validate_machine_set(set: &MachineSet) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_object_name(&set.metadata, &mut errors);
    let spec = &set.spec;
    validate_non_negative(spec.replicas, "spec.replicas", &mut errors);
    validate_non_negative(spec.min_ready_seconds, "spec.minReadySeconds", &mut errors);
    if let Some(max) = spec.auto_preserve_failed_machine_max {
        validate_non_negative(max, "spec.autoPreserveFailedMachineMax", &mut errors);
    }
    validate_selector_and_template(spec.selector.as_ref(), &spec.template, &mut errors);
    errors
}

/// Validates a MachineDeployment.
pub fn validate_machine_deployment(deployment: &MachineDeployment) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_object_name(&deployment.metadata, &mut errors);
    let spec = &deployment.spec;
    validate_non_negative(spec.replicas, "spec.replicas", &mut errors);
    validate_non_negative(spec.min_ready_seconds, "spec.minReadySeconds", &mut errors);
    if let Some(limit) = spec.revision_history_limit {
        validate_non_negative(limit, "spec.revisionHistoryLimit", &mut errors);
    }
    if let Some(max) = spec.auto_preserve_failed_machine_max {
        validate_non_negative(max, "spec.autoPreserveFailedMachineMax", &mut errors);
    }
    if let Some(deadline) = spec.progress_deadline_seconds
        && deadline <= spec.min_ready_seconds
    {
        errors.push(FieldError::invalid_number(
            "spec.progressDeadlineSeconds",
            deadline.into(),
            "must be greater than minReadySeconds",
        ));
    }
    if let Some(rollback) = &spec.rollback_to
        && rollback.revision < 0
    {
        errors.push(FieldError::invalid_number(
            "spec.rollbackTo.revision",
            rollback.revision,
            "must be greater than or equal to 0",
        ));
    }
    validate_selector_and_template(spec.selector.as_ref(), &spec.template, &mut errors);
    validate_strategy(deployment, &mut errors);
    errors
}

/// Validates a MachineClass (the parts the controllers rely on; providerSpec is the provider's to validate).
pub fn validate_machine_class(class: &MachineClass) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_object_name(&class.metadata, &mut errors);
    match &class.provider_spec {
        serde_json::Value::Null => errors.push(FieldError::required("providerSpec", "")),
        serde_json::Value::Object(_) => {}
        other => errors.push(FieldError::invalid(
            "providerSpec",
            json_kind(other),
            "must be an object",
        )),
    }
    for (path, reference) in [
        ("secretRef", &class.secret_ref),
        ("credentialsSecretRef", &class.credentials_secret_ref),
    ] {
        if let Some(reference) = reference
            && reference.name.as_deref().unwrap_or_default().is_empty()
        {
            errors.push(FieldError::required(format!("{path}.name"), ""));
        }
    }
    if let Some(template) = &class.node_template {
        for resource in ["cpu", "gpu", "memory"] {
            if !template.capacity.contains_key(resource) {
                errors.push(FieldError::required(
                    format!("nodeTemplate.capacity.{resource}"),
                    "",
                ));
            }
        }
        let capacities = template
            .capacity
            .iter()
            .map(|(k, v)| (format!("nodeTemplate.capacity.{k}"), v));
        let virtual_capacities = template
            .virtual_capacity
            .iter()
            .flatten()
            .map(|(k, v)| (format!("nodeTemplate.virtualCapacity.{k}"), v));
        for (path, quantity) in capacities.chain(virtual_capacities) {
            if !is_quantity(&quantity.0) {
                errors.push(FieldError::invalid(
                    path,
                    &quantity.0,
                    "must be a Kubernetes quantity such as 2, 500m or 4Gi",
                ));
            }
        }
        for (path, value) in [
            ("nodeTemplate.instanceType", &template.instance_type),
            ("nodeTemplate.region", &template.region),
            ("nodeTemplate.zone", &template.zone),
        ] {
            if value.is_empty() {
                errors.push(FieldError::required(path, ""));
            }
        }
    }
    errors
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

fn validate_non_negative(value: i32, path: &str, errors: &mut Vec<FieldError>) {
    if value < 0 {
        errors.push(FieldError::invalid_number(
            path,
            value.into(),
            "must be greater than or equal to 0",
        ));
    }
}

fn validate_object_name(meta: &ObjectMeta, errors: &mut Vec<FieldError>) {
    match (meta.name.as_deref(), meta.generate_name.as_deref()) {
        (Some(name), _) if !name.is_empty() => {
            if let Err(reason) = check_dns1123_subdomain(name) {
                errors.push(FieldError::invalid("metadata.name", name, reason));
            }
        }
        (_, Some(prefix)) if !prefix.is_empty() => {
            // The server appends five characters to the prefix; the prefix itself may end in '-'.
            let probe = format!("{prefix}x");
            if let Err(reason) = check_dns1123_subdomain(&probe) {
                errors.push(FieldError::invalid("metadata.generateName", prefix, reason));
            }
        }
        _ => errors.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        )),
    }
}

fn validate_class_reference(class: &ClassSpec, path: &str, errors: &mut Vec<FieldError>) {
    if class.kind.is_empty() {
        errors.push(FieldError::required(format!("{path}.kind"), ""));
    }
    if class.name.is_empty() {
        errors.push(FieldError::required(format!("{path}.name"), ""));
    } else if let Err(reason) = check_dns1123_subdomain(&class.name) {
        errors.push(FieldError::invalid(format!("{path}.name"), &class.name, reason));
    }
}

fn validate_configuration(config: &MachineConfiguration, spec_path: &str, errors: &mut Vec<FieldError>) {
    let durations: [(&str, &Option<GoDuration>); 5] = [
        ("drainTimeout", &config.drain_timeout),
        ("healthTimeout", &config.health_timeout),
        ("creationTimeout", &config.creation_timeout),
        ("inPlaceUpdateTimeout", &config.in_place_update_timeout),
        ("machinePreserveTimeout", &config.machine_preserve_timeout),
    ];
    for (field, value) in durations {
        if let Some(duration) = value
            && let Err(err) = duration.parse()
        {
            errors.push(FieldError::invalid(
                format!("{spec_path}.{field}"),
                duration,
                format!("must be a Go duration such as 10m or 1h30m ({err})"),
            ));
        }
    }
    if let Some(retries) = config.max_evict_retries {
        validate_non_negative(retries, &format!("{spec_path}.maxEvictRetries"), errors);
    }
    if let Some(conditions) = &config.node_conditions {
        for condition in conditions.split(',').map(str::trim) {
            if condition.is_empty() || condition.contains(char::is_whitespace) {
                errors.push(FieldError::invalid(
                    format!("{spec_path}.nodeConditions"),
                    conditions,
                    "must be a comma-separated list of node condition types",
                ));
                break;
            }
        }
    }
}

fn validate_selector_and_template(
    selector: Option<&LabelSelector>,
    template: &MachineTemplateSpec,
    errors: &mut Vec<FieldError>,
) {
    let labels = template.labels();
    for (key, value) in &labels {
        if let Err(reason) = check_label_key(key) {
            errors.push(FieldError::invalid(
                format!("spec.template.metadata.labels[{key}]"),
                key,
                reason,
            ));
        }
        if let Err(reason) = check_label_value(value) {
            errors.push(FieldError::invalid(
                format!("spec.template.metadata.labels[{key}]"),
                value,
                reason,
            ));
        }
    }
    match selector {
        None => errors.push(FieldError::required("spec.selector", "")),
        Some(selector)
            if selector.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
                && selector.match_expressions.as_ref().is_none_or(Vec::is_empty) =>
        {
            errors.push(FieldError::invalid(
                "spec.selector",
                "{}",
                "empty selector is invalid: it would select every machine in the namespace",
            ));
        }
        Some(selector) => match Selector::try_from(selector.clone()) {
            Err(err) => errors.push(FieldError::invalid(
                "spec.selector",
                "matchExpressions",
                err.to_string(),
            )),
            Ok(parsed) => {
                if !parsed.matches(&labels) {
                    errors.push(FieldError::invalid(
                        "spec.selector",
                        parsed.to_string(),
                        "`selector` does not match template `labels`",
                    ));
                }
            }
        },
    }
    validate_class_reference(&template.spec.class, "spec.template.spec.class", errors);
    validate_configuration(&template.spec.configuration, "spec.template.spec", errors);
}

fn validate_strategy(deployment: &MachineDeployment, errors: &mut Vec<FieldError>) {
    let strategy = &deployment.spec.strategy;
    match strategy.strategy_type() {
        Err(other) => errors.push(FieldError::new(
            "spec.strategy.type",
            ErrorKind::NotSupported(other.to_owned(), SUPPORTED_STRATEGIES.to_vec()),
            "",
        )),
        Ok(StrategyType::InPlaceUpdate) => validate_in_place_update(strategy, errors),
        Ok(StrategyType::RollingUpdate) => {
            let rolling = strategy.rolling_update.clone().unwrap_or_default();
            validate_surge_and_unavailable(
                rolling.max_surge.as_ref(),
                rolling.max_unavailable.as_ref(),
                "spec.strategy.rollingUpdate",
                errors,
            );
        }
        Ok(StrategyType::Recreate | StrategyType::OnDelete) => {
            if strategy.rolling_update.is_some() {
                errors.push(FieldError::forbidden(
                    "spec.strategy.rollingUpdate",
                    format!(
                        "may not be specified when strategy `type` is '{}'",
                        strategy.r#type
                    ),
                ));
            }
        }
    }
    if strategy.in_place_update.is_some() && strategy.strategy_type() != Ok(StrategyType::InPlaceUpdate) {
        errors.push(FieldError::forbidden(
            "spec.strategy.inPlaceUpdate",
            "may only be specified with strategy type InPlaceUpdate",
        ));
    }
}

/// The strategy types this project supports, as validation lists them.
const SUPPORTED_STRATEGIES: [&str; 4] = ["RollingUpdate", "Recreate", "OnDelete", "InPlaceUpdate"];

/// The orchestration types of an in-place update (the reference's `OrchestrationTypeAuto` and `…Manual`).
pub const ORCHESTRATION_TYPES: [&str; 2] = ["Auto", "Manual"];

/// `strategy.type: InPlaceUpdate` (reference `validateUpdateStrategy`): the `inPlaceUpdate` parameters are required,
/// with `orchestrationType` `Auto` or `Manual`; maxSurge and maxUnavailable are checked as rollingUpdate's are
/// (absent means 1); `rollingUpdate` may not be given beside it.
fn validate_in_place_update(strategy: &crate::MachineDeploymentStrategy, errors: &mut Vec<FieldError>) {
    if strategy.rolling_update.is_some() {
        errors.push(FieldError::forbidden(
            "spec.strategy.rollingUpdate",
            "may not be specified when strategy `type` is 'InPlaceUpdate'",
        ));
    }
    let Some(in_place) = &strategy.in_place_update else {
        errors.push(FieldError::required(
            "spec.strategy.inPlaceUpdate",
            "InPlaceUpdate parameter cannot be nil for in-place update strategy",
        ));
        return;
    };
    match in_place.orchestration_type.as_str() {
        "" => errors.push(FieldError::required(
            "spec.strategy.inPlaceUpdate.orchestrationType",
            "must be Auto or Manual",
        )),
        other if !ORCHESTRATION_TYPES.contains(&other) => errors.push(FieldError::new(
            "spec.strategy.inPlaceUpdate.orchestrationType",
            ErrorKind::NotSupported(other.to_owned(), ORCHESTRATION_TYPES.to_vec()),
            "",
        )),
        _ => {}
    }
    validate_surge_and_unavailable(
        in_place.max_surge.as_ref(),
        in_place.max_unavailable.as_ref(),
        "spec.strategy.inPlaceUpdate",
        errors,
    );
}

/// maxSurge and maxUnavailable under `prefix`: each a non-negative number or percentage (maxUnavailable at most
/// 100%), and not both an explicit 0 (absent values default to 1 each, as in the reference's API documentation).
fn validate_surge_and_unavailable(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    prefix: &str,
    errors: &mut Vec<FieldError>,
) {
    let surge = max_surge.map(|v| (v, check_int_or_percent(v, false)));
    let unavailable = max_unavailable.map(|v| (v, check_int_or_percent(v, true)));
    for (field, checked) in [("maxSurge", &surge), ("maxUnavailable", &unavailable)] {
        if let Some((value, Err(reason))) = checked {
            errors.push(FieldError::invalid(
                format!("{prefix}.{field}"),
                int_or_string_text(value),
                reason.clone(),
            ));
        }
    }
    if let (Some((_, Ok(0))), Some((_, Ok(0)))) = (&surge, &unavailable) {
        errors.push(FieldError::invalid(
            format!("{prefix}.maxUnavailable"),
            "0",
            "may not be 0 when maxSurge is 0",
        ));
    }
}

/// The text of an int-or-string as the user wrote it.
pub fn int_or_string_text(value: &IntOrString) -> String {
    match value {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// Checks a maxSurge or maxUnavailable value: a non-negative number or a percentage (`"25%"`); a percentage of
/// maxUnavailable may not exceed 100. Returns the number, or the percentage's number, when valid.
pub fn check_int_or_percent(value: &IntOrString, at_most_hundred_percent: bool) -> Result<i32, String> {
    match value {
        IntOrString::Int(n) if *n < 0 => Err("must be greater than or equal to 0".into()),
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(text) => {
            let Some(number) = text.strip_suffix('%') else {
                return Err("a string value must be a percentage such as '25%'".into());
            };
            let percent: i32 = number
                .parse()
                .map_err(|_| "a string value must be a percentage such as '25%'".to_string())?;
            if percent < 0 {
                Err("must be greater than or equal to 0".into())
            } else if at_most_hundred_percent && percent > 100 {
                Err("must not be greater than 100%".into())
            } else {
                Ok(percent)
            }
        }
    }
}

/// Checks a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and ending alphanumeric, at most
/// 253 characters): what Kubernetes requires of most object names, and of node names.
pub fn check_dns1123_subdomain(name: &str) -> Result<(), String> {
    const MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or \
                       '.', and must start and end with an alphanumeric character";
    if name.len() > 253 {
        return Err("must be no more than 253 characters".into());
    }
    let valid = name.split('.').all(|label| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    if valid { Ok(()) } else { Err(MSG.into()) }
}

/// Checks a label key: an optional DNS-1123 subdomain prefix and `/`, then a name of at most 63 characters made of
/// alphanumerics, '-', '_' and '.', starting and ending alphanumeric.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        check_dns1123_subdomain(prefix).map_err(|reason| format!("prefix part {reason}"))?;
    }
    if name.is_empty() {
        return Err("name part must be non-empty".into());
    }
    check_label_value(name).map_err(|reason| format!("name part {reason}"))
}

/// Checks a label value: empty, or at most 63 alphanumerics, '-', '_' and '.', starting and ending alphanumeric.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 {
        return Err("must be no more than 63 characters".into());
    }
    let bytes = value.as_bytes();
    let ends_ok = bytes[0].is_ascii_alphanumeric() && bytes[bytes.len() - 1].is_ascii_alphanumeric();
    let chars_ok = bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ends_ok && chars_ok {
        Ok(())
    } else {
        Err(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an \
             alphanumeric character"
                .into(),
        )
    }
}

/// True when the text is a Kubernetes quantity: a signed decimal number with an optional binary-SI, decimal-SI or
/// exponent suffix (`2`, `1.5`, `500m`, `4Gi`, `1e3`).
pub fn is_quantity(text: &str) -> bool {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let number_len = unsigned
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    let (number, suffix) = unsigned.split_at(number_len);
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    if digits == 0 || number.matches('.').count() > 1 {
        return false;
    }
    match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => true,
        exponent => exponent.strip_prefix(['e', 'E']).is_some_and(|rest| {
            let rest = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())
        }),
    }
}
