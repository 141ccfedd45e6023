//! Checking an object against its structural schema, as the API server does for custom resources: unknown
//! fields are found (and pruned), and wrong types, missing required fields, unsupported enum values, strings that
//! miss their `pattern` and repeated items of a `set` list become the field causes of a 422.

use serde_json::Value;

use crate::error::Cause;

/// What the check found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Paths of fields the schema does not declare (pruned from the object).
    pub unknown: Vec<String>,
    /// Type, required, enum, pattern and set-uniqueness violations.
    pub causes: Vec<Cause>,
}

/// Checks `value` against `schema`, removing undeclared fields (and `null` values of fields that are not
/// nullable, which the API server drops too). The root `metadata` of a custom resource is the server's own and is
/// only checked when the schema declares its properties.
pub fn check(schema: &Value, value: &mut Value) -> Report {
    let mut report = Report::default();
    walk(schema, value, "", &mut report);
    // The real server reports causes in field-path order (nodeTemplate.instanceType before providerSpec).
    report.causes.sort_by(|a, b| a.field.cmp(&b.field));
    report
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(expected: &str, value: &Value) -> bool {
    match expected {
        "number" => value.is_number(),
        other => json_type(value) == other,
    }
}

fn walk(schema: &Value, value: &mut Value, path: &str, report: &mut Report) {
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        if !(value.is_string() || value.as_i64().is_some() || value.as_u64().is_some()) {
            report.causes.push(type_cause(path, value, "integer or string"));
        }
        check_pattern(schema, value, path, report);
        return;
    }
    if let Some(expected) = schema.get("type").and_then(Value::as_str)
        && !type_matches(expected, value)
    {
        report.causes.push(type_cause(path, value, expected));
        return;
    }
    check_pattern(schema, value, path, report);
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !value.is_null()
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        report.causes.push(Cause {
            reason: "FieldValueNotSupported",
            message: format!(
                "Unsupported value: {value}: supported values: {}",
                list.join(", ")
            ),
            field: path.to_owned(),
        });
    }
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    match value {
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            if properties.is_none() && additional.is_none() {
                // A free-form object (or one whose fields the schema leaves open): nothing more to check.
                return;
            }
            if let Some(required) = schema.get("required").and_then(Value::as_array) {
                for name in required.iter().filter_map(Value::as_str) {
                    if fields.get(name).is_none_or(Value::is_null) {
                        report.causes.push(Cause {
                            reason: "FieldValueRequired",
                            message: "Required value".into(),
                            field: join(path, name),
                        });
                    }
                }
            }
            let mut remove = Vec::new();
            for (name, child) in fields.iter_mut() {
                let child_path = join(path, name);
                let child_schema = properties.and_then(|p| p.get(name)).or(additional);
                match child_schema {
                    Some(child_schema) => {
                        let nullable = child_schema.get("nullable") == Some(&Value::Bool(true));
                        if child.is_null() {
                            if !nullable {
                                remove.push(name.clone());
                            }
                            continue;
                        }
                        walk(child_schema, child, &child_path, report);
                    }
                    None if preserve => {}
                    None => {
                        report.unknown.push(child_path);
                        remove.push(name.clone());
                    }
                }
            }
            for name in remove {
                fields.remove(&name);
            }
        }
        Value::Array(items) => {
            if schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("set") {
                duplicates(items, path, report);
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    if !item.is_null() {
                        walk(item_schema, item, &format!("{path}[{i}]"), report);
                    }
                }
            }
        }
        _ => {}
    }
}

/// Items of a `x-kubernetes-list-type: set` that repeat an earlier one, as kube-apiserver reports them.
fn duplicates(items: &[Value], path: &str, report: &mut Report) {
    for (i, item) in items.iter().enumerate() {
        if items[..i].contains(item) {
            report.causes.push(Cause {
                reason: "FieldValueDuplicate",
                message: format!("Duplicate value: {item}"),
                field: format!("{path}[{i}]"),
            });
        }
    }
}

/// A string against the schema's `pattern` (OpenAPI: it applies to strings only), with kube-apiserver's message.
/// A pattern that does not compile is a broken CRD; it is refused when the CRD is stored, so here it matches all.
fn check_pattern(schema: &Value, value: &Value, path: &str, report: &mut Report) {
    let (Some(pattern), Some(text)) = (schema.get("pattern").and_then(Value::as_str), value.as_str()) else {
        return;
    };
    if patterns::matches(pattern, text) == Some(false) {
        report.causes.push(Cause {
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {value}: {path} in body should match '{pattern}'"),
            field: path.to_owned(),
        });
    }
}

/// Compiled `pattern`s, kept for the life of the process: a server serves few CRDs, each with few patterns.
mod patterns {
    use std::{
        collections::HashMap,
        sync::{Mutex, OnceLock},
    };

