//! `mcm crds` prints the four CRDs as YAML that kubectl accepts; bad usage exits non-zero with a message.

use std::process::Command;

fn mcm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mcm"))
}

#[test]
fn crds_prints_four_custom_resource_definitions() {
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
        ]
    );
    assert_eq!(yaml.matches("kind: CustomResourceDefinition").count(), 4);
    assert_eq!(
        yaml.matches("\n---\n").count() + usize::from(yaml.starts_with("---\n")),
        4
    );
}

#[test]
fn an_unknown_command_fails_with_a_message() {
    let output = mcm().arg("crdz").output().expect("mcm runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unrecognized subcommand 'crdz'"), "{stderr}");
}
