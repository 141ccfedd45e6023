//! `mcm provider call <method>`: one Driver call of a live provider, for operators ("which VMs does this provider
//! have?", "delete the VM of that machine"). The answer goes to standard output as text or JSON; a provider error goes
//! to standard error as its machine code and message (the class secret's values redacted) with exit code 1; bad usage
//! exits 2 naming the flag.

use std::{fmt::Write as _, path::PathBuf};

use anyhow::Context;
use clap::Args;
use k8s_openapi::{
    Resource as _,
    api::core::v1::{NodeAddress, PersistentVolume, Secret},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use mcm_api::{ClassSpec, Machine, MachineClass, MachineSpec};
use mcm_driver::{
    CreateMachineRequest, DeleteMachineRequest, Driver, DriverError, GetMachineStatusRequest,
    GetVolumeIdsRequest, InitializeMachineRequest, ListMachinesRequest,
};
use serde_json::json;

/// `mcm provider call`.
#[derive(Debug, Args)]
pub struct CallArgs {
    /// The Driver method to call: create (CreateMachine), status (GetMachineStatus), list (ListMachines), delete
    /// (DeleteMachine), init (InitializeMachine), volumes (GetVolumeIDs).
    #[arg(value_enum)]
    method: Method,
    /// The provider's endpoint (else MC_ENDPOINT): unix:///path/to.sock or tcp://host:port.
    #[arg(long, env = "MC_ENDPOINT")]
    endpoint: String,
    /// The MachineClass (YAML or JSON file). Default: the built-in example examples/local/01-machine-class.yaml.
    #[arg(long, requires = "secret")]
    class: Option<PathBuf>,
    /// The class's Secret (YAML or JSON file; its values are never printed). Default: the built-in example
    /// examples/local/00-secret.yaml.
    #[arg(long, requires = "class")]
    secret: Option<PathBuf>,
    /// The machine's name (create, status, delete, init). Its namespace is the class's (else `default`).
    #[arg(long)]
    machine: Option<String>,
    /// The providerID the machine records (status, delete, init; the controller passes it once it knows it).
    #[arg(long, default_value = "")]
    provider_id: String,
    /// A file of PersistentVolume objects (YAML, several documents allowed, or JSON) whose specs `volumes` sends.
    /// Repeatable.
    #[arg(long)]
    pv_file: Vec<PathBuf>,
    /// `text` (one line per VM, volume or field) or `json` (one JSON object on standard output).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// How to reach the provider.
    #[command(flatten)]
    client: crate::provider::ClientArgs,
}

/// The Driver methods `mcm provider call` can call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Method {
    /// CreateMachine.
    Create,
    /// GetMachineStatus.
    Status,
    /// ListMachines.
    List,
    /// DeleteMachine.
    Delete,
    /// InitializeMachine.
    Init,
    /// GetVolumeIDs.
    Volumes,
}

impl Method {
    fn word(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Status => "status",
            Self::List => "list",
            Self::Delete => "delete",
            Self::Init => "init",
            Self::Volumes => "volumes",
        }
    }

    fn needs_machine(self) -> bool {
        matches!(self, Self::Create | Self::Status | Self::Delete | Self::Init)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

/// Runs `mcm provider call`: exit 0 with the answer, 1 for a provider error, 2 for bad usage.
pub fn main(args: CallArgs) -> anyhow::Result<()> {
    let command = format!("mcm provider call {}", args.method.word());
    if let Err(problem) = usage(&args) {
        eprintln!("{command}: {problem}");
        std::process::exit(2);
    }
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    match runtime.block_on(call(args)) {
        // A file, endpoint or TLS flag that cannot be used: the message names the flag.
        Err(problem) => {
            eprintln!("{command}: {problem:#}");
            std::process::exit(2);
        }
        Ok(Ok(answer)) => crate::write_stdout(&answer),
        Ok(Err((error, redactor))) => {
            let message = redactor.redact(&error.message);
            eprintln!("{command}: {}: {}", error.code, message.trim_end());
            std::process::exit(1);
        }
    }
}

/// A usage mistake, naming the flag.
fn usage(args: &CallArgs) -> Result<(), String> {
    let method = args.method;
    let machine_given = args.machine.as_deref().is_some_and(|name| !name.is_empty());
    if method.needs_machine() && !machine_given {
        return Err(format!("--machine NAME is required for `{}`", method.word()));
    }
    if !method.needs_machine() && args.machine.is_some() {
        return Err(format!("--machine is not used by `{}`", method.word()));
    }
    if !args.provider_id.is_empty() && !matches!(method, Method::Status | Method::Delete | Method::Init) {
        return Err(format!("--provider-id is not used by `{}`", method.word()));
    }
    if method == Method::Volumes && args.pv_file.is_empty() {
        return Err("--pv-file FILE (PersistentVolume YAML) is required for `volumes`".to_owned());
    }
    if method != Method::Volumes && !args.pv_file.is_empty() {
        return Err(format!("--pv-file is not used by `{}`", method.word()));
    }
    Ok(())
}

/// The answer rendered, or the provider's error with what redacts its message.
type Answer = Result<String, (DriverError, mcm_core::redact::Redactor)>;

async fn call(args: CallArgs) -> anyhow::Result<Answer> {
    let endpoint: mcm_grpc::Endpoint = args.endpoint.parse().context("--endpoint")?;
    let class: MachineClass =
        crate::provider::read_object(args.class.as_deref(), "class", "01-machine-class.yaml")?;
    let secret = as_stored(crate::provider::read_object(
        args.secret.as_deref(),
        "secret",
        "00-secret.yaml",
    )?);
    let redactor = redactor_of(&secret);
    let pv_specs = args
        .pv_file
        .iter()
        .map(|path| read_pv_specs(path))
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    let driver = args.client.driver(&endpoint)?;
    let machine = machine(
        &class,
        args.machine.as_deref().unwrap_or_default(),
        &args.provider_id,
    );
    let json = args.output == Output::Json;
    let answer = match args.method {
        Method::Create => driver
            .create_machine(&CreateMachineRequest {
                machine,
                machine_class: class,
                secret,
            })
            .await
            .map(|r| vm(json, &r.provider_id, &r.node_name, &r.addresses)),
        Method::Status => driver
            .get_machine_status(&GetMachineStatusRequest {
                machine,
                machine_class: class,
                secret,
            })
            .await
            .map(|r| vm(json, &r.provider_id, &r.node_name, &r.addresses)),
        Method::Init => driver
            .initialize_machine(&InitializeMachineRequest {
                machine,
                machine_class: class,
                secret,
            })
            .await
            .map(|r| vm(json, &r.provider_id, &r.node_name, &r.addresses)),
        Method::Delete => {
            let name = machine.metadata.name.clone().unwrap_or_default();
            driver
                .delete_machine(&DeleteMachineRequest {
                    machine,
                    machine_class: class,
                    secret,
                })
                .await
                .map(|_| deleted(json, &name))
        }
        Method::List => driver
            .list_machines(&ListMachinesRequest {
                machine_class: class,
                secret,
            })
            .await
            .map(|r| listing(json, &r.machine_list)),
        Method::Volumes => driver
            .get_volume_ids(&GetVolumeIdsRequest { pv_specs })
            .await
            .map(|r| volume_ids(json, &r.volume_ids)),
    };
    Ok(answer.map_err(|error| (error, redactor)))
}

/// The machine a call is about, as the controller would send it: in the class's namespace, of the class.
fn machine(class: &MachineClass, name: &str, provider_id: &str) -> Machine {
    let namespace = class
        .metadata
        .namespace
        .clone()
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    Machine {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace),
            ..ObjectMeta::default()
        },
        spec: MachineSpec {
            class: ClassSpec {
                api_group: String::new(),
                kind: MachineClass::KIND.to_owned(),
                name: class.metadata.name.clone().unwrap_or_default(),
            },
            provider_id: provider_id.to_owned(),
            ..MachineSpec::default()
        },
        status: None,
    }
}

