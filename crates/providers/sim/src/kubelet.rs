//! The simulated kubelet: registers a Node for each running VM of a [`SimDriver`] and heartbeats it through its
//! Lease in `kube-node-lease`, the way KWOK does.
//!
//! Write pattern (per node):
//! - **Registration**, once the VM's boot delay has passed: one node create (with its full status) and one Lease
//!   create. A node of the same name that exists already is adopted (kubelet does the same), and its status
//!   rewritten if it differs.
//! - **Heartbeat**, every heartbeat interval: one Lease write (a merge patch of `renewTime`, `holderIdentity`,
//!   `leaseDurationSeconds` and the owner reference to the node). Nothing else.
//! - **Status**, only when the node's status as the server has it differs from what the kubelet would report:
//!   after a fault changed a condition, or after someone else (the node lifecycle turning it Unknown) changed it.
//!   The kubelet watches the nodes to know (a read, not a write).
//!
//! With stopped heartbeats (fault) the kubelet writes nothing for the node. When the VM is deleted or vanishes the
//! kubelet forgets the node: no more writes, and the Node is not deleted (the machine controller deletes nodes).
//! A Node deleted by someone else while its VM runs is not registered again (a real kubelet registers once per
//! start, too).
//!
//! **Pods and volumes** (what a drain needs from a kubelet; the kubelet watches pods, PersistentVolumeClaims,
//! PersistentVolumes and VolumeAttachments, reads only):
//! - Its nodes carry the annotation [`AGENT_TERMINATES_PODS`] `"true"`: the embedded API server then leaves the
//!   deleting pods of these nodes to the kubelet while the node's Lease is fresh. A pod bound to one of its nodes
//!   that is being deleted is ended (deleted with grace 0, uid precondition) once its `deletionTimestamp` (the end
//!   of its grace period) has passed. A pending pod bound to one of its nodes is started: phase `Running`,
//!   conditions `PodScheduled`, `Initialized`, `ContainersReady` and `Ready` True (one status write, guarded by
//!   the pod's resourceVersion so a concurrent status change is never overwritten).
//! - Volumes, as the attach/detach controller and the CSI attacher keep them: while a pod bound to the node and
//!   not finished uses a PersistentVolumeClaim (or a generic ephemeral volume's claim) bound to a CSI
//!   PersistentVolume of the driver [`crate::CSI_DRIVER`], the volume is attached: a VolumeAttachment
//!   (`csi-<hash>`, attacher the driver, `status.attached` true) and the entry `kubernetes.io/csi/<driver>^<volume
//!   handle>` in `node.status.volumesAttached`. When no such pod remains (the last one ended or finished), it is
//!   detached: the entry is removed, then the VolumeAttachment deleted. Entries of other drivers are kept.
//! - Every write happens only when the state on the server differs from the wanted state, and nothing is done
//!   before the watches have listed once. With stopped heartbeats (a dead kubelet) or a node deleted by someone
//!   else, nothing is done for that node's pods and volumes; the server then ends its deleting pods itself once the
//!   Lease is stale.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt as _, stream};
use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{
            AttachedVolume, Node, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, PersistentVolume,
            PersistentVolumeClaim, Pod,
        },
        storage::v1::{
            VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
        },
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time},
    },
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams},
};
use serde_json::{Value, json};
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
    time::Instant,
};

use crate::{
    SimDriver,
    driver::{Shared, Vm},
    faults::NodeFaults,
};

/// The namespace of node Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// The label holding the node's name.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The label holding the VM's size.
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
/// Pods a node takes (the kubelet default `maxPods`).
pub const MAX_PODS: u32 = 110;
/// Node annotation by which the kubelet says it ends its nodes' deleting pods itself (value `"true"`). The same
/// string as `mcm_apiserver::pods::AGENT_TERMINATES_PODS` (the embedded API server then leaves such pods to the
/// kubelet while the node's Lease is fresh); copied, since this crate does not depend on the server.
pub const AGENT_TERMINATES_PODS: &str = "node.machine.sapcloud.io/agent-terminates-pods";

/// Configuration of a [`Kubelet`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletConfig {
    /// How often each node's Lease is renewed (default 10 s, the kubelet's).
    pub heartbeat_interval: Duration,
    /// How long after its VM's creation a node registers (default 0).
    pub boot_delay: Duration,
    /// `leaseDurationSeconds` of the Leases (default 40 s, the kubelet's).
    pub lease_duration: Duration,
    /// `status.nodeInfo.kubeletVersion` (default `v1.32.0-sim`).
    pub kubelet_version: String,
    /// How many API requests the kubelet has in flight at most (default 16).
    pub max_concurrent_requests: usize,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(10),
            boot_delay: Duration::ZERO,
            lease_duration: Duration::from_secs(40),
            kubelet_version: "v1.32.0-sim".into(),
            max_concurrent_requests: 16,
        }
    }
}

/// The API writes a kubelet made (successful ones) and its failed requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KubeletStats {
    /// Nodes created.
    pub node_creates: u64,
    /// Node status writes.
    pub node_status_writes: u64,
    /// Leases created.
    pub lease_creates: u64,
    /// Lease renewals.
    pub lease_renewals: u64,
    /// Pods started (status written `Running` and Ready).
    pub pods_started: u64,
    /// Deleting pods ended (deleted with grace 0) after their grace period.
    pub pods_ended: u64,
    /// Volume writes: VolumeAttachments created, marked attached or deleted, and `volumesAttached` patches.
    pub volume_writes: u64,
    /// Requests that failed (retried later).
    pub failed_requests: u64,
}

#[derive(Default)]
struct Counters {
    node_creates: AtomicU64,
    node_status_writes: AtomicU64,
    lease_creates: AtomicU64,
    lease_renewals: AtomicU64,
    pods_started: AtomicU64,
    pods_ended: AtomicU64,
    volume_writes: AtomicU64,
    failed_requests: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The simulated kubelet of a [`SimDriver`]: one tokio task for every node of the driver.
#[derive(Debug)]
pub struct Kubelet;

impl Kubelet {
    /// Starts the kubelet of `driver` against the cluster of `client` (nodes are written with that client's
    /// credentials). It runs until the handle is stopped or dropped.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(driver: &SimDriver, client: Client, config: KubeletConfig) -> KubeletHandle {
        let counters = Arc::new(Counters::default());
        let (stop_tx, stop_rx) = oneshot::channel();
        let runner = Runner {
            shared: Arc::clone(driver.shared()),
            client: client.clone(),
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client, NODE_LEASE_NAMESPACE),
            retry_delay: config.heartbeat_interval.min(Duration::from_secs(1)),
            config,
            counters: Arc::clone(&counters),
            tracks: HashMap::new(),
            retries: HashMap::new(),
            observed: HashMap::new(),
            world: World::default(),
        };
        let task = tokio::spawn(runner.run(stop_rx));
        KubeletHandle {
            stop: Some(stop_tx),
            task: Some(task),
            counters,
        }
    }
}

