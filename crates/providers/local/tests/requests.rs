//! Validation of requests (providerSpec, secret, names), the example manifests, the optional calls, and errors that
//! never carry userData.

mod support;

use std::{collections::BTreeMap, os::unix::fs::PermissionsExt as _};

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec, Secret};
use mcm_api::{ClassSpec, MachineClass};
use mcm_driver::{
    Driver as _, DriverMethod, GenerateMachineClassForMigrationRequest, GetVolumeIdsRequest,
    InitializeMachineRequest, MachineCode,
};
use mcm_provider_local::{LocalConfig, LocalDriver, LocalError, optional_methods, size_resources};
use pretty_assertions::assert_eq;
use serde_json::json;
use support::{
    BOOT, Env, class, class_with, create, create_with, delete_with, list, machine, secret, status_with,
};

const SECRET_WORD: &str = "s3cr3t-bootstrap-token";

#[tokio::test]
async fn invalid_provider_specs_name_their_fields_in_every_call() {
    let env = Env::new();
    let cases = [
        (
            json!({ "vmPool": "p", "size": "huge", "tags": { "a": "b" } }),
            "providerSpec.size: unknown size \"huge\" (xsmall, small, medium, large)",
        ),
        (
            json!({ "vmPool": "p", "size": "small", "tags": { "a": "b" }, "colour": "red" }),
            "providerSpec.colour: unknown field",
        ),
        (
            json!({ "size": "small", "tags": { "a": "b" } }),
            "providerSpec.vmPool: required",
        ),
        (
            json!({ "vmPool": "p", "tags": { "a": "b" } }),
            "providerSpec.size: required",
        ),
        (
            json!({ "vmPool": "p", "size": "small" }),
            "providerSpec.tags: required",
        ),
        (
            json!({ "vmPool": "p", "size": "small", "tags": {} }),
            "providerSpec.tags: must not be empty",
        ),
        (
            json!({ "vmPool": 7, "size": "small", "tags": { "a": "b" } }),
            "providerSpec.vmPool: must be a string",
        ),
        (
            json!({ "vmPool": "p", "size": "small", "rootFsSize": "10", "tags": { "a": "b" } }),
            "providerSpec.rootFsSize: must be an integer",
        ),
        (
            json!({ "vmPool": "p", "size": "small", "tags": { "a": 1 } }),
            "providerSpec.tags[\"a\"]: must be a string",
        ),
        (json!(null), "providerSpec: must be an object"),
    ];
    for (spec, expected) in cases {
        let class = class_with(spec.clone());
        let secret = secret(&format!("#!/bin/sh\necho {SECRET_WORD}\n"));
        let errors = [
            env.driver
                .create_machine(&mcm_driver::CreateMachineRequest {
                    machine: machine("m-1"),
                    machine_class: class.clone(),
                    secret,
                })
                .await
                .unwrap_err(),
            env.driver
                .delete_machine(&delete_with("m-1", class.clone()))
                .await
                .unwrap_err(),
            env.driver
                .get_machine_status(&status_with("m-1", class.clone()))
                .await
                .unwrap_err(),
            env.driver.list_machines(&list(class)).await.unwrap_err(),
        ];
        for err in errors {
            assert_eq!(err.code, MachineCode::InvalidArgument, "{spec}: {err}");
            assert!(
                err.message.contains(expected),
                "{spec}: {:?} names {expected:?}",
                err.message
            );
            assert!(!err.message.contains(SECRET_WORD));
        }
    }
    assert!(env.driver.machines().unwrap().is_empty(), "no machine was made");
}

#[tokio::test]
async fn a_root_fs_size_below_one_is_out_of_range_for_create_machine() {
    let env = Env::new();
    let class = class_with(json!({ "vmPool": "p", "size": "small", "rootFsSize": 0, "tags": { "a": "b" } }));
    let err = env
        .driver
        .create_machine(&create_with("m-1", class.clone(), BOOT))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::OutOfRange, "{err}");
    assert!(err.message.contains("providerSpec.rootFsSize"), "{err}");
    let err = env
        .driver
        .get_machine_status(&status_with("m-1", class))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::InvalidArgument, "{err}");
}

#[tokio::test]
async fn user_data_is_required_and_may_come_from_string_data() {
    let env = Env::new();
    let mut request = create("m-1", BOOT);
    request.secret.data = None;
    let err = env.driver.create_machine(&request).await.unwrap_err();
    assert_eq!(err.code, MachineCode::InvalidArgument);
    assert!(err.message.contains("secret.data.userData"), "{err}");

    request.secret.data = Some(BTreeMap::from([(
        "userData".to_owned(),
        k8s_openapi::ByteString(Vec::new()),
    )]));
    let err = env.driver.create_machine(&request).await.unwrap_err();
    assert_eq!(err.code, MachineCode::InvalidArgument);
    assert!(
        err.message.contains("secret.data.userData: must not be empty"),
        "{err}"
    );
    assert!(env.driver.machines().unwrap().is_empty());

    request.secret.data = None;
    request.secret.string_data = Some(BTreeMap::from([("userData".to_owned(), BOOT.to_owned())]));
    env.driver.create_machine(&request).await.unwrap();
    env.wait_log("m-1", "booted m-1").await;
}

