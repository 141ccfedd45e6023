//! The MachineDeployment controller's strategies end to end, with the MachineSet and machine controllers, against the
//! embedded API server over HTTPS with the sim provider and its kubelet: Recreate, OnDelete, rollback, pause, scaling
//! in the middle of a rollout, a larger rolling update with percentages, and revision history cleanup. Every wait is a
//! poll with a deadline; watchers check invariants on every state the API server delivers.

use crate::support;

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{Resource as _, api::core::v1::Event, apimachinery::pkg::util::intstr::IntOrString};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use mcm_api::{
    ConditionStatus, Machine, MachineDeployment, MachineDeploymentConditionType, MachinePhase, MachineSet,
    MachineTemplateSpec, builders::MachineDeploymentBuilder, keys,
};
use mcm_controllers::machineset;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use support::{Cluster, Setup};

const DEADLINE: Duration = Duration::from_mins(1);

/// The deployment of every test.
const NAME: &str = "pool";

/// Server, sim provider and kubelet, the machine, set and deployment controllers, and the classes `small` and
/// `medium`.
async fn start() -> Cluster {
    let sets = machineset::Config {
        // These tests use minReadySeconds to hold each rollout step (`--honour-min-ready-seconds`).
        min_ready_seconds: mcm_core::machineset::MinReadySeconds::Honour,
        ..support::set_config()
    };
    Cluster::start_with_set_controllers(Setup::for_sets(), sets).await
}

/// This file's helpers on the shared harness.
impl Cluster {
    /// Creates the deployment `deployment` describes.
    async fn create_deployment(&self, deployment: MachineDeploymentBuilder) {
        self.deployments()
            .create(&PostParams::default(), &deployment.build())
            .await
            .unwrap();
    }

    /// A merge patch of the deployment's spec.
    async fn patch_spec(&self, spec: Value) -> MachineDeployment {
        self.deployments()
            .patch(
                NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
            .unwrap()
    }

    async fn deployment(&self) -> MachineDeployment {
        self.deployments().get(NAME).await.unwrap()
    }

    /// Every machine, those being deleted included.
    async fn all_machines(&self) -> Vec<Machine> {
        self.machines().list(&ListParams::default()).await.unwrap().items
    }

    async fn all_sets(&self) -> Vec<MachineSet> {
        self.sets().list(&ListParams::default()).await.unwrap().items
    }

    /// The deployment's events with `reason`.
    async fn events(&self, reason: &str) -> Vec<Event> {
        self.events_for(Some(MachineDeployment::KIND), NAME, reason).await
    }

    /// Patches the deployment's spec and waits until the controller has observed that generation with
    /// `Progressing=Unknown/DeploymentPaused`.
    async fn pause_observed(&self, spec: Value) {
        let generation = self.patch_spec(spec).await.metadata.generation.unwrap();
        eventually("the pause observed", || async {
            let d = self.deployment().await;
            (d.status.as_ref().map(|s| s.observed_generation) == Some(generation)
                && progressing(&d)? == (ConditionStatus::Unknown, "DeploymentPaused".to_owned()))
                .then_some(())
        })
        .await;
    }

    /// Waits for a set other than `old` and returns it.
    async fn new_set_besides(&self, old: &MachineSet) -> MachineSet {
        eventually("the new set", || async {
            self.all_sets().await.into_iter().find(|s| s.uid() != old.uid())
        })
        .await
    }

    /// Waits until the rollout of the deployment's current template is complete as a user sees it: the status
    /// observed the current generation, counts `replicas` machines all updated and available, and says
    /// `Progressing=True/NewMachineSetAvailable`; exactly `replicas` machines exist (none being deleted), all
    /// Running and owned by the one set whose template is the deployment's; every other set is at 0 with no
    /// machine. Returns the deployment, the new set and its machines.
    async fn rolled_out(&self, replicas: i32) -> (MachineDeployment, MachineSet, Vec<Machine>) {
        let what = format!("the rollout to {replicas} machines to complete");
        eventually(&what, || async {
            let deployment = self.deployment().await;
            let status = deployment.status.as_ref()?;
            let progressing = progressing(&deployment)?;
            let status_done = deployment.metadata.generation == Some(status.observed_generation)
                && status.replicas == replicas
                && status.updated_replicas == replicas
                && status.available_replicas == replicas
                && progressing.0 == ConditionStatus::True
                && progressing.1 == "NewMachineSetAvailable";
            if !status_done {
                return None;
            }
            let sets = self.all_sets().await;
            let new = sets
                .iter()
                .find(|s| same_template(&s.spec.template, &deployment.spec.template))?;
            let others_empty = sets
                .iter()
                .filter(|s| s.uid() != new.uid())
                .all(|s| s.spec.replicas == 0 && s.status.as_ref().is_none_or(|st| st.replicas == 0));
            let machines = self.all_machines().await;
            let machines_done = machines.len() == usize::try_from(replicas).unwrap()
                && machines.iter().all(|m| {
                    m.metadata.deletion_timestamp.is_none()
                        && m.phase() == Some(MachinePhase::Running)
                        && owner_set(m).as_deref() == new.uid().as_deref()
                });
            (others_empty && machines_done && new.spec.replicas == replicas)
                .then(|| (deployment.clone(), new.clone(), machines))
        })
        .await
    }
}

/// Waits until `probe` gives a value, within this file's deadline.
async fn eventually<T>(what: &str, probe: impl AsyncFnMut() -> Option<T>) -> T {
    support::wait_within(DEADLINE, what, probe).await
}

/// Calls `check` with the complete picture of `api`'s objects after every change the watch delivers (from the first
/// complete list on: the initial list is not looked at object by object). Returns a flag that turns true once the
/// first complete picture was checked, and the task.
fn observe<K>(
    api: Api<K>,
    mut check: impl FnMut(&[Arc<K>]) + Send + 'static,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<()>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let synced = Arc::new(AtomicBool::new(false));
    let flag = synced.clone();
    let task = tokio::spawn(async move {
        let (store, writer) = kube::runtime::reflector::store::<K>();
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .boxed();
        while let Some(event) = stream.next().await {
            if matches!(
                event,
                Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_))
            ) {
                check(&store.state());
                flag.store(true, Ordering::SeqCst);
            }
        }
    });
    (synced, task)
}

