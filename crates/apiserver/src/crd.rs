//! CustomResourceDefinitions (`apiextensions.k8s.io/v1`): what the apiextensions server does besides storing them.
//!
//! - **Defaults and validation** on every write ([`set_defaults`], [`validate`]): `metadata.name` is
//!   `<plural>.<group>`, the group has a dot, the scope is `Namespaced` or `Cluster`, there is at least one version
//!   and exactly one storage version, every served version has a schema, the names are DNS labels. `listKind`
//!   defaults to `<Kind>List`, `singular` to the lower-case kind, the conversion strategy to `None`.
//! - **Status**: `NamesAccepted` and `Established` True, `acceptedNames`, `storedVersions` ([`status`]);
//!   `Terminating` while it is deleted.
//! - **Serving** ([`sync`]): every served version of every CRD that is not being deleted becomes a
//!   [`ResourceDef`] of the [`SharedRegistry`]; the machine kinds too, from the CRDs the server pre-installs
//!   ([`crate::preinstalled`]). A CRD for a built-in resource (`pods`) is stored and established, and the built-in
//!   serving stays as it is.
//! - **Deletion**: a deleted CRD gets the finalizer [`CLEANUP_FINALIZER`]; its objects are deleted (their own
//!   finalizers are not waited for), then the finalizer goes and the CRD with it. The objects of a built-in
//!   resource are left alone.
//!
//! Not served: conversion webhooks (every version is served from the one stored object, only `apiVersion` changes,
//! as with strategy `None`), CEL rules (`x-kubernetes-validations`), the uniqueness that `x-kubernetes-list-type`
//! `set`/`map` demands (server-side apply merges by these markers, [`crate::apply`], but a duplicate is not refused),
//! formats and numeric or string bounds, name conflicts between CRDs (`NamesAccepted` is always True).

use std::{
    cmp::Reverse,
    sync::{Arc, Mutex},
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use serde_json::{Value, json};

use crate::{
    error::Cause,
    metadata::is_deleting,
    objects::timestamp,
    registry::{Column, ResourceDef, ScalePaths, SharedRegistry},
    store::{Mutation, Store},
};

/// The API group of CustomResourceDefinitions.
pub const GROUP: &str = "apiextensions.k8s.io";
/// The served version of CustomResourceDefinitions.
pub const VERSION: &str = "v1";
/// The resource name of CustomResourceDefinitions.
pub const PLURAL: &str = "customresourcedefinitions";
/// The finalizer a deleted CRD carries while its objects are deleted.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// The store key of CustomResourceDefinitions (`group/plural`, as [`crate::objects::resource_id`] makes it).
pub fn store_key() -> String {
    format!("{GROUP}/{PLURAL}")
}

/// True for the CustomResourceDefinition resource itself.
pub fn is_crd(def: &ResourceDef) -> bool {
    def.group == GROUP && def.plural == PLURAL
}

/// The schema of a CustomResourceDefinition, as far as this server checks it: the fields it reads are typed,
/// version schemas, subresources and conversion are kept as they come.
pub fn schema() -> Value {
    let string = json!({ "type": "string" });
    let strings = json!({ "type": "array", "items": { "type": "string" } });
    let free = json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true });
    let names = json!({
        "type": "object",
        "required": ["plural", "kind"],
        "properties": {
            "plural": string, "singular": string, "kind": string, "listKind": string,
            "shortNames": strings, "categories": strings,
        },
    });
    let column = json!({
        "type": "object",
        "required": ["name", "type", "jsonPath"],
        "properties": {
            "name": string, "type": string, "format": string, "description": string,
            "priority": { "type": "integer" }, "jsonPath": string,
        },
    });
    let version = json!({
        "type": "object",
        "required": ["name", "served", "storage"],
        "properties": {
            "name": string,
            "served": { "type": "boolean" },
            "storage": { "type": "boolean" },
            "deprecated": { "type": "boolean" },
            "deprecationWarning": string,
            "schema": {
                "type": "object",
                "properties": { "openAPIV3Schema": free },
            },
            "subresources": free,
            "additionalPrinterColumns": { "type": "array", "items": column },
            "selectableFields": {
                "type": "array",
                "items": { "type": "object", "required": ["jsonPath"], "properties": { "jsonPath": string } },
            },
        },
    });
    json!({
        "type": "object",
        "properties": {
            "apiVersion": string,
            "kind": string,
            "metadata": { "type": "object" },
            "spec": {
                "type": "object",
                "required": ["group", "names", "scope", "versions"],
                "properties": {
                    "group": string,
                    "names": names,
                    "scope": string,
                    "versions": { "type": "array", "items": version },
                    "conversion": free,
                    "preserveUnknownFields": { "type": "boolean" },
                },
            },
            "status": free,
        },
    })
}

