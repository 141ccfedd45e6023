//! Validating admission of the machine kinds (`machine.sapcloud.io`: Machine, MachineSet, MachineDeployment,
//! MachineClass): a create, update or patch whose resulting object fails `mcm_api::validation` is refused with 422
//! `Invalid`, one cause per field, as kube-apiserver refuses a built-in Deployment
//! (`MachineDeployment.machine.sapcloud.io "x" is invalid: spec.replicas: Invalid value: -1: must be greater than or
//! equal to 0`).
//!
//! It is an admission step, not part of the CRD schema: it holds when a user replaces the CRDs, and the schemas stay
//! as permissive as the reference's. `deploy/validating-admission-policy.yaml` carries the same rules, in CEL, for
//! real clusters. It never blocks (so that an invalid object can always be deleted):
//! - writes to the `status` and `scale` subresources (they do not come here);
//! - a write to an object that is being deleted (`deletionTimestamp` set, before or after);
//! - an update that changes only `metadata` (finalizers, labels, annotations, owner references) of a stored object,
//!   valid or not.
//!
//! [`Config::machine_admission`](crate::Config::machine_admission) turns it off, so that tests can store invalid
//! objects as a cluster without the policy would.

use mcm_api::{
    Machine, MachineClass, MachineDeployment, MachineSet,
    validation::{self, ErrorKind, FieldError},
};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{
    error::{ApiError, Cause},
    metadata::is_deleting,
    objects::Context,
};

/// The API group whose kinds are admitted here.
pub const GROUP: &str = "machine.sapcloud.io";

/// Admits `object`, the result of a create (`old` is `None`) or of an update or patch of `old`.
pub fn admit(ctx: &Context, old: Option<&Value>, object: &Value) -> Result<(), ApiError> {
    if !ctx.admission || ctx.def.group != GROUP || exempt(old, object) {
        return Ok(());
    }
    let errors = match ctx.def.kind.as_str() {
        "Machine" => check::<Machine>(object, validation::validate_machine),
        "MachineSet" => check::<MachineSet>(object, validation::validate_machine_set),
        "MachineDeployment" => check::<MachineDeployment>(object, validation::validate_machine_deployment),
        "MachineClass" => check::<MachineClass>(object, validation::validate_machine_class),
        _ => return Ok(()),
    };
    if errors.is_empty() {
        return Ok(());
    }
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    Err(ApiError::invalid(
        &ctx.def,
        name,
        errors.iter().map(cause).collect(),
    ))
}

/// Whether the write is one admission never blocks: the object is being deleted, or only its metadata changes.
fn exempt(old: Option<&Value>, object: &Value) -> bool {
    match old {
        None => false,
        Some(old) => {
            is_deleting(old) || is_deleting(object) || without_metadata(old) == without_metadata(object)
        }
    }
}

/// Everything the user writes but metadata: the spec (a MachineClass's top-level fields), not the status.
fn without_metadata(object: &Value) -> Value {
    let mut part = object.clone();
    if let Some(map) = part.as_object_mut() {
        for key in ["metadata", "status", "apiVersion", "kind"] {
            map.remove(key);
        }
    }
    part
}

fn check<K: DeserializeOwned>(object: &Value, validate: fn(&K) -> Vec<FieldError>) -> Vec<FieldError> {
    match serde_json::from_value::<K>(object.clone()) {
        Ok(typed) => validate(&typed),
        // The schema check comes first, so this is a type a replaced, looser CRD let through.
        Err(err) => vec![FieldError::invalid(
            "",
            "object",
            format!("cannot be read: {err}"),
        )],
    }
}

/// A field error as a Status cause: the reason as kube-apiserver names it, the message without the field path.
fn cause(error: &FieldError) -> Cause {
    let reason = match error.kind {
        ErrorKind::Required => "FieldValueRequired",
        ErrorKind::Invalid(_) | ErrorKind::InvalidNumber(_) => "FieldValueInvalid",
        ErrorKind::NotSupported(..) => "FieldValueNotSupported",
        ErrorKind::Forbidden => "FieldValueForbidden",
    };
    let text = error.to_string();
    let message = text
        .strip_prefix(&format!("{}: ", error.path))
        .unwrap_or(&text)
        .to_owned();
    Cause {
        reason,
        message,
        field: error.path.clone(),
    }
}
