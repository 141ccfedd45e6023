//! The layouts of `deploy/` beyond the base, as `kubectl kustomize` renders them: `overlays/aws-grpc` is the base
//! with the AWS provider as its gRPC sidecar and nothing else changed, `overlays/single` is one process, and
//! `overlays/seed-aws` is Gardener's seed layout: the reference's two containers with Gardener's names, ports and
//! arguments, the control cluster in-cluster, the target cluster's kubeconfig from a Secret, and the base's RBAC split
//! between the control cluster (the seed) and the target cluster (`overlays/seed-aws/target-cluster`). What every
//! layout must satisfy (arguments the binary parses, probes, security, bindings) is checked in `deploy_manifests.rs`.

use crate::support::{self, deploy};

use std::{collections::BTreeSet, path::Path, process::Command, time::Duration};

use deploy::{
    Manifests, PROVIDER, Permission, Rbac, SEED_TARGET, Scope, flag_value, losses, mount_at, pod,
    runs_controllers, serves_provider,
};
use serde_json::Value;
use support::{Background, Server, address_of, get, poll};

/// How long a process of the seed layout may take to become ready and take its Lease.
const READY_DEADLINE: Duration = Duration::from_mins(1);

/// The seed layout's kustomization.
const SEED: &str = "overlays/seed-aws";
/// The arguments Gardener gives the reference's machine-controller-manager container (gardener/gardener,
/// pkg/component/nodemanagement/machinecontrollermanager/machine_controller_manager.go); `NAMESPACE` is the control
/// namespace. The seed layout passes them unchanged.
const GARDENER_MCM_ARGS: &[&str] = &[
    "--control-kubeconfig=inClusterConfig",
    "--machine-safety-overshooting-period=1m",
    "--namespace=NAMESPACE",
    "--port=10258",
    "--safety-up=2",
    "--safety-down=1",
    "--target-kubeconfig=/var/run/secrets/gardener.cloud/shoot/generic-kubeconfig/kubeconfig",
    "--v=3",
];

/// The arguments Gardener gives the provider's machine-controller container (provider.go there,
/// `ProviderSidecarContainer`, as the AWS extension injects it).
const GARDENER_PROVIDER_ARGS: &[&str] = &[
    "--control-kubeconfig=inClusterConfig",
    "--kube-api-qps=100",
    "--kube-api-burst=200",
    "--machine-creation-timeout=20m",
    "--machine-drain-timeout=2h",
    "--machine-health-timeout=10m",
    "--machine-safety-apiserver-statuscheck-timeout=30s",
    "--machine-safety-apiserver-statuscheck-period=1m",
    "--machine-safety-orphan-vms-period=30m",
    "--namespace=NAMESPACE",
    "--port=10259",
    "--target-kubeconfig=/var/run/secrets/gardener.cloud/shoot/generic-kubeconfig/kubeconfig",
    "--v=3",
];

