//! The machine deletion flow, the acting half of `mcm_core::deletion`: each pass asks `deletion::decide` for the
//! step persisted on the machine, writes what it says (phase Terminating, a skipped step, a hook hold), does the
//! step's action (GetMachineStatus, a drain pass, VolumeAttachment cleanup, DeleteMachine, node deletion, finalizer
//! removal) and writes `deletion::after`'s next step before the next action. A controller that crashes anywhere
//! resumes at the persisted step; every action is idempotent (NotFound counts as done), so nothing harmful repeats.
//!
//! A write the decisions mark deferrable (`DeletionWrite::deferrable`: Terminating, the VM status, the VM and node
//! deletions, steps whose redo is harmless) waits and goes with the next write of the pass, or is dropped when the
//! finalizer removal ends the flow (issue 26: one status write per deletion whose drain ends in one pass, from five).
//! Events report the lifecycle steps (`DeletionDescription::recorded`) as they happen, written or waiting.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Mutex,
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::{Node, Secret},
    storage::v1::VolumeAttachment,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use mcm_api::{Machine, MachineClass, MachineStatus, keys};
use mcm_core::{
    ControllerSettings, Redactor,
    deletion::{self, DeletionAction, DeletionInput, DeletionWrite, NodeDeletion, StepOutcome},
    drain,
};
use mcm_driver::{DeleteMachineRequest, Driver, GetMachineStatusRequest};
use serde_json::json;

use crate::{
    drain::{DrainPass, DrainTrackers},
    events::{EventType, Recorder},
    metrics::MachineStep,
};

/// How many steps one reconcile may go through before it yields (a full flow has seven).
const STEPS_PER_PASS: usize = 12;

/// How many finished flows [`DeletionMemory`] remembers: far more than can finish while a cache lags behind.
const FINISHED_KEPT: usize = 4096;

/// Per-machine memory of the deletion flow between passes: consecutive failures (for the back-off), the drain's
/// tracker, and the uids of the machines whose flow ended lately. Lost on restart without harm.
#[derive(Default)]
pub struct DeletionMemory {
    failures: Mutex<BTreeMap<String, u32>>,
    drains: DrainTrackers,
    finished: Mutex<VecDeque<String>>,
}

impl DeletionMemory {
    /// Whether the flow of the machine with this uid ended (its finalizer is gone): a cache that still shows it,
    /// finalizer and all, until its deletion arrives must not start the VM and node deletions again (issue 26: they
    /// cost a DeleteMachine, an Event and two writes per deleted machine).
    fn finished(&self, uid: Option<&str>) -> bool {
        uid.is_some_and(|uid| self.finished.lock().is_ok_and(|f| f.iter().any(|u| u == uid)))
    }

    fn finish(&self, uid: Option<String>) {
        if let (Some(uid), Ok(mut f)) = (uid, self.finished.lock()) {
            if f.len() >= FINISHED_KEPT {
                f.pop_front();
            }
            f.push_back(uid);
        }
    }

    fn failures(&self, machine: &str) -> u32 {
        self.failures
            .lock()
            .map_or(0, |m| m.get(machine).copied().unwrap_or(0))
    }

    fn set_failures(&self, machine: &str, failed: bool) {
        if let Ok(mut m) = self.failures.lock() {
            if failed {
                *m.entry(machine.to_owned()).or_default() += 1;
            } else {
                m.remove(machine);
            }
        }
    }

    fn forget(&self, machine: &str) {
        self.set_failures(machine, false);
        self.drains.forget(machine);
    }
}

/// Everything one deletion pass needs, borrowed from the machine controller.
pub struct Deletion<'a> {
    /// The machines' API (control cluster, the machine's namespace).
    pub machines: Api<Machine>,
    /// The target cluster, if any.
    pub target: Option<&'a Client>,
    /// The provider.
    pub driver: &'a dyn Driver,
    /// The machine's class (`None` when it is gone: the VM cannot be deleted then, which is reported).
    pub class: Option<&'a MachineClass>,
    /// The class's merged secret.
    pub secret: &'a Secret,
    /// The machine's node from the cache.
    pub node: Option<&'a Node>,
    /// Flag values.
    pub settings: &'a ControllerSettings,
    /// Events.
    pub recorder: &'a Recorder,
    /// Memory between passes.
    pub memory: &'a DeletionMemory,
    /// Called after each write of the machine with the resourceVersions before and after (stale-cache guard).
    pub wrote: &'a (dyn Fn(Option<String>, Option<&str>) + Send + Sync),
    /// Where the drain and delete durations go.
    pub metrics: Option<&'a crate::metrics::Metrics>,
}

