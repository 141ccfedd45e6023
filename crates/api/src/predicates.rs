//! Small predicates and readers of objects, one home each, so that every controller asks "is it being deleted?",
//! "who controls it?", "which node?" or "preserved until when?" the same way.
//!
//! [`MetaExt`] holds what applies to any object (it reads only `metadata`); the inherent methods of [`Machine`] hold
//! what only a machine has (its node label, phase, preservation and deletion priority).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Node, Pod, Secret},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    jiff::Timestamp,
};

use crate::{
    Machine, MachineClass, MachineDeployment, MachinePhase, MachineSet,
    keys::{annotations, labels},
};

/// Readers of an object's metadata: implemented for `ObjectMeta` itself and for the objects the controllers read,
/// so that `machine.is_deleting()` and `meta.is_deleting()` are the same code.
pub trait MetaExt {
    /// The object's metadata.
    fn object_meta(&self) -> &ObjectMeta;

    /// Whether the object is being deleted (`metadata.deletionTimestamp` is set).
    fn is_deleting(&self) -> bool {
        self.object_meta().deletion_timestamp.is_some()
    }

    /// Whether the object carries `finalizer`.
    fn has_finalizer(&self, finalizer: &str) -> bool {
        self.object_meta()
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == finalizer)
    }

    /// The owner references with `controller: true`, in order (the API server does not enforce that there is only
    /// one, so callers that must not assume it iterate these).
    fn controller_refs(&self) -> impl Iterator<Item = &OwnerReference> {
        self.object_meta()
            .owner_references
            .iter()
            .flatten()
            .filter(|r| r.controller == Some(true))
    }

    /// The controller reference: the first owner reference with `controller: true`.
    fn controller_ref(&self) -> Option<&OwnerReference> {
        self.controller_refs().next()
    }

    /// The first controller reference of kind `kind` (e.g. `<MachineSet as k8s_openapi::Resource>::KIND`).
    fn controller_ref_of_kind(&self, kind: &str) -> Option<&OwnerReference> {
        self.controller_refs().find(|r| r.kind == kind)
    }

    /// Whether a controller reference names the owner with this uid.
    fn is_controlled_by(&self, uid: &str) -> bool {
        self.controller_refs().any(|r| r.uid == uid)
    }

    /// The value of label `key`, if present.
    fn label(&self, key: &str) -> Option<&str> {
        value_at(self.object_meta().labels.as_ref(), key)
    }

    /// The value of annotation `key`, if present.
    fn annotation(&self, key: &str) -> Option<&str> {
        value_at(self.object_meta().annotations.as_ref(), key)
    }
}

/// The value of `key` in an optional string map (labels or annotations).
fn value_at<'a>(map: Option<&'a BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    map.and_then(|m| m.get(key)).map(String::as_str)
}

impl MetaExt for ObjectMeta {
    fn object_meta(&self) -> &ObjectMeta {
        self
    }
}

/// Implements [`MetaExt`] for objects whose `metadata` field is an `ObjectMeta`.
macro_rules! meta_ext {
    ($($ty:ty),* $(,)?) => {
        $(
            impl MetaExt for $ty {
                fn object_meta(&self) -> &ObjectMeta {
                    &self.metadata
                }
            }
        )*
    };
}

meta_ext!(
    Machine,
    MachineSet,
    MachineDeployment,
    MachineClass,
    Node,
    Pod,
    Secret
);

impl Machine {
    /// The deletion priority of a machine without a readable `machinepriority.machine.sapcloud.io` annotation
    /// ([`annotations::MACHINE_PRIORITY_DEFAULT`] as a number).
    pub const DEFAULT_PRIORITY: i64 = 3;

    /// The name of the machine's node: its `node` label, `None` when absent or empty.
    pub fn node_name(&self) -> Option<&str> {
        self.label(labels::NODE).filter(|n| !n.is_empty())
    }

    /// When the machine's preservation ends (`status.currentStatus.preserveExpiryTime`).
    pub fn preserve_expiry(&self) -> Option<Timestamp> {
        self.status
            .as_ref()
            .and_then(|s| s.current_status.preserve_expiry_time.as_ref())
            .map(|t| t.0)
    }

    /// Whether the machine is preserved at `now`: its `preserveExpiryTime` lies after `now` (reference §3.8).
    pub fn is_preserved(&self, now: Timestamp) -> bool {
        self.preserve_expiry().is_some_and(|t| t > now)
    }

    /// The deletion priority: `machinepriority.machine.sapcloud.io` as an integer, [`Self::DEFAULT_PRIORITY`] when
    /// absent or not an integer (as the reference, which logs and uses 3); lower goes first.
    pub fn priority(&self) -> i64 {
        self.annotation(annotations::MACHINE_PRIORITY)
            .and_then(|v| v.parse().ok())
            .unwrap_or(Self::DEFAULT_PRIORITY)
    }

    /// Being deleted or in phase Terminating: the machine is on its way out and no longer counts as one of its set's
    /// machines. A Failed machine still counts (the set replaces it by deleting it); see
    /// [`Self::is_failed_or_terminating`].
    pub fn is_terminating(&self) -> bool {
        self.is_deleting() || self.phase() == Some(MachinePhase::Terminating)
    }

