//! What an object sets that the reference acts on and this project only stores (issue 23): each such setting is
//! named here, so that its controller warns once (a Warning Event with reason [`NO_EFFECT`] and a log line) instead
//! of silently ignoring it. The table of every reference flag, field and key with our verdict is
//! docs/compatibility.md; what is refused outright (the InPlaceUpdate strategy) is validation's.

use mcm_api::{
    Machine, MachineDeployment, MachineSet, MetaExt,
    keys::{annotations, labels},
};

/// The reason of the Warning Event about a setting that has no effect.
pub const NO_EFFECT: &str = "NoEffect";

/// One setting that is stored but has no effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignored {
    /// Its field path (`spec.template.spec.inPlaceUpdateTimeout`, `metadata.labels[...]`).
    pub field: String,
    /// What the reference would do and what happens here instead.
    pub reason: &'static str,
}

impl Ignored {
    fn new(field: impl Into<String>, reason: &'static str) -> Self {
        Self {
            field: field.into(),
            reason,
        }
    }
}

/// The settings as one text, `field: reason; field: reason`: the Event's message and what decides whether it was
/// already said.
pub fn summarize(ignored: &[Ignored]) -> String {
    ignored
        .iter()
        .map(|i| format!("{}: {}", i.field, i.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

const FORCE_DRAIN: &str = "the reference also forces the drain of a preserved Failed machine with it; here only the \
     drain before an in-place update reads it (a preserved machine's drain is forced by the drain timeout)";

/// What the deployment sets that has no effect: nothing now (its template's `inPlaceUpdateTimeout` works since
/// the machine side of in-place updates); kept so that the next such setting has its place and its warning.
pub fn of_machine_deployment(_deployment: &MachineDeployment) -> Vec<Ignored> {
    Vec::new()
}

/// What the set sets that has no effect: nothing now (see [`of_machine_deployment`]).
pub fn of_machine_set(_set: &MachineSet) -> Vec<Ignored> {
    Vec::new()
}

/// What the machine sets that has no effect: the label `force-drain` on a preserved machine (the in-place update
/// drain reads it; the drain of a preserved Failed machine does not).
pub fn of_machine(machine: &Machine) -> Vec<Ignored> {
    let mut out = Vec::new();
    let preserved = machine.annotation(annotations::PRESERVE).is_some();
    if preserved && machine.label(labels::FORCE_DRAIN).is_some() {
        out.push(Ignored::new(
            format!("metadata.labels[{}]", labels::FORCE_DRAIN),
            FORCE_DRAIN,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(spec: &serde_json::Value) -> MachineDeployment {
        let mut value = json!({
            "metadata": { "name": "d" },
            "spec": { "replicas": 1, "template": { "spec": { "class": { "kind": "MachineClass", "name": "c" } } } }
        });
        for (key, field) in spec.as_object().unwrap() {
            value["spec"][key] = field.clone();
        }
        serde_json::from_value(value).unwrap()
    }

    fn fields(ignored: &[Ignored]) -> Vec<&str> {
        ignored.iter().map(|i| i.field.as_str()).collect()
    }

    /// Preservation and in-place updates work (docs/preservation.md, docs/in-place-update-machine.md): their
    /// fields are not named.
    #[test]
    fn a_deployment_or_set_names_neither_preservation_nor_in_place_update_fields() {
        assert!(of_machine_deployment(&deployment(&json!({}))).is_empty());
        let d = deployment(&json!({
            "autoPreserveFailedMachineMax": 2,
            "template": { "spec": {
                "class": { "kind": "MachineClass", "name": "c" },
                "machinePreserveTimeout": "1h",
                "inPlaceUpdateTimeout": "5m"
            } }
        }));
        assert!(fields(&of_machine_deployment(&d)).is_empty());
        let set: MachineSet = serde_json::from_value(json!({
            "metadata": { "name": "s" },
            "spec": { "replicas": 1, "autoPreserveFailedMachineMax": 1,
                      "template": { "spec": { "class": { "kind": "MachineClass", "name": "c" },
                                              "inPlaceUpdateTimeout": "5m" } } }
        }))
        .unwrap();
        assert!(fields(&of_machine_set(&set)).is_empty());
    }

    #[test]
    fn a_machine_names_the_force_drain_label_only_when_preserved() {
        let mut m: Machine = serde_json::from_value(json!({
            "metadata": { "name": "m" },
            "spec": { "class": { "kind": "MachineClass", "name": "c" } }
        }))
        .unwrap();
        m.metadata.labels = Some([(labels::FORCE_DRAIN.to_owned(), "True".to_owned())].into());
        m.spec.configuration.in_place_update_timeout = Some(mcm_api::GoDuration::new("5m"));
        assert!(
            fields(&of_machine(&m)).is_empty(),
            "an in-place update reads both"
        );
        m.metadata.annotations = Some([(annotations::PRESERVE.to_owned(), "now".to_owned())].into());
        let ignored = of_machine(&m);
        assert_eq!(fields(&ignored), ["metadata.labels[force-drain]"]);
        assert!(
            summarize(&ignored).contains("preserved Failed machine"),
            "{}",
            summarize(&ignored)
        );
    }
}
