//! userData templating and the bootstrap token (reference §3.3 step 1, `userdata.go`).
//!
//! The class secret's `userData` is the machine's boot script. `<<MACHINE_NAME>>` is replaced by the machine's name
//! and `<<BOOTSTRAP_TOKEN>>` by a Kubernetes bootstrap token (`[a-z0-9]{6}.[a-z0-9]{16}`) created for the machine in
//! the target cluster's `kube-system` (Secret `bootstrap-token-<id>`, type `bootstrap.kubernetes.io/token`); their
//! URL-encoded forms (`%3C%3CMACHINE_NAME%3E%3E`, as in Ignition configs) are replaced by the URL-encoded values.
//!
//! Differences from the reference, on purpose:
//! - The token id is derived from a hash of the whole machine name ([`bootstrap_token_id_for_machine`]), not from 3
//!   characters of it (`hex(name[len-5:])[:6]`), which collides for machines whose names differ elsewhere and panics
//!   for names shorter than 5. It stays deterministic, so that the controller finds the token again (get or create)
//!   and deletes it on the first join without listing secrets. The token's secret part comes from caller-supplied
//!   random bytes.
//! - Both the plain and the URL-encoded placeholders are replaced when both occur (the reference replaces the
//!   encoded form only when the plain one is absent).
//! - `auth-extra-groups` is written only when groups are configured (the reference writes an empty value).
//!
//! Errors name keys, secrets and machines, never values: a boot script holds credentials.

use std::{collections::BTreeMap, fmt};

use jiff::Timestamp;
use k8s_openapi::{ByteString, api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use mcm_api::keys::user_data;

/// The namespace of bootstrap token Secrets.
pub const TOKEN_NAMESPACE: &str = "kube-system";
/// The type of bootstrap token Secrets.
pub const TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The name prefix of bootstrap token Secrets.
pub const TOKEN_SECRET_PREFIX: &str = "bootstrap-token-";

/// The keys of a bootstrap token Secret (k8s.io/cluster-bootstrap/token/api).
pub mod token_keys {
    /// The token id.
    pub const ID: &str = "token-id";
    /// The token secret.
    pub const SECRET: &str = "token-secret";
    /// RFC 3339 expiry.
    pub const EXPIRATION: &str = "expiration";
    /// Usable for authentication.
    pub const USAGE_AUTHENTICATION: &str = "usage-bootstrap-authentication";
    /// Usable for signing.
    pub const USAGE_SIGNING: &str = "usage-bootstrap-signing";
    /// Extra groups of the authenticated user.
    pub const AUTH_EXTRA_GROUPS: &str = "auth-extra-groups";
    /// Free text.
    pub const DESCRIPTION: &str = "description";
}

const CHARSET: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
const ID_LEN: usize = 6;
const SECRET_LEN: usize = 16;

/// Why userData could not be templated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UserDataError {
    /// The secret has no `userData` key.
    #[error(
        "the secret of machine class {class:?} has no {key:?} key, so machine {machine:?} has no boot script"
    )]
    MissingUserData {
        /// The machine.
        machine: String,
        /// The class.
        class: String,
        /// The missing key (`userData`).
        key: &'static str,
    },
}

/// Why a bootstrap token could not be made or read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapTokenError {
    /// Too few random bytes were supplied (bytes ≥ 252 are skipped to keep the characters uniform).
    #[error("not enough random bytes for a bootstrap token: {usable} usable, {needed} needed")]
    NotEnoughRandomness {
        /// Usable bytes supplied.
        usable: usize,
        /// Bytes needed.
        needed: usize,
    },
    /// A token id or secret is not of the Kubernetes format.
    #[error("bootstrap token {part} is not {len} characters of [a-z0-9]")]
    InvalidFormat {
        /// `id` or `secret`.
        part: &'static str,
        /// The expected length.
        len: usize,
    },
    /// A bootstrap token Secret lacks a key.
    #[error("bootstrap token secret {secret:?} has no {key:?} key")]
    MissingKey {
        /// The Secret's name.
        secret: String,
        /// The key.
        key: &'static str,
    },
}

