//! Bootstrap tokens: `<token-id>.<token-secret>` checked against the Secret `kube-system/bootstrap-token-<id>` on
//! every request, with Kubernetes' rules (type, usage, expiration, extra groups).

use std::sync::Arc;

use base64::Engine as _;
use serde_json::Value;

use super::{
    Authenticator, BOOTSTRAP_TOKEN_NAMESPACE, BOOTSTRAP_TOKEN_SECRET_PREFIX, BOOTSTRAP_TOKEN_SECRET_TYPE,
    BOOTSTRAP_USER_PREFIX, BOOTSTRAPPERS_GROUP, User, constant_time_eq,
};
use crate::store::Store;

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
pub(super) fn split_bootstrap_token(token: &str) -> Option<(&str, &str)> {
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
    if crate::metadata::is_deleting(secret) {
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
