//! Secret `data` values must be base64, as kube-apiserver decodes them (Go's `encoding/json` into `[]byte`:
//! standard alphabet with padding, CR and LF ignored, trailing bits not checked). A value that is not is refused
//! before anything is stored: on create and update the body cannot be decoded (400 `BadRequest`, kube's wording
//! "Secret in version "v1" cannot be handled as a Secret: illegal base64 data at input byte N"), on a patch the
//! patched object is invalid (422). Either names the key and never quotes the value (kube-apiserver quotes the
//! body, secret and all).

use base64::{
    Engine as _,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
};
use serde_json::Value;

use crate::error::{ApiError, Cause};
use crate::registry::ResourceDef;

/// Go's `base64.StdEncoding` as `encoding/json` uses it: padding required, trailing bits not checked.
const GO_STD: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
);

/// The first `data` entry of a Secret that is not base64: its key and Go's message for it.
pub fn first_undecodable(def: &ResourceDef, object: &Value) -> Option<(String, String)> {
    if def.kind != "Secret" || !def.group.is_empty() {
        return None;
    }
    let data = object.get("data")?.as_object()?;
    data.iter().find_map(|(key, value)| {
        let text = value.as_str()?;
        decode_error(text).map(|message| (key.clone(), message))
    })
}

/// Go's message when `text` is not base64 as `encoding/json` decodes `[]byte`, else `None`.
fn decode_error(text: &str) -> Option<String> {
    let cleaned: String = text.chars().filter(|c| *c != '\r' && *c != '\n').collect();
    let offset = match GO_STD.decode(cleaned.as_bytes()) {
        Ok(_) => return None,
        Err(
            base64::DecodeError::InvalidByte(offset, _) | base64::DecodeError::InvalidLastSymbol(offset, _),
        ) => offset,
        Err(base64::DecodeError::InvalidLength(_) | base64::DecodeError::InvalidPadding) => {
            // Go reports the end of the last complete quantum.
            cleaned.len() / 4 * 4
        }
    };
    Some(format!("illegal base64 data at input byte {offset}"))
}

/// Refuses a created or replaced Secret with a `data` value that is not base64: 400, as a body kube cannot decode.
pub fn check_body(def: &ResourceDef, object: &Value) -> Result<(), ApiError> {
    match first_undecodable(def, object) {
        None => Ok(()),
        Some((key, message)) => Err(ApiError::BadRequest(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: {message} (data[{key}])",
            kind = def.kind,
            version = def.version,
        ))),
    }
}

/// Refuses a patched Secret with a `data` value that is not base64: 422 with the key as the field.
pub fn check_patched(def: &ResourceDef, object: &Value) -> Result<(), ApiError> {
    match first_undecodable(def, object) {
        None => Ok(()),
        Some((key, message)) => Err(ApiError::invalid(
            def,
            object["metadata"]["name"].as_str().unwrap_or_default(),
            vec![Cause {
                reason: "FieldValueInvalid",
                message: format!("Invalid value: {message}"),
                field: format!("data[{key}]"),
            }],
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_accepts_padding_line_breaks_and_loose_trailing_bits() {
        for ok in ["", "bWFudQ==", "manu", "bWFu\ndQ==", "bWFudQ==\r\n", "YR=="] {
            assert_eq!(decode_error(ok), None, "{ok:?}");
        }
    }

    #[test]
    fn go_refuses_other_bytes_and_missing_padding_at_its_offset() {
        assert_eq!(
            decode_error("billy").as_deref(),
            Some("illegal base64 data at input byte 4")
        );
        assert_eq!(
            decode_error("admin!").as_deref(),
            Some("illegal base64 data at input byte 5")
        );
        assert_eq!(
            decode_error("bWFudQ").as_deref(),
            Some("illegal base64 data at input byte 4")
        );
        assert_eq!(
            decode_error("${PASSWORD_B64}").as_deref(),
            Some("illegal base64 data at input byte 0")
        );
    }
}
