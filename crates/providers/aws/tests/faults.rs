//! Faults moto cannot produce, from an in-process fake EC2 (a loopback TCP server answering scripted Query-API
//! answers per action): capacity and quota errors, throttling, 5xx, a dropped connection, a slow answer,
//! authentication errors. Each mapping to a machine code is asserted, and so is what the message carries: AWS's
//! error code and request ID, never a credential or the userData.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use mcm_api::builders::{MachineBuilder, MachineClassBuilder};
use mcm_driver::{CreateMachineRequest, DeleteMachineRequest, Driver, DriverError, MachineCode};
use mcm_provider_aws::testing::{FakeEc2, IMAGE, LAUNCHED, NO_INSTANCES, Reply, error_xml};
use mcm_provider_aws::{AwsConfig, AwsDriver, RetryPolicy};

/// Also in the fake's echoed messages ([`mcm_provider_aws::testing::ECHO`]).
const SECRET_KEY: &str = "fake-secret-access-key-never-shown";
const USER_DATA: &str = "#!/bin/sh\necho user-data-never-shown\n";

fn driver(endpoint: &str, attempts: u32) -> AwsDriver {
    AwsDriver::new(AwsConfig {
        ec2_endpoint: Some(endpoint.into()),
        sts_endpoint: Some(endpoint.into()),
        retry: RetryPolicy {
            attempts,
            base: Duration::from_millis(10),
            max: Duration::from_millis(40),
        },
        call_timeout: Duration::from_millis(500),
        dns_wait: Duration::from_secs(5),
        page_size: 1000,
    })
}

fn request() -> CreateMachineRequest {
    let class = MachineClassBuilder::new("c")
        .namespace("default")
        .provider("AWS")
        .provider_spec(serde_json::json!({
            "ami": "ami-1", "region": "eu-west-1", "machineType": "m5.large", "iam": {"name": "p"},
            "networkInterfaces": [{"subnetID": "subnet-1", "securityGroupIDs": ["sg-1"]}],
            "tags": {"kubernetes.io/cluster/c": "1", "kubernetes.io/role/node": "1"}
        }))
        .build();
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "s", "namespace": "default"},
        "stringData": {"accessKeyID": "AKIAFAKE", "secretAccessKey": SECRET_KEY, "userData": USER_DATA}
    }))
    .unwrap();
    let machine = MachineBuilder::new("m-0")
        .namespace("default")
        .uid("u-1")
        .class("c")
        .build();
    CreateMachineRequest {
        machine,
        machine_class: class,
        secret,
    }
}

async fn create_with(run_instances: Vec<Reply>, attempts: u32) -> (FakeEc2, Result<String, DriverError>) {
    let fake = FakeEc2::default();
    fake.on("DescribeInstances", vec![Reply::Answer(200, NO_INSTANCES.into())]);
    fake.on("DescribeImages", vec![Reply::Answer(200, IMAGE.into())]);
    fake.on("RunInstances", run_instances);
    let endpoint = fake.start().await;
    let result = driver(&endpoint, attempts)
        .create_machine(&request())
        .await
        .map(|r| r.provider_id);
    (fake, result)
}

fn assert_clean(err: &DriverError) {
    for secret in [SECRET_KEY, "user-data-never-shown", "AKIAFAKE"] {
        assert!(!err.message.contains(secret), "{secret} in {err}");
    }
}

#[tokio::test]
async fn capacity_and_quota_errors_are_resource_exhausted_with_code_and_request_id() {
    for code in mcm_provider_aws::client::RESOURCE_EXHAUSTED_CODES {
        let (fake, result) = create_with(vec![Reply::Answer(400, error_xml(code))], 4).await;
        let err = result.unwrap_err();
        assert_eq!(err.code, MachineCode::ResourceExhausted, "{code}: {err}");
        assert!(
            err.message.contains(code) && err.message.contains(&format!("req-{code}")),
            "{err}"
        );
        assert_clean(&err);
        assert_eq!(
            fake.calls("RunInstances").len(),
            1,
            "{code} is not retried by the provider"
        );
    }
}

