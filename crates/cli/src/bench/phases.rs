//! The objects of the benchmark and its phases: create a MachineDeployment of N machines, roll it to the other class
//! (maxSurge 10%, maxUnavailable 0) once or more (`--rolls`, back and forth), scale it to 0. The driver follows
//! machines and MachineSets through watches (its own caches, so that waiting costs the server next to nothing) and
//! asks the sim provider for its VMs.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    api::{Api, Patch, PatchParams, PostParams},
    runtime::{reflector, watcher},
};
use mcm_api::{Machine, MachineClass, MachineDeployment, MachinePhase, MachineSet, MetaExt};
use mcm_driver::Driver;

/// The MachineDeployment's name (and its machines' `name` label).
pub(super) const DEPLOYMENT: &str = "bench";
/// The class of the first phase.
pub(super) const CLASS_A: &str = "bench-a";
/// The class rolled to.
pub(super) const CLASS_B: &str = "bench-b";
const SECRET: &str = "bench-worker";

fn class(name: &str, size: &str, namespace: &str) -> anyhow::Result<MachineClass> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineClass",
        "metadata": {"name": name, "namespace": namespace},
        "provider": "sim",
        "providerSpec": {
            "vmPool": "bench-pool",
            "size": size,
            "tags": {"kubernetes.io/cluster/bench": "1", "kubernetes.io/role/node": "1"},
        },
        "secretRef": {"name": SECRET, "namespace": namespace},
        "nodeTemplate": {
            "capacity": {"cpu": "2", "gpu": "0", "memory": "4Gi"},
            "instanceType": size,
            "region": "bench",
            "zone": "bench-a",
        },
    }))
    .context("building a MachineClass")
}

fn secret(namespace: &str) -> anyhow::Result<Secret> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": namespace},
        "type": "Opaque",
        "stringData": {"userData": "#!/bin/sh\necho bench <<MACHINE_NAME>>\n"},
    }))
    .context("building the Secret")
}

/// What the provider is asked for its VMs with: the first class and its secret (both classes carry the same tags).
pub(super) struct ProviderQuery {
    class: MachineClass,
    secret: Secret,
}

/// Creates the Secret and both classes (before the controllers start, so that their finalizers are not counted in a
/// phase).
pub(super) async fn create_classes(client: &kube::Client, namespace: &str) -> anyhow::Result<ProviderQuery> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let created = secrets
        .create(&PostParams::default(), &secret(namespace)?)
        .await
        .context("creating the Secret")?;
    let classes: Api<MachineClass> = Api::namespaced(client.clone(), namespace);
    let class_a = classes
        .create(&PostParams::default(), &class(CLASS_A, "small", namespace)?)
        .await
        .context("creating the first MachineClass")?;
    classes
        .create(&PostParams::default(), &class(CLASS_B, "medium", namespace)?)
        .await
        .context("creating the second MachineClass")?;
    // The server turns stringData into data; the provider reads data.
    let secret = Secret {
        data: created.data,
        ..Secret::default()
    };
    Ok(ProviderQuery {
        class: class_a,
        secret,
    })
}

/// The driver's watches of machines and MachineSets in the namespace.
pub(super) struct Caches {
    machines: reflector::Store<Machine>,
    sets: reflector::Store<MachineSet>,
    watches: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Caches {
    /// Ends the watches (before the server stops, so that they do not retry against it).
    fn drop(&mut self) {
        for watch in &self.watches {
            watch.abort();
        }
    }
}

fn cache<K>(api: Api<K>) -> (reflector::Store<K>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher::watcher(api, watcher::Config::default()));
    (reader, tokio::spawn(stream.for_each(|_| async {})))
}

impl Caches {
    /// Starts the watches and waits for their first lists.
    pub(super) async fn start(client: &kube::Client, namespace: &str) -> anyhow::Result<Self> {
        let (machines, machine_watch) = cache(Api::<Machine>::namespaced(client.clone(), namespace));
        let (sets, set_watch) = cache(Api::<MachineSet>::namespaced(client.clone(), namespace));
        let caches = Self {
            machines,
            sets,
            watches: vec![machine_watch, set_watch],
        };
        caches
            .machines
            .wait_until_ready()
            .await
            .context("watching machines")?;
        caches
            .sets
            .wait_until_ready()
            .await
            .context("watching MachineSets")?;
        Ok(caches)
    }

