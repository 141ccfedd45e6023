//! The structured-merge-diff operations server-side apply needs, on JSON objects and their [`Shape`]: the fields
//! an object sets, the merge of an applied configuration into the live object, the comparison of two objects, and
//! the removal of one field.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{
    fieldset::{Element, FieldSet, Path, display},
    shape::{ListType, Shape},
};

/// One member of an object's field set with its value.
#[derive(Debug)]
struct Member<'v> {
    value: &'v Value,
    /// An element of a list of maps: its fields are members of their own, so it is never "modified" itself.
    keyed_item: bool,
}

/// The fields `value` sets: every scalar, atomic list or atomic map, and every element of a `set` or `map` list.
/// Maps are not members themselves (an empty map sets nothing). An error names a list element without its key
/// fields or a duplicate element.
pub fn fields_of(value: &Value, shape: &Shape<'_>) -> Result<FieldSet, String> {
    let mut members = BTreeMap::new();
    walk(value, shape, &mut Vec::new(), &mut members)?;
    let mut set = FieldSet::new();
    for path in members.into_keys() {
        set.insert(path);
    }
    Ok(set)
}

fn walk<'v>(
    value: &'v Value,
    shape: &Shape<'_>,
    path: &mut Path,
    members: &mut BTreeMap<Path, Member<'v>>,
) -> Result<(), String> {
    match value {
        Value::Object(map) if !shape.atomic_map() => {
            for (key, child) in map {
                path.push(Element::Field(key.clone()));
                let child_shape = shape.field(key);
                if is_granular(child, &child_shape) {
                    walk(child, &child_shape, path, members)?;
                } else {
                    members.insert(
                        path.clone(),
                        Member {
                            value: child,
                            keyed_item: false,
                        },
                    );
                }
                path.pop();
            }
        }
        Value::Array(items) => {
            let list_type = shape.list_type();
            let item_shape = shape.item();
            for item in items {
                let element = item_element(item, &list_type)?;
                path.push(element);
                if members.contains_key(path.as_slice()) {
                    return Err(format!("duplicate entries for key {}", display(path)));
                }
                let keyed_item = matches!(list_type, ListType::Map(_));
                members.insert(
                    path.clone(),
                    Member {
                        value: item,
                        keyed_item,
                    },
                );
                if keyed_item {
                    walk(item, &item_shape, path, members)?;
                }
                path.pop();
            }
        }
        _ => {
            members.insert(
                path.clone(),
                Member {
                    value,
                    keyed_item: false,
                },
            );
        }
    }
    Ok(())
}

/// Whether the fields below `value` are owned one by one: non-atomic maps and `set`/`map` lists.
fn is_granular(value: &Value, shape: &Shape<'_>) -> bool {
    match value {
        Value::Object(_) => !shape.atomic_map(),
        Value::Array(_) => shape.list_type() != ListType::Atomic,
        _ => false,
    }
}

/// The path element of a list element.
fn item_element(item: &Value, list_type: &ListType) -> Result<Element, String> {
    match list_type {
        ListType::Map(keys) => {
            let mut named = Vec::with_capacity(keys.len());
            for key in keys {
                let value = item
                    .get(key)
                    .ok_or_else(|| format!("an element of a list keyed by {keys:?} has no {key:?}"))?;
                named.push((key.clone(), value.to_string()));
            }
            named.sort();
            Ok(Element::Key(named))
        }
        _ => Ok(Element::Value(item.to_string())),
    }
}

/// The applied configuration merged into the live object: maps merged by key, `set` lists united, `map` lists
/// merged element by element (live order kept, new elements appended), everything else replaced.
pub fn merge(live: &Value, config: &Value, shape: &Shape<'_>) -> Value {
    match (live, config) {
        (Value::Object(live_map), Value::Object(config_map)) if !shape.atomic_map() => {
            let mut merged = live_map.clone();
            for (key, value) in config_map {
                let child = match live_map.get(key) {
                    Some(old) => merge(old, value, &shape.field(key)),
                    None => value.clone(),
                };
                merged.insert(key.clone(), child);
            }
            Value::Object(merged)
        }
        (Value::Array(live_items), Value::Array(config_items)) => match shape.list_type() {
            ListType::Atomic => config.clone(),
            list_type => {
                let item_shape = shape.item();
                let element = |item: &Value| item_element(item, &list_type).ok();
                // Elements by name, so that merging is not quadratic in the list lengths.
                let applied: BTreeMap<Element, &Value> = config_items
                    .iter()
                    .filter_map(|item| element(item).map(|e| (e, item)))
                    .collect();
                let mut seen = std::collections::BTreeSet::new();
                let mut merged = Vec::with_capacity(live_items.len() + config_items.len());
                for item in live_items {
                    let name = element(item);
                    let config = name.as_ref().and_then(|name| applied.get(name));
                    merged.push(match config {
                        Some(config) => merge(item, config, &item_shape),
                        None => item.clone(),
                    });
                    seen.extend(name);
                }
                for item in config_items {
                    if element(item).is_none_or(|name| !seen.contains(&name)) {
                        merged.push(item.clone());
                    }
                }
                Value::Array(merged)
            }
        },
        _ => config.clone(),
    }
}

