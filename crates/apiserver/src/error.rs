//! API errors and their wire form, the `metav1.Status` object with the code, reason, message and causes that a
//! real API server would send for the same failure.

use http::StatusCode;
use serde_json::{Value, json};

use crate::registry::ResourceDef;

/// One field-level cause of an `Invalid` error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueRequired`, `FieldValueInvalid`, `FieldValueTypeInvalid`, `FieldValueNotSupported`, `FieldValueForbidden`, ...
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Field path.
    pub field: String,
}

/// What a failure is about, for the Status `details`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Subject {
    /// The human-readable message.
    pub message: String,
    /// Name of the object.
    pub name: String,
    /// API group of the object.
    pub group: String,
    /// The resource (plural) for 404 and 409, the kind for 422, as the real server writes it.
    pub kind: String,
}

/// A failed API request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 404: the object (or collection, or path) does not exist.
    #[error("{}", .0.message)]
    NotFound(Subject),
    /// 409: an object of that name exists already.
    #[error("{}", .0.message)]
    AlreadyExists(Subject),
    /// 409: optimistic concurrency failed.
    #[error("{}", .0.message)]
    Conflict(Subject),
    /// 409: a server-side apply would change fields other managers own; one `FieldManagerConflict` cause per
    /// field ([`crate::apply`]).
    #[error("{0}")]
    ApplyConflict(String, Vec<Cause>),
    /// 422: the object is invalid; every cause is listed.
    #[error("{}", .0.message)]
    Invalid(Subject, Vec<Cause>),
    /// 400: the request itself is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// 401: no valid credentials.
    #[error("Unauthorized")]
    Unauthorized,
    /// 403: the user may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// 403 from authorization: the user may not do this to this resource; the Status `details` name the object,
    /// its group and the resource (plural), as kube-apiserver's authorization failures do.
    #[error("{}", .0.message)]
    ForbiddenResource(Subject),
    /// 405: the verb is not allowed on this path.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 406: no acceptable media type can be produced.
    #[error("{0}")]
    NotAcceptable(String),
    /// 410: the requested resourceVersion is older than the retained window.
    #[error("{0}")]
    Expired(String),
    /// 413: the body is too large.
    #[error("{0}")]
    TooLarge(String),
    /// 415: the body's media type is not accepted here.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 414: the request line is longer than the server reads ([`crate::limits`]).
    #[error("{0}")]
    UriTooLong(String),
    /// 431: the request's header fields are larger than the server reads ([`crate::limits`]).
    #[error("{0}")]
    HeadersTooLarge(String),
    /// 429: try again later.
    #[error("{0}")]
    TooManyRequests(String, Option<u32>, Vec<Cause>),
    /// 500: the server failed (storage).
    #[error("{0}")]
    Internal(String),
    /// A failure injected by a test hook, with the chosen HTTP status.
    #[error("{1}")]
    Injected(u16, String),
}

