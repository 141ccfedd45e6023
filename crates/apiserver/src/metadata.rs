//! `metadata` of written objects checked as kube-apiserver checks it on create and update: the name (by the rule of
//! its resource), generateName, label keys and values, annotation keys and their total size. Every problem is one
//! cause of a 422 Invalid naming the field.
//!
//! Source: kubernetes/apimachinery `pkg/api/validation/objectmeta.go` (`ValidateObjectMetaAccessor`,
//! `ValidateAnnotations`, `TotalAnnotationSizeLimitB`), `pkg/apis/meta/v1/validation` (`ValidateLabels`),
//! `pkg/api/validation/generic.go` (`NameIsDNSSubdomain`, `NameIsDNSLabel`, `maskTrailingDash`),
//! `apiserver/pkg/storage/names/generate.go` (`maxGeneratedNameLength`), and the per-kind name functions of
//! kubernetes `pkg/apis/*/validation` (namespaces: `ValidateNamespaceName`, a DNS label; CertificateSigningRequests:
//! `ValidateCertificateRequestName`, any name) and apiextensions-apiserver `customresource/validator.go` (custom
//! resources: DNS subdomain).

use serde_json::Value;

use crate::{
    error::{ApiError, Cause},
    naming,
    registry::ResourceDef,
};

/// Whether the object (as stored JSON) is being deleted: its `metadata.deletionTimestamp` is set. The one home of
/// this predicate for the server, which works on JSON rather than typed objects.
pub fn is_deleting(object: &Value) -> bool {
    !object["metadata"]["deletionTimestamp"].is_null()
}

/// The largest total size of an object's annotations, keys and values together (`TotalAnnotationSizeLimitB`).
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;
/// How much of generateName is kept before the random suffix (`maxGeneratedNameLength`: 63 - 5).
pub const MAX_GENERATED_PREFIX: usize = 58;

/// The rule a resource's object names follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// A DNS-1123 subdomain: most kinds, custom resources included.
    Subdomain,
    /// A DNS-1123 label: namespaces.
    Label,
    /// Anything addressable in a URL path: CertificateSigningRequests ("We don't care what you call your
    /// certificate requests", kubernetes `pkg/apis/certificates/validation`).
    PathSegment,
}

/// The name rule of a resource.
pub fn name_rule(def: &ResourceDef) -> NameRule {
    match (def.group.as_str(), def.kind.as_str()) {
        ("", "Namespace") => NameRule::Label,
        ("certificates.k8s.io", "CertificateSigningRequest") => NameRule::PathSegment,
        _ => NameRule::Subdomain,
    }
}

/// The messages for a name (or, with `prefix`, a generateName) under a rule. A generateName may end in '-': the
/// last characters are masked as kube's `maskTrailingDash` does before the check.
pub fn name_errors(rule: NameRule, name: &str, prefix: bool) -> Vec<String> {
    let masked;
    let checked = if prefix && name.len() > 1 && name.ends_with('-') {
        // maskTrailingDash: name[:len-2] + "a". Byte slicing as Go does; a cut inside a character only happens for
        // non-ASCII names, which fail the check anyway.
        masked = format!("{}a", name.get(..name.len() - 2).unwrap_or_default());
        masked.as_str()
    } else {
        name
    };
    match rule {
        NameRule::Subdomain => naming::dns1123_subdomain(checked),
        NameRule::Label => naming::dns1123_label(checked),
        NameRule::PathSegment => naming::path_segment_name(name),
    }
}

/// The name a generateName gives: the prefix cut to [`MAX_GENERATED_PREFIX`] bytes (at a character boundary)
/// followed by the random suffix.
pub fn generated_name(prefix: &str, suffix: &str) -> String {
    let mut end = prefix.len().min(MAX_GENERATED_PREFIX);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", &prefix[..end])
}

