//! Requests counted per client identity, verb and resource: what the write-count tests of the controllers and
//! `mcm bench` read (in process through [`crate::ApiServer::requests`], from another process through
//! `GET /debug/requests`, admin only), and what an RBAC check can compare with the rules it grants: each counter
//! also carries the namespace and the object name, as RBAC rules are scoped by namespace (Role) and `resourceNames`.

use std::{collections::BTreeMap, sync::Mutex};

use serde::Serialize;

/// What a request was: who, which verb, on which resource (`machines.machine.sapcloud.io` or
/// `machines.machine.sapcloud.io/status`), in which namespace, on which object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RequestKey {
    /// The authenticated user name (`admin`, `system:node:n1`, ...).
    pub user: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// `plural.group`, with `/subresource` when there is one.
    pub resource: String,
    /// The namespace of a namespaced request; empty for cluster-scoped resources and for lists and watches across
    /// all namespaces.
    pub namespace: String,
    /// The object's name, as RBAC sees it: the name in the path, or for a list or watch the one a
    /// `metadata.name=` field selector picks; empty for collections and creates.
    pub name: String,
}

/// True for the verbs that change state (every verb but get, list and watch).
pub fn is_write(verb: &str) -> bool {
    !matches!(verb, "get" | "list" | "watch")
}

/// The counters of one server.
#[derive(Debug, Default)]
pub struct RequestCounts {
    counts: Mutex<BTreeMap<RequestKey, u64>>,
}

impl RequestCounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<RequestKey, u64>> {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts one request without a namespace or name.
    pub fn record(&self, user: &str, verb: &str, resource: &str) {
        self.record_request(user, verb, resource, None, None);
    }

    /// Counts one request in `namespace` (None: cluster scope or all namespaces) on the object `name` (None: a
    /// collection).
    pub fn record_request(
        &self,
        user: &str,
        verb: &str,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) {
        let key = RequestKey {
            user: user.to_owned(),
            verb: verb.to_owned(),
            resource: resource.to_owned(),
            namespace: namespace.unwrap_or_default().to_owned(),
            name: name.unwrap_or_default().to_owned(),
        };
        *self.lock().entry(key).or_default() += 1;
    }

    /// Every counter.
    pub fn snapshot(&self) -> BTreeMap<RequestKey, u64> {
        self.lock().clone()
    }

    /// Writes made by one user, in all.
    pub fn writes_by(&self, user: &str) -> u64 {
        self.lock()
            .iter()
            .filter(|(k, _)| k.user == user && is_write(&k.verb))
            .map(|(_, n)| n)
            .sum()
    }

    /// Forgets every counter (between the phases of a benchmark).
    pub fn reset(&self) {
        self.lock().clear();
    }

    /// The counters as JSON: a list of `{user, verb, resource, namespace, name, count}` (namespace and name empty
    /// when the request had none).
    pub fn to_json(&self) -> serde_json::Value {
        let list: Vec<serde_json::Value> = self
            .lock()
            .iter()
            .map(|(k, n)| {
                serde_json::json!({
                    "user": k.user,
                    "verb": k.verb,
                    "resource": k.resource,
                    "namespace": k.namespace,
                    "name": k.name,
                    "count": n,
                })
            })
            .collect();
        serde_json::Value::Array(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_user_verb_and_resource_and_tells_writes_from_reads() {
        let counts = RequestCounts::default();
        counts.record("admin", "create", "machines.machine.sapcloud.io");
        counts.record("admin", "create", "machines.machine.sapcloud.io");
        counts.record("admin", "patch", "machines.machine.sapcloud.io/status");
        counts.record("admin", "list", "machines.machine.sapcloud.io");
        counts.record("system:node:n1", "update", "leases.coordination.k8s.io");
        assert_eq!(counts.writes_by("admin"), 3);
        assert_eq!(counts.writes_by("system:node:n1"), 1);
        assert_eq!(counts.snapshot().len(), 4);
        counts.record_request(
            "mcm",
            "update",
            "leases.coordination.k8s.io",
            Some("ns"),
            Some("machine-controller"),
        );
        counts.record_request(
            "mcm",
            "update",
            "leases.coordination.k8s.io",
            Some("ns"),
            Some("machine-controller"),
        );
        let json = counts.to_json();
        let lease = json
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["user"] == "mcm")
            .unwrap();
        assert_eq!(
            (&lease["namespace"], &lease["name"], &lease["count"]),
            (
                &serde_json::json!("ns"),
                &serde_json::json!("machine-controller"),
                &serde_json::json!(2)
            )
        );
        let cluster = json
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["user"] == "admin")
            .unwrap();
        assert_eq!(
            (&cluster["namespace"], &cluster["name"]),
            (&serde_json::json!(""), &serde_json::json!(""))
        );
        counts.reset();
        assert_eq!(counts.writes_by("admin"), 0);
    }
}
