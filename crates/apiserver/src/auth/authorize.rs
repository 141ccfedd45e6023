//! Authorization: the verb and name of a request, and [`authorize`], one pure function holding every rule (the
//! admin, the Node authorizer and NodeRestriction for kubelets, `system:node-bootstrapper` for bootstrap tokens)
//! with the 403 worded as kube-apiserver words it.

use http::Method;
use serde_json::Value;

use super::{NODE_LEASE_NAMESPACE, User};
use crate::{
    csr::is_csr,
    error::{ApiError, Subject},
    registry::ResourceDef,
    store::Store,
};

/// The Kubernetes verb of a resource request.
pub fn verb_of(method: &Method, named: bool, watch: bool) -> &'static str {
    match *method {
        Method::GET | Method::HEAD if watch => "watch",
        Method::GET | Method::HEAD if named => "get",
        Method::GET | Method::HEAD => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "unknown",
    }
}

/// The name a request is about: the one in its path, or for list and watch the one a `metadata.name=<name>`
/// field selector picks (as kube-apiserver's request info does, so that "get/list/watch this one object" can be
/// allowed).
pub fn request_name<'a>(
    verb: &str,
    path_name: Option<&'a str>,
    field_selector: Option<&'a str>,
) -> Option<&'a str> {
    if path_name.is_some() || !matches!(verb, "list" | "watch") {
        return path_name;
    }
    field_selector?.split(',').find_map(|term| {
        if term.contains("!=") {
            return None;
        }
        let (field, value) = term.split_once("==").or_else(|| term.split_once('='))?;
        (field.trim() == "metadata.name" && !value.is_empty()).then_some(value)
    })
}

/// [`authorize`] with the stored object the request names (for rules that depend on it: pods bound to a node,
/// CertificateSigningRequests by requestor). The store is not read for the admin.
pub fn authorize_stored(
    store: &Store,
    user: &User,
    verb: &str,
    def: &ResourceDef,
    namespace: Option<&str>,
    name: Option<&str>,
    subresource: Option<&str>,
) -> Result<(), ApiError> {
    if user.is_admin() {
        return Ok(());
    }
    let object = name.and_then(|name| {
        let namespace = if def.namespaced {
            namespace.unwrap_or_default()
        } else {
            ""
        };
        store.get(&format!("{}/{}", def.group, def.plural), namespace, name)
    });
    authorize(user, verb, def, namespace, name, subresource, object.as_deref())
}

/// Whether `user` may do `verb` to the resource `def` (its `subresource`), in `namespace` (None: cluster scope or
/// all namespaces), on the object `name` (None: the collection); `object` is the stored object when it exists (for
/// create, the object sent). 403 Forbidden otherwise, worded as kube-apiserver words it.
///
/// - The admin (`system:masters`) may do everything.
/// - A node `system:node:<name>` (group `system:nodes`) may get/list/watch nodes, pods, persistentvolumes,
///   persistentvolumeclaims, volumeattachments and the Leases in `kube-node-lease`; create its own Node and
///   get/update/patch it and its status; create/get/update/patch/delete its own Lease `kube-node-lease/<name>`;
///   update/patch the status of the pods bound to it (`spec.nodeName`) and delete them; create, update and patch
///   events (`v1` and `events.k8s.io`) anywhere; create CertificateSigningRequests and get/list/watch its own.
/// - A bootstrap token user may create CertificateSigningRequests and get/list/watch its own.
/// - Anyone else may do nothing to resources.
pub fn authorize(
    user: &User,
    verb: &str,
    def: &ResourceDef,
    namespace: Option<&str>,
    name: Option<&str>,
    subresource: Option<&str>,
    object: Option<&Value>,
) -> Result<(), ApiError> {
    if user.is_admin() {
        return Ok(());
    }
    let request = Request {
        verb,
        def,
        namespace: namespace.filter(|ns| def.namespaced && !ns.is_empty()),
        name: name.filter(|n| !n.is_empty()),
        subresource,
        object,
    };
    let decision = if let Some(node) = user.node_name() {
        node_rules(node, user, &request)
    } else if user.is_bootstrap() && is_csr(def) {
        csr_rules(user, &request)
    } else {
        Err("")
    };
    decision.map_err(|reason| forbidden(user, &request, reason))
}

