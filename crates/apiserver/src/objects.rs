//! Object semantics, as the Kubernetes API conventions define them for the served subset: uid, creationTimestamp,
//! generateName, generation, optimistic concurrency, status and scale subresources, finalizers and
//! deletionTimestamp, Secret `stringData`, namespace lifecycle, and field validation against the schema.
//!
//! Every write goes through [`Store::mutate`], so the decision and the commit happen atomically; a write whose
//! result equals the stored object writes nothing and emits no event.

use std::{collections::BTreeMap, sync::Arc};

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::{
    error::{ApiError, Cause},
    metadata::is_deleting,
    patch::{self, PatchType},
    registry::{Registry, ResourceDef},
    schema_check,
    store::{EventType, Mutation, Store},
};

/// How unknown fields are treated (`?fieldValidation=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    /// Unknown fields fail the request with 400.
    Strict,
    /// Unknown fields are dropped and reported in a `Warning` header (the server default).
    Warn,
    /// Unknown fields are dropped silently.
    Ignore,
}

/// What a write needs to know besides the object.
#[derive(Clone, Debug)]
pub struct Context {
    /// The resource.
    pub def: Arc<ResourceDef>,
    /// The namespace of the request (empty for cluster-scoped resources).
    pub namespace: String,
    /// The time of the request.
    pub now: jiff::Timestamp,
    /// Treatment of unknown fields.
    pub field_validation: FieldValidation,
    /// Validating admission of the machine kinds ([`crate::admission`]) on create, update and patch.
    pub admission: bool,
    /// Who writes, for `metadata.managedFields` ([`crate::apply::record`]); None for the server's own writes.
    pub manager: Option<crate::apply::Manager>,
    /// `dryRun=All`: every check and admission runs, nothing is stored ([`commit`]).
    pub dry_run: bool,
}

/// Commits a write decided by `decide` ([`Store::mutate`]), or, in a dry run, only decides it
/// ([`Store::preview`]): the answer is the same, nothing is stored and no watch event is sent.
pub fn commit<F>(
    store: &Store,
    ctx: &Context,
    name: &str,
    decide: F,
) -> Result<(Option<Arc<Value>>, Option<EventType>), ApiError>
where
    F: FnOnce(Option<&Arc<Value>>) -> Result<Mutation, ApiError>,
{
    let resource = resource_id(&ctx.def);
    if ctx.dry_run {
        store.preview(&resource, &ctx.namespace, name, decide)
    } else {
        store.mutate(&resource, &ctx.namespace, name, decide)
    }
}

/// The result of a write.
#[derive(Debug)]
pub struct Outcome {
    /// The object as stored.
    pub object: Value,
    /// Warnings for the `Warning` header.
    pub warnings: Vec<String>,
}

/// The result of a deletion.
#[derive(Debug)]
pub enum Deleted {
    /// The object is gone; its last state.
    Gone(Value),
    /// The object has finalizers and is now marked for deletion.
    Marked(Value),
}

/// The store key of a resource: `group/plural`.
pub fn resource_id(def: &ResourceDef) -> String {
    format!("{}/{}", def.group, def.plural)
}