/// Waits until an [`observe`] watcher has checked its first complete picture.
async fn synced(flag: &AtomicBool) {
    eventually("the watcher's first complete list", || async {
        flag.load(Ordering::SeqCst).then_some(())
    })
    .await;
}

/// The `machine-template-hash` label of a machine or set.
fn hash<K: ResourceExt>(object: &K) -> Option<String> {
    object.labels().get(keys::labels::MACHINE_TEMPLATE_HASH).cloned()
}

/// The uid of the machine's controlling MachineSet.
fn owner_set(machine: &Machine) -> Option<String> {
    machine
        .owner_references()
        .iter()
        .find(|r| r.kind == "MachineSet" && r.controller == Some(true))
        .map(|r| r.uid.clone())
}

/// A set's template is the deployment's: equal once the set's hash label is taken out.
fn same_template(set: &MachineTemplateSpec, deployment: &MachineTemplateSpec) -> bool {
    let mut set = set.clone();
    if let Some(labels) = set.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        labels.remove(keys::labels::MACHINE_TEMPLATE_HASH);
    }
    serde_json::to_value(&set).unwrap() == serde_json::to_value(deployment).unwrap()
}

/// The `Progressing` condition's status and reason.
fn progressing(deployment: &MachineDeployment) -> Option<(ConditionStatus, String)> {
    deployment
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == MachineDeploymentConditionType::Progressing)
        .map(|c| (c.status, c.reason.clone()))
}

fn annotation(set: &MachineSet, key: &str) -> Option<String> {
    set.annotations().get(key).cloned()
}

/// The deployment [`NAME`] of machines labelled `pool` = `pool`, of the class `small`.
fn rollout(pool: &str) -> MachineDeploymentBuilder {
    MachineDeploymentBuilder::new(NAME)
        .matching([("pool", pool)])
        .class("small")
}

/// A set's name and `spec.replicas`, for comparing layouts.
fn layout(sets: &[MachineSet]) -> BTreeMap<String, i32> {
    sets.iter().map(|s| (s.name_any(), s.spec.replicas)).collect()
}

