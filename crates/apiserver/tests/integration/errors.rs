//! Failures are `metav1.Status` objects with the code, reason and details a real API server sends: not found,
//! invalid objects, missing or wrong credentials, oversized and malformed bodies.

use crate::support;

use kube::{
    Api,
    api::{ApiResource, DynamicObject, ListParams, PostParams},
    config::AuthInfo,
};
use mcm_api::{Machine, MachineClass};
use pretty_assertions::assert_eq;
use serde_json::json;
use support::{TestServer, expect_status, kube_config_from, machine, machine_class, send_raw};

// API conventions, Response Status Kind: "Kubernetes will always return the Status kind from any API endpoint
// when an error occurs": kind Status, status Failure, a machine-readable reason, the HTTP code and details
// naming the object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_body_is_a_not_found_status_with_details() {
    let t = TestServer::start().await;
    let (code, body) = send_raw(
        &t.client,
        http::Request::get("/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machines/x")
            .body(Vec::new())
            .unwrap(),
    )
    .await;
    assert_eq!(code, http::StatusCode::NOT_FOUND);
    assert_eq!(
        body,
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "machines.machine.sapcloud.io \"x\" not found",
            "reason": "NotFound",
            "details": { "name": "x", "group": "machine.sapcloud.io", "kind": "machines" },
            "code": 404,
        })
    );

    // A path nothing is served at is a 404 Status too.
    let (code, body) = send_raw(
        &t.client,
        http::Request::get("/apis/machine.sapcloud.io/v1alpha1/namespaces/default/gadgets")
            .body(Vec::new())
            .unwrap(),
    )
    .await;
    assert_eq!(code, http::StatusCode::NOT_FOUND);
    assert_eq!(
        (body["kind"].as_str(), body["code"].as_u64()),
        (Some("Status"), Some(404))
    );
}

// API conventions: "422 StatusUnprocessableEntity: Indicates that the requested create or update operation
// cannot be completed due to invalid data provided as part of the request", reason Invalid with
// details.causes naming the fields. MachineClass requires providerSpec (its CRD schema's `required`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_machine_class_is_422_with_causes_naming_provider_spec() {
    let t = TestServer::start().await;
    let resource = ApiResource::erase::<MachineClass>(&());
    let dynamic: Api<DynamicObject> = Api::namespaced_with(t.client.clone(), "default", &resource);
    let mut missing = DynamicObject::new("no-spec", &resource);
    missing.data = json!({ "provider": "sim" });
    let status = expect_status(
        dynamic.create(&PostParams::default(), &missing).await,
        422,
        "Invalid",
    );
    let details = status.details.expect("details");
    assert_eq!(
        (
            details.name.as_str(),
            details.group.as_str(),
            details.kind.as_str()
        ),
        ("no-spec", "machine.sapcloud.io", "MachineClass")
    );
    let causes: Vec<(&str, &str)> = details
        .causes
        .iter()
        .map(|c| (c.field.as_str(), c.reason.as_str()))
        .collect();
    assert_eq!(causes, [("providerSpec", "FieldValueRequired")]);
    assert!(status.message.contains("providerSpec"), "{}", status.message);

    // The typed client sends `providerSpec: null`: dropped as the server drops nulls, so still required.
    let classes: Api<MachineClass> = t.api();
    let mut null_spec = machine_class("null-spec");
    null_spec.provider_spec = serde_json::Value::Null;
    let status = expect_status(
        classes.create(&PostParams::default(), &null_spec).await,
        422,
        "Invalid",
    );
    assert!(
        status
            .details
            .unwrap()
            .causes
            .iter()
            .any(|c| c.field == "providerSpec"),
        "{}",
        status.message
    );

    // A value of the wrong type is invalid too.
    let mut wrong_type = DynamicObject::new("wrong-type", &resource);
    wrong_type.data = json!({ "providerSpec": "text" });
    let status = expect_status(
        dynamic.create(&PostParams::default(), &wrong_type).await,
        422,
        "Invalid",
    );
    assert!(
        status
            .details
            .unwrap()
            .causes
            .iter()
            .any(|c| c.field == "providerSpec"),
        "{}",
        status.message
    );
    assert!(
        classes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

// API conventions: "401 StatusUnauthorized: Indicates that the server can be reached and understood the
// request, but refuses to take any further action, because the client must provide authorization". /version
// stays open, as on kube-apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_token_or_with_a_wrong_token_is_401() {
    let t = TestServer::start().await;
    let text = std::fs::read_to_string(t.kubeconfig()).unwrap();
    let token_lines = text
        .lines()
        .filter(|l| l.trim_start().starts_with("token:"))
        .count();
    assert_eq!(token_lines, 1, "the kubeconfig carries one token:\n{text}");
    let wrong: String = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("token:") {
                "    token: \"wrong\"".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let copy = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(copy.path(), wrong).unwrap();
    let wrong_client = support::client_from(copy.path()).await;
    let machines: Api<Machine> = Api::namespaced(wrong_client, "default");
    let status = expect_status(machines.list(&ListParams::default()).await, 401, "Unauthorized");
    assert_eq!(status.message, "Unauthorized");

    let mut anonymous = kube_config_from(&t.kubeconfig()).await;
    anonymous.auth_info = AuthInfo::default();
    let anonymous = kube::Client::try_from(anonymous).unwrap();
    let machines: Api<Machine> = Api::namespaced(anonymous.clone(), "default");
    expect_status(machines.get("m1").await, 401, "Unauthorized");
    expect_status(
        machines.create(&PostParams::default(), &machine("m1", &[])).await,
        401,
        "Unauthorized",
    );
    let version = anonymous
        .apiserver_version()
        .await
        .expect("/version needs no token");
    assert_eq!(version.major, "1");

    let admin: Api<Machine> = t.api();
    assert!(
        admin.list(&ListParams::default()).await.unwrap().items.is_empty(),
        "nothing was created"
    );
}

// metav1 StatusReasonRequestEntityTooLarge "means that the request entity is too large" (413); the limit is
// about 3 MiB, as on kube-apiserver. The client's next request works (the refused connection is not reused by
// accident).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_413() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    let mut huge = machine("huge", &[]);
    huge.metadata.annotations = Some([("blob".to_owned(), "x".repeat(4 * 1024 * 1024))].into());
    for _ in 0..5 {
        expect_status(
            machines.create(&PostParams::default(), &huge).await,
            413,
            "RequestEntityTooLarge",
        );
        assert!(machines.get_opt("huge").await.unwrap().is_none());
    }
    // The server still serves after refusing it.
    machines
        .create(&PostParams::default(), &machine("small", &[]))
        .await
        .unwrap();
}

