//! Removing secret values from texts that reach users: provider messages in lastOperation descriptions, Events and
//! logs.
//!
//! Providers' error messages can quote the request they were given (several cloud APIs do), and the request holds
//! the class's secret, the rendered userData and the machine's bootstrap token, often base64-encoded. A
//! [`Redactor`] knows those values and replaces them — as they are, line by line, in each base64 form, and inside
//! any longer base64 text that decodes to something holding them — by [`Redactor::MARK`].

use std::{collections::BTreeMap, fmt, ops::Range};

use base64::{
    Engine as _, alphabet,
    engine::{
        DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig,
        general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD},
    },
};
use k8s_openapi::ByteString;
use mcm_driver::DriverError;

use crate::userdata::BootstrapToken;

/// Removes known secret values from texts that reach users (provider messages in descriptions, events, logs).
///
/// Built from the class's secret data (credentials and userData), and in the creation flow also from the rendered
/// userData and the machine's bootstrap token. Every value of at least [`Redactor::MIN_LEN`] characters, every line
/// of at least that length of a multi-line value (a provider may echo one line of a boot script), and the base64
/// forms of each (standard and URL-safe, with and without padding) are replaced by [`Redactor::MARK`]; so is every
/// base64-looking run of a text that decodes to something holding one of them (a provider may encode a whole request
/// that contains the value at any offset). Its `Debug` output shows how many values it holds, never the values.
#[derive(Clone, Default)]
pub struct Redactor {
    /// The texts to replace, longest first: the values, their lines and their base64 forms.
    needles: Vec<String>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("values", &self.needles.len())
            .finish()
    }
}

/// The four base64 forms a value can take in a message.
const ENGINES: [GeneralPurpose; 4] = [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD];

/// Decodes base64 with or without padding and with loose trailing bits: runs cut out of a text are rarely exact.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// Runs shorter than this are not decoded: the base64 of the shortest redacted value ([`Redactor::MIN_LEN`] bytes)
/// is 8 characters.
const MIN_RUN: usize = 8;

impl Redactor {
    /// Shorter values are not redacted: they are not secrets worth the name (`true`, `1`) and would mangle texts.
    pub const MIN_LEN: usize = 6;
    /// What a redacted value is replaced with.
    pub const MARK: &'static str = "[redacted]";

    /// A redactor that knows no secret values.
    pub fn new() -> Self {
        Self::default()
    }

    /// A redactor for every value of a secret's data.
    pub fn from_secret_data(data: &BTreeMap<String, ByteString>) -> Self {
        let mut redactor = Self::new();
        redactor.add_secret_data(data);
        redactor
    }

    /// Adds every value of a secret's data (e.g. the secret passed to CreateMachine, with the rendered userData).
    pub fn add_secret_data(&mut self, data: &BTreeMap<String, ByteString>) {
        for value in data.values() {
            self.add(&value.0);
        }
    }

    /// Adds a machine's bootstrap token: the whole `<id>.<secret>` and the secret part alone (the id alone names
    /// the token's Secret and is not secret).
    pub fn add_bootstrap_token(&mut self, token: &BootstrapToken) {
        let exposed = token.expose();
        self.add(exposed.as_bytes());
        if let Some((_, secret)) = exposed.split_once('.') {
            self.add(secret.as_bytes());
        }
    }

    /// Adds a secret value, its lines (for multi-line values) and the base64 forms of each. Values that are not
    /// UTF-8 cannot appear in a UTF-8 text as a whole; their UTF-8 lines and their base64 forms are still added.
    pub fn add(&mut self, value: &[u8]) {
        let text = String::from_utf8_lossy(value);
        let mut candidates = vec![text.trim().to_owned()];
        if text.contains('\n') {
            candidates.extend(text.lines().map(|line| line.trim().to_owned()));
        }
        let mut encoded: Vec<&[u8]> = Vec::new();
        if value.len() >= Self::MIN_LEN {
            encoded.push(value);
        }
        // Bootstrap tokens inside a value (a rendered boot script, a kubeadm join line): a provider may quote the
        // token alone.
        for token in mcm_api::bootstrap_tokens_in(&text) {
            candidates.push(token.to_owned());
            candidates.push(token[7..].to_owned());
        }
        for candidate in &candidates {
            if candidate.chars().count() >= Self::MIN_LEN && !candidate.contains('\u{fffd}') {
                self.push(candidate.clone());
                encoded.push(candidate.as_bytes());
            }
        }
        let forms: Vec<String> = encoded
            .iter()
            .flat_map(|bytes| ENGINES.iter().map(move |engine| engine.encode(bytes)))
            .collect();
        for form in forms {
            self.push(form);
        }
        // Longest first, so that a value containing another is replaced whole.
        self.needles.sort_by_key(|needle| std::cmp::Reverse(needle.len()));
    }

