//! Garbage collection by ownerReferences through the real `kube` client over HTTPS: background cascades
//! (MachineDeployment → MachineSet → Machines, Node → Lease), dependents with finalizers and with several owners,
//! foreground deletion (`foregroundDeletion`, `blockOwnerDeletion`) and orphaning (`orphan`), and the DELETE body
//! kubectl sends. The servers collect every 100 ms; every wait has a deadline.

use crate::support;

use std::{collections::BTreeMap, time::Duration};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{Node, Secret},
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
};
use mcm_api::{
    Machine, MachineDeployment, MachineSet,
    builders::{MachineBuilder, MachineDeploymentBuilder, MachineSetBuilder, NodeBuilder},
};
use pretty_assertions::assert_eq;
use serde_json::json;
use support::{TestServer, eventually, machine, meta, send_raw, within};

async fn start() -> TestServer {
    TestServer::start_with(|c| c.gc_interval = Duration::from_millis(100)).await
}

/// The reference a controller puts on what it creates: `controller: true`, `blockOwnerDeletion: true`.
fn controlled_by<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        controller: Some(true),
        block_owner_deletion: Some(true),
        ..owner.owner_ref(&()).expect("a stored owner has a name and a uid")
    }
}

/// A reference without `controller` or `blockOwnerDeletion`.
fn owned_by<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    owner.owner_ref(&()).expect("a stored owner has a name and a uid")
}

fn with_owners(mut metadata: ObjectMeta, owners: Vec<OwnerReference>) -> ObjectMeta {
    metadata.owner_references = Some(owners);
    metadata
}

fn machine_deployment(name: &str) -> MachineDeployment {
    MachineDeploymentBuilder::new(name)
        .replicas(1)
        .matching([("deployment", name)])
        .class("small")
        .build()
}

/// A set of 2 machines labelled `set` = `name`, of class `small`.
fn set_of_two(name: &str) -> MachineSetBuilder {
    MachineSetBuilder::new(name)
        .replicas(2)
        .matching([("set", name)])
        .class("small")
}

/// A machine of class `small`.
fn small_machine(name: &str) -> MachineBuilder {
    MachineBuilder::new(name).class("small")
}

async fn create<K>(api: &Api<K>, object: &K) -> K
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), object).await.expect("create")
}

/// Waits until the object is gone (404).
async fn gone<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(&format!("{name} to be deleted"), || async {
        api.get_opt(name).await.expect("get").is_none().then_some(())
    })
    .await;
}

/// Waits until `check` holds for the object and returns it.
async fn until<K>(api: &Api<K>, name: &str, what: &str, check: impl Fn(&K) -> bool) -> K
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(&format!("{name}: {what}"), || async {
        api.get_opt(name).await.expect("get").filter(|o| check(o))
    })
    .await
}

/// Returns once the collector has run a whole pass after this call: a fresh owner is deleted and its dependent
/// is collected. What a pass would have done before that is then done (used to check that something stays).
async fn a_later_pass_has_run(t: &TestServer) {
    let secrets: Api<Secret> = t.api();
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let (owner_name, dependent_name) = (format!("marker-owner-{suffix}"), format!("marker-{suffix}"));
    let owner = create(
        &secrets,
        &Secret {
            metadata: meta(&owner_name, &[]),
            ..Secret::default()
        },
    )
    .await;
    let dependent = Secret {
        metadata: with_owners(meta(&dependent_name, &[]), vec![owned_by(&owner)]),
        ..Secret::default()
    };
    create(&secrets, &dependent).await;
    secrets
        .delete(&owner_name, &DeleteParams::default())
        .await
        .expect("delete the marker owner");
    gone(&secrets, &dependent_name).await;
}

/// The resourceVersions at which each named object was deleted, from a watch started before the deletions.
async fn deletion_versions<K>(api: &Api<K>, from: &str, names: &[&str]) -> BTreeMap<String, u64>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut stream = api
        .watch(&WatchParams::default(), from)
        .await
        .expect("watch")
        .boxed();
    let mut deleted = BTreeMap::new();
    within("the deletions", async {
        while deleted.len() < names.len() {
            let event = stream
                .try_next()
                .await
                .expect("a watch event")
                .expect("the watch stays open");
            if let WatchEvent::Deleted(object) = event
                && names.contains(&object.name_any().as_str())
            {
                deleted.insert(object.name_any(), support::rv(&object));
            }
        }
    })
    .await;
    deleted
}

