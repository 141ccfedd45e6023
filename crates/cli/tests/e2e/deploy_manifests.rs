//! The manifests of `deploy/` are what the binary and Kubernetes accept: every document deserializes as its kind
//! with the k8s-openapi types and loses no field on the way (a misspelt or misplaced field fails), the CRDs are
//! exactly `mcm crds`, the Deployment's arguments are flags of the commands it runs, its probes are the binary's
//! endpoints on its metrics port, the provider sidecar gets its `MC_` variables and shares one socket with the
//! controller, and every binding names the service account the Deployment runs as. Each Deployment variant is
//! checked so (`deploy/deployment.yaml` with the sim provider, `deploy/aws/deployment.yaml` with the AWS provider),
//! and the variants differ in their provider container only. What the RBAC rules allow is
//! checked against a live run in `deploy_rbac.rs`; the evaluator both use is checked here.
//!
//! Unknown fields: the k8s-openapi types ignore them, so each document is deserialized into its type, serialized
//! back and compared with the original as JSON; a field the type does not know is missing afterwards and is
//! reported with its path (a changed value too). This needs no extra dependency and catches a typo at any depth.

use crate::support::deploy;

use std::{collections::BTreeSet, process::Command};

use deploy::{
    CONTROLLER, Document, Manifests, PROVIDER, Request, Scope, deploy_dir, rule_allows, scope_allows,
};
use k8s_openapi::{
    api::{
        admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
        apps::v1::Deployment,
        core::v1::{ConfigMap, Container, Namespace, Probe, Secret, Service, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::util::intstr::IntOrString,
};
use serde_json::Value;

/// The document serialized back through its k8s-openapi type.
fn round_trip(document: &Document) -> Value {
    fn through<T: serde::de::DeserializeOwned + serde::Serialize>(document: &Document) -> Value {
        serde_json::to_value(document.typed::<T>()).expect("serializes")
    }
    match (document.api_version(), document.kind()) {
        ("v1", "Namespace") => through::<Namespace>(document),
        ("v1", "ServiceAccount") => through::<ServiceAccount>(document),
        ("v1", "ConfigMap") => through::<ConfigMap>(document),
        ("v1", "Secret") => through::<Secret>(document),
        ("v1", "Service") => through::<Service>(document),
        ("apps/v1", "Deployment") => through::<Deployment>(document),
        ("rbac.authorization.k8s.io/v1", "Role") => through::<Role>(document),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => through::<ClusterRole>(document),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => through::<RoleBinding>(document),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => through::<ClusterRoleBinding>(document),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            through::<ValidatingAdmissionPolicy>(document)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            through::<ValidatingAdmissionPolicyBinding>(document)
        }
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            through::<CustomResourceDefinition>(document)
        }
        (version, kind) => panic!(
            "{}: {kind} of {version:?} ({}) is not a kind this test knows; add it to round_trip",
            document.file,
            document.name()
        ),
    }
}

/// Where `after` lost or changed what `before` has (fields `after` added are fine: defaults of the type).
fn losses(before: &Value, after: &Value, path: &str, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            for (key, value) in b {
                let path = format!("{path}.{key}");
                match a.get(key) {
                    Some(other) => losses(value, other, &path, out),
                    None => out.push(format!("{path}: unknown field (dropped by the type)")),
                }
            }
        }
        (Value::Array(b), Value::Array(a)) if b.len() == a.len() => {
            for (index, (value, other)) in b.iter().zip(a).enumerate() {
                losses(value, other, &format!("{path}[{index}]"), out);
            }
        }
        _ if before == after => {}
        _ => out.push(format!("{path}: {before} became {after}")),
    }
}

