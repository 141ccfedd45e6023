//! The machine deletion flow (issue 6) against the embedded API server over HTTPS with the sim provider and its
//! kubelet: crashes after every step, lifecycle hooks, PodDisruptionBudgets, the volume-aware serial eviction
//! order, the drain labels, force drain on a NotReady node, a node that never joined, and the controller's own
//! machine. Every wait polls or watches with a deadline; the controller runs with short settings (eviction passes
//! every 200 ms, back-off from 200 ms) so that each test takes seconds.
//!
//! Crashes are injected deterministically: the controller's API client carries a layer that holds a chosen request
//! before it is sent (and its provider a wrapper that holds a chosen call); once the test sees the request held it
//! aborts the controller task, so the request is never made, and starts a new controller on the same server and
//! provider.

use std::{
    collections::BTreeMap,
    future::Future,
    path::PathBuf,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret},
    policy::v1::PodDisruptionBudget,
    storage::v1::VolumeAttachment,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::watcher,
};
use mcm_api::{
    Machine, MachineClass, MachinePhase,
    builders::{MachineBuilder, MachineClassBuilder, PodBuilder},
    keys,
};
use mcm_apiserver::{ApiServer, Config as ServerConfig};
use mcm_controllers::machine;
use mcm_core::{ControllerSettings, deletion::DeletionStep};
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, DriverMethod, GenerateMachineClassForMigrationRequest,
    GenerateMachineClassForMigrationResponse, GetMachineStatusRequest, GetMachineStatusResponse,
    GetVolumeIdsRequest, GetVolumeIdsResponse, InitializeMachineRequest, InitializeMachineResponse,
    ListMachinesRequest, ListMachinesResponse,
};
use mcm_provider_sim::{CSI_DRIVER, Kubelet, KubeletConfig, KubeletHandle, SimConfig, SimDriver};
use serde_json::{Value, json};
use tokio::sync::watch;

const DEADLINE: Duration = Duration::from_secs(40);
const NAMESPACE: &str = "default";

// ---------------------------------------------------------------------------------------------------------------
// The gate: holds a chosen request of the controller (HTTP or provider call) until the controller is aborted.
// ---------------------------------------------------------------------------------------------------------------

/// A request the controller makes.
#[derive(Clone, Debug)]
enum Call {
    Http {
        method: String,
        path: String,
        body: String,
    },
    Driver(DriverMethod),
    /// Not a request: the provider wrapper saw a DeleteMachine remove the VM.
    VmRemoved,
}

type Matcher = Arc<dyn Fn(&Call) -> bool + Send + Sync>;

/// An HTTP request with this method whose path ends with `path` and whose body contains `body`.
fn http(method: &'static str, path: &'static str, body: &'static str) -> Matcher {
    Arc::new(
        move |call| matches!(call, Call::Http { method: m, path: p, body: b } if m == method && p.ends_with(path) && b.contains(body)),
    )
}

/// An HTTP request with this method whose path contains `part`.
fn http_containing(method: &'static str, part: &'static str) -> Matcher {
    Arc::new(
        move |call| matches!(call, Call::Http { method: m, path: p, .. } if m == method && p.contains(part)),
    )
}

fn provider_call(method: DriverMethod) -> Matcher {
    Arc::new(move |call| matches!(call, Call::Driver(m) if *m == method))
}

/// Hold the first call matching `hold` (after one matching `after` has completed, if given).
struct Rule {
    after: Option<Matcher>,
    hold: Matcher,
}

#[derive(Default)]
struct GateState {
    rule: Option<Rule>,
    armed: bool,
    log: Vec<Call>,
}

#[derive(Clone)]
struct Gate {
    state: Arc<Mutex<GateState>>,
    held: Arc<watch::Sender<u64>>,
}

impl Gate {
    fn new() -> Self {
        Self {
            state: Arc::default(),
            held: Arc::new(watch::Sender::new(0)),
        }
    }

    fn set(&self, rule: Rule) {
        let mut state = self.state.lock().unwrap();
        state.armed = rule.after.is_none();
        state.rule = Some(rule);
    }

    fn clear(&self) {
        self.state.lock().unwrap().rule = None;
    }

    fn log(&self) -> Vec<Call> {
        self.state.lock().unwrap().log.clone()
    }

    fn note(&self, call: Call) {
        self.state.lock().unwrap().log.push(call);
    }

    /// Logs the call; holds it for ever when it is the one to hold.
    async fn enter(&self, call: &Call) {
        let hold = {
            let mut state = self.state.lock().unwrap();
            state.log.push(call.clone());
            let hold = state.armed && state.rule.as_ref().is_some_and(|r| (r.hold)(call));
            if hold {
                state.rule = None;
            }
            hold
        };
        if hold {
            self.held.send_modify(|n| *n += 1);
            std::future::pending::<()>().await;
        }
    }

    fn done(&self, call: &Call) {
        let mut state = self.state.lock().unwrap();
        if state
            .rule
            .as_ref()
            .and_then(|r| r.after.as_ref())
            .is_some_and(|after| after(call))
        {
            state.armed = true;
        }
    }

    /// Waits until `count` calls have been held in all.
    async fn wait_held(&self, count: u64, what: &str) {
        let mut rx = self.held.subscribe();
        tokio::time::timeout(DEADLINE, rx.wait_for(|n| *n >= count))
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for the controller to reach {what}"))
            .unwrap();
    }
}

#[derive(Clone)]
struct GateLayer(Gate);

impl<S> tower::Layer<S> for GateLayer {
    type Service = GateService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GateService {
            inner,
            gate: self.0.clone(),
        }
    }
}

struct GateService<S> {
    inner: S,
    gate: Gate,
}

impl<S> tower::Service<http::Request<kube::client::Body>> for GateService<S>
where
    S: tower::Service<http::Request<kube::client::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        // kube's request bodies are in memory: reading a clone completes at once.
        let body = request
            .body()
            .try_clone()
            .and_then(|b| b.collect_bytes().now_or_never())
            .and_then(Result::ok)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let call = Call::Http {
            method: request.method().to_string(),
            path: request.uri().path().to_owned(),
            body,
        };
        // Nothing is sent before the returned future is polled.
        let response = self.inner.call(request);
        let gate = self.gate.clone();
        Box::pin(async move {
            gate.enter(&call).await;
            let result = response.await;
            gate.done(&call);
            result
        })
    }
}

/// The sim provider as the controller sees it: every call goes through the gate, and a DeleteMachine that removed
/// a VM is counted.
struct Provider {
    sim: SimDriver,
    gate: Gate,
    removals: AtomicU64,
}

impl Provider {
    fn vms_of(&self, machine: &str) -> usize {
        self.sim
            .vms()
            .iter()
            .filter(|vm| vm.machine_name == machine)
            .count()
    }

    async fn around<T>(&self, method: DriverMethod, call: impl Future<Output = T>) -> T {
        let logged = Call::Driver(method);
        self.gate.enter(&logged).await;
        let result = call.await;
        self.gate.done(&logged);
        result
    }
}

