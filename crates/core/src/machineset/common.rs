//! Small readers of machines, sets and metadata shared by the files of this module (one home each).

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mcm_api::{Machine, MachinePhase, MachineSet, keys::finalizers};

use crate::timeouts;

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

pub(super) fn name_of(machine: &Machine) -> &str {
    machine.metadata.name.as_deref().unwrap_or_default()
}

pub(super) fn labels_of(meta: &ObjectMeta) -> &BTreeMap<String, String> {
    meta.labels.as_ref().unwrap_or(&NO_LABELS)
}

pub(super) fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

pub(super) fn is_deleting(machine: &Machine) -> bool {
    machine.metadata.deletion_timestamp.is_some()
}

/// Being deleted, or phase Terminating: the machine is on its way out and does not count as one of the set's.
pub(super) fn is_going(machine: &Machine) -> bool {
    is_deleting(machine) || machine.phase() == Some(MachinePhase::Terminating)
}

pub(super) fn set_is_deleting(set: &MachineSet) -> bool {
    set.metadata.deletion_timestamp.is_some()
}

pub(super) fn has_finalizer(meta: &ObjectMeta) -> bool {
    meta.finalizers
        .iter()
        .flatten()
        .any(|f| f == finalizers::MACHINE_CONTROLLER_MANAGER)
}

pub(super) fn until(now: Timestamp, at: Timestamp) -> Duration {
    timeouts::elapsed(now, at)
}

pub(super) fn min_duration(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
