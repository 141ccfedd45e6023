//! The `providerSpec` of the simulated (and local) provider: the example schema of spec 000.
//!
//! | field | mandatory | type | meaning |
//! |---|---|---|---|
//! | `vmPool` | yes | string, not empty | VM pool name |
//! | `size` | yes | string, one of [`crate::sizes`] | CPUs and memory |
//! | `rootFsSize` | no | integer, 1 to [`MAX_ROOT_FS_SIZE_GB`] | root filesystem size in GB |
//! | `tags` | yes | map of strings, not empty | tags put on the VM; they tell the VMs of the cluster |
//!
//! Spec 000: "The `ProviderSpec` is validated by methods that receive it as a request field for presence of all
//! mandatory parameters and tags, and for validity of all parameters." Every problem is reported with the path of
//! the field (`providerSpec.size: unknown size "huge" (known: xsmall, small, medium, large)`); any other field is
//! refused. A `rootFsSize` outside its range is [`ProblemKind::OutOfRange`] (CreateMachine answers `OutOfRange`
//! for it, per its table: "The requested number of CPUs, memory size, of FS size in ProviderSpec falls outside of
//! the corresponding valid range"); every other problem is [`ProblemKind::Invalid`] (`InvalidArgument`).
//! Messages name fields and show only non-secret values of the spec itself.

use std::{collections::BTreeMap, fmt};

use mcm_driver::{DriverError, MachineCode};
use serde_json::Value;

use crate::sizes::{self, Size};

/// The fields of the schema, in the order they are checked and listed.
pub const FIELDS: [&str; 4] = ["vmPool", "size", "rootFsSize", "tags"];

/// The largest `rootFsSize` accepted, in GB.
pub const MAX_ROOT_FS_SIZE_GB: u64 = 65_536;

/// A valid `providerSpec`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderSpec {
    /// `vmPool`: the VM pool name.
    pub vm_pool: String,
    /// `size`: CPUs and memory of the VM.
    pub size: Size,
    /// `rootFsSize`: root filesystem size in GB, when given.
    pub root_fs_size: Option<u64>,
    /// `tags`: the tags put on the VM.
    pub tags: BTreeMap<String, String>,
}

/// What is wrong with one field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemKind {
    /// Missing, of the wrong type, unknown, or not an allowed value: `InvalidArgument`.
    Invalid,
    /// A number outside its range: `OutOfRange` for CreateMachine, `InvalidArgument` for the other calls.
    OutOfRange,
}

/// One problem of a `providerSpec`: the path of the field and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The field's path, such as `providerSpec.size` or `providerSpec.tags["team"]`.
    pub field: String,
    /// The kind of problem.
    pub kind: ProblemKind,
    /// What is wrong, without the field's path.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem of an invalid `providerSpec`, in field order; `Display` joins them with `; `.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct SpecError {
    /// The problems; never empty.
    pub problems: Vec<Problem>,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl SpecError {
    /// The driver error of this problem list: `range_code` when every problem is a range problem (CreateMachine
    /// passes `OutOfRange`), `InvalidArgument` otherwise.
    pub fn to_driver_error(&self, range_code: MachineCode) -> DriverError {
        let code = if self.problems.iter().all(|p| p.kind == ProblemKind::OutOfRange) {
            range_code
        } else {
            MachineCode::InvalidArgument
        };
        DriverError::new(code, self.to_string())
    }
}

/// The JSON type of a value, for messages ("got a number").
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

struct Problems(Vec<Problem>);

impl Problems {
    fn invalid(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            field: field.into(),
            kind: ProblemKind::Invalid,
            message: message.into(),
        });
    }

    fn out_of_range(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            field: field.into(),
            kind: ProblemKind::OutOfRange,
            message: message.into(),
        });
    }
}

type Object = serde_json::Map<String, Value>;

/// A field's value, null read as absent.
fn present<'a>(object: &'a Object, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|v| !v.is_null())
}

fn vm_pool(object: &Object, problems: &mut Problems) -> Option<String> {
    match present(object, "vmPool") {
        None => {
            problems.invalid("providerSpec.vmPool", "required (the VM pool name, a string)");
            None
        }
        Some(Value::String(pool)) if pool.is_empty() => {
            problems.invalid("providerSpec.vmPool", "must not be empty");
            None
        }
        Some(Value::String(pool)) => Some(pool.clone()),
        Some(other) => {
            problems.invalid(
                "providerSpec.vmPool",
                format!("must be a string, got {}", json_kind(other)),
            );
            None
        }
    }
}

