//! The resources this server serves: names, scope, subresources, verbs and schemas.
//!
//! Everything that speaks about resources (routing, discovery, OpenAPI, Table output, validation) reads this one
//! table, so that a resource added here is served consistently everywhere.

use std::sync::{Arc, OnceLock};

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

/// One served resource. Its flags are independent facts of the Kubernetes resource model, hence several bools.
#[derive(Debug)]
#[allow(clippy::struct_excessive_bools)]
pub struct ResourceDef {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Kind of the objects.
    pub kind: &'static str,
    /// Plural resource name, the URL segment.
    pub plural: &'static str,
    /// Singular name (`kubectl describe machine`).
    pub singular: &'static str,
    /// Short names (`mc`, `po`, ...).
    pub short_names: &'static [&'static str],
    /// Categories (`all`).
    pub categories: &'static [&'static str],
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Has a `status` subresource: writes to the main resource never change status, writes to status change only
    /// status.
    pub status_subresource: bool,
    /// Has a `scale` subresource (`.spec.replicas` / `.status.replicas`).
    pub scale_subresource: bool,
    /// `metadata.generation` is maintained (custom resources and the built-ins that have it).
    pub generation: bool,
    /// Served as a custom resource: no strategic merge patch (415), as on a real server with the CRD installed.
    pub custom: bool,
    /// Fields usable in field selectors besides `metadata.name` and `metadata.namespace`.
    pub selectable_fields: &'static [&'static str],
    /// Printer columns besides Name (and Age, which custom resources get last).
    pub columns: Vec<Column>,
    schema: fn() -> Value,
    schema_cache: OnceLock<Value>,
}

impl ResourceDef {
    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` (`machines.machine.sapcloud.io`), or `plural` for the core group: the name used in messages.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The list kind (`MachineList`).
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// The structural openAPI v3 schema of an object of this resource (computed once).
    pub fn schema(&self) -> &Value {
        self.schema_cache.get_or_init(self.schema)
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

/// All served resources.
#[derive(Debug, Clone)]
pub struct Registry {
    resources: Arc<Vec<Arc<ResourceDef>>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

fn crd_columns(
    crd: fn() -> Result<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        mcm_api::crd::CrdError,
    >,
) -> Vec<Column> {
    let Ok(crd) = crd() else { return Vec::new() };
    crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| Column {
            name: c.name.clone(),
            type_: c.type_.clone(),
            json_path: c.json_path.clone(),
            description: c.description.clone().unwrap_or_default(),
            priority: c.priority.unwrap_or(0),
        })
        .collect()
}

fn crd_schema(
    crd: fn() -> Result<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        mcm_api::crd::CrdError,
    >,
) -> Value {
    crd()
        .ok()
        .and_then(|crd| crd.spec.versions.into_iter().next())
        .and_then(|v| v.schema)
        .and_then(|s| s.open_api_v3_schema)
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(Value::Null)
}

macro_rules! schema_fn {
    ($ty:ty) => {
        || mcm_api::crd::schema_of::<$ty>()
    };
}

#[allow(clippy::too_many_arguments)]
fn def(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    short_names: &'static [&'static str],
    namespaced: bool,
    status_subresource: bool,
    schema: fn() -> Value,
) -> ResourceDef {
    ResourceDef {
        group,
        version,
        kind,
        plural,
        singular: "",
        short_names,
        categories: &[],
        namespaced,
        status_subresource,
        scale_subresource: false,
        generation: false,
        custom: false,
        selectable_fields: &[],
        columns: Vec::new(),
        schema,
        schema_cache: OnceLock::new(),
    }
}

impl Registry {
    /// The resources of this project: the four machine kinds and the built-ins the controllers and kubectl use.
    #[allow(clippy::too_many_lines)] // one table entry per resource reads best as one table
    pub fn new() -> Self {
        use k8s_openapi::api::{certificates, coordination, core, events, policy, storage};
        use mcm_api::crd;
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
        let custom =
            |kind, plural, short: &'static [&'static str], status, scale, columns, schema| ResourceDef {
                scale_subresource: scale,
                generation: true,
                custom: true,
                columns,
                ..def(
                    "machine.sapcloud.io",
                    "v1alpha1",
                    kind,
                    plural,
                    short,
                    true,
                    status,
                    schema,
                )
            };
        let mut resources = vec![
            ResourceDef {
                selectable_fields: &["status.phase"],
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
                selectable_fields: &["spec.unschedulable"],
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
                categories: &["all"],
                generation: true,
                selectable_fields: &[
                    "spec.nodeName",
                    "spec.restartPolicy",
                    "spec.schedulerName",
                    "spec.serviceAccountName",
                    "status.phase",
                    "status.podIP",
                    "status.nominatedNodeName",
                ],
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
                selectable_fields: &["type"],
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
                selectable_fields: EVENT_FIELDS,
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
                selectable_fields: &[
                    "regarding.kind",
                    "regarding.namespace",
                    "regarding.name",
                    "regarding.uid",
                    "reason",
                    "type",
                ],
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
                selectable_fields: &["spec.signerName"],
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
            custom(
                "MachineClass",
                "machineclasses",
                &["mcc"],
                false,
                false,
                Vec::new(),
                || crd_schema(crd::machine_class),
            ),
            custom(
                "Machine",
                "machines",
                &["mc"],
                true,
                false,
                crd_columns(crd::machine),
                || crd_schema(crd::machine),
            ),
            custom(
                "MachineSet",
                "machinesets",
                &["mcs"],
                true,
                true,
                crd_columns(crd::machine_set),
                || crd_schema(crd::machine_set),
            ),
            custom(
                "MachineDeployment",
                "machinedeployments",
                &["mcd"],
                true,
                true,
                crd_columns(crd::machine_deployment),
                || crd_schema(crd::machine_deployment),
            ),
        ];
        // The provider-specific class kinds of older MCM releases, served free-form so that machines still naming
        // them can be migrated to MachineClass (spec 000 GenerateMachineClassForMigration). `SimMachineClass` is
        // the sim provider's, for tests of that flow.
        for (kind, plural) in LEGACY_CLASS_KINDS {
            resources.push(custom(
                kind,
                plural,
                &[],
                false,
                false,
                Vec::new(),
                legacy_class_schema,
            ));
        }
        for resource in &mut resources {
            resource.singular = singular_of(resource.kind);
        }
        Self {
            resources: Arc::new(resources.into_iter().map(Arc::new).collect()),
        }
    }

    /// Every resource, in a stable order.
    pub fn all(&self) -> &[Arc<ResourceDef>] {
        &self.resources
    }

    /// The resource served at `group/version/plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .cloned()
    }

    /// The group versions served, in order of first appearance: ("", "v1") first.
    pub fn group_versions(&self) -> Vec<(&'static str, &'static str)> {
        let mut out: Vec<(&'static str, &'static str)> = Vec::new();
        for r in self.resources.iter() {
            if !out.contains(&(r.group, r.version)) {
                out.push((r.group, r.version));
            }
        }
        out
    }
}