// "In background cascading deletion, the Kubernetes API server deletes the owner object immediately and the
// garbage collector controller (custom or default) cleans up the dependent objects in the background." Cascading
// works through every level: the MachineSet is the deployment's dependent and the Machines' owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_machine_deployment_deletes_its_machine_sets_and_their_machines() {
    let t = start().await;
    let (deployments, sets, machines): (Api<MachineDeployment>, Api<MachineSet>, Api<Machine>) =
        (t.api(), t.api(), t.api());
    let deployment = create(&deployments, &machine_deployment("web")).await;
    let set = create(&sets, &set_of_two("web-1").owned_by(&deployment).build()).await;
    for name in ["web-1-a", "web-1-b"] {
        create(&machines, &small_machine(name).owned_by(&set).build()).await;
    }
    let unrelated = create(&machines, &machine("unrelated", &[])).await;

    deployments
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete")
        .right()
        .expect("without finalizers the deployment goes at once (a Status)");

    gone(&sets, "web-1").await;
    gone(&machines, "web-1-a").await;
    gone(&machines, "web-1-b").await;
    assert_eq!(
        machines.get("unrelated").await.unwrap(),
        unrelated,
        "objects without owners are untouched"
    );
}

// The garbage collector deletes a dependent as any client would: "When you tell Kubernetes to delete an object
// that has finalizers specified for it, the Kubernetes API marks the object for deletion by populating
// .metadata.deletionTimestamp", and it goes when its finalizers are removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependent_with_a_finalizer_is_marked_and_stays_until_the_finalizer_is_removed() {
    let t = start().await;
    let (sets, machines): (Api<MachineSet>, Api<Machine>) = (t.api(), t.api());
    let set = create(&sets, &set_of_two("s1").build()).await;
    let held = small_machine("held")
        .owned_by(&set)
        .finalizer("example.com/hold")
        .build();
    create(&machines, &held).await;

    sets.delete("s1", &DeleteParams::default()).await.unwrap();
    let marked = until(&machines, "held", "marked for deletion", |m| {
        m.metadata.deletion_timestamp.is_some()
    })
    .await;
    assert_eq!(marked.finalizers(), ["example.com/hold"]);
    a_later_pass_has_run(&t).await;
    assert!(
        machines.get_opt("held").await.unwrap().is_some(),
        "the finalizer holds it"
    );

    machines
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    gone(&machines, "held").await;
}

// Background deletion collects dependents once the owner is gone, not while it is being deleted: in
// kube-controller-manager's classifyReferences an owner that exists is "solid" unless it carries
// deletionTimestamp and the foregroundDeletion finalizer, so an owner held by its own finalizer keeps its
// dependents until it really goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_held_by_its_own_finalizer_keeps_its_dependents_until_it_is_gone() {
    let t = start().await;
    let (sets, machines): (Api<MachineSet>, Api<Machine>) = (t.api(), t.api());
    let set = create(&sets, &set_of_two("s1").finalizer("example.com/hold").build()).await;
    create(&machines, &small_machine("m1").owned_by(&set).build()).await;

    let marked = sets
        .delete("s1", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(
        marked.finalizers(),
        ["example.com/hold"],
        "no collector finalizer without a policy"
    );
    a_later_pass_has_run(&t).await;
    let kept = machines
        .get("m1")
        .await
        .expect("the dependent stays while its owner exists");
    assert!(kept.metadata.deletion_timestamp.is_none());
    assert_eq!(kept.owner_references(), [controlled_by(&set)]);

    sets.patch(
        "s1",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
    )
    .await
    .unwrap();
    gone(&sets, "s1").await;
    gone(&machines, "m1").await;
}

