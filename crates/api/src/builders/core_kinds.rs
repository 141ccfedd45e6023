//! [`NodeBuilder`] and [`PodBuilder`]: the core/v1 objects the controllers read besides the machine kinds.

use k8s_openapi::{
    api::core::v1::{
        AttachedVolume, Container, Node, NodeCondition, NodeSpec, NodeStatus,
        PersistentVolumeClaimVolumeSource, Pod, PodCondition, PodSpec, PodStatus, Taint, Volume,
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};

use super::meta::builder;

builder!(
    /// Builds a [`Node`]: `NodeBuilder::new("n1").label("k", "v").condition("Ready", "True", Some(at)).build()`.
    /// Spec and status exist as soon as one call touches them, and not before.
    NodeBuilder,
    node: Node
);

impl NodeBuilder {
    /// Adds a condition of `type_` with `status` (`True`, `False`, `Unknown`), last changed at `since`.
    #[must_use]
    pub fn condition(self, type_: &str, status: &str, since: Option<Timestamp>) -> Self {
        self.with_condition(NodeCondition {
            last_transition_time: since.map(Time),
            ..node_condition(type_, status)
        })
    }

    /// Adds a condition as a kubelet posts it: `type_` with `status` and `reason`, its heartbeat at `heartbeat`
    /// (`lastHeartbeatTime`, what the node lifecycle controller reads) and no transition time.
    #[must_use]
    pub fn heartbeat(self, type_: &str, status: &str, reason: &str, heartbeat: Timestamp) -> Self {
        self.with_condition(NodeCondition {
            reason: Some(reason.to_owned()),
            last_heartbeat_time: Some(Time(heartbeat)),
            ..node_condition(type_, status)
        })
    }

    /// Sets the conditions to exactly `conditions`.
    #[must_use]
    pub fn conditions(mut self, conditions: Vec<NodeCondition>) -> Self {
        self.status_mut().conditions = Some(conditions);
        self
    }

    /// Adds a taint.
    #[must_use]
    pub fn taint(mut self, key: &str, value: Option<&str>, effect: &str) -> Self {
        self.spec_mut().taints.get_or_insert_default().push(Taint {
            key: key.to_owned(),
            value: value.map(str::to_owned),
            effect: effect.to_owned(),
            time_added: None,
        });
        self
    }

    /// Sets `spec.providerID`.
    #[must_use]
    pub fn provider_id(mut self, id: &str) -> Self {
        self.spec_mut().provider_id = Some(id.to_owned());
        self
    }

    /// Reports a volume attached (`status.volumesAttached`), as a node does until its volumes are detached.
    #[must_use]
    pub fn attached_volume(mut self, name: &str) -> Self {
        self.status_mut()
            .volumes_attached
            .get_or_insert_default()
            .push(AttachedVolume {
                name: name.to_owned(),
                device_path: String::new(),
            });
        self
    }

    /// Replaces the whole spec (`NodeSpec::default()` for a present, empty one).
    #[must_use]
    pub fn spec(mut self, spec: NodeSpec) -> Self {
        self.node.spec = Some(spec);
        self
    }

    /// Replaces the whole status (`NodeStatus::default()` for a present, empty one).
    #[must_use]
    pub fn status(mut self, status: NodeStatus) -> Self {
        self.node.status = Some(status);
        self
    }

    fn with_condition(mut self, condition: NodeCondition) -> Self {
        self.status_mut()
            .conditions
            .get_or_insert_default()
            .push(condition);
        self
    }

    fn spec_mut(&mut self) -> &mut NodeSpec {
        self.node.spec.get_or_insert_default()
    }

    fn status_mut(&mut self) -> &mut NodeStatus {
        self.node.status.get_or_insert_default()
    }
}

/// A node condition of `type_` with `status` and nothing else.
fn node_condition(type_: &str, status: &str) -> NodeCondition {
    NodeCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        ..NodeCondition::default()
    }
}

builder!(
    /// Builds a [`Pod`]: `PodBuilder::new("web").namespace("default").node("n1").priority(10).build()`.
    PodBuilder,
    pod: Pod
);

impl PodBuilder {
    /// Schedules the pod on `node` (`spec.nodeName`).
    #[must_use]
    pub fn node(mut self, node: &str) -> Self {
        self.spec_mut().node_name = Some(node.to_owned());
        self
    }

    /// Adds a container `name` running `image` (the API server stores no pod without one).
    #[must_use]
    pub fn container(mut self, name: &str, image: &str) -> Self {
        self.spec_mut().containers.push(Container {
            name: name.to_owned(),
            image: Some(image.to_owned()),
            ..Container::default()
        });
        self
    }

    /// Sets `spec.terminationGracePeriodSeconds`: how long the pod may take to stop once deleted.
    #[must_use]
    pub fn grace_period(mut self, seconds: i64) -> Self {
        self.spec_mut().termination_grace_period_seconds = Some(seconds);
        self
    }

    /// Sets `spec.priority`.
    #[must_use]
    pub fn priority(mut self, priority: i32) -> Self {
        self.spec_mut().priority = Some(priority);
        self
    }

    /// Mounts the PersistentVolumeClaim `claim` (a volume named `vol-<claim>`).
    #[must_use]
    pub fn claim(mut self, claim: &str) -> Self {
        self.spec_mut().volumes.get_or_insert_default().push(Volume {
            name: format!("vol-{claim}"),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.to_owned(),
                read_only: None,
            }),
            ..Volume::default()
        });
        self
    }

    /// Sets `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`).
    #[must_use]
    pub fn phase(mut self, phase: &str) -> Self {
        self.status_mut().phase = Some(phase.to_owned());
        self
    }

    /// Adds a pod condition: `Ready` `True` is what a disruption budget counts as healthy.
    #[must_use]
    pub fn condition(mut self, type_: &str, status: &str) -> Self {
        self.status_mut()
            .conditions
            .get_or_insert_default()
            .push(PodCondition {
                type_: type_.to_owned(),
                status: status.to_owned(),
                ..PodCondition::default()
            });
        self
    }

    fn spec_mut(&mut self) -> &mut PodSpec {
        self.pod.spec.get_or_insert_default()
    }

    fn status_mut(&mut self) -> &mut PodStatus {
        self.pod.status.get_or_insert_default()
    }
}
