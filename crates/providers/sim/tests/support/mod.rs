//! The harness of the integration suites (after `crates/apiserver/tests/support`): one embedded API server per
//! test in its own temporary data directory on a free port, a `kube::Client` over HTTPS from the kubeconfig the
//! server wrote, deadline-bound waiting, and requests for the simulated provider.

// Each test crate compiles this module and uses a part of it.
#![allow(dead_code)]

use std::{collections::BTreeMap, future::Future, path::Path, time::Duration};

use k8s_openapi::{
    ByteString,
    api::core::v1::{Node, NodeCondition, Secret},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};
use mcm_api::{
    MachineClass,
    builders::{MachineBuilder, MachineClassBuilder},
};
use mcm_apiserver::{ApiServer, Config};
use mcm_driver::{CreateMachineRequest, DeleteMachineRequest};
use tempfile::TempDir;

/// How long any wait in a test may take before the test fails. Generous for a loaded 2-core machine; a passing
/// test never waits this long.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// The node monitor grace period of the test servers: a node silent this long turns Unknown.
pub const GRACE: Duration = Duration::from_secs(2);

/// A server under test, its data directory and a client.
pub struct TestServer {
    server: Option<ApiServer>,
    /// Kept alive for the test's duration; removed on drop.
    _dir: TempDir,
    /// A client over HTTPS with the admin token of the server's kubeconfig.
    pub client: Client,
}

impl TestServer {
    /// An in-memory server with a short node monitor grace period ([`GRACE`]) checked every 100 ms.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temporary data directory");
        let mut config = Config::new(dir.path());
        assert_eq!(config.port, 0, "tests never share ports: port 0 picks a free one");
        config.in_memory = true;
        config.node_monitor_grace_period = GRACE;
        config.node_monitor_period = Duration::from_millis(100);
        let server = ApiServer::start(config).await.expect("the server starts");
        let client = client_from(server.kubeconfig()).await;
        Self {
            server: Some(server),
            _dir: dir,
            client,
        }
    }

    /// Stops the server.
    pub async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }
}

/// A client built from a kubeconfig file, without kube's automatic retries.
pub async fn client_from(kubeconfig: &Path) -> Client {
    let file = Kubeconfig::read_from(kubeconfig).expect("the kubeconfig parses");
    let mut config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .expect("the kubeconfig makes a client configuration");
    // kube 5 retries 429, 503 and 504 up to 15 times with exponential back-off by default (docs/pitfalls.md).
    config.default_retry = false;
    Client::try_from(config).expect("a client from the kubeconfig")
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

/// The providerSpec of the example class of spec 000, with another size.
pub fn provider_spec(size: &str) -> serde_json::Value {
    serde_json::json!({
        "vmPool": "test-worker-pool",
        "size": size,
        "rootFsSize": 20,
        "tags": { "kubernetes.io/cluster/test": "1", "kubernetes.io/role/node": "1" },
    })
}

/// A class of the simulated provider.
pub fn class(size: &str) -> MachineClass {
    MachineClassBuilder::new(&format!("sim-{size}"))
        .namespace("default")
        .provider("sim")
        .provider_spec(provider_spec(size))
        .build()
}

/// The class's secret, with a userData.
pub fn secret() -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("sim-worker".into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "userData".to_owned(),
            ByteString(b"#!/bin/sh\necho boot".to_vec()),
        )])),
        ..Secret::default()
    }
}

/// CreateMachine of a machine with a class of this size.
pub fn create(name: &str, size: &str) -> CreateMachineRequest {
    CreateMachineRequest {
        machine: MachineBuilder::new(name).namespace("default").build(),
        machine_class: class(size),
        secret: secret(),
    }
}

/// DeleteMachine of a machine with a class of this size.
pub fn delete(name: &str, size: &str) -> DeleteMachineRequest {
    DeleteMachineRequest {
        machine: MachineBuilder::new(name).namespace("default").build(),
        machine_class: class(size),
        secret: secret(),
    }
}

/// A condition of a node.
pub fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// The status of a node's condition (`True`, `False`, `Unknown`), if it has it.
pub fn condition_status(node: &Node, type_: &str) -> Option<String> {
    condition(node, type_).map(|c| c.status.clone())
}

/// Whether a node carries a taint of this key.
pub fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| taints.iter().any(|t| t.key == key))
}
