//! Counting machines and the thresholds of sets and deployments.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mcm_api::MachineDeployment;
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

#[test]
fn counting_needs_the_template_labels_and_the_controller_reference_by_name() {
    let s = set("a", 1);
    let base = machines_of(&s, 1).remove(0);
    let cases: Vec<(&str, Change, bool)> = vec![
        ("as made by the set", Box::new(|_| {}), true),
        (
            "being deleted still counts",
            Box::new(|m| {
                m.metadata.deletion_timestamp = Some(Time(at(1)));
            }),
            true,
        ),
        (
            "an extra label does not matter",
            Box::new(|m| {
                m.metadata.labels.as_mut().unwrap().insert("x".into(), "y".into());
            }),
            true,
        ),
        (
            "the uid is not compared (reference: by name)",
            Box::new(|m| m.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into()),
            true,
        ),
        (
            "a template label missing",
            Box::new(|m| m.metadata.labels = None),
            false,
        ),
        (
            "a template label with another value",
            Box::new(|m| {
                m.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert("pool".into(), "b".into());
            }),
            false,
        ),
        (
            "another set's",
            Box::new(|m| m.metadata.owner_references.as_mut().unwrap()[0].name = "b".into()),
            false,
        ),
        (
            "a reference that is not the controller",
            Box::new(|m| m.metadata.owner_references.as_mut().unwrap()[0].controller = Some(false)),
            false,
        ),
        (
            "a controller of another kind with the set's name",
            Box::new(|m| {
                m.metadata.owner_references.as_mut().unwrap()[0].kind = MachineDeployment::KIND.into();
            }),
            false,
        ),
        (
            "an orphan",
            Box::new(|m| m.metadata.owner_references = None),
            false,
        ),
        (
            "another namespace",
            Box::new(|m| m.metadata.namespace = Some("other".into())),
            false,
        ),
    ];
    for (what, change, expected) in cases {
        let mut m = base.clone();
        change(&mut m);
        assert_eq!(counts_for(&s, &m), expected, "{what}");
    }
}

// --- thresholds ---------------------------------------------------------------------------------------------

#[test]
fn thresholds_of_a_set_alone_and_of_a_deployment_set() {
    let settings = Settings::default();
    let cases: Vec<(&str, Option<MachineDeployment>, i32, i64, bool)> = vec![
        ("alone: 2*3+2", None, 3, 8, false),
        ("alone with 0 replicas", None, 0, 2, false),
        ("alone with negative replicas", None, -4, 2, false),
        (
            "deployment, maxSurge 1: 5+1+2",
            Some(deployment("d", 5, Some(json!(1)))),
            1,
            8,
            false,
        ),
        (
            "deployment, maxSurge 3",
            Some(deployment("d", 5, Some(json!(3)))),
            1,
            10,
            false,
        ),
        (
            "deployment, maxSurge 25% of 5 rounds up to 2",
            Some(deployment("d", 5, Some(json!("25%")))),
            1,
            9,
            false,
        ),
        (
            "deployment, maxSurge 0",
            Some(deployment("d", 5, Some(json!(0)))),
            1,
            7,
            false,
        ),
        (
            "deployment without a strategy: surge 1",
            Some(deployment("d", 5, None)),
            1,
            8,
            false,
        ),
        (
            "deployment, unusable maxSurge: surge 1, reported",
            Some(deployment("d", 5, Some(json!("x%")))),
            1,
            8,
            true,
        ),
    ];
    for (what, d, replicas, upper, problem) in cases {
        let (t, p) = thresholds(&set("a", replicas), d.as_ref(), settings);
        assert_eq!(
            (t.upper, t.lower, p.is_some()),
            (upper, upper - 1, problem),
            "{what}"
        );
    }
}

#[test]
fn in_place_max_surge_is_used_without_rolling_update() {
    let d: MachineDeployment = serde_json::from_value(json!({
        "metadata": { "name": "d" },
        "spec": { "replicas": 4, "strategy": { "type": "InPlaceUpdate", "inPlaceUpdate": { "maxSurge": 3 } } }
    }))
    .unwrap();
    assert_eq!(surge(&d), Ok(3));
}

#[test]
fn safety_settings_move_the_thresholds_and_safety_down_zero_acts_as_one() {
    let s = set("a", 2);
    let (t, _) = thresholds(
        &s,
        None,
        Settings {
            safety_up: 5,
            safety_down: 3,
        },
    );
    assert_eq!(t, Thresholds { upper: 9, lower: 6 });
    let (t, _) = thresholds(
        &s,
        None,
        Settings {
            safety_up: 0,
            safety_down: 0,
        },
    );
    assert_eq!(t, Thresholds { upper: 4, lower: 3 });
}
