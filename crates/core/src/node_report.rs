//! What a kubelet reports about its node, shared by this project's two node reporters: the sim provider's kubelet
//! and `mcm node-agent` (the local provider's). One home for kubelet's condition table (types, healthy statuses,
//! reasons and messages as kubelet sends them), the node Lease (its namespace, duration and renewal patch), how
//! condition times are stamped, and when a status write is due. The reporters pass the time and do the writes.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::NodeCondition,
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time},
};
use mcm_api::keys::kubernetes::NODE_LEASE_NAMESPACE;
use serde_json::{Value, json};

/// How often a node's Lease is renewed unless configured otherwise (kubelet's `nodeLeaseRenewInterval`, 10 s).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// `leaseDurationSeconds` of a node's Lease unless configured otherwise (kubelet's `nodeLeaseDurationSeconds`).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(40);
/// Pods a node takes: `pods` in its capacity and allocatable (kubelet's default `maxPods`).
pub const MAX_PODS: u32 = 110;

/// A condition kubelet posts, as it posts it on a healthy node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KubeletCondition {
    /// The condition type.
    pub type_: &'static str,
    /// The healthy status.
    pub status: &'static str,
    /// kubelet's reason for the healthy status.
    pub reason: &'static str,
    /// kubelet's message for the healthy status.
    pub message: &'static str,
}

impl KubeletCondition {
    /// The healthy condition, without times.
    pub fn healthy(&self) -> NodeCondition {
        condition(self.type_, self.status, self.reason, self.message)
    }
}

/// The conditions kubelet posts, in kubelet's order, healthy (kubelet's node status setters). NetworkUnavailable is
/// not among them: the network plugin or the cloud's route controller posts it, not kubelet.
pub const KUBELET_CONDITIONS: [KubeletCondition; 4] = [
    KubeletCondition {
        type_: "MemoryPressure",
        status: "False",
        reason: "KubeletHasSufficientMemory",
        message: "kubelet has sufficient memory available",
    },
    KubeletCondition {
        type_: "DiskPressure",
        status: "False",
        reason: "KubeletHasNoDiskPressure",
        message: "kubelet has no disk pressure",
    },
    KubeletCondition {
        type_: "PIDPressure",
        status: "False",
        reason: "KubeletHasSufficientPID",
        message: "kubelet has sufficient PID available",
    },
    KubeletCondition {
        type_: "Ready",
        status: "True",
        reason: "KubeletReady",
        message: "kubelet is posting ready status",
    },
];

/// Whether kubelet itself posts conditions of this type.
pub fn is_kubelet_condition(type_: &str) -> bool {
    KUBELET_CONDITIONS.iter().any(|c| c.type_ == type_)
}

/// A node condition without times.
pub fn condition(type_: &str, status: &str, reason: &str, message: &str) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: None,
        last_transition_time: None,
    }
}

/// The conditions a reporter posts, without times: kubelet's, each replaced by what `forced` gives for it (a fault,
/// a condition file), followed by `extra` (forced conditions of other types).
pub fn reported_conditions(
    forced: impl Fn(&KubeletCondition) -> Option<NodeCondition>,
    extra: impl IntoIterator<Item = NodeCondition>,
) -> Vec<NodeCondition> {
    KUBELET_CONDITIONS
        .iter()
        .map(|kubelet| forced(kubelet).unwrap_or_else(|| kubelet.healthy()))
        .chain(extra)
        .collect()
}

/// Stamps `conditions` as kubelet does: heartbeat `now`; transition time kept from the condition of the same type
/// in `current` when its status is the same, else `now`.
pub fn stamp(conditions: &mut [NodeCondition], current: &[NodeCondition], now: Timestamp) {
    for condition in conditions {
        let kept = current
            .iter()
            .find(|c| c.type_ == condition.type_)
            .filter(|c| c.status == condition.status)
            .and_then(|c| c.last_transition_time.clone());
        condition.last_heartbeat_time = Some(Time(now));
        condition.last_transition_time = Some(kept.unwrap_or(Time(now)));
    }
}

/// A condition without its times: type, status, reason, message.
pub type ConditionFingerprint = (String, String, Option<String>, Option<String>);

/// Conditions without their times, sorted: lists with equal fingerprints report the same.
pub fn fingerprint(conditions: &[NodeCondition]) -> Vec<ConditionFingerprint> {
    let mut list: Vec<_> = conditions
        .iter()
        .map(|c| {
            (
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                c.message.clone(),
            )
        })
        .collect();
    list.sort();
    list
}

/// When a reporter writes its node's status (the Lease is its heartbeat either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusReport {
    /// Only when what it reports differs from what the server has (KWOK's pattern: the fewest writes).
    OnChange,
    /// Also after this many heartbeats without a write, as kubelet posts its status at least every
    /// `nodeStatusReportFrequency` even when nothing changed.
    AtLeastEvery(u32),
}

impl StatusReport {
    /// Whether a status write is due: `changed` when the server's status differs from the reported one,
    /// `heartbeats_since_write` the heartbeats since the last write.
    pub fn is_due(self, changed: bool, heartbeats_since_write: u32) -> bool {
        match self {
            Self::OnChange => changed,
            Self::AtLeastEvery(heartbeats) => changed || heartbeats_since_write >= heartbeats,
        }
    }
}

/// `leaseDurationSeconds` for a lease duration (whole seconds, saturating).
pub fn lease_duration_seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs()).unwrap_or(i32::MAX)
}

