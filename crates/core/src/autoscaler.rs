//! The deployment controller's side of the cluster-autoscaler, decided purely (reference §6.3 and §6.5):
//!
//! - the **trigger-deletion handshake**: the autoscaler writes `node.machine.sapcloud.io/trigger-deletion-by-mcm =
//!   "m1~<RFC3339>,m2~<RFC3339>"` on a MachineDeployment and lowers its replicas in one update; [`trigger_deletion`]
//!   says how to rewrite that annotation (legacy entries without a time get the deployment's
//!   `last-deployment-replica-change-by-scaler-time`; malformed, unknown, Failed and Terminating entries are dropped)
//!   and which machines to stamp `machinepriority.machine.sapcloud.io=1` plus `marked-for-deletion-time`. The
//!   MachineSet controller then deletes exactly those (`machineset::marked_by_autoscaler`).
//! - the **node marks of a rollout** ([`node_patch`]): while old machines exist, every node of the deployment carries
//!   `cluster-autoscaler.kubernetes.io/scale-down-disabled=true` with our marker `…-by-mcm=true` (so the autoscaler
//!   does not remove nodes the rollout counts on), and the nodes of old sets carry the taint
//!   `deployment.machine.sapcloud.io/prefer-no-schedule=True:PreferNoSchedule` (so new pods land on new machines).
//!   When the rollout completes the annotations go again, but only where our marker is and the machine is not
//!   preserved; the new set's nodes never keep the taint (a rollback makes an old set new).

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Taint};
use mcm_api::{Machine, MachineDeployment, MetaExt, keys::annotations};
use serde_json::{Value, json};

/// The value the autoscaler annotations carry.
const TRUE: &str = "true";

/// The taint value and effect of [`annotations::PREFER_NO_SCHEDULE`].
const TAINT_VALUE: &str = "True";
const TAINT_EFFECT: &str = "PreferNoSchedule";

// ---------------------------------------------------------------------------------------------------------------------
// The trigger-deletion handshake
// ---------------------------------------------------------------------------------------------------------------------

/// What to do with a deployment's trigger-deletion annotation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TriggerPlan {
    /// Annotations to write on the deployment (a `null` removes one): the rewritten trigger annotation and, when a
    /// legacy entry needed it, `last-deployment-replica-change-by-scaler-time`. Empty when nothing changes.
    pub deployment_annotations: serde_json::Map<String, Value>,
    /// Machines to stamp, each with its merge patch (priority `1`, and the marked time unless it has one).
    pub mark: Vec<(String, Value)>,
}

/// The trigger-deletion handshake for `deployment` at `now` (reference `adjustingMachineDeploymentDeletionAnnotations`
/// and `computeMachineTriggerDeletionData` in one pass). `machine` finds a machine **of this deployment** by name:
/// unlike the reference, which looks a name up in the whole namespace, a name that belongs to another deployment is
/// dropped, so a wrong annotation can never delete someone else's machine. `None` when the annotation is absent or
/// empty.
pub fn trigger_deletion<'a>(
    deployment: &MachineDeployment,
    machine: impl Fn(&str) -> Option<&'a Machine>,
    now: Timestamp,
) -> Option<TriggerPlan> {
    let value = deployment
        .annotation(annotations::TRIGGER_DELETION_BY_MCM)
        .filter(|v| !v.trim().is_empty())?;
    let mut plan = TriggerPlan::default();
    let existing = deployment
        .annotation(annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME)
        .filter(|v| !v.is_empty());
    let last_change = existing.map_or_else(|| now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(), str::to_owned);
    // Only a legacy entry needs the time; the reference writes it whenever the annotation is set.
    if existing.is_none() && value.split(',').any(|e| !e.contains('~')) {
        plan.deployment_annotations.insert(
            annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME.to_owned(),
            json!(last_change),
        );
    }
    let mut kept = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, time) = match entry.split('~').collect::<Vec<_>>()[..] {
            [name] => (name, last_change.as_str()),
            [name, time] => (name, time),
            _ => continue,
        };
        if name.is_empty() || time.parse::<Timestamp>().is_err() {
            continue;
        }
        let Some(found) = machine(name) else { continue };
        if found.is_failed_or_terminating() {
            continue;
        }
        kept.push(format!("{name}~{time}"));
        let has_time = found
            .annotation(annotations::MARKED_FOR_DELETION_TIME)
            .is_some_and(|t| !t.is_empty());
        if found.annotation(annotations::MACHINE_PRIORITY) == Some("1") && has_time {
            continue;
        }
        let mut stamps = serde_json::Map::new();
        stamps.insert(annotations::MACHINE_PRIORITY.to_owned(), json!("1"));
        if !has_time {
            stamps.insert(annotations::MARKED_FOR_DELETION_TIME.to_owned(), json!(time));
        }
        plan.mark
            .push((name.to_owned(), json!({ "metadata": { "annotations": stamps } })));
    }
    let rewritten = kept.join(",");
    if rewritten != value {
        plan.deployment_annotations.insert(
            annotations::TRIGGER_DELETION_BY_MCM.to_owned(),
            if rewritten.is_empty() {
                Value::Null
            } else {
                json!(rewritten)
            },
        );
    }
    Some(plan)
}

