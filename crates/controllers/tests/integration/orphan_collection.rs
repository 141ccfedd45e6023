//! The orphan VM collection (reference §3.9) with the machine controller, against the embedded API server with the
//! sim provider and its kubelet: VMs made behind the controller's back are deleted once seen for the grace period,
//! young VMs and the VMs of machines being created are kept, a dry run only reports, an extra VM of a Running
//! machine goes while the machine keeps its own, and nodes without machine are marked (and unmarked).
//!
//! Each test has its own server, provider and controllers; every wait is a poll with a deadline.
//!
//! The sim's DeleteMachine deletes every VM of the machine name (docs/provider-sim.md), the providerID of the
//! request aside. The collection deletes an extra VM with a stand-in Machine carrying that VM's provider ID, which a
//! provider keyed by provider ID (as the reference's providers are) deletes alone; [`ByProviderId`] makes the sim
//! one, so that the duplicate case can show the machine keeping its VM.

use crate::support;

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use k8s_openapi::Resource as _;
use k8s_openapi::api::core::v1::{Event, Node, Secret};
use kube::{Api, Client, ResourceExt, api::PostParams};
use mcm_api::{
    Machine, MachineClass, MachinePhase,
    builders::{MachineBuilder, MachineClassBuilder, NodeBuilder},
    keys,
};
use mcm_apiserver::{ApiServer, Config as ServerConfig};
use mcm_controllers::{
    machine,
    metrics::Metrics,
    orphans::{self, Collector, Trigger},
};
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, DriverMethod, GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest,
    GetVolumeIdsResponse, InitializeMachineRequest, InitializeMachineResponse, ListMachinesRequest,
    ListMachinesResponse, MachineCode,
};
use mcm_provider_sim::{Faults, Kubelet, KubeletConfig, KubeletHandle, SimConfig, SimDriver};
use serde_json::json;
use tokio::sync::watch;

/// The longest any single wait may take.
const DEADLINE: Duration = Duration::from_secs(45);
/// How often waits look again.
const POLL: Duration = Duration::from_millis(25);
const NAMESPACE: &str = "default";
const CLASS: &str = "sim-small";
/// The grace period of the tests.
const GRACE: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A DeleteMachine the controllers sent: machine name, provider ID, when.
#[derive(Clone, Debug)]
struct Deletion {
    machine: String,
    provider_id: String,
    at: Instant,
}

/// The sim as a provider keyed by provider ID: a DeleteMachine whose machine carries the provider ID of one of
/// several VMs of the name deletes that one only (hidden from every later answer), and GetMachineStatus answers
/// for the one left. Every DeleteMachine is recorded.
struct ByProviderId {
    sim: SimDriver,
    hidden: Mutex<BTreeSet<String>>,
    deletions: Mutex<Vec<Deletion>>,
}

impl ByProviderId {
    fn new(sim: SimDriver) -> Self {
        Self {
            sim,
            hidden: Mutex::default(),
            deletions: Mutex::default(),
        }
    }

    /// The provider IDs of the VMs of a machine name the provider still has.
    fn vms_of(&self, name: &str) -> Vec<mcm_provider_sim::Vm> {
        let hidden = lock(&self.hidden).clone();
        self.sim
            .vms()
            .into_iter()
            .filter(|vm| vm.machine_name == name && !hidden.contains(&vm.provider_id))
            .collect()
    }

    /// Every provider ID the provider still has.
    fn provider_ids(&self) -> BTreeSet<String> {
        let hidden = lock(&self.hidden).clone();
        self.sim
            .vms()
            .into_iter()
            .map(|vm| vm.provider_id)
            .filter(|id| !hidden.contains(id))
            .collect()
    }

    fn deletions(&self) -> Vec<Deletion> {
        lock(&self.deletions).clone()
    }
}

#[async_trait]
impl Driver for ByProviderId {
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        self.sim.create_machine(request).await
    }

    async fn initialize_machine(
        &self,
        request: &InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        self.sim.initialize_machine(request).await
    }

    async fn delete_machine(
        &self,
        request: &DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        let name = request.machine.name_any();
        let provider_id = request.machine.spec.provider_id.clone();
        lock(&self.deletions).push(Deletion {
            machine: name.clone(),
            provider_id: provider_id.clone(),
            at: Instant::now(),
        });
        let vms = self.vms_of(&name);
        if vms.len() > 1 && vms.iter().any(|vm| vm.provider_id == provider_id) {
            lock(&self.hidden).insert(provider_id);
            return Ok(DeleteMachineResponse::default());
        }
        self.sim.delete_machine(request).await
    }

    async fn get_machine_status(
        &self,
        request: &GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        match self.sim.get_machine_status(request).await {
            Err(err) if err.code == MachineCode::OutOfRange => {
                match self.vms_of(&request.machine.name_any()).as_slice() {
                    [vm] => Ok(GetMachineStatusResponse {
                        provider_id: vm.provider_id.clone(),
                        node_name: vm.node_name.clone(),
                        addresses: vm.addresses(),
                    }),
                    _ => Err(err),
                }
            }
            other => other,
        }
    }

    async fn list_machines(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        let mut answer = self.sim.list_machines(request).await?;
        let hidden = lock(&self.hidden).clone();
        answer.machine_list.retain(|id, _| !hidden.contains(id));
        Ok(answer)
    }

    async fn get_volume_ids(
        &self,
        request: &GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        self.sim.get_volume_ids(request).await
    }
}

