//! The machine lifecycle as a user sees it, against the embedded API server over HTTPS with the sim provider, its
//! kubelet and the real machine controller: adoption and initialization, one test per retry class (counting the
//! provider's calls), the creation and health timeouts, a vanished VM, the remediation guard, identity that never
//! changes, a restarted controller, and Running never before a Ready node.
//!
//! Every test starts its own server (free port, temporary directory), so they run in parallel. Waits poll with a
//! deadline; the only fixed-length waits are bounded observation windows for assertions that something does NOT
//! happen, each named as such.

use crate::support;

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use mcm_api::{
    ConditionStatus, Machine, MachinePhase, MachineSet,
    builders::{MachineBuilder, MachineSetBuilder},
    keys,
};
use mcm_apiserver::hooks::Failure;
use mcm_driver::{CreateMachineRequest, Driver, DriverMethod, MachineCode, retry};
use mcm_provider_sim::{Fault, Latency, Target};
use serde_json::json;
use support::{
    Cluster, History, NAMESPACE, description, error_code, node_conditions, node_is_healthy, node_label,
    settings, wait_for, watch_window,
};

use DriverMethod::{CreateMachine, GetMachineStatus, InitializeMachine};

/// How many calls of an auto-retried code the back-off test looks at.
const CALLS: usize = 5;

/// The codes of CreateMachine's table (spec 000) whose "Auto Retry Required" is `auto`, `OK` left out.
fn create_machine_codes(auto: bool) -> Vec<MachineCode> {
    retry::table(CreateMachine)
        .iter()
        .filter(|rule| rule.code != MachineCode::Ok && rule.auto_retry == auto)
        .map(|rule| rule.code)
        .collect()
}

fn machine_name(prefix: &str, code: MachineCode) -> String {
    format!("{prefix}-{}", code.name().to_lowercase())
}

// --- 1. Create, adopt, initialize ---------------------------------------------------------------------------------

/// Spec 000 (CreateMachine): "If VM backing the `Machine.Name` already exists, and is compatible with the specified
/// `Machine` object in the `CreateMachineRequest`, the Provider MUST reply `0 OK`"; spec 003: "Prevent actuators from
/// creating more than one instance for a machine resource during its lifetime", "Once the providerID is set, it must
/// never mutated/deleted"; spec 002 (triggerCreationFlow): "we always perform a call to [GetMachineStatus] and only
/// then conditionally perform a call to Driver.CreateMachine if there was was no machine found". A machine whose VM
/// already exists is adopted: CreateMachine is never even called for it, and its providerID is the existing VM's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_whose_vm_exists_is_adopted_without_create_machine() {
    let cluster = Cluster::start(settings()).await;
    cluster.create_class().await;

    // The VM exists before its machine (as after a crash of an earlier controller): made through the provider.
    let class = cluster.classes().get(support::CLASS).await.unwrap();
    let secret = Api::<Secret>::namespaced(cluster.client.clone(), NAMESPACE)
        .get("boot")
        .await
        .unwrap();
    let template = MachineBuilder::new("adopted")
        .namespace(NAMESPACE)
        .class(support::CLASS)
        .build();
    let vm = cluster
        .driver
        .create_machine(&CreateMachineRequest {
            machine: template,
            machine_class: class,
            secret,
        })
        .await
        .expect("the provider creates the VM");
    cluster.faults.reset_calls();

    cluster.create_machine("adopted").await;
    let machine = cluster.wait_phase("adopted", MachinePhase::Running).await;

    assert_eq!(
        machine.spec.provider_id, vm.provider_id,
        "the existing VM's providerID"
    );
    assert_eq!(node_label(&machine), Some(vm.node_name.as_str()));
    assert_eq!(
        cluster.faults.calls_for(CreateMachine, "adopted"),
        0,
        "CreateMachine is never called for an adopted VM"
    );
    assert!(cluster.faults.calls_for(GetMachineStatus, "adopted") >= 1);
    assert_eq!(cluster.driver.vms().len(), 1, "still one VM");
    cluster.stop().await;
}

