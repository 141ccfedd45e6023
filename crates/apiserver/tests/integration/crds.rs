//! CustomResourceDefinitions through the real `kube` client: validation, status, discovery and OpenAPI, serving
//! of the custom resources they define (every verb, subresources, schema checks and defaults, Table output,
//! several versions), deletion with cleanup, persistence, the pre-installed CRDs of the machine kinds, and garbage collection.

use crate::support;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::{
    api::core::v1::Secret, apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, ResourceExt,
    api::{
        ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent,
        WatchParams,
    },
    core::Status,
};
use mcm_api::Machine;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use support::{TestServer, api_error, eventually, expect_status, machine, send_raw, within};

/// A change that makes a valid CRD invalid.
type Breakage = Box<dyn Fn(&mut CustomResourceDefinition)>;

const CLUSTER_CRD: &str = include_str!("../fixtures/cluster-crd.yaml");
const GROUP: &str = "cluster.x-k8s.io";

fn fixture() -> CustomResourceDefinition {
    let value: Value = serde_saphyr::from_str(CLUSTER_CRD).expect("the fixture is YAML");
    serde_json::from_value(value).expect("the fixture is a CRD")
}

fn crds(t: &TestServer) -> Api<CustomResourceDefinition> {
    Api::all(t.client.clone())
}

fn resource(version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: version.into(),
        api_version: format!("{GROUP}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn clusters(t: &TestServer, version: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        t.client.clone(),
        "default",
        &resource(version, "Cluster", "clusters"),
    )
}

fn cluster(name: &str, version: &str, extra: Value) -> DynamicObject {
    let mut object = json!({
        "apiVersion": format!("{GROUP}/{version}"),
        "kind": "Cluster",
        "metadata": { "name": name },
        "spec": { "topology": { "version": "v1.32.0" } },
    });
    merge(&mut object, extra);
    serde_json::from_value(object).expect("a cluster")
}

fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k).or_insert(Value::Null), v);
            }
        }
        (t, p) => *t = p,
    }
}

/// Creates a CRD and checks that the server established it.
async fn install(t: &TestServer, crd: &CustomResourceDefinition) -> CustomResourceDefinition {
    let created = crds(t)
        .create(&PostParams::default(), crd)
        .await
        .expect("the CRD is created");
    assert!(established(&created), "{:?}", created.status);
    created
}

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"))
}

fn cause_fields(status: &Status) -> Vec<String> {
    status
        .details
        .as_ref()
        .map(|d| d.causes.iter().map(|c| c.field.clone()).collect())
        .unwrap_or_default()
}

fn names(list: kube::core::ObjectList<DynamicObject>) -> Vec<String> {
    list.items.into_iter().map(|o| o.name_any()).collect()
}

fn data(object: &DynamicObject) -> &Value {
    &object.data
}

async fn get_json(t: &TestServer, path: &str, accept: &str) -> (http::StatusCode, Value) {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())
        .expect("a request");
    send_raw(&t.client, request).await
}

// Point 1: an invalid CRD is refused with a 422 whose causes name the field, on create and on update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_crds_are_422_with_causes_naming_the_field() {
    let t = TestServer::start().await;
    let api = crds(&t);
    let cases: Vec<(&str, Breakage)> = vec![
        (
            "metadata.name",
            Box::new(|c| c.metadata.name = Some("things.cluster.x-k8s.io".into())),
        ),
        (
            "spec.group",
            Box::new(|c| {
                c.spec.group = "example".into();
                c.metadata.name = Some("clusters.example".into());
            }),
        ),
        ("spec.scope", Box::new(|c| c.spec.scope = "Galactic".into())),
        ("spec.versions", Box::new(|c| c.spec.versions.clear())),
        (
            "spec.versions",
            Box::new(|c| c.spec.versions.iter_mut().for_each(|v| v.storage = true)),
        ),
        (
            "spec.versions[1].schema.openAPIV3Schema",
            Box::new(|c| c.spec.versions[1].schema = None),
        ),
        ("spec.names.kind", Box::new(|c| c.spec.names.kind = String::new())),
    ];
    for (field, break_it) in &cases {
        let mut crd = fixture();
        break_it(&mut crd);
        let status = expect_status(api.create(&PostParams::default(), &crd).await, 422, "Invalid");
        assert_eq!(cause_fields(&status), [*field], "{status:?}");
    }
    expect_status(api.get("clusters.cluster.x-k8s.io").await, 404, "NotFound");

    let mut stored = install(&t, &fixture()).await;
    stored.spec.scope = "Everywhere".into();
    let status = expect_status(
        api.replace("clusters.cluster.x-k8s.io", &PostParams::default(), &stored)
            .await,
        422,
        "Invalid",
    );
    assert_eq!(cause_fields(&status), ["spec.scope"]);
}

