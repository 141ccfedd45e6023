//! The admin token, the authenticator chain and the user of a client certificate.

use pretty_assertions::assert_eq;

use super::{admin, node};
use crate::auth::{ADMIN_GROUP, AdminToken, Authenticator as _, Authenticators, user_from_certificate};

#[test]
fn the_admin_token_and_the_chain() {
    let chain = Authenticators(vec![Box::new(AdminToken("s3cret".into()))]);
    assert_eq!(chain.authenticate("s3cret"), Some(admin()));
    assert_eq!(chain.authenticate("s3cre"), None);
    assert_eq!(chain.authenticate(""), None);
}

#[test]
fn a_certificate_user_is_cn_and_o_without_system_masters() {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::CommonName, "system:node:n1");
    name.push(rcgen::DnType::OrganizationName, "system:nodes");
    name.push(rcgen::DnType::CustomDnType(vec![2, 5, 4, 10]), ADMIN_GROUP);
    params.distinguished_name = name;
    let certificate = params.self_signed(&key).unwrap();
    let user = user_from_certificate(certificate.der()).unwrap();
    assert_eq!(user, node("n1"));
    assert_eq!(user.node_name(), Some("n1"));
    assert!(!user.is_admin());
    assert_eq!(user_from_certificate(b"junk"), None);
}
