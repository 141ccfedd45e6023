//! The `providerSpec` of the local provider: the example schema of spec 000.
//!
//! | field | mandatory | type | rule |
//! |---|---|---|---|
//! | `vmPool` | yes | string | not empty |
//! | `size` | yes | string | one of [`SIZES`]: `xsmall`, `small`, `medium`, `large` |
//! | `rootFsSize` | no | integer (GB) | at least 1; `null` is absent |
//! | `tags` | yes | map of strings | not empty (the tags tell the machines of the cluster) |
//!
//! Any other field is refused. Every problem names its field, and all problems are reported, joined with `; `:
//! `providerSpec.size: unknown size "huge" (xsmall, small, medium, large)`,
//! `providerSpec.colour: unknown field (known: vmPool, size, rootFsSize, tags)`. Every problem is
//! `InvalidArgument`, except a `rootFsSize` below 1, which CreateMachine answers with `OutOfRange` (its table: "The
//! requested number of CPUs, memory size, of FS size in ProviderSpec falls outside of the corresponding valid
//! range"). Messages show only values of the spec itself, never of the secret.

use std::{collections::BTreeMap, fmt};

use mcm_driver::{DriverError, MachineCode};
use serde_json::Value;

/// The fields of the schema, in the order they are checked and listed.
pub const FIELDS: [&str; 4] = ["vmPool", "size", "rootFsSize", "tags"];

/// Every size: name, CPUs, memory (a Kubernetes quantity), smallest first.
pub const SIZES: [(&str, u32, &str); 4] = [
    ("xsmall", 1, "2Gi"),
    ("small", 2, "4Gi"),
    ("medium", 4, "8Gi"),
    ("large", 8, "16Gi"),
];

/// The CPUs and memory (a Kubernetes quantity such as `4Gi`) of a size name, or `None` for an unknown size.
///
/// `xsmall` = 1 CPU, 2Gi; `small` = 2 CPUs, 4Gi; `medium` = 4 CPUs, 8Gi; `large` = 8 CPUs, 16Gi (as the
/// `nodeTemplate` of the example classes says).
pub fn size_resources(size: &str) -> Option<(u32, &'static str)> {
    SIZES
        .iter()
        .find(|(name, _, _)| *name == size)
        .map(|&(_, cpu, memory)| (cpu, memory))
}

/// The size names, comma-separated, smallest first.
fn size_names() -> String {
    SIZES.map(|(name, _, _)| name).join(", ")
}

/// A valid `providerSpec`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderSpec {
    /// `vmPool`: the VM pool name.
    pub vm_pool: String,
    /// `size`: one of the names of [`SIZES`].
    pub size: String,
    /// `rootFsSize`: root filesystem size in GB, when given (recorded only; a local machine has no disk of its own).
    pub root_fs_size: Option<u64>,
    /// `tags`: the tags put on the machine; a class's machines are those carrying all of its tags.
    pub tags: BTreeMap<String, String>,
}

impl ProviderSpec {
    /// Validates a `providerSpec` and returns it typed, or every problem found.
    pub fn parse(value: &Value) -> Result<Self, SpecError> {
        let mut problems = Vec::new();
        let Some(object) = value.as_object() else {
            problems.push(Problem::invalid(
                "providerSpec",
                format!(
                    "must be an object with vmPool, size and tags, got {}",
                    json_kind(value)
                ),
            ));
            return Err(SpecError { problems });
        };
        let vm_pool = vm_pool(object, &mut problems);
        let size = size(object, &mut problems);
        let root_fs_size = root_fs_size(object, &mut problems);
        let tags = tags(object, &mut problems);
        for key in object.keys().filter(|key| !FIELDS.contains(&key.as_str())) {
            problems.push(Problem::invalid(
                format!("providerSpec.{key}"),
                format!("unknown field (known: {})", FIELDS.join(", ")),
            ));
        }
        match (vm_pool, size, tags) {
            (Some(vm_pool), Some(size), Some(tags)) if problems.is_empty() => Ok(Self {
                vm_pool,
                size,
                root_fs_size,
                tags,
            }),
            _ => Err(SpecError { problems }),
        }
    }

