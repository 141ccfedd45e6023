//! The conformance suite against the sim provider served over gRPC (every check passes), and against providers
//! broken on purpose, one rule each (the suite fails exactly the check of that rule). Every test serves its own
//! provider on a socket in its own temporary directory, and the suite leaves no VM behind.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use mcm_api::{MachineClass, builders::MachineClassBuilder};
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, DriverMethod, GenerateMachineClassForMigrationRequest,
    GenerateMachineClassForMigrationResponse, GetMachineStatusRequest, GetMachineStatusResponse,
    GetVolumeIdsRequest, GetVolumeIdsResponse, InitializeMachineRequest, InitializeMachineResponse,
    ListMachinesRequest, ListMachinesResponse, MachineCode,
};
use mcm_grpc::{
    ClientOptions, Endpoint, GrpcDriver, ProviderInfo,
    conformance::{self, Check, Input, Outcome},
};
use mcm_provider_sim::{SimConfig, SimDriver};
use pretty_assertions::assert_eq;
use serde_json::json;
use tempfile::TempDir;
use tokio::{sync::oneshot, task::JoinHandle};

/// How long serving, readiness and the whole suite may take in a test. Generous for a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_mins(2);

fn class() -> MachineClass {
    MachineClassBuilder::new("sim-small")
        .namespace("default")
        .provider("sim")
        .provider_spec(json!({
            "vmPool": "test-worker-pool",
            "size": "small",
            "rootFsSize": 20,
            "tags": { "kubernetes.io/cluster/conformance": "1", "kubernetes.io/role/node": "1" },
        }))
        .secret_ref("sim-worker", "default")
        .build()
}

fn secret() -> Secret {
    serde_json::from_value(json!({
        "metadata": { "name": "sim-worker", "namespace": "default" },
        "data": { "userData": "IyEvYmluL3NoCmVjaG8gYm9vdAo=" },
    }))
    .expect("a valid secret")
}

fn input() -> Input {
    Input {
        class: class(),
        secret: secret(),
        name_prefix: "conformance".into(),
    }
}

/// The optional calls the sim implements (all of them).
fn sim_methods() -> Vec<DriverMethod> {
    vec![
        DriverMethod::InitializeMachine,
        DriverMethod::GetMachineStatus,
        DriverMethod::ListMachines,
        DriverMethod::GetVolumeIds,
        DriverMethod::GenerateMachineClassForMigration,
    ]
}

fn info(optional_methods: Vec<DriverMethod>) -> ProviderInfo {
    ProviderInfo {
        name: "sim".into(),
        version: "test".into(),
        optional_methods,
    }
}

/// A provider served on a socket of its own directory, and a client of it.
struct Served {
    client: GrpcDriver,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), mcm_grpc::ServeError>>,
    _dir: TempDir,
}

impl Served {
    /// Serves `driver` with this identity and waits until the socket accepts connections.
    async fn start(driver: Arc<dyn Driver>, info: ProviderInfo) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("provider.sock");
        let endpoint = Endpoint::Unix(path.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = endpoint.clone();
        let task = tokio::spawn(async move {
            mcm_grpc::serve(driver, info, &serving, None, async move {
                let _ = stopped.await;
            })
            .await
        });
        // Poll the socket itself, not the client, so that the client never starts in back-off.
        tokio::time::timeout(DEADLINE, async {
            while tokio::net::UnixStream::connect(&path).await.is_err() {
                assert!(!task.is_finished(), "the provider stopped before serving");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the provider serves in time");
        let client = GrpcDriver::new(endpoint, ClientOptions::default()).expect("a client");
        Self {
            client,
            stop: Some(stop),
            task,
            _dir: dir,
        }
    }

    /// Runs the suite against the provider.
    async fn run(&self) -> Vec<Check> {
        self.run_with_timeout(conformance::CALL_TIMEOUT).await
    }

    /// Runs the suite against the provider with another bound on each call.
    async fn run_with_timeout(&self, call_timeout: Duration) -> Vec<Check> {
        let checks = tokio::time::timeout(
            DEADLINE,
            conformance::run_with_timeout(&self.client, &input(), call_timeout),
        )
        .await
        .expect("the suite finishes in time");
        println!("{}", conformance::render(&checks));
        checks
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("the provider stops in time")
            .expect("the provider task ends")
            .expect("the provider ends cleanly");
    }
}

/// The names of the failed checks.
fn failed(checks: &[Check]) -> Vec<&'static str> {
    checks
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Failed(_)))
        .map(|c| c.name)
        .collect()
}

