//! Objects the client cannot decode, stored as a real cluster can hold them (written by an old client or into etcd
//! directly; here straight into the embedded server's store, past its REST path): one bad Secret is reported by
//! name on the machines that use it while every other machine goes on, and a watch that keeps failing makes
//! `/readyz` fail, naming the kind and the error's class, never a value.

use crate::support;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Event;
use kube::api::PostParams;
use mcm_api::{Machine, MachinePhase};
use mcm_apiserver::store::Mutation;
use serde_json::{Value, json};
use support::{Cluster, NAMESPACE, description, settings, wait_for};

const USER_DATA_CANARY: &str = "plain-userdata-canary-4e1a";
const KEY_CANARY: &str = "AKIA-plain-text-canary-93d0";

/// The Secret `plain` as the reference AWS provider's sample writes it: `data` values that are not base64.
fn plain_text_secret() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "plain", "namespace": NAMESPACE, "uid": "u-plain",
                      "creationTimestamp": "2026-01-01T00:00:00Z" },
        "type": "Opaque",
        "data": {
            "userData": format!("#!/bin/bash\necho {USER_DATA_CANARY}"),
            "providerAccessKeyId": KEY_CANARY,
        },
    })
}

fn store(cluster: &Cluster, resource: &str, namespace: &str, name: &str, object: Value) {
    cluster
        .server()
        .store()
        .mutate(resource, namespace, name, |_| Ok(Mutation::Put(object)))
        .expect("stored as it is");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_that_cannot_be_decoded_is_reported_by_name_and_the_other_machines_go_on() {
    let mut cluster = Cluster::start_without_controller(settings()).await;
    cluster.create_class().await;
    store(&cluster, "/secrets", NAMESPACE, "plain", plain_text_secret());
    let class: mcm_api::MachineClass = serde_json::from_value(json!({
        "metadata": { "name": "plain" },
        "provider": "sim",
        "providerSpec": { "vmPool": "pool", "size": "small",
                          "tags": { "kubernetes.io/cluster/test": "1", "kubernetes.io/role/node": "1" } },
        "secretRef": { "name": "plain", "namespace": NAMESPACE }
    }))
    .unwrap();
    cluster
        .classes()
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let metrics = Arc::new(mcm_controllers::metrics::Metrics::new());
    cluster.start_controller_with_metrics(metrics.clone());

    cluster.create_machine("good").await;
    let bad: Machine = serde_json::from_value(json!({
        "metadata": { "name": "bad" },
        "spec": { "class": { "kind": "MachineClass", "name": "plain" } }
    }))
    .unwrap();
    cluster
        .machines()
        .create(&PostParams::default(), &bad)
        .await
        .unwrap();

    cluster.wait_phase("good", MachinePhase::Running).await;
    let bad = cluster
        .wait_machine("bad", "reported", |m| {
            description(m).contains("cannot be decoded")
        })
        .await;
    let text = description(&bad);
    assert_eq!(
        text,
        "Invalid machine or class: secretRef: Secret \"default/plain\" cannot be decoded: \
         data.providerAccessKeyId, data.userData: not valid base64"
    );
    assert!(bad.spec.provider_id.is_empty(), "nothing was created for it");
    let events: Vec<Event> = cluster.events_of("bad").await;
    assert!(
        events.iter().any(|e| e.type_.as_deref() == Some("Warning")
            && e.message
                .as_deref()
                .is_some_and(|m| m.contains("Secret \"default/plain\" cannot be decoded"))),
        "{events:?}"
    );
    let (ready, readyz) = metrics.readiness();
    assert!(ready, "one bad Secret does not fail a watch: {readyz}");
    assert!(readyz.contains("[+]watch-secret ok"), "{readyz}");
    for text in [format!("{bad:?}"), format!("{events:?}"), readyz] {
        assert!(
            !text.contains(USER_DATA_CANARY) && !text.contains(KEY_CANARY),
            "{text}"
        );
    }

    // Fixed (base64 values), the machine goes on too.
    let mut fixed = plain_text_secret();
    fixed["data"] = json!({ "userData": "IyEvYmluL3NoCmVjaG8gZml4ZWQK" });
    store(&cluster, "/secrets", NAMESPACE, "plain", fixed);
    cluster.wait_phase("bad", MachinePhase::Running).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_keeps_failing_fails_readyz_until_it_delivers_again() {
    let mut cluster = Cluster::start_without_controller(settings()).await;
    // A Node the client cannot decode (podCIDRs must be a list), there before the controller starts: every list of
    // the node watch fails. (One arriving on a running watch costs that watch one error and is skipped; the next
    // relist fails the same way.)
    store(
        &cluster,
        "/nodes",
        "",
        "undecodable",
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": "undecodable", "uid": "u-n", "creationTimestamp": "2026-01-01T00:00:00Z" },
            "spec": { "podCIDRs": "secret-looking-value-5f2c" },
        }),
    );
    let metrics = Arc::new(mcm_controllers::metrics::Metrics::new());
    cluster.start_controller_with_metrics(metrics.clone());
    let readyz = wait_for("readyz to fail", async || {
        let (ready, text) = metrics.readiness();
        (!ready && text.contains("[-]watch-node")).then_some(text)
    })
    .await;
    assert!(
        readyz.contains("[-]watch-node failed: the Node watch failed 3 times in a row: "),
        "{readyz}"
    );
    assert!(readyz.contains("could not be decoded"), "{readyz}");
    assert!(!readyz.contains("secret-looking-value"), "{readyz}");

    cluster
        .server()
        .store()
        .mutate("/nodes", "", "undecodable", |current| {
            Ok(Mutation::Delete(
                current.map(|c| (**c).clone()).unwrap_or_default(),
            ))
        })
        .unwrap();
    wait_for("readyz to pass again", async || {
        let (ready, text) = metrics.readiness();
        (ready && text.contains("[+]watch-node ok")).then_some(())
    })
    .await;
    cluster.stop().await;
}