    fn push(&mut self, needle: String) {
        if !self.needles.contains(&needle) {
            self.needles.push(needle);
        }
    }

    /// Whether the redactor knows no value (then [`Redactor::redact`] returns texts unchanged).
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// The text with every known secret value (as it is, a line of it, or base64-encoded, also inside longer base64
    /// text) replaced by [`Redactor::MARK`].
    pub fn redact(&self, text: &str) -> String {
        if self.is_empty() {
            return text.to_owned();
        }
        let mut out = text.to_owned();
        // Base64 of a longer text holding a value: the value's own base64 is not aligned in it, so decode each run
        // (first, so that a run goes whole rather than around a replaced part).
        let leaking: Vec<Range<usize>> = base64_runs(&out)
            .into_iter()
            .filter(|run| {
                decodings(&out[run.clone()]).iter().any(|decoded| {
                    self.needles
                        .iter()
                        .any(|needle| decoded.contains(needle.as_str()))
                })
            })
            .collect();
        for run in leaking.into_iter().rev() {
            out.replace_range(run, Self::MARK);
        }
        for needle in &self.needles {
            if out.contains(needle.as_str()) {
                out = out.replace(needle.as_str(), Self::MARK);
            }
        }
        out
    }

    /// The error with its message redacted.
    pub fn redact_error(&self, error: &DriverError) -> DriverError {
        DriverError::new(error.code, self.redact(&error.message))
    }
}

fn is_base64_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'-' | b'_')
}

/// The base64-looking runs of a text (standard or URL-safe characters, then up to two `=`), at least 8 long.
pub fn base64_runs(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !is_base64_char(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_base64_char(bytes[i]) {
            i += 1;
        }
        let mut end = i;
        while end < bytes.len() && end - i < 2 && bytes[end] == b'=' {
            end += 1;
        }
        if end - start >= MIN_RUN {
            runs.push(start..end);
        }
        i = end.max(i);
    }
    runs
}