fn outcome<'a>(checks: &'a [Check], name: &str) -> &'a Outcome {
    &checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}"))
        .outcome
}

fn failure<'a>(checks: &'a [Check], name: &str) -> &'a str {
    match outcome(checks, name) {
        Outcome::Failed(detail) => detail,
        other => panic!("{name} did not fail: {other:?}"),
    }
}

/// How a provider is broken: one rule each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Breakage {
    /// A repeated CreateMachine answers a new providerID (as a provider creating a VM per call would).
    FreshProviderId,
    /// DeleteMachine of a missing VM answers NotFound instead of OK.
    DeleteMissingNotFound,
    /// GetMachineStatus answers NotFound without a message.
    SilentNotFound,
    /// ListMachines is declared but answers Unimplemented.
    ListDeclaredUnimplemented,
    /// GetMachineStatus works but is not declared.
    StatusUndeclared,
    /// An invalid providerSpec is refused with Internal instead of InvalidArgument.
    InvalidSpecInternal,
    /// GetVolumeIDs never answers.
    HangingVolumeIds,
    /// GetMachineStatus answers Uninitialized for a machine's first call, then OK without any InitializeMachine.
    InitializedByItself,
    /// Not broken: GetMachineStatus answers Uninitialized until InitializeMachine has succeeded (as a provider with
    /// work to do after creation, such as the Python example).
    NeedsInitialization,
}

/// The sim with one rule broken.
struct Broken {
    sim: SimDriver,
    breakage: Breakage,
    /// CreateMachine calls per machine.
    creates: Mutex<BTreeMap<String, u32>>,
    /// GetMachineStatus calls per machine.
    statuses: Mutex<BTreeMap<String, u32>>,
    /// The machines whose InitializeMachine succeeded.
    initialized: Mutex<std::collections::BTreeSet<String>>,
}

impl Broken {
    fn new(sim: &SimDriver, breakage: Breakage) -> Self {
        // The sim answers Uninitialized until initialized by itself; these two play the rule their own way.
        if matches!(
            breakage,
            Breakage::InitializedByItself | Breakage::NeedsInitialization
        ) {
            sim.faults().hide_uninitialized(true);
        }
        Self {
            sim: sim.clone(),
            breakage,
            creates: Mutex::default(),
            statuses: Mutex::default(),
            initialized: Mutex::default(),
        }
    }

    fn info(&self) -> ProviderInfo {
        let mut methods = sim_methods();
        if self.breakage == Breakage::StatusUndeclared {
            methods.retain(|m| *m != DriverMethod::GetMachineStatus);
        }
        info(methods)
    }
}

