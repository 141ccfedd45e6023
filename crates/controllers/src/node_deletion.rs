//! Deleting a Node deletes its Machine (reference v0.61+; docs/node-deletion.md). Watches the target cluster's
//! Nodes and the control cluster's Machines, asks `mcm_core::node_deletion` what a node being deleted (or a node
//! delete event) comes to, and acts: deletes the Machine (its deletion flow then drains, deletes the VM and the
//! Node, and its MachineSet replaces it) with a `TriggeredByNodeDeletion` Event, or removes our finalizer from a deleting node
//! that no machine names.
//!
//! Nodes being deleted are reconciled (their `deletionTimestamp` is on the object, so a restarted controller sees
//! them again); a node deleted outright (without our finalizer) is acted on from its delete event, as the
//! reference's delete handler does.

use std::{future::Future, sync::Arc, time::Duration};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    runtime::{
        Controller,
        controller::Action,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use mcm_api::Machine;
use mcm_core::node_deletion::{self, NodeDeletionDecision, NodeSeen};
use tokio::sync::mpsc;

pub use crate::Error;

/// How the node deletion controller runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The namespace of the machines (`--namespace`).
    pub namespace: String,
    /// How soon a failed action is tried again (`--machine-retry-backoff-base`, the reference's ShortRetry 5s).
    pub retry: Duration,
    /// How often a node whose machine is being deleted is looked at again without a change
    /// (`--machine-safety-resync`).
    pub resync: Duration,
}

/// How soon a node whose finalizer write met a newer version (409) is looked at again, should no event come.
const CONFLICT_RETRY: Duration = Duration::from_secs(1);

/// How soon a reconcile looks again while the machine cache has not synced.
const CACHE_WAIT: Duration = Duration::from_millis(100);

struct Context {
    control: Client,
    target: Client,
    config: Config,
    machines: Store<Machine>,
    /// Whether the shared machine cache has synced (never ask the store itself: `crate::shared_cache`).
    machines_synced: crate::shared_cache::Synced,
    /// The machines by the node their `node` label names (the decisions read only those of the node at hand).
    by_node: crate::owners::OwnerIndex,
    nodes: Store<Node>,
    recorder: crate::events::Recorder,
    /// Nodes deleted outright, handled by [`handle_gone`]; a failed attempt is sent here again after the retry.
    gone: mpsc::UnboundedSender<Node>,
}

/// Runs the node deletion controller on watches of its own of the Machines and Nodes until `shutdown` resolves.
/// `mcm run` uses [`run_on`] instead, on the caches every controller of the process shares.
pub async fn run(
    control: Client,
    target: Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let shutdown = shutdown.boxed().shared();
    let caches = crate::shared_cache::Caches::start(
        &control,
        Some(&target),
        &config.namespace,
        None,
        shutdown.clone(),
    );
    run_on(control, target, config, &caches, shutdown).await;
}

/// Runs the node deletion controller on the shared caches of the Machines and Nodes until `shutdown` resolves: a
/// node being deleted is reconciled, a node deleted outright goes to [`handle_gone`]; live nodes' changes
/// (heartbeats) ask for nothing. A machine's change (deleted, its deletion started, its node label set) looks again
/// at its node if that node is being deleted.
pub async fn run_on(
    control: Client,
    target: Client,
    config: Config,
    caches: &crate::shared_cache::Caches,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let machines = caches.machines.clone();
    let Some(nodes) = caches.nodes.clone() else {
        return;
    };
    let (gone_tx, gone_rx) = mpsc::unbounded_channel::<Node>();
    let gone_seen = gone_tx.clone();
    let deleting = nodes.events().filter_map(move |event| {
        futures::future::ready(match event {
            watcher::Event::Apply(node) | watcher::Event::InitApply(node)
                if node.metadata.deletion_timestamp.is_some() =>
            {
                Some(node)
            }
            watcher::Event::Delete(node) => {
                let _ = gone_seen.send((*node).clone());
                None
            }
            _ => None,
        })
    });
    let node_view = nodes.store();
    let controller = Controller::for_shared_stream(deleting, nodes.store()).watches_shared_stream(
        machines.objects(),
        move |machine: Arc<Machine>| {
            let node = machine.labels().get(mcm_api::keys::labels::NODE)?.clone();
            let reference = ObjectRef::<Node>::new(&node);
            node_view
                .get(&reference)
                .filter(|n| n.metadata.deletion_timestamp.is_some())
                .map(|_| reference)
        },
    );
    drive(
        control,
        target,
        config,
        (machines, nodes, caches.by_node.clone()),
        controller,
        (gone_rx, gone_tx),
        shutdown.boxed().shared(),
    )
    .await;
}

