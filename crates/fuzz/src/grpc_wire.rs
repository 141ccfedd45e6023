//! The gRPC conversions (crates/grpc `convert.rs`): protocol messages either side reads, as raw bytes or as
//! well-formed messages whose JSON fields (machine, class, secret, specs) are arbitrary. Must hold: no panic.

use arbitrary::{Result, Unstructured};
use mcm_grpc::{fuzzing, proto};
use prost::Message as _;

use crate::json;

fn json_bytes(u: &mut Unstructured<'_>) -> Result<Vec<u8>> {
    if u.ratio(1, 4)? {
        return u.arbitrary();
    }
    Ok(serde_json::to_vec(&json::object(u)?).unwrap_or_default())
}

fn message(u: &mut Unstructured<'_>, kind: u8) -> Result<Vec<u8>> {
    if u.ratio(1, 3)? {
        return u.arbitrary();
    }
    Ok(match kind % fuzzing::KINDS {
        0 | 1 => proto::MachineRequest {
            machine: json_bytes(u)?,
            machine_class: json_bytes(u)?,
            secret: json_bytes(u)?,
        }
        .encode_to_vec(),
        2 => proto::ListMachinesRequest {
            machine_class: json_bytes(u)?,
            secret: json_bytes(u)?,
        }
        .encode_to_vec(),
        3 => proto::GetVolumeIDsRequest {
            pv_specs: vec![json_bytes(u)?, json_bytes(u)?],
        }
        .encode_to_vec(),
        4 => proto::GenerateMachineClassForMigrationRequest {
            provider_specific_machine_class: json_bytes(u)?,
            machine_class: json_bytes(u)?,
            class_spec: json_bytes(u)?,
        }
        .encode_to_vec(),
        5 => proto::GenerateMachineClassForMigrationResponse {
            machine_class: json_bytes(u)?,
        }
        .encode_to_vec(),
        _ => u.arbitrary()?,
    })
}

/// Reads the message the bytes describe as its receiver does.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(kind) = u.arbitrary::<u8>() else {
        return;
    };
    let Ok(bytes) = message(&mut u, kind) else {
        return;
    };
    fuzzing::decode(kind, &bytes);
}
