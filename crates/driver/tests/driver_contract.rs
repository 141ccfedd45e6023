//! The Driver trait: optional calls default to Unimplemented (spec 000: "Else should return a UNIMPLEMENTED status
//! in error"), and requests never show secret values in their Debug output.

use std::collections::BTreeMap;

use async_trait::async_trait;
use futures::executor::block_on;
use k8s_openapi::{ByteString, api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use mcm_api::{MachineClass, builders::MachineBuilder};
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, DriverMethod, GenerateMachineClassForMigrationRequest, GetMachineStatusRequest,
    GetVolumeIdsRequest, InitializeMachineRequest, ListMachinesRequest, MachineCode,
};

/// A provider that implements only the REQUIRED calls.
struct MinimalProvider;

#[async_trait]
impl Driver for MinimalProvider {
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        let name = request.machine.metadata.name.clone().unwrap_or_default();
        Ok(CreateMachineResponse {
            provider_id: format!("min:///{name}"),
            node_name: name,
            ..Default::default()
        })
    }

    async fn delete_machine(&self, _: &DeleteMachineRequest) -> Result<DeleteMachineResponse, DriverError> {
        Ok(DeleteMachineResponse::default())
    }
}

fn secret() -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("cloud".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (
                "userData".to_owned(),
                ByteString(b"#!/bin/sh\necho TOPSECRET-USERDATA".to_vec()),
            ),
            ("password".to_owned(), ByteString(b"TOPSECRET-PASSWORD".to_vec())),
        ])),
        string_data: Some(BTreeMap::from([(
            "token".to_owned(),
            "TOPSECRET-TOKEN".to_owned(),
        )])),
        ..Default::default()
    }
}

#[test]
fn optional_calls_answer_unimplemented_naming_the_call() {
    let provider = MinimalProvider;
    let (machine, machine_class, secret) = (
        MachineBuilder::new("m1").build(),
        MachineClass::default(),
        secret(),
    );
    let initialize = InitializeMachineRequest {
        machine: machine.clone(),
        machine_class: machine_class.clone(),
        secret: secret.clone(),
    };
    let status = GetMachineStatusRequest {
        machine: machine.clone(),
        machine_class: machine_class.clone(),
        secret: secret.clone(),
    };
    let list = ListMachinesRequest {
        machine_class: machine_class.clone(),
        secret: secret.clone(),
    };
    let migrate = GenerateMachineClassForMigrationRequest {
        provider_specific_machine_class: serde_json::json!({ "kind": "AWSMachineClass" }),
        machine_class: machine_class.clone(),
        class_spec: mcm_api::ClassSpec::default(),
    };
    let results = [
        (
            DriverMethod::InitializeMachine,
            block_on(provider.initialize_machine(&initialize)).err(),
        ),
        (
            DriverMethod::GetMachineStatus,
            block_on(provider.get_machine_status(&status)).err(),
        ),
        (
            DriverMethod::ListMachines,
            block_on(provider.list_machines(&list)).err(),
        ),
        (
            DriverMethod::GetVolumeIds,
            block_on(provider.get_volume_ids(&GetVolumeIdsRequest::default())).err(),
        ),
        (
            DriverMethod::GenerateMachineClassForMigration,
            block_on(provider.generate_machine_class_for_migration(&migrate)).err(),
        ),
    ];
    for (method, err) in results {
        let err = err.unwrap_or_else(|| panic!("{} should fail", method.name()));
        assert_eq!(err.code, MachineCode::Unimplemented, "{}", method.name());
        assert!(
            err.message.contains(method.name()),
            "the message names the call: {}",
            err.message
        );
        assert!(!method.is_required());
    }
    let created = block_on(provider.create_machine(&CreateMachineRequest {
        machine,
        machine_class,
        secret,
    }))
    .unwrap();
    assert_eq!(created.provider_id, "min:///m1");
}

#[test]
fn request_debug_output_names_the_secret_but_never_its_values() {
    let request = CreateMachineRequest {
        machine: MachineBuilder::new("m1").build(),
        machine_class: MachineClass::default(),
        secret: secret(),
    };
    let shown = format!("{request:?} {request:#?}");
    assert!(
        shown.contains("cloud") && shown.contains("userData") && shown.contains("password"),
        "{shown}"
    );
    assert!(!shown.contains("TOPSECRET"), "a secret value leaked: {shown}");
    let list = ListMachinesRequest {
        machine_class: MachineClass::default(),
        secret: secret(),
    };
    assert!(!format!("{list:?}").contains("TOPSECRET"));
}

#[test]
fn errors_carry_code_and_message_as_data() {
    let err = DriverError::new(MachineCode::ResourceExhausted, "quota of 10 VMs reached");
    assert_eq!(err.code, MachineCode::ResourceExhausted);
    assert_eq!(err.to_string(), "ResourceExhausted (8): quota of 10 VMs reached");
}
