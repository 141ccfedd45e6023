//! The figures of docs/benchmarks.md: 100 machines created, then deleted, through the AWS driver on moto (one
//! call at a time): AWS requests per machine and p50/p99 of each call, as one JSON line. A benchmark, not a test (about
//! a minute; needs moto's `moto_server` on PATH): `cargo run -p mcm-provider-aws --example aws_bench`.

use std::time::{Duration, Instant};

use mcm_api::builders::{MachineBuilder, MachineClassBuilder};
use mcm_driver::{CreateMachineRequest, DeleteMachineRequest, Driver};
use mcm_provider_aws::testing::{Moto, provider_spec};
use mcm_provider_aws::{AwsConfig, AwsDriver};

const MACHINES: usize = 100;
/// [`MACHINES`] as a divisor.
const MACHINES_F64: f64 = 100.0;

/// The `percent`-th percentile (nearest rank) of sorted durations.
fn percentile(sorted: &[Duration], percent: usize) -> Duration {
    sorted[((sorted.len() - 1) * percent).div_ceil(100)]
}

fn requests(driver: &AwsDriver) -> f64 {
    let text = driver.metrics().encode();
    text.lines()
        .find_map(|l| l.strip_prefix(r#"mcm_cloud_api_requests_total{provider="aws",service="ec2"} "#))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let moto = Moto::start().await;
    let network = moto.network("bench-nodes").await;
    let driver = AwsDriver::new(AwsConfig {
        ec2_endpoint: Some(moto.endpoint.clone()),
        ..AwsConfig::default()
    });
    let class = MachineClassBuilder::new("bench")
        .namespace("default")
        .provider("AWS")
        .provider_spec(provider_spec(&network))
        .build();
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "bench"},
        "stringData": {"accessKeyID": "AKIA", "secretAccessKey": "x", "userData": "#!/bin/sh\n"}
    }))
    .unwrap();
    let machine = |i: usize, provider_id: &str| {
        MachineBuilder::new(&format!("bench-{i}"))
            .namespace("default")
            .uid(&format!("u-{i}"))
            .provider_id(provider_id)
            .build()
    };
    let mut creates = Vec::new();
    let mut ids = Vec::new();
    for i in 0..MACHINES {
        let started = Instant::now();
        let answer = driver
            .create_machine(&CreateMachineRequest {
                machine: machine(i, ""),
                machine_class: class.clone(),
                secret: secret.clone(),
            })
            .await
            .expect("create");
        creates.push(started.elapsed());
        ids.push(answer.provider_id);
    }
    let create_requests = requests(&driver);
    let mut deletes = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let started = Instant::now();
        driver
            .delete_machine(&DeleteMachineRequest {
                machine: machine(i, id),
                machine_class: class.clone(),
                secret: secret.clone(),
            })
            .await
            .expect("delete");
        deletes.push(started.elapsed());
    }
    let delete_requests = requests(&driver) - create_requests;
    creates.sort();
    deletes.sort();
    println!(
        "{{\"machines\": {MACHINES}, \"create\": {{\"requests_per_machine\": {:.1}, \"p50_ms\": {}, \"p99_ms\": {}}}, \
         \"delete\": {{\"requests_per_machine\": {:.1}, \"p50_ms\": {}, \"p99_ms\": {}}}}}",
        create_requests / MACHINES_F64,
        percentile(&creates, 50).as_millis(),
        percentile(&creates, 99).as_millis(),
        delete_requests / MACHINES_F64,
        percentile(&deletes, 50).as_millis(),
        percentile(&deletes, 99).as_millis(),
    );
    moto.stop().await;
}
