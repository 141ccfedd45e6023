//! Bad input can never destroy or create machines by accident (issue 19), over one corpus of bad objects
//! (`corpus/mod.rs`; the ValidatingAdmissionPolicy's rules are evaluated against the same corpus in
//! `admission_policy.rs`):
//! - the embedded API server refuses each bad object at the door, on create and on update, with 422 `Invalid` and a
//!   cause naming the field; it never blocks what must go through for an invalid object to be deleted;
//! - with that admission off (a cluster without the policy), each bad object is stored and reported on itself (a
//!   condition or `lastOperation`, and one Warning Event naming the field), while a watcher over every Machine and
//!   MachineSet version shows that nothing was created or deleted; fixed, the deployment converges.

use crate::corpus;
use crate::support;

use std::collections::{BTreeMap, BTreeSet};

use corpus::{Case, Kind};
use k8s_openapi::api::core::v1::Event;
use kube::{
    Api, Client, ResourceExt,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
        PostParams,
    },
    config::{KubeConfigOptions, Kubeconfig},
};
use mcm_api::{
    ConditionStatus, Machine, MachineDeployment, MachineDeploymentConditionType, MachinePhase, MachineSet,
    MachineSetConditionType, validation,
};
use mcm_apiserver::{ApiServer, Config as ServerConfig};
use mcm_controllers::machinedeployment;
use serde_json::{Value, json};
use support::{Cluster, History, NAMESPACE, wait_for};

/// Whether one field path names the other or a field above or below it.
fn related(a: &str, b: &str) -> bool {
    corpus::names(a, b) || corpus::names(b, a)
}

fn api_of(client: &Client, kind: Kind) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("machine.sapcloud.io", "v1alpha1", kind.name());
    let resource = ApiResource::from_gvk_with_plural(&gvk, kind.resource());
    Api::namespaced_with(client.clone(), NAMESPACE, &resource)
}

fn dynamic(value: &Value) -> DynamicObject {
    serde_json::from_value(value.clone()).expect("a dynamic object")
}

async fn server(dir: &std::path::Path, admission: bool) -> (ApiServer, Client) {
    let mut config = ServerConfig::new(dir);
    config.machine_admission = admission;
    let server = ApiServer::start(config).await.expect("the API server starts");
    let file = Kubeconfig::read_from(server.kubeconfig()).expect("its kubeconfig");
    let mut kube_config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .expect("a client configuration");
    kube_config.default_retry = false;
    (server, Client::try_from(kube_config).expect("a client"))
}

/// The 422 of a refused write: its message and the fields its causes name.
fn refusal(result: Result<DynamicObject, kube::Error>, case: &Case) -> (String, Vec<String>) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(
                (status.code, status.reason.as_str()),
                (422, "Invalid"),
                "{}: {status:?}",
                case.name
            );
            let causes = status
                .details
                .as_ref()
                .map(|d| d.causes.clone())
                .unwrap_or_default();
            let fields = causes.iter().map(|c| c.field.clone()).collect();
            (status.message.clone(), fields)
        }
        other => panic!("{}: the server accepted it: {other:?}", case.name),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_server_refuses_every_bad_object_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, client) = server(dir.path(), true).await;
    for (kind, object) in corpus::good() {
        api_of(&client, kind)
            .create(&PostParams::default(), &dynamic(&object))
            .await
            .unwrap_or_else(|err| panic!("a good {} is accepted: {err}", kind.name()));
    }
    for case in corpus::cases() {
        let api = api_of(&client, case.kind);
        // On create, under another name.
        let mut fresh = case.object.clone();
        fresh["metadata"]["name"] = json!("fresh");
        let (message, fields) = refusal(api.create(&PostParams::default(), &dynamic(&fresh)).await, &case);
        assert!(
            fields.iter().any(|f| related(f, case.field)),
            "{}: the causes name {fields:?}, not {}",
            case.name,
            case.field
        );
        let qualified = format!("{}.machine.sapcloud.io \"fresh\" is invalid: ", case.kind.name());
        assert!(message.starts_with(&qualified), "{}: {message}", case.name);
        // On update (replace) of the stored good object of that name, and on a merge patch making it the same.
        let name = case.object["metadata"]["name"].as_str().unwrap();
        let current = api.get(name).await.expect("the good object is stored");
        let mut replaced = case.object.clone();
        replaced["metadata"] = serde_json::to_value(&current.metadata).unwrap();
        let (_, fields) = refusal(
            api.replace(name, &PostParams::default(), &dynamic(&replaced))
                .await,
            &case,
        );
        assert!(
            fields.iter().any(|f| related(f, case.field)),
            "{}: {fields:?}",
            case.name
        );
        let (_, fields) = refusal(
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(merge_patch(&current, &case.object)),
            )
            .await,
            &case,
        );
        assert!(
            fields.iter().any(|f| related(f, case.field)),
            "{}: {fields:?}",
            case.name
        );
    }
    // The message is kube-apiserver's for a built-in Deployment.
    let case = &corpus::cases()[0];
    let (message, _) = refusal(
        api_of(&client, Kind::MachineDeployment)
            .create(&PostParams::default(), &dynamic(&case.object))
            .await,
        case,
    );
    assert_eq!(
        message,
        "MachineDeployment.machine.sapcloud.io \"workers\" is invalid: spec.replicas: Invalid value: -1: must be \
         greater than or equal to 0"
    );
}