/// Recreate (reference §6.3 "Recreate"): "scale all old MachineSets to 0, wait until no old machines exist at all,
/// then create the new MachineSet at full replicas". On every state the watch delivers, no machine of the new
/// template exists while any machine of the old one does (those being deleted included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreate_deletes_every_old_machine_before_the_first_new_one() {
    let h = start().await;
    h.create_deployment(rollout("recreate").replicas(3).strategy("Recreate"))
        .await;
    let (_, old_set, old_machines) = h.rolled_out(3).await;
    let old_hash = hash(&old_set).expect("the set's hash label");
    assert!(old_machines.iter().all(|m| hash(m).as_ref() == Some(&old_hash)));

    // (old machines, new machines) on every observed state where both exist; and the most new machines seen.
    let overlaps: Arc<Mutex<Vec<(usize, usize)>>> = Arc::default();
    let most_new = Arc::new(AtomicUsize::new(0));
    let (seen, watch) = {
        let overlaps = overlaps.clone();
        let most_new = most_new.clone();
        let old_hash = old_hash.clone();
        observe(h.machines(), move |machines| {
            let old = machines
                .iter()
                .filter(|m| hash(&***m).as_ref() == Some(&old_hash))
                .count();
            let new = machines.len() - old;
            most_new.fetch_max(new, Ordering::SeqCst);
            if old > 0 && new > 0 {
                overlaps.lock().unwrap().push((old, new));
            }
        })
    };
    synced(&seen).await;

    h.patch_spec(json!({ "template": { "spec": { "class": { "name": "medium" } } } }))
        .await;
    let (_, new_set, new_machines) = h.rolled_out(3).await;
    // The API shows the rollout done; the watch may deliver the last creations a moment later.
    eventually("the watcher to see the 3 new machines", || async {
        (most_new.load(Ordering::SeqCst) == 3).then_some(())
    })
    .await;
    watch.abort();

    assert_ne!(new_set.uid(), old_set.uid(), "a new set for the new template");
    assert!(new_machines.iter().all(|m| m.spec.class.name == "medium"));
    assert_eq!(
        *overlaps.lock().unwrap(),
        Vec::<(usize, usize)>::new(),
        "(old, new) machines seen at once"
    );
    let old_set = h.sets().get(&old_set.name_any()).await.unwrap();
    assert_eq!(old_set.spec.replicas, 0, "the old set is scaled to zero");
    assert_eq!(old_set.status.map_or(0, |s| s.replicas), 0);
    assert_eq!(h.all_sets().await.len(), 2, "the old set is kept as history");
    h.stop().await;
}

/// Watches the machines of an OnDelete rollout from `old_hash`: on every observed state, at most 3 live machines and
/// no more machines of another template than `deleted_by_hand` (counted up before each deletion). Returns the
/// violations seen, the watcher's synced flag and its task.
fn watch_on_delete(
    h: &Cluster,
    old_hash: String,
    deleted_by_hand: Arc<AtomicUsize>,
) -> (
    Arc<Mutex<Vec<String>>>,
    Arc<AtomicBool>,
    tokio::task::JoinHandle<()>,
) {
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = violations.clone();
    let (synced, task) = observe(h.machines(), move |machines| {
        let live = machines
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .count();
        let new = machines
            .iter()
            .filter(|m| hash(&***m).as_ref() != Some(&old_hash))
            .count();
        let allowed = deleted_by_hand.load(Ordering::SeqCst);
        if live > 3 || new > allowed {
            seen.lock()
                .unwrap()
                .push(format!("{live} live, {new} new after {allowed} deleted by hand"));
        }
    });
    (violations, synced, task)
}

