//! Where a provider listens: `unix:///path/to.sock` (the default kind: a socket only its owner can reach) or
//! `tcp://host:port`, which always uses TLS with client certificates.

use std::{fmt, path::PathBuf, str::FromStr};

/// A provider endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix domain socket at this path.
    Unix(PathBuf),
    /// A TCP address (`host:port`), spoken over TLS.
    Tcp(String),
}

/// Why an endpoint string was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid provider endpoint {value:?}: {reason}")]
pub struct EndpointError {
    /// The string given.
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl FromStr for Endpoint {
    type Err = EndpointError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let error = |reason| EndpointError {
            value: value.to_owned(),
            reason,
        };
        if let Some(path) = value.strip_prefix("unix://") {
            if path.is_empty() {
                return Err(error("the socket path is empty"));
            }
            if !path.starts_with('/') {
                return Err(error("the socket path must be absolute: unix:///path/to.sock"));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        if let Some(address) = value.strip_prefix("tcp://") {
            let (host, port) = address
                .rsplit_once(':')
                .ok_or_else(|| error("a TCP endpoint needs host:port"))?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(error(
                    "a TCP endpoint needs host:port with a port from 0 to 65535",
                ));
            }
            return Ok(Self::Tcp(address.to_owned()));
        }
        Err(error("expected unix:///path/to.sock or tcp://host:port"))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix://{}", path.display()),
            Self::Tcp(address) => write!(f, "tcp://{address}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_and_tcp_endpoints_parse_and_print_back() {
        for text in [
            "unix:///run/mcm/provider.sock",
            "tcp://127.0.0.1:7000",
            "tcp://provider.example:443",
        ] {
            let endpoint: Endpoint = text.parse().unwrap();
            assert_eq!(endpoint.to_string(), text);
        }
        assert_eq!(
            "unix:///tmp/p.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/tmp/p.sock".into())
        );
    }

    #[test]
    fn bad_endpoints_say_what_is_wrong() {
        for (text, reason) in [
            ("unix://", "empty"),
            ("unix://relative.sock", "absolute"),
            ("tcp://nohost", "host:port"),
            ("tcp://:80", "host:port"),
            ("tcp://h:99999", "65535"),
            ("http://h:80", "expected"),
            ("/tmp/p.sock", "expected"),
        ] {
            let err = text.parse::<Endpoint>().unwrap_err();
            assert!(err.to_string().contains(reason), "{text}: {err}");
            assert!(err.to_string().contains(text), "{err} names the value");
        }
    }
}
