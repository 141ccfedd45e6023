//! `metadata.managedFields`: which manager owns which fields, per operation (Apply or Update) and subresource, and
//! how a write moves ownership, as kube-apiserver's field manager does.
//!
//! - An **Update** (create, replace, non-apply patch) takes the fields it adds or changes from every other manager
//!   and adds them to its own entry.
//! - An **Apply** owns exactly the fields of its configuration. A field it changes that another manager owns is a
//!   conflict, unless it is forced; then the other manager loses it.
//! - A field removed from the object is removed from every entry; entries left empty disappear.

use serde_json::{Value, json};

use super::fieldset::{FieldSet, display};
use super::merge::Comparison;

/// Whether an entry records applies or other writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Server-side apply.
    Apply,
    /// Any other write.
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Self::Apply => "Apply",
            Self::Update => "Update",
        }
    }
}

/// One entry of `metadata.managedFields`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The field manager (`fieldManager`).
    pub manager: String,
    /// Apply or Update.
    pub operation: Operation,
    /// The apiVersion the manager wrote in.
    pub api_version: String,
    /// When the entry last changed (RFC 3339).
    pub time: String,
    /// `status` or `scale` for writes to a subresource.
    pub subresource: Option<String>,
    /// The fields owned.
    pub fields: FieldSet,
}

impl Entry {
    /// Two entries are one when manager, operation and subresource agree, and for updates the apiVersion too, as
    /// kube-apiserver keys them.
    pub fn same_owner(&self, other: &Entry) -> bool {
        self.manager == other.manager
            && self.operation == other.operation
            && self.subresource == other.subresource
            && (self.operation == Operation::Apply || self.api_version == other.api_version)
    }

    /// How conflict messages name the manager: `"name"`, `"name" with subresource "status"`, and ` using <apiVersion>`
    /// for updates.
    pub fn describe(&self) -> String {
        let subresource = self
            .subresource
            .as_ref()
            .map(|sub| format!(" with subresource {sub:?}"))
            .unwrap_or_default();
        let api_version = match self.operation {
            Operation::Update => format!(" using {}", self.api_version),
            Operation::Apply => String::new(),
        };
        format!("{:?}{subresource}{api_version}", self.manager)
    }
}

/// The entries of an object (entries that cannot be read are skipped).
pub fn read(object: &Value) -> Vec<Entry> {
    let Some(list) = object["metadata"]["managedFields"].as_array() else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|entry| {
            let operation = match entry["operation"].as_str()? {
                "Apply" => Operation::Apply,
                "Update" => Operation::Update,
                _ => return None,
            };
            Some(Entry {
                manager: entry["manager"].as_str().unwrap_or_default().to_owned(),
                operation,
                api_version: entry["apiVersion"].as_str().unwrap_or_default().to_owned(),
                time: entry["time"].as_str().unwrap_or_default().to_owned(),
                subresource: entry["subresource"].as_str().map(str::to_owned),
                fields: FieldSet::from_fields_v1(&entry["fieldsV1"]),
            })
        })
        .collect()
}

/// The `managedFields` list of entries.
pub fn write(entries: &[Entry]) -> Value {
    Value::Array(
        entries
            .iter()
            .map(|entry| {
                let mut value = json!({
                    "manager": entry.manager,
                    "operation": entry.operation.as_str(),
                    "apiVersion": entry.api_version,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": entry.fields.to_fields_v1(),
                });
                // An entry a client wrote without a time keeps none.
                if !entry.time.is_empty() {
                    value["time"] = json!(entry.time);
                }
                if let Some(sub) = &entry.subresource {
                    value["subresource"] = json!(sub);
                }
                value
            })
            .collect(),
    )
}

/// A field another manager owns that an apply would change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The owner, as [`Entry::describe`] names it.
    pub manager: String,
    /// The field's path.
    pub path: super::fieldset::Path,
    /// The field, as kube-apiserver writes paths (`.spec.replicas`).
    pub field: String,
}

/// What a write does: who writes, with which operation, and for an apply the fields of its configuration.
#[derive(Clone, Debug)]
pub struct Write<'a> {
    /// The writer's entry as it will be (its `fields` are ignored for updates).
    pub writer: Entry,
    /// For applies: the configuration's fields and whether conflicts are forced.
    pub applied: Option<(&'a FieldSet, bool)>,
}

