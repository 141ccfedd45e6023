//! The server's certificate authority, serving certificate, admin token and kubeconfig.
//!
//! Everything lives in the data directory and is created on the first start only, so that the kubeconfigs
//! handed out keep working across restarts: `ca.crt`/`ca.key` (the CA), `server.crt`/`server.key` (the serving
//! certificate the CA signs) and `token` (the admin bearer token). Secrets are created with mode 0600 and
//! written through a temporary file and a rename, so that a crash never leaves half a file. Neither tokens
//! nor keys ever appear in an error message or a log line.

use std::fmt::{self, Write as _};
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine;
use rand::RngCore;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber, SignatureAlgorithm,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;

use crate::{files, x509::CertificateRequest};

/// File name of the CA certificate in the data directory.
const CA_CERT_FILE: &str = "ca.crt";
/// File name of the CA private key in the data directory.
const CA_KEY_FILE: &str = "ca.key";
/// File name of the serving certificate in the data directory.
const SERVER_CERT_FILE: &str = "server.crt";
/// File name of the serving certificate's private key in the data directory.
const SERVER_KEY_FILE: &str = "server.key";
/// File name of the admin token in the data directory.
const TOKEN_FILE: &str = "token";

/// Common name of the CA certificate; also its whole subject, which issuing relies on (see [`ca_params`]).
const CA_COMMON_NAME: &str = "mcm-apiserver-ca";
/// Common name of the serving certificate.
const SERVER_COMMON_NAME: &str = "mcm-apiserver";
/// Validity of the CA and the serving certificate: ten years (with leap days).
const TEN_YEARS: Duration = Duration::from_hours(3653 * 24);
/// The longest validity a client certificate may ask for, far below the limits of X.509 dates.
const MAX_VALIDITY: Duration = Duration::from_hours(100 * 366 * 24);
/// How far back certificates start, so that a client whose clock is a little behind accepts them.
const CLOCK_SKEW: Duration = Duration::from_mins(5);

/// Mode of files holding secrets (keys, token, kubeconfig).
const SECRET_MODE: u32 = 0o600;
/// Mode of certificate files.
const PUBLIC_MODE: u32 = 0o644;

/// Why the certificates, token or kubeconfig could not be loaded, created or used.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A file or directory could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A file or directory could not be created or written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A file does not hold what it should (its content is never quoted: it may be a secret).
    #[error("{path} does not hold a valid {what}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What it should hold ("PEM certificate", "PEM private key", "token").
        what: &'static str,
    },
    /// The CA certificate exists without its key: refusing to replace a CA that clients may trust.
    #[error("{present} exists but {missing} is missing; remove both to create a new CA")]
    MissingCaKey {
        /// The CA certificate found.
        present: PathBuf,
        /// The CA key not found.
        missing: PathBuf,
    },
    /// In-memory PEM material of a [`Pki`] does not parse.
    #[error("the {0} is not valid PEM")]
    InvalidPem(&'static str),
    /// A host given for the serving certificate is neither an IP address nor a DNS name.
    #[error("invalid host {0:?} for the serving certificate: not an IP address or DNS name")]
    InvalidHost(String),
    /// A client certificate was asked for with an unusable subject or validity.
    #[error("invalid client certificate request: {0}")]
    InvalidRequest(String),
    /// rcgen refused to generate a key or certificate.
    #[error("cannot generate the {what}: {source}")]
    Generate {
        /// What was being generated.
        what: &'static str,
        /// The underlying error.
        source: rcgen::Error,
    },
    /// rustls refused the certificate, the key or the configuration.
    #[error("cannot build the TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// PEM material of the embedded server, created once per data directory and reused on every start so that
/// clients keep working across restarts.
#[derive(Clone, PartialEq, Eq)]
pub struct Pki {
    /// The CA certificate, the one clients trust (kubeconfig `certificate-authority-data`).
    pub ca_cert_pem: String,
    /// The CA private key (PKCS#8), used to sign the serving and client certificates.
    pub ca_key_pem: String,
    /// The serving certificate, signed by the CA.
    pub server_cert_pem: String,
    /// The serving certificate's private key (PKCS#8).
    pub server_key_pem: String,
}

impl fmt::Debug for Pki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pki")
            .field("ca_cert_pem", &self.ca_cert_pem)
            .field("ca_key_pem", &"<redacted>")
            .field("server_cert_pem", &self.server_cert_pem)
            .field("server_key_pem", &"<redacted>")
            .finish()
    }
}

