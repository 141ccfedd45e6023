//! Requests and responses of the provider calls (spec 000, reference section 2).
//!
//! Requests carry the machine, its class and the class's secret (userData already templated, credentials merged).
//! Their `Debug` output names the secret and its keys but never its values, so a request can be logged safely.

use std::{collections::BTreeMap, fmt};

use k8s_openapi::api::core::v1::{NodeAddress, PersistentVolumeSpec, Secret};
use mcm_api::{ClassSpec, Machine, MachineClass};

/// `Debug` of a secret that shows its name and keys only.
struct Redacted<'a>(&'a Secret);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<&str> = self
            .0
            .data
            .iter()
            .flat_map(BTreeMap::keys)
            .chain(self.0.string_data.iter().flat_map(BTreeMap::keys))
            .map(String::as_str)
            .collect();
        f.debug_struct("Secret")
            .field("name", &self.0.metadata.name)
            .field("namespace", &self.0.metadata.namespace)
            .field("keys", &keys)
            .finish_non_exhaustive()
    }
}

fn object_name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<&str> {
    meta.name.as_deref()
}

macro_rules! machine_request {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq)]
        pub struct $name {
            /// The machine.
            pub machine: Machine,
            /// The machine's class.
            pub machine_class: MachineClass,
            /// The class's secret (secretRef merged with credentialsSecretRef, credentials winning).
            pub secret: Secret,
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("machine", &object_name(&self.machine.metadata))
                    .field("provider_id", &self.machine.spec.provider_id)
                    .field("machine_class", &object_name(&self.machine_class.metadata))
                    .field("secret", &Redacted(&self.secret))
                    .finish()
            }
        }
    };
}

machine_request!(
    /// Create (or adopt) the VM of a machine.
    CreateMachineRequest
);
machine_request!(
    /// Initialize a VM right after its creation (spec 002 section 11).
    InitializeMachineRequest
);
machine_request!(
    /// Delete the VM of a machine; a missing VM is success.
    DeleteMachineRequest
);
machine_request!(
    /// Tell whether the VM of a machine exists, and its provider ID and node name.
    GetMachineStatusRequest
);

/// The VM created (or found) for a machine.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CreateMachineResponse {
    /// The provider's unique ID of the VM; matches the node's `spec.providerID`.
    pub provider_id: String,
    /// The name the VM's node registers with.
    pub node_name: String,
    /// Opaque provider state saved on the machine and passed back on later calls.
    pub last_known_state: String,
    /// Addresses of the VM, recorded on the machine when there is no target cluster.
    pub addresses: Vec<NodeAddress>,
}

/// The VM after initialization.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InitializeMachineResponse {
    /// The provider's unique ID of the VM.
    pub provider_id: String,
    /// The name the VM's node registers with.
    pub node_name: String,
    /// Addresses of the VM.
    pub addresses: Vec<NodeAddress>,
}

/// The outcome of a deletion.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteMachineResponse {
    /// Opaque provider state saved on the machine.
    pub last_known_state: String,
}

/// The VM of a machine as the provider sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GetMachineStatusResponse {
    /// The provider's unique ID of the VM.
    pub provider_id: String,
    /// The name the VM's node registers with.
    pub node_name: String,
    /// Addresses of the VM.
    pub addresses: Vec<NodeAddress>,
}

/// List the VMs that belong to a class (its cluster, told by the class's tags).
#[derive(Clone, PartialEq)]
pub struct ListMachinesRequest {
    /// The class.
    pub machine_class: MachineClass,
    /// The class's secret.
    pub secret: Secret,
}

impl fmt::Debug for ListMachinesRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListMachinesRequest")
            .field("machine_class", &object_name(&self.machine_class.metadata))
            .field("secret", &Redacted(&self.secret))
            .finish()
    }
}

/// The VMs of a class.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListMachinesResponse {
    /// Provider ID to machine name.
    pub machine_list: BTreeMap<String, String>,
}

/// Volume IDs of persistent volumes, to drain pods with volumes one at a time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GetVolumeIdsRequest {
    /// The volumes' specs.
    pub pv_specs: Vec<PersistentVolumeSpec>,
}

/// The volume IDs the provider recognised; volumes it does not own are left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GetVolumeIdsResponse {
    /// The volume IDs.
    pub volume_ids: Vec<String>,
}

/// Fill a `MachineClass` from a provider-specific class of another kind (spec 000
/// `GenerateMachineClassForMigration`).
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateMachineClassForMigrationRequest {
    /// The provider-specific class, as JSON (for example an `AWSMachineClass`).
    pub provider_specific_machine_class: serde_json::Value,
    /// The class to fill: name and namespace set, the rest to be filled by the provider.
    pub machine_class: MachineClass,
    /// The class reference of the machines, telling the old kind.
    pub class_spec: ClassSpec,
}

/// The filled class. The reference fills the request's class in place; across a process boundary it comes back here.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerateMachineClassForMigrationResponse {
    /// The filled class.
    pub machine_class: MachineClass,
}
