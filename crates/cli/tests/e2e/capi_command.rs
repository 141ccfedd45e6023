//! End to end: `mcm capi run` against the real `mcm apiserver` with an out-of-process sim provider over gRPC, driven
//! with `kubectl` (v1.32) as a Cluster API user would: our CRDs from `mcm crds`, Cluster API's Cluster and Machine,
//! then an MCMMachine provisioned and deleted (spec 001). (The embedded server serves no RBAC kinds, so the
//! ClusterRole of `mcm crds --capi-rbac` is checked by `crds_command` instead.)

use crate::support;

use std::{path::PathBuf, process::Command, time::Duration};

use support::{Background, Server, arg, poll, start_sim_provider};

const DEADLINE: Duration = Duration::from_mins(1);

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../capi/tests/fixtures")
        .join(name)
}

/// What a Cluster API user applies: the credentials and bootstrap secrets, a Cluster, the MCMMachine with an inline
/// sim providerSpec, and the Machine whose infrastructureRef names it.
const OBJECTS: &str = r##"
apiVersion: v1
kind: Secret
metadata: { name: creds }
stringData: { userData: "" }
---
apiVersion: v1
kind: Secret
metadata: { name: boot }
stringData: { value: "#!/bin/sh\necho bootstrap-canary-7f3a\n" }
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: { name: c1 }
spec: {}
---
apiVersion: infrastructure.machine.sapcloud.io/v1beta1
kind: MCMMachine
metadata:
  name: m1
  labels: { cluster.x-k8s.io/cluster-name: c1 }
spec:
  providerSpec: { vmPool: pool-a, size: small, tags: { cluster: c1 } }
  secretRef: { name: creds, namespace: default }
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Machine
metadata: { name: m1 }
spec:
  clusterName: c1
  bootstrap: { dataSecretName: boot }
  infrastructureRef: { apiGroup: infrastructure.machine.sapcloud.io, kind: MCMMachine, name: m1 }
"##;

#[test]
fn mcm_capi_run_provisions_an_mcmmachine_through_a_grpc_provider_and_deletes_its_vm() {
    let server = Server::start("capi-run");
    let crds = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .arg("crds")
        .output()
        .expect("mcm crds");
    assert!(crds.status.success(), "{crds:?}");
    let crds = server.write("crds.yaml", &String::from_utf8_lossy(&crds.stdout));
    server.kubectl_ok(&["apply", "-f", arg(&crds)]);
    for file in ["cluster-crd.yaml", "machine-crd.yaml"] {
        server.kubectl_ok(&["apply", "-f", arg(&fixture(file))]);
    }
    server.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=30s",
    ]);

    let (provider, endpoint) = start_sim_provider(&server, |_| {});
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
    command
        .args(["capi", "run", "--kubeconfig"])
        .arg(server.kubeconfig())
        .args(["--provider-endpoint", &endpoint, "--wait-resync", "1s"]);
    let controller = Background::spawn(command, "mcm capi run".into());

    let objects = server.write("cluster.yaml", OBJECTS);
    server.kubectl_ok(&["apply", "-f", arg(&objects)]);
    // What the Cluster API core controllers do: the Machine owns its infrastructure, the Cluster's is provisioned.
    let uid = server.kubectl_ok(&[
        "get",
        "machines.cluster.x-k8s.io",
        "m1",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let owner = format!(
        r#"{{"metadata":{{"ownerReferences":[{{"apiVersion":"cluster.x-k8s.io/v1beta2","kind":"Machine","name":"m1","uid":"{}"}}]}}}}"#,
        uid.trim()
    );
    server.kubectl_ok(&["patch", "mcmmachine", "m1", "--type=merge", "-p", &owner]);
    // "If the associated Cluster's status.infrastructureReady is false, exit the reconciliation": no VM yet.
    poll("the wait for cluster infrastructure", DEADLINE, || {
        let reason = server.kubectl_ok(&[
            "get",
            "mcmmachine",
            "m1",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}",
        ]);
        (reason.trim() == "WaitingForClusterInfrastructure").then_some(())
    });
    server.kubectl_ok(&[
        "patch",
        "clusters.cluster.x-k8s.io",
        "c1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"initialization":{"infrastructureProvisioned":true}}}"#,
    ]);

    let provider_id = poll("the MCMMachine provisioned", DEADLINE, || {
        let out = server.kubectl_ok(&[
            "get",
            "mcmmachine",
            "m1",
            "-o",
            "jsonpath={.spec.providerID} {.status.ready} {.status.initialization.provisioned} {.status.addresses[0].type}",
        ]);
        let fields: Vec<&str> = out.split_whitespace().collect();
        (fields.len() == 4 && fields[1..] == ["true", "true", "InternalIP"]).then(|| fields[0].to_owned())
    });
    assert!(!provider_id.is_empty());
    let table = server.kubectl_ok(&["get", "mcmmachines"]);
    assert!(table.contains(&provider_id), "the ProviderID column: {table}");

    server.kubectl_ok(&["delete", "mcmmachine", "m1", "--wait=true", "--timeout=60s"]);
    let gone = server.kubectl(&["get", "mcmmachine", "m1"]);
    assert!(!gone.status.success(), "the MCMMachine is gone once its VM is");

    let controller = controller.terminate(DEADLINE);
    let logs = String::from_utf8_lossy(&controller.stderr).into_owned()
        + &String::from_utf8_lossy(&controller.stdout);
    assert!(
        !logs.contains("bootstrap-canary-7f3a"),
        "userData in the controller's logs"
    );
    provider.terminate(DEADLINE);
}
