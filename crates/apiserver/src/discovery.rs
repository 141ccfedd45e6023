//! API discovery documents: aggregated discovery v2 (`GET /api`, `GET /apis` with the apidiscovery Accept) and the
//! legacy documents (`APIVersions`, `APIGroupList`, `APIGroup`, `APIResourceList`).
//!
//! kubectl reads short names, singular names, scope, verbs and subresources from here (`api-resources`, `get mc`,
//! `describe machine`, `scale`, `get -w`). Everything is derived from the [`Registry`], so a resource added there is
//! discovered everywhere.

use serde_json::{Map, Value, json};

use crate::registry::{Registry, ResourceDef};

/// Content-Type of aggregated discovery responses; client-go recognises aggregated discovery only by it.
pub const AGGREGATED_DISCOVERY_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Verbs of every served resource, as the real server lists them for a resource with full CRUD and watch.
pub const RESOURCE_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Verbs of the `status` and `scale` subresources.
pub const SUBRESOURCE_VERBS: &[&str] = &["get", "patch", "update"];

/// One subresource of a resource (`machines/status`, `machinesets/scale`), with the kind its endpoints speak.
///
/// Discovery and OpenAPI both read [`subresources`], so that a subresource is announced in one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subresource<'a> {
    /// Name, the last URL segment (`status`, `scale`).
    pub name: &'static str,
    /// API group of the request and response kind (`autoscaling` for scale).
    pub group: &'a str,
    /// API version of that kind.
    pub version: &'a str,
    /// The kind read and written at this subresource (`Scale`, or the resource's own kind for `status`).
    pub kind: &'a str,
    /// Verbs served (`get`, `patch`, `update`; `create` for action subresources such as `eviction`).
    pub verbs: &'static [&'static str],
}

impl Subresource<'_> {
    /// True when the subresource speaks the resource's own group version (then built-ins leave it out of
    /// `responseKind`, as the real server does).
    fn same_group_version(&self, def: &ResourceDef) -> bool {
        self.group == def.group && self.version == def.version
    }
}

/// The subresources of a resource: `status` and `scale` as the registry declares them. A later subresource (such as
/// `pods/eviction` with `policy/v1 Eviction` and verb `create`) is added here once it is served.
pub fn subresources(def: &ResourceDef) -> Vec<Subresource<'_>> {
    let mut out = Vec::new();
    if def.status_subresource {
        out.push(Subresource {
            name: "status",
            group: &def.group,
            version: &def.version,
            kind: &def.kind,
            verbs: SUBRESOURCE_VERBS,
        });
    }
    if def.scale_subresource {
        out.push(Subresource {
            name: "scale",
            group: "autoscaling",
            version: "v1",
            kind: "Scale",
            verbs: SUBRESOURCE_VERBS,
        });
    }
    if def.group.is_empty() && def.plural == "pods" {
        // kubectl drain evicts through this subresource when discovery lists it (and deletes pods otherwise).
        out.push(Subresource {
            name: "eviction",
            group: "policy",
            version: "v1",
            kind: "Eviction",
            verbs: &["create"],
        });
    }
    if crate::csr::is_csr(def) {
        // `kubectl certificate approve|deny` writes the conditions here.
        out.push(Subresource {
            name: "approval",
            group: &def.group,
            version: &def.version,
            kind: &def.kind,
            verbs: SUBRESOURCE_VERBS,
        });
    }
    out
}

/// One media range of an Accept header: lower-case `type/subtype` and its parameters (names lower-case).
pub(crate) struct MediaRange<'a> {
    /// `type/subtype`, lower-case.
    pub(crate) essence: String,
    params: Vec<(String, &'a str)>,
}

impl MediaRange<'_> {
    /// The value of a parameter, if present.
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }

    /// True for `application/json` without any of the `as`, `g`, `v` conversion parameters.
    pub(crate) fn is_plain_json(&self) -> bool {
        self.essence == "application/json" && self.param("as").is_none()
    }

    /// True for `*/*` and `application/*`, which plain JSON satisfies.
    pub(crate) fn is_wildcard(&self) -> bool {
        self.essence == "*/*" || self.essence == "application/*"
    }
}

/// The media ranges of an Accept header in order, leaving out those with `q=0`.
pub(crate) fn media_ranges(accept: &str) -> Vec<MediaRange<'_>> {
    accept
        .split(',')
        .filter_map(|range| {
            let mut parts = range.split(';');
            let essence = parts.next()?.trim().to_ascii_lowercase();
            if essence.is_empty() {
                return None;
            }
            let params: Vec<(String, &str)> = parts
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k.trim().to_ascii_lowercase(), v.trim().trim_matches('"')))
                })
                .collect();
            let refused = params
                .iter()
                .any(|(k, v)| k == "q" && v.parse::<f64>().is_ok_and(|q| q <= 0.0));
            (!refused).then_some(MediaRange { essence, params })
        })
        .collect()
}