/// One request, as the rules see it.
struct Request<'a> {
    verb: &'a str,
    def: &'a ResourceDef,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
    subresource: Option<&'a str>,
    object: Option<&'a Value>,
}

impl Request<'_> {
    fn reads(&self) -> bool {
        matches!(self.verb, "get" | "list" | "watch")
    }
}

/// What a node may do. Err carries the reason appended to the message (empty for a plain "cannot").
fn node_rules(node: &str, user: &User, request: &Request<'_>) -> Result<(), &'static str> {
    let own = |allowed: bool, reason: &'static str| if allowed { Ok(()) } else { Err(reason) };
    let sub = request.subresource;
    match (request.def.group.as_str(), request.def.plural.as_str()) {
        ("", "nodes") => match (request.verb, sub) {
            (_, None | Some("status")) if request.reads() => Ok(()),
            ("create", None) | ("update" | "patch", None | Some("status")) => own(
                request.name == Some(node),
                "a node may only create and change its own Node",
            ),
            _ => Err(""),
        },
        ("", "pods") => match (request.verb, sub) {
            (_, None | Some("status")) if request.reads() => Ok(()),
            ("update" | "patch", Some("status")) | ("delete", None) => own(
                request
                    .object
                    .is_some_and(|pod| pod["spec"]["nodeName"].as_str() == Some(node)),
                "a node may only change pods bound to it",
            ),
            _ => Err(""),
        },
        ("", "persistentvolumes" | "persistentvolumeclaims") | ("storage.k8s.io", "volumeattachments") => {
            own(request.reads() && sub.is_none(), "")
        }
        ("coordination.k8s.io", "leases") => {
            if request.namespace != Some(NODE_LEASE_NAMESPACE) || sub.is_some() {
                return Err("a node may only use Leases in kube-node-lease");
            }
            match request.verb {
                "get" | "list" | "watch" => Ok(()),
                "create" | "update" | "patch" | "delete" => {
                    own(request.name == Some(node), "a node may only change its own Lease")
                }
                _ => Err(""),
            }
        }
        ("" | "events.k8s.io", "events") => own(
            sub.is_none() && matches!(request.verb, "create" | "update" | "patch"),
            "",
        ),
        _ if is_csr(request.def) => csr_rules(user, request),
        _ => Err(""),
    }
}

/// What a node or a bootstrap token may do with CertificateSigningRequests: create them, and read those it created
/// (`spec.username`, which the server sets on create).
fn csr_rules(user: &User, request: &Request<'_>) -> Result<(), &'static str> {
    match (request.verb, request.subresource) {
        ("create", None) => Ok(()),
        (_, None) if request.reads() => {
            let requested_by_user = request
                .object
                .is_some_and(|csr| csr["spec"]["username"].as_str() == Some(user.name.as_str()));
            if requested_by_user {
                Ok(())
            } else {
                Err("only the CertificateSigningRequests this user created can be read")
            }
        }
        _ => Err(""),
    }
}

/// The 403 kube-apiserver sends: `<resource>.<group> "<name>" is forbidden: User "<user>" cannot <verb> resource
/// "<resource>[/<subresource>]" in API group "<group>" in the namespace "<ns>"` (or `at the cluster scope`), then
/// `: <reason>` when there is one.
fn forbidden(user: &User, request: &Request<'_>, reason: &str) -> ApiError {
    let def = request.def;
    let resource = match request.subresource {
        Some(sub) => format!("{}/{sub}", def.plural),
        None => def.plural.clone(),
    };
    let scope = match request.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_owned(),
    };
    let mut why = format!(
        "User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
        user.name, request.verb, def.group
    );
    if !reason.is_empty() {
        why.push_str(": ");
        why.push_str(reason);
    }
    let qualified = def.group_resource();
    let message = match request.name {
        Some(name) => format!("{qualified} \"{name}\" is forbidden: {why}"),
        None => format!("{qualified} is forbidden: {why}"),
    };
    ApiError::ForbiddenResource(Subject {
        message,
        name: request.name.unwrap_or_default().to_owned(),
        group: def.group.clone(),
        kind: def.plural.clone(),
    })
}