/// Fills what the apiextensions server defaults: `names.singular` (the lower-case kind), `names.listKind`
/// (`<Kind>List`) and `conversion.strategy` (`None`).
pub fn set_defaults(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut)
        && let Some(kind) = names
            .get("kind")
            .and_then(Value::as_str)
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
    {
        let empty = |v: Option<&Value>| v.and_then(Value::as_str).is_none_or(str::is_empty);
        if empty(names.get("singular")) {
            names.insert("singular".into(), json!(kind.to_ascii_lowercase()));
        }
        if empty(names.get("listKind")) {
            names.insert("listKind".into(), json!(format!("{kind}List")));
        }
    }
    let conversion = spec.entry("conversion").or_insert_with(|| json!({}));
    if let Some(conversion) = conversion.as_object_mut() {
        conversion.entry("strategy").or_insert_with(|| json!("None"));
    }
}

fn cause(reason: &'static str, field: &str, message: String) -> Cause {
    Cause {
        reason,
        message,
        field: field.to_owned(),
    }
}

fn invalid(field: &str, value: &str, why: &str) -> Cause {
    cause(
        "FieldValueInvalid",
        field,
        format!("Invalid value: \"{value}\": {why}"),
    )
}

/// A DNS-1035-ish label as Kubernetes requires of resource names and version names: lower-case alphanumerics and
/// `-`, starting with a letter (versions) or alphanumeric, at most 63 characters.
fn is_dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

/// The semantic checks of a CRD beyond its schema (which already reported missing and mistyped fields), as 422
/// causes naming the field.
pub fn validate(object: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = &object["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let plural = spec["names"]["plural"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        causes.push(invalid(
            "metadata.name",
            name,
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if spec["group"].is_string() && !group.contains('.') {
        causes.push(invalid(
            "spec.group",
            group,
            "should be a domain with at least one dot",
        ));
    }
    if let Some(scope) = spec["scope"].as_str()
        && !matches!(scope, "Namespaced" | "Cluster")
    {
        causes.push(cause(
            "FieldValueNotSupported",
            "spec.scope",
            format!("Unsupported value: \"{scope}\": supported values: \"Cluster\", \"Namespaced\""),
        ));
    }
    validate_names(&spec["names"], &mut causes);
    if let Some(versions) = spec["versions"].as_array() {
        validate_versions(
            versions,
            spec["preserveUnknownFields"] == json!(true),
            &mut causes,
        );
    }
    causes
}

fn validate_names(names: &Value, causes: &mut Vec<Cause>) {
    for field in ["plural", "singular"] {
        if let Some(text) = names[field]
            .as_str()
            .filter(|t| !t.is_empty() || field == "plural")
            && !is_dns_label(text)
        {
            causes.push(invalid(
                &format!("spec.names.{field}"),
                text,
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
            ));
        }
    }
    if names["kind"].as_str() == Some("") {
        causes.push(cause(
            "FieldValueRequired",
            "spec.names.kind",
            "Required value".into(),
        ));
    }
    if let Some(short) = names["shortNames"].as_array() {
        for (i, text) in short.iter().filter_map(Value::as_str).enumerate() {
            if !is_dns_label(text) {
                causes.push(invalid(
                    &format!("spec.names.shortNames[{i}]"),
                    text,
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
                ));
            }
        }
    }
}

fn validate_versions(versions: &[Value], preserve_unknown: bool, causes: &mut Vec<Cause>) {
    if versions.is_empty() {
        causes.push(cause(
            "FieldValueRequired",
            "spec.versions",
            "Required value: must have exactly one version marked as storage version".into(),
        ));
        return;
    }
    let storage = versions.iter().filter(|v| v["storage"] == json!(true)).count();
    if storage != 1 {
        causes.push(invalid(
            "spec.versions",
            &storage.to_string(),
            "must have exactly one version marked as storage version",
        ));
    }
    let mut seen = Vec::new();
    for (i, version) in versions.iter().enumerate() {
        let name = version["name"].as_str().unwrap_or_default();
        if !is_dns_label(name) || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
            causes.push(invalid(
                &format!("spec.versions[{i}].name"),
                name,
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', and must start \
                 with an alphabetic character",
            ));
        }
        if seen.contains(&name) {
            causes.push(cause(
                "FieldValueDuplicate",
                &format!("spec.versions[{i}].name"),
                format!("Duplicate value: \"{name}\""),
            ));
        }
        seen.push(name);
        let has_schema = version["schema"]["openAPIV3Schema"].is_object();
        if version["served"] == json!(true) && !has_schema && !preserve_unknown {
            causes.push(cause(
                "FieldValueRequired",
                &format!("spec.versions[{i}].schema.openAPIV3Schema"),
                "Required value: schemas are required".into(),
            ));
        }
    }
    if versions.iter().all(|v| v["served"] != json!(true)) {
        causes.push(invalid(
            "spec.versions",
            "",
            "must have at least one served version",
        ));
    }
}