/// A running kubelet; dropping it stops the kubelet.
pub struct KubeletHandle {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for KubeletHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletHandle")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl KubeletHandle {
    /// The kubelet's API writes so far.
    pub fn stats(&self) -> KubeletStats {
        let c = &self.counters;
        KubeletStats {
            node_creates: c.node_creates.load(Ordering::Relaxed),
            node_status_writes: c.node_status_writes.load(Ordering::Relaxed),
            lease_creates: c.lease_creates.load(Ordering::Relaxed),
            lease_renewals: c.lease_renewals.load(Ordering::Relaxed),
            pods_started: c.pods_started.load(Ordering::Relaxed),
            pods_ended: c.pods_ended.load(Ordering::Relaxed),
            volume_writes: c.volume_writes.load(Ordering::Relaxed),
            failed_requests: c.failed_requests.load(Ordering::Relaxed),
        }
    }

    /// Stops the kubelet and waits for its task to end (a request in flight completes first).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for KubeletHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a watch reports.
enum Seen<K> {
    /// A fresh list: every object, at this resourceVersion.
    Reset(Vec<K>, Option<u64>),
    /// An object was added or modified.
    Applied(K),
    /// An object was deleted.
    Deleted(K),
}

/// What the node watch reports.
type NodeEvent = Seen<Node>;

/// What the kubelet's watches report.
enum Event {
    Node(Seen<Node>),
    Pod(Seen<Pod>),
    Claim(Seen<PersistentVolumeClaim>),
    Volume(Seen<PersistentVolume>),
    Attachment(Seen<VolumeAttachment>),
}

/// A node the kubelet registered (or adopted).
struct Track {
    /// The VM the node is for.
    vm_id: u64,
    /// The node's uid.
    uid: String,
    /// When the Lease is renewed next.
    next_renew: Instant,
    /// No status write before this (after a failed one).
    status_retry_at: Option<Instant>,
    /// The node was deleted by someone else: the kubelet leaves it alone.
    gone: bool,
    /// The fingerprint of the status the node should have, and the faults it was computed for.
    wanted: Option<(Option<NodeFaults>, Value)>,
}

impl Track {
    /// The fingerprint of the status the node should have with these faults (cached: a VM does not change, so
    /// only its faults do).
    fn wanted(&mut self, faults: Option<&NodeFaults>, compute: impl FnOnce() -> Value) -> &Value {
        let wanted = match self.wanted.take() {
            Some((cached, fingerprint)) if cached.as_ref() == faults => (cached, fingerprint),
            _ => (faults.cloned(), compute()),
        };
        &self.wanted.insert(wanted).1
    }
}

/// Which nodes a pass brings up to date.
enum Scope {
    /// Every node.
    All,
    /// These nodes (after watch events about them).
    Nodes(HashSet<String>),
}

impl Scope {
    fn add(&mut self, name: String) {
        if let Self::Nodes(names) = self {
            names.insert(name);
        }
    }

    fn contains(&self, name: &str) -> bool {
        match self {
            Self::All => true,
            Self::Nodes(names) => names.contains(name),
        }
    }
}

/// A node as last seen on the server.
struct Observed {
    uid: String,
    resource_version: Option<u64>,
    status: Option<NodeStatus>,
    /// The fingerprint of `status`.
    fingerprint: Option<Value>,
}

fn resource_version(node: &Node) -> Option<u64> {
    node.metadata
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
}

/// A namespaced object's namespace and name.
type PodKey = (String, String);

fn namespaced_key<K: Resource>(object: &K) -> (String, String) {
    let meta = object.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

fn uid_of<K: Resource>(object: &K) -> &str {
    object.meta().uid.as_deref().unwrap_or_default()
}

fn version_of<K: Resource>(object: &K) -> Option<u64> {
    object
        .meta()
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
}

/// Stores `object` under `key` unless the stored version is newer (a late watch event after the kubelet's own
/// write).
fn store<Q: std::hash::Hash + Eq, K: Resource>(map: &mut HashMap<Q, K>, key: Q, object: K) {
    if map
        .get(&key)
        .is_some_and(|current| version_of(current) > version_of(&object))
    {
        return;
    }
    map.insert(key, object);
}

/// Removes the object under `key` if it is the one deleted (same uid; a new object of the same name stays).
fn forget<Q: std::hash::Hash + Eq, K: Resource>(map: &mut HashMap<Q, K>, key: &Q, deleted: &K) {
    if map
        .get(key)
        .is_some_and(|current| uid_of(current) == uid_of(deleted))
    {
        map.remove(key);
    }
}

/// Applies a watch event to a map of objects.
fn apply_keyed<Q: std::hash::Hash + Eq, K: Resource>(
    map: &mut HashMap<Q, K>,
    event: Seen<K>,
    key: impl Fn(&K) -> Q,
) {
    match event {
        Seen::Reset(objects, _) => {
            *map = objects.into_iter().map(|o| (key(&o), o)).collect();
        }
        Seen::Applied(object) => store(map, key(&object), object),
        Seen::Deleted(object) => forget(map, &key(&object), &object),
    }
}

/// The node a pod is bound to.
fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn pod_phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// A pod that has finished (its volumes are unmounted).
fn finished(pod: &Pod) -> bool {
    matches!(pod_phase(pod), Some("Succeeded" | "Failed"))
}

/// The name of a volume in `node.status.volumesAttached` (`kubernetes.io/csi/<driver>^<handle>`, as the CSI
/// attacher names it).
fn attached_volume_name(handle: &str) -> String {
    format!("{}{handle}", attached_volume_prefix())
}

fn attached_volume_prefix() -> String {
    format!("kubernetes.io/csi/{}^", crate::CSI_DRIVER)
}

/// The VolumeAttachment name of a volume on a node: `csi-` and a hash of handle, attacher and node (Kubernetes
/// takes a SHA-256 of the same three; a 64-bit FNV-1a is enough to keep names apart here).
fn attachment_name(handle: &str, node: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in [handle, crate::CSI_DRIVER, node].join("\0").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("csi-{hash:016x}")
}

/// The pod-related watches. Nothing is decided on one before it has listed once (an empty map is not an empty
/// cluster).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Watched {
    Pods,
    Claims,
    Volumes,
    Attachments,
}

/// Pods, claims, volumes and the sim driver's VolumeAttachments as the watches report them, and what the kubelet
/// did that the watches may not show yet.
#[derive(Default)]
struct World {
    pods: HashMap<PodKey, Pod>,
    claims: HashMap<(String, String), PersistentVolumeClaim>,
    volumes: HashMap<String, PersistentVolume>,
    /// VolumeAttachments of the sim CSI driver, by name.
    attachments: HashMap<String, VolumeAttachment>,
    /// uids of the pods the kubelet ended, until the watch reports them deleted: a late event does not bring such a
    /// pod back, and one kept by finalizers is neither deleted again nor counted as using its volumes.
    ended: HashSet<String>,
    /// uids of the VolumeAttachments the kubelet deleted, until the watch reports them deleted.
    detached: HashSet<String>,
    /// The watches that have listed once.
    synced: HashSet<Watched>,
    /// After a failed pod or volume request: no such request before this.
    retry_at: Option<Instant>,
}

impl World {
    /// Records a pod watch event; returns the node the pod is bound to.
    fn apply_pod(&mut self, event: Seen<Pod>, scope: &mut Scope) -> Option<String> {
        match event {
            Seen::Reset(pods, _) => {
                self.pods = pods.into_iter().map(|p| (namespaced_key(&p), p)).collect();
                let uids: HashSet<&str> = self.pods.values().map(uid_of).collect();
                self.ended.retain(|uid| uids.contains(uid.as_str()));
                self.synced.insert(Watched::Pods);
                *scope = Scope::All;
                None
            }
            Seen::Applied(pod) => {
                let node = bound_node(&pod).map(str::to_owned);
                let key = namespaced_key(&pod);
                let held = self.pods.get(&key).is_some_and(|p| uid_of(p) == uid_of(&pod));
                // A late event about a pod the kubelet ended (and forgot) does not bring it back.
                if held || !self.ended.contains(uid_of(&pod)) {
                    store(&mut self.pods, key, pod);
                }
                node
            }
            Seen::Deleted(pod) => {
                self.ended.remove(uid_of(&pod));
                forget(&mut self.pods, &namespaced_key(&pod), &pod);
                bound_node(&pod).map(str::to_owned)
            }
        }
    }

