//! The HTTP surface: authentication, routing of Kubernetes API paths, content negotiation, and the verbs (get,
//! list, watch, create, update, patch, delete, deletecollection) with the status and scale subresources.
//!
//! Object semantics live in [`crate::objects`]; this module turns requests into calls and results into responses.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use serde_json::{Value, json};

use crate::{
    auth, csr, discovery,
    error::{ApiError, success_status},
    objects::{self, FieldValidation, Outcome},
    openapi::LiveOpenApi,
    options,
    registry::{Registry, ResourceDef, SharedRegistry},
    selectors::{FieldSelector, LabelSelector},
    store::Store,
    table, watch,
};

/// Largest request body accepted (the real server's limit is about 3 MiB).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

// Authentication and authorization live in `auth`; the names stay reachable here.
pub use crate::auth::{AdminToken, Authenticator, User};

/// Everything a request needs.
#[derive(Clone)]
pub struct AppState {
    /// The served resources (built-ins and those of CustomResourceDefinitions).
    pub registry: SharedRegistry,
    /// The objects.
    pub store: Arc<Store>,
    /// The OpenAPI documents.
    pub openapi: Arc<LiveOpenApi>,
    /// Token checks.
    pub auth: Arc<dyn Authenticator>,
    /// The CA, which signs approved node CertificateSigningRequests.
    pub pki: Arc<crate::pki::Pki>,
    /// `host:port` clients use, for legacy discovery.
    pub server_address: String,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// Flips to true when the server stops; open watches end.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// Test hooks (watch delay, injected failures); off by default.
    pub hooks: Arc<crate::hooks::Hooks>,
    /// Requests counted per user, verb and resource.
    pub requests: Arc<crate::requests::RequestCounts>,
    /// Validating admission of the machine kinds ([`crate::admission`]).
    pub machine_admission: bool,
}

/// The parsed query string.
#[derive(Debug, Default)]
pub struct Query(BTreeMap<String, String>);

impl Query {
    /// Parses a query string (`a=1&b=2`, percent-decoded); a repeated parameter keeps its last value.
    pub fn parse(query: Option<&str>) -> Self {
        Self(
            form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                .into_owned()
                .collect(),
        )
    }

    /// A parameter.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// A boolean parameter (`true`, `1`).
    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

/// The form of a response body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `application/json`.
    Json,
    /// `application/yaml`.
    Yaml,
    /// A `meta.k8s.io` Table of this apiVersion.
    Table(&'static str),
    /// `meta.k8s.io/v1` PartialObjectMetadata (and PartialObjectMetadataList): metadata only, as kube's
    /// metadata watchers and `list_metadata` ask for.
    Metadata,
    /// `application/vnd.kubernetes.protobuf`, for the built-in kinds ([`crate::protobuf`]).
    Protobuf,
}

/// An object reduced to its metadata (`PartialObjectMetadata`).
pub fn partial_metadata(object: &Value) -> Value {
    json!({ "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": object["metadata"] })
}

/// Picks the response form from the Accept header; 406 when nothing acceptable can be produced.
pub fn negotiate(headers: &HeaderMap, table_allowed: bool) -> Result<Format, ApiError> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim();
    if accept.is_empty() {
        return Ok(Format::Json);
    }
    if table_allowed && let Some(version) = table::wants_table(accept) {
        return Ok(Format::Table(version));
    }
    for range in accept.split(',') {
        let params: Vec<&str> = range.split(';').skip(1).map(str::trim).collect();
        if table_allowed
            && params.contains(&"g=meta.k8s.io")
            && (params.contains(&"as=PartialObjectMetadata")
                || params.contains(&"as=PartialObjectMetadataList"))
            && (params.contains(&"v=v1") || params.contains(&"v=v1beta1"))
        {
            return Ok(Format::Metadata);
        }
        let mut parts = range.split(';').map(str::trim);
        let base = parts.next().unwrap_or_default().to_ascii_lowercase();
        // A range that asks for a representation we do not make (`as=Table;v=v2`) is not plain JSON.
        let converts = parts.any(|p| p.starts_with("as="));
        match base.as_str() {
            "application/json" | "application/*" | "*/*" if !converts => return Ok(Format::Json),
            "application/yaml" if !converts => return Ok(Format::Yaml),
            _ => {}
        }
    }
    Err(ApiError::NotAcceptable(
        "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf"
            .into(),
    ))
}

