//! CustomResourceDefinitions of the four kinds, generated from the Rust types.
//!
//! Schemas are structural and typed everywhere except where the reference leaves them free-form: `providerSpec`,
//! and the `metadata` of machine and node templates (`x-kubernetes-preserve-unknown-fields`). Names, short names,
//! subresources and printer columns are those of the reference (reference/mcm-inventory.md section 1.1).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresourceScale,
    CustomResourceSubresourceStatus, CustomResourceSubresources, CustomResourceValidation, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::{JsonSchema, Schema, generate::SchemaSettings, json_schema};
use serde_json::{Value, json};

use crate::{
    MachineDeploymentSpec, MachineDeploymentStatus, MachineSetSpec, MachineSetStatus, MachineSpec,
    MachineStatus, NodeTemplate, crd_shape, resource::GROUP,
};

/// Why CRDs could not be produced; only a bug in the type definitions can cause it.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A generated schema did not fit the CRD schema type.
    #[error("generated schema for {kind} is not a valid CRD schema: {source}")]
    Schema {
        /// The kind whose schema failed.
        kind: &'static str,
        /// The conversion error.
        source: serde_json::Error,
    },
    /// The YAML serializer failed.
    #[error("cannot write CRDs as YAML: {0}")]
    Yaml(String),
}

/// Schema of a free-form object whose fields are kept as written (`x-kubernetes-preserve-unknown-fields`).
pub fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> Schema {
    json_schema!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true })
}

/// The openAPIV3 schema of a type, inlined and rewritten to Kubernetes' structural-schema rules, as kube-derive does.
/// Public so that the embedded API server describes built-in kinds the same way.
pub fn schema_of<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::openapi3()
        .with(|settings| {
            settings.inline_subschemas = true;
            settings.meta_schema = None;
        })
        .with_transform(kube::core::schema::StructuralSchemaRewriter)
        .with_transform(kube::core::schema::OptionalEnum)
        .with_transform(kube::core::schema::OptionalIntOrString)
        .into_generator();
    let mut value = generator.into_root_schema_for::<T>().to_value();
    if let Value::Object(map) = &mut value {
        // The root title is the Rust type name; Kubernetes has no use for it.
        map.remove("title");
    }
    value
}

/// The schema of a kind's root object: `apiVersion`, `kind` and `metadata`, then `properties` (spec, status), with
/// `required` when not empty. Public so that other API groups of this project (the Cluster API kinds) build theirs
/// the same way.
pub fn root_schema(description: &str, properties: Value, required: &[&str]) -> Value {
    let mut props = json!({
        "apiVersion": {
            "description": "APIVersion defines the versioned schema of this representation of an object.",
            "type": "string"
        },
        "kind": {
            "description": "Kind is a string value representing the REST resource this object represents.",
            "type": "string"
        },
        "metadata": { "type": "object" }
    });
    if let (Value::Object(base), Value::Object(extra)) = (&mut props, properties) {
        base.extend(extra);
    }
    let mut schema = json!({ "description": description, "type": "object", "properties": props });
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    schema
}

/// A printer column (`additionalPrinterColumns` entry).
pub fn column(
    name: &str,
    type_: &str,
    path: &str,
    description: &str,
    priority: Option<i32>,
) -> CustomResourceColumnDefinition {
    CustomResourceColumnDefinition {
        name: name.into(),
        type_: type_.into(),
        json_path: path.into(),
        description: Some(description.into()),
        priority,
        format: None,
    }
}

fn age_column() -> CustomResourceColumnDefinition {
    column(
        "Age",
        "date",
        ".metadata.creationTimestamp",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        None,
    )
}

/// What a namespaced, single-version CRD is made of; [`build`] makes it.
pub struct KindDef {
    /// API group.
    pub group: &'static str,
    /// The one version, served and stored.
    pub version: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Plural resource name.
    pub plural: &'static str,
    /// Singular name.
    pub singular: &'static str,
    /// Short name.
    pub short_name: &'static str,
    /// Categories (`kubectl get <category>`); none when empty.
    pub categories: &'static [&'static str],
    /// Labels of the CRD object; none when empty.
    pub labels: &'static [(&'static str, &'static str)],
    /// The root schema ([`root_schema`]).
    pub schema: Value,
    /// Has the status subresource.
    pub status: bool,
    /// Has the scale subresource (`.spec.replicas`, `.status.replicas`).
    pub scale: bool,
    /// Printer columns.
    pub columns: Vec<CustomResourceColumnDefinition>,
}

