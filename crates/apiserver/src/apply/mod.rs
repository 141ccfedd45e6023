//! Server-side apply (`PATCH` with `application/apply-patch+yaml`) and the `metadata.managedFields` every write
//! records, following sigs.k8s.io/structured-merge-diff and kube-apiserver's field manager.
//!
//! - [`fieldset`]: field paths and their `FieldsV1` form.
//! - [`shape`]: how each map and list merges (schema list types, strategic merge keys for built-ins).
//! - [`merge`]: the fields an object sets, merging a configuration into the live object, comparing two objects.
//! - [`managed`]: the managedFields entries and how a write moves ownership (conflicts included).
//!
//! Every write names a manager ([`Manager`], from `fieldManager` or the User-Agent); [`record`] updates the
//! object's managedFields from what the write changed. An apply ([`patch`]) merges its configuration into the live
//! object (or creates it), removes the fields its manager applied last time and no longer applies when no one else
//! owns them, and goes through the same validation, admission and storage as any other patch.

pub mod fieldset;
pub mod managed;
pub mod merge;
pub mod shape;

use serde_json::{Value, json};

use crate::{
    error::{ApiError, Cause},
    objects::{self, Context, Outcome},
    registry::ResourceDef,
    store::Store,
};
use fieldset::{Element, FieldSet};
use managed::{Conflict, Entry, Operation, Write};
use shape::Shape;

/// The Content-Type of an apply patch.
pub const APPLY_PATCH_YAML: &str = "application/apply-patch+yaml";

/// Whether a PATCH Content-Type is an apply patch (parameters ignored).
pub fn is_apply(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|media| media.trim().eq_ignore_ascii_case(APPLY_PATCH_YAML))
}

/// 422 for `force` on a patch that is not an apply, as kube-apiserver answers it.
pub fn check_no_force(query: &crate::rest::Query) -> Result<(), ApiError> {
    if query.get("force").is_none() {
        return Ok(());
    }
    Err(ApiError::invalid_kind(
        "meta.k8s.io",
        "PatchOptions",
        "",
        vec![Cause {
            reason: "FieldValueForbidden",
            message: "Forbidden: may not be specified for non-apply patch".into(),
            field: "force".into(),
        }],
    ))
}

/// Who makes a write, as `managedFields` records it.
#[derive(Clone, Debug)]
pub struct Manager {
    /// The field manager: `fieldManager`, or the User-Agent up to its first `/` when the request names none.
    pub name: String,
    /// The subresource written (`status`, `scale`), if any.
    pub subresource: Option<String>,
    /// Set for server-side apply: the fields of the configuration and whether conflicts are forced.
    pub applied: Option<Applied>,
}

impl Manager {
    /// The manager of a request: `fieldManager`, else the User-Agent's product (`kubectl/v1.32.0 ...` →
    /// `kubectl`), as kube-apiserver defaults it. None when neither is given.
    pub fn of_request(
        field_manager: Option<&str>,
        user_agent: Option<&str>,
        subresource: Option<&str>,
    ) -> Option<Self> {
        let name = field_manager
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
            .or_else(|| {
                user_agent
                    .and_then(|ua| ua.split('/').next())
                    .map(|product| product.chars().take(128).collect::<String>())
                    .filter(|product| !product.is_empty())
            })?;
        Some(Self {
            name,
            subresource: subresource.map(str::to_owned),
            applied: None,
        })
    }
}

/// The configuration of an apply.
#[derive(Clone, Debug)]
pub struct Applied {
    /// The fields the configuration sets.
    pub fields: FieldSet,
    /// `force=true`: conflicting fields are taken from their owners.
    pub force: bool,
}

/// Metadata fields no manager owns (kube-apiserver strips them from every field set).
const UNOWNED_METADATA: [&str; 9] = [
    "name",
    "namespace",
    "creationTimestamp",
    "selfLink",
    "uid",
    "generation",
    "managedFields",
    "resourceVersion",
    "clusterName",
];

/// Whether a write through `subresource` can own the field at `path`: never `apiVersion`, `kind` or the
/// server's metadata; only `status` through the status subresource, and never `status` through the main
/// resource when status is a subresource.
fn tracked(def: &ResourceDef, subresource: Option<&str>, path: &[Element]) -> bool {
    let field = |i: usize| match path.get(i) {
        Some(Element::Field(name)) => Some(name.as_str()),
        _ => None,
    };
    match field(0) {
        Some("apiVersion" | "kind") => false,
        Some("metadata") if field(1).is_some_and(|f| UNOWNED_METADATA.contains(&f)) => false,
        Some("status") => subresource == Some("status") || !def.status_subresource,
        _ => subresource != Some("status"),
    }
}