/// How often a create with generateName draws a new name when the one drawn is taken (kube-apiserver's
/// `maxNameGenerationCreateAttempts`: 8 attempts).
const GENERATE_NAME_RETRIES: usize = 7;

/// Runs `attempt` with `name` and, for a generated name (`prefix`) that is taken (409 AlreadyExists), again with a
/// new suffix from `draw`, up to [`GENERATE_NAME_RETRIES`] times, as kube-apiserver does since 1.32
/// (RetryGenerateName, KEP-4420): five random characters collide within a few thousand names otherwise.
pub fn retry_generated_name<T>(
    name: String,
    prefix: Option<&str>,
    mut draw: impl FnMut() -> String,
    mut attempt: impl FnMut(&str) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let mut name = name;
    let mut retries = 0;
    loop {
        match (attempt(&name), prefix) {
            (Err(ApiError::AlreadyExists(_)), Some(prefix)) if retries < GENERATE_NAME_RETRIES => {
                retries += 1;
                name = generated_name(prefix, &draw());
            }
            (outcome, _) => return outcome,
        }
    }
}

/// kube-apiserver's `summarizeData(body, 30)`: a JSON body's first 30 bytes, then " ...". Only this much of a body
/// is ever echoed in an error, so a refused body's secrets stay out of responses and logs.
fn summarize(object: &Value) -> String {
    let text = object.to_string();
    let mut end = text.len().min(30);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if end < text.len() {
        format!("{} ...", &text[..end])
    } else {
        text
    }
}

/// The apiVersion and kind of a create or update body, as kube-apiserver's decoders check them.
///
/// Custom resources (machine.sapcloud.io is served from CRDs in a real cluster) are decoded as unstructured
/// objects: a missing kind is a 400 ("Object 'Kind' is missing", apimachinery `runtime/serializer/json`
/// `Decode`, wrapped by `transformDecodeError` of apiserver `endpoints/handlers/rest.go`), an apiVersion other
/// than the URL's a 400 (`handlers/create.go`, `update.go`), a kind other than the resource's a 422 on `kind`
/// (apiextensions-apiserver `customresource/validator.go` `ValidateTypeMeta`). Built-in kinds take a missing
/// apiVersion and kind from the URL (the typed decoder's defaults); a different one is a 400.
pub fn check_type_meta(def: &ResourceDef, object: &Value) -> Result<(), ApiError> {
    let api_version = object.get("apiVersion").and_then(Value::as_str);
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty());
    let version_mismatch = |found: &str| {
        ApiError::BadRequest(format!(
            "the API version in the data ({found}) does not match the expected API version ({})",
            def.api_version()
        ))
    };
    if def.custom {
        let Some(kind) = kind else {
            let summary = summarize(object);
            return Err(ApiError::BadRequest(format!(
                "the object provided is unrecognized (must be of type {}): Object 'Kind' is missing in \
                 '{summary}' ({summary})",
                def.kind
            )));
        };
        let api_version = api_version.unwrap_or_default();
        if api_version != def.api_version() {
            return Err(version_mismatch(api_version));
        }
        if kind != def.kind {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            return Err(ApiError::invalid(
                def,
                name,
                vec![invalid("kind", kind, &format!("must be {}", def.kind))],
            ));
        }
        return Ok(());
    }
    if let Some(api_version) = api_version.filter(|v| *v != def.api_version()) {
        return Err(version_mismatch(api_version));
    }
    if let Some(kind) = kind.filter(|k| *k != def.kind) {
        return Err(ApiError::BadRequest(format!(
            "{kind} in version \"{version}\" cannot be handled as a {expected}: no kind \"{kind}\" is registered \
             for version \"{api_version}\"",
            version = def.version,
            expected = def.kind,
            api_version = def.api_version(),
        )));
    }
    Ok(())
}

fn invalid(field: &str, value: &str, message: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        message: format!("Invalid value: {value:?}: {message}"),
        field: field.to_owned(),
    }
}