    /// Machines of `class`, in total and Running (not being deleted).
    fn count(&self, class: &str) -> (usize, usize) {
        let machines: Vec<_> = self
            .machines
            .state()
            .into_iter()
            .filter(|m| m.spec.class.name == class)
            .collect();
        let running = machines
            .iter()
            .filter(|m| !m.is_deleting() && m.phase() == Some(MachinePhase::Running))
            .count();
        (machines.len(), running)
    }

    /// Replicas wanted and had by the MachineSets of `class`.
    fn set_replicas(&self, class: &str) -> (i32, i32) {
        self.sets
            .state()
            .iter()
            .filter(|s| s.spec.template.spec.class.name == class)
            .fold((0, 0), |(want, have), s| {
                (
                    want + s.spec.replicas,
                    have + s.status.as_ref().map_or(0, |st| st.replicas),
                )
            })
    }
}

fn deployment(namespace: &str, replicas: usize) -> anyhow::Result<MachineDeployment> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1",
        "kind": "MachineDeployment",
        "metadata": {"name": DEPLOYMENT, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "minReadySeconds": 0,
            "selector": {"matchLabels": {"name": DEPLOYMENT}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "10%", "maxUnavailable": 0},
            },
            "template": {
                "metadata": {"labels": {"name": DEPLOYMENT}},
                "spec": {
                    "class": {"kind": "MachineClass", "name": CLASS_A},
                    "nodeTemplate": {"metadata": {"labels": {"worker.example.com/pool": DEPLOYMENT}}},
                },
            },
        },
    }))
    .context("building the MachineDeployment")
}

/// The phases: create, one or more rolls, scale to 0.
#[derive(Clone, Copy, Debug)]
pub(super) enum Phase {
    /// Create the MachineDeployment; done when N machines of the first class are Running.
    Create,
    /// Roll to the other class (the second on odd rounds, back to the first on even ones); done when N machines of
    /// it are Running, the old sets are at 0 and no old machine is left.
    Roll(u32),
    /// Scale to 0; done when no machine is left and the provider has no VM.
    ScaleDown,
}

impl Phase {
    /// The phases of a run with `rolls` rolls (at least one), in order.
    pub(super) fn sequence(rolls: u32) -> Vec<Self> {
        std::iter::once(Self::Create)
            .chain((1..=rolls.max(1)).map(Self::Roll))
            .chain(std::iter::once(Self::ScaleDown))
            .collect()
    }

    /// The name in the report: `create`, `roll` (then `roll_2`, `roll_3`, ...), `scale_to_zero`.
    pub(super) fn name(self) -> String {
        match self {
            Self::Create => "create".into(),
            Self::Roll(1) => "roll".into(),
            Self::Roll(round) => format!("roll_{round}"),
            Self::ScaleDown => "scale_to_zero".into(),
        }
    }

    /// The class the machines have at the end of the phase and the one they leave (rolls only).
    fn classes(self) -> (&'static str, &'static str) {
        match self {
            Self::Roll(round) if round % 2 == 0 => (CLASS_A, CLASS_B),
            Self::Roll(_) => (CLASS_B, CLASS_A),
            Self::Create | Self::ScaleDown => (CLASS_A, CLASS_B),
        }
    }

