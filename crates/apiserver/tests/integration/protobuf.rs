//! `application/vnd.kubernetes.protobuf` over real HTTPS: the built-in kinds take protobuf bodies and answer in
//! protobuf when Accept lists it first; custom resources (the machine kinds) stay JSON-only, with kube-apiserver's
//! 406 and 415; errors come back as protobuf Status objects when asked for.

use crate::support;

use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use mcm_apiserver::protobuf::codec;
use serde_json::{Value, json};
use support::TestServer;

const PB: &str = "application/vnd.kubernetes.protobuf";
const PB_THEN_JSON: &str = "application/vnd.kubernetes.protobuf,application/json";
const MACHINES: &str = "/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machines";

/// Sends a request; the status code, the response Content-Type and body.
async fn send(
    t: &TestServer,
    method: http::Method,
    path: &str,
    accept: &str,
    body: Option<(&str, Vec<u8>)>,
) -> (u16, String, Vec<u8>) {
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("accept", accept);
    let bytes = match body {
        Some((content_type, bytes)) => {
            request = request.header("content-type", content_type);
            bytes
        }
        None => Vec::new(),
    };
    let response = t
        .client
        .send(request.body(kube::client::Body::from(bytes)).unwrap())
        .await
        .expect("the request reaches the server");
    let code = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.into_body().collect().await.expect("the body").to_bytes();
    (code, content_type, body.to_vec())
}

fn secret(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "pb"}},
        "type": "Opaque",
        // Bytes that are not UTF-8 survive the trip.
        "data": {"key": "AP8Qcw=="},
    })
}

#[tokio::test]
async fn a_secret_created_in_protobuf_is_answered_in_protobuf_and_read_back_as_json() {
    let t = TestServer::start().await;
    let body = codec::encode(&secret("pb-secret")).unwrap();
    let path = "/api/v1/namespaces/default/secrets";
    let (code, content_type, answer) =
        send(&t, http::Method::POST, path, PB_THEN_JSON, Some((PB, body))).await;
    assert_eq!(
        (code, content_type.as_str()),
        (201, PB),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let created = codec::decode(&answer).expect("a protobuf Secret");
    assert_eq!(created["kind"], "Secret");
    assert_eq!(created["data"]["key"], "AP8Qcw==");
    assert!(created["metadata"]["uid"].is_string(), "{created}");
    assert!(created["metadata"]["creationTimestamp"].is_string(), "{created}");

    let secrets: Api<Secret> = Api::default_namespaced(t.client.clone());
    let stored = secrets.get("pb-secret").await.unwrap();
    let data = stored.data.unwrap_or_default();
    assert_eq!(data["key"].0, vec![0x00, 0xff, 0x10, 0x73]);
    assert_eq!(stored.metadata.labels.unwrap_or_default()["app"], "pb");

    // A list in protobuf carries the items and the list's resourceVersion.
    let (code, content_type, answer) = send(&t, http::Method::GET, path, PB_THEN_JSON, None).await;
    assert_eq!((code, content_type.as_str()), (200, PB));
    let list = codec::decode(&answer).expect("a protobuf SecretList");
    assert_eq!(list["kind"], "SecretList");
    assert!(list["metadata"]["resourceVersion"].is_string(), "{list}");
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["metadata"]["name"].as_str())
        .collect();
    assert!(names.contains(&"pb-secret"), "{list}");

    // JSON first in Accept still gets JSON.
    let (code, content_type, _) = send(
        &t,
        http::Method::GET,
        &format!("{path}/pb-secret"),
        "application/json,application/vnd.kubernetes.protobuf",
        None,
    )
    .await;
    assert_eq!((code, content_type.as_str()), (200, "application/json"));
}

