//! End to end: `kubectl apply --server-side` (v1.32) against the real `mcm apiserver` binary: a Secret and a
//! MachineDeployment applied, a second field manager changing a field refused with kubectl's conflict message,
//! `--force-conflicts` taking the field, and `kubectl get --show-managed-fields` listing both managers. Every test
//! starts its own server on a free port in a directory of its own.

use std::path::Path;

use crate::support;

use support::{Server, arg, example};

const SECRET: &str =
    "apiVersion: v1\nkind: Secret\nmetadata:\n  name: app\ntype: Opaque\ndata:\n  key: {VALUE}\n";

fn secret(value: &str) -> String {
    SECRET.replace("{VALUE}", value)
}

/// The arguments of `kubectl apply --server-side <extra...> -f <file>`.
fn server_side<'a>(extra: &[&'a str], file: &'a Path) -> Vec<&'a str> {
    let mut args = vec!["apply", "--server-side"];
    args.extend_from_slice(extra);
    args.extend(["-f", arg(file)]);
    args
}

/// The stored value of the Secret's `data.key` (base64).
fn stored_key(server: &Server) -> String {
    server.kubectl_ok(&["get", "secret", "app", "-o", "jsonpath={.data.key}"])
}

/// The managers of an object and their operations, from `kubectl get -o yaml --show-managed-fields`, as
/// `manager/operation` lines; also checks that kubectl's default output hides them, as it does for a real server.
fn managers(server: &Server, what: &str) -> Vec<String> {
    let hidden = server.kubectl_ok(&["get", what, "-o", "yaml"]);
    assert!(
        !hidden.contains("managedFields"),
        "kubectl hides managedFields by default:\n{hidden}"
    );
    let shown = server.kubectl_ok(&["get", what, "-o", "yaml", "--show-managed-fields"]);
    // kubectl writes each entry's keys in order: ..., manager, operation, ...
    let mut managers = Vec::new();
    let mut manager = None;
    for line in shown.lines().map(str::trim_start) {
        if let Some(name) = line.strip_prefix("manager: ") {
            manager = Some(name.to_owned());
        } else if let Some(operation) = line.strip_prefix("operation: ") {
            let name = manager
                .take()
                .unwrap_or_else(|| panic!("operation before manager in:\n{shown}"));
            managers.push(format!("{name}/{operation}"));
        }
    }
    managers.sort();
    managers
}

#[test]
fn server_side_apply_of_a_secret_conflicts_with_a_second_manager_until_forced() {
    let server = Server::start("ssa-secret");
    // "one" and "two" in base64.
    let first = server.write("secret.yaml", &secret("b25l"));
    let out = server.kubectl_ok(&server_side(&[], &first));
    assert_eq!(out.trim(), "secret/app serverside-applied");
    // Applying the same file again is no change and no conflict.
    let out = server.kubectl_ok(&server_side(&[], &first));
    assert_eq!(out.trim(), "secret/app serverside-applied");

    let second = server.write("secret-other.yaml", &secret("dHdv"));
    let err = server.kubectl_err(&server_side(&["--field-manager", "other"], &second));
    assert!(
        err.contains("Apply failed with 1 conflict: conflict with \"kubectl\": .data.key"),
        "kubectl reports the conflicting field and its manager:\n{err}"
    );
    assert_eq!(stored_key(&server), "b25l", "a conflict changes nothing");

    let out = server.kubectl_ok(&server_side(
        &["--field-manager", "other", "--force-conflicts"],
        &second,
    ));
    assert_eq!(out.trim(), "secret/app serverside-applied");
    assert_eq!(stored_key(&server), "dHdv");
    // Both still apply `type`; only `other` owns `data.key` now.
    assert_eq!(
        managers(&server, "secret/app"),
        vec!["kubectl/Apply", "other/Apply"]
    );

    // The first manager now conflicts in turn.
    let err = server.kubectl_err(&server_side(&[], &first));
    assert!(err.contains("conflict with \"other\": .data.key"), "{err}");
}

// kubectl moves what client-side apply owned to its server-side manager before the first server-side apply (it
// rewrites managedFields with a JSON patch), so changing a value that `kubectl apply` set is no conflict.
#[test]
fn server_side_apply_takes_over_from_client_side_apply_without_a_conflict() {
    let server = Server::start("ssa-upgrade");
    let first = server.write("secret.yaml", &secret("b25l"));
    let out = server.kubectl_ok(&["apply", "-f", arg(&first)]);
    assert_eq!(out.trim(), "secret/app created");
    assert_eq!(
        managers(&server, "secret/app"),
        vec!["kubectl-client-side-apply/Update"]
    );
    let second = server.write("secret-two.yaml", &secret("dHdv"));
    let out = server.kubectl_ok(&server_side(&[], &second));
    assert_eq!(out.trim(), "secret/app serverside-applied");
    assert_eq!(stored_key(&server), "dHdv");
    // kubectl moved client-side apply's entry to `kubectl` and keeps the last-applied annotation under a manager of
    // its own, as against a real server.
    assert_eq!(
        managers(&server, "secret/app"),
        vec!["kubectl-last-applied/Apply", "kubectl/Apply"]
    );
}

#[test]
fn server_side_apply_of_a_machine_deployment_tracks_managers_and_forces_conflicts() {
    let server = Server::start("ssa-machinedeployment");
    server.kubectl_ok(&[
        "apply",
        "--server-side",
        "-f",
        arg(&example("01-machine-class.yaml")),
    ]);
    let out = server.kubectl_ok(&[
        "apply",
        "--server-side",
        "-f",
        arg(&example("30-machine-deployment.yaml")),
    ]);
    assert_eq!(
        out.trim(),
        "machinedeployment.machine.sapcloud.io/workers serverside-applied"
    );
    assert_eq!(
        server.kubectl_ok(&[
            "get",
            "machinedeployment",
            "workers",
            "-o",
            "jsonpath={.spec.replicas}"
        ]),
        "3"
    );

    let scaled = server.write(
        "scaled.yaml",
        "apiVersion: machine.sapcloud.io/v1alpha1\nkind: MachineDeployment\nmetadata:\n  name: workers\nspec:\n  \
         replicas: 5\n",
    );
    let err = server.kubectl_err(&server_side(&["--field-manager", "other"], &scaled));
    assert!(
        err.contains("Apply failed with 1 conflict: conflict with \"kubectl\": .spec.replicas"),
        "kubectl reports the conflicting field and its manager:\n{err}"
    );
    server.kubectl_ok(&server_side(
        &["--field-manager", "other", "--force-conflicts"],
        &scaled,
    ));
    assert_eq!(
        server.kubectl_ok(&[
            "get",
            "machinedeployment",
            "workers",
            "-o",
            "jsonpath={.spec.replicas}"
        ]),
        "5"
    );
    assert_eq!(
        managers(&server, "machinedeployment/workers"),
        vec!["kubectl/Apply", "other/Apply"]
    );
    // kubectl scale names no field manager: the server takes kubectl's User-Agent, and records an Update through the
    // scale subresource. `other` owned nothing but replicas, so its entry goes.
    server.kubectl_ok(&["scale", "machinedeployment", "workers", "--replicas", "4"]);
    assert_eq!(
        managers(&server, "machinedeployment/workers"),
        vec!["kubectl/Apply", "kubectl/Update"]
    );
    let err = server.kubectl_err(&server_side(&["--field-manager", "other"], &scaled));
    assert!(
        err.contains(
            "conflict with \"kubectl\" with subresource \"scale\" using machine.sapcloud.io/v1alpha1: .spec.replicas"
        ),
        "{err}"
    );
}
