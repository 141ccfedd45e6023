//! The rules of spec 000 for each call, one test each, named for the rule.

use std::collections::BTreeMap;

use k8s_openapi::{
    ByteString,
    api::core::v1::{CSIPersistentVolumeSource, HostPathVolumeSource, PersistentVolumeSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use mcm_api::builders::{MachineBuilder, MachineClassBuilder};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::*;
use crate::{Fault, Target, sizes};

const USER_DATA: &str = "#!/bin/sh\necho TOPSECRET-USERDATA";

fn example_spec() -> Value {
    json!({
        "vmPool": "test-worker-pool",
        "size": "small",
        "rootFsSize": 10,
        "tags": { "kubernetes.io/cluster/demo": "1", "kubernetes.io/role/node": "1" },
    })
}

fn class_with(name: &str, provider_spec: Value) -> MachineClass {
    MachineClassBuilder::new(name)
        .namespace("default")
        .provider("sim")
        .provider_spec(provider_spec)
        .build()
}

fn class() -> MachineClass {
    class_with("sim-small", example_spec())
}

/// A class of another cluster (other tags).
fn other_cluster_class() -> MachineClass {
    let mut spec = example_spec();
    spec["tags"] = json!({ "kubernetes.io/cluster/other": "1", "kubernetes.io/role/node": "1" });
    class_with("other", spec)
}

fn secret() -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("sim-worker".into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            ("userData".to_owned(), ByteString(USER_DATA.as_bytes().to_vec())),
            ("password".to_owned(), ByteString(b"TOPSECRET-PASSWORD".to_vec())),
        ])),
        ..Secret::default()
    }
}

fn create(name: &str, class: &MachineClass) -> CreateMachineRequest {
    CreateMachineRequest {
        machine: MachineBuilder::new(name).namespace("default").build(),
        machine_class: class.clone(),
        secret: secret(),
    }
}

fn delete(name: &str, class: &MachineClass) -> DeleteMachineRequest {
    DeleteMachineRequest {
        machine: MachineBuilder::new(name).namespace("default").build(),
        machine_class: class.clone(),
        secret: secret(),
    }
}

fn status(name: &str, class: &MachineClass) -> GetMachineStatusRequest {
    GetMachineStatusRequest {
        machine: MachineBuilder::new(name).namespace("default").build(),
        machine_class: class.clone(),
        secret: secret(),
    }
}

fn initialize(name: &str, class: &MachineClass) -> InitializeMachineRequest {
    InitializeMachineRequest {
        machine: MachineBuilder::new(name).namespace("default").build(),
        machine_class: class.clone(),
        secret: secret(),
    }
}

fn list(class: &MachineClass) -> ListMachinesRequest {
    ListMachinesRequest {
        machine_class: class.clone(),
        secret: secret(),
    }
}

#[tokio::test]
async fn create_machine_answers_provider_id_sim_namespace_name_and_the_machine_name_as_node_name() {
    let driver = SimDriver::default();
    let created = driver.create_machine(&create("m1", &class())).await.unwrap();
    assert_eq!(created.provider_id, "sim:///default/m1");
    assert_eq!(created.node_name, "m1");
    assert_eq!(created.addresses.len(), 2);
    assert_eq!(created.addresses[0].type_, "InternalIP");
    assert_eq!(created.addresses[1].address, "m1");
}

#[tokio::test]
async fn create_machine_records_machine_name_tags_provider_spec_user_data_and_creation_time() {
    let driver = SimDriver::default();
    let before = jiff::Timestamp::now();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    let vms = driver.vms();
    assert_eq!(vms.len(), 1);
    let vm = &vms[0];
    assert_eq!(vm.machine_name, "m1");
    assert_eq!(vm.namespace, "default");
    assert_eq!(vm.class_name, "sim-small");
    assert_eq!(
        vm.tags,
        BTreeMap::from([
            ("kubernetes.io/cluster/demo".to_owned(), "1".to_owned()),
            ("kubernetes.io/role/node".to_owned(), "1".to_owned()),
        ])
    );
    assert_eq!(vm.provider_spec.size, sizes::SMALL);
    assert_eq!(vm.provider_spec.vm_pool, "test-worker-pool");
    assert_eq!(vm.provider_spec.root_fs_size, Some(10));
    assert_eq!(vm.user_data.as_bytes(), USER_DATA.as_bytes());
    assert!(vm.created_at >= before && vm.created_at <= jiff::Timestamp::now());
}

