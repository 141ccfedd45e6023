//! The manifests of `deploy/` are what the binary and Kubernetes accept, in every layout it ships. Each layout is
//! what the real `kubectl kustomize` renders from its kustomization (`kubectl apply -k` runs the same kustomize): the
//! base (`deploy/`, one cluster), `overlays/single` (one process), `overlays/aws-grpc` (the AWS provider as a gRPC
//! sidecar) and `overlays/seed-aws` (Gardener's seed layout, with `overlays/seed-aws/target-cluster` for the target
//! cluster). Every document deserializes as its kind with the k8s-openapi types and loses no field on the way (a
//! misspelt or misplaced field fails); the CRDs are exactly `mcm crds` and only the base installs them; every
//! container's arguments are parsed by the binary itself; the probes are the binary's endpoints on its `--port`; a
//! provider sidecar gets its `MC_` variables and shares one socket with its controller; every binding names the
//! service account of its cluster; every container runs as the Dockerfile's non-root user with a read-only root
//! filesystem, writing only to emptyDir volumes. What each overlay is for is checked in `deploy_layouts.rs`; what the
//! RBAC rules allow, against a live run in `deploy_rbac.rs`; the evaluator both use is checked here.
//!
//! Unknown fields: the k8s-openapi types ignore them, so each document is deserialized into its type, serialized
//! back and compared with the original as JSON; a field the type does not know is missing afterwards and is
//! reported with its path (a changed value too). This needs no extra dependency and catches a typo at any depth.

use crate::support::{Background, COMMAND_DEADLINE, deploy};

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
};

