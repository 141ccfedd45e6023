//! OpenAPI v3 documents (`GET /openapi/v3` and `GET /openapi/v3/<api/v1 | apis/g/v>?hash=…`).
//!
//! kubectl reads them for `explain` (kinds found through the operations' `x-kubernetes-group-version-kind`, then the
//! component schema carrying the same GVK), and for `apply`/`create`/`replace`: a `fieldValidation` parameter on the
//! PATCH operation means "the server validates fields", and `application/strategic-merge-patch+json` among the PATCH
//! content types means "use strategic merge patch" (built-ins only; custom resources get merge patch). Documents are
//! built once from the [`Registry`] and named by a content hash, which kubectl caches as immutable.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use serde_json::{Map, Value, json};

use crate::discovery::{Subresource, subresources};
use crate::registry::{Registry, ResourceDef, SharedRegistry};

/// Kubernetes version written in `info.version`, the one the served API subset follows.
const INFO_VERSION: &str = "v1.32.0";

const STATUS_SCHEMA: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const DELETE_OPTIONS_SCHEMA: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
const PATCH_SCHEMA: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";

const CRD_PATCH_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
];
const BUILTIN_PATCH_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];

/// One group-version document with its hash and its serialized form.
#[derive(Debug)]
struct Document {
    hash: String,
    value: Value,
    bytes: Vec<u8>,
}

/// The OpenAPI v3 documents: a root listing one entry per served group version, and one document per group version.
/// Built once at start.
#[derive(Debug)]
pub struct OpenApi {
    root: Value,
    documents: BTreeMap<String, Document>,
}

impl OpenApi {
    /// Builds the root and every group-version document of the registry (schemas are computed here, once).
    pub fn build(registry: &Registry) -> Self {
        let mut documents = BTreeMap::new();
        let mut root_paths = Map::new();
        for (group, version) in registry.group_versions() {
            let defs: Vec<&ResourceDef> = registry
                .all()
                .iter()
                .map(AsRef::as_ref)
                .filter(|r| r.group == group && r.version == version)
                .collect();
            let value = group_version_document(&defs);
            let bytes = serde_json::to_vec(&value).unwrap_or_default();
            let hash = content_hash(&bytes);
            let gv_path = gv_path(group, version);
            root_paths.insert(
                gv_path.clone(),
                json!({ "serverRelativeURL": format!("/openapi/v3/{gv_path}?hash={hash}") }),
            );
            documents.insert(gv_path, Document { hash, value, bytes });
        }
        let mut root = Map::new();
        root.insert("paths".into(), Value::Object(root_paths));
        Self {
            root: Value::Object(root),
            documents,
        }
    }

    /// `GET /openapi/v3`: `{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=<H>"},...}}`.
    pub fn root(&self) -> &Value {
        &self.root
    }

    /// The document of a group version path ("api/v1", "apis/machine.sapcloud.io/v1alpha1"; a leading `/` is
    /// ignored) and its hash (the ETag value, uppercase hex).
    pub fn document(&self, gv_path: &str) -> Option<(&str, &Value)> {
        let doc = self.documents.get(gv_path.trim_start_matches('/'))?;
        Some((&doc.hash, &doc.value))
    }

    /// Like [`OpenApi::document`], but the document already serialized as JSON: the exact bytes the hash was
    /// computed over, so that large documents are not serialized again on every request.
    pub fn document_json(&self, gv_path: &str) -> Option<(&str, &[u8])> {
        let doc = self.documents.get(gv_path.trim_start_matches('/'))?;
        Some((&doc.hash, &doc.bytes))
    }
}

/// The OpenAPI documents of the resources served now: built again when a CustomResourceDefinition changes what is
/// served, at the next request.
#[derive(Debug)]
pub struct LiveOpenApi {
    registry: SharedRegistry,
    built: Mutex<(u64, Arc<OpenApi>)>,
}

impl LiveOpenApi {
    /// The documents of `registry`, built now for what it serves now.
    pub fn new(registry: SharedRegistry) -> Self {
        let generation = registry.generation();
        let documents = Arc::new(OpenApi::build(&registry.current()));
        Self {
            registry,
            built: Mutex::new((generation, documents)),
        }
    }