#[tokio::test]
async fn create_machine_of_an_existing_compatible_vm_must_reply_ok_with_the_same_provider_id_and_node_name() {
    // Spec 000: "If VM backing the `Machine.Name` already exists, and is compatible with the specified `Machine`
    // object in the `CreateMachineRequest`, the Provider MUST reply `0 OK`"; "This operation SHOULD be idempotent."
    let driver = SimDriver::default();
    let first = driver.create_machine(&create("m1", &class())).await.unwrap();
    let again = driver.create_machine(&create("m1", &class())).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(driver.vms().len(), 1, "no second VM");
}

#[tokio::test]
async fn create_machine_of_an_existing_vm_with_other_parameters_answers_already_exists() {
    // Spec 000, CreateMachine errors: "6 ALREADY_EXISTS | Already exists but desired parameters doesn't match".
    let driver = SimDriver::default();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    let mut spec = example_spec();
    spec["size"] = json!("medium");
    let err = driver
        .create_machine(&create("m1", &class_with("sim-medium", spec)))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::AlreadyExists);
    assert!(err.message.contains("size"), "{}", err.message);
    assert!(err.message.contains("sim:///default/m1"), "{}", err.message);
    assert_eq!(driver.vms().len(), 1);
}

#[tokio::test]
async fn create_machine_with_an_empty_machine_name_answers_invalid_argument() {
    let driver = SimDriver::default();
    let err = driver.create_machine(&create("", &class())).await.unwrap_err();
    assert_eq!(err.code, MachineCode::InvalidArgument);
    assert_eq!(err.message, "machine.metadata.name: must not be empty");
}

#[tokio::test]
async fn create_machine_with_an_unknown_size_answers_invalid_argument_naming_the_field() {
    let driver = SimDriver::default();
    let mut spec = example_spec();
    spec["size"] = json!("huge");
    let err = driver
        .create_machine(&create("m1", &class_with("c", spec)))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::InvalidArgument);
    assert_eq!(
        err.message,
        r#"providerSpec.size: unknown size "huge" (known: xsmall, small, medium, large)"#
    );
    assert!(driver.vms().is_empty());
}