// API conventions: "400 StatusBadRequest: Indicates the requested is invalid": a body that is not JSON is
// refused before anything is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_json_is_400_and_creates_nothing() {
    let t = TestServer::start().await;
    let path = "/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machines";
    let result = t
        .client
        .request::<serde_json::Value>(
            http::Request::post(path)
                .header("content-type", "application/json")
                .body(b"{not json".to_vec())
                .unwrap(),
        )
        .await;
    let status = expect_status(result, 400, "BadRequest");
    assert!(status.message.contains("JSON"), "{}", status.message);

    // A JSON body that is not an object is refused the same way.
    let result = t
        .client
        .request::<serde_json::Value>(
            http::Request::post(path)
                .header("content-type", "application/json")
                .body(b"[1, 2]".to_vec())
                .unwrap(),
        )
        .await;
    expect_status(result, 400, "BadRequest");

    let machines: Api<Machine> = t.api();
    assert!(
        machines
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

// A body may be YAML when its Content-Type says so; any other media type is 415 UnsupportedMediaType and
// creates nothing; an unknown resource path is 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaml_bodies_are_accepted_and_unknown_media_types_and_resources_are_refused() {
    let t = TestServer::start().await;
    let path = "/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machines";
    let yaml = "apiVersion: machine.sapcloud.io/v1alpha1\nkind: Machine\nmetadata:\n  name: from-yaml\nspec:\n  class:\n    kind: MachineClass\n    name: c\n";
    let (code, body) = send_raw(
        &t.client,
        http::Request::post(path)
            .header("content-type", "application/yaml")
            .body(yaml.as_bytes().to_vec())
            .unwrap(),
    )
    .await;
    assert_eq!(code, http::StatusCode::CREATED, "{body}");
    assert_eq!(body["spec"]["class"]["name"], "c");

    let (code, body) = send_raw(
        &t.client,
        http::Request::post(path)
            .header("content-type", "text/plain")
            .body(b"name: x".to_vec())
            .unwrap(),
    )
    .await;
    assert_eq!(code, http::StatusCode::UNSUPPORTED_MEDIA_TYPE, "{body}");
    assert_eq!(body["reason"], "UnsupportedMediaType");

    let (code, body) = send_raw(
        &t.client,
        http::Request::get("/apis/machine.sapcloud.io/v1alpha1/namespaces/default/widgets")
            .body(Vec::new())
            .unwrap(),
    )
    .await;
    assert_eq!(code, http::StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["kind"], "Status");

    let machines: Api<Machine> = t.api();
    let names: Vec<String> = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    assert_eq!(names, ["from-yaml"]);
}

// Security: the server listens on loopback by default and its kubeconfig points there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_listens_on_loopback_by_default() {
    let t = TestServer::start().await;
    assert!(
        t.server().url().starts_with("https://127.0.0.1:"),
        "{}",
        t.server().url()
    );
    let kubeconfig = std::fs::read_to_string(t.kubeconfig()).unwrap();
    assert!(kubeconfig.contains(t.server().url()), "{kubeconfig}");
}
