//! The API server's request handling: any method, path, query, headers and body (JSON, YAML, each patch type) sent
//! in process to one server started on first use. Must hold: no panic, no 500, and every error is a `Status` of
//! the response's code (kind Status, code equal to the HTTP code).

use std::{sync::OnceLock, time::Duration};

use arbitrary::{Result, Unstructured};
use axum::body::Body;
use http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt as _;
use mcm_apiserver::{ApiServer, Config};

use crate::json;

/// The server every input is sent to, its runtime and its data directory.
struct Harness {
    runtime: tokio::runtime::Runtime,
    server: ApiServer,
    _dir: tempfile::TempDir,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let dir = tempfile::tempdir().expect("a data directory");
        let mut config = Config::new(dir.path());
        config.in_memory = true;
        let server = runtime
            .block_on(ApiServer::start(config))
            .expect("the API server starts");
        Harness {
            runtime,
            server,
            _dir: dir,
        }
    })
}

const METHODS: &[Method] = &[
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
    Method::HEAD,
    Method::OPTIONS,
];

/// Paths, with the apiVersion and kind of the objects written there (empty where nothing is written).
const PATHS: &[(&str, &str, &str)] = &[
    (
        "/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machines",
        MACHINE_API,
        "Machine",
    ),
    (
        "/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machinesets",
        MACHINE_API,
        "MachineSet",
    ),
    (
        "/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machinedeployments",
        MACHINE_API,
        "MachineDeployment",
    ),
    (
        "/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machineclasses",
        MACHINE_API,
        "MachineClass",
    ),
    (
        "/apis/machine.sapcloud.io/v1alpha1/machines",
        MACHINE_API,
        "Machine",
    ),
    ("/api/v1/namespaces/default/secrets", "v1", "Secret"),
    ("/api/v1/namespaces/default/pods", "v1", "Pod"),
    ("/api/v1/namespaces/default/events", "v1", "Event"),
    (
        "/api/v1/namespaces/default/persistentvolumeclaims",
        "v1",
        "PersistentVolumeClaim",
    ),
    ("/api/v1/persistentvolumes", "v1", "PersistentVolume"),
    ("/api/v1/nodes", "v1", "Node"),
    ("/api/v1/namespaces", "v1", "Namespace"),
    (
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        "coordination.k8s.io/v1",
        "Lease",
    ),
    (
        "/apis/policy/v1/namespaces/default/poddisruptionbudgets",
        "policy/v1",
        "PodDisruptionBudget",
    ),
    (
        "/apis/storage.k8s.io/v1/volumeattachments",
        "storage.k8s.io/v1",
        "VolumeAttachment",
    ),
    (
        "/apis/certificates.k8s.io/v1/certificatesigningrequests",
        "certificates.k8s.io/v1",
        "CertificateSigningRequest",
    ),
    (
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
    ),
    (
        "/apis/events.k8s.io/v1/namespaces/default/events",
        "events.k8s.io/v1",
        "Event",
    ),
    ("/api", "", ""),
    ("/api/v1", "", ""),
    ("/apis", "", ""),
    ("/apis/machine.sapcloud.io", "", ""),
    ("/apis/machine.sapcloud.io/v1alpha1", "", ""),
    ("/openapi/v3", "", ""),
    ("/openapi/v3/apis/machine.sapcloud.io/v1alpha1", "", ""),
    ("/version", "", ""),
    ("/healthz", "", ""),
    ("/debug/requests", "", ""),
];

const MACHINE_API: &str = "machine.sapcloud.io/v1alpha1";

const SUBRESOURCES: &[&str] = &["status", "scale", "eviction", "approval", "finalize", "binding"];

const QUERY_KEYS: &[&str] = &[
    "watch",
    "resourceVersion",
    "resourceVersionMatch",
    "labelSelector",
    "fieldSelector",
    "limit",
    "continue",
    "fieldManager",
    "fieldValidation",
    "timeoutSeconds",
    "allowWatchBookmarks",
    "sendInitialEvents",
    "propagationPolicy",
    "gracePeriodSeconds",
    "orphanDependents",
    "dryRun",
    "includeObject",
    "hash",
    "force",
];

const CONTENT_TYPES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
    "application/json; charset=utf-8",
    "text/plain",
];

const ACCEPTS: &[&str] = &[
    "application/json",
    "application/yaml",
    "*/*",
    "application/json;as=Table;v=v1;g=meta.k8s.io",
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
    "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
    "application/vnd.kubernetes.protobuf",
];

/// Percent-encodes everything but unreserved characters, so any string fits in a path segment.
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The request target and the apiVersion and kind of what is written there.
fn uri(u: &mut Unstructured<'_>, method: &Method) -> Result<(String, &'static str, &'static str)> {
    let (path, api_version, kind) = *u.choose(PATHS)?;
    let mut path = path.to_owned();
    // Creates go to collections; the other verbs mostly to objects.
    let named = if *method == Method::POST {
        u.ratio(1, 6)?
    } else {
        u.ratio(2, 3)?
    };
    if named {
        let name = if u.ratio(1, 2)? {
            "m1".to_owned()
        } else {
            json::string(u)?
        };
        path = format!("{path}/{}", segment(&name));
        if u.ratio(1, 4)? {
            let sub = if u.ratio(3, 4)? {
                (*u.choose(SUBRESOURCES)?).to_owned()
            } else {
                json::string(u)?
            };
            path = format!("{path}/{}", segment(&sub));
        }
    }
    let mut query = form_urlencoded::Serializer::new(String::new());
    for _ in 0..u.int_in_range(0..=3)? {
        let key = if u.ratio(7, 8)? {
            (*u.choose(QUERY_KEYS)?).to_owned()
        } else {
            json::string(u)?
        };
        let value = match u.int_in_range(0..=3)? {
            0 => "true".to_owned(),
            1 => u.int_in_range(0..=20_u32)?.to_string(),
            _ => json::string(u)?,
        };
        query.append_pair(&key, &value);
    }
    let query = query.finish();
    let uri = if query.is_empty() {
        path
    } else {
        format!("{path}?{query}")
    };
    Ok((uri, api_version, kind))
}

