//! Which machines a set owns, adopts and releases, and the owner-reference patches that adopt or release them.
//!
//! Separate because claiming runs before everything else and reads nothing but labels and owner references.

use std::collections::BTreeMap;

use k8s_openapi::Resource as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use mcm_api::{Machine, MachineSet, MetaExt};
use serde_json::{Map, Value, json};

use super::common::labels_of;
use crate::drain::selector_matches;

/// Whether the set's selector matches the machine's labels. A missing or empty selector matches nothing (the
/// reference: "If a MachineSet with a nil or empty selector creeps in, it should match nothing, not everything").
pub fn selects(set: &MachineSet, machine: &Machine) -> bool {
    let Some(selector) = set.spec.selector.as_ref() else {
        return false;
    };
    let empty = selector.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
        && selector.match_expressions.as_ref().is_none_or(Vec::is_empty);
    !empty && selector_matches(selector, labels_of(&machine.metadata))
}

/// What a set does with one machine of its namespace (Kubernetes' `ClaimObject`, which the reference uses through
/// `MachineControllerRefManager`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Claim {
    /// The set controls the machine (and its selector matches, unless the set is being deleted).
    Owned,
    /// An orphan the set should adopt: no controller, selector matches, neither the machine nor the set is being
    /// deleted. It is the set's once [`adoption_patch`] succeeded.
    Adopt,
    /// The set controls the machine but its selector no longer matches: release it with [`release_patch`]. It is no
    /// longer the set's.
    Release,
    /// Not the set's business: another namespace, another controller, or a non-matching orphan.
    Ignore,
}

/// Decides what `set` does with `machine`. Rules (Kubernetes `ClaimObject`):
/// - a machine controlled by another owner (uid) is ignored;
/// - a machine controlled by the set is owned while the selector matches, else released — **except while the set is
///   being deleted**: then every machine it controls is owned, so that the set deletes all of them before its
///   finalizer goes (Kubernetes ignores non-matching machines then and leaves them to the garbage collector, which
///   deletes them after the set is gone);
/// - an orphan is adopted when the selector matches and neither it nor the set is being deleted.
///
/// A set without a uid (never stored) owns nothing. Before adopting, the controller must re-read the set from the API
/// server and check its uid and that it is not being deleted (Kubernetes' `RecheckDeletionTimestamp`): a cache may
/// still show a set that is gone.
pub fn claim(set: &MachineSet, machine: &Machine) -> Claim {
    if machine.metadata.namespace.as_deref().unwrap_or_default()
        != set.metadata.namespace.as_deref().unwrap_or_default()
    {
        return Claim::Ignore;
    }
    let uid = set.metadata.uid.as_deref().unwrap_or_default();
    if uid.is_empty() {
        return Claim::Ignore;
    }
    match machine.controller_ref() {
        Some(owner) if owner.uid == uid => {
            if set.is_deleting() || selects(set, machine) {
                Claim::Owned
            } else {
                Claim::Release
            }
        }
        Some(_) => Claim::Ignore,
        None if set.is_deleting() || machine.is_deleting() || !selects(set, machine) => Claim::Ignore,
        None => Claim::Adopt,
    }
}

/// The machines of a namespace sorted by [`claim`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Claims<'a> {
    /// Machines the set controls.
    pub owned: Vec<&'a Machine>,
    /// Orphans to adopt; add each to the owned ones once its adoption patch succeeded.
    pub adopt: Vec<&'a Machine>,
    /// Machines to release; they are not the set's.
    pub release: Vec<&'a Machine>,
}

/// Sorts the machines of the set's namespace (any others are ignored) by [`claim`].
pub fn claim_machines<'a>(set: &MachineSet, machines: impl IntoIterator<Item = &'a Machine>) -> Claims<'a> {
    let mut claims = Claims::default();
    for machine in machines {
        match claim(set, machine) {
            Claim::Owned => claims.owned.push(machine),
            Claim::Adopt => claims.adopt.push(machine),
            Claim::Release => claims.release.push(machine),
            Claim::Ignore => {}
        }
    }
    claims
}

/// The owner reference a set puts on its machines: `machine.sapcloud.io/v1alpha1` `MachineSet`, its name and uid,
/// `controller: true`, `blockOwnerDeletion: true` (as the reference).
pub fn owner_reference(set: &MachineSet) -> OwnerReference {
    OwnerReference {
        api_version: mcm_api::API_VERSION.to_owned(),
        kind: MachineSet::KIND.to_owned(),
        name: set.metadata.name.clone().unwrap_or_default(),
        uid: set.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn owner_references_patch(machine: &Machine, references: Vec<OwnerReference>) -> Value {
    let references = if references.is_empty() {
        Value::Null
    } else {
        serde_json::to_value(references).unwrap_or(Value::Null)
    };
    let mut metadata = Map::new();
    metadata.insert("ownerReferences".into(), references);
    if let Some(rv) = &machine.metadata.resource_version {
        metadata.insert("resourceVersion".into(), json!(rv));
    }
    json!({ "metadata": metadata })
}

/// The JSON merge patch that adopts `machine`: its owner references with the set's [`owner_reference`] added. A merge
/// patch replaces a list whole, so the patch carries every reference and the machine's `metadata.resourceVersion`: if
/// the machine changed meanwhile (another controller adopted it), the API server answers 409 and nothing is lost.
pub fn adoption_patch(set: &MachineSet, machine: &Machine) -> Value {
    let uid = set.metadata.uid.as_deref().unwrap_or_default();
    let mut references: Vec<OwnerReference> = machine
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.uid != uid)
        .cloned()
        .collect();
    references.push(owner_reference(set));
    owner_references_patch(machine, references)
}

/// The JSON merge patch that releases `machine`: its owner references without the set's (the field removed when none
/// is left), with `metadata.resourceVersion` as in [`adoption_patch`].
pub fn release_patch(set: &MachineSet, machine: &Machine) -> Value {
    let uid = set.metadata.uid.as_deref().unwrap_or_default();
    let references: Vec<OwnerReference> = machine
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.uid != uid)
        .cloned()
        .collect();
    owner_references_patch(machine, references)
}