/// Old provider-specific class kinds (kind, plural), served for class migration only.
const LEGACY_CLASS_KINDS: [(&str, &str); 7] = [
    ("AWSMachineClass", "awsmachineclasses"),
    ("AzureMachineClass", "azuremachineclasses"),
    ("GCPMachineClass", "gcpmachineclasses"),
    ("OpenStackMachineClass", "openstackmachineclasses"),
    ("AlicloudMachineClass", "alicloudmachineclasses"),
    ("PacketMachineClass", "packetmachineclasses"),
    ("SimMachineClass", "simmachineclasses"),
];

/// The schema of a legacy class: metadata plus a free-form spec (the old CRDs were provider-defined).
fn legacy_class_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "apiVersion": { "type": "string" },
            "kind": { "type": "string" },
            "metadata": { "type": "object" },
            "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
        },
    })
}

/// Lower-case singular of a kind, as Kubernetes derives it.
fn singular_of(kind: &'static str) -> &'static str {
    match kind {
        "Namespace" => "namespace",
        "Node" => "node",
        "Pod" => "pod",
        "Secret" => "secret",
        "Event" => "event",
        "PersistentVolume" => "persistentvolume",
        "PersistentVolumeClaim" => "persistentvolumeclaim",
        "Lease" => "lease",
        "VolumeAttachment" => "volumeattachment",
        "PodDisruptionBudget" => "poddisruptionbudget",
        "CertificateSigningRequest" => "certificatesigningrequest",
        "MachineClass" => "machineclass",
        "Machine" => "machine",
        "MachineSet" => "machineset",
        "MachineDeployment" => "machinedeployment",
        "AWSMachineClass" => "awsmachineclass",
        "AzureMachineClass" => "azuremachineclass",
        "GCPMachineClass" => "gcpmachineclass",
        "OpenStackMachineClass" => "openstackmachineclass",
        "AlicloudMachineClass" => "alicloudmachineclass",
        "PacketMachineClass" => "packetmachineclass",
        "SimMachineClass" => "simmachineclass",
        _ => "",
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

    #[test]
    fn machine_kinds_carry_the_crd_printer_columns() {
        let registry = Registry::new();
        let machines = registry
            .find("machine.sapcloud.io", "v1alpha1", "machines")
            .unwrap();
        let names: Vec<&str> = machines.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["Status", "Age", "Node", "ProviderID"]);
        assert_eq!(machines.group_resource(), "machines.machine.sapcloud.io");
        assert_eq!(
            machines.collection_path(Some("default")),
            "/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machines"
        );
    }
}