/// A base64-looking run decoded from each of its four possible alignments (the encoded text may start anywhere in
/// the run), standard and URL-safe alike, as lossy UTF-8.
pub fn decodings(run: &str) -> Vec<String> {
    let normalized: Vec<u8> = run
        .bytes()
        .filter(|b| *b != b'=')
        .map(|b| match b {
            b'-' => b'+',
            b'_' => b'/',
            other => other,
        })
        .collect();
    (0..4)
        .filter_map(|offset| {
            let part = normalized.get(offset..)?;
            let part = if part.len() % 4 == 1 {
                &part[..part.len() - 1]
            } else {
                part
            };
            let decoded = LENIENT.decode(part).ok()?;
            Some(String::from_utf8_lossy(&decoded).into_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn b64(value: &str) -> String {
        STANDARD.encode(value)
    }

    #[test]
    fn every_form_of_a_value_goes() {
        let mut redactor = Redactor::new();
        redactor.add(b"AKIA-plain-text-canary");
        for form in ENGINES.map(|engine| engine.encode("AKIA-plain-text-canary")) {
            let text = format!("request rejected: key={form}; retry later");
            let redacted = redactor.redact(&text);
            assert!(!redacted.contains(&form), "{redacted}");
            assert!(
                redacted.contains("request rejected: key=[redacted]; retry later"),
                "{redacted}"
            );
        }
    }

    #[test]
    fn user_data_its_lines_and_their_base64_go() {
        let user_data = "#!/bin/bash\nexport TOKEN=abcdef.0123456789abcdef\nls\n";
        let mut redactor = Redactor::new();
        redactor.add(user_data.as_bytes());
        for text in [
            user_data.to_owned(),
            b64(user_data),
            URL_SAFE_NO_PAD.encode(user_data),
            "export TOKEN=abcdef.0123456789abcdef".to_owned(),
            b64("export TOKEN=abcdef.0123456789abcdef"),
        ] {
            let redacted = redactor.redact(&format!("invalid user data: {text}"));
            assert!(!redacted.contains("0123456789abcdef"), "{redacted}");
            assert!(!redacted.contains(&text), "{redacted}");
            assert!(redacted.starts_with("invalid user data: "), "{redacted}");
        }
        assert_eq!(redactor.redact("run ls"), "run ls", "short lines stay");
    }

    #[test]
    fn a_bootstrap_token_goes_whole_and_its_secret_alone_but_its_id_stays() {
        let token = BootstrapToken::from_parts("abc123", "0123456789abcdef").unwrap();
        let mut redactor = Redactor::new();
        redactor.add_bootstrap_token(&token);
        let text = "token abc123.0123456789abcdef refused; secret 0123456789abcdef; id abc123; b64 \
                    YWJjMTIzLjAxMjM0NTY3ODlhYmNkZWY=";
        let redacted = redactor.redact(text);
        assert!(!redacted.contains("0123456789abcdef"), "{redacted}");
        assert!(
            !redacted.contains("YWJjMTIzLjAxMjM0NTY3ODlhYmNkZWY"),
            "{redacted}"
        );
        assert!(
            redacted.contains("id abc123;"),
            "the id is not secret: {redacted}"
        );
    }

    #[test]
    fn a_bootstrap_token_inside_a_value_goes_alone_too() {
        let mut redactor = Redactor::new();
        redactor.add(b"#!/bin/sh\nexec agent --bootstrap-token \"abc123.0123456789abcdef\" --node x\n");
        let text = format!(
            "bad token abc123.0123456789abcdef ({}), secret 0123456789abcdef",
            URL_SAFE.encode("abc123.0123456789abcdef")
        );
        let redacted = redactor.redact(&text);
        assert_eq!(redacted, "bad token [redacted] ([redacted]), secret [redacted]");
    }

    #[test]
    fn a_value_inside_longer_base64_goes() {
        let mut redactor = Redactor::new();
        redactor.add(b"pw-canary-22aa4c19");
        for prefix in ["", "a", "ab", "abc", "{\"password\": \""] {
            let request = format!("{prefix}pw-canary-22aa4c19\", \"other\": 1}}");
            for encoded in [STANDARD.encode(&request), URL_SAFE_NO_PAD.encode(&request)] {
                let redacted = redactor.redact(&format!("echo: body={encoded} end"));
                assert_eq!(redacted, "echo: body=[redacted] end");
            }
        }
        assert_eq!(
            redactor.redact("harmless aGFybWxlc3MgdGV4dA== text"),
            "harmless aGFybWxlc3MgdGV4dA== text"
        );
    }

    #[test]
    fn from_secret_data_takes_every_value_and_debug_shows_none() {
        let data = BTreeMap::from([
            (
                "userData".to_owned(),
                ByteString(b"#!/bin/bash\necho hi".to_vec()),
            ),
            (
                "providerAccessKeyId".to_owned(),
                ByteString(b"AKIA-plain-text".to_vec()),
            ),
        ]);
        let redactor = Redactor::from_secret_data(&data);
        let redacted = redactor.redact("key AKIA-plain-text, script #!/bin/bash");
        assert_eq!(redacted, "key [redacted], script [redacted]");
        assert!(!format!("{redactor:?}").contains("AKIA"));
        assert!(Redactor::new().is_empty());
    }

    #[test]
    fn runs_are_found_with_their_padding() {
        let text = "a aGVsbG8gd29ybGQ= b short c dXJs-c2FmZV8_ d";
        let runs: Vec<&str> = base64_runs(text).into_iter().map(|r| &text[r]).collect();
        assert_eq!(runs, ["aGVsbG8gd29ybGQ=", "dXJs-c2FmZV8_"]);
        assert!(decodings("aGVsbG8gd29ybGQ=").iter().any(|d| d == "hello world"));
    }

    proptest! {
        #[test]
        fn no_form_of_a_value_survives(
            value in "[a-zA-Z0-9._-]{6,40}",
            prefix in "[ -~]{0,20}",
            suffix in "[ -~]{0,20}",
            inner_prefix in "[ -~]{0,9}",
        ) {
            prop_assume!(!Redactor::MARK.contains(value.as_str()));
            let mut redactor = Redactor::new();
            redactor.add(value.as_bytes());
            let inner = format!("{inner_prefix}{value}\"}}");
            let texts = [
                format!("{prefix}{value}{suffix}"),
                format!("{prefix} {} {suffix}", b64(&value)),
                format!("{prefix} {} {suffix}", URL_SAFE_NO_PAD.encode(&value)),
                format!("{prefix} {} {suffix}", b64(&inner)),
                format!("{prefix} {} {suffix}", URL_SAFE.encode(&inner)),
            ];
            for text in texts {
                let redacted = redactor.redact(&text);
                prop_assert!(!redacted.contains(value.as_str()), "{} -> {}", text, redacted);
                prop_assert!(!redacted.contains(&b64(&value)), "{} -> {}", text, redacted);
                for run in base64_runs(&redacted) {
                    for decoded in decodings(&redacted[run]) {
                        prop_assert!(!decoded.contains(value.as_str()), "{} -> {}", text, redacted);
                    }
                }
            }
        }

        #[test]
        fn redacting_never_panics(text in any::<String>(), value in any::<Vec<u8>>()) {
            let mut redactor = Redactor::new();
            redactor.add(&value);
            let _ = redactor.redact(&text);
        }
    }
}