// Point 1: a created CRD is defaulted and established; it is served with every verb and a status subresource,
// discovered and described in OpenAPI as the other resources are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_is_established_defaulted_and_served_like_other_resources() {
    let t = TestServer::start().await;
    let api = crds(&t);
    let created = install(&t, &fixture()).await;
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(created.spec.names.list_kind.as_deref(), Some("ClusterList"));
    assert_eq!(created.spec.names.singular.as_deref(), Some("cluster"));
    let status = created.status.clone().unwrap();
    let conditions: Vec<(String, String)> = status
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    assert_eq!(
        conditions,
        [
            ("NamesAccepted".into(), "True".into()),
            ("Established".into(), "True".into())
        ]
    );
    assert_eq!(status.accepted_names.unwrap().kind, "Cluster");
    assert_eq!(status.stored_versions, Some(vec!["v1beta2".to_owned()]));

    // get, list with a field selector, merge and JSON patch, update.
    let name = "clusters.cluster.x-k8s.io";
    assert_eq!(api.get(name).await.unwrap().uid(), created.uid());
    let listed = api
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    let labeled = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "team": "infra" } } })),
        )
        .await
        .unwrap();
    assert_eq!(labeled.metadata.generation, Some(1), "labels are metadata");
    let patched = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(
                    json!([{ "op": "add", "path": "/spec/names/shortNames/-", "value": "capicl" }]),
                )
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2));
    let accepted = api
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap()
        .accepted_names
        .unwrap();
    assert_eq!(accepted.short_names, Some(vec!["cl".into(), "capicl".into()]));

    // The status subresource: writes there change only status, writes to the main resource never do.
    let with_condition = api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "conditions": [
                { "type": "Reviewed", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z", "reason": "R", "message": "m" }
            ] } })),
        )
        .await
        .unwrap();
    let types: Vec<String> = with_condition
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert!(types.contains(&"Reviewed".to_owned()), "{types:?}");
    let after_main = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "storedVersions": ["v9"] } })),
        )
        .await
        .unwrap();
    assert_eq!(
        after_main.status.unwrap().stored_versions,
        Some(vec!["v1beta2".to_owned()])
    );
}

