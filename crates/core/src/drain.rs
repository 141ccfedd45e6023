//! The pure parts of a node drain (reference §4, `pkg/util/provider/drain`): whether a drain is forced and why, how
//! many eviction attempts it makes, which pods it evicts and in which order, which PodDisruptionBudgets guard a pod,
//! which volumes to wait for after a pod is evicted, and the messages that describe how a drain went.
//!
//! The controller lists what a drain needs from its caches (pods bound to the node, PodDisruptionBudgets,
//! PersistentVolumeClaims, VolumeAttachments, the node), calls these functions, and evicts: pods in
//! [`DrainPlan::parallel`] at once, pods in [`DrainPlan::serial`] one at a time, each followed by the wait for its
//! volumes ([`pvs_to_track`], [`volumes_detached`], [`volume_reattached`]). A force drain ([`DrainMode::force`])
//! deletes [`DrainPlan::force_deletions`] with grace period 0 and waits for nothing. The outcome is reported as a
//! [`DrainOutcome`], whose text goes into the machine's `lastOperation` through [`crate::deletion`].
//!
//! Rules quoted from the reference, and where this module differs, are on each function; the summary is in
//! `docs/machine-deletion-decisions.md`.

use std::{cmp::Reverse, collections::BTreeMap, fmt, time::Duration};

use jiff::Timestamp;
use k8s_openapi::{
    api::{
        core::v1::{Node, NodeCondition, Pod},
        policy::v1::PodDisruptionBudget,
        storage::v1::VolumeAttachment,
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement},
};
use mcm_api::{
    GoDuration, Machine,
    keys::{extensions, labels},
};

use crate::timeouts::{self, EffectiveSettings};

/// A force drain gives up after this long (reference: `timeOutDuration = 1 * time.Minute` under force).
pub const FORCE_TIMEOUT: Duration = Duration::from_mins(1);
/// A force drain tries each eviction once (reference: `maxEvictRetries = 1` under force).
pub const FORCE_MAX_EVICT_RETRIES: u32 = 1;
/// Extra time to wait for an evicted pod to go, on top of its grace period (reference: `+ 30s`).
pub const POD_GONE_SLACK: Duration = Duration::from_secs(30);
/// Annotation of mirror pods (static pods shown by the kubelet); they are never evicted.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Value of [`extensions::DRAIN_LABEL`] that leaves a pod alone.
pub const DRAIN_SKIP: &str = "skip";
/// Value of [`extensions::DRAIN_LABEL`] that waits for a pod to finish instead of evicting it.
pub const DRAIN_WAIT_COMPLETED: &str = "wait-completed";
/// Default grace period of a pod without `terminationGracePeriodSeconds` (Kubernetes' default).
const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);
const READY: &str = "Ready";
const READONLY_FILESYSTEM: &str = "ReadonlyFilesystem";

fn go(duration: Duration) -> String {
    GoDuration::from_std(duration).0
}

// ---------------------------------------------------------------------------------------------------------------
// Force rules and the drain mode
// ---------------------------------------------------------------------------------------------------------------

/// Why a drain is forced (pods deleted with grace period 0, PodDisruptionBudgets not honoured, no waiting).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForceReason {
    /// The machine has the label `force-deletion` with a value that parses as true.
    Label {
        /// The label's value as written.
        value: String,
    },
    /// The drain timeout has passed since the machine's deletion timestamp.
    DrainTimeout {
        /// The effective drain timeout.
        timeout: Duration,
    },
    /// The node's `Ready` condition has not been `True` for at least `after`.
    NodeNotReady {
        /// The force-drain period (5m).
        after: Duration,
    },
    /// The node's `ReadonlyFilesystem` condition has not been `False` for at least `after`.
    ReadonlyFilesystem {
        /// The force-drain period (5m).
        after: Duration,
    },
}

impl fmt::Display for ForceReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Label { value } => {
                write!(f, "the machine has the label {}={value}", labels::FORCE_DELETION)
            }
            Self::DrainTimeout { timeout } => {
                write!(
                    f,
                    "the drain timeout of {} has passed since the deletion",
                    go(*timeout)
                )
            }
            Self::NodeNotReady { after } => write!(f, "the node has not been Ready for {}", go(*after)),
            Self::ReadonlyFilesystem { after } => {
                write!(f, "the node's filesystem has been read-only for {}", go(*after))
            }
        }
    }
}

/// Go's `strconv.ParseBool`: `1 t T TRUE true True` are true, `0 f F FALSE false False` are false, anything else is
/// not a boolean.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The machine's `force-deletion` label, if it parses as true.
fn force_label(machine: &Machine) -> Option<ForceReason> {
    let value = machine.metadata.labels.as_ref()?.get(labels::FORCE_DELETION)?;
    (parse_bool(value) == Some(true)).then(|| ForceReason::Label { value: value.clone() })
}

/// When the condition of `type_` has been unhealthy since (its `lastTransitionTime`), if it is present and
/// unhealthy: `Ready` unless `True`, `ReadonlyFilesystem` unless `False`. A condition without a transition time gives
/// no instant and so never forces a drain (the reference reads Go's zero time there, i.e. "forever").
fn unhealthy_since(conditions: &[NodeCondition], type_: &str) -> Option<Timestamp> {
    let condition = conditions.iter().find(|c| c.type_ == type_)?;
    let healthy = if type_ == READY { "True" } else { "False" };
    if condition.status == healthy {
        return None;
    }
    condition.last_transition_time.as_ref().map(|t| t.0)
}

/// The instants at which each force rule that depends on time fires, with the reason it gives.
fn force_deadlines(
    machine: &Machine,
    conditions: &[NodeCondition],
    settings: &EffectiveSettings,
) -> Vec<(Timestamp, ForceReason)> {
    let after = settings.force_drain_unhealthy_after;
    let mut deadlines = Vec::new();
    if let Some(deleted) = machine.metadata.deletion_timestamp.as_ref() {
        deadlines.push((
            timeouts::add(deleted.0, settings.drain_timeout),
            ForceReason::DrainTimeout {
                timeout: settings.drain_timeout,
            },
        ));
    }
    if let Some(since) = unhealthy_since(conditions, READY) {
        deadlines.push((timeouts::add(since, after), ForceReason::NodeNotReady { after }));
    }
    if let Some(since) = unhealthy_since(conditions, READONLY_FILESYSTEM) {
        deadlines.push((
            timeouts::add(since, after),
            ForceReason::ReadonlyFilesystem { after },
        ));
    }
    deadlines
}

