//! The MachineDeployment controller's acts for an InPlaceUpdate rollout (decided by `mcm_core::rollout::in_place`):
//! observe the deployment's machines and their nodes, and perform the [`InPlaceAction`]s one by one. Every machine
//! patch carries the resourceVersion it was decided on (a conflict skips it until the next pass); node writes are
//! merge patches of only the fields changed.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{Resource as _, api::core::v1::Node};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
    runtime::reflector::{ObjectRef, Store},
};
use mcm_api::{
    InPlaceUpdateMachineDeployment, Machine, MachineClass, MachineDeployment, MachineSet, MetaExt, keys,
};
use mcm_core::in_place_target::Target;
use mcm_core::rollout::{
    self, Fenceposts, SetView,
    in_place::{
        self, InPlaceAction, InPlaceInput, InPlacePlan, MachineView, NodeView, Orchestration, Transfer,
    },
};
use serde_json::{Value, json};

use super::{Context, Error, merge_patches, record_scaled, scale_patch};

/// Why an InPlaceUpdate deployment is not rolled: the nodes are needed and there is no target cluster.
pub(super) const NO_TARGET: &str = "spec.strategy.type: in-place updates need the target cluster's nodes, and the \
                                    controller runs without a target cluster";

/// Observes and decides one in-place pass.
#[allow(clippy::too_many_arguments)] // the observations of the pass, each named
pub(super) fn decide(
    deployment: &MachineDeployment,
    fenceposts: Fenceposts,
    owned: &[&MachineSet],
    new: Option<&SetView>,
    old: &[SetView],
    machines_by_set: &BTreeMap<String, Vec<&Machine>>,
    nodes: &Store<Node>,
) -> InPlacePlan {
    let manual = deployment
        .spec
        .strategy
        .in_place_update
        .as_ref()
        .is_some_and(InPlaceUpdateMachineDeployment::is_manual);
    let orchestration = if manual {
        Orchestration::Manual
    } else {
        Orchestration::Auto
    };
    // Validation refuses an unusable maxSurge before a pass gets here (the deployment is held).
    let surge = rollout::in_place_surge(deployment).unwrap_or(0);
    let selectors: BTreeMap<String, BTreeMap<String, String>> = owned
        .iter()
        .map(|s| {
            let labels = s
                .spec
                .selector
                .as_ref()
                .and_then(|sel| sel.match_labels.clone())
                .unwrap_or_default();
            (s.name_any(), labels)
        })
        .collect();
    let machines: Vec<MachineView> = machines_by_set
        .iter()
        .flat_map(|(set, machines)| machines.iter().map(move |m| MachineView::of(m, set)))
        .collect();
    let node_views: BTreeMap<String, NodeView> = machines
        .iter()
        .filter_map(|m| m.node.as_deref())
        .filter_map(|name| {
            nodes
                .get(&ObjectRef::new(name))
                .map(|n| (name.to_owned(), NodeView::of(&n)))
        })
        .collect();
    in_place::decide(&InPlaceInput {
        replicas: deployment.spec.replicas,
        orchestration,
        fenceposts,
        surge,
        paused: deployment.spec.paused,
        new,
        old,
        selectors: &selectors,
        machines: &machines,
        nodes: &node_views,
        target_class: Some(&deployment.spec.template.spec.class.name),
    })
}

/// What acting came to.
#[derive(Debug, Default)]
pub(super) struct Acted {
    /// The nodes written (their marks wait for the next pass, which sees the writes).
    pub(super) nodes: BTreeSet<String>,
    /// Something was done or skipped: look again soon.
    pub(super) retry_soon: bool,
}

/// Whether a write failed because the object changed or went: decide again on the next pass.
fn changed_under(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404 || status.code == 409)
}