#[tokio::test]
async fn create_machine_with_a_root_fs_size_out_of_range_answers_out_of_range() {
    // Spec 000, CreateMachine errors: "11 OUT_OF_RANGE | [...] of FS size in ProviderSpec falls outside of the
    // corresponding valid range".
    let driver = SimDriver::default();
    let mut spec = example_spec();
    spec["rootFsSize"] = json!(0);
    let err = driver
        .create_machine(&create("m1", &class_with("c", spec)))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::OutOfRange);
    assert!(
        err.message.starts_with("providerSpec.rootFsSize: "),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn the_provider_spec_is_validated_by_every_method_that_receives_it() {
    // Spec 000: "The `ProviderSpec` is validated by methods that receive it as a request field for presence of all
    // mandatory parameters and tags, and for validity of all parameters."
    let driver = SimDriver::default();
    let invalid = class_with(
        "bad",
        json!({ "vmPool": "p", "size": "small", "tags": { "a": "b" }, "image": "ubuntu" }),
    );
    let expected = "providerSpec.image: unknown field (known: vmPool, size, rootFsSize, tags)";
    let errors = [
        driver.create_machine(&create("m1", &invalid)).await.unwrap_err(),
        driver
            .initialize_machine(&initialize("m1", &invalid))
            .await
            .unwrap_err(),
        driver.delete_machine(&delete("m1", &invalid)).await.unwrap_err(),
        driver
            .get_machine_status(&status("m1", &invalid))
            .await
            .unwrap_err(),
        driver.list_machines(&list(&invalid)).await.unwrap_err(),
    ];
    for err in errors {
        assert_eq!(err.code, MachineCode::InvalidArgument);
        assert_eq!(err.message, expected);
    }
    let not_an_object = class_with("bad", json!(["small"]));
    let err = driver.list_machines(&list(&not_an_object)).await.unwrap_err();
    assert_eq!(err.code, MachineCode::InvalidArgument);
    assert_eq!(
        err.message,
        "providerSpec: must be an object with vmPool, size and tags, got an array"
    );
    let missing = class_with("bad", json!({ "size": "small" }));
    let err = driver.create_machine(&create("m1", &missing)).await.unwrap_err();
    assert_eq!(
        err.message,
        "providerSpec.vmPool: required (the VM pool name, a string); providerSpec.tags: required (a map of strings)"
    );
    let wrong_types = class_with(
        "bad",
        json!({ "vmPool": "p", "size": "small", "rootFsSize": "10", "tags": { "a": 1 } }),
    );
    let err = driver
        .create_machine(&create("m1", &wrong_types))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::InvalidArgument);
    assert_eq!(
        err.message,
        "providerSpec.rootFsSize: must be an integer (the root filesystem size in GB), got a string; \
         providerSpec.tags[\"a\"]: must be a string, got a number"
    );
}

#[tokio::test]
async fn no_message_and_no_debug_output_shows_a_secret_value() {
    // Spec 000: "Providers SHOULD NOT write potentially sensitive data to logs (e.g. secrets)."
    let driver = SimDriver::default();
    let faults = driver.faults();
    let mut shown = Vec::new();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    shown.push(format!("{:?} {:#?} {driver:?}", driver.vms(), driver.vms()));
    let mut other = example_spec();
    other["size"] = json!("large");
    shown.push(
        driver
            .create_machine(&create("m1", &class_with("c", other)))
            .await
            .unwrap_err()
            .to_string(),
    );
    shown.push(
        driver
            .create_machine(&create("m2", &class_with("c", json!({ "size": "huge" }))))
            .await
            .unwrap_err()
            .to_string(),
    );
    faults.fail(DriverMethod::CreateMachine, MachineCode::Unavailable, Target::All);
    shown.push(
        driver
            .create_machine(&create("m3", &class()))
            .await
            .unwrap_err()
            .to_string(),
    );
    let shown = shown.join("\n");
    assert!(shown.contains("UserData(<"), "{shown}");
    assert!(!shown.contains("TOPSECRET"), "a secret value leaked: {shown}");
}

#[tokio::test]
async fn delete_machine_of_a_missing_vm_must_reply_ok() {
    // Spec 000: "If a VM corresponding to the specified machine-object's name does not exist or the artifacts
    // associated with the VM do not exist anymore (after deletion), the Provider MUST reply `0 OK`."
    let driver = SimDriver::default();
    assert_eq!(
        driver.delete_machine(&delete("never", &class())).await,
        Ok(DeleteMachineResponse::default())
    );
}

#[tokio::test]
async fn delete_machine_deletes_the_vm_and_is_idempotent() {
    // Spec 000: "This operation SHOULD be idempotent."
    let driver = SimDriver::default();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    driver.create_machine(&create("m2", &class())).await.unwrap();
    driver.delete_machine(&delete("m1", &class())).await.unwrap();
    driver.delete_machine(&delete("m1", &class())).await.unwrap();
    let names: Vec<String> = driver.vms().into_iter().map(|vm| vm.machine_name).collect();
    assert_eq!(names, ["m2"]);
}

