//! Just enough DER to read what node credentials need, without a new dependency: the subject (CN, O) of a client
//! certificate that the TLS layer has already verified against the CA, and a PKCS#10 certificate request (RFC 2986:
//! its subject, public key and whether it asks for subject alternative names), whose self-signature is checked with
//! the ring algorithms rustls ships, as proof that the requester holds the private key.
//!
//! rcgen reads neither certificates nor requests without its `x509-parser` feature, which this workspace does not
//! enable. Only the definite-length DER that certificate and request encoders produce is accepted; anything else is
//! refused rather than guessed at.

use rustls::pki_types::{CertificateSigningRequestDer, pem::PemObject as _};

/// Why a certificate or request could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum X509Error {
    /// The bytes are not the DER structure expected.
    #[error("malformed DER: {0}")]
    Malformed(&'static str),
    /// The text holds no PEM `CERTIFICATE REQUEST` block.
    #[error("PEM block type must be CERTIFICATE REQUEST")]
    NotPem,
    /// The request's key or signature algorithm is not one this server verifies.
    #[error("unsupported public key or signature algorithm")]
    UnsupportedAlgorithm,
    /// The request's signature does not verify with its own public key.
    #[error("the request's signature does not verify with its public key")]
    BadSignature,
}

const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const OCTET_STRING: u8 = 0x04;
const OID: u8 = 0x06;
const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
/// `[0]`, constructed: the certificate's version, the request's attributes.
const CONTEXT_0: u8 = 0xa0;

/// id-at-commonName (2.5.4.3), the content of its OBJECT IDENTIFIER.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// id-at-organizationName (2.5.4.10).
const OID_ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];
/// pkcs-9 extensionRequest (1.2.840.113549.1.9.14).
const OID_EXTENSION_REQUEST: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x0e];
/// id-ce-subjectAltName (2.5.29.17).
const OID_SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];

/// One DER element.
#[derive(Clone, Copy)]
struct Tlv<'a> {
    tag: u8,
    /// The content octets.
    value: &'a [u8],
    /// The whole element: tag, length and content (what a signature covers).
    raw: &'a [u8],
}

/// A cursor over consecutive DER elements.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// The next element, whatever its tag.
    fn any(&mut self) -> Result<Tlv<'a>, X509Error> {
        let input = self.0;
        let (&tag, rest) = input
            .split_first()
            .ok_or(X509Error::Malformed("truncated element"))?;
        if tag & 0x1f == 0x1f {
            return Err(X509Error::Malformed("high tag numbers are not used here"));
        }
        let (&first, rest) = rest
            .split_first()
            .ok_or(X509Error::Malformed("truncated length"))?;
        let (length, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 || rest.len() < count {
                return Err(X509Error::Malformed("unsupported length"));
            }
            let length = rest[..count]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (length, &rest[count..])
        };
        if rest.len() < length {
            return Err(X509Error::Malformed("length beyond the data"));
        }
        let header = input.len() - rest.len();
        let element = Tlv {
            tag,
            value: &rest[..length],
            raw: &input[..header + length],
        };
        self.0 = &rest[length..];
        Ok(element)
    }

    /// The next element, which must have this tag.
    fn expect(&mut self, tag: u8, what: &'static str) -> Result<Tlv<'a>, X509Error> {
        let element = self.any()?;
        if element.tag == tag {
            Ok(element)
        } else {
            Err(X509Error::Malformed(what))
        }
    }

    /// The next element when it has this tag (an OPTIONAL field), leaving the reader unchanged otherwise.
    fn optional(&mut self, tag: u8) -> Result<Option<Tlv<'a>>, X509Error> {
        if self.0.first() == Some(&tag) {
            self.any().map(Some)
        } else {
            Ok(None)
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Fails unless everything was read.
    fn finish(&self) -> Result<(), X509Error> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(X509Error::Malformed("trailing data"))
        }
    }
}

/// The content of a BIT STRING that has no unused bits (keys and signatures are whole bytes).
fn bit_string_bytes(element: Tlv<'_>) -> Result<&[u8], X509Error> {
    match element.value.split_first() {
        Some((0, bytes)) => Ok(bytes),
        _ => Err(X509Error::Malformed("bit string with unused bits")),
    }
}

/// The names of a subject that authentication and approval look at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subject {
    /// Every CN, in order (a well-formed subject has one).
    pub common_names: Vec<String>,
    /// Every O, in order.
    pub organizations: Vec<String>,
    /// How many attributes of other types (C, OU, ...) the subject has.
    pub other_attributes: usize,
}

