//! End to end: the on-disk store's group commit (issue 26) under kill -9. Many clients write at once, so that
//! their writes share transactions; every write the server acknowledged must be there after the restart, with the
//! resourceVersion it was answered with, and resourceVersions must continue above all of them.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use serde_json::Value;

use crate::apiserver_kubectl::{StopOnDrop, machine_yaml};
use crate::support::{COMMAND_DEADLINE, Server, arg, kubectl_at, poll};

/// How many clients write at once.
const WRITERS: usize = 8;

#[test]
fn every_write_acknowledged_by_concurrent_clients_survives_kill_9_with_its_resource_version() {
    let mut server = Server::start("group-commit-kill9");
    // name -> the resourceVersion the server answered the create with.
    let acknowledged = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let stop_writers = StopOnDrop(Arc::clone(&stop));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (acknowledged, stop) = (Arc::clone(&acknowledged), Arc::clone(&stop));
            let (kubeconfig, cache, dir) = (server.kubeconfig(), server.cache_dir(), server.dir.clone());
            std::thread::spawn(move || {
                for i in 0.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let name = format!("w{w}-{i}");
                    let file = dir.join(format!("{name}.yaml"));
                    std::fs::write(&file, machine_yaml(&name, "")).unwrap();
                    let args = [
                        "create",
                        "-f",
                        arg(&file),
                        "-o",
                        "jsonpath={.metadata.resourceVersion}",
                    ];
                    let out = kubectl_at(&kubeconfig, &cache, &args);
                    if out.status.success() {
                        let rv = String::from_utf8_lossy(&out.stdout)
                            .trim()
                            .parse()
                            .unwrap_or_else(|e| {
                                panic!("{name}: the answer's resourceVersion is a number ({e})")
                            });
                        acknowledged.lock().unwrap().insert(name, rv);
                    }
                }
            })
        })
        .collect();
    poll("40 acknowledged creates", COMMAND_DEADLINE, || {
        (acknowledged.lock().unwrap().len() >= 40).then_some(())
    });
    server.kill9();
    drop(stop_writers);
    for writer in writers {
        writer.join().expect("a writer thread");
    }

    server.restart();
    let listed: Value = serde_json::from_str(&server.kubectl_ok(&["get", "mc", "-o", "json"])).expect("JSON");
    let stored: BTreeMap<String, u64> = listed["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| {
            let rv = item["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|rv| rv.parse().ok());
            (
                item["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
                rv.unwrap_or(0),
            )
        })
        .collect();
    let acknowledged = acknowledged.lock().unwrap();
    let lost: Vec<(&String, &u64, Option<&u64>)> = acknowledged
        .iter()
        .filter(|(name, rv)| stored.get(*name) != Some(rv))
        .map(|(name, rv)| (name, rv, stored.get(name)))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged (name, rv) missing or changed after kill -9 (name, rv, stored): {lost:?}"
    );
    let mut versions: Vec<u64> = acknowledged.values().copied().collect();
    versions.sort_unstable();
    versions.dedup();
    assert_eq!(
        versions.len(),
        acknowledged.len(),
        "each write had its own resourceVersion"
    );

    let file = server.write("after.yaml", &machine_yaml("after-crash", ""));
    let after: u64 = server
        .kubectl_ok(&[
            "create",
            "-f",
            arg(&file),
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
        .trim()
        .parse()
        .expect("a resourceVersion");
    let highest = versions.last().copied().unwrap_or_default();
    assert!(
        after > highest,
        "resourceVersions continue after the restart: {after} after {highest}"
    );
}