fn condition(type_: &str, reason: &str, message: &str, previous: &Value, now: &str) -> Value {
    let same = previous["conditions"]
        .as_array()
        .and_then(|list| list.iter().find(|c| c["type"] == type_))
        .filter(|c| c["status"] == "True");
    let since = same.map_or_else(|| json!(now), |c| c["lastTransitionTime"].clone());
    json!({
        "type": type_,
        "status": "True",
        "lastTransitionTime": since,
        "reason": reason,
        "message": message,
    })
}

/// The status the server keeps on a CRD: `NamesAccepted` and `Established` True (`Terminating` too while it is
/// deleted; other conditions are kept), `acceptedNames` (the names as given), `storedVersions` (every version ever used for storage, the
/// current storage version last added). Transition times of conditions that stay True are kept.
pub fn status(object: &Value, now: jiff::Timestamp) -> Value {
    let previous = &object["status"];
    let now = timestamp(now);
    let mut conditions = vec![
        condition(
            "NamesAccepted",
            "NoConflicts",
            "no conflicts found",
            previous,
            &now,
        ),
        condition(
            "Established",
            "InitialNamesAccepted",
            "the initial names have been accepted",
            previous,
            &now,
        ),
    ];
    if is_deleting(object) {
        conditions.push(condition(
            "Terminating",
            "InstanceDeletionInProgress",
            "CustomResource deletion is in progress",
            previous,
            &now,
        ));
    }
    // Conditions others set (through the status subresource) stay.
    let managed = ["NamesAccepted", "Established", "Terminating"];
    conditions.extend(
        previous["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["type"].as_str().is_none_or(|t| !managed.contains(&t)))
            .cloned(),
    );
    let mut stored: Vec<Value> = previous["storedVersions"].as_array().cloned().unwrap_or_default();
    let storage = object["spec"]["versions"]
        .as_array()
        .and_then(|versions| versions.iter().find(|v| v["storage"] == json!(true)))
        .map(|v| v["name"].clone());
    if let Some(storage) = storage
        && !stored.contains(&storage)
    {
        stored.push(storage);
    }
    json!({
        "conditions": conditions,
        "acceptedNames": object["spec"]["names"],
        "storedVersions": stored,
    })
}

/// Kubernetes' version priority, as a sort key: GA before beta before alpha, higher numbers first, then versions
/// of other forms alphabetically (`v2`, `v1`, `v2beta1`, `v1beta2`, `v1alpha1`, `foo`).
fn version_priority(name: &str) -> (u8, Reverse<u64>, Reverse<u64>, String) {
    let parsed = name.strip_prefix('v').and_then(|rest| {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let major: u64 = rest[..digits].parse().ok()?;
        let tail = &rest[digits..];
        if tail.is_empty() {
            return Some((0, major, 0));
        }
        let (stage, minor) = if let Some(m) = tail.strip_prefix("beta") {
            (1, m)
        } else {
            (2, tail.strip_prefix("alpha")?)
        };
        Some((stage, major, minor.parse().ok()?))
    });
    match parsed {
        Some((stage, major, minor)) => (stage, Reverse(major), Reverse(minor), String::new()),
        None => (3, Reverse(0), Reverse(0), name.to_owned()),
    }
}

/// Strips the leading dot of a CRD JSON path (`.spec.replicas` → `spec.replicas`).
fn field_path(json_path: &str) -> String {
    json_path.trim_start_matches('.').to_owned()
}

/// The schema a served version validates with: its `openAPIV3Schema` (free-form without one), the root
/// `apiVersion`, `kind` and `metadata` always declared (the server owns them: metadata is not pruned here).
fn version_schema(version: &CustomResourceDefinitionVersion) -> Value {
    let mut schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_else(|| json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true }));
    if !schema.is_object() {
        schema = json!({ "type": "object" });
    }
    if !schema["properties"].is_object() {
        schema["properties"] = json!({});
    }
    schema["properties"]["apiVersion"] = json!({ "type": "string" });
    schema["properties"]["kind"] = json!({ "type": "string" });
    schema["properties"]["metadata"] = json!({ "type": "object" });
    schema
}

