//! Validation returns every problem as a field path and a reason, the way Kubernetes prints them.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcm_api::{
    Machine, MachineClass, MachineDeployment, MachineSet,
    validation::{self, FieldError},
};
use proptest::prelude::*;

fn deployment(extra_spec: &serde_json::Value) -> MachineDeployment {
    let mut value = serde_json::json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineDeployment",
        "metadata": { "name": "workers", "namespace": "default" },
        "spec": {
            "replicas": 3,
            "selector": { "matchLabels": { "name": "workers" } },
            "template": {
                "metadata": { "labels": { "name": "workers" } },
                "spec": { "class": { "kind": "MachineClass", "name": "local-small" } }
            }
        }
    });
    merge(&mut value["spec"], extra_spec);
    serde_json::from_value(value).unwrap()
}

fn merge(base: &mut serde_json::Value, patch: &serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(base), serde_json::Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    base.remove(key);
                } else {
                    merge(base.entry(key.clone()).or_insert(serde_json::Value::Null), value);
                }
            }
        }
        (base, patch) => *base = patch.clone(),
    }
}

fn messages(errors: &[FieldError]) -> Vec<String> {
    errors.iter().map(ToString::to_string).collect()
}

#[test]
fn a_valid_deployment_has_no_errors() {
    assert_eq!(
        messages(&validation::validate_machine_deployment(&deployment(
            &serde_json::json!({})
        ))),
        Vec::<String>::new()
    );
}

#[test]
fn missing_class_name_is_reported_with_its_path() {
    let d = deployment(&serde_json::json!({ "template": { "spec": { "class": { "name": null } } } }));
    assert_eq!(
        messages(&validation::validate_machine_deployment(&d)),
        ["spec.template.spec.class.name: Required value"]
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let d = deployment(&serde_json::json!({
        "replicas": -1,
        "template": { "spec": { "class": { "kind": null }, "drainTimeout": "5 minutes" } },
        "strategy": { "rollingUpdate": { "maxSurge": 0, "maxUnavailable": "0%" } }
    }));
    let found = messages(&validation::validate_machine_deployment(&d));
    assert!(
        found.contains(&"spec.replicas: Invalid value: -1: must be greater than or equal to 0".to_owned()),
        "{found:?}"
    );
    assert!(
        found.contains(&"spec.template.spec.class.kind: Required value".to_owned()),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|m| m.starts_with("spec.template.spec.drainTimeout: Invalid value: \"5 minutes\"")),
        "{found:?}"
    );
    assert!(
        found.contains(&"spec.strategy.rollingUpdate.maxUnavailable: Invalid value: \"0\": may not be 0 when maxSurge is 0".to_owned()),
        "{found:?}"
    );
    assert_eq!(found.len(), 4, "{found:?}");
}

#[test]
fn selector_must_match_the_template_labels() {
    let d = deployment(&serde_json::json!({ "selector": { "matchLabels": { "name": "other" } } }));
    let found = messages(&validation::validate_machine_deployment(&d));
    assert_eq!(
        found,
        ["spec.selector: Invalid value: \"name=other\": `selector` does not match template `labels`"]
    );

    let d = deployment(
        &serde_json::json!({ "selector": { "matchLabels": null, "matchExpressions": [
        { "key": "name", "operator": "In", "values": ["workers", "spare"] }
    ] } }),
    );
    assert!(validation::validate_machine_deployment(&d).is_empty());

    let d = deployment(&serde_json::json!({ "selector": null }));
    assert_eq!(
        messages(&validation::validate_machine_deployment(&d)),
        ["spec.selector: Required value"]
    );
}

#[test]
fn strategy_types_rolling_update_recreate_and_on_delete_are_supported_and_empty_means_rolling_update() {
    for strategy in ["", "RollingUpdate", "Recreate", "OnDelete"] {
        let d = deployment(&serde_json::json!({ "strategy": { "type": strategy } }));
        assert!(
            validation::validate_machine_deployment(&d).is_empty(),
            "{strategy}"
        );
    }
    let d = deployment(&serde_json::json!({ "strategy": { "type": "" } }));
    assert_eq!(
        d.spec.strategy.strategy_type(),
        Ok(mcm_api::StrategyType::RollingUpdate)
    );
}

#[test]
fn in_place_update_is_accepted_with_auto_or_manual_orchestration() {
    for orchestration in ["Auto", "Manual"] {
        let d = deployment(
            &serde_json::json!({ "strategy": { "type": "InPlaceUpdate", "inPlaceUpdate": {
            "orchestrationType": orchestration, "maxSurge": 0, "maxUnavailable": "50%" } } }),
        );
        assert_eq!(
            messages(&validation::validate_machine_deployment(&d)),
            Vec::<String>::new(),
            "{orchestration}"
        );
    }
    // maxSurge and maxUnavailable default to 1 each, as rollingUpdate's do.
    let d = deployment(
        &serde_json::json!({ "strategy": { "type": "InPlaceUpdate", "inPlaceUpdate": { "orchestrationType": "Auto" } } }),
    );
    assert!(validation::validate_machine_deployment(&d).is_empty());
}

