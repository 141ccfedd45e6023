//! The driver types to protocol messages and back. Kubernetes objects are JSON bytes; a message a server cannot
//! read is InvalidArgument naming the field.

use k8s_openapi::api::core::v1::NodeAddress;
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, DriverError,
    GenerateMachineClassForMigrationRequest, GenerateMachineClassForMigrationResponse,
    GetMachineStatusRequest, GetMachineStatusResponse, GetVolumeIdsRequest, GetVolumeIdsResponse,
    InitializeMachineRequest, InitializeMachineResponse, ListMachinesRequest, ListMachinesResponse,
};
use serde::{Serialize, de::DeserializeOwned};

use crate::proto;

/// JSON bytes of an object. Serializing our own types cannot fail in practice; if it did, the call fails Internal.
pub(crate) fn to_json(value: &impl Serialize, field: &str) -> Result<Vec<u8>, DriverError> {
    serde_json::to_vec(value)
        .map_err(|err| DriverError::internal(format!("{field}: cannot be encoded: {err}")))
}

/// An object from JSON bytes; InvalidArgument naming `field` when they are not one.
pub(crate) fn from_json<T: DeserializeOwned>(bytes: &[u8], field: &str) -> Result<T, DriverError> {
    serde_json::from_slice(bytes).map_err(|err| DriverError::invalid_argument(format!("{field}: {err}")))
}

fn addresses_to_proto(addresses: &[NodeAddress]) -> Vec<proto::NodeAddress> {
    addresses
        .iter()
        .map(|a| proto::NodeAddress {
            r#type: a.type_.clone(),
            address: a.address.clone(),
        })
        .collect()
}

fn addresses_from_proto(addresses: Vec<proto::NodeAddress>) -> Vec<NodeAddress> {
    addresses
        .into_iter()
        .map(|a| NodeAddress {
            type_: a.r#type,
            address: a.address,
        })
        .collect()
}

/// The request of the four per-machine calls.
pub(crate) fn machine_request(
    machine: &mcm_api::Machine,
    class: &mcm_api::MachineClass,
    secret: &k8s_openapi::api::core::v1::Secret,
) -> Result<proto::MachineRequest, DriverError> {
    Ok(proto::MachineRequest {
        machine: to_json(machine, "machine")?,
        machine_class: to_json(class, "machine_class")?,
        secret: to_json(secret, "secret")?,
    })
}

type MachineParts = (
    mcm_api::Machine,
    mcm_api::MachineClass,
    k8s_openapi::api::core::v1::Secret,
);

fn machine_parts(request: &proto::MachineRequest) -> Result<MachineParts, DriverError> {
    Ok((
        from_json(&request.machine, "machine")?,
        from_json(&request.machine_class, "machine_class")?,
        from_json(&request.secret, "secret")?,
    ))
}

macro_rules! machine_request_from {
    ($name:ident, $type:ident) => {
        pub(crate) fn $name(request: &proto::MachineRequest) -> Result<$type, DriverError> {
            let (machine, machine_class, secret) = machine_parts(request)?;
            Ok($type {
                machine,
                machine_class,
                secret,
            })
        }
    };
}

machine_request_from!(create_request, CreateMachineRequest);
machine_request_from!(initialize_request, InitializeMachineRequest);
machine_request_from!(delete_request, DeleteMachineRequest);
machine_request_from!(status_request, GetMachineStatusRequest);

pub(crate) fn create_response_to(r: CreateMachineResponse) -> proto::CreateMachineResponse {
    proto::CreateMachineResponse {
        provider_id: r.provider_id,
        node_name: r.node_name,
        last_known_state: r.last_known_state,
        addresses: addresses_to_proto(&r.addresses),
    }
}

pub(crate) fn create_response_from(r: proto::CreateMachineResponse) -> CreateMachineResponse {
    CreateMachineResponse {
        provider_id: r.provider_id,
        node_name: r.node_name,
        last_known_state: r.last_known_state,
        addresses: addresses_from_proto(r.addresses),
    }
}

pub(crate) fn initialize_response_to(r: InitializeMachineResponse) -> proto::InitializeMachineResponse {
    proto::InitializeMachineResponse {
        provider_id: r.provider_id,
        node_name: r.node_name,
        addresses: addresses_to_proto(&r.addresses),
    }
}

pub(crate) fn initialize_response_from(r: proto::InitializeMachineResponse) -> InitializeMachineResponse {
    InitializeMachineResponse {
        provider_id: r.provider_id,
        node_name: r.node_name,
        addresses: addresses_from_proto(r.addresses),
    }
}

pub(crate) fn delete_response_to(r: DeleteMachineResponse) -> proto::DeleteMachineResponse {
    proto::DeleteMachineResponse {
        last_known_state: r.last_known_state,
    }
}