#[test]
fn every_document_deserializes_as_its_kind_and_loses_no_field() {
    let manifests = Manifests::load();
    let mut problems = Vec::new();
    let variants = Manifests::variants();
    let other_deployments = variants.iter().skip(1).flat_map(|(_, m)| m.of_kind("Deployment"));
    for document in manifests.documents.iter().chain(other_deployments) {
        let mut lost = Vec::new();
        losses(&document.value, &round_trip(document), "", &mut lost);
        for loss in lost {
            problems.push(format!(
                "{} {} {}: {loss}",
                document.file,
                document.kind(),
                document.name()
            ));
        }
        assert!(
            !document.name().is_empty(),
            "{}: a document without a name",
            document.file
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    let kinds: BTreeSet<&str> = manifests.documents.iter().map(Document::kind).collect();
    for kind in [
        "CustomResourceDefinition",
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(kinds.contains(kind), "deploy/ has a {kind}: {kinds:?}");
    }
}

/// The check itself: a misspelt field is caught with its path, a value of the wrong type fails to deserialize.
#[test]
fn a_misspelt_field_is_reported_with_its_path() {
    let document = |value: Value| Document {
        file: "test.yaml".into(),
        value,
    };
    let typo = document(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": { "name": "r", "namespace": "n" },
        "rules": [{ "apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceName": ["x"] }],
    }));
    let mut lost = Vec::new();
    losses(&typo.value, &round_trip(&typo), "", &mut lost);
    assert_eq!(
        lost,
        [".rules[0].resourceName: unknown field (dropped by the type)"]
    );

    let wrong_type = document(serde_json::json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": { "name": "s" }, "automountServiceAccountToken": "no",
    }));
    assert!(std::panic::catch_unwind(|| round_trip(&wrong_type)).is_err());
}

#[test]
fn crds_yaml_is_exactly_what_mcm_crds_prints() {
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .arg("crds")
        .output()
        .expect("mcm crds runs");
    assert!(output.status.success());
    let printed = String::from_utf8(output.stdout).expect("UTF-8");
    let file = std::fs::read_to_string(deploy_dir().join("crds.yaml")).expect("deploy/crds.yaml");
    assert!(
        file == printed,
        "deploy/crds.yaml differs from `mcm crds`; regenerate it with\n    cargo run -p mcm -- crds > deploy/crds.yaml"
    );
}

/// The `--flags` a command's `--help` lists.
fn help_flags(args: &[&str]) -> (BTreeSet<String>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(args)
        .arg("--help")
        .output()
        .expect("mcm runs");
    assert!(output.status.success(), "mcm {} --help", args.join(" "));
    let help = String::from_utf8(output.stdout).expect("UTF-8");
    let flags = help
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(str::to_owned)
        .collect();
    (flags, help)
}

/// The subcommand words of a container's args (up to the first flag) and its flags (`--name` of `--name=value`).
fn command_and_flags(container: &Container) -> (Vec<String>, Vec<String>) {
    let args = container.args.clone().unwrap_or_default();
    assert!(
        container.command.is_none(),
        "{}: the image's ENTRYPOINT /mcm runs",
        container.name
    );
    let command: Vec<String> = args.iter().take_while(|a| !a.starts_with('-')).cloned().collect();
    let flags = args
        .iter()
        .filter(|a| a.starts_with("--"))
        .map(|a| a.split('=').next().unwrap_or_default().to_owned())
        .collect();
    (command, flags)
}

#[test]
fn the_deployment_args_are_flags_of_the_commands_it_runs() {
    for (provider, manifests) in Manifests::variants() {
        the_args_are_flags_of_the_commands_run(provider, &manifests);
    }
}

fn the_args_are_flags_of_the_commands_run(provider: &str, manifests: &Manifests) {
    for (name, expected) in [
        (CONTROLLER, &["run"][..]),
        (PROVIDER, &["provider", provider, "serve"][..]),
    ] {
        let container = manifests.container(name);
        let (command, flags) = command_and_flags(&container);
        assert_eq!(command, expected, "{name} runs `mcm {}`", expected.join(" "));
        let words: Vec<&str> = command.iter().map(String::as_str).collect();
        let (known, _) = help_flags(&words);
        let unknown: Vec<&String> = flags.iter().filter(|f| !known.contains(*f)).collect();
        assert!(
            unknown.is_empty(),
            "{name}: not flags of `mcm {}`: {unknown:?}",
            words.join(" ")
        );
    }
    // The watched namespace is the Deployment's own, where rbac.yaml grants the machine kinds.
    let (namespace, _) = manifests.service_account();
    assert_eq!(manifests.arg(CONTROLLER, "--namespace"), Some(namespace));
}

