//! End to end: `kubectl apply -f crd.yaml`, then the custom resources it defines, against the real
//! `mcm apiserver` binary with the real `kubectl` (v1.32), as a user of `mcm up` applies Cluster API's CRDs.

mod support;

use std::path::PathBuf;

use support::{Server, arg};

fn cluster_crd() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../apiserver/tests/fixtures/cluster-crd.yaml")
}

fn cluster_yaml(name: &str, version: &str) -> String {
    format!(
        "apiVersion: cluster.x-k8s.io/v1beta2\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  topology:\n    \
         version: {version}\n"
    )
}

#[test]
fn kubectl_apply_crd_then_get_apply_and_delete_its_custom_resources() {
    let server = Server::start("crds-kubectl");
    let crd = cluster_crd();
    let out = server.kubectl_ok(&["apply", "-f", arg(&crd)]);
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io/clusters.cluster.x-k8s.io created"
    );
    let out = server.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd/clusters.cluster.x-k8s.io",
        "--timeout=20s",
    ]);
    assert!(out.contains("condition met"), "{out}");
    let none = server.kubectl(&["get", "clusters"]);
    assert!(none.status.success(), "{none:?}");
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("No resources found in default namespace."),
        "{none:?}"
    );

    let file = server.write("cluster.yaml", &cluster_yaml("demo", "v1.32.0"));
    let out = server.kubectl_ok(&["apply", "-f", arg(&file)]);
    assert_eq!(out.trim(), "cluster.cluster.x-k8s.io/demo created");
    let out = server.kubectl_ok(&["apply", "-f", arg(&file)]);
    assert_eq!(out.trim(), "cluster.cluster.x-k8s.io/demo unchanged");
    server.write("cluster.yaml", &cluster_yaml("demo", "v1.33.0"));
    let out = server.kubectl_ok(&["apply", "-f", arg(&file)]);
    assert_eq!(out.trim(), "cluster.cluster.x-k8s.io/demo configured");

    // The printer columns, by short name and by category; -o wide adds the priority-1 column.
    let table = server.kubectl_ok(&["get", "cl"]);
    let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["NAME", "VERSION", "PHASE", "AGE"], "{table}");
    assert_eq!(&lines[1][..2], ["demo", "v1.33.0"], "{table}");
    let wide = server.kubectl_ok(&["get", "clusters", "-o", "wide"]);
    assert!(
        wide.lines().next().unwrap_or_default().contains("PAUSED"),
        "{wide}"
    );
    assert!(wide.contains("false"), "the default of spec.paused: {wide}");
    let by_category = server.kubectl_ok(&["get", "cluster-api", "-o", "name"]);
    assert_eq!(by_category.trim(), "cluster.cluster.x-k8s.io/demo");
    let old_version = server.kubectl_ok(&[
        "get",
        "clusters.v1beta1.cluster.x-k8s.io",
        "demo",
        "-o",
        "jsonpath={.apiVersion}",
    ]);
    assert_eq!(old_version, "cluster.x-k8s.io/v1beta1");
    let explained = server.kubectl_ok(&["explain", "clusters.spec.paused"]);
    assert!(explained.contains("Paused can be used"), "{explained}");

    // CRDs are listed like any resource; re-applying the same file changes nothing.
    let crds = server.kubectl_ok(&["get", "crds", "-o", "name"]);
    assert_eq!(
        crds.trim(),
        "customresourcedefinition.apiextensions.k8s.io/clusters.cluster.x-k8s.io"
    );
    let out = server.kubectl_ok(&["apply", "-f", arg(&crd)]);
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io/clusters.cluster.x-k8s.io unchanged"
    );

    // Deleting the CRD deletes its objects and the resource type.
    let out = server.kubectl_ok(&["delete", "-f", arg(&crd)]);
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io \"clusters.cluster.x-k8s.io\" deleted"
    );
    let err = server.kubectl_err(&["get", "clusters.cluster.x-k8s.io"]);
    assert!(err.contains("the server doesn't have a resource type"), "{err}");
}