/// What changed between two objects, as paths of their field sets.
#[derive(Debug, Default)]
pub struct Comparison {
    /// Members of the new object only.
    pub added: FieldSet,
    /// Members of both whose value differs.
    pub modified: FieldSet,
    /// Members of the old object only.
    pub removed: FieldSet,
}

impl Comparison {
    /// Added and modified: the fields a write sets.
    pub fn changed(&self) -> FieldSet {
        self.added.union(&self.modified)
    }
}

/// Compares two objects of one shape (elements that cannot be named count by value).
pub fn compare(old: &Value, new: &Value, shape: &Shape<'_>) -> Comparison {
    let old_members = members_of(old, shape);
    let new_members = members_of(new, shape);
    let mut comparison = Comparison::default();
    for (path, member) in &new_members {
        match old_members.get(path) {
            None => comparison.added.insert(path.clone()),
            Some(before) if !member.keyed_item && before.value != member.value => {
                comparison.modified.insert(path.clone());
            }
            Some(_) => {}
        }
    }
    for path in old_members.keys() {
        if !new_members.contains_key(path) {
            comparison.removed.insert(path.clone());
        }
    }
    comparison
}

/// The members of a stored object. A live object may hold what an applied configuration may not (duplicates,
/// elements without their keys); then its lists count whole.
fn members_of<'v>(value: &'v Value, shape: &Shape<'_>) -> BTreeMap<Path, Member<'v>> {
    let mut members = BTreeMap::new();
    if walk(value, shape, &mut Vec::new(), &mut members).is_err() {
        members.clear();
        lenient(value, shape, &mut members);
    }
    members
}

/// Members with every list atomic, for objects whose lists cannot be named element by element.
fn lenient<'v>(value: &'v Value, shape: &Shape<'_>, members: &mut BTreeMap<Path, Member<'v>>) {
    fn go<'v>(
        value: &'v Value,
        shape: &Shape<'_>,
        path: &mut Path,
        members: &mut BTreeMap<Path, Member<'v>>,
    ) {
        match value {
            Value::Object(map) if !shape.atomic_map() && !map.is_empty() => {
                for (key, child) in map {
                    path.push(Element::Field(key.clone()));
                    go(child, &shape.field(key), path, members);
                    path.pop();
                }
            }
            _ => {
                members.insert(
                    path.clone(),
                    Member {
                        value,
                        keyed_item: false,
                    },
                );
            }
        }
    }
    go(value, shape, &mut Vec::new(), members);
}

/// Removes the field at `path` (a map key or a list element) when it is there.
pub fn remove(object: &mut Value, path: &[Element]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = object;
    for element in parents {
        let next = match (element, node) {
            (Element::Field(name), Value::Object(map)) => map.get_mut(name),
            (Element::Index(index), Value::Array(items)) => items.get_mut(*index),
            (element, Value::Array(items)) => items.iter_mut().find(|item| names(item, element)),
            _ => None,
        };
        match next {
            Some(next) => node = next,
            None => return,
        }
    }
    match (last, node) {
        (Element::Field(name), Value::Object(map)) => {
            map.remove(name);
        }
        (Element::Index(index), Value::Array(items)) if *index < items.len() => {
            items.remove(*index);
        }
        (element, Value::Array(items)) => items.retain(|item| !names(item, element)),
        _ => {}
    }
}

/// Whether a list element is the one a `Key` or `Value` path element names.
fn names(item: &Value, element: &Element) -> bool {
    let parsed = |json: &str| serde_json::from_str::<Value>(json).unwrap_or(Value::Null);
    match element {
        Element::Key(keys) => keys
            .iter()
            .all(|(key, value)| item.get(key) == Some(&parsed(value))),
        Element::Value(value) => *item == parsed(value),
        _ => false,
    }
}

