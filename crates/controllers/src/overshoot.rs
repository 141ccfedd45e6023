//! The safety controller's overshoot freeze (reference §7), the acting half of `mcm_core::safety_overshoot`: a
//! loop over caches of the namespace's machines, machine sets and machine deployments that runs a pass every
//! `--machine-safety-overshooting-period` and shortly after a Machine is created (debounced: a burst of creations
//! is one pass). Two triggers are this project's: a set or deployment that shows the unfreeze annotation (the
//! reference waits for the period), or whose `freeze` label and `Frozen` condition disagree — the set and
//! deployment controllers write their status conditions whole from their caches, and one that read the object
//! before our write puts the old list back; the next pass restores the condition (the label, the freeze itself,
//! is never touched by them).
//!
//! A pass calls `safety_overshoot::plan` with the caches and applies its writes, sets first: each object is read
//! again from the API server and its patches recomputed against that version (so that a cache that has not yet
//! seen the previous pass's writes neither repeats them nor records their events twice); the label and
//! annotations go as a JSON merge patch of the object, the `Frozen` condition as a merge patch of the status
//! subresource guarded by the object's resourceVersion (a conflict re-reads and retries). The events
//! `FrozeMachineSet`/`UnfrozeMachineSet` (and `FrozeMachineDeployment`/`UnfrozeMachineDeployment`) are recorded
//! when a write changes the freeze label. A failed write is logged and retried by the next pass.

use std::{collections::BTreeSet, collections::HashSet, fmt::Debug, pin::pin, time::Duration};

use futures::StreamExt;
use jiff::Timestamp;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use mcm_api::{Machine, MachineDeployment, MachineSet};
use mcm_core::safety_overshoot::{self, Desired, Input, ObjectKind, ObjectPatches, Settings, Write};
use serde::de::DeserializeOwned;
use tokio::time::{Instant, sleep_until};

use crate::events::{EventType, Recorder};

pub use crate::Error;

/// The default of `--machine-safety-overshooting-period`.
pub const DEFAULT_PERIOD: Duration = Duration::from_mins(1);

/// How long after a Machine creation (or an unfreeze annotation) the pass runs: creations within this window are
/// looked at together.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// The component the events are recorded as.
pub const COMPONENT: &str = "machine-safety-overshooting";

/// How soon a pass is tried again while the caches have not synced.
const CACHE_RETRY: Duration = Duration::from_millis(100);

/// Attempts of one object's write when its resourceVersion keeps changing under it.
const CONFLICT_ATTEMPTS: u32 = 5;

/// The wait before the n-th retry of a conflicting write is n times this.
const CONFLICT_BACKOFF: Duration = Duration::from_millis(20);

/// How the overshoot safety loop runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The namespace of the machines, sets and deployments (`--namespace`).
    pub namespace: String,
    /// Time between passes without a trigger (`--machine-safety-overshooting-period`, default 1m).
    pub period: Duration,
    /// Machines tolerated above the expected maximum before a set is frozen (`--safety-up`, default 2).
    pub safety_up: u32,
    /// How far below the upper threshold a frozen set is unfrozen (`--safety-down`, default 1).
    pub safety_down: u32,
}

impl Config {
    /// The reference's defaults for `namespace`: period 1m, safety-up 2, safety-down 1.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            period: DEFAULT_PERIOD,
            safety_up: safety_overshoot::DEFAULT_SAFETY_UP,
            safety_down: safety_overshoot::DEFAULT_SAFETY_DOWN,
        }
    }

    fn settings(&self) -> Settings {
        Settings {
            safety_up: self.safety_up,
            safety_down: self.safety_down,
        }
    }
}

/// Tells Machine creations from the other watch events. The first list is not a creation (the first pass looks at
/// everything anyway); a machine first seen in a later re-list (after a broken watch) is.
#[derive(Default)]
struct Creations {
    known: HashSet<String>,
    relist: Option<HashSet<String>>,
    listed: bool,
}

fn key_of(machine: &Machine) -> String {
    machine.uid().unwrap_or_else(|| machine.name_any())
}

