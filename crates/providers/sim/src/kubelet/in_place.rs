//! The kubelet as Gardener's node agent in an in-place update: on the node condition `InPlaceUpdate` reason
//! `ReadyForUpdate` (and no `update-result` yet) it finds the class the machine is to have — the VM's machine, its
//! MachineSet owner, that set's MachineDeployment owner, `spec.template.spec.class.name`, the MachineClass — and
//! applies it to the VM without replacing it: the VM's recorded class, providerSpec and size follow the class, the
//! node's capacity and instance-type label follow the size. Then it sets the node label `update-result=successful`;
//! when the target cannot be found or applied (or [`crate::Faults::fail_in_place_updates`] says so), it changes
//! nothing and sets `update-result=failed` with the annotation `update-failed-reason`.

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use mcm_api::{
    Machine, MachineClass, MachineDeployment, MachineSet, MetaExt as _, keys::kubernetes::INSTANCE_TYPE_LABEL,
};
use mcm_core::in_place_update;

use super::{
    bump,
    jobs::Done,
    runner::Runner,
    status::{desired_status, resources_patch},
};
use crate::provider_spec::ProviderSpec;

/// What an update is to apply: the class's name and its providerSpec.
struct Target {
    class: String,
    spec: ProviderSpec,
}

impl Runner {
    /// Updates the node `name` (VM `vm_id` of machine `namespace/machine`) in place and reports the result on the
    /// node.
    pub(super) async fn update_in_place(
        &self,
        name: String,
        vm_id: u64,
        namespace: String,
        machine: String,
    ) -> Done {
        let failure = self
            .shared
            .lock()
            .node_faults
            .get(&name)
            .and_then(|f| f.in_place_update_failure.clone());
        let target = match failure {
            Some(reason) => Err(reason),
            None => self.target_of(&namespace, &machine).await,
        };
        let result = match target {
            Ok(target) => self.apply_target(&name, vm_id, target).await,
            Err(reason) => Err(reason),
        };
        let extra = match &result {
            Ok(size) => [(INSTANCE_TYPE_LABEL.to_owned(), (*size).to_owned())].into(),
            Err(_) => std::collections::BTreeMap::new(),
        };
        if let Err(reason) = &result {
            tracing::warn!(node = name, reason, "sim kubelet: in-place update failed");
        }
        let patch =
            in_place_update::result_patch(result.as_ref().map(|_| ()).map_err(String::as_str), &extra);
        match self
            .nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(node) => {
                tracing::info!(
                    node = name,
                    ok = result.is_ok(),
                    "sim kubelet: in-place update result reported"
                );
                Done::InPlaceUpdated {
                    name,
                    node: Some(Box::new(node)),
                }
            }
            Err(err) => {
                bump(&self.counters.failed_requests);
                tracing::warn!(node = name, error = %err, "sim kubelet: reporting an in-place update result failed");
                Done::InPlaceUpdated { name, node: None }
            }
        }
    }

    /// The class the machine's deployment names now, and its providerSpec; else why not (no secret in it: names
    /// and the providerSpec's problems only).
    async fn target_of(&self, namespace: &str, machine: &str) -> Result<Target, String> {
        let client = &self.control;
        let machines: Api<Machine> = Api::namespaced(client.clone(), namespace);
        let machine_object = get(&machines, machine, "Machine").await?;
        let set_name = machine_object
            .controller_ref_of_kind(<MachineSet as k8s_openapi::Resource>::KIND)
            .map(|r| r.name.clone())
            .ok_or_else(|| format!("machine {namespace}/{machine} has no MachineSet owner"))?;
        let sets: Api<MachineSet> = Api::namespaced(client.clone(), namespace);
        let set = get(&sets, &set_name, "MachineSet").await?;
        let deployment_name = set
            .controller_ref_of_kind(<MachineDeployment as k8s_openapi::Resource>::KIND)
            .map(|r| r.name.clone())
            .ok_or_else(|| format!("MachineSet {namespace}/{set_name} has no MachineDeployment owner"))?;
        let deployments: Api<MachineDeployment> = Api::namespaced(client.clone(), namespace);
        let deployment = get(&deployments, &deployment_name, "MachineDeployment").await?;
        let class_name = deployment.spec.template.spec.class.name.clone();
        let classes: Api<MachineClass> = Api::namespaced(client.clone(), namespace);
        let class = get(&classes, &class_name, "MachineClass").await?;
        let spec = ProviderSpec::parse(&class.provider_spec)
            .map_err(|err| format!("MachineClass {namespace}/{class_name}: {err}"))?;
        Ok(Target {
            class: class_name,
            spec,
        })
    }

    /// Applies `target` to the VM and writes the node's new capacity; returns the new size's name.
    async fn apply_target(&self, name: &str, vm_id: u64, target: Target) -> Result<&'static str, String> {
        let view = {
            let mut state = self.shared.lock();
            let vm = state
                .vms
                .get_mut(&vm_id)
                .ok_or_else(|| format!("the VM of node {name} is gone"))?;
            vm.class_name = target.class;
            vm.provider_spec = target.spec;
            self.view(vm)
        };
        let size = view.size.name;
        let status = desired_status(&view, None, &self.config.kubelet_version);
        self.nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(resources_patch(&status)),
            )
            .await
            .map_err(|err| format!("writing the node's new capacity failed: {err}"))?;
        tracing::info!(node = name, size, "sim kubelet: VM updated in place");
        Ok(size)
    }
}

/// Gets an object, or says which one is missing.
async fn get<K>(api: &Api<K>, name: &str, kind: &str) -> Result<K, String>
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await {
        Ok(Some(object)) => Ok(object),
        Ok(None) => Err(format!("{kind} {name} not found")),
        Err(err) => Err(format!("reading {kind} {name} failed: {err}")),
    }
}

/// Whether the node, as last seen, asks for an update now (see [`in_place_update::agent_should_update`]).
pub(super) fn wants_update(node: &Node) -> bool {
    in_place_update::agent_should_update(node)
}
