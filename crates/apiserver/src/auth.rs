//! Who is calling, and what they may do.
//!
//! **Authentication.** A request carries a bearer token or a client certificate (see docs/apiserver.md, "Node
//! credentials"):
//! - the admin token (user `admin`, group `system:masters`), allowed everything;
//! - the tokens of a static token file (`--token-auth-file`, kube-apiserver's format, [`TokenFile`]): each line
//!   names a user and its groups; a user in `system:masters` is allowed everything like the admin;
//! - a bootstrap token `<token-id>.<token-secret>`, valid while the Secret `kube-system/bootstrap-token-<token-id>`
//!   of type `bootstrap.kubernetes.io/token` says so (user `system:bootstrap:<token-id>`, groups
//!   `system:bootstrappers` and the secret's `auth-extra-groups`); the Secret is read on every request, so deleting
//!   it revokes the token at once;
//! - a client certificate the server's CA signed (verified during the TLS handshake): CN is the user, each O a
//!   group, except `system:masters`, which only the admin token carries.
//!
//! **Authorization** is [`authorize`], one pure function holding every rule: what kube-apiserver's Node authorizer
//! and NodeRestriction admission allow a kubelet, what the `system:node-bootstrapper` role allows a bootstrap token,
//! and everything for the admin.
//!
//! Tokens and token secrets never appear in a log line or an error.

use std::sync::Arc;

use base64::Engine as _;
use http::Method;
use serde_json::Value;

use crate::{
    csr::is_csr,
    error::{ApiError, Subject},
    registry::ResourceDef,
    store::Store,
    x509,
};

/// The group of the admin, allowed everything.
pub const ADMIN_GROUP: &str = "system:masters";
/// The group of node credentials.
pub const NODES_GROUP: &str = "system:nodes";
/// User names of nodes: `system:node:<node name>`.
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The group of every bootstrap token user.
pub const BOOTSTRAPPERS_GROUP: &str = "system:bootstrappers";
/// User names of bootstrap tokens: `system:bootstrap:<token-id>`.
pub const BOOTSTRAP_USER_PREFIX: &str = "system:bootstrap:";
/// The type of a bootstrap token Secret.
pub const BOOTSTRAP_TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// Bootstrap token Secrets are named `bootstrap-token-<token-id>`.
pub const BOOTSTRAP_TOKEN_SECRET_PREFIX: &str = "bootstrap-token-";
/// Bootstrap token Secrets live here.
pub const BOOTSTRAP_TOKEN_NAMESPACE: &str = "kube-system";
/// Node Leases live here.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// Who is calling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// The user name (`admin`, `system:node:<name>`, `system:bootstrap:<token-id>`).
    pub name: String,
    /// The groups (`system:masters` for the admin).
    pub groups: Vec<String>,
}

impl User {
    /// Member of `system:masters`: the admin token, and the users of the static token file in that group.
    pub fn is_admin(&self) -> bool {
        self.in_group(ADMIN_GROUP)
    }

    /// The node name of a node credential: user `system:node:<name>` in group `system:nodes`.
    pub fn node_name(&self) -> Option<&str> {
        self.name
            .strip_prefix(NODE_USER_PREFIX)
            .filter(|name| !name.is_empty() && self.in_group(NODES_GROUP))
    }

    /// A bootstrap token user (group `system:bootstrappers`).
    pub fn is_bootstrap(&self) -> bool {
        self.in_group(BOOTSTRAPPERS_GROUP)
    }

    fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// Turns a bearer token into a user.
pub trait Authenticator: Send + Sync {
    /// The user for this token, or None.
    fn authenticate(&self, token: &str) -> Option<User>;
}

/// Authenticates the one admin token.
pub struct AdminToken(pub String);

impl Authenticator for AdminToken {
    fn authenticate(&self, token: &str) -> Option<User> {
        constant_time_eq(token.as_bytes(), self.0.as_bytes()).then(|| User {
            name: "admin".into(),
            groups: vec![ADMIN_GROUP.into()],
        })
    }
}

/// Several authenticators: the first that knows the token wins.
pub struct Authenticators(pub Vec<Box<dyn Authenticator>>);

impl Authenticator for Authenticators {
    fn authenticate(&self, token: &str) -> Option<User> {
        self.0.iter().find_map(|auth| auth.authenticate(token))
    }
}

/// Compares without an early exit, so that the time taken does not tell how much of a secret matched.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The users of a static token file, kube-apiserver's `--token-auth-file`: a CSV file with one record per token,
/// `token,user,uid[,"group1,group2,..."]`. Read once at start (as kube-apiserver does; a change needs a restart).
///
/// The format follows kube-apiserver (Go's `encoding/csv` with a variable number of fields): fields may be quoted
/// with `"` (a quote inside is doubled, and a quoted field may hold commas and newlines), empty lines are skipped,
/// there are no comments, and a record needs at least three fields (token, user name, uid) or the file is refused.
/// A record with an empty token is skipped; when a token appears twice, the later record wins. The groups are the
/// fourth field split at commas (empty names dropped); `system:masters` makes the user an admin. The uid is read
/// and not used (nothing here records it). One difference: a record with an empty user name is refused (kube-apiserver
/// would authenticate a user without a name).
///
/// Tokens are compared in constant time, never logged, and never part of an error: errors name the line.
pub struct TokenFile {
    /// (token, user), in file order; a later duplicate token wins.
    entries: Vec<(String, User)>,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens.
        f.debug_struct("TokenFile")
            .field(
                "users",
                &self.users().map(|u| u.name.as_str()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A static token file that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("token file {path}: {reason}")]
pub struct TokenFileError {
    /// The file.
    pub path: std::path::PathBuf,
    /// Why (a line number and what is wrong with it; never a token).
    pub reason: String,
}

impl TokenFile {
    /// Reads and parses the file at `path`.
    pub fn load(path: &std::path::Path) -> Result<Self, TokenFileError> {
        let error = |reason: String| TokenFileError {
            path: path.to_owned(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|err| error(err.to_string()))?;
        Self::parse(&text).map_err(error)
    }

    /// Parses the text of a token file; Err names the line and the problem.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries: Vec<(String, User)> = Vec::new();
        for (line, fields) in csv_records(text)? {
            if fields.len() < 3 {
                return Err(format!(
                    "line {line}: a record must have at least 3 columns (token, user name, user uid), found {}",
                    fields.len()
                ));
            }
            let mut fields = fields.into_iter();
            let (token, name) = (
                fields.next().unwrap_or_default(),
                fields.next().unwrap_or_default(),
            );
            let _uid = fields.next();
            if token.is_empty() {
                tracing::warn!(line, "token file: a record with an empty token is skipped");
                continue;
            }
            if name.is_empty() {
                return Err(format!("line {line}: the user name is empty"));
            }
            let groups = fields
                .next()
                .map(|groups| {
                    groups
                        .split(',')
                        .filter(|g| !g.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            if let Some(index) = entries
                .iter()
                .position(|(known, _)| constant_time_eq(known.as_bytes(), token.as_bytes()))
            {
                tracing::warn!(line, "token file: a token appears twice; the later record wins");
                entries.remove(index);
            }
            entries.push((token, User { name, groups }));
        }
        Ok(Self { entries })
    }

    /// The users, in file order.
    pub fn users(&self) -> impl Iterator<Item = &User> {
        self.entries.iter().map(|(_, user)| user)
    }
}

impl Authenticator for TokenFile {
    fn authenticate(&self, token: &str) -> Option<User> {
        // Every entry is compared (tokens are unique after parsing), so the time taken does not tell which matched.
        let mut found = None;
        for (known, user) in &self.entries {
            if constant_time_eq(known.as_bytes(), token.as_bytes()) {
                found = Some(user);
            }
        }
        found.cloned()
    }
}

/// The records of a CSV text as Go's `encoding/csv` reads them by default (variable field count): (line of the
/// record's start, fields). Quoted fields may hold commas, newlines and doubled quotes; a quote inside an unquoted
/// field or after a quoted one is an error; empty lines are skipped; `\r\n` ends a line like `\n`.
fn csv_records(text: &str) -> Result<Vec<(usize, Vec<String>)>, String> {
    let text = text.replace("\r\n", "\n");
    let mut chars = text.chars().peekable();
    let mut records = Vec::new();
    let mut line = 1;
    while let Some(&first) = chars.peek() {
        if first == '\n' {
            chars.next();
            line += 1;
            continue;
        }
        let start = line;
        let mut fields = Vec::new();
        loop {
            let mut field = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                loop {
                    match chars.next() {
                        None => return Err(format!("line {start}: a quoted field is not closed")),
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            field.push('"');
                        }
                        Some('"') => break,
                        Some(c) => {
                            if c == '\n' {
                                line += 1;
                            }
                            field.push(c);
                        }
                    }
                }
                if !matches!(chars.peek(), None | Some(',' | '\n')) {
                    return Err(format!("line {line}: extraneous or missing \" in a quoted field"));
                }
            } else {
                while let Some(&c) = chars.peek() {
                    match c {
                        ',' | '\n' => break,
                        '"' => return Err(format!("line {line}: bare \" in a non-quoted field")),
                        _ => {
                            field.push(c);
                            chars.next();
                        }
                    }
                }
            }
            fields.push(field);
            match chars.next() {
                Some(',') => {}
                Some('\n') => {
                    line += 1;
                    break;
                }
                _ => break,
            }
        }
        records.push((start, fields));
    }
    Ok(records)
}

/// Authenticates bootstrap tokens against their Secrets in `kube-system`, read from the store on every request.
pub struct BootstrapTokens {
    store: Arc<Store>,
}

impl BootstrapTokens {
    /// Bootstrap tokens whose Secrets are in this store.
    pub fn new(store: Arc<Store>) -> Self {
        Self { store }
    }
}

impl Authenticator for BootstrapTokens {
    fn authenticate(&self, token: &str) -> Option<User> {
        let (id, secret) = split_bootstrap_token(token)?;
        let name = format!("{BOOTSTRAP_TOKEN_SECRET_PREFIX}{id}");
        let Some(object) = self.store.get("/secrets", BOOTSTRAP_TOKEN_NAMESPACE, &name) else {
            tracing::debug!(token_id = id, "bootstrap token refused: no secret");
            return None;
        };
        match bootstrap_user(&object, id, secret, jiff::Timestamp::now()) {
            Ok(user) => Some(user),
            Err(why) => {
                // The token id is public (it names the Secret); the secret part is never logged.
                tracing::debug!(token_id = id, reason = why, "bootstrap token refused");
                None
            }
        }
    }
}

/// `<token-id>.<token-secret>` with id `[a-z0-9]{6}` and secret `[a-z0-9]{16}`.
fn split_bootstrap_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let valid = |part: &str, len: usize| {
        part.len() == len && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (valid(id, 6) && valid(secret, 16)).then_some((id, secret))
}

/// A key of a Secret's `data`, decoded; None when missing or not base64 UTF-8.
fn secret_data(secret: &Value, key: &str) -> Option<String> {
    let encoded = secret["data"][key].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).ok()?;
    String::from_utf8(bytes).ok()
}

/// The user a bootstrap token Secret grants to `<id>.<secret>` at `now`, or why it grants nothing (for the debug
/// log; never the secret). Kubernetes' rules: type `bootstrap.kubernetes.io/token`, not being deleted, matching
/// `token-id` and `token-secret` (compared in constant time), `usage-bootstrap-authentication: "true"`, no
/// `expiration` (RFC 3339) in the past, every `auth-extra-groups` entry of the form `system:bootstrappers:...`.
pub fn bootstrap_user(
    secret: &Value,
    id: &str,
    token_secret: &str,
    now: jiff::Timestamp,
) -> Result<User, &'static str> {
    if secret["type"].as_str() != Some(BOOTSTRAP_TOKEN_SECRET_TYPE) {
        return Err("the secret is not of type bootstrap.kubernetes.io/token");
    }
    if !secret["metadata"]["deletionTimestamp"].is_null() {
        return Err("the secret is being deleted");
    }
    if secret_data(secret, "token-id").as_deref() != Some(id) {
        return Err("token-id does not match");
    }
    let stored = secret_data(secret, "token-secret").unwrap_or_default();
    if !constant_time_eq(stored.as_bytes(), token_secret.as_bytes()) {
        return Err("token-secret does not match");
    }
    if secret_data(secret, "usage-bootstrap-authentication").as_deref() != Some("true") {
        return Err("the token is not for authentication");
    }
    if let Some(expiration) = secret_data(secret, "expiration") {
        match expiration.trim().parse::<jiff::Timestamp>() {
            Ok(at) if at > now => {}
            Ok(_) => return Err("the token has expired"),
            Err(_) => return Err("the expiration is not an RFC 3339 time"),
        }
    }
    let mut groups = vec![BOOTSTRAPPERS_GROUP.to_owned()];
    if let Some(extra) = secret_data(secret, "auth-extra-groups") {
        for group in extra.split(',').map(str::trim).filter(|g| !g.is_empty()) {
            if !is_bootstrap_group(group) {
                return Err("auth-extra-groups holds a group outside system:bootstrappers:");
            }
            if !groups.iter().any(|g| g == group) {
                groups.push(group.to_owned());
            }
        }
    }
    Ok(User {
        name: format!("{BOOTSTRAP_USER_PREFIX}{id}"),
        groups,
    })
}

/// `system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]`, as Kubernetes validates extra groups.
fn is_bootstrap_group(group: &str) -> bool {
    let Some(rest) = group.strip_prefix("system:bootstrappers:") else {
        return false;
    };
    let bytes = rest.as_bytes();
    let allowed = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b':' || *b == b'-';
    !bytes.is_empty()
        && bytes.len() <= 256
        && bytes.iter().all(allowed)
        && bytes
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The user of the connection's verified client certificate, put into each request's extensions by the server;
/// used when a request has no bearer token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCertificateUser(pub User);

/// The user of a client certificate the TLS layer verified against the CA: CN is the name, each O a group.
/// `system:masters` is dropped (only the admin token is admin); None without exactly one non-empty CN.
pub fn user_from_certificate(der: &[u8]) -> Option<User> {
    let subject = x509::certificate_subject(der).ok()?;
    let name = subject.common_name().filter(|n| !n.is_empty())?.to_owned();
    let groups = subject
        .organizations
        .into_iter()
        .filter(|group| group != ADMIN_GROUP)
        .collect();
    Some(User { name, groups })
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn user(name: &str, groups: &[&str]) -> User {
        User {
            name: name.to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    fn node(name: &str) -> User {
        user(&format!("system:node:{name}"), &[NODES_GROUP])
    }

    fn admin() -> User {
        user("admin", &[ADMIN_GROUP])
    }

    fn bootstrap() -> User {
        user("system:bootstrap:abcdef", &[BOOTSTRAPPERS_GROUP])
    }

    fn def(group: &str, plural: &str) -> Arc<ResourceDef> {
        let registry = Registry::new();
        let version = if group.is_empty() || group.ends_with("k8s.io") || group == "policy" {
            "v1"
        } else {
            "v1alpha1"
        };
        registry
            .find(group, version, plural)
            .unwrap_or_else(|| panic!("{group}/{plural} is served"))
    }

    /// Shorthand: may `user` do `verb` on `group/plural` [`sub`] `ns/name`, with the stored `object`?
    fn may(
        user: &User,
        verb: &str,
        (group, plural, sub): (&str, &str, Option<&str>),
        ns: Option<&str>,
        name: Option<&str>,
        object: Option<&Value>,
    ) -> bool {
        authorize(user, verb, &def(group, plural), ns, name, sub, object).is_ok()
    }

    const NODES: (&str, &str, Option<&str>) = ("", "nodes", None);
    const NODE_STATUS: (&str, &str, Option<&str>) = ("", "nodes", Some("status"));
    const PODS: (&str, &str, Option<&str>) = ("", "pods", None);
    const POD_STATUS: (&str, &str, Option<&str>) = ("", "pods", Some("status"));
    const LEASES: (&str, &str, Option<&str>) = ("coordination.k8s.io", "leases", None);
    const CSRS: (&str, &str, Option<&str>) = ("certificates.k8s.io", "certificatesigningrequests", None);
    const SECRETS: (&str, &str, Option<&str>) = ("", "secrets", None);
    const LEASE_NS: Option<&str> = Some(NODE_LEASE_NAMESPACE);

    #[test]
    fn the_admin_may_do_everything() {
        let admin = admin();
        for verb in [
            "get",
            "list",
            "watch",
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
        ] {
            assert!(may(&admin, verb, SECRETS, Some("kube-system"), Some("x"), None));
            assert!(may(
                &admin,
                verb,
                ("machine.sapcloud.io", "machines", None),
                Some("default"),
                None,
                None
            ));
        }
        assert!(may(
            &admin,
            "update",
            (
                "certificates.k8s.io",
                "certificatesigningrequests",
                Some("approval")
            ),
            None,
            Some("c"),
            None
        ));
    }

    #[test]
    fn a_node_reads_nodes_pods_and_volumes_but_not_secrets_or_machines() {
        let n1 = node("n1");
        for resource in [
            NODES,
            NODE_STATUS,
            PODS,
            ("", "persistentvolumes", None),
            ("", "persistentvolumeclaims", None),
            ("storage.k8s.io", "volumeattachments", None),
        ] {
            for verb in ["get", "list", "watch"] {
                let name = (verb == "get").then_some("x");
                assert!(
                    may(&n1, verb, resource, Some("default"), name, None),
                    "{verb} {resource:?}"
                );
            }
        }
        for verb in ["get", "list", "watch", "create", "delete"] {
            assert!(!may(
                &n1,
                verb,
                SECRETS,
                Some("kube-system"),
                Some("bootstrap-token-abcdef"),
                None
            ));
            assert!(!may(
                &n1,
                verb,
                ("machine.sapcloud.io", "machines", None),
                Some("default"),
                Some("m"),
                None
            ));
            assert!(!may(
                &n1,
                verb,
                ("", "namespaces", None),
                None,
                Some("default"),
                None
            ));
        }
        assert!(!may(
            &n1,
            "create",
            ("", "persistentvolumes", None),
            None,
            Some("pv"),
            None
        ));
        assert!(!may(
            &n1,
            "delete",
            ("storage.k8s.io", "volumeattachments", None),
            None,
            Some("va"),
            None
        ));
    }

    #[test]
    fn a_node_creates_and_changes_only_its_own_node() {
        let n1 = node("n1");
        for (verb, resource) in [
            ("create", NODES),
            ("update", NODES),
            ("patch", NODES),
            ("update", NODE_STATUS),
            ("patch", NODE_STATUS),
        ] {
            assert!(
                may(&n1, verb, resource, None, Some("n1"), None),
                "{verb} {resource:?} n1"
            );
            assert!(
                !may(&n1, verb, resource, None, Some("n2"), None),
                "{verb} {resource:?} n2"
            );
        }
        assert!(
            !may(&n1, "create", NODES, None, None, None),
            "a node without a name"
        );
        assert!(!may(&n1, "delete", NODES, None, Some("n1"), None));
        assert!(!may(&n1, "deletecollection", NODES, None, None, None));
    }

    #[test]
    fn a_node_uses_only_its_own_lease_in_kube_node_lease() {
        let n1 = node("n1");
        for verb in ["create", "get", "update", "patch", "delete"] {
            assert!(may(&n1, verb, LEASES, LEASE_NS, Some("n1"), None), "{verb} n1");
        }
        for verb in ["create", "update", "patch", "delete"] {
            assert!(!may(&n1, verb, LEASES, LEASE_NS, Some("n2"), None), "{verb} n2");
        }
        assert!(may(&n1, "get", LEASES, LEASE_NS, Some("n2"), None));
        assert!(may(&n1, "list", LEASES, LEASE_NS, None, None));
        assert!(
            !may(&n1, "list", LEASES, None, None, None),
            "leases of all namespaces"
        );
        assert!(!may(&n1, "get", LEASES, Some("kube-system"), Some("n1"), None));
        assert!(!may(&n1, "create", LEASES, Some("default"), Some("n1"), None));
        assert!(!may(&n1, "deletecollection", LEASES, LEASE_NS, None, None));
    }

    #[test]
    fn a_node_changes_the_status_of_and_deletes_only_pods_bound_to_it() {
        let n1 = node("n1");
        let mine = json!({ "spec": { "nodeName": "n1" } });
        let theirs = json!({ "spec": { "nodeName": "n2" } });
        let unbound = json!({ "spec": {} });
        for (verb, resource) in [("update", POD_STATUS), ("patch", POD_STATUS), ("delete", PODS)] {
            assert!(
                may(&n1, verb, resource, Some("default"), Some("p"), Some(&mine)),
                "{verb}"
            );
            assert!(
                !may(&n1, verb, resource, Some("default"), Some("p"), Some(&theirs)),
                "{verb}"
            );
            assert!(
                !may(&n1, verb, resource, Some("default"), Some("p"), Some(&unbound)),
                "{verb}"
            );
            assert!(
                !may(&n1, verb, resource, Some("default"), Some("p"), None),
                "{verb} missing"
            );
        }
        for verb in ["create", "update", "patch"] {
            assert!(
                !may(&n1, verb, PODS, Some("default"), Some("p"), Some(&mine)),
                "{verb} pod spec"
            );
        }
        assert!(!may(
            &n1,
            "create",
            ("", "pods", Some("eviction")),
            Some("default"),
            Some("p"),
            Some(&mine)
        ));
        assert!(!may(&n1, "deletecollection", PODS, Some("default"), None, None));
    }

    #[test]
    fn a_node_records_events_anywhere() {
        let n1 = node("n1");
        for group in ["", "events.k8s.io"] {
            for ns in ["default", "kube-system"] {
                assert!(may(
                    &n1,
                    "create",
                    (group, "events", None),
                    Some(ns),
                    Some("e"),
                    None
                ));
                assert!(may(
                    &n1,
                    "patch",
                    (group, "events", None),
                    Some(ns),
                    Some("e"),
                    None
                ));
            }
            assert!(!may(
                &n1,
                "delete",
                (group, "events", None),
                Some("default"),
                Some("e"),
                None
            ));
        }
    }

    #[test]
    fn nodes_and_bootstrap_tokens_create_csrs_and_read_only_their_own() {
        let own = |user: &User| json!({ "spec": { "username": user.name } });
        let other = json!({ "spec": { "username": "system:bootstrap:zzzzzz" } });
        for user in [node("n1"), bootstrap()] {
            assert!(may(&user, "create", CSRS, None, None, None));
            for verb in ["get", "list", "watch"] {
                assert!(
                    may(&user, verb, CSRS, None, Some("c"), Some(&own(&user))),
                    "{verb}"
                );
                assert!(!may(&user, verb, CSRS, None, Some("c"), Some(&other)), "{verb}");
                assert!(!may(&user, verb, CSRS, None, Some("c"), None), "{verb} missing");
            }
            assert!(!may(&user, "list", CSRS, None, None, None), "every CSR");
            for (verb, sub) in [
                ("update", None),
                ("patch", None),
                ("delete", None),
                ("update", Some("approval")),
                ("patch", Some("status")),
            ] {
                let resource = ("certificates.k8s.io", "certificatesigningrequests", sub);
                assert!(
                    !may(&user, verb, resource, None, Some("c"), Some(&own(&user))),
                    "{verb} {sub:?}"
                );
            }
        }
    }

    #[test]
    fn a_bootstrap_token_may_do_nothing_else() {
        let b = bootstrap();
        for verb in ["get", "list", "create"] {
            assert!(!may(&b, verb, SECRETS, Some("kube-system"), None, None));
            assert!(!may(&b, verb, NODES, None, Some("n1"), None));
            assert!(!may(&b, verb, LEASES, LEASE_NS, Some("n1"), None));
        }
    }

    #[test]
    fn other_users_may_do_nothing_and_a_node_name_needs_the_nodes_group() {
        for stranger in [
            user("system:node:n1", &[]),
            user("mcm-apiserver", &[]),
            user("someone", &["system:authenticated"]),
        ] {
            assert!(
                !may(&stranger, "get", NODES, None, Some("n1"), None),
                "{stranger:?}"
            );
            assert!(!may(&stranger, "create", CSRS, None, None, None), "{stranger:?}");
        }
    }

    #[test]
    fn forbidden_is_worded_and_detailed_as_kubernetes_does() {
        let error = authorize(
            &node("n1"),
            "patch",
            &def("", "nodes"),
            None,
            Some("n2"),
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "nodes \"n2\" is forbidden: User \"system:node:n1\" cannot patch resource \"nodes\" in API group \"\" at \
             the cluster scope: a node may only create and change its own Node"
        );
        let status = error.to_status();
        assert_eq!(status["code"], 403);
        assert_eq!(status["reason"], "Forbidden");
        assert_eq!(status["details"], json!({ "name": "n2", "kind": "nodes" }));

        let error = authorize(
            &node("n1"),
            "list",
            &def("", "secrets"),
            Some("kube-system"),
            None,
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "secrets is forbidden: User \"system:node:n1\" cannot list resource \"secrets\" in API group \"\" in the \
             namespace \"kube-system\""
        );
        let error = authorize(
            &node("n1"),
            "update",
            &def("coordination.k8s.io", "leases"),
            LEASE_NS,
            Some("n2"),
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(
            error.to_status()["details"],
            json!({ "name": "n2", "group": "coordination.k8s.io", "kind": "leases" })
        );
        assert!(error.to_string().starts_with(
            "leases.coordination.k8s.io \"n2\" is forbidden: User \"system:node:n1\" cannot update resource \
             \"leases\" in API group \"coordination.k8s.io\" in the namespace \"kube-node-lease\""
        ));
        let error = authorize(
            &node("n1"),
            "patch",
            &def("", "pods"),
            Some("default"),
            Some("p"),
            Some("status"),
            None,
        )
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("cannot patch resource \"pods/status\""),
            "{error}"
        );
    }

    fn token_secret(data: &[(&str, &str)]) -> Value {
        let encode = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(encode(v))))
            .collect();
        json!({
            "metadata": { "name": "bootstrap-token-abcdef", "namespace": "kube-system" },
            "type": BOOTSTRAP_TOKEN_SECRET_TYPE,
            "data": data,
        })
    }

    const VALID: &[(&str, &str)] = &[
        ("token-id", "abcdef"),
        ("token-secret", "0123456789abcdef"),
        ("usage-bootstrap-authentication", "true"),
    ];

    #[test]
    fn a_valid_bootstrap_token_is_a_bootstrapper_with_its_extra_groups() {
        let now = jiff::Timestamp::now();
        let user = bootstrap_user(&token_secret(VALID), "abcdef", "0123456789abcdef", now).unwrap();
        assert_eq!(user, bootstrap());

        let mut data = VALID.to_vec();
        data.push((
            "auth-extra-groups",
            "system:bootstrappers:kubeadm:default-node-token, system:bootstrappers:w",
        ));
        data.push(("expiration", "2999-01-01T00:00:00Z"));
        let user = bootstrap_user(&token_secret(&data), "abcdef", "0123456789abcdef", now).unwrap();
        assert_eq!(
            user.groups,
            [
                "system:bootstrappers",
                "system:bootstrappers:kubeadm:default-node-token",
                "system:bootstrappers:w"
            ]
        );
    }

    #[test]
    fn a_bootstrap_token_is_refused_when_any_rule_fails() {
        let now = jiff::Timestamp::now();
        let refused = |data: &[(&str, &str)], secret: &str| {
            bootstrap_user(&token_secret(data), "abcdef", secret, now).is_err()
        };
        let with = |key: &'static str, value: &'static str| {
            let mut data: Vec<(&str, &str)> = VALID.iter().filter(|(k, _)| *k != key).copied().collect();
            data.push((key, value));
            data
        };
        let without = |key: &str| {
            VALID
                .iter()
                .filter(|(k, _)| *k != key)
                .copied()
                .collect::<Vec<_>>()
        };
        assert!(refused(VALID, "0123456789abcdee"), "wrong secret");
        assert!(
            refused(&with("token-id", "abcdeg"), "0123456789abcdef"),
            "other id"
        );
        assert!(refused(
            &with("usage-bootstrap-authentication", "false"),
            "0123456789abcdef"
        ));
        assert!(refused(
            &without("usage-bootstrap-authentication"),
            "0123456789abcdef"
        ));
        assert!(refused(&without("token-secret"), "0123456789abcdef"));
        assert!(
            refused(&with("expiration", "2000-01-01T00:00:00Z"), "0123456789abcdef"),
            "expired"
        );
        assert!(
            refused(&with("expiration", "tomorrow"), "0123456789abcdef"),
            "unreadable expiry"
        );
        assert!(refused(
            &with("auth-extra-groups", "system:masters"),
            "0123456789abcdef"
        ));
        assert!(refused(
            &with("auth-extra-groups", "system:bootstrappers:"),
            "0123456789abcdef"
        ));

        let mut wrong_type = token_secret(VALID);
        wrong_type["type"] = json!("Opaque");
        assert!(bootstrap_user(&wrong_type, "abcdef", "0123456789abcdef", now).is_err());
        let mut deleting = token_secret(VALID);
        deleting["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        assert!(bootstrap_user(&deleting, "abcdef", "0123456789abcdef", now).is_err());
    }

    #[test]
    fn bootstrap_tokens_have_the_kubernetes_shape() {
        assert_eq!(
            split_bootstrap_token("abcdef.0123456789abcdef"),
            Some(("abcdef", "0123456789abcdef"))
        );
        for bad in [
            "abcdef0123456789abcdef",
            "abcde.0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcdef.0123456789abcde",
            "abcdef.0123456789abcdef.x",
            "abcdef.0123456789abcdeF",
            "",
        ] {
            assert_eq!(split_bootstrap_token(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_admin_token_and_the_chain() {
        let chain = Authenticators(vec![Box::new(AdminToken("s3cret".into()))]);
        assert_eq!(chain.authenticate("s3cret"), Some(admin()));
        assert_eq!(chain.authenticate("s3cre"), None);
        assert_eq!(chain.authenticate(""), None);
    }

    #[test]
    fn a_token_file_record_is_token_user_uid_and_groups_as_kube_apiserver_reads_it() {
        let file = TokenFile::parse(concat!(
            "t0k3n-a,system:serviceaccount:mcm:mcm,uid-1,\"system:masters,team-a\"\n",
            "\n",
            "t0k3n-b,bob,uid-2\r\n",
            "t0k3n-c,\"carol, the \"\"admin\"\"\",uid-3,\"g1,,g2\",ignored-extra\n",
            "t0k3n-d,dave,uid-4,",
        ))
        .unwrap();
        assert_eq!(
            file.authenticate("t0k3n-a"),
            Some(user("system:serviceaccount:mcm:mcm", &[ADMIN_GROUP, "team-a"]))
        );
        assert!(file.authenticate("t0k3n-a").unwrap().is_admin());
        assert_eq!(file.authenticate("t0k3n-b"), Some(user("bob", &[])));
        assert!(!file.authenticate("t0k3n-b").unwrap().is_admin());
        assert_eq!(
            file.authenticate("t0k3n-c"),
            Some(user("carol, the \"admin\"", &["g1", "g2"]))
        );
        assert_eq!(file.authenticate("t0k3n-d"), Some(user("dave", &[])));
        for wrong in ["t0k3n", "t0k3n-a ", "T0K3N-A", ""] {
            assert_eq!(file.authenticate(wrong), None, "{wrong:?}");
        }
        assert_eq!(file.users().count(), 4);
    }

    #[test]
    fn a_token_file_skips_empty_tokens_and_the_later_duplicate_wins() {
        let file = TokenFile::parse(",nobody,uid-0\nsame,first,1\nsame,second,2,g\n").unwrap();
        assert_eq!(file.authenticate("same"), Some(user("second", &["g"])));
        assert_eq!(file.authenticate(""), None);
        assert_eq!(file.users().count(), 1);
        // A quoted field may span lines: the next record starts after it.
        let file = TokenFile::parse("a,\"multi\nline\",u\nb,next,u\n").unwrap();
        assert_eq!(file.authenticate("a").unwrap().name, "multi\nline");
        assert_eq!(file.authenticate("b").unwrap().name, "next");
    }

    #[test]
    fn a_malformed_token_file_is_refused_naming_the_line_and_never_the_token() {
        for (text, line, why) in [
            ("s3cret-1,alice\n", "line 1", "at least 3 columns"),
            ("s3cret-1,alice,u\n# comment\n", "line 2", "at least 3 columns"),
            ("s3cret-1,alice,u\ns3cret-2,,u\n", "line 2", "user name is empty"),
            ("s3cret-1,al\"ice,u\n", "line 1", "bare \""),
            ("s3cret-1,\"alice\"x,u\n", "line 1", "extraneous"),
            ("s3cret-1,alice,u\ns3cret-2,\"bob,u\n", "line 2", "not closed"),
        ] {
            let error = TokenFile::parse(text).unwrap_err();
            assert!(error.contains(line) && error.contains(why), "{text:?}: {error}");
            assert!(!error.contains("s3cret"), "{error}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.csv");
        std::fs::write(&path, "s3cret-1,alice\n").unwrap();
        let error = TokenFile::load(&path).unwrap_err().to_string();
        assert!(
            error.contains("tokens.csv") && error.contains("line 1"),
            "{error}"
        );
        assert!(!error.contains("s3cret"), "{error}");
        assert!(TokenFile::load(&dir.path().join("missing.csv")).is_err());
        let file = TokenFile::parse("s3cret-1,alice,u\n").unwrap();
        assert!(!format!("{file:?}").contains("s3cret"), "{file:?}");
    }

    #[test]
    fn token_file_users_are_authorized_by_their_groups() {
        let file =
            TokenFile::parse("a,mcm,u,system:masters\nb,viewer,u,team\nc,system:node:n1,u,system:nodes\n")
                .unwrap();
        let mcm = file.authenticate("a").unwrap();
        assert!(may(&mcm, "delete", NODES, None, Some("n2"), None));
        let viewer = file.authenticate("b").unwrap();
        assert!(!may(&viewer, "get", NODES, None, Some("n1"), None));
        let node = file.authenticate("c").unwrap();
        assert_eq!(node.node_name(), Some("n1"));
        assert!(may(&node, "get", NODES, None, Some("n2"), None));
        assert!(!may(&node, "patch", NODES, None, Some("n2"), None));
    }

    #[test]
    fn a_certificate_user_is_cn_and_o_without_system_masters() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        let mut name = rcgen::DistinguishedName::new();
        name.push(rcgen::DnType::CommonName, "system:node:n1");
        name.push(rcgen::DnType::OrganizationName, "system:nodes");
        name.push(rcgen::DnType::CustomDnType(vec![2, 5, 4, 10]), ADMIN_GROUP);
        params.distinguished_name = name;
        let certificate = params.self_signed(&key).unwrap();
        let user = user_from_certificate(certificate.der()).unwrap();
        assert_eq!(user, node("n1"));
        assert_eq!(user.node_name(), Some("n1"));
        assert!(!user.is_admin());
        assert_eq!(user_from_certificate(b"junk"), None);
    }

    #[test]
    fn verbs_and_the_name_of_a_request() {
        assert_eq!(verb_of(&Method::GET, true, false), "get");
        assert_eq!(verb_of(&Method::GET, false, false), "list");
        assert_eq!(verb_of(&Method::GET, false, true), "watch");
        assert_eq!(verb_of(&Method::POST, false, false), "create");
        assert_eq!(verb_of(&Method::PUT, true, false), "update");
        assert_eq!(verb_of(&Method::PATCH, true, false), "patch");
        assert_eq!(verb_of(&Method::DELETE, true, false), "delete");
        assert_eq!(verb_of(&Method::DELETE, false, false), "deletecollection");

        assert_eq!(request_name("get", Some("a"), Some("metadata.name=b")), Some("a"));
        assert_eq!(request_name("watch", None, Some("metadata.name=b")), Some("b"));
        assert_eq!(
            request_name("list", None, Some("spec.x=y,metadata.name==c")),
            Some("c")
        );
        assert_eq!(request_name("list", None, Some("metadata.name!=b")), None);
        assert_eq!(request_name("list", None, Some("metadata.namespace=b")), None);
        assert_eq!(request_name("list", None, None), None);
        assert_eq!(
            request_name("deletecollection", None, Some("metadata.name=b")),
            None
        );
    }
}