    /// Records a VolumeAttachment watch event (only the sim driver's are kept); returns the node it is for.
    fn apply_attachment(&mut self, event: Seen<VolumeAttachment>, scope: &mut Scope) -> Option<String> {
        let ours = |va: &VolumeAttachment| va.spec.attacher == crate::CSI_DRIVER;
        match event {
            Seen::Reset(attachments, _) => {
                self.attachments = attachments
                    .into_iter()
                    .filter(ours)
                    .map(|va| (va.name_any(), va))
                    .collect();
                let uids: HashSet<&str> = self.attachments.values().map(uid_of).collect();
                self.detached.retain(|uid| uids.contains(uid.as_str()));
                self.synced.insert(Watched::Attachments);
                *scope = Scope::All;
                None
            }
            Seen::Applied(va) if ours(&va) => {
                let node = va.spec.node_name.clone();
                if !self.detached.contains(uid_of(&va)) {
                    store(&mut self.attachments, va.name_any(), va);
                }
                Some(node)
            }
            Seen::Deleted(va) if ours(&va) => {
                self.detached.remove(uid_of(&va));
                forget(&mut self.attachments, &va.name_any(), &va);
                Some(va.spec.node_name)
            }
            Seen::Applied(_) | Seen::Deleted(_) => None,
        }
    }

    /// The CSI volumes of the sim driver a pod uses: (PersistentVolume name, volume handle), through its claims
    /// (`persistentVolumeClaim` volumes and generic ephemeral volumes, whose claim is `<pod>-<volume>`) and the
    /// volumes they are bound to.
    fn csi_volumes(&self, pod: &Pod) -> Vec<(String, String)> {
        let (namespace, pod_name) = namespaced_key(pod);
        pod.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|volume| {
                let claim = match (&volume.persistent_volume_claim, &volume.ephemeral) {
                    (Some(source), _) => source.claim_name.clone(),
                    (None, Some(_)) => format!("{pod_name}-{}", volume.name),
                    (None, None) => return None,
                };
                let pv = self
                    .claims
                    .get(&(namespace.clone(), claim))?
                    .spec
                    .as_ref()?
                    .volume_name
                    .clone()
                    .filter(|n| !n.is_empty())?;
                let csi = self.volumes.get(&pv)?.spec.as_ref()?.csi.as_ref()?;
                (csi.driver == crate::CSI_DRIVER && !csi.volume_handle.is_empty())
                    .then(|| (pv, csi.volume_handle.clone()))
            })
            .collect()
    }
}

/// The VM fields the kubelet needs.
struct VmView {
    id: u64,
    provider_id: String,
    size: crate::sizes::Size,
    root_fs_size: Option<u64>,
    addresses: Vec<k8s_openapi::api::core::v1::NodeAddress>,
    boot_at: Instant,
}

/// One API job of a pass.
enum Job {
    Register {
        vm_id: u64,
        node: Box<Node>,
    },
    Renew {
        name: String,
        uid: String,
    },
    Status {
        name: String,
        status: Box<NodeStatus>,
    },
    /// Mark a pending pod Running and Ready.
    StartPod {
        key: PodKey,
        resource_version: String,
    },
    /// Delete a pod whose grace period has passed, with grace 0.
    EndPod {
        key: PodKey,
        uid: String,
    },
    /// Bring a node's volumes in step with its pods.
    Volumes(Box<VolumeJob>),
}

/// What a node's volumes need: VolumeAttachments to create (or mark attached), the new `volumesAttached` list,
/// VolumeAttachments to delete. Done in this order.
struct VolumeJob {
    node: String,
    /// (PersistentVolume name, volume handle) to attach.
    attach: Vec<(String, String)>,
    /// The node's `status.volumesAttached` to write, when it changes.
    entries: Option<Vec<AttachedVolume>>,
    /// (name, uid) of the VolumeAttachments to delete.
    detach: Vec<(String, String)>,
}

/// The outcome of a job.
enum Done {
    Registered {
        name: String,
        vm_id: u64,
        node: Box<Node>,
        lease_ok: bool,
    },
    RegisterFailed {
        name: String,
    },
    Renewed {
        name: String,
        ok: bool,
    },
    StatusWritten {
        name: String,
        node: Option<Box<Node>>,
        gone: bool,
    },
    PodStarted {
        pod: Option<Box<Pod>>,
        ok: bool,
    },
    PodEnded {
        key: PodKey,
        uid: String,
        /// The pod as it still is (held by finalizers), if it is.
        left: Option<Box<Pod>>,
        ok: bool,
    },
    VolumesWritten {
        node: String,
        attached: Vec<VolumeAttachment>,
        written: Option<Box<Node>>,
        /// (name, uid) of the VolumeAttachments deleted.
        detached: Vec<(String, String)>,
        ok: bool,
    },
}

struct Runner {
    shared: Arc<Shared>,
    client: Client,
    nodes: Api<Node>,
    leases: Api<Lease>,
    config: KubeletConfig,
    retry_delay: Duration,
    counters: Arc<Counters>,
    /// Registered nodes by name.
    tracks: HashMap<String, Track>,
    /// Registration retry times by node name.
    retries: HashMap<String, Instant>,
    /// Nodes as the server has them, by name.
    observed: HashMap<String, Observed>,
    /// Pods, claims, volumes and VolumeAttachments as the server has them.
    world: World,
}

/// The healthy conditions of a kubelet, in the kubelet's order: type, status, reason, message.
const KUBELET_CONDITIONS: [(&str, &str, &str, &str); 4] = [
    (
        "MemoryPressure",
        "False",
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
    ),
    (
        "DiskPressure",
        "False",
        "KubeletHasNoDiskPressure",
        "kubelet has no disk pressure",
    ),
    (
        "PIDPressure",
        "False",
        "KubeletHasSufficientPID",
        "kubelet has sufficient PID available",
    ),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
];