#[async_trait::async_trait]
impl Driver for Provider {
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        self.around(DriverMethod::CreateMachine, self.sim.create_machine(request))
            .await
    }

    async fn initialize_machine(
        &self,
        request: &InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        self.around(
            DriverMethod::InitializeMachine,
            self.sim.initialize_machine(request),
        )
        .await
    }

    async fn delete_machine(
        &self,
        request: &DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        let name = request.machine.name_any();
        self.around(DriverMethod::DeleteMachine, async {
            let before = self.vms_of(&name);
            let result = self.sim.delete_machine(request).await;
            if self.vms_of(&name) < before {
                self.removals.fetch_add(1, Ordering::SeqCst);
                self.gate.note(Call::VmRemoved);
            }
            result
        })
        .await
    }

    async fn get_machine_status(
        &self,
        request: &GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        self.around(
            DriverMethod::GetMachineStatus,
            self.sim.get_machine_status(request),
        )
        .await
    }

    async fn list_machines(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        self.around(DriverMethod::ListMachines, self.sim.list_machines(request))
            .await
    }

    async fn get_volume_ids(
        &self,
        request: &GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        self.around(DriverMethod::GetVolumeIds, self.sim.get_volume_ids(request))
            .await
    }

    async fn generate_machine_class_for_migration(
        &self,
        request: &GenerateMachineClassForMigrationRequest,
    ) -> Result<GenerateMachineClassForMigrationResponse, DriverError> {
        self.around(
            DriverMethod::GenerateMachineClassForMigration,
            self.sim.generate_machine_class_for_migration(request),
        )
        .await
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Watch recorders
// ---------------------------------------------------------------------------------------------------------------

/// Every version of the objects of a kind a watch delivered: (resourceVersion, deleted, object).
struct Recording<K> {
    events: Arc<Mutex<Vec<(u64, bool, K)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Drop for Recording<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K: Clone + Resource> Recording<K> {
    fn events(&self) -> Vec<(u64, bool, K)> {
        self.events.lock().unwrap().clone()
    }

    /// Waits until the watch has delivered the deletion of `name` (the recording has caught up with it).
    async fn wait_deleted(&self, name: &str) {
        eventually(&format!("the watch to report {name} deleted"), || async {
            self.events
                .lock()
                .unwrap()
                .iter()
                .any(|(_, deleted, o)| *deleted && o.meta().name.as_deref() == Some(name))
                .then_some(())
        })
        .await;
    }
}

fn version<K: Resource>(object: &K) -> u64 {
    object
        .meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or_default()
}

/// Starts recording the objects of `api`; returns once the watch has listed them.
async fn record<K>(api: Api<K>) -> Recording<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    K: k8s_openapi::serde::de::DeserializeOwned,
{
    let events: Arc<Mutex<Vec<(u64, bool, K)>>> = Arc::default();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let sink = Arc::clone(&events);
    let task = tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    sink.lock().unwrap().push((version(&o), false, o));
                }
                Ok(watcher::Event::Delete(o)) => sink.lock().unwrap().push((version(&o), true, o)),
                Ok(watcher::Event::InitDone) => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                Ok(watcher::Event::Init) | Err(_) => {}
            }
        }
    });
    tokio::time::timeout(DEADLINE, ready_rx)
        .await
        .expect("the recording watch lists")
        .expect("the recording task runs");
    Recording { events, task }
}

// ---------------------------------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------------------------------

