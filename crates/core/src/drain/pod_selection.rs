//! Which pods a drain evicts, waits for or leaves alone, in what order, and when an evicted or awaited pod is gone.
//!
//! Separate because it is the per-pod part of a drain: it reads pods only.

use std::{cmp::Reverse, fmt, time::Duration};

use k8s_openapi::{
    Resource as _,
    api::{apps::v1::DaemonSet, core::v1::Pod},
};
use mcm_api::{MetaExt, keys::extensions};

use super::{DEFAULT_GRACE_PERIOD, DRAIN_SKIP, DRAIN_WAIT_COMPLETED, MIRROR_POD_ANNOTATION, POD_GONE_SLACK};
use crate::timeouts::EffectiveSettings;

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
    pod.annotation(MIRROR_POD_ANNOTATION).is_some()
}

/// Whether `pod`'s controller (the owner reference with `controller: true`) is a DaemonSet.
pub fn is_daemonset_pod(pod: &Pod) -> bool {
    pod.controller_refs().any(|o| o.kind == DaemonSet::KIND)
}

/// The pod's `drain.machine.sapcloud.io` label.
fn drain_label(pod: &Pod) -> Option<&str> {
    pod.label(extensions::DRAIN_LABEL)
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
    } else if pod.is_deleting() {
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
