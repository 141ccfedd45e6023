//! The MCMMachine controller against the embedded API server with Cluster API's `clusters` and `machines` CRDs
//! (minimal fixtures) and our two, and the sim provider in process. The test stands in for the Cluster API core
//! controllers: it creates the Cluster and the Machine, sets the MCMMachine's ownerReference, and flips the
//! Cluster's infrastructure and the Machine's bootstrap data. Each test has its own server and temp dir; every wait
//! is a poll with a deadline.

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    api::core::v1::Secret, apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use mcm_api::MachineClass;
use mcm_apiserver::{ApiServer, Config as ServerConfig};
use mcm_capi::{MCMMachine, controller::Config, types::FINALIZER};
use mcm_provider_sim::{SimConfig, SimDriver};
use serde_json::{Value, json};
use tokio::{sync::oneshot, task::JoinHandle};

const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(25);
const NS: &str = "default";
const BOOTSTRAP_DATA: &str = "#!/bin/sh\necho bootstrap-secret-s3cr3t\n";
const CREDENTIAL: &str = "credential-s3cr3t";

fn crd(yaml: &str) -> CustomResourceDefinition {
    let value: Value = serde_saphyr::from_str(yaml).expect("the fixture is YAML");
    serde_json::from_value(value).expect("the fixture is a CRD")
}

fn capi(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "cluster.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn sim_spec() -> Value {
    json!({ "vmPool": "pool-a", "size": "small", "tags": { "cluster": "c1" } })
}

struct World {
    _server: ApiServer,
    _dir: tempfile::TempDir,
    client: Client,
    driver: SimDriver,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl World {
    /// Server, CRDs (Cluster API's two and ours), secrets, sim provider and the controller.
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut config = ServerConfig::new(dir.path());
        config.in_memory = true;
        let server = ApiServer::start(config).await.expect("the API server starts");
        let file = Kubeconfig::read_from(server.kubeconfig()).expect("its kubeconfig");
        let mut kube_config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
            .await
            .expect("a client configuration");
        kube_config.default_retry = false;
        let client = Client::try_from(kube_config).expect("a client");
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let mut all = vec![
            crd(include_str!("fixtures/cluster-crd.yaml")),
            crd(include_str!("fixtures/machine-crd.yaml")),
        ];
        all.extend(mcm_capi::crd::all().expect("our CRDs"));
        for c in &all {
            crds.create(&PostParams::default(), c)
                .await
                .expect("the CRD is accepted");
        }
        let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
        for (name, key, value) in [("boot", "value", BOOTSTRAP_DATA), ("creds", "token", CREDENTIAL)] {
            let secret: Secret = serde_json::from_value(json!({
                "metadata": { "name": name },
                "stringData": { key: value },
            }))
            .unwrap();
            secrets
                .create(&PostParams::default(), &secret)
                .await
                .expect("a secret");
        }
        let driver = SimDriver::new(SimConfig::default());
        let mut world = Self {
            _server: server,
            _dir: dir,
            client,
            driver,
            stop: None,
            task: None,
        };
        world.start_controller();
        world
    }

    fn start_controller(&mut self) {
        let mut config = Config {
            namespace: Some(NS.into()),
            wait_resync: Duration::from_millis(300),
            discovery_retry: Duration::from_millis(100),
            ..Config::default()
        };
        config.retry.backoff_base = Duration::from_millis(100);
        config.retry.backoff_cap = Duration::from_secs(1);
        let (stop, stopped) = oneshot::channel::<()>();
        let driver: Arc<dyn mcm_driver::Driver> = Arc::new(self.driver.clone());
        let client = self.client.clone();
        self.task = Some(tokio::spawn(async move {
            mcm_capi::run(client, driver, config, async {
                let _ = stopped.await;
            })
            .await
            .expect("the controller runs");
        }));
        self.stop = Some(stop);
    }

