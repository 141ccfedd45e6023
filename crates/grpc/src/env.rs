//! The `MC_` environment variables of a provider process (spec 000 "Configuration and Operation": variables defined
//! by the specification carry the `MC_` prefix; the supervisor SHALL supply the REQUIRED ones; a misconfigured
//! provider SHOULD fail fast). `mcm up` and the sidecar manifest supply them.
//!
//! | variable | required | meaning |
//! |---|---|---|
//! | `MC_ENDPOINT` | REQUIRED | where to serve: `unix:///path/to.sock` or `tcp://host:port` |
//! | `MC_TLS_CERT_FILE` | REQUIRED for `tcp://` | the provider's certificate (PEM) |
//! | `MC_TLS_KEY_FILE` | REQUIRED for `tcp://` | its private key (PEM) |
//! | `MC_TLS_CLIENT_CA_FILE` | REQUIRED for `tcp://` | the CA that signs the controllers' client certificates |
//! | `MC_LOG_FORMAT` | RECOMMENDED | `text` (default) or `json`, on standard error |
//! | `MC_LOG_LEVEL` | RECOMMENDED | `error`, `warn`, `info` (default), `debug` or `trace` |

use std::path::PathBuf;

use crate::{Endpoint, TlsFiles};

/// The variables, with whether they are required and what they mean (for `--help` and the docs).
pub const VARIABLES: [(&str, &str, &str); 6] = [
    (
        "MC_ENDPOINT",
        "REQUIRED",
        "where to serve: unix:///path/to.sock or tcp://host:port",
    ),
    (
        "MC_TLS_CERT_FILE",
        "REQUIRED for tcp://",
        "the provider's certificate (PEM)",
    ),
    ("MC_TLS_KEY_FILE", "REQUIRED for tcp://", "its private key (PEM)"),
    (
        "MC_TLS_CLIENT_CA_FILE",
        "REQUIRED for tcp://",
        "the CA that signs the controllers' client certificates (PEM)",
    ),
    (
        "MC_LOG_FORMAT",
        "RECOMMENDED",
        "text (default) or json, on standard error",
    ),
    (
        "MC_LOG_LEVEL",
        "RECOMMENDED",
        "error, warn, info (default), debug or trace",
    ),
];

/// A provider's configuration from its environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderEnv {
    /// `MC_ENDPOINT`.
    pub endpoint: Endpoint,
    /// The TLS files (TCP endpoints only).
    pub tls: Option<TlsFiles>,
    /// `MC_LOG_FORMAT` is `json`.
    pub log_json: bool,
    /// `MC_LOG_LEVEL`.
    pub log_level: String,
}

/// A missing or invalid variable, named.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {reason}")]
pub struct EnvError {
    /// The variable.
    pub variable: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl ProviderEnv {
    /// Reads the variables through `lookup` (the process environment in [`ProviderEnv::from_env`]).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let endpoint = get("MC_ENDPOINT")
            .ok_or_else(|| EnvError {
                variable: "MC_ENDPOINT",
                reason: "is required (e.g. unix:///run/mcm/provider.sock)".into(),
            })?
            .parse::<Endpoint>()
            .map_err(|err| EnvError {
                variable: "MC_ENDPOINT",
                reason: err.to_string(),
            })?;
        let tls = match endpoint {
            Endpoint::Unix(_) => None,
            Endpoint::Tcp(_) => {
                let file = |variable: &'static str| {
                    get(variable).map(PathBuf::from).ok_or_else(|| EnvError {
                        variable,
                        reason: "is required with a tcp:// MC_ENDPOINT (TCP is always TLS with client certificates)"
                            .into(),
                    })
                };
                Some(TlsFiles {
                    cert: file("MC_TLS_CERT_FILE")?,
                    key: file("MC_TLS_KEY_FILE")?,
                    ca: file("MC_TLS_CLIENT_CA_FILE")?,
                })
            }
        };
        let log_json = match get("MC_LOG_FORMAT").as_deref() {
            None | Some("text") => false,
            Some("json") => true,
            Some(other) => {
                return Err(EnvError {
                    variable: "MC_LOG_FORMAT",
                    reason: format!("must be text or json, not {other:?}"),
                });
            }
        };
        let log_level = get("MC_LOG_LEVEL").unwrap_or_else(|| "info".into());
        if !["error", "warn", "info", "debug", "trace"].contains(&log_level.as_str()) {
            return Err(EnvError {
                variable: "MC_LOG_LEVEL",
                reason: format!("must be error, warn, info, debug or trace, not {log_level:?}"),
            });
        }
        Ok(Self {
            endpoint,
            tls,
            log_json,
            log_level,
        })
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Self, EnvError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<ProviderEnv, EnvError> {
        let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        ProviderEnv::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn the_endpoint_is_required_and_a_unix_socket_needs_nothing_else() {
        assert_eq!(env(&[]).unwrap_err().variable, "MC_ENDPOINT");
        let ok = env(&[("MC_ENDPOINT", "unix:///run/p.sock")]).unwrap();
        assert_eq!(ok.endpoint, Endpoint::Unix("/run/p.sock".into()));
        assert_eq!(
            (ok.tls, ok.log_json, ok.log_level.as_str()),
            (None, false, "info")
        );
    }

    #[test]
    fn tcp_requires_the_three_tls_files() {
        let err = env(&[("MC_ENDPOINT", "tcp://0.0.0.0:7000")]).unwrap_err();
        assert_eq!(err.variable, "MC_TLS_CERT_FILE");
        let err = env(&[
            ("MC_ENDPOINT", "tcp://0.0.0.0:7000"),
            ("MC_TLS_CERT_FILE", "/c"),
            ("MC_TLS_KEY_FILE", "/k"),
        ])
        .unwrap_err();
        assert_eq!(err.variable, "MC_TLS_CLIENT_CA_FILE");
        let ok = env(&[
            ("MC_ENDPOINT", "tcp://0.0.0.0:7000"),
            ("MC_TLS_CERT_FILE", "/c"),
            ("MC_TLS_KEY_FILE", "/k"),
            ("MC_TLS_CLIENT_CA_FILE", "/ca"),
        ])
        .unwrap();
        assert_eq!(ok.tls.unwrap().ca, PathBuf::from("/ca"));
    }

    #[test]
    fn invalid_values_name_the_variable() {
        assert_eq!(
            env(&[("MC_ENDPOINT", "/p.sock")]).unwrap_err().variable,
            "MC_ENDPOINT"
        );
        let err = env(&[("MC_ENDPOINT", "unix:///p.sock"), ("MC_LOG_FORMAT", "xml")]).unwrap_err();
        assert_eq!(err.variable, "MC_LOG_FORMAT");
        assert!(err.to_string().contains("xml"));
        let err = env(&[("MC_ENDPOINT", "unix:///p.sock"), ("MC_LOG_LEVEL", "loud")]).unwrap_err();
        assert_eq!(err.variable, "MC_LOG_LEVEL");
    }
}
