//! Initialization under faults (issue: a chaos run replaced healthy machines and adopted VMs uninitialized).
//!
//! - A provider unreachable during `InitializeMachine` (our client's `Unavailable`, `DeadlineExceeded`, `Unknown`)
//!   is retried with back-off, not left waiting for a change.
//! - A machine whose node is Ready is never failed by the creation timeout while only its initialization fails.
//! - A VM created but whose `CreateMachine` answer was lost, found by a provider that answers OK although the VM is
//!   not initialized (breaking spec 002 section 11), is initialized before it is adopted.
//!
//! Every test starts its own server, provider and controller; waits poll with deadlines.

use crate::support;

use std::time::Duration;

use mcm_api::{Machine, MachinePhase};
use mcm_driver::{DriverMethod, MachineCode};
use mcm_provider_sim::{Fault, Target};
use support::{Cluster, History, error_code, node_is_healthy, node_label, settings, wait_for};

use DriverMethod::{CreateMachine, InitializeMachine};

/// Whether the machine was ever Failed in the recorded history.
fn ever_failed(history: &History<Machine>, name: &str) -> bool {
    history.ever_failed().iter().any(|failed| failed == name)
}

/// Spec 002 section 11: "17 UNINITIALIZED | [...] | Initialization is reattempted"; the transport codes our own
/// client reports are not in the InitializeMachine table, and the reference retries every initialization error.
/// Each is retried with back-off until the provider is back; the machine runs, on its one VM, initialized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialization_transport_errors_are_retried_until_the_provider_is_back() {
    let cluster = Cluster::start(settings()).await;
    let history = History::start(cluster.machines()).await;
    cluster.create_class().await;
    let codes = [
        ("init-unavailable", MachineCode::Unavailable),
        ("init-deadline", MachineCode::DeadlineExceeded),
        ("init-unknown", MachineCode::Unknown),
    ];
    let mut faults = Vec::new();
    for (name, code) in codes {
        faults.push(
            cluster.faults.inject(
                Fault::new(InitializeMachine, code)
                    .target(Target::machines([name]))
                    .times(3),
            ),
        );
        cluster.create_machine(name).await;
    }
    for ((name, code), fault) in codes.iter().zip(faults) {
        let machine = cluster.wait_phase(name, MachinePhase::Running).await;
        assert_eq!(cluster.faults.fired(fault), 3, "{name}");
        assert_eq!(
            cluster.faults.calls_for(InitializeMachine, name),
            4,
            "{name}: three {code:?} answers, then the attempt that succeeds"
        );
        assert_eq!(cluster.faults.calls_for(CreateMachine, name), 1, "{name}: one VM");
        assert!(!ever_failed(&history, name), "{name} was never Failed");
        let recorded = history
            .of(name)
            .iter()
            .any(|seen| error_code(&seen.object) == code.name());
        assert!(
            recorded,
            "{name}: the {code:?} error was shown on the machine meanwhile"
        );
        assert_eq!(
            machine.spec.provider_id,
            format!("sim:///{}/{name}", support::NAMESPACE)
        );
    }
    assert!(
        cluster.driver.uninitialized_machines().is_empty(),
        "every VM is initialized: {:?}",
        cluster.driver.uninitialized_machines()
    );
    cluster.stop().await;
}

/// The creation timeout is the time a VM has to become a healthy node. A machine whose node is Ready stays in
/// CrashLoopBackOff while its initialization keeps failing past that timeout (a provider outage must not replace
/// healthy machines), and runs once the provider answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_with_a_ready_node_is_not_failed_by_the_creation_timeout_while_initialization_fails() {
    let mut settings = settings();
    settings.machine_creation_timeout = Duration::from_secs(4);
    let cluster = Cluster::start(settings.clone()).await;
    let history = History::start(cluster.machines()).await;
    cluster.create_class().await;
    let outage = cluster
        .faults
        .inject(Fault::new(InitializeMachine, MachineCode::Unavailable).target(Target::machines(["ready"])));
    let created = cluster.create_machine("ready").await;
    let created_at = created.metadata.creation_timestamp.expect("stored").0;
    let deadline = created_at
        + jiff::SignedDuration::try_from(settings.machine_creation_timeout).expect("a small duration");
    // The node registers and turns Ready while initialization fails.
    wait_for("the node of the machine to be Ready", async || {
        let node = cluster.nodes().get("ready").await.ok()?;
        node_is_healthy(&node).then_some(())
    })
    .await;
    // Initialization is still being retried well past the creation deadline.
    wait_for(
        "an InitializeMachine call 2s past the creation deadline",
        async || {
            let last = cluster
                .faults
                .call_times(InitializeMachine, "ready")
                .last()
                .copied()?;
            let elapsed = tokio::time::Instant::now().duration_since(last);
            let at = jiff::Timestamp::now() - jiff::SignedDuration::try_from(elapsed).ok()?;
            (at >= deadline + jiff::SignedDuration::from_secs(2)).then_some(())
        },
    )
    .await;
    let machine = cluster.machine("ready").await;
    assert_eq!(machine.phase(), Some(MachinePhase::CrashLoopBackOff));
    assert_eq!(error_code(&machine), "Unavailable");
    assert!(
        !ever_failed(&history, "ready"),
        "never Failed while its node is Ready"
    );

    cluster.faults.remove(outage);
    let machine = cluster.wait_phase("ready", MachinePhase::Running).await;
    assert_eq!(node_label(&machine), Some("ready"));
    assert_eq!(cluster.faults.calls_for(CreateMachine, "ready"), 1, "one VM");
    assert_eq!(cluster.driver.vms().len(), 1);
    assert!(cluster.driver.uninitialized_machines().is_empty());
    assert!(!ever_failed(&history, "ready"));
    cluster.stop().await;
}

/// A crash or a lost answer between CreateMachine and InitializeMachine: CreateMachine creates the VM but answers
/// `DeadlineExceeded` (as when the call timeout fires), and the provider answers GetMachineStatus OK for the VM
/// although it is not initialized. The controller does not rely on the provider alone: the VM is initialized
/// before the machine goes on, and never created twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_whose_create_answer_was_lost_is_initialized_before_it_is_adopted() {
    let cluster = Cluster::start(settings()).await;
    cluster.create_class().await;
    cluster.faults.hide_uninitialized(true);
    let lost = cluster.faults.inject(
        Fault::new(CreateMachine, MachineCode::DeadlineExceeded)
            .target(Target::machines(["lost"]))
            .after_effect()
            .times(1),
    );
    cluster.create_machine("lost").await;
    let machine = cluster.wait_phase("lost", MachinePhase::Running).await;
    assert_eq!(cluster.faults.fired(lost), 1);
    assert_eq!(
        cluster.faults.calls_for(CreateMachine, "lost"),
        1,
        "one CreateMachine, one VM"
    );
    assert_eq!(cluster.driver.vms().len(), 1);
    assert!(
        cluster.faults.calls_for(InitializeMachine, "lost") >= 1,
        "the adopted VM was initialized"
    );
    assert!(
        cluster.driver.uninitialized_machines().is_empty(),
        "every VM is initialized: {:?}",
        cluster.driver.uninitialized_machines()
    );
    assert_eq!(
        machine.spec.provider_id,
        format!("sim:///{}/lost", support::NAMESPACE)
    );
    cluster.stop().await;
}