#[test]
fn the_probes_are_the_binary_endpoints_on_its_metrics_port() {
    for (_, manifests) in Manifests::variants() {
        the_probes_are_on_the_metrics_port(&manifests);
    }
}

fn the_probes_are_on_the_metrics_port(manifests: &Manifests) {
    let controller = manifests.container(CONTROLLER);
    let port: i32 = manifests
        .arg(CONTROLLER, "--port")
        .expect("the controller's --port is explicit")
        .parse()
        .expect("a port number");
    let (_, help) = help_flags(&["run"]);
    let port_help = help
        .split("--port <PORT>")
        .nth(1)
        .and_then(|rest| rest.split("\n      --").next())
        .expect("the help of --port");
    for path in ["/healthz", "/readyz"] {
        assert!(port_help.contains(path), "--port serves {path}: {port_help}");
    }
    assert!(
        port_help.contains(&port.to_string()),
        "{port} is the reference's port: {port_help}"
    );
    let ports = controller.ports.clone().unwrap_or_default();
    let resolve = |probe: &Option<Probe>, what: &str| -> (String, i32) {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.clone())
            .unwrap_or_else(|| panic!("the controller has an HTTP {what} probe"));
        let number = match &get.port {
            IntOrString::Int(n) => *n,
            IntOrString::String(name) => {
                ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(name.as_str()))
                    .unwrap_or_else(|| panic!("the {what} probe's port {name} is a container port"))
                    .container_port
            }
        };
        (get.path.unwrap_or_default(), number)
    };
    assert_eq!(
        resolve(&controller.liveness_probe, "liveness"),
        ("/healthz".into(), port)
    );
    assert_eq!(
        resolve(&controller.readiness_probe, "readiness"),
        ("/readyz".into(), port)
    );
    assert!(
        ports
            .iter()
            .any(|p| p.container_port == port && p.name.as_deref() == Some("metrics")),
        "the metrics port {port} is declared: {ports:?}"
    );
}

/// The provider's MC_ENDPOINT is the controller's --provider-endpoint, on a volume both mount at the socket's
/// directory, and its MC_ variables are the specification's and valid.
#[test]
fn the_sidecar_shares_one_socket_and_gets_the_required_variables() {
    for (_, manifests) in Manifests::variants() {
        the_sidecar_shares_one_socket(&manifests);
    }
}

fn the_sidecar_shares_one_socket(manifests: &Manifests) {
    let provider = manifests.container(PROVIDER);
    let env: Vec<(String, String)> = provider
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect();
    let known: Vec<&str> = mcm_grpc::env::VARIABLES
        .iter()
        .map(|(name, _, _)| *name)
        .collect();
    // No credential in the environment: they come with each call, from the class's Secret. Besides the MC_
    // variables, only where the AWS provider's calls go.
    for (name, _) in &env {
        assert!(
            name.starts_with("MC_") || name.starts_with("AWS_ENDPOINT_URL"),
            "{name}: the sidecar gets its MC_ variables and at most an AWS endpoint"
        );
    }
    for (name, _) in env.iter().filter(|(name, _)| name.starts_with("MC_")) {
        assert!(
            known.contains(&name.as_str()),
            "{name} is not a variable of the specification: {known:?}"
        );
    }
    let lookup = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    let parsed = mcm_grpc::ProviderEnv::from_lookup(lookup).expect("the provider's MC_ variables are valid");
    let endpoint = lookup("MC_ENDPOINT").expect("MC_ENDPOINT");
    assert_eq!(
        manifests.arg(CONTROLLER, "--provider-endpoint"),
        Some(endpoint.clone())
    );
    let mcm_grpc::Endpoint::Unix(socket) = parsed.endpoint else {
        panic!("a unix socket in the pod, not {endpoint}")
    };
    let directory = socket.parent().expect("a directory").to_str().expect("UTF-8");
    let volumes = manifests
        .deployment()
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.volumes)
        .unwrap_or_default();
    let mut shared = Vec::new();
    for container in [manifests.container(CONTROLLER), provider] {
        let mount = container
            .volume_mounts
            .unwrap_or_default()
            .into_iter()
            .find(|m| m.mount_path == directory)
            .unwrap_or_else(|| panic!("{} mounts {directory}", container.name));
        shared.push(mount.name);
    }
    assert_eq!(shared[0], shared[1], "one volume for the socket");
    let volume = volumes
        .iter()
        .find(|v| v.name == shared[0])
        .expect("the socket volume");
    assert!(volume.empty_dir.is_some(), "the socket lives in an emptyDir");
}

