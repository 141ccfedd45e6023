//! [`LocalDriver`]: the provider's calls on machine directories and their process groups.

use std::{
    collections::{BTreeMap, HashMap},
    ffi::OsString,
    fmt,
    fs::{self, DirBuilder, File},
    io::{ErrorKind, Read as _, Seek as _, SeekFrom, Write as _},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{NodeAddress, Secret};
use mcm_api::{Machine, MachineClass};
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, DriverMethod, GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest,
    GetVolumeIdsResponse, ListMachinesRequest, ListMachinesResponse, MachineCode,
};
use serde::{Deserialize, Serialize};

use crate::{
    LocalError,
    process::{self, Launch, Stopped},
    spec::ProviderSpec,
};

/// The scheme of the provider's IDs: `local:///<namespace>/<machine-name>`.
pub const PROVIDER_ID_PREFIX: &str = "local:///";

/// How long DeleteMachine waits after SIGTERM before SIGKILL, unless configured otherwise.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(5);

/// The directory under the state directory that holds `<namespace>/<machine-name>/`.
pub const MACHINES_DIR: &str = "machines";
/// The machine record in a machine directory (JSON, see [`LocalMachine`]).
pub const RECORD_FILE: &str = "machine.json";
/// The boot script in a machine directory: the secret's `userData`, mode 0600, run with `/bin/sh`.
pub const USER_DATA_FILE: &str = "userdata.sh";
/// The machine's stdout and stderr, in its machine directory.
pub const LOG_FILE: &str = "machine.log";
/// The directory of condition files in a machine directory: the node agent reports a condition `<Type>` with the
/// status (`True`, `False` or `Unknown`) written in the file `conditions/<Type>`.
pub const CONDITIONS_DIR: &str = "conditions";

/// Names of the environment variables a machine's script gets (besides `PATH` and `HOME`).
pub mod env {
    /// The URL of the target cluster's API server.
    pub const API_SERVER: &str = "MCM_LOCAL_API_SERVER";
    /// The path of the target cluster's CA certificate.
    pub const CA_FILE: &str = "MCM_LOCAL_CA_FILE";
    /// The machine directory (absolute).
    pub const MACHINE_DIR: &str = "MCM_LOCAL_MACHINE_DIR";
    /// The machine's provider ID (`local:///<namespace>/<name>`).
    pub const PROVIDER_ID: &str = "MCM_LOCAL_PROVIDER_ID";
    /// The CPUs of the machine's size (`2`).
    pub const CPU: &str = "MCM_LOCAL_CPU";
    /// The memory of the machine's size, a Kubernetes quantity (`4Gi`).
    pub const MEMORY: &str = "MCM_LOCAL_MEMORY";
    /// The node name (the machine name).
    pub const NODE_NAME: &str = "MCM_LOCAL_NODE_NAME";
    /// How often the node agent heartbeats (a Go duration, `10s`).
    pub const HEARTBEAT_INTERVAL: &str = "MCM_LOCAL_HEARTBEAT_INTERVAL";

    /// Every variable, in the order above.
    pub const ALL: [&str; 8] = [
        API_SERVER,
        CA_FILE,
        MACHINE_DIR,
        PROVIDER_ID,
        CPU,
        MEMORY,
        NODE_NAME,
        HEARTBEAT_INTERVAL,
    ];
}

/// The optional calls the local provider implements, for its gRPC identity: GetMachineStatus, ListMachines and
/// GetVolumeIDs. InitializeMachine and GenerateMachineClassForMigration answer `Unimplemented`.
pub fn optional_methods() -> Vec<DriverMethod> {
    vec![
        DriverMethod::GetMachineStatus,
        DriverMethod::ListMachines,
        DriverMethod::GetVolumeIds,
    ]
}