/// The machine of a pass: as last written (or read), and as the flow sees it with the status write still waiting
/// applied.
struct Staged {
    persisted: Machine,
    view: Machine,
    waiting: Option<DeletionWrite>,
}

impl Staged {
    fn new(machine: Machine) -> Self {
        Self {
            view: machine.clone(),
            persisted: machine,
            waiting: None,
        }
    }

    /// The server's answer to a write: the new persisted machine, with the waiting status still applied to the view.
    fn written(&mut self, written: Machine) {
        self.view = written.clone();
        if let Some(waiting) = &self.waiting {
            waiting
                .status
                .apply(self.view.status.get_or_insert_with(MachineStatus::default));
        }
        self.persisted = written;
    }
}

/// The values fixed for one step of a pass.
struct Pass<'a> {
    effective: &'a mcm_core::EffectiveSettings,
    redactor: &'a Redactor,
    now: jiff::Timestamp,
    failures: u32,
    random: f64,
}

/// What a pass came to: look again after this long, or not at all (`None`: the machine is gone or not ours).
pub type Requeue = Option<Duration>;

impl Deletion<'_> {
    /// Runs steps of the flow until one has to wait; returns when to look again. A status write still waiting is
    /// written before the pass ends, unless the machine is gone.
    pub async fn run(&self, machine: &Machine) -> Result<Requeue, kube::Error> {
        if self.memory.finished(machine.metadata.uid.as_deref()) {
            return Ok(None);
        }
        let mut staged = Staged::new(machine.clone());
        let requeue = self.steps(&mut staged).await?;
        if requeue.is_some() {
            self.flush(&mut staged).await?;
        }
        Ok(requeue)
    }

    #[allow(clippy::too_many_lines)] // one loop over the steps, each action a short arm
    async fn steps(&self, machine: &mut Staged) -> Result<Requeue, kube::Error> {
        let name = machine.view.name_any();
        let redactor = Redactor::from_secret_data(self.secret.data.as_ref().unwrap_or(&BTreeMap::new()));
        let effective = mcm_core::effective_settings(&machine.view, self.settings);
        for _ in 0..STEPS_PER_PASS {
            let now = jiff::Timestamp::now();
            let failures = self.memory.failures(&name) + 1;
            let random: f64 = rand::random();
            let pass = Pass {
                effective: &effective,
                redactor: &redactor,
                now,
                failures,
                random,
            };
            let plan = deletion::decide(&self.input(&machine.view, &pass));
            if plan.write.is_some() {
                self.stage(machine, plan.write.clone()).await?;
                crash_point!(DeletionStepWrite, &name);
            }
            let outcome = match &plan.action {
                DeletionAction::Nothing => return Ok(None),
                DeletionAction::Hold(_) => return Ok(plan.requeue_after),
                DeletionAction::GetVmStatus => StepOutcome::GetVmStatus(
                    self.driver
                        .get_machine_status(&GetMachineStatusRequest {
                            machine: machine.view.clone(),
                            machine_class: self.class.cloned().unwrap_or_default(),
                            secret: self.secret.clone(),
                        })
                        .await,
                ),
                DeletionAction::Drain { node, mode } => {
                    let Some(target) = self.target else {
                        return Ok(Some(Duration::from_secs(5)));
                    };
                    let mut tracker = self.memory.drains.get(&name);
                    let started = *tracker.started.get_or_insert(now);
                    let outcome = DrainPass {
                        target,
                        driver: self.driver,
                        node,
                        cached: self.node,
                        mode,
                        settings: &effective,
                        now,
                        cordon: true,
                    }
                    .run(&mut tracker)
                    .await;
                    // Over: drained, or a force drain that ended either way (the flow moves on).
                    if matches!(outcome, drain::DrainOutcome::Drained { .. })
                        || (mode.force.is_some()
                            && !matches!(outcome, drain::DrainOutcome::InProgress { .. }))
                    {
                        tracker.started = None;
                        if let Some(metrics) = self.metrics {
                            let took = crate::metrics::elapsed(started, jiff::Timestamp::now());
                            metrics.machine_step(
                                MachineStep::Drain,
                                &machine.view,
                                self.node,
                                self.class,
                                took,
                            );
                        }
                    }
                    self.memory.drains.keep(name.clone(), tracker);
                    StepOutcome::Drain {
                        force: mode.force.clone(),
                        outcome,
                    }
                }
                DeletionAction::DeleteVolumeAttachments { node } => {
                    StepOutcome::VolumeAttachments(self.delete_volume_attachments(node).await)
                }
                DeletionAction::DeleteVm => {
                    let Some(class) = self.class else {
                        // Without its class (and secret) the provider cannot be asked; wait for the class to return.
                        self.recorder
                            .record(
                                &machine.view,
                                EventType::Warning,
                                "DeleteFailed",
                                &format!(
                                    "MachineClass {:?} not found: the VM cannot be deleted without it",
                                    machine.view.spec.class.name
                                ),
                            )
                            .await;
                        return Ok(Some(self.settings.retry.await_change_resync));
                    };
                    let result = self
                        .driver
                        .delete_machine(&DeleteMachineRequest {
                            machine: machine.view.clone(),
                            machine_class: class.clone(),
                            secret: self.secret.clone(),
                        })
                        .await;
                    let gone = match &result {
                        Ok(_) => true,
                        Err(err) => err.code == mcm_driver::MachineCode::NotFound,
                    };
                    // The reference's delete duration: from the deletionTimestamp until the VM is gone.
                    if let (true, Some(metrics), Some(deleted)) =
                        (gone, self.metrics, &machine.view.metadata.deletion_timestamp)
                    {
                        let took = crate::metrics::elapsed(deleted.0, jiff::Timestamp::now());
                        metrics.machine_step(
                            MachineStep::Delete,
                            &machine.view,
                            self.node,
                            Some(class),
                            took,
                        );
                    }
                    StepOutcome::DeleteVm(result)
                }
                DeletionAction::DeleteNode { node } => StepOutcome::DeleteNode(self.delete_node(node).await),
                DeletionAction::RemoveFinalizer => {
                    let result = self.remove_finalizer(&machine.view).await;
                    if result.is_ok() {
                        let node = machine.view.node_name().unwrap_or_default();
                        tracing::info!(machine = %name, node = %node, "machine deleted");
                    }
                    StepOutcome::RemoveFinalizer(result.map_err(|e| e.to_string()))
                }
            };
            crash_point!(step plan.step, &name);
            let after = deletion::after(&self.input(&machine.view, &pass), &outcome);
            let failed = after.retry.is_some()
                || after
                    .write
                    .as_ref()
                    .is_some_and(|w| w.description.state() == mcm_api::MachineState::Failed);
            self.memory.set_failures(&name, failed);
            if let Some(node) = &after.node_label {
                self.label_node(machine, node).await?;
                crash_point!(DeletionNodeLabel, &name);
            }
            if after.next.is_none() {
                // The finalizer is gone, and the machine with it: a status still waiting is not written.
                self.memory.forget(&name);
                self.memory.finish(machine.view.metadata.uid.clone());
                return Ok(None);
            }
            if after.write.is_some() {
                self.stage(machine, after.write.clone()).await?;
                crash_point!(DeletionNextStepWrite, &name);
            }
            if after.requeue_after != Some(Duration::ZERO) {
                return Ok(after.requeue_after);
            }
        }
        Ok(Some(Duration::ZERO))
    }

    /// Takes in a status write of the flow: merged after the one waiting, if any; written now unless it may wait
    /// for the next ([`DeletionWrite::deferrable`]), with an Event for a new lifecycle step either way.
    async fn stage(&self, machine: &mut Staged, write: Option<DeletionWrite>) -> Result<(), kube::Error> {
        let Some(write) = deletion::merge_writes(machine.waiting.take(), write) else {
            return Ok(());
        };
        self.record(&machine.view, &write).await;
        if write.deferrable {
            write
                .status
                .apply(machine.view.status.get_or_insert_with(MachineStatus::default));
            machine.waiting = Some(write);
            return Ok(());
        }
        self.write(machine, &write).await
    }

    /// Writes the status still waiting, if any (the pass ends).
    async fn flush(&self, machine: &mut Staged) -> Result<(), kube::Error> {
        match machine.waiting.take() {
            Some(write) => self.write(machine, &write).await,
            None => Ok(()),
        }
    }

    /// An Event for `write` when it is a lifecycle step (or a failure) whose description is new.
    async fn record(&self, view: &Machine, write: &DeletionWrite) {
        let previous = view
            .status
            .as_ref()
            .map(|s| s.last_operation.description.as_str());
        let text = write.description.to_string();
        if previous == Some(text.as_str()) || !write.description.recorded() {
            return;
        }
        let kind = if write.description.state() == mcm_api::MachineState::Failed {
            EventType::Warning
        } else {
            EventType::Normal
        };
        self.recorder
            .record(view, kind, write.description.reason(), &text)
            .await;
    }

    fn input<'b>(&'b self, machine: &'b Machine, pass: &'b Pass<'b>) -> DeletionInput<'b> {
        DeletionInput {
            machine,
            node: self.node,
            has_target_cluster: self.target.is_some(),
            now: pass.now,
            settings: pass.effective,
            retry: &self.settings.retry,
            controller_node: self.settings.controller_node.as_deref(),
            failures: pass.failures,
            random: pass.random,
            redactor: pass.redactor,
        }
    }

    /// Writes the status when it changes the persisted one.
    async fn write(&self, machine: &mut Staged, write: &DeletionWrite) -> Result<(), kube::Error> {
        if !write.status.changes(machine.persisted.status.as_ref()) {
            return Ok(());
        }
        let written = self
            .machines
            .patch_status(
                &machine.persisted.name_any(),
                &PatchParams::default(),
                &Patch::Merge(write.status.merge_patch()),
            )
            .await?;
        (self.wrote)(
            machine.persisted.resource_version(),
            written.resource_version().as_deref(),
        );
        machine.written(written);
        Ok(())
    }

    async fn label_node(&self, machine: &mut Staged, node: &str) -> Result<(), kube::Error> {
        let written = self
            .machines
            .patch(
                &machine.persisted.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { keys::labels::NODE: node } } })),
            )
            .await?;
        (self.wrote)(
            machine.persisted.resource_version(),
            written.resource_version().as_deref(),
        );
        machine.written(written);
        Ok(())
    }

    async fn delete_volume_attachments(&self, node: &str) -> Result<usize, String> {
        let Some(target) = self.target else { return Ok(0) };
        let api: Api<VolumeAttachment> = Api::all(target.clone());
        let all = api
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing VolumeAttachments: {e}"))?
            .items;
        let live = drain::live_volume_attachments(node, &all);
        let count = live.len();
        for attachment in live {
            match api.delete(&attachment.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => {
                    return Err(format!(
                        "deleting VolumeAttachment {}: {err}",
                        attachment.name_any()
                    ));
                }
            }
        }
        Ok(count)
    }

    async fn delete_node(&self, node: &str) -> NodeDeletion {
        let Some(target) = self.target else {
            return NodeDeletion::NotFound;
        };
        let api: Api<Node> = Api::all(target.clone());
        // The cached node first (issue 26: no GET of what the cache holds); the server's when the cache has none, or
        // when the finalizer list changed since (the patch tests the list it replaces).
        let cached = self.node.filter(|n| n.metadata.name.as_deref() == Some(node));
        let mut current = cached.cloned();
        for fresh in [cached.is_none(), true] {
            if fresh {
                current = match api.get_opt(node).await {
                    Ok(Some(current)) => Some(current),
                    Ok(None) => return NodeDeletion::NotFound,
                    Err(err) => return NodeDeletion::Failed(err.to_string()),
                };
            }
            let Some(patch) = current
                .as_ref()
                .and_then(|n| mcm_core::finalizers::removal_json_patch(&n.metadata, keys::finalizers::NODE))
            else {
                break;
            };
            let patch = match json_patch(patch) {
                Ok(patch) => patch,
                Err(err) => return NodeDeletion::Failed(format!("the node finalizer patch: {err}")),
            };
            match api.patch(node, &PatchParams::default(), &patch).await {
                Ok(_) => break,
                Err(kube::Error::Api(status)) if status.code == 404 => return NodeDeletion::NotFound,
                Err(kube::Error::Api(status)) if (status.code == 409 || status.code == 422) && !fresh => {}
                Err(err) => return NodeDeletion::Failed(format!("removing the node finalizer: {err}")),
            }
        }
        crash_point!(DeletionNodeFinalizer, node);
        match api.delete(node, &DeleteParams::default()).await {
            Ok(_) => NodeDeletion::Deleted,
            Err(kube::Error::Api(status)) if status.code == 404 => NodeDeletion::NotFound,
            Err(err) => NodeDeletion::Failed(err.to_string()),
        }
    }

    async fn remove_finalizer(&self, machine: &Machine) -> Result<(), kube::Error> {
        // The list tested, not the resourceVersion: the machine this pass holds may be older than the server's by
        // a status write, which does not matter here (issue 26: no conflict retry per deleted machine).
        let Some(patch) = mcm_core::finalizers::removal_json_patch(
            &machine.metadata,
            keys::finalizers::MACHINE_CONTROLLER_MANAGER,
        ) else {
            return Ok(());
        };
        match self
            .machines
            .patch(&machine.name_any(), &PatchParams::default(), &json_patch(patch)?)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(err),
        }
    }
}

/// A JSON patch (RFC 6902) of its JSON form.
fn json_patch(value: serde_json::Value) -> Result<Patch<()>, kube::Error> {
    serde_json::from_value(value)
        .map(Patch::Json)
        .map_err(kube::Error::SerdeError)
}
