//! The harness of the machine lifecycle tests: one embedded API server (in memory, its own temporary directory and
//! free port) per test, the sim provider with its kubelet, and the machine controller, which a test can stop, kill
//! and start again against the same server and provider. Watchers record every version of the objects a test
//! looks at ([`History`]), and every wait is a poll with a deadline. [`Cluster::start_set_controllers`] adds the
//! MachineSet and MachineDeployment controllers, [`Cluster::spawn_loop`] any other controller loop. A test that needs
//! another server, kubelet or controller configuration says so in a [`Setup`] ([`Cluster::start_with`]) instead of
//! building its own world; a test file adds its own helpers in an `impl Cluster` block of its own.

// Each test crate uses its own part of the harness.

use std::{
    collections::BTreeMap,
    fmt::Debug,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Node, Secret};
use k8s_openapi::serde::de::DeserializeOwned;
use kube::{
    Api, Client, Resource,
    api::{ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{WatchStreamExt, watcher},
};
use mcm_api::{
    Machine, MachineClass, MachineDeployment, MachinePhase, MachineSet,
    builders::{MachineBuilder, MachineClassBuilder},
    keys,
};
use mcm_apiserver::{ApiServer, Config as ServerConfig};
use mcm_controllers::machine::{self, Config};
use mcm_core::ControllerSettings;
use mcm_provider_sim::{Faults, Kubelet, KubeletConfig, KubeletHandle, SimConfig, SimDriver};
use serde_json::{Value, json};
use tokio::{sync::oneshot, task::JoinHandle};

/// The longest any single wait of a test may take.
pub const DEADLINE: Duration = Duration::from_secs(45);

/// The namespace of everything.
pub const NAMESPACE: &str = "default";

/// A client of `server` as its kubeconfig describes it, without kube's built-in retry of 429/503/504: the controllers
/// and the tests handle those answers themselves (docs/pitfalls.md).
pub async fn client_for(server: &ApiServer) -> Client {
    let file = Kubeconfig::read_from(server.kubeconfig()).expect("its kubeconfig");
    let mut kube_config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .expect("a client configuration");
    kube_config.default_retry = false;
    Client::try_from(kube_config).expect("a client")
}

/// The class every machine is made from.
pub const CLASS: &str = "sim-small";

/// How often waits look again.
const POLL: Duration = Duration::from_millis(25);

/// Controller settings for tests: the reference's defaults with every period small, so that back-off, timeouts
/// and the remediation recheck happen within seconds. Tests override what they look at.
pub fn settings() -> ControllerSettings {
    let mut settings = ControllerSettings {
        machine_creation_timeout: Duration::from_mins(5),
        machine_health_timeout: Duration::from_mins(5),
        ..ControllerSettings::default()
    };
    settings.retry.backoff_base = Duration::from_millis(200);
    settings.retry.backoff_cap = Duration::from_secs(2);
    // Small jitter: successive delays stay far apart (at least 1.6 times the previous), so that "the gaps grow"
    // holds with room for a busy test machine.
    settings.retry.jitter = 0.2;
    settings.remediation.recheck_interval = Duration::from_millis(250);
    settings
}

/// A running machine controller: stopped gracefully ([`Cluster::stop_controller`]) or killed
/// ([`Cluster::kill_controller`]).
struct RunningController {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// The future a controller loop is given ([`Cluster::spawn_loop`]): it completes when the loop is to stop.
pub type Shutdown = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>>;

/// A stop signal for a controller and the shared caches started for it (`mcm run` starts one set of caches for all
/// its controllers; a test's controller gets its own, as a process of its own would).
pub fn caches_until(
    client: &kube::Client,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> (
    mcm_controllers::shared_cache::Caches,
    futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
) {
    metered_caches_until(client, None, stopped)
}

/// [`caches_until`] whose watches' failures show in `metrics`' `/readyz`.
pub fn metered_caches_until(
    client: &kube::Client,
    metrics: Option<&mcm_controllers::metrics::Metrics>,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> (
    mcm_controllers::shared_cache::Caches,
    futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
) {
    use futures::FutureExt as _;
    let shutdown = stopped.boxed().shared();
    let caches = mcm_controllers::shared_cache::Caches::start(
        client,
        Some(client),
        NAMESPACE,
        metrics,
        shutdown.clone(),
    );
    (caches, shutdown)
}

/// How [`Cluster::start_with`] sets up a test's world; [`Setup::new`] is what [`Cluster::start`] uses. A test changes
/// the fields it depends on (`setup.server.watch_delay = ...`) before starting.
pub struct Setup {
    /// The machine controller's settings.
    pub settings: ControllerSettings,
    /// How many machines the machine controller reconciles at once.
    pub concurrency: u16,
    /// The API server's configuration: in memory in the setup's own temporary directory, on a free port, admission
    /// on, and silent nodes (a vanished VM's) Unknown within seconds.
    pub server: ServerConfig,
    /// How often the sim's kubelets heartbeat.
    pub heartbeat: Duration,
    dir: tempfile::TempDir,
}

impl Setup {
    /// The harness's defaults with the machine controller's `settings`.
    pub fn new(settings: ControllerSettings) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut server = ServerConfig::new(dir.path());
        server.in_memory = true;
        server.node_monitor_grace_period = Duration::from_secs(2);
        server.node_monitor_period = Duration::from_millis(200);
        Self {
            settings,
            concurrency: 4,
            server,
            heartbeat: Duration::from_millis(500),
            dir,
        }
    }
}

impl Setup {
    /// The set and deployment tests' setup: the machine controller with the reference's default settings,
    /// 8 machines at once.
    pub fn for_sets() -> Self {
        Self {
            concurrency: 8,
            ..Self::new(ControllerSettings::default())
        }
    }
}

/// The providerSpec of a sim class of `size` in the pool `pool-a`.
pub fn sized_class(size: &str) -> Value {
    json!({ "vmPool": "pool-a", "size": size, "tags": { "kubernetes.io/cluster/c": "1" } })
}

/// The MachineSet controller's configuration in the harness: 4 sets at once, a 10 minute resync, minReadySeconds
/// ignored (the reference's default).
pub fn set_config() -> mcm_controllers::machineset::Config {
    mcm_controllers::machineset::Config {
        namespace: NAMESPACE.into(),
        concurrency: 4,
        resync: Duration::from_mins(10),
        min_ready_seconds: mcm_core::machineset::MinReadySeconds::Ignore,
    }
}

/// One test's world: API server, sim provider, kubelet, controller.
pub struct Cluster {
    server: Option<ApiServer>,
    /// How the server was started, its port fixed once known ([`Cluster::restart_server`]).
    server_config: ServerConfig,
    _dir: tempfile::TempDir,
    /// An admin client of the server.
    pub client: Client,
    /// The provider the controller talks to.
    pub driver: SimDriver,
    /// Its fault handle and call counts.
    pub faults: Faults,
    kubelet: Option<KubeletHandle>,
    controller: Option<RunningController>,
    set_controllers: Vec<RunningController>,
    loops: Vec<RunningController>,
    settings: ControllerSettings,
    concurrency: u16,
}

impl Cluster {
    /// Server, provider and kubelet, and a controller with `settings`.
    pub async fn start(settings: ControllerSettings) -> Self {
        let mut cluster = Self::start_without_controller(settings).await;
        cluster.start_controller();
        cluster
    }

    /// Server, provider and kubelet; no controller yet ([`Cluster::start_controller`]).
    pub async fn start_without_controller(settings: ControllerSettings) -> Self {
        Self::start_with_admission(settings, true).await
    }

    /// [`Cluster::start_without_controller`] with the server's admission of the machine kinds on or off (off: invalid
    /// objects are stored, as on a cluster without the admission policy).
    pub async fn start_with_admission(settings: ControllerSettings, admission: bool) -> Self {
        let mut setup = Setup::new(settings);
        setup.server.machine_admission = admission;
        Self::start_with(setup).await
    }

    /// The world of the set and deployment tests, from `setup` ([`Setup::for_sets`]): the machine controller, the
    /// MachineSet controller with `sets`, the MachineDeployment controller (4 deployments at once), and the classes
    /// `small` and `medium` ([`sized_class`]).
    pub async fn start_with_set_controllers(setup: Setup, sets: mcm_controllers::machineset::Config) -> Self {
        let mut cluster = Self::start_with(setup).await;
        cluster.start_controller();
        cluster.start_set_controllers_with(
            sets,
            mcm_controllers::machinedeployment::Config {
                concurrency: 4,
                ..mcm_controllers::machinedeployment::Config::new(NAMESPACE)
            },
        );
        cluster.create_boot_secret().await;
        for size in ["small", "medium"] {
            cluster.create_sim_class(size, sized_class(size)).await;
        }
        cluster
    }

    /// Server, provider and kubelet as `setup` says; no controller yet ([`Cluster::start_controller`]).
    pub async fn start_with(setup: Setup) -> Self {
        let mut server_config = setup.server;
        let server = ApiServer::start(server_config.clone())
            .await
            .expect("the API server starts");
        // A restart comes back on the same port, so that every client (kubelets, controllers) finds it again.
        server_config.port = server
            .url()
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .expect("the server's port");
        let client = client_for(&server).await;
        let driver = SimDriver::new(SimConfig::default());
        let kubelet = Kubelet::start(
            &driver,
            client.clone(),
            KubeletConfig {
                heartbeat_interval: setup.heartbeat,
                ..KubeletConfig::default()
            },
        );
        Self {
            server: Some(server),
            server_config,
            _dir: setup.dir,
            client,
            faults: driver.faults(),
            driver,
            kubelet: Some(kubelet),
            controller: None,
            set_controllers: Vec::new(),
            loops: Vec::new(),
            settings: setup.settings,
            concurrency: setup.concurrency,
        }
    }

    /// The API server.
    pub fn server(&self) -> &ApiServer {
        self.server.as_ref().expect("the server runs")
    }

    /// Stops the API server (an outage); the rest keeps running.
    pub async fn stop_server(&mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }

    /// Starts the API server again with the same configuration, on the same port (with [`Setup::server`] on disk,
    /// everything stored comes back).
    pub async fn restart_server(&mut self) {
        assert!(self.server.is_none(), "the server is stopped first");
        self.server = Some(
            ApiServer::start(self.server_config.clone())
                .await
                .expect("the API server starts again"),
        );
    }

    /// Starts a machine controller (a new one: nothing in memory from an earlier one) against the same server and
    /// provider.
    pub fn start_controller(&mut self) {
        self.spawn_controller(machine::Extras::default(), None);
    }

    /// [`Cluster::start_controller`] talking to the provider through `driver` (e.g. a gRPC client of the sim served
    /// on a socket) instead of the sim in process.
    pub fn start_controller_with_driver(&mut self, driver: Arc<dyn mcm_driver::Driver>) {
        self.spawn_controller(machine::Extras::default(), Some(driver));
    }

    /// [`Cluster::start_controller`] with `metrics`: the machine cache feeds it at scrape time, the step durations
    /// and the reconciles are recorded in it.
    pub fn start_controller_with_metrics(&mut self, metrics: Arc<mcm_controllers::metrics::Metrics>) {
        self.spawn_controller(
            machine::Extras {
                metrics: Some(metrics),
                ..machine::Extras::default()
            },
            None,
        );
    }

    /// [`Cluster::start_controller`] with `extras` (a reachability freeze, metrics, an orphan collection trigger).
    pub fn start_controller_with_extras(&mut self, extras: machine::Extras) {
        self.spawn_controller(extras, None);
    }

    fn spawn_controller(&mut self, extras: machine::Extras, driver: Option<Arc<dyn mcm_driver::Driver>>) {
        assert!(self.controller.is_none(), "one controller at a time");
        let driver = driver.unwrap_or_else(|| Arc::new(self.driver.clone()));
        let (stop, stopped) = oneshot::channel::<()>();
        let (caches, shutdown) = metered_caches_until(&self.client, extras.metrics.as_deref(), async move {
            let _ = stopped.await;
        });
        let task = tokio::spawn(machine::run(
            self.client.clone(),
            Some(self.client.clone()),
            driver,
            Config {
                namespace: NAMESPACE.into(),
                settings: self.settings.clone(),
                concurrency: self.concurrency,
            },
            caches,
            extras,
            shutdown,
        ));
        self.controller = Some(RunningController { stop, task });
    }

    /// Runs a further controller loop (overshoot, references, reachability) until [`Cluster::stop`]: `run` is given
    /// the future that completes when the loop is to stop.
    pub fn spawn_loop<F>(&mut self, run: impl FnOnce(Shutdown) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run(Box::pin(async move {
            let _ = stopped.await;
        })));
        self.loops.push(RunningController { stop, task });
    }

    /// Starts the MachineSet and MachineDeployment controllers (the deployment controller with `config`, the node
    /// cluster being the same server).
    pub fn start_set_controllers(&mut self, config: mcm_controllers::machinedeployment::Config) {
        self.spawn_set_controllers(config, None);
    }

    /// [`Cluster::start_set_controllers`] with `metrics`: the set and deployment caches feed it at scrape time, the
    /// reconciles are recorded in it.
    pub fn start_set_controllers_with_metrics(
        &mut self,
        config: mcm_controllers::machinedeployment::Config,
        metrics: Arc<mcm_controllers::metrics::Metrics>,
    ) {
        self.spawn_set_controllers(config, Some(metrics));
    }

    /// Starts the MachineSet controller with `sets` and the MachineDeployment controller with `deployments`.
    pub fn start_set_controllers_with(
        &mut self,
        sets: mcm_controllers::machineset::Config,
        deployments: mcm_controllers::machinedeployment::Config,
    ) {
        self.spawn_set_controller(sets, None);
        self.spawn_deployment_controller(deployments, None);
    }

    /// Starts the MachineSet controller alone with `config` (no deployment controller).
    pub fn start_set_controller(&mut self, config: mcm_controllers::machineset::Config) {
        self.spawn_set_controller(config, None);
    }

    fn spawn_set_controllers(
        &mut self,
        config: mcm_controllers::machinedeployment::Config,
        metrics: Option<Arc<mcm_controllers::metrics::Metrics>>,
    ) {
        self.spawn_set_controller(set_config(), metrics.clone());
        self.spawn_deployment_controller(config, metrics);
    }

    fn spawn_set_controller(
        &mut self,
        config: mcm_controllers::machineset::Config,
        metrics: Option<Arc<mcm_controllers::metrics::Metrics>>,
    ) {
        let (stop, stopped) = oneshot::channel::<()>();
        let (caches, shutdown) = caches_until(&self.client, async move {
            let _ = stopped.await;
        });
        let task = tokio::spawn(mcm_controllers::machineset::run(
            self.client.clone(),
            config,
            caches,
            metrics,
            shutdown,
        ));
        self.set_controllers.push(RunningController { stop, task });
    }

    /// Starts the MachineDeployment controller alone (no MachineSet controller: the sets' machines and statuses are
    /// the test's to write).
    pub fn start_deployment_controller(&mut self, config: mcm_controllers::machinedeployment::Config) {
        self.spawn_deployment_controller(config, None);
    }

    fn spawn_deployment_controller(
        &mut self,
        config: mcm_controllers::machinedeployment::Config,
        metrics: Option<Arc<mcm_controllers::metrics::Metrics>>,
    ) {
        let (stop, stopped) = oneshot::channel::<()>();
        let (caches, shutdown) = caches_until(&self.client, async move {
            let _ = stopped.await;
        });
        let task = tokio::spawn(mcm_controllers::machinedeployment::run(
            self.client.clone(),
            Some(self.client.clone()),
            config,
            caches,
            metrics,
            shutdown,
        ));
        self.set_controllers.push(RunningController { stop, task });
    }

    /// Stops the controller gracefully: reconciles in flight finish.
    pub async fn stop_controller(&mut self) {
        if let Some(controller) = self.controller.take() {
            let _ = controller.stop.send(());
            tokio::time::timeout(DEADLINE, controller.task)
                .await
                .expect("the controller stops in time")
                .expect("the controller task ends cleanly");
        }
    }

    /// Kills the controller as a crash would: whatever it was doing stops where it is.
    pub async fn kill_controller(&mut self) {
        if let Some(controller) = self.controller.take() {
            controller.task.abort();
            let _ = controller.task.await;
        }
    }

    /// Kills the MachineSet and MachineDeployment controllers as a crash would.
    pub async fn kill_set_controllers(&mut self) {
        for controller in self.set_controllers.drain(..) {
            controller.task.abort();
            let _ = controller.task.await;
        }
    }

    /// Stops everything.
    pub async fn stop(mut self) {
        for controller in self.loops.drain(..).chain(self.set_controllers.drain(..)) {
            let _ = controller.stop.send(());
            let _ = tokio::time::timeout(DEADLINE, controller.task).await;
        }
        self.stop_controller().await;
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.stop().await;
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }

    /// The machines.
    pub fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// The nodes.
    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// The classes.
    pub fn classes(&self) -> Api<MachineClass> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// The sets.
    pub fn sets(&self) -> Api<MachineSet> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// The deployments.
    pub fn deployments(&self) -> Api<MachineDeployment> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// The class secret `boot` and the class [`CLASS`] (a valid sim providerSpec).
    pub async fn create_class(&self) {
        self.create_boot_secret().await;
        self.create_sim_class(
            CLASS,
            json!({
                "vmPool": "pool",
                "size": "small",
                "tags": { "kubernetes.io/cluster/test": "1", "kubernetes.io/role/node": "1" }
            }),
        )
        .await;
    }

    /// The class secret `boot`: the userData every class of the harness refers to.
    pub async fn create_boot_secret(&self) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": "boot" },
            "stringData": { "userData": "#!/bin/sh\necho <<MACHINE_NAME>>\n" }
        }))
        .expect("a secret");
        Api::<Secret>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &secret)
            .await
            .expect("the secret is created");
    }

    /// A sim class `name` with `provider_spec`, its userData in the secret `boot` ([`Cluster::create_boot_secret`]).
    pub async fn create_sim_class(&self, name: &str, provider_spec: Value) {
        let class = MachineClassBuilder::new(name)
            .provider("sim")
            .provider_spec(provider_spec)
            .secret_ref("boot", NAMESPACE)
            .build();
        self.classes()
            .create(&PostParams::default(), &class)
            .await
            .expect("the class is created");
    }

    /// A machine of [`CLASS`] as a user writes it: name and class only.
    pub async fn create_machine(&self, name: &str) -> Machine {
        self.create_built(MachineBuilder::new(name)).await
    }

    /// The machine `machine` describes, of [`CLASS`] (the class is filled in).
    pub async fn create_built(&self, machine: MachineBuilder) -> Machine {
        self.machines()
            .create(&PostParams::default(), &machine.class(CLASS).build())
            .await
            .expect("the machine is created")
    }

    /// A machine of [`CLASS`] from `value` (metadata and spec fields to add; the class is filled in).
    pub async fn create_machine_from(&self, mut value: Value) -> Machine {
        value["spec"]["class"] = json!({ "kind": "MachineClass", "name": CLASS });
        let machine: Machine = serde_json::from_value(value).expect("a machine");
        self.machines()
            .create(&PostParams::default(), &machine)
            .await
            .expect("the machine is created")
    }

    /// The machine, now.
    pub async fn machine(&self, name: &str) -> Machine {
        self.machines().get(name).await.expect("the machine exists")
    }

    /// Merge-patches a machine (main resource).
    pub async fn patch_machine(&self, name: &str, patch: Value) {
        self.machines()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect("the machine is patched");
    }

    /// Waits until the machine satisfies `check`, and returns that version.
    pub async fn wait_machine(&self, name: &str, what: &str, check: impl Fn(&Machine) -> bool) -> Machine {
        wait_for(&format!("machine {name}: {what}"), async || {
            self.machines().get_opt(name).await.ok().flatten().filter(&check)
        })
        .await
    }

    /// Waits until the machine is in `phase`.
    pub async fn wait_phase(&self, name: &str, phase: MachinePhase) -> Machine {
        self.wait_machine(name, &format!("phase {phase:?}"), |m| m.phase() == Some(phase))
            .await
    }

    /// Waits until the machine is gone (its finalizer removed after the deletion).
    pub async fn wait_gone(&self, name: &str) {
        wait_for(&format!("machine {name} to be gone"), async || {
            self.machines()
                .get_opt(name)
                .await
                .ok()
                .and_then(|m| m.is_none().then_some(()))
        })
        .await;
    }

    /// The core/v1 Events about the object `name` (of any kind).
    pub async fn events_of(&self, name: &str) -> Vec<Event> {
        events_in(&self.client)
            .await
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .collect()
    }

    /// The core/v1 Events about the object `name` with `reason`, of `kind` when one is given.
    pub async fn events_for(&self, kind: Option<&str>, name: &str, reason: &str) -> Vec<Event> {
        events_for(&self.client, kind, name, reason).await
    }
}

