//! How server-side apply merges each part of an object: maps by key unless the schema calls them atomic, lists
//! atomic unless the schema gives an `x-kubernetes-list-type` of `set` or `map` (keyed by
//! `x-kubernetes-list-map-keys`), and, for built-in kinds and every object's metadata, the strategic merge keys of
//! [`crate::patch`].

use serde_json::Value;

use crate::patch::{ListStrategy, list_strategy};

/// How a list is merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListType {
    /// Replaced whole; owned as one field.
    Atomic,
    /// Scalars merged as a set; each value owned on its own.
    Set,
    /// Maps merged by these key fields; each element owned on its own.
    Map(Vec<String>),
}

/// A place in an object: its schema node and the field names that lead to it (list elements add no name).
#[derive(Clone, Debug)]
pub struct Shape<'s> {
    schema: &'s Value,
    /// Set for built-in kinds, whose lists follow the strategic merge keys.
    builtin_kind: Option<&'s str>,
    names: Vec<String>,
}

static NO_SCHEMA: Value = Value::Null;

impl<'s> Shape<'s> {
    /// The root of an object of a kind with this schema (`builtin_kind` for kinds that are not custom resources).
    pub fn root(schema: &'s Value, builtin_kind: Option<&'s str>) -> Self {
        Self {
            schema,
            builtin_kind,
            names: Vec::new(),
        }
    }

    /// The shape of a map field.
    #[must_use]
    pub fn field(&self, name: &str) -> Self {
        let schema = self.schema["properties"]
            .get(name)
            .or_else(|| self.schema.get("additionalProperties").filter(|s| s.is_object()))
            .unwrap_or(&NO_SCHEMA);
        let mut names = self.names.clone();
        names.push(name.to_owned());
        Self {
            schema,
            builtin_kind: self.builtin_kind,
            names,
        }
    }

    /// The shape of a list element.
    #[must_use]
    pub fn item(&self) -> Self {
        Self {
            schema: self.schema.get("items").unwrap_or(&NO_SCHEMA),
            builtin_kind: self.builtin_kind,
            names: self.names.clone(),
        }
    }

    /// Whether a map here is one field (`x-kubernetes-map-type: atomic`).
    pub fn atomic_map(&self) -> bool {
        self.schema["x-kubernetes-map-type"].as_str() == Some("atomic")
    }

    /// How a list here is merged.
    pub fn list_type(&self) -> ListType {
        match self.schema["x-kubernetes-list-type"].as_str() {
            Some("set") => return ListType::Set,
            Some("map") => {
                let keys = self.schema["x-kubernetes-list-map-keys"]
                    .as_array()
                    .map(|keys| keys.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                    .unwrap_or_default();
                return ListType::Map(keys);
            }
            Some(_) => return ListType::Atomic,
            None => {}
        }
        let strategic = match (self.builtin_kind, self.names.first().map(String::as_str)) {
            (Some(kind), _) => Some(kind),
            // Every object's metadata is the built-in ObjectMeta.
            (None, Some("metadata")) => Some(""),
            _ => None,
        };
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        match strategic.map(|kind| list_strategy(kind, &names)) {
            Some(ListStrategy::MergeKey(key)) => ListType::Map(vec![key.to_owned()]),
            Some(ListStrategy::PrimitiveSet) => ListType::Set,
            Some(ListStrategy::Atomic) | None => ListType::Atomic,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn list_types_come_from_the_schema_extensions() {
        let schema = json!({ "properties": { "spec": { "properties": {
            "zones": { "type": "array", "x-kubernetes-list-type": "set" },
            "pools": { "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"] },
            "args": { "type": "array" },
            "labels": { "type": "object", "x-kubernetes-map-type": "atomic" },
        } } } });
        let root = Shape::root(&schema, None);
        let spec = root.field("spec");
        assert_eq!(spec.field("zones").list_type(), ListType::Set);
        assert_eq!(
            spec.field("pools").list_type(),
            ListType::Map(vec!["name".into()])
        );
        assert_eq!(spec.field("args").list_type(), ListType::Atomic);
        assert!(spec.field("labels").atomic_map());
        assert!(!spec.atomic_map());
    }

    #[test]
    fn built_ins_and_metadata_follow_the_strategic_merge_keys() {
        let none = Value::Null;
        let pod = Shape::root(&none, Some("Pod"));
        assert_eq!(
            pod.field("spec").field("containers").list_type(),
            ListType::Map(vec!["name".into()])
        );
        let custom = Shape::root(&none, None);
        assert_eq!(
            custom.field("metadata").field("finalizers").list_type(),
            ListType::Set
        );
        assert_eq!(
            custom.field("spec").field("containers").list_type(),
            ListType::Atomic
        );
    }
}