/// A timestamp as the API writes it (RFC 3339, whole seconds, UTC).
pub(crate) fn timestamp(now: jiff::Timestamp) -> String {
    now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The labels of an object.
pub fn labels(object: &Value) -> BTreeMap<String, String> {
    object["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// The order of objects in lists (namespace, then name), as a string key for continue tokens.
pub fn sort_key(object: &Value) -> String {
    let meta = &object["metadata"];
    format!(
        "{}\u{0}{}",
        meta["namespace"].as_str().unwrap_or_default(),
        meta["name"].as_str().unwrap_or_default()
    )
}

/// A continue token: where the next page starts.
pub fn encode_continue(rv: u64, key: &str) -> String {
    let token = json!({ "rv": rv, "start": key });
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

/// The key after which the next page starts.
pub fn decode_continue(token: &str) -> Result<String, ApiError> {
    let invalid = || ApiError::BadRequest("continue key is not valid".into());
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| invalid())?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
    value["start"].as_str().map(str::to_owned).ok_or_else(invalid)
}

/// The value at a dot-separated path (`spec.replicas`), if any.
fn value_at<'v>(object: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(object, |current, key| current.get(key))
}

/// The `autoscaling/v1` Scale of an object with a scale subresource, read at the resource's scale paths.
pub fn scale_of(def: &ResourceDef, object: &Value) -> Value {
    let meta = &object["metadata"];
    let paths = &def.scale_paths;
    let replicas = |path: &str| value_at(object, path).and_then(Value::as_i64).unwrap_or(0);
    let mut status = json!({ "replicas": replicas(&paths.status_replicas) });
    if let Some(selector) = paths
        .label_selector
        .as_deref()
        .and_then(|path| value_at(object, path))
        .and_then(Value::as_str)
    {
        status["selector"] = json!(selector);
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
            "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": { "replicas": replicas(&paths.spec_replicas) },
        "status": status,
    })
}

/// The patch type of a PATCH request, or 415 as a real server answers it (strategic merge patch is not served for
/// custom resources). Server-side apply is served by [`crate::apply`].
pub fn patch_type(def: &ResourceDef, content_type: &str) -> Result<PatchType, ApiError> {
    let accepted = if def.custom {
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    } else {
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
    };
    match PatchType::from_content_type(content_type) {
        Some(PatchType::Strategic) if def.custom => None,
        other => other,
    }
    .ok_or_else(|| {
        ApiError::UnsupportedMediaType(format!(
            "the body of the request was in an unknown format - accepted media types include: {accepted}"
        ))
    })
}

fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    object["metadata"]
        .as_object_mut()
        .expect("metadata was just made an object")
}

fn name_of(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

/// Puts the request's namespace on the object (refusing a different one) and removes it for cluster-scoped kinds.
fn place_in_namespace(ctx: &Context, object: &mut Value) -> Result<(), ApiError> {
    let meta = meta_mut(object);
    if !ctx.def.namespaced {
        meta.remove("namespace");
        return Ok(());
    }
    match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() && ns != ctx.namespace => Err(ApiError::BadRequest(
            "the namespace of the provided object does not match the namespace sent on the request".into(),
        )),
        _ => {
            meta.insert("namespace".into(), json!(ctx.namespace));
            Ok(())
        }
    }
}

/// Checks the object against its schema: unknown fields by `fieldValidation`, type errors as 422.
fn validate_fields(ctx: &Context, object: &mut Value, warnings: &mut Vec<String>) -> Result<(), ApiError> {
    if ctx.def.has_defaults {
        crate::defaults::apply(ctx.def.schema(), object);
    }
    let is_crd = crate::crd::is_crd(&ctx.def);
    if is_crd {
        crate::crd::set_defaults(object);
    }
    let mut report = schema_check::check(ctx.def.schema(), object);
    if is_crd && report.causes.is_empty() {
        report.causes = crate::crd::validate(object);
    }
    if !report.unknown.is_empty() {
        let list: Vec<String> = report
            .unknown
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect();
        match ctx.field_validation {
            FieldValidation::Strict => {
                return Err(ApiError::BadRequest(format!(
                    "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
                    list.join(", "),
                    kind = ctx.def.kind,
                    version = ctx.def.version,
                )));
            }
            FieldValidation::Warn => warnings.extend(list),
            FieldValidation::Ignore => {}
        }
    }
    if !report.causes.is_empty() {
        return Err(ApiError::invalid(&ctx.def, name_of(object), report.causes));
    }
    Ok(())
}

/// 422 for metadata kube-apiserver refuses: name, generateName, labels, annotations ([`crate::metadata`]).
fn validate_meta(ctx: &Context, object: &Value) -> Result<(), ApiError> {
    let causes = crate::metadata::validate(&ctx.def, object);
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&ctx.def, name_of(object), causes))
    }
}