/// Spec 002 section 11 (InitializeMachine errors): "0 OK | Successful"; "5 NOT_FOUND | [...] | Skip Initialization
/// and Continue"; "12 UNIMPLEMENTED | [...] | Skip Initialization and continue"; "17 UNINITIALIZED | Failed
/// Initialization | VM Instance could not be initializaed | Initialization is reattempted in next reconcile cycle |
/// Y" — and "If [GetMachineStatus] returned an error encapsulating codes.Initialization then
/// Driver.InitializeMachine will be invoked again". "The MCM MUST implement the specified error recovery behavior".
///
/// InitializeMachine is called exactly once after CreateMachine; NotFound and Unimplemented skip it (the machine
/// still runs); Uninitialized is retried (CrashLoopBackOff with the error meanwhile) until it succeeds, without a
/// second CreateMachine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_machine_is_called_once_skipped_on_not_found_or_unimplemented_and_retried_on_uninitialized()
 {
    let cluster = Cluster::start(settings()).await;
    let history = History::start(cluster.machines()).await;
    cluster.create_class().await;
    cluster.faults.fail(
        InitializeMachine,
        MachineCode::Unimplemented,
        Target::machines(["init-unimplemented"]),
    );
    cluster.faults.fail(
        InitializeMachine,
        MachineCode::NotFound,
        Target::machines(["init-notfound"]),
    );
    let uninitialized = cluster.faults.inject(
        Fault::new(InitializeMachine, MachineCode::Uninitialized)
            .target(Target::machines(["init-uninitialized"]))
            .times(2),
    );
    let names = [
        "init-ok",
        "init-unimplemented",
        "init-notfound",
        "init-uninitialized",
    ];
    for name in names {
        cluster.create_machine(name).await;
    }
    for name in names {
        let machine = cluster.wait_phase(name, MachinePhase::Running).await;
        assert_eq!(machine.spec.provider_id, format!("sim:///{NAMESPACE}/{name}"));
        assert_eq!(
            cluster.faults.calls_for(CreateMachine, name),
            1,
            "{name}: one CreateMachine"
        );
    }
    for name in ["init-ok", "init-unimplemented", "init-notfound"] {
        assert_eq!(
            cluster.faults.calls_for(InitializeMachine, name),
            1,
            "{name}: InitializeMachine once, right after CreateMachine"
        );
    }
    assert_eq!(cluster.faults.fired(uninitialized), 2);
    assert_eq!(
        cluster.faults.calls_for(InitializeMachine, "init-uninitialized"),
        3,
        "two Uninitialized answers, then the attempt that succeeds"
    );
    let retrying = history.of("init-uninitialized");
    let failed = retrying
        .iter()
        .find(|s| error_code(&s.object) == "Uninitialized")
        .expect("the Uninitialized error was recorded on the machine");
    assert_eq!(failed.object.phase(), Some(MachinePhase::CrashLoopBackOff));
    assert!(
        description(&failed.object).contains("Initialize VM Instance"),
        "{}",
        description(&failed.object)
    );
    assert_eq!(cluster.driver.vms().len(), names.len(), "one VM per machine");
    cluster.stop().await;
}

// --- 2. One test per retry class ----------------------------------------------------------------------------------

/// Spec 000 (CreateMachine errors): "The MCM MUST implement the specified error recovery behavior when it
/// encounters the machine error code", for the codes with "Auto Retry Required" Y — "2 UNKNOWN", "4
/// DEADLINE_EXCEEDED", "10 ABORTED", "14 UNAVAILABLE": "Retry operation after sometime" (with exponential back-off:
/// docs/machine-controller-decisions.md). Each code fails one machine's CreateMachine: it is called again and again,
/// the gaps between the calls never shrink, the error is on lastOperation (errorCode, CrashLoopBackOff) and as an
/// Event; once the provider recovers, the machine runs with one VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_machine_errors_marked_auto_retry_are_retried_with_growing_gaps() {
    let cluster = Cluster::start(settings()).await;
    cluster.create_class().await;
    let codes = create_machine_codes(true);
    assert_eq!(
        codes,
        [
            MachineCode::Unknown,
            MachineCode::DeadlineExceeded,
            MachineCode::Aborted,
            MachineCode::Unavailable
        ]
    );
    let mut faults = Vec::new();
    for &code in &codes {
        let name = machine_name("retry", code);
        faults.push(
            cluster
                .faults
                .fail(CreateMachine, code, Target::machines([name.as_str()])),
        );
        cluster.create_machine(&name).await;
    }
    for &code in &codes {
        let name = machine_name("retry", code);
        let times = wait_for(&format!("{name}: {CALLS} CreateMachine calls"), async || {
            let times = cluster.faults.call_times(CreateMachine, &name);
            (times.len() >= CALLS).then_some(times)
        })
        .await;
        // The first calls only: their delays stay below the cap (0.2s, 0.4s, 0.8s, 1.6s against 2s); capped
        // delays are equal up to the jitter.
        let gaps: Vec<Duration> = times[..CALLS].windows(2).map(|w| w[1] - w[0]).collect();
        for pair in gaps.windows(2) {
            assert!(
                pair[1] >= pair[0],
                "{name}: the gaps between retries never shrink: {gaps:?}"
            );
        }
        let machine = cluster.machine(&name).await;
        assert_eq!(
            error_code(&machine),
            code.name(),
            "{name}: {}",
            description(&machine)
        );
        assert_eq!(machine.phase(), Some(MachinePhase::CrashLoopBackOff));
        assert!(
            cluster
                .events_of(&name)
                .await
                .iter()
                .any(|e| e.type_.as_deref() == Some("Warning")
                    && e.message.as_deref().unwrap_or_default().contains(code.name())),
            "{name}: a Warning Event names the code"
        );
    }

    // The provider recovers: every machine runs, each with exactly one VM.
    for fault in faults {
        cluster.faults.remove(fault);
    }
    for &code in &codes {
        let name = machine_name("retry", code);
        let machine = cluster.wait_phase(&name, MachinePhase::Running).await;
        assert_eq!(machine.spec.provider_id, format!("sim:///{NAMESPACE}/{name}"));
    }
    assert_eq!(cluster.driver.vms().len(), codes.len());
    cluster.stop().await;
}

