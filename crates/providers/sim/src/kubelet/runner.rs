//! The kubelet's one task: applies watch events, and in passes plans the jobs due (registrations, Lease renewals,
//! status writes, pod and volume work), runs them with bounded concurrency and settles their outcomes.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use futures::{StreamExt as _, stream};
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Node, NodeSpec, PersistentVolume, PersistentVolumeClaim, Pod},
        storage::v1::VolumeAttachment,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{Api, Client, ResourceExt as _};
use serde_json::Value;
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};

use super::{
    AGENT_TERMINATES_PODS, Counters, HOSTNAME_LABEL, INSTANCE_TYPE_LABEL, KubeletConfig, STATUS_REPORT,
    jobs::{Done, Job},
    status::{Observed, VmView, desired_status, fingerprint, observed_of, stamped},
    watch::{AbortOnDrop, Event, NodeEvent, Seen, watch_objects},
    world::{Watched, World, apply_keyed, bound_node, namespaced_key, pod_phase, uid_of},
};
use crate::{
    driver::{Shared, Vm},
    faults::NodeFaults,
};

/// A node the kubelet registered (or adopted).
pub(super) struct Track {
    /// The VM the node is for.
    pub(super) vm_id: u64,
    /// The node's uid.
    pub(super) uid: String,
    /// When the Lease is renewed next.
    pub(super) next_renew: Instant,
    /// No status write before this (after a failed one).
    pub(super) status_retry_at: Option<Instant>,
    /// The node was deleted by someone else: the kubelet leaves it alone.
    pub(super) gone: bool,
    /// The fingerprint of the status the node should have, and the faults it was computed for.
    pub(super) wanted: Option<(Option<NodeFaults>, Value)>,
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
pub(super) enum Scope {
    /// Every node.
    All,
    /// These nodes (after watch events about them).
    Nodes(HashSet<String>),
}

impl Scope {
    pub(super) fn add(&mut self, name: String) {
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

pub(super) struct Runner {
    pub(super) shared: Arc<Shared>,
    pub(super) client: Client,
    /// The cluster of the machines, sets, deployments and classes (an in-place update's target).
    pub(super) control: Client,
    pub(super) nodes: Api<Node>,
    pub(super) leases: Api<Lease>,
    pub(super) config: KubeletConfig,
    pub(super) retry_delay: Duration,
    pub(super) counters: Arc<Counters>,
    /// Registered nodes by name.
    pub(super) tracks: HashMap<String, Track>,
    /// Registration retry times by node name.
    pub(super) retries: HashMap<String, Instant>,
    /// Nodes as the server has them, by name.
    pub(super) observed: HashMap<String, Observed>,
    /// Pods, claims, volumes and VolumeAttachments as the server has them.
    pub(super) world: World,
}

impl Runner {
    pub(super) async fn run(mut self, mut stop: oneshot::Receiver<()>) {
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
    pub(super) fn observe(&mut self, name: &str, node: Node) {
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

    pub(super) fn view(&self, vm: &Vm) -> VmView {
        VmView {
            id: vm.id,
            machine: (vm.namespace.clone(), vm.machine_name.clone()),
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
            let held = faults.is_some_and(|f| f.in_place_updates_held);
            if !held && observed.is_some_and(|o| o.wants_update) {
                jobs.push(Job::InPlaceUpdate {
                    name: name.clone(),
                    vm_id: vm.id,
                    machine: vm.machine.clone(),
                });
            }
            let changed = observed.is_none_or(|o| o.fingerprint.as_ref() != Some(wanted));
            if STATUS_REPORT.is_due(changed, 0) {
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
}