/// The RFC 7386 merge patch turning `current` into `wanted` (fields `wanted` lacks are set to null).
fn merge_patch(current: &DynamicObject, wanted: &Value) -> Value {
    fn diff(from: &Value, to: &Value) -> Value {
        match (from, to) {
            (Value::Object(a), Value::Object(b)) => {
                let mut out = serde_json::Map::new();
                for (key, value) in b {
                    match a.get(key) {
                        Some(old) if old == value => {}
                        Some(old) => {
                            out.insert(key.clone(), diff(old, value));
                        }
                        None => {
                            out.insert(key.clone(), value.clone());
                        }
                    }
                }
                for key in a.keys().filter(|k| !b.contains_key(*k)) {
                    out.insert(key.clone(), Value::Null);
                }
                Value::Object(out)
            }
            _ => to.clone(),
        }
    }
    let mut wanted = wanted.clone();
    let current = serde_json::to_value(current).unwrap();
    for key in ["metadata", "status"] {
        wanted.as_object_mut().unwrap().remove(key);
    }
    let mut from = current.clone();
    for key in ["metadata", "status"] {
        from.as_object_mut().unwrap().remove(key);
    }
    diff(&from, &wanted)
}

/// Invalid objects stored before the admission came in (or by a cluster without it) can still be labelled,
/// finalized, given a status, and deleted; a spec change that leaves them invalid is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_never_blocks_what_deleting_an_invalid_object_needs() {
    let dir = tempfile::tempdir().unwrap();
    let bad = corpus::cases();
    let bad_deployment = &bad[0];
    {
        let (server, client) = server(dir.path(), false).await;
        api_of(&client, Kind::MachineDeployment)
            .create(&PostParams::default(), &dynamic(&bad_deployment.object))
            .await
            .expect("stored without admission");
        server.shutdown().await;
    }
    let (_server, client) = server(dir.path(), true).await;
    let api = api_of(&client, Kind::MachineDeployment);
    let params = PatchParams::default();
    // Metadata only: labels, annotations, a finalizer.
    api.patch(
        "workers",
        &params,
        &Patch::Merge(json!({ "metadata": {
            "labels": { "team": "a" }, "annotations": { "note": "x" }, "finalizers": ["test/hold"]
        } })),
    )
    .await
    .expect("a metadata-only change of an invalid object is admitted");
    // The status subresource.
    api.patch_status(
        "workers",
        &params,
        &Patch::Merge(json!({ "status": { "replicas": 3 } })),
    )
    .await
    .expect("a status write is admitted");
    // A spec change that leaves it invalid is refused.
    let (_, fields) = refusal(
        api.patch(
            "workers",
            &params,
            &Patch::Merge(json!({ "spec": { "minReadySeconds": 5 } })),
        )
        .await,
        bad_deployment,
    );
    assert_eq!(fields, ["spec.replicas"]);
    // Deleted: it waits for its finalizer, which can be removed; then it is gone.
    api.delete("workers", &DeleteParams::default()).await.unwrap();
    api.patch(
        "workers",
        &params,
        &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
    )
    .await
    .expect("removing the last finalizer of an invalid object being deleted is admitted");
    wait_for("the invalid deployment to be gone", async || {
        api.get_opt("workers").await.unwrap().is_none().then_some(())
    })
    .await;
}

