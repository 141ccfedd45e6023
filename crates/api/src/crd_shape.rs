//! The generated schemas brought to the reference CRDs' shape, so that installed on a real cluster ours accept,
//! default, prune and merge exactly what the reference's do.
//!
//! schemars writes `default` for every `#[serde(default)]` field and `nullable: true` for every `Option`; the
//! reference (controller-gen) writes neither, so a real API server would store `class: {}` or keep a `null` where the
//! reference stores nothing. k8s-openapi's `Quantity` and `IntOrString` lack the `anyOf`/`pattern` controller-gen
//! writes, and the list and map markers of the reference's Go types (`+listType`, `+mapType`) are not in the Rust
//! types. Each rule here names what the reference's CRD has at that place.

use serde_json::{Map, Value, json};

/// The pattern controller-gen writes for a `resource.Quantity` (as int-or-string).
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// Removes `default` and `nullable` everywhere and writes int-or-string fields as controller-gen does (quantities
/// with the quantity pattern).
pub fn strip(schema: &mut Value) {
    let Some(node) = schema.as_object_mut() else {
        return;
    };
    node.remove("default");
    node.remove("nullable");
    if node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        let is_quantity = node
            .get("description")
            .and_then(Value::as_str)
            .is_some_and(|d| d.starts_with("Quantity is a fixed-point"));
        if is_quantity {
            // The Go type's long description is noise in a CRD; controller-gen writes none for map values.
            node.remove("description");
            node.insert("pattern".into(), json!(QUANTITY_PATTERN));
        }
        node.insert(
            "anyOf".into(),
            json!([{ "type": "integer" }, { "type": "string" }]),
        );
        return;
    }
    if let Some(Value::Object(properties)) = node.get_mut("properties") {
        properties.values_mut().for_each(strip);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = node.get_mut(key) {
            strip(child);
        }
    }
}

/// The schema node at `path` below `root`: each segment is a property name, `[]` steps into `items`.
fn at<'a>(root: &'a mut Value, path: &[&str]) -> Option<&'a mut Map<String, Value>> {
    let mut node = root;
    for segment in path {
        node = if *segment == "[]" {
            node.get_mut("items")?
        } else {
            node.get_mut("properties")?.get_mut(*segment)?
        };
    }
    node.as_object_mut()
}

/// Sets `key: value` on the node at `path`; a path the schema lacks is a bug in the types, caught by the tests.
fn mark(root: &mut Value, path: &[&str], key: &str, value: Value) {
    if let Some(node) = at(root, path) {
        node.insert(key.into(), value);
    } else {
        debug_assert!(false, "no schema node at {path:?}");
    }
}

/// The reference's markers on a label selector at `path` (`metav1.LabelSelector` is `+mapType=atomic`, its lists
/// `+listType=atomic`), so that server-side apply replaces a selector whole.
pub fn mark_selector(root: &mut Value, path: &[&str]) {
    mark(root, path, "x-kubernetes-map-type", json!("atomic"));
    let expressions = [path, &["matchExpressions"]].concat();
    mark(root, &expressions, "x-kubernetes-list-type", json!("atomic"));
    let values = [path, &["matchExpressions", "[]", "values"]].concat();
    mark(root, &values, "x-kubernetes-list-type", json!("atomic"));
}

/// The reference's markers in a node template at `path` (`NodeSpec.podCIDRs` is a set, `taints` atomic).
pub fn mark_node_template(root: &mut Value, path: &[&str]) {
    let pod_cidrs = [path, &["spec", "podCIDRs"]].concat();
    mark(root, &pod_cidrs, "x-kubernetes-list-type", json!("set"));
    let taints = [path, &["spec", "taints"]].concat();
    mark(root, &taints, "x-kubernetes-list-type", json!("atomic"));
}

/// Adds `field` to the `required` list of the node at `path`.
pub fn require(root: &mut Value, path: &[&str], field: &str) {
    if let Some(node) = at(root, path) {
        let required = node.entry("required").or_insert_with(|| json!([]));
        if let Some(list) = required.as_array_mut()
            && !list.iter().any(|f| f == field)
        {
            list.push(json!(field));
        }
    } else {
        debug_assert!(false, "no schema node at {path:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_nullable_go_and_quantities_get_the_pattern() {
        let mut schema = json!({
            "type": "object",
            "default": {},
            "properties": {
                "class": { "type": "object", "default": {}, "nullable": true },
                "capacity": { "type": "object", "additionalProperties": {
                    "description": "Quantity is a fixed-point representation of a number.",
                    "x-kubernetes-int-or-string": true
                }},
                "maxSurge": { "x-kubernetes-int-or-string": true, "nullable": true }
            }
        });
        strip(&mut schema);
        assert!(schema.get("default").is_none());
        assert_eq!(schema["properties"]["class"], json!({ "type": "object" }));
        let quantity = &schema["properties"]["capacity"]["additionalProperties"];
        assert_eq!(quantity["pattern"], QUANTITY_PATTERN);
        assert!(quantity.get("description").is_none());
        assert_eq!(schema["properties"]["maxSurge"]["anyOf"][1]["type"], "string");
        assert!(schema["properties"]["maxSurge"].get("pattern").is_none());
    }
}
