//! The template hash (Kubernetes' FNV-32a of the template), the new set's name and template equality ignoring the hash.
//!
//! Separate because it decides which set is new; the arithmetic never looks inside a template.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mcm_api::{MachineTemplateSpec, keys::labels};
use serde_json::Value;

pub(super) const FNV32_OFFSET: u32 = 0x811c_9dc5;
const FNV32_PRIME: u32 = 0x0100_0193;

pub(super) fn fnv32a(hash: u32, bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .fold(hash, |h, b| (h ^ u32::from(*b)).wrapping_mul(FNV32_PRIME))
}

/// Canonical JSON: object keys sorted at every level, no whitespace, so that equal templates hash equally whatever
/// order their maps were written or read in.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The template hash (the reference's `ComputeHash`): FNV-32a over the template, then — when the deployment has a
/// `collisionCount` — its value as 8 little-endian bytes (the reference writes a `uint32` into an 8-byte buffer),
/// rendered in decimal. It is stable: the template is hashed as canonical JSON (sorted keys). The reference hashes
/// Go's `spew` dump of the struct, which cannot be reproduced outside Go, so the values differ from the reference's;
/// only the new set's name depends on them, and sets are found by template equality ([`equal_ignore_hash`]), not by
/// hash, so a set created by the reference is still recognised.
pub fn template_hash(template: &MachineTemplateSpec, collision_count: Option<i32>) -> String {
    let mut text = String::new();
    canonical(&serde_json::to_value(template).unwrap_or(Value::Null), &mut text);
    let mut hash = fnv32a(FNV32_OFFSET, text.as_bytes());
    if let Some(count) = collision_count {
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&count.cast_unsigned().to_le_bytes());
        hash = fnv32a(hash, &bytes);
    }
    hash.to_string()
}

/// The characters of Kubernetes' `rand.SafeEncodeString` (no vowels, so no words).
const SAFE_ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Kubernetes' `rand.SafeEncodeString`: each character mapped by its code point into `bcdfghjklmnpqrstvwxz2456789`.
pub fn safe_encode(text: &str) -> String {
    text.chars()
        .map(|c| SAFE_ALPHANUMS[(c as usize) % SAFE_ALPHANUMS.len()] as char)
        .collect()
}

/// The new set's name: `<deployment>-<first 5 characters of safe_encode(hash)>` (reference `getNewMachineSet`).
pub fn machine_set_name(deployment_name: &str, hash: &str) -> String {
    let encoded: String = safe_encode(hash).chars().take(5).collect();
    format!("{deployment_name}-{encoded}")
}

/// The template a set made from `template` carries: the template with the label `machine-template-hash` = `hash`
/// (also to be added to the set's selector).
pub fn template_with_hash(template: &MachineTemplateSpec, hash: &str) -> MachineTemplateSpec {
    let mut template = template.clone();
    template
        .metadata
        .get_or_insert_with(ObjectMeta::default)
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::MACHINE_TEMPLATE_HASH.to_owned(), hash.to_owned());
    template
}

/// The reference's `EqualIgnoreHash`: templates equal once the `machine-template-hash` label, `nodeTemplate`, the
/// machine configuration and `class.kind` are ignored (those are propagated to existing machines, so changing them
/// does not roll the deployment; any other change — labels, annotations, `class.name` — does).
pub fn equal_ignore_hash(a: &MachineTemplateSpec, b: &MachineTemplateSpec) -> bool {
    fn strip(template: &MachineTemplateSpec) -> MachineTemplateSpec {
        let mut template = template.clone();
        if let Some(meta) = template.metadata.as_mut() {
            if let Some(labels) = meta.labels.as_mut() {
                labels.remove(labels::MACHINE_TEMPLATE_HASH);
                if labels.is_empty() {
                    meta.labels = None;
                }
            }
            if meta.annotations.as_ref().is_some_and(BTreeMap::is_empty) {
                meta.annotations = None;
            }
        }
        if template
            .metadata
            .as_ref()
            .is_some_and(|m| *m == ObjectMeta::default())
        {
            template.metadata = None;
        }
        template.spec.node_template = None;
        template.spec.configuration = mcm_api::MachineConfiguration::default();
        template.spec.class.kind.clear();
        template
    }
    strip(a) == strip(b)
}
