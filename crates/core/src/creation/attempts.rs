//! [`Attempts`]: what the machine controller remembers of a machine's failed provider calls between passes, and
//! every decision about it: how many failures a decision counts, when the provider may be called again, what a
//! failure, a success or a migration changes.
//!
//! Separate from the flow because it outlives a pass; the controller only stores it (in memory: the gates damp
//! repeated calls, so losing them on a restart costs one early call at most).

use std::time::Duration;

use jiff::Timestamp;
use mcm_api::Machine;

use crate::{
    retry_policy::{RetryDecision, RetryGate},
    timeouts::{self, ControllerSettings},
};

/// One machine's failed attempts: failed provider calls (or class migrations) in a row, the gate before the
/// provider may be called again, and the gate before a failed class migration may be tried again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct Attempts {
    failures: u32,
    /// After a failed provider call: when the provider may be called again (the back-off of a code marked Y is
    /// over, or the machine, its class or its secret changed after a code marked N). Reconciles come for many
    /// reasons, the controller's own status write among them: without the gate each one called again.
    retry_gate: Option<RetryGate>,
    /// After a failed class migration: when it may be tried again.
    migration_gate: Option<RetryGate>,
}

impl Attempts {
    /// Whether nothing is remembered (the controller then forgets the machine).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Failed calls in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The failures a decision counts ([`super::CreationInput::failures`], the migration's back-off): those
    /// remembered, and the one being decided on when `failing` (its outcome is a failure).
    pub fn counting(&self, failing: bool) -> u32 {
        self.failures.saturating_add(u32::from(failing))
    }

    /// How long a creation pass waits before its first provider call at `now`, with the inputs' `fingerprint`:
    /// `None` when the gate is open; else until the gate opens, or until the creation timeout fails the machine
    /// ([`super::failure_deadline`]) if that comes first (a CrashLoopBackOff deadline still fires while the gate is
    /// closed).
    pub fn provider_wait(
        &self,
        machine: &Machine,
        settings: &ControllerSettings,
        node_ready: bool,
        now: Timestamp,
        fingerprint: &str,
    ) -> Option<Duration> {
        let gate = self
            .retry_gate
            .as_ref()
            .filter(|gate| !gate.is_open(now, fingerprint))?;
        let deadline = super::failure_deadline(machine, settings, node_ready);
        Some(timeouts::elapsed(now, gate.not_before).min(timeouts::elapsed(now, deadline)))
    }

    /// A provider call failed at `failed_at` with the inputs' `fingerprint`: one more failure, and no call before
    /// `retry` allows (the back-off runs from the failure, not from the start of the pass).
    pub fn call_failed(&mut self, retry: RetryDecision, failed_at: Timestamp, fingerprint: String) {
        self.failures = self.counting(true);
        self.retry_gate = Some(RetryGate::new(retry, failed_at, fingerprint));
    }

    /// The creation flow is over (or the machine is gone from it): its failures and provider gate go.
    pub fn creation_done(&mut self) {
        self.failures = 0;
        self.retry_gate = None;
    }

    /// The class migration gate, if a migration failed.
    pub fn migration_gate(&self) -> Option<&RetryGate> {
        self.migration_gate.as_ref()
    }

    /// How long a migration waits at `now` for its closed gate (zero without a gate).
    pub fn migration_wait(&self, now: Timestamp) -> Duration {
        self.migration_gate
            .as_ref()
            .map_or(Duration::ZERO, |gate| timeouts::elapsed(now, gate.not_before))
    }

    /// A class migration failed: one more failure, and no new attempt before `gate` opens
    /// ([`crate::migration::MigrationFailure::gate`]).
    pub fn migration_failed(&mut self, gate: RetryGate) {
        self.failures = self.counting(true);
        self.migration_gate = Some(gate);
    }

    /// The class migrated: nothing failed is left to remember of it.
    pub fn migrated(&mut self) {
        self.creation_done();
        self.migration_gate = None;
    }
}

#[cfg(test)]
mod tests {
    use mcm_api::builders::MachineBuilder;

    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    const CREATED: i64 = 1_000_000;

    fn machine() -> Machine {
        MachineBuilder::new("m-1").created_at(at(CREATED)).build()
    }

    fn back_off(seconds: u64) -> RetryDecision {
        RetryDecision::Retry {
            after: Duration::from_secs(seconds),
        }
    }

    #[test]
    fn failures_count_in_a_row_and_a_success_forgets_them() {
        let mut attempts = Attempts::default();
        assert!(attempts.is_empty());
        assert_eq!(attempts.counting(false), 0);
        assert_eq!(attempts.counting(true), 1, "the failure being decided on counts");
        attempts.call_failed(back_off(5), at(CREATED), "f".into());
        attempts.call_failed(back_off(5), at(CREATED + 5), "f".into());
        assert_eq!(attempts.failures(), 2);
        assert_eq!(attempts.counting(true), 3);
        attempts.creation_done();
        assert!(attempts.is_empty());
    }

    #[test]
    fn the_gate_holds_until_the_back_off_is_over_or_the_inputs_change() {
        let settings = ControllerSettings::default();
        let m = machine();
        let mut attempts = Attempts::default();
        assert_eq!(
            attempts.provider_wait(&m, &settings, false, at(CREATED), "f"),
            None
        );
        attempts.call_failed(back_off(30), at(CREATED + 10), "f".into());
        assert_eq!(
            attempts.provider_wait(&m, &settings, false, at(CREATED + 20), "f"),
            Some(Duration::from_secs(20)),
            "the back-off runs from the failure"
        );
        assert_eq!(
            attempts.provider_wait(&m, &settings, false, at(CREATED + 40), "f"),
            None
        );
        assert_eq!(
            attempts.provider_wait(&m, &settings, false, at(CREATED + 20), "changed"),
            None,
            "a changed machine, class or secret opens the gate"
        );
    }

    #[test]
    fn a_closed_gate_still_lets_the_creation_timeout_fire_unless_the_node_is_healthy() {
        let settings = ControllerSettings::default();
        let m = machine();
        let deadline = super::super::crash_loop_deadline(&m, &settings);
        let mut attempts = Attempts::default();
        let long = settings.machine_creation_timeout * 2;
        attempts.call_failed(RetryDecision::Retry { after: long }, at(CREATED), "f".into());
        let now = deadline - jiff::SignedDuration::from_secs(3);
        assert_eq!(
            attempts.provider_wait(&m, &settings, false, now, "f"),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            attempts.provider_wait(&m, &settings, true, now, "f"),
            Some(timeouts::elapsed(now, timeouts::add(at(CREATED), long))),
            "a healthy node is never failed by the creation timeout: the back-off alone"
        );
    }

    #[test]
    fn a_migration_failure_gates_migrations_and_counts_with_the_calls() {
        let mut attempts = Attempts::default();
        assert_eq!(attempts.migration_wait(at(CREATED)), Duration::ZERO);
        attempts.call_failed(back_off(5), at(CREATED), "f".into());
        attempts.migration_failed(RetryGate::new(back_off(60), at(CREATED), "g"));
        assert_eq!(attempts.failures(), 2);
        assert_eq!(attempts.migration_wait(at(CREATED + 15)), Duration::from_secs(45));
        attempts.creation_done();
        assert!(
            attempts.migration_gate().is_some(),
            "a creation's success does not open the migration gate"
        );
        attempts.migrated();
        assert!(attempts.is_empty());
    }
}
