//! Finalizers on what machines depend on (reference §3.7): a MachineClass keeps
//! `machine.sapcloud.io/machine-controller-manager` while a machine uses it, and a Secret keeps
//! `machine.sapcloud.io/machine-controller` while a class refers to it, so that neither can vanish from under a
//! machine that still needs it to be deleted. The decisions are `mcm_core::finalizers`; this module watches and
//! patches.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::{FutureExt, StreamExt};
use k8s_openapi::{Resource as _, api::core::v1::Secret};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use mcm_api::{Machine, MachineClass, MetaExt, keys};
use mcm_core::finalizers;

pub use crate::Error;

struct Context {
    client: Client,
    namespace: String,
    uses: ClassUses,
    classes: Store<MachineClass>,
    resync: Duration,
    /// The secrets, for the class pass: a class whose secret does not exist gets a Warning Event.
    secrets: Option<Store<Secret>>,
    recorder: crate::events::Recorder,
    /// The classes warned about.
    warned: crate::invalid::Warned,
}

/// Which machines use which MachineClass (machines naming a class of kind `MachineClass`), fed the machine watch:
/// a class pass asks whether its class is used in O(1) instead of scanning every machine, and only the events that
/// change a class's users (a machine added, deleted or moved to another class) ask for a pass at all. Status
/// changes, most of a machine's events, ask for nothing (they asked for a pass of O(N) each: docs/benchmarks.md).
#[derive(Clone, Debug, Default)]
struct ClassUses(Arc<Mutex<Uses>>);

#[derive(Debug, Default)]
struct Uses {
    /// Machine name → the class it uses.
    class_of: HashMap<String, String>,
    /// Class → how many machines use it (derived from `class_of`).
    users: HashMap<String, usize>,
    /// The picture a relist is building (machine name → class).
    relisting: Option<HashMap<String, String>>,
    /// A first list has completed.
    synced: bool,
}

impl Uses {
    fn add(&mut self, machine: String, class: String) {
        *self.users.entry(class.clone()).or_default() += 1;
        self.class_of.insert(machine, class);
    }

    /// Forgets `machine`'s use; returns the class it used.
    fn remove(&mut self, machine: &str) -> Option<String> {
        let class = self.class_of.remove(machine)?;
        if let Some(n) = self.users.get_mut(&class) {
            *n -= 1;
            if *n == 0 {
                self.users.remove(&class);
            }
        }
        Some(class)
    }
}

impl ClassUses {
    /// Applies one watch event; returns the classes whose users changed.
    fn observe(&self, event: &crate::shared_cache::SharedEvent<Machine>) -> Vec<String> {
        fn used_class(machine: &Machine) -> Option<(String, String)> {
            let name = machine.metadata.name.clone()?;
            (machine.spec.class.kind == MachineClass::KIND).then(|| (name, machine.spec.class.name.clone()))
        }
        let mut uses = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut changed = Vec::new();
        match event {
            watcher::Event::Apply(machine) => {
                let name = machine.metadata.name.clone().unwrap_or_default();
                let new = used_class(machine);
                if uses.class_of.get(&name) != new.as_ref().map(|(_, class)| class) {
                    changed.extend(uses.remove(&name));
                    if let Some((name, class)) = new {
                        changed.push(class.clone());
                        uses.add(name, class);
                    }
                }
            }
            watcher::Event::Delete(machine) => {
                let name = machine.metadata.name.clone().unwrap_or_default();
                changed.extend(uses.remove(&name));
            }
            watcher::Event::Init => uses.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(machine) => {
                if let Some((name, class)) = used_class(machine) {
                    uses.relisting.get_or_insert_default().insert(name, class);
                }
            }
            watcher::Event::InitDone => {
                let fresh = uses.relisting.take().unwrap_or_default();
                let old = std::mem::replace(&mut uses.class_of, fresh);
                let mut counts: HashMap<String, usize> = HashMap::new();
                for class in uses.class_of.values() {
                    *counts.entry(class.clone()).or_default() += 1;
                }
                uses.users = counts;
                let mut classes: Vec<String> =
                    old.into_values().chain(uses.class_of.values().cloned()).collect();
                classes.sort();
                classes.dedup();
                changed = classes;
                uses.synced = true;
            }
        }
        changed
    }

    /// Whether a machine uses `class`.
    fn used(&self, class: &str) -> bool {
        let uses = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        uses.users.get(class).is_some_and(|n| *n > 0)
    }

    /// Whether the machines have been listed once.
    fn synced(&self) -> bool {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).synced
    }
}

