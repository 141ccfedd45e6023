//! [`SimDriver`]: the provider's calls on in-memory VMs.

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{NodeAddress, Secret};
use mcm_api::{Machine, MachineClass};
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, DriverMethod, GenerateMachineClassForMigrationRequest,
    GenerateMachineClassForMigrationResponse, GetMachineStatusRequest, GetMachineStatusResponse,
    GetVolumeIdsRequest, GetVolumeIdsResponse, InitializeMachineRequest, InitializeMachineResponse,
    ListMachinesRequest, ListMachinesResponse, MachineCode,
};
use rand::{SeedableRng, rngs::StdRng};
use tokio::time::Instant;

use crate::{
    faults::{CallFaults, Faults, Latency, NodeFaults},
    provider_spec::ProviderSpec,
};

/// The CSI driver name of the provider's volumes: GetVolumeIDs returns the `volumeHandle` of every persistent
/// volume of this driver and ignores the others.
pub const CSI_DRIVER: &str = "sim.csi.machine.sapcloud.io";

/// The scheme of the provider's IDs: `sim:///<namespace>/<machine-name>`.
pub const PROVIDER_ID_PREFIX: &str = "sim:///";

/// How many call instants [`crate::Faults::call_times`] keeps per method and machine (the most recent).
pub const CALL_LOG_LENGTH: usize = 256;

/// Configuration of a [`SimDriver`].
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Latency of every call whose method has none in `method_latency` (default: none).
    pub latency: Latency,
    /// Latency per method.
    pub method_latency: BTreeMap<DriverMethod, Latency>,
    /// Seed of the RNG behind [`Latency::Range`] and [`crate::Target::Random`] (default 0).
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            latency: Latency::None,
            method_latency: BTreeMap::new(),
            seed: 0,
        }
    }
}

/// The `userData` a VM was created with. Its `Debug` shows the length only: boot scripts carry tokens, and are
/// never logged.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct UserData(Vec<u8>);

impl UserData {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there was no userData.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `userData` key of a secret (`data`, else `stringData`), empty when absent.
    fn of(secret: &Secret) -> Self {
        let key = mcm_api::keys::user_data::KEY;
        let bytes = secret
            .data
            .as_ref()
            .and_then(|data| data.get(key))
            .map(|b| b.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|data| data.get(key))
                    .map(|s| s.clone().into_bytes())
            })
            .unwrap_or_default();
        Self(bytes)
    }
}

impl fmt::Debug for UserData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserData(<{} bytes>)", self.0.len())
    }
}

/// A simulated VM, as [`SimDriver::vms`] shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Vm {
    /// The provider ID: `sim:///<namespace>/<machine-name>` (a duplicate's ends with `/<n>`).
    pub provider_id: String,
    /// The name of the machine the VM backs.
    pub machine_name: String,
    /// The machine's namespace.
    pub namespace: String,
    /// The name of the VM's node (the machine name).
    pub node_name: String,
    /// The name of the class the VM was created from.
    pub class_name: String,
    /// The tags of the class (they tell the cluster).
    pub tags: BTreeMap<String, String>,
    /// The class's providerSpec the VM was created with.
    pub provider_spec: ProviderSpec,
    /// The userData the VM was created with (never logged).
    pub user_data: UserData,
    /// When the VM was created.
    pub created_at: jiff::Timestamp,
    /// The VM's internal IP address (10.0.0.0/8, one per VM).
    pub internal_ip: String,
    /// Order of creation, unique per driver.
    pub(crate) id: u64,
    /// When the VM was created, on the monotonic clock (for the kubelet's boot delay).
    pub(crate) created: Instant,
}

impl Vm {
    /// The VM's addresses: InternalIP and Hostname.
    pub fn addresses(&self) -> Vec<NodeAddress> {
        vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: self.internal_ip.clone(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: self.node_name.clone(),
            },
        ]
    }
}