// Point 1: CRDs and the kinds they define are in discovery (legacy and aggregated, preferred version first) and
// in OpenAPI, schema defaults included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crds_and_their_kinds_are_discovered_and_described_in_openapi() {
    let t = TestServer::start().await;
    install(&t, &fixture()).await;
    // Discovery, legacy and aggregated, and OpenAPI.
    let (code, list) = get_json(&t, "/apis/apiextensions.k8s.io/v1", "application/json").await;
    assert_eq!(code, 200);
    let resources = list["resources"].as_array().unwrap();
    let crd_entry = resources
        .iter()
        .find(|r| r["name"] == "customresourcedefinitions")
        .unwrap();
    assert_eq!(crd_entry["shortNames"], json!(["crd", "crds"]));
    assert_eq!(crd_entry["namespaced"], false);
    assert!(
        resources
            .iter()
            .any(|r| r["name"] == "customresourcedefinitions/status")
    );
    let (_, group) = get_json(&t, "/apis/cluster.x-k8s.io", "application/json").await;
    assert_eq!(group["preferredVersion"]["version"], "v1beta2", "{group}");
    let (_, v1beta2) = get_json(&t, "/apis/cluster.x-k8s.io/v1beta2", "application/json").await;
    let clusters_entry = &v1beta2["resources"][0];
    assert_eq!(clusters_entry["name"], "clusters");
    assert_eq!(clusters_entry["shortNames"], json!(["cl"]));
    assert_eq!(clusters_entry["categories"], json!(["cluster-api"]));
    assert_eq!(v1beta2["resources"][1]["name"], "clusters/status");
    let (_, aggregated) = get_json(
        &t,
        "/apis",
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
    )
    .await;
    let versions: Vec<&Value> = aggregated["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["metadata"]["name"] == GROUP)
        .flat_map(|i| i["versions"].as_array().unwrap())
        .map(|v| &v["version"])
        .collect();
    assert_eq!(versions, [&json!("v1beta2"), &json!("v1beta1")]);
    let (_, root) = get_json(&t, "/openapi/v3", "application/json").await;
    for path in [
        "apis/apiextensions.k8s.io/v1",
        "apis/cluster.x-k8s.io/v1beta2",
        "apis/cluster.x-k8s.io/v1beta1",
    ] {
        assert!(root["paths"][path].is_object(), "{path} missing from {root}");
    }
    let url = root["paths"]["apis/cluster.x-k8s.io/v1beta2"]["serverRelativeURL"]
        .as_str()
        .unwrap();
    let (_, document) = get_json(&t, url, "application/json").await;
    let schema = &document["components"]["schemas"]["io.x-k8s.cluster.v1beta2.Cluster"];
    assert_eq!(
        schema["properties"]["spec"]["properties"]["paused"]["default"], false,
        "{schema}"
    );

    let api = crds(&t);
    let name = "clusters.cluster.x-k8s.io";
    // Watch sees the deletion (a CRD without objects goes at once, after its cleanup).
    let mut events = api
        .watch(
            &WatchParams::default(),
            &api.get(name).await.unwrap().resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    api.delete(name, &DeleteParams::default()).await.unwrap();
    let deleted = within("the deletion event", async {
        loop {
            if let Some(WatchEvent::Deleted(crd)) = events.try_next().await.unwrap() {
                return crd;
            }
        }
    })
    .await;
    assert_eq!(deleted.name_any(), name);
}

// Point 2: custom resources are served with CRUD, label and field selectors, generation and the status
// subresource semantics of the machine kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_have_every_verb_selectors_generation_and_status_semantics() {
    let t = TestServer::start().await;
    install(&t, &fixture()).await;
    let api = clusters(&t, "v1beta2");
    let a = api
        .create(
            &PostParams::default(),
            &cluster(
                "a",
                "v1beta2",
                json!({ "metadata": { "labels": { "env": "prod" } }, "status": { "phase": "Provisioned" } }),
            ),
        )
        .await
        .unwrap();
    assert!(
        data(&a).get("status").is_none(),
        "status is ignored on create: {a:?}"
    );
    assert_eq!(a.metadata.generation, Some(1));
    assert_eq!(a.metadata.namespace.as_deref(), Some("default"));
    api.create(
        &PostParams::default(),
        &cluster(
            "b",
            "v1beta2",
            json!({ "metadata": { "labels": { "env": "dev" } } }),
        ),
    )
    .await
    .unwrap();

    assert_eq!(
        names(api.list(&ListParams::default().labels("env=prod")).await.unwrap()),
        ["a"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().labels("env!=prod"))
                .await
                .unwrap()
        ),
        ["b"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().fields("metadata.name=b"))
                .await
                .unwrap()
        ),
        ["b"]
    );
    assert_eq!(
        names(
            api.list(&ListParams::default().fields("metadata.namespace=default"))
                .await
                .unwrap()
        ),
        ["a", "b"]
    );
    expect_status(
        api.list(&ListParams::default().fields("spec.paused=true")).await,
        400,
        "BadRequest",
    );
    let all = Api::<DynamicObject>::all_with(t.client.clone(), &resource("v1beta2", "Cluster", "clusters"));
    assert_eq!(all.list(&ListParams::default()).await.unwrap().items.len(), 2);

    // generation moves on spec changes only; writes to the main resource never change status.
    let mut replaced = api.get("a").await.unwrap();
    replaced.data["spec"]["topology"]["version"] = json!("v1.33.0");
    let replaced = api.replace("a", &PostParams::default(), &replaced).await.unwrap();
    assert_eq!(replaced.metadata.generation, Some(2));
    let relabeled = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "x": "y" } } })),
        )
        .await
        .unwrap();
    assert_eq!(relabeled.metadata.generation, Some(2));
    let with_status = api
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Provisioned" } })),
        )
        .await
        .unwrap();
    assert_eq!(with_status.data["status"]["phase"], "Provisioned");
    assert_eq!(with_status.metadata.generation, Some(2));
    let main_write = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "paused": true }, "status": { "phase": "Failed" } })),
        )
        .await
        .unwrap();
    assert_eq!(main_write.data["status"]["phase"], "Provisioned");
    assert_eq!(main_write.data["spec"]["paused"], true);
    assert_eq!(main_write.metadata.generation, Some(3));
}

