//! PATCH bodies applied to a stored object: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and the subset
//! of Kubernetes strategic merge patch that kubectl and controllers send.
//!
//! Strategic merge patch merges maps like a merge patch (a null value deletes the key), but merges some lists
//! element by element instead of replacing them. The lists it knows (by JSON path from the object root) are:
//!
//! | kind | list | strategy |
//! | --- | --- | --- |
//! | any | `metadata.ownerReferences` | merge by `uid` |
//! | any | `metadata.finalizers` | primitive set: union, original order kept, new values appended |
//! | Node | `status.conditions` | merge by `type` |
//! | Node | `status.addresses` | merge by `type` |
//! | Node | `spec.podCIDRs` | primitive set |
//! | Node | `spec.taints`, `status.images` | atomic (replaced) |
//! | Pod | `spec.containers`, `spec.initContainers`, `spec.ephemeralContainers` | merge by `name` |
//! | Pod | `<those containers>.env` | merge by `name` |
//! | Pod | `<those containers>.ports` | merge by `containerPort` |
//! | Pod | `<those containers>.volumeMounts` | merge by `mountPath` |
//! | Pod | `<those containers>.volumeDevices` | merge by `devicePath` |
//! | Pod | `spec.volumes`, `spec.imagePullSecrets` | merge by `name` |
//! | Pod | `spec.hostAliases` | merge by `ip` |
//! | Pod | `spec.tolerations` | atomic |
//! | Pod | `status.conditions` | merge by `type` |
//! | Pod | `status.podIPs`, `status.hostIPs` | merge by `ip` |
//! | Pod | `status.containerStatuses` (and the other status lists) | atomic |
//!
//! Every other list is atomic, as in a merge patch. The directives are honoured and never stored:
//! `$patch: replace` on a map (the map becomes the patch), `$patch: delete` on a map (the map becomes empty, as
//! in Kubernetes), `{"$patch": "delete", "<key>": v}` in a merge-keyed list (the element is removed),
//! `{"$patch": "replace"}` in a merge-keyed list (the list becomes the other patch elements), `$retainKeys`
//! (keys not listed are dropped from the original map), `$deleteFromPrimitiveList/<field>` (values removed from
//! a primitive list) and `$setElementOrder/<field>` (the merged list follows that order, elements it does not
//! name keeping their place relative to the others as Kubernetes does). Without `$setElementOrder`, merged
//! elements keep their original position and new ones are appended.

use serde_json::{Map, Value};

/// The three patch formats served, told apart by the request Content-Type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`: RFC 7386 JSON merge patch.
    Merge,
    /// `application/json-patch+json`: RFC 6902 JSON patch, a list of operations.
    Json,
    /// `application/strategic-merge-patch+json`: Kubernetes strategic merge patch.
    Strategic,
}

impl PatchType {
    /// From a request Content-Type (parameters such as "; charset=utf-8" ignored): application/merge-patch+json,
    /// application/json-patch+json, application/strategic-merge-patch+json. None for anything else
    /// (application/apply-patch+yaml included: server-side apply is served by [`crate::apply`]).
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let media_type = content_type.split(';').next().unwrap_or_default().trim();
        if media_type.eq_ignore_ascii_case("application/merge-patch+json") {
            Some(PatchType::Merge)
        } else if media_type.eq_ignore_ascii_case("application/json-patch+json") {
            Some(PatchType::Json)
        } else if media_type.eq_ignore_ascii_case("application/strategic-merge-patch+json") {
            Some(PatchType::Strategic)
        } else {
            None
        }
    }
}

/// Why a patch could not be applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatchError {
    /// The body is not valid JSON, or not JSON of the shape this patch type needs (a map, a list of operations,
    /// a merge-keyed list element without its key, an unknown directive).
    #[error("invalid patch body: {0}")]
    InvalidBody(String),
    /// A JSON patch operation failed on this object (a `test` mismatch, a missing path).
    #[error("{0}")]
    Failed(String),
}

/// Applies a patch body to `target` and returns the new object. `kind` is the object's kind ("Node", "Pod",
/// "Secret", ...) and only matters for strategic merge patch (merge keys in the module documentation).
pub fn apply(patch_type: PatchType, kind: &str, target: &Value, body: &[u8]) -> Result<Value, PatchError> {
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| PatchError::InvalidBody(format!("the body is not valid JSON: {e}")))?;
    match patch_type {
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(PatchError::InvalidBody(format!(
                    "a merge patch must be a JSON object, not {}",
                    json_type(&patch)
                )));
            }
            let mut result = target.clone();
            json_patch::merge(&mut result, &patch);
            Ok(result)
        }
        PatchType::Json => apply_json_patch(target, patch),
        PatchType::Strategic => {
            let Value::Object(patch) = &patch else {
                return Err(PatchError::InvalidBody(format!(
                    "a strategic merge patch must be a JSON object, not {}",
                    json_type(&patch)
                )));
            };
            Strategic { kind }.merge_map(&[], target.clone(), patch)
        }
    }
}