/// The CRD `def` describes, named `<plural>.<group>`.
pub fn build(def: KindDef) -> Result<CustomResourceDefinition, CrdError> {
    let schema: JSONSchemaProps = serde_json::from_value(def.schema).map_err(|source| CrdError::Schema {
        kind: def.kind,
        source,
    })?;
    let subresources = (def.status || def.scale).then(|| CustomResourceSubresources {
        status: def.status.then_some(CustomResourceSubresourceStatus(json!({}))),
        scale: def.scale.then(|| CustomResourceSubresourceScale {
            spec_replicas_path: ".spec.replicas".into(),
            status_replicas_path: ".status.replicas".into(),
            label_selector_path: None,
        }),
    });
    Ok(CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("{}.{}", def.plural, def.group)),
            labels: (!def.labels.is_empty()).then(|| {
                def.labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            ..ObjectMeta::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: def.group.into(),
            names: CustomResourceDefinitionNames {
                kind: def.kind.into(),
                list_kind: Some(format!("{}List", def.kind)),
                plural: def.plural.into(),
                singular: Some(def.singular.into()),
                short_names: Some(vec![def.short_name.into()]),
                categories: (!def.categories.is_empty())
                    .then(|| def.categories.iter().map(|c| (*c).to_owned()).collect()),
            },
            scope: "Namespaced".into(),
            versions: vec![CustomResourceDefinitionVersion {
                name: def.version.into(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(schema),
                }),
                subresources,
                additional_printer_columns: (!def.columns.is_empty()).then_some(def.columns),
                deprecated: None,
                deprecation_warning: None,
                selectable_fields: None,
            }],
            conversion: None,
            preserve_unknown_fields: None,
        },
        status: None,
    })
}

/// The root schema of `Machine`, in the reference's shape ([`crd_shape`]).
fn machine_schema() -> Value {
    let mut schema = root_schema(
        "Machine is the representation of a physical or virtual machine.",
        json!({ "spec": schema_of::<MachineSpec>(), "status": schema_of::<MachineStatus>() }),
        &[],
    );
    crd_shape::strip(&mut schema);
    crd_shape::mark_node_template(&mut schema, &["spec", "nodeTemplate"]);
    schema
}

/// The root schema of `MachineSet`, in the reference's shape ([`crd_shape`]).
fn machine_set_schema() -> Value {
    let mut schema = root_schema(
        "MachineSet keeps a number of machines made from one template.",
        json!({ "spec": schema_of::<MachineSetSpec>(), "status": schema_of::<MachineSetStatus>() }),
        &[],
    );
    crd_shape::strip(&mut schema);
    crd_shape::mark_selector(&mut schema, &["spec", "selector"]);
    crd_shape::mark_node_template(&mut schema, &["spec", "template", "spec", "nodeTemplate"]);
    schema
}

/// The root schema of `MachineDeployment`, in the reference's shape ([`crd_shape`]): `spec.template` required.
fn machine_deployment_schema() -> Value {
    let mut schema = root_schema(
        "MachineDeployment enables declarative updates for machines and MachineSets.",
        json!({
            "spec": schema_of::<MachineDeploymentSpec>(),
            "status": schema_of::<MachineDeploymentStatus>(),
        }),
        &[],
    );
    crd_shape::strip(&mut schema);
    crd_shape::require(&mut schema, &["spec"], "template");
    crd_shape::mark_selector(&mut schema, &["spec", "selector"]);
    crd_shape::mark_node_template(&mut schema, &["spec", "template", "spec", "nodeTemplate"]);
    schema
}

/// The CRD of `Machine` (`machines.machine.sapcloud.io`, short name `mc`).
pub fn machine() -> Result<CustomResourceDefinition, CrdError> {
    build(KindDef {
        group: GROUP,
        version: crate::resource::VERSION,
        categories: &[],
        labels: &[],
        kind: "Machine",
        plural: "machines",
        singular: "machine",
        short_name: "mc",
        schema: machine_schema(),
        status: true,
        scale: false,
        columns: vec![
            column(
                "Status",
                "string",
                ".status.currentStatus.phase",
                "Current status of the machine.",
                None,
            ),
            age_column(),
            column(
                "Node",
                "string",
                ".metadata.labels.node",
                "Node backing the machine object",
                None,
            ),
            column(
                "ProviderID",
                "string",
                ".spec.providerID",
                "ProviderID of the infra instance backing the machine object",
                Some(1),
            ),
        ],
    })
}

