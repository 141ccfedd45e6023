//! Server-side apply through the real `kube` client over HTTPS (`PATCH` with `application/apply-patch+yaml`):
//! create when absent, `managedFields` per manager and operation, conflicts answered 409 with one cause per field
//! and forced with `force=true`, fields an applier stops applying removed unless another manager owns them, set
//! lists merged element by element, the status subresource, and the options kube-apiserver requires.

use crate::support;

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use mcm_api::Machine;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use support::{TestServer, expect_status, machine, rv};

fn secret(data: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(base64_of(v))))
        .collect();
    json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "s" }, "data": data })
}

/// Applies the Secret `s` with `data` under `params` (its manager, maybe forced or a dry run).
async fn apply_secret(
    api: &Api<Secret>,
    params: &PatchParams,
    data: &[(&str, &str)],
) -> kube::Result<Secret> {
    api.patch("s", params, &Patch::Apply(secret(data))).await
}

fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// The managedFields of an object as (manager, operation, subresource, fieldsV1).
fn managed(object: &impl ResourceExt) -> Vec<(String, String, Option<String>, Value)> {
    object
        .managed_fields()
        .iter()
        .map(|entry| {
            (
                entry.manager.clone().unwrap_or_default(),
                entry.operation.clone().unwrap_or_default(),
                entry.subresource.clone(),
                serde_json::to_value(entry.fields_v1.as_ref().map(|f| &f.0)).unwrap(),
            )
        })
        .collect()
}

fn data_of(secret: &Secret) -> Vec<(String, String)> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, ByteString(v))| (k.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect()
}

// Server-side apply docs: "If the object does not exist, it is created"; the applier's entry is an `Apply` entry
// listing exactly the fields of its configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_creates_the_object_and_records_the_applier_as_owner_of_its_fields() {
    let t = TestServer::start().await;
    let secrets: Api<Secret> = t.api();
    let created = apply_secret(&secrets, &PatchParams::apply("first"), &[("a", "1")])
        .await
        .unwrap();
    assert_eq!(data_of(&created), vec![("a".into(), "1".into())]);
    assert!(created.uid().is_some());
    assert_eq!(
        managed(&created),
        vec![(
            "first".into(),
            "Apply".into(),
            None,
            json!({ "f:data": { "f:a": {} } })
        )]
    );
    let entry = &created.managed_fields()[0];
    assert_eq!(entry.api_version.as_deref(), Some("v1"));
    assert_eq!(entry.fields_type.as_deref(), Some("FieldsV1"));
    assert!(entry.time.is_some());

    // Applying the same configuration again changes nothing.
    let again = apply_secret(&secrets, &PatchParams::apply("first"), &[("a", "1")])
        .await
        .unwrap();
    assert_eq!(rv(&again), rv(&created));
}

// Server-side apply docs, "Conflicts": "A conflict is a special status error that occurs when an Apply operation
// tries to change a field that another manager also claims to manage"; "force ... changes the value of the field,
// and removes the field from all other managers' entries in managedFields".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_manager_changing_a_field_conflicts_and_force_takes_it() {
    let t = TestServer::start().await;
    let secrets: Api<Secret> = t.api();
    apply_secret(&secrets, &PatchParams::apply("first"), &[("a", "1"), ("b", "2")])
        .await
        .unwrap();
    let status = expect_status(
        apply_secret(&secrets, &PatchParams::apply("second"), &[("a", "changed")]).await,
        409,
        "Conflict",
    );
    assert_eq!(
        status.message,
        "Apply failed with 1 conflict: conflict with \"first\": .data.a"
    );
    let causes = status.details.expect("details").causes;
    assert_eq!(causes.len(), 1);
    assert_eq!(causes[0].reason, "FieldManagerConflict");
    assert_eq!(causes[0].message, "conflict with \"first\"");
    assert_eq!(causes[0].field, ".data.a");
    assert_eq!(
        data_of(&secrets.get("s").await.unwrap()),
        vec![("a".into(), "1".into()), ("b".into(), "2".into())],
        "a conflict changes nothing"
    );

    // The same value is no conflict: both managers own it.
    let shared = apply_secret(&secrets, &PatchParams::apply("second"), &[("a", "1")])
        .await
        .unwrap();
    assert_eq!(managed(&shared).len(), 2);

    let forced = apply_secret(
        &secrets,
        &PatchParams::apply("second").force(),
        &[("a", "changed")],
    )
    .await
    .unwrap();
    assert_eq!(
        data_of(&forced),
        vec![("a".into(), "changed".into()), ("b".into(), "2".into())]
    );
    assert_eq!(
        managed(&forced),
        vec![
            (
                "first".into(),
                "Apply".into(),
                None,
                json!({ "f:data": { "f:b": {} } })
            ),
            (
                "second".into(),
                "Apply".into(),
                None,
                json!({ "f:data": { "f:a": {} } })
            ),
        ]
    );
}