fn respond(status: StatusCode, content_type: &str, body: Vec<u8>, warnings: &[String]) -> Response<Body> {
    let mut builder = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache, private");
    for warning in warnings {
        let text = format!("299 - \"{}\"", warning.replace('\\', "\\\\").replace('"', "\\\""));
        if let Ok(value) = HeaderValue::from_str(&text) {
            builder = builder.header(header::WARNING, value);
        }
    }
    builder
        .body(Body::from(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// A JSON or YAML response of a value.
pub fn respond_value(
    status: StatusCode,
    value: &Value,
    format: Format,
    warnings: &[String],
) -> Response<Body> {
    match format {
        Format::Yaml => match serde_saphyr::to_string(value) {
            Ok(text) => respond(status, "application/yaml", text.into_bytes(), warnings),
            Err(err) => error_response(&ApiError::Internal(format!("cannot write YAML: {err}"))),
        },
        Format::Protobuf => match crate::protobuf::encode(value) {
            Ok(body) => respond(status, crate::protobuf::MEDIA_TYPE, body, warnings),
            Err(err) => error_response(&err),
        },
        _ => respond(
            status,
            "application/json",
            serde_json::to_vec(value).unwrap_or_default(),
            warnings,
        ),
    }
}

/// The Status response of an error.
pub fn error_response(err: &ApiError) -> Response<Body> {
    let mut response = respond(
        err.code(),
        "application/json",
        serde_json::to_vec(&err.to_status()).unwrap_or_default(),
        &[],
    );
    if let ApiError::TooManyRequests(_, Some(seconds), _) = err
        && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    if let ApiError::TooLarge(_) | ApiError::UriTooLong(_) | ApiError::HeadersTooLarge(_) = err {
        // The rest of the body is never read, so the connection cannot carry another request: say so (RFC 9112
        // 9.6, as Go's net/http does), lest the client reuse it and its next request fail.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// What a request path names.
enum Target {
    Version,
    DebugRequests,
    Health,
    CoreRoot,
    GroupsRoot,
    Group(String),
    GroupVersion(String, String),
    OpenApiV3Root,
    OpenApiV3(String),
    Resource {
        def: Arc<ResourceDef>,
        namespace: Option<String>,
        name: Option<String>,
        sub: Option<String>,
    },
}

fn route(registry: &Registry, path: &str) -> Result<Target, ApiError> {
    let segments: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let not_found = || ApiError::path_not_found(path);
    let target = match segments.as_slice() {
        ["version"] => Target::Version,
        ["debug", "requests"] => Target::DebugRequests,
        ["healthz" | "livez" | "readyz", ..] => Target::Health,
        ["api"] => Target::CoreRoot,
        ["apis"] => Target::GroupsRoot,
        ["apis", group] => Target::Group((*group).to_owned()),
        ["api", version] => Target::GroupVersion(String::new(), (*version).to_owned()),
        ["apis", group, version] => Target::GroupVersion((*group).to_owned(), (*version).to_owned()),
        ["openapi", "v3"] => Target::OpenApiV3Root,
        ["openapi", "v3", rest @ ..] => Target::OpenApiV3(rest.join("/")),
        ["api", version, rest @ ..] => resource_target(registry, "", version, rest).ok_or_else(not_found)?,
        ["apis", group, version, rest @ ..] => {
            resource_target(registry, group, version, rest).ok_or_else(not_found)?
        }
        _ => return Err(not_found()),
    };
    Ok(target)
}

fn resource_target(registry: &Registry, group: &str, version: &str, rest: &[&str]) -> Option<Target> {
    let owned = |s: &&str| (*s).to_owned();
    if let ["namespaces", namespace, plural, tail @ ..] = rest
        && let Some(def) = registry.find(group, version, plural).filter(|d| d.namespaced)
    {
        if tail.len() > 2 {
            return None;
        }
        return Some(Target::Resource {
            def,
            namespace: Some((*namespace).to_owned()),
            name: tail.first().map(owned),
            sub: tail.get(1).map(owned),
        });
    }
    let [plural, tail @ ..] = rest else { return None };
    let def = registry.find(group, version, plural)?;
    if tail.len() > 2 || (def.namespaced && !tail.is_empty()) {
        return None;
    }
    Some(Target::Resource {
        def,
        namespace: None,
        name: tail.first().map(owned),
        sub: tail.get(1).map(owned),
    })
}

/// Serves one request.
pub async fn handle(state: AppState, request: Request<Body>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let served = match crate::limits::check_head(&parts) {
        Ok(()) => serve(&state, &parts, body).await,
        Err(err) => Err(err),
    };
    match served {
        Ok(response) => response,
        Err(err) => {
            tracing::debug!(method = %parts.method, path = %parts.uri.path(), code = err.code().as_u16(), "request failed");
            crate::protobuf::error_response(&parts.headers, &err)
        }
    }
}

async fn serve(
    state: &AppState,
    parts: &http::request::Parts,
    body: Body,
) -> Result<Response<Body>, ApiError> {
    let path = parts.uri.path();
    // One snapshot of the served resources for the whole request.
    let registry = state.registry.current();
    let target = route(&registry, path);
    // Health and version are open, as on a real server; everything else needs a valid token or certificate.
    let user = if matches!(target, Ok(Target::Version | Target::Health)) {
        None
    } else {
        Some(authenticate(state, parts)?)
    };
    let query = Query::parse(parts.uri.query());
    match target? {
        Target::Version => Ok(respond_value(StatusCode::OK, &version_info(), Format::Json, &[])),
        Target::Health => Ok(respond(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            b"ok".to_vec(),
            &[],
        )),
        Target::CoreRoot => Ok(discovery_response(
            &parts.headers,
            || discovery::aggregated_core(&registry),
            || discovery::api_versions(&state.server_address),
        )),
        Target::GroupsRoot => Ok(discovery_response(
            &parts.headers,
            || discovery::aggregated_groups(&registry),
            || discovery::api_group_list(&registry),
        )),
        Target::Group(group) => discovery::api_group(&registry, &group)
            .map(|v| respond_value(StatusCode::OK, &v, Format::Json, &[]))
            .ok_or_else(|| ApiError::path_not_found(path)),
        Target::GroupVersion(group, version) => discovery::api_resource_list(&registry, &group, &version)
            .map(|v| respond_value(StatusCode::OK, &v, Format::Json, &[]))
            .ok_or_else(|| ApiError::path_not_found(path)),
        Target::OpenApiV3Root => Ok(respond_value(
            StatusCode::OK,
            state.openapi.current().root(),
            Format::Json,
            &[],
        )),
        Target::OpenApiV3(gv) => openapi_document(state, &gv, &query, &parts.headers),
        Target::DebugRequests => {
            if !user.as_ref().is_some_and(User::is_admin) {
                return Err(ApiError::Forbidden(
                    "only the admin may read the request counters".into(),
                ));
            }
            Ok(respond_value(
                StatusCode::OK,
                &state.requests.to_json(),
                Format::Json,
                &[],
            ))
        }
        Target::Resource {
            def,
            namespace,
            name,
            sub,
        } => {
            let user = user.ok_or(ApiError::Unauthorized)?;
            let watch = query.flag("watch");
            let verb = auth::verb_of(&parts.method, name.is_some(), watch);
            let resource = match &sub {
                Some(sub) => format!("{}/{sub}", def.group_resource()),
                None => def.group_resource(),
            };
            state.requests.record_request(
                &user.name,
                verb,
                &resource,
                namespace.as_deref().filter(|_| def.namespaced),
                auth::request_name(verb, name.as_deref(), query.get("fieldSelector")),
            );
            if let Some(failure) = state.hooks.injected_failure(&parts.method) {
                return Err(failure);
            }
            let request = ResourceRequest {
                state,
                user,
                def,
                namespace,
                name,
                sub,
                query,
                headers: &parts.headers,
            };
            let is_crd = crate::crd::is_crd(&request.def);
            let response = request.serve(&parts.method, body).await;
            if is_crd && parts.method != Method::GET {
                // What a CRD defines is served (or not) by the time the write is answered.
                crate::crd::sync(&state.store, &state.registry, jiff::Timestamp::now());
            }
            response
        }
    }
}

/// The bearer token's user; without an Authorization header, the user of the connection's client certificate.
fn authenticate(state: &AppState, parts: &http::request::Parts) -> Result<User, ApiError> {
    let Some(authorization) = parts.headers.get(header::AUTHORIZATION) else {
        return parts
            .extensions
            .get::<auth::ClientCertificateUser>()
            .map(|certificate| certificate.0.clone())
            .ok_or(ApiError::Unauthorized);
    };
    let token = authorization
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or(ApiError::Unauthorized)?;
    state.auth.authenticate(token).ok_or(ApiError::Unauthorized)
}

fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": concat!("v1.32.0-mcm.", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "rust",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

fn discovery_response(
    headers: &HeaderMap,
    aggregated: impl FnOnce() -> Value,
    legacy: impl FnOnce() -> Value,
) -> Response<Body> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if discovery::wants_aggregated(accept) {
        let body = serde_json::to_vec(&aggregated()).unwrap_or_default();
        let mut response = respond(
            StatusCode::OK,
            discovery::AGGREGATED_DISCOVERY_CONTENT_TYPE,
            body,
            &[],
        );
        response
            .headers_mut()
            .insert(header::VARY, HeaderValue::from_static("Accept"));
        response
    } else {
        respond_value(StatusCode::OK, &legacy(), Format::Json, &[])
    }
}

fn openapi_document(
    state: &AppState,
    gv: &str,
    query: &Query,
    headers: &HeaderMap,
) -> Result<Response<Body>, ApiError> {
    let openapi = state.openapi.current();
    let (hash, document) = openapi
        .document(gv)
        .ok_or_else(|| ApiError::path_not_found(&format!("/openapi/v3/{gv}")))?;
    let etag = format!("\"{hash}\"");
    if let Some(asked) = query.get("hash")
        && asked != hash
    {
        let mut response = respond(
            StatusCode::MOVED_PERMANENTLY,
            "text/plain; charset=utf-8",
            Vec::new(),
            &[],
        );
        if let Ok(location) = HeaderValue::from_str(&format!("/openapi/v3/{gv}?hash={hash}")) {
            response.headers_mut().insert(header::LOCATION, location);
        }
        return Ok(response);
    }
    if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        return Ok(respond(
            StatusCode::NOT_MODIFIED,
            "application/json",
            Vec::new(),
            &[],
        ));
    }
    let mut response = respond_value(StatusCode::OK, document, Format::Json, &[]);
    if let Ok(value) = HeaderValue::from_str(&etag) {
        response.headers_mut().insert(header::ETAG, value);
    }
    if query.get("hash").is_some() {
        response.headers_mut().insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("public, immutable"),
        );
    }
    Ok(response)
}

/// How much of an oversized body is read and discarded before the 413, so that a client still sending it gets the
/// answer instead of a broken pipe (hyper's client reports a failed body write rather than the early response).
const MAX_DRAINED_BYTES: usize = 4 * MAX_BODY_BYTES;

async fn read_body(mut body: Body) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt as _;
    let mut kept = bytes::BytesMut::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|err| ApiError::BadRequest(format!("cannot read the request body: {err}")))?;
        let Ok(data) = frame.into_data() else { continue };
        total = total.saturating_add(data.len());
        if total <= MAX_BODY_BYTES {
            kept.extend_from_slice(&data);
        } else if total > MAX_DRAINED_BYTES {
            break;
        }
    }
    if total > MAX_BODY_BYTES {
        return Err(ApiError::TooLarge(format!(
            "the request body is larger than the limit of {MAX_BODY_BYTES} bytes"
        )));
    }
    Ok(kept.freeze())
}