/// Configuration of a [`LocalDriver`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalConfig {
    /// Where the machines live (`<state_dir>/machines/<namespace>/<name>/`); created with mode 0700.
    pub state_dir: PathBuf,
    /// Prepended to PATH for the machines' scripts, so that userData finds `mcm`.
    pub bin_dir: PathBuf,
    /// The URL of the target cluster's API server (`MCM_LOCAL_API_SERVER`).
    pub api_server: String,
    /// The target cluster's CA certificate (`MCM_LOCAL_CA_FILE`).
    pub ca_file: PathBuf,
    /// How long DeleteMachine waits after SIGTERM before SIGKILL (default [`DEFAULT_STOP_GRACE`]).
    pub stop_grace: Duration,
    /// How often the machines' node agents heartbeat (`MCM_LOCAL_HEARTBEAT_INTERVAL`, default 10s as kubelet).
    pub heartbeat_interval: Duration,
}

/// The node agents' default heartbeat interval (kubelet's node status update frequency).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);

impl LocalConfig {
    /// A configuration with the default stop grace.
    pub fn new(
        state_dir: impl Into<PathBuf>,
        bin_dir: impl Into<PathBuf>,
        api_server: impl Into<String>,
        ca_file: impl Into<PathBuf>,
    ) -> Self {
        Self {
            state_dir: state_dir.into(),
            bin_dir: bin_dir.into(),
            api_server: api_server.into(),
            ca_file: ca_file.into(),
            stop_grace: DEFAULT_STOP_GRACE,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
        }
    }
}

/// A machine as its `machine.json` records it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalMachine {
    /// `local:///<namespace>/<name>`.
    #[serde(rename = "providerID")]
    pub provider_id: String,
    /// The machine's name (also its node's name).
    pub machine_name: String,
    /// The machine's namespace.
    pub namespace: String,
    /// The class it was created from.
    pub class_name: String,
    /// The class's `vmPool`.
    pub vm_pool: String,
    /// The class's `size`.
    pub size: String,
    /// The class's `rootFsSize`, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_fs_size: Option<u64>,
    /// The class's tags: they tell the machine's cluster.
    pub tags: BTreeMap<String, String>,
    /// When the machine was created (RFC 3339).
    pub created_at: String,
    /// The process ID of the script (`/bin/sh userdata.sh`); `None` until it is started.
    #[serde(default)]
    pub pid: Option<i32>,
    /// The machine's process group (equal to `pid`: the script leads a group of its own).
    #[serde(default)]
    pub pgid: Option<i32>,
    /// The script's start time in clock ticks after boot (Linux), to tell its process ID from a reused one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_start_time: Option<u64>,
    /// The machine directory (not stored: where the record was read from).
    #[serde(skip)]
    pub dir: PathBuf,
}

impl LocalMachine {
    /// Whether a process of the machine's group still runs. A machine whose processes died still exists (a broken
    /// VM) until it is deleted.
    pub fn is_running(&self) -> bool {
        self.pgid.is_some_and(|pgid| {
            process::is_ours(pgid, self.process_start_time) && process::group_running(pgid)
        })
    }

    /// The machine's addresses: InternalIP 127.0.0.1 and Hostname the machine name.
    pub fn addresses(&self) -> Vec<NodeAddress> {
        vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: "127.0.0.1".into(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: self.machine_name.clone(),
            },
        ]
    }
}

/// The local provider: a [`Driver`] whose machines are process trees on this host, each booted by running its
/// secret's `userData` with `/bin/sh`. Cheap to clone; clones share the state directory. See the crate
/// documentation for the layout on disk and the rules of each call.
#[derive(Clone)]
pub struct LocalDriver {
    inner: Arc<Inner>,
}

struct Inner {
    /// The configuration, paths made absolute.
    config: LocalConfig,
    /// `<state_dir>/machines`.
    machines_dir: PathBuf,
    /// One lock per machine (`<namespace>/<name>`) being created or deleted, dropped when unused.
    locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Numbers the staging directories of this process.
    staging: AtomicU64,
}

impl fmt::Debug for LocalDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalDriver")
            .field("state_dir", &self.inner.config.state_dir)
            .finish_non_exhaustive()
    }
}

