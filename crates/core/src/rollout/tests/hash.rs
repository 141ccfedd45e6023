//! The template hash and set names.

use std::collections::BTreeMap;

use mcm_api::{GoDuration, NodeTemplateSpec, keys::labels};
use pretty_assertions::assert_eq;

use super::*;
use crate::rollout::hash::{FNV32_OFFSET, fnv32a};

#[test]
fn fnv32a_is_the_standard_one() {
    assert_eq!(fnv32a(FNV32_OFFSET, b""), 0x811c_9dc5);
    assert_eq!(fnv32a(FNV32_OFFSET, b"a"), 0xe40c_292c);
    assert_eq!(fnv32a(FNV32_OFFSET, b"foobar"), 0xbf9c_f968);
}

#[test]
fn the_template_hash_is_stable_decimal_and_moves_with_the_collision_count() {
    // Reference §6.2: "Hash = FNV-32a DeepHashObject(template) with collisionCount (little-endian) appended,
    // rendered in decimal."
    let a = template("small");
    let hash = template_hash(&a, None);
    assert!(hash.bytes().all(|b| b.is_ascii_digit()), "{hash}");
    assert_eq!(template_hash(&a.clone(), None), hash);
    assert_ne!(template_hash(&template("large"), None), hash);
    let with_zero = template_hash(&a, Some(0));
    assert_ne!(
        with_zero, hash,
        "a collision count of 0 is appended too, as the reference"
    );
    assert_ne!(template_hash(&a, Some(1)), with_zero);
    // Canonical: the key order of free-form maps does not matter.
    let mut b = a.clone();
    b.metadata.as_mut().unwrap().annotations = Some(BTreeMap::from([
        ("x".into(), "1".into()),
        ("a".into(), "2".into()),
    ]));
    let mut c = a.clone();
    c.metadata.as_mut().unwrap().annotations = Some(BTreeMap::from([
        ("a".into(), "2".into()),
        ("x".into(), "1".into()),
    ]));
    assert_eq!(template_hash(&b, Some(3)), template_hash(&c, Some(3)));
}

#[test]
fn set_names_use_five_safe_characters_of_the_hash() {
    // Reference: "MachineSet name = <md>-<first 5 chars of rand.SafeEncodeString(hash)>".
    assert_eq!(safe_encode("01"), "45");
    assert_eq!(machine_set_name("md", "0123456789"), "md-45678");
    assert_eq!(machine_set_name("md", "12"), "md-56");
    let with_hash = template_with_hash(&template("small"), "123");
    assert_eq!(
        with_hash
            .labels()
            .get(labels::MACHINE_TEMPLATE_HASH)
            .map(String::as_str),
        Some("123")
    );
}

#[test]
fn equal_ignore_hash_ignores_what_is_propagated_in_place() {
    // Reference §6.2: "The comparison ignores the hash label, nodeTemplate, MachineConfiguration and class.kind.
    // Any other template change (labels, annotations, class.name, providerID…) therefore triggers a rollout."
    let base = template("small");
    let mut same = template_with_hash(&base, "42");
    same.spec.node_template = Some(NodeTemplateSpec::default());
    same.spec.configuration.drain_timeout = Some(GoDuration::new("1h"));
    same.spec.class.kind = "AWSMachineClass".into();
    assert!(equal_ignore_hash(&base, &same));
    let mut renamed = base.clone();
    renamed.spec.class.name = "large".into();
    assert!(!equal_ignore_hash(&base, &renamed));
    let mut annotated = base.clone();
    annotated.metadata.as_mut().unwrap().annotations = Some(BTreeMap::from([("a".into(), "b".into())]));
    assert!(!equal_ignore_hash(&base, &annotated));
}
