//! What a drain needs from the simulated kubelet, against the embedded API server: its nodes say that it ends
//! their pods, pending pods are started, deleting pods are ended once their grace period has passed, and the
//! volumes of the sim CSI driver are attached (VolumeAttachment, `node.status.volumesAttached`) while a pod on the
//! node uses them and detached when none does any more, with writes only on change.

mod support;

use std::time::Duration;

use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::VolumeAttachment,
};
use kube::{
    Api, ResourceExt as _,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::builders::PodBuilder;
use mcm_driver::{Driver as _, GetVolumeIdsRequest};
use mcm_provider_sim::{AGENT_TERMINATES_PODS, CSI_DRIVER, Kubelet, KubeletConfig, KubeletHandle, SimDriver};
use pretty_assertions::assert_eq;
use serde_json::json;
use support::{TestServer, condition_status, create, eventually};

/// A server, a driver with one VM (`m1`, its node Ready) and its kubelet heartbeating every 200 ms.
async fn start() -> (TestServer, SimDriver, KubeletHandle) {
    let server = TestServer::start().await;
    let driver = SimDriver::default();
    let kubelet = Kubelet::start(
        &driver,
        server.client.clone(),
        KubeletConfig {
            heartbeat_interval: Duration::from_millis(200),
            ..KubeletConfig::default()
        },
    );
    driver.create_machine(&create("m1", "small")).await.unwrap();
    let nodes: Api<Node> = Api::all(server.client.clone());
    eventually("node m1 Ready", || async {
        let node = nodes.get_opt("m1").await.unwrap()?;
        (condition_status(&node, "Ready").as_deref() == Some("True")).then_some(())
    })
    .await;
    (server, driver, kubelet)
}

fn pods(server: &TestServer) -> Api<Pod> {
    Api::namespaced(server.client.clone(), "default")
}

fn attachments(server: &TestServer) -> Api<VolumeAttachment> {
    Api::all(server.client.clone())
}

/// A pod bound to `node` with a grace period of `grace` seconds, using these claims.
async fn create_pod(server: &TestServer, name: &str, node: &str, grace: i64, claims: &[&str]) -> Pod {
    let pod = claims
        .iter()
        .fold(PodBuilder::new(name), |pod, claim| pod.claim(claim))
        .namespace("default")
        .node(node)
        .grace_period(grace)
        .container("c", "busybox")
        .build();
    pods(server).create(&PostParams::default(), &pod).await.unwrap()
}

/// A PersistentVolume with a CSI source of `driver` and `handle`, and a claim `name` bound to it.
async fn create_volume(server: &TestServer, name: &str, driver: &str, handle: &str) {
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": { "name": format!("pv-{name}") },
        "spec": {
            "capacity": { "storage": "1Gi" },
            "accessModes": ["ReadWriteOnce"],
            "csi": { "driver": driver, "volumeHandle": handle },
            "claimRef": { "namespace": "default", "name": name },
        }
    }))
    .unwrap();
    Api::<PersistentVolume>::all(server.client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": { "requests": { "storage": "1Gi" } },
            "volumeName": format!("pv-{name}"),
        }
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(server.client.clone(), "default")
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
}

/// The names in `node.status.volumesAttached` of `node`.
async fn volumes_attached(server: &TestServer, node: &str) -> Vec<String> {
    let node = Api::<Node>::all(server.client.clone()).get(node).await.unwrap();
    node.status
        .and_then(|s| s.volumes_attached)
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect()
}

/// The VolumeAttachments as (PersistentVolume, node, attached).
async fn attachment_list(server: &TestServer) -> Vec<(String, String, bool)> {
    let mut list: Vec<_> = attachments(server)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|va| {
            (
                va.spec.source.persistent_volume_name.clone().unwrap_or_default(),
                va.spec.node_name.clone(),
                va.status.as_ref().is_some_and(|s| s.attached),
            )
        })
        .collect();
    list.sort();
    list
}