/// The resources a CRD defines: one per served version, in version priority order (the first is the group's
/// preferred version in discovery). Empty when the object is not a valid CRD.
pub fn resource_defs(object: &Value) -> Vec<ResourceDef> {
    let crd: CustomResourceDefinition = match serde_json::from_value(object.clone()) {
        Ok(crd) => crd,
        Err(err) => {
            tracing::warn!(name = %object["metadata"]["name"], error = %err, "a stored CRD cannot be read; its resource is not served");
            return Vec::new();
        }
    };
    let spec = &crd.spec;
    let names = &spec.names;
    let Some(storage) = spec.versions.iter().find(|v| v.storage) else {
        return Vec::new();
    };
    let mut versions: Vec<&CustomResourceDefinitionVersion> =
        spec.versions.iter().filter(|v| v.served).collect();
    versions.sort_by_key(|v| version_priority(&v.name));
    versions
        .into_iter()
        .map(|version| {
            let mut def = ResourceDef::with_schema(
                &spec.group,
                &version.name,
                &names.kind,
                &names.plural,
                version_schema(version),
            );
            def.storage_version.clone_from(&storage.name);
            def.singular = names
                .singular
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| names.kind.to_ascii_lowercase());
            def.list_kind = names
                .list_kind
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| format!("{}List", names.kind));
            def.short_names = names.short_names.clone().unwrap_or_default();
            def.categories = names.categories.clone().unwrap_or_default();
            def.namespaced = spec.scope == "Namespaced";
            def.generation = true;
            def.custom = true;
            def.has_defaults = crate::defaults::has_defaults(def.schema());
            let subresources = version.subresources.as_ref();
            def.status_subresource = subresources.is_some_and(|s| s.status.is_some());
            if let Some(scale) = subresources.and_then(|s| s.scale.as_ref()) {
                def.scale_subresource = true;
                def.scale_paths = ScalePaths {
                    spec_replicas: field_path(&scale.spec_replicas_path),
                    status_replicas: field_path(&scale.status_replicas_path),
                    label_selector: scale.label_selector_path.as_deref().map(field_path),
                };
            }
            def.selectable_fields = version
                .selectable_fields
                .iter()
                .flatten()
                .map(|f| field_path(&f.json_path))
                .collect();
            def.columns = version
                .additional_printer_columns
                .iter()
                .flatten()
                .map(Column::from)
                .collect();
            def
        })
        .collect()
}

/// Serializes [`sync`] runs (the request path and the background loop both call it).
static SYNC: Mutex<()> = Mutex::new(());

/// Brings everything in line with the stored CRDs, as the apiextensions controllers do: refreshes their status,
/// finishes the deletion of deleted ones (their objects, then the finalizer), and serves the custom resources of
/// the others. Idempotent; called after every CRD write, at start, and on every CRD change in the store.
pub fn sync(store: &Store, registry: &SharedRegistry, now: jiff::Timestamp) {
    let _guard = SYNC.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = store_key();
    let (crds, _) = store.list(&key, None);
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        refresh_status(store, &key, name, now);
        if is_deleting(crd) {
            clean_up(store, registry, &key, crd);
        }
    }
    let (crds, _) = store.list(&key, None);
    let defs: Vec<ResourceDef> = crds
        .iter()
        .filter(|crd| !is_deleting(crd))
        .flat_map(|crd| resource_defs(crd))
        .collect();
    if registry.set_custom(defs) {
        tracing::info!(crds = crds.len(), "served custom resources changed");
    }
}

