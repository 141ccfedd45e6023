//! The new set kept in line, and the Progressing condition.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mcm_api::{
    ConditionStatus, GoDuration, MachineDeployment, MachineSet, MachineTemplateSpec, NodeTemplateSpec,
    keys::annotations,
};
use pretty_assertions::assert_eq;

use super::*;

fn md_with(template: MachineTemplateSpec, annotations: &[(&str, &str)]) -> MachineDeployment {
    let mut md = MachineDeployment::default();
    md.metadata.name = Some("md".into());
    md.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    md.spec.template = template;
    md
}

fn set_of(template: MachineTemplateSpec, annotations: &[(&str, &str)]) -> MachineSet {
    let mut set = MachineSet::default();
    set.metadata.name = Some("md-abcde".into());
    set.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    set.spec.template = template;
    set
}

#[test]
fn the_new_set_gets_node_template_configuration_and_annotations_without_a_new_set() {
    let mut changed = template("a");
    changed.spec.node_template = Some(NodeTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(BTreeMap::from([("zone".to_owned(), "eu-1".to_owned())])),
            ..ObjectMeta::default()
        }),
        ..NodeTemplateSpec::default()
    });
    changed.spec.configuration.drain_timeout = Some(GoDuration("5m".into()));
    assert!(
        equal_ignore_hash(&changed, &template("a")),
        "no rollout for these"
    );
    let md = md_with(
        changed,
        &[
            ("team", "blue"),
            (annotations::EFFECTIVE_CREATION_TIMEOUT, "30m"),
            (annotations::TRIGGER_DELETION_BY_MCM, "m~2026-11-22T09:00:00Z"),
            ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
        ],
    );
    let set = set_of(template("a"), &[(annotations::REVISION, "2")]);
    let patch = new_set_sync(&md, &set, 2).unwrap();
    assert_eq!(
        patch,
        serde_json::json!({
            "metadata": { "annotations": {
                "team": "blue",
                annotations::EFFECTIVE_CREATION_TIMEOUT: "30m",
            } },
            "spec": { "template": { "spec": {
                "nodeTemplate": { "metadata": { "labels": { "zone": "eu-1" } } },
                "drainTimeout": "5m",
            } } }
        })
    );
}

#[test]
fn a_set_in_line_needs_no_write_and_a_reused_set_gets_the_newest_revision() {
    let md = md_with(template("a"), &[("team", "blue")]);
    let set = set_of(template("a"), &[("team", "blue"), (annotations::REVISION, "3")]);
    assert_eq!(new_set_sync(&md, &set, 3), None);
    assert_eq!(new_set_sync(&md, &set, 2), None, "a revision is never lowered");
    let rolled_back = set_of(
        template("a"),
        &[
            ("team", "blue"),
            (annotations::REVISION, "1"),
            (annotations::PREFER_NO_SCHEDULE, "True"),
            (annotations::EFFECTIVE_CREATION_TIMEOUT, "30m"),
        ],
    );
    assert_eq!(
        new_set_sync(&md, &rolled_back, 4),
        Some(serde_json::json!({ "metadata": { "annotations": {
            annotations::REVISION: "4",
            annotations::PREFER_NO_SCHEDULE: null,
            annotations::EFFECTIVE_CREATION_TIMEOUT: null,
        } } }))
    );
}

fn counts(replicas: i32, updated: i32, ready: i32, available: i32) -> StatusCounts {
    StatusCounts {
        replicas,
        updated_replicas: updated,
        ready_replicas: ready,
        available_replicas: available,
        unavailable_replicas: 0,
    }
}

fn progress_input(
    previous: Option<(ConditionStatus, &str, Option<Timestamp>)>,
    before: StatusCounts,
    after: StatusCounts,
    now: i64,
) -> ProgressInput<'_> {
    ProgressInput {
        previous,
        paused: false,
        phase: RolloutPhase::Waiting,
        new_set: Some("md-abcde"),
        created: false,
        found: false,
        before,
        after,
        deadline_seconds: Some(600),
        now: at(now),
    }
}