impl Pki {
    /// Loads ca.crt, ca.key, server.crt, server.key from `dir`, or creates them when missing: a self-signed CA
    /// (CN "mcm-apiserver-ca", 10 years, isCA) and a serving certificate it signs for DNS "localhost" plus IP
    /// 127.0.0.1 and ::1 plus the extra `hosts` (IPs parsed as IP SANs, anything else as DNS names), valid 10
    /// years, key usage for server auth AND client auth. Key files are written with mode 0600, certificate
    /// files 0644. Creates `dir` if needed.
    ///
    /// An existing CA is always kept. An existing serving certificate is kept while it is signed by the CA,
    /// matches its key, is valid now and covers every host; otherwise (say a host was added) a new one is
    /// issued by the same CA, so clients keep trusting the server.
    pub fn load_or_create(dir: &Path, hosts: &[String]) -> Result<Self, PkiError> {
        create_private_dir(dir)?;
        let names = ServingNames::parse(hosts)?;

        let ca_cert_path = dir.join(CA_CERT_FILE);
        let ca_key_path = dir.join(CA_KEY_FILE);
        let (ca_cert_pem, ca_key_pem) = match (read_optional(&ca_cert_path)?, read_optional(&ca_key_path)?) {
            (Some(cert), Some(key)) => {
                if first_certificate(&cert).is_none() {
                    return Err(PkiError::Invalid {
                        path: ca_cert_path,
                        what: "PEM certificate",
                    });
                }
                if KeyPair::from_pem(&key).is_err() {
                    return Err(PkiError::Invalid {
                        path: ca_key_path,
                        what: "PEM private key",
                    });
                }
                (cert, key)
            }
            (Some(_), None) => {
                return Err(PkiError::MissingCaKey {
                    present: ca_cert_path,
                    missing: ca_key_path,
                });
            }
            // A key without its certificate is the leftover of an interrupted first start: nobody trusts it.
            (None, _) => {
                let (cert, key) = create_ca()?;
                write_atomic(&ca_key_path, key.as_bytes(), SECRET_MODE)?;
                write_atomic(&ca_cert_path, cert.as_bytes(), PUBLIC_MODE)?;
                (cert, key)
            }
        };

        let server_cert_path = dir.join(SERVER_CERT_FILE);
        let server_key_path = dir.join(SERVER_KEY_FILE);
        let existing = match (
            read_optional(&server_cert_path)?,
            read_optional(&server_key_path)?,
        ) {
            (Some(cert), Some(key)) if serving_pair_is_usable(&ca_cert_pem, &cert, &key, &names) => {
                Some((cert, key))
            }
            _ => None,
        };
        let (server_cert_pem, server_key_pem) = if let Some(pair) = existing {
            pair
        } else {
            let (cert, key) = issue_serving_certificate(&ca_key_pem, &names)?;
            write_atomic(&server_key_path, key.as_bytes(), SECRET_MODE)?;
            write_atomic(&server_cert_path, cert.as_bytes(), PUBLIC_MODE)?;
            (cert, key)
        };
        Ok(Pki {
            ca_cert_pem,
            ca_key_pem,
            server_cert_pem,
            server_key_pem,
        })
    }

    /// A rustls ServerConfig with the ring provider, ALPN "h2" then "http/1.1" (kubectl uses HTTP/2), that
    /// accepts but does not require client certificates: a client may present a certificate the CA signed for
    /// client auth (node credentials), or none and authenticate with a bearer token. A certificate the CA did not
    /// sign, or one that expired, fails the handshake.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, PkiError> {
        let ca = first_certificate(&self.ca_cert_pem).ok_or(PkiError::InvalidPem("CA certificate"))?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|err| PkiError::Tls(rustls::Error::General(err.to_string())))?;
        self.server_config_with(verifier)
    }

    /// The ServerConfig of [`Pki::server_config`] with the given client certificate verifier.
    fn server_config_with(
        &self,
        client_cert_verifier: Arc<dyn ClientCertVerifier>,
    ) -> Result<rustls::ServerConfig, PkiError> {
        let chain = CertificateDer::pem_slice_iter(self.server_cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| PkiError::InvalidPem("server certificate"))?;
        if chain.is_empty() {
            return Err(PkiError::InvalidPem("server certificate"));
        }
        let key = PrivateKeyDer::from_pem_slice(self.server_key_pem.as_bytes())
            .map_err(|_| PkiError::InvalidPem("server private key"))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(client_cert_verifier)
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    /// Signs a client certificate for `common_name` with `organizations` (O=) using the CA and a key it generates,
    /// returning (cert_pem, key_pem). Node credentials do not use it: their key stays with the node, and the CA
    /// signs the node's request instead ([`Pki::sign_client_request`]).
    ///
    /// At most two organizations are supported (rcgen keeps one value per attribute type); `valid_for` must be
    /// between one second and 100 years.
    pub fn issue_client_certificate(
        &self,
        common_name: &str,
        organizations: &[&str],
        valid_for: Duration,
    ) -> Result<(String, String), PkiError> {
        let params = client_params(common_name, organizations, valid_for)?;
        sign_leaf(&self.ca_key_pem, &params, "client certificate")
    }

    /// Signs a client certificate for the public key of a certificate request, as a Kubernetes signer does: the
    /// requester keeps its private key. The subject is the request's CN and O (at most two O), the extended key
    /// usage client auth, the key usage digital signature (plus key encipherment when `key_encipherment`), valid
    /// from a few minutes ago for `valid_for` (one second to 100 years). Returns the certificate PEM.
    ///
    /// The request must have been read with [`CertificateRequest::from_der`] (which verifies its signature);
    /// deciding whether it may be signed at all is the caller's business (see `csr`). Keys of type ECDSA P-256,
    /// P-384, Ed25519 and RSA are supported.
    pub fn sign_client_request(
        &self,
        request: &CertificateRequest,
        key_encipherment: bool,
        valid_for: Duration,
    ) -> Result<String, PkiError> {
        let common_name = request.subject.common_name().ok_or_else(|| {
            PkiError::InvalidRequest("the request needs exactly one common name".to_owned())
        })?;
        let organizations: Vec<&str> = request.subject.organizations.iter().map(String::as_str).collect();
        let mut params = client_params(common_name, &organizations, valid_for)?;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if key_encipherment {
            params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
        }
        let key = [
            &rcgen::PKCS_ECDSA_P256_SHA256,
            &rcgen::PKCS_ECDSA_P384_SHA384,
            &rcgen::PKCS_ED25519,
            &rcgen::PKCS_RSA_SHA256,
        ]
        .into_iter()
        .map(|algorithm| RequestedKey {
            algorithm,
            key: &request.public_key,
        })
        // rcgen writes the key's SubjectPublicKeyInfo from the algorithm: the one that reproduces the request's
        // exactly is the key's type.
        .find(|key| key.subject_public_key_info() == request.public_key_info)
        .ok_or_else(|| PkiError::InvalidRequest("unsupported public key algorithm".to_owned()))?;
        let ca_key =
            KeyPair::from_pem(&self.ca_key_pem).map_err(|_| PkiError::InvalidPem("CA private key"))?;
        let issuer = Issuer::new(ca_params(), ca_key);
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(|source| PkiError::Generate {
                what: "client certificate",
                source,
            })?;
        Ok(cert.pem())
    }
}