/// Decodes a create or update body as its Content-Type says ([`options::body_format`]: JSON when there is none,
/// as kubectl's scale client sends).
fn decode_object(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = match options::body_format(headers)? {
        options::BodyFormat::Json => serde_json::from_slice(body)
            .map_err(|err| ApiError::BadRequest(format!("error decoding the request body as JSON: {err}")))?,
        options::BodyFormat::Yaml => {
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiError::BadRequest("the YAML body is not UTF-8".into()))?;
            serde_saphyr::from_str(text).map_err(|err| {
                ApiError::BadRequest(format!("error decoding the request body as YAML: {err}"))
            })?
        }
        options::BodyFormat::Protobuf => crate::protobuf::decode_body(body)?,
    };
    if !value.is_object() {
        return Err(ApiError::BadRequest(
            "the request body must be a JSON object".into(),
        ));
    }
    Ok(value)
}

struct ResourceRequest<'a> {
    state: &'a AppState,
    user: User,
    def: Arc<ResourceDef>,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    query: Query,
    headers: &'a HeaderMap,
}

impl ResourceRequest<'_> {
    async fn serve(self, method: &Method, body: Body) -> Result<Response<Body>, ApiError> {
        crate::protobuf::check_body(&self.def, self.headers)?;
        // Creates are authorized in `create`, which knows the new object's name.
        if !(*method == Method::POST && self.name.is_none()) {
            self.authorize(method)?;
        }
        let sub = self.sub.as_deref();
        match sub {
            None | Some("status") if sub.is_none() || self.def.status_subresource => {}
            Some("scale") if self.def.scale_subresource => {}
            Some("approval") if csr::is_csr(&self.def) => {}
            Some("eviction") if self.def.group.is_empty() && self.def.plural == "pods" => {
                if self.query.get("dryRun").is_some_and(|v| !v.is_empty()) {
                    return Err(ApiError::BadRequest(
                        "dryRun is not supported for pods/eviction by this server".into(),
                    ));
                }
                return match (method, &self.name) {
                    (&Method::POST, Some(name)) => {
                        let body = read_body(body).await?;
                        self.write(|| self.evict(name, &body))
                    }
                    _ => Err(ApiError::MethodNotAllowed(
                        "pods/eviction only accepts POST".into(),
                    )),
                };
            }
            Some(other) => {
                return Err(ApiError::path_not_found(&format!(
                    "{}/{other}",
                    self.def.group_resource()
                )));
            }
            None => {}
        }
        self.check_options(method)?;
        match (method, &self.name) {
            (&Method::GET, None) if self.query.flag("watch") => self.watch(),
            (&Method::GET, None) => self.list(),
            (&Method::GET, Some(name)) => self.get(name),
            (&Method::POST, None) => {
                let body = read_body(body).await?;
                self.write(|| self.create(&body))
            }
            (&Method::PUT, Some(name)) => {
                let body = read_body(body).await?;
                self.write(|| self.update(name, &body))
            }
            (&Method::PATCH, Some(name)) => {
                let body = read_body(body).await?;
                self.write(|| self.patch(name, &body))
            }
            (&Method::DELETE, Some(name)) => {
                let body = read_body(body).await?;
                self.write(|| self.delete(name, &body))
            }
            (&Method::DELETE, None) => {
                let body = read_body(body).await?;
                self.write(|| self.delete_collection(&body))
            }
            (method, _) => Err(ApiError::MethodNotAllowed(format!(
                "the server does not allow this method on the requested resource ({method} {})",
                self.def.group_resource()
            ))),
        }
    }

    /// Runs a write. On disk it waits for its group commit's transaction ([`crate::store`]); it waits outside the
    /// runtime's worker threads (which go on serving other requests), so that many writes can wait on, and share,
    /// one fsync. In memory, and on a single-threaded runtime (tests), it runs in place.
    fn write<R>(&self, write: impl FnOnce() -> R) -> R {
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if multi_thread && self.state.store.on_disk() {
            tokio::task::block_in_place(write)
        } else {
            write()
        }
    }

    /// The query parameters kube-apiserver checks before the verb runs ([`options`]).
    fn check_options(&self, method: &Method) -> Result<(), ApiError> {
        match *method {
            Method::GET => {
                if self.name.is_none() {
                    options::check_list_options(&self.query, self.query.flag("watch"))?;
                }
                options::check_resource_version(&self.query)
            }
            Method::POST => self.check_write_options("CreateOptions"),
            Method::PUT => self.check_write_options("UpdateOptions"),
            Method::PATCH => self.check_write_options("PatchOptions"),
            Method::DELETE => options::check_dry_run("DeleteOptions", &self.query).map(|_| ()),
            _ => Ok(()),
        }
    }

    fn check_write_options(&self, options_kind: &str) -> Result<(), ApiError> {
        options::check_field_manager(options_kind, &self.query)?;
        options::check_dry_run(options_kind, &self.query).map(|_| ())
    }

    /// Whether the write is a dry run (`dryRun=All`, checked by [`Self::check_options`] before the verb).
    fn dry_run(&self) -> bool {
        self.query.get("dryRun") == Some("All")
    }

    /// 403 unless the user may do this (`auth::authorize`).
    fn authorize(&self, method: &Method) -> Result<(), ApiError> {
        let verb = auth::verb_of(method, self.name.is_some(), self.query.flag("watch"));
        let name = auth::request_name(verb, self.name.as_deref(), self.query.get("fieldSelector"));
        let namespace = self.namespace.as_deref();
        let sub = self.sub.as_deref();
        auth::authorize_stored(
            &self.state.store,
            &self.user,
            verb,
            &self.def,
            namespace,
            name,
            sub,
        )
    }

    /// The response form ([`negotiate`]), protobuf included for the built-in kinds' objects (the scale
    /// subresource's `autoscaling/v1` Scale has no encoding here).
    fn negotiate(&self, table_allowed: bool) -> Result<Format, ApiError> {
        let protobuf = crate::protobuf::serves(&self.def) && self.sub.as_deref() != Some("scale");
        crate::protobuf::negotiate(self.headers, table_allowed, protobuf)
    }

    fn namespace(&self) -> &str {
        if self.def.namespaced {
            self.namespace.as_deref().unwrap_or_default()
        } else {
            ""
        }
    }

    fn field_validation(&self) -> Result<FieldValidation, ApiError> {
        match self.query.get("fieldValidation").unwrap_or("") {
            "Strict" => Ok(FieldValidation::Strict),
            "Warn" | "" => Ok(FieldValidation::Warn),
            "Ignore" => Ok(FieldValidation::Ignore),
            other => Err(ApiError::BadRequest(format!(
                "fieldValidation parameter unsupported: {other} (supported: Strict, Warn, Ignore)"
            ))),
        }
    }

    fn selectors(&self) -> Result<(LabelSelector, FieldSelector), ApiError> {
        let labels = LabelSelector::parse(self.query.get("labelSelector").unwrap_or(""))
            .map_err(|err| ApiError::BadRequest(format!("unable to parse requirement: {err}")))?;
        let fields = FieldSelector::parse(self.query.get("fieldSelector").unwrap_or(""))
            .map_err(|err| ApiError::BadRequest(format!("invalid field selector: {err}")))?;
        for field in fields.fields() {
            let allowed = matches!(field, "metadata.name" | "metadata.namespace")
                || self.def.selectable_fields.iter().any(|f| f == field);
            if !allowed {
                return Err(ApiError::BadRequest(format!(
                    "field label not supported: {field} (for {})",
                    self.def.group_resource()
                )));
            }
        }
        Ok((labels, fields))
    }

    /// What the rows of a Table answer carry (`includeObject`); 400 naming the parameter for a value it does not take.
    fn include_object(&self) -> Result<table::IncludeObject, ApiError> {
        table::IncludeObject::parse(self.query.get("includeObject")).map_err(ApiError::BadRequest)
    }

    fn get(&self, name: &str) -> Result<Response<Body>, ApiError> {
        let object = self
            .state
            .store
            .get(&objects::resource_id(&self.def), self.namespace(), name)
            .ok_or_else(|| ApiError::not_found(&self.def, name))?;
        let object = self.def.present(&object);
        if self.sub.as_deref() == Some("scale") {
            let format = negotiate(self.headers, false)?;
            return Ok(respond_value(
                StatusCode::OK,
                &objects::scale_of(&self.def, &object),
                format,
                &[],
            ));
        }
        match self.negotiate(true)? {
            Format::Table(version) => {
                let meta = json!({ "resourceVersion": object["metadata"]["resourceVersion"] });
                let table = table::table_with(
                    &self.def,
                    &[&object],
                    self.include_object()?,
                    true,
                    meta,
                    jiff::Timestamp::now(),
                    version,
                );
                Ok(respond_value(StatusCode::OK, &table, Format::Json, &[]))
            }
            Format::Metadata => Ok(respond_value(
                StatusCode::OK,
                &partial_metadata(&object),
                Format::Json,
                &[],
            )),
            format => Ok(respond_value(StatusCode::OK, &object, format, &[])),
        }
    }

    fn list(&self) -> Result<Response<Body>, ApiError> {
        let format = self.negotiate(true)?;
        let (labels, fields) = self.selectors()?;
        let namespace = self.def.namespaced.then_some(()).and(self.namespace.as_deref());
        let (items, rv) = self.state.store.list(&objects::resource_id(&self.def), namespace);
        let limit = match self.query.get("limit") {
            None | Some("" | "0") => usize::MAX,
            Some(text) => text.parse::<usize>().map_err(|_| {
                ApiError::BadRequest(format!("invalid limit {text:?}: must be a non-negative integer"))
            })?,
        };
        let start_after = match self.query.get("continue").filter(|c| !c.is_empty()) {
            None => None,
            Some(token) => Some(objects::decode_continue(token)?),
        };
        let selected = |object: &Value| {
            let labels_of = objects::labels(object);
            labels.matches(&labels_of) && fields.matches(object)
        };
        let mut page = Vec::new();
        let mut remaining = 0usize;
        let mut last_key = None;
        for item in &items {
            let key = objects::sort_key(item);
            if start_after.as_ref().is_some_and(|after| &key <= after) || !selected(item) {
                continue;
            }
            if page.len() < limit {
                last_key = Some(key);
                page.push(Arc::clone(item));
            } else {
                remaining += 1;
            }
        }
        let mut metadata = json!({ "resourceVersion": rv.to_string() });
        if remaining > 0
            && let Some(key) = last_key
        {
            metadata["continue"] = json!(objects::encode_continue(rv, &key));
            metadata["remainingItemCount"] = json!(remaining);
        }
        let page: Vec<std::borrow::Cow<'_, Value>> = page.iter().map(|v| self.def.present(v)).collect();
        if let Format::Table(version) = format {
            let refs: Vec<&Value> = page.iter().map(|v| &**v).collect();
            let table = table::table_with(
                &self.def,
                &refs,
                self.include_object()?,
                true,
                metadata,
                jiff::Timestamp::now(),
                version,
            );
            return Ok(respond_value(StatusCode::OK, &table, Format::Json, &[]));
        }
        if format == Format::Metadata {
            let list = json!({
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadataList",
                "metadata": metadata,
                "items": page.iter().map(|v| partial_metadata(v)).collect::<Vec<_>>(),
            });
            return Ok(respond_value(StatusCode::OK, &list, Format::Json, &[]));
        }
        let list = json!({
            "apiVersion": self.def.api_version(),
            "kind": self.def.list_kind(),
            "metadata": metadata,
            "items": page.iter().map(|v| &**v).collect::<Vec<_>>(),
        });
        Ok(respond_value(StatusCode::OK, &list, format, &[]))
    }

    fn watch(&self) -> Result<Response<Body>, ApiError> {
        let format = self.negotiate(true)?;
        let (labels, fields) = self.selectors()?;
        let namespace = self.def.namespaced.then_some(()).and(self.namespace.clone());
        watch::start(
            self.state,
            Arc::clone(&self.def),
            namespace,
            labels,
            fields,
            &self.query,
            format,
        )
    }

    fn context(&self) -> Result<objects::Context, ApiError> {
        Ok(objects::Context {
            def: Arc::clone(&self.def),
            namespace: self.namespace().to_owned(),
            now: jiff::Timestamp::now(),
            field_validation: self.field_validation()?,
            admission: self.state.machine_admission,
            manager: crate::apply::Manager::of_request(
                self.query.get("fieldManager"),
                self.headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()),
                self.sub.as_deref(),
            ),
            dry_run: self.dry_run(),
        })
    }

    fn create(&self, body: &[u8]) -> Result<Response<Body>, ApiError> {
        let format = self.negotiate(false)?;
        let mut object = decode_object(self.headers, body)?;
        let name = object["metadata"]["name"].as_str();
        let namespace = self.namespace.as_deref();
        auth::authorize(
            &self.user,
            "create",
            &self.def,
            namespace,
            name,
            None,
            Some(&object),
        )?;
        let ctx = self.context()?;
        if csr::is_csr(&self.def) {
            csr::prepare_create(&self.state.pki, &self.user, &self.def, &mut object, ctx.now)?;
        }
        let Outcome { object, warnings, .. } = objects::create(&self.state.store, &ctx, object)?;
        Ok(respond_value(
            StatusCode::CREATED,
            &self.def.present(&object),
            format,
            &warnings,
        ))
    }

    fn update(&self, name: &str, body: &[u8]) -> Result<Response<Body>, ApiError> {
        let format = self.negotiate(false)?;
        let object = decode_object(self.headers, body)?;
        let ctx = self.context()?;
        let outcome = match self.sub.as_deref() {
            Some("scale") => objects::update_scale(&self.state.store, &ctx, name, &object)?,
            Some("approval") => {
                let change = csr::ApprovalChange::Replace(&object);
                csr::write_approval(&self.state.store, &ctx, &self.state.pki, name, change)?
            }
            Some(_) => objects::update_status(&self.state.store, &ctx, name, object)?,
            None => objects::update(&self.state.store, &ctx, name, object)?,
        };
        Ok(self.write_response(&outcome, format))
    }

    fn patch(&self, name: &str, body: &[u8]) -> Result<Response<Body>, ApiError> {
        let format = self.negotiate(false)?;
        let content_type = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if crate::apply::is_apply(content_type) {
            let ctx = self.context()?;
            let (outcome, created) = crate::apply::patch(
                &self.state.store,
                &ctx,
                name,
                self.sub.as_deref(),
                body,
                self.query.get("fieldManager"),
                self.query.flag("force"),
            )?;
            let mut response = self.write_response(&outcome, format);
            if created {
                *response.status_mut() = StatusCode::CREATED;
            }
            return Ok(response);
        }
        crate::apply::check_no_force(&self.query)?;
        let patch_type = objects::patch_type(&self.def, content_type)?;
        let ctx = self.context()?;
        if self.sub.as_deref() == Some("approval") {
            let change = csr::ApprovalChange::Patch(patch_type, body);
            let outcome = csr::write_approval(&self.state.store, &ctx, &self.state.pki, name, change)?;
            return Ok(self.write_response(&outcome, format));
        }
        let outcome = objects::patch(
            &self.state.store,
            &ctx,
            name,
            self.sub.as_deref(),
            patch_type,
            body,
        )?;
        Ok(self.write_response(&outcome, format))
    }

    fn write_response(&self, outcome: &Outcome, format: Format) -> Response<Body> {
        let body = if self.sub.as_deref() == Some("scale") {
            objects::scale_of(&self.def, &outcome.object)
        } else {
            self.def.present(&outcome.object).into_owned()
        };
        respond_value(StatusCode::OK, &body, format, &outcome.warnings)
    }

    fn evict(&self, name: &str, body: &[u8]) -> Result<Response<Body>, ApiError> {
        let format = self.negotiate(false)?;
        let eviction = decode_object(self.headers, body)?;
        let status = crate::disruption::evict(
            &self.state.store,
            &self.def,
            self.namespace(),
            name,
            &eviction,
            jiff::Timestamp::now(),
        )?;
        Ok(respond_value(StatusCode::CREATED, &status, format, &[]))
    }

    fn delete(&self, name: &str, body: &[u8]) -> Result<Response<Body>, ApiError> {
        let format = self.negotiate(false)?;
        let body = crate::protobuf::json_body(self.headers, body)?;
        let options = objects::DeleteOptions::parse(&body, &self.query)?;
        let mut ctx = self.context()?;
        ctx.dry_run |= options.dry_run;
        match objects::delete(&self.state.store, &ctx, name, &options)? {
            objects::Deleted::Gone(last) => {
                let uid = last["metadata"]["uid"].as_str().unwrap_or_default();
                Ok(respond_value(
                    StatusCode::OK,
                    &success_status(&self.def, name, uid),
                    format,
                    &[],
                ))
            }
            objects::Deleted::Marked(object) => Ok(respond_value(
                StatusCode::OK,
                &self.def.present(&object),
                format,
                &[],
            )),
        }
    }

    fn delete_collection(&self, body: &[u8]) -> Result<Response<Body>, ApiError> {
        let format = self.negotiate(false)?;
        let body = crate::protobuf::json_body(self.headers, body)?;
        let options = objects::DeleteOptions::parse(&body, &self.query)?;
        let (labels, fields) = self.selectors()?;
        let namespace = self.def.namespaced.then_some(()).and(self.namespace.as_deref());
        let (items, _) = self.state.store.list(&objects::resource_id(&self.def), namespace);
        let mut ctx = self.context()?;
        ctx.dry_run |= options.dry_run;
        let mut deleted = Vec::new();
        for item in items
            .iter()
            .filter(|item| labels.matches(&objects::labels(item)) && fields.matches(item))
        {
            let name = item["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            let mut item_ctx = ctx.clone();
            item["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .clone_into(&mut item_ctx.namespace);
            match objects::delete(&self.state.store, &item_ctx, &name, &options) {
                Ok(objects::Deleted::Gone(last) | objects::Deleted::Marked(last)) => {
                    deleted.push(self.def.present(&last).into_owned());
                }
                Err(ApiError::NotFound(_)) => {}
                Err(err) => return Err(err),
            }
        }
        let list = json!({
            "apiVersion": self.def.api_version(),
            "kind": self.def.list_kind(),
            "metadata": { "resourceVersion": self.state.store.current_rv().to_string() },
            "items": deleted,
        });
        Ok(respond_value(StatusCode::OK, &list, format, &[]))
    }
}