/// Names a JSON value's type for error messages, without quoting the value (it may be a secret).
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Applies an RFC 6902 patch, all or nothing.
fn apply_json_patch(target: &Value, patch: Value) -> Result<Value, PatchError> {
    if !patch.is_array() {
        return Err(PatchError::InvalidBody(format!(
            "a JSON patch must be a JSON array of operations, not {}",
            json_type(&patch)
        )));
    }
    let patch: json_patch::Patch = serde_json::from_value(patch)
        .map_err(|e| PatchError::InvalidBody(format!("invalid JSON patch operation: {e}")))?;
    // patch_unsafe on a copy: the target is untouched on failure anyway, and it skips the undo path, which
    // json-patch ends with `unreachable!`.
    let mut result = target.clone();
    json_patch::patch_unsafe(&mut result, &patch).map_err(|e| {
        let (op, from) = match patch.0.get(e.operation) {
            Some(json_patch::PatchOperation::Add(_)) => ("add", None),
            Some(json_patch::PatchOperation::Remove(_)) => ("remove", None),
            Some(json_patch::PatchOperation::Replace(_)) => ("replace", None),
            Some(json_patch::PatchOperation::Move(m)) => ("move", Some(m.from.to_string())),
            Some(json_patch::PatchOperation::Copy(c)) => ("copy", Some(c.from.to_string())),
            Some(json_patch::PatchOperation::Test(_)) => ("test", None),
            None => ("unknown", None),
        };
        let from = from.map(|f| format!(" from {f}")).unwrap_or_default();
        PatchError::Failed(format!(
            "{op} operation failed at path {}{from}: {}",
            e.path, e.kind
        ))
    })?;
    Ok(result)
}

/// The directive key of strategic merge patch.
const PATCH_DIRECTIVE: &str = "$patch";
/// Lists the keys of the original map to keep.
const RETAIN_KEYS: &str = "$retainKeys";
/// Prefix of the key listing values to remove from a primitive list.
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
/// Prefix of the key giving the order of a merged list.
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

/// How strategic merge patch treats one list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListStrategy {
    /// Replaced as a whole by the patch, as in a merge patch.
    Atomic,
    /// A list of maps merged element-wise by this key.
    MergeKey(&'static str),
    /// A list of scalars merged as a set.
    PrimitiveSet,
}

/// The merge strategy of the list at `location` (field names from the root, list elements adding nothing).
pub(crate) fn list_strategy(kind: &str, location: &[&str]) -> ListStrategy {
    match location {
        ["metadata", "ownerReferences"] => return ListStrategy::MergeKey("uid"),
        ["metadata", "finalizers"] => return ListStrategy::PrimitiveSet,
        _ => {}
    }
    match kind {
        "Node" => match location {
            ["status", "conditions" | "addresses"] => ListStrategy::MergeKey("type"),
            ["spec", "podCIDRs"] => ListStrategy::PrimitiveSet,
            _ => ListStrategy::Atomic,
        },
        "Pod" => match location {
            [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers" | "volumes" | "imagePullSecrets",
            ]
            | [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers",
                "env",
            ] => ListStrategy::MergeKey("name"),
            [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers",
                "ports",
            ] => ListStrategy::MergeKey("containerPort"),
            [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers",
                "volumeMounts",
            ] => ListStrategy::MergeKey("mountPath"),
            [
                "spec",
                "containers" | "initContainers" | "ephemeralContainers",
                "volumeDevices",
            ] => ListStrategy::MergeKey("devicePath"),
            ["spec", "hostAliases"] | ["status", "podIPs" | "hostIPs"] => ListStrategy::MergeKey("ip"),
            ["status", "conditions"] => ListStrategy::MergeKey("type"),
            _ => ListStrategy::Atomic,
        },
        _ => ListStrategy::Atomic,
    }
}

/// Strategic merge patch for objects of one kind.
struct Strategic<'k> {
    kind: &'k str,
}

