//! The resources this server serves: names, scope, subresources, verbs and schemas.
//!
//! Everything that speaks about resources (routing, discovery, OpenAPI, Table output, validation) reads this one
//! table, so that a resource added here is served consistently everywhere.

use std::{
    borrow::Cow,
    sync::{Arc, OnceLock, RwLock},
};

use serde_json::Value;

/// A printer column (Table output), as a CRD's `additionalPrinterColumns` declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// Header.
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// Simple JSON path such as `.status.currentStatus.phase`.
    pub json_path: String,
    /// Description shown by `kubectl explain`-like tools.
    pub description: String,
    /// 0 is shown by default, 1 only with `-o wide`.
    pub priority: i32,
}

impl From<&k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceColumnDefinition>
    for Column
{
    /// The column a CRD's `additionalPrinterColumns` entry declares .
    fn from(
        c: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceColumnDefinition,
    ) -> Self {
        Self {
            name: c.name.clone(),
            type_: c.type_.clone(),
            json_path: c.json_path.clone(),
            description: c.description.clone().unwrap_or_default(),
            priority: c.priority.unwrap_or(0),
        }
    }
}

/// Where a resource's scale subresource reads and writes: paths from the object root, dot-separated without the
/// leading dot (`spec.replicas`), as a CRD's `subresources.scale` names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalePaths {
    /// The desired replicas (`specReplicasPath`).
    pub spec_replicas: String,
    /// The observed replicas (`statusReplicasPath`).
    pub status_replicas: String,
    /// The label selector in string form (`labelSelectorPath`), when declared.
    pub label_selector: Option<String>,
}

impl Default for ScalePaths {
    fn default() -> Self {
        Self {
            spec_replicas: "spec.replicas".into(),
            status_replicas: "status.replicas".into(),
            label_selector: None,
        }
    }
}

/// One served resource. Its flags are independent facts of the Kubernetes resource model, hence several bools.
///
/// Names are owned: built-ins are made once at start, custom resources whenever a CustomResourceDefinition changes.
#[derive(Debug)]
#[allow(clippy::struct_excessive_bools)]
pub struct ResourceDef {
    /// API group; empty for the core group.
    pub group: String,
    /// API version.
    pub version: String,
    /// The version objects are stored in (their `apiVersion` in the store); the served version for built-ins.
    pub storage_version: String,
    /// Kind of the objects.
    pub kind: String,
    /// Plural resource name, the URL segment.
    pub plural: String,
    /// Singular name (`kubectl describe machine`).
    pub singular: String,
    /// The list kind (`MachineList`).
    pub list_kind: String,
    /// Short names (`mc`, `po`, ...).
    pub short_names: Vec<String>,
    /// Categories (`all`).
    pub categories: Vec<String>,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Has a `status` subresource: writes to the main resource never change status, writes to status change only
    /// status.
    pub status_subresource: bool,
    /// Has a `scale` subresource (at [`ResourceDef::scale_paths`]).
    pub scale_subresource: bool,
    /// The fields the scale subresource reads and writes.
    pub scale_paths: ScalePaths,
    /// `metadata.generation` is maintained (custom resources and the built-ins that have it).
    pub generation: bool,
    /// Served as a custom resource: no strategic merge patch (415), as on a real server with the CRD installed.
    pub custom: bool,
    /// The schema carries `default` values, applied on writes and reads ([`crate::defaults`]).
    pub has_defaults: bool,
    /// Fields usable in field selectors besides `metadata.name` and `metadata.namespace`.
    pub selectable_fields: Vec<String>,
    /// Printer columns besides Name (and Age, which custom resources get last).
    pub columns: Vec<Column>,
    schema: Option<fn() -> Value>,
    schema_cache: OnceLock<Value>,
}

impl ResourceDef {
    /// A resource with an already known schema and everything else at its default (not namespaced, no
    /// subresources, no generation, not custom): the callers set the rest.
    pub fn with_schema(group: &str, version: &str, kind: &str, plural: &str, schema: Value) -> Self {
        let def = Self {
            schema: None,
            ..def(group, version, kind, plural, &[], false, false, || Value::Null)
        };
        let _ = def.schema_cache.set(schema);
        def
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        api_version_of(&self.group, &self.version)
    }

