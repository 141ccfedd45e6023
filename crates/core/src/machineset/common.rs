//! Small readers of machines, sets and metadata shared by the files of this module (one home each).

use std::{collections::BTreeMap, time::Duration};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mcm_api::Machine;

use crate::timeouts;

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

pub(super) fn name_of(machine: &Machine) -> &str {
    machine.metadata.name.as_deref().unwrap_or_default()
}

pub(super) fn labels_of(meta: &ObjectMeta) -> &BTreeMap<String, String> {
    meta.labels.as_ref().unwrap_or(&NO_LABELS)
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