    fn infra(&self) -> Api<MCMMachine> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn clusters(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NS, &capi("Cluster", "clusters"))
    }

    fn machines(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NS, &capi("Machine", "machines"))
    }

    async fn create_infra(&self, name: &str, spec: Value) -> MCMMachine {
        let meta = json!({ "name": name, "labels": { "cluster.x-k8s.io/cluster-name": "c1" } });
        let object: MCMMachine =
            serde_json::from_value(json!({ "metadata": meta, "spec": spec })).expect("an MCMMachine");
        self.infra()
            .create(&PostParams::default(), &object)
            .await
            .expect("created")
    }

    /// A Cluster; its infrastructure provisioned or not (v1beta2 `status.initialization`).
    async fn create_cluster(&self, spec: Value, infrastructure_provisioned: bool) {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": { "name": "c1" }, "spec": spec,
        }))
        .unwrap();
        self.clusters()
            .create(&PostParams::default(), &object)
            .await
            .expect("a Cluster");
        self.set_infrastructure(infrastructure_provisioned).await;
    }

    async fn set_infrastructure(&self, provisioned: bool) {
        self.clusters()
            .patch_status(
                "c1",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "status": { "initialization": { "infrastructureProvisioned": provisioned } } }),
                ),
            )
            .await
            .expect("Cluster status");
    }

    /// A Machine of cluster c1 whose infrastructureRef names the MCMMachine `infra`, and the MCMMachine's
    /// ownerReference to it (what the Cluster API Machine controller does).
    async fn create_owner(&self, name: &str, infra: &str, data_secret: Option<&str>) {
        let mut spec = json!({
            "clusterName": "c1",
            "bootstrap": {},
            "infrastructureRef": { "apiGroup": "infrastructure.machine.sapcloud.io", "kind": "MCMMachine", "name": infra },
        });
        if let Some(secret) = data_secret {
            spec["bootstrap"]["dataSecretName"] = json!(secret);
        }
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": { "name": name }, "spec": spec,
        }))
        .unwrap();
        let machine = self
            .machines()
            .create(&PostParams::default(), &object)
            .await
            .expect("a Machine");
        self.infra()
            .patch(
                infra,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "ownerReferences": [{
                    "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                    "name": name, "uid": machine.uid().unwrap(),
                }]}})),
            )
            .await
            .expect("ownerReference set");
    }

    /// Waits until the MCMMachine satisfies `check`; panics with `what` and the last object after the deadline.
    async fn wait_infra(&self, name: &str, what: &str, check: impl Fn(&MCMMachine) -> bool) -> MCMMachine {
        let start = tokio::time::Instant::now();
        loop {
            let current = self.infra().get_opt(name).await.expect("get");
            if let Some(m) = &current
                && check(m)
            {
                return m.clone();
            }
            assert!(
                start.elapsed() < DEADLINE,
                "timed out waiting for {what}: {current:#?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    async fn wait_gone(&self, name: &str) {
        let start = tokio::time::Instant::now();
        while self.infra().get_opt(name).await.expect("get").is_some() {
            assert!(start.elapsed() < DEADLINE, "timed out waiting for {name} to go");
            tokio::time::sleep(POLL).await;
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}

fn ready_reason(m: &MCMMachine) -> Option<&str> {
    m.condition("Ready").and_then(|c| c.reason.as_deref())
}

fn inline_spec(provider_spec: &Value) -> Value {
    json!({ "providerSpec": provider_spec, "secretRef": { "name": "creds", "namespace": NS } })
}

/// Spec 001 "Normal resource", step by step: each exit holds the reconcile (no VM, no finalizer before the Cluster
/// exists), then "Set `spec.providerID`", "Set `status.ready` to `true`", "Set `status.addresses`"; "Deleted
/// resource": "Perform deletion of provider-specific machine infrastructure", then "Remove the provider-specific
/// finalizer".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_exit_of_spec_001_holds_then_the_machine_is_provisioned_and_deleted() {
    let w = World::start().await;
    w.create_infra("m1", inline_spec(&sim_spec())).await;

    // "If the resource does not have a `Machine` owner, exit the reconciliation": nothing is written.
    let start = tokio::time::Instant::now();
    while start.elapsed() < Duration::from_millis(600) {
        let m = w.infra().get("m1").await.unwrap();
        assert!(m.status.is_none() && m.finalizers().is_empty(), "{m:#?}");
        tokio::time::sleep(POLL).await;
    }

    // "If the `Cluster` to which this resource belongs cannot be found, exit the reconciliation" (before the
    // finalizer is added).
    w.create_owner("machine-1", "m1", None).await;
    let m = w
        .wait_infra("m1", "Ready=False WaitingForCluster", |m| {
            ready_reason(m) == Some("WaitingForCluster")
        })
        .await;
    assert!(
        m.finalizers().is_empty(),
        "no finalizer before the Cluster exists"
    );
    assert!(w.driver.vms().is_empty());

    // "Add the provider-specific finalizer"; "If the associated `Cluster`'s `status.infrastructureReady` is
    // `false`, exit the reconciliation".
    w.create_cluster(json!({}), false).await;
    let m = w
        .wait_infra("m1", "WaitingForClusterInfrastructure", |m| {
            ready_reason(m) == Some("WaitingForClusterInfrastructure")
        })
        .await;
    assert!(m.finalizers().iter().any(|f| f == FINALIZER), "{m:#?}");
    assert!(w.driver.vms().is_empty());

    // "If the associated `Machine`'s `spec.bootstrap.dataSecretName` is `nil`, exit the reconciliation".
    w.set_infrastructure(true).await;
    w.wait_infra("m1", "WaitingForBootstrapData", |m| {
        ready_reason(m) == Some("WaitingForBootstrapData")
    })
    .await;
    assert!(w.driver.vms().is_empty());

    // Bootstrap data: the VM is created with it as userData, then providerID, ready, provisioned, addresses.
    w.machines()
        .patch(
            "machine-1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "bootstrap": { "dataSecretName": "boot" } } })),
        )
        .await
        .unwrap();
    let m = w
        .wait_infra("m1", "provisioned", |m| {
            m.status.as_ref().is_some_and(|s| s.ready)
        })
        .await;
    let status = m.status.clone().unwrap();
    assert_eq!(m.spec.provider_id.as_deref(), Some("sim:///default/m1"));
    assert_eq!(
        status.initialization.as_ref().and_then(|i| i.provisioned),
        Some(true)
    );
    assert!(
        status
            .addresses
            .iter()
            .any(|a| a.type_ == "Hostname" && a.address == "m1"),
        "{status:#?}"
    );
    let ready = m.condition("Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("True", Some("Provisioned"))
    );
    assert_eq!(m.condition("Paused").map(|c| c.status.as_str()), Some("False"));
    let vms = w.driver.vms();
    assert_eq!(vms.len(), 1, "exactly one VM");
    assert_eq!(vms[0].user_data.as_bytes(), BOOTSTRAP_DATA.as_bytes());
    // Spec 002 section 11: a new VM is initialized before it is used (the sim has something to initialise).
    assert!(
        w.driver.uninitialized_machines().is_empty(),
        "the VM is initialized: {:?}",
        w.driver.uninitialized_machines()
    );
    // Secrets never surface on the object.
    let text = serde_json::to_string(&m).unwrap();
    assert!(!text.contains("s3cr3t"), "{text}");

    // Deletion: the VM goes, then the finalizer, then the object.
    w.infra().delete("m1", &DeleteParams::default()).await.unwrap();
    w.wait_gone("m1").await;
    assert!(
        w.driver.vms().is_empty(),
        "the VM was deleted before the finalizer went"
    );
    w.stop().await;
}

/// Spec 001: "If they are terminal failures, set `status.failureReason` and `status.failureMessage`", and then "If
/// the resource has `status.failureReason` or `status.failureMessage` set, exit the reconciliation": a bad
/// providerSpec, a class with a bad providerSpec and a spec with both sources create nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_is_a_terminal_failure_and_creates_nothing() {
    let w = World::start().await;
    w.create_cluster(json!({}), true).await;
    let classes: Api<MachineClass> = Api::namespaced(w.client.clone(), NS);
    let class: MachineClass = serde_json::from_value(json!({
        "metadata": { "name": "bad-class" },
        "providerSpec": { "vmPool": "pool-a", "size": "huge", "tags": { "cluster": "c1" } },
        "secretRef": { "name": "creds", "namespace": NS },
    }))
    .unwrap();
    classes.create(&PostParams::default(), &class).await.unwrap();

    let cases = [
        (
            "bad-inline",
            inline_spec(&json!({ "vmPool": "pool-a", "size": "huge", "tags": { "cluster": "c1" } })),
        ),
        ("bad-class", json!({ "classRef": { "name": "bad-class" } })),
        (
            "both",
            json!({ "classRef": { "name": "bad-class" }, "providerSpec": sim_spec() }),
        ),
    ];
    for (name, spec) in cases {
        w.create_infra(name, spec).await;
        w.create_owner(&format!("owner-{name}"), name, Some("boot")).await;
    }
    for name in ["bad-inline", "bad-class", "both"] {
        let m = w
            .wait_infra(name, "failureReason", |m| {
                m.status.as_ref().is_some_and(|s| s.failure_reason.is_some())
            })
            .await;
        let status = m.status.clone().unwrap();
        assert_eq!(
            status.failure_reason.as_deref(),
            Some("InvalidConfiguration"),
            "{name}"
        );
        assert!(status.failure_message.as_deref().is_some_and(|s| !s.is_empty()));
        assert!(!status.ready);
        let ready = m.condition("Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.severity.as_deref()),
            ("False", Some("Error"))
        );
        assert!(!serde_json::to_string(&m).unwrap().contains("s3cr3t"));
    }
    assert!(w.driver.vms().is_empty(), "nothing was created");
    // Terminal: a later change of the Cluster does not bring a creation.
    w.set_infrastructure(false).await;
    w.set_infrastructure(true).await;
    assert!(w.driver.vms().is_empty());
    // Deleting a failed MCMMachine that never got a VM removes the finalizer.
    w.infra()
        .delete("bad-inline", &DeleteParams::default())
        .await
        .unwrap();
    w.wait_gone("bad-inline").await;
    w.stop().await;
}

/// Pausing (A1: "Skip reconcile when `Cluster.spec.paused` is set or the object has the `cluster.x-k8s.io/paused`
/// annotation, and surface a `Paused` condition"): nothing is created while paused; unpausing provisions, here from
/// a MachineClass (`classRef`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_cluster_or_annotation_holds_the_reconcile() {
    let w = World::start().await;
    let classes: Api<MachineClass> = Api::namespaced(w.client.clone(), NS);
    let class: MachineClass = serde_json::from_value(json!({
        "metadata": { "name": "good" },
        "providerSpec": sim_spec(),
        "secretRef": { "name": "creds", "namespace": NS },
    }))
    .unwrap();
    classes.create(&PostParams::default(), &class).await.unwrap();
    w.create_cluster(json!({ "paused": true }), true).await;
    w.create_infra("p1", json!({ "classRef": { "name": "good" } }))
        .await;
    w.create_owner("owner-p1", "p1", Some("boot")).await;
    let m = w
        .wait_infra("p1", "Paused=True", |m| {
            m.condition("Paused").is_some_and(|c| c.status == "True")
        })
        .await;
    assert!(m.finalizers().is_empty() && w.driver.vms().is_empty(), "{m:#?}");

    // Unpause the Cluster but annotate the object.
    w.infra()
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "cluster.x-k8s.io/paused": "" } } })),
        )
        .await
        .unwrap();
    w.clusters()
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "paused": false } })),
        )
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    while start.elapsed() < Duration::from_millis(600) {
        let m = w.infra().get("p1").await.unwrap();
        assert_eq!(m.condition("Paused").map(|c| c.status.as_str()), Some("True"));
        assert!(w.driver.vms().is_empty());
        tokio::time::sleep(POLL).await;
    }

    // Unpaused: provisioned from the class.
    w.infra()
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "cluster.x-k8s.io/paused": null } } })),
        )
        .await
        .unwrap();
    let m = w
        .wait_infra("p1", "provisioned", |m| {
            m.status.as_ref().is_some_and(|s| s.ready)
        })
        .await;
    assert_eq!(m.condition("Paused").map(|c| c.status.as_str()), Some("False"));
    assert_eq!(w.driver.vms().len(), 1);
    assert_eq!(w.driver.vms()[0].class_name, "good");
    w.stop().await;
}
