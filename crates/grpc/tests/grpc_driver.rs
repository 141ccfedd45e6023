//! The sim provider served over gRPC and driven through `GrpcDriver`: calls and answers cross the wire unchanged,
//! every machine code (17 included) and message survives, calls have deadlines, an unreachable provider is backed
//! off and found again when it comes back, the socket is private, and TCP is TLS with client certificates.

use std::{os::unix::fs::PermissionsExt, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Secret;
use mcm_api::{
    Machine, MachineClass,
    builders::{MachineBuilder, MachineClassBuilder},
};
use mcm_driver::{
    CreateMachineRequest, DeleteMachineRequest, Driver, DriverMethod, GetMachineStatusRequest,
    InitializeMachineRequest, ListMachinesRequest, MachineCode,
};
use mcm_grpc::{ClientOptions, Endpoint, GrpcDriver, ProviderInfo, TlsFiles};
use mcm_provider_sim::{Fault, Latency, SimConfig, SimDriver, Target};
use serde_json::json;
use tokio::{sync::oneshot, task::JoinHandle};

const DEADLINE: Duration = Duration::from_secs(30);

fn class() -> MachineClass {
    MachineClassBuilder::new("small")
        .namespace("default")
        .provider("sim")
        .provider_spec(
            json!({ "vmPool": "pool", "size": "small", "tags": { "kubernetes.io/cluster/c": "1" } }),
        )
        .secret_ref("boot", "default")
        .build()
}

fn secret() -> Secret {
    serde_json::from_value(json!({
        "metadata": { "name": "boot", "namespace": "default" },
        "data": { "userData": "IyEvYmluL3NoCmVjaG8gc2VjcmV0Cg==" }
    }))
    .unwrap()
}

/// A machine of [`class`].
fn machine(name: &str) -> Machine {
    MachineBuilder::new(name)
        .namespace("default")
        .class("small")
        .build()
}

fn create(name: &str) -> CreateMachineRequest {
    CreateMachineRequest {
        machine: machine(name),
        machine_class: class(),
        secret: secret(),
    }
}

fn info() -> ProviderInfo {
    ProviderInfo {
        name: "sim".into(),
        version: "test".into(),
        optional_methods: vec![
            DriverMethod::InitializeMachine,
            DriverMethod::GetMachineStatus,
            DriverMethod::ListMachines,
            DriverMethod::GetVolumeIds,
            DriverMethod::GenerateMachineClassForMigration,
        ],
    }
}

struct Served {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), mcm_grpc::ServeError>>,
}

impl Served {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("the server stops in time")
            .expect("the server task ends")
            .expect("the server ends cleanly");
    }
}

fn serve(driver: &SimDriver, endpoint: &Endpoint, tls: Option<TlsFiles>) -> Served {
    let (stop, stopped) = oneshot::channel::<()>();
    let driver: Arc<dyn Driver> = Arc::new(driver.clone());
    let endpoint = endpoint.clone();
    let task = tokio::spawn(async move {
        mcm_grpc::serve(driver, info(), &endpoint, tls.as_ref(), async move {
            let _ = stopped.await;
        })
        .await
    });
    Served {
        stop: Some(stop),
        task,
    }
}