/// True when an Accept header asks for aggregated discovery v2 (g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList)
/// before any plain `application/json` or wildcard range.
pub fn wants_aggregated(accept: &str) -> bool {
    for range in media_ranges(accept) {
        if range.essence == "application/json"
            && range.param("g") == Some("apidiscovery.k8s.io")
            && range.param("v") == Some("v2")
            && range.param("as") == Some("APIGroupDiscoveryList")
        {
            return true;
        }
        if range.is_plain_json() || range.is_wildcard() {
            return false;
        }
    }
    false
}

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({ "group": group, "version": version, "kind": kind })
}

/// Resources of one group version, sorted by plural as the real server lists them.
fn resources_of<'r>(registry: &'r Registry, group: &str, version: &str) -> Vec<&'r ResourceDef> {
    let mut defs: Vec<&ResourceDef> = registry
        .all()
        .iter()
        .map(AsRef::as_ref)
        .filter(|r| r.group == group && r.version == version)
        .collect();
    defs.sort_by(|a, b| a.plural.cmp(&b.plural));
    defs
}

fn aggregated_resource(def: &ResourceDef) -> Value {
    // The real server writes empty group and version for built-in kinds of the resource's own group version.
    let own_kind = |group: &str, version: &str, kind: &str| {
        if def.custom || group != def.group || version != def.version {
            gvk(group, version, kind)
        } else {
            gvk("", "", kind)
        }
    };
    let mut entry = Map::new();
    entry.insert("resource".into(), json!(def.plural));
    entry.insert(
        "responseKind".into(),
        own_kind(&def.group, &def.version, &def.kind),
    );
    entry.insert(
        "scope".into(),
        json!(if def.namespaced { "Namespaced" } else { "Cluster" }),
    );
    entry.insert("singularResource".into(), json!(def.singular));
    entry.insert("verbs".into(), json!(RESOURCE_VERBS));
    if !def.short_names.is_empty() {
        entry.insert("shortNames".into(), json!(def.short_names));
    }
    if !def.categories.is_empty() {
        entry.insert("categories".into(), json!(def.categories));
    }
    let subs: Vec<Value> = subresources(def)
        .iter()
        .map(|s| {
            json!({
                "subresource": s.name,
                "responseKind": own_kind(s.group, s.version, s.kind),
                "verbs": s.verbs,
            })
        })
        .collect();
    if !subs.is_empty() {
        entry.insert("subresources".into(), Value::Array(subs));
    }
    Value::Object(entry)
}

fn aggregated_version(registry: &Registry, group: &str, version: &str) -> Value {
    let resources: Vec<Value> = resources_of(registry, group, version)
        .into_iter()
        .map(aggregated_resource)
        .collect();
    json!({ "version": version, "resources": resources, "freshness": "Current" })
}

fn discovery_list(items: Vec<Value>) -> Value {
    let mut list =
        json!({ "kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {} });
    list["items"] = Value::Array(items);
    list
}

/// Versions of one group, in the registry's order (the first is the preferred one).
fn versions_of<'r>(registry: &'r Registry, group: &str) -> Vec<&'r str> {
    registry
        .group_versions()
        .into_iter()
        .filter(|(g, _)| *g == group)
        .map(|(_, v)| v)
        .collect()
}

/// Non-core groups in the registry's order.
fn groups(registry: &Registry) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for (group, _) in registry.group_versions() {
        if !group.is_empty() && !out.contains(&group) {
            out.push(group);
        }
    }
    out
}

/// `GET /api` aggregated: an APIGroupDiscoveryList with one item for the core group (metadata without name), version v1.
pub fn aggregated_core(registry: &Registry) -> Value {
    let versions: Vec<Value> = versions_of(registry, "")
        .into_iter()
        .map(|v| aggregated_version(registry, "", v))
        .collect();
    discovery_list(vec![
        json!({ "metadata": { "creationTimestamp": null }, "versions": versions }),
    ])
}

/// `GET /apis` aggregated: one item per non-core group, each with its versions and resources.
pub fn aggregated_groups(registry: &Registry) -> Value {
    let items = groups(registry)
        .into_iter()
        .map(|group| {
            let versions: Vec<Value> = versions_of(registry, group)
                .into_iter()
                .map(|v| aggregated_version(registry, group, v))
                .collect();
            json!({ "metadata": { "name": group, "creationTimestamp": null }, "versions": versions })
        })
        .collect();
    discovery_list(items)
}

