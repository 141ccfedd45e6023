//! Defaulting from a structural schema, as the API server does for custom resources: a property with a `default`
//! that is missing (or `null` without `nullable`) gets the default, recursively, wherever its parent object exists.
//! Applied on create, update and patch, and to objects read from storage.

use serde_json::Value;

/// True when the schema declares a `default` anywhere (so that objects need defaulting at all).
pub fn has_defaults(schema: &Value) -> bool {
    schema.get("default").is_some()
        || schema
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|props| props.values().any(has_defaults))
        || schema
            .get("additionalProperties")
            .is_some_and(|a| a.is_object() && has_defaults(a))
        || schema.get("items").is_some_and(has_defaults)
}

/// Applies the defaults of `schema` to `value`, recursively. Existing values are never changed.
pub fn apply(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(fields) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                for (name, child_schema) in properties {
                    let nullable = child_schema.get("nullable") == Some(&Value::Bool(true));
                    let missing = match fields.get(name) {
                        None => true,
                        Some(Value::Null) => !nullable,
                        Some(_) => false,
                    };
                    if missing && let Some(default) = child_schema.get("default") {
                        fields.insert(name.clone(), default.clone());
                    }
                    if let Some(child) = fields.get_mut(name) {
                        apply(child_schema, child);
                    }
                }
            }
            if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                let declared = schema.get("properties").and_then(Value::as_object);
                for (name, child) in fields.iter_mut() {
                    if declared.is_none_or(|d| !d.contains_key(name)) {
                        apply(additional, child);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    apply(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "paused": { "type": "boolean", "default": false },
                        "network": {
                            "type": "object",
                            "properties": { "domain": { "type": "string", "default": "cluster.local" } }
                        },
                        "workers": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": { "replicas": { "type": "integer", "default": 1 } }
                            }
                        }
                    }
                }
            }
        })
    }

    #[test]
    fn defaults_fill_missing_fields_of_existing_parents_only() {
        let mut object = json!({ "spec": { "workers": [{ "replicas": 3 }, {}] } });
        apply(&schema(), &mut object);
        assert_eq!(
            object,
            json!({ "spec": { "paused": false, "workers": [{ "replicas": 3 }, { "replicas": 1 }] } }),
            "network is absent, so its domain is not defaulted; existing values stay"
        );
        let mut empty = json!({});
        apply(&schema(), &mut empty);
        assert_eq!(empty, json!({}), "no spec, no defaults below it");
    }

    #[test]
    fn a_null_field_is_defaulted_unless_nullable() {
        let mut object = json!({ "spec": { "paused": null, "network": {} } });
        apply(&schema(), &mut object);
        assert_eq!(object["spec"]["paused"], false);
        assert_eq!(object["spec"]["network"]["domain"], "cluster.local");
    }

    #[test]
    fn has_defaults_finds_nested_defaults() {
        assert!(has_defaults(&schema()));
        assert!(!has_defaults(
            &json!({ "type": "object", "properties": { "a": { "type": "string" } } })
        ));
    }
}