    /// The documents of what is served now.
    pub fn current(&self) -> Arc<OpenApi> {
        let generation = self.registry.generation();
        let mut built = self
            .built
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if built.0 != generation {
            *built = (generation, Arc::new(OpenApi::build(&self.registry.current())));
        }
        Arc::clone(&built.1)
    }
}

/// "api/v1" or "apis/<group>/<version>".
fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Two FNV-1a 64 passes with different offset bases: 32 uppercase hex digits, stable across runs and builds.
fn content_hash(bytes: &[u8]) -> String {
    fn fnv1a(bytes: &[u8], basis: u64) -> u64 {
        bytes.iter().fold(basis, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }
    format!(
        "{:016X}{:016X}",
        fnv1a(bytes, 0xcbf2_9ce4_8422_2325),
        fnv1a(bytes, 0x8422_2325_cbf2_9ce4)
    )
}

/// The component schema name the real server uses: `io.k8s.api.<group prefix>.<version>.<Kind>` for built-ins
/// (`core` for the core group), the reversed group for custom resources (`io.sapcloud.machine.v1alpha1.Machine`).
fn schema_name(group: &str, version: &str, kind: &str, custom: bool) -> String {
    if custom {
        let reversed: Vec<&str> = group.split('.').rev().collect();
        format!("{}.{version}.{kind}", reversed.join("."))
    } else if group.is_empty() {
        format!("io.k8s.api.core.{version}.{kind}")
    } else {
        let prefix = group.split('.').next().unwrap_or(group);
        format!("io.k8s.api.{prefix}.{version}.{kind}")
    }
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({ "group": group, "version": version, "kind": kind })
}

/// `Core`, `Coordination`, `MachineSapcloudIo`: the group part of operation ids.
fn group_id(group: &str, custom: bool) -> String {
    if group.is_empty() {
        return "Core".to_owned();
    }
    let segments: Vec<&str> = if custom {
        group.split('.').collect()
    } else {
        group.split('.').take(1).collect()
    };
    segments.iter().map(|s| capitalize(s)).collect()
}

fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

fn query_param(name: &str, description: &str, type_: &str) -> Value {
    json!({ "name": name, "in": "query", "description": description, "schema": { "type": type_, "uniqueItems": true } })
}

fn path_param(name: &str, description: &str) -> Value {
    json!({ "name": name, "in": "path", "description": description, "required": true, "schema": { "type": "string", "uniqueItems": true } })
}

fn pretty_param() -> Value {
    query_param(
        "pretty",
        "If 'true', then the output is pretty printed.",
        "string",
    )
}

fn list_params() -> Vec<Value> {
    vec![
        query_param(
            "allowWatchBookmarks",
            "allowWatchBookmarks requests watch events with type \"BOOKMARK\".",
            "boolean",
        ),
        query_param(
            "continue",
            "The continue option should be set when retrieving more results from the server.",
            "string",
        ),
        query_param(
            "fieldSelector",
            "A selector to restrict the list of returned objects by their fields.",
            "string",
        ),
        query_param(
            "labelSelector",
            "A selector to restrict the list of returned objects by their labels.",
            "string",
        ),
        query_param(
            "limit",
            "limit is a maximum number of responses to return for a list call.",
            "integer",
        ),
        query_param(
            "resourceVersion",
            "resourceVersion sets a constraint on what resource versions a request may be served from.",
            "string",
        ),
        query_param(
            "resourceVersionMatch",
            "resourceVersionMatch determines how resourceVersion is applied to list calls.",
            "string",
        ),
        query_param(
            "sendInitialEvents",
            "`sendInitialEvents=true` may be set together with `watch=true`.",
            "boolean",
        ),
        query_param("timeoutSeconds", "Timeout for the list/watch call.", "integer"),
        query_param(
            "watch",
            "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications.",
            "boolean",
        ),
    ]
}

fn write_params(patch: bool) -> Vec<Value> {
    let mut params = vec![
        query_param(
            "dryRun",
            "When present, indicates that modifications should not be persisted. Valid value: All.",
            "string",
        ),
        query_param(
            "fieldManager",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
            "string",
        ),
        query_param(
            "fieldValidation",
            "fieldValidation instructs the server on how to handle objects in the request containing unknown or \
             duplicate fields. Valid values are: Ignore, Warn (the default) and Strict.",
            "string",
        ),
    ];
    if patch {
        params.push(query_param(
            "force",
            "Force is going to \"force\" Apply requests.",
            "boolean",
        ));
    }
    params
}

fn delete_params() -> Vec<Value> {
    vec![
        query_param(
            "dryRun",
            "When present, indicates that modifications should not be persisted. Valid value: All.",
            "string",
        ),
        query_param(
            "gracePeriodSeconds",
            "The duration in seconds before the object should be deleted.",
            "integer",
        ),
        query_param(
            "orphanDependents",
            "Deprecated: please use the PropagationPolicy.",
            "boolean",
        ),
        query_param(
            "propagationPolicy",
            "Whether and how garbage collection will be performed: Orphan, Background or Foreground.",
            "string",
        ),
    ]
}

fn json_content(schema: &Value) -> Value {
    json!({ "application/json": { "schema": schema } })
}

fn responses(codes: &[(&str, &str)], schema: &Value) -> Value {
    let mut out = Map::new();
    for (code, description) in codes {
        out.insert(
            (*code).to_owned(),
            json!({ "description": description, "content": json_content(schema) }),
        );
    }
    out.insert("401".into(), json!({ "description": "Unauthorized" }));
    Value::Object(out)
}

/// What one operation is about: kind, action, id and scope, shared by the operation builders.
struct OpTarget<'a> {
    def: &'a ResourceDef,
    /// Group, version and kind of the operation's object (the resource's, or a subresource's such as Scale).
    gvk: (&'a str, &'a str, &'a str),
    /// Component schema of that object.
    schema: Value,
    /// Path parameters (`namespace`, `name`) in path order.
    path_params: Vec<Value>,
}

impl OpTarget<'_> {
    fn operation(
        &self,
        action: &str,
        id: String,
        description: &str,
        mut params: Vec<Value>,
    ) -> Map<String, Value> {
        let mut all = self.path_params.clone();
        all.push(pretty_param());
        all.append(&mut params);
        let mut op = Map::new();
        op.insert("description".into(), json!(description));
        op.insert("operationId".into(), Value::String(id));
        op.insert("parameters".into(), Value::Array(all));
        op.insert("x-kubernetes-action".into(), json!(action));
        op.insert(
            "x-kubernetes-group-version-kind".into(),
            gvk(self.gvk.0, self.gvk.1, self.gvk.2),
        );
        op
    }

    fn read(&self, id: String) -> Value {
        let mut op = self.operation(
            "get",
            id,
            &format!("read the specified {}", self.gvk.2),
            Vec::new(),
        );
        op.insert("responses".into(), responses(&[("200", "OK")], &self.schema));
        Value::Object(op)
    }

    fn list(&self, id: String, list_schema: &Value) -> Value {
        let mut op = self.operation(
            "list",
            id,
            &format!("list or watch objects of kind {}", self.gvk.2),
            list_params(),
        );
        op.insert("responses".into(), responses(&[("200", "OK")], list_schema));
        Value::Object(op)
    }

    fn create(&self, id: String) -> Value {
        let mut op = self.operation(
            "post",
            id,
            &format!("create a {}", self.gvk.2),
            write_params(false),
        );
        op.insert(
            "requestBody".into(),
            json!({ "content": { "*/*": { "schema": self.schema } }, "required": true }),
        );
        op.insert(
            "responses".into(),
            responses(
                &[("200", "OK"), ("201", "Created"), ("202", "Accepted")],
                &self.schema,
            ),
        );
        Value::Object(op)
    }

    fn replace(&self, id: String) -> Value {
        let mut op = self.operation(
            "put",
            id,
            &format!("replace the specified {}", self.gvk.2),
            write_params(false),
        );
        op.insert(
            "requestBody".into(),
            json!({ "content": { "*/*": { "schema": self.schema } }, "required": true }),
        );
        op.insert(
            "responses".into(),
            responses(&[("200", "OK"), ("201", "Created")], &self.schema),
        );
        Value::Object(op)
    }

    fn patch(&self, id: String) -> Value {
        let mut op = self.operation(
            "patch",
            id,
            &format!("partially update the specified {}", self.gvk.2),
            write_params(true),
        );
        let types = if self.def.custom {
            CRD_PATCH_TYPES
        } else {
            BUILTIN_PATCH_TYPES
        };
        let content: Map<String, Value> = types
            .iter()
            .map(|t| ((*t).to_owned(), json!({ "schema": schema_ref(PATCH_SCHEMA) })))
            .collect();
        op.insert(
            "requestBody".into(),
            json!({ "content": content, "required": true }),
        );
        op.insert(
            "responses".into(),
            responses(&[("200", "OK"), ("201", "Created")], &self.schema),
        );
        Value::Object(op)
    }

    fn delete(&self, id: String) -> Value {
        let mut op = self.operation("delete", id, &format!("delete a {}", self.gvk.2), delete_params());
        op.insert(
            "requestBody".into(),
            json!({ "content": { "*/*": { "schema": schema_ref(DELETE_OPTIONS_SCHEMA) } } }),
        );
        op.insert(
            "responses".into(),
            responses(&[("200", "OK"), ("202", "Accepted")], &schema_ref(STATUS_SCHEMA)),
        );
        Value::Object(op)
    }

    fn delete_collection(&self, id: String) -> Value {
        let mut params = list_params();
        params.append(&mut delete_params());
        let mut op = self.operation(
            "deletecollection",
            id,
            &format!("delete collection of {}", self.gvk.2),
            params,
        );
        op.insert(
            "requestBody".into(),
            json!({ "content": { "*/*": { "schema": schema_ref(DELETE_OPTIONS_SCHEMA) } } }),
        );
        op.insert(
            "responses".into(),
            responses(&[("200", "OK")], &schema_ref(STATUS_SCHEMA)),
        );
        Value::Object(op)
    }
}

