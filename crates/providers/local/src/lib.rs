//! The local provider: a [`mcm_driver::Driver`] whose machines are process trees on this host. A machine boots by
//! running its class secret's `userData` with `/bin/sh` (the example's userData runs `mcm node-agent`, which
//! registers the machine's node with the target cluster and heartbeats it).
//!
//! ```no_run
//! # fn main() -> Result<(), mcm_provider_local::LocalError> {
//! use mcm_provider_local::{LocalConfig, LocalDriver};
//! let config = LocalConfig::new("/var/lib/mcm/local", "/usr/local/bin", "https://127.0.0.1:6443", "/var/lib/mcm/ca.crt");
//! let driver = LocalDriver::new(config)?; // hand it (in an Arc) to the machine controller or to mcm_grpc::serve,
//!                                         // with mcm_provider_local::optional_methods() as its identity's list
//! # Ok(()) }
//! ```
//!
//! # On disk
//! ```text
//! <state_dir>/                          0700 (created when missing)
//!   machines/                           0700
//!     <namespace>/                      0700
//!       <machine-name>/                 0700  the machine: it exists while this directory does
//!         machine.json                  0600  the record (LocalMachine): providerID, machineName, namespace,
//!                                             className, vmPool, size, rootFsSize, tags, createdAt, pid, pgid,
//!                                             processStartTime
//!         userdata.sh                   0600  the secret's userData, byte for byte
//!         machine.log                   0600  the script's stdout and stderr (appended), and a last line
//!                                             "[mcm-provider-local] the machine process exited (...)" when the
//!                                             provider that started it sees it exit
//!         conditions/                   0700  empty; see below
//!       .creating-<name>-<pid>-<n>/           a machine being created (renamed to <machine-name> when complete)
//!       .deleting-<name>-<pid>-<n>/           a machine being removed
//! ```
//! A machine is created in a staging directory and renamed into place, so a machine directory always holds its
//! files; a deleted one is renamed away before its files are removed. Staging and removal directories left behind by
//! a provider that stopped mid-call are removed by the next [`LocalDriver::new`]. One provider at a time should own
//! a state directory (calls for one machine are serialized within a provider, not across providers).
//!
//! **Conditions**: `conditions/` is for demos and tests that want the machine's node to report a condition: the
//! node agent (`mcm node-agent`) reads, every heartbeat, each file `conditions/<Type>` whose trimmed content is
//! `True`, `False` or `Unknown`, and reports that condition on its node; removing the file takes it back. For example
//! `echo True > <machine-dir>/conditions/KernelDeadlock` makes the machine controller see an unhealthy node, and
//! `echo False > <machine-dir>/conditions/Ready` makes the node NotReady. The provider only creates the (empty)
//! directory. The node agent also keeps its credentials (`pki/`) and the record of an in-place update it applied
//! (`in-place-update.json`) in the machine directory; deleting the machine removes them with it.
//!
//! # The machine's process
//! CreateMachine starts `/bin/sh <machine-dir>/userdata.sh` **detached**: in a process group of its own (so the
//! whole tree it starts can be signalled at once, and a Ctrl-C of the provider's terminal does not reach it), stdin
//! from `/dev/null`, stdout and stderr appended to `machine.log`, in the machine directory. The process outlives the
//! provider: a provider started later on the same state directory finds its machines (and their processes) from
//! disk. While the provider that started a process lives, a thread of it waits for the process, so that it leaves no
//! zombie. **A process that dies is not restarted**, neither by that provider nor by a later one: the machine still
//! exists (GetMachineStatus finds it) but its node goes silent, like a VM that broke, and the controller's health
//! check replaces it.
//!
//! Its environment is built from nothing (nothing of the provider's environment leaks into it, credentials
//! included): `PATH` (`bin_dir`, then the provider's PATH, so that userData finds `mcm`), `HOME` (the machine
//! directory: each machine has a home of its own) and the variables of [`env`](mod@env):
//!
//! | variable | value |
//! |---|---|
//! | `MCM_LOCAL_API_SERVER` | [`LocalConfig::api_server`], the target cluster's API server URL |
//! | `MCM_LOCAL_CA_FILE` | [`LocalConfig::ca_file`] (absolute), its CA certificate |
//! | `MCM_LOCAL_MACHINE_DIR` | the machine directory (absolute) |
//! | `MCM_LOCAL_PROVIDER_ID` | `local:///<namespace>/<machine-name>` |
//! | `MCM_LOCAL_CPU` | the CPUs of the size (`2`) |
//! | `MCM_LOCAL_MEMORY` | the memory of the size (`4Gi`) |
//! | `MCM_LOCAL_NODE_NAME` | the machine name |
//! | `MCM_LOCAL_HEARTBEAT_INTERVAL` | how often the node agent heartbeats (`10000ms` by default) |
//!
//! # The calls
//! A machine's namespace is the machine's, else the class's, else `default`; its name and namespace must be plain
//! directory names (letters, digits, `-`, `.`, `_`, starting with a letter or digit), else `InvalidArgument`. Every
//! call that receives a class validates its providerSpec ([`spec`]); a machine belongs to a class's cluster when its
//! recorded tags carry every tag of the class.
//!
//! | call | behaviour |
//! |---|---|
//! | CreateMachine | No machine: creates its directory and starts its process; answers the provider ID, node name = machine name, `lastKnownState` (informational: `created: process group <pgid>`), addresses InternalIP `127.0.0.1` and Hostname = machine name. A machine exists carrying the class's tags: the same answer, no second process (idempotent; other parameters are not compared: a process cannot be resized). One that exists without them: `AlreadyExists`. A machine whose process was never started (the provider stopped in between) gets it started. The secret's `userData` (in `data`, else `stringData`) missing or empty: `InvalidArgument` naming `secret.data.userData`. A `rootFsSize` below 1: `OutOfRange`. |
//! | DeleteMachine | SIGTERM to the machine's process group, up to [`LocalConfig::stop_grace`] for it to go, then SIGKILL (and up to 5 s more: a group still running then answers `Unavailable`, to be retried); then removes the machine directory. No machine: `OK` (spec 000). A machine without the class's tags is another cluster's: left alone, `OK`. Idempotent. |
//! | GetMachineStatus | The machine's provider ID, node name and addresses while its directory exists, even when its processes died; `NotFound` without a directory or with tags not carrying the class's. |
//! | ListMachines | Every machine of any namespace carrying the class's tags, provider ID to machine name. |
//! | GetVolumeIDs | Implemented: an empty list, whatever the volumes (spec 000: the provider "MAY chose to ignore" a volume it cannot identify, and no volume is the local provider's), so drains do not wait for volume detachments. |
//! | InitializeMachine, GenerateMachineClassForMigration | `Unimplemented` (the trait's defaults). |
//!
//! Errors: a broken state directory (an unreadable `machine.json`) is `Internal`; other I/O, spawning and signalling
//! failures are `Unknown` (retried). Messages and logs name machines, paths and fields, never the userData.
//!
//! A process ID recorded in `machine.json` is checked before its group is signalled: on Linux, when a process with
//! that ID exists but started at another time than recorded, the ID was reused (the machine's processes are all
//! gone) and nothing is signalled. Whether a group still runs is read from `/proc` (zombies do not count).

mod driver;
mod error;
mod process;
pub mod spec;

pub use driver::{
    CONDITIONS_DIR, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_STOP_GRACE, LOG_FILE, LocalConfig, LocalDriver,
    LocalMachine, MACHINES_DIR, PROVIDER_ID_PREFIX, RECORD_FILE, USER_DATA_FILE, env, optional_methods,
    purge,
};
pub use error::LocalError;
pub use spec::size_resources;