#[tokio::test]
async fn machine_names_must_be_plain_directory_names() {
    let env = Env::new();
    for (name, namespace) in [
        ("", "default"),
        ("../evil", "default"),
        ("a/b", "default"),
        (".hidden", "default"),
        ("m-1", "../x"),
    ] {
        let mut request = create(name, BOOT);
        request.machine.metadata.namespace = Some(namespace.into());
        let err = env.driver.create_machine(&request).await.unwrap_err();
        assert_eq!(
            err.code,
            MachineCode::InvalidArgument,
            "{name:?} in {namespace:?}: {err}"
        );
        assert!(err.message.contains("machine.metadata."), "{err}");
    }
    assert!(env.driver.machines().unwrap().is_empty());
    // Without a namespace of its own, the machine is in its class's.
    let mut request = create("m-1", BOOT);
    request.machine.metadata.namespace = None;
    request.machine_class.metadata.namespace = Some("classes".into());
    assert_eq!(
        env.driver.create_machine(&request).await.unwrap().provider_id,
        "local:///classes/m-1"
    );
}

#[tokio::test]
async fn errors_never_carry_user_data() {
    let env = Env::new();
    let script = format!("#!/bin/sh\necho {SECRET_WORD}\nexec sleep 300\n");
    env.driver.create_machine(&create("m-1", &script)).await.unwrap();
    let err = env
        .driver
        .create_machine(&create_with(
            "m-1",
            class_with(support::provider_spec("small", "2")),
            &script,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::AlreadyExists);
    assert!(!err.message.contains(SECRET_WORD), "{err}");
    let request = create("m-1", &script);
    assert!(!format!("{request:?}").contains(SECRET_WORD));
}

#[test]
fn sizes_are_the_documented_ones() {
    assert_eq!(size_resources("xsmall"), Some((1, "2Gi")));
    assert_eq!(size_resources("small"), Some((2, "4Gi")));
    assert_eq!(size_resources("medium"), Some((4, "8Gi")));
    assert_eq!(size_resources("large"), Some((8, "16Gi")));
    assert_eq!(size_resources("huge"), None);
}

/// The example classes' sizes agree with their nodeTemplates, and the example secret boots a machine whose script
/// finds `mcm` in the bin dir.
#[tokio::test]
async fn the_example_manifests_work() {
    let examples = mcm_testkit::examples_dir().join("local");
    let read = |file: &str| std::fs::read_to_string(examples.join(file)).expect("the example");
    for file in ["01-machine-class.yaml", "02-machine-class-medium.yaml"] {
        let class: MachineClass = serde_saphyr::from_str(&read(file)).expect("a class");
        let spec = mcm_provider_local::spec::ProviderSpec::parse(&class.provider_spec)
            .expect("a valid providerSpec");
        let capacity = class
            .node_template
            .as_ref()
            .map(|t| t.capacity.clone())
            .expect("a nodeTemplate");
        let (cpu, memory) = spec.resources();
        assert_eq!(capacity["cpu"].0, cpu.to_string(), "{file}");
        assert_eq!(capacity["memory"].0, memory, "{file}");
    }

    let env = Env::new();
    let bin = env.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("mcm");
    std::fs::write(&fake, "#!/bin/sh\necho \"fake mcm $1 $2 $3\"\nexec sleep 300\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let class: MachineClass = serde_saphyr::from_str(&read("01-machine-class.yaml")).unwrap();
    let secret: Secret = serde_saphyr::from_str(&read("00-secret.yaml")).unwrap();
    let answer = env
        .driver
        .create_machine(&mcm_driver::CreateMachineRequest {
            machine: machine("single-machine"),
            machine_class: class,
            secret,
        })
        .await
        .unwrap();
    assert_eq!(answer.provider_id, "local:///default/single-machine");
    env.wait_log(
        "single-machine",
        "fake mcm node-agent --node-name <<MACHINE_NAME>>",
    )
    .await;
}

#[tokio::test]
async fn the_optional_calls_are_those_declared() {
    assert_eq!(
        optional_methods(),
        [
            DriverMethod::GetMachineStatus,
            DriverMethod::ListMachines,
            DriverMethod::GetVolumeIds
        ]
    );
    let env = Env::new();
    let volumes = GetVolumeIdsRequest {
        pv_specs: vec![PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: "local.csi".into(),
                volume_handle: "vol-1".into(),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }],
    };
    assert!(
        env.driver
            .get_volume_ids(&volumes)
            .await
            .unwrap()
            .volume_ids
            .is_empty()
    );
    assert!(
        env.driver
            .get_volume_ids(&GetVolumeIdsRequest::default())
            .await
            .unwrap()
            .volume_ids
            .is_empty()
    );

    let request = create("m-1", BOOT);
    let err = env
        .driver
        .initialize_machine(&InitializeMachineRequest {
            machine: request.machine,
            machine_class: request.machine_class,
            secret: request.secret,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::Unimplemented);
    let err = env
        .driver
        .generate_machine_class_for_migration(&GenerateMachineClassForMigrationRequest {
            provider_specific_machine_class: json!({ "kind": "LocalMachineClass" }),
            machine_class: class(),
            class_spec: ClassSpec::default(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::Unimplemented);
    assert!(
        env.driver.machines().unwrap().is_empty(),
        "InitializeMachine made nothing"
    );
}

#[test]
fn a_bin_dir_that_path_cannot_hold_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = LocalConfig::new(dir.path().join("state"), "/opt/a:b", "https://x", "/ca.crt");
    assert!(matches!(LocalDriver::new(config), Err(LocalError::Config(_))));
}

#[test]
fn relative_paths_are_made_absolute() {
    let dir = tempfile::tempdir().unwrap();
    let config = LocalConfig::new(dir.path().join("state"), "bin", "https://x", "ca.crt");
    assert_eq!(config.stop_grace, mcm_provider_local::DEFAULT_STOP_GRACE);
    let driver = LocalDriver::new(config).unwrap();
    assert!(driver.config().bin_dir.is_absolute());
    assert!(driver.config().ca_file.is_absolute());
}
