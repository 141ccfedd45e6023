//! The `MCMMachine` controller: reads the owner Cluster API `Machine` and its `Cluster` (as `DynamicObject`s of the
//! version the server prefers), asks [`crate::decide`] what to do, and acts through a [`Driver`].
//!
//! Never two VMs for one `MCMMachine`: the provider machine is named as the `MCMMachine` (creation is idempotent by
//! that name, spec 000), every creation attempt first looks the VM up (`GetMachineStatus`, else `ListMachines`),
//! the providerID is recorded in `spec` before `status`, and a recorded VM that the provider no longer knows is a
//! terminal failure instead of a second VM.
//!
//! Secrets (userData, credentials) are passed to the driver only; they never appear in logs, conditions or errors
//! (the requests' `Debug` is redacted, and driver messages pass through a `Redactor` of the secret's values and the
//! bootstrap data before they are recorded: a provider may quote its request).

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::{
    ByteString,
    api::core::v1::{NodeAddress, Secret, SecretReference},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
    runtime::{Controller, controller::Action, reflector::ObjectRef, watcher},
};
use mcm_api::{ClassSpec, Machine, MachineClass, MachineSpec};
use mcm_core::{
    Redactor,
    finalizers::{self, FinalizerChange},
    retry_policy::{self, RetrySettings},
};
use mcm_driver::{
    CreateMachineRequest, DeleteMachineRequest, Driver, DriverError, DriverMethod, GetMachineStatusRequest,
    InitializeMachineRequest, ListMachinesRequest, MachineCode,
};
use serde_json::{Value, json};
use tracing::Instrument;

use crate::{
    decide::{
        self, CAPI_GROUP, CLUSTER_NAME_LABEL, ClusterInfo, ErrorClass, Lookup, MachineInfo, PAUSED, READY,
        Step,
    },
    types::{FINALIZER, Initialization, MCMMachine, MCMMachineStatus, MachineAddress},
};

/// The versions of `cluster.x-k8s.io` the controller reads, best first.
pub const CAPI_VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];

/// The key of the bootstrap data in the data secret (Cluster API bootstrap contract).
pub const BOOTSTRAP_DATA_KEY: &str = "value";

/// Settings of the controller.
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch only this namespace (None: all).
    pub namespace: Option<String>,
    /// Back-off and resyncs after provider errors, as the machine controller's.
    pub retry: RetrySettings,
    /// How often an object waiting for something not watched (a secret, a MachineClass) is looked at again.
    pub wait_resync: Duration,
    /// How often discovery is tried again while `cluster.x-k8s.io` is not served.
    pub discovery_retry: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            namespace: None,
            retry: RetrySettings::default(),
            wait_resync: Duration::from_secs(30),
            discovery_retry: Duration::from_secs(5),
        }
    }
}

/// Why the controller stopped or a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the API server failed.
    #[error("API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// The object has no namespace (it is namespace-scoped).
    #[error("MCMMachine {0} has no namespace")]
    NoNamespace(String),
}

/// The Cluster API resources the server serves, in the version chosen by discovery.
#[derive(Clone, Debug)]
pub struct CapiResources {
    /// `clusters.cluster.x-k8s.io`.
    pub cluster: ApiResource,
    /// `machines.cluster.x-k8s.io`.
    pub machine: ApiResource,
}