struct Running {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

struct Harness {
    server: Option<ApiServer>,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    /// The test's own client (no gate).
    client: Client,
    sim: SimDriver,
    provider: Arc<Provider>,
    gate: Gate,
    kubelet: Option<KubeletHandle>,
    controller: Option<Running>,
    settings: ControllerSettings,
}

/// Settings that make a deletion take seconds: a drain pass every 200 ms, back-off from 200 ms to 1 s, 1 s for a
/// volume to reattach elsewhere (nothing reattaches pods in most tests).
fn fast_settings() -> ControllerSettings {
    let mut settings = ControllerSettings {
        evict_retry_interval: Duration::from_millis(200),
        machine_pv_reattach_timeout: Duration::from_secs(1),
        ..ControllerSettings::default()
    };
    settings.retry.backoff_base = Duration::from_millis(200);
    settings.retry.backoff_cap = Duration::from_secs(1);
    settings
}

/// A machine `name` of the class `sim`.
fn sim_machine(name: &str) -> MachineBuilder {
    MachineBuilder::new(name).namespace(NAMESPACE).class("sim")
}

async fn client_from(kubeconfig: &std::path::Path, gate: Option<&Gate>) -> Client {
    let file = Kubeconfig::read_from(kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .unwrap();
    // The drain must see a PodDisruptionBudget's 429 at once (docs/pitfalls.md).
    config.default_retry = false;
    let builder = ClientBuilder::try_from(config).unwrap();
    match gate {
        Some(gate) => builder.with_layer(&GateLayer(gate.clone())).build(),
        None => builder.build(),
    }
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

impl Harness {
    /// A server, the sim provider with its kubelet (heartbeat 500 ms), a class and its secret, and a controller with
    /// `settings`.
    async fn start(settings: ControllerSettings) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ServerConfig::new(dir.path());
        config.in_memory = true;
        // PodDisruptionBudget status is recomputed every node monitor period.
        config.node_monitor_period = Duration::from_millis(100);
        let server = ApiServer::start(config).await.unwrap();
        let kubeconfig = server.kubeconfig().to_path_buf();
        let client = client_from(&kubeconfig, None).await;
        let sim = SimDriver::new(SimConfig::default());
        let gate = Gate::new();
        let provider = Arc::new(Provider {
            sim: sim.clone(),
            gate: gate.clone(),
            removals: AtomicU64::new(0),
        });
        let kubelet = Kubelet::start(
            &sim,
            client.clone(),
            KubeletConfig {
                heartbeat_interval: Duration::from_millis(500),
                ..KubeletConfig::default()
            },
        );
        let mut h = Self {
            server: Some(server),
            _dir: dir,
            kubeconfig,
            client,
            sim,
            provider,
            gate,
            kubelet: Some(kubelet),
            controller: None,
            settings,
        };
        h.create_class().await;
        h.start_controller().await;
        h
    }

    /// Starts a controller (a new one: fresh caches and memory) on the same server and provider.
    async fn start_controller(&mut self) {
        assert!(self.controller.is_none(), "one controller at a time");
        let client = client_from(&self.kubeconfig, Some(&self.gate)).await;
        let (stop, rx) = watch::channel(false);
        let (caches, shutdown) = crate::support::caches_until(&client, stopped(rx));
        let task = tokio::spawn(machine::run(
            client.clone(),
            Some(client),
            Arc::clone(&self.provider) as Arc<dyn Driver>,
            machine::Config {
                namespace: NAMESPACE.into(),
                settings: self.settings.clone(),
                concurrency: 4,
            },
            caches,
            machine::Extras::default(),
            shutdown,
        ));
        self.controller = Some(Running { stop, task });
    }

    /// Kills the controller where it is (a crash: its held request is never sent).
    async fn crash_controller(&mut self) {
        if let Some(running) = self.controller.take() {
            running.task.abort();
            let _ = running.task.await;
        }
    }

    async fn stop(mut self) {
        if let Some(running) = self.controller.take() {
            let _ = running.stop.send(true);
            assert!(
                tokio::time::timeout(DEADLINE, running.task).await.is_ok(),
                "the controller did not stop"
            );
        }
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.stop().await;
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }

    fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn attachments(&self) -> Api<VolumeAttachment> {
        Api::all(self.client.clone())
    }

    async fn create_class(&self) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": "boot", "namespace": NAMESPACE },
            "stringData": { "userData": "#!/bin/sh\necho <<MACHINE_NAME>>\n" }
        }))
        .unwrap();
        Api::<Secret>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let class = MachineClassBuilder::new("sim")
            .namespace(NAMESPACE)
            .provider("sim")
            .provider_spec(
                json!({ "vmPool": "pool-a", "size": "small", "tags": { "kubernetes.io/cluster/c": "1" } }),
            )
            .secret_ref("boot", NAMESPACE)
            .build();
        Api::<MachineClass>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }

    /// Creates `machine` and waits until it runs (its node joined and Ready).
    async fn create_running_machine(&self, machine: MachineBuilder) -> Machine {
        let name = self.create_machine(machine).await;
        self.wait_machine(&name, "Running", |m| m.phase() == Some(MachinePhase::Running))
            .await
    }

    /// Creates `machine` and returns its name.
    async fn create_machine(&self, machine: MachineBuilder) -> String {
        self.machines()
            .create(&PostParams::default(), &machine.build())
            .await
            .unwrap()
            .name_any()
    }

    /// A VM (and so a node, registered by the kubelet) without a Machine: a node of the cluster that this
    /// controller does not manage.
    async fn create_vm_without_machine(&self, name: &str) {
        let class = Api::<MachineClass>::namespaced(self.client.clone(), NAMESPACE)
            .get("sim")
            .await
            .unwrap();
        let secret = Api::<Secret>::namespaced(self.client.clone(), NAMESPACE)
            .get("boot")
            .await
            .unwrap();
        let machine = MachineBuilder::new(name).namespace(NAMESPACE).build();
        self.sim
            .create_machine(&CreateMachineRequest {
                machine,
                machine_class: class,
                secret,
            })
            .await
            .unwrap();
        eventually(&format!("node {name}"), || async {
            self.nodes().get_opt(name).await.unwrap()
        })
        .await;
    }

    async fn delete_machine(&self, name: &str) {
        self.machines()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    async fn machine(&self, name: &str) -> Option<Machine> {
        self.machines().get_opt(name).await.unwrap()
    }

    async fn wait_machine(&self, name: &str, what: &str, check: impl Fn(&Machine) -> bool) -> Machine {
        eventually(&format!("machine {name}: {what}"), || async {
            self.machine(name).await.filter(|m| check(m))
        })
        .await
    }

    async fn wait_machine_gone(&self, name: &str) {
        eventually(&format!("machine {name} gone"), || async {
            self.machine(name).await.is_none().then_some(())
        })
        .await;
    }

    /// Creates `pod`.
    async fn create_pod(&self, pod: PodBuilder) -> Pod {
        self.pods()
            .create(&PostParams::default(), &pod.build())
            .await
            .unwrap()
    }

    /// A claim `name` bound to a PersistentVolume `pv-<name>` of the sim CSI driver with handle `vol-<name>`.
    async fn create_volume(&self, name: &str) {
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": { "name": format!("pv-{name}") },
            "spec": {
                "capacity": { "storage": "1Gi" },
                "accessModes": ["ReadWriteOnce"],
                "csi": { "driver": CSI_DRIVER, "volumeHandle": format!("vol-{name}") },
                "claimRef": { "namespace": NAMESPACE, "name": name },
            }
        }))
        .unwrap();
        Api::<PersistentVolume>::all(self.client.clone())
            .create(&PostParams::default(), &pv)
            .await
            .unwrap();
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": NAMESPACE },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": { "requests": { "storage": "1Gi" } },
                "volumeName": format!("pv-{name}"),
            }
        }))
        .unwrap();
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &claim)
            .await
            .unwrap();
    }

    /// Waits until the kubelet has started the pod (Running and Ready).
    async fn wait_pod_ready(&self, name: &str) {
        eventually(&format!("pod {name} Ready"), || async {
            let pod = self.pods().get(name).await.unwrap();
            pod.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                .then_some(())
        })
        .await;
    }

    /// The VolumeAttachments as (PersistentVolume, node), attached ones only.
    async fn attached(&self) -> Vec<(String, String)> {
        let mut list: Vec<(String, String)> = self
            .attachments()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|va| va.status.as_ref().is_some_and(|s| s.attached))
            .map(|va| {
                (
                    va.spec.source.persistent_volume_name.unwrap_or_default(),
                    va.spec.node_name,
                )
            })
            .collect();
        list.sort();
        list
    }

    async fn all_attachments(&self) -> Vec<VolumeAttachment> {
        self.attachments()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    /// What must be true once a machine is deleted: its VM removed exactly once (DeleteMachine calls that removed
    /// a VM), never created again, no VM, no node, no VolumeAttachment of its node.
    async fn assert_nothing_left(&self, name: &str, creates: u64) {
        assert_eq!(
            self.provider.removals.load(Ordering::SeqCst),
            1,
            "DeleteMachine removed the VM exactly once"
        );
        assert_eq!(
            self.sim.faults().calls_for(DriverMethod::CreateMachine, name),
            creates,
            "no VM was created again"
        );
        assert!(
            self.sim.vms().iter().all(|vm| vm.machine_name != name),
            "no VM left"
        );
        assert!(
            self.nodes().get_opt(name).await.unwrap().is_none(),
            "no node left"
        );
        let left: Vec<String> = self
            .all_attachments()
            .await
            .iter()
            .filter(|va| va.spec.node_name == name)
            .map(ResourceExt::name_any)
            .collect();
        assert!(left.is_empty(), "VolumeAttachments left: {left:?}");
    }
}

/// A pod `name` of one container bound to `node`, with a grace period of 1 second.
fn bound_pod(name: &str, node: &str) -> PodBuilder {
    PodBuilder::new(name)
        .namespace(NAMESPACE)
        .node(node)
        .grace_period(1)
        .container("c", "busybox")
}

/// Polls `probe` every 25 ms until it returns `Some`, failing after the deadline.
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn description(machine: &Machine) -> String {
    machine
        .status
        .as_ref()
        .map(|s| s.last_operation.description.clone())
        .unwrap_or_default()
}