/// Spec 000 (CreateMachine errors): "The MCM MUST implement the specified error recovery behavior when it
/// encounters the machine error code", for the codes with "Auto Retry Required" N — e.g. "3 INVALID_ARGUMENT |
/// [...] | Update providerSpec to fix issues. | N", "8 RESOURCE_EXHAUSTED | [...] | Enhance resource limits [...] |
/// N". Such a call is made once; the error is on lastOperation (errorCode) and as an Event; the call is not repeated
/// while nothing changes (however often the machine is reconciled), and is made again once the MachineClass
/// changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_machine_errors_not_marked_auto_retry_wait_for_a_class_change() {
    let cluster = Cluster::start(settings()).await;
    cluster.create_class().await;
    let codes = create_machine_codes(false);
    assert!(codes.contains(&MachineCode::InvalidArgument) && codes.contains(&MachineCode::ResourceExhausted));
    for &code in &codes {
        let name = machine_name("await", code);
        cluster
            .faults
            .fail(CreateMachine, code, Target::machines([name.as_str()]));
        cluster.create_machine(&name).await;
    }
    for &code in &codes {
        let name = machine_name("await", code);
        let machine = cluster
            .wait_machine(&name, "the error on lastOperation", |m| {
                error_code(m) == code.name()
            })
            .await;
        assert!(
            description(&machine).contains(code.name()),
            "{name}: {}",
            description(&machine)
        );
        wait_for(&format!("{name}: a Warning Event"), async || {
            cluster
                .events_of(&name)
                .await
                .iter()
                .any(|e| e.type_.as_deref() == Some("Warning"))
                .then_some(())
        })
        .await;
    }

    // Nothing changes but the machines are reconciled (an annotation each): no call is repeated. Observed for ten
    // times the first back-off delay, far longer than an auto-retried code waits.
    for &code in &codes {
        let name = machine_name("await", code);
        cluster
            .patch_machine(
                &name,
                json!({ "metadata": { "annotations": { "touched": "yes" } } }),
            )
            .await;
    }
    let repeated = watch_window(settings().retry.backoff_base * 10, async || {
        codes
            .iter()
            .map(|&code| machine_name("await", code))
            .find(|name| cluster.faults.calls_for(CreateMachine, name) > 1)
    })
    .await;
    assert_eq!(repeated, None, "no CreateMachine repeated without a change");
    for &code in &codes {
        let name = machine_name("await", code);
        assert_eq!(cluster.faults.calls_for(CreateMachine, &name), 1, "{name}");
    }

    // The user changes the class: every machine is tried again, once.
    cluster
        .classes()
        .patch(
            support::CLASS,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "providerSpec": { "rootFsSize": 20 } })),
        )
        .await
        .unwrap();
    for &code in &codes {
        let name = machine_name("await", code);
        wait_for(
            &format!("{name}: CreateMachine again after the class changed"),
            async || (cluster.faults.calls_for(CreateMachine, &name) >= 2).then_some(()),
        )
        .await;
    }
    assert!(cluster.driver.vms().is_empty(), "every call failed: no VM");
    cluster.stop().await;
}

// --- 3. Timeouts --------------------------------------------------------------------------------------------------

