//! The control-plane duties a cluster's kube-apiserver and kube-controller-manager carry: evictions honouring
//! PodDisruptionBudgets, graceful pod deletion with no kubelet, the node lifecycle (silent nodes turn Unknown),
//! and the test hooks (watch delay, injected failures).

use crate::support;

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api,
    api::{DeleteParams, EvictParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
};
use mcm_api::{
    Machine,
    builders::{NodeBuilder, PodBuilder},
};
use mcm_apiserver::hooks::Failure;
use serde_json::json;
use support::{TestServer, eventually, expect_status, machine, within};

fn timestamp(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// Creates a pod bound to `node`, labelled app=web, with a grace period of `grace` seconds, and makes it Ready
/// (pods start Pending: the status is written through the status subresource, as a kubelet would).
async fn ready_pod(pods: &Api<Pod>, name: &str, node: &str, grace: i64) -> Pod {
    let pod = PodBuilder::new(name)
        .label("app", "web")
        .node(node)
        .grace_period(grace)
        .container("c", "busybox")
        .build();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let status =
        json!({ "status": { "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap()
}

async fn pdb(pdbs: &Api<PodDisruptionBudget>, spec: serde_json::Value) -> PodDisruptionBudget {
    let pdb = serde_json::from_value(json!({ "metadata": { "name": "web" }, "spec": spec })).unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap()
}

fn fast_control_loops(config: &mut mcm_apiserver::Config) {
    config.node_monitor_period = Duration::from_millis(100);
}

// Eviction API: "the API server checks the PodDisruptionBudget; if the eviction would violate it, the request is
// answered 429 Too Many Requests", and the PDB's status is computed from the pods it selects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdb_blocks_an_eviction_with_429_and_then_allows_it() {
    let t = TestServer::start_with(fast_control_loops).await;
    let pods: Api<Pod> = t.api();
    let pdbs: Api<PodDisruptionBudget> = t.api();
    ready_pod(&pods, "web-1", "n1", 1).await;
    pdb(
        &pdbs,
        json!({ "selector": { "matchLabels": { "app": "web" } }, "minAvailable": 1 }),
    )
    .await;

    let status = eventually("the PDB status counts the healthy pod", || async {
        pdbs.get("web")
            .await
            .unwrap()
            .status
            .filter(|s| s.current_healthy == 1 && s.expected_pods == 1)
    })
    .await;
    assert_eq!((status.desired_healthy, status.disruptions_allowed), (1, 0));

    let blocked = expect_status(
        pods.evict("web-1", &EvictParams::default()).await,
        429,
        "TooManyRequests",
    );
    assert_eq!(
        blocked.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    let cause = &blocked.details.as_ref().unwrap().causes[0];
    assert_eq!(cause.reason, "DisruptionBudget");
    assert_eq!(
        cause.message,
        "The disruption budget web needs 1 healthy pods and has 1 currently"
    );
    assert!(
        pods.get("web-1")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none(),
        "the pod stays"
    );

    // A second healthy pod lets one disruption through; the next eviction is blocked again (no overshoot).
    ready_pod(&pods, "web-2", "n1", 1).await;
    eventually("one disruption allowed", || async {
        pdbs.get("web")
            .await
            .unwrap()
            .status
            .filter(|s| s.disruptions_allowed == 1)
            .map(|_| ())
    })
    .await;
    pods.evict("web-1", &EvictParams::default())
        .await
        .expect("the eviction is allowed");
    let evicted = pods.get("web-1").await.unwrap();
    assert!(
        evicted.metadata.deletion_timestamp.is_some(),
        "the pod is deleted with its grace period"
    );
    assert_eq!(evicted.metadata.deletion_grace_period_seconds, Some(1));
    expect_status(
        pods.evict("web-2", &EvictParams::default()).await,
        429,
        "TooManyRequests",
    );
    eventually("the evicted pod disappears after its grace period", || async {
        pods.get_opt("web-1").await.unwrap().is_none().then_some(())
    })
    .await;
}

// maxUnavailable 0 never allows a disruption; without a PDB an eviction deletes the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_unavailable_zero_never_allows_and_no_pdb_always_allows() {
    let t = TestServer::start_with(fast_control_loops).await;
    let pods: Api<Pod> = t.api();
    let pdbs: Api<PodDisruptionBudget> = t.api();
    ready_pod(&pods, "web-1", "n1", 0).await;
    ready_pod(&pods, "web-2", "n1", 0).await;
    pdb(
        &pdbs,
        json!({ "selector": { "matchLabels": { "app": "web" } }, "maxUnavailable": 0 }),
    )
    .await;
    expect_status(
        pods.evict("web-1", &EvictParams::default()).await,
        429,
        "TooManyRequests",
    );
    pdbs.delete("web", &DeleteParams::default()).await.unwrap();
    pods.evict("web-1", &EvictParams::default())
        .await
        .expect("no budget, no limit");
    assert!(
        pods.get_opt("web-1").await.unwrap().is_none(),
        "grace 0: gone at once"
    );
}

// Graceful deletion: a pod bound to a node gets deletionTimestamp = now + grace; there is no kubelet, so the server
// removes it when the grace period has passed. An unbound pod goes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_pod_is_removed_when_its_grace_period_expires() {
    let t = TestServer::start_with(fast_control_loops).await;
    let pods: Api<Pod> = t.api();
    ready_pod(&pods, "p1", "n1", 1).await;
    pods.delete("p1", &DeleteParams::default()).await.unwrap();
    let deleting = pods.get("p1").await.unwrap();
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(1));
    within("the pod to go after its grace period", async {
        while pods.get_opt("p1").await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;

    let unbound = PodBuilder::new("p2").container("c", "busybox").build();
    pods.create(&PostParams::default(), &unbound).await.unwrap();
    pods.delete("p2", &DeleteParams::default()).await.unwrap();
    assert!(pods.get_opt("p2").await.unwrap().is_none());
}

// "unless a node agent of that node reports otherwise": a live agent that terminates pods itself keeps an
// expired pod until it deletes it with grace 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_node_agent_that_terminates_pods_keeps_them_until_it_deletes_them() {
    let t = TestServer::start_with(fast_control_loops).await;
    let nodes: Api<Node> = Api::all(t.client.clone());
    let leases: Api<Lease> = Api::namespaced(t.client.clone(), "kube-node-lease");
    let node = NodeBuilder::new("n1")
        .annotation("node.machine.sapcloud.io/agent-terminates-pods", "true")
        .build();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let lease = serde_json::from_value(json!({
        "metadata": { "name": "n1" }, "spec": { "holderIdentity": "n1", "renewTime": timestamp(jiff::Timestamp::now()) }
    }))
    .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let pods: Api<Pod> = t.api();
    ready_pod(&pods, "p1", "n1", 1).await;
    pods.delete("p1", &DeleteParams::default()).await.unwrap();
    let expired_at = Instant::now() + Duration::from_secs(1);
    // Past the grace period and a few control-loop passes later, the pod is still there.
    while Instant::now() < expired_at + Duration::from_millis(500) {
        assert!(
            pods.get_opt("p1").await.unwrap().is_some(),
            "the agent's pod is kept"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pods.delete(
        "p1",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    assert!(pods.get_opt("p1").await.unwrap().is_none());
}

// Node lifecycle controller: "a node whose heartbeat is older than --node-monitor-grace-period gets its conditions
// set to Unknown" (reason NodeStatusUnknown) and the unreachable taint; Ready again when heartbeats resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_turns_unknown_and_ready_again_when_heartbeats_resume() {
    let t = TestServer::start_with(|c| {
        c.node_monitor_grace_period = Duration::from_secs(2);
        c.node_monitor_period = Duration::from_millis(100);
    })
    .await;
    let nodes: Api<Node> = Api::all(t.client.clone());
    let leases: Api<Lease> = Api::namespaced(t.client.clone(), "kube-node-lease");
    let ready = |at: jiff::Timestamp| {
        json!({ "status": { "conditions": [
            { "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok",
              "lastHeartbeatTime": at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
              "lastTransitionTime": at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string() }
        ] } })
    };
    nodes
        .create(&PostParams::default(), &NodeBuilder::new("n1").build())
        .await
        .unwrap();
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(ready(jiff::Timestamp::now())),
        )
        .await
        .unwrap();
    let lease = serde_json::from_value(json!({
        "metadata": { "name": "n1" }, "spec": { "holderIdentity": "n1", "renewTime": timestamp(jiff::Timestamp::now()) }
    }))
    .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();

    let started = Instant::now();
    let unknown = eventually("the silent node turns Unknown", || async {
        let node = nodes.get("n1").await.unwrap();
        let conditions = node.status.clone()?.conditions?;
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "Unknown")
            .then_some(node)
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "not before the grace period"
    );
    let conditions = unknown.status.unwrap().conditions.unwrap();
    let ready_condition = conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready_condition.reason.as_deref(), Some("NodeStatusUnknown"));
    assert_eq!(
        ready_condition.message.as_deref(),
        Some("Kubelet stopped posting node status.")
    );
    let taints = unknown.spec.unwrap().taints.unwrap();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoSchedule")
    );

    // Heartbeats resume: the lease is renewed and the agent posts Ready; the node is Ready and untainted again.
    let now = jiff::Timestamp::now();
    leases
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "renewTime": timestamp(now) } })),
        )
        .await
        .unwrap();
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(ready(now)))
        .await
        .unwrap();
    eventually("the taint goes once the node is Ready", || async {
        let node = nodes.get("n1").await.unwrap();
        let ready = node
            .status
            .clone()?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let tainted = node
            .spec
            .clone()?
            .taints
            .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/unreachable"));
        (ready && !tainted).then_some(())
    })
    .await;
}

