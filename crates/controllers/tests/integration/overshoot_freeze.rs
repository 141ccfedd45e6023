//! The overshoot safety loop (reference §7) with the machine, MachineSet and MachineDeployment controllers, against
//! the embedded API server with the sim provider and its kubelet. Extra machines are made by hand with a set's
//! template labels and a controller reference to it, so that the set's machine count overshoots; each carries the
//! deletion priority 1 (the set scales them down first) and a finalizer of the test's, which holds them as Machine
//! objects (being deleted, still counted) until the test releases them. Every test has its own server and
//! temporary directory; every wait is a poll with a deadline.

use crate::support;

use std::time::Duration;

use k8s_openapi::{api::core::v1::Event, apimachinery::pkg::util::intstr::IntOrString};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::{
    ConditionStatus, Machine, MachineDeployment, MachineDeploymentCondition, MachineDeploymentConditionType,
    MachinePhase, MachineSet, MachineSetCondition, MachineSetConditionType,
    builders::{MachineBuilder, MachineDeploymentBuilder, MachineSetBuilder},
    keys,
};
use mcm_controllers::overshoot;
use serde_json::{Value, json};
use support::{Cluster, NAMESPACE, Setup};

const DEADLINE: Duration = Duration::from_mins(1);

/// The test's finalizer on the extra machines: holds them until [`Cluster::release`].
const HOLD: &str = "test.machine.sapcloud.io/hold";

/// Server, sim provider and kubelet, the machine, set and deployment controllers, and the classes `small` and
/// `medium`; the overshoot loop is started by [`Cluster::start_overshoot`].
async fn start() -> Cluster {
    Cluster::start_with_set_controllers(Setup::for_sets(), support::set_config()).await
}

/// This file's helpers on the shared harness.
impl Cluster {
    /// Starts the overshoot loop with `period`, `safety_up` 2 and `safety_down`.
    fn start_overshoot(&mut self, period: Duration, safety_down: u32) {
        let config = overshoot::Config {
            period,
            safety_down,
            ..overshoot::Config::new(NAMESPACE)
        };
        let client = self.client.clone();
        self.spawn_loop(|shutdown| {
            let (caches, shutdown) = support::caches_until(&client, shutdown);
            overshoot::run(client, config, caches, None, shutdown)
        });
    }

    async fn create_named_set(&self, name: &str, replicas: i32) {
        let set = MachineSetBuilder::new(name)
            .replicas(replicas)
            .matching([("pool", name)])
            .class("small")
            .build();
        self.sets().create(&PostParams::default(), &set).await.unwrap();
    }

    async fn create_named_deployment(&self, name: &str, replicas: i32) {
        let deployment = MachineDeploymentBuilder::new(name)
            .replicas(replicas)
            .matching([("pool", name)])
            .strategy("RollingUpdate")
            .max_surge(IntOrString::Int(1))
            .max_unavailable(IntOrString::Int(1))
            .class("small")
            .build();
        self.deployments()
            .create(&PostParams::default(), &deployment)
            .await
            .unwrap();
    }