/// Every Warning Event with reason `InvalidSpec` about the object `name` of `kind`, by message.
async fn invalid_spec_events(client: &Client, kind: &str, name: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for event in Api::<Event>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        if event.involved_object.kind.as_deref() == Some(kind)
            && event.involved_object.name.as_deref() == Some(name)
            && event.type_.as_deref() == Some("Warning")
            && event.reason.as_deref() == Some("InvalidSpec")
        {
            *counts.entry(event.message.unwrap_or_default()).or_default() += 1;
        }
    }
    counts
}

/// The field errors `mcm_api::validation` finds in the case's object, as one message.
fn expected_problems(case: &Case) -> String {
    let errors = match case.kind {
        Kind::MachineDeployment => {
            validation::validate_machine_deployment(&serde_json::from_value(case.object.clone()).unwrap())
        }
        Kind::MachineSet => {
            validation::validate_machine_set(&serde_json::from_value(case.object.clone()).unwrap())
        }
        Kind::Machine => validation::validate_machine(&serde_json::from_value(case.object.clone()).unwrap()),
        Kind::MachineClass => {
            validation::validate_machine_class(&serde_json::from_value(case.object.clone()).unwrap())
        }
    };
    validation::summarize(&errors)
}

/// Stores the case's spec on the stored object (the rest as stored): a set's or deployment's whole spec; for a
/// machine, the case's spec fields over the stored ones (its `providerID` stays).
/// A read-modify-write: the controllers write the same object's status meanwhile, so a 409 Conflict reads again.
async fn store_spec(client: &Client, case: &Case) {
    let api = api_of(client, case.kind);
    let name = case.object["metadata"]["name"].as_str().unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut current = serde_json::to_value(api.get(name).await.unwrap()).unwrap();
        if case.kind == Kind::Machine {
            for (key, value) in case.object["spec"].as_object().unwrap() {
                current["spec"][key] = value.clone();
            }
        } else {
            current["spec"] = case.object["spec"].clone();
        }
        match api
            .replace(name, &PostParams::default(), &dynamic(&current))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(status)) if status.code == 409 && tokio::time::Instant::now() < deadline => {
            }
            Err(err) => panic!("{}: stored without admission: {err}", case.name),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one scenario: valid, every invalid case in turn, valid again