use deploy::{
    Document, Manifests, Request, SEED_TARGET, Scope, deploy_dir, flag_value, losses, mount_at, pod,
    rule_allows, runs_controllers, scope_allows, serves_provider,
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

/// Where the in-cluster configuration reads the service account token.
const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

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

#[test]
fn every_document_deserializes_as_its_kind_and_loses_no_field() {
    let mut rendered: Vec<(&str, Manifests)> = Manifests::layouts();
    rendered.push((SEED_TARGET, Manifests::render(SEED_TARGET)));
    rendered.push((
        "validating-admission-policy.yaml",
        Manifests::file("validating-admission-policy.yaml"),
    ));
    let mut problems = Vec::new();
    for (_, manifests) in &rendered {
        for document in &manifests.documents {
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
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    let kinds = |manifests: &Manifests| -> BTreeSet<String> {
        manifests.documents.iter().map(|d| d.kind().to_owned()).collect()
    };
    let mut base = kinds(&rendered[0].1);
    base.extend(kinds(&rendered[rendered.len() - 1].1));
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
        assert!(base.contains(kind), "deploy/ has a {kind}: {base:?}");
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

/// `kubectl apply -k deploy/` installs the CRDs of `crds.yaml` as written; the overlays, which kustomize cannot let
/// reach a file above their directory, leave them out (they are installed once per cluster).
#[test]
fn the_base_installs_crds_yaml_unchanged_and_the_overlays_leave_it_out() {
    let by_name = |manifests: &Manifests| -> BTreeMap<String, Value> {
        manifests
            .of_kind("CustomResourceDefinition")
            .map(|d| (d.name().to_owned(), d.value.clone()))
            .collect()
    };
    let file = Manifests::file("crds.yaml");
    let written = by_name(&file);
    assert!(
        !written.is_empty() && written.len() == file.documents.len(),
        "crds.yaml holds CRDs only"
    );
    for (layout, manifests) in Manifests::layouts() {
        let rendered = by_name(&manifests);
        if layout == "base" {
            assert!(
                rendered == written,
                "kubectl kustomize deploy/ renders the CRDs of crds.yaml unchanged"
            );
        } else {
            assert!(
                rendered.is_empty(),
                "{layout}: the CRDs are the base's: {:?}",
                rendered.keys()
            );
        }
    }
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

/// Parses `args` with the binary itself: `mcm <args> --help` makes clap parse every argument before `--help` (an
/// unknown flag or a bad value fails with exit code 2, naming it) and then print the help instead of running.
fn parse_with_binary(args: &[String]) -> Result<(), String> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
    command.args(args).arg("--help").env_remove("NODE_NAME");
    let output = Background::spawn(command, format!("mcm {}", args.join(" "))).finish(COMMAND_DEADLINE);
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[test]
fn the_binary_parses_the_arguments_of_every_container() {
    let words = |list: &[&str]| list.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    // The check refuses what the binary refuses.
    let unknown = parse_with_binary(&words(&["run", "--no-such-flag"])).expect_err("an unknown flag");
    assert!(unknown.contains("--no-such-flag"), "{unknown}");
    let value =
        parse_with_binary(&words(&["run", "--machine-drain-timeout=2 hours"])).expect_err("a bad value");
    assert!(value.contains("--machine-drain-timeout"), "{value}");
    assert!(parse_with_binary(&words(&["provider", "aws", "serve", "--port=10259"])).is_err());

    for (layout, manifests) in Manifests::layouts() {
        let (namespace, _) = manifests.service_account();
        for container in manifests.containers() {
            let name = &container.name;
            assert!(
                container.command.is_none(),
                "{layout} {name}: the image's ENTRYPOINT /mcm runs"
            );
            let args = container.args.clone().unwrap_or_default();
            if let Err(err) = parse_with_binary(&args) {
                panic!("{layout} {name}: `mcm {}` is refused:\n{err}", args.join(" "));
            }
            if runs_controllers(&container) {
                // Only the machine controller calls a provider; the controller manager's role takes none.
                let sets_only =
                    flag_value(&container, "--controllers").as_deref() == Some("machine-controller-manager");
                assert!(
                    sets_only
                        || flag_value(&container, "--provider").is_some()
                        || flag_value(&container, "--provider-endpoint").is_some(),
                    "{layout} {name}: `mcm run` names its provider"
                );
                // The watched namespace is the Deployment's own, where the Role grants the machine kinds.
                assert_eq!(
                    flag_value(&container, "--namespace").as_ref(),
                    Some(&namespace),
                    "{layout} {name}"
                );
            } else {
                assert!(
                    serves_provider(&container).is_some(),
                    "{layout} {name}: runs `mcm run` or `mcm provider <name> serve`, not `mcm {}`",
                    args.join(" ")
                );
            }
        }
    }
}

/// The path and the port number an HTTP probe of `container` calls.
fn probe_target(container: &Container, probe: Option<&Probe>, what: &str) -> (String, i32) {
    let get = probe
        .and_then(|p| p.http_get.clone())
        .unwrap_or_else(|| panic!("{} has an HTTP {what} probe", container.name));
    let number = match &get.port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .unwrap_or_else(|| {
                    panic!(
                        "{}: the {what} probe's port {name} is a container port",
                        container.name
                    )
                })
                .container_port
        }
    };
    (get.path.unwrap_or_default(), number)
}

#[test]
fn the_probes_are_the_binary_endpoints_on_its_metrics_port() {
    let (_, help) = help_flags(&["run"]);
    let port_help = help
        .split("--port <PORT>")
        .nth(1)
        .and_then(|rest| rest.split("\n      --").next())
        .expect("the help of --port");
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert!(port_help.contains(path), "--port serves {path}: {port_help}");
    }
    for (layout, manifests) in Manifests::layouts() {
        let containers = manifests.containers();
        let mut ports = BTreeSet::new();
        for port in containers.iter().flat_map(|c| c.ports.iter().flatten()) {
            assert!(
                ports.insert(port.container_port),
                "{layout}: port {} is declared twice in the pod",
                port.container_port
            );
        }
        for container in containers.iter().filter(|c| runs_controllers(c)) {
            let port: i32 = flag_value(container, "--port")
                .unwrap_or_else(|| panic!("{layout} {}: --port is explicit", container.name))
                .parse()
                .expect("a port number");
            assert!(
                port_help.contains(&port.to_string()),
                "{port} is a port of the reference: {port_help}"
            );
            assert_eq!(
                probe_target(container, container.liveness_probe.as_ref(), "liveness"),
                ("/healthz".into(), port),
                "{layout} {}",
                container.name
            );
            assert_eq!(
                probe_target(container, container.readiness_probe.as_ref(), "readiness"),
                ("/readyz".into(), port),
                "{layout} {}",
                container.name
            );
            assert!(
                container
                    .ports
                    .iter()
                    .flatten()
                    .any(|p| p.container_port == port && p.name.is_some()),
                "{layout} {}: --port {port} is a named container port",
                container.name
            );
        }
    }
}

/// A provider sidecar's `MC_` variables are the specification's and valid, its `MC_ENDPOINT` is the
/// `--provider-endpoint` of a controller container, and both mount the socket's directory from one `emptyDir`.
#[test]
fn the_sidecar_shares_one_socket_and_gets_the_required_variables() {
    let mut sidecars = 0;
    for (layout, manifests) in Manifests::layouts() {
        let containers = manifests.containers();
        for provider in containers.iter().filter(|c| serves_provider(c).is_some()) {
            sidecars += 1;
            the_sidecar_shares_one_socket(layout, &manifests, provider);
        }
        // Every controller that calls a provider over a unix socket has it in the pod.
        for controller in containers.iter().filter(|c| runs_controllers(c)) {
            if let Some(endpoint) = flag_value(controller, "--provider-endpoint") {
                assert!(
                    containers.iter().any(|c| serves_provider(c).is_some()
                        && c.env.iter().flatten().any(
                            |e| e.name == "MC_ENDPOINT" && e.value.as_deref() == Some(endpoint.as_str())
                        )),
                    "{layout}: a sidecar serves {endpoint}"
                );
            }
        }
    }
    assert!(sidecars >= 2, "the base and aws-grpc have a provider sidecar");
}

fn the_sidecar_shares_one_socket(layout: &str, manifests: &Manifests, provider: &Container) {
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
            "{layout} {name}: the sidecar gets its MC_ variables and at most an AWS endpoint"
        );
    }
    for (name, _) in env.iter().filter(|(name, _)| name.starts_with("MC_")) {
        assert!(
            known.contains(&name.as_str()),
            "{layout} {name} is not a variable of the specification: {known:?}"
        );
    }
    let lookup = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    let parsed = mcm_grpc::ProviderEnv::from_lookup(lookup).expect("the provider's MC_ variables are valid");
    let endpoint = lookup("MC_ENDPOINT").expect("MC_ENDPOINT");
    let controller = manifests
        .containers()
        .into_iter()
        .find(|c| runs_controllers(c) && flag_value(c, "--provider-endpoint").as_ref() == Some(&endpoint))
        .unwrap_or_else(|| panic!("{layout}: a controller container calls {endpoint}"));
    let mcm_grpc::Endpoint::Unix(socket) = parsed.endpoint else {
        panic!("{layout}: a unix socket in the pod, not {endpoint}")
    };
    let directory = socket.parent().expect("a directory").to_str().expect("UTF-8");
    let shared: Vec<String> = [&controller, provider]
        .iter()
        .map(|c| mount_at(c, directory).unwrap_or_else(|| panic!("{layout} {} mounts {directory}", c.name)))
        .collect();
    assert_eq!(shared[0], shared[1], "{layout}: one volume for the socket");
    let volume = pod(manifests)
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.name == shared[0])
        .expect("the socket volume");
    assert!(
        volume.empty_dir.is_some(),
        "{layout}: the socket lives in an emptyDir"
    );
}