fn is_delete_operation(machine: &Machine) -> bool {
    machine
        .status
        .as_ref()
        .and_then(|s| s.last_operation.r#type)
        .is_some_and(|t| t.as_str() == "Delete")
}

fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn unschedulable(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// The resourceVersion at which each pod of the recording first showed a deletionTimestamp (its eviction), by uid.
fn evictions(pods: &[(u64, bool, Pod)]) -> BTreeMap<String, (u64, String)> {
    let mut first: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for (rv, deleted, pod) in pods {
        if !deleted && deleting(pod) {
            first
                .entry(pod.uid().unwrap_or_default())
                .or_insert((*rv, pod.name_any()));
        }
    }
    first
}

/// The descriptions a machine showed while it was being deleted, in order, without repeats.
fn delete_descriptions(machines: &[(u64, bool, Machine)], name: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for (_, _, machine) in machines.iter().filter(|(_, _, m)| m.name_any() == name) {
        if is_delete_operation(machine) {
            let text = description(machine);
            if seen.last() != Some(&text) {
                seen.push(text);
            }
        }
    }
    seen
}

// ---------------------------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------------------------

/// One crash point: the call the controller is stopped at.
struct CrashPoint {
    name: &'static str,
    after: Option<Matcher>,
    hold: Matcher,
}

fn crash(name: &'static str, hold: Matcher) -> CrashPoint {
    CrashPoint {
        name,
        after: None,
        hold,
    }
}

fn crash_after(name: &'static str, after: Matcher, hold: Matcher) -> CrashPoint {
    CrashPoint {
        name,
        after: Some(after),
        hold,
    }
}

const STATUS: &str = "/namespaces/default/machines/m1/status";

/// Crashes the controller at each point in turn (a new controller each time, on the same server and provider),
/// then lets a last controller finish; checks that the persisted step never went backwards and that nothing leaked.
async fn crash_at_every_point(h: &mut Harness, points: Vec<CrashPoint>) {
    let machines = record(h.machines()).await;
    let creates = h.sim.faults().calls_for(DriverMethod::CreateMachine, "m1");
    for (i, point) in points.into_iter().enumerate() {
        h.gate.set(Rule {
            after: point.after,
            hold: point.hold,
        });
        if i == 0 {
            h.delete_machine("m1").await;
        } else {
            h.start_controller().await;
        }
        h.gate.wait_held(u64::try_from(i).unwrap() + 1, point.name).await;
        h.crash_controller().await;
        h.gate.clear();
    }
    h.start_controller().await;
    h.wait_machine_gone("m1").await;
    machines.wait_deleted("m1").await;
    h.assert_nothing_left("m1", creates).await;

    // The step persisted on the machine only ever moved forward, across every crash.
    let steps: Vec<DeletionStep> = machines
        .events()
        .iter()
        .filter(|(_, _, m)| is_delete_operation(m))
        .map(|(_, _, m)| DeletionStep::parse(&description(m)))
        .collect();
    assert!(
        steps.windows(2).all(|w| w[0] <= w[1]),
        "the persisted step went backwards: {steps:?}"
    );
    // No drain action after the VM was removed.
    let log = h.gate.log();
    let removed_at = log
        .iter()
        .position(|c| matches!(c, Call::VmRemoved))
        .expect("the VM was removed");
    let drain_after: Vec<&Call> = log[removed_at..]
        .iter()
        .filter(|c| {
            matches!(c, Call::Http { method, path, body }
                if (method == "POST" && path.ends_with("/eviction"))
                    || (method == "DELETE" && path.contains("/pods/"))
                    || (method == "PATCH" && path.ends_with("/nodes/m1") && body.contains("unschedulable")))
        })
        .collect();
    assert!(
        drain_after.is_empty(),
        "drained after the VM was gone: {drain_after:?}"
    );
}

/// Issue 6: "Deletion is a typed sequence of steps, persisted so that a crash at any step resumes at that step and
/// repeats nothing harmful". DESIGN.md: "Every write is idempotent and safe to repeat after a crash at any line."
/// The controller is killed before and after the action of every step of a normal drain (GetMachineStatus, an eviction,
/// the first write, the drain's result, DeleteMachine, the node deletion, the finalizer removal); each time a new
/// controller resumes. The VM is removed exactly once and nothing is left: no VM, node, VolumeAttachment or
/// machine.
#[tokio::test]
async fn a_crash_after_every_step_of_a_drained_deletion_deletes_the_vm_once_and_leaks_nothing() {
    let mut h = Harness::start(fast_settings()).await;
    h.create_running_machine(sim_machine("m1")).await;
    h.create_volume("data").await;
    h.create_pod(bound_pod("db", "m1").claim("data")).await;
    h.create_pod(bound_pod("web", "m1")).await;
    h.wait_pod_ready("db").await;
    eventually("the volume attached to m1", || async {
        (h.attached().await == [("pv-data".to_owned(), "m1".to_owned())]).then_some(())
    })
    .await;

    let get_status = || provider_call(DriverMethod::GetMachineStatus);
    let delete_vm = || provider_call(DriverMethod::DeleteMachine);
    // Issue 26: Terminating and the VM status are written with the first drain pass's outcome, and the VM and node
    // deletions are not written at all; the crashes between those merged steps are here too.
    let delete_node = || http("DELETE", "/api/v1/nodes/m1", "");
    let points = vec![
        crash("GetMachineStatus, Terminating not written yet", get_status()),
        crash("an eviction", http("POST", "/eviction", "")),
        crash_after(
            "the first write (Terminating, the VM status, the drain pass)",
            get_status(),
            http("PATCH", STATUS, "Initiate node drain"),
        ),
        crash(
            "the write after the drain",
            http("PATCH", STATUS, "Initiate VM deletion"),
        ),
        crash("DeleteMachine", delete_vm()),
        crash_after(
            "the node deletion after DeleteMachine",
            delete_vm(),
            delete_node(),
        ),
        crash_after(
            "the finalizer removal after the node deletion",
            delete_node(),
            http("PATCH", "/namespaces/default/machines/m1", "finalizers"),
        ),
    ];
    crash_at_every_point(&mut h, points).await;
    assert!(h.pods().get_opt("db").await.unwrap().is_none(), "db was drained");
    assert!(
        h.pods().get_opt("web").await.unwrap().is_none(),
        "web was drained"
    );
    h.stop().await;
}

/// The same for a force deletion (machine label `force-deletion`) whose node's kubelet is dead: the force drain
/// (pods deleted with grace 0) and the VolumeAttachment cleanup are crashed before and after their actions too.
#[tokio::test]
async fn a_crash_after_every_step_of_a_force_deletion_deletes_the_vm_once_and_leaks_nothing() {
    let mut h = Harness::start(fast_settings()).await;
    h.create_running_machine(sim_machine("m1")).await;
    h.create_volume("data").await;
    h.create_pod(bound_pod("db", "m1").claim("data").grace_period(3600))
        .await;
    h.wait_pod_ready("db").await;
    eventually("the volume attached to m1", || async {
        (h.attached().await == [("pv-data".to_owned(), "m1".to_owned())]).then_some(())
    })
    .await;
    // The kubelet dies: nothing detaches the volume but the controller.
    h.sim.faults().stop_heartbeats("m1");
    h.machines()
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { keys::labels::FORCE_DELETION: "true" } } })),
        )
        .await
        .unwrap();

    let delete_vm = || provider_call(DriverMethod::DeleteMachine);
    let delete_attachment = || http_containing("DELETE", "/volumeattachments/");
    let points = vec![
        crash("the force deletion of a pod", http_containing("DELETE", "/pods/")),
        crash(
            "the first write (Terminating, the VM status, the force drain)",
            http("PATCH", STATUS, "Terminating"),
        ),
        crash(
            "the write after the force drain",
            http("PATCH", STATUS, "Delete Volume Attachments"),
        ),
        crash("the VolumeAttachment deletion", delete_attachment()),
        crash_after(
            "the write after the VolumeAttachment deletion",
            delete_attachment(),
            http("PATCH", STATUS, "Delete Volume Attachments"),
        ),
        crash("DeleteMachine", delete_vm()),
        crash_after(
            "the node deletion after DeleteMachine",
            delete_vm(),
            http("DELETE", "/api/v1/nodes/m1", ""),
        ),
    ];
    crash_at_every_point(&mut h, points).await;
    assert!(h.pods().get_opt("db").await.unwrap().is_none(), "db was deleted");
    h.stop().await;
}

