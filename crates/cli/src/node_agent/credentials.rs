//! The node's credentials on disk (`pki/client.pem`, `pki/ca.crt`, mode 0600, written through a rename), and the
//! PEM and DER reading that decides whether a saved certificate can be reused.

use std::{os::unix::fs::PermissionsExt as _, path::Path, time::Duration};

use base64::Engine as _;
use k8s_openapi::jiff::Timestamp;
use mcm_apiserver::{
    files::{create_private_dir, write_atomic},
    x509::certificate_facts,
};

use super::settings::Settings;

/// The directory of the saved credentials in `--machine-dir`.
pub(super) const PKI_DIR: &str = "pki";
/// The key and client certificate, in the credentials directory.
pub(super) const CLIENT_PEM: &str = "client.pem";
/// The CA the certificate was obtained under, in the credentials directory.
pub(super) const CA_PEM: &str = "ca.crt";
/// The mode of the credential files: the owner's alone.
const PRIVATE_MODE: u32 = 0o600;
/// A saved certificate is reused only while it is valid for at least this long.
const MIN_REMAINING_VALIDITY: Duration = Duration::from_mins(1);

/// The node's key and certificate.
pub(super) struct Credentials {
    pub(super) key_pem: String,
    pub(super) cert_pem: String,
    pub(super) not_after: Timestamp,
}

/// The saved credentials when they can be reused (see the module doc); else why not.
pub(super) fn load_credentials(pki: &Path, settings: &Settings) -> Result<Credentials, String> {
    let path = pki.join(CLIENT_PEM);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Err("none saved".into()),
        Err(err) => return Err(format!("cannot read {}: {err}", path.display())),
    };
    let saved_ca = std::fs::read_to_string(pki.join(CA_PEM)).unwrap_or_default();
    if saved_ca.trim() != settings.ca_pem.trim() {
        return Err("it was issued under another CA than --ca-file's".into());
    }
    let blocks = pem_blocks(&text);
    let cert_pem = blocks
        .iter()
        .find(|(label, _)| label == "CERTIFICATE")
        .map(|(_, der)| to_pem("CERTIFICATE", der))
        .ok_or("the file holds no certificate")?;
    let key_pem = blocks
        .iter()
        .find(|(label, _)| label.ends_with("PRIVATE KEY"))
        .map(|(label, der)| to_pem(label, der))
        .ok_or("the file holds no private key")?;
    let certificate = certificate_of(&cert_pem)?;
    let expected = format!("system:node:{}", settings.node_name);
    if certificate.common_name.as_deref() != Some(expected.as_str()) {
        return Err(format!("it is not for {expected}"));
    }
    let key = rcgen::KeyPair::from_pem(&key_pem).map_err(|_| "the private key is unreadable")?;
    if rcgen::PublicKeyData::subject_public_key_info(&key) != certificate.public_key_info {
        return Err("the certificate does not match the private key".into());
    }
    let left = certificate.not_after.duration_since(Timestamp::now());
    if left.as_secs() < i64::try_from(MIN_REMAINING_VALIDITY.as_secs()).unwrap_or(i64::MAX) {
        return Err(format!(
            "it expired (or expires within a minute) at {}",
            certificate.not_after
        ));
    }
    Ok(Credentials {
        key_pem,
        cert_pem,
        not_after: certificate.not_after,
    })
}

/// Writes `pki/client.pem` (key, then certificate) and `pki/ca.crt`, mode 0600, each through a rename.
pub(super) fn save_credentials(pki: &Path, credentials: &Credentials, ca_pem: &str) -> std::io::Result<()> {
    create_private_dir(pki)?;
    std::fs::set_permissions(pki, std::fs::Permissions::from_mode(0o700))?;
    // The CA first: a crash between the two writes leaves a certificate that is not reused, never a wrong one.
    write_atomic(&pki.join(CA_PEM), ca_pem.as_bytes(), PRIVATE_MODE)?;
    let mut both = credentials.key_pem.clone();
    if !both.ends_with('\n') {
        both.push('\n');
    }
    both.push_str(&credentials.cert_pem);
    write_atomic(&pki.join(CLIENT_PEM), both.as_bytes(), PRIVATE_MODE)
}

/// The PEM blocks of a text: label and DER.
pub(super) fn pem_blocks(text: &str) -> Vec<(String, Vec<u8>)> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        let Some(label) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
        else {
            continue;
        };
        let end = format!("-----END {label}-----");
        let mut body = String::new();
        let mut closed = false;
        for line in lines.by_ref() {
            if line == end {
                closed = true;
                break;
            }
            body.push_str(line);
        }
        if let (true, Ok(der)) = (closed, base64::engine::general_purpose::STANDARD.decode(body)) {
            blocks.push((label.to_owned(), der));
        }
    }
    blocks
}

pub(super) fn to_pem(label: &str, der: &[u8]) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = format!("-----BEGIN {label}-----\n");
    for chunk in encoded.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(chunk));
        pem.push('\n');
    }
    pem.push_str("-----END ");
    pem.push_str(label);
    pem.push_str("-----\n");
    pem
}

/// What the agent needs to know of its certificate.
pub(super) struct CertificateInfo {
    pub(super) common_name: Option<String>,
    pub(super) not_after: Timestamp,
    /// The DER SubjectPublicKeyInfo.
    pub(super) public_key_info: Vec<u8>,
}

/// Reads a PEM certificate's subject CN, notAfter and public key.
pub(super) fn certificate_of(pem: &str) -> Result<CertificateInfo, String> {
    let der = pem_blocks(pem)
        .into_iter()
        .find(|(label, _)| label == "CERTIFICATE")
        .map(|(_, der)| der)
        .ok_or("no PEM certificate")?;
    let facts = certificate_facts(&der).map_err(|err| format!("unreadable certificate: {err}"))?;
    Ok(CertificateInfo {
        common_name: facts.subject.common_name().map(str::to_owned),
        not_after: facts.not_after,
        public_key_info: facts.public_key_info,
    })
}