/// Creates a directory (and its missing parents) with mode 0700.
fn private_dir(path: &Path) -> Result<(), LocalError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(LocalError::io("creating", path))
}

fn absolute(path: &Path) -> Result<PathBuf, LocalError> {
    std::path::absolute(path).map_err(LocalError::io("resolving", path))
}

/// Whether a directory entry is one of the provider's own staging (`.creating-*`) or removal (`.deleting-*`)
/// directories rather than a machine: machine names never start with a dot.
fn is_transient(name: &str) -> bool {
    name.starts_with('.')
}

impl LocalDriver {
    /// A driver on `config.state_dir`, which is created (mode 0700) when missing. Machines already in it, from an
    /// earlier provider, are found there; processes that died meanwhile are not restarted.
    pub fn new(config: LocalConfig) -> Result<Self, LocalError> {
        if config.bin_dir.as_os_str().as_encoded_bytes().contains(&b':') {
            return Err(LocalError::Config(format!(
                "bin_dir {} contains ':', which PATH cannot hold",
                config.bin_dir.display()
            )));
        }
        let config = LocalConfig {
            state_dir: absolute(&config.state_dir)?,
            bin_dir: absolute(&config.bin_dir)?,
            ca_file: absolute(&config.ca_file)?,
            ..config
        };
        private_dir(&config.state_dir)?;
        let machines_dir = config.state_dir.join(MACHINES_DIR);
        private_dir(&machines_dir)?;
        let driver = Self {
            inner: Arc::new(Inner {
                config,
                machines_dir,
                locks: Mutex::new(HashMap::new()),
                staging: AtomicU64::new(0),
            }),
        };
        driver.inner.remove_leftovers();
        match driver.machines() {
            Ok(machines) => tracing::info!(
                state_dir = %driver.inner.config.state_dir.display(),
                machines = machines.len(),
                running = machines.iter().filter(|m| m.is_running()).count(),
                "local provider ready"
            ),
            Err(err) => tracing::warn!(error = %err, "listing the machines of the state directory"),
        }
        Ok(driver)
    }

    /// The configuration, with absolute paths.
    pub fn config(&self) -> &LocalConfig {
        &self.inner.config
    }

    /// The directory of a machine: `<state_dir>/machines/<namespace>/<name>`.
    pub fn machine_dir(&self, namespace: &str, name: &str) -> PathBuf {
        self.inner.machine_dir(namespace, name)
    }

    /// The record of a machine, `None` when it does not exist.
    pub fn machine(&self, namespace: &str, name: &str) -> Result<Option<LocalMachine>, LocalError> {
        Inner::read_record(&self.inner.machine_dir(namespace, name))
    }

    /// Every machine of the state directory (all namespaces and classes), by namespace and name. Directories whose
    /// record cannot be read are left out (and logged).
    pub fn machines(&self) -> Result<Vec<LocalMachine>, LocalError> {
        self.inner.machines()
    }

    /// The last `max_bytes` of a machine's log (its script's stdout and stderr), decoded lossily; empty when the
    /// machine or its log does not exist.
    pub fn log_tail(&self, namespace: &str, name: &str, max_bytes: u64) -> Result<String, LocalError> {
        let path = self.inner.machine_dir(namespace, name).join(LOG_FILE);
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(String::new()),
            Err(err) => return Err(LocalError::io("opening", &path)(err)),
        };
        let len = file.metadata().map_err(LocalError::io("reading", &path))?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(max_bytes)))
            .map_err(LocalError::io("reading", &path))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(LocalError::io("reading", &path))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Runs a call's work on a blocking thread (file I/O, waiting for processes to stop).
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Inner) -> Result<T, DriverError> + Send + 'static,
    ) -> Result<T, DriverError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || work(&inner))
            .await
            .map_err(|err| DriverError::internal(format!("the local provider's worker failed: {err}")))?
    }
}