// Every write that is not an apply records an `Update` entry; an apply that changes such a field conflicts with
// the updater, named with the apiVersion it used, as kube-apiserver words it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_writes_record_update_entries_that_applies_conflict_with() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    let created = machines
        .create(
            &PostParams {
                field_manager: Some("creator".into()),
                ..PostParams::default()
            },
            &machine("m1", &[]),
        )
        .await
        .unwrap();
    assert_eq!(managed(&created)[0].0, "creator");
    assert_eq!(managed(&created)[0].1, "Update");

    let patched = machines
        .patch(
            "m1",
            &PatchParams {
                field_manager: Some("labeller".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({ "metadata": { "labels": { "tier": "gold" } } })),
        )
        .await
        .unwrap();
    let labeller = managed(&patched)
        .into_iter()
        .find(|entry| entry.0 == "labeller")
        .expect("an entry for the patch's manager");
    assert_eq!(labeller.1, "Update");
    assert_eq!(
        labeller.3,
        json!({ "f:metadata": { "f:labels": { "f:tier": {} } } })
    );

    let config = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
        "metadata": { "name": "m1", "labels": { "tier": "silver" } },
    });
    let status = expect_status(
        machines
            .patch("m1", &PatchParams::apply("applier"), &Patch::Apply(&config))
            .await,
        409,
        "Conflict",
    );
    assert_eq!(
        status.message,
        "Apply failed with 1 conflict: conflict with \"labeller\" using machine.sapcloud.io/v1alpha1: .metadata.labels.tier"
    );
}

// Server-side apply docs: "fields that were previously applied ... but are no longer in the configuration are
// removed, unless another manager owns them"; set lists (metadata.finalizers) merge element by element.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_an_applier_stops_applying_go_unless_another_manager_owns_them() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    let config = |labels: Value, finalizers: Value| {
        json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": { "name": "m1", "labels": labels, "finalizers": finalizers },
            "spec": { "class": { "kind": "MachineClass", "name": "small" } },
        })
    };
    machines
        .patch(
            "m1",
            &PatchParams::apply("first"),
            &Patch::Apply(config(json!({ "a": "1", "b": "2" }), json!(["x/one"]))),
        )
        .await
        .unwrap();
    machines
        .patch(
            "m1",
            &PatchParams::apply("second"),
            &Patch::Apply(config(json!({ "b": "2" }), json!(["x/two"]))),
        )
        .await
        .unwrap();
    let both = machines.get("m1").await.unwrap();
    assert_eq!(both.finalizers(), ["x/one".to_owned(), "x/two".to_owned()]);

    let after = machines
        .patch(
            "m1",
            &PatchParams::apply("first"),
            &Patch::Apply(config(json!({}), json!([]))),
        )
        .await
        .unwrap();
    let labels: Vec<(&String, &String)> = after.labels().iter().collect();
    assert_eq!(
        labels,
        vec![(&"b".to_owned(), &"2".to_owned())],
        "a went, b is still owned by second"
    );
    assert_eq!(after.finalizers(), ["x/two".to_owned()]);
    assert_eq!(
        after.spec.class.name, "small",
        "the class is still applied by first (and second)"
    );
}

// The status subresource records its own entry (`subresource: status`); an apply to the main resource does not
// touch status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applies_to_the_status_subresource_have_their_own_entry() {
    let t = TestServer::start().await;
    let machines: Api<Machine> = t.api();
    machines
        .create(&PostParams::default(), &machine("m1", &[]))
        .await
        .unwrap();
    let config = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
        "metadata": { "name": "m1" },
        "status": { "currentStatus": { "phase": "Running" } },
    });
    let applied = machines
        .patch_status("m1", &PatchParams::apply("status-writer"), &Patch::Apply(&config))
        .await
        .unwrap();
    assert_eq!(applied.phase(), Some(mcm_api::MachinePhase::Running));
    let entry = managed(&applied)
        .into_iter()
        .find(|entry| entry.0 == "status-writer")
        .expect("the status writer's entry");
    assert_eq!(entry.1, "Apply");
    assert_eq!(entry.2.as_deref(), Some("status"));
    assert_eq!(
        entry.3,
        json!({ "f:status": { "f:currentStatus": { "f:phase": {} } } })
    );
}