/// Issue 6: "pre-drain hooks (annotations with the prefix `pre-drain.delete.hook.machine.sapcloud.io/`, modelled on
/// Cluster API's `pre-drain.delete.hook.machine.cluster.x-k8s.io/`, hold the machine until removed)"; "pre-terminate
/// hooks (`pre-terminate.delete.hook.machine.sapcloud.io/`)". Reference peers.md A3 (Cluster API): "1. Wait for every
/// `pre-drain.delete.hook.machine.cluster.x-k8s.io/*` annotation to be removed. 2. Cordon and drain … 4. Wait for
/// `pre-terminate.delete.hook.machine.cluster.x-k8s.io/*`".
#[tokio::test]
async fn pre_drain_and_pre_terminate_hooks_hold_the_deletion_until_removed() {
    let h = Harness::start(fast_settings()).await;
    let pre_drain = format!("{}backup", keys::extensions::PRE_DRAIN_HOOK_PREFIX);
    let pre_terminate = format!("{}detach-storage", keys::extensions::PRE_TERMINATE_HOOK_PREFIX);
    h.create_running_machine(
        sim_machine("m1")
            .annotation(&pre_drain, "ops")
            .annotation(&pre_terminate, "ops"),
    )
    .await;
    h.create_pod(bound_pod("web", "m1")).await;
    h.wait_pod_ready("web").await;
    let pods = record(h.pods()).await;

    h.delete_machine("m1").await;
    let held = h
        .wait_machine("m1", "held by the pre-drain hook", |m| {
            description(m).starts_with("Waiting for pre-drain hooks [backup]")
        })
        .await;
    assert_eq!(held.phase(), Some(MachinePhase::Terminating));
    assert!(description(&held).ends_with("Initiate node drain"));
    // Held: look again after another reconcile (an unrelated annotation change wakes the machine).
    h.machines()
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "touch": "1" } } })),
        )
        .await
        .unwrap();
    eventually("the touch seen", || async {
        h.machine("m1")
            .await
            .filter(|m| m.annotations().contains_key("touch"))
    })
    .await;
    assert!(
        !unschedulable(&h.nodes().get("m1").await.unwrap()),
        "not cordoned"
    );
    assert!(!deleting(&h.pods().get("web").await.unwrap()), "not drained");
    assert_eq!(h.sim.faults().calls(DriverMethod::DeleteMachine), 0);

    h.machines()
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { pre_drain: null } } })),
        )
        .await
        .unwrap();
    let held = h
        .wait_machine("m1", "held by the pre-terminate hook", |m| {
            description(m).starts_with("Waiting for pre-terminate hooks [detach-storage]")
        })
        .await;
    assert!(description(&held).ends_with("Initiate VM deletion"));
    assert!(
        h.pods().get_opt("web").await.unwrap().is_none(),
        "drained before the hold"
    );
    assert!(unschedulable(&h.nodes().get("m1").await.unwrap()), "cordoned");
    assert_eq!(
        h.sim.faults().calls(DriverMethod::DeleteMachine),
        0,
        "the VM is held"
    );
    assert_eq!(h.sim.vms().len(), 1);
    pods.wait_deleted("web").await;
    assert_eq!(evictions(&pods.events()).len(), 1, "web was evicted once");

    h.machines()
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { pre_terminate: null } } })),
        )
        .await
        .unwrap();
    h.wait_machine_gone("m1").await;
    h.assert_nothing_left("m1", 1).await;
    h.stop().await;
}

/// Spec 002 FAQ, "My machine is stuck in deletion for 1 hr, why?": "In most cases, the Machine.Status.LastOperation
/// provides information around why a machine can't be deleted … Pod/s with misconfigured PDBs block the drain
/// operation. PDBs with [maxUnavailable] set to 0, doesn't allow the eviction of the pods." Issue 6: "a PDB that can
/// never allow a disruption fails fast with a message naming it"; "a blocked drain says which pod and which PDB block
/// it". Raising the budget lets the deletion finish (evictions refused with 429 are retried).
#[tokio::test]
async fn a_pdb_allowing_no_disruption_keeps_the_machine_terminating_naming_pod_and_pdb_until_raised() {
    let h = Harness::start(fast_settings()).await;
    h.create_running_machine(sim_machine("m1")).await;
    for name in ["web-0", "web-1"] {
        h.create_pod(bound_pod(name, "m1").label("app", "web")).await;
        h.wait_pod_ready(name).await;
    }
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": { "name": "web-pdb", "namespace": NAMESPACE },
        "spec": { "maxUnavailable": 0, "selector": { "matchLabels": { "app": "web" } } }
    }))
    .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(h.client.clone(), NAMESPACE);
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    eventually("the budget's status counts both pods healthy", || async {
        let status = pdbs.get("web-pdb").await.unwrap().status?;
        (status.current_healthy == 2 && status.expected_pods == 2).then_some(())
    })
    .await;

    h.delete_machine("m1").await;
    let blocked = h
        .wait_machine("m1", "blocked by web-pdb", |m| {
            description(m).contains("PodDisruptionBudget default/web-pdb")
        })
        .await;
    let text = description(&blocked);
    assert!(
        text.contains("pod default/web-0") || text.contains("pod default/web-1"),
        "names the pod: {text}"
    );
    assert!(text.ends_with("Initiate node drain"), "{text}");
    assert_eq!(blocked.phase(), Some(MachinePhase::Terminating));

    // It stays so: several more eviction attempts are refused, nothing is evicted, the VM stays.
    let attempts = |log: &[Call]| {
        log.iter()
            .filter(|c| matches!(c, Call::Http { method, path, .. } if method == "POST" && path.ends_with("/eviction")))
            .count()
    };
    let before = attempts(&h.gate.log());
    eventually("three more eviction attempts", || async {
        (attempts(&h.gate.log()) >= before + 3).then_some(())
    })
    .await;
    let still = h.machine("m1").await.unwrap();
    assert_eq!(still.phase(), Some(MachinePhase::Terminating));
    assert!(description(&still).contains("web-pdb"), "{}", description(&still));
    for name in ["web-0", "web-1"] {
        assert!(
            !deleting(&h.pods().get(name).await.unwrap()),
            "{name} was evicted"
        );
    }
    assert_eq!(h.sim.faults().calls(DriverMethod::DeleteMachine), 0);

    pdbs.patch(
        "web-pdb",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "maxUnavailable": 1 } })),
    )
    .await
    .unwrap();
    h.wait_machine_gone("m1").await;
    assert!(
        h.pods()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    h.assert_nothing_left("m1", 1).await;
    h.stop().await;
}

