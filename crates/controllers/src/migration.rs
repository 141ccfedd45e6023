//! The class migration flow (spec 000 `GenerateMachineClassForMigration`), the acting half: read the old class,
//! let the provider fill a `MachineClass`, create it under the same name, annotate and release the old class, and
//! move every reference (machines, MachineSets, MachineDeployments) to the new kind. The decisions (which patch,
//! which retry) are in `mcm_core::migration`. Every step is idempotent: a crash between steps is repaired by the next
//! reconcile, which runs the flow again for any machine still naming the old kind.

use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams},
    discovery,
};
use mcm_api::{ClassSpec, Machine, MachineClass, MachineDeployment, MachineSet};
use mcm_core::{
    migration::{self, MigrationFailure},
    retry_policy::RetryGate,
};
use mcm_driver::{Driver, GenerateMachineClassForMigrationRequest};

/// What came of a migration attempt.
#[derive(Debug)]
pub enum Outcome {
    /// The class exists and the references moved; the machine's own change reconciles it again.
    Migrated {
        /// How many objects (machines, sets, deployments) now name the new class.
        moved: usize,
    },
    /// The old class is not there (or its kind not served): a clear error naming the field, nothing created.
    OldClassMissing(String),
    /// The provider could not convert the class.
    Failed(MigrationFailure),
    /// An earlier attempt with the same inputs failed and its gate is still closed: nothing was called.
    Waiting,
}

/// Everything the flow needs, borrowed from the machine controller.
pub struct Migration<'a> {
    /// The control cluster.
    pub client: &'a Client,
    /// The namespace of the machines and classes.
    pub namespace: &'a str,
    /// The provider.
    pub driver: &'a dyn Driver,
    /// The machines of the namespace, from the controller's cache.
    pub machines: &'a [std::sync::Arc<Machine>],
    /// Back-off settings for codes marked for retry.
    pub retry: &'a mcm_core::RetrySettings,
}

impl Migration<'_> {
    /// Runs the flow for the class the machine names. `failures` counts consecutive failed provider calls for the
    /// back-off; `random` is the jitter draw; `gate` is the gate of the last failure, if any.
    pub async fn run(
        &self,
        machine: &Machine,
        failures: u32,
        random: f64,
        gate: Option<&RetryGate>,
        now: jiff::Timestamp,
    ) -> Result<Outcome, kube::Error> {
        let old = &machine.spec.class;
        let Some(resource) = self.old_class_resource(old).await else {
            return Ok(Outcome::OldClassMissing(format!(
                "spec.class.kind: Not found: {:?} is not served by the API server (group {})",
                old.kind,
                migration::group_of(old)
            )));
        };
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), self.namespace, &resource);
        let Some(old_object) = api.get_opt(&old.name).await? else {
            return Ok(Outcome::OldClassMissing(mcm_core::descriptions::class_not_found(
                &old.kind, &old.name,
            )));
        };
        let fingerprint = migration::fingerprint(machine, old_object.metadata.resource_version.as_deref());
        if gate.is_some_and(|gate| !gate.is_open(now, &fingerprint)) {
            return Ok(Outcome::Waiting);
        }
        let request = GenerateMachineClassForMigrationRequest {
            provider_specific_machine_class: serde_json::to_value(&old_object).unwrap_or_default(),
            machine_class: migration::skeleton(old, self.namespace),
            class_spec: old.clone(),
        };
        let filled = match self.driver.generate_machine_class_for_migration(&request).await {
            Ok(response) => response.machine_class,
            Err(error) => {
                return Ok(Outcome::Failed(migration::on_failure(
                    old,
                    &error,
                    failures,
                    random,
                    self.retry,
                    now,
                    fingerprint,
                )));
            }
        };
        self.create_or_update(&migration::class_to_create(&filled, old, self.namespace))
            .await?;
        if let Some(patch) = migration::old_class_patch(&old.kind, &old_object.metadata) {
            api.patch(&old.name, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
        }
        let moved = self.move_references(old).await?;
        Ok(Outcome::Migrated { moved })
    }

    async fn old_class_resource(&self, old: &ClassSpec) -> Option<ApiResource> {
        let gvk = GroupVersionKind::gvk(migration::group_of(old), migration::OLD_CLASS_VERSION, &old.kind);
        discovery::pinned_kind(self.client, &gvk)
            .await
            .ok()
            .filter(|(_, capabilities)| capabilities.scope == discovery::Scope::Namespaced)
            .map(|(resource, _)| resource)
    }

    async fn create_or_update(&self, class: &MachineClass) -> Result<(), kube::Error> {
        let api: Api<MachineClass> = Api::namespaced(self.client.clone(), self.namespace);
        match api.create(&PostParams::default(), class).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Created by an earlier attempt (or by hand): make it what the provider filled.
                let mut body = serde_json::to_value(class).unwrap_or_default();
                if let Some(object) = body.as_object_mut() {
                    object.remove("metadata");
                }
                api.patch(&class.name_any(), &PatchParams::default(), &Patch::Merge(body))
                    .await
                    .map(|_| ())
            }
            Err(err) => Err(err),
        }
    }

    async fn move_references(&self, old: &ClassSpec) -> Result<usize, kube::Error> {
        let mut moved = 0;
        let machines: Api<Machine> = Api::namespaced(self.client.clone(), self.namespace);
        for machine in self
            .machines
            .iter()
            .filter(|m| migration::refers_to(&m.spec.class, old))
        {
            patch_ignoring_gone(
                &machines,
                &machine.name_any(),
                migration::machine_reference_patch(),
            )
            .await?;
            moved += 1;
        }
        let sets: Api<MachineSet> = Api::namespaced(self.client.clone(), self.namespace);
        for set in sets.list(&ListParams::default()).await? {
            if migration::refers_to(&set.spec.template.spec.class, old) {
                patch_ignoring_gone(&sets, &set.name_any(), migration::template_reference_patch()).await?;
                moved += 1;
            }
        }
        let deployments: Api<MachineDeployment> = Api::namespaced(self.client.clone(), self.namespace);
        for deployment in deployments.list(&ListParams::default()).await? {
            if migration::refers_to(&deployment.spec.template.spec.class, old) {
                patch_ignoring_gone(
                    &deployments,
                    &deployment.name_any(),
                    migration::template_reference_patch(),
                )
                .await?;
                moved += 1;
            }
        }
        Ok(moved)
    }
}

async fn patch_ignoring_gone<K>(api: &Api<K>, name: &str, patch: serde_json::Value) -> Result<(), kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err),
    }
}
