//! The ValidatingAdmissionPolicy of `deploy/validating-admission-policy.yaml` agrees with `mcm_api::validation` over
//! the corpus of bad input (`corpus/mod.rs`, the one the embedded server and the controllers are tested with in
//! `invalid_input.rs`): its CEL rules, evaluated here with the `cel` interpreter as kube-apiserver evaluates a
//! policy (match conditions, then variables in order, then each validation, its `messageExpression` on failure),
//! refuse every bad object with a message naming the field (`spec.replicas: Invalid value: -1: ...`; a policy's
//! validations have no `fieldPath`, unlike a CRD's rules), accept the good ones, and let through
//! what must never be blocked (an object being deleted, a metadata-only update of an invalid object).
//!
//! Only standard CEL is used (`has`, `all`, `in`, `matches`, `size`, `string`, `type`), no Kubernetes library
//! function, so what is evaluated here is what a cluster evaluates; quantities and durations are checked by regular
//! expressions equivalent to the Rust parsers for the corpus.

use crate::corpus;

use std::{collections::HashMap, path::Path, sync::Arc};

use cel::{Context, Env, Program};
use corpus::{Case, Kind};
use mcm_api::validation;
use serde_json::{Value, json};

/// One compiled rule and its source.
struct Rule {
    source: String,
    program: Program,
}

impl Rule {
    fn new(env: &Env, source: &str) -> Self {
        let program = env
            .compile(source)
            .unwrap_or_else(|err| panic!("the CEL expression does not compile: {source}: {err:?}"));
        Self {
            source: source.to_owned(),
            program,
        }
    }
}

struct Validation {
    rule: Rule,
    message: Rule,
}

/// One policy of the file: the resource it matches, its match conditions, variables and validations.
struct Policy {
    resource: String,
    operations: Vec<String>,
    conditions: Vec<Rule>,
    variables: Vec<(String, Rule)>,
    validations: Vec<Validation>,
}

/// What the policy of a resource says of a request.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// A match condition is false: the policy does not apply.
    NotMatched,
    /// Every validation holds.
    Admitted,
    /// These validations failed: (the field the message names first, message).
    Refused(Vec<(String, String)>),
}

fn policies(env: &Env) -> Vec<Policy> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/validating-admission-policy.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/validating-admission-policy.yaml");
    let documents: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    let bindings: Vec<&Value> = documents
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .collect();
    documents
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .map(|d| {
            assert_eq!(d["apiVersion"], "admissionregistration.k8s.io/v1");
            let name = d["metadata"]["name"].as_str().unwrap();
            assert!(
                bindings
                    .iter()
                    .any(|b| b["spec"]["policyName"] == name
                        && b["spec"]["validationActions"] == json!(["Deny"])),
                "policy {name} has a binding that denies"
            );
            let spec = &d["spec"];
            assert_eq!(spec["failurePolicy"], "Fail", "{name}");
            let rules = spec["matchConstraints"]["resourceRules"].as_array().unwrap();
            assert_eq!(rules.len(), 1, "{name}: one resource");
            let strings = |v: &Value| -> Vec<String> {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_owned())
                    .collect()
            };
            assert_eq!(strings(&rules[0]["apiGroups"]), ["machine.sapcloud.io"], "{name}");
            let resources = strings(&rules[0]["resources"]);
            let list = |key: &str| spec[key].as_array().cloned().unwrap_or_default();
            Policy {
                resource: resources[0].clone(),
                operations: strings(&rules[0]["operations"]),
                conditions: list("matchConditions")
                    .iter()
                    .map(|c| Rule::new(env, c["expression"].as_str().unwrap()))
                    .collect(),
                variables: list("variables")
                    .iter()
                    .map(|v| {
                        (
                            v["name"].as_str().unwrap().to_owned(),
                            Rule::new(env, v["expression"].as_str().unwrap()),
                        )
                    })
                    .collect(),
                validations: list("validations")
                    .iter()
                    .map(|v| Validation {
                        rule: Rule::new(env, v["expression"].as_str().unwrap()),
                        message: Rule::new(
                            env,
                            v["messageExpression"].as_str().expect("a messageExpression"),
                        ),
                    })
                    .collect(),
            }
        })
        .collect()
}

/// JSON as CEL values: integers as `int` (as kube-apiserver presents integer fields), not `uint`.
fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => n.as_i64().map_or_else(
            || cel::Value::Float(n.as_f64().unwrap_or_default()),
            cel::Value::Int,
        ),
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(map) => {
            let map: HashMap<String, cel::Value> = map.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
            map.into()
        }
    }
}

struct Evaluator {
    env: Arc<Env>,
    policies: Vec<Policy>,
}

impl Evaluator {
    fn new() -> Self {
        let env = Arc::new(Env::stdlib());
        let policies = policies(&env);
        Self { env, policies }
    }

    fn evaluate(context: &Context, rule: &Rule) -> cel::Value {
        rule.program
            .execute(context)
            .unwrap_or_else(|err| panic!("{}: evaluation failed: {err:?}", rule.source))
    }

    fn holds(context: &Context, rule: &Rule) -> bool {
        match Self::evaluate(context, rule) {
            cel::Value::Bool(b) => b,
            other => panic!("{}: not a bool: {other:?}", rule.source),
        }
    }

