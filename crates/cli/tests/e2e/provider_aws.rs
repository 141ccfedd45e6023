//! The AWS provider out of process: `mcm provider aws serve` pointed at moto's EC2 server through
//! `AWS_ENDPOINT_URL`, judged by `mcm provider test` (the conformance suite) with examples/aws/ — only the
//! subnet and security group IDs put in, as the example says. No credential or userData is printed. And, against
//! a fake EC2 that has no capacity, the controller waits `--resource-exhausted-retry` between two creates. In
//! process (`mcm run --provider aws`), the provider's cloud API metrics are on the controllers' `/metrics`.

use crate::support;

use std::{path::PathBuf, process::Command};

use mcm_provider_aws::testing::{FakeEc2, IMAGE, Moto, NO_INSTANCES, Reply, error_xml};
use support::{Background, CONDITION_DEADLINE, Server, address_of, mcm_run_command, poll};

fn examples_aws(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/aws")
        .join(file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_provider_on_moto_passes_the_conformance_suite_with_the_example_class() {
    let moto = Moto::start().await;
    let network = moto.network("shoot--example-nodes").await;

    let dir = std::env::temp_dir().join(format!("mcm-aws-conformance-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a test directory");
    let class = std::fs::read_to_string(examples_aws("01-machine-class.yaml"))
        .expect("examples/aws/01-machine-class.yaml")
        .replace("subnet-0123456789abcdef0", &network.subnet_id)
        .replace("sg-0123456789abcdef0", &network.security_group_id);
    let class_file = dir.join("class.yaml");
    std::fs::write(&class_file, class).unwrap();

    let endpoint = format!("unix://{}", dir.join("provider.sock").display());
    let mut provider = Command::new(env!("CARGO_BIN_EXE_mcm"));
    provider
        .args(["provider", "aws", "serve", "--endpoint", &endpoint])
        .args(["--metrics-address", "127.0.0.1:0"])
        .env("AWS_ENDPOINT_URL", &moto.endpoint)
        .env("MC_LOG_LEVEL", "trace");
    let provider = Background::spawn(provider, "mcm provider aws serve".into());
    provider.wait_for_stdout("the provider to serve", |out| out.contains("serving on"));
    let stdout = provider.stdout();
    let metrics: std::net::SocketAddr = stdout
        .lines()
        .find_map(|l| l.strip_prefix("mcm provider aws: metrics on http://"))
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("the metrics address is printed: {stdout}"));

    let output = tokio::task::spawn_blocking({
        let endpoint = endpoint.clone();
        move || {
            Command::new(env!("CARGO_BIN_EXE_mcm"))
                .args(["provider", "test", "--endpoint", &endpoint, "--class"])
                .arg(&class_file)
                .arg("--secret")
                .arg(examples_aws("00-secret.yaml"))
                .output()
                .expect("mcm provider test runs")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}\nprovider: {}",
        String::from_utf8_lossy(&output.stderr),
        provider.stderr()
    );
    assert!(stdout.contains("PASS") && !stdout.contains("FAIL"), "{stdout}");

    let (status, text) = support::get(metrics, "/metrics");
    assert_eq!(status, 200);
    assert!(
        text.contains(r#"mcm_cloud_api_requests_total{provider="aws",service="ec2"}"#)
            && text.contains(
                r#"mcm_cloud_api_api_request_duration_seconds_count{provider="aws",service="ec2"}"#
            ),
        "{text}"
    );

    // After the suite, no instance of the conformance machines is left running.
    let left = moto
        .ec2(
            "DescribeInstances",
            &[
                ("Filter.1.Name", "instance-state-name"),
                ("Filter.1.Value.1", "pending"),
                ("Filter.1.Value.2", "running"),
            ],
        )
        .await
        .unwrap();
    assert!(
        mcm_provider_aws::testing::all_texts(&left, "instanceId").is_empty(),
        "instances left: {left}"
    );

    let logs = format!("{stdout}{}", String::from_utf8_lossy(&provider.stop().stderr));
    for secret in ["wJalrXUtnFEMI", "bootstrap the kubelet", "IyEvYmluL2Jhc2gK"] {
        assert!(!logs.contains(secret), "{secret} leaked: {logs}");
    }
    moto.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_accepts_the_aws_provider_and_fails_on_the_kubeconfig_only() {
    let output = Command::new(env!("CARGO_BIN_EXE_mcm"))
        .args([
            "run",
            "--provider",
            "aws",
            "--control-kubeconfig",
            "/nonexistent/kubeconfig",
        ])
        .output()
        .expect("mcm runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        !stderr.contains("invalid value"),
        "--provider aws is accepted: {stderr}"
    );
    assert!(stderr.contains("/nonexistent/kubeconfig"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_capacity_is_resource_exhausted_and_the_controller_waits_the_resource_exhausted_retry() {
    let fake = FakeEc2::default();
    fake.on("DescribeInstances", vec![Reply::Answer(200, NO_INSTANCES.into())]);
    fake.on("DescribeImages", vec![Reply::Answer(200, IMAGE.into())]);
    fake.on(
        "RunInstances",
        vec![Reply::Answer(500, error_xml("InsufficientInstanceCapacity"))],
    );
    let ec2 = fake.start().await;
    let server = Server::start("aws-exhausted");
    let endpoint = format!("unix://{}", server.dir.join("aws.sock").display());
    let mut provider = Command::new(env!("CARGO_BIN_EXE_mcm"));
    provider
        .args(["provider", "aws", "serve", "--endpoint", &endpoint])
        .env("AWS_ENDPOINT_URL", &ec2);
    let provider = Background::spawn(provider, "mcm provider aws serve".into());
    provider.wait_for_stdout("the provider to serve", |out| out.contains("serving on"));
    let mut run = mcm_run_command(&server, &["--provider-endpoint", &endpoint]);
    run.args(["--leader-elect=false", "--resource-exhausted-retry=4s"]);
    let run = Background::spawn(run, "mcm run".into());

    server.kubectl_ok(&["apply", "-f", support::arg(&examples_aws("00-secret.yaml"))]);
    server.kubectl_ok(&[
        "apply",
        "-f",
        support::arg(&examples_aws("01-machine-class.yaml")),
    ]);
    let machine = server.write(
        "machine.yaml",
        "apiVersion: machine.sapcloud.io/v1alpha1\nkind: Machine\nmetadata:\n  name: exhausted-0\n  namespace: default\n\
         spec:\n  class:\n    kind: MachineClass\n    name: aws-workers\n",
    );
    server.kubectl_ok(&["apply", "-f", support::arg(&machine)]);

    let deadline = std::time::Instant::now() + std::time::Duration::from_mins(1);
    let calls = loop {
        let calls = fake.calls("RunInstances");
        if calls.len() >= 3 {
            break calls;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a third RunInstances within 60 s: {calls:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    // The controller tries once more right away (the status write of the first failure wakes it; a controller
    // matter, reported), then waits --resource-exhausted-retry between creates.
    let gap = calls[2].0 - calls[1].0;
    assert!(
        gap >= std::time::Duration::from_millis(3500) && gap < std::time::Duration::from_secs(15),
        "the third create came {gap:?} after the second, expected about --resource-exhausted-retry (4s)"
    );
    let description = server.kubectl_ok(&[
        "get",
        "machine",
        "exhausted-0",
        "-o",
        "jsonpath={.status.lastOperation.description}",
    ]);
    assert!(
        description.contains("InsufficientInstanceCapacity"),
        "{description}"
    );
    drop(run);
    drop(provider);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_the_providers_cloud_api_metrics_are_on_the_controllers_metrics() {
    let moto = Moto::start().await;
    let network = moto.network("shoot--example-nodes").await;
    let server = Server::start("aws-in-process-metrics");
    let class = std::fs::read_to_string(examples_aws("01-machine-class.yaml"))
        .expect("examples/aws/01-machine-class.yaml")
        .replace("subnet-0123456789abcdef0", &network.subnet_id)
        .replace("sg-0123456789abcdef0", &network.security_group_id);
    let class_file = server.write("01-machine-class.yaml", &class);
    let mut run = mcm_run_command(&server, &["--provider", "aws"]);
    run.arg("--leader-elect=false")
        .env("AWS_ENDPOINT_URL", &moto.endpoint);
    let run = Background::spawn(run, "mcm run --provider aws".into());
    let address = address_of(&run);

    server.kubectl_ok(&["apply", "-f", support::arg(&examples_aws("00-secret.yaml"))]);
    server.kubectl_ok(&["apply", "-f", support::arg(&class_file)]);
    let machine = server.write(
        "machine.yaml",
        "apiVersion: machine.sapcloud.io/v1alpha1\nkind: Machine\nmetadata:\n  name: metered-0\n  namespace: default\n\
         spec:\n  class:\n    kind: MachineClass\n    name: aws-workers\n",
    );
    server.kubectl_ok(&["apply", "-f", support::arg(&machine)]);
    let provider_id = poll("machine metered-0 created on moto", CONDITION_DEADLINE, || {
        let id = server.kubectl_ok(&["get", "machine", "metered-0", "-o", "jsonpath={.spec.providerID}"]);
        id.starts_with("aws:///eu-west-1/i-").then_some(id)
    });

    // A failing request: DescribeImages of an AMI that does not exist.
    let broken_class = class
        .replace("name: aws-workers", "name: aws-broken")
        .replace("ami-12c6146b", "ami-00000000000000000");
    server.kubectl_ok(&[
        "apply",
        "-f",
        support::arg(&server.write("broken-class.yaml", &broken_class)),
    ]);
    let broken = server.write(
        "broken.yaml",
        "apiVersion: machine.sapcloud.io/v1alpha1\nkind: Machine\nmetadata:\n  name: broken-0\n  namespace: default\n\
         spec:\n  class:\n    kind: MachineClass\n    name: aws-broken\n",
    );
    server.kubectl_ok(&["apply", "-f", support::arg(&broken)]);
    poll("broken-0 reports the unknown AMI", CONDITION_DEADLINE, || {
        let description = server.kubectl_ok(&[
            "get",
            "machine",
            "broken-0",
            "-o",
            "jsonpath={.status.lastOperation.description}",
        ]);
        description.contains("providerSpec.ami").then_some(())
    });

    let (status, text) = support::get(address, "/metrics");
    assert_eq!(status, 200, "{text}");
    // The provider's families (labels as the reference's: provider, service), beside the controllers' own.
    for line in [
        "# TYPE mcm_cloud_api_requests counter",
        "# TYPE mcm_cloud_api_requests_failed counter",
        "# TYPE mcm_cloud_api_api_request_duration_seconds histogram",
        r#"mcm_cloud_api_api_request_duration_seconds_count{provider="aws",service="ec2"}"#,
        r#"mcm_cloud_api_requests_failed_total{provider="aws",service="ec2"}"#,
        r#"mcm_cloud_api_driver_request_duration_seconds_count{provider="aws",operation="CreateMachine"}"#,
        "# TYPE mcm_machine_items_total gauge",
    ] {
        assert!(text.contains(line), "{line} on /metrics:\n{text}");
    }
    // DescribeImages (twice), RunInstances and DescribeInstances at least, each counted.
    let requests: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(r#"mcm_cloud_api_requests_total{provider="aws",service="ec2"} "#))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("mcm_cloud_api_requests_total of ec2 on /metrics:\n{text}"));
    assert!(requests >= 4, "{requests} EC2 requests counted:\n{text}");
    assert_eq!(text.matches("# EOF").count(), 1, "one exposition:\n{text}");

    server.kubectl_ok(&[
        "delete",
        "machine",
        "metered-0",
        "broken-0",
        "--wait=true",
        "--timeout=60s",
    ]);
    let instance = provider_id.rsplit('/').next().unwrap_or_default().to_owned();
    let xml = moto
        .ec2("DescribeInstances", &[("InstanceId.1", &instance)])
        .await
        .unwrap();
    let instance_states = mcm_provider_aws::testing::all_texts(&xml, "name");
    assert!(
        instance_states
            .iter()
            .any(|s| s == "terminated" || s == "shutting-down"),
        "{instance} terminated with its machine: {instance_states:?}"
    );
    drop(run);
    moto.stop().await;
}
