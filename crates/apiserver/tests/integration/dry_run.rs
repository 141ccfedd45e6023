//! `dryRun=All` on create, update, patch and delete through the real `kube` client: every check and admission runs
//! (errors are the real write's), the answer is the object the write would make, and nothing is stored — the
//! store's resourceVersion does not move, the object reads as before, and no watch event is sent.

use crate::support;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
};
use mcm_api::Machine;
use pretty_assertions::assert_eq;
use serde_json::json;
use support::{TestServer, expect_status, machine, machine_class, meta, within};

fn dry_post() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

/// The resourceVersion of the whole store, as a list reports it.
async fn store_rv(api: &Api<Secret>) -> String {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_writes_answer_as_the_write_would_and_store_nothing() {
    let t = TestServer::start().await;
    let secrets: Api<Secret> = t.api();
    let before = store_rv(&secrets).await;
    let mut watch = secrets
        .watch(&WatchParams::default(), &before)
        .await
        .unwrap()
        .boxed();

    // Create: the object as it would be (uid, creationTimestamp, data from stringData), no resourceVersion.
    let secret = Secret {
        metadata: meta("boot", &[]),
        string_data: Some([("userData".to_owned(), "#!/bin/sh".to_owned())].into()),
        ..Secret::default()
    };
    let answered = secrets.create(&dry_post(), &secret).await.unwrap();
    assert!(answered.metadata.uid.is_some() && answered.metadata.creation_timestamp.is_some());
    assert_eq!(answered.metadata.resource_version, None);
    assert!(answered.data.as_ref().is_some_and(|d| d.contains_key("userData")));
    assert!(secrets.get_opt("boot").await.unwrap().is_none(), "not stored");
    assert_eq!(store_rv(&secrets).await, before, "no resourceVersion taken");

    // Update, patch, delete of a stored object: answered, not applied.
    let stored = secrets.create(&PostParams::default(), &secret).await.unwrap();
    let after_create = store_rv(&secrets).await;
    let mut changed = stored.clone();
    changed.metadata.labels = Some([("role".to_owned(), "worker".to_owned())].into());
    let replaced = secrets.replace("boot", &dry_post(), &changed).await.unwrap();
    assert_eq!(replaced.labels().get("role").map(String::as_str), Some("worker"));
    assert_eq!(
        replaced.metadata.resource_version,
        stored.metadata.resource_version
    );
    let patched = secrets
        .patch(
            "boot",
            &PatchParams::default().dry_run(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "a": "b" } } })),
        )
        .await
        .unwrap();
    assert_eq!(patched.annotations().get("a").map(String::as_str), Some("b"));
    let deleted = secrets
        .delete(
            "boot",
            &DeleteParams {
                dry_run: true,
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    assert!(
        deleted.is_right(),
        "answered as a completed deletion: {deleted:?}"
    );
    assert_eq!(
        secrets.get("boot").await.unwrap(),
        stored,
        "the object is as created"
    );
    assert_eq!(store_rv(&secrets).await, after_create, "no resourceVersion taken");

    // The only watch events are those of the real create: a later real write is the next one.
    secrets
        .patch(
            "boot",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "x": "y" } } })),
        )
        .await
        .unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        let event = within("watch events", watch.try_next())
            .await
            .unwrap()
            .expect("an event");
        kinds.push(match event {
            WatchEvent::Added(_) => "ADDED",
            WatchEvent::Modified(s) => {
                assert_eq!(
                    s.labels().get("x").map(String::as_str),
                    Some("y"),
                    "the real patch, not a dry run"
                );
                "MODIFIED"
            }
            WatchEvent::Deleted(_) => "DELETED",
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(err) => panic!("{err:?}"),
        });
    }
    assert_eq!(kinds, ["ADDED", "MODIFIED"]);
}

/// A dry run is refused as the write would be: admission (422 naming the field), an existing name (409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_is_refused_as_the_write_would_be() {
    let t = TestServer::start().await;
    let classes: Api<mcm_api::MachineClass> = t.api();
    classes
        .create(&PostParams::default(), &machine_class("small"))
        .await
        .unwrap();
    let machines: Api<Machine> = t.api();
    let mut bad = machine("m1", &[]);
    bad.spec.class.name = String::new();
    let status = expect_status(machines.create(&dry_post(), &bad).await, 422, "Invalid");
    assert!(status.message.contains("spec.class.name"), "{status:?}");
    let secrets: Api<Secret> = t.api();
    let secret = Secret {
        metadata: meta("s", &[]),
        ..Secret::default()
    };
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    expect_status(secrets.create(&dry_post(), &secret).await, 409, "AlreadyExists");
}

/// `dryRun` takes `All` only: another value is 422 naming the options kind and the field, as kube-apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_value_other_than_all_is_422() {
    let t = TestServer::start().await;
    let (code, status) = support::send_raw(
        &t.client,
        http::Request::post("/api/v1/namespaces/default/secrets?dryRun=Yes")
            .header("content-type", "application/json")
            .body(br#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"}}"#.to_vec())
            .unwrap(),
    )
    .await;
    assert_eq!(code.as_u16(), 422, "{status}");
    assert_eq!(status["details"]["kind"], "CreateOptions");
    assert_eq!(status["details"]["causes"][0]["field"], "dryRun");
    assert_eq!(
        status["details"]["causes"][0]["message"],
        "Unsupported value: \"Yes\": supported values: \"All\""
    );
    let secrets: Api<Secret> = t.api();
    assert!(secrets.get_opt("s").await.unwrap().is_none());
}