fn without_rv(object: &Value) -> Value {
    let mut next = object.clone();
    if let Some(meta) = next["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
    }
    next
}

fn refresh_status(store: &Store, key: &str, name: &str, now: jiff::Timestamp) {
    let result = store.mutate(key, "", name, |current| {
        let Some(current) = current else {
            return Ok(Mutation::Unchanged);
        };
        let mut next = without_rv(current);
        next["status"] = status(current, now);
        Ok(if next == without_rv(current) {
            Mutation::Unchanged
        } else {
            Mutation::Put(next)
        })
    });
    if let Err(err) = result {
        tracing::warn!(crd = %name, error = %err, "could not update the status of a CRD");
    }
}

/// Deletes the objects of a deleted CRD (unless its resource is built in), then removes the cleanup finalizer,
/// which lets the CRD go when no other finalizer remains.
fn clean_up(store: &Store, registry: &SharedRegistry, key: &str, crd: &Value) {
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    let group = crd["spec"]["group"].as_str().unwrap_or_default();
    let plural = crd["spec"]["names"]["plural"].as_str().unwrap_or_default();
    if !registry.builtins().serves(group, plural) {
        let resource = format!("{group}/{plural}");
        let (objects, _) = store.list(&resource, None);
        for object in objects {
            let meta = &object["metadata"];
            let namespace = meta["namespace"].as_str().unwrap_or_default();
            let object_name = meta["name"].as_str().unwrap_or_default();
            let result = store.mutate(&resource, namespace, object_name, |current| {
                Ok(current.map_or(Mutation::Unchanged, |c| Mutation::Delete(without_rv(c))))
            });
            if let Err(err) = result {
                tracing::warn!(crd = %name, object = %object_name, error = %err, "could not delete a custom resource");
                return;
            }
        }
    }
    let result = store.mutate(key, "", name, |current| {
        let Some(current) = current else {
            return Ok(Mutation::Unchanged);
        };
        let mut next = without_rv(current);
        let Some(finalizers) = next["metadata"]["finalizers"].as_array_mut() else {
            return Ok(Mutation::Unchanged);
        };
        let before = finalizers.len();
        finalizers.retain(|f| f != CLEANUP_FINALIZER);
        if finalizers.len() == before {
            return Ok(Mutation::Unchanged);
        }
        Ok(if finalizers.is_empty() {
            Mutation::Delete(next)
        } else {
            Mutation::Put(next)
        })
    });
    if let Err(err) = result {
        tracing::warn!(crd = %name, error = %err, "could not remove the cleanup finalizer of a CRD");
    }
}

/// Adds the cleanup finalizer to a CRD about to be marked for deletion (the apiextensions server does this in its
/// DELETE), so that its objects are deleted before it goes.
pub fn add_cleanup_finalizer(object: &mut Value) {
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    let finalizers = &mut object["metadata"]["finalizers"];
    if !finalizers.is_array() {
        *finalizers = json!([]);
    }
    if let Some(list) = finalizers.as_array_mut()
        && !list.iter().any(|f| f == CLEANUP_FINALIZER)
    {
        list.push(json!(CLEANUP_FINALIZER));
    }
}