/// The conditions the node reports (without times), faults applied.
fn desired_conditions(faults: Option<&NodeFaults>) -> Vec<NodeCondition> {
    let forced = faults.map(|f| &f.conditions);
    let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: None,
        last_transition_time: None,
    };
    let mut conditions: Vec<NodeCondition> = KUBELET_CONDITIONS
        .iter()
        .map(|&(type_, healthy, reason, message)| {
            match forced.and_then(|f| f.get(type_)).map(|s| s.as_str()) {
                Some(status) if status != healthy => {
                    if type_ == "Ready" && status == "False" {
                        condition(
                            type_,
                            status,
                            "KubeletNotReady",
                            "the node is not ready (simulated fault)",
                        )
                    } else {
                        condition(type_, status, "SimulatedFault", "set by fault injection")
                    }
                }
                _ => condition(type_, healthy, reason, message),
            }
        })
        .collect();
    for (type_, status) in forced.into_iter().flatten() {
        if !KUBELET_CONDITIONS.iter().any(|c| c.0 == type_) {
            conditions.push(condition(
                type_,
                status.as_str(),
                "SimulatedFault",
                "set by fault injection",
            ));
        }
    }
    conditions
}

/// The status the node reports, without condition times.
fn desired_status(vm: &VmView, faults: Option<&NodeFaults>, kubelet_version: &str) -> NodeStatus {
    let mut resources = BTreeMap::from([
        ("cpu".to_owned(), vm.size.cpu_quantity()),
        ("memory".to_owned(), vm.size.memory_quantity()),
        ("pods".to_owned(), Quantity(MAX_PODS.to_string())),
    ]);
    if let Some(gb) = vm.root_fs_size {
        resources.insert("ephemeral-storage".into(), Quantity(format!("{gb}G")));
    }
    NodeStatus {
        addresses: Some(vm.addresses.clone()),
        allocatable: Some(resources.clone()),
        capacity: Some(resources),
        conditions: Some(desired_conditions(faults)),
        node_info: Some(NodeSystemInfo {
            architecture: "amd64".into(),
            boot_id: format!("sim-boot-{}", vm.id),
            container_runtime_version: "sim://1.0.0".into(),
            kernel_version: "6.1.0-sim".into(),
            kube_proxy_version: String::new(),
            kubelet_version: kubelet_version.into(),
            machine_id: format!("sim-machine-{}", vm.id),
            operating_system: "linux".into(),
            os_image: "Simulated Linux".into(),
            swap: None,
            system_uuid: format!("sim-{}", vm.id),
        }),
        ..NodeStatus::default()
    }
}

/// The part of a status the kubelet reports, without times and with conditions sorted by type: two statuses
/// with the same fingerprint need no write.
fn fingerprint(status: &NodeStatus) -> Value {
    let mut conditions: Vec<Value> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| json!([c.type_, c.status, c.reason, c.message]))
        .collect();
    conditions.sort_by(|a, b| a[0].as_str().cmp(&b[0].as_str()));
    json!({
        "addresses": status.addresses,
        "allocatable": status.allocatable,
        "capacity": status.capacity,
        "nodeInfo": status.node_info,
        "conditions": conditions,
    })
}

/// The status to write: `desired` with heartbeat times `now`, and transition times kept from `current` for
/// conditions whose status did not change.
fn stamped(mut desired: NodeStatus, current: Option<&NodeStatus>, now: jiff::Timestamp) -> NodeStatus {
    for condition in desired.conditions.iter_mut().flatten() {
        let kept = current
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == condition.type_))
            .filter(|c| c.status == condition.status)
            .and_then(|c| c.last_transition_time.clone());
        condition.last_heartbeat_time = Some(Time(now));
        condition.last_transition_time = Some(kept.unwrap_or(Time(now)));
    }
    desired
}

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