/// The Deployment of the pod without its provider container, as JSON.
fn without_provider(manifests: &Manifests) -> Value {
    let mut value = serde_json::to_value(manifests.deployment()).expect("serializes");
    let containers = value["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .expect("containers");
    containers.retain(|c| c["name"] != PROVIDER);
    value
}

/// `deploy/aws/deployment.yaml` is `deploy/deployment.yaml` with `mcm provider aws serve` as the sidecar: the rest
/// of the pod cannot drift apart. Its provider-side metrics port is declared and is not the controller's.
#[test]
fn the_aws_deployment_differs_in_its_provider_container_only() {
    let variants = Manifests::variants();
    let (_, sim) = &variants[0];
    let (provider, aws) = variants
        .iter()
        .find(|(provider, _)| *provider == "aws")
        .expect("an AWS variant");
    let mut lost = Vec::new();
    losses(&without_provider(sim), &without_provider(aws), "", &mut lost);
    losses(&without_provider(aws), &without_provider(sim), "", &mut lost);
    assert!(
        lost.is_empty(),
        "deploy/aws/deployment.yaml differs from deploy/deployment.yaml outside the {provider} provider container:\n{}",
        lost.join("\n")
    );
    let metrics: std::net::SocketAddr = aws
        .arg(PROVIDER, "--metrics-address")
        .expect("the AWS sidecar serves its metrics")
        .parse()
        .expect("an address");
    let ports = aws.container(PROVIDER).ports.unwrap_or_default();
    assert!(
        ports
            .iter()
            .any(|p| p.container_port == i32::from(metrics.port()) && p.name.is_some()),
        "the sidecar's metrics port {} is a named container port: {ports:?}",
        metrics.port()
    );
    assert_ne!(
        aws.arg(CONTROLLER, "--port"),
        Some(metrics.port().to_string()),
        "one port per process of the pod"
    );
}

#[test]
fn the_containers_run_as_non_root_read_only_and_only_the_controller_holds_credentials() {
    for (_, manifests) in Manifests::variants() {
        only_the_controller_holds_credentials(&manifests);
    }
}

fn only_the_controller_holds_credentials(manifests: &Manifests) {
    let pod = manifests
        .deployment()
        .spec
        .and_then(|s| s.template.spec)
        .expect("a pod template");
    assert_eq!(
        pod.automount_service_account_token,
        Some(false),
        "no token unless mounted explicitly"
    );
    let pod_security = pod.security_context.clone().expect("a pod securityContext");
    assert_eq!(pod_security.run_as_non_root, Some(true));
    let token_volumes: Vec<&str> = pod
        .volumes
        .iter()
        .flatten()
        .filter(|v| {
            v.projected.as_ref().is_some_and(|p| {
                p.sources
                    .iter()
                    .flatten()
                    .any(|s| s.service_account_token.is_some())
            })
        })
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(token_volumes.len(), 1, "one projected token volume");
    for container in &pod.containers {
        let security = container
            .security_context
            .as_ref()
            .unwrap_or_else(|| panic!("{} has a securityContext", container.name));
        assert_eq!(
            security.read_only_root_filesystem,
            Some(true),
            "{}",
            container.name
        );
        assert_eq!(
            security.allow_privilege_escalation,
            Some(false),
            "{}",
            container.name
        );
        assert!(
            security
                .capabilities
                .as_ref()
                .and_then(|c| c.drop.as_ref())
                .is_some_and(|d| d.iter().any(|c| c == "ALL")),
            "{} drops every capability",
            container.name
        );
        let resources = container.resources.as_ref().and_then(|r| r.requests.as_ref());
        assert!(
            resources.is_some_and(|r| r.contains_key("cpu") && r.contains_key("memory")),
            "{} requests cpu and memory",
            container.name
        );
        let token = container
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| token_volumes.contains(&m.name.as_str()));
        if container.name == CONTROLLER {
            let token = token.expect("the controller mounts the service account token");
            assert_eq!(
                token.mount_path, "/var/run/secrets/kubernetes.io/serviceaccount",
                "where the in-cluster configuration reads it"
            );
        } else {
            assert!(token.is_none(), "{} gets no credentials", container.name);
        }
    }
}