/// The state behind a driver, its faults handle and its kubelet.
pub(crate) struct State {
    pub(crate) vms: BTreeMap<u64, Vm>,
    next_vm: u64,
    pub(crate) call_faults: CallFaults,
    rng: StdRng,
    pub(crate) calls: BTreeMap<DriverMethod, u64>,
    pub(crate) calls_by_machine: BTreeMap<(DriverMethod, String), u64>,
    /// When the last [`CALL_LOG_LENGTH`] calls per method and machine arrived (for back-off tests).
    pub(crate) call_log: BTreeMap<(DriverMethod, String), std::collections::VecDeque<Instant>>,
    /// VMs (by id) not initialized yet: every new VM until an InitializeMachine succeeds for it. GetMachineStatus
    /// answers `Uninitialized` for them (spec 002 section 11: the sim has something to initialise).
    pub(crate) uninitialized: std::collections::BTreeSet<u64>,
    /// GetMachineStatus answers OK for uninitialized VMs (a provider breaking spec 002 section 11; see
    /// [`crate::Faults::hide_uninitialized`]).
    pub(crate) hide_uninitialized: bool,
    pub(crate) default_latency: Latency,
    pub(crate) method_latency: BTreeMap<DriverMethod, Latency>,
    pub(crate) node_faults: BTreeMap<String, NodeFaults>,
}

impl State {
    fn add_vm(&mut self, mut vm: Vm) -> Vm {
        self.next_vm += 1;
        let n = self.next_vm;
        vm.id = n;
        vm.internal_ip = format!("10.{}.{}.{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff);
        self.vms.insert(n, vm.clone());
        vm
    }

    pub(crate) fn duplicate(&mut self, machine: &str) -> Option<String> {
        let original = self.vms.values().find(|vm| vm.machine_name == machine)?.clone();
        let base = format!(
            "{PROVIDER_ID_PREFIX}{}/{}",
            original.namespace, original.machine_name
        );
        let provider_id = (2..=self.vms.len() + 2)
            .map(|n| format!("{base}/{n}"))
            .find(|id| !self.vms.values().any(|vm| &vm.provider_id == id))?;
        let copy = Vm {
            provider_id: provider_id.clone(),
            created_at: jiff::Timestamp::now(),
            created: Instant::now(),
            ..original
        };
        self.add_vm(copy);
        Some(provider_id)
    }

    /// The VMs of a machine (by namespace and name), oldest first.
    fn vms_of<'a>(&'a self, namespace: &'a str, name: &'a str) -> impl Iterator<Item = &'a Vm> + 'a {
        self.vms
            .values()
            .filter(move |vm| vm.namespace == namespace && vm.machine_name == name)
    }
}

/// The shared part of a driver.
pub(crate) struct Shared {
    state: Mutex<State>,
    /// Bumped when the VMs or the kubelet faults change, waking the kubelet.
    changes: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells the kubelet that VMs or kubelet faults changed.
    pub(crate) fn changed(&self) {
        self.changes.send_modify(|generation| *generation += 1);
    }

    /// A receiver of change notifications.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

/// The simulated provider: a [`Driver`] whose VMs live in memory. Cheap to clone; clones share the VMs.
///
/// Every call counts itself, sleeps its latency, consults the call faults, and then acts on the VMs (see the crate
/// documentation for the rules of each call).
#[derive(Clone)]
pub struct SimDriver {
    shared: Arc<Shared>,
}

impl fmt::Debug for SimDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimDriver")
            .field("vms", &self.shared.lock().vms.len())
            .finish_non_exhaustive()
    }
}

impl Default for SimDriver {
    fn default() -> Self {
        Self::new(SimConfig::default())
    }
}

/// The name of the machine of a request; `InvalidArgument` when empty.
fn machine_name(machine: &Machine) -> Result<&str, DriverError> {
    machine
        .metadata
        .name
        .as_deref()
        .filter(|name| !name.is_empty())
        .ok_or_else(|| DriverError::invalid_argument("machine.metadata.name: must not be empty"))
}