/// Performs the in-place acts in order.
pub(super) async fn act(
    deployment: &MachineDeployment,
    actions: &[InPlaceAction],
    owned: &[&MachineSet],
    fenceposts: Fenceposts,
    target: &Client,
    nodes: &Store<Node>,
    ctx: &Context,
) -> Result<Acted, Error> {
    let node_api: Api<Node> = Api::all(target.clone());
    let mut acted = Acted {
        retry_soon: !actions.is_empty(),
        ..Acted::default()
    };
    let name = deployment.name_any();
    // The target annotation, read once per pass when a node is to be marked.
    let mut target: Option<String> = None;
    for action in actions {
        match action {
            InPlaceAction::MarkCandidate { node } => {
                let Some(cached) = nodes.get(&ObjectRef::new(node)) else {
                    continue;
                };
                if target.is_none() {
                    target = Some(target_of(deployment, ctx).await?);
                }
                let target = target.as_deref().unwrap_or_default();
                if let Some(patch) = in_place::candidate_patch(&cached, target) {
                    tracing::info!(deployment = %name, node = %node, target, "marking the node a candidate for the in-place update");
                    write_node(&node_api, node, &patch, &mut acted).await?;
                }
            }
            InPlaceAction::Select { node } => {
                let Some(cached) = nodes.get(&ObjectRef::new(node)) else {
                    continue;
                };
                let key = keys::labels::SELECTED_FOR_UPDATE;
                if let Some(patch) = in_place::node_label_patch(&cached, key) {
                    tracing::info!(deployment = %name, node = %node, label = key, "labelling the node for the in-place update");
                    write_node(&node_api, node, &patch, &mut acted).await?;
                }
            }
            InPlaceAction::CleanNode { node } => {
                let Some(cached) = nodes.get(&ObjectRef::new(node)) else {
                    continue;
                };
                if let Some(patch) = in_place::clean_node_patch(&cached) {
                    tracing::info!(deployment = %name, node = %node, "in-place update done: cleaning and uncordoning the node");
                    write_node(&node_api, node, &patch, &mut acted).await?;
                }
            }
            InPlaceAction::CleanMachine {
                machine,
                resource_version,
            } => {
                let patch = in_place::clean_machine_patch(resource_version);
                match ctx
                    .machine_api()
                    .patch(machine, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {}
                    Err(err) if changed_under(&err) => {}
                    Err(err) => return Err(err.into()),
                }
            }
            InPlaceAction::Transfer(transfer) => {
                transfer_machines(
                    deployment, transfer, owned, fenceposts, &node_api, nodes, ctx, &mut acted,
                )
                .await?;
            }
            InPlaceAction::ReleaseNewSet { set } => {
                if let Some(set) = owned.iter().find(|s| s.name_any() == *set) {
                    release(set, ctx).await?;
                }
            }
            InPlaceAction::AwaitNewSet { set } => {
                if let Some(set) = owned.iter().find(|s| s.name_any() == *set) {
                    await_new_set(deployment, set, fenceposts, ctx).await?;
                }
            }
        }
    }
    Ok(acted)
}

/// The in-place target of the deployment's nodes: its template class and that class's `nodeTemplate` (none when the
/// class is missing: the node agent then refuses the update, naming what it lacks).
async fn target_of(deployment: &MachineDeployment, ctx: &Context) -> Result<String, Error> {
    let class = &deployment.spec.template.spec.class.name;
    let classes: Api<MachineClass> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let node_template = classes.get_opt(class).await?.and_then(|c| c.node_template);
    Ok(Target::new(class, node_template).annotation())
}