/// The merge shape of the objects of a resource.
fn shape_of(def: &ResourceDef) -> Shape<'_> {
    Shape::root(def.schema(), (!def.custom).then_some(def.kind.as_str()))
}

/// Sets `next`'s managedFields for the write `ctx` describes, from what changed since `current` (None on create):
/// 409 when an unforced apply changes fields other managers own. Writes without a manager (the server's own) keep
/// the current entries.
pub fn record(ctx: &Context, current: Option<&Value>, next: &mut Value) -> Result<(), ApiError> {
    let sent = sent_entries(next);
    let Some(manager) = ctx.manager.as_ref() else {
        let kept = match sent {
            Some(sent) => Some(managed::write(&sent)),
            None => current.map(|c| c["metadata"]["managedFields"].clone()),
        };
        set_entries(next, kept);
        return Ok(());
    };
    let subresource = manager.subresource.as_deref();
    let keep = |path: &[Element]| tracked(&ctx.def, subresource, path);
    let empty = json!({});
    let mut comparison = merge::compare(current.unwrap_or(&empty), next, &shape_of(&ctx.def));
    comparison.added = comparison.added.filter(keep);
    comparison.modified = comparison.modified.filter(keep);
    comparison.removed = comparison.removed.filter(keep);
    let entries = match (&manager.applied, sent) {
        (None, Some(sent)) => sent,
        _ => current.map(managed::read).unwrap_or_default(),
    };
    let write = Write {
        writer: Entry {
            manager: manager.name.clone(),
            operation: if manager.applied.is_some() {
                Operation::Apply
            } else {
                Operation::Update
            },
            api_version: ctx.def.api_version(),
            time: objects::timestamp(ctx.now),
            subresource: manager.subresource.clone(),
            fields: FieldSet::new(),
        },
        applied: manager.applied.as_ref().map(|a| (&a.fields, a.force)),
    };
    let entries = match managed::after_write(entries.clone(), write.clone(), &comparison) {
        Ok(entries) => entries,
        Err(conflicts) => {
            let allowed = current.and_then(|live| taken_from_client_side_apply(ctx, manager, live));
            let all_allowed =
                allowed.is_some_and(|allowed| conflicts.iter().all(|c| allowed.contains(&c.path)));
            if !all_allowed {
                return Err(conflict_error(&conflicts));
            }
            let forced = Write {
                applied: write.applied.map(|(fields, _)| (fields, true)),
                ..write
            };
            managed::after_write(entries, forced, &comparison).map_err(|c| conflict_error(&c))?
        }
    };
    set_entries(next, Some(managed::write(&entries)));
    Ok(())
}

/// The manager kubectl uses for `apply --server-side`, the only one that takes over client-side apply's fields.
const KUBECTL_MANAGER: &str = "kubectl";
/// The annotation client-side apply keeps its last applied configuration in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The fields `kubectl apply --server-side` may take without a conflict, as kube-apiserver's last-applied manager
/// allows them: those of the object's client-side last-applied configuration whose value is still the live one.
/// None for any other manager or an object without that annotation.
fn taken_from_client_side_apply(ctx: &Context, manager: &Manager, live: &Value) -> Option<FieldSet> {
    if manager.name != KUBECTL_MANAGER || manager.applied.is_none() {
        return None;
    }
    let last_applied: Value =
        serde_json::from_str(live["metadata"]["annotations"][LAST_APPLIED].as_str()?).ok()?;
    let shape = shape_of(&ctx.def);
    let fields = merge::fields_of(&last_applied, &shape).ok()?;
    let changed_since = merge::compare(&last_applied, live, &shape).modified;
    Some(fields.difference(&changed_since))
}

/// The managedFields a non-apply write sets itself, as kube-apiserver honours them (kubectl rewrites them when it
/// moves client-side apply ownership to server-side apply): `[{}]` clears them; a list whose every entry can be
/// read replaces them. None when the write leaves them as they are (none sent, an empty list, or unreadable ones).
fn sent_entries(next: &Value) -> Option<Vec<Entry>> {
    let sent = next["metadata"]["managedFields"].as_array()?;
    if !sent.is_empty()
        && sent
            .iter()
            .all(|e| e.as_object().is_some_and(serde_json::Map::is_empty))
    {
        return Some(Vec::new());
    }
    let entries = managed::read(next);
    (!sent.is_empty() && entries.len() == sent.len()).then_some(entries)
}

