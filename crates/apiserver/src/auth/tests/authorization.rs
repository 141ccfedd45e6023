//! What each kind of user may do, the 403 it gets otherwise, and the verb and name of a request.

use http::Method;
use pretty_assertions::assert_eq;
use serde_json::json;

use super::{
    CSRS, LEASE_NS, LEASES, NODE_STATUS, NODES, POD_STATUS, PODS, SECRETS, User, admin, bootstrap, def, may,
    node, user,
};
use crate::auth::{authorize, request_name, verb_of};

#[test]
fn the_admin_may_do_everything() {
    let admin = admin();
    for verb in [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ] {
        assert!(may(&admin, verb, SECRETS, Some("kube-system"), Some("x"), None));
        assert!(may(
            &admin,
            verb,
            ("machine.sapcloud.io", "machines", None),
            Some("default"),
            None,
            None
        ));
    }
    assert!(may(
        &admin,
        "update",
        (
            "certificates.k8s.io",
            "certificatesigningrequests",
            Some("approval")
        ),
        None,
        Some("c"),
        None
    ));
}

#[test]
fn a_node_reads_nodes_pods_and_volumes_but_not_secrets_or_machines() {
    let n1 = node("n1");
    for resource in [
        NODES,
        NODE_STATUS,
        PODS,
        ("", "persistentvolumes", None),
        ("", "persistentvolumeclaims", None),
        ("storage.k8s.io", "volumeattachments", None),
    ] {
        for verb in ["get", "list", "watch"] {
            let name = (verb == "get").then_some("x");
            assert!(
                may(&n1, verb, resource, Some("default"), name, None),
                "{verb} {resource:?}"
            );
        }
    }
    for verb in ["get", "list", "watch", "create", "delete"] {
        assert!(!may(
            &n1,
            verb,
            SECRETS,
            Some("kube-system"),
            Some("bootstrap-token-abcdef"),
            None
        ));
        assert!(!may(
            &n1,
            verb,
            ("machine.sapcloud.io", "machines", None),
            Some("default"),
            Some("m"),
            None
        ));
        assert!(!may(
            &n1,
            verb,
            ("", "namespaces", None),
            None,
            Some("default"),
            None
        ));
    }
    assert!(!may(
        &n1,
        "create",
        ("", "persistentvolumes", None),
        None,
        Some("pv"),
        None
    ));
    assert!(!may(
        &n1,
        "delete",
        ("storage.k8s.io", "volumeattachments", None),
        None,
        Some("va"),
        None
    ));
}

#[test]
fn a_node_creates_and_changes_only_its_own_node() {
    let n1 = node("n1");
    for (verb, resource) in [
        ("create", NODES),
        ("update", NODES),
        ("patch", NODES),
        ("update", NODE_STATUS),
        ("patch", NODE_STATUS),
    ] {
        assert!(
            may(&n1, verb, resource, None, Some("n1"), None),
            "{verb} {resource:?} n1"
        );
        assert!(
            !may(&n1, verb, resource, None, Some("n2"), None),
            "{verb} {resource:?} n2"
        );
    }
    assert!(
        !may(&n1, "create", NODES, None, None, None),
        "a node without a name"
    );
    assert!(!may(&n1, "delete", NODES, None, Some("n1"), None));
    assert!(!may(&n1, "deletecollection", NODES, None, None, None));
}

#[test]
fn a_node_uses_only_its_own_lease_in_kube_node_lease() {
    let n1 = node("n1");
    for verb in ["create", "get", "update", "patch", "delete"] {
        assert!(may(&n1, verb, LEASES, LEASE_NS, Some("n1"), None), "{verb} n1");
    }
    for verb in ["create", "update", "patch", "delete"] {
        assert!(!may(&n1, verb, LEASES, LEASE_NS, Some("n2"), None), "{verb} n2");
    }
    assert!(may(&n1, "get", LEASES, LEASE_NS, Some("n2"), None));
    assert!(may(&n1, "list", LEASES, LEASE_NS, None, None));
    assert!(
        !may(&n1, "list", LEASES, None, None, None),
        "leases of all namespaces"
    );
    assert!(!may(&n1, "get", LEASES, Some("kube-system"), Some("n1"), None));
    assert!(!may(&n1, "create", LEASES, Some("default"), Some("n1"), None));
    assert!(!may(&n1, "deletecollection", LEASES, LEASE_NS, None, None));
}

#[test]
fn a_node_changes_the_status_of_and_deletes_only_pods_bound_to_it() {
    let n1 = node("n1");
    let mine = json!({ "spec": { "nodeName": "n1" } });
    let theirs = json!({ "spec": { "nodeName": "n2" } });
    let unbound = json!({ "spec": {} });
    for (verb, resource) in [("update", POD_STATUS), ("patch", POD_STATUS), ("delete", PODS)] {
        assert!(
            may(&n1, verb, resource, Some("default"), Some("p"), Some(&mine)),
            "{verb}"
        );
        assert!(
            !may(&n1, verb, resource, Some("default"), Some("p"), Some(&theirs)),
            "{verb}"
        );
        assert!(
            !may(&n1, verb, resource, Some("default"), Some("p"), Some(&unbound)),
            "{verb}"
        );
        assert!(
            !may(&n1, verb, resource, Some("default"), Some("p"), None),
            "{verb} missing"
        );
    }
    for verb in ["create", "update", "patch"] {
        assert!(
            !may(&n1, verb, PODS, Some("default"), Some("p"), Some(&mine)),
            "{verb} pod spec"
        );
    }
    assert!(!may(
        &n1,
        "create",
        ("", "pods", Some("eviction")),
        Some("default"),
        Some("p"),
        Some(&mine)
    ));
    assert!(!may(&n1, "deletecollection", PODS, Some("default"), None, None));
}