/// Runs `controller` (nodes being deleted) and the handling of nodes deleted outright until `shutdown` resolves.
async fn drive(
    control: Client,
    target: Client,
    config: Config,
    (machines, nodes, by_node): (
        crate::shared_cache::SharedCache<Machine>,
        crate::shared_cache::SharedCache<Node>,
        crate::owners::OwnerIndex,
    ),
    controller: Controller<Node>,
    (mut gone_rx, gone_tx): (mpsc::UnboundedReceiver<Node>, mpsc::UnboundedSender<Node>),
    shutdown: futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
) {
    let context = Arc::new(Context {
        recorder: crate::events::Recorder::new(control.clone(), "machine-controller"),
        control,
        target,
        config,
        machines: machines.store(),
        machines_synced: machines.readiness(),
        by_node,
        nodes: nodes.store(),
        gone: gone_tx,
    });
    let work = controller
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, context.clone())
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "node deletion reconcile ended with an error");
            }
        });
    let gone = {
        let context = context.clone();
        async move {
            while let Some(node) = gone_rx.recv().await {
                handle_gone(&node, &context).await;
            }
        }
    };
    let gone = futures::future::select(Box::pin(gone), shutdown.clone());
    tokio::join!(
        crate::cache::until_stopped(work, move || nodes.synced(), shutdown),
        gone
    );
}

impl Context {
    /// The machines whose `node` label names `node`: all the decisions look at, found without a scan.
    fn machines_of(&self, node: &str) -> Vec<Arc<Machine>> {
        if node.is_empty() {
            return Vec::new();
        }
        self.by_node
            .machines(&self.machines, &self.config.namespace, node, false)
    }
}

#[allow(clippy::needless_pass_by_value)] // the signature is kube-runtime's
fn error_policy(node: Arc<Node>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(node = %node.name_any(), error = %error, "node deletion reconcile failed; retrying");
    Action::requeue(ctx.config.retry)
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.machines_synced.get() {
        // No machine seen yet is not no machine: a finalizer removed now could be one still needed.
        return Ok(Action::requeue(CACHE_WAIT));
    }
    let machines = ctx.machines_of(&node.name_any());
    let decision = node_deletion::decide(NodeSeen::Present(&node), machines.iter().map(|m| &**m));
    let name = node.name_any();
    match decision {
        NodeDeletionDecision::NotDeleting | NodeDeletionDecision::NoMachine => Ok(Action::await_change()),
        NodeDeletionDecision::DeleteMachine { machine } => {
            delete_machine(&name, &machine, &ctx).await?;
            Ok(Action::requeue(ctx.config.resync))
        }
        NodeDeletionDecision::MachineDeleting { machine } => {
            tracing::debug!(node = %name, %machine, "node being deleted: its machine's deletion is under way");
            Ok(Action::requeue(ctx.config.resync))
        }
        NodeDeletionDecision::RemoveFinalizer { patch } => {
            let api: Api<Node> = Api::all(ctx.target.clone());
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(Action::requeue(CONFLICT_RETRY)),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(Action::await_change()),
                Err(err) => Err(err.into()),
                Ok(_) => {
                    tracing::info!(node = %name, "node being deleted has no machine: removed our finalizer");
                    Ok(Action::await_change())
                }
            }
        }
        NodeDeletionDecision::Ambiguous { machines } => {
            tracing::warn!(node = %name, ?machines, "node being deleted is named by several machines; deleting none");
            Ok(Action::requeue(ctx.config.resync))
        }
    }
}

/// Deletes `machine` and records the Event on it. Read fresh first: a machine already being deleted (a cache not
/// yet showing our earlier delete, a user's) is left alone, so the Event is recorded once; the delete is guarded by
/// that version's uid, so a machine of the same name made since is not deleted. A machine already gone counts as
/// done.
async fn delete_machine(node: &str, machine: &str, ctx: &Context) -> Result<(), Error> {
    let api: Api<Machine> = Api::namespaced(ctx.control.clone(), &ctx.config.namespace);
    let Some(current) = api.get_opt(machine).await? else {
        return Ok(());
    };
    if current.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: current.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(machine, &params).await {
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
            tracing::debug!(%node, %machine, "machine already gone or replaced");
            return Ok(());
        }
        result => result?,
    };
    tracing::info!(%node, %machine, "node deleted: deleting the machine backing it");
    ctx.recorder
        .record(
            &current,
            crate::events::EventType::Normal,
            node_deletion::EVENT_REASON,
            &node_deletion::event_message(node),
        )
        .await;
    Ok(())
}

/// A node deleted outright (a delete event): its machine is deleted as for a node being deleted. Decided once the
/// machine cache has synced; a failed attempt is tried again after the retry while the node has not come back.
async fn handle_gone(node: &Node, ctx: &Context) {
    let name = node.name_any();
    let delay = if ctx.machines_synced.get() {
        let decision = {
            let machines = ctx.machines_of(&name);
            node_deletion::decide(NodeSeen::Gone(node), machines.iter().map(|m| &**m))
        };
        let NodeDeletionDecision::DeleteMachine { machine } = decision else {
            return;
        };
        if ctx.nodes.get(&ObjectRef::new(&name)).is_some() {
            // A node of that name registered again since: it is not gone any more.
            return;
        }
        match delete_machine(&name, &machine, ctx).await {
            Ok(()) => return,
            Err(err) => {
                tracing::warn!(node = %name, %machine, error = %err, "deleting the machine of a deleted node failed; retrying");
                ctx.config.retry
            }
        }
    } else {
        CACHE_WAIT
    };
    let again = ctx.gone.clone();
    let node = node.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let _ = again.send(node);
    });
}
