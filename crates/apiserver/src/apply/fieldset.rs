//! Sets of field paths, as structured-merge-diff writes them: the fields a manager owns, read from and written to
//! the `FieldsV1` form kube-apiserver stores in `metadata.managedFields`.
//!
//! A path is a list of elements: `f:<name>` (a map field), `k:<json>` (an element of a list of maps, by its keys),
//! `v:<json>` (an element of a set list, by its value) and `i:<n>` (a list element by position). In `FieldsV1`
//! each path element is a key of nested JSON objects; `{}` marks a member, and `".": {}` marks a member that
//! also has members below it.

use std::{collections::BTreeSet, fmt::Write as _};

use serde_json::{Map, Value};

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Element {
    /// A field of a map.
    Field(String),
    /// An element of a list of maps, named by its key fields (sorted by name; values as compact JSON).
    Key(Vec<(String, String)>),
    /// An element of a set list, by its value (compact JSON).
    Value(String),
    /// An element of a list by position.
    Index(usize),
}

impl Element {
    /// The key of this element in `FieldsV1` (`f:name`, `k:{"name":"x"}`, `v:"a"`, `i:0`).
    fn to_fields_v1(&self) -> String {
        match self {
            Self::Field(name) => format!("f:{name}"),
            Self::Key(keys) => {
                let object: Map<String, Value> = keys
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::from_str(v).unwrap_or(Value::Null)))
                    .collect();
                format!("k:{}", Value::Object(object))
            }
            Self::Value(value) => format!("v:{value}"),
            Self::Index(index) => format!("i:{index}"),
        }
    }

    /// Reads a `FieldsV1` key; None for one that is not a path element.
    fn from_fields_v1(key: &str) -> Option<Self> {
        let (prefix, rest) = key.split_once(':')?;
        match prefix {
            "f" => Some(Self::Field(rest.to_owned())),
            "k" => {
                let Value::Object(keys) = serde_json::from_str::<Value>(rest).ok()? else {
                    return None;
                };
                Some(Self::Key(
                    keys.into_iter().map(|(k, v)| (k, v.to_string())).collect(),
                ))
            }
            "v" => serde_json::from_str::<Value>(rest)
                .ok()
                .map(|v| Self::Value(v.to_string())),
            "i" => rest.parse().ok().map(Self::Index),
            _ => None,
        }
    }
}

/// A field path from the object root.
pub type Path = Vec<Element>;

/// Writes a path as kube-apiserver does in conflict messages: `.spec.replicas`, `.spec.containers[name="x"].image`,
/// `.metadata.finalizers[="a"]`, `[0]`.
pub fn display(path: &[Element]) -> String {
    let mut text = String::new();
    for element in path {
        match element {
            Element::Field(name) => {
                text.push('.');
                text.push_str(name);
            }
            Element::Key(keys) => {
                let parts: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = write!(text, "[{}]", parts.join(","));
            }
            Element::Value(value) => {
                let _ = write!(text, "[={value}]");
            }
            Element::Index(index) => {
                let _ = write!(text, "[{index}]");
            }
        }
    }
    text
}

/// A set of field paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet(BTreeSet<Path>);

impl FieldSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a path.
    pub fn insert(&mut self, path: Path) {
        self.0.insert(path);
    }

    /// Whether the path is a member.
    pub fn contains(&self, path: &[Element]) -> bool {
        self.0.contains(path)
    }

    /// No members.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The members, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Path> {
        self.0.iter()
    }

    /// Whether `path` or a path below it is a member.
    pub fn has_prefix(&self, path: &[Element]) -> bool {
        self.0
            .range(path.to_vec()..)
            .next()
            .is_some_and(|member| member.starts_with(path))
    }

    /// The members `keep` accepts.
    #[must_use]
    pub fn filter(&self, keep: impl Fn(&[Element]) -> bool) -> Self {
        Self(self.0.iter().filter(|p| keep(p)).cloned().collect())
    }

    /// The members of both sets.
    #[must_use]
    pub fn union(&self, other: &Self) -> Self {
        Self(self.0.union(&other.0).cloned().collect())
    }

    /// The members not in `other`.
    #[must_use]
    pub fn difference(&self, other: &Self) -> Self {
        Self(self.0.difference(&other.0).cloned().collect())
    }

    /// The members also in `other`.
    #[must_use]
    pub fn intersection(&self, other: &Self) -> Self {
        Self(self.0.intersection(&other.0).cloned().collect())
    }

    /// The `FieldsV1` object of the set.
    pub fn to_fields_v1(&self) -> Value {
        let mut root = Map::new();
        for path in &self.0 {
            insert_path(&mut root, path);
        }
        strip_lone_dots(&mut root);
        Value::Object(root)
    }

    /// Reads a `FieldsV1` object; keys that are not path elements are skipped.
    pub fn from_fields_v1(value: &Value) -> Self {
        let mut set = Self::new();
        if let Value::Object(map) = value {
            read_node(map, &mut Vec::new(), &mut set);
        }
        set
    }
}

