//! The outage and fault suite: the provider answering every code of spec 000 (1–17) to every call of creation
//! and deletion, the provider unreachable for longer than the call timeout and slower than it (over gRPC, our own
//! client's codes), a watch that stalls during scale-up and scale-down, and node heartbeats stopping for all or
//! some nodes. Each case asserts the goal figures: 0 replacements of healthy machines (no machine ever Failed, no
//! healthy machine deleted), 0 double-creates (never two VMs for a machine), and recovery by itself (every machine
//! Running, or gone when deleted, with its VM, once the fault is over — without anyone touching an object).
//!
//! The API server outage itself is `apiserver_outage.rs` (freeze on and off) and `leader_election.rs` (the lease);
//! docs/reliability.md says which wins.
//!
//! Every case starts its own server, provider and controllers; waits poll with deadlines; the only fixed-length
//! waits are bounded observation windows for assertions that something does NOT happen, named as such.

use crate::support;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use kube::{
    ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use mcm_api::{Machine, MachinePhase, MachineSet, builders::MachineSetBuilder};
use mcm_controllers::machinedeployment;
use mcm_driver::{Driver, DriverMethod, MachineCode};
use mcm_grpc::{ClientOptions, Endpoint, GrpcDriver, ProviderInfo};
use mcm_provider_sim::{Fault, Latency, Target};
use serde_json::json;
use support::{Cluster, History, NAMESPACE, error_code, settings, wait_for, watch_window};
use tokio::{sync::oneshot, task::JoinHandle};

use DriverMethod::{CreateMachine, DeleteMachine, GetMachineStatus, InitializeMachine};

/// How many times each injected fault fires before the provider answers normally again.
const FIRES: u64 = 2;

/// Every non-OK machine code of spec 000 (1–16 are the gRPC codes, 17 is Uninitialized).
fn codes() -> Vec<MachineCode> {
    (1..=17)
        .map(|n| MachineCode::from_number(n).expect("codes 1 to 17 exist"))
        .collect()
}

/// Test settings in which a code that waits for a change is looked at again within a second (the safety resync),
/// so that recovery by itself is observable.
fn fast_settings() -> mcm_core::timeouts::ControllerSettings {
    let mut settings = settings();
    settings.retry.await_change_resync = Duration::from_secs(1);
    settings.retry.resource_exhausted_retry = Duration::from_secs(1);
    settings
}

/// A machine name for a code (`<prefix>-<number>`).
fn name_for(prefix: &str, code: MachineCode) -> String {
    format!("{prefix}-{}", code.number())
}

/// The goal figures: no machine ever Failed in `history`, and at most one VM per machine at the provider.
fn assert_goal_figures(cluster: &Cluster, history: &History<Machine>, case: &str) {
    let failed = history.ever_failed();
    assert!(
        failed.is_empty(),
        "{case}: machines were Failed (replaced): {failed:?}"
    );
    let mut vms: BTreeMap<String, usize> = BTreeMap::new();
    for vm in cluster.driver.vms() {
        *vms.entry(vm.machine_name.clone()).or_default() += 1;
    }
    let doubled: Vec<_> = vms.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "{case}: machines with two VMs: {doubled:?}");
}