/// The string entries of a metadata map (labels, annotations).
fn entries<'v>(meta: &'v Value, key: &str) -> Vec<(&'v str, &'v str)> {
    meta[key]
        .as_object()
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v)))
                .collect()
        })
        .unwrap_or_default()
}

/// Every problem of an object's metadata, as kube-apiserver's ObjectMeta validation finds them.
pub fn validate(def: &ResourceDef, object: &Value) -> Vec<Cause> {
    let meta = &object["metadata"];
    let rule = name_rule(def);
    let mut causes = Vec::new();
    if let Some(name) = meta["name"].as_str().filter(|n| !n.is_empty()) {
        for message in name_errors(rule, name, false) {
            causes.push(invalid("metadata.name", name, &message));
        }
    }
    if let Some(prefix) = meta["generateName"].as_str().filter(|n| !n.is_empty()) {
        for message in name_errors(rule, prefix, true) {
            causes.push(invalid("metadata.generateName", prefix, &message));
        }
    }
    // ValidateLabels: the field is `metadata.labels` for keys and values alike; the value shown is the bad one.
    for (key, value) in entries(meta, "labels") {
        for message in naming::qualified_name(key) {
            causes.push(invalid("metadata.labels", key, &message));
        }
        for message in naming::label_value(value) {
            causes.push(invalid("metadata.labels", value, &message));
        }
    }
    // ValidateAnnotations: keys are qualified names compared in lower case; keys and values together are limited.
    let annotations = entries(meta, "annotations");
    for (key, _) in &annotations {
        for message in naming::qualified_name(&key.to_lowercase()) {
            causes.push(invalid("metadata.annotations", key, &message));
        }
    }
    let total: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        causes.push(Cause {
            reason: "FieldValueTooLong",
            message: format!("Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes"),
            field: "metadata.annotations".into(),
        });
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Subject;

    /// A create whose names are taken while `taken` says so: the names it tried, and how it ended.
    fn create_with(prefix: Option<&str>, taken: usize) -> (Vec<String>, Result<String, ApiError>) {
        let mut tried = Vec::new();
        let mut suffixes = (0..).map(|n: usize| format!("{n:05}"));
        let outcome = retry_generated_name(
            "first".to_owned(),
            prefix,
            || suffixes.next().unwrap_or_default(),
            |name| {
                tried.push(name.to_owned());
                if tried.len() <= taken {
                    Err(ApiError::AlreadyExists(Subject::default()))
                } else {
                    Ok(name.to_owned())
                }
            },
        );
        (tried, outcome)
    }

    #[test]
    fn a_taken_generated_name_is_drawn_again_up_to_seven_times_as_kube_apiserver_does() {
        let (tried, outcome) = create_with(Some("m-"), 2);
        assert_eq!(tried, ["first", "m-00000", "m-00001"]);
        assert_eq!(outcome.ok().as_deref(), Some("m-00001"));
        let (tried, outcome) = create_with(Some("m-"), 100);
        assert_eq!(tried.len(), 8, "8 attempts in all");
        assert!(matches!(outcome, Err(ApiError::AlreadyExists(_))));
        // A name given by the client is never replaced.
        let (tried, outcome) = create_with(None, 1);
        assert_eq!(tried, ["first"]);
        assert!(matches!(outcome, Err(ApiError::AlreadyExists(_))));
    }

    #[test]
    fn generate_name_keeps_58_bytes_and_masks_a_trailing_dash() {
        assert_eq!(generated_name(&"a".repeat(70), "xyz12").len(), 63);
        assert_eq!(generated_name("é".repeat(40).as_str(), "s").len(), 58 + 1);
        assert!(name_errors(NameRule::Subdomain, "web-", true).is_empty());
        assert!(!name_errors(NameRule::Subdomain, "web-", false).is_empty());
        assert!(name_errors(NameRule::Label, "-", true).len() == 1);
    }
}