/// The path items of one resource: collections, the item, and its subresources.
fn resource_paths(def: &ResourceDef, paths: &mut Map<String, Value>) {
    let own = schema_name(&def.group, &def.version, &def.kind, def.custom);
    let schema = schema_ref(&own);
    let list_schema = schema_ref(&format!("{own}List"));
    let id = |verb: &str, middle: &str, suffix: &str| {
        format!(
            "{verb}{}{}{middle}{}{}{suffix}",
            group_id(&def.group, def.custom),
            capitalize(&def.version),
            if def.namespaced { "Namespaced" } else { "" },
            def.kind
        )
    };
    let namespace = path_param(
        "namespace",
        "object name and auth scope, such as for teams and projects",
    );
    let name = path_param("name", &format!("name of the {}", &def.kind));
    let scope_params = if def.namespaced {
        vec![namespace]
    } else {
        Vec::new()
    };
    let target = OpTarget {
        def,
        gvk: (&def.group, &def.version, &def.kind),
        schema: schema.clone(),
        path_params: scope_params.clone(),
    };

    let collection = def.collection_path(Some("{namespace}"));
    paths.insert(
        collection.clone(),
        json!({
            "get": target.list(id("list", "", ""), &list_schema),
            "post": target.create(id("create", "", "")),
            "delete": target.delete_collection(id("delete", "Collection", "")),
        }),
    );
    if def.namespaced {
        let all = OpTarget {
            path_params: Vec::new(),
            schema: schema.clone(),
            ..target
        };
        let all_id = format!(
            "list{}{}{}ForAllNamespaces",
            group_id(&def.group, def.custom),
            capitalize(&def.version),
            def.kind
        );
        paths.insert(
            def.collection_path(None),
            json!({ "get": all.list(all_id, &list_schema) }),
        );
    }

    let mut item_params = scope_params;
    item_params.insert(0, name);
    let item = OpTarget {
        def,
        gvk: (&def.group, &def.version, &def.kind),
        schema,
        path_params: item_params,
    };
    let item_path = format!("{collection}/{{name}}");
    paths.insert(
        item_path.clone(),
        json!({
            "get": item.read(id("read", "", "")),
            "put": item.replace(id("replace", "", "")),
            "patch": item.patch(id("patch", "", "")),
            "delete": item.delete(id("delete", "", "")),
        }),
    );

    for sub in subresources(def) {
        let sub_target = OpTarget {
            def,
            gvk: (sub.group, sub.version, sub.kind),
            schema: schema_ref(&subresource_schema_name(def, &sub)),
            path_params: item.path_params.clone(),
        };
        let suffix = capitalize(sub.name);
        let mut ops = Map::new();
        for verb in sub.verbs {
            let (method, op) = match *verb {
                "get" => ("get", sub_target.read(id("read", "", &suffix))),
                "update" => ("put", sub_target.replace(id("replace", "", &suffix))),
                "patch" => ("patch", sub_target.patch(id("patch", "", &suffix))),
                "create" => ("post", sub_target.create(id("create", "", &suffix))),
                "delete" => ("delete", sub_target.delete(id("delete", "", &suffix))),
                _ => continue,
            };
            ops.insert(method.to_owned(), op);
        }
        paths.insert(format!("{item_path}/{}", sub.name), Value::Object(ops));
    }
}

