//! The corpus of bad input shared by the tests of every layer that refuses or reports it (issue 19): the embedded
//! API server's admission, the controllers, and the ValidatingAdmissionPolicy's CEL rules. Each case is a valid
//! object built here (no file from outside the repository) with one thing made wrong, and the field that must be
//! named.

// Each test crate uses its own part of the corpus.

use serde_json::{Value, json};

/// The class the objects refer to.
pub const CLASS: &str = "sim-small";

/// The kinds of the corpus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `Machine`.
    Machine,
    /// `MachineSet`.
    MachineSet,
    /// `MachineDeployment`.
    MachineDeployment,
    /// `MachineClass`.
    MachineClass,
}

impl Kind {
    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Machine => "Machine",
            Self::MachineSet => "MachineSet",
            Self::MachineDeployment => "MachineDeployment",
            Self::MachineClass => "MachineClass",
        }
    }

    /// The resource (plural), as admission rules name it.
    pub fn resource(self) -> &'static str {
        match self {
            Self::Machine => "machines",
            Self::MachineSet => "machinesets",
            Self::MachineDeployment => "machinedeployments",
            Self::MachineClass => "machineclasses",
        }
    }
}

/// One bad object.
#[derive(Clone, Debug)]
pub struct Case {
    /// What is wrong, in words.
    pub name: &'static str,
    /// Its kind.
    pub kind: Kind,
    /// The whole object.
    pub object: Value,
    /// The field that must be named (as `mcm_api::validation` names it).
    pub field: &'static str,
}

/// A valid deployment named `name` of `replicas` machines of [`CLASS`], selecting `app=<name>`.
pub fn deployment(name: &str, replicas: i32) -> Value {
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineDeployment",
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 0 } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": {
                    "class": { "kind": "MachineClass", "name": CLASS },
                    "drainTimeout": "5m",
                    "healthTimeout": "10m",
                    "creationTimeout": "20m"
                }
            }
        }
    })
}

/// A valid set named `name` of `replicas` machines of [`CLASS`], selecting `app=<name>`.
pub fn set(name: &str, replicas: i32) -> Value {
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineSet",
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchExpressions": [{ "key": "app", "operator": "In", "values": [name] }] },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "class": { "kind": "MachineClass", "name": CLASS }, "drainTimeout": "5m" }
            }
        }
    })
}

/// A valid machine named `name` of [`CLASS`].
pub fn machine(name: &str) -> Value {
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": name },
        "spec": {
            "class": { "kind": "MachineClass", "name": CLASS },
            "drainTimeout": "5m",
            "maxEvictRetries": 3,
            "nodeConditions": "KernelDeadlock,ReadonlyFilesystem"
        }
    })
}

/// A valid class named `name` with a node template.
pub fn class(name: &str) -> Value {
    json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineClass",
        "metadata": { "name": name },
        "provider": "sim",
        "providerSpec": { "vmPool": "pool", "size": "small", "tags": { "kubernetes.io/cluster/test": "1" } },
        "secretRef": { "name": "boot", "namespace": "default" },
        "nodeTemplate": {
            "capacity": { "cpu": "2", "gpu": 0, "memory": "4Gi" },
            "instanceType": "small",
            "region": "local",
            "zone": "local-a"
        }
    })
}

/// The valid objects the rules must accept (beside the bases of every case).
pub fn good() -> Vec<(Kind, Value)> {
    let mut recreate = deployment("recreate", 2);
    recreate["spec"]["strategy"] = json!({ "type": "Recreate" });
    let mut percentages = deployment("percent", 4);
    percentages["spec"]["strategy"]["rollingUpdate"] = json!({ "maxSurge": "25%", "maxUnavailable": "100%" });
    let mut expressions = deployment("expressions", 1);
    expressions["spec"]["selector"] = json!({ "matchExpressions": [
        { "key": "app", "operator": "In", "values": ["expressions", "other"] },
        { "key": "tier", "operator": "NotIn", "values": ["db"] },
        { "key": "app", "operator": "Exists" },
        { "key": "gone", "operator": "DoesNotExist" }
    ] });
    let mut no_template_class = class("no-template");
    no_template_class
        .as_object_mut()
        .map(|o| o.remove("nodeTemplate"));
    vec![
        (Kind::MachineDeployment, deployment("workers", 3)),
        (Kind::MachineDeployment, recreate),
        (Kind::MachineDeployment, percentages),
        (Kind::MachineDeployment, expressions),
        (Kind::MachineSet, set("standalone", 2)),
        (Kind::Machine, machine("single")),
        (Kind::MachineClass, class("sim-small")),
        (Kind::MachineClass, no_template_class),
    ]
}