// "Kubernetes checks for and deletes objects that no longer have owner references" — a dependent is deleted only
// when none of its owners remains; while one remains, the references to owners that are gone are removed
// (kube-controller-manager's attemptToDeleteItem: "remove dangling references" when solid owners exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependent_with_two_owners_survives_the_deletion_of_one_and_loses_that_reference() {
    let t = start().await;
    let (sets, machines): (Api<MachineSet>, Api<Machine>) = (t.api(), t.api());
    let first = create(&sets, &set_of_two("first").build()).await;
    let second = create(&sets, &set_of_two("second").build()).await;
    let shared = small_machine("shared")
        .owned_by(&first)
        .owner(owned_by(&second))
        .build();
    create(&machines, &shared).await;

    sets.delete("first", &DeleteParams::default()).await.unwrap();
    let unlinked = until(&machines, "shared", "one reference left", |m| {
        m.owner_references().len() == 1
    })
    .await;
    assert_eq!(unlinked.owner_references(), [owned_by(&second)]);
    assert!(unlinked.metadata.deletion_timestamp.is_none());

    sets.delete("second", &DeleteParams::default()).await.unwrap();
    gone(&machines, "shared").await;
}

// Cascading deletion docs: "In foreground cascading deletion, the owner object you're deleting first enters a
// deletion in progress state": the API server sets its deletionTimestamp and adds the foregroundDeletion
// finalizer; "after the owner object enters the deletion in progress state, the controller deletes dependents it
// knows about. After deleting all the dependent objects it knows about, the controller deletes the owner object."
// Through several levels: the MachineSet, which has dependents, is deleted in the foreground too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_deletion_keeps_the_owner_until_its_dependents_are_gone_level_by_level() {
    let t = start().await;
    let (deployments, sets, machines): (Api<MachineDeployment>, Api<MachineSet>, Api<Machine>) =
        (t.api(), t.api(), t.api());
    let deployment = create(&deployments, &machine_deployment("web")).await;
    let set = create(&sets, &set_of_two("web-1").owned_by(&deployment).build()).await;
    for name in ["web-1-a", "web-1-b"] {
        create(&machines, &small_machine(name).owned_by(&set).build()).await;
    }
    let from = set.resource_version().unwrap();
    let (deployments_watch, sets_watch, machines_watch) = (
        deletion_versions(&deployments, &from, &["web"]),
        deletion_versions(&sets, &from, &["web-1"]),
        deletion_versions(&machines, &from, &["web-1-a", "web-1-b"]),
    );
    let deleting = tokio::spawn({
        let deployments = deployments.clone();
        async move { deployments.delete("web", &DeleteParams::foreground()).await }
    });
    let (deployment_deleted, set_deleted, machines_deleted) =
        tokio::join!(deployments_watch, sets_watch, machines_watch);

    let response = deleting
        .await
        .unwrap()
        .unwrap()
        .left()
        .expect("the DELETE answers the object (200)");
    assert!(response.metadata.deletion_timestamp.is_some());
    assert_eq!(response.finalizers(), ["foregroundDeletion"]);
    let last_machine = machines_deleted.values().max().copied().unwrap();
    assert!(
        last_machine < set_deleted["web-1"] && set_deleted["web-1"] < deployment_deleted["web"],
        "machines {machines_deleted:?}, then the set {set_deleted:?}, then the deployment {deployment_deleted:?}"
    );
}

// A dependent with blockOwnerDeletion: true that has a finalizer is marked for deletion and holds its owner:
// "the owner object remains in the deletion in progress state until the controller deletes the dependents".
// A dependent without blockOwnerDeletion is deleted too but does not hold the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_dependent_with_a_finalizer_holds_a_foreground_owner_until_the_finalizer_is_removed() {
    let t = start().await;
    let (sets, machines): (Api<MachineSet>, Api<Machine>) = (t.api(), t.api());
    let set = create(&sets, &set_of_two("s1").build()).await;
    let blocking = small_machine("blocking")
        .owned_by(&set)
        .finalizer("example.com/hold")
        .build();
    let loose = small_machine("loose")
        .owner(owned_by(&set))
        .finalizer("example.com/hold")
        .build();
    create(&machines, &blocking).await;
    create(&machines, &loose).await;

    let response = sets
        .delete("s1", &DeleteParams::foreground())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(response.finalizers(), ["foregroundDeletion"]);
    for name in ["blocking", "loose"] {
        until(&machines, name, "marked for deletion", |m| {
            m.metadata.deletion_timestamp.is_some()
        })
        .await;
    }
    a_later_pass_has_run(&t).await;
    let waiting = sets
        .get("s1")
        .await
        .expect("the owner waits for its blocking dependent");
    assert!(waiting.metadata.deletion_timestamp.is_some());
    assert_eq!(waiting.finalizers(), ["foregroundDeletion"]);

    machines
        .patch(
            "blocking",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .unwrap();
    gone(&machines, "blocking").await;
    gone(&sets, "s1").await;
    let loose = machines
        .get("loose")
        .await
        .expect("the non-blocking dependent did not hold the owner");
    assert!(loose.metadata.deletion_timestamp.is_some());
}