/// OnDelete (after Cluster API; rollout-decisions.md §5): old sets are labelled `scale-up-disabled`, and an old machine
/// is replaced only once someone deletes it. On every observed state: never more than 3 live machines, and never more
/// new machines than old ones deleted by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_delete_replaces_old_machines_only_as_they_are_deleted() {
    let h = start().await;
    h.create_deployment(rollout("ondelete").replicas(3).strategy("OnDelete"))
        .await;
    let (_, old_set, old_machines) = h.rolled_out(3).await;
    let old_hash = hash(&old_set).unwrap();

    let deleted_by_hand = Arc::new(AtomicUsize::new(0));
    let (violations, seen, watch) = watch_on_delete(&h, old_hash, deleted_by_hand.clone());
    synced(&seen).await;

    let changed = h
        .patch_spec(json!({ "template": { "spec": { "class": { "name": "medium" } } } }))
        .await;
    let generation = changed.metadata.generation.unwrap();
    // The controller has acted on the change: the status observed it, the old set is scale-up-disabled, and the set
    // controller has seen the new set (created empty).
    let new_set = eventually(
        "the change observed and the old set scale-up-disabled",
        || async {
            let deployment = h.deployment().await;
            let observed = deployment.status.as_ref().map(|s| s.observed_generation);
            let sets = h.all_sets().await;
            let old = sets.iter().find(|s| s.uid() == old_set.uid())?;
            let new = sets.iter().find(|s| s.uid() != old_set.uid())?;
            (observed == Some(generation)
                && old.labels().contains_key(keys::labels::SCALE_UP_DISABLED)
                && new.status.as_ref().map(|s| s.observed_generation) == new.metadata.generation)
                .then(|| new.clone())
        },
    )
    .await;
    assert_eq!(new_set.spec.replicas, 0, "the new set starts empty");
    assert!(same_template(
        &new_set.spec.template,
        &h.deployment().await.spec.template
    ));
    let machines = h.all_machines().await;
    assert_eq!(
        machines.iter().map(ResourceExt::name_any).collect::<Vec<_>>(),
        old_machines.iter().map(ResourceExt::name_any).collect::<Vec<_>>(),
        "the old machines are all there, and only they"
    );
    assert!(
        machines
            .iter()
            .all(|m| m.phase() == Some(MachinePhase::Running) && m.metadata.deletion_timestamp.is_none())
    );
    assert_eq!(h.sets().get(&old_set.name_any()).await.unwrap().spec.replicas, 3);

    // One old machine deleted by hand: one new machine takes its place.
    let victim = old_machines[0].name_any();
    deleted_by_hand.fetch_add(1, Ordering::SeqCst);
    h.machines()
        .delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    let machines = eventually("the deleted machine replaced by one new machine", || async {
        let machines = h.all_machines().await;
        let new = machines.iter().filter(|m| owner_set(m) == new_set.uid()).count();
        (machines.len() == 3
            && new == 1
            && machines.iter().all(|m| {
                m.name_any() != victim
                    && m.metadata.deletion_timestamp.is_none()
                    && m.phase() == Some(MachinePhase::Running)
            }))
        .then_some(machines)
    })
    .await;
    let survivors: Vec<String> = old_machines[1..].iter().map(ResourceExt::name_any).collect();
    for machine in &machines {
        if owner_set(machine) == old_set.uid() {
            assert!(survivors.contains(&machine.name_any()), "{}", machine.name_any());
        } else {
            assert_eq!(machine.spec.class.name, "medium");
        }
    }
    eventually("old set at 2, new set at 1, and the status", || async {
        let old = h.sets().get(&old_set.name_any()).await.unwrap();
        let new = h.sets().get(&new_set.name_any()).await.unwrap();
        let deployment = h.deployment().await;
        let status = deployment.status.as_ref()?;
        (old.spec.replicas == 2
            && new.spec.replicas == 1
            && status.replicas == 3
            && status.updated_replicas == 1
            && status.available_replicas == 3)
            .then_some(())
    })
    .await;
    let machines = h.all_machines().await;
    assert_eq!(machines.len(), 3);
    assert_eq!(
        machines.iter().filter(|m| owner_set(m) == new_set.uid()).count(),
        1
    );
    watch.abort();
    assert_eq!(*violations.lock().unwrap(), Vec::<String>::new());
    h.stop().await;
}