fn case(
    name: &'static str,
    kind: Kind,
    field: &'static str,
    mut object: Value,
    change: impl FnOnce(&mut Value),
) -> Case {
    change(&mut object);
    Case {
        name,
        kind,
        object,
        field,
    }
}

/// Every bad input of issue 19, on the valid bases above (a deployment `workers`, a set `standalone`, a machine
/// `single`, a class `sim-small`).
#[allow(clippy::too_many_lines)] // one table
pub fn cases() -> Vec<Case> {
    use Kind::{Machine, MachineClass, MachineDeployment, MachineSet};
    let md = || deployment("workers", 2);
    let ms = || set("standalone", 2);
    vec![
        case(
            "deployment replicas -1",
            MachineDeployment,
            "spec.replicas",
            md(),
            |o| {
                o["spec"]["replicas"] = json!(-1);
            },
        ),
        case("set replicas -1", MachineSet, "spec.replicas", ms(), |o| {
            o["spec"]["replicas"] = json!(-1);
        }),
        case(
            "maxSurge 0 with maxUnavailable 0",
            MachineDeployment,
            "spec.strategy.rollingUpdate.maxUnavailable",
            md(),
            |o| o["spec"]["strategy"]["rollingUpdate"] = json!({ "maxSurge": 0, "maxUnavailable": "0%" }),
        ),
        case(
            "maxUnavailable over 100%",
            MachineDeployment,
            "spec.strategy.rollingUpdate.maxUnavailable",
            md(),
            |o| o["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] = json!("150%"),
        ),
        case(
            "maxSurge not a percentage",
            MachineDeployment,
            "spec.strategy.rollingUpdate.maxSurge",
            md(),
            |o| {
                o["spec"]["strategy"]["rollingUpdate"]["maxSurge"] = json!("two");
            },
        ),
        case(
            "deployment selector not matching the template labels",
            MachineDeployment,
            "spec.selector",
            md(),
            |o| o["spec"]["selector"] = json!({ "matchLabels": { "app": "other" } }),
        ),
        case(
            "set selector not matching the template labels",
            MachineSet,
            "spec.selector",
            ms(),
            |o| {
                o["spec"]["selector"] = json!({ "matchExpressions": [{ "key": "app", "operator": "NotIn", "values": ["standalone"] }] });
            },
        ),
        case("empty selector", MachineDeployment, "spec.selector", md(), |o| {
            o["spec"]["selector"] = json!({});
        }),
        case("missing selector", MachineSet, "spec.selector", ms(), |o| {
            o["spec"].as_object_mut().map(|s| s.remove("selector"));
        }),
        case(
            "unparsable drainTimeout",
            MachineDeployment,
            "spec.template.spec.drainTimeout",
            md(),
            |o| {
                o["spec"]["template"]["spec"]["drainTimeout"] = json!("5 minutes");
            },
        ),
        case(
            "negative healthTimeout",
            MachineDeployment,
            "spec.template.spec.healthTimeout",
            md(),
            |o| {
                o["spec"]["template"]["spec"]["healthTimeout"] = json!("-1m");
            },
        ),
        case(
            "unparsable creationTimeout",
            MachineDeployment,
            "spec.template.spec.creationTimeout",
            md(),
            |o| {
                o["spec"]["template"]["spec"]["creationTimeout"] = json!("soon");
            },
        ),
        case(
            "unparsable drainTimeout of a set",
            MachineSet,
            "spec.template.spec.drainTimeout",
            ms(),
            |o| {
                o["spec"]["template"]["spec"]["drainTimeout"] = json!("10 min");
            },
        ),
        case(
            "unparsable drainTimeout of a machine",
            Machine,
            "spec.drainTimeout",
            machine("single"),
            |o| {
                o["spec"]["drainTimeout"] = json!("ten minutes");
            },
        ),
        case(
            "unknown strategy type",
            MachineDeployment,
            "spec.strategy.type",
            md(),
            |o| {
                o["spec"]["strategy"] = json!({ "type": "BlueGreen" });
            },
        ),
        case(
            "InPlaceUpdate strategy without its parameters",
            MachineDeployment,
            "spec.strategy.inPlaceUpdate",
            md(),
            |o| {
                o["spec"]["strategy"] = json!({ "type": "InPlaceUpdate" });
            },
        ),
        case(
            "InPlaceUpdate with an unknown orchestration type",
            MachineDeployment,
            "spec.strategy.inPlaceUpdate.orchestrationType",
            md(),
            |o| {
                o["spec"]["strategy"] =
                    json!({ "type": "InPlaceUpdate", "inPlaceUpdate": { "orchestrationType": "Automatic" } });
            },
        ),
        case(
            "rollingUpdate with Recreate",
            MachineDeployment,
            "spec.strategy.rollingUpdate",
            md(),
            |o| {
                o["spec"]["strategy"]["type"] = json!("Recreate");
            },
        ),
        case(
            "empty class name",
            MachineDeployment,
            "spec.template.spec.class.name",
            md(),
            |o| {
                o["spec"]["template"]["spec"]["class"]["name"] = json!("");
            },
        ),
        case(
            "empty class kind of a set",
            MachineSet,
            "spec.template.spec.class.kind",
            ms(),
            |o| {
                o["spec"]["template"]["spec"]["class"]["kind"] = json!("");
            },
        ),
        case(
            "empty class name of a machine",
            Machine,
            "spec.class.name",
            machine("single"),
            |o| {
                o["spec"]["class"]["name"] = json!("");
            },
        ),
        case(
            "negative minReadySeconds",
            MachineSet,
            "spec.minReadySeconds",
            ms(),
            |o| {
                o["spec"]["minReadySeconds"] = json!(-5);
            },
        ),
        case(
            "progressDeadlineSeconds not above minReadySeconds",
            MachineDeployment,
            "spec.progressDeadlineSeconds",
            md(),
            |o| {
                o["spec"]["minReadySeconds"] = json!(600);
                o["spec"]["progressDeadlineSeconds"] = json!(300);
            },
        ),
        case(
            "negative revisionHistoryLimit",
            MachineDeployment,
            "spec.revisionHistoryLimit",
            md(),
            |o| {
                o["spec"]["revisionHistoryLimit"] = json!(-1);
            },
        ),
        case(
            "bad template label value",
            MachineDeployment,
            "spec.template.metadata.labels",
            md(),
            |o| {
                o["spec"]["template"]["metadata"]["labels"]["tier"] = json!("-front end-");
            },
        ),
        case(
            "negative maxEvictRetries",
            Machine,
            "spec.maxEvictRetries",
            machine("single"),
            |o| {
                o["spec"]["maxEvictRetries"] = json!(-3);
            },
        ),
        case(
            "node conditions with a blank",
            Machine,
            "spec.nodeConditions",
            machine("single"),
            |o| {
                o["spec"]["nodeConditions"] = json!("Ready, ,Other");
            },
        ),
        case(
            "class without providerSpec",
            MachineClass,
            "providerSpec",
            class("sim-small"),
            |o| {
                o.as_object_mut().map(|c| c.remove("providerSpec"));
            },
        ),
        case(
            "class secretRef without a name",
            MachineClass,
            "secretRef.name",
            class("sim-small"),
            |o| {
                o["secretRef"] = json!({ "namespace": "default" });
            },
        ),
        case(
            "class capacity not a quantity",
            MachineClass,
            "nodeTemplate.capacity.memory",
            class("sim-small"),
            |o| {
                o["nodeTemplate"]["capacity"]["memory"] = json!("lots");
            },
        ),
        case(
            "class capacity without cpu",
            MachineClass,
            "nodeTemplate.capacity.cpu",
            class("sim-small"),
            |o| {
                o["nodeTemplate"]["capacity"]
                    .as_object_mut()
                    .map(|c| c.remove("cpu"));
            },
        ),
        case(
            "class node template without a zone",
            MachineClass,
            "nodeTemplate.zone",
            class("sim-small"),
            |o| {
                o["nodeTemplate"]["zone"] = json!("");
            },
        ),
    ]
}

/// Whether the field path `named` names `field` or a field above it (`spec.selector` names
/// `spec.selector.matchLabels`; `nodeTemplate.capacity` names `nodeTemplate.capacity.cpu`).
pub fn names(named: &str, field: &str) -> bool {
    let named = named.trim_start_matches('.');
    field == named || field.starts_with(&format!("{named}.")) || field.starts_with(&format!("{named}["))
}
