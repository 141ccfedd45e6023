//! The reconcile order of spec 001 ("Behavior") as pure decisions: what the controller does next for an
//! `MCMMachine`, given what it read of the owner `Machine` and the `Cluster`. Nothing here does I/O; time comes in
//! as `now`.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mcm_api::MetaExt;
use mcm_core::retry_policy::{self, RetryClass};
use mcm_driver::{DriverError, DriverMethod, GetMachineStatusResponse, MachineCode};
use serde_json::Value;

use crate::types::{Condition, FINALIZER, MCMMachine, MCMMachineStatus};

/// The Cluster API group.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
/// The kind of Cluster API's `Machine`, the owner of an MCMMachine (not mcm-api's `Machine`).
pub const CAPI_MACHINE_KIND: &str = "Machine";
/// The annotation that pauses reconciliation of an object.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// The label naming an object's Cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The condition type of the overall state.
pub const READY: &str = "Ready";
/// The condition type of pausing.
pub const PAUSED: &str = "Paused";

/// What the controller read of the owner Cluster API `Machine`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineInfo {
    /// The Machine's name.
    pub name: String,
    /// `spec.clusterName`.
    pub cluster_name: Option<String>,
    /// `spec.bootstrap.dataSecretName`.
    pub data_secret_name: Option<String>,
    /// `spec.failureDomain`.
    pub failure_domain: Option<String>,
}

impl MachineInfo {
    /// Reads a Machine of either contract version (the fields are the same in v1beta1 and v1beta2).
    pub fn from_object(name: &str, data: &Value) -> Self {
        let text = |ptr: &str| {
            data.pointer(ptr)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Self {
            name: name.to_owned(),
            cluster_name: text("/spec/clusterName"),
            data_secret_name: text("/spec/bootstrap/dataSecretName"),
            failure_domain: text("/spec/failureDomain"),
        }
    }
}

/// What the controller read of the `Cluster`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterInfo {
    /// `spec.paused`.
    pub paused: bool,
    /// v1beta1 `status.infrastructureReady` or v1beta2 `status.initialization.infrastructureProvisioned`.
    pub infrastructure_ready: bool,
}

impl ClusterInfo {
    /// Reads a Cluster of either contract version.
    pub fn from_object(data: &Value) -> Self {
        let flag = |ptr: &str| data.pointer(ptr).and_then(Value::as_bool).unwrap_or(false);
        Self {
            paused: flag("/spec/paused"),
            infrastructure_ready: flag("/status/initialization/infrastructureProvisioned")
                || flag("/status/infrastructureReady"),
        }
    }
}

/// The name of the owner `Machine` (ownerReference kind `Machine` of group `cluster.x-k8s.io`), if any.
pub fn owner_machine_name(infra: &MCMMachine) -> Option<&str> {
    infra
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find_map(|owner| {
            let group = owner.api_version.split_once('/').map_or("", |(group, _)| group);
            (owner.kind == CAPI_MACHINE_KIND && group == CAPI_GROUP).then_some(owner.name.as_str())
        })
}

/// The Cluster's name: the Machine's `spec.clusterName`, else the label `cluster.x-k8s.io/cluster-name`.
pub fn cluster_name(infra: &MCMMachine, machine: Option<&MachineInfo>) -> Option<String> {
    machine.and_then(|m| m.cluster_name.clone()).or_else(|| {
        infra
            .metadata
            .label(CLUSTER_NAME_LABEL)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
    })
}

/// Whether the object carries the paused annotation.
pub fn has_paused_annotation(infra: &MCMMachine) -> bool {
    infra.metadata.annotation(PAUSED_ANNOTATION).is_some()
}

/// The next step of a reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Step {
    /// "If the resource does not have a `Machine` owner, exit the reconciliation".
    WaitForOwner,
    /// "If the resource has `status.failureReason` or `status.failureMessage` set, exit the reconciliation".
    Failed,
    /// "If the `Cluster` to which this resource belongs cannot be found, exit the reconciliation".
    WaitForCluster,
    /// The object or its Cluster is paused: set `Paused` True and do nothing else (deletion included).
    Paused,
    /// "Add the provider-specific finalizer, if needed".
    AddFinalizer,
    /// "If the associated `Cluster`'s `status.infrastructureReady` is `false`, exit the reconciliation".
    WaitForInfrastructure,
    /// "If the associated `Machine`'s `spec.bootstrap.dataSecretName` is `nil`, exit the reconciliation".
    WaitForBootstrapData,
    /// "Reconcile provider-specific machine infrastructure" with the bootstrap data of this secret.
    Provision {
        /// The bootstrap data secret's name.
        data_secret: String,
    },
    /// Already provisioned: nothing to do.
    Provisioned,
    /// Deleted resource: "Perform deletion of provider-specific machine infrastructure", then "Remove the
    /// provider-specific finalizer".
    Delete,
    /// Deleted resource without our finalizer: nothing to do.
    Gone,
}

