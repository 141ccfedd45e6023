//! [`SetView`]: a MachineSet as the arithmetic sees it, and the annotations each scale writes.
//!
//! Separate because the step's arithmetic works on these views, never on MachineSets themselves.

use std::collections::BTreeMap;

use jiff::Timestamp;
use mcm_api::{
    MachineSet,
    keys::{annotations, labels},
};

use super::fenceposts::Fenceposts;

/// A MachineSet of the deployment, as the arithmetic needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetView {
    /// The set's name.
    pub name: String,
    /// When it was created (older sets are scaled down first).
    pub created: Option<Timestamp>,
    /// `spec.replicas`.
    pub replicas: i32,
    /// `status.replicas`: its machines, those being deleted included.
    pub actual: i32,
    /// Its machines not being deleted. [`SetView::of`] takes `status.replicas`; for OnDelete the controller should set
    /// the count of the set's machines without a `deletionTimestamp` from its cache.
    pub live: i32,
    /// `status.readyReplicas`.
    pub ready: i32,
    /// `status.availableReplicas`.
    pub available: i32,
    /// The `deployment.kubernetes.io/desired-replicas` annotation.
    pub desired_replicas: Option<i32>,
    /// The `deployment.kubernetes.io/max-replicas` annotation.
    pub max_replicas: Option<i32>,
    /// The `deployment.kubernetes.io/revision` annotation.
    pub revision: Option<i64>,
    /// The set carries `node.machine.sapcloud.io/scale-up-disabled`.
    pub scale_up_disabled: bool,
}

pub(super) fn annotation_number<T: std::str::FromStr>(set: &MachineSet, key: &str) -> Option<T> {
    set.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.trim().parse().ok())
}

impl SetView {
    /// The view of a MachineSet (the status as last written by the set controller).
    pub fn of(set: &MachineSet) -> Self {
        let status = set.status.clone().unwrap_or_default();
        Self {
            name: set.metadata.name.clone().unwrap_or_default(),
            created: set.metadata.creation_timestamp.as_ref().map(|t| t.0),
            replicas: set.spec.replicas.max(0),
            actual: status.replicas.max(0),
            live: status.replicas.max(0),
            ready: status.ready_replicas.max(0),
            available: status.available_replicas.max(0),
            desired_replicas: annotation_number(set, annotations::DESIRED_REPLICAS),
            max_replicas: annotation_number(set, annotations::MAX_REPLICAS),
            revision: annotation_number(set, annotations::REVISION),
            scale_up_disabled: set
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(labels::SCALE_UP_DISABLED)),
        }
    }

    /// The machines the set has or is about to have: the larger of `spec.replicas` and `status.replicas`. A set
    /// scaled up has not created its machines yet; a set scaled down still has machines being deleted. Counting the
    /// larger keeps the total within `replicas + maxSurge` in both cases.
    pub fn footprint(&self) -> i32 {
        self.replicas.max(self.actual)
    }

    /// Available machines that the set will keep: never more than `spec.replicas` (a set scaled down will delete the
    /// rest, available or not).
    pub fn kept_available(&self) -> i32 {
        self.available.min(self.replicas)
    }
}

/// The annotations every scale writes on a set (Kubernetes' `SetReplicasAnnotations`):
/// `deployment.kubernetes.io/desired-replicas` = the deployment's replicas and `deployment.kubernetes.io/max-replicas`
/// = replicas + maxSurge.
pub fn replicas_annotations(replicas: i32, fenceposts: Fenceposts) -> BTreeMap<String, String> {
    BTreeMap::from([
        (annotations::DESIRED_REPLICAS.to_owned(), replicas.to_string()),
        (
            annotations::MAX_REPLICAS.to_owned(),
            replicas.saturating_add(fenceposts.max_surge).to_string(),
        ),
    ])
}
