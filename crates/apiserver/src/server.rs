//! Starting and stopping the server: the data directory (store, certificates, admin token, kubeconfig, port), the
//! TLS listener serving HTTP/1.1 and HTTP/2, and the background duties (emptying deleted namespaces).

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio::{net::TcpListener, sync::watch, task::JoinSet};

use crate::{
    auth,
    listener::{ConnectionStats, ListenerLimits},
    objects,
    openapi::LiveOpenApi,
    pki::{self, Pki},
    registry::{Registry, SharedRegistry},
    rest::{AdminToken, AppState},
    store::Store,
};

/// The database file of an on-disk server, in its data directory.
pub const STORE_FILE: &str = "store.redb";

/// How to run the server.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where state, certificates, the admin token and the kubeconfig live. Reused across restarts.
    pub data_dir: PathBuf,
    /// Keep objects in memory only (certificates and kubeconfig still go to `data_dir`): for tests.
    pub in_memory: bool,
    /// Address to listen on; loopback by default.
    pub bind: IpAddr,
    /// Port; 0 picks a free one the first time and reuses it on later starts with the same data dir.
    pub port: u16,
    /// How many recent changes a watch can resume from.
    pub watch_window: usize,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// How often deleted namespaces are emptied.
    pub namespace_sweep_interval: Duration,
    /// How often the garbage collector acts on ownerReferences (deleted owners, foreground and orphan deletion).
    pub gc_interval: Duration,
    /// Events not written for this long are deleted (kube-apiserver's `--event-ttl`, 1h; [`crate::event_ttl`]).
    pub event_ttl: Duration,
    /// A node silent for longer than this turns Unknown (`--node-monitor-grace-period`, Kubernetes' 40s).
    pub node_monitor_grace_period: Duration,
    /// How often nodes, pod grace periods and PodDisruptionBudgets are checked (`--node-monitor-period`).
    pub node_monitor_period: Duration,
    /// Test hooks to start with (watch delay, injected failures); off by default.
    pub watch_delay: Duration,
    /// Test hook: fail a share of requests with a chosen status; None by default.
    pub failure: Option<crate::hooks::Failure>,
    /// A static token file (kube-apiserver's `--token-auth-file`, [`auth::TokenFile`]): more users besides the
    /// admin, read once at start. None by default.
    pub token_auth_file: Option<PathBuf>,
    /// Refuse invalid Machines, MachineSets, MachineDeployments and MachineClasses with 422 ([`crate::admission`]);
    /// on by default. Tests turn it off to store invalid objects, as a cluster without the admission policy would.
    pub machine_admission: bool,
    /// A connection that has not completed its TLS handshake this long after it was accepted is closed
    /// ([`crate::listener`]). 10 s by default: a handshake takes milliseconds, and 10 s is the usual client-side
    /// handshake timeout (Go's `http.Transport`); kube-apiserver's Go server allows 32 s (its ReadHeaderTimeout).
    pub tls_handshake_timeout: Duration,
    /// At most this many connections are open at once; more wait to be accepted ([`crate::listener`]). 2048 by
    /// default: well above what the controllers, node agents and kubectl of a large cluster hold, and under the
    /// usual open-files limit of a service.
    pub max_connections: usize,
    /// CustomResourceDefinitions installed at start, when no CRD of their name is stored, besides those of the
    /// machine kinds ([`crate::preinstalled`]); none by default. `mcm apiserver` and `mcm up` add the Cluster API
    /// kinds of `mcm crds`.
    pub extra_crds:
        Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
}