    /// The set the deployment made.
    async fn set_of(&self, deployment: &str) -> MachineSet {
        eventually(&format!("the set of deployment {deployment}"), || async {
            self.sets()
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|s| s.owner_references().iter().any(|r| r.name == deployment))
        })
        .await
    }

    /// An extra machine of `set` made by hand: the set's template labels, a controller reference to it, deletion
    /// priority 1 and the [`HOLD`] finalizer.
    async fn create_extra(&self, set: &MachineSet, name: &str) {
        let labels = set.spec.template.labels();
        let machine = MachineBuilder::new(name)
            .labels(labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .annotation(keys::annotations::MACHINE_PRIORITY, "1")
            .finalizer(HOLD)
            .owned_by(set)
            .class("small")
            .build();
        self.machines()
            .create(&PostParams::default(), &machine)
            .await
            .unwrap();
    }

    /// Extras `<prefix>-0..n` of `set`.
    async fn create_extras(&self, set: &MachineSet, prefix: &str, n: usize) -> Vec<String> {
        let mut names = Vec::new();
        for i in 0..n {
            let name = format!("{prefix}-{i}");
            self.create_extra(set, &name).await;
            names.push(name);
        }
        names
    }

    /// Waits until the set controller has scaled every one of `names` down (they are being deleted, held).
    async fn wait_deleting(&self, names: &[String]) {
        eventually("the extras being deleted", || async {
            for name in names {
                let machine = self.machines().get(name).await.unwrap();
                machine.metadata.deletion_timestamp.as_ref()?;
            }
            Some(())
        })
        .await;
    }

    /// Removes [`HOLD`] from the machine (the other finalizers kept; guarded by its resourceVersion) and waits until
    /// it is gone.
    async fn release(&self, name: &str) {
        eventually(&format!("{HOLD} removed from {name}"), || async {
            let machine = self.machines().get_opt(name).await.unwrap()?;
            let rest: Vec<String> = machine
                .finalizers()
                .iter()
                .filter(|f| *f != HOLD)
                .cloned()
                .collect();
            let list = if rest.is_empty() { Value::Null } else { json!(rest) };
            let patch =
                json!({ "metadata": { "finalizers": list, "resourceVersion": machine.resource_version() } });
            match self
                .machines()
                .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => Some(()),
                Err(kube::Error::Api(status)) if status.code == 409 => None,
                Err(kube::Error::Api(status)) if status.code == 404 => Some(()),
                Err(err) => panic!("releasing {name}: {err}"),
            }
        })
        .await;
        eventually(&format!("{name} gone"), || async {
            self.machines()
                .get_opt(name)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
    }

    /// The machines of `set` (by controller reference) that are not being deleted.
    async fn live_machines_of(&self, set: &str) -> Vec<Machine> {
        self.machines()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter(|m| m.owner_references().iter().any(|r| r.name == set))
            .collect()
    }

    async fn wait_running(&self, set: &str, n: usize) {
        eventually(&format!("{n} Running machines of {set}"), || async {
            let machines = self.live_machines_of(set).await;
            (machines.len() == n && machines.iter().all(|m| m.phase() == Some(MachinePhase::Running)))
                .then_some(())
        })
        .await;
    }

    /// The events with `reason` about the object `name`.
    async fn events_named(&self, name: &str, reason: &str) -> Vec<Event> {
        self.events_for(None, name, reason).await
    }

    async fn wait_event(&self, name: &str, reason: &str) -> Event {
        eventually(&format!("event {reason} on {name}"), || async {
            self.events_named(name, reason).await.into_iter().next()
        })
        .await
    }

    /// Waits until the set is frozen (label and condition) or unfrozen (neither), and returns it.
    async fn wait_set_frozen(&self, name: &str, frozen: bool) -> MachineSet {
        eventually(&format!("set {name} frozen={frozen}"), || async {
            let set = self.sets().get(name).await.unwrap();
            (has_freeze_label(&set) == frozen && set_condition(&set).is_some() == frozen).then_some(set)
        })
        .await
    }

    /// Waits until the deployment is frozen (label and condition) or unfrozen (neither), and returns it.
    async fn wait_deployment_frozen(&self, name: &str, frozen: bool) -> MachineDeployment {
        eventually(&format!("deployment {name} frozen={frozen}"), || async {
            let deployment = self.deployments().get(name).await.unwrap();
            (has_freeze_label(&deployment) == frozen && deployment_condition(&deployment).is_some() == frozen)
                .then_some(deployment)
        })
        .await
    }

    async fn annotate_unfreeze<K>(&self, api: &Api<K>, name: &str)
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { keys::annotations::UNFREEZE: "True" } } })),
        )
        .await
        .unwrap();
    }
}

fn has_freeze_label<K: kube::Resource>(object: &K) -> bool {
    object
        .meta()
        .labels
        .as_ref()
        .and_then(|l| l.get(keys::labels::FREEZE))
        .map(String::as_str)
        == Some("True")
}

fn has_unfreeze_annotation<K: kube::Resource>(object: &K) -> bool {
    object
        .meta()
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(keys::annotations::UNFREEZE))
}

fn set_condition(set: &MachineSet) -> Option<&MachineSetCondition> {
    set.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == MachineSetConditionType::Frozen && c.status == ConditionStatus::True)
}

fn deployment_condition(deployment: &MachineDeployment) -> Option<&MachineDeploymentCondition> {
    deployment
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == MachineDeploymentConditionType::Frozen && c.status == ConditionStatus::True)
}

/// Waits until `probe` gives a value, within this file's deadline.
async fn eventually<T>(what: &str, probe: impl AsyncFnMut() -> Option<T>) -> T {
    support::wait_within(DEADLINE, what, probe).await
}