/// A bootstrap token. Its `Debug` output shows the id only; there is no `Display`: the token is a credential and is
/// taken out on purpose with [`BootstrapToken::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    id: String,
    secret: String,
}

impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BootstrapToken")
            .field("id", &self.id)
            .field("secret", &"[redacted]")
            .finish()
    }
}

fn valid(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| CHARSET.contains(&b))
}

/// Characters of [`CHARSET`] drawn uniformly from random bytes (bytes ≥ 252 are skipped: 252 = 7 · 36).
fn draw(random: &[u8], count: usize) -> Result<String, BootstrapTokenError> {
    let usable: Vec<u8> = random.iter().copied().filter(|b| *b < 252).collect();
    if usable.len() < count {
        return Err(BootstrapTokenError::NotEnoughRandomness {
            usable: usable.len(),
            needed: count,
        });
    }
    Ok(usable[..count]
        .iter()
        .map(|b| char::from(CHARSET[usize::from(*b % 36)]))
        .collect())
}

impl BootstrapToken {
    /// How many random bytes to supply: enough that running short is practically impossible.
    pub const RANDOM_BYTES: usize = 64;

    /// A token with a random id and secret, drawn from `random` (supply [`BootstrapToken::RANDOM_BYTES`]).
    pub fn from_random(random: &[u8]) -> Result<Self, BootstrapTokenError> {
        let drawn = draw(random, ID_LEN + SECRET_LEN)?;
        let (id, secret) = drawn.split_at(ID_LEN);
        Ok(Self {
            id: id.to_owned(),
            secret: secret.to_owned(),
        })
    }

    /// The token of a machine: the id derived from its name ([`bootstrap_token_id_for_machine`]), the secret drawn
    /// from `random`.
    pub fn for_machine(machine_name: &str, random: &[u8]) -> Result<Self, BootstrapTokenError> {
        Ok(Self {
            id: bootstrap_token_id_for_machine(machine_name),
            secret: draw(random, SECRET_LEN)?,
        })
    }

    /// A token from its parts, checked against the Kubernetes format.
    pub fn from_parts(id: &str, secret: &str) -> Result<Self, BootstrapTokenError> {
        if !valid(id, ID_LEN) {
            return Err(BootstrapTokenError::InvalidFormat {
                part: "id",
                len: ID_LEN,
            });
        }
        if !valid(secret, SECRET_LEN) {
            return Err(BootstrapTokenError::InvalidFormat {
                part: "secret",
                len: SECRET_LEN,
            });
        }
        Ok(Self {
            id: id.to_owned(),
            secret: secret.to_owned(),
        })
    }

    /// The token stored in a bootstrap token Secret (to reuse an existing one).
    pub fn from_secret(secret: &Secret) -> Result<Self, BootstrapTokenError> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let get = |key: &'static str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
                .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(key)).cloned())
                .ok_or_else(|| BootstrapTokenError::MissingKey {
                    secret: name.clone(),
                    key,
                })
        };
        Self::from_parts(&get(token_keys::ID)?, &get(token_keys::SECRET)?)
    }

    /// The token id (public: it names the Secret).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The token, `<id>.<secret>`: a credential.
    pub fn expose(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// The name of the token's Secret, `bootstrap-token-<id>`.
    pub fn secret_name(&self) -> String {
        format!("{TOKEN_SECRET_PREFIX}{}", self.id)
    }
}

/// The token id of a machine: 6 characters of `[a-z0-9]` from a 64-bit FNV-1a hash of its name.
pub fn bootstrap_token_id_for_machine(machine_name: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in machine_name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (0..ID_LEN)
        .map(|_| {
            let index = usize::try_from(hash % 36).unwrap_or(0);
            hash /= 36;
            char::from(CHARSET[index])
        })
        .collect()
}

