//! The harness of the integration suites: one server per test in its own temporary data directory on a free
//! port, a real `kube::Client` over HTTPS built from the kubeconfig the server wrote, restarts with the same
//! directory, object builders, and deadline-bound waiting.

// Each test crate compiles this module and uses a part of it.

use std::{
    collections::BTreeMap,
    future::Future,
    path::{Path, PathBuf},
    pin::Pin,
    time::Duration,
};

use http_body_util::BodyExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::PostParams,
    config::{KubeConfigOptions, Kubeconfig},
    core::Status,
};
use mcm_api::{
    Machine, MachineClass,
    builders::{MachineBuilder, MachineClassBuilder},
};
use mcm_apiserver::{ApiServer, Config};
use tempfile::TempDir;

/// How long any wait in a test may take before the test fails. Generous for a loaded 2-core CI machine; a
/// passing test never waits this long.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A server under test, its data directory and a client.
pub struct TestServer {
    server: Option<ApiServer>,
    config: Config,
    /// Kept alive for the test's duration; removed on drop.
    _dir: TempDir,
    /// A client over HTTPS with the admin token of the server's kubeconfig, default namespace `default`.
    pub client: Client,
}

impl TestServer {
    /// A persistent server with the default configuration.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// A server whose configuration `tune` adjusts (watch window, bookmark interval, in-memory mode).
    pub async fn start_with(tune: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().expect("temporary data directory");
        let mut config = Config::new(dir.path());
        assert_eq!(config.port, 0, "tests never share ports: port 0 picks a free one");
        tune(&mut config);
        let server = ApiServer::start(config.clone()).await.expect("the server starts");
        let client = client_from(server.kubeconfig()).await;
        Self {
            server: Some(server),
            config,
            _dir: dir,
            client,
        }
    }

    /// The running server.
    pub fn server(&self) -> &ApiServer {
        self.server.as_ref().expect("the server is running")
    }

    /// The kubeconfig the server wrote.
    pub fn kubeconfig(&self) -> PathBuf {
        self.server().kubeconfig().to_path_buf()
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    /// A namespaced API in `default`.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), "default")
    }

    /// A cluster-wide API (cluster-scoped kinds, or all namespaces).
    pub fn api_all<K>(&self) -> Api<K>
    where
        K: Resource,
        <K as Resource>::DynamicType: Default,
    {
        Api::all(self.client.clone())
    }

    /// Stops the server and starts it again with the same configuration and data directory (so the same port,
    /// certificates and token); `client` is replaced by a new one built from the kubeconfig.
    pub async fn restart(&mut self) {
        self.stop().await;
        let server = ApiServer::start(self.config.clone())
            .await
            .expect("the server starts again");
        self.client = client_from(server.kubeconfig()).await;
        self.server = Some(server);
    }

    /// Stops the server (the data directory stays until the `TestServer` is dropped).
    pub async fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }
}

/// A client built the way kubectl and controllers build one: from a kubeconfig file.
pub async fn client_from(kubeconfig: &Path) -> Client {
    Client::try_from(kube_config_from(kubeconfig).await).expect("a client from the kubeconfig")
}

/// The `kube::Config` of a kubeconfig file.
pub async fn kube_config_from(kubeconfig: &Path) -> kube::Config {
    let file = Kubeconfig::read_from(kubeconfig).expect("the kubeconfig parses");
    let mut config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .expect("the kubeconfig makes a client configuration");
    // kube 5 retries 429, 503 and 504 up to 15 times with exponential back-off by default; the tests check those
    // answers themselves (docs/pitfalls.md).
    config.default_retry = false;
    config
}

/// The Status of a request that must fail with an API error.
#[track_caller]
pub fn api_error<T: std::fmt::Debug>(result: kube::Result<T>) -> Box<Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error (a metav1.Status), got {other:?}"),
    }
}

/// Asserts the code and reason of an API error and returns its Status.
#[track_caller]
pub fn expect_status<T: std::fmt::Debug>(result: kube::Result<T>, code: u16, reason: &str) -> Box<Status> {
    let status = api_error(result);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (code, reason),
        "unexpected Status: {status:?}"
    );
    status
}

/// The resourceVersion of an object, as a number (this server's resourceVersions are one decimal counter).
#[track_caller]
pub fn rv<K: Resource>(object: &K) -> u64 {
    object
        .resource_version()
        .expect("a stored object has a resourceVersion")
        .parse()
        .expect("resourceVersions of this server are decimal")
}

/// Waits until `check` returns `Some`, polling every 20 ms, failing the test after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let poll = async {
        loop {
            if let Some(value) = check().await {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(DEADLINE, poll)
        .await
        .unwrap_or_else(|_| panic!("timed out after {DEADLINE:?} waiting for {what}"))
}

/// Awaits `future`, failing the test after [`DEADLINE`].
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out after {DEADLINE:?} waiting for {what}"))
}

/// Labels from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Metadata with a name and labels.
pub fn meta(name: &str, pairs: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: (!pairs.is_empty()).then(|| labels(pairs)),
        ..ObjectMeta::default()
    }
}

/// A machine of class `small` with these labels.
pub fn machine(name: &str, pairs: &[(&str, &str)]) -> Machine {
    pairs
        .iter()
        .fold(MachineBuilder::new(name).class("small"), |m, (k, v)| {
            m.label(k, v)
        })
        .build()
}

/// A machine class of the `sim` provider.
pub fn machine_class(name: &str) -> MachineClass {
    MachineClassBuilder::new(name)
        .provider("sim")
        .provider_spec(serde_json::json!({ "image": "ubuntu", "size": "small" }))
        .build()
}

/// Creates each object, returning them as stored. The objects are moved to the heap at once, so that the
/// future stays small whatever the caller passes.
pub fn create_all<'a, K>(
    api: &'a Api<K>,
    objects: impl IntoIterator<Item = K>,
) -> Pin<Box<dyn Future<Output = Vec<K>> + Send + 'a>>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'a,
{
    let objects: Vec<K> = objects.into_iter().collect();
    Box::pin(async move {
        let mut created = Vec::new();
        for object in objects {
            created.push(api.create(&PostParams::default(), &object).await.expect("create"));
        }
        created
    })
}

/// The sorted names of objects.
pub fn names<K: Resource>(objects: impl IntoIterator<Item = K>) -> Vec<String> {
    let mut names: Vec<String> = objects.into_iter().map(|o| o.name_any()).collect();
    names.sort();
    names
}

/// Sends a raw request and returns the status code and the body parsed as JSON (`Null` when it is not JSON):
/// for checking the wire form of responses, errors included, which `Client::request` turns into
/// `kube::Error`.
pub async fn send_raw(
    client: &Client,
    request: http::Request<Vec<u8>>,
) -> (http::StatusCode, serde_json::Value) {
    let response = client
        .send(request.map(kube::client::Body::from))
        .await
        .expect("the request reaches the server");
    let code = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the response body")
        .to_bytes();
    (
        code,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
}
