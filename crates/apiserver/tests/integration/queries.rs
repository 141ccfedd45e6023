//! Lists: label selectors, field selectors and paging with `limit` and `continue`, through `kube::Api::list`.

use crate::support;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::{Machine, builders::PodBuilder};
use pretty_assertions::assert_eq;
use serde_json::json;
use support::{TestServer, create_all, expect_status, machine, meta, names};

// Labels and Selectors: equality-based requirements: "Three kinds of operators are admitted =,==,!=";
// set-based: "Three kinds of operators are supported: in,notin and exists (only the key identifier)". != and
// notin also select objects without the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_selectors_select_exactly_the_matching_objects() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    create_all(
        &machines,
        [
            machine("a", &[("env", "prod"), ("tier", "web")]),
            machine("b", &[("env", "dev"), ("tier", "web")]),
            machine("c", &[("env", "prod")]),
            machine("d", &[]),
            machine("e", &[("env", "staging"), ("tier", "db")]),
        ],
    )
    .await;
    let cases: &[(&str, &[&str])] = &[
        ("", &["a", "b", "c", "d", "e"]),
        ("env=prod", &["a", "c"]),
        ("env==prod", &["a", "c"]),
        ("env!=prod", &["b", "d", "e"]),
        ("env in (prod,dev)", &["a", "b", "c"]),
        ("env notin (prod,dev)", &["d", "e"]),
        ("tier", &["a", "b", "e"]),
        ("!tier", &["c", "d"]),
        ("env=prod,tier", &["a"]),
        ("env in (prod),!tier", &["c"]),
        ("tier=web,env!=prod", &["b"]),
        ("env=absent", &[]),
    ];
    for (selector, expected) in cases {
        let list = machines
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap();
        assert_eq!(names(list.items), *expected, "labelSelector={selector:?}");
    }
    expect_status(
        machines.list(&ListParams::default().labels("env in prod")).await,
        400,
        "BadRequest",
    );
}

/// A pod of one container, scheduled on `node` if given.
fn pod(name: &str, node: Option<&str>) -> Pod {
    let pod = PodBuilder::new(name).container("main", "busybox");
    match node {
        Some(node) => pod.node(node),
        None => pod,
    }
    .build()
}

// Field selectors: "All resource types support the metadata.name and metadata.namespace fields. Using
// unsupported field selectors produces an error." (400); "You can use the =, ==, and != operators with field
// selectors"; pods add spec.nodeName and status.phase. A field that is not set compares as the empty string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_selectors_select_exactly_the_matching_pods_and_unsupported_fields_are_400() {
    let t = TestServer::start().await;
    let namespaces: Api<Namespace> = t.api_all();
    namespaces
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: meta("other", &[]),
                ..Namespace::default()
            },
        )
        .await
        .unwrap();
    let here: Api<Pod> = t.api();
    let there: Api<Pod> = Api::namespaced(t.client.clone(), "other");
    create_all(
        &here,
        [pod("p1", Some("n1")), pod("p2", Some("n2")), pod("p3", None)],
    )
    .await;
    create_all(&there, [pod("p4", Some("n1"))]).await;
    for (api, name) in [(&here, "p1"), (&there, "p4")] {
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Running" } })),
        )
        .await
        .unwrap();
    }
    let all: Api<Pod> = t.api_all();
    let cases: &[(&str, &[&str])] = &[
        ("metadata.name=p1", &["p1"]),
        ("metadata.name!=p1", &["p2", "p3", "p4"]),
        ("metadata.namespace=other", &["p4"]),
        ("metadata.namespace!=other", &["p1", "p2", "p3"]),
        ("spec.nodeName=n1", &["p1", "p4"]),
        ("spec.nodeName==n2", &["p2"]),
        ("spec.nodeName!=n1", &["p2", "p3"]),
        ("spec.nodeName=", &["p3"]),
        ("status.phase=Running", &["p1", "p4"]),
        ("status.phase!=Running", &["p2", "p3"]),
        ("status.phase=Pending,metadata.namespace=default", &["p2", "p3"]),
        (
            "spec.nodeName=n1,status.phase=Running,metadata.namespace=default",
            &["p1"],
        ),
        ("status.phase=Failed", &[]),
    ];
    for (selector, expected) in cases {
        let list = all.list(&ListParams::default().fields(selector)).await.unwrap();
        assert_eq!(names(list.items), *expected, "fieldSelector={selector:?}");
    }
    let in_default = here
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(
        names(in_default.items),
        ["p1"],
        "a namespaced list stays in its namespace"
    );

    let status = expect_status(
        all.list(&ListParams::default().fields("spec.hostname=x")).await,
        400,
        "BadRequest",
    );
    assert!(status.message.contains("spec.hostname"), "{}", status.message);
    let machines: Api<Machine> = t.api();
    expect_status(
        machines
            .list(&ListParams::default().fields("spec.nodeName=n1"))
            .await,
        400,
        "BadRequest",
    );
    expect_status(
        machines
            .list(&ListParams::default().fields("status.phase=Running"))
            .await,
        400,
        "BadRequest",
    );
}

// ListMeta: continue "may be set if the user set a limit on the number of items returned, and indicates that
// the server has more data available"; "remainingItemCount is the number of subsequent items in the list
// which are not included in this list response."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_and_continue_page_through_every_object_once() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    let all: Vec<String> = (0..25).map(|i| format!("m{i:02}")).collect();
    create_all(&machines, all.iter().map(|n| machine(n, &[]))).await;

    let mut seen = Vec::new();
    let mut remaining = Vec::new();
    let mut sizes = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(10);
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let page = machines.list(&params).await.unwrap();
        sizes.push(page.items.len());
        remaining.push(page.metadata.remaining_item_count);
        seen.extend(page.items.iter().map(ResourceExt::name_any));
        token = page.metadata.continue_.filter(|c| !c.is_empty());
        if token.is_none() {
            break;
        }
        assert!(sizes.len() < 5, "paging does not end");
    }
    assert_eq!(sizes, [10, 10, 5]);
    assert_eq!(remaining, [Some(15), Some(5), None]);
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no item twice: {seen:?}");
    assert_eq!(seen, all, "none missed, in name order");

    // With a selector, pages and counts cover the selected objects only.
    let page = machines
        .list(&ListParams::default().limit(2).fields("metadata.name!=m00"))
        .await
        .unwrap();
    assert_eq!(names(page.items), ["m01", "m02"]);
    assert_eq!(page.metadata.remaining_item_count, Some(22));
    expect_status(
        machines
            .list(&ListParams::default().limit(10).continue_token("garbage!"))
            .await,
        400,
        "BadRequest",
    );
}