#[test]
fn a_node_records_events_anywhere() {
    let n1 = node("n1");
    for group in ["", "events.k8s.io"] {
        for ns in ["default", "kube-system"] {
            assert!(may(
                &n1,
                "create",
                (group, "events", None),
                Some(ns),
                Some("e"),
                None
            ));
            assert!(may(
                &n1,
                "patch",
                (group, "events", None),
                Some(ns),
                Some("e"),
                None
            ));
        }
        assert!(!may(
            &n1,
            "delete",
            (group, "events", None),
            Some("default"),
            Some("e"),
            None
        ));
    }
}

#[test]
fn nodes_and_bootstrap_tokens_create_csrs_and_read_only_their_own() {
    let own = |user: &User| json!({ "spec": { "username": user.name } });
    let other = json!({ "spec": { "username": "system:bootstrap:zzzzzz" } });
    for user in [node("n1"), bootstrap()] {
        assert!(may(&user, "create", CSRS, None, None, None));
        for verb in ["get", "list", "watch"] {
            assert!(
                may(&user, verb, CSRS, None, Some("c"), Some(&own(&user))),
                "{verb}"
            );
            assert!(!may(&user, verb, CSRS, None, Some("c"), Some(&other)), "{verb}");
            assert!(!may(&user, verb, CSRS, None, Some("c"), None), "{verb} missing");
        }
        assert!(!may(&user, "list", CSRS, None, None, None), "every CSR");
        for (verb, sub) in [
            ("update", None),
            ("patch", None),
            ("delete", None),
            ("update", Some("approval")),
            ("patch", Some("status")),
        ] {
            let resource = ("certificates.k8s.io", "certificatesigningrequests", sub);
            assert!(
                !may(&user, verb, resource, None, Some("c"), Some(&own(&user))),
                "{verb} {sub:?}"
            );
        }
    }
}

#[test]
fn a_bootstrap_token_may_do_nothing_else() {
    let b = bootstrap();
    for verb in ["get", "list", "create"] {
        assert!(!may(&b, verb, SECRETS, Some("kube-system"), None, None));
        assert!(!may(&b, verb, NODES, None, Some("n1"), None));
        assert!(!may(&b, verb, LEASES, LEASE_NS, Some("n1"), None));
    }
}

#[test]
fn other_users_may_do_nothing_and_a_node_name_needs_the_nodes_group() {
    for stranger in [
        user("system:node:n1", &[]),
        user("mcm-apiserver", &[]),
        user("someone", &["system:authenticated"]),
    ] {
        assert!(
            !may(&stranger, "get", NODES, None, Some("n1"), None),
            "{stranger:?}"
        );
        assert!(!may(&stranger, "create", CSRS, None, None, None), "{stranger:?}");
    }
}

#[test]
fn forbidden_is_worded_and_detailed_as_kubernetes_does() {
    let error = authorize(
        &node("n1"),
        "patch",
        &def("", "nodes"),
        None,
        Some("n2"),
        None,
        None,
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "nodes \"n2\" is forbidden: User \"system:node:n1\" cannot patch resource \"nodes\" in API group \"\" at \
         the cluster scope: a node may only create and change its own Node"
    );
    let status = error.to_status();
    assert_eq!(status["code"], 403);
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(status["details"], json!({ "name": "n2", "kind": "nodes" }));

    let error = authorize(
        &node("n1"),
        "list",
        &def("", "secrets"),
        Some("kube-system"),
        None,
        None,
        None,
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "secrets is forbidden: User \"system:node:n1\" cannot list resource \"secrets\" in API group \"\" in the \
         namespace \"kube-system\""
    );
    let error = authorize(
        &node("n1"),
        "update",
        &def("coordination.k8s.io", "leases"),
        LEASE_NS,
        Some("n2"),
        None,
        None,
    )
    .unwrap_err();
    assert_eq!(
        error.to_status()["details"],
        json!({ "name": "n2", "group": "coordination.k8s.io", "kind": "leases" })
    );
    assert!(error.to_string().starts_with(
        "leases.coordination.k8s.io \"n2\" is forbidden: User \"system:node:n1\" cannot update resource \
         \"leases\" in API group \"coordination.k8s.io\" in the namespace \"kube-node-lease\""
    ));
    let error = authorize(
        &node("n1"),
        "patch",
        &def("", "pods"),
        Some("default"),
        Some("p"),
        Some("status"),
        None,
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("cannot patch resource \"pods/status\""),
        "{error}"
    );
}

#[test]
fn verbs_and_the_name_of_a_request() {
    assert_eq!(verb_of(&Method::GET, true, false), "get");
    assert_eq!(verb_of(&Method::GET, false, false), "list");
    assert_eq!(verb_of(&Method::GET, false, true), "watch");
    assert_eq!(verb_of(&Method::POST, false, false), "create");
    assert_eq!(verb_of(&Method::PUT, true, false), "update");
    assert_eq!(verb_of(&Method::PATCH, true, false), "patch");
    assert_eq!(verb_of(&Method::DELETE, true, false), "delete");
    assert_eq!(verb_of(&Method::DELETE, false, false), "deletecollection");

    assert_eq!(request_name("get", Some("a"), Some("metadata.name=b")), Some("a"));
    assert_eq!(request_name("watch", None, Some("metadata.name=b")), Some("b"));
    assert_eq!(
        request_name("list", None, Some("spec.x=y,metadata.name==c")),
        Some("c")
    );
    assert_eq!(request_name("list", None, Some("metadata.name!=b")), None);
    assert_eq!(request_name("list", None, Some("metadata.namespace=b")), None);
    assert_eq!(request_name("list", None, None), None);
    assert_eq!(
        request_name("deletecollection", None, Some("metadata.name=b")),
        None
    );
}