impl Subject {
    /// The single common name, None when there is none or more than one.
    pub fn common_name(&self) -> Option<&str> {
        match self.common_names.as_slice() {
            [one] => Some(one),
            _ => None,
        }
    }
}

/// A directory string as text: UTF8String, PrintableString, IA5String, or TeletexString read as Latin-1.
fn directory_string(element: Tlv<'_>) -> Result<String, X509Error> {
    match element.tag {
        0x0c | 0x13 | 0x16 => String::from_utf8(element.value.to_vec())
            .map_err(|_| X509Error::Malformed("attribute value is not UTF-8")),
        0x14 => Ok(element.value.iter().map(|b| char::from(*b)).collect()),
        _ => Err(X509Error::Malformed("unsupported attribute string type")),
    }
}

/// Reads a Name (RDNSequence) from its SEQUENCE element.
fn parse_name(name: Tlv<'_>) -> Result<Subject, X509Error> {
    let mut subject = Subject::default();
    let mut rdns = Reader(name.value);
    while !rdns.is_empty() {
        let rdn = rdns.expect(SET, "relative distinguished name")?;
        let mut attributes = Reader(rdn.value);
        while !attributes.is_empty() {
            let attribute = attributes.expect(SEQUENCE, "attribute")?;
            let mut fields = Reader(attribute.value);
            let oid = fields.expect(OID, "attribute type")?;
            let value = fields.any()?;
            fields.finish()?;
            match oid.value {
                OID_COMMON_NAME => subject.common_names.push(directory_string(value)?),
                OID_ORGANIZATION => subject.organizations.push(directory_string(value)?),
                _ => subject.other_attributes += 1,
            }
        }
    }
    Ok(subject)
}

/// The tbsCertificate of a DER X.509 certificate read up to its validity: the validity, and a reader at the
/// subject.
fn tbs_to_validity(der: &[u8]) -> Result<(Tlv<'_>, Reader<'_>), X509Error> {
    let mut outer = Reader(der);
    let certificate = outer.expect(SEQUENCE, "certificate")?;
    outer.finish()?;
    let mut fields = Reader(certificate.value);
    let tbs = fields.expect(SEQUENCE, "tbsCertificate")?;
    let mut tbs = Reader(tbs.value);
    tbs.optional(CONTEXT_0)?;
    tbs.expect(INTEGER, "serial number")?;
    tbs.expect(SEQUENCE, "signature algorithm")?;
    tbs.expect(SEQUENCE, "issuer")?;
    let validity = tbs.expect(SEQUENCE, "validity")?;
    Ok((validity, tbs))
}

/// The subject of a DER X.509 certificate.
pub fn certificate_subject(der: &[u8]) -> Result<Subject, X509Error> {
    let (_, mut rest) = tbs_to_validity(der)?;
    parse_name(rest.expect(SEQUENCE, "subject")?)
}

/// What the holder of a certificate checks before reusing it (a node agent after a restart).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateFacts {
    /// The subject.
    pub subject: Subject,
    /// The end of the validity.
    pub not_after: jiff::Timestamp,
    /// The whole DER SubjectPublicKeyInfo, to compare with the private key's.
    pub public_key_info: Vec<u8>,
}