/// (a) A set of 2 with 5 extra machines (7 ≥ 2·2+2) is frozen: label `freeze=True`, condition Frozen=True
/// OverShootingReplicaCount, event FrozeMachineSet. While frozen the set scales the extras down but does not
/// replace a machine it lost; once the extras are gone (1 ≤ 5) it is unfrozen (label and condition removed, event
/// UnfrozeMachineSet) and scales up again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overshooting_set_is_frozen_holds_scale_up_and_unfreezes_when_the_count_falls() {
    let mut h = start().await;
    h.start_overshoot(Duration::from_millis(200), 1);
    h.create_named_set("workers", 2).await;
    h.wait_running("workers", 2).await;
    let set = h.sets().get("workers").await.unwrap();

    let extras = h.create_extras(&set, "extra", 5).await;
    let frozen = h.wait_set_frozen("workers", true).await;
    let condition = set_condition(&frozen).unwrap();
    assert_eq!(condition.reason, "OverShootingReplicaCount");
    assert!(condition.message.contains(">= 6"), "{}", condition.message);
    assert!(condition.last_transition_time.is_some());
    let event = h.wait_event("workers", "FrozeMachineSet").await;
    assert!(
        event.message.as_deref().unwrap_or_default().contains(">= 6"),
        "{event:?}"
    );
    assert_eq!(
        event.source.and_then(|s| s.component).as_deref(),
        Some(overshoot::COMPONENT)
    );

    // Scale-down goes on while frozen: the extras (priority 1) are deleted, held by the test's finalizer.
    h.wait_deleting(&extras).await;
    let originals: Vec<String> = h
        .live_machines_of("workers")
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(originals.len(), 2);

    // Lose one original: 1 + 5 = 6 machines, still at the upper threshold. The set wants one more but is frozen.
    h.machines()
        .delete(&originals[0], &DeleteParams::default())
        .await
        .unwrap();
    eventually("the set's status counting 1 + 5 machines", || async {
        let set = h.sets().get("workers").await.unwrap();
        (set.status.as_ref().map(|s| s.replicas) == Some(6)).then_some(())
    })
    .await;
    // Every pass of the set controller creates before it writes its status: a status that counts the lost
    // machine gone shows the passes that could have replaced it.
    assert_eq!(
        h.live_machines_of("workers").await.len(),
        1,
        "no machine created while frozen"
    );
    assert_eq!(h.events_named("workers", "SuccessfulCreate").await.len(), 2);
    assert!(has_freeze_label(&h.sets().get("workers").await.unwrap()));

    // The extras go: 1 machine, at most the lower threshold (5): unfrozen, and the set scales up again.
    for name in &extras {
        h.release(name).await;
    }
    let unfrozen = h.wait_set_frozen("workers", false).await;
    assert!(
        unfrozen.status.as_ref().is_none_or(|s| s
            .conditions
            .iter()
            .all(|c| c.r#type != MachineSetConditionType::Frozen)),
        "the Frozen condition is removed: {:?}",
        unfrozen.status
    );
    let event = h.wait_event("workers", "UnfrozeMachineSet").await;
    assert!(
        event.message.as_deref().unwrap_or_default().contains("<= 5"),
        "{event:?}"
    );
    h.wait_running("workers", 2).await;
    assert_eq!(h.events_named("workers", "SuccessfulCreate").await.len(), 3);
    assert_eq!(
        h.events_named("workers", "FrozeMachineSet").await.len(),
        1,
        "one freeze, one event"
    );
    assert_eq!(h.events_named("workers", "UnfrozeMachineSet").await.len(), 1);
    h.stop().await;
}

/// (b) A set of a MachineDeployment (2 replicas, maxSurge 1: upper threshold 2+1+2 = 5) overshoots: the freeze
/// propagates to the deployment (label and condition with the set's reason), and so does the unfreeze.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freeze_and_unfreeze_propagate_to_the_deployment() {
    let mut h = start().await;
    h.start_overshoot(Duration::from_millis(200), 1);
    h.create_named_deployment("pool", 2).await;
    let set = h.set_of("pool").await;
    h.wait_running(&set.name_any(), 2).await;

    let extras = h.create_extras(&set, "extra", 3).await;
    let frozen_set = h.wait_set_frozen(&set.name_any(), true).await;
    assert!(
        set_condition(&frozen_set).unwrap().message.contains(">= 5"),
        "{:?}",
        set_condition(&frozen_set)
    );
    let deployment = h.wait_deployment_frozen("pool", true).await;
    let condition = deployment_condition(&deployment).unwrap();
    assert!(
        ["OverShootingReplicaCount", "MachineDeploymentStateSync"].contains(&condition.reason.as_str()),
        "{condition:?}"
    );
    h.wait_event(&set.name_any(), "FrozeMachineSet").await;
    h.wait_event("pool", "FrozeMachineDeployment").await;

    h.wait_deleting(&extras).await;
    for name in &extras {
        h.release(name).await;
    }
    h.wait_set_frozen(&set.name_any(), false).await;
    h.wait_deployment_frozen("pool", false).await;
    h.wait_event(&set.name_any(), "UnfrozeMachineSet").await;
    h.wait_event("pool", "UnfrozeMachineDeployment").await;
    h.wait_running(&set.name_any(), 2).await;
    h.stop().await;
}