#[test]
fn every_binding_names_the_service_account_the_deployment_runs_as() {
    let manifests = Manifests::load();
    let (namespace, name) = manifests.service_account();
    assert!(
        manifests
            .of_kind("ServiceAccount")
            .any(|sa| sa.name() == name && sa.namespace() == namespace),
        "deploy/ creates the service account {namespace}/{name}"
    );
    let namespaces: BTreeSet<&str> = manifests.of_kind("Namespace").map(Document::name).collect();
    for document in &manifests.documents {
        let ns = document.namespace();
        assert!(
            ns.is_empty() || ns == "kube-system" || namespaces.contains(ns),
            "{} {}: namespace {ns} is created in deploy/",
            document.kind(),
            document.name()
        );
    }
    let mut bound = BTreeSet::new();
    for document in manifests
        .of_kind("RoleBinding")
        .chain(manifests.of_kind("ClusterRoleBinding"))
    {
        let subjects = document.value["subjects"].as_array().cloned().unwrap_or_default();
        assert_eq!(subjects.len(), 1, "{}: one subject", document.name());
        assert_eq!(
            (
                &subjects[0]["kind"],
                &subjects[0]["name"],
                &subjects[0]["namespace"]
            ),
            (
                &Value::from("ServiceAccount"),
                &Value::from(name.as_str()),
                &Value::from(namespace.as_str())
            ),
            "{} {} binds the Deployment's service account",
            document.kind(),
            document.name()
        );
        let role_ref = &document.value["roleRef"];
        let kind = role_ref["kind"].as_str().unwrap_or_default();
        let role_namespace = if kind == "Role" { document.namespace() } else { "" };
        bound.insert((
            kind.to_owned(),
            role_namespace.to_owned(),
            role_ref["name"].as_str().unwrap_or_default().to_owned(),
        ));
    }
    let roles: BTreeSet<(String, String, String)> = manifests
        .of_kind("Role")
        .chain(manifests.of_kind("ClusterRole"))
        .map(|r| (r.kind().to_owned(), r.namespace().to_owned(), r.name().to_owned()))
        .collect();
    assert_eq!(bound, roles, "every role is bound, every binding's role exists");
    // The rules resolve (Rbac panics on a binding to a role not in deploy/) and the machine kinds are granted in
    // the watched namespace.
    let rbac = manifests.rbac();
    let watch_machines = Request::from_counter("watch", "machines.machine.sapcloud.io", &namespace, "");
    assert!(rbac.allows(&watch_machines).is_some(), "{watch_machines}");
}