async fn write_node(api: &Api<Node>, node: &str, patch: &Value, acted: &mut Acted) -> Result<(), Error> {
    acted.nodes.insert(node.to_owned());
    match api
        .patch(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(err) if changed_under(&err) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// The set patch of a scale (replicas and annotations) with `more` merged in.
fn set_patch(deployment: &MachineDeployment, replicas: i32, fenceposts: Fenceposts, more: Value) -> Value {
    let mut patch = scale_patch(deployment, replicas, fenceposts);
    merge_patches(&mut patch, more);
    patch
}

/// Moves the machines of `transfer` to the new set (the order and its reasons: [`Transfer`]).
#[allow(clippy::too_many_arguments)] // the pass's context, each named
async fn transfer_machines(
    deployment: &MachineDeployment,
    transfer: &Transfer,
    owned: &[&MachineSet],
    fenceposts: Fenceposts,
    node_api: &Api<Node>,
    nodes: &Store<Node>,
    ctx: &Context,
    acted: &mut Acted,
) -> Result<(), Error> {
    let Some(new) = owned.iter().find(|s| s.name_any() == transfer.to) else {
        return Ok(());
    };
    let sets = ctx.set_api();
    let coming = i32::try_from(transfer.moves.len()).unwrap_or(i32::MAX);
    // 1. Room for the machines, and no creation while they come.
    let hold = set_patch(
        deployment,
        transfer.replicas + coming,
        fenceposts,
        json!({ "metadata": {
            "resourceVersion": new.resource_version(),
            "labels": { keys::labels::SCALE_UP_DISABLED: in_place::TRUE },
        } }),
    );
    match sets
        .patch(&transfer.to, &PatchParams::default(), &Patch::Merge(&hold))
        .await
    {
        Ok(_) => {}
        Err(err) if changed_under(&err) => return Ok(()),
        Err(err) => return Err(err.into()),
    }
    // 2. The machines, each guarded by its resourceVersion; 3. their nodes uncordoned.
    let uid = new.uid().unwrap_or_default();
    let mut lost: BTreeMap<&str, i32> = BTreeMap::new();
    for moved in &transfer.moves {
        let patch = in_place::move_patch(moved, &transfer.to, &uid);
        match ctx
            .machine_api()
            .patch(&moved.machine, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(deployment = %deployment.name_any(), machine = %moved.machine, from = %moved.from,
                    to = %transfer.to, "updated in place: machine moved to the new machine set");
                *lost.entry(moved.from.as_str()).or_default() += 1;
            }
            Err(err) if changed_under(&err) => continue,
            Err(err) => return Err(err.into()),
        }
        if let Some(node) = &moved.node
            && let Some(cached) = nodes.get(&ObjectRef::new(node))
            && let Some(patch) = in_place::uncordon_patch(&cached)
        {
            write_node(node_api, node, &patch, acted).await?;
        }
    }
    // 4. The new set's replicas count what came (when a move was skipped); it stays held, and the old sets keep
    // theirs, until the set controllers count the moves (`settle_transfer` in the next passes).
    let moved: i32 = lost.values().sum();
    let replicas = transfer.replicas + moved;
    if moved != coming {
        sets.patch(
            &transfer.to,
            &PatchParams::default(),
            &Patch::Merge(&set_patch(deployment, replicas, fenceposts, json!({}))),
        )
        .await?;
    }
    if moved > 0 {
        record_scaled(deployment, &transfer.to, "up", replicas, ctx).await;
    }
    Ok(())
}

/// Releases the new set held by a transfer, now that its status counts its replicas: the label goes, guarded by the
/// resourceVersion decided on (a set changed since is decided on again; the pass looks again soon after every
/// in-place act).
async fn release(set: &MachineSet, ctx: &Context) -> Result<(), Error> {
    let patch = json!({ "metadata": {
        "resourceVersion": set.resource_version(),
        "labels": { keys::labels::SCALE_UP_DISABLED: null },
    } });
    match ctx
        .set_api()
        .patch(&set.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            tracing::info!(set = %set.name_any(), "in-place transfer counted by the set: releasing the new machine set");
            Ok(())
        }
        Err(err) if changed_under(&err) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// The new set held by a transfer whose status does not count its replicas yet: its replicas come down to the
/// machines it controls as the API server lists them now (the cache may lag) when a transfer stopped midway; else
/// its controller has yet to see the moves, and the pass looks again soon.
async fn await_new_set(
    deployment: &MachineDeployment,
    set: &MachineSet,
    fenceposts: Fenceposts,
    ctx: &Context,
) -> Result<(), Error> {
    let uid = set.uid().unwrap_or_default();
    let selector = set
        .spec
        .selector
        .as_ref()
        .and_then(|s| s.match_labels.as_ref())
        .map(|labels| {
            labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let listed = ctx
        .machine_api()
        .list(&ListParams::default().labels(&selector))
        .await?;
    let count = listed.items.iter().filter(|m| m.is_controlled_by(&uid)).count();
    let replicas = i32::try_from(count).unwrap_or(i32::MAX);
    if replicas >= set.spec.replicas {
        return Ok(());
    }
    tracing::info!(deployment = %deployment.name_any(), set = %set.name_any(), replicas,
        "an in-place transfer stopped midway: the held new machine set comes down to the machines it controls");
    let patch = set_patch(
        deployment,
        replicas,
        fenceposts,
        json!({ "metadata": { "resourceVersion": set.resource_version() } }),
    );
    match ctx
        .set_api()
        .patch(&set.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(err) if changed_under(&err) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// The deployment of a node's machine, for the controller's node trigger: only nodes in an in-place update (an
/// in-place label or the `InPlaceUpdate` condition) wake their deployment, found through the node's
/// `node.gardener.cloud/machine-name` label, the machine's set and the set's owner.
pub(super) fn deployment_of_node(
    node: &Node,
    machines: &Store<Machine>,
    sets: &Store<MachineSet>,
    namespace: &str,
) -> Option<ObjectRef<MachineDeployment>> {
    let in_update = [
        keys::labels::CANDIDATE_FOR_UPDATE,
        keys::labels::SELECTED_FOR_UPDATE,
        keys::labels::UPDATE_RESULT,
    ]
    .iter()
    .any(|k| node.label(k).is_some())
        || mcm_core::in_place_update::reason_of(node).is_some();
    if !in_update {
        return None;
    }
    let machine =
        machines.get(&ObjectRef::new(node.label(keys::labels::NODE_MACHINE_NAME)?).within(namespace))?;
    let set = machine.controller_ref_of_kind(MachineSet::KIND)?;
    let set = sets.get(&ObjectRef::new(&set.name).within(namespace))?;
    set.controller_ref_of_kind(MachineDeployment::KIND)
        .map(|r| ObjectRef::new(&r.name).within(namespace))
}