// Point 2: finalizers hold a deleted custom resource until they are removed, and a watch sees it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resource_finalizers_hold_deletion_and_watches_see_every_change() {
    let t = TestServer::start().await;
    install(&t, &fixture()).await;
    let api = clusters(&t, "v1beta2");
    for name in ["a", "b"] {
        api.create(&PostParams::default(), &cluster(name, "v1beta2", json!({})))
            .await
            .unwrap();
    }
    let mut watch = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    // Finalizers hold a deleted object until they are removed.
    api.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "finalizers": ["example.com/hold"] } })),
    )
    .await
    .unwrap();
    let marked = api.delete("b", &DeleteParams::default()).await.unwrap();
    let marked = marked
        .left()
        .expect("an object with a finalizer is marked, not gone");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.generation, Some(2), "deletion moves generation");
    api.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
    )
    .await
    .unwrap();
    expect_status(api.get("b").await, 404, "NotFound");

    let mut seen = Vec::new();
    while !seen.contains(&("DELETED", "b".to_owned())) {
        let event = within("a watch event", watch.try_next()).await.unwrap().unwrap();
        seen.push(match event {
            WatchEvent::Added(o) => ("ADDED", o.name_any()),
            WatchEvent::Modified(o) => ("MODIFIED", o.name_any()),
            WatchEvent::Deleted(o) => ("DELETED", o.name_any()),
            other => panic!("unexpected {other:?}"),
        });
    }
    assert_eq!(&seen[..2], [("ADDED", "a".to_owned()), ("ADDED", "b".to_owned())]);
}

// Point 3: the version's schema prunes unknown fields (400 with Strict), refuses wrong types, missing required
// fields and values outside an enum, and its defaults are applied on create, on update and on read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_prunes_validates_and_defaults() {
    let t = TestServer::start().await;
    install(&t, &fixture()).await;
    let api = clusters(&t, "v1beta2");
    let created = api
        .create(
            &PostParams::default(),
            &cluster(
                "c",
                "v1beta2",
                json!({ "spec": { "colour": "blue", "clusterNetwork": {} } }),
            ),
        )
        .await
        .unwrap();
    assert!(
        created.data["spec"].get("colour").is_none(),
        "unknown fields are pruned"
    );
    assert_eq!(created.data["spec"]["paused"], false, "default on create");
    assert_eq!(
        created.data["spec"]["clusterNetwork"]["serviceDomain"],
        "cluster.local"
    );

    let status = expect_status(
        api.patch(
            "c",
            &PatchParams::default().validation_strict(),
            &Patch::Merge(json!({ "spec": { "colour": "blue" } })),
        )
        .await,
        400,
        "BadRequest",
    );
    assert!(
        status.message.contains("unknown field \"spec.colour\""),
        "{}",
        status.message
    );

    let status = expect_status(
        api.create(
            &PostParams::default(),
            &cluster(
                "e",
                "v1beta2",
                json!({ "spec": { "paused": "yes", "topology": { "version": null } } }),
            ),
        )
        .await,
        422,
        "Invalid",
    );
    assert_eq!(cause_fields(&status), ["spec.paused", "spec.topology.version"]);
    let status = expect_status(
        api.patch_status(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Exploded" } })),
        )
        .await,
        422,
        "Invalid",
    );
    assert_eq!(cause_fields(&status), ["status.phase"]);

    // Defaults on update: a replace without `paused` gets it back.
    let mut without = api.get("c").await.unwrap();
    without.data["spec"].as_object_mut().unwrap().remove("paused");
    let replaced = api.replace("c", &PostParams::default(), &without).await.unwrap();
    assert_eq!(replaced.data["spec"]["paused"], false);

    // Defaults on read: an object stored without them (as written before the default existed) reads with them.
    let stored = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": { "name": "old", "namespace": "default", "uid": "u-old", "creationTimestamp": "2026-01-01T00:00:00Z" },
        "spec": { "clusterNetwork": {} },
    });
    t.server()
        .store()
        .mutate("cluster.x-k8s.io/clusters", "default", "old", |_| {
            Ok(mcm_apiserver::store::Mutation::Put(stored))
        })
        .unwrap();
    let old = api.get("old").await.unwrap();
    assert_eq!(old.data["spec"]["paused"], false);
    assert_eq!(
        old.data["spec"]["clusterNetwork"]["serviceDomain"],
        "cluster.local"
    );
}

