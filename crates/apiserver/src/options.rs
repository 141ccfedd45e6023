//! The request options kube-apiserver checks before a verb runs: `fieldManager` of writes, `resourceVersion` and
//! `resourceVersionMatch` of reads, and the media type of a create or update body. Each refusal names the
//! parameter and the reason, with the code kube-apiserver 1.32 gives (one exception, on `resourceVersion`, below).

use http::{HeaderMap, header};

use crate::{
    error::{ApiError, Cause},
    rest::Query,
};

/// The longest `fieldManager` (apimachinery `pkg/apis/meta/v1/validation` `FieldManagerMaxLength`).
pub const FIELD_MANAGER_MAX_LENGTH: usize = 128;
/// The group of the request options kinds (`metav1.GroupName`).
const META_GROUP: &str = "meta.k8s.io";

/// The media types a create or update body may have.
pub const BODY_MEDIA_TYPES: &str = "application/json, application/yaml";

fn cause(reason: &'static str, field: &str, message: String) -> Cause {
    Cause {
        reason,
        message,
        field: field.to_owned(),
    }
}

/// `ValidateFieldManager`, as `ValidateCreateOptions`, `ValidateUpdateOptions` and `ValidatePatchOptions` apply it:
/// at most 128 bytes, printable characters only; 422 on `<options_kind>.meta.k8s.io` (apiserver
/// `endpoints/handlers/create.go`, `update.go`, `patch.go`).
pub fn check_field_manager(options_kind: &str, query: &Query) -> Result<(), ApiError> {
    let manager = query.get("fieldManager").unwrap_or_default();
    let mut causes = Vec::new();
    if manager.len() > FIELD_MANAGER_MAX_LENGTH {
        causes.push(cause(
            "FieldValueTooLong",
            "fieldManager",
            format!("Too long: may not be more than {FIELD_MANAGER_MAX_LENGTH} bytes"),
        ));
    }
    // Go's unicode.IsPrint: letters, marks, numbers, punctuation, symbols and the ASCII space.
    for (position, c) in manager.char_indices() {
        if c.is_control() || (c.is_whitespace() && c != ' ') || is_format_char(c) {
            causes.push(cause(
                "FieldValueInvalid",
                "fieldManager",
                format!(
                    "Invalid value: {manager:?}: invalid character U+{:04X} (at position {position})",
                    u32::from(c)
                ),
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_kind(META_GROUP, options_kind, "", causes))
    }
}

/// `dryRun`: absent, empty or `All` (kube-apiserver's `ValidateDryRun`); anything else is 422 naming the options kind
/// and the field. Returns whether the request is a dry run.
pub fn check_dry_run(options_kind: &str, query: &Query) -> Result<bool, ApiError> {
    dry_run_value(options_kind, query.get("dryRun").unwrap_or_default())
}

/// One `dryRun` value (a query parameter, or an entry of DeleteOptions' `dryRun` list), as [`check_dry_run`].
pub fn dry_run_value(options_kind: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "" => Ok(false),
        "All" => Ok(true),
        other => Err(ApiError::invalid_kind(
            META_GROUP,
            options_kind,
            "",
            vec![cause(
                "FieldValueNotSupported",
                "dryRun",
                format!("Unsupported value: {other:?}: supported values: \"All\""),
            )],
        )),
    }
}

/// The invisible format characters Go's `unicode.IsPrint` refuses besides controls (category Cf, the common ones).
fn is_format_char(c: char) -> bool {
    matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{feff}')
}

/// A `resourceVersion` parameter must be empty or a decimal unsigned 64-bit number (apiserver
/// `storage/etcd3/api_object_versioner.go` `ParseResourceVersion`; the message is kube's).
///
/// kube-apiserver 1.32 answers this with a 500 and no reason (kubernetes/kubernetes issues #101350 and #139485,
/// fix proposed in PR #139525): a server error for a client's mistake, which clients retry. This server answers 400
/// BadRequest with the same message, as the proposed fix does and as the project's rule for bad input requires.
pub fn check_resource_version(query: &Query) -> Result<(), ApiError> {
    let Some(text) = query.get("resourceVersion").filter(|t| !t.is_empty()) else {
        return Ok(());
    };
    let problem = if !text.bytes().all(|b| b.is_ascii_digit()) {
        Some("invalid syntax")
    } else if text.parse::<u64>().is_err() {
        Some("value out of range")
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(problem) => Err(ApiError::BadRequest(format!(
            "resourceVersion: Invalid value: {text:?}: strconv.ParseUint: parsing {text:?}: {problem}"
        ))),
    }
}

/// `ValidateListOptions` of a list or watch: where `resourceVersionMatch` and `sendInitialEvents` may be used;
/// 422 on `ListOptions.meta.k8s.io` naming the parameter (apimachinery `pkg/apis/meta/internalversion/validation`,
/// applied by apiserver `endpoints/handlers/get.go` `ListResource`). A get takes no such option: kube's
/// GetOptions has no resourceVersionMatch, and an unknown parameter is ignored.
pub fn check_list_options(query: &Query, watch: bool) -> Result<(), ApiError> {
    let matching = query.get("resourceVersionMatch").unwrap_or_default();
    let resource_version = query.get("resourceVersion").unwrap_or_default();
    let continued = query.get("continue").is_some_and(|c| !c.is_empty());
    let send_initial = query.get("sendInitialEvents").is_some();
    let forbidden = |field: &str, why: &str| cause("FieldValueForbidden", field, format!("Forbidden: {why}"));
    let unsupported = |supported: &[&str]| {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        cause(
            "FieldValueNotSupported",
            "resourceVersionMatch",
            format!(
                "Unsupported value: {matching:?}: supported values: {}",
                list.join(", ")
            ),
        )
    };
    let mut causes = Vec::new();
    if watch {
        if send_initial && matching != "NotOlderThan" {
            causes.push(forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !matching.is_empty() {
            if !send_initial {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if matching != "NotOlderThan" {
                causes.push(unsupported(&["NotOlderThan"]));
            }
            if continued {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
        }
    } else {
        if !matching.is_empty() {
            if resource_version.is_empty() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if continued {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            if matching != "Exact" && matching != "NotOlderThan" {
                causes.push(unsupported(&["Exact", "NotOlderThan", ""]));
            }
            if matching == "Exact" && resource_version == "0" {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        if send_initial {
            causes.push(forbidden(
                "sendInitialEvents",
                "sendInitialEvents is forbidden for list",
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_kind(META_GROUP, "ListOptions", "", causes))
    }
}

/// The form of a create or update body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFormat {
    /// `application/json`, and a body without Content-Type.
    Json,
    /// `application/yaml`.
    Yaml,
    /// `application/vnd.kubernetes.protobuf` (the built-in kinds only: [`crate::protobuf::check_body`]).
    Protobuf,
}

/// The body form a Content-Type names, as apiserver `endpoints/handlers/negotiation`
/// `NegotiateInputSerializerForMediaType` decides it: no Content-Type is JSON (the first supported type), the
/// media type is parsed as Go's `mime.ParseMediaType` does (its parameters, charset included, are not used), and
/// a media type that does not parse or is not served is a 415.
pub fn body_format(headers: &HeaderMap) -> Result<BodyFormat, ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(BodyFormat::Json);
    };
    let unsupported = |shown: &str| {
        ApiError::UnsupportedMediaType(format!(
            "the body of the request was in an unknown format ({shown}) - accepted media types include: \
             {BODY_MEDIA_TYPES}"
        ))
    };
    let Ok(text) = value.to_str() else {
        return Err(unsupported("a Content-Type that is not ASCII"));
    };
    if text.trim().is_empty() {
        return Ok(BodyFormat::Json);
    }
    match parse_media_type(text).as_deref() {
        Some("application/json") => Ok(BodyFormat::Json),
        Some("application/yaml") => Ok(BodyFormat::Yaml),
        Some(crate::protobuf::MEDIA_TYPE) => Ok(BodyFormat::Protobuf),
        Some(other) => Err(unsupported(other)),
        None => Err(unsupported(&format!("malformed media type {text:?}"))),
    }
}

/// True for an RFC 2045 token character.
fn is_token_char(c: char) -> bool {
    c.is_ascii_graphic() && !"()<>@,;:\\\"/[]?=".contains(c)
}

/// The lower-cased `type/subtype` of a media type whose parameters are well formed (`; key=value`, the value a
/// token or a quoted string), or None.
pub fn parse_media_type(text: &str) -> Option<String> {
    let (base, mut rest) = match text.split_once(';') {
        Some((base, params)) => (base, Some(params)),
        None => (text, None),
    };
    let base = base.trim();
    let (kind, sub) = base.split_once('/')?;
    if kind.is_empty() || sub.is_empty() || !kind.chars().chain(sub.chars()).all(is_token_char) {
        return None;
    }
    while let Some(params) = rest {
        let (key, after) = params.split_once('=')?;
        let key = key.trim();
        if key.is_empty() || !key.chars().all(is_token_char) {
            return None;
        }
        let after = after.trim_start();
        let remainder = if let Some(quoted) = after.strip_prefix('"') {
            let mut escaped = false;
            let end = quoted.char_indices().find_map(|(i, c)| {
                let closes = c == '"' && !escaped;
                escaped = c == '\\' && !escaped;
                closes.then_some(i)
            })?;
            &quoted[end + 1..]
        } else {
            let end = after.find(|c: char| !is_token_char(c)).unwrap_or(after.len());
            if end == 0 {
                return None;
            }
            &after[end..]
        };
        let remainder = remainder.trim_start();
        match remainder.strip_prefix(';') {
            Some(next) => rest = Some(next),
            None if remainder.is_empty() => rest = None,
            None => return None,
        }
    }
    Some(base.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_parse_as_go_mime_parses_them() {
        assert_eq!(
            parse_media_type("application/json").as_deref(),
            Some("application/json")
        );
        assert_eq!(
            parse_media_type("Application/JSON; charset=iso-8859-1").as_deref(),
            Some("application/json")
        );
        assert_eq!(
            parse_media_type("application/yaml;a=\"x;y\" ; b=c").as_deref(),
            Some("application/yaml")
        );
        for bad in [
            "application",
            "application/json; charset",
            "application/json;",
            "/json",
            "a/b; =x",
            "a/b c",
        ] {
            assert_eq!(parse_media_type(bad), None, "{bad}");
        }
    }

    #[test]
    fn resource_versions_are_decimal_unsigned_numbers() {
        let query = |rv: &str| Query::parse(Some(&format!("resourceVersion={rv}")));
        assert!(check_resource_version(&query("0")).is_ok());
        assert!(check_resource_version(&query("18446744073709551615")).is_ok());
        for bad in ["abc", "-1", "%2B5", "18446744073709551616", "1_0"] {
            assert!(check_resource_version(&query(bad)).is_err(), "{bad}");
        }
    }
}
