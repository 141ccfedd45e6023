//! The machine step gauges (create, initialize, join, drain, delete) and the failed-join counter, set by the machine
//! controller as each step completes, labelled by deployment and placement (instance type, zone).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use mcm_api::{
    Machine, MachineClass, keys,
    keys::kubernetes::{INSTANCE_TYPE_LABEL, ZONE_LABEL},
};

use super::{
    Metrics,
    labels::{DrainLabels, StepLabels},
};

/// A step of a machine whose duration is gauged (reference `MachineDurations`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MachineStep {
    /// Creation: from the machine's creationTimestamp until the creation flow wrote phase Pending (or Available
    /// without a target cluster), i.e. after CreateMachine (and InitializeMachine) returned OK.
    Create,
    /// The InitializeMachine call that returned OK (not recorded when the provider does not implement it).
    Initialize,
    /// From the machine's creationTimestamp until it first turned Running (its node joined and is healthy).
    Join,
    /// From the first drain pass until the drain finished (a successful drain, or a force drain that ended).
    Drain,
    /// From the machine's deletionTimestamp until DeleteMachine returned OK (or NotFound).
    Delete,
}

/// `later - earlier` as a duration, zero when `later` is not after `earlier`.
pub fn elapsed(earlier: jiff::Timestamp, later: jiff::Timestamp) -> Duration {
    Duration::try_from(later.duration_since(earlier)).unwrap_or(Duration::ZERO)
}

/// Instance type and zone of a machine for the step metrics: the node's well-known labels
/// (`node.kubernetes.io/instance-type`, `topology.kubernetes.io/zone`) when the node is known; else, as the reference
/// labels `mcm_machine_num_failed_join`, the class's `nodeTemplate.instanceType` and the zone label of the machine's
/// `spec.nodeTemplate` (then the class's `nodeTemplate.zone`); else empty.
pub fn placement(machine: &Machine, node: Option<&Node>, class: Option<&MachineClass>) -> (String, String) {
    let node_label = |key: &str| {
        node.and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    let template = class.and_then(|c| c.node_template.as_ref());
    let instance_type = node_label(INSTANCE_TYPE_LABEL)
        .or_else(|| template.map(|t| t.instance_type.clone()))
        .unwrap_or_default();
    let zone = node_label(ZONE_LABEL)
        .or_else(|| {
            machine
                .spec
                .node_template
                .as_ref()
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.labels.as_ref())
                .and_then(|l| l.get(ZONE_LABEL))
                .filter(|v| !v.is_empty())
                .cloned()
        })
        .or_else(|| template.map(|t| t.zone.clone()))
        .unwrap_or_default();
    (instance_type, zone)
}

impl Metrics {
    /// Sets the gauge of `step` for the machine's deployment (its `name` label) to `took`, rounded to whole seconds
    /// as the reference rounds it (`Duration.Round(time.Second)`). A machine without a `name` label belongs to no
    /// deployment and is not recorded (as in the reference).
    pub fn machine_step(
        &self,
        step: MachineStep,
        machine: &Machine,
        node: Option<&Node>,
        class: Option<&MachineClass>,
        took: Duration,
    ) {
        let Some(labels) = Self::step_labels(machine, node, class) else {
            return;
        };
        let seconds = rounded_seconds(took);
        let family = match step {
            MachineStep::Create => &self.steps.create,
            MachineStep::Initialize => &self.steps.initialize,
            MachineStep::Join => &self.steps.join,
            MachineStep::Delete => &self.steps.delete,
            MachineStep::Drain => {
                self.steps
                    .drain
                    .get_or_create(&DrainLabels {
                        namespace: labels.namespace,
                        machine_deployment: labels.machine_deployment,
                    })
                    .set(seconds);
                return;
            }
        };
        family.get_or_create(&labels).set(seconds);
    }

    /// Counts a machine of a deployment that did not join within the creation timeout
    /// (`mcm_machine_num_failed_join`).
    pub fn machine_failed_join(&self, machine: &Machine, node: Option<&Node>, class: Option<&MachineClass>) {
        if let Some(labels) = Self::step_labels(machine, node, class) {
            self.steps.failed_join.get_or_create(&labels).inc();
        }
    }

    fn step_labels(
        machine: &Machine,
        node: Option<&Node>,
        class: Option<&MachineClass>,
    ) -> Option<StepLabels> {
        let deployment = machine
            .labels()
            .get(keys::labels::NAME)
            .filter(|n| !n.is_empty())?
            .clone();
        let (instance_type, zone) = placement(machine, node, class);
        Some(StepLabels {
            namespace: machine.namespace().unwrap_or_default(),
            machine_deployment: deployment,
            instance_type,
            zone,
        })
    }
}

/// `took` in whole seconds, halves away from zero (Go's `Duration.Round(time.Second).Seconds()`).
pub(super) fn rounded_seconds(took: Duration) -> f64 {
    took.as_secs_f64().round()
}