/// Decides the next step in spec 001's order. `machine` is the owner Machine (None when there is no owner
/// reference or the Machine is not found); `cluster` the Cluster (None when not found).
pub fn decide(infra: &MCMMachine, machine: Option<&MachineInfo>, cluster: Option<&ClusterInfo>) -> Step {
    let paused = has_paused_annotation(infra) || cluster.is_some_and(|c| c.paused);
    if infra.metadata.is_deleting() {
        // The infrastructure-ready check "should not be blocking any further delete reconciliation flows"; nor does
        // a missing owner or Cluster: a VM we made is never leaked.
        return if paused {
            Step::Paused
        } else if infra.metadata.has_finalizer(FINALIZER) {
            Step::Delete
        } else {
            Step::Gone
        };
    }
    let Some(machine) = machine else {
        return Step::WaitForOwner;
    };
    let status = infra.status.as_ref();
    if status.is_some_and(|s| s.failure_reason.is_some() || s.failure_message.is_some()) {
        return Step::Failed;
    }
    let Some(cluster) = cluster else {
        return Step::WaitForCluster;
    };
    if paused {
        return Step::Paused;
    }
    if !infra.metadata.has_finalizer(FINALIZER) {
        return Step::AddFinalizer;
    }
    if !cluster.infrastructure_ready {
        return Step::WaitForInfrastructure;
    }
    let Some(data_secret) = machine.data_secret_name.clone() else {
        return Step::WaitForBootstrapData;
    };
    let provisioned =
        status.is_some_and(|s| s.ready) && infra.spec.provider_id.as_deref().is_some_and(|id| !id.is_empty());
    if provisioned {
        Step::Provisioned
    } else {
        Step::Provision { data_secret }
    }
}

/// How a provider error is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// Bad configuration: set `failureReason`/`failureMessage` and Ready=False; never call again.
    Terminal,
    /// Transient ("Auto Retry Required" Y): retry with back-off. The outcome may be unknown: the next attempt
    /// looks the VM up before creating one.
    Retry,
    /// Not transient but not the object's fault either (`ResourceExhausted`, `Canceled`): look again after the
    /// retry policy's resync.
    AwaitResync,
}

/// The class of an error of `method`, from the retry tables our machine controller uses (`retry_policy`): codes
/// marked Y are retried; `InvalidArgument` and the other codes marked N (or not listed) are terminal, except
/// `ResourceExhausted` (quota, capacity: it clears by itself) and `Canceled` (the outcome is unknown).
pub fn classify(method: DriverMethod, code: MachineCode) -> ErrorClass {
    match retry_policy::retry_class(method, code) {
        RetryClass::Auto => ErrorClass::Retry,
        RetryClass::AwaitChange if matches!(code, MachineCode::ResourceExhausted | MachineCode::Canceled) => {
            ErrorClass::AwaitResync
        }
        RetryClass::AwaitChange => ErrorClass::Terminal,
    }
}

/// What a VM lookup before creation found.
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub enum Lookup {
    /// The VM exists.
    Found(GetMachineStatusResponse),
    /// No VM: create one.
    Create,
    /// The lookup is not implemented: try `ListMachines`, else rely on `CreateMachine`'s idempotence.
    Unsupported,
    /// The recorded VM is gone: never create a second one for this object (spec 003, as `mcm_core::creation`).
    Vanished,
    /// The VM exists but is not initialized (spec 002 section 11): call `InitializeMachine`.
    Uninitialized,
    /// The lookup failed.
    Failed(DriverError),
}