// Point 2: the scale subresource reads and writes the paths the CRD names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scale_subresource_uses_the_crd_paths() {
    let t = TestServer::start().await;
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "machinedeployments.cluster.x-k8s.io" },
        "spec": {
            "group": GROUP,
            "names": { "kind": "MachineDeployment", "plural": "machinedeployments", "shortNames": ["md"] },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1beta2", "served": true, "storage": true,
                "subresources": { "status": {}, "scale": {
                    "specReplicasPath": ".spec.replicas",
                    "statusReplicasPath": ".status.readyReplicas",
                    "labelSelectorPath": ".status.selector",
                } },
                "schema": { "openAPIV3Schema": { "type": "object", "properties": {
                    "spec": { "type": "object", "properties": { "replicas": { "type": "integer", "default": 1 } } },
                    "status": { "type": "object", "properties": {
                        "readyReplicas": { "type": "integer" }, "selector": { "type": "string" } } },
                } } },
            }],
        },
    }))
    .unwrap();
    install(&t, &crd).await;
    let api: Api<DynamicObject> = Api::namespaced_with(
        t.client.clone(),
        "default",
        &resource("v1beta2", "MachineDeployment", "machinedeployments"),
    );
    let md: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
        "metadata": { "name": "workers" }, "spec": {},
    }))
    .unwrap();
    api.create(&PostParams::default(), &md).await.unwrap();
    api.patch_status(
        "workers",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "readyReplicas": 1, "selector": "pool=workers" } })),
    )
    .await
    .unwrap();
    let scale = api.get_scale("workers").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(1));
    let status = scale.status.unwrap();
    assert_eq!(
        (status.replicas, status.selector.as_deref()),
        (1, Some("pool=workers"))
    );
    let scaled = api
        .patch_scale(
            "workers",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": 4 } })),
        )
        .await
        .unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(4));
    let object = api.get("workers").await.unwrap();
    assert_eq!(object.data["spec"]["replicas"], 4);
    assert_eq!(object.metadata.generation, Some(2));
}

// Point 2: Table output prints the version's printer columns (priority kept for -o wide).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_output_prints_the_printer_columns_of_the_version() {
    let t = TestServer::start().await;
    install(&t, &fixture()).await;
    clusters(&t, "v1beta2")
        .create(&PostParams::default(), &cluster("a", "v1beta2", json!({})))
        .await
        .unwrap();
    clusters(&t, "v1beta2")
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Provisioned" } })),
        )
        .await
        .unwrap();
    let table_accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let columns = |table: &Value| -> Vec<(String, i64)> {
        table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_owned(),
                    c["priority"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    let (code, table) = get_json(
        &t,
        "/apis/cluster.x-k8s.io/v1beta2/namespaces/default/clusters",
        table_accept,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        columns(&table),
        [
            ("Name".into(), 0),
            ("Version".into(), 0),
            ("Phase".into(), 0),
            ("Paused".into(), 1),
            ("Age".into(), 0)
        ]
    );
    let cells = &table["rows"][0]["cells"];
    assert_eq!(
        &cells.as_array().unwrap()[..4],
        [json!("a"), json!("v1.32.0"), json!("Provisioned"), json!(false)]
    );
    let (_, old) = get_json(
        &t,
        "/apis/cluster.x-k8s.io/v1beta1/namespaces/default/clusters/a",
        table_accept,
    )
    .await;
    assert_eq!(
        columns(&old),
        [("Name".into(), 0), ("Phase".into(), 0), ("Age".into(), 0)]
    );
}

// Point 4: every served version reads the one stored object (only apiVersion differs); a version no longer
// served is 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_served_version_reads_the_one_stored_object_and_unserved_versions_are_404() {
    let t = TestServer::start().await;
    install(&t, &fixture()).await;
    let (old, new) = (clusters(&t, "v1beta1"), clusters(&t, "v1beta2"));
    let created = old
        .create(&PostParams::default(), &cluster("a", "v1beta1", json!({})))
        .await
        .unwrap();
    assert_eq!(
        created.types.as_ref().unwrap().api_version,
        "cluster.x-k8s.io/v1beta1"
    );
    let read = new.get("a").await.unwrap();
    assert_eq!(
        read.types.as_ref().unwrap().api_version,
        "cluster.x-k8s.io/v1beta2"
    );
    assert_eq!(
        (read.uid(), read.resource_version()),
        (created.uid(), created.resource_version())
    );
    assert_eq!(new.list(&ListParams::default()).await.unwrap().items.len(), 1);
    let updated = new
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "paused": true } })),
        )
        .await
        .unwrap();
    assert_eq!(
        updated.types.as_ref().unwrap().api_version,
        "cluster.x-k8s.io/v1beta2"
    );
    assert_eq!(old.get("a").await.unwrap().data["spec"]["paused"], true);

    let mut crd = crds(&t).get("clusters.cluster.x-k8s.io").await.unwrap();
    crd.spec.versions[0].served = false;
    crds(&t)
        .replace("clusters.cluster.x-k8s.io", &PostParams::default(), &crd)
        .await
        .unwrap();
    expect_status(old.get("a").await, 404, "NotFound");
    assert_eq!(new.get("a").await.unwrap().uid(), created.uid());
}

