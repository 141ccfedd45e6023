//! [`GrpcDriver`]: a [`Driver`] backed by a provider out of process. Every call has a deadline; a provider that
//! cannot be reached is retried with exponential back-off (calls in between fail at once with Unavailable instead of
//! piling up on a dead socket); the channel reconnects by itself. Metrics per method and code come from wrapping it
//! in the controllers' `MeteredDriver`, as any driver.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, DriverMethod, GenerateMachineClassForMigrationRequest,
    GenerateMachineClassForMigrationResponse, GetMachineStatusRequest, GetMachineStatusResponse,
    GetVolumeIdsRequest, GetVolumeIdsResponse, InitializeMachineRequest, InitializeMachineResponse,
    ListMachinesRequest, ListMachinesResponse, MachineCode,
};
use tonic::transport::{Channel, Uri};

use crate::{
    authority::UNIX_AUTHORITY,
    convert,
    endpoint::Endpoint,
    proto::{self, driver_client::DriverClient, identity_client::IdentityClient},
    server::ProviderInfo,
    status::{detail_code, from_status},
    tls::TlsFiles,
};

/// How the client talks to its provider.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// The deadline of every call (`--provider-call-timeout`).
    pub call_timeout: Duration,
    /// How long a connection attempt may take.
    pub connect_timeout: Duration,
    /// The first wait after the provider could not be reached; doubled per failure.
    pub backoff_base: Duration,
    /// The longest wait.
    pub backoff_cap: Duration,
    /// For a TCP endpoint: our client certificate and the CA of the provider's.
    pub tls: Option<TlsFiles>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_mins(5),
            connect_timeout: Duration::from_secs(5),
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(30),
            tls: None,
        }
    }
}

/// Why a client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A TCP endpoint without TLS files.
    #[error("a TCP provider endpoint requires TLS files (client certificate, key and the provider's CA)")]
    TlsRequired,
    /// The TLS files could not be read.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The channel could not be configured.
    #[error("configuring the channel: {0}")]
    Transport(#[from] tonic::transport::Error),
}

#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
    retry_at: Option<Instant>,
    last_error: String,
}

/// A [`Driver`] whose calls go to a provider over gRPC.
#[derive(Clone)]
pub struct GrpcDriver {
    endpoint: Endpoint,
    driver: DriverClient<Channel>,
    identity: IdentityClient<Channel>,
    options: ClientOptions,
    backoff: Arc<Mutex<Backoff>>,
}

impl std::fmt::Debug for GrpcDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcDriver")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

fn channel(endpoint: &Endpoint, options: &ClientOptions) -> Result<Channel, ClientError> {
    match endpoint {
        Endpoint::Unix(path) => {
            let path = path.clone();
            // The connector dials the socket; the URI gives only the `:authority`, `localhost` as kubelet's and
            // tonic's clients send on unix sockets (a path is no valid authority: see `authority`).
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{UNIX_AUTHORITY}"))?
                .connect_timeout(options.connect_timeout)
                .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
                    }
                }));
            Ok(channel)
        }
        Endpoint::Tcp(address) => {
            let tls = options.tls.as_ref().ok_or(ClientError::TlsRequired)?;
            let host = address.rsplit_once(':').map_or(address.as_str(), |(h, _)| h);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Ok(
                tonic::transport::Endpoint::from_shared(format!("https://{address}"))?
                    .tls_config(tls.client_config(host)?)?
                    .connect_timeout(options.connect_timeout)
                    .connect_lazy(),
            )
        }
    }
}