/// The CRD of `MachineSet` (`machinesets.machine.sapcloud.io`, short name `mcs`).
pub fn machine_set() -> Result<CustomResourceDefinition, CrdError> {
    build(KindDef {
        group: GROUP,
        version: crate::resource::VERSION,
        categories: &[],
        labels: &[],
        kind: "MachineSet",
        plural: "machinesets",
        singular: "machineset",
        short_name: "mcs",
        schema: machine_set_schema(),
        status: true,
        scale: true,
        columns: vec![
            column(
                "Desired",
                "integer",
                ".spec.replicas",
                "Number of desired replicas.",
                None,
            ),
            column(
                "Current",
                "integer",
                ".status.replicas",
                "Number of actual replicas.",
                None,
            ),
            column(
                "Ready",
                "integer",
                ".status.readyReplicas",
                "Number of ready replicas for this machine set.",
                None,
            ),
            age_column(),
        ],
    })
}

/// The CRD of `MachineDeployment` (`machinedeployments.machine.sapcloud.io`, short name `mcd`).
pub fn machine_deployment() -> Result<CustomResourceDefinition, CrdError> {
    build(KindDef {
        group: GROUP,
        version: crate::resource::VERSION,
        categories: &[],
        labels: &[],
        kind: "MachineDeployment",
        plural: "machinedeployments",
        singular: "machinedeployment",
        short_name: "mcd",
        schema: machine_deployment_schema(),
        status: true,
        scale: true,
        columns: vec![
            column(
                "Ready",
                "integer",
                ".status.readyReplicas",
                "Total number of ready machines targeted by this machine deployment.",
                None,
            ),
            column(
                "Desired",
                "integer",
                ".spec.replicas",
                "Number of desired machines.",
                None,
            ),
            column(
                "Up-to-date",
                "integer",
                ".status.updatedReplicas",
                "Total number of non-terminated machines targeted by this machine deployment that have the desired \
                 template spec.",
                None,
            ),
            column(
                "Available",
                "integer",
                ".status.availableReplicas",
                "Total number of available machines (ready for at least minReadySeconds) targeted by this machine \
                 deployment.",
                None,
            ),
            age_column(),
        ],
    })
}

/// The CRD of `MachineClass` (`machineclasses.machine.sapcloud.io`, short name `mcc`); no subresources.
pub fn machine_class() -> Result<CustomResourceDefinition, CrdError> {
    let secret_reference = json!({
        "description": "SecretReference names a secret by name and namespace.",
        "type": "object",
        "properties": {
            "name": { "description": "Name of the secret.", "type": "string" },
            "namespace": { "description": "Namespace of the secret.", "type": "string" }
        },
        "x-kubernetes-map-type": "atomic"
    });
    let mut node_template = schema_of::<NodeTemplate>();
    node_template["description"] =
        json!("NodeTemplate contains resources and placement of the nodes, for scale-from-zero.");
    // Required on the wire as in the reference (Go fields without omitempty); the Rust type keeps serde defaults
    // so that the controllers can still read, and report on, an object stored before this rule.
    node_template["required"] = json!(["capacity", "instanceType", "region", "zone"]);
    // The reference keeps fields of a node template this version does not declare (`+kubebuilder:pruning:...`).
    node_template["x-kubernetes-preserve-unknown-fields"] = json!(true);
    crd_shape::strip(&mut node_template);
    build(KindDef {
        group: GROUP,
        version: crate::resource::VERSION,
        categories: &[],
        labels: &[],
        kind: "MachineClass",
        plural: "machineclasses",
        singular: "machineclass",
        short_name: "mcc",
        schema: root_schema(
            "MachineClass can be used to templatize and re-use provider configuration across multiple Machines / \
             MachineSets / MachineDeployments.",
            json!({
                "nodeTemplate": node_template,
                "credentialsSecretRef": secret_reference,
                "providerSpec": {
                    "description": "Provider-specific configuration to use during node creation.",
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true
                },
                "provider": {
                    "description": "Provider is the combination of name and location of cloud-specific drivers.",
                    "type": "string"
                },
                "secretRef": secret_reference,
            }),
            &["providerSpec"],
        ),
        status: false,
        scale: false,
        columns: Vec::new(),
    })
}

/// The four CRDs, in the order `mcm crds` prints them.
pub fn all() -> Result<Vec<CustomResourceDefinition>, CrdError> {
    Ok(vec![
        machine_class()?,
        machine()?,
        machine_set()?,
        machine_deployment()?,
    ])
}

/// The CRDs as one multi-document YAML stream.
pub fn to_yaml(crds: &[CustomResourceDefinition]) -> Result<String, CrdError> {
    let mut out = String::new();
    for crd in crds {
        // k8s-openapi writes apiVersion and kind itself.
        let yaml = serde_saphyr::to_string(crd).map_err(|err| CrdError::Yaml(err.to_string()))?;
        out.push_str("---\n");
        out.push_str(&yaml);
        if !yaml.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}