// Point 5: deleting a CRD marks it with the cleanup finalizer, deletes its objects (finalizers or not), and then
// it goes and its resource is no longer served or discovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_crd_deletes_its_objects_and_stops_serving_it() {
    let t = TestServer::start().await;
    let crd = install(&t, &fixture()).await;
    let api = clusters(&t, "v1beta2");
    api.create(&PostParams::default(), &cluster("a", "v1beta2", json!({})))
        .await
        .unwrap();
    api.create(
        &PostParams::default(),
        &cluster(
            "b",
            "v1beta2",
            json!({ "metadata": { "finalizers": ["example.com/hold"] } }),
        ),
    )
    .await
    .unwrap();
    let mut events = crds(&t)
        .watch(&WatchParams::default(), &crd.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();

    let response = crds(&t)
        .delete("clusters.cluster.x-k8s.io", &DeleteParams::default())
        .await
        .unwrap();
    let marked = response.left().expect("the CRD is marked for deletion first");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert!(
        marked
            .finalizers()
            .contains(&"customresourcecleanup.apiextensions.k8s.io".to_owned())
    );
    let terminating = within("the CRD's deletion events", async {
        let mut terminating = false;
        loop {
            match events.try_next().await.unwrap().unwrap() {
                WatchEvent::Modified(crd) => {
                    terminating |= crd
                        .status
                        .and_then(|s| s.conditions)
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Terminating"));
                }
                WatchEvent::Deleted(_) => return terminating,
                _ => {}
            }
        }
    })
    .await;
    assert!(terminating, "the CRD reported Terminating before it went");
    expect_status(crds(&t).get("clusters.cluster.x-k8s.io").await, 404, "NotFound");
    expect_status(api.get("a").await, 404, "NotFound");
    expect_status(api.list(&ListParams::default()).await, 404, "NotFound");
    let (code, _) = get_json(&t, "/apis/cluster.x-k8s.io", "application/json").await;
    assert_eq!(code, 404);
    let (_, aggregated) = get_json(
        &t,
        "/apis",
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
    )
    .await;
    assert!(!aggregated.to_string().contains(GROUP));

    // The objects are really gone: a new CRD of the same name starts empty.
    install(&t, &fixture()).await;
    assert!(api.list(&ListParams::default()).await.unwrap().items.is_empty());
}

// Point 6: CRDs persist, and a restarted server serves their kinds and objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_serves_the_kinds_of_its_stored_crds() {
    let mut t = TestServer::start().await;
    install(&t, &fixture()).await;
    let created = clusters(&t, "v1beta2")
        .create(&PostParams::default(), &cluster("a", "v1beta2", json!({})))
        .await
        .unwrap();
    t.restart().await;
    let read = clusters(&t, "v1beta1").get("a").await.unwrap();
    assert_eq!(read.uid(), created.uid());
    let crd = crds(&t).get("clusters.cluster.x-k8s.io").await.unwrap();
    assert!(established(&crd));
    clusters(&t, "v1beta2")
        .create(&PostParams::default(), &cluster("b", "v1beta2", json!({})))
        .await
        .unwrap();
    let (_, group) = get_json(&t, "/apis/cluster.x-k8s.io", "application/json").await;
    assert_eq!(group["preferredVersion"]["version"], "v1beta2");
}