/// Whether, and why, the drain of `machine` is forced at `now` (reference §4, `drainNode`). Any of:
/// - the label `force-deletion` parses as true (`strconv.ParseBool`);
/// - `now − deletionTimestamp ≥ drain timeout`;
/// - the node's `Ready` has not been `True` for at least 5 minutes (`force_drain_unhealthy_after`);
/// - the node's `ReadonlyFilesystem` has not been `False` for at least 5 minutes (PR #839).
///
/// `conditions` are the node's (the machine's copy when the node is gone). The reference compares with `>`; the
/// instant itself counts here, so that a timer set at [`force_at`] finds the drain forced.
pub fn force_reason(
    machine: &Machine,
    conditions: &[NodeCondition],
    now: Timestamp,
    settings: &EffectiveSettings,
) -> Option<ForceReason> {
    force_label(machine).or_else(|| {
        force_deadlines(machine, conditions, settings)
            .into_iter()
            .filter(|(at, _)| now >= *at)
            .min_by_key(|(at, _)| *at)
            .map(|(_, reason)| reason)
    })
}

/// The earliest instant at which a time rule of [`force_reason`] will force the drain (`None` when no rule can fire
/// by the passing of time: no deletion timestamp and a healthy node). The controller sets a timer there.
pub fn force_at(
    machine: &Machine,
    conditions: &[NodeCondition],
    settings: &EffectiveSettings,
) -> Option<Timestamp> {
    force_deadlines(machine, conditions, settings)
        .into_iter()
        .map(|(at, _)| at)
        .min()
}

/// How many times an eviction refused by a PodDisruptionBudget is tried: `min(configured, drain timeout / interval)`
/// and at least 1 (reference: `min(maxEvictRetries, drainTimeout.Seconds() / PodEvictionRetryInterval.Seconds())`;
/// the flag's default 360 is 2h / 20s). A negative `configured` counts as 0; a zero interval leaves `configured`.
pub fn max_evict_retries(drain_timeout: Duration, configured: i32, interval: Duration) -> u32 {
    let configured = u32::try_from(configured).unwrap_or(0);
    let by_timeout = if interval.is_zero() {
        u32::MAX
    } else {
        u32::try_from(drain_timeout.as_nanos() / interval.as_nanos()).unwrap_or(u32::MAX)
    };
    configured.min(by_timeout).max(1)
}

/// How a drain runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainMode {
    /// Why the drain is forced; `None` for a normal drain (evictions honouring PodDisruptionBudgets, waiting for
    /// pods and volumes).
    pub force: Option<ForceReason>,
    /// How long the drain may take: the effective drain timeout, [`FORCE_TIMEOUT`] under force.
    pub timeout: Duration,
    /// Eviction attempts per pod ([`max_evict_retries`]), [`FORCE_MAX_EVICT_RETRIES`] under force.
    pub max_evict_retries: u32,
    /// For a normal drain: when it turns into a force drain ([`force_at`]); the controller looks again then.
    pub force_at: Option<Timestamp>,
}

/// The drain mode of `machine` at `now` (see [`force_reason`]).
pub fn drain_mode(
    machine: &Machine,
    conditions: &[NodeCondition],
    now: Timestamp,
    settings: &EffectiveSettings,
) -> DrainMode {
    match force_reason(machine, conditions, now, settings) {
        Some(reason) => DrainMode {
            force: Some(reason),
            timeout: FORCE_TIMEOUT,
            max_evict_retries: FORCE_MAX_EVICT_RETRIES,
            force_at: None,
        },
        None => DrainMode {
            force: None,
            timeout: settings.drain_timeout,
            max_evict_retries: max_evict_retries(
                settings.drain_timeout,
                settings.max_evict_retries,
                settings.evict_retry_interval,
            ),
            force_at: force_at(machine, conditions, settings),
        },
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Pod selection
// ---------------------------------------------------------------------------------------------------------------

/// A pod, by namespace, name and UID (a pod replaced under the same name has another UID).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
    /// The UID ("" when the pod has none, e.g. in tests).
    pub uid: String,
}

impl PodRef {
    /// The reference of `pod`.
    pub fn of(pod: &Pod) -> Self {
        Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a drain leaves a pod alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// A mirror pod (annotation `kubernetes.io/config.mirror`): the kubelet owns it.
    Mirror,
    /// Controlled by a DaemonSet: it would come back at once, and tolerates the cordon.
    DaemonSet,
    /// Labelled `drain.machine.sapcloud.io=skip`.
    SkipLabel,
    /// Labelled `drain.machine.sapcloud.io=wait-completed` and already finished.
    Completed,
}

/// Why a drain waits for a pod instead of evicting it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitReason {
    /// Labelled `drain.machine.sapcloud.io=wait-completed`: waited for until it succeeds, fails or is gone.
    WaitCompleted,
    /// Already being deleted: waited for until it is gone.
    Terminating,
}

/// What a drain does with the pods bound to a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainPlan {
    /// Pods without PersistentVolumeClaims: evicted in parallel. Sorted by namespace and name.
    pub parallel: Vec<PodRef>,
    /// Pods with PersistentVolumeClaims: evicted one at a time in this order (`spec.priority` descending, then
    /// namespace and name), each followed by the wait for its volumes.
    pub serial: Vec<PodRef>,
    /// Pods waited for, not evicted.
    pub wait: Vec<(PodRef, WaitReason)>,
    /// Pods left alone.
    pub skipped: Vec<(PodRef, SkipReason)>,
}

impl DrainPlan {
    /// Whether the drain has nothing to evict and nothing to wait for.
    pub fn is_done(&self) -> bool {
        self.parallel.is_empty() && self.serial.is_empty() && self.wait.is_empty()
    }

    /// Under force, every pod not skipped is deleted with grace period 0, waited-for pods included (waiting on a
    /// node that is gone, or past the drain timeout, would never end). Skipped pods stay skipped.
    pub fn force_deletions(&self) -> Vec<PodRef> {
        let mut pods: Vec<PodRef> = self
            .parallel
            .iter()
            .chain(&self.serial)
            .chain(self.wait.iter().map(|(pod, _)| pod))
            .cloned()
            .collect();
        pods.sort();
        pods
    }
}

/// Whether `pod` is a mirror pod.
pub fn is_mirror_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
}

/// Whether `pod`'s controller (the owner reference with `controller: true`) is a DaemonSet.
pub fn is_daemonset_pod(pod: &Pod) -> bool {
    pod.metadata.owner_references.as_ref().is_some_and(|owners| {
        owners
            .iter()
            .any(|o| o.controller == Some(true) && o.kind == "DaemonSet")
    })
}

