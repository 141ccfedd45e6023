//! Restarts with the same data directory: objects, resourceVersions, the kubeconfig (CA, token, port) and the
//! watch log survive; in-memory mode keeps nothing.

use crate::support;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
};
use mcm_api::{Machine, MachineClass};
use pretty_assertions::assert_eq;
use serde_json::json;
use support::{
    TestServer, client_from, create_all, expect_status, machine, machine_class, meta, names, rv, within,
};

/// An event as (type, name, resourceVersion).
type Seen = (&'static str, String, u64);

/// The next `n` events other than bookmarks, each within the deadline, with their objects.
async fn next_objects<S>(stream: &mut S, n: usize) -> Vec<(&'static str, Machine)>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<Machine>>> + Unpin,
{
    let mut seen = Vec::new();
    while seen.len() < n {
        let event = within("a watch event", stream.try_next())
            .await
            .expect("a watch event, not an error")
            .expect("the watch goes on");
        seen.push(match event {
            WatchEvent::Added(m) => ("ADDED", m),
            WatchEvent::Modified(m) => ("MODIFIED", m),
            WatchEvent::Deleted(m) => ("DELETED", m),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(status) => panic!("unexpected error event: {status:?}"),
        });
    }
    seen
}

async fn next_events<S>(stream: &mut S, n: usize) -> Vec<Seen>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<Machine>>> + Unpin,
{
    next_objects(stream, n)
        .await
        .into_iter()
        .map(|(kind, m)| (kind, m.name_any(), rv(&m)))
        .collect()
}

// Storage is durable like kube-apiserver's etcd: acknowledged writes survive a restart, and resourceVersions
// keep growing across it (watches and optimistic concurrency depend on never reusing one). The kubeconfig
// stays valid: same CA, token and port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_and_resource_versions_survive_a_restart_and_the_kubeconfig_keeps_working() {
    let mut t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    create_all(&machines, [machine("a", &[("x", "1")]), machine("b", &[])]).await;
    machines
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "currentStatus": { "phase": "Running" } } })),
        )
        .await
        .unwrap();
    machines.delete("b", &DeleteParams::default()).await.unwrap();
    let classes: Api<MachineClass> = t.api();
    classes
        .create(&PostParams::default(), &machine_class("small"))
        .await
        .unwrap();
    let secrets: Api<Secret> = t.api();
    let secret = Secret {
        metadata: meta("creds", &[]),
        string_data: Some([("k".to_owned(), "v".to_owned())].into()),
        ..Secret::default()
    };
    secrets.create(&PostParams::default(), &secret).await.unwrap();

    let machines_before = machines.list(&ListParams::default()).await.unwrap();
    let classes_before = classes.list(&ListParams::default()).await.unwrap().items;
    let secrets_before = secrets.list(&ListParams::default()).await.unwrap().items;
    let rv_before_restart: u64 = machines_before
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    let kubeconfig = t.kubeconfig();
    let kubeconfig_bytes = std::fs::read(&kubeconfig).unwrap();
    let url = t.server().url().to_owned();
    let client_before = client_from(&kubeconfig).await;

    t.restart().await;

    assert_eq!(t.server().url(), url, "the same port");
    assert_eq!(
        std::fs::read(&kubeconfig).unwrap(),
        kubeconfig_bytes,
        "the same kubeconfig"
    );
    let machines: Api<Machine> = t.api();
    let machines_after = machines.list(&ListParams::default()).await.unwrap();
    assert_eq!(machines_after.items, machines_before.items);
    assert_eq!(names(machines_after.items.iter().cloned()), ["a"]);
    assert_eq!(
        machines_after.items[0].phase(),
        Some(mcm_api::MachinePhase::Running)
    );
    assert_eq!(
        t.api::<MachineClass>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
        classes_before
    );
    assert_eq!(
        t.api::<Secret>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
        secrets_before
    );
    expect_status(machines.get("b").await, 404, "NotFound");
    let rv_after_restart: u64 = machines_after.metadata.resource_version.unwrap().parse().unwrap();
    assert_eq!(
        rv_after_restart, rv_before_restart,
        "nothing was written by the restart itself"
    );

    let next = machines
        .create(&PostParams::default(), &machine("c", &[]))
        .await
        .unwrap();
    assert!(
        rv(&next) > rv_before_restart,
        "{} after {rv_before_restart}",
        rv(&next)
    );

    // A client built before the restart keeps working, as does one built anew from the same file.
    let old: Api<Machine> = Api::namespaced(client_before, "default");
    assert_eq!(old.get("c").await.unwrap(), next);
    let fresh: Api<Machine> = Api::namespaced(client_from(&kubeconfig).await, "default");
    assert_eq!(
        names(fresh.list(&ListParams::default()).await.unwrap().items),
        ["a", "c"]
    );
}

