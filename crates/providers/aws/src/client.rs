//! A small client of the AWS Query API (EC2, and STS/IAM for credentials and tests): form POSTs signed with
//! SigV4, XML answers read with roxmltree, errors carrying AWS's code and request ID only, and throttling, 5xx and
//! transport failures retried with exponential back-off and jitter.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use mcm_driver::{DriverError, MachineCode};
use rand::Rng;

use crate::sigv4::{self, Credentials};

/// The EC2 API version of the Query API.
pub const EC2_VERSION: &str = "2016-11-15";

/// How failed calls are retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (1 = no retry).
    pub attempts: u32,
    /// The first back-off; doubled each attempt up to `max`, and a random half to all of it slept (jitter).
    pub base: Duration,
    /// The longest back-off.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 4,
            base: Duration::from_millis(200),
            max: Duration::from_secs(5),
        }
    }
}

/// A failed AWS call: what AWS said (its error code and request ID) or what went wrong on the way. Never holds a
/// credential, a parameter value or AWS's free-text message (which may echo parameters such as userData).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AwsError {
    /// AWS answered an error.
    #[error("{action}: AWS error {code} (HTTP {status}, request ID {request_id})")]
    Api {
        /// The action called.
        action: String,
        /// AWS's error code, e.g. `InsufficientInstanceCapacity`.
        code: String,
        /// The HTTP status.
        status: u16,
        /// AWS's request ID (`-` when absent).
        request_id: String,
    },
    /// No answer: connection refused or dropped, TLS failure, or the call's deadline passed.
    #[error("{action}: no answer from {endpoint}: {reason}")]
    Transport {
        /// The action called.
        action: String,
        /// The endpoint.
        endpoint: String,
        /// What went wrong (never request content).
        reason: String,
    },
    /// An answer that is not the XML expected.
    #[error("{action}: unreadable answer: {reason}")]
    Malformed {
        /// The action called.
        action: String,
        /// What is wrong.
        reason: String,
    },
}

/// AWS error codes that mean a quota or capacity limit (the reference's `ResourceExhausted` list).
pub const RESOURCE_EXHAUSTED_CODES: [&str; 10] = [
    "InsufficientCapacity",
    "InsufficientAddressCapacity",
    "InsufficientInstanceCapacity",
    "InsufficientVolumeCapacity",
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
    "VolumeLimitExceeded",
    "MaxIOPSLimitExceeded",
    "RouteLimitExceeded",
    "Unsupported",
];

/// AWS error codes of missing or invalid credentials.
pub const UNAUTHENTICATED_CODES: [&str; 9] = [
    "AuthFailure",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "InvalidAccessKeyId",
    "ExpiredToken",
    "RequestExpired",
    "InvalidToken",
];

/// AWS error codes of valid credentials that lack a permission.
pub const PERMISSION_DENIED_CODES: [&str; 5] = [
    "UnauthorizedOperation",
    "AccessDenied",
    "AccessDeniedException",
    "OptInRequired",
    "Blocked",
];

/// AWS error codes of throttling.
pub const THROTTLING_CODES: [&str; 4] = [
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "ServiceUnavailable",
];

impl AwsError {
    /// The AWS error code, if AWS answered one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The machine code of this failure, as the reference maps it.
    pub fn machine_code(&self) -> MachineCode {
        match self {
            Self::Api { code, status, .. } => {
                let code = code.as_str();
                if RESOURCE_EXHAUSTED_CODES.contains(&code) {
                    MachineCode::ResourceExhausted
                } else if code.ends_with(".NotFound") {
                    MachineCode::NotFound
                } else if UNAUTHENTICATED_CODES.contains(&code) {
                    MachineCode::Unauthenticated
                } else if PERMISSION_DENIED_CODES.contains(&code) {
                    MachineCode::PermissionDenied
                } else if THROTTLING_CODES.contains(&code) || *status >= 500 {
                    MachineCode::Unavailable
                } else {
                    MachineCode::Internal
                }
            }
            Self::Transport { .. } => MachineCode::Unavailable,
            Self::Malformed { .. } => MachineCode::Internal,
        }
    }

    /// Whether a retry may succeed (throttling, 5xx, no answer).
    pub fn retryable(&self) -> bool {
        self.machine_code() == MachineCode::Unavailable
    }
}