fn capi_resource(version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: CAPI_GROUP.into(),
        version: version.into(),
        api_version: format!("{CAPI_GROUP}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Which version of `cluster.x-k8s.io` the server serves (v1beta2 preferred, v1beta1 accepted); None when neither.
pub async fn discover(client: &Client) -> Result<Option<CapiResources>, Error> {
    let groups = client.list_api_groups().await?;
    let Some(group) = groups.groups.iter().find(|g| g.name == CAPI_GROUP) else {
        return Ok(None);
    };
    let version = CAPI_VERSIONS
        .into_iter()
        .find(|v| group.versions.iter().any(|gv| gv.version == *v));
    Ok(version.map(|v| CapiResources {
        cluster: capi_resource(v, "Cluster", "clusters"),
        machine: capi_resource(v, decide::CAPI_MACHINE_KIND, "machines"),
    }))
}

struct Context {
    client: Client,
    driver: Arc<dyn Driver>,
    config: Config,
    resources: CapiResources,
    /// Consecutive transient failures and the earliest next provider call, per object.
    backoff: Mutex<HashMap<(String, String), (u32, Timestamp)>>,
}

/// Runs the controller until `shutdown` completes: waits for `cluster.x-k8s.io` to be served, then reconciles every
/// `MCMMachine` (of `config.namespace`, or all).
pub async fn run(
    client: Client,
    driver: Arc<dyn Driver>,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let mut shutdown = Box::pin(shutdown);
    let resources = loop {
        if let Some(resources) = discover(&client).await? {
            break resources;
        }
        tracing::info!("cluster.x-k8s.io is not served yet; waiting for the Cluster API CRDs");
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = tokio::time::sleep(config.discovery_retry) => {}
        }
    };
    tracing::info!(version = %resources.machine.version, "Cluster API found; MCMMachine controller starting");
    let (infra_api, machine_api, cluster_api): (Api<MCMMachine>, Api<DynamicObject>, Api<DynamicObject>) =
        match &config.namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced_with(client.clone(), ns, &resources.machine),
                Api::namespaced_with(client.clone(), ns, &resources.cluster),
            ),
            None => (
                Api::all(client.clone()),
                Api::all_with(client.clone(), &resources.machine),
                Api::all_with(client.clone(), &resources.cluster),
            ),
        };
    let controller = Controller::new(infra_api, watcher::Config::default());
    let store = controller.store();
    let ctx = Arc::new(Context {
        client,
        driver,
        config,
        resources: resources.clone(),
        backoff: Mutex::new(HashMap::new()),
    });
    controller
        .watches_with(
            machine_api,
            resources.machine.clone(),
            watcher::Config::default(),
            |machine| infrastructure_ref(&machine),
        )
        .watches_with(
            cluster_api,
            resources.cluster,
            watcher::Config::default(),
            move |cluster| {
                let (name, ns) = (cluster.name_any(), cluster.namespace());
                store
                    .state()
                    .into_iter()
                    .filter(|infra| infra.namespace() == ns)
                    .filter(|infra| infra.labels().get(CLUSTER_NAME_LABEL).is_none_or(|c| *c == name))
                    .map(|infra| ObjectRef::from_obj(&*infra))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
    Ok(())
}

/// The `MCMMachine` a Machine's `spec.infrastructureRef` names (v1beta2 `apiGroup`, v1beta1 `apiVersion`).
fn infrastructure_ref(machine: &DynamicObject) -> Option<ObjectRef<MCMMachine>> {
    let reference = machine.data.pointer("/spec/infrastructureRef")?;
    if reference.get("kind").and_then(Value::as_str) != Some("MCMMachine") {
        return None;
    }
    let name = reference.get("name").and_then(Value::as_str)?;
    Some(ObjectRef::new(name).within(&machine.namespace().unwrap_or_default()))
}

#[allow(clippy::needless_pass_by_value)] // the signature kube-runtime asks for
fn error_policy(infra: Arc<MCMMachine>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(mcmmachine = %infra.name_any(), %error, "MCMMachine reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile(infra: Arc<MCMMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = infra.name_any();
    let namespace = infra
        .namespace()
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    let span = tracing::info_span!("mcmmachine", %namespace, %name);
    Reconciler {
        ctx: &ctx,
        infra: &infra,
        namespace,
        name,
    }
    .run()
    .instrument(span)
    .await
}

/// What became of the machine's VM in [`Reconciler::find_or_create`].
enum Vm {
    /// It exists (initialized): its providerID and addresses.
    Ready(String, Vec<NodeAddress>),
    /// The recorded VM is gone.
    Vanished,
    /// A call failed.
    Failed(DriverMethod, DriverError),
}

/// What stops a provision or deletion before the provider is called.
enum Blocked {
    /// Bad configuration: terminal.
    Invalid(String),
    /// Something is missing that may come: wait.
    Waiting(&'static str, String),
}

struct Inputs {
    machine: Machine,
    class: MachineClass,
    secret: Secret,
}

struct Reconciler<'a> {
    ctx: &'a Context,
    infra: &'a MCMMachine,
    namespace: String,
    name: String,
}

impl Reconciler<'_> {
    fn api(&self) -> Api<MCMMachine> {
        Api::namespaced(self.ctx.client.clone(), &self.namespace)
    }

    async fn run(&self) -> Result<Action, Error> {
        let machine = match decide::owner_machine_name(self.infra) {
            Some(owner) => {
                let api: Api<DynamicObject> = Api::namespaced_with(
                    self.ctx.client.clone(),
                    &self.namespace,
                    &self.ctx.resources.machine,
                );
                api.get_opt(owner)
                    .await?
                    .map(|m| MachineInfo::from_object(owner, &m.data))
            }
            None => None,
        };
        let cluster = match decide::cluster_name(self.infra, machine.as_ref()) {
            Some(cluster) => {
                let api: Api<DynamicObject> = Api::namespaced_with(
                    self.ctx.client.clone(),
                    &self.namespace,
                    &self.ctx.resources.cluster,
                );
                api.get_opt(&cluster)
                    .await?
                    .map(|c| ClusterInfo::from_object(&c.data))
            }
            None => None,
        };
        let step = decide::decide(self.infra, machine.as_ref(), cluster.as_ref());
        tracing::debug!(?step, "decided");
        let now = Timestamp::now();
        match step {
            Step::WaitForOwner | Step::Failed | Step::Gone => Ok(Action::await_change()),
            Step::Paused => {
                self.report(
                    vec![decide::condition(
                        PAUSED,
                        true,
                        "Paused",
                        "reconciliation is paused",
                        false,
                    )],
                    now,
                )
                .await?;
                Ok(Action::await_change())
            }
            Step::WaitForCluster | Step::WaitForInfrastructure | Step::WaitForBootstrapData => {
                let (reason, message) = decide::wait_reason(&step).unwrap_or_default();
                self.wait(reason, message, now).await
            }
            Step::AddFinalizer => {
                self.write_finalizer(FinalizerChange::Add).await?;
                Ok(Action::requeue(Duration::from_millis(10)))
            }
            Step::Provisioned => {
                self.report(vec![not_paused()], now).await?;
                Ok(Action::await_change())
            }
            Step::Provision { data_secret } => {
                let machine = machine.unwrap_or_default();
                self.provision(&data_secret, &machine, now).await
            }
            Step::Delete => self.delete(now).await,
        }
    }

    /// Ready=False with a waiting reason, Paused=False.
    async fn wait(&self, reason: &str, message: &str, now: Timestamp) -> Result<Action, Error> {
        self.report(
            vec![
                decide::condition(READY, false, reason, message, false),
                not_paused(),
            ],
            now,
        )
        .await?;
        Ok(Action::requeue(self.ctx.config.wait_resync))
    }

    /// Writes these conditions when they change anything.
    async fn report(&self, conditions: Vec<crate::types::Condition>, now: Timestamp) -> Result<(), Error> {
        if let Some(status) = decide::with_conditions(self.infra.status.as_ref(), conditions, now) {
            self.patch_status(&status).await?;
        }
        Ok(())
    }

    async fn patch_status(&self, status: &MCMMachineStatus) -> Result<(), Error> {
        let status = serde_json::to_value(status).unwrap_or(Value::Null);
        self.api()
            .patch_status(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await?;
        Ok(())
    }

    /// The machine, class and merged secret the driver is called with; `user_data` replaces the secret's
    /// `userData` when given.
    async fn inputs(&self, user_data: Option<ByteString>) -> Result<Result<Inputs, Blocked>, Error> {
        let spec = &self.infra.spec;
        let class = match (&spec.class_ref, &spec.provider_spec) {
            (Some(_), Some(_)) => {
                return Ok(Err(Blocked::Invalid(
                    "spec.classRef and spec.providerSpec are both set; set exactly one".into(),
                )));
            }
            (None, None) => {
                return Ok(Err(Blocked::Invalid(
                    "neither spec.classRef nor spec.providerSpec is set; set exactly one".into(),
                )));
            }
            (Some(class_ref), None) => {
                let api: Api<MachineClass> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
                match api.get_opt(&class_ref.name).await? {
                    Some(class) => class,
                    None => {
                        return Ok(Err(Blocked::Waiting(
                            "WaitingForMachineClass",
                            format!("MachineClass {} not found", class_ref.name),
                        )));
                    }
                }
            }
            (None, Some(provider_spec)) => MachineClass {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..ObjectMeta::default()
                },
                provider_spec: provider_spec.clone(),
                secret_ref: spec.secret_ref.clone(),
                credentials_secret_ref: spec.credentials_secret_ref.clone(),
                ..MachineClass::default()
            },
        };
        let mut data: BTreeMap<String, ByteString> = BTreeMap::new();
        for reference in [&class.secret_ref, &class.credentials_secret_ref]
            .into_iter()
            .flatten()
        {
            match self.secret(reference).await? {
                Some(secret) => data.extend(secret.data.unwrap_or_default()),
                None => {
                    return Ok(Err(Blocked::Waiting(
                        "WaitingForSecret",
                        format!(
                            "secret {} not found",
                            reference.name.as_deref().unwrap_or_default()
                        ),
                    )));
                }
            }
        }
        if let Some(user_data) = user_data {
            data.insert(mcm_api::keys::user_data::KEY.to_owned(), user_data);
        }
        let machine = Machine {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                uid: self.infra.metadata.uid.clone(),
                ..ObjectMeta::default()
            },
            spec: MachineSpec {
                class: ClassSpec {
                    name: class.metadata.name.clone().unwrap_or_default(),
                    kind: "MachineClass".into(),
                    ..ClassSpec::default()
                },
                provider_id: spec.provider_id.clone().unwrap_or_default(),
                ..MachineSpec::default()
            },
            status: None,
        };
        Ok(Ok(Inputs {
            machine,
            class,
            secret: Secret {
                data: Some(data),
                ..Secret::default()
            },
        }))
    }

    async fn secret(&self, reference: &SecretReference) -> Result<Option<Secret>, Error> {
        let Some(name) = reference.name.as_deref() else {
            return Ok(None);
        };
        let namespace = reference.namespace.as_deref().unwrap_or(&self.namespace);
        let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), namespace);
        Ok(api.get_opt(name).await?)
    }

    fn key(&self) -> (String, String) {
        (self.namespace.clone(), self.name.clone())
    }

    /// The remaining back-off, if a transient failure's delay is not over.
    fn backing_off(&self, now: Timestamp) -> Option<Duration> {
        let backoff = self.ctx.backoff.lock().unwrap_or_else(PoisonError::into_inner);
        let (_, not_before) = backoff.get(&self.key())?;
        (now < *not_before).then(|| Duration::try_from(*not_before - now).unwrap_or_default())
    }

    fn reset_backoff(&self) {
        self.ctx
            .backoff
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key());
    }

    /// Records a transient failure; the delay before the next call.
    fn back_off(&self, now: Timestamp) -> Duration {
        let mut backoff = self.ctx.backoff.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = backoff.entry(self.key()).or_insert((0, now));
        entry.0 = entry.0.saturating_add(1);
        let delay = retry_policy::backoff(entry.0, rand::random::<f64>(), &self.ctx.config.retry);
        entry.1 = mcm_core::timeouts::add(now, delay);
        delay
    }

    async fn provision(
        &self,
        data_secret: &str,
        machine: &MachineInfo,
        now: Timestamp,
    ) -> Result<Action, Error> {
        if let Some(remaining) = self.backing_off(now) {
            return Ok(Action::requeue(remaining));
        }
        let bootstrap = self
            .secret(&SecretReference {
                name: Some(data_secret.to_owned()),
                namespace: None,
            })
            .await?
            .and_then(|s| s.data.and_then(|mut d| d.remove(BOOTSTRAP_DATA_KEY)));
        let Some(user_data) = bootstrap else {
            let message = format!("bootstrap data secret {data_secret} (key {BOOTSTRAP_DATA_KEY}) not found");
            return self.wait("WaitingForBootstrapData", &message, now).await;
        };
        let inputs = match self.inputs(Some(user_data)).await? {
            Ok(inputs) => inputs,
            Err(Blocked::Invalid(message)) => return self.fail("InvalidConfiguration", &message, now).await,
            Err(Blocked::Waiting(reason, message)) => return self.wait(reason, &message, now).await,
        };
        let Inputs {
            machine: m,
            class,
            secret,
        } = inputs;
        // A provider's message may quote its request: the secret's values and the bootstrap data go.
        let redactor = Redactor::from_secret_data(secret.data.as_ref().unwrap_or(&BTreeMap::new()));
        let (provider_id, addresses) = match Box::pin(self.find_or_create(m, class, secret)).await {
            Vm::Ready(provider_id, addresses) => (provider_id, addresses),
            Vm::Vanished => {
                let message = "the provider no longer knows the recorded VM; a second VM is never created for one \
                               MCMMachine";
                return self.fail("VMVanished", message, now).await;
            }
            Vm::Failed(method, err) => {
                return self.driver_error(method, &redactor.redact_error(&err), now).await;
            }
        };
        self.reset_backoff();
        self.provisioned(&provider_id, &addresses, machine, now).await?;
        Ok(Action::await_change())
    }

    /// The machine's VM: looked up before creating one (an earlier attempt may have created it with an unknown
    /// outcome), created if none exists, and initialized when new or uninitialized (spec 002 section 11).
    async fn find_or_create(&self, machine: Machine, class: MachineClass, secret: Secret) -> Vm {
        let lookup = self
            .ctx
            .driver
            .get_machine_status(&GetMachineStatusRequest {
                machine: machine.clone(),
                machine_class: class.clone(),
                secret: secret.clone(),
            })
            .await;
        let initialize = InitializeMachineRequest {
            machine: machine.clone(),
            machine_class: class.clone(),
            secret: secret.clone(),
        };
        match decide::after_lookup(lookup, self.infra.spec.provider_id.as_deref()) {
            Lookup::Found(vm) => Vm::Ready(vm.provider_id, vm.addresses),
            Lookup::Vanished => Vm::Vanished,
            Lookup::Failed(err) => Vm::Failed(DriverMethod::GetMachineStatus, err),
            Lookup::Uninitialized => match self.ctx.driver.initialize_machine(&initialize).await {
                Ok(vm) => Vm::Ready(vm.provider_id, vm.addresses),
                Err(err) => Vm::Failed(DriverMethod::InitializeMachine, err),
            },
            Lookup::Create | Lookup::Unsupported => {
                let listed = self
                    .ctx
                    .driver
                    .list_machines(&ListMachinesRequest {
                        machine_class: class.clone(),
                        secret: secret.clone(),
                    })
                    .await
                    .ok()
                    .and_then(|list| {
                        list.machine_list
                            .into_iter()
                            .find_map(|(id, name)| (name == self.name).then_some(id))
                    });
                if let Some(id) = listed {
                    return Vm::Ready(id, Vec::new());
                }
                tracing::info!("creating the VM");
                let created = match self
                    .ctx
                    .driver
                    .create_machine(&CreateMachineRequest {
                        machine,
                        machine_class: class,
                        secret,
                    })
                    .await
                {
                    Ok(created) => created,
                    Err(err) => return Vm::Failed(DriverMethod::CreateMachine, err),
                };
                // NotFound and Unimplemented skip initialization (the InitializeMachine table).
                match self.ctx.driver.initialize_machine(&initialize).await {
                    Err(err) if !matches!(err.code, MachineCode::NotFound | MachineCode::Unimplemented) => {
                        Vm::Failed(DriverMethod::InitializeMachine, err)
                    }
                    _ => Vm::Ready(created.provider_id, created.addresses),
                }
            }
        }
    }

    /// spec 001: "Set `spec.providerID`", "Set `status.ready` to `true`", "Set `status.addresses`", "Set
    /// `spec.failureDomain`", "Patch the resource": one patch of spec (providerID first: it must be recorded before
    /// anything else can go wrong), one of status.
    async fn provisioned(
        &self,
        provider_id: &str,
        addresses: &[NodeAddress],
        machine: &MachineInfo,
        now: Timestamp,
    ) -> Result<(), Error> {
        let failure_domain = machine
            .failure_domain
            .clone()
            .or_else(|| self.infra.spec.failure_domain.clone());
        let mut spec = serde_json::Map::new();
        if self.infra.spec.provider_id.as_deref().is_none_or(str::is_empty) {
            spec.insert("providerID".into(), json!(provider_id));
        }
        if self.infra.spec.failure_domain.is_none()
            && let Some(fd) = &failure_domain
        {
            spec.insert("failureDomain".into(), json!(fd));
        }
        if !spec.is_empty() {
            self.api()
                .patch(
                    &self.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "spec": spec })),
                )
                .await?;
        }
        let mut status = self.infra.status_or_default();
        status.ready = true;
        status.initialization = Some(Initialization {
            provisioned: Some(true),
        });
        status.addresses = addresses
            .iter()
            .map(|a| MachineAddress {
                type_: a.type_.clone(),
                address: a.address.clone(),
            })
            .collect();
        status.failure_domain = failure_domain;
        decide::set_condition(
            &mut status.conditions,
            decide::condition(READY, true, "Provisioned", "", false),
            now,
        );
        decide::set_condition(&mut status.conditions, not_paused(), now);
        self.patch_status(&status).await?;
        tracing::info!(provider_id, "VM provisioned");
        Ok(())
    }

    /// spec 001: "If they are terminal failures, set `status.failureReason` and `status.failureMessage`".
    async fn fail(&self, reason: &str, message: &str, now: Timestamp) -> Result<Action, Error> {
        tracing::warn!(reason, message, "terminal failure");
        let mut status = self.infra.status_or_default();
        status.failure_reason = Some(reason.to_owned());
        status.failure_message = Some(message.to_owned());
        status.ready = false;
        decide::set_condition(
            &mut status.conditions,
            decide::condition(READY, false, reason, message, true),
            now,
        );
        self.patch_status(&status).await?;
        Ok(Action::await_change())
    }

    async fn driver_error(
        &self,
        method: DriverMethod,
        err: &DriverError,
        now: Timestamp,
    ) -> Result<Action, Error> {
        let message = format!("{}: {err}", method.name());
        match decide::classify(method, err.code) {
            ErrorClass::Terminal => {
                let reason = if matches!(err.code, MachineCode::InvalidArgument | MachineCode::OutOfRange) {
                    "InvalidConfiguration"
                } else {
                    "CreateError"
                };
                self.fail(reason, &message, now).await
            }
            ErrorClass::Retry => {
                let delay = self.back_off(now);
                tracing::info!(%message, ?delay, "transient provider error; retrying");
                self.report(
                    vec![decide::condition(
                        READY,
                        false,
                        "ProvisioningRetrying",
                        &message,
                        false,
                    )],
                    now,
                )
                .await?;
                Ok(Action::requeue(delay))
            }
            ErrorClass::AwaitResync => {
                self.report(
                    vec![decide::condition(READY, false, err.code.name(), &message, false)],
                    now,
                )
                .await?;
                let resync = if err.code == MachineCode::ResourceExhausted {
                    self.ctx.config.retry.resource_exhausted_retry
                } else {
                    self.ctx.config.retry.await_change_resync
                };
                Ok(Action::requeue(resync))
            }
        }
    }

    /// Deleted resource: delete the VM through the driver, then remove the finalizer ("If any errors are
    /// encountered, exit the reconciliation").
    async fn delete(&self, now: Timestamp) -> Result<Action, Error> {
        if let Some(remaining) = self.backing_off(now) {
            return Ok(Action::requeue(remaining));
        }
        let recorded = self
            .infra
            .spec
            .provider_id
            .as_deref()
            .is_some_and(|id| !id.is_empty());
        match self.inputs(None).await? {
            Ok(Inputs {
                machine,
                class,
                secret,
            }) => {
                tracing::info!("deleting the VM");
                let redactor = Redactor::from_secret_data(secret.data.as_ref().unwrap_or(&BTreeMap::new()));
                let result = self
                    .ctx
                    .driver
                    .delete_machine(&DeleteMachineRequest {
                        machine,
                        machine_class: class,
                        secret,
                    })
                    .await;
                // A provider that refuses the configuration (a terminal code) cannot have made a VM from it: with no
                // VM recorded there is nothing to delete.
                let refused_unrecorded = result.as_ref().is_err_and(|err| {
                    !recorded
                        && decide::classify(DriverMethod::DeleteMachine, err.code) == ErrorClass::Terminal
                });
                if let Err(err) = result
                    && !refused_unrecorded
                {
                    let message = format!("DeleteMachine: {}", redactor.redact_error(&err));
                    let delay =
                        if decide::classify(DriverMethod::DeleteMachine, err.code) == ErrorClass::Retry {
                            self.back_off(now)
                        } else {
                            self.ctx.config.wait_resync
                        };
                    tracing::warn!(%message, "VM deletion failed");
                    self.report(
                        vec![decide::condition(READY, false, "DeletionFailed", &message, true)],
                        now,
                    )
                    .await?;
                    return Ok(Action::requeue(delay));
                }
            }
            // Nothing can have been created without a valid configuration and its class and secrets; with a
            // recorded VM, wait for them so that it is deleted.
            Err(Blocked::Invalid(message) | Blocked::Waiting(_, message)) if recorded => {
                self.report(
                    vec![decide::condition(READY, false, "DeletionFailed", &message, true)],
                    now,
                )
                .await?;
                return Ok(Action::requeue(self.ctx.config.wait_resync));
            }
            Err(_) => {}
        }
        self.reset_backoff();
        self.write_finalizer(FinalizerChange::Remove).await?;
        tracing::info!("VM deleted; finalizer removed");
        Ok(Action::await_change())
    }

    /// Adds or removes our finalizer with the project's one finalizer patch (the whole list, guarded by the
    /// resourceVersion); nothing is written when the list already is as asked.
    async fn write_finalizer(&self, change: FinalizerChange) -> Result<(), Error> {
        if let Some(patch) = finalizers::patch(&self.infra.metadata, FINALIZER, change) {
            self.api()
                .patch(&self.name, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
        }
        Ok(())
    }
}

fn not_paused() -> crate::types::Condition {
    decide::condition(PAUSED, false, "NotPaused", "", false)
}