impl GrpcDriver {
    /// A driver for the provider at `endpoint`. It connects on the first call (and again after a failure), so a
    /// provider that starts later is found.
    pub fn new(endpoint: Endpoint, options: ClientOptions) -> Result<Self, ClientError> {
        let channel = channel(&endpoint, &options)?;
        Ok(Self {
            endpoint,
            driver: DriverClient::new(channel.clone()),
            identity: IdentityClient::new(channel),
            options,
            backoff: Arc::default(),
        })
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fails at once while the provider is in back-off.
    fn gate(&self, method: &str) -> Result<(), DriverError> {
        let backoff = self.backoff();
        match backoff.retry_at {
            Some(at) if at > Instant::now() => Err(DriverError::new(
                MachineCode::Unavailable,
                format!(
                    "{}: the provider at {} is unreachable ({}); next attempt in {:.1}s",
                    method,
                    self.endpoint,
                    backoff.last_error,
                    at.saturating_duration_since(Instant::now()).as_secs_f64()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Records the outcome: an answer from the provider clears the back-off; a failure that did not come from the
    /// provider (no machine code detail: connection refused, broken) extends it.
    fn outcome<T>(&self, method: &str, result: Result<T, tonic::Status>) -> Result<T, DriverError> {
        match result {
            Ok(value) => {
                *self.backoff() = Backoff::default();
                Ok(value)
            }
            Err(status) => {
                // Not the provider's answer: a local transport failure (it carries its source error) or a proxy's
                // Unavailable. An answer of a provider that adds no detail has neither.
                let unreachable = detail_code(&status).is_none()
                    && (status.code() == tonic::Code::Unavailable
                        || (status.code() == tonic::Code::Unknown
                            && std::error::Error::source(&status).is_some()));
                let status = if unreachable && status.code() != tonic::Code::Unavailable {
                    tonic::Status::unavailable(status.to_string())
                } else {
                    status
                };
                let mut error = from_status(&status);
                let mut backoff = self.backoff();
                if unreachable {
                    let wait = self
                        .options
                        .backoff_base
                        .saturating_mul(2u32.saturating_pow(backoff.failures.min(16)))
                        .min(self.options.backoff_cap);
                    backoff.failures += 1;
                    backoff.retry_at = Some(Instant::now() + wait);
                    backoff.last_error.clone_from(&error.message);
                    error.message = format!(
                        "{}: the provider at {} is unreachable: {}",
                        method, self.endpoint, error.message
                    );
                    tracing::warn!(endpoint = %self.endpoint, method = method, wait_s = wait.as_secs_f64(),
                        error = %error.message, "provider unreachable; backing off");
                } else {
                    *backoff = Backoff::default();
                }
                Err(error)
            }
        }
    }

    /// A request with the call deadline in its `grpc-timeout` header (the provider may stop early).
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.options.call_timeout);
        request
    }

    /// Runs a call with its deadline: a call not answered in time is DeadlineExceeded (and abandoned).
    async fn deadline<T>(
        &self,
        method: DriverMethod,
        call: impl std::future::Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        let late = || {
            tonic::Status::deadline_exceeded(format!(
                "{} did not answer within {:?} (--provider-call-timeout)",
                method.name(),
                self.options.call_timeout
            ))
        };
        match tokio::time::timeout(self.options.call_timeout, call).await {
            // tonic enforces the grpc-timeout header too and reports it as a Cancelled without our detail.
            Ok(Err(status)) if status.code() == tonic::Code::Cancelled && detail_code(&status).is_none() => {
                Err(late())
            }
            Ok(result) => result,
            Err(_) => Err(late()),
        }
    }

    /// The provider's identity: name, version and the optional calls it implements.
    pub async fn provider_info(&self) -> Result<(ProviderInfo, String), DriverError> {
        self.gate("GetProviderInfo")?;
        let answer = self
            .outcome(
                "GetProviderInfo",
                self.identity
                    .clone()
                    .get_provider_info(proto::GetProviderInfoRequest {})
                    .await,
            )?
            .into_inner();
        let optional_methods = answer
            .optional_methods
            .iter()
            .filter_map(|name| {
                let method = DriverMethod::from_name(name);
                if method.is_none() {
                    tracing::warn!(endpoint = %self.endpoint, name = %name,
                        "the provider declares an optional call this client does not know; ignored");
                }
                method
            })
            .collect();
        Ok((
            ProviderInfo {
                name: answer.name,
                version: answer.version,
                optional_methods,
            },
            answer.protocol_version,
        ))
    }

    /// Whether the provider answers its probe with ready. Not held back by the back-off: a probe is how a
    /// supervisor finds out that the provider is back.
    pub async fn probe(&self) -> Result<bool, DriverError> {
        let answer = self.identity.clone().probe(proto::ProbeRequest {}).await;
        Ok(self.outcome("Probe", answer)?.into_inner().ready)
    }
}

#[async_trait]
impl Driver for GrpcDriver {
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        let method = DriverMethod::CreateMachine;
        self.gate(method.name())?;
        let message = convert::machine_request(&request.machine, &request.machine_class, &request.secret)?;
        let answer = self
            .deadline(method, self.driver.clone().create_machine(self.request(message)))
            .await;
        self.outcome(method.name(), answer)
            .map(|r| convert::create_response_from(r.into_inner()))
    }

    async fn initialize_machine(
        &self,
        request: &InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        let method = DriverMethod::InitializeMachine;
        self.gate(method.name())?;
        let message = convert::machine_request(&request.machine, &request.machine_class, &request.secret)?;
        let answer = self
            .deadline(
                method,
                self.driver.clone().initialize_machine(self.request(message)),
            )
            .await;
        self.outcome(method.name(), answer)
            .map(|r| convert::initialize_response_from(r.into_inner()))
    }

    async fn delete_machine(
        &self,
        request: &DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        let method = DriverMethod::DeleteMachine;
        self.gate(method.name())?;
        let message = convert::machine_request(&request.machine, &request.machine_class, &request.secret)?;
        let answer = self
            .deadline(method, self.driver.clone().delete_machine(self.request(message)))
            .await;
        self.outcome(method.name(), answer)
            .map(|r| convert::delete_response_from(r.into_inner()))
    }

    async fn get_machine_status(
        &self,
        request: &GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        let method = DriverMethod::GetMachineStatus;
        self.gate(method.name())?;
        let message = convert::machine_request(&request.machine, &request.machine_class, &request.secret)?;
        let answer = self
            .deadline(
                method,
                self.driver.clone().get_machine_status(self.request(message)),
            )
            .await;
        self.outcome(method.name(), answer)
            .map(|r| convert::status_response_from(r.into_inner()))
    }

    async fn list_machines(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        let method = DriverMethod::ListMachines;
        self.gate(method.name())?;
        let message = convert::list_request_to(request)?;
        let answer = self
            .deadline(method, self.driver.clone().list_machines(self.request(message)))
            .await;
        self.outcome(method.name(), answer)
            .map(|r| convert::list_response_from(r.into_inner()))
    }

    async fn get_volume_ids(
        &self,
        request: &GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        let method = DriverMethod::GetVolumeIds;
        self.gate(method.name())?;
        let message = convert::volumes_request_to(request)?;
        let answer = self
            .deadline(method, self.driver.clone().get_volume_i_ds(self.request(message)))
            .await;
        self.outcome(method.name(), answer)
            .map(|r| convert::volumes_response_from(r.into_inner()))
    }

    async fn generate_machine_class_for_migration(
        &self,
        request: &GenerateMachineClassForMigrationRequest,
    ) -> Result<GenerateMachineClassForMigrationResponse, DriverError> {
        let method = DriverMethod::GenerateMachineClassForMigration;
        self.gate(method.name())?;
        let message = convert::migration_request_to(request)?;
        let answer = self
            .deadline(
                method,
                self.driver
                    .clone()
                    .generate_machine_class_for_migration(self.request(message)),
            )
            .await;
        let response = self.outcome(method.name(), answer)?;
        convert::migration_response_from(response.get_ref())
    }
}
