//! What an object sets that the reference acts on and this project only stores (issue 23): each such setting is
//! named here, so that its controller warns once (a Warning Event with reason [`NO_EFFECT`] and a log line) instead
//! of silently ignoring it. The table of every reference flag, field and key with our verdict is
//! docs/compatibility.md; what is refused outright (the InPlaceUpdate strategy) is validation's.

use jiff::Timestamp;
use mcm_api::{
    Machine, MachineConfiguration, MachineDeployment, MachineSet,
    keys::{annotations, labels},
};

/// The reason of the Warning Event about a setting that has no effect.
pub const NO_EFFECT: &str = "NoEffect";

/// Values of `node.machine.sapcloud.io/preserve` that ask for preservation.
const PRESERVE_VALUES: [&str; 3] = ["now", "when-failed", "auto-preserved"];

/// One setting that is stored but has no effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignored {
    /// Its field path (`spec.autoPreserveFailedMachineMax`, `metadata.annotations[...]`).
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

const AUTO_PRESERVE: &str =
    "auto-preservation of Failed machines is not implemented yet; Failed machines are replaced";
const PRESERVE_TIMEOUT: &str = "machine preservation is not implemented yet; the value is not used";
const IN_PLACE_TIMEOUT: &str = "in-place updates are not supported; the value is not used";
const FORCE_DRAIN: &str = "the reference forces the drain of in-place updates and preservation with it; \
     neither is implemented here (a deletion's drain is forced by force-deletion or the drain timeout)";
const PRESERVE_WITHOUT_EXPIRY: &str = "machine preservation is not implemented yet: only a machine with \
     status.currentStatus.preserveExpiryTime in the future is kept; this one is treated as not preserved";

/// The per-machine settings of a template or machine (`prefix` is where `configuration` sits).
fn configuration(config: &MachineConfiguration, prefix: &str, out: &mut Vec<Ignored>) {
    if config.machine_preserve_timeout.is_some() {
        out.push(Ignored::new(
            format!("{prefix}.machinePreserveTimeout"),
            PRESERVE_TIMEOUT,
        ));
    }
    if config.in_place_update_timeout.is_some() {
        out.push(Ignored::new(
            format!("{prefix}.inPlaceUpdateTimeout"),
            IN_PLACE_TIMEOUT,
        ));
    }
}

fn auto_preserve(max: Option<i32>, out: &mut Vec<Ignored>) {
    if max.is_some_and(|max| max > 0) {
        out.push(Ignored::new("spec.autoPreserveFailedMachineMax", AUTO_PRESERVE));
    }
}

/// What the deployment sets that has no effect.
pub fn of_machine_deployment(deployment: &MachineDeployment) -> Vec<Ignored> {
    let mut out = Vec::new();
    auto_preserve(deployment.spec.auto_preserve_failed_machine_max, &mut out);
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
    auto_preserve(set.spec.auto_preserve_failed_machine_max, &mut out);
    configuration(
        &set.spec.template.spec.configuration,
        "spec.template.spec",
        &mut out,
    );
    out
}

/// The preserve value in effect on the machine: the one last applied from its node when there is one, else its own
/// `node.machine.sapcloud.io/preserve` annotation (reference §3.8: the node's value wins).
pub fn preserve_value(machine: &Machine) -> Option<&str> {
    let annotations = machine.metadata.annotations.as_ref()?;
    annotations
        .get(annotations::LAST_APPLIED_NODE_PRESERVE_VALUE)
        .filter(|v| !v.is_empty())
        .or_else(|| annotations.get(annotations::PRESERVE))
        .map(String::as_str)
}

/// Whether the machine asks for preservation (`now`, `when-failed`, `auto-preserved`) but has no
/// `preserveExpiryTime`: the reference would set one up; here preservation is not implemented yet, so the machine is
/// treated as not preserved (a Failed one is replaced) and this says so.
pub fn preservation_requested_without_expiry(machine: &Machine) -> bool {
    let has_expiry = machine
        .status
        .as_ref()
        .is_some_and(|s| s.current_status.preserve_expiry_time.is_some());
    !has_expiry && preserve_value(machine).is_some_and(|v| PRESERVE_VALUES.contains(&v))
}