/// Reads the answer of `GetMachineStatus` before creating; `recorded` is `spec.providerID`.
pub fn after_lookup(result: Result<GetMachineStatusResponse, DriverError>, recorded: Option<&str>) -> Lookup {
    match result {
        Ok(vm) => Lookup::Found(vm),
        Err(err) if err.code == MachineCode::NotFound => {
            if recorded.is_some_and(|id| !id.is_empty()) {
                Lookup::Vanished
            } else {
                Lookup::Create
            }
        }
        Err(err) if err.code == MachineCode::Unimplemented => Lookup::Unsupported,
        Err(err) if err.code == MachineCode::Uninitialized => Lookup::Uninitialized,
        Err(err) => Lookup::Failed(err),
    }
}

/// Sets a condition in `conditions`, keeping `lastTransitionTime` when the status does not change.
pub fn set_condition(conditions: &mut Vec<Condition>, mut condition: Condition, now: Timestamp) {
    let previous = conditions.iter().position(|c| c.type_ == condition.type_);
    let transition = previous
        .and_then(|i| {
            (conditions[i].status == condition.status).then(|| conditions[i].last_transition_time.clone())
        })
        .flatten();
    condition.last_transition_time = Some(transition.unwrap_or(Time(now)));
    match previous {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
}

/// A condition of this type, status, reason and message (severity `Error` for a False `Ready` with `error`).
pub fn condition(type_: &str, status: bool, reason: &str, message: &str, error: bool) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: Some(reason.to_owned()),
        message: (!message.is_empty()).then(|| message.to_owned()),
        last_transition_time: None,
        severity: (!status && type_ == READY).then(|| if error { "Error" } else { "Info" }.to_owned()),
    }
}

/// The status after a step that only reports (a wait, pausing, a terminal failure): `conditions` set on a copy of
/// `current`. `None` when nothing changes, so that a wait does not write.
pub fn with_conditions(
    current: Option<&MCMMachineStatus>,
    conditions: Vec<Condition>,
    now: Timestamp,
) -> Option<MCMMachineStatus> {
    let before = current.cloned().unwrap_or_default();
    let mut after = before.clone();
    for c in conditions {
        set_condition(&mut after.conditions, c, now);
    }
    (after != before).then_some(after)
}

