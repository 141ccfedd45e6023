//! What an object sets that the reference acts on and this project only stores (issue 23): each such setting is
//! named here, so that its controller warns once (a Warning Event with reason [`NO_EFFECT`] and a log line) instead
//! of silently ignoring it. The table of every reference flag, field and key with our verdict is
//! docs/compatibility.md; what is refused outright (the InPlaceUpdate strategy) is validation's.

use mcm_api::{Machine, MachineConfiguration, MachineDeployment, MachineSet, keys::labels};

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

const IN_PLACE_TIMEOUT: &str = "in-place updates are not supported; the value is not used";
const FORCE_DRAIN: &str = "the reference forces the drain of in-place updates and preservation with it; \
     in-place updates are not implemented and the preservation drain does not read it (a deletion's drain is \
     forced by force-deletion or the drain timeout)";

/// The per-machine settings of a template or machine (`prefix` is where `configuration` sits).
fn configuration(config: &MachineConfiguration, prefix: &str, out: &mut Vec<Ignored>) {
    if config.in_place_update_timeout.is_some() {
        out.push(Ignored::new(
            format!("{prefix}.inPlaceUpdateTimeout"),
            IN_PLACE_TIMEOUT,
        ));
    }
}

/// What the deployment sets that has no effect.
pub fn of_machine_deployment(deployment: &MachineDeployment) -> Vec<Ignored> {
    let mut out = Vec::new();
    configuration(
        &deployment.spec.template.spec.configuration,
        "spec.template.spec",
        &mut out,
    );
    out
}

/// What the set sets that has no effect.
pub fn of_machine_set(set: &MachineSet) -> Vec<Ignored> {
    let mut out = Vec::new();
    configuration(
        &set.spec.template.spec.configuration,
        "spec.template.spec",
        &mut out,
    );
    out
}

/// What the machine sets that has no effect.
pub fn of_machine(machine: &Machine) -> Vec<Ignored> {
    let mut out = Vec::new();
    if machine
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(labels::FORCE_DRAIN))
    {
        out.push(Ignored::new(
            format!("metadata.labels[{}]", labels::FORCE_DRAIN),
            FORCE_DRAIN,
        ));
    }
    configuration(&machine.spec.configuration, "spec", &mut out);
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

    /// Preservation works (docs/preservation.md): its fields are not named; the in-place update timeout is.
    #[test]
    fn a_deployment_names_the_in_place_update_timeout_and_not_the_preservation_fields() {
        assert!(of_machine_deployment(&deployment(&json!({}))).is_empty());
        let d = deployment(&json!({
            "autoPreserveFailedMachineMax": 2,
            "template": { "spec": {
                "class": { "kind": "MachineClass", "name": "c" },
                "machinePreserveTimeout": "1h",
                "inPlaceUpdateTimeout": "5m"
            } }
        }));
        let ignored = of_machine_deployment(&d);
        assert_eq!(fields(&ignored), ["spec.template.spec.inPlaceUpdateTimeout"]);
        assert!(
            summarize(&ignored)
                .starts_with("spec.template.spec.inPlaceUpdateTimeout: in-place updates are not supported"),
            "{}",
            summarize(&ignored)
        );
    }

    #[test]
    fn a_set_names_its_template_in_place_update_timeout() {
        let set: MachineSet = serde_json::from_value(json!({
            "metadata": { "name": "s" },
            "spec": { "replicas": 1, "autoPreserveFailedMachineMax": 1,
                      "template": { "spec": { "class": { "kind": "MachineClass", "name": "c" },
                                              "inPlaceUpdateTimeout": "5m" } } }
        }))
        .unwrap();
        assert_eq!(
            fields(&of_machine_set(&set)),
            ["spec.template.spec.inPlaceUpdateTimeout"]
        );
    }

    #[test]
    fn a_machine_names_the_force_drain_label_and_its_in_place_update_timeout() {
        let mut m: Machine = serde_json::from_value(json!({
            "metadata": { "name": "m", "annotations": { "node.machine.sapcloud.io/preserve": "now" } },
            "spec": { "class": { "kind": "MachineClass", "name": "c" } }
        }))
        .unwrap();
        m.metadata.labels = Some([(labels::FORCE_DRAIN.to_owned(), "True".to_owned())].into());
        m.spec.configuration.machine_preserve_timeout = Some(mcm_api::GoDuration::new("1h"));
        m.spec.configuration.in_place_update_timeout = Some(mcm_api::GoDuration::new("5m"));
        assert_eq!(
            fields(&of_machine(&m)),
            ["metadata.labels[force-drain]", "spec.inPlaceUpdateTimeout"]
        );
    }
}
