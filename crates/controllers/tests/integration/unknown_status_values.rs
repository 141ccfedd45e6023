//! Status values this build does not know, as a newer reference, a mixed rollout or a rollback stores them (the
//! reference's CRDs put no `enum` on status strings): the controllers still see the machine, never read the unknown
//! phase as Failed or time it out, and take it back to Running from what they observe once its node is healthy.

use crate::support;

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use mcm_api::MachinePhase;
use mcm_driver::DriverMethod::CreateMachine;
use serde_json::json;
use support::{Cluster, settings, watch_window};

const NEWER_PHASE: &str = "Hibernating";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_in_a_phase_written_by_a_newer_version_is_never_failed_and_runs_again_once_healthy() {
    let mut settings = settings();
    let health_timeout = Duration::from_secs(3);
    settings.machine_health_timeout = health_timeout;
    let cluster = Cluster::start(settings).await;
    cluster.create_class().await;
    cluster.create_machine("newer").await;
    cluster.wait_phase("newer", MachinePhase::Running).await;

    // A newer version puts the machine into a phase we do not know while its node is unhealthy. The node goes
    // NotReady first and the controller has taken that in (Unknown) before the newer version's write, so that no
    // decision made on the older Running state lands after it.
    cluster.faults.set_node_not_ready("newer");
    cluster.wait_phase("newer", MachinePhase::Unknown).await;
    let status = json!({ "status": {
        "currentStatus": { "phase": NEWER_PHASE, "lastUpdateTime": "2026-01-01T00:00:00Z" },
        "lastOperation": { "state": "Queued", "type": "Hibernate", "description": "written by a newer version",
                           "lastUpdateTime": "2026-01-01T00:00:00Z" }
    }});
    cluster
        .machines()
        .patch_status("newer", &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("the schema stores a status value it does not know");

    // Several health timeouts (counted from a lastUpdateTime long past): never Failed, never Unknown, never gone.
    let changed = watch_window(health_timeout * 4, async || {
        let machine = cluster.machines().get_opt("newer").await.ok()?;
        match machine {
            None => Some("deleted".to_owned()),
            Some(m) if m.phase().map(|p| p.to_string()).as_deref() != Some(NEWER_PHASE) => {
                Some(format!("{:?}", m.phase()))
            }
            Some(_) => None,
        }
    })
    .await;
    assert_eq!(
        changed, None,
        "an unknown phase with an unhealthy node is left as it is"
    );

    // The node recovers: the controller sees the machine (its watch decoded it) and makes it Running.
    cluster.faults.set_node_ready("newer");
    let running = cluster.wait_phase("newer", MachinePhase::Running).await;
    let operation = &running.status.as_ref().expect("a status").last_operation;
    assert_ne!(operation.description, "written by a newer version");
    assert_eq!(
        cluster.faults.calls_for(CreateMachine, "newer"),
        1,
        "the VM is kept"
    );
    cluster.stop().await;
}
