//! Wiring of the machine controller: the machine watch, the class, secret and node watches that reconcile the
//! machines using them, and the context every reconcile shares.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Runs the machine controller on the process's shared `caches` (its Machines and Nodes) until `shutdown` resolves.
/// `extras` are what `mcm run` adds (metrics, the reachability freeze, the orphan collection); `Extras::default()`
/// runs the controller alone.
#[allow(clippy::too_many_lines)] // the wiring of the watches reads best in one place
pub async fn run(
    control: Client,
    target: Option<Client>,
    driver: Arc<dyn Driver>,
    config: Config,
    caches: crate::shared_cache::Caches,
    extras: Extras,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let Extras {
        metrics,
        freeze,
        orphans,
        node_deletion,
    } = extras;
    let namespace = config.namespace.clone();
    // The machine queue's triggers are metered (the work queue metrics).
    let meter = crate::metrics::Metrics::reconcile_meter(metrics.as_ref(), "machine");
    let machines = caches.machines.store();
    let controller =
        Controller::for_shared_stream(meter.shared_triggers(caches.machines.applied()), machines.clone());
    if let Some(metrics) = &metrics {
        metrics.attach_machines(&caches.machines);
    }

    // Each watch's failures are seen (and /readyz fails while one keeps failing); Secrets are decoded one at a time,
    // so that one bad Secret cannot stop the namespace (crate::secrets).
    let health = |kind| {
        let health = crate::watch_health::WatchHealth::new(kind);
        health.register(metrics.as_deref());
        health
    };
    let (classes, class_writer) = reflector::store::<MachineClass>();
    let class_health = health("MachineClass");
    let class_stream = watcher(
        Api::<MachineClass>::namespaced(control.clone(), &namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .inspect(move |item| class_health.observe(item))
    .reflect(class_writer)
    .applied_objects();
    let (secrets, secret_writer) = reflector::store::<Secret>();
    let undecodable = crate::secrets::Undecodable::default();
    let secret_health = health("Secret");
    let secret_stream = crate::secrets::watch(control.clone(), &namespace, undecodable.clone())
        .default_backoff()
        .inspect(move |item| secret_health.observe(item))
        .reflect(secret_writer)
        .applied_objects();

    let by_class = {
        let machines = machines.clone();
        move |class: MachineClass| {
            let name = class.name_any();
            machines
                .state()
                .into_iter()
                .filter(|m| m.spec.class.name == name)
                .map(|m| ObjectRef::from_obj(&*m))
                .collect::<Vec<_>>()
        }
    };
    let by_secret = {
        let machines = machines.clone();
        let classes = classes.clone();
        move |secret: Secret| {
            let name = secret.name_any();
            let using: Vec<String> = classes
                .state()
                .iter()
                .filter(|c| {
                    [&c.secret_ref, &c.credentials_secret_ref]
                        .into_iter()
                        .any(|r| r.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str()))
                })
                .map(|c| c.name_any())
                .collect();
            machines
                .state()
                .into_iter()
                .filter(|m| using.contains(&m.spec.class.name))
                .map(|m| ObjectRef::from_obj(&*m))
                .collect::<Vec<_>>()
        }
    };
    let mut controller = controller
        .watches_stream(class_stream, meter.mapper(by_class))
        .watches_stream(secret_stream, meter.mapper(by_secret));

    let node_index = NodeIndex::default();
    let nodes = caches.nodes.as_ref().filter(|_| target.is_some());
    if let Some(nodes) = nodes {
        let machines = machines.clone();
        let index = node_index.clone();
        let namespace = namespace.clone();
        let by_node = move |node: Arc<Node>| {
            let name = node.name_any();
            let indexed = index
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&name)
                .cloned();
            // The machine whose `node` label names the node, the machine the node's label names, and the machine
            // named as the node: looked up, never scanned for.
            let mut candidates: Vec<String> = indexed.into_iter().collect();
            candidates.extend(node.label(keys::labels::NODE_MACHINE_NAME).map(str::to_owned));
            candidates.push(name);
            candidates.sort();
            candidates.dedup();
            candidates
                .into_iter()
                .map(|machine| ObjectRef::<Machine>::new(&machine).within(&namespace))
                .filter(|reference| machines.get(reference).is_some())
                .collect::<Vec<_>>()
        };
        controller = controller.watches_shared_stream(nodes.applied(), meter.mapper(by_node));
    }

    let context = Arc::new(Context {
        recorder: Recorder::new(control.clone(), "machine-controller"),
        control,
        target,
        driver,
        machines,
        classes,
        secrets,
        undecodable,
        nodes: nodes.map(crate::shared_cache::SharedCache::store),
        nodes_synced: nodes.map(crate::shared_cache::SharedCache::readiness),
        memory: MachineMemory::default(),
        remediation: tokio::sync::Mutex::default(),
        replaced: std::sync::Mutex::default(),
        deletions: crate::deletion::DeletionMemory::default(),
        freeze,
        orphans,
        config: config.clone(),
        metrics: metrics.clone(),
        node_index,
        preserve_drains: crate::drain::DrainTrackers::default(),
        in_place_drains: crate::drain::DrainTrackers::default(),
    });
    let shutdown = shutdown.boxed().shared();
    let node_deletion = match (node_deletion, &context.target, nodes) {
        (Some(config), Some(target), Some(_)) => {
            let (control, target, caches, shutdown) = (
                context.control.clone(),
                target.clone(),
                caches.clone(),
                shutdown.clone(),
            );
            async move { crate::node_deletion::run_on(control, target, config, &caches, shutdown).await }
                .boxed()
        }
        _ => futures::future::ready(()).boxed(),
    };
    let synced = caches.machines.readiness();
    let work = controller
        .with_config(kube::runtime::controller::Config::default().concurrency(config.concurrency))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            meter.reconcile(crate::logging::traced(crate::logging::Kind::Machine, reconcile)),
            meter.error_policy(error_policy),
            context,
        )
        .for_each(|result| {
            meter.outcome(&result);
            async move {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "machine reconcile ended with an error");
                }
            }
        });
    tokio::join!(
        crate::cache::until_stopped(work, move || synced.get(), shutdown),
        node_deletion
    );
}

#[allow(clippy::needless_pass_by_value)] // the signature is kube-runtime's
fn error_policy(machine: Arc<Machine>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(machine = %machine.name_any(), error = %error, "machine reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}
