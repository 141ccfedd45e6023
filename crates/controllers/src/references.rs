//! Finalizers on what machines depend on (reference §3.7): a MachineClass keeps
//! `machine.sapcloud.io/machine-controller-manager` while a machine uses it, and a Secret keeps
//! `machine.sapcloud.io/machine-controller` while a class refers to it, so that neither can vanish from under a
//! machine that still needs it to be deleted. The decisions are `mcm_core::finalizers`; this module watches and
//! patches.

use std::{future::Future, sync::Arc, time::Duration};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use mcm_api::{Machine, MachineClass, keys};
use mcm_core::finalizers;

pub use crate::Error;

struct Context {
    client: Client,
    namespace: String,
    machines: Store<Machine>,
    classes: Store<MachineClass>,
    resync: Duration,
}

/// Runs the class and secret finalizer controllers of `namespace` until `shutdown` resolves. `resync` is how often
/// each object is looked at again without a change (the reference: 10 minutes).
pub async fn run(
    client: Client,
    namespace: String,
    resync: Duration,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    run_with_metrics(client, namespace, resync, None, shutdown).await;
}

/// [`run`], the reconciles of both controllers metered (`machineclass`, `secret`).
pub async fn run_with_metrics(
    client: Client,
    namespace: String,
    resync: Duration,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let shutdown = shutdown.boxed().shared();
    let (machines, machine_writer) = reflector::store::<Machine>();
    let machine_stream = watcher(
        Api::<Machine>::namespaced(client.clone(), &namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(crate::cache::machine_identity)
    .reflect(machine_writer)
    .touched_objects();
    let class_api = Api::<MachineClass>::namespaced(client.clone(), &namespace);
    let class_controller = Controller::new(class_api, watcher::Config::default());
    let context = Arc::new(Context {
        client: client.clone(),
        namespace: namespace.clone(),
        machines,
        classes: class_controller.store(),
        resync,
    });

    let class_meter =
        crate::metrics::Metrics::reconcile_meter(metrics.as_ref(), "machineclass", &context.classes);
    let class_namespace = namespace.clone();
    let classes_done = class_controller
        .watches_stream(machine_stream, move |machine: Machine| {
            (machine.spec.class.kind == mcm_core::migration::MACHINE_CLASS_KIND)
                .then(|| ObjectRef::new(&machine.spec.class.name).within(&class_namespace))
        })
        .graceful_shutdown_on(shutdown.clone())
        .run(
            class_meter.reconcile(crate::logging::traced(
                crate::logging::Kind::MachineClass,
                reconcile_class,
            )),
            class_meter.error_policy(error_policy::<MachineClass>),
            context.clone(),
        )
        .for_each(|_| async {});
    let classes_done = crate::cache::until_stopped(classes_done, &context.classes, shutdown.clone());

    // Secrets are looked at when a class changes: those it refers to, and those we hold (a reference may just have
    // gone). Deleted classes count (touched, not only applied).
    let (class_view, class_writer) = reflector::store::<MachineClass>();
    let class_stream = watcher(
        Api::<MachineClass>::namespaced(client.clone(), &namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(class_writer)
    .touched_objects();
    let secret_controller = Controller::new(
        Api::<Secret>::namespaced(client.clone(), &namespace),
        watcher::Config::default(),
    );
    let secrets = secret_controller.store();
    let secret_store = secrets.clone();
    let secret_meter = crate::metrics::Metrics::reconcile_meter(metrics.as_ref(), "secret", &secrets);
    let secret_namespace = namespace.clone();
    let secrets_done = secret_controller
        .watches_stream(class_stream, move |class: MachineClass| {
            let mut refs: Vec<ObjectRef<Secret>> = [&class.secret_ref, &class.credentials_secret_ref]
                .into_iter()
                .flatten()
                .filter_map(|r| {
                    let namespace = r
                        .namespace
                        .clone()
                        .filter(|n| !n.is_empty())
                        .unwrap_or_else(|| secret_namespace.clone());
                    r.name
                        .as_ref()
                        .map(|name| ObjectRef::new(name).within(&namespace))
                })
                .collect();
            refs.extend(
                secrets
                    .state()
                    .iter()
                    .filter(|s| s.finalizers().iter().any(|f| f == keys::finalizers::SECRET))
                    .map(|s| ObjectRef::from_obj(&**s)),
            );
            refs
        })
        .graceful_shutdown_on(shutdown.clone())
        .run(
            secret_meter.reconcile(crate::logging::traced(
                crate::logging::Kind::Secret,
                reconcile_secret,
            )),
            secret_meter.error_policy(error_policy::<Secret>),
            Arc::new(Context {
                client,
                namespace,
                machines: context.machines.clone(),
                classes: class_view,
                resync,
            }),
        )
        .for_each(|_| async {});
    let secrets_done = crate::cache::until_stopped(secrets_done, &secret_store, shutdown);
    tokio::join!(classes_done, secrets_done);
}

#[allow(clippy::needless_pass_by_value)] // the signature is kube-runtime's
fn error_policy<K: Resource>(object: Arc<K>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(name = %object.meta().name.as_deref().unwrap_or_default(), error = %error, "finalizer reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile_class(class: Arc<MachineClass>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !crate::cache::synced(&ctx.machines) {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    let machines = ctx.machines.state();
    let machines: Vec<&Machine> = machines.iter().map(|m| &**m).collect();
    let change = finalizers::class_finalizer(&class, &machines);
    if let Some(patch) =
        crate::finalizer::patch(&*class, keys::finalizers::MACHINE_CONTROLLER_MANAGER, change)
    {
        let api: Api<MachineClass> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
        api.patch(&class.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        tracing::info!(class = %class.name_any(), ?change, "machine class finalizer");
    }
    Ok(Action::requeue(ctx.resync))
}

async fn reconcile_secret(secret: Arc<Secret>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !crate::cache::synced(&ctx.classes) {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    let classes = ctx.classes.state();
    let classes: Vec<&MachineClass> = classes.iter().map(|c| &**c).collect();
    let change = finalizers::secret_finalizer(&secret, &classes);
    if let Some(patch) = crate::finalizer::patch(&*secret, keys::finalizers::SECRET, change) {
        let namespace = secret.namespace().unwrap_or_else(|| ctx.namespace.clone());
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
        api.patch(&secret.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        tracing::info!(secret = %secret.name_any(), ?change, "secret finalizer");
    }
    Ok(Action::requeue(ctx.resync))
}