/// The public key of a certificate request, for rcgen to put into the certificate it signs.
struct RequestedKey<'a> {
    algorithm: &'static SignatureAlgorithm,
    key: &'a [u8],
}

impl PublicKeyData for RequestedKey<'_> {
    fn der_bytes(&self) -> &[u8] {
        self.key
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.algorithm
    }
}

/// The parameters of a client certificate for `common_name` with `organizations` (O=, at most two: rcgen keeps one
/// value per attribute type), extended key usage client auth, valid for `valid_for` (1 second to 100 years).
fn client_params(
    common_name: &str,
    organizations: &[&str],
    valid_for: Duration,
) -> Result<CertificateParams, PkiError> {
    if common_name.is_empty() {
        return Err(PkiError::InvalidRequest("the common name is empty".to_owned()));
    }
    if organizations.len() > 2 {
        return Err(PkiError::InvalidRequest(format!(
            "{} organizations given, at most 2 are supported",
            organizations.len()
        )));
    }
    if valid_for < Duration::from_secs(1) || valid_for > MAX_VALIDITY {
        return Err(PkiError::InvalidRequest(format!(
            "validity of {}s is outside 1s to 100 years",
            valid_for.as_secs()
        )));
    }
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, common_name);
    for (index, organization) in organizations.iter().enumerate() {
        // The second O goes in under the same OID as a custom type: rcgen keeps one value per type.
        let attribute = if index == 0 {
            DnType::OrganizationName
        } else {
            DnType::CustomDnType(vec![2, 5, 4, 10])
        };
        subject.push(attribute, *organization);
    }
    let mut params = leaf_params(subject, valid_for);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    Ok(params)
}

/// Loads the admin token from `dir/token`, or creates a random one (32 random bytes, hex) written with mode
/// 0600.
pub fn load_or_create_token(dir: &Path) -> Result<String, PkiError> {
    create_private_dir(dir)?;
    let path = dir.join(TOKEN_FILE);
    if let Some(content) = read_optional(&path)? {
        let token = content.trim();
        if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(PkiError::Invalid { path, what: "token" });
        }
        return Ok(token.to_owned());
    }
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let token = bytes.iter().fold(String::with_capacity(64), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    });
    write_atomic(&path, format!("{token}\n").as_bytes(), SECRET_MODE)?;
    Ok(token)
}

