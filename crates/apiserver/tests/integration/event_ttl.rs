//! Events expire after `Config::event_ttl` (`--event-ttl`, 1h by default as kube-apiserver's): both kinds of
//! Event, each gone once it has not been written for the TTL, with a DELETED watch event; other objects stay.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::{
    core::v1::{Event, Secret},
    events::v1::Event as NewEvent,
};
use kube::api::{ListParams, PostParams};
use serde_json::json;
use support::{TestServer, eventually, meta};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_both_kinds_expire_after_the_event_ttl_and_other_objects_stay() {
    let t = TestServer::start_with(|config| config.event_ttl = Duration::from_secs(5)).await;
    let now = jiff::Timestamp::now().to_string();
    let events: kube::Api<Event> = t.api();
    let new_events: kube::Api<NewEvent> = t.api();
    let secrets: kube::Api<Secret> = t.api();
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "m1.created"},
        "involvedObject": {"kind": "Machine", "name": "m1", "namespace": "default"},
        "reason": "Created", "message": "created", "type": "Normal",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }))
    .unwrap();
    events.create(&PostParams::default(), &event).await.unwrap();
    let new_event: NewEvent = serde_json::from_value(json!({
        "metadata": {"name": "m1.drained"},
        "eventTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        "reportingController": "mcm", "reportingInstance": "mcm-1",
        "action": "Drain", "reason": "Drained", "type": "Normal",
        "regarding": {"kind": "Machine", "name": "m1", "namespace": "default"},
    }))
    .unwrap();
    new_events
        .create(&PostParams::default(), &new_event)
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: meta("kept", &[]),
                ..Secret::default()
            },
        )
        .await
        .unwrap();

    // Written just now: both are kept until the TTL has passed.
    assert!(events.get_opt("m1.created").await.unwrap().is_some());
    assert!(new_events.get_opt("m1.drained").await.unwrap().is_some());
    eventually("both events expired", async || {
        let left = events.list(&ListParams::default()).await.ok()?.items.len()
            + new_events.list(&ListParams::default()).await.ok()?.items.len();
        (left == 0).then_some(())
    })
    .await;
    assert!(
        secrets.get_opt("kept").await.unwrap().is_some(),
        "only events expire"
    );
}