impl Creations {
    /// Whether `event` shows a Machine that did not exist before.
    fn observe(&mut self, event: &crate::shared_cache::SharedEvent<Machine>) -> bool {
        match event {
            watcher::Event::Init => {
                self.relist = Some(HashSet::new());
                false
            }
            watcher::Event::InitApply(machine) => {
                self.relist.get_or_insert_default().insert(key_of(machine));
                false
            }
            watcher::Event::InitDone => {
                let relist = self.relist.take().unwrap_or_default();
                let new = self.listed && relist.iter().any(|k| !self.known.contains(k));
                self.known = relist;
                self.listed = true;
                new
            }
            watcher::Event::Apply(machine) => self.known.insert(key_of(machine)),
            watcher::Event::Delete(machine) => {
                self.known.remove(&key_of(machine));
                false
            }
        }
    }
}

/// Whether a set or deployment event asks for a pass soon: the object carries the unfreeze annotation, or its
/// freeze label and Frozen condition disagree (`out_of_line`; typically another controller's status patch carried a
/// conditions list read before our write).
fn asks_for_pass<K: Resource>(event: &watcher::Event<K>, out_of_line: fn(&K) -> bool) -> bool {
    match event {
        watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
            safety_overshoot::has_unfreeze_annotation(object.meta()) || out_of_line(object)
        }
        _ => false,
    }
}