// patch.go: `fieldManager: Required value: is required for apply patch` and `force: Forbidden: may not be
// specified for non-apply patch`, both 422 on PatchOptions.meta.k8s.io.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_needs_a_field_manager_and_force_is_only_for_apply() {
    let t = TestServer::start().await;
    let secrets: Api<Secret> = t.api();
    let status = expect_status(
        apply_secret(&secrets, &PatchParams::default(), &[("a", "1")]).await,
        422,
        "Invalid",
    );
    assert_eq!(
        status.message,
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
    );
    apply_secret(&secrets, &PatchParams::apply("first"), &[("a", "1")])
        .await
        .unwrap();
    // kube refuses to send it, so the request is made by hand.
    let request = http::Request::patch("/api/v1/namespaces/default/secrets/s?force=true")
        .header("content-type", "application/merge-patch+json")
        .body(br#"{"data":{}}"#.to_vec())
        .unwrap();
    let (code, status) = support::send_raw(&t.client, request).await;
    assert_eq!(code, 422);
    assert_eq!(
        status["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch"
    );
    let wrong_kind = json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "s" } });
    expect_status(
        secrets
            .patch("s", &PatchParams::apply("first"), &Patch::Apply(&wrong_kind))
            .await,
        400,
        "BadRequest",
    );
}

// fieldmanager.go: the managedFields a write sends are used when they decode and are not empty ("This is necessary
// to allow directly updating managed fields"); `[{}]` resets them. kubectl relies on it to move client-side apply
// ownership to its server-side apply manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_may_set_or_clear_managed_fields_itself() {
    let t = TestServer::start().await;
    let secrets: Api<Secret> = t.api();
    apply_secret(&secrets, &PatchParams::apply("first"), &[("a", "1")])
        .await
        .unwrap();
    let moved = json!({ "metadata": { "managedFields": [{
        "manager": "second", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1",
        "fieldsV1": { "f:data": { "f:a": {} } },
    }] } });
    let patched = secrets
        .patch("s", &PatchParams::default(), &Patch::Merge(&moved))
        .await
        .unwrap();
    assert_eq!(
        managed(&patched),
        vec![(
            "second".into(),
            "Apply".into(),
            None,
            json!({ "f:data": { "f:a": {} } })
        )]
    );
    // Now `second` may change the field without a conflict, and `first` may not.
    apply_secret(&secrets, &PatchParams::apply("second"), &[("a", "2")])
        .await
        .unwrap();
    expect_status(
        apply_secret(&secrets, &PatchParams::apply("first"), &[("a", "3")]).await,
        409,
        "Conflict",
    );
    let cleared = secrets
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "managedFields": [{}] } })),
        )
        .await
        .unwrap();
    assert!(cleared.managed_fields().is_empty());
}

// An apply with `dryRun=All` is answered as the real apply would be and stores nothing (`kubectl apply
// --server-side --dry-run=server`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_apply_answers_and_stores_nothing() {
    let t = TestServer::start().await;
    let secrets: Api<Secret> = t.api();
    let answered = apply_secret(&secrets, &PatchParams::apply("first").dry_run(), &[("a", "1")])
        .await
        .unwrap();
    assert_eq!(data_of(&answered), vec![("a".into(), "1".into())]);
    assert_eq!(managed(&answered)[0].0, "first");
    assert!(
        secrets.get_opt("s").await.unwrap().is_none(),
        "nothing was created"
    );

    let stored = apply_secret(&secrets, &PatchParams::apply("first"), &[("a", "1")])
        .await
        .unwrap();
    let conflict = apply_secret(&secrets, &PatchParams::apply("second").dry_run(), &[("a", "2")]).await;
    expect_status(conflict, 409, "Conflict");
    apply_secret(
        &secrets,
        &PatchParams::apply("second").dry_run().force(),
        &[("a", "2")],
    )
    .await
    .unwrap();
    let after = secrets.get("s").await.unwrap();
    assert_eq!(data_of(&after), vec![("a".into(), "1".into())]);
    assert_eq!(rv(&after), rv(&stored));
}