    /// The CPUs and memory of the spec's size.
    pub fn resources(&self) -> (u32, &'static str) {
        // `parse` admits only known sizes.
        size_resources(&self.size).unwrap_or((0, "0"))
    }

    /// Whether a machine with these tags carries every tag of this spec (same key, same value): the machine belongs
    /// to the cluster the spec's tags tell.
    pub fn tags_match(&self, machine_tags: &BTreeMap<String, String>) -> bool {
        self.tags
            .iter()
            .all(|(key, value)| machine_tags.get(key) == Some(value))
    }
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

impl Problem {
    fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: ProblemKind::Invalid,
            message: message.into(),
        }
    }
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
    /// The driver error of these problems: `range_code` when every problem is a range problem (CreateMachine passes
    /// `OutOfRange`), `InvalidArgument` otherwise.
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

type Object = serde_json::Map<String, Value>;

/// A field's value, `null` read as absent.
fn present<'a>(object: &'a Object, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|v| !v.is_null())
}

fn vm_pool(object: &Object, problems: &mut Vec<Problem>) -> Option<String> {
    const FIELD: &str = "providerSpec.vmPool";
    match present(object, "vmPool") {
        None => {
            problems.push(Problem::invalid(FIELD, "required (the VM pool name, a string)"));
            None
        }
        Some(Value::String(pool)) if pool.is_empty() => {
            problems.push(Problem::invalid(FIELD, "must not be empty"));
            None
        }
        Some(Value::String(pool)) => Some(pool.clone()),
        Some(other) => {
            problems.push(Problem::invalid(
                FIELD,
                format!("must be a string, got {}", json_kind(other)),
            ));
            None
        }
    }
}

fn size(object: &Object, problems: &mut Vec<Problem>) -> Option<String> {
    const FIELD: &str = "providerSpec.size";
    match present(object, "size") {
        None => {
            problems.push(Problem::invalid(
                FIELD,
                format!("required (one of {})", size_names()),
            ));
            None
        }
        Some(Value::String(name)) if size_resources(name).is_some() => Some(name.clone()),
        Some(Value::String(name)) => {
            problems.push(Problem::invalid(
                FIELD,
                format!("unknown size {name:?} ({})", size_names()),
            ));
            None
        }
        Some(other) => {
            problems.push(Problem::invalid(
                FIELD,
                format!("must be a string, got {}", json_kind(other)),
            ));
            None
        }
    }
}

fn root_fs_size(object: &Object, problems: &mut Vec<Problem>) -> Option<u64> {
    const FIELD: &str = "providerSpec.rootFsSize";
    match present(object, "rootFsSize") {
        None => None,
        Some(Value::Number(n)) if n.is_u64() || n.is_i64() => {
            let gb = n.as_u64().filter(|gb| *gb >= 1);
            if gb.is_none() {
                problems.push(Problem {
                    field: FIELD.into(),
                    kind: ProblemKind::OutOfRange,
                    message: format!("{n} GB is out of range (at least 1 GB)"),
                });
            }
            gb
        }
        Some(other) => {
            let found = if other.is_number() {
                "a fraction"
            } else {
                json_kind(other)
            };
            problems.push(Problem::invalid(
                FIELD,
                format!("must be an integer (the root filesystem size in GB), got {found}"),
            ));
            None
        }
    }
}

