//! `mcm crds` output: four structural CRDs with the reference's names, short names, subresources and printer
//! columns (reference/mcm-inventory.md section 1.1), into whose schemas every example manifest fits.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

fn crds() -> Vec<CustomResourceDefinition> {
    mcm_api::crd::all().expect("CRDs generate")
}

fn crd(kind: &str) -> CustomResourceDefinition {
    crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"))
}

fn schema(kind: &str) -> Value {
    let crd = crd(kind);
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .unwrap()
        .open_api_v3_schema
        .as_ref()
        .unwrap();
    serde_json::to_value(schema).unwrap()
}

#[test]
fn the_yaml_output_is_stable() {
    insta::assert_snapshot!("crds", mcm_api::crd::to_yaml(&crds()).unwrap());
}

#[test]
fn names_short_names_and_scope_are_the_references() {
    let expected = [
        ("MachineClass", "machineclasses", "mcc"),
        ("Machine", "machines", "mc"),
        ("MachineSet", "machinesets", "mcs"),
        ("MachineDeployment", "machinedeployments", "mcd"),
    ];
    for (kind, plural, short) in expected {
        let crd = crd(kind);
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{plural}.machine.sapcloud.io").as_str())
        );
        assert_eq!(crd.spec.group, "machine.sapcloud.io");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.plural, plural);
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some([short.to_owned()].as_slice())
        );
        assert_eq!(crd.spec.versions.len(), 1);
        assert_eq!(crd.spec.versions[0].name, "v1alpha1");
        assert!(crd.spec.versions[0].served && crd.spec.versions[0].storage);
    }
}

#[test]
fn status_and_scale_subresources_are_the_references() {
    for (kind, status, scale) in [
        ("Machine", true, false),
        ("MachineSet", true, true),
        ("MachineDeployment", true, true),
        ("MachineClass", false, false),
    ] {
        let sub = crd(kind).spec.versions[0]
            .subresources
            .clone()
            .unwrap_or_default();
        assert_eq!(sub.status.is_some(), status, "{kind} status subresource");
        assert_eq!(sub.scale.is_some(), scale, "{kind} scale subresource");
        if let Some(scale) = sub.scale {
            assert_eq!(scale.spec_replicas_path, ".spec.replicas");
            assert_eq!(scale.status_replicas_path, ".status.replicas");
        }
    }
}

#[test]
fn printer_columns_are_the_references() {
    let columns = |kind: &str| -> Vec<(String, String, Option<i32>)> {
        crd(kind).spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.name, c.json_path, c.priority))
            .collect()
    };
    let col = |name: &str, path: &str, priority: Option<i32>| (name.to_owned(), path.to_owned(), priority);
    assert_eq!(
        columns("Machine"),
        [
            col("Status", ".status.currentStatus.phase", None),
            col("Age", ".metadata.creationTimestamp", None),
            col("Node", ".metadata.labels.node", None),
            col("ProviderID", ".spec.providerID", Some(1)),
        ]
    );
    assert_eq!(
        columns("MachineSet"),
        [
            col("Desired", ".spec.replicas", None),
            col("Current", ".status.replicas", None),
            col("Ready", ".status.readyReplicas", None),
            col("Age", ".metadata.creationTimestamp", None),
        ]
    );
    assert_eq!(
        columns("MachineDeployment"),
        [
            col("Ready", ".status.readyReplicas", None),
            col("Desired", ".spec.replicas", None),
            col("Up-to-date", ".status.updatedReplicas", None),
            col("Available", ".status.availableReplicas", None),
            col("Age", ".metadata.creationTimestamp", None),
        ]
    );
    assert!(columns("MachineClass").is_empty());
}

/// Walks a schema and returns the paths that break Kubernetes' structural-schema rules, and the paths of free-form
/// (preserve-unknown-fields) objects.
fn check_structural(schema: &Value, path: &str, problems: &mut Vec<String>, free_form: &mut Vec<String>) {
    let obj = schema
        .as_object()
        .unwrap_or_else(|| panic!("{path}: schema is not an object"));
    for forbidden in ["$ref", "oneOf", "allOf", "not", "definitions", "$defs"] {
        if obj.contains_key(forbidden) {
            problems.push(format!("{path}: has {forbidden}"));
        }
    }
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if obj.contains_key("anyOf") && !int_or_string {
        problems.push(format!("{path}: anyOf outside int-or-string"));
    }
    if !obj.contains_key("type") && !int_or_string {
        problems.push(format!("{path}: no type"));
    }
    if obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        free_form.push(path.to_owned());
    }
    if obj.contains_key("properties") && obj.contains_key("additionalProperties") {
        problems.push(format!("{path}: both properties and additionalProperties"));
    }
    if let Some(Value::Object(props)) = obj.get("properties") {
        for (name, child) in props {
            check_structural(child, &format!("{path}.{name}"), problems, free_form);
        }
    }
    if let Some(child @ Value::Object(_)) = obj.get("additionalProperties") {
        check_structural(child, &format!("{path}[*]"), problems, free_form);
    }
    if let Some(child) = obj.get("items") {
        check_structural(child, &format!("{path}[]"), problems, free_form);
    }
}