#[async_trait]
impl Driver for Broken {
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        let mut answer = self.sim.create_machine(request).await;
        match (self.breakage, &mut answer) {
            (Breakage::FreshProviderId, Ok(created)) => {
                let name = request.machine.metadata.name.clone().unwrap_or_default();
                let calls = {
                    let mut per_machine = self.creates.lock().unwrap_or_else(PoisonError::into_inner);
                    let count = per_machine.entry(name).or_default();
                    *count += 1;
                    *count
                };
                if calls > 1 {
                    created.provider_id = format!("{}-{calls}", created.provider_id);
                }
            }
            (Breakage::InvalidSpecInternal, Err(error)) if error.code == MachineCode::InvalidArgument => {
                error.code = MachineCode::Internal;
            }
            _ => {}
        }
        answer
    }

    async fn initialize_machine(
        &self,
        request: &InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        let answer = self.sim.initialize_machine(request).await;
        if answer.is_ok() {
            let name = request.machine.metadata.name.clone().unwrap_or_default();
            self.initialized
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name);
        }
        answer
    }

    async fn delete_machine(
        &self,
        request: &DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        if self.breakage == Breakage::DeleteMissingNotFound {
            let name = request.machine.metadata.name.clone().unwrap_or_default();
            if !self.sim.vms().iter().any(|vm| vm.machine_name == name) {
                return Err(DriverError::not_found(format!("no VM for machine {name}")));
            }
        }
        self.sim.delete_machine(request).await
    }

    async fn get_machine_status(
        &self,
        request: &GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        let answer = self.sim.get_machine_status(request).await;
        let name = request.machine.metadata.name.clone().unwrap_or_default();
        let calls = {
            let mut per_machine = self.statuses.lock().unwrap_or_else(PoisonError::into_inner);
            let count = per_machine.entry(name.clone()).or_default();
            *count += 1;
            *count
        };
        let initialized = self
            .initialized
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&name);
        let uninitialized = match self.breakage {
            Breakage::InitializedByItself => calls == 1,
            Breakage::NeedsInitialization => !initialized,
            _ => false,
        };
        if uninitialized && answer.is_ok() {
            return Err(DriverError::new(
                MachineCode::Uninitialized,
                format!("VM of machine {name} is not initialized yet"),
            ));
        }
        match answer {
            Err(error)
                if self.breakage == Breakage::SilentNotFound && error.code == MachineCode::NotFound =>
            {
                Err(DriverError::new(MachineCode::NotFound, ""))
            }
            other => other,
        }
    }

    async fn list_machines(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        if self.breakage == Breakage::ListDeclaredUnimplemented {
            return Err(DriverError::unimplemented(DriverMethod::ListMachines));
        }
        self.sim.list_machines(request).await
    }

    async fn get_volume_ids(
        &self,
        request: &GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        if self.breakage == Breakage::HangingVolumeIds {
            std::future::pending::<()>().await;
        }
        self.sim.get_volume_ids(request).await
    }

    async fn generate_machine_class_for_migration(
        &self,
        request: &GenerateMachineClassForMigrationRequest,
    ) -> Result<GenerateMachineClassForMigrationResponse, DriverError> {
        self.sim.generate_machine_class_for_migration(request).await
    }
}

/// Runs the suite against the sim broken this way; asserts it fails exactly `expected` and leaves no VM. Returns
/// the checks.
async fn run_broken(breakage: Breakage, expected: &str) -> Vec<Check> {
    run_broken_with_timeout(breakage, expected, conformance::CALL_TIMEOUT).await
}

async fn run_broken_with_timeout(breakage: Breakage, expected: &str, call_timeout: Duration) -> Vec<Check> {
    let sim = SimDriver::new(SimConfig::default());
    let broken = Broken::new(&sim, breakage);
    let info = broken.info();
    let served = Served::start(Arc::new(broken), info).await;
    let checks = served.run_with_timeout(call_timeout).await;
    served.stop().await;
    assert_eq!(failed(&checks), vec![expected], "{breakage:?}");
    assert!(!conformance::passed(&checks));
    assert_eq!(
        sim.vms(),
        Vec::new(),
        "{breakage:?}: the suite deleted every VM it made"
    );
    checks
}

#[tokio::test]
async fn the_sim_provider_passes_every_check() {
    let sim = SimDriver::new(SimConfig::default());
    let served = Served::start(Arc::new(sim.clone()), info(sim_methods())).await;
    let checks = served.run().await;
    served.stop().await;

    let names: Vec<&str> = checks.iter().map(|c| c.name).collect();
    assert_eq!(names, conformance::CHECK_NAMES.to_vec(), "every check, in order");
    for check in &checks {
        assert!(
            ["MUST", "SHALL", "REQUIRED"]
                .iter()
                .any(|word| check.requirement.contains(word)),
            "{} quotes a MUST, SHALL or REQUIRED sentence: {}",
            check.name,
            check.requirement
        );
        if check.name == conformance::GENERATE_MACHINE_CLASS_FOR_MIGRATION {
            // Declared by the sim: judging a conversion needs a provider-specific class the suite does not have.
            assert!(matches!(check.outcome, Outcome::Skipped(_)), "{check:?}");
        } else {
            assert_eq!(check.outcome, Outcome::Passed, "{}", check.name);
        }
    }
    assert!(conformance::passed(&checks));
    assert_eq!(sim.vms(), Vec::new(), "the suite deleted every VM it made");
    // The sim was asked for everything: creation, the refused creations, deletion.
    let calls = sim.faults().calls(DriverMethod::CreateMachine);
    assert_eq!(calls, 4, "create, repeat, and two invalid providerSpecs");
}