#[test]
fn in_place_update_needs_its_parameters_and_a_known_orchestration_type() {
    let missing = deployment(&serde_json::json!({ "strategy": { "type": "InPlaceUpdate" } }));
    assert_eq!(
        messages(&validation::validate_machine_deployment(&missing)),
        [
            "spec.strategy.inPlaceUpdate: Required value: InPlaceUpdate parameter cannot be nil for in-place update strategy"
        ]
    );
    let no_type =
        deployment(&serde_json::json!({ "strategy": { "type": "InPlaceUpdate", "inPlaceUpdate": {} } }));
    assert_eq!(
        messages(&validation::validate_machine_deployment(&no_type)),
        ["spec.strategy.inPlaceUpdate.orchestrationType: Required value: must be Auto or Manual"]
    );
    let unknown = deployment(&serde_json::json!({ "strategy": { "type": "InPlaceUpdate",
        "inPlaceUpdate": { "orchestrationType": "auto" } } }));
    assert_eq!(
        messages(&validation::validate_machine_deployment(&unknown)),
        [
            "spec.strategy.inPlaceUpdate.orchestrationType: Unsupported value: \"auto\": supported values: \"Auto\", \"Manual\""
        ]
    );
}

#[test]
fn in_place_update_surge_and_unavailable_are_checked_as_rolling_updates_are() {
    let d = deployment(
        &serde_json::json!({ "strategy": { "type": "InPlaceUpdate", "inPlaceUpdate": {
        "orchestrationType": "Auto", "maxSurge": "two", "maxUnavailable": "150%" } } }),
    );
    assert_eq!(
        messages(&validation::validate_machine_deployment(&d)),
        [
            "spec.strategy.inPlaceUpdate.maxSurge: Invalid value: \"two\": a string value must be a percentage such as '25%'",
            "spec.strategy.inPlaceUpdate.maxUnavailable: Invalid value: \"150%\": must not be greater than 100%",
        ]
    );
    let zeros = deployment(
        &serde_json::json!({ "strategy": { "type": "InPlaceUpdate", "inPlaceUpdate": {
        "orchestrationType": "Auto", "maxSurge": 0, "maxUnavailable": "0%" } } }),
    );
    assert_eq!(
        messages(&validation::validate_machine_deployment(&zeros)),
        ["spec.strategy.inPlaceUpdate.maxUnavailable: Invalid value: \"0\": may not be 0 when maxSurge is 0"]
    );
}

#[test]
fn the_other_strategy_parameters_are_forbidden_beside_their_type() {
    let rolling_beside = deployment(&serde_json::json!({ "strategy": { "type": "InPlaceUpdate",
        "rollingUpdate": { "maxSurge": 1 }, "inPlaceUpdate": { "orchestrationType": "Manual" } } }));
    assert_eq!(
        messages(&validation::validate_machine_deployment(&rolling_beside)),
        [
            "spec.strategy.rollingUpdate: Forbidden: may not be specified when strategy `type` is 'InPlaceUpdate'"
        ]
    );
    let in_place_beside = deployment(&serde_json::json!({ "strategy": { "type": "RollingUpdate",
        "inPlaceUpdate": { "orchestrationType": "Manual" } } }));
    assert_eq!(
        messages(&validation::validate_machine_deployment(&in_place_beside)),
        ["spec.strategy.inPlaceUpdate: Forbidden: may only be specified with strategy type InPlaceUpdate"]
    );
}

#[test]
fn an_unknown_strategy_type_lists_the_supported_ones() {
    let d = deployment(&serde_json::json!({ "strategy": { "type": "Rolling" } }));
    assert_eq!(
        messages(&validation::validate_machine_deployment(&d)),
        [
            "spec.strategy.type: Unsupported value: \"Rolling\": supported values: \"RollingUpdate\", \"Recreate\", \"OnDelete\", \"InPlaceUpdate\""
        ]
    );
}

#[test]
fn rolling_update_values_must_be_numbers_or_percentages() {
    let d = deployment(
        &serde_json::json!({ "strategy": { "rollingUpdate": { "maxSurge": "two", "maxUnavailable": "150%" } } }),
    );
    let found = messages(&validation::validate_machine_deployment(&d));
    assert_eq!(
        found,
        [
            "spec.strategy.rollingUpdate.maxSurge: Invalid value: \"two\": a string value must be a percentage such as '25%'",
            "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: \"150%\": must not be greater than 100%",
        ]
    );
}

