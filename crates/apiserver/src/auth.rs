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
//!
//! This file holds the users and the authenticator chain; the submodules hold the static token file
//! (`token_file`), bootstrap tokens (`bootstrap`) and the authorization rules (`authorize`).

mod authorize;
mod bootstrap;
#[cfg(test)]
mod tests;
mod token_file;

pub use authorize::{authorize, authorize_stored, request_name, verb_of};
pub use bootstrap::{BootstrapTokens, bootstrap_user};
pub use token_file::{TokenFile, TokenFileError};

use crate::x509;

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
pub use mcm_api::keys::kubernetes::NODE_LEASE_NAMESPACE;

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