/// Polls until the provider answers its probe.
async fn wait_ready(client: &GrpcDriver) {
    tokio::time::timeout(DEADLINE, async {
        while client.probe().await.ok() != Some(true) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the provider becomes ready");
}

fn fast_options() -> ClientOptions {
    ClientOptions {
        backoff_base: Duration::from_millis(100),
        backoff_cap: Duration::from_millis(400),
        ..ClientOptions::default()
    }
}

#[tokio::test]
async fn calls_cross_a_unix_socket_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::Unix(dir.path().join("provider.sock"));
    let sim = SimDriver::new(SimConfig::default());
    let server = serve(&sim, &endpoint, None);
    let client = GrpcDriver::new(endpoint.clone(), fast_options()).unwrap();
    wait_ready(&client).await;

    let mode = std::fs::metadata(dir.path().join("provider.sock"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "only the owner may talk to the provider");

    let (identity, protocol) = client.provider_info().await.unwrap();
    assert_eq!((identity, protocol.as_str()), (info(), "v1"));

    // The same answers as the provider in process gives.
    let created = client.create_machine(&create("m-1")).await.unwrap();
    assert!(!created.provider_id.is_empty());
    assert_eq!(sim.vms().len(), 1);
    let again = client.create_machine(&create("m-1")).await.unwrap();
    assert_eq!(
        again.provider_id, created.provider_id,
        "idempotent through the wire"
    );
    // The sim has something to initialise: Uninitialized (code 17, not a gRPC code) crosses the wire unchanged
    // until InitializeMachine succeeds.
    let status_request = GetMachineStatusRequest {
        machine: machine("m-1"),
        machine_class: class(),
        secret: secret(),
    };
    let err = client.get_machine_status(&status_request).await.unwrap_err();
    assert_eq!(err.code, MachineCode::Uninitialized);
    let initialized = client
        .initialize_machine(&InitializeMachineRequest {
            machine: machine("m-1"),
            machine_class: class(),
            secret: secret(),
        })
        .await
        .unwrap();
    assert_eq!(initialized.provider_id, created.provider_id);
    let status = client
        .get_machine_status(&GetMachineStatusRequest {
            machine: machine("m-1"),
            machine_class: class(),
            secret: secret(),
        })
        .await
        .unwrap();
    assert_eq!(status.provider_id, created.provider_id);
    assert_eq!(status.addresses, created.addresses);
    let list = client
        .list_machines(&ListMachinesRequest {
            machine_class: class(),
            secret: secret(),
        })
        .await
        .unwrap();
    assert_eq!(
        list.machine_list.get(&created.provider_id).map(String::as_str),
        Some("m-1")
    );
    client
        .delete_machine(&DeleteMachineRequest {
            machine: machine("m-1"),
            machine_class: class(),
            secret: secret(),
        })
        .await
        .unwrap();
    assert!(sim.vms().is_empty());
    let gone = client
        .get_machine_status(&GetMachineStatusRequest {
            machine: machine("m-1"),
            machine_class: class(),
            secret: secret(),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code, MachineCode::NotFound);
    server.stop().await;
    assert!(
        !dir.path().join("provider.sock").exists(),
        "the socket is removed at shutdown"
    );
}

#[tokio::test]
async fn every_machine_code_and_message_reaches_the_controller_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::Unix(dir.path().join("p.sock"));
    let sim = SimDriver::new(SimConfig::default());
    let server = serve(&sim, &endpoint, None);
    let client = GrpcDriver::new(endpoint, fast_options()).unwrap();
    wait_ready(&client).await;
    for code in MachineCode::ALL.into_iter().filter(|c| *c != MachineCode::Ok) {
        let name = format!("m-{}", code.number());
        let message = format!("provider says {code}: quota = 0 ✓");
        sim.faults().inject(
            Fault::new(DriverMethod::CreateMachine, code)
                .target(Target::machines([name.clone()]))
                .message(message.clone()),
        );
        let error = client.create_machine(&create(&name)).await.unwrap_err();
        assert_eq!(error.code, code, "{code}");
        assert!(error.message.contains(&message), "{code}: {}", error.message);
    }
    server.stop().await;
}

/// A provider message far larger than HTTP/2's header list limit (it travels in the trailers) still brings its
/// machine code across, cut to a bounded length, instead of failing the call as `Internal: h2 protocol error`.
#[tokio::test]
async fn a_huge_provider_message_keeps_its_code_and_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::Unix(dir.path().join("p.sock"));
    let sim = SimDriver::new(SimConfig::default());
    let server = serve(&sim, &endpoint, None);
    let client = GrpcDriver::new(endpoint, fast_options()).unwrap();
    wait_ready(&client).await;
    let message = format!("quota exceeded: {}✓", "x".repeat(64 * 1024));
    sim.faults().inject(
        Fault::new(DriverMethod::CreateMachine, MachineCode::ResourceExhausted)
            .target(Target::machines(["huge".to_owned()]))
            .message(message.clone()),
    );
    let error = client.create_machine(&create("huge")).await.unwrap_err();
    assert_eq!(error.code, MachineCode::ResourceExhausted, "{}", error.message);
    assert!(
        error.message.starts_with("quota exceeded: xxx"),
        "{}",
        error.message
    );
    assert!(error.message.contains("more bytes cut"), "{}", error.message);
    assert!(error.message.len() < 4096, "{} bytes", error.message.len());
    server.stop().await;
}

#[tokio::test]
async fn a_call_longer_than_its_deadline_is_deadline_exceeded() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::Unix(dir.path().join("p.sock"));
    let sim = SimDriver::new(SimConfig::default());
    let server = serve(&sim, &endpoint, None);
    let client = GrpcDriver::new(
        endpoint,
        ClientOptions {
            call_timeout: Duration::from_millis(300),
            ..fast_options()
        },
    )
    .unwrap();
    wait_ready(&client).await;
    sim.faults().set_latency(
        DriverMethod::CreateMachine,
        Latency::Fixed(Duration::from_secs(5)),
    );
    let error = client.create_machine(&create("slow")).await.unwrap_err();
    assert_eq!(error.code, MachineCode::DeadlineExceeded, "{}", error.message);
    server.stop().await;
}