async fn invalid_objects_are_reported_on_themselves_and_no_machine_is_created_or_deleted() {
    let mut cluster = Cluster::start_with_admission(support::settings(), false).await;
    cluster.create_class().await;
    cluster.start_controller();
    cluster.start_set_controllers(machinedeployment::Config::new(NAMESPACE));
    let client = cluster.client.clone();
    let deployments: Api<MachineDeployment> = Api::namespaced(client.clone(), NAMESPACE);
    let sets: Api<MachineSet> = Api::namespaced(client.clone(), NAMESPACE);
    for object in [
        corpus::deployment("workers", 2),
        corpus::set("standalone", 2),
        corpus::machine("single"),
    ] {
        let kind = match object["kind"].as_str() {
            Some("MachineDeployment") => Kind::MachineDeployment,
            Some("MachineSet") => Kind::MachineSet,
            _ => Kind::Machine,
        };
        api_of(&client, kind)
            .create(&PostParams::default(), &dynamic(&object))
            .await
            .unwrap();
    }
    let running = async || {
        let machines = cluster.machines().list(&ListParams::default()).await.ok()?.items;
        let running = machines
            .iter()
            .filter(|m| m.phase() == Some(MachinePhase::Running))
            .count();
        (running == 5 && machines.len() == 5).then(|| machines.iter().map(ResourceExt::name_any).collect())
    };
    let before: BTreeSet<String> = wait_for("five Running machines (2 + 2 + 1)", running).await;
    let machine_history = History::start(cluster.machines()).await;
    let set_history = History::start(sets.clone()).await;

    for case in corpus::cases().iter().filter(|c| c.kind != Kind::MachineClass) {
        store_spec(&client, case).await;
        let name = case.object["metadata"]["name"].as_str().unwrap();
        // What validation says of it: the condition carries exactly this (not the previous case's message).
        let expected = expected_problems(case);
        assert!(expected.contains(case.field), "{}: {expected}", case.name);
        let message = match case.kind {
            Kind::MachineDeployment => {
                wait_for(
                    &format!("{}: the deployment's conditions", case.name),
                    async || {
                        let d = deployments.get(name).await.ok()?;
                        let status = d.status.as_ref()?;
                        let condition = |t| status.conditions.iter().find(|c| c.r#type == t);
                        let failure = condition(MachineDeploymentConditionType::ReplicaFailure)?;
                        let held = failure.status == ConditionStatus::True
                            && failure.reason == "InvalidSpec"
                            && failure.message == expected
                            && status.observed_generation == d.metadata.generation.unwrap_or_default()
                            && [
                                MachineDeploymentConditionType::Available,
                                MachineDeploymentConditionType::Progressing,
                            ]
                            .into_iter()
                            .all(|t| condition(t).is_some_and(|c| c.status == ConditionStatus::False));
                        held.then(|| failure.message.clone())
                    },
                )
                .await
            }
            Kind::MachineSet => {
                wait_for(&format!("{}: the set's condition", case.name), async || {
                    let set = sets.get(name).await.ok()?;
                    let failure = set.status?.conditions.into_iter().find(|c| {
                        c.r#type == MachineSetConditionType::ReplicaFailure
                            && c.status == ConditionStatus::True
                            && c.reason == "InvalidSpec"
                            && c.message == expected
                    })?;
                    Some(failure.message)
                })
                .await
            }
            _ => {
                let machine = cluster
                    .wait_machine(name, case.name, |m| support::description(m).contains(&expected))
                    .await;
                support::description(&machine).to_owned()
            }
        };
        let kind = case.kind.name();
        wait_for(
            &format!("{}: a Warning Event naming {}", case.name, case.field),
            async || {
                invalid_spec_events(&client, kind, name)
                    .await
                    .keys()
                    .any(|m| m.contains(&message))
                    .then_some(())
            },
        )
        .await;
    }

    // Every problem was warned about once, however many passes saw it.
    for (kind, name) in [
        ("MachineDeployment", "workers"),
        ("MachineSet", "standalone"),
        ("Machine", "single"),
    ] {
        let events = invalid_spec_events(&client, kind, name).await;
        assert!(!events.is_empty(), "{kind} {name}: no warning");
        assert!(
            events.values().all(|n| *n == 1),
            "{kind} {name}: repeated warnings {events:#?}"
        );
    }
    // Nothing was created or deleted, and no set was created or scaled, while the objects were invalid.
    let created_or_deleted: Vec<String> = machine_history
        .versions()
        .iter()
        .filter(|s| {
            s.deleted
                || s.object.metadata.deletion_timestamp.is_some()
                || !before.contains(&s.object.name_any())
        })
        .map(|s| s.object.name_any())
        .collect();
    assert!(
        created_or_deleted.is_empty(),
        "machines created or deleted: {created_or_deleted:?}"
    );
    let set_changes: BTreeSet<(String, i32)> = set_history
        .versions()
        .iter()
        .filter(|s| s.object.name_any() != "standalone")
        .map(|s| (s.object.name_any(), s.object.spec.replicas))
        .collect();
    assert_eq!(
        set_changes.len(),
        1,
        "the deployment's set was created or scaled: {set_changes:?}"
    );

    // Fixed (and scaled to 3), the deployment converges and its conditions say so.
    let mut fixed = Case {
        name: "fixed",
        kind: Kind::MachineDeployment,
        object: corpus::deployment("workers", 3),
        field: "",
    };
    store_spec(&client, &fixed).await;
    fixed.object = corpus::set("standalone", 2);
    fixed.kind = Kind::MachineSet;
    store_spec(&client, &fixed).await;
    wait_for("the deployment to converge at 3", async || {
        let d = deployments.get("workers").await.ok()?;
        let status = d.status?;
        let available = status.conditions.iter().any(|c| {
            c.r#type == MachineDeploymentConditionType::Available && c.status == ConditionStatus::True
        });
        let no_failure = !status
            .conditions
            .iter()
            .any(|c| c.r#type == MachineDeploymentConditionType::ReplicaFailure);
        (available && no_failure && status.available_replicas == 3).then_some(())
    })
    .await;
    wait_for("the set's condition to clear", async || {
        let set = sets.get("standalone").await.ok()?;
        (!set
            .status?
            .conditions
            .iter()
            .any(|c| c.r#type == MachineSetConditionType::ReplicaFailure))
        .then_some(())
    })
    .await;
    let machines: Vec<Machine> = cluster
        .machines()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for name in &before {
        assert!(machines.iter().any(|m| &m.name_any() == name), "{name} survived");
    }
    cluster.stop().await;
}