// Point 7: the machine kinds are pre-installed CRDs, served through the same path as any other: listed and
// Established from the start, with the columns, short names and subresources of `mcm crds`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_machine_kinds_are_pre_installed_crds() {
    let t = TestServer::start().await;
    let list = crds(&t).list(&ListParams::default()).await.unwrap();
    for name in MACHINE_CRDS {
        let crd = list
            .items
            .iter()
            .find(|c| c.name_any() == name)
            .unwrap_or_else(|| panic!("{name} is listed"));
        assert!(established(crd), "{name}: {:?}", crd.status);
        let ours = mcm_api::crd::all()
            .unwrap()
            .into_iter()
            .find(|c| c.name_any() == name)
            .unwrap();
        assert_eq!(crd.spec.names.short_names, ours.spec.names.short_names, "{name}");
        assert_eq!(
            crd.spec.versions[0].schema, ours.spec.versions[0].schema,
            "{name}: the schema of `mcm crds`"
        );
    }
    let (_, group) = get_json(&t, "/apis/machine.sapcloud.io/v1alpha1", "application/json").await;
    let mcd = group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "machinedeployments")
        .expect("machinedeployments are discovered");
    assert_eq!(mcd["shortNames"], json!(["mcd"]));
    let subresources: Vec<&str> = group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .filter(|n| n.starts_with("machinedeployments/"))
        .collect();
    assert_eq!(
        subresources,
        ["machinedeployments/status", "machinedeployments/scale"]
    );
    // The machine kinds keep their admission under the CRD path.
    let status = api_error(
        t.api::<Machine>()
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({ "metadata": { "name": "no-class" }, "spec": {} })).unwrap(),
            )
            .await,
    );
    assert_eq!(
        (status.code, status.reason.as_str()),
        (422, "Invalid"),
        "{status:?}"
    );
    assert_eq!(cause_fields(&status), ["spec.class.kind", "spec.class.name"]);
}

const MACHINE_CRDS: [&str; 4] = [
    "machineclasses.machine.sapcloud.io",
    "machines.machine.sapcloud.io",
    "machinesets.machine.sapcloud.io",
    "machinedeployments.machine.sapcloud.io",
];

fn machines(t: &TestServer) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<Machine>(&());
    Api::namespaced_with(t.client.clone(), "default", &resource)
}

/// A Machine with a field our CRD does not declare (`spec.bootProfile`).
fn machine_with_new_field(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "Machine",
        "metadata": { "name": name },
        "spec": { "class": { "kind": "MachineClass", "name": "small" }, "bootProfile": "fast" },
    }))
    .unwrap()
}

/// The stored Machine CRD with `spec.bootProfile` added to its schema and a printer column for it.
async fn machine_crd_variant(t: &TestServer) -> CustomResourceDefinition {
    let mut crd = crds(t).get("machines.machine.sapcloud.io").await.unwrap();
    let version = &mut crd.spec.versions[0];
    let mut schema = serde_json::to_value(&version.schema).unwrap();
    schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["bootProfile"] =
        json!({ "type": "string", "description": "How the machine boots." });
    version.schema = serde_json::from_value(schema).unwrap();
    version.additional_printer_columns.get_or_insert_default().push(
        serde_json::from_value(json!({ "name": "Boot", "type": "string", "jsonPath": ".spec.bootProfile" }))
            .unwrap(),
    );
    crd
}