#[test]
fn the_containers_run_as_non_root_read_only_and_only_the_controllers_hold_credentials() {
    for (layout, manifests) in Manifests::layouts() {
        only_the_controllers_hold_credentials(layout, &manifests);
    }
}

/// Whether `path` is `directory` or lies below it.
fn is_below(path: &str, directory: &str) -> bool {
    Path::new(path).starts_with(directory)
}

fn only_the_controllers_hold_credentials(layout: &str, manifests: &Manifests) {
    let pod = pod(manifests);
    assert_eq!(
        pod.automount_service_account_token,
        Some(false),
        "{layout}: no token unless mounted explicitly"
    );
    let pod_security = pod.security_context.clone().expect("a pod securityContext");
    assert_eq!(pod_security.run_as_non_root, Some(true), "{layout}");
    let volumes = pod.volumes.clone().unwrap_or_default();
    let token_volumes: Vec<&str> = volumes
        .iter()
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
    assert_eq!(token_volumes.len(), 1, "{layout}: one projected token volume");
    let empty_dirs: Vec<&str> = volumes
        .iter()
        .filter(|v| v.empty_dir.is_some())
        .map(|v| v.name.as_str())
        .collect();
    for container in &pod.containers {
        let name = format!("{layout} {}", container.name);
        let security = container
            .security_context
            .as_ref()
            .unwrap_or_else(|| panic!("{name} has a securityContext"));
        assert_eq!(security.read_only_root_filesystem, Some(true), "{name}");
        assert_eq!(security.allow_privilege_escalation, Some(false), "{name}");
        assert!(
            security
                .capabilities
                .as_ref()
                .and_then(|c| c.drop.as_ref())
                .is_some_and(|d| d.iter().any(|c| c == "ALL")),
            "{name} drops every capability"
        );
        let resources = container.resources.as_ref().and_then(|r| r.requests.as_ref());
        assert!(
            resources.is_some_and(|r| r.contains_key("cpu") && r.contains_key("memory")),
            "{name} requests cpu and memory"
        );
        let mounts = container.volume_mounts.clone().unwrap_or_default();
        // What a container may write is a scratch volume; everything else it mounts is read-only.
        let writable: Vec<&str> = mounts
            .iter()
            .filter(|m| m.read_only != Some(true))
            .map(|m| {
                assert!(
                    empty_dirs.contains(&m.name.as_str()),
                    "{name}: {} is writable but not an emptyDir",
                    m.mount_path
                );
                m.mount_path.as_str()
            })
            .collect();
        // The one path a process creates, a provider's unix socket, lies in such a volume.
        let sockets = ["--provider-endpoint", "--endpoint"]
            .iter()
            .filter_map(|flag| flag_value(container, flag))
            .chain(
                container
                    .env
                    .iter()
                    .flatten()
                    .filter(|e| e.name == "MC_ENDPOINT")
                    .filter_map(|e| e.value.clone()),
            );
        for endpoint in sockets {
            if let Some(path) = endpoint.strip_prefix("unix://") {
                assert!(
                    writable.iter().any(|dir| is_below(path, dir)),
                    "{name}: the socket {path} lies in a writable emptyDir ({writable:?})"
                );
            }
        }
        // The kubeconfigs it reads are mounted.
        for flag in ["--control-kubeconfig", "--target-kubeconfig"] {
            if let Some(path) = flag_value(container, flag).filter(|p| p.starts_with('/')) {
                assert!(
                    mounts.iter().any(|m| is_below(&path, &m.mount_path)),
                    "{name}: {flag}={path} is in a volume"
                );
            }
        }
        let token = mounts.iter().find(|m| token_volumes.contains(&m.name.as_str()));
        if runs_controllers(container) {
            let token = token.unwrap_or_else(|| panic!("{name} mounts the service account token"));
            assert_eq!(
                token.mount_path, TOKEN_PATH,
                "{name}: where the in-cluster configuration reads it"
            );
        } else {
            assert!(token.is_none(), "{name} gets no credentials");
        }
    }
}