/// The pod's `drain.machine.sapcloud.io` label.
fn drain_label(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(extensions::DRAIN_LABEL))
        .map(String::as_str)
}

/// Whether `pod` has finished (phase `Succeeded` or `Failed`).
pub fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The PersistentVolumeClaims `pod` mounts: `persistentVolumeClaim` volumes, and generic ephemeral volumes (whose
/// claim is `<pod>-<volume>`; the reference looks at the first kind only, but both attach a volume to the node).
pub fn claims(pod: &Pod) -> Vec<String> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes
        .into_iter()
        .flatten()
        .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(claim), _) => Some(claim.claim_name.clone()),
            (None, Some(_)) => Some(format!("{pod_name}-{}", v.name)),
            (None, None) => None,
        })
        .collect()
}

/// Whether `pod` is bound to the node `node`.
fn on_node(pod: &Pod, node: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// Where a pod goes in a [`DrainPlan`].
enum Placement {
    Skip(SkipReason),
    Wait(WaitReason),
    Parallel,
    Serial,
}

fn placement(pod: &Pod) -> Placement {
    let label = drain_label(pod);
    if is_mirror_pod(pod) {
        Placement::Skip(SkipReason::Mirror)
    } else if is_daemonset_pod(pod) {
        Placement::Skip(SkipReason::DaemonSet)
    } else if label == Some(DRAIN_SKIP) {
        Placement::Skip(SkipReason::SkipLabel)
    } else if pod.metadata.deletion_timestamp.is_some() {
        Placement::Wait(WaitReason::Terminating)
    } else if label == Some(DRAIN_WAIT_COMPLETED) {
        if is_finished(pod) {
            Placement::Skip(SkipReason::Completed)
        } else {
            Placement::Wait(WaitReason::WaitCompleted)
        }
    } else if claims(pod).is_empty() {
        Placement::Parallel
    } else {
        Placement::Serial
    }
}

/// The drain plan for the pods bound to `node` (pods of other nodes in `pods` are ignored).
///
/// Reference §4 `getPodsForDeletion`: mirror pods and DaemonSet pods are skipped; pods without a controller, with
/// emptyDir, and finished pods are included. New (Cluster API's `cluster.x-k8s.io/drain`): the pod label
/// `drain.machine.sapcloud.io=skip` leaves a pod alone and `=wait-completed` waits for it to end; pods already being
/// deleted are waited for, not evicted again. Pods without PersistentVolumeClaims go to [`DrainPlan::parallel`],
/// the others to [`DrainPlan::serial`], highest `spec.priority` first (reference: "sorted by priority descending").
pub fn plan(node: &str, pods: &[Pod]) -> DrainPlan {
    let mut drain = DrainPlan::default();
    let mut serial = Vec::new();
    for pod in pods.iter().filter(|p| on_node(p, node)) {
        let reference = PodRef::of(pod);
        match placement(pod) {
            Placement::Skip(reason) => drain.skipped.push((reference, reason)),
            Placement::Wait(reason) => drain.wait.push((reference, reason)),
            Placement::Parallel => drain.parallel.push(reference),
            Placement::Serial => serial.push((priority(pod), reference)),
        }
    }
    drain.parallel.sort();
    drain.wait.sort_by(|a, b| a.0.cmp(&b.0));
    drain.skipped.sort_by(|a, b| a.0.cmp(&b.0));
    serial.sort_by(|(pa, a), (pb, b)| Reverse(pa).cmp(&Reverse(pb)).then_with(|| a.cmp(b)));
    drain.serial = serial.into_iter().map(|(_, pod)| pod).collect();
    drain
}

/// `spec.priority` (0 when unset, as the scheduler's default priority class).
fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// The pod's grace period (`terminationGracePeriodSeconds`, 30s when unset).
pub fn grace_period(pod: &Pod) -> Duration {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .map_or(DEFAULT_GRACE_PERIOD, |s| {
            Duration::from_secs(s.max(0).unsigned_abs())
        })
}

/// How long to wait for an evicted pod to be gone: `min(grace period, drain timeout) + 30s` (reference).
pub fn pod_gone_timeout(pod: &Pod, drain_timeout: Duration) -> Duration {
    grace_period(pod).min(drain_timeout) + POD_GONE_SLACK
}

/// How long to wait for the volumes of an evicted pod to detach: grace period + `--machine-pv-detach-timeout`
/// (reference).
pub fn detach_timeout(pod: &Pod, settings: &EffectiveSettings) -> Duration {
    grace_period(pod) + settings.pv_detach_timeout
}

/// Whether the evicted pod `evicted` is gone: no pod of that name, or one with another UID (a replacement).
pub fn pod_gone(evicted: &PodRef, current: Option<&Pod>) -> bool {
    current.is_none_or(|pod| {
        !evicted.uid.is_empty() && pod.metadata.uid.as_deref() != Some(evicted.uid.as_str())
    })
}

/// Whether a waited-for pod is done: gone, replaced, or finished (phase `Succeeded` or `Failed`).
pub fn wait_done(waited: &PodRef, current: Option<&Pod>) -> bool {
    pod_gone(waited, current) || current.is_some_and(is_finished)
}

// ---------------------------------------------------------------------------------------------------------------
// PodDisruptionBudgets
// ---------------------------------------------------------------------------------------------------------------

/// One `matchExpressions` requirement against `labels` (operators `In`, `NotIn`, `Exists`, `DoesNotExist`; an
/// unknown operator matches nothing, as the API server would have rejected it).
fn requirement_matches(requirement: &LabelSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&requirement.key);
    let values = requirement.values.as_deref().unwrap_or_default();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// Whether a label selector matches `labels`: every `matchLabels` entry and every `matchExpressions` requirement
/// holds. An empty selector matches everything (Kubernetes' `LabelSelectorAsSelector`).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let match_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions = selector
        .match_expressions
        .iter()
        .flatten()
        .all(|r| requirement_matches(r, labels));
    match_labels && expressions
}

/// The PodDisruptionBudgets that guard `pod`: same namespace, and a selector that matches the pod's labels. In
/// policy/v1 an empty selector selects every pod of the namespace and a missing one selects none. Sorted by name.
pub fn pdbs_for_pod<'a>(pod: &Pod, pdbs: &'a [PodDisruptionBudget]) -> Vec<&'a PodDisruptionBudget> {
    let empty = BTreeMap::new();
    let pod_labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let mut matching: Vec<&PodDisruptionBudget> = pdbs
        .iter()
        .filter(|pdb| pdb.metadata.namespace == pod.metadata.namespace)
        .filter(|pdb| {
            pdb.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|selector| selector_matches(selector, pod_labels))
        })
        .collect();
    matching.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    matching
}