/// Runs the class and secret finalizer controllers of `namespace`, following the machines of the process's shared
/// cache, until `shutdown` resolves. `resync` is how often
/// each object is looked at again without a change (the reference: 10 minutes). With `metrics`, the reconciles of
/// both controllers are metered (`machineclass`, `secret`); `None` runs them alone.
#[allow(clippy::too_many_lines)] // the wiring of the watches reads best in one place
pub async fn run(
    client: Client,
    namespace: String,
    caches: crate::shared_cache::Caches,
    resync: Duration,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let shutdown = shutdown.boxed().shared();
    let uses = ClassUses::default();
    // The classes whose users changed, as stand-in machines naming them (what the class controller maps from).
    let class_changes = caches.machines.events().flat_map({
        let uses = uses.clone();
        move |event| {
            let classes = uses.observe(&event);
            futures::stream::iter(classes.into_iter().map(|class| {
                // kube-runtime names the object that triggered a pass: the stand-in takes the class's name.
                let mut machine = Machine::default();
                machine.metadata.name = Some(class.clone());
                MachineClass::KIND.clone_into(&mut machine.spec.class.kind);
                machine.spec.class.name = class;
                Ok(machine)
            }))
        }
    });
    let class_api = Api::<MachineClass>::namespaced(client.clone(), &namespace);
    // Both queues' triggers are metered (the work queue metrics): each controller is built on its own watch.
    let class_meter = crate::metrics::Metrics::reconcile_meter(metrics.as_ref(), "machineclass");
    let secret_meter = crate::metrics::Metrics::reconcile_meter(metrics.as_ref(), "secret");
    let (class_store, class_store_writer) = reflector::store::<MachineClass>();
    let class_controller = Controller::for_stream(
        class_meter.triggers(
            reflector::reflector(class_store_writer, watcher(class_api, watcher::Config::default()))
                .applied_objects(),
        ),
        class_store,
    );
    // Secrets decoded one at a time (crate::secrets): one that cannot be decoded is still seen, by its metadata,
    // and cannot stop the others.
    let (secrets, secret_writer) = reflector::store::<Secret>();
    let secret_objects =
        crate::secrets::watch(client.clone(), &namespace, crate::secrets::Undecodable::default())
            .default_backoff()
            .reflect(secret_writer)
            .applied_objects();
    let secret_controller = Controller::for_stream(secret_meter.triggers(secret_objects), secrets.clone());
    let context = Arc::new(Context {
        client: client.clone(),
        namespace: namespace.clone(),
        uses,
        classes: class_controller.store(),
        resync,
        secrets: Some(secrets.clone()),
        recorder: crate::events::Recorder::new(client.clone(), "machineclass-controller"),
        warned: crate::invalid::Warned::default(),
    });

    let class_namespace = namespace.clone();
    let classes_done = class_controller
        .watches_stream(
            class_changes,
            class_meter.mapper(move |machine: Machine| {
                (machine.spec.class.kind == MachineClass::KIND)
                    .then(|| ObjectRef::new(&machine.spec.class.name).within(&class_namespace))
            }),
        )
        .graceful_shutdown_on(shutdown.clone())
        .run(
            class_meter.reconcile(crate::logging::traced(
                crate::logging::Kind::MachineClass,
                reconcile_class,
            )),
            class_meter.error_policy(error_policy::<MachineClass>),
            context.clone(),
        )
        .for_each(|result| {
            class_meter.outcome(&result);
            async {}
        });
    let classes_done = crate::cache::until_stopped(
        classes_done,
        || crate::cache::synced(&context.classes),
        shutdown.clone(),
    );

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
    let secret_store = secrets.clone();
    let secret_namespace = namespace.clone();
    let secrets_done = secret_controller
        .watches_stream(
            class_stream,
            secret_meter.mapper(move |class: MachineClass| {
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
                        .filter(|s| s.has_finalizer(keys::finalizers::SECRET))
                        .map(|s| ObjectRef::from_obj(&**s)),
                );
                refs
            }),
        )
        .graceful_shutdown_on(shutdown.clone())
        .run(
            secret_meter.reconcile(crate::logging::traced(
                crate::logging::Kind::Secret,
                reconcile_secret,
            )),
            secret_meter.error_policy(error_policy::<Secret>),
            Arc::new(Context {
                recorder: crate::events::Recorder::new(client.clone(), "machineclass-controller"),
                client,
                namespace,
                uses: context.uses.clone(),
                classes: class_view,
                resync,
                secrets: None,
                warned: crate::invalid::Warned::default(),
            }),
        )
        .for_each(|result| {
            secret_meter.outcome(&result);
            async {}
        });
    let secrets_done =
        crate::cache::until_stopped(secrets_done, || crate::cache::synced(&secret_store), shutdown);
    tokio::join!(classes_done, secrets_done);
}