fn csi_name(handle: &str) -> String {
    format!("kubernetes.io/csi/{CSI_DRIVER}^{handle}")
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The embedded API server leaves a deleting pod to the node's agent when the node says
/// `node.machine.sapcloud.io/agent-terminates-pods: "true"` and its Lease is fresh (docs/apiserver.md); a kubelet
/// starts the pods bound to its node.
#[tokio::test]
async fn its_nodes_say_it_ends_their_pods_and_a_pending_pod_bound_to_one_is_started_running_and_ready() {
    let (server, _driver, kubelet) = start().await;
    let node = Api::<Node>::all(server.client.clone()).get("m1").await.unwrap();
    assert_eq!(
        node.annotations().get(AGENT_TERMINATES_PODS).map(String::as_str),
        Some("true")
    );
    create_pod(&server, "web", "m1", 30, &[]).await;
    create_pod(&server, "elsewhere", "not-a-sim-node", 30, &[]).await;
    let started = eventually("web Running and Ready", || async {
        let pod = pods(&server).get("web").await.unwrap();
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        (running && is_ready(&pod)).then_some(pod)
    })
    .await;
    assert!(started.status.unwrap().start_time.is_some());
    let other = pods(&server).get("elsewhere").await.unwrap();
    assert_eq!(
        other.status.and_then(|s| s.phase),
        Some("Pending".to_owned()),
        "a pod of another node is not the kubelet's"
    );
    assert_eq!(kubelet.stats().pods_started, 1);
    kubelet.stop().await;
    server.stop().await;
}

/// A kubelet ends a deleting pod when its containers have stopped, at the latest when the grace period is over
/// (`deletionTimestamp`); the simulated kubelet does so at that instant, with a deletion of grace 0.
#[tokio::test]
async fn a_deleting_pod_is_ended_by_the_kubelet_once_its_grace_period_has_passed() {
    let (server, _driver, kubelet) = start().await;
    create_pod(&server, "web", "m1", 1, &[]).await;
    pods(&server)
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let deleting = pods(&server).get("web").await.unwrap();
    let deadline = deleting
        .metadata
        .deletion_timestamp
        .clone()
        .expect("a bound pod gets a grace period")
        .0;
    eventually("web gone", || async {
        pods(&server)
            .get_opt("web")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        jiff::Timestamp::now() >= deadline,
        "the pod went before its grace period was over"
    );
    eventually("the ending counted", || async {
        (kubelet.stats().pods_ended == 1).then_some(())
    })
    .await;
    kubelet.stop().await;
    server.stop().await;
}

/// The attach/detach controller and the CSI attacher: a volume used by a pod on the node is attached
/// (VolumeAttachment `status.attached`, `node.status.volumesAttached` entry `kubernetes.io/csi/<driver>^<handle>`,
/// the ID GetVolumeIDs gives) and stays attached while the pod terminates; it is detached when the pod is gone.
/// Volumes of other drivers are not the sim driver's to attach.
#[tokio::test]
async fn a_sim_csi_volume_is_attached_while_a_pod_uses_it_and_detached_when_the_pod_is_gone() {
    let (server, driver, kubelet) = start().await;
    create_volume(&server, "data", CSI_DRIVER, "vol-1").await;
    create_volume(&server, "foreign", "ebs.csi.aws.com", "vol-aws").await;
    create_pod(&server, "db", "m1", 1, &["data", "foreign"]).await;

    eventually("vol-1 attached to m1", || async {
        (attachment_list(&server).await == [("pv-data".to_owned(), "m1".to_owned(), true)]
            && volumes_attached(&server, "m1").await == [csi_name("vol-1")])
        .then_some(())
    })
    .await;
    let pv = Api::<PersistentVolume>::all(server.client.clone())
        .get("pv-data")
        .await
        .unwrap();
    let ids = driver
        .get_volume_ids(&GetVolumeIdsRequest {
            pv_specs: vec![pv.spec.unwrap()],
        })
        .await
        .unwrap()
        .volume_ids;
    assert_eq!(ids, ["vol-1"]);
    assert!(
        volumes_attached(&server, "m1").await[0].contains(&ids[0]),
        "the drain finds the provider's volume ID in volumesAttached"
    );

    pods(&server)
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    // Terminating, not gone: still attached.
    assert!(pods(&server).get_opt("db").await.unwrap().is_some());
    assert_eq!(volumes_attached(&server, "m1").await, [csi_name("vol-1")]);
    eventually("vol-1 detached from m1", || async {
        (attachment_list(&server).await.is_empty() && volumes_attached(&server, "m1").await.is_empty())
            .then_some(())
    })
    .await;
    assert!(pods(&server).get_opt("db").await.unwrap().is_none());
    kubelet.stop().await;
    server.stop().await;
}

/// A volume shared by two pods stays attached while either uses it; a pod that finished (Succeeded) no longer
/// does. A generic ephemeral volume's claim is `<pod>-<volume>`. Nothing is written while nothing changes.
#[tokio::test]
async fn a_volume_stays_attached_until_no_running_pod_uses_it_and_nothing_is_written_in_between() {
    let (server, _driver, kubelet) = start().await;
    create_volume(&server, "shared", CSI_DRIVER, "vol-s").await;
    create_volume(&server, "batch-scratch", CSI_DRIVER, "vol-e").await;
    create_pod(&server, "reader", "m1", 1, &["shared"]).await;
    create_pod(&server, "writer", "m1", 1, &["shared"]).await;
    let batch: Pod = serde_json::from_value(json!({
        "metadata": { "name": "batch", "namespace": "default" },
        "spec": {
            "nodeName": "m1",
            "containers": [{ "name": "c", "image": "busybox" }],
            "volumes": [{ "name": "scratch", "ephemeral": { "volumeClaimTemplate": { "spec": {
                "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "1Gi" } } } } } }],
        }
    }))
    .unwrap();
    pods(&server)
        .create(&PostParams::default(), &batch)
        .await
        .unwrap();
    eventually("both volumes attached", || async {
        let mut names = volumes_attached(&server, "m1").await;
        names.sort();
        (names == [csi_name("vol-e"), csi_name("vol-s")] && attachment_list(&server).await.len() == 2)
            .then_some(())
    })
    .await;

    // Heartbeats are the clock: with nothing changing, no volume write happens across several of them.
    let writes = kubelet.stats().volume_writes;
    let renewals = kubelet.stats().lease_renewals;
    eventually("three heartbeats", || async {
        (kubelet.stats().lease_renewals >= renewals + 3).then_some(())
    })
    .await;
    assert_eq!(kubelet.stats().volume_writes, writes, "no write without a change");

    // The batch pod finishes: its ephemeral volume is detached.
    pods(&server)
        .patch_status(
            "batch",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Succeeded" } })),
        )
        .await
        .unwrap();
    eventually("vol-e detached", || async {
        (volumes_attached(&server, "m1").await == [csi_name("vol-s")]
            && attachment_list(&server).await == [("pv-shared".to_owned(), "m1".to_owned(), true)])
        .then_some(())
    })
    .await;

    // One of two users goes: still attached; the other goes: detached.
    pods(&server)
        .delete("reader", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    pods(&server)
        .delete("writer", &DeleteParams::default())
        .await
        .unwrap();
    assert!(pods(&server).get_opt("writer").await.unwrap().is_some());
    assert_eq!(volumes_attached(&server, "m1").await, [csi_name("vol-s")]);
    eventually("vol-s detached", || async {
        (volumes_attached(&server, "m1").await.is_empty() && attachment_list(&server).await.is_empty())
            .then_some(())
    })
    .await;
    assert_eq!(kubelet.stats().failed_requests, 0);
    kubelet.stop().await;
    server.stop().await;
}

/// A kubelet whose heartbeats stopped is dead: it ends no pod and detaches nothing (the server's grace-period
/// expiry takes over once its Lease is stale; the machine controller's force drain deletes the
/// VolumeAttachments).
#[tokio::test]
async fn a_kubelet_with_stopped_heartbeats_ends_no_pod_and_detaches_nothing() {
    let (server, driver, kubelet) = start().await;
    create_volume(&server, "data", CSI_DRIVER, "vol-1").await;
    create_pod(&server, "db", "m1", 1, &["data"]).await;
    eventually("vol-1 attached", || async {
        (volumes_attached(&server, "m1").await == [csi_name("vol-1")]).then_some(())
    })
    .await;
    driver.faults().stop_heartbeats("m1");
    pods(&server)
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    // The server removes the pod once the grace period is over and the Lease is stale.
    eventually("db gone", || async {
        pods(&server).get_opt("db").await.unwrap().is_none().then_some(())
    })
    .await;
    assert_eq!(
        kubelet.stats().pods_ended,
        0,
        "the server ended it, not the dead kubelet"
    );
    assert_eq!(
        attachment_list(&server).await,
        [("pv-data".to_owned(), "m1".to_owned(), true)],
        "a dead kubelet detaches nothing"
    );
    assert_eq!(volumes_attached(&server, "m1").await, [csi_name("vol-1")]);

    // Back to life: the volume no pod uses is detached.
    driver.faults().resume_heartbeats("m1");
    eventually("vol-1 detached", || async {
        (volumes_attached(&server, "m1").await.is_empty() && attachment_list(&server).await.is_empty())
            .then_some(())
    })
    .await;
    kubelet.stop().await;
    server.stop().await;
}
