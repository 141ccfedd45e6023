//! What machines refer to, against the embedded API server over HTTPS with the sim provider: the class migration
//! flow of spec 000 (`GenerateMachineClassForMigration`) and the MachineClass and Secret finalizers of reference
//! §3.7.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams},
};
use mcm_api::{
    Machine, MachineClass, MachinePhase, MachineSet,
    builders::{MachineBuilder, MachineSetBuilder},
    keys,
};
use mcm_controllers::references;
use mcm_driver::DriverMethod;
use serde_json::json;
use support::{Cluster, NAMESPACE, Setup, sized_class};

const DEADLINE: Duration = Duration::from_secs(30);

/// Server (with Kubernetes' node monitor periods), sim provider and kubelet, the machine controller and the class and
/// secret finalizer loop; no class (each test makes its own).
async fn start() -> Cluster {
    let mut setup = Setup::new(mcm_core::ControllerSettings::default());
    let kubernetes = mcm_apiserver::Config::new(".");
    setup.server.node_monitor_grace_period = kubernetes.node_monitor_grace_period;
    setup.server.node_monitor_period = kubernetes.node_monitor_period;
    let mut cluster = Cluster::start_with(setup).await;
    cluster.start_controller();
    let client = cluster.client.clone();
    cluster.spawn_loop(|shutdown| {
        let (caches, shutdown) = support::caches_until(&client, shutdown);
        references::run(
            client,
            NAMESPACE.into(),
            caches,
            Duration::from_mins(10),
            None,
            shutdown,
        )
    });
    cluster
}

/// This file's helpers on the shared harness.
impl Cluster {
    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    fn old_classes(&self, kind: &str) -> Api<DynamicObject> {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("machine.sapcloud.io", "v1alpha1", kind),
            &format!("{}es", kind.to_lowercase()),
        );
        Api::namespaced_with(self.client.clone(), NAMESPACE, &resource)
    }

    async fn create_old_class(&self, kind: &str, name: &str) {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1",
            "kind": kind,
            "metadata": { "name": name, "finalizers": [keys::finalizers::MACHINE_CONTROLLER_MANAGER] },
            "spec": {
                "vmPool": "pool-a", "size": "small", "tags": { "kubernetes.io/cluster/c": "1" },
                "secretRef": { "name": "boot", "namespace": "default" }
            }
        }))
        .unwrap();
        self.old_classes(kind)
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }

    /// A machine of the class `class` of kind `kind`.
    async fn create_machine_of(&self, name: &str, kind: &str, class: &str) {
        let machine = MachineBuilder::new(name)
            .class(class)
            .with(|m| kind.clone_into(&mut m.spec.class.kind))
            .build();
        self.api::<Machine>()
            .create(&PostParams::default(), &machine)
            .await
            .unwrap();
    }

    async fn find_machine(&self, name: &str) -> Option<Machine> {
        self.api::<Machine>().get_opt(name).await.unwrap()
    }
}

/// Waits until `probe` gives a value, within this file's deadline.
async fn eventually<T>(what: &str, probe: impl AsyncFnMut() -> Option<T>) -> T {
    support::wait_within(DEADLINE, what, probe).await
}

/// Spec 000: "The task of creating the new CR of the new kind (MachineClass) with the same name as the previous one
/// and also annotating the old machineClass CR with a migrated annotation and migrating existing references is done
/// by the calling library implicitly."
#[tokio::test]
async fn a_machine_naming_an_old_class_kind_gets_a_migrated_class_and_runs() {
    let h = start().await;
    h.create_boot_secret().await;
    h.create_old_class("SimMachineClass", "old").await;
    let set = MachineSetBuilder::new("set")
        .replicas(0)
        .matching([("app", "a")])
        .class("old")
        .with(|s| "SimMachineClass".clone_into(&mut s.spec.template.spec.class.kind))
        .build();
    h.api::<MachineSet>()
        .create(&PostParams::default(), &set)
        .await
        .unwrap();
    h.create_machine_of("m1", "SimMachineClass", "old").await;

    let class = eventually("the migrated MachineClass", || async {
        h.api::<MachineClass>().get_opt("old").await.unwrap()
    })
    .await;
    assert_eq!(class.provider, "sim");
    assert_eq!(class.provider_spec["vmPool"], "pool-a");
    assert_eq!(
        class.secret_ref.as_ref().and_then(|r| r.name.as_deref()),
        Some("boot")
    );
    let running = eventually("m1 Running on the migrated class", || async {
        h.find_machine("m1")
            .await
            .filter(|m| m.phase() == Some(MachinePhase::Running))
    })
    .await;
    assert_eq!(running.spec.class.kind, "MachineClass");
    assert_eq!(running.spec.class.name, "old");

    let old = h.old_classes("SimMachineClass").get("old").await.unwrap();
    assert_eq!(
        old.annotations()
            .get(keys::annotations::MIGRATED_MACHINE_CLASS)
            .map(String::as_str),
        Some("machine-controller-SimMachineClass")
    );
    assert!(
        !old.finalizers()
            .iter()
            .any(|f| f == keys::finalizers::MACHINE_CONTROLLER_MANAGER),
        "the old class is released: {:?}",
        old.finalizers()
    );
    let set = h.api::<MachineSet>().get("set").await.unwrap();
    assert_eq!(set.spec.template.spec.class.kind, "MachineClass");
    assert!(
        h.events_of("m1")
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some("MigratedClass")),
        "a MigratedClass event"
    );
    assert_eq!(h.driver.faults().calls(DriverMethod::CreateMachine), 1);
    h.stop().await;
}

