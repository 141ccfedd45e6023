//! The string formats Kubernetes requires of names, label keys and label values, each returning every message
//! kube-apiserver would give, worded as it words them.
//!
//! Source: kubernetes/apimachinery `pkg/util/validation/validation.go` (`IsDNS1123Label`, `IsDNS1123Subdomain`,
//! `IsQualifiedName`, `IsValidLabelValue`, `RegexError`, `MaxLenError`, `EmptyError`) and
//! `pkg/api/validation/path` (`IsValidPathSegmentName`). One home: object metadata ([`crate::metadata`]) and
//! label selectors ([`crate::selectors`]) both check through here.

/// The longest DNS-1123 label, label value and name part of a qualified name.
pub const MAX_LABEL_LENGTH: usize = 63;
/// The longest DNS-1123 subdomain (most object names, the prefix of a label key).
pub const MAX_SUBDOMAIN_LENGTH: usize = 253;

const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and \
                                  end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', \
                               '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \
                                 '-', and must start and end with an alphanumeric character";
const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
                                     characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

/// `RegexError`: the message, examples, and the regular expression, as apimachinery joins them.
fn regex_error(message: &str, format: &str, examples: &[&str]) -> String {
    let examples: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!(
        "{message} (e.g. {}regex used for validation is '{format}')",
        examples.join(" or ")
    )
}

/// `MaxLenError`.
fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// True for `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
fn is_dns_label_shape(text: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = text.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|&c| alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// True for `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, the shape of a label name and a non-empty label value.
pub fn is_qualified_name_part(text: &str) -> bool {
    let bytes = text.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// `IsDNS1123Label`: what namespace names must be.
pub fn dns1123_label(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > MAX_LABEL_LENGTH {
        errors.push(max_len_error(MAX_LABEL_LENGTH));
    }
    if !is_dns_label_shape(value) {
        errors.push(regex_error(
            DNS1123_LABEL_MSG,
            DNS1123_LABEL_FMT,
            &["my-name", "123-abc"],
        ));
    }
    errors
}

/// `IsDNS1123Subdomain`: what most object names, node names and label key prefixes must be.
pub fn dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > MAX_SUBDOMAIN_LENGTH {
        errors.push(max_len_error(MAX_SUBDOMAIN_LENGTH));
    }
    if !value.split('.').all(is_dns_label_shape) {
        errors.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errors
}

/// `IsValidPathSegmentName`: what a name needs to be addressable in a URL path at all (the names of resources
/// that take any name, such as CertificateSigningRequests).
pub fn path_segment_name(value: &str) -> Vec<String> {
    match value {
        "." => return vec!["may not be '.'".into()],
        ".." => return vec!["may not be '..'".into()],
        _ => {}
    }
    ["/", "%"]
        .iter()
        .filter(|illegal| value.contains(*illegal))
        .map(|illegal| format!("may not contain '{illegal}'"))
        .collect()
}

/// `IsQualifiedName`: label keys and annotation keys (`[prefix/]name`).
pub fn qualified_name(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else {
                errors.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_MSG,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            )];
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > MAX_LABEL_LENGTH {
        errors.push(format!("name part {}", max_len_error(MAX_LABEL_LENGTH)));
    }
    if !is_qualified_name_part(name) {
        errors.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errors
}

/// `IsValidLabelValue`: empty, or at most 63 characters of the qualified-name shape.
pub fn label_value(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > MAX_LABEL_LENGTH {
        errors.push(max_len_error(MAX_LABEL_LENGTH));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errors.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_apimachinery_writes_them() {
        assert_eq!(
            dns1123_subdomain("Bad_Name"),
            vec![
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', \
                 and must start and end with an alphanumeric character (e.g. 'example.com', regex used for \
                 validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
        assert_eq!(
            label_value(&"a".repeat(64)),
            vec!["must be no more than 63 characters"]
        );
        assert!(qualified_name("a/b/c")[0].starts_with("a qualified name must consist of"));
        assert_eq!(qualified_name("/x"), vec!["prefix part must be non-empty"]);
        assert_eq!(qualified_name("example.com/app"), Vec::<String>::new());
        assert_eq!(path_segment_name("a/b"), vec!["may not contain '/'"]);
        assert_eq!(dns1123_label("a.b").len(), 1);
        assert!(dns1123_label("ns-1").is_empty());
        assert!(label_value("").is_empty());
        assert!(label_value("My_value.1").is_empty());
    }
}