/// Spec 002 FAQ: "Stateless pods are evicted in parallel. Stateful applications (with PVCs) are serially evicted …
/// It evicts very first stateful-pod and waits for its related entry in Node object's [volumesAttached] to be
/// removed by KCM. It does the same for all the stateful-pods." Reference §4: "Pods with PVCs are evicted serially,
/// sorted by `spec.priority` descending … Then it waits for reattach elsewhere". A test-side StatefulSet controller
/// recreates each evicted volume pod on a second node, where the kubelet attaches its volume.
#[tokio::test]
async fn volume_pods_are_evicted_one_at_a_time_highest_priority_first_each_after_its_volume_moved() {
    let h = Harness::start(ControllerSettings {
        machine_pv_reattach_timeout: Duration::from_secs(30),
        ..fast_settings()
    })
    .await;
    h.create_running_machine(sim_machine("m1")).await;
    // A second node, not a machine of this controller: where the volume pods move.
    h.create_vm_without_machine("m2").await;

    // Names sort differently from priorities.
    let volume_pods = [("db-high", 100), ("db-mid", 50), ("db-low", 10)];
    for (name, priority) in volume_pods {
        h.create_volume(name).await;
        h.create_pod(bound_pod(name, "m1").claim(name).priority(priority))
            .await;
    }
    for name in ["web-a", "web-b"] {
        h.create_pod(bound_pod(name, "m1")).await;
    }
    eventually("three volumes attached to m1", || async {
        (h.attached().await.len() == 3).then_some(())
    })
    .await;

    let (_release, released) = watch::channel(true);
    let restarter = recreate_elsewhere(h.pods(), "db-", "m1", "m2", released);
    let pods = record(h.pods()).await;
    let attachments = record(h.attachments()).await;

    h.delete_machine("m1").await;
    h.wait_machine_gone("m1").await;
    restarter.abort();
    for name in ["web-a", "web-b"] {
        pods.wait_deleted(name).await;
    }
    eventually("the watch to report pv-db-low attached to m2", || async {
        attachments
            .events()
            .iter()
            .any(|(_, _, va)| attached_to(va, "pv-db-low", "m2"))
            .then_some(())
    })
    .await;

    let evicted = evictions(&pods.events());
    let mut order: Vec<(u64, String)> = evicted.into_values().collect();
    order.sort();
    let names: Vec<&str> = order.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names.len(), 5, "every pod evicted once: {names:?}");
    let serial: Vec<&str> = names.iter().copied().filter(|n| n.starts_with("db-")).collect();
    assert_eq!(serial, ["db-high", "db-mid", "db-low"], "highest priority first");
    let rv_of = |name: &str| order.iter().find(|(_, n)| n == name).unwrap().0;
    for web in ["web-a", "web-b"] {
        assert!(
            rv_of(web) < rv_of("db-mid"),
            "{web} is evicted with the first pass"
        );
    }
    // Each volume pod goes only after the one before it has left: its volume detached from m1 (VolumeAttachment
    // deleted) and attached on m2. resourceVersions come from one counter across kinds.
    let events = attachments.events();
    for pair in serial.windows(2) {
        let (before, next) = (pair[0], pair[1]);
        let (detached, reattached) = volume_moved(&events, &format!("pv-{before}"), "m1", "m2");
        assert!(
            rv_of(next) > detached && rv_of(next) > reattached,
            "{next} evicted (rv {}) before {before}'s volume moved (detached at {detached}, attached on m2 at \
             {reattached})",
            rv_of(next)
        );
    }
    assert_eq!(
        h.attached().await,
        [
            ("pv-db-high".to_owned(), "m2".to_owned()),
            ("pv-db-low".to_owned(), "m2".to_owned()),
            ("pv-db-mid".to_owned(), "m2".to_owned()),
        ]
    );
    assert!(
        h.sim.faults().calls(DriverMethod::GetVolumeIds) >= 3,
        "the volume IDs came from the provider"
    );
    h.stop().await;
}

/// Issue 6: "a crash at any step resumes at that step and repeats nothing harmful" — and skips nothing: a controller
/// restarted while an evicted volume pod terminates (its memory of the eviction lost) still waits for that pod's
/// volume to detach and attach elsewhere before it evicts the next volume pod (spec 002 FAQ: "It evicts very first
/// stateful-pod and waits for its related entry in Node object's [volumesAttached] to be removed").
#[tokio::test]
async fn a_controller_restarted_while_a_volume_pod_terminates_still_waits_for_its_volume_to_move() {
    let mut h = Harness::start(ControllerSettings {
        machine_pv_reattach_timeout: Duration::from_secs(30),
        ..fast_settings()
    })
    .await;
    h.create_running_machine(sim_machine("m1")).await;
    h.create_vm_without_machine("m2").await;
    for (name, priority, seconds) in [("db-high", 100, 2), ("db-low", 10, 1)] {
        h.create_volume(name).await;
        h.create_pod(
            bound_pod(name, "m1")
                .claim(name)
                .priority(priority)
                .grace_period(seconds),
        )
        .await;
    }
    eventually("two volumes attached to m1", || async {
        (h.attached().await.len() == 2).then_some(())
    })
    .await;
    let (release, released) = watch::channel(false);
    let restarter = recreate_elsewhere(h.pods(), "db-", "m1", "m2", released);
    let pods = record(h.pods()).await;
    let attachments = record(h.attachments()).await;

    // Crash at the drain pass after db-high's eviction.
    h.gate.set(Rule {
        after: Some(http("POST", "/pods/db-high/eviction", "")),
        // The drain reads the node from the cache (issue 26): the pod list of the next pass is held.
        hold: http_containing("GET", "/api/v1/pods"),
    });
    h.delete_machine("m1").await;
    h.gate
        .wait_held(1, "the drain pass after the first eviction")
        .await;
    h.crash_controller().await;
    h.gate.clear();
    h.start_controller().await;

    // db-high ends and its volume detaches from m1, but it is not attached elsewhere yet: db-low must wait.
    pods.wait_deleted("db-high").await;
    eventually("pv-db-high detached from m1", || async {
        (!h.attached()
            .await
            .contains(&("pv-db-high".to_owned(), "m1".to_owned())))
        .then_some(())
    })
    .await;
    let lists = |log: &[Call]| {
        log.iter()
            .filter(
                |c| matches!(c, Call::Http { method, path, .. } if method == "GET" && path == "/api/v1/pods"),
            )
            .count()
    };
    let before = lists(&h.gate.log());
    eventually("three more drain passes", || async {
        (lists(&h.gate.log()) >= before + 3).then_some(())
    })
    .await;
    assert!(
        h.pods()
            .get_opt("db-low")
            .await
            .unwrap()
            .is_some_and(|p| !deleting(&p)),
        "db-low was evicted before db-high's volume was attached elsewhere"
    );

    release.send(true).unwrap();
    h.wait_machine_gone("m1").await;
    restarter.abort();
    eventually("the watch to report pv-db-low attached to m2", || async {
        attachments
            .events()
            .iter()
            .any(|(_, _, va)| attached_to(va, "pv-db-low", "m2"))
            .then_some(())
    })
    .await;
    let evicted = evictions(&pods.events());
    let db_low = evicted
        .values()
        .find(|(_, n)| n == "db-low")
        .expect("db-low evicted")
        .0;
    let (_, reattached) = volume_moved(&attachments.events(), "pv-db-high", "m1", "m2");
    assert!(
        db_low > reattached,
        "db-low evicted before db-high's volume moved"
    );
    h.stop().await;
}