// API concepts: a watch from a resourceVersion gets "all changes after the provided resource version",
// restarts of the server included: exactly the later changes, once each and in order (no lost, no repeated
// events).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_across_a_restart_with_exactly_the_later_changes() {
    let mut t = TestServer::start().await;
    let pp = PatchParams::default();
    let label = |v: &str| Patch::Merge(json!({ "metadata": { "labels": { "step": v } } }));
    let machines: Api<Machine> = t.api();
    create_all(&machines, [machine("a", &[]), machine("b", &[])]).await;
    let recorded = machines.patch("a", &pp, &label("1")).await.unwrap();
    let from = recorded.resource_version().unwrap();

    let mut expected = Vec::new();
    let c = machines
        .create(&PostParams::default(), &machine("c", &[]))
        .await
        .unwrap();
    expected.push(("ADDED", "c".to_owned(), rv(&c)));
    let b = machines.patch("b", &pp, &label("2")).await.unwrap();
    expected.push(("MODIFIED", "b".to_owned(), rv(&b)));
    machines.delete("a", &DeleteParams::default()).await.unwrap();
    let b2 = machines.patch("b", &pp, &label("3")).await.unwrap();
    // The deletion's resourceVersion lies between the two writes around it.
    expected.push(("DELETED", "a".to_owned(), rv(&b) + 1));
    expected.push(("MODIFIED", "b".to_owned(), rv(&b2)));
    assert_eq!(
        rv(&b2),
        rv(&b) + 2,
        "one counter: the deletion took the version in between"
    );

    t.restart().await;
    let machines: Api<Machine> = t.api();
    let mut stream = machines
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    let seen = next_events(&mut stream, 4).await;
    assert_eq!(seen, expected);

    // Nothing else was pending: the next event is the next write.
    let d = machines
        .create(&PostParams::default(), &machine("d", &[]))
        .await
        .unwrap();
    let seen = next_events(&mut stream, 1).await;
    assert_eq!(seen, [("ADDED", "d".to_owned(), rv(&d))]);
}

// A watch with a label selector resumed across a restart shows only objects that match the selector: an
// object that never matched is not reported, not even as DELETED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_watch_resumed_across_a_restart_reports_only_matching_objects() {
    let mut t = TestServer::start().await;
    let pp = PatchParams::default();
    let machines: Api<Machine> = t.api();
    create_all(
        &machines,
        [machine("plain", &[]), machine("web", &[("app", "web")])],
    )
    .await;
    let from = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let annotate = Patch::Merge(json!({ "metadata": { "annotations": { "n": "1" } } }));
    machines.patch("plain", &pp, &annotate).await.unwrap(); // never matches
    machines.patch("web", &pp, &annotate).await.unwrap(); // MODIFIED
    machines
        .patch(
            "web",
            &pp,
            &Patch::Merge(json!({ "metadata": { "labels": { "app": null } } })),
        )
        .await
        .unwrap(); // leaves: DELETED
    machines
        .patch(
            "plain",
            &pp,
            &Patch::Merge(json!({ "metadata": { "labels": { "app": "web" } } })),
        )
        .await
        .unwrap(); // joins: ADDED

    t.restart().await;
    let machines: Api<Machine> = t.api();
    let mut stream = machines
        .watch(&WatchParams::default().labels("app=web"), &from)
        .await
        .unwrap()
        .boxed();
    let seen = next_objects(&mut stream, 3).await;
    let kinds: Vec<(&str, String)> = seen.iter().map(|(k, m)| (*k, m.name_any())).collect();
    assert_eq!(
        kinds,
        [
            ("MODIFIED", "web".to_owned()),
            ("DELETED", "web".to_owned()),
            ("ADDED", "plain".to_owned())
        ]
    );
    let app = |m: &Machine| m.labels().get("app").cloned();
    assert_eq!(app(&seen[1].1), Some("web".into()), "the last state that matched");
    assert_eq!(app(&seen[2].1), Some("web".into()));
}

// In-memory mode keeps objects for the life of the process only; certificates and kubeconfig still go to the
// data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_mode_works_and_keeps_nothing_across_a_restart() {
    let mut t = TestServer::start_with(|c| c.in_memory = true).await;
    let machines: Api<Machine> = t.api();
    let created = machines
        .create(&PostParams::default(), &machine("m1", &[]))
        .await
        .unwrap();
    assert_eq!(machines.get("m1").await.unwrap(), created);
    let from = created.resource_version().unwrap();
    let mut stream = machines
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    machines.delete("m1", &DeleteParams::default()).await.unwrap();
    let seen = next_events(&mut stream, 1).await;
    assert_eq!((seen[0].0, seen[0].1.as_str()), ("DELETED", "m1"));
    machines
        .create(&PostParams::default(), &machine("m2", &[]))
        .await
        .unwrap();
    assert!(t.kubeconfig().exists());

    t.restart().await;
    let machines: Api<Machine> = t.api();
    assert!(
        machines
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    expect_status(machines.get("m2").await, 404, "NotFound");
    assert!(
        !t.data_dir().join(mcm_apiserver::server::STORE_FILE).exists(),
        "no store file in memory mode"
    );
    // The fresh store still serves: the default namespace exists again.
    machines
        .create(&PostParams::default(), &machine("m3", &[]))
        .await
        .unwrap();
}
