//! The static token file: records as kube-apiserver reads them, malformed files refused without the token, and
//! its users authorized by their groups.

use pretty_assertions::assert_eq;

use super::{NODES, may, user};
use crate::auth::{ADMIN_GROUP, Authenticator as _, TokenFile};

#[test]
fn a_token_file_record_is_token_user_uid_and_groups_as_kube_apiserver_reads_it() {
    let file = TokenFile::parse(concat!(
        "t0k3n-a,system:serviceaccount:mcm:mcm,uid-1,\"system:masters,team-a\"\n",
        "\n",
        "t0k3n-b,bob,uid-2\r\n",
        "t0k3n-c,\"carol, the \"\"admin\"\"\",uid-3,\"g1,,g2\",ignored-extra\n",
        "t0k3n-d,dave,uid-4,",
    ))
    .unwrap();
    assert_eq!(
        file.authenticate("t0k3n-a"),
        Some(user("system:serviceaccount:mcm:mcm", &[ADMIN_GROUP, "team-a"]))
    );
    assert!(file.authenticate("t0k3n-a").unwrap().is_admin());
    assert_eq!(file.authenticate("t0k3n-b"), Some(user("bob", &[])));
    assert!(!file.authenticate("t0k3n-b").unwrap().is_admin());
    assert_eq!(
        file.authenticate("t0k3n-c"),
        Some(user("carol, the \"admin\"", &["g1", "g2"]))
    );
    assert_eq!(file.authenticate("t0k3n-d"), Some(user("dave", &[])));
    for wrong in ["t0k3n", "t0k3n-a ", "T0K3N-A", ""] {
        assert_eq!(file.authenticate(wrong), None, "{wrong:?}");
    }
    assert_eq!(file.users().count(), 4);
}

#[test]
fn a_token_file_skips_empty_tokens_and_the_later_duplicate_wins() {
    let file = TokenFile::parse(",nobody,uid-0\nsame,first,1\nsame,second,2,g\n").unwrap();
    assert_eq!(file.authenticate("same"), Some(user("second", &["g"])));
    assert_eq!(file.authenticate(""), None);
    assert_eq!(file.users().count(), 1);
    // A quoted field may span lines: the next record starts after it.
    let file = TokenFile::parse("a,\"multi\nline\",u\nb,next,u\n").unwrap();
    assert_eq!(file.authenticate("a").unwrap().name, "multi\nline");
    assert_eq!(file.authenticate("b").unwrap().name, "next");
}

#[test]
fn a_malformed_token_file_is_refused_naming_the_line_and_never_the_token() {
    for (text, line, why) in [
        ("s3cret-1,alice\n", "line 1", "at least 3 columns"),
        ("s3cret-1,alice,u\n# comment\n", "line 2", "at least 3 columns"),
        ("s3cret-1,alice,u\ns3cret-2,,u\n", "line 2", "user name is empty"),
        ("s3cret-1,al\"ice,u\n", "line 1", "bare \""),
        ("s3cret-1,\"alice\"x,u\n", "line 1", "extraneous"),
        ("s3cret-1,alice,u\ns3cret-2,\"bob,u\n", "line 2", "not closed"),
    ] {
        let error = TokenFile::parse(text).unwrap_err();
        assert!(error.contains(line) && error.contains(why), "{text:?}: {error}");
        assert!(!error.contains("s3cret"), "{error}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.csv");
    std::fs::write(&path, "s3cret-1,alice\n").unwrap();
    let error = TokenFile::load(&path).unwrap_err().to_string();
    assert!(
        error.contains("tokens.csv") && error.contains("line 1"),
        "{error}"
    );
    assert!(!error.contains("s3cret"), "{error}");
    assert!(TokenFile::load(&dir.path().join("missing.csv")).is_err());
    let file = TokenFile::parse("s3cret-1,alice,u\n").unwrap();
    assert!(!format!("{file:?}").contains("s3cret"), "{file:?}");
}

#[test]
fn token_file_users_are_authorized_by_their_groups() {
    let file = TokenFile::parse("a,mcm,u,system:masters\nb,viewer,u,team\nc,system:node:n1,u,system:nodes\n")
        .unwrap();
    let mcm = file.authenticate("a").unwrap();
    assert!(may(&mcm, "delete", NODES, None, Some("n2"), None));
    let viewer = file.authenticate("b").unwrap();
    assert!(!may(&viewer, "get", NODES, None, Some("n1"), None));
    let node = file.authenticate("c").unwrap();
    assert_eq!(node.node_name(), Some("n1"));
    assert!(may(&node, "get", NODES, None, Some("n2"), None));
    assert!(!may(&node, "patch", NODES, None, Some("n2"), None));
}