    /// The `apiVersion` objects carry in the store (`group/storage_version`).
    pub fn storage_api_version(&self) -> String {
        api_version_of(&self.group, &self.storage_version)
    }

    /// `plural.group` (`machines.machine.sapcloud.io`), or `plural` for the core group: the name used in messages.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The list kind (`MachineList`).
    pub fn list_kind(&self) -> String {
        self.list_kind.clone()
    }

    /// The structural openAPI v3 schema of an object of this resource (computed once).
    pub fn schema(&self) -> &Value {
        self.schema_cache
            .get_or_init(|| self.schema.map_or(Value::Null, |make| make()))
    }

    /// A stored object as this version serves it: its `apiVersion` this one (objects are stored once, in the
    /// storage version, and converted with strategy `None`) and the schema's defaults applied, as a real server does
    /// when it reads an object. Borrowed when nothing changes.
    pub fn present<'v>(&self, object: &'v Value) -> Cow<'v, Value> {
        let api_version = self.api_version();
        let other_version = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v != api_version);
        if !other_version && !self.has_defaults {
            return Cow::Borrowed(object);
        }
        let mut shown = object.clone();
        if other_version {
            shown["apiVersion"] = Value::String(api_version);
        }
        if self.has_defaults {
            crate::defaults::apply(self.schema(), &mut shown);
        }
        Cow::Owned(shown)
    }

    /// The URL path of the collection in a namespace (or cluster-wide when `namespace` is None).
    pub fn collection_path(&self, namespace: Option<&str>) -> String {
        let prefix = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        match namespace {
            Some(ns) if self.namespaced => format!("{prefix}/namespaces/{ns}/{}", self.plural),
            _ => format!("{prefix}/{}", self.plural),
        }
    }
}

fn api_version_of(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    }
}

/// The served resources at one moment: the built-ins, then the custom resources of the established
/// CustomResourceDefinitions. Immutable and cheap to clone; [`SharedRegistry`] holds the current one.
#[derive(Debug, Clone)]
pub struct Registry {
    resources: Arc<Vec<Arc<ResourceDef>>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

macro_rules! schema_fn {
    ($ty:ty) => {
        || mcm_api::crd::schema_of::<$ty>()
    };
}

#[allow(clippy::too_many_arguments)]
fn def(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    short_names: &[&str],
    namespaced: bool,
    status_subresource: bool,
    schema: fn() -> Value,
) -> ResourceDef {
    ResourceDef {
        group: group.to_owned(),
        version: version.to_owned(),
        storage_version: version.to_owned(),
        kind: kind.to_owned(),
        plural: plural.to_owned(),
        singular: kind.to_ascii_lowercase(),
        list_kind: format!("{kind}List"),
        short_names: strings(short_names),
        categories: Vec::new(),
        namespaced,
        status_subresource,
        scale_subresource: false,
        scale_paths: ScalePaths::default(),
        generation: false,
        custom: false,
        has_defaults: false,
        selectable_fields: Vec::new(),
        columns: Vec::new(),
        schema: Some(schema),
        schema_cache: OnceLock::new(),
    }
}

/// Owned copies of string slices.
pub(crate) fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

impl Registry {
    /// The built-in resources: those the controllers and kubectl use besides the machine kinds, which are custom
    /// resources of pre-installed CRDs ([`crate::preinstalled`]). Made once per process and shared: the schemas of
    /// the built-in kinds, generated from their Rust types on first use, cost about a second in a debug build, which
    /// every server start (and so every test) would pay again.
    pub fn new() -> Self {
        static BUILTINS: OnceLock<Registry> = OnceLock::new();
        BUILTINS.get_or_init(Self::builtins).clone()
    }