// Test hook: a watch sees events no earlier than the configured delay after their commit (a lagging cache).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_delay_hook_delays_event_delivery() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    let list = machines
        .list_metadata(&kube::api::ListParams::default())
        .await
        .unwrap();
    let mut stream = machines
        .watch(&WatchParams::default(), &list.metadata.resource_version.unwrap())
        .await
        .unwrap()
        .boxed();
    t.server().hooks().set_watch_delay(Duration::from_millis(400));
    let sent = Instant::now();
    machines
        .create(&PostParams::default(), &machine("m1", &[]))
        .await
        .unwrap();
    let event = within("the delayed event", stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(event, WatchEvent::Added(_)), "{event:?}");
    assert!(
        sent.elapsed() >= Duration::from_millis(400),
        "delivered after {:?}",
        sent.elapsed()
    );
}

// Test hook: a share of requests fails with the chosen status (here every write with 503), reads pass, and
// nothing is written by a failed request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failure_hook_fails_requests_with_the_chosen_status() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    t.server().hooks().set_failure(Some(Failure {
        share: 1.0,
        status: 503,
        writes_only: true,
    }));
    expect_status(
        machines.create(&PostParams::default(), &machine("m1", &[])).await,
        503,
        "ServiceUnavailable",
    );
    assert!(
        machines
            .list(&kube::api::ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "reads pass"
    );
    t.server().hooks().set_failure(None);
    machines
        .create(&PostParams::default(), &machine("m1", &[]))
        .await
        .unwrap();
}