#[test]
fn every_binding_names_the_service_account_the_deployment_runs_as() {
    for (layout, manifests) in Manifests::layouts() {
        let (namespace, name) = manifests.service_account();
        bindings_name_the_service_account(layout, &manifests, &namespace, &name);
        // The rules resolve (Rbac panics on a binding to a role not rendered) and the machine kinds are granted in
        // the watched namespace.
        let rbac = manifests.rbac();
        let watch_machines = Request::from_counter("watch", "machines.machine.sapcloud.io", &namespace, "");
        assert!(
            rbac.allows(&watch_machines).is_some(),
            "{layout}: {watch_machines}"
        );
    }
    let target = Manifests::render(SEED_TARGET);
    bindings_name_the_service_account(SEED_TARGET, &target, "kube-system", "machine-controller-manager");
}

fn bindings_name_the_service_account(layout: &str, manifests: &Manifests, namespace: &str, name: &str) {
    assert!(
        manifests
            .of_kind("ServiceAccount")
            .any(|sa| sa.name() == name && sa.namespace() == namespace),
        "{layout} creates the service account {namespace}/{name}"
    );
    let namespaces: BTreeSet<&str> = manifests.of_kind("Namespace").map(Document::name).collect();
    for document in &manifests.documents {
        let ns = document.namespace();
        assert!(
            ns.is_empty() || ns == "kube-system" || namespaces.contains(ns),
            "{layout} {} {}: namespace {ns} is created",
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
        assert_eq!(subjects.len(), 1, "{layout} {}: one subject", document.name());
        assert_eq!(
            (
                &subjects[0]["kind"],
                &subjects[0]["name"],
                &subjects[0]["namespace"]
            ),
            (
                &Value::from("ServiceAccount"),
                &Value::from(name),
                &Value::from(namespace)
            ),
            "{layout} {} {} binds the service account",
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
    assert_eq!(
        bound, roles,
        "{layout}: every role is bound, every binding's role exists"
    );
}

/// The Dockerfile's instructions (comments dropped, continuation lines joined).
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut continued = false;
    for line in dockerfile.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let text = line.trim_end_matches('\\').trim().to_owned();
        match out.last_mut() {
            Some(last) if continued => {
                last.push(' ');
                last.push_str(&text);
            }
            _ => out.push(text),
        }
        continued = line.ends_with('\\');
    }
    out
}

#[test]
fn the_dockerfile_builds_a_non_root_image_that_runs_with_a_read_only_root_filesystem() {
    let dockerfile = std::fs::read_to_string(deploy_dir().join("Dockerfile")).expect("deploy/Dockerfile");
    let lines = instructions(&dockerfile);
    let has = |text: &str| lines.iter().any(|l| l.contains(text));
    let froms: Vec<usize> = (0..lines.len())
        .filter(|i| lines[*i].starts_with("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "a builder and a runtime stage: {lines:?}");
    let (builder, runtime) = (&lines[froms[0]], &lines[froms[1]]);
    assert!(
        builder.starts_with("FROM rust:1") && builder.ends_with(" AS builder"),
        "{builder}"
    );
    // Distroless: no shell, no package manager; its `nonroot` variant.
    assert_eq!(runtime, "FROM gcr.io/distroless/cc-debian12:nonroot");
    assert!(has("cargo build --release -p mcm --locked"));
    assert!(has("cp target/release/mcm /mcm") && has("COPY --from=builder /mcm /mcm"));
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).expect("Cargo.toml");
    assert!(
        manifest.contains("[[bin]]\nname = \"mcm\""),
        "the package's binary is mcm"
    );
    // The runtime stage runs nothing at build time and needs no shell at run time: exec-form ENTRYPOINT and CMD.
    let stage = &lines[froms[1] + 1..];
    for line in stage {
        let instruction = line.split_whitespace().next().unwrap_or_default();
        assert!(
            ["COPY", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "ENV", "LABEL"].contains(&instruction),
            "the runtime stage has no {instruction}: {line}"
        );
    }
    let exec_form = |instruction: &str| -> Vec<String> {
        let line = stage
            .iter()
            .find_map(|l| l.strip_prefix(&format!("{instruction} ")))
            .unwrap_or_else(|| panic!("an {instruction}"));
        serde_json::from_str(line)
            .unwrap_or_else(|err| panic!("{instruction} {line} is not the exec form: {err}"))
    };
    assert_eq!(exec_form("ENTRYPOINT"), ["/mcm"]);
    let default = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args(exec_form("CMD"))
        .output()
        .expect("mcm runs");
    assert!(
        default.status.success(),
        "the image without arguments runs `mcm {:?}`",
        exec_form("CMD")
    );
    // A numeric user (a non-root uid the kubelet can check without /etc/passwd), the one every pod runs as.
    let user = stage
        .iter()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER");
    let (uid, gid) = user.split_once(':').expect("USER uid:gid");
    let (uid, gid): (i64, i64) = (
        uid.parse().expect("a numeric uid"),
        gid.parse().expect("a numeric gid"),
    );
    assert_ne!(uid, 0, "not root");
    let exposed: BTreeSet<i32> = stage
        .iter()
        .filter_map(|l| l.strip_prefix("EXPOSE "))
        .flat_map(str::split_whitespace)
        .map(|p| p.parse().expect("a port"))
        .collect();
    for (layout, manifests) in Manifests::layouts() {
        let security = pod(&manifests).security_context.expect("a pod securityContext");
        assert_eq!(security.run_as_user, Some(uid), "{layout}");
        assert_eq!(security.run_as_group, Some(gid), "{layout}");
        for container in manifests.containers().iter().filter(|c| runs_controllers(c)) {
            let port: i32 = flag_value(container, "--port")
                .and_then(|p| p.parse().ok())
                .expect("--port");
            assert!(
                exposed.contains(&port),
                "{layout} {}: the image exposes {port}: {exposed:?}",
                container.name
            );
        }
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