    /// Starts the phase: one write of the driver.
    pub(super) async fn start(
        self,
        client: &kube::Client,
        namespace: &str,
        machines: usize,
    ) -> anyhow::Result<()> {
        let api: Api<MachineDeployment> = Api::namespaced(client.clone(), namespace);
        let patch = |value| Patch::Merge(value);
        match self {
            Self::Create => {
                api.create(&PostParams::default(), &deployment(namespace, machines)?)
                    .await
                    .context("creating the MachineDeployment")?;
            }
            Self::Roll(_) => {
                let (to, _) = self.classes();
                api.patch(
                    DEPLOYMENT,
                    &PatchParams::default(),
                    &patch(serde_json::json!({"spec": {"template": {"spec": {"class": {"name": to}}}}})),
                )
                .await
                .context("rolling the MachineDeployment")?;
            }
            Self::ScaleDown => {
                api.patch(
                    DEPLOYMENT,
                    &PatchParams::default(),
                    &patch(serde_json::json!({"spec": {"replicas": 0}})),
                )
                .await
                .context("scaling the MachineDeployment to 0")?;
            }
        }
        Ok(())
    }

    /// Whether the phase is done, with a progress line.
    pub(super) async fn done(
        self,
        caches: &Caches,
        machines: usize,
        provider: &mcm_grpc::GrpcDriver,
        query: &ProviderQuery,
    ) -> anyhow::Result<(bool, String)> {
        Ok(match self {
            Self::Create => {
                let (total, running) = caches.count(CLASS_A);
                (
                    running == machines,
                    format!("{running}/{machines} Running ({total} machines)"),
                )
            }
            Self::Roll(_) => {
                let (to, from) = self.classes();
                let (new_total, new_running) = caches.count(to);
                let (old_total, _) = caches.count(from);
                let (old_want, old_have) = caches.set_replicas(from);
                let (new_want, _) = caches.set_replicas(to);
                (
                    new_running == machines
                        && old_total == 0
                        && old_want == 0
                        && old_have == 0
                        && usize::try_from(new_want).is_ok_and(|w| w == machines),
                    format!(
                        "new class {new_running}/{machines} Running ({new_total} machines), old class {old_total} \
                         machines, old sets {old_want} wanted {old_have} had"
                    ),
                )
            }
            Self::ScaleDown => {
                let left = caches.machines.state().len();
                let vms = if left == 0 {
                    provider
                        .list_machines(&mcm_driver::ListMachinesRequest {
                            machine_class: query.class.clone(),
                            secret: query.secret.clone(),
                        })
                        .await
                        .context("asking the provider for its VMs")?
                        .machine_list
                        .len()
                } else {
                    usize::MAX
                };
                (
                    left == 0 && vms == 0,
                    if vms == usize::MAX {
                        format!("{left} machines left")
                    } else {
                        format!("no machine left, {vms} VMs")
                    },
                )
            }
        })
    }
}

/// Waits until `phase` is done, checking `alive` (the children) each round and printing progress every 5 seconds.
pub(super) async fn wait(
    phase: Phase,
    caches: &Caches,
    machines: usize,
    provider: &mcm_grpc::GrpcDriver,
    query: &ProviderQuery,
    deadline: Duration,
    mut alive: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last_progress = Instant::now();
    loop {
        alive()?;
        let (done, progress) = phase.done(caches, machines, provider, query).await?;
        if done {
            return Ok(());
        }
        if last_progress.elapsed() >= Duration::from_secs(5) {
            eprintln!(
                "mcm bench: {} {:.0}s: {progress}",
                phase.name(),
                started.elapsed().as_secs_f64()
            );
            last_progress = Instant::now();
        }
        anyhow::ensure!(
            started.elapsed() < deadline,
            "phase {} did not finish within {deadline:?}: {progress}",
            phase.name()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_rolls_back_and_forth_between_the_classes() {
        let phases = Phase::sequence(3);
        assert_eq!(
            phases.iter().map(|p| p.name()).collect::<Vec<_>>(),
            ["create", "roll", "roll_2", "roll_3", "scale_to_zero"]
        );
        assert_eq!(Phase::Roll(1).classes(), (CLASS_B, CLASS_A));
        assert_eq!(Phase::Roll(2).classes(), (CLASS_A, CLASS_B));
        assert_eq!(Phase::Roll(3).classes(), (CLASS_B, CLASS_A));
        assert_eq!(Phase::sequence(0).len(), 3, "at least one roll");
    }
}