#[tokio::test]
async fn an_unreachable_provider_is_backed_off_and_found_again() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::Unix(dir.path().join("p.sock"));
    let client = GrpcDriver::new(endpoint.clone(), fast_options()).unwrap();
    let first = client.create_machine(&create("m")).await.unwrap_err();
    assert_eq!(first.code, MachineCode::Unavailable);
    assert!(first.message.contains("unreachable"), "{}", first.message);
    // In back-off: the next call fails at once without dialing, and says when it tries again.
    let second = client.create_machine(&create("m")).await.unwrap_err();
    assert_eq!(second.code, MachineCode::Unavailable);
    assert!(second.message.contains("next attempt in"), "{}", second.message);

    // The provider comes up: calls succeed once the back-off has passed.
    let sim = SimDriver::new(SimConfig::default());
    let server = serve(&sim, &endpoint, None);
    let created = tokio::time::timeout(DEADLINE, async {
        loop {
            match client.create_machine(&create("m")).await {
                Ok(created) => return created,
                Err(err) => {
                    assert_eq!(err.code, MachineCode::Unavailable, "{}", err.message);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    })
    .await
    .expect("the provider is found again");
    assert!(!created.provider_id.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn a_second_provider_cannot_take_a_live_socket() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::Unix(dir.path().join("p.sock"));
    let sim = SimDriver::new(SimConfig::default());
    let server = serve(&sim, &endpoint, None);
    wait_ready(&GrpcDriver::new(endpoint.clone(), fast_options()).unwrap()).await;
    let err = mcm_grpc::serve(Arc::new(sim.clone()), info(), &endpoint, None, async {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("in use"), "{err}");
    server.stop().await;
}

/// A CA, and a certificate signed by it for `name` (server: a DNS name; client: a common name).
struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_params: rcgen::CertificateParams,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new(name: &str) -> Self {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} CA"));
        let ca = params.self_signed(&ca_key).unwrap();
        let pki = Self {
            dir: tempfile::tempdir().unwrap(),
            ca,
            ca_params: params,
            ca_key,
        };
        std::fs::write(pki.dir.path().join("ca.pem"), pki.ca.pem()).unwrap();
        pki
    }

    fn issue(&self, file: &str, dns: &str, client: bool) -> (std::path::PathBuf, std::path::PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![dns.to_owned()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, dns);
        params.extended_key_usages = vec![if client {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        }];
        let issuer = rcgen::Issuer::new(self.ca_params.clone(), &self.ca_key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let cert_path = self.dir.path().join(format!("{file}.pem"));
        let key_path = self.dir.path().join(format!("{file}-key.pem"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    fn ca(&self) -> std::path::PathBuf {
        self.dir.path().join("ca.pem")
    }
}

#[tokio::test]
async fn tcp_is_tls_and_refuses_a_client_without_a_trusted_certificate() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pki = Pki::new("mcm");
    let (server_cert, server_key) = pki.issue("server", "localhost", false);
    let (client_cert, client_key) = pki.issue("client", "machine-controller", true);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = Endpoint::Tcp(format!("localhost:{port}"));
    let sim = SimDriver::new(SimConfig::default());
    let server = serve(
        &sim,
        &Endpoint::Tcp(format!("127.0.0.1:{port}")),
        Some(TlsFiles {
            cert: server_cert,
            key: server_key,
            ca: pki.ca(),
        }),
    );
    let trusted = GrpcDriver::new(
        endpoint.clone(),
        ClientOptions {
            tls: Some(TlsFiles {
                cert: client_cert,
                key: client_key,
                ca: pki.ca(),
            }),
            ..fast_options()
        },
    )
    .unwrap();
    wait_ready(&trusted).await;
    assert!(
        !trusted
            .create_machine(&create("m"))
            .await
            .unwrap()
            .provider_id
            .is_empty()
    );

    // A client whose certificate another CA signed is refused.
    let other = Pki::new("other");
    let (bad_cert, bad_key) = other.issue("client", "intruder", true);
    let stranger = GrpcDriver::new(
        endpoint.clone(),
        ClientOptions {
            tls: Some(TlsFiles {
                cert: bad_cert,
                key: bad_key,
                ca: pki.ca(),
            }),
            ..fast_options()
        },
    )
    .unwrap();
    let refused = stranger.create_machine(&create("x")).await.unwrap_err();
    assert_eq!(refused.code, MachineCode::Unavailable, "{}", refused.message);
    assert_eq!(sim.vms().len(), 1, "nothing was created for the stranger");

    // And TCP without TLS is not offered at all.
    assert!(GrpcDriver::new(endpoint, ClientOptions::default()).is_err());
    server.stop().await;
}