    /// The verdict of the policy of `kind` on a CREATE (`old` None) or UPDATE.
    fn admit(&self, kind: Kind, object: &Value, old: Option<&Value>) -> Verdict {
        let policy = self
            .policies
            .iter()
            .find(|p| p.resource == kind.resource())
            .unwrap_or_else(|| panic!("a policy for {}", kind.resource()));
        let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
        assert!(
            policy.operations.iter().any(|o| o == operation),
            "{} on {operation}",
            policy.resource
        );
        let context = |variables: &HashMap<String, cel::Value>| {
            let mut context = Context::with_env(Arc::clone(&self.env));
            context.add_variable_from_value("object", to_cel(object));
            context.add_variable_from_value("oldObject", old.map_or(cel::Value::Null, to_cel));
            context.add_variable_from_value(
                "request",
                to_cel(&json!({ "operation": operation, "kind": {
                    "group": "machine.sapcloud.io", "version": "v1alpha1", "kind": kind.name()
                } })),
            );
            context.add_variable_from_value("variables", cel::Value::from(variables.clone()));
            context
        };
        let mut variables = HashMap::new();
        if !policy
            .conditions
            .iter()
            .all(|c| Self::holds(&context(&variables), c))
        {
            return Verdict::NotMatched;
        }
        for (name, rule) in &policy.variables {
            let value = Self::evaluate(&context(&variables), rule);
            variables.insert(name.clone(), value);
        }
        let context = context(&variables);
        let failed: Vec<(String, String)> = policy
            .validations
            .iter()
            .filter(|v| !Self::holds(&context, &v.rule))
            .map(|v| match Self::evaluate(&context, &v.message) {
                cel::Value::String(message) => (
                    message.split(':').next().unwrap_or_default().to_owned(),
                    (*message).clone(),
                ),
                other => panic!("{}: the message is not a string: {other:?}", v.message.source),
            })
            .collect();
        if failed.is_empty() {
            Verdict::Admitted
        } else {
            Verdict::Refused(failed)
        }
    }
}

fn rust_errors(kind: Kind, object: &Value) -> Vec<validation::FieldError> {
    let object = object.clone();
    match kind {
        Kind::Machine => validation::validate_machine(&serde_json::from_value(object).unwrap()),
        Kind::MachineSet => validation::validate_machine_set(&serde_json::from_value(object).unwrap()),
        Kind::MachineDeployment => {
            validation::validate_machine_deployment(&serde_json::from_value(object).unwrap())
        }
        Kind::MachineClass => validation::validate_machine_class(&serde_json::from_value(object).unwrap()),
    }
}

fn related(a: &str, b: &str) -> bool {
    corpus::names(a, b) || corpus::names(b, a)
}

#[test]
fn every_bad_object_is_refused_by_a_rule_naming_its_field_as_the_rust_validation_refuses_it() {
    let evaluator = Evaluator::new();
    for Case {
        name,
        kind,
        object,
        field,
    } in corpus::cases()
    {
        let errors = rust_errors(kind, &object);
        assert!(
            errors.iter().any(|e| related(&e.path, field)),
            "{name}: the Rust validation names {field}: {errors:?}"
        );
        match evaluator.admit(kind, &object, None) {
            Verdict::Refused(failed) => {
                assert!(
                    failed
                        .iter()
                        .any(|(path, message)| related(path, field) && message.starts_with(path)),
                    "{name}: no refusing rule names {field}: {failed:?}"
                );
            }
            other => panic!("{name}: the policy says {other:?}"),
        }
    }
}

#[test]
fn the_good_objects_are_admitted_by_the_policy_and_by_the_rust_validation() {
    let evaluator = Evaluator::new();
    let bases = [
        (Kind::MachineDeployment, corpus::deployment("workers", 2)),
        (Kind::MachineSet, corpus::set("standalone", 2)),
        (Kind::Machine, corpus::machine("single")),
        (Kind::MachineClass, corpus::class("sim-small")),
    ];
    for (kind, object) in corpus::good().into_iter().chain(bases) {
        let name = &object["metadata"]["name"];
        assert_eq!(rust_errors(kind, &object), [], "{} {name}", kind.name());
        assert_eq!(
            evaluator.admit(kind, &object, None),
            Verdict::Admitted,
            "{} {name}",
            kind.name()
        );
        assert_eq!(
            evaluator.admit(kind, &object, Some(&object)),
            Verdict::NotMatched,
            "{} {name}: an unchanged update",
            kind.name()
        );
    }
}

#[test]
fn the_policy_never_blocks_deleting_an_invalid_object_nor_changing_only_its_metadata() {
    let evaluator = Evaluator::new();
    for Case {
        name, kind, object, ..
    } in corpus::cases()
    {
        // Stored before the policy: its labels, annotations and finalizers may change.
        let mut labelled = object.clone();
        labelled["metadata"]["labels"] = json!({ "team": "a" });
        labelled["metadata"]["finalizers"] = json!(["test/hold"]);
        assert_eq!(
            evaluator.admit(kind, &labelled, Some(&object)),
            Verdict::NotMatched,
            "{name}"
        );
        // Being deleted: its last finalizer may go.
        let mut deleting = labelled.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let mut released = deleting.clone();
        released["metadata"]["finalizers"] = json!([]);
        assert_eq!(
            evaluator.admit(kind, &released, Some(&deleting)),
            Verdict::NotMatched,
            "{name}"
        );
        // A good object made bad by an update is refused.
        let base = match kind {
            Kind::MachineDeployment => corpus::deployment("workers", 2),
            Kind::MachineSet => corpus::set("standalone", 2),
            Kind::Machine => corpus::machine("single"),
            Kind::MachineClass => corpus::class("sim-small"),
        };
        assert!(
            matches!(evaluator.admit(kind, &object, Some(&base)), Verdict::Refused(_)),
            "{name}: an update making it invalid"
        );
    }
}