/// What the API server does to a Secret on every write: an empty `type` becomes `Opaque` (its defaulting), and
/// `stringData` moves into `data` (base64).
fn fold_string_data(ctx: &Context, object: &mut Value) {
    if ctx.def.kind != "Secret" {
        return;
    }
    if object.get("type").is_none_or(|t| t.is_null() || t == "") {
        object["type"] = json!(SECRET_TYPE_OPAQUE);
    }
    let Some(string_data) = object.as_object_mut().and_then(|o| o.remove("stringData")) else {
        return;
    };
    let Value::Object(string_data) = string_data else {
        return;
    };
    if !object.get("data").is_some_and(Value::is_object) {
        object["data"] = json!({});
    }
    for (key, value) in string_data {
        let text = value.as_str().unwrap_or_default();
        object["data"][key] = json!(base64::engine::general_purpose::STANDARD.encode(text));
    }
}

/// The Secret type an empty `type` defaults to.
const SECRET_TYPE_OPAQUE: &str = "Opaque";

fn random_suffix() -> String {
    use rand::Rng as _;
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

fn check_namespace(store: &Store, ctx: &Context) -> Result<(), ApiError> {
    if !ctx.def.namespaced {
        return Ok(());
    }
    match store.get("/namespaces", "", &ctx.namespace) {
        None => Err(ApiError::namespace_not_found(&ctx.namespace)),
        Some(ns) if is_deleting(&ns) => Err(ApiError::Forbidden(format!(
            "unable to create new content in namespace {} because it is being terminated",
            ctx.namespace
        ))),
        Some(_) => Ok(()),
    }
}

/// Creates an object.
pub fn create(store: &Store, ctx: &Context, mut object: Value) -> Result<Outcome, ApiError> {
    let mut warnings = Vec::new();
    crate::metadata::check_type_meta(&ctx.def, &object)?;
    place_in_namespace(ctx, &mut object)?;
    let meta = meta_mut(&mut object);
    if meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|rv| !rv.is_empty())
    {
        return Err(ApiError::BadRequest(
            "resourceVersion should not be set on objects to be created".into(),
        ));
    }
    let mut generate_name: Option<String> = None;
    let name = match meta.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) {
        Some(name) => name.to_owned(),
        None => match meta
            .get("generateName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            Some(prefix) => {
                generate_name = Some(prefix.to_owned());
                crate::metadata::generated_name(prefix, &random_suffix())
            }
            None => {
                return Err(ApiError::invalid(
                    &ctx.def,
                    "",
                    vec![Cause {
                        reason: "FieldValueRequired",
                        message: "Required value: name or generateName is required".into(),
                        field: "metadata.name".into(),
                    }],
                ));
            }
        },
    };
    meta.insert("name".into(), json!(name));
    validate_meta(ctx, &object)?;
    validate_fields(ctx, &mut object, &mut warnings)?;
    crate::secret_data::check_body(&ctx.def, &object)?;
    crate::admission::admit(ctx, None, &object)?;
    fold_string_data(ctx, &mut object);
    let meta = meta_mut(&mut object);
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(timestamp(ctx.now)));
    for server_field in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
        "generation",
    ] {
        meta.remove(server_field);
    }
    if ctx.def.generation {
        meta.insert("generation".into(), json!(1));
    }
    object["apiVersion"] = json!(ctx.def.storage_api_version());
    object["kind"] = json!(ctx.def.kind);
    match ctx.def.kind.as_str() {
        "Pod" => object["status"] = json!({ "phase": "Pending" }),
        "Namespace" => {
            object["spec"] = json!({ "finalizers": ["kubernetes"] });
            object["status"] = json!({ "phase": "Active" });
        }
        _ if crate::crd::is_crd(&ctx.def) => object["status"] = crate::crd::status(&object, ctx.now),
        _ if ctx.def.custom && ctx.def.status_subresource => {
            // The status of a custom resource with a status subresource is ignored on create.
            if let Some(o) = object.as_object_mut() {
                o.remove("status");
            }
        }
        _ => {}
    }
    crate::apply::record(ctx, None, &mut object)?;
    check_namespace(store, ctx)?;
    let stored =
        crate::metadata::retry_generated_name(name, generate_name.as_deref(), random_suffix, |name| {
            let mut attempt = object.clone();
            meta_mut(&mut attempt).insert("name".into(), json!(name));
            commit(store, ctx, name, |current| match current {
                Some(_) => Err(ApiError::already_exists(&ctx.def, name)),
                None => Ok(Mutation::Put(attempt)),
            })
            .map(|(stored, _)| stored)
        })?;
    Ok(Outcome {
        object: stored.map(|o| (*o).clone()).unwrap_or_default(),
        warnings,
    })
}