/// Rollback (reference §6.4): `rollbackTo` copies the template of the set with that revision back into the deployment
/// and clears `rollbackTo`, with the event `DeploymentRollback`; the old set becomes the new one again (no third set).
/// A revision that does not exist only clears `rollbackTo`, with `DeploymentRollbackRevisionNotFound`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_to_a_revision_restores_its_template() {
    let h = start().await;
    h.create_deployment(
        rollout("rollback")
            .replicas(2)
            .strategy("RollingUpdate")
            .max_surge(IntOrString::Int(1))
            .max_unavailable(IntOrString::Int(0)),
    )
    .await;
    let (deployment_a, set_a, _) = h.rolled_out(2).await;
    let template_a = deployment_a.spec.template.clone();
    assert_eq!(
        annotation(&set_a, keys::annotations::REVISION).as_deref(),
        Some("1")
    );

    h.patch_spec(json!({ "template": { "spec": { "class": { "name": "medium" } } } }))
        .await;
    let (_, set_b, machines_b) = h.rolled_out(2).await;
    assert_ne!(set_b.uid(), set_a.uid());
    assert_eq!(
        annotation(&set_b, keys::annotations::REVISION).as_deref(),
        Some("2")
    );
    assert!(machines_b.iter().all(|m| m.spec.class.name == "medium"));

    h.patch_spec(json!({ "rollbackTo": { "revision": 1 } })).await;
    eventually("the template of revision 1 back, rollbackTo cleared", || async {
        let deployment = h.deployment().await;
        (deployment.spec.rollback_to.is_none() && deployment.spec.template == template_a).then_some(())
    })
    .await;
    let (deployment, set, machines) = h.rolled_out(2).await;
    assert_eq!(set.uid(), set_a.uid(), "the set of revision 1 is reused");
    assert_eq!(h.all_sets().await.len(), 2, "no third set");
    assert!(machines.iter().all(|m| m.spec.class.name == "small"));
    assert_eq!(h.sets().get(&set_b.name_any()).await.unwrap().spec.replicas, 0);
    let rollbacks = h.events("DeploymentRollback").await;
    assert!(!rollbacks.is_empty(), "a DeploymentRollback event");
    assert!(rollbacks.iter().all(|e| e.type_.as_deref() == Some("Normal")));
    // The reused set takes the next revision, and the deployment mirrors it (reference §6.2).
    eventually("revision 3 on the reused set and the deployment", || async {
        let set = h.sets().get(&set_a.name_any()).await.unwrap();
        let deployment = h.deployment().await;
        (annotation(&set, keys::annotations::REVISION).as_deref() == Some("3")
            && deployment
                .annotations()
                .get(keys::annotations::REVISION)
                .map(String::as_str)
                == Some("3"))
        .then_some(())
    })
    .await;

    // A revision nobody has: rollbackTo is cleared and nothing else changes.
    let sets_before = layout(&h.all_sets().await);
    let mut machines_before: Vec<String> = machines.iter().map(ResourceExt::name_any).collect();
    machines_before.sort();
    h.patch_spec(json!({ "rollbackTo": { "revision": 7 } })).await;
    let not_found = eventually("DeploymentRollbackRevisionNotFound", || async {
        let events = h.events("DeploymentRollbackRevisionNotFound").await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(not_found[0].type_.as_deref(), Some("Warning"));
    let after = eventually("rollbackTo cleared and observed", || async {
        let d = h.deployment().await;
        (d.spec.rollback_to.is_none()
            && d.status.as_ref().map(|s| s.observed_generation) == d.metadata.generation)
            .then_some(d)
    })
    .await;
    assert!(after.metadata.generation > deployment.metadata.generation);
    assert_eq!(after.spec.template, template_a, "the template is unchanged");
    assert_eq!(layout(&h.all_sets().await), sets_before, "the sets are unchanged");
    let mut machines_after: Vec<String> = h.all_machines().await.iter().map(ResourceExt::name_any).collect();
    machines_after.sort();
    assert_eq!(machines_after, machines_before, "the machines are unchanged");
    assert_eq!(
        h.events("DeploymentRollback").await.len(),
        rollbacks.len(),
        "no rollback event for a missing revision"
    );
    let (_, set, _) = h.rolled_out(2).await;
    assert_eq!(set.uid(), set_a.uid());

    // Revision 0 is the one before the current: B (revision 2), since A is now revision 3.
    h.patch_spec(json!({ "rollbackTo": { "revision": 0 } })).await;
    eventually("the template of revision 2 back, rollbackTo cleared", || async {
        let deployment = h.deployment().await;
        (deployment.spec.rollback_to.is_none() && deployment.spec.template.spec.class.name == "medium")
            .then_some(())
    })
    .await;
    let (_, set, machines) = h.rolled_out(2).await;
    assert_eq!(set.uid(), set_b.uid(), "the set of revision 2 is reused");
    assert!(machines.iter().all(|m| m.spec.class.name == "medium"));
    assert_eq!(h.all_sets().await.len(), 2, "no third set");
    assert!(h.events("DeploymentRollback").await.len() > rollbacks.len());
    h.stop().await;
}

/// Pause (reference §6.4): a paused deployment does not roll, and `Progressing` is Unknown with reason
/// `DeploymentPaused`. Paused together with a template change, no new set is made; paused in the middle of a rollout,
/// the sets keep their sizes (only the machines they already asked for come up); resumed, the rollout completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_rollout_stops_and_resumes() {
    let h = start().await;
    // minReadySeconds holds every step of the rollout for 2s, so that the pause lands while the new set has 1 machine.
    h.create_deployment(
        rollout("paused")
            .replicas(4)
            .min_ready_seconds(2)
            .strategy("RollingUpdate")
            .max_surge(IntOrString::Int(1))
            .max_unavailable(IntOrString::Int(0)),
    )
    .await;
    let (_, old_set, old_machines) = h.rolled_out(4).await;

    // Paused together with the template change: nothing rolls.
    h.pause_observed(json!({
        "paused": true,
        "template": { "spec": { "class": { "name": "medium" } } }
    }))
    .await;
    let sets = h.all_sets().await;
    assert_eq!(
        layout(&sets),
        layout(std::slice::from_ref(&old_set)),
        "no new set while paused"
    );
    let machines = h.all_machines().await;
    assert_eq!(machines.len(), 4);
    assert!(machines.iter().all(|m| m.spec.class.name == "small"));

    // Resumed, then paused again as soon as the new set appears.
    h.patch_spec(json!({ "paused": false })).await;
    let new_set = h.new_set_besides(&old_set).await;
    h.pause_observed(json!({ "paused": true })).await;
    let frozen = layout(&h.all_sets().await);
    assert_eq!(
        frozen,
        BTreeMap::from([(old_set.name_any(), 4), (new_set.name_any(), 1)]),
        "paused with the first new machine asked for"
    );

    // From here on, no set changes size.
    let resizes: Arc<Mutex<Vec<BTreeMap<String, i32>>>> = Arc::default();
    let (seen, watch) = {
        let resizes = resizes.clone();
        let frozen = frozen.clone();
        observe(h.sets(), move |sets| {
            let now: BTreeMap<String, i32> = sets.iter().map(|s| (s.name_any(), s.spec.replicas)).collect();
            if now != frozen {
                resizes.lock().unwrap().push(now);
            }
        })
    };
    synced(&seen).await;
    // Let everything settle: the new machine Running and available, the sets' statuses current, and the deployment
    // controller having looked at that (its status counts 5 available).
    eventually("the paused layout settled", || async {
        let sets = h.all_sets().await;
        let machines = h.all_machines().await;
        let deployment = h.deployment().await;
        let status = deployment.status.as_ref()?;
        (machines.len() == 5
            && machines.iter().all(|m| m.phase() == Some(MachinePhase::Running))
            && sets.iter().all(|s| {
                s.status.as_ref().is_some_and(|st| {
                    Some(st.observed_generation) == s.metadata.generation
                        && st.replicas == s.spec.replicas
                        && st.available_replicas == s.spec.replicas
                })
            })
            && status.available_replicas == 5
            && status.updated_replicas == 1)
            .then_some(())
    })
    .await;
    let deployment = h.deployment().await;
    assert_eq!(
        progressing(&deployment),
        Some((ConditionStatus::Unknown, "DeploymentPaused".to_owned()))
    );
    assert_eq!(layout(&h.all_sets().await), frozen);
    let machines = h.all_machines().await;
    assert_eq!(
        machines.iter().filter(|m| owner_set(m) == old_set.uid()).count(),
        4,
        "no old machine was replaced while paused"
    );
    assert!(
        old_machines
            .iter()
            .all(|old| machines.iter().any(|m| m.name_any() == old.name_any()))
    );
    watch.abort();
    assert_eq!(*resizes.lock().unwrap(), Vec::<BTreeMap<String, i32>>::new());

    h.patch_spec(json!({ "paused": false })).await;
    let (_, set, machines) = h.rolled_out(4).await;
    assert_eq!(set.uid(), new_set.uid());
    assert!(machines.iter().all(|m| m.spec.class.name == "medium"));
    h.stop().await;
}