/// (c) The manual unfreeze annotation on a set unfreezes it at once and is removed. With safety-down 3 (upper 6,
/// lower 3) a count of 5 keeps a frozen set frozen, so only the annotation unfreezes it; the set then stays
/// unfrozen (5 is under the upper threshold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unfreeze_annotation_unfreezes_a_set_at_once_and_is_removed() {
    let mut h = start().await;
    h.start_overshoot(Duration::from_millis(200), 3);
    h.create_named_set("workers", 2).await;
    h.wait_running("workers", 2).await;
    let set = h.sets().get("workers").await.unwrap();
    let extras = h.create_extras(&set, "extra", 4).await;
    h.wait_set_frozen("workers", true).await;
    h.wait_deleting(&extras).await;
    h.release(&extras[0]).await;
    // 5 machines: between the thresholds, frozen it stays.
    assert!(has_freeze_label(&h.sets().get("workers").await.unwrap()));

    h.annotate_unfreeze(&h.sets(), "workers").await;
    let set = h.wait_set_frozen("workers", false).await;
    let set = if has_unfreeze_annotation(&set) {
        eventually("the unfreeze annotation removed", || async {
            let set = h.sets().get("workers").await.unwrap();
            (!has_unfreeze_annotation(&set)).then_some(set)
        })
        .await
    } else {
        set
    };
    assert!(!has_freeze_label(&set) && set_condition(&set).is_none());
    let event = h.wait_event("workers", "UnfrozeMachineSet").await;
    assert!(
        event
            .message
            .as_deref()
            .unwrap_or_default()
            .contains(keys::annotations::UNFREEZE),
        "{event:?}"
    );
    for name in &extras[1..] {
        h.release(name).await;
    }
    h.wait_running("workers", 2).await;
    assert_eq!(
        h.events_named("workers", "FrozeMachineSet").await.len(),
        1,
        "not frozen again"
    );
    h.stop().await;
}

/// (c') The unfreeze annotation on a deployment unfreezes the deployment and its set, and is removed from the
/// deployment (safety-down 3: upper 5, lower 2; a count of 4 would keep them frozen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unfreeze_annotation_on_a_deployment_unfreezes_it_and_its_set() {
    let mut h = start().await;
    h.start_overshoot(Duration::from_millis(200), 3);
    h.create_named_deployment("pool", 2).await;
    let set = h.set_of("pool").await;
    let set_name = set.name_any();
    h.wait_running(&set_name, 2).await;
    let extras = h.create_extras(&set, "extra", 3).await;
    h.wait_set_frozen(&set_name, true).await;
    h.wait_deployment_frozen("pool", true).await;
    h.wait_deleting(&extras).await;
    h.release(&extras[0]).await;

    h.annotate_unfreeze(&h.deployments(), "pool").await;
    h.wait_set_frozen(&set_name, false).await;
    eventually("the deployment unfrozen and its annotation removed", || async {
        let d = h.deployments().get("pool").await.unwrap();
        (!has_freeze_label(&d) && deployment_condition(&d).is_none() && !has_unfreeze_annotation(&d))
            .then_some(())
    })
    .await;
    assert!(!has_unfreeze_annotation(&h.sets().get(&set_name).await.unwrap()));
    h.wait_event(&set_name, "UnfrozeMachineSet").await;
    for name in &extras[1..] {
        h.release(name).await;
    }
    h.wait_running(&set_name, 2).await;
    h.stop().await;
}

/// (d) Two sets overshooting at once are both frozen by the same pass (the reference changes one set per period).
/// The loop runs with a period of an hour and starts after both overshoot: only its first pass can have frozen
/// them, since no machine is created afterwards. A machine created later triggers a pass at once: a third set
/// overshooting then is frozen within the test's deadline too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overshooting_sets_are_all_frozen_in_one_pass_and_a_creation_triggers_a_pass() {
    let mut h = start().await;
    h.create_named_set("alpha", 1).await;
    h.create_named_set("beta", 1).await;
    h.wait_running("alpha", 1).await;
    h.wait_running("beta", 1).await;
    // 1 + 3 = 4 = 2·1 + 2 machines each.
    let alpha = h.sets().get("alpha").await.unwrap();
    let beta = h.sets().get("beta").await.unwrap();
    let mut extras = h.create_extras(&alpha, "alpha-extra", 3).await;
    extras.extend(h.create_extras(&beta, "beta-extra", 3).await);
    h.wait_deleting(&extras).await;
    assert!(!has_freeze_label(&h.sets().get("alpha").await.unwrap()));

    h.start_overshoot(Duration::from_hours(1), 1);
    h.wait_set_frozen("alpha", true).await;
    h.wait_set_frozen("beta", true).await;
    h.wait_event("alpha", "FrozeMachineSet").await;
    h.wait_event("beta", "FrozeMachineSet").await;

    h.create_named_set("gamma", 1).await;
    h.wait_running("gamma", 1).await;
    let gamma = h.sets().get("gamma").await.unwrap();
    h.create_extras(&gamma, "gamma-extra", 3).await;
    h.wait_set_frozen("gamma", true).await;
    h.stop().await;
}