fn subresource_schema_name(def: &ResourceDef, sub: &Subresource<'_>) -> String {
    if sub.group == def.group && sub.version == def.version && sub.kind == def.kind {
        schema_name(&def.group, &def.version, &def.kind, def.custom)
    } else {
        schema_name(sub.group, sub.version, sub.kind, false)
    }
}

/// A schema with its `x-kubernetes-group-version-kind` list, as the real server marks top-level kinds.
fn with_gvk(schema: &Value, group: &str, version: &str, kind: &str) -> Value {
    let mut schema = match schema {
        Value::Object(map) => map.clone(),
        _ => Map::from_iter([("type".to_owned(), json!("object"))]),
    };
    schema.insert(
        "x-kubernetes-group-version-kind".into(),
        json!([gvk(group, version, kind)]),
    );
    Value::Object(schema)
}

fn list_schema(def: &ResourceDef, item_schema: &str) -> Value {
    json!({
        "description": format!("{} is a list of {}.", def.list_kind(), &def.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {
                "description": "APIVersion defines the versioned schema of this representation of an object.",
                "type": "string"
            },
            "kind": {
                "description": "Kind is a string value representing the REST resource this object represents.",
                "type": "string"
            },
            "items": { "description": format!("List of {}.", def.plural), "type": "array", "items": schema_ref(item_schema) },
            "metadata": {
                "description": "Standard list metadata.",
                "type": "object",
                "properties": {
                    "continue": { "description": "continue may be set if the user set a limit on the number of items returned.", "type": "string" },
                    "remainingItemCount": { "description": "The number of subsequent items in the list which are not included in this list response.", "type": "integer", "format": "int64" },
                    "resourceVersion": { "description": "String that identifies the server's internal version of this object.", "type": "string" }
                }
            }
        },
        "x-kubernetes-group-version-kind": [gvk(&def.group, &def.version, &def.list_kind())]
    })
}