/// The secret as an API server stores it, which is how the controller sends it: `stringData` merged into `data`
/// (`stringData` winning), so that a provider reading `data` (userData, credentials) finds the file's values.
fn as_stored(mut secret: Secret) -> Secret {
    if let Some(string_data) = secret.string_data.take() {
        let data = secret.data.get_or_insert_with(Default::default);
        for (key, value) in string_data {
            data.insert(key, k8s_openapi::ByteString(value.into_bytes()));
        }
    }
    secret
}

/// What removes the secret's values (data and stringData) from a provider's message.
fn redactor_of(secret: &Secret) -> mcm_core::redact::Redactor {
    let mut redactor = mcm_core::redact::Redactor::new();
    for value in secret.data.iter().flat_map(|data| data.values()) {
        redactor.add(&value.0);
    }
    for value in secret.string_data.iter().flat_map(|data| data.values()) {
        redactor.add(value.as_bytes());
    }
    redactor
}

/// A VM's providerID, node name and addresses.
fn vm(json: bool, provider_id: &str, node_name: &str, addresses: &[NodeAddress]) -> String {
    if json {
        let addresses: Vec<_> = addresses
            .iter()
            .map(|a| json!({ "type": a.type_, "address": a.address }))
            .collect();
        return document(
            &json!({ "providerID": provider_id, "nodeName": node_name, "addresses": addresses }),
        );
    }
    let mut text = format!("providerID: {provider_id}\nnodeName: {node_name}\n");
    for address in addresses {
        let _ = writeln!(text, "address: {} {}", address.type_, address.address);
    }
    text
}

/// The confirmation of a deletion.
fn deleted(json: bool, name: &str) -> String {
    if json {
        document(&json!({ "machine": name, "deleted": true }))
    } else {
        format!("machine {name}: its VM is deleted (or there was none)\n")
    }
}

/// The VMs of a class: one `providerID<TAB>machine` line each.
fn listing(json: bool, machines: &std::collections::BTreeMap<String, String>) -> String {
    if json {
        let machines: Vec<_> = machines
            .iter()
            .map(|(id, name)| json!({ "providerID": id, "machine": name }))
            .collect();
        return document(&json!({ "machines": machines }));
    }
    machines.iter().fold(String::new(), |mut text, (id, name)| {
        let _ = writeln!(text, "{id}\t{name}");
        text
    })
}

/// The volume IDs, one per line.
fn volume_ids(json: bool, ids: &[String]) -> String {
    if json {
        return document(&json!({ "volumeIDs": ids }));
    }
    ids.iter().fold(String::new(), |mut text, id| {
        let _ = writeln!(text, "{id}");
        text
    })
}

fn document(value: &serde_json::Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

/// The specs of the PersistentVolumes in a YAML (several documents allowed) or JSON file.
fn read_pv_specs(
    path: &std::path::Path,
) -> anyhow::Result<Vec<k8s_openapi::api::core::v1::PersistentVolumeSpec>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--pv-file: reading {}", path.display()))?;
    let volumes: Vec<PersistentVolume> = serde_saphyr::from_multiple(&text)
        .with_context(|| format!("--pv-file: {} is not PersistentVolume YAML", path.display()))?;
    Ok(volumes.into_iter().filter_map(|pv| pv.spec).collect())
}