/// The name of the machine of a request, checked to be usable as a directory name.
fn machine_name(machine: &Machine) -> Result<&str, DriverError> {
    let name = machine.metadata.name.as_deref().unwrap_or_default();
    check_name("machine.metadata.name", name)?;
    Ok(name)
}

/// The namespace of a machine (its own, else its class's, else `default`), checked to be usable as a directory
/// name.
fn machine_namespace<'a>(machine: &'a Machine, class: &'a MachineClass) -> Result<&'a str, DriverError> {
    let non_empty = |ns: &'a Option<String>| ns.as_deref().filter(|ns| !ns.is_empty());
    let namespace = non_empty(&machine.metadata.namespace)
        .or_else(|| non_empty(&class.metadata.namespace))
        .unwrap_or("default");
    check_name("machine.metadata.namespace", namespace)?;
    Ok(namespace)
}

/// Kubernetes names are DNS subdomains; this is laxer (upper case, `_`) but keeps every name a plain directory name.
fn check_name(field: &str, name: &str) -> Result<(), DriverError> {
    if name.is_empty() {
        return Err(DriverError::invalid_argument(format!(
            "{field}: must not be empty"
        )));
    }
    let valid = name.len() <= 253
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if valid {
        Ok(())
    } else {
        Err(DriverError::invalid_argument(format!(
            "{field}: {name:?} is not a valid name (at most 253 letters, digits, '-', '.' or '_', starting with a \
             letter or digit)"
        )))
    }
}

/// The class's providerSpec, validated; `range_code` is the code of a range problem.
fn provider_spec(class: &MachineClass, range_code: MachineCode) -> Result<ProviderSpec, DriverError> {
    ProviderSpec::parse(&class.provider_spec).map_err(|err| err.to_driver_error(range_code))
}

/// The secret's `userData` (in `data`, else `stringData`); `InvalidArgument` when missing or empty. Never logged.
fn user_data(secret: &Secret) -> Result<Vec<u8>, DriverError> {
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
        .ok_or_else(|| {
            DriverError::invalid_argument(
                "secret.data.userData: required (the machine's boot script, run with /bin/sh)",
            )
        })?;
    if bytes.is_empty() {
        return Err(DriverError::invalid_argument(
            "secret.data.userData: must not be empty",
        ));
    }
    Ok(bytes)
}

fn class_name(class: &MachineClass) -> &str {
    class.metadata.name.as_deref().unwrap_or_default()
}

/// A request's machine and class, validated.
struct Subject<'a> {
    namespace: &'a str,
    name: &'a str,
    spec: ProviderSpec,
}

impl<'a> Subject<'a> {
    fn of(
        machine: &'a Machine,
        class: &'a MachineClass,
        range_code: MachineCode,
    ) -> Result<Self, DriverError> {
        Ok(Self {
            name: machine_name(machine)?,
            namespace: machine_namespace(machine, class)?,
            spec: provider_spec(class, range_code)?,
        })
    }

    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Writes a file atomically (a temporary file renamed over it), mode 0600.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), LocalError> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    let mut file = File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(LocalError::io("creating", &temporary))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(LocalError::io("writing", &temporary))?;
    fs::rename(&temporary, path).map_err(LocalError::io("renaming", &temporary))
}

impl Inner {
    fn machine_dir(&self, namespace: &str, name: &str) -> PathBuf {
        self.machines_dir.join(namespace).join(name)
    }

