//! How the on-disk store's write cost changes with its size (issue 26; a measurement, not a test): the store is
//! first filled with `--stored` Machine-sized objects (about 2.5 KB of JSON each, written straight into the store
//! in large transactions), then the embedded API server is started on it and `--ops` creates and as many merge
//! patches are sent through the real `kube` client over HTTPS, once per writer count of `--writers`.
//!
//! ```sh
//! cargo run --release -p mcm-apiserver --example store_write_cost -- --stored 100000 --ops 2000 --writers 1,50
//! ```
//! `--direct` calls the store itself from `--writers` threads instead (no HTTP, no server), to tell the store's
//! own cost from the server's. Prints one JSON document; figures and how to read them: docs/benchmarks.md,
//! "On-disk store: write cost against size (issue 26)".

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use mcm_api::{Machine, builders::MachineBuilder};
use mcm_apiserver::store::{Mutation, Store};
use serde_json::{Value, json};

const RESOURCE: &str = "machine.sapcloud.io/machines";
const NAMESPACE: &str = "default";

struct Options {
    stored: usize,
    ops: usize,
    writers: Vec<usize>,
    direct: bool,
    dir: Option<std::path::PathBuf>,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        stored: 10_000,
        ops: 2_000,
        writers: vec![1, 50],
        direct: false,
        dir: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let number = |name: &str, text: String| -> Result<usize, String> {
            text.parse()
                .map_err(|_| format!("{name}: {text:?} is not a number"))
        };
        match arg.as_str() {
            "--stored" => options.stored = number("--stored", value("--stored")?)?,
            "--ops" => options.ops = number("--ops", value("--ops")?)?.max(1),
            "--writers" => {
                options.writers = value("--writers")?
                    .split(',')
                    .map(|w| number("--writers", w.to_owned()).map(|n| n.max(1)))
                    .collect::<Result<_, _>>()?;
            }
            "--direct" => options.direct = true,
            "--dir" => options.dir = Some(value("--dir")?.into()),
            other => {
                return Err(format!(
                    "unknown argument {other}; see the file's header for usage"
                ));
            }
        }
    }
    Ok(options)
}

/// A Machine as the controllers leave it once it runs: labels, a provider ID, a node, conditions and the last
/// operation, about 2.5 KB of JSON.
fn machine(name: &str) -> Machine {
    let mut machine = MachineBuilder::new(name).class("bench").build();
    let conditions: Vec<Value> = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"]
        .iter()
        .map(|t| {
            json!({
                "type": t, "status": if *t == "Ready" { "True" } else { "False" },
                "lastHeartbeatTime": "2026-11-26T19:00:00Z", "lastTransitionTime": "2026-11-26T18:55:00Z",
                "reason": format!("Kubelet{t}"), "message": format!("kubelet reports {t} as expected for this node"),
            })
        })
        .collect();
    let value = json!({
        "metadata": {
            "labels": { "name": "bench", "machine-template-hash": "5d8f9c7b6", "node.machine.sapcloud.io/role": "worker" },
            "annotations": { "machinepriority.machine.sapcloud.io": "3", "note": "x".repeat(600) },
            "finalizers": ["machine.sapcloud.io/machine-controller-manager"],
        },
        "spec": { "providerID": format!("sim:///eu-west-1/i-{name}") },
        "status": {
            "node": name,
            "currentStatus": { "phase": "Running", "lastUpdateTime": "2026-11-26T19:00:00Z" },
            "lastOperation": {
                "description": "Machine bench is running: the node joined and reports Ready with every condition as expected",
                "lastUpdateTime": "2026-11-26T19:00:00Z", "state": "Successful", "type": "Create",
            },
            "conditions": conditions,
        },
    });
    let mut object = serde_json::to_value(&machine).unwrap_or_default();
    merge(&mut object, value);
    machine = serde_json::from_value(object).unwrap_or(machine);
    machine
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                merge(into.entry(key).or_insert(Value::Null), value);
            }
        }
        (into, from) => *into = from,
    }
}

/// The stored form of a Machine: what the server would have written (uid, creation time, kind).
fn stored_machine(name: &str) -> Value {
    let mut object = serde_json::to_value(machine(name)).unwrap_or_default();
    object["apiVersion"] = json!("machine.sapcloud.io/v1alpha1");
    object["kind"] = json!("Machine");
    object["metadata"]["namespace"] = json!(NAMESPACE);
    object["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{name:0>12}"));
    object["metadata"]["creationTimestamp"] = json!("2026-11-26T19:00:00Z");
    object
}

/// Fills the store at `path` with `count` Machines, 1,000 per transaction.
fn fill(path: &std::path::Path, count: usize, window: usize) -> Result<Duration, Box<dyn std::error::Error>> {
    let start = Instant::now();
    let store = Store::open(Some(path), window)?;
    let names: Vec<String> = (0..count).map(|i| format!("stored-{i:07}")).collect();
    for chunk in names.chunks(1000) {
        let keys: Vec<(String, String)> = chunk.iter().map(|n| (NAMESPACE.to_owned(), n.clone())).collect();
        let mut next = chunk.iter();
        store.mutate_many(RESOURCE, &keys, |_| {
            Ok(Mutation::Put(stored_machine(
                next.next().map_or("", String::as_str),
            )))
        })?;
    }
    Ok(start.elapsed())
}