impl From<AwsError> for DriverError {
    fn from(err: AwsError) -> Self {
        DriverError::new(err.machine_code(), err.to_string())
    }
}

/// Where and how to call one AWS service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The endpoint URL (`https://ec2.eu-west-1.amazonaws.com`, or an override such as `http://127.0.0.1:5000`).
    pub endpoint: String,
    /// The signing region.
    pub region: String,
    /// The signing service name (`ec2`, `sts`, `iam`).
    pub service: String,
    /// The API version.
    pub version: String,
}

/// A Query-API client; cheap to clone (connections are pooled and shared).
#[derive(Clone)]
pub struct QueryClient {
    http: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    retry: RetryPolicy,
    call_timeout: Duration,
    metrics: std::sync::Arc<crate::metrics::CloudApiMetrics>,
}

impl std::fmt::Debug for QueryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryClient")
            .field("retry", &self.retry)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

/// The answer of a call: its XML text.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The XML.
    pub xml: String,
}

impl Answer {
    /// The parsed document.
    pub fn doc(&self, action: &str) -> Result<roxmltree::Document<'_>, AwsError> {
        roxmltree::Document::parse(&self.xml).map_err(|err| AwsError::Malformed {
            action: action.to_owned(),
            reason: err.to_string(),
        })
    }
}

impl QueryClient {
    /// A client with this retry policy and per-attempt deadline.
    pub fn new(retry: RetryPolicy, call_timeout: Duration) -> Self {
        // Installing the process-wide provider twice is harmless; whichever was first wins (both are ring).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .unwrap_or_else(|_| {
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                    rustls::ClientConfig::builder()
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth(),
                )
            })
            .https_or_http()
            .enable_http1()
            .build();
        let http = Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        Self {
            http,
            retry,
            call_timeout,
            metrics: std::sync::Arc::default(),
        }
    }

    /// The cloud API metrics of this client's requests.
    pub fn metrics(&self) -> std::sync::Arc<crate::metrics::CloudApiMetrics> {
        self.metrics.clone()
    }

    /// Calls `action` with `params`, signed with `credentials` when given (STS's AssumeRoleWithWebIdentity is
    /// unsigned); retries what may succeed on a retry.
    pub async fn call(
        &self,
        target: &Target,
        credentials: Option<&Credentials>,
        action: &str,
        params: &[(String, String)],
    ) -> Result<Answer, AwsError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let started = std::time::Instant::now();
            let result = self.call_once(target, credentials, action, params).await;
            self.metrics
                .observe(&target.service, started.elapsed(), result.is_err());
            match result {
                Err(err) if err.retryable() && attempt < self.retry.attempts => {
                    let cap = self
                        .retry
                        .base
                        .saturating_mul(1 << (attempt - 1).min(16))
                        .min(self.retry.max);
                    let sleep = cap.mul_f64(rand::rng().random_range(0.5..=1.0));
                    tracing::debug!(action, attempt, error = %err, backoff_ms = sleep.as_millis() as u64, "AWS call retried");
                    tokio::time::sleep(sleep).await;
                }
                other => return other,
            }
        }
    }

    async fn call_once(
        &self,
        target: &Target,
        credentials: Option<&Credentials>,
        action: &str,
        params: &[(String, String)],
    ) -> Result<Answer, AwsError> {
        let transport = |reason: String| AwsError::Transport {
            action: action.to_owned(),
            endpoint: target.endpoint.clone(),
            reason,
        };
        let uri: http::Uri = target
            .endpoint
            .parse()
            .map_err(|err: http::uri::InvalidUri| transport(format!("invalid endpoint: {err}")))?;
        let host = uri
            .authority()
            .map(ToString::to_string)
            .ok_or_else(|| transport("endpoint has no host".into()))?;
        let path = match uri.path() {
            "" => "/",
            p => p,
        }
        .to_owned();
        let body = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("Action", action);
            form.append_pair("Version", &target.version);
            for (k, v) in params {
                form.append_pair(k, v);
            }
            form.finish().into_bytes()
        };
        let mut builder = http::Request::post(uri.clone());
        if let Some(credentials) = credentials {
            let amz_date = jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ").to_string();
            for (name, value) in sigv4::sign_post(
                credentials,
                &target.region,
                &target.service,
                &host,
                &path,
                &body,
                &amz_date,
            ) {
                builder = builder.header(name, value);
            }
        } else {
            builder = builder.header("content-type", "application/x-www-form-urlencoded; charset=utf-8");
        }
        let request = builder
            .body(Full::new(Bytes::from(body)))
            .map_err(|err| transport(format!("building the request: {err}")))?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|err| transport(error_chain(&err)))?;
            let status = response.status().as_u16();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|err| transport(format!("reading the answer: {err}")))?
                .to_bytes();
            Ok::<_, AwsError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(self.call_timeout, exchange)
            .await
            .map_err(|_| transport(format!("no answer within {:?}", self.call_timeout)))??;
        let xml = String::from_utf8_lossy(&bytes).into_owned();
        if (200..300).contains(&status) {
            return Ok(Answer { xml });
        }
        Err(parse_error(action, status, &xml))
    }
}

