//! End to end: `kubectl apply -f crd.yaml`, then the custom resources it defines, against the real
//! `mcm apiserver` binary with the real `kubectl` (v1.32), as a user of `mcm up` applies Cluster API's CRDs.

use crate::support;

use std::path::PathBuf;

use serde_json::json;
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
    assert!(
        crds.lines()
            .any(|l| l == "customresourcedefinition.apiextensions.k8s.io/clusters.cluster.x-k8s.io"),
        "{crds}"
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

fn machine_yaml(name: &str) -> String {
    format!(
        "apiVersion: machine.sapcloud.io/v1alpha1\nkind: Machine\nmetadata:\n  name: {name}\nspec:\n  class:\n    \
         kind: MachineClass\n    name: small\n  bootProfile: fast\n"
    )
}

/// The machine kinds are CRDs from the start (`kubectl get crd`); applying a variant of the Machine CRD that adds a
/// field takes effect (a Machine kubectl refused for that field is now stored with it); deleting the MachineClass CRD stops serving machine classes, as on
/// a real cluster.
#[test]
fn kubectl_sees_the_machine_kinds_as_crds_it_can_replace_and_delete() {
    let server = Server::start("machine-crds-kubectl");
    let crds = server.kubectl_ok(&["get", "crd", "-o", "name"]);
    for plural in ["machineclasses", "machines", "machinesets", "machinedeployments"] {
        let line = format!("customresourcedefinition.apiextensions.k8s.io/{plural}.machine.sapcloud.io");
        assert!(crds.lines().any(|l| l == line), "{line} in {crds}");
    }
    assert!(
        crds.contains("mcmmachines.infrastructure.machine.sapcloud.io"),
        "the Cluster API kinds of `mcm crds` too: {crds}"
    );

    // Our CRD does not declare the field: kubectl's strict field validation refuses it.
    let before = server.write("before.yaml", &machine_yaml("before"));
    let err = server.kubectl_err(&["apply", "-f", arg(&before)]);
    assert!(err.contains("unknown field \"spec.bootProfile\""), "{err}");

    let mut variant = serde_json::to_value(mcm_api::crd::machine().unwrap()).unwrap();
    variant["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["bootProfile"] =
        json!({ "type": "string" });
    let file = server.write("machine-crd.json", &variant.to_string());
    let out = server.kubectl_ok(&["apply", "-f", arg(&file)]);
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io/machines.machine.sapcloud.io configured"
    );
    let after = server.write("after.yaml", &machine_yaml("after"));
    let out = server.kubectl_ok(&["apply", "-f", arg(&after)]);
    assert_eq!(out.trim(), "machine.machine.sapcloud.io/after created");
    let stored = server.kubectl_ok(&["get", "mc", "after", "-o", "jsonpath={.spec.bootProfile}"]);
    assert_eq!(stored, "fast", "stored under the replaced CRD");

    let out = server.kubectl_ok(&["delete", "crd", "machineclasses.machine.sapcloud.io"]);
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io \"machineclasses.machine.sapcloud.io\" deleted"
    );
    // With its discovery cache still listing machineclasses, kubectl asks and gets 404, as from kube-apiserver;
    // with a fresh cache (or after 6 hours) it knows no such resource type.
    let err = server.kubectl_err(&["get", "machineclasses"]);
    assert!(
        err.contains("the server could not find the requested resource"),
        "{err}"
    );
    let fresh = support::kubectl_at(
        &server.kubeconfig(),
        &server.data_dir().join("fresh-cache"),
        &["get", "machineclasses"],
    );
    let err = String::from_utf8_lossy(&fresh.stderr);
    assert!(
        !fresh.status.success() && err.contains("the server doesn't have a resource type \"machineclasses\""),
        "{fresh:?}"
    );
    let machines = server.kubectl_ok(&["get", "machines", "-o", "name"]);
    assert_eq!(
        machines.lines().collect::<Vec<_>>(),
        ["machine.machine.sapcloud.io/after"],
        "the other machine kinds stay"
    );
}