/// Scaling during a rollout (reference §6.4; the FAQ "How MCM responds when scale-out/scale-in is done during rolling
/// update": "Case scale-out -> ONLY New machineSet is scaled out"): 3 → 5 while a RollingUpdate is under way never
/// grows the old set, never exceeds 5 + maxSurge live machines, and ends with 5 machines of the new set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_mid_rollout_goes_to_the_new_set() {
    let h = start().await;
    // minReadySeconds holds every step for 1s, so that the scale lands while the old set still has all its machines.
    h.create_deployment(
        rollout("scaling")
            .replicas(3)
            .min_ready_seconds(1)
            .strategy("RollingUpdate")
            .max_surge(IntOrString::Int(1))
            .max_unavailable(IntOrString::Int(0)),
    )
    .await;
    let (_, old_set, _) = h.rolled_out(3).await;

    // Every size the old set was given, in order.
    let old_sizes: Arc<Mutex<Vec<i32>>> = Arc::default();
    let (sets_seen, sets_watch) = {
        let old_sizes = old_sizes.clone();
        let old_uid = old_set.uid();
        observe(h.sets(), move |sets| {
            if let Some(old) = sets.iter().find(|s| s.uid() == old_uid) {
                let mut sizes = old_sizes.lock().unwrap();
                if sizes.last() != Some(&old.spec.replicas) {
                    sizes.push(old.spec.replicas);
                }
            }
        })
    };
    let peak = Arc::new(AtomicUsize::new(0));
    let (machines_seen, machines_watch) = {
        let peak = peak.clone();
        observe(h.machines(), move |machines| {
            let live = machines
                .iter()
                .filter(|m| m.metadata.deletion_timestamp.is_none())
                .count();
            peak.fetch_max(live, Ordering::SeqCst);
        })
    };
    synced(&sets_seen).await;
    synced(&machines_seen).await;

    h.patch_spec(json!({ "template": { "spec": { "class": { "name": "medium" } } } }))
        .await;
    let new_set = h.new_set_besides(&old_set).await;
    h.patch_spec(json!({ "replicas": 5 })).await;
    assert_eq!(
        h.sets().get(&old_set.name_any()).await.unwrap().spec.replicas,
        3,
        "the scale came in the middle of the rollout"
    );

    let (deployment, set, machines) = h.rolled_out(5).await;
    sets_watch.abort();
    machines_watch.abort();
    assert_eq!(set.uid(), new_set.uid());
    assert!(machines.iter().all(|m| m.spec.class.name == "medium"));
    let status = deployment.status.unwrap();
    assert_eq!((status.updated_replicas, status.available_replicas), (5, 5));
    assert_eq!(h.sets().get(&old_set.name_any()).await.unwrap().spec.replicas, 0);
    let sizes = old_sizes.lock().unwrap().clone();
    assert_eq!(sizes.first(), Some(&3), "{sizes:?}");
    assert!(
        sizes.windows(2).all(|w| w[1] <= w[0]),
        "the old set never grows: {sizes:?}"
    );
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= 6, "never more than 5 + maxSurge live machines: {peak}");
    h.stop().await;
}