#[tokio::test]
async fn delete_machine_shall_only_act_on_vms_carrying_the_class_tags() {
    // Spec 000: "The provider SHALL only act on machines belonging to the cluster-id/cluster-name obtained from the
    // `ProviderSpec`."
    let driver = SimDriver::default();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    driver
        .delete_machine(&delete("m1", &other_cluster_class()))
        .await
        .unwrap();
    assert_eq!(driver.vms().len(), 1, "the VM of another cluster stays");
}

#[tokio::test]
async fn delete_machine_deletes_every_vm_of_the_machine_duplicates_included() {
    let driver = SimDriver::default();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    driver.faults().duplicate("m1").unwrap();
    driver.delete_machine(&delete("m1", &class())).await.unwrap();
    assert!(driver.vms().is_empty());
}

#[tokio::test]
async fn get_machine_status_of_an_existing_vm_answers_its_provider_id_node_name_and_addresses() {
    // Spec 000: "If a VM corresponding to the specified machine object's `Machine.Name` exists on provider the
    // `GetMachineStatusResponse` fields are to be filled similar to the `CreateMachineResponse`."
    let driver = SimDriver::default();
    let created = driver.create_machine(&create("m1", &class())).await.unwrap();
    driver
        .initialize_machine(&initialize("m1", &class()))
        .await
        .unwrap();
    let found = driver.get_machine_status(&status("m1", &class())).await.unwrap();
    assert_eq!(found.provider_id, created.provider_id);
    assert_eq!(found.node_name, created.node_name);
    assert_eq!(found.addresses, created.addresses);
}

#[tokio::test]
async fn get_machine_status_of_a_missing_vm_answers_not_found() {
    // Spec 000, GetMachineStatus errors: "5 NOT_FOUND | Machine isn't found at provider".
    let driver = SimDriver::default();
    let err = driver
        .get_machine_status(&status("m1", &class()))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::NotFound);
    assert!(err.message.contains("default/m1"), "{}", err.message);
}

#[tokio::test]
async fn get_machine_status_shall_only_act_on_vms_carrying_the_class_tags() {
    // Spec 000: "The provider SHALL only act on machines belonging to the cluster-id/cluster-name obtained from the
    // `ProviderSpec`."
    let driver = SimDriver::default();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    let err = driver
        .get_machine_status(&status("m1", &other_cluster_class()))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::NotFound);
}

#[tokio::test]
async fn get_machine_status_of_several_vms_for_one_machine_answers_out_of_range() {
    // Spec 000, GetMachineStatus errors: "11 OUT_OF_RANGE | Multiple VMs found | Multiple VMs found with matching
    // machine object names".
    let driver = SimDriver::default();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    let copy = driver.faults().duplicate("m1").unwrap();
    assert_eq!(copy, "sim:///default/m1/2");
    let err = driver
        .get_machine_status(&status("m1", &class()))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::OutOfRange);
    assert_eq!(
        err.message,
        "2 VMs found for machine default/m1: sim:///default/m1, sim:///default/m1/2"
    );
    assert_eq!(driver.faults().duplicate("nobody"), None);
}

#[tokio::test]
async fn list_machines_returns_only_vms_carrying_the_class_tags() {
    // Spec 000: "The Provider SHALL return the information about all the machines associated with the
    // `MachineClass`", as provider ID to machine name.
    let driver = SimDriver::default();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    driver.create_machine(&create("m2", &class())).await.unwrap();
    driver
        .create_machine(&create("x1", &other_cluster_class()))
        .await
        .unwrap();
    driver.faults().duplicate("m2").unwrap();
    let listed = driver.list_machines(&list(&class())).await.unwrap();
    assert_eq!(
        listed.machine_list,
        BTreeMap::from([
            ("sim:///default/m1".to_owned(), "m1".to_owned()),
            ("sim:///default/m2".to_owned(), "m2".to_owned()),
            ("sim:///default/m2/2".to_owned(), "m2".to_owned()),
        ])
    );
    let other = driver.list_machines(&list(&other_cluster_class())).await.unwrap();
    assert_eq!(other.machine_list.into_values().collect::<Vec<_>>(), ["x1"]);
}