impl Runner {
    async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        let (events_tx, mut events) = mpsc::channel(1024);
        let client = self.client.clone();
        let _watches = [
            AbortOnDrop(tokio::spawn(watch_objects(
                self.nodes.clone(),
                events_tx.clone(),
                Event::Node,
            ))),
            AbortOnDrop(tokio::spawn(watch_objects(
                Api::<Pod>::all(client.clone()),
                events_tx.clone(),
                Event::Pod,
            ))),
            AbortOnDrop(tokio::spawn(watch_objects(
                Api::<PersistentVolumeClaim>::all(client.clone()),
                events_tx.clone(),
                Event::Claim,
            ))),
            AbortOnDrop(tokio::spawn(watch_objects(
                Api::<PersistentVolume>::all(client.clone()),
                events_tx.clone(),
                Event::Volume,
            ))),
            AbortOnDrop(tokio::spawn(watch_objects(
                Api::<VolumeAttachment>::all(client),
                events_tx,
                Event::Attachment,
            ))),
        ];
        let mut driver_changes = self.shared.subscribe();
        let mut wake = Instant::now();
        let mut events_open = true;
        loop {
            let scope = tokio::select! {
                biased;
                _ = &mut stop => return,
                result = driver_changes.changed() => {
                    if result.is_err() {
                        // The driver is gone: nothing is left to simulate.
                        return;
                    }
                    Scope::All
                }
                event = events.recv(), if events_open => {
                    let Some(event) = event else {
                        events_open = false;
                        continue;
                    };
                    let mut scope = Scope::Nodes(HashSet::new());
                    self.apply(event, &mut scope);
                    while let Ok(event) = events.try_recv() {
                        self.apply(event, &mut scope);
                    }
                    scope
                }
                () = tokio::time::sleep_until(wake) => Scope::All,
            };
            if matches!(&scope, Scope::Nodes(names) if names.is_empty()) {
                continue;
            }
            let next = self.pass(&scope).await;
            wake = match scope {
                Scope::All => next,
                Scope::Nodes(_) => wake.min(next),
            };
        }
    }

    /// Records a watch event, adding the nodes the kubelet manages that it concerns to `scope`.
    fn apply(&mut self, event: Event, scope: &mut Scope) {
        match event {
            Event::Node(event) => self.apply_node(event, scope),
            Event::Pod(event) => {
                if let Some(node) = self.world.apply_pod(event, scope)
                    && self.tracks.contains_key(&node)
                {
                    scope.add(node);
                }
            }
            Event::Claim(event) => {
                if matches!(event, Seen::Reset(..)) {
                    self.world.synced.insert(Watched::Claims);
                }
                apply_keyed(&mut self.world.claims, event, namespaced_key);
                *scope = Scope::All;
            }
            Event::Volume(event) => {
                if matches!(event, Seen::Reset(..)) {
                    self.world.synced.insert(Watched::Volumes);
                }
                apply_keyed(&mut self.world.volumes, event, |v: &PersistentVolume| {
                    v.name_any()
                });
                *scope = Scope::All;
            }
            Event::Attachment(event) => {
                if let Some(node) = self.world.apply_attachment(event, scope)
                    && self.tracks.contains_key(&node)
                {
                    scope.add(node);
                }
            }
        }
    }

    /// Records a node watch event.
    fn apply_node(&mut self, event: NodeEvent, scope: &mut Scope) {
        match event {
            NodeEvent::Reset(nodes, list_rv) => {
                let mut observed: HashMap<String, Observed> = nodes
                    .into_iter()
                    .filter_map(|node| Some((node.metadata.name.clone()?, observed_of(node))))
                    .collect();
                // Keep what the kubelet wrote after the list was taken.
                for (name, seen) in self.observed.drain() {
                    if !observed.contains_key(&name)
                        && seen.resource_version.is_some_and(|rv| Some(rv) > list_rv)
                    {
                        observed.insert(name, seen);
                    }
                }
                self.observed = observed;
                *scope = Scope::All;
            }
            NodeEvent::Applied(node) => {
                let Some(name) = node.metadata.name.clone() else {
                    return;
                };
                self.observe(&name, node);
                if self.tracks.contains_key(&name) {
                    scope.add(name);
                }
            }
            NodeEvent::Deleted(node) => {
                let Some(name) = node.metadata.name.clone() else {
                    return;
                };
                let uid = node.metadata.uid.clone().unwrap_or_default();
                if self.observed.get(&name).is_some_and(|o| o.uid == uid) {
                    self.observed.remove(&name);
                }
                if let Some(track) = self.tracks.get_mut(&name)
                    && track.uid == uid
                {
                    tracing::debug!(node = name, "sim kubelet: node deleted by someone else");
                    track.gone = true;
                }
            }
        }
    }

    /// Records a node as the server has it, unless an already seen version is newer.
    fn observe(&mut self, name: &str, node: Node) {
        let seen = observed_of(node);
        if let Some(current) = self.observed.get(name)
            && current.uid == seen.uid
            && current.resource_version > seen.resource_version
        {
            return;
        }
        self.observed.insert(name.to_owned(), seen);
    }

    /// The running VMs (the oldest per node name) and the kubelet faults.
    fn snapshot(&self, scope: &Scope) -> (BTreeMap<String, VmView>, BTreeMap<String, NodeFaults>) {
        let state = self.shared.lock();
        let mut vms = BTreeMap::new();
        for vm in state.vms.values().filter(|vm| scope.contains(&vm.node_name)) {
            vms.entry(vm.node_name.clone()).or_insert_with(|| self.view(vm));
        }
        (vms, state.node_faults.clone())
    }

    fn view(&self, vm: &Vm) -> VmView {
        VmView {
            id: vm.id,
            provider_id: vm.provider_id.clone(),
            size: vm.provider_spec.size,
            root_fs_size: vm.provider_spec.root_fs_size,
            addresses: vm.addresses(),
            boot_at: vm.created + self.config.boot_delay,
        }
    }

    /// Brings every node up to date: registrations due, Lease renewals due, status writes needed. Returns when
    /// to run again at the latest.
    async fn pass(&mut self, scope: &Scope) -> Instant {
        let (jobs, wake) = self.plan(Instant::now(), scope);
        if jobs.is_empty() {
            return wake;
        }
        let done: Vec<Done> = stream::iter(jobs)
            .map(|job| self.execute(job))
            .buffer_unordered(self.config.max_concurrent_requests.max(1))
            .collect()
            .await;
        self.settle(done, wake)
    }

    /// The jobs due at `now` for the nodes of `scope`, and when to run again at the latest (for them).
    fn plan(&mut self, now: Instant, scope: &Scope) -> (Vec<Job>, Instant) {
        let interval = self.config.heartbeat_interval;
        // Leases due within this slack are renewed together, so that nodes created close together share passes.
        let slack = interval / 20;
        let mut wake = now + interval;
        let (vms, faults) = self.snapshot(scope);
        // Forget the nodes whose VM went (or was replaced).
        self.tracks.retain(|name, track| {
            !scope.contains(name) || vms.get(name).is_some_and(|vm| vm.id == track.vm_id)
        });
        self.retries
            .retain(|name, _| !scope.contains(name) || vms.contains_key(name));

        let mut jobs = Vec::new();
        // The nodes whose pods and volumes the kubelet looks after now: registered, heartbeating, not deleted.
        let mut active = Vec::new();
        for (name, vm) in &vms {
            let faults = faults.get(name);
            if faults.is_some_and(|f| f.heartbeats_stopped) {
                continue;
            }
            let Some(track) = self.tracks.get_mut(name) else {
                let at = self
                    .retries
                    .get(name)
                    .map_or(vm.boot_at, |retry| (*retry).max(vm.boot_at));
                if at > now {
                    wake = wake.min(at);
                } else {
                    jobs.push(self.registration(name, vm, faults));
                }
                continue;
            };
            if track.gone {
                continue;
            }
            active.push(name.as_str());
            if track.next_renew <= now + slack {
                jobs.push(Job::Renew {
                    name: name.clone(),
                    uid: track.uid.clone(),
                });
            } else {
                wake = wake.min(track.next_renew);
            }
            let version = &self.config.kubelet_version;
            let wanted = track.wanted(faults, || fingerprint(&desired_status(vm, faults, version)));
            let observed = self.observed.get(name);
            if observed.is_none_or(|o| o.fingerprint.as_ref() != Some(wanted)) {
                match track.status_retry_at {
                    Some(at) if at > now => wake = wake.min(at),
                    _ => jobs.push(Job::Status {
                        name: name.clone(),
                        status: Box::new(stamped(
                            desired_status(vm, faults, version),
                            observed.and_then(|o| o.status.as_ref()),
                            jiff::Timestamp::now(),
                        )),
                    }),
                }
            }
        }
        match self.world.retry_at {
            Some(at) if at > now => wake = wake.min(at),
            _ => self.pod_jobs(&active, now, &mut jobs, &mut wake),
        }
        (jobs, wake)
    }

    /// The pod and volume jobs due for the `active` nodes: pending pods to start, deleting pods whose grace period
    /// has passed to end, volumes to attach or detach.
    fn pod_jobs(&self, active: &[&str], now: Instant, jobs: &mut Vec<Job>, wake: &mut Instant) {
        let world = &self.world;
        if !world.synced.contains(&Watched::Pods) || active.is_empty() {
            return;
        }
        let mut on_node: HashMap<&str, Vec<&Pod>> = active.iter().map(|n| (*n, Vec::new())).collect();
        for pod in world.pods.values() {
            if let Some(list) = bound_node(pod).and_then(|node| on_node.get_mut(node)) {
                list.push(pod);
            }
        }
        let wall = jiff::Timestamp::now();
        for (node, pods) in &on_node {
            for pod in pods {
                if let Some(deleting) = &pod.metadata.deletion_timestamp {
                    if world.ended.contains(uid_of(*pod)) {
                        continue;
                    }
                    match Duration::try_from(deleting.0.duration_since(wall)) {
                        Ok(left) if !left.is_zero() => *wake = (*wake).min(now + left),
                        _ => jobs.push(Job::EndPod {
                            key: namespaced_key(*pod),
                            uid: uid_of(*pod).to_owned(),
                        }),
                    }
                } else if matches!(pod_phase(pod), None | Some("Pending")) {
                    jobs.push(Job::StartPod {
                        key: namespaced_key(*pod),
                        resource_version: pod.metadata.resource_version.clone().unwrap_or_default(),
                    });
                }
            }
            if let Some(job) = self.volume_job(node, pods) {
                jobs.push(Job::Volumes(Box::new(job)));
            }
        }
    }

    /// What the node's volumes need, if anything: the sim CSI volumes used by its pods that have not finished (and
    /// were not ended) are attached, every other one of its volumes is detached.
    fn volume_job(&self, node: &str, pods: &[&Pod]) -> Option<VolumeJob> {
        let world = &self.world;
        if [Watched::Claims, Watched::Volumes, Watched::Attachments]
            .iter()
            .any(|w| !world.synced.contains(w))
        {
            return None;
        }
        let current = self.observed.get(node)?;
        let mut wanted: BTreeMap<String, String> = BTreeMap::new();
        for pod in pods
            .iter()
            .filter(|p| !finished(p) && !world.ended.contains(uid_of(**p)))
        {
            wanted.extend(world.csi_volumes(pod));
        }
        let attachments: Vec<&VolumeAttachment> = world
            .attachments
            .values()
            .filter(|va| va.spec.node_name == node && va.metadata.deletion_timestamp.is_none())
            .collect();
        let pv_of = |va: &VolumeAttachment| va.spec.source.persistent_volume_name.clone();
        let attach: Vec<(String, String)> = wanted
            .iter()
            .filter(|(pv, _)| {
                !attachments.iter().any(|va| {
                    pv_of(va).as_ref() == Some(*pv) && va.status.as_ref().is_some_and(|s| s.attached)
                })
            })
            .map(|(pv, handle)| (pv.clone(), handle.clone()))
            .collect();
        let detach: Vec<(String, String)> = attachments
            .iter()
            .filter(|va| pv_of(va).is_none_or(|pv| !wanted.contains_key(&pv)))
            .map(|va| (va.name_any(), uid_of(*va).to_owned()))
            .collect();
        let prefix = attached_volume_prefix();
        let listed = current
            .status
            .as_ref()
            .and_then(|s| s.volumes_attached.clone())
            .unwrap_or_default();
        let mut have: Vec<&str> = listed
            .iter()
            .map(|v| v.name.as_str())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        have.sort_unstable();
        let mut want: Vec<String> = wanted.values().map(|h| attached_volume_name(h)).collect();
        want.sort_unstable();
        want.dedup();
        let entries = (have != want).then(|| {
            listed
                .iter()
                .filter(|v| !v.name.starts_with(&prefix))
                .cloned()
                .chain(want.iter().map(|name| AttachedVolume {
                    name: name.clone(),
                    device_path: String::new(),
                }))
                .collect()
        });
        (!attach.is_empty() || !detach.is_empty() || entries.is_some()).then(|| VolumeJob {
            node: node.to_owned(),
            attach,
            entries,
            detach,
        })
    }

    /// The registration of a VM's node: labels, provider ID and full status.
    fn registration(&self, name: &str, vm: &VmView, faults: Option<&NodeFaults>) -> Job {
        let status = stamped(
            desired_status(vm, faults, &self.config.kubelet_version),
            None,
            jiff::Timestamp::now(),
        );
        Job::Register {
            vm_id: vm.id,
            node: Box::new(Node {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    annotations: Some(BTreeMap::from([(
                        AGENT_TERMINATES_PODS.to_owned(),
                        "true".to_owned(),
                    )])),
                    labels: Some(BTreeMap::from([
                        (HOSTNAME_LABEL.to_owned(), name.to_owned()),
                        (INSTANCE_TYPE_LABEL.to_owned(), vm.size.name.to_owned()),
                    ])),
                    ..ObjectMeta::default()
                },
                spec: Some(NodeSpec {
                    provider_id: Some(vm.provider_id.clone()),
                    ..NodeSpec::default()
                }),
                status: Some(status),
            }),
        }
    }

    /// Records the outcomes of a pass's jobs; returns when to run again at the latest.
    fn settle(&mut self, done: Vec<Done>, mut wake: Instant) -> Instant {
        let now = Instant::now();
        let interval = self.config.heartbeat_interval;
        let mut pods_failed = false;
        for outcome in done {
            match outcome {
                Done::Registered {
                    name,
                    vm_id,
                    node,
                    lease_ok,
                } => {
                    self.retries.remove(&name);
                    let next_renew = now + if lease_ok { interval } else { self.retry_delay };
                    wake = wake.min(next_renew);
                    self.tracks.insert(
                        name.clone(),
                        Track {
                            vm_id,
                            uid: node.metadata.uid.clone().unwrap_or_default(),
                            next_renew,
                            status_retry_at: None,
                            gone: false,
                            wanted: None,
                        },
                    );
                    self.observe(&name, *node);
                }
                Done::RegisterFailed { name } => {
                    let at = now + self.retry_delay;
                    self.retries.insert(name, at);
                    wake = wake.min(at);
                }
                Done::Renewed { name, ok } => {
                    if let Some(track) = self.tracks.get_mut(&name) {
                        track.next_renew = now + if ok { interval } else { self.retry_delay };
                        wake = wake.min(track.next_renew);
                    }
                }
                Done::StatusWritten { name, node, gone } => {
                    if let Some(track) = self.tracks.get_mut(&name) {
                        if gone {
                            track.gone = true;
                        } else if node.is_none() {
                            let at = now + self.retry_delay;
                            track.status_retry_at = Some(at);
                            wake = wake.min(at);
                        } else {
                            track.status_retry_at = None;
                        }
                    }
                    if let Some(node) = node {
                        self.observe(&name, *node);
                    }
                }
                Done::PodStarted { .. } | Done::PodEnded { .. } | Done::VolumesWritten { .. } => {
                    let (ok, look_again) = self.settle_pod_work(outcome);
                    pods_failed |= !ok;
                    if look_again {
                        wake = now;
                    }
                }
            }
        }
        self.world.retry_at = pods_failed.then(|| now + self.retry_delay);
        if let Some(at) = self.world.retry_at {
            wake = wake.min(at);
        }
        wake
    }

    /// Records the outcome of a pod or volume job: whether it succeeded, and whether to look again at once (a pod
    /// ended: its volumes may be detached now).
    fn settle_pod_work(&mut self, outcome: Done) -> (bool, bool) {
        match outcome {
            Done::PodStarted { pod, ok } => {
                if let Some(pod) = pod {
                    store(&mut self.world.pods, namespaced_key(&*pod), *pod);
                }
                (ok, false)
            }
            Done::PodEnded { key, uid, left, ok } => {
                if ok {
                    match left {
                        Some(pod) => store(&mut self.world.pods, key, *pod),
                        None => {
                            if self.world.pods.get(&key).is_some_and(|p| uid_of(p) == uid) {
                                self.world.pods.remove(&key);
                            }
                        }
                    }
                    self.world.ended.insert(uid);
                }
                (ok, ok)
            }
            Done::VolumesWritten {
                node,
                attached,
                written,
                detached,
                ok,
            } => {
                for va in attached {
                    store(&mut self.world.attachments, va.name_any(), va);
                }
                if let Some(written) = written {
                    self.observe(&node, *written);
                }
                for (name, uid) in detached {
                    if self
                        .world
                        .attachments
                        .get(&name)
                        .is_some_and(|va| uid_of(va) == uid)
                    {
                        self.world.attachments.remove(&name);
                    }
                    self.world.detached.insert(uid);
                }
                (ok, false)
            }
            Done::Registered { .. }
            | Done::RegisterFailed { .. }
            | Done::Renewed { .. }
            | Done::StatusWritten { .. } => (true, false),
        }
    }

    async fn execute(&self, job: Job) -> Done {
        match job {
            Job::Register { vm_id, node } => {
                let name = node.metadata.name.clone().unwrap_or_default();
                match self.register(&name, &node).await {
                    Some(stored) => {
                        let uid = stored.metadata.uid.clone().unwrap_or_default();
                        let lease_ok = self.write_lease(&name, &uid, true).await;
                        Done::Registered {
                            name,
                            vm_id,
                            node: Box::new(stored),
                            lease_ok,
                        }
                    }
                    None => Done::RegisterFailed { name },
                }
            }
            Job::Renew { name, uid } => {
                let ok = self.write_lease(&name, &uid, false).await;
                Done::Renewed { name, ok }
            }
            Job::Status { name, status } => {
                let patch = Patch::Merge(json!({ "status": status }));
                match self
                    .nodes
                    .patch_status(&name, &PatchParams::default(), &patch)
                    .await
                {
                    Ok(node) => {
                        bump(&self.counters.node_status_writes);
                        Done::StatusWritten {
                            name,
                            node: Some(Box::new(node)),
                            gone: false,
                        }
                    }
                    Err(err) => {
                        bump(&self.counters.failed_requests);
                        let gone = is_status(&err, 404);
                        if !gone {
                            tracing::warn!(node = name, error = %err, "sim kubelet: node status write failed");
                        }
                        Done::StatusWritten {
                            name,
                            node: None,
                            gone,
                        }
                    }
                }
            }
            Job::StartPod {
                key,
                resource_version,
            } => self.start_pod(&key, &resource_version).await,
            Job::EndPod { key, uid } => self.end_pod(key, uid).await,
            Job::Volumes(job) => self.write_volumes(*job).await,
        }
    }

    /// Marks a pending pod Running and Ready (guarded by its resourceVersion: a pod changed meanwhile is left to
    /// the next pass, which sees the change).
    async fn start_pod(&self, key: &PodKey, resource_version: &str) -> Done {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        let now = Time(jiff::Timestamp::now());
        let conditions: Vec<Value> = ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
            .into_iter()
            .map(|type_| json!({ "type": type_, "status": "True", "lastTransitionTime": now }))
            .collect();
        let patch = json!({
            "metadata": { "resourceVersion": resource_version },
            "status": { "phase": "Running", "startTime": now, "conditions": conditions },
        });
        match api
            .patch_status(&key.1, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(pod) => {
                bump(&self.counters.pods_started);
                Done::PodStarted {
                    pod: Some(Box::new(pod)),
                    ok: true,
                }
            }
            // Changed or gone meanwhile: the watch brings the news.
            Err(err) if is_status(&err, 409) || is_status(&err, 404) => {
                Done::PodStarted { pod: None, ok: true }
            }
            Err(err) => {
                bump(&self.counters.failed_requests);
                tracing::warn!(namespace = key.0, pod = key.1, error = %err, "sim kubelet: starting a pod failed");
                Done::PodStarted { pod: None, ok: false }
            }
        }
    }

    /// Ends a pod whose grace period has passed: a deletion with grace 0, for this pod only (uid precondition).
    async fn end_pod(&self, key: PodKey, uid: String) -> Done {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&key.1, &params).await {
            Ok(outcome) => {
                bump(&self.counters.pods_ended);
                tracing::debug!(namespace = key.0, pod = key.1, "sim kubelet: pod ended");
                Done::PodEnded {
                    key,
                    uid,
                    left: outcome.left().map(Box::new),
                    ok: true,
                }
            }
            // Gone already, or another pod of that name by now.
            Err(err) if is_status(&err, 404) || is_status(&err, 409) => Done::PodEnded {
                key,
                uid,
                left: None,
                ok: true,
            },
            Err(err) => {
                bump(&self.counters.failed_requests);
                tracing::warn!(namespace = key.0, pod = key.1, error = %err, "sim kubelet: ending a pod failed");
                Done::PodEnded {
                    key,
                    uid,
                    left: None,
                    ok: false,
                }
            }
        }
    }

    /// Attaches, lists and detaches a node's volumes, in this order; stops at the first failure (the next pass
    /// decides again from what the server has).
    async fn write_volumes(&self, job: VolumeJob) -> Done {
        let VolumeJob {
            node,
            attach,
            entries,
            detach,
        } = job;
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let mut attached = Vec::new();
        let mut written = None;
        let mut detached = Vec::new();
        let ok = async {
            for (pv, handle) in &attach {
                attached.push(self.attach(&api, &node, pv, handle).await?);
            }
            if let Some(entries) = &entries {
                let list = if entries.is_empty() { Value::Null } else { json!(entries) };
                let patch = Patch::Merge(json!({ "status": { "volumesAttached": list } }));
                match self.nodes.patch_status(&node, &PatchParams::default(), &patch).await {
                    Ok(stored) => {
                        bump(&self.counters.volume_writes);
                        written = Some(Box::new(stored));
                    }
                    Err(err) => {
                        bump(&self.counters.failed_requests);
                        tracing::warn!(node, error = %err, "sim kubelet: writing volumesAttached failed");
                        return None;
                    }
                }
            }
            for (name, uid) in detach {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: Some(uid.clone()),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match api.delete(&name, &params).await {
                    Ok(_) => {
                        bump(&self.counters.volume_writes);
                        detached.push((name, uid));
                    }
                    Err(err) if is_status(&err, 404) || is_status(&err, 409) => detached.push((name, uid)),
                    Err(err) => {
                        bump(&self.counters.failed_requests);
                        tracing::warn!(node, attachment = name, error = %err, "sim kubelet: deleting a VolumeAttachment failed");
                        return None;
                    }
                }
            }
            Some(())
        }
        .await
        .is_some();
        Done::VolumesWritten {
            node,
            attached,
            written,
            detached,
            ok,
        }
    }

    /// Creates the VolumeAttachment of a volume on a node with `status.attached` true (or marks an existing one
    /// attached). `None` when a request failed.
    async fn attach(
        &self,
        api: &Api<VolumeAttachment>,
        node: &str,
        pv: &str,
        handle: &str,
    ) -> Option<VolumeAttachment> {
        let name = attachment_name(handle, node);
        let wanted = VolumeAttachment {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: crate::CSI_DRIVER.to_owned(),
                node_name: node.to_owned(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some(pv.to_owned()),
                    ..VolumeAttachmentSource::default()
                },
            },
            status: Some(VolumeAttachmentStatus {
                attached: true,
                ..VolumeAttachmentStatus::default()
            }),
        };
        let failed = |err: &kube::Error| {
            bump(&self.counters.failed_requests);
            tracing::warn!(node, attachment = name, error = %err, "sim kubelet: attaching a volume failed");
        };
        let current = match api.create(&PostParams::default(), &wanted).await {
            Ok(created) => {
                bump(&self.counters.volume_writes);
                created
            }
            Err(err) if is_status(&err, 409) => match api.get(&name).await {
                Ok(existing) => existing,
                Err(err) => {
                    failed(&err);
                    return None;
                }
            },
            Err(err) => {
                failed(&err);
                return None;
            }
        };
        if current.status.as_ref().is_some_and(|s| s.attached) {
            return Some(current);
        }
        let patch = Patch::Merge(json!({ "status": { "attached": true } }));
        match api.patch_status(&name, &PatchParams::default(), &patch).await {
            Ok(marked) => {
                bump(&self.counters.volume_writes);
                Some(marked)
            }
            Err(err) => {
                failed(&err);
                None
            }
        }
    }

    /// Creates the node, or adopts an existing one of the same name that is not being deleted.
    async fn register(&self, name: &str, node: &Node) -> Option<Node> {
        match self.nodes.create(&PostParams::default(), node).await {
            Ok(stored) => {
                bump(&self.counters.node_creates);
                tracing::debug!(node = name, "sim kubelet: node registered");
                Some(stored)
            }
            Err(err) if is_status(&err, 409) => match self.nodes.get(name).await {
                Ok(existing) if existing.metadata.deletion_timestamp.is_none() => {
                    tracing::debug!(node = name, "sim kubelet: existing node adopted");
                    if existing
                        .annotations()
                        .get(AGENT_TERMINATES_PODS)
                        .map(String::as_str)
                        == Some("true")
                    {
                        return Some(existing);
                    }
                    // The adopted node says from now on that this kubelet ends its pods.
                    let patch = json!({ "metadata": { "annotations": { AGENT_TERMINATES_PODS: "true" } } });
                    match self
                        .nodes
                        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                    {
                        Ok(annotated) => Some(annotated),
                        Err(err) => {
                            bump(&self.counters.failed_requests);
                            tracing::warn!(node = name, error = %err, "sim kubelet: annotating an adopted node failed");
                            None
                        }
                    }
                }
                Ok(_) => None,
                Err(err) => {
                    bump(&self.counters.failed_requests);
                    tracing::warn!(node = name, error = %err, "sim kubelet: reading an existing node failed");
                    None
                }
            },
            Err(err) => {
                bump(&self.counters.failed_requests);
                tracing::warn!(node = name, error = %err, "sim kubelet: node registration failed");
                None
            }
        }
    }

    /// Creates or renews the node's Lease; false when it failed.
    async fn write_lease(&self, name: &str, uid: &str, create_first: bool) -> bool {
        let now = MicroTime(jiff::Timestamp::now());
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: name.into(),
            uid: uid.into(),
            ..OwnerReference::default()
        };
        let spec = LeaseSpec {
            holder_identity: Some(name.into()),
            lease_duration_seconds: Some(
                i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            renew_time: Some(now),
            ..LeaseSpec::default()
        };
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NODE_LEASE_NAMESPACE.into()),
                owner_references: Some(vec![owner.clone()]),
                ..ObjectMeta::default()
            },
            spec: Some(spec.clone()),
        };
        let create = async {
            match self.leases.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    bump(&self.counters.lease_creates);
                    Ok(())
                }
                Err(err) => Err(err),
            }
        };
        if create_first {
            match create.await {
                Ok(()) => return true,
                Err(err) if is_status(&err, 409) => {}
                Err(err) => {
                    bump(&self.counters.failed_requests);
                    tracing::warn!(node = name, error = %err, "sim kubelet: lease creation failed");
                    return false;
                }
            }
            return self.renew_lease(name, &owner, &spec, None).await;
        }
        self.renew_lease(name, &owner, &spec, Some(&lease)).await
    }

    /// Renews the Lease with a merge patch; creates it when it is missing and `lease` is given.
    async fn renew_lease(
        &self,
        name: &str,
        owner: &OwnerReference,
        spec: &LeaseSpec,
        lease: Option<&Lease>,
    ) -> bool {
        let patch = Patch::Merge(json!({
            "metadata": { "ownerReferences": [owner] },
            "spec": spec,
        }));
        match self.leases.patch(name, &PatchParams::default(), &patch).await {
            Ok(_) => {
                bump(&self.counters.lease_renewals);
                true
            }
            Err(err) if is_status(&err, 404) && lease.is_some() => {
                let Some(lease) = lease else { return false };
                match self.leases.create(&PostParams::default(), lease).await {
                    Ok(_) => {
                        bump(&self.counters.lease_creates);
                        true
                    }
                    Err(err) => {
                        bump(&self.counters.failed_requests);
                        tracing::warn!(node = name, error = %err, "sim kubelet: lease creation failed");
                        false
                    }
                }
            }
            Err(err) => {
                bump(&self.counters.failed_requests);
                tracing::warn!(node = name, error = %err, "sim kubelet: lease renewal failed");
                false
            }
        }
    }
}