/// The part of an object whose change moves `metadata.generation`: everything but metadata (and status, when
/// status is a subresource).
fn generation_part(def: &ResourceDef, object: &Value) -> Value {
    let mut part = object.clone();
    if let Some(o) = part.as_object_mut() {
        for key in ["metadata", "apiVersion", "kind"] {
            o.remove(key);
        }
        if def.status_subresource {
            o.remove("status");
        }
    }
    part
}

fn finalizers(object: &Value) -> Vec<String> {
    object["metadata"]["finalizers"]
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Refuses a write that changes the uid or the name of an object: both are immutable (422, as kube-apiserver).
fn check_immutable(ctx: &Context, current: &Value, object: &Value) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    for field in ["uid", "name"] {
        let wanted = object["metadata"][field].as_str().filter(|v| !v.is_empty());
        if let Some(wanted) = wanted
            && Some(wanted) != current["metadata"][field].as_str()
        {
            causes.push(Cause {
                reason: "FieldValueInvalid",
                message: format!("Invalid value: \"{wanted}\": field is immutable"),
                field: format!("metadata.{field}"),
            });
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&ctx.def, name_of(current), causes))
    }
}

/// Makes `to`'s status that of `from` (removing it when `from` has none).
fn copy_status(from: &Value, to: &mut Value) {
    match from.get("status") {
        Some(status) => to["status"] = status.clone(),
        None => {
            if let Some(o) = to.as_object_mut() {
                o.remove("status");
            }
        }
    }
}

/// Copies the fields only the server sets from the stored object, and the status when it is a subresource and
/// this is a write to the main resource.
fn keep_server_fields(def: &ResourceDef, current: &Value, object: &mut Value, keep_status: bool) {
    object["apiVersion"] = json!(def.storage_api_version());
    object["kind"] = json!(def.kind);
    let current_meta = &current["metadata"];
    let meta = meta_mut(object);
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "name",
        "namespace",
    ] {
        match current_meta.get(field) {
            Some(value) if !value.is_null() => {
                meta.insert(field.into(), value.clone());
            }
            _ => {
                meta.remove(field);
            }
        }
    }
    // managedFields are set by `decide` ([`crate::apply::record`]).
    for field in ["selfLink", "resourceVersion"] {
        meta.remove(field);
    }
    if keep_status && def.status_subresource {
        copy_status(current, object);
    }
}