/// A node's Lease as its reporter writes it at one heartbeat: `kube-node-lease/<node>`, held by the node, renewed
/// now, owned by the Node (so that it goes with the Node).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeLease {
    /// The owner reference to the Node.
    pub owner: OwnerReference,
    /// holderIdentity, leaseDurationSeconds, renewTime.
    pub spec: LeaseSpec,
}

impl NodeLease {
    /// The Lease of the Node `node` (uid `uid`) renewed at `now`.
    pub fn new(node: &str, uid: &str, duration: Duration, now: Timestamp) -> Self {
        Self {
            owner: OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.into(),
                uid: uid.into(),
                ..OwnerReference::default()
            },
            spec: LeaseSpec {
                holder_identity: Some(node.into()),
                lease_duration_seconds: Some(lease_duration_seconds(duration)),
                renew_time: Some(MicroTime(now)),
                ..LeaseSpec::default()
            },
        }
    }

    /// The merge patch that renews an existing Lease (and sets its owner).
    pub fn renewal_patch(&self) -> Value {
        json!({
            "metadata": { "ownerReferences": [self.owner] },
            "spec": self.spec,
        })
    }

    /// The Lease to create when there is none.
    pub fn lease(&self) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.owner.name.clone()),
                namespace: Some(NODE_LEASE_NAMESPACE.into()),
                owner_references: Some(vec![self.owner.clone()]),
                ..ObjectMeta::default()
            },
            spec: Some(self.spec.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    #[test]
    fn a_healthy_report_is_kubelets_four_conditions_in_kubelets_order() {
        let reported = reported_conditions(|_| None, []);
        let shown: Vec<(&str, &str, Option<&str>)> = reported
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()))
            .collect();
        assert_eq!(
            shown,
            [
                ("MemoryPressure", "False", Some("KubeletHasSufficientMemory")),
                ("DiskPressure", "False", Some("KubeletHasNoDiskPressure")),
                ("PIDPressure", "False", Some("KubeletHasSufficientPID")),
                ("Ready", "True", Some("KubeletReady")),
            ]
        );
        assert!(reported.iter().all(|c| c.last_heartbeat_time.is_none()));
        assert!(is_kubelet_condition("Ready"));
        assert!(!is_kubelet_condition("NetworkUnavailable"));
    }

    #[test]
    fn forced_conditions_replace_kubelets_and_extra_ones_follow() {
        let reported = reported_conditions(
            |c| (c.type_ == "Ready").then(|| condition("Ready", "False", "R", "m")),
            [condition("KernelDeadlock", "True", "K", "k")],
        );
        let types: Vec<(&str, &str)> = reported
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            types,
            [
                ("MemoryPressure", "False"),
                ("DiskPressure", "False"),
                ("PIDPressure", "False"),
                ("Ready", "False"),
                ("KernelDeadlock", "True"),
            ]
        );
    }

    #[test]
    fn stamping_keeps_the_transition_time_only_of_an_unchanged_status() {
        let mut current = reported_conditions(|_| None, []);
        stamp(&mut current, &[], at(1_000));
        assert!(
            current
                .iter()
                .all(|c| c.last_transition_time == Some(Time(at(1_000))))
        );
        let mut next = reported_conditions(
            |c| (c.type_ == "Ready").then(|| condition("Ready", "False", "R", "m")),
            [],
        );
        stamp(&mut next, &current, at(2_000));
        assert!(
            next.iter()
                .all(|c| c.last_heartbeat_time == Some(Time(at(2_000))))
        );
        assert_eq!(next[0].last_transition_time, Some(Time(at(1_000))));
        assert_eq!(next[3].last_transition_time, Some(Time(at(2_000))));
    }

    #[test]
    fn fingerprints_ignore_times_and_order() {
        let mut stamped = reported_conditions(|_| None, []);
        stamp(&mut stamped, &[], at(5));
        let mut reversed = reported_conditions(|_| None, []);
        reversed.reverse();
        assert_eq!(fingerprint(&stamped), fingerprint(&reversed));
        let changed = reported_conditions(
            |c| (c.type_ == "DiskPressure").then(|| condition("DiskPressure", "True", "D", "d")),
            [],
        );
        assert_ne!(fingerprint(&stamped), fingerprint(&changed));
    }

    #[test]
    fn a_status_write_is_due_on_change_or_after_enough_heartbeats() {
        assert!(StatusReport::OnChange.is_due(true, 0));
        assert!(!StatusReport::OnChange.is_due(false, 1_000));
        let every_four = StatusReport::AtLeastEvery(4);
        assert!(every_four.is_due(true, 1));
        assert!(!every_four.is_due(false, 3));
        assert!(every_four.is_due(false, 4));
    }

    #[test]
    fn the_lease_is_held_by_and_owned_by_its_node() {
        let lease = NodeLease::new("n1", "uid-1", Duration::from_secs(40), at(7));
        let created = lease.lease();
        assert_eq!(created.metadata.name.as_deref(), Some("n1"));
        assert_eq!(created.metadata.namespace.as_deref(), Some("kube-node-lease"));
        let patch = lease.renewal_patch();
        assert_eq!(patch["spec"]["holderIdentity"], "n1");
        assert_eq!(patch["spec"]["leaseDurationSeconds"], 40);
        assert_eq!(patch["spec"]["renewTime"], "1970-01-01T00:00:07.000000Z");
        assert_eq!(patch["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(patch["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(lease_duration_seconds(Duration::MAX), i32::MAX);
    }
}