#[test]
fn schemas_are_structural_and_free_form_only_where_the_reference_is() {
    let mut free_form = Vec::new();
    for kind in ["MachineClass", "Machine", "MachineSet", "MachineDeployment"] {
        let mut problems = Vec::new();
        check_structural(&schema(kind), kind, &mut problems, &mut free_form);
        assert!(problems.is_empty(), "{kind}: {problems:#?}");
    }
    assert_eq!(
        free_form,
        [
            "MachineClass.nodeTemplate",
            "MachineClass.providerSpec",
            "Machine.spec.nodeTemplate.metadata",
            "MachineSet.spec.template.metadata",
            "MachineSet.spec.template.spec.nodeTemplate.metadata",
            "MachineDeployment.spec.template.metadata",
            "MachineDeployment.spec.template.spec.nodeTemplate.metadata",
        ]
    );
}

/// Asserts that every field of `value` is declared by `schema` (or sits under a free-form object), so that an API
/// server pruning unknown fields would keep the whole manifest.
fn assert_declared(value: &Value, schema: &Value, path: &str) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match value {
        Value::Object(fields) => {
            for (name, child) in fields {
                let child_path = format!("{path}.{name}");
                let child_schema = schema
                    .get("properties")
                    .and_then(|props| props.get(name))
                    .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()))
                    .unwrap_or_else(|| panic!("{child_path} is not declared in the CRD schema"));
                assert_declared(child, child_schema, &child_path);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                assert_declared(item, &schema["items"], &format!("{path}[{i}]"));
            }
        }
        _ => {}
    }
}

#[test]
fn every_example_fits_its_crd_schema() {
    for (path, text) in mcm_testkit::example_manifests() {
        let documents: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        for mut document in documents.into_iter().filter(|d| !d.is_null()) {
            let kind = document["kind"].as_str().unwrap().to_owned();
            // The root metadata is the API server's ObjectMeta, never pruned; the schema leaves it as `object`.
            document.as_object_mut().unwrap().remove("metadata");
            if document["apiVersion"] == "machine.sapcloud.io/v1alpha1" {
                assert_declared(&document, &schema(&kind), &path.display().to_string());
            }
        }
    }
}

/// Paths of schema nodes (below `path`) that carry `keyword`.
fn nodes_with(schema: &Value, keyword: &str, path: &str, found: &mut Vec<String>) {
    let Some(obj) = schema.as_object() else {
        return;
    };
    if obj.contains_key(keyword) {
        found.push(path.to_owned());
    }
    if let Some(Value::Object(props)) = obj.get("properties") {
        for (name, child) in props {
            nodes_with(child, keyword, &format!("{path}.{name}"), found);
        }
    }
    for (key, suffix) in [("additionalProperties", "[*]"), ("items", "[]")] {
        if let Some(child) = obj.get(key) {
            nodes_with(child, keyword, &format!("{path}{suffix}"), found);
        }
    }
}

/// The reference's CRDs (controller-gen) write no `default` (a real API server would store `class: {}` where the
/// reference stores nothing), no `nullable` (a `null` is dropped, not kept) and no `enum` (a status value written by a
/// newer version must be stored, and our controllers then treat it as unknown).
#[test]
fn no_default_nullable_or_enum_where_the_reference_has_none() {
    for kind in ["MachineClass", "Machine", "MachineSet", "MachineDeployment"] {
        for keyword in ["default", "nullable", "enum"] {
            let mut found = Vec::new();
            nodes_with(&schema(kind), keyword, kind, &mut found);
            assert!(found.is_empty(), "{kind}: `{keyword}` at {found:?}");
        }
    }
}

/// The reference's list and map markers (server-side apply merges by them), `spec.template` required on a
/// MachineDeployment, and quantities as int-or-string with the quantity pattern.
#[test]
fn markers_required_fields_and_quantities_are_the_references() {
    let deployment = schema("MachineDeployment");
    let spec = &deployment["properties"]["spec"];
    assert!(spec["required"].as_array().unwrap().contains(&"template".into()));
    for set in [schema("MachineSet"), deployment.clone()] {
        let selector = &set["properties"]["spec"]["properties"]["selector"];
        assert_eq!(selector["x-kubernetes-map-type"], "atomic");
        let expressions = &selector["properties"]["matchExpressions"];
        assert_eq!(expressions["x-kubernetes-list-type"], "atomic");
        assert_eq!(
            expressions["items"]["properties"]["values"]["x-kubernetes-list-type"],
            "atomic"
        );
    }
    let node_spec =
        &schema("Machine")["properties"]["spec"]["properties"]["nodeTemplate"]["properties"]["spec"];
    assert_eq!(
        node_spec["properties"]["podCIDRs"]["x-kubernetes-list-type"],
        "set"
    );
    assert_eq!(
        node_spec["properties"]["taints"]["x-kubernetes-list-type"],
        "atomic"
    );
    let class = schema("MachineClass");
    let node_template = &class["properties"]["nodeTemplate"];
    assert_eq!(node_template["x-kubernetes-preserve-unknown-fields"], true);
    for field in ["capacity", "virtualCapacity"] {
        let quantity = &node_template["properties"][field]["additionalProperties"];
        assert_eq!(quantity["x-kubernetes-int-or-string"], true, "{field}");
        assert_eq!(
            quantity["pattern"],
            mcm_api::crd_shape::QUANTITY_PATTERN,
            "{field}"
        );
        assert_eq!(
            quantity["anyOf"],
            serde_json::json!([{ "type": "integer" }, { "type": "string" }])
        );
    }
}
