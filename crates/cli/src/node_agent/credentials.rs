//! The node's credentials on disk (`pki/client.pem`, `pki/ca.crt`, mode 0600, written through a rename), and the
//! PEM and DER reading that decides whether a saved certificate can be reused.

use std::{
    io::Write as _,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::Path,
    time::Duration,
};

use base64::Engine as _;
use k8s_openapi::jiff::Timestamp;

use super::settings::Settings;

/// The directory of the saved credentials in `--machine-dir`.
pub(super) const PKI_DIR: &str = "pki";
/// The key and client certificate, in the credentials directory.
pub(super) const CLIENT_PEM: &str = "client.pem";
/// The CA the certificate was obtained under, in the credentials directory.
pub(super) const CA_PEM: &str = "ca.crt";
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
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(pki)?;
    std::fs::set_permissions(pki, std::fs::Permissions::from_mode(0o700))?;
    // The CA first: a crash between the two writes leaves a certificate that is not reused, never a wrong one.
    write_private(&pki.join(CA_PEM), ca_pem.as_bytes())?;
    let mut both = credentials.key_pem.clone();
    if !both.ends_with('\n') {
        both.push('\n');
    }
    both.push_str(&credentials.cert_pem);
    write_private(&pki.join(CLIENT_PEM), both.as_bytes())
}

fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)?;
    file.write_all(contents)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path)
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
    let common_name = mcm_apiserver::x509::certificate_subject(&der)
        .map_err(|err| format!("unreadable certificate: {err}"))?
        .common_name()
        .map(str::to_owned);
    let (not_after, public_key_info) = validity_and_key(&der).ok_or("unreadable certificate")?;
    Ok(CertificateInfo {
        common_name,
        not_after,
        public_key_info,
    })
}

/// One DER element: tag, content, the whole element, the rest after it.
type DerElement<'a> = (u8, &'a [u8], &'a [u8], &'a [u8]);

/// The first DER element of `input`.
fn der_element(input: &[u8]) -> Option<DerElement<'_>> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let len = rest[..count]
            .iter()
            .fold(0usize, |len, &b| (len << 8) | usize::from(b));
        (len, &rest[count..])
    };
    if rest.len() < len {
        return None;
    }
    let header = input.len() - rest.len();
    Some((tag, &rest[..len], &input[..header + len], &rest[len..]))
}

/// notAfter and the SubjectPublicKeyInfo of a DER certificate.
fn validity_and_key(der: &[u8]) -> Option<(Timestamp, Vec<u8>)> {
    const SEQUENCE: u8 = 0x30;
    let (SEQUENCE, certificate, _, _) = der_element(der)? else {
        return None;
    };
    let (SEQUENCE, tbs, _, _) = der_element(certificate)? else {
        return None;
    };
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = der_element(rest)?.3; // version
    }
    rest = der_element(rest)?.3; // serialNumber
    rest = der_element(rest)?.3; // signature
    rest = der_element(rest)?.3; // issuer
    let (SEQUENCE, validity, _, after_validity) = der_element(rest)? else {
        return None;
    };
    let (_, _, _, after_not_before) = der_element(validity)?;
    let (tag, not_after, _, _) = der_element(after_not_before)?;
    let not_after = der_time(tag, not_after)?;
    let after_subject = der_element(after_validity)?.3;
    let (SEQUENCE, _, key_info, _) = der_element(after_subject)? else {
        return None;
    };
    Some((not_after, key_info.to_vec()))
}

/// A UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
pub(super) fn der_time(tag: u8, content: &[u8]) -> Option<Timestamp> {
    let text = std::str::from_utf8(content).ok()?.strip_suffix('Z')?;
    let full = match (tag, text.len()) {
        (0x17, 12) => {
            let year: u32 = text[..2].parse().ok()?;
            format!("{}{text}", if year < 50 { "20" } else { "19" })
        }
        (0x18, 14) => text.to_owned(),
        _ => return None,
    };
    if !full.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    format!(
        "{}-{}-{}T{}:{}:{}Z",
        &full[..4],
        &full[4..6],
        &full[6..8],
        &full[8..10],
        &full[10..12],
        &full[12..14]
    )
    .parse()
    .ok()
}