#[tokio::test]
async fn initialize_machine_answers_ok_with_the_vm() {
    let driver = SimDriver::default();
    let created = driver.create_machine(&create("m1", &class())).await.unwrap();
    let initialized = driver
        .initialize_machine(&initialize("m1", &class()))
        .await
        .unwrap();
    assert_eq!(initialized.provider_id, created.provider_id);
    assert_eq!(initialized.node_name, created.node_name);
    assert_eq!(initialized.addresses, created.addresses);
}

#[tokio::test]
async fn initialize_machine_of_a_missing_vm_answers_not_found() {
    // Spec 002 section 11, InitializeMachine errors: "5 NOT_FOUND | [...] VM Instance for Machine isn't found at
    // provider".
    let driver = SimDriver::default();
    let err = driver
        .initialize_machine(&initialize("m1", &class()))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::NotFound);
}

#[tokio::test]
async fn initialize_machine_answers_uninitialized_through_its_fault_hook() {
    // Spec 002 section 11: "17 UNINITIALIZED | Failed Initialization | VM Instance could not be initializaed".
    let driver = SimDriver::default();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    let fault = driver
        .faults()
        .inject(Fault::new(DriverMethod::InitializeMachine, MachineCode::Uninitialized).times(1));
    let err = driver
        .initialize_machine(&initialize("m1", &class()))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::Uninitialized);
    assert_eq!(
        err.message,
        "injected fault: InitializeMachine answers Uninitialized (machine m1)"
    );
    assert_eq!(driver.faults().fired(fault), 1);
    driver
        .initialize_machine(&initialize("m1", &class()))
        .await
        .expect("the next attempt succeeds");
}

#[tokio::test]
async fn get_machine_status_answers_uninitialized_until_initialize_machine_succeeds() {
    // Spec 002 section 11: "If the instance associated with machine exists, but the instance was not initialized as
    // expected, the provider implementations of GetMachineStatus should return an error:
    // status.Error(codes.Initialization)".
    let driver = SimDriver::default();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    // A new VM is not initialized: the sim has something to initialise.
    let err = driver
        .get_machine_status(&status("m1", &class()))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::Uninitialized);
    assert_eq!(driver.uninitialized_machines(), ["m1"]);
    driver
        .faults()
        .inject(Fault::new(DriverMethod::InitializeMachine, MachineCode::Uninitialized).times(1));
    driver
        .initialize_machine(&initialize("m1", &class()))
        .await
        .unwrap_err();
    let err = driver
        .get_machine_status(&status("m1", &class()))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::Uninitialized);
    assert_eq!(
        err.message,
        "VM sim:///default/m1 of machine default/m1 exists but is not initialized"
    );
    driver
        .initialize_machine(&initialize("m1", &class()))
        .await
        .expect("the next attempt succeeds");
    driver
        .get_machine_status(&status("m1", &class()))
        .await
        .expect("an initialized VM is found");
    assert!(driver.uninitialized_machines().is_empty());
}

#[tokio::test]
async fn call_times_records_when_each_call_of_a_machine_arrived() {
    let driver = SimDriver::default();
    let faults = driver.faults();
    driver
        .get_machine_status(&status("m1", &class()))
        .await
        .unwrap_err();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    let times = faults.call_times(DriverMethod::CreateMachine, "m1");
    assert_eq!(times.len(), 2);
    assert!(times[0] <= times[1]);
    assert_eq!(faults.call_times(DriverMethod::GetMachineStatus, "m1").len(), 1);
    assert!(faults.call_times(DriverMethod::CreateMachine, "m2").is_empty());
    faults.reset_calls();
    assert!(faults.call_times(DriverMethod::CreateMachine, "m1").is_empty());
}

