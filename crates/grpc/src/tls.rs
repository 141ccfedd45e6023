//! The TLS files of a TCP endpoint: each side's certificate and key, and the CA that signs the other side's.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// A certificate, its key and the CA of the peer (PEM files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// This side's certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA the peer's certificate must be signed by.
    pub ca: PathBuf,
}

/// A TLS file that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading the TLS file {path}: {source}")]
pub struct TlsError {
    /// The file.
    pub path: String,
    /// The cause.
    pub source: std::io::Error,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError {
        path: path.display().to_string(),
        source,
    })
}

impl TlsFiles {
    /// The server side: its identity, and client certificates required and checked against the CA.
    pub fn server_config(&self) -> Result<ServerTlsConfig, TlsError> {
        Ok(ServerTlsConfig::new()
            .identity(Identity::from_pem(read(&self.cert)?, read(&self.key)?))
            .client_ca_root(Certificate::from_pem(read(&self.ca)?)))
    }

    /// The client side: the server checked against the CA (for `domain`), and our client certificate.
    pub fn client_config(&self, domain: &str) -> Result<ClientTlsConfig, TlsError> {
        Ok(ClientTlsConfig::new()
            .domain_name(domain)
            .ca_certificate(Certificate::from_pem(read(&self.ca)?))
            .identity(Identity::from_pem(read(&self.cert)?, read(&self.key)?)))
    }
}
