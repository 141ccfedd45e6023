//! The API server reachability freeze, acted (decisions in `mcm_core::reachability`): probes the control API server
//! (a GET of Machine `dummy_name`; NotFound is an answer) and the target one (Node `dummy_name`), freezes the
//! machine controller through a shared [`Freeze`] while one is unreachable for longer than the timeout, and on
//! recovery lifts the freeze and restarts the health clocks of the machines still Unknown (phase Running again,
//! `lastOperation` "Machine Health Timeout was reset due to APIServer being unreachable"), which the health check
//! then judges afresh. `mcm_machine_controller_frozen` follows the freeze.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Time};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use mcm_api::{Machine, MachinePhase, MetaExt};
use mcm_core::reachability::{Change, HEALTH_TIMEOUT_RESET, Reachability, ReachabilitySettings};
use serde_json::json;

/// Whether the machine controller is frozen; cheap to clone and to read on every reconcile.
#[derive(Clone, Debug, Default)]
pub struct Freeze(Arc<AtomicBool>);

impl Freeze {
    /// Whether work is frozen now.
    pub fn is_frozen(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self, frozen: bool) {
        self.0.store(frozen, Ordering::Release);
    }
}

/// How the probes run.
#[derive(Clone, Debug)]
pub struct Config {
    /// The namespace of the machines.
    pub namespace: String,
    /// Period and timeout.
    pub settings: ReachabilitySettings,
}

/// Whether one API server answers: any HTTP answer counts (the dummy objects do not exist: 404 is the expected
/// answer), a transport failure or no answer within `limit` does not.
async fn answers<K>(api: Api<K>, limit: Duration) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match tokio::time::timeout(limit, api.get_opt("dummy_name")).await {
        Ok(Ok(_) | Err(kube::Error::Api(_))) => true,
        Ok(Err(_)) | Err(_) => false,
    }
}

/// Runs the probes until `shutdown` resolves.
pub async fn run(
    control: Client,
    target: Option<Client>,
    config: Config,
    freeze: Freeze,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let mut state = Reachability::default();
    let settings = config.settings;
    let limit = (settings.timeout / 5).max(Duration::from_millis(200));
    let machines: Api<Machine> = Api::namespaced(control.clone(), &config.namespace);
    tokio::pin!(shutdown);
    // A probe is the work of the reference's `machinesafetyapiserver` queue.
    let meter = crate::metrics::Metrics::reconcile_meter(metrics.as_ref(), "machinesafetyapiserver");
    loop {
        let probe = meter.pass();
        let control_up = answers(machines.clone(), limit).await;
        let target_up = match &target {
            Some(target) => answers(Api::<Node>::all(target.clone()), limit).await,
            None => true,
        };
        match state.observe(control_up && target_up, jiff::Timestamp::now(), settings) {
            Change::Freeze => {
                tracing::warn!(control_up, target_up, timeout = ?settings.timeout,
                    "an API server is unreachable: the machine controller is frozen (deletions under way continue)");
                freeze.set(true);
                if let Some(metrics) = &metrics {
                    metrics.set_frozen(true);
                }
            }
            Change::Unfreeze => {
                let reset = restart_health_clocks(&machines).await;
                freeze.set(false);
                if let Some(metrics) = &metrics {
                    metrics.set_frozen(false);
                }
                tracing::info!(
                    machines_reset = reset,
                    "the API servers answer again: the machine controller is unfrozen"
                );
            }
            Change::None => {}
        }
        probe.finish(Some(&kube::runtime::controller::Action::await_change()));
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(state.next_probe(settings)) => {}
        }
    }
}

/// Sets every Unknown machine back to Running with a fresh `lastUpdateTime`, so that its health timeout counts from
/// now; returns how many. Failures are logged: the health check still works on the rest.
async fn restart_health_clocks(machines: &Api<Machine>) -> usize {
    let list = match machines.list(&ListParams::default()).await {
        Ok(list) => list,
        Err(err) => {
            tracing::warn!(error = %err, "listing machines to restart their health clocks");
            return 0;
        }
    };
    let now = Time(jiff::Timestamp::now());
    let mut reset = 0;
    for machine in list
        .items
        .iter()
        .filter(|m| !m.is_deleting() && m.phase() == Some(MachinePhase::Unknown))
    {
        let patch = json!({ "status": {
            "currentStatus": { "phase": "Running", "lastUpdateTime": now },
            "lastOperation": {
                "description": HEALTH_TIMEOUT_RESET,
                "state": "Processing",
                "type": "HealthCheck",
                "lastUpdateTime": now,
            }
        } });
        match machines
            .patch_status(
                &machine.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => reset += 1,
            Err(err) => {
                tracing::warn!(machine = %machine.name_any(), error = %err, "restarting the health clock");
            }
        }
    }
    reset
}