/// Each code, answered `FIRES` times by `method` to one machine each during creation: every machine runs on one
/// VM in the end, none is ever Failed, and every VM is initialized unless InitializeMachine's own table says to
/// skip initialization (NotFound, Unimplemented).
async fn creation_survives_every_code_of(method: DriverMethod, prefix: &str) {
    let cluster = Cluster::start(fast_settings()).await;
    let history = History::start(cluster.machines()).await;
    cluster.create_class().await;
    let mut faults = Vec::new();
    for code in codes() {
        let name = name_for(prefix, code);
        faults.push((
            code,
            cluster.faults.inject(
                Fault::new(method, code)
                    .target(Target::machines([name.as_str()]))
                    .times(FIRES),
            ),
        ));
        cluster.create_machine(&name).await;
    }
    for (code, fault) in &faults {
        let name = name_for(prefix, *code);
        let machine = cluster.wait_phase(&name, MachinePhase::Running).await;
        assert_eq!(
            machine.spec.provider_id,
            format!("sim:///{NAMESPACE}/{name}"),
            "{method:?} {code:?}"
        );
        assert!(
            cluster.faults.fired(*fault) >= 1,
            "{method:?} {code:?}: the fault fired"
        );
    }
    assert_goal_figures(&cluster, &history, &format!("{method:?}"));
    assert_eq!(cluster.driver.vms().len(), faults.len(), "one VM per machine");
    // The retry policy holds under every code: after each failed call the next call of the same method for the
    // machine comes no sooner than the back-off's floor (transient codes) or the resync (codes awaiting a change).
    let settings = fast_settings();
    for (code, _) in &faults {
        // Answers that are not failures of the call: GetMachineStatus NotFound/Unimplemented/Uninitialized lead to
        // CreateMachine or InitializeMachine, InitializeMachine NotFound/Unimplemented skip initialization.
        let not_a_failure = match method {
            GetMachineStatus => matches!(
                code,
                MachineCode::NotFound | MachineCode::Unimplemented | MachineCode::Uninitialized
            ),
            InitializeMachine => matches!(code, MachineCode::NotFound | MachineCode::Unimplemented),
            _ => false,
        };
        if not_a_failure {
            continue;
        }
        let name = name_for(prefix, *code);
        let floor = match mcm_core::retry_policy::retry_class(method, *code) {
            mcm_core::retry_policy::RetryClass::Auto => {
                settings.retry.backoff_base.mul_f64(1.0 - settings.retry.jitter)
            }
            mcm_core::retry_policy::RetryClass::AwaitChange => settings.retry.await_change_resync,
        };
        let times = cluster.faults.call_times(method, &name);
        let failed_calls = usize::try_from(FIRES).unwrap().min(times.len().saturating_sub(1));
        for pair in times.windows(2).take(failed_calls) {
            let gap = pair[1].duration_since(pair[0]);
            assert!(
                gap >= floor,
                "{method:?} {code:?}: called again after {gap:?}, before the retry policy's {floor:?}"
            );
        }
    }
    let skipped: Vec<String> = [MachineCode::NotFound, MachineCode::Unimplemented]
        .into_iter()
        .filter(|_| method == InitializeMachine)
        .map(|code| name_for(prefix, code))
        .collect();
    let uninitialized: Vec<String> = cluster
        .driver
        .uninitialized_machines()
        .into_iter()
        .filter(|name| !skipped.contains(name))
        .collect();
    assert!(
        uninitialized.is_empty(),
        "{method:?}: VMs left uninitialized: {uninitialized:?}"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creation_survives_get_machine_status_answering_every_code() {
    creation_survives_every_code_of(GetMachineStatus, "status").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creation_survives_create_machine_answering_every_code() {
    creation_survives_every_code_of(CreateMachine, "create").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creation_survives_initialize_machine_answering_every_code() {
    creation_survives_every_code_of(InitializeMachine, "init").await;
}

/// Each code, answered `FIRES` times by DeleteMachine to one machine each: every deleted machine goes with its VM,
/// by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_survives_delete_machine_answering_every_code() {
    let cluster = Cluster::start(fast_settings()).await;
    let history = History::start(cluster.machines()).await;
    cluster.create_class().await;
    let names: Vec<(MachineCode, String)> = codes().into_iter().map(|c| (c, name_for("delete", c))).collect();
    for (_, name) in &names {
        cluster.create_machine(name).await;
    }
    for (_, name) in &names {
        cluster.wait_phase(name, MachinePhase::Running).await;
    }
    for (code, name) in &names {
        cluster.faults.inject(
            Fault::new(DeleteMachine, *code)
                .target(Target::machines([name.as_str()]))
                .times(FIRES),
        );
        cluster
            .machines()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for (_, name) in &names {
        cluster.wait_gone(name).await;
    }
    // DeleteMachine NotFound counts as done (spec 000 makes the provider answer OK for a missing VM; the reference
    // takes NotFound as gone too), so a provider answering NotFound for a VM it still has leaves that VM to the
    // orphan collection (orphan_collection.rs). Every other code's VM is gone.
    let left: Vec<String> = cluster
        .driver
        .vms()
        .into_iter()
        .map(|vm| vm.machine_name)
        .collect();
    assert_eq!(left, vec![name_for("delete", MachineCode::NotFound)], "VMs left");
    assert_goal_figures(&cluster, &history, "DeleteMachine");
    for (code, name) in names.iter().filter(|(code, _)| *code != MachineCode::NotFound) {
        assert!(
            cluster.faults.calls_for(DeleteMachine, name) > FIRES,
            "{code:?}: DeleteMachine was called again after the faults"
        );
    }
    cluster.stop().await;
}

/// The sim served over gRPC on a unix socket; stopped and started again on the same socket to make the provider
/// unreachable.
struct Served {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Served {
    fn start(driver: &mcm_provider_sim::SimDriver, endpoint: &Endpoint) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let driver: Arc<dyn Driver> = Arc::new(driver.clone());
        let endpoint = endpoint.clone();
        let info = ProviderInfo {
            name: "sim".into(),
            version: "test".into(),
            optional_methods: vec![InitializeMachine, GetMachineStatus, DriverMethod::ListMachines],
        };
        let task = tokio::spawn(async move {
            mcm_grpc::serve(driver, info, &endpoint, None, async move {
                let _ = stopped.await;
            })
            .await
            .expect("the provider serves");
        });
        Self {
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // In-flight calls may hold the server open; the task is aborted if it does not end soon.
        if tokio::time::timeout(Duration::from_secs(2), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

/// A client with a 1 s call timeout, as `--provider-call-timeout=1s` would make.
fn client(endpoint: &Endpoint) -> Arc<dyn Driver> {
    Arc::new(
        GrpcDriver::new(
            endpoint.clone(),
            ClientOptions {
                call_timeout: Duration::from_secs(1),
                connect_timeout: Duration::from_millis(500),
                backoff_base: Duration::from_millis(100),
                backoff_cap: Duration::from_millis(400),
                tls: None,
            },
        )
        .expect("a client"),
    )
}

/// The provider is unreachable (its server stopped) for longer than the call timeout while machines are created
/// and again while they are deleted. Our client answers `Unavailable`; the machines show it, are never Failed, get
/// one VM each, and finish creation and deletion by themselves once the provider is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_unreachable_longer_than_the_call_timeout_delays_creation_and_deletion_only() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::Unix(dir.path().join("provider.sock"));
    let mut cluster = Cluster::start_without_controller(fast_settings()).await;
    let history = History::start(cluster.machines()).await;
    cluster.create_class().await;
    cluster.start_controller_with_driver(client(&endpoint));
    let names: Vec<String> = (1..=4).map(|i| format!("away-{i}")).collect();
    // No provider yet: the first calls find nothing listening.
    for name in &names {
        cluster.create_machine(name).await;
    }
    for name in &names {
        cluster
            .wait_machine(name, "the provider's absence shown", |m| {
                error_code(m) == "Unavailable"
            })
            .await;
    }
    let served = Served::start(&cluster.driver, &endpoint);
    for name in &names {
        cluster.wait_phase(name, MachinePhase::Running).await;
    }
    assert_eq!(cluster.driver.vms().len(), names.len());
    assert!(cluster.driver.uninitialized_machines().is_empty());

    // Away again, during deletion.
    served.stop().await;
    for name in &names {
        cluster
            .machines()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for name in &names {
        cluster
            .wait_machine(name, "the deletion waiting for the provider", |m| {
                m.status
                    .as_ref()
                    .is_some_and(|s| s.last_operation.description.contains("Unavailable"))
            })
            .await;
    }
    assert_eq!(
        cluster.driver.vms().len(),
        names.len(),
        "nothing deleted while away"
    );
    let served = Served::start(&cluster.driver, &endpoint);
    for name in &names {
        cluster.wait_gone(name).await;
    }
    assert!(cluster.driver.vms().is_empty());
    assert_goal_figures(&cluster, &history, "unreachable");
    served.stop().await;
    cluster.stop().await;
}

/// The provider answers InitializeMachine and CreateMachine slower than the call timeout: our client gives up
/// (`DeadlineExceeded`), the sim never acts on the abandoned calls, the machines wait in CrashLoopBackOff and run
/// once the provider is fast again. No second VM, no Failed machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_slower_than_the_call_timeout_delays_creation_only() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::Unix(dir.path().join("provider.sock"));
    let mut cluster = Cluster::start_without_controller(fast_settings()).await;
    let history = History::start(cluster.machines()).await;
    cluster.create_class().await;
    let served = Served::start(&cluster.driver, &endpoint);
    cluster.start_controller_with_driver(client(&endpoint));
    for method in [CreateMachine, InitializeMachine] {
        cluster
            .faults
            .set_latency(method, Latency::Fixed(Duration::from_secs(3)));
        let name = format!("slow-{}", method.name().to_lowercase());
        cluster.create_machine(&name).await;
        cluster
            .wait_machine(&name, "the call timeout shown", |m| {
                error_code(m) == "DeadlineExceeded"
            })
            .await;
        cluster.faults.set_latency(method, Latency::None);
        cluster.wait_phase(&name, MachinePhase::Running).await;
    }
    assert_eq!(cluster.driver.vms().len(), 2);
    assert!(cluster.driver.uninitialized_machines().is_empty());
    assert_goal_figures(&cluster, &history, "slow");
    served.stop().await;
    cluster.stop().await;
}

/// Starts the set controllers and creates the MachineSet `name` (label `pool: <name>`) of `replicas` machines of the
/// test class; returns the sets' API.
async fn start_set(cluster: &mut Cluster, name: &str, replicas: i32) -> kube::Api<MachineSet> {
    cluster.start_set_controllers(machinedeployment::Config {
        concurrency: 4,
        ..machinedeployment::Config::new(NAMESPACE)
    });
    let sets: kube::Api<MachineSet> = kube::Api::namespaced(cluster.client.clone(), NAMESPACE);
    let set = MachineSetBuilder::new(name)
        .replicas(replicas)
        .matching([("pool", name)])
        .class(support::CLASS)
        .build();
    sets.create(&PostParams::default(), &set).await.unwrap();
    sets
}

/// A set of 5 with watch events held back for 3 s (a stalled watch) during scale-up and scale-down: the set
/// controller's stale view never makes it create or delete more than asked. Exactly 5, then 2, machines and VMs,
/// one CreateMachine each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watch_during_scaling_creates_and_deletes_exactly_what_is_asked() {
    let mut cluster = Cluster::start(fast_settings()).await;
    let history = History::start(cluster.machines()).await;
    cluster.create_class().await;
    let sets = start_set(&mut cluster, "stall", 0).await;
    let stall = Duration::from_secs(3);
    let scale = async |replicas: i32| {
        cluster.server().hooks().set_watch_delay(stall);
        sets.patch(
            "stall",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "replicas": replicas } })),
        )
        .await
        .unwrap();
        // Bounded observation window (something must NOT happen): the stalled view never leads to more machines
        // than asked.
        let overshoot = watch_window(stall, async || {
            let live = cluster
                .machines()
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .len();
            (live > 5).then_some(live)
        })
        .await;
        assert_eq!(
            overshoot, None,
            "more machines than replicas while the watch stalled"
        );
        cluster.server().hooks().set_watch_delay(Duration::ZERO);
    };
    scale(5).await;
    wait_for("5 Running machines", async || {
        let machines = cluster.machines().list(&ListParams::default()).await.ok()?.items;
        (machines.len() == 5 && machines.iter().all(|m| m.phase() == Some(MachinePhase::Running)))
            .then_some(())
    })
    .await;
    assert_eq!(cluster.driver.vms().len(), 5);
    scale(2).await;
    wait_for("2 machines and 2 VMs", async || {
        let machines = cluster.machines().list(&ListParams::default()).await.ok()?.items;
        (machines.len() == 2 && cluster.driver.vms().len() == 2).then_some(())
    })
    .await;
    for seen in history.versions() {
        let name = seen.object.name_any();
        assert!(
            cluster.faults.calls_for(CreateMachine, &name) <= 1,
            "{name}: one CreateMachine"
        );
    }
    assert_goal_figures(&cluster, &history, "stalled watch");
    cluster.stop().await;
}

/// Node heartbeats stop for all nodes of a set (a partition, or the control plane's view of the zone lost): the
/// machines turn Unknown, but with more than half of the set unhealthy none is replaced; the heartbeats come back
/// and so do the machines, by themselves. Then one node of four stops: that machine alone is replaced (it is not
/// healthy), the three healthy ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_stopping_for_all_nodes_replace_nothing_and_for_one_node_replace_only_it() {
    let mut settings = fast_settings();
    settings.machine_health_timeout = Duration::from_secs(2);
    let mut cluster = Cluster::start(settings).await;
    let history = History::start(cluster.machines()).await;
    cluster.create_class().await;
    start_set(&mut cluster, "beats", 4).await;
    let running = wait_for("4 Running machines", async || {
        let machines = cluster.machines().list(&ListParams::default()).await.ok()?.items;
        (machines.len() == 4 && machines.iter().all(|m| m.phase() == Some(MachinePhase::Running)))
            .then_some(machines)
    })
    .await;
    let names: Vec<String> = running.iter().map(ResourceExt::name_any).collect();
    for name in &names {
        cluster.faults.stop_heartbeats(name);
    }
    wait_for("every machine Unknown", async || {
        let machines = cluster.machines().list(&ListParams::default()).await.ok()?.items;
        machines
            .iter()
            .all(|m| m.phase() == Some(MachinePhase::Unknown))
            .then_some(())
    })
    .await;
    // Bounded observation window (something must NOT happen): well past the 2 s health timeout, nothing is Failed.
    let failed = watch_window(Duration::from_secs(4), async || {
        let machines = cluster.machines().list(&ListParams::default()).await.ok()?.items;
        machines
            .iter()
            .find(|m| m.phase() == Some(MachinePhase::Failed))
            .map(ResourceExt::name_any)
    })
    .await;
    assert_eq!(failed, None, "a machine was Failed while every node was silent");
    for name in &names {
        cluster.faults.resume_heartbeats(name);
    }
    for name in &names {
        cluster.wait_phase(name, MachinePhase::Running).await;
    }
    assert_goal_figures(&cluster, &history, "all heartbeats stopped");

    // One node of four stops: only its machine goes.
    let silent = names[0].clone();
    cluster.faults.stop_heartbeats(&silent);
    wait_for("the silent machine replaced", async || {
        let machines = cluster.machines().list(&ListParams::default()).await.ok()?.items;
        let gone = machines.iter().all(|m| m.name_any() != silent);
        let running = machines
            .iter()
            .filter(|m| m.phase() == Some(MachinePhase::Running))
            .count();
        (gone && running == 4).then_some(())
    })
    .await;
    for name in &names[1..] {
        let machine = cluster.machine(name).await;
        assert_eq!(machine.phase(), Some(MachinePhase::Running), "{name} stays");
    }
    let failed = history.ever_failed();
    assert_eq!(failed, vec![silent], "only the silent machine was Failed");
    cluster.stop().await;
}