#[test]
fn the_dockerfile_builds_the_mcm_binary_into_a_non_root_image() {
    let dockerfile = std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("deploy/Dockerfile");
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let has = |text: &str| lines.iter().any(|l| l.contains(text));
    let froms: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "a builder and a runtime stage: {froms:?}");
    assert!(
        froms[0].starts_with("FROM rust:1") && froms[0].ends_with(" AS builder"),
        "{}",
        froms[0]
    );
    assert_eq!(*froms[1], "FROM gcr.io/distroless/cc-debian12:nonroot");
    assert!(has("cargo build --release -p mcm --locked"));
    assert!(has("cp target/release/mcm /mcm") && has("COPY --from=builder /mcm /mcm"));
    assert!(has("ENTRYPOINT [\"/mcm\"]"));
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).expect("Cargo.toml");
    assert!(
        manifest.contains("[[bin]]\nname = \"mcm\""),
        "the package's binary is mcm"
    );
    // The image's user is the one the Deployment runs as.
    let user = lines
        .iter()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER");
    for (provider, manifests) in Manifests::variants() {
        let run_as = manifests
            .deployment()
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.security_context)
            .and_then(|s| s.run_as_user)
            .expect("runAsUser");
        assert_eq!(
            user.split(':').next(),
            Some(run_as.to_string().as_str()),
            "the {provider} Deployment"
        );
    }
}

/// The evaluator `deploy_rbac.rs` compares the recorded requests with, on the cases RBAC is particular about.
#[test]
fn the_rbac_evaluator_follows_kubernetes_rules() {
    let rule = |groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]| PolicyRule {
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        resource_names: (!names.is_empty()).then(|| names.iter().map(|s| (*s).to_owned()).collect()),
        non_resource_urls: None,
    };
    let request = Request::from_counter;
    let nodes = rule(&[""], &["nodes"], &["get", "patch"], &[]);
    assert!(rule_allows(&nodes, &request("get", "nodes", "", "n1")));
    assert!(
        !rule_allows(&nodes, &request("delete", "nodes", "", "n1")),
        "verb"
    );
    assert!(
        !rule_allows(&nodes, &request("patch", "nodes/status", "", "n1")),
        "a subresource is its own resource"
    );
    assert!(rule_allows(
        &rule(&[""], &["*/status"], &["patch"], &[]),
        &request("patch", "nodes/status", "", "n1")
    ));
    assert!(rule_allows(
        &rule(&["*"], &["*"], &["*"], &[]),
        &request("create", "pods/eviction", "ns", "p")
    ));
    let machines = rule(&["machine.sapcloud.io"], &["machines"], &["list"], &[]);
    assert!(rule_allows(
        &machines,
        &request("list", "machines.machine.sapcloud.io", "ns", "")
    ));
    assert!(
        !rule_allows(&machines, &request("list", "machines.other.io", "ns", "")),
        "group"
    );
    let lease = rule(
        &["coordination.k8s.io"],
        &["leases"],
        &["get", "update", "create"],
        &["lock"],
    );
    assert!(rule_allows(
        &lease,
        &request("update", "leases.coordination.k8s.io", "ns", "lock")
    ));
    assert!(!rule_allows(
        &lease,
        &request("update", "leases.coordination.k8s.io", "ns", "other")
    ));
    assert!(
        !rule_allows(&lease, &request("create", "leases.coordination.k8s.io", "ns", "")),
        "create has no name"
    );

    let in_ns = Scope::Namespace("ns".into());
    assert!(scope_allows(&in_ns, &request("list", "secrets", "ns", "")));
    assert!(!scope_allows(&in_ns, &request("list", "secrets", "other", "")));
    assert!(
        !scope_allows(&in_ns, &request("list", "pods", "", "")),
        "all namespaces need a cluster grant"
    );
    assert!(scope_allows(&Scope::Cluster, &request("list", "pods", "", "")));
    assert!(scope_allows(
        &Scope::Cluster,
        &request("delete", "pods", "any", "p")
    ));
}