/// One test's world: API server, sim provider (as [`ByProviderId`]) and kubelet, the machine controller and the
/// orphan collection.
struct World {
    server: Option<ApiServer>,
    _dir: tempfile::TempDir,
    client: Client,
    sim: SimDriver,
    faults: Faults,
    driver: Arc<ByProviderId>,
    kubelet: Option<KubeletHandle>,
    metrics: Arc<Metrics>,
    trigger: Trigger,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// The collection's settings of the tests: passes every 200ms, a grace of [`GRACE`], pokes served after 50ms.
fn config() -> orphans::Config {
    orphans::Config {
        period: Duration::from_millis(200),
        grace: GRACE,
        poke_delay: Duration::from_millis(50),
        ..orphans::Config::new(NAMESPACE)
    }
}

impl World {
    /// Everything, with the collection set up by `collection`; the class is created before the controllers start.
    async fn start(collection: orphans::Config) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut server_config = ServerConfig::new(dir.path());
        server_config.in_memory = true;
        server_config.node_monitor_grace_period = Duration::from_secs(2);
        server_config.node_monitor_period = Duration::from_millis(200);
        let server = ApiServer::start(server_config)
            .await
            .expect("the API server starts");
        let client = support::client_for(&server).await;
        let sim = SimDriver::new(SimConfig::default());
        let kubelet = Kubelet::start(
            &sim,
            client.clone(),
            KubeletConfig {
                heartbeat_interval: Duration::from_millis(500),
                ..KubeletConfig::default()
            },
        );
        let driver = Arc::new(ByProviderId::new(sim.clone()));
        let metrics = Arc::new(Metrics::new());
        let trigger = Trigger::new();
        let (stop, rx) = watch::channel(false);
        let mut world = Self {
            server: Some(server),
            _dir: dir,
            client: client.clone(),
            faults: sim.faults(),
            sim,
            driver: driver.clone(),
            kubelet: Some(kubelet),
            metrics: metrics.clone(),
            trigger: trigger.clone(),
            stop,
            tasks: Vec::new(),
        };
        world.create_class().await;
        let mut settings = mcm_core::ControllerSettings::default();
        settings.retry.backoff_base = Duration::from_millis(200);
        settings.retry.backoff_cap = Duration::from_secs(2);
        // The machine controller and the collection share their caches, as in `mcm run`.
        let (caches, shutdown) = crate::support::caches_until(&client, stopped(rx));
        world.tasks.push(tokio::spawn(machine::run(
            client.clone(),
            Some(client.clone()),
            driver.clone(),
            machine::Config {
                namespace: NAMESPACE.into(),
                settings,
                concurrency: 4,
            },
            caches.clone(),
            machine::Extras::default(),
            shutdown.clone(),
        )));
        let collector = Collector::new(client.clone(), Some(client), caches, driver, collection, trigger)
            .with_metrics(metrics);
        world.tasks.push(tokio::spawn(collector.run(shutdown)));
        world
    }

