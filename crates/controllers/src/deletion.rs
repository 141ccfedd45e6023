//! The machine deletion flow, the acting half of `mcm_core::deletion`: each pass asks `deletion::decide` for the
//! step persisted on the machine, writes what it says (phase Terminating, a skipped step, a hook hold), does the
//! step's action (GetMachineStatus, a drain pass, VolumeAttachment cleanup, DeleteMachine, node deletion, finalizer
//! removal) and writes `deletion::after`'s next step before the next action. A controller that crashes anywhere
//! resumes at the persisted step; every action is idempotent (NotFound counts as done), so nothing harmful repeats.

use std::{collections::BTreeMap, sync::Mutex, time::Duration};

use k8s_openapi::api::{
    core::v1::{Node, Secret},
    storage::v1::VolumeAttachment,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use mcm_api::{Machine, MachineClass, keys};
use mcm_core::{
    ControllerSettings, Redactor,
    deletion::{self, DeletionAction, DeletionInput, DeletionWrite, NodeDeletion, StepOutcome},
    drain,
    finalizers::FinalizerChange,
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

/// Per-machine memory of the deletion flow between passes: consecutive failures (for the back-off) and the drain's
/// tracker. Lost on restart without harm.
#[derive(Default)]
pub struct DeletionMemory {
    failures: Mutex<BTreeMap<String, u32>>,
    drains: DrainTrackers,
}

impl DeletionMemory {
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
    /// Runs steps of the flow until one has to wait; returns when to look again.
    #[allow(clippy::too_many_lines)] // one loop over the steps, each action a short arm
    pub async fn run(&self, machine: &Machine) -> Result<Requeue, kube::Error> {
        let name = machine.name_any();
        let redactor = Redactor::from_secret_data(self.secret.data.as_ref().unwrap_or(&BTreeMap::new()));
        let effective = mcm_core::effective_settings(machine, self.settings);
        let mut machine = machine.clone();
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
            let plan = deletion::decide(&self.input(&machine, &pass));
            if let Some(write) = &plan.write {
                machine = self.write(&machine, write).await?;
                crash_point!(DeletionStepWrite, &name);
            }
            let outcome = match &plan.action {
                DeletionAction::Nothing => return Ok(None),
                DeletionAction::Hold(_) => return Ok(plan.requeue_after),
                DeletionAction::GetVmStatus => StepOutcome::GetVmStatus(
                    self.driver
                        .get_machine_status(&GetMachineStatusRequest {
                            machine: machine.clone(),
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
                            metrics.machine_step(MachineStep::Drain, &machine, self.node, self.class, took);
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
                                &machine,
                                EventType::Warning,
                                "DeleteFailed",
                                &format!(
                                    "MachineClass {:?} not found: the VM cannot be deleted without it",
                                    machine.spec.class.name
                                ),
                            )
                            .await;
                        return Ok(Some(self.settings.retry.await_change_resync));
                    };
                    let result = self
                        .driver
                        .delete_machine(&DeleteMachineRequest {
                            machine: machine.clone(),
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
                        (gone, self.metrics, &machine.metadata.deletion_timestamp)
                    {
                        let took = crate::metrics::elapsed(deleted.0, jiff::Timestamp::now());
                        metrics.machine_step(MachineStep::Delete, &machine, self.node, Some(class), took);
                    }
                    StepOutcome::DeleteVm(result)
                }
                DeletionAction::DeleteNode { node } => StepOutcome::DeleteNode(self.delete_node(node).await),
                DeletionAction::RemoveFinalizer => {
                    let result = self.remove_finalizer(&machine).await;
                    if result.is_ok() {
                        let node = machine.node_name().unwrap_or_default();
                        tracing::info!(machine = %name, node = %node, "machine deleted");
                    }
                    StepOutcome::RemoveFinalizer(result.map_err(|e| e.to_string()))
                }
            };
            crash_point!(step plan.step, &name);
            let after = deletion::after(&self.input(&machine, &pass), &outcome);
            let failed = after.retry.is_some()
                || after
                    .write
                    .as_ref()
                    .is_some_and(|w| w.description.state() == mcm_api::MachineState::Failed);
            self.memory.set_failures(&name, failed);
            if let Some(node) = &after.node_label {
                machine = self.label_node(&machine, node).await?;
                crash_point!(DeletionNodeLabel, &name);
            }
            if let Some(write) = &after.write {
                machine = self.write(&machine, write).await?;
                crash_point!(DeletionNextStepWrite, &name);
            }
            match (after.next, after.requeue_after) {
                (None, _) => {
                    self.memory.forget(&name);
                    return Ok(None);
                }
                (Some(_), Some(Duration::ZERO)) => {}
                (Some(_), requeue) => return Ok(requeue),
            }
        }
        Ok(Some(Duration::ZERO))
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

    /// Writes the status when it changes something, with an Event for a new description. Returns the machine as
    /// written (or as it was).
    async fn write(&self, machine: &Machine, write: &DeletionWrite) -> Result<Machine, kube::Error> {
        if !write.status.changes(machine.status.as_ref()) {
            return Ok(machine.clone());
        }
        let written = self
            .machines
            .patch_status(
                &machine.name_any(),
                &PatchParams::default(),
                &Patch::Merge(write.status.merge_patch()),
            )
            .await?;
        (self.wrote)(machine.resource_version(), written.resource_version().as_deref());
        let previous = machine
            .status
            .as_ref()
            .map(|s| s.last_operation.description.as_str());
        let text = write.description.to_string();
        if previous != Some(text.as_str()) {
            let kind = if write.description.state() == mcm_api::MachineState::Failed {
                EventType::Warning
            } else {
                EventType::Normal
            };
            self.recorder
                .record(machine, kind, write.description.reason(), &text)
                .await;
        }
        Ok(written)
    }

    async fn label_node(&self, machine: &Machine, node: &str) -> Result<Machine, kube::Error> {
        let written = self
            .machines
            .patch(
                &machine.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { keys::labels::NODE: node } } })),
            )
            .await?;
        (self.wrote)(machine.resource_version(), written.resource_version().as_deref());
        Ok(written)
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
        let current = match api.get_opt(node).await {
            Ok(Some(current)) => current,
            Ok(None) => return NodeDeletion::NotFound,
            Err(err) => return NodeDeletion::Failed(err.to_string()),
        };
        if let Some(patch) =
            mcm_core::finalizers::patch(&current.metadata, keys::finalizers::NODE, FinalizerChange::Remove)
            && let Err(err) = api
                .patch(node, &PatchParams::default(), &Patch::Merge(patch))
                .await
        {
            return NodeDeletion::Failed(format!("removing the node finalizer: {err}"));
        }
        crash_point!(DeletionNodeFinalizer, node);
        match api.delete(node, &DeleteParams::default()).await {
            Ok(_) => NodeDeletion::Deleted,
            Err(kube::Error::Api(status)) if status.code == 404 => NodeDeletion::NotFound,
            Err(err) => NodeDeletion::Failed(err.to_string()),
        }
    }

    async fn remove_finalizer(&self, machine: &Machine) -> Result<(), kube::Error> {
        let Some(patch) = mcm_core::finalizers::patch(
            &machine.metadata,
            keys::finalizers::MACHINE_CONTROLLER_MANAGER,
            FinalizerChange::Remove,
        ) else {
            return Ok(());
        };
        match self
            .machines
            .patch(&machine.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(err),
        }
    }
}