fn size(object: &Object, problems: &mut Problems) -> Option<Size> {
    match present(object, "size") {
        None => {
            problems.invalid(
                "providerSpec.size",
                format!("required (one of {})", sizes::known_names()),
            );
            None
        }
        Some(Value::String(name)) => {
            let size = sizes::lookup(name);
            if size.is_none() {
                problems.invalid(
                    "providerSpec.size",
                    format!("unknown size {name:?} (known: {})", sizes::known_names()),
                );
            }
            size
        }
        Some(other) => {
            problems.invalid(
                "providerSpec.size",
                format!("must be a string, got {}", json_kind(other)),
            );
            None
        }
    }
}

fn root_fs_size(object: &Object, problems: &mut Problems) -> Option<u64> {
    match present(object, "rootFsSize") {
        None => None,
        Some(Value::Number(n)) if n.is_u64() || n.is_i64() => {
            let gb = n.as_u64().filter(|gb| (1..=MAX_ROOT_FS_SIZE_GB).contains(gb));
            if gb.is_none() {
                problems.out_of_range(
                    "providerSpec.rootFsSize",
                    format!("{n} GB is out of range (1 to {MAX_ROOT_FS_SIZE_GB} GB)"),
                );
            }
            gb
        }
        Some(other) => {
            let found = if other.is_number() {
                "a fraction"
            } else {
                json_kind(other)
            };
            problems.invalid(
                "providerSpec.rootFsSize",
                format!("must be an integer (the root filesystem size in GB), got {found}"),
            );
            None
        }
    }
}

fn tags(object: &Object, problems: &mut Problems) -> Option<BTreeMap<String, String>> {
    match present(object, "tags") {
        None => {
            problems.invalid("providerSpec.tags", "required (a map of strings)");
            None
        }
        Some(Value::Object(map)) if map.is_empty() => {
            problems.invalid(
                "providerSpec.tags",
                "must not be empty (the tags tell the VMs of the cluster)",
            );
            None
        }
        Some(Value::Object(map)) => {
            let mut tags = BTreeMap::new();
            let mut ok = true;
            for (key, value) in map {
                if let Value::String(text) = value {
                    tags.insert(key.clone(), text.clone());
                } else {
                    ok = false;
                    problems.invalid(
                        format!("providerSpec.tags[{key:?}]"),
                        format!("must be a string, got {}", json_kind(value)),
                    );
                }
            }
            ok.then_some(tags)
        }
        Some(other) => {
            problems.invalid(
                "providerSpec.tags",
                format!("must be a map of strings, got {}", json_kind(other)),
            );
            None
        }
    }
}

impl ProviderSpec {
    /// Validates a `providerSpec` and returns it typed, or every problem found.
    pub fn parse(value: &Value) -> Result<Self, SpecError> {
        let mut problems = Problems(Vec::new());
        let Some(object) = value.as_object() else {
            problems.invalid(
                "providerSpec",
                format!(
                    "must be an object with vmPool, size and tags, got {}",
                    json_kind(value)
                ),
            );
            return Err(SpecError { problems: problems.0 });
        };
        let vm_pool = vm_pool(object, &mut problems);
        let size = size(object, &mut problems);
        let root_fs_size = root_fs_size(object, &mut problems);
        let tags = tags(object, &mut problems);
        for key in object.keys().filter(|key| !FIELDS.contains(&key.as_str())) {
            problems.invalid(
                format!("providerSpec.{key}"),
                format!("unknown field (known: {})", FIELDS.join(", ")),
            );
        }
        match (vm_pool, size, tags) {
            (Some(vm_pool), Some(size), Some(tags)) if problems.0.is_empty() => Ok(Self {
                vm_pool,
                size,
                root_fs_size,
                tags,
            }),
            _ => Err(SpecError { problems: problems.0 }),
        }
    }