#[tokio::test]
async fn errors_are_protobuf_status_objects_when_asked_for() {
    let t = TestServer::start().await;
    let (code, content_type, answer) = send(
        &t,
        http::Method::GET,
        "/api/v1/namespaces/default/secrets/missing",
        PB_THEN_JSON,
        None,
    )
    .await;
    assert_eq!((code, content_type.as_str()), (404, PB));
    let status = codec::decode(&answer).expect("a protobuf Status");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "NotFound");
    assert_eq!(status["code"], 404);
    assert_eq!(status["details"]["name"], "missing");

    // A body that is not protobuf is refused, naming why.
    let path = "/api/v1/namespaces";
    let (code, _, answer) = send(
        &t,
        http::Method::POST,
        path,
        "application/json",
        Some((PB, b"{}".to_vec())),
    )
    .await;
    let status: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(code, 400, "{status}");
    assert!(
        status["message"].as_str().unwrap().contains("magic prefix"),
        "{status}"
    );
    // A broken envelope is a 400 too.
    let mut body = codec::MAGIC.to_vec();
    body.extend([0x0a, 0x05, 0xff, 0xff, 0xff, 0xff, 0xff]);
    let (code, _, _) = send(&t, http::Method::POST, path, "application/json", Some((PB, body))).await;
    assert_eq!(code, 400);
}

#[tokio::test]
async fn custom_resources_stay_json_only() {
    let t = TestServer::start().await;
    // Protobuf alone: 406, itself a protobuf Status, as kube-apiserver answers for a CRD.
    let (code, content_type, answer) = send(&t, http::Method::GET, MACHINES, PB, None).await;
    assert_eq!((code, content_type.as_str()), (406, PB));
    let status = codec::decode(&answer).expect("a protobuf Status");
    assert_eq!(status["reason"], "NotAcceptable");
    assert_eq!(
        status["message"],
        "only the following media types are accepted: application/json, application/yaml, \
         application/vnd.kubernetes.protobuf"
    );
    // Protobuf then JSON: JSON.
    let (code, content_type, _) = send(&t, http::Method::GET, MACHINES, PB_THEN_JSON, None).await;
    assert_eq!((code, content_type.as_str()), (200, "application/json"));
    // A protobuf body: 415.
    let body = codec::encode(&secret("not-a-machine")).unwrap();
    let (code, _, answer) = send(
        &t,
        http::Method::POST,
        MACHINES,
        "application/json",
        Some((PB, body)),
    )
    .await;
    let status: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(
        (code, status["reason"].as_str()),
        (415, Some("UnsupportedMediaType")),
        "{status}"
    );
}

#[tokio::test]
async fn a_protobuf_watch_streams_length_prefixed_watch_events() {
    let t = TestServer::start().await;
    let request = http::Request::builder()
        .uri("/api/v1/namespaces/default/secrets?watch=true")
        .header("accept", PB_THEN_JSON)
        .body(kube::client::Body::empty())
        .unwrap();
    let response = t.client.send(request).await.expect("the watch starts");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/vnd.kubernetes.protobuf;stream=watch"
    );
    let secrets: Api<Secret> = Api::default_namespaced(t.client.clone());
    let created: Secret = serde_json::from_value(secret("watched")).unwrap();
    secrets
        .create(&kube::api::PostParams::default(), &created)
        .await
        .unwrap();

    let mut body = response.into_body();
    let mut buffer = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let event = loop {
        // Whole frames first: a 4-byte big-endian length, then a WatchEvent.
        if buffer.len() >= 4 {
            let length = u32::from_be_bytes(buffer[..4].try_into().unwrap()) as usize;
            if buffer.len() >= 4 + length {
                let (event_type, object) =
                    codec::decode_watch_event(&buffer[4..4 + length]).expect("a WatchEvent");
                buffer.drain(..4 + length);
                if object["metadata"]["name"] == "watched" {
                    break (event_type, object);
                }
                continue;
            }
        }
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .expect("the ADDED event of the new secret before the deadline")
            .expect("the stream stays open")
            .expect("a frame");
        if let Ok(data) = frame.into_data() {
            buffer.extend_from_slice(&data);
        }
    };
    assert_eq!(event.0, "ADDED");
    assert_eq!(event.1["kind"], "Secret");
    assert_eq!(event.1["data"]["key"], "AP8Qcw==");
}