/// Whether a PodDisruptionBudget can never allow a disruption (reference `isMisconfiguredPdb`, issues #52/#591):
/// its status is current (`generation == observedGeneration`), it expects pods (`expectedPods > 0`), all of them are
/// healthy (`currentHealthy ≥ expectedPods`), none is being disrupted, and still `disruptionsAllowed == 0`. An
/// eviction it refuses fails the drain at once instead of being retried until the drain timeout.
pub fn misconfigured_pdb(pdb: &PodDisruptionBudget) -> bool {
    let Some(status) = pdb.status.as_ref() else {
        return false;
    };
    pdb.metadata.generation == status.observed_generation
        && status.expected_pods > 0
        && status.current_healthy >= status.expected_pods
        && status.disrupted_pods.as_ref().is_none_or(BTreeMap::is_empty)
        && status.disruptions_allowed == 0
}

/// A pod whose eviction a PodDisruptionBudget refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// The pod.
    pub pod: PodRef,
    /// The name of the PodDisruptionBudget (in the pod's namespace), if one is known.
    pub pdb: Option<String>,
    /// Whether that budget is misconfigured ([`misconfigured_pdb`]): the drain fails at once.
    pub misconfigured: bool,
}

/// The blocker of `pod` whose eviction was refused (HTTP 429): a misconfigured guarding budget if there is one, else
/// the first guarding budget by name. (The reference picks one arbitrarily when several match.)
pub fn blocker(pod: &Pod, pdbs: &[PodDisruptionBudget]) -> Blocker {
    let guarding = pdbs_for_pod(pod, pdbs);
    let chosen = guarding
        .iter()
        .find(|pdb| misconfigured_pdb(pdb))
        .or_else(|| guarding.first());
    Blocker {
        pod: PodRef::of(pod),
        pdb: chosen.and_then(|pdb| pdb.metadata.name.clone()),
        misconfigured: chosen.is_some_and(|pdb| misconfigured_pdb(pdb)),
    }
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pod {} cannot be evicted: ", self.pod)?;
        match &self.pdb {
            Some(pdb) if self.misconfigured => write!(
                f,
                "PodDisruptionBudget {}/{pdb} allows no disruption although all its pods are healthy \
                 (misconfigured)",
                self.pod.namespace
            ),
            Some(pdb) => write!(
                f,
                "PodDisruptionBudget {}/{pdb} allows no disruption now",
                self.pod.namespace
            ),
            None => f.write_str("a PodDisruptionBudget allows no disruption now"),
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Volumes
// ---------------------------------------------------------------------------------------------------------------

/// The PersistentVolumes to wait for after evicting `pod`: the volumes bound to its claims (`pv_of_claim` maps
/// `(namespace, claim)` to the bound PV), except volumes that another pod in `pods_on_node` also uses (reference:
/// "PVs shared by more than one pod on the node are not tracked"). Sorted, without duplicates.
pub fn pvs_to_track(
    pod: &Pod,
    pods_on_node: &[Pod],
    pv_of_claim: &BTreeMap<(String, String), String>,
) -> Vec<String> {
    let pvs_of = |p: &Pod| -> Vec<String> {
        let namespace = p.metadata.namespace.clone().unwrap_or_default();
        let mut pvs: Vec<String> = claims(p)
            .into_iter()
            .filter_map(|claim| pv_of_claim.get(&(namespace.clone(), claim)).cloned())
            .collect();
        pvs.sort();
        pvs.dedup();
        pvs
    };
    let me = PodRef::of(pod);
    let mut users: BTreeMap<String, usize> = BTreeMap::new();
    for other in pods_on_node.iter().filter(|p| PodRef::of(p) != me) {
        for pv in pvs_of(other) {
            *users.entry(pv).or_default() += 1;
        }
    }
    pvs_of(pod)
        .into_iter()
        .filter(|pv| !users.contains_key(pv))
        .collect()
}

/// Whether the node's attached volume `attached` (an entry of `node.status.volumesAttached`, named e.g.
/// `kubernetes.io/csi/<driver>^<volumeHandle>`) is the volume `volume_id`. The reference matches the ID as an
/// unanchored regular expression; here it is matched as a plain substring (IDs are not patterns), and an empty ID
/// matches nothing (the reference ignores PVs without an ID).
pub fn is_attached_volume(volume_id: &str, attached: &str) -> bool {
    !volume_id.is_empty() && attached.contains(volume_id)
}

/// Whether none of `volume_ids` is attached to `node` any more (`node.status.volumesAttached`); true when the node
/// is gone.
pub fn volumes_detached(volume_ids: &[String], node: Option<&Node>) -> bool {
    let attached = node
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.volumes_attached.as_deref())
        .unwrap_or_default();
    !volume_ids
        .iter()
        .any(|id| attached.iter().any(|a| is_attached_volume(id, &a.name)))
}

/// Whether the PersistentVolume `pv` is attached to a node other than `old_node`: a VolumeAttachment for it with
/// `status.attached` on another node (reference: `status.attached && spec.nodeName != old`).
pub fn volume_reattached(pv: &str, old_node: &str, attachments: &[VolumeAttachment]) -> bool {
    attachments.iter().any(|va| {
        va.spec.source.persistent_volume_name.as_deref() == Some(pv)
            && va.spec.node_name != old_node
            && va.status.as_ref().is_some_and(|s| s.attached)
    })
}

/// The VolumeAttachments of `node` not yet being deleted (reference `getLiveVolumeAttachmentsForNode`), deleted
/// after a force drain.
pub fn live_volume_attachments<'a>(
    node: &str,
    attachments: &'a [VolumeAttachment],
) -> Vec<&'a VolumeAttachment> {
    attachments
        .iter()
        .filter(|va| va.spec.node_name == node && va.metadata.deletion_timestamp.is_none())
        .collect()
}

/// Whether `node.status.volumesAttached` is empty (or the node is gone).
pub fn no_volumes_attached(node: Option<&Node>) -> bool {
    node.and_then(|n| n.status.as_ref())
        .and_then(|s| s.volumes_attached.as_ref())
        .is_none_or(Vec::is_empty)
}

// ---------------------------------------------------------------------------------------------------------------
// Outcome
// ---------------------------------------------------------------------------------------------------------------

