//! Well-known finalizer, label, annotation and taint keys, and userData placeholders.
//!
//! Every key of the reference (reference/mcm-inventory.md section 9) is here under the same string, so that
//! manifests, cluster-autoscaler and other tools written for the reference keep working. Keys this project adds
//! are in [`extensions`] and say so.

/// Finalizers.
pub mod finalizers {
    /// On Machine, MachineClass, MachineSet and MachineDeployment: the controllers still have work to do before the
    /// object may go.
    pub const MACHINE_CONTROLLER_MANAGER: &str = "machine.sapcloud.io/machine-controller-manager";
    /// On a Node backed by a machine: the node is not removed before its machine's deletion flow removed it.
    pub const NODE: &str = "node.machine.sapcloud.io/machine-controller";
    /// On a Secret referenced by a MachineClass: the secret stays while a class needs it.
    pub const SECRET: &str = "machine.sapcloud.io/machine-controller";
}

/// Labels.
pub mod labels {
    /// On a Machine: the name of its node; the machine-to-node link and the `Node` printer column.
    pub const NODE: &str = "node";
    /// On a Machine (from its template): the MachineDeployment name; the remediation key and a metric label.
    pub const NAME: &str = "name";
    /// On a MachineSet and its machines: the hash of the deployment's template that made them.
    pub const MACHINE_TEMPLATE_HASH: &str = "machine-template-hash";
    /// On a Machine: `true` (Go ParseBool) forces the drain and the deletion.
    pub const FORCE_DELETION: &str = "force-deletion";
    /// On a Machine: `True` forces the drain (in-place update and preservation).
    pub const FORCE_DRAIN: &str = "force-drain";
    /// On a MachineSet or MachineDeployment: `True` when the safety controller froze it.
    pub const FREEZE: &str = "freeze";
    /// On an old MachineSet during an in-place update: it must not scale up.
    pub const SCALE_UP_DISABLED: &str = "node.machine.sapcloud.io/scale-up-disabled";
    /// On a Node: the name of its machine.
    pub const NODE_MACHINE_NAME: &str = "node.gardener.cloud/machine-name";
    /// On a Node: candidate for an in-place update.
    pub const CANDIDATE_FOR_UPDATE: &str = "node.machine.sapcloud.io/candidate-for-update";
    /// On a Node: selected for an in-place update.
    pub const SELECTED_FOR_UPDATE: &str = "node.machine.sapcloud.io/selected-for-update";
    /// On a Node: `successful` or `failed`, the result of an in-place update.
    pub const UPDATE_RESULT: &str = "node.machine.sapcloud.io/update-result";
}