/// Writes a kubeconfig (YAML, mode 0600, via a temp file + rename so readers never see half a file) with one
/// cluster "mcm" (server URL, certificate-authority-data = base64 of the CA PEM), one user "admin" (token),
/// one context "mcm" with namespace "default", current-context "mcm". kubectl 1.32 and kube-rs both accept it.
pub fn write_kubeconfig(
    path: &Path,
    server_url: &str,
    ca_cert_pem: &str,
    token: &str,
) -> Result<(), PkiError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_private_dir(parent)?;
    }
    let ca_data = base64::engine::general_purpose::STANDARD.encode(ca_cert_pem);
    let kubeconfig = format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: mcm\n\
         \x20 cluster:\n\
         \x20   server: {server}\n\
         \x20   certificate-authority-data: {ca}\n\
         users:\n\
         - name: admin\n\
         \x20 user:\n\
         \x20   token: {token}\n\
         contexts:\n\
         - name: mcm\n\
         \x20 context:\n\
         \x20   cluster: mcm\n\
         \x20   user: admin\n\
         \x20   namespace: default\n\
         current-context: mcm\n\
         preferences: {{}}\n",
        server = yaml_string(server_url),
        ca = yaml_string(&ca_data),
        token = yaml_string(token),
    );
    write_atomic(path, kubeconfig.as_bytes(), SECRET_MODE)
}

/// A YAML double-quoted scalar: JSON string escapes are valid YAML escapes.
fn yaml_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// The ring crypto provider, named explicitly rather than taken from the process default.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The names the serving certificate covers: localhost, 127.0.0.1, ::1 and the extra hosts.
struct ServingNames {
    /// For the certificate.
    sans: Vec<SanType>,
    /// For checking an existing certificate.
    server_names: Vec<ServerName<'static>>,
}

impl ServingNames {
    fn parse(hosts: &[String]) -> Result<Self, PkiError> {
        let mut names = ServingNames {
            sans: vec![
                dns_san("localhost")?,
                SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
                SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            ],
            server_names: vec![
                ServerName::try_from("localhost")
                    .map_err(|_| PkiError::InvalidHost("localhost".to_owned()))?,
                ServerName::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST).into()),
                ServerName::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST).into()),
            ],
        };
        for host in hosts {
            let host = host.trim();
            if host.is_empty() {
                continue;
            }
            let unbracketed = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            let (san, server_name) = if let Ok(ip) = unbracketed.parse::<IpAddr>() {
                (SanType::IpAddress(ip), ServerName::IpAddress(ip.into()))
            } else {
                let name = host.to_ascii_lowercase();
                let server_name =
                    ServerName::try_from(name.clone()).map_err(|_| PkiError::InvalidHost(host.to_owned()))?;
                (dns_san(&name)?, server_name)
            };
            if !names.sans.contains(&san) {
                names.sans.push(san);
                names.server_names.push(server_name);
            }
        }
        Ok(names)
    }
}

/// A DNS subject alternative name.
fn dns_san(name: &str) -> Result<SanType, PkiError> {
    let name = name
        .try_into()
        .map_err(|_| PkiError::InvalidHost(name.to_owned()))?;
    Ok(SanType::DnsName(name))
}

/// The parameters of the CA certificate. Issuing rebuilds them to name the issuer, so the subject must stay
/// exactly this (rcgen cannot read a subject back from a certificate without its x509-parser feature).
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, CA_COMMON_NAME);
    params.distinguished_name = subject;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// Creates the CA: a new key and a self-signed certificate valid ten years. Returns (cert PEM, key PEM).
fn create_ca() -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(|source| PkiError::Generate {
        what: "CA key",
        source,
    })?;
    let mut params = ca_params();
    set_validity(&mut params, TEN_YEARS);
    params.serial_number = Some(random_serial());
    let cert = params.self_signed(&key).map_err(|source| PkiError::Generate {
        what: "CA certificate",
        source,
    })?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Parameters of a certificate the CA signs, valid from a little before now for `valid_for`.
fn leaf_params(subject: DistinguishedName, valid_for: Duration) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = subject;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial());
    set_validity(&mut params, valid_for);
    params
}

/// Sets not-before a little in the past and not-after `valid_for` from now.
fn set_validity(params: &mut CertificateParams, valid_for: Duration) {
    let now = SystemTime::now();
    params.not_before = now.checked_sub(CLOCK_SKEW).unwrap_or(now).into();
    params.not_after = now.checked_add(valid_for).unwrap_or(now).into();
}

/// A random positive serial number of 16 bytes.
fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

/// Signs a certificate with a new key by the CA. Returns (cert PEM, key PEM).
fn sign_leaf(
    ca_key_pem: &str,
    params: &CertificateParams,
    what: &'static str,
) -> Result<(String, String), PkiError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(|_| PkiError::InvalidPem("CA private key"))?;
    let issuer = Issuer::new(ca_params(), ca_key);
    let key = KeyPair::generate().map_err(|source| PkiError::Generate {
        what: "private key",
        source,
    })?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|source| PkiError::Generate { what, source })?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Issues the serving certificate for these names, for server and client auth, valid ten years.
fn issue_serving_certificate(ca_key_pem: &str, names: &ServingNames) -> Result<(String, String), PkiError> {
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, SERVER_COMMON_NAME);
    let mut params = leaf_params(subject, TEN_YEARS);
    params.subject_alt_names.clone_from(&names.sans);
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    sign_leaf(ca_key_pem, &params, "serving certificate")
}

/// The first certificate of a PEM text, None when there is none or it does not parse.
fn first_certificate(pem: &str) -> Option<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).next()?.ok()
}