fn tags(object: &Object, problems: &mut Vec<Problem>) -> Option<BTreeMap<String, String>> {
    const FIELD: &str = "providerSpec.tags";
    match present(object, "tags") {
        None => {
            problems.push(Problem::invalid(FIELD, "required (a map of strings)"));
            None
        }
        Some(Value::Object(map)) if map.is_empty() => {
            problems.push(Problem::invalid(
                FIELD,
                "must not be empty (the tags tell the machines of the cluster)",
            ));
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
                    problems.push(Problem::invalid(
                        format!("{FIELD}[{key:?}]"),
                        format!("must be a string, got {}", json_kind(value)),
                    ));
                }
            }
            ok.then_some(tags)
        }
        Some(other) => {
            problems.push(Problem::invalid(
                FIELD,
                format!("must be a map of strings, got {}", json_kind(other)),
            ));
            None
        }
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
    fn sizes_map_to_cpus_and_memory() {
        assert_eq!(size_resources("xsmall"), Some((1, "2Gi")));
        assert_eq!(size_resources("small"), Some((2, "4Gi")));
        assert_eq!(size_resources("medium"), Some((4, "8Gi")));
        assert_eq!(size_resources("large"), Some((8, "16Gi")));
        assert_eq!(size_resources("huge"), None);
        assert_eq!(size_resources("Small"), None);
    }

    #[test]
    fn a_valid_spec_is_typed() {
        let spec = ProviderSpec::parse(&json!({
            "vmPool": "test-worker-pool",
            "size": "small",
            "rootFsSize": 10,
            "tags": { "kubernetes.io/cluster/demo": "1", "kubernetes.io/role/node": "1" },
        }))
        .unwrap();
        assert_eq!(spec.vm_pool, "test-worker-pool");
        assert_eq!(spec.size, "small");
        assert_eq!(spec.resources(), (2, "4Gi"));
        assert_eq!(spec.root_fs_size, Some(10));
        assert_eq!(spec.tags.len(), 2);
        let without_root_fs = ProviderSpec::parse(
            &json!({ "vmPool": "p", "size": "large", "rootFsSize": null, "tags": { "a": "b" } }),
        )
        .unwrap();
        assert_eq!(without_root_fs.root_fs_size, None);
    }

    #[test]
    fn every_problem_names_its_field() {
        assert_eq!(
            problems(&json!({})),
            [
                "providerSpec.vmPool: required (the VM pool name, a string)",
                "providerSpec.size: required (one of xsmall, small, medium, large)",
                "providerSpec.tags: required (a map of strings)",
            ]
        );
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
            problems(
                &json!({ "vmPool": "", "size": "huge", "rootFsSize": 1.5, "tags": { "team": 7 }, "colour": "red" })
            ),
            [
                "providerSpec.vmPool: must not be empty",
                "providerSpec.size: unknown size \"huge\" (xsmall, small, medium, large)",
                "providerSpec.rootFsSize: must be an integer (the root filesystem size in GB), got a fraction",
                "providerSpec.tags[\"team\"]: must be a string, got a number",
                "providerSpec.colour: unknown field (known: vmPool, size, rootFsSize, tags)",
            ]
        );
        assert_eq!(
            problems(&json!({ "vmPool": "p", "size": "small", "tags": {} })),
            ["providerSpec.tags: must not be empty (the tags tell the machines of the cluster)"]
        );
        assert_eq!(
            problems(&json!("small")),
            ["providerSpec: must be an object with vmPool, size and tags, got a string"]
        );
    }

    #[test]
    fn a_root_fs_size_below_one_is_out_of_range_for_create_only() {
        for size in [json!(0), json!(-3)] {
            let err = ProviderSpec::parse(
                &json!({ "vmPool": "p", "size": "small", "rootFsSize": size, "tags": { "a": "b" } }),
            )
            .unwrap_err();
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
        let mixed = ProviderSpec::parse(
            &json!({ "vmPool": "p", "size": "huge", "rootFsSize": 0, "tags": { "a": "b" } }),
        )
        .unwrap_err();
        assert_eq!(
            mixed.to_driver_error(MachineCode::OutOfRange).code,
            MachineCode::InvalidArgument
        );
    }

    #[test]
    fn tags_match_when_the_machine_carries_every_tag_of_the_spec() {
        let spec =
            ProviderSpec::parse(&json!({ "vmPool": "p", "size": "small", "tags": { "c": "1" } })).unwrap();
        let tags = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
        };
        assert!(spec.tags_match(&tags(&[("c", "1"), ("role", "node")])));
        assert!(!spec.tags_match(&tags(&[("c", "2")])));
        assert!(!spec.tags_match(&tags(&[])));
    }
}