fn observed_of(node: Node) -> Observed {
    Observed {
        uid: node.metadata.uid.clone().unwrap_or_default(),
        resource_version: resource_version(&node),
        fingerprint: node.status.as_ref().map(fingerprint),
        status: node.status,
    }
}

/// Lists the objects of a kind, then watches them, forwarding what it sees (wrapped by `wrap`); lists again after a
/// 410 or an error.
async fn watch_objects<K>(api: Api<K>, events: mpsc::Sender<Event>, wrap: fn(Seen<K>) -> Event)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let kind = K::plural(&()).into_owned();
    let pause = Duration::from_secs(1);
    'list: loop {
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            Err(err) => {
                tracing::warn!(error = %err, kind, "sim kubelet: listing failed");
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        let mut version = list.metadata.resource_version.clone().unwrap_or_default();
        if events
            .send(wrap(Seen::Reset(list.items, version.parse().ok())))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let stream = match api.watch(&WatchParams::default().timeout(290), &version).await {
                Ok(stream) => stream,
                Err(err) => {
                    tracing::warn!(error = %err, kind, "sim kubelet: watching failed");
                    tokio::time::sleep(pause).await;
                    continue 'list;
                }
            };
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let event = match event {
                    Ok(WatchEvent::Added(object) | WatchEvent::Modified(object)) => {
                        version = object.meta().resource_version.clone().unwrap_or(version);
                        Seen::Applied(object)
                    }
                    Ok(WatchEvent::Deleted(object)) => {
                        version = object.meta().resource_version.clone().unwrap_or(version);
                        Seen::Deleted(object)
                    }
                    Ok(WatchEvent::Bookmark(bookmark)) => {
                        version = bookmark.metadata.resource_version;
                        continue;
                    }
                    Ok(WatchEvent::Error(status)) => {
                        if status.code != 410 {
                            tracing::warn!(status = ?status, kind, "sim kubelet: watch error");
                            tokio::time::sleep(pause).await;
                        }
                        continue 'list;
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, kind, "sim kubelet: watch broke");
                        tokio::time::sleep(pause).await;
                        continue 'list;
                    }
                };
                if events.send(wrap(event)).await.is_err() {
                    return;
                }
            }
        }
    }
}