fn csi(driver: &str, handle: &str) -> PersistentVolumeSpec {
    PersistentVolumeSpec {
        csi: Some(CSIPersistentVolumeSource {
            driver: driver.into(),
            volume_handle: handle.into(),
            ..CSIPersistentVolumeSource::default()
        }),
        ..PersistentVolumeSpec::default()
    }
}

#[tokio::test]
async fn get_volume_ids_returns_the_handles_of_sim_csi_volumes_and_ignores_others() {
    // Spec 000: "If for any `PV` the Provider wasn't able to identify the `Volume-ID`, the provider MAY chose to
    // ignore it and return the `Volume-IDs` for the rest of the `PVs`".
    let driver = SimDriver::default();
    let request = GetVolumeIdsRequest {
        pv_specs: vec![
            csi(CSI_DRIVER, "vol-1"),
            csi("ebs.csi.aws.com", "vol-aws"),
            PersistentVolumeSpec {
                host_path: Some(HostPathVolumeSource {
                    path: "/data".into(),
                    ..HostPathVolumeSource::default()
                }),
                ..PersistentVolumeSpec::default()
            },
            csi(CSI_DRIVER, ""),
            csi(CSI_DRIVER, "vol-2"),
        ],
    };
    let ids = driver.get_volume_ids(&request).await.unwrap();
    assert_eq!(ids.volume_ids, ["vol-1", "vol-2"]);
}

#[tokio::test]
async fn get_volume_ids_must_be_idempotent() {
    // Spec 000, GetVolumeIDs: "This operation MUST be idempotent."
    let driver = SimDriver::default();
    let request = GetVolumeIdsRequest {
        pv_specs: vec![csi(CSI_DRIVER, "vol-1")],
    };
    let first = driver.get_volume_ids(&request).await.unwrap();
    assert_eq!(driver.get_volume_ids(&request).await.unwrap(), first);
}

#[tokio::test]
async fn migration_of_a_kind_it_does_not_know_must_return_unimplemented() {
    // Spec 000: "A Provider SHOULD implement this driver call, else it MUST return a `UNIMPLEMENTED` status in
    // error."
    let driver = SimDriver::default();
    let err = driver
        .generate_machine_class_for_migration(&GenerateMachineClassForMigrationRequest {
            provider_specific_machine_class: json!({ "kind": "AWSMachineClass", "spec": {} }),
            machine_class: MachineClass::default(),
            class_spec: mcm_api::ClassSpec {
                kind: "AWSMachineClass".into(),
                name: "old".into(),
                ..mcm_api::ClassSpec::default()
            },
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::Unimplemented);
    assert!(err.message.contains("AWSMachineClass"), "{}", err.message);
}

#[tokio::test]
async fn a_sim_machine_class_is_migrated_into_the_passed_machine_class() {
    // Spec 000: "The provider is expected to fill in this `MachineClass` object based on the conversions", and
    // "This operation MUST be idempotent."
    let driver = SimDriver::default();
    let mut skeleton = MachineClass::default();
    skeleton.metadata.name = Some("old".into());
    let request = GenerateMachineClassForMigrationRequest {
        provider_specific_machine_class: json!({
            "kind": "SimMachineClass",
            "metadata": { "name": "old" },
            "spec": { "vmPool": "p", "size": "small", "tags": { "a": "b" }, "secretRef": { "name": "s" } }
        }),
        machine_class: skeleton,
        class_spec: mcm_api::ClassSpec {
            kind: "SimMachineClass".into(),
            name: "old".into(),
            ..mcm_api::ClassSpec::default()
        },
    };
    let first = driver
        .generate_machine_class_for_migration(&request)
        .await
        .unwrap();
    let class = &first.machine_class;
    assert_eq!(class.metadata.name.as_deref(), Some("old"));
    assert_eq!(class.provider, "sim");
    assert_eq!(
        class.provider_spec,
        json!({ "vmPool": "p", "size": "small", "tags": { "a": "b" } })
    );
    assert_eq!(
        class.secret_ref.as_ref().and_then(|r| r.name.as_deref()),
        Some("s")
    );
    assert_eq!(
        driver
            .generate_machine_class_for_migration(&request)
            .await
            .unwrap(),
        first
    );
}

#[tokio::test]
async fn a_configured_latency_delays_each_call_of_its_method() {
    let driver = SimDriver::new(SimConfig {
        latency: Latency::Fixed(Duration::from_millis(30)),
        method_latency: BTreeMap::from([(
            DriverMethod::CreateMachine,
            Latency::Range {
                min: Duration::from_millis(80),
                max: Duration::from_millis(100),
            },
        )]),
        seed: 1,
    });
    let started = Instant::now();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(80),
        "{:?}",
        started.elapsed()
    );
    let started = Instant::now();
    driver.list_machines(&list(&class())).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(30),
        "{:?}",
        started.elapsed()
    );
    driver
        .faults()
        .set_latency(DriverMethod::ListMachines, Latency::None);
    driver.faults().set_default_latency(Latency::None);
    let started = Instant::now();
    driver.list_machines(&list(&class())).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(30),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_fault_for_all_calls_fails_every_call_without_acting_until_cleared() {
    let driver = SimDriver::default();
    let faults = driver.faults();
    faults.fail(
        DriverMethod::CreateMachine,
        MachineCode::ResourceExhausted,
        Target::All,
    );
    for name in ["m1", "m2"] {
        let err = driver.create_machine(&create(name, &class())).await.unwrap_err();
        assert_eq!(err.code, MachineCode::ResourceExhausted);
    }
    assert!(driver.vms().is_empty(), "a failed call does not act");
    driver
        .list_machines(&list(&class()))
        .await
        .expect("other methods work");
    faults.clear();
    driver.create_machine(&create("m1", &class())).await.unwrap();
}