/// Reference §6.3 with percentages: 10 replicas, maxSurge 25% (rounded up: 3) and maxUnavailable 25% (rounded down:
/// 2). On every observed state, at most 13 machines (those being deleted included) and at least 8 Running machines
/// not being deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_machines_roll_within_surge_and_unavailability() {
    let h = start().await;
    h.create_deployment(
        rollout("ten")
            .replicas(10)
            .strategy("RollingUpdate")
            .max_surge(IntOrString::String("25%".into()))
            .max_unavailable(IntOrString::String("25%".into())),
    )
    .await;
    let (_, old_set, _) = h.rolled_out(10).await;
    assert_eq!(
        annotation(&old_set, keys::annotations::MAX_REPLICAS).as_deref(),
        Some("13"),
        "replicas + maxSurge, 25% of 10 rounded up"
    );

    // (most machines, most live machines, fewest Running live machines) over every observed state.
    let bounds = Arc::new(Mutex::new((0usize, 0usize, usize::MAX)));
    let (seen, watch) = {
        let bounds = bounds.clone();
        observe(h.machines(), move |machines| {
            let live = machines
                .iter()
                .filter(|m| m.metadata.deletion_timestamp.is_none());
            let total_live = live.clone().count();
            let running = live.filter(|m| m.phase() == Some(MachinePhase::Running)).count();
            let mut bounds = bounds.lock().unwrap();
            bounds.0 = bounds.0.max(machines.len());
            bounds.1 = bounds.1.max(total_live);
            bounds.2 = bounds.2.min(running);
        })
    };
    synced(&seen).await;

    h.patch_spec(json!({ "template": { "spec": { "class": { "name": "medium" } } } }))
        .await;
    let (deployment, new_set, machines) = h.rolled_out(10).await;
    watch.abort();
    assert_ne!(new_set.uid(), old_set.uid());
    assert!(machines.iter().all(|m| m.spec.class.name == "medium"));
    let status = deployment.status.unwrap();
    assert_eq!(
        (
            status.replicas,
            status.updated_replicas,
            status.available_replicas
        ),
        (10, 10, 10)
    );
    let (most, most_live, fewest_running) = *bounds.lock().unwrap();
    assert!(most <= 13, "never more than replicas + maxSurge machines: {most}");
    assert!(most_live > 10, "the surge was used: {most_live}");
    assert!(
        fewest_running >= 8,
        "never fewer than replicas - maxUnavailable Running machines: {fewest_running}"
    );
    h.stop().await;
}

