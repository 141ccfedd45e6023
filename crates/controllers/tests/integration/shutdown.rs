//! Every controller stops when asked, also before its cache has synced. kube-runtime holds reconciles until the
//! controller's store is ready and, on a graceful shutdown, stops the watch that would make it ready: without care
//! a process stopped (SIGTERM, a lost Lease) right after it started waited for ever and never released its Lease.

use crate::support;

use std::{sync::Arc, time::Duration};

use mcm_controllers::{machine, machinedeployment, machineset, references};
use support::{Cluster, DEADLINE, NAMESPACE};

/// Each controller, asked to stop before it could list anything, returns within the deadline.
#[tokio::test]
async fn every_controller_stops_when_asked_before_its_cache_synced() {
    let cluster = Cluster::start_without_controller(support::settings()).await;
    let client = cluster.client.clone();
    let stopped = || std::future::ready(());
    // The shared caches stop with the controllers (already asked to).
    let caches = || support::caches_until(&client, std::future::ready(())).0;
    let runs: Vec<(&str, futures::future::BoxFuture<'static, ()>)> = vec![
        (
            "machine",
            Box::pin(machine::run(
                client.clone(),
                Some(client.clone()),
                Arc::new(cluster.driver.clone()),
                machine::Config {
                    namespace: NAMESPACE.into(),
                    settings: support::settings(),
                    concurrency: 4,
                },
                caches(),
                machine::Extras::default(),
                stopped(),
            )),
        ),
        (
            "machineset",
            Box::pin(machineset::run(
                client.clone(),
                machineset::Config {
                    namespace: NAMESPACE.into(),
                    concurrency: 4,
                    resync: Duration::from_mins(10),
                    min_ready_seconds: mcm_core::machineset::MinReadySeconds::Ignore,
                },
                caches(),
                None,
                stopped(),
            )),
        ),
        (
            "machinedeployment",
            Box::pin(machinedeployment::run(
                client.clone(),
                Some(client.clone()),
                machinedeployment::Config::new(NAMESPACE),
                caches(),
                None,
                stopped(),
            )),
        ),
        (
            "machineclass and secret finalizers",
            Box::pin(references::run(
                client.clone(),
                NAMESPACE.into(),
                caches(),
                Duration::from_mins(10),
                None,
                stopped(),
            )),
        ),
    ];
    for (name, run) in runs {
        tokio::time::timeout(DEADLINE, run)
            .await
            .unwrap_or_else(|_| panic!("the {name} controller did not stop within {DEADLINE:?}"));
    }
}
