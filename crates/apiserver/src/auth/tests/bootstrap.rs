//! Bootstrap tokens: the user a token Secret grants, every rule that refuses one, and the token's shape.

use base64::Engine as _;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::bootstrap;
use crate::auth::{BOOTSTRAP_TOKEN_SECRET_TYPE, bootstrap::split_bootstrap_token, bootstrap_user};

fn token_secret(data: &[(&str, &str)]) -> Value {
    let encode = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(encode(v))))
        .collect();
    json!({
        "metadata": { "name": "bootstrap-token-abcdef", "namespace": "kube-system" },
        "type": BOOTSTRAP_TOKEN_SECRET_TYPE,
        "data": data,
    })
}

const VALID: &[(&str, &str)] = &[
    ("token-id", "abcdef"),
    ("token-secret", "0123456789abcdef"),
    ("usage-bootstrap-authentication", "true"),
];

#[test]
fn a_valid_bootstrap_token_is_a_bootstrapper_with_its_extra_groups() {
    let now = jiff::Timestamp::now();
    let user = bootstrap_user(&token_secret(VALID), "abcdef", "0123456789abcdef", now).unwrap();
    assert_eq!(user, bootstrap());

    let mut data = VALID.to_vec();
    data.push((
        "auth-extra-groups",
        "system:bootstrappers:kubeadm:default-node-token, system:bootstrappers:w",
    ));
    data.push(("expiration", "2999-01-01T00:00:00Z"));
    let user = bootstrap_user(&token_secret(&data), "abcdef", "0123456789abcdef", now).unwrap();
    assert_eq!(
        user.groups,
        [
            "system:bootstrappers",
            "system:bootstrappers:kubeadm:default-node-token",
            "system:bootstrappers:w"
        ]
    );
}

#[test]
fn a_bootstrap_token_is_refused_when_any_rule_fails() {
    let now = jiff::Timestamp::now();
    let refused = |data: &[(&str, &str)], secret: &str| {
        bootstrap_user(&token_secret(data), "abcdef", secret, now).is_err()
    };
    let with = |key: &'static str, value: &'static str| {
        let mut data: Vec<(&str, &str)> = VALID.iter().filter(|(k, _)| *k != key).copied().collect();
        data.push((key, value));
        data
    };
    let without = |key: &str| {
        VALID
            .iter()
            .filter(|(k, _)| *k != key)
            .copied()
            .collect::<Vec<_>>()
    };
    assert!(refused(VALID, "0123456789abcdee"), "wrong secret");
    assert!(
        refused(&with("token-id", "abcdeg"), "0123456789abcdef"),
        "other id"
    );
    assert!(refused(
        &with("usage-bootstrap-authentication", "false"),
        "0123456789abcdef"
    ));
    assert!(refused(
        &without("usage-bootstrap-authentication"),
        "0123456789abcdef"
    ));
    assert!(refused(&without("token-secret"), "0123456789abcdef"));
    assert!(
        refused(&with("expiration", "2000-01-01T00:00:00Z"), "0123456789abcdef"),
        "expired"
    );
    assert!(
        refused(&with("expiration", "tomorrow"), "0123456789abcdef"),
        "unreadable expiry"
    );
    assert!(refused(
        &with("auth-extra-groups", "system:masters"),
        "0123456789abcdef"
    ));
    assert!(refused(
        &with("auth-extra-groups", "system:bootstrappers:"),
        "0123456789abcdef"
    ));

    let mut wrong_type = token_secret(VALID);
    wrong_type["type"] = json!("Opaque");
    assert!(bootstrap_user(&wrong_type, "abcdef", "0123456789abcdef", now).is_err());
    let mut deleting = token_secret(VALID);
    deleting["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
    assert!(bootstrap_user(&deleting, "abcdef", "0123456789abcdef", now).is_err());
}

#[test]
fn bootstrap_tokens_have_the_kubernetes_shape() {
    assert_eq!(
        split_bootstrap_token("abcdef.0123456789abcdef"),
        Some(("abcdef", "0123456789abcdef"))
    );
    for bad in [
        "abcdef0123456789abcdef",
        "abcde.0123456789abcdef",
        "ABCDEF.0123456789abcdef",
        "abcdef.0123456789abcde",
        "abcdef.0123456789abcdef.x",
        "abcdef.0123456789abcdeF",
        "",
    ] {
        assert_eq!(split_bootstrap_token(bad), None, "{bad}");
    }
}
