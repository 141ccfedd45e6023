//! The provider conformance suite of `mcm-grpc` against the local provider served over gRPC on a Unix socket: every
//! check passes, and the suite leaves no machine (and no process) behind.

mod support;

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Secret;
use mcm_api::MachineClass;
use mcm_grpc::{ClientOptions, Endpoint, GrpcDriver, ProviderInfo, conformance};
use serde_json::json;
use support::{BOOT, Env};
use tokio::sync::oneshot;

const DEADLINE: Duration = Duration::from_mins(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_provider_passes_the_conformance_suite() {
    let env = Env::new();
    let socket = env.dir.path().join("provider.sock");
    let endpoint = Endpoint::Unix(socket.clone());
    let info = ProviderInfo {
        name: "local".into(),
        version: "test".into(),
        optional_methods: mcm_provider_local::optional_methods(),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let driver: Arc<dyn mcm_driver::Driver> = Arc::new(env.driver.clone());
    let serving = endpoint.clone();
    let server = tokio::spawn(async move {
        mcm_grpc::serve(driver, info, &serving, None, async move {
            let _ = stopped.await;
        })
        .await
    });
    tokio::time::timeout(DEADLINE, async {
        while tokio::net::UnixStream::connect(&socket).await.is_err() {
            assert!(!server.is_finished(), "the provider stopped before serving");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the provider serves in time");

    let class: MachineClass = serde_json::from_value(json!({
        "metadata": { "name": "local-small", "namespace": "default" },
        "provider": "local",
        "providerSpec": {
            "vmPool": "test-worker-pool",
            "size": "small",
            "rootFsSize": 10,
            "tags": { "kubernetes.io/cluster/conformance": "1", "kubernetes.io/role/node": "1" },
        },
    }))
    .unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "local-worker", "namespace": "default" },
        "stringData": { "userData": BOOT },
    }))
    .unwrap();
    let input = conformance::Input {
        class,
        secret,
        name_prefix: "conformance".into(),
    };
    let client = GrpcDriver::new(endpoint, ClientOptions::default()).expect("a client");
    let checks = tokio::time::timeout(DEADLINE, conformance::run(&client, &input))
        .await
        .expect("the suite finishes in time");
    let report = conformance::render(&checks);
    println!("{report}");
    assert!(conformance::passed(&checks), "{report}");

    assert!(
        env.driver.machines().unwrap().is_empty(),
        "the suite deleted its machines"
    );
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