    #[allow(clippy::too_many_lines)] // one table entry per resource reads best as one table
    fn builtins() -> Self {
        use k8s_openapi::api::{certificates, coordination, core, events, policy, storage};
        const EVENT_FIELDS: &[&str] = &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ];
        let resources = vec![
            ResourceDef {
                selectable_fields: strings(&["status.phase"]),
                ..def(
                    "",
                    "v1",
                    "Namespace",
                    "namespaces",
                    &["ns"],
                    false,
                    true,
                    schema_fn!(core::v1::Namespace),
                )
            },
            ResourceDef {
                selectable_fields: strings(&["spec.unschedulable"]),
                ..def(
                    "",
                    "v1",
                    "Node",
                    "nodes",
                    &["no"],
                    false,
                    true,
                    schema_fn!(core::v1::Node),
                )
            },
            ResourceDef {
                categories: strings(&["all"]),
                generation: true,
                selectable_fields: strings(&[
                    "spec.nodeName",
                    "spec.restartPolicy",
                    "spec.schedulerName",
                    "spec.serviceAccountName",
                    "status.phase",
                    "status.podIP",
                    "status.nominatedNodeName",
                ]),
                ..def(
                    "",
                    "v1",
                    "Pod",
                    "pods",
                    &["po"],
                    true,
                    true,
                    schema_fn!(core::v1::Pod),
                )
            },
            ResourceDef {
                selectable_fields: strings(&["type"]),
                ..def(
                    "",
                    "v1",
                    "Secret",
                    "secrets",
                    &[],
                    true,
                    false,
                    schema_fn!(core::v1::Secret),
                )
            },
            ResourceDef {
                selectable_fields: strings(EVENT_FIELDS),
                ..def(
                    "",
                    "v1",
                    "Event",
                    "events",
                    &["ev"],
                    true,
                    false,
                    schema_fn!(core::v1::Event),
                )
            },
            def(
                "",
                "v1",
                "PersistentVolume",
                "persistentvolumes",
                &["pv"],
                false,
                true,
                schema_fn!(core::v1::PersistentVolume),
            ),
            def(
                "",
                "v1",
                "PersistentVolumeClaim",
                "persistentvolumeclaims",
                &["pvc"],
                true,
                true,
                schema_fn!(core::v1::PersistentVolumeClaim),
            ),
            def(
                "coordination.k8s.io",
                "v1",
                "Lease",
                "leases",
                &[],
                true,
                false,
                schema_fn!(coordination::v1::Lease),
            ),
            def(
                "storage.k8s.io",
                "v1",
                "VolumeAttachment",
                "volumeattachments",
                &[],
                false,
                true,
                schema_fn!(storage::v1::VolumeAttachment),
            ),
            ResourceDef {
                generation: true,
                ..def(
                    "policy",
                    "v1",
                    "PodDisruptionBudget",
                    "poddisruptionbudgets",
                    &["pdb"],
                    true,
                    true,
                    schema_fn!(policy::v1::PodDisruptionBudget),
                )
            },
            ResourceDef {
                selectable_fields: strings(&[
                    "regarding.kind",
                    "regarding.namespace",
                    "regarding.name",
                    "regarding.uid",
                    "reason",
                    "type",
                ]),
                ..def(
                    "events.k8s.io",
                    "v1",
                    "Event",
                    "events",
                    &["ev"],
                    true,
                    false,
                    schema_fn!(events::v1::Event),
                )
            },
            ResourceDef {
                selectable_fields: strings(&["spec.signerName"]),
                ..def(
                    "certificates.k8s.io",
                    "v1",
                    "CertificateSigningRequest",
                    "certificatesigningrequests",
                    &["csr"],
                    false,
                    true,
                    schema_fn!(certificates::v1::CertificateSigningRequest),
                )
            },
            ResourceDef {
                generation: true,
                short_names: strings(&["crd", "crds"]),
                ..def(
                    crate::crd::GROUP,
                    crate::crd::VERSION,
                    "CustomResourceDefinition",
                    crate::crd::PLURAL,
                    &[],
                    false,
                    true,
                    crate::crd::schema,
                )
            },
        ];
        Self {
            resources: Arc::new(resources.into_iter().map(Arc::new).collect()),
        }
    }

    /// These resources followed by `custom` ones, leaving out any whose group and plural a resource here already
    /// serves (a CRD for a built-in kind does not replace it).
    #[must_use]
    pub fn with_custom(&self, custom: Vec<ResourceDef>) -> Self {
        let mut resources: Vec<Arc<ResourceDef>> = self.resources.to_vec();
        for def in custom {
            if !self.serves(&def.group, &def.plural) {
                resources.push(Arc::new(def));
            }
        }
        Self {
            resources: Arc::new(resources),
        }
    }

