//! `serve(driver, ...)`: any [`Driver`] as a provider gRPC server (Driver and Identity services) on a unix socket
//! (mode 0600: only its owner may connect) or on TCP with TLS that requires client certificates. On a unix socket,
//! clients that send the socket path as `:authority` (grpc-core, grpc-java) are served too (`authority`).

use std::{future::Future, path::Path, sync::Arc};

use mcm_core::Redactor;
use mcm_driver::{Driver, DriverError, DriverMethod};
use tokio_stream::{StreamExt as _, wrappers::UnixListenerStream};
use tonic::{Request, Response, Status, transport::Server};

use crate::{
    authority::AuthorityFix,
    convert,
    endpoint::Endpoint,
    proto::{self, driver_server::DriverServer, identity_server::IdentityServer},
    status::to_status,
    tls::TlsFiles,
};

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: &str = "v1";

/// What a provider says about itself (the Identity service).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderInfo {
    /// The provider name (the MachineClass `provider` field it serves).
    pub name: String,
    /// Its version.
    pub version: String,
    /// The optional calls it implements.
    pub optional_methods: Vec<DriverMethod>,
}

/// Why a provider could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Another process answers on the socket already.
    #[error("{0} is in use by a running provider")]
    InUse(String),
    /// The socket or its directory could not be prepared.
    #[error("preparing {path}: {source}")]
    Socket {
        /// The socket path.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A TCP endpoint without TLS files.
    #[error("a TCP endpoint requires TLS: set MC_TLS_CERT_FILE, MC_TLS_KEY_FILE and MC_TLS_CLIENT_CA_FILE")]
    TlsRequired,
    /// The TLS files could not be read.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The gRPC server failed.
    #[error("serving: {0}")]
    Transport(#[from] tonic::transport::Error),
}

struct DriverService {
    driver: Arc<dyn Driver>,
}

struct IdentityService {
    info: ProviderInfo,
}

pub(crate) fn machine_name(request: &proto::MachineRequest) -> String {
    serde_json::from_slice::<serde_json::Value>(&request.machine)
        .ok()
        .and_then(|m| {
            m.pointer("/metadata/name")
                .and_then(|n| n.as_str())
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// What removes the request's secret values from the provider's message before it is logged: a provider may quote
/// its request (several cloud APIs do). Empty when the request carries no secret.
pub(crate) fn redactor_of(secret: &[u8]) -> Redactor {
    serde_json::from_slice::<k8s_openapi::api::core::v1::Secret>(secret)
        .ok()
        .and_then(|secret| secret.data)
        .map(|data| Redactor::from_secret_data(&data))
        .unwrap_or_default()
}

/// Logs the outcome of a call (method, machine, code, the message without the request's secret values; never the
/// request, which holds the secret) and turns an error into its status, with the same redacted message: the status
/// cuts long messages (`status::MAX_MESSAGE_BYTES`), and a secret value cut in two could no longer be recognised by
/// the controllers' redactor.
fn answer<T>(
    method: DriverMethod,
    machine: &str,
    secret: &[u8],
    result: Result<T, DriverError>,
) -> Result<Response<T>, Status> {
    match result {
        Ok(value) => {
            tracing::debug!(method = method.name(), machine, "provider call succeeded");
            Ok(Response::new(value))
        }
        Err(error) => {
            let message = redactor_of(secret).redact(&error.message);
            tracing::info!(method = method.name(), machine, code = %error.code, message, "provider call failed");
            Err(to_status(&DriverError::new(error.code, message)))
        }
    }
}

#[tonic::async_trait]
impl proto::driver_server::Driver for DriverService {
    async fn create_machine(
        &self,
        request: Request<proto::MachineRequest>,
    ) -> Result<Response<proto::CreateMachineResponse>, Status> {
        let request = request.into_inner();
        let machine = machine_name(&request);
        let result = match convert::create_request(&request) {
            Ok(r) => self
                .driver
                .create_machine(&r)
                .await
                .map(convert::create_response_to),
            Err(err) => Err(err),
        };
        answer(DriverMethod::CreateMachine, &machine, &request.secret, result)
    }

    async fn initialize_machine(
        &self,
        request: Request<proto::MachineRequest>,
    ) -> Result<Response<proto::InitializeMachineResponse>, Status> {
        let request = request.into_inner();
        let machine = machine_name(&request);
        let result = match convert::initialize_request(&request) {
            Ok(r) => self
                .driver
                .initialize_machine(&r)
                .await
                .map(convert::initialize_response_to),
            Err(err) => Err(err),
        };
        answer(DriverMethod::InitializeMachine, &machine, &request.secret, result)
    }

    async fn delete_machine(
        &self,
        request: Request<proto::MachineRequest>,
    ) -> Result<Response<proto::DeleteMachineResponse>, Status> {
        let request = request.into_inner();
        let machine = machine_name(&request);
        let result = match convert::delete_request(&request) {
            Ok(r) => self
                .driver
                .delete_machine(&r)
                .await
                .map(convert::delete_response_to),
            Err(err) => Err(err),
        };
        answer(DriverMethod::DeleteMachine, &machine, &request.secret, result)
    }

    async fn get_machine_status(
        &self,
        request: Request<proto::MachineRequest>,
    ) -> Result<Response<proto::GetMachineStatusResponse>, Status> {
        let request = request.into_inner();
        let machine = machine_name(&request);
        let result = match convert::status_request(&request) {
            Ok(r) => self
                .driver
                .get_machine_status(&r)
                .await
                .map(convert::status_response_to),
            Err(err) => Err(err),
        };
        answer(DriverMethod::GetMachineStatus, &machine, &request.secret, result)
    }

    async fn list_machines(
        &self,
        request: Request<proto::ListMachinesRequest>,
    ) -> Result<Response<proto::ListMachinesResponse>, Status> {
        let result = match convert::list_request_from(request.get_ref()) {
            Ok(r) => self.driver.list_machines(&r).await.map(convert::list_response_to),
            Err(err) => Err(err),
        };
        answer(DriverMethod::ListMachines, "", &request.get_ref().secret, result)
    }

    async fn get_volume_i_ds(
        &self,
        request: Request<proto::GetVolumeIDsRequest>,
    ) -> Result<Response<proto::GetVolumeIDsResponse>, Status> {
        let result = match convert::volumes_request_from(request.get_ref()) {
            Ok(r) => self
                .driver
                .get_volume_ids(&r)
                .await
                .map(convert::volumes_response_to),
            Err(err) => Err(err),
        };
        answer(DriverMethod::GetVolumeIds, "", &[], result)
    }

    async fn generate_machine_class_for_migration(
        &self,
        request: Request<proto::GenerateMachineClassForMigrationRequest>,
    ) -> Result<Response<proto::GenerateMachineClassForMigrationResponse>, Status> {
        let result = match convert::migration_request_from(request.get_ref()) {
            Ok(r) => match self.driver.generate_machine_class_for_migration(&r).await {
                Ok(response) => convert::migration_response_to(&response),
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        answer(DriverMethod::GenerateMachineClassForMigration, "", &[], result)
    }
}

#[tonic::async_trait]
impl proto::identity_server::Identity for IdentityService {
    async fn get_provider_info(
        &self,
        _: Request<proto::GetProviderInfoRequest>,
    ) -> Result<Response<proto::GetProviderInfoResponse>, Status> {
        Ok(Response::new(proto::GetProviderInfoResponse {
            name: self.info.name.clone(),
            version: self.info.version.clone(),
            protocol_version: PROTOCOL_VERSION.to_owned(),
            optional_methods: self
                .info
                .optional_methods
                .iter()
                .map(|m| m.name().to_owned())
                .collect(),
        }))
    }

    async fn probe(&self, _: Request<proto::ProbeRequest>) -> Result<Response<proto::ProbeResponse>, Status> {
        Ok(Response::new(proto::ProbeResponse { ready: true }))
    }
}

/// Removes a stale socket left by a provider that died, refusing when one still answers on it; creates the
/// directory (mode 0700) when missing.
async fn prepare_socket(path: &Path) -> Result<(), ServeError> {
    use std::os::unix::fs::PermissionsExt;
    let socket_error = |source| ServeError::Socket {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        std::fs::create_dir_all(dir).map_err(socket_error)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(socket_error)?;
    }
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(ServeError::InUse(path.display().to_string()));
        }
        std::fs::remove_file(path).map_err(socket_error)?;
    }
    Ok(())
}

/// Serves `driver` as a provider on `endpoint` until `shutdown` resolves. A unix socket is created mode 0600 (a stale
/// one is replaced); TCP needs `tls` and requires client certificates signed by its CA.
pub async fn serve(
    driver: Arc<dyn Driver>,
    info: ProviderInfo,
    endpoint: &Endpoint,
    tls: Option<&TlsFiles>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let router = Server::builder();
    let add = |mut builder: Server| {
        builder
            .add_service(DriverServer::new(DriverService { driver }))
            .add_service(IdentityServer::new(IdentityService { info }))
    };
    match endpoint {
        Endpoint::Unix(path) => {
            use std::os::unix::fs::PermissionsExt;
            prepare_socket(path).await?;
            let listener = tokio::net::UnixListener::bind(path).map_err(|source| ServeError::Socket {
                path: path.display().to_string(),
                source,
            })?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
                ServeError::Socket {
                    path: path.display().to_string(),
                    source,
                }
            })?;
            tracing::info!(%endpoint, "provider serving");
            let result = add(router)
                .serve_with_incoming_shutdown(
                    UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityFix::new)),
                    shutdown,
                )
                .await;
            let _ = std::fs::remove_file(path);
            result?;
        }
        Endpoint::Tcp(address) => {
            let tls = tls.ok_or(ServeError::TlsRequired)?;
            let config = tls.server_config()?;
            let listener =
                tokio::net::TcpListener::bind(address)
                    .await
                    .map_err(|source| ServeError::Socket {
                        path: address.clone(),
                        source,
                    })?;
            tracing::info!(%endpoint, local = ?listener.local_addr().ok(), "provider serving with TLS");
            add(router.tls_config(config)?)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    shutdown,
                )
                .await?;
        }
    }
    Ok(())
}