#[test]
fn progress_touches_the_condition_and_standing_still_past_the_deadline_exceeds_it() {
    let previous = Some((
        ConditionStatus::True,
        reasons::MACHINE_SET_UPDATED,
        Some(at(1000)),
    ));
    let moved = progressing(&progress_input(
        previous,
        counts(4, 1, 3, 3),
        counts(4, 2, 3, 3),
        1100,
    ))
    .unwrap();
    assert_eq!(
        (moved.status, moved.reason, moved.touch),
        (ConditionStatus::True, reasons::MACHINE_SET_UPDATED, true)
    );
    let still = counts(4, 1, 3, 3);
    assert_eq!(progressing(&progress_input(previous, still, still, 1599)), None);
    let exceeded = progressing(&progress_input(previous, still, still, 1600)).unwrap();
    assert_eq!(
        (exceeded.status, exceeded.reason),
        (ConditionStatus::False, reasons::PROGRESS_DEADLINE_EXCEEDED)
    );
    let mut no_deadline = progress_input(previous, still, still, 100_000);
    no_deadline.deadline_seconds = None;
    assert_eq!(progressing(&no_deadline), None, "no deadline is an infinite one");
    // Progress after the deadline makes it True again.
    let exceeded = Some((
        ConditionStatus::False,
        reasons::PROGRESS_DEADLINE_EXCEEDED,
        Some(at(1000)),
    ));
    assert_eq!(
        progressing(&progress_input(exceeded, still, counts(4, 2, 3, 3), 2000)).map(|c| c.status),
        Some(ConditionStatus::True)
    );
}

#[test]
fn pause_and_resume_are_unknown_and_complete_is_true() {
    let still = counts(4, 4, 4, 4);
    let running = Some((ConditionStatus::True, reasons::MACHINE_SET_UPDATED, Some(at(0))));
    let mut paused = progress_input(running, still, still, 10);
    paused.paused = true;
    let c = progressing(&paused).unwrap();
    assert_eq!(
        (c.status, c.reason),
        (ConditionStatus::Unknown, reasons::DEPLOYMENT_PAUSED)
    );
    let already = Some((ConditionStatus::Unknown, reasons::DEPLOYMENT_PAUSED, Some(at(0))));
    paused.previous = already;
    assert_eq!(progressing(&paused), None, "written once");
    let c = progressing(&progress_input(already, still, still, 20)).unwrap();
    assert_eq!(
        (c.status, c.reason),
        (ConditionStatus::Unknown, reasons::DEPLOYMENT_RESUMED)
    );
    let exceeded = Some((
        ConditionStatus::False,
        reasons::PROGRESS_DEADLINE_EXCEEDED,
        Some(at(0)),
    ));
    paused.previous = exceeded;
    assert_eq!(
        progressing(&paused),
        None,
        "pausing does not hide a stuck rollout"
    );
    let mut complete = progress_input(running, still, still, 30);
    complete.phase = RolloutPhase::Complete;
    let c = progressing(&complete).unwrap();
    assert_eq!(
        (c.status, c.reason, c.touch),
        (ConditionStatus::True, reasons::NEW_MACHINE_SET_AVAILABLE, false)
    );
    let mut created = progress_input(running, still, still, 40);
    created.created = true;
    assert_eq!(
        progressing(&created).unwrap().reason,
        reasons::NEW_MACHINE_SET_CREATED
    );
}

#[test]
fn the_new_set_follows_the_deployments_auto_preserve_max() {
    let mut md = md_with(template("a"), &[("team", "blue")]);
    md.spec.auto_preserve_failed_machine_max = Some(2);
    let set = set_of(template("a"), &[("team", "blue"), (annotations::REVISION, "3")]);
    assert_eq!(
        new_set_sync(&md, &set, 3),
        Some(serde_json::json!({ "spec": { "autoPreserveFailedMachineMax": 2 } }))
    );
    let mut in_line = set;
    in_line.spec.auto_preserve_failed_machine_max = Some(2);
    assert_eq!(new_set_sync(&md, &in_line, 3), None);
}