    /// True when some version of `plural.group` is served.
    pub fn serves(&self, group: &str, plural: &str) -> bool {
        self.resources
            .iter()
            .any(|r| r.group == group && r.plural == plural)
    }

    /// Every resource, in a stable order.
    pub fn all(&self) -> &[Arc<ResourceDef>] {
        &self.resources
    }

    /// One resource per stored resource (`group/plural`): the first served version of each. For walks over every
    /// stored object (garbage collection, namespace cleanup), which would see an object twice through two versions.
    pub fn stored(&self) -> Vec<Arc<ResourceDef>> {
        let mut seen = std::collections::HashSet::new();
        self.resources
            .iter()
            .filter(|r| seen.insert((r.group.as_str(), r.plural.as_str())))
            .cloned()
            .collect()
    }

    /// The resource served at `group/version/plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .cloned()
    }

    /// The group versions served, in order of first appearance: ("", "v1") first.
    pub fn group_versions(&self) -> Vec<(&str, &str)> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        for r in self.resources.iter() {
            let gv = (r.group.as_str(), r.version.as_str());
            if !out.contains(&gv) {
                out.push(gv);
            }
        }
        out
    }
}

/// The served resources as they change at run time: the built-ins and, after every change of a
/// CustomResourceDefinition, the custom resources it defines ([`crate::crd::sync`]). Requests take a snapshot
/// ([`SharedRegistry::current`]) and keep using it, so a request never sees half a change.
#[derive(Debug, Clone)]
pub struct SharedRegistry {
    builtins: Registry,
    current: Arc<RwLock<(u64, Registry)>>,
}

impl Default for SharedRegistry {
    fn default() -> Self {
        Self::new(Registry::new())
    }
}

impl SharedRegistry {
    /// Serves `builtins` and nothing else until custom resources are set.
    pub fn new(builtins: Registry) -> Self {
        Self {
            current: Arc::new(RwLock::new((0, builtins.clone()))),
            builtins,
        }
    }

    /// The resources served now.
    pub fn current(&self) -> Registry {
        self.read().1.clone()
    }

    /// A number that changes whenever the served resources do (for caches derived from them, such as OpenAPI).
    pub fn generation(&self) -> u64 {
        self.read().0
    }

    /// The built-in resources.
    pub fn builtins(&self) -> &Registry {
        &self.builtins
    }

    /// Serves the built-ins and these custom resources from now on. True when anything changed.
    pub fn set_custom(&self, custom: Vec<ResourceDef>) -> bool {
        let next = self.builtins.with_custom(custom);
        let mut guard = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if same_resources(&guard.1, &next) {
            return false;
        }
        guard.0 += 1;
        guard.1 = next;
        true
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, (u64, Registry)> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// True when two registries serve the same resources with the same definitions.
fn same_resources(a: &Registry, b: &Registry) -> bool {
    a.resources.len() == b.resources.len()
        && a.resources
            .iter()
            .zip(b.resources.iter())
            .all(|(x, y)| Arc::ptr_eq(x, y) || (**x == **y))
}

impl PartialEq for ResourceDef {
    fn eq(&self, other: &Self) -> bool {
        self.group == other.group
            && self.version == other.version
            && self.storage_version == other.storage_version
            && self.kind == other.kind
            && self.plural == other.plural
            && self.singular == other.singular
            && self.list_kind == other.list_kind
            && self.short_names == other.short_names
            && self.categories == other.categories
            && self.namespaced == other.namespaced
            && self.status_subresource == other.status_subresource
            && self.scale_subresource == other.scale_subresource
            && self.scale_paths == other.scale_paths
            && self.generation == other.generation
            && self.custom == other.custom
            && self.has_defaults == other.has_defaults
            && self.selectable_fields == other.selectable_fields
            && self.columns == other.columns
            && self.schema() == other.schema()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_resource_has_a_schema_with_properties() {
        for r in Registry::new().all() {
            assert!(
                r.schema()["properties"].is_object(),
                "{} has no schema",
                r.group_resource()
            );
            assert!(!r.singular.is_empty(), "{} has no singular", r.kind);
        }
    }
}