/// Spec 002 (FAQ, timeouts): "[MachineCreationTimeout]: Amount of time after which a machine creation is declared
/// Failed"; (triggerCreationFlow) "the machine phase may either be CrashLoopBackOff or move to Failed if the
/// difference between current time and the machine.CreationTimestamp has exceeded the configured
/// MachineCreationTimeout". The annotation `node.machine.sapcloud.io/effective-creation-timeout` overrides the flag
/// for its machine. A machine whose creation keeps failing — retried (Unavailable) or waiting for a change
/// (InvalidArgument, no further call) — goes Failed at its timeout with lastOperation saying so; so does a machine
/// whose node never becomes Ready (it failed to join); a machine with a longer timeout is still retrying then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creation_timeout_fails_the_machine_and_the_annotation_overrides_the_flag() {
    let mut settings = settings();
    settings.machine_creation_timeout = Duration::from_secs(4);
    let cluster = Cluster::start(settings).await;
    cluster.create_class().await;
    let failing = Target::machines(["timeout-flag", "timeout-annotated", "timeout-long"]);
    cluster
        .faults
        .fail(CreateMachine, MachineCode::Unavailable, failing);
    cluster.faults.fail(
        CreateMachine,
        MachineCode::InvalidArgument,
        Target::machines(["timeout-awaiting"]),
    );
    // This machine's VM comes up, but its node never becomes Ready.
    cluster.faults.set_node_not_ready("timeout-join");
    let annotated = |name: &str, timeout: &str| {
        json!({ "metadata": { "name": name, "annotations": {
            keys::annotations::EFFECTIVE_CREATION_TIMEOUT: timeout
        } } })
    };
    cluster.create_machine("timeout-flag").await;
    cluster
        .create_machine_from(annotated("timeout-annotated", "2s"))
        .await;
    cluster.create_machine_from(annotated("timeout-long", "1h")).await;
    cluster.create_machine("timeout-awaiting").await;
    cluster.create_machine("timeout-join").await;

    let flag = cluster.wait_phase("timeout-flag", MachinePhase::Failed).await;
    assert!(
        description(&flag).contains("failed to be created in 4s"),
        "{}",
        description(&flag)
    );
    assert!(
        description(&flag).contains("Unavailable"),
        "{}",
        description(&flag)
    );
    assert_eq!(error_code(&flag), "Unavailable");
    let long = cluster.machine("timeout-long").await;
    assert_eq!(
        long.phase(),
        Some(MachinePhase::CrashLoopBackOff),
        "the 1h annotation keeps it retrying"
    );
    let calls_when_failed = cluster.faults.calls_for(CreateMachine, "timeout-flag");

    let annotated = cluster
        .wait_phase("timeout-annotated", MachinePhase::Failed)
        .await;
    assert!(
        description(&annotated).contains("failed to be created in 2s"),
        "the annotation's timeout applies: {}",
        description(&annotated)
    );

    let awaiting = cluster.wait_phase("timeout-awaiting", MachinePhase::Failed).await;
    assert!(
        description(&awaiting).contains("failed to be created in 4s"),
        "{}",
        description(&awaiting)
    );
    assert_eq!(
        cluster.faults.calls_for(CreateMachine, "timeout-awaiting"),
        1,
        "failed on the timer, without another provider call"
    );

    let join = cluster.wait_phase("timeout-join", MachinePhase::Failed).await;
    assert!(
        description(&join).contains("failed to join the cluster in 4s"),
        "{}",
        description(&join)
    );

    // A Failed machine is not created any more (observed while the other machines timed out); the machine with
    // the long timeout still retries.
    assert_eq!(
        cluster.faults.calls_for(CreateMachine, "timeout-flag"),
        calls_when_failed,
        "no CreateMachine for a Failed machine"
    );
    assert_eq!(
        cluster.machine("timeout-long").await.phase(),
        Some(MachinePhase::CrashLoopBackOff)
    );
    cluster.stop().await;
}

/// Spec 002 (FAQ): "If any of the above checks fails, the machine turns to Unknown"; "[MachineHealthTimeout]: Amount
/// of time after which an unhealthy machine is declared Failed and the machine is replaced by MachineSet". A Running
/// machine whose node goes NotReady turns Unknown, then Failed once the health timeout has passed, with
/// lastOperation and an Event saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_node_makes_its_machine_unknown_then_failed_after_the_health_timeout() {
    let mut settings = settings();
    settings.machine_health_timeout = Duration::from_secs(3);
    let cluster = Cluster::start(settings).await;
    cluster.create_class().await;
    cluster.create_machine("sick").await;
    cluster.wait_phase("sick", MachinePhase::Running).await;

    cluster.faults.set_node_not_ready("sick");
    let unknown = cluster.wait_phase("sick", MachinePhase::Unknown).await;
    assert!(
        description(&unknown).contains("is unhealthy - changing MachineState to Unknown"),
        "{}",
        description(&unknown)
    );
    let failed = cluster.wait_phase("sick", MachinePhase::Failed).await;
    assert!(
        description(&failed).contains("is not healthy since 3s"),
        "{}",
        description(&failed)
    );
    let ready = failed
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .expect("the node's conditions are on the machine");
    assert_eq!(ready.status, "False");
    wait_for("a Warning Event about the failure", async || {
        cluster
            .events_of("sick")
            .await
            .iter()
            .any(|e| e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some("Failed"))
            .then_some(())
    })
    .await;
    assert_eq!(cluster.faults.calls_for(CreateMachine, "sick"), 1);
    cluster.stop().await;
}

// --- 4. A vanished VM ---------------------------------------------------------------------------------------------