#[allow(clippy::needless_pass_by_value)] // the signature is kube-runtime's
fn error_policy<K: Resource>(object: Arc<K>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(name = %object.meta().name.as_deref().unwrap_or_default(), error = %error, "finalizer reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile_class(class: Arc<MachineClass>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.uses.synced() {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    let change = finalizers::class_finalizer_by_use(&class, ctx.uses.used(&class.name_any()));
    if let Some(patch) = finalizers::patch(
        &class.metadata,
        keys::finalizers::MACHINE_CONTROLLER_MANAGER,
        change,
    ) {
        let api: Api<MachineClass> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
        api.patch(&class.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        tracing::info!(class = %class.name_any(), ?change, "machine class finalizer");
    }
    Ok(check_secrets(&class, &ctx)
        .await
        .unwrap_or(Action::requeue(ctx.resync)))
}

/// How long a new class's secret may take to show up before the class is warned about: they arrive on different
/// watches, often applied together.
const SECRET_ARRIVAL_GRACE: Duration = Duration::from_secs(5);

/// Warns once (an Event on the class) about each set of secret references whose Secret does not exist; `Some` when
/// the class is to be looked at again sooner than the resync.
async fn check_secrets(class: &MachineClass, ctx: &Context) -> Option<Action> {
    let secrets = ctx.secrets.as_ref()?;
    if !crate::cache::synced(secrets) {
        return Some(Action::requeue(Duration::from_millis(100)));
    }
    let missing = mcm_core::validity::missing_secrets(class, &ctx.namespace, |namespace, name| {
        secrets.get(&ObjectRef::new(name).within(namespace)).is_some()
    });
    if missing.is_empty() {
        ctx.warned.forget(class);
        return None;
    }
    let age = class
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(SECRET_ARRIVAL_GRACE, |t| {
            jiff::Timestamp::now().duration_since(t.0).unsigned_abs()
        });
    if age < SECRET_ARRIVAL_GRACE {
        return Some(Action::requeue(SECRET_ARRIVAL_GRACE.saturating_sub(age)));
    }
    let message = mcm_core::Description::SecretNotFound { missing }.to_string();
    ctx.warned
        .warn_once(
            &ctx.recorder,
            class,
            None,
            mcm_core::validity::SECRET_NOT_FOUND,
            &message,
            &message,
        )
        .await;
    None
}

async fn reconcile_secret(secret: Arc<Secret>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !crate::cache::synced(&ctx.classes) {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    let classes = ctx.classes.state();
    let classes: Vec<&MachineClass> = classes.iter().map(|c| &**c).collect();
    let change = finalizers::secret_finalizer(&secret, &classes);
    if let Some(patch) = finalizers::patch(&secret.metadata, keys::finalizers::SECRET, change) {
        let namespace = secret.namespace().unwrap_or_else(|| ctx.namespace.clone());
        // As a dynamic object: the answer holds the Secret's data, which may not decode as a Secret.
        let api: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), &namespace, &ApiResource::erase::<Secret>(&()));
        api.patch(&secret.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        tracing::info!(secret = %secret.name_any(), ?change, "secret finalizer");
    }
    Ok(Action::requeue(ctx.resync))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(name: &str, class: &str) -> Machine {
        mcm_api::builders::MachineBuilder::new(name).class(class).build()
    }

    #[test]
    fn only_changes_of_a_class_s_users_ask_for_a_class_pass() {
        let uses = ClassUses::default();
        assert!(!uses.synced());
        assert_eq!(
            uses.observe(&crate::shared_cache::shared_event(watcher::Event::Init)),
            Vec::<String>::new()
        );
        assert_eq!(
            uses.observe(&crate::shared_cache::shared_event(watcher::Event::InitApply(
                machine("m1", "a")
            ))),
            Vec::<String>::new()
        );
        assert_eq!(
            uses.observe(&crate::shared_cache::shared_event(watcher::Event::InitDone)),
            ["a"]
        );
        assert!(uses.synced() && uses.used("a") && !uses.used("b"));
        // A status change of a machine: nothing to look at.
        let mut running = machine("m1", "a");
        running.status = Some(mcm_api::MachineStatus::default());
        assert_eq!(
            uses.observe(&crate::shared_cache::shared_event(watcher::Event::Apply(running))),
            Vec::<String>::new()
        );
        // A new machine, a machine moved to another class, a deletion.
        assert_eq!(
            uses.observe(&crate::shared_cache::shared_event(watcher::Event::Apply(
                machine("m2", "a")
            ))),
            ["a"]
        );
        assert_eq!(
            uses.observe(&crate::shared_cache::shared_event(watcher::Event::Apply(
                machine("m2", "b")
            ))),
            ["a", "b"]
        );
        assert!(uses.used("a") && uses.used("b"));
        assert_eq!(
            uses.observe(&crate::shared_cache::shared_event(watcher::Event::Delete(
                machine("m1", "a")
            ))),
            ["a"]
        );
        assert!(!uses.used("a") && uses.used("b"));
        // A machine naming a class of another kind uses no MachineClass.
        let mut other = machine("m3", "c");
        other.spec.class.kind = "AWSMachineClass".into();
        assert_eq!(
            uses.observe(&crate::shared_cache::shared_event(watcher::Event::Apply(other))),
            Vec::<String>::new()
        );
        assert!(!uses.used("c"));
    }

    #[test]
    fn a_relist_reports_the_classes_of_machines_gone_meanwhile() {
        let uses = ClassUses::default();
        uses.observe(&crate::shared_cache::shared_event(watcher::Event::Apply(
            machine("gone", "a"),
        )));
        uses.observe(&crate::shared_cache::shared_event(watcher::Event::Init));
        uses.observe(&crate::shared_cache::shared_event(watcher::Event::InitApply(
            machine("kept", "b"),
        )));
        assert_eq!(
            uses.observe(&crate::shared_cache::shared_event(watcher::Event::InitDone)),
            ["a", "b"]
        );
        assert!(!uses.used("a") && uses.used("b"));
    }
}