/// How a drain (or one pass of a drain) went, as the controller reports it. Its `Display` is the text that goes into
/// `lastOperation.description` (through [`crate::deletion`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Every pod is gone (or left alone): `evicted` pods were evicted, `deleted` deleted (force drain, or after the
    /// evict retries).
    Drained {
        /// Pods evicted.
        evicted: usize,
        /// Pods deleted.
        deleted: usize,
    },
    /// The drain goes on: `remaining` pods are still to go; `blocked` names a pod whose eviction a budget refuses
    /// for now (retried every `evict_retry_interval`).
    InProgress {
        /// Pods still on the node (to evict or to wait for).
        remaining: usize,
        /// A pod refused by a budget, if any.
        blocked: Option<Blocker>,
    },
    /// A budget refuses a pod for good: misconfigured, or the evict retries are used up.
    Blocked(Blocker),
    /// The drain did not finish within its timeout.
    TimedOut {
        /// The drain timeout.
        timeout: Duration,
        /// Pods still on the node.
        remaining: usize,
    },
    /// Another error (an API call failed).
    Failed {
        /// What failed.
        message: String,
    },
}

impl DrainOutcome {
    /// Whether the node is drained.
    pub fn is_drained(&self) -> bool {
        matches!(self, Self::Drained { .. })
    }
}

/// `1 pod`, `3 pods`.
fn pods(n: usize) -> String {
    if n == 1 {
        "1 pod".to_owned()
    } else {
        format!("{n} pods")
    }
}

