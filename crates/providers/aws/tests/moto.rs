//! The AWS driver against moto's EC2 server (one server per test, on its own port): every Driver method, tags,
//! pagination over several pages, idempotent create, adoption of a VM the reference created, NotFound and
//! OutOfRange, validation. moto missing makes every test fail with the install command.

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource, PersistentVolumeSpec, Secret,
};
use mcm_api::{
    Machine, MachineClass,
    builders::{MachineBuilder, MachineClassBuilder},
};
use mcm_driver::{
    CreateMachineRequest, DeleteMachineRequest, Driver, GetMachineStatusRequest, GetVolumeIdsRequest,
    InitializeMachineRequest, ListMachinesRequest, MachineCode,
};
use mcm_provider_aws::testing::{Moto, Network, all_texts, provider_spec};
use mcm_provider_aws::{AwsConfig, AwsDriver, RetryPolicy};

const USER_DATA: &str = "#!/bin/sh\necho user-data-must-never-leak\n";

struct Fixture {
    moto: Moto,
    driver: AwsDriver,
    network: Network,
}

async fn fixture(page_size: u32) -> Fixture {
    let moto = Moto::start().await;
    let network = moto.network("mcm-nodes").await;
    let driver = AwsDriver::new(AwsConfig {
        ec2_endpoint: Some(moto.endpoint.clone()),
        sts_endpoint: Some(moto.endpoint.clone()),
        retry: RetryPolicy {
            attempts: 2,
            base: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        page_size,
        dns_wait: Duration::from_secs(20),
        ..AwsConfig::default()
    });
    Fixture {
        moto,
        driver,
        network,
    }
}

fn class(spec: &serde_json::Value) -> MachineClass {
    MachineClassBuilder::new("aws-class")
        .namespace("default")
        .provider("AWS")
        .provider_spec(spec.clone())
        .secret_ref("aws-secret", "default")
        .build()
}

fn secret() -> Secret {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "aws-secret", "namespace": "default"},
        "stringData": {
            "providerAccessKeyId": "AKIAMCMTESTFAKE",
            "providerSecretAccessKey": "super-secret-access-key-value",
            "userData": USER_DATA
        }
    }))
    .unwrap()
}

fn machine(name: &str, provider_id: &str) -> Machine {
    MachineBuilder::new(name)
        .namespace("default")
        .uid(&format!("uid-{name}"))
        .provider_id(provider_id)
        .class("aws-class")
        .build()
}

impl Fixture {
    fn class(&self) -> MachineClass {
        class(&provider_spec(&self.network))
    }

    async fn create(&self, name: &str) -> Result<mcm_driver::CreateMachineResponse, mcm_driver::DriverError> {
        self.driver
            .create_machine(&CreateMachineRequest {
                machine: machine(name, ""),
                machine_class: self.class(),
                secret: secret(),
            })
            .await
    }

    async fn status(
        &self,
        name: &str,
        provider_id: &str,
    ) -> Result<mcm_driver::GetMachineStatusResponse, mcm_driver::DriverError> {
        self.driver
            .get_machine_status(&GetMachineStatusRequest {
                machine: machine(name, provider_id),
                machine_class: self.class(),
                secret: secret(),
            })
            .await
    }

    async fn delete(&self, name: &str, provider_id: &str) {
        self.driver
            .delete_machine(&DeleteMachineRequest {
                machine: machine(name, provider_id),
                machine_class: self.class(),
                secret: secret(),
            })
            .await
            .expect("DeleteMachine");
    }

    async fn list(&self) -> std::collections::BTreeMap<String, String> {
        self.driver
            .list_machines(&ListMachinesRequest {
                machine_class: self.class(),
                secret: secret(),
            })
            .await
            .expect("ListMachines")
            .machine_list
    }

    /// IDs of live instances tagged Name=name.
    async fn instances_named(&self, name: &str) -> Vec<String> {
        let xml = self
            .moto
            .ec2(
                "DescribeInstances",
                &[
                    ("Filter.1.Name", "tag:Name"),
                    ("Filter.1.Value.1", name),
                    ("Filter.2.Name", "instance-state-name"),
                    ("Filter.2.Value.1", "pending"),
                    ("Filter.2.Value.2", "running"),
                ],
            )
            .await
            .unwrap();
        all_texts(&xml, "instanceId")
    }