    use regex::Regex;

    /// Most patterns kept compiled; beyond it (CRDs rewritten over and over) a pattern is compiled per check.
    const KEPT: usize = 256;

    /// Whether `text` matches `pattern`; `None` when the pattern does not compile.
    pub(super) fn matches(pattern: &str, text: &str) -> Option<bool> {
        static CACHE: OnceLock<Mutex<HashMap<String, Option<Regex>>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Mutex::default);
        let mut kept = cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(compiled) = kept.get(pattern) {
            return compiled.as_ref().map(|re| re.is_match(text));
        }
        let compiled = Regex::new(pattern).ok();
        let verdict = compiled.as_ref().map(|re| re.is_match(text));
        if kept.len() < KEPT {
            kept.insert(pattern.to_owned(), compiled);
        }
        verdict
    }
}

fn type_cause(path: &str, value: &Value, expected: &str) -> Cause {
    let actual = json_type(value);
    Cause {
        reason: "FieldValueTypeInvalid",
        message: format!(
            "Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\""
        ),
        field: path.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn machine_class_schema() -> Value {
        crate::preinstalled::registry()
            .find("machine.sapcloud.io", "v1alpha1", "machineclasses")
            .unwrap()
            .schema()
            .clone()
    }

    #[test]
    fn unknown_fields_are_reported_and_pruned_but_free_form_fields_are_kept() {
        let mut class = json!({
            "metadata": { "name": "c", "anything": 1 },
            "providerSpec": { "whatever": { "nested": true } },
            "colour": "blue",
            "nodeTemplate": { "capacity": { "cpu": 2 }, "instanceType": "s", "region": "r", "zone": "z", "shape": "round" }
        });
        let report = check(&machine_class_schema(), &mut class);
        assert_eq!(report.unknown, ["colour"]);
        assert_eq!(
            class["nodeTemplate"]["shape"], "round",
            "a node template keeps fields it does not declare, as the reference's CRD"
        );
        assert!(report.causes.is_empty(), "{:?}", report.causes);
        assert!(class.get("colour").is_none());
        assert_eq!(class["providerSpec"]["whatever"]["nested"], true);
        assert_eq!(
            class["metadata"]["anything"], 1,
            "the root metadata of a custom resource is not pruned here"
        );
    }

    /// Each cause of `report` as (reason, field).
    fn reasons_and_fields(report: &Report) -> Vec<(&'static str, &str)> {
        report
            .causes
            .iter()
            .map(|c| (c.reason, c.field.as_str()))
            .collect()
    }

    #[test]
    fn wrong_types_and_missing_required_fields_are_causes() {
        let mut class =
            json!({ "metadata": { "name": "c" }, "nodeTemplate": { "capacity": {}, "instanceType": 7 } });
        let report = check(&machine_class_schema(), &mut class);
        let found = reasons_and_fields(&report);
        assert!(
            found.contains(&("FieldValueRequired", "providerSpec")),
            "{found:?}"
        );
        assert!(
            found.contains(&("FieldValueTypeInvalid", "nodeTemplate.instanceType")),
            "{found:?}"
        );
        let type_error = report
            .causes
            .iter()
            .find(|c| c.field == "nodeTemplate.instanceType")
            .unwrap();
        assert_eq!(
            type_error.message,
            "Invalid value: \"integer\": nodeTemplate.instanceType in body must be of type string: \"integer\""
        );
    }

    #[test]
    fn quantities_are_checked_against_the_reference_pattern_as_integer_or_string() {
        let mut class = json!({
            "metadata": { "name": "c" },
            "providerSpec": {},
            "nodeTemplate": {
                "capacity": { "cpu": 2, "memory": "8Gi", "gpu": "2 cards", "disk": 1.5 },
                "instanceType": "s", "region": "r", "zone": "z"
            }
        });
        let report = check(&machine_class_schema(), &mut class);
        let found = reasons_and_fields(&report);
        assert_eq!(
            found,
            [
                ("FieldValueTypeInvalid", "nodeTemplate.capacity.disk"),
                ("FieldValueInvalid", "nodeTemplate.capacity.gpu"),
            ]
        );
        assert!(
            report.causes[1].message.starts_with(
                "Invalid value: \"2 cards\": nodeTemplate.capacity.gpu in body should match '^(\\+|-)?"
            ),
            "{}",
            report.causes[1].message
        );
    }

    #[test]
    fn enum_values_are_checked() {
        let schema =
            json!({ "type": "object", "properties": { "phase": { "type": "string", "enum": ["A", "B"] } } });
        let mut value = json!({ "phase": "C" });
        let report = check(&schema, &mut value);
        assert_eq!(report.causes[0].reason, "FieldValueNotSupported");
        assert_eq!(report.causes[0].field, "phase");
    }
}