/// Runs [`sync`] on every change of a CRD in the store (deletions by the garbage collector, for one), until
/// shutdown.
pub async fn run(
    store: Arc<Store>,
    registry: SharedRegistry,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let key = store_key();
    loop {
        let Ok((_, mut receiver)) = store.watch_from(store.current_rv()) else {
            return;
        };
        sync(&store, &registry, jiff::Timestamp::now());
        loop {
            tokio::select! {
                event = receiver.recv() => match event {
                    Ok(event) if event.resource == key => sync(&store, &registry, jiff::Timestamp::now()),
                    Ok(_) => {}
                    // Fell behind: subscribe again and sync once, which catches up with whatever was missed.
                    Err(_) => break,
                },
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": { "name": "widgets.example.com" },
            "spec": {
                "group": "example.com",
                "names": { "plural": "widgets", "kind": "Widget", "shortNames": ["wd"] },
                "scope": "Namespaced",
                "versions": [
                    { "name": "v1alpha1", "served": true, "storage": false,
                      "schema": { "openAPIV3Schema": { "type": "object" } } },
                    { "name": "v1", "served": true, "storage": true,
                      "schema": { "openAPIV3Schema": { "type": "object", "properties": {
                          "spec": { "type": "object", "properties": { "size": { "type": "integer", "default": 1 } } }
                      } } },
                      "subresources": { "status": {}, "scale": { "specReplicasPath": ".spec.size", "statusReplicasPath": ".status.size" } },
                      "additionalPrinterColumns": [{ "name": "Size", "type": "integer", "jsonPath": ".spec.size" }] },
                ],
            },
        })
    }

    fn fields(causes: &[Cause]) -> Vec<&str> {
        causes.iter().map(|c| c.field.as_str()).collect()
    }

    #[test]
    fn a_valid_crd_has_no_causes_and_gets_its_defaults() {
        let mut object = crd();
        set_defaults(&mut object);
        assert!(validate(&object).is_empty(), "{:?}", validate(&object));
        assert_eq!(object["spec"]["names"]["listKind"], "WidgetList");
        assert_eq!(object["spec"]["names"]["singular"], "widget");
        assert_eq!(object["spec"]["conversion"]["strategy"], "None");
    }

    #[test]
    fn invalid_crds_name_the_field() {
        let mut object = crd();
        object["metadata"]["name"] = json!("gadgets.example.com");
        object["spec"]["scope"] = json!("Galactic");
        object["spec"]["versions"][0]["storage"] = json!(true);
        object["spec"]["versions"][0]["schema"] = json!({});
        let found = validate(&object);
        assert_eq!(
            fields(&found),
            [
                "metadata.name",
                "spec.scope",
                "spec.versions",
                "spec.versions[0].schema.openAPIV3Schema"
            ]
        );
        let mut dotless = crd();
        dotless["spec"]["group"] = json!("example");
        dotless["metadata"]["name"] = json!("widgets.example");
        assert_eq!(fields(&validate(&dotless)), ["spec.group"]);
        let mut none = crd();
        none["spec"]["versions"] = json!([]);
        assert_eq!(fields(&validate(&none)), ["spec.versions"]);
    }

    #[test]
    fn every_served_version_becomes_a_resource_in_priority_order() {
        let defs = resource_defs(&crd());
        let versions: Vec<&str> = defs.iter().map(|d| d.version.as_str()).collect();
        assert_eq!(versions, ["v1", "v1alpha1"]);
        let v1 = &defs[0];
        assert_eq!(v1.storage_version, "v1");
        assert!(v1.namespaced && v1.custom && v1.generation && v1.status_subresource && v1.has_defaults);
        assert_eq!(v1.scale_paths.spec_replicas, "spec.size");
        assert_eq!(v1.short_names, ["wd"]);
        assert_eq!(v1.list_kind, "WidgetList");
        assert_eq!(v1.columns[0].name, "Size");
        assert_eq!(v1.schema()["properties"]["metadata"], json!({ "type": "object" }));
        assert!(!defs[1].status_subresource, "subresources are per version");
    }

    #[test]
    fn version_priority_follows_kubernetes() {
        let mut names = vec!["v1alpha1", "foo", "v1beta2", "v2", "v1", "v2beta1", "v10beta3"];
        names.sort_by_key(|n| version_priority(n));
        assert_eq!(
            names,
            ["v2", "v1", "v10beta3", "v2beta1", "v1beta2", "v1alpha1", "foo"]
        );
    }

    #[test]
    fn status_accepts_names_and_records_stored_versions() {
        let mut object = crd();
        object["status"] = json!({ "storedVersions": ["v1alpha1"] });
        let status = status(&object, jiff::Timestamp::now());
        let types: Vec<&str> = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["NamesAccepted", "Established"]);
        assert_eq!(status["storedVersions"], json!(["v1alpha1", "v1"]));
        assert_eq!(status["acceptedNames"]["kind"], "Widget");
    }
}