/// Annotations.
pub mod annotations {
    /// On a Machine: deletion priority; default `3`, and `1` means delete first.
    pub const MACHINE_PRIORITY: &str = "machinepriority.machine.sapcloud.io";
    /// The default value of [`MACHINE_PRIORITY`].
    pub const MACHINE_PRIORITY_DEFAULT: &str = "3";
    /// On a Machine: RFC 3339 time at which it was marked for deletion (cluster-autoscaler handshake).
    pub const MARKED_FOR_DELETION_TIME: &str = "machine.sapcloud.io/marked-for-deletion-time";
    /// On a MachineDeployment, copied to its MachineSets: RFC 3339 time of the last replica change by the autoscaler.
    pub const LAST_REPLICA_CHANGE_BY_SCALER_TIME: &str =
        "machine.sapcloud.io/last-deployment-replica-change-by-scaler-time";
    /// On a MachineDeployment: `machine~time,...`, the machines the cluster-autoscaler asks to delete.
    pub const TRIGGER_DELETION_BY_MCM: &str = "node.machine.sapcloud.io/trigger-deletion-by-mcm";
    /// On a MachineDeployment, MachineSet or Machine: Go duration overriding the creation timeout.
    pub const EFFECTIVE_CREATION_TIMEOUT: &str = "node.machine.sapcloud.io/effective-creation-timeout";
    /// On a Machine: Go duration the machine took to join.
    pub const MACHINE_JOIN_DURATION: &str = "node.machine.sapcloud.io/machine-join-duration";
    /// On a Node or Machine: `now`, `when-failed`, `auto-preserved` or `false` (preservation).
    pub const PRESERVE: &str = "node.machine.sapcloud.io/preserve";
    /// On a Machine: the preserve value last applied from its node.
    pub const LAST_APPLIED_NODE_PRESERVE_VALUE: &str =
        "node.machine.sapcloud.io/last-applied-node-preserve-value";
    /// On a Node: JSON of the labels, annotations and taints last applied from the node template.
    pub const LAST_APPLIED_ANNO_LABELS_TAINTS: &str =
        "node.machine.sapcloud.io/last-applied-anno-labels-taints";
    /// On a Node: JSON of the virtual capacity last applied from the class.
    pub const LAST_APPLIED_VIRTUAL_CAPACITY: &str = "node.machine.sapcloud.io/last-applied-virtual-capacity";
    /// On a Node: `1` when no machine manages it; the controllers leave it alone.
    pub const NOT_MANAGED_BY_MCM: &str = "node.machine.sapcloud.io/not-managed-by-mcm";
    /// On a Node: why an in-place update failed.
    pub const UPDATE_FAILED_REASON: &str = "node.machine.sapcloud.io/update-failed-reason";
    /// On a Node of an in-place update (ours; the reference has none): JSON `{"class": <name>, "nodeTemplate":
    /// <the class's nodeTemplate>}`, what the node is to be updated to, written by the MachineDeployment controller
    /// with `candidate-for-update`. A node agent may read only its own Node, not the MachineClass.
    pub const IN_PLACE_UPDATE_TARGET: &str = "node.machine.sapcloud.io/in-place-update-target";
    /// On a Node: `true` keeps the cluster-autoscaler from scaling it down.
    pub const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
    /// On a Node: `true` when [`SCALE_DOWN_DISABLED`] was set by the controllers (and is theirs to remove).
    pub const SCALE_DOWN_DISABLED_BY_MCM: &str =
        "cluster-autoscaler.kubernetes.io/scale-down-disabled-by-mcm";
    /// On MachineSets and MachineDeployments: the revision, with Kubernetes Deployment semantics.
    pub const REVISION: &str = "deployment.kubernetes.io/revision";
    /// On MachineSets: earlier revisions of the same template.
    pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
    /// On MachineSets: the deployment's desired replicas.
    pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
    /// On MachineSets: desired replicas plus max surge.
    pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
    /// On an old MachineSet during a rollout: its nodes get the PreferNoSchedule taint of the same key.
    pub const PREFER_NO_SCHEDULE: &str = "deployment.machine.sapcloud.io/prefer-no-schedule";
    /// On a MachineSet or MachineDeployment: `True` unfreezes it by hand.
    pub const UNFREEZE: &str = "safety.machine.sapcloud.io/unfreeze";
    /// On a provider-specific class (e.g. `AWSMachineClass`) that was migrated to a `MachineClass` of the same name;
    /// the value is `machine-controller-<Kind>` as in the reference.
    pub const MIGRATED_MACHINE_CLASS: &str = "machine.sapcloud.io/migrated";
}

/// Taints.
pub mod taints {
    /// Read: while a node has it, its machine stays Pending rather than Running.
    pub const CRITICAL_COMPONENTS_NOT_READY: &str = "node.gardener.cloud/critical-components-not-ready";
    /// `NoSchedule` on the node of a preserved Failed machine.
    pub const PRESERVED: &str = "node.machine.sapcloud.io/preserved";
    /// `True:PreferNoSchedule` on the nodes of old machine sets during a rollout.
    pub const PREFER_NO_SCHEDULE: &str = super::annotations::PREFER_NO_SCHEDULE;
}

/// Node condition types the controllers write.
pub mod node_conditions {
    /// On the node of a preserved machine: `True` while preserved (a Failed machine's node once drained), `False`
    /// with reason `Preservation stopped.` afterwards.
    pub const PRESERVED: &str = "Preserved";
    /// On a node of an in-place update: the step it is at, as one of the [`super::in_place_update`] reasons.
    pub const IN_PLACE_UPDATE: &str = "InPlaceUpdate";
}

