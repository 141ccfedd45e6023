//! Support of the local provider's tests: a driver on a temporary state directory (whose machines are killed when
//! the test ends, passed or not), requests, and polling with deadlines.

#![allow(dead_code)] // each test binary uses a part of it

use std::{
    collections::BTreeMap,
    future::Future,
    path::PathBuf,
    time::{Duration, Instant},
};

use k8s_openapi::{ByteString, api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use mcm_api::{
    Machine, MachineClass,
    builders::{MachineBuilder, MachineClassBuilder},
};
use mcm_driver::{CreateMachineRequest, DeleteMachineRequest, GetMachineStatusRequest, ListMachinesRequest};
use mcm_provider_local::{LocalConfig, LocalDriver};
use serde_json::{Value, json};
use tempfile::TempDir;

/// How long anything may take on a loaded 2-core machine.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A script that needs no `mcm`: says it booted, then sleeps.
pub const BOOT: &str = "#!/bin/sh\necho booted $MCM_LOCAL_NODE_NAME\nexec sleep 300\n";

/// The cluster tag of the test classes.
pub const CLUSTER_TAG: &str = "kubernetes.io/cluster/test";

/// A driver on a state directory of its own. Dropping it kills every machine process of the directory.
pub struct Env {
    pub driver: LocalDriver,
    pub dir: TempDir,
}

impl Env {
    /// A driver with a stop grace of 2 s.
    pub fn new() -> Self {
        Self::with_grace(Duration::from_secs(2))
    }

    pub fn with_grace(stop_grace: Duration) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let driver = LocalDriver::new(config(&dir, stop_grace)).expect("a driver");
        Self { driver, dir }
    }

    /// The state directory.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Another driver on the same state directory (as a restarted provider would be).
    pub fn restarted(&self) -> LocalDriver {
        LocalDriver::new(config(&self.dir, Duration::from_secs(2))).expect("a second driver")
    }

    /// The log of a machine of `default`.
    pub fn log(&self, name: &str) -> String {
        self.driver.log_tail("default", name, 1 << 20).expect("the log")
    }

    /// Waits until the log of a machine of `default` contains `text`, returning the log.
    pub async fn wait_log(&self, name: &str, text: &str) -> String {
        eventually(&format!("the log of {name} contains {text:?}"), || async {
            let log = self.log(name);
            log.contains(text).then_some(log)
        })
        .await
    }

    /// The process group of a machine of `default`.
    pub fn pgid(&self, name: &str) -> i32 {
        self.driver
            .machine("default", name)
            .expect("the record")
            .expect("the machine exists")
            .pgid
            .expect("a process group")
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for machine in self.driver.machines().unwrap_or_default() {
            if let Some(pgid) = machine.pgid.filter(|&pgid| pgid > 1)
                && let Some(group) = rustix::process::Pid::from_raw(pgid)
                && machine.is_running()
            {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            }
        }
    }
}

pub fn config(dir: &TempDir, stop_grace: Duration) -> LocalConfig {
    LocalConfig {
        stop_grace,
        ..LocalConfig::new(
            dir.path().join("state"),
            dir.path().join("bin"),
            "https://127.0.0.1:6443",
            dir.path().join("ca.crt"),
        )
    }
}

/// Polls `probe` every 20 ms until it answers, panicking after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a process runs (exists and is not a zombie), from `/proc`.
pub fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = &stat[stat.rfind(')')? + 1..];
            rest.split_whitespace()
                .next()
                .map(|state| state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

/// The process group of a process, from `/proc`.
pub fn pgrp(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(2)?.parse().ok()
}

pub fn provider_spec(size: &str, cluster: &str) -> Value {
    json!({
        "vmPool": "test-worker-pool",
        "size": size,
        "rootFsSize": 10,
        "tags": { CLUSTER_TAG: cluster, "kubernetes.io/role/node": "1" },
    })
}

/// A class of cluster `1` in `default`.
pub fn class() -> MachineClass {
    class_with(provider_spec("small", "1"))
}

pub fn class_with(provider_spec: Value) -> MachineClass {
    MachineClassBuilder::new("local-small")
        .namespace("default")
        .provider("local")
        .provider_spec(provider_spec)
        .build()
}

/// A machine in `default`.
pub fn machine(name: &str) -> Machine {
    MachineBuilder::new(name).namespace("default").build()
}

/// A secret whose userData is `script`.
pub fn secret(script: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("local-worker".into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "userData".to_owned(),
            ByteString(script.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    }
}

pub fn create(name: &str, script: &str) -> CreateMachineRequest {
    create_with(name, class(), script)
}

pub fn create_with(name: &str, class: MachineClass, script: &str) -> CreateMachineRequest {
    CreateMachineRequest {
        machine: machine(name),
        machine_class: class,
        secret: secret(script),
    }
}

pub fn delete(name: &str) -> DeleteMachineRequest {
    delete_with(name, class())
}

pub fn delete_with(name: &str, class: MachineClass) -> DeleteMachineRequest {
    DeleteMachineRequest {
        machine: machine(name),
        machine_class: class,
        secret: secret(BOOT),
    }
}

pub fn status(name: &str) -> GetMachineStatusRequest {
    status_with(name, class())
}

pub fn status_with(name: &str, class: MachineClass) -> GetMachineStatusRequest {
    GetMachineStatusRequest {
        machine: machine(name),
        machine_class: class,
        secret: secret(BOOT),
    }
}

pub fn list(class: MachineClass) -> ListMachinesRequest {
    ListMachinesRequest {
        machine_class: class,
        secret: secret(BOOT),
    }
}
