//! Freezing and unfreezing deployments, and ownership.

use mcm_api::{ConditionStatus, MachineDeploymentCondition, MachineDeploymentConditionType};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

#[test]
fn a_freeze_propagates_to_the_deployment_with_the_sets_reason() {
    let d = deployment("d", 2, Some(json!(1))); // upper 5
    let s = owned_set("d-1", 2, "d");
    let plan = run(&[&s], &[&d], &machines_of(&s, 5));
    assert_eq!(plan.evaluations[0].deployment.as_deref(), Some("d"));
    assert_eq!(plan.evaluations[0].thresholds.upper, 5);
    let names: Vec<(ObjectKind, &str)> = plan.writes.iter().map(|w| (w.kind, w.name.as_str())).collect();
    assert_eq!(
        names,
        [
            (ObjectKind::MachineSet, "d-1"),
            (ObjectKind::MachineDeployment, "d")
        ],
        "sets first"
    );
    let w = write(&plan, ObjectKind::MachineDeployment, "d").unwrap();
    assert_eq!(w.after_sets, ["d-1"]);
    assert_eq!(
        w.patches.metadata,
        Some(json!({ "metadata": { "labels": { "freeze": "True" } } }))
    );
    let status = w.patches.status.clone().unwrap();
    assert_eq!(status["metadata"]["resourceVersion"], "9");
    let condition = &status["status"]["conditions"][0];
    assert_eq!(condition["type"], "Frozen");
    assert_eq!(condition["reason"], "OverShootingReplicaCount");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("MachineSet d-1 is 5 >= 5")
    );
    assert!(condition.get("lastUpdateTime").is_some());
    assert_eq!(w.event.as_ref().unwrap().reason, "FrozeMachineDeployment");
}

#[test]
fn a_deployment_out_of_line_is_aligned_with_state_sync() {
    // Its set is frozen (and stays frozen between the thresholds), the deployment is not.
    let d = deployment("d", 2, Some(json!(1)));
    let mut s = owned_set("d-1", 2, "d");
    freeze_label(&mut s.metadata);
    frozen_set_condition(&mut s);
    let settings = Settings {
        safety_up: 2,
        safety_down: 3,
    }; // upper 5, lower 2
    let plan = run_with(&[&s], &[&d], &machines_of(&s, 4), settings);
    let w = write(&plan, ObjectKind::MachineDeployment, "d").unwrap();
    assert_eq!(w.desired.reason, reasons::MACHINE_DEPLOYMENT_STATE_SYNC);
    assert_eq!(
        w.patches.status.as_ref().unwrap()["status"]["conditions"][0]["reason"],
        "MachineDeploymentStateSync"
    );
    assert!(write(&plan, ObjectKind::MachineSet, "d-1").is_none());

    // A frozen deployment none of whose sets is frozen is unfrozen.
    let mut frozen_d = deployment("d", 2, Some(json!(1)));
    freeze_label(&mut frozen_d.metadata);
    let calm = owned_set("d-1", 2, "d");
    let plan = run(&[&calm], &[&frozen_d], &machines_of(&calm, 2));
    let w = write(&plan, ObjectKind::MachineDeployment, "d").unwrap();
    assert_eq!(
        w.patches.metadata,
        Some(json!({ "metadata": { "labels": { "freeze": null } } }))
    );
    assert_eq!(w.desired.reason, reasons::MACHINE_DEPLOYMENT_STATE_SYNC);
    assert_eq!(w.event.as_ref().unwrap().reason, "UnfrozeMachineDeployment");

    // A deployment without sets that carries the label is unfrozen too.
    let plan = run(&[], &[&frozen_d], &[]);
    assert!(write(&plan, ObjectKind::MachineDeployment, "d").is_some());
}

#[test]
fn a_deployment_stays_frozen_while_any_of_its_sets_is() {
    let mut d = deployment("d", 2, Some(json!(1)));
    freeze_label(&mut d.metadata);
    d.status
        .get_or_insert_default()
        .conditions
        .push(MachineDeploymentCondition {
            r#type: MachineDeploymentConditionType::Frozen,
            status: ConditionStatus::True,
            last_update_time: None,
            last_transition_time: None,
            reason: reasons::OVERSHOOTING_REPLICA_COUNT.into(),
            message: "m".into(),
        });
    let mut old = owned_set("d-old", 0, "d");
    freeze_label(&mut old.metadata);
    frozen_set_condition(&mut old);
    let mut new = owned_set("d-new", 2, "d");
    freeze_label(&mut new.metadata);
    frozen_set_condition(&mut new);
    let mut machines = machines_of(&old, 6);
    machines.extend(machines_of(&new, 1));
    // d-new unfreezes (1 <= 4), d-old stays frozen (6 >= 5): the deployment stays frozen, untouched.
    let plan = run(&[&old, &new], &[&d], &machines);
    assert!(write(&plan, ObjectKind::MachineSet, "d-new").is_some());
    assert!(write(&plan, ObjectKind::MachineSet, "d-old").is_none());
    assert!(write(&plan, ObjectKind::MachineDeployment, "d").is_none());
}

#[test]
fn the_unfreeze_annotation_on_a_deployment_unfreezes_it_and_all_its_sets() {
    let mut d = deployment("d", 2, Some(json!(1)));
    freeze_label(&mut d.metadata);
    annotate_unfreeze(&mut d.metadata);
    let mut a = owned_set("d-a", 2, "d");
    freeze_label(&mut a.metadata);
    let mut b = owned_set("d-b", 0, "d");
    freeze_label(&mut b.metadata);
    let mut machines = machines_of(&a, 8);
    machines.extend(machines_of(&b, 8));
    let plan = run(&[&a, &b], &[&d], &machines);
    for name in ["d-a", "d-b"] {
        let w = write(&plan, ObjectKind::MachineSet, name).unwrap();
        assert_eq!(
            w.patches.metadata,
            Some(json!({ "metadata": { "labels": { "freeze": null } } }))
        );
        assert_eq!(w.desired.reason, reasons::UNFREEZE_ANNOTATION);
        assert_eq!(w.event.as_ref().unwrap().reason, "UnfrozeMachineSet");
    }
    let w = write(&plan, ObjectKind::MachineDeployment, "d").unwrap();
    assert_eq!(
        w.patches.metadata,
        Some(json!({ "metadata": {
            "labels": { "freeze": null },
            "annotations": { "safety.machine.sapcloud.io/unfreeze": null }
        } }))
    );
    assert_eq!(w.after_sets, ["d-a", "d-b"]);
}

#[test]
fn ownership_needs_the_controller_reference_and_a_matching_uid() {
    let d = deployment("d", 2, None);
    let mut s = owned_set("s", 1, "d");
    assert!(owning_deployment(&s, [&d]).is_some());
    s.metadata.owner_references.as_mut().unwrap()[0].uid = "stale".into();
    assert!(owning_deployment(&s, [&d]).is_none());
    s.metadata.owner_references.as_mut().unwrap()[0].uid = String::new();
    assert!(owning_deployment(&s, [&d]).is_some());
    s.metadata.owner_references.as_mut().unwrap()[0].controller = None;
    assert!(owning_deployment(&s, [&d]).is_none());
}