/// Runs the overshoot safety loop, on the process's shared machine cache, until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    caches: crate::shared_cache::Caches,
    metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    // A pass is the work of the reference's `machinesafetyovershooting` queue.
    let meter = crate::metrics::Metrics::reconcile_meter(metrics.as_ref(), "machinesafetyovershooting");
    let namespace = config.namespace.clone();
    let machines = caches.machines.store();
    let (sets, set_writer) = reflector::store::<MachineSet>();
    let (deployments, deployment_writer) = reflector::store::<MachineDeployment>();
    let mut machine_events = caches.machines.events().boxed();
    let mut set_events = watcher(
        Api::<MachineSet>::namespaced(client.clone(), &namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(set_writer)
    .boxed();
    let mut deployment_events = watcher(
        Api::<MachineDeployment>::namespaced(client.clone(), &namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(deployment_writer)
    .boxed();
    let actor = Actor {
        sets_api: Api::namespaced(client.clone(), &namespace),
        deployments_api: Api::namespaced(client.clone(), &namespace),
        recorder: Recorder::new(client, COMPONENT),
        settings: config.settings(),
    };
    tracing::info!(
        namespace = %namespace,
        period = ?config.period,
        safety_up = config.safety_up,
        safety_down = config.safety_down,
        "overshoot safety loop started"
    );
    let mut shutdown = pin!(shutdown);
    let mut creations = Creations::default();
    let mut next_pass = Instant::now();
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            event = machine_events.next() => if let Some(event) = event {
                if creations.observe(&event) {
                    next_pass = next_pass.min(Instant::now() + DEBOUNCE);
                }
            } else {
                tracing::warn!("machine cache ended; overshoot safety loop stops");
                break;
            },
            event = set_events.next() => match event {
                Some(Ok(event)) => {
                    if asks_for_pass(&event, safety_overshoot::set_out_of_line) {
                        next_pass = next_pass.min(Instant::now() + DEBOUNCE);
                    }
                }
                Some(Err(err)) => tracing::debug!(error = %err, "machine set watch error; retrying"),
                None => {
                    tracing::warn!("machine set watch ended; overshoot safety loop stops");
                    break;
                }
            },
            event = deployment_events.next() => match event {
                Some(Ok(event)) => {
                    if asks_for_pass(&event, safety_overshoot::deployment_out_of_line) {
                        next_pass = next_pass.min(Instant::now() + DEBOUNCE);
                    }
                }
                Some(Err(err)) => tracing::debug!(error = %err, "machine deployment watch error; retrying"),
                None => {
                    tracing::warn!("machine deployment watch ended; overshoot safety loop stops");
                    break;
                }
            },
            () = sleep_until(next_pass) => {
                if !(caches.machines.synced() && crate::cache::synced(&sets)
                    && crate::cache::synced(&deployments))
                {
                    next_pass = Instant::now() + CACHE_RETRY;
                    continue;
                }
                next_pass = Instant::now() + config.period;
                let metered = meter.pass();
                actor.pass(&machines, &sets, &deployments).await;
                metered.finish(Some(&kube::runtime::controller::Action::await_change()));
            }
        }
    }
    tracing::info!(namespace = %namespace, "overshoot safety loop stopped");
}

/// What a pass writes with.
struct Actor {
    sets_api: Api<MachineSet>,
    deployments_api: Api<MachineDeployment>,
    recorder: Recorder,
    settings: Settings,
}

impl Actor {
    /// One pass: plan from the caches, then apply the writes in order.
    async fn pass(
        &self,
        machines: &Store<Machine>,
        sets: &Store<MachineSet>,
        deployments: &Store<MachineDeployment>,
    ) {
        let machines = machines.state();
        let sets = sets.state();
        let deployments = deployments.state();
        let machine_refs: Vec<&Machine> = machines.iter().map(|m| &**m).collect();
        let set_refs: Vec<&MachineSet> = sets.iter().map(|s| &**s).collect();
        let deployment_refs: Vec<&MachineDeployment> = deployments.iter().map(|d| &**d).collect();
        let plan = safety_overshoot::plan(&Input {
            sets: &set_refs,
            deployments: &deployment_refs,
            machines: &machine_refs,
            settings: self.settings,
            now: Timestamp::now(),
        });
        for eval in &plan.evaluations {
            tracing::debug!(
                set = %eval.name,
                deployment = eval.deployment.as_deref().unwrap_or_default(),
                machines = eval.machines,
                upper = eval.thresholds.upper,
                lower = eval.thresholds.lower,
                frozen = eval.frozen,
                "overshoot check"
            );
            if let Some(problem) = &eval.surge_problem {
                tracing::warn!(
                    set = %eval.name,
                    deployment = eval.deployment.as_deref().unwrap_or_default(),
                    problem = %problem,
                    "unusable maxSurge; the threshold uses a surge of 1"
                );
            }
        }
        let mut failed_sets: BTreeSet<&str> = BTreeSet::new();
        for write in &plan.writes {
            let result = match write.kind {
                ObjectKind::MachineSet => {
                    self.apply(&self.sets_api, write, safety_overshoot::set_patches)
                        .await
                }
                ObjectKind::MachineDeployment => {
                    if let Some(set) = write.after_sets.iter().find(|s| failed_sets.contains(s.as_str())) {
                        tracing::warn!(
                            deployment = %write.name,
                            set = %set,
                            "not writing the deployment's freeze state this pass: a write of one of its sets failed"
                        );
                        continue;
                    }
                    self.apply(&self.deployments_api, write, safety_overshoot::deployment_patches)
                        .await
                }
            };
            if let Err(err) = result {
                tracing::warn!(
                    kind = write.kind.as_str(),
                    name = %write.name,
                    frozen = write.desired.frozen,
                    error = %err,
                    "could not write the freeze state; the next pass retries"
                );
                if write.kind == ObjectKind::MachineSet {
                    failed_sets.insert(&write.name);
                }
            }
        }
    }

    /// Brings one object to the write's desired state: re-read, recompute the patches, apply them in order
    /// (retrying on conflicts). The event is recorded once the freeze label changed, even if the condition's write
    /// then fails (the next pass writes the condition; it would not see a label change any more).
    async fn apply<K>(
        &self,
        api: &Api<K>,
        write: &Write,
        patches_of: fn(&K, &Desired, Timestamp) -> ObjectPatches,
    ) -> Result<(), Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        let desired = &write.desired;
        let mut labelled: Option<(K, bool)> = None;
        let mut attempt = 0;
        let result = loop {
            attempt += 1;
            let fresh = match api.get_opt(&write.name).await {
                Ok(Some(fresh)) => fresh,
                Ok(None) => break Ok(false),
                Err(err) => break Err(err),
            };
            let now = Timestamp::now();
            let patches = patches_of(&fresh, desired, now);
            if patches.is_empty() {
                break Ok(false);
            }
            let step = Step {
                api,
                name: &write.name,
                desired,
                patches_of,
                now,
            };
            match step.write(&fresh, &patches, &mut labelled).await {
                Ok(()) => break Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 && attempt < CONFLICT_ATTEMPTS => {
                    // Typically the set or deployment controller writing its status in reaction to our label.
                    tokio::time::sleep(CONFLICT_BACKOFF * attempt).await;
                }
                Err(kube::Error::Api(status)) if status.code == 404 => break Ok(false),
                Err(err) => break Err(err),
            }
        };
        if let Ok(true) = result {
            tracing::info!(
                kind = write.kind.as_str(),
                name = %write.name,
                frozen = desired.frozen,
                label_changed = labelled.is_some(),
                reason = desired.reason,
                message = %desired.message,
                "freeze state written"
            );
        }
        if let Some((object, frozen)) = &labelled
            && let Some(event) = safety_overshoot::event_for(write.kind, desired, Some(*frozen))
        {
            let event_type = if *frozen {
                EventType::Warning
            } else {
                EventType::Normal
            };
            self.recorder
                .record(object, event_type, event.reason, &event.message)
                .await;
        }
        result.map(|_| ()).map_err(Error::from)
    }
}

