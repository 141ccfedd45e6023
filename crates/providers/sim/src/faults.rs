//! Fault and latency injection: the [`Faults`] handle, shared by the driver, its kubelet and the tests.
//!
//! - **Call faults**: [`Faults::fail`] makes a method answer a code for all calls, a deterministic share of them,
//!   a random share (from the seeded RNG of [`crate::SimConfig::seed`]) or the calls for named machines;
//!   [`Fault`] adds a limit on the number of failures, a custom message, and "after effect" (the call acts, then
//!   answers the code, like a response lost on the way back). The first fault of the method that fires, in the
//!   order they were added, answers the call.
//! - **VM faults**: [`Faults::vanish`] makes a machine's VM disappear from the provider; [`Faults::duplicate`]
//!   adds a second VM for a machine.
//! - **Kubelet faults**: [`Faults::set_node_not_ready`], [`Faults::set_condition`], [`Faults::stop_heartbeats`],
//!   [`Faults::fail_in_place_updates`], [`Faults::hold_in_place_updates`] and their inverses; the kubelet writes the
//!   change at once.
//! - **Latency**: [`Faults::set_latency`] changes the latency of a method at run time.
//! - **Call counts**: [`Faults::calls`] and [`Faults::calls_for`] count every call by method and by machine,
//!   failed ones included.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use mcm_api::ConditionStatus;
use mcm_driver::{DriverError, DriverMethod, MachineCode};
use rand::{Rng, rngs::StdRng};

use crate::driver::Shared;

/// Which calls of a method a fault applies to.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// Every call.
    All,
    /// `n` of every `of` calls, spread evenly and counted per fault: the `k`-th call (from 0) fails when
    /// `(k + 1) * n / of > k * n / of`, so `Share { n: 1, of: 3 }` fails the 3rd, 6th, 9th, ... call. Deterministic.
    Share {
        /// Failing calls per `of` calls.
        n: u32,
        /// The period.
        of: u32,
    },
    /// Each call fails with this probability (0 to 1), drawn from the driver's RNG seeded by
    /// [`crate::SimConfig::seed`]: the same calls in the same order fail the same way.
    Random(f64),
    /// The calls for these machine names (calls without a machine, such as ListMachines, never match).
    Machines(BTreeSet<String>),
}

impl Target {
    /// The calls for these machines.
    pub fn machines<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::Machines(names.into_iter().map(Into::into).collect())
    }

    /// `n` of every `of` calls (see [`Target::Share`]).
    pub fn share(n: u32, of: u32) -> Self {
        Self::Share { n, of }
    }
}

/// A call fault: a method answers a code for the calls of a target.
#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    /// The method that fails.
    pub method: DriverMethod,
    /// The code it answers.
    pub code: MachineCode,
    /// Which calls fail.
    pub target: Target,
    /// How many times the fault fires before it goes inert; `None` is without limit.
    pub times: Option<u64>,
    /// When true the call takes effect first (a VM is created, deleted, ...) and then answers the code; when false
    /// (the default) the call fails without acting.
    pub after_effect: bool,
    /// The error message; by default `injected fault: <method> answers <code>`.
    pub message: Option<String>,
}

impl Fault {
    /// A fault of `method` answering `code` for every call, without limit, before acting.
    pub fn new(method: DriverMethod, code: MachineCode) -> Self {
        Self {
            method,
            code,
            target: Target::All,
            times: None,
            after_effect: false,
            message: None,
        }
    }

    /// Restricts the fault to a target.
    #[must_use]
    pub fn target(mut self, target: Target) -> Self {
        self.target = target;
        self
    }

    /// Fires at most `times` times.
    #[must_use]
    pub fn times(mut self, times: u64) -> Self {
        self.times = Some(times);
        self
    }

    /// Lets the call act before it answers the code.
    #[must_use]
    pub fn after_effect(mut self) -> Self {
        self.after_effect = true;
        self
    }

    /// Sets the error message.
    #[must_use]
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }
}

/// The identity of an injected fault, for [`Faults::remove`] and [`Faults::fired`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FaultId(u64);

impl FaultId {
    /// The number that names the fault outside the process (`mcm provider sim serve --control-address`).
    pub fn number(self) -> u64 {
        self.0
    }

    /// The fault of that number (one that was never injected, or was removed, is simply not found).
    pub fn from_number(number: u64) -> Self {
        Self(number)
    }
}