/// The name of a machine's bootstrap token Secret.
pub fn bootstrap_token_secret_name_for_machine(machine_name: &str) -> String {
    format!(
        "{TOKEN_SECRET_PREFIX}{}",
        bootstrap_token_id_for_machine(machine_name)
    )
}

fn token_description(machine_name: &str) -> String {
    format!("A bootstrap token for machine {machine_name:?} generated by MachineControllerManager.")
}

/// The bootstrap token Secret of a machine: in `kube-system`, type `bootstrap.kubernetes.io/token`, usable for
/// authentication and signing, expiring at `expires_at` (RFC 3339, whole seconds; the controller passes
/// [`token_expiry`]), with `auth-extra-groups` when `auth_extra_groups` is not empty.
pub fn bootstrap_token_secret(
    token: &BootstrapToken,
    machine_name: &str,
    expires_at: Timestamp,
    auth_extra_groups: &str,
) -> Secret {
    let expires_at = Timestamp::from_second(expires_at.as_second()).unwrap_or(expires_at);
    let mut data = BTreeMap::from([
        (token_keys::ID, token.id.clone()),
        (token_keys::SECRET, token.secret.clone()),
        (token_keys::EXPIRATION, expires_at.to_string()),
        (token_keys::USAGE_AUTHENTICATION, "true".to_owned()),
        (token_keys::USAGE_SIGNING, "true".to_owned()),
        (token_keys::DESCRIPTION, token_description(machine_name)),
    ]);
    if !auth_extra_groups.is_empty() {
        data.insert(token_keys::AUTH_EXTRA_GROUPS, auth_extra_groups.to_owned());
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(token.secret_name()),
            namespace: Some(TOKEN_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        type_: Some(TOKEN_SECRET_TYPE.to_owned()),
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// When a machine's token expires: `now` plus the machine's effective creation timeout (a token is only needed
/// until the machine joins).
pub fn token_expiry(
    machine: &mcm_api::Machine,
    settings: &crate::timeouts::ControllerSettings,
    now: Timestamp,
) -> Timestamp {
    crate::timeouts::add(
        now,
        crate::timeouts::effective_creation_timeout(machine, settings),
    )
}

/// Whether a bootstrap token Secret is for this machine (its description names the machine; a token id collision
/// with another machine's Secret is then detected instead of sharing the token).
pub fn token_secret_is_for_machine(secret: &Secret, machine_name: &str) -> bool {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(token_keys::DESCRIPTION))
        .is_some_and(|d| d.0 == token_description(machine_name).into_bytes())
}

/// Whether a bootstrap token Secret has expired at `now` (an unreadable expiry counts as expired; no expiry never
/// expires). An expired token cannot join a node: the controller replaces it.
pub fn token_secret_expired(secret: &Secret, now: Timestamp) -> bool {
    match secret.data.as_ref().and_then(|d| d.get(token_keys::EXPIRATION)) {
        None => false,
        Some(value) => std::str::from_utf8(&value.0)
            .ok()
            .and_then(|text| text.parse::<Timestamp>().ok())
            .is_none_or(|expiry| expiry <= now),
    }
}

/// Go's `url.QueryEscape`: every byte but `[A-Za-z0-9-_.~]` percent-encoded, space as `+`.
pub fn query_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(char::from(byte)),
            b' ' => out.push('+'),
            _ => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push('%');
                out.push(char::from(HEX[usize::from(byte >> 4)]));
                out.push(char::from(HEX[usize::from(byte & 0xf)]));
            }
        }
    }
    out
}

