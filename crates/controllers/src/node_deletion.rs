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

use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
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
    nodes: Store<Node>,
    recorder: crate::events::Recorder,
    /// Nodes deleted outright, handled by [`handle_gone`]; a failed attempt is sent here again after the retry.
    gone: mpsc::UnboundedSender<Node>,
}

/// A node reduced to its metadata: all the decisions read.
fn node_metadata(node: &mut Node) {
    crate::cache::lean(node);
    node.spec = None;
    node.status = None;
}

/// Where the machine controller hands its node events when the node deletion controller runs on its caches
/// ([`run_on`]): a node being deleted (to reconcile) and a node deleted outright (to [`handle_gone`]).
#[derive(Clone, Debug)]
pub struct Inlet {
    deleting: mpsc::UnboundedSender<Node>,
    gone: mpsc::UnboundedSender<Node>,
}

/// The receiving end of an [`Inlet`], handed to [`run_on`].
#[derive(Debug)]
pub struct Outlet {
    deleting: mpsc::UnboundedReceiver<Node>,
    gone: mpsc::UnboundedReceiver<Node>,
    gone_again: mpsc::UnboundedSender<Node>,
}

/// A connected [`Inlet`] and [`Outlet`].
#[must_use]
pub fn channel() -> (Inlet, Outlet) {
    let (deleting_tx, deleting_rx) = mpsc::unbounded_channel();
    let (gone_tx, gone_rx) = mpsc::unbounded_channel();
    (
        Inlet {
            deleting: deleting_tx,
            gone: gone_tx.clone(),
        },
        Outlet {
            deleting: deleting_rx,
            gone: gone_rx,
            gone_again: gone_tx,
        },
    )
}

impl Inlet {
    /// Passes on what the node deletion controller acts on from one event of a node watch: a node being deleted, or
    /// a node deleted outright. Live nodes' changes (heartbeats) are not passed on.
    pub fn observe(&self, event: &watcher::Event<Node>) {
        match event {
            watcher::Event::Apply(node) | watcher::Event::InitApply(node)
                if node.metadata.deletion_timestamp.is_some() =>
            {
                let _ = self.deleting.send(node.clone());
            }
            watcher::Event::Delete(node) => {
                let _ = self.gone.send(node.clone());
            }
            _ => {}
        }
    }
}

/// Runs the node deletion controller on its own watches of the Machines and Nodes until `shutdown` resolves. `mcm
/// run` uses [`run_on`] instead, on the machine controller's caches (one watch of each kind, not two).
pub async fn run(
    control: Client,
    target: Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let shutdown = shutdown.boxed().shared();
    let (machines, machine_writer) = reflector::store::<Machine>();
    let machine_stream = watcher(
        Api::<Machine>::namespaced(control.clone(), &config.namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(crate::cache::machine_identity)
    .reflect(machine_writer)
    .touched_objects();
    let (nodes, node_writer) = reflector::store::<Node>();
    let (inlet, outlet) = channel();
    // Only nodes being deleted are reconciled: a heartbeat of a live node asks for nothing.
    let node_stream = watcher(Api::<Node>::all(target.clone()), watcher::Config::default())
        .default_backoff()
        .modify(node_metadata)
        // Nodes deleted outright go to `handle_gone`; nodes being deleted reach the controller through this stream
        // itself (the outlet's receiver of those is not used here).
        .inspect(move |event| {
            if let Ok(event) = event {
                inlet.observe(event);
            }
        })
        .reflect(node_writer)
        .applied_objects()
        .try_filter(|node| futures::future::ready(node.metadata.deletion_timestamp.is_some()));
    // A machine's change (deleted, its deletion started, its node label set) looks again at its node if that node
    // is being deleted.
    let node_view = nodes.clone();
    let controller = Controller::for_stream(node_stream, nodes.clone()).watches_stream(
        machine_stream,
        move |machine: Machine| {
            let node = machine.labels().get(mcm_api::keys::labels::NODE)?.clone();
            let reference = ObjectRef::<Node>::new(&node);
            node_view
                .get(&reference)
                .filter(|n| n.metadata.deletion_timestamp.is_some())
                .map(|_| reference)
        },
    );
    let Outlet { gone, gone_again, .. } = outlet;
    drive(
        control,
        target,
        config,
        (machines, nodes),
        controller,
        (gone, gone_again),
        shutdown,
    )
    .await;
}

/// Runs the node deletion controller on the machine controller's caches of the Machines and Nodes, fed through the
/// [`Inlet`] its node watch calls, until `shutdown` resolves. A change of a machine alone does not wake a node
/// being deleted: such a node is looked at again every `resync` while its machine's deletion is under way.
pub async fn run_on(
    control: Client,
    target: Client,
    config: Config,
    caches: (Store<Machine>, Store<Node>),
    outlet: Outlet,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let Outlet {
        mut deleting,
        gone,
        gone_again,
    } = outlet;
    let trigger = futures::stream::poll_fn(move |cx| deleting.poll_recv(cx)).map(Ok::<_, watcher::Error>);
    let controller = Controller::for_stream(trigger, caches.1.clone());
    drive(
        control,
        target,
        config,
        caches,
        controller,
        (gone, gone_again),
        shutdown.boxed().shared(),
    )
    .await;
}

/// Runs `controller` (nodes being deleted) and the handling of nodes deleted outright until `shutdown` resolves.
async fn drive(
    control: Client,
    target: Client,
    config: Config,
    (machines, nodes): (Store<Machine>, Store<Node>),
    controller: Controller<Node>,
    (mut gone_rx, gone_tx): (mpsc::UnboundedReceiver<Node>, mpsc::UnboundedSender<Node>),
    shutdown: futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
) {
    let context = Arc::new(Context {
        recorder: crate::events::Recorder::new(control.clone(), "machine-controller"),
        control,
        target,
        config,
        machines,
        nodes: nodes.clone(),
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
    tokio::join!(crate::cache::until_stopped(work, &nodes, shutdown), gone);
}

#[allow(clippy::needless_pass_by_value)] // the signature is kube-runtime's
fn error_policy(node: Arc<Node>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(node = %node.name_any(), error = %error, "node deletion reconcile failed; retrying");
    Action::requeue(ctx.config.retry)
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !crate::cache::synced(&ctx.machines) {
        // No machine seen yet is not no machine: a finalizer removed now could be one still needed.
        return Ok(Action::requeue(CACHE_WAIT));
    }
    let machines = ctx.machines.state();
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
    let delay = if crate::cache::synced(&ctx.machines) {
        let decision = {
            let machines = ctx.machines.state();
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