/// The latency of a method's calls, slept with `tokio::time::sleep` before the call acts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Latency {
    /// No latency.
    #[default]
    None,
    /// Always this long.
    Fixed(Duration),
    /// Uniformly between `min` and `max` (inclusive), drawn from the seeded RNG.
    Range {
        /// The shortest latency.
        min: Duration,
        /// The longest latency.
        max: Duration,
    },
}

impl Latency {
    /// A latency to sleep for this call.
    pub(crate) fn sample(self, rng: &mut StdRng) -> Duration {
        match self {
            Self::None => Duration::ZERO,
            Self::Fixed(duration) => duration,
            Self::Range { min, max } => {
                let (low, high) = if min <= max { (min, max) } else { (max, min) };
                let spread = u64::try_from(high.saturating_sub(low).as_nanos()).unwrap_or(u64::MAX);
                low + Duration::from_nanos(rng.random_range(0..=spread))
            }
        }
    }
}

/// An injected fault and its counters.
#[derive(Debug)]
pub(crate) struct ActiveFault {
    id: FaultId,
    fault: Fault,
    /// Calls considered (for [`Target::Share`]).
    seen: u64,
    /// Times fired.
    fired: u64,
}

/// What fault injection decided for one call.
pub(crate) struct Injected {
    /// The error to answer.
    pub(crate) error: DriverError,
    /// Whether the call acts first.
    pub(crate) after_effect: bool,
}

/// The call faults and their RNG.
#[derive(Debug)]
pub(crate) struct CallFaults {
    faults: Vec<ActiveFault>,
    next_id: u64,
}

impl CallFaults {
    pub(crate) fn new() -> Self {
        Self {
            faults: Vec::new(),
            next_id: 0,
        }
    }

    /// The first fault of `method` that fires for this call, counting the call in every fault it reaches.
    pub(crate) fn decide(
        &mut self,
        method: DriverMethod,
        machine: Option<&str>,
        rng: &mut StdRng,
    ) -> Option<Injected> {
        for active in &mut self.faults {
            let fault = &active.fault;
            if fault.method != method || fault.times.is_some_and(|times| active.fired >= times) {
                continue;
            }
            let fires = match &fault.target {
                Target::All => true,
                Target::Share { n, of } => {
                    let k = active.seen;
                    active.seen += 1;
                    let (n, of) = (u128::from(*n), u128::from(*of));
                    of > 0 && (u128::from(k) + 1) * n / of > u128::from(k) * n / of
                }
                Target::Random(p) => rng.random_bool(p.clamp(0.0, 1.0)),
                Target::Machines(names) => machine.is_some_and(|m| names.contains(m)),
            };
            if fires {
                active.fired += 1;
                let message = fault.message.clone().unwrap_or_else(|| match machine {
                    Some(machine) => format!(
                        "injected fault: {} answers {} (machine {machine})",
                        method.name(),
                        fault.code.name()
                    ),
                    None => format!("injected fault: {} answers {}", method.name(), fault.code.name()),
                });
                return Some(Injected {
                    error: DriverError::new(fault.code, message),
                    after_effect: fault.after_effect,
                });
            }
        }
        None
    }
}

/// Faults of one node's simulated kubelet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeFaults {
    /// Conditions forced to a status (`Ready` False for a NotReady node).
    pub(crate) conditions: BTreeMap<String, ConditionStatus>,
    /// The kubelet neither renews the Lease nor writes the node.
    pub(crate) heartbeats_stopped: bool,
    /// An in-place update of the node fails with this reason (the kubelet sets `update-result=failed`).
    pub(crate) in_place_update_failure: Option<String>,
    /// The kubelet does not answer an in-place update of the node (a node agent that hangs).
    pub(crate) in_place_updates_held: bool,
}

/// The fault-injection handle of a [`crate::SimDriver`]: cloneable, shared with tests, every change visible to
/// the driver and its kubelet at once.
#[derive(Clone)]
pub struct Faults {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults").finish_non_exhaustive()
    }
}

impl Faults {
    /// Makes `method` answer `code` for the calls of `target`, without limit, before acting.
    pub fn fail(&self, method: DriverMethod, code: MachineCode, target: Target) -> FaultId {
        self.inject(Fault::new(method, code).target(target))
    }

    /// Injects a fault.
    pub fn inject(&self, fault: Fault) -> FaultId {
        let mut state = self.shared.lock();
        let id = FaultId(state.call_faults.next_id);
        state.call_faults.next_id += 1;
        state.call_faults.faults.push(ActiveFault {
            id,
            fault,
            seen: 0,
            fired: 0,
        });
        id
    }