    /// Runs `work` holding the lock of machine `key`, so that calls for one machine do not interleave.
    fn locked<T>(&self, key: &str, work: impl FnOnce() -> T) -> T {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(locks.entry(key.to_owned()).or_default())
        };
        let result = {
            let _guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
            work()
        };
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        // The map's reference and ours: nobody else waits for it.
        if Arc::strong_count(&lock) == 2 {
            locks.remove(key);
        }
        result
    }

    /// The record of the machine directory `dir`; `None` when the directory does not exist.
    fn read_record(dir: &Path) -> Result<Option<LocalMachine>, LocalError> {
        let path = dir.join(RECORD_FILE);
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == ErrorKind::NotFound => {
                return if dir.exists() {
                    Err(LocalError::MissingRecord { dir: dir.to_owned() })
                } else {
                    Ok(None)
                };
            }
            Err(err) => return Err(LocalError::io("reading", &path)(err)),
        };
        let mut record: LocalMachine =
            serde_json::from_slice(&text).map_err(|source| LocalError::Record { path, source })?;
        dir.clone_into(&mut record.dir);
        Ok(Some(record))
    }

    fn write_record(record: &LocalMachine, dir: &Path) -> Result<(), LocalError> {
        let path = dir.join(RECORD_FILE);
        let mut bytes = serde_json::to_vec_pretty(record).map_err(|source| LocalError::Record {
            path: path.clone(),
            source,
        })?;
        bytes.push(b'\n');
        write_private(&path, &bytes)
    }

    fn machines(&self) -> Result<Vec<LocalMachine>, LocalError> {
        let mut machines = Vec::new();
        for namespace in sorted_entries(&self.machines_dir)? {
            let namespace_dir = self.machines_dir.join(&namespace);
            if is_transient(&namespace) || !namespace_dir.is_dir() {
                continue;
            }
            for name in sorted_entries(&namespace_dir)? {
                if is_transient(&name) {
                    continue;
                }
                match Inner::read_record(&namespace_dir.join(&name)) {
                    Ok(Some(record)) => machines.push(record),
                    Ok(None) => {}
                    Err(err) => tracing::warn!(error = %err, "skipping a machine directory"),
                }
            }
        }
        Ok(machines)
    }

    /// Removes the staging and removal directories an earlier provider left behind when it stopped mid-call.
    fn remove_leftovers(&self) {
        let Ok(namespaces) = sorted_entries(&self.machines_dir) else {
            return;
        };
        for namespace in namespaces {
            let Ok(names) = sorted_entries(&self.machines_dir.join(&namespace)) else {
                continue;
            };
            for name in names.iter().filter(|name| is_transient(name)) {
                let path = self.machines_dir.join(&namespace).join(name);
                match fs::remove_dir_all(&path) {
                    Ok(()) => tracing::info!(path = %path.display(), "removed a leftover directory"),
                    Err(err) => {
                        tracing::warn!(path = %path.display(), error = %err, "removing a leftover directory");
                    }
                }
            }
        }
    }

    /// A fresh name for a transient directory beside the machine directories of a namespace.
    fn transient_dir(&self, namespace: &str, kind: &str, name: &str) -> PathBuf {
        let n = self.staging.fetch_add(1, Ordering::Relaxed);
        self.machines_dir
            .join(namespace)
            .join(format!(".{kind}-{name}-{}-{n}", std::process::id()))
    }

    fn create(&self, request: &CreateMachineRequest) -> Result<CreateMachineResponse, DriverError> {
        let class = &request.machine_class;
        let subject = Subject::of(&request.machine, class, MachineCode::OutOfRange)?;
        let user_data = user_data(&request.secret)?;
        self.locked(&subject.key(), || {
            let dir = self.machine_dir(subject.namespace, subject.name);
            if let Some(record) = Inner::read_record(&dir)? {
                return self.adopt(&subject, class, record);
            }
            let record = LocalMachine {
                provider_id: format!("{PROVIDER_ID_PREFIX}{}/{}", subject.namespace, subject.name),
                machine_name: subject.name.to_owned(),
                namespace: subject.namespace.to_owned(),
                class_name: class_name(class).to_owned(),
                vm_pool: subject.spec.vm_pool.clone(),
                size: subject.spec.size.clone(),
                root_fs_size: subject.spec.root_fs_size,
                tags: subject.spec.tags.clone(),
                created_at: jiff::Timestamp::now().to_string(),
                pid: None,
                pgid: None,
                process_start_time: None,
                dir: dir.clone(),
            };
            let staging = self.transient_dir(subject.namespace, "creating", subject.name);
            if let Err(err) = self.stage(&staging, &record, &user_data) {
                let _ = fs::remove_dir_all(&staging);
                return Err(err.into());
            }
            // The rename makes the machine exist at once and whole: a directory of that name always has its files.
            if let Err(err) = fs::rename(&staging, &dir) {
                let _ = fs::remove_dir_all(&staging);
                if let Some(record) = Inner::read_record(&dir)? {
                    // Another provider on the same state directory created it meanwhile.
                    return self.adopt(&subject, class, record);
                }
                return Err(LocalError::io("renaming", &staging)(err).into());
            }
            let record = self.boot(record, &subject)?;
            tracing::info!(
                machine = %subject.key(),
                provider_id = %record.provider_id,
                pgid = record.pgid,
                class = class_name(class),
                "local machine created"
            );
            Ok(response(&record, "created"))
        })
    }

    /// Writes a new machine's files into its staging directory.
    fn stage(&self, staging: &Path, record: &LocalMachine, user_data: &[u8]) -> Result<(), LocalError> {
        private_dir(staging.parent().unwrap_or(&self.machines_dir))?;
        DirBuilder::new()
            .mode(0o700)
            .create(staging)
            .map_err(LocalError::io("creating", staging))?;
        private_dir(&staging.join(CONDITIONS_DIR))?;
        write_private(&staging.join(USER_DATA_FILE), user_data)?;
        let log = staging.join(LOG_FILE);
        File::options()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&log)
            .map_err(LocalError::io("creating", &log))?;
        Self::write_record(record, staging)
    }

    /// Answers CreateMachine for an existing machine: the same VM when it carries the class's tags (starting its
    /// process if an earlier provider stopped before it could), `AlreadyExists` when it belongs to another cluster.
    fn adopt(
        &self,
        subject: &Subject<'_>,
        class: &MachineClass,
        record: LocalMachine,
    ) -> Result<CreateMachineResponse, DriverError> {
        if !subject.spec.tags_match(&record.tags) {
            return Err(DriverError::new(
                MachineCode::AlreadyExists,
                format!(
                    "machine {} exists ({}) without the tags of class {}: it belongs to another cluster",
                    subject.key(),
                    record.provider_id,
                    class_name(class)
                ),
            ));
        }
        if record.pgid.is_none() {
            tracing::info!(machine = %subject.key(), "starting the process of a machine that has none yet");
            let record = self.boot(record, subject)?;
            return Ok(response(&record, "created"));
        }
        tracing::debug!(machine = %subject.key(), provider_id = %record.provider_id, "local machine exists already");
        Ok(response(&record, "exists"))
    }

    /// Starts a machine's script and records its process; a process that cannot be recorded is stopped again.
    fn boot(&self, mut record: LocalMachine, subject: &Subject<'_>) -> Result<LocalMachine, DriverError> {
        let dir = &record.dir;
        let (cpu, memory) = subject.spec.resources();
        let config = &self.config;
        let vars: Vec<(&'static str, OsString)> = vec![
            (env::API_SERVER, config.api_server.clone().into()),
            (env::CA_FILE, config.ca_file.clone().into()),
            (env::MACHINE_DIR, dir.clone().into()),
            (env::PROVIDER_ID, record.provider_id.clone().into()),
            (env::CPU, cpu.to_string().into()),
            (env::MEMORY, memory.into()),
            (env::NODE_NAME, record.machine_name.clone().into()),
            (
                env::HEARTBEAT_INTERVAL,
                format!("{}ms", config.heartbeat_interval.as_millis()).into(),
            ),
        ];
        let started = process::start(&Launch {
            dir,
            script: &dir.join(USER_DATA_FILE),
            log: &dir.join(LOG_FILE),
            bin_dir: &config.bin_dir,
            vars,
            label: subject.key(),
        })
        .map_err(|source| LocalError::Spawn {
            machine: subject.key(),
            source,
        })?;
        record.pid = Some(started.pid);
        record.pgid = Some(started.pid);
        record.process_start_time = started.start_time;
        if let Err(err) = Self::write_record(&record, dir) {
            let _ = process::stop_group(started.pid, Duration::ZERO);
            return Err(err.into());
        }
        Ok(record)
    }

    fn delete(&self, request: &DeleteMachineRequest) -> Result<DeleteMachineResponse, DriverError> {
        let class = &request.machine_class;
        let subject = Subject::of(&request.machine, class, MachineCode::InvalidArgument)?;
        self.locked(&subject.key(), || {
            let dir = self.machine_dir(subject.namespace, subject.name);
            let Some(record) = Inner::read_record(&dir)? else {
                tracing::debug!(machine = %subject.key(), "no local machine to delete");
                return Ok(DeleteMachineResponse::default());
            };
            if !subject.spec.tags_match(&record.tags) {
                // Spec 000: "The provider SHALL only act on machines belonging to the cluster-id/cluster-name
                // obtained from the `ProviderSpec`."
                tracing::warn!(
                    machine = %subject.key(),
                    class = class_name(class),
                    "not deleting a machine without the tags of the class"
                );
                return Ok(DeleteMachineResponse::default());
            }
            let stopped = match record.pgid {
                Some(pgid) if process::is_ours(pgid, record.process_start_time) => {
                    let stopped = process::stop_group(pgid, self.config.stop_grace).map_err(|source| {
                        LocalError::Signal {
                            machine: subject.key(),
                            pgid,
                            source,
                        }
                    })?;
                    stopped.ok_or_else(|| LocalError::StillRunning {
                        machine: subject.key(),
                        pgid,
                    })?
                }
                _ => Stopped::NotRunning,
            };
            // Renamed first, so that the machine is gone at once even if the removal stops half-way.
            let doomed = self.transient_dir(subject.namespace, "deleting", subject.name);
            fs::rename(&dir, &doomed).map_err(LocalError::io("renaming", &dir))?;
            match fs::remove_dir_all(&doomed) {
                Ok(()) => {}
                Err(err) if err.kind() == ErrorKind::NotFound => {}
                Err(err) => tracing::warn!(path = %doomed.display(), error = %err, "removing a deleted machine's files"),
            }
            tracing::info!(machine = %subject.key(), provider_id = %record.provider_id, ?stopped, "local machine deleted");
            Ok(DeleteMachineResponse::default())
        })
    }

    fn status(&self, request: &GetMachineStatusRequest) -> Result<GetMachineStatusResponse, DriverError> {
        let class = &request.machine_class;
        let subject = Subject::of(&request.machine, class, MachineCode::InvalidArgument)?;
        let dir = self.machine_dir(subject.namespace, subject.name);
        match Inner::read_record(&dir)? {
            Some(record) if subject.spec.tags_match(&record.tags) => Ok(GetMachineStatusResponse {
                provider_id: record.provider_id.clone(),
                node_name: record.machine_name.clone(),
                addresses: record.addresses(),
            }),
            _ => Err(DriverError::not_found(format!(
                "no local machine {} carrying the tags of class {}",
                subject.key(),
                class_name(class)
            ))),
        }
    }

    fn list(&self, request: &ListMachinesRequest) -> Result<ListMachinesResponse, DriverError> {
        let spec = provider_spec(&request.machine_class, MachineCode::InvalidArgument)?;
        let machine_list = self
            .machines()?
            .into_iter()
            .filter(|record| spec.tags_match(&record.tags))
            .map(|record| (record.provider_id, record.machine_name))
            .collect();
        Ok(ListMachinesResponse { machine_list })
    }
}