/// Decides how a changed object is stored: generation, finalizer rules, no-op detection, and deletion once the
/// last finalizer of a deleting object is gone.
fn decide(ctx: &Context, current: &Value, mut object: Value) -> Result<Mutation, ApiError> {
    crate::apply::record(ctx, Some(current), &mut object)?;
    if is_deleting(current) {
        let old = finalizers(current);
        let added: Vec<String> = finalizers(&object)
            .into_iter()
            .filter(|f| !old.contains(f))
            .collect();
        if !added.is_empty() {
            return Err(ApiError::invalid(
                &ctx.def,
                name_of(current),
                vec![Cause {
                    reason: "FieldValueForbidden",
                    message: format!(
                        "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                    field: "metadata.finalizers".into(),
                }],
            ));
        }
    }
    if ctx.def.generation {
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
        let changed = generation_part(&ctx.def, current) != generation_part(&ctx.def, &object);
        meta_mut(&mut object).insert("generation".into(), json!(generation + i64::from(changed)));
    }
    let mut unchanged_probe = current.clone();
    meta_mut(&mut unchanged_probe).remove("resourceVersion");
    if unchanged_probe == object {
        return Ok(Mutation::Unchanged);
    }
    let grace_pending = ctx.def.kind == "Pod" && crate::pods::grace_pending(&object, ctx.now);
    if is_deleting(&object) && finalizers(&object).is_empty() && ctx.def.kind != "Namespace" && !grace_pending
    {
        return Ok(Mutation::Delete(object));
    }
    Ok(Mutation::Put(object))
}

fn check_resource_version(ctx: &Context, current: &Value, requested: Option<&str>) -> Result<(), ApiError> {
    match requested.filter(|rv| !rv.is_empty()) {
        Some(rv) if Some(rv) != current["metadata"]["resourceVersion"].as_str() => {
            Err(ApiError::stale(&ctx.def, name_of(current)))
        }
        _ => Ok(()),
    }
}

fn outcome(stored: Option<Arc<Value>>, warnings: Vec<String>) -> Outcome {
    Outcome {
        object: stored.map(|o| (*o).clone()).unwrap_or_default(),
        warnings,
    }
}

/// Replaces an object (PUT). A resourceVersion in the body must be the current one (409 otherwise); custom
/// resources require it, as on a real server.
pub fn update(store: &Store, ctx: &Context, name: &str, mut object: Value) -> Result<Outcome, ApiError> {
    let mut warnings = Vec::new();
    crate::metadata::check_type_meta(&ctx.def, &object)?;
    match object["metadata"]["name"].as_str() {
        Some(body_name) if !body_name.is_empty() && body_name != name => {
            return Err(ApiError::BadRequest(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        _ => {
            meta_mut(&mut object).insert("name".into(), json!(name));
        }
    }
    place_in_namespace(ctx, &mut object)?;
    let requested_rv = object["metadata"]["resourceVersion"].as_str().map(str::to_owned);
    if ctx.def.custom && requested_rv.as_deref().is_none_or(str::is_empty) {
        return Err(ApiError::invalid(
            &ctx.def,
            name,
            vec![Cause {
                reason: "FieldValueInvalid",
                message: "Invalid value: 0x0: must be specified for an update".into(),
                field: "metadata.resourceVersion".into(),
            }],
        ));
    }
    validate_fields(ctx, &mut object, &mut warnings)?;
    crate::secret_data::check_body(&ctx.def, &object)?;
    fold_string_data(ctx, &mut object);
    let (stored, _) = commit(store, ctx, name, |current| {
        let current = current.ok_or_else(|| ApiError::not_found(&ctx.def, name))?;
        validate_meta(ctx, &object)?;
        check_resource_version(ctx, current, requested_rv.as_deref())?;
        check_immutable(ctx, current, &object)?;
        keep_server_fields(&ctx.def, current, &mut object, true);
        crate::admission::admit(ctx, Some(current), &object)?;
        decide(ctx, current, object)
    })?;
    Ok(outcome(stored, warnings))
}

/// Replaces the status of an object (PUT on `/status`); nothing else changes.
pub fn update_status(
    store: &Store,
    ctx: &Context,
    name: &str,
    mut object: Value,
) -> Result<Outcome, ApiError> {
    let mut warnings = Vec::new();
    crate::metadata::check_type_meta(&ctx.def, &object)?;
    validate_fields(ctx, &mut object, &mut warnings)?;
    let requested_rv = object["metadata"]["resourceVersion"].as_str().map(str::to_owned);
    let (stored, _) = commit(store, ctx, name, |current| {
        let current = current.ok_or_else(|| ApiError::not_found(&ctx.def, name))?;
        check_resource_version(ctx, current, requested_rv.as_deref())?;
        let mut next = (**current).clone();
        meta_mut(&mut next).remove("resourceVersion");
        copy_status(&object, &mut next);
        decide(ctx, current, next)
    })?;
    Ok(outcome(stored, warnings))
}

fn replicas_from_scale(ctx: &Context, name: &str, scale: &Value) -> Result<i64, ApiError> {
    match scale["spec"]["replicas"].as_i64() {
        Some(n) if n >= 0 && i32::try_from(n).is_ok() => Ok(n),
        _ => Err(ApiError::invalid(
            &ctx.def,
            name,
            vec![Cause {
                reason: "FieldValueInvalid",
                message: format!(
                    "Invalid value: {}: must be a non-negative integer",
                    scale["spec"]["replicas"]
                ),
                field: "spec.replicas".into(),
            }],
        )),
    }
}

/// The object with `replicas` at the resource's spec replicas path (objects on the way created as needed).
fn with_replicas(def: &ResourceDef, current: &Value, replicas: i64) -> Value {
    let mut next = current.clone();
    meta_mut(&mut next).remove("resourceVersion");
    let mut slot = &mut next;
    for key in def.scale_paths.spec_replicas.split('.') {
        if !slot.is_object() {
            *slot = json!({});
        }
        slot = &mut slot[key];
    }
    *slot = json!(replicas);
    next
}

/// Sets `spec.replicas` through the scale subresource (PUT of an `autoscaling/v1` Scale).
pub fn update_scale(store: &Store, ctx: &Context, name: &str, scale: &Value) -> Result<Outcome, ApiError> {
    let replicas = replicas_from_scale(ctx, name, scale)?;
    let requested_rv = scale["metadata"]["resourceVersion"].as_str().map(str::to_owned);
    let (stored, _) = commit(store, ctx, name, |current| {
        let current = current.ok_or_else(|| ApiError::not_found(&ctx.def, name))?;
        check_resource_version(ctx, current, requested_rv.as_deref())?;
        decide(ctx, current, with_replicas(&ctx.def, current, replicas))
    })?;
    Ok(outcome(stored, Vec::new()))
}

fn apply_patch(
    ctx: &Context,
    patch_type: PatchType,
    kind: &str,
    target: &Value,
    body: &[u8],
) -> Result<Value, ApiError> {
    patch::apply(patch_type, kind, target, body).map_err(|err| match err {
        patch::PatchError::InvalidBody(message) => ApiError::BadRequest(message),
        // A failed JSON patch operation is a 422, as on kube-apiserver; the message names the failed operation and
        // path (kube-apiserver's is the generic "the server rejected our request due to an error in our request").
        patch::PatchError::Failed(message) => ApiError::Invalid(
            crate::error::Subject {
                message,
                name: name_of(target).to_owned(),
                group: ctx.def.group.clone(),
                kind: ctx.def.kind.clone(),
            },
            Vec::new(),
        ),
    })
}

/// Patches an object, its status, or its scale.
pub fn patch(
    store: &Store,
    ctx: &Context,
    name: &str,
    subresource: Option<&str>,
    patch_type: PatchType,
    body: &[u8],
) -> Result<Outcome, ApiError> {
    patch_with(store, ctx, name, subresource, |kind, target| {
        apply_patch(ctx, patch_type, kind, target, body)
    })
}

/// Patches an object, its status, or its scale with `make`, which turns the target (of this kind: the object's, or
/// `Scale`) into the patched one; the result is validated and stored as any patch is.
pub(crate) fn patch_with(
    store: &Store,
    ctx: &Context,
    name: &str,
    subresource: Option<&str>,
    make: impl Fn(&str, &Value) -> Result<Value, ApiError>,
) -> Result<Outcome, ApiError> {
    let mut warnings = Vec::new();
    let (stored, _) = commit(store, ctx, name, |current| {
        let current = current.ok_or_else(|| ApiError::not_found(&ctx.def, name))?;
        let next = match subresource {
            Some("scale") => {
                let scale = make("Scale", &scale_of(&ctx.def, current))?;
                check_resource_version(ctx, current, scale["metadata"]["resourceVersion"].as_str())?;
                with_replicas(&ctx.def, current, replicas_from_scale(ctx, name, &scale)?)
            }
            Some(_) => {
                let mut patched = make(&ctx.def.kind, current)?;
                check_resource_version(ctx, current, patched["metadata"]["resourceVersion"].as_str())?;
                validate_fields(ctx, &mut patched, &mut warnings)?;
                let mut next = (**current).clone();
                meta_mut(&mut next).remove("resourceVersion");
                copy_status(&patched, &mut next);
                next
            }
            None => {
                let mut patched = make(&ctx.def.kind, current)?;
                check_resource_version(ctx, current, patched["metadata"]["resourceVersion"].as_str())?;
                validate_meta(ctx, &patched)?;
                validate_fields(ctx, &mut patched, &mut warnings)?;
                crate::secret_data::check_patched(&ctx.def, &patched)?;
                fold_string_data(ctx, &mut patched);
                check_immutable(ctx, current, &patched)?;
                keep_server_fields(&ctx.def, current, &mut patched, true);
                crate::admission::admit(ctx, Some(current), &patched)?;
                patched
            }
        };
        decide(ctx, current, next)
    })?;
    Ok(outcome(stored, warnings))
}

/// The options of a deletion, from the body (DeleteOptions) and the query.
#[derive(Debug, Default)]
pub struct DeleteOptions {
    /// Only delete when the object has this uid.
    pub uid: Option<String>,
    /// Only delete when the object has this resourceVersion.
    pub resource_version: Option<String>,
    /// `Orphan`, `Background` or `Foreground`: the garbage collector's finalizers the deletion sets (crate::gc).
    pub propagation_policy: Option<String>,
    /// Seconds a pod is given to terminate (`gracePeriodSeconds`); the pod's own default when absent.
    pub grace_period_seconds: Option<i64>,
    /// `dryRun: ["All"]` in the body (kubectl and kube-rs send it there) or `dryRun=All` in the query.
    pub dry_run: bool,
}

impl DeleteOptions {
    /// Reads the options; an empty body means none.
    pub fn parse(body: &[u8], query: &crate::rest::Query) -> Result<Self, ApiError> {
        let value: Value = if body.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice(body)
                .map_err(|err| ApiError::BadRequest(format!("error decoding DeleteOptions: {err}")))?
        };
        let policy = value["propagationPolicy"]
            .as_str()
            .or(query.get("propagationPolicy"))
            .map(str::to_owned);
        if let Some(policy) = &policy
            && !matches!(policy.as_str(), "Orphan" | "Background" | "Foreground")
        {
            return Err(ApiError::BadRequest(format!(
                "propagationPolicy {policy:?} is not supported: use Orphan, Background or Foreground"
            )));
        }
        let grace = match value.get("gracePeriodSeconds").filter(|v| !v.is_null()) {
            Some(v) => Some(
                v.as_i64()
                    .ok_or_else(|| ApiError::BadRequest("gracePeriodSeconds must be an integer".into()))?,
            ),
            None => match query.get("gracePeriodSeconds") {
                Some(text) => Some(text.parse::<i64>().map_err(|_| {
                    ApiError::BadRequest(format!("gracePeriodSeconds {text:?} must be an integer"))
                })?),
                None => None,
            },
        };
        if grace.is_some_and(|g| g < 0) {
            return Err(ApiError::BadRequest(
                "gracePeriodSeconds must be greater than or equal to 0".into(),
            ));
        }
        let mut dry_run = crate::options::check_dry_run("DeleteOptions", query)?;
        match &value["dryRun"] {
            Value::Null => {}
            Value::Array(values) => {
                for value in values {
                    let text = value.as_str().unwrap_or_default();
                    dry_run |= crate::options::dry_run_value("DeleteOptions", text)?;
                }
            }
            _ => {
                return Err(ApiError::BadRequest(
                    "error decoding DeleteOptions: dryRun must be a list".into(),
                ));
            }
        }
        Ok(Self {
            dry_run,
            grace_period_seconds: grace,
            uid: value["preconditions"]["uid"].as_str().map(str::to_owned),
            resource_version: value["preconditions"]["resourceVersion"]
                .as_str()
                .map(str::to_owned),
            propagation_policy: policy,
        })
    }
}

const UNDELETABLE_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

/// Deletes an object: at once when it has no finalizers, otherwise by setting `deletionTimestamp`; the object
/// disappears when its last finalizer is removed. Namespaces turn Terminating and are emptied in the background.
pub fn delete(
    store: &Store,
    ctx: &Context,
    name: &str,
    options: &DeleteOptions,
) -> Result<Deleted, ApiError> {
    if ctx.def.kind == "Namespace" && UNDELETABLE_NAMESPACES.contains(&name) {
        return Err(ApiError::Forbidden(format!(
            "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
        )));
    }
    let (stored, event) = commit(store, ctx, name, |current| {
        let current = current.ok_or_else(|| ApiError::not_found(&ctx.def, name))?;
        let meta = &current["metadata"];
        if let Some(uid) = &options.uid
            && meta["uid"].as_str() != Some(uid.as_str())
        {
            return Err(ApiError::conflict(
                &ctx.def,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta["uid"].as_str().unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &options.resource_version
            && meta["resourceVersion"].as_str() != Some(rv.as_str())
        {
            return Err(ApiError::conflict(
                &ctx.def,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta["resourceVersion"].as_str().unwrap_or_default()
                ),
            ));
        }
        let mut next = (**current).clone();
        meta_mut(&mut next).remove("resourceVersion");
        crate::gc::apply_propagation_policy(&mut next, options.propagation_policy.as_deref());
        if ctx.def.kind == "Namespace" {
            if is_deleting(current) {
                return Ok(Mutation::Unchanged);
            }
            meta_mut(&mut next).insert("deletionTimestamp".into(), json!(timestamp(ctx.now)));
            next["status"] = json!({ "phase": "Terminating" });
            return Ok(Mutation::Put(next));
        }
        if ctx.def.kind == "Pod"
            && let Some(graceful) = crate::pods::graceful_deletion(current, next.clone(), options, ctx.now)
        {
            return Ok(graceful);
        }
        if crate::crd::is_crd(&ctx.def) && !is_deleting(current) {
            // Its objects are deleted before it goes (crate::crd::sync).
            crate::crd::add_cleanup_finalizer(&mut next);
        }
        if finalizers(&next).is_empty() {
            return Ok(Mutation::Delete(next));
        }
        if is_deleting(current) {
            // Only the garbage collector's finalizers change on an object being deleted.
            let same = finalizers(&next) == finalizers(current);
            return Ok(if same {
                Mutation::Unchanged
            } else {
                Mutation::Put(next)
            });
        }
        let meta = meta_mut(&mut next);
        meta.insert("deletionTimestamp".into(), json!(timestamp(ctx.now)));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        if ctx.def.generation {
            let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
            meta.insert("generation".into(), json!(generation + 1));
        }
        Ok(Mutation::Put(next))
    })?;
    let object = stored.map(|o| (*o).clone()).unwrap_or_default();
    Ok(if event == Some(EventType::Deleted) {
        Deleted::Gone(object)
    } else {
        Deleted::Marked(object)
    })
}

/// Empties namespaces that are being deleted and removes them once empty, as kube-controller-manager's namespace
/// controller does. Called periodically by the server.
pub fn finalize_namespaces(store: &Store, registry: &Registry, now: jiff::Timestamp) {
    let (namespaces, _) = store.list("/namespaces", None);
    for namespace in namespaces.iter().filter(|ns| is_deleting(ns)) {
        let ns_name = name_of(namespace).to_owned();
        for def in registry.stored().iter().filter(|d| d.namespaced) {
            let ctx = Context {
                def: Arc::clone(def),
                namespace: ns_name.clone(),
                now,
                field_validation: FieldValidation::Ignore,
                admission: false,
                manager: None,
                dry_run: false,
            };
            let (items, _) = store.list(&resource_id(def), Some(&ns_name));
            for item in items {
                if let Err(err) = delete(store, &ctx, name_of(&item), &DeleteOptions::default()) {
                    tracing::debug!(namespace = %ns_name, error = %err, "namespace cleanup could not delete an object");
                }
            }
        }
        if store.namespace_is_empty(&ns_name) {
            let result = store.mutate("/namespaces", "", &ns_name, |current| match current {
                Some(current) if finalizers(current).is_empty() => Ok(Mutation::Delete((**current).clone())),
                _ => Ok(Mutation::Unchanged),
            });
            if let Err(err) = result {
                tracing::warn!(namespace = %ns_name, error = %err, "could not remove an emptied namespace");
            }
        }
    }
}

/// Creates the namespaces every cluster has (`default`, `kube-system`, `kube-public`, `kube-node-lease`) when they
/// are missing.
pub fn ensure_default_namespaces(store: &Store, registry: &Registry) -> Result<(), ApiError> {
    let def = registry
        .find("", "v1", "namespaces")
        .ok_or_else(|| ApiError::Internal("namespaces are not served".into()))?;
    let ctx = Context {
        def,
        namespace: String::new(),
        now: jiff::Timestamp::now(),
        field_validation: FieldValidation::Strict,
        admission: false,
        manager: None,
        dry_run: false,
    };
    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        if store.get("/namespaces", "", name).is_none() {
            create(store, &ctx, json!({ "metadata": { "name": name } }))?;
        }
    }
    Ok(())
}
