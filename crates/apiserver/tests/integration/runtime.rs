//! kube-runtime against the server: a `watcher` feeding a `reflector` store converges to the server's
//! objects, and a `Controller` reconciles every Machine, again after each change, as controllers built on
//! this server rely on.

use crate::support;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt as _;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
    runtime::{
        Controller, WatchStreamExt as _,
        controller::Action,
        reflector::{self, Store, reflector},
        watcher,
    },
};
use mcm_api::Machine;
use pretty_assertions::assert_eq;
use serde_json::json;
use support::{TestServer, create_all, eventually, machine, within};

/// name -> resourceVersion.
type Versions = BTreeMap<String, String>;

fn versions<'a>(machines: impl IntoIterator<Item = &'a Machine>) -> Versions {
    machines
        .into_iter()
        .map(|m| (m.name_any(), m.resource_version().unwrap_or_default()))
        .collect()
}

async fn server_versions(api: &Api<Machine>) -> Versions {
    versions(&api.list(&ListParams::default()).await.unwrap().items)
}

fn store_versions(store: &Store<Machine>) -> Versions {
    versions(store.state().iter().map(AsRef::as_ref))
}

// An informer's cache (kube-runtime reflector) is kept by list then watch: after any sequence of changes it
// converges to exactly what the server holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reflector_store_converges_to_the_servers_objects() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    create_all(&machines, (0..10).map(|i| machine(&format!("m{i:02}"), &[]))).await;

    let (reader, writer) = reflector::store::<Machine>();
    let informer = reflector(writer, watcher(machines.clone(), watcher::Config::default()))
        .default_backoff()
        .for_each(|_| async {});
    let informer = tokio::spawn(informer);
    within("the store's initial list", reader.wait_until_ready())
        .await
        .unwrap();

    create_all(&machines, (10..20).map(|i| machine(&format!("m{i:02}"), &[]))).await;
    for i in [0, 3, 9, 12, 19] {
        machines
            .delete(&format!("m{i:02}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    let expected = server_versions(&machines).await;
    assert_eq!(expected.len(), 15);
    eventually("the store to hold the server's 15 machines", || {
        let now = store_versions(&reader);
        let done = now == expected;
        async move { done.then_some(()) }
    })
    .await;

    machines
        .patch(
            "m05",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "seen": "yes" } } })),
        )
        .await
        .unwrap();
    let expected = server_versions(&machines).await;
    eventually("the store to see the change", || {
        let done = store_versions(&reader) == expected;
        async move { done.then_some(()) }
    })
    .await;
    let m05 = reader
        .state()
        .into_iter()
        .find(|m| m.name_any() == "m05")
        .unwrap();
    assert_eq!(m05.labels().get("seen").map(String::as_str), Some("yes"));
    informer.abort();
}

/// name -> (reconciles, labels at the last one).
type Reconciles = HashMap<String, (usize, BTreeMap<String, String>)>;

#[derive(Default)]
struct Seen {
    reconciles: Mutex<Reconciles>,
}

impl Seen {
    fn snapshot(&self) -> Reconciles {
        self.reconciles.lock().unwrap().clone()
    }
}

async fn reconcile(machine: Arc<Machine>, seen: Arc<Seen>) -> Result<Action, kube::Error> {
    let mut reconciles = seen.reconciles.lock().unwrap();
    let entry = reconciles.entry(machine.name_any()).or_default();
    entry.0 += 1;
    entry.1 = machine.labels().clone();
    Ok(Action::await_change())
}

fn error_policy(_: Arc<Machine>, _: &kube::Error, _: Arc<Seen>) -> Action {
    Action::requeue(Duration::from_millis(100))
}

// kube-runtime Controller: reconciliation is level-triggered; every object is reconciled when the controller
// starts and again whenever it changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_reconciles_every_machine_and_again_after_a_change() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    let all: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    create_all(&machines, all.iter().map(|n| machine(n, &[]))).await;

    let seen = Arc::new(Seen::default());
    let controller = Controller::new(machines.clone(), watcher::Config::default())
        .run(reconcile, error_policy, Arc::clone(&seen))
        .for_each(|_| async {});
    let controller = tokio::spawn(controller);

    let first = eventually("every machine reconciled once", || {
        let now = seen.snapshot();
        let done = all
            .iter()
            .all(|n| now.get(n).is_some_and(|(count, _)| *count >= 1));
        async move { done.then_some(now) }
    })
    .await;
    let mut reconciled: Vec<&String> = first.keys().collect();
    reconciled.sort();
    assert_eq!(reconciled, all.iter().collect::<Vec<_>>(), "only the machines");

    for name in &all {
        machines
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "changed": "yes" } } })),
            )
            .await
            .unwrap();
    }
    eventually("every machine reconciled again with its new label", || {
        let now = seen.snapshot();
        let done = all.iter().all(|n| {
            now.get(n).is_some_and(|(count, labels)| {
                *count > first[n].0 && labels.get("changed").map(String::as_str) == Some("yes")
            })
        });
        async move { done.then_some(()) }
    })
    .await;
    controller.abort();
}
