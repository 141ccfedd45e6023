//! `mcm crds` prints the six CRDs (four machine.sapcloud.io, two Cluster API provider kinds) as YAML that kubectl
//! accepts, `--capi-rbac` adds the aggregated ClusterRole; bad usage exits non-zero with a message.

use std::process::Command;

fn mcm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcm"))
}

#[test]
fn crds_prints_six_custom_resource_definitions() {
    let output = mcm().arg("crds").output().expect("mcm runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let yaml = String::from_utf8(output.stdout).unwrap();
    let names: Vec<&str> = yaml
        .lines()
        .filter_map(|line| line.strip_prefix("  name: "))
        .collect();
    assert_eq!(
        names,
        [
            "machineclasses.machine.sapcloud.io",
            "machines.machine.sapcloud.io",
            "machinesets.machine.sapcloud.io",
            "machinedeployments.machine.sapcloud.io",
            "mcmmachines.infrastructure.machine.sapcloud.io",
            "mcmmachinetemplates.infrastructure.machine.sapcloud.io",
        ]
    );
    assert_eq!(yaml.matches("kind: CustomResourceDefinition").count(), 6);
    assert_eq!(
        yaml.matches("\n---\n").count() + usize::from(yaml.starts_with("---\n")),
        6
    );
    assert!(!yaml.contains("kind: ClusterRole"));
}

#[test]
fn crds_with_capi_rbac_adds_the_aggregated_cluster_role() {
    let output = mcm().args(["crds", "--capi-rbac"]).output().expect("mcm runs");
    assert!(output.status.success());
    let yaml = String::from_utf8(output.stdout).unwrap();
    assert_eq!(yaml.matches("kind: CustomResourceDefinition").count(), 6);
    assert!(yaml.contains("kind: ClusterRole"), "{yaml}");
    assert!(
        yaml.contains("cluster.x-k8s.io/aggregate-to-manager: 'true'")
            || yaml.contains("cluster.x-k8s.io/aggregate-to-manager: \"true\""),
        "{yaml}"
    );
}

#[test]
fn an_unknown_command_fails_with_a_message() {
    let output = mcm().arg("crdz").output().expect("mcm runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unrecognized subcommand 'crdz'"), "{stderr}");
}
