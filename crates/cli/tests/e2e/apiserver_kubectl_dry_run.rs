//! End to end: `kubectl apply --dry-run=server`, `kubectl diff` and `kubectl delete --dry-run=server` against the
//! real `mcm apiserver`: the server answers what the write would do and stores nothing.

use crate::support;

use support::{Server, arg, example};

/// The resourceVersion of the whole store, as a list of machine classes reports it.
fn store_rv(server: &Server) -> String {
    server.kubectl_ok(&[
        "get",
        "machineclasses",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ])
}

#[test]
fn kubectl_apply_dry_run_server_and_diff_show_the_change_and_store_nothing() {
    let server = Server::start("dry-run");
    let class = example("01-machine-class.yaml");
    let before = store_rv(&server);

    let out = server.kubectl_ok(&["apply", "--dry-run=server", "-f", arg(&class)]);
    assert_eq!(
        out.trim(),
        "machineclass.machine.sapcloud.io/local-small created (server dry run)"
    );
    assert!(
        !server
            .kubectl(&["get", "machineclass", "local-small"])
            .status
            .success(),
        "not created"
    );
    assert_eq!(store_rv(&server), before, "nothing written");

    // diff of an object not there yet: all of it is new (exit 1 = differences found).
    let diff = server.kubectl(&["diff", "-f", arg(&class)]);
    assert_eq!(diff.status.code(), Some(1), "{diff:?}");
    assert!(
        String::from_utf8_lossy(&diff.stdout).contains("+  name: local-small"),
        "{diff:?}"
    );

    server.kubectl_ok(&["apply", "-f", arg(&class)]);
    let diff = server.kubectl(&["diff", "-f", arg(&class)]);
    assert_eq!(
        diff.status.code(),
        Some(0),
        "no difference once applied: {diff:?}"
    );
    let changed = std::fs::read_to_string(&class)
        .unwrap()
        .replace("size: small", "size: large");
    let changed = server.write("changed.yaml", &changed);
    let applied = store_rv(&server);
    let diff = server.kubectl(&["diff", "-f", arg(&changed)]);
    let text = String::from_utf8_lossy(&diff.stdout);
    assert_eq!(diff.status.code(), Some(1), "{diff:?}");
    assert!(
        text.contains("-  size: small") && text.contains("+  size: large"),
        "{text}"
    );
    assert_eq!(store_rv(&server), applied, "diff writes nothing");

    let out = server.kubectl_ok(&["delete", "--dry-run=server", "machineclass", "local-small"]);
    assert_eq!(
        out.trim(),
        "machineclass.machine.sapcloud.io \"local-small\" deleted (server dry run)"
    );
    server.kubectl_ok(&["get", "machineclass", "local-small"]);
    assert_eq!(store_rv(&server), applied, "nothing deleted");
}
