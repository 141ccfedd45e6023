//! Machine codes on the wire: [`DriverError`] to a gRPC status and back. Codes 0-16 are the gRPC codes themselves;
//! 17 (Uninitialized) travels as UNKNOWN with a `MachineCodeDetail` in the status details. Our server puts the detail
//! on every error, so a status without one did not come from a provider's answer but from the transport (the
//! provider is down, the connection broke): the client tells the two apart by it.

use mcm_driver::{DriverError, MachineCode};
use prost::Message;

use crate::proto::{AnyDetail, MachineCodeDetail, StatusDetails};

/// The type URL of [`MachineCodeDetail`] in the status details.
pub const DETAIL_TYPE_URL: &str = "type.googleapis.com/mcm.provider.v1.MachineCodeDetail";

fn grpc_code(code: MachineCode) -> tonic::Code {
    match code {
        MachineCode::Uninitialized => tonic::Code::Unknown,
        other => tonic::Code::from_i32(i32::try_from(other.number()).unwrap_or(2)),
    }
}

/// The gRPC status of a failed call: the machine code as the gRPC code (17 as UNKNOWN), the message unchanged, and the
/// machine code in the details.
pub fn to_status(error: &DriverError) -> tonic::Status {
    let code = grpc_code(error.code);
    let message = bounded_message(&error.message);
    let details = StatusDetails {
        code: code as i32,
        message: message.clone(),
        details: vec![AnyDetail {
            type_url: DETAIL_TYPE_URL.to_owned(),
            value: MachineCodeDetail {
                code: error.code.number(),
            }
            .encode_to_vec(),
        }],
    };
    tonic::Status::with_details(code, message, details.encode_to_vec().into())
}

/// The longest message a status carries, in bytes. The message travels twice in the trailers (`grpc-message`,
/// percent-encoded, and `grpc-status-details-bin`, base64), and HTTP/2's header list limit (16 KiB by default) fails
/// a call whose trailers are larger with `Internal: h2 protocol error`, losing the provider's code.
pub const MAX_MESSAGE_BYTES: usize = 2048;

/// The message cut to [`MAX_MESSAGE_BYTES`] on a character boundary, saying how much was cut.
fn bounded_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... [{} more bytes cut]", &message[..end], message.len() - end)
}

/// The machine code in a status's details, if the status carries one.
pub fn detail_code(status: &tonic::Status) -> Option<MachineCode> {
    let details = StatusDetails::decode(status.details()).ok()?;
    details
        .details
        .iter()
        .find(|d| d.type_url == DETAIL_TYPE_URL)
        .and_then(|d| MachineCodeDetail::decode(d.value.as_slice()).ok())
        .and_then(|d| MachineCode::from_number(d.code))
}

/// The driver error of a failed call: the detail's machine code when there is one, else the gRPC code (a gRPC code
/// is a machine code of the same number). `OK` can't be an error; it reads as Internal.
pub fn from_status(status: &tonic::Status) -> DriverError {
    let code = detail_code(status).unwrap_or_else(|| {
        MachineCode::from_number(u32::try_from(status.code() as i32).unwrap_or(2))
            .unwrap_or(MachineCode::Unknown)
    });
    let code = if code == MachineCode::Ok {
        MachineCode::Internal
    } else {
        code
    };
    DriverError::new(code, status.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_machine_code_and_its_message_survive_the_round_trip() {
        for code in MachineCode::ALL.into_iter().filter(|c| *c != MachineCode::Ok) {
            let error = DriverError::new(code, format!("message of {code} with ünïcode: and = signs"));
            let status = to_status(&error);
            assert_eq!(from_status(&status), error);
            assert_eq!(status.message(), error.message, "the message travels unchanged");
        }
    }

    #[test]
    fn codes_up_to_16_are_the_grpc_codes_and_17_is_unknown_with_a_detail() {
        let status = to_status(&DriverError::new(MachineCode::ResourceExhausted, "quota"));
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        let status = to_status(&DriverError::new(MachineCode::Uninitialized, "not yet"));
        assert_eq!(status.code(), tonic::Code::Unknown);
        assert_eq!(detail_code(&status), Some(MachineCode::Uninitialized));
    }

    #[test]
    fn a_status_without_detail_reads_by_its_grpc_code() {
        let plain = tonic::Status::unavailable("connection refused");
        assert_eq!(detail_code(&plain), None);
        assert_eq!(
            from_status(&plain),
            DriverError::new(MachineCode::Unavailable, "connection refused")
        );
        assert_eq!(
            from_status(&tonic::Status::new(tonic::Code::Ok, "odd")).code,
            MachineCode::Internal
        );
    }
}