#[tokio::test]
async fn a_provider_answering_uninitialized_until_initialized_passes_every_check() {
    let sim = SimDriver::new(SimConfig::default());
    let provider = Broken::new(&sim, Breakage::NeedsInitialization);
    let info = provider.info();
    let served = Served::start(Arc::new(provider), info).await;
    let checks = served.run().await;
    served.stop().await;
    assert_eq!(failed(&checks), Vec::<&str>::new());
    assert_eq!(
        outcome(&checks, conformance::UNINITIALIZED_UNTIL_INITIALIZED),
        &Outcome::Passed
    );
    assert_eq!(sim.vms(), Vec::new(), "the suite deleted every VM it made");
}

#[tokio::test]
async fn a_vm_that_turns_ok_without_initialize_machine_fails_the_initialization_rule() {
    let checks = run_broken(
        Breakage::InitializedByItself,
        conformance::UNINITIALIZED_UNTIL_INITIALIZED,
    )
    .await;
    let detail = failure(&checks, conformance::UNINITIALIZED_UNTIL_INITIALIZED);
    assert!(
        detail.contains(
            "answered Uninitialized (answer 1), then OK (answer 2) before any InitializeMachine had succeeded"
        ),
        "{detail}"
    );
}

#[tokio::test]
async fn a_fresh_provider_id_on_a_repeated_create_fails_idempotency() {
    let checks = run_broken(Breakage::FreshProviderId, conformance::CREATE_MACHINE_IDEMPOTENT).await;
    let detail = failure(&checks, conformance::CREATE_MACHINE_IDEMPOTENT);
    assert!(detail.contains("sim:///default/conformance-1-2"), "{detail}");
}

#[tokio::test]
async fn not_found_for_deleting_a_missing_vm_fails_delete() {
    let checks = run_broken(
        Breakage::DeleteMissingNotFound,
        conformance::DELETE_MACHINE_IDEMPOTENT,
    )
    .await;
    let detail = failure(&checks, conformance::DELETE_MACHINE_IDEMPOTENT);
    assert!(
        detail.contains("already deleted") && detail.contains("NotFound"),
        "{detail}"
    );
    assert!(detail.contains("never had a VM"), "{detail}");
    assert!(
        !detail.contains("conformance-1: "),
        "the first deletion succeeded: {detail}"
    );
}

#[tokio::test]
async fn an_error_without_a_message_fails_error_messages() {
    let checks = run_broken(Breakage::SilentNotFound, conformance::ERROR_MESSAGES).await;
    let detail = failure(&checks, conformance::ERROR_MESSAGES);
    assert!(detail.contains("GetMachineStatus NotFound (5)"), "{detail}");
}

#[tokio::test]
async fn a_declared_list_machines_answering_unimplemented_fails_list_machines() {
    let checks = run_broken(Breakage::ListDeclaredUnimplemented, conformance::LIST_MACHINES).await;
    let detail = failure(&checks, conformance::LIST_MACHINES);
    assert!(detail.contains("Unimplemented"), "{detail}");
}

#[tokio::test]
async fn an_undeclared_get_machine_status_that_answers_fails_get_machine_status() {
    let checks = run_broken(Breakage::StatusUndeclared, conformance::GET_MACHINE_STATUS).await;
    let detail = failure(&checks, conformance::GET_MACHINE_STATUS);
    assert!(
        detail.contains("not in the identity's optional_methods"),
        "{detail}"
    );
}

#[tokio::test]
async fn an_invalid_provider_spec_refused_with_internal_fails_invalid_provider_spec() {
    let checks = run_broken(Breakage::InvalidSpecInternal, conformance::INVALID_PROVIDER_SPEC).await;
    let detail = failure(&checks, conformance::INVALID_PROVIDER_SPEC);
    assert!(
        detail.contains("Internal (13)") && detail.contains("expected InvalidArgument"),
        "{detail}"
    );
    assert!(
        detail.contains("without size") && detail.contains("no providerSpec"),
        "{detail}"
    );
}

#[tokio::test]
async fn a_call_that_never_answers_fails_its_check_in_bounded_time() {
    let timeout = Duration::from_secs(2);
    let checks =
        run_broken_with_timeout(Breakage::HangingVolumeIds, conformance::GET_VOLUME_IDS, timeout).await;
    let detail = failure(&checks, conformance::GET_VOLUME_IDS);
    assert!(
        detail.contains("GetVolumeIDs did not answer within 2s"),
        "{detail}"
    );
}