fn replace_all(haystack: &[u8], needle: &[u8], replacement: &[u8]) -> Vec<u8> {
    if needle.is_empty() {
        return haystack.to_vec();
    }
    let mut out = Vec::with_capacity(haystack.len());
    let mut rest = haystack;
    while let Some(position) = rest.windows(needle.len()).position(|w| w == needle) {
        out.extend_from_slice(&rest[..position]);
        out.extend_from_slice(replacement);
        rest = &rest[position + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// Whether the userData asks for a bootstrap token (plain or URL-encoded placeholder). The controller creates a
/// token only then (the reference creates one for every machine).
pub fn wants_bootstrap_token(user_data: &[u8]) -> bool {
    contains(user_data, user_data::BOOTSTRAP_TOKEN_PLACEHOLDER.as_bytes())
        || contains(
            user_data,
            query_escape(user_data::BOOTSTRAP_TOKEN_PLACEHOLDER).as_bytes(),
        )
}

/// The userData with its placeholders replaced. Works on bytes: a boot script need not be UTF-8. Without a token
/// the token placeholders stay as they are.
pub fn render_user_data(user_data: &[u8], machine_name: &str, token: Option<&BootstrapToken>) -> Vec<u8> {
    let mut out = replace_all(
        user_data,
        user_data::MACHINE_NAME_PLACEHOLDER.as_bytes(),
        machine_name.as_bytes(),
    );
    out = replace_all(
        &out,
        query_escape(user_data::MACHINE_NAME_PLACEHOLDER).as_bytes(),
        query_escape(machine_name).as_bytes(),
    );
    if let Some(token) = token {
        let value = token.expose();
        out = replace_all(
            &out,
            user_data::BOOTSTRAP_TOKEN_PLACEHOLDER.as_bytes(),
            value.as_bytes(),
        );
        out = replace_all(
            &out,
            query_escape(user_data::BOOTSTRAP_TOKEN_PLACEHOLDER).as_bytes(),
            query_escape(&value).as_bytes(),
        );
    }
    out
}

/// The class secret's data for a provider call: a copy with `userData` rendered for the machine. A missing
/// `userData` key is an error naming it.
pub fn render_secret_data(
    data: &BTreeMap<String, ByteString>,
    machine_name: &str,
    class_name: &str,
    token: Option<&BootstrapToken>,
) -> Result<BTreeMap<String, ByteString>, UserDataError> {
    let user_data = data
        .get(user_data::KEY)
        .ok_or_else(|| UserDataError::MissingUserData {
            machine: machine_name.to_owned(),
            class: class_name.to_owned(),
            key: user_data::KEY,
        })?;
    let mut out = data.clone();
    out.insert(
        user_data::KEY.to_owned(),
        ByteString(render_user_data(&user_data.0, machine_name, token)),
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    use super::*;

    fn token() -> BootstrapToken {
        BootstrapToken::from_parts("abc123", "0123456789abcdef").unwrap()
    }

    #[test]
    fn placeholders_are_replaced_plain_and_url_encoded() {
        let script = b"#!/bin/sh\nNAME=<<MACHINE_NAME>>\nTOKEN=<<BOOTSTRAP_TOKEN>>\n\
                       url=x?n=%3C%3CMACHINE_NAME%3E%3E&t=%3C%3CBOOTSTRAP_TOKEN%3E%3E\n";
        let rendered = render_user_data(script, "m-1", Some(&token()));
        assert_eq!(
            String::from_utf8(rendered).unwrap(),
            "#!/bin/sh\nNAME=m-1\nTOKEN=abc123.0123456789abcdef\nurl=x?n=m-1&t=abc123.0123456789abcdef\n"
        );
        assert_eq!(query_escape("<<BOOTSTRAP_TOKEN>>"), "%3C%3CBOOTSTRAP_TOKEN%3E%3E");
        assert_eq!(query_escape("a b/c"), "a+b%2Fc");
    }

    #[test]
    fn without_a_token_the_token_placeholder_stays() {
        let rendered = render_user_data(b"<<MACHINE_NAME>> <<BOOTSTRAP_TOKEN>>", "m", None);
        assert_eq!(rendered, b"m <<BOOTSTRAP_TOKEN>>");
        assert!(wants_bootstrap_token(b"x <<BOOTSTRAP_TOKEN>>"));
        assert!(wants_bootstrap_token(b"x %3C%3CBOOTSTRAP_TOKEN%3E%3E"));
        assert!(!wants_bootstrap_token(b"x <<MACHINE_NAME>>"));
    }

    #[test]
    fn non_utf8_user_data_is_templated_bytewise() {
        let mut script = vec![0xff, 0xfe];
        script.extend_from_slice(b"<<MACHINE_NAME>>");
        script.push(0x80);
        let rendered = render_user_data(&script, "m", None);
        assert_eq!(rendered, vec![0xff, 0xfe, b'm', 0x80]);
    }

    #[test]
    fn secret_data_is_copied_with_user_data_rendered() {
        let data = BTreeMap::from([
            ("userData".to_owned(), ByteString(b"n=<<MACHINE_NAME>>".to_vec())),
            ("apiKey".to_owned(), ByteString(b"k".to_vec())),
        ]);
        let out = render_secret_data(&data, "m-1", "class", None).unwrap();
        assert_eq!(out["userData"].0, b"n=m-1");
        assert_eq!(out["apiKey"].0, b"k");
        assert_eq!(
            data["userData"].0, b"n=<<MACHINE_NAME>>",
            "the input is not touched"
        );
    }

    #[test]
    fn a_missing_user_data_key_is_named_and_no_value_is_shown() {
        let data = BTreeMap::from([("password".to_owned(), ByteString(b"hunter2-very-secret".to_vec()))]);
        let error = render_secret_data(&data, "m-1", "class-a", None).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("\"userData\""), "{text}");
        assert!(text.contains("class-a") && text.contains("m-1"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!format!("{error:?}").contains("hunter2"));
    }

    #[test]
    fn tokens_have_the_kubernetes_format() {
        let random: Vec<u8> = (0..=255).collect();
        let t = BootstrapToken::from_random(&random).unwrap();
        let exposed = t.expose();
        let (id, secret) = exposed.split_once('.').unwrap();
        assert!(valid(id, 6) && valid(secret, 16), "{exposed}");
        assert_eq!(t.secret_name(), format!("bootstrap-token-{id}"));
        assert_eq!(
            BootstrapToken::from_random(&[0; 10]),
            Err(BootstrapTokenError::NotEnoughRandomness {
                usable: 10,
                needed: 22
            })
        );
        assert_eq!(
            BootstrapToken::from_random(&[255; 64]),
            Err(BootstrapTokenError::NotEnoughRandomness {
                usable: 0,
                needed: 22
            })
        );
        assert!(BootstrapToken::from_parts("ABC123", "0123456789abcdef").is_err());
        assert!(BootstrapToken::from_parts("abc123", "short").is_err());
    }

    #[test]
    fn token_errors_and_debug_never_show_the_secret() {
        let t = token();
        assert!(!format!("{t:?}").contains("0123456789abcdef"));
        let error = BootstrapToken::from_parts("abc123", "NOT-A-VALID-SECRET!").unwrap_err();
        assert!(!error.to_string().contains("NOT-A-VALID"));
    }

    #[test]
    fn a_machine_token_id_is_stable_and_spreads() {
        let a = bootstrap_token_id_for_machine("shoot--p--w-z1-5f9c8-abcde");
        assert_eq!(a, bootstrap_token_id_for_machine("shoot--p--w-z1-5f9c8-abcde"));
        assert!(valid(&a, 6));
        // The reference takes characters [len-5, len-2) of the name: these two would collide there.
        let b = bootstrap_token_id_for_machine("shoot--p--w-z1-11111-abcde");
        assert_ne!(a, b);
        assert!(valid(&bootstrap_token_id_for_machine(""), 6));
        let t = BootstrapToken::for_machine("m-1", &[7; 16]).unwrap();
        assert_eq!(t.id(), bootstrap_token_id_for_machine("m-1"));
        assert_eq!(t.secret_name(), bootstrap_token_secret_name_for_machine("m-1"));
    }

    #[test]
    fn the_token_secret_is_what_kubernetes_expects() {
        let expires = Timestamp::from_second(1_700_000_000).unwrap();
        let expires_with_fraction = expires
            .checked_add(std::time::Duration::from_millis(500))
            .unwrap();
        let secret = bootstrap_token_secret(&token(), "m-1", expires_with_fraction, "");
        assert_eq!(secret.metadata.name.as_deref(), Some("bootstrap-token-abc123"));
        assert_eq!(secret.metadata.namespace.as_deref(), Some("kube-system"));
        assert_eq!(secret.type_.as_deref(), Some("bootstrap.kubernetes.io/token"));
        let data = secret.data.clone().unwrap();
        let get = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
        assert_eq!(get("token-id"), "abc123");
        assert_eq!(get("token-secret"), "0123456789abcdef");
        assert_eq!(get("expiration"), "2023-11-14T22:13:20Z");
        assert_eq!(get("usage-bootstrap-authentication"), "true");
        assert_eq!(get("usage-bootstrap-signing"), "true");
        assert!(!data.contains_key("auth-extra-groups"));
        assert!(token_secret_is_for_machine(&secret, "m-1"));
        assert!(!token_secret_is_for_machine(&secret, "m-2"));
        assert_eq!(BootstrapToken::from_secret(&secret).unwrap(), token());
        assert!(!token_secret_expired(
            &secret,
            expires - jiff::SignedDuration::from_secs(1)
        ));
        assert!(token_secret_expired(&secret, expires));

        let with_groups = bootstrap_token_secret(&token(), "m-1", expires, "system:bootstrappers:worker");
        assert_eq!(
            with_groups.data.unwrap()["auth-extra-groups"].0,
            b"system:bootstrappers:worker"
        );
        let empty = Secret::default();
        assert!(matches!(
            BootstrapToken::from_secret(&empty),
            Err(BootstrapTokenError::MissingKey { key: "token-id", .. })
        ));
    }

    #[test]
    fn the_expiry_is_now_plus_the_creation_timeout() {
        let machine = mcm_api::Machine::default();
        let now = Timestamp::from_second(1_000).unwrap();
        assert_eq!(
            token_expiry(&machine, &crate::ControllerSettings::default(), now),
            Timestamp::from_second(1_000 + 20 * 60).unwrap()
        );
    }

    proptest! {
        #[test]
        fn rendering_never_panics_and_leaves_no_placeholder(
            prefix in proptest::collection::vec(any::<u8>(), 0..40),
            suffix in "[a-z<>%]{0,20}",
            name in "[a-z0-9][a-z0-9.-]{0,20}",
            random in proptest::collection::vec(any::<u8>(), 64),
        ) {
            let mut script = prefix;
            script.extend_from_slice(b"<<BOOTSTRAP_TOKEN>>");
            script.extend_from_slice(suffix.as_bytes());
            script.extend_from_slice(b"%3C%3CMACHINE_NAME%3E%3E");
            let token = BootstrapToken::from_random(&random);
            if let Ok(token) = token {
                let rendered = render_user_data(&script, &name, Some(&token));
                for placeholder in ["<<BOOTSTRAP_TOKEN>>", "<<MACHINE_NAME>>"] {
                    prop_assert!(!contains(&rendered, placeholder.as_bytes()));
                    prop_assert!(!contains(&rendered, query_escape(placeholder).as_bytes()));
                }
                prop_assert!(contains(&rendered, token.expose().as_bytes()));
                prop_assert!(contains(&rendered, name.as_bytes()));
            }
        }
    }
}