/// The namespace of a machine: its own, else its class's, else `default`.
fn machine_namespace<'a>(machine: &'a Machine, class: &'a MachineClass) -> &'a str {
    machine
        .metadata
        .namespace
        .as_deref()
        .or(class.metadata.namespace.as_deref())
        .filter(|ns| !ns.is_empty())
        .unwrap_or("default")
}

/// The class's providerSpec, validated; `range_code` is the code of a range problem.
fn provider_spec(class: &MachineClass, range_code: MachineCode) -> Result<ProviderSpec, DriverError> {
    ProviderSpec::parse(&class.provider_spec).map_err(|err| err.to_driver_error(range_code))
}

/// A machine call's subject: namespace, name and the class's spec.
struct Subject<'a> {
    namespace: &'a str,
    name: &'a str,
    spec: ProviderSpec,
}

fn subject<'a>(
    machine: &'a Machine,
    class: &'a MachineClass,
    range_code: MachineCode,
) -> Result<Subject<'a>, DriverError> {
    let name = machine_name(machine)?;
    let spec = provider_spec(class, range_code)?;
    Ok(Subject {
        namespace: machine_namespace(machine, class),
        name,
        spec,
    })
}

/// The VMs of the subject that belong to its class's cluster (carry every tag of the class), oldest first.
fn cluster_vms<'a>(state: &'a State, subject: &'a Subject<'_>) -> Vec<&'a Vm> {
    state
        .vms_of(subject.namespace, subject.name)
        .filter(|vm| subject.spec.tags_match(&vm.tags))
        .collect()
}

