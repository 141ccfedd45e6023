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
//!
//! **In-place updates** (`in_place`): on the node condition `InPlaceUpdate` reason `ReadyForUpdate` the kubelet plays
//! Gardener's node agent: the VM takes the class the machine's deployment names now (its size, so the node's
//! capacity and instance-type label), the VM is kept, and the node label `update-result` reports the result.
//!
//! This file holds the public face (configuration, start, handle, statistics); the submodules hold the runner and
//! its passes (`runner`), the jobs and their outcomes (`jobs`), the node, Lease and pod writes (`writes`), volumes
//! (`volumes`), the reported node status (`status`), what the watches report (`world`) and the watches (`watch`).

mod in_place;
mod jobs;
mod runner;
mod status;
mod volumes;
mod watch;
mod world;
mod writes;

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use kube::{Api, Client};
use tokio::{sync::oneshot, task::JoinHandle};

use crate::SimDriver;
use runner::Runner;
use world::World;

pub use mcm_api::keys::{
    extensions::AGENT_TERMINATES_PODS,
    kubernetes::{HOSTNAME_LABEL, INSTANCE_TYPE_LABEL, NODE_LEASE_NAMESPACE},
};
pub use mcm_core::node_report::MAX_PODS;
use mcm_core::node_report::{DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_LEASE_DURATION, StatusReport};

/// The kubelet writes a node's status only when the server's differs from what it reports (the heartbeat is the
/// Lease): the fewest writes, for the benchmark.
const STATUS_REPORT: StatusReport = StatusReport::OnChange;

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
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            boot_delay: Duration::ZERO,
            lease_duration: DEFAULT_LEASE_DURATION,
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
        Self::start_with_control(driver, client.clone(), client, config)
    }

    /// [`Kubelet::start`] with the machines, sets, deployments and classes in the cluster of `control` (where an
    /// in-place update finds the class to apply; `start` looks in the nodes' cluster).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start_with_control(
        driver: &SimDriver,
        client: Client,
        control: Client,
        config: KubeletConfig,
    ) -> KubeletHandle {
        let counters = Arc::new(Counters::default());
        let (stop_tx, stop_rx) = oneshot::channel();
        let runner = Runner {
            shared: Arc::clone(driver.shared()),
            client: client.clone(),
            control,
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