#[tokio::test]
async fn a_fault_for_a_share_fails_n_of_every_of_calls() {
    let driver = SimDriver::default();
    driver.faults().fail(
        DriverMethod::ListMachines,
        MachineCode::Unavailable,
        Target::share(1, 2),
    );
    let mut outcome = String::new();
    for _ in 0..6 {
        outcome.push(if driver.list_machines(&list(&class())).await.is_ok() {
            '.'
        } else {
            'x'
        });
    }
    assert_eq!(outcome, ".x.x.x");
}

#[tokio::test]
async fn a_fault_for_a_random_share_fails_the_same_calls_for_the_same_seed() {
    async fn outcome(seed: u64) -> String {
        let driver = SimDriver::new(SimConfig {
            seed,
            ..SimConfig::default()
        });
        driver.faults().fail(
            DriverMethod::ListMachines,
            MachineCode::Unknown,
            Target::Random(0.5),
        );
        let mut outcome = String::new();
        for _ in 0..32 {
            outcome.push(if driver.list_machines(&list(&class())).await.is_ok() {
                '.'
            } else {
                'x'
            });
        }
        outcome
    }
    assert_eq!(outcome(42).await, outcome(42).await);
    assert_ne!(outcome(42).await, outcome(43).await);
}

#[tokio::test]
async fn a_fault_for_named_machines_fails_only_their_calls() {
    let driver = SimDriver::default();
    let faults = driver.faults();
    faults.fail(
        DriverMethod::CreateMachine,
        MachineCode::Unavailable,
        Target::machines(["m2"]),
    );
    driver.create_machine(&create("m1", &class())).await.unwrap();
    let err = driver.create_machine(&create("m2", &class())).await.unwrap_err();
    assert_eq!(err.code, MachineCode::Unavailable);
    assert_eq!(
        err.message,
        "injected fault: CreateMachine answers Unavailable (machine m2)"
    );
}