/// Spec 003: "Failed: [...] Exists() is False and machine has a providerID/address"; "Prevent actuators from
/// creating more than one instance for a machine resource during its lifetime"; "Once the providerID is set, it
/// must never mutated/deleted".
///
/// A Running machine's VM vanishes behind the controller's back: its node goes silent, and when the machine would
/// turn Unknown the controller asks the provider once, learns the VM is gone, and fails the machine at once (not
/// after the health timeout) with a message; it keeps its providerID, and CreateMachine is never called for it
/// again. A machine still in creation (providerID recorded, initialization being retried) whose VM vanishes is
/// Failed at its next look, saying that the VM was not found, and gets no second VM either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_vm_fails_its_machine_and_is_never_created_again() {
    let mut settings = settings();
    // Long enough that a Failed within it can only come from the vanished-VM check.
    settings.machine_health_timeout = Duration::from_mins(10);
    let cluster = Cluster::start(settings).await;
    cluster.create_class().await;
    let history = History::start(cluster.machines()).await;
    cluster.faults.fail(
        InitializeMachine,
        MachineCode::Uninitialized,
        Target::machines(["half"]),
    );
    cluster.create_machine("gone").await;
    cluster.create_machine("half").await;
    let running = cluster.wait_phase("gone", MachinePhase::Running).await;
    let half = cluster
        .wait_machine("half", "recorded VM, initialization retried", |m| {
            !m.spec.provider_id.is_empty() && m.phase() == Some(MachinePhase::CrashLoopBackOff)
        })
        .await;

    assert_eq!(cluster.faults.vanish("gone"), 1);
    assert_eq!(cluster.faults.vanish("half"), 1);

    let failed = cluster.wait_phase("half", MachinePhase::Failed).await;
    assert!(
        description(&failed).contains("was not found at the provider"),
        "{}",
        description(&failed)
    );
    assert_eq!(failed.spec.provider_id, half.spec.provider_id);

    let failed = cluster.wait_phase("gone", MachinePhase::Failed).await;
    assert!(
        description(&failed).contains("was not found at the provider"),
        "{}",
        description(&failed)
    );
    assert!(
        !history
            .of("gone")
            .iter()
            .any(|s| s.object.phase() == Some(MachinePhase::Unknown)),
        "failed at once, never Unknown"
    );
    assert_eq!(failed.spec.provider_id, running.spec.provider_id);
    assert_eq!(node_label(&failed), node_label(&running));

    for name in ["gone", "half"] {
        assert_eq!(
            cluster.faults.calls_for(CreateMachine, name),
            1,
            "{name}: never a second CreateMachine"
        );
    }
    assert!(cluster.driver.vms().is_empty(), "no VM came back");
    cluster.stop().await;
}

// --- 5. Remediation -----------------------------------------------------------------------------------------------

/// The group key's owner: a MachineSet (no MachineSet controller runs in these tests; the set only owns).
async fn create_machine_set(cluster: &Cluster, name: &str, replicas: i32) -> MachineSet {
    let set = MachineSetBuilder::new(name)
        .replicas(replicas)
        .matching([("pool", name)])
        .class(support::CLASS)
        .build();
    cluster
        .sets()
        .create(&PostParams::default(), &set)
        .await
        .expect("the MachineSet is created")
}

/// The phases of the group's machines after each observed version, in resourceVersion order: the largest number
/// of Failed machines at any observed moment.
fn most_failed_at_once(history: &History<Machine>) -> (usize, Vec<String>) {
    let mut phases: BTreeMap<String, Option<MachinePhase>> = BTreeMap::new();
    let mut most = (0, Vec::new());
    for seen in history.versions() {
        let name = seen.object.metadata.name.clone().unwrap_or_default();
        if seen.deleted {
            phases.remove(&name);
        } else {
            phases.insert(name, seen.object.phase());
        }
        let failed: Vec<String> = phases
            .iter()
            .filter(|(_, p)| **p == Some(MachinePhase::Failed))
            .map(|(n, _)| n.clone())
            .collect();
        if failed.len() > most.0 {
            most = (failed.len(), failed);
        }
    }
    most
}