#[tokio::test]
async fn throttling_is_retried_with_the_same_client_token_then_succeeds() {
    let throttled = Reply::Answer(503, error_xml("RequestLimitExceeded"));
    let (fake, result) = create_with(
        vec![throttled.clone(), throttled, Reply::Answer(200, LAUNCHED.into())],
        4,
    )
    .await;
    assert_eq!(result.unwrap(), "aws:///eu-west-1/i-0fake");
    let calls = fake.calls("RunInstances");
    assert_eq!(calls.len(), 3);
    let tokens: Vec<_> = calls.iter().map(|(_, c)| c["ClientToken"].clone()).collect();
    assert!(
        tokens.iter().all(|t| *t == tokens[0]),
        "one ClientToken across retries: {tokens:?}"
    );
    assert_eq!(calls[0].1["MinCount"], "1");
    assert_eq!(calls[0].1["MaxCount"], "1");
}

#[tokio::test]
async fn throttling_5xx_drops_and_slow_answers_that_persist_are_unavailable() {
    let cases = [
        (
            "throttling",
            Reply::Answer(503, error_xml("RequestLimitExceeded")),
        ),
        (
            "500 InternalError",
            Reply::Answer(500, error_xml("InternalError")),
        ),
        (
            "503 without XML",
            Reply::Answer(503, "Service Unavailable".into()),
        ),
        ("dropped connection", Reply::Drop),
        (
            "slow answer",
            Reply::Slow(Duration::from_secs(2), 200, LAUNCHED.into()),
        ),
    ];
    for (what, reply) in cases {
        let (fake, result) = create_with(vec![reply], 3).await;
        let err = result.unwrap_err();
        assert_eq!(err.code, MachineCode::Unavailable, "{what}: {err}");
        assert!(err.message.contains("RunInstances"), "{what}: {err}");
        assert_clean(&err);
        assert_eq!(fake.calls("RunInstances").len(), 3, "{what}: tried 3 times");
    }
}

#[tokio::test]
async fn authentication_permission_and_other_errors() {
    let cases = [
        ("AuthFailure", 401, MachineCode::Unauthenticated),
        ("SignatureDoesNotMatch", 403, MachineCode::Unauthenticated),
        ("UnauthorizedOperation", 403, MachineCode::PermissionDenied),
        ("InvalidParameterValue", 400, MachineCode::Internal),
        ("InvalidSubnetID.NotFound", 400, MachineCode::NotFound),
    ];
    for (code, status, want) in cases {
        let (_, result) = create_with(vec![Reply::Answer(status, error_xml(code))], 3).await;
        let err = result.unwrap_err();
        assert_eq!(err.code, want, "{code}: {err}");
        assert!(err.message.contains(code), "{err}");
        assert_clean(&err);
    }
}

#[tokio::test]
async fn terminating_an_instance_that_is_gone_is_success() {
    let fake = FakeEc2::default();
    fake.on(
        "TerminateInstances",
        vec![Reply::Answer(400, error_xml("InvalidInstanceID.NotFound"))],
    );
    let endpoint = fake.start().await;
    let create = request();
    let mut machine = create.machine.clone();
    machine.spec.provider_id = "aws:///eu-west-1/i-0gone".into();
    driver(&endpoint, 2)
        .delete_machine(&DeleteMachineRequest {
            machine,
            machine_class: create.machine_class,
            secret: create.secret,
        })
        .await
        .expect("a gone instance is deleted");
    assert_eq!(fake.calls("TerminateInstances")[0].1["InstanceId.1"], "i-0gone");
}

#[tokio::test]
async fn every_request_is_counted_in_the_references_cloud_api_metrics() {
    let fake = FakeEc2::default();
    fake.on("DescribeInstances", vec![Reply::Answer(200, NO_INSTANCES.into())]);
    fake.on("DescribeImages", vec![Reply::Answer(200, IMAGE.into())]);
    let throttled = Reply::Answer(503, error_xml("RequestLimitExceeded"));
    fake.on(
        "RunInstances",
        vec![throttled, Reply::Answer(200, LAUNCHED.into())],
    );
    let endpoint = fake.start().await;
    let driver = driver(&endpoint, 3);
    driver
        .create_machine(&request())
        .await
        .expect("created after one retry");
    let text = driver.metrics().encode();
    // DescribeInstances, DescribeImages, RunInstances twice.
    for line in [
        r#"mcm_cloud_api_requests_total{provider="aws",service="ec2"} 4"#,
        r#"mcm_cloud_api_requests_failed_total{provider="aws",service="ec2"} 1"#,
        r#"mcm_cloud_api_api_request_duration_seconds_count{provider="aws",service="ec2"} 4"#,
    ] {
        assert!(text.contains(line), "{line} not in {text}");
    }
}
