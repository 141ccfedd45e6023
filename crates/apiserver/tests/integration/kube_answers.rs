//! Input kube-apiserver refuses is refused here with the same answer: one table, each row an input sent over real
//! HTTPS with the kube client and the code, Status reason and field (a `details.causes` field, or for answers
//! without causes the parameter the message names) kube-apiserver 1.32 gives. The sources are cited in
//! `metadata.rs`, `naming.rs`, `options.rs` and `limits.rs`; rows that differ from kube on purpose say so.

use crate::support;

use serde_json::{Value, json};
use support::{TestServer, machine, send_raw};

const MACHINES: &str = "/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machines";
const SECRETS: &str = "/api/v1/namespaces/default/secrets";
const NAMESPACES: &str = "/api/v1/namespaces";

/// One input and kube-apiserver's answer to it.
struct Row {
    what: &'static str,
    method: http::Method,
    path: String,
    content_type: Option<&'static str>,
    extra_header: Option<(&'static str, String)>,
    body: Value,
    /// The expected HTTP code.
    code: u16,
    /// The expected Status reason; empty for a success.
    reason: &'static str,
    /// The field named: among `details.causes[].field` when the answer has causes, else in the message.
    field: &'static str,
}

fn row(what: &'static str, method: http::Method, path: impl Into<String>, body: Value) -> Row {
    Row {
        what,
        method,
        path: path.into(),
        content_type: Some("application/json"),
        extra_header: None,
        body,
        code: 0,
        reason: "",
        field: "",
    }
}

impl Row {
    fn answers(mut self, code: u16, reason: &'static str, field: &'static str) -> Self {
        self.code = code;
        self.reason = reason;
        self.field = field;
        self
    }

    fn content_type(mut self, content_type: Option<&'static str>) -> Self {
        self.content_type = content_type;
        self
    }