// ---------------------------------------------------------------------------------------------------------------------
// Node marks during a rollout
// ---------------------------------------------------------------------------------------------------------------------

/// What a node of the deployment should carry now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeMarks {
    /// `Some(true)`: add the scale-down-disabled annotations (with our marker); `Some(false)`: remove them if our
    /// marker is there; `None`: leave them.
    pub scale_down_disabled: Option<bool>,
    /// `Some(true)`: carry the PreferNoSchedule taint; `Some(false)`: not; `None`: leave it.
    pub prefer_no_schedule: Option<bool>,
}

/// Where a node stands in its deployment's rollout.
#[allow(clippy::struct_excessive_bools)] // four independent facts, named at the call site
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeSituation {
    /// Some old set still has replicas or machines.
    pub rolling_out: bool,
    /// The node's machine belongs to an old set.
    pub old_machine: bool,
    /// `--autoscaler-scaledown-annotation-during-rollout`.
    pub annotate: bool,
    /// The machine is preserved: its node keeps the annotations, which preservation owns.
    pub preserved: bool,
}

/// The marks a node should carry in its `situation`.
pub fn node_marks(situation: NodeSituation) -> NodeMarks {
    NodeMarks {
        scale_down_disabled: if situation.rolling_out {
            situation.annotate.then_some(true)
        } else if situation.preserved {
            None
        } else {
            Some(false)
        },
        prefer_no_schedule: Some(situation.rolling_out && situation.old_machine),
    }
}

fn has_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == annotations::PREFER_NO_SCHEDULE))
}

