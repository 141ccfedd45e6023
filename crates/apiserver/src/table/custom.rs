//! Custom resources: the cells of CRD printer columns (`additionalPrinterColumns`), a simple JSON path evaluated
//! against the object and typed as the apiextensions server types it.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::age::age_since;

/// Evaluates a simple JSON path (`.a.b`, `.metadata.labels['a.b/c']`, `.items[0]`, optionally in `{}`); None when
/// the path leads nowhere or uses unsupported syntax.
pub(super) fn eval_path<'v>(obj: &'v Value, path: &str) -> Option<&'v Value> {
    let mut rest = path.trim();
    if let Some(inner) = rest.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
        rest = inner.trim();
    }
    let mut cur = obj;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            if key.is_empty() {
                return None;
            }
            cur = cur.as_object()?.get(key)?;
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let r = r.trim_start();
            if let Some(quote) = r.chars().next().filter(|c| *c == '\'' || *c == '"') {
                let body = &r[1..];
                let close = body.find(quote)?;
                let key = &body[..close];
                rest = body[close + 1..].trim_start().strip_prefix(']')?;
                cur = cur.as_object()?.get(key)?;
            } else {
                let close = r.find(']')?;
                let index: i64 = r[..close].trim().parse().ok()?;
                rest = &r[close + 1..];
                let items = cur.as_array()?;
                let len = i64::try_from(items.len()).ok()?;
                let index = if index < 0 { len + index } else { index };
                cur = items.get(usize::try_from(index).ok()?)?;
            }
        } else {
            return None;
        }
    }
    Some(cur)
}

/// A cell of a CRD column, typed as the apiextensions server types it; missing or mistyped values are null.
pub(super) fn custom_cell(type_: &str, value: Option<&Value>, now: Timestamp) -> Value {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Value::Null;
    };
    match type_ {
        "string" => match value {
            Value::String(s) => json!(s),
            Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_) => {
                json!(value.to_string())
            }
            Value::Null => Value::Null,
        },
        "integer" => value
            .as_i64()
            .map(Value::from)
            .or_else(|| value.as_f64().map(|f| json!(f as i64)))
            .unwrap_or(Value::Null),
        "number" => value.as_f64().map_or(Value::Null, |f| json!(f)),
        "boolean" => value.as_bool().map_or(Value::Null, Value::from),
        "date" => value
            .as_str()
            .map_or(Value::Null, |s| json!(age_since(Some(s), now))),
        _ => Value::Null,
    }
}