/// The entry names of a directory, sorted; empty when it does not exist.
fn sorted_entries(dir: &Path) -> Result<Vec<String>, LocalError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(LocalError::io("listing", dir)(err)),
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect();
    names.sort();
    Ok(names)
}

/// CreateMachine's answer for a machine. `lastKnownState` is informational only (`created` or `exists`, and the
/// process group); the provider never reads it back: the machine directory is the state.
fn response(record: &LocalMachine, how: &str) -> CreateMachineResponse {
    CreateMachineResponse {
        provider_id: record.provider_id.clone(),
        node_name: record.machine_name.clone(),
        last_known_state: match record.pgid {
            Some(pgid) => format!("{how}: process group {pgid}"),
            None => how.to_owned(),
        },
        addresses: record.addresses(),
    }
}

#[async_trait]
impl Driver for LocalDriver {
    /// Spec 000: "If VM backing the `Machine.Name` already exists, and is compatible with the specified `Machine`
    /// object in the `CreateMachineRequest`, the Provider MUST reply `0 OK`". An existing machine is compatible when
    /// it carries the class's tags (the same cluster); other parameters (size, vmPool) are not compared, since a
    /// running process cannot be resized: the machine is adopted as it is. One without them is `AlreadyExists`.
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        let request = request.clone();
        self.blocking(move |inner| inner.create(&request)).await
    }

    /// Spec 000: "If a VM corresponding to the specified machine-object's name does not exist [...] the Provider
    /// MUST reply `0 OK`". Stops the machine's process group (SIGTERM, then SIGKILL after the stop grace) and removes
    /// its directory; a machine of another cluster (without the class's tags) is left alone, answering OK.
    async fn delete_machine(
        &self,
        request: &DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        let request = request.clone();
        self.blocking(move |inner| inner.delete(&request)).await
    }

    /// The machine exists while its directory does, whether its processes run or not (a machine whose processes
    /// died is a broken VM: its node goes silent, and the controller's health check replaces it). `NotFound` when
    /// there is no directory or its tags do not carry the class's.
    async fn get_machine_status(
        &self,
        request: &GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        let request = request.clone();
        self.blocking(move |inner| inner.status(&request)).await
    }

    /// Every machine of any namespace carrying all the class's tags, provider ID to machine name.
    async fn list_machines(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        let request = request.clone();
        self.blocking(move |inner| inner.list(&request)).await
    }

    /// Local machines have no volumes of the provider: no persistent volume is the provider's, so the answer is an
    /// empty list (spec 000: "If for any `PV` the Provider wasn't able to identify the `Volume-ID`, the provider MAY
    /// chose to ignore it"). Answering OK rather than `Unimplemented` tells the drain, without a warning, that it has
    /// no volume detachments to wait for.
    async fn get_volume_ids(
        &self,
        request: &GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        let _ = request;
        Ok(GetVolumeIdsResponse::default())
    }
}