/// What the machine sets that has no effect. `_now` is for the day an expiry decides more than presence.
pub fn of_machine(machine: &Machine, _now: Timestamp) -> Vec<Ignored> {
    let mut out = Vec::new();
    if preservation_requested_without_expiry(machine) {
        out.push(Ignored::new(
            format!("metadata.annotations[{}]", annotations::PRESERVE),
            PRESERVE_WITHOUT_EXPIRY,
        ));
    }
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

    fn machine(annotations: &serde_json::Value, status: &serde_json::Value) -> Machine {
        serde_json::from_value(json!({
            "metadata": { "name": "m", "annotations": annotations },
            "spec": { "class": { "kind": "MachineClass", "name": "c" } },
            "status": status
        }))
        .unwrap()
    }

    fn fields(ignored: &[Ignored]) -> Vec<&str> {
        ignored.iter().map(|i| i.field.as_str()).collect()
    }

    #[test]
    fn a_deployment_names_auto_preservation_and_the_template_timeouts() {
        assert!(of_machine_deployment(&deployment(&json!({}))).is_empty());
        // 0 is the reference's "off": nothing to warn about.
        assert!(of_machine_deployment(&deployment(&json!({ "autoPreserveFailedMachineMax": 0 }))).is_empty());
        let d = deployment(&json!({
            "autoPreserveFailedMachineMax": 2,
            "template": { "spec": {
                "class": { "kind": "MachineClass", "name": "c" },
                "machinePreserveTimeout": "1h",
                "inPlaceUpdateTimeout": "5m"
            } }
        }));
        let ignored = of_machine_deployment(&d);
        assert_eq!(
            fields(&ignored),
            [
                "spec.autoPreserveFailedMachineMax",
                "spec.template.spec.machinePreserveTimeout",
                "spec.template.spec.inPlaceUpdateTimeout"
            ]
        );
        assert!(
            summarize(&ignored).starts_with(
                "spec.autoPreserveFailedMachineMax: auto-preservation of Failed machines is not implemented yet"
            ),
            "{}",
            summarize(&ignored)
        );
    }

    #[test]
    fn a_set_names_auto_preservation() {
        let set: MachineSet = serde_json::from_value(json!({
            "metadata": { "name": "s" },
            "spec": { "replicas": 1, "autoPreserveFailedMachineMax": 1,
                      "template": { "spec": { "class": { "kind": "MachineClass", "name": "c" } } } }
        }))
        .unwrap();
        assert_eq!(
            fields(&of_machine_set(&set)),
            ["spec.autoPreserveFailedMachineMax"]
        );
    }

    #[test]
    fn a_preserve_annotation_without_expiry_is_named_and_one_with_expiry_is_not() {
        let now = Timestamp::from_second(1000).unwrap();
        for value in ["now", "when-failed", "auto-preserved"] {
            let m = machine(&json!({ annotations::PRESERVE: value }), &json!({}));
            assert!(preservation_requested_without_expiry(&m), "{value}");
            assert_eq!(
                fields(&of_machine(&m, now)),
                ["metadata.annotations[node.machine.sapcloud.io/preserve]"]
            );
        }
        let opted_out = machine(&json!({ annotations::PRESERVE: "false" }), &json!({}));
        assert!(of_machine(&opted_out, now).is_empty());
        let with_expiry = machine(
            &json!({ annotations::PRESERVE: "now" }),
            &json!({ "currentStatus": { "phase": "Failed", "preserveExpiryTime": "2030-01-01T00:00:00Z" } }),
        );
        assert!(of_machine(&with_expiry, now).is_empty());
        // The node's last applied value wins over the machine's own.
        let node_says_false = machine(
            &json!({ annotations::PRESERVE: "now", annotations::LAST_APPLIED_NODE_PRESERVE_VALUE: "false" }),
            &json!({}),
        );
        assert!(!preservation_requested_without_expiry(&node_says_false));
    }

    #[test]
    fn a_machine_names_the_force_drain_label_and_its_own_timeouts() {
        let mut m = machine(&json!({}), &json!({}));
        m.metadata.labels = Some([(labels::FORCE_DRAIN.to_owned(), "True".to_owned())].into());
        m.spec.configuration.machine_preserve_timeout = Some(mcm_api::GoDuration::new("1h"));
        assert_eq!(
            fields(&of_machine(&m, Timestamp::from_second(0).unwrap())),
            ["metadata.labels[force-drain]", "spec.machinePreserveTimeout"]
        );
    }
}