/// Spec 002 (FAQ): "Currently MCM replaces only 1 machine at a time per machinedeployment. This means until the
/// particular Unknown machine get terminated and its replacement joins, no other Unknown machine would be removed.
/// [...] One reason for this rate limited replacement was to ensure that in case of network failures, where node's
/// kubelet can't reach out to kube-apiserver, all nodes are not removed together i.e. meltdown protection"; "Failed:
/// Machine health checks have failed for a prolonged time. Hence it is declared failed by Machine controller in a
/// rate limited fashion".
///
/// Ten machines of one MachineSet: all unhealthy at once → none goes Failed (observed for several health timeouts);
/// one at a time → one Failed at a time, the next only once the Failed one is gone (deleted, as its replacement
/// would); two at once → one Failed, the other after it is gone. A watcher checks every version: never two Failed
/// machines of the group at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // three scenarios on one group, in order
async fn the_remediation_guard_fails_one_machine_of_a_group_at_a_time_and_none_when_all_are_unhealthy() {
    let mut settings = settings();
    let health_timeout = Duration::from_secs(2);
    settings.machine_health_timeout = health_timeout;
    let cluster = Cluster::start(settings).await;
    cluster.create_class().await;
    let history = History::start(cluster.machines()).await;
    let set = create_machine_set(&cluster, "workers", 10).await;
    let names: Vec<String> = (0..10).map(|i| format!("w-{i}")).collect();
    for name in &names {
        cluster
            .create_machine_from(json!({ "metadata": {
                "name": name,
                "labels": { "pool": "workers" },
                "ownerReferences": [{
                    "apiVersion": "machine.sapcloud.io/v1alpha1",
                    "kind": "MachineSet",
                    "name": "workers",
                    "uid": set.metadata.uid.clone().unwrap(),
                    "controller": true,
                    "blockOwnerDeletion": true
                }]
            } }))
            .await;
    }
    for name in &names {
        cluster.wait_phase(name, MachinePhase::Running).await;
    }
    let group_key = mcm_core::remediation::group_key(&cluster.machine("w-0").await);
    for name in &names {
        assert_eq!(
            mcm_core::remediation::group_key(&cluster.machine(name).await),
            group_key,
            "one group"
        );
    }
    let phase_of = async |name: &str| cluster.machine(name).await.phase();

    // All ten unhealthy at once (a partition): none is replaced.
    for name in &names {
        cluster.faults.set_node_not_ready(name);
    }
    for name in &names {
        cluster.wait_phase(name, MachinePhase::Unknown).await;
    }
    let failed = watch_window(health_timeout * 4, async || {
        history
            .versions()
            .into_iter()
            .find(|s| s.object.phase() == Some(MachinePhase::Failed))
            .map(|s| s.object.metadata.name.unwrap_or_default())
    })
    .await;
    assert_eq!(
        failed, None,
        "no machine is Failed while the whole group is unhealthy"
    );
    for name in &names {
        cluster.faults.set_node_ready(name);
    }
    for name in &names {
        cluster.wait_phase(name, MachinePhase::Running).await;
    }

    // One at a time: w-0 fails; w-1, unhealthy meanwhile, waits until w-0 is gone.
    cluster.faults.set_node_not_ready("w-0");
    cluster.wait_phase("w-0", MachinePhase::Failed).await;
    cluster.faults.set_node_not_ready("w-1");
    cluster.wait_phase("w-1", MachinePhase::Unknown).await;
    let early = watch_window(health_timeout * 3, async || {
        (phase_of("w-1").await == Some(MachinePhase::Failed)).then_some(())
    })
    .await;
    assert_eq!(early, None, "w-1 stays Unknown while w-0 is Failed");
    cluster
        .machines()
        .delete("w-0", &DeleteParams::default())
        .await
        .unwrap();
    cluster.wait_gone("w-0").await;
    cluster.wait_phase("w-1", MachinePhase::Failed).await;
    cluster
        .machines()
        .delete("w-1", &DeleteParams::default())
        .await
        .unwrap();
    cluster.wait_gone("w-1").await;

    // Two at once (2 of 8, below the unhealthy share): one fails, the other after it is gone.
    cluster.faults.set_node_not_ready("w-2");
    cluster.faults.set_node_not_ready("w-3");
    let first = wait_for("one of w-2 and w-3 to fail", async || {
        for name in ["w-2", "w-3"] {
            if phase_of(name).await == Some(MachinePhase::Failed) {
                return Some(name);
            }
        }
        None
    })
    .await;
    let second = if first == "w-2" { "w-3" } else { "w-2" };
    let both = watch_window(health_timeout * 3, async || {
        (phase_of(second).await == Some(MachinePhase::Failed)).then_some(())
    })
    .await;
    assert_eq!(both, None, "{second} waits while {first} is Failed");
    assert_eq!(phase_of(second).await, Some(MachinePhase::Unknown));
    cluster
        .machines()
        .delete(first, &DeleteParams::default())
        .await
        .unwrap();
    cluster.wait_gone(first).await;
    cluster.wait_phase(second, MachinePhase::Failed).await;

    let (most, which) = most_failed_at_once(&history);
    assert!(
        most <= 1,
        "at most one Failed machine of the group at any observed moment, saw {which:?}"
    );
    for name in ["w-4", "w-5", "w-6", "w-7", "w-8", "w-9"] {
        assert_eq!(phase_of(name).await, Some(MachinePhase::Running));
    }
    cluster.stop().await;
}