#[tokio::test]
async fn a_fault_with_a_limit_fires_that_often_then_goes_inert_and_can_be_removed() {
    let driver = SimDriver::default();
    let faults = driver.faults();
    let id = faults.inject(
        Fault::new(DriverMethod::DeleteMachine, MachineCode::Aborted)
            .times(2)
            .message("busy"),
    );
    for _ in 0..2 {
        let err = driver.delete_machine(&delete("m1", &class())).await.unwrap_err();
        assert_eq!((err.code, err.message.as_str()), (MachineCode::Aborted, "busy"));
    }
    driver.delete_machine(&delete("m1", &class())).await.unwrap();
    assert_eq!(faults.fired(id), 2);
    assert!(faults.remove(id));
    assert!(!faults.remove(id));
}

#[tokio::test]
async fn a_fault_after_effect_acts_then_answers_the_code() {
    // A response lost on the way back: the VM exists although CreateMachine failed, and the next CreateMachine
    // adopts it (idempotency).
    let driver = SimDriver::default();
    driver.faults().inject(
        Fault::new(DriverMethod::CreateMachine, MachineCode::DeadlineExceeded)
            .times(1)
            .after_effect(),
    );
    let err = driver.create_machine(&create("m1", &class())).await.unwrap_err();
    assert_eq!(err.code, MachineCode::DeadlineExceeded);
    assert_eq!(driver.vms().len(), 1);
    let created = driver.create_machine(&create("m1", &class())).await.unwrap();
    assert_eq!(created.provider_id, "sim:///default/m1");
    assert_eq!(driver.vms().len(), 1);
}

#[tokio::test]
async fn calls_are_counted_per_method_and_per_machine_failed_ones_included() {
    let driver = SimDriver::default();
    let faults = driver.faults();
    faults.fail(
        DriverMethod::GetMachineStatus,
        MachineCode::Internal,
        Target::machines(["m2"]),
    );
    driver.create_machine(&create("m1", &class())).await.unwrap();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    driver.create_machine(&create("m2", &class())).await.unwrap();
    driver
        .get_machine_status(&status("m2", &class()))
        .await
        .unwrap_err();
    driver.list_machines(&list(&class())).await.unwrap();
    assert_eq!(faults.calls(DriverMethod::CreateMachine), 3);
    assert_eq!(faults.calls_for(DriverMethod::CreateMachine, "m1"), 2);
    assert_eq!(faults.calls_for(DriverMethod::CreateMachine, "m2"), 1);
    assert_eq!(faults.calls(DriverMethod::GetMachineStatus), 1);
    assert_eq!(faults.calls_for(DriverMethod::GetMachineStatus, "m2"), 1);
    assert_eq!(faults.calls(DriverMethod::ListMachines), 1);
    assert_eq!(faults.calls(DriverMethod::DeleteMachine), 0);
    faults.reset_calls();
    assert_eq!(faults.calls(DriverMethod::CreateMachine), 0);
    assert_eq!(faults.calls_for(DriverMethod::CreateMachine, "m1"), 0);
}

#[tokio::test]
async fn a_vanished_vm_is_gone_from_the_provider() {
    let driver = SimDriver::default();
    driver.create_machine(&create("m1", &class())).await.unwrap();
    driver.create_machine(&create("m2", &class())).await.unwrap();
    assert_eq!(driver.faults().vanish("m1"), 1);
    assert_eq!(driver.faults().vanish("m1"), 0);
    let err = driver
        .get_machine_status(&status("m1", &class()))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::NotFound);
    let listed = driver.list_machines(&list(&class())).await.unwrap();
    assert_eq!(listed.machine_list.into_values().collect::<Vec<_>>(), ["m2"]);
    // CreateMachine makes a new VM for it.
    driver.create_machine(&create("m1", &class())).await.unwrap();
    assert_eq!(driver.vms().len(), 2);
}

#[tokio::test]
async fn every_vm_gets_its_own_internal_ip() {
    let driver = SimDriver::default();
    for name in ["a", "b", "c"] {
        driver.create_machine(&create(name, &class())).await.unwrap();
    }
    let ips: Vec<String> = driver.vms().into_iter().map(|vm| vm.internal_ip).collect();
    assert_eq!(ips, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
}