/// A provider of the two REQUIRED calls only, declaring no optional call.
struct Minimal(SimDriver);

#[async_trait]
impl Driver for Minimal {
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        self.0.create_machine(request).await
    }

    async fn delete_machine(
        &self,
        request: &DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        self.0.delete_machine(request).await
    }
}

#[tokio::test]
async fn a_provider_of_the_required_calls_only_conforms() {
    let sim = SimDriver::new(SimConfig::default());
    let served = Served::start(Arc::new(Minimal(sim.clone())), info(Vec::new())).await;
    let checks = served.run().await;
    served.stop().await;
    assert_eq!(failed(&checks), Vec::<&str>::new());
    assert!(conformance::passed(&checks));
    for name in [
        conformance::GET_MACHINE_STATUS,
        conformance::LIST_MACHINES,
        conformance::INITIALIZE_MACHINE,
        conformance::GET_VOLUME_IDS,
        conformance::GENERATE_MACHINE_CLASS_FOR_MIGRATION,
    ] {
        assert_eq!(
            outcome(&checks, name),
            &Outcome::Passed,
            "{name} answers Unimplemented"
        );
    }
    assert!(
        matches!(
            outcome(&checks, conformance::DELETED_MACHINE_NOT_FOUND),
            Outcome::Skipped(_)
        ),
        "nothing to observe the deletion with"
    );
    assert_eq!(sim.vms(), Vec::new());
}

#[tokio::test]
async fn an_unreachable_provider_fails_fast_without_hanging() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let endpoint = Endpoint::Unix(dir.path().join("nobody.sock"));
    let client = GrpcDriver::new(endpoint, ClientOptions::default()).expect("a client");
    let checks = tokio::time::timeout(DEADLINE, conformance::run(&client, &input()))
        .await
        .expect("the suite finishes in time");
    println!("{}", conformance::render(&checks));
    assert!(!conformance::passed(&checks));
    assert_eq!(checks.len(), conformance::CHECK_NAMES.len());
    assert!(matches!(
        outcome(&checks, conformance::IDENTITY),
        Outcome::Failed(_)
    ));
    assert!(matches!(
        outcome(&checks, conformance::CREATE_MACHINE),
        Outcome::Failed(_)
    ));
    assert!(
        matches!(outcome(&checks, conformance::LIST_MACHINES), Outcome::Skipped(_)),
        "optional calls need the identity"
    );
    // Only the messages pass: the client's errors for an unreachable provider say what happened.
    let passing: Vec<&str> = checks
        .iter()
        .filter(|c| c.outcome == Outcome::Passed)
        .map(|c| c.name)
        .collect();
    assert_eq!(passing, vec![conformance::ERROR_MESSAGES]);
}

#[test]
fn the_report_has_a_line_per_check_and_a_summary() {
    let checks = vec![
        Check {
            name: conformance::IDENTITY,
            requirement: "MUST a",
            outcome: Outcome::Passed,
        },
        Check {
            name: conformance::CREATE_MACHINE,
            requirement: "MUST b",
            outcome: Outcome::Failed("it broke\non two lines".into()),
        },
        Check {
            name: conformance::LIST_MACHINES,
            requirement: "SHALL c",
            outcome: Outcome::Skipped("not declared".into()),
        },
    ];
    let report = conformance::render(&checks);
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(lines.len(), 4, "{report}");
    assert_eq!(lines[0], "PASS identity");
    assert!(lines[1].starts_with("FAIL create-machine") && lines[1].contains("it broke on two lines"));
    assert!(lines[1].contains("MUST b"), "a failure quotes its requirement");
    assert!(lines[2].starts_with("SKIP list-machines") && lines[2].contains("not declared"));
    assert_eq!(
        lines[3],
        "3 checks: 1 passed, 1 failed, 1 skipped: the provider does NOT conform"
    );
    assert!(!conformance::passed(&checks));
    assert!(conformance::passed(&checks[..1]));
    assert!(conformance::passed(&[checks[0].clone(), checks[2].clone()]));
    assert!(!conformance::passed(&checks[2..]), "nothing passed");
}