// --- 6. Identity --------------------------------------------------------------------------------------------------

/// Spec 003 (actuator invariants): "Once the nodeRef is set, it must never be mutated/deleted. Once the providerID is
/// set, it must never mutated/deleted." Every observed version of every machine, through creation, Running, a node
/// NotReady/Ready flap and a node whose heartbeats stop and resume: providerID and the `node` label, once set, never
/// change or go away; the node's providerID is the machine's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_id_and_node_label_never_change_once_set() {
    let cluster = Cluster::start(settings()).await;
    cluster.create_class().await;
    let machines = History::start(cluster.machines()).await;
    let names = ["id-0", "id-1", "id-2"];
    for name in names {
        cluster.create_machine(name).await;
    }
    for name in names {
        cluster.wait_phase(name, MachinePhase::Running).await;
    }

    // A NotReady/Ready flap.
    cluster.faults.set_node_not_ready("id-0");
    cluster.wait_phase("id-0", MachinePhase::Unknown).await;
    cluster.faults.set_node_ready("id-0");
    let rejoined = cluster.wait_phase("id-0", MachinePhase::Running).await;
    assert!(
        description(&rejoined).contains("re-joined"),
        "{}",
        description(&rejoined)
    );
    // A silent node (the server's node lifecycle turns it Unknown), then heartbeats again.
    cluster.faults.stop_heartbeats("id-1");
    cluster.wait_phase("id-1", MachinePhase::Unknown).await;
    cluster.faults.resume_heartbeats("id-1");
    cluster.wait_phase("id-1", MachinePhase::Running).await;

    for name in names {
        let versions = machines.of(name);
        assert!(
            versions.len() >= 4,
            "{name}: {} versions observed",
            versions.len()
        );
        let mut provider_id = String::new();
        let mut node: Option<String> = None;
        for seen in versions.iter().filter(|s| !s.deleted) {
            let machine = &seen.object;
            if provider_id.is_empty() {
                provider_id.clone_from(&machine.spec.provider_id);
            } else {
                assert_eq!(
                    machine.spec.provider_id, provider_id,
                    "{name}: providerID changed at version {}",
                    seen.rv
                );
            }
            match (&node, node_label(machine)) {
                (None, label) => node = label.map(str::to_owned),
                (Some(set), label) => assert_eq!(
                    label,
                    Some(set.as_str()),
                    "{name}: node label changed at version {}",
                    seen.rv
                ),
            }
        }
        assert_eq!(provider_id, format!("sim:///{NAMESPACE}/{name}"));
        assert_eq!(node.as_deref(), Some(name));
        let node = cluster.nodes().get(name).await.unwrap();
        assert_eq!(
            node.spec.and_then(|s| s.provider_id),
            Some(provider_id),
            "the node's providerID is the machine's"
        );
        assert_eq!(cluster.faults.calls_for(CreateMachine, name), 1);
    }
    assert_eq!(cluster.driver.vms().len(), names.len());
    cluster.stop().await;
}

// --- 7. A restarted controller ------------------------------------------------------------------------------------