/// The in-place update protocol (strategy `InPlaceUpdate`): the reasons of the `InPlaceUpdate` node condition, in
/// the order a node goes through them, and the values of the `update-result` node label.
pub mod in_place_update {
    /// The node carries `candidate-for-update` (its machine set is old).
    pub const CANDIDATE_FOR_UPDATE: &str = "CandidateForUpdate";
    /// The node carries `selected-for-update`: the machine controller drains it.
    pub const SELECTED_FOR_UPDATE: &str = "SelectedForUpdate";
    /// The drain is done; the machine is `InPlaceUpdating`.
    pub const DRAIN_SUCCESSFUL: &str = "DrainSuccessful";
    /// The node agent may now update the node.
    pub const READY_FOR_UPDATE: &str = "ReadyForUpdate";
    /// The node agent reported `update-result=successful`.
    pub const UPDATE_SUCCESSFUL: &str = "UpdateSuccessful";
    /// The node agent reported `update-result=failed` (the message carries `update-failed-reason`).
    pub const UPDATE_FAILED: &str = "UpdateFailed";
    /// `update-result` value: the update succeeded.
    pub const RESULT_SUCCESSFUL: &str = "successful";
    /// `update-result` value: the update failed.
    pub const RESULT_FAILED: &str = "failed";
}

/// Placeholders and keys of the boot secret.
pub mod user_data {
    /// The secret key holding the boot script.
    pub const KEY: &str = "userData";
    /// Replaced with the bootstrap token created for the machine.
    pub const BOOTSTRAP_TOKEN_PLACEHOLDER: &str = "<<BOOTSTRAP_TOKEN>>";
    /// Replaced with the machine's name.
    pub const MACHINE_NAME_PLACEHOLDER: &str = "<<MACHINE_NAME>>";
}

/// Tag prefixes providers put on VMs to tell the cluster and role (read by ListMachines, so by orphan collection).
pub mod vm_tags {
    /// `kubernetes.io/cluster/<cluster>`.
    pub const CLUSTER_PREFIX: &str = "kubernetes.io/cluster/";
    /// `kubernetes.io/role/<role>`.
    pub const ROLE_PREFIX: &str = "kubernetes.io/role/";
    /// The same for providers that forbid `/` in tag keys.
    pub const CLUSTER_PREFIX_DASHED: &str = "kubernetes-io-cluster-";
    /// The same for providers that forbid `/` in tag keys.
    pub const ROLE_PREFIX_DASHED: &str = "kubernetes-io-role-";
}

/// Keys this project adds to the reference's, modelled on Cluster API where it has an equivalent.
pub mod extensions {
    /// Annotation prefix on a Machine: each such annotation holds deletion before the drain until it is removed
    /// (Cluster API: `pre-drain.delete.hook.machine.cluster.x-k8s.io/`).
    pub const PRE_DRAIN_HOOK_PREFIX: &str = "pre-drain.delete.hook.machine.sapcloud.io/";
    /// Annotation prefix on a Machine: each such annotation holds deletion before the VM is deleted until it is
    /// removed (Cluster API: `pre-terminate.delete.hook.machine.cluster.x-k8s.io/`).
    pub const PRE_TERMINATE_HOOK_PREFIX: &str = "pre-terminate.delete.hook.machine.sapcloud.io/";
    /// Annotation on a MachineSet or MachineDeployment: `Random`, `Newest` or `Oldest` picks which machines go first
    /// on scale-down (Cluster API's delete policies).
    pub const DELETE_POLICY: &str = "machine.sapcloud.io/delete-policy";
    /// Pod label: `skip` leaves the pod alone during a drain, `wait-completed` waits for it to finish.
    pub const DRAIN_LABEL: &str = "drain.machine.sapcloud.io";
    /// Node annotation, value `"true"`: the node's kubelet (the sim kubelet, a node agent) ends the node's deleting
    /// pods itself, so the embedded API server leaves them to it while the node's Lease is fresh.
    pub const AGENT_TERMINATES_PODS: &str = "node.machine.sapcloud.io/agent-terminates-pods";
}

/// Kubernetes' own well-known node keys and names, as kubelet and cloud providers write them: the node reporters
/// (the sim kubelet, `mcm node-agent`) set them, the controllers and the embedded API server read them.
pub mod kubernetes {
    /// Node label: the node's host name (kubelet sets the node name).
    pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
    /// Node label: the operating system, as Go names it (`linux`).
    pub const OS_LABEL: &str = "kubernetes.io/os";
    /// Node label: the architecture, as Go names it (`amd64`, `arm64`).
    pub const ARCH_LABEL: &str = "kubernetes.io/arch";
    /// Node label: the VM's instance type (size); a metric label of the machine steps.
    pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
    /// Node label: the zone; a metric label of the machine steps.
    pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
    /// The namespace of the node Leases, which kubelets renew as their heartbeat.
    pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
}