#[test]
fn rolling_update_parameters_are_forbidden_with_recreate() {
    let d = deployment(
        &serde_json::json!({ "strategy": { "type": "Recreate", "rollingUpdate": { "maxSurge": 1 } } }),
    );
    assert_eq!(
        messages(&validation::validate_machine_deployment(&d)),
        ["spec.strategy.rollingUpdate: Forbidden: may not be specified when strategy `type` is 'Recreate'"]
    );
}

#[test]
fn names_must_be_dns_1123() {
    let mut d = deployment(&serde_json::json!({}));
    d.metadata.name = Some("Workers_1".into());
    let found = messages(&validation::validate_machine_deployment(&d));
    assert_eq!(found.len(), 1);
    assert!(
        found[0].starts_with("metadata.name: Invalid value: \"Workers_1\": a lowercase RFC 1123 subdomain")
    );

    d.metadata.name = None;
    d.metadata.generate_name = Some("workers-".into());
    assert!(validation::validate_machine_deployment(&d).is_empty());
}

#[test]
fn machine_set_replicas_and_class_are_checked() {
    let set: MachineSet = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "s" },
        "spec": { "replicas": -2, "selector": { "matchLabels": { "a": "b" } },
                  "template": { "metadata": { "labels": { "a": "b" } }, "spec": { "class": { "kind": "MachineClass" } } } }
    }))
    .unwrap();
    assert_eq!(
        messages(&validation::validate_machine_set(&set)),
        [
            "spec.replicas: Invalid value: -2: must be greater than or equal to 0",
            "spec.template.spec.class.name: Required value",
        ]
    );
}

#[test]
fn machine_class_reference_and_durations_are_checked() {
    let machine: Machine = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "m" },
        "spec": { "class": { "name": "c" }, "healthTimeout": "-1m", "maxEvictRetries": -3 }
    }))
    .unwrap();
    assert_eq!(
        messages(&validation::validate_machine(&machine)),
        [
            "spec.class.kind: Required value",
            "spec.healthTimeout: Invalid value: \"-1m\": must be a Go duration such as 10m or 1h30m (duration \"-1m\" must not be negative)",
            "spec.maxEvictRetries: Invalid value: -3: must be greater than or equal to 0",
        ]
    );
}

#[test]
fn machine_class_needs_provider_spec_and_a_complete_node_template() {
    let class: MachineClass = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "c" },
        "secretRef": { "namespace": "default" },
        "nodeTemplate": { "capacity": { "cpu": "2", "memory": "lots" }, "instanceType": "small", "region": "r" }
    }))
    .unwrap();
    assert_eq!(
        messages(&validation::validate_machine_class(&class)),
        [
            "providerSpec: Required value",
            "secretRef.name: Required value",
            "nodeTemplate.capacity.gpu: Required value",
            "nodeTemplate.capacity.memory: Invalid value: \"lots\": must be a Kubernetes quantity such as 2, 500m or 4Gi",
            "nodeTemplate.zone: Required value",
        ]
    );
}

#[test]
fn quantities_are_recognised() {
    for good in ["2", "0", "500m", "4Gi", "1.5", "1e3", "+1", "-2Ki", ".5"] {
        assert!(validation::is_quantity(good), "{good}");
    }
    for bad in ["", "lots", "4GB", "1..2", "Gi", "1e", "1 Gi"] {
        assert!(!validation::is_quantity(bad), "{bad}");
    }
}

proptest! {
    #[test]
    fn non_negative_numbers_and_percentages_are_accepted(n in 0i32..=10_000, p in 0i32..=100) {
        prop_assert_eq!(validation::check_int_or_percent(&IntOrString::Int(n), true), Ok(n));
        prop_assert_eq!(validation::check_int_or_percent(&IntOrString::String(format!("{p}%")), true), Ok(p));
    }

    #[test]
    fn negative_numbers_are_refused(n in i32::MIN..0) {
        prop_assert!(validation::check_int_or_percent(&IntOrString::Int(n), false).is_err());
    }

    #[test]
    fn generated_dns_names_are_accepted(name in "[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?){0,3}") {
        prop_assert!(validation::check_dns1123_subdomain(&name).is_ok());
    }

    #[test]
    fn names_with_capitals_or_underscores_are_refused(prefix in "[a-z]{1,5}", bad in "[A-Z_]", suffix in "[a-z]{1,5}") {
        let name = format!("{prefix}{bad}{suffix}");
        prop_assert!(validation::check_dns1123_subdomain(&name).is_err());
    }
}