/// The subject, notAfter and public key of a DER X.509 certificate (its signature is not checked).
pub fn certificate_facts(der: &[u8]) -> Result<CertificateFacts, X509Error> {
    let (validity, mut rest) = tbs_to_validity(der)?;
    let subject = parse_name(rest.expect(SEQUENCE, "subject")?)?;
    let spki = rest.expect(SEQUENCE, "subjectPublicKeyInfo")?;
    let mut times = Reader(validity.value);
    times.any()?; // notBefore
    let not_after = times.any()?;
    Ok(CertificateFacts {
        subject,
        not_after: der_time(not_after.tag, not_after.value).ok_or(X509Error::Malformed("notAfter"))?,
        public_key_info: spki.raw.to_vec(),
    })
}

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950 to 2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
pub fn der_time(tag: u8, content: &[u8]) -> Option<jiff::Timestamp> {
    let text = std::str::from_utf8(content).ok()?.strip_suffix('Z')?;
    let full = match (tag, text.len()) {
        (UTC_TIME, 12) => {
            let year: u32 = text[..2].parse().ok()?;
            format!("{}{text}", if year < 50 { "20" } else { "19" })
        }
        (GENERALIZED_TIME, 14) => text.to_owned(),
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

/// A PKCS#10 certificate request whose signature verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateRequest {
    /// The requested subject.
    pub subject: Subject,
    /// The whole DER SubjectPublicKeyInfo.
    pub public_key_info: Vec<u8>,
    /// The subjectPublicKey bits (the key itself, without its algorithm).
    pub public_key: Vec<u8>,
    /// The request asks for subject alternative names (DNS, IP, email, URI).
    pub has_subject_alt_names: bool,
}

impl CertificateRequest {
    /// Reads a PEM `CERTIFICATE REQUEST` (the first one in the text) and verifies its signature.
    pub fn from_pem(pem: &[u8]) -> Result<Self, X509Error> {
        let der = CertificateSigningRequestDer::from_pem_slice(pem).map_err(|_| X509Error::NotPem)?;
        Self::from_der(&der)
    }

    /// Reads a DER certificate request and verifies its signature.
    pub fn from_der(der: &[u8]) -> Result<Self, X509Error> {
        let mut outer = Reader(der);
        let request = outer.expect(SEQUENCE, "certification request")?;
        outer.finish()?;
        let mut fields = Reader(request.value);
        let info = fields.expect(SEQUENCE, "certificationRequestInfo")?;
        let signature_algorithm = fields.expect(SEQUENCE, "signature algorithm")?;
        let signature = fields.expect(BIT_STRING, "signature")?;
        fields.finish()?;

        let mut info_fields = Reader(info.value);
        info_fields.expect(INTEGER, "version")?;
        let subject = parse_name(info_fields.expect(SEQUENCE, "subject")?)?;
        let spki = info_fields.expect(SEQUENCE, "subjectPKInfo")?;
        let attributes = info_fields.optional(CONTEXT_0)?;
        info_fields.finish()?;

        let mut spki_fields = Reader(spki.value);
        let key_algorithm = spki_fields.expect(SEQUENCE, "public key algorithm")?;
        let public_key = bit_string_bytes(spki_fields.expect(BIT_STRING, "public key")?)?;
        spki_fields.finish()?;

        let algorithm = rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .all
            .iter()
            .find(|alg| {
                alg.public_key_alg_id().as_ref() == key_algorithm.value
                    && alg.signature_alg_id().as_ref() == signature_algorithm.value
            })
            .ok_or(X509Error::UnsupportedAlgorithm)?;
        algorithm
            .verify_signature(public_key, info.raw, bit_string_bytes(signature)?)
            .map_err(|_| X509Error::BadSignature)?;

        Ok(Self {
            subject,
            public_key_info: spki.raw.to_vec(),
            public_key: public_key.to_vec(),
            has_subject_alt_names: match attributes {
                Some(attributes) => requests_subject_alt_names(attributes)?,
                None => false,
            },
        })
    }
}

/// True when the request's attributes hold an extensionRequest with a subjectAltName extension.
fn requests_subject_alt_names(attributes: Tlv<'_>) -> Result<bool, X509Error> {
    let mut list = Reader(attributes.value);
    while !list.is_empty() {
        let attribute = list.expect(SEQUENCE, "attribute")?;
        let mut fields = Reader(attribute.value);
        let oid = fields.expect(OID, "attribute type")?;
        let values = fields.expect(SET, "attribute values")?;
        if oid.value != OID_EXTENSION_REQUEST {
            continue;
        }
        let mut values = Reader(values.value);
        while !values.is_empty() {
            let extensions = values.expect(SEQUENCE, "extensions")?;
            let mut extensions = Reader(extensions.value);
            while !extensions.is_empty() {
                let extension = extensions.expect(SEQUENCE, "extension")?;
                let mut parts = Reader(extension.value);
                let id = parts.expect(OID, "extension id")?;
                if id.value == OID_SUBJECT_ALT_NAME {
                    return Ok(true);
                }
                // critical BOOLEAN DEFAULT FALSE, then the value.
                parts.optional(0x01)?;
                parts.expect(OCTET_STRING, "extension value")?;
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, PublicKeyData as _, SanType};

    fn request(common_name: &str, organization: Option<&str>, sans: &[&str], key: &KeyPair) -> String {
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, common_name);
        if let Some(organization) = organization {
            name.push(DnType::OrganizationName, organization);
        }
        params.distinguished_name = name;
        params.subject_alt_names = sans
            .iter()
            .map(|s| SanType::DnsName((*s).try_into().unwrap()))
            .collect();
        params.serialize_request(key).unwrap().pem().unwrap()
    }

    #[test]
    fn a_request_yields_its_subject_and_key_after_its_signature_verifies() {
        for algorithm in [
            &rcgen::PKCS_ECDSA_P256_SHA256,
            &rcgen::PKCS_ECDSA_P384_SHA384,
            &rcgen::PKCS_ED25519,
        ] {
            let key = KeyPair::generate_for(algorithm).unwrap();
            let pem = request("system:node:n1", Some("system:nodes"), &[], &key);
            let parsed = CertificateRequest::from_pem(pem.as_bytes()).unwrap();
            assert_eq!(parsed.subject.common_name(), Some("system:node:n1"));
            assert_eq!(parsed.subject.organizations, ["system:nodes"]);
            assert_eq!(parsed.subject.other_attributes, 0);
            assert_eq!(parsed.public_key, key.public_key_raw());
            assert_eq!(parsed.public_key_info, key.subject_public_key_info());
            assert!(!parsed.has_subject_alt_names);
        }
    }

    #[test]
    fn subject_alt_names_in_a_request_are_noticed() {
        let key = KeyPair::generate().unwrap();
        let pem = request("system:node:n1", Some("system:nodes"), &["n1.example"], &key);
        assert!(
            CertificateRequest::from_pem(pem.as_bytes())
                .unwrap()
                .has_subject_alt_names
        );
    }

    #[test]
    fn a_tampered_request_or_garbage_is_refused() {
        let key = KeyPair::generate().unwrap();
        let pem = request("system:node:n1", Some("system:nodes"), &[], &key);
        let mut der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .to_vec();
        // Change one letter of the common name: the signature no longer covers the content.
        let at = der.windows(6).position(|w| w == b"node:n").unwrap() + 5;
        der[at] = b'm';
        assert_eq!(CertificateRequest::from_der(&der), Err(X509Error::BadSignature));
        assert!(matches!(
            CertificateRequest::from_der(&der[..der.len() - 3]),
            Err(X509Error::Malformed(_))
        ));
        assert_eq!(CertificateRequest::from_pem(b"not pem"), Err(X509Error::NotPem));
        assert!(CertificateRequest::from_der(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(CertificateRequest::from_der(&[]).is_err());
    }

    #[test]
    fn a_certificate_subject_reads_cn_and_every_o() {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "system:node:n1");
        name.push(DnType::OrganizationName, "system:nodes");
        name.push(DnType::CustomDnType(vec![2, 5, 4, 10]), "extra");
        name.push(DnType::CountryName, "DE");
        params.distinguished_name = name;
        let certificate = params.self_signed(&key).unwrap();
        let subject = certificate_subject(certificate.der()).unwrap();
        assert_eq!(subject.common_name(), Some("system:node:n1"));
        assert_eq!(subject.organizations, ["system:nodes", "extra"]);
        assert_eq!(subject.other_attributes, 1);
        assert!(certificate_subject(&certificate.der()[..40]).is_err());
    }

    #[test]
    fn a_certificate_yields_its_not_after_and_public_key() {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "system:node:n1");
        params.not_after = rcgen::date_time_ymd(2040, 5, 6);
        let certificate = params.self_signed(&key).unwrap();
        let facts = certificate_facts(certificate.der()).unwrap();
        assert_eq!(facts.subject.common_name(), Some("system:node:n1"));
        assert_eq!(facts.not_after.to_string(), "2040-05-06T00:00:00Z");
        assert_eq!(facts.public_key_info, key.subject_public_key_info());
        assert!(certificate_facts(&certificate.der()[..60]).is_err());
    }

    #[test]
    fn der_times_read_both_encodings_and_utc_years_wrap_at_1950() {
        assert_eq!(
            der_time(UTC_TIME, b"491231235959Z").unwrap().to_string(),
            "2049-12-31T23:59:59Z"
        );
        assert_eq!(
            der_time(UTC_TIME, b"500101000000Z").unwrap().to_string(),
            "1950-01-01T00:00:00Z"
        );
        assert_eq!(
            der_time(GENERALIZED_TIME, b"20400506000000Z")
                .unwrap()
                .to_string(),
            "2040-05-06T00:00:00Z"
        );
        assert!(der_time(UTC_TIME, b"20400506000000Z").is_none());
        assert!(der_time(GENERALIZED_TIME, b"2040050600000xZ").is_none());
    }
}
