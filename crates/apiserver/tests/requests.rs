//! Requests are counted per client identity, verb and resource, readable in process and, for the admin only,
//! at `GET /debug/requests`.

mod support;

use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::Machine;
use mcm_apiserver::requests::RequestKey;
use serde_json::json;
use support::{TestServer, machine, send_raw};

fn key(verb: &str, resource: &str) -> RequestKey {
    RequestKey {
        user: "admin".into(),
        verb: verb.into(),
        resource: resource.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_per_user_verb_and_resource() {
    let t = TestServer::start().await;
    t.server().requests().reset();
    let machines: Api<Machine> = t.api();
    machines
        .create(&PostParams::default(), &machine("m1", &[]))
        .await
        .unwrap();
    machines
        .create(&PostParams::default(), &machine("m2", &[]))
        .await
        .unwrap();
    let status = json!({ "status": { "currentStatus": { "phase": "Pending" } } });
    machines
        .patch_status("m1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    machines.list(&ListParams::default()).await.unwrap();

    let counts = t.server().requests().snapshot();
    assert_eq!(
        counts.get(&key("create", "machines.machine.sapcloud.io")),
        Some(&2)
    );
    assert_eq!(
        counts.get(&key("patch", "machines.machine.sapcloud.io/status")),
        Some(&1)
    );
    assert_eq!(counts.get(&key("list", "machines.machine.sapcloud.io")), Some(&1));
    assert_eq!(
        t.server().requests().writes_by("admin"),
        3,
        "reads are not writes"
    );

    let (code, body) = send_raw(
        &t.client,
        http::Request::get("/debug/requests").body(Vec::new()).unwrap(),
    )
    .await;
    assert_eq!(code, http::StatusCode::OK);
    let creates = body
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["verb"] == "create" && r["resource"] == "machines.machine.sapcloud.io")
        .expect("the create counter");
    assert_eq!(
        (creates["user"].as_str(), creates["count"].as_u64()),
        (Some("admin"), Some(2))
    );
}
