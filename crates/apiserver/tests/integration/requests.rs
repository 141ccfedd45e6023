//! Requests are counted per client identity, verb and resource, readable in process and, for the admin only,
//! at `GET /debug/requests`.

use crate::support;

use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::Machine;
use mcm_apiserver::requests::RequestKey;
use serde_json::json;
use support::{TestServer, machine, send_raw};

fn key(verb: &str, resource: &str, name: &str) -> RequestKey {
    RequestKey {
        user: "admin".into(),
        verb: verb.into(),
        resource: resource.into(),
        namespace: "default".into(),
        name: name.into(),
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
        counts.get(&key("create", "machines.machine.sapcloud.io", "")),
        Some(&2)
    );
    assert_eq!(
        counts.get(&key("patch", "machines.machine.sapcloud.io/status", "m1")),
        Some(&1)
    );
    assert_eq!(
        counts.get(&key("list", "machines.machine.sapcloud.io", "")),
        Some(&1)
    );
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
    assert_eq!(
        (creates["namespace"].as_str(), creates["name"].as_str()),
        (Some("default"), Some(""))
    );
}

/// The namespace and the name are those RBAC sees: none for a list across namespaces, the field-selected name for a
/// list of one object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_carry_the_namespace_and_the_name_rbac_sees() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    machines
        .create(&PostParams::default(), &machine("m1", &[]))
        .await
        .unwrap();
    t.server().requests().reset();
    machines.get("m1").await.unwrap();
    machines
        .list(&ListParams::default().fields("metadata.name=m1"))
        .await
        .unwrap();
    Api::<Machine>::all(t.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    Api::<k8s_openapi::api::core::v1::Node>::all(t.client.clone())
        .get_opt("n1")
        .await
        .unwrap();
    let counts: Vec<(String, String, String)> = t
        .server()
        .requests()
        .snapshot()
        .into_keys()
        .map(|k| (k.verb, k.namespace, k.name))
        .collect();
    let expected = [
        ("get", "", "n1"),
        ("get", "default", "m1"),
        ("list", "", ""),
        ("list", "default", "m1"),
    ]
    .map(|(v, ns, n)| (v.to_owned(), ns.to_owned(), n.to_owned()));
    let mut counts = counts;
    counts.sort();
    assert_eq!(counts, expected);
}

/// A client of the server `t` that authenticates with `token` instead of the admin token.
async fn client_with_token(t: &TestServer, token: &str) -> kube::Client {
    let mut config = support::kube_config_from(&t.kubeconfig()).await;
    config.auth_info.token = Some(token.to_owned().into());
    kube::Client::try_from(config).expect("a client")
}

/// Users of a static token file (`Config::token_auth_file`, kube-apiserver's `--token-auth-file`) are counted under
/// their own names; one in `system:masters` may do everything and read the counters, one outside may not, and a
/// token not in the file is 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_file_users_authenticate_and_are_counted_under_their_names() {
    let tokens = tempfile::tempdir().unwrap();
    let file = tokens.path().join("tokens.csv");
    std::fs::write(
        &file,
        "mcm-token-1,system:serviceaccount:mcm:mcm,uid-1,\"system:masters\"\nviewer-token-2,viewer,uid-2,team\n",
    )
    .unwrap();
    let t = TestServer::start_with(|config| config.token_auth_file = Some(file.clone())).await;
    let mcm = client_with_token(&t, "mcm-token-1").await;
    Api::<Machine>::namespaced(mcm.clone(), "default")
        .create(&PostParams::default(), &machine("m1", &[]))
        .await
        .unwrap();
    let (code, body) = send_raw(
        &mcm,
        http::Request::get("/debug/requests").body(Vec::new()).unwrap(),
    )
    .await;
    assert_eq!(code, http::StatusCode::OK, "{body}");
    assert!(
        body.as_array()
            .unwrap()
            .iter()
            .any(|r| r["user"] == "system:serviceaccount:mcm:mcm"
                && r["verb"] == "create"
                && r["namespace"] == "default"),
        "{body}"
    );

    let viewer = client_with_token(&t, "viewer-token-2").await;
    let forbidden = support::expect_status(
        Api::<Machine>::namespaced(viewer.clone(), "default")
            .get("m1")
            .await,
        403,
        "Forbidden",
    );
    assert!(forbidden.message.contains("User \"viewer\""), "{forbidden:?}");
    let (code, _) = send_raw(
        &viewer,
        http::Request::get("/debug/requests").body(Vec::new()).unwrap(),
    )
    .await;
    assert_eq!(code, http::StatusCode::FORBIDDEN);

    let stranger = client_with_token(&t, "not-in-the-file").await;
    support::expect_status(
        Api::<Machine>::namespaced(stranger, "default").get("m1").await,
        401,
        "Unauthorized",
    );
}