/// Every core/v1 Event in the test namespace.
pub async fn events_in(client: &Client) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .expect("events are listed")
        .items
}

/// The core/v1 Events about the object `name` with `reason`, of `kind` when one is given: what a user reads with
/// `kubectl get events --field-selector involvedObject.name=...`.
pub async fn events_for(client: &Client, kind: Option<&str>, name: &str, reason: &str) -> Vec<Event> {
    events_in(client)
        .await
        .into_iter()
        .filter(|e| {
            kind.is_none_or(|kind| e.involved_object.kind.as_deref() == Some(kind))
                && e.involved_object.name.as_deref() == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

/// Polls `check` until it gives a value; panics naming `what` after [`DEADLINE`].
pub async fn wait_for<T>(what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    wait_within(DEADLINE, what, check).await
}

/// [`wait_for`] with a deadline of `deadline` (a test whose waits take longer on a busy machine).
pub async fn wait_within<T>(deadline: Duration, what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    tokio::time::timeout(deadline, async {
        loop {
            if let Some(value) = check().await {
                return value;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out after {deadline:?} waiting for {what}"))
}

/// Watches `window` long for `check` to give a value, and returns it if it does: for assertions that something
/// does NOT happen, which can only be observed for a bounded time.
pub async fn watch_window<T>(window: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    tokio::time::timeout(window, async {
        loop {
            if let Some(value) = check().await {
                return value;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await
    .ok()
}

/// One version of an object as a watch delivered it.
#[derive(Clone, Debug)]
pub struct Seen<K> {
    /// Its resourceVersion (the embedded server's is one counter over all objects: versions of different kinds
    /// compare).
    pub rv: u64,
    /// Whether this is the deletion.
    pub deleted: bool,
    /// The object.
    pub object: K,
}

/// Every version of the objects of one API that a watch delivered, from the moment it started.
pub struct History<K> {
    seen: Arc<Mutex<Vec<Seen<K>>>>,
    task: JoinHandle<()>,
}

impl<K> History<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    /// Starts watching and returns once the initial list is in (so that every later change is seen).
    pub async fn start(api: Api<K>) -> Self {
        let seen: Arc<Mutex<Vec<Seen<K>>>> = Arc::default();
        let (ready, is_ready) = oneshot::channel::<()>();
        let task = tokio::spawn({
            let seen = Arc::clone(&seen);
            async move {
                let mut ready = Some(ready);
                let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
                while let Some(event) = stream.next().await {
                    let (object, deleted) = match event {
                        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => (o, false),
                        Ok(watcher::Event::Delete(o)) => (o, true),
                        Ok(watcher::Event::InitDone) => {
                            if let Some(ready) = ready.take() {
                                let _ = ready.send(());
                            }
                            continue;
                        }
                        Ok(watcher::Event::Init) | Err(_) => continue,
                    };
                    let rv = object
                        .meta()
                        .resource_version
                        .as_deref()
                        .and_then(|rv| rv.parse().ok())
                        .unwrap_or_default();
                    seen.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Seen { rv, deleted, object });
                }
            }
        });
        tokio::time::timeout(DEADLINE, is_ready)
            .await
            .expect("the watch starts in time")
            .expect("the watch starts");
        Self { seen, task }
    }

    /// Every version seen so far, in resourceVersion order.
    pub fn versions(&self) -> Vec<Seen<K>> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
        seen.sort_by_key(|s| s.rv);
        seen
    }

    /// Every version of the object named `name`, in resourceVersion order.
    pub fn of(&self, name: &str) -> Vec<Seen<K>> {
        self.versions()
            .into_iter()
            .filter(|s| s.object.meta().name.as_deref() == Some(name))
            .collect()
    }
}

impl History<Machine> {
    /// The names of the machines seen Failed at least once, sorted, each once (a replaced machine shows here).
    pub fn ever_failed(&self) -> Vec<String> {
        let names: std::collections::BTreeSet<String> = self
            .versions()
            .iter()
            .filter(|seen| seen.object.phase() == Some(mcm_api::MachinePhase::Failed))
            .filter_map(|seen| seen.object.metadata.name.clone())
            .collect();
        names.into_iter().collect()
    }
}

impl<K> Drop for History<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The machine's node label, if set.
pub fn node_label(machine: &Machine) -> Option<&str> {
    machine
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(keys::labels::NODE))
        .map(String::as_str)
}

/// The node's condition statuses by type.
pub fn node_conditions(node: &Node) -> BTreeMap<String, String> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| (c.type_.clone(), c.status.clone()))
        .collect()
}

/// Whether the node reports Ready True and none of the default unhealthy conditions True.
pub fn node_is_healthy(node: &Node) -> bool {
    let conditions = node_conditions(node);
    conditions.get("Ready").map(String::as_str) == Some("True")
        && mcm_core::timeouts::parse_node_conditions(mcm_core::timeouts::DEFAULT_NODE_CONDITIONS)
            .iter()
            .all(|c| conditions.get(c).is_none_or(|s| s != "True"))
}

/// The machine's `lastOperation.description` ("" without a status).
pub fn description(machine: &Machine) -> &str {
    machine
        .status
        .as_ref()
        .map_or("", |s| s.last_operation.description.as_str())
}

/// The machine's `lastOperation.errorCode` ("" without a status).
pub fn error_code(machine: &Machine) -> &str {
    machine
        .status
        .as_ref()
        .map_or("", |s| s.last_operation.error_code.as_str())
}

/// A plain HTTP/1.0 GET of `path` on `address` (no client library needed for one endpoint): status code and body.
pub async fn http_get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect to the metrics server");
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .await
            .expect("send the request");
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .expect("read the response");
        response
    };
    let response = tokio::time::timeout(DEADLINE, exchange)
        .await
        .expect("the metrics server answers in time");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status code");
    (status, body.to_owned())
}
