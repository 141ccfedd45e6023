//! Watches through `kube::Api::watch`: events in order from a list's resourceVersion, selector transitions,
//! bookmarks, and 410 Gone for a resourceVersion older than the retained window.

use crate::support;

use std::time::Duration;

use futures::{Stream, StreamExt as _, TryStreamExt as _};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
};
use mcm_api::Machine;
use pretty_assertions::assert_eq;
use serde_json::json;
use support::{TestServer, create_all, machine, rv, within};

/// An event as (type, name, resourceVersion, object).
type Seen = (&'static str, String, u64, Machine);

fn describe(event: WatchEvent<Machine>) -> Option<Seen> {
    let (kind, object) = match event {
        WatchEvent::Added(m) => ("ADDED", m),
        WatchEvent::Modified(m) => ("MODIFIED", m),
        WatchEvent::Deleted(m) => ("DELETED", m),
        WatchEvent::Bookmark(_) => return None,
        WatchEvent::Error(status) => panic!("unexpected error event: {status:?}"),
    };
    Some((kind, object.name_any(), rv(&object), object))
}

/// The next `n` events other than bookmarks, each within the deadline.
async fn next_events<S>(stream: &mut S, n: usize) -> Vec<Seen>
where
    S: Stream<Item = kube::Result<WatchEvent<Machine>>> + Unpin,
{
    let mut seen = Vec::new();
    while seen.len() < n {
        let event = within("a watch event", stream.try_next())
            .await
            .expect("a watch event, not an error")
            .expect("the watch goes on");
        seen.extend(describe(event));
    }
    seen
}

fn kinds_and_names(seen: &[Seen]) -> Vec<(&'static str, &str)> {
    seen.iter().map(|(k, n, ..)| (*k, n.as_str())).collect()
}

// API concepts, resource versions for watch: a resourceVersion other than 0 means "Start a watch at the exact
// resource version. The watch events are for all changes after the provided resource version." Each event
// carries the object at its resourceVersion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_list_resource_version_gets_added_modified_deleted_in_order() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    machines
        .create(&PostParams::default(), &machine("before", &[]))
        .await
        .unwrap();
    let list = machines.list(&ListParams::default()).await.unwrap();
    let from = list.metadata.resource_version.unwrap();
    let mut stream = machines
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();

    let created = machines
        .create(&PostParams::default(), &machine("m1", &[]))
        .await
        .unwrap();
    let modified = machines
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "a": "b" } } })),
        )
        .await
        .unwrap();
    machines.delete("m1", &DeleteParams::default()).await.unwrap();
    let other = machines
        .create(&PostParams::default(), &machine("m2", &[]))
        .await
        .unwrap();

    let seen = next_events(&mut stream, 4).await;
    assert_eq!(
        kinds_and_names(&seen),
        [
            ("ADDED", "m1"),
            ("MODIFIED", "m1"),
            ("DELETED", "m1"),
            ("ADDED", "m2")
        ],
        "the object listed before the watch is not replayed"
    );
    assert_eq!(seen[0].2, rv(&created));
    assert_eq!(seen[1].2, rv(&modified));
    assert!(seen[1].2 < seen[2].2 && seen[2].2 < seen[3].2, "{seen:?}");
    assert_eq!(seen[3].2, rv(&other));
}

// Watch from resourceVersion "0": "To establish initial state, the watch begins with synthetic "Added" events
// of all resources instances that exist at the starting resource version."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_resource_version_zero_starts_with_the_current_objects() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    create_all(&machines, [machine("a", &[]), machine("b", &[])]).await;
    machines.delete("a", &DeleteParams::default()).await.unwrap();
    let mut stream = machines
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    machines
        .create(&PostParams::default(), &machine("c", &[]))
        .await
        .unwrap();
    let seen = next_events(&mut stream, 2).await;
    assert_eq!(kinds_and_names(&seen), [("ADDED", "b"), ("ADDED", "c")]);
}