pub(crate) fn delete_response_from(r: proto::DeleteMachineResponse) -> DeleteMachineResponse {
    DeleteMachineResponse {
        last_known_state: r.last_known_state,
    }
}

pub(crate) fn status_response_to(r: GetMachineStatusResponse) -> proto::GetMachineStatusResponse {
    proto::GetMachineStatusResponse {
        provider_id: r.provider_id,
        node_name: r.node_name,
        addresses: addresses_to_proto(&r.addresses),
    }
}

pub(crate) fn status_response_from(r: proto::GetMachineStatusResponse) -> GetMachineStatusResponse {
    GetMachineStatusResponse {
        provider_id: r.provider_id,
        node_name: r.node_name,
        addresses: addresses_from_proto(r.addresses),
    }
}

pub(crate) fn list_request_to(r: &ListMachinesRequest) -> Result<proto::ListMachinesRequest, DriverError> {
    Ok(proto::ListMachinesRequest {
        machine_class: to_json(&r.machine_class, "machine_class")?,
        secret: to_json(&r.secret, "secret")?,
    })
}

pub(crate) fn list_request_from(r: &proto::ListMachinesRequest) -> Result<ListMachinesRequest, DriverError> {
    Ok(ListMachinesRequest {
        machine_class: from_json(&r.machine_class, "machine_class")?,
        secret: from_json(&r.secret, "secret")?,
    })
}

pub(crate) fn list_response_to(r: ListMachinesResponse) -> proto::ListMachinesResponse {
    proto::ListMachinesResponse {
        machine_list: r.machine_list.into_iter().collect(),
    }
}

pub(crate) fn list_response_from(r: proto::ListMachinesResponse) -> ListMachinesResponse {
    ListMachinesResponse {
        machine_list: r.machine_list.into_iter().collect(),
    }
}

pub(crate) fn volumes_request_to(r: &GetVolumeIdsRequest) -> Result<proto::GetVolumeIDsRequest, DriverError> {
    Ok(proto::GetVolumeIDsRequest {
        pv_specs: r
            .pv_specs
            .iter()
            .map(|spec| to_json(spec, "pv_specs"))
            .collect::<Result<_, _>>()?,
    })
}

pub(crate) fn volumes_request_from(
    r: &proto::GetVolumeIDsRequest,
) -> Result<GetVolumeIdsRequest, DriverError> {
    Ok(GetVolumeIdsRequest {
        pv_specs: r
            .pv_specs
            .iter()
            .enumerate()
            .map(|(i, spec)| from_json(spec, &format!("pv_specs[{i}]")))
            .collect::<Result<_, _>>()?,
    })
}

pub(crate) fn migration_request_to(
    r: &GenerateMachineClassForMigrationRequest,
) -> Result<proto::GenerateMachineClassForMigrationRequest, DriverError> {
    Ok(proto::GenerateMachineClassForMigrationRequest {
        provider_specific_machine_class: to_json(
            &r.provider_specific_machine_class,
            "provider_specific_machine_class",
        )?,
        machine_class: to_json(&r.machine_class, "machine_class")?,
        class_spec: to_json(&r.class_spec, "class_spec")?,
    })
}

pub(crate) fn migration_request_from(
    r: &proto::GenerateMachineClassForMigrationRequest,
) -> Result<GenerateMachineClassForMigrationRequest, DriverError> {
    Ok(GenerateMachineClassForMigrationRequest {
        provider_specific_machine_class: from_json(
            &r.provider_specific_machine_class,
            "provider_specific_machine_class",
        )?,
        machine_class: from_json(&r.machine_class, "machine_class")?,
        class_spec: from_json(&r.class_spec, "class_spec")?,
    })
}

pub(crate) fn migration_response_to(
    r: &GenerateMachineClassForMigrationResponse,
) -> Result<proto::GenerateMachineClassForMigrationResponse, DriverError> {
    Ok(proto::GenerateMachineClassForMigrationResponse {
        machine_class: to_json(&r.machine_class, "machine_class")?,
    })
}

pub(crate) fn migration_response_from(
    r: &proto::GenerateMachineClassForMigrationResponse,
) -> Result<GenerateMachineClassForMigrationResponse, DriverError> {
    // A provider's answer we cannot read is the provider's fault, not the request's.
    from_json(&r.machine_class, "machine_class")
        .map(|machine_class| GenerateMachineClassForMigrationResponse { machine_class })
        .map_err(|err| DriverError::internal(format!("the provider's answer: {}", err.message)))
}

pub(crate) fn volumes_response_to(r: GetVolumeIdsResponse) -> proto::GetVolumeIDsResponse {
    proto::GetVolumeIDsResponse {
        volume_ids: r.volume_ids,
    }
}

pub(crate) fn volumes_response_from(r: proto::GetVolumeIDsResponse) -> GetVolumeIdsResponse {
    GetVolumeIdsResponse {
        volume_ids: r.volume_ids,
    }
}