    /// Being deleted, or in phase Failed or Terminating: the machine is going away or about to be replaced, so
    /// remediation counts it as a replacement in progress and the autoscaler's handshake skips it.
    pub fn is_failed_or_terminating(&self) -> bool {
        self.is_deleting()
            || matches!(
                self.phase(),
                Some(MachinePhase::Failed | MachinePhase::Terminating)
            )
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::{CurrentStatus, MachineStatus};

    fn owner(kind: &str, uid: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            kind: kind.into(),
            name: format!("{kind}-{uid}"),
            uid: uid.into(),
            controller,
            ..OwnerReference::default()
        }
    }

    fn machine_in(phase: Option<MachinePhase>, deleting: bool) -> Machine {
        let mut m = Machine::default();
        m.metadata.deletion_timestamp = deleting.then_some(Time(Timestamp::UNIX_EPOCH));
        m.status = Some(MachineStatus {
            current_status: CurrentStatus {
                phase,
                ..CurrentStatus::default()
            },
            ..MachineStatus::default()
        });
        m
    }

    #[test]
    fn controller_refs_skip_plain_owners_and_keep_order() {
        let mut meta = ObjectMeta::default();
        assert_eq!(meta.controller_ref(), None);
        meta.owner_references = Some(vec![
            owner("MachineSet", "plain", None),
            owner("MachineSet", "off", Some(false)),
            owner("MachineDeployment", "d", Some(true)),
            owner("MachineSet", "s", Some(true)),
        ]);
        assert_eq!(meta.controller_ref().map(|r| r.uid.as_str()), Some("d"));
        assert_eq!(
            meta.controller_ref_of_kind("MachineSet").map(|r| r.uid.as_str()),
            Some("s")
        );
        assert_eq!(meta.controller_ref_of_kind("DaemonSet"), None);
        assert!(meta.is_controlled_by("s"));
        assert!(!meta.is_controlled_by("plain"));
    }

    #[test]
    fn finalizers_labels_and_annotations_are_read_by_key() {
        let mut machine = Machine::default();
        assert!(!machine.has_finalizer("a/b"));
        assert_eq!(machine.label(labels::NODE), None);
        machine.metadata.finalizers = Some(vec!["x/y".into(), "a/b".into()]);
        machine.metadata.labels = Some(BTreeMap::from([(labels::NODE.to_owned(), "n1".to_owned())]));
        machine.metadata.annotations = Some(BTreeMap::from([("k".to_owned(), "v".to_owned())]));
        assert!(machine.has_finalizer("a/b"));
        assert!(!machine.has_finalizer("a"));
        assert_eq!(machine.node_name(), Some("n1"));
        assert_eq!(machine.annotation("k"), Some("v"));
        assert_eq!(machine.annotation("other"), None);
    }

    #[test]
    fn an_empty_node_label_names_no_node() {
        let mut machine = Machine::default();
        machine.metadata.labels = Some(BTreeMap::from([(labels::NODE.to_owned(), String::new())]));
        assert_eq!(machine.label(labels::NODE), Some(""));
        assert_eq!(machine.node_name(), None);
    }

    #[test]
    fn priority_defaults_to_three_when_absent_or_unreadable() {
        let mut machine = Machine::default();
        assert_eq!(machine.priority(), 3);
        for (value, want) in [("1", 1), ("-2", -2), ("one", 3), ("", 3)] {
            machine.metadata.annotations = Some(BTreeMap::from([(
                annotations::MACHINE_PRIORITY.to_owned(),
                value.to_owned(),
            )]));
            assert_eq!(machine.priority(), want, "{value:?}");
        }
        assert_eq!(
            annotations::MACHINE_PRIORITY_DEFAULT.parse::<i64>().ok(),
            Some(Machine::DEFAULT_PRIORITY)
        );
    }

    #[test]
    fn preservation_holds_only_before_the_expiry() {
        let now = Timestamp::from_second(1_000).unwrap();
        let mut machine = machine_in(Some(MachinePhase::Failed), false);
        assert!(!machine.is_preserved(now));
        let status = machine.status.as_mut().unwrap();
        status.current_status.preserve_expiry_time = Some(Time(Timestamp::from_second(1_001).unwrap()));
        assert!(machine.is_preserved(now));
        assert!(!machine.is_preserved(Timestamp::from_second(1_001).unwrap()));
    }

    #[test]
    fn a_failed_machine_is_failed_or_terminating_but_not_terminating() {
        let cases = [
            (None, false, false, false),
            (Some(MachinePhase::Running), false, false, false),
            (Some(MachinePhase::Failed), false, false, true),
            (Some(MachinePhase::Terminating), false, true, true),
            (Some(MachinePhase::Running), true, true, true),
        ];
        for (phase, deleting, terminating, failed_or_terminating) in cases {
            let machine = machine_in(phase, deleting);
            assert_eq!(machine.is_deleting(), deleting);
            assert_eq!(
                machine.is_terminating(),
                terminating,
                "{phase:?} deleting={deleting}"
            );
            assert_eq!(
                machine.is_failed_or_terminating(),
                failed_or_terminating,
                "{phase:?} deleting={deleting}"
            );
        }
    }
}