/// A StatefulSet controller of sorts: a pod whose name starts with `prefix` that is deleted from node `from` is
/// created again, same name and spec, on node `to`, once `release` says true.
fn recreate_elsewhere(
    pods: Api<Pod>,
    prefix: &'static str,
    from: &'static str,
    to: &'static str,
    mut release: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(pods.clone(), watcher::Config::default()));
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Delete(pod)) = event
                && pod.name_any().starts_with(prefix)
                && pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(from)
            {
                if release.wait_for(|go| *go).await.is_err() {
                    return;
                }
                let mut again: Value = serde_json::to_value(&pod).unwrap();
                again["metadata"] = json!({ "name": pod.name_any(), "namespace": NAMESPACE });
                again["spec"]["nodeName"] = json!(to);
                again["status"] = json!({});
                let again: Pod = serde_json::from_value(again).unwrap();
                let _ = pods.create(&PostParams::default(), &again).await;
            }
        }
    })
}

fn attached_to(va: &VolumeAttachment, pv: &str, node: &str) -> bool {
    va.spec.source.persistent_volume_name.as_deref() == Some(pv)
        && va.spec.node_name == node
        && va.status.as_ref().is_some_and(|s| s.attached)
}

/// The resourceVersions at which the VolumeAttachment of `pv` on `from` was deleted and one on `to` was attached.
fn volume_moved(events: &[(u64, bool, VolumeAttachment)], pv: &str, from: &str, to: &str) -> (u64, u64) {
    let detached = events
        .iter()
        .find(|(_, deleted, va)| {
            *deleted
                && va.spec.source.persistent_volume_name.as_deref() == Some(pv)
                && va.spec.node_name == from
        })
        .unwrap_or_else(|| panic!("{pv} detached from {from}"))
        .0;
    let attached = events
        .iter()
        .find(|(_, deleted, va)| !*deleted && attached_to(va, pv, to))
        .unwrap_or_else(|| panic!("{pv} attached to {to}"))
        .0;
    (detached, attached)
}