    /// Removes a fault; false when it was not there.
    pub fn remove(&self, id: FaultId) -> bool {
        let mut state = self.shared.lock();
        let before = state.call_faults.faults.len();
        state.call_faults.faults.retain(|f| f.id != id);
        state.call_faults.faults.len() != before
    }

    /// Removes every call fault (kubelet faults stay; see [`Faults::clear_node_faults`]).
    pub fn clear(&self) {
        self.shared.lock().call_faults.faults.clear();
    }

    /// How many times a fault fired (0 for a removed fault).
    pub fn fired(&self, id: FaultId) -> u64 {
        self.shared
            .lock()
            .call_faults
            .faults
            .iter()
            .find(|f| f.id == id)
            .map_or(0, |f| f.fired)
    }

    /// How many calls of `method` the driver received, failed ones included.
    pub fn calls(&self, method: DriverMethod) -> u64 {
        self.shared.lock().calls.get(&method).copied().unwrap_or(0)
    }

    /// How many calls of `method` for this machine name the driver received, failed ones included.
    pub fn calls_for(&self, method: DriverMethod, machine: &str) -> u64 {
        self.shared
            .lock()
            .calls_by_machine
            .get(&(method, machine.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// When the calls of `method` for this machine name arrived, oldest first (the most recent
    /// [`crate::CALL_LOG_LENGTH`]; failed ones included): for tests of back-off.
    pub fn call_times(&self, method: DriverMethod, machine: &str) -> Vec<tokio::time::Instant> {
        self.shared
            .lock()
            .call_log
            .get(&(method, machine.to_owned()))
            .map(|log| log.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Sets every call count back to zero (and forgets the call instants).
    pub fn reset_calls(&self) {
        let mut state = self.shared.lock();
        state.calls.clear();
        state.calls_by_machine.clear();
        state.call_log.clear();
    }

    /// Sets the latency of one method (overriding the default latency).
    pub fn set_latency(&self, method: DriverMethod, latency: Latency) {
        self.shared.lock().method_latency.insert(method, latency);
    }

    /// Sets the latency of every method that has no latency of its own.
    pub fn set_default_latency(&self, latency: Latency) {
        self.shared.lock().default_latency = latency;
    }

    /// With `true`, GetMachineStatus answers OK for a VM whose initialization has not succeeded, as a provider that
    /// breaks spec 002 section 11 would (the sim still knows: [`crate::SimDriver::uninitialized_machines`]). For
    /// tests that the controller does not rely on providers alone to finish an initialization.
    pub fn hide_uninitialized(&self, hide: bool) {
        self.shared.lock().hide_uninitialized = hide;
    }

    /// Makes every VM of this machine name disappear from the provider, as if deleted behind its back; returns
    /// how many went. The kubelet stops heartbeating the node (it does not delete it).
    pub fn vanish(&self, machine: &str) -> usize {
        let gone = {
            let mut state = self.shared.lock();
            let before = state.vms.len();
            state.vms.retain(|_, vm| vm.machine_name != machine);
            before - state.vms.len()
        };
        if gone > 0 {
            self.shared.changed();
        }
        gone
    }

    /// Adds a second VM for a machine that has one (a copy with the provider ID `sim:///<namespace>/<name>/<n>`,
    /// `n` from 2), so that GetMachineStatus answers `OutOfRange`; returns the copy's provider ID, or None when
    /// the machine has no VM.
    pub fn duplicate(&self, machine: &str) -> Option<String> {
        let provider_id = self.shared.lock().duplicate(machine);
        if provider_id.is_some() {
            self.shared.changed();
        }
        provider_id
    }

    fn node_fault(&self, node: &str, change: impl FnOnce(&mut NodeFaults)) {
        {
            let mut state = self.shared.lock();
            let faults = state.node_faults.entry(node.to_owned()).or_default();
            change(faults);
            if *faults == NodeFaults::default() {
                state.node_faults.remove(node);
            }
        }
        self.shared.changed();
    }

    /// Makes the node report `Ready` False (reason `KubeletNotReady`).
    pub fn set_node_not_ready(&self, node: &str) {
        self.set_condition(node, "Ready", ConditionStatus::False);
    }

    /// Makes the node report `Ready` True again (undoes [`Faults::set_node_not_ready`]).
    pub fn set_node_ready(&self, node: &str) {
        self.clear_condition(node, "Ready");
    }

    /// Makes the node report a condition with a status (for example `DiskPressure` True, or a condition of a
    /// node problem detector such as `KernelDeadlock` True).
    pub fn set_condition(&self, node: &str, condition: &str, status: ConditionStatus) {
        self.node_fault(node, |faults| {
            faults.conditions.insert(condition.to_owned(), status);
        });
    }

    /// Undoes [`Faults::set_condition`] for one condition: a kubelet condition goes back to its healthy status,
    /// another condition goes away.
    pub fn clear_condition(&self, node: &str, condition: &str) {
        self.node_fault(node, |faults| {
            faults.conditions.remove(condition);
        });
    }

    /// Stops the node's heartbeats: the kubelet neither renews its Lease nor writes its status, so the server's
    /// node lifecycle turns it Unknown after the node monitor grace period.
    pub fn stop_heartbeats(&self, node: &str) {
        self.node_fault(node, |faults| faults.heartbeats_stopped = true);
    }

    /// Resumes the node's heartbeats: the Lease is renewed and the status rewritten at once.
    pub fn resume_heartbeats(&self, node: &str) {
        self.node_fault(node, |faults| faults.heartbeats_stopped = false);
    }

    /// Whether the node's heartbeats are stopped.
    pub fn heartbeats_stopped(&self, node: &str) -> bool {
        self.shared
            .lock()
            .node_faults
            .get(node)
            .is_some_and(|f| f.heartbeats_stopped)
    }

    /// Makes the next in-place updates of the node fail: the kubelet, told `ReadyForUpdate`, changes nothing and sets
    /// the node label `update-result=failed` with the annotation `update-failed-reason` = `reason`.
    pub fn fail_in_place_updates(&self, node: &str, reason: &str) {
        let reason = reason.to_owned();
        self.node_fault(node, |faults| faults.in_place_update_failure = Some(reason));
    }

    /// Makes the kubelet leave the node's in-place updates unanswered (no `update-result`), as a hung node agent
    /// would: the machine stays InPlaceUpdating until the in-place update timeout.
    pub fn hold_in_place_updates(&self, node: &str) {
        self.node_fault(node, |faults| faults.in_place_updates_held = true);
    }

    /// Lets the node's in-place updates go through and succeed again (undoes [`Faults::fail_in_place_updates`] and
    /// [`Faults::hold_in_place_updates`]).
    pub fn allow_in_place_updates(&self, node: &str) {
        self.node_fault(node, |faults| {
            faults.in_place_update_failure = None;
            faults.in_place_updates_held = false;
        });
    }

    /// Removes every kubelet fault of the node (conditions, stopped heartbeats, failing in-place updates).
    pub fn clear_node_faults(&self, node: &str) {
        self.node_fault(node, |faults| *faults = NodeFaults::default());
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn pattern(target: Target, calls: usize) -> String {
        let mut faults = CallFaults::new();
        faults.faults.push(ActiveFault {
            id: FaultId(0),
            fault: Fault::new(DriverMethod::CreateMachine, MachineCode::Unavailable).target(target),
            seen: 0,
            fired: 0,
        });
        let mut rng = StdRng::seed_from_u64(7);
        (0..calls)
            .map(|_| {
                if faults
                    .decide(DriverMethod::CreateMachine, Some("m"), &mut rng)
                    .is_some()
                {
                    'x'
                } else {
                    '.'
                }
            })
            .collect()
    }

    #[test]
    fn a_share_fails_n_of_every_of_calls_evenly_and_deterministically() {
        assert_eq!(pattern(Target::share(1, 3), 9), "..x..x..x");
        assert_eq!(pattern(Target::share(2, 4), 8), ".x.x.x.x");
        assert_eq!(pattern(Target::share(0, 4), 4), "....");
        assert_eq!(pattern(Target::share(5, 5), 3), "xxx");
        assert_eq!(pattern(Target::share(1, 0), 3), "...");
    }

    #[test]
    fn a_random_share_is_reproducible_from_the_seed() {
        let first = pattern(Target::Random(0.5), 64);
        assert_eq!(first, pattern(Target::Random(0.5), 64));
        assert!(first.contains('x') && first.contains('.'), "{first}");
        assert_eq!(pattern(Target::Random(0.0), 8), "........");
        assert_eq!(pattern(Target::Random(1.0), 8), "xxxxxxxx");
    }

    #[test]
    fn a_range_latency_stays_within_its_bounds() {
        let mut rng = StdRng::seed_from_u64(1);
        let latency = Latency::Range {
            min: Duration::from_millis(5),
            max: Duration::from_millis(10),
        };
        for _ in 0..100 {
            let d = latency.sample(&mut rng);
            assert!(
                d >= Duration::from_millis(5) && d <= Duration::from_millis(10),
                "{d:?}"
            );
        }
        assert_eq!(Latency::None.sample(&mut rng), Duration::ZERO);
    }
}
