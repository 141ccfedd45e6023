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
        core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo},
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time},
    },
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
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
    /// Requests that failed (retried later).
    pub failed_requests: u64,
}

#[derive(Default)]
struct Counters {
    node_creates: AtomicU64,
    node_status_writes: AtomicU64,
    lease_creates: AtomicU64,
    lease_renewals: AtomicU64,
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
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client, NODE_LEASE_NAMESPACE),
            retry_delay: config.heartbeat_interval.min(Duration::from_secs(1)),
            config,
            counters: Arc::clone(&counters),
            tracks: HashMap::new(),
            retries: HashMap::new(),
            observed: HashMap::new(),
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

/// What the node watch reports.
enum NodeEvent {
    /// A fresh list: every node, at this resourceVersion.
    Reset(Vec<Node>, Option<u64>),
    /// A node was added or modified.
    Applied(Node),
    /// A node was deleted.
    Deleted(Node),
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
    Register { vm_id: u64, node: Box<Node> },
    Renew { name: String, uid: String },
    Status { name: String, status: Box<NodeStatus> },
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
}

struct Runner {
    shared: Arc<Shared>,
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
        let _watch = AbortOnDrop(tokio::spawn(watch_nodes(self.nodes.clone(), events_tx)));
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
    fn apply(&mut self, event: NodeEvent, scope: &mut Scope) {
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
        (jobs, wake)
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
            }
        }
        wake
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
                    Some(existing)
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

/// Lists the nodes, then watches them, forwarding what it sees; lists again after a 410 or an error.
async fn watch_nodes(api: Api<Node>, events: mpsc::Sender<NodeEvent>) {
    let pause = Duration::from_secs(1);
    'list: loop {
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            Err(err) => {
                tracing::warn!(error = %err, "sim kubelet: listing nodes failed");
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        let mut version = list.metadata.resource_version.clone().unwrap_or_default();
        if events
            .send(NodeEvent::Reset(list.items, version.parse().ok()))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let stream = match api.watch(&WatchParams::default().timeout(290), &version).await {
                Ok(stream) => stream,
                Err(err) => {
                    tracing::warn!(error = %err, "sim kubelet: watching nodes failed");
                    tokio::time::sleep(pause).await;
                    continue 'list;
                }
            };
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let event = match event {
                    Ok(WatchEvent::Added(node) | WatchEvent::Modified(node)) => {
                        version = node.metadata.resource_version.clone().unwrap_or(version);
                        NodeEvent::Applied(node)
                    }
                    Ok(WatchEvent::Deleted(node)) => {
                        version = node.metadata.resource_version.clone().unwrap_or(version);
                        NodeEvent::Deleted(node)
                    }
                    Ok(WatchEvent::Bookmark(bookmark)) => {
                        version = bookmark.metadata.resource_version;
                        continue;
                    }
                    Ok(WatchEvent::Error(status)) => {
                        if status.code != 410 {
                            tracing::warn!(status = ?status, "sim kubelet: node watch error");
                            tokio::time::sleep(pause).await;
                        }
                        continue 'list;
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "sim kubelet: node watch broke");
                        tokio::time::sleep(pause).await;
                        continue 'list;
                    }
                };
                if events.send(event).await.is_err() {
                    return;
                }
            }
        }
    }
}