/// Spec 000: "A Provider SHOULD implement this driver call, else it MUST return a UNIMPLEMENTED status in error";
/// the table marks Unimplemented "Auto Retry Required: N". The machine carries a clear error, nothing is created.
#[tokio::test]
async fn an_old_class_the_provider_cannot_convert_leaves_a_clear_error_and_creates_nothing() {
    let h = start().await;
    h.create_boot_secret().await;
    h.create_old_class("AWSMachineClass", "aws").await;
    h.create_machine_of("m1", "AWSMachineClass", "aws").await;

    let machine = eventually("the migration error on m1", || async {
        h.find_machine("m1").await.filter(|m| {
            m.status
                .as_ref()
                .is_some_and(|s| !s.last_operation.description.is_empty())
        })
    })
    .await;
    let operation = &machine.status.unwrap().last_operation;
    assert!(
        operation
            .description
            .starts_with("Migration of AWSMachineClass aws to MachineClass failed: machine codes error: code = [Unimplemented]"),
        "{}",
        operation.description
    );
    assert_eq!(
        operation.state.as_ref().map(mcm_api::MachineState::as_str),
        Some("Failed")
    );
    eventually("a MigrationFailed event", || async {
        h.events_of("m1")
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some("MigrationFailed"))
            .then_some(())
    })
    .await;
    assert!(h.api::<MachineClass>().get_opt("aws").await.unwrap().is_none());
    assert_eq!(h.driver.faults().calls(DriverMethod::CreateMachine), 0);
    assert_eq!(
        h.driver
            .faults()
            .calls(DriverMethod::GenerateMachineClassForMigration),
        1,
        "an N code is not retried until something changes"
    );
    let old = h.old_classes("AWSMachineClass").get("aws").await.unwrap();
    assert!(
        old.annotations()
            .get(keys::annotations::MIGRATED_MACHINE_CLASS)
            .is_none()
    );
    h.stop().await;
}