/// Puts the entries on the object, or removes managedFields when there are none.
fn set_entries(object: &mut Value, entries: Option<Value>) {
    let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    match entries.filter(|e| e.as_array().is_some_and(|list| !list.is_empty())) {
        Some(entries) => {
            meta.insert("managedFields".into(), entries);
        }
        None => {
            meta.remove("managedFields");
        }
    }
}

/// The 409 of conflicting applies, worded as kube-apiserver words it: one cause per field, named by its manager.
fn conflict_error(conflicts: &[Conflict]) -> ApiError {
    let message = if let [one] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            one.manager, one.field
        )
    } else {
        let mut managers: Vec<&str> = conflicts.iter().map(|c| c.manager.as_str()).collect();
        managers.sort_unstable();
        managers.dedup();
        let mut lines = Vec::new();
        for manager in managers {
            lines.push(format!("conflicts with {manager}:"));
            for conflict in conflicts.iter().filter(|c| c.manager == manager) {
                lines.push(format!("- {}", conflict.field));
            }
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let causes = conflicts
        .iter()
        .map(|c| Cause {
            reason: "FieldManagerConflict",
            message: format!("conflict with {}", c.manager),
            field: c.field.clone(),
        })
        .collect();
    ApiError::ApplyConflict(message, causes)
}

/// Serves an apply patch: creates the object when it does not exist (the bool is true then), otherwise merges the
/// configuration into it. `field_manager` is required; `force` takes conflicting fields from their managers.
pub fn patch(
    store: &Store,
    ctx: &Context,
    name: &str,
    subresource: Option<&str>,
    body: &[u8],
    field_manager: Option<&str>,
    force: bool,
) -> Result<(Outcome, bool), ApiError> {
    let Some(field_manager) = field_manager.filter(|m| !m.is_empty()) else {
        return Err(ApiError::invalid_kind(
            "meta.k8s.io",
            "PatchOptions",
            "",
            vec![Cause {
                reason: "FieldValueRequired",
                message: "Required value: is required for apply patch".into(),
                field: "fieldManager".into(),
            }],
        ));
    };
    if subresource.is_some_and(|sub| sub != "status") {
        return Err(ApiError::UnsupportedMediaType(format!(
            "server-side apply to the {} subresource is not supported by this server; apply to the resource",
            subresource.unwrap_or_default()
        )));
    }
    let config = configuration(ctx, name, subresource, body)?;
    let shape = shape_of(&ctx.def);
    let fields = merge::fields_of(&config, &shape)
        .map_err(|reason| {
            ApiError::invalid(
                &ctx.def,
                name,
                vec![Cause {
                    reason: "FieldValueInvalid",
                    message: format!("Invalid value: {reason}"),
                    field: "<apply configuration>".into(),
                }],
            )
        })?
        .filter(|path| tracked(&ctx.def, subresource, path));
    let mut ctx = ctx.clone();
    ctx.manager = Some(Manager {
        name: field_manager.to_owned(),
        subresource: subresource.map(str::to_owned),
        applied: Some(Applied { fields, force }),
    });
    let exists = store
        .get(&objects::resource_id(&ctx.def), &ctx.namespace, name)
        .is_some();
    if !exists {
        if subresource.is_some() {
            return Err(ApiError::not_found(&ctx.def, name));
        }
        return objects::create(store, &ctx, config).map(|outcome| (outcome, true));
    }
    let outcome = objects::patch_with(store, &ctx, name, subresource, |_, current| {
        let mut merged = current.clone();
        if let Some(meta) = merged.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
        let mut merged = merge::merge(&merged, &config, &shape);
        prune(&ctx, current, &mut merged);
        Ok(merged)
    })?;
    Ok((outcome, false))
}

/// Removes from `merged` the fields the applier applied last time and applies no longer, unless another manager
/// owns them (or fields below them).
fn prune(ctx: &Context, current: &Value, merged: &mut Value) {
    let Some(Manager {
        name,
        subresource,
        applied: Some(applied),
    }) = ctx.manager.as_ref()
    else {
        return;
    };
    let entries = managed::read(current);
    let is_applier = |entry: &Entry| {
        entry.manager == *name && entry.operation == Operation::Apply && entry.subresource == *subresource
    };
    let Some(last) = entries.iter().find(|e| is_applier(e)) else {
        return;
    };
    for path in last.fields.difference(&applied.fields).iter() {
        let owned_elsewhere = entries
            .iter()
            .any(|e| !is_applier(e) && e.fields.has_prefix(path));
        if !owned_elsewhere {
            merge::remove(merged, path);
        }
    }
}

/// The configuration of an apply body (YAML or JSON): an object of this resource's apiVersion and kind, named
/// as the URL names it, without managedFields; nulls dropped, and reduced to what the subresource writes.
fn configuration(
    ctx: &Context,
    name: &str,
    subresource: Option<&str>,
    body: &[u8],
) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::BadRequest("the apply configuration is not UTF-8 text".into()))?;
    // The parser's message may quote the body, which may hold a secret: only say where it failed.
    let mut config: Value = serde_saphyr::from_str(text).map_err(|_| {
        ApiError::BadRequest(
            "error decoding the apply configuration: it is neither valid YAML nor JSON".into(),
        )
    })?;
    if !config.is_object() {
        return Err(ApiError::BadRequest(
            "the apply configuration must be an object (a map), with apiVersion, kind and metadata.name"
                .into(),
        ));
    }
    for field in ["apiVersion", "kind"] {
        if config[field].as_str().is_none_or(str::is_empty) {
            return Err(ApiError::BadRequest(format!(
                "the apply configuration has no {field}: it must be set (to {:?})",
                if field == "kind" {
                    ctx.def.kind.clone()
                } else {
                    ctx.def.api_version()
                }
            )));
        }
    }
    crate::metadata::check_type_meta(&ctx.def, &config)?;
    merge::drop_nulls(&mut config);
    if !config["metadata"].is_object() {
        config["metadata"] = json!({});
    }
    let meta = &mut config["metadata"];
    if meta.get("managedFields").is_some() {
        return Err(ApiError::BadRequest(
            "metadata.managedFields must be nil in an apply configuration".into(),
        ));
    }
    match meta["name"].as_str() {
        Some(body_name) if body_name != name => {
            return Err(ApiError::BadRequest(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        _ => meta["name"] = json!(name),
    }
    if ctx.def.namespaced {
        match meta["namespace"].as_str() {
            Some(ns) if ns != ctx.namespace => {
                return Err(ApiError::BadRequest(
                    "the namespace of the provided object does not match the namespace sent on the request"
                        .into(),
                ));
            }
            _ => meta["namespace"] = json!(ctx.namespace),
        }
    }
    if let Some(object) = config.as_object_mut() {
        if subresource == Some("status") {
            object.retain(|key, _| matches!(key.as_str(), "apiVersion" | "kind" | "metadata" | "status"));
            if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.retain(|key, _| matches!(key.as_str(), "name" | "namespace"));
            }
        } else if ctx.def.status_subresource {
            object.remove("status");
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conflict(manager: &str, field: &str) -> Conflict {
        Conflict {
            manager: manager.into(),
            path: Vec::new(),
            field: field.into(),
        }
    }

    #[test]
    fn several_conflicts_are_listed_by_manager_as_kube_apiserver_lists_them() {
        let err = conflict_error(&[
            conflict("\"b\"", ".spec.replicas"),
            conflict("\"a\" using v1", ".data.x"),
            conflict("\"b\"", ".spec.paused"),
        ]);
        assert_eq!(
            err.to_string(),
            "Apply failed with 3 conflicts: conflicts with \"a\" using v1:\n- .data.x\nconflicts with \"b\":\n- \
             .spec.replicas\n- .spec.paused"
        );
        let status = err.to_status();
        assert_eq!(status["code"], 409);
        assert_eq!(status["reason"], "Conflict");
        assert_eq!(status["details"]["causes"][0]["reason"], "FieldManagerConflict");
        assert_eq!(status["details"]["causes"][0]["message"], "conflict with \"b\"");
        assert_eq!(status["details"]["causes"][0]["field"], ".spec.replicas");
    }

    #[test]
    fn the_manager_defaults_to_the_user_agent_product() {
        let manager = Manager::of_request(
            None,
            Some("kubectl/v1.32.0 (linux/amd64) kubernetes/abc"),
            Some("scale"),
        )
        .expect("a manager");
        assert_eq!(manager.name, "kubectl");
        assert_eq!(manager.subresource.as_deref(), Some("scale"));
        assert_eq!(
            Manager::of_request(Some("flux"), Some("kubectl/v1"), None).map(|m| m.name),
            Some("flux".into())
        );
        assert!(Manager::of_request(None, None, None).is_none());
    }
}