// "If you specify orphan, Kubernetes deletes the owner object and the dependents are left alone": the API server
// adds the orphan finalizer, and the garbage collector removes the ownerReferences to the owner from its
// dependents and then the finalizer. A dependent's other references stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_deletion_removes_the_owner_and_leaves_its_dependents_without_the_reference() {
    let t = start().await;
    let (sets, machines): (Api<MachineSet>, Api<Machine>) = (t.api(), t.api());
    let set = create(&sets, &set_of_two("s1").build()).await;
    let other = create(&sets, &set_of_two("other").build()).await;
    create(&machines, &small_machine("only").owned_by(&set).build()).await;
    let two = small_machine("two")
        .owned_by(&set)
        .owner(owned_by(&other))
        .build();
    create(&machines, &two).await;

    let response = sets
        .delete("s1", &DeleteParams::orphan())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(response.metadata.deletion_timestamp.is_some());
    assert_eq!(response.finalizers(), ["orphan"]);

    gone(&sets, "s1").await;
    let only = machines.get("only").await.expect("the dependent survives");
    assert_eq!(only.metadata.owner_references, None);
    assert!(only.metadata.deletion_timestamp.is_none());
    let two = machines.get("two").await.expect("the dependent survives");
    assert_eq!(two.owner_references(), [owned_by(&other)]);
    a_later_pass_has_run(&t).await;
    assert!(
        machines.get_opt("only").await.unwrap().is_some(),
        "an orphan is not garbage"
    );
}

// kubectl delete sends DeleteOptions `{"propagationPolicy":"Background"}` in the body (kubectl 1.32 trace) and
// gets the Success Status; the dependents are then collected in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_style_delete_with_a_background_body_collects_the_dependents() {
    let t = start().await;
    let (sets, machines): (Api<MachineSet>, Api<Machine>) = (t.api(), t.api());
    let set = create(&sets, &set_of_two("s1").build()).await;
    create(&machines, &small_machine("m1").owned_by(&set).build()).await;

    let request =
        http::Request::delete("/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machinesets/s1")
            .header("content-type", "application/json")
            .body(br#"{"propagationPolicy":"Background"}"#.to_vec())
            .unwrap();
    let (code, body) = send_raw(&t.client, request).await;
    assert_eq!(code, 200);
    assert_eq!(
        (body["kind"].as_str(), body["status"].as_str()),
        (Some("Status"), Some("Success"))
    );
    assert_eq!(body["details"]["uid"].as_str(), set.uid().as_deref());
    gone(&machines, "m1").await;
}

// "Cluster-scoped dependents can only specify cluster-scoped owners. In v1.20+, namespaced dependents can specify
// both cluster-scoped and namespaced owners": a node's Lease in kube-node-lease, owned by the Node, goes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_node_deletes_its_lease_in_kube_node_lease() {
    let t = start().await;
    let nodes: Api<Node> = t.api_all();
    let leases: Api<Lease> = Api::namespaced(t.client.clone(), "kube-node-lease");
    let node = create(&nodes, &NodeBuilder::new("n1").build()).await;
    let lease = Lease {
        metadata: with_owners(meta("n1", &[]), vec![owned_by(&node)]),
        spec: Some(LeaseSpec {
            holder_identity: Some("n1".into()),
            lease_duration_seconds: Some(40),
            ..LeaseSpec::default()
        }),
    };
    create(&leases, &lease).await;
    let other_node = create(&nodes, &NodeBuilder::new("n2").build()).await;
    let other = Lease {
        metadata: with_owners(meta("n2", &[]), vec![owned_by(&other_node)]),
        ..lease.clone()
    };
    create(&leases, &other).await;

    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    gone(&leases, "n1").await;
    assert!(
        leases.get_opt("n2").await.unwrap().is_some(),
        "another node's lease stays"
    );
}