/// Reference §3.7: a class keeps its finalizer while a machine uses it, a secret while a class refers to it; both
/// go once nothing uses them, so deleting them in any order never strands a machine.
#[tokio::test]
async fn a_class_and_its_secret_are_held_while_used_and_released_after() {
    let h = start().await;
    h.create_boot_secret().await;
    h.create_sim_class("small", sized_class("small")).await;
    h.create_machine_of("m1", "MachineClass", "small").await;
    eventually("the class finalizer", || async {
        let class = h.api::<MachineClass>().get("small").await.unwrap();
        class
            .finalizers()
            .iter()
            .any(|f| f == keys::finalizers::MACHINE_CONTROLLER_MANAGER)
            .then_some(())
    })
    .await;
    eventually("the secret finalizer", || async {
        let secret = h.api::<Secret>().get("boot").await.unwrap();
        secret
            .finalizers()
            .iter()
            .any(|f| f == keys::finalizers::SECRET)
            .then_some(())
    })
    .await;

    // Deleting the class while m1 uses it only marks it.
    h.api::<MachineClass>()
        .delete("small", &DeleteParams::default())
        .await
        .unwrap();
    eventually("m1 Running", || async {
        h.find_machine("m1")
            .await
            .filter(|m| m.phase() == Some(MachinePhase::Running))
    })
    .await;
    let held = h.api::<MachineClass>().get_opt("small").await.unwrap();
    assert!(
        held.is_some_and(|c| c.metadata.deletion_timestamp.is_some()),
        "the class in use stays until its machine is gone"
    );

    h.api::<Machine>()
        .delete("m1", &DeleteParams::default())
        .await
        .unwrap();
    eventually("m1 gone", || async {
        h.find_machine("m1").await.is_none().then_some(())
    })
    .await;
    eventually("the class gone", || async {
        h.api::<MachineClass>()
            .get_opt("small")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    eventually("the secret released", || async {
        let secret = h.api::<Secret>().get("boot").await.unwrap();
        (!secret.finalizers().iter().any(|f| f == keys::finalizers::SECRET)).then_some(())
    })
    .await;
    h.stop().await;
}

/// Issue 19: a class whose secret does not exist says so, on its machine (`lastOperation`, an Event) and once on the
/// class, instead of reporting a missing `userData` key; nothing is created until the secret arrives, and then the
/// machine runs.
#[tokio::test]
async fn a_class_whose_secret_does_not_exist_says_so_and_its_machine_waits_for_it() {
    let h = start().await;
    h.create_sim_class("small", sized_class("small")).await;
    h.create_machine_of("m1", "MachineClass", "small").await;
    let expected = r#"secretRef: Secret "boot" not found in namespace "default""#;
    let machine = eventually("the machine to name the missing secret", || async {
        h.find_machine("m1").await.filter(|m| {
            m.status
                .as_ref()
                .is_some_and(|s| s.last_operation.description == expected)
        })
    })
    .await;
    assert!(!format!("{:?}", machine.status).contains("userData"));
    for (object, reason) in [("m1", "SecretNotFound"), ("small", "SecretNotFound")] {
        eventually(&format!("a Warning Event on {object}"), || async {
            h.events_of(object)
                .await
                .iter()
                .any(|e| {
                    e.type_.as_deref() == Some("Warning")
                        && e.reason.as_deref() == Some(reason)
                        && e.message.as_deref().is_some_and(|m| m.contains(expected))
                })
                .then_some(())
        })
        .await;
    }
    assert!(h.driver.vms().is_empty(), "nothing was created");
    assert_eq!(
        h.driver.faults().calls(DriverMethod::CreateMachine),
        0,
        "no CreateMachine without the secret"
    );

    // The secret arrives: the machine runs, and the class was warned about once.
    h.create_boot_secret().await;
    eventually("m1 Running", || async {
        h.find_machine("m1")
            .await
            .filter(|m| m.phase() == Some(MachinePhase::Running))
    })
    .await;
    let class_warnings = h
        .events_of("small")
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some("SecretNotFound"))
        .count();
    assert_eq!(class_warnings, 1);
    h.stop().await;
}

/// A class whose Secret exists but has no `userData`: the machine says so (CrashLoopBackOff, `InvalidArgument`,
/// naming the key and the class, never a value of the secret), no VM is asked for, and the machine waits for the
/// secret to change instead of retrying; once `userData` is added, it runs.
#[tokio::test]
async fn a_secret_without_user_data_holds_its_machine_until_the_secret_changes() {
    let h = start().await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "boot" },
        "stringData": { "providerAccessKeyId": "canary-key-1234567890" }
    }))
    .unwrap();
    h.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    h.create_sim_class("small", sized_class("small")).await;
    h.create_machine_of("m1", "MachineClass", "small").await;
    let held = eventually("m1 in CrashLoopBackOff", || async {
        h.find_machine("m1")
            .await
            .filter(|m| m.phase() == Some(MachinePhase::CrashLoopBackOff))
    })
    .await;
    let operation = &held.status.as_ref().unwrap().last_operation;
    assert_eq!(operation.error_code, "InvalidArgument");
    assert!(
        operation
            .description
            .contains(r#"the secret of machine class "small" has no "userData" key"#),
        "{}",
        operation.description
    );
    assert!(
        !format!("{held:?}").contains("canary-key"),
        "no value of the secret on the machine"
    );
    assert_eq!(
        h.driver.faults().calls(DriverMethod::CreateMachine),
        0,
        "no CreateMachine without userData"
    );

    // The secret gets its userData: its change opens the retry gate and the machine runs.
    h.api::<Secret>()
        .patch(
            "boot",
            &kube::api::PatchParams::default(),
            // `#!/bin/sh\necho <<MACHINE_NAME>>\n`
            &kube::api::Patch::Merge(
                json!({ "data": { "userData": "IyEvYmluL3NoCmVjaG8gPDxNQUNISU5FX05BTUU+Pgo=" } }),
            ),
        )
        .await
        .unwrap();
    eventually("m1 Running", || async {
        h.find_machine("m1")
            .await
            .filter(|m| m.phase() == Some(MachinePhase::Running))
    })
    .await;
    h.stop().await;
}