/// `GET /api` legacy: `{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[...]}` pointing at
/// `server_address` (`host:port`), which clients use only as a hint.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }],
    })
}

fn group_version_entry(group: &str, version: &str) -> Value {
    json!({ "groupVersion": format!("{group}/{version}"), "version": version })
}

fn group_entry(registry: &Registry, group: &str) -> Option<Value> {
    let versions = versions_of(registry, group);
    let preferred = *versions.first()?;
    let entries: Vec<Value> = versions.iter().map(|v| group_version_entry(group, v)).collect();
    Some(
        json!({ "name": group, "versions": entries, "preferredVersion": group_version_entry(group, preferred) }),
    )
}

/// `GET /apis` legacy APIGroupList (with preferredVersion), for clients that do not ask for aggregated discovery.
pub fn api_group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = groups(registry)
        .into_iter()
        .filter_map(|g| group_entry(registry, g))
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// `GET /apis/<group>` legacy APIGroup, None when the group is not served (the caller answers 404).
pub fn api_group(registry: &Registry, group: &str) -> Option<Value> {
    if group.is_empty() {
        return None;
    }
    let mut entry = group_entry(registry, group)?;
    if let Value::Object(map) = &mut entry {
        map.insert("kind".into(), json!("APIGroup"));
        map.insert("apiVersion".into(), json!("v1"));
    }
    Some(entry)
}

