//! A lagging cache never yields extra machines: a simulated controller with a cache that lags behind its writes.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use mcm_api::{Machine, MachinePhase, MachineSet, MachineStatus};
use proptest::prelude::*;

use super::*;
use crate::machineset::common::name_of;

/// One machine of the simulated API server: when it was created, failed, deleted and removed (logical times).
#[derive(Clone)]
struct SimMachine {
    machine: Machine,
    created: u64,
    failed: Option<u64>,
    deleted: Option<u64>,
}

/// How long a deleted machine stays (finalizer) before it is gone.
const LINGER: u64 = 2;

struct World {
    clock: u64,
    machines: Vec<SimMachine>,
    next_name: usize,
}

impl World {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The API server's state as of logical time `seen` (what a cache that lags behind holds).
    fn view(&self, seen: u64) -> Vec<Machine> {
        self.machines
            .iter()
            .filter(|s| s.created <= seen && s.deleted.is_none_or(|d| d + LINGER > seen))
            .map(|s| {
                let mut m = s.machine.clone();
                if s.failed.is_some_and(|f| f <= seen) {
                    m.status.as_mut().unwrap().current_status.phase = Some(MachinePhase::Failed);
                }
                if s.deleted.is_some_and(|d| d <= seen) {
                    m.metadata.deletion_timestamp = Some(Time(at(1)));
                }
                m
            })
            .collect()
    }

    /// Machines that exist now, are not being deleted and are not Failed.
    fn active_now(&self) -> usize {
        self.active_known(u64::MAX)
    }

    /// The same, except that failures after `seen` are not counted: those are someone else's changes the cache
    /// has not shown yet, which no controller can act on; the set's own creations and deletions are all counted.
    fn active_known(&self, seen: u64) -> usize {
        self.machines
            .iter()
            .filter(|s| s.deleted.is_none() && s.failed.is_none_or(|f| f > seen))
            .count()
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Reconcile with a cache lagging this many logical steps behind (never going back).
    Reconcile(u64),
    /// The machine controller marks the machine at this index Failed.
    Fail(usize),
    /// Someone scales the set.
    Scale(i32),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u64..6).prop_map(Op::Reconcile),
        1 => (0usize..20).prop_map(Op::Fail),
        1 => (0i32..7).prop_map(Op::Scale),
    ]
}

/// One reconcile against the cache as of `seen`; returns the plan it acted on. Checks that it never creates
/// beyond `replicas`, and never scales down below it, in the API server's real state.
fn reconcile(
    world: &mut World,
    set: &MachineSet,
    exp: &mut Expectations,
    seen: u64,
    now: Timestamp,
) -> MachineSetPlan {
    let cache = world.view(seen);
    exp.observe(&cache);
    let owned = claim_machines(set, &cache).owned;
    let plan = decide(&MachineSetInput {
        set,
        machines: &owned,
        expectations: exp,
        deployment_delete_policy: None,
        now,
        random: 3,
    });
    let replicas = usize::try_from(set.spec.replicas).unwrap();
    let before = world.active_known(seen);
    if plan.create > 0 {
        assert!(
            before + plan.create <= replicas,
            "extra machines: {before} active + {} created > {replicas} replicas",
            plan.create
        );
    }
    for deletion in &plan.delete {
        exp.expect_deletion(&deletion.name, now);
        let clock = world.tick();
        let target = world
            .machines
            .iter_mut()
            .find(|s| name_of(&s.machine) == deletion.name)
            .unwrap();
        if target.deleted.is_none() {
            target.deleted = Some(clock);
        }
    }
    let scaled_down = plan.delete.iter().any(|d| d.reason == DeletionReason::ScaleDown);
    if scaled_down {
        assert!(world.active_known(seen) >= replicas, "scaled down below replicas");
    }
    for _ in 0..plan.create {
        let mut m = machine_to_create(set);
        m.metadata.name = Some(format!("ms-{}", world.next_name));
        m.metadata.uid = Some(format!("uid-ms-{}", world.next_name));
        world.next_name += 1;
        m.status = Some(MachineStatus::default());
        exp.expect_creation(name_of(&m).to_owned(), now);
        let created = world.tick();
        world.machines.push(SimMachine {
            machine: m,
            created,
            failed: None,
            deleted: None,
        });
    }
    plan
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn a_lagging_cache_never_yields_extra_machines(
        initial in 0i32..6,
        ops in proptest::collection::vec(op_strategy(), 1..60),
    ) {
        // Issue: "expectations enforced, so a lagging cache never yields extra machines". The cache is the API
        // server's state some steps ago (never going back); the set must not create beyond replicas nor delete
        // below them in the real state, whatever the lag; once the cache catches up, the set converges.
        let mut set = set(initial);
        let mut world = World { clock: 0, machines: Vec::new(), next_name: 0 };
        let mut exp = Expectations::new();
        let mut seen = 0;
        for (step, op) in ops.iter().enumerate() {
            let now = at(1000 + i64::try_from(step).unwrap());
            match op {
                Op::Reconcile(lag) => {
                    seen = seen.max(world.clock.saturating_sub(*lag));
                    let _ = reconcile(&mut world, &set, &mut exp, seen, now);
                }
                Op::Fail(index) => {
                    let clock = world.tick();
                    if let Some(target) = world.machines.get_mut(*index)
                        && target.deleted.is_none()
                        && target.failed.is_none()
                    {
                        target.failed = Some(clock);
                    }
                }
                Op::Scale(replicas) => set.spec.replicas = *replicas,
            }
        }
        // The cache catches up: the set converges to replicas, with every Failed machine deleted.
        let mut settled = false;
        for round in 0..20 {
            let now = at(2000 + round);
            let clock = world.clock;
            let plan = reconcile(&mut world, &set, &mut exp, clock, now);
            if plan.create == 0 && plan.delete.is_empty() && plan.holds.is_empty() {
                settled = true;
                break;
            }
        }
        prop_assert!(settled);
        prop_assert_eq!(world.active_now(), usize::try_from(set.spec.replicas).unwrap());
        prop_assert!(world.machines.iter().all(|s| s.failed.is_none() || s.deleted.is_some()));
    }
}