/// One write of one object's patches.
struct Step<'a, K: Resource> {
    api: &'a Api<K>,
    name: &'a str,
    desired: &'a Desired,
    patches_of: fn(&K, &Desired, Timestamp) -> ObjectPatches,
    now: Timestamp,
}

impl<K> Step<'_, K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    /// Applies the patches in their order. Freezing writes the label first, then the condition, recomputed against
    /// the object the label write returned (its resourceVersion changed); unfreezing writes the condition first,
    /// then the label. When the label changes, `labelled` gets the object the label write returned and whether it
    /// is now frozen.
    async fn write(
        &self,
        fresh: &K,
        patches: &ObjectPatches,
        labelled: &mut Option<(K, bool)>,
    ) -> Result<(), kube::Error> {
        let params = PatchParams::default();
        let mut current = fresh.clone();
        if patches.status_first
            && let Some(status) = &patches.status
        {
            current = self
                .api
                .patch_status(self.name, &params, &Patch::Merge(status))
                .await?;
        }
        if let Some(metadata) = &patches.metadata {
            current = self
                .api
                .patch(self.name, &params, &Patch::Merge(metadata))
                .await?;
            if let Some(frozen) = patches.transition {
                *labelled = Some((current.clone(), frozen));
            }
        }
        if !patches.status_first
            && let Some(status) = (self.patches_of)(&current, self.desired, self.now).status
        {
            self.api
                .patch_status(self.name, &params, &Patch::Merge(&status))
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(uid: &str) -> Machine {
        mcm_api::builders::MachineBuilder::new(&format!("m-{uid}"))
            .uid(uid)
            .build()
    }

    #[test]
    fn creations_are_new_machines_but_not_the_first_list() {
        let mut c = Creations::default();
        assert!(!c.observe(&crate::shared_cache::shared_event(watcher::Event::Init)));
        assert!(
            !c.observe(&crate::shared_cache::shared_event(watcher::Event::InitApply(
                machine("a")
            )))
        );
        assert!(
            !c.observe(&crate::shared_cache::shared_event(watcher::Event::InitDone)),
            "the first list is not a creation"
        );
        assert!(
            c.observe(&crate::shared_cache::shared_event(watcher::Event::Apply(
                machine("b")
            ))),
            "a new machine"
        );
        assert!(
            !c.observe(&crate::shared_cache::shared_event(watcher::Event::Apply(
                machine("b")
            ))),
            "a change of a known one"
        );
        assert!(
            !c.observe(&crate::shared_cache::shared_event(watcher::Event::Delete(
                machine("a")
            )))
        );
        // A re-list after a broken watch: "c" appeared meanwhile.
        assert!(!c.observe(&crate::shared_cache::shared_event(watcher::Event::Init)));
        assert!(
            !c.observe(&crate::shared_cache::shared_event(watcher::Event::InitApply(
                machine("b")
            )))
        );
        assert!(
            !c.observe(&crate::shared_cache::shared_event(watcher::Event::InitApply(
                machine("c")
            )))
        );
        assert!(c.observe(&crate::shared_cache::shared_event(watcher::Event::InitDone)));
        // The same list again shows nothing new.
        assert!(!c.observe(&crate::shared_cache::shared_event(watcher::Event::Init)));
        assert!(
            !c.observe(&crate::shared_cache::shared_event(watcher::Event::InitApply(
                machine("c")
            )))
        );
        assert!(!c.observe(&crate::shared_cache::shared_event(watcher::Event::InitDone)));
    }

    #[test]
    fn config_defaults_are_the_references() {
        let config = Config::new("ns");
        assert_eq!(config.period, Duration::from_mins(1));
        assert_eq!((config.safety_up, config.safety_down), (2, 1));
    }
}
