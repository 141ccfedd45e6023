//! The machine controller: observes machines, their classes, secrets and nodes through reflector stores, asks
//! `mcm-core` what to do (creation steps, health, node sync), and acts — provider calls, one patch per object when
//! something changes, Events, requeues. See docs/machine-controller.md.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::{FutureExt, StreamExt};
use k8s_openapi::{
    ByteString,
    api::core::v1::{Node, NodeCondition, Secret},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use mcm_api::{Machine, MachineClass, MetaExt as _, keys, validation};
use mcm_core::{
    ControllerSettings, Description, Redactor, StatusUpdate,
    creation::{self, Attempts, CallOutcome, CreationInput, CreationStep},
    descriptions,
    finalizers::FinalizerChange,
    health::{self, HealthInput},
    nodesync::{self, NodeSyncInput},
    remediation, userdata, validity,
};
use mcm_driver::{
    CreateMachineRequest, DeleteMachineRequest, Driver, DriverError, GetMachineStatusRequest,
    InitializeMachineRequest, MachineCode,
};
use serde_json::json;

use crate::{
    events::{EventType, Recorder},
    metrics::MachineStep as Step,
    migration::Outcome,
};

mod deleting;
mod health_check;
mod in_place;
mod memory;
mod node_sync;
mod preservation;
mod provision;
mod reconcile;
mod wiring;

// Each file's functions are `pub(super)`; gathered here, every file sees the others' through `use super::*`.
use self::memory::MachineMemory;
pub use self::wiring::run;
#[allow(clippy::wildcard_imports)]
use self::{
    deleting::*, health_check::*, in_place::*, node_sync::*, preservation::*, provision::*, reconcile::*,
};

/// How the machine controller runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The namespace of the machines, classes and secrets (`--namespace`).
    pub namespace: String,
    /// Flag values: timeouts, node conditions, retry and remediation settings.
    pub settings: ControllerSettings,
    /// Reconciles at once (`--concurrent-syncs`).
    pub concurrency: u16,
}

pub use crate::Error;

/// How soon a frozen controller looks at a machine again.
const FROZEN_RETRY: Duration = Duration::from_secs(5);

/// How soon a machine whose finalizer write met a newer version (409) is looked at again, should no event come.
const CONFLICT_RETRY: Duration = Duration::from_secs(1);

/// Shared by every reconcile.
pub struct Context {
    control: Client,
    target: Option<Client>,
    driver: Arc<dyn Driver>,
    config: Config,
    machines: Store<Machine>,
    classes: Store<MachineClass>,
    secrets: Store<Secret>,
    /// The Secrets that cannot be decoded: reported on the machines whose class uses them.
    undecodable: crate::secrets::Undecodable,
    nodes: Option<Store<Node>>,
    /// Whether the shared node cache has synced.
    nodes_synced: Option<crate::shared_cache::Synced>,
    /// Per machine: its [`Attempts`] (failures in a row, the provider retry gate, the class migration gate).
    memory: MachineMemory,
    /// The remediation guard's lock (count → decide → write, one machine at a time), holding the machines this
    /// controller marked Failed that the cache does not show yet: name → (the resourceVersion the write replaced,
    /// the machine as written). Without both, two machines of a group timing out together were both Failed.
    remediation: tokio::sync::Mutex<BTreeMap<String, (String, Machine)>>,
    /// For each object we wrote: the resourceVersion our write replaced. While a cache still shows that version,
    /// it has not seen our write yet, and deciding again would repeat it (equality only: resourceVersions are
    /// opaque).
    replaced: std::sync::Mutex<BTreeMap<String, std::collections::BTreeSet<String>>>,
    recorder: Recorder,
    /// Per machine: what the deletion flow remembers between passes.
    deletions: crate::deletion::DeletionMemory,
    /// Set while an API server is unreachable: nothing but deletions under way is done.
    freeze: crate::reachability::Freeze,
    /// The orphan collection, poked after each finished deletion.
    orphans: Option<crate::orphans::Trigger>,
    /// The machine step durations and the failed joins are recorded here.
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Node name → the machine whose `node` label names it, as of the machine's last reconcile: a node event finds
    /// its machine at once instead of scanning every machine (a scan per heartbeat made the cost quadratic in N).
    node_index: NodeIndex,
    /// Per machine: the drain of its node while it is preserved and Failed.
    preserve_drains: crate::drain::DrainTrackers,
    /// Per machine: the drain of its node before an in-place update.
    in_place_drains: crate::drain::DrainTrackers,
}

/// Node name → machine name (the controller's namespace).
type NodeIndex = Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>;

/// What `mcm run` hands the machine controller besides its configuration.
#[derive(Clone, Debug, Default)]
pub struct Extras {
    /// Prometheus metrics fed from the machine cache.
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The API server reachability freeze (`crate::reachability::run` sets it).
    pub freeze: crate::reachability::Freeze,
    /// The orphan VM collection to poke after deletions (`crate::orphans`).
    pub orphans: Option<crate::orphans::Trigger>,
    /// Runs the node deletion controller (`crate::node_deletion`) on the shared caches of the Machines and Nodes
    /// (with a target cluster only).
    pub node_deletion: Option<crate::node_deletion::Config>,
}

impl Context {
    fn machine_api(&self) -> Api<Machine> {
        Api::namespaced(self.control.clone(), &self.config.namespace)
    }

    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.as_ref()?.get(&ObjectRef::new(name))
    }

    /// Notes a write of `key` (e.g. `machine/m1`) that turned version `before` into `after`. A write that changed
    /// nothing (the same version back) leaves no mark.
    fn wrote(&self, key: &str, before: Option<String>, after: Option<&str>) {
        if let (Some(before), Ok(mut m)) = (before, self.replaced.lock())
            && after != Some(before.as_str())
        {
            m.entry(key.to_owned()).or_default().insert(before);
        }
    }

    /// Whether the cache still shows a version one of our writes replaced. Once it shows any other version, it
    /// has caught up with our writes and the marks go.
    fn stale(&self, key: &str, current: Option<&str>) -> bool {
        let Ok(mut m) = self.replaced.lock() else {
            return false;
        };
        let replaced = current
            .as_ref()
            .is_some_and(|rv| m.get(key).is_some_and(|set| set.contains(*rv)));
        if !replaced {
            m.remove(key);
        }
        replaced
    }

    /// What identifies the inputs of a machine's provider calls: its generation, its class's and secrets'
    /// resourceVersions.
    fn fingerprint(&self, machine: &Machine, class: &MachineClass) -> String {
        let secrets: Vec<Arc<Secret>> = [&class.secret_ref, &class.credentials_secret_ref]
            .into_iter()
            .flatten()
            .filter_map(|r| {
                let namespace = r.namespace.as_deref().unwrap_or(&self.config.namespace);
                self.secrets
                    .get(&ObjectRef::new(r.name.as_deref()?).within(namespace))
            })
            .collect();
        let secrets: Vec<&Secret> = secrets.iter().map(|s| &**s).collect();
        mcm_core::retry_policy::fingerprint(machine, Some(class), &secrets)
    }
}