    fn header(mut self, name: &'static str, value: String) -> Self {
        self.extra_header = Some((name, value));
        self
    }
}

/// A machine body with this name (and labels), as the kube client would send it.
fn machine_body(name: &str) -> Value {
    let mut body = serde_json::to_value(machine("placeholder", &[])).unwrap();
    body["apiVersion"] = json!("machine.sapcloud.io/v1alpha1");
    body["kind"] = json!("Machine");
    body["metadata"] = json!({ "name": name });
    body
}

fn with_meta(mut body: Value, key: &str, value: Value) -> Value {
    body["metadata"][key] = value;
    body
}

fn without(mut body: Value, keys: &[&str]) -> Value {
    for key in keys {
        body.as_object_mut().unwrap().remove(*key);
    }
    body
}

fn secret_body(name: &str) -> Value {
    json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": name }, "stringData": { "k": "v" } })
}

/// The rows; `existing_rv` is the resourceVersion of the machine `existing` the update rows replace.
// One row per input, read as a whole: splitting the table would hide it.
#[allow(clippy::too_many_lines)]
fn table(existing_rv: &str) -> Vec<Row> {
    use http::Method as M;
    let long_label = "v".repeat(64);
    let big_annotation = "a".repeat(256 * 1024);
    vec![
        // metadata.name: a DNS-1123 subdomain for most kinds, custom resources included; a DNS label for namespaces.
        row("name over 253 characters", M::POST, MACHINES, machine_body(&"a".repeat(254)))
            .answers(422, "Invalid", "metadata.name"),
        row("name with uppercase and '_'", M::POST, MACHINES, machine_body("Bad_Name"))
            .answers(422, "Invalid", "metadata.name"),
        row("namespace name with a dot", M::POST, NAMESPACES, json!({ "metadata": { "name": "a.b" } }))
            .answers(422, "Invalid", "metadata.name"),
        row("namespace name over 63", M::POST, NAMESPACES, json!({ "metadata": { "name": "n".repeat(64) } }))
            .answers(422, "Invalid", "metadata.name"),
        row("valid name", M::POST, MACHINES, machine_body("good-name.v1")).answers(201, "", ""),
        // generateName: checked with its trailing '-' masked; the generated name keeps 58 characters of it.
        row("generateName with '_'", M::POST, MACHINES, with_meta(machine_body(""), "generateName", json!("bad_")))
            .answers(422, "Invalid", "metadata.generateName"),
        row("generateName over 253", M::POST, MACHINES,
            with_meta(machine_body(""), "generateName", json!(format!("{}-", "g".repeat(260)))))
            .answers(422, "Invalid", "metadata.generateName"),
        row("generateName ending in '-'", M::POST, MACHINES, with_meta(machine_body(""), "generateName", json!("web-")))
            .answers(201, "", ""),
        // Labels: keys are qualified names, values at most 63 characters of [A-Za-z0-9._-].
        row("label value over 63", M::POST, MACHINES,
            with_meta(machine_body("l1"), "labels", json!({ "app": long_label })))
            .answers(422, "Invalid", "metadata.labels"),
        row("label value with a space", M::POST, MACHINES,
            with_meta(machine_body("l2"), "labels", json!({ "app": "a b" })))
            .answers(422, "Invalid", "metadata.labels"),
        row("label key with two '/'", M::POST, MACHINES,
            with_meta(machine_body("l3"), "labels", json!({ "a/b/c": "x" })))
            .answers(422, "Invalid", "metadata.labels"),
        row("label key prefix not a subdomain", M::POST, MACHINES,
            with_meta(machine_body("l4"), "labels", json!({ "Example.com/app": "x" })))
            .answers(422, "Invalid", "metadata.labels"),
        row("label key name over 63", M::POST, MACHINES,
            with_meta(machine_body("l5"), "labels", json!({ "k".repeat(64): "x" })))
            .answers(422, "Invalid", "metadata.labels"),
        // Annotations: keys are qualified names (any case), keys and values at most 256 KiB together.
        row("annotation key with a space", M::POST, MACHINES,
            with_meta(machine_body("a1"), "annotations", json!({ "bad key": "x" })))
            .answers(422, "Invalid", "metadata.annotations"),
        row("annotations over 256 KiB", M::POST, MACHINES,
            with_meta(machine_body("a2"), "annotations", json!({ "big": big_annotation })))
            .answers(422, "Invalid", "metadata.annotations"),
        row("labels checked on update too", M::PUT, format!("{MACHINES}/existing"),
            with_meta(with_meta(machine_body("existing"), "resourceVersion", json!(existing_rv)),
                "labels", json!({ "app": "v".repeat(64) })))
            .answers(422, "Invalid", "metadata.labels"),
        row("labels checked on patch too", M::PATCH, format!("{MACHINES}/existing"),
            json!({ "metadata": { "labels": { "app": "v".repeat(64) } } }))
            .content_type(Some("application/merge-patch+json"))
            .answers(422, "Invalid", "metadata.labels"),
        // fieldManager: at most 128 bytes, printable characters only (CreateOptions, UpdateOptions, PatchOptions).
        row("fieldManager over 128 on create", M::POST, format!("{MACHINES}?fieldManager={}", "f".repeat(129)),
            machine_body("fm1"))
            .answers(422, "Invalid", "fieldManager"),
        row("fieldManager with a control character", M::POST, format!("{MACHINES}?fieldManager=a%01b"),
            machine_body("fm2"))
            .answers(422, "Invalid", "fieldManager"),
        row("fieldManager over 128 on patch", M::PATCH,
            format!("{MACHINES}/existing?fieldManager={}", "f".repeat(129)), json!({}))
            .content_type(Some("application/merge-patch+json"))
            .answers(422, "Invalid", "fieldManager"),
        row("fieldManager of 128 printable characters", M::POST,
            format!("{MACHINES}?fieldManager={}", "f".repeat(128)), machine_body("fm3"))
            .answers(201, "", ""),
        // resourceVersion: a decimal unsigned number. kube 1.32 answers 500 here (kubernetes#139485); this
        // server answers 400 with kube's message, as the proposed fix (kubernetes PR #139525) does.
        row("list resourceVersion=abc", M::GET, format!("{MACHINES}?resourceVersion=abc"), Value::Null)
            .answers(400, "BadRequest", "resourceVersion"),
        row("get resourceVersion=-1", M::GET, format!("{MACHINES}/existing?resourceVersion=-1"), Value::Null)
            .answers(400, "BadRequest", "resourceVersion"),
        row("watch resourceVersion=abc", M::GET, format!("{MACHINES}?watch=true&resourceVersion=abc"), Value::Null)
            .answers(400, "BadRequest", "resourceVersion"),
        // resourceVersionMatch: ListOptions validation, 422 on ListOptions.meta.k8s.io.
        row("list resourceVersionMatch=Bogus", M::GET,
            format!("{MACHINES}?resourceVersion=1&resourceVersionMatch=Bogus"), Value::Null)
            .answers(422, "Invalid", "resourceVersionMatch"),
        row("list resourceVersionMatch without resourceVersion", M::GET,
            format!("{MACHINES}?resourceVersionMatch=NotOlderThan"), Value::Null)
            .answers(422, "Invalid", "resourceVersionMatch"),
        row("list resourceVersionMatch=Exact at resourceVersion 0", M::GET,
            format!("{MACHINES}?resourceVersion=0&resourceVersionMatch=Exact"), Value::Null)
            .answers(422, "Invalid", "resourceVersionMatch"),
        row("list sendInitialEvents", M::GET, format!("{MACHINES}?sendInitialEvents=true"), Value::Null)
            .answers(422, "Invalid", "sendInitialEvents"),
        row("watch resourceVersionMatch without sendInitialEvents", M::GET,
            format!("{MACHINES}?watch=true&resourceVersionMatch=NotOlderThan"), Value::Null)
            .answers(422, "Invalid", "resourceVersionMatch"),
        row("list resourceVersionMatch=NotOlderThan", M::GET,
            format!("{MACHINES}?resourceVersion=1&resourceVersionMatch=NotOlderThan"), Value::Null)
            .answers(200, "", ""),
        row("get ignores resourceVersionMatch (GetOptions has none)", M::GET,
            format!("{MACHINES}/existing?resourceVersionMatch=Bogus"), Value::Null)
            .answers(200, "", ""),
        // Content-Type: none is JSON and parameters (charset) are not used, as kube negotiates; a media type that
        // does not parse or is not served is 415.
        row("no Content-Type is JSON", M::POST, MACHINES, machine_body("ct1"))
            .content_type(None)
            .answers(201, "", ""),
        row("a charset parameter is not used", M::POST, MACHINES, machine_body("ct2"))
            .content_type(Some("application/json; charset=iso-8859-1"))
            .answers(201, "", ""),
        row("text/plain", M::POST, MACHINES, machine_body("ct3"))
            .content_type(Some("text/plain"))
            .answers(415, "UnsupportedMediaType", "media types"),
        row("malformed parameter", M::POST, MACHINES, machine_body("ct4"))
            .content_type(Some("application/json; charset"))
            .answers(415, "UnsupportedMediaType", "media types"),
        row("protobuf on a custom resource", M::POST, MACHINES, machine_body("ct5"))
            .content_type(Some("application/vnd.kubernetes.protobuf"))
            .answers(415, "UnsupportedMediaType", "media types"),
        row("patch without Content-Type", M::PATCH, format!("{MACHINES}/existing"), json!({}))
            .content_type(None)
            .answers(415, "UnsupportedMediaType", "media types"),
        // apiVersion and kind: a custom resource needs kind and the URL's apiVersion; a built-in takes the URL's.
        row("custom resource without apiVersion and kind", M::POST, MACHINES,
            without(machine_body("tm1"), &["apiVersion", "kind"]))
            .answers(400, "BadRequest", "Object 'Kind' is missing"),
        row("custom resource without apiVersion", M::POST, MACHINES, without(machine_body("tm2"), &["apiVersion"]))
            .answers(400, "BadRequest", "API version"),
        row("custom resource of another apiVersion", M::POST, MACHINES,
            json!({ "apiVersion": "apps/v1", "kind": "Machine", "metadata": { "name": "tm3" } }))
            .answers(400, "BadRequest", "API version"),
        row("custom resource of another kind", M::POST, MACHINES,
            json!({ "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Gadget", "metadata": { "name": "tm4" } }))
            .answers(422, "Invalid", "kind"),
        row("built-in without apiVersion and kind", M::POST, SECRETS,
            without(secret_body("s1"), &["apiVersion", "kind"]))
            .answers(201, "", ""),
        row("built-in of another kind", M::POST, SECRETS,
            with_meta(json!({ "apiVersion": "v1", "kind": "Pod" }), "name", json!("s2")))
            .answers(400, "BadRequest", "cannot be handled as a Secret"),
        // The request head: a Status body, not hyper's empty one.
        row("request URI over 32 KiB", M::GET, format!("{MACHINES}?labelSelector={}", "x".repeat(40 * 1024)),
            Value::Null)
            .answers(414, "RequestURITooLong", "URI"),
        row("header fields over 256 KiB", M::GET, MACHINES, Value::Null)
            .header("x-padding", "p".repeat(300 * 1024))
            .answers(431, "RequestHeaderFieldsTooLarge", "header"),
    ]
}

/// What differs between the answer and the row, or None.
fn mismatch(row: &Row, code: http::StatusCode, body: &Value) -> Option<String> {
    let mut problems = Vec::new();
    if code.as_u16() != row.code {
        problems.push(format!("code {} (expected {})", code.as_u16(), row.code));
    }
    if row.code >= 400 {
        if body["kind"] != "Status" || body["code"] != row.code {
            problems.push(format!("body is not a Status of code {}", row.code));
        }
        if body["reason"] != row.reason {
            problems.push(format!("reason {} (expected {})", body["reason"], row.reason));
        }
        let causes = body["details"]["causes"].as_array().cloned().unwrap_or_default();
        let named = if causes.is_empty() {
            body["message"].as_str().unwrap_or_default().contains(row.field)
        } else {
            causes.iter().any(|c| c["field"] == row.field)
        };
        if !named {
            problems.push(format!("{:?} not named in {body}", row.field));
        }
    }
    (!problems.is_empty()).then(|| format!("{}: {}", row.what, problems.join("; ")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_input_kube_apiserver_refuses_gets_its_code_reason_and_field() {
    let t = TestServer::start().await;
    let (code, existing) = send_raw(
        &t.client,
        http::Request::post(MACHINES)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&machine_body("existing")).unwrap())
            .unwrap(),
    )
    .await;
    assert_eq!(
        code,
        http::StatusCode::CREATED,
        "the machine the update rows change"
    );

    let mut mismatches = Vec::new();
    let existing_rv = existing["metadata"]["resourceVersion"]
        .as_str()
        .expect("a resourceVersion");
    for row in table(existing_rv) {
        let mut request = http::Request::builder().method(row.method.clone()).uri(&row.path);
        if let Some(content_type) = row.content_type {
            request = request.header("content-type", content_type);
        }
        if let Some((name, value)) = &row.extra_header {
            request = request.header(*name, value);
        }
        let body = if row.body.is_null() {
            Vec::new()
        } else {
            serde_json::to_vec(&row.body).unwrap()
        };
        let (code, answer) = send_raw(&t.client, request.body(body).unwrap()).await;
        mismatches.extend(mismatch(&row, code, &answer));
    }
    assert!(
        mismatches.is_empty(),
        "answers unlike kube-apiserver's:\n{}",
        mismatches.join("\n")
    );
}
