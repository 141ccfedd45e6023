//! Claiming, adoption and release.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference, Time};
use mcm_api::Machine;
use pretty_assertions::assert_eq;
use serde_json::Value;

use super::*;

#[test]
fn claim_owns_matching_machines_adopts_matching_orphans_and_releases_the_others() {
    // Kubernetes ClaimObject: owned + match = keep; owned + no match = release; orphan + match = adopt.
    let set = set(3);
    let owned = running("a");
    let mut orphan = running("b");
    orphan.metadata.owner_references = None;
    let mut drifted = running("c");
    drifted.metadata.labels = Some(BTreeMap::from([("app".into(), "db".into())]));
    let mut other_orphan = running("d");
    other_orphan.metadata.owner_references = None;
    other_orphan.metadata.labels = None;
    let claims = claim_machines(&set, [&owned, &orphan, &drifted, &other_orphan]);
    assert_eq!(claims.owned, vec![&owned]);
    assert_eq!(claims.adopt, vec![&orphan]);
    assert_eq!(claims.release, vec![&drifted]);
}

#[test]
fn machines_of_another_controller_or_namespace_are_ignored() {
    let set = set(3);
    let mut foreign = running("a");
    foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into();
    let mut elsewhere = running("b");
    elsewhere.metadata.namespace = Some("other".into());
    elsewhere.metadata.owner_references = None;
    let mut not_controller = running("c");
    not_controller.metadata.owner_references.as_mut().unwrap()[0].controller = Some(false);
    assert_eq!(claim(&set, &foreign), Claim::Ignore);
    assert_eq!(claim(&set, &elsewhere), Claim::Ignore);
    // An owner reference that is not the controller does not make a machine owned: it is an orphan.
    assert_eq!(claim(&set, &not_controller), Claim::Adopt);
}

#[test]
fn orphans_being_deleted_are_not_adopted_and_a_deleting_set_adopts_nothing() {
    let mut orphan = running("a");
    orphan.metadata.owner_references = None;
    orphan.metadata.deletion_timestamp = Some(Time(at(5)));
    assert_eq!(claim(&set(1), &orphan), Claim::Ignore);

    let mut deleting = set(1);
    deleting.metadata.deletion_timestamp = Some(Time(at(5)));
    let mut orphan = running("b");
    orphan.metadata.owner_references = None;
    assert_eq!(claim(&deleting, &orphan), Claim::Ignore);
}

#[test]
fn a_deleting_set_owns_every_machine_it_controls_so_it_deletes_them_first() {
    let mut deleting = set(1);
    deleting.metadata.deletion_timestamp = Some(Time(at(5)));
    let mut drifted = running("a");
    drifted.metadata.labels = None;
    assert_eq!(claim(&deleting, &drifted), Claim::Owned);
}

#[test]
fn an_empty_or_missing_selector_matches_nothing() {
    let mut set = set(1);
    let mut orphan = running("a");
    orphan.metadata.owner_references = None;
    set.spec.selector = Some(LabelSelector::default());
    assert!(!selects(&set, &orphan));
    assert_eq!(claim(&set, &orphan), Claim::Ignore);
    set.spec.selector = None;
    assert!(!selects(&set, &orphan));
    // Match expressions select too.
    set.spec.selector = Some(LabelSelector {
        match_expressions: Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                key: "app".into(),
                operator: "In".into(),
                values: Some(vec!["web".into(), "api".into()]),
            },
        ]),
        ..LabelSelector::default()
    });
    assert!(selects(&set, &orphan));
}

#[test]
fn a_set_without_uid_owns_nothing() {
    let mut set = set(1);
    set.metadata.uid = None;
    let mut orphan = running("a");
    orphan.metadata.owner_references = None;
    assert_eq!(claim(&set, &orphan), Claim::Ignore);
}

#[test]
fn adoption_adds_the_controller_reference_and_keeps_the_others() {
    let set = set(1);
    let mut orphan = running("a");
    orphan.metadata.resource_version = Some("42".into());
    orphan.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "keep".into(),
        uid: "cm".into(),
        ..OwnerReference::default()
    }]);
    let patch = adoption_patch(&set, &orphan);
    assert_eq!(patch["metadata"]["resourceVersion"], "42");
    let mut object = serde_json::to_value(&orphan).unwrap();
    json_patch::merge(&mut object, &patch);
    let adopted: Machine = serde_json::from_value(object).unwrap();
    let refs = adopted.metadata.owner_references.unwrap();
    assert_eq!(refs.len(), 2);
    assert_eq!(refs[0].name, "keep");
    assert_eq!(refs[1], owner_reference(&set));
    assert_eq!(refs[1].controller, Some(true));
    assert_eq!(refs[1].block_owner_deletion, Some(true));
    assert_eq!(refs[1].kind, "MachineSet");
    assert_eq!(refs[1].api_version, "machine.sapcloud.io/v1alpha1");
}

#[test]
fn release_removes_only_the_sets_reference() {
    let set = set(1);
    let mut owned = running("a");
    let patch = release_patch(&set, &owned);
    assert_eq!(patch["metadata"]["ownerReferences"], Value::Null);
    let mut object = serde_json::to_value(&owned).unwrap();
    json_patch::merge(&mut object, &patch);
    let released: Machine = serde_json::from_value(object).unwrap();
    assert_eq!(released.metadata.owner_references, None);

    owned
        .metadata
        .owner_references
        .as_mut()
        .unwrap()
        .push(OwnerReference {
            name: "keep".into(),
            uid: "x".into(),
            ..OwnerReference::default()
        });
    let patch = release_patch(&set, &owned);
    assert_eq!(patch["metadata"]["ownerReferences"][0]["name"], "keep");
    assert_eq!(patch["metadata"]["ownerReferences"].as_array().unwrap().len(), 1);
}
