//! The ceiling: how fast the same API server accepts writes of objects like the controllers', from one client at
//! the controllers' concurrency. Machines with a body like a MachineSet's are created in a scratch namespace, then
//! each gets a status merge patch like the machine controller's; the namespace is deleted afterwards (and waited for,
//! so that its sweep does not run during the phases).

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use mcm_api::Machine;
use serde::Serialize;

/// The ceiling's figures.
#[derive(Clone, Copy, Debug, Serialize)]
pub(super) struct Ceiling {
    /// Writes made (creates plus status patches).
    pub(super) writes: u64,
    /// How long they took, in seconds.
    pub(super) seconds: f64,
    /// Writes per second.
    pub(super) writes_per_second: f64,
}

impl Ceiling {
    /// Seconds the ceiling needs for `writes` writes.
    pub(super) fn seconds_for(&self, writes: u64) -> f64 {
        #[allow(clippy::cast_precision_loss)] // write counts of a benchmark fit f64 exactly
        let writes = writes as f64;
        writes / self.writes_per_second
    }
}

/// A machine as a MachineSet creates it (labels, class, node template), without an owner: nothing reconciles it.
fn machine(name: &str, namespace: &str) -> anyhow::Result<Machine> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "Machine",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"name": "bench-ceiling", "machine-template-hash": "5984c7d9f"},
            "annotations": {"bench.mcm/purpose": "ceiling"},
        },
        "spec": {
            "class": {"kind": "MachineClass", "name": "bench-a"},
            "nodeTemplate": {"metadata": {"labels": {"worker.example.com/pool": "bench"}}},
        },
    }))
    .context("building a ceiling machine")
}

/// A status patch like the machine controller's after a create call.
fn status_patch(name: &str) -> serde_json::Value {
    serde_json::json!({
        "status": {
            "currentStatus": {"phase": "Pending", "lastUpdateTime": "2025-01-01T00:00:00Z"},
            "lastOperation": {
                "description": format!("Creating machine {name} on the provider"),
                "lastUpdateTime": "2025-01-01T00:00:00Z",
                "state": "Processing",
                "type": "Create",
            },
        },
    })
}

/// Runs `count` calls of `call(i)` on `concurrency` workers.
async fn run_concurrently<F, Fut>(count: usize, concurrency: usize, call: F) -> anyhow::Result<()>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let call = Arc::new(call);
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let next = Arc::clone(&next);
        let call = Arc::clone(&call);
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, anyhow::Error>(());
                }
                call(i).await?;
            }
        });
    }
    while let Some(result) = workers.join_next().await {
        result.context("a ceiling worker panicked")??;
    }
    Ok(())
}

/// Measures the ceiling with `objects` creates and as many patches at `concurrency` requests at once, in a scratch
/// namespace named after `round` (each measurement of a run has its own; `_` becomes `-`, as a namespace's name is
/// a DNS label).
pub(super) async fn measure(
    client: &kube::Client,
    objects: usize,
    concurrency: usize,
    round: &str,
) -> anyhow::Result<Ceiling> {
    let namespace = format!(
        "mcm-bench-ceiling-{}-{}",
        std::process::id(),
        round.replace('_', "-")
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    super::cluster::create_namespace(client, &namespace).await?;
    let machines: Api<Machine> = Api::namespaced(client.clone(), &namespace);

    let started = Instant::now();
    let api = machines.clone();
    let ns = namespace.clone();
    run_concurrently(objects, concurrency, move |i| {
        let api = api.clone();
        let ns = ns.clone();
        async move {
            let name = format!("ceiling-{i}");
            api.create(&PostParams::default(), &machine(&name, &ns)?)
                .await
                .with_context(|| format!("creating the ceiling machine {name}"))?;
            Ok(())
        }
    })
    .await?;
    let api = machines.clone();
    run_concurrently(objects, concurrency, move |i| {
        let api = api.clone();
        async move {
            let name = format!("ceiling-{i}");
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(status_patch(&name)))
                .await
                .with_context(|| format!("patching the ceiling machine {name}"))?;
            Ok(())
        }
    })
    .await?;
    let seconds = started.elapsed().as_secs_f64();

    namespaces
        .delete(&namespace, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting the namespace {namespace}"))?;
    let end = Instant::now() + Duration::from_mins(3);
    while Instant::now() < end {
        if namespaces.get_opt(&namespace).await?.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let writes = 2 * objects as u64;
    #[allow(clippy::cast_precision_loss)] // write counts of a benchmark fit f64 exactly
    let writes_per_second = writes as f64 / seconds.max(f64::EPSILON);
    Ok(Ceiling {
        writes,
        seconds: (seconds * 1000.0).round() / 1000.0,
        writes_per_second: writes_per_second.round(),
    })
}