/// The merge patch that gives `node` its `marks`, or `None` when it already has them. A patch that touches the
/// taints carries the whole list and the node's resourceVersion, so that a concurrent change of the taints (the
/// machine controller's node sync) makes it fail with a conflict instead of being overwritten.
pub fn node_patch(node: &Node, marks: NodeMarks) -> Option<Value> {
    let disabled = node.annotation(annotations::SCALE_DOWN_DISABLED);
    let ours = node.annotation(annotations::SCALE_DOWN_DISABLED_BY_MCM).is_some();
    let mut metadata = serde_json::Map::new();
    match marks.scale_down_disabled {
        // Someone else disabled scale-down: not ours to mark, nor to undo later.
        Some(true) if disabled == Some(TRUE) && !ours => {}
        Some(true) if disabled != Some(TRUE) || !ours => {
            metadata.insert(
                "annotations".into(),
                json!({
                    annotations::SCALE_DOWN_DISABLED: TRUE,
                    annotations::SCALE_DOWN_DISABLED_BY_MCM: TRUE,
                }),
            );
        }
        Some(false) if ours => {
            metadata.insert(
                "annotations".into(),
                json!({
                    annotations::SCALE_DOWN_DISABLED: null,
                    annotations::SCALE_DOWN_DISABLED_BY_MCM: null,
                }),
            );
        }
        _ => {}
    }
    let mut patch = serde_json::Map::new();
    if let Some(want) = marks.prefer_no_schedule
        && want != has_taint(node)
    {
        let mut taints: Vec<Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        if want {
            taints.push(Taint {
                key: annotations::PREFER_NO_SCHEDULE.to_owned(),
                value: Some(TAINT_VALUE.to_owned()),
                effect: TAINT_EFFECT.to_owned(),
                time_added: None,
            });
        } else {
            taints.retain(|t| t.key != annotations::PREFER_NO_SCHEDULE);
        }
        patch.insert("spec".into(), json!({ "taints": taints }));
        if let Some(version) = &node.metadata.resource_version {
            metadata.insert("resourceVersion".into(), json!(version));
        }
    }
    if !metadata.is_empty() {
        patch.insert("metadata".into(), Value::Object(metadata));
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use mcm_api::MachinePhase;

    use super::*;

    fn deployment(annotations: &[(&str, &str)]) -> MachineDeployment {
        let mut d = MachineDeployment::default();
        d.metadata.name = Some("md".into());
        d.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        d
    }

    fn machine(name: &str, phase: MachinePhase) -> Machine {
        mcm_api::builders::MachineBuilder::new(name).phase(phase).build()
    }

    fn now() -> Timestamp {
        "2026-11-22T10:00:00Z".parse().unwrap()
    }

    #[test]
    fn no_annotation_means_nothing_to_do() {
        assert_eq!(trigger_deletion(&deployment(&[]), |_| None, now()), None);
        let empty = deployment(&[(annotations::TRIGGER_DELETION_BY_MCM, "")]);
        assert_eq!(trigger_deletion(&empty, |_| None, now()), None);
    }

    #[test]
    fn listed_machines_are_stamped_priority_one_with_their_marked_time() {
        let a = machine("a", MachinePhase::Running);
        let b = machine("b", MachinePhase::Running);
        let d = deployment(&[(
            annotations::TRIGGER_DELETION_BY_MCM,
            "a~2026-11-22T09:00:00Z,b~2026-11-22T09:30:00Z",
        )]);
        let plan = trigger_deletion(
            &d,
            |n| match n {
                "a" => Some(&a),
                "b" => Some(&b),
                _ => None,
            },
            now(),
        )
        .unwrap();
        assert!(
            plan.deployment_annotations.is_empty(),
            "the annotation is kept as it is"
        );
        assert_eq!(
            plan.mark,
            vec![
                (
                    "a".to_owned(),
                    json!({ "metadata": { "annotations": {
                        annotations::MACHINE_PRIORITY: "1",
                        annotations::MARKED_FOR_DELETION_TIME: "2026-11-22T09:00:00Z",
                    } } })
                ),
                (
                    "b".to_owned(),
                    json!({ "metadata": { "annotations": {
                        annotations::MACHINE_PRIORITY: "1",
                        annotations::MARKED_FOR_DELETION_TIME: "2026-11-22T09:30:00Z",
                    } } })
                ),
            ]
        );
    }

    #[test]
    fn malformed_unknown_failed_and_terminating_entries_are_dropped_from_the_annotation() {
        let running = machine("ok", MachinePhase::Running);
        let failed = machine("failed", MachinePhase::Failed);
        let mut deleting = machine("deleting", MachinePhase::Running);
        deleting.metadata.deletion_timestamp = Some(Time(now()));
        let d = deployment(&[(
            annotations::TRIGGER_DELETION_BY_MCM,
            "ok~2026-11-22T09:00:00Z,bad~yesterday,x~y~z,gone~2026-11-22T09:00:00Z,failed~2026-11-22T09:00:00Z,\
             deleting~2026-11-22T09:00:00Z",
        )]);
        let plan = trigger_deletion(
            &d,
            |n| match n {
                "ok" => Some(&running),
                "failed" => Some(&failed),
                "deleting" => Some(&deleting),
                _ => None,
            },
            now(),
        )
        .unwrap();
        assert_eq!(
            plan.deployment_annotations
                .get(annotations::TRIGGER_DELETION_BY_MCM),
            Some(&json!("ok~2026-11-22T09:00:00Z"))
        );
        assert_eq!(plan.mark.len(), 1);
        assert_eq!(plan.mark[0].0, "ok");
    }

    #[test]
    fn when_nothing_valid_remains_the_annotation_is_removed() {
        let d = deployment(&[(annotations::TRIGGER_DELETION_BY_MCM, "gone~2026-11-22T09:00:00Z")]);
        let plan = trigger_deletion(&d, |_| None, now()).unwrap();
        assert_eq!(
            plan.deployment_annotations
                .get(annotations::TRIGGER_DELETION_BY_MCM),
            Some(&Value::Null)
        );
        assert!(plan.mark.is_empty());
    }

    #[test]
    fn a_legacy_entry_takes_the_scaler_time_and_stamps_it_when_absent() {
        let a = machine("a", MachinePhase::Running);
        let with_time = deployment(&[
            (annotations::TRIGGER_DELETION_BY_MCM, "a"),
            (
                annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME,
                "2026-11-22T08:00:00Z",
            ),
        ]);
        let plan = trigger_deletion(&with_time, |_| Some(&a), now()).unwrap();
        assert_eq!(
            plan.deployment_annotations
                .get(annotations::TRIGGER_DELETION_BY_MCM),
            Some(&json!("a~2026-11-22T08:00:00Z"))
        );
        assert!(
            !plan
                .deployment_annotations
                .contains_key(annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME)
        );

        let without = deployment(&[(annotations::TRIGGER_DELETION_BY_MCM, "a")]);
        let plan = trigger_deletion(&without, |_| Some(&a), now()).unwrap();
        assert_eq!(
            plan.deployment_annotations
                .get(annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME),
            Some(&json!("2026-11-22T10:00:00Z"))
        );
        assert_eq!(
            plan.mark[0].1["metadata"]["annotations"][annotations::MARKED_FOR_DELETION_TIME],
            json!("2026-11-22T10:00:00Z")
        );
    }

    #[test]
    fn an_already_stamped_machine_is_not_written_again_and_keeps_its_first_time() {
        let mut stamped = machine("a", MachinePhase::Running);
        stamped.metadata.annotations = Some(BTreeMap::from([
            (annotations::MACHINE_PRIORITY.to_owned(), "1".to_owned()),
            (
                annotations::MARKED_FOR_DELETION_TIME.to_owned(),
                "2026-11-22T07:00:00Z".to_owned(),
            ),
        ]));
        let d = deployment(&[(annotations::TRIGGER_DELETION_BY_MCM, "a~2026-11-22T09:00:00Z")]);
        let plan = trigger_deletion(&d, |_| Some(&stamped), now()).unwrap();
        assert!(plan.mark.is_empty());

        let mut half = machine("a", MachinePhase::Running);
        half.metadata.annotations = Some(BTreeMap::from([(
            annotations::MARKED_FOR_DELETION_TIME.to_owned(),
            "2026-11-22T07:00:00Z".to_owned(),
        )]));
        let plan = trigger_deletion(&d, |_| Some(&half), now()).unwrap();
        assert_eq!(
            plan.mark[0].1,
            json!({ "metadata": { "annotations": { annotations::MACHINE_PRIORITY: "1" } } })
        );
    }

    fn node(annotations: &[(&str, &str)], taints: &[&str]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n".into());
        n.metadata.resource_version = Some("7".into());
        n.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(
                taints
                    .iter()
                    .map(|k| Taint {
                        key: (*k).to_owned(),
                        value: Some("True".into()),
                        effect: "PreferNoSchedule".into(),
                        time_added: None,
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        n
    }

    #[test]
    fn during_a_rollout_every_node_is_annotated_and_old_nodes_are_tainted() {
        let marks = node_marks(NodeSituation {
            rolling_out: true,
            old_machine: true,
            annotate: true,
            preserved: false,
        });
        let patch = node_patch(&node(&[], &["other"]), marks).unwrap();
        assert_eq!(
            patch,
            json!({
                "metadata": {
                    "annotations": {
                        annotations::SCALE_DOWN_DISABLED: "true",
                        annotations::SCALE_DOWN_DISABLED_BY_MCM: "true",
                    },
                    "resourceVersion": "7",
                },
                "spec": { "taints": [
                    { "key": "other", "value": "True", "effect": "PreferNoSchedule" },
                    { "key": annotations::PREFER_NO_SCHEDULE, "value": "True", "effect": "PreferNoSchedule" },
                ] }
            })
        );
        // A new machine's node: annotated, not tainted.
        let patch = node_patch(
            &node(&[], &[]),
            node_marks(NodeSituation {
                rolling_out: true,
                old_machine: false,
                annotate: true,
                preserved: false,
            }),
        )
        .unwrap();
        assert!(patch.get("spec").is_none());
        // Marked already: nothing to write.
        let done = node(
            &[
                (annotations::SCALE_DOWN_DISABLED, "true"),
                (annotations::SCALE_DOWN_DISABLED_BY_MCM, "true"),
            ],
            &[annotations::PREFER_NO_SCHEDULE],
        );
        assert_eq!(node_patch(&done, marks), None);
    }

    #[test]
    fn with_the_flag_off_no_annotation_is_added_but_the_taint_still_is() {
        let patch = node_patch(
            &node(&[], &[]),
            node_marks(NodeSituation {
                rolling_out: true,
                old_machine: true,
                annotate: false,
                preserved: false,
            }),
        )
        .unwrap();
        assert!(patch["metadata"].get("annotations").is_none());
        assert!(patch.get("spec").is_some());
    }

    #[test]
    fn a_node_whose_scale_down_someone_else_disabled_is_left_alone() {
        let theirs = node(&[(annotations::SCALE_DOWN_DISABLED, "true")], &[]);
        assert_eq!(
            node_patch(
                &theirs,
                node_marks(NodeSituation {
                    rolling_out: true,
                    old_machine: false,
                    annotate: true,
                    preserved: false
                })
            ),
            None
        );
        assert_eq!(
            node_patch(
                &theirs,
                node_marks(NodeSituation {
                    rolling_out: false,
                    old_machine: false,
                    annotate: true,
                    preserved: false
                })
            ),
            None
        );
    }

    #[test]
    fn after_the_rollout_our_marks_go_unless_the_machine_is_preserved() {
        let marked = node(
            &[
                (annotations::SCALE_DOWN_DISABLED, "true"),
                (annotations::SCALE_DOWN_DISABLED_BY_MCM, "true"),
            ],
            &[annotations::PREFER_NO_SCHEDULE],
        );
        let patch = node_patch(
            &marked,
            node_marks(NodeSituation {
                rolling_out: false,
                old_machine: false,
                annotate: true,
                preserved: false,
            }),
        )
        .unwrap();
        assert_eq!(
            patch,
            json!({
                "metadata": {
                    "annotations": {
                        annotations::SCALE_DOWN_DISABLED: null,
                        annotations::SCALE_DOWN_DISABLED_BY_MCM: null,
                    },
                    "resourceVersion": "7",
                },
                "spec": { "taints": [] }
            })
        );
        let patch = node_patch(
            &marked,
            node_marks(NodeSituation {
                rolling_out: false,
                old_machine: false,
                annotate: true,
                preserved: true,
            }),
        )
        .unwrap();
        assert!(
            patch["metadata"].get("annotations").is_none(),
            "a preserved node keeps them"
        );
    }
}