/// Spec 003: "Prevent actuators from creating more than one instance for a machine resource during its lifetime";
/// spec 000 (CreateMachine): "The provider MUST have a unique way to map a `machine object` to a `VM`". A controller
/// that dies after its provider created the VMs but before it could record them on the machines (every write of it
/// fails), and a new controller started against the same server and provider: every machine runs with exactly one
/// VM, and CreateMachine was called once per machine. Then a controller stopped while its CreateMachine calls are
/// in flight (slow provider): the new one repeats none of them either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_creates_nothing_twice() {
    let mut cluster = Cluster::start_without_controller(settings()).await;
    cluster.create_class().await;
    let names: Vec<String> = (0..4).map(|i| format!("restart-{i}")).collect();
    for name in &names {
        // As a MachineSet creates them: the finalizer is on already, so the controller's first write is the record
        // of the VM.
        cluster
            .create_machine_from(json!({ "metadata": {
                "name": name,
                "finalizers": [keys::finalizers::MACHINE_CONTROLLER_MANAGER]
            } }))
            .await;
    }

    // First controller: the VMs get created, every write to the API server fails, then the controller dies.
    cluster.server().hooks().set_failure(Some(Failure {
        share: 1.0,
        status: 503,
        writes_only: true,
    }));
    cluster.start_controller();
    wait_for("a VM for every machine", async || {
        (cluster.driver.vms().len() == names.len()).then_some(())
    })
    .await;
    cluster.kill_controller().await;
    // A record the dead controller had sent may still land once writes work again (a request in flight at the
    // crash); the others were never recorded. Either way the VMs exist and nothing may create them again.
    cluster.server().hooks().set_failure(None);

    // Second controller: adopts them.
    cluster.start_controller();
    for name in &names {
        let machine = cluster.wait_phase(name, MachinePhase::Running).await;
        assert_eq!(machine.spec.provider_id, format!("sim:///{NAMESPACE}/{name}"));
    }

    // Third and fourth: stopped while slow CreateMachine calls are in flight.
    cluster.stop_controller().await;
    cluster
        .faults
        .set_latency(CreateMachine, Latency::Fixed(Duration::from_secs(1)));
    let slow: Vec<String> = (0..3).map(|i| format!("slow-{i}")).collect();
    for name in &slow {
        cluster.create_machine(name).await;
    }
    cluster.start_controller();
    wait_for("every slow CreateMachine in flight", async || {
        slow.iter()
            .all(|name| cluster.faults.calls_for(CreateMachine, name) == 1)
            .then_some(())
    })
    .await;
    cluster.stop_controller().await;
    cluster.start_controller();
    for name in &slow {
        cluster.wait_phase(name, MachinePhase::Running).await;
    }

    let mut vms_per_machine: BTreeMap<String, usize> = BTreeMap::new();
    for vm in cluster.driver.vms() {
        *vms_per_machine.entry(vm.machine_name).or_default() += 1;
    }
    for name in names.iter().chain(&slow) {
        assert_eq!(vms_per_machine.get(name), Some(&1), "{name}: exactly one VM");
    }
    assert_eq!(vms_per_machine.len(), names.len() + slow.len());
    let creates: u64 = names
        .iter()
        .chain(&slow)
        .map(|name| cluster.faults.calls_for(CreateMachine, name))
        .sum();
    assert_eq!(
        creates,
        (names.len() + slow.len()) as u64,
        "one CreateMachine per machine"
    );
    cluster.stop().await;
}

// --- 8. Running only after Ready ----------------------------------------------------------------------------------

/// Spec 003: "Running: Exists() is True. Machine has been given providerID/address. Machine has status.nodeRef";
/// spec 002 (FAQ, phases): "Pending: Machine creation call has succeeded. MCM is waiting for machine to join the
/// cluster"; "Running: Machine creation call has succeeded. Machine has joined the cluster successfully". Nodes that
/// come up NotReady, or Ready with a KernelDeadlock: their machines stay Pending (the controller has seen the
/// conditions: they are copied onto the machine) and become Running only after the node is healthy. Watchers on
/// machines and nodes check every version: each Running version of a machine comes after (in the server's
/// resourceVersion order) a healthy version of its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_is_never_reached_before_the_node_is_ready() {
    let cluster = Cluster::start(settings()).await;
    cluster.create_class().await;
    let machines = History::start(cluster.machines()).await;
    let nodes = History::start(cluster.nodes()).await;
    cluster.faults.set_node_not_ready("late-0");
    cluster.faults.set_node_not_ready("late-1");
    cluster
        .faults
        .set_condition("late-2", "KernelDeadlock", ConditionStatus::True);
    let names = ["late-0", "late-1", "late-2", "prompt"];
    for name in names {
        cluster.create_machine(name).await;
    }
    cluster.wait_phase("prompt", MachinePhase::Running).await;
    for (name, condition, status) in [
        ("late-0", "Ready", "False"),
        ("late-1", "Ready", "False"),
        ("late-2", "KernelDeadlock", "True"),
    ] {
        let machine = cluster
            .wait_machine(name, "the node's conditions on the machine", |m| {
                m.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == condition && c.status == status)
                })
            })
            .await;
        assert_eq!(
            machine.phase(),
            Some(MachinePhase::Pending),
            "{name}: Pending while its node is unhealthy"
        );
    }
    cluster.faults.set_node_ready("late-0");
    cluster.wait_phase("late-0", MachinePhase::Running).await;
    cluster.faults.clear_condition("late-2", "KernelDeadlock");
    cluster.wait_phase("late-2", MachinePhase::Running).await;
    cluster.faults.set_node_ready("late-1");
    cluster.wait_phase("late-1", MachinePhase::Running).await;

    for name in names {
        let node_versions = nodes.of(name);
        let running: Vec<u64> = machines
            .of(name)
            .iter()
            .filter(|s| s.object.phase() == Some(MachinePhase::Running))
            .map(|s| s.rv)
            .collect();
        assert!(!running.is_empty(), "{name}: Running observed");
        for rv in running {
            let node_before = node_versions.iter().rev().find(|n| n.rv < rv);
            let node_before =
                node_before.unwrap_or_else(|| panic!("{name}: Running at {rv} before its node existed"));
            assert!(
                node_is_healthy(&node_before.object),
                "{name}: Running at version {rv} while its node (version {}) had {:?}",
                node_before.rv,
                node_conditions(&node_before.object)
            );
        }
    }
    cluster.stop().await;
}
