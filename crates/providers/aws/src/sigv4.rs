//! AWS Signature Version 4 for the Query API's form POSTs, with ring's SHA-256 and HMAC (already built for
//! rustls), so that no AWS SDK crate is needed.

use std::fmt;

use ring::{digest, hmac};

/// Credentials of a call. `Debug` shows the access key ID only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The access key ID.
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
    /// The session token of temporary credentials.
    pub session_token: Option<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// SHA-256 of bytes, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, bytes).as_ref())
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data)
        .as_ref()
        .to_vec()
}

/// The signing key of a day, region and service.
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    hmac(&k_service, b"aws4_request")
}

/// The headers to add to a POST of `body` (form-encoded) to `host` at `/`, signed at `amz_date`
/// (`YYYYMMDDTHHMMSSZ`): `(name, value)` pairs including `authorization`.
pub fn sign_post(
    credentials: &Credentials,
    region: &str,
    service: &str,
    host: &str,
    path: &str,
    body: &[u8],
    amz_date: &str,
) -> Vec<(&'static str, String)> {
    let content_type = "application/x-www-form-urlencoded; charset=utf-8";
    let mut headers: Vec<(&'static str, String)> = vec![
        ("content-type", content_type.to_owned()),
        ("host", host.to_owned()),
        ("x-amz-date", amz_date.to_owned()),
    ];
    if let Some(token) = &credentials.session_token {
        headers.push(("x-amz-security-token", token.clone()));
    }
    let canonical_headers = headers.iter().fold(String::new(), |mut s, (k, v)| {
        use std::fmt::Write as _;
        let _ = writeln!(s, "{k}:{}", v.trim());
        s
    });
    let signed_headers = headers.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(";");
    let canonical_request = format!(
        "POST\n{path}\n\n{canonical_headers}\n{signed_headers}\n{}",
        sha256_hex(body)
    );
    let date = &amz_date[..8];
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical_request.as_bytes())
    );
    let key = signing_key(&credentials.secret_access_key, date, region, service);
    let signature = hex(&hmac(&key, string_to_sign.as_bytes()));
    headers.push((
        "authorization",
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
            credentials.access_key_id
        ),
    ));
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signing_key_matches_the_aws_documentation_example() {
        // "Examples of how to derive a signing key for Signature Version 4" (AWS General Reference).
        let key = signing_key(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "20120215",
            "us-east-1",
            "iam",
        );
        assert_eq!(
            hex(&key),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
        );
    }

    #[test]
    fn authorization_names_scope_and_signed_headers_and_debug_hides_the_secret() {
        let creds = Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: Some("TOKEN-VALUE".into()),
        };
        let headers = sign_post(
            &creds,
            "eu-west-1",
            "ec2",
            "ec2.eu-west-1.amazonaws.com",
            "/",
            b"Action=X",
            "20260101T000000Z",
        );
        let auth = &headers.iter().find(|(k, _)| *k == "authorization").unwrap().1;
        assert!(auth.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/eu-west-1/ec2/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, Signature="
        ));
        let debug = format!("{creds:?}");
        assert!(
            !debug.contains("EXAMPLEKEY") && !debug.contains("TOKEN-VALUE"),
            "{debug}"
        );
    }
}