impl Strategic<'_> {
    /// Merges the patch map into `original` (anything that is not a map counts as an empty map).
    fn merge_map(
        &self,
        location: &[&str],
        original: Value,
        patch: &Map<String, Value>,
    ) -> Result<Value, PatchError> {
        match patch.get(PATCH_DIRECTIVE) {
            None => {}
            Some(Value::String(directive)) if directive == "merge" => {}
            Some(Value::String(directive)) if directive == "replace" => {
                return self.merge_map(location, Value::Null, &without_directive(patch));
            }
            Some(Value::String(directive)) if directive == "delete" => return Ok(Value::Object(Map::new())),
            Some(other) => {
                return Err(PatchError::InvalidBody(format!(
                    "unknown patch directive {other} in the map at {}",
                    display_path(location)
                )));
            }
        }
        let mut original = match original {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        if let Some(retain) = patch.get(RETAIN_KEYS) {
            let keys = string_list(retain).ok_or_else(|| {
                PatchError::InvalidBody(format!(
                    "{RETAIN_KEYS} at {} must be a list of strings",
                    display_path(location)
                ))
            })?;
            original.retain(|key, _| keys.contains(&key.as_str()));
        }
        for (key, values) in patch {
            let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) else {
                continue;
            };
            let Value::Array(values) = values else {
                return Err(PatchError::InvalidBody(format!(
                    "{key} at {} must be a list",
                    display_path(location)
                )));
            };
            if let Some(Value::Array(list)) = original.get_mut(field) {
                list.retain(|item| !values.contains(item));
            }
        }
        for (key, value) in patch {
            if is_directive(key) {
                continue;
            }
            if value.is_null() {
                original.remove(key);
                continue;
            }
            let child_path: Vec<&str> = location.iter().copied().chain([key.as_str()]).collect();
            let old = original.get_mut(key).map_or(Value::Null, Value::take);
            let merged = match value {
                Value::Object(child) => self.merge_map(&child_path, old, child)?,
                Value::Array(items) => {
                    let order = patch.get(&format!("{SET_ELEMENT_ORDER}{key}"));
                    self.merge_list(&child_path, old, items, order)?
                }
                scalar => scalar.clone(),
            };
            original.insert(key.clone(), merged);
        }
        // $setElementOrder for a list the patch does not otherwise touch reorders the original list.
        for (key, order) in patch {
            let Some(field) = key.strip_prefix(SET_ELEMENT_ORDER) else {
                continue;
            };
            if patch.get(field).is_some_and(Value::is_array) {
                continue;
            }
            let child_path: Vec<&str> = location.iter().copied().chain([field]).collect();
            if let Some(slot @ Value::Array(_)) = original.get_mut(field) {
                let Value::Array(items) = slot.take() else {
                    continue;
                };
                let reordered = self.order_list(&child_path, items.clone(), &items, order)?;
                *slot = Value::Array(reordered);
            }
        }
        Ok(Value::Object(original))
    }

    /// Merges a patch list into the original value at `location` according to the list's strategy.
    fn merge_list(
        &self,
        location: &[&str],
        original: Value,
        patch: &[Value],
        order: Option<&Value>,
    ) -> Result<Value, PatchError> {
        let original = match original {
            Value::Array(items) => items,
            _ => Vec::new(),
        };
        let merged = match list_strategy(self.kind, location) {
            ListStrategy::Atomic => return Ok(Value::Array(patch.to_vec())),
            ListStrategy::PrimitiveSet => {
                let mut merged = original.clone();
                for item in patch {
                    if !merged.contains(item) {
                        merged.push(item.clone());
                    }
                }
                merged
            }
            ListStrategy::MergeKey(merge_key) => {
                self.merge_keyed_list(location, merge_key, original.clone(), patch)?
            }
        };
        match order {
            Some(order) => Ok(Value::Array(self.order_list(location, merged, &original, order)?)),
            None => Ok(Value::Array(merged)),
        }
    }

    /// Merges a list of maps element-wise by `merge_key`, honouring `$patch: delete` and `$patch: replace`.
    fn merge_keyed_list(
        &self,
        location: &[&str],
        merge_key: &str,
        mut merged: Vec<Value>,
        patch: &[Value],
    ) -> Result<Vec<Value>, PatchError> {
        let mut elements = Vec::with_capacity(patch.len());
        for item in patch {
            let Value::Object(element) = item else {
                return Err(PatchError::InvalidBody(format!(
                    "the list at {} is merged by {merge_key:?}: its elements must be objects, not {}",
                    display_path(location),
                    json_type(item)
                )));
            };
            elements.push(element);
        }
        let is_replace = |element: &Map<String, Value>| {
            element.get(PATCH_DIRECTIVE).and_then(Value::as_str) == Some("replace")
        };
        if elements.iter().any(|element| is_replace(element)) {
            merged.clear();
        }
        for element in elements {
            if is_replace(element) {
                continue;
            }
            let Some(key_value) = element.get(merge_key) else {
                return Err(PatchError::InvalidBody(format!(
                    "an element of the list at {} does not contain its merge key {merge_key:?}",
                    display_path(location)
                )));
            };
            let same_key = |item: &Value| item.get(merge_key) == Some(key_value);
            match element.get(PATCH_DIRECTIVE) {
                Some(Value::String(directive)) if directive == "delete" => {
                    merged.retain(|item| !same_key(item));
                }
                None => self.merge_element(location, &mut merged, same_key, element)?,
                Some(Value::String(directive)) if directive == "merge" => {
                    self.merge_element(location, &mut merged, same_key, &without_directive(element))?;
                }
                Some(other) => {
                    return Err(PatchError::InvalidBody(format!(
                        "unknown patch directive {other} in the list at {}",
                        display_path(location)
                    )));
                }
            }
        }
        Ok(merged)
    }

    /// Merges one patch element into the list element with the same merge key, or appends it.
    fn merge_element(
        &self,
        location: &[&str],
        merged: &mut Vec<Value>,
        same_key: impl Fn(&Value) -> bool,
        element: &Map<String, Value>,
    ) -> Result<(), PatchError> {
        match merged.iter_mut().find(|item| same_key(item)) {
            Some(existing) => *existing = self.merge_map(location, existing.take(), element)?,
            None => merged.push(self.merge_map(location, Value::Null, element)?),
        }
        Ok(())
    }

    /// Orders a merged list by a `$setElementOrder` list as Kubernetes does: the elements it names come in its
    /// order, interleaved with the others by their position in the original list.
    fn order_list(
        &self,
        location: &[&str],
        merged: Vec<Value>,
        original: &[Value],
        order: &Value,
    ) -> Result<Vec<Value>, PatchError> {
        let Value::Array(order) = order else {
            return Err(PatchError::InvalidBody(format!(
                "{SET_ELEMENT_ORDER}{} must be a list",
                location.last().copied().unwrap_or_default()
            )));
        };
        let identity = |item: &Value| -> Option<Value> {
            match list_strategy(self.kind, location) {
                ListStrategy::MergeKey(key) => item.get(key).cloned(),
                _ => Some(item.clone()),
            }
        };
        let order_keys: Vec<Value> = order.iter().filter_map(&identity).collect();
        let original_keys: Vec<Option<Value>> = original.iter().map(&identity).collect();
        let position_in =
            |keys: &[Value], item: &Value| identity(item).and_then(|k| keys.iter().position(|o| *o == k));
        let original_position = |item: &Value| {
            let key = identity(item)?;
            original_keys.iter().position(|o| o.as_ref() == Some(&key))
        };
        let (mut named, others): (Vec<Value>, Vec<Value>) = merged
            .into_iter()
            .partition(|item| position_in(&order_keys, item).is_some());
        named.sort_by_key(|item| position_in(&order_keys, item));
        let mut result = Vec::with_capacity(named.len() + others.len());
        let mut named = named.into_iter().peekable();
        let mut others = others.into_iter().peekable();
        loop {
            let take_named = match (named.peek(), others.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some(left), Some(right)) => match (original_position(left), original_position(right)) {
                    (Some(l), Some(r)) => l < r,
                    _ => true,
                },
            };
            let next = if take_named { named.next() } else { others.next() };
            result.extend(next);
        }
        Ok(result)
    }
}