/// Stops every machine under `state_dir` (SIGTERM to its process group, SIGKILL after [`DEFAULT_STOP_GRACE`]) and
/// returns how many were still running; the caller then removes the directory (`mcm down --purge`). Machines whose
/// recorded process ID now belongs to another process are left alone. A missing directory has none.
pub fn purge(state_dir: &Path) -> Result<usize, LocalError> {
    let machines_dir = state_dir.join(MACHINES_DIR);
    if !machines_dir.is_dir() {
        return Ok(0);
    }
    let mut stopped = 0;
    for namespace in sorted_entries(&machines_dir)? {
        let namespace_dir = machines_dir.join(&namespace);
        if !namespace_dir.is_dir() {
            continue;
        }
        for name in sorted_entries(&namespace_dir)? {
            let Ok(Some(record)) = Inner::read_record(&namespace_dir.join(&name)) else {
                continue;
            };
            if let Some(pgid) = record.pgid
                && process::is_ours(pgid, record.process_start_time)
                && process::group_running(pgid)
            {
                process::stop_group(pgid, DEFAULT_STOP_GRACE).map_err(|source| LocalError::Signal {
                    machine: format!("{namespace}/{name}"),
                    pgid,
                    source,
                })?;
                stopped += 1;
            }
        }
    }
    Ok(stopped)
}