/// The reason and message of the Ready condition while waiting at `step` (None for steps that are not waits).
pub fn wait_reason(step: &Step) -> Option<(&'static str, &'static str)> {
    match step {
        Step::WaitForCluster => Some(("WaitingForCluster", "the Cluster was not found")),
        Step::WaitForInfrastructure => Some((
            "WaitingForClusterInfrastructure",
            "the Cluster's infrastructure is not provisioned yet",
        )),
        Step::WaitForBootstrapData => Some((
            "WaitingForBootstrapData",
            "the Machine's spec.bootstrap.dataSecretName is not set yet",
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use serde_json::json;

    use super::*;

    fn infra() -> MCMMachine {
        let mut m = MCMMachine::default();
        m.metadata.name = Some("m".into());
        m
    }

    fn owned(mut m: MCMMachine) -> MCMMachine {
        m.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Machine".into(),
            name: "owner".into(),
            uid: "u".into(),
            ..OwnerReference::default()
        }]);
        m
    }

    fn machine(data_secret: Option<&str>) -> MachineInfo {
        MachineInfo {
            name: "owner".into(),
            cluster_name: Some("c".into()),
            data_secret_name: data_secret.map(str::to_owned),
            failure_domain: None,
        }
    }

    const READY_CLUSTER: ClusterInfo = ClusterInfo {
        paused: false,
        infrastructure_ready: true,
    };

    #[test]
    fn order_of_spec_001() {
        let m = infra();
        assert_eq!(owner_machine_name(&m), None);
        assert_eq!(decide(&m, None, Some(&READY_CLUSTER)), Step::WaitForOwner);
        let m = owned(m);
        assert_eq!(owner_machine_name(&m), Some("owner"));
        assert_eq!(decide(&m, Some(&machine(Some("s"))), None), Step::WaitForCluster);
        assert_eq!(
            decide(&m, Some(&machine(Some("s"))), Some(&READY_CLUSTER)),
            Step::AddFinalizer
        );
        let mut m = m;
        m.metadata.finalizers = Some(vec![FINALIZER.into()]);
        let not_ready = ClusterInfo {
            paused: false,
            infrastructure_ready: false,
        };
        assert_eq!(
            decide(&m, Some(&machine(Some("s"))), Some(&not_ready)),
            Step::WaitForInfrastructure
        );
        assert_eq!(
            decide(&m, Some(&machine(None)), Some(&READY_CLUSTER)),
            Step::WaitForBootstrapData
        );
        assert_eq!(
            decide(&m, Some(&machine(Some("s"))), Some(&READY_CLUSTER)),
            Step::Provision {
                data_secret: "s".into()
            }
        );
        m.spec.provider_id = Some("sim:///x".into());
        m.status = Some(MCMMachineStatus {
            ready: true,
            ..MCMMachineStatus::default()
        });
        assert_eq!(
            decide(&m, Some(&machine(Some("s"))), Some(&READY_CLUSTER)),
            Step::Provisioned
        );
    }

    #[test]
    fn a_failure_stops_before_the_cluster_is_looked_at() {
        let mut m = owned(infra());
        m.status = Some(MCMMachineStatus {
            failure_reason: Some("InvalidConfiguration".into()),
            ..MCMMachineStatus::default()
        });
        assert_eq!(decide(&m, Some(&machine(Some("s"))), None), Step::Failed);
    }

    #[test]
    fn deletion_is_not_blocked_by_infrastructure_or_owner_but_by_pause() {
        let mut m = infra();
        m.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(decide(&m, None, None), Step::Gone);
        m.metadata.finalizers = Some(vec![FINALIZER.into()]);
        let not_ready = ClusterInfo {
            paused: false,
            infrastructure_ready: false,
        };
        assert_eq!(decide(&m, None, Some(&not_ready)), Step::Delete);
        let paused = ClusterInfo {
            paused: true,
            infrastructure_ready: true,
        };
        assert_eq!(decide(&m, None, Some(&paused)), Step::Paused);
    }

    #[test]
    fn paused_annotation_or_cluster_pauses() {
        let mut m = owned(infra());
        m.metadata.annotations = Some([(PAUSED_ANNOTATION.to_owned(), String::new())].into());
        assert_eq!(
            decide(&m, Some(&machine(Some("s"))), Some(&READY_CLUSTER)),
            Step::Paused
        );
    }

    #[test]
    fn cluster_of_either_contract() {
        assert!(
            ClusterInfo::from_object(&json!({"status": {"infrastructureReady": true}})).infrastructure_ready
        );
        assert!(
            ClusterInfo::from_object(
                &json!({"status": {"initialization": {"infrastructureProvisioned": true}}})
            )
            .infrastructure_ready
        );
        assert!(ClusterInfo::from_object(&json!({"spec": {"paused": true}})).paused);
    }

    #[test]
    fn classes_follow_the_retry_tables() {
        assert_eq!(
            classify(DriverMethod::CreateMachine, MachineCode::InvalidArgument),
            ErrorClass::Terminal
        );
        assert_eq!(
            classify(DriverMethod::CreateMachine, MachineCode::OutOfRange),
            ErrorClass::Terminal
        );
        assert_eq!(
            classify(DriverMethod::CreateMachine, MachineCode::Unavailable),
            ErrorClass::Retry
        );
        assert_eq!(
            classify(DriverMethod::CreateMachine, MachineCode::DeadlineExceeded),
            ErrorClass::Retry
        );
        assert_eq!(
            classify(DriverMethod::CreateMachine, MachineCode::ResourceExhausted),
            ErrorClass::AwaitResync
        );
    }

    #[test]
    fn a_vanished_vm_is_never_created_again() {
        let nf = Err(DriverError::not_found("no VM"));
        assert_eq!(after_lookup(nf.clone(), None), Lookup::Create);
        assert_eq!(after_lookup(nf, Some("sim:///a")), Lookup::Vanished);
    }

    #[test]
    fn transition_time_kept_while_status_unchanged() {
        let t0 = Timestamp::UNIX_EPOCH;
        let t1 = t0 + jiff::SignedDuration::from_secs(10);
        let mut cs = Vec::new();
        set_condition(&mut cs, condition(READY, false, "A", "", false), t0);
        set_condition(&mut cs, condition(READY, false, "B", "", false), t1);
        assert_eq!(cs[0].last_transition_time, Some(Time(t0)));
        set_condition(&mut cs, condition(READY, true, "C", "", false), t1);
        assert_eq!(cs[0].last_transition_time, Some(Time(t1)));
    }
}