/// True when an existing serving certificate can be kept: it matches its key, and the CA's verifier accepts it
/// now for every name.
fn serving_pair_is_usable(ca_cert_pem: &str, cert_pem: &str, key_pem: &str, names: &ServingNames) -> bool {
    let (Some(ca), Some(cert)) = (first_certificate(ca_cert_pem), first_certificate(cert_pem)) else {
        return false;
    };
    let Ok(key) = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()) else {
        return false;
    };
    let provider = provider();
    if rustls::sign::CertifiedKey::from_der(vec![cert.clone()], key, &provider).is_err() {
        return false;
    }
    let mut roots = rustls::RootCertStore::empty();
    if roots.add(ca).is_err() {
        return false;
    }
    let Ok(verifier) =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build()
    else {
        return false;
    };
    let now = UnixTime::now();
    names
        .server_names
        .iter()
        .all(|name| verifier.verify_server_cert(&cert, &[], name, &[], now).is_ok())
}

/// Creates a directory (and its parents) with mode 0700 when missing.
fn create_private_dir(dir: &Path) -> Result<(), PkiError> {
    files::create_private_dir(dir).map_err(|source| PkiError::Write {
        path: dir.to_owned(),
        source,
    })
}

/// Reads a UTF-8 file, None when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, PkiError> {
    match fs::read_to_string(path) {
        Ok(content) => Ok(Some(content)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PkiError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Writes a file atomically with `mode` (see [`files::write_atomic`]).
fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), PkiError> {
    files::write_atomic(path, contents, mode).map_err(|source| PkiError::Write {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("mcm-pki-{name}-{}-{n}", std::process::id()));
            let _ = fs::remove_dir_all(&path);
            TempDir(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    fn roots(pki: &Pki) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(first_certificate(&pki.ca_cert_pem).unwrap()).unwrap();
        Arc::new(roots)
    }

    fn verify_server(pki: &Pki, name: &str) -> Result<(), rustls::Error> {
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots(pki), provider())
            .build()
            .unwrap();
        let cert = first_certificate(&pki.server_cert_pem).unwrap();
        let name = ServerName::try_from(name.to_owned()).unwrap();
        verifier
            .verify_server_cert(&cert, &[], &name, &[], UnixTime::now())
            .map(|_| ())
    }

    fn verify_client(pki: &Pki, cert_pem: &str) -> Result<(), rustls::Error> {
        let verifier = WebPkiClientVerifier::builder_with_provider(roots(pki), provider())
            .build()
            .unwrap();
        let cert = first_certificate(cert_pem).unwrap();
        verifier
            .verify_client_cert(&cert, &[], UnixTime::now())
            .map(|_| ())
    }

    /// True when the DER holds the attribute `oid_last` (2.5.4.x) as a UTF8String with this value.
    fn has_attribute(der: &[u8], oid_last: u8, value: &str) -> bool {
        let mut needle = vec![
            0x06,
            0x03,
            0x55,
            0x04,
            oid_last,
            0x0c,
            u8::try_from(value.len()).unwrap(),
        ];
        needle.extend_from_slice(value.as_bytes());
        der.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn created_once_then_loaded_unchanged() {
        let dir = TempDir::new("reload");
        let hosts = vec!["10.1.2.3".to_owned(), "api.example.test".to_owned()];
        let first = Pki::load_or_create(&dir.0, &hosts).unwrap();
        let second = Pki::load_or_create(&dir.0, &hosts).unwrap();
        assert_eq!(first, second);
        for file in [CA_CERT_FILE, CA_KEY_FILE, SERVER_CERT_FILE, SERVER_KEY_FILE] {
            assert!(dir.0.join(file).is_file(), "{file}");
        }
        assert_eq!(
            fs::read_to_string(dir.0.join(CA_KEY_FILE)).unwrap(),
            first.ca_key_pem
        );
        assert!(first.ca_cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(first.server_key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        // No temporary files left behind.
        let names: Vec<String> = fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
    }

    #[cfg(unix)]
    #[test]
    fn keys_are_private_and_certificates_public() {
        let dir = TempDir::new("modes");
        Pki::load_or_create(&dir.0, &[]).unwrap();
        assert_eq!(mode(&dir.0.join(CA_KEY_FILE)), 0o600);
        assert_eq!(mode(&dir.0.join(SERVER_KEY_FILE)), 0o600);
        for file in [CA_CERT_FILE, SERVER_CERT_FILE] {
            // 0644 as created, less whatever the umask removes; never writable by others.
            let m = mode(&dir.0.join(file));
            assert_eq!(m & !0o644, 0, "{file}: {m:o}");
            assert_ne!(m & 0o400, 0, "{file}: {m:o}");
        }
        assert_eq!(mode(&dir.0) & 0o077, 0, "the data directory is created private");
    }

    #[test]
    fn serving_certificate_verifies_for_its_names() {
        let dir = TempDir::new("verify");
        let hosts = vec![
            "192.168.1.10".to_owned(),
            "Node-A.example.test".to_owned(),
            "[fd00::1]".to_owned(),
        ];
        let pki = Pki::load_or_create(&dir.0, &hosts).unwrap();
        for name in [
            "localhost",
            "127.0.0.1",
            "::1",
            "192.168.1.10",
            "node-a.example.test",
            "fd00::1",
        ] {
            verify_server(&pki, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for name in ["example.test", "10.0.0.1"] {
            assert!(verify_server(&pki, name).is_err(), "{name} must not be covered");
        }
        // Usable for client auth too.
        verify_client(&pki, &pki.server_cert_pem).unwrap();
        // And it is a certificate for the server, not a CA.
        let other = TempDir::new("verify-other");
        let unrelated = Pki::load_or_create(&other.0, &[]).unwrap();
        assert!(
            verify_server(
                &Pki {
                    ca_cert_pem: unrelated.ca_cert_pem,
                    ..pki
                },
                "localhost"
            )
            .is_err()
        );
    }

    #[test]
    fn new_hosts_get_a_new_serving_certificate_from_the_same_ca() {
        let dir = TempDir::new("hosts");
        let first = Pki::load_or_create(&dir.0, &[]).unwrap();
        let second = Pki::load_or_create(&dir.0, &["10.9.9.9".to_owned()]).unwrap();
        assert_eq!(first.ca_cert_pem, second.ca_cert_pem);
        assert_eq!(first.ca_key_pem, second.ca_key_pem);
        assert_ne!(first.server_cert_pem, second.server_cert_pem);
        verify_server(&second, "10.9.9.9").unwrap();
        // A certificate that covers more than asked is kept.
        let third = Pki::load_or_create(&dir.0, &[]).unwrap();
        assert_eq!(second, third);
    }

    #[test]
    fn broken_or_partial_material() {
        let dir = TempDir::new("broken");
        let pki = Pki::load_or_create(&dir.0, &[]).unwrap();
        // A damaged server key is replaced, the CA is kept.
        fs::write(dir.0.join(SERVER_KEY_FILE), "garbage").unwrap();
        let repaired = Pki::load_or_create(&dir.0, &[]).unwrap();
        assert_eq!(repaired.ca_cert_pem, pki.ca_cert_pem);
        assert_ne!(repaired.server_key_pem, pki.server_key_pem);
        verify_server(&repaired, "localhost").unwrap();
        // A damaged CA key is an error naming the file.
        fs::write(dir.0.join(CA_KEY_FILE), "garbage").unwrap();
        let error = Pki::load_or_create(&dir.0, &[]).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("ca.key does not hold a valid PEM private key"),
            "{error}"
        );
        assert!(!error.to_string().contains("garbage"));
        // A CA certificate without its key is never silently replaced.
        fs::remove_file(dir.0.join(CA_KEY_FILE)).unwrap();
        let error = Pki::load_or_create(&dir.0, &[]).unwrap_err();
        assert!(matches!(error, PkiError::MissingCaKey { .. }), "{error:?}");
        // Invalid hosts are refused.
        let error = Pki::load_or_create(&dir.0, &["bad host!".to_owned()]).unwrap_err();
        assert!(
            matches!(error, PkiError::InvalidHost(ref h) if h == "bad host!"),
            "{error:?}"
        );
    }

    #[test]
    fn server_config_speaks_h2_and_http1() {
        let dir = TempDir::new("config");
        let pki = Pki::load_or_create(&dir.0, &[]).unwrap();
        let config = pki.server_config().unwrap();
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
        let mismatched = Pki {
            server_key_pem: pki.ca_key_pem.clone(),
            ..pki.clone()
        };
        assert!(matches!(mismatched.server_config(), Err(PkiError::Tls(_))));
        let garbage = Pki {
            server_cert_pem: "nope".to_owned(),
            ..pki
        };
        assert!(matches!(
            garbage.server_config(),
            Err(PkiError::InvalidPem("server certificate"))
        ));
    }

    #[test]
    fn tls_handshake_with_a_client_trusting_the_ca_negotiates_h2() {
        let dir = TempDir::new("handshake");
        let pki = Pki::load_or_create(&dir.0, &[]).unwrap();
        let mut client_config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots(&pki))
            .with_no_client_auth();
        client_config.alpn_protocols = vec![b"h2".to_vec()];
        let name = ServerName::try_from("localhost").unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client_config), name).unwrap();
        let mut server = rustls::ServerConnection::new(Arc::new(pki.server_config().unwrap())).unwrap();
        for _ in 0..10 {
            if !client.is_handshaking() && !server.is_handshaking() {
                break;
            }
            let mut bytes = Vec::new();
            client.write_tls(&mut bytes).unwrap();
            server.read_tls(&mut bytes.as_slice()).unwrap();
            server.process_new_packets().unwrap();
            let mut bytes = Vec::new();
            server.write_tls(&mut bytes).unwrap();
            client.read_tls(&mut bytes.as_slice()).unwrap();
            client.process_new_packets().unwrap();
        }
        assert!(!client.is_handshaking() && !server.is_handshaking());
        assert_eq!(server.alpn_protocol(), Some(&b"h2"[..]));
        assert_eq!(client.alpn_protocol(), Some(&b"h2"[..]));
    }

    #[test]
    fn debug_output_hides_keys() {
        let dir = TempDir::new("debug");
        let pki = Pki::load_or_create(&dir.0, &[]).unwrap();
        let debug = format!("{pki:?}");
        assert!(!debug.contains("PRIVATE KEY"), "{debug}");
        assert!(debug.contains("BEGIN CERTIFICATE"));
    }

    #[test]
    fn client_certificate_carries_cn_and_o_and_verifies() {
        let dir = TempDir::new("client");
        Pki::load_or_create(&dir.0, &[]).unwrap();
        // Issue from a reloaded Pki, as a later start would.
        let pki = Pki::load_or_create(&dir.0, &[]).unwrap();
        let (cert_pem, key_pem) = pki
            .issue_client_certificate("system:node:n1", &["system:nodes"], Duration::from_hours(1))
            .unwrap();
        assert!(key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let der = first_certificate(&cert_pem).unwrap();
        assert!(has_attribute(&der, 3, "system:node:n1"), "CN");
        assert!(has_attribute(&der, 10, "system:nodes"), "O");
        verify_client(&pki, &cert_pem).unwrap();
        // Client-only: not a serving certificate.
        let as_server = Pki {
            server_cert_pem: cert_pem,
            ..pki.clone()
        };
        assert!(verify_server(&as_server, "localhost").is_err());

        let (two, _) = pki
            .issue_client_certificate("admin", &["system:masters", "mcm:admins"], Duration::from_mins(1))
            .unwrap();
        let der = first_certificate(&two).unwrap();
        assert!(has_attribute(&der, 10, "system:masters") && has_attribute(&der, 10, "mcm:admins"));
        verify_client(&pki, &two).unwrap();
    }

    #[test]
    fn client_certificate_requests_are_checked() {
        let dir = TempDir::new("client-bad");
        let pki = Pki::load_or_create(&dir.0, &[]).unwrap();
        let day = Duration::from_hours(24);
        assert!(matches!(
            pki.issue_client_certificate("", &[], day),
            Err(PkiError::InvalidRequest(_))
        ));
        assert!(matches!(
            pki.issue_client_certificate("a", &["x", "y", "z"], day),
            Err(PkiError::InvalidRequest(_))
        ));
        assert!(matches!(
            pki.issue_client_certificate("a", &[], Duration::ZERO),
            Err(PkiError::InvalidRequest(_))
        ));
        assert!(matches!(
            pki.issue_client_certificate("a", &[], Duration::MAX),
            Err(PkiError::InvalidRequest(_))
        ));
    }

    /// A certificate request of a fresh key for this subject; returns the parsed request and the key.
    fn node_request(common_name: &str, organization: &str) -> (CertificateRequest, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, common_name);
        subject.push(DnType::OrganizationName, organization);
        params.distinguished_name = subject;
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        (CertificateRequest::from_pem(pem.as_bytes()).unwrap(), key)
    }

    #[test]
    fn a_signed_request_carries_the_requesters_key_and_subject_and_verifies() {
        let dir = TempDir::new("sign-request");
        let pki = Pki::load_or_create(&dir.0, &[]).unwrap();
        let (request, key) = node_request("system:node:n1", "system:nodes");
        let cert_pem = pki
            .sign_client_request(&request, false, Duration::from_hours(1))
            .unwrap();
        let der = first_certificate(&cert_pem).unwrap();
        assert!(has_attribute(&der, 3, "system:node:n1"), "CN");
        assert!(has_attribute(&der, 10, "system:nodes"), "O");
        let spki = key.subject_public_key_info();
        assert!(
            der.windows(spki.len()).any(|w| w == spki.as_slice()),
            "the certificate holds the requester's public key"
        );
        verify_client(&pki, &cert_pem).unwrap();
        // rustls accepts the pair as a client identity: certificate and the key only the requester has.
        let key_der = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
        rustls::sign::CertifiedKey::from_der(vec![der], key_der, &provider()).unwrap();

        let too_long = pki.sign_client_request(&request, true, Duration::MAX);
        assert!(matches!(too_long, Err(PkiError::InvalidRequest(_))));
    }

    /// Runs a handshake in memory; returns the server side when it completes.
    fn handshake(
        client_config: rustls::ClientConfig,
        server_config: rustls::ServerConfig,
    ) -> Result<rustls::ServerConnection, rustls::Error> {
        let name = ServerName::try_from("localhost").unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client_config), name)?;
        let mut server = rustls::ServerConnection::new(Arc::new(server_config))?;
        for _ in 0..10 {
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(server);
            }
            let mut bytes = Vec::new();
            client.write_tls(&mut bytes).unwrap();
            server.read_tls(&mut bytes.as_slice()).unwrap();
            server.process_new_packets()?;
            let mut bytes = Vec::new();
            server.write_tls(&mut bytes).unwrap();
            client.read_tls(&mut bytes.as_slice()).unwrap();
            client.process_new_packets()?;
        }
        Err(rustls::Error::General("the handshake did not finish".into()))
    }

    fn client_with_certificate(pki: &Pki, cert_pem: &str, key_pem: &str) -> rustls::ClientConfig {
        let chain = vec![first_certificate(cert_pem).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots(pki))
            .with_client_auth_cert(chain, key)
            .unwrap()
    }

    #[test]
    fn the_server_accepts_client_certificates_of_its_ca_and_refuses_others() {
        let dir = TempDir::new("mtls");
        let pki = Pki::load_or_create(&dir.0, &[]).unwrap();
        let (request, key) = node_request("system:node:n1", "system:nodes");
        let cert_pem = pki
            .sign_client_request(&request, false, Duration::from_hours(1))
            .unwrap();
        let server = handshake(
            client_with_certificate(&pki, &cert_pem, &key.serialize_pem()),
            pki.server_config().unwrap(),
        )
        .unwrap();
        let presented = server
            .peer_certificates()
            .expect("the client certificate is seen");
        assert_eq!(presented[0], first_certificate(&cert_pem).unwrap());

        // A certificate from another CA fails the handshake.
        let other_dir = TempDir::new("mtls-other");
        let other = Pki::load_or_create(&other_dir.0, &[]).unwrap();
        let (foreign, foreign_key) = other
            .issue_client_certificate("system:node:n1", &["system:nodes"], Duration::from_hours(1))
            .unwrap();
        let refused = handshake(
            client_with_certificate(&pki, &foreign, &foreign_key),
            pki.server_config().unwrap(),
        );
        assert!(refused.is_err());
    }

    #[test]
    fn token_is_created_once_private_and_random() {
        let dir = TempDir::new("token");
        let token = load_or_create_token(&dir.0).unwrap();
        assert_eq!(token.len(), 64);
        assert!(token.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(load_or_create_token(&dir.0).unwrap(), token);
        #[cfg(unix)]
        assert_eq!(mode(&dir.0.join(TOKEN_FILE)), 0o600);
        let other = TempDir::new("token-other");
        assert_ne!(load_or_create_token(&other.0).unwrap(), token);
        fs::write(dir.0.join(TOKEN_FILE), " \n").unwrap();
        let error = load_or_create_token(&dir.0).unwrap_err();
        assert!(
            matches!(error, PkiError::Invalid { what: "token", .. }),
            "{error:?}"
        );
    }

    #[test]
    fn kubeconfig_has_the_expected_fields() {
        let dir = TempDir::new("kubeconfig");
        let pki = Pki::load_or_create(&dir.0, &[]).unwrap();
        let token = load_or_create_token(&dir.0).unwrap();
        let path = dir.0.join("nested").join("kubeconfig");
        write_kubeconfig(&path, "https://127.0.0.1:6443", &pki.ca_cert_pem, &token).unwrap();
        #[cfg(unix)]
        assert_eq!(mode(&path), 0o600);
        let text = fs::read_to_string(&path).unwrap();
        let config: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(config["apiVersion"], "v1");
        assert_eq!(config["kind"], "Config");
        assert_eq!(config["current-context"], "mcm");
        assert_eq!(config["clusters"][0]["name"], "mcm");
        assert_eq!(
            config["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:6443"
        );
        let ca_data = config["clusters"][0]["cluster"]["certificate-authority-data"]
            .as_str()
            .unwrap();
        let ca = base64::engine::general_purpose::STANDARD.decode(ca_data).unwrap();
        assert_eq!(String::from_utf8(ca).unwrap(), pki.ca_cert_pem);
        assert_eq!(config["users"][0]["name"], "admin");
        assert_eq!(config["users"][0]["user"]["token"], token.as_str());
        assert_eq!(config["contexts"][0]["name"], "mcm");
        assert_eq!(
            config["contexts"][0]["context"],
            serde_json::json!({
                "cluster": "mcm", "user": "admin", "namespace": "default"
            })
        );
        // kube-rs reads it as a kubeconfig.
        let kubeconfig: kube::config::Kubeconfig = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(kubeconfig.current_context.as_deref(), Some("mcm"));

        // Rewriting replaces it whole, and odd characters survive the quoting.
        write_kubeconfig(&path, "https://[::1]:6443/a#b: c", &pki.ca_cert_pem, "t\"k'n").unwrap();
        let config: serde_json::Value = serde_saphyr::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            config["clusters"][0]["cluster"]["server"],
            "https://[::1]:6443/a#b: c"
        );
        assert_eq!(config["users"][0]["user"]["token"], "t\"k'n");
        assert_eq!(
            fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }
}