    /// The names of the fields whose values differ between two specs, in schema order.
    pub fn differences(&self, other: &Self) -> Vec<&'static str> {
        let mut fields = Vec::new();
        if self.vm_pool != other.vm_pool {
            fields.push("vmPool");
        }
        if self.size != other.size {
            fields.push("size");
        }
        if self.root_fs_size != other.root_fs_size {
            fields.push("rootFsSize");
        }
        if self.tags != other.tags {
            fields.push("tags");
        }
        fields
    }

    /// Whether a VM with these tags carries every tag of this spec (same key, same value): the VM belongs to the
    /// cluster the spec's tags tell.
    pub fn tags_match(&self, vm_tags: &BTreeMap<String, String>) -> bool {
        self.tags
            .iter()
            .all(|(key, value)| vm_tags.get(key) == Some(value))
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;

    fn problems(value: &Value) -> Vec<String> {
        ProviderSpec::parse(value)
            .expect_err("the spec is invalid")
            .problems
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn the_example_class_of_spec_000_is_valid() {
        let spec = ProviderSpec::parse(&json!({
            "vmPool": "test-worker-pool",
            "size": "small",
            "rootFsSize": 10,
            "tags": { "kubernetes.io/cluster/demo": "1", "kubernetes.io/role/node": "1" },
        }))
        .unwrap();
        assert_eq!(spec.vm_pool, "test-worker-pool");
        assert_eq!(spec.size, sizes::SMALL);
        assert_eq!(spec.root_fs_size, Some(10));
        assert_eq!(spec.tags.len(), 2);
    }

    #[test]
    fn root_fs_size_is_optional() {
        let spec =
            ProviderSpec::parse(&json!({ "vmPool": "p", "size": "large", "tags": { "a": "b" } })).unwrap();
        assert_eq!(spec.root_fs_size, None);
        let spec = ProviderSpec::parse(
            &json!({ "vmPool": "p", "size": "large", "rootFsSize": null, "tags": { "a": "b" } }),
        )
        .unwrap();
        assert_eq!(spec.root_fs_size, None);
    }

    #[test]
    fn a_provider_spec_that_is_not_an_object_is_invalid() {
        assert_eq!(
            problems(&json!("small")),
            ["providerSpec: must be an object with vmPool, size and tags, got a string"]
        );
        assert_eq!(
            problems(&Value::Null),
            ["providerSpec: must be an object with vmPool, size and tags, got null"]
        );
    }

    #[test]
    fn every_mandatory_field_missing_is_named() {
        assert_eq!(
            problems(&json!({})),
            [
                "providerSpec.vmPool: required (the VM pool name, a string)",
                "providerSpec.size: required (one of xsmall, small, medium, large)",
                "providerSpec.tags: required (a map of strings)",
            ]
        );
    }

    #[test]
    fn wrong_types_are_named_with_the_type_found() {
        assert_eq!(
            problems(&json!({ "vmPool": 1, "size": true, "rootFsSize": "10", "tags": ["a"] })),
            [
                "providerSpec.vmPool: must be a string, got a number",
                "providerSpec.size: must be a string, got a boolean",
                "providerSpec.rootFsSize: must be an integer (the root filesystem size in GB), got a string",
                "providerSpec.tags: must be a map of strings, got an array",
            ]
        );
        assert_eq!(
            problems(&json!({ "vmPool": "p", "size": "small", "rootFsSize": 10.5, "tags": { "team": 7 } })),
            [
                "providerSpec.rootFsSize: must be an integer (the root filesystem size in GB), got a fraction",
                "providerSpec.tags[\"team\"]: must be a string, got a number",
            ]
        );
    }

    #[test]
    fn an_unknown_size_lists_the_known_sizes() {
        assert_eq!(
            problems(&json!({ "vmPool": "p", "size": "huge", "tags": { "a": "b" } })),
            ["providerSpec.size: unknown size \"huge\" (known: xsmall, small, medium, large)"]
        );
    }

    #[test]
    fn unknown_fields_are_invalid() {
        assert_eq!(
            problems(&json!({ "vmPool": "p", "size": "small", "tags": { "a": "b" }, "image": "ubuntu" })),
            ["providerSpec.image: unknown field (known: vmPool, size, rootFsSize, tags)"]
        );
    }

    #[test]
    fn empty_values_of_mandatory_fields_are_invalid() {
        assert_eq!(
            problems(&json!({ "vmPool": "", "size": "small", "tags": {} })),
            [
                "providerSpec.vmPool: must not be empty",
                "providerSpec.tags: must not be empty (the tags tell the VMs of the cluster)",
            ]
        );
    }

    #[test]
    fn a_root_fs_size_outside_its_range_is_a_range_problem() {
        for size in [json!(0), json!(-3), json!(MAX_ROOT_FS_SIZE_GB + 1)] {
            let err = ProviderSpec::parse(
                &json!({ "vmPool": "p", "size": "small", "rootFsSize": size, "tags": { "a": "b" } }),
            )
            .unwrap_err();
            assert_eq!(err.problems.len(), 1);
            assert_eq!(err.problems[0].kind, ProblemKind::OutOfRange);
            assert_eq!(
                err.to_driver_error(MachineCode::OutOfRange).code,
                MachineCode::OutOfRange
            );
            assert_eq!(
                err.to_driver_error(MachineCode::InvalidArgument).code,
                MachineCode::InvalidArgument
            );
        }
    }

    #[test]
    fn tags_match_when_the_vm_carries_every_tag_of_the_spec() {
        let spec =
            ProviderSpec::parse(&json!({ "vmPool": "p", "size": "small", "tags": { "c": "1" } })).unwrap();
        let vm = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
        };
        assert!(spec.tags_match(&vm(&[("c", "1"), ("role", "node")])));
        assert!(!spec.tags_match(&vm(&[("c", "2")])));
        assert!(!spec.tags_match(&vm(&[])));
    }
}