// A watch with a label selector sees the objects that match it, as kube-apiserver's watch cache filters: an
// object whose change makes it stop matching is DELETED (with its last matching state), one that starts to
// match is ADDED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_with_a_label_selector_turns_selector_transitions_into_added_and_deleted() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    create_all(&machines, [machine("a", &[("app", "web")]), machine("b", &[])]).await;
    let from = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = machines
        .watch(&WatchParams::default().labels("app=web"), &from)
        .await
        .unwrap()
        .boxed();

    let label =
        |value: serde_json::Value| Patch::Merge(json!({ "metadata": { "labels": { "app": value } } }));
    let pp = PatchParams::default();
    let left_rv = machines.patch("a", &pp, &label(json!(null))).await.unwrap(); // leaves: DELETED
    machines.patch("b", &pp, &label(json!("web"))).await.unwrap(); // joins: ADDED
    machines
        .patch(
            "b",
            &pp,
            &Patch::Merge(json!({ "metadata": { "annotations": { "n": "1" } } })),
        )
        .await
        .unwrap(); // stays: MODIFIED
    machines.patch("a", &pp, &label(json!("db"))).await.unwrap(); // never matches: nothing
    machines
        .create(&PostParams::default(), &machine("c", &[("app", "db")]))
        .await
        .unwrap(); // nothing
    machines.delete("b", &DeleteParams::default()).await.unwrap(); // DELETED
    machines
        .create(&PostParams::default(), &machine("d", &[("app", "web")]))
        .await
        .unwrap(); // ADDED

    let seen = next_events(&mut stream, 5).await;
    assert_eq!(
        kinds_and_names(&seen),
        [
            ("DELETED", "a"),
            ("ADDED", "b"),
            ("MODIFIED", "b"),
            ("DELETED", "b"),
            ("ADDED", "d")
        ]
    );
    assert!(seen.windows(2).all(|w| w[0].2 < w[1].2), "{seen:?}");
    // The DELETED of an object that left the selector carries its last state that matched, at the
    // resourceVersion of the change, as the watch cache sends it (so the object a client drops still matches
    // its selector).
    let (_, _, left_at, left) = &seen[0];
    assert_eq!(
        left.labels().get("app").map(String::as_str),
        Some("web"),
        "{left:?}"
    );
    assert_eq!(*left_at, rv(&left_rv), "the resourceVersion of the change");
    // One that joins the selector is ADDED with its new state.
    assert_eq!(seen[1].3.labels().get("app").map(String::as_str), Some("web"));
}

// API concepts, watch bookmarks: BOOKMARK "is a special kind of event to mark that all changes up to a given
// resourceVersion the client is requesting have already been sent"; sent only to watches that ask for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_arrive_when_asked() {
    let t = TestServer::start_with(|c| c.bookmark_interval = Duration::from_secs(1)).await;
    let machines: Api<Machine> = t.api();
    let created = machines
        .create(&PostParams::default(), &machine("m1", &[]))
        .await
        .unwrap();
    let asked = WatchParams {
        bookmarks: true,
        ..WatchParams::default()
    };
    let mut stream = machines
        .watch(&asked, &created.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    let second = machines
        .create(&PostParams::default(), &machine("m2", &[]))
        .await
        .unwrap();
    let mut added = Vec::new();
    let bookmark = within("a bookmark", async {
        loop {
            match stream.try_next().await.unwrap().expect("the watch goes on") {
                WatchEvent::Bookmark(bookmark) => break bookmark,
                WatchEvent::Added(m) => added.push(m.name_any()),
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await;
    assert_eq!(added, ["m2"]);
    let at: u64 = bookmark.metadata.resource_version.parse().unwrap();
    assert!(
        at >= rv(&second),
        "the bookmark is at {at}, after the last event {}",
        rv(&second)
    );

    // Not asked: a watch that times out after 2 s brings nothing, bookmark included.
    let not_asked = WatchParams::default().disable_bookmarks().timeout(2);
    let quiet: Vec<_> = within(
        "a watch that times out",
        machines
            .watch(&not_asked, &second.resource_version().unwrap())
            .await
            .unwrap()
            .collect::<Vec<_>>(),
    )
    .await;
    assert!(quiet.is_empty(), "{quiet:?}");
}

// API concepts: "When the requested watch operations fail because the historical version of that resource is
// not available, clients must handle the case by recognizing the status code 410 Gone"; a watch reports it as
// an ERROR event carrying the Status (reason Expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_resource_version_older_than_the_window_is_410_gone() {
    let t = TestServer::start_with(|c| c.watch_window = 5).await;
    let machines: Api<Machine> = t.api();
    let first = machines
        .create(&PostParams::default(), &machine("m0", &[]))
        .await
        .unwrap();
    let mut versions = Vec::new();
    for i in 1..=20 {
        let m = machines
            .create(&PostParams::default(), &machine(&format!("m{i}"), &[]))
            .await
            .unwrap();
        versions.push(rv(&m));
    }

    let mut stream = machines
        .watch(&WatchParams::default(), &first.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    let status = match within("the error event", stream.next()).await {
        Some(Ok(WatchEvent::Error(status)) | Err(kube::Error::Api(status))) => status,
        other => panic!("expected 410 Gone, got {other:?}"),
    };
    assert_eq!(
        (status.code, status.reason.as_str()),
        (410, "Expired"),
        "{status:?}"
    );
    assert!(
        status.message.contains("too old resource version"),
        "{}",
        status.message
    );

    // Within the window, the watch resumes: from the 16th write, the last four.
    let mut stream = machines
        .watch(&WatchParams::default(), &versions[15].to_string())
        .await
        .unwrap()
        .boxed();
    let seen = next_events(&mut stream, 4).await;
    assert_eq!(
        kinds_and_names(&seen),
        [
            ("ADDED", "m17"),
            ("ADDED", "m18"),
            ("ADDED", "m19"),
            ("ADDED", "m20")
        ]
    );
}
