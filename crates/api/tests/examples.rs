//! Every manifest in the repository's examples/ (local and sim) deserializes into the typed objects, validates
//! clean, and loses no field when written back: "A manifest written for the reference implementation must work here
//! unchanged."

use k8s_openapi::api::core::v1::Secret;
use mcm_api::{Machine, MachineClass, MachineDeployment, MachineSet, validation};
use serde::Serialize;
use serde_json::Value;

/// True for values the wire form omits when they are zero or empty (Go's omitempty).
fn is_empty_value(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// Asserts that every non-empty field of `original` is in `written` with the same value.
fn assert_kept(original: &Value, written: &Value, path: &str) {
    match (original, written) {
        (Value::Object(orig), Value::Object(out)) => {
            for (key, value) in orig {
                if is_empty_value(value) {
                    continue;
                }
                let child = format!("{path}.{key}");
                let out_value = out
                    .get(key)
                    .unwrap_or_else(|| panic!("{child} was lost when written back"));
                assert_kept(value, out_value, &child);
            }
        }
        _ => assert_eq!(original, written, "{path} changed when written back"),
    }
}

fn round_trip<T: serde::de::DeserializeOwned + Serialize>(value: &Value, file: &str) -> T {
    let typed: T = serde_json::from_value(value.clone()).unwrap_or_else(|err| panic!("{file}: {err}"));
    let written = serde_json::to_value(&typed).unwrap();
    assert_kept(value, &written, file);
    typed
}

#[test]
fn every_example_deserializes_validates_clean_and_round_trips() {
    let mut kinds = Vec::new();
    for (path, text) in mcm_testkit::example_manifests() {
        let file = path.display().to_string();
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|err| panic!("{file} is not YAML: {err}"));
        for document in documents.into_iter().filter(|d| !d.is_null()) {
            let kind = document["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{file}: no kind"))
                .to_owned();
            let errors = match kind.as_str() {
                "Machine" => validation::validate_machine(&round_trip::<Machine>(&document, &file)),
                "MachineSet" => validation::validate_machine_set(&round_trip::<MachineSet>(&document, &file)),
                "MachineDeployment" => {
                    validation::validate_machine_deployment(&round_trip::<MachineDeployment>(
                        &document, &file,
                    ))
                }
                "MachineClass" => {
                    validation::validate_machine_class(&round_trip::<MachineClass>(&document, &file))
                }
                "Secret" => {
                    let secret: Secret = serde_json::from_value(document).unwrap();
                    assert!(
                        secret
                            .string_data
                            .is_some_and(|data| data.contains_key("userData")),
                        "{file}"
                    );
                    Vec::new()
                }
                other => panic!("{file}: unexpected kind {other}"),
            };
            assert!(
                errors.is_empty(),
                "{file} ({kind}) should validate clean: {}",
                validation::summarize(&errors)
            );
            kinds.push(kind);
        }
    }
    for kind in [
        "Secret",
        "MachineClass",
        "Machine",
        "MachineSet",
        "MachineDeployment",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "the examples include a {kind}");
    }
}

#[test]
fn the_example_deployment_reads_as_the_user_wrote_it() {
    let path = mcm_testkit::example("local", "30-machine-deployment.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    let deployment: MachineDeployment = serde_saphyr::from_str(&text).unwrap();
    let spec = &deployment.spec;
    assert_eq!(spec.replicas, 3);
    assert_eq!(
        spec.strategy.strategy_type(),
        Ok(mcm_api::StrategyType::RollingUpdate)
    );
    let template = &spec.template.spec;
    assert_eq!(template.class.name, "local-small");
    assert_eq!(
        template
            .configuration
            .drain_timeout
            .as_ref()
            .unwrap()
            .parse()
            .unwrap()
            .as_secs(),
        300
    );
    assert_eq!(
        template
            .configuration
            .health_timeout
            .as_ref()
            .unwrap()
            .parse()
            .unwrap()
            .as_secs(),
        120
    );
    let node_labels = template
        .node_template
        .as_ref()
        .unwrap()
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .as_ref()
        .unwrap();
    assert_eq!(node_labels["worker.example.com/pool"], "workers");
}