impl fmt::Display for DrainOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Drained {
                evicted: 0,
                deleted: 0,
            } => f.write_str("no pods to evict"),
            Self::Drained { evicted, deleted: 0 } => write!(f, "{} evicted", pods(*evicted)),
            Self::Drained { evicted: 0, deleted } => write!(f, "{} deleted", pods(*deleted)),
            Self::Drained { evicted, deleted } => {
                write!(f, "{} evicted, {} deleted", pods(*evicted), pods(*deleted))
            }
            Self::InProgress {
                remaining,
                blocked: None,
            } => write!(f, "{} left", pods(*remaining)),
            Self::InProgress {
                remaining,
                blocked: Some(blocker),
            } => write!(f, "{} left; {blocker}", pods(*remaining)),
            Self::Blocked(blocker) => blocker.fmt(f),
            Self::TimedOut { timeout, remaining } => write!(
                f,
                "the drain did not finish within {}, {} left",
                go(*timeout),
                pods(*remaining)
            ),
            Self::Failed { message } => f.write_str(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use k8s_openapi::{
        api::{
            core::v1::{
                AttachedVolume, EphemeralVolumeSource, NodeStatus, PersistentVolumeClaimVolumeSource,
                PodSpec, PodStatus, Volume,
            },
            policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus},
            storage::v1::{VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus},
        },
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time},
    };
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    use super::*;
    use crate::timeouts::{ControllerSettings, effective_settings};

    const DELETED: i64 = 1_000_000;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn settings() -> EffectiveSettings {
        effective_settings(&Machine::default(), &ControllerSettings::default())
    }

    fn deleted_machine() -> Machine {
        let mut m = Machine::default();
        m.metadata.name = Some("m-1".into());
        m.metadata.deletion_timestamp = Some(Time(at(DELETED)));
        m
    }

    fn condition(type_: &str, status: &str, since: Option<i64>) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: since.map(|s| Time(at(s))),
            ..NodeCondition::default()
        }
    }

    fn pod(name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("node-1".into()),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn labelled(mut p: Pod, key: &str, value: &str) -> Pod {
        p.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        p
    }

    fn with_claim(mut p: Pod, claim: &str) -> Pod {
        p.spec
            .get_or_insert_with(PodSpec::default)
            .volumes
            .get_or_insert_with(Vec::new)
            .push(Volume {
                name: format!("vol-{claim}"),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.into(),
                    read_only: None,
                }),
                ..Volume::default()
            });
        p
    }

    fn with_priority(mut p: Pod, priority: i32) -> Pod {
        p.spec.get_or_insert_with(PodSpec::default).priority = Some(priority);
        p
    }

    fn names(pods: &[PodRef]) -> Vec<&str> {
        pods.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn parse_bool_is_gos() {
        for yes in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(yes), Some(true), "{yes}");
        }
        for no in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(no), Some(false), "{no}");
        }
        for neither in ["", "yes", "tRUE", " true", "2"] {
            assert_eq!(parse_bool(neither), None, "{neither}");
        }
    }

    #[test]
    fn the_force_deletion_label_forces_when_it_parses_true() {
        // Reference §4: "the machine label force-deletion parses as true (strconv.ParseBool)".
        let s = settings();
        for (value, forced) in [
            ("True", true),
            ("1", true),
            ("t", true),
            ("false", false),
            ("yes", false),
        ] {
            let mut m = deleted_machine();
            m.metadata.labels = Some(BTreeMap::from([(labels::FORCE_DELETION.into(), value.into())]));
            let reason = force_reason(&m, &[], at(DELETED), &s);
            assert_eq!(reason.is_some(), forced, "{value}");
        }
        let mut m = deleted_machine();
        m.metadata.labels = Some(BTreeMap::from([(labels::FORCE_DELETION.into(), "True".into())]));
        assert_eq!(
            force_reason(&m, &[], at(DELETED), &s).unwrap().to_string(),
            "the machine has the label force-deletion=True"
        );
    }

    #[test]
    fn the_drain_timeout_since_the_deletion_forces() {
        // Reference §4: "now − deletionTimestamp > drainTimeout (effective drainTimeout, default 2h)".
        let s = settings();
        let m = deleted_machine();
        assert_eq!(force_reason(&m, &[], at(DELETED + 7199), &s), None);
        assert_eq!(
            force_reason(&m, &[], at(DELETED + 7200), &s),
            Some(ForceReason::DrainTimeout {
                timeout: Duration::from_hours(2)
            })
        );
        assert_eq!(force_at(&m, &[], &s), Some(at(DELETED + 7200)));
    }

    #[test]
    fn a_node_not_ready_for_five_minutes_forces() {
        // Reference §4: "the Node has been Ready!=True for more than 5 min".
        let s = settings();
        let m = deleted_machine();
        for status in ["False", "Unknown"] {
            let conditions = [condition("Ready", status, Some(DELETED - 100))];
            assert_eq!(force_reason(&m, &conditions, at(DELETED + 199), &s), None);
            assert_eq!(
                force_reason(&m, &conditions, at(DELETED + 200), &s),
                Some(ForceReason::NodeNotReady {
                    after: Duration::from_mins(5)
                })
            );
            assert_eq!(force_at(&m, &conditions, &s), Some(at(DELETED + 200)));
        }
        let ready = [condition("Ready", "True", Some(DELETED - 10_000))];
        assert_eq!(force_reason(&m, &ready, at(DELETED + 200), &s), None);
        // Without a transition time there is no instant to measure from: not forced.
        let unknown_since = [condition("Ready", "False", None)];
        assert_eq!(force_reason(&m, &unknown_since, at(DELETED + 200), &s), None);
    }

    #[test]
    fn a_readonly_filesystem_for_five_minutes_forces() {
        // Reference §4 (PR #839): "ReadonlyFilesystem!=False for more than 5 min".
        let s = settings();
        let m = deleted_machine();
        let conditions = [
            condition("Ready", "True", Some(0)),
            condition("ReadonlyFilesystem", "True", Some(DELETED)),
        ];
        assert_eq!(force_reason(&m, &conditions, at(DELETED + 299), &s), None);
        assert_eq!(
            force_reason(&m, &conditions, at(DELETED + 300), &s),
            Some(ForceReason::ReadonlyFilesystem {
                after: Duration::from_mins(5)
            })
        );
        let fine = [condition("ReadonlyFilesystem", "False", Some(0))];
        assert_eq!(force_reason(&m, &fine, at(DELETED + 300), &s), None);
    }

    #[test]
    fn under_force_the_timeout_is_one_minute_and_one_attempt() {
        // Reference §4: "Under force: drain timeout = 1 min, maxEvictRetries = 1".
        let s = settings();
        let m = deleted_machine();
        let normal = drain_mode(&m, &[], at(DELETED), &s);
        assert_eq!(normal.force, None);
        assert_eq!(normal.timeout, Duration::from_hours(2));
        assert_eq!(normal.max_evict_retries, 360);
        assert_eq!(normal.force_at, Some(at(DELETED + 7200)));
        let forced = drain_mode(&m, &[], at(DELETED + 7200), &s);
        assert!(forced.force.is_some());
        assert_eq!(forced.timeout, Duration::from_mins(1));
        assert_eq!(forced.max_evict_retries, 1);
        assert_eq!(forced.force_at, None);
    }

    #[test]
    fn max_evict_retries_is_bounded_by_the_drain_timeout() {
        // Reference: min(maxEvictRetries, drainTimeout / PodEvictionRetryInterval); 2h / 20s = 360.
        let interval = Duration::from_secs(20);
        assert_eq!(max_evict_retries(Duration::from_hours(2), 360, interval), 360);
        assert_eq!(max_evict_retries(Duration::from_hours(4), 360, interval), 360);
        assert_eq!(max_evict_retries(Duration::from_mins(10), 360, interval), 30);
        assert_eq!(max_evict_retries(Duration::from_mins(10), 5, interval), 5);
        assert_eq!(max_evict_retries(Duration::from_secs(30), 360, interval), 1);
        assert_eq!(max_evict_retries(Duration::ZERO, 360, interval), 1, "at least 1");
        assert_eq!(max_evict_retries(Duration::from_hours(2), -4, interval), 1);
        assert_eq!(max_evict_retries(Duration::from_hours(2), 9, Duration::ZERO), 9);
    }

    #[test]
    fn mirror_daemonset_and_skip_pods_are_left_alone() {
        let mut mirror = pod("mirror");
        mirror.metadata.annotations = Some(BTreeMap::from([(MIRROR_POD_ANNOTATION.into(), "x".into())]));
        let mut ds = pod("ds");
        ds.metadata.owner_references = Some(vec![OwnerReference {
            kind: "DaemonSet".into(),
            controller: Some(true),
            name: "agent".into(),
            ..OwnerReference::default()
        }]);
        let skip = labelled(pod("skip"), extensions::DRAIN_LABEL, "skip");
        // An owner that is not the controller does not make a DaemonSet pod.
        let mut owned = pod("owned");
        owned.metadata.owner_references = Some(vec![OwnerReference {
            kind: "DaemonSet".into(),
            controller: Some(false),
            ..OwnerReference::default()
        }]);
        let drain = plan("node-1", &[mirror, ds, skip, owned]);
        assert_eq!(
            drain
                .skipped
                .iter()
                .map(|(p, r)| (p.name.as_str(), *r))
                .collect::<Vec<_>>(),
            [
                ("ds", SkipReason::DaemonSet),
                ("mirror", SkipReason::Mirror),
                ("skip", SkipReason::SkipLabel)
            ]
        );
        assert_eq!(names(&drain.parallel), ["owned"]);
    }

    #[test]
    fn wait_completed_and_terminating_pods_are_waited_for_not_evicted() {
        let job = labelled(pod("job"), extensions::DRAIN_LABEL, "wait-completed");
        let mut done = labelled(pod("done"), extensions::DRAIN_LABEL, "wait-completed");
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..PodStatus::default()
        });
        let mut leaving = pod("leaving");
        leaving.metadata.deletion_timestamp = Some(Time(at(5)));
        let other_value = labelled(pod("other"), extensions::DRAIN_LABEL, "please");
        let drain = plan("node-1", &[job, done, leaving, other_value]);
        assert_eq!(
            drain
                .wait
                .iter()
                .map(|(p, r)| (p.name.as_str(), *r))
                .collect::<Vec<_>>(),
            [
                ("job", WaitReason::WaitCompleted),
                ("leaving", WaitReason::Terminating)
            ]
        );
        assert_eq!(
            drain.skipped.len(),
            1,
            "a finished wait-completed pod needs nothing"
        );
        assert_eq!(
            names(&drain.parallel),
            ["other"],
            "an unknown label value drains as usual"
        );
        assert!(!drain.is_done());
        assert_eq!(
            drain
                .force_deletions()
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["job", "leaving", "other"]
        );
    }

    #[test]
    fn pods_with_claims_are_serial_by_priority_and_others_parallel() {
        // Reference §4: "Pods with PVCs are evicted serially, sorted by spec.priority descending".
        let mut ephemeral = pod("eph");
        ephemeral.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: "scratch".into(),
            ephemeral: Some(EphemeralVolumeSource::default()),
            ..Volume::default()
        }]);
        let mut elsewhere = with_claim(pod("elsewhere"), "c");
        elsewhere.spec.as_mut().unwrap().node_name = Some("node-2".into());
        let pods = vec![
            with_priority(with_claim(pod("db-b"), "b"), 10),
            with_claim(pod("db-none"), "n"),
            with_priority(with_claim(pod("db-a"), "a"), 10),
            with_priority(with_claim(pod("db-high"), "h"), 1000),
            pod("web-2"),
            pod("web-1"),
            ephemeral,
            elsewhere,
        ];
        let drain = plan("node-1", &pods);
        assert_eq!(
            names(&drain.serial),
            ["db-high", "db-a", "db-b", "db-none", "eph"]
        );
        assert_eq!(names(&drain.parallel), ["web-1", "web-2"]);
        assert_eq!(claims(&pods[6]), ["eph-scratch"]);
    }

    fn pdb(name: &str, selector: Option<LabelSelector>) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                generation: Some(2),
                ..ObjectMeta::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector,
                ..PodDisruptionBudgetSpec::default()
            }),
            status: None,
        }
    }

    fn match_labels(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()),
            match_expressions: None,
        }
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: operator.into(),
                values: Some(values.iter().map(|v| (*v).into()).collect()),
            }]),
        }
    }

    #[test]
    fn pdbs_match_by_namespace_and_selector() {
        let web = labelled(labelled(pod("web"), "app", "web"), "tier", "front");
        let mut other_namespace = pdb("elsewhere", Some(match_labels(&[("app", "web")])));
        other_namespace.metadata.namespace = Some("kube-system".into());
        let pdbs = [
            pdb("by-label", Some(match_labels(&[("app", "web")]))),
            pdb("wrong-label", Some(match_labels(&[("app", "db")]))),
            pdb("all-of-namespace", Some(LabelSelector::default())),
            pdb("no-selector", None),
            pdb("in", Some(expression("tier", "In", &["front", "back"]))),
            pdb("not-in", Some(expression("tier", "NotIn", &["front"]))),
            pdb("not-in-absent", Some(expression("zone", "NotIn", &["a"]))),
            pdb("exists", Some(expression("tier", "Exists", &[]))),
            pdb("does-not-exist", Some(expression("tier", "DoesNotExist", &[]))),
            pdb("bogus-operator", Some(expression("tier", "Gt", &["1"]))),
            other_namespace,
        ];
        let matched: Vec<&str> = pdbs_for_pod(&web, &pdbs)
            .iter()
            .map(|p| p.metadata.name.as_deref().unwrap())
            .collect();
        // policy/v1: an empty selector selects every pod of the namespace, a missing one none.
        assert_eq!(
            matched,
            ["all-of-namespace", "by-label", "exists", "in", "not-in-absent"]
        );
    }

    fn with_status(
        mut p: PodDisruptionBudget,
        expected: i32,
        healthy: i32,
        allowed: i32,
    ) -> PodDisruptionBudget {
        p.status = Some(PodDisruptionBudgetStatus {
            expected_pods: expected,
            current_healthy: healthy,
            desired_healthy: expected,
            disruptions_allowed: allowed,
            observed_generation: Some(2),
            ..PodDisruptionBudgetStatus::default()
        });
        p
    }

    #[test]
    fn misconfigured_pdbs_are_those_that_can_never_allow_a_disruption() {
        // Reference isMisconfiguredPdb: generation == observedGeneration && expectedPods > 0 &&
        // currentHealthy >= expectedPods && no disruptedPods && disruptionsAllowed == 0.
        let base = pdb("p", Some(LabelSelector::default()));
        assert!(misconfigured_pdb(&with_status(base.clone(), 2, 2, 0)));
        assert!(!misconfigured_pdb(&base), "no status yet");
        assert!(
            !misconfigured_pdb(&with_status(base.clone(), 2, 2, 1)),
            "allows one"
        );
        assert!(
            !misconfigured_pdb(&with_status(base.clone(), 2, 1, 0)),
            "a pod is unhealthy"
        );
        assert!(
            !misconfigured_pdb(&with_status(base.clone(), 0, 0, 0)),
            "expects no pods"
        );
        let mut stale = with_status(base.clone(), 2, 2, 0);
        stale.metadata.generation = Some(3);
        assert!(!misconfigured_pdb(&stale), "status not observed yet");
        let mut disrupting = with_status(base, 2, 2, 0);
        disrupting.status.as_mut().unwrap().disrupted_pods =
            Some(BTreeMap::from([("web-0".to_owned(), Time(at(1)))]));
        assert!(!misconfigured_pdb(&disrupting), "a disruption is in progress");
    }

    #[test]
    fn a_blocked_drain_names_the_pod_and_the_pdb() {
        let web = labelled(pod("web-0"), "app", "web");
        let pdbs = [
            with_status(pdb("a-budget", Some(match_labels(&[("app", "web")]))), 3, 2, 0),
            with_status(pdb("web-pdb", Some(match_labels(&[("app", "web")]))), 3, 3, 0),
        ];
        let b = blocker(&web, &pdbs);
        assert_eq!(
            b.pdb.as_deref(),
            Some("web-pdb"),
            "the misconfigured one fails fast"
        );
        assert!(b.misconfigured);
        assert_eq!(
            DrainOutcome::Blocked(b).to_string(),
            "pod default/web-0 cannot be evicted: PodDisruptionBudget default/web-pdb allows no disruption \
             although all its pods are healthy (misconfigured)"
        );
        let b = blocker(&web, &pdbs[..1]);
        assert!(!b.misconfigured);
        assert_eq!(
            DrainOutcome::InProgress {
                remaining: 2,
                blocked: Some(b)
            }
            .to_string(),
            "2 pods left; pod default/web-0 cannot be evicted: PodDisruptionBudget default/a-budget allows no \
             disruption now"
        );
        assert_eq!(
            blocker(&web, &[]).to_string(),
            "pod default/web-0 cannot be evicted: a PodDisruptionBudget allows no disruption now"
        );
    }

    #[test]
    fn drain_outcomes_read_well() {
        let cases = [
            (
                DrainOutcome::Drained {
                    evicted: 0,
                    deleted: 0,
                },
                "no pods to evict",
            ),
            (
                DrainOutcome::Drained {
                    evicted: 1,
                    deleted: 0,
                },
                "1 pod evicted",
            ),
            (
                DrainOutcome::Drained {
                    evicted: 0,
                    deleted: 4,
                },
                "4 pods deleted",
            ),
            (
                DrainOutcome::Drained {
                    evicted: 3,
                    deleted: 1,
                },
                "3 pods evicted, 1 pod deleted",
            ),
            (
                DrainOutcome::InProgress {
                    remaining: 1,
                    blocked: None,
                },
                "1 pod left",
            ),
            (
                DrainOutcome::TimedOut {
                    timeout: Duration::from_hours(2),
                    remaining: 2,
                },
                "the drain did not finish within 2h0m0s, 2 pods left",
            ),
            (
                DrainOutcome::Failed {
                    message: "pods is forbidden".into(),
                },
                "pods is forbidden",
            ),
        ];
        for (outcome, text) in cases {
            assert_eq!(outcome.to_string(), text);
        }
        assert!(
            DrainOutcome::Drained {
                evicted: 0,
                deleted: 0
            }
            .is_drained()
        );
    }

    fn claim_map(entries: &[(&str, &str)]) -> BTreeMap<(String, String), String> {
        entries
            .iter()
            .map(|(claim, pv)| (("default".to_owned(), (*claim).to_owned()), (*pv).to_owned()))
            .collect()
    }

    #[test]
    fn shared_volumes_are_not_tracked() {
        // Reference: "PVs shared by more than one pod on the node are not tracked".
        let a = with_claim(with_claim(pod("a"), "data-a"), "shared");
        let b = with_claim(pod("b"), "shared");
        let unbound = with_claim(pod("c"), "pending");
        let pods = [a.clone(), b, unbound.clone()];
        let map = claim_map(&[("data-a", "pv-a"), ("shared", "pv-s")]);
        assert_eq!(pvs_to_track(&a, &pods, &map), ["pv-a"]);
        assert!(
            pvs_to_track(&unbound, &pods, &map).is_empty(),
            "an unbound claim has no volume"
        );
        // Once the other user is gone, the volume is tracked.
        assert_eq!(pvs_to_track(&a, std::slice::from_ref(&a), &map), ["pv-a", "pv-s"]);
    }

    fn node_with_volumes(names: &[&str]) -> Node {
        Node {
            status: Some(NodeStatus {
                volumes_attached: Some(
                    names
                        .iter()
                        .map(|n| AttachedVolume {
                            name: (*n).into(),
                            device_path: String::new(),
                        })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn detach_is_done_when_no_id_appears_in_volumes_attached() {
        let node = node_with_volumes(&[
            "kubernetes.io/csi/ebs.csi.aws.com^vol-0abc",
            "kubernetes.io/aws-ebs/vol-9",
        ]);
        assert!(!volumes_detached(&["vol-0abc".into()], Some(&node)));
        assert!(!volumes_detached(&["vol-9".into(), "vol-x".into()], Some(&node)));
        assert!(volumes_detached(&["vol-x".into()], Some(&node)));
        assert!(
            volumes_detached(&[String::new()], Some(&node)),
            "an empty ID matches nothing"
        );
        assert!(volumes_detached(&["vol-0abc".into()], None), "the node is gone");
        assert!(no_volumes_attached(Some(&node_with_volumes(&[]))));
        assert!(!no_volumes_attached(Some(&node)));
    }

    fn attachment(pv: &str, node: &str, attached: bool, deleting: bool) -> VolumeAttachment {
        VolumeAttachment {
            metadata: ObjectMeta {
                name: Some(format!("va-{pv}-{node}")),
                deletion_timestamp: deleting.then(|| Time(at(1))),
                ..ObjectMeta::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: "csi".into(),
                node_name: node.into(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some(pv.into()),
                    inline_volume_spec: None,
                },
            },
            status: Some(VolumeAttachmentStatus {
                attached,
                ..VolumeAttachmentStatus::default()
            }),
        }
    }

    #[test]
    fn reattach_is_done_when_attached_on_another_node() {
        let vas = [
            attachment("pv-1", "node-1", true, false),
            attachment("pv-1", "node-2", false, false),
        ];
        assert!(
            !volume_reattached("pv-1", "node-1", &vas),
            "not attached yet elsewhere"
        );
        let vas = [attachment("pv-1", "node-2", true, false)];
        assert!(volume_reattached("pv-1", "node-1", &vas));
        assert!(!volume_reattached("pv-2", "node-1", &vas));
    }

    #[test]
    fn live_attachments_are_the_nodes_not_being_deleted() {
        let vas = [
            attachment("pv-1", "node-1", true, false),
            attachment("pv-2", "node-1", true, true),
            attachment("pv-3", "node-2", true, false),
        ];
        let live = live_volume_attachments("node-1", &vas);
        assert_eq!(live.len(), 1);
        assert_eq!(
            live[0].spec.source.persistent_volume_name.as_deref(),
            Some("pv-1")
        );
    }

    #[test]
    fn waiting_for_pods_follows_uid_and_phase() {
        let p = pod("p");
        let evicted = PodRef::of(&p);
        assert!(!pod_gone(&evicted, Some(&p)));
        assert!(pod_gone(&evicted, None));
        let mut replacement = p.clone();
        replacement.metadata.uid = Some("other".into());
        assert!(
            pod_gone(&evicted, Some(&replacement)),
            "a new pod under the same name"
        );
        let mut finished = p.clone();
        finished.status = Some(PodStatus {
            phase: Some("Failed".into()),
            ..PodStatus::default()
        });
        assert!(wait_done(&evicted, Some(&finished)));
        assert!(!wait_done(&evicted, Some(&p)));
    }

    #[test]
    fn wait_times_follow_the_grace_period() {
        let s = settings();
        let mut p = pod("p");
        assert_eq!(
            pod_gone_timeout(&p, Duration::from_hours(2)),
            Duration::from_mins(1)
        );
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(600);
        assert_eq!(
            pod_gone_timeout(&p, Duration::from_mins(1)),
            Duration::from_secs(90)
        );
        assert_eq!(detach_timeout(&p, &s), Duration::from_mins(12));
    }

    proptest! {
        #[test]
        fn serial_order_is_priority_descending_then_name(
            specs in proptest::collection::vec((0usize..40, proptest::option::of(-5i32..5), any::<bool>()), 0..30)
        ) {
            let pods: Vec<Pod> = specs
                .iter()
                .enumerate()
                .map(|(i, (n, priority, pvc))| {
                    let mut p = pod(&format!("p{n}-{i}"));
                    p.spec.as_mut().unwrap().priority = *priority;
                    if *pvc { with_claim(p, "c") } else { p }
                })
                .collect();
            let drain = plan("node-1", &pods);
            // Every pod lands in exactly one list.
            let all: BTreeSet<PodRef> = pods.iter().map(PodRef::of).collect();
            let planned: BTreeSet<PodRef> = drain.parallel.iter().chain(&drain.serial).cloned().collect();
            prop_assert_eq!(all, planned);
            prop_assert_eq!(drain.serial.len(), specs.iter().filter(|s| s.2).count());
            // Serial: priority descending, ties by name.
            let priority_of = |r: &PodRef| {
                pods.iter().find(|p| PodRef::of(p) == *r).and_then(|p| p.spec.as_ref()?.priority).unwrap_or(0)
            };
            for pair in drain.serial.windows(2) {
                let (a, b) = (priority_of(&pair[0]), priority_of(&pair[1]));
                prop_assert!(a > b || (a == b && pair[0].name < pair[1].name));
            }
        }
    }
}