#[allow(clippy::cast_precision_loss)] // counts far below 2^52
fn rate(count: usize, elapsed: Duration) -> f64 {
    (count as f64 / elapsed.as_secs_f64() * 10.0).round() / 10.0
}

/// Runs `total` operations with `writers` concurrent tasks; operations per second.
async fn throughput<F, Fut>(total: usize, writers: usize, op: F) -> Result<f64, kube::Error>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    let start = Instant::now();
    futures::stream::iter(0..total)
        .map(&op)
        .buffer_unordered(writers)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(rate(total, start.elapsed()))
}

/// Creates and patches through the API server; (creates/s, patches/s).
async fn over_http(
    api: &Api<Machine>,
    round: usize,
    options: &Options,
    writers: usize,
) -> Result<(f64, f64), kube::Error> {
    let names: Vec<String> = (0..options.ops).map(|i| format!("new-{round}-{i:06}")).collect();
    let creates = throughput(options.ops, writers, |i| {
        let (api, object) = (api.clone(), machine(&names[i]));
        async move { api.create(&PostParams::default(), &object).await.map(|_| ()) }
    })
    .await?;
    let patches = throughput(options.ops, writers, |i| {
        let (api, name) = (api.clone(), names[i].clone());
        async move {
            let patch = json!({ "metadata": { "labels": { "round": "1" } } });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
    })
    .await?;
    Ok((creates, patches))
}

/// Creates and patches straight into the store from `writers` threads; (creates/s, patches/s).
fn direct(store: &Arc<Store>, round: usize, options: &Options, writers: usize) -> (f64, f64) {
    let run = |patch: bool| {
        let start = Instant::now();
        std::thread::scope(|scope| {
            for w in 0..writers {
                scope.spawn(move || {
                    for i in (w..options.ops).step_by(writers) {
                        let name = format!("new-{round}-{i:06}");
                        let result = store.mutate(RESOURCE, NAMESPACE, &name, |current| {
                            Ok(Mutation::Put(match current {
                                Some(current) if patch => {
                                    let mut object = (**current).clone();
                                    object["metadata"]["labels"]["round"] = json!("1");
                                    object
                                }
                                _ => stored_machine(&name),
                            }))
                        });
                        if let Err(err) = result {
                            eprintln!("write of {name} failed: {err}");
                        }
                    }
                });
            }
        });
        rate(options.ops, start.elapsed())
    };
    (run(false), run(true))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = options()?;
    let temp = tempfile::tempdir()?;
    let dir = options.dir.clone().unwrap_or_else(|| temp.path().to_owned());
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(mcm_apiserver::server::STORE_FILE);
    let window = mcm_apiserver::Config::new(&dir).watch_window;
    let filled = fill(&path, options.stored, window)?;
    let file_bytes = std::fs::metadata(&path)?.len();
    eprintln!(
        "filled {} objects in {:.1} s ({} MB on disk)",
        options.stored,
        filled.as_secs_f64(),
        file_bytes / 1_000_000
    );
    let object_bytes = serde_json::to_vec(&stored_machine("stored-0000000"))?.len();
    let mut results = Vec::new();
    if options.direct {
        let store = Arc::new(Store::open(Some(&path), window)?);
        for (round, &writers) in options.writers.iter().enumerate() {
            let commits = store.commits();
            let (creates, patches) = direct(&store, round, &options, writers);
            let commits = store.commits() - commits;
            eprintln!("{writers} writers: {creates} creates/s, {patches} patches/s, {commits} transactions");
            results.push(json!({
                "writers": writers, "creates_per_second": creates, "patches_per_second": patches,
                // Both phases: 2 x --ops writes. Fewer transactions than writes is the group commit at work.
                "transactions": commits,
            }));
        }
    } else {
        let server = mcm_apiserver::ApiServer::start(mcm_apiserver::Config::new(&dir)).await?;
        let kubeconfig = kube::config::Kubeconfig::read_from(server.kubeconfig())?;
        let client_config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await?;
        let api: Api<Machine> = Api::namespaced(Client::try_from(client_config)?, NAMESPACE);
        for (round, &writers) in options.writers.iter().enumerate() {
            let (creates, patches) = over_http(&api, round, &options, writers).await?;
            eprintln!("{writers} writers: {creates} creates/s, {patches} patches/s");
            results.push(
                json!({ "writers": writers, "creates_per_second": creates, "patches_per_second": patches }),
            );
        }
        server.shutdown().await;
    }
    let report = json!({
        "stored_objects": options.stored,
        "object_bytes": object_bytes,
        "fill_seconds": (filled.as_secs_f64() * 10.0).round() / 10.0,
        "file_megabytes": file_bytes / 1_000_000,
        "ops_per_writer_count": options.ops,
        "path": if options.direct { "store (direct)" } else { "HTTPS via kube" },
        "results": results,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
