//! Benchmark of the embedded API server (a benchmark, not a test): creates per second, patches per second and
//! watch event latency, through the real `kube` client over HTTPS, with N objects.
//!
//! ```sh
//! cargo run --release -p mcm-apiserver --example apiserver_bench -- --objects 10000 --concurrency 16 [--in-memory]
//! ```
//! Prints one JSON object. Figures and how to read them: docs/apiserver.md.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams, WatchEvent, WatchParams},
};
use mcm_api::{Machine, builders::MachineBuilder};

struct Options {
    objects: usize,
    concurrency: usize,
    in_memory: bool,
    latency_samples: usize,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        objects: 10_000,
        concurrency: 16,
        in_memory: false,
        latency_samples: 500,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a positive number"))
        };
        match arg.as_str() {
            "--objects" => options.objects = number("--objects")?,
            "--concurrency" => options.concurrency = number("--concurrency")?.max(1),
            "--latency-samples" => options.latency_samples = number("--latency-samples")?,
            "--in-memory" => options.in_memory = true,
            other => {
                return Err(format!(
                    "unknown argument {other}; see the file's header for usage"
                ));
            }
        }
    }
    Ok(options)
}

fn machine(name: &str) -> Machine {
    MachineBuilder::new(name).class("bench").build()
}

/// Runs `total` operations with `concurrency` workers and returns operations per second.
async fn throughput<F, Fut>(total: usize, concurrency: usize, op: F) -> Result<f64, kube::Error>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    let start = Instant::now();
    futures::stream::iter(0..total)
        .map(&op)
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(rate(total, start.elapsed()))
}

#[allow(clippy::cast_precision_loss)] // counts far below 2^52
fn rate(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let index = (((sorted.len() - 1) as f64) * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = options()?;
    let dir = tempfile::tempdir()?;
    let mut config = mcm_apiserver::Config::new(dir.path());
    config.in_memory = options.in_memory;
    config.watch_window = options.objects * 3;
    let server = mcm_apiserver::ApiServer::start(config).await?;
    let kubeconfig = kube::config::Kubeconfig::read_from(server.kubeconfig())?;
    let client_config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await?;
    let client = Client::try_from(client_config)?;
    let api: Api<Machine> = Api::namespaced(client, "default");

    let names: Vec<String> = (0..options.objects).map(|i| format!("bench-{i:06}")).collect();
    let creates = throughput(options.objects, options.concurrency, |i| {
        let (api, object) = (api.clone(), machine(&names[i]));
        async move { api.create(&PostParams::default(), &object).await.map(|_| ()) }
    })
    .await?;

    let patches = throughput(options.objects, options.concurrency, |i| {
        let (api, name) = (api.clone(), names[i].clone());
        async move {
            let patch = serde_json::json!({ "metadata": { "labels": { "round": "1" } } });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
    })
    .await?;

    // Watch latency: one watcher; patches sent one at a time, each timed from send to the watcher seeing it.
    let list = api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await?;
    let rv = list.metadata.resource_version.unwrap_or_default();
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut stream = api.watch(&WatchParams::default(), &rv).await?.boxed();
    let samples = options.latency_samples.min(options.objects);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watcher_sent = Arc::clone(&sent);
    let watcher = tokio::spawn(async move {
        while let Some(Ok(event)) = stream.next().await {
            if let WatchEvent::Modified(machine) = event
                && let Some(name) = machine.metadata.name
                && let Some(start) = watcher_sent.lock().map(|mut m| m.remove(&name)).ok().flatten()
                && tx.send(start.elapsed()).is_err()
            {
                return;
            }
        }
    });
    let mut latencies = Vec::with_capacity(samples);
    for name in names.iter().take(samples) {
        let patch = serde_json::json!({ "metadata": { "labels": { "round": "2" } } });
        if let Ok(mut map) = sent.lock() {
            map.insert(name.clone(), Instant::now());
        }
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some(latency)) => latencies.push(latency),
            _ => return Err("the watcher did not see a patch within 10 s".into()),
        }
    }
    watcher.abort();
    latencies.sort();
    let report = serde_json::json!({
        "objects": options.objects,
        "concurrency": options.concurrency,
        "store": if options.in_memory { "memory" } else { "disk (redb, fsync per write)" },
        "creates_per_second": (creates * 10.0).round() / 10.0,
        "patches_per_second": (patches * 10.0).round() / 10.0,
        "watch_latency_ms": {
            "samples": latencies.len(),
            "p50": percentile(&latencies, 0.5),
            "p99": percentile(&latencies, 0.99),
            "max": percentile(&latencies, 1.0),
        },
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    server.shutdown().await;
    Ok(())
}
