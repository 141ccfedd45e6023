//! The simulated kubelet against the embedded API server: registration, Lease heartbeats that cost one Lease
//! write each, node status written only on change, and kubelet faults seen through the server's node lifecycle.

mod support;

use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Node},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    Api, ResourceExt as _,
    api::{Patch, PatchParams, WatchEvent, WatchParams},
};
use mcm_api::ConditionStatus;
use mcm_driver::Driver as _;
use mcm_provider_sim::{Kubelet, KubeletConfig, KubeletHandle, SimDriver};
use pretty_assertions::assert_eq;
use support::{TestServer, condition, condition_status, create, delete, eventually, has_taint, within};

const UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// A server, a driver and its kubelet heartbeating every `heartbeat`.
async fn start(heartbeat: Duration, boot_delay: Duration) -> (TestServer, SimDriver, KubeletHandle) {
    let server = TestServer::start().await;
    let driver = SimDriver::default();
    let kubelet = Kubelet::start(
        &driver,
        server.client.clone(),
        KubeletConfig {
            heartbeat_interval: heartbeat,
            boot_delay,
            ..KubeletConfig::default()
        },
    );
    (server, driver, kubelet)
}

fn nodes(server: &TestServer) -> Api<Node> {
    Api::all(server.client.clone())
}

fn leases(server: &TestServer) -> Api<Lease> {
    Api::namespaced(server.client.clone(), "kube-node-lease")
}

/// Waits until the node's condition has this status, returning the node.
async fn wait_condition(server: &TestServer, node: &str, type_: &str, status: &str) -> Node {
    let api = nodes(server);
    eventually(&format!("node {node} {type_}={status}"), || {
        let api = api.clone();
        async move {
            let found = api.get_opt(node).await.expect("get node")?;
            (condition_status(&found, type_).as_deref() == Some(status)).then_some(found)
        }
    })
    .await
}

async fn renew_time(server: &TestServer, node: &str) -> Option<jiff::Timestamp> {
    leases(server)
        .get_opt(node)
        .await
        .expect("get lease")?
        .spec?
        .renew_time
        .map(|t| t.0)
}

fn quantity(value: &str) -> Quantity {
    Quantity(value.into())
}

