//! Unit tests of authentication and authorization, one concern per file in `tests/`; the users, resources and the
//! `may` shorthand they share are here.

use std::sync::Arc;

use serde_json::Value;

use super::{ADMIN_GROUP, BOOTSTRAPPERS_GROUP, NODE_LEASE_NAMESPACE, NODES_GROUP, User, authorize};
use crate::registry::ResourceDef;

mod authorization;
mod bootstrap;
mod identity;
mod token_file;

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
    let registry = crate::preinstalled::registry();
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