/// Removes `null` values from an applied configuration: a null sets nothing.
pub fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// An empty JSON object.
pub fn empty() -> Value {
    Value::Object(Map::new())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({ "properties": { "spec": { "properties": {
            "pools": { "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                       "items": { "properties": { "name": {}, "size": {} } } },
            "zones": { "type": "array", "x-kubernetes-list-type": "set" },
            "args": { "type": "array" },
        } } } })
    }

    fn paths(set: &FieldSet) -> Vec<String> {
        set.iter().map(|p| display(p)).collect()
    }

    #[test]
    fn the_field_set_names_scalars_atomic_lists_and_keyed_elements() {
        let schema = schema();
        let shape = Shape::root(&schema, None);
        let object = json!({ "spec": { "pools": [{ "name": "a", "size": 1 }], "zones": ["z1"], "args": ["x", "y"] },
                             "metadata": { "labels": {} } });
        let set = fields_of(&object, &shape).expect("valid");
        assert_eq!(
            paths(&set),
            vec![
                ".spec.args",
                ".spec.pools[name=\"a\"]",
                ".spec.pools[name=\"a\"].name",
                ".spec.pools[name=\"a\"].size",
                ".spec.zones[=\"z1\"]",
            ]
        );
    }

    #[test]
    fn duplicates_and_missing_keys_are_refused() {
        let schema = schema();
        let shape = Shape::root(&schema, None);
        let twice = json!({ "spec": { "pools": [{ "name": "a" }, { "name": "a" }] } });
        assert!(
            fields_of(&twice, &shape)
                .unwrap_err()
                .contains("duplicate entries")
        );
        let keyless = json!({ "spec": { "pools": [{ "size": 1 }] } });
        assert!(fields_of(&keyless, &shape).unwrap_err().contains("\"name\""));
    }

    #[test]
    fn merging_unites_sets_merges_keyed_elements_and_replaces_atomic_lists() {
        let schema = schema();
        let shape = Shape::root(&schema, None);
        let live = json!({ "spec": { "pools": [{ "name": "a", "size": 1 }, { "name": "b", "size": 2 }],
                                     "zones": ["z1"], "args": ["x"], "keep": true } });
        let config = json!({ "spec": { "pools": [{ "name": "b", "size": 5 }, { "name": "c", "size": 3 }],
                                       "zones": ["z2"], "args": ["y"] } });
        let merged = merge(&live, &config, &shape);
        assert_eq!(
            merged,
            json!({ "spec": {
                "pools": [{ "name": "a", "size": 1 }, { "name": "b", "size": 5 }, { "name": "c", "size": 3 }],
                "zones": ["z1", "z2"], "args": ["y"], "keep": true } })
        );
    }

    #[test]
    fn comparison_tells_added_modified_and_removed_fields() {
        let schema = schema();
        let shape = Shape::root(&schema, None);
        let old = json!({ "spec": { "pools": [{ "name": "a", "size": 1 }], "args": ["x"], "gone": 1 } });
        let new = json!({ "spec": { "pools": [{ "name": "a", "size": 2 }], "args": ["x"], "new": 1 } });
        let comparison = compare(&old, &new, &shape);
        assert_eq!(paths(&comparison.added), vec![".spec.new"]);
        assert_eq!(paths(&comparison.modified), vec![".spec.pools[name=\"a\"].size"]);
        assert_eq!(paths(&comparison.removed), vec![".spec.gone"]);
    }

    #[test]
    fn removal_finds_map_keys_and_list_elements() {
        let schema = schema();
        let shape = Shape::root(&schema, None);
        let mut object = json!({ "spec": { "pools": [{ "name": "a", "size": 1 }, { "name": "b" }], "zones": ["z1", "z2"] } });
        let set = fields_of(&object, &shape).expect("valid");
        for path in set.iter().filter(|p| {
            let text = display(p);
            text == ".spec.pools[name=\"a\"].size"
                || text == ".spec.pools[name=\"b\"]"
                || text == ".spec.zones[=\"z1\"]"
        }) {
            remove(&mut object, path);
        }
        assert_eq!(
            object,
            json!({ "spec": { "pools": [{ "name": "a" }], "zones": ["z2"] } })
        );
    }
}