#[tokio::test]
async fn a_created_vm_gets_a_ready_node_with_its_provider_id_capacity_and_labels_and_a_renewed_lease() {
    let (server, driver, kubelet) = start(Duration::from_millis(200), Duration::ZERO).await;
    driver.create_machine(&create("m1", "medium")).await.unwrap();
    let node = wait_condition(&server, "m1", "Ready", "True").await;

    assert_eq!(
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some("sim:///default/m1")
    );
    let labels = node.labels();
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some("m1")
    );
    assert_eq!(
        labels.get("node.kubernetes.io/instance-type").map(String::as_str),
        Some("medium")
    );
    let status = node.status.clone().unwrap();
    let expected = std::collections::BTreeMap::from([
        ("cpu".to_owned(), quantity("4")),
        ("ephemeral-storage".to_owned(), quantity("20G")),
        ("memory".to_owned(), quantity("8Gi")),
        ("pods".to_owned(), quantity("110")),
    ]);
    assert_eq!(status.capacity.as_ref(), Some(&expected));
    assert_eq!(status.allocatable.as_ref(), Some(&expected));
    let addresses: Vec<(String, String)> = status
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(
        addresses,
        [
            ("InternalIP".to_owned(), "10.0.0.1".to_owned()),
            ("Hostname".to_owned(), "m1".to_owned())
        ]
    );
    assert_eq!(status.node_info.unwrap().kubelet_version, "v1.32.0-sim");
    let ready = condition(&node, "Ready").unwrap();
    assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
    for pressure in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert_eq!(
            condition_status(&node, pressure).as_deref(),
            Some("False"),
            "{pressure}"
        );
    }

    let lease = eventually("the lease", || async {
        leases(&server).get_opt("m1").await.expect("get lease")
    })
    .await;
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("m1"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let owner = &lease.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", "m1"));
    assert_eq!(Some(&owner.uid), node.metadata.uid.as_ref());
    let first = spec.renew_time.unwrap().0;
    eventually("the lease to be renewed", || async {
        renew_time(&server, "m1").await.filter(|t| *t > first)
    })
    .await;

    kubelet.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn heartbeats_cost_one_lease_write_each_and_no_node_write_when_nothing_changes() {
    let (server, driver, kubelet) = start(Duration::from_millis(200), Duration::ZERO).await;
    driver.create_machine(&create("m1", "small")).await.unwrap();
    let node = wait_condition(&server, "m1", "Ready", "True").await;
    eventually("the lease", || async {
        (kubelet.stats().lease_creates == 1).then_some(())
    })
    .await;

    let api = nodes(&server);
    let events = api
        .watch(
            &WatchParams::default().fields("metadata.name=m1"),
            &node.resource_version().unwrap(),
        )
        .await
        .expect("watch the node");
    let before = kubelet.stats();
    let renewed_before = renew_time(&server, "m1").await.unwrap();
    eventually("five heartbeats", || async {
        (kubelet.stats().lease_renewals >= before.lease_renewals + 5).then_some(())
    })
    .await;
    let renewed_after = renew_time(&server, "m1").await.unwrap();
    assert!(renewed_after > renewed_before, "the lease was renewed");

    // A change of our own marks the end of the window: every node event before it came from someone else.
    api.patch(
        "m1",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "metadata": { "labels": { "sentinel": "1" } } })),
    )
    .await
    .unwrap();
    let mut events = std::pin::pin!(events);
    let mut modified_before_sentinel = 0;
    within("the sentinel event", async {
        while let Some(event) = events.next().await {
            if let WatchEvent::Modified(node) = event.expect("a watch event") {
                if node.labels().contains_key("sentinel") {
                    return;
                }
                modified_before_sentinel += 1;
            }
        }
        panic!("the watch ended before the sentinel");
    })
    .await;
    assert_eq!(modified_before_sentinel, 0, "heartbeats wrote the node");

    let after = kubelet.stats();
    assert_eq!(after.node_creates, 1);
    assert_eq!(
        after.node_status_writes, before.node_status_writes,
        "no status write"
    );
    assert_eq!(after.lease_creates, 1);
    assert_eq!(after.failed_requests, 0);
    kubelet.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn stop_heartbeats_turns_the_node_unknown_and_resume_heartbeats_makes_it_ready_again() {
    let (server, driver, kubelet) = start(Duration::from_millis(200), Duration::ZERO).await;
    let faults = driver.faults();
    driver.create_machine(&create("m1", "small")).await.unwrap();
    wait_condition(&server, "m1", "Ready", "True").await;

    faults.stop_heartbeats("m1");
    assert!(faults.heartbeats_stopped("m1"));
    let node = wait_condition(&server, "m1", "Ready", "Unknown").await;
    assert_eq!(
        condition(&node, "Ready").unwrap().reason.as_deref(),
        Some("NodeStatusUnknown")
    );
    let api = nodes(&server);
    eventually("the unreachable taint", || {
        let api = api.clone();
        async move { has_taint(&api.get("m1").await.unwrap(), UNREACHABLE).then_some(()) }
    })
    .await;
    let silent = renew_time(&server, "m1").await.unwrap();

    faults.resume_heartbeats("m1");
    let node = wait_condition(&server, "m1", "Ready", "True").await;
    assert_eq!(
        condition(&node, "Ready").unwrap().reason.as_deref(),
        Some("KubeletReady")
    );
    assert!(
        renew_time(&server, "m1").await.unwrap() > silent,
        "the lease is renewed again"
    );
    eventually("the unreachable taint to go", || {
        let api = api.clone();
        async move { (!has_taint(&api.get("m1").await.unwrap(), UNREACHABLE)).then_some(()) }
    })
    .await;
    kubelet.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn set_node_not_ready_writes_ready_false_and_conditions_are_written_on_change_only() {
    let (server, driver, kubelet) = start(Duration::from_millis(200), Duration::ZERO).await;
    let faults = driver.faults();
    driver.create_machine(&create("m1", "small")).await.unwrap();
    wait_condition(&server, "m1", "Ready", "True").await;
    assert_eq!(
        kubelet.stats().node_status_writes,
        0,
        "registration carries the status"
    );

    faults.set_node_not_ready("m1");
    let node = wait_condition(&server, "m1", "Ready", "False").await;
    let ready = condition(&node, "Ready").unwrap();
    assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
    // The kubelet counts the write when the response arrives, which may be after the test saw its effect.
    eventually("the status write to be counted", || async {
        (kubelet.stats().node_status_writes >= 1).then_some(())
    })
    .await;
    assert_eq!(kubelet.stats().node_status_writes, 1, "one write for one change");

    faults.set_condition("m1", "KernelDeadlock", ConditionStatus::True);
    faults.set_condition("m1", "DiskPressure", ConditionStatus::True);
    eventually("KernelDeadlock and DiskPressure True", || async {
        let node = nodes(&server).get("m1").await.unwrap();
        (condition_status(&node, "KernelDeadlock").as_deref() == Some("True")
            && condition_status(&node, "DiskPressure").as_deref() == Some("True"))
        .then_some(())
    })
    .await;

    faults.clear_condition("m1", "KernelDeadlock");
    faults.set_node_ready("m1");
    faults.clear_condition("m1", "DiskPressure");
    let node = wait_condition(&server, "m1", "Ready", "True").await;
    eventually("the fault conditions to go", || async {
        let node = nodes(&server).get("m1").await.unwrap();
        (condition(&node, "KernelDeadlock").is_none()
            && condition_status(&node, "DiskPressure").as_deref() == Some("False"))
        .then_some(())
    })
    .await;
    assert!(condition(&node, "Ready").unwrap().last_transition_time.is_some());
    let writes = eventually("three status writes counted", || async {
        let writes = kubelet.stats().node_status_writes;
        (writes >= 3).then_some(writes)
    })
    .await;
    assert!(
        writes <= 6,
        "{writes} status writes for 6 fault changes: at most one per change"
    );
    kubelet.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_vanished_vms_node_stops_heartbeating_and_is_not_deleted() {
    let (server, driver, kubelet) = start(Duration::from_millis(200), Duration::ZERO).await;
    driver.create_machine(&create("m1", "small")).await.unwrap();
    wait_condition(&server, "m1", "Ready", "True").await;

    assert_eq!(driver.faults().vanish("m1"), 1);
    // Unknown means no heartbeat for the grace period: the lease is no longer renewed.
    let node = wait_condition(&server, "m1", "Ready", "Unknown").await;
    assert_eq!(
        node.name_any(),
        "m1",
        "the node stays for the machine controller to delete"
    );
    let last = renew_time(&server, "m1")
        .await
        .expect("the lease stays with its node");
    assert!(
        jiff::Timestamp::now().duration_since(last)
            >= jiff::SignedDuration::try_from(support::GRACE).unwrap(),
        "the lease was renewed after the VM vanished"
    );
    kubelet.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_deleted_vms_node_stops_heartbeating_and_is_left_to_the_machine_controller() {
    let (server, driver, kubelet) = start(Duration::from_millis(200), Duration::ZERO).await;
    driver.create_machine(&create("m1", "small")).await.unwrap();
    wait_condition(&server, "m1", "Ready", "True").await;

    driver.delete_machine(&delete("m1", "small")).await.unwrap();
    assert!(driver.vms().is_empty());
    let node = wait_condition(&server, "m1", "Ready", "Unknown").await;
    assert_eq!(node.name_any(), "m1");
    assert_eq!(kubelet.stats().node_status_writes, 0);
    kubelet.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_node_registers_after_the_boot_delay() {
    let boot = Duration::from_millis(600);
    let (server, driver, kubelet) = start(Duration::from_millis(200), boot).await;
    let created = tokio::time::Instant::now();
    driver.create_machine(&create("m1", "small")).await.unwrap();
    wait_condition(&server, "m1", "Ready", "True").await;
    assert!(
        created.elapsed() >= boot,
        "registered after {:?}",
        created.elapsed()
    );
    kubelet.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_node_deleted_by_someone_else_is_not_registered_again_while_other_nodes_heartbeat() {
    let (server, driver, kubelet) = start(Duration::from_millis(200), Duration::ZERO).await;
    driver.create_machine(&create("m1", "small")).await.unwrap();
    driver.create_machine(&create("m2", "small")).await.unwrap();
    wait_condition(&server, "m1", "Ready", "True").await;
    wait_condition(&server, "m2", "Ready", "True").await;

    nodes(&server)
        .delete("m1", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let before = renew_time(&server, "m2").await.unwrap();
    // m2's heartbeats are the clock: several of them pass without m1 coming back.
    let mut last = before;
    for _ in 0..3 {
        last = eventually("a heartbeat of m2", || async {
            renew_time(&server, "m2").await.filter(|t| *t > last)
        })
        .await;
    }
    assert!(nodes(&server).get_opt("m1").await.unwrap().is_none());
    assert_eq!(kubelet.stats().node_creates, 2);
    kubelet.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn dropping_the_handle_stops_the_kubelet() {
    let (server, driver, kubelet) = start(Duration::from_millis(100), Duration::ZERO).await;
    driver.create_machine(&create("m1", "small")).await.unwrap();
    wait_condition(&server, "m1", "Ready", "True").await;
    drop(kubelet);
    // Without heartbeats the node turns Unknown.
    wait_condition(&server, "m1", "Ready", "Unknown").await;
    server.stop().await;
}