/// Adds the nodes of `path` below `node`, the last marked as a member with `"."`.
fn insert_path(node: &mut Map<String, Value>, path: &[Element]) {
    let Some((first, rest)) = path.split_first() else {
        node.insert(".".into(), Value::Object(Map::new()));
        return;
    };
    let slot = node
        .entry(first.to_fields_v1())
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(child) = slot {
        insert_path(child, rest);
    }
}

/// A member with no members below it is written `{}`, not `{".": {}}`.
fn strip_lone_dots(node: &mut Map<String, Value>) {
    for child in node.values_mut() {
        if let Value::Object(child) = child {
            if child.len() == 1 && child.contains_key(".") {
                child.clear();
            } else {
                strip_lone_dots(child);
            }
        }
    }
}

fn read_node(node: &Map<String, Value>, path: &mut Path, set: &mut FieldSet) {
    for (key, child) in node {
        let Some(element) = Element::from_fields_v1(key) else {
            continue;
        };
        path.push(element);
        match child {
            Value::Object(children) if !children.is_empty() => {
                if children.contains_key(".") {
                    set.insert(path.clone());
                }
                read_node(children, path, set);
            }
            _ => set.insert(path.clone()),
        }
        path.pop();
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn field(name: &str) -> Element {
        Element::Field(name.into())
    }

    #[test]
    fn fields_v1_round_trips_with_dots_only_on_members_that_have_children() {
        let fields = json!({
            "f:data": { "f:a": {} },
            "f:spec": {
                "f:containers": {
                    "k:{\"name\":\"app\"}": { ".": {}, "f:image": {}, "f:name": {} }
                },
                "f:finalizers": { "v:\"x\"": {} }
            }
        });
        let set = FieldSet::from_fields_v1(&fields);
        let key = Element::Key(vec![("name".into(), "\"app\"".into())]);
        assert!(set.contains(&[field("data"), field("a")]));
        assert!(set.contains(&[field("spec"), field("containers"), key.clone()]));
        assert!(set.contains(&[field("spec"), field("containers"), key, field("image")]));
        assert!(
            !set.contains(&[field("spec")]),
            "a map with members is not itself a member"
        );
        assert_eq!(set.to_fields_v1(), fields);
    }

    #[test]
    fn paths_are_written_as_kube_apiserver_writes_them() {
        let path = vec![
            field("spec"),
            field("containers"),
            Element::Key(vec![("name".into(), "\"app\"".into())]),
            field("image"),
        ];
        assert_eq!(display(&path), ".spec.containers[name=\"app\"].image");
        assert_eq!(
            display(&[
                field("metadata"),
                field("finalizers"),
                Element::Value("\"a\"".into())
            ]),
            ".metadata.finalizers[=\"a\"]"
        );
    }

    #[test]
    fn prefix_lookup_finds_members_below_a_path() {
        let mut set = FieldSet::new();
        set.insert(vec![field("spec"), field("replicas")]);
        assert!(set.has_prefix(&[field("spec")]));
        assert!(set.has_prefix(&[field("spec"), field("replicas")]));
        assert!(!set.has_prefix(&[field("status")]));
        assert!(!set.has_prefix(&[field("spec"), field("replicasx")]));
    }
}