/// Schemas of the kinds a subresource may speak besides the resource's own.
fn known_kind_schema(group: &str, version: &str, kind: &str) -> Value {
    use k8s_openapi::api::{autoscaling, policy};
    let schema = match (group, version, kind) {
        ("autoscaling", "v1", "Scale") => mcm_api::crd::schema_of::<autoscaling::v1::Scale>(),
        ("policy", "v1", "Eviction") => mcm_api::crd::schema_of::<policy::v1::Eviction>(),
        _ => json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true }),
    };
    with_gvk(&schema, group, version, kind)
}

fn meta_schemas(schemas: &mut Map<String, Value>) {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, Status};
    schemas.insert(STATUS_SCHEMA.into(), mcm_api::crd::schema_of::<Status>());
    schemas.insert(
        DELETE_OPTIONS_SCHEMA.into(),
        mcm_api::crd::schema_of::<DeleteOptions>(),
    );
    schemas.insert(
        PATCH_SCHEMA.into(),
        json!({
            "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.",
            "type": "object"
        }),
    );
}

fn group_version_document(defs: &[&ResourceDef]) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    meta_schemas(&mut schemas);
    for def in defs {
        resource_paths(def, &mut paths);
        let own = schema_name(&def.group, &def.version, &def.kind, def.custom);
        schemas.insert(format!("{own}List"), list_schema(def, &own));
        schemas.insert(own, with_gvk(def.schema(), &def.group, &def.version, &def.kind));
        for sub in subresources(def) {
            let name = subresource_schema_name(def, &sub);
            if !schemas.contains_key(&name) {
                schemas.insert(name, known_kind_schema(sub.group, sub.version, sub.kind));
            }
        }
    }
    let mut doc = json!({ "openapi": "3.0.0", "info": { "title": "Kubernetes", "version": INFO_VERSION } });
    doc["paths"] = Value::Object(paths);
    doc["components"] = json!({ "schemas": Value::Object(schemas) });
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api() -> OpenApi {
        OpenApi::build(&crate::preinstalled::registry())
    }

    fn has_param(op: &Value, name: &str) -> bool {
        op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == name)
    }

    #[test]
    fn machine_patch_offers_field_validation_but_no_strategic_merge() {
        let api = api();
        let (_, doc) = api.document("apis/machine.sapcloud.io/v1alpha1").unwrap();
        assert_eq!(doc["openapi"], "3.0.0");
        assert_eq!(
            doc["info"],
            json!({ "title": "Kubernetes", "version": "v1.32.0" })
        );
        for path in [
            "/apis/machine.sapcloud.io/v1alpha1/namespaces/{namespace}/machines/{name}",
            "/apis/machine.sapcloud.io/v1alpha1/namespaces/{namespace}/machines/{name}/status",
        ] {
            let patch = &doc["paths"][path]["patch"];
            assert_eq!(
                patch["x-kubernetes-group-version-kind"],
                gvk("machine.sapcloud.io", "v1alpha1", "Machine")
            );
            assert_eq!(patch["x-kubernetes-action"], "patch");
            assert!(has_param(patch, "fieldValidation"), "{path}");
            let content = patch["requestBody"]["content"].as_object().unwrap();
            let types: Vec<&str> = content.keys().map(String::as_str).collect();
            assert_eq!(types, CRD_PATCH_TYPES);
        }
        let list = &doc["paths"]["/apis/machine.sapcloud.io/v1alpha1/namespaces/{namespace}/machines"]["get"];
        assert_eq!(list["x-kubernetes-action"], "list");
        assert_eq!(
            list["operationId"],
            "listMachineSapcloudIoV1alpha1NamespacedMachine"
        );
        assert_eq!(list["x-kubernetes-group-version-kind"]["kind"], "Machine");
        assert!(doc["paths"]["/apis/machine.sapcloud.io/v1alpha1/machines"]["get"].is_object());
        let scale = &doc["paths"]["/apis/machine.sapcloud.io/v1alpha1/namespaces/{namespace}/machinesets/{name}/scale"];
        assert_eq!(
            scale["put"]["x-kubernetes-group-version-kind"],
            gvk("autoscaling", "v1", "Scale")
        );
        assert_eq!(
            scale["get"]["operationId"],
            "readMachineSapcloudIoV1alpha1NamespacedMachineSetScale"
        );
        assert!(
            doc["components"]["schemas"]["io.k8s.api.autoscaling.v1.Scale"]["properties"]["spec"].is_object()
        );
    }

    #[test]
    fn secret_patch_offers_strategic_merge_and_field_validation() {
        let api = api();
        let (_, doc) = api.document("/api/v1").unwrap();
        let patch = &doc["paths"]["/api/v1/namespaces/{namespace}/secrets/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"], gvk("", "v1", "Secret"));
        assert!(has_param(patch, "fieldValidation"));
        assert!(patch["requestBody"]["content"]["application/strategic-merge-patch+json"].is_object());
        assert_eq!(patch["operationId"], "patchCoreV1NamespacedSecret");
        let nodes = &doc["paths"]["/api/v1/nodes"];
        assert_eq!(nodes["get"]["operationId"], "listCoreV1Node");
        assert!(nodes["post"].is_object());
        assert!(doc["paths"]["/api/v1/nodes/{name}/status"]["patch"].is_object());
        assert!(doc["paths"].get("/api/v1/namespaces/{namespace}/nodes").is_none());
    }

    #[test]
    fn component_schemas_are_named_like_the_real_server_and_carry_their_gvk() {
        let api = api();
        let expect = [
            ("api/v1", "io.k8s.api.core.v1.Pod", gvk("", "v1", "Pod")),
            ("api/v1", "io.k8s.api.core.v1.PodList", gvk("", "v1", "PodList")),
            (
                "apis/coordination.k8s.io/v1",
                "io.k8s.api.coordination.v1.Lease",
                gvk("coordination.k8s.io", "v1", "Lease"),
            ),
            (
                "apis/policy/v1",
                "io.k8s.api.policy.v1.PodDisruptionBudget",
                gvk("policy", "v1", "PodDisruptionBudget"),
            ),
            (
                "apis/storage.k8s.io/v1",
                "io.k8s.api.storage.v1.VolumeAttachment",
                gvk("storage.k8s.io", "v1", "VolumeAttachment"),
            ),
            (
                "apis/events.k8s.io/v1",
                "io.k8s.api.events.v1.Event",
                gvk("events.k8s.io", "v1", "Event"),
            ),
            (
                "apis/machine.sapcloud.io/v1alpha1",
                "io.sapcloud.machine.v1alpha1.Machine",
                gvk("machine.sapcloud.io", "v1alpha1", "Machine"),
            ),
        ];
        for (path, name, gvk) in expect {
            let (_, doc) = api.document(path).unwrap();
            let schema = &doc["components"]["schemas"][name];
            assert_eq!(schema["x-kubernetes-group-version-kind"], json!([gvk]), "{name}");
            assert!(schema["properties"].is_object(), "{name}");
        }
        let (_, doc) = api.document("apis/machine.sapcloud.io/v1alpha1").unwrap();
        let schemas = &doc["components"]["schemas"];
        let class =
            &schemas["io.sapcloud.machine.v1alpha1.Machine"]["properties"]["spec"]["properties"]["class"];
        assert!(class["description"].as_str().is_some_and(|d| !d.is_empty()));
        let strategy = &schemas["io.sapcloud.machine.v1alpha1.MachineDeployment"]["properties"]["spec"]["properties"]
            ["strategy"];
        assert!(strategy["description"].as_str().is_some_and(|d| !d.is_empty()));
    }

    #[test]
    fn root_lists_every_group_version_with_the_document_hash() {
        let api = api();
        let paths = api.root()["paths"].as_object().unwrap();
        assert!(paths.contains_key("api/v1"));
        assert!(paths.contains_key("apis/machine.sapcloud.io/v1alpha1"));
        assert_eq!(
            paths.len(),
            crate::preinstalled::registry().group_versions().len()
        );
        for (path, entry) in paths {
            let (hash, doc) = api.document(path).unwrap();
            assert_eq!(hash.len(), 32);
            assert!(hash.chars().all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()));
            assert_eq!(
                entry["serverRelativeURL"],
                format!("/openapi/v3/{path}?hash={hash}")
            );
            let (json_hash, bytes) = api.document_json(path).unwrap();
            assert_eq!(json_hash, hash);
            assert_eq!(&serde_json::from_slice::<Value>(bytes).unwrap(), doc);
        }
        assert!(api.document("apis/apps/v1").is_none());
        // Stable across builds.
        let again = OpenApi::build(&crate::preinstalled::registry());
        assert_eq!(again.root(), api.root());
    }

    #[test]
    fn hash_and_names() {
        assert_eq!(
            content_hash(b""),
            "CBF29CE484222325".to_owned() + "84222325CBF29CE4"
        );
        assert_ne!(content_hash(b"a"), content_hash(b"b"));
        assert_eq!(
            schema_name("machine.sapcloud.io", "v1alpha1", "MachineSet", true),
            "io.sapcloud.machine.v1alpha1.MachineSet"
        );
        assert_eq!(group_id("machine.sapcloud.io", true), "MachineSapcloudIo");
        assert_eq!(group_id("storage.k8s.io", false), "Storage");
        assert_eq!(capitalize(""), "");
    }
}