impl Config {
    /// Defaults for a data directory: loopback, a free port, persistent.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            in_memory: false,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            watch_window: 10_000,
            bookmark_interval: Duration::from_mins(1),
            namespace_sweep_interval: Duration::from_secs(1),
            gc_interval: Duration::from_secs(1),
            event_ttl: crate::event_ttl::DEFAULT_EVENT_TTL,
            node_monitor_grace_period: Duration::from_secs(40),
            node_monitor_period: Duration::from_secs(1),
            watch_delay: Duration::ZERO,
            failure: None,
            token_auth_file: None,
            machine_admission: true,
            tls_handshake_timeout: Duration::from_secs(10),
            max_connections: 2048,
            extra_crds: Vec::new(),
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The data directory could not be prepared.
    #[error("data directory {path}: {source}")]
    DataDir {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Certificates, token or kubeconfig.
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    /// The store.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The listener.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// Setting up the server's state failed.
    #[error("cannot initialize the server: {0}")]
    Init(String),
    /// The static token file could not be read.
    #[error(transparent)]
    TokenFile(#[from] auth::TokenFileError),
}

/// A running server.
pub struct ApiServer {
    hooks: Arc<crate::hooks::Hooks>,
    requests: Arc<crate::requests::RequestCounts>,
    connections: Arc<ConnectionStats>,
    state: AppState,
    url: String,
    kubeconfig: PathBuf,
    store: Arc<Store>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

const SETTINGS_FILE: &str = "apiserver.json";

fn remembered_port(dir: &Path) -> Option<u16> {
    let text = std::fs::read_to_string(dir.join(SETTINGS_FILE)).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    value["port"].as_u64().and_then(|p| u16::try_from(p).ok())
}

impl ApiServer {
    /// Starts the server: prepares the data directory, opens the store, binds the port and serves in the
    /// background until [`ApiServer::shutdown`].
    pub async fn start(config: Config) -> Result<Self, ServerError> {
        let limits = listener_limits(&config)?;
        let dir = &config.data_dir;
        let io_err = |source| ServerError::DataDir {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io_err)?;
        let token_file = load_token_file(&config)?;
        let mut hosts = Vec::new();
        if !config.bind.is_loopback() && !config.bind.is_unspecified() {
            hosts.push(config.bind.to_string());
        }
        let pki = Pki::load_or_create(dir, &hosts)?;
        let token = pki::load_or_create_token(dir)?;
        let store = Arc::new(Store::open(
            (!config.in_memory).then(|| dir.join(STORE_FILE)).as_deref(),
            config.watch_window,
        )?);
        let registry = SharedRegistry::new(Registry::new());
        objects::ensure_default_namespaces(&store, registry.builtins())
            .map_err(|e| ServerError::Init(e.to_string()))?;
        install_crds(&store, registry.builtins(), &config.extra_crds)?;
        // The custom resources of the stored CRDs are served from the first request on.
        crate::crd::sync(&store, &registry, jiff::Timestamp::now());

        let port = if config.port == 0 {
            remembered_port(dir).unwrap_or(0)
        } else {
            config.port
        };
        let address = SocketAddr::new(config.bind, port);
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| ServerError::Listen { address, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| ServerError::Listen { address, source })?;
        std::fs::write(
            dir.join(SETTINGS_FILE),
            serde_json::json!({ "port": local.port() }).to_string(),
        )
        .map_err(io_err)?;
        let host = if local.ip().is_unspecified() {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            local.ip()
        };
        let url = format!("https://{}", SocketAddr::new(host, local.port()));
        let kubeconfig = dir.join("kubeconfig");
        pki::write_kubeconfig(&kubeconfig, &url, &pki.ca_cert_pem, &token)?;

        let (shutdown, shutdown_rx) = watch::channel(false);
        let hooks = Arc::new(crate::hooks::Hooks::default());
        let requests = Arc::new(crate::requests::RequestCounts::default());
        hooks.set_watch_delay(config.watch_delay);
        hooks.set_failure(config.failure.clone());
        let state = AppState {
            openapi: Arc::new(LiveOpenApi::new(registry.clone())),
            registry: registry.clone(),
            store: Arc::clone(&store),
            auth: Arc::new(authenticators(token, token_file, &store)),
            pki: Arc::new(pki.clone()),
            server_address: SocketAddr::new(host, local.port()).to_string(),
            bookmark_interval: config.bookmark_interval,
            shutdown: shutdown_rx.clone(),
            hooks: Arc::clone(&hooks),
            requests: Arc::clone(&requests),
            machine_admission: config.machine_admission,
        };
        let tls = tokio_rustls::TlsAcceptor::from(Arc::new(pki.server_config()?));
        let mut tasks = JoinSet::new();
        let connections = Arc::new(ConnectionStats::default());
        tasks.spawn(crate::listener::accept_loop(
            listener,
            tls,
            state.clone(),
            limits,
            Arc::clone(&connections),
            shutdown_rx.clone(),
        ));
        spawn_controllers(&mut tasks, &store, &registry, &config, &shutdown_rx);
        tracing::info!(url = %url, kubeconfig = %kubeconfig.display(), "API server listening");
        Ok(Self {
            hooks,
            requests,
            connections,
            state,
            url,
            kubeconfig,
            store,
            shutdown,
            tasks,
        })
    }

    /// The server's URL (`https://127.0.0.1:<port>`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The kubeconfig with the admin token (mode 0600).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The object store, for in-process test hooks.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The requests counted per user, verb and resource.
    pub fn requests(&self) -> &Arc<crate::requests::RequestCounts> {
        &self.requests
    }

    /// Serves one request in process as the listener serves a request on a connection that presented the admin's
    /// client certificate (an Authorization header, when there is one, authenticates instead): the same head
    /// limits, routing, authentication and handlers, without TLS or a socket. For the fuzz targets.
    pub async fn serve_in_process(
        &self,
        mut request: http::Request<axum::body::Body>,
    ) -> http::Response<axum::body::Body> {
        request
            .extensions_mut()
            .insert(auth::ClientCertificateUser(auth::User {
                name: "admin".into(),
                groups: vec![auth::ADMIN_GROUP.into()],
            }));
        crate::rest::handle(self.state.clone(), request).await
    }

    /// The connection counts of the listener (open, peak, TLS handshake timeouts).
    pub fn connections(&self) -> &Arc<ConnectionStats> {
        &self.connections
    }

    /// The test hooks (watch delay, injected failures), to change at run time.
    pub fn hooks(&self) -> &Arc<crate::hooks::Hooks> {
        &self.hooks
    }

    /// Stops accepting, ends open watches and connections, and closes the store.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
        tracing::info!(url = %self.url, "API server stopped");
    }
}

/// The listener's limits of a configuration; a zero timeout or limit would refuse every connection.
fn listener_limits(config: &Config) -> Result<ListenerLimits, ServerError> {
    if config.tls_handshake_timeout.is_zero() {
        return Err(ServerError::Init(
            "the TLS handshake timeout must be more than 0s: no connection could complete its handshake"
                .into(),
        ));
    }
    if config.max_connections == 0 {
        return Err(ServerError::Init(
            "the connection limit must be at least 1: no connection could be accepted".into(),
        ));
    }
    Ok(ListenerLimits {
        tls_handshake_timeout: config.tls_handshake_timeout,
        max_connections: config.max_connections,
    })
}

/// The background duties: what kube-controller-manager and the apiextensions controllers would do.
fn spawn_controllers(
    tasks: &mut JoinSet<()>,
    store: &Arc<Store>,
    registry: &SharedRegistry,
    config: &Config,
    shutdown: &watch::Receiver<bool>,
) {
    tasks.spawn(control_loops(
        Arc::clone(store),
        config.node_monitor_period,
        config.node_monitor_grace_period,
        shutdown.clone(),
    ));
    tasks.spawn(crate::gc::run(
        Arc::clone(store),
        registry.clone(),
        config.gc_interval,
        shutdown.clone(),
    ));
    tasks.spawn(crate::crd::run(
        Arc::clone(store),
        registry.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(crate::event_ttl::run(
        Arc::clone(store),
        config.event_ttl,
        shutdown.clone(),
    ));
    tasks.spawn(sweep_namespaces(
        Arc::clone(store),
        registry.clone(),
        config.namespace_sweep_interval,
        shutdown.clone(),
    ));
}

/// Creates the pre-installed CRDs that are not stored: the machine kinds' and `extra`.
fn install_crds(
    store: &Store,
    builtins: &Registry,
    extra: &[k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition],
) -> Result<(), ServerError> {
    let init = |e: &dyn std::fmt::Display| ServerError::Init(format!("pre-installed CRDs: {e}"));
    crate::preinstalled::install(store, builtins, &crate::preinstalled::machine_crds())
        .map_err(|e| init(&e))?;
    if !extra.is_empty() {
        let extra: Vec<serde_json::Value> = extra
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()
            .map_err(|e| init(&e))?;
        crate::preinstalled::install(store, builtins, &extra).map_err(|e| init(&e))?;
    }
    Ok(())
}

/// The static token file of the configuration, if any (read once; its tokens are never logged).
fn load_token_file(config: &Config) -> Result<Option<auth::TokenFile>, ServerError> {
    let Some(path) = &config.token_auth_file else {
        return Ok(None);
    };
    let file = auth::TokenFile::load(path)?;
    tracing::info!(path = %path.display(), users = file.users().count(), "static token file read");
    Ok(Some(file))
}

/// Who may call: the admin token first, then the static token file, then bootstrap tokens.
fn authenticators(
    admin: String,
    token_file: Option<auth::TokenFile>,
    store: &Arc<Store>,
) -> auth::Authenticators {
    let mut chain: Vec<Box<dyn auth::Authenticator>> = vec![Box::new(AdminToken(admin))];
    if let Some(file) = token_file {
        chain.push(Box::new(file));
    }
    chain.push(Box::new(auth::BootstrapTokens::new(Arc::clone(store))));
    auth::Authenticators(chain)
}

/// What kube-controller-manager would do besides namespaces: the node lifecycle, pod grace periods and
/// PodDisruptionBudget status.
async fn control_loops(
    store: Arc<Store>,
    every: Duration,
    node_monitor_grace: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                let now = jiff::Timestamp::now();
                crate::nodelifecycle::monitor(&store, now, node_monitor_grace);
                crate::pods::expire(&store, now, node_monitor_grace);
                crate::disruption::refresh_budgets(&store, now);
            }
            _ = shutdown.changed() => return,
        }
    }
}

async fn sweep_namespaces(
    store: Arc<Store>,
    registry: SharedRegistry,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = ticker.tick() => objects::finalize_namespaces(&store, &registry.current(), jiff::Timestamp::now()),
            _ = shutdown.changed() => return,
        }
    }
}