// Point 7: replacing the Machine CRD (with a newer version of ours, or the reference's) takes effect at once: a
// field the new schema adds is stored instead of pruned, its printer column is shown, admission still holds, and a
// restarted server keeps the replacement rather than reinstalling ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_machine_crd_takes_effect_and_survives_a_restart() {
    let mut t = TestServer::start().await;
    let before = machines(&t)
        .create(&PostParams::default(), &machine_with_new_field("before"))
        .await
        .unwrap();
    assert_eq!(
        data(&before)["spec"].get("bootProfile"),
        None,
        "our CRD prunes the undeclared field"
    );
    let variant = machine_crd_variant(&t).await;
    crds(&t)
        .replace("machines.machine.sapcloud.io", &PostParams::default(), &variant)
        .await
        .unwrap();
    let after = machines(&t)
        .create(&PostParams::default(), &machine_with_new_field("after"))
        .await
        .unwrap();
    assert_eq!(data(&after)["spec"]["bootProfile"], "fast");
    let (_, table) = get_json(
        &t,
        "/apis/machine.sapcloud.io/v1alpha1/namespaces/default/machines/after",
        "application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    .await;
    let headers: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(headers, ["Name", "Status", "Age", "Node", "ProviderID", "Boot"]);
    assert_eq!(table["rows"][0]["cells"][5], "fast");
    let mut invalid = machine_with_new_field("invalid");
    invalid.data["spec"]["class"]["name"] = json!("");
    let status = api_error(machines(&t).create(&PostParams::default(), &invalid).await);
    assert_eq!(
        status.code, 422,
        "admission holds under the replaced CRD: {status:?}"
    );

    t.restart().await;
    let crd = crds(&t).get("machines.machine.sapcloud.io").await.unwrap();
    assert_eq!(crd.spec.versions[0].schema, variant.spec.versions[0].schema);
    let again = machines(&t)
        .create(&PostParams::default(), &machine_with_new_field("again"))
        .await
        .unwrap();
    assert_eq!(data(&again)["spec"]["bootProfile"], "fast");
}

// Point 7: deleting a machine kind's CRD deletes its objects and stops serving it, as for any CRD; the other
// machine kinds stay. Applying the CRD again serves the kind again, empty; so does a restart (the server installs
// the CRDs it misses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_machine_class_crd_stops_serving_machine_classes() {
    let mut t = TestServer::start().await;
    let classes: Api<mcm_api::MachineClass> = t.api();
    classes
        .create(&PostParams::default(), &support::machine_class("small"))
        .await
        .unwrap();
    t.api::<Machine>()
        .create(&PostParams::default(), &machine("kept", &[]))
        .await
        .unwrap();
    crds(&t)
        .delete("machineclasses.machine.sapcloud.io", &DeleteParams::default())
        .await
        .unwrap();
    expect_status(classes.list(&ListParams::default()).await, 404, "NotFound");
    expect_status(
        crds(&t).get("machineclasses.machine.sapcloud.io").await,
        404,
        "NotFound",
    );
    let (_, group) = get_json(&t, "/apis/machine.sapcloud.io/v1alpha1", "application/json").await;
    assert!(
        !group.to_string().contains("\"machineclasses\""),
        "no longer discovered: {group}"
    );
    assert_eq!(
        t.api::<Machine>().get("kept").await.unwrap().name_any(),
        "kept",
        "the other machine kinds stay"
    );

    install(&t, &mcm_api::crd::machine_class().unwrap()).await;
    assert!(
        classes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    crds(&t)
        .delete("machineclasses.machine.sapcloud.io", &DeleteParams::default())
        .await
        .unwrap();
    t.restart().await;
    let classes: Api<mcm_api::MachineClass> = t.api();
    assert!(
        classes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(established(
        &crds(&t).get("machineclasses.machine.sapcloud.io").await.unwrap()
    ));
}

// Point 2: garbage collection resolves owners that are custom resources (through any served version) and
// collects dependents that are custom resources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_follows_owner_references_to_and_from_custom_resources() {
    let t = TestServer::start().await;
    install(&t, &fixture()).await;
    let api = clusters(&t, "v1beta2");
    let owner = api
        .create(&PostParams::default(), &cluster("owner", "v1beta2", json!({})))
        .await
        .unwrap();
    let reference = |api_version: &str| json!([{ "apiVersion": api_version, "kind": "Cluster", "name": "owner", "uid": owner.uid().unwrap() }]);
    api.create(
        &PostParams::default(),
        &cluster(
            "child",
            "v1beta2",
            json!({ "metadata": { "ownerReferences": reference("cluster.x-k8s.io/v1beta1") } }),
        ),
    )
    .await
    .unwrap();
    let secrets: Api<Secret> = t.api();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "kubeconfig", "ownerReferences": reference("cluster.x-k8s.io/v1beta2") },
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    eventually(
        "the dependents of the deleted cluster to be collected",
        || async {
            let child = api.get_opt("child").await.unwrap();
            let secret = secrets.get_opt("kubeconfig").await.unwrap();
            (child.is_none() && secret.is_none()).then_some(())
        },
    )
    .await;
}