/// The entries after a write that made `comparison`; the conflicts when an unforced apply changes fields other
/// managers own.
pub fn after_write(
    mut entries: Vec<Entry>,
    write: Write<'_>,
    comparison: &Comparison,
) -> Result<Vec<Entry>, Vec<Conflict>> {
    let changed = comparison.changed();
    let Write { mut writer, applied } = write;
    if let Some((_, force)) = applied {
        let conflicts: Vec<Conflict> = entries
            .iter()
            .filter(|entry| !entry.same_owner(&writer))
            .flat_map(|entry| {
                entry
                    .fields
                    .intersection(&changed)
                    .iter()
                    .map(|path| Conflict {
                        manager: entry.describe(),
                        path: path.clone(),
                        field: display(path),
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        if !conflicts.is_empty() && !force {
            return Err(conflicts);
        }
    }
    let position = entries.iter().position(|entry| entry.same_owner(&writer));
    let previous = position.map(|i| entries[i].clone());
    for entry in entries.iter_mut().filter(|entry| !entry.same_owner(&writer)) {
        entry.fields = entry.fields.difference(&changed).difference(&comparison.removed);
    }
    writer.fields = match applied {
        Some((fields, _)) => fields.clone(),
        None => previous
            .as_ref()
            .map_or_else(FieldSet::new, |p| p.fields.clone())
            .union(&changed)
            .difference(&comparison.removed),
    };
    if let Some(previous) = &previous {
        let untouched =
            changed.is_empty() && comparison.removed.is_empty() && previous.fields == writer.fields;
        if untouched {
            writer.time.clone_from(&previous.time);
        }
    }
    match position {
        Some(i) => entries[i] = writer,
        None => entries.push(writer),
    }
    entries.retain(|entry| !entry.fields.is_empty());
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::fieldset::Element;

    fn set(paths: &[&[&str]]) -> FieldSet {
        let mut set = FieldSet::new();
        for path in paths {
            set.insert(path.iter().map(|name| Element::Field((*name).into())).collect());
        }
        set
    }

    fn entry(manager: &str, operation: Operation, fields: FieldSet) -> Entry {
        Entry {
            manager: manager.into(),
            operation,
            api_version: "v1".into(),
            time: "2026-01-01T00:00:00Z".into(),
            subresource: None,
            fields,
        }
    }

    fn writer(manager: &str, operation: Operation) -> Entry {
        let mut entry = entry(manager, operation, FieldSet::new());
        entry.time = "2026-02-02T00:00:00Z".into();
        entry
    }

    #[test]
    fn an_apply_that_changes_another_managers_field_conflicts_unless_forced() {
        let entries = vec![entry(
            "first",
            Operation::Apply,
            set(&[&["data", "a"], &["data", "b"]]),
        )];
        let applied = set(&[&["data", "a"]]);
        let comparison = Comparison {
            modified: set(&[&["data", "a"]]),
            ..Comparison::default()
        };
        let conflicts = after_write(
            entries.clone(),
            Write {
                writer: writer("second", Operation::Apply),
                applied: Some((&applied, false)),
            },
            &comparison,
        )
        .unwrap_err();
        assert_eq!(
            conflicts,
            vec![Conflict {
                manager: "\"first\"".into(),
                path: vec![Element::Field("data".into()), Element::Field("a".into())],
                field: ".data.a".into()
            }]
        );

        let forced = after_write(
            entries,
            Write {
                writer: writer("second", Operation::Apply),
                applied: Some((&applied, true)),
            },
            &comparison,
        )
        .expect("forced");
        assert_eq!(
            forced[0].fields,
            set(&[&["data", "b"]]),
            "the first manager lost the field"
        );
        assert_eq!(forced[1].fields, applied);
    }

    #[test]
    fn applying_the_same_value_shares_ownership() {
        let entries = vec![entry("first", Operation::Apply, set(&[&["data", "a"]]))];
        let applied = set(&[&["data", "a"]]);
        let after = after_write(
            entries,
            Write {
                writer: writer("second", Operation::Apply),
                applied: Some((&applied, false)),
            },
            &Comparison::default(),
        )
        .expect("no change, no conflict");
        assert_eq!(after.len(), 2);
        assert!(after.iter().all(|e| e.fields == applied));
    }

    #[test]
    fn an_update_takes_the_fields_it_changes_and_removed_fields_leave_every_entry() {
        let entries = vec![entry(
            "first",
            Operation::Apply,
            set(&[&["data", "a"], &["data", "b"]]),
        )];
        let comparison = Comparison {
            modified: set(&[&["data", "a"]]),
            removed: set(&[&["data", "b"]]),
            ..Comparison::default()
        };
        let after = after_write(
            entries,
            Write {
                writer: writer("kubectl-edit", Operation::Update),
                applied: None,
            },
            &comparison,
        )
        .expect("updates never conflict");
        assert_eq!(after.len(), 1, "the applier's entry is empty and goes");
        assert_eq!(after[0].manager, "kubectl-edit");
        assert_eq!(after[0].fields, set(&[&["data", "a"]]));
        assert_eq!(after[0].describe(), "\"kubectl-edit\" using v1");
    }

    #[test]
    fn an_unchanged_entry_keeps_its_time() {
        let entries = vec![entry("first", Operation::Update, set(&[&["data", "a"]]))];
        let after = after_write(
            entries,
            Write {
                writer: writer("first", Operation::Update),
                applied: None,
            },
            &Comparison::default(),
        )
        .expect("no-op");
        assert_eq!(after[0].time, "2026-01-01T00:00:00Z");
    }
}