impl SimDriver {
    /// A driver without VMs.
    pub fn new(config: SimConfig) -> Self {
        let state = State {
            vms: BTreeMap::new(),
            next_vm: 0,
            call_faults: CallFaults::new(),
            rng: StdRng::seed_from_u64(config.seed),
            calls: BTreeMap::new(),
            calls_by_machine: BTreeMap::new(),
            call_log: BTreeMap::new(),
            uninitialized: std::collections::BTreeSet::new(),
            hide_uninitialized: false,
            default_latency: config.latency,
            method_latency: config.method_latency,
            node_faults: BTreeMap::new(),
        };
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                changes: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    /// The fault-injection handle (shared: faults injected through any clone apply to this driver).
    pub fn faults(&self) -> Faults {
        Faults {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The machine names of the VMs whose initialization has not succeeded yet, sorted.
    pub fn uninitialized_machines(&self) -> Vec<String> {
        let state = self.shared.lock();
        let mut names: Vec<String> = state
            .uninitialized
            .iter()
            .filter_map(|id| state.vms.get(id))
            .map(|vm| vm.machine_name.clone())
            .collect();
        names.sort();
        names
    }

    /// A snapshot of every VM, oldest first.
    pub fn vms(&self) -> Vec<Vm> {
        self.shared.lock().vms.values().cloned().collect()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Runs one call: counts it, sleeps its latency, consults the faults, then runs `act` on the state (which
    /// returns the answer and whether the VMs changed).
    async fn call<T>(
        &self,
        method: DriverMethod,
        machine: Option<&str>,
        act: impl FnOnce(&mut State) -> (Result<T, DriverError>, bool),
    ) -> Result<T, DriverError> {
        let (delay, injected) = {
            let mut guard = self.shared.lock();
            let state = &mut *guard;
            *state.calls.entry(method).or_default() += 1;
            if let Some(machine) = machine {
                *state
                    .calls_by_machine
                    .entry((method, machine.to_owned()))
                    .or_default() += 1;
                let log = state.call_log.entry((method, machine.to_owned())).or_default();
                if log.len() == CALL_LOG_LENGTH {
                    log.pop_front();
                }
                log.push_back(Instant::now());
            }
            let latency = state
                .method_latency
                .get(&method)
                .copied()
                .unwrap_or(state.default_latency);
            let delay = latency.sample(&mut state.rng);
            let injected = state.call_faults.decide(method, machine, &mut state.rng);
            (delay, injected)
        };
        tracing::debug!(method = method.name(), machine, ?delay, "sim provider call");
        if delay > Duration::ZERO {
            tokio::time::sleep(delay).await;
        }
        if let Some(injected) = &injected
            && !injected.after_effect
        {
            tracing::debug!(method = method.name(), machine, code = %injected.error.code, "injected fault");
            return Err(injected.error.clone());
        }
        let (result, changed) = act(&mut self.shared.lock());
        if changed {
            self.shared.changed();
        }
        match injected {
            Some(injected) => {
                tracing::debug!(method = method.name(), machine, code = %injected.error.code, "injected fault after effect");
                Err(injected.error)
            }
            None => result,
        }
    }
}

fn not_found(subject: &Subject<'_>, class: &MachineClass) -> DriverError {
    DriverError::not_found(format!(
        "no VM for machine {}/{} carrying the tags of class {}",
        subject.namespace,
        subject.name,
        class.metadata.name.as_deref().unwrap_or_default()
    ))
}

#[async_trait]
impl Driver for SimDriver {
    /// Spec 000: "If VM backing the `Machine.Name` already exists, and is compatible with the specified `Machine`
    /// object in the `CreateMachineRequest`, the Provider MUST reply `0 OK`"; a VM with other parameters answers
    /// `AlreadyExists` ("Parameters of the existing VM don't match the ProviderSpec").
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        let (machine, class) = (&request.machine, &request.machine_class);
        let name = machine.metadata.name.as_deref();
        self.call(DriverMethod::CreateMachine, name, |state| {
            let subject = match subject(machine, class, MachineCode::OutOfRange) {
                Ok(subject) => subject,
                Err(err) => return (Err(err), false),
            };
            let response = |vm: &Vm| CreateMachineResponse {
                provider_id: vm.provider_id.clone(),
                node_name: vm.node_name.clone(),
                last_known_state: String::new(),
                addresses: vm.addresses(),
            };
            if let Some(existing) = state.vms_of(subject.namespace, subject.name).next() {
                let differences = existing.provider_spec.differences(&subject.spec);
                return if differences.is_empty() {
                    (Ok(response(existing)), false)
                } else {
                    (
                        Err(DriverError::new(
                            MachineCode::AlreadyExists,
                            format!(
                                "VM {} of machine {}/{} exists with other parameters ({} differ from the \
                                 providerSpec of class {})",
                                existing.provider_id,
                                subject.namespace,
                                subject.name,
                                differences.join(", "),
                                class.metadata.name.as_deref().unwrap_or_default()
                            ),
                        )),
                        false,
                    )
                };
            }
            let vm = state.add_vm(Vm {
                provider_id: format!("{PROVIDER_ID_PREFIX}{}/{}", subject.namespace, subject.name),
                machine_name: subject.name.to_owned(),
                namespace: subject.namespace.to_owned(),
                node_name: subject.name.to_owned(),
                class_name: class.metadata.name.clone().unwrap_or_default(),
                tags: subject.spec.tags.clone(),
                provider_spec: subject.spec,
                user_data: UserData::of(&request.secret),
                created_at: jiff::Timestamp::now(),
                internal_ip: String::new(),
                id: 0,
                created: Instant::now(),
            });
            state.uninitialized.insert(vm.id);
            tracing::debug!(provider_id = vm.provider_id, "sim VM created");
            (Ok(response(&vm)), true)
        })
        .await
    }

    /// Answers the VM's provider ID, node name and addresses; `NotFound` without a VM (spec 002 section 11).
    async fn initialize_machine(
        &self,
        request: &InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        let (machine, class) = (&request.machine, &request.machine_class);
        let name = machine.metadata.name.as_deref();
        let result = self
            .call(DriverMethod::InitializeMachine, name, |state| {
                let result = subject(machine, class, MachineCode::InvalidArgument).and_then(|subject| {
                    let vm = cluster_vms(state, &subject).first().map(|vm| {
                        (
                            vm.id,
                            InitializeMachineResponse {
                                provider_id: vm.provider_id.clone(),
                                node_name: vm.node_name.clone(),
                                addresses: vm.addresses(),
                            },
                        )
                    });
                    vm.ok_or_else(|| not_found(&subject, class))
                });
                let result = result.map(|(id, response)| {
                    state.uninitialized.remove(&id);
                    response
                });
                (result, false)
            })
            .await;
        // A VM whose initialization failed stays uninitialized: GetMachineStatus says so until it succeeds.
        if let Err(err) = &result
            && err.code == MachineCode::Uninitialized
        {
            let mut state = self.shared.lock();
            if let Ok(subject) = subject(machine, class, MachineCode::InvalidArgument) {
                let ids: Vec<u64> = cluster_vms(&state, &subject).iter().map(|vm| vm.id).collect();
                state.uninitialized.extend(ids);
            }
        }
        result
    }

    /// Spec 000: "If a VM corresponding to the specified machine-object's name does not exist [...] the Provider
    /// MUST reply `0 OK`", and "The provider SHALL only act on machines belonging to the cluster-id/cluster-name
    /// obtained from the `ProviderSpec`": every VM of the machine carrying the class's tags goes.
    async fn delete_machine(
        &self,
        request: &DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        let (machine, class) = (&request.machine, &request.machine_class);
        let name = machine.metadata.name.as_deref();
        self.call(DriverMethod::DeleteMachine, name, |state| {
            let subject = match subject(machine, class, MachineCode::InvalidArgument) {
                Ok(subject) => subject,
                Err(err) => return (Err(err), false),
            };
            let doomed: Vec<u64> = cluster_vms(state, &subject).iter().map(|vm| vm.id).collect();
            for id in &doomed {
                if let Some(vm) = state.vms.remove(id) {
                    tracing::debug!(provider_id = vm.provider_id, "sim VM deleted");
                }
            }
            (Ok(DeleteMachineResponse::default()), !doomed.is_empty())
        })
        .await
    }

    /// `NotFound` without a VM carrying the class's tags, `OutOfRange` for several ("Multiple VMs found with
    /// matching machine object names").
    async fn get_machine_status(
        &self,
        request: &GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        let (machine, class) = (&request.machine, &request.machine_class);
        let name = machine.metadata.name.as_deref();
        self.call(DriverMethod::GetMachineStatus, name, |state| {
            let result =
                subject(machine, class, MachineCode::InvalidArgument).and_then(|subject| match cluster_vms(
                    state, &subject,
                )
                .as_slice()
                {
                    [] => Err(not_found(&subject, class)),
                    // Spec 002 section 11: "If the instance associated with machine exists, but the instance was
                    // not initialized as expected, the provider implementations of GetMachineStatus should return
                    // an error: status.Error(codes.Initialization)".
                    [vm] if state.uninitialized.contains(&vm.id) && !state.hide_uninitialized => {
                        Err(DriverError::new(
                            MachineCode::Uninitialized,
                            format!(
                                "VM {} of machine {}/{} exists but is not initialized",
                                vm.provider_id, subject.namespace, subject.name
                            ),
                        ))
                    }
                    [vm] => Ok(GetMachineStatusResponse {
                        provider_id: vm.provider_id.clone(),
                        node_name: vm.node_name.clone(),
                        addresses: vm.addresses(),
                    }),
                    several => Err(DriverError::new(
                        MachineCode::OutOfRange,
                        format!(
                            "{} VMs found for machine {}/{}: {}",
                            several.len(),
                            subject.namespace,
                            subject.name,
                            several
                                .iter()
                                .map(|vm| vm.provider_id.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )),
                });
            (result, false)
        })
        .await
    }

    /// Every VM carrying the class's tags, provider ID to machine name.
    async fn list_machines(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        let class = &request.machine_class;
        self.call(DriverMethod::ListMachines, None, |state| {
            let result =
                provider_spec(class, MachineCode::InvalidArgument).map(|spec| ListMachinesResponse {
                    machine_list: state
                        .vms
                        .values()
                        .filter(|vm| spec.tags_match(&vm.tags))
                        .map(|vm| (vm.provider_id.clone(), vm.machine_name.clone()))
                        .collect(),
                });
            (result, false)
        })
        .await
    }

    /// The `volumeHandle` of every CSI volume of the driver [`CSI_DRIVER`], in order; other volumes (another CSI
    /// driver, hostPath, local, ...) and volumes with an empty handle are ignored (spec 000: "the provider MAY
    /// chose to ignore it").
    async fn get_volume_ids(
        &self,
        request: &GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        self.call(DriverMethod::GetVolumeIds, None, |_| {
            let volume_ids = request
                .pv_specs
                .iter()
                .filter_map(|spec| spec.csi.as_ref())
                .filter(|csi| csi.driver == CSI_DRIVER && !csi.volume_handle.is_empty())
                .map(|csi| csi.volume_handle.clone())
                .collect();
            (Ok(GetVolumeIdsResponse { volume_ids }), false)
        })
        .await
    }

    /// `Unimplemented`: the simulated provider has no provider-specific class kind to migrate from (spec 000:
    /// "A Provider SHOULD implement this driver call, else it MUST return a `UNIMPLEMENTED` status").
    async fn generate_machine_class_for_migration(
        &self,
        request: &GenerateMachineClassForMigrationRequest,
    ) -> Result<GenerateMachineClassForMigrationResponse, DriverError> {
        let result = migrate_class(request);
        self.call(DriverMethod::GenerateMachineClassForMigration, None, |_| {
            (result, false)
        })
        .await
    }
}

/// The one old class kind the sim migrates: `SimMachineClass`, whose `spec` is the providerSpec plus the secret
/// references. Other kinds are Unimplemented, as spec 000 asks of a provider that cannot convert them.
pub const OLD_CLASS_KIND: &str = "SimMachineClass";

fn migrate_class(
    request: &GenerateMachineClassForMigrationRequest,
) -> Result<GenerateMachineClassForMigrationResponse, DriverError> {
    let old = &request.provider_specific_machine_class;
    if request.class_spec.kind != OLD_CLASS_KIND || old["kind"] != OLD_CLASS_KIND {
        return Err(DriverError::new(
            MachineCode::Unimplemented,
            format!(
                "the sim provider migrates only {OLD_CLASS_KIND}, not {}",
                request.class_spec.kind
            ),
        ));
    }
    let mut spec = old
        .get("spec")
        .and_then(serde_json::Value::as_object)
        .cloned()
        .ok_or_else(|| DriverError::invalid_argument(format!("{OLD_CLASS_KIND}.spec: Required value")))?;
    let reference = |value: Option<serde_json::Value>, field: &str| {
        value
            .map(serde_json::from_value)
            .transpose()
            .map_err(|err| DriverError::invalid_argument(format!("{OLD_CLASS_KIND}.spec.{field}: {err}")))
    };
    let secret_ref = reference(spec.remove("secretRef"), "secretRef")?;
    let credentials_secret_ref = reference(spec.remove("credentialsSecretRef"), "credentialsSecretRef")?;
    let mut machine_class = request.machine_class.clone();
    "sim".clone_into(&mut machine_class.provider);
    machine_class.provider_spec = serde_json::Value::Object(spec);
    machine_class.secret_ref = secret_ref;
    machine_class.credentials_secret_ref = credentials_secret_ref;
    Ok(GenerateMachineClassForMigrationResponse { machine_class })
}

#[cfg(test)]
mod tests;