/// The Deployment of the pod without its provider container, as JSON.
fn without_provider(manifests: &Manifests) -> Value {
    let mut value = serde_json::to_value(manifests.deployment()).expect("serializes");
    let containers = value["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .expect("containers");
    containers.retain(|c| c["name"] != PROVIDER);
    value
}

/// `overlays/aws-grpc` is the base with `mcm provider aws serve` as the sidecar: the rest of the pod cannot drift
/// apart. Its provider-side metrics port is declared and is not the controller's.
#[test]
fn the_aws_grpc_layout_differs_from_the_base_in_its_provider_container_only() {
    let layouts = Manifests::layouts();
    let find = |name: &str| &layouts.iter().find(|(n, _)| *n == name).expect("the layout").1;
    let (base, aws) = (find("base"), find("aws-grpc"));
    let mut lost = Vec::new();
    losses(&without_provider(base), &without_provider(aws), "", &mut lost);
    losses(&without_provider(aws), &without_provider(base), "", &mut lost);
    assert!(
        lost.is_empty(),
        "overlays/aws-grpc differs from the base outside the provider container:\n{}",
        lost.join("\n")
    );
    let provider = aws.container(PROVIDER);
    assert_eq!(serves_provider(&provider).as_deref(), Some("aws"));
    let metrics: std::net::SocketAddr = flag_value(&provider, "--metrics-address")
        .expect("the AWS sidecar serves its metrics")
        .parse()
        .expect("an address");
    let ports = provider.ports.unwrap_or_default();
    assert!(
        ports
            .iter()
            .any(|p| p.container_port == i32::from(metrics.port()) && p.name.is_some()),
        "the sidecar's metrics port {} is a named container port: {ports:?}",
        metrics.port()
    );
    // Everything else the base renders is the same (the overlay changes the Deployment, and leaves out the CRDs).
    let others = |m: &Manifests| -> Vec<Value> {
        m.documents
            .iter()
            .filter(|d| !["Deployment", "CustomResourceDefinition"].contains(&d.kind()))
            .map(|d| d.value.clone())
            .collect()
    };
    assert!(
        others(base) == others(aws),
        "overlays/aws-grpc changes nothing but the Deployment"
    );
}

/// `overlays/single` is one container running every controller and the AWS provider in-process.
#[test]
fn the_single_layout_is_one_process_with_the_aws_provider() {
    let single = Manifests::render("overlays/single");
    let containers = single.containers();
    assert_eq!(containers.len(), 1, "one container");
    let container = &containers[0];
    assert!(runs_controllers(container));
    assert_eq!(flag_value(container, "--provider").as_deref(), Some("aws"));
    assert_eq!(flag_value(container, "--controllers"), None, "every controller");
    assert_eq!(flag_value(container, "--provider-endpoint"), None);
    let volumes: Vec<String> = pod(&single)
        .volumes
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(volumes, ["service-account"], "no socket volume left");
}

/// Gardener's seed layout: the two containers of the reference's pod, with Gardener's names, ports and arguments,
/// the control cluster in-cluster and the target cluster's kubeconfig from a Secret.
#[test]
fn the_seed_layout_is_gardeners_two_containers_with_gardeners_arguments() {
    let seed = Manifests::render(SEED);
    let (namespace, _) = seed.service_account();
    let names: Vec<String> = seed.containers().into_iter().map(|c| c.name).collect();
    assert_eq!(
        names,
        [
            "machine-controller-manager",
            "machine-controller-manager-provider-aws"
        ]
    );
    let volumes = pod(&seed).volumes.unwrap_or_default();
    for (name, controllers, port, gardener) in [
        (
            "machine-controller-manager",
            "machine-controller-manager",
            10258,
            GARDENER_MCM_ARGS,
        ),
        (
            "machine-controller-manager-provider-aws",
            "machine-controller",
            10259,
            GARDENER_PROVIDER_ARGS,
        ),
    ] {
        let container = seed.container(name);
        assert!(runs_controllers(&container), "{name} runs `mcm run`");
        assert_eq!(
            flag_value(&container, "--controllers").as_deref(),
            Some(controllers),
            "{name} plays the reference's {controllers}"
        );
        // The controller manager calls no provider and names none, as the reference's.
        let provider = (controllers == "machine-controller").then_some("aws");
        assert_eq!(
            flag_value(&container, "--provider").as_deref(),
            provider,
            "{name}"
        );
        let args = container.args.clone().unwrap_or_default();
        for arg in gardener {
            let arg = arg.replace("NAMESPACE", &namespace);
            assert!(args.contains(&arg), "{name} has Gardener's {arg}: {args:?}");
        }
        assert!(
            container.ports.iter().flatten().any(|p| p.container_port == port),
            "{name} declares {port}"
        );
        assert!(
            container.env.iter().flatten().all(|e| e.name != "NODE_NAME"),
            "{name}: the pod runs in the seed, whose nodes are none of the target cluster's (--controller-node)"
        );
        assert_eq!(
            flag_value(&container, "--control-kubeconfig").as_deref(),
            Some("inClusterConfig")
        );
        let kubeconfig = flag_value(&container, "--target-kubeconfig").expect("--target-kubeconfig");
        let path = Path::new(&kubeconfig);
        let directory = path.parent().and_then(Path::to_str).expect("a directory");
        let file = path.file_name().and_then(|f| f.to_str()).expect("a file name");
        let volume_name = mount_at(&container, directory)
            .unwrap_or_else(|| panic!("{name} mounts the target kubeconfig's directory {directory}"));
        let secret = volumes
            .iter()
            .find(|v| v.name == volume_name)
            .and_then(|v| v.secret.clone())
            .unwrap_or_else(|| panic!("{name}: {directory} is a Secret volume"));
        assert_eq!(secret.secret_name.as_deref(), Some("target-kubeconfig"));
        assert!(
            secret
                .items
                .iter()
                .flatten()
                .any(|item| item.key == "kubeconfig" && item.path == file),
            "the Secret's key kubeconfig is the file {file}"
        );
    }
}

/// The seed layout keeps only the control cluster's rules in the seed (nothing outside the Deployment's namespace)
/// and applies the target cluster's to the target cluster, bound to an identity there: together exactly the base's
/// rules, which `deploy_rbac.rs` checks against a live run.
#[test]
fn the_seed_layout_splits_the_base_rules_between_the_control_and_the_target_cluster() {
    let grants =
        |rbac: &Rbac| -> BTreeSet<String> { rbac.permissions().iter().map(Permission::grants).collect() };
    let base = grants(&Manifests::load().rbac());
    let seed = Manifests::render(SEED);
    let (namespace, _) = seed.service_account();
    let control = seed.rbac();
    for grant in &control.grants {
        assert_eq!(
            grant.scope,
            Scope::Namespace(namespace.clone()),
            "the seed grants nothing outside {namespace}: {}",
            grant.source
        );
    }
    assert_eq!(
        seed.of_kind("ClusterRole").count() + seed.of_kind("ClusterRoleBinding").count(),
        0,
        "no cluster-wide object of RBAC in the seed"
    );
    let target_manifests = Manifests::render(SEED_TARGET);
    let target = Rbac::for_service_account(&target_manifests, "kube-system", "machine-controller-manager");
    let mut split = grants(&control);
    let on_target = grants(&target);
    assert!(
        split.is_disjoint(&on_target),
        "no rule is granted in both clusters"
    );
    split.extend(on_target);
    assert_eq!(
        split, base,
        "the seed's and the target cluster's rules are the base's"
    );
    // The token the target kubeconfig is built from belongs to that identity.
    let token = target_manifests.of_kind("Secret").next().expect("a token Secret");
    assert_eq!(token.value["type"], "kubernetes.io/service-account-token");
    assert_eq!(
        token.value["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "machine-controller-manager"
    );
    assert_eq!(token.namespace(), "kube-system");
}

/// Both containers of the seed layout run with their arguments against the embedded API server as the control and
/// the target cluster (the kubeconfigs and the port replaced: a pod has them, a test has not): each answers its
/// probes and takes the Lease of its role, so the two processes together are the reference's pod.
#[test]
fn the_seed_layouts_two_processes_run_with_their_arguments() {
    let seed = Manifests::render(SEED);
    let (namespace, _) = seed.service_account();
    let server = Server::start("deploy-seed");
    server.kubectl_ok(&["create", "namespace", &namespace]);
    let replaced = ["--control-kubeconfig", "--target-kubeconfig", "--port"];
    let kubeconfig = server.kubeconfig();
    let processes: Vec<(String, Background)> = seed
        .containers()
        .into_iter()
        .map(|container| {
            let args: Vec<String> = container
                .args
                .unwrap_or_default()
                .into_iter()
                .filter(|a| !replaced.contains(&a.split('=').next().unwrap_or_default()))
                .collect();
            let mut command = Command::new(env!("CARGO_BIN_EXE_mcm"));
            command
                .args(&args)
                .arg("--control-kubeconfig")
                .arg(&kubeconfig)
                .arg("--target-kubeconfig")
                .arg(&kubeconfig)
                .args(["--port", "0", "--address", "127.0.0.1"])
                .env_remove("NODE_NAME");
            let process = Background::spawn(command, container.name.clone());
            (container.name, process)
        })
        .collect();
    for (name, process) in &processes {
        let address = address_of(process);
        poll(&format!("{name}: /readyz 200"), READY_DEADLINE, || {
            (get(address, "/readyz").0 == 200).then_some(())
        });
        assert_eq!(get(address, "/healthz").0, 200, "{name}");
    }
    for lease in ["machine-controller-manager", "machine-controller"] {
        poll(&format!("the Lease {lease} held"), READY_DEADLINE, || {
            let output = server.kubectl(&[
                "-n",
                &namespace,
                "get",
                "lease",
                lease,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ]);
            (output.status.success() && !output.stdout.is_empty()).then_some(())
        });
    }
    for (name, process) in processes {
        let output = process.terminate(READY_DEADLINE);
        assert!(
            output.status.success(),
            "{name} stops cleanly on SIGTERM: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