/// True for the keys of a patch map that are directives rather than fields.
fn is_directive(key: &str) -> bool {
    key == PATCH_DIRECTIVE
        || key == RETAIN_KEYS
        || key.starts_with(DELETE_FROM_PRIMITIVE_LIST)
        || key.starts_with(SET_ELEMENT_ORDER)
}

/// A copy of a patch map without its `$patch` directive.
fn without_directive(patch: &Map<String, Value>) -> Map<String, Value> {
    let mut patch = patch.clone();
    patch.remove(PATCH_DIRECTIVE);
    patch
}

/// The strings of a JSON list of strings, None when it is anything else.
fn string_list(value: &Value) -> Option<Vec<&str>> {
    value.as_array()?.iter().map(Value::as_str).collect()
}

/// A field path for error messages ("spec.containers"), "the object root" when empty.
fn display_path(location: &[&str]) -> String {
    if location.is_empty() {
        "the object root".to_owned()
    } else {
        location.join(".")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn patched(patch_type: PatchType, kind: &str, target: &Value, body: &Value) -> Value {
        apply(patch_type, kind, target, body.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("patch {body} should apply: {e}"))
    }

    fn strategic(kind: &str, target: &Value, body: &Value) -> Value {
        patched(PatchType::Strategic, kind, target, body)
    }

    fn node() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1", "pool": "a"}},
            "spec": {"podCIDRs": ["10.0.0.0/24"], "taints": [
                {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
            ]},
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                    {"type": "Ready", "status": "False", "reason": "KubeletNotReady"},
                    {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure"}
                ],
                "addresses": [
                    {"type": "InternalIP", "address": "10.0.0.5"},
                    {"type": "Hostname", "address": "n1"}
                ]
            }
        })
    }

    #[test]
    fn content_types() {
        let cases = [
            ("application/merge-patch+json", Some(PatchType::Merge)),
            ("application/json-patch+json", Some(PatchType::Json)),
            (
                "application/strategic-merge-patch+json",
                Some(PatchType::Strategic),
            ),
            (
                "application/strategic-merge-patch+json; charset=utf-8",
                Some(PatchType::Strategic),
            ),
            (
                " Application/Merge-Patch+JSON ;charset=UTF-8",
                Some(PatchType::Merge),
            ),
            ("application/apply-patch+yaml", None),
            ("application/json", None),
            ("", None),
        ];
        for (content_type, expected) in cases {
            assert_eq!(
                PatchType::from_content_type(content_type),
                expected,
                "{content_type:?}"
            );
        }
    }

    #[test]
    fn kubectl_cordon_and_uncordon() {
        let cordoned = strategic("Node", &node(), &json!({"spec": {"unschedulable": true}}));
        assert_eq!(cordoned["spec"]["unschedulable"], json!(true));
        assert_eq!(cordoned["spec"]["taints"], node()["spec"]["taints"]);
        let uncordoned = strategic("Node", &cordoned, &json!({"spec": {"unschedulable": null}}));
        assert_eq!(uncordoned, node());
    }

    #[test]
    fn node_taints_are_replaced_as_a_whole() {
        let body = json!({"spec": {"taints": [{"key": "mcm.dev/draining", "effect": "NoSchedule"}]}});
        let result = strategic("Node", &node(), &body);
        assert_eq!(
            result["spec"]["taints"],
            json!([{"key": "mcm.dev/draining", "effect": "NoSchedule"}])
        );
        let cleared = strategic("Node", &result, &json!({"spec": {"taints": null}}));
        assert_eq!(cleared["spec"].get("taints"), None);
    }

    #[test]
    fn node_status_condition_update_by_type_keeps_the_others() {
        let body = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            {"type": "PIDPressure", "status": "False"}
        ]}});
        let result = strategic("Node", &node(), &body);
        assert_eq!(
            result["status"]["conditions"],
            json!([
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure"},
                {"type": "PIDPressure", "status": "False"}
            ])
        );
        assert_eq!(result["status"]["addresses"], node()["status"]["addresses"]);
    }

    #[test]
    fn kubelet_style_status_patch_with_set_element_order() {
        let body = json!({"status": {
            "$setElementOrder/conditions": [
                {"type": "Ready"}, {"type": "MemoryPressure"}, {"type": "DiskPressure"}
            ],
            "conditions": [{"type": "Ready", "status": "True"}],
            "$setElementOrder/addresses": [{"type": "Hostname"}, {"type": "InternalIP"}]
        }});
        let result = strategic("Node", &node(), &body);
        let types: Vec<&str> = result["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["Ready", "MemoryPressure", "DiskPressure"]);
        assert_eq!(
            result["status"]["conditions"][0],
            json!({"type": "Ready", "status": "True", "reason": "KubeletNotReady"})
        );
        assert_eq!(
            result["status"]["addresses"],
            json!([
                {"type": "Hostname", "address": "n1"},
                {"type": "InternalIP", "address": "10.0.0.5"}
            ])
        );
        assert!(
            !result.to_string().contains('$'),
            "directives must not be stored: {result}"
        );
    }

    #[test]
    fn set_element_order_keeps_unnamed_elements_in_place() {
        let target = json!({"metadata": {"finalizers": ["a", "b", "c"]}});
        // Kubernetes' interleave: the named elements in the given order, each other element placed before the
        // first named one that followed it in the original list.
        let body = json!({"metadata": {"$setElementOrder/finalizers": ["c", "d", "a"], "finalizers": ["d"]}});
        let result = strategic("Pod", &target, &body);
        assert_eq!(result["metadata"]["finalizers"], json!(["b", "c", "d", "a"]));
        let body = json!({"metadata": {"$setElementOrder/finalizers": ["a", "c", "d"], "finalizers": ["d"]}});
        let result = strategic("Pod", &target, &body);
        assert_eq!(result["metadata"]["finalizers"], json!(["a", "b", "c", "d"]));
    }

    #[test]
    fn owner_references_merge_by_uid() {
        let target = json!({"metadata": {"name": "m", "ownerReferences": [
            {"apiVersion": "mcm.dev/v1alpha1", "kind": "MachineSet", "name": "ms", "uid": "u1", "controller": true},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u2"}
        ]}});
        let body = json!({"metadata": {"ownerReferences": [
            {"uid": "u1", "controller": null, "blockOwnerDeletion": true},
            {"apiVersion": "v1", "kind": "Secret", "name": "s", "uid": "u3"}
        ]}});
        let result = strategic("Machine", &target, &body);
        assert_eq!(
            result["metadata"]["ownerReferences"],
            json!([
                {"apiVersion": "mcm.dev/v1alpha1", "kind": "MachineSet", "name": "ms", "uid": "u1", "blockOwnerDeletion": true},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u2"},
                {"apiVersion": "v1", "kind": "Secret", "name": "s", "uid": "u3"}
            ])
        );
    }

    #[test]
    fn patch_delete_removes_a_list_element() {
        let target = json!({"metadata": {"ownerReferences": [
            {"kind": "MachineSet", "name": "ms", "uid": "u1"},
            {"kind": "ConfigMap", "name": "cm", "uid": "u2"}
        ]}});
        let body = json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": "u1"}]}});
        let result = strategic("Machine", &target, &body);
        assert_eq!(
            result["metadata"]["ownerReferences"],
            json!([{"kind": "ConfigMap", "name": "cm", "uid": "u2"}])
        );
        let status = strategic(
            "Node",
            &node(),
            &json!({"status": {"conditions": [{"$patch": "delete", "type": "Ready"}]}}),
        );
        assert_eq!(status["status"]["conditions"].as_array().map(Vec::len), Some(2));
        assert!(!status.to_string().contains("\"Ready\""));
    }

    #[test]
    fn patch_replace_in_a_list_replaces_it() {
        let body =
            json!({"status": {"conditions": [{"$patch": "replace"}, {"type": "Ready", "status": "True"}]}});
        let result = strategic("Node", &node(), &body);
        assert_eq!(
            result["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}])
        );
    }

    #[test]
    fn map_directives() {
        let replaced = strategic(
            "Node",
            &node(),
            &json!({"metadata": {"labels": {"$patch": "replace", "only": "this", "gone": null}}}),
        );
        assert_eq!(replaced["metadata"]["labels"], json!({"only": "this"}));
        let deleted = strategic(
            "Node",
            &node(),
            &json!({"metadata": {"labels": {"$patch": "delete"}}}),
        );
        assert_eq!(deleted["metadata"]["labels"], json!({}));
        assert_eq!(deleted["metadata"]["name"], json!("n1"));
        let merged = strategic(
            "Node",
            &node(),
            &json!({"metadata": {"labels": {"$patch": "merge", "b": "2"}}}),
        );
        assert_eq!(
            merged["metadata"]["labels"],
            json!({"kubernetes.io/hostname": "n1", "pool": "a", "b": "2"})
        );
    }

    #[test]
    fn retain_keys_drops_unlisted_keys() {
        let target =
            json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}});
        let body = json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}});
        let result = strategic("Deployment", &target, &body);
        assert_eq!(result, json!({"spec": {"strategy": {"type": "Recreate"}}}));
    }

    #[test]
    fn finalizers_merge_as_a_set_and_delete_from_primitive_list() {
        let target = json!({"metadata": {"finalizers": ["mcm.dev/machine", "foregroundDeletion"]}});
        let added = strategic(
            "Machine",
            &target,
            &json!({"metadata": {"finalizers": ["mcm.dev/drain", "mcm.dev/machine"]}}),
        );
        assert_eq!(
            added["metadata"]["finalizers"],
            json!(["mcm.dev/machine", "foregroundDeletion", "mcm.dev/drain"])
        );
        let removed = strategic(
            "Machine",
            &added,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["mcm.dev/machine"]}}),
        );
        assert_eq!(
            removed["metadata"]["finalizers"],
            json!(["foregroundDeletion", "mcm.dev/drain"])
        );
        // A merge patch replaces the list instead.
        let replaced = patched(
            PatchType::Merge,
            "Machine",
            &target,
            &json!({"metadata": {"finalizers": ["x"]}}),
        );
        assert_eq!(replaced["metadata"]["finalizers"], json!(["x"]));
    }

    #[test]
    fn node_pod_cidrs_merge_as_a_set() {
        let result = strategic(
            "Node",
            &node(),
            &json!({"spec": {"podCIDRs": ["fd00::/64", "10.0.0.0/24"]}}),
        );
        assert_eq!(result["spec"]["podCIDRs"], json!(["10.0.0.0/24", "fd00::/64"]));
    }

    #[test]
    fn pod_containers_merge_by_name_down_to_env_and_ports() {
        let pod = json!({"kind": "Pod", "spec": {
            "containers": [
                {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                 "ports": [{"containerPort": 80, "name": "http"}],
                 "volumeMounts": [{"mountPath": "/data", "name": "data"}]},
                {"name": "sidecar", "image": "side:1"}
            ],
            "tolerations": [{"key": "a", "operator": "Exists"}],
            "volumes": [{"name": "data", "emptyDir": {}}]
        }, "status": {"containerStatuses": [{"name": "app", "ready": false}, {"name": "sidecar", "ready": true}]}});
        let body = json!({
            "spec": {
                "containers": [{"name": "app", "image": "app:2", "env": [{"name": "B", "value": "3"}],
                                "ports": [{"containerPort": 443, "name": "https"}],
                                "volumeMounts": [{"mountPath": "/data", "readOnly": true}]}],
                "tolerations": [{"key": "b", "operator": "Exists"}],
                "volumes": [{"name": "cache", "emptyDir": {}}]
            },
            "status": {"containerStatuses": [{"name": "app", "ready": true}]}
        });
        let result = strategic("Pod", &pod, &body);
        assert_eq!(
            result["spec"]["containers"],
            json!([
                {"name": "app", "image": "app:2", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}],
                 "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443, "name": "https"}],
                 "volumeMounts": [{"mountPath": "/data", "name": "data", "readOnly": true}]},
                {"name": "sidecar", "image": "side:1"}
            ])
        );
        assert_eq!(
            result["spec"]["tolerations"],
            json!([{"key": "b", "operator": "Exists"}])
        );
        assert_eq!(
            result["spec"]["volumes"],
            json!([{"name": "data", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}])
        );
        assert_eq!(
            result["status"]["containerStatuses"],
            json!([{"name": "app", "ready": true}])
        );
    }

    #[test]
    fn pod_status_conditions_merge_by_type() {
        let pod = json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}
        ]}});
        let body = json!({"status": {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]}});
        let result = strategic("Pod", &pod, &body);
        assert_eq!(result["status"]["conditions"].as_array().map(Vec::len), Some(3));
        assert_eq!(result["status"]["phase"], json!("Running"));
    }

    #[test]
    fn merge_keys_depend_on_the_kind() {
        // status.conditions of a kind not in the table is atomic.
        let target = json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}});
        let result = strategic(
            "Machine",
            &target,
            &json!({"status": {"conditions": [{"type": "C"}]}}),
        );
        assert_eq!(result["status"]["conditions"], json!([{"type": "C"}]));
    }

    #[test]
    fn secret_annotations_and_string_data() {
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "s", "namespace": "default", "annotations": {"old": "1"}},
            "data": {"userData": "b2xk"}});
        let body = json!({"metadata": {"annotations": {"mcm.dev/checksum": "abc"}}, "stringData": {"userData": "#cloud-config\n"}});
        let result = strategic("Secret", &secret, &body);
        assert_eq!(
            result["metadata"]["annotations"],
            json!({"old": "1", "mcm.dev/checksum": "abc"})
        );
        assert_eq!(result["stringData"], json!({"userData": "#cloud-config\n"}));
        assert_eq!(result["data"], json!({"userData": "b2xk"}));
    }

    #[test]
    fn merge_patch_removes_a_label_with_null() {
        let result = patched(
            PatchType::Merge,
            "Node",
            &node(),
            &json!({"metadata": {"labels": {"pool": null}}}),
        );
        assert_eq!(
            result["metadata"]["labels"],
            json!({"kubernetes.io/hostname": "n1"})
        );
        // A merge patch replaces lists, even merge-keyed ones.
        let replaced = patched(
            PatchType::Merge,
            "Node",
            &node(),
            &json!({"status": {"conditions": []}}),
        );
        assert_eq!(replaced["status"]["conditions"], json!([]));
    }

    #[test]
    fn json_patch_operations() {
        let body = json!([
            {"op": "test", "path": "/metadata/name", "value": "n1"},
            {"op": "add", "path": "/metadata/labels/new", "value": "x"},
            {"op": "remove", "path": "/metadata/labels/pool"},
            {"op": "replace", "path": "/spec/podCIDRs/0", "value": "10.1.0.0/24"},
            {"op": "copy", "from": "/metadata/name", "path": "/metadata/annotations"},
            {"op": "move", "from": "/metadata/annotations", "path": "/metadata/generateName"}
        ]);
        let result = patched(PatchType::Json, "Node", &node(), &body);
        assert_eq!(
            result["metadata"]["labels"],
            json!({"kubernetes.io/hostname": "n1", "new": "x"})
        );
        assert_eq!(result["spec"]["podCIDRs"], json!(["10.1.0.0/24"]));
        assert_eq!(result["metadata"]["generateName"], json!("n1"));
        assert_eq!(result["metadata"].get("annotations"), None);
    }

    #[test]
    fn json_patch_failures_name_the_op_and_path() {
        let cases = [
            (
                json!([{"op": "test", "path": "/spec/unschedulable", "value": true}]),
                "test operation failed at path /spec/unschedulable",
            ),
            (
                json!([{"op": "test", "path": "/metadata/name", "value": "n2"}]),
                "test operation failed at path /metadata/name: value did not match",
            ),
            (
                json!([{"op": "remove", "path": "/spec/missing"}]),
                "remove operation failed at path /spec/missing: path is invalid",
            ),
            (
                json!([{"op": "replace", "path": "/status/conditions/9", "value": {}}]),
                "replace operation failed at path /status/conditions/9",
            ),
            (
                json!([{"op": "move", "from": "/nope", "path": "/x"}]),
                "move operation failed at path /x from /nope: \"from\" path is invalid",
            ),
        ];
        for (body, expected) in cases {
            let error = apply(PatchType::Json, "Node", &node(), body.to_string().as_bytes()).unwrap_err();
            assert!(matches!(error, PatchError::Failed(_)), "{body}: {error:?}");
            assert!(error.to_string().starts_with(expected), "{body}: {error}");
        }
        // A failure after successful operations leaves nothing half applied (the target is not modified).
        let target = node();
        let body = json!([{"op": "add", "path": "/metadata/labels/x", "value": "y"}, {"op": "test", "path": "/metadata/name", "value": "no"}]);
        assert!(apply(PatchType::Json, "Node", &target, body.to_string().as_bytes()).is_err());
        assert_eq!(target, node());
    }

    #[test]
    fn bodies_that_are_not_json_or_of_the_wrong_shape() {
        let cases: [(PatchType, &[u8], &str); 11] = [
            (PatchType::Merge, b"", "not valid JSON"),
            (PatchType::Merge, b"{\"spec\":", "not valid JSON"),
            (PatchType::Strategic, b"spec: {}", "not valid JSON"),
            (PatchType::Json, b"\xff\xfe", "not valid JSON"),
            (
                PatchType::Merge,
                b"[]",
                "a merge patch must be a JSON object, not an array",
            ),
            (
                PatchType::Merge,
                b"\"hello\"",
                "a merge patch must be a JSON object, not a string",
            ),
            (
                PatchType::Strategic,
                b"null",
                "a strategic merge patch must be a JSON object, not null",
            ),
            (
                PatchType::Json,
                b"{\"op\":\"add\"}",
                "a JSON patch must be a JSON array of operations, not an object",
            ),
            (
                PatchType::Json,
                b"[{\"op\":\"frobnicate\",\"path\":\"/a\"}]",
                "invalid JSON patch operation",
            ),
            (
                PatchType::Json,
                b"[{\"op\":\"add\",\"path\":\"a\",\"value\":1}]",
                "invalid JSON patch operation",
            ),
            (
                PatchType::Json,
                b"[{\"op\":\"add\",\"value\":1}]",
                "invalid JSON patch operation",
            ),
        ];
        for (patch_type, body, expected) in cases {
            match apply(patch_type, "Node", &node(), body) {
                Err(PatchError::InvalidBody(message)) => {
                    assert!(message.contains(expected), "{patch_type:?} {body:?}: {message}");
                }
                other => panic!("{patch_type:?} {body:?}: expected InvalidBody, got {other:?}"),
            }
        }
    }

    #[test]
    fn strategic_bodies_of_the_wrong_shape() {
        let cases = [
            (
                json!({"status": {"conditions": ["Ready"]}}),
                "elements must be objects, not a string",
            ),
            (
                json!({"status": {"conditions": [{"status": "True"}]}}),
                "does not contain its merge key \"type\"",
            ),
            (
                json!({"metadata": {"labels": {"$patch": "explode"}}}),
                "unknown patch directive \"explode\"",
            ),
            (
                json!({"status": {"conditions": [{"$patch": 1, "type": "Ready"}]}}),
                "unknown patch directive 1",
            ),
            (
                json!({"metadata": {"$retainKeys": "name"}}),
                "$retainKeys at metadata must be a list of strings",
            ),
            (
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "x"}}),
                "must be a list",
            ),
            (
                json!({"status": {"$setElementOrder/conditions": {}, "conditions": []}}),
                "must be a list",
            ),
        ];
        for (body, expected) in cases {
            match apply(PatchType::Strategic, "Node", &node(), body.to_string().as_bytes()) {
                Err(PatchError::InvalidBody(message)) => {
                    assert!(message.contains(expected), "{body}: {message}");
                }
                other => panic!("{body}: expected InvalidBody, got {other:?}"),
            }
        }
    }

    #[test]
    fn strategic_patch_on_missing_fields_strips_nulls_and_directives() {
        let target = json!({"metadata": {"name": "p"}});
        let body = json!({"metadata": {"labels": {"a": "1", "b": null}, "ownerReferences": [
            {"uid": "u1", "name": "x"}, {"$patch": "delete", "uid": "u9"}
        ]}});
        let result = strategic("Pod", &target, &body);
        assert_eq!(
            result,
            json!({"metadata": {"name": "p", "labels": {"a": "1"}, "ownerReferences": [{"uid": "u1", "name": "x"}]}})
        );
    }

    #[test]
    fn error_messages_do_not_quote_secret_values() {
        let secret = json!({"kind": "Secret", "data": {"password": "c2VjcmV0"}});
        let error = apply(PatchType::Merge, "Secret", &secret, b"\"hunter2-password\"").unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }
}
