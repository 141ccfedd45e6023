//! Readers of the stored JSON that the row functions share (a missing or mistyped field reads as empty, never
//! panics), and the cells every printer has (name, age).

use jiff::Timestamp;
use serde_json::{Value, json};

use super::age::age_since;

pub(super) fn at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter().try_fold(v, |cur, key| cur.get(key))
}

pub(super) fn str_at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v str> {
    at(v, path).and_then(Value::as_str)
}

pub(super) fn string_at(v: &Value, path: &[&str]) -> String {
    str_at(v, path).unwrap_or_default().to_owned()
}

pub(super) fn array_at<'v>(v: &'v Value, path: &[&str]) -> &'v [Value] {
    at(v, path).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

pub(super) fn int_at(v: &Value, path: &[&str]) -> i64 {
    at(v, path).and_then(Value::as_i64).unwrap_or(0)
}

pub(super) fn name_of(obj: &Value) -> String {
    string_at(obj, &["metadata", "name"])
}

pub(super) fn creation_age(obj: &Value, now: Timestamp) -> Value {
    json!(age_since(str_at(obj, &["metadata", "creationTimestamp"]), now))
}

/// An int-or-string as text (`2`, `"50%"`).
pub(super) fn int_or_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}