/// `GET /api/v1` or `GET /apis/<group>/<version>` legacy APIResourceList (resources and subresources such as
/// "machines/status", "machinesets/scale" with group autoscaling version v1 kind Scale), None when not served.
pub fn api_resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let defs = resources_of(registry, group, version);
    if defs.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for def in defs {
        let mut entry = Map::new();
        entry.insert("name".into(), json!(def.plural));
        entry.insert("singularName".into(), json!(def.singular));
        entry.insert("namespaced".into(), json!(def.namespaced));
        entry.insert("kind".into(), json!(def.kind));
        entry.insert("verbs".into(), json!(RESOURCE_VERBS));
        if !def.short_names.is_empty() {
            entry.insert("shortNames".into(), json!(def.short_names));
        }
        if !def.categories.is_empty() {
            entry.insert("categories".into(), json!(def.categories));
        }
        resources.push(Value::Object(entry));
        for sub in subresources(def) {
            let mut entry = Map::new();
            entry.insert("name".into(), json!(format!("{}/{}", def.plural, sub.name)));
            entry.insert("singularName".into(), json!(""));
            entry.insert("namespaced".into(), json!(def.namespaced));
            if !sub.same_group_version(def) {
                entry.insert("group".into(), json!(sub.group));
                entry.insert("version".into(), json!(sub.version));
            }
            entry.insert("kind".into(), json!(sub.kind));
            entry.insert("verbs".into(), json!(sub.verbs));
            resources.push(Value::Object(entry));
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const DISC: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

    fn resource<'a>(list: &'a Value, group: &str, plural: &str) -> &'a Value {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|item| item["metadata"]["name"].as_str().unwrap_or("") == group)
            .flat_map(|item| item["versions"][0]["resources"].as_array().unwrap())
            .find(|r| r["resource"] == plural)
            .unwrap()
    }

    #[test]
    fn accept_negotiation() {
        assert!(wants_aggregated(DISC));
        assert!(wants_aggregated(
            "application/json; g=apidiscovery.k8s.io; v=v2; as=APIGroupDiscoveryList"
        ));
        assert!(!wants_aggregated("application/json"));
        assert!(!wants_aggregated("application/json, */*"));
        assert!(!wants_aggregated(
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
        ));
        assert!(!wants_aggregated(
            "application/json,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        ));
        assert!(!wants_aggregated(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;q=0"
        ));
        assert!(!wants_aggregated(""));
        assert!(!wants_aggregated(",;=,;;"));
    }

    #[test]
    fn aggregated_core_has_one_unnamed_item_with_builtin_response_kinds() {
        let list = aggregated_core(&crate::preinstalled::registry());
        assert_eq!(list["kind"], "APIGroupDiscoveryList");
        assert_eq!(list["apiVersion"], "apidiscovery.k8s.io/v2");
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), 1);
        assert!(items[0]["metadata"].get("name").is_none());
        assert_eq!(items[0]["versions"][0]["version"], "v1");
        let pods = resource(&list, "", "pods");
        assert_eq!(
            pods["responseKind"],
            json!({ "group": "", "version": "", "kind": "Pod" })
        );
        assert_eq!(pods["scope"], "Namespaced");
        assert_eq!(pods["singularResource"], "pod");
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["categories"], json!(["all"]));
        assert_eq!(pods["subresources"][0]["subresource"], "status");
        assert_eq!(
            pods["subresources"][0]["responseKind"],
            json!({ "group": "", "version": "", "kind": "Pod" })
        );
        let secrets = resource(&list, "", "secrets");
        assert!(secrets.get("shortNames").is_none());
        assert!(secrets.get("categories").is_none());
        assert!(secrets.get("subresources").is_none());
        assert_eq!(resource(&list, "", "nodes")["scope"], "Cluster");
    }

    #[test]
    fn aggregated_groups_describe_the_machine_kinds() {
        let list = aggregated_groups(&crate::preinstalled::registry());
        let names: Vec<&str> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"machine.sapcloud.io"));
        assert!(names.contains(&"coordination.k8s.io"));
        assert!(!names.contains(&""));
        let mcd = resource(&list, "machine.sapcloud.io", "machinedeployments");
        assert_eq!(
            mcd["responseKind"],
            json!({ "group": "machine.sapcloud.io", "version": "v1alpha1", "kind": "MachineDeployment" })
        );
        assert_eq!(mcd["verbs"], json!(RESOURCE_VERBS));
        assert_eq!(mcd["shortNames"], json!(["mcd"]));
        assert_eq!(mcd["singularResource"], "machinedeployment");
        assert_eq!(
            mcd["subresources"],
            json!([
                { "subresource": "status", "responseKind": { "group": "machine.sapcloud.io", "version": "v1alpha1", "kind": "MachineDeployment" }, "verbs": ["get", "patch", "update"] },
                { "subresource": "scale", "responseKind": { "group": "autoscaling", "version": "v1", "kind": "Scale" }, "verbs": ["get", "patch", "update"] },
            ])
        );
        let mcc = resource(&list, "machine.sapcloud.io", "machineclasses");
        assert!(mcc.get("subresources").is_none());
        assert_eq!(mcc["shortNames"], json!(["mcc"]));
        let lease = resource(&list, "coordination.k8s.io", "leases");
        assert_eq!(
            lease["responseKind"],
            json!({ "group": "", "version": "", "kind": "Lease" })
        );
    }

    #[test]
    fn legacy_documents() {
        let registry = crate::preinstalled::registry();
        assert_eq!(
            api_versions("10.0.0.1:6443"),
            json!({ "kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": "10.0.0.1:6443" }] })
        );
        let groups = api_group_list(&registry);
        let machine = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == "machine.sapcloud.io")
            .unwrap();
        assert_eq!(
            machine["preferredVersion"],
            json!({ "groupVersion": "machine.sapcloud.io/v1alpha1", "version": "v1alpha1" })
        );
        assert_eq!(api_group(&registry, "policy").unwrap()["kind"], "APIGroup");
        assert!(api_group(&registry, "apps").is_none());
        assert!(api_group(&registry, "").is_none());

        let list = api_resource_list(&registry, "machine.sapcloud.io", "v1alpha1").unwrap();
        assert_eq!(list["groupVersion"], "machine.sapcloud.io/v1alpha1");
        let names: Vec<&str> = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        // The old provider-specific class kinds are served for class migration.
        assert!(names.contains(&"awsmachineclasses"), "{names:?}");
        let names: Vec<&str> = names.into_iter().filter(|n| n.starts_with("machine")).collect();
        assert_eq!(
            names,
            [
                "machineclasses",
                "machinedeployments",
                "machinedeployments/status",
                "machinedeployments/scale",
                "machines",
                "machines/status",
                "machinesets",
                "machinesets/status",
                "machinesets/scale"
            ]
        );
        let scale = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "machinesets/scale")
            .unwrap();
        assert_eq!(scale["group"], "autoscaling");
        assert_eq!(scale["version"], "v1");
        assert_eq!(scale["kind"], "Scale");
        let status = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "machines/status")
            .unwrap();
        assert!(status.get("group").is_none());
        assert_eq!(status["kind"], "Machine");

        let core = api_resource_list(&registry, "", "v1").unwrap();
        assert_eq!(core["groupVersion"], "v1");
        assert!(
            core["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["name"] == "pods/status")
        );
        assert!(api_resource_list(&registry, "machine.sapcloud.io", "v1").is_none());
        assert!(api_resource_list(&registry, "apps", "v1").is_none());
    }
}
