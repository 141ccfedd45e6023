//! Label and field selector parsing: selector text built from the selector grammar's tokens and arbitrary text.
//! Must hold: no panic; a parsed selector evaluates on any labels and object; an empty text selects everything.

use std::collections::BTreeMap;

use arbitrary::{Result, Unstructured};
use mcm_apiserver::selectors::{FieldSelector, LabelSelector};

use crate::json;

const TOKENS: &[&str] = &[
    "a",
    "b",
    "app",
    "example.com/app",
    "metadata.name",
    "metadata.namespace",
    "status.phase",
    "spec.nodeName",
    "=",
    "==",
    "!=",
    "!",
    ",",
    " ",
    "in",
    "notin",
    "(",
    ")",
    "gt",
    "lt",
    ">",
    "<",
    "1",
    "x",
    "\\",
    "\\,",
    "\\=",
    "",
    "-",
    "_",
    ".",
    "/",
    "é",
];

fn text(u: &mut Unstructured<'_>) -> Result<String> {
    let mut text = String::new();
    for _ in 0..u.int_in_range(0..=12)? {
        if u.ratio(5, 6)? {
            text.push_str(u.choose(TOKENS)?);
        } else {
            text.push_str(&json::string(u)?);
        }
    }
    Ok(text)
}

fn labels(u: &mut Unstructured<'_>) -> Result<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let key = if u.ratio(1, 2)? {
            (*u.choose(&["a", "b", "app", "example.com/app"])?).to_owned()
        } else {
            json::string(u)?
        };
        labels.insert(key, json::string(u)?);
    }
    Ok(labels)
}

/// Parses the selector text the bytes describe, as a label and as a field selector, and evaluates what parses.
///
/// # Panics
///
/// When an empty selector does not select everything: the bug the target looks for.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let (Ok(text), Ok(labels), Ok(object)) = (text(&mut u), labels(&mut u), json::object(&mut u)) else {
        return;
    };
    if let Ok(selector) = LabelSelector::parse(&text) {
        let selected = selector.matches(&labels);
        if selector.is_empty() {
            assert!(selected, "an empty label selector {text:?} selects everything");
        }
    }
    if let Ok(selector) = FieldSelector::parse(&text) {
        let _ = selector.fields();
        let selected = selector.matches(&object);
        if selector.is_empty() {
            assert!(selected, "an empty field selector {text:?} selects everything");
        }
    }
}
