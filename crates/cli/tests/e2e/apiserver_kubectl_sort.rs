//! End to end: `kubectl get --sort-by` against the real `mcm apiserver`. kubectl sorts a server-printed Table by
//! reading the field from each row's object, which it asks for with `includeObject=Object`; rows that carried only
//! metadata made any `--sort-by` outside `.metadata` print "No resources found".

use crate::support;

use support::{Server, arg};

/// The word in `column` of each data row of a `kubectl get` table, top to bottom.
fn column(out: &str, column: &str) -> Vec<String> {
    let mut lines = out.lines();
    let header = lines.next().unwrap_or_else(|| panic!("no table in {out:?}"));
    let start = header
        .find(column)
        .unwrap_or_else(|| panic!("no column {column} in {header:?}"));
    lines
        .map(|row| {
            row.get(start..)
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

fn event_yaml(name: &str, last_seen: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Event\nmetadata:\n  name: {name}\n  namespace: default\ninvolvedObject:\n  kind: \
         Machine\n  apiVersion: machine.sapcloud.io/v1alpha1\n  name: m\n  namespace: default\nreason: Test\nmessage: \
         {name}\ntype: Normal\nsource:\n  component: test\nfirstTimestamp: \"{last_seen}\"\nlastTimestamp: \
         \"{last_seen}\"\ncount: 1\n---\n"
    )
}

fn deployment_yaml(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: machine.sapcloud.io/v1alpha1\nkind: MachineDeployment\nmetadata:\n  name: {name}\n  namespace: \
         default\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels:\n      name: {name}\n  template:\n    \
         metadata:\n      labels:\n        name: {name}\n    spec:\n      class:\n        kind: MachineClass\n        \
         name: local-small\n---\n"
    )
}

#[test]
fn get_sort_by_a_field_outside_metadata_lists_every_object_in_order() {
    let server = Server::start("sort-by");
    // Names in another order than the sort key, so a list in name order fails the test.
    let events: String = [
        ("a-late", "2026-11-22T11:00:00Z"),
        ("b-early", "2026-11-22T09:00:00Z"),
        ("c-middle", "2026-11-22T10:00:00Z"),
    ]
    .iter()
    .map(|(name, at)| event_yaml(name, at))
    .collect();
    let deployments: String = [("mcd-a", 3), ("mcd-b", 1), ("mcd-c", 2)]
        .iter()
        .map(|(name, replicas)| deployment_yaml(name, *replicas))
        .collect();
    let manifest = server.write("objects.yaml", &(events + &deployments));
    server.kubectl_ok(&["create", "-f", arg(&manifest)]);

    let out = server.kubectl_ok(&["get", "events", "--sort-by=.lastTimestamp"]);
    assert_eq!(
        column(&out, "MESSAGE"),
        ["b-early", "c-middle", "a-late"],
        "events by last seen:\n{out}"
    );
    let out = server.kubectl_ok(&["get", "machinedeployments", "--sort-by=.spec.replicas"]);
    assert_eq!(
        column(&out, "NAME"),
        ["mcd-b", "mcd-c", "mcd-a"],
        "deployments by replicas:\n{out}"
    );
    // Sorting on metadata and custom columns work as before.
    let out = server.kubectl_ok(&["get", "machinedeployments", "--sort-by=.metadata.name"]);
    assert_eq!(column(&out, "NAME"), ["mcd-a", "mcd-b", "mcd-c"], "{out}");
    let out = server.kubectl_ok(&[
        "get",
        "machinedeployments",
        "--sort-by=.spec.replicas",
        "-o",
        "custom-columns=NAME:.metadata.name,REPLICAS:.spec.replicas",
    ]);
    assert_eq!(column(&out, "REPLICAS"), ["1", "2", "3"], "{out}");
}