    async fn stop(mut self) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            let _ = tokio::time::timeout(DEADLINE, task).await;
        }
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.stop().await;
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }

    async fn create_class(&self) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": "boot" },
            "stringData": { "userData": "#!/bin/sh\necho <<MACHINE_NAME>>\n", "token": "s3cr3t-value" }
        }))
        .expect("a secret");
        Api::<Secret>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &secret)
            .await
            .expect("the secret is created");
        let class = MachineClassBuilder::new(CLASS)
            .provider("sim")
            .provider_spec(json!({
                "vmPool": "pool",
                "size": "small",
                "tags": { "kubernetes.io/cluster/test": "1", "kubernetes.io/role/node": "1" }
            }))
            .secret_ref("boot", NAMESPACE)
            .build();
        Api::<MachineClass>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &class)
            .await
            .expect("the class is created");
    }

    fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    async fn create_machine(&self, name: &str) {
        let machine = MachineBuilder::new(name).class(CLASS).build();
        self.machines()
            .create(&PostParams::default(), &machine)
            .await
            .expect("the machine is created");
    }

    async fn wait_phase(&self, name: &str, phase: MachinePhase) -> Machine {
        wait_for(&format!("machine {name} in phase {phase:?}"), async || {
            self.machines()
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .filter(|m| m.phase() == Some(phase))
        })
        .await
    }

    /// Creates a VM for `name` behind the controllers' back: the provider is called directly, with the class's
    /// tags, for a machine that is never stored in the API server. Returns its provider ID.
    async fn vm_behind_the_back(&self, name: &str) -> String {
        let class = Api::<MachineClass>::namespaced(self.client.clone(), NAMESPACE)
            .get(CLASS)
            .await
            .expect("the class");
        let mut machine = Machine::default();
        machine.metadata.name = Some(name.into());
        machine.metadata.namespace = Some(NAMESPACE.into());
        self.sim
            .create_machine(&CreateMachineRequest {
                machine,
                machine_class: class,
                secret: Secret::default(),
            })
            .await
            .expect("the VM is created")
            .provider_id
    }

    /// Whether the provider still has this VM.
    fn has_vm(&self, provider_id: &str) -> bool {
        self.driver.provider_ids().contains(provider_id)
    }

    /// The Events on the class with this reason.
    async fn class_events(&self, reason: &str) -> Vec<Event> {
        support::events_for(&self.client, Some(MachineClass::KIND), CLASS, reason).await
    }

    /// Waits until the collection has made `n` more passes (ListMachines calls of the one class) from now.
    async fn passes(&self, n: u64) {
        let start = self.faults.calls(DriverMethod::ListMachines);
        wait_for(&format!("{n} passes of the collection"), async || {
            (self.faults.calls(DriverMethod::ListMachines) >= start + n).then_some(())
        })
        .await;
    }

    /// The value of a metric line (`name value`), 0 when absent.
    fn metric(&self, name: &str) -> u64 {
        self.metrics
            .encode()
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// Polls `check` until it gives a value; panics naming `what` after [`DEADLINE`].
async fn wait_for<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    tokio::time::timeout(DEADLINE, async {
        loop {
            if let Some(value) = check().await {
                return value;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out after {DEADLINE:?} waiting for {what}"))
}

/// Watches `window` long for `check` to give a value: for assertions that something does NOT happen, which can
/// only be observed for a bounded time.
async fn watch_window<T>(window: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> Option<T> {
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

fn messages(events: &[Event]) -> Vec<String> {
    events.iter().filter_map(|e| e.message.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vms_made_behind_the_back_are_deleted_after_the_grace_period() {
    let world = World::start(config()).await;
    world.create_machine("m1").await;
    let m1 = world.wait_phase("m1", MachinePhase::Running).await;

    let created = Instant::now();
    let ghosts = [
        world.vm_behind_the_back("ghost-1").await,
        world.vm_behind_the_back("ghost-2").await,
    ];
    for ghost in &ghosts {
        wait_for(&format!("{ghost} to be deleted"), async || {
            (!world.has_vm(ghost)).then_some(())
        })
        .await;
    }

    // Deleted with stand-ins carrying each VM's name and provider ID, never before the grace period.
    let deletions = world.driver.deletions();
    for (ghost, name) in ghosts.iter().zip(["ghost-1", "ghost-2"]) {
        let deletion = deletions
            .iter()
            .find(|d| &d.provider_id == ghost)
            .unwrap_or_else(|| panic!("a DeleteMachine for {ghost}: {deletions:?}"));
        assert_eq!(deletion.machine, name);
        assert!(
            deletion.at.duration_since(created) >= GRACE,
            "{ghost} deleted {:?} after its creation",
            deletion.at.duration_since(created)
        );
    }
    // The machine's own VM is never touched.
    assert!(deletions.iter().all(|d| d.machine != "m1"), "{deletions:?}");
    assert!(world.has_vm(&m1.spec.provider_id));
    assert_eq!(
        world.machines().get("m1").await.unwrap().phase(),
        Some(MachinePhase::Running)
    );

    // An Event and a count for each VM found and each deleted, naming the VM and never a secret value.
    let found = wait_for("two OrphanVMFound events", async || {
        Some(world.class_events(orphans::REASON_FOUND).await).filter(|e| e.len() == 2)
    })
    .await;
    let deleted = wait_for("two OrphanVMDeleted events", async || {
        Some(world.class_events(orphans::REASON_DELETED).await).filter(|e| e.len() == 2)
    })
    .await;
    for ghost in &ghosts {
        assert!(
            messages(&found).iter().any(|m| m.contains(ghost.as_str())),
            "{found:?}"
        );
        assert!(
            messages(&deleted).iter().any(|m| m.contains(ghost.as_str())),
            "{deleted:?}"
        );
    }
    assert!(found.iter().all(|e| e.type_.as_deref() == Some("Warning")));
    assert!(deleted.iter().all(|e| e.type_.as_deref() == Some("Normal")));
    for message in messages(&found).iter().chain(messages(&deleted).iter()) {
        assert!(!message.contains("s3cr3t"), "{message}");
    }
    assert_eq!(world.metric("mcm_machine_orphan_vms_found_total"), 2);
    assert_eq!(world.metric("mcm_machine_orphan_vms_deleted_total"), 2);

    // Later passes find nothing more to report.
    world.passes(3).await;
    assert_eq!(world.class_events(orphans::REASON_FOUND).await.len(), 2);
    assert_eq!(world.metric("mcm_machine_orphan_vms_deleted_total"), 2);
    world.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_young_vm_is_not_removed_yet() {
    let world = World::start(orphans::Config {
        grace: Duration::from_hours(1),
        ..config()
    })
    .await;
    let ghost = world.vm_behind_the_back("young").await;
    // Several passes see it; none may take it.
    world.passes(5).await;
    assert!(world.has_vm(&ghost));
    assert!(world.driver.deletions().is_empty());
    assert!(world.class_events(orphans::REASON_FOUND).await.is_empty());
    assert_eq!(world.metric("mcm_machine_orphan_vms_found_total"), 0);
    world.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vm_of_a_machine_being_created_is_not_removed() {
    let world = World::start(config()).await;
    // The machine's creation keeps failing after its VM exists: GetMachineStatus answers NotFound, and
    // CreateMachine creates (then adopts) the VM but answers Unavailable. The machine never records a provider ID.
    let creating = || mcm_provider_sim::Target::machines(["creating"]);
    world.faults.inject(
        mcm_provider_sim::Fault::new(DriverMethod::GetMachineStatus, MachineCode::NotFound)
            .target(creating()),
    );
    world.faults.inject(
        mcm_provider_sim::Fault::new(DriverMethod::CreateMachine, MachineCode::Unavailable)
            .target(creating())
            .after_effect(),
    );
    world.create_machine("creating").await;
    let vm = wait_for("the VM of the machine being created", async || {
        world
            .driver
            .vms_of("creating")
            .first()
            .map(|vm| vm.provider_id.clone())
    })
    .await;
    // A true orphan made at the same time is collected: the grace period has passed for both VMs.
    let ghost = world.vm_behind_the_back("ghost").await;
    wait_for("the orphan to be deleted", async || {
        (!world.has_vm(&ghost)).then_some(())
    })
    .await;
    world.passes(3).await;

    let machine = world.machines().get("creating").await.unwrap();
    assert!(
        machine.spec.provider_id.is_empty(),
        "{:?}",
        machine.spec.provider_id
    );
    assert!(
        matches!(machine.phase(), None | Some(MachinePhase::CrashLoopBackOff)),
        "{:?}",
        machine.phase()
    );
    assert!(world.has_vm(&vm), "the VM of a machine being created is kept");
    let deletions = world.driver.deletions();
    assert!(deletions.iter().all(|d| d.machine != "creating"), "{deletions:?}");
    assert_eq!(world.class_events(orphans::REASON_FOUND).await.len(), 1);
    world.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_reports_and_removes_nothing() {
    let world = World::start(orphans::Config {
        dry_run: true,
        ..config()
    })
    .await;
    let ghost = world.vm_behind_the_back("ghost").await;
    let found = wait_for("an OrphanVMFound event", async || {
        Some(world.class_events(orphans::REASON_FOUND).await).filter(|e| !e.is_empty())
    })
    .await;
    assert!(messages(&found)[0].contains(&ghost), "{found:?}");
    assert!(messages(&found)[0].contains("dry run"), "{found:?}");
    // Passes go on; the VM stays and is reported once.
    world.passes(5).await;
    assert!(world.has_vm(&ghost));
    assert!(world.driver.deletions().is_empty());
    assert_eq!(world.class_events(orphans::REASON_FOUND).await.len(), 1);
    assert!(world.class_events(orphans::REASON_DELETED).await.is_empty());
    assert_eq!(world.metric("mcm_machine_orphan_vms_found_total"), 1);
    assert_eq!(world.metric("mcm_machine_orphan_vms_deleted_total"), 0);
    world.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extra_vm_of_a_running_machine_goes_and_the_machine_keeps_its_own() {
    let world = World::start(config()).await;
    world.create_machine("m1").await;
    let m1 = world.wait_phase("m1", MachinePhase::Running).await;
    let own = m1.spec.provider_id.clone();
    let extra = world.faults.duplicate("m1").expect("a second VM for m1");
    assert_ne!(own, extra);

    wait_for("the extra VM to be deleted", async || {
        (!world.has_vm(&extra)).then_some(())
    })
    .await;
    let deletions = world.driver.deletions();
    assert_eq!(deletions.len(), 1, "{deletions:?}");
    assert_eq!(
        (deletions[0].machine.as_str(), deletions[0].provider_id.as_str()),
        ("m1", extra.as_str())
    );
    let found = wait_for("an OrphanVMFound event", async || {
        Some(world.class_events(orphans::REASON_FOUND).await).filter(|e| !e.is_empty())
    })
    .await;
    assert!(messages(&found)[0].contains(&extra), "{found:?}");
    assert!(messages(&found)[0].contains(&own), "{found:?}");

    // The machine keeps its VM and stays Running, pass after pass.
    world.passes(3).await;
    assert!(world.has_vm(&own));
    let m1 = world.machines().get("m1").await.unwrap();
    assert_eq!(m1.phase(), Some(MachinePhase::Running));
    assert_eq!(m1.spec.provider_id, own);
    assert_eq!(world.driver.deletions().len(), 1);
    assert_eq!(world.metric("mcm_machine_orphan_vms_deleted_total"), 1);
    world.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poke_starts_a_pass_soon_and_a_burst_of_pokes_one_pass() {
    let world = World::start(orphans::Config {
        period: Duration::from_hours(1),
        grace: Duration::ZERO,
        ..config()
    })
    .await;
    // The first pass runs at start; the next only on a poke.
    wait_for("the first pass", async || {
        (world.faults.calls(DriverMethod::ListMachines) >= 1).then_some(())
    })
    .await;
    let ghost = world.vm_behind_the_back("ghost").await;
    let before = world.faults.calls(DriverMethod::ListMachines);
    for _ in 0..5 {
        world.trigger.poke();
    }
    wait_for("the poked pass to delete the orphan", async || {
        (!world.has_vm(&ghost)).then_some(())
    })
    .await;
    // No second pass follows (watched for ten poke delays).
    let more = watch_window(Duration::from_millis(500), async || {
        (world.faults.calls(DriverMethod::ListMachines) > before + 1).then_some(())
    })
    .await;
    assert!(more.is_none(), "five pokes in a row make one pass");
    assert_eq!(world.faults.calls(DriverMethod::ListMachines), before + 1);
    world.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_machine_is_marked_and_unmarked_when_a_machine_claims_it() {
    let world = World::start(orphans::Config {
        creation_timeout: Duration::from_secs(2),
        ..config()
    })
    .await;
    let node = NodeBuilder::new("stray")
        .finalizer(keys::finalizers::NODE)
        .build();
    world
        .nodes()
        .create(&PostParams::default(), &node)
        .await
        .expect("the node is created");
    let created = Instant::now();
    let marked = wait_for("the node to be marked not managed", async || {
        world.nodes().get("stray").await.ok().filter(|n| {
            n.annotations()
                .get(keys::annotations::NOT_MANAGED_BY_MCM)
                .map(String::as_str)
                == Some("1")
        })
    })
    .await;
    // Not before the creation timeout: creation timestamps have whole seconds, so the node looks up to a second
    // older than it is.
    let stamped = marked
        .metadata
        .creation_timestamp
        .as_ref()
        .expect("a creation timestamp")
        .0;
    assert!(jiff::Timestamp::now() >= stamped + jiff::SignedDuration::from_secs(2));
    assert!(
        created.elapsed() >= Duration::from_secs(1),
        "{:?}",
        created.elapsed()
    );
    assert!(
        !marked.finalizers().iter().any(|f| f == keys::finalizers::NODE),
        "the node finalizer goes with the mark: {:?}",
        marked.finalizers()
    );

    // A machine of the node's name: its VM's node is this node (the sim names nodes after machines).
    world.create_machine("stray").await;
    let machine = world.wait_phase("stray", MachinePhase::Running).await;
    assert_eq!(
        machine.labels().get(keys::labels::NODE).map(String::as_str),
        Some("stray")
    );
    wait_for("the mark to go", async || {
        world.nodes().get("stray").await.ok().filter(|n| {
            !n.annotations()
                .contains_key(keys::annotations::NOT_MANAGED_BY_MCM)
        })
    })
    .await;
    world.stop().await;
}