    /// Launches an instance outside the driver, as the reference's provider would have, with these tags.
    async fn launch_outside(&self, tags: &[(&str, &str)]) -> String {
        let mut params: Vec<(String, String)> = vec![
            ("ImageId".into(), mcm_provider_aws::testing::MOTO_AMI.into()),
            ("InstanceType".into(), "m5.large".into()),
            ("MinCount".into(), "1".into()),
            ("MaxCount".into(), "1".into()),
            ("SubnetId".into(), self.network.subnet_id.clone()),
            ("TagSpecification.1.ResourceType".into(), "instance".into()),
        ];
        for (i, (k, v)) in tags.iter().enumerate() {
            params.push((format!("TagSpecification.1.Tag.{}.Key", i + 1), (*k).into()));
            params.push((format!("TagSpecification.1.Tag.{}.Value", i + 1), (*v).into()));
        }
        let refs: Vec<(&str, &str)> = params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let xml = self.moto.ec2("RunInstances", &refs).await.expect("RunInstances");
        mcm_provider_aws::testing::first_text(&xml, "instanceId").unwrap()
    }
}

const CLUSTER: (&str, &str) = ("kubernetes.io/cluster/shoot--test", "1");
const ROLE: (&str, &str) = ("kubernetes.io/role/node", "1");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_on_one_machine_with_tags_on_instance_and_volume() {
    let f = fixture(1000).await;
    let created = f.create("worker-a").await.expect("CreateMachine");
    let id = mcm_provider_aws::instance_id(&created.provider_id)
        .unwrap()
        .to_owned();
    assert_eq!(created.provider_id, format!("aws:///eu-west-1/{id}"));
    assert!(
        created.node_name.ends_with(".internal"),
        "node name is the private DNS name: {}",
        created.node_name
    );
    assert!(created.addresses.iter().any(|a| a.type_ == "InternalIP"));

    // Tags on the instance and on its volume (Name plus the class's tags).
    let xml = f
        .moto
        .ec2("DescribeInstances", &[("InstanceId.1", &id)])
        .await
        .unwrap();
    let keys = all_texts(&xml, "key");
    for key in ["Name", CLUSTER.0, ROLE.0, "worker.gardener.cloud/pool"] {
        assert!(
            keys.iter().any(|k| k == key),
            "instance tag {key} missing: {keys:?}"
        );
    }
    assert!(all_texts(&xml, "value").iter().any(|v| v == "worker-a"));
    let volumes = f
        .moto
        .ec2(
            "DescribeVolumes",
            &[
                ("Filter.1.Name", "attachment.instance-id"),
                ("Filter.1.Value.1", &id),
            ],
        )
        .await
        .unwrap();
    assert!(
        all_texts(&volumes, "value").iter().any(|v| v == "worker-a"),
        "volume not tagged Name: {volumes}"
    );

    let status = f.status("worker-a", "").await.expect("GetMachineStatus by tags");
    assert_eq!(status.provider_id, created.provider_id);
    assert_eq!(status.node_name, created.node_name);
    let init = f
        .driver
        .initialize_machine(&InitializeMachineRequest {
            machine: machine("worker-a", &created.provider_id),
            machine_class: f.class(),
            secret: secret(),
        })
        .await
        .expect("InitializeMachine");
    assert_eq!(init.provider_id, created.provider_id);
    assert_eq!(
        f.list().await.get(&created.provider_id).map(String::as_str),
        Some("worker-a")
    );

    f.delete("worker-a", &created.provider_id).await;
    let err = f.status("worker-a", &created.provider_id).await.unwrap_err();
    assert_eq!(err.code, MachineCode::NotFound, "{err}");
    assert!(f.list().await.is_empty());
    // Deleting again (the instance is gone) is success, by providerID and by tags.
    f.delete("worker-a", &created.provider_id).await;
    f.delete("worker-a", "").await;
    f.moto.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_is_idempotent_and_adopts_the_references_vm() {
    let f = fixture(1000).await;
    let first = f.create("worker-b").await.unwrap();
    let second = f.create("worker-b").await.unwrap();
    assert_eq!(first.provider_id, second.provider_id);
    assert_eq!(f.instances_named("worker-b").await.len(), 1);

    // An instance the reference's provider created for machine worker-c (same tags and Name) is adopted.
    let theirs = f.launch_outside(&[("Name", "worker-c"), CLUSTER, ROLE]).await;
    let adopted = f.create("worker-c").await.unwrap();
    assert_eq!(adopted.provider_id, format!("aws:///eu-west-1/{theirs}"));
    assert_eq!(f.instances_named("worker-c").await, vec![theirs]);
    f.moto.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_follows_pages_and_filters_by_the_clusters_tags() {
    let f = fixture(5).await;
    let mut ids = Vec::new();
    for i in 0..7 {
        ids.push(f.create(&format!("worker-{i}")).await.unwrap().provider_id);
    }
    // Another cluster's instance and an untagged one are not listed.
    f.launch_outside(&[("Name", "other"), ("kubernetes.io/cluster/other", "1"), ROLE])
        .await;
    f.launch_outside(&[("Name", "plain")]).await;
    // The emulator pages at 5, so 7 instances take two pages.
    let first_page = f
        .moto
        .ec2("DescribeInstances", &[("MaxResults", "5")])
        .await
        .unwrap();
    assert!(mcm_provider_aws::testing::first_text(&first_page, "nextToken").is_some());
    let listed = f.list().await;
    assert_eq!(listed.len(), 7, "{listed:?}");
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(listed.get(id), Some(&format!("worker-{i}")));
    }
    f.moto.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_out_of_range_and_delete_by_tags() {
    let f = fixture(1000).await;
    let err = f.status("never", "").await.unwrap_err();
    assert_eq!(err.code, MachineCode::NotFound);
    let err = f
        .status("never", "aws:///eu-west-1/i-0000000000000dead")
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::NotFound, "{err}");

    let a = f.launch_outside(&[("Name", "twin"), CLUSTER, ROLE]).await;
    let b = f.launch_outside(&[("Name", "twin"), CLUSTER, ROLE]).await;
    let err = f.status("twin", "").await.unwrap_err();
    assert_eq!(err.code, MachineCode::OutOfRange);
    assert!(err.message.contains(&a) && err.message.contains(&b), "{err}");

    // Without a providerID, delete terminates every instance carrying the machine's tags.
    f.delete("twin", "").await;
    assert!(f.instances_named("twin").await.is_empty());
    f.moto.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_named_and_unknown_ami_is_not_found() {
    let f = fixture(1000).await;
    let mut spec = provider_spec(&f.network);
    spec["ami"] = "ami-00000000000000000".into();
    let err = f
        .driver
        .create_machine(&CreateMachineRequest {
            machine: machine("bad-ami", ""),
            machine_class: class(&spec),
            secret: secret(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::NotFound, "{err}");
    assert!(err.message.contains("providerSpec.ami"), "{err}");

    let mut spec = provider_spec(&f.network);
    spec["blockDevices"][0]["ebs"]["volumeSiz"] = 10.into();
    let err = f
        .driver
        .create_machine(&CreateMachineRequest {
            machine: machine("typo", ""),
            machine_class: class(&spec),
            secret: secret(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::InvalidArgument);
    assert!(
        err.message.contains("providerSpec.blockDevices[0].ebs") && err.message.contains("volumeSiz"),
        "{err}"
    );

    let mut spec = provider_spec(&f.network);
    spec["tags"] = serde_json::json!({"team": "x"});
    spec["instanceMetadataOptions"]["httpPutResponseHopLimit"] = 65.into();
    spec["iam"] = serde_json::json!({"name": "a", "arn": "b"});
    let mut bad_secret = secret();
    bad_secret.string_data.as_mut().unwrap().remove("userData");
    let err = f
        .driver
        .create_machine(&CreateMachineRequest {
            machine: machine("invalid", ""),
            machine_class: class(&spec),
            secret: bad_secret,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::InvalidArgument);
    for field in [
        "providerSpec.tags: a tag of the form kubernetes.io/cluster/",
        "providerSpec.tags: a tag of the form kubernetes.io/role/",
        "providerSpec.instanceMetadataOptions.httpPutResponseHopLimit",
        "providerSpec.iam",
        "secretRef.userData",
    ] {
        assert!(err.message.contains(field), "{field} not in {err}");
    }
    assert!(f.instances_named("invalid").await.is_empty());
    f.moto.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_dest_check_off_is_uninitialized_until_initialize() {
    let f = fixture(1000).await;
    let mut spec = provider_spec(&f.network);
    spec["srcAndDstChecksEnabled"] = false.into();
    let class = class(&spec);
    let created = f
        .driver
        .create_machine(&CreateMachineRequest {
            machine: machine("router", ""),
            machine_class: class.clone(),
            secret: secret(),
        })
        .await
        .unwrap();
    let request = GetMachineStatusRequest {
        machine: machine("router", &created.provider_id),
        machine_class: class.clone(),
        secret: secret(),
    };
    let err = f.driver.get_machine_status(&request).await.unwrap_err();
    assert_eq!(err.code, MachineCode::Uninitialized, "{err}");
    f.driver
        .initialize_machine(&InitializeMachineRequest {
            machine: machine("router", &created.provider_id),
            machine_class: class.clone(),
            secret: secret(),
        })
        .await
        .unwrap();
    let status = f.driver.get_machine_status(&request).await.expect("initialized");
    assert_eq!(status.provider_id, created.provider_id);
    f.moto.stop().await;
}

#[tokio::test]
async fn volume_ids_of_in_tree_and_csi_volumes_without_a_cloud_call() {
    let driver = AwsDriver::new(AwsConfig {
        ec2_endpoint: Some("http://127.0.0.1:1".into()),
        ..AwsConfig::default()
    });
    let specs = vec![
        PersistentVolumeSpec {
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: "vol-in-tree".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
        PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: "ebs.csi.aws.com".into(),
                volume_handle: "vol-csi".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
        PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: "other.csi".into(),
                volume_handle: "nope".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    let ids = driver
        .get_volume_ids(&GetVolumeIdsRequest { pv_specs: specs })
        .await
        .unwrap()
        .volume_ids;
    assert_eq!(ids, vec!["vol-in-tree".to_owned(), "vol-csi".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_identity_credentials_come_from_sts() {
    let f = fixture(1000).await;
    let dir = std::env::temp_dir().join(format!("mcm-aws-wi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, "web-identity-token-never-shown").unwrap();
    let secret = |token_path: &str| -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "aws-wi", "namespace": "default"},
            "stringData": {
                "workloadIdentityTokenFile": token_path,
                "roleARN": "arn:aws:iam::123456789012:role/mcm",
                "userData": USER_DATA
            }
        }))
        .unwrap()
    };
    let created = f
        .driver
        .create_machine(&CreateMachineRequest {
            machine: machine("wi-0", ""),
            machine_class: f.class(),
            secret: secret(token_file.to_str().unwrap()),
        })
        .await
        .expect("created with STS credentials");
    assert!(created.provider_id.starts_with("aws:///eu-west-1/i-"));
    let metrics = f.driver.metrics().encode();
    assert!(
        metrics.contains(r#"mcm_cloud_api_requests_total{provider="aws",service="sts"} 1"#),
        "one AssumeRoleWithWebIdentity: {metrics}"
    );
    // The role's credentials are reused until shortly before they expire.
    f.driver
        .get_machine_status(&GetMachineStatusRequest {
            machine: machine("wi-0", &created.provider_id),
            machine_class: f.class(),
            secret: secret(token_file.to_str().unwrap()),
        })
        .await
        .expect("status with cached STS credentials");
    let metrics = f.driver.metrics().encode();
    assert!(
        metrics.contains(r#"mcm_cloud_api_requests_total{provider="aws",service="sts"} 1"#),
        "still one AssumeRoleWithWebIdentity: {metrics}"
    );

    let missing = dir.join("missing");
    let err = f
        .driver
        .create_machine(&CreateMachineRequest {
            machine: machine("wi-1", ""),
            machine_class: f.class(),
            secret: secret(missing.to_str().unwrap()),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::InvalidArgument);
    assert!(
        err.message.contains("secretRef.workloadIdentityTokenFile"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    f.moto.stop().await;
}
