//! The machine to create and template propagation.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use mcm_api::{
    GoDuration, MachinePhase, MetaExt, NodeTemplateSpec,
    keys::{annotations, finalizers},
};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

#[test]
fn the_machine_to_create_needs_no_second_write() {
    let mut set = set(1);
    annotate_set(&mut set, annotations::EFFECTIVE_CREATION_TIMEOUT, "30m");
    let template_meta = set.spec.template.metadata.as_mut().unwrap();
    template_meta.annotations = Some(BTreeMap::from([("team".into(), "a".into())]));
    template_meta.finalizers = Some(vec!["example.com/keep".into()]);
    set.spec.template.spec.provider_id = "aws:///i-123".into();
    set.spec.template.spec.configuration.drain_timeout = Some(GoDuration::new("1h"));
    let m = machine_to_create(&set);
    assert_eq!(m.metadata.generate_name.as_deref(), Some("ms-"));
    assert_eq!(m.metadata.name, None);
    assert_eq!(m.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(m.metadata.labels, Some(app_labels()));
    assert_eq!(
        m.metadata.annotations,
        Some(BTreeMap::from([
            (annotations::EFFECTIVE_CREATION_TIMEOUT.into(), "30m".into()),
            ("team".into(), "a".into()),
        ]))
    );
    assert_eq!(
        m.metadata.finalizers,
        Some(vec![
            "example.com/keep".into(),
            finalizers::MACHINE_CONTROLLER_MANAGER.into()
        ])
    );
    assert_eq!(m.metadata.owner_references, Some(vec![owner_reference(&set)]));
    assert_eq!(m.spec.provider_id, "");
    assert_eq!(m.spec.class.name, "small");
    assert_eq!(m.spec.configuration.drain_timeout, Some(GoDuration::new("1h")));
    // The set owns what it creates, and the new machine needs no propagation.
    let mut stored = m.clone();
    stored.metadata.name = Some("ms-abcde".into());
    assert_eq!(claim(&set, &stored), Claim::Owned);
    assert_eq!(propagation_patch(&set, &stored), None);
}

#[test]
fn propagation_patches_node_template_configuration_class_kind_and_the_timeout_annotation() {
    let mut set = set(1);
    let mut m = running("a");
    assert_eq!(propagation_patch(&set, &m), None);

    set.spec.template.spec.node_template = Some(NodeTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(BTreeMap::from([("pool".into(), "b".into())])),
            ..ObjectMeta::default()
        }),
        spec: None,
    });
    set.spec.template.spec.configuration.health_timeout = Some(GoDuration::new("5m"));
    annotate_set(&mut set, annotations::EFFECTIVE_CREATION_TIMEOUT, "40m");
    m.spec.node_template = Some(NodeTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(BTreeMap::from([
                ("pool".into(), "a".into()),
                ("old".into(), "x".into()),
            ])),
            ..ObjectMeta::default()
        }),
        spec: None,
    });
    m.spec.configuration.drain_timeout = Some(GoDuration::new("2h"));
    annotate(&mut m, "unrelated", "kept");
    let patch = propagation_patch(&set, &m).unwrap();
    assert_eq!(
        patch,
        json!({
            "metadata": { "annotations": { annotations::EFFECTIVE_CREATION_TIMEOUT: "40m" } },
            "spec": {
                "nodeTemplate": { "metadata": { "labels": { "pool": "b", "old": null } } },
                "healthTimeout": "5m",
                "drainTimeout": null,
            }
        })
    );
    let updated = apply_patch(&m, &patch);
    assert_eq!(updated.spec.node_template, set.spec.template.spec.node_template);
    assert_eq!(updated.spec.configuration, set.spec.template.spec.configuration);
    assert_eq!(updated.annotation("unrelated"), Some("kept"));
    assert_eq!(updated.spec.class.name, "small", "the machine is not replaced");
    assert_eq!(propagation_patch(&set, &updated), None);

    // The annotation goes when the set has none; the class kind follows the template.
    set.metadata.annotations = None;
    set.spec.template.spec.class.kind = "AWSMachineClass".into();
    let patch = propagation_patch(&set, &updated).unwrap();
    assert_eq!(
        patch,
        json!({
            "metadata": { "annotations": { annotations::EFFECTIVE_CREATION_TIMEOUT: null } },
            "spec": { "class": { "kind": "AWSMachineClass" } }
        })
    );
}

#[test]
fn equal_durations_are_not_rewritten_and_inactive_machines_are_left_alone() {
    let mut set = set(1);
    set.spec.template.spec.configuration.drain_timeout = Some(GoDuration::new("10m"));
    let mut m = running("a");
    m.spec.configuration.drain_timeout = Some(GoDuration::new("10m0s"));
    assert_eq!(propagation_patch(&set, &m), None);

    set.spec.template.spec.configuration.drain_timeout = Some(GoDuration::new("20m"));
    assert!(propagation_patch(&set, &m).is_some());
    for phase in [MachinePhase::Failed, MachinePhase::Terminating] {
        assert_eq!(propagation_patch(&set, &machine("b", Some(phase))), None);
    }
    let mut deleting = running("c");
    deleting.metadata.deletion_timestamp = Some(Time(at(1)));
    assert_eq!(propagation_patch(&set, &deleting), None);

    let plan = plan_for(&set, &[m, deleting], &Expectations::new());
    assert_eq!(plan.propagate.len(), 1);
    assert_eq!(plan.propagate[0].name, "a");
}
