//! Entry point for the fuzz targets (`crates/fuzz`, `fuzz/`): every protocol message one side reads from the
//! other, decoded with prost and converted to the driver types as the provider server and the controller's client
//! do, and a failed call's status decoded into a driver error. Bad bytes must give an error, never a panic.

use prost::Message as _;

use crate::{convert, proto, status};

/// How many kinds of wire input [`decode`] reads.
pub const KINDS: u8 = 12;

/// Reads `bytes` as wire input number `kind % KINDS`; true when it was accepted (decoded and converted).
pub fn decode(kind: u8, bytes: &[u8]) -> bool {
    match kind % KINDS {
        0 => proto::MachineRequest::decode(bytes).is_ok_and(|r| convert::create_request(&r).is_ok()),
        1 => proto::MachineRequest::decode(bytes).is_ok_and(|r| {
            // The server also reads the machine's name and the secret's values (for redaction) on its own.
            crate::server::machine_name(&r);
            crate::server::redactor_of(&r.secret).redact("message");
            convert::delete_request(&r).is_ok()
        }),
        2 => proto::ListMachinesRequest::decode(bytes).is_ok_and(|r| convert::list_request_from(&r).is_ok()),
        3 => {
            proto::GetVolumeIDsRequest::decode(bytes).is_ok_and(|r| convert::volumes_request_from(&r).is_ok())
        }
        4 => proto::GenerateMachineClassForMigrationRequest::decode(bytes)
            .is_ok_and(|r| convert::migration_request_from(&r).is_ok()),
        5 => proto::GenerateMachineClassForMigrationResponse::decode(bytes)
            .is_ok_and(|r| convert::migration_response_from(&r).is_ok()),
        6 => proto::CreateMachineResponse::decode(bytes)
            .map(convert::create_response_from)
            .is_ok(),
        7 => proto::InitializeMachineResponse::decode(bytes)
            .map(convert::initialize_response_from)
            .is_ok(),
        8 => proto::GetMachineStatusResponse::decode(bytes)
            .map(convert::status_response_from)
            .is_ok(),
        9 => proto::ListMachinesResponse::decode(bytes)
            .map(convert::list_response_from)
            .is_ok(),
        10 => proto::GetVolumeIDsResponse::decode(bytes)
            .map(convert::volumes_response_from)
            .is_ok(),
        _ => {
            // A failed call's status: any code, any message, any details bytes.
            let (code, rest) = bytes.split_first().unwrap_or((&0, &[]));
            let split = rest.len() / 2;
            let message = String::from_utf8_lossy(&rest[..split]).into_owned();
            let status = tonic::Status::with_details(
                tonic::Code::from(i32::from(*code)),
                message,
                bytes::Bytes::copy_from_slice(&rest[split..]),
            );
            status::detail_code(&status).is_some() || !status::from_status(&status).message.is_empty()
        }
    }
}