/// Issue 6: "DaemonSet and mirror pods left alone; pod label `drain.machine.sapcloud.io=skip` leaves a pod,
/// `=wait-completed` waits for it to finish". Reference §4: "mirror pods (annotation `kubernetes.io/config.mirror`)
/// are skipped; DaemonSet-owned pods are skipped (never evicted)".
#[tokio::test]
async fn the_skip_label_leaves_a_pod_and_wait_completed_is_waited_for_until_it_completes() {
    let h = Harness::start(fast_settings()).await;
    h.create_running_machine(sim_machine("m1")).await;
    let label = keys::extensions::DRAIN_LABEL;
    h.create_pod(bound_pod("agent", "m1").label(label, "skip")).await;
    h.create_pod(bound_pod("batch", "m1").label(label, "wait-completed"))
        .await;
    h.create_pod(
        bound_pod("logs-ds", "m1")
            // The apps group is not served here, so the garbage collector leaves the pod of this owner alone.
            .owner(OwnerReference {
                api_version: "apps/v1".into(),
                kind: "DaemonSet".into(),
                name: "logs".into(),
                uid: "ds-uid".into(),
                controller: Some(true),
                block_owner_deletion: None,
            }),
    )
    .await;
    h.create_pod(bound_pod("static-m1", "m1").annotation("kubernetes.io/config.mirror", "static"))
        .await;
    h.create_pod(bound_pod("web", "m1")).await;
    h.wait_pod_ready("batch").await;
    let pods = record(h.pods()).await;

    h.delete_machine("m1").await;
    eventually("web drained", || async {
        h.pods().get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    let waiting = h
        .wait_machine("m1", "the drain waiting for batch", |m| {
            description(m).starts_with("Drain in progress: 1 pod")
        })
        .await;
    assert_eq!(waiting.phase(), Some(MachinePhase::Terminating));
    // More drain passes go by (each lists the node's pods) without touching batch.
    let lists = |log: &[Call]| {
        log.iter()
            .filter(
                |c| matches!(c, Call::Http { method, path, .. } if method == "GET" && path == "/api/v1/pods"),
            )
            .count()
    };
    let before = lists(&h.gate.log());
    eventually("three more drain passes", || async {
        (lists(&h.gate.log()) >= before + 3).then_some(())
    })
    .await;
    assert!(h.machine("m1").await.is_some());
    assert_eq!(h.sim.faults().calls(DriverMethod::DeleteMachine), 0);

    h.pods()
        .patch_status(
            "batch",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Succeeded" } })),
        )
        .await
        .unwrap();
    h.wait_machine_gone("m1").await;
    pods.wait_deleted("web").await;

    let evicted: Vec<String> = evictions(&pods.events()).into_values().map(|(_, n)| n).collect();
    assert_eq!(evicted, ["web"], "only web was evicted");
    for left in ["agent", "logs-ds", "static-m1"] {
        let pod = h.pods().get(left).await.unwrap();
        assert!(!deleting(&pod), "{left} is left alone");
    }
    let batch = h.pods().get("batch").await.unwrap();
    assert!(!deleting(&batch), "the completed pod was waited for, not evicted");
    h.assert_nothing_left("m1", 1).await;
    h.stop().await;
}

/// Reference §4: force applies when "the Node has been `Ready!=True` for more than 5 min"; "Force drain deletes every
/// pod in parallel with grace 0, without waiting for termination or for volumes"; §3.5 step 4 "Delete Volume
/// Attachments": "reached only after a force drain: delete all non-deleting VolumeAttachments with
/// `spec.nodeName==node`". The node turns NotReady and its kubelet dies (nothing detaches its volume but the
/// controller); `force_drain_unhealthy_after` is 1 s here instead of 5 minutes.
#[tokio::test]
async fn a_force_drain_of_a_not_ready_node_deletes_pods_with_grace_0_and_its_volume_attachments() {
    let h = Harness::start(ControllerSettings {
        force_drain_unhealthy_after: Duration::from_secs(1),
        ..fast_settings()
    })
    .await;
    h.create_running_machine(sim_machine("m1")).await;
    h.create_volume("data").await;
    for (name, claim) in [("db", Some("data")), ("web", None)] {
        // An hour of grace: only a deletion with grace 0 makes them go within the test.
        let pod = bound_pod(name, "m1").grace_period(3600);
        h.create_pod(match claim {
            Some(claim) => pod.claim(claim),
            None => pod,
        })
        .await;
    }
    eventually("the volume attached to m1", || async {
        (h.attached().await == [("pv-data".to_owned(), "m1".to_owned())]).then_some(())
    })
    .await;

    let faults = h.sim.faults();
    faults.set_node_not_ready("m1");
    let not_ready_since = eventually("m1 NotReady", || async {
        let node = h.nodes().get("m1").await.unwrap();
        let ready = node
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status == "False").then_some(ready.last_transition_time?.0)
    })
    .await;
    faults.stop_heartbeats("m1");
    // The rule is "not Ready for at least force_drain_unhealthy_after": wait until that holds, so that the drain is
    // forced from its first pass.
    eventually("m1 NotReady for 1s", || async {
        (jiff::Timestamp::now().duration_since(not_ready_since) >= jiff::SignedDuration::from_secs(1))
            .then_some(())
    })
    .await;
    let pods = record(h.pods()).await;
    let machines = record(h.machines()).await;

    h.delete_machine("m1").await;
    h.wait_machine_gone("m1").await;
    machines.wait_deleted("m1").await;
    pods.wait_deleted("db").await;
    pods.wait_deleted("web").await;

    assert!(
        evictions(&pods.events()).is_empty(),
        "no pod got a grace period: deleted with grace 0"
    );
    assert!(
        h.pods()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        h.all_attachments().await.is_empty(),
        "the VolumeAttachment was deleted"
    );
    let descriptions = delete_descriptions(&machines.events(), "m1");
    assert!(
        descriptions
            .iter()
            .any(|d| d.starts_with("Force Drain successful (the node has not been Ready for")),
        "{descriptions:#?}"
    );
    assert!(
        descriptions
            .iter()
            .any(|d| d.starts_with("Deleting 1 VolumeAttachments of node m1")),
        "{descriptions:#?}"
    );
    let evicts = h
        .gate
        .log()
        .iter()
        .filter(|c| matches!(c, Call::Http { method, path, .. } if method == "POST" && path.ends_with("/eviction")))
        .count();
    assert_eq!(evicts, 0, "a force drain deletes, it does not evict");
    h.assert_nothing_left("m1", 1).await;
    h.stop().await;
}

/// Issue 6 (tests): "deletion of a machine whose node never joined". Reference §3.5 step 2: "`NotFound` … still
/// go to drain (so that NICs/disks are cleaned up by DeleteMachine)"; docs/machine-deletion-decisions.md: "no node
/// name / node gone → skip to `DeleteVm`". The VM's kubelet never starts (its heartbeats are stopped before the VM
/// exists), so the machine stays Pending until it is deleted.
#[tokio::test]
async fn a_machine_whose_node_never_joined_is_deleted() {
    let h = Harness::start(fast_settings()).await;
    h.sim.faults().stop_heartbeats("m1");
    h.create_machine(sim_machine("m1")).await;
    h.wait_machine("m1", "Pending with its VM", |m| {
        m.phase() == Some(MachinePhase::Pending)
    })
    .await;
    assert_eq!(h.sim.vms().len(), 1);
    let machines = record(h.machines()).await;

    h.delete_machine("m1").await;
    h.wait_machine_gone("m1").await;
    machines.wait_deleted("m1").await;
    let descriptions = delete_descriptions(&machines.events(), "m1");
    assert!(
        descriptions
            .iter()
            .any(|d| d.contains("not found, nothing to drain") || d.starts_with("Skipping drain")),
        "{descriptions:#?}"
    );
    h.assert_nothing_left("m1", 1).await;
    h.stop().await;
}

/// Spec 004: "One reason a `Machine` may not be deleted is if it corresponds to the node running the Machine
/// controller." The controller's own machine (`settings.controller_node`) is neither drained nor deleted, and says
/// so; its phase is left as it is (docs/machine-deletion-decisions.md).
#[tokio::test]
async fn the_controllers_own_machine_is_never_drained_or_deleted() {
    let h = Harness::start(ControllerSettings {
        controller_node: Some("ctl".into()),
        ..fast_settings()
    })
    .await;
    h.create_running_machine(sim_machine("ctl")).await;
    h.create_pod(bound_pod("web", "ctl")).await;
    h.wait_pod_ready("web").await;
    let log_start = h.gate.log().len();

    h.delete_machine("ctl").await;
    let held = h
        .wait_machine("ctl", "refused", |m| {
            description(m).starts_with(
                "Machine ctl runs on node ctl, which runs this machine controller: it is neither drained nor deleted",
            )
        })
        .await;
    assert_eq!(
        held.status
            .as_ref()
            .unwrap()
            .last_operation
            .state
            .as_ref()
            .map(mcm_api::MachineState::as_str),
        Some("Failed")
    );
    assert_eq!(
        held.phase(),
        Some(MachinePhase::Running),
        "the phase is not touched"
    );

    // Meanwhile another machine of the same controller is deleted from start to end: the controller works.
    h.create_running_machine(sim_machine("m2")).await;
    h.machines()
        .patch(
            "ctl",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "touch": "1" } } })),
        )
        .await
        .unwrap();
    h.delete_machine("m2").await;
    h.wait_machine_gone("m2").await;

    let still = h.machine("ctl").await.expect("the controller's machine stays");
    assert!(still.metadata.deletion_timestamp.is_some());
    assert_eq!(description(&still), description(&held));
    assert!(
        !unschedulable(&h.nodes().get("ctl").await.unwrap()),
        "not cordoned"
    );
    assert!(!deleting(&h.pods().get("web").await.unwrap()), "not drained");
    assert_eq!(h.sim.faults().calls_for(DriverMethod::DeleteMachine, "ctl"), 0);
    assert!(h.sim.vms().iter().any(|vm| vm.machine_name == "ctl"));
    let touched: Vec<Call> = h.gate.log()[log_start..]
        .iter()
        .filter(|c| match c {
            // Cordoning, evicting or deleting (the node sync of the running machine may still patch labels).
            Call::Http { method, path, body } => {
                (path.ends_with("/nodes/ctl") && (body.contains("unschedulable") || method == "DELETE"))
                    || (path.contains("/pods/web") && method != "GET")
            }
            // m2's DeleteMachine is in the log too; ctl's calls are counted by the provider below.
            Call::Driver(_) | Call::VmRemoved => false,
        })
        .cloned()
        .collect();
    assert!(
        touched.is_empty(),
        "the controller touched its own node or pod: {touched:?}"
    );
    h.stop().await;
}