/// The error of an error answer: its `Code` and `RequestID`/`RequestId`; a 5xx without XML is `HTTP<status>`.
fn parse_error(action: &str, status: u16, xml: &str) -> AwsError {
    let (code, request_id) = match roxmltree::Document::parse(xml) {
        Ok(doc) => {
            let find = |names: &[&str]| {
                doc.descendants()
                    .find(|n| names.contains(&n.tag_name().name()))
                    .and_then(|n| n.text())
                    .map(|t| t.trim().to_owned())
            };
            (find(&["Code"]), find(&["RequestID", "RequestId"]))
        }
        Err(_) => (None, None),
    };
    AwsError::Api {
        action: action.to_owned(),
        code: code.unwrap_or_else(|| format!("HTTP{status}")),
        status,
        request_id: request_id.unwrap_or_else(|| "-".into()),
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The first child element named `name`.
pub fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children()
        .find(|n| n.is_element() && n.tag_name().name() == name)
}

/// The text of the first child element named `name` (empty when absent).
pub fn text<'a>(node: roxmltree::Node<'a, '_>, name: &str) -> &'a str {
    child(node, name).and_then(|n| n.text()).unwrap_or("").trim()
}

/// The `item` children of the child element named `name`.
pub fn items<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Vec<roxmltree::Node<'a, 'i>> {
    child(node, name)
        .map(|set| {
            set.children()
                .filter(|n| n.is_element() && n.tag_name().name() == "item")
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: &str, status: u16) -> AwsError {
        AwsError::Api {
            action: "RunInstances".into(),
            code: code.into(),
            status,
            request_id: "r-1".into(),
        }
    }

    #[test]
    fn codes_map_as_the_reference() {
        for code in RESOURCE_EXHAUSTED_CODES {
            assert_eq!(
                api(code, 400).machine_code(),
                MachineCode::ResourceExhausted,
                "{code}"
            );
        }
        assert_eq!(
            api("InvalidInstanceID.NotFound", 400).machine_code(),
            MachineCode::NotFound
        );
        assert_eq!(
            api("AuthFailure", 401).machine_code(),
            MachineCode::Unauthenticated
        );
        assert_eq!(
            api("UnauthorizedOperation", 403).machine_code(),
            MachineCode::PermissionDenied
        );
        assert_eq!(
            api("RequestLimitExceeded", 503).machine_code(),
            MachineCode::Unavailable
        );
        assert_eq!(api("InternalError", 500).machine_code(), MachineCode::Unavailable);
        assert_eq!(
            api("InvalidParameterValue", 400).machine_code(),
            MachineCode::Internal
        );
    }

    #[test]
    fn error_answers_yield_code_and_request_id_only() {
        let xml = "<Response><Errors><Error><Code>InsufficientInstanceCapacity</Code>\
                   <Message>secret-looking userData echoed</Message></Error></Errors>\
                   <RequestID>abc-123</RequestID></Response>";
        let err = parse_error("RunInstances", 500, xml);
        let text = err.to_string();
        assert_eq!(
            text,
            "RunInstances: AWS error InsufficientInstanceCapacity (HTTP 500, request ID abc-123)"
        );
        assert!(!text.contains("userData"));
    }
}