/// Creates a deployment of 2 with `revisionHistoryLimit: 1` and rolls it three times (a template label `version`
/// 0 → 1 → 2 → 3), each rollout complete and its history cleaned up (exactly one old set left) before the next.
/// Returns, per rollout, the new set, the set it replaced and the old set that was kept.
async fn roll_three_times_keeping_one(h: &Cluster) -> Vec<(MachineSet, MachineSet, MachineSet)> {
    h.create_deployment(
        rollout("history")
            .replicas(2)
            .revision_history_limit(1)
            .strategy("RollingUpdate")
            .max_surge(IntOrString::Int(2))
            .max_unavailable(IntOrString::Int(0))
            .template_labels([("pool", "history"), ("version", "0")]),
    )
    .await;
    let (_, mut previous, _) = h.rolled_out(2).await;
    let mut rollouts = Vec::new();
    for version in 1..=3 {
        h.patch_spec(json!({ "template": { "metadata": { "labels": { "version": version.to_string() } } } }))
            .await;
        let (_, new_set, machines) = h.rolled_out(2).await;
        assert_ne!(new_set.uid(), previous.uid());
        assert!(
            machines
                .iter()
                .all(|m| m.labels().get("version") == Some(&version.to_string()))
        );
        assert_eq!(
            annotation(&new_set, keys::annotations::REVISION),
            Some((version + 1).to_string())
        );
        let what = format!("history cleaned up after rollout {version}");
        let kept = eventually(&what, || async {
            let sets = h.all_sets().await;
            (sets.len() == 2).then_some(sets)
        })
        .await;
        let old = kept
            .into_iter()
            .find(|s| s.uid() != new_set.uid())
            .expect("the new set is one of the two");
        rollouts.push((new_set.clone(), previous, old));
        previous = new_set;
    }
    rollouts
}

/// `revisionHistoryLimit` (reference §6.3 `cleanupMachineDeployment`): with a limit of 1, after each of three
/// rollouts a single old set, scaled to zero and without machines, is kept besides the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revision_history_limit_cleans_up_old_sets() {
    let h = start().await;
    let rollouts = roll_three_times_keeping_one(&h).await;
    for (new_set, _, old) in &rollouts {
        assert_eq!(old.spec.replicas, 0, "{}", old.name_any());
        assert_eq!(old.status.as_ref().map_or(0, |s| s.replicas), 0);
        let revision =
            |s: &MachineSet| annotation(s, keys::annotations::REVISION).and_then(|r| r.parse::<i64>().ok());
        assert!(revision(old) < revision(new_set), "an older revision is kept");
    }
    assert_eq!(h.all_sets().await.len(), 2);
    assert_eq!(h.all_machines().await.len(), 2);
    h.stop().await;
}

/// With `revisionHistoryLimit: 1` the old set kept is the newest old revision (the one `rollbackTo: 0` goes to;
/// Kubernetes' `cleanupDeployment` sorts by revision). Sorting by `creationTimestamp`, which has one-second
/// resolution, then by name, deleted revision 2 and kept revision 1 when both were created within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revision_history_limit_keeps_the_newest_old_revision() {
    let h = start().await;
    let rollouts = roll_three_times_keeping_one(&h).await;
    let described: Vec<String> = rollouts
        .iter()
        .map(|(new, previous, kept)| {
            let named = |s: &MachineSet| {
                format!(
                    "{} (revision {})",
                    s.name_any(),
                    annotation(s, keys::annotations::REVISION).unwrap_or_default()
                )
            };
            format!(
                "new {}, replaced {}, kept {}",
                named(new),
                named(previous),
                named(kept)
            )
        })
        .collect();
    for (_, previous, kept) in &rollouts {
        assert_eq!(kept.uid(), previous.uid(), "{described:#?}");
    }
    h.stop().await;
}