impl ApiError {
    /// 404 for a named object of a resource, worded as Kubernetes words it.
    pub fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self::NotFound(subject(
            format!("{} \"{name}\" not found", def.group_resource()),
            name,
            &def.group,
            &def.plural,
        ))
    }

    /// 404 for a namespace that does not exist.
    pub fn namespace_not_found(namespace: &str) -> Self {
        Self::NotFound(subject(
            format!("namespaces \"{namespace}\" not found"),
            namespace,
            "",
            "namespaces",
        ))
    }

    /// 404 for a path that is not served.
    pub fn path_not_found(path: &str) -> Self {
        Self::NotFound(subject(
            format!("the server could not find the requested resource ({path})"),
            "",
            "",
            "",
        ))
    }

    /// 409 AlreadyExists.
    pub fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self::AlreadyExists(subject(
            format!("{} \"{name}\" already exists", def.group_resource()),
            name,
            &def.group,
            &def.plural,
        ))
    }

    /// 409 Conflict on a stale resourceVersion or a failed precondition.
    pub fn conflict(def: &ResourceDef, name: &str, why: &str) -> Self {
        Self::Conflict(subject(
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                def.group_resource()
            ),
            name,
            &def.group,
            &def.plural,
        ))
    }

    /// 409 for a write based on an old resourceVersion.
    pub fn stale(def: &ResourceDef, name: &str) -> Self {
        Self::conflict(
            def,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with every cause; the message lists them as kubectl shows them.
    pub fn invalid(def: &ResourceDef, name: &str, causes: Vec<Cause>) -> Self {
        Self::invalid_kind(&def.group, &def.kind, name, causes)
    }

    /// 422 about an object of any group and kind, such as the `meta.k8s.io` request options (`ListOptions`,
    /// `CreateOptions`) kube-apiserver validates before the verb runs.
    pub fn invalid_kind(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let list: Vec<String> = causes
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let qualified = if group.is_empty() {
            kind.to_owned()
        } else {
            format!("{kind}.{group}")
        };
        Self::Invalid(
            subject(
                format!("{qualified} \"{name}\" is invalid: {joined}"),
                name,
                group,
                kind,
            ),
            causes,
        )
    }

    /// The HTTP status code.
    pub fn code(&self) -> StatusCode {
        match self {
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::AlreadyExists(_) | Self::Conflict(_) | Self::ApplyConflict(..) => StatusCode::CONFLICT,
            Self::Invalid(..) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) | Self::ForbiddenResource(_) => StatusCode::FORBIDDEN,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            Self::Expired(_) => StatusCode::GONE,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::UriTooLong(_) => StatusCode::URI_TOO_LONG,
            Self::HeadersTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::TooManyRequests(..) => StatusCode::TOO_MANY_REQUESTS,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Injected(code, _) => {
                StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }

    /// The Status `reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "NotFound",
            Self::AlreadyExists(_) => "AlreadyExists",
            Self::Conflict(_) | Self::ApplyConflict(..) => "Conflict",
            Self::Invalid(..) => "Invalid",
            Self::BadRequest(_) => "BadRequest",
            Self::Unauthorized => "Unauthorized",
            Self::Forbidden(_) | Self::ForbiddenResource(_) => "Forbidden",
            Self::MethodNotAllowed(_) => "MethodNotAllowed",
            Self::NotAcceptable(_) => "NotAcceptable",
            Self::Expired(_) => "Expired",
            Self::TooLarge(_) => "RequestEntityTooLarge",
            Self::UnsupportedMediaType(_) => "UnsupportedMediaType",
            // metav1 has no reason for these two (kube-apiserver's Go HTTP server answers them as bare text before
            // any handler runs); the HTTP reason phrases say what happened.
            Self::UriTooLong(_) => "RequestURITooLong",
            Self::HeadersTooLarge(_) => "RequestHeaderFieldsTooLarge",
            Self::TooManyRequests(..) => "TooManyRequests",
            Self::Internal(_) => "InternalError",
            Self::Injected(code, _) => match code {
                409 => "Conflict",
                429 => "TooManyRequests",
                503 => "ServiceUnavailable",
                504 => "Timeout",
                _ => "InternalError",
            },
        }
    }

    /// The `metav1.Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code().as_u16(),
        });
        let details = match self {
            Self::NotFound(s) | Self::AlreadyExists(s) | Self::Conflict(s) | Self::ForbiddenResource(s) => {
                Some(details(&s.name, &s.group, &s.kind, &[]))
            }
            Self::Invalid(s, causes) => Some(details(&s.name, &s.group, &s.kind, causes)),
            Self::ApplyConflict(_, causes) => Some(details("", "", "", causes)),
            Self::TooManyRequests(_, retry_after_seconds, causes) => {
                let mut d = details("", "", "", causes);
                if let Some(seconds) = retry_after_seconds {
                    d["retryAfterSeconds"] = json!(seconds);
                }
                Some(d)
            }
            _ => None,
        };
        if let Some(details) = details.filter(|d| d.as_object().is_some_and(|o| !o.is_empty())) {
            status["details"] = details;
        }
        status
    }
}

fn subject(message: String, name: &str, group: &str, kind: &str) -> Subject {
    Subject {
        message,
        name: name.to_owned(),
        group: group.to_owned(),
        kind: kind.to_owned(),
    }
}

fn details(name: &str, group: &str, kind: &str, causes: &[Cause]) -> Value {
    let mut d = serde_json::Map::new();
    if !name.is_empty() {
        d.insert("name".into(), json!(name));
    }
    if !group.is_empty() {
        d.insert("group".into(), json!(group));
    }
    if !kind.is_empty() {
        d.insert("kind".into(), json!(kind));
    }
    if !causes.is_empty() {
        let causes: Vec<Value> = causes
            .iter()
            .map(|c| json!({ "reason": c.reason, "message": c.message, "field": c.field }))
            .collect();
        d.insert("causes".into(), Value::Array(causes));
    }
    Value::Object(d)
}

/// A `Status` of success, as a real server answers the immediate deletion of an object.
pub fn success_status(def: &ResourceDef, name: &str, uid: &str) -> Value {
    let mut details = details(name, &def.group, &def.plural, &[]);
    details["uid"] = json!(uid);
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details })
}