/// An object that fits the path half of the time (its apiVersion and kind, the name `m1`), so that writes get past
/// decoding to validation, admission and the store.
fn object(u: &mut Unstructured<'_>, api_version: &str, kind: &str) -> Result<serde_json::Value> {
    let mut object = json::object(u)?;
    if !kind.is_empty() && u.ratio(1, 2)? {
        object["apiVersion"] = serde_json::json!(api_version);
        object["kind"] = serde_json::json!(kind);
        let name = if u.ratio(3, 4)? {
            "m1".to_owned()
        } else {
            json::string(u)?
        };
        object["metadata"] = serde_json::json!({ "name": name });
        if u.ratio(1, 3)? {
            object["metadata"]["labels"] = json::string_map(u)?;
        }
    }
    Ok(object)
}

fn body(
    u: &mut Unstructured<'_>,
    content_type: Option<&str>,
    api_version: &str,
    kind: &str,
) -> Result<Vec<u8>> {
    Ok(match u.int_in_range(0..=4)? {
        0 => u.arbitrary::<Vec<u8>>()?,
        1 => Vec::new(),
        2 if content_type == Some("application/json-patch+json") => {
            let mut ops = Vec::new();
            for _ in 0..u.int_in_range(0..=3)? {
                ops.push(serde_json::json!({
                    "op": json::string(u)?,
                    "path": json::string(u)?,
                    "value": json::value(u, 2)?,
                    "from": json::string(u)?,
                }));
            }
            serde_json::to_vec(&ops).unwrap_or_default()
        }
        3 if content_type.is_some_and(|c| c.contains("yaml")) => {
            serde_saphyr::to_string(&object(u, api_version, kind)?)
                .unwrap_or_default()
                .into_bytes()
        }
        _ => serde_json::to_vec(&object(u, api_version, kind)?).unwrap_or_default(),
    })
}

/// A request from the fuzzer's bytes, or None when they make no valid HTTP request (a header value with a
/// newline, ...).
fn request(u: &mut Unstructured<'_>) -> Result<Option<Request<Body>>> {
    let method = u.choose(METHODS)?.clone();
    let (uri, api_version, kind) = uri(u, &method)?;
    let content_type = if u.ratio(4, 5)? {
        Some(*u.choose(CONTENT_TYPES)?)
    } else {
        None
    };
    let accept = if u.ratio(1, 2)? {
        Some(*u.choose(ACCEPTS)?)
    } else {
        None
    };
    let authorization = if u.ratio(1, 10)? {
        Some(format!("Bearer {}", json::string(u)?))
    } else {
        None
    };
    let body = body(u, content_type, api_version, kind)?;
    let mut builder = Request::builder().method(method).uri(uri);
    for (name, value) in [
        (header::CONTENT_TYPE, content_type.map(str::to_owned)),
        (header::ACCEPT, accept.map(str::to_owned)),
        (header::AUTHORIZATION, authorization),
    ] {
        if let Some(value) = value {
            builder = builder.header(name, value);
        }
    }
    Ok(builder.body(Body::from(body)).ok())
}

/// Sends the request the bytes describe and checks the answer.
///
/// # Panics
///
/// When the server answers 500, or an error that is not a `Status` of its code: the bug the target looks for.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(Some(request)) = request(&mut u) else {
        return;
    };
    let what = format!("{} {}", request.method(), request.uri());
    let harness = harness();
    harness.runtime.block_on(async {
        let response = harness.server.serve_in_process(request).await;
        let code = response.status();
        assert_ne!(
            code,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{what} failed the server"
        );
        if code.is_client_error() || code.is_server_error() {
            let protobuf = response
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v == mcm_apiserver::protobuf::MEDIA_TYPE);
            // Errors are never streamed: the whole body is there at once.
            let bytes = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect())
                .await
                .unwrap_or_else(|_| panic!("{what}: the error body of {code} did not end"))
                .expect("an error body")
                .to_bytes();
            // A protobuf-first Accept gets the Status in protobuf.
            let status: serde_json::Value = if protobuf {
                mcm_apiserver::protobuf::codec::decode(&bytes)
                    .unwrap_or_else(|err| panic!("{what}: the {code} body is not a protobuf object: {err}"))
            } else {
                serde_json::from_slice(&bytes)
                    .unwrap_or_else(|_| panic!("{what}: the {code} body is not JSON"))
            };
            assert_eq!(status["kind"], "Status", "{what}: {status}");
            assert_eq!(status["code"], code.as_u16(), "{what}: {status}");
        }
    });
}
